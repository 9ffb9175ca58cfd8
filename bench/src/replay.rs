//! The performance phase (spec 4.2-4.5): serial teacher-forced replay and its figures.
//!
//! Contract: `run(dataset, client, counter, opts)` sends the selected turns strictly one at a
//! time, conversation after conversation, with zero think time (or, with `concurrency` N > 1,
//! N conversations at once, each one turn at a time: a load test, not the reference), and returns a `ReplayReport`
//! holding one `TurnRecord` per selected turn plus the figures. An error or timeout aborts the
//! rest of that conversation (those turns are `aborted`) and marks the run invalid. Turns over
//! the prompt budget are `skipped` before sending and are outside the subset (stated in the
//! report), not failures.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::client::{ChatClient, Reply, Times};
use crate::dataset::Dataset;
use crate::iou;
use crate::stats::Quantiles;
use crate::tokens::TokenCounter;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayOptions {
    pub model: String,
    pub max_completion_tokens: u32,
    /// Also send `max_tokens` (a deviation from the reference body, for servers that ignore
    /// `max_completion_tokens`).
    pub send_max_tokens: bool,
    pub temperature: f64,
    pub seed: u64,
    /// Ask for `usage` in the stream (`stream_options.include_usage`); not in the reference body.
    pub include_usage: bool,
    pub conversations: Option<usize>,
    pub turns_per_conversation: Option<usize>,
    pub max_prompt_tokens: Option<usize>,
    /// Send `"content": ""` on recorded assistant tool-call rows (a deviation from the
    /// reference body, for chat templates that read `message.content` unconditionally, e.g.
    /// llama-cpp-python's Jinja rendering of SmolLM2's template).
    #[serde(default)]
    pub empty_content_on_tool_calls: bool,
    /// Conversations replayed at once (0 or 1: one after another, the reference). Each
    /// conversation still sends one turn at a time.
    #[serde(default)]
    pub concurrency: usize,
    /// Leave out the `X-Session-ID` header (the conversation's id) that turns carry.
    #[serde(default)]
    pub no_session_id: bool,
}

