"""The table of InferencePool specs the CRD's CEL rules must pass or reject, each with the
piece of rule text expected to reject it: tests/test_crd_cel.py judges it offline
(cel-python, check_spec), tests/test_cluster_crd.py with a real API server."""

from __future__ import annotations

from typing import Any

from laneway import api
from support.merging import merged

BASE: dict[str, Any] = {
    "lane": "interactive",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "engine": {"kind": "vllm"},
    "prefill": {"chunkSize": 512, "tokenBudget": 2048},
    "limits": {"maxContextTokens": 4096, "maxConcurrentRequests": 256},
}


def document(patch: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "pool", "namespace": "default"},
        "spec": merged(BASE, patch),
    }


# (case, spec patch, the rule expected to reject it — a piece of its rule text — or None)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("the base realtime vLLM pool", {}, None),
    ("chunk equal to budget", {"prefill": {"chunkSize": 2048}}, None),
    ("chunk over budget", {"prefill": {"chunkSize": 4096, "tokenBudget": 2048}}, "tokenBudget"),
    (
        "chunk over budget, chunking off: no chunks, no rule",
        {
            "engine": {"kind": "sglang"},
            "prefill": {"chunkedPrefill": False, "chunkSize": 4096},
        },
        None,
    ),
    (
        "chunk longer than the context",
        {"prefill": {"chunkSize": 4096, "tokenBudget": 8192}, "limits": {"maxContextTokens": 2048}},
        "chunkSize <= self.limits.maxContextTokens",
    ),
    ("prompt cap within context", {"routing": {"maxPromptTokens": 4096}}, None),
    (
        "prompt cap over context",
        {"routing": {"maxPromptTokens": 5000}},
        "self.routing.maxPromptTokens <= self.limits.maxContextTokens",
    ),
    (
        "min prompt over max prompt",
        {"routing": {"minPromptTokens": 3000, "maxPromptTokens": 2000}},
        "self.minPromptTokens <= self.maxPromptTokens",
    ),
    (
        "min prompt at the context cap, no max",
        {"routing": {"minPromptTokens": 4096}},
        "self.routing.minPromptTokens < self.limits.maxContextTokens",
    ),
    ("min prompt just below the cap", {"routing": {"minPromptTokens": 4095}}, None),
    (
        "vLLM budget below max sequences",
        {"prefill": {"chunkSize": 128, "tokenBudget": 128}},
        "tokenBudget >= self.limits.maxConcurrentRequests",
    ),
    (
        "SGLang may have a budget below max sequences",
        {"engine": {"kind": "sglang"}, "prefill": {"chunkSize": 128, "tokenBudget": 128}},
        None,
    ),
    (
        "vLLM without chunking, budget below context",
        {"prefill": {"chunkedPrefill": False}},
        "tokenBudget >= self.limits.maxContextTokens",
    ),
    (
        "vLLM without chunking, budget covers context",
        {"prefill": {"chunkedPrefill": False, "tokenBudget": 4096}},
        None,
    ),
    (
        "vLLM partial prefills without chunking",
        {"prefill": {"chunkedPrefill": False, "tokenBudget": 4096, "maxPartialPrefills": 2}},
        "self.engine.kind != 'vllm' || self.prefill.maxPartialPrefills == 1",
    ),
    (
        "vLLM V1 refuses concurrent partial prefills, chunked or not",
        {"prefill": {"maxPartialPrefills": 4}},
        "self.engine.kind != 'vllm' || self.prefill.maxPartialPrefills == 1",
    ),
    (
        "the simulator models partial-prefill limits",
        {"engine": {"kind": "simulator"}, "prefill": {"maxPartialPrefills": 4}},
        None,
    ),
    ("priority scheduling on vLLM", {"scheduling": {"policy": "priority"}}, None),
    (
        "SGLang partial prefills",
        {"engine": {"kind": "sglang"}, "prefill": {"maxPartialPrefills": 2}},
        "self.engine.kind != 'sglang'",
    ),
    ("an interactive pool lending", {"lending": {"borrower": "docs"}}, None),
    (
        "a batch pool lending",
        {"lane": "batch", "lending": {"borrower": "docs"}},
        "self.lane == 'interactive'",
    ),
    (
        "keeping more replicas than it may have",
        {"autoscaling": {"maxReplicas": 2}, "lending": {"borrower": "docs", "keepReplicas": 3}},
        "self.lending.keepReplicas <= self.autoscaling.maxReplicas",
    ),
    (
        "keeping as many as it may have",
        {"autoscaling": {"maxReplicas": 2}, "lending": {"borrower": "docs", "keepReplicas": 2}},
        None,
    ),
    (
        "selector with autoscaling",
        {"selector": {"matchLabels": {"app": "x"}}, "autoscaling": {"maxReplicas": 3}},
        "has(self.selector) && has(self.autoscaling)",
    ),
    ("selector alone", {"selector": {"matchLabels": {"app": "x"}}}, None),
    (
        "autoscaling max below min",
        {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}},
        "self.maxReplicas >= self.minReplicas",
    ),
    ("autoscaling min only", {"autoscaling": {"maxReplicas": 1}}, None),
    (
        "an interactive pool autoscaled to zero",
        {"lane": "interactive", "autoscaling": {"minReplicas": 0, "maxReplicas": 4}},
        "self.autoscaling.minReplicas >= 1",
    ),
    (
        "a batch pool autoscaled to zero",
        {"lane": "batch", "autoscaling": {"minReplicas": 0, "maxReplicas": 4}},
        None,
    ),
    (
        "simulator settings on a GPU engine",
        {"engine": {"kind": "vllm", "simulator": {"profile": "h200-llama3-8b"}}},
        "self.kind == 'simulator'",
    ),
    (
        "simulator settings on a simulator",
        {"engine": {"kind": "simulator", "simulator": {"timeScale": 10}}},
        None,
    ),
    (
        "a huggingface tokenizer without its file",
        {"tokenizer": {"kind": "huggingface"}},
        "self.kind != 'huggingface' || has(self.path)",
    ),
    (
        "a tiktoken tokenizer given a file",
        {"tokenizer": {"kind": "tiktoken", "path": "/etc/tok/tokenizer.json"}},
        "self.kind == 'huggingface' || !has(self.path)",
    ),
    (
        "a huggingface tokenizer given an encoding",
        {"tokenizer": {"kind": "huggingface", "path": "/t.json", "encoding": "cl100k_base"}},
        "self.kind == 'tiktoken' || !has(self.encoding)",
    ),
    (
        "an engine tokenizer given a file",
        {"tokenizer": {"kind": "engine", "path": "/t.json"}},
        "self.kind == 'huggingface' || !has(self.path)",
    ),
    (
        "a chat template on a tiktoken tokenizer",
        {"tokenizer": {"kind": "tiktoken", "configPath": "/tokenizer_config.json"}},
        "self.kind == 'huggingface' || !has(self.configPath)",
    ),
    (
        "a timeout on a huggingface tokenizer",
        {"tokenizer": {"kind": "huggingface", "path": "/t.json", "timeoutMillis": 100}},
        "self.kind == 'engine' || !has(self.timeoutMillis)",
    ),
    (
        "a tokenizer.json with its chat template",
        {
            "tokenizer": {
                "kind": "huggingface",
                "path": "/t.json",
                "configPath": "/tokenizer_config.json",
            }
        },
        None,
    ),
    (
        "vLLM publishing KV events to the gateway's Service",
        {
            "engine": {
                "kvEvents": {
                    "endpoint": "tcp://laneway-gateway-kv-events.laneway.svc:5557",
                    "blockSize": 32,
                }
            }
        },
        None,
    ),
    (
        "a simulator publishing KV events to an IPv4 address",
        {"engine": {"kind": "simulator", "kvEvents": {"endpoint": "tcp://10.96.0.12:65535"}}},
        None,
    ),
    (
        "KV events from SGLang",
        {"engine": {"kind": "sglang", "kvEvents": {"endpoint": "tcp://gw:5557"}}},
        "self.kind != 'sglang' || !has(self.kvEvents)",
    ),
    (
        "KV events from a simulator with blocks it does not keep",
        {
            "engine": {
                "kind": "simulator",
                "kvEvents": {"endpoint": "tcp://gw:5557", "blockSize": 32},
            }
        },
        "self.kvEvents.blockSize == 16",
    ),
    (
        "KV events with the block size also in engine.args",
        {"engine": {"kvEvents": {"endpoint": "tcp://gw:5557"}, "args": ["--block-size=32"]}},
        "a.startsWith('--block-size')",
    ),
    (
        "KV events with a hand-written --kv-events-config too",
        {
            "engine": {
                "kvEvents": {"endpoint": "tcp://gw:5557"},
                "args": ["--kv_events_config", "{}"],
            }
        },
        "a.startsWith('--kv-events-config')",
    ),
    (
        "KV events for adopted pods",
        {
            "selector": {"matchLabels": {"app": "x"}},
            "engine": {"kvEvents": {"endpoint": "tcp://gw:5557"}},
        },
        "has(self.selector) && has(self.engine.kvEvents)",
    ),
    (
        "a KV events endpoint the engine would bind",
        {"engine": {"kvEvents": {"endpoint": "tcp://*:5557"}}},
        "self.endpoint.matches(",
    ),
    (
        "a KV events endpoint without a port",
        {"engine": {"kvEvents": {"endpoint": "tcp://laneway-gateway-kv-events"}}},
        "self.endpoint.matches(",
    ),
    (
        "a KV events endpoint past the last port",
        {"engine": {"kvEvents": {"endpoint": "tcp://gw:65536"}}},
        "self.endpoint.matches(",
    ),
    (
        "a KV events endpoint over IPC, which no other pod can reach",
        {"engine": {"kvEvents": {"endpoint": "ipc:///tmp/kv"}}},
        "self.endpoint.matches(",
    ),
    ("the engine's /tokenize", {"tokenizer": {"kind": "engine", "timeoutMillis": 200}}, None),
    ("a mounted tokenizer.json", {"tokenizer": {"kind": "huggingface", "path": "/t.json"}}, None),
    ("a tiktoken encoding", {"tokenizer": {"kind": "tiktoken", "encoding": "cl100k_base"}}, None),
]
