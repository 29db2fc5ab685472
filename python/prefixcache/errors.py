"""The exception hierarchy. Every error prefixcache raises derives from PrefixCacheError
and also from the builtin a caller would naturally catch (ValueError, TypeError ...).

An operation that raises leaves the cache it was called on unchanged.
"""

from __future__ import annotations


class PrefixCacheError(Exception):
    """Base class of every prefixcache error."""


class InvalidInputError(PrefixCacheError, ValueError):
    """An argument has a bad value: out-of-range token id, negative count, wrong length."""


class InvalidTypeError(PrefixCacheError, TypeError):
    """An argument has a type or dtype prefixcache does not accept (floats, strings ...)."""


class StaleHandleError(PrefixCacheError, LookupError):
    """A node handle refers to a node that no longer exists (evicted, reset, other cache)."""


class LockRefError(PrefixCacheError, ValueError):
    """A lock count would become negative, or the root was locked or unlocked."""


class BlockStateError(PrefixCacheError, ValueError):
    """A block operation its state forbids: double free, touching the null block ..."""


class UnknownRequestError(PrefixCacheError, KeyError):
    """A request id the manager does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class OutOfBlocksError(PrefixCacheError, RuntimeError):
    """More blocks were requested than the pool has free."""


class UnsupportedHashInputError(PrefixCacheError, TypeError):
    """An extra key holds a value vLLM's hash encoders cannot encode exactly."""


class UnknownWorkerError(PrefixCacheError, KeyError):
    """A worker name the fleet index does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class InvalidEventError(InvalidInputError):
    """A KV event batch that cannot be decoded or applied: a frame count other than 3, bad
    msgpack, an unknown event tag, a field of the wrong type, a hash of the wrong width.
    The fleet index counts it on the worker and is otherwise unchanged."""


__all__ = [
    "BlockStateError",
    "InvalidEventError",
    "InvalidInputError",
    "InvalidTypeError",
    "LockRefError",
    "OutOfBlocksError",
    "PrefixCacheError",
    "StaleHandleError",
    "UnknownRequestError",
    "UnknownWorkerError",
    "UnsupportedHashInputError",
]
