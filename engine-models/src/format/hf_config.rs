//! HuggingFace `config.json` of the Qwen3.5 / Qwen3.6 hybrid text decoder.
//!
//! Contract: [`Qwen36Config::parse`] accepts both the vision-language layout (text keys under
//! `text_config`, `model_type: "qwen3_5"`) and a flat text-only one (`model_type:
//! "qwen3_5_text"`), reads every key of the architecture spec (section 1.2) with HF's
//! defaults where the checkpoints may omit one, derives `layer_types` from
//! `full_attention_interval` when absent, and validates the shapes the forward pass relies on.
//! Errors are [`EngineError::ModelFile`] naming the file and the key. Features the engine does
//! not implement (YaRN rope scaling, attention biases, a non-SiLU activation) are refused.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::EngineError;

/// Kind of mixer of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`"linear_attention"`).
    Linear,
    /// Gated full attention (`"full_attention"`).
    Full,
}

/// The text decoder's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen36Config {
    /// `model_type` of the text part (`qwen3_5_text`) and of the file (`qwen3_5` when nested).
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub layer_types: Vec<LayerKind>,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub partial_rotary_factor: f32,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
    pub mtp_num_hidden_layers: usize,
    /// `eos_token_id` of the text config (int or list), possibly empty.
    pub eos_token_ids: Vec<u32>,
}

