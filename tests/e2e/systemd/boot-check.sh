#!/usr/bin/env bash
# Runs inside a container booted with systemd as PID 1 (tests/e2e/tests/systemd_boot.rs):
# installs the stack with deploy/install.sh as an operator would, then checks it as systemd
# runs it. The repository is at /srv/edge (read-only), the model at $EDGE_CHECK_MODEL, and
# every result goes to /out: check.log (a line per check, PASS at the end), install.log,
# and journal.txt when a check fails. Powers the container off when done.
set -uo pipefail
out=/out
log="$out/check.log"
gateway=http://127.0.0.1:8080
: >"$log"

say() { echo "$*" >>"$log"; }
finish() {
  journalctl --no-pager -o short-monotonic -u 'edge-*' >"$out/journal.txt" 2>&1
  systemctl --no-pager status 'edge-*' >>"$out/journal.txt" 2>&1
  systemctl poweroff
  exit "$1"
}
fail() { say "FAIL: $*"; finish 1; }
ok() { say "ok: $*"; }
main_pid() { systemctl show -p MainPID --value "$1"; }
restarts() { systemctl show -p NRestarts --value "$1"; }

# One chat turn: prints "STATUS CACHED_TOKENS". The system prompt is the conversation's
# shared prefix (several KV pages), so a warm cache serves it.
chat() {
  local body
  body=$(printf '{"messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}],"max_tokens":8,"temperature":0}' \
    "$(printf 'You are a careful assistant for an operations team. %.0s' {1..12})" "$1")
  curl -s -o "$out/reply.json" -w '%{http_code}' --max-time 120 -H 'content-type: application/json' \
    -d "$body" "$gateway/v1/chat/completions" >"$out/status.txt" 2>/dev/null
  local status cached
  status=$(cat "$out/status.txt")
  cached=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"])' \
    "$out/reply.json" 2>/dev/null || echo 0)
  echo "$status $cached"
}

