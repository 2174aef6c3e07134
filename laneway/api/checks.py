"""Rules across fields: each error says what to change. The CRD's CEL rules say the same
where the API server can judge them (tests/test_crd_cel.py holds the two in agreement);
`check_pool_set` judges what no single resource can."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.api.engine import EngineKind
from laneway.api.errors import FieldError
from laneway.api.names import KV_EVENTS_RENDERED_FLAGS, SIMULATOR_KV_BLOCK_SIZE
from laneway.api.resource import InferencePool
from laneway.api.spec import Lane, LimitsSpec, PoolSpec, PrefillSpec, RoutingSpec
from laneway.api.tokenizer import TOKENIZER_FIELD_KINDS, TokenizerKind, TokenizerSpec


def check_spec(spec: PoolSpec) -> list[FieldError]:
    """Cross-field rules: each error says what to change. The CRD's CEL rules mirror these."""
    return [
        *_check_autoscaling(spec),
        *_check_tokenizer(spec.tokenizer),
        *_check_chunking(spec.prefill, spec.limits),
        *_check_prompt_range(spec.routing, spec.limits),
        *_check_engine_flags(spec),
        *_check_field_combinations(spec),
    ]


def _check_autoscaling(spec: PoolSpec) -> list[FieldError]:
    scaling, path = spec.scaling, "spec.autoscaling"
    if scaling is None:
        return []
    errors: list[FieldError] = []
    low, high = scaling.min_replicas, scaling.max_replicas
    if high < low:
        errors.append(
            FieldError(f"{path}.maxReplicas", f"must be >= minReplicas ({low}), got {high}")
        )
    if low == 0 and spec.lane is Lane.INTERACTIVE:
        errors.append(
            FieldError(
                f"{path}.minReplicas",
                "must be at least 1 for an interactive pool: a chat request cannot wait for a "
                "replica's cold start within its TTFT target",
            )
        )
    return errors


def _check_tokenizer(tokenizer: TokenizerSpec | None) -> list[FieldError]:
    """Each optional field belongs to one kind."""
    if tokenizer is None:
        return []
    path, kind = "spec.tokenizer", tokenizer.kind
    errors: list[FieldError] = []
    if kind is TokenizerKind.HUGGINGFACE and tokenizer.path is None:
        errors.append(
            FieldError(f"{path}.path", "is required for kind huggingface: a tokenizer.json file")
        )
    given = {TokenizerSpec.model_fields[name].alias for name in tokenizer.model_fields_set}
    for name, (owner, hint) in TOKENIZER_FIELD_KINDS.items():
        if name in given and kind is not owner:
            errors.append(
                FieldError(
                    f"{path}.{name}", f"is for kind {owner.value} ({hint}), not {kind.value}"
                )
            )
    return errors


