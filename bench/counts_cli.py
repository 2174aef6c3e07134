"""`laneway bench counts`: the gateway's default count against a model's own, near edges."""

from __future__ import annotations

import argparse
from typing import Any


def register_bench_counts(bench: argparse._SubParsersAction[Any]) -> None:
    counts = bench.add_parser(
        "counts",
        help="how often the default tokenizer puts a prompt on the wrong side of an edge",
        description="Cut real text (Python source, licence prose) and the benchmarks' "
        "synthetic prompts into one-message chats whose count by the given model tokenizer "
        "(and chat template) lies within 10%% of each edge; count each with the gateway's "
        "default (cl100k_base, OpenAI's framing) too, and report the error and how many "
        "prompts the default puts on the other side of the edge.",
    )
    counts.add_argument(
        "--tokenizer", required=True, metavar="TOKENIZER_JSON", help="the model's tokenizer.json"
    )
    counts.add_argument(
        "--chat-template",
        metavar="TOKENIZER_CONFIG_JSON",
        help="the model's tokenizer_config.json, whose chat template frames its chats "
        "(default: OpenAI's framing rule for both)",
    )
    counts.add_argument(
        "--edges",
        default="4096,32768",
        help="comma-separated edges in tokens: lane thresholds, context caps (default 4096,32768)",
    )
    counts.add_argument(
        "--prompts", type=int, default=200, help="prompts per text and edge (default 200)"
    )
    counts.add_argument("--seed", type=int, default=0, help="which cuts of the text (default 0)")
    counts.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    counts.set_defaults(handler=run_bench_counts)


def run_bench_counts(args: argparse.Namespace) -> int:
    import sys

    from laneway.bench.counts import render, run_bench
    from laneway.errors import UsageError
    from laneway.outputs import check_output_folder, write_json
    from laneway.tokens import HuggingFaceTokenizer, default_tokenizer

    try:
        edges = [int(edge) for edge in args.edges.split(",")]
    except ValueError:
        message = f"--edges must be integers separated by commas, got {args.edges!r}"
        raise UsageError(message) from None
    if any(edge < 16 for edge in edges) or args.prompts < 20:
        raise UsageError("each edge must be at least 16 tokens and --prompts at least 20")
    check_output_folder(args.json, "--json")
    engine = HuggingFaceTokenizer(args.tokenizer, args.chat_template)
    command = " ".join(["laneway", *sys.argv[1:]])
    report = run_bench(engine, default_tokenizer(), edges, args.prompts, args.seed, command)
    print("\n".join(render(report)))
    if args.json:
        write_json(args.json, report.to_json())
    return 0
