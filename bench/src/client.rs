//! A streaming OpenAI `/v1/chat/completions` client that times one request.
//!
//! Contract: `ChatClient::stream_chat(body, session_id, t0)` POSTs `body` (already holding
//! `stream: true`), reads the SSE stream to its end and returns the merged reply with the issue,
//! first-token and completion times in seconds since `t0`. Tool-call deltas are merged per
//! `index` (name taken, `arguments` concatenated). Any HTTP error, error event, malformed chunk
//! or a turn longer than the timeout is an error. "First token" is the first chunk that carries
//! output (content, reasoning or a tool-call delta), not a role-only preamble chunk.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("status {status}: {body}")]
    Status { status: u16, body: String },
    #[error("server error event: {0}")]
    Event(String),
    #[error("bad chunk: {0}")]
    Chunk(String),
    #[error("turn timed out after {0:?}")]
    Timeout(Duration),
    #[error("stream ended without [DONE] or finish_reason")]
    Truncated,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// The merged reply of one streamed request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// llama-server's `timings` object, when the server sends one.
    pub server_timings: Option<Value>,
    pub chunks: usize,
    /// Chunks that carried content, reasoning or a tool-call delta (an OSL estimate for
    /// servers that send no usage; one token per chunk is typical).
    #[serde(default)]
    pub output_chunks: usize,
    /// The output as it arrived, chunk by chunk (for the official TPOT's "after the first
    /// chunk"); not written to reports.
    #[serde(skip)]
    pub chunk_log: ChunkLog,
}

/// Output deltas in arrival order, kept per kind as the official harness's accumulator does.
#[derive(Debug, Clone, Default)]
pub struct ChunkLog {
    pub content: Vec<String>,
    pub reasoning: Vec<String>,
    pub tool_calls: Vec<Vec<Value>>,
}

/// Merges one tool-call delta into `calls` (sorted by the stream's `index`, kept in `indices`).
fn merge_tool_delta(indices: &mut Vec<u64>, calls: &mut Vec<ToolCall>, tc: &Value) {
    let idx = tc.get("index").and_then(Value::as_u64).unwrap_or(0);
    let pos = match indices.binary_search(&idx) {
        Ok(p) => p,
        Err(p) => {
            indices.insert(p, idx);
            calls.insert(p, ToolCall::default());
            p
        }
    };
    let slot = &mut calls[pos];
    let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(id) = field(tc, "id") {
        slot.id = id;
    }
    if let Some(f) = tc.get("function") {
        if let Some(n) = field(f, "name") {
            slot.name = n;
        }
        if let Some(a) = field(f, "arguments") {
            slot.arguments.push_str(&a);
        }
    }
}

impl Reply {
    /// What arrived after the first output chunk, as the official harness's
    /// `as_message_parts_after_first_chunk` splits it: the first reasoning chunk is "first"
    /// when there is reasoning (all content then counts), else the first content chunk; the
    /// first tool-call delta is dropped only when the reply has neither content nor reasoning.
    pub fn after_first_chunk(&self) -> Reply {
        let log = &self.chunk_log;
        let reasoning = log.reasoning.get(1..).map(|r| r.concat()).unwrap_or_default();
        let content = if !log.reasoning.is_empty() {
            log.content.concat()
        } else {
            log.content.get(1..).map(|c| c.concat()).unwrap_or_default()
        };
        let skip = usize::from(log.content.is_empty() && log.reasoning.is_empty() && !log.tool_calls.is_empty());
        let (mut indices, mut tool_calls) = (Vec::new(), Vec::new());
        for tc in log.tool_calls.iter().skip(skip).flatten() {
            merge_tool_delta(&mut indices, &mut tool_calls, tc);
        }
        Reply { content, reasoning, tool_calls, ..Reply::default() }
    }

    /// True when nothing arrived after the first output chunk (the official TPOT skips it).
    pub fn single_chunk(&self) -> bool {
        let a = self.after_first_chunk();
        a.content.is_empty() && a.reasoning.is_empty() && a.tool_calls.is_empty()
    }

    /// The reply as an OpenAI assistant message (for scoring).
    pub fn as_message(&self) -> Value {
        let calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|c| {
                serde_json::json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        serde_json::json!({"role": "assistant", "content": self.content,
            "reasoning_content": self.reasoning, "tool_calls": calls})
    }
}

/// Times of one request, seconds since the phase start.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Times {
    pub issue_s: f64,
    /// First SSE event of any kind (a role-only preamble counts here).
    #[serde(default)]
    pub first_chunk_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub done_s: f64,
}

