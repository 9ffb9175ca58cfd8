//! Qwen3.5 / Qwen3.6 hybrid model on the CPU backend against the transformers goldens in
//! tests/fixtures/qwen36 (made by scripts/qwen36/make_goldens.py; see the README there), the
//! NumPy MTP reference, and the engine's own exactness rules: cached vs uncached runs give
//! bitwise-identical logits, any pass split equals one pass (recurrent delta rule), the chunked
//! delta rule agrees with the recurrent one, and bad passes are refused.

use engine_cpu::kernels::GgmlType;
use engine_models::qwen36::GdnMode;
use engine_service::backend::cpu::{CpuBackend, RandomSpec};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{MappedPool, PageId};

#[path = "support/qwen36.rs"]
mod qwen36_support;
use qwen36_support::*;

#[test]
fn tiny_vlm_sharded_untied_matches_transformers_both_delta_rule_forms() {
    check_goldens("tiny-vlm", "tiny-vlm", GdnMode::Recurrent, true);
    check_goldens("tiny-vlm", "tiny-vlm", GdnMode::Chunked, true);
    check_goldens("tiny-vlm", "tiny-vlm", GdnMode::Recurrent, false);
}

#[test]
fn tiny_text_flat_tied_grouped_matches_transformers_both_delta_rule_forms() {
    check_goldens("tiny-text", "tiny-text", GdnMode::Recurrent, true);
    check_goldens("tiny-text", "tiny-text", GdnMode::Chunked, true);
    check_goldens("tiny-text", "tiny-text", GdnMode::Recurrent, false);
}

#[test]
fn nvfp4_checkpoint_matches_its_dequantized_reference() {
    // goldens: transformers in f32 on the dequantized weights (W4A16 reference).
    let g = Goldens::open("tiny-vlm-nvfp4", "goldens.json", "goldens.safetensors");
    for exact in [true, false] {
        let mut loaded = load_with("tiny-vlm-nvfp4", GdnMode::Recurrent, exact);
        let b = &mut loaded.backend;
        let mut pool = pool_for(b);
        let s = new_seq(&mut pool, 1, 200);
        let e = max_abs(&pass(b, &s, &g.ids[..181], 0, LogitsWanted::All), &g.t("full.logits"));
        let (tol, kv) = if exact { (TOL, "f32 KV") } else { (TOL_F16_KV, "f16 KV pages") };
        eprintln!("tiny-vlm-nvfp4 {kv}: max abs error vs dequantize-then-f32 reference {e}");
        assert!(e < tol, "nvfp4 {kv}: {e}");
    }
}

#[test]
fn bf16_checkpoint_stays_bf16_and_tracks_the_f32_goldens() {
    let g = Goldens::open("tiny-text", "goldens.json", "goldens.safetensors");
    let mut loaded = load("tiny-text-bf16", GdnMode::Recurrent);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let s = new_seq(&mut pool, 1, 200);
    let got = pass(b, &s, &g.ids[..181], 0, LogitsWanted::All);
    let want = g.t("full.logits");
    let e = max_abs(&got, &want);
    eprintln!("tiny-text-bf16 vs f32 goldens: max abs {e}");
    // BF16 weights (and bf16-rounded A_log/norms) perturb logits of magnitude ~10 by a few
    // tenths at most; a wrong dtype decode would be O(10).
    assert!(e > 1e-6 && e < 1.0, "bf16 vs f32 max abs {e}");
}

#[test]
fn mtp_module_matches_the_numpy_reference() {
    for exact in [true, false] {
        let [e1, e2, e3] = check_mtp("tiny-vlm", exact);
        let (tol, kv) = if exact { (TOL, "f32 KV") } else { (TOL_F16_KV, "f16 KV pages") };
        eprintln!("mtp {kv}: max abs error catch-up/draft/round2 = {e1} {e2} {e3}");
        assert!(e1 < tol && e2 < tol && e3 < tol, "mtp {kv}: errors {e1} {e2} {e3}");
    }
}

/// Copies whole pages (simulates KV reuse from the cache).
fn copy_pages(b: &mut CpuBackend, from: &[PageId], to: &[PageId], n: usize) {
    for (&s, &d) in from.iter().zip(to).take(n) {
        b.copy_page(s, d).expect("copying a page");
    }
}

