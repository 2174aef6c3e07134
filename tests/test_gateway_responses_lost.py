"""A stored response whose engine lost it: the gateway's answer when the holder's engine
restarted on the same address before any scrape showed it (OpenAI's not-found, never an
answer without history). Its own module: it restarts an engine, which the shared setup of
test_gateway_responses.py must not see."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from support.inproc import Servers
from support.pools import FAST, gateway_doc, pool_doc


async def test_a_holder_whose_engine_restarted_answers_openais_not_found(
    servers: Servers, tmp_path: Path
) -> None:
    """The engine restarts on the same address before any scrape shows it: its store is
    gone, and the turn that needed it is refused, not answered without its history."""
    flags = ("--time-scale", FAST, "--enable-responses-store")
    engine = await servers.sim("llama-small", *flags)
    documents = [pool_doc("solo", "interactive", "llama-small", [engine.url]), gateway_doc()]
    gateway = await servers.gateway(tmp_path / "gateway.yaml", documents)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0) as api:
        made = await api.responses.create(model="llama", input="hi", max_output_tokens=2)
        await engine.runner.cleanup()
        await servers.sim("llama-small", *flags, "--port", str(engine.port))
        with pytest.raises(openai.BadRequestError) as refused:
            await api.responses.create(model="llama", input="x", previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            await api.responses.retrieve(made.id)  # forgotten: not asked of the engine again
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "previous_response_not_found"
