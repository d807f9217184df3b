//! Helpers shared by the CPU backend tests.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use sieve_kernels::cpu::Isa;
use sieve_kernels::host::HostTensor;
use sieve_kernels::{AttnSeq, BatchLayout, CpuBackend, MoeLayerHost, RopeScaling, SharedExpertHost};

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

pub fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

pub fn tensor(rng: &mut impl Rng, rows: usize, cols: usize) -> HostTensor {
    HostTensor::from_vec(random(rng, rows * cols), rows, cols)
}

/// The CPU backends to test on this machine: every ISA path it supports.
pub fn backends(threads: usize) -> Vec<CpuBackend> {
    [Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|isa| isa.is_supported())
        .map(|isa| CpuBackend::with_isa(threads, isa).expect("backend"))
        .collect()
}

/// Asserts `max |got - want| ≤ rel · max(max |want|, 1e-3)`: errors relative to the magnitude.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    let (i, err) = got.iter().zip(want).map(|(a, b)| (a - b).abs()).enumerate().fold((0, 0f32), |(bi, be), (i, e)| {
        if e > be || e.is_nan() {
            (i, e)
        } else {
            (bi, be)
        }
    });
    assert!(
        err <= rel * scale,
        "{what}: max error {err} at {i} (got {}, want {}) exceeds {rel} × {scale}",
        got[i],
        want[i]
    );
}

pub fn assert_bits_eq(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.to_bits() == y.to_bits(), "{what}: element {i} differs: {x:e} vs {y:e}");
    }
}

/// Builds batch layouts for attention tests.
#[derive(Default)]
pub struct LayoutBuilder {
    pub layout: BatchLayout,
    pub next_slot: u32,
}

impl LayoutBuilder {
    /// Adds a sequence whose context is `shared_slots` (K/V already written by an earlier
    /// sequence) followed by `n` new rows at positions `shared_slots.len()..`. Returns its first row.
    pub fn push_seq(&mut self, shared_slots: &[u32], n: usize) -> usize {
        let b = &mut self.layout;
        let first_row = b.token_ids.len();
        let p0 = shared_slots.len();
        let slot_offset = b.key_slots.len() as u32;
        b.key_slots.extend_from_slice(shared_slots);
        for i in 0..n {
            b.token_ids.push(i as u32 % 7);
            b.positions.push((p0 + i) as u32);
            b.row_slots.push(self.next_slot);
            b.key_slots.push(self.next_slot);
            self.next_slot += 1;
        }
        b.seqs.push(AttnSeq { q_row: first_row as u32, q_len: n as u32, ctx_len: (p0 + n) as u32, slot_offset });
        first_row
    }

    /// Slots of sequence `i`'s whole context.
    pub fn context_slots(&self, i: usize) -> Vec<u32> {
        let s = self.layout.seqs[i];
        self.layout.key_slots[s.slot_offset as usize..(s.slot_offset + s.ctx_len) as usize].to_vec()
    }
}

/// A MoE layer's shared expert (qwen2_moe): (width, gate_up, down, gate).
pub type SharedExpert = (usize, Vec<f32>, Vec<f32>, Vec<f32>);

/// A MoE layer in host memory: random experts (each weight of variance 1 / fan-in), an optional
/// shared expert, and a router that is the identity on the first `experts` coordinates.
pub struct MoeLayer {
    pub hidden: usize,
    pub experts: usize,
    pub inter: usize,
    pub router: Vec<f32>,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
    pub shared: Option<SharedExpert>,
}

impl MoeLayer {
    /// Router = identity on the first `experts` coordinates: a row's logits are its first
    /// coordinates, so tests choose each row's experts exactly.
    pub fn new(g: &mut impl Rng, hidden: usize, experts: usize, inter: usize, shared: Option<usize>) -> Self {
        assert!(hidden >= experts);
        let mut router = vec![0f32; experts * hidden];
        for e in 0..experts {
            router[e * hidden + e] = 1.0;
        }
        let scaled = |g: &mut _, n: usize, fan_in: usize| {
            random(g, n).into_iter().map(|v| v * (3.0 / fan_in as f32).sqrt()).collect::<Vec<_>>()
        };
        let gate_up = scaled(g, experts * 2 * inter * hidden, hidden);
        let down = scaled(g, experts * hidden * inter, inter);
        let shared =
            shared.map(|s| (s, scaled(g, 2 * s * hidden, hidden), scaled(g, hidden * s, s), scaled(g, hidden, hidden)));
        MoeLayer { hidden, experts, inter, router, gate_up, down, shared }
    }

    /// The same layer with every weight rounded to bf16 (a bf16 checkpoint).
    pub fn rounded_to_bf16(mut self) -> Self {
        let round = |v: &mut f32| *v = f32::from_bits((v.to_bits() + 0x8000) & 0xffff_0000);
        self.gate_up.iter_mut().for_each(round);
        self.down.iter_mut().for_each(round);
        self
    }

    pub fn host(&self) -> MoeLayerHost<'_> {
        MoeLayerHost {
            hidden: self.hidden,
            num_experts: self.experts,
            expert_inter: self.inter,
            router: &self.router,
            gate_up: &self.gate_up,
            down: &self.down,
            shared: self.shared.as_ref().map(|(s, gu, d, gt)| SharedExpertHost {
                inter: *s,
                gate_up: gu,
                down: d,
                gate: gt,
            }),
        }
    }
}

/// The RoPE scalings the rope tests cover: none, `linear`, Llama 3.1's (`llama3`, whose three
/// frequency bands every tested rotary size reaches) and YaRN (over an original context of 64, so
/// that its kept, blended and divided pairs are all reached, and its attention factor for 4).
pub const ROPE_SCALINGS: [RopeScaling; 4] = [
    RopeScaling::None,
    RopeScaling::Linear { factor: 4.0 },
    RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 8192 },
    RopeScaling::Yarn {
        factor: 4.0,
        original_max_position: 64,
        beta_fast: 32.0,
        beta_slow: 1.0,
        truncate: true,
        attention_factor: 1.138_629_4,
    },
];