impl Qwen36Config {
    /// Reads and parses `path`.
    pub fn from_file(path: &Path) -> Result<Qwen36Config, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::model_file(path, e.to_string()))?;
        Qwen36Config::parse(path, &text)
    }

    /// Parses config text; `path` is only used in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Qwen36Config, EngineError> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| EngineError::model_file(path, format!("invalid JSON: {e}")))?;
        let top = root.as_object().ok_or_else(|| EngineError::model_file(path, "not a JSON object"))?;
        let nested = top.get("text_config").filter(|v| v.is_object());
        let text_obj = nested.unwrap_or(&root);
        let r = Reader {
            path: path.to_path_buf(),
            obj: text_obj,
            prefix: if nested.is_some() { "text_config." } else { "" },
        };

        let model_type = match (top.get("model_type").and_then(Value::as_str), r.opt_str("model_type")?) {
            (_, Some(t)) => t.to_string(),
            (Some(t), None) => t.to_string(),
            (None, None) => return Err(r.err("model_type", "missing")),
        };
        if !matches!(model_type.as_str(), "qwen3_5_text" | "qwen3_5") {
            return Err(EngineError::UnsupportedModel(format!(
                "{}: model_type {model_type:?} (this loader reads qwen3_5 / qwen3_5_text)",
                path.display()
            )));
        }
        if let Some(act) = r.opt_str("hidden_act")?.filter(|a| *a != "silu") {
            return Err(EngineError::UnsupportedModel(format!("{}: hidden_act {act:?} (only silu)", path.display())));
        }
        if r.opt_bool("attention_bias")?.unwrap_or(false) {
            return Err(EngineError::UnsupportedModel(format!("{}: attention_bias true", path.display())));
        }

        let num_hidden_layers = r.usize_or("num_hidden_layers", 32)?;
        if num_hidden_layers > engine_ops::MAX_LAYERS {
            return Err(r.err("num_hidden_layers", format!("{num_hidden_layers} is over {}", engine_ops::MAX_LAYERS)));
        }
        let layer_types = match r.obj.get("layer_types") {
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v.as_str() {
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some("full_attention") => Ok(LayerKind::Full),
                    _ => {
                        Err(r.err(&format!("layer_types[{i}]"), format!("{v} is not linear_attention/full_attention")))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::Null) | None => {
                let every = r.usize_or("full_attention_interval", 4)?;
                if every == 0 {
                    return Err(r.err("full_attention_interval", "must be at least 1"));
                }
                (0..num_hidden_layers)
                    .map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear })
                    .collect()
            }
            Some(v) => return Err(r.err("layer_types", format!("{v} is not a list"))),
        };
        if layer_types.len() != num_hidden_layers {
            return Err(
                r.err("layer_types", format!("has {} entries for {num_hidden_layers} layers", layer_types.len()))
            );
        }

        // rope: `rope_parameters` (transformers 5) or the legacy top-level keys.
        let rope = r.obj.get("rope_parameters").or_else(|| r.obj.get("rope_scaling")).filter(|v| v.is_object());
        let rope_get = |k: &str| rope.and_then(|o| o.get(k)).or_else(|| r.obj.get(k));
        if let Some(t) = rope.and_then(|o| o.get("rope_type").or_else(|| o.get("type"))).and_then(Value::as_str)
            && t != "default"
            && t != "mrope"
        {
            return Err(EngineError::UnsupportedModel(format!("{}: rope_type {t:?} (only default)", path.display())));
        }
        let rope_theta = match rope_get("rope_theta") {
            Some(v) => v.as_f64().ok_or_else(|| r.err("rope_parameters.rope_theta", "not a number"))? as f32,
            None => 10_000.0,
        };
        let partial_rotary_factor = match rope_get("partial_rotary_factor") {
            Some(v) => v.as_f64().ok_or_else(|| r.err("rope_parameters.partial_rotary_factor", "not a number"))? as f32,
            None => 0.25,
        };

        let tie_word_embeddings =
            match (top.get("tie_word_embeddings"), nested.and_then(|n| n.get("tie_word_embeddings"))) {
                // The top level wins for nested configs: HF ties with the outer model's config.
                (Some(v), _) if nested.is_some() => {
                    v.as_bool().ok_or_else(|| r.err("tie_word_embeddings", "not a bool"))?
                }
                (_, Some(v)) => v.as_bool().ok_or_else(|| r.err("tie_word_embeddings", "not a bool"))?,
                (Some(v), None) => v.as_bool().ok_or_else(|| r.err("tie_word_embeddings", "not a bool"))?,
                (None, None) => false,
            };
        let eos_token_ids = match r.obj.get("eos_token_id").or_else(|| top.get("eos_token_id")) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| r.err("eos_token_id", "not a list of ids"))?,
            Some(v) => vec![v.as_u64().ok_or_else(|| r.err("eos_token_id", "not an id"))? as u32],
        };

        let c = Qwen36Config {
            model_type,
            hidden_size: r.usize_or("hidden_size", 4096)?,
            num_hidden_layers,
            layer_types,
            intermediate_size: r.usize_or("intermediate_size", 12288)?,
            num_attention_heads: r.usize_or("num_attention_heads", 16)?,
            num_key_value_heads: r.usize_or("num_key_value_heads", 4)?,
            head_dim: r.usize_or("head_dim", 256)?,
            linear_num_key_heads: r.usize_or("linear_num_key_heads", 16)?,
            linear_num_value_heads: r.usize_or("linear_num_value_heads", 32)?,
            linear_key_head_dim: r.usize_or("linear_key_head_dim", 128)?,
            linear_value_head_dim: r.usize_or("linear_value_head_dim", 128)?,
            linear_conv_kernel_dim: r.usize_or("linear_conv_kernel_dim", 4)?,
            rms_norm_eps: r.f32_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            partial_rotary_factor,
            max_position_embeddings: r.usize_or("max_position_embeddings", 32768)?,
            vocab_size: r.usize_or("vocab_size", 248320)?,
            tie_word_embeddings,
            mtp_num_hidden_layers: r.usize_or("mtp_num_hidden_layers", 0)?,
            eos_token_ids,
        };
        c.validate(&r)?;
        Ok(c)
    }

    /// Validates a config built from another source (e.g. GGUF metadata); errors name `path`
    /// and the HF key of the offending value.
    pub fn check(&self, path: &Path) -> Result<(), EngineError> {
        let null = Value::Null;
        self.validate(&Reader { path: path.to_path_buf(), obj: &null, prefix: "" })
    }

    fn validate(&self, r: &Reader) -> Result<(), EngineError> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(r.err(k, "must be positive"));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(r.err(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.linear_num_value_heads.is_multiple_of(self.linear_num_key_heads) {
            return Err(r.err(
                "linear_num_value_heads",
                format!(
                    "{} is not a multiple of linear_num_key_heads {}",
                    self.linear_num_value_heads, self.linear_num_key_heads
                ),
            ));
        }
        let rot = self.rotary_dim();
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0)
            || rot == 0
            || !rot.is_multiple_of(2)
        {
            return Err(r.err(
                "rope_parameters.partial_rotary_factor",
                format!(
                    "{} gives {rot} rotary dims of head_dim {} (need an even number > 0)",
                    self.partial_rotary_factor, self.head_dim
                ),
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(r.err("rope_parameters.rope_theta", "must be positive"));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return Err(r.err("rms_norm_eps", "must be non-negative"));
        }
        if self.mtp_num_hidden_layers > 1 {
            return Err(EngineError::UnsupportedModel(format!(
                "{}: mtp_num_hidden_layers {} (only 0 or 1)",
                r.path.display(),
                self.mtp_num_hidden_layers
            )));
        }
        if self.n_full() == 0 {
            return Err(r.err("layer_types", "no full_attention layer (the KV cache needs at least one)"));
        }
        Ok(())
    }

    /// Hk * d_k.
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    /// Hv * d_v.
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    /// Channels of the causal conv: q | k | v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Value heads per key head (consecutive grouping).
    pub fn gdn_group(&self) -> usize {
        self.linear_num_value_heads / self.linear_num_key_heads
    }
    /// Rotated dims of each full-attention head.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor as f64) as usize
    }
    pub fn n_full(&self) -> usize {
        self.layer_types.iter().filter(|k| **k == LayerKind::Full).count()
    }
    pub fn n_linear(&self) -> usize {
        self.num_hidden_layers - self.n_full()
    }
}

