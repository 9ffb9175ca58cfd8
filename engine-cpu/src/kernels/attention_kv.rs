//! KV writes into pages: one position's K and V rows of one layer, converted to the pages'
//! dtype (f16, or FP8 E4M3 with per-tensor scales). The attention read side is in `super`.

use super::super::quant::f32_to_f16;
use crate::pages::PageAddr;
use engine_ops::kv::{KvDtype, KvLayout, KvPart};

/// Writes K and V rows (each n_kv_heads*head_dim f32, converted to the layout's dtype with
/// scale 1) of position `pos` of `layer` into the pages.
pub fn write_kv(layout: &KvLayout, pages: &[PageAddr], layer: usize, pos: usize, k: &[f32], v: &[f32]) {
    write_kv_scaled(layout, pages, layer, pos, k, v, 1.0, 1.0)
}

/// [`write_kv`] with per-tensor FP8 scales: FP8 pages store E4M3(k / k_scale) and
/// E4M3(v / v_scale) (saturating at ±448, [`super::super::fp8::encode_scaled`]); f16 pages ignore the
/// scales. Scales must be positive and finite.
#[allow(clippy::too_many_arguments)]
pub fn write_kv_scaled(
    layout: &KvLayout,
    pages: &[PageAddr],
    layer: usize,
    pos: usize,
    k: &[f32],
    v: &[f32],
    k_scale: f32,
    v_scale: f32,
) {
    let hd = layout.head_dim;
    let row = layout.n_kv_heads * hd;
    assert!(layer < layout.n_layers, "write_kv: layer {layer} out of range");
    assert!(k.len() >= row && v.len() >= row, "write_kv: k/v rows shorter than {row}");
    let page = *pages.get(pos / layout.page_tokens).expect("write_kv: no page for position");
    let t = pos % layout.page_tokens;
    if layout.dtype == KvDtype::Fp8 {
        for (part, src, scale) in [(KvPart::Key, k, k_scale), (KvPart::Value, v, v_scale)] {
            for h in 0..layout.n_kv_heads {
                let off = layout.block_offset_bytes(layer, part, h) + t * hd;
                // SAFETY: `off + hd` lies inside the page (KvLayout arithmetic, 1 byte per
                // value); the caller holds the page's write lease.
                let dst = unsafe { std::slice::from_raw_parts_mut(page.as_ptr().add(off), hd) };
                super::super::fp8::encode_scaled(&src[h * hd..(h + 1) * hd], scale, dst);
            }
        }
        return;
    }
    for (part, src) in [(KvPart::Key, k), (KvPart::Value, v)] {
        for h in 0..layout.n_kv_heads {
            let off = layout.block_offset_bytes(layer, part, h) + t * hd * 2;
            // SAFETY: `off + 2*hd` lies inside the page (KvLayout arithmetic); the caller holds
            // the page's write lease.
            let dst = unsafe { std::slice::from_raw_parts_mut(page.as_ptr().add(off) as *mut u16, hd) };
            for (d, &x) in dst.iter_mut().zip(&src[h * hd..(h + 1) * hd]) {
                *d = f32_to_f16(x);
            }
        }
    }
}
