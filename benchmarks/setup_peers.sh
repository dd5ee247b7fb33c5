#!/usr/bin/env bash
# Create the peer virtual environments that benchmarks/run_peers.py compares regency against.
#
#   .bench-venvs/monarch : torch 2.13.0 (CPU wheel on this machine's disk) + torchmonarch 0.7.0
#   .bench-venvs/ray     : ray 2.60.0 + numpy
#
# Idempotent: a venv whose stamp file exists is left alone. Delete .bench-venvs/<name> to redo it.
# Both venvs also get numpy, for the array payloads.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${BENCH_VENVS:-$ROOT/.bench-venvs}"
PY="${PY:-python3}"

MONARCH_PKGS=(torch==2.13.0 torchmonarch==0.7.0 numpy)
RAY_PKGS=(ray==2.60.0 numpy)

make_venv() {
    local name="$1"
    shift
    local dir="$VENVS/$name"
    local stamp="$dir/.installed"
    if [[ -f "$stamp" ]]; then
        echo "setup_peers: $name venv present ($dir), skipping" >&2
        return 0
    fi
    echo "setup_peers: creating $name venv in $dir: $*" >&2
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --upgrade pip
    "$dir/bin/python" -m pip install --quiet "$@"
    "$dir/bin/python" -m pip freeze > "$dir/freeze.txt"
    touch "$stamp"
}

mkdir -p "$VENVS"
make_venv monarch "${MONARCH_PKGS[@]}"
make_venv ray "${RAY_PKGS[@]}"
