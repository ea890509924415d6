// The CUDA kernels of the `ai.unstep` operators (the contract is in mod.rs). Compiled at run time
// with NVRTC for the device's compute capability and launched on ONNX Runtime's compute stream.
//
// Header-free, so that NVRTC needs no CUDA include folder: float16 travels as `unsigned short` and
// is converted with the PTX `cvt` instructions, all arithmetic is float32, and every output element
// is rounded to its type once.
//
// Three layouts of a row on the threads (`BlockRow`, `BlockQuad` and `GroupRow` below), each with
// its own entry points (suffixes none, `_q` and `_g`); the host picks one per call (row_launch.rs).
// In all three a row is cut into *units* of V consecutive elements, loaded and stored as one
// access, and the WIDTH threads of a row hold units u = t, t + WIDTH, t + 2 * WIDTH, ... (thread t
// of the row), so each load instruction of a warp reads contiguous memory, and the row stays in
// registers between the passes: ROW_FLOATS floats per thread (the host checks D against it, that D
// is a multiple of V and that every pointer is aligned to a unit).
//
// - BlockRow and BlockQuad, for large D (the DiT's 1536): one block of THREADS threads per row,
//   grid = rows, units of a pair (V = 2, any even D) or of 4 elements (D a multiple of 4),
//   D <= 2048. Sums over the row: warp shuffles, then the warps' partial sums through shared
//   memory. Many threads per row keep enough loads in flight: on an H200 (wan-1.3b, D = 1536,
//   4680 rows, float16, kernel trace) a GatedResidualLayerNorm takes 18.2 us with 4-element
//   accesses, 21.7 us with pairs, and took 46.9 us with one warp per row (24 pairs per lane held
//   in 127 registers).
// - GroupRow, for small D (the VAE's channels-last rows, D = 96 to 384, up to ~1.6 M rows): a
//   group of `lanes` threads of one warp per row (a power of two up to 32, passed by the host:
//   the fewest that hold at most GROUP_UNITS units each), GROUP_THREADS / lanes rows per block,
//   units of 16 bytes (V = 8 float16 or 4 float32), D <= 512. Sums are shuffles within the group
//   (no shared memory, no barrier). A row past the end keeps its threads in the shuffles but loads
//   and stores nothing. The VAE's BiasRmsNorm + SiLU per video (kernel trace): 125 ms with one
//   warp of pairs per row, 101 ms with this layout, 85 ms with the float16 SiLU below. Several
//   units per thread keep more bytes in flight, and no lane idles where D / V is not a power of
//   two: on an H200 (float16, kernel test), PrefixBiasRmsNorm of a two-frame cache before 4
//   frames of 480 x 832 x 96 takes 340.5 us with 4 lanes of 3 units against 464.4 us with 16
//   lanes of which 12 hold one unit, and BiasRmsNorm + SiLU of those 4 frames 242.1 against 341.2.
//
// Elementwise operators (BiasGelu) use only a layout's unit, over a grid-stride loop.

#define WARP 32
#define THREADS 128
#define WARPS (THREADS / WARP)
#define GROUP_THREADS 256
#define ROW_FLOATS 16
#define GROUP_UNITS 4

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

// V consecutive float32 / float16 values, loaded and stored as one access (V * 4 or V * 2 bytes).
template <int V>
struct alignas(V * 4) F32Unit {
    float f[V];
};
template <int V>
struct alignas(V * 2) F16Unit {
    unsigned int w[V / 2];
};

// Element type float32.
struct F32 {
    typedef float T;
    // Elements in 16 bytes: the group layout's unit.
    static constexpr int VEC = 4;
    // Hardware approximations of exp and division where the output allows (see silu).
    static constexpr bool FAST_MATH = false;
    template <int V>
    static __device__ __forceinline__ void load(const T* p, i64 i, float* out) {
        const F32Unit<V> v = *reinterpret_cast<const F32Unit<V>*>(p + i);
#pragma unroll
        for (int e = 0; e < V; ++e) {
            out[e] = v.f[e];
        }
    }
    template <int V>
    static __device__ __forceinline__ void store(T* p, i64 i, const float* in) {
        F32Unit<V> v;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            v.f[e] = in[e];
        }
        *reinterpret_cast<F32Unit<V>*>(p + i) = v;
    }
    static __device__ __forceinline__ float load1(const T* p, i64 i) { return p[i]; }
    // The value as it is stored.
    static __device__ __forceinline__ float stored(float v) { return v; }
};

