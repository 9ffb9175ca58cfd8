#!/usr/bin/env python3
"""Side-by-side peer numbers for `cargo bench -p engine-service --bench throughput`:
llama.cpp (through llama-cpp-python) on the same GGUF, same shapes: prefill of 512 tokens
in chunks of 256 and 64 single-token decode steps, at an empty context and after a
1,536-token context, best of N rounds, for 1 and 2 threads, flash attention off and on.

    pip install llama-cpp-python   # builds llama.cpp from source (minutes)
    python3 scripts/bench/llama_cpp_throughput.py [MODEL.gguf]
"""
import os
import sys
import time

from llama_cpp import Llama

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
THREADS = [int(x) for x in os.environ.get("EDGE_BENCH_THREADS", "1,2").split(",")]
CONTEXTS = [int(x) for x in os.environ.get("EDGE_BENCH_CONTEXTS", "0,1536").split(",")]
PREFILL, CHUNK, DECODE = 512, 256, 64
ROUNDS = int(os.environ.get("EDGE_BENCH_ROUNDS", "3"))


def run(llm, tokens, start):
    """Evaluates tokens at positions start.. in chunks (KV beyond start is dropped first)."""
    llm.n_tokens = start
    llm._ctx.kv_cache_seq_rm(-1, start, -1)
    for i in range(0, len(tokens), CHUNK):
        llm.eval(tokens[i:i + CHUNK])


def main():
    print(f"llama.cpp via llama-cpp-python; model {MODEL}; prefill chunk {CHUNK}; best of {ROUNDS}")
    print(f"{'threads':>7} {'fa':>3} {'context':>8} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for n_threads in THREADS:
        for fa in (False, True):
            llm = Llama(model_path=MODEL, n_ctx=4096, n_batch=CHUNK, n_ubatch=CHUNK, n_threads=n_threads,
                        n_threads_batch=n_threads, flash_attn=fa, verbose=False)
            vocab = llm.n_vocab()
            tokens = [(i * 7919 + 13) % vocab for i in range(max(CONTEXTS) + PREFILL + DECODE + 1)]
            run(llm, tokens[:64], 0)
            for context in CONTEXTS:
                best_p = best_d = 0.0
                for _ in range(ROUNDS):
                    if context:
                        run(llm, tokens[:context], 0)
                    t = time.perf_counter()
                    run(llm, tokens[context:context + PREFILL], context)
                    best_p = max(best_p, PREFILL / (time.perf_counter() - t))
                    run(llm, [], context)
                    t = time.perf_counter()
                    for i in range(DECODE):
                        llm.eval([tokens[context + i]])
                    best_d = max(best_d, DECODE / (time.perf_counter() - t))
                print(f"{n_threads:>7} {'on' if fa else 'off':>3} {context:>8} {best_p:>14.1f} {best_d:>13.1f}", flush=True)
            del llm


if __name__ == "__main__":
    main()
