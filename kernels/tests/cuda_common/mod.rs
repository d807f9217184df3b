//! Helpers for the CUDA tests: finding the GPU (or saying plainly why there is none), and a small
//! transformer forward written against the `Backend` trait alone, so the same model runs on the
//! CPU backend, the CUDA backend and its CPU twin.
#![allow(dead_code)]

use std::path::PathBuf;

use rand::Rng;
use sieve_kernels::cuda::{CudaBackend, CudaOptions, GemmEngine};
use sieve_kernels::{AttnSeq, Backend, BatchLayout, QkvLayout, RopeConfig, RopeLayout};

/// The asset cache (`$SIEVE_CACHE`, default `<repo>/.cache`).
pub fn asset_cache() -> PathBuf {
    std::env::var_os("SIEVE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"))
}

/// The CUDA backend on device 0, or `None` — after printing why — when this machine has no
/// CUDA driver or no device. A machine that has a GPU but cannot start the backend fails.
pub fn gpu(test: &str) -> Option<CudaBackend> {
    gpu_with(test, GemmEngine::Cublas)
}

/// [`gpu`] with a given engine for the dense projections.
pub fn gpu_with(test: &str, engine: GemmEngine) -> Option<CudaBackend> {
    match sieve_kernels::cuda::device_count() {
        Err(e) => {
            println!("{test}: NOT RUN on this machine (no GPU): {e}");
            None
        }
        Ok(0) => {
            println!("{test}: NOT RUN on this machine: the CUDA driver reports no device");
            None
        }
        Ok(_) => {
            let opts = CudaOptions { gemm: engine, ..CudaOptions::new(0).with_asset_cache(&asset_cache()) };
            let b = CudaBackend::with_options(&opts)
                .unwrap_or_else(|e| panic!("{test}: a GPU is present but the CUDA backend failed to start: {e}"));
            println!("{test}: running on {} ({:?})", b.name(), b.kernel_load_report());
            Some(b)
        }
    }
}

/// A tiny qwen3-style decoder: RMSNorm, fused QKV with per-head q/k norm and half-split RoPE,
/// GQA attention over paged K/V, SwiGLU MLP, residuals fused into the projections, final norm
/// and a folded score head on each sequence's last row.
pub struct MiniModel {
    pub hidden: usize,
    pub inter: usize,
    pub layout: QkvLayout,
    pub vocab: usize,
    pub layers: usize,
    pub embed: Vec<f32>,
    pub per_layer: Vec<MiniLayer>,
    pub final_norm: Vec<f32>,
    pub score: Vec<f32>,
}

pub struct MiniLayer {
    pub attn_norm: Vec<f32>,
    pub qkv: Vec<f32>,
    /// Odd layers only (Qwen2-style).
    pub qkv_bias: Option<Vec<f32>>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub o: Vec<f32>,
    pub mlp_norm: Vec<f32>,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

fn rand_vec(g: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| g.random_range(-1.0f32..1.0) * scale).collect()
}

impl MiniModel {
    pub fn random(g: &mut impl Rng, layers: usize) -> Self {
        let (hidden, inter, vocab) = (128, 192, 97);
        let layout = QkvLayout { n_heads: 4, n_kv_heads: 2, head_dim: 32 };
        let ws = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let per_layer = (0..layers)
            .map(|i| MiniLayer {
                attn_norm: (0..hidden).map(|_| 1.0 + g.random_range(-0.1..0.1)).collect(),
                qkv: rand_vec(g, layout.qkv_dim() * hidden, ws(hidden)),
                qkv_bias: (i % 2 == 1).then(|| rand_vec(g, layout.qkv_dim(), 0.1)),
                q_norm: (0..layout.head_dim).map(|_| 1.0 + g.random_range(-0.1..0.1)).collect(),
                k_norm: (0..layout.head_dim).map(|_| 1.0 + g.random_range(-0.1..0.1)).collect(),
                o: rand_vec(g, hidden * layout.q_dim(), ws(layout.q_dim())),
                mlp_norm: (0..hidden).map(|_| 1.0 + g.random_range(-0.1..0.1)).collect(),
                gate_up: rand_vec(g, 2 * inter * hidden, ws(hidden)),
                down: rand_vec(g, hidden * inter, ws(inter)),
            })
            .collect();
        MiniModel {
            hidden,
            inter,
            layout,
            vocab,
            layers,
            embed: rand_vec(g, vocab * hidden, 1.0),
            per_layer,
            final_norm: (0..hidden).map(|_| 1.0 + g.random_range(-0.1..0.1)).collect(),
            score: rand_vec(g, hidden, 0.2),
        }
    }

