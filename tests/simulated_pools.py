"""The old name of support.pools and support.launch, for the test modules other branches
rewrite at the time (test_gateway_server, _stream_relay, _first_token, test_slow_clients,
test_routing_plan, test_routing_tenants): they import from here until they move to
support, then this goes."""

from support.launch import start_gateway, start_sim
from support.pools import MAX_BODY, gateway_doc, lane_pool, pool_doc, simulated_pool

__all__ = [
    "MAX_BODY",
    "gateway_doc",
    "lane_pool",
    "pool_doc",
    "simulated_pool",
    "start_gateway",
    "start_sim",
]
