"""The state layer's settings and their defaults: Redis, tenants, batch dispatch, files.

They sit here, below the batch room that reads them, so that the state layer's options
(`shared.SharedStateOptions`) can carry them without importing the batch room.
"""

from __future__ import annotations

from dataclasses import dataclass

REDIS_URL_ENV = "LANEWAY_REDIS_URL"
TENANTS_ENV = "LANEWAY_TENANTS_FILE"
BATCH_CONCURRENCY = 8  # batch items one replica runs in the batch lane at once
BATCH_LEASE_S = 30.0  # silence after which another replica takes over a replica's items
MAX_FILE_BYTES = 100 * 1024 * 1024
# What one tenant may keep in Redis at once, unless its entry in the tenants file says
# otherwise: files live in Redis memory, so a cap per tenant keeps one from filling it.
TENANT_FILES = 100
TENANT_FILE_BYTES = 1024 * 1024 * 1024
# Token estimates (about 4 bytes of JSON each) of a tenant's batch items not yet run: two
# input files of the largest size.
TENANT_BATCH_TOKENS = 2 * MAX_FILE_BYTES // 4
FILE_TTL_S = 30 * 24 * 3600  # OpenAI keeps batch files 30 days by default


@dataclass(frozen=True)
class FileQuota:
    """What one tenant may store at once."""

    files: int = TENANT_FILES
    bytes: int = TENANT_FILE_BYTES


@dataclass(frozen=True)
class DispatchSettings:
    """How the batch dispatcher (batch/dispatcher.py) runs a replica's share of batch items."""

    concurrency: int = BATCH_CONCURRENCY
    lease_s: float = BATCH_LEASE_S
    poll_s: float = 0.2  # how often to look for new items when idle
    max_attempts: int = 5  # failed tries (5xx, unreachable) before an item fails
    retry_backoff_s: float = 1.0
    request_timeout_s: float = 3600.0
