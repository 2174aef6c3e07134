"""Hardware/model profiles: the numbers the cost model turns into step durations.

Each constant is a datasheet figure, a published measurement, or an assumption checked
against measurements; docs/SIMULATOR.md says which, cites each, and compares the model's
predictions with measurements. None was chosen to make a benchmark come out a certain way.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer with grouped-query attention."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv_value: int = 2  # bf16 KV cache

    @property
    def layer_matmul_params(self) -> int:
        """Weights one token multiplies through per layer: q, k, v, o and the gated MLP."""
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        gated_mlp = 3 * self.hidden * self.ffn
        return q_and_o + k_and_v + gated_mlp

    @property
    def weight_bytes(self) -> int:
        """All weights, read once per step: layers, input embedding and LM head."""
        params = self.layers * self.layer_matmul_params + 2 * self.vocab * self.hidden
        return params * self.bytes_per_param

    @property
    def matmul_flops_per_token(self) -> int:
        """Linear-layer FLOPs for one token through every layer (2 per multiply-add)."""
        return 2 * self.layers * self.layer_matmul_params

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs of the LM head; engines compute logits only for tokens they sample."""
        return 2 * self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv_value

    def attention_flops(self, new_tokens: int, context_before: int) -> int:
        """QK^T and AV FLOPs for `new_tokens` causal queries after `context_before` tokens.

        Query i attends to context_before + i + 1 keys; each key costs 2 multiply-adds
        (score and weighted value) per head dimension per query head.
        """
        attended_keys = new_tokens * context_before + new_tokens * (new_tokens + 1) // 2
        return 4 * self.layers * self.heads * self.head_dim * attended_keys


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one accelerator."""

    name: str
    peak_bf16_flops: float  # dense, no sparsity
    hbm_bytes_per_s: float
    memory_bytes: int


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the datasheet peaks, and fixed costs, from measurements."""

    matmul: float  # fraction of peak FLOP/s the linear layers reach on large token counts
    attention: float  # fraction of peak FLOP/s of prefill attention (FlashAttention-3)
    bandwidth: float  # fraction of peak HBM bandwidth of weight and KV streaming
    step_overhead_s: float  # per step, not hidden by the GPU: scheduling, launches, sampling
    memory_utilization: float  # share of GPU memory the engine may use (vLLM's default 0.9)
    activation_reserve_bytes: int  # kept free for activations and CUDA graphs


@dataclass(frozen=True)
class Profile:
    name: str
    model: ModelShape
    gpu: GpuSpec
    efficiency: Efficiency
    zero_service_time: bool = False  # every step takes no time (gateway overhead benchmarks)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit beside the weights and the activation reserve."""
        usable = int(self.gpu.memory_bytes * self.efficiency.memory_utilization)
        free = usable - self.model.weight_bytes - self.efficiency.activation_reserve_bytes
        return max(0, free // self.model.kv_bytes_per_token)


LLAMA3_8B = ModelShape(
    name="llama3-8b",
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    ffn=14336,
    vocab=128256,
)

H100_SXM = GpuSpec(
    name="H100 SXM", peak_bf16_flops=989e12, hbm_bytes_per_s=3.35e12, memory_bytes=80 * GIB
)
H200_SXM = GpuSpec(
    name="H200 SXM", peak_bf16_flops=989e12, hbm_bytes_per_s=4.8e12, memory_bytes=141 * 10**9
)

HOPPER_MEASURED = Efficiency(
    matmul=0.6,
    attention=0.6,
    bandwidth=0.8,
    step_overhead_s=0.001,
    memory_utilization=0.9,
    activation_reserve_bytes=4 * GIB,
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(name="h200-llama3-8b", model=LLAMA3_8B, gpu=H200_SXM, efficiency=HOPPER_MEASURED),
        Profile(name="h100-llama3-8b", model=LLAMA3_8B, gpu=H100_SXM, efficiency=HOPPER_MEASURED),
        Profile(
            name="zero",
            model=LLAMA3_8B,
            gpu=H200_SXM,
            efficiency=HOPPER_MEASURED,
            zero_service_time=True,
        ),
    )
}

DEFAULT_PROFILE = "h200-llama3-8b"
