"""The simulator: replays workloads and traces through the caches side by side.

Layers, top down (nothing calls up): :mod:`~prefixcache.sim.cli` ->
:mod:`~prefixcache.sim.replay` / :mod:`~prefixcache.sim.report` ->
:mod:`~prefixcache.sim.scheduler` -> :mod:`~prefixcache.sim.policies` (one module per
engine) -> the caches of :mod:`prefixcache`. Requests come from
:mod:`~prefixcache.sim.workloads` (synthetic) or :mod:`~prefixcache.sim.traces` (files);
their types live in :mod:`~prefixcache.sim.requests`.
"""
