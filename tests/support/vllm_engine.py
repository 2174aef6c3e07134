"""Real vLLM on the CPU (the `vllm` test tier): the tiny Llama-shaped model of
laneway.bench.harness.tiny_model and one `vllm serve` of it (laneway.bench.harness.vllm_server,
which `laneway demo --engine vllm` uses too), with the scheduler settings the tier compares
the simulator under.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laneway.bench.harness.tiny_model import ModelFiles, TinyModel
from laneway.bench.harness.tiny_model import write_tiny_model as _write_tiny_model
from laneway.bench.harness.vllm_server import (
    BLOCK_SIZE,
    PYTHON,
    environment,
    installed,
    serve_argv,
    start,
    stop_group,
    wait_healthy,
)
from support.pools import gateway_doc, pool_doc

__all__ = ["BLOCK_SIZE", "installed"]  # the tier's tests import them from here

SERVED_NAME = "tiny"
# The scheduler the session's server runs, and the simulator is given in the comparison.
MAX_NUM_SEQS = 2  # two running at once: a third waits, where priority order shows
TOKEN_BUDGET = 256  # --max-num-batched-tokens
CHUNK_SIZE = 64  # --long-prefill-token-threshold
# Long enough that a stream of support.engine_traces.ENDLESS tokens outlasts any check by
# minutes, so a blocker never ends while a test waits on it: vLLM's own log showed a
# stream here at up to 974 tokens/s (falling to ~300 by 30k tokens of context), and its
# API server, streaming, took 83 s to take in a long prompt; 32k tokens ran out in that
# time. The tiny model's KV is 1 KiB a token: 128 MiB a stream in the 2 GiB cache.
MAX_MODEL_LEN = 131072


def write_tiny_model(folder: Path) -> TinyModel:
    return _write_tiny_model(folder, MAX_MODEL_LEN)


@dataclass(frozen=True)
class VLLMServer:
    url: str
    model: TinyModel
    kv_events: str  # the ZMQ address the engine connects its publisher to (a gateway binds)
    kv_topic: str
    argv: tuple[str, ...]
    log: Path


@contextlib.contextmanager
def running_vllm(model: TinyModel, port: int, kv_events: str, log: Path) -> Iterator[VLLMServer]:
    """One `vllm serve`, ready (its /health answers 200) before the block runs, stopped
    with its whole process group (the API server, the engine core) after it."""
    topic = f"kv@127.0.0.1:{port}@{SERVED_NAME}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events,
              "topic": topic}  # fmt: skip
    argv = serve_argv(
        model, SERVED_NAME, port, max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
        token_budget=TOKEN_BUDGET, chunk_size=CHUNK_SIZE,
        # The publisher connects to an explicit host (bind only for `*`, ipc:// or
        # inproc://), as an operator-run pool's engines do to the gateway's SUB socket.
        extra=["--scheduling-policy", "priority", "--kv-events-config", json.dumps(config),
               # Each request's arrival, abort and end in the log (the fixture's `log`):
               # what a test that left vLLM busy, or waited on it, is diagnosed from.
               "--enable-log-requests"],
    )  # fmt: skip
    server = VLLMServer(f"http://127.0.0.1:{port}", model, kv_events, topic, tuple(argv), log)
    child = start(argv, log)
    try:
        wait_healthy(child, server.url, log)
        yield server
    finally:
        stop_group(child)


@dataclass(frozen=True)
class ServeParse:
    """What vLLM's `vllm serve` parser and checks said of one argument list."""

    status: int  # 0 parsed, 1 refused by the checks, 2 refused by the parser
    stderr: str
    settings: dict[str, Any]


def parse_serve_args(argvs: Sequence[Sequence[str]]) -> list[ServeParse]:
    """Each `vllm serve ARGV` through vLLM's own argument parser and start-up checks, in the
    tier's venv, in one process, without starting anything (support/vllm_parse_args.py)."""
    script = Path(__file__).with_name("vllm_parse_args.py")
    ran = subprocess.run(
        [str(PYTHON), "-P", str(script), json.dumps([list(argv) for argv in argvs])],
        capture_output=True, text=True, env=environment(), timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, f"the parse script failed:\n{ran.stderr[-3000:]}"
    answers = json.loads(ran.stdout.strip().splitlines()[-1])
    return [
        ServeParse(status=a["status"], stderr=a["stderr"], settings=a.get("settings", {}))
        for a in answers
    ]


def vllm_pool_docs(server: VLLMServer, **gateway_spec: Any) -> list[dict[str, Any]]:
    """A gateway config with one pool, `real`, of the server, serving public model "llama":
    counted with the model's own tokenizer and chat template, scheduled by priority as the
    server is, scraped once a second."""
    return tiny_pool_docs(server.url, server.model.files, **gateway_spec)


def tiny_pool_docs(url: str, files: ModelFiles, **gateway_spec: Any) -> list[dict[str, Any]]:
    """vllm_pool_docs for any engine serving the tiny model as SERVED_NAME at `url` (real
    vLLM, or `laneway sim` given the same tokenizer and chat template)."""
    pool = pool_doc(
        "real", "interactive", SERVED_NAME, [url],
        limits={"maxContextTokens": MAX_MODEL_LEN, "maxConcurrentRequests": 16},
    )  # fmt: skip
    pool["spec"]["engine"] = {"kind": "vllm"}
    # As the server runs (--scheduling-policy priority): without it the gateway sends vLLM
    # no `priority` at all (laneway.routing.priority), and a client's is dropped.
    pool["spec"]["scheduling"] = {"policy": "priority"}
    pool["spec"]["tokenizer"] = {
        "kind": "huggingface", "path": str(files.tokenizer), "configPath": str(files.config),
    }  # fmt: skip
    # Patient timeouts: on two shared cores vLLM's API server, beside its engine core, can
    # take tens of seconds to answer a scrape or a connection (a connection timed out at
    # 10 s); the defaults (1 s, 2 s) are for a GPU server. A stream waiting in vLLM's queue
    # is silent until it runs. Each scrape renders all of vLLM's metrics on that same core.
    patience = {"connectTimeoutMillis": 60000, "readTimeoutMillis": 600000}
    return [
        pool,
        gateway_doc(
            scrape={"intervalMillis": 1000, "timeoutMillis": 30000},
            upstream=patience,
            **gateway_spec,
        ),
    ]
