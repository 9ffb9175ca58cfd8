//! Router tests through `tower::ServiceExt::oneshot`.
//!
//! Requests that fail before the engine use a real client pointed at a closed port. The
//! streaming path runs against a scripted engine: a real tonic server implementing the
//! engine proto that replays a fixed token script and records what it was sent, so the
//! gateway's wire behaviour (requests, aborts, SSE) is checked end to end over gRPC.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::{Stream, StreamExt};
use proto::engine::v1::engine_server::{Engine, EngineServer};
use proto::engine::v1::{
    AbortRequest, AbortResponse, FinishReason as WireFinish, Finished, GenerateRequest, GenerateResponse, InfoRequest,
    InfoResponse, StatusRequest, StatusResponse, TokenChunk, Usage as WireUsage, generate_response::Kind,
    status_response,
};
use serde_json::{Value, json};
use tonic::{Response as GrpcResponse, Status};
use tower::ServiceExt;

use super::app;
use crate::config::Config;
use crate::engine_client::EngineClient;
use crate::state::AppState;
use crate::text::tokenize::test_tokenizer::{self, IM_END};

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const MODEL: &str = "test-model";

fn info(context_length: u32) -> InfoResponse {
    InfoResponse {
        model_id: MODEL.into(),
        context_length,
        tokenizer_json: test_tokenizer::json(),
        chat_template: CHATML.into(),
        bos_token_id: None,
        eos_token_ids: vec![IM_END],
        bos_token: String::new(),
        eos_token: "<|im_end|>".into(),
        architecture: "llama".into(),
        model_fingerprint: "00".into(),
        backend: "cpu".into(),
        recurrent_state: false,
        limits: Some(proto::engine::v1::EngineLimits {
            max_completion_tokens: context_length - 1,
            max_top_logprobs: 20,
            max_stop_sequences: 16,
            max_speculation_depth: 63,
            max_speculation_top_k: 8,
            max_speculation_nodes: 64,
        }),
    }
}

/// State whose engine client points at a closed port: every engine call fails Unavailable
/// (after the accept deadline's retries, kept short here).
fn offline_state(config: Config, context_length: u32) -> AppState {
    let config = Config { engine_accept_timeout: Duration::from_millis(300), ..config };
    let engine = EngineClient::new("http://127.0.0.1:1").unwrap();
    AppState::from_info(config, engine, info(context_length)).unwrap()
}

async fn call(state: &AppState, req: Request<Body>) -> (StatusCode, String) {
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn post_chat(body: impl Into<Body>) -> Request<Body> {
    Request::post("/v1/chat/completions").header("content-type", "application/json").body(body.into()).unwrap()
}

fn chat_body(extra: Value) -> String {
    let mut v = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]});
    v.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    v.to_string()
}

fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"].clone()
}

#[tokio::test]
async fn bad_json_is_a_400_with_an_openai_body() {
    let state = offline_state(Config::default(), 8192);
    let (status, body) = call(&state, post_chat("{\"messages\": [")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = error_of(&body);
    assert_eq!(err["type"], "invalid_request_error");
    assert!(err["message"].as_str().unwrap().contains("not valid JSON"));
    assert!(err.get("param").is_some() && err.get("code").is_some());
}

#[tokio::test]
async fn invalid_fields_are_400s_naming_the_field() {
    let state = offline_state(Config::default(), 8192);
    let cases = [
        (json!({"model": MODEL, "messages": []}).to_string(), "messages"),
        (chat_body(json!({"temperature": "warm"})), "temperature"),
        (chat_body(json!({"n": 2})), "n"),
        (chat_body(json!({"max_tokens": 0})), "max_tokens"),
        (json!({"messages": [{"role": "user", "content": {"text": "x"}}]}).to_string(), "messages[0].content"),
    ];
    for (body, param) in cases {
        let (status, resp) = call(&state, post_chat(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_of(&resp)["param"], param, "{body}");
    }
}

#[tokio::test]
async fn other_model_names_are_served_unless_strict() {
    let state = offline_state(Config::default(), 8192);
    let (status, _) = call(&state, post_chat(chat_body(json!({"model": "gpt-4o"})))).await;
    // Passes validation and reaches the (closed) engine.
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let strict = Config { strict_model_names: true, ..Config::default() };
    let state = offline_state(strict.clone(), 8192);
    let (status, body) = call(&state, post_chat(chat_body(json!({"model": "gpt-4o"})))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body)["code"], "model_not_found");
    let completion = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(json!({"model": "gpt-4o", "prompt": "x"}).to_string()))
        .unwrap();
    let (status, body) = call(&state, completion).await;
    assert_eq!((status, error_of(&body)["code"].clone()), (StatusCode::NOT_FOUND, json!("model_not_found")));
    // An alias is a served name even in strict mode.
    let aliased = Config { served_model_names: vec!["qwen".into(), "Qwen3.6-27B-Q4_K_M".into()], ..strict };
    let state = offline_state(aliased, 8192);
    let (status, _) = call(&state, post_chat(chat_body(json!({"model": "Qwen3.6-27B-Q4_K_M"})))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (_, body) = call(&state, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    let ids: Vec<Value> = serde_json::from_str::<Value>(&body).unwrap()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("qwen"), json!("Qwen3.6-27B-Q4_K_M")]);
}

