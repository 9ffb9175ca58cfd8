//! Helpers shared by the Qwen3.5 / Qwen3.6 model tests (HF checkpoints in qwen36.rs, GGUF
//! files in qwen36_gguf.rs): loading a fixture, the goldens, single-sequence passes, and the
//! golden and MTP scenarios with their tolerances.

#![allow(dead_code)]

use std::path::PathBuf;

use engine_models::format::safetensors::SafeTensors;
use engine_models::qwen36::GdnMode;
use engine_models::qwen36::mtp::MtpInput;
use engine_service::backend::cpu::{CpuBackend, CpuModel, LoadedModel};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{MappedPool, PageId};
use serde_json::Value;

pub const PAGE_TOKENS: usize = 16;
pub const TOL: f32 = 1e-4;
/// The serving path stores K and V as f16 in the KV pages (relative rounding 2^-11), which moves
/// logits of magnitude ~5-10 by up to ~1e-3 on these models; everything else is f32.
pub const TOL_F16_KV: f32 = 2e-3;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36").join(name)
}

pub fn threads() -> usize {
    std::env::var("EDGE_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

pub fn load(name: &str, mode: GdnMode) -> LoadedModel {
    load_with(name, mode, false)
}

pub fn load_with(name: &str, mode: GdnMode, exact_attention: bool) -> LoadedModel {
    let mut loaded = CpuBackend::load(&fixture(name), threads(), PAGE_TOKENS).expect("loading the checkpoint");
    let model = loaded.backend.qwen36_mut().expect("a qwen36 model").0;
    model.set_gdn_mode(mode);
    model.set_exact_attention(exact_attention);
    loaded
}

pub struct Goldens {
    pub ids: Vec<u32>,
    pub st: SafeTensors,
}

impl Goldens {
    pub fn open(name: &str, json: &str, tensors: &str) -> Goldens {
        let dir = fixture(name);
        let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(json)).expect("goldens json")).unwrap();
        let ids =
            g["token_ids"].as_array().map_or(Vec::new(), |a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect());
        Goldens { ids, st: SafeTensors::open(&dir.join(tensors)).expect("goldens tensors") }
    }
    pub fn t(&self, name: &str) -> Vec<f32> {
        self.st.tensor(name).unwrap_or_else(|e| panic!("{e}")).to_f32().expect("f32 tensor")
    }
}

/// A sequence's pages from a pool mapped into the backend.
pub struct Seq {
    pub id: u64,
    pub pages: Vec<PageId>,
}

pub fn new_seq(pool: &mut MappedPool, id: u64, positions: usize) -> Seq {
    Seq { id, pages: pool.pages_for(positions).expect("pages") }
}

/// One pass of one sequence.
pub fn pass(b: &mut CpuBackend, s: &Seq, tokens: &[u32], start_pos: usize, logits: LogitsWanted) -> Vec<f32> {
    try_pass(b, s, tokens, start_pos, logits).unwrap_or_else(|e| panic!("forward: {e}"))
}

