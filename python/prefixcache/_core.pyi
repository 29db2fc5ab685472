"""Type stubs of the compiled module ``prefixcache._core`` (checked by mypy.stubtest)."""

__version__: str
