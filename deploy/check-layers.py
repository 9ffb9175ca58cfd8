#!/usr/bin/env python3
"""Fails when a crate of the workspace depends on one it must not (docs/architecture.md,
"Crates"). Reads `cargo metadata` (no build). Normal and build dependencies are checked;
dev-dependencies are free (tests may compose layers, e.g. engine-models' tests on engine-cpu).

    deploy/check-layers.py [--metadata FILE]   # FILE: saved `cargo metadata` JSON (for tests)
"""

import json
import subprocess
import sys

# Each workspace crate and the workspace crates it may depend on. A new crate must be added
# here: the check fails on a crate it does not know, so the layering is decided, not drifted.
ALLOWED = {
    "proto": set(),
    "cache-client": {"proto"},
    "cache-service": {"proto", "cache-client"},
    # The op seam: depends on no engine crate.
    "engine-ops": set(),
    # Kernels know the seam, never a model.
    "engine-cpu": {"engine-ops"},
    # The GPU's kernels and ops: the same layer as engine-cpu, beside it.
    "engine-cuda": {"engine-ops"},
    # Models know the seam, never a backend (so a model edit never rebuilds the kernels).
    "engine-models": {"engine-ops"},
    # The engine composes them; it links the cache's client, not its server.
    "engine-service": {"proto", "cache-client", "engine-ops", "engine-cpu", "engine-cuda", "engine-models"},
    # The gateway speaks gRPC to the engine: no engine code in it.
    "gateway": {"proto"},
    "e2e": set(),
    "bench": set(),
}


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--metadata"] and len(args) == 2:
        with open(args[1]) as f:
            meta = json.load(f)
    else:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            check=True, capture_output=True, text=True,
        ).stdout
        meta = json.loads(out)
    members = {p["name"] for p in meta["packages"]}
    bad = []
    for pkg in meta["packages"]:
        name = pkg["name"]
        if name not in ALLOWED:
            bad.append(f"{name}: not in deploy/check-layers.py's ALLOWED table; decide its layer there")
            continue
        for dep in pkg["dependencies"]:
            if dep["kind"] == "dev" or dep["name"] not in members:
                continue
            if dep["name"] not in ALLOWED[name]:
                kind = dep["kind"] or "normal"
                bad.append(f"{name} -> {dep['name']} ({kind} dependency) is not allowed")
    for line in bad:
        print(f"layering: {line}", file=sys.stderr)
    if not bad:
        print(f"layering: ok ({len(members)} crates)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
