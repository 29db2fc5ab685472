"""The request-sequence model (``--model sequence``): the Mooncake paper's cache study.

Requests are taken in trace order, one at a time, with nothing else in flight: a
request's prompt is looked up (the hit is its longest cached prefix, capped at
``len(prompt) - 1`` tokens as the engines cap it), then all its prompt blocks are
inserted, then the cache evicts down to its budget. Outputs are not cached (a trace's
next turn carries them in its prompt). There is no clock, no batching and no KV held by
running requests, so the hit rate depends only on the order of requests, the budget and
the eviction and admission rules: the setting in which Belady's rule (``opt``) is exactly
optimal among prefix-closed caches (docs/LAB.md).

Engine policies are driven through the ordinary policy protocol (``admit`` with no
output reserve, ``finish`` at once): they evict before inserting, which for recency rules
is the same as evicting after (the new blocks are the most recent). Lab policies are
switched to evict after inserting (``set_sequence_model``), which lets a rule drop the
new blocks themselves, as Belady may; a prompt larger than the whole budget is then
served (its cached prefix hit, its blocks passing through), as in the paper, where the
engine policies reject it. Hit rates are over the served requests, so ``opt`` bounds the
policies of its block size that served the same requests (rejected as many); the gap
report (``sim/gap.py``) compares only those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from prefixcache.sim.policies import CachePolicy
from prefixcache.sim.requests import RecordColumns, Request, RequestRecord, TokenArray

__all__ = ["SequenceScheduler"]

_EMPTY: TokenArray = np.zeros(0, dtype=np.uint32)


class SequenceScheduler:
    """The request-sequence model (see the module docstring)."""

    model = "sequence"

    def run(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Callable[[int], None] | None = None,
        check: bool = False,
    ) -> list[RequestRecord]:
        return self.run_columns(requests, policy, progress, check).records()

    def run_columns(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Callable[[int], None] | None = None,
        check: bool = False,
    ) -> RecordColumns:
        """What :meth:`run` records, as columns."""
        hook = getattr(policy, "set_sequence_model", None)
        if hook is not None:
            hook()
        records = RecordColumns.for_requests(requests)
        for i, req in enumerate(requests):
            before = policy.evicted_tokens()
            hit = policy.admit(i, req.prompt, 0, req.extra_key, req.cache_salt)
            if hit is None:
                records.rejected[i] = True  # the prompt alone exceeds the budget
            else:
                records.hit_tokens[i] = hit
                if hit:  # no clock: a host hit is loaded, free
                    records.host_hit_tokens[i] = records.loaded_tokens[i] = policy.host_hit(i)
                policy.on_prefill_done(i)
                policy.finish(i, _EMPTY)
            records.evicted_tokens[i] += policy.evicted_tokens() - before
            if check:
                policy.check()
            if progress is not None:
                progress(1)
        return records