impl ReplayOptions {
    pub fn body(&self, mut messages: Vec<Value>, tools: &Value) -> Value {
        if self.empty_content_on_tool_calls {
            for m in messages.iter_mut().filter(|m| m["role"] == "assistant") {
                if let Some(o) = m.as_object_mut() {
                    o.entry("content").or_insert(json!(""));
                }
            }
        }
        let mut b = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "max_completion_tokens": self.max_completion_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
        });
        if !tools.is_null() {
            b["tools"] = tools.clone();
        }
        if self.send_max_tokens {
            b["max_tokens"] = json!(self.max_completion_tokens);
        }
        if self.include_usage {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Ok,
    Error,
    Aborted,
    Skipped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnRecord {
    pub conversation_id: String,
    /// 0-based request index within the conversation.
    pub request_index: usize,
    pub dataset_turn: u64,
    pub messages: usize,
    pub est_prompt_tokens: usize,
    pub status: TurnStatus,
    pub error: Option<String>,
    pub times: Option<Times>,
    pub ttft_ms: Option<f64>,
    /// Issue → first SSE event of any kind.
    pub first_chunk_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    /// TPOT as the official harness defines it: (done − first chunk) / tokens after the first
    /// chunk; `None` for a reply that arrived in one chunk.
    pub tpot_ms: Option<f64>,
    /// The earlier definition, kept labelled: (done − first chunk) / (OSL − 1), a one-chunk
    /// reply counting about 0.
    #[serde(default)]
    pub tpot_all_ms: Option<f64>,
    /// Output tokens by the client tokenizer (None without one).
    pub output_tokens_client: Option<usize>,
    pub reply: Option<Reply>,
    pub expected_executables: Vec<String>,
    pub model_executables: Vec<String>,
    /// None when the turn has no ground truth (expected list empty).
    pub iou: Option<f64>,
}

impl TurnRecord {
    /// OSL used in the figures: client tokenizer, else the server's completion tokens, else
    /// (a server that sends no usage) the streamed chunks that carried output, one token each.
    pub fn osl(&self) -> Option<u64> {
        self.output_tokens_client.map(|n| n as u64).or_else(|| {
            let r = self.reply.as_ref()?;
            r.usage.as_ref().and_then(|u| u.completion_tokens).or(Some(r.output_chunks as u64))
        })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Figures {
    pub turns_selected: usize,
    pub turns_completed: usize,
    pub turns_failed: usize,
    pub turns_skipped_budget: usize,
    pub wall_s: f64,
    pub window_s: f64,
    pub output_tokens: u64,
    pub output_tokens_server: u64,
    pub tps: f64,
    pub tps_server_usage: f64,
    pub qps: f64,
    pub ttft_ms: Quantiles,
    pub first_chunk_ms: Quantiles,
    /// Official definition (one-chunk replies left out).
    pub tpot_ms: Quantiles,
    /// Earlier definition (OSL − 1, one-chunk replies near 0).
    #[serde(default)]
    pub tpot_all_ms: Quantiles,
    /// Decode speed over the whole run: output tokens after each turn's first, over the time
    /// from first token to done, summed over turns (a long reply weighs more than in a
    /// per-turn TPOT mean).
    #[serde(default)]
    pub decode_tps: f64,
    pub latency_ms: Quantiles,
    pub prompt_tokens_total: u64,
    pub prompt_tokens_cached: u64,
    pub cache_hit_pct: f64,
    pub iou_score: f64,
    pub iou_scorable: usize,
    pub iou_missing: usize,
    pub valid: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayReport {
    pub endpoint: String,
    pub options: ReplayOptions,
    pub dataset_sha256: String,
    pub tokenizer: String,
    pub osl_method: String,
    pub subset: String,
    pub figures: Figures,
    pub turns: Vec<TurnRecord>,
}

/// One-line exact statement of the subset, so two reports can be compared.
pub fn subset_line(opts: &ReplayOptions, counter: &TokenCounter) -> String {
    let convs = opts.conversations.map_or("all 20".to_string(), |n| format!("first {n}"));
    let turns = opts.turns_per_conversation.map_or("all".to_string(), |n| format!("first {n}"));
    let budget = opts.max_prompt_tokens.map_or("none".to_string(), |n| {
        let how = if counter.has_tokenizer() { "client tokenizer" } else { "chars/3" };
        format!("{n} ({how} estimate)")
    });
    format!(
        "conversations: {convs}; turns per conversation: {turns}; prompt budget: {budget}; \
         max_completion_tokens: {}{}{}{}",
        opts.max_completion_tokens,
        if opts.send_max_tokens { " (+max_tokens)" } else { "" },
        if opts.concurrency > 1 { format!("; {} conversations at once", opts.concurrency) } else { String::new() },
        if opts.no_session_id { "; no X-Session-ID" } else { "" }
    )
}

fn strings(v: Vec<&'static str>) -> Vec<String> {
    v.into_iter().map(str::to_string).collect()
}

/// One finished (or failed) request, as handed to the progress hook of [`run_with_progress`].
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// Requests handled so far (including this one) and requests selected in all.
    pub done: usize,
    pub selected: usize,
    pub conversation: usize,
    pub conversations: usize,
    pub conversation_id: &'a str,
    pub request: usize,
    pub requests: usize,
    /// Prompt tokens as the server reported them, else the client estimate.
    pub context_tokens: usize,
    pub context_is_estimate: bool,
    pub ttft_ms: Option<f64>,
    pub output_tokens: Option<u64>,
    /// Output tokens so far over elapsed wall time.
    pub running_tps: f64,
}

impl Progress<'_> {
    /// The one-line form used when no richer display is wanted.
    pub fn line(&self) -> String {
        format!(
            "[{}/{}] conv {}/{} {} req {}/{} ctx {}{} ttft {} ms, {} out tok, running TPS {:.2}",
            self.done,
            self.selected,
            self.conversation,
            self.conversations,
            self.conversation_id,
            self.request,
            self.requests,
            if self.context_is_estimate { "~" } else { "" },
            self.context_tokens,
            self.ttft_ms.map_or("-".into(), |t| format!("{t:.0}")),
            self.output_tokens.map_or("-".into(), |n| n.to_string()),
            self.running_tps,
        )
    }
}

/// [`run_with_progress`] printing one plain line per request to stderr.
pub async fn run(
    dataset: &Dataset,
    client: &ChatClient,
    endpoint: &str,
    counter: &TokenCounter,
    opts: &ReplayOptions,
) -> ReplayReport {
    run_with_progress(dataset, client, endpoint, counter, opts, &|p: &Progress| eprintln!("{}", p.line())).await
}

/// What every conversation of one run shares.
struct RunShared<'a> {
    client: &'a ChatClient,
    counter: &'a TokenCounter,
    opts: &'a ReplayOptions,
    progress: &'a (dyn Fn(&Progress) + Sync),
    t0: Instant,
    selected: usize,
    conversations: usize,
    /// Requests handled so far, and their output tokens (for the running TPS).
    done: std::sync::atomic::AtomicUsize,
    osl_sum: std::sync::atomic::AtomicU64,
}

/// Replays the selected subset; `progress` is called after every request that was sent.
/// With `opts.concurrency` above 1 that many conversations run at once (each still one turn
/// at a time); the records come back in dataset order either way.
pub async fn run_with_progress(
    dataset: &Dataset,
    client: &ChatClient,
    endpoint: &str,
    counter: &TokenCounter,
    opts: &ReplayOptions,
    progress: &(dyn Fn(&Progress) + Sync),
) -> ReplayReport {
    use futures::StreamExt;
    let t0 = Instant::now();
    let convs = opts.conversations.unwrap_or(usize::MAX);
    let selected: usize = dataset
        .conversations
        .iter()
        .take(convs)
        .map(|c| c.turns.len().min(opts.turns_per_conversation.unwrap_or(usize::MAX)))
        .sum();
    let shared = RunShared {
        client,
        counter,
        opts,
        progress,
        t0,
        selected,
        conversations: convs.min(dataset.conversations.len()),
        done: Default::default(),
        osl_sum: Default::default(),
    };
    let per_conversation: Vec<Vec<TurnRecord>> =
        futures::stream::iter(dataset.conversations.iter().take(convs).enumerate())
            .map(|(ci, conv)| replay_conversation(&shared, ci, conv))
            .buffered(opts.concurrency.max(1))
            .collect()
            .await;
    let records: Vec<TurnRecord> = per_conversation.into_iter().flatten().collect();
    let wall = t0.elapsed().as_secs_f64();
    let figures = figures(&records, wall);
    let osl_method = if counter.has_tokenizer() {
        "client tokenizer over reasoning, content, tool-call names and arguments joined by newlines"
    } else {
        "server usage.completion_tokens (streamed output chunks, one token each, on turns without usage)"
    };
    ReplayReport {
        endpoint: endpoint.to_string(),
        options: opts.clone(),
        dataset_sha256: dataset.sha256.clone(),
        tokenizer: counter.name.clone(),
        osl_method: osl_method.into(),
        subset: subset_line(opts, counter),
        figures,
        turns: records,
    }
}

/// One conversation's turns, one at a time; an error aborts the rest of it.
async fn replay_conversation(
    shared: &RunShared<'_>,
    ci: usize,
    conv: &crate::dataset::Conversation,
) -> Vec<TurnRecord> {
    use std::sync::atomic::Ordering;
    let (opts, counter, t0) = (shared.opts, shared.counter, shared.t0);
    let mut records = Vec::new();
    let n_turns = conv.turns.len().min(opts.turns_per_conversation.unwrap_or(usize::MAX));
    let mut aborted: Option<String> = None;
    let session_id = (!opts.no_session_id).then_some(conv.id.as_str());
    for ti in 0..n_turns {
        let turn = &conv.turns[ti];
        let messages = conv.messages(ti);
        let est = counter.estimate_prompt(&messages, &conv.tools);
        let expected = strings(iou::executables(&turn.expected));
        let mut rec = TurnRecord {
            conversation_id: conv.id.clone(),
            request_index: ti,
            dataset_turn: turn.dataset_turn,
            messages: messages.len(),
            est_prompt_tokens: est,
            status: TurnStatus::Aborted,
            error: aborted.clone(),
            times: None,
            ttft_ms: None,
            first_chunk_ms: None,
            latency_ms: None,
            tpot_ms: None,
            tpot_all_ms: None,
            output_tokens_client: None,
            reply: None,
            expected_executables: expected,
            model_executables: Vec::new(),
            iou: None,
        };
        if aborted.is_some() {
            // A missing turn still counts in the IoU mean, as 0 (spec 4.5 step 6).
            rec.iou = (!rec.expected_executables.is_empty()).then_some(0.0);
            records.push(rec);
            continue;
        }
        if opts.max_prompt_tokens.is_some_and(|b| est > b) {
            rec.status = TurnStatus::Skipped;
            rec.error = None;
            records.push(rec);
            continue;
        }
        let body = opts.body(messages, &conv.tools);
        match shared.client.stream_chat(&body, session_id, t0).await {
            Ok((reply, times)) => {
                rec.status = TurnStatus::Ok;
                rec.output_tokens_client = counter.count_reply(&reply);
                rec.model_executables = strings(iou::executables(&reply.as_message()));
                rec.times = Some(times);
                rec.latency_ms = Some((times.done_s - times.issue_s) * 1e3);
                rec.ttft_ms = times.first_token_s.map(|f| (f - times.issue_s) * 1e3);
                rec.first_chunk_ms = times.first_chunk_s.map(|f| (f - times.issue_s) * 1e3);
                rec.reply = Some(reply);
                if let (Some(f), Some(osl)) = (times.first_token_s, rec.osl()) {
                    let window_ms = (times.done_s - f) * 1e3;
                    // Earlier definition: one token per first chunk assumed.
                    if osl > 1 {
                        rec.tpot_all_ms = Some(window_ms / (osl - 1) as f64);
                    }
                    rec.tpot_ms =
                        tokens_after_first_chunk(rec.reply.as_ref(), osl, counter).map(|n| window_ms / n as f64);
                }
                shared.osl_sum.fetch_add(rec.osl().unwrap_or(0), Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(conversation = %conv.id, turn = ti, error = %e, "turn failed; aborting conversation");
                metrics::counter!("edge_bench_turn_errors_total").increment(1);
                rec.status = TurnStatus::Error;
                rec.error = Some(e.to_string());
                aborted = Some(format!("aborted after error at request {ti}"));
            }
        }
        if !rec.expected_executables.is_empty() {
            let exp: Vec<&str> = rec.expected_executables.iter().map(String::as_str).collect();
            let got: Vec<&str> = rec.model_executables.iter().map(String::as_str).collect();
            rec.iou = Some(if rec.status == TurnStatus::Ok { iou::iou(&exp, &got) } else { 0.0 });
        }
        let done = shared.done.fetch_add(1, Ordering::Relaxed) + 1;
        let elapsed = t0.elapsed().as_secs_f64();
        let ctx = rec.reply.as_ref().and_then(|r| r.usage.as_ref()?.prompt_tokens);
        (shared.progress)(&Progress {
            done,
            selected: shared.selected,
            conversation: ci + 1,
            conversations: shared.conversations,
            conversation_id: &conv.id,
            request: ti + 1,
            requests: n_turns,
            context_tokens: ctx.map_or(est, |c| c as usize),
            context_is_estimate: ctx.is_none(),
            ttft_ms: rec.ttft_ms,
            output_tokens: rec.osl(),
            running_tps: shared.osl_sum.load(Ordering::Relaxed) as f64 / elapsed.max(1e-9),
        });
        records.push(rec);
    }
    records
}

/// Tokens after the first over the time after the first token, summed over the turns that
/// streamed more than one token.
/// The official TPOT's denominator: tokens of what arrived after the first chunk (client
/// tokenizer), or without one OSL − 1; `None` when nothing arrived after the first chunk.
fn tokens_after_first_chunk(reply: Option<&crate::client::Reply>, osl: u64, counter: &TokenCounter) -> Option<u64> {
    let reply = reply?;
    if reply.single_chunk() {
        return None;
    }
    let n = match counter.count_reply(&reply.after_first_chunk()) {
        Some(n) => n as u64,
        None => osl.saturating_sub(1),
    };
    (n > 0).then_some(n)
}

fn decode_tps(ok: &[&TurnRecord]) -> f64 {
    let (mut tokens, mut seconds) = (0u64, 0f64);
    for r in ok {
        if let (Some(t), Some(osl)) = (r.times, r.osl())
            && let (Some(first), true) = (t.first_token_s, osl > 1)
        {
            tokens += osl - 1;
            seconds += t.done_s - first;
        }
    }
    if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 }
}

/// Figures of spec 4.4-4.5 over the records (skipped turns are outside the subset).
pub fn figures(records: &[TurnRecord], wall_s: f64) -> Figures {
    let ok: Vec<&TurnRecord> = records.iter().filter(|r| r.status == TurnStatus::Ok).collect();
    let in_subset: Vec<&TurnRecord> = records.iter().filter(|r| r.status != TurnStatus::Skipped).collect();
    let window_s = ok.iter().filter_map(|r| r.times.map(|t| t.done_s)).fold(0.0, f64::max);
    let output_tokens: u64 = ok.iter().filter_map(|r| r.osl()).sum();
    let usage = |f: fn(&crate::client::Usage) -> Option<u64>| -> u64 {
        ok.iter().filter_map(|r| r.reply.as_ref()?.usage.as_ref().and_then(f)).sum()
    };
    let output_tokens_server = usage(|u| u.completion_tokens);
    let prompt_tokens_total = usage(|u| u.prompt_tokens);
    let prompt_tokens_cached = usage(|u| u.cached_tokens);
    let per_s = |x: f64| if window_s > 0.0 { x / window_s } else { 0.0 };
    let collect = |f: fn(&TurnRecord) -> Option<f64>| -> Vec<f64> { ok.iter().filter_map(|r| f(r)).collect() };
    let scorable: Vec<&&TurnRecord> = in_subset.iter().filter(|r| r.iou.is_some()).collect();
    let iou_sum: f64 = scorable.iter().filter_map(|r| r.iou).sum();
    let failed = in_subset.len() - ok.len();
    Figures {
        turns_selected: in_subset.len(),
        turns_completed: ok.len(),
        turns_failed: failed,
        turns_skipped_budget: records.len() - in_subset.len(),
        wall_s,
        window_s,
        output_tokens,
        output_tokens_server,
        tps: per_s(output_tokens as f64),
        tps_server_usage: per_s(output_tokens_server as f64),
        qps: per_s(ok.len() as f64),
        ttft_ms: Quantiles::of(&collect(|r| r.ttft_ms)),
        first_chunk_ms: Quantiles::of(&collect(|r| r.first_chunk_ms)),
        tpot_ms: Quantiles::of(&collect(|r| r.tpot_ms)),
        tpot_all_ms: Quantiles::of(&collect(|r| r.tpot_all_ms)),
        decode_tps: decode_tps(&ok),
        latency_ms: Quantiles::of(&collect(|r| r.latency_ms)),
        prompt_tokens_total,
        prompt_tokens_cached,
        cache_hit_pct: if prompt_tokens_total > 0 {
            100.0 * prompt_tokens_cached as f64 / prompt_tokens_total as f64
        } else {
            0.0
        },
        iou_score: if scorable.is_empty() { 0.0 } else { (iou_sum / scorable.len() as f64 * 1e4).round() / 1e4 },
        iou_scorable: scorable.len(),
        iou_missing: scorable.iter().filter(|r| r.status != TurnStatus::Ok).count(),
        valid: failed == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Usage;

    fn opts() -> ReplayOptions {
        ReplayOptions {
            model: "m".into(),
            max_completion_tokens: 1024,
            send_max_tokens: false,
            temperature: 0.0,
            seed: 42,
            include_usage: true,
            conversations: Some(2),
            turns_per_conversation: Some(5),
            max_prompt_tokens: Some(6000),
            empty_content_on_tool_calls: false,
            concurrency: 0,
            no_session_id: false,
        }
    }

    #[test]
    fn empty_content_option_fills_only_missing_assistant_content() {
        let msgs = vec![
            json!({"role": "user", "content": "u"}),
            json!({"role": "assistant", "tool_calls": []}),
            json!({"role": "assistant", "content": "kept"}),
            json!({"role": "tool", "tool_call_id": "1", "content": "t"}),
        ];
        let b = opts().body(msgs.clone(), &Value::Null);
        assert!(b["messages"][1].get("content").is_none(), "reference body omits content");
        let mut o = opts();
        o.empty_content_on_tool_calls = true;
        let b = o.body(msgs, &Value::Null);
        assert_eq!(b["messages"][1]["content"], "");
        assert_eq!(b["messages"][2]["content"], "kept");
        assert_eq!(b["messages"][0]["content"], "u");
    }

    #[test]
    fn body_matches_reference_fields() {
        let tools = json!([{"type": "function", "function": {"name": "bash"}}]);
        let b = opts().body(vec![json!({"role": "user", "content": "x"})], &tools);
        assert_eq!(b["stream"], true);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["seed"], 42);
        assert_eq!(b["max_completion_tokens"], 1024);
        assert!(b.get("max_tokens").is_none());
        assert!(b.get("tool_choice").is_none());
        assert_eq!(b["tools"], tools);
        let mut o = opts();
        o.send_max_tokens = true;
        assert_eq!(o.body(vec![], &Value::Null)["max_tokens"], 1024);
        assert_eq!(
            subset_line(&opts(), &TokenCounter::none()),
            "conversations: first 2; turns per conversation: first 5; prompt budget: 6000 (chars/3 estimate); max_completion_tokens: 1024"
        );
    }

    fn rec(status: TurnStatus, iou: Option<f64>, issue: f64, first: f64, done: f64, out: u64) -> TurnRecord {
        let reply = Reply {
            usage: Some(Usage { prompt_tokens: Some(100), completion_tokens: Some(out), cached_tokens: Some(60) }),
            ..Reply::default()
        };
        TurnRecord {
            conversation_id: "c".into(),
            request_index: 0,
            dataset_turn: 1,
            messages: 2,
            est_prompt_tokens: 10,
            status,
            error: None,
            times: (status == TurnStatus::Ok).then_some(Times {
                issue_s: issue,
                first_chunk_s: Some(issue),
                first_token_s: Some(first),
                done_s: done,
            }),
            ttft_ms: Some((first - issue) * 1e3),
            first_chunk_ms: Some(0.0),
            latency_ms: Some((done - issue) * 1e3),
            tpot_ms: None,
            tpot_all_ms: None,
            output_tokens_client: None,
            reply: (status == TurnStatus::Ok).then_some(reply),
            expected_executables: vec![],
            model_executables: vec![],
            iou,
        }
    }

    #[test]
    fn figures_count_failures_as_zero_and_skip_budget_turns() {
        let recs = vec![
            rec(TurnStatus::Ok, Some(1.0), 0.0, 0.5, 1.0, 10),
            rec(TurnStatus::Ok, Some(0.5), 1.0, 1.5, 2.0, 30),
            rec(TurnStatus::Error, Some(0.0), 0.0, 0.0, 0.0, 0),
            rec(TurnStatus::Skipped, None, 0.0, 0.0, 0.0, 0),
        ];
        let f = figures(&recs, 2.5);
        assert_eq!(f.turns_selected, 3);
        assert_eq!(f.turns_completed, 2);
        assert_eq!(f.turns_skipped_budget, 1);
        assert!(!f.valid);
        assert_eq!(f.window_s, 2.0);
        assert_eq!(f.output_tokens, 40);
        assert_eq!(f.tps, 20.0);
        assert_eq!(f.prompt_tokens_total, 200);
        assert_eq!(f.cache_hit_pct, 60.0);
        assert_eq!(f.iou_score, 0.5);
        assert_eq!(f.iou_missing, 1);
        assert_eq!(f.ttft_ms.p50, Some(500.0));
        // (10 - 1) + (30 - 1) tokens over 0.5 + 0.5 s after the first token.
        assert!((f.decode_tps - 38.0).abs() < 1e-9, "{}", f.decode_tps);
    }

    fn streamed(events: &[&str]) -> Reply {
        let mut m = crate::client::Merger::default();
        for e in events {
            m.push_event(e).expect("valid event");
        }
        m.reply
    }

    #[test]
    fn official_tpot_leaves_out_replies_that_arrive_in_one_chunk() {
        let none = TokenCounter::none();
        // A tool call sent whole, as our gateway sends it: no TPOT (the earlier definition gave ~0).
        let whole = streamed(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]}}]}"#,
        ]);
        assert!(whole.single_chunk());
        assert_eq!(tokens_after_first_chunk(Some(&whole), 12, &none), None);
        // The same call split over deltas: the first delta is dropped, the rest counts.
        let split = streamed(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"bash","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"command\":\"ls\"}"}}]}}]}"#,
        ]);
        assert!(!split.single_chunk());
        assert_eq!(split.after_first_chunk().tool_calls[0].arguments, "{\"command\":\"ls\"}");
        assert_eq!(tokens_after_first_chunk(Some(&split), 12, &none), Some(11));
        // With reasoning, the first reasoning chunk is "first" and all content counts after it.
        let r = streamed(&[
            r#"{"choices":[{"delta":{"reasoning_content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"b"}}]}"#,
        ]);
        let after = r.after_first_chunk();
        assert_eq!((after.reasoning.as_str(), after.content.as_str()), ("", "b"));
        let one_text = streamed(&[r#"{"choices":[{"delta":{"content":"hello world"}}]}"#]);
        assert_eq!(tokens_after_first_chunk(Some(&one_text), 2, &none), None);
    }
}