wait_healthy() {
  local deadline=$((SECONDS + $1))
  until curl -sf --max-time 2 "$gateway/health" >/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

# A steady load while the engine is swapped: $1 loops of sequential turns, each turn's HTTP
# status appended to $out/load-<n>.txt, until $out/stop-load exists.
start_load() {
  rm -f "$out/stop-load" "$out"/load-*.txt
  for n in $(seq 1 "$1"); do
    (
      turn=0
      until [ -e "$out/stop-load" ]; do
        turn=$((turn + 1))
        curl -s -o /dev/null -w '%{http_code}\n' --max-time 120 -H 'content-type: application/json' \
          -d "{\"messages\":[{\"role\":\"user\",\"content\":\"loop $n turn $turn: name a colour\"}],\"max_tokens\":6,\"temperature\":0}" \
          "$gateway/v1/chat/completions" >>"$out/load-$n.txt"
      done
    ) &
  done
}
stop_load() {
  touch "$out/stop-load"
  wait
  total=$(cat "$out"/load-*.txt | wc -l)
  failed=$(grep -vc '^200$' <(cat "$out"/load-*.txt))
}

[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
ok "PID 1 is systemd $(systemctl --version | head -1 | cut -d' ' -f2)"

cd /srv/edge || fail "no repository at /srv/edge"
deploy/install.sh --no-build --model "$EDGE_CHECK_MODEL" >"$out/install.log" 2>&1 || fail "deploy/install.sh (install.log)"
ok "deploy/install.sh installed, enabled and started edge.target"
wait_healthy 300 || fail "the gateway is not healthy within 300 s"
for unit in edge.target edge-cache.service edge-engine.service edge-gateway.service; do
  [ "$(systemctl is-active "$unit")" = active ] || fail "$unit is $(systemctl is-active "$unit")"
  [ "$(systemctl is-enabled "$unit")" = enabled ] || fail "$unit is not enabled"
done
ok "edge.target and the three units are active and enabled"
for unit in edge-cache edge-engine edge-gateway; do
  user=$(ps -o user= -p "$(main_pid "$unit")")
  [ "$user" = edge ] || fail "$unit runs as $user, not edge"
done
ok "the three services run as the edge user"
arena=$(stat -c '%U %a' /dev/shm/edge-cache 2>/dev/null) || fail "no arena at /dev/shm/edge-cache"
[ "$arena" = "edge 600" ] || fail "the arena is '$arena', not 'edge 600'"
[ "$(stat -c '%U %a' /run/edge)" = "edge 700" ] || fail "/run/edge is $(stat -c '%U %a' /run/edge)"
ok "the arena and /run/edge belong to edge alone (0600, 0700)"

read -r status cached < <(chat "first question")
[ "$status" = 200 ] || fail "a chat turn answered $status: $(cat "$out/reply.json")"
read -r status cached < <(chat "second question")
[ "$status" = 200 ] && [ "$cached" -gt 0 ] || fail "a second turn: $status, $cached cached tokens"
ok "a chat is served, its second turn from the cache ($cached prompt tokens)"

# systemctl reload edge-engine under load: no failed request, a new main process, the
# unit active throughout, the cache warm for the new engine.
old=$(main_pid edge-engine)
cache_pid=$(main_pid edge-cache)
start_load 3
sleep 3
systemctl reload edge-engine || { stop_load; fail "systemctl reload edge-engine failed"; }
new=$(main_pid edge-engine)
sleep 3
stop_load
[ "$new" != "$old" ] || fail "the engine's main pid is still $old after the reload"
[ "$(systemctl is-active edge-engine)" = active ] || fail "edge-engine is $(systemctl is-active edge-engine) after the reload"
[ "$(restarts edge-engine)" = 0 ] || fail "edge-engine restarted $(restarts edge-engine) times during the reload"
! kill -0 "$old" 2>/dev/null || fail "the old engine $old still runs after the reload"
[ "$total" -gt 0 ] && [ "$failed" = 0 ] || fail "$failed of $total turns failed across the reload"
journalctl -u edge-engine --no-pager | grep -q 'took the socket over' || fail "the new engine's log is not in the unit's journal"
read -r status cached < <(chat "after the reload")
[ "$status" = 200 ] && [ "$cached" -gt 0 ] || fail "the new engine's first turn: $status, $cached cached tokens"
ok "systemctl reload edge-engine: main pid $old -> $new, $total turns across it, 0 failed, new engine warm ($cached cached tokens)"

# An upgrade: install.sh again while the stack serves swaps the engine the same way.
old=$new
start_load 2
sleep 2
deploy/install.sh --no-build --model "$EDGE_CHECK_MODEL" >"$out/upgrade.log" 2>&1 || { stop_load; fail "install.sh over a running stack (upgrade.log)"; }
new=$(main_pid edge-engine)
sleep 2
stop_load
grep -q 'systemctl reload edge-engine' "$out/upgrade.log" || fail "install.sh over a running stack did not reload the engine"
[ "$new" != "$old" ] && [ "$(restarts edge-engine)" = 0 ] || fail "the upgrade: main pid $old -> $new, $(restarts edge-engine) restarts"
[ "$(main_pid edge-cache)" = "$cache_pid" ] || fail "the upgrade restarted the cache-service"
[ "$total" -gt 0 ] && [ "$failed" = 0 ] || fail "$failed of $total turns failed across the upgrade"
ok "deploy/install.sh over the running stack: engine $old -> $new by reload, cache-service kept, $total turns, 0 failed"

# An engine crash: systemd restarts only the engine; the cache-service keeps the arena.
systemctl kill --kill-whom=main -s KILL edge-engine
deadline=$((SECONDS + 120))
until [ "$(systemctl is-active edge-engine)" = active ] && [ "$(main_pid edge-engine)" != "$new" ] \
  && [ "$(main_pid edge-engine)" != 0 ]; do
  [ $SECONDS -lt $deadline ] || fail "edge-engine was not restarted within 120 s of a crash"
  sleep 0.5
done
[ "$(restarts edge-engine)" = 1 ] || fail "edge-engine NRestarts is $(restarts edge-engine), not 1"
[ "$(main_pid edge-cache)" = "$cache_pid" ] || fail "the cache-service restarted with the engine"
read -r status cached < <(chat "after the crash")
[ "$status" = 200 ] && [ "$cached" -gt 0 ] || fail "the first turn after the crash: $status, $cached cached tokens"
ok "a killed engine is restarted by systemd (Restart=on-failure), the cache-service untouched, warm ($cached cached tokens)"

# The target's stop job ends first (it is ordered after the services, so it stops before
# them): systemctl returns while the services still drain.
systemctl stop edge.target
deadline=$((SECONDS + 90))
for unit in edge-gateway edge-engine edge-cache; do
  while state=$(systemctl is-active "$unit"); [ "$state" = active ] || [ "$state" = deactivating ]; do
    [ $SECONDS -lt $deadline ] || fail "$unit is still $state 90 s after systemctl stop edge.target"
    sleep 0.2
  done
  [ "$state" = inactive ] || fail "$unit is $state after systemctl stop edge.target"
done
[ ! -e /dev/shm/edge-cache ] || fail "the arena is left after the cache-service stopped"
ok "systemctl stop edge.target: the three units inactive (not failed), the arena removed"

say PASS
finish 0
