"""The least a Python endpoint picker can do per request: the floors beside `envoy+laneway`.

`python -m laneway.bench.gateway.floor_picker --port P --worker-urls URL... [--server S]` is
an ext_proc gRPC server, on `grpc.aio` as `laneway epp` is (`--server aio`, the default) or
on grpcio's thread-pool server (`--server threads`): it names the next engine in turn as
`x-gateway-destination-endpoint` in its answer to the request headers, and passes every
body chunk back unchanged in the full-duplex streamed mode, both ways. It parses nothing
and measures nothing, so Envoy plus this picker is what the protocol and Python's gRPC cost
per request on that server, and laneway's picker's excess over the cheaper of the two is
laneway's own work and its choice of server.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent import futures

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from laneway.gateway.cli import event_loop_factory
from laneway.gateway.epp import protocol
from laneway.gateway.epp.server import EXT_PROC_SERVICE

READY_LINE = "floor picker: listening on "
AIO = "aio"
THREADS = "threads"
SERVERS = (AIO, THREADS)
# Each open ext_proc stream holds one of the thread-pool server's threads for the whole
# request: room for the bench's clients and Envoy's health checks with some to spare.
THREAD_POOL_WORKERS = 256


def _answer(
    message: ext.ProcessingRequest, next_address: Callable[[], str]
) -> ext.ProcessingResponse | None:
    """The pass-through answer to one message, the same on either server."""
    kind = message.WhichOneof("request")
    if kind == "request_headers":
        return protocol.routed_headers(addresses=[next_address()], headers={}, body_bytes=None)
    if kind == "request_body":
        body = message.request_body
        return protocol.request_body_chunk(body.body, body.end_of_stream)
    if kind == "response_headers":
        return protocol.response_headers({})
    if kind == "response_body":
        body = message.response_body
        return protocol.response_body_chunk(body.body, body.end_of_stream, streamed=True)
    if kind == "request_trailers":
        return protocol.trailers_continue(response=False)
    if kind == "response_trailers":
        return protocol.trailers_continue(response=True)
    return None


class _Turns:
    """The engines' addresses in turn, safe to take from the thread-pool server's threads."""

    def __init__(self, worker_urls: Sequence[str]) -> None:
        self._cycle = itertools.cycle([protocol.address_of(url) for url in worker_urls])
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            return next(self._cycle)


class _AsyncFloor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, turns: _Turns) -> None:
        self._turns = turns

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ext.ProcessingResponse]:
        async for message in requests:
            answer = _answer(message, self._turns)
            if answer is not None:
                yield answer


class _ThreadFloor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, turns: _Turns) -> None:
        self._turns = turns

    def Process(
        self, requests: Iterable[ext.ProcessingRequest], context: grpc.ServicerContext
    ) -> Iterator[ext.ProcessingResponse]:
        for message in requests:
            answer = _answer(message, self._turns)
            if answer is not None:
                yield answer


def argv(worker_urls: Sequence[str], port: int, server: str = AIO) -> list[str]:
    """The command that starts this picker for `worker_urls` on `server`, by this Python."""
    module = [sys.executable, "-P", "-m", "laneway.bench.gateway.floor_picker"]
    return [*module, "--port", str(port), "--server", server, "--worker-urls", *worker_urls]


async def serve_aio(host: str, port: int, worker_urls: Sequence[str]) -> None:
    server = grpc.aio.server()
    ext_grpc.add_ExternalProcessorServicer_to_server(_AsyncFloor(_Turns(worker_urls)), server)
    # The health Envoy checks a picker's cluster with (bench/harness/envoy.py): off the
    # request path, so the floor's cost per request is unchanged.
    checks = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set(EXT_PROC_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"{READY_LINE}grpc://{host}:{bound}", flush=True)
    await server.wait_for_termination()


def serve_threads(host: str, port: int, worker_urls: Sequence[str]) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=THREAD_POOL_WORKERS))
    ext_grpc.add_ExternalProcessorServicer_to_server(_ThreadFloor(_Turns(worker_urls)), server)
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    checks.set(EXT_PROC_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    print(f"{READY_LINE}grpc://{host}:{bound}", flush=True)
    server.wait_for_termination()


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m laneway.bench.gateway.floor_picker")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--server", choices=SERVERS, default=AIO)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    parsed = parser.parse_args(args)
    if parsed.server == THREADS:
        serve_threads(parsed.host, parsed.port, parsed.worker_urls)
        return
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve_aio(parsed.host, parsed.port, parsed.worker_urls))


if __name__ == "__main__":
    main()
