"""Check prefixcache.KVCacheManager against vLLM 0.33's own KVCacheManager on random streams.

Local tool, never part of tests or CI: it needs the real vLLM (build the venv with
tools/anchors/setup_engines.sh, docs/ANCHORS.md) and a built prefixcache importable from
it, e.g.

    PYTHONPATH=python "$ANCHORS_VENV"/bin/python tools/vllm_check.py --streams 200

Each stream draws a pool size, block size, optional sliding window and a sequence of
operations (admission with lookahead, chunked prefill, decode, free, preemption, reset)
and drives both managers the same way, as vLLM's scheduler drives its manager. After
every step: hit lengths, returned blocks, every request's block ids, the free-queue order,
the KV events and the prefix-cache stats must be equal. Some streams run with prefix
caching off, some requests carry a LoRA adapter and/or a cache salt (as extra keys), and
single blocks are evicted from the cache now and then.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import torch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

import prefixcache
from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored


def convert_event(ev: Any) -> Any:
    name = type(ev).__name__
    if name == "BlockStored":
        return BlockStored(
            list(ev.block_hashes),
            ev.parent_block_hash,
            list(ev.token_ids),
            ev.block_size,
            ev.lora_id,
            ev.medium,
            ev.lora_name,
            None if ev.extra_keys is None else list(ev.extra_keys),
            ev.group_idx,
            ev.kv_cache_spec_kind,
            ev.kv_cache_spec_sliding_window,
        )
    if name == "BlockRemoved":
        return BlockRemoved(list(ev.block_hashes), ev.medium, ev.group_idx)
    return AllBlocksCleared()


def ids_of(blocks: Any) -> list[int]:
    return [] if blocks is None else [b for group in blocks.get_block_ids() for b in group]


class Pair:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.bs = rng.choice([1, 2, 4, 16])
        self.n = rng.randint(2, 40)
        self.window = rng.choice([None, None, rng.randint(2, 40)])
        self.caching = rng.random() > 0.15
        dtype = torch.float32
        if self.window is None:
            spec: Any = FullAttentionSpec(
                block_size=self.bs, num_kv_heads=1, head_size=1, dtype=dtype
            )
        else:
            spec = SlidingWindowSpec(
                block_size=self.bs,
                num_kv_heads=1,
                head_size=1,
                dtype=dtype,
                sliding_window=self.window,
            )
        cfg = KVCacheConfig(
            num_blocks=self.n,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
        )
        self.v = VllmManager(
            cfg,
            max_model_len=1 << 20,
            scheduler_block_size=self.bs,
            hash_block_size=self.bs,
            enable_caching=self.caching,
            enable_kv_cache_events=True,
            log_stats=True,
        )
        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        self.hasher = get_request_block_hasher(self.bs, fn)
        self.p = prefixcache.KVCacheManager(
            self.n,
            block_size=self.bs,
            sliding_window=self.window,
            enable_kv_cache_events=True,
            enable_caching=self.caching,
        )
        self.reqs: dict[int, Request] = {}
        self.next_id = 0
        self.steps = 0

    def prompt(self) -> list[int]:
        bs, rng = self.bs, self.rng
        prefix = list(range(1000 * rng.randint(1, 3), 1000 * 4))[: rng.randint(0, 3 * bs + 1)]
        out = prefix + [rng.randint(0, 50) for _ in range(rng.randint(0, 2 * bs))]
        return out or [1]

    def schedule(self, rid: int, num_new: int, look: int) -> None:
        """One allocate_slots on both, as the scheduler does (lookup first if waiting)."""
        r = self.reqs[rid]
        waiting = r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        hit_blocks, n_hit = None, 0
        if waiting:
            vb, vhit, _ = self.v.get_computed_blocks(r)
            pb, phit = self.p.get_computed_blocks(rid)
            assert vhit == phit and ids_of(vb) == pb.tolist(), (vhit, phit, ids_of(vb), pb)
            hit_blocks, n_hit = vb, vhit
            num_new = min(num_new, r.num_tokens - n_hit)
            if num_new == 0 and n_hit == 0:
                return
        got_v = self.v.allocate_slots(r, num_new, n_hit, hit_blocks if n_hit else None, look)
        got_p = self.p.allocate_slots(rid, num_new, n_hit, pb if n_hit else None, look)
        assert (got_v is None) == (got_p is None)
        if got_v is None:
            return
        assert ids_of(got_v) == got_p.tolist(), (ids_of(got_v), got_p)
        if waiting:
            self.v.record_prefix_cache_stats(r, n_hit)
            r.status = RequestStatus.RUNNING
        r.num_computed_tokens = min(r.num_computed_tokens + n_hit + num_new, r.num_tokens)

    def step(self) -> None:
        rng, bs = self.rng, self.bs
        live = sorted(self.reqs)
        op = rng.choice(
            ["add", "add"]
            + (["step", "decode", "free", "preempt"] if live else [])
            + ["reset", "evict"]
        )
        if op == "add":
            rid, self.next_id = self.next_id, self.next_id + 1
            toks = self.prompt()
            lora = rng.choice([None, None, ("ad1", 1, "/p1"), ("ad2", 2, "/p2")])
            salt = rng.choice([None, None, "s1", "s2"])
            self.reqs[rid] = Request(
                str(rid),
                toks,
                SamplingParams(max_tokens=64),
                None,
                block_hasher=self.hasher,
                lora_request=None if lora is None else LoRARequest(lora[0], lora[1], lora[2]),
                cache_salt=salt,
            )
            # The same namespaces as vLLM's extra keys: LoRA on every block, salt on block 0.
            base = () if lora is None else (("lora", lora[0], lora[2]),)
            first = (*base, ("cache_salt", salt)) if salt else base
            self.p.add_request(
                rid,
                toks,
                extra_keys=[first or None],
                default_extra_keys=base or None,
                lora_id=None if lora is None else lora[1],
                lora_name=None if lora is None else lora[0],
            )
            self.schedule(rid, rng.randint(1, len(toks)), rng.randint(0, 2 * bs))
        elif op == "step":
            rid = rng.choice(live)
            r = self.reqs[rid]
            left = r.num_tokens - r.num_computed_tokens
            if left > 0:
                self.schedule(rid, rng.randint(1, left), rng.randint(0, bs))
        elif op == "decode":
            rid = rng.choice(live)
            r = self.reqs[rid]
            if r.status == RequestStatus.RUNNING and r.num_computed_tokens == r.num_tokens:
                toks = [rng.randint(0, 50) for _ in range(rng.randint(1, bs + 1))]
                r.append_output_token_ids(toks)
                self.p.append_tokens(rid, toks)
                self.schedule(rid, len(toks), rng.randint(0, bs))
        elif op == "free":
            rid = rng.choice(live)
            self.v.free(self.reqs.pop(rid))
            self.p.free(rid)
        elif op == "preempt":
            rid = rng.choice(live)
            r = self.reqs[rid]
            if r.status == RequestStatus.RUNNING:
                self.v.free(r)
                r.status = RequestStatus.PREEMPTED
                r.num_computed_tokens = 0
                r.num_preemptions += 1
                self.p.preempt(rid)
        elif op == "evict":
            b = rng.randint(0, self.n - 1)
            self.v.evict_blocks({b})
            self.p.evict_blocks([b])
        else:
            assert self.v.reset_prefix_cache() == self.p.reset_prefix_cache()
        self.compare()

    def compare(self) -> None:
        free_v = [b.block_id for b in self.v.block_pool.free_block_queue.get_all_free_blocks()]
        assert free_v == self.p.free_block_ids().tolist(), (free_v, self.p.free_block_ids())
        ev_v = [convert_event(e) for e in self.v.take_events()]
        ev_p = self.p.take_events()
        assert ev_v == ev_p, (ev_v, ev_p)
        for rid in self.reqs:
            assert ids_of(self.v.get_blocks(str(rid))) == self.p.block_ids(rid).tolist()
        s = self.v.prefix_cache_stats
        want = {
            "requests": s.requests,
            "queries": s.queries,
            "hits": s.hits,
            "preempted_requests": s.preempted_requests,
            "preempted_queries": s.preempted_queries,
            "preempted_hits": s.preempted_hits,
            "reset": s.reset,
        }
        assert want == self.p.stats, (want, self.p.stats)
        self.p.check_invariants()
        self.steps += 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    total = 0
    kinds = {"full": 0, "window": 0, "caching off": 0}
    for s in range(args.streams):
        pair = Pair(random.Random(args.seed * 100003 + s))
        kinds["full" if pair.window is None else "window"] += 1
        kinds["caching off"] += not pair.caching
        for _ in range(args.steps):
            try:
                pair.step()
            except AssertionError:
                print(
                    f"stream {s} (bs={pair.bs}, n={pair.n}, window={pair.window}) diverged "
                    f"after {pair.steps} steps",
                    file=sys.stderr,
                )
                raise
        total += pair.steps
    print(f"ok: {args.streams} streams ({kinds}), {total} steps identical to vLLM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