#[tokio::test]
async fn a_reply_names_the_served_id_whatever_name_was_requested() {
    let (mut script, n) = answer_script("ok");
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, _) = start_engine(script.clone(), false).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({"model": "Qwen3.6-27B-Q4_K_M"})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["model"], MODEL);
    let (state, _) = start_engine_with(script, false, |c| c.served_model_names = vec!["served-alias".into()]).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({"model": "anything"})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["model"], "served-alias");
}

#[tokio::test]
async fn prompt_that_does_not_fit_is_context_length_exceeded() {
    let state = offline_state(Config::default(), 32);
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["code"], "context_length_exceeded");
    let state = offline_state(Config::default(), 200);
    let (status, body) = call(&state, post_chat(chat_body(json!({"max_tokens": 190})))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["param"], "max_tokens");
}

#[tokio::test]
async fn engine_unreachable_is_503_and_health_says_so() {
    let state = offline_state(Config::default(), 8192);
    let (status, body) = call(&state, post_chat(chat_body(json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body)["type"], "server_error");
    let (status, _) = call(&state, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn unknown_routes_methods_and_big_bodies_get_openai_errors() {
    let config = Config { max_body_bytes: 64, ..Config::default() };
    let state = offline_state(config, 8192);
    let (status, body) = call(&state, Request::get("/v1/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&body)["code"], "not_found");
    let (status, body) = call(&state, Request::get("/v1/chat/completions").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&body)["code"], "method_not_allowed");
    let big = chat_body(json!({"padding": "x".repeat(200)}));
    let with_length = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("content-length", big.len().to_string())
        .body(Body::from(big.clone()))
        .unwrap();
    let (status, body) = call(&state, with_length).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_of(&body)["code"], "payload_too_large");
    let (status, body) = call(&state, post_chat(big.clone())).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_of(&body)["code"], "payload_too_large");
    // Without Content-Length the limit trips while reading: same answer.
    let chunked = Body::from_stream(futures::stream::iter([Ok::<_, std::io::Error>(big)]));
    let (status, body) = call(&state, post_chat(chunked)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_of(&body)["code"], "payload_too_large");
}

#[tokio::test]
async fn models_lists_the_served_model_and_metrics_render() {
    let state = offline_state(Config::default(), 8192);
    let (status, body) = call(&state, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    let _ = call(&state, post_chat("not json")).await;
    let (status, body) = call(&state, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("edge_gateway_requests_total{status=\"400\",endpoint=\"chat_completions\"}"), "{body}");
    assert!(
        // Values are process-global and other tests run in parallel: names only.
        body.contains("edge_gateway_in_flight_requests ") && body.contains("edge_gateway_queue_depth_requests "),
        "{body}"
    );
}

// ---- scripted engine -------------------------------------------------------------------

#[derive(Default)]
struct Record {
    requests: Mutex<Vec<GenerateRequest>>,
    aborts: Mutex<Vec<String>>,
    stream_dropped: AtomicBool,
}

struct ScriptedEngine {
    script: Vec<Result<GenerateResponse, Status>>,
    /// Keep the stream open after the script (a long generation) until the client leaves.
    hold_open: bool,
    record: Arc<Record>,
}

struct DropFlag(Arc<Record>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.stream_dropped.store(true, Ordering::SeqCst);
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Engine for ScriptedEngine {
    type GenerateStream = ResponseStream;

    async fn generate(&self, request: tonic::Request<GenerateRequest>) -> Result<GrpcResponse<ResponseStream>, Status> {
        self.record.requests.lock().unwrap().push(request.into_inner());
        let script = self.script.clone();
        let hold_open = self.hold_open;
        let flag = DropFlag(self.record.clone());
        let stream = async_stream::stream! {
            let _flag = flag;
            for item in script {
                tokio::time::sleep(Duration::from_millis(2)).await;
                yield item;
            }
            if hold_open {
                std::future::pending::<()>().await;
            }
        };
        Ok(GrpcResponse::new(Box::pin(stream)))
    }

    async fn abort(&self, request: tonic::Request<AbortRequest>) -> Result<GrpcResponse<AbortResponse>, Status> {
        self.record.aborts.lock().unwrap().push(request.into_inner().request_id);
        Ok(GrpcResponse::new(AbortResponse { found: true }))
    }

    async fn info(&self, _: tonic::Request<InfoRequest>) -> Result<GrpcResponse<InfoResponse>, Status> {
        Ok(GrpcResponse::new(info(8192)))
    }

    async fn status(&self, request: tonic::Request<StatusRequest>) -> Result<GrpcResponse<StatusResponse>, Status> {
        // With `metrics`, a page of each service, as the status page's data call asks for.
        let metrics = request.get_ref().metrics;
        Ok(GrpcResponse::new(StatusResponse {
            cache: status_response::Cache::Attached as i32,
            reason: String::new(),
            engine_metrics: if metrics { "edge_engine_generated_tokens_total 7\n".into() } else { String::new() },
            cache_metrics: if metrics { "edge_cache_pages_used 3\n".into() } else { String::new() },
        }))
    }
}

fn tokens(ids: &[u32]) -> Result<GenerateResponse, Status> {
    Ok(GenerateResponse { kind: Some(Kind::Tokens(TokenChunk { token_ids: ids.to_vec(), logprobs: Vec::new() })) })
}

fn finished(reason: WireFinish, completion_tokens: u32, cached: u32) -> Result<GenerateResponse, Status> {
    Ok(GenerateResponse {
        kind: Some(Kind::Finished(Finished {
            reason: reason as i32,
            usage: Some(WireUsage {
                prompt_tokens: 0,
                completion_tokens,
                cached_prompt_tokens: cached,
                ..WireUsage::default()
            }),
            timings: None,
        })),
    })
}

/// The answer text as token chunks of 1 to 3 ids (splitting multi-byte characters), then EOS.
fn answer_script(text: &str) -> (Vec<Result<GenerateResponse, Status>>, u32) {
    let tok = test_tokenizer::tokenizer();
    let mut ids = tok.encode(text).unwrap();
    ids.push(IM_END);
    let n = ids.len() as u32;
    let mut script = Vec::new();
    let mut rest = ids.as_slice();
    let mut size = 1;
    while !rest.is_empty() {
        let take = size.min(rest.len());
        script.push(tokens(&rest[..take]));
        rest = &rest[take..];
        size = size % 3 + 1;
    }
    (script, n)
}

/// Like `answer_script`, with log-probabilities on every token: token `k` gets `-k/8`,
/// and two alternatives (itself, then `<|im_end|>` two nats lower).
fn answer_script_with_logprobs(text: &str) -> (Vec<Result<GenerateResponse, Status>>, u32) {
    let (mut script, n) = answer_script(text);
    let mut k = 0;
    for item in &mut script {
        if let Ok(GenerateResponse { kind: Some(Kind::Tokens(chunk)) }) = item {
            chunk.logprobs = chunk
                .token_ids
                .iter()
                .map(|&id| {
                    let lp = -(k as f32) / 8.0;
                    k += 1;
                    proto::engine::v1::TokenLogprob {
                        logprob: lp,
                        top: vec![
                            proto::engine::v1::TopLogprob { token_id: id, logprob: lp },
                            proto::engine::v1::TopLogprob { token_id: IM_END, logprob: lp - 2.0 },
                        ],
                    }
                })
                .collect();
        }
    }
    (script, n)
}

async fn start_engine(script: Vec<Result<GenerateResponse, Status>>, hold_open: bool) -> (AppState, Arc<Record>) {
    let record = Arc::new(Record::default());
    let engine = ScriptedEngine { script, hold_open, record: record.clone() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(engine))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let config = Config {
        engine_endpoints: vec![format!("http://{addr}")],
        startup_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    (AppState::connect(config).await.unwrap(), record)
}

/// A scripted engine served through `template` (Qwen3.5's for its XML tool calls).
async fn start_engine_templated(
    script: Vec<Result<GenerateResponse, Status>>,
    template: &str,
) -> (AppState, Arc<Record>) {
    let (state, record) = start_engine(script, false).await;
    let config = state.config().clone();
    let mut model = info(8192);
    model.chat_template = template.into();
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    (AppState::from_info(config, engine, model).unwrap(), record)
}

const QWEN_TEMPLATE: &str = include_str!("text/testdata/qwen3_5.jinja");

/// `(event name, data)` of each event of a stream whose events are named (Messages,
/// Responses).
fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| e.contains("data: "))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_else(|| panic!("no name: {e}"));
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name.to_owned(), serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data}")))
        })
        .collect()
}

