"""`laneway bench counts`: the gateway's default count against a model's own, near edges."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.bench.harness.flags import (
    add_int_list_flag,
    add_json_flag,
    add_value_flag,
    parse_int_list,
    run_and_report,
)


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
    add_int_list_flag(
        counts, "--edges", (4096, 32768), "edges in tokens: lane thresholds, context caps"
    )
    add_value_flag(counts, "--prompts", 200, "prompts per text and edge")
    add_value_flag(counts, "--seed", 0, "which cuts of the text")
    add_json_flag(counts)
    counts.set_defaults(handler=run_bench_counts)


def run_bench_counts(args: argparse.Namespace) -> int:
    from laneway.bench.counts.run import render, run_bench
    from laneway.errors import UsageError
    from laneway.tokens import HuggingFaceTokenizer, default_tokenizer

    edges = parse_int_list(args.edges, "--edges")
    if not edges or any(edge < 16 for edge in edges) or args.prompts < 20:
        raise UsageError("each edge must be at least 16 tokens and --prompts at least 20")
    engine = HuggingFaceTokenizer(args.tokenizer, args.chat_template)
    return run_and_report(
        lambda command: run_bench(
            engine, default_tokenizer(), edges, args.prompts, args.seed, command
        ),
        render,
        args.json,
    )
