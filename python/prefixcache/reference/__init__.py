"""Plain-Python reference implementations: the executable specification.

Short and obviously correct; used as test oracles and benchmark baselines, never by the
fast path.
"""
