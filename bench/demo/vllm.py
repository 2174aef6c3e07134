"""`laneway demo --engine vllm`: the demo's two lanes on real vLLM on the CPU, one `vllm
serve` per pool, where scripts/install-vllm.sh has installed it.

The model is the tiny Llama-shaped one of laneway.bench.harness.tiny_model (random weights,
no download), its tokenizer trained on the load generator's words so that prompts of an
exact length can be made; the gateway counts with that tokenizer and its chat template, as
vLLM does. What is scaled down is what a CPU cannot do at the sim's sizes: the chat lane's
context is 2k, the documents' 8k, and the workload's prompts and outputs shrink to fit.
Two servers take about 10 GB of memory and minutes to start on a small machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laneway.api import Lane
from laneway.bench.harness.prompts import COMMON_WORDS
from laneway.bench.harness.redis_server import free_port
from laneway.bench.harness.tiny_model import TinyModel, write_tiny_model
from laneway.bench.harness.vllm_server import serve_argv, start, stop_group, wait_healthy
from laneway.bench.harness.workload import LongRequest, Workload
from laneway.simulator.scheduler import SchedulerConfig
from laneway.simulator.seed import PUBLIC_MODEL, SimPool

CHAT_CONTEXT = 2048
DOCUMENT_CONTEXT = 8192
VLLM_POOLS = (
    SimPool(
        name="chat",
        lane=Lane.INTERACTIVE,
        max_prompt_tokens=1024,
        max_context_tokens=CHAT_CONTEXT,
        replicas=1,
        # Whole-prompt prefill: vLLM then needs a step budget of the whole context.
        engine=SchedulerConfig(
            kind="full", token_budget=CHAT_CONTEXT, max_num_seqs=16, max_context=CHAT_CONTEXT
        ),
    ),
    SimPool(
        name="documents",
        lane=Lane.BATCH,
        max_prompt_tokens=DOCUMENT_CONTEXT - 256,
        max_context_tokens=DOCUMENT_CONTEXT,
        replicas=1,
        engine=SchedulerConfig(
            kind="chunked",
            token_budget=512,
            chunk_size=256,
            max_num_seqs=4,
            max_context=DOCUMENT_CONTEXT,
        ),
        min_prompt_tokens=1025,
    ),
)
# A vocabulary with room for every load-generator word, with and without its space.
VOCAB_SIZE = 4000


def vllm_workload(sessions: int, long_documents: int, duration_s: float, seed: int) -> Workload:
    """The demo's mix at the tiny model's sizes: chats well under the chat lane's 1k-token
    prompt cap, documents between it and the documents' context."""
    sizes = (1536, 2560, 4096, 6144)
    long_requests = tuple(
        LongRequest(
            at_s=duration_s * (index + 1) / (2 * long_documents + 2),
            prompt_tokens=sizes[index % len(sizes)],
            output_tokens=64,
        )
        for index in range(long_documents)
    )
    return Workload(
        model=PUBLIC_MODEL,
        sessions=sessions,
        prompt_tokens=(100, 800),
        output_tokens=(16, 64),
        think_s=(1.0, 3.0),
        ramp_s=min(2.0, duration_s / 4),
        duration_s=duration_s,
        long_requests=long_requests,
        drain_s=300.0,  # a CPU prefills a document's thousands of tokens in seconds
        seed=seed,
    )


@dataclass(frozen=True)
class VLLMEngines:
    model: TinyModel
    endpoints: Mapping[str, Sequence[str]]  # pool name -> its server's URL
    logs: Sequence[Path]


def engine_argv(pool: SimPool, model: TinyModel, port: int) -> list[str]:
    engine = pool.engine
    return serve_argv(
        model,
        pool.served_model,
        port,
        max_model_len=pool.max_context_tokens,
        max_num_seqs=engine.max_num_seqs,
        token_budget=engine.token_budget,
        chunk_size=engine.chunk_size if engine.kind == "chunked" else None,
    )


@contextlib.contextmanager
def stopping(children: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for child in children:
            stop_group(child)


async def start_vllm_engines(folder: Path, children: list[subprocess.Popen[bytes]]) -> VLLMEngines:
    """The tiny model written to `folder`, then one `vllm serve` per pool, started at once
    and awaited until each answers /health; each started process goes into `children` (the
    caller stops them, whatever happens here)."""
    words = COMMON_WORDS
    context = max(pool.max_context_tokens for pool in VLLM_POOLS)
    model = write_tiny_model(folder / "model", context, words, VOCAB_SIZE)
    endpoints: dict[str, list[str]] = {}
    waits = []
    logs = []
    for pool in VLLM_POOLS:
        port = free_port()
        log = folder / f"vllm-{pool.name}.log"
        child = start(engine_argv(pool, model, port), log)
        children.append(child)
        url = f"http://127.0.0.1:{port}"
        endpoints[pool.name] = [url]
        logs.append(log)
        waits.append(asyncio.to_thread(wait_healthy, child, url, log))
    await asyncio.gather(*waits)
    return VLLMEngines(model=model, endpoints=endpoints, logs=logs)


def vllm_documents(engines: VLLMEngines) -> list[dict[str, Any]]:
    """The gateway's config: the demo's pools as vLLM pools, counted with the model's own
    tokenizer and chat template."""
    files = engines.model.files
    documents = []
    for pool in VLLM_POOLS:
        document = pool.document(engines.endpoints[pool.name], namespace="demo")
        document["spec"]["engine"] = {"kind": "vllm"}
        document["spec"]["tokenizer"] = {
            "kind": "huggingface", "path": str(files.tokenizer), "configPath": str(files.config),
        }  # fmt: skip
        documents.append(document)
    return documents