/// The JSON payloads of an SSE body, `[DONE]` kept as a string.
fn sse_payloads(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or(Value::String(data.to_owned())))
        .collect()
}

const ANSWER: &str = "héllo wörld 😀 日本";

#[tokio::test]
async fn non_streamed_completion_carries_text_usage_and_sends_the_right_request() {
    let (mut script, n) = answer_script(ANSWER);
    script.push(finished(WireFinish::Stop, n, 5));
    let (state, record) = start_engine(script, false).await;
    let body = chat_body(json!({"cache_salt": "tenant-a", "seed": 7, "temperature": 0.5}));
    let mut request = post_chat(body);
    request.headers_mut().insert("x-session-id", "agent-42".parse().unwrap());
    let (status, resp) = call(&state, request).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], ANSWER);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let sent = record.requests.lock().unwrap()[0].clone();
    let expected_prompt = test_tokenizer::tokenizer()
        .encode("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    assert_eq!(sent.prompt_token_ids, expected_prompt);
    assert_eq!(sent.cache_salt, "tenant-a");
    assert_eq!(sent.session_id, "agent-42", "X-Session-ID is forwarded to the engine");
    let sampling = sent.sampling.unwrap();
    assert_eq!((sampling.temperature, sampling.seed), (0.5, Some(7)));
    assert_eq!(sampling.max_tokens, 4096);
    assert_eq!(v["id"], sent.request_id);
    assert_eq!(v["usage"]["prompt_tokens"], expected_prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], expected_prompt.len() as u32 + n);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
}

