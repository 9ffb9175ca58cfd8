//! The grouped K-quant layout: sixteen weight rows interleaved per 256-value block, so that a
//! 64-byte vector holds four adjacent codes of each of the sixteen rows, and one `vpdpbusd`
//! against an activation row's four codes (broadcast) adds four products to sixteen row sums.
//! Scales and mins are stored unpacked, one byte per row and sub-block, so a vector load (and
//! a widening move) gives them in the rows' lanes. No sum crosses lanes before the float
//! stage, which runs sixteen rows at once ([`super::accumulate_block`] lane by lane).
//!
//! A group-block (all offsets in bytes; `r` the row in the group, 0..16; codes are unsigned):
//! - Q4_K (2368) and Q5_K (2880): `d[16]` and `dmin[16]` f16 at 0 and 32; `scales[8][16]` u8
//!   at 64; `mins[4][16][2]` u8 at 192 (row r's mins 2j, 2j + 1 side by side, for `madd`
//!   against the activation sums of sub-blocks 2j, 2j + 1); codes at 320: for sub-block
//!   `s` (32 positions) and step `u` (0..4), 64 bytes at `320 + 64 * (4s + u)`, byte `4r + i`
//!   = low four bits of code `32s + 4u + i` | those of code `32s + 16 + 4u + i` << 4. Q5_K then
//!   has the fifth bits at 2368: 64 bytes per sub-block, byte `4r + i` bit `u` = fifth bit of
//!   code `32s + 4u + i`, bit `4 + u` = of code `32s + 16 + 4u + i`.
//! - Q6_K (3360): `d[16]` f16 at 0; `scales[8][16][2]` i8 at 32 (sub-blocks 2j, 2j + 1 of 16
//!   positions); then per sub-block `t` (0..16) 192 bytes at `288 + 192 t`: two code vectors
//!   (byte `4r + i`: low bits of code `16t + 8h + i` | of `16t + 8h + 4 + i` << 4, `h` = 0, 1)
//!   and one of high bits (byte `4r + i` bits `2k..2k + 2` = code `16t + 4k + i` >> 4).
//!
//! Groups are stored one after another, each block after block; the last group of a matrix
//! whose rows are not a multiple of sixteen is padded with zero rows (all scales zero).

#[cfg(test)]
use super::ThreadPool;
use super::{KQuantMatrix, KQuantType, OutPtr, Q8KActs, QK_K, scales_mins};

/// Weight rows per group.
pub const GROUP_ROWS: usize = 16;

/// Bytes of one group-block.
pub const fn group_block_bytes(dtype: KQuantType) -> usize {
    match dtype {
        KQuantType::Q4K => 2368,
        KQuantType::Q5K => 2880,
        KQuantType::Q6K => 3360,
    }
}

/// Offsets inside a Q4_K/Q5_K group-block.
pub(super) const Q45_SCALES: usize = 64;
pub(super) const Q45_MINS: usize = 192;
pub(super) const Q45_CODES: usize = 320;
pub(super) const Q5_FIFTH: usize = 2368;
/// Offsets inside a Q6_K group-block.
pub(super) const Q6_SCALES: usize = 32;
pub(super) const Q6_CODES: usize = 288;
pub(super) const Q6_SUB_BYTES: usize = 192;

/// The unsigned code at position `p` (0..256) of a file-layout block, and its sub-block scale
/// and min (Q6_K: the i8 scale as stored, min 0).
fn file_code(dtype: KQuantType, blk: &[u8], p: usize) -> u8 {
    match dtype {
        KQuantType::Q4K | KQuantType::Q5K => {
            let (g, within) = (p / 64, p % 64);
            let l = within % 32;
            let qs = if dtype == KQuantType::Q5K { &blk[48..176] } else { &blk[16..144] };
            let mut q = if within < 32 { qs[32 * g + l] & 0xf } else { qs[32 * g + l] >> 4 };
            if dtype == KQuantType::Q5K {
                let bit = 2 * g + usize::from(within >= 32);
                q |= ((blk[16 + l] >> bit) & 1) << 4;
            }
            q
        }
        KQuantType::Q6K => {
            let (n, k, l) = (p / 128, p % 128 / 32, p % 32);
            let (ql, qh) = (&blk[64 * n..64 * n + 64], &blk[128 + 32 * n..128 + 32 * n + 32]);
            let low = match k {
                0 => ql[l] & 0xf,
                1 => ql[l + 32] & 0xf,
                2 => ql[l] >> 4,
                _ => ql[l + 32] >> 4,
            };
            low | (((qh[l] >> (2 * k)) & 3) << 4)
        }
    }
}

