//! Incremental detokenization: token ids in, text deltas out.
//!
//! Invariants: every delta is valid UTF-8 text, and the concatenation of all deltas plus
//! `finish()` equals decoding all ids at once (for byte-level and SentencePiece decoders).
//! Technique: decode a window from `prefix_offset` (a few already-emitted tokens, so
//! decoders that depend on the left context, like SentencePiece's leading space, agree with
//! a full decode) and emit only what follows the window's already-emitted text, and only
//! when it does not end in U+FFFD (the bytes of an incomplete multi-byte character, held
//! back until the next token completes it). Special tokens (EOS) decode to nothing.
//! Cost: two small decodes per token, independent of the sequence length.

use super::tokenize::{TextTokenizer, TokenizeError};

/// After this many held-back tokens the U+FFFD is real (a UTF-8 char spans at most 4 bytes,
/// each token at least one), so the text is emitted as it is instead of growing the window.
const MAX_HELD_TOKENS: usize = 8;

pub struct IncrementalDetokenizer {
    tokenizer: TextTokenizer,
    ids: Vec<u32>,
    /// Start of the decode window; ids before it never influence new text.
    prefix_offset: usize,
    /// End of what has been emitted; ids from here on are pending.
    read_offset: usize,
    /// Decoded text of `ids[prefix_offset..read_offset]`.
    prefix_text: String,
}

impl IncrementalDetokenizer {
    pub fn new(tokenizer: TextTokenizer) -> Self {
        IncrementalDetokenizer {
            tokenizer,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            prefix_text: String::new(),
        }
    }

    /// Adds one generated id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizeError> {
        self.ids.push(id);
        let window = self.tokenizer.decode(&self.ids[self.prefix_offset..])?;
        let held = self.ids.len() - self.read_offset;
        if window.ends_with('\u{FFFD}') && held < MAX_HELD_TOKENS {
            return Ok(String::new());
        }
        self.advance(window)
    }

    /// Text still held back at the end of generation (an incomplete character, as U+FFFD).
    pub fn finish(&mut self) -> Result<String, TokenizeError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let window = self.tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.advance(window)
    }

    /// Number of ids pushed so far.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn advance(&mut self, window: String) -> Result<String, TokenizeError> {
        let new_text = match window.strip_prefix(self.prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // The decoder rewrote already-emitted text (rare normalizing decoders): emit the
            // part past the common prefix, cut at a char boundary.
            None => window[common_prefix_len(&window, &self.prefix_text)..].to_owned(),
        };
        if new_text.is_empty() {
            return Ok(new_text);
        }
        // Slide the window: the ids just emitted become the left context of the next ones.
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.prefix_text = self.tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        Ok(new_text)
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut len = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        len = i + ca.len_utf8();
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenize::test_tokenizer::{self, IM_END};

    fn stream_text(ids: &[u32]) -> (Vec<String>, String) {
        let tok = test_tokenizer::tokenizer();
        let mut detok = IncrementalDetokenizer::new(tok);
        let mut deltas = Vec::new();
        for &id in ids {
            deltas.push(detok.push(id).unwrap());
        }
        deltas.push(detok.finish().unwrap());
        let joined = deltas.concat();
        (deltas, joined)
    }

    #[test]
    fn multibyte_characters_are_held_until_complete() {
        let tok = test_tokenizer::tokenizer();
        let text = "héllo wörld 😀 — 日本語 ok";
        let ids = tok.encode(text).unwrap();
        // The emoji alone is 4 byte tokens: the test really crosses chunk boundaries.
        assert!(ids.len() > text.chars().count());
        let (deltas, joined) = stream_text(&ids);
        assert_eq!(joined, text);
        assert_eq!(joined, tok.decode(&ids).unwrap());
        assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')), "{deltas:?}");
        assert!(deltas.iter().any(|d| d == "😀"), "{deltas:?}");
    }

    #[test]
    fn special_tokens_produce_no_text() {
        let tok = test_tokenizer::tokenizer();
        let mut ids = tok.encode("hi").unwrap();
        ids.push(IM_END);
        let (_, joined) = stream_text(&ids);
        assert_eq!(joined, "hi");
    }

    #[test]
    fn invalid_utf8_is_flushed_as_replacement_characters() {
        // A lone continuation byte (0x80) followed by ASCII, then a truncated 3-byte lead.
        let ids = [0x80u32, b'a' as u32, 0xE6];
        let (_, joined) = stream_text(&ids);
        let tok = test_tokenizer::tokenizer();
        assert_eq!(joined, tok.decode(&ids).unwrap());
        assert_eq!(joined, "\u{FFFD}a\u{FFFD}");
    }

    #[test]
    fn long_runs_of_invalid_bytes_do_not_grow_the_window_forever() {
        let ids = vec![0x80u32; 40];
        let tok = test_tokenizer::tokenizer();
        let mut detok = IncrementalDetokenizer::new(tok.clone());
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&detok.push(id).unwrap());
            assert!(detok.ids.len() - detok.prefix_offset <= 2 * MAX_HELD_TOKENS);
        }
        out.push_str(&detok.finish().unwrap());
        assert_eq!(out, tok.decode(&ids).unwrap());
    }
}
