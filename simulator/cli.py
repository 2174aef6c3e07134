"""Command-line entry point of the simulator: `laneway sim`."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.api import MetricsFlavor, SchedulingPolicy
from laneway.errors import UsageError
from laneway.simulator.profiles import DEFAULT_PROFILE, PROFILES, Profile
from laneway.simulator.scheduler import (
    SCHEDULER_KINDS,
    SchedulerConfig,
    config_problems,
)


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `sim`."""
    sim = commands.add_parser(
        "sim",
        help="one simulated engine (scheduler + cost model in real time) as an OpenAI server",
        description="Serve one simulated LLM engine over HTTP: OpenAI completions and chat "
        "(streaming and not), /v1/models, /health and vLLM- or SGLang-style /metrics. Token "
        "timing follows the scheduler and the profile's cost model, in real time divided by "
        "--time-scale.",
    )
    sim.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sim.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    sim.add_argument("--model", default="llama3-8b", help="model name to serve")
    add_engine_flags(sim)
    sim.add_argument(
        "--metrics-flavor",
        choices=[flavor.value for flavor in MetricsFlavor],
        default=MetricsFlavor.VLLM.value,
        help="metric names on /metrics (default vllm)",
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run this many times faster than real time (default 1.0)",
    )
    sim.add_argument(
        "--tokenizer",
        metavar="TOKENIZER_JSON",
        help="count prompts with this Hugging Face tokenizer.json, as a real engine counts "
        "with its model's (default: tiktoken cl100k_base)",
    )
    sim.add_argument(
        "--chat-template",
        metavar="TOKENIZER_CONFIG_JSON",
        help="frame chats with the chat template (and special tokens) of this "
        "tokenizer_config.json, as vLLM and SGLang do; needs --tokenizer "
        "(default: OpenAI's framing rule, 3 tokens a message and 3 for the reply)",
    )
    sim.add_argument(
        "--kv-events-config",
        metavar="JSON",
        help="publish the prefix cache's stored and evicted blocks over ZMQ as vLLM does, "
        'e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}\' '
        "(vLLM's flag and fields; an endpoint with '*' or an ipc:// one is bound, others "
        "connected)",
    )
    sim.add_argument(
        "--enable-responses-store",
        action="store_true",
        help="keep responses created with store=true (for GET and previous_response_id), as "
        "vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1 (default: store is ignored, as vLLM)",
    )
    sim.set_defaults(handler=run_sim)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help=f"hardware/model profile (default {DEFAULT_PROFILE}; 'zero' takes no time)",
    )
    parser.add_argument(
        "--scheduler",
        choices=SCHEDULER_KINDS,
        default="chunked",
        help="chunked: decodes first, prompts in chunks within the token budget (vLLM V1); "
        "full: a prompt's whole prefill in one step",
    )
    parser.add_argument(
        "--token-budget", type=int, default=2048, help="tokens one engine step may process"
    )
    parser.add_argument(
        "--chunk-size", type=int, default=1024, help="most prompt tokens of one request per step"
    )
    parser.add_argument(
        "--max-context", type=int, default=8192, help="longest prompt + output, in tokens"
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="most requests running at once"
    )
    parser.add_argument(
        "--max-partial-prefills",
        type=int,
        default=1,
        help="most partly prefilled prompts in one step",
    )
    parser.add_argument(
        "--scheduling-policy",
        choices=[policy.value for policy in SchedulingPolicy],
        default=SchedulingPolicy.FCFS.value,
        help="waiting-queue order: fcfs (default) or priority (a request's 'priority', lower "
        "first, as vLLM's --scheduling-policy priority)",
    )


def scheduler_config_from(args: argparse.Namespace) -> SchedulerConfig:
    config = SchedulerConfig(
        kind=args.scheduler,
        token_budget=args.token_budget,
        chunk_size=args.chunk_size,
        max_num_seqs=args.max_num_seqs,
        max_partial_prefills=args.max_partial_prefills,
        max_context=args.max_context,
        scheduling_policy=SchedulingPolicy(args.scheduling_policy),
    )
    problems = config_problems(config)
    if problems:
        raise UsageError("; ".join(problems))
    return config


def run_sim(args: argparse.Namespace) -> int:
    import asyncio

    from laneway.simulator.kv_events import parse_kv_events_config
    from laneway.simulator.server import SimSettings, serve
    from laneway.tokens import HuggingFaceTokenizer

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    if not args.time_scale > 0:
        raise UsageError(f"--time-scale must be above 0, got {args.time_scale}")
    if not args.model.strip() or any(c.isspace() for c in args.model):
        raise UsageError(f"--model must be a name without spaces, got {args.model!r}")
    profile: Profile = PROFILES[args.profile]
    settings = SimSettings(
        model=args.model,
        profile=profile,
        scheduler=scheduler_config_from(args),
        metrics_flavor=MetricsFlavor(args.metrics_flavor),
        time_scale=args.time_scale,
        kv_events=parse_kv_events_config(args.kv_events_config)
        if args.kv_events_config is not None
        else None,
        responses_store=args.enable_responses_store,
    )
    if args.chat_template and not args.tokenizer:
        raise UsageError("--chat-template needs --tokenizer: the template's text is tokenized")
    tokenizer = HuggingFaceTokenizer(args.tokenizer, args.chat_template) if args.tokenizer else None
    asyncio.run(serve(settings, args.host, args.port, tokenizer))
    return 0
