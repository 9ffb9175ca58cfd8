//! Qwen3.5 / Qwen3.6 from llama.cpp `qwen35` GGUF files: the tiny fixture checkpoints converted
//! by llama.cpp's own `convert_hf_to_gguf.py` (scripts/qwen36/make_gguf_fixtures.py) must give
//! the same results as the HF directories they came from: the transformers goldens and MTP
//! goldens within the tolerances of tests/qwen36.rs, the same tokenizer ids, template and end
//! ids; quantized files stay close to their float twin; and broken files are errors, not panics.

use engine_models::qwen36::GdnMode;
use engine_service::EngineError;
use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::{Backend, LogitsWanted};

#[path = "support/qwen36.rs"]
mod qwen36_support;
use qwen36_support::*;

const VLM_F32: &str = "tiny-vlm-f32.gguf";
const VLM_Q8: &str = "tiny-vlm-q8_0.gguf";
const VLM_Q8_FUSED: &str = "tiny-vlm-q8_0-fused-qkv.gguf";
const TEXT_F32: &str = "tiny-text-f32.gguf";
const TEXT_BF16: &str = "tiny-text-bf16.gguf";

#[test]
fn tiny_vlm_gguf_matches_transformers_both_delta_rule_forms() {
    check_goldens(VLM_F32, "tiny-vlm", GdnMode::Recurrent, true);
    check_goldens(VLM_F32, "tiny-vlm", GdnMode::Chunked, true);
    check_goldens(VLM_F32, "tiny-vlm", GdnMode::Recurrent, false);
}

/// tiny-text has 3 value heads per key head and d_v != d_k: the converter's value-head
/// reordering is undone correctly only if these pass.
#[test]
fn tiny_text_gguf_tied_grouped_heads_matches_transformers() {
    check_goldens(TEXT_F32, "tiny-text", GdnMode::Recurrent, true);
    check_goldens(TEXT_F32, "tiny-text", GdnMode::Chunked, true);
    check_goldens(TEXT_F32, "tiny-text", GdnMode::Recurrent, false);
}

#[test]
fn mtp_block_from_the_nextn_tensors_matches_the_numpy_reference() {
    for exact in [true, false] {
        let [e1, e2, e3] = check_mtp(VLM_F32, exact);
        let (tol, kv) = if exact { (TOL, "f32 KV") } else { (TOL_F16_KV, "f16 KV pages") };
        eprintln!("gguf mtp {kv}: max abs error catch-up/draft/round2 = {e1} {e2} {e3}");
        assert!(e1 < tol && e2 < tol && e3 < tol, "gguf mtp {kv}: errors {e1} {e2} {e3}");
    }
}

/// Full-sequence logits of a fixture over the first 181 golden ids, f32 reference attention.
fn full_logits(name: &str, ids: &[u32]) -> Vec<f32> {
    let mut loaded = load_with(name, GdnMode::Recurrent, true);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let s = new_seq(&mut pool, 1, 200);
    pass(b, &s, &ids[..181], 0, LogitsWanted::All)
}

#[test]
fn f32_gguf_equals_its_hf_checkpoint() {
    // Same f32 matrices; norms come back as fl(1 + w) - 1, whose `1 + w'` is the f32 `1 + w`
    // the HF path computes, and `A_log` as ln(exp(A_log)), which may be an ulp off. Measured:
    // bitwise equal on both fixtures; the bound allows the ulp.
    for (gguf, dir) in [(VLM_F32, "tiny-vlm"), (TEXT_F32, "tiny-text")] {
        let g = Goldens::open(dir, "goldens.json", "goldens.safetensors");
        let e = max_abs(&full_logits(gguf, &g.ids), &full_logits(dir, &g.ids));
        eprintln!("{gguf} vs {dir}: max abs {e}");
        assert!(e < 1e-5, "{gguf} vs {dir}: {e}");
    }
}

/// `|a - b|₂ / |b|₂` over all logits: stable where the max over 52K logits is not.
fn relative_rms(a: &[f32], b: &[f32]) -> f32 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt() as f32
}

