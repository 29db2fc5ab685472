"""TensorRT-LLM's block trie (``prefixcache.BlockTrie``) behind the simulator's
:class:`~prefixcache.sim.policies.CachePolicy` protocol: policies ``trtllm`` and
``trtllm-nopartial`` (64-token blocks, TensorRT-LLM's default) and ``trtllm<N>`` /
``trtllm-nopartial<N>`` for N-token blocks.

Lifecycle (docs/TRTLLM.md): ``claim`` the prompt with the output reserved (the reuse
covers at most ``len(prompt) - 1`` tokens and may end on a partially matched block that
is taken over or copied; copies are completed at once), ``store`` the prompt when prefill
is done (TensorRT-LLM caches context blocks after the context phase), ``extend`` as output
grows, and at finish ``store`` prompt + output (the partial last block included) and
``release`` the blocks in reverse order. Capacity ``C`` tokens = ``C // N`` blocks (no
null block). Evicted tokens count the tokens of the cached blocks that were reused
(a partial block counts its own tokens).

``cpu_capacity`` > 0 (tokens) puts TensorRT-LLM's secondary (host) tier of
``cpu_capacity // N`` blocks behind the GPU (``BlockTrie(host_blocks=...)``, rules in
docs/TRTLLM.md); ``offload`` is ``"host"`` or ``"host:P"`` with P the lowest priority
offloaded (``secondary_offload_min_priority``, default 30). A claim's matched host blocks
are onboarded at admission: they are the host hit (``host_hit(rid)``). Offloaded blocks
count as evicted from the GPU (evicted tokens and evictions include them) and as stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError, OutOfBlocksError
from prefixcache.sim.policies.base import (
    IndexArray,
    OutputsOf,
    PolicyStats,
    grow_each,
    max_block_growth,
)
from prefixcache.sim.policies.tree_events import StoreContext, TrieEventKeys
from prefixcache.sim.requests import RequestId, TokenArray, namespace_seed

__all__ = ["TRTLLM_DEFAULT_BLOCK", "TrtllmPolicy", "parse_trtllm_name", "parse_trtllm_offload"]

TRTLLM_DEFAULT_BLOCK = 64
# TensorRT-LLM's default secondary_offload_min_priority (evictionPolicy.cpp).
TRTLLM_OFFLOAD_MIN_PRIORITY = 30


def parse_trtllm_name(name: str) -> tuple[int, bool] | None:
    """``trtllm[-nopartial][<N>]`` -> (block size, partial reuse), else None."""
    for prefix, partial in (("trtllm-nopartial", False), ("trtllm", True)):
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            if rest == "":
                return TRTLLM_DEFAULT_BLOCK, partial
            if rest.isascii() and rest.isdigit() and int(rest) > 0:
                return int(rest), partial
            return None
    return None


def parse_trtllm_offload(offload: str | None) -> int:
    """The lowest priority offloaded, from an offload name: "host" (default, priority 30)
    or "host:P" with P in 0..100."""
    name, sep, p = (offload or "host").partition(":")
    if name == "host" and not sep:
        return TRTLLM_OFFLOAD_MIN_PRIORITY
    if name == "host" and p.isascii() and p.isdigit() and str(int(p)) == p and int(p) <= 100:
        return int(p)
    raise InvalidInputError(
        f"offload must be host, optionally :P (a priority in 0..100), got {offload!r}"
    )


class _Seq:
    __slots__ = ("allocated", "appended", "iid", "known", "prompt", "seed")

    def __init__(self, iid: int, prompt: TokenArray, allocated: int, seed: int = 0) -> None:
        self.iid = iid
        self.prompt = prompt
        self.seed = seed  # the namespace seed of the router's keys (published events)
        self.allocated = allocated  # tokens of KV reserved (prompt + output lookahead)
        self.known = len(prompt)  # tokens whose KV exists
        self.appended: list[TokenArray] = []


class TrtllmPolicy:
    """TensorRT-LLM's block reuse: per-block trie, partial reuse, priority LRU."""

    eviction_unit = "blocks"

    @staticmethod
    def check_sizes(capacity: int, tokens_per_block: int, cpu_capacity: int, name: str) -> None:
        """Raise InvalidInputError unless the trie can be built for these sizes: what the
        constructor checks, without allocating the trie's blocks (which it does up front)."""
        if tokens_per_block < 1:
            raise InvalidInputError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
        if capacity < tokens_per_block:
            raise InvalidInputError(
                f"{name}: capacity {capacity} is less than one {tokens_per_block}-token block"
            )
        if isinstance(cpu_capacity, bool) or not isinstance(cpu_capacity, int) or cpu_capacity < 0:
            raise InvalidInputError(f"cpu_capacity must be an int >= 0, got {cpu_capacity!r}")
        if 0 < cpu_capacity < tokens_per_block:
            raise InvalidInputError(
                f"{name}: cpu_capacity {cpu_capacity} is less than one {tokens_per_block}-token "
                "block"
            )
        blocks, host = capacity // tokens_per_block, cpu_capacity // tokens_per_block
        problem = None
        if not 1 <= blocks < 2**32 - 1:  # the trie's limits (BlockTrie)
            problem = f"num_blocks must be in [1, 2**32 - 1), got {blocks}"
        elif blocks + host >= 2**32 - 1:
            problem = f"num_blocks + host_blocks must be < 2**32 - 1, got {blocks} + {host}"
        if problem is not None:
            raise InvalidInputError(
                f"{name} with a capacity of {capacity} tokens ({blocks} blocks of "
                f"{tokens_per_block}) and a host capacity of {cpu_capacity} tokens: {problem}"
            )

    def __init__(
        self,
        capacity: int,
        *,
        tokens_per_block: int = TRTLLM_DEFAULT_BLOCK,
        partial_reuse: bool = True,
        copy_on_partial_reuse: bool = True,
        trie_cls: Callable[..., Any] | None = None,
        name: str | None = None,
        cpu_capacity: int = 0,
        offload: str | None = None,
        publish_events: bool = False,
    ) -> None:
        self.name = name or ("trtllm" if partial_reuse else "trtllm-nopartial")
        self.check_sizes(capacity, tokens_per_block, cpu_capacity, self.name)
        min_priority = parse_trtllm_offload(offload)
        if trie_cls is None:
            from prefixcache import BlockTrie

            trie_cls = BlockTrie
        self.capacity = capacity
        self.block_size = tokens_per_block
        self.num_blocks = capacity // tokens_per_block
        self.cpu_capacity = cpu_capacity
        self.host_blocks = cpu_capacity // tokens_per_block
        self.offload = offload if cpu_capacity > 0 else None
        tier: dict[str, Any] = {}
        if self.host_blocks:
            tier = {"host_blocks": self.host_blocks, "secondary_offload_min_priority": min_priority}
        try:
            self.trie = trie_cls(
                self.num_blocks,
                tokens_per_block,
                partial_reuse,
                copy_on_partial_reuse,
                enable_events=publish_events,
                **tier,
            )
        except InvalidInputError as e:
            # Named in the caller's terms: the capacities, not the trie's block counts.
            raise InvalidInputError(
                f"{self.name} with a capacity of {capacity} tokens ({self.num_blocks} blocks "
                f"of {tokens_per_block}) and a host capacity of {cpu_capacity} tokens: {e}"
            ) from None
        # The trie's events in the router's keys (publish_events), else none recorded.
        self.events = TrieEventKeys(tokens_per_block) if publish_events else None
        self._host_hit: dict[RequestId, int] = {}  # host part of the last admit's hit, by request
        self._host_hit_tokens = 0
        self.seqs: dict[RequestId, _Seq] = {}
        self._ids: dict[RequestId, int] = {}
        self._loras: dict[str, int] = {}
        self._peak = 0
        self._peak_cached = 0

    def _iid(self, rid: RequestId) -> int:
        iid = self._ids.get(rid)
        if iid is None:
            iid = self._ids[rid] = len(self._ids)
        return iid

    def _note_usage(self) -> None:
        used = (self.num_blocks - int(self.trie.num_free_blocks)) * self.block_size
        self._peak = max(self._peak, used)

    def _note_cached(self) -> None:
        self._peak_cached = max(self._peak_cached, int(self.trie.num_cached_tokens))

    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        if rid in self.seqs:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        lora = None
        if extra_key is not None:
            lora = self._loras.setdefault(extra_key, len(self._loras))
        iid = self._iid(rid)
        try:
            c = self.trie.claim(
                iid,
                prompt,
                lora_id=lora,
                cache_salt=cache_salt or None,
                reserve_tokens=reserve,
            )
        except OutOfBlocksError:
            return None
        if c.copies:
            self.trie.complete(iid)  # the simulated copy is done at once
        seed = namespace_seed(extra_key, cache_salt) if self.events is not None else 0
        self.seqs[rid] = _Seq(iid, prompt, len(prompt) + reserve, seed)
        self._note_usage()
        if self.host_blocks:
            host = int(c.num_host_tokens)
            if host or rid in self._host_hit:
                self._host_hit[rid] = host
            self._host_hit_tokens += host
        return int(c.num_matched_tokens)

    def host_hit(self, rid: RequestId) -> int:
        return self._host_hit.get(rid, 0)

    def on_prefill_done(self, rid: RequestId) -> None:
        seq = self.seqs[rid]
        self.trie.store(seq.iid, seq.prompt)
        self._follow(seq, seq.prompt)
        self._note_cached()

    def append(self, rid: RequestId, tokens: TokenArray) -> bool:
        """KV for ``tokens`` more tokens of one request (False: the trie is short)."""
        seq = self.seqs[rid]
        n = len(tokens)
        try:
            self.trie.extend(seq.iid, seq.known + n)
        except OutOfBlocksError:
            return False
        seq.known += n
        seq.appended.append(tokens)
        seq.allocated = max(seq.allocated, seq.known)
        self._note_usage()
        return True

    def grow(
        self,
        rids: IndexArray,
        k: int,
        fed_from: IndexArray,
        outputs: OutputsOf,
    ) -> IndexArray | None:
        return grow_each(self.name, rids, k, fed_from, outputs, self.append, self.evicted_tokens)

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        seq = self.seqs[rid]
        if seq.known + len(tail) > seq.allocated:
            raise InvalidInputError(f"request {rid!r}: {len(tail)} more tokens exceed its KV")
        del self.seqs[rid]
        parts = [seq.prompt, *seq.appended]
        if len(tail):
            parts.append(tail)
        tokens = np.concatenate(parts) if len(parts) > 1 else seq.prompt
        self.trie.store(seq.iid, tokens)
        self._follow(seq, tokens)
        self.trie.release(seq.iid)
        self._note_cached()

    def _follow(self, seq: _Seq | None = None, stored: TokenArray | None = None) -> None:
        """Translate the trie's pending events; after ``store(seq.iid, stored)`` the
        stored runs among them are runs of that request's blocks."""
        if self.events is None:
            return
        ctx = None
        if seq is not None and stored is not None:
            ctx = StoreContext(stored, self.trie.request_blocks(seq.iid), self.block_size, seq.seed)
        self.events.follow(self.trie.take_events(compact=True), ctx)

    def take_events(self) -> list[dict[str, Any]]:
        """The KV events (``"type"``-tagged dicts: full blocks stored, removed and moved
        between GPU and host, in the router's keys) since the last call, in order; needs
        ``publish_events=True``."""
        if self.events is None:
            raise InvalidInputError(f"{self.name} was built without publish_events=True")
        self._follow()  # removals and moves only: stores are followed as they happen
        return self.events.take()

    def max_uniform_growth(
        self,
        rids: Sequence[RequestId] | IndexArray,
        limit: int | None = None,
    ) -> int:
        if not len(rids):
            return 0
        seqs = [self.seqs[r] for r in (rids.tolist() if isinstance(rids, np.ndarray) else rids)]
        have = np.array([s.allocated for s in seqs], dtype=np.int64)
        known = np.array([s.known for s in seqs], dtype=np.int64)
        return max_block_growth(have, known, self.block_size, int(self.trie.num_free_blocks), limit)

    def evicted_tokens(self) -> int:
        """Tokens of cached blocks that left the GPU (evicted, or offloaded to host)."""
        return int(self.trie.num_tokens_left_gpu)

    def stats(self) -> PolicyStats:
        s = self.trie.stats
        extra = {
            k: int(s[k]) for k in ("partial_hits", "partial_tokens", "copies", "copied_tokens")
        }
        st = PolicyStats(
            self.name,
            self.capacity,
            self.eviction_unit,
            int(s["evicted_tokens"]),
            int(s["evicted_blocks"]),
            int(self.trie.num_cached_tokens),
            self._peak,
            self._peak_cached,
            extra=extra,
        )
        if self.host_blocks:
            h = self.trie.host_stats()
            st.evicted_tokens += int(h["stored_tokens"])
            st.evictions += int(h["offloaded_blocks"])
            st.note_host_tier(self.cpu_capacity, self._host_hit_tokens, h)
        return st

    def check(self) -> None:
        self.trie.check_invariants()
        if int(self.trie.num_requests) != len(self.seqs):
            raise AssertionError(f"{self.name}: request count differs from the trie's")
        if self.host_blocks and int(self.trie.num_host_cached_blocks) > self.host_blocks:
            raise AssertionError(f"{self.name}: host tier over its capacity")
