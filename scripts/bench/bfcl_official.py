"""The official MLPerf Edge Agentic harness's BFCL scoring path, for checking edge-bench.

Copied from mlcommons/endpoints at commit ea332753 (Apache-2.0, SPDX header below):
`FunctionCallExtractor` verbatim (src/inference_endpoint/evaluation/extractor.py),
`merge_tool_calls` verbatim (core/types.py), and the parts of the SSE accumulator
(openai/accumulator.py), `TextModelOutput.__str__`, `BFCLv4Scorer.get_scoring_outputs`,
`_score_ast` and `_score_hallucination` (evaluation/bfcl_v4_scorer.py) that decide one
sample's verdict, reduced to functions over plain data. The harness itself needs Python 3.12
and its whole dependency tree; this needs only `bfcl-eval==2026.3.23` (Python 3.11+), whose
`ast_checker` does the checking, and whose `convert_to_tool` builds the reference tools.

SPDX-FileCopyrightText: Copyright (c) 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
SPDX-License-Identifier: Apache-2.0
"""

import ast
import json
import re
from typing import Any

from bfcl_eval.constants.enums import Language, ModelStyle
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.model_handler.utils import convert_to_tool

_SUBSET_LANGUAGE_NAMES = {"simple_java": "JAVA", "simple_javascript": "JAVASCRIPT"}
_AST_CHECKER_MODEL_NAME = "gpt-4o-2024-11-20-FC"
HALLUCINATION_SUBSETS = {"irrelevance", "live_irrelevance"}


def official_tools(functions):
    """dataset_manager/predefined/bfcl_v4/__init__.py `_convert_bfcl_functions_to_tools`."""
    return convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)


def official_messages(question):
    """`_build_messages_from_question`."""
    return [{"role": msg["role"], "content": msg.get("content") or ""} for turn in question for msg in turn]


def merge_tool_calls(tool_calls):
    if not tool_calls:
        return None
    if not isinstance(tool_calls[0], list | tuple):
        return tool_calls
    merged: dict[int, dict] = {}
    for chunk in tool_calls:
        for partial in chunk:
            idx = partial.get("index", 0)
            tool_call = merged.setdefault(idx, {"type": "function", "function": {"arguments": ""}})
            if partial.get("id"):
                tool_call["id"] = partial["id"]
            if partial.get("type"):
                tool_call["type"] = partial["type"]
            fn = partial.get("function") or {}
            if fn.get("name"):
                tool_call["function"]["name"] = fn["name"]
            if fn.get("arguments"):
                tool_call["function"]["arguments"] += fn["arguments"]
    return tuple(merged[i] for i in sorted(merged))


def accumulate(events):
    """OpenAISSEAccumulator over SSE `data:` payloads (decoded JSON): (output, reasoning, tool chunks)."""
    output, reasoning, tool_chunks = [], [], []
    for ev in events:
        choices = ev.get("choices") or ()
        if not choices:
            continue
        delta = choices[0].get("delta")
        if delta is None:
            continue
        if delta.get("tool_calls"):
            tool_chunks.append(tuple(delta["tool_calls"]))
        if delta.get("content"):
            output.append(delta["content"])
        elif delta.get("reasoning_content") or delta.get("reasoning"):
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning"))
    return output, reasoning, tool_chunks


def scoring_output(events):
    """`get_scoring_outputs` for one streamed reply (`str(TextModelOutput)` without tool calls)."""
    output, reasoning, tool_chunks = accumulate(events)
    merged = merge_tool_calls(tuple(tool_chunks) if tool_chunks else None)
    if merged:
        return json.dumps(list(merged), separators=(",", ":"))
    return "".join(reasoning) + "".join(output)


