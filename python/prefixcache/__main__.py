"""``python -m prefixcache``: the ``prefixcache`` command."""

import sys

from prefixcache.sim.cli import main

sys.exit(main())