def _check_chunking(prefill: PrefillSpec, limits: LimitsSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    if prefill.chunked_prefill and prefill.chunk_size > prefill.token_budget:
        errors.append(
            FieldError(
                "spec.prefill.chunkSize",
                f"chunkSize ({prefill.chunk_size}) must not exceed tokenBudget "
                f"({prefill.token_budget}): lower chunkSize or raise tokenBudget",
            )
        )
    if prefill.chunked_prefill and prefill.chunk_size > limits.max_context_tokens:
        errors.append(
            FieldError(
                "spec.prefill.chunkSize",
                f"chunkSize ({prefill.chunk_size}) must not exceed limits.maxContextTokens "
                f"({limits.max_context_tokens}): a chunk longer than any prompt never splits one",
            )
        )
    return errors


def _check_prompt_range(routing: RoutingSpec, limits: LimitsSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    if routing.max_prompt_tokens is not None:
        if routing.max_prompt_tokens > limits.max_context_tokens:
            errors.append(
                FieldError(
                    "spec.routing.maxPromptTokens",
                    f"maxPromptTokens ({routing.max_prompt_tokens}) must not exceed "
                    f"limits.maxContextTokens ({limits.max_context_tokens})",
                )
            )
        if routing.min_prompt_tokens > routing.max_prompt_tokens:
            errors.append(
                FieldError(
                    "spec.routing.minPromptTokens",
                    f"minPromptTokens ({routing.min_prompt_tokens}) must not exceed "
                    f"maxPromptTokens ({routing.max_prompt_tokens})",
                )
            )
    elif routing.min_prompt_tokens >= limits.max_context_tokens:
        errors.append(
            FieldError(
                "spec.routing.minPromptTokens",
                f"minPromptTokens ({routing.min_prompt_tokens}) must be below "
                f"limits.maxContextTokens ({limits.max_context_tokens})",
            )
        )
    return errors


def _check_engine_flags(spec: PoolSpec) -> list[FieldError]:
    """What each engine refuses at start-up, caught before a pod crash-loops on it."""
    errors: list[FieldError] = []
    prefill, limits = spec.prefill, spec.limits
    if spec.engine.kind is EngineKind.VLLM:
        # vLLM refuses to start when one step cannot hold one token per running sequence,
        # or, without chunking, one whole prompt of the maximum length.
        if prefill.token_budget < limits.max_concurrent_requests:
            errors.append(
                FieldError(
                    "spec.prefill.tokenBudget",
                    f"vLLM needs tokenBudget ({prefill.token_budget}) >= "
                    f"limits.maxConcurrentRequests ({limits.max_concurrent_requests})",
                )
            )
        if not prefill.chunked_prefill and prefill.token_budget < limits.max_context_tokens:
            errors.append(
                FieldError(
                    "spec.prefill.tokenBudget",
                    f"vLLM without chunked prefill needs tokenBudget ({prefill.token_budget}) "
                    f">= limits.maxContextTokens ({limits.max_context_tokens}): raise "
                    "tokenBudget or set prefill.chunkedPrefill: true",
                )
            )
        if prefill.max_partial_prefills != 1:
            # V1 stops at start-up on --max-num-partial-prefills other than 1 ("Concurrent
            # Partial Prefill is not supported"); v0.27 removed the flag altogether.
            errors.append(
                FieldError(
                    "spec.prefill.maxPartialPrefills",
                    f"vLLM's V1 engine does not support concurrent partial prefills: set "
                    f"maxPartialPrefills to 1, got {prefill.max_partial_prefills}",
                )
            )
    if spec.engine.kind is EngineKind.SGLANG and prefill.max_partial_prefills != 1:
        errors.append(
            FieldError(
                "spec.prefill.maxPartialPrefills",
                f"SGLang prefills one chunked prompt at a time: set maxPartialPrefills to 1, "
                f"got {prefill.max_partial_prefills}",
            )
        )
    return errors


def _check_field_combinations(spec: PoolSpec) -> list[FieldError]:
    errors: list[FieldError] = [*_check_kv_events(spec)]
    if spec.engine.simulator is not None and spec.engine.kind is not EngineKind.SIMULATOR:
        errors.append(
            FieldError(
                "spec.engine.simulator",
                f"is only for engine kind simulator, not {spec.engine.kind.value}: remove it",
            )
        )
    if spec.selector is not None and spec.autoscaling is not None:
        errors.append(
            FieldError(
                "spec.autoscaling", "cannot be set with spec.selector: adopted pods are not scaled"
            )
        )
    return [*errors, *_check_lending(spec)]


def _check_lending(spec: PoolSpec) -> list[FieldError]:
    lending = spec.lending
    if lending is None:
        return []
    if spec.lane is not Lane.INTERACTIVE:
        return [
            FieldError(
                "spec.lending",
                "is for an interactive pool, which lends its idle replicas to a batch pool: "
                "remove lending, or set it on the interactive pool",
            )
        ]
    scaling = spec.autoscaling
    if scaling is not None and lending.keep_replicas > scaling.max_replicas:
        return [
            FieldError(
                "spec.lending.keepReplicas",
                f"must not exceed autoscaling.maxReplicas ({scaling.max_replicas}), got "
                f"{lending.keep_replicas}: lower keepReplicas or raise maxReplicas",
            )
        ]
    return []


def _check_kv_events(spec: PoolSpec) -> list[FieldError]:
    """What the operator cannot render for engine.kvEvents; the CRD's CEL rules say the same."""
    kv_events = spec.engine.kv_events
    if kv_events is None:
        return []
    path = "spec.engine.kvEvents"
    errors: list[FieldError] = []
    if spec.engine.kind is EngineKind.SGLANG:
        # docs/OPERATOR.md, "The engines' KV events": SGLang v0.5.4's events carry
        # content-only block hashes (sequence-level since sgl-project/sglang#13488), and
        # its blocks are its --page-size, 1 token by default.
        errors.append(
            FieldError(
                path,
                "is for engine kind vllm or simulator: SGLang's KV events (v0.5.4, the "
                "operator's default image) do not chain their blocks as the gateway reads "
                "them; remove engine.kvEvents",
            )
        )
    simulator = spec.engine.kind is EngineKind.SIMULATOR
    if simulator and kv_events.block_size != SIMULATOR_KV_BLOCK_SIZE:
        errors.append(
            FieldError(
                f"{path}.blockSize",
                f"must be {SIMULATOR_KV_BLOCK_SIZE} for engine kind simulator (its KV blocks), "
                f"got {kv_events.block_size}",
            )
        )
    if spec.selector is not None:
        errors.append(
            FieldError(
                path,
                "cannot be set with spec.selector: the operator renders no engine pods for "
                "adopted ones; give those pods --kv-events-config themselves",
            )
        )
    rendered = [a for a in spec.engine.args if a.startswith(KV_EVENTS_RENDERED_FLAGS)]
    if rendered:
        errors.append(
            FieldError(
                "spec.engine.args",
                f"must not carry {rendered[0].split('=')[0]} with engine.kvEvents, which "
                "renders --kv-events-config and --block-size: remove it from engine.args "
                "(the block size is engine.kvEvents.blockSize)",
            )
        )
    return errors


def check_pool_set(pools: Sequence[InferencePool]) -> list[FieldError]:
    """Rules across pools: interactive pools serving one model must not overlap in range,
    and a lending pool's engine must serve its borrower's prompts."""
    errors: list[FieldError] = [*_check_borrowers(pools)]
    interactive = [p for p in pools if p.spec.lane is Lane.INTERACTIVE]
    for i, first in enumerate(interactive):
        for second in interactive[i + 1 :]:
            shared = set(first.spec.public_models) & set(second.spec.public_models)
            if not shared or first.spec.routing.tenants != second.spec.routing.tenants:
                continue
            low = max(first.spec.routing.min_prompt_tokens, second.spec.routing.min_prompt_tokens)
            high = min(first.spec.max_prompt_tokens, second.spec.max_prompt_tokens)
            if low <= high and first.spec.routing.priority == second.spec.routing.priority:
                errors.append(
                    FieldError(
                        f"{second.key}.spec.routing",
                        f"interactive prompt range overlaps pool {first.key} on model "
                        f"{sorted(shared)[0]!r} for {low}-{high} tokens with equal priority: "
                        "make the ranges disjoint or give one pool a higher routing.priority",
                    )
                )
    return errors


def _check_borrowers(pools: Sequence[InferencePool]) -> list[FieldError]:
    """A lent replica runs the borrower's requests on the lender's engine: the borrower must
    be a batch pool of the lender's namespace serving the same model, with prompts (and
    their completions) within the lender's context cap."""
    by_key = {pool.key: pool for pool in pools}
    errors: list[FieldError] = []
    for lender in pools:
        lending = lender.spec.lending
        if lending is None:
            continue
        path, name = f"{lender.key}.spec.lending.borrower", lending.borrower
        borrower = by_key.get(f"{lender.namespace}/{name}")
        if borrower is None:
            message = (
                f"no InferencePool {name!r} in namespace {lender.namespace!r}: create it or "
                "name an existing batch pool"
            )
        elif borrower.spec.lane is not Lane.BATCH:
            message = f"{name!r} is an {borrower.spec.lane.value} pool: name a batch pool"
        elif borrower.spec.model != lender.spec.model:
            message = (
                f"{name!r} serves model {borrower.spec.model!r} but this pool's engine loads "
                f"{lender.spec.model!r}: lend to a pool of the same model"
            )
        elif borrower.spec.limits.max_context_tokens > lender.spec.limits.max_context_tokens:
            message = (
                f"{name!r} takes prompts up to limits.maxContextTokens "
                f"{borrower.spec.limits.max_context_tokens} but this pool's engine holds "
                f"{lender.spec.limits.max_context_tokens}: raise this pool's "
                "limits.maxContextTokens (and its engine's with it) to at least the borrower's"
            )
        else:
            continue
        errors.append(FieldError(path, message))
    return errors
