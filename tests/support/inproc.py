"""Simulated engines and gateways served in the test's own event loop, on loopback.

The apps `laneway sim` and `laneway gateway` serve (their `create_app`), read from the same
command-line flags and config documents as the commands, behind aiohttp runners set up as
the commands set theirs up: a test of gateway or engine behaviour needs no process. Tests of
the commands themselves (their flags, signals, drain, a killed engine) start processes with
support.launch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from laneway.api import MetricsFlavor
from laneway.cli import build_parser
from laneway.gateway.app import create_app as create_gateway_app
from laneway.gateway.config import load_config
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.gateway.serving.protocol import listen
from laneway.gateway.state.shared import announce_listening, options_from_args
from laneway.simulator.cli import scheduler_config_from
from laneway.simulator.kv_events import parse_kv_events_config
from laneway.simulator.profiles import PROFILES
from laneway.simulator.server import SimSettings
from laneway.simulator.server import create_app as create_sim_app
from laneway.tokens import HuggingFaceTokenizer
from support.pools import gateway_doc, pool_doc

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Served:
    """One app listening on loopback."""

    url: str
    runner: web.AppRunner
    listener: asyncio.Server | None = None  # a gateway's; an engine listens on a TCPSite

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class Servers:
    """The apps one test serves; `close` stops those still running, last started first."""

    def __init__(self) -> None:
        self._running: list[Served] = []

    async def sim(self, model: str, *flags: str) -> Served:
        """What `laneway sim --model MODEL FLAGS` serves (on a free port unless `--port`)."""
        args = build_parser().parse_args(["sim", "--port", "0", "--model", model, *flags])
        settings = SimSettings(
            model=args.model,
            profile=PROFILES[args.profile],
            scheduler=scheduler_config_from(args),
            metrics_flavor=MetricsFlavor(args.metrics_flavor),
            time_scale=args.time_scale,
            kv_events=parse_kv_events_config(args.kv_events_config)
            if args.kv_events_config is not None
            else None,
            responses_store=args.enable_responses_store,
        )
        tokenizer = (
            HuggingFaceTokenizer(args.tokenizer, args.chat_template) if args.tokenizer else None
        )
        app = create_sim_app(settings, tokenizer)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        return await self._serve(args.port, runner)

    async def gateway(self, path: Path, documents: Sequence[dict[str, Any]], *flags: str) -> Served:
        """What `laneway gateway --config PATH FLAGS` serves, `documents` written to `path`."""
        await asyncio.to_thread(path.write_text, yaml.safe_dump_all(documents))
        args = build_parser().parse_args(["gateway", "--config", str(path), "--port", "0", *flags])
        loaded = load_config(args.config)
        app = create_gateway_app(
            loaded.settings, StaticPoolSource(loaded.pools), shared=options_from_args(args)
        )
        connections: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": loaded.settings.clients.idle_timeout_millis / 1000,
        }
        runner = web.AppRunner(
            app,
            handle_signals=False,
            handler_cancellation=True,  # as the command: a disconnect cancels the upstream call
            shutdown_timeout=loaded.settings.drain_timeout_millis / 1000,
            **connections,
        )
        await runner.setup()
        # As the command: the gateway's own protocol, which notes when each request arrives.
        listener = await listen(runner, LOOPBACK, args.port, connections)
        bound = listener.sockets[0].getsockname()[1]
        served = Served(url=f"http://{LOOPBACK}:{bound}", runner=runner, listener=listener)
        self._running.append(served)
        announce_listening(app, LOOPBACK, served.port)
        return served

    async def single_pool(
        self,
        tmp_path: Path,
        time_scale: str,
        name: str = "solo",
        limits: dict[str, Any] | None = None,
        **gateway_spec: Any,
    ) -> tuple[Served, Served]:
        """One engine, the only pool behind a gateway: (engine, gateway)."""
        engine = await self.sim("llama-small", "--time-scale", time_scale)
        gateway = await self.gateway(
            tmp_path / "gateway.yaml",
            [
                pool_doc(name, "interactive", "llama-small", [engine.url], limits=limits),
                gateway_doc(**gateway_spec),
            ],
        )
        return engine, gateway

    async def close(self) -> None:
        while self._running:
            served = self._running.pop()
            if served.listener is not None:
                served.listener.close()  # no new connections; cleanup drains the open ones
            await served.runner.cleanup()

    async def _serve(self, port: int, runner: web.AppRunner) -> Served:
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, port)
        await site.start()
        bound = runner.addresses[0][1]
        served = Served(url=f"http://{LOOPBACK}:{bound}", runner=runner)
        self._running.append(served)
        return served
