//! Warp-level tensor-core primitives as the PTX ISA defines them, for the twins of the kernels
//! that use them (mma_tile.cuh, attention_mma.cu): `mma.m16n8k16` from the 32 lanes' registers
//! and `ldmatrix`'s distribution of 8x8 bf16 matrices over the lanes. A twin feeds them
//! registers built with its kernel's own index expressions, so a wrong index there scrambles the
//! twin's result too.

use super::warp::from_bf16;

/// One warp's registers for an mma: 32 lanes × (4 A words, 2 B words, 4 accumulators).
pub(crate) type AFrag = [[u32; 4]; 32];
pub(crate) type BFrag = [[u32; 2]; 32];
pub(crate) type CFrag = [[f32; 4]; 32];

pub(crate) fn lo(w: u32) -> u16 {
    (w & 0xffff) as u16
}
pub(crate) fn hi(w: u32) -> u16 {
    (w >> 16) as u16
}

/// Two bf16 in one register, the lower index in the low half.
pub(crate) fn pack(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` D = A·B + C, from the warp's registers,
/// placing elements by the PTX ISA's formulas (groupID = lane >> 2, threadID_in_group = lane % 4):
/// A: a_i (i = 0..8, two per register, low half first) at row g (+8 for i in {2,3,6,7}),
///    col 2·tg + (i & 1) (+8 for i ≥ 4); B: b_i at row(k) 2·tg + (i & 1) (+8 for i ≥ 2), col g;
/// C/D: c_i at row g (+8 for i ≥ 2), col 2·tg + (i & 1).
/// The products of two bf16 are exact in f32; the 16 are summed in k order then added to C.
pub(crate) fn mma_m16n8k16(c: &mut CFrag, a: &AFrag, b: &BFrag) {
    let mut am = [[0f32; 16]; 16];
    let mut bm = [[0f32; 8]; 16];
    for lane in 0..32 {
        let (g, tg) = (lane >> 2, lane & 3);
        for i in 0..8 {
            let reg = a[lane][i / 2];
            let v = if i % 2 == 0 { lo(reg) } else { hi(reg) };
            let row = if i < 2 || (4..6).contains(&i) { g } else { g + 8 };
            let col = tg * 2 + (i & 1) + if i >= 4 { 8 } else { 0 };
            am[row][col] = from_bf16(v);
        }
        for i in 0..4 {
            let reg = b[lane][i / 2];
            let v = if i % 2 == 0 { lo(reg) } else { hi(reg) };
            let row = tg * 2 + (i & 1) + if i >= 2 { 8 } else { 0 };
            bm[row][g] = from_bf16(v);
        }
    }
    for (lane, cl) in c.iter_mut().enumerate() {
        let (g, tg) = (lane >> 2, lane & 3);
        for (i, ci) in cl.iter_mut().enumerate() {
            let row = if i < 2 { g } else { g + 8 };
            let col = tg * 2 + (i & 1);
            let mut sum = 0f32;
            for kk in 0..16 {
                sum += am[row][kk] * bm[kk][col];
            }
            *ci += sum;
        }
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: lanes 8i .. 8i+7 give the element offsets of
/// matrix i's eight rows (8 consecutive bf16 each) in `smem`; lane t receives in register i
/// matrix i's (row t/4, cols 2(t%4), 2(t%4)+1), low half first.
pub(crate) fn ldmatrix_x4(smem: &[u16], row_offset: impl Fn(usize) -> usize) -> [[u32; 4]; 32] {
    std::array::from_fn(|t| {
        std::array::from_fn(|i| {
            let base = row_offset(8 * i + t / 4) + 2 * (t % 4);
            pack(smem[base], smem[base + 1])
        })
    })
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: lanes 8i .. 8i+7 give the element offsets of
/// matrix i's eight rows (8 consecutive bf16 each) in `smem`; lane t receives in register i the
/// transposed matrix's (row t/4, cols 2(t%4), 2(t%4)+1), i.e. the source's (rows 2(t%4) and
/// 2(t%4)+1, col t/4), low half first.
pub(crate) fn ldmatrix_x4_trans(smem: &[u16], row_offset: impl Fn(usize) -> usize) -> [[u32; 4]; 32] {
    let mut m = [[[0u16; 8]; 8]; 4];
    for (i, mi) in m.iter_mut().enumerate() {
        for (r, row) in mi.iter_mut().enumerate() {
            let base = row_offset(8 * i + r);
            row.copy_from_slice(&smem[base..base + 8]);
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|i| pack(m[i][2 * (t % 4)][t / 4], m[i][2 * (t % 4) + 1][t / 4])))
}
