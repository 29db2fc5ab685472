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
  A policy with a host tier (``host_hit``) has its host hits loaded at
  ``kv_bytes_per_token / host_gb_per_s`` each when that beats recomputing them (the load
  is part of the batch's time, so of the TTFT), else recomputed; stores are free
  (asynchronous). docs/SIMULATOR.md, "Offload".

Requests are never silently dropped: a request that cannot fit even with nothing else
holding KV is recorded as ``rejected``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError, InvalidTypeError
from prefixcache.sim.policies import CachePolicy
from prefixcache.sim.requests import (
    RecordColumns,
    Request,
    RequestId,
    RequestRecord,
    TokenArray,
    new_record,
)

__all__ = [
    "KV_DTYPE_BYTES",
    "KV_MODELS",
    "KvModel",
    "PrefillCost",
    "SessionGate",
    "SlotScheduler",
    "TimeInstance",
    "TimeScheduler",
]

_EMPTY: TokenArray = np.zeros(0, dtype=np.uint32)

Progress = Callable[[int], None]  # called with the number of requests just completed


def _max_running(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"max_running must be an int >= 1, got {value!r}")
    if value < 1:
        raise InvalidInputError(f"max_running must be >= 1, got {value}")
    return int(value)


class SlotScheduler:
    """The A-F study's model (see the module docstring)."""

    model = "slots"

    def __init__(self, max_running: int = 8) -> None:
        self.max_running = _max_running(max_running)

    def run(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Progress | None = None,
        check: bool = False,
    ) -> list[RequestRecord]:
        return self.run_columns(requests, policy, progress, check).records()

    def run_columns(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Progress | None = None,
        check: bool = False,
    ) -> RecordColumns:
        """What :meth:`run` records, as columns."""
        records = RecordColumns.for_requests(requests)
        hit_tokens, evicted_tokens, rejected = (
            records.hit_tokens,
            records.evicted_tokens,
            records.rejected,
        )
        host_hit_tokens, loaded_tokens = records.host_hit_tokens, records.loaded_tokens
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
            while True:
                before = policy.evicted_tokens()
                hit = policy.admit(i, prompt, req.output_len, req.extra_key, req.cache_salt)
                evicted_tokens[i] += policy.evicted_tokens() - before
                if hit is not None or not running:
                    break
                finish_oldest()
            if hit is None:
                rejected[i] = True
                if progress is not None:
                    progress(1)
                continue
            hit_tokens[i] = hit
            if hit:
                # No clock: a host hit is loaded, free.
                host_hit_tokens[i] = loaded_tokens[i] = policy.host_hit(i)
            policy.on_prefill_done(i)
            if check:
                policy.check()
            running.append(i)
            if req.session is not None:
                active[req.session] = i
        while running:
            finish_oldest()
        return records


KV_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class KvModel:
    """A model's KV cache per token: ``2 x layers x kv_heads x head_dim x dtype bytes``
    (K and V), or ``layers x head_dim x dtype bytes`` for multi-head latent attention
    (``mla``: one latent vector per token and layer, K and V read from it;
    ``head_dim`` is then the latent width, kv_lora_rank + qk_rope_head_dim)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    mla: bool = False

    def __post_init__(self) -> None:
        for field_name in ("layers", "kv_heads", "head_dim"):
            v = getattr(self, field_name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"KvModel.{field_name} must be an int >= 1, got {v!r}")
        if self.dtype not in KV_DTYPE_BYTES:
            raise InvalidInputError(
                f"KV dtype {self.dtype!r}: expected one of {', '.join(KV_DTYPE_BYTES)}"
            )
        if self.mla and self.kv_heads != 1:
            raise InvalidInputError("an MLA model has one latent vector per layer: kv_heads 1")

    @property
    def bytes_per_token(self) -> int:
        kv = 1 if self.mla else 2
        return kv * self.layers * self.kv_heads * self.head_dim * KV_DTYPE_BYTES[self.dtype]


# Published configurations (config.json of each model; docs/SIMULATOR.md, "Offload").
KV_MODELS: dict[str, KvModel] = {
    m.name: m
    for m in (
        KvModel("llama-3.1-8b", 32, 8, 128),
        KvModel("llama-3.1-70b", 80, 8, 128),
        KvModel("qwen2.5-7b", 28, 4, 128),
        KvModel("qwen3-32b", 64, 8, 128),
        KvModel("deepseek-v3", 61, 1, 512 + 64, mla=True),
    )
}
DEFAULT_KV_MODEL = "llama-3.1-8b"


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
    # The second tier (docs/SIMULATOR.md, "Offload"): KV bytes per token (default
    # llama-3.1-8b in bf16, 128 KiB) and the host -> GPU bandwidth in GB/s (10^9 bytes/s;
    # default 25, PCIe 4.0 x16's effective rate).
    kv_bytes_per_token: float = float(KV_MODELS[DEFAULT_KV_MODEL].bytes_per_token)
    host_gb_per_s: float = 25.0

    def __post_init__(self) -> None:
        for name in (
            "base_ms",
            "per_token_ms",
            "attention_ms",
            "decode_step_ms",
            "kv_bytes_per_token",
            "host_gb_per_s",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InvalidInputError(f"PrefillCost.{name} must be a number, got {v!r}")
            if not (math.isfinite(v) and v >= 0):
                raise InvalidInputError(
                    f"PrefillCost.{name} must be a finite number >= 0, got {v!r}"
                )
        if self.host_gb_per_s == 0:
            raise InvalidInputError("PrefillCost.host_gb_per_s must be > 0")

    def prefill_ms(self, prompt: int, hit: int) -> float:
        return (
            self.base_ms
            + self.per_token_ms * (prompt - hit)
            + self.attention_ms * (prompt * prompt - hit * hit) / 2.0
        )

    def load_ms(self, tokens: int) -> float:
        """Time to copy ``tokens`` tokens of KV from host memory to the GPU."""
        return tokens * self.kv_bytes_per_token / (self.host_gb_per_s * 1e6)

    def recompute_ms(self, gpu_hit: int, host_hit: int) -> float:
        """What prefilling the ``host_hit`` tokens after the ``gpu_hit`` ones costs:
        ``prefill_ms(P, gpu_hit) - prefill_ms(P, gpu_hit + host_hit)``, for any P."""
        end = gpu_hit + host_hit
        return (
            self.per_token_ms * host_hit + self.attention_ms * (end * end - gpu_hit * gpu_hit) / 2.0
        )

    def host_load_ms(self, gpu_hit: int, host_hit: int) -> float | None:
        """The load time of a host hit, or None when recomputing it is as fast or faster
        (then the scheduler recomputes those tokens)."""
        load = self.load_ms(host_hit)
        return load if load < self.recompute_ms(gpu_hit, host_hit) else None


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


class TimeInstance:
    """One instance under the time model, advanced one iteration at a time.

    :meth:`TimeScheduler.run` drives one of these over a request list; the fleet replay
    (``prefixcache.sim.fleet``) drives several on one clock. The instance knows nothing
    of sessions: the driver decides when a request is submitted (a session's next turn
    after its previous one finished) and hears of every finished or rejected request
    through ``on_done(index, t)``.

    ``submit(index, request, at)`` queues a request that arrives at ``at`` (seconds); one
    that arrives after the instance's clock waits in ``pending`` until the clock reaches
    it. ``step(next_arrival)`` runs one iteration (a prefill batch or a decode run) from
    :meth:`next_time`; ``next_arrival`` is the next time a request may be submitted from
    outside (it bounds a decode run as an arrival does, so an arrival that could be
    admitted is not kept waiting). ``load_tokens`` is the KV the queued and running
    requests need: prompt plus generated tokens (what a router's load estimate counts).
    ``out_len`` holds the requests' output lengths (indexed like ``records``); instances
    of one fleet share it. ``stop_at_arrivals`` (the fleet sets it) ends a decode run at
    ``next_arrival`` even when the instance could admit nothing then: a router looks at
    the instance at that moment, and must not see its load or its cache as they will be
    later in the run.
    """

    def __init__(
        self,
        scheduler: TimeScheduler,
        policy: CachePolicy,
        records: list[RequestRecord],
        out_len: npt.NDArray[np.int64],
        *,
        on_done: Callable[[int, float], None] | None = None,
        progress: Progress | None = None,
        check: bool = False,
    ) -> None:
        self.max_running = scheduler.max_running
        self.cost = scheduler.cost
        self.preemption = scheduler.preemption
        self.policy = policy
        self.records = records
        self.on_done = on_done
        self.progress = progress
        self.check = check
        self.t = 0.0
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.pending: list[tuple[float, int, _Seq]] = []  # heap: (at, order, seq)
        self._order = 0
        self.admit_paused = False  # after a preemption, until a running request finishes
        self.load_tokens = 0
        # Per running request nothing but array operations, on arrays aligned with
        # `running`: `_run` the request indices, `_gen` their tokens generated so far and
        # `_left` those still to generate (kept up to date as requests join and leave).
        self.out_len = out_len
        self._run = np.zeros(0, dtype=np.int64)
        self._gen = np.zeros(0, dtype=np.int64)
        self._left = np.zeros(0, dtype=np.int64)
        self._in_flight: dict[int, _Seq] = {}  # running requests by index
        self.stop_at_arrivals = False
        # When the events of the latest iteration happened, as a KV event stream stamps
        # them: a prefill batch's at its start (vLLM caches a prompt's blocks when it
        # schedules it), a decode run's at the start of its last step (the step that
        # finishes a request or meets the next arrival; earlier steps' events are then
        # stamped late, never early).
        self.event_time = 0.0
        # A decode run cut at an arrival only because of stop_at_arrivals: (its start,
        # steps taken), so that its continuation lands on the same clock values as the
        # uncut run (start + steps x step, not a sum of shorter runs' roundings).
        self._anchor: tuple[float, int] | None = None

    # -- driver interface ----------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.pending)

    def next_time(self) -> float:
        """When the next iteration starts (inf when there is nothing to do)."""
        if self.running or self.waiting:
            return self.t
        if self.pending:
            return max(self.t, self.pending[0][0])
        return math.inf

    def submit(self, index: int, req: Request, at: float) -> None:
        seq = _Seq(index, req)
        self.load_tokens += req.prompt_len
        if at <= self.t:
            self.records[index].arrival = at
            self._enqueue(seq, at)
        else:
            heapq.heappush(self.pending, (at, self._order, seq))
            self._order += 1

    def _enqueue(self, seq: _Seq, at: float) -> None:
        """Queue ``seq``, which arrived at ``at``, in arrival order (FIFO). A request is
        submitted once the clock has passed its arrival when a decode run went past it
        (nothing could be admitted then): a session turn released at the end of that run
        may be queued already, and must not go ahead of it. Preempted requests, requeued
        at the head, stay ahead."""
        w = self.waiting
        pos = len(w)
        while pos and not w[pos - 1].admitted_once and self.records[w[pos - 1].index].arrival > at:
            pos -= 1
        w.insert(pos, seq)

    def step(self, next_arrival: float | None = None) -> None:
        """Run one iteration: a prefill batch, or a decode run to the next event."""
        if not (self.running or self.waiting):
            if not self.pending:
                return
            self.t = max(self.t, self.pending[0][0])
        self.event_time = self.t
        pend = self.pending
        while pend and pend[0][0] <= self.t:
            at, _, seq = heapq.heappop(pend)
            self.records[seq.index].arrival = at
            self._enqueue(seq, at)
        if pend:
            nxt = pend[0][0]
            next_arrival = nxt if next_arrival is None else min(next_arrival, nxt)
        if self._prefill():
            self._anchor = None
            return
        if self.running:
            self._decode(next_arrival)

    # -- one iteration ---------------------------------------------------------------
    def _outputs(self, i: int) -> TokenArray:
        return self._in_flight[i].output

    def _done(self, seq: _Seq) -> None:
        self.load_tokens -= seq.req.prompt_len + seq.generated
        if self.on_done is not None:
            self.on_done(seq.index, self.t)
        if self.progress is not None:
            self.progress(1)

    def _complete(self, seq: _Seq) -> None:
        self.policy.finish(seq.index, _EMPTY)
        self.records[seq.index].finished = self.t
        self.admit_paused = False
        self._done(seq)
        if self.check:
            self.policy.check()

    def _reject(self, seq: _Seq) -> None:
        self.records[seq.index].rejected = True
        self._done(seq)

    def _prefill(self) -> bool:
        """Admit every queued request that fits, in order; False when none was."""
        policy, records, running, waiting = self.policy, self.records, self.running, self.waiting
        admitted: list[_Seq] = []
        prefill_ms = 0.0
        while (
            waiting
            and len(running) + len(admitted) < self.max_running
            and not (self.admit_paused and running)
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
                    self._reject(seq)
                    continue
                break
            waiting.popleft()
            host = policy.host_hit(seq.index) if hit else 0
            policy.on_prefill_done(seq.index)
            # A host hit is loaded when that beats recomputing it, else recomputed.
            load_ms = None
            if host:
                load_ms = self.cost.host_load_ms(hit - host, host)
                if load_ms is None:
                    hit -= host
                else:
                    prefill_ms += load_ms
            prefill_ms += self.cost.prefill_ms(len(toks), hit)
            if seq.admitted_once:
                rec.recompute_hit_tokens += hit
                rec.recomputed_tokens += len(toks) - hit
            else:
                rec.hit_tokens = hit
                if host:
                    rec.host_hit_tokens = host
                    if load_ms is not None:
                        rec.loaded_tokens = host
                        rec.load_time = load_ms / 1000.0
                seq.admitted_once = True
            if seq.generated < req.output_len:
                seq.generated += 1  # the prefill samples the next token
                self.load_tokens += 1
            admitted.append(seq)
        if not admitted:
            return False
        self.t += prefill_ms / 1000.0
        joined: list[_Seq] = []
        for seq in admitted:
            rec = records[seq.index]
            if math.isnan(rec.first_token):
                rec.first_token = self.t
                rec.ttft = self.t - rec.arrival
            if seq.generated >= seq.req.output_len:
                self._complete(seq)
            else:
                running.append(seq)
                self._in_flight[seq.index] = seq
                joined.append(seq)
        if joined:
            idx = np.fromiter((s.index for s in joined), dtype=np.int64, count=len(joined))
            gen = np.fromiter((s.generated for s in joined), dtype=np.int64, count=len(joined))
            self._run = np.concatenate([self._run, idx])
            self._gen = np.concatenate([self._gen, gen])
            self._left = np.concatenate([self._left, self.out_len[idx] - gen])
        return True

    def _decode(self, next_arrival: float | None) -> None:
        """Advance every running request k steps (k up to the next event)."""
        policy, records, running = self.policy, self.records, self.running
        step = self.cost.decode_step_ms / 1000.0
        run, gen, left = self._run, self._gen, self._left
        k_done = int(left.min())  # the first finish
        k = k_done
        # An arrival matters only if it could be admitted: nothing queued before it
        # (a queue blocked on KV stays blocked until a finish) and a free seat.
        cut = False  # cut at an arrival only a router looks at (stop_at_arrivals)
        if next_arrival is not None:
            admissible = not self.waiting and len(running) < self.max_running
            if admissible or self.stop_at_arrivals:
                gap = next_arrival - self.t
                k_arrival = max(1, math.ceil(gap / step - 1e-9))
                if k_arrival < k:
                    k, cut = k_arrival, not admissible
        g = policy.max_uniform_growth(run, k)
        while g == 0:
            if not self.preemption:  # pragma: no cover - the output was reserved
                raise AssertionError(f"{policy.name}: reserved KV ran out mid-decode")
            victim = running.pop()  # the newest running request
            victim.generated = int(gen[-1])
            run, gen, left = run[:-1], gen[:-1], left[:-1]
            self._run, self._gen, self._left = run, gen, left
            policy.finish(victim.index, _EMPTY)
            del self._in_flight[victim.index]
            if not running:
                # It cannot finish even alone: give up on it, visibly.
                self._reject(victim)
                return
            records[victim.index].preemptions += 1
            self.waiting.appendleft(victim)
            self.admit_paused = True
            if self.check:
                policy.check()
            k_done = int(left.min())
            k = min(k, k_done)
            g = policy.max_uniform_growth(run, k)
        cut = cut and g >= k
        k = min(k, g)
        # Each step feeds the last sampled token: its KV is computed.
        evicted = policy.grow(run, k, gen - 1, self._outputs)
        if evicted is not None:
            for j in np.flatnonzero(evicted).tolist():
                records[int(run[j])].evicted_tokens += int(evicted[j])
        gen += k
        left -= k
        self.load_tokens += k * len(running)
        start, steps = self._anchor if self._anchor is not None else (self.t, 0)
        run_start = self.t
        self.t = start + (steps + k) * step
        self._anchor = (start, steps + k) if cut else None
        self.event_time = max(run_start, self.t - step)
        if k < k_done:
            return  # nobody finished
        done = left == 0
        finished = done.nonzero()[0].tolist()
        leaving = [running[j] for j in finished]
        for j in reversed(finished):
            del running[j]
        keep = ~done
        self._run, self._gen, self._left = run[keep], gen[keep], left[keep]
        for s, j in zip(leaving, finished, strict=True):
            s.generated = int(gen[j])
            self._complete(s)
            del self._in_flight[s.index]


def output_lengths(requests: Sequence[Request]) -> npt.NDArray[np.int64]:
    return np.fromiter((r.output_len for r in requests), dtype=np.int64, count=len(requests))


class TimeScheduler:
    """Continuous batching on a simulated clock (see the module docstring)."""

    model = "time"

    def __init__(
        self, max_running: int = 256, cost: PrefillCost | None = None, preemption: bool = True
    ) -> None:
        self.max_running = _max_running(max_running)
        if cost is not None and not isinstance(cost, PrefillCost):
            raise InvalidTypeError(f"cost must be a PrefillCost, got {cost!r}")
        if not isinstance(preemption, bool | np.bool_):
            raise InvalidTypeError(f"preemption must be True or False, got {preemption!r}")
        self.cost = cost or PrefillCost()
        self.preemption = bool(preemption)
        if self.cost.decode_step_ms <= 0:
            raise InvalidInputError("decode_step_ms must be > 0")

    def instance(
        self,
        policy: CachePolicy,
        records: list[RequestRecord],
        out_len: npt.NDArray[np.int64],
        *,
        on_done: Callable[[int, float], None] | None = None,
        progress: Progress | None = None,
        check: bool = False,
    ) -> TimeInstance:
        """A steppable instance of this model over ``policy`` (records indexed by request,
        ``out_len`` their output lengths)."""
        return TimeInstance(
            self, policy, records, out_len, on_done=on_done, progress=progress, check=check
        )

    def run(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Progress | None = None,
        check: bool = False,
    ) -> list[RequestRecord]:
        records = [new_record(r) for r in requests]
        gate = SessionGate(requests)
        inst = self.instance(
            policy, records, output_lengths(requests), progress=progress, check=check
        )
        inst.on_done = lambda i, t: gate.release(i, t, inst.submit)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)  # stable
        for i in order:
            a = requests[i].arrival
            while inst.next_time() < a:
                inst.step(a)
            gate.arrive(i, a, inst.submit)
        while inst.busy:
            inst.step(None)
        gate.check_drained()
        return records

    def run_columns(
        self,
        requests: Sequence[Request],
        policy: CachePolicy,
        progress: Progress | None = None,
        check: bool = False,
    ) -> RecordColumns:
        """What :meth:`run` records, as columns."""
        return RecordColumns.from_records(self.run(requests, policy, progress, check))


class SessionGate:
    """A session's next turn is submitted only after its previous turn finished (at that
    moment, if it arrived earlier); requests without a session pass straight through.
    A session's turns are its requests in the order given (trace order, as the other
    models take them), whatever their arrival times: a turn that arrives before the one
    given ahead of it waits for that one to arrive and finish."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests
        self.turns: dict[RequestId, deque[int]] = {}  # session -> turns not yet submitted
        for i, r in enumerate(requests):
            if r.session is not None:
                self.turns.setdefault(r.session, deque()).append(i)
        self.arrived: set[int] = set()  # turns that arrived and wait
        self.active: set[RequestId] = set()  # sessions with a turn in flight
        # When each session's latest turn finished: a turn whose arrival is processed
        # late (a decode run went past it) enters the queue no earlier than that.
        self.finished_at: dict[RequestId, float] = {}

    def arrive(self, i: int, at: float, submit: Callable[[int, Request, float], None]) -> None:
        req = self.requests[i]
        if req.session is None:
            submit(i, req, at)
            return
        self.arrived.add(i)
        self._next(req.session, max(at, self.finished_at.get(req.session, at)), submit)

    def _next(self, s: RequestId, at: float, submit: Callable[[int, Request, float], None]) -> None:
        """Submit session ``s``'s next turn at ``at`` if it arrived and none is in flight."""
        q = self.turns[s]
        if s in self.active or not q or q[0] not in self.arrived:
            return
        i = q.popleft()
        self.arrived.discard(i)
        self.active.add(s)
        submit(i, self.requests[i], at)

    def release(self, i: int, t: float, submit: Callable[[int, Request, float], None]) -> None:
        """Request ``i`` finished (or was rejected) at ``t``: let its session's next turn in."""
        s = self.requests[i].session
        if s is None:
            return
        self.active.discard(s)
        self.finished_at[s] = t
        self._next(s, t, submit)  # it arrived earlier; it may start now

    def check_drained(self) -> None:
        if any(self.turns.values()):  # cannot happen: a finish releases its session
            raise AssertionError("session turns blocked with nothing running")
