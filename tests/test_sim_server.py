"""`laneway sim` as a real subprocess over loopback, driven by the official openai client."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fleet import wait_for

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.prompt_ids import chat_token_ids
from laneway.simulator.scheduler import KV_BLOCK_TOKENS
from laneway.tokens import ChatMessage, count_chat, default_tokenizer

MODEL = "sim-test-model"


@pytest.fixture(scope="module")
def children() -> Iterator[Children]:
    with Children() as started:
        yield started


@pytest.fixture(scope="module")
def vllm_sim(children: Children) -> ChildProcess:
    # h200 timing at 20x: a 32-token answer takes a few ms of wall time per step.
    args = ["--port", "0", "--model", MODEL, "--time-scale", "20", "--max-context", "4096"]
    return children.start_laneway("sim", args, name="vllm-flavored sim")


@pytest.fixture(scope="module")
def sglang_sim(children: Children) -> ChildProcess:
    args = ["--port", "0", "--model", MODEL, "--profile", "zero", "--metrics-flavor", "sglang"]
    return children.start_laneway("sim", args, name="sglang-flavored sim")


@pytest.fixture(scope="module")
def vllm_client(vllm_sim: ChildProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{vllm_sim.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def sglang_client(sglang_sim: ChildProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sglang_sim.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def scrape(sim: ChildProcess) -> dict[str, float]:
    """Every sample on /metrics, keyed by name (labels dropped: one engine, one model)."""
    with urllib.request.urlopen(f"{sim.url}/metrics") as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def post_raw(sim: ChildProcess, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{sim.url}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_completion_counts_prompt_with_the_shared_tokenizer(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    prompt = "Summarize the contract clauses about termination and renewal."
    completion = vllm_client.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == default_tokenizer().count(prompt)
    assert completion.usage.completion_tokens == 7
    assert completion.choices[0].finish_reason == "length"
    assert len(completion.choices[0].text.split()) == 7


def test_chat_stream_delivers_every_token_then_usage(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    stream = vllm_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Where is my order?"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    contents: list[str] = []
    finish_reasons: list[str | None] = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                contents.append(choice.delta.content)
            finish_reasons.append(choice.finish_reason)
    assert len(contents) == 12
    assert finish_reasons[-1] == "length"
    assert usage is not None
    assert usage.completion_tokens == 12


def test_usage_reports_the_prompt_tokens_found_in_the_prefix_cache(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    """vLLM-shaped, as with --enable-prompt-tokens-details: 0 the first time, the prompt's
    full blocks once they are cached (never all of it: its last token is computed), in a
    whole answer and in a stream's usage chunk alike."""
    prompt = "The shipment cleared customs at the border on Tuesday morning. " * 40
    first = vllm_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    again = vllm_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    streamed = vllm_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    stream_usage = [chunk.usage for chunk in streamed if chunk.usage is not None]
    counted = [first.usage, again.usage, *stream_usage]
    assert all(usage is not None and usage.prompt_tokens_details for usage in counted)
    cached = [u.prompt_tokens_details.cached_tokens for u in counted]  # type: ignore[union-attr]
    assert first.usage is not None
    full_blocks = (first.usage.prompt_tokens - 1) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
    assert full_blocks > 0
    assert cached == [0, full_blocks, full_blocks]


def test_chat_without_stream_returns_one_message(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    reply = vllm_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content is not None
    assert len(reply.choices[0].message.content.split()) == 3


def test_completion_stream_ends_with_done(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    request = urllib.request.Request(
        f"{vllm_sim.url}/v1/completions",
        data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = [line.decode().strip() for line in response if line.strip()]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


def test_prompt_over_the_context_cap_gets_vllms_400(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        vllm_client.completions.create(model=MODEL, prompt=[1] * 4000, max_tokens=200)
    assert raised.value.status_code == 400
    assert "maximum context length is 4096 tokens" in str(raised.value)
    assert "4200 tokens" in str(raised.value)


def test_unknown_model_is_404(vllm_sim: ChildProcess, vllm_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        vllm_client.completions.create(model="other", prompt="x", max_tokens=1)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"model": MODEL, "prompt": 5}).encode(), "'prompt'"),
        (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "9"}).encode(), "max_tokens"),
        (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"model": MODEL, "prompt": "x", "stream": "yes"}).encode(), "'stream'"),
        (json.dumps({"model": MODEL, "prompt": "x", "n": 2}).encode(), "'n'"),
    ],
)
def test_bad_bodies_get_openai_shaped_400s(
    vllm_sim: ChildProcess, body: bytes, fragment: str
) -> None:
    status, payload = post_raw(vllm_sim, "/v1/completions", body)
    assert status == 400
    error = payload["error"]
    assert isinstance(error, dict)
    assert fragment in error["message"]
    assert error["code"] == 400


