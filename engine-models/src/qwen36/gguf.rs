//! Qwen3.5 / Qwen3.6 from a llama.cpp GGUF file (`general.architecture = qwen35`).
//!
//! Contract: [`config_from_gguf`] turns the `qwen35.*` metadata into the same [`Qwen36Config`]
//! an HF `config.json` gives, and [`GgufQwen35Weights`] hands out every tensor under its
//! canonical (HF) name with llama.cpp's converter transforms undone (`convert_hf_to_gguf.py`,
//! `Qwen3_5TextModel` = `_LinearAttentionVReorderBase` + `Qwen3NextModel` + `_QwenMtpMixin`):
//! - RMSNorm weights other than the GDN output norm were stored as `1 + w` (llama.cpp's norm
//!   is `x̂·w`, HF's is `x̂·(1 + w)`): we subtract 1 (exact in f32 for weights near 1).
//! - `A_log` was stored as `ssm_a = -exp(A_log)`: we return `ln(-ssm_a)`.
//! - `dt_bias` is `ssm_dt.bias`; `conv1d.weight` `[C, 1, K]` was squeezed to `[C, K]`.
//! - When `Hv > Hk` the value heads were reordered from grouped-by-key-head
//!   (`[k][r][d]`, HF) to tiled (`[r][k][d]`, for ggml's broadcast) in the V rows of
//!   `in_proj_qkv`, the rows of `in_proj_z`, `in_proj_a`, `in_proj_b`, `A_log`, `dt_bias`, the
//!   V channels of `conv1d` and the columns of `out_proj`: we apply the inverse permutation.
//! - The MTP module became block `n_layer` (`blk.{n}.nextn.{eh_proj,enorm,hnorm,
//!   shared_head_norm}` plus an ordinary decoder block `blk.{n}.attn_q…`); `block_count`
//!   counts it and `nextn_predict_layers` says how many such blocks there are.
//! - A tied head has no `output.weight`.
//!
//! The attention `q_proj` keeps HF's per-head `[q | gate]` interleaving (llama.cpp views it
//! in place), so it needs no transform; files converted with `--fuse-qkv` store a
//! full-attention layer's q, k, v as one `attn_qkv` whose row ranges we hand out.
//!
//! Matrices stay in their file type: F32 and BF16 as float matrices, F16/Q8_0/Q4_0/Q4_1
//! packed for the quantized GEMM. Permuting rows moves whole rows; permuting `out_proj`'s
//! columns moves whole quantization blocks when `d_v` is a multiple of the block (Q8_0/Q4_x
//! on every released model). K-quant blocks (256 values) span two heads of 128: then the
//! matrix stays in the file's order and its input is scattered into that order per call
//! ([`MatrixData::Scattered`]); other types that split a block are dequantized to f32 (exact,
//! more memory).
//! Any other tensor type is an error naming the tensor and its type.

use std::borrow::Cow;

use crate::EngineError;
use crate::format::gguf::{Gguf, MetaValue, TensorView};
use crate::format::hf_config::{LayerKind, Qwen36Config};
use crate::format::tensor::dequantize_row;
use crate::format::{GgmlType, MatrixData, MatrixDesc};

use super::weights::WeightSource;

/// `general.architecture` of the dense Qwen3.5 / Qwen3.6 text model.
pub const QWEN35_ARCH: &str = "qwen35";
/// The MoE variant: different FFN tensors, refused by [`config_from_gguf`].
pub const QWEN35MOE_ARCH: &str = "qwen35moe";

fn key(k: &str) -> String {
    format!("{QWEN35_ARCH}.{k}")
}

