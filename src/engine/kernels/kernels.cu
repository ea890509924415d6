// The CUDA kernels of the `ai.unstep` operators (the contract is in mod.rs). Compiled at run time
// with NVRTC for the device's compute capability and launched on ONNX Runtime's compute stream.
//
// Header-free, so that NVRTC needs no CUDA include folder: float16 travels as `unsigned short` and
// is converted with the PTX `cvt` instructions, all arithmetic is float32, and every output element
// is rounded to its type once.
//
// Layout: one block of THREADS threads per row. Thread `t` holds the element pairs
// p = t, t + THREADS, t + 2 * THREADS, ... of its row (pair p = elements 2p and 2p + 1), so each
// load instruction of a warp reads one contiguous stretch of the row (128 bytes for float16, 256
// for float32). The row stays in registers between the passes: at most MAX_PAIRS_PER_THREAD pairs
// per thread, so D <= 2 * THREADS * MAX_PAIRS_PER_THREAD (the host checks D, that D is even and
// that every pointer is aligned to a pair). Sums over the row: warp shuffles, then the warps'
// partial sums through shared memory. A few registers per thread and many threads per row keep
// enough loads in flight: on an H200 (wan-1.3b, D = 1536, 4680 rows, float16, kernel trace) a
// GatedResidualLayerNorm takes 21.6 us and a BiasRmsNormRope 16.4 us, against 46.9 and 28.4 us
// with one warp per row (24 pairs per lane held in 127 registers).

#define WARP 32
#define THREADS 128
#define WARPS (THREADS / WARP)
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

// BiasRmsNorm and, with ROPE, BiasRmsNormRope:
//   v = x + bias; u = v / sqrt(mean(v^2) + eps) * weight;
//   ROPE: pair p (elements 2p, 2p+1) turns by table row t = row % table_rows, column
//   j = p % half_hd: y[2p] = u[2p] cos - u[2p+1] sin, y[2p+1] = u[2p] sin + u[2p+1] cos.
template <class E, bool ROPE>
__device__ __forceinline__ void bias_rms_norm(const typename E::T* __restrict__ x,
                                              const typename E::T* __restrict__ bias,
                                              const typename E::T* __restrict__ weight,
                                              const typename E::T* __restrict__ cos_table,
                                              const typename E::T* __restrict__ sin_table,
                                              typename E::T* __restrict__ y, i64 rows, int d,
                                              float eps, int half_hd, i64 table_rows) {
    __shared__ float partial[WARPS];
    const i64 row = blockIdx.x;
    const int pairs = d / 2;
    const i64 base = row * d;
    float a[MAX_PAIRS_PER_THREAD];
    float b[MAX_PAIRS_PER_THREAD];
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * THREADS + threadIdx.x;
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
    squares = block_sum(squares, partial);
    const float inv = 1.0f / sqrtf(squares / (float)d + eps);
    const i64 table_row = ROPE ? (row % table_rows) * half_hd : 0;
    // The outputs into a, b first, then the stores: a load after a store in the same loop would
    // wait for the memory round trip once per pair instead of once per row.
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * THREADS + threadIdx.x;
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
            } else {
                a[k] = u0;
                b[k] = u1;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * THREADS + threadIdx.x;
        if (p < pairs) {
            E::store2(y, base + 2 * p, a[k], b[k]);
        }
    }
}

// GatedResidualLayerNorm: s = stored(r + (x + bias) * gate); out_s = s;
//   y = (s - mean(s)) / sqrt(mean((s - mean)^2) + eps) * scale + shift.
// gate, scale and shift are row parameters: row `row` uses their block row / *_div.
template <class E>
__device__ __forceinline__ void gated_residual_layer_norm(
    const typename E::T* __restrict__ r, const typename E::T* __restrict__ x,
    const typename E::T* __restrict__ bias, const typename E::T* __restrict__ gate,
    const typename E::T* __restrict__ scale, const typename E::T* __restrict__ shift,
    typename E::T* __restrict__ out_s, typename E::T* __restrict__ y, i64 rows, int d, float eps,
    i64 gate_div, i64 scale_div, i64 shift_div) {
    __shared__ float partial_sum[WARPS];
    __shared__ float partial_squares[WARPS];
    const i64 row = blockIdx.x;
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
        const int p = k * THREADS + threadIdx.x;
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
    const float mean = block_sum(sum, partial_sum) / (float)d;
    // S is stored here, after the loads of the row: see bias_rms_norm.
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * THREADS + threadIdx.x;
        if (p < pairs) {
            E::store2(out_s, base + 2 * p, a[k], b[k]);
            const float da = a[k] - mean;
            const float db = b[k] - mean;
            squares += da * da + db * db;
        }
    }
    const float inv = 1.0f / sqrtf(block_sum(squares, partial_squares) / (float)d + eps);
#pragma unroll
    for (int k = 0; k < MAX_PAIRS_PER_THREAD; ++k) {
        const int p = k * THREADS + threadIdx.x;
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
        const int p = k * THREADS + threadIdx.x;
        if (p < pairs) {
            E::store2(y, base + 2 * p, a[k], b[k]);
        }
    }
}

// Entry points, one per operator and element type. Grid: one block of THREADS threads per row, no
// dynamic shared memory.
#define ENTRY_POINTS(E, SUFFIX, T)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        unstep_bias_rms_norm_rope_##SUFFIX(const T* x, const T* bias, const T* weight,         \
                                           const T* cos_table, const T* sin_table, T* y,       \
                                           i64 rows, int d, float eps, int half_hd,            \
                                           i64 table_rows) {                                   \
        bias_rms_norm<E, true>(x, bias, weight, cos_table, sin_table, y, rows, d, eps,         \
                               half_hd, table_rows);                                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        unstep_bias_rms_norm_##SUFFIX(const T* x, const T* bias, const T* weight, T* y,        \
                                      i64 rows, int d, float eps) {                            \
        bias_rms_norm<E, false>(x, bias, weight, 0, 0, y, rows, d, eps, 1, 1);                 \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        unstep_gated_residual_layer_norm_##SUFFIX(                                             \
            const T* r, const T* x, const T* bias, const T* gate, const T* scale,              \
            const T* shift, T* out_s, T* y, i64 rows, int d, float eps, i64 gate_div,          \
            i64 scale_div, i64 shift_div) {                                                    \
        gated_residual_layer_norm<E>(r, x, bias, gate, scale, shift, out_s, y, rows, d, eps,   \
                                     gate_div, scale_div, shift_div);                          \
    }

ENTRY_POINTS(F32, f32, float)
ENTRY_POINTS(F16, f16, unsigned short)
