#!/usr/bin/env python3
"""Does `edge-bench bfcl` give every gated BFCL sample the official harness's verdict?

Three steps, one command (docs/bench.md, "Agreement with the official scorer"):

1. `generate`: writes `bfcl_scripted_replies.jsonl`, one deterministic streamed reply (the SSE
   `data:` payloads) per gated sample in bench/data/bfcl-v4: structured calls split over
   deltas or sent whole, text calls, JSON arrays bare / fenced / after prose, lone objects,
   `"parameters"` keys, tool_calls JSON as text, reasoning, prose, empty replies, wrong types,
   wrong names, missing or extra calls. The kind is chosen from the sample id's hash.
2. `serve`: an OpenAI-compatible server (stdlib only) that answers each request with its
   sample's scripted reply, and checks the request body against the official harness's
   (messages, tools from bfcl-eval's `convert_to_tool`, `tool_choice`).
3. `compare` (the default, runs both): starts the server, runs `edge-bench bfcl` against it,
   scores the same replies with the official path (`bfcl_official.py`: the harness's
   extractor + bfcl-eval's `ast_checker`) and prints every disagreement.

Needs Python 3.11+ with `bfcl-eval==2026.3.23` (see docs/bench.md for a light install) and a
built edge-bench: `python3 scripts/bench/bfcl_agreement.py --edge-bench target/release/edge-bench`.
"""

import argparse
import hashlib
import http.server
import json
import pathlib
import subprocess
import sys
import tempfile
import threading

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = ROOT / "bench" / "data" / "bfcl-v4"
REPLIES = HERE / "bfcl_scripted_replies.jsonl"
SUBSET_ORDER = [
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "irrelevance", "live_irrelevance",
]
HALLUCINATION = {"irrelevance", "live_irrelevance"}


def load_samples():
    """The gated samples, in edge-bench's order (subset order, then file order)."""
    wanted = {}
    for line in (DATA / "selected_995_ids.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sid, subset = line.split("\t")[:2]
        wanted.setdefault(subset, set()).add(sid)
    samples = []
    for subset in SUBSET_ORDER:
        answers = {}
        if subset not in HALLUCINATION:
            for line in (DATA / "possible_answer" / f"BFCL_v4_{subset}.json").read_text().splitlines():
                if line.strip():
                    a = json.loads(line)
                    answers[a["id"]] = a["ground_truth"]
        for line in (DATA / f"BFCL_v4_{subset}.json").read_text().splitlines():
            if not line.strip():
                continue
            q = json.loads(line)
            if q["id"] in wanted.get(subset, ()):
                samples.append({"id": q["id"], "subset": subset, "question": q["question"],
                                "function": q["function"], "ground_truth": answers.get(q["id"], [])})
    return samples


# ---------------------------------------------------------------- reply generation

def first_value(vals):
    """The first acceptable answer value that is not the optional marker ""; None to omit."""
    for v in vals if isinstance(vals, list) else [vals]:
        if v != "":
            if isinstance(v, dict):
                return {k: first_value(x) for k, x in v.items()}
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                return [{k: first_value(x) for k, x in d.items()} for d in v]
            return v
    return None


def java_text(v, ty, item):
    def scalar(x, t):
        if isinstance(x, str):
            return x
        if isinstance(x, bool):
            return "true" if x else "false"
        if t == "long":
            return f"{x}L"
        if t == "float":
            return f"{x}f"
        return json.dumps(x)
    if isinstance(v, list) and ty == "Array":
        return "new Object[]{" + ", ".join(scalar(x, item or "any") for x in v) + "}"
    if isinstance(v, list) and ty == "ArrayList":
        items = [json.dumps(x) if item in ("String", "char") else scalar(x, item or "any") for x in v]
        return "new ArrayList<>(Arrays.asList(" + ", ".join(items) + "))"
    if isinstance(v, dict):
        puts = " ".join(f'put("{k}", {json.dumps(x) if isinstance(x, str) else scalar(x, "any")});' for k, x in v.items())
        return "new HashMap<String, Object>() {{ " + puts + " }}"
    return scalar(v, ty)


def js_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x) if isinstance(x, str) else js_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f'"{k}": {json.dumps(x) if isinstance(x, str) else js_text(x)}' for k, x in v.items()) + "}"
    return json.dumps(v)


def lang_value(sample, v, schema):
    if sample["subset"] == "simple_java":
        return java_text(v, schema.get("type"), (schema.get("items") or {}).get("type"))
    if sample["subset"] == "simple_javascript":
        return js_text(v)
    return v


def expected_calls(sample):
    """(tool name, args) the ground truth asks for, in each language's value form."""
    funcs = {f["name"]: f for f in sample["function"]}
    out = []
    for entry in sample["ground_truth"]:
        (name, params), = entry.items()
        props = funcs.get(name, {}).get("parameters", {}).get("properties", {})
        args = {}
        for k, vals in params.items():
            v = first_value(vals)
            if v is None or k not in props:
                continue
            args[k] = lang_value(sample, v, props[k])
        out.append((name.replace(".", "_"), args))
    return out


