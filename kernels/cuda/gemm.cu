// y = x Wᵀ (or y += x Wᵀ with `add`) with f32 activations x [rows, in], bf16 weights W [out, in],
// f32 accumulation. A plain shared-memory tiled kernel, for the shapes cuBLASLt refuses.

#define GEMM_TILE 16

template <typename X>
__device__ void gemm_xwt_tile(const X* __restrict__ x, const __nv_bfloat16* __restrict__ w, float* __restrict__ y,
                              int rows, int in_dim, int out_dim, int add) {
    __shared__ float xs[GEMM_TILE][GEMM_TILE];
    __shared__ float ws[GEMM_TILE][GEMM_TILE + 1];
    const int r = blockIdx.y * GEMM_TILE + threadIdx.y;  // row of x and y
    const int o = blockIdx.x * GEMM_TILE + threadIdx.x;  // column of y (row of W)
    const int w_row = blockIdx.x * GEMM_TILE + threadIdx.y;
    float acc = 0.0f;
    for (int k0 = 0; k0 < in_dim; k0 += GEMM_TILE) {
        const int k = k0 + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = (r < rows && k < in_dim) ? load_f32(x, (i64)r * in_dim + k) : 0.0f;
        ws[threadIdx.y][threadIdx.x] = (w_row < out_dim && k < in_dim) ? load_bf16(w, (i64)w_row * in_dim + k) : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < GEMM_TILE; ++kk) acc += xs[threadIdx.y][kk] * ws[threadIdx.x][kk];
        __syncthreads();
    }
    if (r < rows && o < out_dim) {
        float* yo = y + (i64)r * out_dim + o;
        *yo = add ? *yo + acc : acc;
    }
}

extern "C" __global__ void gemm_xwt(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                    float* __restrict__ y, int rows, int in_dim, int out_dim, int add) {
    gemm_xwt_tile(x, w, y, rows, in_dim, out_dim, add);
}

// The same with a bf16 x (a GEMM-input buffer), for shapes cuBLASLt has no algorithm for.
extern "C" __global__ void gemm_xwt_bf16x(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                          float* __restrict__ y, int rows, int in_dim, int out_dim, int add) {
    gemm_xwt_tile(x, w, y, rows, in_dim, out_dim, add);
}