/// The model's hyper-parameters from `qwen35.*` metadata (names in the module docs of
/// llama.cpp's `llama-arch.cpp`); errors name the file and the key.
pub fn config_from_gguf(g: &Gguf) -> Result<Qwen36Config, EngineError> {
    let arch = g.get_str("general.architecture")?;
    if arch == QWEN35MOE_ARCH {
        return Err(EngineError::UnsupportedModel(format!(
            "{}: architecture qwen35moe (the mixture-of-experts Qwen3.5/3.6) is not supported; only qwen35",
            g.path().display()
        )));
    }
    if arch != QWEN35_ARCH {
        return Err(EngineError::UnsupportedModel(format!(
            "{}: architecture {arch:?} (this loader reads qwen35)",
            g.path().display()
        )));
    }
    let block_count = g.get_usize(&key("block_count"))?;
    if block_count > engine_ops::MAX_LAYERS {
        return Err(g.error(format!("{} {block_count} is over {}", key("block_count"), engine_ops::MAX_LAYERS)));
    }
    let n_mtp = g.opt_u32(&key("nextn_predict_layers"))?.unwrap_or(0) as usize;
    let num_hidden_layers = block_count.checked_sub(n_mtp).filter(|&n| n > 0).ok_or_else(|| {
        g.error(format!("{} {n_mtp} leaves no decoder layer of {block_count}", key("nextn_predict_layers")))
    })?;
    let layer_types = match g.value(&key("attention.recurrent_layers")) {
        Some(MetaValue::Array(flags)) => {
            if flags.len() < num_hidden_layers {
                return Err(g.error(format!(
                    "{} has {} entries for {num_hidden_layers} layers",
                    key("attention.recurrent_layers"),
                    flags.len()
                )));
            }
            flags[..num_hidden_layers]
                .iter()
                .enumerate()
                .map(|(i, f)| match f {
                    MetaValue::Bool(true) => Ok(LayerKind::Linear),
                    MetaValue::Bool(false) => Ok(LayerKind::Full),
                    other => {
                        Err(g.error(format!("{}[{i}]: {other:?} is not a bool", key("attention.recurrent_layers"))))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(other) => return Err(g.error(format!("{}: {other:?} is not an array", key("attention.recurrent_layers")))),
        None => {
            let every = g.opt_u32(&key("full_attention_interval"))?.unwrap_or(4) as usize;
            if every == 0 {
                return Err(g.error(format!("{} must be at least 1", key("full_attention_interval"))));
            }
            (0..num_hidden_layers)
                .map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear })
                .collect()
        }
    };
    if let Some(t) = g.opt_str(&key("rope.scaling.type"))?.filter(|t| *t != "none") {
        return Err(EngineError::UnsupportedModel(format!(
            "{}: {} {t:?} (only unscaled RoPE)",
            g.path().display(),
            key("rope.scaling.type")
        )));
    }
    let hidden_size = g.get_usize(&key("embedding_length"))?;
    let num_attention_heads = g.get_usize(&key("attention.head_count"))?;
    let head_dim = match g.opt_u32(&key("attention.key_length"))? {
        Some(d) => d as usize,
        None => hidden_size / num_attention_heads.max(1),
    };
    if let Some(v) = g.opt_u32(&key("attention.value_length"))?
        && v as usize != head_dim
    {
        return Err(g.error(format!("{} {v} differs from the key length {head_dim}", key("attention.value_length"))));
    }
    let rotary = match g.opt_u32(&key("rope.dimension_count"))? {
        Some(r) => r as usize,
        None => head_dim / 4,
    };
    let linear_num_value_heads = g.get_usize(&key("ssm.time_step_rank"))?;
    let inner = g.get_usize(&key("ssm.inner_size"))?;
    if linear_num_value_heads == 0 || !inner.is_multiple_of(linear_num_value_heads) {
        return Err(g.error(format!(
            "{} {inner} is not a multiple of {} {linear_num_value_heads}",
            key("ssm.inner_size"),
            key("ssm.time_step_rank")
        )));
    }
    let embd = g.tensor("token_embd.weight")?;
    let vocab_size = match embd.dims {
        [h, v] if *h as usize == hidden_size => *v as usize,
        d => return Err(g.error(format!("tensor token_embd.weight: shape {d:?}, expected [{hidden_size}, vocab]"))),
    };
    let cfg = Qwen36Config {
        model_type: "qwen3_5_text".into(),
        hidden_size,
        num_hidden_layers,
        layer_types,
        intermediate_size: g.get_usize(&key("feed_forward_length"))?,
        num_attention_heads,
        num_key_value_heads: g.get_usize(&key("attention.head_count_kv"))?,
        head_dim,
        linear_num_key_heads: g.get_usize(&key("ssm.group_count"))?,
        linear_num_value_heads,
        linear_key_head_dim: g.get_usize(&key("ssm.state_size"))?,
        linear_value_head_dim: inner / linear_num_value_heads,
        linear_conv_kernel_dim: g.get_usize(&key("ssm.conv_kernel"))?,
        rms_norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
        partial_rotary_factor: rotary as f32 / head_dim.max(1) as f32,
        max_position_embeddings: g.opt_u32(&key("context_length"))?.map_or(32768, |n| n as usize),
        vocab_size,
        tie_word_embeddings: !g.has_tensor("output.weight"),
        mtp_num_hidden_layers: n_mtp,
        eos_token_ids: g.opt_u32("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
    };
    if cfg.rotary_dim() != rotary {
        return Err(g.error(format!("{} {rotary} does not fit head_dim {head_dim}", key("rope.dimension_count"))));
    }
    cfg.check(g.path())?;
    Ok(cfg)
}

/// How a stored tensor differs from its HF counterpart.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Transform {
    None,
    /// Stored `1 + w`.
    NormPlusOne,
    /// Stored `-exp(A_log)`, value heads tiled.
    NegExpTiledHeads,
    /// Value heads tiled, one value per head (`dt_bias`, `in_proj_a/b` rows).
    TiledHeads,
    /// Rows `[q | k | v]`, the V rows tiled by value head (`in_proj_qkv`, `conv1d`).
    TiledVRows,
    /// Rows are value-head rows of `d_v`, tiled (`in_proj_z`).
    TiledValueRows,
    /// Columns are value-head columns of `d_v`, tiled (`out_proj`).
    TiledValueCols,
}

/// Weights of a `qwen35` GGUF by canonical name (see the module docs for the transforms).
pub struct GgufQwen35Weights<'a> {
    g: &'a Gguf,
    cfg: &'a Qwen36Config,
}

impl<'a> GgufQwen35Weights<'a> {
    pub fn new(g: &'a Gguf, cfg: &'a Qwen36Config) -> GgufQwen35Weights<'a> {
        GgufQwen35Weights { g, cfg }
    }

    /// The GGUF tensor name and transform of a canonical name; `None` for names the file
    /// format has no tensor for (e.g. FP8 KV scales).
    fn resolve(&self, name: &str) -> Option<(String, Transform)> {
        use Transform::*;
        let n = self.cfg.num_hidden_layers;
        let top = match name {
            "embed_tokens.weight" => Some(("token_embd.weight".to_string(), None)),
            "lm_head.weight" => Some(("output.weight".to_string(), None)),
            "norm.weight" => Some(("output_norm.weight".to_string(), NormPlusOne)),
            "mtp.fc.weight" => Some((format!("blk.{n}.nextn.eh_proj.weight"), None)),
            "mtp.pre_fc_norm_embedding.weight" => Some((format!("blk.{n}.nextn.enorm.weight"), NormPlusOne)),
            "mtp.pre_fc_norm_hidden.weight" => Some((format!("blk.{n}.nextn.hnorm.weight"), NormPlusOne)),
            "mtp.norm.weight" => Some((format!("blk.{n}.nextn.shared_head_norm.weight"), NormPlusOne)),
            _ => Option::None,
        };
        if top.is_some() {
            return top;
        }
        let (block, rest) = if let Some(rest) = name.strip_prefix("mtp.layers.") {
            let (i, rest) = rest.split_once('.')?;
            (n.checked_add(i.parse::<usize>().ok()?)?, rest)
        } else {
            let rest = name.strip_prefix("layers.")?;
            let (i, rest) = rest.split_once('.')?;
            (i.parse::<usize>().ok()?, rest)
        };
        let (suffix, t) = match rest {
            "input_layernorm.weight" => ("attn_norm.weight", NormPlusOne),
            "post_attention_layernorm.weight" => ("post_attention_norm.weight", NormPlusOne),
            "mlp.gate_proj.weight" => ("ffn_gate.weight", None),
            "mlp.up_proj.weight" => ("ffn_up.weight", None),
            "mlp.down_proj.weight" => ("ffn_down.weight", None),
            "self_attn.q_proj.weight" => ("attn_q.weight", None),
            "self_attn.k_proj.weight" => ("attn_k.weight", None),
            "self_attn.v_proj.weight" => ("attn_v.weight", None),
            "self_attn.o_proj.weight" => ("attn_output.weight", None),
            "self_attn.q_norm.weight" => ("attn_q_norm.weight", NormPlusOne),
            "self_attn.k_norm.weight" => ("attn_k_norm.weight", NormPlusOne),
            "linear_attn.in_proj_qkv.weight" => ("attn_qkv.weight", TiledVRows),
            "linear_attn.in_proj_z.weight" => ("attn_gate.weight", TiledValueRows),
            "linear_attn.in_proj_a.weight" => ("ssm_alpha.weight", TiledHeads),
            "linear_attn.in_proj_b.weight" => ("ssm_beta.weight", TiledHeads),
            "linear_attn.out_proj.weight" => ("ssm_out.weight", TiledValueCols),
            "linear_attn.conv1d.weight" => ("ssm_conv1d.weight", TiledVRows),
            "linear_attn.A_log" => ("ssm_a", NegExpTiledHeads),
            "linear_attn.dt_bias" => ("ssm_dt.bias", TiledHeads),
            // The gated output norm is HF's plain `x̂·w`: stored as is.
            "linear_attn.norm.weight" => ("ssm_norm.weight", None),
            _ => return Option::None,
        };
        Some((format!("blk.{block}.{suffix}"), t))
    }

    fn resolve_or_err(&self, name: &str) -> Result<(String, Transform), EngineError> {
        self.resolve(name).ok_or_else(|| self.g.error(format!("no qwen35 GGUF tensor corresponds to {name}")))
    }

    /// The stored row (column, conv channel, value) holding each HF one for a transform;
    /// `None` when the order is unchanged. Callers check its length against the tensor.
    fn index_map(&self, t: Transform) -> Option<Vec<usize>> {
        let c = self.cfg;
        let (hk, hv, dv) = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_value_head_dim);
        if hk == hv || hk == 0 || !hv.is_multiple_of(hk) {
            return None;
        }
        match t {
            Transform::TiledHeads | Transform::NegExpTiledHeads => Some(untile_map(hk, hv, 1)),
            Transform::TiledValueRows | Transform::TiledValueCols => Some(untile_map(hk, hv, dv)),
            Transform::TiledVRows => {
                let qk = 2 * c.key_dim();
                Some((0..qk).chain(untile_map(hk, hv, dv).into_iter().map(|i| qk + i)).collect())
            }
            Transform::None | Transform::NormPlusOne => None,
        }
    }

    /// For a full-attention `attn_q/k/v` absent from a file converted with `--fuse-qkv`: the
    /// fused `attn_qkv` (rows `[q+gate | k | v]`), the first row of the part and the fused row
    /// count. `None` when the part is stored on its own (or nothing is: then the missing
    /// tensor is reported by name).
    fn fused_attention_rows(&self, gname: &str) -> Option<(String, usize, usize)> {
        if self.g.has_tensor(gname) {
            return None;
        }
        let (block, part) = gname.strip_suffix(".weight")?.rsplit_once('.')?;
        let c = self.cfg;
        let (q_rows, kv_rows) = (2 * c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let first = match part {
            "attn_q" => 0,
            "attn_k" => q_rows,
            "attn_v" => q_rows + kv_rows,
            _ => return None,
        };
        let fused = format!("{block}.attn_qkv.weight");
        self.g.has_tensor(&fused).then_some((fused, first, q_rows + 2 * kv_rows))
    }

    /// A tensor checked to be stored as `dims` (GGUF order).
    fn stored(&self, gguf_name: &str, dims: &[u64]) -> Result<TensorView<'a>, EngineError> {
        self.g.tensor_with_shape(gguf_name, dims)
    }
}

