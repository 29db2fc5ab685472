"""Type stubs of the compiled module ``prefixcache._core`` (checked by mypy.stubtest)."""

from collections.abc import Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
__all__ = [
    "BlockHasher",
    "InsertResult",
    "MatchResult",
    "Node",
    "RadixCache",
    "__version__",
    "hash_block_tokens",
]

_Tokens = Sequence[int] | npt.NDArray[np.integer[Any]] | Any
_Values = Sequence[int] | npt.NDArray[np.integer[Any]] | Any
_I64Array = npt.NDArray[np.int64]

@final
class Node:
    """A handle to a tree node; stale (raises) once the node is evicted or the tree reset."""

    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class MatchResult:
    @property
    def length(self) -> int: ...
    @property
    def node(self) -> Node: ...
    @property
    def indices(self) -> _I64Array: ...

@final
class InsertResult:
    @property
    def prefix_len(self) -> int: ...
    @property
    def node(self) -> Node: ...

@final
class RadixCache:
    def __new__(cls, page_size: int | None = None, eviction_policy: str = "lru") -> RadixCache: ...
    @property
    def page_size(self) -> int: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def clock(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def root(self) -> Node: ...
    def match_prefix(
        self, tokens: _Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> MatchResult: ...
    def insert(
        self,
        tokens: _Tokens,
        values: _Values | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
        inserted_len: int | None = None,
    ) -> InsertResult: ...
    def inc_lock_ref(self, node: Node) -> int: ...
    def dec_lock_ref(self, node: Node) -> int: ...
    def evict(self, num_tokens: int) -> _I64Array: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...
    def total_size(self) -> int: ...
    def path_indices(self, node: Node) -> _I64Array: ...
    def parent(self, node: Node) -> Node | None: ...
    def node_info(self, node: Node) -> dict[str, Any]: ...
    def dump(self) -> list[dict[str, Any]]: ...
    def check_invariants(self) -> None: ...
    def reset(self) -> None: ...
    def pretty_print(self) -> str: ...

_ExtraKey = str | bytes | int | bool | None | tuple[Any, ...]
_BlockKeys = tuple[_ExtraKey, ...] | None

@final
class BlockHasher:
    """vLLM v1's chained block hashes for one algorithm, block size and NONE_HASH seed."""

    def __new__(
        cls, block_size: int = 16, algo: str = "sha256", seed: str | None = None
    ) -> BlockHasher: ...
    @property
    def none_hash(self) -> bytes: ...
    @property
    def block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...
    @property
    def seed(self) -> str: ...
    def hash_blocks(
        self,
        tokens: _Tokens,
        extra_keys: Sequence[_BlockKeys] | None = None,
        parent: bytes | None = None,
    ) -> list[bytes]: ...
    def hash_block(
        self, parent: bytes | None, tokens: _Tokens, extra_keys: _BlockKeys = None
    ) -> bytes: ...

def hash_block_tokens(
    algo: str,
    parent: bytes | None,
    tokens: _Tokens,
    extra_keys: _BlockKeys = None,
    seed: str | None = None,
) -> bytes: ...
