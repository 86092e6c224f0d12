// Gated delta rule, chunked: the recurrence of gated_delta_rule_recurrent (delta.cu),
//   S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀ q,
// computed 64 tokens at a time with the WY representation, as the CPU reference's `chunked`
// (kernels/src/cpu/delta.rs). Per chunk, with γ the cumulative log-decay inside the chunk and S0
// the state at its start:
//   A   = strictly-lower(β_i (k_i·k_j) e^{γ_i−γ_j}),   T = (I + A)⁻¹
//   W   = T (β e^γ K),   U = T (β V),   V' = U − W S0
//   O_i = e^{γ_i} q_i S0 + Σ_{j≤i} P_ij V'_j,   P_ij = (q_i·k_j) e^{γ_i−γ_j}
//   S   ← e^{γ_last} S0 + Σ_j e^{γ_last−γ_j} k_j V'_jᵀ
// Only differences γ_i − γ_j with i ≥ j are exponentiated, so nothing overflows however strong the
// decay.
//
// Two kernels, because only the last three lines depend on the state:
//  1. gdr_prepare (or gdr_prepare_conv, which reads the in-projection and does the conv, the q/k
//     L2 norms and the gates first): one block per (chunk, value head), all chunks of the batch at
//     once. Computes γ, A, P, T, W, U (the products on TF32 tensor cores, the triangular inverse in
//     f32) and the pre-scaled e^γ·scale·q and e^{γ_last−γ}·k, and writes them to scratch laid out
//     like the tokens ([rows][v_heads][..]), so the second kernel finds a chunk's data at its rows.
//  2. gdr_state_pass: one block per (sequence, value head, slice of SV value columns) walks its
//     sequence's chunks in order. Per chunk it only does the four state products (V' = U − W S0,
//     e^γ q S0 + P V', and the state update), on bf16 tensor cores (mma.sync m16n8k16) with f32
//     accumulation; the state stays f32 in registers, its bf16 copy in shared memory feeds the
//     products (the precision of flash-linear-attention's kernels). The next chunk's tiles stream in
//     with cp.async while the current one computes.
//
// Key and value heads up to 128 wide; narrower ones are zero-padded to 128 (the padding stays
// exactly zero in every product). A partial last chunk is zero-padded the same way: β = 0 and
// k = q = v = 0 make its padded rows of A, W, U, V' and P vanish, and the second kernel loads its
// rows past the sequence as zeros.

#define DC_CHUNK 64
#define DC_DK 128
#define DC_THREADS 512
// f32 row strides of the [64][128] q / k / v tiles and of the [64][64] A and T tiles: 132 ≡ 68 ≡ 4
// (mod 32), so the 8 rows × 4 columns a TF32 fragment load touches fall in 32 distinct banks.
#define DC_LD 132
#define DC_AP 68
// Phase marks of gdr_prepare_body for tools/reference/gdr_prepare_harness.cu (which defines
// DC_MARK before including this file); nothing in the served build.
#ifndef DC_MARK
#define DC_MARK(i)
#endif

extern __shared__ float4 dc_smem[];

// ---- TF32 tensor-core helpers (mma.sync m16n8k8, f32 accumulation). Fragments, with
// g = lane / 4 and t = lane % 4: A (16×8) a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4);
// B (8×8) b0 (t, g), b1 (t+4, g); C (16×8) c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).

