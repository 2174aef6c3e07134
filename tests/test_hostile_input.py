"""Hostile input on every endpoint: a 4xx in OpenAI's shape, never a 5xx, and a live gateway.

Hypothesis generates the bodies, headers, uploads and ids; one real `laneway gateway` with a
`laneway sim` engine and a real Redis answers them over loopback. Valid requests may reach
the engine and get a 200; nothing may get a 5xx, and /healthz must answer after each one.
"""

from __future__ import annotations

import gzip
import http.client
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.launch import start_gateway, start_sim
from support.pools import pool_doc

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.redis_server import LocalRedis

MODEL = "llama"
EXAMPLES = settings(
    max_examples=60,
    deadline=None,  # a loaded machine is slow; speed is not what these tests check
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same examples on every run: a failure is reproducible
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChildProcess]:
    with LocalRedis() as redis, Children() as children:
        engine = start_sim(children, "llama-small", "--time-scale", "1000", "--max-context", "2048")
        pool = pool_doc(
            "solo", "interactive", "llama-small", [engine.url], limits={"maxContextTokens": 2048}
        )
        config = tmp_path_factory.mktemp("hostile") / "gateway.yaml"
        yield start_gateway(children, config, [pool], "--redis-url", redis.url)


def send(
    gateway: ChildProcess,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, bytes | str] | None = None,
) -> tuple[int, bytes]:
    parsed = urllib.parse.urlsplit(gateway.url)
    connection = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=120)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def assert_answered_well(gateway: ChildProcess, status: int, body: bytes) -> None:
    assert status < 500, body[:500]
    if status >= 400:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert error["type"] == "invalid_request_error" or status in (401, 404, 429)
        assert isinstance(error["code"], str)
    assert send(gateway, "GET", "/healthz")[0] == 200


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
messages = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_calls", "tool_call_id"]),
        json_values | st.sampled_from(["user", "assistant", "hi"]),
    )
    | json_values,
    max_size=3,
)
request_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "", "unknown"]) | json_values,
        "messages": messages | json_values,
        "prompt": st.lists(st.text(max_size=10) | st.integers(), max_size=3) | json_values,
        "max_tokens": st.integers(min_value=-5, max_value=2**70) | json_values,
        "n": st.integers(min_value=-1, max_value=3) | json_values,
        "stream": st.booleans() | json_values,
        "tools": json_values,
        "suffix": json_values,
        "input_file_id": st.text(max_size=40) | json_values,
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/completions"]) | json_values,
    },
)
# Raw bytes that break the parser rather than the schema.
raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b'{"model": [' * n),
    st.integers(min_value=4300, max_value=50_000).map(
        lambda n: b'{"model": "llama", "max_tokens": ' + b"9" * n + b"}"
    ),
    st.just(b'{"model": "llama", "messages": [{"role": "user", "content": "\\ud800"}]}'),
)
POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/batches"]


@EXAMPLES
@given(path=st.sampled_from(POSTS), payload=request_bodies)
def test_hostile_json_bodies(gateway: ChildProcess, path: str, payload: object) -> None:
    body = json.dumps(payload).encode()
    status, answer = send(gateway, "POST", path, body, {"Content-Type": "application/json"})
    assert_answered_well(gateway, status, answer)


@EXAMPLES
@given(path=st.sampled_from(POSTS), body=raw_bodies)
def test_hostile_raw_bodies(gateway: ChildProcess, path: str, body: bytes) -> None:
    status, answer = send(gateway, "POST", path, body, {"Content-Type": "application/json"})
    assert_answered_well(gateway, status, answer)


# What HTTP allows in a field value (visible ASCII, and any byte above 0x7F) that a client
# may send; the HTTP parser refuses the rest before the gateway sees the request.
header_values = st.binary(min_size=1, max_size=40).filter(
    lambda value: all(0x21 <= byte <= 0x7E or byte >= 0x80 for byte in value)
)


