"""Statistics of a request list: sizes, arrival span and the hit-rate ceilings.

The ceilings are the hit rate (prompt tokens reused / prompt tokens, as ``replay``
reports it) of an infinite cache that keeps every token - prompt and output - of every
earlier request, taken in list order, with reuse capped at ``len(prompt) - 1`` as every
policy caps it and requests kept apart by their ``extra_key`` / ``cache_salt``:

- ``hit_rate_ceiling``: at token granularity - no policy replayed in list order can hit
  more (the slot model admits in list order; so does the time model unless a session's
  turn, waiting for its previous turn, is overtaken by a later request).
- ``block_hit_rate_ceiling``: the same counted in full ``block_size`` blocks - the
  ceiling of a block cache of that block size (``vllm-blocks``, the lab policies).
  ``trtllm-nopartial`` can pass it: it also reuses a non-full block whose key matches
  exactly, as TensorRT-LLM does (docs/TRTLLM.md).

Only the first ``max(prompt lengths)`` tokens of any request can be reused by a later
prompt, so longer outputs are cut there (a 2**31-token output costs nothing). For a
Mooncake trace the prompts are sequences of 512-token hash-id blocks and outputs are
fresh tokens no prompt holds, so the ceilings are computed on the ids, without
expanding a single prompt.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefixcache import RadixCache
from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import Request, TokenArray
from prefixcache.sim.traces import MOONCAKE_BLOCK

__all__ = ["trace_stats"]


def trace_stats(
    requests: Sequence[Request], block_size: int = 512, hash_ids: Sequence[TokenArray] | None = None
) -> dict[str, Any]:
    """Sizes, arrival span and hit-rate ceilings (see the module docstring). With
    Mooncake ``hash_ids`` also the trace's own block-id figures (every id, the partial last
    block included, as the trace README counts them)."""
    if block_size < 1:
        raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
    n = len(requests)
    plen = np.array([r.prompt_len for r in requests], dtype=np.int64)
    olen = np.array([r.output_len for r in requests], dtype=np.int64)
    arr = np.array([r.arrival for r in requests], dtype=np.float64)
    prompt_total = int(plen.sum())
    if hash_ids is not None:
        hits, block_hits = _mooncake_ceilings(requests, hash_ids, block_size)
    else:
        hits = _token_ceiling(requests)
        block_hits = _block_ceiling(requests, block_size)
    sessions = {r.session for r in requests if r.session is not None}
    extra: dict[str, Any] = {}
    if hash_ids is not None:
        ids = np.concatenate(hash_ids) if hash_ids else np.zeros(0, dtype=np.uint32)
        distinct = int(np.unique(ids).size)
        extra = {
            "hash_id_refs": int(ids.size),
            "distinct_hash_ids": distinct,
            "hash_id_repeat_share": (ids.size - distinct) / ids.size if ids.size else 0.0,
        }

    def q(a: np.ndarray, p: float) -> float:
        return float(np.percentile(a, p)) if a.size else 0.0

    span = float(arr.max() - arr.min()) if n else 0.0
    return {
        "requests": n,
        "sessions": len(sessions),
        "prompt_tokens": prompt_total,
        "output_tokens": int(olen.sum()),
        "prompt_mean": float(plen.mean()) if n else 0.0,
        "prompt_p50": q(plen, 50),
        "prompt_p99": q(plen, 99),
        "prompt_max": int(plen.max()) if n else 0,
        "output_mean": float(olen.mean()) if n else 0.0,
        "output_p50": q(olen, 50),
        "output_p99": q(olen, 99),
        "arrival_first_s": float(arr.min()) if n else 0.0,
        "arrival_last_s": float(arr.max()) if n else 0.0,
        "request_rate_per_s": n / span if n > 1 and span > 0 else math.nan,
        "hit_rate_ceiling": hits / prompt_total if prompt_total else 0.0,
        "block_size": block_size,
        "block_hit_rate_ceiling": block_hits / prompt_total if prompt_total else 0.0,
        **extra,
    }


def _max_prompt(requests: Sequence[Request]) -> int:
    return max((r.prompt_len for r in requests), default=0)


def _sequence(r: Request, limit: int) -> TokenArray:
    """Prompt then output, cut at ``limit`` tokens (the output only as far as needed)."""
    p = r.prompt
    if len(p) >= limit or r.output_len == 0:
        return p[:limit]
    return np.concatenate([p, r.output_head(limit - len(p))])


def _token_ceiling(requests: Sequence[Request]) -> int:
    """Token-level ceiling: the Rust radix tree, unlimited, every sequence inserted."""
    limit = _max_prompt(requests)
    tree = RadixCache()
    hits = 0
    for r in requests:
        p = r.prompt
        m = tree.match_prefix(p[:-1], extra_key=r.extra_key, cache_salt=r.cache_salt)
        hits += m.length
        tree.insert(_sequence(r, limit), extra_key=r.extra_key, cache_salt=r.cache_salt)
    return hits


def _namespace(r: Request) -> bytes:
    return hashlib.blake2b(
        repr((r.extra_key, r.cache_salt)).encode("utf-8", "replace"), digest_size=16
    ).digest()


def _block_ceiling(requests: Sequence[Request], block_size: int) -> int:
    """Block-level ceiling: chained block hashes, every full block of every sequence."""
    limit = _max_prompt(requests)
    seen: set[bytes] = set()
    hits = 0
    for r in requests:
        root = _namespace(r)
        usable = (r.prompt_len - 1) // block_size  # full blocks of prompt[:-1]
        seq = _sequence(r, limit)
        nfull = len(seq) // block_size
        blocks = seq[: nfull * block_size].reshape(nfull, block_size)
        parent, matching = root, True
        for i, row in enumerate(blocks):
            key = hashlib.blake2b(parent + row.tobytes(), digest_size=16).digest()
            if matching and i < usable and key in seen:
                hits += block_size
            else:
                matching = False
            seen.add(key)
            parent = key
    return hits


def _mooncake_ceilings(
    requests: Sequence[Request], hash_ids: Sequence[TokenArray], block_size: int
) -> tuple[int, int]:
    """Both ceilings on the hash ids: a trie of ids as a flat dict (node, id) -> node,
    plus, per (node, id), the longest partial last block seen there. Outputs never extend
    a match (fresh tokens no prompt holds). Block sizes other than 512 fall back to the
    token path on expanded prompts."""
    if block_size != MOONCAKE_BLOCK:
        return _mooncake_token_ceiling(requests, hash_ids), _block_ceiling(requests, block_size)
    hits = _mooncake_token_ceiling(requests, hash_ids)
    block_hits = 0
    child: dict[tuple[int, int], int] = {}
    for r, ids in zip(requests, hash_ids, strict=True):
        usable = (r.prompt_len - 1) // MOONCAKE_BLOCK
        nfull = r.prompt_len // MOONCAKE_BLOCK
        node, matching = 0, True
        for i, h in enumerate(ids[:nfull].tolist()):
            nxt = child.get((node, h))
            if nxt is None:
                nxt = len(child) + 1
                child[(node, h)] = nxt
                matching = False
            elif matching and i < usable:
                block_hits += MOONCAKE_BLOCK
            node = nxt
    return hits, block_hits


def _mooncake_token_ceiling(requests: Sequence[Request], hash_ids: Sequence[TokenArray]) -> int:
    child: dict[tuple[int, int], int] = {}  # full blocks
    partial: dict[tuple[int, int], int] = {}  # (node, id) -> longest partial block there
    hits = 0
    for r, ids in zip(requests, hash_ids, strict=True):
        n = r.prompt_len
        id_list = ids.tolist()
        lengths = [MOONCAKE_BLOCK] * len(id_list)
        if n % MOONCAKE_BLOCK:
            lengths[-1] = n % MOONCAKE_BLOCK
        # Longest cached prefix: full blocks through the trie, then the block where the
        # paths part: a full cached block covers this request's partial one; a cached
        # partial block covers as much of this one as both hold.
        node, got = 0, 0
        for h, ln in zip(id_list, lengths, strict=True):
            nxt = child.get((node, h))
            if nxt is not None and ln == MOONCAKE_BLOCK:
                node, got = nxt, got + MOONCAKE_BLOCK
                continue
            if nxt is not None:
                got += ln
            else:
                got += min(ln, partial.get((node, h), 0))
            break
        hits += min(got, n - 1)
        node = 0
        for h, ln in zip(id_list, lengths, strict=True):
            if ln < MOONCAKE_BLOCK:
                if partial.get((node, h), 0) < ln:
                    partial[(node, h)] = ln
                break
            nxt = child.get((node, h))
            if nxt is None:
                nxt = len(child) + 1
                child[(node, h)] = nxt
            node = nxt
    return hits
