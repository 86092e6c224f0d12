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
// One block per (sequence, value head, slice of SV value columns) walks its sequence's chunks in
// order, the slice S[128][SV] of the state in shared memory. Value columns never mix (A, P and W
// depend on q, k, β and g only), so a slice needs only its own columns of S, V and O; the price is
// that every slice recomputes A, P and W. The host picks SV = 32 when there are too few (sequence,
// head) pairs to fill the GPU (one long prompt), SV = 64 otherwise (delta_chunked.rs). The next
// chunk's inputs are loaded into registers while the current one finishes (steps 6 and 7).
//
// Key and value heads up to 128 wide; narrower heads are zero-padded to 128 keys and SV values
// (the padding stays exactly zero in every product). A partial last chunk is zero-padded the same
// way: β = 0 and k = q = v = 0 make its padded rows of A, W, U, V' and P vanish.
//
// f32 SIMT arithmetic throughout, so results match the token-by-token kernel to f32 rounding.
// 256 threads; every product is a register-tiled loop over shared memory. A second kernel at the
// end of the file (delta_chunked_tc, the one the host runs) does the same with its products on
// tensor cores.

#define DC_CHUNK 64
#define DC_DK 128
#define DC_THREADS 256
// Row stride of the 64×64 A and P tiles: rows stay float4-aligned, and a thread's 4×4 tile store
// (4 rows 4 floats wide) spreads consecutive tiles over different banks.
#define DC_AP 68

extern __shared__ float4 dc_smem[];

// Index into a [64][128] q / k / W tile. The float4 groups of row r are XOR-swizzled by
// (r / 4) % 8: the A and P products read 8 rows 4 apart at once, which unswizzled would all hit
// the same 4 banks; a row's 128 values stay a permutation of its own 32 float4 groups.
__device__ __forceinline__ int dc_qk(int row, int k) {
    return row * DC_DK + ((((k >> 2) ^ ((row >> 2) & 7)) << 2) | (k & 3));
}

__device__ __forceinline__ float4 dc_ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ void dc_st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// acc[0..3] += a · b
__device__ __forceinline__ void dc_fma4(float* acc, float a, float4 b) {
    acc[0] = fmaf(a, b.x, acc[0]);
    acc[1] = fmaf(a, b.y, acc[1]);
    acc[2] = fmaf(a, b.z, acc[2]);
    acc[3] = fmaf(a, b.w, acc[3]);
}

__device__ __forceinline__ float dc_dot4(float4 a, float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// acc[r][0..3] = Σ_k rows[r][k] · Ss[k][col..col+3] for ROWS rows of a swizzled [64][128] tile
// starting at `row0` (a multiple of ROWS, ROWS ≤ 4, so all of them share one swizzle).
template <int ROWS, int SV>
__device__ __forceinline__ void dc_rows_times_state(const float* tile, int row0, const float* Ss,
                                                    int col, float (&acc)[ROWS][4]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
    }
    const int sw = (row0 >> 2) & 7;
    const float* rows = tile + row0 * DC_DK;
#pragma unroll 4
    for (int kg = 0; kg < DC_DK / 4; ++kg) {
        float4 a[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) a[r] = dc_ld4(rows + r * DC_DK + ((kg ^ sw) << 2));
        const float* s = Ss + kg * 4 * SV + col;
        const float4 b0 = dc_ld4(s);
        const float4 b1 = dc_ld4(s + SV);
        const float4 b2 = dc_ld4(s + 2 * SV);
        const float4 b3 = dc_ld4(s + 3 * SV);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            dc_fma4(acc[r], a[r].x, b0);
            dc_fma4(acc[r], a[r].y, b1);
            dc_fma4(acc[r], a[r].z, b2);
            dc_fma4(acc[r], a[r].w, b3);
        }
    }
}

// One chunk's inputs in registers: thread t holds key column t % 128 of rows t / 128 + 2m (q, k),
// value column t % SV of rows t / SV + m·(256 / SV), and g, β of row t (t < 64). Loading the next
// chunk while the current one computes hides the global memory latency.
template <int SV>
struct DcFetch {
    static constexpr int QK = DC_CHUNK * DC_DK / DC_THREADS;
    static constexpr int V = DC_CHUNK * SV / DC_THREADS;
    float q[QK];
    float k[QK];
    float v[V];
    float g;
    float beta;
};

