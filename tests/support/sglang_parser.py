"""SGLang's own argument parser (the `sglang` test tier): the release the operator's image
runs, installed by scripts/install-sglang.sh into its own venv under ~/.cache/laneway/sglang,
parser only (its server needs a GPU build), on the vLLM tier's torch."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from support.vllm_engine import ServeParse

_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "laneway"
SGLANG_VERSION = "0.5.4"  # scripts/install-sglang.sh's pin: the operator's image's release
VENV = Path(os.environ.get("SGLANG_VENV", _CACHE_HOME / "sglang" / f"venv-{SGLANG_VERSION}"))
PYTHON = VENV / "bin" / "python"


def installed() -> str | None:
    """None when the parser can run; otherwise why not (the skip reason)."""
    if not PYTHON.exists():
        return f"SGLang's parser is not installed in {VENV}: scripts/install-sglang.sh installs it"
    return None


def parse_launch_args(argvs: Sequence[Sequence[str]]) -> list[ServeParse]:
    """Each `python3 -m sglang.launch_server ARGV` through SGLang's own parser, in its venv,
    in one process, starting nothing (support/sglang_parse_args.py)."""
    script = Path(__file__).with_name("sglang_parse_args.py")
    ran = subprocess.run(
        [str(PYTHON), "-P", str(script), json.dumps([list(argv) for argv in argvs])],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, f"the parse script failed:\n{ran.stderr[-3000:]}"
    answers = json.loads(ran.stdout.strip().splitlines()[-1])
    return [
        ServeParse(status=a["status"], stderr=a["stderr"], settings=a.get("settings", {}))
        for a in answers
    ]
