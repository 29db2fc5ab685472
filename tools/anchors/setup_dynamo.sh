#!/usr/bin/env bash
# Build a private virtual environment with NVIDIA Dynamo 1.4.2's `dynamo.replay`: a peer
# simulator (Rust mockers of the vLLM / SGLang / TensorRT-LLM schedulers, a KV router,
# Mooncake trace replay) to measure prefixcache's replay side by side on the same trace
# and KV budget. See docs/ANCHORS.md.
#
# Usage: tools/anchors/setup_dynamo.sh [VENV]
#   VENV defaults to $DYNAMO_VENV, else ${XDG_CACHE_HOME:-~/.cache}/prefixcache/dynamo.
#   $PYTHON picks the interpreter that creates the venv (default python3; the pins are
#   for CPython 3.11 on Linux x86_64).
#
# Installs the exact pinned set in dynamo-requirements.txt with --no-deps, about 1 GB.
# Idempotent. Local measurements only: never a dependency of prefixcache, its tests or CI.
#
# Then, for example (one instance, vLLM rules, 16-token blocks):
#   "$DYNAMO_VENV/bin/python" -m dynamo.replay TRACE.jsonl --trace-format mooncake \
#       --trace-block-size 512 --replay-mode offline --report-json out.json \
#       --extra-engine-args '{"engine_type": "vllm", "block_size": 16,
#                             "num_gpu_blocks": 187500, "enable_prefix_caching": true}'
#   add --num-workers N --router-mode round_robin|kv_router for a fleet.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${1:-${DYNAMO_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prefixcache/dynamo}}
python=${PYTHON:-python3}
probe='import dynamo.replay'

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$probe" 2>/dev/null; then
    echo "dynamo venv ready: $venv"
    exit 0
fi

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
    echo "warning: $python is Python $version; the pins were recorded with CPython 3.11" >&2
fi

mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --no-deps -r "$here/dynamo-requirements.txt"

if ! "$venv/bin/python" -c "$probe"; then
    echo "error: dynamo.replay does not import in $venv (see the traceback above)" >&2
    exit 1
fi
echo "dynamo venv ready: $venv"
