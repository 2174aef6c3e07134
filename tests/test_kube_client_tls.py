"""KubeApi over TLS, as it talks to a real API server: a watch cancelled mid-stream (a
watcher stopping) and the client closed leave no socket open once the loop is gone. On
Python before 3.12.8 asyncio left the TLS connection's socket to the garbage collector,
whose ResourceWarning is an error in this suite wherever it lands.

The server is another process (a TLS server in the client's own loop would be shut down
with it), streaming watch events over HTTPS with the test PKI's serving certificate."""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kube.pki import make_pki
from support.kube.processes import eventually, free_port

from laneway.kube.client import ApiUnreachable, KubeApi

SERVER = """
import asyncio, ssl, sys
from aiohttp import web

async def watch(request):
    response = web.StreamResponse()
    await response.prepare(request)
    while True:
        await response.write(b'{"type": "BOOKMARK", "object": {"metadata": {}}}\\n')
        await asyncio.sleep(0.05)

app = web.Application()
app.router.add_get("/{tail:.*}", watch)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(sys.argv[1], sys.argv[2])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[3]), ssl_context=context, print=None)
"""


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    pki = tmp_path / "pki"
    make_pki(pki)
    port = free_port()
    argv = [sys.executable, "-c", SERVER, str(pki / "apiserver.crt"), str(pki / "apiserver.key")]
    server = subprocess.Popen([*argv, str(port)])
    try:
        yield f"https://127.0.0.1:{port}", pki / "ca.crt"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_cancelled_watch_over_tls_leaves_no_socket_open(tls_server: tuple[str, Path]) -> None:
    url, ca = tls_server

    async def watch_then_stop() -> None:
        api = KubeApi(url, ssl_context=ssl.create_default_context(cafile=str(ca)))
        heard = asyncio.Event()

        async def watch() -> None:
            async for _ in api.watch("InferencePool", "default", "1"):
                heard.set()

        task = asyncio.create_task(watch())
        waiting = asyncio.create_task(heard.wait())
        try:
            await asyncio.wait({task, waiting}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()  # ApiUnreachable while the server is not up yet
            assert heard.is_set(), "no watch event in 60 s"
        finally:
            for running in (task, waiting):
                running.cancel()
            await asyncio.gather(task, waiting, return_exceptions=True)
            await api.close()

    def listening() -> bool:
        try:
            asyncio.run(watch_then_stop())
        except ApiUnreachable:  # the server is not up yet
            return False
        return True

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eventually("the TLS server answers a watch", listening, 60)
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
