#!/usr/bin/env python3
"""Time per output token with a grammar active vs without, through a running stack.

Streams the same chat request (greedy, a fresh `cache_salt` each time so every run prefills
the same way) with and without `response_format` `json_schema`, with speculative decoding on
and off (`speculation` request extension), and prints the median TPOT (time from the first
content delta to the last, over the completion tokens after the first) and, from the engine's
metrics, how many verified draft tokens the grammar forbade.

    deploy/up.sh --port 8093 &   # the default model
    python3 scripts/bench/grammar_tpot.py --base-url http://127.0.0.1:8093 \
        --engine-metrics http://127.0.0.1:9091/metrics

Stdlib only. Free text and the schema's JSON are different replies, so with speculation on
the two TPOTs also differ by how well each reply is drafted; with it off they differ by the
grammar's cost alone.
"""

import argparse
import json
import statistics
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "species": {"enum": ["cat", "dog", "parrot"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 40},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "city": {"type": "string", "maxLength": 20}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "species", "owner"],
    "additionalProperties": False,
}


def run(base_url, response_format, speculation, salt):
    body = {
        "messages": [{"role": "user", "content": "Describe a pet of your choice as JSON."}],
        "max_tokens": 160,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "speculation": speculation,
        "cache_salt": salt,
    }
    if response_format:
        body["response_format"] = response_format
    req = urllib.request.Request(
        base_url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    first, tokens = None, 0
    with urllib.request.urlopen(req) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content") and first is None:
                    first = time.perf_counter()
    last = time.perf_counter()
    return (last - first) / max(tokens - 1, 1) * 1e3, tokens


def metric(url, name):
    if not url:
        return None
    text = urllib.request.urlopen(url).read().decode()
    values = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")]
    return values[0] if values else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--engine-metrics", default="", help="the engine's /metrics URL, for the draft counts")
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    schema_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    for speculation in (True, False):
        for label, fmt in (("free text", None), ("json_schema", schema_format)):
            drafted0 = metric(args.engine_metrics, "edge_engine_grammar_draft_tokens_total")
            forbidden0 = metric(args.engine_metrics, "edge_engine_grammar_forbidden_draft_tokens_total")
            runs = [run(args.base_url, fmt, speculation, f"tpot-{label}-{speculation}-{i}") for i in range(args.runs)]
            line = (
                f"speculation {'on ' if speculation else 'off'}  {label:<12} "
                f"TPOT median {statistics.median(r[0] for r in runs):6.2f} ms  ({runs[0][1]} tokens)"
            )
            if fmt and drafted0 is not None:
                drafted = metric(args.engine_metrics, "edge_engine_grammar_draft_tokens_total") - drafted0
                forbidden = metric(args.engine_metrics, "edge_engine_grammar_forbidden_draft_tokens_total") - forbidden0
                if drafted:
                    line += f"  drafts forbidden by the grammar: {forbidden:.0f}/{drafted:.0f} ({forbidden / drafted:.0%})"
            print(line)


if __name__ == "__main__":
    main()
