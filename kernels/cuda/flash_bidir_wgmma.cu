// Bidirectional attention within each segment (the vision tower's attention within each image
// frame) at head dim 64, on Hopper's warpgroup MMAs (wgmma; compiled for sm_90a only, a trap
// elsewhere). The contract of flash_attention_bidir_wide_d64 (flash_attention.cu): qb =
// q · scale · log2(e), kb, vb bf16 [rows][heads][64], segments from cu_seqlens (clamped to rows);
// out [rows][heads][64], f32, or bf16 with out_bf16 (the proj GEMM's input).
//
// One block = FW_BM = 128 query rows of one segment and one head, two warpgroups of 64 rows each.
// Key/value tiles of BN rows stream through a ring of STAGES shared-memory stages by cp.async,
// stored with the 128-byte swizzle that wgmma's shared-memory descriptors read (a row of 64 bf16
// is one 128-byte line; its 16-byte chunk c lives at chunk c ^ (row % 8)). Per tile a warpgroup:
//   S = Q Kᵀ      64 x BN f32 in registers, Q and K both read from shared memory (K-major);
//   online softmax of S in f32 with exp2, P rounded to bf16 in registers: the accumulator layout
//                 of S is the register layout of the next product's A operand;
//   O += P V      64 x 64 f32 accumulator, V read from shared memory as a transposed (MN-major) B.
// Keys past the segment load as zeros and are masked to -inf; query rows past it compute on zero
// rows and are not stored. A row's keys are summed tile by tile in key order whichever block or
// batch holds it, so an image's features do not depend on the other images of its pass.
//
// With BN = 64 the tiles, the softmax steps and every rounding are those of flash_attention.cu's
// mma.sync layouts, and the results are the same bits (measured on an H100: ragged batches and a
// 4,096-row image, 16 heads). The entry point below is the overlapped form (fw_attention_overlap,
// three stages): the same bits, 184.9 µs on a whole screenshot against 193.5 for the two-stage form
// and 280.9 for mma.sync. BN = 128 was faster still but rounds differently (fewer rescaling steps).

#define FW_D 64
#define FW_BM 128
#define FW_THREADS 256

// Shared memory the kernel takes for BN and STAGES: Q, the K and V stages, and slack to align
// the tiles to 1024 bytes (the swizzle's period).
#define FW_SMEM_BYTES(BN, STAGES) (1024 + FW_BM * 128 + (STAGES) * (BN) * 128 * 2)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)


// Byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile (1024-aligned).
__device__ __forceinline__ u32 fw_swizzle(int row, int chunk) { return (u32)(row * 128 + ((chunk ^ (row & 7)) << 4)); }