__device__ __forceinline__ u32 dc_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void dc_mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of rows m0.., columns k0.. of a row-major tile with row stride ld.
__device__ __forceinline__ void dc_frag_a(u32 (&a)[4], const float* x, int ld, int m0, int k0) {
    const int g = (threadIdx.x & 31) >> 2;
    const int t = threadIdx.x & 3;
    a[0] = dc_tf32(x[(m0 + g) * ld + k0 + t]);
    a[1] = dc_tf32(x[(m0 + g + 8) * ld + k0 + t]);
    a[2] = dc_tf32(x[(m0 + g) * ld + k0 + t + 4]);
    a[3] = dc_tf32(x[(m0 + g + 8) * ld + k0 + t + 4]);
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: the per-chunk quantities, on TF32 tensor cores where they are products (KKᵀ, QKᵀ,
// T K, T V) and in f32 SIMT where they are the triangular inverse.
//
// Scratch outputs, row r of the batch, value head h (H = v_heads):
//   w_out [r][H][128] bf16   W          u_out [r][H][128] f32    U
//   q_out [r][H][128] bf16   e^γ·scale·q k_out [r][H][128] bf16  e^{γ_last−γ}·k
//   p_out [r][H][64]  bf16   row of P (zero above the diagonal)
//   gam_out [r][H]    f32    γ
// Grid (ceil(rows / 64) + num_seqs chunk slots, v_heads), 512 threads (16 warps: one block's
// latency is what a short prompt waits for, so the work is spread thin); slots past the
// batch's chunks return at once. Dynamic shared memory: PREPARE_SMEM in delta_chunked.rs.
//
// T = (I + A)⁻¹ by 16×16 blocks: the four diagonal blocks by forward substitution, then the block
// diagonals below them one after the other, T_rs = −T_rr Σ_{s≤q<r} A_rq T_qs.

// Where gdr_prepare reads its tokens. The plain form (gdr_prepare) reads the conv output (f32
// [rows][q|k|v], q and k already L2-normalised) and the gates β and g ([rows][v_heads]). The
// projection form (gdr_prepare_conv) reads the stacked in-projection itself (bf16; its q|k|v block
// at x_stride · row + x_offset, b and a as the gates' helper reads them) and computes the causal
// conv (DC_KW taps; before a sequence's first row, the carried window where has_window: f32
// [seqs][DC_KW − 1][q|k|v], oldest row first, values of an earlier bf16 projection) + SiLU, the
// q and k L2 norms and the gates on the way in, with the helpers and summation orders of the conv
// kernel (conv.cu): the same bits as the plain form after conv1d_silu_l2_gates, without the conv
// output's round trip through memory.
struct GdrSource {
    const float* qkv;
    const float* beta;
    const float* g;
    const __nv_bfloat16* x;
    int x_stride;
    int x_offset;
    const __nv_bfloat16* conv_w;  // [q|k|v channels][DC_KW]
    const __nv_bfloat16* gb;
    int gb_stride;
    int gb_offset;
    const __nv_bfloat16* ga;
    int ga_stride;
    int ga_offset;
    const __nv_bfloat16* a_log;
    const __nv_bfloat16* dt_bias;
    float l2_eps;
    const float* window_in;
    int has_window;
};

#define DC_KW 4  // conv taps of the projection form

// Two columns (c, c + 1; c even, the row layout even) of a bf16 row, as a packed pair.
__device__ __forceinline__ u32 dc_pair_bits(const __nv_bfloat16* p) { return *reinterpret_cast<const u32*>(p); }

// Conv + SiLU of two adjacent channels (taps t[0], t[1]) at PER consecutive rows from the packed
// input window w (rows r − DC_KW + 1 .. r + PER − 1; zeros before the sequence), as conv_rows sums:
// over the taps in order from zero, the oldest input first, then silu_fast. Rows at or past n give
// zeros.
template <int PER>
__device__ __forceinline__ void dc_conv_rows(const u32 (&w)[PER + DC_KW - 1], const float (&t)[2][DC_KW], int r,
                                             int n, float2 (&out)[PER]) {
#pragma unroll
    for (int m = 0; m < PER; ++m) {
        float ax = 0.0f, ay = 0.0f;
#pragma unroll
        for (int i = 0; i < DC_KW; ++i) {
            const float2 in = unpack_bf16x2(w[m + i]);
            ax += t[0][i] * in.x;
            ay += t[1][i] * in.y;
        }
        out[m] = r + m < n ? make_float2(silu_fast(ax), silu_fast(ay)) : make_float2(0.0f, 0.0f);
    }
}

template <bool CONV>
__device__ __forceinline__ void gdr_prepare_body(const GdrSource& src, const u32* __restrict__ cu_seqlens,
                                                 int num_seqs, int k_heads, int v_heads, int k_dim, int v_dim,
                                                 float scale, u32 rows_cap, __nv_bfloat16* __restrict__ w_out,
                                                 float* __restrict__ u_out, __nv_bfloat16* __restrict__ q_out,
                                                 __nv_bfloat16* __restrict__ k_out, __nv_bfloat16* __restrict__ p_out,
                                                 float* __restrict__ gam_out) {
    constexpr int CH = DC_CHUNK;
    constexpr int DK = DC_DK;
    constexpr int PER_THREAD = CH / (DC_THREADS / (DK / 2));  // rows per thread in the elementwise passes
    float* const Ks = reinterpret_cast<float*>(dc_smem);  // [CH][DC_LD]: k, then β e^γ k
    float* const Qs = Ks + CH * DC_LD;                    // [CH][DC_LD]: scaled q, then β v
    float* const As = Qs + CH * DC_LD;                    // [CH][DC_AP]: A (strictly lower)
    float* const Ts = As + CH * DC_AP;                    // [CH][DC_AP]: T (lower)
    float* const Ms = Ts + CH * DC_AP;                    // [3][16][16]: block sums of one level
    float* const graw = Ms + 3 * 256;                     // [CH]: g
    float* const gam = graw + CH;                         // [CH]: γ, cumulative g in the chunk
    float* const bet = gam + CH;                          // [CH]: β
    float* const egam = bet + CH;                         // [CH]: e^{γ_i}
    float* const edec = egam + CH;                        // [CH]: e^{γ_last − γ_j}

    int tile = 0;
    u32 seq_start = 0;
    int len = 0;
    int seq = 0;
    if (!find_tile_warp<CH>(cu_seqlens, num_seqs, rows_cap, blockIdx.x, tile, seq_start, len, &seq)) return;
    DC_MARK(0);
    const u32 c0 = seq_start + (u32)tile * CH;
    const int n = min(CH, len - tile * CH);

    const int h = blockIdx.y;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int fg = lane >> 2;  // fragment row group
    const int ft = lane & 3;   // fragment thread in group
    const int kh = h / (v_heads / k_heads);
    const i64 width = 2 * (i64)k_heads * k_dim + (i64)v_heads * v_dim;
    const i64 q_at = (i64)kh * k_dim;
    const i64 k_at = (i64)k_heads * k_dim + (i64)kh * k_dim;
    const i64 v_at = 2 * (i64)k_heads * k_dim + (i64)h * v_dim;
    // Thread tid owns columns ec, ec + 1 (ec = 2 (tid % 64)) of rows er0 .. er0 + PER_THREAD − 1
    // (er0 = PER_THREAD (tid / 64)) in every elementwise pass: consecutive rows, so the projection
    // form's conv slides one input window over them.
    const int ec = 2 * (tid % (DK / 2));
    const int er0 = PER_THREAD * (tid / (DK / 2));
    constexpr int WIN = PER_THREAD + DC_KW - 1;  // conv inputs of the thread's rows
    const int first = tile * CH;                 // sequence position of the chunk's row 0
    // The packed input window of channels c, c + 1 (the projection form): before the sequence
    // the carried window (its values are bf16, so packing them again is exact) or zeros; zeros
    // past n and past the heads. Only the first DC_KW − 1 rows can lie before the chunk (and so
    // perhaps before the sequence); the others are the chunk's rows er0.., read through one pointer
    // stepped by the row stride (the full address arithmetic per row was a third of the kernel's
    // instructions).
    const __nv_bfloat16* const x_chunk = src.x + (i64)c0 * src.x_stride + src.x_offset;  // row 0
    const bool all_rows_in_x = er0 > 0 || first > 0;  // no row of the window before the sequence
    auto load_window = [&](u32 (&w)[WIN], i64 c, bool in_head) {
        const __nv_bfloat16* p = x_chunk + (i64)(er0 - (DC_KW - 1)) * src.x_stride + c;
#pragma unroll
        for (int j = 0; j < WIN; ++j, p += src.x_stride) {
            const int i = er0 - (DC_KW - 1) + j;
            u32 bits = 0u;
            if (in_head && i < n) {
                if (j >= DC_KW - 1 || all_rows_in_x || first + i >= 0) {
                    bits = dc_pair_bits(p);
                } else if (src.has_window) {
                    const float* at = src.window_in + ((i64)seq * (DC_KW - 1) + (DC_KW - 1) + first + i) * width + c;
                    bits = pack_bf16x2(at[0], at[1]);
                }
            }
            w[j] = bits;
        }
    };
    static_assert(DC_KW == 4, "a channel's taps load as one 8-byte vector");
    auto load_taps = [&](float (&t)[2][DC_KW], i64 c, bool in_head) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float4 w4 = in_head ? load4(src.conv_w + (c + e) * DC_KW) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            t[e][0] = w4.x;
            t[e][1] = w4.y;
            t[e][2] = w4.z;
            t[e][3] = w4.w;
        }
    };

    // ---- 1. Stage q (scaled) and k; g, β. All loads are issued before any store, so their
    // latencies overlap. Zeros past n and past the heads. v is loaded later (`load_v`). Pairs load
    // as float2 when the row layout keeps them 8-byte aligned (even widths). The projection form
    // stages conv + SiLU and L2-normalises (and scales q) in shared memory afterwards.
    const bool pairs = ((width | k_dim | v_dim) & 1) == 0;
    if (CONV) {
        const bool in_head = ec < k_dim;  // k_dim is even here: ec + 1 < k_dim too
        u32 wq[WIN], wk[WIN];
        load_window(wq, q_at + ec, in_head);
        load_window(wk, k_at + ec, in_head);
        float tq[2][DC_KW], tk[2][DC_KW];
        load_taps(tq, q_at + ec, in_head);
        load_taps(tk, k_at + ec, in_head);
        // The gates (warps 0 and 1) before the conv, so their loads wait beside the windows'.
        if (tid < CH) {
            float2 bg = make_float2(0.0f, 0.0f);
            if (tid < n)
                bg = delta_gate_pair(src.gb, src.gb_stride, src.gb_offset, src.ga, src.ga_stride, src.ga_offset,
                                     src.a_log, src.dt_bias, (i64)c0 + tid, h);
            bet[tid] = bg.x;
            graw[tid] = bg.y;
        }
        float2 qv[PER_THREAD], kv[PER_THREAD];
        dc_conv_rows<PER_THREAD>(wq, tq, er0, n, qv);
        dc_conv_rows<PER_THREAD>(wk, tk, er0, n, kv);
#pragma unroll
        for (int m = 0; m < PER_THREAD; ++m) {
            *reinterpret_cast<float2*>(Qs + (er0 + m) * DC_LD + ec) = qv[m];
            *reinterpret_cast<float2*>(Ks + (er0 + m) * DC_LD + ec) = kv[m];
        }
        __syncthreads();
        // Each row's q and k head L2-normalised (q then scaled) by one warp, lane holding columns
        // lane + 32e as the conv kernel's L2 pass does, so the sums and the bits are its.
        for (int r = warp; r < 2 * CH; r += DC_THREADS / 32) {
            const int i = r % CH;
            if (i >= n) continue;
            const bool is_q = r < CH;
            float* row = (is_q ? Qs : Ks) + i * DC_LD;
            float v[DK / 32];
#pragma unroll
            for (int e = 0; e < DK / 32; ++e) v[e] = row[lane + 32 * e];
            const float inv = l2_inv_held<DK / 32>(v, lane, k_dim, src.l2_eps);
#pragma unroll
            for (int e = 0; e < DK / 32; ++e) row[lane + 32 * e] = is_q ? (v[e] * inv) * scale : v[e] * inv;
        }
    } else {
        float2 qv[PER_THREAD], kv[PER_THREAD];
#pragma unroll
        for (int m = 0; m < PER_THREAD; ++m) {
            const int i = er0 + m;
            const float* row = src.qkv + (i64)(c0 + min(i, n - 1)) * width;
            const bool ok = i < n;
            if (pairs) {
                const bool in = ok && ec < k_dim;
                qv[m] = in ? *reinterpret_cast<const float2*>(row + q_at + ec) : make_float2(0.0f, 0.0f);
                kv[m] = in ? *reinterpret_cast<const float2*>(row + k_at + ec) : make_float2(0.0f, 0.0f);
                qv[m].x *= scale;
                qv[m].y *= scale;
            } else {
                qv[m].x = ok && ec < k_dim ? row[q_at + ec] * scale : 0.0f;
                qv[m].y = ok && ec + 1 < k_dim ? row[q_at + ec + 1] * scale : 0.0f;
                kv[m].x = ok && ec < k_dim ? row[k_at + ec] : 0.0f;
                kv[m].y = ok && ec + 1 < k_dim ? row[k_at + ec + 1] : 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < PER_THREAD; ++m) {
            const int i = er0 + m;
            *reinterpret_cast<float2*>(Qs + i * DC_LD + ec) = qv[m];
            *reinterpret_cast<float2*>(Ks + i * DC_LD + ec) = kv[m];
        }
        if (tid < CH) {
            graw[tid] = tid < n ? src.g[(i64)(c0 + tid) * v_heads + h] : 0.0f;
            bet[tid] = tid < n ? src.beta[(i64)(c0 + tid) * v_heads + h] : 0.0f;
        }
    }
    __syncthreads();

    DC_MARK(1);
    // ---- 2. γ by a warp scan (lane l holds rows 2l, 2l+1), and the decay factors.
    if (warp == 0) {
        const float a = graw[2 * lane];
        const float b = graw[2 * lane + 1];
        float s = a + b;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        const float g0 = s - b;  // γ of row 2l
        const float g1 = s;      // γ of row 2l + 1
        const int last = n - 1;
        const float glast = __shfl_sync(0xffffffffu, (last & 1) ? g1 : g0, last >> 1);
        gam[2 * lane] = g0;
        gam[2 * lane + 1] = g1;
        egam[2 * lane] = expf(g0);
        egam[2 * lane + 1] = expf(g1);
        edec[2 * lane] = expf(glast - g0);
        edec[2 * lane + 1] = expf(glast - g1);
    }
    __syncthreads();

    // v for step 4, loaded once the products of step 3 are done (held from step 1 it would spill
    // registers), so its latency overlaps the epilogue of step 3 and the diagonal inversions. The
    // projection form loads its packed input window here and convolves it in step 4 (`finish_v`).
    float2 vr[PER_THREAD];
    u32 wv[WIN];
    auto load_v = [&]() {
        if (CONV) {
            load_window(wv, v_at + ec, ec < v_dim);
        } else {
#pragma unroll
            for (int m = 0; m < PER_THREAD; ++m) {
                const int i = er0 + m;
                const float* row = src.qkv + (i64)(c0 + min(i, n - 1)) * width;
                const bool ok = i < n;
                if (pairs) {
                    vr[m] = ok && ec < v_dim ? *reinterpret_cast<const float2*>(row + v_at + ec)
                                             : make_float2(0.0f, 0.0f);
                } else {
                    vr[m].x = ok && ec < v_dim ? row[v_at + ec] : 0.0f;
                    vr[m].y = ok && ec + 1 < v_dim ? row[v_at + ec + 1] : 0.0f;
                }
            }
        }
    };
    auto finish_v = [&]() {
        if (CONV) {
            float tv[2][DC_KW];
            load_taps(tv, v_at + ec, ec < v_dim);
            dc_conv_rows<PER_THREAD>(wv, tv, er0, n, vr);
        }
    };

    // ---- 3. A = strictly-lower(β_i (k_i·k_j) e^{γ_i−γ_j}) (warps 0-7) and P = lower((q_i·k_j)
    // e^{γ_i−γ_j}) (warps 8-15): per warp 16 rows and half of the 8 column tiles, of those only
    // the ones up to the diagonal. A goes to shared memory, P straight to the scratch (zeros above
    // the diagonal).
    {
        const bool is_p = warp >= 8;
        const int rb = warp & 3;
        const int nt0 = 4 * ((warp >> 2) & 1);
        const float* left = is_p ? Qs : Ks;
        float acc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
        }
        const int tiles = 2 * rb + 2 - nt0;  // column tiles of this warp up to the diagonal
        if (tiles > 0) {
#pragma unroll 4
            for (int ks = 0; ks < DK / 8; ++ks) {
                u32 a[4];
                dc_frag_a(a, left, DC_LD, 16 * rb, 8 * ks);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    if (nt < tiles) {
                        const float* kb = Ks + (8 * (nt0 + nt) + fg) * DC_LD + 8 * ks + ft;
                        dc_mma_tf32(acc[nt], a, dc_tf32(kb[0]), dc_tf32(kb[4]));
                    }
                }
            }
        }
        load_v();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int i = 16 * rb + fg + 8 * half;
            const float gi = gam[i];
            const float bi = is_p ? 1.0f : bet[i];
            __nv_bfloat16* prow = p_out + ((i64)(c0 + i) * v_heads + h) * CH;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int j = 8 * (nt0 + nt) + 2 * ft;
                float v0 = 0.0f, v1 = 0.0f;
                if (nt < tiles) {
                    const bool keep0 = is_p ? i >= j : i > j;
                    const bool keep1 = is_p ? i >= j + 1 : i > j + 1;
                    // Both factors are computed and the masked ones dropped by a select: cheaper
                    // than branching around expf (the dropped ones may overflow; they are unused).
                    const float e0 = bi * expf(gi - gam[j]) * acc[nt][2 * half];
                    const float e1 = bi * expf(gi - gam[j + 1]) * acc[nt][2 * half + 1];
                    v0 = keep0 ? e0 : 0.0f;
                    v1 = keep1 ? e1 : 0.0f;
                }
                if (is_p) {
                    if (i < n) *reinterpret_cast<u32*>(prow + j) = pack_bf16x2(v0, v1);
                } else if (nt < tiles) {
                    As[i * DC_AP + j] = v0;
                    As[i * DC_AP + j + 1] = v1;
                }
            }
        }
        // The warp holding a diagonal block of A (rows and columns 16·rb..: warps 0 and 1 among the
        // first column tiles, 6 and 7 among the last) inverts it at once, while the others finish:
        // lane cc < 16 solves column cc of T_rr by forward substitution.
        if (!is_p && (nt0 == 0 ? rb < 2 : rb >= 2)) {
            __syncwarp();
            if (lane < 16) {
                const int cc = lane;
                const float* arows = As + 16 * rb * DC_AP + 16 * rb;
                float x[16];
#pragma unroll
                for (int r = 0; r < 16; ++r) {
                    float s = r == cc ? 1.0f : 0.0f;
#pragma unroll
                    for (int q = 0; q < r; ++q) s = fmaf(-arows[r * DC_AP + q], x[q], s);
                    x[r] = s;
                }
#pragma unroll
                for (int r = 0; r < 16; ++r) Ts[(16 * rb + r) * DC_AP + 16 * rb + cc] = x[r];
            }
        }
    }
    __syncthreads();

    DC_MARK(2);
    // ---- 4. Write e^γ·scale·q, e^{γ_last−γ}·k and γ; turn the tiles into the right operands of
    // W and U (β e^γ k in place of k, β v in place of q).
    {
        finish_v();
        // Row er0's (row, head) offset in the [rows][v_heads][DK] outputs, one row's step added per m.
        i64 out_at = ((i64)(c0 + er0) * v_heads + h) * DK + ec;
#pragma unroll
        for (int m = 0; m < PER_THREAD; ++m, out_at += (i64)v_heads * DK) {
            const int i = er0 + m;
            float2* qp = reinterpret_cast<float2*>(Qs + i * DC_LD + ec);
            float2* kp = reinterpret_cast<float2*>(Ks + i * DC_LD + ec);
            const float2 qv = *qp;
            const float2 kv = *kp;
            const float eg = egam[i];
            const float bg = bet[i] * eg;
            if (i < n) {
                *reinterpret_cast<u32*>(q_out + out_at) = pack_bf16x2(eg * qv.x, eg * qv.y);
                *reinterpret_cast<u32*>(k_out + out_at) = pack_bf16x2(edec[i] * kv.x, edec[i] * kv.y);
            }
            *kp = make_float2(bg * kv.x, bg * kv.y);
            *qp = make_float2(bet[i] * vr[m].x, bet[i] * vr[m].y);
        }
    }
    if (tid < n) gam_out[(i64)(c0 + tid) * v_heads + h] = gam[tid];
    __syncthreads();

    DC_MARK(3);
    // ---- 5. The blocks below the diagonal, one block diagonal (level L = r − s) at a time:
    // M = Σ_{s≤q<r} A_rq T_qs, then T_rs = −T_rr M.