#[tokio::test]
async fn streamed_completion_has_role_content_finish_usage_and_done() {
    let (mut script, n) = answer_script(ANSWER);
    script.push(finished(WireFinish::Length, n, 3));
    let (state, _) = start_engine(script, false).await;
    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let resp = app(state.clone()).oneshot(post_chat(body)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    let events = sse_payloads(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(events.last().unwrap(), &Value::String("[DONE]".into()));
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    let finish = &events[events.len() - 3];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let contents: Vec<&str> =
        events[1..events.len() - 3].iter().map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
    assert!(contents.len() > 3 && contents.iter().all(|c| !c.is_empty() && !c.contains('\u{FFFD}')));
    assert_eq!(contents.concat(), ANSWER);
}

#[tokio::test]
async fn stop_string_across_chunks_truncates_and_aborts_the_engine() {
    let (mut script, n) = answer_script(ANSWER);
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, record) = start_engine(script, true).await;
    let (status, resp) = call(&state, post_chat(chat_body(json!({"stop": ["wörld", "zzz"]})))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "héllo ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let request_id = record.requests.lock().unwrap()[0].request_id.clone();
    assert!(record.aborts.lock().unwrap().contains(&request_id));
    let consumed = test_tokenizer::tokenizer().encode("héllo wörld").unwrap().len();
    assert_eq!(v["usage"]["completion_tokens"], consumed);
}

#[tokio::test]
async fn client_disconnect_drops_the_engine_stream_and_sends_abort() {
    let (script, _) = answer_script("hello");
    let (state, record) = start_engine(script, true).await;
    let resp = app(state.clone()).oneshot(post_chat(chat_body(json!({"stream": true})))).await.unwrap();
    let mut body = resp.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("\"role\":\"assistant\""));
    drop(body);
    let request_id = record.requests.lock().unwrap()[0].request_id.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let aborted = record.aborts.lock().unwrap().contains(&request_id);
        if aborted && record.stream_dropped.load(Ordering::SeqCst) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "engine saw no abort/cancel");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn engine_failure_mid_stream_ends_with_an_error_event_then_done() {
    let (mut script, _) = answer_script("hello");
    script.truncate(2);
    script.push(Err(Status::internal("kv arena exploded")));
    let (state, _) = start_engine(script, false).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_payloads(&body);
    assert_eq!(events.last().unwrap(), &Value::String("[DONE]".into()));
    let err = &events[events.len() - 2]["error"];
    assert_eq!(err["type"], "server_error");
    assert!(err["message"].as_str().unwrap().contains("kv arena exploded"));
}

#[tokio::test]
async fn engine_errors_before_streaming_map_to_http_statuses() {
    let (state, _) = start_engine(vec![Err(Status::resource_exhausted("queue full"))], false).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_of(&body)["type"], "rate_limit_error");
    let (state, _) = start_engine(vec![tokens(&[104])], false).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "stream without Finished: {body}");
}

