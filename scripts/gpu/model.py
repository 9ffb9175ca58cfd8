#!/usr/bin/env python3
"""A stand-in for the default model on the GPU machine, where the model file cannot travel
(it is larger than everything a device call may carry) and nothing can be downloaded.

    model.py skeleton SRC.gguf OUT_DIR --layers 4   # here: metadata + tensor list (small)
    model.py fill OUT_DIR model.gguf --seed 0       # there: random weights, same formats
    model.py llama OUT_DIR model.gguf --type Q4_0   # there: Llama-3-8B dimensions (flags)

`skeleton` keeps every metadata key of SRC (tokenizer, chat template, hyperparameters; the
block count set to --layers) and lists the tensors of the first --layers blocks with their
GGML types and shapes. `fill` writes a GGUF with that metadata and seeded random weights in
those formats (block scales chosen so activations stay in range). `llama` writes a model of
other dimensions (default Llama-3-8B's) in one weight format with the skeleton's tokenizer,
for speed measurements at real sizes. Needs `gguf` and numpy.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def skeleton(src: str, out_dir: str, layers: int) -> None:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out / "skeleton.gguf"), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = layers if name == f"{arch}.block_count" else field.contents()
        w.add_key_value(name, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensors = []
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= layers:
            continue
        tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape]})
    (out / "tensors.json").write_text(json.dumps({"arch": arch, "tensors": tensors}))
    print(f"{out}: metadata of {src}, {len(tensors)} tensors of {layers} blocks", file=sys.stderr)


def random_tensor(rng: np.random.Generator, ttype: str, shape: list, name: str) -> tuple:
    """(array, raw_dtype) for GGUFWriter.add_tensor; shape is GGUF order (ne0 first)."""
    cols, rows = shape[0], int(np.prod(shape[1:]))
    if ttype == "F32":
        base = 1.0 if name.endswith("norm.weight") else 0.0
        return (base + rng.normal(0, 0.02, (rows, cols))).astype(np.float32).reshape(list(reversed(shape))), None
    if ttype == "F16":
        return rng.normal(0, 0.02, (rows, cols)).astype(np.float16).reshape(list(reversed(shape))), None
    blocks = rows * cols // 32
    if ttype == "Q8_0":
        d = np.full((blocks, 1), 0.0005, np.float16).view(np.uint8)
        qs = rng.integers(-127, 128, (blocks, 32), dtype=np.int8).view(np.uint8)
        data = np.concatenate([d, qs], axis=1)
    elif ttype == "Q4_0":
        d = np.full((blocks, 1), 0.004, np.float16).view(np.uint8)
        data = np.concatenate([d, rng.integers(0, 256, (blocks, 16), dtype=np.uint8)], axis=1)
    elif ttype == "Q4_1":
        d = np.full((blocks, 1), 0.004, np.float16).view(np.uint8)
        m = np.full((blocks, 1), -0.03, np.float16).view(np.uint8)
        data = np.concatenate([d, m, rng.integers(0, 256, (blocks, 16), dtype=np.uint8)], axis=1)
    else:
        raise SystemExit(f"{name}: no generator for {ttype}")
    return data.reshape(rows, -1), Q[ttype]


def fill(dir_: str, dst: str, seed: int) -> None:
    d = Path(dir_)
    meta = json.loads((d / "tensors.json").read_text())
    r = gguf.GGUFReader(str(d / "skeleton.gguf"))
    w = gguf.GGUFWriter(dst, meta["arch"])
    copy_fields(r, w, {})
    rng = np.random.default_rng(seed)
    for t in meta["tensors"]:
        data, raw = random_tensor(rng, t["type"], t["shape"], t["name"])
        if raw is None:
            w.add_tensor(t["name"], data)
        else:
            w.add_tensor(t["name"], data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: {len(meta['tensors'])} tensors of random weights (seed {seed})", file=sys.stderr)


def copy_fields(r: "gguf.GGUFReader", w: "gguf.GGUFWriter", overrides: dict) -> None:
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = overrides.pop(name, field.contents())
        w.add_key_value(name, value, vtype, sub_type=sub)


def llama(dir_: str, dst: str, a: argparse.Namespace) -> None:
    r = gguf.GGUFReader(str(Path(dir_) / "skeleton.gguf"))
    hd = a.hidden // a.heads
    kv = a.kv_heads * hd
    overrides = {
        "llama.block_count": a.layers,
        "llama.embedding_length": a.hidden,
        "llama.feed_forward_length": a.ffn,
        "llama.attention.head_count": a.heads,
        "llama.attention.head_count_kv": a.kv_heads,
        "llama.vocab_size": a.vocab,
        "llama.rope.dimension_count": hd,
        "general.name": f"random llama {a.layers}x{a.hidden} {a.type}",
    }
    w = gguf.GGUFWriter(dst, "llama")
    copy_fields(r, w, overrides)
    rng = np.random.default_rng(a.seed)
    shapes = [("token_embd.weight", a.type, [a.hidden, a.vocab]), ("output_norm.weight", "F32", [a.hidden]),
              ("output.weight", a.type, [a.hidden, a.vocab])]
    for i in range(a.layers):
        b = f"blk.{i}."
        shapes += [(b + "attn_norm.weight", "F32", [a.hidden]), (b + "attn_q.weight", a.type, [a.hidden, a.hidden]),
                   (b + "attn_k.weight", a.type, [a.hidden, kv]), (b + "attn_v.weight", a.type, [a.hidden, kv]),
                   (b + "attn_output.weight", a.type, [a.hidden, a.hidden]), (b + "ffn_norm.weight", "F32", [a.hidden]),
                   (b + "ffn_gate.weight", a.type, [a.hidden, a.ffn]), (b + "ffn_up.weight", a.type, [a.hidden, a.ffn]),
                   (b + "ffn_down.weight", a.type, [a.ffn, a.hidden])]
    for name, ttype, shape in shapes:
        data, raw = random_tensor(rng, ttype, shape, name)
        w.add_tensor(name, data, raw_dtype=raw) if raw is not None else w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: llama {a.layers} layers x {a.hidden}, {a.type}, random weights", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton")
    s.add_argument("src")
    s.add_argument("out_dir")
    s.add_argument("--layers", type=int, required=True)
    f = sub.add_parser("fill")
    f.add_argument("dir")
    f.add_argument("dst")
    f.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("llama")
    m.add_argument("dir")
    m.add_argument("dst")
    m.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q4_1", "Q8_0", "F16"])
    m.add_argument("--layers", type=int, default=32)
    m.add_argument("--hidden", type=int, default=4096)
    m.add_argument("--heads", type=int, default=32)
    m.add_argument("--kv-heads", type=int, default=8)
    m.add_argument("--ffn", type=int, default=14336)
    m.add_argument("--vocab", type=int, default=128256)
    m.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "skeleton":
        skeleton(a.src, a.out_dir, a.layers)
    elif a.cmd == "fill":
        fill(a.dir, a.dst, a.seed)
    else:
        llama(a.dir, a.dst, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
