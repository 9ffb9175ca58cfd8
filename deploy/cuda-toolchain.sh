#!/usr/bin/env bash
# Installs NVRTC from PyPI into .cuda-toolchain/ (ignored by git) and prints the directory of
# libnvrtc.so.13, for EDGE_CUDA_NVRTC_DIR. No GPU, driver or CUDA toolkit is needed: NVRTC
# compiles kernels to cubins on any machine, which is how CI checks them (engine-cuda's
# kernels_compile test). Pinned to the CUDA 13.0 line, the line of the driver we target (580):
# a newer NVRTC emits code that driver refuses. Skips pip when it is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.cuda-toolchain"
lib="$dir/nvidia/cu13/lib"
if [ ! -f "$lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --root-user-action=ignore --target "$dir" \
    "nvidia-cuda-nvrtc==13.0.88" >&2
fi
echo "$lib"
