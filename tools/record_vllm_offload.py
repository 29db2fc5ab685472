"""Record vLLM 0.33's CPUOffloadingManager on random call streams.

Local tool, never part of tests or CI: it needs the real vLLM (the anchors venv,
docs/ANCHORS.md). It writes tests/data/vllm_offload_streams.jsonl, one stream a line:
the manager's configuration and every call with vLLM's answer; tests/test_offload_vectors.py
replays them on prefixcache.CpuOffloadManager.

    "$ANCHORS_VENV"/bin/python tools/record_vllm_offload.py --streams 48

Streams are drawn as the OffloadingConnector's scheduler side drives the manager: a
request gets its key positions (end token of each block), looks its blocks up after a
GPU hit of a few blocks, loads the hit (the load stays in flight for a while), offers
its computed blocks for storing in one or two batches, completes stores (now and then
as failures) and finishes; several requests overlap. Small capacities make evictions,
refused stores (None) and protected keys common; LRU and ARC, store thresholds 1 and 2
with a small tracker. ``Driver`` is shared with tools/vllm_offload_check.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Call = list[Any]  # [op, args, answer]


def key_of(path: tuple[int, ...]) -> bytes:
    """An 8-byte block hash for a node of the prefix tree (shared prefixes share keys)."""
    return hashlib.sha256(repr(path).encode()).digest()[:8]


class VllmSide:
    """vLLM's manager behind the call names of prefixcache.CpuOffloadManager."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self._ctx_cls = ReqContext
        self._key = lambda k: make_offload_key(k, 0)
        self.m = CPUOffloadingManager(
            cfg["num_chunks"],
            cache_policy=cfg["cache_policy"],
            enable_events=True,
            store_threshold=cfg["store_threshold"],
            max_tracker_size=cfg["max_tracker_size"],
        )
        self.ctx: dict[int, Any] = {}

    def _c(self, rid: int) -> Any:
        if rid not in self.ctx:
            self.ctx[rid] = self._ctx_cls(req_id=str(rid))
        return self.ctx[rid]

    def on_new_request(self, rid: int) -> None:
        self.m.on_new_request(self._c(rid))

    def set_offload_key_positions(self, rid: int, keys: list[bytes], ends: list[int]) -> None:
        c = self._c(rid)
        for k, e in zip(keys, ends, strict=True):
            c.set_offload_key_position(self._key(k), e)

    def lookup(self, key: bytes) -> str:
        return str(self.m.lookup(self._key(key), self._c(-1)).name)

    def lookup_prefix(self, keys: list[bytes]) -> int | None:
        # OffloadingConnectorScheduler._maximal_prefix_lookup (no RETRY from this manager)
        n, pending = 0, False
        for k in keys:
            r = self.m.lookup(self._key(k), self._c(-1)).name
            if r == "MISS":
                break
            n += 1
            pending |= r == "HIT_PENDING"
        return None if pending else n

    def prepare_load(self, rid: int, keys: list[bytes]) -> list[int]:
        spec = self.m.prepare_load([self._key(k) for k in keys], self._c(rid))
        return [int(x) for x in spec.block_ids]

    def touch(self, rid: int, keys: list[bytes]) -> None:
        self.m.touch([self._key(k) for k in keys], self._c(rid))

    def complete_load(self, rid: int, keys: list[bytes]) -> None:
        self.m.complete_load([self._key(k) for k in keys], self._c(rid))

    def prepare_store(self, rid: int, keys: list[bytes]) -> dict[str, Any] | None:
        out = self.m.prepare_store([self._key(k) for k in keys], self._c(rid))
        if out is None:
            return None
        return {
            "keys_to_store": [k[:-4].hex() for k in out.keys_to_store],
            "chunk_ids": [int(x) for x in out.store_spec.block_ids],
            "evicted_keys": [k[:-4].hex() for k in out.evicted_keys],
        }

    def complete_store(self, rid: int, keys: list[bytes], success: bool) -> None:
        self.m.complete_store([self._key(k) for k in keys], self._c(rid), success)

    def on_request_finished(self, rid: int) -> None:
        self.m.on_request_finished(self._c(rid))
        del self.ctx[rid]

    def reset_cache(self) -> None:
        self.m.reset_cache()

    def take_events(self) -> list[list[Any]]:
        return [
            [[k[:-4].hex() for k in e.keys], e.removed, e.medium.value, e.metadata_only]
            for e in self.m.take_events()
        ]


def answer_json(op: str, out: Any) -> Any:
    """A call's answer as JSON (what the stream file stores and the replay compares)."""
    if op == "prepare_store" and out is not None and not isinstance(out, dict):
        return {
            "keys_to_store": [k.hex() for k in out.keys_to_store],
            "chunk_ids": [int(x) for x in out.chunk_ids],
            "evicted_keys": [k.hex() for k in out.evicted_keys],
        }
    if op == "take_events" and out and not isinstance(out[0], list):
        return [[[k.hex() for k in e.keys], e.removed, e.medium, e.metadata_only] for e in out]
    if op == "prepare_load":
        return [int(x) for x in out]
    return out


