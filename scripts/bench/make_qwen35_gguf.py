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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py)")
    ap.add_argument("--quantize", type=Path, required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated llama-quantize types")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bf16 = args.out / "qwen35-0.8b-dims-bf16.gguf"
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