fn unsupported_type(g: &Gguf, name: &str, dtype: GgmlType) -> EngineError {
    g.error(format!(
        "tensor {name}: type {dtype:?} is not supported here (matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; vectors: F32, F16, BF16)"
    ))
}

/// For `Hv` value heads of `unit` entries each, the stored (tiled) index of every HF (grouped)
/// index: HF head `k·R + r` (`R = Hv / Hk`) is stored as head `r·Hk + k`, the inverse of the
/// converter's `_reorder_v_heads`.
pub(crate) fn untile_map(hk: usize, hv: usize, unit: usize) -> Vec<usize> {
    let r_per_k = hv / hk;
    (0..hv).flat_map(|h| (0..unit).map(move |d| ((h % r_per_k) * hk + h / r_per_k) * unit + d)).collect()
}

/// A matrix after reordering its columns.
enum PermutedCols {
    /// Still in the file's type (whole blocks moved).
    Bytes(Vec<u8>),
    /// Dequantized, because a head's columns split a quantization block.
    F32(Vec<f32>),
}

/// `out[.][i] = in[.][map[i]]` over rows of `cols` values of `dtype`, where `map` moves runs
/// of `head_cols` columns: whole blocks when `head_cols` is a multiple of the block.
fn permute_columns(
    dtype: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    map: &[usize],
    head_cols: usize,
) -> PermutedCols {
    let bv = dtype.block_values();
    let row_bytes = cols / bv * dtype.block_bytes();
    if head_cols.is_multiple_of(bv) {
        // The map over blocks is the element map at block starts.
        let blocks: Vec<usize> = map.iter().step_by(bv).map(|&c| c / bv).collect();
        return PermutedCols::Bytes(permute_units_in_rows(data, row_bytes, dtype.block_bytes(), &blocks));
    }
    let mut out = vec![0f32; rows * cols];
    let mut row = vec![0f32; cols];
    for (r, dst) in out.chunks_exact_mut(cols).enumerate() {
        dequantize_row(dtype, &data[r * row_bytes..(r + 1) * row_bytes], &mut row);
        for (o, &src) in dst.iter_mut().zip(map) {
            *o = row[src];
        }
    }
    PermutedCols::F32(out)
}