def config(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "cache_policy": ("lru", "arc")[i % 2],
        "store_threshold": (1, 2)[(i // 2) % 2],
        "num_chunks": rng.randint(1, 12),
        "max_tracker_size": rng.choice((4, 8, 64)),
    }


class Driver:
    """Draws one stream and runs it on ``side``; ``call(op, args, answer)`` sees each
    call (the recorder stores it, the checker compares with the other side)."""

    def __init__(self, rng: random.Random, side: Any, call: Callable[[str, list[Any], Any], None]):
        self.rng, self.side, self.call = rng, side, call
        self.next_rid = 0
        self.active: dict[int, dict[str, Any]] = {}
        self.loads: list[tuple[int, list[bytes]]] = []
        self.stores: list[tuple[int, list[bytes]]] = []

    def do(self, op: str, *args: Any) -> Any:
        out = getattr(self.side, op)(*args)
        shown = [
            a.hex()
            if isinstance(a, bytes)
            else [x.hex() for x in a]
            if isinstance(a, list) and a and isinstance(a[0], bytes)
            else a
            for a in args
        ]
        self.call(op, shown, answer_json(op, out))
        return out

    def new_request(self) -> None:
        rng = self.rng
        rid = self.next_rid
        self.next_rid += 1
        branch = rng.randint(0, 2)
        n = rng.randint(1, 10)
        path = [(branch, rng.randint(0, 1) if j > 2 else 0) for j in range(n)]
        keys = [key_of(tuple(path[: j + 1])) for j in range(n)]
        self.do("on_new_request", rid)
        self.do("set_offload_key_positions", rid, keys, [(j + 1) * 16 for j in range(n)])
        self.active[rid] = {"keys": keys, "stage": 0}

    def advance(self, rid: int) -> None:
        rng, req = self.rng, self.active[rid]
        keys: list[bytes] = req["keys"]
        stage = req["stage"]
        req["stage"] += 1
        if stage == 0:  # lookup after a GPU hit of a few blocks, then load the hit
            gpu = rng.randint(0, min(2, len(keys)))
            hit = self.do("lookup_prefix", keys[gpu:])
            req["stored_from"] = 0
            if hit:
                got = keys[gpu : gpu + hit]
                self.do("prepare_load", rid, got)
                self.loads.append((rid, got))
                req["stored_from"] = gpu + hit
        elif stage in (1, 2):  # computed blocks offered for storing
            lo = req["stored_from"] if stage == 1 else rng.randint(0, len(keys))
            hi = rng.randint(lo, len(keys))
            if hi > lo:
                out = self.do("prepare_store", rid, keys[lo:hi])
                if out is not None:
                    ks = out["keys_to_store"] if isinstance(out, dict) else out.keys_to_store
                    ks = [bytes.fromhex(k) if isinstance(k, str) else k for k in ks]
                    if ks:
                        self.stores.append((rid, ks))
        elif stage == 3 and rng.random() < 0.3:
            a = rng.randint(0, len(keys))
            self.do("touch", rid, keys[a : rng.randint(a, len(keys))])
        else:
            self.do("on_request_finished", rid)
            del self.active[rid]

    def step(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.2 or not self.active:
            if len(self.active) < 4:
                self.new_request()
            else:
                self.advance(rng.choice(list(self.active)))
        elif r < 0.55:
            self.advance(rng.choice(list(self.active)))
        elif r < 0.7 and self.loads:
            rid, ks = self.loads.pop(rng.randrange(len(self.loads)))
            self.do("complete_load", rid, ks)
        elif r < 0.85 and self.stores:
            rid, ks = self.stores.pop(rng.randrange(len(self.stores)))
            self.do("complete_store", rid, ks, rng.random() < 0.9)
        elif r < 0.93:
            k = key_of(tuple((rng.randint(0, 2), 0) for _ in range(rng.randint(1, 4))))
            self.do("lookup", k)
        elif r < 0.995:
            self.do("take_events")
        else:
            # The connector never completes jobs issued before a reset.
            self.do("reset_cache")
            self.loads.clear()
            self.stores.clear()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.do("take_events")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=48)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    here = Path(__file__).resolve().parent.parent
    ap.add_argument("--out", type=Path, default=here / "tests/data/vllm_offload_streams.jsonl")
    a = ap.parse_args(argv)
    lines = []
    for i in range(a.streams):
        rng = random.Random(a.seed * 100_003 + i)
        cfg = config(rng, i)
        calls: list[Call] = []
        Driver(rng, VllmSide(cfg), lambda op, args, out, c=calls: c.append([op, args, out])).run(
            a.steps
        )
        lines.append(json.dumps({"config": cfg, "calls": calls}, separators=(",", ":")))
    a.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} streams, {a.out.stat().st_size} bytes -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
