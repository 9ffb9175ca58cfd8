//! The grammar of a reply's tool calls, in llguidance's Lark dialect; the engine enforces it
//! (structured outputs), so every call names an offered tool and its arguments match that
//! tool's `parameters` schema. A reply that must call (`tool_choice` `required` or a named
//! function) is calls only; under `auto` with at least one `strict: true` tool it is free text
//! (which cannot contain `<tool_call>`), or text and then calls, where the strict tools'
//! arguments follow their schema and the others' are any JSON object.
//!
//! One call, or several separated by a newline while parallel calls are on, and nothing else
//! (but the end of the reasoning when the prompt left a `<think>` block open):
//! - JSON form (Hermes-style templates, the generic fallback): `<tool_call>\n{"name": ..,
//!   "arguments": ..}\n</tool_call>`, the object a `%json` schema (one `anyOf` branch per tool).
//! - XML form (Qwen3.5/3.6): `<tool_call>\n<function=NAME>\n` then per parameter
//!   `<parameter=KEY>\nVALUE\n</parameter>\n`, then `</function>\n</tool_call>`. Required parameters come
//!   first in the schema's `required` order, then the optional ones in `properties` order, each
//!   at most once. A value follows its property's type as the XML parser reads it back
//!   (`tools::parse`): strings (and untyped values) are raw text up to `\n</parameter>\n`,
//!   string enums one of their values, integers / numbers / booleans their JSON spelling,
//!   objects and arrays JSON matching the property's schema.

use serde_json::{Value, json};

use super::{ToolChoice, ToolFormat, ToolRequest, tool_name};

