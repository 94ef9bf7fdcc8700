#!/usr/bin/env bash
# Create the peer environments of bench/loader.py under bench/.venvs/ (git-ignored).
#
#   bash bench/setup_peers.sh            # both venvs (skips one already complete)
#   bash bench/setup_peers.sh --force    # rebuild them
#
# bench/.venvs/peers      torch 2.13 CPU, pyarrow 26, numpy 2.4, pandas 3.1 (as the project venv)
#                         + Ray Data, Hugging Face datasets, Mosaic Streaming (--no-deps)
# bench/.venvs/petastorm  Petastorm 0.13.1 (--no-deps) with the old pins it needs
#
# torch is installed first and constrained to the CPU build in every later step, so no
# resolution can pull a multi-GB CUDA build. The project's own .venv is never touched.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venvs="$here/.venvs"
python="${PYTHON:-python3.11}"
force=0
[[ "${1:-}" == "--force" ]] && force=1
mkdir -p "$venvs"
constraints="$venvs/constraints.txt"
echo "torch==2.13.0+cpu" > "$constraints"

make_venv() {  # name, function installing the peer packages
  local name="$1" install="$2" dir="$venvs/$1"
  if [[ $force == 0 && -f "$dir/.complete" ]]; then
    echo "[setup_peers] $name: already set up ($dir)"; return
  fi
  rm -rf "$dir"
  "$python" -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  "$dir/bin/pip" install -q -c "$constraints" "torch==2.13.0+cpu"
  "$install" "$dir"
  "$dir/bin/python" -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
  touch "$dir/.complete"
  echo "[setup_peers] $name: ready ($dir)"
}

install_peers() {
  local pip=("$1/bin/pip" install -q -c "$constraints")
  "${pip[@]}" -r "$here/requirements-loader.txt"
  "${pip[@]}" --no-deps mosaicml-streaming==0.13.0 zstd python-snappy cramjam Brotli catalogue xxhash
}

install_petastorm() {
  local pip=("$1/bin/pip" install -q -c "$constraints")
  "${pip[@]}" -r "$here/requirements-petastorm.txt"
  "${pip[@]}" --no-deps petastorm==0.13.1
}

make_venv peers install_peers
make_venv petastorm install_petastorm