def test_bad_chat_messages_get_400(vllm_sim: ChildProcess, vllm_client: openai.OpenAI) -> None:
    for messages in ([], [{"content": "no role"}], [{"role": "user", "content": 7}]):
        body = json.dumps({"model": MODEL, "messages": messages}).encode()
        status, payload = post_raw(vllm_sim, "/v1/chat/completions", body)
        assert status == 400, messages
        assert "messages" in json.dumps(payload)


def test_models_and_health(vllm_sim: ChildProcess, vllm_client: openai.OpenAI) -> None:
    listed = vllm_client.models.list()
    assert [model.id for model in listed.data] == [MODEL]
    with urllib.request.urlopen(f"{vllm_sim.url}/health") as response:
        assert response.status == 200


def test_vllm_metrics_count_what_was_served(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    before = scrape(vllm_sim)
    vllm_client.completions.create(model=MODEL, prompt=[7] * 100, max_tokens=5)
    after = scrape(vllm_sim)
    assert after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0) == 100
    generated = after["vllm:generation_tokens_total"] - before.get(
        "vllm:generation_tokens_total", 0
    )
    assert generated == 5
    # vLLM's tokens-per-step histogram, counted as vLLM does: the step of the first token
    # counts it and the whole prompt, then each step its one token.
    steps = "vllm:iteration_tokens_total"
    assert after[f"{steps}_count"] - before.get(f"{steps}_count", 0) == 5
    assert after[f"{steps}_sum"] - before.get(f"{steps}_sum", 0) == 100 + 5
    assert after["vllm:time_to_first_token_seconds_count"] >= 1
    assert after["vllm:inter_token_latency_seconds_count"] >= 4
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1


def test_sglang_flavor_uses_sglang_names(
    sglang_sim: ChildProcess, sglang_client: openai.OpenAI
) -> None:
    sglang_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    samples = scrape(sglang_sim)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert name in samples
    assert samples["sglang:generation_tokens_total"] == 4
    assert not any(name.startswith("vllm:") for name in samples)


def _system_prompt(topic: str) -> str:
    return " ".join(f"{topic} policy clause {i} applies to every order." for i in range(120))


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_chat_token_ids_are_what_count_chat_counts() -> None:
    tokenizer = default_tokenizer()
    messages = [ChatMessage("system", _system_prompt("refund")), ChatMessage("user", "Hi?")]
    ids = chat_token_ids(tokenizer, messages)
    assert len(ids) == count_chat(tokenizer, messages)
    longer = chat_token_ids(tokenizer, [*messages, ChatMessage("assistant", "Hello.")])
    assert _common_prefix(ids, longer) >= len(ids) - 3  # all but the reply priming


def test_a_repeated_prefix_skips_prefill_and_vllm_counts_it(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    tokenizer = default_tokenizer()
    system = _system_prompt("shipping")
    questions = ["Where is my parcel?", "Can I change the address?"]
    turns = [[ChatMessage("system", system), ChatMessage("user", q)] for q in questions]
    deltas = []
    for question in questions:
        before = scrape(vllm_sim)
        vllm_client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            max_tokens=2,
        )
        after = scrape(vllm_sim)
        deltas.append(
            {
                name: after[name] - before.get(name, 0.0)
                for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
            }
        )
    first, second = (chat_token_ids(tokenizer, messages) for messages in turns)
    # Queries count every prompt token; hits the whole 16-token blocks the prompts share.
    assert deltas[0]["vllm:prefix_cache_queries_total"] == len(first)
    assert deltas[0]["vllm:prefix_cache_hits_total"] == 0
    assert deltas[1]["vllm:prefix_cache_queries_total"] == len(second)
    shared_blocks = _common_prefix(first, second) // 16
    assert shared_blocks > 50
    assert deltas[1]["vllm:prefix_cache_hits_total"] == shared_blocks * 16