#pragma unroll 1
    for (int level = 1; level < 4; ++level) {
        const int count = (4 - level) * 256;
        for (int e = tid; e < count; e += DC_THREADS) {
            const int s = e >> 8;
            const int r = s + level;
            const int a = (e >> 4) & 15;
            const int b = e & 15;
            const float* arow = As + (16 * r + a) * DC_AP;
            float acc[2] = {0.0f, 0.0f};
            for (int q = s; q < r; ++q) {
#pragma unroll
                for (int x = 0; x < 16; ++x) {
                    const int j = 16 * q + x;
                    acc[x & 1] = fmaf(arow[j], Ts[j * DC_AP + 16 * s + b], acc[x & 1]);
                }
            }
            Ms[e] = acc[0] + acc[1];
        }
        __syncthreads();
        for (int e = tid; e < count; e += DC_THREADS) {
            const int s = e >> 8;
            const int r = s + level;
            const int a = (e >> 4) & 15;
            const int b = e & 15;
            const float* trow = Ts + (16 * r + a) * DC_AP + 16 * r;
            const float* mcol = Ms + (s << 8) + b;
            float acc[2] = {0.0f, 0.0f};
#pragma unroll
            for (int x = 0; x < 16; ++x) {
                // T_rr is lower triangular: its entries past a are zero.
                if (x <= a) acc[x & 1] = fmaf(trow[x], mcol[x * 16], acc[x & 1]);
            }
            Ts[(16 * r + a) * DC_AP + 16 * s + b] = -(acc[0] + acc[1]);
        }
        __syncthreads();
    }

    DC_MARK(4);
    // ---- 6. W = T (β e^γ K) (warps 0-7) and U = T (β V) (warps 8-15): per warp 16 rows × 64
    // columns, depth up to the diagonal (T is lower triangular), straight to the scratch.
    {
        const bool is_u = warp >= 8;
        const int rb = warp & 3;
        const int col0 = 64 * ((warp >> 2) & 1);
        const float* right = (is_u ? Qs : Ks) + col0;
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
        }
        for (int ks = 0; ks < 2 * rb + 2; ++ks) {
            u32 a[4];
            dc_frag_a(a, Ts, DC_AP, 16 * rb, 8 * ks);
            const float* b = right + (8 * ks + ft) * DC_LD + fg;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                dc_mma_tf32(acc[nt], a, dc_tf32(b[8 * nt]), dc_tf32(b[4 * DC_LD + 8 * nt]));
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int i = 16 * rb + fg + 8 * half;
            if (i < n) {
                const i64 at = ((i64)(c0 + i) * v_heads + h) * DK + col0 + 2 * ft;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    const float v0 = acc[nt][2 * half];
                    const float v1 = acc[nt][2 * half + 1];
                    if (is_u) {
                        *reinterpret_cast<float2*>(u_out + at + 8 * nt) = make_float2(v0, v1);
                    } else {
                        *reinterpret_cast<u32*>(w_out + at + 8 * nt) = pack_bf16x2(v0, v1);
                    }
                }
            }
        }
    }
    DC_MARK(5);
}