/// Writes code `q` at position `p` of a file-layout block (the inverse of [`file_code`]; the
/// block's code bytes start zeroed).
fn set_file_code(dtype: KQuantType, blk: &mut [u8], p: usize, q: u8) {
    match dtype {
        KQuantType::Q4K | KQuantType::Q5K => {
            let (g, within) = (p / 64, p % 64);
            let l = within % 32;
            let at = if dtype == KQuantType::Q5K { 48 } else { 16 } + 32 * g + l;
            blk[at] |= if within < 32 { q & 0xf } else { (q & 0xf) << 4 };
            if dtype == KQuantType::Q5K {
                let bit = 2 * g + usize::from(within >= 32);
                blk[16 + l] |= ((q >> 4) & 1) << bit;
            }
        }
        KQuantType::Q6K => {
            let (n, k, l) = (p / 128, p % 128 / 32, p % 32);
            let at = 64 * n + l + if k % 2 == 1 { 32 } else { 0 };
            blk[at] |= if k < 2 { q & 0xf } else { (q & 0xf) << 4 };
            blk[128 + 32 * n + l] |= ((q >> 4) & 3) << (2 * k);
        }
    }
}

/// The grouped layout of `rows` file-layout rows of `cols` values.
pub(super) fn pack(dtype: KQuantType, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let (nb, bb, gb) = (cols / QK_K, dtype.block_bytes(), group_block_bytes(dtype));
    let groups = rows.div_ceil(GROUP_ROWS);
    let mut out = vec![0u8; groups * nb * gb];
    for g in 0..groups {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * gb..(g * nb + b + 1) * gb];
            for r in 0..GROUP_ROWS.min(rows - g * GROUP_ROWS) {
                let row = g * GROUP_ROWS + r;
                let blk = &data[(row * nb + b) * bb..(row * nb + b + 1) * bb];
                pack_row(dtype, blk, r, dst);
            }
        }
    }
    out
}

