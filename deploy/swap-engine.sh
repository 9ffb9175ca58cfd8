#!/usr/bin/env bash
# Swaps the running engine for a new build or a new config with no failed request:
#   1. starts the new engine with the old one's command line and environment (the new binary
#      in place of the old, or --config NEW.toml), plus --takeover;
#   2. the new engine loads the model and attaches to the cache-service's arena while the old
#      one keeps serving (same model fingerprint: the cache stays warm; another: the new
#      engine starts cold and never reads the old pages), then takes the socket over in one
#      rename: new calls reach it, the gateway needs no restart;
#   3. the old engine gets SIGTERM, finishes the streams it has, and exits.
# If the new engine fails to start, the old one is left serving and the script fails.
#
#   deploy/swap-engine.sh [NEW_ENGINE_BINARY | NEW_CONFIG.toml] [--ready-timeout 600] [--drain-timeout 120]
#
# With no argument the new engine is the binary now at the old one's path (a build installed
# over it) with the same config file, read again.
#
# The engine is found through its socket's pid file: $EDGE_RUNTIME_DIR/engine.sock.pid (the
# runtime directory the services use: $EDGE_RUNTIME_DIR, else $XDG_RUNTIME_DIR/edge, else
# /tmp/edge-<uid>). Run it as the user the engine runs as. Under systemd it is the engine
# unit's ExecReload= (`systemctl reload edge-engine`): systemd gives it the old engine as
# $MAINPID, the new engine tells systemd it is the unit's main process before the old one is
# stopped, and its log goes to the journal. See docs/operating.md "Swapping the engine".
set -euo pipefail

new="" ready_timeout=600 drain_timeout=120
while [ $# -gt 0 ]; do
  case "$1" in
    --ready-timeout) ready_timeout="$2"; shift 2 ;;
    --drain-timeout) drain_timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$new" ] || { echo "one new binary or config, not two: $1" >&2; exit 2; }
       new="$1"; shift ;;
  esac
done

# Running, not a zombie waiting for its parent to reap it.
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

runtime="${EDGE_RUNTIME_DIR:-}"
[ -n "$runtime" ] || { [ -n "${XDG_RUNTIME_DIR:-}" ] && runtime="$XDG_RUNTIME_DIR/edge"; }
[ -n "$runtime" ] || runtime="/tmp/edge-$(id -u)"
pid_file="$runtime/engine.sock.pid"
if [ -n "${MAINPID:-}" ]; then
  # systemd's ExecReload=: the unit's main process is the engine to replace.
  old_pid="$MAINPID"
else
  [ -s "$pid_file" ] || { echo "no running engine: $pid_file is missing" >&2; exit 1; }
  old_pid="$(cat "$pid_file")"
fi
alive "$old_pid" || { echo "engine pid $old_pid is not running" >&2; exit 1; }

# The old engine's command line and environment, as it was started.
mapfile -d '' argv < "/proc/$old_pid/cmdline"
mapfile -d '' environ < "/proc/$old_pid/environ"
binary="$(readlink -f "/proc/$old_pid/exe")"
# A binary replaced on disk since the old engine started reads "(deleted)": its path now
# holds the new build.
binary="${binary% (deleted)}"
if [ -z "$new" ]; then
  args=("${argv[@]:1}")
elif [[ "$new" == *.toml ]]; then
  [ -f "$new" ] || { echo "config not found: $new" >&2; exit 1; }
  new_config="$(cd "$(dirname "$new")" && pwd)/$(basename "$new")"
  args=() replaced=0
  for ((i = 1; i < ${#argv[@]}; i++)); do
    if [ "${argv[$i]}" = "--config" ]; then args+=(--config "$new_config"); i=$((i + 1)); replaced=1
    elif [[ "${argv[$i]}" == --config=* ]]; then args+=(--config "$new_config"); replaced=1
    else args+=("${argv[$i]}"); fi
  done
  [ "$replaced" = 1 ] || args+=(--config "$new_config")
else
  [ -x "$new" ] || { echo "not an executable or a .toml config: $new" >&2; exit 1; }
  binary="$(cd "$(dirname "$new")" && pwd)/$(basename "$new")"
  args=("${argv[@]:1}")
fi
# An engine that came in by a swap was started with --takeover itself; it is added once below.
kept=()
for a in "${args[@]}"; do [ "$a" = --takeover ] || kept+=("$a"); done
args=("${kept[@]}")
# Same output as the old engine (its log file), when that is a file; under systemd, the
# journal stream this script was given.
log="$(readlink -f "/proc/$old_pid/fd/1" 2>/dev/null || true)"
if [ ! -f "$log" ]; then
  if [ -n "${INVOCATION_ID:-}" ]; then log=""; else log=/dev/null; fi
fi

echo "starting the new engine ($binary) beside pid $old_pid..." >&2
# Immune to the hangup of this script's terminal; its own SIGTERM handling is unchanged.
start_new() { cd "/proc/$old_pid/cwd" && exec env -i "${environ[@]}" "$binary" "${args[@]}" --takeover </dev/null; }
if [ -n "$log" ]; then (trap '' HUP; start_new >>"$log" 2>&1) & else (trap '' HUP; start_new) & fi
new_pid=$!

deadline=$((SECONDS + ready_timeout))
until [ "$(cat "$pid_file" 2>/dev/null)" = "$new_pid" ]; do
  if ! alive "$new_pid"; then
    echo "the new engine exited before taking over; pid $old_pid still serves (log: ${log:-the journal})" >&2
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    kill -TERM "$new_pid" 2>/dev/null || true
    echo "the new engine was not ready in ${ready_timeout}s; stopped it, pid $old_pid still serves" >&2
    exit 1
  fi
  sleep 0.1
done
echo "pid $new_pid took the socket over; draining pid $old_pid..." >&2

kill -TERM "$old_pid"
deadline=$((SECONDS + drain_timeout))
while alive "$old_pid"; do
  if [ $SECONDS -ge $deadline ]; then
    echo "pid $old_pid still draining after ${drain_timeout}s; killing it" >&2
    kill -KILL "$old_pid" 2>/dev/null || true
    break
  fi
  sleep 0.1
done
echo "swapped: pid $old_pid -> $new_pid" >&2
echo "$new_pid"
