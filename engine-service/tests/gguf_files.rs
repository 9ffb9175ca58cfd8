//! The GGUF reader on the real model file and on damaged copies of it.
//! Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (deploy/fetch-model.sh).

mod common;

use engine_models::format::Gguf;
use engine_service::EngineError;

#[test]
fn real_model_file_parses() {
    let g = Gguf::open(&common::model_path()).expect("open");
    assert_eq!(g.version(), 3);
    assert_eq!(g.tensor_names().len(), 272);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    let t = g.tensor_with_shape("blk.0.attn_k.weight", &[576, 192]).unwrap();
    assert_eq!(t.data.len(), 192 * 18 * 20);
    let e = g.tensor_with_shape("blk.0.attn_k.weight", &[576, 576]).unwrap_err().to_string();
    assert!(e.contains("shape mismatch"), "{e}");
}

#[test]
fn damaged_copies_are_model_file_errors() {
    let bytes = std::fs::read(common::model_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.gguf", Vec::new(), "truncated"),
        ("header.gguf", bytes[..100].to_vec(), "truncated"),
        ("meta.gguf", bytes[..bytes.len() / 100].to_vec(), "truncated"),
        ("data.gguf", bytes[..bytes.len() - 1].to_vec(), "out of bounds"),
        ("magic.gguf", [b"GGUX".as_slice(), &bytes[4..4096]].concat(), "bad magic"),
    ];
    for (name, data, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        let err = Gguf::open(&path).expect_err(name);
        assert!(matches!(err, EngineError::ModelFile { .. }), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(name) && text.contains(want), "{name}: {text}");
    }
}