// Element type float16 (IEEE half, as ONNX Runtime stores it), two per 32-bit word, the element
// of the lower index in the low half (little-endian).
struct F16 {
    typedef unsigned short T;
    static constexpr int VEC = 8;
    static constexpr bool FAST_MATH = true;
    template <int V>
    static __device__ __forceinline__ void load(const T* p, i64 i, float* out) {
        const F16Unit<V> v = *reinterpret_cast<const F16Unit<V>*>(p + i);
#pragma unroll
        for (int w = 0; w < V / 2; ++w) {
            out[2 * w] = h2f((unsigned short)(v.w[w] & 0xffffu));
            out[2 * w + 1] = h2f((unsigned short)(v.w[w] >> 16));
        }
    }
    template <int V>
    static __device__ __forceinline__ void store(T* p, i64 i, const float* in) {
        F16Unit<V> v;
#pragma unroll
        for (int w = 0; w < V / 2; ++w) {
            v.w[w] = (unsigned int)f2h(in[2 * w]) | ((unsigned int)f2h(in[2 * w + 1]) << 16);
        }
        *reinterpret_cast<F16Unit<V>*>(p + i) = v;
    }
    static __device__ __forceinline__ float load1(const T* p, i64 i) { return h2f(p[i]); }
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

// One block of THREADS threads per row, units of UNIT elements: BlockRow (pairs, any even D) and
// BlockQuad (4 elements, 8 or 16 bytes per access, for D a multiple of 4).
template <class E, int UNIT>
struct BlockRowOf {
    static constexpr int V = UNIT;
    static constexpr int MAX_UNITS = ROW_FLOATS / V;
    int width;
    __device__ __forceinline__ explicit BlockRowOf(int) : width(THREADS) {}
    __device__ __forceinline__ i64 row() const { return blockIdx.x; }
    __device__ __forceinline__ int thread() const { return threadIdx.x; }
    // The sum over the row's threads, in every thread; `shared` holds WARPS floats.
    __device__ __forceinline__ float sum(float v, float* shared) const {
        return block_sum(v, shared);
    }
};

template <class E>
using BlockRow = BlockRowOf<E, 2>;
template <class E>
using BlockQuad = BlockRowOf<E, 4>;

// A group of `lanes` threads (a power of two up to WARP) per row, GROUP_THREADS / lanes rows per
// block, units of 16 bytes.
template <class E>
struct GroupRow {
    static constexpr int V = E::VEC;
    static constexpr int MAX_UNITS = GROUP_UNITS;
    int width;
    __device__ __forceinline__ explicit GroupRow(int lanes) : width(lanes) {}
    __device__ __forceinline__ i64 row() const {
        return (i64)blockIdx.x * (GROUP_THREADS / width) + threadIdx.x / width;
    }
    __device__ __forceinline__ int thread() const { return threadIdx.x % width; }
    // Shuffles within the group: every thread of the warp takes part (the groups of a warp sum
    // at the same time, each over its own lanes).
    __device__ __forceinline__ float sum(float v, float*) const {
        for (int offset = width / 2; offset > 0; offset /= 2) {
            v += __shfl_xor_sync(0xffffffffu, v, offset);
        }
        return v;
    }
};

// Where a kernel reads and writes its rows: row r of the input at r * x_stride + x_offset; of the
// output at (r / y_block_rows) * y_batch_stride + y_offset + (r % y_block_rows) * d, i.e. blocks
// of y_block_rows rows placed y_batch_stride apart (QkvNormRopeCache writes the last T rows of
// each L-row batch entry of the cache). `contiguous` is plain rows of d.
struct RowIo {
    i64 x_stride, x_offset, y_block_rows, y_batch_stride, y_offset;
    static __device__ __forceinline__ RowIo contiguous(i64 rows, int d) {
        RowIo io = {d, 0, rows > 0 ? rows : 1, 0, 0};
        return io;
    }
    __device__ __forceinline__ i64 y_row(i64 row, int d) const {
        return (row / y_block_rows) * y_batch_stride + y_offset + (row % y_block_rows) * d;
    }
};

// SiLU as the contract writes it: n * sigmoid(n) = n / (1 + exp(-n)). For float16 outputs with
// the hardware's exp2 and reciprocal (__expf, __fdividef: a few float32 ulps, far below the half
// ulp of float16, 2^-11): the precise expf and division made the VAE's BiasRmsNorm compute-bound
// (1.5 TB/s over 4 · 480 · 832 rows of 96 on an H200). float32 keeps them precise.
template <class E>
__device__ __forceinline__ float silu(float n) {
    if (E::FAST_MATH) {
        return __fdividef(n, 1.0f + __expf(-n));
    }
    return n / (1.0f + expf(-n));
}

// GELU's tanh form: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))). For float16 outputs tanh is
// 1 - 2 / (1 + exp(2z)) with the hardware's exp and division (see silu); float32 keeps tanhf.
template <class E>
__device__ __forceinline__ float gelu(float v) {
    const float z = 0.7978845608f * (v + 0.044715f * v * v * v);
    float t;
    if (E::FAST_MATH) {
        t = 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * z));
    } else {
        t = tanhf(z);
    }
    return 0.5f * v * (1.0f + t);
}

