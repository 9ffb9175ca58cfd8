//! The inline "Intersection over Union" accuracy of the replay (spec 4.5).
//!
//! Contract: `executables(turn)` turns an assistant turn (recorded row or model reply, in
//! OpenAI shape with `tool_calls`) into the multiset of canonical shell executables of its
//! `bash` calls; `iou(expected, got)` is the multiset IoU. Prose is ignored; executables not in
//! the alias table are dropped. Turns whose expected list is empty are not scorable.

use std::collections::HashMap;

use serde_json::Value;

/// Alias table of spec 4.5: input → canonical.
const ALIASES: &[(&str, &str)] = &[
    ("python", "python"),
    ("python2", "python"),
    ("python3", "python"),
    ("py", "python"),
    ("pip", "pip"),
    ("pip3", "pip"),
    ("pytest", "pytest"),
    ("pylint", "pylint"),
    ("sphinx-build", "sphinx"),
    ("sphinx-quickstart", "sphinx"),
    ("cython", "cython"),
    ("make", "make"),
    ("conda", "conda"),
    ("cat", "cat"),
    ("less", "cat"),
    ("more", "cat"),
    ("head", "head"),
    ("tail", "tail"),
    ("wc", "wc"),
    ("diff", "diff"),
    ("grep", "grep"),
    ("egrep", "grep"),
    ("fgrep", "grep"),
    ("rg", "grep"),
    ("ag", "grep"),
    ("sed", "sed"),
    ("awk", "awk"),
    ("gawk", "awk"),
    ("tr", "tr"),
    ("sort", "sort"),
    ("uniq", "uniq"),
    ("cut", "cut"),
    ("find", "find"),
    ("locate", "find"),
    ("ls", "ls"),
    ("xargs", "xargs"),
    ("cp", "cp"),
    ("mv", "mv"),
    ("rm", "rm"),
    ("mkdir", "mkdir"),
    ("touch", "touch"),
    ("tee", "tee"),
    ("source", "source"),
    (".", "source"),
    ("which", "which"),
    ("alias", "alias"),
    ("unset", "unset"),
    ("export", "export"),
    ("git", "git"),
    ("curl", "curl"),
    ("wget", "curl"),
    ("true", "true"),
    ("false", "false"),
    ("timeout", "timeout"),
    ("date", "date"),
    ("apt-get", "apt"),
    ("apt", "apt"),
    ("yum", "yum"),
];

const WRAPPERS: &[&str] = &["env", "time", "nice", "sudo", "exec", "command"];

