// The CUDA kernels of the `ai.unstep` operators (the contract is in mod.rs). Compiled at run time
// with NVRTC for the device's compute capability and launched on ONNX Runtime's compute stream.
//
// Header-free, so that NVRTC needs no CUDA include folder: float16 travels as `unsigned short` and
// is converted with the PTX `cvt` instructions, all arithmetic is float32, and every output element
// is rounded to its type once.
//
// Two layouts of a row on the threads (`BlockRow` and `WarpRow` below), each with its own entry
// points (suffix `_w` for the warp layout); the host picks one from D (cuda.rs: D <= WARP_MAX_D
// takes the warp layout). In both, the `WIDTH` threads of a row hold its element pairs
// p = t, t + WIDTH, t + 2 * WIDTH, ... (thread t of the row; pair p = elements 2p and 2p + 1), so
// each load instruction of a warp reads one contiguous stretch of the row (128 bytes for float16,
// 256 for float32), and the row stays in registers between the passes: at most
// MAX_PAIRS_PER_THREAD pairs per thread, so D <= 2 * WIDTH * MAX_PAIRS_PER_THREAD (the host checks
// D, that D is even and that every pointer is aligned to a pair).
//
// - BlockRow, for large D (the DiT's 1536): one block of THREADS threads per row, grid = rows,
//   D <= 2048. Sums over the row: warp shuffles, then the warps' partial sums through shared
//   memory. A few registers per thread and many threads per row keep enough loads in flight: on an
//   H200 (wan-1.3b, D = 1536, 4680 rows, float16, kernel trace) a GatedResidualLayerNorm takes
//   21.6 us and a BiasRmsNormRope 16.4 us, against 46.9 and 28.4 us with one warp per row (24
//   pairs per lane held in 127 registers).
// - WarpRow, for small D (the VAE's channels-last rows, D = 96 to 384, up to ~1.6 M rows): one
//   warp per row, ROWS_PER_BLOCK rows per block, grid = ceil(rows / ROWS_PER_BLOCK), D <= 512.
//   Sums are warp shuffles only (no shared memory, no barrier). A warp whose row is past the end
//   returns as a whole, so the full-mask shuffles always have all 32 lanes. (A block of 128
//   threads would leave most of them idle at D = 96: 48 pairs.)

#define WARP 32
#define THREADS 128
#define WARPS (THREADS / WARP)
#define ROWS_PER_BLOCK 8
#define WARP_ROW_THREADS (WARP * ROWS_PER_BLOCK)
#define MAX_PAIRS_PER_THREAD 8

typedef long long i64;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

struct alignas(8) FloatPair {
    float a, b;
};

// Element type float32.
struct F32 {
    typedef float T;
    static __device__ __forceinline__ void load2(const T* p, i64 i, float& a, float& b) {
        const FloatPair v = *reinterpret_cast<const FloatPair*>(p + i);
        a = v.a;
        b = v.b;
    }
    static __device__ __forceinline__ void store2(T* p, i64 i, float a, float b) {
        FloatPair v;
        v.a = a;
        v.b = b;
        *reinterpret_cast<FloatPair*>(p + i) = v;
    }
    static __device__ __forceinline__ float load(const T* p, i64 i) { return p[i]; }
    // The value as it is stored.
    static __device__ __forceinline__ float stored(float v) { return v; }
};

// Element type float16 (IEEE half, as ONNX Runtime stores it), two per 32-bit word, element 2p in
// the low half (little-endian).
struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ void load2(const T* p, i64 i, float& a, float& b) {
        const unsigned int v = *reinterpret_cast<const unsigned int*>(p + i);
        a = h2f((unsigned short)(v & 0xffffu));
        b = h2f((unsigned short)(v >> 16));
    }
    static __device__ __forceinline__ void store2(T* p, i64 i, float a, float b) {
        *reinterpret_cast<unsigned int*>(p + i) =
            (unsigned int)f2h(a) | ((unsigned int)f2h(b) << 16);
    }
    static __device__ __forceinline__ float load(const T* p, i64 i) { return h2f(p[i]); }
    static __device__ __forceinline__ float stored(float v) { return h2f(f2h(v)); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// The sum of `v` over the block's threads, in every thread. `shared` holds WARPS floats; each
// call site uses its own array, so consecutive sums need no barrier between them.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    v = warp_sum(v);
    if (threadIdx.x % WARP == 0) {
        shared[threadIdx.x / WARP] = v;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        total += shared[w];
    }
    return total;
}

