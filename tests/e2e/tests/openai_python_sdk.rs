//! The official `openai` Python package against the real stack: chat, streamed chat with
//! usage, a tool-call round trip (assistant tool_calls -> tool result -> answer), text
//! completions, and the SDK's typed errors for bad input and bad keys.
//! Needs a Python with `openai`: `deploy/test.sh` makes one in `.venv/` (`deploy/python-env.sh`);
//! `EDGE_PYTHON` names another interpreter.

const SCRIPT: &str = r#"
import json, os, sys
import openai
from openai import OpenAI

base = os.environ["EDGE_BASE_URL"] + "/v1"
c = OpenAI(base_url=base, api_key="sk-sdk", max_retries=0)

r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1",
    messages=[{"role": "system", "content": "Answer in one short sentence."},
              {"role": "user", "content": "What is the capital of France?"}],
    temperature=0, max_tokens=24)
assert r.object == "chat.completion", r
assert r.choices[0].message.content, r
assert r.usage.completion_tokens > 0, r

parts, usage, finish = [], None, None
for chunk in c.chat.completions.create(messages=[{"role": "user", "content": "Say hello."}],
        model="SmolLM2-135M-Instruct.Q4_1", stream=True, stream_options={"include_usage": True},
        max_completion_tokens=12, temperature=0, seed=3, stop=["\n\n"]):
    if chunk.usage:
        usage = chunk.usage
    for ch in chunk.choices:
        parts.append(ch.delta.content or "")
        finish = ch.finish_reason or finish
assert usage and usage.completion_tokens > 0 and finish in ("stop", "length"), (usage, finish)

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
first = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", tools=tools,
    messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=48, temperature=0)
msg = first.choices[0].message
if msg.tool_calls:
    assert first.choices[0].finish_reason == "tool_calls"
    json.loads(msg.tool_calls[0].function.arguments)
history = [{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
answer = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", tools=tools,
    messages=history, max_tokens=24, temperature=0)
assert answer.choices[0].message.content is not None, answer

t = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Once upon a time", max_tokens=8)
assert t.object == "text_completion" and t.choices[0].text, t

# Log-probabilities: greedy picks the most likely token, so each chosen token heads its
# alternatives; the tokens' bytes spell the content (the EOS marker aside).
lp = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=12, temperature=0,
    messages=[{"role": "user", "content": "Name a colour."}], logprobs=True, top_logprobs=3)
entries = lp.choices[0].logprobs.content
assert len(entries) == lp.usage.completion_tokens, (len(entries), lp.usage)
for e in entries:
    assert e.logprob <= 0 and len(e.top_logprobs) == 3, e
    assert abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5, e
    assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e
spelled = b"".join(bytes(e.bytes) for e in entries if e.token != "<|im_end|>").decode()
assert spelled == lp.choices[0].message.content, (spelled, lp.choices[0].message.content)
streamed = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=12, temperature=0,
    messages=[{"role": "user", "content": "Name a colour."}], logprobs=True, top_logprobs=3, stream=True)
streamed_entries = [e for ch in streamed for choice in ch.choices if choice.logprobs
    for e in (choice.logprobs.content or [])]
assert [e.token for e in streamed_entries] == [e.token for e in entries]
tl = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Once upon a time", max_tokens=6,
    temperature=0, logprobs=2)
assert len(tl.choices[0].logprobs.tokens) == 6 and len(tl.choices[0].logprobs.top_logprobs[0]) == 2, tl

for bad in [dict(messages=[]), dict(messages=[{"role": "user", "content": "x"}], n=2),
            dict(messages=[{"role": "user", "content": "x"}], temperature=5),
            dict(messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=25)]:
    try:
        c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", **bad)
        sys.exit(f"no error for {bad}")
    except openai.BadRequestError as e:
        assert e.status_code == 400
try:
    c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    sys.exit("no error for an unknown model")
except openai.NotFoundError:
    pass
try:
    OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
    sys.exit("no error for a wrong key")
except openai.AuthenticationError:
    pass
print("sdk ok")
"#;

/// Strict model names, so an unknown model is the API's 404 (the default gateway serves any
/// name with its model; `official_harness` covers that).
#[test]
fn the_official_python_sdk_works_end_to_end() {
    e2e::run_sdk_script("openai", SCRIPT);
}
