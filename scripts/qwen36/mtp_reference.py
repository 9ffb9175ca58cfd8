#!/usr/bin/env python3
"""MTP (multi-token prediction) goldens for the tiny-vlm fixture, from a NumPy reference.

transformers has no MTP implementation (it drops `mtp.*`), so the reference is
qwen36_ref.Mtp, written from vLLM's Qwen3.5 MTP (`vllm/model_executor/models/qwen3_5_mtp.py`; docs/qwen36.md):

    e   = embed_tokens[y]
    u   = mtp.fc · concat(RMSNorm1p(e, pre_fc_norm_embedding), RMSNorm1p(h, pre_fc_norm_hidden))
    x   = full-attention decoder layer mtp.layers.0 (gated attention + SwiGLU, own KV cache) at pos
    out = RMSNorm1p(x, mtp.norm);  logits = lm_head · out

Run by hand after make_goldens.py (same venv and versions, see make_goldens.py):

    /work/tmp_py/golden/bin/python scripts/qwen36/mtp_reference.py

Inputs are taken from tiny-vlm/goldens.{json,safetensors}: token ids x and the target model's
post-final-norm hidden states from transformers (f32). Computation is float64; outputs are
stored as f32 in tiny-vlm/mtp_goldens.safetensors with the layout in mtp_goldens.json.

Scenario (n = 137, K = 3 drafts), exactly the round structure of spec §5.2:
  1. catch-up: for t in 0..n-1: MTP(h = prefill.hidden[t], y = x[t+1], pos = t)
     (y for t = n-1 is x[n], the "sampled" token) -> catchup.out [n, H], catchup.logits [n, V]
  2. drafts: d1 = argmax(catchup.logits[n-1]); for k = 2..K:
     MTP(h = previous MTP out, y = d_{k-1}, pos = n+k-2) -> draft.out/logits [K-1, ...]; d_k = argmax
  3. round 2: drop MTP KV entries at positions >= n, then catch-up over t = n..n+3 with
     h = decode.hidden[t-n] (target hiddens of positions 137..140 from the transformers decode
     scenario) and y = x[t+1] -> round2.out [4, H], round2.logits [4, V]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen36_ref import Model, Mtp, TextConfig, load_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "engine-service" / "tests" / "fixtures" / "qwen36" / "tiny-vlm"
K_DRAFTS = 3
ROUND2 = 4


def main() -> None:
    cfg = TextConfig.from_json(CKPT / "config.json")
    w = load_weights(CKPT)
    g = load_file(str(CKPT / "goldens.safetensors"))
    meta = json.loads((CKPT / "goldens.json").read_text())
    x = meta["token_ids"]
    n = meta["prefill"]["ids_range"][1]
    h = g["prefill.hidden"].astype(np.float64)
    h_dec = g["decode.hidden"].astype(np.float64)

    # Cross-check the independent NumPy main model against the transformers goldens first:
    # if this fails, the MTP reference's shared pieces (norms, attention, RoPE) are suspect.
    ref_logits, ref_hidden = Model(w, cfg).feed(x[: n + ROUND2])
    err_main = float(np.abs(ref_logits[:n] - g["prefill.logits"]).max())
    err_hidden = float(np.abs(ref_hidden[:n] - h).max())
    if err_main > 1e-4:
        raise SystemExit(f"numpy main model vs transformers prefill logits: {err_main}")

    mtp = Mtp(w, cfg)
    outs, logits = [], []
    for t in range(n):
        o, lg = mtp.step(h[t], x[t + 1], t)
        outs.append(o)
        logits.append(lg)
    catch_out, catch_logits = np.stack(outs), np.stack(logits)

    drafts = [int(np.argmax(catch_logits[n - 1]))]
    d_out, d_logits = [], []
    prev = catch_out[n - 1]
    for k in range(2, K_DRAFTS + 1):
        prev, lg = mtp.step(prev, drafts[-1], n + k - 2)
        d_out.append(prev)
        d_logits.append(lg)
        drafts.append(int(np.argmax(lg)))

    # Round 2: the draft-built MTP KV entries (positions >= n) are dropped and rebuilt from
    # target hiddens of the accepted positions.
    del mtp.kv.k[n:], mtp.kv.v[n:]
    r_out, r_logits = [], []
    for j in range(ROUND2):
        t = n + j
        o, lg = mtp.step(h_dec[j], x[t + 1], t)
        r_out.append(o)
        r_logits.append(lg)

    tensors = {
        "catchup.out": catch_out,
        "catchup.logits": catch_logits,
        "draft.out": np.stack(d_out),
        "draft.logits": np.stack(d_logits),
        "round2.out": np.stack(r_out),
        "round2.logits": np.stack(r_logits),
    }
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, str(CKPT / "mtp_goldens.safetensors"))
    doc = {
        "generator": "scripts/qwen36/mtp_reference.py (NumPy float64, spec §5)",
        "inputs": {
            "token_ids": "goldens.json token_ids (x)",
            "n": n,
            "catchup": {
                "hidden": "goldens.safetensors prefill.hidden rows 0..n-1",
                "tokens": "x[1..n] (token for row t is x[t+1])",
                "positions": [0, n],
            },
            "draft": {
                "first_hidden": "catchup.out[n-1]",
                "tokens": f"d1..d{K_DRAFTS - 1} (listed below); row k-2 uses d_(k-1) at position n+k-2",
                "positions": [n, n + K_DRAFTS - 1],
            },
            "round2": {
                "kv": "MTP KV entries of positions 0..n-1 from the catch-up (draft entries dropped)",
                "hidden": "goldens.safetensors decode.hidden rows 0..3 (target positions n..n+3)",
                "tokens": "x[n+1..n+5)",
                "positions": [n, n + ROUND2],
            },
        },
        "drafts": drafts,
        "argmax": {
            "catchup.logits": catch_logits.argmax(-1).tolist(),
            "draft.logits": np.stack(d_logits).argmax(-1).tolist(),
            "round2.logits": np.stack(r_logits).argmax(-1).tolist(),
        },
        "numpy_vs_transformers_main_model": {"prefill_logits_max_abs": err_main, "prefill_hidden_max_abs": err_hidden},
    }
    (CKPT / "mtp_goldens.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"mtp goldens written; drafts {drafts}; numpy vs HF main logits {err_main:.2e}, hidden {err_hidden:.2e}")


if __name__ == "__main__":
    main()
