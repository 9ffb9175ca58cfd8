#!/usr/bin/env bash
# Formatting and lints, as CI checks them: rustfmt (rustfmt.toml) and clippy with warnings
# as errors on every target of every crate. Adds the rustup components when missing. Clippy
# runs in the release profile so that it reuses the build scripts and proc macros of
# `cargo build --release` (the dev profile builds them again, optimized: minutes more).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
# The CUDA code, which the workspace pass above builds without its feature.
cargo clippy --release -p engine-cuda -p engine-service --features engine-service/cuda --all-targets --quiet -- -D warnings
