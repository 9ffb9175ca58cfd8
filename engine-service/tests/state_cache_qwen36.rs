//! Cached vs uncached on the tiny Qwen3.6 hybrid checkpoint, through a real cache-service
//! (gRPC server + shared arena in this process) and the engine's `PageStore`, doing what the
//! step loop does: look up with a state, copy a shared tail page, load the snapshot, prefill
//! the rest, commit the prompt's pages and snapshot at the prompt's end, decode, commit and
//! snapshot at the generation's end. A 5-turn conversation gives logits bitwise equal to an
//! uncached run with > 80% of turns 2-5 from the cache, and a prompt that diverges before the
//! last snapshot resumes from the right earlier one.

use std::path::PathBuf;
use std::sync::Arc;

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};
use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::state::SaveOutcome;
use engine_service::memory::store::SpaceChange;
use engine_service::memory::store::{AttachSpec, CacheLink, LeasedPage, PageStore};
use engine_service::memory::{MappedPool, PageId};

const PT: usize = 16;
const SYSTEM: usize = 60;
const USER: usize = 8;
const GENERATED: usize = 6;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36/tiny-text")
}

/// Maps the store's page memory (its arena, its local pool) into the backend, as the step loop does.
fn sync_spaces(store: &mut PageStore, b: &mut CpuBackend) {
    for change in store.take_space_changes() {
        match change {
            SpaceChange::Map(space, memory) => b.map_pages(space, memory).expect("mapping pages"),
            SpaceChange::Unmap(space) => b.unmap_pages(space),
        }
    }
}

fn pass(b: &mut CpuBackend, seq: u64, pages: &[PageId], tokens: &[u32], start: usize) -> Vec<f32> {
    let batch = ForwardBatch {
        seqs: vec![SeqInput { seq_id: seq, tokens, start_pos: start, pages, logits: LogitsWanted::Last, tree: None }],
    };
    b.forward(&batch).expect("forward").logits.remove(0)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as u32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic ordinary token ids of the tiny vocabulary (288).
fn words(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i.wrapping_mul(97).wrapping_add(seed.wrapping_mul(31))) % 250).collect()
}

/// The uncached reference: the whole prompt in one pass, then greedy decoding. Returns every
/// logits row (prompt end, then each decode step) and the generated tokens.
fn uncached(b: &mut CpuBackend, seq: u64, prompt: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut pool = MappedPool::new(b, (prompt.len() + GENERATED).div_ceil(PT) + 1).expect("mapping a pool");
    let pages: Vec<PageId> = pool.pages_for(prompt.len() + GENERATED).unwrap();
    let mut rows = vec![pass(b, seq, &pages, prompt, 0)];
    let mut generated = vec![argmax(&rows[0])];
    while generated.len() < GENERATED {
        let pos = prompt.len() + generated.len() - 1;
        let row = pass(b, seq, &pages, &generated[generated.len() - 1..], pos);
        generated.push(argmax(&row));
        rows.push(row);
    }
    b.release_seq(seq);
    (rows, generated)
}

/// One request as the step loop runs it on the cache. Returns (logits rows, generated,
/// cached tokens).
fn cached(b: &mut CpuBackend, store: &mut PageStore, seq: u64, prompt: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>, usize) {
    let state_bytes = b.state_bytes();
    let prefix = store.lookup_with_state("", prompt, state_bytes).expect("lookup");
    let cached_tokens = prefix.cached_tokens;
    let mut pages: Vec<LeasedPage> = prefix.pages.clone();
    if let Some(lease) = &prefix.state {
        assert_eq!(lease.position, cached_tokens);
        let mut buf = vec![0u8; state_bytes];
        lease.copy_to(&mut buf).unwrap();
        b.load_state(seq, &buf).expect("load_state");
        store.release_state(lease);
    } else {
        assert_eq!(cached_tokens, 0);
    }
    let total = (prompt.len() + GENERATED).div_ceil(PT);
    let keep = pages.len() - usize::from(prefix.partial_page_tokens > 0);
    let fresh = store.allocate(total - keep).unwrap().expect("room");
    sync_spaces(store, b);
    if prefix.partial_page_tokens > 0 {
        let shared = pages.pop().unwrap();
        b.copy_page(shared.page_id(), fresh[0].page_id()).expect("copy on write");
        store.release(&[shared]);
    }
    pages.extend(fresh);
    let ptrs: Vec<PageId> = pages.iter().map(LeasedPage::page_id).collect();
    let mut rows = vec![pass(b, seq, &ptrs, &prompt[cached_tokens..], cached_tokens)];
    // End of the prompt: full pages + a copy of the tail, then the snapshot at its end.
    let full = prompt.len() / PT;
    let mut commit: Vec<LeasedPage> = pages[..full].to_vec();
    let tail_copy = (!prompt.len().is_multiple_of(PT)).then(|| {
        let c = store.allocate(1).unwrap().expect("room")[0];
        b.copy_page(pages[full].page_id(), c.page_id()).expect("copying the tail");
        c
    });
    commit.extend(tail_copy);
    store.commit("", prompt, &commit, tail_copy.is_some());
    if let Some(c) = tail_copy {
        store.release(&[c]);
    }
    let mut buf = vec![0u8; state_bytes];
    b.save_state(seq, &mut buf).unwrap();
    assert_ne!(store.save_state("", prompt, &buf).unwrap(), SaveOutcome::NoRoom);
    let mut tokens = prompt.to_vec();
    tokens.push(argmax(&rows[0]));
    while tokens.len() - prompt.len() < GENERATED {
        let pos = tokens.len() - 1;
        let row = pass(b, seq, &ptrs, &tokens[pos..], pos);
        tokens.push(argmax(&row));
        rows.push(row);
    }
    // End of generation: every computed position committed (tail as a partial page), the
    // snapshot after the last computed token, then the pages and the backend state go.
    let n_computed = tokens.len() - 1;
    store.commit("", &tokens[..n_computed], &pages[..n_computed.div_ceil(PT)], true);
    b.save_state(seq, &mut buf).unwrap();
    store.save_state("", &tokens[..n_computed], &buf).unwrap();
    b.release_seq(seq);
    store.release(&pages);
    store.flush();
    (rows, tokens[prompt.len()..].to_vec(), cached_tokens)
}

