"""Shared benchmark fixtures. Run: ``pytest benches --benchmark-only`` (or with
``--benchmark-disable`` to check that every benchmark still runs, as CI does)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
