//! NVIDIA ModelOpt NVFP4 checkpoints: raw tensors -> a checked [`Nvfp4Linear`] (device-neutral:
//! a backend builds its own matrix from it), and the quantization config -> which modules are
//! quantized (docs/nvfp4.md).
//!
//! Contract:
//! - [`load_linear`] takes a Linear's tensors by name (`<lin>.weight` U8 `[out, in/2]`,
//!   `<lin>.weight_scale` F8_E4M3 `[out, in/16]`, `<lin>.weight_scale_2` F32 scalar, optional
//!   `<lin>.input_scale` F32 scalar) from any source of raw tensors (a safetensors view, a test
//!   map) and checks every dtype and shape; errors name the tensor. A Linear is NVFP4 iff its
//!   `weight` is U8 **and** `weight_scale` exists (spec 8.2: some exports keep layers in BF16
//!   that their exclude list forgets, e.g. `mtp.fc`); otherwise `load_linear` returns
//!   `Ok(None)` and the caller loads the weight as a float tensor.
//! - [`Nvfp4Linear`] borrows the bytes in ModelOpt's layout; the CPU backend copies them once
//!   into its matrix (no re-layout, so the source map can be dropped after loading).
//! - `input_scale` is kept but unused by the CPU kernel (weight-only, f32 activations).
//! - [`QuantConfig`] reads `hf_quant_config.json` (`quantization.{quant_algo, group_size,
//!   exclude_modules, kv_cache_quant_algo}`) or `config.json` `quantization_config`
//!   (`quant_method: modelopt`, `quant_algo`, `ignore`, `config_groups`, `kv_cache_scheme`).

use std::path::Path;

use serde_json::Value;

use super::safetensors::{SafeTensors, StDtype, StTensor};
use crate::EngineError;
pub use engine_ops::nvfp4::{BLOCK, E2M1_VALUES, Nvfp4Linear, Nvfp4Parts, e2m1_code, quantize};

/// Element type of a raw tensor, as safetensors names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorDtype {
    U8,
    F8E4M3,
    F32,
    F16,
    BF16,
    /// Any other type (never valid for an NVFP4 Linear's tensors).
    Other,
}

impl TensorDtype {
    /// From a safetensors header dtype string ("U8", "F8_E4M3", "F32", ...).
    pub fn from_safetensors(s: &str) -> TensorDtype {
        match s {
            "U8" => TensorDtype::U8,
            "F8_E4M3" => TensorDtype::F8E4M3,
            "F32" => TensorDtype::F32,
            "F16" => TensorDtype::F16,
            "BF16" => TensorDtype::BF16,
            _ => TensorDtype::Other,
        }
    }
}

/// One tensor as a file reader hands it out: little-endian bytes, dtype and shape.
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub dtype: TensorDtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl<'a> From<StTensor<'a>> for RawTensor<'a> {
    fn from(t: StTensor<'a>) -> RawTensor<'a> {
        let dtype = match t.dtype {
            StDtype::U8 => TensorDtype::U8,
            StDtype::F8E4M3 => TensorDtype::F8E4M3,
            StDtype::F32 => TensorDtype::F32,
            StDtype::F16 => TensorDtype::F16,
            StDtype::BF16 => TensorDtype::BF16,
            _ => TensorDtype::Other,
        };
        RawTensor { dtype, shape: t.shape, data: t.data }
    }
}

/// [`load_linear`] on a safetensors checkpoint; errors become `EngineError::ModelFile` naming
/// the shard and the tensor.
pub fn load_linear_st<'a>(
    st: &'a SafeTensors,
    prefix: &str,
    expect: Option<[usize; 2]>,
) -> Result<Option<Nvfp4Linear<'a>>, EngineError> {
    load_linear(prefix, expect, |n| if st.has(n) { st.tensor(n).ok().map(RawTensor::from) } else { None }).map_err(
        |e| {
            let msg = e.to_string();
            let problem = msg.strip_prefix(&format!("tensor {}: ", e.tensor())).unwrap_or(&msg);
            st.tensor_error(e.tensor(), problem)
        },
    )
}

