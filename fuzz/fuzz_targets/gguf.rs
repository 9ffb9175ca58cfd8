//! The GGUF reader: header, metadata, tensor table, tensor views, the tokenizer built from
//! the file's vocabulary, and the Qwen3.5/3.6 config read from its metadata.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;

use engine_models::format::Gguf;
use libfuzzer_sys::fuzz_target;

static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let path = DIR.get_or_init(|| common::scratch_dir("gguf")).join("model.gguf");
    std::fs::write(&path, data).expect("write scratch file");
    let Ok(gguf) = Gguf::open(&path) else { return };
    for key in gguf.metadata_keys() {
        let _ = gguf.value(key);
    }
    for name in gguf.tensor_names() {
        if let Ok(view) = gguf.tensor(name) {
            // Every view lies inside the file.
            let file = gguf.bytes().as_ptr_range();
            let data = view.data.as_ptr_range();
            assert!(view.data.is_empty() || (file.start <= data.start && data.end <= file.end), "{name}");
        }
    }
    let _ = engine_models::tokenizer::ModelTokenizer::from_gguf(&gguf);
    let _ = engine_models::qwen36::gguf::config_from_gguf(&gguf);
});
