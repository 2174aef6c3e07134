"""The gateway's configuration file: InferencePool documents plus one optional GatewayConfig.

`load_config` reads a multi-document YAML file and fails with one line that names the file,
the document (index and name) and the field, so a bad file stops the gateway at start.
The GatewayConfig fields are documented in docs/GATEWAY.md; the Helm chart maps onto them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laneway.api import (
    API_VERSION,
    KIND,
    FieldError,
    InferencePool,
    SpecError,
    _Reader,
    check_pool_set,
    parse_pool,
)
from laneway.errors import UsageError
from laneway.routing.picker import PICKING_POLICIES, SCORER_NAMES, PickingSettings
from laneway.routing.prefix_index import KVEventSource, PrefixSettings
from laneway.yaml_files import mapping, read_yaml_documents

GATEWAY_CONFIG_KIND = "GatewayConfig"
TOKENIZER_KINDS = ("tiktoken", "huggingface")
SPEC_FIELDS = (
    *("picking", "scrape", "health", "queue", "tokenizer", "upstream", "clients"),
    *("lending", "maxBodyBytes", "drainTimeoutMillis"),
)


@dataclass(frozen=True)
class ScrapeSettings:
    interval_millis: int = 1000  # how often each endpoint's /metrics is read
    stale_after_millis: int = 5000  # older samples are ignored by the scorers
    timeout_millis: int = 1000


@dataclass(frozen=True)
class HealthSettings:
    failures_to_eject: int = 3  # consecutive upstream failures before an endpoint is ejected
    check_interval_millis: int = 2000  # how often an ejected endpoint's /health is probed


@dataclass(frozen=True)
class QueueSettings:
    max_waiting: int = 1024  # per pool; beyond it requests get 429 at once
    timeout_millis: int = 30000  # the longest a request waits for a slot, then 429
    # The longest a request waits for a pool with no ready replica (scaled to zero, or its
    # first replica starting), then 503: it must cover a replica's cold start (about 60 s
    # for an 8B model on vLLM), the operator's 15 s demand interval and the pod's scheduling
    # and readiness probe, or a pool at zero would refuse the very request that wakes it.
    cold_start_timeout_millis: int = 180000
    retry_after_seconds: int = 1

    def wait_limit_millis(self, pool_has_endpoints: bool) -> int:
        """How long a request may wait in a pool's line that it joins now."""
        if pool_has_endpoints:
            return self.timeout_millis
        return max(self.timeout_millis, self.cold_start_timeout_millis)


@dataclass(frozen=True)
class TokenizerSettings:
    kind: str = "tiktoken"
    encoding: str | None = None  # tiktoken: the encoding name; None: cl100k_base
    path: str | None = None  # huggingface: a tokenizer.json
    config_path: str | None = None  # huggingface: a tokenizer_config.json (its chat template)


@dataclass(frozen=True)
class UpstreamSettings:
    connect_timeout_millis: int = 2000
    read_timeout_millis: int = 120000  # the longest silence between two upstream chunks
    health_timeout_millis: int = 1000


@dataclass(frozen=True)
class ClientSettings:
    """Bounds on what a slow or silent client can hold."""

    # An open connection must send a whole request head within this long of connecting or
    # of its last answer, else it is closed: both the idle keep-alive limit and the header
    # deadline (a head sent a byte at a time).
    idle_timeout_millis: int = 15000
    body_timeout_millis: int = 60000  # the longest a request body may take to arrive (408)
    # The same for a file upload (POST /v1/files), which may be 100 MiB: 5 minutes is
    # about 350 KB/s for the largest file, yet a body sent a byte at a time is cut off.
    upload_timeout_millis: int = 300000
    # The longest a streamed answer may wait for a client that reads nothing before the
    # gateway drops it, ending the engine's work and freeing the pool's slot.
    write_timeout_millis: int = 30000


@dataclass(frozen=True)
class LendingSettings:
    """How the gateway acts on the ledger's lending decisions (`spec.lending` pools)."""

    # One more replica is lent per this long of chat demand below the pool's chat replicas:
    # a lull between two turns lends nothing.
    lend_after_millis: int = 5000
    # How often the roles are decided again besides on every admission and end (a lend is
    # due when demand stayed low for lend_after_millis, with no request to notice it).
    interval_millis: int = 500


