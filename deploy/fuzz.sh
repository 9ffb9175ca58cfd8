#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (cargo fuzz, AddressSanitizer, debug assertions) and
# runs each from its committed seed corpus, in a scratch copy so the repository stays clean.
# A crash fails the run and leaves the input in fuzz/artifacts/<target>/.
#   deploy/fuzz.sh                      the CI smoke run: 5,000 inputs per target from a fixed
#                                       seed (-seed=1), so it is the same run every time
#   deploy/fuzz.sh SECONDS [TARGET...]  long runs, e.g. `deploy/fuzz.sh 600 gguf` (docs/fuzzing.md)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"
seconds="${1:-}"
shift || true
if [ -n "$seconds" ]; then budget=(-max_total_time="$seconds"); what="in ${seconds} s"; else budget=(-seed=1 -runs=5000); what="(seed 1)"; fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz..." >&2
  cargo install cargo-fuzz --locked --version 0.13.2 --quiet
fi
# cargo fuzz passes nightly flags (-Zsanitizer); the stable toolchain accepts them this way.
export RUSTC_BOOTSTRAP=1
cargo fuzz build
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  if cargo fuzz run "$t" "$work/$t" "corpus/$t" -- "${budget[@]}" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 >"$work/$t.log" 2>&1; then
    echo "fuzz $t: $(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$work/$t.log" | grep -Eo '[0-9]+') runs $what, no crash"
  else
    tail -n 40 "$work/$t.log" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets that crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
