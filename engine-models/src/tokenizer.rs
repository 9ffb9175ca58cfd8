//! Tokenizer from model metadata.
//!
//! Contract: [`ModelTokenizer::from_gguf`] turns a GGUF's `tokenizer.ggml.*` keys (model
//! `gpt2`, i.e. byte-level BPE) into a HuggingFace `tokenizers::Tokenizer` that encodes text
//! exactly as llama.cpp does for the same file, and serializes it (`json`) so the gateway can
//! rebuild the identical tokenizer from the engine's `Info`. Control tokens
//! (`token_type == 3`) become special added tokens, so `<|im_start|>` in rendered chat text
//! encodes to one id; user-defined tokens (`token_type == 4`) become non-special added tokens;
//! unused ones (`token_type == 5`, the converter's `[PADn]` padding) are left out of the
//! vocabulary, so they decode to nothing.
//!
//! Pre-tokenizer by `tokenizer.ggml.pre` (llama.cpp's names):
//! - `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva`: every
//!   Unicode number split off alone, then the GPT-2 byte-level regex (HF: `Digits` with
//!   `individual_digits`, then `ByteLevel`; SmolLM2's own tokenizer.json has the same).
//!
//! - `gpt2`, `default` or absent: the GPT-2 byte-level regex.
//! - `qwen2`, `qwen35`, `llama-bpe`/`llama3`: their split regex, then byte-level without a
//!   regex (`qwen35` = Qwen3.5/3.6: `\p{M}` joins letters). No normalizer, as in llama.cpp,
//!   whose reference ids for the real Qwen3.5 tokenizer (`models/ggml-vocab-qwen35.gguf.out`,
//!   made by the HF tokenizer) keep decomposed text decomposed; all 50 of them are matched.
//!
//! Any other value is refused rather than tokenizing subtly differently.
//!
//! [`ModelTokenizer::from_hf_dir`] reads an HF checkpoint's `tokenizer.json` as is (plus the
//! chat template and EOS facts beside it); [`ModelTokenizer::byte_level_fallback`] serves
//! random-weight runs that have no tokenizer file.
//!
//! End-of-sequence rule ([`ModelTokenizer::eos_token_ids`]): `tokenizer.ggml.eos_token_id`,
//! `tokenizer.ggml.eot_token_id` and `tokenizer.ggml.eom_token_id` when present, plus every
//! control token whose text is a known end-of-turn/end-of-text marker (`<|im_end|>`,
//! `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`, `<|end|>`, `<end_of_turn>`,
//! `<|end_of_text|>`, `</s>`), as llama.cpp also stops on these. Sorted, deduplicated.

use std::path::Path;
use std::str::FromStr;

use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::EngineError;
use crate::format::Gguf;

const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// Padding entries (`[PAD123]`) the converter adds up to the embedding's row count.
const TOKEN_TYPE_UNUSED: i64 = 5;

const END_MARKERS: &[&str] =
    &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>", "</s>"];

