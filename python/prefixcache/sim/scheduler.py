"""Schedulers: drive requests through one cache policy and record what happened.

Two models (docs/SIMULATOR.md describes both):

- :class:`SlotScheduler` (``--model slots``): the A-F study's model (SEMANTICS.md 5). At
  most ``max_running`` requests hold KV; they finish first-in-first-out; a request takes
  KV for its prompt and all its output at admission; a session's next turn is admitted
  only after its previous turn finished (the oldest running requests are finished until
  it has); when KV is short the oldest running request is finished and admission retried.
  There is no clock.
- :class:`TimeScheduler` (``--model time``): continuous batching on a simulated clock.
  Requests arrive at their trace times and queue FIFO; an iteration either prefills
  every queued request that fits (whole prompts, no chunking; up to ``max_running``
  running; KV taken for the prompt; the prefill samples the first token) or decodes all
  requests (one token each per step: the last sampled token is fed and its KV taken, so
  a request ends holding KV for its prompt and all output but the last token, which is
  what SGLang and vLLM cache at finish). Decode advances in bulk to
  the next event (a finish, an arrival that could be admitted, memory exhaustion), so
  nothing loops per token. When KV runs out mid-decode the newest running request is
  preempted (its KV released as if it finished, the tokens computed so far cached) and
  requeued at the head to be recomputed; no new request is admitted until a running one
  finishes. With ``preemption=False`` (``--no-preemption``) each request instead reserves
  KV for its whole output at admission, so decode never runs short (fewer requests fit).
  Prefill time = base + per_token * uncached + attention * (P^2 - hit^2) / 2;
  decode step = ``decode_step_ms``. TTFT = end of the request's prefill - its arrival.

Requests are never silently dropped: a request that cannot fit even with nothing else
holding KV is recorded as ``rejected``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies import CachePolicy
from prefixcache.sim.requests import Request, RequestId, RequestRecord, TokenArray, new_record

__all__ = ["PrefillCost", "SlotScheduler", "TimeScheduler"]

_EMPTY: TokenArray = np.zeros(0, dtype=np.uint32)

Progress = Callable[[int], None]  # called with the number of requests just completed


class SlotScheduler:
    """The A-F study's model (see the module docstring)."""

    model = "slots"

    def __init__(self, max_running: int = 8) -> None:
        if max_running < 1:
            raise InvalidInputError(f"max_running must be >= 1, got {max_running}")
        self.max_running = max_running

    def run(
        self, requests: Sequence[Request], policy: CachePolicy,
        progress: Progress | None = None, check: bool = False,
    ) -> list[RequestRecord]:
        records = [new_record(r) for r in requests]
        running: deque[int] = deque()
        active: dict[RequestId, int] = {}  # session -> running request index
        done = 0

        def finish_oldest() -> None:
            nonlocal done
            i = running.popleft()
            req = requests[i]
            policy.finish(i, req.output)
            if req.session is not None and active.get(req.session) == i:
                del active[req.session]
            done += 1
            if progress is not None:
                progress(1)
            if check:
                policy.check()

        for i, req in enumerate(requests):
            if req.session is not None:
                while req.session in active:
                    finish_oldest()
            while len(running) >= self.max_running:
                finish_oldest()
            prompt = req.prompt
            rec = records[i]
            while True:
                before = policy.evicted_tokens()
                hit = policy.admit(i, prompt, req.output_len, req.extra_key, req.cache_salt)
                rec.evicted_tokens += policy.evicted_tokens() - before
                if hit is not None or not running:
                    break
                finish_oldest()
            if hit is None:
                rec.rejected = True
                if progress is not None:
                    progress(1)
                continue
            rec.hit_tokens = hit
            policy.on_prefill_done(i)
            if check:
                policy.check()
            running.append(i)
            if req.session is not None:
                active[req.session] = i
        while running:
            finish_oldest()
        return records


