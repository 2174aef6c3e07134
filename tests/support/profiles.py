"""Simulator profiles shaped for one test."""

from __future__ import annotations

import dataclasses

from laneway.simulator.profiles import PROFILES, Profile

H200 = PROFILES["h200-llama3-8b"]


def small_kv_profile(kv_tokens: int) -> Profile:
    """The H200 profile with just enough memory for `kv_tokens` of KV cache."""
    eff = H200.efficiency
    needed = H200.model.weight_bytes + eff.activation_reserve_bytes
    needed += kv_tokens * H200.model.kv_bytes_per_token
    gpu = dataclasses.replace(H200.gpu, memory_bytes=int(needed / eff.memory_utilization) + 1)
    return dataclasses.replace(H200, gpu=gpu)