    /// Runs the model over `passes` (each a batch layout, run in order on one K/V cache, so a
    /// later pass can read an earlier pass's prefix) and returns each pass's per-sequence scores.
    pub fn scores<B: Backend>(&self, b: &B, passes: &[BatchLayout], num_slots: usize) -> Vec<Vec<f32>> {
        let l = self.layout;
        let rope = RopeConfig {
            theta: 1_000_000.0,
            rotary_dim: l.head_dim,
            layout: RopeLayout::HalfSplit,
            scaling: Default::default(),
        };
        let eps = 1e-6;
        let embed = b.embedding(&self.embed, self.vocab, self.hidden).unwrap();
        let weights: Vec<_> = self
            .per_layer
            .iter()
            .map(|w| {
                (
                    b.vector(&w.attn_norm).unwrap(),
                    b.linear_weight(&w.qkv, l.qkv_dim(), self.hidden).unwrap(),
                    w.qkv_bias.as_ref().map(|v| b.vector(v).unwrap()),
                    b.vector(&w.q_norm).unwrap(),
                    b.vector(&w.k_norm).unwrap(),
                    b.linear_weight(&w.o, self.hidden, l.q_dim()).unwrap(),
                    b.vector(&w.mlp_norm).unwrap(),
                    b.linear_weight(&w.gate_up, 2 * self.inter, self.hidden).unwrap(),
                    b.linear_weight(&w.down, self.hidden, self.inter).unwrap(),
                )
            })
            .collect();
        let final_norm = b.vector(&self.final_norm).unwrap();
        let score = b.vector(&self.score).unwrap();
        let mut cache = b.kv_cache(self.layers, num_slots, l.n_kv_heads, l.head_dim).unwrap();
        let mut all = Vec::new();
        for layout in passes {
            let rows = layout.num_rows();
            let batch = b.prepare_batch(layout, &cache).unwrap();
            let mut x = b.zeros(rows, self.hidden).unwrap();
            b.embed(&embed, &batch, &mut x).unwrap();
            // The projections' inputs are operands, as in the worker (bf16 on CUDA's fused engine).
            let mut h = b.zeros(0, 0).unwrap();
            b.reshape_operand(&mut h, rows, self.hidden).unwrap();
            let mut qkv = b.zeros(rows, l.qkv_dim()).unwrap();
            let mut attn = b.zeros(0, 0).unwrap();
            b.reshape_operand(&mut attn, rows, l.q_dim()).unwrap();
            let mut gu = b.zeros(0, 0).unwrap();
            let mut act = b.zeros(0, 0).unwrap();
            b.reshape_operand(&mut act, rows, self.inter).unwrap();
            for (layer, (an, wqkv, bqkv, qn, kn, wo, mn, wgu, wd)) in weights.iter().enumerate() {
                b.rms_norm(&x, an, eps, &mut h).unwrap();
                let norms = (Some(qn), Some(kn));
                b.matmul(&h, wqkv, bqkv.as_ref(), &mut qkv).unwrap();
                b.qk_norm_rope_write_kv(&mut qkv, l, norms.0, norms.1, eps, rope, &mut cache, layer, &batch).unwrap();
                b.attention(&qkv, l, &cache, layer, &batch, &mut attn).unwrap();
                b.matmul_add(&attn, wo, &mut x).unwrap();
                b.rms_norm(&x, mn, eps, &mut h).unwrap();
                b.matmul_silu_mul(&h, wgu, &mut gu, &mut act).unwrap();
                b.matmul_add(&act, wd, &mut x).unwrap();
            }
            let last: Vec<u32> = layout.seqs.iter().filter(|s| s.q_len > 0).map(|s| s.q_row + s.q_len - 1).collect();
            let mut xl = b.zeros(last.len(), self.hidden).unwrap();
            b.gather_rows(&x, &last, &mut xl).unwrap();
            let mut xn = b.zeros(last.len(), self.hidden).unwrap();
            b.rms_norm(&xl, &final_norm, eps, &mut xn).unwrap();
            all.push(b.dot_rows(&xn, &score).unwrap().into_iter().map(|z| 1.0 / (1.0 + (-z).exp())).collect());
        }
        all
    }
}

