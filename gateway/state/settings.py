"""The state layer's settings and their defaults: Redis, tenants, batch dispatch, files."""

REDIS_URL_ENV = "LANEWAY_REDIS_URL"
TENANTS_ENV = "LANEWAY_TENANTS_FILE"
BATCH_CONCURRENCY = 8  # batch items one replica runs in the batch lane at once
BATCH_LEASE_S = 30.0  # silence after which another replica takes over a replica's items
MAX_FILE_BYTES = 100 * 1024 * 1024
