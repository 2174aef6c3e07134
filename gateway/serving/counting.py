"""Which tokenizer counts a pool's prompts, and where the long counts run.

Each distinct `spec.tokenizer` is loaded once (a tokenizer.json takes milliseconds to load
and megabytes to hold) and shared by every pool that names it.

Long prompts are counted in a worker process, not a thread. The encoders merge without the
interpreter lock but build their list of ids (128k of them) with it, and a thread that wants
the lock back takes it from the event loop for up to a switch interval at a time; a process
shares no lock with the loop, and runs niced so that where CPUs are short the kernel runs
the loop first. On the loaded 2-core machine the stall either way was close to the loop's
own scheduling noise (docs/BENCHMARKS.md). One worker: concurrent long counts queue behind
each other (a 128k count is ~0.1 s) rather than each holding a tokenizer's memory. The
worker gets what the count needs (the prompt's text, not the whole body) and loads each
tokenizer once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from laneway.api import InferencePool, TokenizerSpec
from laneway.errors import UsageError
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.request_body import ParsedRequest
from laneway.tokens import Tokenizer, TokenizerRecipe, load_tokenizer


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


# Below the event loop's priority: where CPUs are short, the scheduler runs the loop first.
WORKER_NICENESS = 10


class OffLoopCounter:
    """Exact counts in one worker process, started on the first long prompt."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def count(self, parsed: ParsedRequest, tokenizer: Tokenizer) -> int:
        if self._pool is None:
            # spawn, not fork: the gateway has threads (the executor's) whose locks a fork
            # would copy mid-use; and no forkserver left behind.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=os.nice, initargs=(WORKER_NICENESS,)
            )
        prompt = dataclasses.replace(parsed, payload={})  # the body's other fields stay here
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, _count, tokenizer.recipe, prompt)
        except BrokenProcessPool:
            # The worker died (killed for memory, or it could not start): count this one in
            # a thread, at the loop's cost, and start a fresh worker for the next.
            self.close()
            return await loop.run_in_executor(None, parsed.count, tokenizer)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


@functools.cache
def _tokenizer(recipe: TokenizerRecipe) -> Tokenizer:
    return load_tokenizer(recipe.kind, recipe.encoding, recipe.path)


def _count(recipe: TokenizerRecipe, prompt: ParsedRequest) -> int:
    """Runs in the worker process."""
    return prompt.count(_tokenizer(recipe))
