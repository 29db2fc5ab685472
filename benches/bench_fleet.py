"""Fleet index benchmarks (``KvIndex`` embedded, ``RedisKvIndex`` on loopback).

- apply: vLLM-shaped frames (``[topic, seq, msgpack [ts, events, dp_rank]]``) for 64
  workers: each step a ``BlockStored`` of 16 blocks with their 256 token ids, then the 16
  blocks removed one ``BlockRemoved`` per hash as vLLM publishes them; figure: block events
  applied per second (stored + removed hashes), decode included.
- query: the longest prefix of a 144-block request (a 128-block shared system prompt + 16
  unique blocks) over 64 workers holding random prefixes of 8 system prompts.
- Dynamo's op definition (``PREFIXCACHE_MOONCAKE_TRACE`` = a Mooncake trace JSONL): each
  trace line is a request's block list; events = a store of its not-yet-cached suffix and a
  removal of the last 25% of it (as Dynamo's ``kv_indexer`` benchmark builds them), then
  requests = one longest-prefix query per line; ops/s of each.

``pytest benches/bench_fleet.py`` times them with pytest-benchmark (Redis ones need
``PREFIXCACHE_REDIS_URL`` or a ``redis-server`` binary); ``python benches/bench_fleet.py``
prints the figures of docs/BENCHMARKS.md ("Fleet index").
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from prefixcache import KvIndex

N_WORKERS = 64
BLOCK = 16
N_SYSTEM = 8
SYSTEM_BLOCKS = 128
UNIQUE_BLOCKS = 16
STEPS_PER_WORKER = 40


def _rng_hashes(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def apply_stream(
    n_workers: int = N_WORKERS, steps: int = STEPS_PER_WORKER, seed: int = 0
) -> tuple[list[tuple[str, list[bytes]]], int]:
    """(worker, frames) messages in publish order and their number of block events."""
    rng = random.Random(seed)
    msgs = []
    block_events = 0
    seqs = [0] * n_workers
    for step in range(steps):
        for w in range(n_workers):
            hashes = _rng_hashes(rng, UNIQUE_BLOCKS)
            tokens = list(range(step * 256, step * 256 + UNIQUE_BLOCKS * BLOCK))
            stored = {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": None,
                "token_ids": tokens,
                "block_size": BLOCK,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [None] * len(hashes),
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }
            removed = [
                {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}
                for h in reversed(hashes)
            ]
            for events in ([stored], removed):
                payload = msgpack.packb([1.7e9 + step, events, 0])
                msgs.append((f"w{w}", [f"kv@w{w}@m".encode(), seqs[w].to_bytes(8, "big"), payload]))
                seqs[w] += 1
            block_events += 2 * len(hashes)
    return msgs, block_events


def query_fleet(seed: int = 1) -> tuple[list[tuple[str, list[dict[str, Any]]]], list[list[int]]]:
    """Events that fill 64 workers, and 64 requests of 144 blocks."""
    rng = random.Random(seed)
    systems = [_rng_hashes(rng, SYSTEM_BLOCKS) for _ in range(N_SYSTEM)]
    fills = []
    for w in range(N_WORKERS):
        events = []
        for s in rng.sample(range(N_SYSTEM), 3):
            n = rng.randint(1, SYSTEM_BLOCKS)
            events.append(
                {"type": "BlockStored", "block_hashes": systems[s][:n], "block_size": BLOCK}
            )
            events.append(
                {"type": "BlockStored", "block_hashes": _rng_hashes(rng, 64), "block_size": BLOCK}
            )
        fills.append((f"w{w}", events))
    requests = [systems[i % N_SYSTEM] + _rng_hashes(rng, UNIQUE_BLOCKS) for i in range(64)]
    return fills, requests


def filled(index: Any) -> list[list[int]]:
    fills, requests = query_fleet()
    for w, events in fills:
        index.apply(w, events, now=time.time())
    return requests


def mooncake_ops(
    path: str, removal_fraction: float = 0.25
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Dynamo's kv_indexer benchmark events and requests from a Mooncake trace."""
    seen: set[int] = set()
    events = []
    requests = []
    for line in Path(path).read_text().splitlines():
        ids = json.loads(line)["hash_ids"]
        requests.append(ids)
        start = next((i for i, h in enumerate(ids) if h not in seen), None)
        if start is None:
            continue
        new = ids[start:]
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": new,
                "block_size": 512,
                "parent_block_hash": ids[start - 1] if start else None,
            }
        )
        keep = int(len(new) * (1 - removal_fraction))
        seen.update(new[:keep])
        if new[keep:]:
            events.append({"type": "BlockRemoved", "block_hashes": new[keep:][::-1]})
    return events, requests


