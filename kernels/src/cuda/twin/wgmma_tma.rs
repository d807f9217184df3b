//! A model of kernels/cuda/wgmma_tma_tile.cuh's mbarrier protocol (the bits are
//! `wgmma_tile.rs`'s, with `Feed::Tma`): the producer thread, the TMA unit and the two consumer
//! warpgroups as separate actors over the kernel's `full` and `empty` mbarriers, stepped in
//! random orders. A run checks what a race on the device would break: every consumer reads the
//! K step it expects from a slot (no stale or early data), no TMA copy is issued into or lands in
//! a slot that a wgmma in flight still reads, and the block finishes (no wait that never
//! completes). The mbarriers follow the PTX ISA: a phase completes when its pending arrivals and
//! its transaction bytes both reach zero; `try_wait.parity p` succeeds once the phase of parity
//! p has completed, and the phase before the first counts as completed.
//!
//! What the model cannot show: that the hardware behaves as the ISA says, the memory-ordering
//! fences (`fence.proxy.async`, `fence.mbarrier_init`), and the copies' bytes (the tile twin's).

use std::collections::VecDeque;

/// The kernel's per-step formulas, one place for the model and its mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Protocol {
    pub stages: usize,
    /// Consumer threads arriving on `empty` per K step (the barrier's count).
    pub consumer_threads: u32,
    /// Test-only mistakes the model must catch.
    pub mutation: Option<Mutation>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// The producer waits on `empty` with parity (kt / STAGES) & 1 (without ^ 1).
    EmptyParity,
    /// A consumer waits on `full` with the other parity.
    FullParity,
    /// A consumer frees step kt's slot (still read by the wgmma in flight) instead of kt - 1's.
    ReleaseCurrent,
    /// The stage is armed with one box's bytes only.
    ShortTransaction,
}

impl Protocol {
    fn empty_parity(&self, kt: usize) -> u32 {
        let p = ((kt / self.stages) & 1) as u32;
        if self.mutation == Some(Mutation::EmptyParity) {
            p
        } else {
            p ^ 1
        }
    }

    fn full_parity(&self, kt: usize) -> u32 {
        ((kt / self.stages) & 1) as u32 ^ u32::from(self.mutation == Some(Mutation::FullParity))
    }

    /// The step whose slot a consumer frees after passing wgmma wait_group 1 at step kt.
    fn released(&self, kt: usize) -> Option<usize> {
        if self.mutation == Some(Mutation::ReleaseCurrent) {
            Some(kt)
        } else {
            kt.checked_sub(1)
        }
    }
}

/// `mbarrier` by the PTX ISA.
struct MBarrier {
    count: u32,
    pending: u32,
    tx: i64,
    phase: u32,
}

impl MBarrier {
    fn new(count: u32) -> Self {
        MBarrier { count, pending: count, tx: 0, phase: 0 }
    }

    fn complete_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.count;
        }
    }

    fn arrive(&mut self) -> Result<(), String> {
        if self.pending == 0 {
            return Err("an arrival past the barrier's count".into());
        }
        self.pending -= 1;
        self.complete_if_done();
        Ok(())
    }

    /// `mbarrier.arrive.expect_tx`: adds the bytes, then arrives.
    fn arrive_expect_tx(&mut self, bytes: i64) -> Result<(), String> {
        self.tx += bytes;
        self.arrive()
    }

    /// A TMA copy's bytes landing.
    fn complete_tx(&mut self, bytes: i64) {
        self.tx -= bytes;
        self.complete_if_done();
    }

    /// `mbarrier.try_wait.parity`: the phase of parity `p` has completed.
    fn try_wait(&self, p: u32) -> bool {
        self.phase & 1 != p
    }
}

struct Copy {
    slot: usize,
    step: usize,
    part: usize,
    bytes: i64,
}

