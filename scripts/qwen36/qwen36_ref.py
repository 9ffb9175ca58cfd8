"""Plain NumPy (float64) forward pass of the Qwen3.5/3.6 text decoder and its MTP head.

Written from the model's maths (docs/qwen36.md; the decoder as in transformers' `qwen3_5`, the MTP
head as in vLLM's `qwen3_5_mtp.py`), without calling transformers:
the GDN layer uses the token-by-token recurrent form only (no chunking), so agreement with the
transformers goldens (which use the chunked form for prefill) checks both. Used by
mtp_reference.py (MTP goldens) and by make_goldens.py --check / quantize_nvfp4.py as a
cross-check. Slow and simple on purpose: one token at a time, batch 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

LIN, FULL = "linear_attention", "full_attention"


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    # torch.nn.functional.softplus: beta 1, threshold 20 (linear above it).
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rms1p(x, w, eps):
    """Zero-centred RMSNorm over the last axis: x̂ · (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def gated_rms(x, z, w, eps):
    """GDN output norm: x̂ · w · silu(z) (plain weight)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w * silu(z)


def l2norm(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


@dataclass
class TextConfig:
    hidden: int
    inter: int
    layer_types: list
    hq: int
    hkv: int
    hd: int
    hk: int
    hv: int
    dk: int
    dv: int
    kconv: int
    eps: float
    theta: float
    rot: int
    vocab: int
    tied: bool

    @staticmethod
    def from_json(path: Path) -> "TextConfig":
        top = json.loads(Path(path).read_text())
        c = top.get("text_config") or top
        rp = c.get("rope_parameters") or {}
        prf = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        theta = rp.get("rope_theta", c.get("rope_theta"))
        tied = bool(top.get("tie_word_embeddings", False) or c.get("tie_word_embeddings", False))
        return TextConfig(
            hidden=c["hidden_size"],
            inter=c["intermediate_size"],
            layer_types=list(c["layer_types"]),
            hq=c["num_attention_heads"],
            hkv=c["num_key_value_heads"],
            hd=c["head_dim"],
            hk=c["linear_num_key_heads"],
            hv=c["linear_num_value_heads"],
            dk=c["linear_key_head_dim"],
            dv=c["linear_value_head_dim"],
            kconv=c["linear_conv_kernel_dim"],
            eps=c["rms_norm_eps"],
            theta=float(theta),
            rot=int(c["head_dim"] * prf),
            vocab=c["vocab_size"],
            tied=tied,
        )


def load_weights(ckpt: Path) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint dir as float64, names without model./model.language_model."""
    ckpt = Path(ckpt)
    idx = ckpt / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        for k, v in load_file(str(ckpt / f)).items():
            if k.startswith("model.visual."):
                continue
            for p in ("model.language_model.", "model."):
                if k.startswith(p):
                    k = k[len(p) :]
                    break
            out[k] = v.astype(np.float64)
    return out


def e4m3_round(x, scale=1.0):
    """Round x/scale to the nearest float8_e4m3fn value (ties to even, saturating at ±448), times scale.

    This is the FP8 KV-cache round trip of spec §8.3: stored byte = E4M3(x / scale), read back
    as float(byte) · scale.
    """
    y = np.asarray(x, dtype=np.float64) / scale
    a = np.minimum(np.abs(y), 448.0)
    e = np.floor(np.log2(np.maximum(a, 2.0**-9)))
    e = np.maximum(e, -6.0)  # subnormals: fixed spacing 2^-9
    step = 2.0 ** (e - 3.0)
    q = np.round(a / step) * step  # np.round: half to even
    return np.sign(y) * np.minimum(q, 448.0) * scale


@dataclass
class KV:
    k: list = field(default_factory=list)  # per position [hkv, hd], post-norm post-RoPE
    v: list = field(default_factory=list)
    fp8: bool = False  # store K and V through an E4M3 round trip (scale 1.0)


@dataclass
class GdnState:
    conv: np.ndarray  # [kconv-1, conv_dim] last raw in_proj_qkv rows, oldest first
    s: np.ndarray  # [hv, dk, dv]


def rope(x, pos, cfg: TextConfig):
    """Partial rotate-half RoPE on the first cfg.rot dims of every head of x [heads, hd]."""
    half = cfg.rot // 2
    inv = cfg.theta ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.rot)
    ang = pos * inv
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    x1, x2 = x[:, :half], x[:, half : cfg.rot]
    out[:, :half] = x1 * c - x2 * s
    out[:, half : cfg.rot] = x2 * c + x1 * s
    return out