#[test]
fn a_five_turn_conversation_is_bitwise_uncached_and_mostly_from_the_cache() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut loaded = CpuBackend::load(&fixture(), 2, PT).expect("tiny qwen36 checkpoint");
    let b = &mut loaded.backend;
    assert!(b.state_bytes() > 0, "a hybrid model has recurrent state");
    let layout = b.kv_layout();
    let dir = if PathBuf::from("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let arena = Arena::create(&ArenaOptions {
        path: dir.join(format!("edge-engine-qwen36-state-{}", std::process::id())),
        file_bytes: 64 << 20,
        reserve: false,
    })
    .unwrap();
    let cache = Cache::new(arena, PT as u32);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let endpoint = runtime.block_on(async {
        let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.unwrap();
        let endpoint = listener.endpoint();
        tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
            let _ = stopped.await;
        }));
        endpoint
    });
    let spec = AttachSpec {
        auth: AuthToken::none(),
        endpoint,
        fingerprint: loaded.fingerprint.clone(),
        page_bytes: layout.page_bytes() as u64,
        page_tokens: PT as u32,
    };
    let link = CacheLink::new();
    link.set(Arc::new(runtime.block_on(spec.attach()).unwrap()));
    let mut store = PageStore::linked(layout, 8, link.clone(), runtime.handle().clone());

    let mut history = words(SYSTEM, 1);
    let (mut seq, mut later_prompt, mut later_cached) = (1u64, 0usize, 0usize);
    let mut prompts = Vec::new();
    for turn in 0..5 {
        history.extend(words(USER, 10 + turn));
        let prompt = history.clone();
        let (want, want_gen) = uncached(b, seq, &prompt);
        let (got, got_gen, cached_tokens) = cached(b, &mut store, seq + 1, &prompt);
        seq += 2;
        assert_eq!(got_gen, want_gen, "turn {turn}: generated tokens");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(bits(g) == bits(w), "turn {turn}, logits row {i}: cached differs from uncached");
        }
        if turn > 0 {
            // Resumed from the end of the previous generation: all but its last token.
            assert_eq!(cached_tokens, prompts.last().map_or(0, |p: &Vec<u32>| p.len()) + GENERATED - 1, "turn {turn}");
            later_prompt += prompt.len();
            later_cached += cached_tokens;
        }
        history.extend(&got_gen);
        prompts.push(prompt);
    }
    let ratio = later_cached as f64 / later_prompt as f64;
    eprintln!("turns 2-5: {later_cached} of {later_prompt} prompt tokens from the cache ({:.1}%)", ratio * 100.0);
    assert!(ratio > 0.8, "cached ratio {ratio}");

    // Diverging inside turn 4's user message: the last snapshot before it is the end of
    // turn 3's generation; the KV reaches further but is given up.
    let p3 = &prompts[3];
    let at = p3.len() - USER / 2;
    let mut diverged = p3[..at].to_vec();
    diverged.extend(words(12, 99));
    let (want, _) = uncached(b, seq, &diverged);
    let (got, _, cached_tokens) = cached(b, &mut store, seq + 1, &diverged);
    assert_eq!(cached_tokens, prompts[2].len() + GENERATED - 1);
    for (g, w) in got.iter().zip(&want) {
        assert!(bits(g) == bits(w), "diverged prompt: cached differs from uncached");
    }
    let stats = runtime.block_on(async { link.current().unwrap().1.stats().await.unwrap() });
    assert!(stats.state_restores >= 5 && stats.tokens_missed_no_state_snapshot > 0, "{stats:?}");
    cache.check_invariants().unwrap();
    drop(store);
    let _ = stop.send(());
}