// Stores a row held in registers as the row kernels hold it: thread t's units k * width + t of the
// row (those below `units`), a[k] each, at p[base + unit * V ..]. Nothing when `valid` is false
// (the group layout's rows past the end).
template <class E, class L>
__device__ __forceinline__ void store_row(typename E::T* __restrict__ p, i64 base,
                                          const float (&a)[L::MAX_UNITS][L::V], const L& lay,
                                          int units, bool valid) {
#pragma unroll
    for (int k = 0; k < L::MAX_UNITS; ++k) {
        const int u = k * lay.width + lay.thread();
        if (valid && u < units) {
            E::template store<L::V>(p, base + u * L::V, a[k]);
        }
    }
}

// BiasGelu, element by element in units of L::V (D a multiple of it, so a unit never crosses a
// row), grid-stride over the n elements.
template <class E, class L>
__device__ __forceinline__ void bias_gelu(const typename E::T* __restrict__ x,
                                          const typename E::T* __restrict__ bias,
                                          typename E::T* __restrict__ y, i64 n, int d) {
    constexpr int V = L::V;
    const i64 units = n / V;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 u = (i64)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += stride) {
        float xv[V], bv[V];
        E::template load<V>(x, u * V, xv);
        E::template load<V>(bias, (u * V) % d, bv);
#pragma unroll
        for (int e = 0; e < V; ++e) {
            xv[e] = gelu<E>(xv[e] + bv[e]);
        }
        E::template store<V>(y, u * V, xv);
    }
}

// Loads a row's units into `a` as the row kernels hold it (zeros past the row's end or for rows
// past the last, `valid` false). With BIAS, adds `bias` and returns the sum of the squares of this
// thread's elements; without, leaves the values as loaded and returns 0.
template <class E, bool BIAS, class L>
__device__ __forceinline__ float load_row(const typename E::T* __restrict__ x,
                                          const typename E::T* __restrict__ bias, i64 base,
                                          const L& lay, int units, bool valid,
                                          float (&a)[L::MAX_UNITS][L::V]) {
    constexpr int V = L::V;
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < L::MAX_UNITS; ++k) {
        const int u = k * lay.width + lay.thread();
#pragma unroll
        for (int e = 0; e < V; ++e) {
            a[k][e] = 0.0f;
        }
        if (valid && u < units) {
            E::template load<V>(x, base + u * V, a[k]);
            if (BIAS) {
                float bv[V];
                E::template load<V>(bias, u * V, bv);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    a[k][e] += bv[e];
                    squares += a[k][e] * a[k][e];
                }
            }
        }
    }
    return squares;
}