def attention(w, p, u, pos, kv: KV, cfg: TextConfig):
    """Gated full attention for one token u [H] at position pos; appends to kv."""
    qg = (w[p + "q_proj.weight"] @ u).reshape(cfg.hq, 2 * cfg.hd)
    q, gate = qg[:, : cfg.hd], qg[:, cfg.hd :]
    k = (w[p + "k_proj.weight"] @ u).reshape(cfg.hkv, cfg.hd)
    v = (w[p + "v_proj.weight"] @ u).reshape(cfg.hkv, cfg.hd)
    q = rope(rms1p(q, w[p + "q_norm.weight"], cfg.eps), pos, cfg)
    k = rope(rms1p(k, w[p + "k_norm.weight"], cfg.eps), pos, cfg)
    if kv.fp8:
        k, v = e4m3_round(k), e4m3_round(v)
    kv.k.append(k)
    kv.v.append(v)
    K, V = np.stack(kv.k), np.stack(kv.v)  # [T, hkv, hd]
    grp = cfg.hq // cfg.hkv
    out = np.empty((cfg.hq, cfg.hd))
    for h in range(cfg.hq):
        sc = K[:, h // grp, :] @ q[h] / np.sqrt(cfg.hd)
        a = np.exp(sc - sc.max())
        a /= a.sum()
        out[h] = a @ V[:, h // grp, :]
    o = out.reshape(-1) * (1.0 / (1.0 + np.exp(-gate.reshape(-1))))
    return w[p + "o_proj.weight"] @ o


def gdn(w, p, u, st: GdnState, cfg: TextConfig):
    """Gated DeltaNet for one token u [H], recurrent form; updates st in place."""
    m = w[p + "in_proj_qkv.weight"] @ u
    z = (w[p + "in_proj_z.weight"] @ u).reshape(cfg.hv, cfg.dv)
    b = w[p + "in_proj_b.weight"] @ u
    a = w[p + "in_proj_a.weight"] @ u
    window = np.concatenate([st.conv, m[None, :]], axis=0)  # [K, C], current token last
    st.conv = window[1:]
    cw = w[p + "conv1d.weight"][:, 0, :]  # [C, K]
    c = silu(np.sum(window.T * cw, axis=1))
    kd = cfg.hk * cfg.dk
    q = l2norm(c[:kd].reshape(cfg.hk, cfg.dk)) / np.sqrt(cfg.dk)
    k = l2norm(c[kd : 2 * kd].reshape(cfg.hk, cfg.dk))
    v = c[2 * kd :].reshape(cfg.hv, cfg.dv)
    beta = 1.0 / (1.0 + np.exp(-b))
    g = -np.exp(w[p + "A_log"]) * softplus(a + w[p + "dt_bias"])
    r = cfg.hv // cfg.hk
    o = np.empty((cfg.hv, cfg.dv))
    for j in range(cfg.hv):
        kj, qj = k[j // r], q[j // r]
        S = st.s[j] * np.exp(g[j])
        delta = beta[j] * (v[j] - S.T @ kj)
        S = S + np.outer(kj, delta)
        st.s[j] = S
        o[j] = S.T @ qj
    o = gated_rms(o, z, w[p + "norm.weight"], cfg.eps)
    return w[p + "out_proj.weight"] @ o.reshape(-1)


def mlp(w, p, u):
    return w[p + "down_proj.weight"] @ (silu(w[p + "gate_proj.weight"] @ u) * (w[p + "up_proj.weight"] @ u))


def head(w, cfg: TextConfig):
    return w["embed_tokens.weight"] if cfg.tied or "lm_head.weight" not in w else w["lm_head.weight"]


class Model:
    """Main decoder with its per-sequence state; feed() consumes tokens one at a time."""

    def __init__(self, w, cfg: TextConfig, kv_fp8: bool = False):
        self.w, self.cfg = w, cfg
        conv_dim = 2 * cfg.hk * cfg.dk + cfg.hv * cfg.dv
        self.states = {}
        for i, t in enumerate(cfg.layer_types):
            if t == LIN:
                self.states[i] = GdnState(np.zeros((cfg.kconv - 1, conv_dim)), np.zeros((cfg.hv, cfg.dk, cfg.dv)))
            else:
                self.states[i] = KV(fp8=kv_fp8)
        self.pos = 0

    def feed(self, ids):
        """Returns (logits [T, V], hidden [T, H] after the final norm)."""
        w, cfg = self.w, self.cfg
        logits, hidden = [], []
        for tok in ids:
            x = w["embed_tokens.weight"][tok].copy()
            for i, t in enumerate(cfg.layer_types):
                p = f"layers.{i}."
                u = rms1p(x, w[p + "input_layernorm.weight"], cfg.eps)
                if t == LIN:
                    x = x + gdn(w, p + "linear_attn.", u, self.states[i], cfg)
                else:
                    x = x + attention(w, p + "self_attn.", u, self.pos, self.states[i], cfg)
                x = x + mlp(w, p + "mlp.", rms1p(x, w[p + "post_attention_layernorm.weight"], cfg.eps))
            h = rms1p(x, w["norm.weight"], cfg.eps)
            hidden.append(h)
            logits.append(head(w, cfg) @ h)
            self.pos += 1
        return np.stack(logits), np.stack(hidden)


class Mtp:
    """The MTP head (spec §5.1): one gated full-attention decoder layer with its own KV cache."""

    def __init__(self, w, cfg: TextConfig):
        self.w, self.cfg = w, cfg
        self.kv = KV()

    def step(self, h, tok, pos):
        """One MTP position: target hidden h (post-final-norm) or the MTP's previous output, next token id.

        Returns (out [H] after mtp.norm, logits [V]). Positions must be fed in increasing order
        (the KV cache is append-only here).
        """
        w, cfg = self.w, self.cfg
        e = w["embed_tokens.weight"][tok]
        cat = np.concatenate(
            [rms1p(e, w["mtp.pre_fc_norm_embedding.weight"], cfg.eps), rms1p(h, w["mtp.pre_fc_norm_hidden.weight"], cfg.eps)]
        )
        x = w["mtp.fc.weight"] @ cat
        p = "mtp.layers.0."
        u = rms1p(x, w[p + "input_layernorm.weight"], cfg.eps)
        x = x + attention(w, p + "self_attn.", u, pos, self.kv, cfg)
        x = x + mlp(w, p + "mlp.", rms1p(x, w[p + "post_attention_layernorm.weight"], cfg.eps))
        out = rms1p(x, w["mtp.norm.weight"], cfg.eps)
        return out, head(w, cfg) @ out
