//! ggml tensor types and their dequantization to f32.
//!
//! Block layouts follow ggml's `ggml-common.h` / `ggml-quants.c` (`dequantize_row_*`); the tests
//! compare against the Python `gguf` package's `gguf.quants.dequantize` on random blocks
//! (fixture `tests/fixtures/gguf_dequant.json`, made by `scripts/reference/gguf_dequant.py`).

use crate::error::{Result, WorkerError};
use half::{bf16, f16};

/// The ggml tensor types this loader knows by id (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
}

/// Super-block size of the k-quants.
const QK_K: usize = 256;

impl GgmlType {
    /// Maps ggml's numeric type id; `None` for ids this loader does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            24 => Self::I8,
            25 => Self::I16,
            26 => Self::I32,
            27 => Self::I64,
            28 => Self::F64,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
            Self::BF16 => "BF16",
        }
    }

    /// Parses the names used by ggml and the Python `gguf` package ("Q4_K", "BF16", ...).
    pub fn from_name(name: &str) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| t.name() == name)
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::I8 | Self::I16 | Self::I32 | Self::I64 | Self::F64 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 => 1,
            Self::I64 | Self::F64 => 8,
            Self::Q4_0 => 2 + 16,
            Self::Q4_1 => 2 + 2 + 16,
            Self::Q5_0 => 2 + 4 + 16,
            Self::Q5_1 => 2 + 2 + 4 + 16,
            Self::Q8_0 => 2 + 32,
            Self::Q8_1 => 2 + 2 + 32,
            Self::Q2K => QK_K / 16 + QK_K / 4 + 2 + 2,
            Self::Q3K => QK_K / 8 + QK_K / 4 + 12 + 2,
            Self::Q4K => 2 + 2 + 12 + QK_K / 2,
            Self::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            Self::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            Self::Q8K => 4 + QK_K + QK_K / 16 * 2,
        }
    }

    /// Whether [`dequantize`] handles this type.
    pub fn can_dequantize(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q5_1
                | Self::Q8_0
                | Self::Q2K
                | Self::Q3K
                | Self::Q4K
                | Self::Q5K
                | Self::Q6K
        )
    }

    /// Bytes taken by `n_elements` elements; `None` when they are not whole blocks or overflow.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

const ALL_TYPES: [GgmlType; 20] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::BF16,
];

/// Dequantizes `bytes` (whole blocks of type `ty`) into `out`, appending.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
    let ts = ty.type_size();
    if !bytes.len().is_multiple_of(ts) {
        return Err(WorkerError::ModelFile(format!(
            "{} data of {} bytes is not a whole number of {ts}-byte blocks",
            ty.name(),
            bytes.len()
        )));
    }
    let n_blocks = bytes.len() / ts;
    out.reserve(n_blocks * ty.block_size());
    let blocks = bytes.chunks_exact(ts);
    match ty {
        GgmlType::F32 => out.extend(blocks.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => out.extend(blocks.map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
        GgmlType::BF16 => out.extend(blocks.map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        GgmlType::Q4_0 => blocks.for_each(|b| block_q4_0(b, out)),
        GgmlType::Q4_1 => blocks.for_each(|b| block_q4_1(b, out)),
        GgmlType::Q5_0 => blocks.for_each(|b| block_q5_0(b, out)),
        GgmlType::Q5_1 => blocks.for_each(|b| block_q5_1(b, out)),
        GgmlType::Q8_0 => blocks.for_each(|b| block_q8_0(b, out)),
        GgmlType::Q2K => blocks.for_each(|b| block_q2_k(b, out)),
        GgmlType::Q3K => blocks.for_each(|b| block_q3_k(b, out)),
        GgmlType::Q4K => blocks.for_each(|b| block_q4_k(b, out)),
        GgmlType::Q5K => blocks.for_each(|b| block_q5_k(b, out)),
        GgmlType::Q6K => blocks.for_each(|b| block_q6_k(b, out)),
        other => {
            return Err(WorkerError::Unsupported(format!("dequantizing ggml type {} is not supported", other.name())))
        }
    }
    Ok(())
}

/// Dequantizes whole blocks of type `ty` to a new vector.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn block_q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| ((q & 0x0F) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
}

fn block_q4_1(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| (q & 0x0F) as f32 * d + m));
    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

fn block_q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, &q) in qs.iter().enumerate() {
        let xh = (((qh >> j) << 4) & 0x10) as u8;
        out.push((((q & 0x0F) | xh) as i32 - 16) as f32 * d);
    }
    for (j, &q) in qs.iter().enumerate() {
        let xh = ((qh >> (j + 12)) & 0x10) as u8;
        out.push((((q >> 4) | xh) as i32 - 16) as f32 * d);
    }
}

