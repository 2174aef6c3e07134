"""Every typed key of the gateway's aiohttp application, in one place."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import aiohttp
from aiohttp import web

from laneway.gateway.config import GatewaySettings
from laneway.gateway.lifecycle import Stop
from laneway.gateway.metrics import GatewayMetrics
from laneway.gateway.picker import WeightedScorer
from laneway.gateway.registry import PoolRegistry
from laneway.gateway.state import LoadTracker
from laneway.tokens import Tokenizer

SETTINGS = web.AppKey("settings", GatewaySettings)
REGISTRY = web.AppKey("registry", PoolRegistry)
METRICS = web.AppKey("metrics", GatewayMetrics)
TRACKER = web.AppKey("tracker", LoadTracker)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
PROFILE: web.AppKey[tuple[WeightedScorer, ...]] = web.AppKey("profile")
RNG = web.AppKey("rng", random.Random)
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
SESSION = web.AppKey("session", aiohttp.ClientSession)
SHUTTING_DOWN = web.AppKey("shutting_down", asyncio.Event)  # set when draining begins
STOP = web.AppKey("stop", Stop)
