"""The state layer's settings and their defaults: Redis, tenants, batch dispatch, files."""

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
