#!/usr/bin/env bash
# Makes the Python environment the tests use: .venv/ under the repo (ignored by git) with the
# packages in deploy/python-requirements.txt. Needs only python3 and pip. Skips pip when the
# packages are already there, so a warm checkout runs offline. Prints the interpreter's path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
req="$root/deploy/python-requirements.txt"
py="$venv/bin/python3"
if [ ! -x "$py" ]; then
  # Debian's python3 without python3-venv has no ensurepip: make the venv without pip and use
  # the system pip with --target (the venv's site-packages), which needs no ensurepip.
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv --without-pip "$venv" >&2
  fi
fi
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$py" -c 'import openai, anthropic, jsonschema, kubernetes_validate, yaml' >/dev/null 2>&1; then
  if "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  else
    python3 -m pip install --quiet --disable-pip-version-check --target "$site" -r "$req" >&2
  fi
fi
echo "$py"
