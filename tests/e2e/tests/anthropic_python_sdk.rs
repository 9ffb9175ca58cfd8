//! The official `anthropic` Python package against the real stack: a message, a streamed
//! message through the SDK's accumulating helper, cached prompt tokens on a repeat, a
//! tool_use/tool_result round trip (whole and streamed), count_tokens, and the SDK's typed
//! errors for bad input, an unknown model and a bad key.
//! Needs a Python with `anthropic`: `deploy/test.sh` makes one in `.venv/`
//! (`deploy/python-env.sh`); `EDGE_PYTHON` names another interpreter.

const SCRIPT: &str = r#"
import json, os, sys
import anthropic

c = anthropic.Anthropic(base_url=os.environ["EDGE_BASE_URL"], api_key="sk-sdk", max_retries=0)
M = "SmolLM2-135M-Instruct.Q4_1"
# This SDK version no longer offers `temperature`; the server still takes it (greedy keeps the
# repeat and streamed-vs-whole comparisons exact).
GREEDY = {"temperature": 0}
ask = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]

r = c.messages.create(model=M, max_tokens=24, extra_body=GREEDY, system="Answer with code.", messages=ask)
assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), r
assert r.content and r.content[0].type == "text" and r.content[0].text, r
assert r.stop_reason in ("end_turn", "max_tokens"), r
assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0, r.usage

again = c.messages.create(model=M, max_tokens=24, extra_body=GREEDY, system="Answer with code.", messages=ask)
assert again.usage.cache_read_input_tokens > 0, again.usage
assert again.usage.input_tokens + again.usage.cache_read_input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens
assert again.content[0].text == r.content[0].text, (again, r)

with c.messages.stream(model=M, max_tokens=12, extra_body=GREEDY, stop_sequences=["\n\n"],
        messages=[{"role": "user", "content": "Say hello."}]) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
assert text and final.content[0].text == text, (text, final)
assert final.stop_reason in ("end_turn", "max_tokens", "stop_sequence"), final
assert final.usage.output_tokens > 0, final.usage

tools = [{"name": "get_weather", "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
first = c.messages.create(model=M, max_tokens=48, extra_body=GREEDY, tools=tools,
    messages=[{"role": "user", "content": "Weather in Paris?"}])
for block in first.content:
    if block.type == "tool_use":
        assert first.stop_reason == "tool_use" and isinstance(block.input, dict), first
        assert block.id.startswith("toolu_") and block.name == "get_weather", block
history = [{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
        "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]}]
answer = c.messages.create(model=M, max_tokens=24, extra_body=GREEDY, tools=tools, messages=history)
assert answer.content and answer.usage.output_tokens > 0, answer
with c.messages.stream(model=M, max_tokens=24, extra_body=GREEDY, tools=tools, messages=history) as s:
    events = [e.type for e in s]
    streamed = s.get_final_message()
assert events[0] == "message_start" and events[-1] == "message_stop", events
assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in answer.content], (streamed, answer)

n = c.messages.count_tokens(model=M, tools=tools, messages=history)
assert n.input_tokens > 0, n

for bad in [dict(messages=[]), dict(messages=ask, extra_body={"temperature": 1.5}),
            dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])]:
    try:
        c.messages.create(model=M, max_tokens=5, **bad)
        sys.exit(f"no error for {bad}")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.body["type"] == "error", e.body
try:
    c.messages.create(model="no-such-model", max_tokens=5, messages=ask)
    sys.exit("no error for an unknown model")
except anthropic.NotFoundError:
    pass
try:
    anthropic.Anthropic(base_url=os.environ["EDGE_BASE_URL"], api_key="sk-wrong", max_retries=0).messages.create(
        model=M, max_tokens=5, messages=ask)
    sys.exit("no error for a wrong key")
except anthropic.AuthenticationError:
    pass
print("sdk ok")
"#;

/// Strict model names, so an unknown model is the API's 404 (the default gateway serves any
/// name with its model; `official_harness` covers that).
#[test]
fn the_official_anthropic_sdk_works_end_to_end() {
    e2e::run_sdk_script("anthropic", SCRIPT);
}
