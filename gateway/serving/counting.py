"""Which tokenizer counts a pool's prompts: the one its InferencePool names, else the default.

Each distinct `spec.tokenizer` is loaded once (a tokenizer.json takes milliseconds to load
and megabytes to hold) and shared by every pool that names it.
"""

from __future__ import annotations

from laneway.api import InferencePool, TokenizerSpec
from laneway.errors import UsageError
from laneway.gateway.errors import ApiError
from laneway.tokens import Tokenizer, load_tokenizer


class PoolTokenizers:
    def __init__(self, default: Tokenizer, retry_after_s: int) -> None:
        self.default = default
        self._retry_after_s = retry_after_s
        self._loaded: dict[TokenizerSpec, Tokenizer] = {}

    def of(self, pool: InferencePool) -> Tokenizer:
        spec = pool.spec.tokenizer
        if spec is None:
            return self.default
        loaded = self._loaded.get(spec)
        if loaded is None:
            try:
                loaded = load_tokenizer(spec.kind.value, spec.encoding, spec.path)
            except UsageError as error:
                # Not cached: a ConfigMap mounted late is picked up by the next request.
                raise ApiError(
                    503,
                    f"Pool {pool.name} names a tokenizer the gateway cannot load: {error}",
                    "tokenizer_unavailable",
                    retry_after=self._retry_after_s,
                ) from None
            self._loaded[spec] = loaded
        return loaded