#[test]
fn q8_0_gguf_stays_close_to_its_f32_twin() {
    // Q8_0 rounds every weight to 1/127 of its 32-block's max |w|, and the kernel rounds the
    // activations the same way. These tiny random models amplify that: measured relative RMS
    // of all logits vs the f32 file 0.050 (weights alone, run dequantized in f32: 0.034;
    // activations alone: 0.031), max abs 0.98 at one position (logits up to ~4). Bounds:
    // relative RMS 0.1 and max abs 1.5; a layout error (e.g. a head or block out of place)
    // gives relative RMS of order 1 (logits shifted by one vocabulary entry: 1.41).
    let g = Goldens::open("tiny-vlm", "goldens.json", "goldens.safetensors");
    let q8 = full_logits(VLM_Q8, &g.ids);
    let f32s = full_logits(VLM_F32, &g.ids);
    let goldens = g.t("full.logits");
    let (rel, rel_goldens) = (relative_rms(&q8, &f32s), relative_rms(&q8, &goldens));
    let (e, e_goldens) = (max_abs(&q8, &f32s), max_abs(&q8, &goldens));
    eprintln!("{VLM_Q8}: vs f32 gguf relative rms {rel} max abs {e}; vs goldens {rel_goldens} {e_goldens}");
    assert!(rel > 1e-4 && rel < 0.1 && e < 1.5, "q8_0 vs f32 gguf: relative rms {rel}, max abs {e}");
    assert!(rel_goldens < 0.1 && e_goldens < 1.5, "q8_0 vs goldens: relative rms {rel_goldens}, max abs {e_goldens}");

    let q8_model = CpuBackend::load(&fixture(VLM_Q8), 1, PAGE_TOKENS).unwrap();
    let f32_model = CpuBackend::load(&fixture(VLM_F32), 1, PAGE_TOKENS).unwrap();
    let (q8_bytes, f32_bytes) =
        (q8_model.backend.qwen36().unwrap().weight_bytes(), f32_model.backend.qwen36().unwrap().weight_bytes());
    // Q8_0 is 34 bytes per 32 weights; only out_proj (d_v = 16 splits a block) is widened.
    assert!(q8_bytes * 2 < f32_bytes, "matrices stay quantized: {q8_bytes} vs {f32_bytes} bytes");
    assert!(q8_model.backend.qwen36().unwrap().has_mtp());
}

#[test]
fn fused_qkv_layout_gives_the_same_logits() {
    // `--fuse-qkv` stores a full-attention layer's q, k, v as one attn_qkv; Q8_0 quantizes per
    // row, so the split rows are the very bytes of the separate file: bitwise equal logits.
    let g = Goldens::open("tiny-vlm", "goldens.json", "goldens.safetensors");
    let fused = full_logits(VLM_Q8_FUSED, &g.ids);
    let separate = full_logits(VLM_Q8, &g.ids);
    assert!(fused == separate, "fused vs separate q/k/v: max abs {}", max_abs(&fused, &separate));
    assert!(CpuBackend::load(&fixture(VLM_Q8_FUSED), 1, PAGE_TOKENS).unwrap().backend.qwen36().unwrap().has_mtp());
}

#[test]
fn bf16_gguf_equals_its_hf_bf16_checkpoint() {
    // The converter widens BF16 to f32 before adding 1 to the norms (and stores 1-D tensors as
    // F32), so nothing is rounded twice: same matrices, same norms. Measured: 0.
    let g = Goldens::open("tiny-text", "goldens.json", "goldens.safetensors");
    let gguf = full_logits(TEXT_BF16, &g.ids);
    let hf = full_logits("tiny-text-bf16", &g.ids);
    let e_hf = max_abs(&gguf, &hf);
    let e_goldens = max_abs(&gguf, &g.t("full.logits"));
    eprintln!("{TEXT_BF16}: max abs vs HF bf16 {e_hf}, vs f32 goldens {e_goldens}");
    assert!(e_hf < 1e-5, "bf16 gguf vs HF bf16: {e_hf}");
    // The HF bf16 test's bound: bf16 weights move logits of magnitude ~10 by a few tenths.
    assert!(e_goldens > 1e-6 && e_goldens < 1.0, "bf16 gguf vs f32 goldens: {e_goldens}");
    let loaded = CpuBackend::load(&fixture(TEXT_BF16), 1, PAGE_TOKENS).unwrap();
    let f32_twin = CpuBackend::load(&fixture(TEXT_F32), 1, PAGE_TOKENS).unwrap();
    let bytes = |l: &engine_service::backend::cpu::LoadedModel| l.backend.qwen36().unwrap().weight_bytes();
    // Half the matrix bytes; the f32 vectors (norms, conv, A_log) count in both.
    assert!(bytes(&loaded) * 10 < bytes(&f32_twin) * 6, "BF16 matrices stay BF16");
}

