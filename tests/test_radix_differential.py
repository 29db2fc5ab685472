"""The Rust core RadixCache against the plain-Python reference: every result, every size and
the whole canonical dump must agree after every operation of random sequences."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from radix_lifecycle import Lifecycle, Plan, lifecycle_plans
from radix_ops import Lockstep, Op, op_sequences

import prefixcache
from prefixcache.reference import radix as reference

POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
PAGE_SIZES = [1, 2, 4, 16]

# Shrinking a failing 40-step sequence takes minutes; by default a failure is reported as
# found (the message names the step). RADIX_SHRINK=1 shrinks it to a minimal reproducer.
PHASES = [p for p in Phase if os.environ.get("RADIX_SHRINK") == "1" or p is not Phase.shrink]
# RADIX_EXAMPLES=2000 for a long soak run (CI uses the default).
EXAMPLES = int(os.environ.get("RADIX_EXAMPLES", "60"))

Core: Any = getattr(prefixcache, "RadixCache", None)
needs_core = pytest.mark.skipif(Core is None, reason="prefixcache.RadixCache (the core) not built")


def run(ops: list[Op], page_size: int, policy: str, core: Any) -> None:
    step = Lockstep([core(page_size, policy), reference.RadixCache(page_size, policy)])
    step.check()
    for i, op in enumerate(ops):
        try:
            step.apply(op)
        except AssertionError as e:
            raise AssertionError(f"step {i} {op!r}: {e}") from e


@needs_core
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_core_matches_reference(policy: str, page_size: int) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(ops=op_sequences(page_size))
    def check(ops: list[Op]) -> None:
        run(ops, page_size, policy, Core)

    check()


@pytest.mark.parametrize("policy", ["lru", "slru"])
def test_harness_reference_against_itself(policy: str) -> None:
    """The lockstep harness itself (reference vs reference), so it runs without the core."""

    @settings(
        max_examples=20,
        deadline=None,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(ops=op_sequences(2))
    def check(ops: list[Op]) -> None:
        run(ops, 2, policy, reference.RadixCache)

    check()


@needs_core
@pytest.mark.parametrize("policy", POLICIES)
def test_tie_between_split_tail_and_new_leaf(policy: str) -> None:
    """One insert splits [1,2,3] and puts [4] beside the tail [3]: both have the same
    logical time. SGLang 0.5.23 (checked, docs/ANCHORS.md) frees the tail first under lru,
    the new leaf first under mru; the serial tie-break must reproduce both."""
    ops: list[Op] = [
        ("insert", [1, 2, 3], (None, None), 0, 0),
        ("insert", [1, 2, 4], (None, None), 0, 0),
        ("evict", 1),
        ("evict", 1),
        ("evict", 1),
    ]
    run(ops, 1, policy, Core)


@needs_core
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "lfu", "priority", "slru"])
def test_request_lifecycles_agree(policy: str, page_size: int) -> None:
    """Admission, prefill and finish of overlapping multi-turn requests under a KV budget
    (SEMANTICS.md 1.8), with inserted_len tracked per request as SGLang's scheduler does."""

    @settings(
        max_examples=max(EXAMPLES // 2, 10),
        deadline=None,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(plan=lifecycle_plans(page_size))
    def check(plan: Plan) -> None:
        Lifecycle(Lockstep([Core(page_size, policy), reference.RadixCache(page_size, policy)])).run(
            plan
        )

    check()