// A wgmma shared-memory descriptor of a 128-byte-swizzled tile at shared address `addr`: rows of
// 128 bytes, 8-row groups 1024 bytes apart (the stride offset); the leading offset is unused by
// these shapes (one swizzle line spans the whole K of a k16 step, or the whole N = 64).
__device__ __forceinline__ unsigned long long fw_desc(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void fw_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fw_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed MMA groups are still running.
template <int N>
__device__ __forceinline__ void fw_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async's writes (the generic proxy) made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fw_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins accumulator registers at this point of the program: wgmma writes them asynchronously, so
// the compiler must not move their reads above the wait (or their writes below the fence).
template <int N>
__device__ __forceinline__ void fw_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// cp.async of ROWS rows of 64 bf16 (row_stride apart from `base`) into a swizzled tile at `dst`;
// rows at or beyond `limit` (counting from `first`) are zeros. Eight threads per row, 16 bytes each.
template <int ROWS>
__device__ __forceinline__ void fw_load_tile(u32 dst, const __nv_bfloat16* base, i64 row_stride, int first,
                                             int limit) {
    static_assert(ROWS * 8 % FW_THREADS == 0, "whole passes");
#pragma unroll
    for (int e = 0; e < ROWS * 8 / FW_THREADS; ++e) {
        const int i = (int)threadIdx.x + e * FW_THREADS;
        const int r = i >> 3, c = i & 7;
        const bool ok = first + r < limit;
        cp_async16(dst + fw_swizzle(r, c), ok ? base + (i64)r * row_stride + c * 8 : base, ok);
    }
}

__device__ __forceinline__ void fw_mma_ss_n64(float (&d)[32], unsigned long long a, unsigned long long b,
                                              int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void fw_mma_ss_n128(float (&d)[64], unsigned long long a, unsigned long long b,
                                              int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void fw_mma_rs_n64_tb(float (&d)[32], const u32 (&a)[4], unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

extern __shared__ __align__(1024) unsigned char fw_smem[];


template <int BN>
__device__ __forceinline__ void fw_mma_s(float (&s)[BN / 2], unsigned long long a, unsigned long long b,
                                         int accumulate);
template <>
__device__ __forceinline__ void fw_mma_s<64>(float (&s)[32], unsigned long long a, unsigned long long b,
                                             int accumulate) {
    fw_mma_ss_n64(s, a, b, accumulate);
}
template <>
__device__ __forceinline__ void fw_mma_s<128>(float (&s)[64], unsigned long long a, unsigned long long b,
                                              int accumulate) {
    fw_mma_ss_n128(s, a, b, accumulate);
}

// One tile's online softmax step for rows g and g + 8 of a warp: keys at or past `len` masked, then
// prelude.cuh's online_softmax_tile (flash_attention.cu's step: the same bits) on s read as
// [BN / 8][4] (its layout). c0 and c1 are the factors the accumulator rows must be scaled by before
// this tile's P V.
template <int BN>
__device__ __forceinline__ void fw_softmax(float (&s)[BN / 2], int key0, int len, int tq, float& m0, float& m1,
                                           float& l0, float& l1, float& c0, float& c1) {
    if (key0 + BN > len) {  // the tile runs past the segment (its rows loaded as zeros)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            const int key = key0 + n * 8 + tq * 2;
            if (key >= len) s[4 * n] = s[4 * n + 2] = F32_NEG_INF;
            if (key + 1 >= len) s[4 * n + 1] = s[4 * n + 3] = F32_NEG_INF;
        }
    }
    online_softmax_tile<BN / 8>(*reinterpret_cast<float(*)[BN / 8][4]>(&s), m0, m1, l0, l1, c0, c1);
}

// The accumulator rows scaled by c0 and c1; skipped once the running maxima settle (most tiles of
// a long row), where both are exactly 1.
__device__ __forceinline__ void fw_rescale(float (&o)[32], float c0, float c1) {
    if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            o[4 * n] *= c0;
            o[4 * n + 1] *= c0;
            o[4 * n + 2] *= c1;
            o[4 * n + 3] *= c1;
        }
    }
}

// P (exp2'd S) as bf16 A fragments of the k16 steps over the tile's keys.
template <int BN>
__device__ __forceinline__ void fw_pack(const float (&s)[BN / 2], u32 (&p)[BN / 16][4]) {
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
        p[ks][0] = pack_bf16x2(s[8 * ks], s[8 * ks + 1]);
        p[ks][1] = pack_bf16x2(s[8 * ks + 2], s[8 * ks + 3]);
        p[ks][2] = pack_bf16x2(s[8 * ks + 4], s[8 * ks + 5]);
        p[ks][3] = pack_bf16x2(s[8 * ks + 6], s[8 * ks + 7]);
    }
}

// Issues S = Q Kᵀ for one tile (four k16 steps, each 32 bytes further along the swizzled lines).
template <int BN>
__device__ __forceinline__ void fw_issue_s(float (&s)[BN / 2], unsigned long long q_desc, u32 k_tile) {
    const unsigned long long k_desc = fw_desc(k_tile);
#pragma unroll
    for (int kk = 0; kk < FW_D / 16; ++kk) fw_mma_s<BN>(s, q_desc + 2 * kk, k_desc + 2 * kk, 1);
}