#[test]
fn gguf_and_hf_directory_give_the_same_tokenizer_template_and_end_ids() {
    let samples = [
        "hello world",
        "<|im_start|>user\nWhat is 12 + 345?<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "  tabs\tand\nnewlines\r\n  café naïve 東京 🦙 don't I'LL",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    ];
    for (gguf, dir) in [(VLM_F32, "tiny-vlm"), (TEXT_F32, "tiny-text")] {
        let a = CpuBackend::load(&fixture(gguf), 1, PAGE_TOKENS).unwrap();
        let b = CpuBackend::load(&fixture(dir), 1, PAGE_TOKENS).unwrap();
        for text in samples {
            let (ia, ib) = (a.tokenizer.encode(text, true).unwrap(), b.tokenizer.encode(text, true).unwrap());
            assert_eq!(ia, ib, "{gguf} vs {dir}: ids of {text:?}");
            assert_eq!(a.tokenizer.decode(&ia, false).unwrap(), text, "{gguf}: round trip of {text:?}");
        }
        // The same template text renders every chat the same way.
        assert_eq!(a.tokenizer.chat_template, b.tokenizer.chat_template, "{gguf} vs {dir}: chat template");
        assert_eq!(a.tokenizer.eos_token_ids, b.tokenizer.eos_token_ids, "{gguf} vs {dir}: end ids");
        assert_eq!((a.tokenizer.add_bos, a.tokenizer.bos_token_id), (false, None));
        // The converter pads the vocabulary to the embedding's 288 rows with unused `[PADn]`
        // entries; like ids past the HF tokenizer's 282, they decode to nothing.
        assert_eq!(a.tokenizer.decode(&[97, 287, 282, 98], false).unwrap(), "ab", "{gguf}: padding ids");
        assert_eq!(
            b.tokenizer.tokenizer.decode(&[97, 287, 282, 98], false).unwrap(),
            "ab",
            "{dir}: ids past the vocab"
        );
        assert_ne!(a.fingerprint, b.fingerprint, "the GGUF's fingerprint hashes its own bytes");
    }
    let text = CpuBackend::load(&fixture(TEXT_F32), 1, PAGE_TOKENS).unwrap();
    assert_eq!(text.tokenizer.chat_template, engine_service::backend::cpu::QWEN35_DEFAULT_TEMPLATE);
}

#[test]
fn gguf_fingerprint_is_stable_and_differs_per_file() {
    let a = CpuBackend::load(&fixture(VLM_F32), 1, PAGE_TOKENS).unwrap();
    let again = CpuBackend::load(&fixture(VLM_F32), 2, PAGE_TOKENS).unwrap();
    let q8 = CpuBackend::load(&fixture(VLM_Q8), 1, PAGE_TOKENS).unwrap();
    assert_eq!(a.fingerprint, again.fingerprint);
    assert_ne!(a.fingerprint, q8.fingerprint);
    assert_eq!(a.backend.kv_layout().n_layers, 1, "one full-attention layer");
    assert_eq!(a.backend.hparams().architecture, "qwen3_5");
}

// ---- broken files -------------------------------------------------------------------------

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// Loads `bytes` as a .gguf file; the error (a panic would fail the test).
fn load_err(bytes: &[u8]) -> EngineError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.gguf");
    std::fs::write(&path, bytes).unwrap();
    match CpuBackend::load(&path, 1, PAGE_TOKENS) {
        Ok(_) => panic!("a broken file loaded"),
        Err(e) => e,
    }
}

/// Byte offset of tensor `name`'s info record (its length-prefixed name) in the header.
fn tensor_info_at(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    bytes.windows(needle.len()).position(|w| w == needle).unwrap_or_else(|| panic!("{name} not in the header"))
}

/// Offset of the type id of tensor `name` (after its name, rank and dims).
fn tensor_type_at(bytes: &[u8], name: &str) -> usize {
    let at = tensor_info_at(bytes, name) + 8 + name.len();
    let rank = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * rank
}

