//! The GGUF-built tokenizer against llama.cpp's ids on a corpus (unicode, CJK, emoji, code,
//! whitespace runs, digits) and on the chat prompts; round trips; special tokens.
//! Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (deploy/fetch-model.sh).

mod common;

use std::str::FromStr;

use engine_models::format::Gguf;
use engine_models::tokenizer::ModelTokenizer;

use common::{ids, model_path, reference};

fn tokenizer() -> ModelTokenizer {
    let g = Gguf::open(&model_path()).expect("open model");
    ModelTokenizer::from_gguf(&g).expect("tokenizer")
}

#[test]
fn corpus_and_chat_prompts_encode_to_llama_cpp_ids() {
    let t = tokenizer();
    let r = reference();
    let mut n = 0;
    for case in r["tokenizer_corpus"].as_array().expect("corpus") {
        let text = case["text"].as_str().unwrap();
        assert_eq!(t.encode(text, false).unwrap(), ids(&case["ids"]), "text {text:?}");
        n += 1;
    }
    for p in r["prompts"].as_array().expect("prompts") {
        let text = p["prompt"].as_str().unwrap();
        assert_eq!(t.encode(text, true).unwrap(), ids(&p["prompt_ids"]), "prompt {text:?}");
        n += 1;
    }
    assert!(n >= 25);
}

#[test]
fn decode_inverts_encode() {
    let t = tokenizer();
    let r = reference();
    let extra =
        ["", "x", "  \\n\\t  ", "🦀 Rust: fn f<'a>(x: &'a str) -> &'a str { x }", "<|im_start|>system\nhi<|im_end|>"];
    let corpus = r["tokenizer_corpus"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string());
    for text in corpus.chain(extra.iter().map(|s| s.to_string())) {
        let ids = t.encode(&text, false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn special_tokens_and_end_ids_follow_the_model_file() {
    let t = tokenizer();
    assert_eq!(t.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert_eq!(t.encode("<|im_end|>", false).unwrap(), vec![2]);
    assert_eq!(t.bos_token_id, Some(1));
    assert_eq!(t.bos_token, "<|im_start|>");
    assert_eq!(t.eos_token, "<|im_end|>");
    // eos_token_id (2, <|im_end|>) plus the <|endoftext|> end marker (0).
    assert_eq!(t.eos_token_ids, vec![0, 2]);
    assert!(!t.add_bos);
    assert!(t.chat_template.contains("<|im_start|>"));
    assert_eq!(t.decode(&[1, 9690, 2], true).unwrap(), t.decode(&[9690], false).unwrap());
    assert!(t.decode(&[49152], false).is_err());
}

#[test]
fn serialized_json_rebuilds_the_same_tokenizer() {
    let t = tokenizer();
    let rebuilt = tokenizers::Tokenizer::from_str(&t.json).expect("json parses");
    let r = reference();
    for case in r["tokenizer_corpus"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let enc = rebuilt.encode(text, false).unwrap();
        assert_eq!(enc.get_ids(), ids(&case["ids"]).as_slice(), "text {text:?}");
    }
}