const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The model's tokenizer and the special-token facts the gateway needs.
#[derive(Clone)]
pub struct ModelTokenizer {
    pub tokenizer: Tokenizer,
    /// `tokenizer.json` text of `tokenizer` (HF format).
    pub json: String,
    /// Jinja chat template from `tokenizer.chat_template` (empty when the file has none).
    pub chat_template: String,
    pub bos_token_id: Option<u32>,
    /// Ids that end generation; see the module docs for the rule.
    pub eos_token_ids: Vec<u32>,
    /// Text of the BOS token ("" when none).
    pub bos_token: String,
    /// Text of `tokenizer.ggml.eos_token_id` ("" when none).
    pub eos_token: String,
    /// Whether `encode(_, true)` prepends BOS (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    pub vocab_size: usize,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

impl ModelTokenizer {
    /// Builds the tokenizer from GGUF metadata. Errors name the file and the problem.
    pub fn from_gguf(gguf: &Gguf) -> Result<ModelTokenizer, EngineError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(
                gguf.error(format!("tokenizer.ggml.model {model:?} is not supported (only byte-level BPE, \"gpt2\")"))
            );
        }
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let n_vocab = tokens.len();
        let token_types = match gguf.value("tokenizer.ggml.token_type") {
            Some(_) => gguf.get_i64_array("tokenizer.ggml.token_type")?,
            None => vec![1; n_vocab],
        };
        if token_types.len() != n_vocab {
            return Err(
                gguf.error(format!("tokenizer.ggml.token_type has {} entries for {n_vocab} tokens", token_types.len()))
            );
        }
        // The converter writes no merges key for a vocabulary without merges (a byte-only
        // one, as in the tiny test models); llama.cpp refuses such files, we read no merges.
        let merges = match gguf.value("tokenizer.ggml.merges") {
            Some(_) => gguf.get_str_array("tokenizer.ggml.merges")?,
            None => Vec::new(),
        };
        let pre = gguf.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
        let add_bos = gguf.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        let add_eos = gguf.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let id_key = |key: &str| -> Result<Option<u32>, EngineError> {
            match gguf.opt_u32(key)? {
                Some(id) if (id as usize) < n_vocab => Ok(Some(id)),
                Some(id) => Err(gguf.error(format!("{key} {id} is outside the vocabulary of {n_vocab}"))),
                None => Ok(None),
            }
        };
        let bos_token_id = id_key("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = id_key("tokenizer.ggml.eos_token_id")?;
        let eot_token_id = id_key("tokenizer.ggml.eot_token_id")?;
        let eom_token_id = id_key("tokenizer.ggml.eom_token_id")?;

        let mut vocab = serde_json::Map::with_capacity(n_vocab);
        let mut added = Vec::new();
        for (id, (&text, &ty)) in tokens.iter().zip(&token_types).enumerate() {
            // Unused ids are left out: they decode to nothing, as in llama.cpp (and as ids
            // past an HF tokenizer's vocabulary do), instead of to their placeholder text.
            if ty == TOKEN_TYPE_UNUSED {
                continue;
            }
            // A repeated token text keeps its first id, as a dict-built vocab would.
            vocab.entry(text.to_string()).or_insert(json!(id));
            if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                added.push(json!({
                    "id": id, "content": text, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
                }));
            }
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| gguf.error(format!("tokenizer.ggml.merges[{i}] {m:?} has no space")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let token_text = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize)).map(|s| s.to_string());
        let json = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer(pre).ok_or_else(|| {
                gguf.error(format!("tokenizer.ggml.pre {pre:?} is not supported"))
            })?,
            "post_processor": post_processor(
                add_bos.then(|| bos_token_id.zip(token_text(bos_token_id))).flatten(),
                add_eos.then(|| eos_token_id.zip(token_text(eos_token_id))).flatten(),
            ),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": merges,
            },
        });
        let tokenizer =
            Tokenizer::from_str(&json.to_string()).map_err(|e| gguf.error(format!("cannot build tokenizer: {e}")))?;
        let json = tokenizer.to_string(false).map_err(|e| EngineError::Tokenizer(e.to_string()))?;

        let mut eos_token_ids: Vec<u32> = [eos_token_id, eot_token_id, eom_token_id].into_iter().flatten().collect();
        for (id, (&text, &ty)) in tokens.iter().zip(&token_types).enumerate() {
            if ty == TOKEN_TYPE_CONTROL && END_MARKERS.contains(&text) {
                eos_token_ids.push(id as u32);
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();

        Ok(ModelTokenizer {
            tokenizer,
            json,
            chat_template: gguf.opt_str("tokenizer.chat_template")?.unwrap_or("").to_string(),
            bos_token_id,
            eos_token_ids,
            bos_token: token_text(bos_token_id).unwrap_or_default(),
            eos_token: token_text(eos_token_id).unwrap_or_default(),
            add_bos,
            vocab_size: n_vocab,
        })
    }

    /// Builds the tokenizer of an HF checkpoint directory: `tokenizer.json` (required), the
    /// chat template from `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template`, else `default_template`; BOS/EOS text and `add_bos_token` from
    /// `tokenizer_config.json`. End ids: `config_eos` (config.json), `generation_config.json`'s
    /// `eos_token_id`, the EOS token's id, and the end markers of the module docs.
    pub fn from_hf_dir(dir: &Path, default_template: &str, config_eos: &[u32]) -> Result<ModelTokenizer, EngineError> {
        let tok_path = dir.join("tokenizer.json");
        let json = std::fs::read_to_string(&tok_path).map_err(|e| EngineError::model_file(&tok_path, e.to_string()))?;
        let tokenizer = Tokenizer::from_str(&json)
            .map_err(|e| EngineError::model_file(&tok_path, format!("cannot build tokenizer: {e}")))?;
        let read_json = |name: &str| -> Result<Option<Value>, EngineError> {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&p).map_err(|e| EngineError::model_file(&p, e.to_string()))?;
            serde_json::from_str(&text).map(Some).map_err(|e| EngineError::model_file(&p, format!("invalid JSON: {e}")))
        };
        let tcfg = read_json("tokenizer_config.json")?.unwrap_or(Value::Null);
        let template_file = dir.join("chat_template.jinja");
        let chat_template = if template_file.is_file() {
            std::fs::read_to_string(&template_file)
                .map_err(|e| EngineError::model_file(&template_file, e.to_string()))?
        } else {
            match tcfg.get("chat_template") {
                Some(Value::String(t)) => t.clone(),
                // A list of named templates: take "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .unwrap_or(default_template)
                    .to_string(),
                _ => default_template.to_string(),
            }
        };
        let token_text = |key: &str| -> String {
            match tcfg.get(key) {
                Some(Value::String(t)) => t.clone(),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
                _ => String::new(),
            }
        };
        let bos_token = token_text("bos_token");
        let eos_token = token_text("eos_token");
        let add_bos = tcfg.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false);
        let id_of = |t: &str| if t.is_empty() { None } else { tokenizer.token_to_id(t) };
        let bos_token_id = if add_bos { id_of(&bos_token) } else { None };

        let mut eos_token_ids: Vec<u32> = config_eos.to_vec();
        if let Some(g) = read_json("generation_config.json")? {
            match g.get("eos_token_id") {
                Some(Value::Array(a)) => eos_token_ids.extend(a.iter().filter_map(|v| v.as_u64().map(|x| x as u32))),
                Some(v) => eos_token_ids.extend(v.as_u64().map(|x| x as u32)),
                None => {}
            }
        }
        eos_token_ids.extend(id_of(&eos_token));
        for marker in END_MARKERS {
            if let Some(id) = tokenizer.get_added_vocabulary().token_to_id(marker, tokenizer.get_model()) {
                eos_token_ids.push(id);
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(ModelTokenizer {
            tokenizer,
            json,
            chat_template,
            bos_token_id,
            eos_token_ids,
            bos_token,
            eos_token,
            add_bos,
            vocab_size,
        })
    }

    /// A byte-level tokenizer for running without a tokenizer file (random-weight
    /// measurements): the 256 bytes are ids 0..256 (no merges), and the Qwen3.5 special
    /// tokens sit at their real ids (from 248044) where `model_vocab` has room. Ids the model
    /// produces outside this vocabulary decode to nothing.
    pub fn byte_level_fallback(model_vocab: usize, chat_template: &str) -> Result<ModelTokenizer, EngineError> {
        let mut vocab = serde_json::Map::with_capacity(256);
        for (b, ch) in byte_level_chars().into_iter().enumerate() {
            vocab.insert(ch.to_string(), json!(b));
        }
        let added: Vec<Value> = QWEN_SPECIALS
            .iter()
            .filter(|(id, _)| (*id as usize) < model_vocab)
            .map(|(id, text)| {
                json!({"id": id, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": text.starts_with("<|")})
            })
            .collect();
        let json = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
            "pre_tokenizer": byte_level(true), "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": []},
        });
        let tokenizer = Tokenizer::from_str(&json.to_string()).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let json = tokenizer.to_string(false).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let eos_token_ids: Vec<u32> =
            [248044u32, 248046].into_iter().filter(|&id| (id as usize) < model_vocab).collect();
        Ok(ModelTokenizer {
            tokenizer,
            json,
            chat_template: chat_template.to_string(),
            bos_token_id: None,
            eos_token_ids,
            bos_token: String::new(),
            eos_token: if model_vocab > 248046 { "<|im_end|>".into() } else { String::new() },
            add_bos: false,
            vocab_size: model_vocab.max(256),
        })
    }

    /// Token ids of `text`. Special-token text (e.g. `<|im_start|>`) always maps to its id;
    /// `add_special` adds BOS/EOS where the model file asks for them.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, EngineError> {
        let enc = self.tokenizer.encode(text, add_special).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops control tokens. Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, EngineError> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(EngineError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        self.tokenizer.decode(ids, skip_special).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.binary_search(&id).is_ok()
    }
}

