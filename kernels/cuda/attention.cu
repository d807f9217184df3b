// Varlen causal prefill attention over the paged bf16 K/V pools (GQA), flash-attention style:
// key tiles staged in shared memory, an online softmax per query row, f32 accumulation.
//
// Inputs follow `AttnSeq` in kernels/src/backend.rs: sequence s has ctx_len logical positions;
// its query rows are the last q_len of them (batch rows q_row ..); the K/V of logical position p
// sits at slot key_slots[slot_offset + p]. A query at position qpos sees keys 0..=qpos.
//
// Launch: grid (num_q_tiles, n_heads), block ATT_THREADS, dynamic shared memory
//   ATT_BQ * head_dim floats (Q tile) + ATT_BK * (head_dim + 2) bf16 (K tile, padded rows) +
//   ATT_BK * head_dim bf16 (V tile).
// `q_tiles` is the host-built schedule: for each tile, (sequence index, first query index within
// the sequence); tiles cover each sequence's queries in steps of ATT_BQ.
// Warp w owns query rows w*4 .. w*4+3 of the tile. Per key tile of ATT_BK keys (aligned at
// position 0 of the sequence): lane j scores key j (a sequential fmaf dot over head_dim, then
// times `scale`); the tile max and the sum of exp are warp reductions; the output accumulator
// (lane l owns dims l, l+32, ...) is rescaled then accumulates p_j * v_j for j = 0.. in order.
// A row skips key tiles that start past its position, so its result does not depend on the
// other rows of its tile, on the tiling of the batch, or on where its keys live in the pools.
// Requires head_dim even and ≤ ATT_MAX_HD, all checked on the host.
#include "common.cuh"

#define ATT_BQ 16
#define ATT_BK 32
#define ATT_THREADS 128
#define ATT_ROWS_PER_WARP 4
#define ATT_MAX_HD 256
#define ATT_MAX_T (ATT_MAX_HD / 32)

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attention_prefill(const float* __restrict__ qkv, const bf16_t* __restrict__ k_pool, const bf16_t* __restrict__ v_pool,
                  const u32* __restrict__ seqs, const u32* __restrict__ key_slots, const u32* __restrict__ q_tiles,
                  float* __restrict__ out, int qkv_cols, int n_heads, int n_kv_heads, int head_dim, float scale) {
    extern __shared__ float att_smem[];
    const int hd = head_dim, hd2 = head_dim / 2;
    float* q_s = att_smem;                                  // [ATT_BQ][hd]
    u32* k_s = (u32*)(att_smem + ATT_BQ * hd);              // [ATT_BK][hd2 + 1] bf16 pairs
    u32* v_s = k_s + ATT_BK * (hd2 + 1);                    // [ATT_BK][hd2]

    const int tile = blockIdx.x, h = blockIdx.y;
    const u32 seq = q_tiles[2 * tile], q_start = q_tiles[2 * tile + 1];
    const u32 q_row = seqs[4 * seq], q_len = seqs[4 * seq + 1], ctx_len = seqs[4 * seq + 2], slot_offset = seqs[4 * seq + 3];
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * hd;
    const u32 first_pos = ctx_len - q_len;  // position of query 0
    const u32 rows_here = min((u32)ATT_BQ, q_len - q_start);
    const u32 last_pos = first_pos + q_start + rows_here - 1;
    const u32 n_key_tiles = (last_pos + ATT_BK) / ATT_BK;

    for (int i = threadIdx.x; i < ATT_BQ * hd; i += ATT_THREADS) {
        const u32 r = i / hd, d = i % hd;
        q_s[i] = r < rows_here ? qkv[(long long)(q_row + q_start + r) * qkv_cols + h * hd + d] : 0.0f;
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m[ATT_ROWS_PER_WARP], l[ATT_ROWS_PER_WARP], o[ATT_ROWS_PER_WARP][ATT_MAX_T];
#pragma unroll
    for (int r = 0; r < ATT_ROWS_PER_WARP; ++r) {
        m[r] = neg_inf();
        l[r] = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_MAX_T; ++t) o[r][t] = 0.0f;
    }

    for (u32 kt = 0; kt < n_key_tiles; ++kt) {
        const u32 key0 = kt * ATT_BK;
        __syncthreads();  // the previous tile is fully consumed (and, first time, q_s is written)
        for (int i = threadIdx.x; i < ATT_BK * hd2; i += ATT_THREADS) {
            const u32 j = i / hd2, d2 = i % hd2, p = key0 + j;
            u32 kw = 0, vw = 0;
            if (p <= last_pos) {
                const long long off = (long long)key_slots[slot_offset + p] * kv_dim + kvh * hd;
                kw = ((const u32*)(k_pool + off))[d2];
                vw = ((const u32*)(v_pool + off))[d2];
            }
            k_s[j * (hd2 + 1) + d2] = kw;
            v_s[j * hd2 + d2] = vw;
        }
        __syncthreads();

#pragma unroll
        for (int r = 0; r < ATT_ROWS_PER_WARP; ++r) {
            const u32 qi = warp * ATT_ROWS_PER_WARP + r;
            const u32 qpos = first_pos + q_start + qi;
            if (qi >= rows_here || key0 > qpos) continue;  // warp-uniform
            const float* q = q_s + qi * hd;
            const u32 p = key0 + lane;
            float s = neg_inf();
            if (p <= qpos) {
                const u32* kr = k_s + lane * (hd2 + 1);
                float dot = 0.0f;
                for (int d2 = 0; d2 < hd2; ++d2) {
                    const u32 w = kr[d2];
                    dot = fmaf(q[2 * d2], bf16x2_lo(w), dot);
                    dot = fmaf(q[2 * d2 + 1], bf16x2_hi(w), dot);
                }
                s = dot * scale;
            }
            const float m_new = fmaxf(m[r], warp_max(s));
            const float pj = p <= qpos ? expf(s - m_new) : 0.0f;
            const float alpha = expf(m[r] - m_new);
            l[r] = l[r] * alpha + warp_sum(pj);
            m[r] = m_new;
#pragma unroll
            for (int t = 0; t < ATT_MAX_T; ++t) o[r][t] *= alpha;
            const u32 n_keys = min((u32)ATT_BK, qpos - key0 + 1);
            for (u32 j = 0; j < n_keys; ++j) {
                const float pb = __shfl_sync(FULL_MASK, pj, j);
                const bf16_t* vr = (const bf16_t*)(v_s + j * hd2);
#pragma unroll
                for (int t = 0; t < ATT_MAX_T; ++t) {
                    const int d = lane + 32 * t;
                    if (d < hd) o[r][t] = fmaf(pb, bf16_to_f32(vr[d]), o[r][t]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ATT_ROWS_PER_WARP; ++r) {
        const u32 qi = warp * ATT_ROWS_PER_WARP + r;
        if (qi >= rows_here) continue;
        float* dst = out + (long long)(q_row + q_start + qi) * (n_heads * hd) + h * hd;
        const float inv_l = 1.0f / l[r];
#pragma unroll
        for (int t = 0; t < ATT_MAX_T; ++t) {
            const int d = lane + 32 * t;
            if (d < hd) dst[d] = o[r][t] * inv_l;
        }
    }
}