/// What is wrong with a checkpoint's NVFP4 tensors; every variant names the tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Nvfp4LoadError {
    #[error("tensor {tensor}: not found")]
    Missing { tensor: String },
    #[error("tensor {tensor}: dtype {got:?}, expected {want}")]
    Dtype { tensor: String, got: TensorDtype, want: &'static str },
    #[error("tensor {tensor}: shape {got:?}, expected {want}")]
    Shape { tensor: String, got: Vec<usize>, want: String },
    #[error("tensor {tensor}: {problem}")]
    Value { tensor: String, problem: String },
}

impl Nvfp4LoadError {
    /// The tensor the error is about (to build an `EngineError::ModelFile` naming its shard).
    pub fn tensor(&self) -> &str {
        match self {
            Nvfp4LoadError::Missing { tensor }
            | Nvfp4LoadError::Dtype { tensor, .. }
            | Nvfp4LoadError::Shape { tensor, .. }
            | Nvfp4LoadError::Value { tensor, .. } => tensor,
        }
    }
}

/// Loads the NVFP4 Linear `prefix` (e.g. `model.language_model.layers.0.mlp.down_proj`).
/// `get(name)` returns a tensor or `None` when the checkpoint lacks it. `expect` is the logical
/// `[out, in]` the model config implies, if known. `Ok(None)`: not an NVFP4 Linear (its
/// `weight` is not U8 or it has no `weight_scale`): load `<prefix>.weight` as a float tensor.
pub fn load_linear<'a>(
    prefix: &str,
    expect: Option<[usize; 2]>,
    get: impl Fn(&str) -> Option<RawTensor<'a>>,
) -> Result<Option<Nvfp4Linear<'a>>, Nvfp4LoadError> {
    let names = |suffix: &str| format!("{prefix}.{suffix}");
    let (wname, sname, s2name, iname) =
        (names("weight"), names("weight_scale"), names("weight_scale_2"), names("input_scale"));
    let weight = get(&wname).ok_or_else(|| Nvfp4LoadError::Missing { tensor: wname.clone() })?;
    let Some(scales) = get(&sname) else { return Ok(None) };
    if weight.dtype != TensorDtype::U8 {
        return Ok(None);
    }
    let [out, half] = matrix_shape(&wname, &weight)?;
    let cols = half * 2;
    if let Some([eo, ei]) = expect
        && (eo, ei) != (out, cols)
    {
        return Err(Nvfp4LoadError::Shape {
            tensor: wname,
            got: weight.shape.to_vec(),
            want: format!("[{eo}, {}] (packed FP4 of a [{eo}, {ei}] Linear)", ei / 2),
        });
    }
    if cols == 0 || !cols.is_multiple_of(BLOCK) {
        return Err(Nvfp4LoadError::Shape {
            tensor: wname,
            got: weight.shape.to_vec(),
            want: format!("[out, in/2] with in a positive multiple of {BLOCK}"),
        });
    }
    // Some exporters write the scale bytes as U8; the bits are the same.
    if !matches!(scales.dtype, TensorDtype::F8E4M3 | TensorDtype::U8) {
        return Err(Nvfp4LoadError::Dtype { tensor: sname, got: scales.dtype, want: "F8_E4M3" });
    }
    if scales.shape != [out, cols / BLOCK] {
        return Err(Nvfp4LoadError::Shape {
            tensor: sname,
            got: scales.shape.to_vec(),
            want: format!("[{out}, {}] (one E4M3 scale per {BLOCK} inputs)", cols / BLOCK),
        });
    }
    let s2t = get(&s2name).ok_or_else(|| Nvfp4LoadError::Missing { tensor: s2name.clone() })?;
    let global = scalar_f32(&s2name, &s2t)?;
    if !global.is_finite() || global < 0.0 {
        return Err(Nvfp4LoadError::Value {
            tensor: s2name,
            problem: format!("global scale {global} is not finite and >= 0"),
        });
    }
    let input_scale = match get(&iname) {
        Some(t) => Some(scalar_f32(&iname, &t)?),
        None => None,
    };
    let data_len = |t: &RawTensor, name: &str, want: usize| {
        if t.data.len() == want {
            Ok(())
        } else {
            Err(Nvfp4LoadError::Value {
                tensor: name.to_string(),
                problem: format!("{} bytes, shape needs {want}", t.data.len()),
            })
        }
    };
    data_len(&weight, &wname, out * half)?;
    data_len(&scales, &sname, out * (cols / BLOCK))?;
    Ok(Some(Nvfp4Linear {
        rows: out,
        cols,
        packed: weight.data,
        scales: scales.data,
        global_scale: global,
        input_scale,
    }))
}

