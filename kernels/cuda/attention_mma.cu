// Tensor-core prefill attention over the paged bf16 K/V pools (GQA, causal), FlashAttention-2
// style: S = Q·Kᵀ and O += P·V on mma.sync.m16n8k16 (bf16 operands, f32 accumulation; K and V
// fragments by ldmatrix.x4), an online softmax in base 2, K/V tiles staged by a 2-stage cp.async
// pipeline.
//
// Why two passes: a call's items share the query prefix. The "shared" pass attends a prefix's
// whole key tiles once for query tiles packed from many items' rows (gathered through `rows`), so
// each prefix K/V tile is read once per 64 query rows of the call, not once per item; it leaves
// each row's running state (m, l, unnormalised o). The "own" pass then takes each sequence's
// rows, loads that state and continues over the remaining key tiles (the prefix's partial last
// tile and the item's own keys, causally), and normalises. The state's round trip costs more
// than packing saves for items of a tile or more, so the host sends a sequence through the shared
// pass only where it pays (layout.rs, `sharing_pays`); the others attend the prefix in their own
// units.
//
// Determinism: every row reduces over the key tiles of its sequence in position order, tiles
// aligned at position 0, with the same per-tile update whichever pass runs it; the state passes
// between the two as exact f32. So a row's bits do not depend on which pass saw which tile, on
// the rows it shares a tile with (an mma output element depends only on its own row of A), on
// the batch, or on whether its prefix was shared at all — the schedule (kernels/src/cuda/layout.rs)
// may group sequences however it likes.
//
// Unit = 6 words: sequence (its key slots, q_row, ctx_len), first index into `rows`, row count
// (≤ AMMA_BQ), first and end key tile, flags. Launch: grid (units, n_heads), block AMMA_THREADS,
// dynamic shared memory 4 * AMMA_BK * (HD + AMMA_PAD) bf16 (two stages of K and V; the query tile
// is staged in one). Warp w owns the tile's query rows 16w .. 16w + 15. Requires HD % 16 == 0
// and kv_dim % 8 == 0 (16-byte cp.async rows).
// Output: f32 rows in `out`; or, given `out_bf16`, the own pass stores bf16 rows there (two to a
// word: the O projection's operand, rounded once as its cast would) and `out` holds only the
// shared passes' f32 state.
#include "mma_tile.cuh"

#define AMMA_BQ 64
#define AMMA_BK 64
#define AMMA_THREADS 128
#define AMMA_PAD 8
// Three blocks an SM on Hopper (registers <= 170 a thread; its shared memory holds three), two on
// Ampere (whose shared memory holds two).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AMMA_MIN_BLOCKS 3
#else
#define AMMA_MIN_BLOCKS 2
#endif

#define AMMA_LOAD_STATE 1    // start from the state the shared pass left
#define AMMA_STORE_STATE 2   // leave the state (m, l in `ml`, unnormalised o in `out`, always f32)
#define AMMA_CAUSAL 4        // mask keys past each row's position (the shared pass never needs to)

// Four 8x8 bf16 matrices, transposed: lane t receives, of matrix i, the elements at (row 2(t%4),
// col t/4) and (row 2(t%4)+1, col t/4); lanes 8i .. 8i+7 supply matrix i's row addresses.
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const void* smem) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