// Issues O += P V for one tile (a k16 step is 16 key rows, 2048 bytes further into the V tile).
template <int BN>
__device__ __forceinline__ void fw_issue_pv(float (&o)[32], const u32 (&p)[BN / 16][4], u32 v_tile) {
    const unsigned long long v_desc = fw_desc(v_tile);
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) fw_mma_rs_n64_tb(o, p[ks], v_desc + 128 * ks);
}

// Where a block works: its segment and query tile (false: no tile, the block exits), its shared
// tiles (1024-aligned), and its thread's place in the accumulator layout.
struct FwBlock {
    int tile, len, n_tiles;
    u32 seq_start;
    int h, wg, warp, g, tq, q0;
    u32 sq, sk, sv;
};

template <int BN, int STAGES>
__device__ __forceinline__ bool fw_block(const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, FwBlock& b) {
    b.tile = 0;
    b.len = 0;
    b.seq_start = 0;
    if (!find_tile_warp<FW_BM>(cu_seqlens, num_seqs, rows, blockIdx.x, b.tile, b.seq_start, b.len)) return false;
    b.h = blockIdx.y;
    b.wg = threadIdx.x >> 7;           // warpgroup: the block's query rows 64·wg ..
    b.warp = (threadIdx.x >> 5) & 3;   // warp of the warpgroup: its rows 16·warp ..
    b.g = (threadIdx.x & 31) >> 2;     // accumulator row (and row + 8)
    b.tq = threadIdx.x & 3;            // accumulator column pair
    b.q0 = b.tile * FW_BM;
    b.n_tiles = (b.len + BN - 1) / BN;
    b.sq = (smem_addr(fw_smem) + 1023u) & ~1023u;
    b.sk = b.sq + FW_BM * 128;
    b.sv = b.sk + STAGES * BN * 128;
    return true;
}

// The normalised rows of O into out (rows past the segment not stored).
__device__ __forceinline__ void fw_store(const FwBlock& b, const float (&o)[32], float l0, float l1,
                                         void* __restrict__ out, int out_bf16, int heads) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv[2] = {1.0f / l0, 1.0f / l1};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = b.q0 + b.wg * 64 + b.warp * 16 + b.g + half * 8;
        if (r >= b.len) continue;
        const i64 dst = ((i64)(b.seq_start + r) * heads + b.h) * FW_D;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int col = n * 8 + b.tq * 2;
            const float2 y = make_float2(o[4 * n + 2 * half] * inv[half], o[4 * n + 2 * half + 1] * inv[half]);
            if (out_bf16) {
                *reinterpret_cast<u32*>(static_cast<__nv_bfloat16*>(out) + dst + col) = pack_bf16x2(y.x, y.y);
            } else {
                *reinterpret_cast<float2*>(static_cast<float*>(out) + dst + col) = y;
            }
        }
    }
}

// Where the block's segment's K and V rows of head b.h start, and their row stride.
struct FwKv {
    i64 row_stride;
    const __nv_bfloat16* k;
    const __nv_bfloat16* v;
};

// Loads key/value tile `t` of the block's segment into stage `st` (zeros past the segment).
template <int BN>
__device__ __forceinline__ void fw_load_kv(const FwBlock& b, const FwKv& kv, int t, int st) {
    const int key0 = t * BN;
    fw_load_tile<BN>(b.sk + st * BN * 128, kv.k + (i64)key0 * kv.row_stride, kv.row_stride, key0, b.len);
    fw_load_tile<BN>(b.sv + st * BN * 128, kv.v + (i64)key0 * kv.row_stride, kv.row_stride, key0, b.len);
}