class FunctionCallExtractor:
    """Extract function call(s) from model output for BFCL evaluation.

    Extraction priority (highest to lowest fidelity):
    1. Native tool_calls JSON (serialized by the adapter when the endpoint returns
       structured tool_calls -- this is the most reliable path)
    2. JSON array of {"name": "...", "arguments": {...}} objects
    3. Text-based function calls (LAST RESORT -- regex heuristic, may produce
       false positives from explanatory text or fail on nested parentheses)

    The extractor normalizes all formats into a JSON string representation
    suitable for comparison by the bfcl-eval scoring library.

    Examples:
        >>> # Native tool_calls (serialized by adapter) -- preferred path
        >>> text = '[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\\"city\\":\\"London\\"}"}}]'
        >>> FunctionCallExtractor.extract(text)
        '[{"name": "get_weather", "arguments": {"city": "London"}}]'

        >>> # Text-based function call (last resort fallback)
        >>> text = "get_weather(city='London')"
        >>> FunctionCallExtractor.extract(text)
        '[{"name": "get_weather", "arguments": {"city": "London"}}]'
    """

    _SKIP_NAMES = frozenset(
        {
            "print",
            "return",
            "if",
            "for",
            "while",
            "def",
            "class",
            "import",
            "from",
            "with",
            "assert",
            "raise",
            "try",
            "except",
            "len",
            "str",
            "int",
            "float",
            "list",
            "dict",
            "set",
            "tuple",
            "type",
            "isinstance",
            "range",
            "enumerate",
            "zip",
            "map",
            "filter",
            "Note",
            "Example",
            "Here",
            "This",
            "The",
            "For",
        }
    )

    _FUNC_START_PATTERN = re.compile(r"\b([A-Za-z_]\w*)\s*\(")

    @classmethod
    def extract(cls, text: str, default: str | None = None) -> str | None:
        """Extract function calls from model output text.

        Args:
            text: Raw model output (either serialized tool_calls JSON or text)
            default: Default value if extraction fails

        Returns:
            JSON string of normalized function calls, or default on failure
        """
        if not text or not isinstance(text, str):
            return default

        text = text.strip()
        if not text:
            return default

        # Priority 1: Native tool_calls JSON (from adapter serialization)
        result = cls._try_parse_tool_calls_json(text)
        if result is not None:
            return result

        # Priority 2: JSON array of function call objects
        result = cls._try_parse_function_array(text)
        if result is not None:
            return result

        # Priority 3 (last resort): Text-based function calls.
        # This path is inherently heuristic and may not handle all edge cases
        # (e.g., deeply nested parentheses, function-like text in explanations).
        result = cls._try_parse_text_function_calls(text)
        if result is not None:
            return result

        return default

    @classmethod
    def has_native_tool_calls(cls, text: str) -> bool:
        """Whether ``text`` parses as serialized OpenAI ``tool_calls`` JSON.

        Stable public entry point for consumers (e.g. hallucination scoring)
        that only need to know whether the model emitted a structured tool call,
        without reaching into the extractor's private parsing helpers.
        """
        return cls._try_parse_tool_calls_json(text) is not None

    @classmethod
    def _try_parse_tool_calls_json(cls, text: str) -> str | None:
        """Parse serialized OpenAI tool_calls format.

        Expected format: [{"id":"...","type":"function","function":{"name":"...","arguments":"..."}}]
        """
        try:
            data = json.loads(text)
            if not isinstance(data, list):
                return None

            calls: list[dict[str, Any]] = []
            for item in data:
                if not isinstance(item, dict):
                    return None
                func_data = item.get("function")
                if not isinstance(func_data, dict):
                    return None

                name = func_data.get("name", "")
                arguments = func_data.get("arguments", "{}")

                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except (json.JSONDecodeError, ValueError):
                        pass

                calls.append({"name": name, "arguments": arguments})

            if calls:
                return json.dumps(calls)
        except (json.JSONDecodeError, ValueError, TypeError):
            pass
        return None

    @classmethod
    def _try_parse_function_array(cls, text: str) -> str | None:
        """Parse a JSON array of function call dicts: [{"name": "...", "arguments": {...}}]"""
        try:
            data = json.loads(text)
            if not isinstance(data, list):
                return None

            calls: list[dict[str, Any]] = []
            for item in data:
                if not isinstance(item, dict):
                    return None
                if "name" not in item:
                    return None
                calls.append(
                    {
                        "name": item["name"],
                        "arguments": item.get("arguments", {}),
                    }
                )

            if calls:
                return json.dumps(calls)
        except (json.JSONDecodeError, ValueError, TypeError):
            pass
        return None

    @classmethod
    def _find_balanced_parens(cls, text: str, start: int) -> int | None:
        """Find the closing paren matching the opening paren at `start`.

        Returns the index of the matching ')' or None if unbalanced.
        Handles nested parentheses, strings (single/double quotes), and brackets.
        """
        depth = 0
        i = start
        in_single_quote = False
        in_double_quote = False
        length = len(text)

        while i < length:
            ch = text[i]
            if ch == "\\" and (in_single_quote or in_double_quote):
                i += 2
                continue
            if ch == "'" and not in_double_quote:
                in_single_quote = not in_single_quote
            elif ch == '"' and not in_single_quote:
                in_double_quote = not in_double_quote
            elif not in_single_quote and not in_double_quote:
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                    if depth == 0:
                        return i
            i += 1
        return None

    @classmethod
    def _try_parse_text_function_calls(cls, text: str) -> str | None:
        """Parse text-based function calls like func_name(arg1='val1', arg2=42).

        Uses balanced parenthesis matching to handle nested calls.
        Applies heuristics to reject likely false positives from natural language.
        Tracks consumed ranges to avoid extracting inner calls that are actually
        arguments of an outer call.
        """
        calls: list[dict[str, Any]] = []
        consumed_ranges: list[tuple[int, int]] = []

        for match in cls._FUNC_START_PATTERN.finditer(text):
            match_start = match.start()

            if any(s <= match_start < e for s, e in consumed_ranges):
                continue

            func_name = match.group(1)
            if func_name in cls._SKIP_NAMES:
                continue

            paren_open = match.end() - 1
            paren_close = cls._find_balanced_parens(text, paren_open)
            if paren_close is None:
                continue

            consumed_ranges.append((paren_open, paren_close + 1))

            args_str = text[paren_open + 1 : paren_close].strip()

            if args_str and cls._looks_like_signature(args_str):
                continue

            arguments = cls._parse_arguments_string(args_str)
            calls.append({"name": func_name, "arguments": arguments})

        if calls:
            return json.dumps(calls)
        return None

    @classmethod
    def _looks_like_signature(cls, args_str: str) -> bool:
        """Return True if args look like a type signature rather than real arguments.

        Bare identifiers without '=' or literal values (e.g., 'city', 'x, y')
        suggest a declaration or documentation reference, not an actual invocation.
        """
        parts = [p.strip() for p in args_str.split(",")]
        return all(re.fullmatch(r"[A-Za-z_]\w*(?:\s*:\s*\w+)?", p) for p in parts if p)

    @classmethod
    def _parse_arguments_string(cls, args_str: str) -> dict[str, Any]:
        """Parse a function arguments string into a dict.

        Handles: key='value', key=123, key=True, key=None, key=[1,2,3]
        Falls back to returning the raw string if parsing fails.
        """
        if not args_str:
            return {}

        arguments: dict[str, Any] = {}
        try:
            fake_dict = f"dict({args_str})"
            tree = ast.parse(fake_dict, mode="eval")
            if isinstance(tree.body, ast.Call):
                for kw in tree.body.keywords:
                    if kw.arg is not None:
                        try:
                            arguments[kw.arg] = ast.literal_eval(kw.value)
                        except (ValueError, SyntaxError):
                            arguments[kw.arg] = ast.unparse(kw.value)
        except (SyntaxError, ValueError):
            arguments = {"_raw": args_str}

        return arguments


