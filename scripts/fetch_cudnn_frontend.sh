#!/usr/bin/env bash
# Puts the cuDNN frontend's C++ headers (header-only, Apache-2.0; PyPI's nvidia-cudnn-frontend wheel
# ships them under include/) in .deps/cudnn-frontend/include, where CMake looks for them. With them,
# qtrain builds its cuDNN attention backend (src/cuda/attention_cudnn.cpp); without them it builds
# without it and uses its own flash-attention kernels. The cuDNN library itself is loaded at run time
# (dlopen libcudnn.so.9), so a machine without cuDNN still runs.
#
#   scripts/fetch_cudnn_frontend.sh          # idempotent: does nothing when the headers are there
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.32.0
DEST=.deps/cudnn-frontend
if [ -f "$DEST/include/cudnn_frontend.h" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Any CPython's wheel holds the same headers; ask for one explicitly so pip does not look for an sdist.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$VERSION" -d "$TMP" 2>"$TMP/err" || {
  cat "$TMP/err" >&2
  echo "fetch_cudnn_frontend.sh: could not download nvidia-cudnn-frontend==$VERSION from PyPI;" \
       "qtrain builds without the cuDNN attention backend" >&2
  exit 1
}
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$TMP"/nvidia_cudnn_frontend-*.whl "$DEST" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(f"{whl}: no include/cudnn_frontend.h in the wheel")
    for n in names:
        z.extract(n, dest)
PY
echo "$VERSION" > "$DEST/VERSION"
echo "fetch_cudnn_frontend.sh: cuDNN frontend $VERSION headers in $DEST/include"