// The first loads of either form: Q with stage 0's group, then stages 0 .. STAGES − 1 (one group
// each, empty past the segment's tiles).
template <int BN, int STAGES>
__device__ __forceinline__ FwKv fw_start(const FwBlock& b, const __nv_bfloat16* __restrict__ qb,
                                         const __nv_bfloat16* __restrict__ kb, const __nv_bfloat16* __restrict__ vb,
                                         int heads) {
    FwKv kv;
    kv.row_stride = (i64)heads * FW_D;
    kv.k = kb + (i64)b.seq_start * kv.row_stride + (i64)b.h * FW_D;
    kv.v = vb + (i64)b.seq_start * kv.row_stride + (i64)b.h * FW_D;
    fw_load_tile<FW_BM>(b.sq, qb + ((i64)(b.seq_start + b.q0) * heads + b.h) * FW_D, kv.row_stride, b.q0, b.len);
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
        if (st < b.n_tiles) fw_load_kv<BN>(b, kv, st, st);
        cp_async_commit();
    }
    return kv;
}

// Each tile in turn: S = Q Kᵀ, wait, softmax, O += P V, wait. STAGES tiles in flight.
template <int BN, int STAGES>
__device__ __forceinline__ void fw_attention(const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,
                                             const __nv_bfloat16* __restrict__ vb, const u32* __restrict__ cu_seqlens,
                                             int num_seqs, u32 rows, void* __restrict__ out, int out_bf16,
                                             int heads) {
    FwBlock b;
    if (!fw_block<BN, STAGES>(cu_seqlens, num_seqs, rows, b)) return;
    // Group s in flight holds stage s's K and V (and Q with stage 0); one group is committed per
    // step, empty where no tile is left, so "all but STAGES - 1" always means "this step's".
    const FwKv kv = fw_start<BN, STAGES>(b, qb, kb, vb, heads);

    const unsigned long long q_desc = fw_desc(b.sq + b.wg * 64 * 128);
    float o[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    float m0 = F32_NEG_INF, m1 = F32_NEG_INF;  // running max (log2 units) of rows g and g + 8
    float l0 = 0.0f, l1 = 0.0f;                // this thread's share of the running denominators

    for (int j = 0; j < b.n_tiles; ++j) {
        const int st = j % STAGES;
        cp_async_wait<STAGES - 1>();
        fw_proxy_fence();
        __syncthreads();

        float s[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
        fw_fence();
        fw_issue_s<BN>(s, q_desc, b.sk + st * BN * 128);
        fw_commit();
        fw_wait<0>();
        fw_pin(s);

        float c0, c1;
        fw_softmax<BN>(s, j * BN, b.len, b.tq, m0, m1, l0, l1, c0, c1);
        fw_rescale(o, c0, c1);
        u32 p[BN / 16][4];
        fw_pack<BN>(s, p);

        fw_fence();
        fw_issue_pv<BN>(o, p, b.sv + st * BN * 128);
        fw_commit();
        fw_wait<0>();
        fw_pin(o);

        __syncthreads();  // both warpgroups are done with stage st
        if (j + STAGES < b.n_tiles) fw_load_kv<BN>(b, kv, j + STAGES, st);
        cp_async_commit();
    }
    fw_store(b, o, l0, l1, out, out_bf16, heads);
}

// The same sums in the same order, with the products overlapped with the softmax: tile j's
// S = Q K_jᵀ and tile j − 1's O += P V run on the tensor cores while the warpgroup waits only for
// the first, then computes tile j's softmax as the second finishes; O is scaled by tile j's factors
// after it. Three stages: tile j − 1's V is read while tile j's K is, and a stage is refilled one
// step after its V was last read.
template <int BN>
__device__ __forceinline__ void fw_attention_overlap(const __nv_bfloat16* __restrict__ qb,
                                                     const __nv_bfloat16* __restrict__ kb,
                                                     const __nv_bfloat16* __restrict__ vb,
                                                     const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,
                                                     void* __restrict__ out, int out_bf16, int heads) {
    constexpr int STAGES = 3;
    FwBlock b;
    if (!fw_block<BN, STAGES>(cu_seqlens, num_seqs, rows, b)) return;
    // Groups: Q with tile 0, then tiles 1 and 2; then one per step (tile j + 2 at the end of step
    // j), empty where no tile is left: at the top of step j, "all but the newest one" is tile j.
    const FwKv kv = fw_start<BN, STAGES>(b, qb, kb, vb, heads);

    const unsigned long long q_desc = fw_desc(b.sq + b.wg * 64 * 128);
    float o[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    float m0 = F32_NEG_INF, m1 = F32_NEG_INF;
    float l0 = 0.0f, l1 = 0.0f;
    float s[BN / 2];
    u32 p[BN / 16][4];

    // Tile 0: its product and softmax alone.
    cp_async_wait<STAGES - 1>();
    fw_proxy_fence();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
    fw_fence();
    fw_issue_s<BN>(s, q_desc, b.sk);
    fw_commit();
    fw_wait<0>();
    fw_pin(s);
    {
        float c0, c1;
        fw_softmax<BN>(s, 0, b.len, b.tq, m0, m1, l0, l1, c0, c1);
        fw_rescale(o, c0, c1);
    }
    fw_pack<BN>(s, p);

    for (int j = 1; j < b.n_tiles; ++j) {
        cp_async_wait<STAGES - 2>();  // tile j
        fw_proxy_fence();
        __syncthreads();
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
        fw_fence();
        fw_issue_s<BN>(s, q_desc, b.sk + (j % STAGES) * BN * 128);
        fw_commit();
        fw_issue_pv<BN>(o, p, b.sv + ((j - 1) % STAGES) * BN * 128);
        fw_commit();
        fw_wait<1>();  // S (tile j's P V may still run)
        fw_pin(s);
        float c0, c1;
        fw_softmax<BN>(s, j * BN, b.len, b.tq, m0, m1, l0, l1, c0, c1);
        fw_wait<0>();  // tile j − 1's P V
        fw_pin(o);
        fw_rescale(o, c0, c1);
        fw_pack<BN>(s, p);
        __syncthreads();  // both warpgroups are done with tile j − 1's stage
        if (j + 2 < b.n_tiles) fw_load_kv<BN>(b, kv, j + 2, (j - 1) % STAGES);
        cp_async_commit();
    }
    fw_fence();
    fw_issue_pv<BN>(o, p, b.sv + ((b.n_tiles - 1) % STAGES) * BN * 128);
    fw_commit();
    fw_wait<0>();
    fw_pin(o);
    fw_store(b, o, l0, l1, out, out_bf16, heads);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Launch with FW_THREADS threads, FW_SMEM_BYTES(BN, STAGES) bytes of dynamic shared memory and
// grid (ceil(rows / FW_BM) + num_seqs, heads).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FW_BODY(BN, STAGES) fw_attention<BN, STAGES>(qb, kb, vb, cu_seqlens, num_seqs, rows, out, out_bf16, heads);
#define FW_OVERLAP_BODY(BN) fw_attention_overlap<BN>(qb, kb, vb, cu_seqlens, num_seqs, rows, out, out_bf16, heads);
#else
#define FW_BODY(BN, STAGES) __trap();
#define FW_OVERLAP_BODY(BN) __trap();
#endif
#define FW_ENTRY(NAME, BN, STAGES, MIN_BLOCKS)                                                             \
    extern "C" __global__ void __launch_bounds__(FW_THREADS, MIN_BLOCKS)                                   \
        NAME(const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,                   \
             const __nv_bfloat16* __restrict__ vb, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, \
             void* __restrict__ out, int out_bf16, int heads) {                                            \
        FW_BODY(BN, STAGES)                                                                                \
    }
#define FW_OVERLAP_ENTRY(NAME, BN, MIN_BLOCKS)                                                             \
    extern "C" __global__ void __launch_bounds__(FW_THREADS, MIN_BLOCKS)                                   \
        NAME(const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,                   \
             const __nv_bfloat16* __restrict__ vb, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, \
             void* __restrict__ out, int out_bf16, int heads) {                                            \
        FW_OVERLAP_BODY(BN)                                                                                \
    }

FW_OVERLAP_ENTRY(flash_bidir_wgmma_d64, 64, 2)