// The plain form: the conv output and the gates.
extern "C" __global__ void __launch_bounds__(DC_THREADS, 2)
    gdr_prepare(const float* __restrict__ qkv, const float* __restrict__ beta, const float* __restrict__ g,
                const u32* __restrict__ cu_seqlens, int num_seqs, int k_heads, int v_heads, int k_dim,
                int v_dim, float scale, u32 rows_cap, __nv_bfloat16* __restrict__ w_out,
                float* __restrict__ u_out, __nv_bfloat16* __restrict__ q_out,
                __nv_bfloat16* __restrict__ k_out, __nv_bfloat16* __restrict__ p_out,
                float* __restrict__ gam_out) {
    GdrSource src{};
    src.qkv = qkv;
    src.beta = beta;
    src.g = g;
    gdr_prepare_body<false>(src, cu_seqlens, num_seqs, k_heads, v_heads, k_dim, v_dim, scale, rows_cap, w_out,
                            u_out, q_out, k_out, p_out, gam_out);
}

// The projection form. The caller checked that x's row stride and offset and k_dim, v_dim are even
// (the pair loads) and that the conv has DC_KW taps.
extern "C" __global__ void __launch_bounds__(DC_THREADS, 2)
    gdr_prepare_conv(const __nv_bfloat16* __restrict__ x, int x_stride, int x_offset,
                     const __nv_bfloat16* __restrict__ conv_w, const __nv_bfloat16* __restrict__ gb, int gb_stride,
                     int gb_offset, const __nv_bfloat16* __restrict__ ga, int ga_stride, int ga_offset,
                     const __nv_bfloat16* __restrict__ a_log, const __nv_bfloat16* __restrict__ dt_bias,
                     float l2_eps, const float* __restrict__ window_in, int has_window,
                     const u32* __restrict__ cu_seqlens, int num_seqs, int k_heads, int v_heads,
                     int k_dim, int v_dim, float scale, u32 rows_cap, __nv_bfloat16* __restrict__ w_out,
                     float* __restrict__ u_out, __nv_bfloat16* __restrict__ q_out,
                     __nv_bfloat16* __restrict__ k_out, __nv_bfloat16* __restrict__ p_out,
                     float* __restrict__ gam_out) {
    const GdrSource src{nullptr, nullptr,   nullptr,   x,     x_stride, x_offset,  conv_w,    gb,
                        gb_stride, gb_offset, ga,  ga_stride, ga_offset, a_log, dt_bias, l2_eps, window_in,
                        has_window};
    gdr_prepare_body<true>(src, cu_seqlens, num_seqs, k_heads, v_heads, k_dim, v_dim, scale, rows_cap, w_out,
                           u_out, q_out, k_out, p_out, gam_out);
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: the sequential pass over each sequence's chunks.

#define GS_LD 136  // bf16 row stride of the [64][128] tiles: 16 bytes of padding keep ldmatrix's
                   // 8 row addresses in distinct bank groups
#define GS_PLD 72  // bf16 row stride of the [64][64] P tile

// Shared memory of one stage (one chunk's tiles), in bytes, for SV value columns.
template <int SV>
struct GsStage {
    static constexpr int ULD = SV + 4;  // f32 row stride of the U tile
    static constexpr int W = 0;         // [64][GS_LD] bf16
    static constexpr int Q = W + DC_CHUNK * GS_LD * 2;
    static constexpr int K = Q + DC_CHUNK * GS_LD * 2;
    static constexpr int P = K + DC_CHUNK * GS_LD * 2;  // [64][GS_PLD] bf16
    static constexpr int U = P + DC_CHUNK * GS_PLD * 2; // [64][ULD] f32
    static constexpr int GL = U + DC_CHUNK * ULD * 4;   // γ of the chunk's last row, f32
    static constexpr int BYTES = GL + 16;
};

// Issues the cp.async copies of the chunk at rows c0..c0+n into stage `base` (zeros past n; a row
// past n copies nothing but still names row c0, a mapped address). Every loop has a fixed trip count
// and each thread a fixed 16-byte column part, so a copy costs a few instructions: this runs once
// per chunk in the sequential pass, where every instruction is on the critical path.
template <int SV, int THREADS>
__device__ __forceinline__ void gs_issue(u32 base, const __nv_bfloat16* __restrict__ w,
                                         const float* __restrict__ u, const __nv_bfloat16* __restrict__ q,
                                         const __nv_bfloat16* __restrict__ k,
                                         const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,
                                         u32 c0, int n, int v_heads, int h, int col0) {
    using L = GsStage<SV>;
    const int tid = threadIdx.x;
    const i64 head0 = (i64)c0 * v_heads + h;  // (row c0, head h) in the [rows][v_heads] scratch
    // W, q, k: 64 rows of 16 × 16 bytes each.
    {
        static_assert(THREADS % 16 == 0 && (DC_CHUNK * 16) % THREADS == 0, "whole passes");
        constexpr int STEP = THREADS / 16;  // rows per pass
        const int part = tid % 16;
        const int i0 = tid / 16;
        const i64 at0 = head0 * DC_DK + part * 8;
        const i64 step = (i64)STEP * v_heads * DC_DK;
        i64 at_i = at0 + (i64)i0 * v_heads * DC_DK;  // row i's offset, advanced by one pass per step
#pragma unroll
        for (int e = 0; e < DC_CHUNK / STEP; ++e, at_i += step) {
            const int i = i0 + e * STEP;
            const bool ok = i < n;
            const i64 at = ok ? at_i : at0;
            const u32 off = (u32)(i * GS_LD + part * 8) * 2;
            cp_async16(base + L::W + off, w + at, ok);
            cp_async16(base + L::Q + off, q + at, ok);
            cp_async16(base + L::K + off, k + at, ok);
        }
    }
    // P: 64 rows of 8 × 16 bytes.
    {
        static_assert(THREADS % 8 == 0 && (DC_CHUNK * 8) % THREADS == 0, "whole passes");
        constexpr int STEP = THREADS / 8;
        const int part = tid % 8;
        const int i0 = tid / 8;
        const i64 at0 = head0 * DC_CHUNK + part * 8;
        const i64 step = (i64)STEP * v_heads * DC_CHUNK;
        i64 at_i = at0 + (i64)i0 * v_heads * DC_CHUNK;
#pragma unroll
        for (int e = 0; e < DC_CHUNK / STEP; ++e, at_i += step) {
            const int i = i0 + e * STEP;
            const bool ok = i < n;
            const i64 at = ok ? at_i : at0;
            cp_async16(base + L::P + (u32)(i * GS_PLD + part * 8) * 2, p + at, ok);
        }
    }
    // U: this slice's SV columns, SV / 4 × 16 bytes per row.
    {
        constexpr int PARTS = SV / 4;
        static_assert(THREADS % PARTS == 0 && (DC_CHUNK * PARTS) % THREADS == 0, "whole passes");
        constexpr int STEP = THREADS / PARTS;
        const int part = tid % PARTS;
        const int i0 = tid / PARTS;
        const i64 at0 = head0 * DC_DK + col0 + part * 4;
        const i64 step = (i64)STEP * v_heads * DC_DK;
        i64 at_i = at0 + (i64)i0 * v_heads * DC_DK;
#pragma unroll
        for (int e = 0; e < DC_CHUNK / STEP; ++e, at_i += step) {
            const int i = i0 + e * STEP;
            const bool ok = i < n;
            const i64 at = ok ? at_i : at0;
            cp_async16(base + L::U + (u32)(i * L::ULD + part * 4) * 4, u + at, ok);
        }
    }
    if (tid == 0) cp_async4(base + L::GL, gam + (i64)(c0 + n - 1) * v_heads + h);
}

// SV value columns per block, in groups of 32; warps (4 per group) each own 16 rows of the
// chunk's V' / O tile and 32 rows of the state, 32 columns wide.
template <int SV>
__device__ __forceinline__ void gdr_state_pass(
    const __nv_bfloat16* __restrict__ w, const float* __restrict__ u, const __nv_bfloat16* __restrict__ q,
    const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,
    const u32* __restrict__ cu_seqlens, const float* __restrict__ initial, int has_initial,
    float* __restrict__ final_state, int has_final, const u32* __restrict__ final_at, int has_final_at,
    float* __restrict__ out, int v_heads, int k_dim, int v_dim, u32 rows_cap) {
    constexpr int THREADS = SV * 4;  // 4 warps per 32 columns
    constexpr int SLD = SV + 8;      // bf16 row stride of the state and V' copies
    using L = GsStage<SV>;
    unsigned char* const smem = reinterpret_cast<unsigned char*>(dc_smem);
    __nv_bfloat16* const Sb = reinterpret_cast<__nv_bfloat16*>(smem + 2 * L::BYTES);  // [128][SLD]
    __nv_bfloat16* const Vb = Sb + DC_DK * SLD;                                      // [64][SLD]
    const u32 stage0 = smem_addr(smem);

    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const int col0 = blockIdx.z * SV;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int rw = warp & 3;         // row group: V'/O rows 16·rw.., state rows 32·rw..
    const int cw = 32 * (warp >> 2); // the warp's first column within the slice
    const int gr = lane >> 2;        // fragment row (and row + 8)
    const int gc = 2 * (lane & 3);   // fragment column pair
    const int vcols = min(SV, v_dim - col0);
    const i64 state_at = ((i64)s * v_heads + h) * k_dim * v_dim + col0;
    const u32 start = min(cu_seqlens[s], rows_cap);
    const u32 end = max(start, min(cu_seqlens[s + 1], rows_cap));

    // The state slice, f32 in mma accumulator layout: st[m][nt][e] is at row st_row(m, e) (a key)
    // and column st_col(nt, e) of the slice.
    float st[2][4][4];
    auto st_row = [&](int m, int e) { return 32 * rw + 16 * m + gr + (e >> 1) * 8; };
    auto st_col = [&](int nt, int e) { return cw + 8 * nt + gc + (e & 1); };
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = st_row(m, e);
                const int col = st_col(nt, e);
                st[m][nt][e] = (has_initial && row < k_dim && col < vcols)
                                   ? initial[state_at + (i64)row * v_dim + col]
                                   : 0.0f;
            }
        }
    }
    // Its bf16 copy, the right operand of W S0 and q S0.
    auto store_state = [&]() {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                __nv_bfloat16* d = Sb + (32 * rw + 16 * m + gr) * SLD + cw + 8 * nt + gc;
                *reinterpret_cast<u32*>(d) = pack_bf16x2(st[m][nt][0], st[m][nt][1]);
                *reinterpret_cast<u32*>(d + 8 * SLD) = pack_bf16x2(st[m][nt][2], st[m][nt][3]);
            }
        }
    };
    store_state();
    // The state is written once the rows before `snap` are done: after the chunk ending there
    // (each sequence's end unless told). A count between chunk ends writes nothing; the model asks
    // for none (TextModel::forward_segments refuses them, Backend::snapshot_grid).
    const u32 snap = has_final_at ? min(start + final_at[s], end) : end;
    auto write_final = [&]() {
        if (!has_final) return;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = st_row(m, e);
                    const int col = st_col(nt, e);
                    if (row < k_dim && col < vcols) final_state[state_at + (i64)row * v_dim + col] = st[m][nt][e];
                }
            }
        }
    };
    if (snap == start) write_final();

    // ldmatrix lane addresses (see flash_attention.cu): A from a row-major tile, lanes 0-15 rows
    // 0-15 at column 0, 16-31 at column 8; B from a row-major [k][n] tile (transposed), the same
    // pattern; A from a [k][m] tile (kᵀ, transposed): lanes 0-7 k 0-7 at m 0, 8-15 k 0-7 at m 8,
    // 16-23 k 8-15 at m 0, 24-31 k 8-15 at m 8.
    const int a_row = lane & 15;
    const int a_col = (lane >> 4) * 8;
    const int at_k = (lane & 7) + (lane >> 4) * 8;
    const int at_m = ((lane >> 3) & 1) * 8;
    const u32 sb_addr = smem_addr(Sb + a_row * SLD + cw + a_col);
    const u32 vb_addr = smem_addr(Vb + a_row * SLD + cw + a_col);

    int n = (int)min((u32)DC_CHUNK, end - start);
    if (start < end) gs_issue<SV, THREADS>(stage0, w, u, q, k, p, gam, start, n, v_heads, h, col0);
    cp_async_commit();
    int buf = 0;
    for (u32 c0 = start; c0 < end; c0 += DC_CHUNK, buf ^= 1) {
        const u32 base = stage0 + buf * L::BYTES;
        const unsigned char* stage = smem + buf * L::BYTES;
        cp_async_wait<0>();
        // The chunk's tiles and the state copy are complete; every warp is done with the other stage.
        __syncthreads();
        const u32 c_next = c0 + (u32)n;
        const int n_next = (int)min((u32)DC_CHUNK, end - c_next);
        if (c_next < end) {
            gs_issue<SV, THREADS>(stage0 + (buf ^ 1) * L::BYTES, w, u, q, k, p, gam, c_next, n_next, v_heads, h,
                                  col0);
        }
        cp_async_commit();

        // ---- V' = U − W S0 and O = (e^γ q) S0: 16 rows × 32 columns per warp, depth 128.
        float vp[4][4], o[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vp[nt][e] = 0.0f;
                o[nt][e] = 0.0f;
            }
        }
        {
            const u32 w_addr = base + L::W + (u32)((16 * rw + a_row) * GS_LD + a_col) * 2;
            const u32 q_addr = base + L::Q + (u32)((16 * rw + a_row) * GS_LD + a_col) * 2;
#pragma unroll
            for (int ks = 0; ks < DC_DK / 16; ++ks) {
                u32 wa[4], qa[4];
                ldmatrix_x4(wa, w_addr + ks * 32);
                ldmatrix_x4(qa, q_addr + ks * 32);
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 sb[4];
                    ldmatrix_x4_trans(sb, sb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                    mma_bf16_16816(vp[2 * np], wa, sb[0], sb[1]);
                    mma_bf16_16816(vp[2 * np + 1], wa, sb[2], sb[3]);
                    mma_bf16_16816(o[2 * np], qa, sb[0], sb[1]);
                    mma_bf16_16816(o[2 * np + 1], qa, sb[2], sb[3]);
                }
            }
        }
        {
            const float* us = reinterpret_cast<const float*>(stage + L::U);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int col = cw + 8 * nt + gc;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = 16 * rw + gr + 8 * half;
                    const float2 uu = *reinterpret_cast<const float2*>(us + row * L::ULD + col);
                    const float v0 = uu.x - vp[nt][2 * half];
                    const float v1 = uu.y - vp[nt][2 * half + 1];
                    *reinterpret_cast<u32*>(Vb + row * SLD + col) = pack_bf16x2(v0, v1);
                }
            }
        }
        // V' is complete, and every warp is done reading the state copy.
        __syncthreads();

        // ---- O += P V' (P is zero above the diagonal: only the 16-token blocks up to the warp's
        // own), then O to global memory.
        {
            const u32 p_addr = base + L::P + (u32)((16 * rw + a_row) * GS_PLD + a_col) * 2;
            for (int ks = 0; ks <= rw; ++ks) {
                u32 pa[4];
                ldmatrix_x4(pa, p_addr + ks * 32);
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 vb[4];
                    ldmatrix_x4_trans(vb, vb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                    mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
                    mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
                }
            }
            const i64 out_width = (i64)v_heads * v_dim;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = 16 * rw + gr + 8 * half;
                if (row < n) {
                    float* dst = out + (i64)(c0 + row) * out_width + (i64)h * v_dim + col0;
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        const int col = cw + 8 * nt + gc;
                        if (col < vcols) dst[col] = o[nt][2 * half];
                        if (col + 1 < vcols) dst[col + 1] = o[nt][2 * half + 1];
                    }
                }
            }
        }

        // ---- S ← e^{γ_last} S0 + (e^{γ_last−γ} K)ᵀ V': 32 state rows × 32 columns per warp,
        // depth 64 (the chunk's tokens).
        {
            const float decay = expf(*reinterpret_cast<const float*>(stage + L::GL));
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) st[m][nt][e] *= decay;
                }
            }
            const u32 k_addr = base + L::K + (u32)(at_k * GS_LD + 32 * rw + at_m) * 2;