@dataclass(frozen=True)
class PrefillCost:
    """Prefill time model: base + per_token * uncached + attention * (P^2 - hit^2) / 2 (ms).

    The attention term counts the (query, key) pairs of the uncached tokens: token i
    attends to i earlier tokens, summed over i in [hit, P). The defaults are illustrative
    only (100k prefill tokens/s, as a multi-GPU instance, so that the Mooncake
    conversation trace does not overload it); pass your hardware's numbers.
    """

    base_ms: float = 5.0
    per_token_ms: float = 0.01
    attention_ms: float = 1e-7
    decode_step_ms: float = 20.0

    def __post_init__(self) -> None:
        for name in ("base_ms", "per_token_ms", "attention_ms", "decode_step_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InvalidInputError(f"PrefillCost.{name} must be a number, got {v!r}")
            if not (math.isfinite(v) and v >= 0):
                raise InvalidInputError(
                    f"PrefillCost.{name} must be a finite number >= 0, got {v!r}")

    def prefill_ms(self, prompt: int, hit: int) -> float:
        return (self.base_ms + self.per_token_ms * (prompt - hit)
                + self.attention_ms * (prompt * prompt - hit * hit) / 2.0)


class _Seq:
    __slots__ = ("_output", "admitted_once", "generated", "index", "req")

    def __init__(self, index: int, req: Request) -> None:
        self.index = index
        self.req = req
        self.generated = 0  # output tokens sampled so far (kept in the array while running)
        self.admitted_once = False
        self._output: TokenArray | None = None

    @property
    def output(self) -> TokenArray:
        """The request's output tokens, materialised once while it is in flight."""
        if self._output is None:
            self._output = self.req.output
        return self._output

    def tokens(self) -> TokenArray:
        if self.generated == 0:
            return self.req.prompt
        return np.concatenate([self.req.prompt, self.output[: self.generated]])


class TimeScheduler:
    """Continuous batching on a simulated clock (see the module docstring)."""

    model = "time"

    def __init__(self, max_running: int = 256, cost: PrefillCost | None = None,
                 preemption: bool = True) -> None:
        if max_running < 1:
            raise InvalidInputError(f"max_running must be >= 1, got {max_running}")
        self.max_running = max_running
        self.cost = cost or PrefillCost()
        self.preemption = preemption
        if self.cost.decode_step_ms <= 0:
            raise InvalidInputError("decode_step_ms must be > 0")

    def run(
        self, requests: Sequence[Request], policy: CachePolicy,
        progress: Progress | None = None, check: bool = False,
    ) -> list[RequestRecord]:
        n = len(requests)
        records = [new_record(r) for r in requests]
        order = sorted(range(n), key=lambda i: requests[i].arrival)  # stable
        step = self.cost.decode_step_ms / 1000.0
        waiting: deque[_Seq] = deque()
        running: list[_Seq] = []
        blocked: dict[RequestId, deque[_Seq]] = {}  # session -> turns waiting for a turn
        active: dict[RequestId, int] = {}  # session -> unfinished turn count in flight
        t = 0.0
        nxt = 0
        admit_paused = False  # after a preemption, until a running request finishes
        gen = np.zeros(n, dtype=np.int64)  # output tokens sampled, per running request
        out_len = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n)
        run = np.zeros(0, dtype=np.int64)
        run_dirty = False
        in_flight: dict[int, _Seq] = {}  # running requests by index

        def outputs(i: int) -> TokenArray:
            return in_flight[i].output

        def enqueue(seq: _Seq, at: float) -> None:
            s = seq.req.session
            if s is not None:
                if active.get(s, 0) > 0:
                    blocked.setdefault(s, deque()).append(seq)
                    return
                active[s] = 1
            records[seq.index].arrival = at
            waiting.append(seq)

        def release_session(seq: _Seq) -> None:
            s = seq.req.session
            if s is None:
                return
            active[s] = 0
            q = blocked.get(s)
            if q:
                enqueue(q.popleft(), t)  # it arrived earlier; it may start now

        def complete(seq: _Seq) -> None:
            nonlocal admit_paused
            policy.finish(seq.index, _EMPTY)
            records[seq.index].finished = t
            admit_paused = False
            release_session(seq)
            if progress is not None:
                progress(1)
            if check:
                policy.check()

        def reject(seq: _Seq) -> None:
            records[seq.index].rejected = True
            release_session(seq)
            if progress is not None:
                progress(1)

        while nxt < n or waiting or running:
            while nxt < n and requests[order[nxt]].arrival <= t:
                i = order[nxt]
                enqueue(_Seq(i, requests[i]), requests[i].arrival)
                nxt += 1
            if not running and not waiting:
                if nxt < n:
                    t = max(t, requests[order[nxt]].arrival)
                    continue
                if any(blocked.values()):  # cannot happen: a finish releases its session
                    raise AssertionError("session turns blocked with nothing running")
                break
            # -- prefill: admit every queued request that fits, in order --------------
            admitted: list[_Seq] = []
            prefill_ms = 0.0
            while waiting and len(running) + len(admitted) < self.max_running and not (
                admit_paused and running
            ):
                seq = waiting[0]
                req = seq.req
                toks = seq.tokens()
                rec = records[seq.index]
                before = policy.evicted_tokens()
                # Without preemption the output's KV is reserved up front (prompt +
                # output[:-1] over the request's life), so decode never runs short.
                reserve = 0 if self.preemption else max(0, req.output_len - 1)
                hit = policy.admit(seq.index, toks, reserve, req.extra_key, req.cache_salt)
                rec.evicted_tokens += policy.evicted_tokens() - before
                if hit is None:
                    if not running and not admitted:
                        waiting.popleft()
                        reject(seq)
                        continue
                    break
                waiting.popleft()
                policy.on_prefill_done(seq.index)
                prefill_ms += self.cost.prefill_ms(len(toks), hit)
                if seq.admitted_once:
                    rec.recompute_hit_tokens += hit
                    rec.recomputed_tokens += len(toks) - hit
                else:
                    rec.hit_tokens = hit
                    seq.admitted_once = True
                if seq.generated < req.output_len:
                    seq.generated += 1  # the prefill samples the next token
                admitted.append(seq)
            if admitted:
                t += prefill_ms / 1000.0
                for seq in admitted:
                    rec = records[seq.index]
                    if math.isnan(rec.first_token):
                        rec.first_token = t
                        rec.ttft = t - rec.arrival
                    if seq.generated >= seq.req.output_len:
                        complete(seq)
                    else:
                        running.append(seq)
                        gen[seq.index] = seq.generated
                        in_flight[seq.index] = seq
                        run_dirty = True
                continue
            if not running:
                continue  # waiting requests were rejected; loop picks up arrivals
            # -- decode: advance every running request k steps -------------------------
            # Per running request nothing but array operations: `gen` and `out_len` are
            # indexed by request, `run` lists the running ones in order.
            if run_dirty:
                run = np.fromiter((s.index for s in running), dtype=np.int64,
                                  count=len(running))
                run_dirty = False
            k = int((out_len[run] - gen[run]).min())
            # An arrival matters only if it could be admitted: nothing queued before it
            # (a queue blocked on KV stays blocked until a finish) and a free seat.
            if nxt < n and not waiting and len(running) < self.max_running:
                gap = requests[order[nxt]].arrival - t
                k = min(k, max(1, math.ceil(gap / step - 1e-9)))
            g = policy.max_uniform_growth(run, k)
            while g == 0:
                if not self.preemption:  # pragma: no cover - the output was reserved
                    raise AssertionError(f"{policy.name}: reserved KV ran out mid-decode")
                victim = running.pop()  # the newest running request
                run = run[:-1]
                victim.generated = int(gen[victim.index])
                policy.finish(victim.index, _EMPTY)
                del in_flight[victim.index]
                if not running:
                    # It cannot finish even alone: give up on it, visibly.
                    reject(victim)
                    break
                records[victim.index].preemptions += 1
                waiting.appendleft(victim)
                admit_paused = True
                if check:
                    policy.check()
                g = policy.max_uniform_growth(run, k)
            if not running:
                continue
            k = min(k, g)
            # Each step feeds the last sampled token: its KV is computed.
            evicted = policy.grow(run, k, gen[run] - 1, outputs)
            if evicted is not None:
                for j in np.flatnonzero(evicted).tolist():
                    records[int(run[j])].evicted_tokens += int(evicted[j])
            gen[run] += k
            t += k * step
            done = gen[run] >= out_len[run]
            if done.any():
                still: list[_Seq] = []
                for s, d in zip(running, done.tolist(), strict=True):
                    if d:
                        s.generated = int(gen[s.index])
                        complete(s)
                        del in_flight[s.index]
                    else:
                        still.append(s)
                running = still
                run_dirty = True
        return records
