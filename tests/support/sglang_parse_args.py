"""Run by the SGLang venv's interpreter (scripts/install-sglang.sh), never imported by the
suite: each argument list of a JSON list (argv[1]) through the parser `python3 -m
sglang.launch_server` builds (prepare_server_args: an argparse parser that
ServerArgs.add_cli_args fills), in one process. Prints one JSON list, an answer per argument
list: status 2 with argparse's message for a flag SGLang does not know or a value its parser
refuses; 0 and the parsed settings that matter to laneway.

Not ServerArgs.from_cli_args: its __post_init__ looks for a GPU and reads the model's config,
which belongs to the start, not to the parse."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

from sglang.srt.server_args import ServerArgs

SETTINGS = (
    "model_path", "served_model_name", "host", "port", "context_length",
    "max_running_requests", "max_prefill_tokens", "chunked_prefill_size", "enable_metrics",
    "enable_mixed_chunk", "schedule_policy", "enable_priority_scheduling",
    "schedule_low_priority_values_first", "enable_cache_report",
)  # fmt: skip


def parse(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit as exit_:
        return {"status": exit_.code, "stderr": stderr.getvalue()}
    settings = {name: getattr(args, name, None) for name in SETTINGS}
    return {"status": 0, "stderr": "", "settings": settings}


def main() -> int:
    answers = [parse(argv) for argv in json.loads(sys.argv[1])]
    print(json.dumps(answers, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
