//! Chat completion request validation, then the prompt path the gateway takes for a valid
//! one: tool instructions, message preparation and template rendering, with ChatML (the
//! default model's) and Qwen3.5/3.6's template (XML tool calls, list-valued content).
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;

use gateway::text::RenderInput;
use gateway::text::template::ChatTemplate;
use gateway::tools::{self, ToolFormat};
use libfuzzer_sys::fuzz_target;

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const QWEN3_5: &str = include_str!("../../gateway/src/text/testdata/qwen3_5.jinja");

static TEMPLATES: OnceLock<Vec<(ChatTemplate, ToolFormat)>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let templates = TEMPLATES.get_or_init(|| {
        [CHATML, QWEN3_5]
            .iter()
            .map(|src| (ChatTemplate::new(src, "", "<|im_end|>").expect("template compiles"), ToolFormat::detect(src)))
            .collect()
    });
    let Ok(request) = gateway::validate::parse_chat_request(data, &common::gateway_limits()) else { return };
    for (template, format) in templates {
        let instruction = tools::system_instruction(*format, &request.tools);
        let messages = tools::prepare_messages(&request.messages, *format, instruction.as_deref());
        let offered = request.tools.offered();
        let tools = (request.tools.active() && *format != ToolFormat::Generic).then(|| serde_json::Value::Array(offered));
        let _ = template.render(&RenderInput { messages, tools, extra: request.template_kwargs.clone() });
    }
});