#[test]
fn restored_state_plus_reused_kv_gives_bitwise_identical_logits() {
    let g = Goldens::open("tiny-vlm", "goldens.json", "goldens.safetensors");
    let x = &g.ids;
    let mut loaded = load("tiny-vlm", GdnMode::Recurrent);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let p = 100; // prompt length: ends mid-page, so the partial page is reused too.

    // Uncached: prompt, then a 40-token continuation and 3 decode steps.
    let a = new_seq(&mut pool, 1, 200);
    pass(b, &a, &x[..p], 0, LogitsWanted::Last);
    let mut snap = vec![0u8; b.state_bytes()];
    b.save_state(a.id, &mut snap).unwrap();
    let c = new_seq(&mut pool, 2, 200);
    copy_pages(b, &a.pages, &c.pages, p.div_ceil(PAGE_TOKENS));
    let mut uncached = pass(b, &a, &x[p..p + 40], p, LogitsWanted::All);
    for k in 0..3 {
        uncached.extend(pass(b, &a, &x[p + 40 + k..p + 41 + k], p + 40 + k, LogitsWanted::Last));
    }

    // Cached: a fresh sequence restores the snapshot and reuses the prompt's KV.
    b.load_state(c.id, &snap).unwrap();
    let mut cached = pass(b, &c, &x[p..p + 40], p, LogitsWanted::All);
    for k in 0..3 {
        cached.extend(pass(b, &c, &x[p + 40 + k..p + 41 + k], p + 40 + k, LogitsWanted::Last));
    }
    assert!(cached == uncached, "cached run differs: max abs {}", max_abs(&cached, &uncached));

    // And both equal one pass over everything (split invariance of the recurrent form).
    let f = new_seq(&mut pool, 3, 200);
    let full = pass(b, &f, &x[..p + 43], 0, LogitsWanted::All);
    let vocab = b.hparams().vocab_size;
    assert!(full[p * vocab..] == uncached[..], "one pass differs: max abs {}", max_abs(&full[p * vocab..], &uncached));
    b.release_seq(a.id);
    b.release_seq(c.id);
    assert!(b.save_state(a.id, &mut snap).is_err(), "released state is gone");
}

#[test]
fn chunked_prefill_at_any_chunk_size_equals_one_pass() {
    let g = Goldens::open("tiny-text", "goldens.json", "goldens.safetensors");
    let x = &g.ids[..150];
    for mode in [GdnMode::Recurrent, GdnMode::Chunked] {
        let mut loaded = load("tiny-text", mode);
        let b = &mut loaded.backend;
        let mut pool = pool_for(b);
        let one = pass(b, &new_seq(&mut pool, 100, 160), x, 0, LogitsWanted::All);
        for (i, chunk) in [1usize, 5, 16, 63, 64, 100].into_iter().enumerate() {
            let s = new_seq(&mut pool, i as u64, 160);
            let mut got = Vec::new();
            let mut at = 0;
            while at < x.len() {
                let e = (at + chunk).min(x.len());
                got.extend(pass(b, &s, &x[at..e], at, LogitsWanted::All));
                at = e;
            }
            match mode {
                GdnMode::Recurrent => assert!(got == one, "chunk {chunk}: max abs {}", max_abs(&got, &one)),
                // The WY form's rounding depends on where the chunks fall: up to 1.6e-4
                // (libm SiLU) and 2.9e-4 (the x86 sets' vector SiLU) on this fixture.
                GdnMode::Chunked => {
                    assert!(max_abs(&got, &one) < 5e-4, "chunk {chunk}: max abs {}", max_abs(&got, &one))
                }
            }
            b.release_seq(s.id);
        }
    }
}

