"""Keep a session on one endpoint: rendezvous hashing of the session key with each endpoint.

Every endpoint scores a fixed pseudo-random number drawn from (session key, endpoint URL),
so all requests of a session rank the endpoints in the same order and, alone or with a
dominant weight, land on the same one; when that endpoint leaves, only its sessions move.
This is the session affinity routers offer on a header (consistent hashing), blind to load
and to what any cache holds: an oracle for prefix hits in `laneway bench prefix`, off (weight
0) by default. Requests without a session key score the neutral UNKNOWN everywhere.
"""

from __future__ import annotations

import hashlib

from laneway.routing.cycle import SESSION_KEY, CycleState
from laneway.routing.scorers.base import UNKNOWN, Scorer

_SCALE = float(1 << 64)


def rendezvous_score(session_key: str, url: str) -> float:
    """A stable number in [0, 1) for the pair, the same in every process and replica."""
    digest = hashlib.blake2b(f"{session_key}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


class SessionHashScorer(Scorer):
    needs = frozenset({SESSION_KEY})

    def scores(self, cycle: CycleState) -> list[float]:
        return [
            UNKNOWN if key is None else rendezvous_score(key, url)
            for key, url in zip(cycle[SESSION_KEY], cycle.urls, strict=True)
        ]
