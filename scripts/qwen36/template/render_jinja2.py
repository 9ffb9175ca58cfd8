#!/usr/bin/env python3
"""Renders the Qwen3.5/3.6 chat template with Jinja2 exactly as HF transformers does.

Writes gateway/src/text/testdata/qwen3_5/cases.json: varied conversations (tools, assistant
tool calls with argument objects of every JSON type, tool results incl. consecutive ones,
reasoning before/after the last user query, thinking on/off, system or not, multi-part
content, errors) with the rendered prompt (or the raised message). The gateway's minijinja
renderer must reproduce each byte for byte (gateway/tests/qwen_template.rs).

Rendering goes through transformers' own code path of `apply_chat_template(tokenize=False)`:
`_normalize_chat_messages` (drops None-valued keys) then `render_jinja_template` (Jinja2
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson =
json.dumps(ensure_ascii=False), raise_exception, strftime_now; reasoning fields aliased).
Tool-call arguments are objects, as the gateway hands them to the template after parsing
OpenAI's JSON strings (validate.rs). Run by hand (not in CI):

    python3 -m venv /tmp/tpl && /tmp/tpl/bin/pip install 'transformers>=5' jinja2
    /tmp/tpl/bin/python scripts/qwen36/template/render_jinja2.py
"""

import argparse
import json
from pathlib import Path

import jinja2
import transformers
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "gateway/src/text/testdata/qwen3_5.jinja"
OUT = REPO / "gateway/src/text/testdata/qwen3_5/cases.json"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — température, 天气 ☀️",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "threshold": {"type": "number", "default": 0.5, "multipleOf": 1e-05},
                "detailed": {"type": "boolean", "default": False},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_code",
        "description": "Search the repository.\nReturns matching lines <as text> & paths.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object", "properties": {"regex": {"type": "boolean"}}},
                "limit": {"type": ["integer", "null"]},
            },
            "required": ["query"],
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {}}}
TOOLS = [WEATHER, SEARCH]


def call(name, arguments, call_id="call_1", wrapped=True):
    if not wrapped:
        return {"name": name, "arguments": arguments}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


ALL_TYPES_ARGS = {
    "query": "fn main() {\n    println!(\"hi\");\n}\n",
    "paths": ["src/lib.rs", "tests/ünïcode.rs"],
    "options": {"regex": True, "context": 2, "exclude": None, "nested": {"a": [1, 2.5, "x"]}},
    "limit": 10,
    "ratio": 0.25,
    "tiny": 1e-07,
    "huge": 1e20,
    "whole_float": 3.0,
    "negative": -42,
    "flag_true": True,
    "flag_false": False,
    "nothing": None,
    "number_like_string": "42",
    "empty_string": "",
    "empty_list": [],
    "empty_object": {},
    "emoji": "🦀 crab — 蟹",
}

