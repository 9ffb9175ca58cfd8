//! The Edge Agentic replay dataset (spec 4.1-4.2): load, check, and build teacher-forced requests.
//!
//! Contract: `Dataset::load(path, check_sha)` reads the JSONL (one row per message), verifies the
//! SHA-256 when asked, groups rows by `conversation_id` in file order and sorts each group by
//! `turn`. Every client row (user or tool) becomes one `Turn` whose request messages are
//! `[system] + every recorded row before it + the row itself`, built only from the recorded data:
//! the model's replies are never fed back. Assistant rows are sent without a `content` key.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::sha256;

/// SHA-256 of `agentic_coding_2.5h.jsonl` at the pinned endpoints commit (spec 4.1).
pub const DATASET_SHA256: &str = "b7da8c4ffbe1cabd79c4d8169e5201541e006364b4bfc016d01d893e20ee6f70";

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("dataset SHA-256 is {actual}, expected {expected} (pass --no-sha-check to accept)")]
    Sha { actual: String, expected: String },
    #[error("line {line}: {msg}")]
    Row { line: usize, msg: String },
    #[error("conversation {conv}: {msg}")]
    Shape { conv: String, msg: String },
}

/// One request of the replay and the recorded answer that follows it.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The dataset `turn` number of the client row this request ends with.
    pub dataset_turn: u64,
    /// How many of the conversation's `history` messages this request carries.
    pub history_len: usize,
    /// The recorded assistant row that answers this request (scoring only).
    pub expected: Value,
}

/// One recorded trajectory.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: String,
    pub system: Option<String>,
    pub tools: Value,
    /// Every recorded message in wire form, system excluded (tool rows already expanded).
    pub history: Vec<Value>,
    pub turns: Vec<Turn>,
}

impl Conversation {
    /// The `messages` array of request `turn_idx` (teacher forcing: recorded history only).
    pub fn messages(&self, turn_idx: usize) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(sys) = &self.system {
            out.push(json!({"role": "system", "content": sys}));
        }
        let n = self.turns.get(turn_idx).map_or(0, |t| t.history_len);
        out.extend(self.history[..n].iter().cloned());
        out
    }
}

#[derive(Debug, Clone)]
pub struct Dataset {
    pub sha256: String,
    pub conversations: Vec<Conversation>,
}

impl Dataset {
    pub fn load(path: &Path, check_sha: bool) -> Result<Dataset, DatasetError> {
        let bytes =
            std::fs::read(path).map_err(|source| DatasetError::Io { path: path.display().to_string(), source })?;
        let sha = sha256::hex_digest(&bytes);
        if check_sha && sha != DATASET_SHA256 {
            return Err(DatasetError::Sha { actual: sha, expected: DATASET_SHA256.into() });
        }
        let text = String::from_utf8_lossy(&bytes);
        let mut order: Vec<String> = Vec::new();
        let mut groups: HashMap<String, Vec<(u64, Value)>> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let row: Value =
                serde_json::from_str(line).map_err(|e| DatasetError::Row { line: i + 1, msg: e.to_string() })?;
            let conv = row
                .get("conversation_id")
                .and_then(Value::as_str)
                .ok_or_else(|| DatasetError::Row { line: i + 1, msg: "no conversation_id".into() })?
                .to_string();
            let turn = row
                .get("turn")
                .and_then(Value::as_u64)
                .ok_or_else(|| DatasetError::Row { line: i + 1, msg: "no turn".into() })?;
            if !groups.contains_key(&conv) {
                order.push(conv.clone());
            }
            groups.entry(conv).or_default().push((turn, row));
        }
        let mut conversations = Vec::with_capacity(order.len());
        for id in order {
            let mut rows = groups.remove(&id).unwrap_or_default();
            rows.sort_by_key(|(t, _)| *t);
            conversations.push(build_conversation(id, rows)?);
        }
        Ok(Dataset { sha256: sha, conversations })
    }

    pub fn total_turns(&self) -> usize {
        self.conversations.iter().map(|c| c.turns.len()).sum()
    }
}

/// A recorded assistant row in wire form: `content` omitted, reasoning and tool calls kept.
fn assistant_message(row: &Value) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    if let Some(c) = row.get("content").filter(|v| !v.is_null()) {
        m.insert("content".into(), c.clone());
    }
    if let Some(r) = row.get("reasoning_content").filter(|v| !v.is_null()) {
        m.insert("reasoning_content".into(), r.clone());
    }
    if let Some(tc) = row.get("tool_calls").filter(|v| !v.is_null()) {
        m.insert("tool_calls".into(), tc.clone());
    }
    Value::Object(m)
}

