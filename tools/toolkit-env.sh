#!/usr/bin/env bash
# Make the virtual environment of the `toolkit` backend: rknn-toolkit2 2.5.0 beside
# batchinfer and its test tools. Usage: bash tools/toolkit-env.sh [VENV]  (default .venv-toolkit)
#
# It is a separate environment because rknn-toolkit2 pins numpy <= 1.26.4 and onnx <= 1.18,
# which the project's default environment does not. rknn-toolkit2 is installed with --no-deps
# after its pinned requirements (tools/requirements-toolkit.txt says why). Needs CPython
# 3.8-3.12 on x86_64 (rknn-toolkit2 has no other wheels); tested with 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-toolkit}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q -r tools/requirements-toolkit.txt
"$venv/bin/pip" install -q --no-deps rknn-toolkit2==2.5.0
# batchinfer and pytest only: the dev extra would add Ray, matplotlib and coverage, which the
# toolkit tests do not use (the Ray tests skip here) and which would have to fit its pins.
"$venv/bin/pip" install -q -e . "pytest>=8"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import rknn.api  # noqa: F401  (fails here rather than in the first test)
versions = {p: md.version(p) for p in ("rknn-toolkit2", "numpy", "onnx", "onnxruntime", "torch")}
print("toolkit environment ready:", ", ".join(f"{k} {v}" for k, v in versions.items()))
PY