/// Puts row `r`'s block `blk` into group-block `dst`.
fn pack_row(dtype: KQuantType, blk: &[u8], r: usize, dst: &mut [u8]) {
    let code = |p: usize| file_code(dtype, blk, p);
    match dtype {
        KQuantType::Q4K | KQuantType::Q5K => {
            dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
            let (sc, mn) = scales_mins(&blk[4..16]);
            for s in 0..8 {
                dst[Q45_SCALES + 16 * s + r] = sc[s];
                dst[Q45_MINS + 32 * (s / 2) + 2 * r + s % 2] = mn[s];
            }
            for s in 0..8 {
                for u in 0..4 {
                    for i in 0..4 {
                        let (lo, hi) = (code(32 * s + 4 * u + i), code(32 * s + 16 + 4 * u + i));
                        dst[Q45_CODES + 64 * (4 * s + u) + 4 * r + i] = (lo & 0xf) | ((hi & 0xf) << 4);
                        if dtype == KQuantType::Q5K {
                            dst[Q5_FIFTH + 64 * s + 4 * r + i] |= ((lo >> 4) << u) | ((hi >> 4) << (4 + u));
                        }
                    }
                }
            }
        }
        KQuantType::Q6K => {
            dst[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
            for t in 0..16 {
                dst[Q6_SCALES + 32 * (t / 2) + 2 * r + t % 2] = blk[192 + t];
                let sub = Q6_CODES + Q6_SUB_BYTES * t;
                for i in 0..4 {
                    for h in 0..2 {
                        let (lo, hi) = (code(16 * t + 8 * h + i), code(16 * t + 8 * h + 4 + i));
                        dst[sub + 64 * h + 4 * r + i] = (lo & 0xf) | ((hi & 0xf) << 4);
                    }
                    for k in 0..4 {
                        dst[sub + 128 + 4 * r + i] |= (code(16 * t + 4 * k + i) >> 4) << (2 * k);
                    }
                }
            }
        }
    }
}

/// The code at position `p` of row `r` in a group-block.
fn grouped_code(dtype: KQuantType, src: &[u8], r: usize, p: usize) -> u8 {
    match dtype {
        KQuantType::Q4K | KQuantType::Q5K => {
            let (s, within) = (p / 32, p % 32);
            let (upper, u, i) = (within >= 16, within % 16 / 4, within % 4);
            let byte = src[Q45_CODES + 64 * (4 * s + u) + 4 * r + i];
            let mut q = if upper { byte >> 4 } else { byte & 0xf };
            if dtype == KQuantType::Q5K {
                let bit = if upper { 4 + u } else { u };
                q |= ((src[Q5_FIFTH + 64 * s + 4 * r + i] >> bit) & 1) << 4;
            }
            q
        }
        KQuantType::Q6K => {
            let (t, within) = (p / 16, p % 16);
            let (h, upper, i) = (within / 8, within % 8 >= 4, within % 4);
            let sub = Q6_CODES + Q6_SUB_BYTES * t;
            let byte = src[sub + 64 * h + 4 * r + i];
            let low = if upper { byte >> 4 } else { byte & 0xf };
            let k = within / 4;
            low | (((src[sub + 128 + 4 * r + i] >> (2 * k)) & 3) << 4)
        }
    }
}

/// Row `row` of a grouped matrix in the file layout (the exact bytes it was packed from).
pub(super) fn unpack_row(dtype: KQuantType, cols: usize, data: &[u8], row: usize) -> Vec<u8> {
    let (nb, bb, gb) = (cols / QK_K, dtype.block_bytes(), group_block_bytes(dtype));
    let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
    let mut out = vec![0u8; nb * bb];
    for b in 0..nb {
        let src = &data[(g * nb + b) * gb..(g * nb + b + 1) * gb];
        let blk = &mut out[b * bb..(b + 1) * bb];
        match dtype {
            KQuantType::Q4K | KQuantType::Q5K => {
                blk[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
                blk[2..4].copy_from_slice(&src[32 + 2 * r..32 + 2 * r + 2]);
                let sc: [u8; 8] = std::array::from_fn(|s| src[Q45_SCALES + 16 * s + r]);
                let mn: [u8; 8] = std::array::from_fn(|s| src[Q45_MINS + 32 * (s / 2) + 2 * r + s % 2]);
                // the inverse of `scales_mins`: 6-bit values 0..4 whole, 4..8 split
                for j in 0..4 {
                    blk[4 + j] = (sc[j] & 0x3f) | ((sc[4 + j] >> 4) << 6);
                    blk[8 + j] = (mn[j] & 0x3f) | ((mn[4 + j] >> 4) << 6);
                    blk[12 + j] = (sc[4 + j] & 0xf) | ((mn[4 + j] & 0xf) << 4);
                }
            }
            KQuantType::Q6K => {
                blk[208..210].copy_from_slice(&src[2 * r..2 * r + 2]);
                for t in 0..16 {
                    blk[192 + t] = src[Q6_SCALES + 32 * (t / 2) + 2 * r + t % 2];
                }
            }
        }
        for p in 0..QK_K {
            set_file_code(dtype, blk, p, grouped_code(dtype, src, r, p));
        }
    }
    out
}

/// A grouped kernel over the groups in `chunks`.
pub(super) type GroupedKernel = unsafe fn(&KQuantMatrix, &Q8KActs, &super::RowChunks, OutPtr);

/// The groups of `w` in chunks of [`super::chunk_units`].
pub(super) fn chunks(w: &KQuantMatrix, m_rows: usize, threads: usize) -> super::RowChunks {
    let groups = w.rows.div_ceil(GROUP_ROWS);
    let per_group = w.cols / QK_K * group_block_bytes(w.dtype);
    super::RowChunks::over(groups, super::chunk_units(groups, per_group, m_rows, threads))
}

/// `out[m * w.rows + o]` for every activation row of `acts` on a kernel the caller picks
/// (the tests run every grouped kernel this way; the engine goes through
/// [`super::matmul_kquant_q8k_many`]); groups handed to the pool's threads a chunk at a time.
#[cfg(test)]
pub(super) fn matmul(pool: &ThreadPool, kernel: GroupedKernel, w: &KQuantMatrix, acts: &Q8KActs, out: &mut [f32]) {
    assert!(w.layout == super::Layout::Grouped, "grouped kernel on a file-layout matrix");
    assert!(acts.cols == w.cols && out.len() >= acts.m_rows * w.rows, "matmul_kquant: shapes");
    let chunks = chunks(w, acts.m_rows, pool.n_threads());
    let outp = OutPtr(out.as_mut_ptr());
    pool.run(|_, _| {
        let out_base = outp;
        // SAFETY: the kernel's features were checked when it was chosen; each group's
        // outputs go to the one thread that took it.
        unsafe { kernel(w, acts, &chunks, out_base) };
    });
}

/// The portable grouped kernel: the layout's integers in plain loops, the reference the tests
/// hold the SIMD kernels' layout handling to on every machine.
///
/// # Safety
/// `w` is grouped; the outputs of the groups in `chunks` are written by no one else.
#[cfg(test)]
pub(super) unsafe fn rows_scalar(w: &KQuantMatrix, acts: &Q8KActs, chunks: &super::RowChunks, out: OutPtr) {
    let (nb, gb) = (w.cols / QK_K, group_block_bytes(w.dtype));
    let q8 = acts;
    let f16 = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    while let Some(groups) = chunks.next() {
        for g in groups {
            for m in 0..q8.m_rows {
                for r in 0..GROUP_ROWS.min(w.rows - g * GROUP_ROWS) {
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let src = &w.data[(g * nb + b) * gb..(g * nb + b + 1) * gb];
                        let a = &q8.qs[m * w.cols + b * QK_K..][..QK_K];
                        let code = |p: usize| grouped_code(w.dtype, src, r, p) as i32;
                        let (mut s, mut n) = (0i32, 0i32);
                        let (d, dmin) = match w.dtype {
                            KQuantType::Q6K => {
                                for t in 0..16 {
                                    let sc = src[Q6_SCALES + 32 * (t / 2) + 2 * r + t % 2] as i8 as i32;
                                    let dot: i32 = (16 * t..16 * t + 16).map(|p| code(p) * a[p] as i32).sum();
                                    s += sc * dot;
                                    n += 32 * sc * q8.bsums[m * w.cols / 16 + b * 16 + t] as i32;
                                }
                                (f16(src, 2 * r), f16(src, 2 * r))
                            }
                            _ => {
                                for j in 0..8 {
                                    let sc = src[Q45_SCALES + 16 * j + r] as i32;
                                    let mn = src[Q45_MINS + 32 * (j / 2) + 2 * r + j % 2] as i32;
                                    let dot: i32 = (32 * j..32 * j + 32).map(|p| code(p) * a[p] as i32).sum();
                                    s += sc * dot;
                                    n += mn * q8.sums32[m * w.cols / 32 + b * 8 + j] as i32;
                                }
                                (f16(src, 2 * r), f16(src, 32 + 2 * r))
                            }
                        };
                        acc = super::accumulate_block(acc, d, dmin, q8.d[m * nb + b], s, n);
                    }
                    // SAFETY: the caller's contract.
                    unsafe { *out.0.add(m * w.rows + g * GROUP_ROWS + r) = acc };
                }
            }
        }
    }
}

/// The raw group-blocks of a grouped matrix.
#[cfg_attr(not(any(target_arch = "x86_64", test)), allow(dead_code))]
pub(super) fn data(w: &KQuantMatrix) -> &[u8] {
    &w.data
}

#[cfg(target_arch = "x86_64")]
#[path = "kquant_grouped_x86.rs"]
pub(super) mod x86;