@dataclass(frozen=True)
class GatewaySettings:
    picking: PickingSettings = field(default_factory=PickingSettings)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    clients: ClientSettings = field(default_factory=ClientSettings)
    lending: LendingSettings = field(default_factory=LendingSettings)
    max_body_bytes: int = 4 * 1024 * 1024  # a 128k-token prompt is about 512 KB of text
    drain_timeout_millis: int = 30000  # how long shutdown waits for open streams


@dataclass(frozen=True)
class GatewayFile:
    settings: GatewaySettings
    pools: tuple[InferencePool, ...]


def load_config(path: str | Path, allow_pools: bool = True) -> GatewayFile:
    """Read a config file; UsageError with one line naming file, document and field."""
    path = Path(path)
    return parse_documents(read_yaml_documents(path, "config"), str(path), allow_pools)


def parse_documents(
    documents: Sequence[object], source: str, allow_pools: bool = True
) -> GatewayFile:
    settings: GatewaySettings | None = None
    pools: list[InferencePool] = []
    for index, value in enumerate(documents):
        document = mapping(value, f"{source}: document {index}")
        where = f"{source}: document {index} ({document.get('kind')} {_name_of(document)})"
        kind = document.get("kind")
        if kind == KIND:
            if not allow_pools:
                raise UsageError(
                    f"{where}: with --kubernetes, pools come from the API; "
                    "the config file may hold only the GatewayConfig document"
                )
            try:
                pools.append(parse_pool(document))
            except SpecError as error:
                raise UsageError(f"{where}: {error}") from None
        elif kind == GATEWAY_CONFIG_KIND:
            if settings is not None:
                raise UsageError(f"{where}: only one GatewayConfig document is allowed")
            try:
                settings = parse_settings(document)
            except SpecError as error:
                raise UsageError(f"{where}: {error}") from None
        else:
            raise UsageError(
                f"{source}: document {index}: kind must be {KIND} or "
                f"{GATEWAY_CONFIG_KIND}, got {kind!r}"
            )
    _check_unique_names(pools, source)
    problems = check_pool_set(pools)
    if problems:
        raise UsageError(f"{source}: {'; '.join(str(p) for p in problems)}")
    return GatewayFile(settings or GatewaySettings(), tuple(pools))


def _check_unique_names(pools: Sequence[InferencePool], source: str) -> None:
    seen: set[str] = set()
    for pool in pools:
        if pool.key in seen:
            raise UsageError(f"{source}: InferencePool {pool.key} is defined twice")
        seen.add(pool.key)


def _name_of(document: Mapping[str, Any]) -> str:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return str(name) if name else "<unnamed>"


def parse_settings(document: Mapping[str, Any]) -> GatewaySettings:
    """Parse one GatewayConfig document; SpecError naming every wrong field."""
    reader = _Reader()
    if document.get("apiVersion") != API_VERSION:
        reader.fail("apiVersion", f"must be {API_VERSION}, got {document.get('apiVersion')!r}")
    spec = reader.mapping(document, "spec", "")
    reader.known_fields(spec, "spec", SPEC_FIELDS)
    settings = GatewaySettings(
        picking=_picking(reader, reader.mapping(spec, "picking", "spec")),
        scrape=_scrape(reader, reader.mapping(spec, "scrape", "spec")),
        health=_health(reader, reader.mapping(spec, "health", "spec")),
        queue=_queue(reader, reader.mapping(spec, "queue", "spec")),
        tokenizer=_tokenizer(reader, reader.mapping(spec, "tokenizer", "spec")),
        upstream=_upstream(reader, reader.mapping(spec, "upstream", "spec")),
        clients=_clients(reader, reader.mapping(spec, "clients", "spec")),
        lending=_lending(reader, reader.mapping(spec, "lending", "spec")),
        max_body_bytes=reader.integer(
            spec, "maxBodyBytes", "spec", GatewaySettings.max_body_bytes, minimum=1024
        ),
        drain_timeout_millis=reader.integer(
            spec, "drainTimeoutMillis", "spec", GatewaySettings.drain_timeout_millis
        ),
    )
    errors = [FieldError(e.path.lstrip("."), e.message) for e in reader.errors]
    if errors:
        raise SpecError(errors)
    return settings


