"""Check prefixcache.CpuOffloadManager (and its plain-Python reference) against vLLM 0.33's
CPUOffloadingManager side by side on many random call streams.

Local tool, never part of tests or CI: it needs the real vLLM (docs/ANCHORS.md) and a
built prefixcache importable from it, e.g.

    PYTHONPATH=python "$ANCHORS_VENV"/bin/python tools/vllm_offload_check.py --streams 2000

Streams are drawn by tools/record_vllm_offload.py's Driver (LRU and ARC, store
thresholds 1 and 2, small capacities, loads and stores in flight); every call's answer
(lookups, load chunk ids, prepare_store outputs or None, events) must be equal, and
our side's invariants hold after every call.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_vllm_offload import Driver, VllmSide, answer_json, config


class Mismatch(Exception):
    pass


class Pair:
    """Runs each call on vLLM and on ours; answers vLLM's after comparing."""

    def __init__(self, cfg: dict[str, Any], ours: Any) -> None:
        self.vllm = VllmSide(cfg)
        self.ours = ours
        self.n = 0

    def __getattr__(self, op: str) -> Any:
        def call(*args: Any) -> Any:
            want = getattr(self.vllm, op)(*args)
            got = getattr(self.ours, op)(*args)
            self.ours.check_invariants()
            self.n += 1
            if answer_json(op, got) != answer_json(op, want):
                raise Mismatch(f"{op}{args!r}: vLLM {want!r}, ours {answer_json(op, got)!r}")
            return want

        return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--impl", choices=("core", "reference"), default="core")
    a = ap.parse_args(argv)
    if a.impl == "core":
        from prefixcache import CpuOffloadManager as Ours
    else:
        from prefixcache.reference.offload import CpuOffloadManager as Ours  # type: ignore[assignment]
    calls = bad = 0
    for i in range(a.streams):
        rng = random.Random(a.seed * 1_000_003 + i)
        cfg = config(rng, i)
        ours = Ours(
            cfg["num_chunks"],
            cache_policy=cfg["cache_policy"],
            store_threshold=cfg["store_threshold"],
            max_tracker_size=cfg["max_tracker_size"],
            enable_events=True,
        )
        pair = Pair(cfg, ours)
        try:
            Driver(rng, pair, lambda op, args, out: None).run(a.steps)
        except Mismatch as e:
            bad += 1
            if bad <= 5:
                print(f"stream {i} {cfg}: {e}", file=sys.stderr)
        calls += pair.n
    print(f"{a.impl}: {a.streams} streams, {calls} calls, {bad} streams differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
