"""Reference data for the K-quant kernels (engine-cpu/src/kernels/kquant.rs):
random Q4_K / Q5_K / Q6_K super-blocks (sane f16 scales) and their values as dequantized by
the `gguf` Python package (llama.cpp's gguf-py, `gguf.quants.dequantize`).

    pip install gguf numpy
    python3 scripts/reference/make_kquant_reference.py engine-cpu/tests/fixtures/kquant

Writes `<type>.bin` (the matrix bytes, ROWS x COLS) and `<type>.f32` (little-endian f32 values).
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROWS, COLS = 3, 512
BLOCK_BYTES = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def random_blocks(rng, qtype):
    bb = BLOCK_BYTES[qtype]
    blocks = rng.integers(0, 256, size=(ROWS * COLS // 256, bb), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, size=blocks.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype == T.Q6_K:
        blocks[:, 208:210] = d
    else:
        dmin = rng.uniform(0.001, 0.05, size=blocks.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, 0:2] = d
        blocks[:, 2:4] = dmin
    return blocks.reshape(ROWS, -1)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        data = random_blocks(rng, qtype)
        values = dequantize(data, qtype).astype("<f4")
        assert values.shape == (ROWS, COLS), values.shape
        (out / f"{qtype.name}.bin").write_bytes(data.tobytes())
        (out / f"{qtype.name}.f32").write_bytes(values.tobytes())
        print(qtype.name, data.nbytes, "bytes")


if __name__ == "__main__":
    main()