#[test]
fn batched_sequences_equal_separate_passes() {
    let g = Goldens::open("tiny-vlm", "goldens.json", "goldens.safetensors");
    let x = &g.ids;
    let mut loaded = load("tiny-vlm", GdnMode::Recurrent);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let (s1, s2) = (new_seq(&mut pool, 1, 100), new_seq(&mut pool, 2, 100));
    let batch = ForwardBatch {
        seqs: vec![
            SeqInput {
                seq_id: 1,
                tokens: &x[..70],
                start_pos: 0,
                pages: &s1.pages,
                logits: LogitsWanted::All,
                tree: None,
            },
            SeqInput {
                seq_id: 2,
                tokens: &x[10..40],
                start_pos: 0,
                pages: &s2.pages,
                logits: LogitsWanted::Last,
                tree: None,
            },
        ],
    };
    let out = b.forward(&batch).unwrap().logits;
    let (s3, s4) = (new_seq(&mut pool, 3, 100), new_seq(&mut pool, 4, 100));
    assert!(out[0] == pass(b, &s3, &x[..70], 0, LogitsWanted::All));
    assert!(out[1] == pass(b, &s4, &x[10..40], 0, LogitsWanted::Last));
}

#[test]
fn passes_without_the_right_state_and_malformed_trees_are_refused() {
    let mut loaded = load("tiny-vlm", GdnMode::Recurrent);
    let b = &mut loaded.backend;
    let mut pool = pool_for(b);
    let s = new_seq(&mut pool, 7, 64);
    let e = try_pass(b, &s, &[1, 2], 5, LogitsWanted::Last).unwrap_err().to_string();
    assert!(e.contains("without a recurrent state"), "{e}");
    pass(b, &s, &[1, 2, 3], 0, LogitsWanted::Last);
    let e = try_pass(b, &s, &[4], 5, LogitsWanted::Last).unwrap_err().to_string();
    assert!(e.contains("state is at 3"), "{e}");
    pass(b, &s, &[4], 3, LogitsWanted::Last);
    let parents = [None, Some(1)];
    let batch = ForwardBatch {
        seqs: vec![SeqInput {
            seq_id: 7,
            tokens: &[5, 6],
            start_pos: 4,
            pages: &s.pages,
            logits: LogitsWanted::All,
            tree: Some(&parents),
        }],
    };
    assert!(b.forward(&batch).is_err(), "a node whose parent is not earlier");
    assert!(try_pass(b, &s, &[300], 4, LogitsWanted::Last).is_err(), "token outside the vocabulary");
    assert!(b.load_state(9, &[0u8; 10]).is_err(), "short snapshot");
    let mut snap = vec![0u8; b.state_bytes()];
    b.save_state(7, &mut snap).unwrap();
    snap[0] ^= 0xff;
    assert!(b.load_state(9, &snap).is_err(), "bad magic");
}

#[test]
fn hf_directory_loads_tokenizer_template_and_fingerprint() {
    let vlm = CpuBackend::load(&fixture("tiny-vlm"), 1, PAGE_TOKENS).unwrap();
    let text = CpuBackend::load(&fixture("tiny-text"), 1, PAGE_TOKENS).unwrap();
    let default = engine_service::backend::cpu::QWEN35_DEFAULT_TEMPLATE;
    assert_eq!(vlm.tokenizer.chat_template, std::fs::read_to_string(fixture("tiny-vlm/chat_template.jinja")).unwrap());
    assert_eq!(text.tokenizer.chat_template, default, "no template in the checkpoint: the bundled default");
    assert!(text.tokenizer.is_eos(258) && text.tokenizer.is_eos(256), "{:?}", text.tokenizer.eos_token_ids);
    assert_eq!(text.tokenizer.encode("<|im_start|>hi", false).unwrap(), vec![257, b'h' as u32, b'i' as u32]);
    assert_ne!(vlm.fingerprint, text.fingerprint);
    let again = CpuBackend::load(&fixture("tiny-vlm"), 2, PAGE_TOKENS).unwrap();
    assert_eq!(vlm.fingerprint, again.fingerprint);
    assert_eq!(vlm.backend.kv_layout().n_layers, 1, "one full-attention layer");
    assert_eq!(text.backend.kv_layout().n_layers, 2);
    // 3 GDN layers x (conv 3x128 + state 4x16x16) f32 + 16-byte header.
    assert_eq!(vlm.backend.state_bytes(), 16 + 3 * (3 * 128 + 4 * 16 * 16) * 4);
}