/// `out[i] = rows[map[i]]` for rows of `row_bytes` bytes.
fn permute_rows(data: &[u8], row_bytes: usize, map: &[usize]) -> Vec<u8> {
    map.iter().flat_map(|&src| &data[src * row_bytes..(src + 1) * row_bytes]).copied().collect()
}

/// Within every row of `row_bytes`, `out unit i = in unit map[i]` for units of `unit_bytes`.
fn permute_units_in_rows(data: &[u8], row_bytes: usize, unit_bytes: usize, map: &[usize]) -> Vec<u8> {
    data.chunks_exact(row_bytes)
        .flat_map(|row| map.iter().flat_map(move |&src| &row[src * unit_bytes..(src + 1) * unit_bytes]))
        .copied()
        .collect()
}

impl WeightSource for GgufQwen35Weights<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<MatrixDesc<'_>, EngineError> {
        let (gname, t) = self.resolve_or_err(name)?;
        let (v, first_row) = match self.fused_attention_rows(&gname) {
            Some((fused, first, total)) => (self.stored(&fused, &[cols as u64, total as u64])?, first),
            None => (self.stored(&gname, &[cols as u64, rows as u64])?, 0),
        };
        let dtype = v.dtype;
        let row_bytes = dtype.row_bytes(cols).ok_or_else(|| unsupported_type(self.g, &gname, dtype))?;
        let part = v
            .data
            .get(first_row * row_bytes..(first_row + rows) * row_bytes)
            .ok_or_else(|| self.g.error(format!("tensor {}: rows {first_row}.. do not fit", v.name)))?;
        let desc = |data| MatrixDesc { name: gname.clone(), file: Some(self.g.path().to_path_buf()), rows, cols, data };
        let mut data = Cow::Borrowed(part);
        match (t, self.index_map(t)) {
            (_, None) => {}
            (Transform::TiledValueCols, Some(map)) => {
                if map.len() != cols {
                    return Err(self.g.error(format!("tensor {gname}: {cols} columns do not match the value heads")));
                }
                let head_cols = self.cfg.linear_value_head_dim;
                if dtype.is_kquant() && !head_cols.is_multiple_of(dtype.block_values()) {
                    // Heads split the 256-value blocks: keep the file's order, scatter the input.
                    let at = map.iter().map(|&s| s as u32).collect();
                    let inner = Box::new(MatrixData::Ggml { dtype, bytes: data });
                    return Ok(desc(MatrixData::Scattered { inner, at }));
                }
                match permute_columns(dtype, &data, rows, cols, &map, head_cols) {
                    PermutedCols::Bytes(b) => data = b.into(),
                    PermutedCols::F32(values) => {
                        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                        return Ok(desc(MatrixData::Ggml { dtype: GgmlType::F32, bytes: Cow::Owned(bytes) }));
                    }
                }
            }
            (_, Some(map)) => {
                if map.len() != rows {
                    return Err(self.g.error(format!("tensor {gname}: {rows} rows do not match the value heads")));
                }
                data = permute_rows(&data, row_bytes, &map).into();
            }
        }
        Ok(desc(MatrixData::Ggml { dtype, bytes: data }))
    }

    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let (gname, t) = self.resolve_or_err(name)?;
        // GGUF dims are innermost first; the converter squeezed the conv's middle 1.
        let dims: Vec<u64> = shape.iter().rev().filter(|&&d| d != 1).map(|&d| d as u64).collect();
        let v = self.stored(&gname, &dims)?;
        if v.dtype.is_quantized() {
            return Err(unsupported_type(self.g, &gname, v.dtype));
        }
        let n: usize = shape.iter().product();
        let mut values = vec![0f32; n];
        dequantize_row(v.dtype, v.data, &mut values);
        let unit = dims.first().copied().unwrap_or(1) as usize;
        if let Some(map) = self.index_map(t) {
            let unit = if t == Transform::TiledVRows { unit } else { 1 };
            if map.len() * unit != n {
                return Err(self.g.error(format!("tensor {gname}: {n} values do not match the value heads")));
            }
            values = map.iter().flat_map(|&src| values[src * unit..(src + 1) * unit].to_vec()).collect();
        }
        match t {
            Transform::NormPlusOne => values.iter_mut().for_each(|w| *w -= 1.0),
            Transform::NegExpTiledHeads => {
                if let Some(bad) = values.iter().find(|a| a.is_nan() || **a >= 0.0) {
                    return Err(self.g.error(format!("tensor {gname}: {bad} is not negative (ssm_a = -exp(A_log))")));
                }
                values.iter_mut().for_each(|a| *a = (-*a).ln());
            }
            _ => {}
        }
        Ok(values)
    }

    fn has(&self, name: &str) -> bool {
        self.resolve(name).is_some_and(|(gname, _)| self.g.has_tensor(&gname))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's `_reorder_v_heads` on a flat run: `[k][r][d]` -> `[r][k][d]`.
    fn converter_tiles(grouped: &[usize], hk: usize, hv: usize, d: usize) -> Vec<usize> {
        let r_per_k = hv / hk;
        let mut tiled = vec![0; grouped.len()];
        for k in 0..hk {
            for r in 0..r_per_k {
                for e in 0..d {
                    tiled[(r * hk + k) * d + e] = grouped[(k * r_per_k + r) * d + e];
                }
            }
        }
        tiled
    }

    #[test]
    fn untiling_inverts_the_converters_value_head_reordering() {
        for (hk, hv, d) in [(2, 4, 16), (2, 6, 24), (16, 32, 1), (16, 48, 128), (4, 4, 8)] {
            let grouped: Vec<usize> = (0..hv * d).collect();
            let stored = converter_tiles(&grouped, hk, hv, d);
            let back: Vec<usize> = untile_map(hk, hv, d).iter().map(|&i| stored[i]).collect();
            assert_eq!(back, grouped, "hk {hk} hv {hv} d {d}");
        }
    }

    #[test]
    fn column_permutation_moves_whole_blocks_or_dequantizes_exactly() {
        // Q8_0 rows of 4 heads: d_v 32 moves whole blocks, d_v 16 splits them; both must give
        // the dequantized matrix with its columns permuted.
        for dv in [32, 16] {
            let (hk, hv, rows) = (2, 4, 3);
            let cols = hv * dv;
            let mut data = Vec::new();
            for b in 0..rows * cols / 32 {
                data.extend(half::f16::from_f32(0.01 * (b + 1) as f32).to_bits().to_le_bytes());
                data.extend((0..32).map(|i| (i as u8).wrapping_mul(37).wrapping_add(b as u8)));
            }
            let map = untile_map(hk, hv, dv);
            let mut want = vec![0f32; rows * cols];
            let mut row = vec![0f32; cols];
            let row_bytes = cols / 32 * 34;
            for (r, dst) in want.chunks_exact_mut(cols).enumerate() {
                dequantize_row(GgmlType::Q8_0, &data[r * row_bytes..(r + 1) * row_bytes], &mut row);
                for (o, &src) in dst.iter_mut().zip(&map) {
                    *o = row[src];
                }
            }
            let got = match permute_columns(GgmlType::Q8_0, &data, rows, cols, &map, dv) {
                PermutedCols::Bytes(b) => {
                    assert_eq!(dv, 32, "only whole blocks stay quantized");
                    let mut out = vec![0f32; rows * cols];
                    for (r, dst) in out.chunks_exact_mut(cols).enumerate() {
                        dequantize_row(GgmlType::Q8_0, &b[r * row_bytes..(r + 1) * row_bytes], dst);
                    }
                    out
                }
                PermutedCols::F32(v) => {
                    assert_eq!(dv, 16, "split blocks are dequantized");
                    v
                }
            };
            assert_eq!(got, want, "d_v {dv}");
        }
    }
}
