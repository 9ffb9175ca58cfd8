#!/usr/bin/env python3
"""A GGUF at Qwen3.5-0.8B's dimensions with random weights, read by llama.cpp and by us, for
side-by-side speed runs (no real weights can be downloaded on the build machines).

1. transformers' initializer on `engine-service/benches/qwen35_0_8b.json` (the text model;
   transformers has no MTP module), saved as an HF checkpoint in BF16, with the tiny-text
   fixture's tokenizer plus one BPE merge (`Ġ Ġ` -> `ĠĠ`, a new token 282): llama.cpp
   refuses a BPE vocabulary without merges, and we refuse a merge whose result is not a
   token, so this one suits both;
2. llama.cpp's own converter (`convert_hf_to_gguf.py --outtype bf16 --no-mtp`, the qwen35
   layout), told that the pre-tokenizer is `qwen35` as make_gguf_fixtures.py does;
3. `llama-quantize` for every type in `--types` (default Q4_K_M), from the BF16 file.

With `--numpy` (no torch on the machine) steps 1-2 are replaced: the BF16 file is written
directly with llama.cpp's gguf-py in the layout its converter gives the tiny-text fixture
(`engine-service/tests/fixtures/qwen36/tiny-text-bf16.gguf`: the same keys, tensor names and
tokenizer, dimensions from the config), seeded numpy values at transformers' scales (matrices
N(0, 0.02), norms near 1, `ssm_a = -U(1, 16)`, `dt_bias = 1`). Only numpy (and pyyaml, which gguf-py imports) is needed:

    python3 -m venv gvenv && gvenv/bin/pip install numpy pyyaml
    gvenv/bin/python scripts/bench/make_qwen35_gguf.py --numpy --llama-cpp LLAMA_CPP_SRC \\
        --quantize LLAMA_CPP_SRC/build/bin/llama-quantize --out /tmp/qwen35-0.8b

    python3 -m venv tvenv && tvenv/bin/pip install torch numpy safetensors transformers \\
        sentencepiece 'protobuf<5' jinja2
    tvenv/bin/python scripts/bench/make_qwen35_gguf.py --llama-cpp LLAMA_CPP_SRC \\
        --quantize LLAMA_CPP_SRC/build/bin/llama-quantize --out /tmp/qwen35-0.8b
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "engine-service" / "benches" / "qwen35_0_8b.json"
TOKENIZER = ROOT / "engine-service" / "tests" / "fixtures" / "qwen36" / "tiny-text"


def checkpoint(dst: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads(CONFIG.read_text())
    model_type = cfg.pop("model_type")
    cfg.pop("mtp_num_hidden_layers", None)
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dst, safe_serialization=True)
    tok = json.loads((TOKENIZER / "tokenizer.json").read_text())
    tok["model"]["vocab"]["ĠĠ"] = 282
    tok["model"]["merges"] = [["Ġ", "Ġ"]]
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    shutil.copy(TOKENIZER / "tokenizer_config.json", dst / "tokenizer_config.json")


FIXTURE = ROOT / "engine-service" / "tests" / "fixtures" / "qwen36" / "tiny-text-bf16.gguf"


def write_numpy(dst: Path) -> None:
    """The BF16 GGUF of `CONFIG` without torch (see the module docs)."""
    import numpy as np
    import gguf

    cfg = json.loads(CONFIG.read_text())
    h, n_layers, ffn = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, kconv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    vocab, interval = cfg["vocab_size"], cfg["full_attention_interval"]
    rope = cfg["rope_parameters"]
    rot = int(hd * rope["partial_rotary_factor"])
    inner, conv_dim = hv * dv, 2 * hk * dk + hv * dv
    recurrent = [(i + 1) % interval != 0 for i in range(n_layers)]

    src = gguf.GGUFReader(FIXTURE)
    arch = "qwen35"
    w = gguf.GGUFWriter(dst, arch)
    dims = {
        f"{arch}.block_count": n_layers,
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": h,
        f"{arch}.feed_forward_length": ffn,
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.rope.dimension_count": rot,
        f"{arch}.rope.dimension_sections": [11, 11, 10, 0],
        f"{arch}.rope.freq_base": float(rope["rope_theta"]),
        f"{arch}.ssm.conv_kernel": kconv,
        f"{arch}.ssm.state_size": dk,
        f"{arch}.ssm.group_count": hk,
        f"{arch}.ssm.time_step_rank": hv,
        f"{arch}.ssm.inner_size": inner,
        f"{arch}.attention.recurrent_layers": recurrent,
        f"{arch}.full_attention_interval": interval,
        "general.name": "Qwen3.5 0.8B dimensions, random",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_BF16),
    }
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.size_label"}
    tokens_key, types_key = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"
    for key, field in src.fields.items():
        if key in skip or key in dims or key in (tokens_key, types_key):
            continue
        value, vtype = field.contents(), field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    for key, value in dims.items():
        if isinstance(value, list):
            sub = gguf.GGUFValueType.BOOL if isinstance(value[0], bool) else gguf.GGUFValueType.INT32
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=sub)
        elif isinstance(value, float):
            w.add_key_value(key, value, gguf.GGUFValueType.FLOAT32)
        elif isinstance(value, str):
            w.add_key_value(key, value, gguf.GGUFValueType.STRING)
        else:
            w.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    # The fixture's tokens padded to the vocabulary; one merge (llama.cpp refuses BPE without
    # merges, we refuse a merge whose result is not a token).
    tokens = list(src.fields[tokens_key].contents())
    types = list(src.fields[types_key].contents())
    tokens[282], types[282] = "ĠĠ", int(gguf.TokenType.NORMAL)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    types += [int(gguf.TokenType.UNUSED)] * (vocab - len(types))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ Ġ"])

    rng = np.random.default_rng(0)

    def matrix(name: str, rows: int, cols: int) -> None:
        # numpy shape [rows][cols]: GGUF's [cols, rows], the converter's orientation
        v = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
        w.add_tensor(name, gguf.quants.quantize(v, gguf.GGMLQuantizationType.BF16), raw_dtype=gguf.GGMLQuantizationType.BF16)

    def vector(name: str, v: "np.ndarray") -> None:
        w.add_tensor(name, v.astype(np.float32))

    def norm(name: str, n: int) -> None:
        vector(name, 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))

    matrix("token_embd.weight", vocab, h)
    for i in range(n_layers):
        b = f"blk.{i}"
        norm(f"{b}.attn_norm.weight", h)
        norm(f"{b}.post_attention_norm.weight", h)
        matrix(f"{b}.ffn_gate.weight", ffn, h)
        matrix(f"{b}.ffn_up.weight", ffn, h)
        matrix(f"{b}.ffn_down.weight", h, ffn)
        if recurrent[i]:
            vector(f"{b}.ssm_a", -rng.uniform(1.0, 16.0, hv))
            vector(f"{b}.ssm_conv1d.weight", 0.2 * rng.standard_normal((conv_dim, kconv)))
            vector(f"{b}.ssm_dt.bias", np.ones(hv))
            matrix(f"{b}.ssm_alpha.weight", hv, h)
            matrix(f"{b}.ssm_beta.weight", hv, h)
            matrix(f"{b}.attn_qkv.weight", conv_dim, h)
            matrix(f"{b}.attn_gate.weight", inner, h)
            norm(f"{b}.ssm_norm.weight", dv)
            matrix(f"{b}.ssm_out.weight", h, inner)
        else:
            norm(f"{b}.attn_q_norm.weight", hd)
            norm(f"{b}.attn_k_norm.weight", hd)
            matrix(f"{b}.attn_q.weight", 2 * heads * hd, h)
            matrix(f"{b}.attn_k.weight", kv * hd, h)
            matrix(f"{b}.attn_v.weight", kv * hd, h)
            matrix(f"{b}.attn_output.weight", h, heads * hd)
    norm("output_norm.weight", h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py)")
    ap.add_argument("--quantize", type=Path, required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated llama-quantize types")
    ap.add_argument("--numpy", action="store_true", help="write the BF16 file with gguf-py (no torch)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bf16 = args.out / "qwen35-0.8b-dims-bf16.gguf"
    if args.numpy:
        sys.path.insert(0, str(args.llama_cpp.resolve() / "gguf-py"))
        write_numpy(bf16)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp) / "ckpt"
            checkpoint(ckpt)
            root = args.llama_cpp.resolve()
            sys.path.insert(0, str(root))
            sys.path.insert(1, str(root / "gguf-py"))
            import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter module)
            from conversion.base import TextModel  # noqa: E402

            TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
            sys.argv = ["convert_hf_to_gguf.py", str(ckpt), "--outtype", "bf16", "--no-mtp", "--outfile", str(bf16)]
            convert_hf_to_gguf.main()
    for t in filter(None, args.types.split(",")):
        out = args.out / f"qwen35-0.8b-dims-{t.lower()}.gguf"
        subprocess.run([str(args.quantize), str(bf16), str(out), t], check=True)
        print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
