#!/usr/bin/env python3
"""NVFP4 (NVIDIA ModelOpt layout) export of the tiny-vlm fixture, plus dequantized-reference goldens.

Run by hand after make_goldens.py (same venv and versions, see make_goldens.py):

    /work/tmp_py/golden/bin/python scripts/qwen36/quantize_nvfp4.py

Reads engine-service/tests/fixtures/qwen36/tiny-vlm/ and writes .../tiny-vlm-nvfp4/. Format
(spec §8, ModelOpt `NVFP4QTensor` semantics, re-implemented here in torch):

  * the f32 master weights are first rounded to BF16 (the released checkpoints are BF16);
  * quantized Linears (`in_proj_qkv`, `in_proj_z`, `out_proj`, `q/k/v/o_proj`, `gate/up/down_proj`
    of the language model) are stored as
      <lin>.weight         uint8          [out, in/2]  E2M1 codes, element 2i low nibble, 2i+1 high
      <lin>.weight_scale   float8_e4m3fn  [out, in/16] block scale = e4m3(max(amax_blk/(6·s2), 2^-9))
      <lin>.weight_scale_2 float32        []           s2 = amax(W)/(6·448)
      <lin>.input_scale    float32        []           amax(x)/(6·448), calibrated on the golden prompt
    codes = nearest E2M1 value of W/(scale·s2) with ModelOpt's tie rule (0.75, 1.75, 2.5 round up;
    0.25, 1.25, 3.5, 5 round down), |·| > 5 -> 6; dequant W = e2m1(code)·f32(scale)·s2;
  * kept unquantized, as BF16: embed_tokens, lm_head, every norm except linear_attn.norm,
    conv1d, dt_bias, in_proj_a, in_proj_b, all mtp.*, all model.visual.*; kept as F32 like the
    official checkpoint: linear_attn.A_log and linear_attn.norm.weight;
  * FP8 KV cache scales of the full-attention layer: <attn>.k_proj.k_scale / v_proj.v_scale = 1.0
    (ModelOpt exports max(amax/448, 1));
  * hf_quant_config.json and config.json `quantization_config` as ModelOpt writes them.

Goldens (tiny-vlm-nvfp4/goldens.*): the same scenarios as tiny-vlm, computed by transformers in f32
on the DEQUANTIZED weights (W4A16 reference, f32 activations, f32 KV), plus `w4a4.full.logits`
(activations fake-quantized to NVFP4 with input_scale, as vLLM's W4A4 path does) and
kernel_goldens.safetensors for unit tests of an FP4 dot-product kernel.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as mg  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

SRC = mg.FIXTURES / "tiny-vlm"
DST = mg.FIXTURES / "tiny-vlm-nvfp4"
LM = "model.language_model."
BLOCK = 16
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)
E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)

QUANTIZED_SUFFIXES = (
    "linear_attn.in_proj_qkv",
    "linear_attn.in_proj_z",
    "linear_attn.out_proj",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# As written to hf_quant_config.json: fnmatch patterns of Linear modules left unquantized.
EXCLUDE = [
    "lm_head",
    "model.visual*",
    "mtp*",
    "model.language_model.layers.*.linear_attn.in_proj_a",
    "model.language_model.layers.*.linear_attn.in_proj_b",
]
KEEP_F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


def is_quantized(module: str) -> bool:
    if not module.startswith(LM + "layers."):
        return False
    if any(fnmatch.fnmatch(module, p) for p in EXCLUDE):
        return False
    return module.endswith(QUANTIZED_SUFFIXES)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """ModelOpt _cast_fp4: sign bit 3, magnitude index by the midpoint table, ties per its rule."""
    sign = (x < 0).to(torch.uint8)
    mag = x.abs()
    idx = torch.searchsorted(E2M1_BOUNDS, mag.contiguous(), out_int32=True).to(torch.uint8)
    odd = E2M1_BOUNDS[[1, 3, 5]]
    tie_up = (mag.unsqueeze(-1) == odd).any(-1).to(torch.uint8)
    return (sign << 3) + idx + tie_up


def quantize(w: torch.Tensor, global_scale: torch.Tensor | None = None):
    """Returns (packed uint8 [o, i/2], e4m3 scale [o, i/16], f32 scalar s2, dequantized f32)."""
    w = w.float()
    o, i = w.shape
    if i % BLOCK:
        raise SystemExit(f"in_features {i} is not a multiple of {BLOCK}")
    s2 = (w.abs().amax() / (6.0 * 448.0)).float() if global_scale is None else global_scale.float()
    blocks = w.view(o, i // BLOCK, BLOCK)
    blk = blocks.abs().amax(-1) / (6.0 * s2)
    blk[blk == 0] = 1.0
    # Saturate like ModelOpt's static path / the CUDA cvt (an activation can exceed its calibrated amax).
    scale = blk.clamp(min=2.0**-9, max=448.0).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.float() * s2).unsqueeze(-1)
    codes = e2m1_codes(scaled.view(o, i))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    deq = dequantize(packed, scale, s2)
    return packed.contiguous(), scale.contiguous(), s2.reshape(()), deq


def dequantize(packed: torch.Tensor, scale: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    o = packed.shape[0]
    codes = torch.empty((o, packed.shape[1] * 2), dtype=torch.long)
    codes[:, 0::2] = (packed & 0x0F).long()
    codes[:, 1::2] = (packed >> 4).long()
    vals = E2M1_VALUES[codes].view(o, -1, BLOCK)
    return (vals * (scale.float() * s2).unsqueeze(-1)).reshape(o, -1)


def fake_quant_activation(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 activation quant-dequant along the last dim with the static global input_scale."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    _, _, _, deq = quantize(flat, global_scale=input_scale)
    return deq.reshape(shape)


def text_model(weights: dict[str, torch.Tensor]) -> Qwen3_5ForCausalLM:
    """An f32 transformers text model holding the given (language-model) weights."""
    lm = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**mg.VLM_TEXT)).eval()
    sd = {}
    for k, v in weights.items():
        if k.startswith(LM):
            sd["model." + k[len(LM) :]] = v.float()
        elif k == "lm_head.weight":
            sd[k] = v.float()
    missing, unexpected = lm.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    return lm


def calibrate(lm: Qwen3_5ForCausalLM, ids: list[int]) -> dict[str, float]:
    """amax of the input of every quantized Linear over one pass of the golden prompt."""
    amax: dict[str, float] = {}
    hooks = []
    for name, mod in lm.named_modules():
        full = LM + name[len("model.") :] if name.startswith("model.") else name
        if isinstance(mod, torch.nn.Linear) and is_quantized(full):

            def hook(_m, inp, full=full):
                amax[full] = max(amax.get(full, 0.0), float(inp[0].abs().max()))

            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        lm(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return amax


def e4m3_to_f32(b: np.ndarray) -> np.ndarray:
    """Decode float8_e4m3fn bytes by hand (bias 7, no infinities, 0x7F/0xFF = NaN)."""
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    val = np.where((exp == 15) & (man == 7), np.nan, val)
    return sign * val


def verify_from_file(ids: list[int], golden_logits: np.ndarray) -> float:
    """Independent check: decode the written file with NumPy only and run qwen36_ref on it."""
    from safetensors import safe_open

    import qwen36_ref as R

    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    raw = {}
    with safe_open(str(DST / "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            raw[k] = t.view(torch.uint8).numpy() if t.dtype == torch.float8_e4m3fn else t.float().numpy()
            if t.dtype == torch.uint8:
                raw[k] = t.numpy()
    w = {}
    for k, v in raw.items():
        if k.startswith("model.visual.") or k.endswith(("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")):
            continue
        module = k[: -len(".weight")] if k.endswith(".weight") else None
        if module is not None and module + ".weight_scale" in raw:
            codes = np.empty((v.shape[0], v.shape[1] * 2), dtype=np.int64)
            codes[:, 0::2] = v & 0x0F
            codes[:, 1::2] = v >> 4
            scale = e4m3_to_f32(raw[module + ".weight_scale"])
            s2 = float(raw[module + ".weight_scale_2"])
            v = e2m1[codes] * np.repeat(scale, BLOCK, axis=1) * s2
        name = k[len(LM) :] if k.startswith(LM) else k
        w[name] = np.asarray(v, dtype=np.float64)
    cfg = R.TextConfig.from_json(DST / "config.json")
    n = golden_logits.shape[0]
    logits, _ = R.Model(w, cfg).feed(ids[:n])
    return float(np.abs(logits - golden_logits).max())


def main() -> None:
    torch.set_num_threads(2)
    src: dict[str, torch.Tensor] = {}
    index = json.loads((SRC / "model.safetensors.index.json").read_text())
    for f in sorted(set(index["weight_map"].values())):
        src.update(load_file(str(SRC / f)))
    meta = json.loads((SRC / "goldens.json").read_text())
    ids = meta["token_ids"]

    bf16 = {k: v.to(torch.bfloat16) for k, v in src.items()}
    ref_bf16 = text_model(bf16)
    amax = calibrate(ref_bf16, ids[: sum(mg.CONT_SEGMENTS)])

    out: dict[str, torch.Tensor] = {}
    deq_weights: dict[str, torch.Tensor] = {}
    input_scales: dict[str, torch.Tensor] = {}
    kernel: dict[str, torch.Tensor] = {}
    quantized_modules = []
    for name in sorted(src):
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and is_quantized(module):
            packed, scale, s2, deq = quantize(bf16[name])
            out[name] = packed
            out[module + ".weight_scale"] = scale
            out[module + ".weight_scale_2"] = s2
            isc = torch.tensor(amax[module] / (6.0 * 448.0), dtype=torch.float32)
            out[module + ".input_scale"] = isc
            deq_weights[name] = deq
            input_scales[module] = isc
            quantized_modules.append(module)
        elif name.endswith(KEEP_F32_SUFFIXES):
            out[name] = src[name].float().contiguous()
            deq_weights[name] = src[name].float()
        else:
            out[name] = bf16[name].contiguous()
            deq_weights[name] = bf16[name].float()
    for li, t in enumerate(mg.VLM_TEXT["layer_types"]):
        if t == mg.FULL:
            p = f"{LM}layers.{li}.self_attn."
            out[p + "k_proj.k_scale"] = torch.tensor(1.0, dtype=torch.float32)
            out[p + "v_proj.v_scale"] = torch.tensor(1.0, dtype=torch.float32)

    if DST.exists():
        shutil.rmtree(DST)
    DST.mkdir(parents=True)
    save_file(out, str(DST / "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(SRC / f, DST / f)

    producer = {"name": "modelopt", "version": "0.37.0"}
    hf_quant = {
        "producer": producer,
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": BLOCK, "exclude_modules": EXCLUDE},
    }
    (DST / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4) + "\n")
    cfg = json.loads((SRC / "config.json").read_text())
    cfg["quantization_config"] = {
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK},
                "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK},
                "targets": ["Linear"],
            }
        },
        "ignore": EXCLUDE,
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "producer": producer,
        "quant_method": "modelopt",
    }
    (DST / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # W4A16 reference: transformers f32 on the dequantized weights, same scenarios as tiny-vlm.
    ref = text_model(deq_weights)
    g, sc = mg.scenarios(ref, ids)

    # W4A4 emulation: every quantized Linear sees NVFP4 fake-quantized activations.
    hooks = []
    for name, mod in ref.named_modules():
        full = LM + name[len("model.") :] if name.startswith("model.") else name
        if full in input_scales:
            hooks.append(mod.register_forward_pre_hook(lambda _m, inp, s=input_scales[full]: (fake_quant_activation(inp[0], s),)))
    with torch.no_grad():
        w4a4 = ref(input_ids=torch.tensor([ids[: sum(mg.CONT_SEGMENTS)]])).logits[0].numpy()
    for h in hooks:
        h.remove()
    g["w4a4.full.logits"] = w4a4

    # Kernel goldens: y = x · W_deqᵀ for two shapes; x mixes blocks of very different magnitude
    # (so the per-16 scales differ) and stays within the calibrated amax (no saturation).
    rng = np.random.default_rng(7)
    for module in (f"{LM}layers.0.mlp.down_proj", f"{LM}layers.3.self_attn.q_proj"):
        w = deq_weights[module + ".weight"]
        mag = np.repeat(rng.choice([0.001, 0.05, 1.0], (3, w.shape[1] // BLOCK)), BLOCK, axis=1)
        xr = rng.normal(0, 1, (3, w.shape[1])) * mag
        xr *= 0.9 * amax[module] / np.abs(xr).max()
        x = torch.from_numpy(xr.astype(np.float32))
        xq = fake_quant_activation(x, input_scales[module])
        kernel[module + ".x"] = x
        kernel[module + ".weight_dequant"] = w
        kernel[module + ".y_w4a16"] = (x.double() @ w.double().T).float()
        kernel[module + ".x_fp4_dequant"] = xq
        kernel[module + ".y_w4a4"] = (xq.double() @ w.double().T).float()
    save_file({k: v.contiguous() for k, v in kernel.items()}, str(DST / "kernel_goldens.safetensors"))

    numpy_err = verify_from_file(ids, g["prefill.logits"])
    if numpy_err > 1e-4:
        raise SystemExit(f"NumPy decode of the written checkpoint vs W4A16 goldens: {numpy_err}")

    base = load_file(str(SRC / "goldens.safetensors"))
    qerr = float(np.abs(g["full.logits"] - base["full.logits"].numpy()).max())
    w4a4_err = float(np.abs(w4a4 - g["full.logits"]).max())
    argmax_agree = float((g["full.logits"].argmax(-1) == base["full.logits"].numpy().argmax(-1)).mean())
    mg.save_goldens(
        DST,
        "tiny-vlm-nvfp4",
        g,
        sc,
        ids,
        {
            "generator": "scripts/qwen36/quantize_nvfp4.py",
            "reference": "W4A16: transformers f32 on dequantized weights (bf16 for unquantized tensors, f32 A_log/linear_attn.norm), f32 activations and KV",
            "quantized_modules": quantized_modules,
            "quantization_error_vs_f32_tiny_vlm_full_logits_max_abs": qerr,
            "argmax_agreement_vs_f32_tiny_vlm": argmax_agree,
            "w4a4_vs_w4a16_full_logits_max_abs": w4a4_err,
            "numpy_file_decode_vs_goldens_prefill_max_abs": numpy_err,
        },
    )
    print(f"nvfp4: numpy decode of the file vs goldens {numpy_err:.2e}; {len(quantized_modules)} quantized linears; vs f32 model max|dlogit| {qerr:.3f}, argmax agree {argmax_agree:.2f}; w4a4 vs w4a16 {w4a4_err:.3f}")


if __name__ == "__main__":
    main()
