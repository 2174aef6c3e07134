"""The ledger as one plan's producers see it (`laneway.routing.cycle.Facts`): its load,
gauges, learned rates, prefix index and health, read at the plan's moment."""

from __future__ import annotations

from laneway.ledger.decisions import PromptBlocks
from laneway.ledger.endpoints import EndpointBook
from laneway.ledger.load import LoadBook
from laneway.routing.cycle import EndpointLoad
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.prefix_index import PrefixIndex
from laneway.routing.slo import PrefillRate


class PlanFacts:
    """The ledger as one plan's producers see it (`laneway.routing.cycle.Facts`)."""

    def __init__(
        self,
        load: LoadBook,
        endpoints: EndpointBook,
        index: PrefixIndex,
        now: float,
        blocks: PromptBlocks,
        prompt_tokens: int,
    ) -> None:
        self._load, self._endpoints, self._index = load, endpoints, index
        self._now, self._blocks, self._prompt_tokens = now, blocks, prompt_tokens
        self._matched: dict[str, int] | None = None

    def load(self, url: str) -> EndpointLoad:
        return self._load.of(url)

    def engine(self, url: str) -> EngineMetrics | None:
        return self._endpoints.fresh_metrics(url, self._now)

    def prefill_rate(self, url: str) -> PrefillRate | None:
        return self._endpoints.prefill_rates.get(url)

    def cached_prompt_tokens(self, url: str) -> int | None:
        if not self._blocks.hashes:
            return None
        if self._matched is None:  # one walk of the index for all endpoints
            self._matched = self._index.matched_blocks(self._blocks.hashes)
        return self._blocks.cached_tokens(self._matched.get(url, 0), self._prompt_tokens)

    def healthy(self, url: str) -> bool:
        return self._endpoints.healthy(url)
