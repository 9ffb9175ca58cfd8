#!/usr/bin/env bash
# Runs every default test: unit and integration tests of each crate, then the end-to-end
# tests that start the real release binaries with the real default model.
# Slow suites are opt-in; see README ("Tests").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
deploy/fetch-model.sh >/dev/null
cargo build --release --bins
cargo test --release --workspace --exclude e2e
# One stack at a time: each end-to-end test starts its own three processes on 2 cores.
cargo test --release -p e2e -- --test-threads=1