/// Accumulates SSE chunks into a `Reply`; separate from I/O so it can be tested.
#[derive(Debug, Default)]
pub struct Merger {
    pub reply: Reply,
    pub done: bool,
    /// Set by `push_event` when this event carried output for the first time.
    saw_output: bool,
    /// The stream's `index` of each entry of `reply.tool_calls` (sorted).
    tool_call_indices: Vec<u64>,
}

impl Merger {
    /// Feed one SSE `data:` payload. Returns true when it carried output (first-token marker).
    pub fn push_event(&mut self, data: &str) -> Result<bool, ClientError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(false);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| ClientError::Chunk(format!("{e}: {data}")))?;
        if let Some(err) = v.get("error") {
            return Err(ClientError::Event(err.to_string()));
        }
        self.reply.chunks += 1;
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.reply.usage = Some(Usage {
                prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64),
                completion_tokens: u.get("completion_tokens").and_then(Value::as_u64),
                cached_tokens: u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64),
            });
        }
        if let Some(t) = v.get("timings").filter(|t| t.is_object()) {
            self.reply.server_timings = Some(t.clone());
        }
        // As the official harness's accumulator: the first choice only; a delta's content wins
        // over its reasoning (`reasoning_content`, else vLLM's `reasoning`), which is then
        // dropped; tool-call deltas merge by `index` (default 0): `id` and `name` replaced when
        // non-empty, `arguments` appended.
        let mut output = false;
        let choice = v.pointer("/choices/0").cloned().unwrap_or(Value::Null);
        if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str).filter(|f| !f.is_empty()) {
            self.reply.finish_reason = Some(fr.to_string());
        }
        let delta = choice.get("delta").cloned().unwrap_or(Value::Null);
        let text = |key: &str| delta.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        if let Some(s) = text("content") {
            output = true;
            self.reply.content.push_str(s);
            self.reply.chunk_log.content.push(s.to_string());
        } else if let Some(s) = text("reasoning_content").or_else(|| text("reasoning")) {
            output = true;
            self.reply.reasoning.push_str(s);
            self.reply.chunk_log.reasoning.push(s.to_string());
        }
        if let Some(tcs) = delta.get("tool_calls").and_then(Value::as_array).filter(|a| !a.is_empty()) {
            output = true;
            self.reply.chunk_log.tool_calls.push(tcs.clone());
            for tc in tcs {
                merge_tool_delta(&mut self.tool_call_indices, &mut self.reply.tool_calls, tc);
            }
        }
        self.reply.output_chunks += usize::from(output);
        let first = output && !self.saw_output;
        self.saw_output |= output;
        Ok(first)
    }
}

#[derive(Debug, Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
    timeout: Duration,
}

impl ChatClient {
    /// `base` is the API root, e.g. `http://127.0.0.1:8090/v1`; a bare server address
    /// (`http://127.0.0.1:8090`, as the official harness takes it) means its `/v1`.
    pub fn new(base: &str, api_key: Option<String>, timeout: Duration) -> Result<Self, ClientError> {
        // One connection, reused: the reference client runs 1 worker / 1 connection.
        let http = reqwest::Client::builder().pool_max_idle_per_host(1).build()?;
        let url = format!("{}/chat/completions", api_root(base));
        Ok(ChatClient { http, url, api_key, timeout })
    }

    pub async fn stream_chat(
        &self,
        body: &Value,
        session_id: Option<&str>,
        t0: Instant,
    ) -> Result<(Reply, Times), ClientError> {
        let issue = Instant::now();
        let mut times = Times { issue_s: (issue - t0).as_secs_f64(), ..Times::default() };
        let fut = async {
            let mut req = self.http.post(&self.url).json(body);
            if let Some(s) = session_id {
                req = req.header("X-Session-ID", s);
            }
            if let Some(k) = &self.api_key {
                req = req.bearer_auth(k);
            }
            let resp = req.send().await?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().await.unwrap_or_default();
                return Err(ClientError::Status { status: status.as_u16(), body });
            }
            let mut merger = Merger::default();
            let mut buf: Vec<u8> = Vec::new();
            let mut stream = resp.bytes_stream();
            'outer: while let Some(chunk) = stream.next().await {
                buf.extend_from_slice(&chunk?);
                while let Some((end, sep)) = find_event_end(&buf) {
                    let event: Vec<u8> = buf.drain(..end + sep).collect();
                    let text = String::from_utf8_lossy(&event[..end]);
                    for line in text.lines() {
                        let Some(data) = line.strip_prefix("data:") else { continue };
                        if times.first_chunk_s.is_none() {
                            times.first_chunk_s = Some((Instant::now() - t0).as_secs_f64());
                        }
                        if merger.push_event(data)? && times.first_token_s.is_none() {
                            times.first_token_s = Some((Instant::now() - t0).as_secs_f64());
                        }
                        if merger.done {
                            break 'outer;
                        }
                    }
                }
            }
            if !merger.done && merger.reply.finish_reason.is_none() {
                return Err(ClientError::Truncated);
            }
            Ok(merger.reply)
        };
        let reply = tokio::time::timeout(self.timeout, fut).await.map_err(|_| ClientError::Timeout(self.timeout))??;
        times.done_s = (Instant::now() - t0).as_secs_f64();
        Ok((reply, times))
    }

    /// `GET {base}/models` → the first model id, to fill `model` when not given.
    pub async fn first_model(&self) -> Result<Option<String>, ClientError> {
        let url = self.url.replace("/chat/completions", "/models");
        let v: Value = self.http.get(url).send().await?.error_for_status()?.json().await?;
        Ok(v.pointer("/data/0/id").and_then(Value::as_str).map(str::to_string))
    }
}