def made_up_call(sample):
    """For hallucination samples: a plausible call of the first function."""
    f = sample["function"][0]
    args = {}
    for k, p in list(f.get("parameters", {}).get("properties", {}).items())[:2]:
        args[k] = {"integer": 3, "float": 2.5, "boolean": True, "array": ["a"], "dict": {"k": "v"}}.get(p.get("type"), "x")
    return [(f["name"].replace(".", "_"), args)]


def wrong_type(args):
    """Changes one argument's type the way a sloppy model does."""
    for k, v in args.items():
        if isinstance(v, bool):
            return {**args, k: int(v)}
        if isinstance(v, float):
            return {**args, k: str(v)}
        if isinstance(v, int):
            return {**args, k: str(v)}
        if isinstance(v, list) and v and all(isinstance(x, float) for x in v):
            return {**args, k: [int(x) for x in v]}
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return {**args, k: [bool(x % 2) for x in v]}
    return {**args, "unexpected_extra": 1}


def py_call(name, args, space=False):
    inner = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return f"{name}{' ' if space else ''}({inner})"


def chunk(delta, finish=None):
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "scripted",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def text_events(text, pieces=3, field="content"):
    if not text:
        return []
    n = max(1, len(text) // pieces)
    return [chunk({field: text[i:i + n]}) for i in range(0, len(text), n)]


def tool_events(calls, split):
    events = []
    for i, (name, args) in enumerate(calls):
        body = json.dumps(args)
        if split:
            events.append(chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            third = max(1, len(body) // 3)
            for j in range(0, len(body), third):
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": body[j:j + third]}}]}))
        else:
            events.append(chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                                 "function": {"name": name, "arguments": body}}]}))
    return events


KINDS = [
    "struct_split", "struct_whole_with_prose", "struct_wrong_type", "struct_missing_call", "struct_dotted_name",
    "text_call", "text_call_space", "text_prose_parens", "text_reasoning", "json_array", "json_fence",
    "json_after_prose", "json_object", "json_parameters", "tool_calls_text", "prose", "empty", "nested_wrong",
]


def reply_for(sample):
    kind = KINDS[int(hashlib.sha256(sample["id"].encode()).hexdigest(), 16) % len(KINDS)]
    calls = made_up_call(sample) if sample["subset"] in HALLUCINATION else expected_calls(sample)
    events = [chunk({"role": "assistant", "content": ""})]
    json_calls = [{"name": n, "arguments": a} for n, a in calls]
    if kind == "struct_split":
        events += tool_events(calls, split=True)
    elif kind == "struct_whole_with_prose":
        events += text_events("Sure, calling the tool now.") + tool_events(calls, split=False)
    elif kind == "struct_wrong_type":
        events += tool_events([(n, wrong_type(a)) for n, a in calls], split=True)
    elif kind == "struct_missing_call":
        events += tool_events(calls[:-1] if len(calls) > 1 else calls + calls, split=False)
    elif kind == "struct_dotted_name":
        dotted = [(sample["function"][0]["name"], a) for _, a in calls[:1]] + calls[1:]
        events += tool_events(dotted, split=True)
    elif kind == "text_call":
        events += text_events("\n".join(py_call(n, a) for n, a in calls))
    elif kind == "text_call_space":
        events += text_events("I will call " + "; ".join(py_call(n, a, space=True) for n, a in calls))
    elif kind == "text_prose_parens":
        events += text_events(" ".join(py_call(n, a) for n, a in calls) + " returns the result (in default units).")
    elif kind == "text_reasoning":
        events += text_events("The user wants a function call.", field="reasoning_content")
        events += text_events("\n".join(py_call(n, a) for n, a in calls))
    elif kind == "json_array":
        events += text_events(json.dumps(json_calls))
    elif kind == "json_fence":
        events += text_events("```json\n" + json.dumps(json_calls, indent=2) + "\n```")
    elif kind == "json_after_prose":
        events += text_events("Here is the call: " + json.dumps(json_calls))
    elif kind == "json_object":
        events += text_events(json.dumps(json_calls[0]) if json_calls else "{}")
    elif kind == "json_parameters":
        events += text_events(json.dumps([{"name": n, "parameters": a} for n, a in calls]))
    elif kind == "tool_calls_text":
        serial = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                  for i, (n, a) in enumerate(calls)]
        events += text_events(json.dumps(serial))
    elif kind == "prose":
        events += text_events("I cannot do that with the tools given (they need more details).")
    elif kind == "empty":
        pass
    elif kind == "nested_wrong":
        events += tool_events([(n, {k: ([1, 2] if isinstance(v, list) else v) for k, v in a.items()})
                               for n, a in calls], split=False)
    finish = "tool_calls" if any("tool_calls" in e["choices"][0]["delta"] for e in events) else "stop"
    events.append(chunk({}, finish))
    return kind, events


def generate(path):
    with open(path, "w") as f:
        for s in load_samples():
            kind, events = reply_for(s)
            f.write(json.dumps({"id": s["id"], "subset": s["subset"], "kind": kind, "events": events}) + "\n")


