"""Sequences whose length and items disagree, for the input-conversion tests."""

from __future__ import annotations

from typing import Any


class LyingList(list[Any]):
    """A list whose ``__len__`` and ``__getitem__`` disagree with its items."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: Any) -> Any:
        return 99


class ShortSequence:
    """A sequence that ends (IndexError at item 3) before the length it gives (5)."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> int:
        if i >= 3:
            raise IndexError(i)
        return i