CASES = [
    {"name": "user_only_thinking_default", "messages": [{"role": "user", "content": "Hello!"}]},
    {
        "name": "user_only_thinking_off",
        "messages": [{"role": "user", "content": "Hello!"}],
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "thinking_on_explicit",
        "messages": [{"role": "user", "content": "Hi"}],
        "kwargs": {"enable_thinking": True},
    },
    {
        "name": "system_and_user",
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    },
    {
        "name": "whitespace_is_trimmed",
        "messages": [
            {"role": "system", "content": "\n\n  Be kind.  \n"},
            {"role": "user", "content": "  \n  padded question \t\n"},
            {"role": "assistant", "content": "\n answer with spaces \n\n"},
            {"role": "user", "content": "\tnext\n"},
        ],
    },
    {
        "name": "multi_turn_reasoning_before_and_after_last_user",
        "messages": [
            {"role": "user", "content": "First question"},
            {"role": "assistant", "content": "First answer", "reasoning_content": "old reasoning, dropped"},
            {"role": "user", "content": "Second question"},
            {"role": "assistant", "content": "Second answer", "reasoning_content": "\nnew reasoning, kept\n"},
        ],
    },
    {
        "name": "inline_think_in_content_is_split",
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\ninline old\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>\ninline new\n</think>\n\nA2"},
        ],
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "empty_reasoning_after_last_user",
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "reasoning_content": ""},
        ],
    },
    {
        "name": "tools_without_system",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
    },
    {
        "name": "tools_with_system",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": TOOLS + [NO_PARAMS],
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "tools_with_empty_system",
        "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}],
        "tools": [WEATHER],
    },
    {
        "name": "empty_tools_list_is_no_tools",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [],
    },
    {
        "name": "tool_call_all_argument_types",
        "messages": [
            {"role": "user", "content": "Find main functions."},
            {"role": "assistant", "content": "", "reasoning_content": "I should search.",
             "tool_calls": [call("search_code", ALL_TYPES_ARGS)]},
            {"role": "tool", "tool_call_id": "call_1", "content": "src/main.rs:1: fn main() {"},
        ],
        "tools": TOOLS,
    },
    {
        "name": "tool_call_with_content_and_parallel_calls",
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris and Tokyo?"},
            {"role": "assistant", "content": "Let me check both cities.",
             "tool_calls": [
                 call("get_weather", {"city": "Paris", "days": 2}, "call_a"),
                 call("get_weather", {"city": "東京", "unit": "celsius", "detailed": True}, "call_b"),
             ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 21, \"sky\": \"sunny\"}"},
            {"role": "tool", "tool_call_id": "call_b", "content": "{\"temp\": 18.5, \"sky\": \"rain\"}"},
            {"role": "assistant", "content": "Paris: 21°C sunny. Tokyo: 18.5°C rain."},
            {"role": "user", "content": "Thanks! And Berlin?"},
        ],
        "tools": TOOLS,
    },
    {
        "name": "agentic_single_user_many_turns",
        "messages": [
            {"role": "user", "content": "Fix the failing test."},
            {"role": "assistant", "content": "", "reasoning_content": "Look at the test first.",
             "tool_calls": [call("search_code", {"query": "fn failing", "paths": ["tests/"]}, "c1")]},
            {"role": "tool", "tool_call_id": "c1", "content": "tests/a.rs:10: fn failing() {}"},
            {"role": "assistant", "content": "Found it.", "reasoning_content": "Now read the file.",
             "tool_calls": [call("search_code", {"query": "assert", "limit": None}, "c2")]},
            {"role": "tool", "tool_call_id": "c2", "content": "tests/a.rs:11: assert!(false);"},
            {"role": "tool", "tool_call_id": "c3", "content": "second result"},
            {"role": "tool", "tool_call_id": "c4", "content": "third result"},
            {"role": "assistant", "content": "The assertion is wrong.", "reasoning_content": "Done."},
        ],
        "tools": TOOLS,
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "tool_call_without_function_wrapper_and_without_arguments",
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": None, "tool_calls": [
                call("now", {}, wrapped=False),
                {"id": "x", "type": "function", "function": {"name": "now"}},
            ]},
            {"role": "tool", "content": "12:00"},
        ],
        "tools": [NO_PARAMS],
    },
    {
        "name": "tool_message_last_then_generation",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Oslo"})]},
            {"role": "tool", "content": "  -3°C, snow  \n"},
        ],
        "tools": [WEATHER],
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "user_message_that_is_a_tool_response_is_not_the_last_query",
        "messages": [
            {"role": "user", "content": "Real question"},
            {"role": "assistant", "content": "Calling.", "reasoning_content": "think A"},
            {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "think B"},
        ],
    },
    {
        "name": "multi_part_text_content",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "System part one. "},
                                           {"type": "text", "text": "Part two."}]},
            {"role": "user", "content": [{"type": "text", "text": "Look at this:"},
                                         {"type": "text", "text": "\nsecond line"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Answer part."}]},
            {"role": "user", "content": [{"type": "text", "text": "More?"}]},
        ],
    },
    {
        "name": "image_and_video_parts_with_vision_ids",
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": "file://a.png"},
                                         {"type": "text", "text": "and"},
                                         {"type": "video", "video": "file://b.mp4"},
                                         {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                                         {"type": "text", "text": "What are these?"}]},
        ],
        "kwargs": {"add_vision_id": True},
    },
    {
        "name": "unicode_and_special_characters",
        "messages": [
            {"role": "system", "content": "Réponds en français. 用中文回答。 🙂"},
            {"role": "user", "content": "Quote \"this\" & <that> 'here' \\ backslash\ttab\u2028sep"},
            {"role": "assistant", "content": "Ça va — très bien! 很好 👍🏽"},
            {"role": "user", "content": "NFD: Cafe\u0301; zero width: a\u200bb"},
        ],
        "tools": [WEATHER],
    },
    {
        "name": "tool_response_with_list_content",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [call("now", {})]},
            {"role": "tool", "content": [{"type": "text", "text": "part 1;"}, {"type": "text", "text": " part 2"}]},
            {"role": "user", "content": "ok"},
        ],
        "tools": [NO_PARAMS],
    },
    {
        "name": "preserve_thinking_kwarg_is_accepted",
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
        ],
        "kwargs": {"preserve_thinking": True, "enable_thinking": True},
    },
    {
        "name": "reasoning_field_alias",
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "reasoning": "aliased reasoning"},
        ],
        "note": "transformers copies `reasoning`/`thinking` into `reasoning_content`; the gateway "
        "must do the same for byte equality (its validate.rs keeps only reasoning_content)",
        "gateway_input": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "reasoning_content": "aliased reasoning"},
        ],
    },
    {"name": "error_no_user_query", "messages": [{"role": "system", "content": "only system"}]},
    {
        "name": "error_only_tool_responses",
        "messages": [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}],
    },
    {
        "name": "error_system_not_first",
        "messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}],
    },
    {"name": "error_no_messages", "messages": []},
    {
        "name": "error_unexpected_role",
        "messages": [{"role": "user", "content": "Hi"}, {"role": "critic", "content": "hm"}],
    },
    {
        "name": "error_image_in_system",
        "messages": [{"role": "system", "content": [{"type": "image", "image": "x"}]},
                     {"role": "user", "content": "Hi"}],
    },
]


def render(template: str, case: dict) -> dict:
    messages = _normalize_chat_messages(case["messages"])
    kwargs = dict(case.get("kwargs", {}))
    try:
        rendered, _ = render_jinja_template(
            conversations=[messages],
            tools=case.get("tools"),
            chat_template=template,
            add_generation_prompt=True,
            **kwargs,
        )
        return {"expected": rendered[0]}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    template = TEMPLATE.read_text(encoding="utf-8")
    cases = []
    for case in CASES:
        out = {
            "name": case["name"],
            # What the gateway gets: the normalized messages (None-valued keys dropped).
            "messages": case.get("gateway_input") or _normalize_chat_messages(case["messages"]),
        }
        if "tools" in case:
            out["tools"] = case["tools"]
        out["kwargs"] = case.get("kwargs", {})
        if "note" in case:
            out["note"] = case["note"]
        out.update(render(template, case))
        cases.append(out)
    doc = {
        "about": "Qwen3.5/3.6 chat template rendered by Jinja2 through transformers' "
        "render_jinja_template (add_generation_prompt=True); written by "
        "scripts/qwen36/template/render_jinja2.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(f"{args.out}: {len(cases)} cases ({len(cases) - errors} rendered, {errors} raise)")


if __name__ == "__main__":
    main()