// The N table entries of a row's pairs first .. first + N - 1 (columns modulo half_hd) from the
// row of `table` at table_row: with `consecutive` (half_hd a multiple of N, so the N columns are
// consecutive ones of one head) as one access of N elements, else one by one.
template <class E, int N>
__device__ __forceinline__ void load_pairs(const typename E::T* __restrict__ table, i64 table_row,
                                           int first, int half_hd, bool consecutive, float* out) {
    if constexpr (N > 1) {
        if (consecutive) {
            E::template load<N>(table, table_row + first % half_hd, out);
            return;
        }
    }
#pragma unroll
    for (int p = 0; p < N; ++p) {
        out[p] = E::load1(table, table_row + (first + p) % half_hd);
    }
}

// BiasRmsNorm and, with ROPE, BiasRmsNormRope, on the row layout L:
//   v = x + bias; u = v / sqrt(mean(v^2) + eps) * weight;
//   not ROPE: y = u, or silu(u) when `act_silu` is nonzero;
//   ROPE: pair p (elements 2p, 2p+1) turns by table row t = row % table_rows, column
//   j = p % half_hd: y[2p] = u[2p] cos - u[2p+1] sin, y[2p+1] = u[2p] sin + u[2p+1] cos.
// Row `row` is read at x[row * io.x_stride + io.x_offset ..] and written at y[io.y_row(row) ..].
template <class E, class L, bool ROPE>
__device__ __forceinline__ void bias_rms_norm(const typename E::T* __restrict__ x,
                                              const typename E::T* __restrict__ bias,
                                              const typename E::T* __restrict__ weight,
                                              const typename E::T* __restrict__ cos_table,
                                              const typename E::T* __restrict__ sin_table,
                                              typename E::T* __restrict__ y, i64 rows, int d,
                                              float eps, int act_silu, int half_hd,
                                              i64 table_rows, int lanes, RowIo io) {
    constexpr int V = L::V;
    constexpr int U = L::MAX_UNITS;
    __shared__ float partial[WARPS];
    const L lay(lanes);
    const i64 row = lay.row();
    // False only for the group layout's rows past the end, whose threads still shuffle.
    const bool valid = row < rows;
    const int t = lay.thread();
    const int units = d / V;
    const i64 base = row * io.x_stride + io.x_offset;
    const i64 y_base = io.y_row(row, d);
    float a[U][V];
    const float squares = lay.sum(load_row<E, true>(x, bias, base, lay, units, valid, a), partial);
    const float inv = 1.0f / sqrtf(squares / (float)d + eps);
    const i64 table_row = ROPE ? (row % table_rows) * half_hd : 0;
    // A unit's pairs are consecutive columns of one head where half_hd is a multiple of them.
    const bool unit_tables = ROPE && half_hd % (V / 2) == 0;
    // The outputs into `a` first, then the stores: a load after a store in the same loop would
    // wait for the memory round trip once per unit instead of once per row.
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int u = k * lay.width + t;
        if (valid && u < units) {
            float wv[V];
            E::template load<V>(weight, u * V, wv);
            // The rotation's cos and sin of the unit's V / 2 pairs.
            float cv[V / 2], sv[V / 2];
            if (ROPE) {
                const int first = (u * V) / 2;
                load_pairs<E, V / 2>(cos_table, table_row, first, half_hd, unit_tables, cv);
                load_pairs<E, V / 2>(sin_table, table_row, first, half_hd, unit_tables, sv);
            }
#pragma unroll
            for (int e = 0; e < V; e += 2) {
                const float u0 = a[k][e] * inv * wv[e];
                const float u1 = a[k][e + 1] * inv * wv[e + 1];
                if (ROPE) {
                    const float c = cv[e / 2];
                    const float s = sv[e / 2];
                    a[k][e] = u0 * c - u1 * s;
                    a[k][e + 1] = u0 * s + u1 * c;
                } else if (act_silu) {
                    a[k][e] = silu<E>(u0);
                    a[k][e + 1] = silu<E>(u1);
                } else {
                    a[k][e] = u0;
                    a[k][e + 1] = u1;
                }
            }
        }
    }
    store_row<E>(y, y_base, a, lay, units, valid);
}