template <int HD>
__device__ __forceinline__ void attention_mma(const float* __restrict__ qkv, const bf16_t* __restrict__ k_pool,
                                              const bf16_t* __restrict__ v_pool, const u32* __restrict__ seqs,
                                              const u32* __restrict__ key_slots, const u32* __restrict__ rows,
                                              const u32* __restrict__ units, float* __restrict__ out,
                                              float* __restrict__ ml, u32* __restrict__ out_bf16, int qkv_cols,
                                              int n_heads, int n_kv_heads, float scale_log2) {
    constexpr int LD = HD + AMMA_PAD;  // 16-byte aligned rows, conflict-free fragment loads
    constexpr int KSTEPS = HD / 16, NT = AMMA_BK / 8, DT = HD / 8, CHUNKS = HD / 8;
    static_assert(AMMA_BQ <= AMMA_BK, "the query tile is staged in a K stage");
    extern __shared__ __align__(16) bf16_t amma_smem[];
    bf16_t* k_s = amma_smem;                  // [2][AMMA_BK][LD]
    bf16_t* v_s = k_s + 2 * AMMA_BK * LD;     // [2][AMMA_BK][LD]
    // The query tile [AMMA_BQ][LD] passes through K's second stage on its way to registers, so
    // that three blocks fit a Hopper SM's shared memory (four tiles of 17 KB each at HD 128).
    bf16_t* q_s = k_s + AMMA_BK * LD;

    const u32* unit = units + 6 * blockIdx.x;
    const u32 seq = unit[0], rows_begin = unit[1], n_rows = unit[2], kt_begin = unit[3], kt_end = unit[4],
              flags = unit[5];
    const u32 q_row = seqs[4 * seq], q_len = seqs[4 * seq + 1], ctx_len = seqs[4 * seq + 2],
              slot_offset = seqs[4 * seq + 3];
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * HD, q_dim = n_heads * HD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tg = lane & 3;

    auto load_kv = [&](int stage, u32 kt) {
        for (int id = tid; id < AMMA_BK * CHUNKS; id += AMMA_THREADS) {
            const int j = id / CHUNKS, c = (id % CHUNKS) * 8;
            const u32 p = kt * AMMA_BK + j;
            const bool ok = p < ctx_len;
            const long long off = ok ? (long long)key_slots[slot_offset + p] * kv_dim + kvh * HD + c : 0;
            cp_async16(&k_s[(stage * AMMA_BK + j) * LD + c], k_pool + off, ok);
            cp_async16(&v_s[(stage * AMMA_BK + j) * LD + c], v_pool + off, ok);
        }
        cp_async_commit();
    };
    load_kv(0, kt_begin);

    // The tile's query rows, as bf16 (rows past n_rows are zero).
    for (int i = tid; i < AMMA_BQ * (HD / 2); i += AMMA_THREADS) {
        const int r = i / (HD / 2), d = (i % (HD / 2)) * 2;
        float2 q = make_float2(0.0f, 0.0f);
        if (r < (int)n_rows) q = *(const float2*)&qkv[(long long)rows[rows_begin + r] * qkv_cols + h * HD + d];
        *(u32*)&q_s[r * LD + d] = pack_bf16x2(q.x, q.y);
    }
    __syncthreads();
    const int r_lo = warp * 16 + g, r_hi = r_lo + 8;  // the two rows this lane's fragments hold
    // This lane's ldmatrix row in a K tile: lanes 8i .. 8i+7 address matrix i (key half i / 2,
    // dim half i % 2).
    const int k_row_off = (((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
    const bool warp_live = warp * 16 < (int)n_rows;
    u32 qf[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
        const int c = ks * 16 + tg * 2;
        qf[ks][0] = *(const u32*)&q_s[r_lo * LD + c];
        qf[ks][1] = *(const u32*)&q_s[r_hi * LD + c];
        qf[ks][2] = *(const u32*)&q_s[r_lo * LD + c + 8];
        qf[ks][3] = *(const u32*)&q_s[r_hi * LD + c + 8];
    }
    __syncthreads();  // every warp holds its query fragments before K's second stage is loaded
    // Causal limit of each row: its logical position (rows past n_rows see everything; unused).
    const u32 first_pos = ctx_len - q_len;
    u32 qpos[2];
    const int rr[2] = {r_lo, r_hi};
#pragma unroll
    for (int x = 0; x < 2; ++x)
        qpos[x] = (flags & AMMA_CAUSAL) && rr[x] < (int)n_rows ? first_pos + rows[rows_begin + rr[x]] - q_row : 0xffffffffu;

    float m[2], l[2], o[DT][4];
    if (flags & AMMA_LOAD_STATE) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const bool ok = rr[x] < (int)n_rows;
            const long long row = ok ? rows[rows_begin + rr[x]] : 0;
            m[x] = ok ? ml[(row * n_heads + h) * 2] : neg_inf();
            l[x] = ok ? ml[(row * n_heads + h) * 2 + 1] : 0.0f;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const float2 v = ok ? *(const float2*)&out[row * q_dim + h * HD + dt * 8 + tg * 2] : make_float2(0.0f, 0.0f);
                o[dt][2 * x] = v.x;
                o[dt][2 * x + 1] = v.y;
            }
        }
    } else {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            m[x] = neg_inf();
            l[x] = 0.0f;
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int q = 0; q < 4; ++q) o[dt][q] = 0.0f;
    }

    for (u32 kt = kt_begin; kt < kt_end; ++kt) {
        const int stage = (kt - kt_begin) & 1;
        if (kt + 1 < kt_end) {
            load_kv(stage ^ 1, kt + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (warp_live) {  // warp-uniform: a warp with no query rows only helps load
            const bf16_t* kt_s = k_s + stage * AMMA_BK * LD;
            const bf16_t* vt_s = v_s + stage * AMMA_BK * LD;
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int q = 0; q < 4; ++q) s[nt][q] = 0.0f;
            // K's B fragments by ldmatrix.x4 (no .trans: a key row is k-contiguous), two score
            // tiles a load: matrices (keys 16p..16p+7 | 16p+8..16p+15) x (dims 16ks.. | 16ks+8..).
            const u32 k_lane = (u32)__cvta_generic_to_shared(kt_s + k_row_off);
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    u32 b[4];
                    ldmatrix_x4(b, k_lane + 2 * (np * 16 * LD + ks * 16));
                    mma_bf16_16816(s[2 * np], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[0], b[1]);
                    mma_bf16_16816(s[2 * np + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[2], b[3]);
                }
            // Scores in base 2, masked; the row max and sum over the quad's lanes (xor 1, then 2).
            float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const u32 key = kt * AMMA_BK + nt * 8 + tg * 2 + (q & 1);
                    s[nt][q] = key > qpos[q >> 1] ? neg_inf() : s[nt][q] * scale_log2;
                    mx[q >> 1] = fmaxf(mx[q >> 1], s[nt][q]);
                }
            float alpha[2], base[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                mx[x] = fmaxf(mx[x], __shfl_xor_sync(FULL_MASK, mx[x], 1));
                mx[x] = fmaxf(mx[x], __shfl_xor_sync(FULL_MASK, mx[x], 2));
                const float m_new = fmaxf(m[x], mx[x]);
                base[x] = m_new == neg_inf() ? 0.0f : m_new;
                alpha[x] = exp2f(m[x] - base[x]);
                m[x] = m_new;
            }
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    s[nt][q] = exp2f(s[nt][q] - base[q >> 1]);
                    sum[q >> 1] += s[nt][q];
                }
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                sum[x] += __shfl_xor_sync(FULL_MASK, sum[x], 1);
                sum[x] += __shfl_xor_sync(FULL_MASK, sum[x], 2);
                l[x] = l[x] * alpha[x] + sum[x];
            }
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
#pragma unroll
                for (int q = 0; q < 4; ++q) o[dt][q] *= alpha[q >> 1];
            // O += P·V: P's accumulator layout is the A fragment of the next mma (keys 16j .. 16j+15
            // are score tiles 2j and 2j+1); V's B fragments come transposed by ldmatrix.