/// Replace every quoted span ('…', "…" with backslash escapes, `…`) by one space.
/// An unterminated quote is left as a plain character.
fn strip_quotes(cmd: &str) -> String {
    let chars: Vec<char> = cmd.chars().collect();
    let mut out = String::with_capacity(cmd.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let end = match c {
            '\'' | '`' => chars[i + 1..].iter().position(|&d| d == c).map(|p| i + 1 + p),
            '"' => {
                // `"(?:[^"\\]|\\.)*"`: `.` does not match a newline, so a backslash before a
                // newline (or at the end) ends the attempt and the quote stays a plain character.
                let mut j = i + 1;
                let mut found = None;
                while j < chars.len() {
                    match chars[j] {
                        '\\' if chars.get(j + 1).is_some_and(|&n| n != '\n') => j += 2,
                        '\\' => break,
                        '"' => {
                            found = Some(j);
                            break;
                        }
                        _ => j += 1,
                    }
                }
                found
            }
            _ => None,
        };
        match end {
            Some(e) => {
                out.push(' ');
                i = e + 1;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Split on `||`, `|`, `&&`, `;` and newlines, longest operator first.
fn split_stages(s: &str) -> Vec<&str> {
    let mut stages = Vec::new();
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let two = bytes.get(i..i + 2);
        let width = if two == Some(b"||") || two == Some(b"&&") {
            2
        } else if matches!(bytes[i], b'|' | b';' | b'\n') {
            1
        } else {
            0
        };
        if width > 0 {
            stages.push(&s[start..i]);
            i += width;
            start = i;
        } else {
            i += 1;
        }
    }
    stages.push(&s[start..]);
    stages
}

fn is_env_assignment(tok: &str) -> bool {
    let Some((name, _)) = tok.split_once('=') else { return false };
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Strip a trailing `.N` or `.N.N` version suffix (`python3.11` → `python3`).
fn strip_version(tok: &str) -> &str {
    let mut s = tok;
    for _ in 0..2 {
        match s.rsplit_once('.') {
            Some((head, tail)) if !head.is_empty() && !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
                s = head
            }
            _ => break,
        }
    }
    s
}

/// Canonical executables of one shell command, in order.
pub fn command_executables(cmd: &str) -> Vec<&'static str> {
    let cleaned = strip_quotes(cmd);
    let mut out = Vec::new();
    for stage in split_stages(&cleaned) {
        let mut toks = stage.split_whitespace();
        let first = loop {
            match toks.next() {
                Some(t) if is_env_assignment(t) || WRAPPERS.contains(&t) => continue,
                other => break other,
            }
        };
        let Some(tok) = first else { continue };
        let base = tok.rsplit('/').next().unwrap_or(tok).to_lowercase();
        let base = strip_version(&base);
        if let Some((_, canon)) = ALIASES.iter().find(|(k, _)| *k == base) {
            out.push(*canon);
        }
    }
    out
}

/// Executables of all `bash` tool calls of an assistant turn (recorded row or reply).
pub fn executables(turn: &Value) -> Vec<&'static str> {
    let mut out = Vec::new();
    let Some(calls) = turn.get("tool_calls").and_then(Value::as_array) else { return out };
    for call in calls {
        let Some(f) = call.get("function") else { continue };
        if f.get("name").and_then(Value::as_str) != Some("bash") {
            continue;
        }
        let args = match f.get("arguments") {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v) => v,
                Err(_) => continue,
            },
            Some(v @ Value::Object(_)) => v.clone(),
            _ => continue,
        };
        // `args.get("command") or args.get("cmd")`: a falsy command ("", null, 0, [], {})
        // falls back to `cmd`.
        let cmd = args.get("command").filter(|v| py_truthy(v)).or_else(|| args.get("cmd")).and_then(Value::as_str);
        if let Some(cmd) = cmd {
            out.extend(command_executables(cmd));
        }
    }
    out
}

