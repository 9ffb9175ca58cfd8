//! Structured outputs through the real stack, checked by the `jsonschema` Python package: a
//! schema with nested objects, enums, arrays and required fields; 20 seeded replies at
//! temperature 1 all parse and validate, with speculative decoding on (the server's default
//! drafter) and off; greedy replies are equal on and off; the Responses API's `text.format`
//! and `json_object` are enforced the same way; a schema the grammar engine cannot use is a 400.
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

anything = c.chat.completions.create(model=M, messages=ask, response_format={"type": "json_object"},
    max_tokens=160, temperature=1, seed=3)
assert isinstance(json.loads(anything.choices[0].message.content), dict), anything

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