fn matrix_shape(name: &str, t: &RawTensor) -> Result<[usize; 2], Nvfp4LoadError> {
    match t.shape {
        &[a, b] => Ok([a, b]),
        s => Err(Nvfp4LoadError::Shape { tensor: name.to_string(), got: s.to_vec(), want: "[out, in/2]".into() }),
    }
}

/// A scalar (`[]` or `[1]`) float tensor as f32.
fn scalar_f32(name: &str, t: &RawTensor) -> Result<f32, Nvfp4LoadError> {
    if t.shape.iter().product::<usize>() != 1 || t.shape.len() > 1 {
        return Err(Nvfp4LoadError::Shape {
            tensor: name.to_string(),
            got: t.shape.to_vec(),
            want: "[] (a scalar)".into(),
        });
    }
    let d = t.data;
    let short =
        || Nvfp4LoadError::Value { tensor: name.to_string(), problem: format!("{} bytes for one value", d.len()) };
    match t.dtype {
        TensorDtype::F32 => d.get(..4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(short),
        TensorDtype::BF16 => {
            d.get(..2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).ok_or_else(short)
        }
        TensorDtype::F16 => d.get(..2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).ok_or_else(short),
        got => Err(Nvfp4LoadError::Dtype { tensor: name.to_string(), got, want: "F32" }),
    }
}

/// Reads an FP8 KV scale (`…k_proj.k_scale`, `…v_proj.v_scale`, or the vLLM spellings
/// `…self_attn.k_scale`/`v_scale`; spec 8.3) among `names`; 1.0 when none is present.
pub fn kv_scale<'a>(names: &[&str], get: impl Fn(&str) -> Option<RawTensor<'a>>) -> Result<f32, Nvfp4LoadError> {
    for name in names {
        if let Some(t) = get(name) {
            let v = scalar_f32(name, &t)?;
            if !(v.is_finite() && v > 0.0) {
                return Err(Nvfp4LoadError::Value {
                    tensor: name.to_string(),
                    problem: format!("KV scale {v} is not positive"),
                });
            }
            return Ok(v);
        }
    }
    Ok(1.0)
}

/// Weight quantization algorithm of a ModelOpt checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantAlgo {
    /// W4A4 on GPUs; on the CPU the weights are used the same way as W4A16.
    Nvfp4,
    /// Same weights, activations not quantized.
    W4A16Nvfp4,
}

/// Which modules of a checkpoint are NVFP4 and whether the KV cache is FP8.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    pub algo: QuantAlgo,
    /// Inputs per block scale (always 16 for NVFP4).
    pub group_size: usize,
    /// fnmatch patterns of modules kept in high precision (see [`QuantConfig::is_excluded`]).
    pub exclude: Vec<String>,
    /// `kv_cache_quant_algo: FP8` / `kv_cache_scheme: {type: float, num_bits: 8}`.
    pub kv_cache_fp8: bool,
}

impl QuantConfig {
    /// The checkpoint directory's quantization: `hf_quant_config.json` if present, else
    /// `config.json` `quantization_config`; `Ok(None)` for an unquantized checkpoint.
    pub fn from_dir(dir: &Path) -> Result<Option<QuantConfig>, EngineError> {
        let read = |name: &str| -> Result<Option<(std::path::PathBuf, Value)>, EngineError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let v = serde_json::from_str(&text)
                        .map_err(|e| EngineError::model_file(&path, format!("not JSON: {e}")))?;
                    Ok(Some((path, v)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(EngineError::model_file(&path, e.to_string())),
            }
        };
        if let Some((path, v)) = read("hf_quant_config.json")? {
            return QuantConfig::from_hf_quant_config(&v).map(Some).map_err(|p| EngineError::model_file(path, p));
        }
        match read("config.json")? {
            Some((path, v)) => QuantConfig::from_config_json(&v).map_err(|p| EngineError::model_file(path, p)),
            None => Ok(None),
        }
    }