// One block of THREADS threads per row.
struct BlockRow {
    static constexpr int WIDTH = THREADS;
    static __device__ __forceinline__ i64 row() { return blockIdx.x; }
    static __device__ __forceinline__ int thread() { return threadIdx.x; }
    // The sum over the row's threads, in every thread; `shared` holds WARPS floats.
    static __device__ __forceinline__ float sum(float v, float* shared) {
        return block_sum(v, shared);
    }
};

// One warp per row, ROWS_PER_BLOCK rows per block.
struct WarpRow {
    static constexpr int WIDTH = WARP;
    static __device__ __forceinline__ i64 row() {
        return (i64)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    }
    static __device__ __forceinline__ int thread() { return threadIdx.x % WARP; }
    static __device__ __forceinline__ float sum(float v, float*) { return warp_sum(v); }
};

// SiLU as the contract writes it: n * sigmoid(n) = n / (1 + exp(-n)).
__device__ __forceinline__ float silu(float n) { return n / (1.0f + expf(-n)); }

// BiasRmsNorm and, with ROPE, BiasRmsNormRope, on the row layout L:
//   v = x + bias; u = v / sqrt(mean(v^2) + eps) * weight;
//   not ROPE: y = u, or silu(u) when `act_silu` is nonzero;
//   ROPE: pair p (elements 2p, 2p+1) turns by table row t = row % table_rows, column
//   j = p % half_hd: y[2p] = u[2p] cos - u[2p+1] sin, y[2p+1] = u[2p] sin + u[2p+1] cos.
template <class E, class L, bool ROPE>
__device__ __forceinline__ void bias_rms_norm(const typename E::T* __restrict__ x,
                                              const typename E::T* __restrict__ bias,
                                              const typename E::T* __restrict__ weight,
                                              const typename E::T* __restrict__ cos_table,
                                              const typename E::T* __restrict__ sin_table,
                                              typename E::T* __restrict__ y, i64 rows, int d,
                                              float eps, int act_silu, int half_hd,
                                              i64 table_rows) {
    __shared__ float partial[WARPS];
    const i64 row = L::row();
    // Uniform over the row's threads (a whole block for BlockRow, a whole warp for WarpRow).
    if (row >= rows) {
        return;
    }
    const int t = L::thread();
    const int pairs = d / 2;
    const i64 base = row * d;
    float a[MAX_PAIRS_PER_THREAD];
    float b[MAX_PAIRS_PER_THREAD];
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        a[k] = 0.0f;
        b[k] = 0.0f;
        if (p < pairs) {
            float x0, x1, b0, b1;
            E::load2(x, base + 2 * p, x0, x1);
            E::load2(bias, 2 * p, b0, b1);
            a[k] = x0 + b0;
            b[k] = x1 + b1;
            squares += a[k] * a[k] + b[k] * b[k];
        }
    }
    squares = L::sum(squares, partial);
    const float inv = 1.0f / sqrtf(squares / (float)d + eps);
    const i64 table_row = ROPE ? (row % table_rows) * half_hd : 0;
    // The outputs into a, b first, then the stores: a load after a store in the same loop would
    // wait for the memory round trip once per pair instead of once per row.
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        if (p < pairs) {
            float w0, w1;
            E::load2(weight, 2 * p, w0, w1);
            const float u0 = a[k] * inv * w0;
            const float u1 = b[k] * inv * w1;
            if (ROPE) {
                const i64 j = table_row + p % half_hd;
                const float c = E::load(cos_table, j);
                const float s = E::load(sin_table, j);
                a[k] = u0 * c - u1 * s;
                b[k] = u0 * s + u1 * c;
            } else if (act_silu) {
                a[k] = silu(u0);
                b[k] = silu(u1);
            } else {
                a[k] = u0;
                b[k] = u1;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        if (p < pairs) {
            E::store2(y, base + 2 * p, a[k], b[k]);
        }
    }
}

