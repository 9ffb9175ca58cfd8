#!/usr/bin/env python3
"""Regenerates the qwen35 GGUF test fixtures with llama.cpp's own converter.

The converter is llama.cpp's `convert_hf_to_gguf.py` (plus its `conversion/` package and
`gguf-py/`), as vendored in the PyPI sdist of llama-cpp-python:

    python3 -m venv .venv-gguf
    .venv-gguf/bin/pip install torch numpy safetensors transformers sentencepiece 'protobuf<5' jinja2
    .venv-gguf/bin/pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # or take the sdist
    tar xzf llama_cpp_python-0.3.36.tar.gz
    .venv-gguf/bin/python scripts/qwen36/make_gguf_fixtures.py \
        --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp

One deviation from running the converter on a real checkpoint: the tiny fixtures' tokenizer
is a 256-byte cut of the Qwen3.5 one (same split regex, no merges), so its fingerprint is not
in the converter's table of known pre-tokenizers; we tell the converter it is `qwen35`,
which is what it writes for the real Qwen3.5/3.6 tokenizer. Everything else (tensor names,
transforms, metadata, vocabulary, chat template) is the converter's unchanged output.
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "engine-service" / "tests" / "fixtures" / "qwen36"

# (source checkpoint, output file, converter flags). tiny-text has no MTP module: the
# converter then needs --no-mtp (it asserts an MTP block otherwise).
OUTPUTS = [
    ("tiny-vlm", "tiny-vlm-f32.gguf", ["--outtype", "f32"]),
    ("tiny-vlm", "tiny-vlm-q8_0.gguf", ["--outtype", "q8_0"]),
    # Full-attention q/k/v fused into one attn_qkv per layer (an opt-in converter layout).
    ("tiny-vlm", "tiny-vlm-q8_0-fused-qkv.gguf", ["--outtype", "q8_0", "--fuse-qkv"]),
    ("tiny-text", "tiny-text-f32.gguf", ["--outtype", "f32", "--no-mtp"]),
    ("tiny-text-bf16", "tiny-text-bf16.gguf", ["--outtype", "bf16", "--no-mtp"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (with convert_hf_to_gguf.py)")
    args = ap.parse_args()
    root = args.llama_cpp.resolve()
    sys.path.insert(0, str(root))
    sys.path.insert(1, str(root / "gguf-py"))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter module)
    from conversion.base import TextModel  # noqa: E402

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"

    for src, out, flags in OUTPUTS:
        with tempfile.TemporaryDirectory() as tmp:
            # The converter reads every file of the directory; copy only the checkpoint's own
            # (not the goldens) so it sees what a downloaded model has.
            model_dir = Path(tmp) / src
            model_dir.mkdir()
            for f in (FIXTURES / src).iterdir():
                if not f.name.startswith(("goldens", "mtp_goldens")):
                    shutil.copy(f, model_dir / f.name)
            sys.argv = ["convert_hf_to_gguf.py", str(model_dir), *flags, "--outfile", str(FIXTURES / out)]
            convert_hf_to_gguf.main()
        print(f"wrote {FIXTURES / out} ({(FIXTURES / out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