/// A small xorshift generator: the schedules are reproducible from their seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Runs one block over `n_k` K steps in the order drawn from `seed`; an error names the first
/// broken rule.
pub(crate) fn simulate(p: Protocol, n_k: usize, seed: u64) -> Result<(), String> {
    const CONSUMERS: usize = 2;
    let (a_bytes, b_bytes) = (16 * 1024i64, 32 * 1024i64);
    let mut full: Vec<MBarrier> = (0..p.stages).map(|_| MBarrier::new(1)).collect();
    let mut empty: Vec<MBarrier> = (0..p.stages).map(|_| MBarrier::new(p.consumer_threads)).collect();
    // The K step each slot's A and B parts hold (None: never written).
    let mut held = vec![[None::<usize>; 2]; p.stages];
    let mut copies: Vec<Copy> = Vec::new();
    let mut producer_kt = 0;
    let mut consumer_kt = [0usize; CONSUMERS];
    // Each consumer's wgmma groups in flight: (step, slot).
    let mut in_flight: [VecDeque<(usize, usize)>; CONSUMERS] = Default::default();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let reading = |in_flight: &[VecDeque<(usize, usize)>; CONSUMERS], slot: usize| {
        in_flight.iter().any(|q| q.iter().any(|&(_, s)| s == slot))
    };

    loop {
        // Every actor that can move now: 0 the producer, 1 + c consumer c, then the copies.
        let mut ready = Vec::new();
        if producer_kt < n_k && empty[producer_kt % p.stages].try_wait(p.empty_parity(producer_kt)) {
            ready.push(0);
        }
        for (c, &kt) in consumer_kt.iter().enumerate() {
            if kt < n_k && full[kt % p.stages].try_wait(p.full_parity(kt)) {
                ready.push(1 + c);
            }
        }
        ready.extend((0..copies.len()).map(|i| 1 + CONSUMERS + i));
        if ready.is_empty() {
            if producer_kt == n_k && consumer_kt.iter().all(|&kt| kt == n_k) {
                return Ok(());
            }
            return Err(format!(
                "stuck: the producer at step {producer_kt}, the consumers at {consumer_kt:?}, \
                 no copy in flight (seed {seed})"
            ));
        }
        match ready[rng.below(ready.len())] {
            0 => {
                let (kt, slot) = (producer_kt, producer_kt % p.stages);
                if reading(&in_flight, slot) {
                    return Err(format!("step {kt}'s copies issued into slot {slot} while a wgmma reads it"));
                }
                let armed = if p.mutation == Some(Mutation::ShortTransaction) { a_bytes } else { a_bytes + b_bytes };
                full[slot].arrive_expect_tx(armed)?;
                copies.push(Copy { slot, step: kt, part: 0, bytes: a_bytes });
                copies.push(Copy { slot, step: kt, part: 1, bytes: b_bytes });
                producer_kt += 1;
            }
            c if c <= CONSUMERS => {
                let c = c - 1;
                let (kt, slot) = (consumer_kt[c], consumer_kt[c] % p.stages);
                if held[slot] != [Some(kt); 2] {
                    return Err(format!("consumer {c} read slot {slot} for step {kt} holding {:?}", held[slot]));
                }
                in_flight[c].push_back((kt, slot));
                while in_flight[c].len() > 1 {
                    in_flight[c].pop_front(); // wgmma.wait_group 1
                }
                if let Some(done) = p.released(kt) {
                    for _ in 0..p.consumer_threads / CONSUMERS as u32 {
                        empty[done % p.stages].arrive()?;
                    }
                }
                consumer_kt[c] += 1;
                if consumer_kt[c] == n_k {
                    in_flight[c].clear(); // wgmma.wait_group 0
                }
            }
            i => {
                let copy = copies.swap_remove(i - 1 - CONSUMERS);
                if reading(&in_flight, copy.slot) {
                    return Err(format!("step {}'s copy landed in slot {} under a wgmma", copy.step, copy.slot));
                }
                held[copy.slot][copy.part] = Some(copy.step);
                full[copy.slot].complete_tx(copy.bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(stages: usize) -> Protocol {
        Protocol { stages, consumer_threads: 256, mutation: None }
    }

    /// The kernel's protocol at both ring depths, for K loops shorter than, equal to and longer
    /// than the ring, under many step orders.
    #[test]
    fn the_mbarrier_protocol_holds_under_every_drawn_order() {
        for stages in [4, 6] {
            for n_k in [1, 2, stages - 1, stages, stages + 1, 3 * stages + 2, 16] {
                for seed in 0..300 {
                    simulate(kernel(stages), n_k, seed)
                        .unwrap_or_else(|e| panic!("{stages} stages, {n_k} K steps, seed {seed}: {e}"));
                }
            }
        }
    }

    /// Each mistake breaks a rule in some drawn order (and names it).
    #[test]
    fn the_model_catches_broken_protocols() {
        for (mutation, want) in [
            (Mutation::EmptyParity, "stuck"),
            (Mutation::FullParity, "read slot"),
            (Mutation::ReleaseCurrent, "a wgmma"),
            (Mutation::ShortTransaction, "read slot"),
        ] {
            let p = Protocol { mutation: Some(mutation), ..kernel(4) };
            let errors: Vec<String> = (0..300).filter_map(|seed| simulate(p, 16, seed).err()).collect();
            assert!(errors.iter().any(|e| e.contains(want)), "{mutation:?}: {:?}", errors.first());
        }
    }
}