// GatedResidualLayerNorm on the row layout L: s = stored(r + (x + bias) * gate); out_s = s;
//   y = (s - mean(s)) / sqrt(mean((s - mean)^2) + eps) * scale + shift.
// gate, scale and shift are row parameters: row `row` uses their block row / *_div.
template <class E, class L>
__device__ __forceinline__ void gated_residual_layer_norm(
    const typename E::T* __restrict__ r, const typename E::T* __restrict__ x,
    const typename E::T* __restrict__ bias, const typename E::T* __restrict__ gate,
    const typename E::T* __restrict__ scale, const typename E::T* __restrict__ shift,
    typename E::T* __restrict__ out_s, typename E::T* __restrict__ y, i64 rows, int d, float eps,
    i64 gate_div, i64 scale_div, i64 shift_div) {
    // One array per sum: consecutive block sums need no barrier between them.
    __shared__ float partial_sum[WARPS];
    __shared__ float partial_squares[WARPS];
    const i64 row = L::row();
    // Uniform over the row's threads, as in bias_rms_norm.
    if (row >= rows) {
        return;
    }
    const int t = L::thread();
    const int pairs = d / 2;
    const i64 base = row * d;
    const i64 gate_base = (row / gate_div) * d;
    const i64 scale_base = (row / scale_div) * d;
    const i64 shift_base = (row / shift_div) * d;
    float a[MAX_PAIRS_PER_THREAD];
    float b[MAX_PAIRS_PER_THREAD];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        a[k] = 0.0f;
        b[k] = 0.0f;
        if (p < pairs) {
            float r0, r1, x0, x1, b0, b1, g0, g1;
            E::load2(r, base + 2 * p, r0, r1);
            E::load2(x, base + 2 * p, x0, x1);
            E::load2(bias, 2 * p, b0, b1);
            E::load2(gate, gate_base + 2 * p, g0, g1);
            a[k] = E::stored(r0 + (x0 + b0) * g0);
            b[k] = E::stored(r1 + (x1 + b1) * g1);
            sum += a[k] + b[k];
        }
    }
    const float mean = L::sum(sum, partial_sum) / (float)d;
    // S is stored here, after the loads of the row: see bias_rms_norm.
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        if (p < pairs) {
            E::store2(out_s, base + 2 * p, a[k], b[k]);
            const float da = a[k] - mean;
            const float db = b[k] - mean;
            squares += da * da + db * db;
        }
    }
    const float inv = 1.0f / sqrtf(L::sum(squares, partial_squares) / (float)d + eps);
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        if (p < pairs) {
            float sc0, sc1, sh0, sh1;
            E::load2(scale, scale_base + 2 * p, sc0, sc1);
            E::load2(shift, shift_base + 2 * p, sh0, sh1);
            a[k] = (a[k] - mean) * inv * sc0 + sh0;
            b[k] = (b[k] - mean) * inv * sc1 + sh1;
        }
    }
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * L::WIDTH + t;
        if (p < pairs) {
            E::store2(y, base + 2 * p, a[k], b[k]);
        }
    }
}

// Entry points, one per operator, element type and row layout, no dynamic shared memory.
// BlockRow (SUFFIX f32, f16): blocks of THREADS threads, one per row. WarpRow (SUFFIX f32_w,
// f16_w): blocks of WARP_ROW_THREADS threads, ceil(rows / ROWS_PER_BLOCK) of them.
#define ENTRY_POINTS(E, L, BLOCK, SUFFIX, T)                                                   \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_bias_rms_norm_rope_##SUFFIX(const T* x, const T* bias, const T* weight,         \
                                           const T* cos_table, const T* sin_table, T* y,       \
                                           i64 rows, int d, float eps, int half_hd,            \
                                           i64 table_rows) {                                   \
        bias_rms_norm<E, L, true>(x, bias, weight, cos_table, sin_table, y, rows, d, eps, 0,   \
                                  half_hd, table_rows);                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_bias_rms_norm_##SUFFIX(const T* x, const T* bias, const T* weight, T* y,        \
                                      i64 rows, int d, float eps, int act_silu) {              \
        bias_rms_norm<E, L, false>(x, bias, weight, 0, 0, y, rows, d, eps, act_silu, 1, 1);    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_gated_residual_layer_norm_##SUFFIX(                                             \
            const T* r, const T* x, const T* bias, const T* gate, const T* scale,              \
            const T* shift, T* out_s, T* y, i64 rows, int d, float eps, i64 gate_div,          \
            i64 scale_div, i64 shift_div) {                                                    \
        gated_residual_layer_norm<E, L>(r, x, bias, gate, scale, shift, out_s, y, rows, d,     \
                                        eps, gate_div, scale_div, shift_div);                  \
    }

ENTRY_POINTS(F32, BlockRow, THREADS, f32, float)
ENTRY_POINTS(F16, BlockRow, THREADS, f16, unsigned short)
ENTRY_POINTS(F32, WarpRow, WARP_ROW_THREADS, f32_w, float)
ENTRY_POINTS(F16, WarpRow, WARP_ROW_THREADS, f16_w, unsigned short)
