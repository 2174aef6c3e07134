"""The old name of support.engines, for test_gateway_stream_relay and _first_token, being
rewritten in another branch: they import from here until they move to support, then this
goes."""

from support.engines import Script, scripted_engine

__all__ = ["Script", "scripted_engine"]