#[test]
fn random_weights_from_a_config_are_seeded() {
    let cfg = fixture("tiny-vlm/config.json");
    let run = |seed: u64| {
        let spec = RandomSpec { seed, dtype: GgmlType::BF16, nvfp4: false };
        let mut l = CpuBackend::random_from_config(&cfg, &spec, None, 1, PAGE_TOKENS).unwrap();
        let mut pool = pool_for(&mut l.backend);
        let s = new_seq(&mut pool, 1, 32);
        (pass(&mut l.backend, &s, &[1, 2, 3, 250], 0, LogitsWanted::Last), l.fingerprint)
    };
    let (a, fa) = run(7);
    let (b, fb) = run(7);
    let (c, fc) = run(8);
    assert!(a == b && fa == fb);
    assert!(a != c && fa != fc);
    assert!(a.iter().all(|v| v.is_finite()));
}

/// A Q4_K_M random model (tiny-text's layers at widths of whole 256-value super-blocks): one
/// pass over a prompt, the prompt in pieces and token-by-token decode give every position the
/// same logits bit for bit. The integer K-quant kernels owe each activation row the same bits
/// however many rows a pass holds; speculative == plain relies on it.
#[test]
fn k_quant_model_gives_every_pass_split_the_same_bits() {
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("tiny-text/config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size", 256),
        ("intermediate_size", 512),
        ("head_dim", 128),
        ("linear_key_head_dim", 64),
        ("linear_num_value_heads", 4),
        ("linear_value_head_dim", 64),
        ("vocab_size", 512),
    ] {
        cfg[key] = value.into();
    }
    let path = std::env::temp_dir().join(format!("k-quant-config-{}.json", std::process::id()));
    std::fs::write(&path, cfg.to_string()).unwrap();
    let spec = RandomSpec { seed: 3, dtype: GgmlType::Q4_K, nvfp4: false };
    let mut l = CpuBackend::random_from_config(&path, &spec, None, threads(), PAGE_TOKENS).unwrap();
    let bf16 = RandomSpec { dtype: GgmlType::BF16, ..spec };
    let float = CpuBackend::random_from_config(&path, &bf16, None, 1, PAGE_TOKENS).unwrap();
    std::fs::remove_file(&path).unwrap();
    let (kq_bytes, bf16_bytes) =
        (l.backend.qwen36().unwrap().weight_bytes(), float.backend.qwen36().unwrap().weight_bytes());
    assert!(kq_bytes * 3 < bf16_bytes, "the Linears are K-quants: {kq_bytes} vs {bf16_bytes} bytes in BF16");
    let b = &mut l.backend;
    b.qwen36_mut().unwrap().0.set_gdn_mode(GdnMode::Recurrent);
    let vocab = b.hparams().vocab_size;
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 131 + 7) % 512).collect();
    let mut pool = pool_for(b);
    let whole = new_seq(&mut pool, 1, 48);
    let want = pass(b, &whole, &tokens, 0, LogitsWanted::All);
    assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|&v| v != want[0]));
    let split = new_seq(&mut pool, 2, 48);
    let mut got = pass(b, &split, &tokens[..17], 0, LogitsWanted::All);
    got.extend(pass(b, &split, &tokens[17..30], 17, LogitsWanted::All));
    for i in 30..40 {
        got.extend(pass(b, &split, &tokens[i..i + 1], i, LogitsWanted::All));
    }
    assert_eq!(got.len(), 40 * vocab);
    for i in 0..40 {
        assert!(got[i * vocab..(i + 1) * vocab] == want[i * vocab..(i + 1) * vocab], "position {i} differs");
    }
}

#[test]
fn draft_tree_nodes_equal_their_root_path_chains_and_the_accepted_path_continues_exactly() {
    // A fixed tree with an accepted path, then random trees: full attention and Gated
    // DeltaNet layers per node equal the path-by-path oracle bit for bit.
    check_tree("tiny-vlm");
    check_tree("tiny-text");
}

