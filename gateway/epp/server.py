"""`laneway epp`: the gateway's cores behind Envoy's ext_proc gRPC service.

The gateway's app is built and started as `laneway gateway` starts it (pools from the same
config, the ledger, scraping, probing, tokenizers) but serves no HTTP API: Envoy relays the
traffic and asks here, per request, where it goes (`stream.PickerStream`). The gRPC server
also answers the standard health service for `liveness`, `readiness` and the ext_proc
service's own name, as the protocol names them; /metrics, /healthz and /readyz are on
--metrics-port.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from laneway.gateway.epp.objectives import NO_OBJECTIVES, ObjectivePriorities
from laneway.gateway.epp.stream import PickerStream
from laneway.gateway.epp.tenancy import Identify, PickerCallers
from laneway.gateway.keys import LEDGER, REQUEST_PATH, SHUTTING_DOWN
from laneway.gateway.serving.context import RequestPath

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
# How often readiness follows the ledger (a pool with an available endpoint).
READINESS_EVERY_S = 0.5
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ExternalProcessor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self, path: RequestPath, identify: Identify, objectives: ObjectivePriorities
    ) -> None:
        self._path = path
        self._identify = identify
        self._objectives = objectives

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ext.ProcessingResponse]:
        # grpc takes an async generator function only: this one re-yields the stream's.
        async for answer in PickerStream(self._path, self._identify, self._objectives).run(
            requests
        ):
            yield answer


async def follow_readiness(app: web.Application, health: HealthServicer) -> None:
    """Ready while some pool has an available endpoint and the picker is not draining."""
    ready: bool | None = None
    while True:
        now = app[LEDGER].ready() and not app[SHUTTING_DOWN].is_set()
        if now != ready:
            status = SERVING if now else NOT_SERVING
            for service in (READINESS, EXT_PROC_SERVICE, ""):
                await health.set(service, status)
            ready = now
        await asyncio.sleep(READINESS_EVERY_S)


async def start_grpc(
    app: web.Application,
    host: str,
    port: int,
    *,
    trust_fairness_id: bool = False,
    objectives: ObjectivePriorities = NO_OBJECTIVES,
) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """The picker's gRPC server, started on `host:port` (0: a free port); the bound port.
    `trust_fairness_id`: the fairness id header names the tenant (`tenancy.py`);
    `objectives`: the InferenceObjectives' priorities (`objectives.py`)."""
    server = grpc.aio.server()
    identify = PickerCallers(app, trust_fairness_id=trust_fairness_id)
    processor = ExternalProcessor(app[REQUEST_PATH], identify, objectives)
    ext_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await health.set(LIVENESS, SERVING)
    for service in (READINESS, EXT_PROC_SERVICE, ""):
        await health.set(service, NOT_SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    return server, health, bound
