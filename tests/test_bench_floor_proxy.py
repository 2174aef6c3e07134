"""The floor proxy `bench gateway --against python-floor` measures
(bench/gateway/floor_proxy.py), and the peers `--against` takes by name.

Its figures mean something only if it does the routers' job: every request reaches an engine,
in turn, and every answer, whole or streamed, reaches the client intact. Real `laneway sim`
engines, the official openai client, over loopback.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.launch import start_sim

from laneway.bench.gateway import floor_proxy
from laneway.bench.gateway.peers import FLOOR, parse_peers
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.cli import main
from laneway.errors import UsageError

MODEL = "llama-small"
PROMPT = "the floor forwards what it is given " * 20


@pytest.fixture(scope="module")
def engines_and_floor() -> Iterator[tuple[list[ChildProcess], ChildProcess]]:
    with Children() as children:
        engines = [start_sim(children, MODEL, "--time-scale", "1000") for _ in range(2)]
        argv = floor_proxy.argv([e.url for e in engines])
        floor = children.start("floor", argv, floor_proxy.READY_LINE)
        yield engines, floor


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def prompt_tokens_served(engine: ChildProcess) -> float:
    with urllib.request.urlopen(engine.url + "/metrics", timeout=60) as answer:
        text = answer.read().decode()
    found = re.search(r"^vllm:prompt_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0  # the counter shows from its first request


def test_whole_answers_arrive_intact_and_engines_take_turns(
    engines_and_floor: tuple[list[ChildProcess], ChildProcess],
) -> None:
    engines, floor = engines_and_floor
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
    direct = client(engines[0].url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5
    )
    before = [prompt_tokens_served(engine) for engine in engines]
    answers = [
        client(floor.url).chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        for _ in range(4)
    ]
    after = [prompt_tokens_served(engine) for engine in engines]
    assert direct.usage is not None
    for answer in answers:
        assert answer.usage is not None
        assert answer.usage.prompt_tokens == direct.usage.prompt_tokens
        assert answer.usage.completion_tokens == 5
        assert answer.choices[0].message.content
    # Round robin: two requests each, every token of their prompts counted by the engine.
    served = [later - earlier for earlier, later in zip(before, after, strict=True)]
    assert served == [2 * direct.usage.prompt_tokens] * 2


def test_a_stream_arrives_chunk_by_chunk_to_its_end(
    engines_and_floor: tuple[list[ChildProcess], ChildProcess],
) -> None:
    _, floor = engines_and_floor
    stream = client(floor.url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert len(usage) == 1
    assert usage[0].completion_tokens == 12
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta]
    assert len([d for d in deltas if d]) == 12


def test_the_floor_is_a_peer_by_name() -> None:
    assert parse_peers(f"vllm-router, {FLOOR}") == ("vllm-router", FLOOR)
    with pytest.raises(UsageError, match="python-floor"):
        parse_peers("nginx")


def test_a_baseline_names_a_directory_laneway_is_installed_in(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="holds no laneway package"):
        parse_peers(f"laneway@{tmp_path}")
    gateway = tmp_path / "laneway" / "gateway"
    gateway.mkdir(parents=True)
    (gateway / "__init__.py").touch()
    assert parse_peers(f"laneway@{tmp_path},python-floor") == (f"laneway@{tmp_path}", FLOOR)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--against needs 2 CPUs")
@pytest.mark.parametrize("flag", ["--rounds", "--clients", "--requests"])
def test_against_refuses_no_rounds_clients_or_requests(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "gateway", "--against", FLOOR, flag, "0"]) == 2
    err = capsys.readouterr().err
    assert "--against needs a positive concurrency, number of requests and of rounds" in err
