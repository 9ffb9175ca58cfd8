#!/usr/bin/env python3
"""Writes engine-service/tests/fixtures/smollm2_reference.json from an independent
implementation (llama.cpp through llama-cpp-python) run on the same GGUF the engine loads.

Run by hand, not in CI (building llama-cpp-python takes minutes):

    python3 -m venv /tmp/ref && . /tmp/ref/bin/activate
    pip install cmake ninja jinja2 numpy
    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python
    deploy/fetch-model.sh
    python3 scripts/reference/make_smollm2_reference.py

What it records, for the engine's fidelity and tokenizer tests:
- for each fixed chat: the prompt rendered with the model's own chat template
  (`tokenizer.chat_template`, jinja2 defaults, `add_generation_prompt=True`; the gateway
  renders the same template with minijinja and the same inputs), its token ids (special
  tokens parsed, no BOS: the GGUF says add_bos_token=false), the first-step logits (top 64
  ids/values and the full-vocabulary argmax) and up to 32 greedy tokens (argmax, lowest id on
  ties; generation stops after the EOS token `tokenizer.ggml.eos_token_id`, which is
  included), and at each greedy step llama.cpp's top-2 gap and its 8 best ids/logits (the
  fidelity test uses the gap to tell near-ties, where two correct implementations with
  different activation rounding may pick different tokens, from clear choices);
- a tokenizer corpus (unicode, CJK, emoji, code, whitespace runs, digits) with llama.cpp's ids.
"""
import hashlib
import json
import os
import sys

import jinja2
import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "engine-service", "tests", "fixtures", "smollm2_reference.json")
GREEDY_TOKENS = 32
TOP_LOGITS = 64
STEP_TOP = 8

CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in two sentences."}],
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [
        {"role": "system", "content": "You are a terse assistant that answers in lists."},
        {"role": "user", "content": "List three primary colors and one fact about each."},
    ],
    [{"role": "user", "content": "Translate to French: The weather is nice today, let's go for a walk."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a fun fact about octopuses."},
    ],
]

# Five more chats where llama.cpp itself is decisive: screened from 20 short factual/listing
# candidates by llama.cpp's smallest top-2 logit gap along its greedy path (>= 0.25, the five
# largest). Where the reference has no near-tie, any correct implementation must produce the
# same greedy tokens, so the fidelity test requires these to be identical (32 tokens or to EOS).
DECISIVE_CHATS = [
    [{"role": "user", "content": "What is the capital of Germany? Answer in one sentence."}],
    [{"role": "user", "content": "What is the capital of Italy? Answer in two sentences."}],
    [{"role": "user", "content": "Write the numbers from 1 to 20 separated by commas."}],
    [{"role": "user", "content": "List the months of the year, one per line."}],
    [{"role": "user", "content": "What is 2+2? Answer with just the number."}],
]
CHATS = CHATS + DECISIVE_CHATS

CORPUS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "\n\n\tTabs\tand\nnewlines\r\n\r\n",
    "1234567890 3.14159 -42 1e10 ½ ² ٣٤ 2024-05-17",
    "日本語のテキストと中文字符，还有한국어.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "def foo(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    'fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }',
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé àccents ñ ß ø œ — “quotes” ‘single’ … €100",
    "    \n    \n\n\n     x",
    "don't can't I'm we'll they've it's O'Reilly's DON'T",
    "URL: https://example.com/path?query=1&b=2#frag",
    "Mixed123abc456 and 1,000,000.00",
    "",
    " ",
    "a\u00a0b\u2009c\u3000d",
    "ZWJ\u200d and combining e\u0301",
    "مرحبا بالعالم नमस्ते दुनिया Привет, мир!",
    "a" * 47,
    "!!!???...,,,;;;:::",
    '{"name": "tool", "arguments": {"a": [1, 2, 3], "b": null}}',
    "\t\t\t\n\t \t",
    "x\n\n\n\n\ny  \t  z",
]


def render(template: str, messages) -> str:
    env = jinja2.Environment()
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def last_logits(llm: Llama, n_vocab: int) -> np.ndarray:
    # Without logits_all only the last row is computed; llama-cpp-python no longer copies it
    # into `scores`, so read it from the context.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float32).copy()


def main() -> int:
    if not os.path.exists(MODEL):
        print(f"missing {MODEL}: run deploy/fetch-model.sh", file=sys.stderr)
        return 1
    with open(MODEL, "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()
    llm = Llama(model_path=MODEL, n_ctx=2048, n_batch=512, n_threads=os.cpu_count() or 2, verbose=False, seed=0)
    template = llm.metadata["tokenizer.chat_template"]
    n_vocab = llm.n_vocab()

    prompts = []
    for messages in CHATS:
        text = render(template, messages)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        first = last_logits(llm, n_vocab)
        assert first.shape == (n_vocab,)
        top = np.argsort(-first, kind="stable")[:TOP_LOGITS]
        generated, gaps, step_ids, step_values = [], [], [], []
        logits = first
        for _ in range(GREEDY_TOKENS):
            tok = int(np.argmax(logits))
            order = np.argsort(-logits, kind="stable")[:STEP_TOP]
            generated.append(tok)
            gaps.append(float(logits[order[0]] - logits[order[1]]))
            step_ids.append([int(i) for i in order])
            step_values.append([float(logits[i]) for i in order])
            if tok == llm.token_eos():
                break
            llm.eval([tok])
            logits = last_logits(llm, n_vocab)
        prompts.append(
            {
                "messages": messages,
                "prompt": text,
                "prompt_ids": ids,
                "first_logits_argmax": int(np.argmax(first)),
                "first_logits_top_ids": [int(i) for i in top],
                "first_logits_top_values": [float(first[i]) for i in top],
                "greedy_ids": generated,
                "greedy_top2_gap": gaps,
                "greedy_step_top_ids": step_ids,
                "greedy_step_top_values": step_values,
                "greedy_text": llm.detokenize(generated, special=True).decode("utf-8", errors="replace"),
            }
        )
        print(f"{len(ids)} prompt tokens -> {prompts[-1]['greedy_text']!r}", file=sys.stderr)

    corpus = [
        {"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)} for t in CORPUS
    ]
    out = {
        "generator": f"llama-cpp-python {llama_cpp_version}",
        "model_file": os.path.basename(MODEL),
        "model_sha256": sha256,
        "n_vocab": n_vocab,
        "chat_template_render": "jinja2 defaults, add_generation_prompt=True",
        "prompts": prompts,
        "tokenizer_corpus": corpus,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
