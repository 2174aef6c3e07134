"""Run by the vLLM venv's interpreter, never imported by the suite: `vllm serve ARGS` (a JSON
list in argv[1]) through the parser `vllm serve` builds and the subcommand's own start-up
checks, without loading a model. Exit status 2 with argparse's message on stderr for a flag
vLLM does not know or a value its parser refuses; 1 with the check's message for arguments
the checks refuse; 0 and the parsed settings that matter to laneway, as JSON on stdout.

Not EngineArgs: its __post_init__ resolves the model (a hub look-up for a name such as
the operator renders), which belongs to the start, not to the parse."""

from __future__ import annotations

import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

SETTINGS = (
    "model", "served_model_name", "host", "port", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "enable_chunked_prefill", "long_prefill_token_threshold",
    "scheduling_policy", "block_size", "kv_events_config", "enable_prefix_caching",
)  # fmt: skip


def main() -> int:
    # As vllm/entrypoints/cli/main.py builds it: the `serve` subparser under the CLI's own.
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    args = parser.parse_args(["serve", *json.loads(sys.argv[1])])
    if args.model_tag is not None:
        args.model = args.model_tag
    try:
        serve.validate(args)
    except (ValueError, TypeError) as error:
        print(f"vllm serve refused the arguments: {error}", file=sys.stderr)
        return 1
    print(json.dumps({name: getattr(args, name, None) for name in SETTINGS}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
