//! Two engines behind one gateway, each with its own cache-service (separate arenas, as two
//! boxes would have), routed by affinity:
//!
//! - every turn of a conversation lands on the engine that served its first turn (the
//!   `x-edge-engine` header), with and without `X-Session-ID`, and is served from that
//!   engine's cache (all of the previous prompt but its last partial page);
//! - new conversations spread over both engines;
//! - each engine publishes the signals llm-d's endpoint picker scrapes, under vLLM's names
//!   (`vllm:num_requests_waiting`/`running`, `vllm:kv_cache_usage_perc`,
//!   `vllm:cache_config_info`): zero when idle, moving under load;
//! - killing one engine while turns are in flight fails only requests that were on it, each
//!   with a 503 a client can retry; the next turns of its conversations are served by the
//!   other engine (a prefill there), and the turns after that hit its cache again.

use std::time::Duration;

use e2e::{Stack, StackOptions};
use serde_json::{Value, json};

const SYSTEM: &str = "You are the support agent of a hardware store. Answer in one short sentence, \
    name the aisle when you know it, and never invent prices.";

/// A page of the cache: a turn reuses the previous prompt but for its last partial page.
const PAGE_TOKENS: u64 = 16;

struct Conversation {
    session: Option<String>,
    messages: Vec<Value>,
    /// The engine each turn was served by.
    engines: Vec<usize>,
    /// Prompt tokens of the last turn served.
    last_prompt: u64,
}

impl Conversation {
    fn new(n: usize) -> Conversation {
        // A long first question of its own (about 250 tokens), so a conversation's prefix is
        // mostly its own and not the shared system prompt.
        let details: Vec<String> = (0..12)
            .map(|k| format!("item {k} of order {n}-{} is a {} metre beam", 1000 + 37 * n + k, 2 + (n + k) % 5))
            .collect();
        let question = format!(
            "Customer {n} writes: I am rebuilding garden shed number {n} and need to know which screws, \
             brackets and wood treatment to buy for a roof of {} square metres in a rainy climate. \
             My order so far: {}. What do you suggest first?",
            10 + n,
            details.join("; ")
        );
        Conversation {
            session: n.is_multiple_of(2).then(|| format!("agent-{n}")),
            messages: vec![json!({"role": "system", "content": SYSTEM}), json!({"role": "user", "content": question})],
            engines: Vec::new(),
            last_prompt: 0,
        }
    }
}

/// One turn: (HTTP status, the engine that served it, body).
async fn send(base: &str, conversation: &Conversation, max_tokens: u32) -> (u16, Option<usize>, Value) {
    let mut request = e2e::client()
        .post(format!("{base}/v1/chat/completions"))
        // ignore_eos: a reply runs its full length, so "in flight" lasts as long as the test needs.
        .json(
            &json!({"messages": conversation.messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}),
        );
    if let Some(session) = &conversation.session {
        request = request.header("x-session-id", session);
    }
    let resp = request.send().await.expect("the gateway answers");
    let status = resp.status().as_u16();
    let engine = resp.headers().get("x-edge-engine").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (status, engine, body)
}

/// A turn served from its engine's cache: all of the previous prompt but its last partial page.
fn assert_warm(conversation: &Conversation, body: &Value, what: &str) {
    let cached = e2e::cached_tokens(body);
    assert!(
        cached + PAGE_TOKENS >= conversation.last_prompt,
        "{what}: {cached} cached of the previous {} prompt tokens (engines {:?})",
        conversation.last_prompt,
        conversation.engines
    );
}

/// Records a served turn and appends the reply and the next question.
fn served(conversation: &mut Conversation, engine: Option<usize>, body: &Value, turn: usize) {
    let engine = engine.expect("x-edge-engine on a reply from a gateway with two engines");
    conversation.engines.push(engine);
    conversation.last_prompt = e2e::prompt_tokens(body);
    conversation.messages.push(json!({"role": "assistant", "content": e2e::content(body)}));
    conversation
        .messages
        .push(json!({"role": "user", "content": format!("Thanks. Follow-up {turn}: and after that?")}));
}

/// The values of every series of metric `name` on a Prometheus page (labels or not).
fn series(page: &str, name: &str) -> Vec<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .collect()
}

