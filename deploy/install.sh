#!/usr/bin/env bash
# Installs the stack as systemd services on this machine (a Jetson, or any systemd box):
# builds release binaries for the host, installs them and the docs under PREFIX, creates the
# `edge` system user, writes CONFIG_DIR/edge.toml and edge.env (kept if already there), puts
# the model under STATE_DIR/models, writes the units (deploy/systemd/) to UNIT_DIR with these
# paths, and enables and starts edge.target. Run as root. docs/operating.md has the rest.
#
#   deploy/install.sh [--prefix /opt/edge] [--config-dir /etc/edge] [--state-dir /var/lib/edge]
#                     [--unit-dir /etc/systemd/system] [--user edge] [--model FILE_OR_HF_DIR]
#                     [--no-build] [--no-start]
#
# --no-start stages everything but creates no user and calls no systemctl (for an image
# build, or to look before starting); the units' test uses it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

prefix=/opt/edge config_dir=/etc/edge state_dir=/var/lib/edge unit_dir=/etc/systemd/system
user=edge model="" build=1 start=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --config-dir) config_dir="$2"; shift 2 ;;
    --state-dir) state_dir="$2"; shift 2 ;;
    --unit-dir) unit_dir="$2"; shift 2 ;;
    --user) user="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-start) start=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
for dir in "$prefix" "$config_dir" "$state_dir" "$unit_dir"; do
  case "$dir" in /*) ;; *) echo "paths must be absolute: $dir" >&2; exit 2 ;; esac
done
if [ "$start" = 1 ] && [ "$(id -u)" != 0 ]; then
  echo "run as root (it creates a user and writes units), or pass --no-start" >&2; exit 1
fi

if [ "$build" = 1 ]; then
  echo "building release binaries for $(uname -m)..." >&2
  cargo build --release --bins --quiet
fi
for bin in cache-service engine-service gateway; do
  [ -x "target/release/$bin" ] || { echo "missing target/release/$bin (drop --no-build)" >&2; exit 1; }
done

# The model: the one given, else the default one (fetched into models/ if missing).
if [ -z "$model" ]; then
  model="$(deploy/fetch-model.sh)"
fi
[ -s "$model" ] || [ -f "$model/config.json" ] || { echo "model not found: $model" >&2; exit 1; }
model_name="$(basename "$model")"

if [ "$start" = 1 ] && ! id -u "$user" >/dev/null 2>&1; then
  echo "creating system user $user" >&2
  useradd --system --home-dir "$state_dir" --no-create-home --shell /usr/sbin/nologin "$user"
fi
if [ "$start" = 1 ]; then
  # The GPU device nodes belong to these groups on JetPack and most driver installs.
  for group in video render; do
    if getent group "$group" >/dev/null; then usermod -aG "$group" "$user"; fi
  done
fi
owner=()
[ "$start" = 1 ] && owner=(-o root -g "$user")

echo "installing into $prefix" >&2
install -d "$prefix/bin" "$prefix/share/doc/edge"
for bin in cache-service engine-service gateway; do
  install -m 0755 "target/release/$bin" "$prefix/bin/$bin.new"
  mv -f "$prefix/bin/$bin.new" "$prefix/bin/$bin"
done
install -m 0755 deploy/swap-engine.sh "$prefix/bin/swap-engine.sh.new"
mv -f "$prefix/bin/swap-engine.sh.new" "$prefix/bin/swap-engine.sh"
install -m 0644 README.md docs/*.md "$prefix/share/doc/edge/"

install -d -m 0750 "${owner[@]}" "$config_dir" "$state_dir" "$state_dir/models"
if [ ! -e "$state_dir/models/$model_name" ]; then
  cp -r "$model" "$state_dir/models/$model_name"
  [ "$start" = 1 ] && chown -R "root:$user" "$state_dir/models/$model_name"
  chmod -R u+rwX,g+rX,o-rwx "$state_dir/models/$model_name"
fi
# Config files are the operator's once written: a reinstall keeps them.
if [ ! -e "$config_dir/edge.toml" ]; then
  python3 - deploy/edge.toml "$config_dir/edge.toml" "$state_dir/models/$model_name" <<'PY'
import re, sys
src, dest, model = sys.argv[1:]
text = open(src).read()
text = re.sub(r'(?m)^model = ".*"$', f'model = "{model}"', text, count=1)
open(dest, "w").write(text)
PY
  chmod 0640 "$config_dir/edge.toml"
  [ "$start" = 1 ] && chown "root:$user" "$config_dir/edge.toml"
else
  echo "keeping $config_dir/edge.toml" >&2
fi
if [ ! -e "$config_dir/edge.env" ]; then
  install -m 0640 "${owner[@]}" deploy/systemd/edge.env "$config_dir/edge.env"
else
  echo "keeping $config_dir/edge.env" >&2
fi

# The units, with this install's paths and user. StateDirectory= is relative to /var/lib; a
# state directory elsewhere is created here instead.
state_unit="StateDirectory=${state_dir#/var/lib/}"
[ "${state_dir#/var/lib/}" = "$state_dir" ] && state_unit="# StateDirectory= not used: $state_dir is created by install.sh"
install -d "$unit_dir"
for unit in deploy/systemd/*.service deploy/systemd/*.target; do
  sed -e "s|/opt/edge|$prefix|g" -e "s|/etc/edge|$config_dir|g" -e "s|/var/lib/edge|$state_dir|g" \
      -e "s|^User=edge$|User=$user|" -e "s|^Group=edge$|Group=$user|" \
      -e "s|^StateDirectory=edge$|$state_unit|" "$unit" >"$unit_dir/$(basename "$unit")"
  chmod 0644 "$unit_dir/$(basename "$unit")"
done

if [ "$start" = 0 ]; then
  echo "staged; not started (--no-start). Units in $unit_dir." >&2
  exit 0
fi
systemctl daemon-reload
systemctl enable edge-cache.service edge-engine.service edge-gateway.service edge.target
if systemctl is-active --quiet edge-engine.service; then
  # An upgrade: the engine is swapped with no failed request and a warm cache; the
  # cache-service (its arena) and the gateway (its connections) keep running their build.
  echo "edge-engine is running: swapping in the new build (systemctl reload edge-engine)" >&2
  systemctl reload edge-engine.service
  systemctl start edge.target
  echo "the cache-service and gateway run their old build until: systemctl restart edge-cache edge-gateway" >&2
else
  systemctl restart edge.target
fi
listen="$(python3 -c 'import sys,tomllib; print(tomllib.load(open(sys.argv[1],"rb")).get("gateway",{}).get("listen","127.0.0.1:8080"))' "$config_dir/edge.toml")"
echo "started: systemctl status edge.target; journalctl -u 'edge-*' -f; http://$listen/v1" >&2