@EXAMPLES
@given(
    path=st.sampled_from([*POSTS, "/v1/files", "/v1/batches?limit=3"]),
    name=st.sampled_from(
        ["x-laneway-internal", "x-laneway-lane", "authorization", "x-laneway-tenant"]
    ),
    value=header_values,
    gzipped=st.booleans(),
    body=st.binary(max_size=64),
)
def test_hostile_headers(
    gateway: ChildProcess, path: str, name: str, value: bytes, gzipped: bool, body: bytes
) -> None:
    headers: dict[str, bytes | str] = {name: value, "Content-Type": "application/json"}
    if gzipped:
        # Claims gzip; half the time it is, half the time it is not.
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body) if body[:1] == b"a" else body
    status, answer = send(gateway, "POST", path, body, headers)
    assert_answered_well(gateway, status, answer)


part_texts = st.binary(max_size=40)


@EXAMPLES
@given(
    boundary=st.sampled_from([b"b0undary", b""]) | st.binary(max_size=20),
    declared=st.sampled_from(["b0undary", "", "other"]),
    purpose=part_texts | st.just(b"batch") | st.just(b"\xff\xfe"),
    content=part_texts,
    cut=st.integers(min_value=0, max_value=400),
)
def test_hostile_uploads(
    gateway: ChildProcess, boundary: bytes, declared: str, purpose: bytes, content: bytes, cut: int
) -> None:
    body = (
        b"--"
        + boundary
        + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
        + purpose
        + b"\r\n--"
        + boundary
        + b'\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
        + content
        + b"\r\n--"
        + boundary
        + b"--\r\n"
    )[: cut or None]
    content_type = "multipart/form-data" + (f"; boundary={declared}" if declared else "")
    status, answer = send(gateway, "POST", "/v1/files", body, {"Content-Type": content_type})
    assert_answered_well(gateway, status, answer)


@EXAMPLES
@given(
    template=st.sampled_from(
        [
            ("GET", "/v1/files/{}"),
            ("GET", "/v1/files/{}/content"),
            ("DELETE", "/v1/files/{}"),
            ("GET", "/v1/batches/{}"),
            ("POST", "/v1/batches/{}/cancel"),
            ("GET", "/v1/files?after={}"),
            ("GET", "/v1/batches?after={}"),
        ]
    ),
    ident=st.text(min_size=1, max_size=30),
)
def test_hostile_ids(gateway: ChildProcess, template: tuple[str, str], ident: str) -> None:
    method, path = template
    quoted = urllib.parse.quote(ident.encode("utf-8", "surrogatepass"), safe="")
    status, answer = send(gateway, method, path.format(quoted))
    assert_answered_well(gateway, status, answer)
    assert status in (400, 404)


def test_a_bad_batch_line_lands_in_the_error_file_and_the_rest_runs(
    gateway: ChildProcess, tmp_path: Path
) -> None:
    good = {
        "custom_id": "good",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    }
    lines = [
        json.dumps(good),
        '{"custom_id": "deep", "body": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"custom_id": "\\ud800", "method": "POST", "url": "/v1/chat/completions", "body": {}}',
        '{"custom_id": "big", "n": ' + "9" * 5000 + "}",
    ]
    boundary = "b0undary"
    upload = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "\r\n" + "\n".join(lines) + f"\r\n--{boundary}--\r\n"
    ).encode()
    status, answer = send(
        gateway,
        "POST",
        "/v1/files",
        upload,
        {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert status == 200, answer
    file_id = json.loads(answer)["id"]
    create = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    status, answer = send(gateway, "POST", "/v1/batches", json.dumps(create).encode())
    assert status == 200, answer
    batch = json.loads(answer)
    while batch["status"] not in ("completed", "failed"):
        batch = json.loads(send(gateway, "GET", f"/v1/batches/{batch['id']}")[1])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    errors = send(gateway, "GET", f"/v1/files/{batch['error_file_id']}/content")[1]
    codes = sorted(json.loads(line)["error"]["code"] for line in errors.splitlines())
    assert codes == ["invalid_custom_id", "invalid_json", "invalid_json"]


def test_metrics_never_count_a_request_without_a_status(gateway: ChildProcess) -> None:
    send(gateway, "POST", "/v1/completions", b"[" * 100_000)
    status, text = send(gateway, "GET", "/metrics")
    assert status == 200
    statuses = {
        sample.labels["status"]
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.name == "laneway_gateway_requests_total"
    }
    assert "400" in statuses
    assert not statuses & {"0", "500"}