def test_sglang_flavor_reports_the_latest_batchs_cache_hit_rate(
    sglang_sim: ChildProcess, sglang_client: openai.OpenAI
) -> None:
    prompt = _system_prompt("warranty")
    for _ in range(2):
        sglang_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    tokens = default_tokenizer().count(prompt)
    # The whole prompt is cached but its last token is always recomputed (vLLM and SGLang).
    expected = (tokens - 1) // 16 * 16 / tokens
    assert scrape(sglang_sim)["sglang:cache_hit_rate"] == pytest.approx(expected)
    assert "vllm:prefix_cache_hits_total" not in scrape(sglang_sim)


def test_bad_flags_exit_2_with_one_line() -> None:
    for flags in (
        ["--chunk-size", "4096", "--token-budget", "2048"],
        ["--time-scale", "0"],
        ["--port", "70000"],
        ["--profile", "a100-nonexistent"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "laneway.cli", "sim", *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, flags
        assert "Traceback" not in result.stderr
        assert "error:" in result.stderr.splitlines()[-1]


def test_a_client_that_leaves_mid_stream_frees_the_engine(
    vllm_sim: ChildProcess, vllm_client: openai.OpenAI
) -> None:
    before = scrape(vllm_sim)["vllm:generation_tokens_total"]
    stream = vllm_client.completions.create(
        model=MODEL, prompt="tell me everything", max_tokens=4000, stream=True
    )
    for received, _ in enumerate(stream):
        if received == 3:
            break
    stream.close()
    for _ in range(200):
        samples = scrape(vllm_sim)
        if samples["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert samples["vllm:num_requests_running"] == 0
    assert samples["vllm:generation_tokens_total"] - before < 4000


def test_the_chat_role_chunk_waits_for_the_first_token(children: Children) -> None:
    # At 1/100 of real time one engine step lasts about half a second of wall time, so a
    # role chunk sent on arrival (not with the first output, as vLLM and SGLang send it)
    # would reach us long before the engine counts its first token.
    args = ["--port", "0", "--model", MODEL, "--time-scale", "0.01", "--max-context", "4096"]
    slow = children.start_laneway("sim", args, name="slow sim")
    before = scrape(slow).get("vllm:time_to_first_token_seconds_count", 0.0)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{slow.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        events = (line[5:].strip() for line in response if line.startswith(b"data:"))
        first = json.loads(next(events))
        after_first_event = scrape(slow)["vllm:time_to_first_token_seconds_count"]
        rest = [json.loads(event) for event in events if event != b"[DONE]"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert after_first_event == before + 1
    assert [event["choices"][0]["delta"]["content"] for event in rest] == [" lorem", " ipsum"]


def test_a_priority_on_a_fcfs_engine_gets_vllms_400(vllm_sim: ChildProcess) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "priority": 1}
    status, payload = post_raw(vllm_sim, "/v1/completions", json.dumps(body).encode())
    assert status == 400
    assert "Got priority 1 but Priority scheduling is not enabled." in json.dumps(payload)
    body["priority"] = "high"
    status, payload = post_raw(vllm_sim, "/v1/completions", json.dumps(body).encode())
    assert status == 400
    assert "'priority' must be an integer" in json.dumps(payload)


def test_priority_scheduling_admits_the_more_urgent_waiting_request_first(
    children: Children,
) -> None:
    # One seat: a long request holds it while two others queue behind it; when it leaves,
    # the lower priority value is admitted first and finishes first.
    args = ["--port", "0", "--model", MODEL, "--max-num-seqs", "1", "--token-budget", "1024",
            "--chunk-size", "1024", "--scheduling-policy", "priority"]  # fmt: skip
    sim = children.start_laneway("sim", args, name="priority sim")
    finished: list[str] = []
    with openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0) as client:
        holder = client.completions.create(
            model=MODEL, prompt="hold the seat", max_tokens=4000, stream=True
        )
        next(iter(holder))  # running now

        def ask(name: str, priority: int) -> None:
            client.completions.create(
                model=MODEL, prompt=name, max_tokens=8, extra_body={"priority": priority}
            )
            finished.append(name)

        threads = [
            threading.Thread(target=ask, args=("batch", 1)),
            threading.Thread(target=ask, args=("chat", 0)),
        ]
        threads[0].start()
        wait_for("one queued", lambda: scrape(sim)["vllm:num_requests_waiting"] == 1)
        threads[1].start()
        wait_for("two queued", lambda: scrape(sim)["vllm:num_requests_waiting"] == 2)
        holder.close()  # the engine aborts it and frees the seat
        for thread in threads:
            thread.join(timeout=120)
    assert finished == ["chat", "batch"]
