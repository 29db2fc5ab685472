"""fork() while another thread is inside a call: the child never hangs.

In the child, an object another thread was using at the fork raises RuntimeError (its lock
is held by a thread that does not exist there); objects nobody was using, and new
objects, work. Each scenario runs in a subprocess under a timeout, so a hang fails the
test instead of stalling the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time, warnings
    import numpy as np
    import prefixcache as pc

    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
    kind = sys.argv[1]

    def build():
        if kind == "RadixCache":
            c = pc.RadixCache()
            rng = np.random.default_rng(1)
            # ~140k short nodes: enough that check_invariants (O(nodes)) is a long call
            for k in rng.integers(0, 3, (100_000, 12), dtype=np.uint32):
                c.insert(k)
            return c
        if kind == "BlockPool":  # every block used once: check_invariants visits them all
            # 4M blocks: ~10 ms a check, several times what fork() itself takes (0.5-2 ms
            # here). With 500k (1 ms), a fork often ran past the end of the call, so the
            # child saw the lock free and no fork landed inside a call.
            p = pc.BlockPool(4_000_000)
            p.free_blocks(p.get_new_blocks(3_999_999))
            return p
        if kind == "KVCacheManager":
            m = pc.KVCacheManager(200_000, block_size=1, hash_algo="xxh3_64")
            m.admit(1, np.arange(199_990, dtype=np.uint32))
            m.finish(1)
            return m
        if kind == "BlockTrie":
            t = pc.BlockTrie(200_000, 4)
            t.claim(1, np.arange(400_000, dtype=np.uint32))
            t.store(1, np.arange(400_000, dtype=np.uint32))
            return t
        raise SystemExit(kind)

    def cheap(obj):
        obj.check_invariants() if kind != "BlockTrie" else obj.lookup([1, 2, 3])

    busy, idle = build(), build()
    stop = False

    def worker():
        while not stop:
            busy.check_invariants()  # O(size), runs with the GIL released

    threading.Thread(target=worker, daemon=True).start()
    outcomes = []
    # At least 5 forks; more (up to 15) until two have landed inside a call: whether one
    # does is a race between fork() and the end of the call.
    while len(outcomes) < 5 or (outcomes.count(20) < 2 and len(outcomes) < 15):
        time.sleep(0.02)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                cheap(busy)
                code = 10  # it was free at the fork: usable
            except RuntimeError as e:
                code = 20 if "forked" in str(e) else 30
            try:
                cheap(busy)  # the second call behaves like the first
                code += 1 if code == 10 else 0
            except RuntimeError:
                code += 0 if code == 20 else 5
            cheap(idle)
            cheap(build())
            os._exit(code)
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                outcomes.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                outcomes.append("hang")
                break
            time.sleep(0.01)
    stop = True
    cheap(busy)  # the parent is unaffected
    print(outcomes)
    """
)


@pytest.mark.parametrize("kind", ["RadixCache", "BlockPool", "KVCacheManager", "BlockTrie"])
def test_fork_while_another_thread_is_inside_a_call(kind: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    outcomes = eval(r.stdout.strip().splitlines()[-1])
    assert "hang" not in outcomes, outcomes
    # 11: free at the fork, usable; 20: held at the fork, RuntimeError on every call.
    assert set(outcomes) <= {11, 20}, outcomes
    assert 20 in outcomes, f"no fork landed inside a call: {outcomes}"
