"""Run by the vLLM venv's interpreter, never imported by the suite: each `vllm serve ARGS`
of a JSON list of argument lists (argv[1]) through the parser `vllm serve` builds and the
subcommand's own start-up checks, without loading a model, in one process (importing vLLM
takes 15-50 s here). Prints one JSON list, an answer per argument list: status 2 with
argparse's message for a flag vLLM does not know or a value its parser refuses; 1 with the
check's message for arguments the checks refuse; 0 and the parsed settings that matter to
laneway.

Not EngineArgs: its __post_init__ resolves the model (a hub look-up for a name such as
the operator renders), which belongs to the start, not to the parse."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

SETTINGS = (
    "model", "served_model_name", "host", "port", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "enable_chunked_prefill", "long_prefill_token_threshold",
    "scheduling_policy", "block_size", "kv_events_config", "enable_prefix_caching",
    "enable_prompt_tokens_details",
)  # fmt: skip


def parse(argv: list[str]) -> dict[str, Any]:
    # As vllm/entrypoints/cli/main.py builds it: the `serve` subparser under the CLI's own.
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(["serve", *argv])
    except SystemExit as exit_:
        return {"status": exit_.code, "stderr": stderr.getvalue()}
    if args.model_tag is not None:
        args.model = args.model_tag
    try:
        serve.validate(args)
    except (ValueError, TypeError) as error:
        return {"status": 1, "stderr": f"vllm serve refused the arguments: {error}"}
    settings = {name: getattr(args, name, None) for name in SETTINGS}
    return {"status": 0, "stderr": "", "settings": settings}


def main() -> int:
    answers = [parse(argv) for argv in json.loads(sys.argv[1])]
    print(json.dumps(answers, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