fn assert_model_file_error(e: &EngineError, needles: &[&str]) {
    let text = e.to_string();
    assert!(matches!(e, EngineError::ModelFile { .. }), "{e:?}");
    assert!(text.contains("broken.gguf"), "names the file: {text}");
    for n in needles {
        assert!(text.contains(n), "{text:?} lacks {n:?}");
    }
}

#[test]
fn missing_tensor_is_an_error_naming_it() {
    let mut b = fixture_bytes(VLM_F32);
    let at = tensor_info_at(&b, "blk.2.ssm_a") + 8;
    b[at..at + 11].copy_from_slice(b"blk.2.ssm_x");
    assert_model_file_error(&load_err(&b), &["missing tensor blk.2.ssm_a"]);
}

#[test]
fn wrong_shape_is_an_error_naming_the_tensor() {
    let mut b = fixture_bytes(VLM_F32);
    // ffn_up [64, 128] -> [64, 64]: still inside the file, the wrong shape for the config.
    let at = tensor_info_at(&b, "blk.1.ffn_up.weight") + 8 + "blk.1.ffn_up.weight".len() + 4 + 8;
    b[at..at + 8].copy_from_slice(&64u64.to_le_bytes());
    assert_model_file_error(&load_err(&b), &["blk.1.ffn_up.weight", "shape mismatch"]);
}

#[test]
fn unsupported_tensor_types_are_errors_naming_tensor_and_type() {
    // A K-quant the kernels lack (Q3_K): refused while parsing, with ggml's name for it.
    let mut b = fixture_bytes(VLM_Q8);
    let at = tensor_type_at(&b, "blk.0.attn_qkv.weight");
    b[at..at + 4].copy_from_slice(&11u32.to_le_bytes());
    assert_model_file_error(&load_err(&b), &["blk.0.attn_qkv.weight", "Q3_K", "not supported"]);

    // A supported block type where the model needs floats (a norm vector).
    let mut b = fixture_bytes(VLM_F32);
    let at = tensor_type_at(&b, "blk.0.attn_norm.weight");
    b[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
    assert_model_file_error(&load_err(&b), &["blk.0.attn_norm.weight", "Q8_0", "not supported"]);
}

#[test]
fn missing_metadata_and_impossible_values_are_errors() {
    let b = fixture_bytes(VLM_F32);
    // Rename a key: the config cannot be built without it.
    let key = b"qwen35.ssm.time_step_rank";
    let at = b.windows(key.len()).position(|w| w == key).unwrap();
    let mut renamed = b.clone();
    renamed[at..at + key.len()].copy_from_slice(b"qwen35.ssm.time_step_ranx");
    assert_model_file_error(&load_err(&renamed), &["missing metadata key qwen35.ssm.time_step_rank"]);

    // ssm_a = -exp(A_log) must be negative.
    let mut positive = b.clone();
    let info = tensor_type_at(&positive, "blk.0.ssm_a") + 4;
    let rel = u64::from_le_bytes(positive[info..info + 8].try_into().unwrap()) as usize;
    let data_start = data_offset(&positive);
    positive[data_start + rel..data_start + rel + 4].copy_from_slice(&0.5f32.to_le_bytes());
    assert_model_file_error(&load_err(&positive), &["blk.0.ssm_a", "not negative"]);

    // A truncated file.
    assert_model_file_error(&load_err(&b[..b.len() - 1000]), &["out of bounds"]);
}

/// Start of the tensor data section, as the reader computes it.
fn data_offset(bytes: &[u8]) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.gguf");
    std::fs::write(&path, bytes).unwrap();
    engine_models::format::Gguf::open(&path).unwrap().data_offset()
}

/// A minimal GGUF v3 file with string metadata and no tensors.
fn gguf_with_strings(kvs: &[(&str, &str)]) -> Vec<u8> {
    let s = |t: &str| [&(t.len() as u64).to_le_bytes()[..], t.as_bytes()].concat();
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        b.extend(s(k));
        b.extend(8u32.to_le_bytes());
        b.extend(s(v));
    }
    // The (empty) data section starts at the next 32-byte boundary.
    b.resize(b.len().div_ceil(32) * 32, 0);
    b
}

#[test]
fn qwen35moe_is_refused_as_unsupported() {
    let e = load_err(&gguf_with_strings(&[("general.architecture", "qwen35moe")]));
    assert!(matches!(e, EngineError::UnsupportedModel(_)), "{e:?}");
    assert!(e.to_string().contains("qwen35moe"), "{e}");
}
