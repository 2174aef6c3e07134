"""The least a Python endpoint picker can do per request: the floor beside `envoy+laneway`.

`python -m laneway.bench.gateway.floor_picker --port P --worker-urls URL...` is an ext_proc
gRPC server on `grpc.aio`, as `laneway epp` is: it names the next engine in turn as
`x-gateway-destination-endpoint` in its answer to the request headers, and passes every
body chunk back unchanged in the full-duplex streamed mode, both ways. It parses nothing
and measures nothing, so Envoy plus this picker is what the protocol and Python's gRPC cost
per request, and laneway's picker's excess over it is laneway's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import AsyncIterator, Sequence

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from laneway.gateway.cli import event_loop_factory
from laneway.gateway.epp import protocol
from laneway.gateway.epp.server import EXT_PROC_SERVICE

READY_LINE = "floor picker: listening on "


class _Floor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, worker_urls: Sequence[str]) -> None:
        self._next = itertools.cycle([protocol.address_of(url) for url in worker_urls])

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ext.ProcessingResponse]:
        async for message in requests:
            kind = message.WhichOneof("request")
            if kind == "request_headers":
                yield protocol.routed_headers(
                    addresses=[next(self._next)], headers={}, body_bytes=None
                )
            elif kind == "request_body":
                body = message.request_body
                yield protocol.request_body_chunk(body.body, body.end_of_stream)
            elif kind == "response_headers":
                yield protocol.response_headers({})
            elif kind == "response_body":
                body = message.response_body
                yield protocol.response_body_chunk(body.body, body.end_of_stream, streamed=True)
            elif kind == "request_trailers":
                yield protocol.trailers_continue(response=False)
            elif kind == "response_trailers":
                yield protocol.trailers_continue(response=True)


def argv(worker_urls: Sequence[str], port: int) -> list[str]:
    """The command that starts this picker for `worker_urls`, by this Python."""
    module = [sys.executable, "-P", "-m", "laneway.bench.gateway.floor_picker"]
    return [*module, "--port", str(port), "--worker-urls", *worker_urls]


async def serve(host: str, port: int, worker_urls: Sequence[str]) -> None:
    server = grpc.aio.server()
    ext_grpc.add_ExternalProcessorServicer_to_server(_Floor(worker_urls), server)
    # The health Envoy checks a picker's cluster with (bench/harness/envoy.py): off the
    # request path, so the floor's cost per request is unchanged.
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await health.set(EXT_PROC_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"{READY_LINE}grpc://{host}:{bound}", flush=True)
    await server.wait_for_termination()


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m laneway.bench.gateway.floor_picker")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    parsed = parser.parse_args(args)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(parsed.host, parsed.port, parsed.worker_urls))


if __name__ == "__main__":
    main()