def _picking(reader: _Reader, data: Mapping[str, Any]) -> PickingSettings:
    path = "spec.picking"
    reader.known_fields(data, path, ("policy", "weights", "prefix"))
    policy = reader.choice(data, "policy", path, PICKING_POLICIES) if "policy" in data else None
    weights_data = reader.mapping(data, "weights", path)
    reader.known_fields(weights_data, f"{path}.weights", SCORER_NAMES)
    default = PickingSettings().weights
    weights = {
        name: reader.integer(weights_data, name, f"{path}.weights", default[name], maximum=100)
        for name in SCORER_NAMES
    }
    if (policy or "scored") == "scored" and not any(weights.values()):
        reader.fail(f"{path}.weights", "at least one scorer needs a weight above 0")
    prefix = _prefix(reader, reader.mapping(data, "prefix", path))
    return PickingSettings(policy=policy or PickingSettings.policy, weights=weights, prefix=prefix)


def _prefix(reader: _Reader, data: Mapping[str, Any]) -> PrefixSettings:
    path = "spec.picking.prefix"
    fields = ("blockChars", "maxBlocks", "capacityBlocks", "forgetOnEngineRestart", "kvEvents")
    reader.known_fields(data, path, fields)
    default = PrefixSettings()
    return PrefixSettings(
        kv_events=_kv_events(reader, data, path),
        block_chars=reader.integer(data, "blockChars", path, default.block_chars, minimum=16),
        max_blocks=reader.integer(data, "maxBlocks", path, default.max_blocks, minimum=1),
        capacity_blocks=reader.integer(
            data, "capacityBlocks", path, default.capacity_blocks, minimum=1
        ),
        forget_on_engine_restart=reader.boolean(
            data, "forgetOnEngineRestart", path, default.forget_on_engine_restart
        ),
    )


def _kv_events(reader: _Reader, data: Mapping[str, Any], path: str) -> tuple[KVEventSource, ...]:
    """`kvEvents`: the pools whose engines publish vLLM KV cache events to this gateway."""
    sources = []
    for index, item in enumerate(reader.object_list(data, "kvEvents", path)):
        where = f"{path}.kvEvents[{index}]"
        reader.known_fields(item, where, ("pool", "bind", "blockSize"))
        pool = reader.required_string(item, "pool", where)
        bind = reader.required_string(item, "bind", where)
        if bind and not bind.startswith(("tcp://", "ipc://")):
            reader.fail(f"{where}.bind", f"must be a ZMQ address (tcp:// or ipc://), got {bind!r}")
        block_size = reader.integer(item, "blockSize", where, KVEventSource.block_size, minimum=1)
        sources.append(KVEventSource(pool, bind, block_size))
    pools = [source.pool for source in sources]
    binds = [source.bind for source in sources]
    if len(set(pools)) < len(pools) or len(set(binds)) < len(binds):
        reader.fail(f"{path}.kvEvents", "each pool and each bind address may appear once")
    return tuple(sources)


def _scrape(reader: _Reader, data: Mapping[str, Any]) -> ScrapeSettings:
    path = "spec.scrape"
    reader.known_fields(data, path, ("intervalMillis", "staleAfterMillis", "timeoutMillis"))
    default = ScrapeSettings()
    interval = reader.integer(data, "intervalMillis", path, default.interval_millis, minimum=50)
    # Unset, staleness follows a slowed-down interval: a few missed scrapes, never all.
    stale_default = max(default.stale_after_millis, 3 * interval)
    stale = reader.integer(data, "staleAfterMillis", path, stale_default, minimum=interval)
    return ScrapeSettings(
        interval_millis=interval,
        stale_after_millis=stale,
        timeout_millis=reader.integer(
            data, "timeoutMillis", path, default.timeout_millis, minimum=10
        ),
    )


