"""The Endpoint Picker Protocol's messages on Envoy's ext_proc stream, as the Gateway API
Inference Extension publishes it (docs/proposals/004-endpoint-picker-protocol): what the
proxy hands in (headers, the candidate subset, the endpoint that served) and what the
picker answers (the picked endpoints as a header and as `envoy.lb` dynamic metadata, the
body passed back, an immediate error). Builders and readers only; no state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from envoy.config.core.v3.base_pb2 import HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from laneway.gateway.errors import ApiError

DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
# What plain Envoy says of the upstream that answered, where the ext_proc filter asks for
# it (`response_attributes`); the served-endpoint metadata says the same where the
# implementation sets it.
UPSTREAM_ADDRESS = "upstream.address"
# When the proxy read the request's first byte, where the filter sends it with the request's
# headers (`request_attributes`): the picker's clock can start there rather than a hop later.
REQUEST_TIME = "request.time"
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"


def headers_of(message: ext.HttpHeaders) -> dict[str, str]:
    """The headers, names lower-cased (HTTP/2 pseudo-headers as `:path`, `:status`)."""
    found = {}
    for header in message.headers.headers:
        found[header.key.lower()] = header.raw_value.decode("utf-8", "replace") or header.value
    return found


def subset_hint(request: ext.ProcessingRequest) -> tuple[str, ...] | None:
    """The candidates the proxy lets the picker choose from; None where it sets none."""
    namespaces = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    hint = namespaces[SUBSET_NAMESPACE].fields.get(SUBSET_KEY)
    if hint is None:
        return None
    if hint.HasField("list_value"):
        return tuple(v.string_value.strip() for v in hint.list_value.values)
    return tuple(part.strip() for part in hint.string_value.split(",") if part.strip())


def served_endpoint(request: ext.ProcessingRequest) -> str | None:
    """The `ip:port` that answered: the protocol's metadata, else Envoy's attribute."""
    namespaces = request.metadata_context.filter_metadata
    if LB_NAMESPACE in namespaces:
        served = namespaces[LB_NAMESPACE].fields.get(SERVED_KEY)
        if served is not None and served.string_value:
            return str(served.string_value)
    attributes = request.attributes.get(EXT_PROC_ATTRIBUTES)
    if attributes is not None:
        address = attributes.fields.get(UPSTREAM_ADDRESS)
        if address is not None and address.string_value:
            return str(address.string_value)
    return None


def time_in_proxy(request: ext.ProcessingRequest, now: float) -> float:
    """Seconds since the proxy read the request's first byte (its `request.time`, an RFC 3339
    time), `now` on the same wall clock; 0 where it does not say, says something unreadable,
    or says a time after `now` (the proxy's clock ahead of the picker's)."""
    attributes = request.attributes.get(EXT_PROC_ATTRIBUTES)
    received = attributes.fields.get(REQUEST_TIME) if attributes is not None else None
    if received is None or not received.string_value:
        return 0.0
    try:
        at = datetime.fromisoformat(received.string_value)
    except ValueError:
        return 0.0
    if at.tzinfo is None:
        return 0.0  # a time with no zone names no moment
    return max(0.0, now - at.timestamp())


def full_duplex(request: ext.ProcessingRequest) -> bool | None:
    """Whether the request body streams full-duplex; None where the proxy does not say
    (Envoy sends its protocol configuration on a stream's first message since 1.35)."""
    if not request.HasField("protocol_config"):
        return None
    return bool(request.protocol_config.request_body_mode == ProcessingMode.FULL_DUPLEX_STREAMED)


def response_full_duplex(request: ext.ProcessingRequest) -> bool:
    """Whether the response body streams full-duplex (as the request's where unsaid)."""
    if not request.HasField("protocol_config"):
        return True
    return bool(request.protocol_config.response_body_mode == ProcessingMode.FULL_DUPLEX_STREAMED)


def address_of(url: str) -> str:
    """`http://10.0.0.5:8000` -> `10.0.0.5:8000`, the protocol's `ip:port`."""
    return url.split("://", 1)[-1].rstrip("/")


# The builders fill one message through its fields' paths: upb makes each nested message
# once, where keyword constructors build every level and copy it into its parent.
OVERWRITE = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _set_headers(mutation: ext.HeaderMutation, headers: Mapping[str, str]) -> None:
    sets = mutation.set_headers
    for key, value in headers.items():
        option = sets.add(append_action=OVERWRITE)
        option.header.key = key
        option.header.raw_value = value.encode()


def _set_destination(response: ext.ProcessingResponse, destination: str) -> None:
    """`envoy.lb: {x-gateway-destination-endpoint: "a,b,..."}`: the same value as the
    header (the protocol forbids them to differ)."""
    namespace = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    namespace.fields[DESTINATION].string_value = destination


def _streamed(body: ext.BodyResponse, chunk: bytes, end: bool) -> None:
    streamed = body.response.body_mutation.streamed_response
    streamed.body = chunk
    streamed.end_of_stream = end


def routed_headers(
    *, addresses: Iterable[str], headers: Mapping[str, str], body_bytes: int | None
) -> ext.ProcessingResponse:
    """The answer to the request headers once the picker has chosen: the destination (and
    laneway's routing headers) set, the body's new length where it was rewritten."""
    destination = ",".join(addresses)
    sets = {DESTINATION: destination, **headers}
    if body_bytes is not None:
        sets["content-length"] = str(body_bytes)
    answer = ext.ProcessingResponse()
    _set_headers(answer.request_headers.response.header_mutation, sets)
    _set_destination(answer, destination)
    return answer


def routed_body(
    *, addresses: Iterable[str], headers: Mapping[str, str], body: bytes, streamed: bool
) -> ext.ProcessingResponse:
    """The request body back: streamed (full-duplex: the whole body in one last chunk, the
    headers having gone with the headers answer) or buffered (a replaced body, with the
    destination set here since the headers answer went before it)."""
    answer = ext.ProcessingResponse()
    if streamed:
        _streamed(answer.request_body, body, True)
        return answer
    destination = ",".join(addresses)
    sets = {DESTINATION: destination, **headers, "content-length": str(len(body))}
    common = answer.request_body.response
    _set_headers(common.header_mutation, sets)
    common.body_mutation.body = body
    _set_destination(answer, destination)
    return answer


def request_headers_continue() -> ext.ProcessingResponse:
    answer = ext.ProcessingResponse()
    answer.request_headers.SetInParent()
    return answer


def request_body_chunk(body: bytes, end: bool) -> ext.ProcessingResponse:
    """A full-duplex request body chunk passed back as it came (a request not routed here)."""
    answer = ext.ProcessingResponse()
    _streamed(answer.request_body, body, end)
    return answer


def response_headers(headers: Mapping[str, str]) -> ext.ProcessingResponse:
    answer = ext.ProcessingResponse()
    common = answer.response_headers.response
    if headers:
        _set_headers(common.header_mutation, headers)
    else:
        common.SetInParent()
    return answer


def response_body_chunk(body: bytes, end: bool, streamed: bool) -> ext.ProcessingResponse:
    """A response body chunk back to the proxy: streamed (full-duplex) or buffered whole."""
    answer = ext.ProcessingResponse()
    if streamed:
        _streamed(answer.response_body, body, end)
    else:
        answer.response_body.response.body_mutation.body = body
    return answer


def trailers_continue(response: bool) -> ext.ProcessingResponse:
    answer = ext.ProcessingResponse()
    (answer.response_trailers if response else answer.request_trailers).SetInParent()
    return answer


def immediate(error: ApiError, headers: Mapping[str, str]) -> ext.ProcessingResponse:
    """The standalone gateway's answer, sent by the proxy in place of an upstream's."""
    sets = {"content-type": "application/json", **error.headers(headers)}
    answer = ext.ProcessingResponse()
    refusal = answer.immediate_response
    refusal.status.code = error.status
    _set_headers(refusal.headers, {key.lower(): value for key, value in sets.items()})
    refusal.body = error.encoded()
    refusal.details = error.code
    return answer
