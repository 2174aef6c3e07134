"""`laneway bench counts`: what counting with the gateway's default costs near a pool's edges.

The engine counts a chat with its model's tokenizer after rendering its chat template; the
gateway, unless a pool names them, counts with tiktoken's cl100k_base and OpenAI's framing
rule. Near a lane threshold or a context cap the difference decides where a prompt goes: a
prompt the engine counts just over a 4,096-token interactive cap that the gateway counts
just under it is sent to a pool that refuses it. This measures how often, on real text cut
into one-message chats whose engine count lies within 10 % either side of each edge:

- source: Python source files of the standard library the harness runs on;
- prose: the licence texts under /usr/share/common-licenses (Debian), and Python's own;
- synthetic: the common-word prompts the other benchmarks send (bench/harness/prompts.py).

Both counts go through the gateway's own counting (`ParsedRequest.count`), so the numbers
are the ones the gateway would route on with each tokenizer setting.
"""

from __future__ import annotations

import random
import statistics
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from laneway.bench.harness.prompts import PromptFactory
from laneway.gateway.serving.request_body import Endpoint, ParsedRequest, parse_request
from laneway.tables import format_table
from laneway.tokens import Tokenizer

NEAR_EDGE = 0.10  # prompts are drawn with engine counts within this share of the edge
LICENCES = Path("/usr/share/common-licenses")
# Characters of each corpus kept in memory to cut prompts from.
CORPUS_CHARS = 4_000_000


@dataclass(frozen=True)
class EdgeRow:
    corpus: str
    edge: int
    prompts: int
    # The miss, default - engine, in tokens: negative where the default undercounts.
    mean_miss: float
    p5_miss: float
    p95_miss: float
    largest_miss: int  # the largest |default - engine|
    misrouted: float  # share whose side of the edge differs between the two counts
    past_cap: float  # share the default puts within the edge that the engine counts over it


@dataclass(frozen=True)
class CountsReport:
    command: str
    engine_tokenizer: str
    framing: str  # what frames the engine's chats
    short_chat_framing: tuple[int, int]  # (default, engine) tokens of a one-word chat
    rows: tuple[EdgeRow, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def corpora(factory_rng: random.Random, factory: PromptFactory) -> dict[str, str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = {
        "source": _read_until(sorted(stdlib.glob("*.py")), CORPUS_CHARS),
        "prose": _read_until([*sorted(LICENCES.glob("*")), stdlib / "LICENSE.txt"], CORPUS_CHARS),
        "synthetic": factory.text(factory_rng, 200_000),
    }
    return {name: text for name, text in texts.items() if text}


def _read_until(paths: Sequence[Path], limit: int) -> str:
    parts: list[str] = []
    size = 0
    for path in paths:
        if size >= limit:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a directory, a symlink to nowhere, a file in another encoding
        parts.append(text)
        size += len(text)
    return "\n".join(parts)


def chat(text: str) -> ParsedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return parse_request(orjson.dumps(body), Endpoint.CHAT)


def measure_edge(
    name: str,
    corpus: str,
    edge: int,
    prompts: int,
    rng: random.Random,
    engine: Callable[[ParsedRequest], int],
    default: Callable[[ParsedRequest], int],
) -> EdgeRow:
    sample = corpus[:20_000]
    chars_per_token = len(sample) / max(engine(chat(sample)), 1)
    misses: list[int] = []
    misrouted = past_cap = 0
    for _ in range(prompts):
        length = int(edge * chars_per_token * rng.uniform(1 - NEAR_EDGE, 1 + NEAR_EDGE))
        start = rng.randrange(max(len(corpus) - length, 1))
        parsed = chat(corpus[start : start + length])
        theirs, ours = engine(parsed), default(parsed)
        misses.append(ours - theirs)
        misrouted += (ours <= edge) != (theirs <= edge)
        past_cap += ours <= edge < theirs
    cuts = statistics.quantiles(misses, n=20)
    return EdgeRow(
        corpus=name,
        edge=edge,
        prompts=prompts,
        mean_miss=statistics.fmean(misses),
        p5_miss=cuts[0],
        p95_miss=cuts[-1],
        largest_miss=max(abs(miss) for miss in misses),
        misrouted=misrouted / prompts,
        past_cap=past_cap / prompts,
    )


def run_bench(
    engine_tokenizer: Tokenizer,
    default_tokenizer: Tokenizer,
    edges: Sequence[int],
    prompts: int,
    seed: int,
    command: str,
) -> CountsReport:
    rng = random.Random(seed)
    factory = PromptFactory(default_tokenizer)
    texts = corpora(random.Random(seed), factory)

    def engine(parsed: ParsedRequest) -> int:
        return parsed.count(engine_tokenizer)

    def default(parsed: ParsedRequest) -> int:
        return parsed.count(default_tokenizer)

    rows = tuple(
        measure_edge(name, corpus, edge, prompts, rng, engine, default)
        for edge in edges
        for name, corpus in texts.items()
    )
    template = engine_tokenizer.chat_template
    short = chat("Hello")
    return CountsReport(
        command=command,
        engine_tokenizer=engine_tokenizer.name,
        framing=f"chat template of {template.path}" if template else "OpenAI's rule",
        short_chat_framing=(default(short), engine(short)),
        rows=rows,
    )


def render(report: CountsReport) -> list[str]:
    header = ("text", "edge", "prompts", "miss mean", "P5", "P95", "largest", "misrouted")
    rows = [
        (
            row.corpus,
            f"{row.edge:,}",
            str(row.prompts),
            f"{row.mean_miss:+.1f}",
            f"{row.p5_miss:+.1f}",
            f"{row.p95_miss:+.1f}",
            str(row.largest_miss),
            f"{row.misrouted:.1%} ({row.past_cap:.1%} past the edge)",
        )
        for row in report.rows
    ]
    default, engine = report.short_chat_framing
    return [
        f"cl100k_base with OpenAI's framing (the gateway's default) against "
        f"{report.engine_tokenizer} with {report.framing}",
        f"one-message chats within {NEAR_EDGE:.0%} of each edge; miss = default - engine, in "
        "tokens; misrouted: counted on the other side of the edge (past the edge: the "
        "default within it, the engine over it)",
        f"a one-word chat: {default} tokens by default, {engine} by the engine",
        "",
        *format_table(header, rows, rule=True),
    ]
