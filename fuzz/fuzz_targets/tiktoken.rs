//! The tiktoken vocabulary reader (`base64 rank` lines) and its conversion to a tokenizer.
#![no_main]

use engine_models::format::tiktoken::{QWEN3_5_PATTERN, TiktokenVocab};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(vocab) = TiktokenVocab::parse(text) else { return };
    // Specials right after the ranks, as the Qwen files place them.
    let specials = vec![("<|endoftext|>".to_owned(), vocab.len() as u32)];
    if let Ok(tokenizer) = vocab.tokenizer(&specials, QWEN3_5_PATTERN, true) {
        if let Ok(enc) = tokenizer.encode("hello <|endoftext|> wörld", false) {
            let _ = tokenizer.decode(enc.get_ids(), false);
        }
    }
});
