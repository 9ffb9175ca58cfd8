"""A 288-token byte-level tokenizer for the tiny Qwen3.6 fixtures.

Ids 0..255 are the 256 bytes (GPT-2 byte-to-unicode alphabet, in byte order, no merges), ids
256.. are the Qwen3.5/3.6 special tokens in their real order (real id = tiny id - 256 + 248044),
ids up to VOCAB_SIZE-1 are padding rows with no token (the real vocab is padded too).
The pre-tokenizer is the real Qwen3.5 split regex + ByteLevel and the normaliser is NFC, so a
`tokenizers`-crate loader sees the same structure as the real tokenizer.json; with no merges every
byte is one token, which keeps the fixture servable end to end with any text.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
# Tokens that are "special" (skipped when decoding with skip_special_tokens); the tool/think
# markers are plain added tokens in the real tokenizer_config.json, as here.
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
SPECIAL_IDS = {t: 256 + i for i, t in enumerate(SPECIALS)}
ENDOFTEXT_ID = SPECIAL_IDS["<|endoftext|>"]
VOCAB_SIZE = 288

SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_alphabet() -> list[str]:
    """GPT-2 bytes_to_unicode, listed in byte order 0..255."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {}
    extra = 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def build() -> Tokenizer:
    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_tokens([AddedToken(t, special=t not in NOT_SPECIAL, normalized=False) for t in SPECIALS])
    return tok


def write(out_dir: Path) -> None:
    tok = build()
    for t, i in SPECIAL_IDS.items():
        got = tok.token_to_id(t)
        if got != i:
            raise SystemExit(f"tiny tokenizer: {t} got id {got}, want {i}")
    if tok.encode("hé\n").ids != [104, 195, 169, 10]:
        raise SystemExit("tiny tokenizer: byte ids broken")
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
