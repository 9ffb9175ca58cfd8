//! Exactness of prefix reuse on the CPU backend: a sequence that starts from cached pages
//! (whole pages read in place, a page used in part copied first: copy on write) gets
//! bitwise the logits of a run that computed the same prefix itself, and the cached pages
//! are never written. Pages start poisoned with f16 NaNs, so any read past a page's valid
//! tokens would show up as NaN logits.

mod common;

use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::PageId;
use engine_service::memory::store::{LeasedPage, PageStore, SpaceChange};

const PT: usize = 16;

fn prompt() -> Vec<u32> {
    // Ordinary token ids (well inside the vocabulary), not all equal.
    (0..44u32).map(|i| 1000 + (i * 37) % 3000).collect()
}

fn run(backend: &mut CpuBackend, tokens: &[u32], start: usize, pages: &[PageId], logits: bool) -> Vec<f32> {
    let batch = ForwardBatch {
        seqs: vec![SeqInput {
            seq_id: 0,
            tree: None,
            tokens,
            start_pos: start,
            pages,
            logits: if logits { LogitsWanted::Last } else { LogitsWanted::None },
        }],
    };
    let mut out = backend.forward(&batch).expect("forward");
    out.logits.pop().unwrap_or_default()
}

fn page_bytes(backend: &CpuBackend, p: PageId) -> Vec<u8> {
    let layout = backend.kv_layout();
    backend.ops().read_page_bytes(&layout, p, 0, layout.page_bytes()).expect("a mapped page")
}

fn ids(pages: &[LeasedPage]) -> Vec<PageId> {
    pages.iter().map(LeasedPage::page_id).collect()
}

#[test]
fn cached_full_partial_and_copied_pages_give_bitwise_uncached_logits() {
    let mut loaded = common::load(PT);
    let backend = &mut loaded.backend;
    let layout = backend.kv_layout();
    let bytes = layout.page_bytes();
    let mut store = PageStore::local(layout, 64);
    let fresh = |store: &mut PageStore, backend: &mut CpuBackend, n: usize| {
        let pages = store.allocate(n).expect("local").expect("room");
        for change in store.take_space_changes() {
            if let SpaceChange::Map(space, memory) = change {
                backend.map_pages(space, memory).expect("mapping the pool");
            }
        }
        for p in &pages {
            // 0xFF bytes are f16 NaNs.
            backend.ops().write_page_bytes(&layout, p.page_id(), 0, &vec![0xFF; bytes]).expect("poisoning");
        }
        pages
    };
    let tokens = prompt();
    let other: Vec<u32> = (0..16u32).map(|i| 2000 + i * 11).collect();

    // (reuse point, what the producer computed after the prefix): a page boundary; a
    // partial tail with poisoned bytes after it; the head of a page filled by another
    // continuation (the generation of an earlier turn).
    for (n, continuation) in [(32usize, &other[..5]), (37, &other[..0]), (37, &other[..11])] {
        // Reference: the prefix, then the rest, computed by one sequence.
        let ref_pages = fresh(&mut store, backend, 3);
        let ref_ptrs = ids(&ref_pages);
        run(backend, &tokens[..n], 0, &ref_ptrs, false);
        let expected = run(backend, &tokens[n..], n, &ref_ptrs, true);
        assert!(expected.iter().all(|x| x.is_finite()), "reference logits are finite");

        // Producer: computes the prefix and maybe continues differently; its pages are then
        // "committed" (read-only from here on).
        let producer = fresh(&mut store, backend, 3);
        let prod_ptrs = ids(&producer);
        run(backend, &tokens[..n], 0, &prod_ptrs, false);
        if !continuation.is_empty() {
            run(backend, continuation, n, &prod_ptrs, false);
        }
        let snapshot: Vec<Vec<u8>> = prod_ptrs.iter().map(|&p| page_bytes(backend, p)).collect();

        // Consumer: whole pages in place; the page used in part is copied first.
        let whole = n / PT;
        let mut pages: Vec<PageId> = prod_ptrs[..whole].to_vec();
        let own = fresh(&mut store, backend, 3 - whole);
        if n % PT != 0 {
            backend.copy_page(producer[whole].page_id(), own[0].page_id()).expect("copy on write");
        }
        pages.extend(ids(&own));
        let got = run(backend, &tokens[n..], n, &pages, true);
        assert_eq!(got.len(), expected.len());
        let same = got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "reuse at {n} (continuation {}) changed the logits", continuation.len());
        for (i, &p) in prod_ptrs.iter().enumerate() {
            assert!(page_bytes(backend, p) == snapshot[i], "cached page {i} was written by the consumer");
        }
        store.release(&ref_pages);
        store.release(&producer);
        store.release(&own);
    }
}
