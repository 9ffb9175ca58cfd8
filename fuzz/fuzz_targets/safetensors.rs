//! The safetensors reader: a single file, or `model.safetensors.index.json` with two shards.
//! Input: `file` alone, or `index \0\0SHARD\0\0 shard-1 \0\0SHARD\0\0 shard-2`.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;

use engine_models::format::safetensors::SafeTensors;
use libfuzzer_sys::fuzz_target;

static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
const SEP: &[u8] = b"\0\0SHARD\0\0";

fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(|| common::scratch_dir("safetensors"));
    for f in ["model.safetensors", "model.safetensors.index.json", "a.safetensors", "b.safetensors"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let opened = match common::split_once(data, SEP) {
        None => {
            std::fs::write(dir.join("model.safetensors"), data).unwrap();
            SafeTensors::open(&dir.join("model.safetensors"))
        }
        Some((index, shards)) => {
            let (a, b) = common::split_once(shards, SEP).unwrap_or((shards, &[]));
            std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
            std::fs::write(dir.join("a.safetensors"), a).unwrap();
            std::fs::write(dir.join("b.safetensors"), b).unwrap();
            SafeTensors::open(dir)
        }
    };
    let Ok(st) = opened else { return };
    for name in st.names() {
        if let Ok(t) = st.tensor(name) {
            let _ = t.numel();
            if t.numel() < 1 << 16 {
                let _ = t.to_f32();
            }
        }
    }
});