// Loads rows c0..c0+n of the chunk into `f` (zeros past n, past k_dim and past the slice).
template <int SV>
__device__ __forceinline__ void dc_fetch(DcFetch<SV>& f, const float* __restrict__ qkv,
                                         const float* __restrict__ beta, const float* __restrict__ g,
                                         u32 c0, int n, i64 width, i64 q_at, i64 k_at, i64 v_at, int k_dim,
                                         int vcols, int v_heads, int h, float scale) {
    const int tid = threadIdx.x;
    const int kq = tid % DC_DK;
    const int cv = tid % SV;
#pragma unroll
    for (int m = 0; m < DcFetch<SV>::QK; ++m) {
        const int i = tid / DC_DK + m * (DC_THREADS / DC_DK);
        f.q[m] = 0.0f;
        f.k[m] = 0.0f;
        if (i < n && kq < k_dim) {
            const float* row = qkv + (i64)(c0 + i) * width;
            f.q[m] = row[q_at + kq] * scale;
            f.k[m] = row[k_at + kq];
        }
    }
#pragma unroll
    for (int m = 0; m < DcFetch<SV>::V; ++m) {
        const int i = tid / SV + m * (DC_THREADS / SV);
        f.v[m] = (i < n && cv < vcols) ? qkv[(i64)(c0 + i) * width + v_at + cv] : 0.0f;
    }
    f.g = 0.0f;
    f.beta = 0.0f;
    if (tid < n) {
        f.g = g[(i64)(c0 + tid) * v_heads + h];
        f.beta = beta[(i64)(c0 + tid) * v_heads + h];
    }
}