/// Python truthiness of a JSON value.
fn py_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Multiset IoU: |A ∩ B| / |A ∪ B| with min/max counts. Both empty gives 1.
pub fn iou(a: &[&str], b: &[&str]) -> f64 {
    let mut ca: HashMap<&str, usize> = HashMap::new();
    let mut cb: HashMap<&str, usize> = HashMap::new();
    a.iter().for_each(|x| *ca.entry(x).or_default() += 1);
    b.iter().for_each(|x| *cb.entry(x).or_default() += 1);
    let (mut inter, mut union) = (0usize, 0usize);
    for k in ca.keys().chain(cb.keys().filter(|k| !ca.contains_key(*k))) {
        let (x, y) = (ca.get(k).copied().unwrap_or(0), cb.get(k).copied().unwrap_or(0));
        inter += x.min(y);
        union += x.max(y);
    }
    if union == 0 { 1.0 } else { inter as f64 / union as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(cmd: &str) -> Value {
        json!({"tool_calls": [{"function": {"name": "bash",
            "arguments": serde_json::to_string(&json!({"command": cmd})).unwrap()}}]})
    }

    #[test]
    fn hand_made_commands() {
        assert_eq!(command_executables("cd /repo && python3.11 -m pytest -q"), vec!["python"]);
        assert_eq!(command_executables("grep -rn 'a | b; sed' . | head -5"), vec!["grep", "head"]);
        assert_eq!(command_executables("echo \"x && rm \\\" y\" | wc -l"), vec!["wc"]);
        assert_eq!(command_executables("sudo apt-get install -y foo"), vec!["apt"]);
        assert_eq!(command_executables("FOO=1 BAR=x env time /usr/bin/Python3 t.py"), vec!["python"]);
        assert_eq!(command_executables("unknowncmd x; ls || true"), vec!["ls", "true"]);
        assert_eq!(command_executables("cat <<EOF > f.py\nimport os\ncat x\nEOF"), vec!["cat", "cat"]);
        assert_eq!(command_executables("source venv/bin/activate; . env.sh"), vec!["source", "source"]);
        assert_eq!(command_executables("`which python` x"), Vec::<&str>::new());
        assert_eq!(command_executables("pip3.10 install x"), vec!["pip"]);
        assert_eq!(command_executables("it's unterminated; ls"), vec!["ls"]);
    }

    #[test]
    fn a_backslash_before_a_newline_does_not_continue_a_double_quoted_span() {
        // The official regex cannot cross `\<newline>`: the `"` is a plain character, so the
        // text after it is split and scanned (`rm` is found); a `\"` inside quotes is skipped.
        assert_eq!(command_executables("echo \"a\\\nrm b\""), vec!["rm"]);
        assert_eq!(command_executables("echo \"a\\\" && rm b\"; ls"), vec!["ls"]);
        assert_eq!(command_executables("echo \"a\\"), Vec::<&str>::new());
    }

    #[test]
    fn an_empty_command_falls_back_to_cmd() {
        let with = |args: Value| json!({"tool_calls": [{"function": {"name": "bash", "arguments": args.to_string()}}]});
        assert_eq!(executables(&with(json!({"command": "", "cmd": "ls"}))), vec!["ls"]);
        assert_eq!(executables(&with(json!({"command": null, "cmd": "git status"}))), vec!["git"]);
        assert_eq!(executables(&with(json!({"command": "cat x", "cmd": "ls"}))), vec!["cat"]);
        // A truthy non-string command is used, and is not a string: nothing.
        assert!(executables(&with(json!({"command": 5, "cmd": "ls"}))).is_empty());
        // A call without a `function` object is not read.
        assert!(
            executables(&json!({"tool_calls": [{"name": "bash", "arguments": "{\"command\": \"ls\"}"}]})).is_empty()
        );
    }

    #[test]
    fn multiset_iou() {
        assert_eq!(iou(&["grep", "grep", "sed"], &["grep", "sed"]), 2.0 / 3.0);
        assert_eq!(iou(&["python"], &[]), 0.0);
        assert_eq!(iou(&["python", "git"], &["git", "python"]), 1.0);
        assert_eq!(iou(&["cat"], &["head"]), 0.0);
    }

    #[test]
    fn reply_shapes() {
        assert_eq!(executables(&call("ls -la")), vec!["ls"]);
        let dict_args = json!({"tool_calls": [{"function": {"name": "bash", "arguments": {"cmd": "git diff"}}}]});
        assert_eq!(executables(&dict_args), vec!["git"]);
        let other = json!({"tool_calls": [{"function": {"name": "python", "arguments": "{\"command\":\"ls\"}"}}]});
        assert!(executables(&other).is_empty());
        let bad = json!({"tool_calls": [{"function": {"name": "bash", "arguments": "{not json"}}]});
        assert!(executables(&bad).is_empty());
        assert!(executables(&json!({"content": "ls -la"})).is_empty());
    }

    /// `tests/fixtures/official_iou_actions.jsonl` holds, for every recorded assistant row with
    /// tool calls, the actions of the official `AgenticInferenceInlineScorer._bash_actions`
    /// (mlcommons/endpoints ea332753, run by Python on the dataset).
    #[test]
    fn recorded_turns_give_the_official_scorers_executables() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/official_iou_actions.jsonl");
        let text = std::fs::read_to_string(path).expect("fixture");
        let official: HashMap<(String, u64), Vec<String>> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).expect("json line");
                let key =
                    (v["conversation_id"].as_str().unwrap_or_default().to_string(), v["turn"].as_u64().unwrap_or(0));
                let actions = v["actions"].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from);
                (key, actions.collect())
            })
            .collect();
        let d = crate::dataset::tests_support::real();
        let mut compared = 0;
        for c in &d.conversations {
            for t in &c.turns {
                let key = (c.id.clone(), t.expected["turn"].as_u64().unwrap_or(0));
                let Some(want) = official.get(&key) else { continue };
                assert_eq!(&executables(&t.expected), want, "{key:?}");
                compared += 1;
            }
        }
        assert_eq!(compared, official.len());
    }

    #[test]
    fn recorded_answers_score_one_against_themselves() {
        let d = crate::dataset::tests_support::real();
        let mut scorable = 0;
        let mut excluded = Vec::new();
        for c in &d.conversations {
            for t in &c.turns {
                let e = executables(&t.expected);
                if e.is_empty() {
                    excluded.push((c.id.clone(), t.expected["turn"].as_u64().unwrap_or(0)));
                    continue;
                }
                scorable += 1;
                assert_eq!(iou(&e, &e), 1.0);
            }
        }
        assert_eq!(scorable, 1006);
        assert_eq!(excluded, vec![("astropy__astropy-12907".to_string(), 18)]);
    }
}
