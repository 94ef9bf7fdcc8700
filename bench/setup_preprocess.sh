#!/usr/bin/env bash
# Creates bench/.venvs/preprocess: feedline[text,images] plus the peers of bench/preprocess.py
# (pandas, Hugging Face datasets, PySpark 4.3 — which needs Java 17 on PATH).
#
#   bash bench/setup_preprocess.sh
#   flock /tmp/feedline-bench.lock bench/.venvs/preprocess/bin/python bench/preprocess.py
#
# torch==2.13.0 goes in FIRST (the CPU build): anything pulling an unpinned torch would
# download a multi-GB CUDA build. The script stops if torch changed afterwards.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/bench/.venvs/preprocess"
python="${PYTHON:-python3}"

setup_preprocess() {
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/pip" install -q -e "$root[text,images]" -r "$root/bench/requirements-preprocess.txt"
    "$venv/bin/python" - <<'PY'
import torch, datasets, pyspark, pandas, tokenizers, PIL, feedline
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("bench/.venvs/preprocess ready:", "torch", torch.__version__, "| datasets", datasets.__version__,
      "| pyspark", pyspark.__version__, "| pandas", pandas.__version__)
PY
    java -version 2>&1 | head -1 || echo "warning: no java on PATH: the Spark peer will be skipped"
}

setup_preprocess "$@"
