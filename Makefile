# The development loop. `make check` runs what CI runs (.ci/run) on the current venv,
# without reinstalling; `make ci` runs .ci/run itself. Needs cargo, python3 with the
# test extra installed (pip install -e ".[test]"), nothing else.
PY ?= python3

.PHONY: help build check lint rust-lint rust-test fuzz-check py-lint typecheck test bench ci format format-check

help:
	@echo "make build         rebuild the extension in the venv (maturin develop --release)"
	@echo "make check         everything CI checks: lint, Rust tests, Python tests, benches once"
	@echo "make lint          cargo fmt/clippy, fuzz crate check, ruff, mypy --strict"
	@echo "make test          pytest -q"
	@echo "make bench         the benchmarks, timed (pytest benches --benchmark-only)"
	@echo "make format        cargo fmt and ruff format, in place"
	@echo "make ci            bash .ci/run (reinstalls the package as CI does)"

build:
	maturin develop --release

check: lint rust-test test
	$(PY) -m pytest -q benches --benchmark-disable

lint: rust-lint fuzz-check py-lint typecheck

rust-lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

rust-test:
	cargo test -p prefixcache-core --release
	cargo test -p prefixcache-py

fuzz-check:  # the fuzz crate is its own workspace; it type-checks on stable
	cd fuzz && cargo check --quiet

py-lint:
	$(PY) -m ruff check python tests benches tools
	$(PY) -m ruff format --check python tests benches tools

typecheck:
	$(PY) -m mypy --strict python

test:
	$(PY) -m pytest -q

bench:
	$(PY) -m pytest benches --benchmark-only

format:
	cargo fmt --all
	$(PY) -m ruff format python tests benches tools

format-check:
	$(PY) -m ruff format --check python tests benches tools

ci:
	bash .ci/run