def _health(reader: _Reader, data: Mapping[str, Any]) -> HealthSettings:
    path = "spec.health"
    reader.known_fields(data, path, ("failuresToEject", "checkIntervalMillis"))
    default = HealthSettings()
    return HealthSettings(
        failures_to_eject=reader.integer(
            data, "failuresToEject", path, default.failures_to_eject, minimum=1
        ),
        check_interval_millis=reader.integer(
            data, "checkIntervalMillis", path, default.check_interval_millis, minimum=50
        ),
    )


def _queue(reader: _Reader, data: Mapping[str, Any]) -> QueueSettings:
    path = "spec.queue"
    reader.known_fields(
        data, path, ("maxWaiting", "timeoutMillis", "coldStartTimeoutMillis", "retryAfterSeconds")
    )
    default = QueueSettings()
    return QueueSettings(
        max_waiting=reader.integer(data, "maxWaiting", path, default.max_waiting),
        timeout_millis=reader.integer(data, "timeoutMillis", path, default.timeout_millis),
        cold_start_timeout_millis=reader.integer(
            data, "coldStartTimeoutMillis", path, default.cold_start_timeout_millis
        ),
        retry_after_seconds=reader.integer(
            data, "retryAfterSeconds", path, default.retry_after_seconds, minimum=1
        ),
    )


def _lending(reader: _Reader, data: Mapping[str, Any]) -> LendingSettings:
    path = "spec.lending"
    reader.known_fields(data, path, ("lendAfterMillis", "intervalMillis"))
    default = LendingSettings()
    return LendingSettings(
        lend_after_millis=reader.integer(
            data, "lendAfterMillis", path, default.lend_after_millis, minimum=0
        ),
        interval_millis=reader.integer(
            data, "intervalMillis", path, default.interval_millis, minimum=10
        ),
    )


def _tokenizer(reader: _Reader, data: Mapping[str, Any]) -> TokenizerSettings:
    path = "spec.tokenizer"
    reader.known_fields(data, path, ("kind", "encoding", "path", "configPath"))
    kind = reader.choice(data, "kind", path, TOKENIZER_KINDS) if "kind" in data else None
    settings = TokenizerSettings(
        kind=kind or TokenizerSettings.kind,
        encoding=reader.string(data, "encoding", path),
        path=reader.string(data, "path", path),
        config_path=reader.string(data, "configPath", path),
    )
    if settings.kind == "huggingface" and settings.path is None:
        reader.fail(f"{path}.path", "is required for kind huggingface (a tokenizer.json)")
    if settings.kind != "huggingface" and settings.config_path is not None:
        reader.fail(f"{path}.configPath", "is for kind huggingface (a tokenizer_config.json)")
    return settings


def _clients(reader: _Reader, data: Mapping[str, Any]) -> ClientSettings:
    path = "spec.clients"
    known = ("idleTimeoutMillis", "bodyTimeoutMillis", "uploadTimeoutMillis", "writeTimeoutMillis")
    reader.known_fields(data, path, known)
    default = ClientSettings()
    return ClientSettings(
        idle_timeout_millis=reader.integer(
            data, "idleTimeoutMillis", path, default.idle_timeout_millis, minimum=100
        ),
        body_timeout_millis=reader.integer(
            data, "bodyTimeoutMillis", path, default.body_timeout_millis, minimum=100
        ),
        upload_timeout_millis=reader.integer(
            data, "uploadTimeoutMillis", path, default.upload_timeout_millis, minimum=100
        ),
        write_timeout_millis=reader.integer(
            data, "writeTimeoutMillis", path, default.write_timeout_millis, minimum=100
        ),
    )


def _upstream(reader: _Reader, data: Mapping[str, Any]) -> UpstreamSettings:
    path = "spec.upstream"
    known = ("connectTimeoutMillis", "readTimeoutMillis", "healthTimeoutMillis")
    reader.known_fields(data, path, known)
    default = UpstreamSettings()
    return UpstreamSettings(
        connect_timeout_millis=reader.integer(
            data, "connectTimeoutMillis", path, default.connect_timeout_millis, minimum=1
        ),
        read_timeout_millis=reader.integer(
            data, "readTimeoutMillis", path, default.read_timeout_millis, minimum=1
        ),
        health_timeout_millis=reader.integer(
            data, "healthTimeoutMillis", path, default.health_timeout_millis, minimum=1
        ),
    )
