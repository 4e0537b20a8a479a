#!/usr/bin/env bash
# The Python package's tests (issue 23): builds the wheel (`uv build --wheel`: scikit-build-core and
# nanobind from PyPI, the C++ dependencies from the system, scripts/setup.sh), installs it into a
# fresh virtual environment, and runs pytest on tests/python against build/train (scripts/test.sh
# builds it first). pytest fails when it collects no test, so an empty run cannot pass. The wheel is
# installed with its `wandb` extra (PyPI) for the W&B export's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
UV=$(command -v uv || echo "$HOME/.local/bin/uv")  # scripts/setup.sh installs it
OUT=build-python
rm -rf "$OUT/dist" "$OUT/venv"
"$UV" build --quiet --wheel --python "$PY" --out-dir "$OUT/dist" .
"$UV" venv --quiet --python "$PY" "$OUT/venv"
WHEEL=$(echo "$OUT"/dist/qtrain-*.whl)
# with its wandb extra: tests/python/test_wandb_export.py exports runs offline (no account, no network)
"$UV" pip install --quiet --python "$OUT/venv/bin/python" "$WHEEL[wandb]" pytest
# run from outside the source tree, so `import qtrain` is the installed wheel, not python/qtrain
cd "$OUT"
QTRAIN_TRAIN_EXE=${QTRAIN_TRAIN_EXE:-$PWD/../build/train} venv/bin/python -m pytest -q ../tests/python