    /// `hf_quant_config.json` (`{"producer": …, "quantization": {…}}`).
    pub fn from_hf_quant_config(v: &Value) -> Result<QuantConfig, String> {
        let q = v.get("quantization").ok_or("hf_quant_config: no \"quantization\" object")?;
        let kv = q.get("kv_cache_quant_algo").and_then(Value::as_str).is_some_and(|s| s.eq_ignore_ascii_case("fp8"));
        QuantConfig::from_fields(q, "exclude_modules", kv)
    }

    /// `config.json`'s `quantization_config` (top level or inside `text_config`); `Ok(None)`
    /// when there is none.
    pub fn from_config_json(v: &Value) -> Result<Option<QuantConfig>, String> {
        let q =
            v.get("quantization_config").or_else(|| v.get("text_config").and_then(|t| t.get("quantization_config")));
        let Some(q) = q else { return Ok(None) };
        if let Some(m) = q.get("quant_method").and_then(Value::as_str)
            && m != "modelopt"
        {
            return Err(format!("quantization_config.quant_method {m:?} is not supported (only modelopt NVFP4)"));
        }
        let kv =
            q.get("kv_cache_scheme").is_some_and(|s| {
                s.get("type").and_then(Value::as_str) == Some("float")
                    && s.get("num_bits").and_then(Value::as_u64) == Some(8)
            }) || q.get("kv_cache_quant_algo").and_then(Value::as_str).is_some_and(|s| s.eq_ignore_ascii_case("fp8"));
        let key = if q.get("ignore").is_some() { "ignore" } else { "exclude_modules" };
        QuantConfig::from_fields(q, key, kv).map(Some)
    }

    fn from_fields(q: &Value, exclude_key: &str, kv_cache_fp8: bool) -> Result<QuantConfig, String> {
        let algo = match q.get("quant_algo").and_then(Value::as_str) {
            Some("NVFP4") => QuantAlgo::Nvfp4,
            Some("W4A16_NVFP4") => QuantAlgo::W4A16Nvfp4,
            Some(other) => return Err(format!("quant_algo {other:?} is not supported (NVFP4, W4A16_NVFP4)")),
            None => return Err("no quant_algo".into()),
        };
        // group size: explicit, or in the compressed-tensors style config_groups
        let group = q.get("group_size").and_then(Value::as_u64).or_else(|| {
            q.get("config_groups")?.as_object()?.values().find_map(|g| g.get("weights")?.get("group_size")?.as_u64())
        });
        let group_size = match group {
            Some(g) if g as usize == BLOCK => BLOCK,
            Some(g) => return Err(format!("group_size {g} is not supported (NVFP4 uses {BLOCK})")),
            None => BLOCK,
        };
        let exclude = match q.get(exclude_key) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|p| p.as_str().map(str::to_string).ok_or_else(|| format!("{exclude_key}: {p} is not a string")))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("{exclude_key} is not a list: {other}")),
        };
        Ok(QuantConfig { algo, group_size, exclude, kv_cache_fp8 })
    }

    /// Whether `module` (e.g. `model.language_model.layers.0.linear_attn.in_proj_a`) is kept
    /// in high precision. Patterns are fnmatch wildcards (`*` any run of characters, `?` one);
    /// a trailing `foo*` is read as `foo` or `foo.*` (spec 8.1), so `mtp*` excludes `mtp.fc`
    /// but `lm_head*` does not exclude a hypothetical `lm_head_2`.
    pub fn is_excluded(&self, module: &str) -> bool {
        self.exclude.iter().any(|p| match p.strip_suffix('*') {
            Some(stem) if !stem.ends_with('.') && !stem.ends_with('*') => {
                glob(stem, module) || glob(&format!("{stem}.*"), module)
            }
            _ => glob(p, module),
        })
    }

    /// Whether the config says Linear `module` is NVFP4. The tensors decide in the end
    /// ([`load_linear`] returns `None` for a BF16 weight); use this to report mismatches.
    pub fn is_quantized(&self, module: &str) -> bool {
        !self.is_excluded(module)
    }
}

