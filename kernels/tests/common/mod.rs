//! Helpers shared by the CPU backend tests.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use sieve_kernels::cpu::Isa;
use sieve_kernels::host::HostTensor;
use sieve_kernels::{AttnSeq, BatchLayout, CpuBackend};

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

/// A qwen2_moe-style MoE layer in host memory: the router, the experts and a shared expert with
/// its sigmoid gate, each projection scaled by 1/√fan-in (the gate's weight by 0.3).
pub struct SharedExpertLayer {
    pub hidden: usize,
    pub experts: usize,
    pub inter: usize,
    pub shared_inter: usize,
    router: Vec<f32>,
    gate_up: Vec<f32>,
    down: Vec<f32>,
    shared_gate_up: Vec<f32>,
    shared_down: Vec<f32>,
    shared_gate: Vec<f32>,
}

impl SharedExpertLayer {
    pub fn new(g: &mut impl Rng, hidden: usize, experts: usize, inter: usize, shared_inter: usize) -> Self {
        let mut scaled =
            |n: usize, fan_in: usize| -> Vec<f32> { random(g, n).iter().map(|v| v / (fan_in as f32).sqrt()).collect() };
        let router = scaled(experts * hidden, hidden);
        let gate_up = scaled(experts * 2 * inter * hidden, hidden);
        let down = scaled(experts * hidden * inter, inter);
        let shared_gate_up = scaled(2 * shared_inter * hidden, hidden);
        let shared_down = scaled(hidden * shared_inter, shared_inter);
        let shared_gate = random(g, hidden).iter().map(|v| v * 0.3).collect();
        SharedExpertLayer {
            hidden,
            experts,
            inter,
            shared_inter,
            router,
            gate_up,
            down,
            shared_gate_up,
            shared_down,
            shared_gate,
        }
    }

    /// The layer, with or without its shared expert.
    pub fn host(&self, with_shared: bool) -> sieve_kernels::MoeLayerHost<'_> {
        sieve_kernels::MoeLayerHost {
            hidden: self.hidden,
            num_experts: self.experts,
            expert_inter: self.inter,
            router: &self.router,
            gate_up: &self.gate_up,
            down: &self.down,
            shared: with_shared.then_some(sieve_kernels::SharedExpertHost {
                inter: self.shared_inter,
                gate_up: &self.shared_gate_up,
                down: &self.shared_down,
                gate: &self.shared_gate,
            }),
        }
    }
}