#[tokio::test]
async fn health_is_ok_when_the_engine_answers() {
    let (state, _) = start_engine(Vec::new(), false).await;
    let (status, body) = call(&state, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), json!({"status": "ok"}));
}

#[tokio::test]
async fn the_status_page_and_its_data_are_served_with_every_services_metrics() {
    let (state, _) = start_engine(Vec::new(), false).await;
    for path in ["/", "/status"] {
        let resp = app(state.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
        // Self-contained: nothing may come from another origin.
        assert!(resp.headers()["content-security-policy"].to_str().unwrap().starts_with("default-src 'none'"));
    }
    let (status, body) = call(&state, Request::get("/status/data").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(data["engine"], json!({"up": true, "cache": "attached", "reason": ""}));
    assert_eq!(data["metrics"]["engine"], "edge_engine_generated_tokens_total 7\n");
    assert_eq!(data["metrics"]["cache"], "edge_cache_pages_used 3\n");
    assert!(data["metrics"]["gateway"].as_str().unwrap().contains("edge_gateway_in_flight_requests"));
    assert!(data["uptime_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(data["model"], state.model().id);
}

#[tokio::test]
async fn unix_socket_endpoints_work() {
    let dir = std::env::temp_dir().join(format!("gw-uds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("engine.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (mut script, n) = answer_script("ok");
    script.push(finished(WireFinish::Stop, n, 0));
    let record = Arc::new(Record::default());
    let engine = ScriptedEngine { script, hold_open: false, record };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(engine))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let config = Config {
        engine_endpoints: vec![format!("unix:{}", path.display())],
        startup_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let state = AppState::connect(config).await.unwrap();
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["choices"][0]["message"]["content"], "ok");
    std::fs::remove_dir_all(dir).ok();
}

async fn start_engine_with(
    script: Vec<Result<GenerateResponse, Status>>,
    hold_open: bool,
    tweak: impl FnOnce(&mut Config),
) -> (AppState, Arc<Record>) {
    let (state, record) = start_engine(script, hold_open).await;
    let mut config = state.config().clone();
    tweak(&mut config);
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    (AppState::from_info(config, engine, info(8192)).unwrap(), record)
}

#[tokio::test]
async fn request_deadline_is_504_and_aborts_the_engine() {
    let (state, record) = start_engine_with(Vec::new(), true, |c| c.request_timeout = Duration::from_millis(300)).await;
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(error_of(&body)["code"], "timeout");
    let request_id = record.requests.lock().unwrap()[0].request_id.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !record.aborts.lock().unwrap().contains(&request_id) {
        assert!(tokio::time::Instant::now() < deadline, "no Abort after the timeout");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn no_first_token_is_504_before_any_byte_and_aborts_the_engine() {
    let (state, record) =
        start_engine_with(Vec::new(), true, |c| c.first_token_timeout = Duration::from_millis(300)).await;
    // Streaming too: the deadline is checked before the SSE response begins.
    for stream in [false, true] {
        let (status, body) = call(&state, post_chat(chat_body(json!({"stream": stream})))).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
        assert_eq!(error_of(&body)["code"], "first_token_timeout");
    }
    let ids: Vec<String> = record.requests.lock().unwrap().iter().map(|r| r.request_id.clone()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !ids.iter().all(|id| record.aborts.lock().unwrap().contains(id)) {
        assert!(tokio::time::Instant::now() < deadline, "no Abort after the first-token deadline");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_engine_that_takes_no_call_is_503_engine_unavailable() {
    // Accepts connections and never speaks: a stopped process whose socket still queues them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let config = Config {
        engine_endpoints: vec![format!("http://{addr}")],
        engine_accept_timeout: Duration::from_millis(300),
        ..Config::default()
    };
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    let state = AppState::from_info(config, engine, info(8192)).unwrap();
    let started = tokio::time::Instant::now();
    let (status, body) = call(&state, post_chat(chat_body(json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(error_of(&body)["code"], "engine_unavailable");
    assert!(error_of(&body)["message"].as_str().unwrap().contains("did not accept"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!held.lock().unwrap().is_empty(), "the gateway never connected");
}

#[tokio::test]
async fn a_request_is_held_until_an_engine_comes_up_within_the_accept_deadline() {
    // Nothing listens yet (an engine restarting or being swapped); one starts 400 ms later.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (mut script, n) = answer_script("held");
    script.push(finished(WireFinish::Stop, n, 0));
    let engine = ScriptedEngine { script, hold_open: false, record: Arc::new(Record::default()) };
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(engine))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let config = Config {
        engine_endpoints: vec![format!("http://127.0.0.1:{port}")],
        engine_accept_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    let state = AppState::from_info(config, engine, info(8192)).unwrap();
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["choices"][0]["message"]["content"], "held");
    // Past the deadline with no engine: 503, not a wait without end.
    let state = offline_state(Config::default(), 8192);
    let started = tokio::time::Instant::now();
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_408_after_its_deadline() {
    let config = Config { body_read_timeout: Duration::from_millis(300), ..Config::default() };
    let state = offline_state(config, 8192);
    let dribble =
        futures::stream::once(async { Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{\"model\": ")) })
            .chain(futures::stream::pending());
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from_stream(dribble))
        .unwrap();
    let started = tokio::time::Instant::now();
    let (status, body) = call(&state, request).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(error_of(&body)["code"], "request_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Over the size limit is still the OpenAI-shaped 413, whatever the deadline.
    let config = Config { max_body_bytes: 64, ..Config::default() };
    let state = offline_state(config, 8192);
    let big = futures::stream::iter(vec![Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 100]))]);
    let request = Request::post("/v1/chat/completions").body(Body::from_stream(big)).unwrap();
    let (status, body) = call(&state, request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(error_of(&body)["code"], "payload_too_large");
}

#[tokio::test]
async fn concurrency_limit_answers_429_while_a_stream_is_open() {
    let (script, _) = answer_script("hello");
    let (state, _) = start_engine_with(script, true, |c| {
        c.max_concurrent_requests = 1;
        c.max_queued_requests = 0;
    })
    .await;
    let first = app(state.clone()).oneshot(post_chat(chat_body(json!({"stream": true})))).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_of(&body)["code"], "rate_limit_exceeded");
    drop(first);
    // The permit returns with the dropped stream.
    let (status, _) = call(&state, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state.inner.limiter.available_permits(), 1);
}

#[path = "routes_tests_openai.rs"]
mod openai_surface;

#[path = "routes_tests_anthropic.rs"]
mod anthropic;

#[path = "routes_tests_responses.rs"]
mod responses;

#[path = "routes_tests_chunking.rs"]
mod chunking;
