"""Engine-recorded vectors: every call stream in tests/data/vllm_offload_streams.jsonl was
run on vLLM 0.33's CPUOffloadingManager (tools/record_vllm_offload.py); replayed on
prefixcache.CpuOffloadManager, every answer must be the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import prefixcache

DATA = Path(__file__).parent / "data" / "vllm_offload_streams.jsonl"
STREAMS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def arg(a: Any) -> Any:
    if isinstance(a, str):
        return bytes.fromhex(a)
    if isinstance(a, list) and a and isinstance(a[0], str):
        return [bytes.fromhex(x) for x in a]
    return a


def answer(op: str, out: Any) -> Any:
    if op == "prepare_store" and out is not None:
        return {
            "keys_to_store": [k.hex() for k in out.keys_to_store],
            "chunk_ids": list(out.chunk_ids),
            "evicted_keys": [k.hex() for k in out.evicted_keys],
        }
    if op == "take_events":
        return [[[k.hex() for k in e.keys], e.removed, e.medium, e.metadata_only] for e in out]
    return out


def test_streams_cover_the_cases() -> None:
    cfgs = [s["config"] for s in STREAMS]
    assert {(c["cache_policy"], c["store_threshold"]) for c in cfgs} == {
        ("lru", 1),
        ("lru", 2),
        ("arc", 1),
        ("arc", 2),
    }
    calls = [c for s in STREAMS for c in s["calls"]]
    stores = [c for c in calls if c[0] == "prepare_store"]
    assert any(c[2] is None for c in stores), "no refused store"
    assert any(c[2] and c[2]["evicted_keys"] for c in stores), "no eviction"
    assert any(c[0] == "prepare_load" for c in calls)
    assert any(c[0] == "lookup_prefix" and c[2] is None for c in calls), "no pending lookup"


@pytest.mark.parametrize("i", range(len(STREAMS)))
def test_replay_matches_vllm(i: int) -> None:
    s = STREAMS[i]
    c = s["config"]
    m = prefixcache.CpuOffloadManager(
        c["num_chunks"],
        cache_policy=c["cache_policy"],
        store_threshold=c["store_threshold"],
        max_tracker_size=c["max_tracker_size"],
        enable_events=True,
    )
    for n, (op, args, want) in enumerate(s["calls"]):
        got = answer(op, getattr(m, op)(*[arg(a) for a in args]))
        assert got == want, (n, op, args)
        m.check_invariants()