fn block_q5_1(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, &q) in qs.iter().enumerate() {
        let xh = (((qh >> j) << 4) & 0x10) as u8;
        out.push(((q & 0x0F) | xh) as f32 * d + m);
    }
    for (j, &q) in qs.iter().enumerate() {
        let xh = ((qh >> (j + 12)) & 0x10) as u8;
        out.push(((q >> 4) | xh) as f32 * d + m);
    }
}

fn block_q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
}

/// Q2_K: 16 sub-blocks of 16 with 4-bit scale and min, 2-bit quants.
fn block_q2_k(b: &[u8], out: &mut Vec<f32>) {
    let scales = &b[0..QK_K / 16];
    let qs_all = &b[QK_K / 16..QK_K / 16 + QK_K / 4];
    let d = f16_at(b, QK_K / 16 + QK_K / 4);
    let dmin = f16_at(b, QK_K / 16 + QK_K / 4 + 2);
    let mut is = 0;
    for q in qs_all.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in [&q[..16], &q[16..]] {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
                out.extend(half.iter().map(|&x| dl * ((x >> shift) & 3) as f32 - ml));
            }
        }
    }
}

/// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales, 2 low bits + 1 high bit per quant.
fn block_q3_k(b: &[u8], out: &mut Vec<f32>) {
    let hmask = &b[0..QK_K / 8];
    let qs_all = &b[QK_K / 8..QK_K / 8 + QK_K / 4];
    let packed = &b[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + 12];
    let d = f16_at(b, QK_K / 8 + QK_K / 4 + 12);
    // Unpack the twelve bytes into sixteen 6-bit scales (ggml's kmask1/kmask2 shuffle).
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut scales = [0i32; 16];
    for (s, byte) in scales.iter_mut().zip(aux.iter().flat_map(|w| w.to_le_bytes())) {
        *s = byte as i8 as i32 - 32;
    }
    let mut is = 0;
    // The high-bit mask walks through the 8 bits of hmask over the two 128-element halves.
    let mut m = 1u8;
    for q in qs_all.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for (lo, half) in [(0, &q[..16]), (16, &q[16..])] {
                let dl = d * scales[is] as f32;
                is += 1;
                for (l, &x) in half.iter().enumerate() {
                    let high = if hmask[lo + l] & m != 0 { 0 } else { 4 };
                    out.push(dl * (((x >> shift) & 3) as i32 - high) as f32);
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K super-block (ggml `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn block_q4_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..16 + QK_K / 2];
    for (chunk, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(q.iter().map(|&x| d1 * (x & 0x0F) as f32 - m1));
        out.extend(q.iter().map(|&x| d2 * (x >> 4) as f32 - m2));
    }
}

fn block_q5_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..16 + QK_K / 8];
    let qs = &b[16 + QK_K / 8..16 + QK_K / 8 + QK_K / 2];
    let (mut u1, mut u2) = (1u8, 2u8);
    for (chunk, ql) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let hi = if qh[l] & u1 != 0 { 16 } else { 0 };
            out.push(d1 * ((ql[l] & 0x0F) + hi) as f32 - m1);
        }
        for l in 0..32 {
            let hi = if qh[l] & u2 != 0 { 16 } else { 0 };
            out.push(d2 * ((ql[l] >> 4) + hi) as f32 - m2);
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

fn block_q6_k(b: &[u8], out: &mut Vec<f32>) {
    let ql_all = &b[0..QK_K / 2];
    let qh_all = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let sc_all = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let d = f16_at(b, QK_K / 2 + QK_K / 4 + QK_K / 16);
    for half in 0..2 {
        let ql = &ql_all[half * 64..half * 64 + 64];
        let qh = &qh_all[half * 32..half * 32 + 32];
        let sc = &sc_all[half * 8..half * 8 + 8];
        let mut y = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_sizes_match_ggml() {
        // Sizes from ggml-common.h static asserts.
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q4_1.type_size(), 20);
        assert_eq!(GgmlType::Q5_0.type_size(), 22);
        assert_eq!(GgmlType::Q5_1.type_size(), 24);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q2K.type_size(), 84);
        assert_eq!(GgmlType::Q3K.type_size(), 110);
        assert_eq!(GgmlType::Q4K.type_size(), 144);
        assert_eq!(GgmlType::Q5K.type_size(), 176);
        assert_eq!(GgmlType::Q6K.type_size(), 210);
        assert_eq!(GgmlType::Q8K.type_size(), 292);
    }

    #[test]
    fn partial_block_is_an_error() {
        let err = dequantize(GgmlType::Q8_0, &[0u8; 33]).unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
    }

    #[test]
    fn unsupported_type_is_an_error_not_a_panic() {
        let err = dequantize(GgmlType::Q8K, &[0u8; 292]).unwrap_err();
        assert!(matches!(err, WorkerError::Unsupported(_)), "{err}");
    }
}