/// The llm-d signals of an engine back at zero: they fall once its step loop goes idle,
/// which is just after its last reply was sent.
async fn wait_idle(metrics_url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let page = e2e::http_get(metrics_url).unwrap_or_default();
        let values: Vec<Vec<f64>> =
            ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]
                .iter()
                .map(|name| series(&page, name))
                .collect();
        if values.iter().all(|v| v == &[0.0]) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics_url} not idle after 5 s: {values:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_both_engines(stack: &Stack) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let health: Value = e2e::client()
            .get(format!("{}/health", stack.base_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        let up = health["engines"].as_array().map_or(0, |e| e.iter().filter(|e| e["routing"] == "up").count());
        if up == 2 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "both engines up within 60 s: {health}\n{}", stack.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn conversations_stay_on_their_engine_and_move_when_it_dies() {
    let mut stack = Stack::start_with(StackOptions { engines: 2, cache_per_engine: true, ..Default::default() });
    wait_for_both_engines(&stack).await;
    let base = stack.base_url.clone();
    let mut conversations: Vec<Conversation> = (0..6).map(Conversation::new).collect();

    // Three rounds; the conversations of a round run at once.
    for round in 0..3 {
        let replies = futures::future::join_all(conversations.iter().map(|c| send(&base, c, 12))).await;
        for (n, (c, (status, engine, body))) in conversations.iter_mut().zip(replies).enumerate() {
            assert_eq!(status, 200, "conversation {n} round {round}: {body}");
            if round > 0 {
                assert_warm(c, &body, &format!("conversation {n} round {round} (now on {engine:?})"));
            }
            served(c, engine, &body, round);
        }
    }
    for (n, c) in conversations.iter().enumerate() {
        assert!(c.engines.windows(2).all(|w| w[0] == w[1]), "conversation {n} moved: {:?}", c.engines);
    }
    let homes: Vec<usize> = conversations.iter().map(|c| c.engines[0]).collect();
    assert!(homes.contains(&0) && homes.contains(&1), "new conversations spread over both engines: {homes:?}");

    // llm-d's signals, under the names it scrapes from vLLM, move with the load: requests
    // running and KV pages held while a round runs, back to zero after.
    for url in &stack.engine_metrics_urls {
        let page = e2e::http_get(url).unwrap();
        let info = series(&page, "vllm:cache_config_info");
        assert_eq!(info, [1.0], "vllm:cache_config_info once per engine:\n{page}");
        assert!(page.contains("block_size=\"16\"") && page.contains("num_gpu_blocks=\""), "{page}");
        wait_idle(url).await;
    }
    let (mut max_running, mut max_usage) = (0.0f64, 0.0f64);
    let replies = {
        let round = futures::future::join_all(conversations.iter().map(|c| send(&base, c, 48)));
        tokio::pin!(round);
        loop {
            tokio::select! {
                replies = &mut round => break replies,
                () = tokio::time::sleep(Duration::from_millis(10)) => {
                    for url in &stack.engine_metrics_urls {
                        let page = e2e::http_get(url).unwrap_or_default();
                        let running = series(&page, "vllm:num_requests_running").first().copied().unwrap_or(0.0);
                        let waiting = series(&page, "vllm:num_requests_waiting").first().copied().unwrap_or(0.0);
                        max_running = max_running.max(running + waiting);
                        max_usage = max_usage.max(series(&page, "vllm:kv_cache_usage_perc").first().copied().unwrap_or(0.0));
                    }
                }
            }
        }
    };
    for (n, (c, (status, engine, body))) in conversations.iter_mut().zip(replies).enumerate() {
        assert_eq!(status, 200, "conversation {n}: {body}");
        served(c, engine, &body, 3);
    }
    assert!(max_running >= 1.0 && max_usage > 0.0, "under load: {max_running} requests, KV use {max_usage}");
    for url in &stack.engine_metrics_urls {
        wait_idle(url).await;
    }

    // Engine 1 dies while a round is in flight: killed once it runs requests of this round.
    let killed = 1;
    let in_flight = {
        let round = futures::future::join_all(conversations.iter().map(|c| send(&base, c, 800)));
        let url = stack.engine_metrics_urls[killed].clone();
        let kill = async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let page = e2e::http_get(&url).unwrap_or_default();
                if series(&page, "vllm:num_requests_running").first().is_some_and(|r| *r > 0.0) {
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline, "engine {killed} got no request of the round");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            stack.kill("engine-service-1", libc::SIGKILL);
        };
        let (replies, ()) = tokio::join!(round, kill);
        replies
    };
    let mut failed = 0;
    let outcome: Vec<String> = conversations
        .iter()
        .zip(&in_flight)
        .map(|(c, (status, engine, body))| {
            format!(
                "was on {:?}: {status} from {engine:?} ({} tokens)",
                c.engines.last(),
                body["usage"]["completion_tokens"]
            )
        })
        .collect();
    for (n, (c, (status, engine, body))) in conversations.iter_mut().zip(in_flight).enumerate() {
        match status {
            200 => served(c, engine, &body, 4),
            503 => {
                // Only a request that was on the killed engine fails, with the code a client retries on.
                assert_eq!(c.engines.last(), Some(&killed), "conversation {n} failed but was on engine 0: {body}");
                assert_eq!(body["error"]["code"], "engine_unavailable", "{body}");
                failed += 1;
            }
            other => panic!("conversation {n}: {other} {body}\n{}", stack.log_tail()),
        }
    }
    assert!(failed > 0, "the killed engine had requests of the round in flight: {outcome:#?}\n{}", stack.log_tail());
    eprintln!("{failed} in-flight requests on the killed engine answered 503");

    // Every conversation goes on; those of the killed engine now on engine 0, prefilling
    // once and then served from its cache.
    for round in 5..7 {
        let replies = futures::future::join_all(conversations.iter().map(|c| send(&base, c, 12))).await;
        for (n, (c, (status, engine, body))) in conversations.iter_mut().zip(replies).enumerate() {
            assert_eq!(status, 200, "conversation {n} round {round}: {body}\n{}", stack.log_tail());
            assert_eq!(engine, Some(0), "conversation {n} round {round}: only engine 0 is left");
            let moved_now = c.engines.last() == Some(&killed);
            if !moved_now {
                assert_warm(c, &body, &format!("conversation {n} round {round}"));
            }
            served(c, engine, &body, round);
        }
    }
    let moved = conversations.iter().filter(|c| c.engines.contains(&killed)).count();
    assert!(moved > 0, "some conversations lived on the killed engine");
    let health: Value =
        e2e::client().get(format!("{base}/health")).send().await.unwrap().json().await.unwrap_or(Value::Null);
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["engines"][killed]["routing"], "down", "{health}");
}