/// Two passes like the worker's: a shared prefix (41 tokens), then items over it — some longer
/// than a key tile, one not sharing the prefix — with their own token ids.
pub fn prefix_and_items(g: &mut impl Rng, vocab: usize) -> (Vec<BatchLayout>, usize) {
    let mut next_slot = 3u32;
    let mut pass = |seqs: &[(Vec<u32>, usize)], next_slot: &mut u32| {
        let mut b = BatchLayout::default();
        for (shared, n) in seqs {
            let q_row = b.token_ids.len() as u32;
            let slot_offset = b.key_slots.len() as u32;
            b.key_slots.extend_from_slice(shared);
            for i in 0..*n {
                b.token_ids.push(g.random_range(0..vocab as u32));
                b.positions.push((shared.len() + i) as u32);
                b.row_slots.push(*next_slot);
                b.key_slots.push(*next_slot);
                *next_slot += 1;
            }
            b.seqs.push(AttnSeq { q_row, q_len: *n as u32, ctx_len: (shared.len() + n) as u32, slot_offset });
        }
        b
    };
    // 150 prefix tokens: two whole key tiles of the tensor-core attention (its shared pass) and
    // a partial third; 30 of them: less than one.
    let prefix_pass = pass(&[(vec![], 150)], &mut next_slot);
    let prefix: Vec<u32> = prefix_pass.row_slots.clone();
    let items = pass(
        &[(prefix.clone(), 12), (prefix.clone(), 1), (prefix[..30].to_vec(), 50), (vec![], 9), (prefix.clone(), 33)],
        &mut next_slot,
    );
    (vec![prefix_pass, items], next_slot as usize + 5)
}

/// Sequence `i` of `layout` as a batch of its own (same tokens, positions and slots).
pub fn only_seq(layout: &BatchLayout, i: usize) -> BatchLayout {
    let s = layout.seqs[i];
    let rows = s.q_row as usize..(s.q_row + s.q_len) as usize;
    BatchLayout {
        token_ids: layout.token_ids[rows.clone()].to_vec(),
        positions: layout.positions[rows.clone()].to_vec(),
        row_slots: layout.row_slots[rows].to_vec(),
        seqs: vec![AttnSeq { q_row: 0, q_len: s.q_len, ctx_len: s.ctx_len, slot_offset: 0 }],
        key_slots: layout.key_slots[s.slot_offset as usize..(s.slot_offset + s.ctx_len) as usize].to_vec(),
    }
}

/// Index probes for a GEMM kernel, `gemm(x, w, m, n, k)` → out [m, n] (x [m, k], w [n, k]): one
/// side one-hot, the other small integers (exact in bf16), so that every output names the element
/// the tensor cores paired with it. Three probes over m rows, n columns and k (≤ 128, a few K
/// steps), each checking one index: which k of W met A's k (out[r][c] = r % k), which W row (c %
/// 256), which A row (r % 256). Returns a description of the first mismatches ("row r, column c:
/// read W's k 5, want 3"), empty when the kernel reads every operand where it should: on a GPU the
/// first thing to look at when a tile is wrong.
pub fn gemm_index_probes(
    gemm: impl Fn(&[f32], &[f32], usize, usize, usize) -> Vec<f32>,
    (m, n, k): (usize, usize, usize),
) -> Vec<String> {
    assert!(k <= 128 && m <= 1 << 16, "probe values must stay exact in bf16");
    let one_hot = |rows: usize, hot: &dyn Fn(usize) -> usize| -> Vec<f32> {
        (0..rows * k).map(|i| if i % k == hot(i / k) { 1.0 } else { 0.0 }).collect()
    };
    let filled = |rows: usize, v: &dyn Fn(usize, usize) -> usize| -> Vec<f32> {
        (0..rows * k).map(|i| v(i / k, i % k) as f32).collect()
    };
    type Want<'a> = &'a dyn Fn(usize, usize) -> usize;
    let probes: [(&str, Vec<f32>, Vec<f32>, Want); 3] = [
        ("W's k", one_hot(m, &|r| r % k), filled(n, &|_, kk| kk), &|r, _| r % k),
        ("W row", one_hot(m, &|r| r % k), filled(n, &|c, _| c % 256), &|_, c| c % 256),
        ("A row", filled(m, &|r, _| r % 256), one_hot(n, &|c| c % k), &|r, _| r % 256),
    ];
    let mut wrong = Vec::new();
    for (what, x, w, want) in probes {
        let out = gemm(&x, &w, m, n, k);
        for (i, &v) in out.iter().enumerate() {
            let (r, c) = (i / n, i % n);
            if v != want(r, c) as f32 && wrong.len() < 8 {
                wrong.push(format!("{m}x{n}x{k}, row {r}, column {c}: read {what} {v}, want {}", want(r, c)));
            }
        }
    }
    wrong
}