fn check_tree(name: &str) {
    let g = Goldens::open(name, "goldens.json", "goldens.safetensors");
    let x = &g.ids;
    let mut loaded = load(name, GdnMode::Recurrent);
    let b = &mut loaded.backend;
    let vocab = b.hparams().vocab_size;
    let mut pool = pool_for(b);
    let p = 50;
    let a = new_seq(&mut pool, 1, 100);
    pass(b, &a, &x[..p], 0, LogitsWanted::Last);
    // Root = x[p]; node 1 = x[p+1] and node 3 = x[p+2] follow the real text; others branch off.
    let tokens = [x[p], x[p + 1], 7, x[p + 2], 9, 11];
    let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(2)];
    let batch = ForwardBatch {
        seqs: vec![SeqInput {
            seq_id: a.id,
            tokens: &tokens,
            start_pos: p,
            pages: &a.pages,
            logits: LogitsWanted::All,
            tree: Some(&parents),
        }],
    };
    let tree = b.forward(&batch).expect("tree pass").logits.remove(0);
    assert_nodes_equal_their_chains(b, &mut pool, &x[..p], &tokens, &parents, &tree, &format!("{name} fixed tree"));
    assert!(b.accept_tree_path(a.id, &a.pages, p, &[0, 2, 3]).is_err(), "3 is not a child of 2");
    b.accept_tree_path(a.id, &a.pages, p, &[0, 1, 3]).expect("accept");
    let got = pass(b, &a, &x[p + 3..p + 5], p + 3, LogitsWanted::All);
    let f = new_seq(&mut pool, 9, 100);
    let want = pass(b, &f, &x[..p + 5], 0, LogitsWanted::All);
    assert!(got[..] == want[(p + 3) * vocab..], "continuation after the accepted path differs");
    assert!(b.accept_tree_path(a.id, &a.pages, p, &[0]).is_err(), "the tree was consumed");
    b.release_seq(a.id);

    // Random trees (seeded): every node's logits equal its root path's chain, bit for bit.
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ name.len() as u64;
    let mut rnd = move |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    };
    for round in 0..4u64 {
        let n = 3 + rnd(10) as usize;
        let parents: Vec<Option<usize>> = (0..n).map(|j| (j > 0).then(|| rnd(j as u64) as usize)).collect();
        let tokens: Vec<u32> = (0..n).map(|j| if j == 0 { x[p] } else { rnd(200) as u32 + 1 }).collect();
        // A pool per tree: sequences of this test never return their pages.
        let mut pool = MappedPool::new(b, 128).expect("mapping a pool");
        let t = new_seq(&mut pool, 200 + round, 100);
        pass(b, &t, &x[..p], 0, LogitsWanted::Last);
        let batch = ForwardBatch {
            seqs: vec![SeqInput {
                seq_id: t.id,
                tokens: &tokens,
                start_pos: p,
                pages: &t.pages,
                logits: LogitsWanted::All,
                tree: Some(&parents),
            }],
        };
        let tree = b.forward(&batch).expect("random tree pass").logits.remove(0);
        assert_nodes_equal_their_chains(
            b,
            &mut pool,
            &x[..p],
            &tokens,
            &parents,
            &tree,
            &format!("{name} random tree {parents:?}"),
        );
        b.release_seq(t.id);
    }
}

/// Every node's logits row of a tree pass after `prefix` equals a fresh chain's last row over
/// `prefix` + the node's root path, bit for bit.
fn assert_nodes_equal_their_chains(
    b: &mut CpuBackend,
    pool: &mut MappedPool,
    prefix: &[u32],
    tokens: &[u32],
    parents: &[Option<usize>],
    tree: &[f32],
    what: &str,
) {
    let vocab = b.hparams().vocab_size;
    for node in 0..tokens.len() {
        let mut path = vec![node];
        while let Some(q) = parents[*path.last().unwrap()] {
            path.push(q);
        }
        path.reverse();
        let mut chain = prefix.to_vec();
        chain.extend(path.iter().map(|&i| tokens[i]));
        let c = new_seq(pool, 1000 + node as u64, prefix.len() + tokens.len() + 1);
        let want = pass(b, &c, &chain, 0, LogitsWanted::Last);
        assert!(tree[node * vocab..(node + 1) * vocab] == want[..], "{what}: node {node} differs from its chain");
        b.release_seq(c.id);
    }
}