/// The API root of an endpoint: unchanged when it has a path, `<server>/v1` when it is only a
/// scheme and authority.
pub fn api_root(base: &str) -> String {
    let b = base.trim_end_matches('/');
    let after_scheme = b.split_once("://").map_or(b, |(_, rest)| rest);
    if after_scheme.contains('/') { b.to_string() } else { format!("{b}/v1") }
}

/// End of the first SSE event in `buf` and the separator width (`\n\n` or `\r\n\r\n`).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_streamed_tool_calls_and_usage() {
        let mut m = Merger::default();
        assert!(!m.push_event(r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#).unwrap());
        assert!(m.push_event(r#"{"choices":[{"delta":{"reasoning_content":"think"}}]}"#).unwrap());
        assert!(!m.push_event(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#).unwrap());
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c0","function":{"name":"bash","arguments":"{\"comm"}}]}}]}"#).unwrap();
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"c1","function":{"name":"bash","arguments":"{}"}}]}}]}"#).unwrap();
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\":\"ls\"}"}}]},"finish_reason":"tool_calls"}]}"#).unwrap();
        m.push_event(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}},"timings":{"prompt_n":2}}"#).unwrap();
        m.push_event("[DONE]").unwrap();
        let r = &m.reply;
        assert!(m.done);
        assert_eq!(r.content, "Hi");
        assert_eq!(r.reasoning, "think");
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            r.tool_calls[0],
            ToolCall { id: "c0".into(), name: "bash".into(), arguments: "{\"command\":\"ls\"}".into() }
        );
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        // reasoning, content and three tool-call deltas; not the role or usage-only chunks.
        assert_eq!(r.output_chunks, 5);
        assert_eq!(
            r.usage,
            Some(Usage { prompt_tokens: Some(10), completion_tokens: Some(5), cached_tokens: Some(8) })
        );
        assert_eq!(r.server_timings.as_ref().unwrap()["prompt_n"], 2);
        assert_eq!(crate::iou::executables(&r.as_message()), vec!["ls"]);
    }

    #[test]
    fn error_events_and_garbage_fail() {
        let mut m = Merger::default();
        assert!(matches!(m.push_event(r#"{"error":{"message":"too long"}}"#), Err(ClientError::Event(_))));
        assert!(matches!(m.push_event("{oops"), Err(ClientError::Chunk(_))));
    }

    #[test]
    fn endpoints_with_or_without_v1() {
        assert_eq!(api_root("http://127.0.0.1:8090"), "http://127.0.0.1:8090/v1");
        assert_eq!(api_root("http://127.0.0.1:8090/"), "http://127.0.0.1:8090/v1");
        assert_eq!(api_root("http://127.0.0.1:8090/v1/"), "http://127.0.0.1:8090/v1");
        assert_eq!(api_root("https://host/api/openai"), "https://host/api/openai");
    }

    #[test]
    fn merges_tool_calls_like_the_official_accumulator() {
        let mut m = Merger::default();
        // Names are replaced, not appended; indices may skip; content wins over reasoning.
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":2,"function":{"name":"f","arguments":"{"}}]}}]}"#)
            .unwrap();
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":2,"function":{"name":"f","arguments":"}"}}]}}]}"#)
            .unwrap();
        m.push_event(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"g"}}]}}]}"#).unwrap();
        m.push_event(r#"{"choices":[{"delta":{"content":"a","reasoning_content":"dropped"}}]}"#).unwrap();
        let r = &m.reply;
        assert_eq!(r.tool_calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["g", "f"]);
        assert_eq!(r.tool_calls[1].arguments, "{}");
        assert_eq!((r.content.as_str(), r.reasoning.as_str()), ("a", ""));
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }
}
