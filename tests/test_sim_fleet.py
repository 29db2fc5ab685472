"""Fleet replay: routers on traces where the right choice is known, the KV event path
(delay, loss), determinism, a fleet of one equals the single-instance replay, the CLI."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from prefixcache.errors import InvalidInputError
from prefixcache.sim.cli import main
from prefixcache.sim.fleet import fleet_replay
from prefixcache.sim.policies import RadixPolicy, TrtllmPolicy
from prefixcache.sim.replay import replay
from prefixcache.sim.requests import Request
from prefixcache.sim.routers import CacheAwareRouter, FleetView, LeastLoadedRouter
from prefixcache.sim.scheduler import TimeScheduler
from prefixcache.sim.workloads import multi_turn_workload, shared_prefix_workload


def _same(a: object, b: object, but: str | None = None) -> bool:
    da, db = a.to_dict(), b.to_dict()  # type: ignore[attr-defined]
    if but is not None:
        del da[but], db[but]
    return (
        all(
            x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
            for x, y in zip(da.values(), db.values(), strict=True)
        )
        and da.keys() == db.keys()
    )


def _toks(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


def groups_trace(
    groups: int = 2, per_group: int = 8, gap: float = 2.0, prefix: int = 1024
) -> list[Request]:
    """``groups`` long shared prefixes; requests of the groups alternate, each arriving
    after the previous finished (the fleet is idle at every arrival, so load says nothing
    and only the held prefix tells the instances apart)."""
    heads = [_toks(1_000_000 * (g + 1), prefix) for g in range(groups)]
    out, nxt = [], 10_000_000
    for i in range(groups * per_group):
        g = i % groups
        prompt = np.concatenate([heads[g], _toks(nxt, 40)])
        out.append(Request(i, prompt, _toks(nxt + 40, 8), arrival=i * gap))
        nxt += 100
    return out


SCHED = TimeScheduler(max_running=16)


# -- a fleet of one is the single-instance replay ------------------------------------------
@pytest.mark.parametrize("policy", ["radix", "radix-page16", "vllm-blocks", "trtllm"])
def test_one_instance_fleet_equals_single_replay(policy: str) -> None:
    w = multi_turn_workload(num_sessions=24, turns=5, seed=3, request_rate=30.0)
    for cap in (6000, 40000):  # with and without preemptions
        single = replay(w.requests, [policy], cap, scheduler=SCHED)[0]
        fleet = fleet_replay(w.requests, policy, cap, 1, "round-robin", scheduler=SCHED)
        assert all(_same(a, b) for a, b in zip(single.records, fleet.records, strict=True))
        assert fleet.served_by == [0] * len(w.requests)


@pytest.mark.parametrize("policy", ["vllm-blocks", "radix", "radix-page16", "trtllm"])
def test_one_instance_fleet_with_events_equals_single_replay(policy: str) -> None:
    w = shared_prefix_workload(
        num_groups=4, prompts_per_group=20, seed=1, request_rate=40.0, shuffle=True
    )
    single = replay(w.requests, [policy], 5000, scheduler=SCHED)[0]
    assert sum(r.preemptions for r in single.records) > 0  # the run exercises preemption
    for router in ("cache-aware", "sticky-least-loaded", "random", "least-loaded"):
        fleet = fleet_replay(w.requests, policy, 5000, 1, router, scheduler=SCHED)
        if router == "random":  # reads no instance: the very same decode runs
            assert all(_same(a, b) for a, b in zip(single.records, fleet.records, strict=True))
            continue
        # A router that reads the instances ends decode runs at every arrival: the same
        # hits, times and evictions, but a decode-time eviction may be charged to another
        # running request of the stretch.
        same = [
            _same(a, b, but="evicted_tokens")
            for a, b in zip(single.records, fleet.records, strict=True)
        ]
        assert all(same)
        assert vars(fleet.stats[0]) == vars(single.stats)
        assert sum(r.evicted_tokens for r in fleet.records) == single.stats.evicted_tokens


# -- routers where the right choice is known -----------------------------------------------
def test_round_robin_takes_instances_in_turn() -> None:
    reqs = groups_trace(groups=3, per_group=4)
    res = fleet_replay(reqs, "vllm-blocks", 1 << 16, 4, "round-robin", scheduler=SCHED)
    assert res.served_by == [i % 4 for i in range(12)]


def test_least_loaded_avoids_the_busy_instance() -> None:
    # A long request holds instance 0; everything arriving meanwhile goes elsewhere, and
    # a request arriving once all are idle again goes to the next in turn.
    long = Request(0, _toks(0, 4000), _toks(5000, 500), arrival=0.0)
    shorts = [
        Request(i, _toks(10_000 * i, 100), _toks(10_000 * i + 500, 4), arrival=0.5 + i * 0.01)
        for i in range(1, 4)
    ]
    res = fleet_replay([long, *shorts], "vllm-blocks", 1 << 16, 2, "least-loaded", scheduler=SCHED)
    assert res.served_by == [0, 1, 1, 1]
    rr = fleet_replay([long, *shorts], "vllm-blocks", 1 << 16, 2, "round-robin", scheduler=SCHED)
    assert rr.served_by == [0, 1, 0, 1]


def test_cache_aware_sends_each_group_where_its_prefix_is() -> None:
    reqs = groups_trace(groups=2, per_group=8)
    res = fleet_replay(reqs, "vllm-blocks", 1 << 16, 2, "cache-aware", scheduler=SCHED)
    # Cold requests tie (nothing held, nothing running) and go to a seeded draw; every
    # later request follows its group's prefix.
    homes = {i % 2: res.served_by[i] for i in range(2)}
    assert res.served_by == [homes[i % 2] for i in range(16)]
    # Every request after the first of its group hits the whole prefix (64 blocks).
    assert [r.hit_tokens for r in res.records[2:]] == [1024] * 14
    # Round robin with 3 instances scatters the two groups: fewer hits.
    rr = fleet_replay(reqs, "vllm-blocks", 1 << 16, 3, "round-robin", scheduler=SCHED)
    ca3 = fleet_replay(reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED)
    assert ca3.summary()["hit_tokens"] == res.summary()["hit_tokens"]
    assert rr.summary()["hit_tokens"] < ca3.summary()["hit_tokens"]


def test_cache_aware_reads_namespaced_prefixes() -> None:
    # Same tokens, two namespaces (an extra key, a cache salt): each namespace is its own
    # prefix on the instances, and the router keys its query the same way.
    head = _toks(0, 1024)
    reqs = []
    for i in range(16):
        ns = i % 2
        reqs.append(
            Request(
                i,
                np.concatenate([head, _toks(10_000 + 100 * i, 40)]),
                _toks(50_000 + 100 * i, 8),
                arrival=2.0 * i,
                extra_key="adapter-a" if ns == 0 else None,
                cache_salt="tenant-b" if ns == 1 else None,
            )
        )
    res = fleet_replay(reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED)
    homes = {ns: res.served_by[ns] for ns in range(2)}
    assert res.served_by == [homes[i % 2] for i in range(16)]
    assert [r.hit_tokens for r in res.records[2:]] == [1024] * 14


def test_cache_aware_weighs_load_against_the_held_prefix() -> None:
    # Instance 0 holds the prefix but is busy with a long request: with the load weighed
    # in, a request whose prefix is short goes to the idle instance; with the overlap
    # weighted heavily it goes to the prefix.
    head = _toks(0, 512)
    busy = Request(0, np.concatenate([head, _toks(50_000, 8000)]), _toks(90_000, 2000), arrival=0.0)
    probe = Request(1, np.concatenate([head, _toks(70_000, 2000)]), _toks(95_000, 4), arrival=0.5)
    res = fleet_replay([busy, probe], "vllm-blocks", 1 << 16, 2, "cache-aware", scheduler=SCHED)
    home = res.served_by[0]
    assert res.served_by == [home, 1 - home]
    heavy = fleet_replay(
        [busy, probe],
        "vllm-blocks",
        1 << 16,
        2,
        "cache-aware",
        scheduler=SCHED,
        overlap_weight=100.0,
    )
    assert heavy.served_by == [home, home]
    assert heavy.records[1].hit_tokens == 512


@pytest.mark.parametrize("policy", ["radix", "radix-page16", "trtllm", "trtllm-nopartial16"])
def test_cache_aware_follows_tree_instances_events(policy: str) -> None:
    # Tree instances publish their blocks: the router finds each group's prefix there.
    reqs = groups_trace(groups=2, per_group=8)
    res = fleet_replay(reqs, policy, 1 << 16, 3, "cache-aware", scheduler=SCHED)
    homes = {i % 2: res.served_by[i] for i in range(2)}
    assert res.served_by == [homes[i % 2] for i in range(16)]
    assert [r.hit_tokens for r in res.records[2:]] == [1024] * 14
    assert res.events.lost == 0 and res.events.delivered >= res.events.batches - 1 > 0
    rr = fleet_replay(reqs, policy, 1 << 16, 3, "round-robin", scheduler=SCHED)
    assert rr.summary()["hit_tokens"] < res.summary()["hit_tokens"]


@pytest.mark.parametrize("offload", ["write-through", "write-through-selective", "write-back"])
def test_cache_aware_follows_a_tree_prefix_into_host_memory(offload: str) -> None:
    # A's prefix is served on one instance, then long unique prompts push it off that
    # instance's GPU: only its host copy is left. The router sees it in the instance's CPU
    # events and sends A's next request there, which loads the prefix back.
    head = _toks(1_000_000, 1024)
    reqs = [Request(0, np.concatenate([head, _toks(5_000_000, 40)]), _toks(5_000_100, 8))]
    for i in range(1, 9):
        reqs.append(
            Request(i, _toks(10_000_000 * (i + 1), 1400), _toks(100 * i, 8), arrival=2.0 * i)
        )
    reqs.append(Request(9, np.concatenate([head, _toks(6_000_000, 40)]), _toks(8, 8), arrival=20.0))

    def run(cpu: int) -> tuple[list[int], int, int]:
        res = fleet_replay(
            reqs,
            "radix",
            1600,
            2,
            "cache-aware",
            scheduler=SCHED,
            cpu_capacity=cpu,
            offload=offload if cpu else None,
            check=True,
        )
        last = res.records[-1]
        return res.served_by, last.hit_tokens, last.host_hit_tokens

    served, hit, host = run(1 << 16)
    assert served[-1] == served[0] and hit == host == 1024
    served, hit, _ = run(0)  # no host tier: the prefix is gone, the router goes elsewhere
    assert served[-1] != served[0] and hit == 0


def _tree_blocks(pol: RadixPolicy) -> dict[str, list[int]]:
    """Per medium, the keys of the full blocks a policy's tree holds, recomputed from its
    dump (each node's path tokens rehashed): on GPU the blocks whose last token is on the
    device, on CPU those whose last token is in a node with a host copy. Checks the
    labels on the way (device values and host copies' values) and that no id leaked."""
    from prefixcache._core import lab_block_keys
    from prefixcache.sim.requests import namespace_seed

    ev = pol.events
    assert ev is not None
    bs = pol.event_block_size
    dump = pol.tree.dump()
    hosts = pol.tree.host_dump() if pol.cpu_capacity else [(False, False)] * len(dump)
    host_values = pol.tree.host_values_dump() if pol.cpu_capacity else [[]] * len(dump)
    path: list[list[int]] = []
    out: dict[str, list[int]] = {"GPU": [], "CPU": []}
    ids: set[int] = set()

    def read(values: object, medium: str, start: int, keys: np.ndarray) -> None:
        for pos, v in enumerate(values):  # type: ignore[call-overload]
            end = start + pos + 1  # tokens of the path up to this one
            if end % bs == 0:
                assert v != 0, f"a block's last token carries no id ({medium})"
                assert int(ev.key_of(np.array([v]))[0]) == int(keys[end // bs - 1])
                out[medium].append(int(keys[end // bs - 1]))
                ids.add(int(v))
            else:
                assert v == 0, f"an id off a block's last token ({medium})"

    for node, (backed, host_only), hv in zip(dump, hosts, host_values, strict=True):
        del path[node["depth"] - 1 :]
        start = sum(len(p) for p in path)
        path.append(node["key"])
        tokens = np.array([t for p in path for t in p], dtype=np.uint32)
        keys = lab_block_keys(tokens, bs, namespace_seed(node["extra_key"], node["cache_salt"]))
        if not host_only:
            read(node["value"], "GPU", start, keys)
        if backed:
            assert len(hv) == len(node["key"]), "a host copy without its values"
            read(hv, "CPU", start, keys)
        else:
            assert len(hv) == 0
    assert len(ids) == ev.live  # no id leaked
    return {m: sorted(v) for m, v in out.items()}


class _Audit:
    """An index fed by a publishing policy's events after every step (``check``)."""

    def __init__(self) -> None:
        from prefixcache import KvIndex

        self.index = KvIndex()
        self.audits = 0
        self.counts: dict[tuple[str, str], int] = {}  # (type, medium) -> events

    def feed(self, events: list[dict[str, object]]) -> None:
        for e in events:
            k = (str(e["type"]), str(e.get("medium")))
            self.counts[k] = self.counts.get(k, 0) + 1
        self.index.apply("w", events, now=0.0)
        self.audits += 1

    def held(self, medium: str | None = None) -> list[int]:
        if medium is not None and medium not in self.index.media:
            return []
        return self.index.cached_hashes("w", medium)


class _AuditedTree(RadixPolicy):
    """A publishing tree whose events, applied to an index after every step, must
    describe exactly the full blocks the tree holds, on each medium that holds them."""

    def __init__(self, capacity: int, **kw: object) -> None:
        super().__init__(capacity, publish_events=True, **kw)  # type: ignore[arg-type]
        self.audit = _Audit()

    def check(self) -> None:
        super().check()
        truth = _tree_blocks(self)
        self.audit.feed(self.take_events())
        assert self.audit.held("GPU") == truth["GPU"]
        assert self.audit.held("CPU") == truth["CPU"]


_HOST_TIERS = [
    {"page_size": page, "cpu_capacity": cpu, "offload": offload}
    for offload, cpu in (
        ("write-through", 4000),
        ("write-through-selective", 3000),
        ("write-back", 3000),
    )
    for page in (1, 16)
]


@pytest.mark.parametrize(
    "kw",
    [
        {"page_size": 1},
        {"page_size": 16},
        {"page_size": 4, "event_block_size": 8},
        *_HOST_TIERS,
        {"page_size": 2, "cache_cls": "reference"},
        *({**kw, "cache_cls": "reference"} for kw in _HOST_TIERS),
    ],
)
def test_tree_events_describe_the_tree_after_every_step(kw: dict[str, object]) -> None:
    if kw.get("cache_cls") == "reference":  # the plain-Python tree publishes the same way
        from prefixcache.reference.radix import RadixCache as Reference

        kw = {**kw, "cache_cls": Reference}
    w = multi_turn_workload(num_sessions=12, turns=4, seed=5, request_rate=30.0)
    reqs = _namespaced(list(w.requests))
    pol = _AuditedTree(3000, **kw)
    res = replay(reqs, [pol], scheduler=SCHED, check=True)[0]
    assert pol.audit.audits >= len(reqs)
    assert res.stats.evicted_tokens > 0  # the run evicts: removals are exercised
    if kw.get("cpu_capacity"):
        assert pol.stats().host_hit_tokens > 0  # and loads back from the host tier
        # Host copies were published, and host copies dropped.
        assert pol.audit.counts.get(("BlockStored", "CPU"), 0) > 0
        assert pol.audit.counts.get(("BlockRemoved", "CPU"), 0) > 0


@pytest.mark.parametrize(
    "kw", [{"page_size": 1}, {"page_size": 16}, _HOST_TIERS[0], _HOST_TIERS[5]]
)
def test_publishing_events_changes_no_result_of_a_tree(kw: dict[str, object]) -> None:
    """Without events the tree gets no values and evictions are only counted
    (``evict_count``); with them, labelled values and ``evict``'s indices: the same run."""
    w = multi_turn_workload(num_sessions=12, turns=4, seed=5, request_rate=30.0)
    reqs = _namespaced(list(w.requests))
    plain, published = (
        replay(reqs, [RadixPolicy(3000, publish_events=events, **kw)], scheduler=SCHED)[0]  # type: ignore[arg-type]
        for events in (False, True)
    )
    assert plain.stats.evicted_tokens > 0
    assert plain.records == published.records
    assert plain.stats == published.stats


def _namespaced(reqs: list[Request]) -> list[Request]:
    """Some sessions in a namespace of their own: other keys for the same tokens."""
    out = list(reqs)
    for i, r in enumerate(out):
        if hash(r.session) % 3 == 0:
            out[i] = Request(
                r.id,
                r.prompt,
                r.output,
                session=r.session,
                turn=r.turn,
                arrival=r.arrival,
                extra_key="lora-a",
            )
    return out


def _trie_blocks(pol: TrtllmPolicy) -> dict[str, list[int]]:
    """Per medium, the keys of the full blocks a policy's trie holds, recomputed from its
    dump (each block's key chained from its parent's)."""
    from prefixcache._core import lab_block_keys
    from prefixcache.sim.requests import namespace_seed

    bs = pol.block_size
    dump = {d["block_id"]: d for d in pol.trie.dump()}
    on_host = pol.trie.host_dump() if pol.host_blocks else [False] * len(dump)
    lora_name = {v: k for k, v in pol._loras.items()}
    keys: dict[int, int] = {}

    def key(b: int) -> int:
        if b not in keys:
            d = dump[b]
            assert len(d["tokens"]) == bs, "a partial block is a parent"
            p = d["parent"]
            seed = (
                namespace_seed(lora_name.get(d["lora_id"]), d["cache_salt"])
                if p is None
                else key(p)
            )
            keys[b] = int(lab_block_keys(np.array(d["tokens"], dtype=np.uint32), bs, seed)[0])
        return keys[b]

    out: dict[str, list[int]] = {"GPU": [], "CPU": []}
    for b, d in dump.items():
        if d["cached"] and len(d["tokens"]) == bs:
            out["CPU" if on_host[b] else "GPU"].append(key(b))
    return {m: sorted(v) for m, v in out.items()}


class _AuditedTrie(TrtllmPolicy):
    """A publishing trie whose events, applied to an index after every step, must describe
    exactly the full blocks the trie holds, on the medium that holds them."""

    def __init__(self, capacity: int, **kw: object) -> None:
        super().__init__(capacity, publish_events=True, **kw)  # type: ignore[arg-type]
        self.audit = _Audit()

    def check(self) -> None:
        super().check()
        truth = _trie_blocks(self)
        self.audit.feed(self.take_events())
        assert self.audit.held("GPU") == truth["GPU"]
        assert self.audit.held("CPU") == truth["CPU"]


@pytest.mark.parametrize(
    "kw",
    [
        {"tokens_per_block": 16},
        {"tokens_per_block": 16, "partial_reuse": False},
        {"tokens_per_block": 8, "cpu_capacity": 4000, "offload": "host"},
    ],
)
def test_trie_events_describe_the_trie_after_every_step(kw: dict[str, object]) -> None:
    w = multi_turn_workload(num_sessions=12, turns=4, seed=5, request_rate=30.0)
    reqs = _namespaced(list(w.requests))
    pol = _AuditedTrie(3000, **kw)
    res = replay(reqs, [pol], scheduler=SCHED, check=True)[0]
    assert pol.audit.audits >= len(reqs)
    assert res.stats.evicted_tokens > 0
    if kw.get("cpu_capacity"):
        assert pol.stats().host_hit_tokens > 0
        assert "CPU" in pol.audit.index.media  # moves to host were published


class _CheckedCacheAware(CacheAwareRouter):
    """The cache-aware router, its bookkeeping checked against a brute force at every
    routing: per instance the distinct prompt blocks of the requests sent there that
    have not completed (by the router's clock), and their prompt tokens still to
    prefill."""

    def __init__(self, requests: list[Request], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.requests = requests
        self.where: dict[int, int] = {}
        self.ends: dict[int, float] = {}
        self.checks = 0
        self.shared = 0  # checks where running requests shared blocks
        self.queued = 0  # checks where prompt tokens were waiting to prefill

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        k = super().choose(req, now, fleet)
        act = self._active
        assert act is not None
        for inst in range(fleet.size):
            live = [
                i
                for i, w in self.where.items()
                if w == inst and not self.ends.get(i, math.inf) <= now
            ]
            keys: set[int] = set()
            total = 0
            for i in live:
                r = self.requests[i]
                ks = act.keys(r, r.prompt).tolist()
                keys.update(ks)
                total += len(ks)
            assert act.blocks[inst] == len(keys)
            self.shared += len(keys) < total
            self.queued += act.prefill[inst] > 0
            assert act.prefill[inst] == sum(
                act.unprefilled[inst][i] for i in live if not fleet.first_token(i) <= now
            )
        self.checks += 1
        return k

    def routed(self, index: int, req: Request, instance: int, now: float) -> None:
        super().routed(index, req, instance, now)
        self.where[index] = instance

    def finished(self, index: int, instance: int, t: float) -> None:
        super().finished(index, instance, t)
        self.ends[index] = t


def test_cache_aware_keeps_dynamo_bookkeeping_of_running_requests() -> None:
    # Shared prefixes (so running requests share blocks), bursts (so requests wait to
    # prefill), preemptions under a small KV budget.
    w = shared_prefix_workload(
        num_groups=3, prompts_per_group=16, seed=2, request_rate=12.0, shuffle=True
    )
    reqs = list(w.requests)
    rt = _CheckedCacheAware(reqs)
    res = fleet_replay(reqs, "vllm-blocks", 2500, 3, rt, scheduler=SCHED)
    assert rt.checks == len(reqs)
    assert rt.shared > 0 and rt.queued > 0
    assert sum(r.preemptions for r in res.records) > 0


def test_cache_aware_cost_counts_queued_prefill_and_shared_running_blocks() -> None:
    # A long-running request (800 prompt tokens = 50 blocks) and a probe (640 tokens = 40
    # blocks) sharing its first 512 tokens (32 blocks): Dynamo's cost, term by term.
    head = _toks(0, 512)
    busy = Request(0, np.concatenate([head, _toks(50_000, 288)]), _toks(90_000, 4000), arrival=0.0)
    probe = Request(1, np.concatenate([head, _toks(70_000, 128)]), _toks(95_000, 4), arrival=1.0)
    seen: list[list[float]] = []

    class Spy(CacheAwareRouter):
        def choose(self, req: Request, now: float, fleet: FleetView) -> int:
            k = super().choose(req, now, fleet)
            seen.append(self.costs_seen)
            return k

        def costs(self, req: Request, now: float, fleet: FleetView) -> list[float]:
            self.costs_seen = super().costs(req, now, fleet)
            return self.costs_seen

    res = fleet_replay([busy, probe], "vllm-blocks", 1 << 16, 2, Spy(), scheduler=SCHED)
    home = res.served_by[0]
    # The busy request: nothing held, nothing running anywhere: 800/16 prefill + 50 new.
    assert seen[0] == [100.0, 100.0]
    # The probe at 1 s: the busy request is prefilled and running on `home`.
    # home: prefill (640 - 512) / 16 = 8, running 50 blocks + 8 new ones = 66;
    # other: prefill 640 / 16 = 40, running 0 + 40 new = 80.
    assert seen[1][home] == 66.0 and seen[1][1 - home] == 80.0
    assert res.served_by == [home, home]


def test_sticky_keeps_a_session_on_one_instance() -> None:
    w = multi_turn_workload(num_sessions=12, turns=4, seed=2, request_rate=20.0)
    res = fleet_replay(w.requests, "vllm-blocks", 1 << 15, 3, "sticky-round-robin", scheduler=SCHED)
    homes: dict[object, set[int]] = {}
    for r, k in zip(w.requests, res.served_by, strict=True):
        homes.setdefault(r.session, set()).add(k)
    assert all(len(v) == 1 for v in homes.values())
    plain = fleet_replay(w.requests, "vllm-blocks", 1 << 15, 3, "round-robin", scheduler=SCHED)
    assert res.summary()["hit_tokens"] > plain.summary()["hit_tokens"]


def test_random_router_is_seeded() -> None:
    reqs = groups_trace(groups=2, per_group=10)
    a = fleet_replay(reqs, "vllm-blocks", 1 << 16, 4, "random", scheduler=SCHED, seed=5)
    b = fleet_replay(reqs, "vllm-blocks", 1 << 16, 4, "random", scheduler=SCHED, seed=5)
    c = fleet_replay(reqs, "vllm-blocks", 1 << 16, 4, "random", scheduler=SCHED, seed=6)
    assert a.served_by == b.served_by != c.served_by
    assert set(a.served_by) == {0, 1, 2, 3}


# -- the event path -----------------------------------------------------------------------
def test_stale_or_lossy_events_route_worse_and_never_crash() -> None:
    reqs = groups_trace(groups=3, per_group=12, gap=1.0)
    fresh = fleet_replay(reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED)
    # Events a whole trace late: the router sees no instance holding anything.
    late = fleet_replay(
        reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED, event_delay=1000.0
    )
    lossy = fleet_replay(
        reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED, event_loss=0.5, seed=1
    )
    hit = {
        name: r.summary()["hit_tokens"]
        for name, r in (("fresh", fresh), ("late", late), ("lossy", lossy))
    }
    assert hit["late"] < hit["fresh"]
    assert hit["lossy"] < hit["fresh"]
    assert late.events.delivered == 0 and late.events.in_flight == late.events.batches > 0
    assert lossy.events.lost > 0 and lossy.events.resyncs > 0
    assert fresh.events.lost == 0
    for r in (fresh, late, lossy):
        e = r.events
        assert e.delivered + e.lost + e.in_flight == e.batches
    # A delay shorter than the gap between requests changes nothing here.
    soon = fleet_replay(
        reqs, "vllm-blocks", 1 << 16, 3, "cache-aware", scheduler=SCHED, event_delay=0.2
    )
    assert soon.summary()["hit_tokens"] == hit["fresh"]


def test_fully_lossy_stream_runs() -> None:
    w = multi_turn_workload(num_sessions=8, turns=3, seed=0, request_rate=50.0)
    res = fleet_replay(
        w.requests, "vllm-blocks", 8000, 2, "cache-aware", scheduler=SCHED, event_loss=1.0
    )
    assert res.events.delivered == 0
    assert res.events.lost + res.events.in_flight == res.events.batches > 0
    assert res.summary()["requests"] == len(w.requests)


# -- determinism, report, errors ------------------------------------------------------------
def test_same_seed_same_result() -> None:
    w = shared_prefix_workload(
        num_groups=6, prompts_per_group=10, seed=4, request_rate=30.0, shuffle=True
    )
    for router in ("cache-aware", "random", "least-loaded"):
        a = fleet_replay(
            w.requests, "vllm-blocks", 6000, 3, router, scheduler=SCHED, seed=9, event_loss=0.2
        )
        b = fleet_replay(
            w.requests, "vllm-blocks", 6000, 3, router, scheduler=SCHED, seed=9, event_loss=0.2
        )
        assert a.served_by == b.served_by
        assert all(_same(x, y) for x, y in zip(a.records, b.records, strict=True))


def test_summary_fields_and_ceiling() -> None:
    w = multi_turn_workload(num_sessions=10, turns=3, seed=1, request_rate=20.0)
    res = fleet_replay(w.requests, "radix", 6000, 2, "least-loaded", scheduler=SCHED, ceiling=True)
    s = res.summary()
    per = s["per_instance"]
    assert sum(p["requests"] for p in per) == s["requests"] - s["rejected"]
    assert sum(p["prompt_tokens"] for p in per) == s["prompt_tokens"]
    assert sum(p["hit_tokens"] for p in per) == s["hit_tokens"]
    mean = s["prompt_tokens"] / 2
    assert s["imbalance"] == pytest.approx(max(p["prompt_tokens"] for p in per) / mean)
    assert s["ttft_p50"] <= s["ttft_p90"] <= s["ttft_p99"]
    assert all(p["peak_kv_tokens"] <= 6000 for p in per)
    assert s["ceiling"]["capacity"] == 12000
    assert s["ceiling"]["hit_tokens"] >= s["hit_tokens"]


def test_bad_arguments_are_refused() -> None:
    reqs = groups_trace(groups=1, per_group=2)
    with pytest.raises(InvalidInputError, match="instances"):
        fleet_replay(reqs, "radix", 4096, 0)
    with pytest.raises(InvalidInputError, match="unknown router"):
        fleet_replay(reqs, "radix", 4096, 2, "fastest")
    with pytest.raises(InvalidInputError, match="event loss"):
        fleet_replay(reqs, "vllm-blocks", 4096, 2, "cache-aware", event_loss=1.5)
    with pytest.raises(InvalidInputError, match="event delay"):
        fleet_replay(reqs, "vllm-blocks", 4096, 2, "cache-aware", event_delay=-1.0)
    with pytest.raises(InvalidInputError, match="does not publish KV events"):
        fleet_replay(reqs, "lab-lru", 4096, 2, "cache-aware")


# -- CLI --------------------------------------------------------------------------------------
def test_cli_fleet_replay_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.json"
    assert (
        main(
            [
                "replay",
                "workload:F",
                "--instances",
                "2",
                "--router",
                "round-robin,cache-aware",
                "--event-delay",
                "5",
                "--quiet",
                "--json",
                str(out),
                "--csv",
                str(tmp_path / "fleet.csv"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "cache-aware" in text and "per instance" in text
    data = json.loads(out.read_text())
    rr, ca = data["fleet"]
    assert rr["router"] == "round-robin" and ca["event_delay"] == pytest.approx(0.005)
    assert ca["hit_rate"] > rr["hit_rate"]
    assert rr["ceiling"]["capacity"] == 2 * 24576
    assert (
        main(
            [
                "sweep",
                "workload:F",
                "--instances",
                "1,2",
                "--capacities",
                "8k",
                "--router",
                "least-loaded",
                "--no-ceiling",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert [s["instances"] for s in data["fleet"]] == [1, 2]


@pytest.mark.parametrize("offload", ["write-through", "write-back"])
def test_cli_fleet_radix_with_a_host_tier(tmp_path: Path, offload: str) -> None:
    # The cache-aware router over tree instances with a host tier (CPU events), end to end.
    out = tmp_path / "fleet.json"
    args = ["replay", "workload:F", "--instances", "2", "--policies", "radix"]
    args += ["--router", "cache-aware", "--capacity", "8k", "--cpu-capacity", "64k"]
    assert main([*args, "--offload", offload, "--quiet", "--json", str(out)]) == 0
    (ca,) = json.loads(out.read_text())["fleet"]
    assert ca["router"] == "cache-aware" and ca["host_hit_tokens"] > 0


def test_cli_fleet_progress_bars(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "workload:F", "--instances", "2", "--router", "cache-aware"]) == 0
    assert "per instance" in capsys.readouterr().out


def test_cli_fleet_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "workload:F", "--instances", "2", "--router", "nope", "--quiet"]) == 2
    assert "unknown router" in capsys.readouterr().err
    assert (
        main(
            [
                "replay",
                "workload:F",
                "--instances",
                "2",
                "--policies",
                "radix,vllm-blocks",
                "--quiet",
            ]
        )
        == 2
    )
    assert "one policy" in capsys.readouterr().err


# -- the anchor trace (set PREFIXCACHE_TRACES to the folder holding the Mooncake traces) ---
TRACES = os.environ.get("PREFIXCACHE_TRACES")


@pytest.mark.skipif(not TRACES, reason="PREFIXCACHE_TRACES is not set")
def test_mooncake_round_robin_matches_dynamo() -> None:
    from prefixcache.sim.traces import read_trace

    tr = read_trace(str(Path(str(TRACES)) / "mooncake_conversation.jsonl"))
    res = fleet_replay(tr.requests, "vllm-blocks", 3_000_000, 4, "round-robin")
    # NVIDIA Dynamo 1.4.2 replay, 4 vLLM workers x 187,500 blocks of 16, round robin:
    # first-admission reuse 0.131 (docs/FLEET_REPLAY.md).
    assert abs(res.summary()["hit_rate"] - 0.131) < 0.01


def test_compact_events_leave_the_index_in_the_same_state() -> None:
    from prefixcache import KVCacheManager, KvIndex

    rng = np.random.default_rng(0)
    full = KVCacheManager(65, block_size=16, enable_kv_cache_events=True)
    compact = KVCacheManager(65, block_size=16, enable_kv_cache_events=True)
    ix_full, ix_compact = KvIndex(), KvIndex()
    merged = 0
    for step in range(200):
        prompt = np.concatenate(
            [
                _toks(0, int(rng.integers(0, 200))),
                _toks(1000 * (step + 1), int(rng.integers(1, 300))),
            ]
        )
        for mgr, ix, small in ((full, ix_full, False), (compact, ix_compact, True)):
            if mgr.admit(step, prompt, 0) is not None:
                mgr.finish(step)
            evs = mgr.take_events(compact=small)
            if small:
                assert all(getattr(e, "token_ids", None) is None for e in evs)
                merged += sum(
                    len(getattr(e, "block_hashes", [])) > 1
                    for e in evs
                    if type(e).__name__ == "BlockRemoved"
                )
            ix.apply("w", evs, seq=step)
        assert ix_full.cached_hashes("w") == ix_compact.cached_hashes("w")
    assert merged > 0  # removals were merged


@pytest.mark.skipif(not TRACES, reason="PREFIXCACHE_TRACES is not set")
def test_mooncake_cache_aware_reaches_dynamo_kv_router() -> None:
    from prefixcache.sim.scheduler import PrefillCost
    from prefixcache.sim.traces import read_trace

    tr = read_trace(str(Path(str(TRACES)) / "mooncake_conversation.jsonl"))
    # Dynamo's mocker decodes at 7.9 ms per token on this run: the same pace here.
    sched = TimeScheduler(cost=PrefillCost(decode_step_ms=8.0))
    rr = fleet_replay(tr.requests, "vllm-blocks", 3_000_000, 4, "round-robin", scheduler=sched)
    ca = fleet_replay(tr.requests, "vllm-blocks", 3_000_000, 4, "cache-aware", scheduler=sched)
    # NVIDIA Dynamo 1.4.2, 4 vLLM workers x 187,500 blocks, kv_router weight 1: 0.2284.
    assert ca.summary()["hit_rate"] >= 0.2284
    assert ca.summary()["ttft_p99"] <= rr.summary()["ttft_p99"]


@pytest.mark.parametrize("policy", ["opt", "opt@32", "lab-opt-admit2"])
def test_a_fleet_of_opt_is_refused_before_anything_runs(
    tmp_path: Path, policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "not-read.jsonl"  # refused before the trace is opened
    for argv in (
        ["replay", "--capacity", "16k", "--instances", "2"],
        ["sweep", "--capacities", "16k", "--instances", "1,2"],
    ):
        assert main([argv[0], str(missing), *argv[1:], "--policies", policy]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: a fleet replay cannot run {policy}:")


def test_cli_fleet_tables_fit_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every figure is printed whole in an 80-column terminal (rich shortens cells that do
    # not fit, so that '1,311,056' read '1,311,0…'), and a sweep's rows name their
    # capacity: two capacities x one fleet size gave two rows alike but for their numbers.
    monkeypatch.setenv("COLUMNS", "80")
    args = ["workload:F", "--instances", "2", "--router", "round-robin,cache-aware", "--quiet"]
    assert main(["sweep", *args, "--capacities", "8k,16Ki"]) == 0
    text = capsys.readouterr().out
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = [line.split() for line in text.splitlines() if "round-robin" in line]
    assert [r[0] for r in rows] == ["8k", "16Ki", "8k", "16Ki"]  # routing, then latency
    # The ceiling belongs to a capacity and fleet size: every router's row shows it.
    assert all("-" not in r[-2:] for r in rows[2:])
    assert main(["replay", *args, "--capacity", "1M"]) == 0
    text = capsys.readouterr().out
    assert "…" not in text and "per instance" in text
    assert max(len(line) for line in text.splitlines()) <= 80


# A fleet of two instances at 16k tokens each, as the cases below start.
FLEET = ["replay", "--capacity", "16k", "--instances", "2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A fleet flag without --instances replayed one instance and ignored it.
        (["replay", "--capacity", "16k", "--router", "cache-aware"], "--router applies to a fleet"),
        (["replay", "--capacity", "16k", "--event-delay", "5"], "--event-delay applies to a fleet"),
        (["sweep", "--capacities", "16k", "--no-ceiling"], "--no-ceiling applies to a fleet"),
        # A router list was checked one router at a time, the earlier ones already run.
        (
            [*FLEET, "--router", "round-robin,nope"],
            "unknown router 'nope'",
        ),
        (
            [
                *FLEET,
                "--policies",
                "lab-lru",
                "--router",
                "round-robin,cache-aware",
            ],
            "does not publish KV events",
        ),
        (
            [*FLEET, "--router", "random,random"],
            "router random given twice",
        ),
        (
            [*FLEET, "--router", "random,"],
            "an empty item",
        ),
        (
            [
                *FLEET,
                "--router",
                "round-robin,cache-aware",
                "--overlap-weight",
                "nan",
            ],
            "overlap weight must be a finite number >= 0",
        ),
        # A router flag no router of the run reads.
        (
            [*FLEET, "--overlap-weight", "-1"],
            "overlap weight must be a finite number >= 0",
        ),
        (
            [*FLEET, "--overlap-weight", "2"],
            "--overlap-weight applies to the cache-aware routers only, not round-robin",
        ),
        (
            [
                *FLEET,
                "--event-loss",
                "0.5",
                "--router",
                "random",
            ],
            "--event-loss applies to the cache-aware routers only",
        ),
        (
            [*FLEET, "--router-seed", "3"],
            "--router-seed applies to the random and cache-aware routers only",
        ),
        # The delay is given in ms: the message said "got -0.001" for -1.
        (
            [
                *FLEET,
                "--router",
                "cache-aware",
                "--event-delay",
                "-1",
            ],
            "a delay in milliseconds, a finite number >= 0, got '-1'",
        ),
        # Seeds -1 and 1 drew the same numbers (Python's Random seeds by |seed|).
        (
            [
                *FLEET,
                "--router",
                "random",
                "--router-seed",
                "-1",
            ],
            "expected a whole number in [0, 2**64)",
        ),
        # Options the fleet ignored: no records file, no plot, no worker processes.
        (
            [*FLEET, "--records-csv", "r.csv"],
            "--records-csv does not apply to a fleet replay",
        ),
        (
            ["sweep", "--capacities", "16k", "--instances", "2", "--plot", "p.png"],
            "--plot does not apply to a fleet replay",
        ),
        (
            [*FLEET, "--jobs", "2"],
            "--jobs does not apply to a fleet replay",
        ),
        # Instance lists as capacity lists: no empty item, no repeat.
        (["sweep", "--capacities", "16k", "--instances", "1,2,"], "an empty item in '1,2,'"),
        (["sweep", "--capacities", "16k", "--instances", "2,2"], "2 instances given twice"),
        (["replay", "--instances", "2"], "a fleet replay needs --capacity"),
    ],
)
def test_cli_fleet_flags_are_checked_before_anything_runs(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "not-read.jsonl"  # refused before the trace is opened
    argv = [args[0], str(missing), *args[1:], "--quiet"]
    for i, a in enumerate(argv):  # output paths inside tmp_path
        if a in ("--records-csv", "--plot"):
            argv[i + 1] = str(tmp_path / argv[i + 1])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_fleet_router_flags_reach_the_routers(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    args = ["replay", "workload:F", "--instances", "2", "--router", "cache-aware,random"]
    args += ["--event-delay", "3", "--event-loss", "0.1", "--overlap-weight", "0"]
    assert main([*args, "--router-seed", "5", "--no-ceiling", "--quiet", "--json", str(out)]) == 0
    ca, rnd = json.loads(out.read_text())["fleet"]
    assert (ca["router"], rnd["router"]) == ("cache-aware", "random")
    assert ca["event_delay"] == pytest.approx(0.003) and ca["event_loss"] == 0.1
    assert "ceiling" not in ca


def test_fleet_tables_fit_80_columns() -> None:
    """The fleet tables at their widest (the longest router name, the counts of a large
    trace on a large fleet) fit 80 columns without cutting a cell (the one fleet table
    of eleven columns cut every header and number, 'hit…', '7.6…')."""
    import io

    from rich.console import Console

    from prefixcache.sim.fleet_cli import _print_fleet, instance_table

    big = 144_800_000  # the Mooncake conversation trace's prompt tokens
    s = {
        "router": "sticky-least-loaded",
        "instances": 256,
        "requests": 12_031,
        "hit_rate": 1.0,
        "imbalance": 256.0,
        "rejected": 12_031,
        "preemptions": 123_456,
        "ttft_p50": 1234.5678,
        "ttft_p90": 0.000012345,
        "ttft_p99": 99999.9,
        "seconds": 99999.99,
        "ceiling": {"hit_rate": 0.3099, "ttft_p99": 3.79},
        "cpu_capacity": 64_000_000,
        "offload": "write-through-selective",
        "gpu_hit_rate": 1.0,
        "host_hit_rate": 1.0,
        "host_unloaded_tokens": big,
        "host_evicted_tokens": big,
        "per_instance": [
            {
                "instance": 255,
                "requests": 12_031,  # (on one instance)
                "prompt_tokens": big,
                "hit_tokens": big,
                "hit_rate": 1.0,
                "peak_kv_tokens": big,
                "evicted_tokens": big,
            }
        ],
    }
    buf = io.StringIO()
    con = Console(file=buf, width=80)
    _print_fleet(con, "trace.jsonl: 12,031 requests on 256 x vllm-blocks", [s])
    con.print(instance_table("sticky-least-loaded: per instance", s))
    out = buf.getvalue()
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    assert "123,456" in out and "144,800,000" in out and "100,000" in out
    # Numbers as the replay tables write them: no exponent.
    assert "e-05" not in out and "e+05" not in out and "0.000" in out
    assert "rejected, not served" in " ".join(out.split())
    assert "host tier: 64,000,000 tokens per instance (write-through-selective)" in out


def test_cli_fleet_sweep_gives_every_router_its_ceiling(tmp_path: Path) -> None:
    # replay copied the ceiling to every router; sweep left all but the first without one.
    out = tmp_path / "fleet.json"
    argv = ["sweep", "workload:F", "--instances", "1,2", "--capacities", "8k"]
    assert main([*argv, "--router", "round-robin,least-loaded", "--quiet", "--json", str(out)]) == 0
    fleet = json.loads(out.read_text())["fleet"]
    assert [(s["instances"], s["router"]) for s in fleet] == [
        (1, "round-robin"),
        (1, "least-loaded"),
        (2, "round-robin"),
        (2, "least-loaded"),
    ]
    assert [s["ceiling"]["capacity"] for s in fleet] == [8000, 8000, 16000, 16000]
    assert fleet[0]["ceiling"] == fleet[1]["ceiling"] and fleet[2]["ceiling"] == fleet[3]["ceiling"]


@pytest.mark.parametrize(
    ("policy", "offload"), [("radix", "write-back"), ("vllm-blocks", "arc"), ("trtllm", None)]
)
def test_fleet_host_tier_summary_has_the_replay_keys(policy: str, offload: str | None) -> None:
    """A fleet of one with a host tier reports the host numbers a single replay does (the
    fleet summary had no offload, GPU hits, unloaded host hits or load time), and the
    instances' host hits add up to the fleet's."""
    from prefixcache.sim.replay import summarize

    w = multi_turn_workload(num_sessions=12, turns=4, seed=3, request_rate=30.0)
    kw: dict[str, object] = {"cpu_capacity": 8192, "offload": offload}
    one = replay(w.requests, [policy], 2048, scheduler=SCHED, **kw)[0]  # type: ignore[arg-type]
    single = summarize(one)
    fleet = fleet_replay(w.requests, policy, 2048, 1, "cache-aware", scheduler=SCHED, **kw)  # type: ignore[arg-type]
    s = fleet.summary()
    assert single["host_hit_tokens"] > 0
    for key in (
        "cpu_capacity",
        "offload",
        "gpu_hit_tokens",
        "host_hit_tokens",
        "loaded_tokens",
        "host_unloaded_tokens",
        "gpu_hit_rate",
        "host_hit_rate",
        "load_seconds",
        "stored_tokens",
        "host_evicted_tokens",
    ):
        assert s[key] == single[key], key
    assert s["per_instance"][0]["peak_host_tokens"] == single["peak_host_tokens"]
    two = fleet_replay(w.requests, policy, 2048, 2, "round-robin", scheduler=SCHED, **kw)  # type: ignore[arg-type]
    s2 = two.summary()
    for key in ("host_hit_tokens", "loaded_tokens", "stored_tokens", "host_evicted_tokens"):
        assert sum(p[key] for p in s2["per_instance"]) == s2[key], key
    assert s2["gpu_hit_tokens"] + s2["loaded_tokens"] == s2["hit_tokens"]
    assert s2["gpu_hit_rate"] + s2["host_hit_rate"] == pytest.approx(s2["hit_rate"])


def test_ceiling_reports_its_rejected_requests() -> None:
    # Prompts that fit one instance of N x the capacity but not one of the fleet's: the
    # ceiling's hit rate is over requests the fleet never served, which it must say.
    reqs = [
        Request(i, np.arange(3000 + i, dtype=np.uint32), np.full(3, 2**31 + i, np.uint32))
        for i in range(4)
    ]
    res = fleet_replay(reqs, "radix", 2000, 2, "round-robin", scheduler=SCHED, ceiling=True)
    s = res.summary()
    assert s["rejected"] == 4 and s["ceiling"]["rejected"] == 0


def _req(i: int, at: float, prompt: np.ndarray, out: int, base: int) -> Request:
    return Request(i, prompt, _toks(2**31 + base, out), arrival=at)


def test_least_loaded_reads_the_load_at_the_arrival_not_at_a_later_finish() -> None:
    """A saturated instance (max_running 1) decoded on to its next finish in one run, past
    the next arrival: the router routing that arrival saw the load the instances would
    have seconds later (both empty), and sent it behind a 10 s request."""
    seen: list[list[int]] = []

    class Spy(LeastLoadedRouter):
        def choose(self, req: Request, now: float, fleet: FleetView) -> int:
            seen.append(list(fleet.load_tokens()))
            return super().choose(req, now, fleet)

    reqs = [
        _req(0, 0.0, _toks(0, 1000), 500, 0),  # decodes until ~10 s
        _req(1, 0.001, _toks(10_000, 100), 200, 10_000),  # until ~4 s
        _req(2, 1.0, _toks(20_000, 100), 10, 20_000),
    ]
    res = fleet_replay(reqs, "radix", 100_000, 2, Spy(), scheduler=TimeScheduler(max_running=1))
    # At 1 s request 0 has generated ~49 tokens and request 1 ~49: both still run.
    assert seen[2][0] > 1000 and 100 < seen[2][1] < 200
    assert res.served_by[2] == 1 and res.records[2].first_token < 4.1


def test_cache_aware_does_not_see_a_tree_insert_from_a_later_finish() -> None:
    """The tree inserts a request's output when it finishes: a router looking before that
    finish must not find the output in the instance's events."""
    held: list[list[int]] = []

    class Spy(CacheAwareRouter):
        def choose(self, req: Request, now: float, fleet: FleetView) -> int:
            held.append(list(fleet.held_blocks(req, now)[0]))
            return super().choose(req, now, fleet)

    head = _toks(0, 1024)
    out = _toks(2**31, 500)
    first = Request(0, head, out, arrival=0.0)  # decodes until ~10 s
    # Arrives at 1 s with the first request's prompt and output as its prefix.
    second = Request(
        1, np.concatenate([head, out, _toks(5000, 16)]), _toks(2**31 + 9000, 4), arrival=1.0
    )
    fleet_replay(
        [first, second], "radix", 100_000, 2, Spy(), scheduler=TimeScheduler(max_running=1)
    )
    assert sorted(held[1]) == [0, 1024 // 16]  # the prompt only: the output enters at ~10 s


def test_late_events_of_a_decode_run_are_not_seen_early() -> None:
    """Events a decode run publishes were stamped with the run's start: a tree's insert
    of a request's output at its finish (~10 s) reached a router whose events are 1 s late
    at ~1 s, nine seconds before it happened. They are stamped with the run's last step."""
    held: list[list[int]] = []

    class Spy(CacheAwareRouter):
        def choose(self, req: Request, now: float, fleet: FleetView) -> int:
            held.append(list(fleet.held_blocks(req, now)[0]))
            return super().choose(req, now, fleet)

    head, out = _toks(0, 1024), _toks(2**31, 500)
    first = Request(0, head, out, arrival=0.0)  # finishes at ~10 s
    tail = _toks(5000, 16)
    reqs = [first]
    reqs += [Request(1, np.concatenate([head, out, tail]), _toks(2**31 + 9000, 4), arrival=10.5)]
    reqs += [Request(2, np.concatenate([head, out, tail]), _toks(2**31 + 9100, 4), arrival=11.5)]
    res = fleet_replay(reqs, "radix", 100_000, 2, Spy(), scheduler=SCHED, event_delay=1.0)
    assert res.records[0].finished == pytest.approx(10.0, abs=0.1)
    assert sorted(held[1]) == [0, 1024 // 16]  # 0.5 s after the finish: the prompt only
    assert max(held[2]) >= (1024 + 496) // 16  # 1.5 s after: the output too


def test_event_losses_draw_apart_from_the_router_ties() -> None:
    # The lossy event path and the cache-aware router's tie draws were two generators
    # seeded alike, so the k-th loss decision repeated the k-th tie draw.
    import random

    from prefixcache.sim.fleet import _EventPath
    from prefixcache.sim.policies import make_policy

    sample = make_policy("vllm-blocks", 1 << 12, publish_events=True)
    for seed in (0, 7):
        path = _EventPath(sample, 2, "xxh3_64", 0.0, 0.1, seed)
        ties = random.Random(seed)
        draws = [path._rng.random() for _ in range(8)]
        assert draws != [ties.random() for _ in range(8)]
        # Still reproducible from the seed.
        again = _EventPath(sample, 2, "xxh3_64", 0.0, 0.1, seed)
        assert [again._rng.random() for _ in range(8)] == draws


def test_cli_fleet_defaults_are_one_vllm_blocks_policy_behind_round_robin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As --help and docs/FLEET_REPLAY.md say: without --policies and --router a fleet
    replay runs vllm-blocks behind round-robin, and it runs one policy only."""
    out = tmp_path / "f.json"
    argv = ["replay", "workload:F", "--instances", "2", "--quiet", "--no-ceiling"]
    assert main([*argv, "--json", str(out)]) == 0
    (s,) = json.loads(out.read_text())["fleet"]
    assert (s["policy"], s["router"], s["instances"]) == ("vllm-blocks", "round-robin", 2)
    capsys.readouterr()
    assert main([*argv, "--policies", "radix,vllm-blocks"]) == 2
    assert "a fleet replay runs one policy" in capsys.readouterr().err
