//! `/v1/responses` against the scripted engine: a function call whole and streamed (Qwen XML),
//! a function round trip in `input`, the token limit, usage with cached tokens, and errors.

use super::*;

fn post_responses(body: Value) -> Request<Body> {
    Request::post("/v1/responses")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": true,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

const XML_CALL: &str = "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

#[tokio::test]
async fn a_function_call_comes_back_as_items_with_usage() {
    let (mut script, n) = answer_script(XML_CALL);
    script.push(finished(WireFinish::Stop, n, 3));
    let (state, record) = start_engine_templated(script, QWEN_TEMPLATE).await;
    let body = json!({"model": MODEL, "instructions": "Be brief.", "input": "Weather in Paris?",
        "tools": [weather_tool()], "max_output_tokens": 100, "reasoning": {"effort": "none"},
        "metadata": {"run": "7"}});
    let (status, resp) = call(&state, post_responses(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"), "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert!(v["error"].is_null() && v["incomplete_details"].is_null());
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["content"][0]["type"], "output_text");
    assert_eq!(output[0]["content"][0]["text"], "I'll check.");
    let call_item = &output[1];
    assert_eq!(call_item["type"], "function_call");
    assert!(call_item["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call_item["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(call_item["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(call_item["status"], "completed");
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["max_output_tokens"], 100);
    assert_eq!(v["tools"], json!([weather_tool()]));
    assert_eq!(v["metadata"], json!({"run": "7"}));
    assert_eq!(v["store"], false);
    let sent = record.requests.lock().unwrap()[0].clone();
    let prompt_tokens = sent.prompt_token_ids.len() as u64;
    assert_eq!(v["usage"]["input_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 3);
    assert_eq!(v["usage"]["output_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + u64::from(n));
    let prompt = test_tokenizer::tokenizer().decode(&sent.prompt_token_ids).unwrap();
    assert!(prompt.contains("Be brief.") && prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "thinking off: {prompt}");
    assert_eq!(sent.sampling.unwrap().max_tokens, 100);
}

#[tokio::test]
async fn a_streamed_function_call_follows_the_typed_event_sequence() {
    let (mut script, n) = answer_script(XML_CALL);
    script.push(finished(WireFinish::Stop, n, 2));
    let (state, _) = start_engine_templated(script, QWEN_TEMPLATE).await;
    let body = json!({"input": [{"role": "user", "content": "Weather in Paris?"}], "stream": true,
        "tools": [weather_tool()]});
    let (status, resp) = call(&state, post_responses(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert!(!resp.contains("[DONE]"));
    let events = named_events(&resp);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i as u64, "{resp}");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected = vec!["response.created", "response.in_progress", "response.output_item.added"];
    expected.push("response.content_part.added");
    let text_deltas = names.iter().skip(4).take_while(|n| **n == "response.output_text.delta").count();
    expected.extend(std::iter::repeat_n("response.output_text.delta", text_deltas));
    expected.extend(["response.output_text.done", "response.content_part.done", "response.output_item.done"]);
    expected.extend(["response.output_item.added"]);
    let arg_deltas =
        names.iter().skip(expected.len()).take_while(|n| **n == "response.function_call_arguments.delta").count();
    assert!(arg_deltas >= 1, "{resp}");
    expected.extend(std::iter::repeat_n("response.function_call_arguments.delta", arg_deltas));
    expected.extend(["response.function_call_arguments.done", "response.output_item.done", "response.completed"]);
    assert_eq!(names, expected, "{resp}");

    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "I'll check.");
    let args: String = events
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), json!({"city": "Paris"}));
    let added = events.iter().filter(|(n, _)| n == "response.output_item.added").nth(1).unwrap();
    assert_eq!(added.1["output_index"], 1);
    assert_eq!(added.1["item"]["status"], "in_progress");
    let done = &events.iter().find(|(n, _)| n == "response.function_call_arguments.done").unwrap().1;
    assert_eq!(done["arguments"], args.as_str());
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["id"], created["id"]);
    assert_eq!(completed["output"][1]["arguments"], args.as_str());
    assert_eq!(completed["output"][1]["id"], added.1["item"]["id"]);
    assert_eq!(completed["usage"]["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(completed["usage"]["output_tokens"], n);
}

#[tokio::test]
async fn a_function_round_trip_in_input_reaches_the_template() {
    let (mut script, n) = answer_script("It is sunny.");
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, record) = start_engine_templated(script, QWEN_TEMPLATE).await;
    let body = json!({"tools": [weather_tool()], "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_9", "output": "Sunny, 24 C"}
    ]});
    let (status, resp) = call(&state, post_responses(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["output"].as_array().unwrap().len(), 1);
    assert_eq!(v["output"][0]["content"][0]["text"], "It is sunny.");
    let sent = record.requests.lock().unwrap()[0].clone();
    let prompt = test_tokenizer::tokenizer().decode(&sent.prompt_token_ids).unwrap();
    assert!(prompt.contains("<function=get_weather>") && prompt.contains("Paris"), "{prompt}");
    assert!(prompt.contains("<tool_response>\nSunny, 24 C\n</tool_response>"), "{prompt}");
}

#[tokio::test]
async fn the_token_limit_makes_the_response_incomplete() {
    let (mut script, n) = answer_script("cut");
    script.push(finished(WireFinish::Length, n, 0));
    let (state, _) = start_engine(script.clone(), false).await;
    let (status, resp) = call(&state, post_responses(json!({"input": "x", "max_output_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(v["output"][0]["status"], "incomplete");

    let (state, _) = start_engine(script, false).await;
    let (_, resp) = call(&state, post_responses(json!({"input": "x", "max_output_tokens": 2, "stream": true}))).await;
    let last = named_events(&resp).pop().unwrap();
    assert_eq!(last.0, "response.incomplete");
    assert_eq!(last.1["response"]["incomplete_details"]["reason"], "max_output_tokens");
}

#[tokio::test]
async fn errors_are_openai_bodies_and_a_failed_stream_says_so() {
    let (state, _) = start_engine(Vec::new(), false).await;
    for (bad, param) in [
        (json!({"input": "hi", "previous_response_id": "resp_1"}), "previous_response_id"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"input": "hi", "temperature": 3}), "temperature"),
        (json!({"model": MODEL}), "input"),
    ] {
        let (status, body) = call(&state, post_responses(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        let error = error_of(&body);
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert_eq!(error["param"], param, "{body}");
    }
    let (status, body) = call(&state, post_responses(json!("not an object"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["type"], "invalid_request_error");

    let (mut script, _) = answer_script("hello");
    script.truncate(2);
    script.push(Err(Status::internal("kv arena exploded")));
    let (state, _) = start_engine(script, false).await;
    let (status, resp) = call(&state, post_responses(json!({"input": "hi", "stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let events = named_events(&resp);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[names.len() - 2..], ["error", "response.failed"], "{resp}");
    let failed = &events.last().unwrap().1["response"];
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"]["message"].as_str().unwrap().contains("kv arena exploded"), "{resp}");
}
