"""Checks the fleet index's ZMQ path against vLLM's own publisher (not part of the tests:
it needs a vLLM install, see docs/ANCHORS.md).

vLLM's ``ZmqEventPublisher`` (PUB + replay ROUTER) runs in a child process with the
anchor Python and publishes random ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` batches built from vLLM's own event classes (with every field vLLM
0.33 has, including ones prefixcache does not read). Half of them are published before
the subscriber starts, so the start-up replay from vLLM's ROUTER socket is exercised;
then the subscriber follows live. At the end each worker's cached hashes must equal the
set the child computed from the events it published.

    python tools/fleet_check_vllm_publisher.py --anchor-python /path/to/vllm/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

from prefixcache import KvIndex
from prefixcache.fleet import KvEventSubscriber, Publisher

CHILD = r"""
import json, random, sys, time
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                         KVEventBatch, ZmqEventPublisher)
pub_port, replay_port, n, seed = map(int, sys.argv[1:5])
pub = ZmqEventPublisher(0, endpoint=f"tcp://*:{pub_port}",  # "*": the PUB binds
                        replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic="kv@vllm")
rng = random.Random(seed)
held = {}  # hash -> copies
for i in range(n):
    events = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.55:
            hs = [rng.randrange(40) for _ in range(rng.randint(1, 6))]
            events.append(BlockStored(block_hashes=hs, parent_block_hash=None,
                token_ids=list(range(16 * len(hs))), block_size=16, lora_id=None,
                medium="GPU", lora_name=None, extra_keys=[None] * len(hs), group_idx=0,
                kv_cache_spec_kind="full_attention", session_id="s", locality="local"))
            for h in hs:
                held[h] = held.get(h, 0) + 1
        elif r < 0.97 and held:
            h = rng.choice(sorted(held))
            events.append(BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0))
            held[h] -= 1
            if not held[h]:
                del held[h]
        elif r >= 0.97:
            events.append(AllBlocksCleared())
            held.clear()
    pub.publish(KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))
    if i == n // 2 - 1:
        time.sleep(0.5)
        print("HALF", flush=True)
        sys.stdin.readline()  # the parent starts its subscriber
time.sleep(1.0)
print(json.dumps(sorted(held)), flush=True)
sys.stdin.readline()
pub.shutdown()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor-python", required=True)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    pub_port, replay_port = free_port(), free_port()
    child = subprocess.Popen(
        [
            args.anchor_python,
            "-c",
            CHILD,
            str(pub_port),
            str(replay_port),
            str(args.batches),
            str(args.seed),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    line = child.stdout.readline()
    while line and line.strip() != "HALF":
        line = child.stdout.readline()
    index = KvIndex()
    sub = KvEventSubscriber(
        index,
        [
            Publisher(
                f"tcp://127.0.0.1:{pub_port}", "vllm", f"tcp://127.0.0.1:{replay_port}", "kv@vllm"
            )
        ],
    )
    sub.start()
    after_sync = index.status("vllm")["next_seq"]
    time.sleep(0.3)
    child.stdin.write("\n")
    child.stdin.flush()
    truth = json.loads(child.stdout.readline())
    ok = sub.wait_for(lambda: index.status("vllm")["next_seq"] == args.batches, timeout=10)
    got = index.cached_hashes("vllm")
    sub.stop()
    child.stdin.write("\n")
    child.stdin.flush()
    child.wait(10)
    st = index.status("vllm")
    print(
        f"replayed at start: {after_sync} batches; applied {st['batches']} of "
        f"{args.batches}; gaps {st['gaps']}, replays {sub.stats['vllm'].replays}, "
        f"errors {st['errors']}; cached hashes equal: {got == truth} ({len(truth)}); "
        f"subscriber: {sub.stats['vllm']}"
    )
    return 0 if ok and got == truth and st["errors"] == 0 and after_sync > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