/// fnmatch-style match of the whole `text`: `*` any run (dots included), `?` one character.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // last `*` position in the pattern and the text position it currently absorbs up to
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Owned {
        dtype: TensorDtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    }

    fn linear(out: usize, cols: usize) -> HashMap<String, Owned> {
        let mut m = HashMap::new();
        let p = "l";
        let codes: Vec<u8> = (0..out * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
        m.insert(format!("{p}.weight"), Owned { dtype: TensorDtype::U8, shape: vec![out, cols / 2], data: codes });
        let scales = (0..out * cols / 16).map(|i| 0x30 + (i % 16) as u8).collect();
        m.insert(
            format!("{p}.weight_scale"),
            Owned { dtype: TensorDtype::F8E4M3, shape: vec![out, cols / 16], data: scales },
        );
        m.insert(
            format!("{p}.weight_scale_2"),
            Owned { dtype: TensorDtype::F32, shape: vec![], data: 0.25f32.to_le_bytes().to_vec() },
        );
        m.insert(
            format!("{p}.input_scale"),
            Owned { dtype: TensorDtype::F32, shape: vec![], data: 0.5f32.to_le_bytes().to_vec() },
        );
        m
    }

    fn getter<'m>(m: &'m HashMap<String, Owned>) -> impl Fn(&str) -> Option<RawTensor<'m>> + 'm {
        move |n| m.get(n).map(|o| RawTensor { dtype: o.dtype, shape: &o.shape, data: &o.data })
    }

    #[test]
    fn a_valid_linear_loads_with_its_bytes_and_scales() {
        let m = linear(3, 32);
        let w = load_linear("l", Some([3, 32]), getter(&m)).unwrap().expect("is NVFP4");
        assert_eq!((w.rows, w.cols, w.global_scale, w.input_scale), (3, 32, 0.25, Some(0.5)));
        assert_eq!(w.packed, &m["l.weight"].data[..]);
        assert_eq!(w.scales, &m["l.weight_scale"].data[..]);
    }

    #[test]
    fn a_bf16_weight_or_a_missing_block_scale_is_not_nvfp4() {
        let mut m = linear(3, 32);
        m.remove("l.weight_scale");
        assert!(load_linear("l", None, getter(&m)).unwrap().is_none());
        let mut m = linear(3, 32);
        m.get_mut("l.weight").unwrap().dtype = TensorDtype::BF16;
        assert!(load_linear("l", None, getter(&m)).unwrap().is_none());
    }

    #[test]
    fn bad_tensors_give_errors_naming_the_tensor() {
        type Damage = Box<dyn Fn(&mut HashMap<String, Owned>)>;
        let cases: Vec<(&str, Damage)> = vec![
            ("l.weight", Box::new(|m| drop(m.remove("l.weight")))),
            ("l.weight_scale_2", Box::new(|m| drop(m.remove("l.weight_scale_2")))),
            ("l.weight_scale", Box::new(|m| m.get_mut("l.weight_scale").unwrap().shape = vec![3, 3])),
            ("l.weight_scale", Box::new(|m| m.get_mut("l.weight_scale").unwrap().dtype = TensorDtype::F32)),
            ("l.weight", Box::new(|m| m.get_mut("l.weight").unwrap().shape = vec![48])),
            ("l.weight", Box::new(|m| m.get_mut("l.weight").unwrap().data.pop().map(drop).unwrap_or(()))),
            ("l.weight_scale_2", Box::new(|m| m.get_mut("l.weight_scale_2").unwrap().shape = vec![2])),
            (
                "l.weight_scale_2",
                Box::new(|m| m.get_mut("l.weight_scale_2").unwrap().data = f32::NAN.to_le_bytes().to_vec()),
            ),
            ("l.input_scale", Box::new(|m| m.get_mut("l.input_scale").unwrap().dtype = TensorDtype::U8)),
        ];
        for (tensor, damage) in cases {
            let mut m = linear(3, 32);
            damage(&mut m);
            let e = load_linear("l", None, getter(&m)).unwrap_err();
            assert_eq!(e.tensor(), tensor, "{e}");
            assert!(e.to_string().contains(tensor));
        }
        let m = linear(3, 32);
        let e = load_linear("l", Some([4, 32]), getter(&m)).unwrap_err();
        assert!(matches!(e, Nvfp4LoadError::Shape { ref tensor, .. } if tensor == "l.weight"), "{e}");
        let mut m = linear(3, 32);
        // in = 24 is not a whole number of blocks
        m.get_mut("l.weight").unwrap().shape = vec![3, 12];
        assert!(load_linear("l", None, getter(&m)).is_err());
    }

    #[test]
    fn kv_scales_default_to_one_and_must_be_positive() {
        let mut m = HashMap::new();
        assert_eq!(kv_scale(&["a.k_scale"], getter(&m)).unwrap(), 1.0);
        m.insert(
            "b.k_scale".to_string(),
            Owned { dtype: TensorDtype::F32, shape: vec![], data: 2.0f32.to_le_bytes().to_vec() },
        );
        assert_eq!(kv_scale(&["a.k_scale", "b.k_scale"], getter(&m)).unwrap(), 2.0);
        m.insert("c".to_string(), Owned { dtype: TensorDtype::F32, shape: vec![], data: 0f32.to_le_bytes().to_vec() });
        assert_eq!(kv_scale(&["c"], getter(&m)).unwrap_err().tensor(), "c");
    }

    const PATTERNS: [&str; 5] = [
        "lm_head",
        "model.visual*",
        "mtp*",
        "model.language_model.layers.*.linear_attn.in_proj_a",
        "model.language_model.layers.*.linear_attn.in_proj_b",
    ];

    #[test]
    fn both_config_spellings_parse_to_the_same_config() {
        let hf: Value = serde_json::json!({"producer": {"name": "modelopt"}, "quantization": {
            "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": PATTERNS}});
        let cfg: Value = serde_json::json!({"text_config": {}, "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": PATTERNS,
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            "kv_cache_scheme": {"type": "float", "num_bits": 8}}});
        let a = QuantConfig::from_hf_quant_config(&hf).unwrap();
        let b = QuantConfig::from_config_json(&cfg).unwrap().unwrap();
        assert_eq!(a, b);
        assert_eq!((a.algo, a.group_size, a.kv_cache_fp8), (QuantAlgo::Nvfp4, 16, true));
        assert_eq!(QuantConfig::from_config_json(&serde_json::json!({"hidden_size": 8})).unwrap(), None);
        let w4a16 = serde_json::json!({"quantization": {"quant_algo": "W4A16_NVFP4"}});
        let c = QuantConfig::from_hf_quant_config(&w4a16).unwrap();
        assert_eq!((c.algo, c.kv_cache_fp8, c.exclude.len()), (QuantAlgo::W4A16Nvfp4, false, 0));
        for bad in [
            serde_json::json!({"quantization": {"quant_algo": "FP8"}}),
            serde_json::json!({"quantization": {"quant_algo": "NVFP4", "group_size": 32}}),
            serde_json::json!({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}}),
            serde_json::json!({"producer": {}}),
        ] {
            assert!(QuantConfig::from_hf_quant_config(&bad).is_err(), "{bad}");
        }
        let awq = serde_json::json!({"quantization_config": {"quant_method": "awq", "quant_algo": "NVFP4"}});
        assert!(QuantConfig::from_config_json(&awq).is_err());
    }

    #[test]
    fn exclude_patterns_follow_fnmatch_with_trailing_star_as_a_module_prefix() {
        let c = QuantConfig {
            algo: QuantAlgo::Nvfp4,
            group_size: 16,
            exclude: PATTERNS.map(String::from).to_vec(),
            kv_cache_fp8: false,
        };
        for m in [
            "lm_head",
            "mtp",
            "mtp.fc",
            "mtp.layers.0.mlp.down_proj",
            "model.visual.blocks.0.attn.qkv",
            "model.language_model.layers.0.linear_attn.in_proj_a",
            "model.language_model.layers.17.linear_attn.in_proj_b",
        ] {
            assert!(c.is_excluded(m), "{m}");
        }
        for m in [
            "lm_head_2",
            "mtpx.fc",
            "model.language_model.layers.0.linear_attn.in_proj_qkv",
            "model.language_model.layers.0.linear_attn.in_proj_a2",
            "model.language_model.layers.3.self_attn.q_proj",
            "model.visualizer",
        ] {
            assert!(c.is_quantized(m), "{m}");
        }
        assert!(glob("a*b?c", "axxbyc") && glob("*", "") && glob("a**", "a") && !glob("a?", "a") && !glob("ab", "abc"));
    }
}
