//! The model's tokenizer, built from the engine's `tokenizer.json`, shared by all requests.
//!
//! Encoding never adds special tokens: the chat template writes them as text and the
//! tokenizer's added-token matching turns them into their ids. Encoding a long prompt takes
//! milliseconds of CPU, so async callers go through `spawn_blocking` (see `text::Text`).

use std::str::FromStr;
use std::sync::Arc;

use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer.json does not load: {0}")]
    Load(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
}

#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Tokenizer>,
    /// For byte-level BPE vocabularies (GPT-2 style): vocabulary char -> the byte it stands
    /// for, so a token's exact bytes are known even when they are half a UTF-8 character.
    byte_of_char: Option<Arc<std::collections::HashMap<char, u8>>>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").finish_non_exhaustive()
    }
}

impl TextTokenizer {
    pub fn from_json(json: &str) -> Result<TextTokenizer, TokenizeError> {
        let inner = Tokenizer::from_str(json).map_err(|e| TokenizeError::Load(e.to_string()))?;
        let byte_level = matches!(inner.get_decoder(), Some(tokenizers::DecoderWrapper::ByteLevel(_)));
        let byte_of_char = byte_level.then(|| Arc::new((0..=255u8).map(|b| (gpt2_byte_char(b), b)).collect()));
        Ok(TextTokenizer { inner: Arc::new(inner), byte_of_char })
    }

    /// The text and the exact bytes of one token, as OpenAI's logprobs report them: the
    /// text is the bytes decoded lossily (half of a multi-byte character shows as U+FFFD),
    /// special tokens appear as written (e.g. `<|im_end|>`).
    pub fn token_text_and_bytes(&self, id: u32) -> (String, Vec<u8>) {
        let piece = self.inner.id_to_token(id).unwrap_or_default();
        // Added tokens (specials like `<|im_end|>`) are stored as written, not byte-mapped.
        let added = self.inner.get_added_vocabulary().simple_id_to_token(id).is_some();
        let bytes = match &self.byte_of_char {
            Some(map) if !added => piece
                .chars()
                .map(|c| map.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| piece.clone().into_bytes()),
            _ if added => piece.into_bytes(),
            _ => self.inner.decode(&[id], false).map(String::into_bytes).unwrap_or_default(),
        };
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Token ids of `text`, without adding special tokens. Blocking CPU work.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self.inner.encode(text, false).map_err(|e| TokenizeError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids` with special tokens (EOS, template markers) left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.inner.decode(ids, true).map_err(|e| TokenizeError::Decode(e.to_string()))
    }
}

/// GPT-2's reversible byte -> printable char mapping that byte-level BPE vocabularies use:
/// printable Latin-1 bytes stand for themselves, the others for U+0100 onwards in order.
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let offset = (0u8..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + offset).unwrap_or('\u{FFFD}')
}

#[cfg(test)]
pub(crate) mod test_tokenizer {
    //! A tiny byte-level BPE tokenizer built by hand: every byte is a token (ids 0..256 in
    //! GPT-2's byte-to-unicode order), plus a few merges and ChatML special tokens, so
    //! multi-byte characters span several tokens exactly as in real byte-level models.
    use super::TextTokenizer;

    /// GPT-2's reversible byte -> printable char mapping.
    pub fn byte_to_char(b: u8) -> char {
        let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if printable(b) {
            return char::from(b);
        }
        let offset = (0u8..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + offset).unwrap()
    }

    pub const IM_START: u32 = 260;
    pub const IM_END: u32 = 261;

    pub fn json() -> String {
        let mut vocab = serde_json::Map::new();
        for b in 0..=255u8 {
            vocab.insert(byte_to_char(b).to_string(), (b as u32).into());
        }
        // Merges: "he" -> 256, "ll" -> 257, "Ġw" -> 258 (space + w), "é" bytes -> 259.
        let e_acute: String = "é".bytes().map(byte_to_char).collect();
        vocab.insert("he".into(), 256.into());
        vocab.insert("ll".into(), 257.into());
        vocab.insert("Ġw".into(), 258.into());
        vocab.insert(e_acute.clone(), 259.into());
        let merges = vec![
            "h e".to_owned(),
            "l l".to_owned(),
            "Ġ w".to_owned(),
            e_acute.chars().map(String::from).collect::<Vec<_>>().join(" "),
        ];
        serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [
                {"id": IM_START, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": IM_END, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": merges}
        })
        .to_string()
    }

    pub fn tokenizer() -> TextTokenizer {
        TextTokenizer::from_json(&json()).expect("hand-built tokenizer loads")
    }
}

#[cfg(test)]
mod tests {
    use super::test_tokenizer::{self, IM_END, IM_START};

    #[test]
    fn encodes_special_tokens_from_text_and_round_trips_bytes() {
        let tok = test_tokenizer::tokenizer();
        let ids = tok.encode("<|im_start|>hello wé😀<|im_end|>").unwrap();
        assert_eq!(ids.first(), Some(&IM_START));
        assert_eq!(ids.last(), Some(&IM_END));
        assert!(ids.contains(&256) && ids.contains(&257) && ids.contains(&258) && ids.contains(&259), "{ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), "hello wé😀");
    }

    #[test]
    fn malformed_tokenizer_json_is_an_error() {
        assert!(super::TextTokenizer::from_json("{\"model\": 3}").is_err());
    }
}