template <int SV>
__device__ __forceinline__ void delta_chunked(const float* __restrict__ qkv, const float* __restrict__ beta,
                                              const float* __restrict__ g, const u32* __restrict__ cu_seqlens,
                                              const float* __restrict__ initial, int has_initial,
                                              float* __restrict__ final_state, int has_final,
                                              float* __restrict__ out, int k_heads, int v_heads, int k_dim,
                                              int v_dim, float scale, u32 rows_cap) {
    constexpr int CH = DC_CHUNK;
    constexpr int DK = DC_DK;
    constexpr int NT = DC_THREADS;
    constexpr int TN = SV / 4;          // 4-wide column groups of a slice
    constexpr int OR = CH * TN / NT;    // rows of the O / V' tile each thread owns
    constexpr int SR = DK * TN / NT;    // rows of the S tile each thread owns
    static_assert(OR * NT == CH * TN && SR * NT == DK * TN, "the tiles cover every output");
    static_assert((OR == 2 || OR == 4) && SR % 4 == 0, "tile shapes the loops below assume");

    // Shared memory (the host sizes it with the same layout: delta_chunked.rs `smem_bytes`).
    float* const Ks = reinterpret_cast<float*>(dc_smem);  // [CH][DK] swizzled: k
    float* const Qs = Ks + CH * DK;                       // [CH][DK] swizzled: scaled q, then W
    float* const Ss = Qs + CH * DK;                       // [DK][SV]: the state slice
    float* const Vs = Ss + DK * SV;                       // [CH][SV]: v, then U, then V'
    float* const As = Vs + CH * SV;                       // [CH][DC_AP]: A (strictly lower part)
    float* const Ps = As + CH * DC_AP;                    // [CH][DC_AP]: P (lower part, 0 above)
    float* const graw = Ps + CH * DC_AP;                  // [CH]: g
    float* const gam = graw + CH;                         // [CH]: γ, cumulative g in the chunk
    float* const bet = gam + CH;                          // [CH]: β
    float* const egam = bet + CH;                         // [CH]: e^{γ_i}
    float* const edec = egam + CH;                        // [CH]: e^{γ_last − γ_j}

    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const int col0 = blockIdx.z * SV;
    const int tid = threadIdx.x;
    const int kh = h / (v_heads / k_heads);
    const i64 width = 2 * (i64)k_heads * k_dim + (i64)v_heads * v_dim;
    const i64 q_at = (i64)kh * k_dim;
    const i64 k_at = (i64)k_heads * k_dim + (i64)kh * k_dim;
    const i64 v_at = 2 * (i64)k_heads * k_dim + (i64)h * v_dim + col0;
    const int vcols = min(SV, v_dim - col0);
    const i64 state_at = ((i64)s * v_heads + h) * k_dim * v_dim + col0;
    // Never step outside the buffers, whatever cu_seqlens holds.
    const u32 start = min(cu_seqlens[s], rows_cap);
    const u32 end = max(start, min(cu_seqlens[s + 1], rows_cap));

    // Tiles. O and V' ([CH][SV]): rows OR·otm.., columns 4·otn..; S ([DK][SV]): rows SR·stk..,
    // the same columns. Consecutive threads take consecutive column groups, so a quarter warp reads
    // one row of a left operand (broadcast) and 32 contiguous floats of a right one.
    const int otn = tid % TN;
    const int otm = tid / TN;
    const int stk = tid / TN;
    const int ocol = 4 * otn;
    const int orow = OR * otm;
    const int srow = SR * stk;
    // A and P tiles (4×4): threads 0..119 take the 120 tiles strictly below A's diagonal, threads
    // 120..255 the 136 tiles on or below P's: one tile each, no thread idles on the zero half. The
    // strictly-lower entries of A's 16 diagonal tiles are done separately (threads 0..95).
    const bool is_p = tid >= 120;
    int tj = is_p ? tid - 120 : tid;
    int ti = 0;
    while (tj > ti) {
        tj -= ti + 1;
        ++ti;
    }
    if (!is_p) ti += 1;

    for (int e = tid; e < DK * SV; e += NT) {
        const int k = e / SV;
        const int c = e % SV;
        Ss[e] = (has_initial && k < k_dim && c < vcols) ? initial[state_at + (i64)k * v_dim + c] : 0.0f;
    }

    u32 c_start = start;
    int n = (int)min((u32)CH, end - start);
    DcFetch<SV> next;
    dc_fetch<SV>(next, qkv, beta, g, c_start, n, width, q_at, k_at, v_at, k_dim, vcols, v_heads, h, scale);
    while (c_start < end) {
        // ---- 1. Stage the chunk: q (scaled), k, this slice of v, g, β; zeros past n.
        {
            const int kq = tid % DK;
#pragma unroll
            for (int m = 0; m < DcFetch<SV>::QK; ++m) {
                const int i = tid / DK + m * (NT / DK);
                Qs[dc_qk(i, kq)] = next.q[m];
                Ks[dc_qk(i, kq)] = next.k[m];
            }
#pragma unroll
            for (int m = 0; m < DcFetch<SV>::V; ++m) Vs[(tid / SV + m * (NT / SV)) * SV + tid % SV] = next.v[m];
            if (tid < CH) {
                graw[tid] = next.g;
                bet[tid] = next.beta;
            }
        }
        __syncthreads();

        // ---- 2. γ (left to right, as the reference sums it); the inter-chunk part of O, Q S0,
        // kept in registers until step 6.
        if (tid < CH) {
            float acc = 0.0f;
#pragma unroll
            for (int t4 = 0; t4 < CH; t4 += 4) {
                const float4 gv = dc_ld4(graw + t4);
                if (t4 <= tid) acc += gv.x;
                if (t4 + 1 <= tid) acc += gv.y;
                if (t4 + 2 <= tid) acc += gv.z;
                if (t4 + 3 <= tid) acc += gv.w;
            }
            gam[tid] = acc;
        }
        float o[OR][4];
        dc_rows_times_state<OR, SV>(Qs, orow, Ss, ocol, o);
        __syncthreads();

        // ---- 3. A and P (one 4×4 tile per thread), the decay factors.
        if (tid < CH) {
            const float gi = gam[tid];
            egam[tid] = expf(gi);
            edec[tid] = expf(gam[n - 1] - gi);
        }
        {
            const float* arows = (is_p ? Qs : Ks) + 4 * ti * DK;
            const float* brows = Ks + 4 * tj * DK;
            const int swa = ti & 7;
            const int swb = tj & 7;
            float acc[4][4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
            }
#pragma unroll 2
            for (int kg = 0; kg < DK / 4; ++kg) {
                float4 a[4], b[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) a[r] = dc_ld4(arows + r * DK + ((kg ^ swa) << 2));
#pragma unroll
                for (int c = 0; c < 4; ++c) b[c] = dc_ld4(brows + c * DK + ((kg ^ swb) << 2));
#pragma unroll
                for (int r = 0; r < 4; ++r) {
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[r][c] = dc_dot4(a[r], b[c], acc[r][c]);
                }
            }
            float* dst = is_p ? Ps : As;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = 4 * ti + r;
                const float gi = gam[i];
                const float bi = is_p ? 1.0f : bet[i];
                float v[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int j = 4 * tj + c;
                    // P's diagonal tiles need their upper entries zero: step 6 reads them.
                    v[c] = i >= j ? bi * expf(gi - gam[j]) * acc[r][c] : 0.0f;
                }
                dc_st4(dst + i * DC_AP + 4 * tj, make_float4(v[0], v[1], v[2], v[3]));
            }
        }
        if (tid < 96) {
            // Entry (r, c), r > c, of A's diagonal tile d.
            const int d = tid / 6;
            const int e = tid % 6;
            const int r = e < 1 ? 1 : (e < 3 ? 2 : 3);
            const int c = e < 1 ? 0 : (e < 3 ? e - 1 : e - 3);
            const int i = 4 * d + r;
            const int j = 4 * d + c;
            const int sw = d & 7;
            float acc = 0.0f;
#pragma unroll 4
            for (int kg = 0; kg < DK / 4; ++kg) {
                acc = dc_dot4(dc_ld4(Ks + i * DK + ((kg ^ sw) << 2)), dc_ld4(Ks + j * DK + ((kg ^ sw) << 2)),
                              acc);
            }
            As[i * DC_AP + j] = bet[i] * expf(gam[i] - gam[j]) * acc;
        }
        __syncthreads();

        // ---- 4. W = T (β e^γ K) into Qs (q is no longer needed), U = T (β V) in place: every
        // column is an independent forward substitution x_i = b_i − Σ_{j<i} A_ij x_j, one column
        // per thread, held in registers (every index is a constant once the loops unroll).
        if (tid < DK + SV) {
            const bool w_col = tid < DK;
            const int c = w_col ? tid : tid - DK;
            float x[CH];
            if (w_col) {
#pragma unroll
                for (int i = 0; i < CH; ++i) x[i] = bet[i] * egam[i] * Ks[dc_qk(i, c)];
            } else {
#pragma unroll
                for (int i = 0; i < CH; ++i) x[i] = bet[i] * Vs[i * SV + c];
            }
#pragma unroll
            for (int i = 1; i < CH; ++i) {
                const float* arow = As + i * DC_AP;
                // Four partial sums: shorter dependency chains.
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
                for (int j = 0; j < i; j += 4) {
                    // Entries j ≥ i of the row are never initialised; they are never used either.
                    const float4 a = dc_ld4(arow + j);
                    s0 = fmaf(a.x, x[j], s0);
                    if (j + 1 < i) s1 = fmaf(a.y, x[j + 1], s1);
                    if (j + 2 < i) s2 = fmaf(a.z, x[j + 2], s2);
                    if (j + 3 < i) s3 = fmaf(a.w, x[j + 3], s3);
                }
                x[i] -= (s0 + s1) + (s2 + s3);
            }
            if (w_col) {
#pragma unroll
                for (int i = 0; i < CH; ++i) Qs[dc_qk(i, c)] = x[i];
            } else {
#pragma unroll
                for (int i = 0; i < CH; ++i) Vs[i * SV + c] = x[i];
            }
        }
        __syncthreads();

        // ---- 5. V' = U − W S0, in place of U.
        {
            float ws[OR][4];
            dc_rows_times_state<OR, SV>(Qs, orow, Ss, ocol, ws);
#pragma unroll
            for (int r = 0; r < OR; ++r) {
                float* v = Vs + (orow + r) * SV + ocol;
                const float4 u = dc_ld4(v);
                dc_st4(v, make_float4(u.x - ws[r][0], u.y - ws[r][1], u.z - ws[r][2], u.w - ws[r][3]));
            }
        }
        __syncthreads();

        // The next chunk's loads fly while steps 6 and 7 compute.
        const u32 c_next = c_start + (u32)n;
        const int n_next = (int)min((u32)CH, end - c_next);
        dc_fetch<SV>(next, qkv, beta, g, c_next, n_next, width, q_at, k_at, v_at, k_dim, vcols, v_heads, h,
                     scale);

        // ---- 6. O = e^γ (Q S0) + P V', to global memory.
        {
#pragma unroll
            for (int r = 0; r < OR; ++r) {
                const float e = egam[orow + r];
#pragma unroll
                for (int c = 0; c < 4; ++c) o[r][c] *= e;
            }
            // P_ij = 0 for j > i, so the loop may run to the end of the thread's last 4-row group.
            const int j_end = orow + OR;
            for (int j = 0; j < j_end; j += 4) {
                float4 a[OR];
#pragma unroll
                for (int r = 0; r < OR; ++r) a[r] = dc_ld4(Ps + (orow + r) * DC_AP + j);
                const float* v = Vs + j * SV + ocol;
                const float4 b0 = dc_ld4(v);
                const float4 b1 = dc_ld4(v + SV);
                const float4 b2 = dc_ld4(v + 2 * SV);
                const float4 b3 = dc_ld4(v + 3 * SV);
#pragma unroll
                for (int r = 0; r < OR; ++r) {
                    dc_fma4(o[r], a[r].x, b0);
                    dc_fma4(o[r], a[r].y, b1);
                    dc_fma4(o[r], a[r].z, b2);
                    dc_fma4(o[r], a[r].w, b3);
                }
            }
            const i64 out_width = (i64)v_heads * v_dim;
#pragma unroll
            for (int r = 0; r < OR; ++r) {
                const int i = orow + r;
                if (i < n) {
                    float* dst = out + (i64)(c_start + i) * out_width + (i64)h * v_dim + col0 + ocol;
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        if (ocol + c < vcols) dst[c] = o[r][c];
                    }
                }
            }
        }

        // ---- 7. S ← e^{γ_last} S0 + Σ_j e^{γ_last−γ_j} k_j V'_jᵀ (S is not read in step 6).
        {
            const float last = egam[n - 1];
            float sa[SR][4];
#pragma unroll
            for (int r = 0; r < SR; ++r) {
                const float4 sv = dc_ld4(Ss + (srow + r) * SV + ocol);
                sa[r][0] = last * sv.x;
                sa[r][1] = last * sv.y;
                sa[r][2] = last * sv.z;
                sa[r][3] = last * sv.w;
            }
            for (int j = 0; j < n; ++j) {
                const float d = edec[j];
                const float4 vj = dc_ld4(Vs + j * SV + ocol);
                const float4 b = make_float4(d * vj.x, d * vj.y, d * vj.z, d * vj.w);
                const int sw = (j >> 2) & 7;
#pragma unroll
                for (int m = 0; m < SR / 4; ++m) {
                    const float4 a = dc_ld4(Ks + j * DK + ((((srow >> 2) + m) ^ sw) << 2));
                    dc_fma4(sa[4 * m], a.x, b);
                    dc_fma4(sa[4 * m + 1], a.y, b);
                    dc_fma4(sa[4 * m + 2], a.z, b);
                    dc_fma4(sa[4 * m + 3], a.w, b);
                }
            }
#pragma unroll
            for (int r = 0; r < SR; ++r) {
                dc_st4(Ss + (srow + r) * SV + ocol, make_float4(sa[r][0], sa[r][1], sa[r][2], sa[r][3]));
            }
        }
        // The next chunk overwrites the staged tiles.
        __syncthreads();
        c_start = c_next;
        n = n_next;
    }

    if (has_final) {
        for (int e = tid; e < DK * SV; e += NT) {
            const int k = e / SV;
            const int c = e % SV;
            if (k < k_dim && c < vcols) final_state[state_at + (i64)k * v_dim + c] = Ss[e];
        }
    }
}

// Grid (num_seqs, v_heads, ceil(v_dim / SV)), 256 threads, dynamic shared memory as laid out above
// (126,208 bytes for SV = 32, 150,784 for SV = 64). Arguments as gated_delta_rule_recurrent's.
#define DC_KERNEL(NAME, SV)                                                                                \
    extern "C" __global__ void __launch_bounds__(DC_THREADS)                                               \
        NAME(const float* __restrict__ qkv, const float* __restrict__ beta, const float* __restrict__ g,  \
             const u32* __restrict__ cu_seqlens, const float* __restrict__ initial, int has_initial,       \
             float* __restrict__ final_state, int has_final, float* __restrict__ out, int k_heads,         \
             int v_heads, int k_dim, int v_dim, float scale, u32 rows_cap) {                               \
        delta_chunked<SV>(qkv, beta, g, cu_seqlens, initial, has_initial, final_state, has_final, out,    \
                          k_heads, v_heads, k_dim, v_dim, scale, rows_cap);                                \
    }

DC_KERNEL(gated_delta_rule_chunked_v32, 32)
DC_KERNEL(gated_delta_rule_chunked_v64, 64)