/// Special tokens of the Qwen3.5 / Qwen3.6 vocabulary (architecture spec §6.1).
const QWEN_SPECIALS: &[(u32, &str)] = &[
    (248044, "<|endoftext|>"),
    (248045, "<|im_start|>"),
    (248046, "<|im_end|>"),
    (248047, "<|object_ref_start|>"),
    (248048, "<|object_ref_end|>"),
    (248049, "<|box_start|>"),
    (248050, "<|box_end|>"),
    (248051, "<|quad_start|>"),
    (248052, "<|quad_end|>"),
    (248053, "<|vision_start|>"),
    (248054, "<|vision_end|>"),
    (248055, "<|vision_pad|>"),
    (248056, "<|image_pad|>"),
    (248057, "<|video_pad|>"),
    (248058, "<tool_call>"),
    (248059, "</tool_call>"),
    (248060, "<|fim_prefix|>"),
    (248061, "<|fim_middle|>"),
    (248062, "<|fim_suffix|>"),
    (248063, "<|fim_pad|>"),
    (248064, "<|repo_name|>"),
    (248065, "<|file_sep|>"),
    (248066, "<tool_response>"),
    (248067, "</tool_response>"),
    (248068, "<think>"),
    (248069, "</think>"),
];

/// GPT-2's byte -> printable character map (the ByteLevel alphabet), indexed by byte.
fn byte_level_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('?')
            }
        })
        .collect()
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn pre_tokenizer(pre: &str) -> Option<Value> {
    let split = |regex: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Some(match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]})
        }
        "gpt2" | "default" => byte_level(true),
        "qwen2" => split(QWEN2_REGEX),
        "qwen35" => split(crate::format::tiktoken::QWEN3_5_PATTERN),
        "llama-bpe" | "llama3" => split(LLAMA3_REGEX),
        _ => return None,
    })
}

fn post_processor(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Value {
    if bos.is_none() && eos.is_none() {
        return json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
    }
    let special = |(_, text): &(u32, String)| json!({"SpecialToken": {"id": text, "type_id": 0}});
    let seq = |name: &str| json!({"Sequence": {"id": name, "type_id": 0}});
    let wrap = |name: &str| -> Vec<Value> {
        bos.iter().map(special).chain([seq(name)]).chain(eos.iter().map(special)).collect()
    };
    let single = wrap("A");
    let pair: Vec<Value> = wrap("A").into_iter().chain(wrap("B")).collect();
    let special_tokens: serde_json::Map<String, Value> = bos
        .iter()
        .chain(eos.iter())
        .map(|(id, text)| (text.clone(), json!({"id": text, "ids": [id], "tokens": [text]})))
        .collect();
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
}
