"""``python -m prefixcache`` and the ``prefixcache`` command."""

from __future__ import annotations

import sys


def run() -> int:
    """The ``prefixcache`` command. Ctrl-C while it loads (numpy, the core, the
    simulator) ends as Ctrl-C while it runs does: one line on stderr, exit status 130."""
    try:
        from prefixcache.sim.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: prefixcache stopped while starting\n")
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
