"""The InferencePool API's names and the bounds its schema and its parser share."""

from __future__ import annotations

from typing import Final, Literal, get_args

GROUP = "laneway.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
LIST_KIND = f"{KIND}List"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAMES = ("lwpool",)
CATEGORIES = ("laneway",)
# On every child and engine pod of a pool: the operator selects by it, discovery reads it.
POOL_LABEL = f"{GROUP}/pool"

# Upper bounds of the schema's fields, named where other code reads them too.
MAX_TOKENS = 4_194_304  # context, chunk and step-budget sizes
MAX_CONCURRENT_REQUESTS = 65_536
MAX_PARTIAL_PREFILLS = 64
MAX_REPLICAS = 1_000
MAX_TIME_SCALE = 1_000.0
MAX_WINDOW_SECONDS = 3600

# The block sizes kvEvents may pin: vLLM's --block-size choices in every release since 0.9
# (vllm/config/cache.py, BlockSize: 1, 8, 16, 32, 64, 128, later 256) that its
# FlashAttention and Triton backends take (multiples of 16).
KVBlockSize = Literal[16, 32, 64, 128]
KV_EVENT_BLOCK_SIZES: tuple[int, ...] = get_args(KVBlockSize)
DEFAULT_KV_EVENT_BLOCK_SIZE: Final = 16  # vLLM's default on CUDA, and the gateway's
# `laneway sim` keeps 16-token KV blocks and has no --block-size (simulator/prefix_cache.py).
SIMULATOR_KV_BLOCK_SIZE = 16
# tcp://HOST:PORT, HOST a DNS name (the gateway's KV events Service) or an IPv4 address and
# PORT 1-65535; the CRD's CEL rule holds the same pattern.
KV_EVENTS_ENDPOINT_PATTERN = (
    "^tcp://[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?:"
    "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$"
)
# Flags kvEvents renders, as prefixes of the spellings vLLM's parser takes: `_` for `-`, and
# `--flag=value` or `--kv-events-config.FIELD value` after either.
KV_EVENTS_RENDERED_FLAGS = (
    "--kv-events-config",
    "--kv_events_config",
    "--block-size",
    "--block_size",
)

# How long the gateway waits for an engine's /tokenize before it counts locally instead.
DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS = 500
