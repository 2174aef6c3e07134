"""Background loops: scrape every endpoint's /metrics, and probe ejected endpoints' /health."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import aiohttp

from laneway.gateway.config import GatewaySettings
from laneway.ledger import Ledger, Wakes
from laneway.routing.engine_metrics import EngineMetricsError, parse_engine_metrics


async def scrape_forever(
    ledger: Ledger,
    session: aiohttp.ClientSession,
    settings: GatewaySettings,
    clock: Callable[[], float],
    wake: Callable[[Wakes], None],
) -> None:
    """Scrape every endpoint once per interval, forever, into the ledger (which forgets an
    engine's prefixes when its prefix counter went back, where the settings say so, and
    admits the documents a fed batch replica's KV room now takes: `wake`).

    A round's scrapes start spread over the interval, not all at once: each answer is read
    and parsed on the event loop, so answers landing together would hold the loop, and every
    stream relayed on it, for one parse times the number of endpoints."""
    timeout = aiohttp.ClientTimeout(total=settings.scrape.timeout_millis / 1000)
    interval_s = settings.scrape.interval_millis / 1000
    while True:
        urls = [url for url in ledger.endpoints() if url not in ledger.ejected()]
        if not urls:
            await asyncio.sleep(interval_s)
            continue
        async with asyncio.TaskGroup() as scrapes:
            for url in urls:
                scrapes.create_task(_scrape(ledger, session, url, timeout, clock, wake))
                await asyncio.sleep(interval_s / len(urls))


async def _scrape(
    ledger: Ledger,
    session: aiohttp.ClientSession,
    url: str,
    limits: aiohttp.ClientTimeout,
    clock: Callable[[], float],
    wake: Callable[[Wakes], None],
) -> None:
    # A failed scrape only lets the last sample go stale; live requests decide ejection.
    try:
        async with session.get(f"{url}/metrics", timeout=limits) as response:
            if response.status != 200:
                return
            text = await response.text()
        wake(ledger.record_scrape(url, clock(), parse_engine_metrics(text)).wakes)
    except (aiohttp.ClientError, TimeoutError, EngineMetricsError, UnicodeDecodeError):
        return


async def probe_forever(
    ledger: Ledger,
    session: aiohttp.ClientSession,
    settings: GatewaySettings,
    clock: Callable[[], float],
    wake: Callable[[Wakes], None],
) -> None:
    """Probe the ejected endpoints' /health; one that passes is available again, and the
    slots it brings may admit requests waiting in line (`wake`)."""
    timeout = aiohttp.ClientTimeout(total=settings.upstream.health_timeout_millis / 1000)
    while True:
        await asyncio.sleep(settings.health.check_interval_millis / 1000)
        ejected = ledger.ejected()
        results = await asyncio.gather(*(probe_health(session, url, timeout) for url in ejected))
        for url, passed in zip(ejected, results, strict=True):
            wake(ledger.record_probe(url, clock(), passed))
            if passed:
                print(
                    f"laneway gateway: endpoint {url} passed /health, re-admitted", file=sys.stderr
                )


async def probe_health(
    session: aiohttp.ClientSession, url: str, limits: aiohttp.ClientTimeout
) -> bool:
    try:
        async with session.get(f"{url}/health", timeout=limits) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
