#!/usr/bin/env bash
# Thor's CPU on an x86-64 machine: cross-builds the engine's tests for aarch64-unknown-linux-gnu
# and runs, under qemu-aarch64 -cpu max (.cargo/config.toml), the CPU kernels' unit tests
# (every set the emulated CPU has, NEON included, against the scalar reference), the SmolLM2
# fidelity test against llama.cpp, and one tiny Qwen3.6 golden test against transformers.
# Installs what is missing: the rustup target, Debian's cross gcc/libc and qemu-user.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null \
  || [ ! -d /usr/aarch64-linux-gnu/lib ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
deploy/fetch-model.sh >/dev/null
# Filters: the kernels' unit tests (lib), the llama.cpp comparisons (fidelity), the tiny-vlm
# transformers goldens (qwen36).
cargo test --release --target "$target" -p engine-cpu -p engine-service --no-fail-fast \
  --lib --test fidelity --test qwen36 -- \
  kernels:: llama_cpp tiny_vlm_sharded