def score_ast(value, ground_truth, func_description, subset):
    """`BFCLv4Scorer._score_ast` (ground truth and description as Python objects)."""
    try:
        model_output = json.loads(value) if isinstance(value, str) else value
    except (json.JSONDecodeError, TypeError):
        model_output = []
    has_calls = bool(model_output)
    expected = ground_truth
    if not expected or expected in ({}, []):
        return 1.0 if not has_calls else 0.0
    bfcl_output = []
    for call in model_output if isinstance(model_output, list) else []:
        if not isinstance(call, dict) or "name" not in call:
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, ValueError):
                args = {}
        bfcl_output.append({call["name"]: args})
    language = Language[_SUBSET_LANGUAGE_NAMES.get(subset, "PYTHON")]
    result = ast_checker(
        func_description=func_description or [],
        model_output=bfcl_output,
        possible_answer=expected,
        language=language,
        test_category=subset,
        model_name=_AST_CHECKER_MODEL_NAME,
    )
    return 1.0 if result["valid"] else 0.0


def score_sample(events, subset, functions, ground_truth):
    """One sample's official verdict (1.0 or 0.0) from the SSE payloads the server sent."""
    raw = scoring_output(events)
    if subset in HALLUCINATION_SUBSETS:
        return 0.0 if FunctionCallExtractor.has_native_tool_calls(raw) else 1.0
    extracted = FunctionCallExtractor.extract(raw, default="[]")
    return score_ast(extracted, ground_truth, functions, subset)
