"""A request's body parsed, its prompt counted and its route decided: the routing
library's `classify` on token bounds where they decide, an exact count where they do not,
and the prompt's prefix blocks for the ledger's index."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from laneway.api import InferencePool, Lane
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.counting import LocalCount, PromptCounter
from laneway.gateway.serving.outcome import Outcome
from laneway.gateway.serving.request_body import (
    Endpoint,
    ParsedRequest,
    json_values,
    parse_request,
    parse_scanned,
)
from laneway.ledger import NO_BLOCKS, PromptBlocks
from laneway.prompt_ids import chat_token_ids
from laneway.routing.kv_events import token_block_keys
from laneway.routing.lanes import (
    Decision,
    NeedsExactCount,
    NoFit,
    Route,
    RouteRequest,
    UnknownModel,
    classify,
)
from laneway.routing.prefix_index import leading_block_hashes
from laneway.tokens import TokenBounds

# A body this small holds little enough text to count exactly in well under a millisecond:
# do it inline, so the x-laneway-prompt-tokens header is exact without the thread pool.
INLINE_COUNT_BYTES = 16 * 1024
# A body up to this size, with few JSON values, is parsed and its token bounds taken on the
# loop too: about 2 ms for a 128k-token prompt (~650 KB) and 3-4 ms at the limit, where a
# worker thread's hop costs more than the work on a busy machine (it waits for the
# interpreter lock the loop holds). Parsing costs by value count more than by bytes, so a
# body with many values (up to MAX_JSON_VALUES) still goes to the thread.
INLINE_PARSE_BYTES = 1024 * 1024
INLINE_PARSE_VALUES = 2048


async def parse(body: bytes, endpoint: Endpoint) -> tuple[ParsedRequest, bool]:
    """The parsed body, and whether it was small enough to parse (and bound) on the loop."""
    if len(body) <= INLINE_COUNT_BYTES:
        return parse_request(body, endpoint), True
    if len(body) <= INLINE_PARSE_BYTES and json_values(body) <= INLINE_PARSE_VALUES:
        return parse_scanned(body, endpoint), True
    # Parsing is linear in the body, but a few MB of tiny strings still take a while.
    return await asyncio.to_thread(parse_request, body, endpoint), False


async def route_request(
    path: RequestPath,
    parsed: ParsedRequest,
    body_bytes: int,
    inline: bool,
    pinned: Lane | None,
    tenant: str | None,
    outcome: Outcome,
    held_by: InferencePool | None = None,
    history_tokens: int = 0,
) -> tuple[Route, PromptCount]:
    """Classify from bounds where they decide; the exact count follows off the loop.

    Each pool's prompt is counted with its own tokenizer (once per distinct tokenizer);
    with one tokenizer everywhere, as by default, that is a single count. A response that
    continues a stored one (`held_by` its holder's pool) goes to that pool only, its
    prompt counted with the `history_tokens` the engine prepends.
    """
    metrics, clock = path.metrics, path.clock
    all_pools = path.ledger.pools()
    counters = path.tokenizers.serving(all_pools, parsed.model)
    by_pool, distinct = counters.by_pool, counters.distinct
    pools = all_pools if held_by is None else (held_by,)
    history = TokenBounds(history_tokens, history_tokens)

    def ask(measured: dict[int, TokenBounds]) -> RouteRequest:
        counted = {key: bounds + history for key, bounds in measured.items()}
        if len(distinct) == 1:  # one tokenizer counts for every pool, as by default
            (only,) = counted.values()
            return RouteRequest(
                parsed.model, only, parsed.max_tokens, pinned, tenant, held_tokens=history_tokens
            )
        spanning = TokenBounds(
            min(b.low for b in counted.values()), max(b.high for b in counted.values())
        )
        per_pool = {key: counted[id(t)] for key, t in by_pool.items()}
        return RouteRequest(
            parsed.model,
            spanning,
            parsed.max_tokens,
            pinned,
            tenant,
            pool_prompt_tokens=per_pool,
            held_tokens=history_tokens,
        )

    async def exactly() -> RouteRequest:
        counts = await asyncio.gather(*(_count_exactly(path, parsed, t) for t in distinct))
        return ask({id(t): _exact(n) for t, n in zip(distinct, counts, strict=True)})

    # A non-streaming answer carries the engine's own count (engine_usage.py): its prompt is
    # counted only where the bounds do not decide the route. A stream's header goes out
    # before the engine's usage, so a small one is counted here, where it is cheap.
    decision: Decision
    if body_bytes <= INLINE_COUNT_BYTES and parsed.stream:
        begun = clock()
        exact = {id(t): t.inline(parsed) for t in distinct}
        metrics.tokenize_of("inline").observe(clock() - begun)
        decision = await settle_route(ask(exact), pools, exactly)
    else:
        # The texts' lengths alone route most prompts; the bounds that scan them next, and
        # the exact count last, only where those do not.
        loose = {id(t): b for t in distinct if (b := t.length_bounds(parsed)) is not None}
        decision = classify(ask(loose), pools) if len(loose) == len(distinct) else NeedsExactCount()
        if isinstance(decision, NeedsExactCount):
            begun = clock()
            if inline:
                bounds = {id(t): t.bounds(parsed) for t in distinct}
            else:
                # Bounds of a body past INLINE_PARSE_BYTES cost milliseconds per tokenizer.
                bounds = await asyncio.to_thread(
                    lambda: {id(t): t.bounds(parsed) for t in distinct}
                )
            metrics.tokenize_of("bounds").observe(clock() - begun)
            decision = await settle_route(ask(bounds), pools, exactly)
    if isinstance(decision, UnknownModel):
        raise ApiError(404, decision.message, "model_not_found", "model")
    if isinstance(decision, NoFit):
        outcome.prompt_tokens = decision.prompt_tokens
        code = "context_length_exceeded" if decision.context_exceeded else "no_lane_fits"
        param = {Endpoint.CHAT: "messages", Endpoint.RESPONSES: "input"}.get(
            parsed.endpoint, "prompt"
        )
        raise ApiError(400, decision.message, code, param)
    assert isinstance(decision, Route)

    count = PromptCount(path, parsed, by_pool[decision.pool.key].once_routed, history_tokens)
    if decision.prompt_tokens.exact:
        count.known = decision.prompt_tokens.low
    elif parsed.stream:
        # The route is settled; count for the header and metrics while the engine works.
        count.counting = asyncio.ensure_future(_count_exactly(path, parsed, count.counter))
    return decision, count


@dataclass
class PromptCount:
    """The prompt's exact count, for the header, the prompt-token metric and the log line:
    known where routing needed it, else being counted (a stream), else counted only when it
    is awaited (a non-streaming answer that does not carry the engine's count)."""

    path: RequestPath
    parsed: ParsedRequest
    counter: PromptCounter  # the routed pool's
    history_tokens: int = 0  # a continued response's, which the engine prepends
    known: int | None = None
    counting: asyncio.Future[int] | None = None

    def __await__(self) -> Generator[Any, None, int]:
        return self._exact().__await__()

    async def _exact(self) -> int:
        if self.known is None:
            if self.counting is None:
                counted = await _count_exactly(self.path, self.parsed, self.counter)
            else:
                counted = await self.counting
            self.known = counted + self.history_tokens
        return self.known

    def cancel(self) -> None:
        if self.counting is not None and not self.counting.done():
            self.counting.cancel()


async def settle_route(
    ask: RouteRequest,
    pools: Sequence[InferencePool],
    exactly: Callable[[], Awaitable[RouteRequest]],
) -> Decision:
    """Classify `ask` by its token bounds; where they do not decide, count and classify again.

    `exactly` counts the prompt and returns `ask` with exact counts in place of the bounds.
    """
    decision = classify(ask, pools)
    if isinstance(decision, NeedsExactCount):
        decision = classify(await exactly(), pools)
    return decision


def _exact(count: int) -> TokenBounds:
    return TokenBounds(count, count)


async def _count_exactly(path: RequestPath, parsed: ParsedRequest, counter: PromptCounter) -> int:
    begun = path.clock()
    count = await counter.count(parsed)
    path.metrics.tokenize_of(counter.method).observe(path.clock() - begun)
    return count


async def prompt_blocks(
    path: RequestPath, parsed: ParsedRequest, pool: InferencePool
) -> PromptBlocks:
    """The prompt's prefix blocks as the ledger's prefix index keys them, where the profile
    scores them: hashing (and for the exact feed, tokenizing) is the shell's."""
    if not path.ledger.wants_prefix_blocks:
        return NO_BLOCKS
    prefix = path.settings.picking.prefix
    source = prefix.kv_events_of(pool.name)
    if source is None:
        return PromptBlocks(
            hashes=leading_block_hashes(parsed.prefix_text(), prefix.block_chars, prefix.max_blocks)
        )
    # The engine's token ids, as the pool's tokenizer renders them: a chat through the
    # model's chat template where the pool has one (else the simulator's framing), a text
    # prompt with the tokenizer's specials. Matches exactly where those are the engine's own.
    counter = path.tokenizers.of(pool)
    if not isinstance(counter, LocalCount):
        # Counted by the engine's /tokenize: the gateway holds no tokenizer to render with.
        return PromptBlocks(exact_block_size=source.block_size)
    tokenizer = counter.tokenizer

    def keys() -> tuple[int, ...]:
        template = tokenizer.chat_template
        if parsed.is_chat and template is not None:
            ids = tokenizer.encode(template.render(parsed.template_chat()))
        elif parsed.is_chat:
            ids = chat_token_ids(tokenizer, parsed.messages)
        elif len(parsed.prompts) == 1:
            ids = tokenizer.encode_prompt(parsed.prompts[0])
        else:
            return ()
        return token_block_keys(ids, source.block_size)

    long = sum(len(m.content) for m in parsed.messages) + sum(map(len, parsed.prompts))
    hashes = await asyncio.to_thread(keys) if long > INLINE_COUNT_BYTES else keys()
    return PromptBlocks(hashes=hashes, exact_block_size=source.block_size)
