//! Tree attention vs the path-by-path oracle: every node's output must be bitwise the output
//! of a chain query at its logical position over the committed keys plus its root path
//! (f16 and FP8 pages).

use super::super::{AttnParams, attention_with, write_kv};
use super::TreeKeys;
use crate::kernels::{ThreadPool, available};
use crate::pages::LocalPagePool;
use crate::pages::PageAddr;
use engine_ops::kv::{KvDtype, KvLayout};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_parents(rng: &mut ChaCha8Rng, n: usize, chain_bias: bool) -> Vec<Option<usize>> {
    let mut parents = vec![None];
    for j in 1..n {
        // A chain-heavy tree reaches deep positions (crossing segment ends); otherwise bushy.
        let p = if chain_bias && rng.random_range(0..4) > 0 { j - 1 } else { rng.random_range(0..j) };
        parents.push(Some(p));
    }
    parents
}

fn pages(pool: &mut LocalPagePool, n: usize) -> Vec<PageAddr> {
    pool.allocate(n).expect("pages").into_iter().map(|(_, p)| p).collect()
}

#[test]
fn tree_keys_map_logical_positions_to_ancestor_slots() {
    // 0 -> 1 -> 3, 0 -> 2 -> 4 -> 5
    let t = TreeKeys::new(&[None, Some(0), Some(0), Some(1), Some(2), Some(4)]).unwrap();
    assert_eq!(t.len(), 6);
    assert_eq!(t.max_depth(), 3);
    assert_eq!((0..6).map(|i| t.depth(i)).collect::<Vec<_>>(), vec![0, 1, 1, 2, 2, 3]);
    let sp = 10;
    assert_eq!((0..=13).map(|x| t.slot(sp, 5, x)).collect::<Vec<_>>()[9..], [9, 10, 12, 14, 15]);
    assert_eq!(t.slot(sp, 3, 12), 13);
    assert_eq!(t.slot(sp, 3, 11), 11);
    assert!(TreeKeys::new(&[Some(0)]).is_err());
    assert!(TreeKeys::new(&[None, Some(1)]).is_err());
    assert!(TreeKeys::new(&[None, None]).is_err());
}

#[test]
fn tree_attention_equals_path_by_path_chain_attention_bitwise() {
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    // (page_tokens, head_dim, n_heads, n_kv_heads, start_pos, nodes, chain-heavy)
    let cases: [(usize, usize, usize, usize, usize, usize, bool); 7] = [
        (16, 64, 9, 3, 0, 6, false),
        (16, 64, 9, 3, 37, 16, false),
        (16, 64, 9, 3, 500, 24, true),
        (12, 32, 4, 2, 509, 20, true),
        (16, 64, 9, 3, 1030, 16, false),
        (8, 16, 8, 1, 3, 40, true),
        (32, 64, 6, 6, 200, 9, false),
    ];
    let with_dtypes = cases.iter().flat_map(|c| [(c, KvDtype::F16), (c, KvDtype::Fp8)]);
    for (&(pt, hd, nh, nkv, start_pos, n, chainy), dtype) in with_dtypes {
        let layout = KvLayout { n_layers: 1, n_kv_heads: nkv, head_dim: hd, page_tokens: pt, dtype };
        let p = AttnParams { layer: 0, n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        let kv_row = nkv * hd;
        let row = nh * hd;
        let n_pages = (start_pos + n).div_ceil(pt);
        let mut pool = LocalPagePool::new(layout, 2 * n_pages + 2);
        let tree_pages = pages(&mut pool, n_pages);
        let chain_pages = pages(&mut pool, n_pages);
        let committed: Vec<(Vec<f32>, Vec<f32>)> = (0..start_pos)
            .map(|_| {
                let k = (0..kv_row).map(|_| rng.random_range(-1.5f32..1.5)).collect();
                let v = (0..kv_row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                (k, v)
            })
            .collect();
        for (pos, (k, v)) in committed.iter().enumerate() {
            write_kv(&layout, &tree_pages, 0, pos, k, v);
            write_kv(&layout, &chain_pages, 0, pos, k, v);
        }
        let parents = random_parents(&mut rng, n, chainy);
        let keys = TreeKeys::new(&parents).unwrap();
        let node_kv: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
            .map(|_| {
                let k = (0..kv_row).map(|_| rng.random_range(-1.5f32..1.5)).collect();
                let v = (0..kv_row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                (k, v)
            })
            .collect();
        for (j, (k, v)) in node_kv.iter().enumerate() {
            write_kv(&layout, &tree_pages, 0, start_pos + j, k, v);
        }
        let q: Vec<f32> = (0..n * row).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        for kern in available() {
            // Oracle: node j's root path written as a chain, one query at its position.
            let one = ThreadPool::new(1);
            let mut want = vec![f32::NAN; n * row];
            for j in 0..n {
                let mut path = vec![j];
                while let Some(pp) = parents[*path.last().unwrap()] {
                    path.push(pp);
                }
                path.reverse();
                for (e, &node) in path.iter().enumerate() {
                    write_kv(&layout, &chain_pages, 0, start_pos + e, &node_kv[node].0, &node_kv[node].1);
                }
                let pos = start_pos + keys.depth(j);
                attention_with(
                    kern,
                    &one,
                    &layout,
                    &chain_pages,
                    &p,
                    pos,
                    None,
                    &q[j * row..(j + 1) * row],
                    1,
                    &mut want[j * row..(j + 1) * row],
                );
            }
            for threads in [1, 2, 3] {
                let tp = ThreadPool::new(threads);
                let mut got = vec![f32::NAN; n * row];
                attention_with(kern, &tp, &layout, &tree_pages, &p, start_pos, Some(&keys), &q, n, &mut got);
                for j in 0..n {
                    let (g, w) = (&got[j * row..(j + 1) * row], &want[j * row..(j + 1) * row]);
                    assert!(
                        g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} {dtype:?} pt={pt} hd={hd} start={start_pos} n={n} threads={threads}: node {j} (depth {})",
                        kern.name,
                        keys.depth(j)
                    );
                }
            }
        }
    }
}