// Copies row `row` of x to y, rows placed as in bias_rms_norm.
template <class E, class L>
__device__ __forceinline__ void copy_rows(const typename E::T* __restrict__ x,
                                          typename E::T* __restrict__ y, i64 rows, int d,
                                          int lanes, RowIo io) {
    constexpr int V = L::V;
    constexpr int U = L::MAX_UNITS;
    const L lay(lanes);
    const i64 row = lay.row();
    if (row >= rows) {
        return;
    }
    const int t = lay.thread();
    const int units = d / V;
    const i64 base = row * io.x_stride + io.x_offset;
    const i64 y_base = io.y_row(row, d);
    float a[U][V];
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int u = k * lay.width + t;
        if (u < units) {
            E::template load<V>(x, base + u * V, a[k]);
        }
    }
    store_row<E>(y, y_base, a, lay, units, true);
}

// PrefixBiasRmsNorm on the row layout L, one launch for the whole output: row r of Y (P + N
// rows) is row r of `prefix` for r < P, else BiasRmsNorm (+ SiLU) of row r - P of x; the last P
// rows of Y also go to `tail`. Prefix rows take part in the row sums (the group layout's shuffles
// need every lane of the warp) but keep their values.
template <class E, class L>
__device__ __forceinline__ void prefix_bias_rms_norm(const typename E::T* __restrict__ x,
                                                     const typename E::T* __restrict__ bias,
                                                     const typename E::T* __restrict__ weight,
                                                     const typename E::T* __restrict__ prefix,
                                                     typename E::T* __restrict__ y,
                                                     typename E::T* __restrict__ tail,
                                                     i64 rows, int d, float eps,
                                                     i64 prefix_rows, int act_silu, int lanes) {
    constexpr int V = L::V;
    constexpr int U = L::MAX_UNITS;
    __shared__ float partial[WARPS];
    const L lay(lanes);
    const i64 row = lay.row();
    const i64 out_rows = rows + prefix_rows;
    const bool valid = row < out_rows;
    const bool copied = row < prefix_rows;
    const int t = lay.thread();
    const int units = d / V;
    const i64 base = (copied ? row : row - prefix_rows) * d;
    float a[U][V];
    const float squares = lay.sum(copied ? load_row<E, false>(prefix, bias, base, lay, units, valid, a)
                                         : load_row<E, true>(x, bias, base, lay, units, valid, a),
                                  partial);
    if (!copied) {
        const float inv = 1.0f / sqrtf(squares / (float)d + eps);
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const int u = k * lay.width + t;
            if (valid && u < units) {
                float wv[V];
                E::template load<V>(weight, u * V, wv);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float n = a[k][e] * inv * wv[e];
                    a[k][e] = act_silu ? silu<E>(n) : n;
                }
            }
        }
    }
    store_row<E>(y, row * d, a, lay, units, valid);
    const i64 tail_row = row - (out_rows - prefix_rows);
    store_row<E>(tail, tail_row * d, a, lay, units, valid && tail_row >= 0);
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
    i64 gate_div, i64 scale_div, i64 shift_div, int lanes) {
    constexpr int V = L::V;
    constexpr int U = L::MAX_UNITS;
    // One array per sum: consecutive block sums need no barrier between them.
    __shared__ float partial_sum[WARPS];
    __shared__ float partial_squares[WARPS];
    const L lay(lanes);
    const i64 row = lay.row();
    const bool valid = row < rows;
    const int t = lay.thread();
    const int units = d / V;
    const i64 base = row * d;
    const i64 gate_base = (row / gate_div) * d;
    const i64 scale_base = (row / scale_div) * d;
    const i64 shift_base = (row / shift_div) * d;
    float a[U][V];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int u = k * lay.width + t;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            a[k][e] = 0.0f;
        }
        if (valid && u < units) {
            float xv[V], bv[V], gv[V];
            E::template load<V>(r, base + u * V, a[k]);
            E::template load<V>(x, base + u * V, xv);
            E::template load<V>(bias, u * V, bv);
            E::template load<V>(gate, gate_base + u * V, gv);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                a[k][e] = E::stored(a[k][e] + (xv[e] + bv[e]) * gv[e]);
                sum += a[k][e];
            }
        }
    }
    const float mean = lay.sum(sum, partial_sum) / (float)d;
    // S is stored here, after the loads of the row: see bias_rms_norm.
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int u = k * lay.width + t;
        if (valid && u < units) {
            E::template store<V>(out_s, base + u * V, a[k]);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float dv = a[k][e] - mean;
                squares += dv * dv;
            }
        }
    }
    const float inv = 1.0f / sqrtf(lay.sum(squares, partial_squares) / (float)d + eps);
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int u = k * lay.width + t;
        if (valid && u < units) {
            float sc[V], sh[V];
            E::template load<V>(scale, scale_base + u * V, sc);
            E::template load<V>(shift, shift_base + u * V, sh);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                a[k][e] = (a[k][e] - mean) * inv * sc[e] + sh[e];
            }
        }
    }
    store_row<E>(y, base, a, lay, units, valid);
}