# -- pytest-benchmark ----------------------------------------------------------------------


def test_embedded_apply_frames(benchmark: Any) -> None:
    msgs, _ = apply_stream(n_workers=16, steps=8)

    def run() -> None:
        ix = KvIndex()
        for w, frames in msgs:
            ix.apply_frames(w, frames, now=0.0)

    benchmark(run)


def _stored(hashes: np.ndarray, medium: str | None = None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "block_size": BLOCK, "medium": medium}


def _removed(hashes: np.ndarray, medium: str | None = None) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


Batches = list[tuple[str, list[dict[str, Any]]]]


def steady_stream(
    n_workers: int = 4,
    held: int = 187_500,
    steps: int = 2000,
    run: int = 64,
    seed: int = 0,
    media: tuple[str | None, ...] = (None,),
) -> tuple[KvIndex, Batches, int]:
    """An index whose workers hold ``held`` hashes each (a fleet replay's instances at
    3M tokens of 16-token blocks), and a cycle of batches that leaves it as it found it:
    ``steps`` batches each storing ``run`` new hashes on a worker and removing its ``run``
    oldest, then the same undone in reverse order. Hashes are numpy arrays, the shape of
    the fleet replay's events; the table outgrows the CPU caches, as in a whole-trace
    fleet replay. Every hash is stored on and removed from each of ``media`` (``("GPU",
    "CPU")``: a host tier holding a copy of every device block, as a tree with
    write-through does). Returns the index, the batches and their block events."""
    rng = np.random.default_rng(seed)
    ix = KvIndex()

    def stored(h: np.ndarray) -> list[dict[str, Any]]:
        return [_stored(h, m) for m in media]

    def removed(h: np.ndarray) -> list[dict[str, Any]]:
        return [_removed(h, m) for m in media]

    fifo: list[list[np.ndarray]] = []
    for w in range(n_workers):
        chunks = [rng.integers(0, 2**63, run, dtype=np.uint64) for _ in range(held // run)]
        for c in chunks:
            ix.apply(f"w{w}", stored(c), now=0.0)
        fifo.append(chunks)
    forward: list[tuple[str, np.ndarray, np.ndarray]] = []
    for step in range(steps):
        w = step % n_workers
        new = rng.integers(0, 2**63, run, dtype=np.uint64)
        old = fifo[w].pop(0)
        fifo[w].append(new)
        forward.append((f"w{w}", new, old))
    batches: Batches = [(w, stored(new) + removed(old)) for w, new, old in forward]
    batches += [(w, stored(old) + removed(new)) for w, new, old in reversed(forward)]
    return ix, batches, 2 * steps * 2 * run * len(media)


@pytest.mark.parametrize("media", [(None,), ("GPU", "CPU")], ids=["one_medium", "two_media"])
def test_embedded_apply_large_index(benchmark: Any, media: tuple[str | None, ...]) -> None:
    ix, batches, _ = steady_stream(media=media)
    before = ix.num_hashes

    def run() -> None:
        for w, events in batches:
            ix.apply(w, events, now=0.0)

    benchmark.pedantic(run, rounds=3, iterations=1)
    assert ix.num_hashes == before


def test_embedded_longest_prefix_144_blocks_64_workers(benchmark: Any) -> None:
    ix = KvIndex()
    reqs = [np.array(r, dtype=np.uint64) for r in filled(ix)]
    m = benchmark(ix.longest_prefix, reqs[0], now=0.0)
    assert len(m) == N_WORKERS


def test_embedded_top_k(benchmark: Any) -> None:
    ix = KvIndex()
    reqs = [np.array(r, dtype=np.uint64) for r in filled(ix)]
    benchmark(ix.top_k, reqs[0], 4, now=0.0)


@pytest.fixture(scope="module")
def redis_url() -> Any:
    url = os.environ.get("PREFIXCACHE_REDIS_URL")
    if url:
        yield url
        return
    if not (shutil.which("redis-server") or shutil.which("valkey-server")):
        pytest.skip("no Redis server")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fleet_support import RedisServer

    srv = RedisServer().start()
    yield srv.url
    srv.stop()


def test_redis_apply_many(benchmark: Any, redis_url: str) -> None:
    from prefixcache.fleet import RedisKvIndex

    msgs, _ = apply_stream(n_workers=8, steps=4)

    def run() -> None:
        ix = RedisKvIndex(redis_url, prefix="bench-" + uuid.uuid4().hex[:8])
        ix.apply_many(msgs, now=0.0)

    benchmark.pedantic(run, rounds=3)


def test_redis_longest_prefix(benchmark: Any, redis_url: str) -> None:
    from prefixcache.fleet import RedisKvIndex

    ix = RedisKvIndex(redis_url, prefix="bench-" + uuid.uuid4().hex[:8])
    reqs = filled(ix)
    benchmark(ix.longest_prefix, reqs[0], now=0.0)


# -- figures ------------------------------------------------------------------------------


def _best(f: Any, repeat: int = 5) -> float:
    """Best of ``repeat`` runs in thread CPU time: other processes sharing the cores
    (a busy build machine) do not count; the work, its cache misses included, does."""
    out = []
    for _ in range(repeat):
        t = time.thread_time()
        f()
        out.append(time.thread_time() - t)
    return min(out)


def main() -> None:
    msgs, block_events = apply_stream()

    def apply_all() -> None:
        ix = KvIndex()
        for w, frames in msgs:
            ix.apply_frames(w, frames, now=0.0)

    t = _best(apply_all)
    print(
        f"embedded apply_frames: {len(msgs)} messages, {block_events} block events: "
        f"{t * 1e3:.1f} ms = {block_events / t / 1e6:.2f} M block events/s "
        f"({t / len(msgs) * 1e6:.2f} us per message)"
    )

    for media in ((None,), ("GPU", "CPU")):
        big, batches, block_events = steady_stream(media=media)

        def apply_big(big: Any = big, batches: Batches = batches) -> None:
            for w, events in batches:
                big.apply(w, events, now=0.0)

        t = _best(apply_big, 3)
        print(
            f"embedded apply, 4 workers x 187,500 hashes held on {len(media)} medium(s): "
            f"{block_events} block events in {t * 1e3:.0f} ms = "
            f"{block_events / t / 1e6:.2f} M block events/s"
        )

    ix = KvIndex()
    reqs = filled(ix)
    arrs = [np.array(r, dtype=np.uint64) for r in reqs]
    for name, q in (("numpy uint64", arrs), ("list of int", reqs)):
        n = 20_000
        t = _best(lambda q=q, n=n: [ix.longest_prefix(q[i % 64], now=0.0) for i in range(n)], 3)
        print(f"embedded longest_prefix 144 blocks x 64 workers ({name}): {t / n * 1e6:.2f} us")
        t = _best(lambda q=q, n=n: [ix.top_k(q[i % 64], 4, now=0.0) for i in range(n)], 3)
        print(f"embedded top_k(4) ({name}): {t / n * 1e6:.2f} us")

    trace = os.environ.get("PREFIXCACHE_MOONCAKE_TRACE")
    if trace:
        events, requests = mooncake_ops(trace)

        def run_events() -> None:
            ix = KvIndex()
            for ev in events:
                ix.apply("w0", [ev], now=0.0)

        t = _best(run_events, 3)
        blocks = sum(len(e["block_hashes"]) for e in events)
        print(
            f"Dynamo op definition, {Path(trace).name}: {len(events)} events "
            f"({blocks} blocks) in {t * 1e3:.0f} ms = {len(events) / t:,.0f} event ops/s "
            f"({blocks / t / 1e6:.1f} M blocks/s), one Python call per event"
        )
        ix = KvIndex()
        for ev in events:
            ix.apply("w0", [ev], now=0.0)
        arrs = [np.array(r, dtype=np.uint64) for r in requests]
        t = _best(lambda: [ix.longest_prefix(a, now=0.0) for a in arrs], 3)
        nb = sum(len(r) for r in requests)
        print(
            f"  requests: {len(requests)} in {t * 1e3:.0f} ms = {len(requests) / t:,.0f} "
            f"request ops/s ({nb / t / 1e6:.1f} M blocks/s)"
        )

    url = os.environ.get("PREFIXCACHE_REDIS_URL")
    if url:
        redis_figures(url)


def _server_usec(ix: Any) -> float:
    """CPU microseconds the Redis server process has used (INFO cpu: user + system, its
    main thread included; commandstats would count wall time, preemption included)."""
    cpu = ix._r.info("cpu")
    return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6


def redis_figures(url: str) -> None:
    """Wall-clock figures, and the CPU each side spent (client thread CPU time, server
    process CPU time from INFO cpu): on a shared, busy machine wall time mostly measures
    waiting for a core; the CPU figures say what the work costs."""
    from prefixcache.fleet import RedisKvIndex

    msgs, block_events = apply_stream(n_workers=64, steps=8)
    ix = RedisKvIndex(url, prefix="bench-" + uuid.uuid4().hex[:8])
    s0, c0, w0 = _server_usec(ix), time.thread_time(), time.perf_counter()
    for i in range(0, len(msgs), 256):
        ix.apply_many(msgs[i : i + 256], now=0.0)
    w, c, srv = time.perf_counter() - w0, time.thread_time() - c0, (_server_usec(ix) - s0) / 1e6
    print(
        f"redis apply_many (256 messages per pipeline), {block_events} block events: "
        f"wall {block_events / w / 1e3:.0f}k/s; client CPU {c / block_events * 1e6:.2f} us, "
        f"server CPU {srv / block_events * 1e6:.2f} us per block event "
        f"(= {block_events / max(c, srv) / 1e3:.0f}k/s with one core each)"
    )
    ix2 = RedisKvIndex(url, prefix="bench-" + uuid.uuid4().hex[:8])
    few = msgs[: len(msgs) // 4]
    s0, c0, w0 = _server_usec(ix2), time.thread_time(), time.perf_counter()
    for wk, frames in few:
        ix2.apply_frames(wk, frames, now=0.0)
    w, c, srv = time.perf_counter() - w0, time.thread_time() - c0, (_server_usec(ix2) - s0) / 1e6
    n = block_events / 4
    print(
        f"redis apply_frames (one round trip per message): wall {n / w / 1e3:.0f}k/s; "
        f"client CPU {c / n * 1e6:.2f} us, server CPU {srv / n * 1e6:.2f} us per block event"
    )
    ix3 = RedisKvIndex(url, prefix="bench-" + uuid.uuid4().hex[:8])
    reqs = filled(ix3)
    lat = []
    s0, c0 = _server_usec(ix3), time.thread_time()
    n = 5000
    for i in range(n):
        t0 = time.perf_counter()
        ix3.longest_prefix(reqs[i % 64], now=0.0)
        lat.append(time.perf_counter() - t0)
    c, srv = time.thread_time() - c0, (_server_usec(ix3) - s0) / 1e6
    lat.sort()
    print(
        f"redis longest_prefix 144 blocks x 64 workers: wall p50 "
        f"{statistics.median(lat) * 1e6:.0f} us, p99 {lat[int(n * 0.99)] * 1e6:.0f} us; "
        f"client CPU {c / n * 1e6:.0f} us, server CPU {srv / n * 1e6:.0f} us per query"
    )


if __name__ == "__main__":
    main()