fn build_conversation(id: String, rows: Vec<(u64, Value)>) -> Result<Conversation, DatasetError> {
    let shape = |msg: String| DatasetError::Shape { conv: id.clone(), msg };
    let mut system = None;
    let mut tools = Value::Null;
    let mut history: Vec<Value> = Vec::new();
    // (dataset turn, history length) of each client row, waiting for its assistant answer.
    let mut pending: Option<(u64, usize)> = None;
    let mut turns = Vec::new();
    for (turn, row) in rows {
        let role = row.get("role").and_then(Value::as_str).unwrap_or("");
        match role {
            "user" => {
                if let Some(s) = row.get("system").and_then(Value::as_str) {
                    system = Some(s.to_string());
                }
                if let Some(t) = row.get("tools").filter(|v| !v.is_null()) {
                    tools = t.clone();
                }
                let content = row.get("content").cloned().unwrap_or(json!(""));
                history.push(json!({"role": "user", "content": content}));
                pending = Some((turn, history.len()));
            }
            "tool" => {
                let results = row
                    .get("tool_results")
                    .and_then(Value::as_array)
                    .ok_or_else(|| shape(format!("turn {turn}: tool row without tool_results")))?;
                for r in results {
                    history.push(json!({
                        "role": "tool",
                        "tool_call_id": r.get("tool_call_id").cloned().unwrap_or(Value::Null),
                        "content": r.get("content").cloned().unwrap_or(json!("")),
                    }));
                }
                pending = Some((turn, history.len()));
            }
            "assistant" => {
                let (dataset_turn, history_len) =
                    pending.take().ok_or_else(|| shape(format!("turn {turn}: assistant row without a request")))?;
                turns.push(Turn { dataset_turn, history_len, expected: row.clone() });
                history.push(assistant_message(&row));
            }
            other => return Err(shape(format!("turn {turn}: unknown role {other:?}"))),
        }
    }
    if let Some((t, _)) = pending {
        return Err(shape(format!("turn {t}: client row without a recorded answer")));
    }
    Ok(Conversation { id, system, tools, history, turns })
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// The real dataset (shipped in `bench/data/`).
    pub(crate) fn real() -> Dataset {
        Dataset::load(Path::new(crate::DEFAULT_DATASET), true).expect("real dataset loads")
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::real;
    use super::*;

    #[test]
    fn real_dataset_shape() {
        let d = real();
        assert_eq!(d.conversations.len(), 20);
        assert_eq!(d.total_turns(), 1007);
        let c = &d.conversations[0];
        assert_eq!(c.id, "django__django-16899");
        assert_eq!(c.turns.len(), 58);
        assert_eq!(d.conversations[9].id, "pallets__flask-5014");
        assert_eq!(d.conversations[9].turns.len(), 27);
        // First request: system + user.
        let m0 = c.messages(0);
        assert_eq!(m0.len(), 2);
        assert_eq!(m0[0]["role"], "system");
        assert!(m0[0]["content"].as_str().unwrap().starts_with("You are a helpful assistant"));
        assert_eq!(m0[1]["role"], "user");
        assert!(m0[1]["content"].as_str().unwrap().starts_with("<pr_description>"));
        // Second request: + recorded assistant (no content key) + tool result.
        let m1 = c.messages(1);
        assert_eq!(m1.len(), 4);
        assert_eq!(m1[2]["role"], "assistant");
        assert!(m1[2].get("content").is_none(), "recorded tool-call turn must omit content");
        assert_eq!(m1[2]["tool_calls"][0]["id"], "functions.bash:0");
        assert_eq!(m1[2]["tool_calls"][0]["function"]["name"], "bash");
        assert!(m1[2]["reasoning_content"].as_str().unwrap().starts_with("We need to modify Django"));
        assert_eq!(m1[3]["role"], "tool");
        assert_eq!(m1[3]["tool_call_id"], "functions.bash:0");
        assert!(m1[3]["content"].as_str().unwrap().starts_with("<returncode>0</returncode>"));
        // Teacher forcing: each request extends the previous one exactly.
        for t in 1..c.turns.len() {
            let prev = c.messages(t - 1);
            let cur = c.messages(t);
            assert_eq!(&cur[..prev.len()], &prev[..]);
            assert_eq!(cur[prev.len()]["role"], "assistant");
        }
        assert_eq!(c.tools[0]["function"]["name"], "bash");
    }

    #[test]
    fn tool_rows_with_two_results_expand() {
        let d = real();
        let mut found = 0;
        for c in &d.conversations {
            for (i, t) in c.turns.iter().enumerate().skip(1) {
                let prev = c.turns[i - 1].history_len;
                // assistant message + n tool messages
                let tools = t.history_len - prev - 1;
                assert!(tools >= 1);
                if tools == 2 {
                    found += 1;
                    let m = c.messages(i);
                    assert_eq!(m[m.len() - 1]["role"], "tool");
                    assert_eq!(m[m.len() - 2]["role"], "tool");
                    assert_ne!(m[m.len() - 1]["tool_call_id"], m[m.len() - 2]["tool_call_id"]);
                }
            }
        }
        assert_eq!(found, 5);
    }

    #[test]
    fn rejects_bad_sha_and_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        std::fs::write(&p, "{\"conversation_id\":\"a\",\"turn\":1,\"role\":\"user\",\"content\":\"x\"}\n").unwrap();
        assert!(matches!(Dataset::load(&p, true), Err(DatasetError::Sha { .. })));
        assert!(matches!(Dataset::load(&p, false), Err(DatasetError::Shape { .. })));
        std::fs::write(&p, "not json\n").unwrap();
        assert!(matches!(Dataset::load(&p, false), Err(DatasetError::Row { line: 1, .. })));
    }
}