// Entry points, one per operator, element type and row layout, no dynamic shared memory; `lanes`
// is the group layout's threads per row (the block layouts ignore it). BlockRow (SUFFIX f32,
// f16) and BlockQuad (f32_q, f16_q): blocks of THREADS threads, one per row. GroupRow (SUFFIX
// f32_g, f16_g): blocks of GROUP_THREADS threads, ceil(rows / (GROUP_THREADS / lanes)) of them.
// Every entry point takes rows, d and eps after its pointers (the launch's one convention; the
// elementwise bias_gelu ignores eps and lanes).
#define ENTRY_POINTS(E, L, BLOCK, SUFFIX, T)                                                   \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_bias_rms_norm_rope_##SUFFIX(const T* x, const T* bias, const T* weight,         \
                                           const T* cos_table, const T* sin_table, T* y,       \
                                           i64 rows, int d, float eps, int half_hd,            \
                                           i64 table_rows, int lanes) {                        \
        bias_rms_norm<E, L<E>, true>(x, bias, weight, cos_table, sin_table, y, rows, d, eps,   \
                                     0, half_hd, table_rows, lanes,                            \
                                     RowIo::contiguous(rows, d));                              \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_bias_rms_norm_##SUFFIX(const T* x, const T* bias, const T* weight, T* y,        \
                                      i64 rows, int d, float eps, int act_silu, int lanes) {   \
        bias_rms_norm<E, L<E>, false>(x, bias, weight, 0, 0, y, rows, d, eps, act_silu, 1, 1,  \
                                      lanes, RowIo::contiguous(rows, d));                      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                        \
        unstep_gated_residual_layer_norm_##SUFFIX(                                             \
            const T* r, const T* x, const T* bias, const T* gate, const T* scale,              \
            const T* shift, T* out_s, T* y, i64 rows, int d, float eps, i64 gate_div,          \
            i64 scale_div, i64 shift_div, int lanes) {                                         \
        gated_residual_layer_norm<E, L<E>>(r, x, bias, gate, scale, shift, out_s, y, rows, d,  \
                                           eps, gate_div, scale_div, shift_div, lanes);        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK) unstep_prefix_bias_rms_norm_##SUFFIX(  \
        const T* x, const T* bias, const T* weight, const T* prefix, T* y, T* tail, i64 rows,  \
        int d, float eps, i64 prefix_rows, int act_silu, int lanes) {                          \
        prefix_bias_rms_norm<E, L<E>>(x, bias, weight, prefix, y, tail, rows, d, eps,          \
                                      prefix_rows, act_silu, lanes);                           \
    }                                                                                          \
    /* Elementwise: the layout gives only its unit; grid-stride blocks (row_launch.rs). */   \
    extern "C" __global__ void __launch_bounds__(BLOCK) unstep_bias_gelu_##SUFFIX(             \
        const T* x, const T* bias, T* y, i64 rows, int d, float eps, int lanes) {              \
        bias_gelu<E, L<E>>(x, bias, y, rows * d, d);                                           \
    }                                                                                          \
    /* grid.y = 3: Q, then K (rope, into the cache), then V (copied into the cache). */       \
    extern "C" __global__ void __launch_bounds__(BLOCK) unstep_qkv_norm_rope_cache_##SUFFIX(   \
        const T* qkv, const T* q_bias, const T* k_bias, const T* q_weight, const T* k_weight,  \
        const T* cos_table, const T* sin_table, T* k_cache, T* v_cache, T* q, i64 rows, int d, \
        float eps, int half_hd, i64 table_rows, i64 block_rows, i64 cache_rows, int lanes) {   \
        const RowIo q_io = {3 * (i64)d, 0, rows, 0, 0};                                        \
        RowIo cache_io = {3 * (i64)d, d, block_rows, cache_rows * d,                           \
                          (cache_rows - block_rows) * d};                                      \
        if (blockIdx.y == 0) {                                                                 \
            bias_rms_norm<E, L<E>, true>(qkv, q_bias, q_weight, cos_table, sin_table, q, rows, \
                                         d, eps, 0, half_hd, table_rows, lanes, q_io);         \
        } else if (blockIdx.y == 1) {                                                          \
            bias_rms_norm<E, L<E>, true>(qkv, k_bias, k_weight, cos_table, sin_table, k_cache, \
                                         rows, d, eps, 0, half_hd, table_rows, lanes,          \
                                         cache_io);                                            \
        } else {                                                                               \
            cache_io.x_offset = 2 * (i64)d;                                                    \
            copy_rows<E, L<E>>(qkv, v_cache, rows, d, lanes, cache_io);                        \
        }                                                                                      \
    }

