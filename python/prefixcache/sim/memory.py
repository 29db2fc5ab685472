"""The process's peak resident memory, per replayed policy.

Each replay reports its peak and the resident memory it started from (the interpreter,
numpy and the trace): the difference is what the policy's cache and run added.

On Linux the peak (``VmHWM`` in ``/proc/self/status``) can be reset by writing ``5`` to
``/proc/self/clear_refs``, so each policy's replay gets its own high-water mark in one
process. Elsewhere the process's lifetime peak (``getrusage``) is reported, which is an
upper bound for every policy after the first.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_bytes", "reset_peak_rss", "rss_bytes"]


def reset_peak_rss() -> bool:
    """Start a new high-water mark of resident memory; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _status_bytes(field: str) -> int | None:
    """A memory field of ``/proc/self/status`` (kB there) in bytes; None without it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_bytes() -> int:
    """Resident memory of this process now; 0 where it cannot be read (not Linux)."""
    return _status_bytes("VmRSS:") or 0


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since the last :func:`reset_peak_rss`."""
    peak = _status_bytes("VmHWM:")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, else KiB
    return maxrss if sys.platform == "darwin" else maxrss * 1024