# ---------------------------------------------------------------- server

def request_key(messages, tools):
    names = [t.get("function", {}).get("name") for t in tools or []]
    return json.dumps([[{"role": m.get("role"), "content": m.get("content")} for m in messages], names])


class Scripted:
    def __init__(self, replies_path):
        import bfcl_official
        self.samples = {s["id"]: s for s in load_samples()}
        self.replies = {}
        for line in pathlib.Path(replies_path).read_text().splitlines():
            r = json.loads(line)
            self.replies[r["id"]] = r
        self.by_key = {}
        self.expected = {}
        for sid, s in self.samples.items():
            msgs = bfcl_official.official_messages(s["question"])
            tools = bfcl_official.official_tools(s["function"])
            self.by_key.setdefault(request_key(msgs, tools), []).append(sid)
            self.expected[sid] = {"messages": msgs, "tools": tools, "tool_choice": "auto"}
        self.served = []
        self.body_mismatches = []
        self.lock = threading.Lock()

    def answer(self, body):
        key = request_key(body.get("messages", []), body.get("tools", []))
        with self.lock:
            queue = self.by_key.get(key)
            if not queue:
                return None
            sid = queue.pop(0) if len(queue) > 1 else queue[0]
            self.served.append(sid)
            exp = self.expected[sid]
            got = {k: body.get(k) for k in exp}
            if got != exp:
                diff = [k for k in exp if got[k] != exp[k]]
                self.body_mismatches.append({"id": sid, "fields": diff})
        return self.replies[sid]["events"]


def serve(scripted, port):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            events = scripted.answer(body)
            if events is None:
                msg = json.dumps({"error": {"message": "no scripted reply for this request"}}).encode()
                self.send_response(404)
                self.send_header("content-length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


# ---------------------------------------------------------------- comparison

def compare(edge_bench, replies_path, port, keep):
    import bfcl_official
    scripted = Scripted(replies_path)
    httpd = serve(scripted, port)
    out = pathlib.Path(keep) if keep else pathlib.Path(tempfile.mkdtemp(prefix="bfcl-agreement-"))
    cmd = [edge_bench, "bfcl", "--endpoint", f"http://127.0.0.1:{httpd.server_address[1]}/v1", "--model", "scripted",
           "--out", str(out), "--quiet"]
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    httpd.shutdown()
    report = json.loads((out / "bfcl-A.json").read_text())
    ours = {r["id"]: r for r in report["samples"]}
    equal, differ, by_kind = 0, [], {}
    official_scores = []
    for sid, s in scripted.samples.items():
        r = scripted.replies[sid]
        official = bfcl_official.score_sample(r["events"], s["subset"], s["function"], s["ground_truth"])
        mine = ours.get(sid, {}).get("score")
        official_scores.append((s["subset"], official))
        k = by_kind.setdefault(r["kind"], [0, 0, 0])
        k[0] += 1
        k[1] += int(official)
        if mine == official:
            equal += 1
            k[2] += 1
        else:
            differ.append({"id": sid, "kind": r["kind"], "official": official, "edge_bench": mine,
                           "reason": ours.get(sid, {}).get("reason")})
    total = len(scripted.samples)
    print(f"kind counts (samples, official passes, equal verdicts):")
    for kind in KINDS:
        if kind in by_kind:
            print(f"  {kind:26s} {by_kind[kind][0]:4d} {by_kind[kind][1]:4d} {by_kind[kind][2]:4d}")
    overall_official = round(100 * sum(v for _, v in official_scores) / len(official_scores), 2)
    print(f"overall accuracy: official {overall_official}, edge-bench {report['aggregate']['overall_accuracy']}")
    print(f"request bodies differing from the official harness's: {len(scripted.body_mismatches)}")
    for m in scripted.body_mismatches[:10]:
        print("  ", m)
    print(f"served {len(scripted.served)} requests; {len(set(scripted.served))} distinct samples")
    for d in differ[:40]:
        print("  DIFFERS", d)
    print(f"{equal}/{total} verdicts equal")
    return 0 if equal == total and not scripted.body_mismatches and len(set(scripted.served)) == total else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="compare", choices=["generate", "serve", "compare"])
    p.add_argument("--edge-bench", default=str(ROOT / "target" / "release" / "edge-bench"))
    p.add_argument("--replies", default=str(REPLIES))
    p.add_argument("--port", type=int, default=0, help="0: any free port (serve: 8099)")
    p.add_argument("--keep", help="directory for edge-bench's report (default: a temporary one)")
    a = p.parse_args()
    sys.path.insert(0, str(HERE))
    if a.command == "generate":
        generate(a.replies)
        print(f"wrote {a.replies}")
        return 0
    if a.command == "serve":
        httpd = serve(Scripted(a.replies), a.port or 8099)
        print(f"serving on http://127.0.0.1:{httpd.server_address[1]}/v1", flush=True)
        threading.Event().wait()
    return compare(a.edge_bench, a.replies, a.port, a.keep)


if __name__ == "__main__":
    sys.exit(main())
