#!/usr/bin/env bash
# The routing load test (docs/multi-engine.md "Measured"): two engines behind one gateway,
# agent conversations from the MLPerf agentic replay data at once, run four ways on one
# machine, one after the other, each on a fresh stack:
#
#   separate caches (one cache-service per engine, as on two boxes) x {affine, round-robin}
#   shared cache    (one cache-service, one arena for both engines) x {affine, round-robin}
#
# Prints one line per run (hit rate, output tokens/s, TTFT p50/p99, TPOT p50) and leaves the
# edge-bench reports under OUT/<caches>-<routing>/. Needs the release binaries and the
# default model (cargo build --release --bins; deploy/fetch-model.sh).
#
#   scripts/bench/routing.sh [--conversations 16] [--turns 4] [--max-prompt-tokens 6000]
#                            [--max-completion-tokens 64] [--threads-per-engine 1] [--out bench-routing]
#                            [--no-session-id]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

conversations=16 turns=4 max_prompt=6000 max_completion=64 threads=1 out=bench-routing session=()
while [ $# -gt 0 ]; do
  case "$1" in
    --conversations) conversations="$2"; shift 2 ;;
    --turns) turns="$2"; shift 2 ;;
    --max-prompt-tokens) max_prompt="$2"; shift 2 ;;
    --max-completion-tokens) max_completion="$2"; shift 2 ;;
    --threads-per-engine) threads="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-session-id) session=(--no-session-id); shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
bin="$root/target/release"
for b in cache-service engine-service gateway edge-bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release --bins" >&2; exit 1; }
done
model="$(deploy/fetch-model.sh)"
mkdir -p "$out"

pids=()
stop() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop EXIT

# Ports below the ephemeral range, picked once for the whole script.
port=$((20000 + RANDOM % 10000))

run() {  # caches: separate|shared, routing: affine|round-robin
  local caches="$1" routing="$2" name="$1-$2"
  local dir="$out/$name" rt
  rt="$(mktemp -d)"
  chmod 700 "$rt"
  mkdir -p "$dir"
  local ncaches=1
  [ "$caches" = separate ] && ncaches=2
  for ((c = 0; c < ncaches; c++)); do
    EDGE_RUNTIME_DIR="$rt" "$bin/cache-service" --listen "unix:$rt/cache-$c.sock" \
      --shm-name "edge-routing-$$-$c" --arena-bytes $((1 << 30)) --metrics-listen "127.0.0.1:$((port + 10 + c))" \
      >"$dir/cache-$c.log" 2>&1 &
    pids+=($!)
  done
  local endpoints=()
  for e in 0 1; do
    local cache=$((e % ncaches))
    EDGE_RUNTIME_DIR="$rt" "$bin/engine-service" --model "$model" --threads "$threads" \
      --listen "unix:$rt/engine-$e.sock" --cache "unix:$rt/cache-$cache.sock" \
      --metrics-listen "127.0.0.1:$((port + 20 + e))" >"$dir/engine-$e.log" 2>&1 &
    pids+=($!)
    endpoints+=("unix:$rt/engine-$e.sock")
  done
  EDGE_RUNTIME_DIR="$rt" "$bin/gateway" --listen "127.0.0.1:$port" --routing "$routing" \
    --engine-endpoint "$(IFS=,; echo "${endpoints[*]}")" >"$dir/gateway.log" 2>&1 &
  pids+=($!)
  # Both engines routed to before the clock starts.
  local deadline=$((SECONDS + 120))
  until [ "$(curl -s "http://127.0.0.1:$port/health" | grep -o '"routing":"up"' | wc -l)" = 2 ]; do
    [ $SECONDS -lt $deadline ] || { echo "$name: the stack did not come up; logs in $dir" >&2; exit 1; }
    sleep 0.5
  done
  "$bin/edge-bench" replay --endpoint "http://127.0.0.1:$port/v1" --quiet --out "$dir" \
    --conversations "$conversations" --turns "$turns" --concurrency "$conversations" \
    --max-prompt-tokens "$max_prompt" --max-completion-tokens "$max_completion" --send-max-tokens "${session[@]}" \
    >"$dir/edge-bench.log" 2>&1 || { echo "$name: edge-bench failed; see $dir/edge-bench.log" >&2; exit 1; }
  curl -s "http://127.0.0.1:$port/metrics" | grep '^edge_gateway_routed_total' >"$dir/routed.txt" || true
  stop
  rm -rf "$rt"
  python3 - "$dir" "$name" <<'PY'
import glob, json, sys
d, name = sys.argv[1:]
report = json.load(open(sorted(glob.glob(f"{d}/replay-*.json"))[0]))
f = report["figures"]
q = lambda k, p: (f.get(k) or {}).get(p) or 0
print(f"{name:24} turns {f['turns_completed']:3}/{f['turns_selected']:3}  cache hit {f['cache_hit_pct']:5.1f}%  "
      f"out tok/s {f['tps']:6.1f}  TTFT p50 {q('ttft_ms','p50'):7.0f} ms p99 {q('ttft_ms','p99'):7.0f} ms  "
      f"TPOT p50 {q('tpot_ms','p50'):5.1f} ms  wall {f['wall_s']:5.1f} s")
PY
}

echo "$conversations conversations at once, first $turns turns each, prompts <= $max_prompt tokens, " \
  "$max_completion output tokens, $threads thread(s) per engine, on $(nproc) cores" \
  "${session[*]:+(no X-Session-ID)}"
for caches in separate shared; do
  for routing in affine round-robin; do
    run "$caches" "$routing"
  done
done
