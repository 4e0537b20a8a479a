#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine needs to build, test and demo qtrain. Idempotent and
# fast when nothing is missing (checks with dpkg first; apt runs only for missing packages).
# The CUDA toolkit is not installed here: when nvcc is found (PATH or /usr/local/cuda) the CUDA
# backend is built too, otherwise qtrain builds CPU-only.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
  libxxhash-dev              # checkpoint checksums (header-only: XXH_INLINE_ALL, nothing links it)
  openmpi-bin libopenmpi-dev # the MPI communicator (src/comm/mpi/) and its mpirun tests
  python3 python3-pip python3-venv python3-dev  # python3-dev: the Python package's extension (pyproject.toml)
  bible-kjv bible-kjv-text   # the demo's offline corpus (King James Bible)
)

missing=()
if command -v dpkg >/dev/null 2>&1; then
  for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
else
  echo "setup.sh: no dpkg here; install the equivalents of: ${APT_PACKAGES[*]}" >&2
fi

if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# uv runs the Python helper scripts (tokenizer reference, plots) with their own pinned deps.
if ! command -v uv >/dev/null 2>&1 && [ ! -x "$HOME/.local/bin/uv" ]; then
  echo "setup.sh: installing uv from PyPI"
  python3 -m pip install --quiet --user uv 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages uv
fi
# (the scripts find uv there on their own; a shell, e.g. the README's Python commands, needs it on PATH)
if ! command -v uv >/dev/null 2>&1 && [ -x "$HOME/.local/bin/uv" ]; then
  echo "setup.sh: note: uv is in $HOME/.local/bin, which is not on PATH: export PATH=\"\$HOME/.local/bin:\$PATH\""
fi

# nvcc is often installed but not on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup.sh: note: nvcc found at /usr/local/cuda/bin (scripts/build.sh adds it to PATH)"
fi

# The cuDNN frontend's headers (PyPI wheel) for the cuDNN attention backend, when there is a CUDA
# toolkit to build it with. Best effort: without them qtrain builds with its own attention kernels.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  "$(dirname "$0")/fetch_cudnn_frontend.sh" || echo "setup.sh: warning: no cuDNN frontend headers; building without the cuDNN attention backend" >&2
fi
