//! The HF `config.json` reader for Qwen3.5/3.6 (text and VLM nesting, layer types, rope
//! parameters, quantization config) and its consistency checks.
#![no_main]

use engine_models::format::hf_config::Qwen36Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = std::path::Path::new("config.json");
    if let Ok(cfg) = Qwen36Config::parse(path, text) {
        if cfg.check(path).is_ok() {
            let _ = (cfg.key_dim(), cfg.value_dim(), cfg.conv_dim());
        }
    }
});
