"""prefixcache side by side with the engines, per input form, in one process: SGLang
0.5.23's classic RadixCache and its Rust TreeCore, vLLM 0.33's block-hash chain, on the
radix benchmark workload (benches/workloads.py: 2000 prompts of 2304 tokens, 8 shared
2048-token system prompts). Local only (never in tests or CI); run with the anchors venv
(docs/ANCHORS.md), whose location is given by ANCHORS_VENV:

    bash tools/anchors/setup_engines.sh          # once, ~10 GB (docs/ANCHORS.md)
    maturin develop --release                    # builds python/prefixcache/_core*.so
    "$ANCHORS_VENV/bin/python" tools/bench_against_sglang.py [--rounds 3]

SGLang is driven the way its scheduler drives it: keys as array('q'), values as int64
torch tensors prepared beforehand, a stub allocator that drops freed indices. The Rust
TreeCore is timed at its binding (begin_insert/end_insert, match_prefix): a lower bound
of what SGLang's scheduler pays through its adapter. vLLM's chain is
`hash_block_tokens(sha256, parent, tokens[i:i+16], None)` per block over the request's
token list, as `get_request_block_hasher` does. prefixcache gets the same tokens in each
form a caller may hold (values in the same form). Figures are the best of `--rounds`
passes, per call, in CPU time of the thread (`--clock wall` for wall time); p50/p99 are
per call over one pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benches.workloads import shared_prefix_prompts  # noqa: E402
from prefixcache import BlockHasher, KVCacheManager, RadixCache, TokenBuffer  # noqa: E402

# The clock: CPU time of this thread by default. On a shared machine a process waits for
# a CPU for whole scheduler slices (milliseconds), which wall time counts and CPU time
# does not (tools/fresh_process_outliers.py); `--clock wall` for an idle machine.
CLOCK_NS: Callable[[], int] = time.thread_time_ns


def best(fn: Callable[[Any], Any], setup: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        arg = setup()
        t = CLOCK_NS()
        fn(arg)
        times.append(CLOCK_NS() - t)
    return min(times) / 1e9


def per_call(fn: Callable[[Any], Any], items: list[Any]) -> tuple[float, float]:
    """(p50, p99) of one call per item, in seconds."""
    times = []
    for x in items:
        t = CLOCK_NS()
        fn(x)
        times.append(CLOCK_NS() - t)
    times.sort()
    return statistics.median(times) / 1e9, times[int(len(times) * 0.99)] / 1e9


# ---- SGLang --------------------------------------------------------------------------


def sglang_classic() -> tuple[Callable[[], Any], Callable[..., Any], Callable[..., Any]]:
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache
    from sglang.srt.mem_cache.radix_cache import RadixKey

    class DropAllocator:
        device = torch.device("cpu")
        page_size = 1

        def free(self, idx: Any) -> None:
            pass

        def free_segment(self, idx: Any, start_pos: int = 0) -> None:
            pass

    def new() -> Any:
        return SGLangRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=DropAllocator(),
                page_size=1,
                eviction_policy="lru",
            )
        )

    def insert(t: Any, k: Any, v: Any) -> None:
        t.insert(InsertParams(key=RadixKey(k), value=v))

    def match(t: Any, k: Any) -> int:
        return int(t.match_prefix(MatchPrefixParams(key=RadixKey(k))).device_prefix_len)

    return new, insert, match


def sglang_tree_core() -> tuple[Callable[[], Any], Callable[..., Any], Callable[..., Any]]:
    from sglang.srt.mem_cache.rust_tree_core.extension import bindings as b
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    def new() -> Any:
        return b.RustUnifiedTreeCoreBinding(
            b.TreeCoreInitParamsBinding(
                eviction_policy="lru",
                slru_protected_threshold=2,
                tlru_tail_budget=0,
                tlru_float_config=None,
                page_size=1,
                is_write_back=False,
                enable_hicache=False,
                write_through_threshold=256,
                device="cpu",
                swa_sliding_window_size=None,
                swa_req_ring=False,
                enable_kv_cache_events=False,
                dynamo_kv_event_format=False,
                mamba_cache_chunk_size=None,
                mamba_max_states_per_path=None,
            ),
            [int(ComponentType.FULL)],
        )

    def insert(t: Any, k: Any, v: Any) -> None:
        t.begin_insert(
            b.InsertParamsBinding(
                key=k,
                value=v,
                extra_key=None,
                cache_salt=None,
                session_id=None,
                mamba_value=None,
                prev_prefix_len=0,
                swa_evicted_seqlen=0,
                swa_branching_seqlen=None,
                inserted_len=0,
                priority=0,
                track_adopted_ranges=False,
                rotation_base=None,
            )
        )
        while t.has_ongoing_insert():
            t.resume_insert()
        t.end_insert()

    def match(t: Any, k: Any) -> Any:
        return t.match_prefix(b.MatchParamsBinding(key=k, extra_key=None, cache_salt=None))

    return new, insert, match


# ---- vLLM ----------------------------------------------------------------------------


def vllm_chain() -> Callable[[list[int]], list[bytes]]:
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as ku

    ku.init_none_hash(sha256)

    def chain(tokens: list[int]) -> list[bytes]:
        parent = None
        out = []
        for i in range(0, len(tokens) - 15, 16):
            parent = ku.hash_block_tokens(sha256, parent, tokens[i : i + 16], None)
            out.append(parent)
        return out

    return chain


# ---- forms ---------------------------------------------------------------------------


def forms(prompts: list[np.ndarray]) -> dict[str, list[Any]]:
    return {
        "list": [p.tolist() for p in prompts],
        "tuple": [tuple(p.tolist()) for p in prompts],
        "array('q')": [array("q", p.astype(np.int64).tobytes()) for p in prompts],
        "numpy int64": [p.astype(np.int64) for p in prompts],
        "numpy uint32": list(prompts),
        "torch int64": [torch.from_numpy(p.astype(np.int64)) for p in prompts],
        "TokenBuffer": [TokenBuffer(p) for p in prompts],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-engines", action="store_true", help="prefixcache only")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = ap.parse_args()
    global CLOCK_NS
    CLOCK_NS = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    prompts = shared_prefix_prompts()
    n = len(prompts)
    by_form = forms(prompts)
    keys = by_form["array('q')"]
    tensors = by_form["torch int64"]
    print(
        f"workload: {n} prompts x {len(prompts[0])} tokens; best of {args.rounds}; "
        f"{args.clock} time; "
        f"ANCHORS_VENV={os.environ.get('ANCHORS_VENV', '(unset)')}"
    )

    print("\n## RadixCache (us per call)")
    print(f"{'':34s} {'insert':>8s} {'match':>8s} {'ins p50':>8s} {'ins p99':>8s} {'mat p99':>8s}")
    engines: dict[str, tuple[float, float]] = {}
    if not args.skip_engines:
        for name, make in (
            ("SGLang classic, array('q')", sglang_classic),
            ("SGLang Rust TreeCore, array('q')", sglang_tree_core),
        ):
            new, insert, match = make()

            def fill(t: Any, insert: Any = insert) -> Any:
                for k, v in zip(keys, tensors, strict=True):
                    insert(t, k, v)
                return t

            ins = best(fill, new, args.rounds) / n
            tree = fill(new())
            mat = (
                best(
                    lambda t, match=match: [match(t, k) for k in keys],
                    lambda tree=tree: tree,
                    args.rounds,
                )
                / n
            )
            _, mp99 = per_call(lambda k, tree=tree, match=match: match(tree, k), keys)
            engines[name] = (ins, mat)
            print(f"{name:34s} {ins * 1e6:8.2f} {mat * 1e6:8.2f} {'':8s} {'':8s} {mp99 * 1e6:8.2f}")
    fastest = (
        min((v[0] for v in engines.values()), default=0.0),
        min((v[1] for v in engines.values()), default=0.0),
    )
    radix: dict[str, tuple[float, float]] = {}
    for form, xs in by_form.items():

        def fill(t: Any, xs: list[Any] = xs) -> Any:
            for x in xs:
                t.insert(x, values=x)
            return t

        ins = best(fill, RadixCache, args.rounds) / n
        tree = fill(RadixCache())
        assert tree.match_prefix(xs[0]).length == len(prompts[0])
        mat = (
            best(
                lambda t, xs=xs: [t.match_prefix(x) for x in xs],
                lambda tree=tree: tree,
                args.rounds,
            )
            / n
        )
        t2 = RadixCache()
        ip50, ip99 = per_call(lambda x, t2=t2: t2.insert(x, values=x), xs)
        _, mp99 = per_call(lambda x, tree=tree: tree.match_prefix(x), xs)
        radix[form] = (ins, mat)
        print(
            f"{'prefixcache, ' + form:34s} {ins * 1e6:8.2f} {mat * 1e6:8.2f} "
            f"{ip50 * 1e6:8.2f} {ip99 * 1e6:8.2f} {mp99 * 1e6:8.2f}"
        )
    if engines:
        print("speed-up over the faster SGLang tree (insert / match; targets 8x / 5x):")
        for form, (ins, mat) in radix.items():
            print(f"  {form:14s} {fastest[0] / ins:6.1f}x / {fastest[1] / mat:6.1f}x")
    u32 = radix["numpy uint32"]
    per_tok = len(prompts[0])
    print("over the uint32 path, ns per token (insert / match; target <= 2):")
    for form in ("list", "tuple"):
        ins, mat = radix[form]
        print(
            f"  {form:14s} {(ins - u32[0]) * 1e9 / per_tok:6.2f} / "
            f"{(mat - u32[1]) * 1e9 / per_tok:6.2f}"
        )

    print("\n## sha256 block hashes of one prompt (144 blocks of 16), us per prompt")
    sample = by_form["list"][:500]
    hasher = BlockHasher(16, "sha256")
    vllm_t = 0.0
    if not args.skip_engines:
        chain = vllm_chain()
        assert chain(sample[0]) == hasher.hash_blocks(sample[0]), "hashes differ from vLLM"
        vllm_t = best(lambda xs: [chain(x) for x in xs], lambda: sample, args.rounds) / 500
        print(f"{'vLLM 0.33 chain, list':34s} {vllm_t * 1e6:8.1f}")
    for form, xs in by_form.items():
        xs = xs[:500]
        t = (
            best(lambda xs: [hasher.hash_blocks(x) for x in xs], lambda xs=xs: xs, args.rounds)
            / 500
        )
        ratio = f"{vllm_t / t:6.1f}x vLLM" if vllm_t else ""
        print(f"{'prefixcache, ' + form:34s} {t * 1e6:8.1f} {ratio}")

    print("\n## KVCacheManager admit + finish (sha256, block 16), us per prompt; target 30")
    for form, xs in by_form.items():

        def run(m: Any, xs: list[Any] = xs) -> None:
            for i, x in enumerate(xs):
                m.admit(i, x)
                m.finish(i)

        t = best(run, lambda: KVCacheManager(num_blocks=40_000, block_size=16), args.rounds) / n
        print(f"{'prefixcache, ' + form:34s} {t * 1e6:8.1f}")


if __name__ == "__main__":
    main()
