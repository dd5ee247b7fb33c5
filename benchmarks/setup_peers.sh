#!/usr/bin/env bash
# Create the peer virtual environments that benchmarks/run_peers.py compares regency against.
#
#   .bench-venvs/monarch : torch 2.13.0 (CPU wheel on this machine's disk) + torchmonarch 0.7.0,
#                          and pytest + pytest-timeout for `make compat-monarch` (tests/compat)
#   .bench-venvs/ray     : ray 2.60.0 + numpy
#
#   benchmarks/setup_peers.sh            # both
#   benchmarks/setup_peers.sh monarch    # only the named venv(s) (`make monarch-venv`)
#
# Idempotent: a venv whose stamp file exists is left alone. Delete .bench-venvs/<name> to redo it.
# Both venvs also get numpy, for the array payloads.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${BENCH_VENVS:-$ROOT/.bench-venvs}"
PY="${PY:-python3}"

MONARCH_PKGS=(torch==2.13.0 torchmonarch==0.7.0 numpy "pytest>=8" "pytest-timeout>=2.3")
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
wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=(monarch ray)
for name in "${wanted[@]}"; do
    case "$name" in
        monarch) make_venv monarch "${MONARCH_PKGS[@]}" ;;
        ray) make_venv ray "${RAY_PKGS[@]}" ;;
        *) echo "setup_peers: unknown venv '$name' (monarch, ray)" >&2; exit 2 ;;
    esac
done
