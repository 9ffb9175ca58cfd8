#!/usr/bin/env bash
# Runs every default test, setting up what it needs on a machine with only Rust, Python 3 and
# pip: the default model (deploy/fetch-model.sh), the Python packages the tests use in .venv/
# (deploy/python-env.sh). Then: the crate layering (deploy/check-layers.py); rustfmt and
# clippy (deploy/lint.sh); unit and integration tests of each crate and the end-to-end tests
# (the real release binaries on the real default model); the model-level tests again once per
# other CPU kernel set this machine can run (the ISA matrix: scalar always, avx2, avx512-vnni,
# neon; `engine-service --kernel-sets`); every fuzz target built and run on 5,000 inputs from
# its seed corpus and a fixed seed (deploy/fuzz.sh).
#
#   deploy/test.sh [--aarch64] [--no-lint] [--no-fuzz]
#     --aarch64  also cross-build for aarch64 and run the kernel, fidelity and a Qwen3.6
#                golden test under qemu-aarch64 (deploy/test-aarch64.sh; slow)
#     --no-lint  skip rustfmt/clippy (they are part of CI)
#     --no-fuzz  skip the fuzz smoke run (it is part of CI)
# EDGE_KERNELS_ISA=NAME runs the main pass on that kernel set (the matrix runs the others).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
aarch64=0 lint=1 fuzz=1
while [ $# -gt 0 ]; do
  case "$1" in
    --aarch64) aarch64=1; shift ;;
    --no-lint) lint=0; shift ;;
    --no-fuzz) fuzz=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
step() { echo "=== $* ($(date +%T))" >&2; }
# Test steps go on after a failure so that one run reports every failing step.
failed=()
check() { "$@" || failed+=("$*"); }

step "set-up: model, Python packages"
deploy/fetch-model.sh >/dev/null
EDGE_PYTHON="$(deploy/python-env.sh)"
export EDGE_PYTHON

step "crate layering (deploy/check-layers.py)"
check deploy/check-layers.py

step "build (release: binaries and every test target, in one feature resolution)"
# One `cargo test --no-run` over the whole workspace builds the binaries and all test targets
# with the same dependency features, so no later step rebuilds anything (a separate
# `cargo build --bins` resolves features without dev-dependencies, and `-p e2e` alone resolves
# them differently again: each cost a rebuild of the services).
cargo test --release --workspace --no-run
if [ "$lint" = 1 ]; then
  step "rustfmt, clippy"
  deploy/lint.sh
fi
sets="$(target/release/engine-service --kernel-sets)"
main_isa="${EDGE_KERNELS_ISA:-${sets%% *}}"
step "unit, integration and end-to-end tests (kernel set $main_isa; this CPU runs: $sets)"
# The end-to-end tests (package e2e) start the real binaries on the real default model; they
# take turns for a stack among themselves (tests/e2e/src/lib.rs).
check cargo test --release --workspace --no-fail-fast

# The CUDA backend without a GPU: every kernel compiles to a cubin for sm_90a (H100/H200) and
# sm_110a (Thor) with no local memory, and the CUDA crate's and the engine's unit tests pass
# with the `cuda` feature (on a machine without a driver the feature changes only what the
# device probe finds). The GPU tests (cuda_ops, cuda_model) are listed as ignored here, by
# name; deploy/gpu-check.sh runs them on a GPU.
step "CUDA kernels compile for sm_90a and sm_110a (NVRTC from PyPI; no GPU needed)"
if nvrtc_dir="$(deploy/cuda-toolchain.sh)"; then
  check env EDGE_CUDA_NVRTC_DIR="$nvrtc_dir" cargo test --release -p engine-cuda -p engine-service \
    --features engine-service/cuda --lib --test kernels_compile --test cuda_ops --test cuda_model --no-fail-fast
else
  failed+=("deploy/cuda-toolchain.sh (installing NVRTC from PyPI)")
fi

# The model-level tests whose results depend on the kernels: logits vs references, bitwise
# exactness of chunking/batching/prefix reuse, speculative == plain. The kernels' own unit
# tests already compare every set this CPU has with the scalar reference in one run.
for isa in $sets; do
  [ "$isa" = "$main_isa" ] && continue
  step "ISA matrix: EDGE_KERNELS_ISA=$isa"
  # --workspace (not -p engine-service): the same feature set as the pass above, so the same
  # test binaries run again instead of a second build.
  check env EDGE_KERNELS_ISA="$isa" cargo test --release --workspace --no-fail-fast \
    --test fidelity --test prefix_reuse --test kv_fp8 --test qwen36 --test nvfp4_fixture \
    --test speculative --test speculative_qwen36 --test state_cache_qwen36 --test qwen36_gguf
done

if [ "$fuzz" = 1 ]; then
  step "fuzz targets: build, 5,000 inputs each from the seed corpora, fixed seed (deploy/fuzz.sh)"
  check deploy/fuzz.sh
fi

if [ "$aarch64" = 1 ]; then
  step "aarch64 under emulation"
  check deploy/test-aarch64.sh
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf '=== FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
step "all tests passed"