pub fn try_pass(
    b: &mut CpuBackend,
    s: &Seq,
    tokens: &[u32],
    start_pos: usize,
    logits: LogitsWanted,
) -> Result<Vec<f32>, engine_service::EngineError> {
    let batch =
        ForwardBatch { seqs: vec![SeqInput { seq_id: s.id, tokens, start_pos, pages: &s.pages, logits, tree: None }] };
    Ok(b.forward(&batch)?.logits.remove(0))
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn pool_for(b: &mut CpuBackend) -> MappedPool {
    MappedPool::new(b, 256).expect("mapping a pool")
}

/// Every golden scenario of checkpoint `name` against the goldens of fixture `goldens`; returns the max-abs errors (prefill, hidden,
/// decode, continuation, full). `exact`: f32 reference attention instead of the f16 KV pages.
pub fn check_goldens(name: &str, goldens: &str, mode: GdnMode, exact: bool) -> [f32; 5] {
    let g = Goldens::open(goldens, "goldens.json", "goldens.safetensors");
    let mut loaded = load_with(name, mode, exact);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let x = &g.ids;

    // Long prefill (crosses two 64-token chunk boundaries), with hiddens.
    let a = new_seq(&mut pool, 1, 200);
    let batch = ForwardBatch {
        seqs: vec![SeqInput {
            seq_id: a.id,
            tokens: &x[..137],
            start_pos: 0,
            pages: &a.pages,
            logits: LogitsWanted::All,
            tree: None,
        }],
    };
    let (out, hidden) = b.forward_with_hidden(&batch).expect("prefill");
    let e_prefill = max_abs(&out.logits[0], &g.t("prefill.logits"));
    let e_hidden = max_abs(&hidden[0], &g.t("prefill.hidden"));

    // Recurrent state after the prefill matches transformers' cache.
    let (ssm, conv) = match b.model() {
        CpuModel::Qwen36 { states, .. } => {
            let st = states.get(a.id).expect("state");
            assert_eq!(st.pos, 137);
            (st.layers[0].ssm.clone(), st.layers[0].conv.clone())
        }
        CpuModel::Llama { .. } => unreachable!(),
    };
    let cfg = b.qwen36().unwrap().config().clone();
    let first_gdn =
        cfg.layer_types.iter().position(|k| *k == engine_models::format::hf_config::LayerKind::Linear).unwrap();
    let want_ssm = g.t(&format!("prefill.state.layer{first_gdn}.recurrent"));
    assert!(max_abs(&ssm, &want_ssm) < TOL, "{name}: delta-rule state differs by {}", max_abs(&ssm, &want_ssm));
    let hf_conv = g.t(&format!("prefill.state.layer{first_gdn}.conv")); // [conv_dim, 4]
    let cd = cfg.conv_dim();
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for c in 0..cd {
        for t in 0..3 {
            mine.push(conv[t * cd + c]);
            theirs.push(hf_conv[c * 4 + t + 1]);
        }
    }
    assert!(max_abs(&mine, &theirs) < TOL, "{name}: conv window differs");

    // Cached decode steps, one token per pass.
    let mut dec = Vec::new();
    for (k, &tok) in x[137..141].iter().enumerate() {
        dec.extend(pass(b, &a, &[tok], 137 + k, LogitsWanted::Last));
    }
    let e_decode = max_abs(&dec, &g.t("decode.logits"));

    // Multi-token continuation over segments (the 73-token one crosses a chunk boundary with state).
    let c = new_seq(&mut pool, 2, 200);
    let mut cont = Vec::new();
    for (i, (s, e)) in [(0, 100), (100, 107), (107, 180), (180, 181)].into_iter().enumerate() {
        let want = if i == 0 { LogitsWanted::None } else { LogitsWanted::All };
        cont.extend(pass(b, &c, &x[s..e], s, want));
    }
    let e_cont = max_abs(&cont, &g.t("continuation.logits"));

    let f = new_seq(&mut pool, 3, 200);
    let e_full = max_abs(&pass(b, &f, &x[..181], 0, LogitsWanted::All), &g.t("full.logits"));
    let errs = [e_prefill, e_hidden, e_decode, e_cont, e_full];
    let kv = if exact { "f32 KV" } else { "f16 KV pages" };
    eprintln!("{name} {mode:?} {kv}: max abs error prefill/hidden/decode/continuation/full = {errs:?}");
    let tol = if exact { TOL } else { TOL_F16_KV };
    for (what, e) in ["prefill", "hidden", "decode", "continuation", "full"].iter().zip(errs) {
        assert!(e < tol, "{name} {mode:?} {kv}: {what} differs from transformers by {e}");
    }
    errs
}

/// The MTP scenarios of checkpoint `name` (the tiny-vlm model in some format) against
/// tiny-vlm's NumPy MTP goldens.
pub fn check_mtp(name: &str, exact: bool) -> [f32; 3] {
    let g = Goldens::open("tiny-vlm", "goldens.json", "goldens.safetensors");
    let m = Goldens::open("tiny-vlm", "mtp_goldens.json", "mtp_goldens.safetensors");
    let mtp_json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-vlm").join("mtp_goldens.json")).unwrap()).unwrap();
    let drafts: Vec<u32> = mtp_json["drafts"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let mut loaded = load(name, GdnMode::Recurrent);
    let (model, scratch, tp) = loaded.backend.qwen36_mut().unwrap();
    assert!(model.has_mtp());
    let layout = model.mtp_kv_layout(PAGE_TOKENS);
    // The MTP head's KV in the backend's private pages, as the drafting path keeps it.
    let pages: Vec<PageId> = engine_ops::Ops::private_pages(tp, &layout, 12).expect("private pages");
    let mut kv = Vec::new();
    macro_rules! kv_arg {
        () => {
            if exact { Some(&mut kv) } else { None }
        };
    }
    let x = &g.ids;
    let n = 137;
    let h = model.hparams().hidden_size;

    // Catch-up over the prompt: hidden t with token t+1 at position t.
    let hid = g.t("prefill.hidden");
    let input = MtpInput { tokens: &x[1..=n], hidden: &hid, start_pos: 0, pages: &pages };
    let out = model.mtp_forward(tp, &layout, &input, kv_arg!(), scratch).expect("catch-up");
    let e1 = max_abs(&out.hidden, &m.t("catchup.out")).max(max_abs(&out.logits, &m.t("catchup.logits")));

    // Two drafts, each from the previous MTP output.
    let cout = m.t("catchup.out");
    let input = MtpInput { tokens: &drafts[..1], hidden: &cout[(n - 1) * h..n * h], start_pos: n, pages: &pages };
    let d0 = model.mtp_forward(tp, &layout, &input, kv_arg!(), scratch).unwrap();
    let input = MtpInput { tokens: &drafts[1..2], hidden: &d0.hidden, start_pos: n + 1, pages: &pages };
    let d1 = model.mtp_forward(tp, &layout, &input, kv_arg!(), scratch).unwrap();
    let mut dl = d0.logits.clone();
    dl.extend(&d1.logits);
    let e2 = max_abs(&dl, &m.t("draft.logits"));

    // Round 2 overwrites the draft positions with target hiddens.
    let dh = g.t("decode.hidden");
    let input = MtpInput { tokens: &x[n + 1..n + 5], hidden: &dh, start_pos: n, pages: &pages };
    let r2 = model.mtp_forward(tp, &layout, &input, kv_arg!(), scratch).unwrap();
    let e3 = max_abs(&r2.logits, &m.t("round2.logits")).max(max_abs(&r2.hidden, &m.t("round2.out")));
    [e1, e2, e3]
}
