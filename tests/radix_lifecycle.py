"""Request lifecycles (SEMANTICS.md 1.8) driven through several RadixCaches in lockstep:
admission (match prompt[:-1], lock), prefill (insert the prompt with the request's
inserted_len, re-match, move the lock), finish (insert prompt + output, re-match, unlock),
with evictions whenever a KV budget is short. Every result must agree, every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from radix_ops import Lockstep


@dataclass
class Request:
    prompt: list[int]
    output: list[int]
    priority: int
    ns: tuple[str | None, str | None]
    nodes: list[Any] = field(default_factory=list)  # the locked node, one per cache
    values: list[int] = field(default_factory=list)  # the request's KV indices
    inserted_len: int = 0


Plan = tuple[list[Request], list[int], int]


@st.composite
def lifecycle_plans(draw: st.DrawFn, page_size: int) -> Plan:
    """Requests sharing system prompts and earlier turns, a finish/admit schedule and a
    KV budget (in tokens)."""
    tok = st.integers(0, 50)
    systems = draw(
        st.lists(st.lists(tok, min_size=1, max_size=3 * page_size), min_size=1, max_size=3)
    )
    requests: list[Request] = []
    for _ in range(draw(st.integers(1, 12))):
        if len(requests) > 0 and draw(st.booleans()):  # a later turn of an earlier request
            prev = draw(st.sampled_from(requests))
            prompt = prev.prompt + prev.output
            ns = prev.ns
        else:
            prompt = list(draw(st.sampled_from(systems)))
            ns = draw(st.sampled_from([(None, None), ("lora", None), (None, "salt")]))
        prompt = prompt + draw(st.lists(tok, min_size=1, max_size=2 * page_size))
        output = draw(st.lists(tok, max_size=2 * page_size))
        requests.append(Request(prompt, output, draw(st.sampled_from([0, 0, 1, 5])), ns))
    # 1 = admit the next request, 0 = finish the oldest running one
    schedule = draw(
        st.lists(st.integers(0, 1), min_size=2 * len(requests), max_size=2 * len(requests))
    )
    budget = draw(st.integers(4 * page_size, 60 * page_size))
    return requests, schedule, budget


class Lifecycle:
    def __init__(self, step: Lockstep) -> None:
        self.step = step
        self.page = step.caches[0].page_size

    def _all(self, what: str, f: Any) -> list[Any]:
        out = [f(i, c) for i, c in enumerate(self.step.caches)]
        self.step._same(what, [_plain(o) for o in out])
        return out

    def _aligned(self, n: int) -> int:
        return n // self.page * self.page

    def _fresh(self, n: int) -> list[int]:
        v = list(range(self.step.next_value, self.step.next_value + n))
        self.step.next_value += n
        return v

    def _make_room(self, need: int, budget: int) -> None:
        total = self.step.caches[0].total_size()
        if total + need > budget:
            self._all("evict", lambda _i, c: c.evict(total + need - budget))

    def _commit(self, r: Request, tokens: list[int]) -> None:
        """Insert tokens with the request's KV indices, adopt the tree's, move the lock."""
        n = self._aligned(len(tokens))
        vals = r.values[: len(tokens)]
        ek, salt = r.ns
        self._all(
            "insert",
            lambda _i, c: (
                c.insert(
                    np.array(tokens, dtype=np.int64),
                    np.array(vals, dtype=np.int64),
                    extra_key=ek,
                    cache_salt=salt,
                    priority=r.priority,
                    inserted_len=r.inserted_len,
                ).prefix_len
            ),
        )
        r.inserted_len = max(r.inserted_len, n)
        m = self._all("re-match", lambda _i, c: c.match_prefix(tokens[:n], ek, salt))
        r.values[:n] = m[0].indices.tolist()
        self._all("unlock", lambda i, c: c.dec_lock_ref(r.nodes[i]))
        self._all("lock", lambda i, c: c.inc_lock_ref(m[i].node))
        r.nodes = [x.node for x in m]

    def admit(self, r: Request, budget: int) -> None:
        ek, salt = r.ns
        q = r.prompt[:-1]
        m = self._all("admission match", lambda _i, c: c.match_prefix(q, ek, salt))
        self._all("lock", lambda i, c: c.inc_lock_ref(m[i].node))
        r.nodes = [x.node for x in m]
        hit = m[0].length
        self._make_room(len(r.prompt) + len(r.output) - hit, budget)
        r.values = m[0].indices.tolist() + self._fresh(len(r.prompt) + len(r.output) - hit)
        self._commit(r, r.prompt)  # prefill done
        self.step.check()

    def finish(self, r: Request) -> None:
        self._commit(r, r.prompt + r.output)
        self._all("unlock", lambda i, c: c.dec_lock_ref(r.nodes[i]))
        self.step.check()

    def run(self, plan: Plan) -> None:
        requests, schedule, budget = plan
        waiting, running = list(requests), []
        for admit in schedule + [0] * len(requests):
            if admit and waiting:
                r = waiting.pop(0)
                self.admit(r, budget)
                running.append(r)
            elif running:
                self.finish(running.pop(0))
        for c in self.step.caches:
            assert c.protected_size() == 0


def _plain(x: Any) -> Any:
    if hasattr(x, "length"):
        return (x.length, x.indices.tolist())
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x