#pragma unroll
            for (int ks = 0; ks < DC_CHUNK / 16; ++ks) {
                u32 vb[2][4];
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    ldmatrix_x4_trans(vb[np], vb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                }
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    u32 ka[4];
                    ldmatrix_x4_trans(ka, k_addr + (u32)(ks * 16 * GS_LD + 16 * m) * 2);
#pragma unroll
                    for (int np = 0; np < 2; ++np) {
                        mma_bf16_16816(st[m][2 * np], ka, vb[np][0], vb[np][1]);
                        mma_bf16_16816(st[m][2 * np + 1], ka, vb[np][2], vb[np][3]);
                    }
                }
            }
        }
        // Every warp read V' and the state copy before this chunk's barrier; the next chunk reads
        // the new copy after its barrier.
        store_state();
        if (c_next == snap) write_final();
        n = n_next;
    }
    cp_async_wait<0>();
}

// Grid (num_seqs, v_heads, ceil(v_dim / SV)), 4·SV threads, dynamic shared memory
// 2·GsStage<SV>::BYTES + (128 + 64)·(SV + 8)·2 bytes (delta_chunked.rs `pass_smem_bytes`).
#define GS_KERNEL(NAME, SV)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SV * 4)                                                    \
        NAME(const __nv_bfloat16* __restrict__ w, const float* __restrict__ u,                             \
             const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                     \
             const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,                           \
             const u32* __restrict__ cu_seqlens, const float* __restrict__ initial, int has_initial,        \
             float* __restrict__ final_state, int has_final, const u32* __restrict__ final_at,             \
             int has_final_at, float* __restrict__ out, int v_heads, int k_dim, int v_dim, u32 rows_cap) {  \
        gdr_state_pass<SV>(w, u, q, k, p, gam, cu_seqlens, initial, has_initial, final_state, has_final,    \
                           final_at, has_final_at, out, v_heads, k_dim, v_dim, rows_cap);                   \
    }

GS_KERNEL(gdr_state_pass_v32, 32)
GS_KERNEL(gdr_state_pass_v64, 64)
