"""Whose request it is, behind Envoy: the tenant whose caps, line share, per-minute limits
and priority apply.

The API key decides, as it does at `laneway gateway`: with --tenants, the `authorization`
header's `Bearer KEY` names the tenant (the same keys file, so a client's key works through
either), and a missing or unknown key is the gateway's 401. The fairness id header is a
header any client can set, so it names no tenant by default: it only splits an anonymous
picker's (no --tenants) fair share into flows, as the ecosystem's flow control does.

With --trust-fairness-id the Gateway is the one that authenticates (its own API-key or JWT
filter, writing the client's name into the fairness id and dropping what the client sent):
the fairness id then names the tenant, by its `name` in --tenants, and a name that is not
there is refused with 401. A request without one falls back to its API key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from laneway.gateway.errors import ApiError
from laneway.gateway.keys import TENANTS
from laneway.gateway.state.callers import Caller, identify

# The request's headers (lower-case names) and its fairness id ("" where it sends none).
Identify = Callable[[Mapping[str, str], str], Caller | None]


@dataclass(frozen=True)
class PickerCallers:
    """`identify` for the picker's requests, as `laneway epp`'s flags configure it."""

    app: web.Application
    trust_fairness_id: bool = False

    def __call__(self, headers: Mapping[str, str], fairness_id: str) -> Caller | None:
        """The caller; None where no state layer is installed. ApiError 401 as the
        gateway answers it."""
        if self.trust_fairness_id and fairness_id:
            tenants = self.app.get(TENANTS)
            tenant = tenants.directory.named(fairness_id) if tenants is not None else None
            if tenant is None:
                raise ApiError(
                    401,
                    f"Tenant {fairness_id!r}, named by the request's fairness id, is not in the "
                    "endpoint picker's tenants",
                    "unknown_tenant",
                )
            return Caller(tenant)
        return identify(self.app, headers.get)
