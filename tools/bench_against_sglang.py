"""Time SGLang 0.5.23's classic RadixCache and prefixcache's RadixCache side by side on
the radix benchmark workload (benches/workloads.py: 2000 prompts of 2304 tokens, 8 shared
2048-token system prompts), in one process. Local only (never in tests or CI):

    bash tools/anchors/setup_engines.sh                      # once, ~10 GB (docs/ANCHORS.md)
    maturin develop --release                                # builds python/prefixcache/_core*.so
    "$ANCHORS_VENV"/bin/python tools/bench_against_sglang.py [--rounds 5]

SGLang is driven the way its scheduler drives it: RadixKey over array('q'), values as
int64 torch tensors prepared beforehand, a stub allocator that drops freed indices.
Figures are the best of `--rounds` passes, per call.
"""

from __future__ import annotations

import argparse
import sys
import time
from array import array
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from benches.workloads import shared_prefix_prompts  # noqa: E402
from prefixcache import RadixCache  # noqa: E402


class DropAllocator:
    device = torch.device("cpu")
    page_size = 1

    def free(self, idx: Any) -> None:
        pass

    def free_segment(self, idx: Any, start_pos: int = 0) -> None:
        pass


def sglang_tree() -> Any:
    return SGLangRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=DropAllocator(),
            page_size=1,
            eviction_policy="lru",
        )
    )


def best(fn: Any, setup: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        arg = setup()
        t = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    prompts = shared_prefix_prompts()
    n = len(prompts)
    keys = [array("q", p.astype("int64").tobytes()) for p in prompts]
    values = [torch.from_numpy(p.astype("int64")) for p in prompts]

    def sg_fill(t: Any) -> Any:
        for k, v in zip(keys, values, strict=True):
            t.insert(InsertParams(key=RadixKey(k), value=v))
        return t

    def pc_fill(t: Any) -> Any:
        for p in prompts:
            t.insert(p)
        return t

    rows = []
    for name, new, fill, match, match_idx, evict in [
        (
            "SGLang 0.5.23 RadixCache (classic)",
            sglang_tree,
            sg_fill,
            lambda t: sum(
                t.match_prefix(MatchPrefixParams(key=RadixKey(k))).device_prefix_len for k in keys
            ),
            lambda t: sum(
                len(t.path_device_indices(t.match_prefix(MatchPrefixParams(key=RadixKey(k))).last_device_node))
                for k in keys
            ),
            lambda t: t.evict(EvictParams(num_tokens=10**12)),
        ),
        (
            "prefixcache RadixCache",
            RadixCache,
            pc_fill,
            lambda t: sum(t.match_prefix(p).length for p in prompts),
            lambda t: sum(len(t.match_prefix(p).indices) for p in prompts),
            lambda t: t.evict(10**12),
        ),
    ]:
        ins = best(fill, new, args.rounds) / n
        tree = fill(new())
        mat = best(match, lambda tree=tree: tree, args.rounds) / n
        mat_idx = best(match_idx, lambda tree=tree: tree, args.rounds) / n
        ev = best(evict, lambda new=new, fill=fill: fill(new()), args.rounds)
        rows.append((name, ins, mat, mat_idx, ev))
    head = ("insert/call", "match/call", "match+indices/call", "evict-all")
    print(f"{'':38s} {head[0]:>12s} {head[1]:>12s} {head[2]:>19s} {head[3]:>10s}")
    for name, ins, mat, mat_idx, ev in rows:
        print(
            f"{name:38s} {ins * 1e6:10.2f}us {mat * 1e6:10.2f}us {mat_idx * 1e6:17.2f}us"
            f" {ev * 1e3:8.2f}ms"
        )
    sg, pc = rows
    ratios = [f"{a / b:.0f}x" for a, b in zip(sg[1:], pc[1:], strict=True)]
    print(f"{'speed-up':38s} {ratios[0]:>12s} {ratios[1]:>12s} {ratios[2]:>19s} {ratios[3]:>10s}")


if __name__ == "__main__":
    main()