/// JSON inside the grammar: one layout, `{"a": 1, "b": [2, 3]}` (free whitespace would let a
/// sampled reply wander until `max_tokens`).
fn compact(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// The grammar for `request` under `format`, or `None` when nothing is enforced.
/// `in_thinking`: the prompt ends inside an open `<think>` block (a reasoning template with
/// thinking on), so a reply that must call first finishes its reasoning (`...</think>` and
/// whitespace).
pub fn call_grammar(
    format: ToolFormat,
    request: &ToolRequest,
    in_thinking: bool,
) -> Option<proto::engine::v1::Grammar> {
    let must_call = matches!(request.choice, ToolChoice::Required | ToolChoice::Named(_));
    let offered = request.offered();
    let strict = |tool: &Value| tool["function"].get("strict") == Some(&Value::Bool(true));
    let strict_auto = request.choice == ToolChoice::Auto && offered.iter().any(strict);
    if !(must_call || strict_auto) {
        return None;
    }
    let tools: Vec<(String, Value)> = offered
        .iter()
        .filter_map(|tool| {
            let name = tool_name(tool)?.to_owned();
            let parameters = match tool["function"].get("parameters") {
                // Under `auto`, only `strict` tools' arguments are held to their schema.
                Some(p @ Value::Object(_)) if must_call || strict(tool) => p.clone(),
                _ => json!({"type": "object"}),
            };
            Some((name, parameters))
        })
        .collect();
    if tools.is_empty() {
        return None;
    }
    let more = if request.parallel { " (\"\\n\" tool_call)*" } else { "" };
    // A newline may follow the last call, so a model that ends its call with one can still stop
    // there instead of being pushed into another call.
    let start = if !must_call {
        // Free text, or text and then calls. The text cannot contain `<tool_call>`, so a call,
        // once begun, must be whole and valid.
        format!(
            "start: TEXT | before call_body{more} \"\\n\"?\n\
             TEXT: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/\n\
             before[suffix=\"<tool_call>\"]: /(?s:.*)/\n"
        )
    } else if in_thinking {
        // The reasoning is required when it is open, and absent otherwise: an optional free-text
        // prefix would be read as reasoning while the model writes its call (the lexer cannot
        // tell them apart until `</think>`), and the call would never complete.
        format!("start: thinking /\\s+/ tool_call{more} \"\\n\"?\nthinking[suffix=\"</think>\"]: /(?s:.*)/\n")
    } else {
        format!("start: tool_call{more} \"\\n\"?\n")
    };
    let calls = match format {
        ToolFormat::Xml => xml_form(&tools),
        ToolFormat::Json | ToolFormat::Generic => json_form(&tools),
    };
    let lark = format!("{start}tool_call: \"<tool_call>\" call_body\n{calls}");
    Some(proto::engine::v1::Grammar { kind: Some(proto::engine::v1::grammar::Kind::Lark(lark)) })
}

fn json_form(tools: &[(String, Value)]) -> String {
    let calls: Vec<Value> = tools
        .iter()
        .map(|(name, parameters)| {
            json!({"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let schema = compact(json!({ "anyOf": calls }));
    format!("call_body: \"\\n\" %json {schema} \"\\n</tool_call>\"\n")
}

/// A Lark string literal of `s`.
fn literal(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

fn xml_form(tools: &[(String, Value)]) -> String {
    let mut rules = Vec::new();
    let mut functions = Vec::new();
    for (i, (name, parameters)) in tools.iter().enumerate() {
        let properties = parameters.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required: Vec<&str> = parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).filter(|k| properties.contains_key(*k)).collect())
            .unwrap_or_default();
        let optional = properties.keys().filter(|k| !required.contains(&k.as_str()));
        let mut body = Vec::new();
        for (j, (key, optional)) in
            required.iter().map(|k| (*k, false)).chain(optional.map(|k| (k.as_str(), true))).enumerate()
        {
            let rule = format!("p{i}_{j}");
            let value = xml_value(&properties[key]);
            rules.push(format!("{rule}: {} {value}", literal(&format!("<parameter={key}>\n"))));
            body.push(if optional { format!("{rule}?") } else { rule });
        }
        let rule = format!("f{i}");
        rules.push(format!(
            "{rule}: {} {} \"</function>\\n\"",
            literal(&format!("<function={name}>\n")),
            body.join(" ")
        ));
        functions.push(rule);
    }
    let mut lark = format!(
        "call_body: \"\\n\" ({}) \"</tool_call>\"\n\
         text_value[suffix=\"\\n</parameter>\\n\"]: /(?s:.*)/\n",
        functions.join(" | ")
    );
    for rule in rules {
        lark.push_str(&rule);
        lark.push('\n');
    }
    lark
}

const END: &str = "\"\\n</parameter>\\n\"";

/// The grammar of one parameter's value and its closing tag.
fn xml_value(schema: &Value) -> String {
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.is_empty()
        && options.iter().all(Value::is_string)
    {
        let options: Vec<String> = options.iter().filter_map(Value::as_str).map(literal).collect();
        return format!("({}) {END}", options.join(" | "));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => format!("/-?(0|[1-9][0-9]*)/ {END}"),
        Some("number") => format!("/-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/ {END}"),
        Some("boolean") => format!("(\"true\" | \"false\") {END}"),
        Some("object" | "array") => format!("%json {} {END}", compact(schema.clone())),
        _ => "text_value".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use llguidance::api::TopLevelGrammar;
    use llguidance::toktrie::ApproximateTokEnv;
    use llguidance::{Matcher, ParserFactory};

    use super::*;

    fn request(choice: ToolChoice, parallel: bool) -> ToolRequest {
        let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]},
                "hourly": {"type": "boolean"}, "spots": {"type": "array", "items": {"type": "string"}}},
            "required": ["city", "days"]}}});
        let time = json!({"type": "function", "function": {"name": "get_time"}});
        ToolRequest { tools: vec![weather, time], choice, parallel }
    }

    /// Whether the grammar accepts `text` whole (fed byte by byte, then end of sequence).
    fn accepts(grammar: &proto::engine::v1::Grammar, text: &str) -> bool {
        let Some(proto::engine::v1::grammar::Kind::Lark(lark)) = &grammar.kind else { panic!("{grammar:?}") };
        let env = ApproximateTokEnv::single_byte_env();
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.quiet();
        let parser =
            factory.create_parser(TopLevelGrammar::from_lark(lark.clone())).unwrap_or_else(|e| panic!("{e}\n{lark}"));
        let mut m = Matcher::new(Ok(parser));
        for token in env.tokenize_bytes(text.as_bytes()) {
            if m.consume_token(token).is_err() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }

    const XML_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan <b>Francisco</b>\nCA\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\nC\n</parameter>\n<parameter=spots>\n[\"pier\", \"park\"]\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn xml_calls_with_typed_values_are_accepted_and_others_are_not() {
        let g = call_grammar(ToolFormat::Xml, &request(ToolChoice::Required, true), false).unwrap();
        assert!(accepts(&g, XML_CALL));
        let thinking = call_grammar(ToolFormat::Xml, &request(ToolChoice::Required, true), true).unwrap();
        assert!(accepts(&thinking, &format!("Let me look.\n</think>\n\n{XML_CALL}")));
        assert!(!accepts(&thinking, XML_CALL) && !accepts(&g, &format!("x</think>\n{XML_CALL}")));
        let time = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
        assert!(accepts(&g, &format!("{XML_CALL}\n{time}")) && accepts(&g, &format!("{XML_CALL}\n")));
        for bad in [
            XML_CALL.replace("\n3\n", "\nthree\n"),
            XML_CALL.replace("\nC\n", "\nK\n"),
            XML_CALL.replace("<parameter=days>\n3\n</parameter>\n", ""),
            XML_CALL.replace("get_weather", "get_wether"),
            XML_CALL.replace("[\"pier\", \"park\"]", "[pier]"),
            "It is sunny.".to_owned(),
        ] {
            assert!(!accepts(&g, &bad), "{bad}");
        }
        let one = call_grammar(ToolFormat::Xml, &request(ToolChoice::Required, false), false).unwrap();
        assert!(!accepts(&one, &format!("{XML_CALL}\n{time}")));
        let named = call_grammar(ToolFormat::Xml, &request(ToolChoice::Named("get_time".into()), true), false).unwrap();
        assert!(accepts(&named, time) && !accepts(&named, XML_CALL));
    }

    #[test]
    fn strict_tools_under_auto_allow_text_or_whole_valid_calls() {
        let mut r = request(ToolChoice::Auto, true);
        assert!(call_grammar(ToolFormat::Xml, &r, false).is_none(), "nothing strict, nothing enforced");
        r.tools[0]["function"]["strict"] = json!(true);
        let xml = call_grammar(ToolFormat::Xml, &r, true).unwrap();
        assert!(accepts(&xml, "It is sunny in Paris."));
        assert!(accepts(&xml, &format!("Let me check.</think>\n\n{XML_CALL}")));
        assert!(!accepts(&xml, &XML_CALL.replace("\n3\n", "\nthree\n")));
        assert!(!accepts(&xml, "Sure: <tool_call>\n<function=get_weather>\n"), "a call once begun must be whole");
        let json_form = call_grammar(ToolFormat::Generic, &r, false).unwrap();
        let call =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
        assert!(accepts(&json_form, "No call needed.") && accepts(&json_form, &format!("Checking.\n{call}")));
        assert!(!accepts(&json_form, &call.replace("\"days\": 2", "\"days\": \"two\"")));
        // The tool that is not strict takes any object.
        let other = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"anything\": [1]}}\n</tool_call>";
        assert!(accepts(&json_form, other));
    }

    #[test]
    fn json_calls_are_accepted_and_others_are_not() {
        let g = call_grammar(ToolFormat::Json, &request(ToolChoice::Required, true), false).unwrap();
        let call =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
        assert!(accepts(&g, call));
        assert!(accepts(
            &g,
            &format!("{call}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>")
        ));
        assert!(!accepts(&g, &call.replace("\"days\": 2", "\"days\": \"two\"")));
        assert!(!accepts(&g, &call.replace(", \"days\": 2", "")));
        assert!(!accepts(&g, "Sure."));
        assert!(call_grammar(ToolFormat::Generic, &request(ToolChoice::Auto, true), false).is_none());
    }
}