struct Reader<'a> {
    path: PathBuf,
    obj: &'a Value,
    prefix: &'static str,
}

impl Reader<'_> {
    fn err(&self, key: &str, problem: impl std::fmt::Display) -> EngineError {
        EngineError::model_file(&self.path, format!("{}{key}: {problem}", self.prefix))
    }
    fn usize_or(&self, key: &str, default: usize) -> Result<usize, EngineError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| self.err(key, format!("{v} is not a non-negative integer"))),
        }
    }
    fn f32_or(&self, key: &str, default: f32) -> Result<f32, EngineError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| self.err(key, format!("{v} is not a number"))),
        }
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>, EngineError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(key, format!("{v} is not a string"))),
        }
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>, EngineError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(key, format!("{v} is not a bool"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NESTED_08B: &str = r#"{
      "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
      "tie_word_embeddings": true,
      "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 1024, "num_hidden_layers": 24,
        "intermediate_size": 3584, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "vocab_size": 248320,
        "full_attention_interval": 4, "mtp_num_hidden_layers": 1, "eos_token_id": 248044,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": true}
      },
      "vision_config": {"depth": 2}
    }"#;

    #[test]
    fn nested_config_gives_spec_derived_quantities() {
        let c = Qwen36Config::parse(Path::new("config.json"), NESTED_08B).unwrap();
        assert_eq!((c.n_linear(), c.n_full()), (18, 6));
        assert_eq!(c.layer_types[3], LayerKind::Full);
        assert_eq!(
            (c.key_dim(), c.value_dim(), c.conv_dim(), c.gdn_group(), c.rotary_dim()),
            (2048, 2048, 6144, 1, 64)
        );
        assert!(c.tie_word_embeddings);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.eos_token_ids, vec![248044]);
    }

    /// Found by the hf_config/gguf fuzz targets: a layer count in the billions built a
    /// per-layer table before anything else was checked.
    #[test]
    fn an_absurd_layer_count_is_an_error_at_once() {
        let huge = NESTED_08B.replace("\"num_hidden_layers\": 24", "\"num_hidden_layers\": 1073741842");
        let started = std::time::Instant::now();
        let err = Qwen36Config::parse(Path::new("config.json"), &huge).unwrap_err().to_string();
        assert!(err.contains("num_hidden_layers") && err.contains("over 1024"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn flat_config_and_errors_name_file_and_key() {
        let flat = r#"{"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "vocab_size": 128, "intermediate_size": 96}"#;
        let c = Qwen36Config::parse(Path::new("/m/config.json"), flat).unwrap();
        assert_eq!((c.gdn_group(), c.rotary_dim(), c.rope_theta), (2, 8, 10_000.0));
        let bad = flat.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        let e = Qwen36Config::parse(Path::new("/m/config.json"), &bad).unwrap_err().to_string();
        assert!(e.contains("/m/config.json") && e.contains("num_key_value_heads"), "{e}");
        let bad = flat.replace("\"full_attention\"]", "\"mamba\"]");
        let e = Qwen36Config::parse(Path::new("/m/config.json"), &bad).unwrap_err().to_string();
        assert!(e.contains("layer_types[1]"), "{e}");
        let bad = flat.replace("qwen3_5_text", "llama");
        assert!(Qwen36Config::parse(Path::new("c.json"), &bad).is_err());
        let bad = NESTED_08B.replace("\"hidden_size\": 1024", "\"hidden_size\": \"big\"");
        let e = Qwen36Config::parse(Path::new("c.json"), &bad).unwrap_err().to_string();
        assert!(e.contains("text_config.hidden_size"), "{e}");
    }
}
