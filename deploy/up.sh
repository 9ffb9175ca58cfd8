#!/usr/bin/env bash
# Starts the whole stack on this machine: builds in release, fetches the default model if
# missing, starts cache-service, engine-service and gateway on loopback, waits until the
# gateway is healthy, prints the URL, and stops all three cleanly on Ctrl-C.
#
#   deploy/up.sh [--config deploy/edge.toml] [--model FILE_OR_HF_DIR] [--port 8080] [--threads N] [--no-build]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

config="deploy/edge.toml"
model="" port="" threads="" build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
[ -f "$config" ] || { echo "config file not found: $config" >&2; exit 2; }

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust from https://rustup.rs" >&2; exit 1
fi
if [ "$build" = 1 ]; then
  echo "building (release)..." >&2
  cargo build --release --bins --quiet
fi

# The few settings the launcher itself needs, read from the config (python3 >= 3.11 has tomllib).
read_setting() {
  python3 - "$config" "$1" "$2" "$3" <<'PY'
import sys, tomllib
cfg = tomllib.load(open(sys.argv[1], "rb"))
print(cfg.get(sys.argv[2], {}).get(sys.argv[3], sys.argv[4]))
PY
}
default_model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
model="${model:-$(read_setting engine model "$default_model")}"
listen="$(read_setting gateway listen 127.0.0.1:8080)"
if [ -n "$port" ]; then listen="${listen%:*}:$port"; fi
if [ "$model" = "$default_model" ] && [ ! -s "$model" ]; then
  echo "fetching the default model..." >&2
  deploy/fetch-model.sh >/dev/null
fi
[ -s "$model" ] || [ -f "$model/config.json" ] || { echo "model not found (a GGUF file or an HF checkpoint directory with config.json): $model" >&2; exit 1; }

logs="$root/run/logs"
mkdir -p "$logs"
pids=()
stop_all() {
  trap - INT TERM EXIT
  # Gateway first (stop taking requests), cache-service last (engines detach from it).
  for (( i=${#pids[@]}-1; i>=0; i-- )); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "stopped" >&2
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

bin="$root/target/release"
"$bin/cache-service" --config "$config" >"$logs/cache-service.log" 2>&1 & pids+=($!)
engine_args=(--config "$config" --model "$model")
[ -n "$threads" ] && engine_args+=(--threads "$threads")
"$bin/engine-service" "${engine_args[@]}" >"$logs/engine-service.log" 2>&1 & pids+=($!)
"$bin/gateway" --config "$config" --listen "$listen" >"$logs/gateway.log" 2>&1 & pids+=($!)

echo "starting (logs in $logs)..." >&2
for _ in $(seq 1 600); do
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "a service exited during startup; last log lines:" >&2
      tail -n 20 "$logs"/*.log >&2
      exit 1
    fi
  done
  if python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://$listen/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
    echo "ready: http://$listen/v1   (Ctrl-C stops all three services)"
    break
  fi
  sleep 0.5
done
python3 -c "import urllib.request; urllib.request.urlopen('http://$listen/health', timeout=2)" 2>/dev/null \
  || { echo "the stack did not become healthy in time; see $logs" >&2; exit 1; }

# Stay in the foreground until Ctrl-C or until one service dies.
wait -n "${pids[@]}" || true
echo "a service stopped; stopping the others (see $logs)" >&2
exit 1
