#!/usr/bin/env bash
# The CUDA backend's GPU checks (docs/cuda.md): every GPU op against the CPU, the model's
# logits against the CPU, tree == chain, speculative == plain and cached == uncached on the
# GPU, the end-to-end speculation and cache tests against a stack on --device cuda, and a
# short throughput benchmark. In two halves, because the lent GPU machine has no Rust and
# no network, and the default model is larger than what travels there:
#
#   deploy/gpu-check.sh prepare [DIR]  # with Rust: build with the cuda feature, strip and pack
#                                      # the binaries, the model's skeleton (DIR: .gpu-check)
#   deploy/gpu-check.sh run [DIR]      # on the GPU machine, from the repository root
#   deploy/gpu-check.sh                # both, on a machine with Rust and a GPU
#
# The GPU runs use a stand-in for the default model: its metadata (tokenizer, template,
# dimensions) with seeded random weights in its formats (scripts/gpu/model.py). `run` writes
# its log to $OUT/gpu-check.log when OUT is set. Budget: under 8 minutes on an H200.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mode="${1:-all}"
dir="${2:-$root/.gpu-check}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
step() { echo "=== $* ($(date +%T))" >&2; }

# Test binaries that run there: package/target names of `cargo test --no-run`.
TESTS="cuda_ops cuda_model kernels_compile speculation cache_reuse chat"

