"""Why some fresh processes time RadixCache much slower than others: runs the radix
benchmark workload (benches/workloads.py) in `--processes` fresh interpreters, one after
the other, and records per phase (fill the tree from empty, match every prompt, evict
all) the wall time, the CPU time of the thread, minor page faults and involuntary context
switches. Wall time well above CPU time means the process waited for a CPU (another
process ran); CPU time that varies with page faults means memory was being faulted in.

    python tools/fresh_process_outliers.py --processes 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, resource, sys, time
sys.path.insert(0, {repo!r})
from benches.workloads import shared_prefix_prompts
from prefixcache import RadixCache

prompts = shared_prefix_prompts()
gc_off = {gc_off!r}
if gc_off:
    gc.disable()

def phase(fn):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    w1, c1 = time.perf_counter(), time.thread_time()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {{"wall_ms": (w1 - w0) * 1e3, "cpu_ms": (c1 - c0) * 1e3,
             "minflt": r1.ru_minflt - r0.ru_minflt, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw}}

tree = RadixCache()
out = {{}}
out["insert"] = phase(lambda: [tree.insert(p) for p in prompts])
out["match"] = phase(lambda: [tree.match_prefix(p) for p in prompts])
out["evict_all"] = phase(lambda: tree.evict(tree.total_size()))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--gc-off", action="store_true", help="disable the cyclic GC in children")
    args = ap.parse_args()
    code = CHILD.format(repo=str(REPO), gc_off=args.gc_off)
    rows = []
    for _ in range(args.processes):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        rows.append(json.loads(r.stdout))
    print(
        f"{'run':>3s} | {'phase':9s} | {'wall ms':>8s} {'cpu ms':>8s} {'wall/cpu':>8s} "
        f"{'minflt':>7s} {'nivcsw':>6s}"
    )
    for i, row in enumerate(rows):
        for ph, d in row.items():
            ratio = d["wall_ms"] / max(d["cpu_ms"], 1e-9)
            print(
                f"{i:3d} | {ph:9s} | {d['wall_ms']:8.2f} {d['cpu_ms']:8.2f} {ratio:8.2f} "
                f"{d['minflt']:7d} {d['nivcsw']:6d}"
            )
    for ph in rows[0]:
        walls = sorted(r[ph]["wall_ms"] for r in rows)
        cpus = sorted(r[ph]["cpu_ms"] for r in rows)
        print(
            f"{ph:9s}: wall min/median/max {walls[0]:.2f}/{walls[len(walls) // 2]:.2f}/"
            f"{walls[-1]:.2f} ms, cpu {cpus[0]:.2f}/{cpus[len(cpus) // 2]:.2f}/"
            f"{cpus[-1]:.2f} ms"
        )


if __name__ == "__main__":
    main()
