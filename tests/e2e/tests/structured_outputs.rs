//! Structured outputs through the real stack, checked by the `jsonschema` Python package: a
//! schema with nested objects, enums, arrays and required fields; 20 seeded replies at
//! temperature 1 all parse and validate, with speculative decoding on (the server's default
//! drafter) and off; greedy replies are equal on and off; the Responses API's `text.format`
//! and `json_object` are enforced the same way; `tool_choice` `required` / a named function
//! yield calls whose arguments match the tool's schema, and so do calls to `strict` tools under
//! `auto` (or the reply is text without a call tag); a schema the grammar engine cannot use
//! is a 400.
//! Needs a Python with `openai` and `jsonschema` (`deploy/python-env.sh`).

const SCRIPT: &str = r#"
import json, os, sys
import jsonschema
import openai
from openai import OpenAI

c = OpenAI(base_url=os.environ["EDGE_BASE_URL"] + "/v1", api_key="sk-sdk", max_retries=0)
M = "SmolLM2-135M-Instruct.Q4_1"
schema = {
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
fmt = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": schema}}
ask = [{"role": "user", "content": "Describe a pet of your choice."}]

def reply(**kw):
    r = c.chat.completions.create(model=M, messages=ask, response_format=fmt, max_tokens=160, **kw)
    assert r.choices[0].finish_reason == "stop", r
    return r.choices[0].message.content

for spec in (True, False):
    texts = set()
    for seed in range(20):
        text = reply(temperature=1, seed=seed, extra_body={"speculation": spec})
        jsonschema.validate(json.loads(text), schema)
        texts.add(text)
    assert len(texts) > 5, texts
greedy_on = reply(temperature=0, extra_body={"speculation": True})
greedy_off = reply(temperature=0, extra_body={"speculation": False})
assert greedy_on == greedy_off, (greedy_on, greedy_off)
jsonschema.validate(json.loads(greedy_on), schema)

streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
    model=M, messages=ask, response_format=fmt, max_tokens=160, temperature=0, stream=True) if ch.choices)
assert streamed == greedy_on, (streamed, greedy_on)

r = c.responses.create(model=M, input="Describe a pet of your choice.", max_output_tokens=160, temperature=0,
    text={"format": {"type": "json_schema", "name": "pet", "strict": True, "schema": schema}})
jsonschema.validate(json.loads(r.output_text), schema)

# `json_object` bounds no string's length, so a sampled reply may run past any budget inside a
# string (this 135M model at temperature 1 does for some seeds): greedy, which closes its object.
anything = c.chat.completions.create(model=M, messages=ask, response_format={"type": "json_object"},
    max_tokens=160, temperature=0)
assert anything.choices[0].finish_reason == "stop", anything
assert isinstance(json.loads(anything.choices[0].message.content), dict), anything

# A reply that must call: every call names an offered tool and its arguments match its schema.
tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
            "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"], "additionalProperties": False}}},
]
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
weather = [{"role": "user", "content": "What will the weather be in Paris this week?"}]
for seed in range(10):
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        r = c.chat.completions.create(model=M, messages=weather, tools=tools, tool_choice=choice,
            parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=120)
        calls = r.choices[0].message.tool_calls
        assert calls and len(calls) == 1 and r.choices[0].finish_reason == "tool_calls", r
        if choice != "required":
            assert calls[0].function.name == "get_time", calls
        jsonschema.validate(json.loads(calls[0].function.arguments), schemas[calls[0].function.name])

# `auto` with strict tools: free text, or calls whose arguments match (never a broken call).
strict_tools = [dict(t, function=dict(t["function"], strict=True)) for t in tools]
for seed in range(10):
    r = c.chat.completions.create(model=M, messages=weather, tools=strict_tools, temperature=1, seed=seed,
        max_tokens=120)
    m = r.choices[0].message
    assert "<tool_call>" not in (m.content or ""), m
    for call in m.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])

try:
    c.chat.completions.create(model=M, messages=ask, max_tokens=16, response_format={"type": "json_schema",
        "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}})
    sys.exit("no error for a schema the grammar engine cannot use")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "nonsense" in str(e.body), e.body
print("sdk ok")
"#;

#[test]
fn structured_outputs_validate_against_their_schema_with_and_without_speculation() {
    e2e::run_sdk_script("openai", SCRIPT);
}
