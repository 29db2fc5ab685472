#!/usr/bin/env bash
# Build the "anchors" virtual environment: the real SGLang 0.5.23 and vLLM 0.33.0 (with
# torch, used on the CPU only), so that tools/check_radix_against_sglang.py,
# tools/bench_against_sglang.py and tools/vllm_check.py can drive the engines' own cache
# classes next to prefixcache. See docs/ANCHORS.md.
#
# Usage: tools/anchors/setup_engines.sh [VENV]
#   VENV defaults to $ANCHORS_VENV, else ${XDG_CACHE_HOME:-~/.cache}/prefixcache/anchors.
#   $PYTHON picks the interpreter that creates the venv (default python3; the pins are
#   for CPython 3.11 on Linux x86_64).
#
# Installs the exact pinned set in engines-requirements.txt with --no-deps (nothing is
# resolved), about 10 GB, several minutes. Idempotent: a venv that already imports both
# engines' cache modules is left alone. Local checks only: never a dependency of
# prefixcache, its tests or CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${1:-${ANCHORS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prefixcache/anchors}}
python=${PYTHON:-python3}
probe='import vllm.v1.core.block_pool, sglang.srt.mem_cache.radix_cache'

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$probe" 2>/dev/null; then
    echo "anchors venv ready: $venv"
    exit 0
fi

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
    echo "warning: $python is Python $version; the pins were recorded with CPython 3.11" >&2
fi

mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --no-deps -r "$here/engines-requirements.txt"

if ! "$venv/bin/python" -c "$probe"; then
    echo "error: the engines' cache modules do not import in $venv (see the traceback above)" >&2
    exit 1
fi
echo "anchors venv ready: $venv"