#pragma unroll
            for (int j = 0; j < AMMA_BK / 16; ++j) {
                const u32 a0 = pack_bf16x2(s[2 * j][0], s[2 * j][1]), a1 = pack_bf16x2(s[2 * j][2], s[2 * j][3]);
                const u32 a2 = pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]),
                          a3 = pack_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4_trans(b0, b1, b2, b3, vt_s + (j * 16 + (lane & 15)) * LD + dp * 16 + (lane >> 4) * 8);
                    mma_bf16_16816(o[2 * dp], a0, a1, a2, a3, b0, b1);
                    mma_bf16_16816(o[2 * dp + 1], a0, a1, a2, a3, b2, b3);
                }
            }
        }
        __syncthreads();  // this stage is overwritten by the load issued next iteration
    }

#pragma unroll
    for (int x = 0; x < 2; ++x) {
        if (rr[x] >= (int)n_rows) continue;
        const long long row = rows[rows_begin + rr[x]];
        const long long at = row * q_dim + h * HD + tg * 2;
        const bool store_state = flags & AMMA_STORE_STATE;
        const float inv_l = store_state ? 1.0f : 1.0f / l[x];
        if (out_bf16 && !store_state) {
            // The O projection's operand: the f32 value rounded once, as its cast would.
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                out_bf16[(at + dt * 8) / 2] = pack_bf16x2(o[dt][2 * x] * inv_l, o[dt][2 * x + 1] * inv_l);
        } else {
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(float2*)&out[at + dt * 8] = make_float2(o[dt][2 * x] * inv_l, o[dt][2 * x + 1] * inv_l);
        }
        if (store_state && tg == 0) {
            ml[(row * n_heads + h) * 2] = m[x];
            ml[(row * n_heads + h) * 2 + 1] = l[x];
        }
    }
}

// The entry points, one per supported head size (the fragments are unrolled over HD).
extern "C" __global__ void __launch_bounds__(AMMA_THREADS, AMMA_MIN_BLOCKS)
attention_mma_hd64(const float* __restrict__ qkv, const bf16_t* __restrict__ k_pool, const bf16_t* __restrict__ v_pool,
                   const u32* __restrict__ seqs, const u32* __restrict__ key_slots, const u32* __restrict__ rows,
                   const u32* __restrict__ units, float* __restrict__ out, float* __restrict__ ml,
                   u32* __restrict__ out_bf16, int qkv_cols, int n_heads, int n_kv_heads, float scale_log2) {
    attention_mma<64>(qkv, k_pool, v_pool, seqs, key_slots, rows, units, out, ml, out_bf16, qkv_cols, n_heads,
                       n_kv_heads, scale_log2);
}

extern "C" __global__ void __launch_bounds__(AMMA_THREADS, AMMA_MIN_BLOCKS)
attention_mma_hd128(const float* __restrict__ qkv, const bf16_t* __restrict__ k_pool, const bf16_t* __restrict__ v_pool,
                    const u32* __restrict__ seqs, const u32* __restrict__ key_slots, const u32* __restrict__ rows,
                    const u32* __restrict__ units, float* __restrict__ out, float* __restrict__ ml,
                    u32* __restrict__ out_bf16, int qkv_cols, int n_heads, int n_kv_heads, float scale_log2) {
    attention_mma<128>(qkv, k_pool, v_pool, seqs, key_slots, rows, units, out, ml, out_bf16, qkv_cols, n_heads,
                       n_kv_heads, scale_log2);
}
