#!/usr/bin/env python3
"""Tiny random-weight Qwen3.5/3.6 checkpoints and golden logits from HF transformers.

Run by hand (not in CI), from the repository root:

    python3 -m venv /work/tmp_py/golden
    /work/tmp_py/golden/bin/pip install "transformers>=5.2" torch safetensors numpy tokenizers
    /work/tmp_py/golden/bin/python scripts/qwen36/make_goldens.py

Versions used for the committed fixtures: Python 3.11.7, torch 2.15.0 (PyPI wheel, CPU),
transformers 5.24.0, safetensors 0.8.0, numpy 2.4.6, tokenizers 0.23.3. Do NOT install
flash-linear-attention / causal-conv1d / kernels: transformers must use its reference torch
path (chunked delta rule for prefill, recurrent rule for single-token cached decode).

Writes engine-service/tests/fixtures/qwen36/{tiny-vlm,tiny-text,tiny-text-bf16}/ (see the
README there): checkpoint files, `goldens.safetensors` (f32 tensors) and `goldens.json` (token ids,
segment layout, argmax per row, versions). Each set is also checked against the independent
float64 NumPy forward in qwen36_ref.py (stored as `f64.full.logits`). Everything is deterministic (fixed seeds); re-running
rewrites byte-identical checkpoints and logits equal to within float rounding of the torch build.

The MTP goldens (scripts/qwen36/mtp_reference.py) and the NVFP4 checkpoint
(scripts/qwen36/quantize_nvfp4.py) are derived from the tiny-vlm checkpoint written here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    DynamicCache,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen36_ref  # noqa: E402
import tiny_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "engine-service" / "tests" / "fixtures" / "qwen36"
TEMPLATE = Path(__file__).resolve().parents[2] / "engine-service/templates/qwen3_5.jinja"

LIN, FULL = "linear_attention", "full_attention"

# Token ids 0..255 are the 256 byte-level tokens of tiny_tokenizer; the special tokens follow.
VOCAB = tiny_tokenizer.VOCAB_SIZE

# (a) VLM-style: text_config nesting, model.language_model.* names, mtp.*, untied head, sharded.
#     Real-model ratios: 3 linear + 1 full, partial rotary 0.25, Hv = 2 Hk (grouping), theta 1e7.
VLM_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=[LIN, LIN, LIN, FULL],
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        mrope_section=[2, 1, 1],
        mrope_interleaved=True,
    ),
    partial_rotary_factor=0.25,
    tie_word_embeddings=False,
    attention_bias=False,
    attn_output_gate=True,
    mamba_ssm_dtype="float32",
    mtp_num_hidden_layers=1,
    mtp_use_dedicated_embeddings=False,
    eos_token_id=tiny_tokenizer.ENDOFTEXT_ID,
    bos_token_id=None,
    pad_token_id=None,
)

# (b) flat text-only: top-level keys, model.* names, tied head, one file, no mtp.
#     Deliberately different from (a): another layer pattern, group size 3, d_k != d_v,
#     1 KV head (GQA 2), head_dim 64 (rotary 16), theta 1e6, odd hidden size multiple of 16.
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=5,
    layer_types=[LIN, FULL, LIN, LIN, FULL],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=1_000_000.0,
        partial_rotary_factor=0.25,
        mrope_section=[4, 2, 2],
        mrope_interleaved=True,
    ),
    partial_rotary_factor=0.25,
    tie_word_embeddings=True,
    attention_bias=False,
    eos_token_id=tiny_tokenizer.ENDOFTEXT_ID,
    bos_token_id=None,
    pad_token_id=None,
)

# A vision tower small enough to ship: it only proves the loader skips model.visual.*.
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    in_channels=3,
    patch_size=2,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=64,
    num_position_embeddings=16,
)

# Token layout of every scenario (see README): one random id sequence per checkpoint.
SEQ_LEN = 184
PREFILL = 137  # 2 full 64-token chunks + 9 tokens
DECODE = 4  # ids[137..141) one at a time after the 137-token prefill
CONT_SEGMENTS = [100, 7, 73, 1]  # cumulative 100, 107, 180, 181: chunked with initial state


def text_config_keys(cfg: dict) -> dict:
    """Keys as they appear in the released config.json files (HF drops unknown ones otherwise)."""
    return dict(cfg)


def randomize(model: torch.nn.Module, seed: int, tied: bool) -> dict[str, torch.Tensor]:
    """Fill every parameter with seeded random values of a realistic scale.

    Norm weights are randomised (the (1+w) vs w difference must be visible), decay parameters
    span slow and fast heads so that state carried across a 64-token chunk boundary matters.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("linear_attn.norm.weight"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("norm.weight"):  # zero-centred RMSNorms (layer, final, q/k)
            v = rng.uniform(-0.6, 0.6, shape)
        elif name.endswith("A_log"):
            v = rng.uniform(np.log(0.01), np.log(2.0), shape)  # A in [0.01, 2], log-uniform
        elif name.endswith("dt_bias"):
            v = rng.uniform(-2.0, 1.0, shape)
        elif name.endswith("conv1d.weight"):
            v = rng.normal(0.0, 0.5, shape)
        elif name.endswith("embed_tokens.weight"):
            # Tied models use it as the head too: keep logits O(1) so f32 rounding stays ~1e-6.
            v = rng.normal(0.0, 0.15 if tied else 1.0, shape)
        elif name.endswith("lm_head.weight"):
            v = rng.normal(0.0, 1.0 / np.sqrt(shape[1]), shape)
        elif len(shape) == 2:  # Linear [out, in]
            v = rng.normal(0.0, 1.0 / np.sqrt(shape[1]), shape)
        else:
            v = rng.normal(0.0, 0.1, shape)
        with torch.no_grad():
            p.copy_(torch.from_numpy(np.asarray(v, dtype=np.float32)))
        out[name] = p.detach().clone().contiguous()
    return out


def mtp_weights(text_cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """The 15 `mtp.*` tensors of a one-layer MTP head (spec §2.5), seeded random."""
    rng = np.random.default_rng(seed)
    h = text_cfg["hidden_size"]
    i = text_cfg["intermediate_size"]
    hd = text_cfg["head_dim"]
    hq = text_cfg["num_attention_heads"]
    hkv = text_cfg["num_key_value_heads"]

    def lin(o, n):
        return rng.normal(0.0, 1.0 / np.sqrt(n), (o, n))

    def zc(n):
        return rng.uniform(-0.6, 0.6, (n,))

    w = {
        "mtp.fc.weight": lin(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": zc(h),
        "mtp.pre_fc_norm_hidden.weight": zc(h),
        "mtp.norm.weight": zc(h),
        "mtp.layers.0.input_layernorm.weight": zc(h),
        "mtp.layers.0.post_attention_layernorm.weight": zc(h),
        "mtp.layers.0.self_attn.q_proj.weight": lin(2 * hq * hd, h),
        "mtp.layers.0.self_attn.k_proj.weight": lin(hkv * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": lin(hkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": lin(h, hq * hd),
        "mtp.layers.0.self_attn.q_norm.weight": zc(hd),
        "mtp.layers.0.self_attn.k_norm.weight": zc(hd),
        "mtp.layers.0.mlp.gate_proj.weight": lin(i, h),
        "mtp.layers.0.mlp.up_proj.weight": lin(i, h),
        "mtp.layers.0.mlp.down_proj.weight": lin(h, i),
    }
    return {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in w.items()}


def write_sharded(tensors: dict[str, torch.Tensor], out_dir: Path, shards: int) -> None:
    """Split tensors (sorted by name) into `shards` files plus model.safetensors.index.json."""
    names = sorted(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    budget = total / shards
    groups: list[list[str]] = [[]]
    acc = 0
    for n in names:
        size = tensors[n].numel() * tensors[n].element_size()
        if acc >= budget * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(n)
        acc += size
    weight_map = {}
    for k, g in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in g}, out_dir / fname, metadata={"format": "pt"})
        for n in g:
            weight_map[n] = fname
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def build_vlm(out_dir: Path) -> tuple[Qwen3_5ForCausalLM, dict]:
    text_cfg = Qwen3_5TextConfig(**VLM_TEXT)
    lm = Qwen3_5ForCausalLM(text_cfg).eval()
    params = randomize(lm, seed=1234, tied=False)

    vlm_cfg = Qwen3_5Config(
        text_config=text_cfg.to_dict(),
        vision_config=VISION,
        tie_word_embeddings=False,
        image_token_id=tiny_tokenizer.SPECIAL_IDS["<|image_pad|>"],
        video_token_id=tiny_tokenizer.SPECIAL_IDS["<|video_pad|>"],
        vision_start_token_id=tiny_tokenizer.SPECIAL_IDS["<|vision_start|>"],
        vision_end_token_id=tiny_tokenizer.SPECIAL_IDS["<|vision_end|>"],
    )
    vlm_cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    vlm = Qwen3_5ForConditionalGeneration(vlm_cfg).eval()
    vrng = np.random.default_rng(99)
    tensors: dict[str, torch.Tensor] = {}
    for name, p in vlm.named_parameters():
        if name.startswith("model.visual."):
            v = vrng.normal(0.0, 0.05, tuple(p.shape)).astype(np.float32)
            tensors[name] = torch.from_numpy(v)
    for name, t in params.items():
        if name.startswith("model."):
            tensors["model.language_model." + name[len("model.") :]] = t
        else:
            tensors[name] = t
    tensors.update(mtp_weights(VLM_TEXT, seed=4321))

    out_dir.mkdir(parents=True, exist_ok=True)
    vlm_cfg.save_pretrained(out_dir)
    # The released config.json files also carry partial_rotary_factor next to rope_parameters
    # (HF folds it in and drops it on save); keep both places like the real files.
    cfg_path = out_dir / "config.json"
    doc = json.loads(cfg_path.read_text())
    doc["text_config"]["partial_rotary_factor"] = VLM_TEXT["partial_rotary_factor"]
    cfg_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    write_sharded(tensors, out_dir, shards=2)
    return lm, {"class": "Qwen3_5ForConditionalGeneration"}


def build_text(out_dir: Path) -> tuple[Qwen3_5ForCausalLM, dict]:
    text_cfg = Qwen3_5TextConfig(**TEXT)
    text_cfg.architectures = ["Qwen3_5ForCausalLM"]
    lm = Qwen3_5ForCausalLM(text_cfg).eval()
    params = randomize(lm, seed=5678, tied=True)
    # Tied: lm_head.weight is the embedding and is not written (as in Qwen3.5-0.8B).
    tensors = {n: t for n, t in params.items() if n != "lm_head.weight"}
    out_dir.mkdir(parents=True, exist_ok=True)
    text_cfg.save_pretrained(out_dir)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    return lm, {"class": "Qwen3_5ForCausalLM"}


def load_back(out_dir: Path, cls_name: str) -> torch.nn.Module:
    """Reload through transformers: proves the files are a valid HF checkpoint."""
    cls = {"Qwen3_5ForConditionalGeneration": Qwen3_5ForConditionalGeneration, "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM}[
        cls_name
    ]
    return cls.from_pretrained(out_dir, dtype=torch.float32).eval()


@torch.no_grad()
def run_forward(model, ids: list[int], cache):
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, cache=cache, use_cache=cache is not None, output_hidden_states=True)
    logits = out.logits[0].float().numpy()
    hidden = out.hidden_states[-1][0].float().numpy()
    return logits, hidden


def text_cfg_of(model):
    cfg = model.config
    return cfg.text_config if hasattr(cfg, "text_config") and cfg.text_config is not None else cfg


@torch.no_grad()
def scenarios(model, ids: list[int]) -> tuple[dict[str, np.ndarray], dict]:
    cfg = text_cfg_of(model)
    g: dict[str, np.ndarray] = {}
    meta: dict = {}

    # 1. Long prefill, no cache object involved except to read back the states.
    cache = DynamicCache(config=cfg)
    logits, hidden = run_forward(model, ids[:PREFILL], cache)
    g["prefill.logits"] = logits
    g["prefill.hidden"] = hidden
    # Copies: the decode steps below update the cache tensors in place.
    for i, t in enumerate(cfg.layer_types):
        if t == LIN:
            g[f"prefill.state.layer{i}.conv"] = cache.get_conv_state(i, state_idx=0)[0].float().clone().numpy()
            g[f"prefill.state.layer{i}.recurrent"] = cache.get_recurrent_state(i, state_idx=0)[0].float().clone().numpy()
        else:
            layer = cache.layers[i]
            g[f"prefill.state.layer{i}.key"] = layer.keys[0].float().clone().numpy()
            g[f"prefill.state.layer{i}.value"] = layer.values[0].float().clone().numpy()

    # 2. Cached single-token decode (recurrent path), teacher-forced ids.
    rows = []
    hid = []
    for k in range(DECODE):
        lg, hd = run_forward(model, [ids[PREFILL + k]], cache)
        rows.append(lg[0])
        hid.append(hd[0])
    g["decode.logits"] = np.stack(rows)
    g["decode.hidden"] = np.stack(hid)

    # 3. Multi-token continuation: chunked kernel with a carried state (last segment = 1 token).
    cache = DynamicCache(config=cfg)
    start = 0
    segs = []
    for n in CONT_SEGMENTS:
        lg, _ = run_forward(model, ids[start : start + n], cache)
        if start > 0:
            segs.append(lg)
        start += n
    g["continuation.logits"] = np.concatenate(segs, axis=0)

    # Self-consistency: one uncached pass over everything must agree with the cached paths.
    full, full_hidden = run_forward(model, ids[:start], None)
    g["full.logits"] = full
    g["full.hidden"] = full_hidden
    d_prefill = float(np.abs(full[:PREFILL] - g["prefill.logits"]).max())
    d_decode = float(np.abs(full[PREFILL : PREFILL + DECODE] - g["decode.logits"]).max())
    d_cont = float(np.abs(full[CONT_SEGMENTS[0] : start] - g["continuation.logits"]).max())
    meta["self_consistency_max_abs"] = {"prefill": d_prefill, "decode": d_decode, "continuation": d_cont}
    for k, v in meta["self_consistency_max_abs"].items():
        if v > 1e-4:
            raise SystemExit(f"self-consistency {k}: {v} (cached vs uncached HF disagree)")
    return g, meta


def write_goldens(out_dir: Path, name: str, model, ids: list[int], extra: dict) -> None:
    g, meta = scenarios(model, ids)
    # Independent float64 NumPy forward (spec §3, recurrent GDN) over the same ids: the "exact"
    # answer, so a Rust f32 result can be judged against truth as well as against transformers.
    cfg = qwen36_ref.TextConfig.from_json(out_dir / "config.json")
    f64, _ = qwen36_ref.Model(qwen36_ref.load_weights(out_dir), cfg).feed(ids[: int(sum(CONT_SEGMENTS))])
    g["f64.full.logits"] = f64
    # FP8 E4M3 KV cache (k_scale = v_scale = 1.0) on the full-attention layers, same ids.
    f64_fp8, _ = qwen36_ref.Model(qwen36_ref.load_weights(out_dir), cfg, kv_fp8=True).feed(ids[: int(sum(CONT_SEGMENTS))])
    g["f64.fp8kv.full.logits"] = f64_fp8
    meta["fp8kv_effect_max_abs"] = float(np.abs(f64_fp8 - f64).max())
    err = float(np.abs(f64 - g["full.logits"]).max())
    if err > 1e-4:
        raise SystemExit(f"{name}: NumPy float64 reference vs transformers: {err}")
    meta["transformers_vs_numpy_f64_max_abs"] = {
        "full": err,
        "prefill": float(np.abs(f64[:PREFILL] - g["prefill.logits"]).max()),
        "decode": float(np.abs(f64[PREFILL : PREFILL + DECODE] - g["decode.logits"]).max()),
        "continuation": float(np.abs(f64[CONT_SEGMENTS[0] :] - g["continuation.logits"]).max()),
    }
    # The saved states must be the NumPy reference's states after the prefill (layouts in README).
    ref = qwen36_ref.Model(qwen36_ref.load_weights(out_dir), cfg)
    ref.feed(ids[:PREFILL])
    state_err = 0.0
    for i, st in ref.states.items():
        if isinstance(st, qwen36_ref.GdnState):
            state_err = max(state_err, float(np.abs(g[f"prefill.state.layer{i}.conv"][:, 1:] - st.conv.T).max()))
            state_err = max(state_err, float(np.abs(g[f"prefill.state.layer{i}.recurrent"] - st.s).max()))
        else:
            state_err = max(state_err, float(np.abs(g[f"prefill.state.layer{i}.key"] - np.stack(st.k, axis=1)).max()))
            state_err = max(state_err, float(np.abs(g[f"prefill.state.layer{i}.value"] - np.stack(st.v, axis=1)).max()))
    if state_err > 1e-4:
        raise SystemExit(f"{name}: prefill states vs NumPy reference: {state_err}")
    meta["prefill_state_vs_numpy_f64_max_abs"] = state_err
    save_goldens(out_dir, name, g, meta, ids, extra)


def save_goldens(out_dir: Path, name: str, g: dict[str, np.ndarray], meta: dict, ids: list[int], extra: dict) -> None:
    """goldens.safetensors (f32 tensors) + goldens.json (ids, layout, argmax, versions)."""
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in g.items()}
    save_file(tensors, out_dir / "goldens.safetensors", metadata={"format": "goldens"})
    cont_starts = list(np.cumsum([0] + CONT_SEGMENTS[:-1]))
    doc = {
        "checkpoint": name,
        "generator": "scripts/qwen36/make_goldens.py",
        "versions": versions(),
        "token_ids": ids,
        "prefill": {"ids_range": [0, PREFILL], "logits": "prefill.logits", "positions": [0, PREFILL]},
        "decode": {
            "after_prefill_of": PREFILL,
            "ids_range": [PREFILL, PREFILL + DECODE],
            "logits": "decode.logits",
            "note": "one forward call per token with the cache of the prefill; row k = position PREFILL+k",
        },
        "continuation": {
            "segments": [[int(s), int(s + n)] for s, n in zip(cont_starts, CONT_SEGMENTS)],
            "logits": "continuation.logits",
            "logits_positions": [CONT_SEGMENTS[0], int(sum(CONT_SEGMENTS))],
            "note": "fresh cache; each segment is one forward call; logits of all segments but the first, concatenated",
        },
        "full": {"ids_range": [0, int(sum(CONT_SEGMENTS))], "logits": "full.logits", "note": "one uncached pass"}
        if "full.logits" in g
        else None,
        "argmax": {k: np.asarray(g[k]).argmax(-1).tolist() for k in ("prefill.logits", "decode.logits", "continuation.logits")},
        "logits_abs_max": {k: float(np.abs(g[k]).max()) for k in ("prefill.logits", "full.logits") if k in g},
        "logits_std": float(g["full.logits" if "full.logits" in g else "prefill.logits"].std()),
        **meta,
        **extra,
    }
    (out_dir / "goldens.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{name}: {meta}  logits std {doc['logits_std']:.3f}")


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def token_ids(seed: int) -> list[int]:
    """Random ids over the whole vocabulary (byte tokens and special tokens alike)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, SEQ_LEN).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=FIXTURES)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    for name, build, seed, template in (
        ("tiny-vlm", build_vlm, 11, True),
        ("tiny-text", build_text, 22, False),
    ):
        out_dir = args.out / name
        if out_dir.exists():
            shutil.rmtree(out_dir)
        lm, info = build(out_dir)
        tiny_tokenizer.write(out_dir)
        (out_dir / "generation_config.json").write_text(
            json.dumps(
                {
                    "bos_token_id": tiny_tokenizer.ENDOFTEXT_ID,
                    "eos_token_id": [tiny_tokenizer.SPECIAL_IDS["<|im_end|>"], tiny_tokenizer.ENDOFTEXT_ID],
                    "pad_token_id": tiny_tokenizer.ENDOFTEXT_ID,
                    "do_sample": True,
                    "top_k": 20,
                    "top_p": 0.95,
                    "temperature": 1.0,
                },
                indent=2,
            )
            + "\n"
        )
        if template and TEMPLATE.exists():
            shutil.copyfile(TEMPLATE, out_dir / "chat_template.jinja")
        ids = token_ids(seed)
        reloaded = load_back(out_dir, info["class"])
        # The reloaded checkpoint must reproduce the in-memory model exactly.
        with torch.no_grad():
            x = torch.tensor([ids[:PREFILL]])
            a = lm(input_ids=x).logits
            b = reloaded(input_ids=x).logits
        diff = float((a - b).abs().max())
        if diff != 0.0:
            raise SystemExit(f"{name}: reloaded checkpoint differs from the built model by {diff}")
        write_goldens(out_dir, name, reloaded, ids, {"hf_class": info["class"]})
    write_bf16_variant(args.out / "tiny-text", args.out / "tiny-text-bf16", token_ids(22))


def write_bf16_variant(src: Path, dst: Path, ids: list[int]) -> None:
    """tiny-text stored in BF16 (A_log and linear_attn.norm in F32, as the official files).

    Goldens: transformers in f32 on the exactly widened BF16 weights, i.e. what an engine that
    loads BF16 and computes in f32 must reproduce. Only the three logits tensors are kept.
    """
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in ("tokenizer.json", "generation_config.json"):
        shutil.copyfile(src / f, dst / f)
    # The template lives inside tokenizer_config.json here (the older HF convention), so the three
    # text fixtures cover: chat_template.jinja (tiny-vlm), none (tiny-text), this one.
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    if TEMPLATE.exists():
        tok_cfg["chat_template"] = TEMPLATE.read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    cfg = json.loads((src / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tensors = safetensors.torch.load_file(str(src / "model.safetensors"))
    keep_f32 = ("linear_attn.A_log", "linear_attn.norm.weight")
    out = {k: (v if k.endswith(keep_f32) else v.to(torch.bfloat16)).contiguous() for k, v in tensors.items()}
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    model = Qwen3_5ForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    g, meta = scenarios(model, ids)
    g = {k: g[k] for k in ("prefill.logits", "decode.logits", "continuation.logits")}
    save_goldens(dst, "tiny-text-bf16", g, meta, ids, {"hf_class": "Qwen3_5ForCausalLM", "reference": "f32 compute on BF16 weights widened to f32"})


if __name__ == "__main__":
    main()