prepare() {
  step "build with --features engine-service/cuda"
  cargo build --release --workspace --bins --features engine-service/cuda
  local json
  json="$(cargo test --release -p engine-service -p engine-cuda -p e2e --features engine-service/cuda --no-run --message-format=json 2>/dev/null)"
  cargo bench -p engine-service --features cuda --bench throughput --no-run
  rm -rf "$dir/bin" "$dir/skeleton" "$dir/py"
  mkdir -p "$dir/bin"
  for b in engine-service gateway cache-service; do
    strip -o "$dir/bin/$b" "target/release/$b"
  done
  echo "$json" | python3 -c '
import json, sys, shutil, subprocess
want = set(sys.argv[2].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want and "test" in m["target"]["kind"]:
        subprocess.run(["strip", "-o", sys.argv[1] + "/" + m["target"]["name"], m["executable"]], check=True)
' "$dir/bin" "$TESTS"
  strip -o "$dir/bin/throughput" "$(ls -t target/release/deps/throughput-* | grep -v '\.d$' | head -1)"
  gzip -9 -f "$dir"/bin/*
  step "model skeleton (metadata and tensor list of the default model)"
  deploy/fetch-model.sh >/dev/null
  # gguf with its dependencies for here; gguf alone travels (numpy, pyyaml and tqdm are the
  # GPU machine's own).
  local pybuild="$root/target/gpu-check-py"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$pybuild" gguf >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$dir/py" gguf >&2
  PYTHONPATH="$pybuild" python3 scripts/gpu/model.py skeleton models/SmolLM2-135M-Instruct.Q4_1.gguf "$dir/skeleton" --layers 30
  du -sh "$dir" >&2
}

run() {
  local log="${OUT:-$dir}/gpu-check.log"
  exec > >(tee "$log") 2>&1
  step "device"
  nvidia-smi -L || true
  local work="/tmp/edge-gpu-check"
  rm -rf "$work" && mkdir -p "$work"
  for f in "$dir"/bin/*.gz; do gunzip -c "$f" > "$work/$(basename "$f" .gz)"; done
  chmod +x "$work"/*
  if [ -z "${EDGE_CUDA_NVRTC_DIR:-}" ]; then
    local lib
    lib="$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13' 2>/dev/null | head -1 || true)"
    [ -n "$lib" ] && export EDGE_CUDA_NVRTC_DIR="$(dirname "$lib")"
  fi
  echo "NVRTC: ${EDGE_CUDA_NVRTC_DIR:-loader path}"
  export EDGE_CUDA_CACHE_DIR="$work/cubins"
  # A real copy of the default model when one was brought (EDGE_GPU_MODEL, e.g. carried in
  # two halves), else the stand-in: random weights decode nonsense, so the two end-to-end
  # checks that need the real model's text (Paris; enough accepted suffix drafts) are skipped
  # by name.
  local real=1
  if [ -z "${EDGE_GPU_MODEL:-}" ]; then
    real=0
    step "stand-in model (random weights, the default model's formats and tokenizer)"
    export EDGE_GPU_MODEL="$work/SmolLM2-135M-Instruct-random.gguf"
    PYTHONPATH="$dir/py${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu/model.py fill "$dir/skeleton" "$EDGE_GPU_MODEL"
  fi
  export EDGE_E2E_MODEL="$EDGE_GPU_MODEL" EDGE_BIN_DIR="$work"
  local failed=()
  step "kernels_compile"
  "$work/kernels_compile" --test-threads 1 || failed+=("kernels_compile")
  # Both KV residencies: pages mirrored in device memory (a discrete GPU's default) and host
  # pages read in place (unified memory's default).
  for kv in device in-place; do
    for t in cuda_ops cuda_model; do
      step "$t (EDGE_CUDA_KV=$kv)"
      EDGE_CUDA_KV=$kv "$work/$t" --include-ignored --test-threads 1 || failed+=("$t ($kv)")
    done
  done
  step "e2e cache_reuse on --device cuda"
  ENGINE_DEVICE=cuda "$work/cache_reuse" --test-threads 1 || failed+=("e2e cache_reuse")
  if [ "$real" = 1 ]; then
    step "e2e chat, speculation on --device cuda"
    ENGINE_DEVICE=cuda "$work/chat" --test-threads 1 || failed+=("e2e chat")
    ENGINE_DEVICE=cuda "$work/speculation" --test-threads 1 || failed+=("e2e speculation")
  else
    step "e2e chat on --device cuda (skipped: capital_of_france_is_paris_and_streaming_matches, speculation_changes_speed_not_output: they need the real model)"
    ENGINE_DEVICE=cuda "$work/chat" --test-threads 1 --skip capital_of_france_is_paris || failed+=("e2e chat")
  fi
  # Peak memory bandwidth for the roofline line (datasheet; the lent machines measured about
  # 3.0 TB/s (H100) and 4.3 TB/s (H200) device-to-device).
  local name peak=0
  name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
  case "$name" in *H200*) peak=4800 ;; *H100*) peak=3350 ;; esac
  step "throughput on the default model's dimensions: GPU, then this machine's CPU ($(nproc) threads)"
  EDGE_BENCH_DEVICE=cuda EDGE_BENCH_THREADS=1 EDGE_BENCH_CONTEXTS=0,1536 EDGE_BENCH_PEAK_GBS=$peak \
    "$work/throughput" "$EDGE_GPU_MODEL" || failed+=("throughput")
  EDGE_BENCH_THREADS="$(nproc)" EDGE_BENCH_CONTEXTS=0,1536 EDGE_BENCH_ROUNDS=1 \
    "$work/throughput" "$EDGE_GPU_MODEL" || failed+=("throughput (CPU)")
  for t in Q4_0 Q8_0; do
    step "throughput at Llama-3-8B dimensions, $t, random weights, batch 1 and 8"
    PYTHONPATH="$dir/py${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu/model.py llama "$dir/skeleton" "$work/llama8b-$t.gguf" --type "$t"
    for b in 1 8; do
      EDGE_BENCH_DEVICE=cuda EDGE_BENCH_THREADS=1 EDGE_BENCH_CONTEXTS=0,1536 EDGE_BENCH_ROUNDS=2 EDGE_BENCH_BATCH=$b \
        EDGE_BENCH_PEAK_GBS=$peak "$work/throughput" "$work/llama8b-$t.gguf" || failed+=("throughput 8B $t batch $b")
    done
    rm -f "$work/llama8b-$t.gguf"
  done
  if [ ${#failed[@]} -gt 0 ]; then
    printf '=== FAILED: %s\n' "${failed[@]}"
    return 1
  fi
  step "all GPU checks passed"
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  all) prepare && run ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