ENTRY_POINTS(F32, BlockRow, THREADS, f32, float)
ENTRY_POINTS(F16, BlockRow, THREADS, f16, unsigned short)
ENTRY_POINTS(F32, BlockQuad, THREADS, f32_q, float)
ENTRY_POINTS(F16, BlockQuad, THREADS, f16_q, unsigned short)
ENTRY_POINTS(F32, GroupRow, GROUP_THREADS, f32_g, float)
ENTRY_POINTS(F16, GroupRow, GROUP_THREADS, f16_g, unsigned short)

// Attention's last rows from `parts` partial results over disjoint runs of the keys (attention.rs):
// runs [parts, rows, heads * hd] (float16, one run's rows after the other's), lse [parts, heads,
// rows] (float32, the natural log-sum-exp of each run's scaled scores), out [rows, heads * hd].
// With m the largest lse_p of a row and head and w_p = exp(lse_p - m):
// out = sum_p w_p * run_p / sum_p w_p, in float32, rounded once. One warp per row and head; a
// lane holds pairs of the head's hd elements (hd even, up to 256).
#define MERGE_MAX_PARTS 8
#define MERGE_THREADS 256
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) unstep_attention_merge_f16(
    const unsigned short* runs, const float* lse, unsigned short* out, int parts, i64 rows,
    int heads, int hd) {
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    const int lane = threadIdx.x % WARP;
    if (item >= rows * heads) return;
    const i64 r = item / heads;
    const int h = (int)(item % heads);
    const i64 d = (i64)heads * hd;
    // The loops over the runs are unrolled to MERGE_MAX_PARTS, so that w stays in registers.
    float w[MERGE_MAX_PARTS];
    float m = lse[(i64)h * rows + r];
#pragma unroll
    for (int p = 1; p < MERGE_MAX_PARTS; ++p) {
        if (p < parts) m = fmaxf(m, lse[((i64)p * heads + h) * rows + r]);
    }
    float total = 0.0f;
#pragma unroll
    for (int p = 0; p < MERGE_MAX_PARTS; ++p) {
        w[p] = p < parts ? expf(lse[((i64)p * heads + h) * rows + r] - m) : 0.0f;
        total += w[p];
    }
    const float inv = 1.0f / total;
    for (int c = 2 * lane; c < hd; c += 2 * WARP) {
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int p = 0; p < MERGE_MAX_PARTS; ++p) {
            if (p < parts) {
                const unsigned int pair =
                    *(const unsigned int*)(runs + ((i64)p * rows + r) * d + (i64)h * hd + c);
                a += w[p] * h2f((unsigned short)(pair & 0xffff));
                b += w[p] * h2f((unsigned short)(pair >> 16));
            }
        }
        *(unsigned int*)(out + r * d + (i64)h * hd + c) =
            (unsigned int)f2h(a * inv) | ((unsigned int)f2h(b * inv) << 16);
    }
}

