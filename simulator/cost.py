"""The cost model: how long one engine step takes, from what the step holds.

A step runs every layer once over all its tokens. Its kernels run one after another, so
the step's time is the sum of three phases, each bounded by its own roofline:

- linear layers over every token of the step (prefill chunks and decodes together):
  max(FLOPs / (peak x matmul efficiency), weight bytes / (HBM x bandwidth efficiency)),
  since the weights are streamed once per step however many tokens share them;
- prefill attention of each chunk over its context: compute-bound (FlashAttention),
  but never faster than reading the chunk's prior KV;
- decode attention: each decode reads its whole KV cache, so it is bandwidth-bound;

plus a fixed per-step overhead for scheduling, kernel launches and sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

from laneway.simulator.profiles import Profile


@dataclass(frozen=True)
class PrefillChunk:
    tokens: int  # prompt tokens computed in this step
    context_before: int  # prompt tokens already in the KV cache, which the chunk attends to
    completes_prompt: bool  # the chunk ends the prompt, so the step samples a first token


@dataclass(frozen=True)
class StepWork:
    """What one step computes, in the terms the cost model needs."""

    prefill: tuple[PrefillChunk, ...] = ()
    decode_count: int = 0  # requests that each generate one token
    decode_context_tokens: int = 0  # sum of those requests' KV lengths

    @property
    def is_empty(self) -> bool:
        return not self.prefill and self.decode_count == 0


@dataclass(frozen=True)
class StepCost:
    """A step's duration split by phase, in seconds."""

    linear_s: float
    prefill_attention_s: float
    decode_attention_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.prefill_attention_s + self.decode_attention_s + self.overhead_s


NO_COST = StepCost(linear_s=0.0, prefill_attention_s=0.0, decode_attention_s=0.0, overhead_s=0.0)


def step_cost(profile: Profile, work: StepWork) -> StepCost:
    """The time of one step of `work` on `profile`; zero for an empty step."""
    if work.is_empty or profile.zero_service_time:
        return NO_COST
    model, gpu, eff = profile.model, profile.gpu, profile.efficiency
    flops_per_s = gpu.peak_bf16_flops
    bytes_per_s = gpu.hbm_bytes_per_s * eff.bandwidth

    tokens = work.decode_count + sum(chunk.tokens for chunk in work.prefill)
    sampled = work.decode_count + sum(1 for chunk in work.prefill if chunk.completes_prompt)
    linear_flops = tokens * model.matmul_flops_per_token + sampled * model.lm_head_flops_per_token
    linear_s = max(linear_flops / (flops_per_s * eff.matmul), model.weight_bytes / bytes_per_s)

    prefill_attention_s = 0.0
    for chunk in work.prefill:
        flops = model.attention_flops(chunk.tokens, chunk.context_before)
        kv_read = chunk.context_before * model.kv_bytes_per_token
        prefill_attention_s += max(flops / (flops_per_s * eff.attention), kv_read / bytes_per_s)

    decode_kv_bytes = work.decode_context_tokens * model.kv_bytes_per_token
    decode_attention_s = decode_kv_bytes / bytes_per_s
    return StepCost(
        linear_s=linear_s,
        prefill_attention_s=prefill_attention_s,
        decode_attention_s=decode_attention_s,
        overhead_s=eff.step_overhead_s,
    )


def step_duration(profile: Profile, work: StepWork) -> float:
    return step_cost(profile, work).total_s


def roofline_floor_s(profile: Profile, work: StepWork) -> float:
    """The time no implementation can beat: all FLOPs at peak or all bytes at peak, the larger.

    Used by tests to check the model is never faster than the hardware allows.
    """
    if work.is_empty or profile.zero_service_time:
        return 0.0
    model, gpu = profile.model, profile.gpu
    tokens = work.decode_count + sum(chunk.tokens for chunk in work.prefill)
    flops = tokens * model.matmul_flops_per_token
    flops += sum(model.attention_flops(c.tokens, c.context_before) for c in work.prefill)
    kv_tokens = work.decode_context_tokens + sum(c.context_before for c in work.prefill)
    bytes_read = model.weight_bytes + kv_tokens * model.kv_bytes_per_token
    return max(flops / gpu.peak_bf16_flops, bytes_read / gpu.hbm_bytes_per_s)
