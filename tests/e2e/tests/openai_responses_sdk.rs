//! The official `openai` Python package's Responses client against the real stack: a response,
//! cached prompt tokens on a repeat, a raw event stream and the SDK's accumulating stream
//! helper (both equal to the whole response), a function_call / function_call_output round trip
//! (whole and streamed), and the SDK's typed errors for bad input, an unknown model, a bad key.
//! Needs a Python with `openai`: `deploy/test.sh` makes one in `.venv/` (`deploy/python-env.sh`);
//! `EDGE_PYTHON` names another interpreter.

const SCRIPT: &str = r#"
import json, os, sys
import openai
from openai import OpenAI

c = OpenAI(base_url=os.environ["EDGE_BASE_URL"] + "/v1", api_key="sk-sdk", max_retries=0)
M = "SmolLM2-135M-Instruct.Q4_1"
ask = dict(model=M, instructions="Answer in one short sentence.", input="What is the capital of France?",
           temperature=0, max_output_tokens=24)

r = c.responses.create(**ask)
assert r.object == "response" and r.id.startswith("resp_"), r
assert r.status in ("completed", "incomplete"), r
assert r.output_text, r
assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
assert r.instructions == "Answer in one short sentence." and r.store is False, r

again = c.responses.create(**ask)
assert again.usage.input_tokens_details.cached_tokens > 0, again.usage
assert again.usage.input_tokens == r.usage.input_tokens, (again.usage, r.usage)
assert again.output_text == r.output_text, (again, r)

def items(output):
    # What a client reads of the output (ids and call ids differ per response; the stream
    # helper's parsed types add a `parsed` field).
    return [(i.type, i.status, [c.text for c in i.content] if i.type == "message" else (i.name, i.arguments))
            for i in output]

hello = dict(model=M, input="Say hello.", temperature=0, max_output_tokens=64)
whole = c.responses.create(**hello)
events = list(c.responses.create(stream=True, **hello))
kinds = [e.type for e in events]
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] == "response." + whole.status, kinds
assert [e.sequence_number for e in events] == list(range(len(events))), kinds
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert text == whole.output_text, (text, whole)
assert events[-1].response.output_text == text and events[-1].response.usage.output_tokens > 0, events[-1]

with c.responses.stream(**hello) as s:
    helper_events = list(s)
    final = s.get_final_response() if whole.status == "completed" else helper_events[-1].response
assert final.output_text == whole.output_text, (final, whole)
assert items(final.output) == items(whole.output), (final, whole)

tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": False,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
first = c.responses.create(model=M, input="Weather in Paris?", tools=tools, temperature=0, max_output_tokens=48)
for item in first.output:
    if item.type == "function_call":
        assert item.call_id.startswith("call_") and item.name == "get_weather", item
        assert isinstance(item.arguments, str), item
history = [{"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]
turn = dict(model=M, input=history, tools=tools, temperature=0, max_output_tokens=24)
answer = c.responses.create(**turn)
assert answer.output and answer.usage.output_tokens > 0, answer
with c.responses.stream(**turn) as s:
    streamed_events = list(s)
streamed = s.get_final_response() if answer.status == "completed" else streamed_events[-1].response
assert items(streamed.output) == items(answer.output), (streamed, answer)

for bad in [dict(input=[]), dict(input="x", temperature=3), dict(input="x", previous_response_id="resp_1"),
            dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])]:
    try:
        c.responses.create(model=M, **bad)
        sys.exit(f"no error for {bad}")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"], e.body
try:
    c.responses.create(model="no-such-model", input="x")
    sys.exit("no error for an unknown model")
except openai.NotFoundError:
    pass
try:
    OpenAI(base_url=os.environ["EDGE_BASE_URL"] + "/v1", api_key="sk-wrong", max_retries=0).responses.create(
        model=M, input="x")
    sys.exit("no error for a wrong key")
except openai.AuthenticationError:
    pass
print("sdk ok")
"#;

#[test]
fn the_official_openai_sdk_responses_client_works_end_to_end() {
    e2e::run_sdk_script("openai", SCRIPT);
}