// MatMulFp8's rows of X quantised to float8 E4M3 (gemm.rs, ops/matmul_fp8.rs): x [rows, k]
// (float16, k a multiple of 8, rows aligned to 16 bytes), codes [rows, k] (bytes), scales [rows]
// (float32). With a = max |x| over the row: scale = a / 448 and code = e4m3(x * (448 / a)),
// rounded to nearest even and saturated (PTX cvt.rn.satfinite.e4m3x2.f32, compute capability 8.9
// and later; below it the kernel traps: the host refuses those devices first); a row of zeros
// gives scale 0 and codes 0. One block of QUANT_THREADS per row, 8 elements (16 bytes) per access;
// the second pass reads the row again (from L1 or L2: 17.5 KiB at k = 8960).
#define QUANT_THREADS 256
#define E4M3_MAX 448.0f

// 8 float16 (one load) and 8 codes (one store).
struct alignas(16) Halves8 {
    unsigned int w[4];
};
struct alignas(8) Codes8 {
    unsigned int w[2];
};

__device__ __forceinline__ unsigned int e4m3x2(float lo, float hi) {
    unsigned short pair;
#if __CUDA_ARCH__ >= 890
    // The first source goes to the upper byte.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
#else
    pair = 0;
    asm("trap;");
#endif
    return pair;
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS) unstep_quantize_e4m3_rows_f16(
    const unsigned short* x, unsigned char* codes, float* scales, i64 rows, int k) {
    __shared__ float partial[QUANT_THREADS / WARP];
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const Halves8* row = reinterpret_cast<const Halves8*>(x + r * k);
    const int units = k / 8;
    float a = 0.0f;
    for (int u = threadIdx.x; u < units; u += QUANT_THREADS) {
        const Halves8 v = row[u];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned int w = v.w[i];
            a = fmaxf(a, fabsf(h2f((unsigned short)(w & 0xffffu))));
            a = fmaxf(a, fabsf(h2f((unsigned short)(w >> 16))));
        }
    }
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    }
    if (threadIdx.x % WARP == 0) partial[threadIdx.x / WARP] = a;
    __syncthreads();
    a = partial[0];
#pragma unroll
    for (int i = 1; i < QUANT_THREADS / WARP; ++i) a = fmaxf(a, partial[i]);
    const float inv = a > 0.0f ? E4M3_MAX / a : 0.0f;
    if (threadIdx.x == 0) scales[r] = a / E4M3_MAX;
    Codes8* out = reinterpret_cast<Codes8*>(codes + r * k);
    for (int u = threadIdx.x; u < units; u += QUANT_THREADS) {
        const Halves8 v = row[u];
        unsigned int pairs[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            pairs[i] = e4m3x2(h2f((unsigned short)(v.w[i] & 0xffffu)) * inv,
                              h2f((unsigned short)(v.w[i] >> 16)) * inv);
        }
        Codes8 c;
        c.w[0] = pairs[0] | (pairs[1] << 16);
        c.w[1] = pairs[2] | (pairs[3] << 16);
        out[u] = c;
    }
}
