// The kernels of `Attention` with `precision = int8` (the 8-bit attention; the contract is in
// ops/attention.rs). Compiled by NVRTC for sm_90a (the wgmma instructions of Hopper), apart from
// kernels.cu, which stays plain sm_XX. Header-free, as kernels.cu is.
//
// A call runs five kernels on the compute stream:
//   1. unstep_att8_stats_f16: per split of the keys, the sum of K and the largest |V| of every
//      channel (partial results; no atomics, so a call's result does not depend on the order in
//      which blocks ran).
//   2. unstep_att8_stats_reduce: K's mean over the keys and V's scale (max |V| / 448) per channel,
//      the splits summed in order.
//   3. unstep_att8_quant_q_f16: Q to int8, one scale per 16 rows of a head (a warp's rows in the
//      attention kernel).
//   4. unstep_att8_quant_k_f16: K minus its mean over the keys (which leaves every row's softmax
//      unchanged: it subtracts the same q·mean from each of the row's scores) to int8, one scale
//      per 64 keys of a head.
//   5. unstep_att8_quant_v_f16: V to float8 e4m3 with its channel's scale, transposed to
//      [head, channel, key] (the wgmma B operand of P·V must be K-major: keys contiguous) and
//      with the keys of every 16 permuted (PERM16 below) so that the attention kernel can feed
//      its score accumulators to P·V as they lie in registers.
//   6. unstep_att8_fwd_wg{1,2}: the attention. A thread block of 1 or 2 warpgroups, 64 query
//      rows each, over tiles of 128 keys: S = Q·Kᵀ by wgmma (int8, int32 accumulators), scaled to
//      the log2 domain, online softmax in float32, P = 2^(S − m) scaled by 448 to e4m3, and
//      O += P·V by wgmma (e4m3, float32 accumulators). The row sum l is of P before it is
//      rounded. O = acc · vscale / (448 · l).
//
// Layouts in device memory (padded: S to a multiple of 128 rows, L to a multiple of 128 keys,
// padding zero):
//   qq [B, H, Spad, 128] int8, qscale [B, H, Spad / 16] float
//   kq [B, H, Lpad, 128] int8, kscale [B, H, Lpad / 64] float
//   vt [B, H, 128, Lpad] e4m3 (keys permuted within each 16), vscale [B, D] float, kmean [B, D]
// Shared memory tiles are rows of 128 bytes in the 128-byte swizzle of wgmma's descriptors (the
// 16-byte chunk c of row r stored at chunk c ^ (r % 8)), each tile 1024-byte aligned.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define WARP 32
#define HD 128
#define KEY_TILE 128
#define Q_GROUP 16
#define K_GROUP 64
#define QUANT_ROWS 64
#define QUANT_THREADS 256
#define STATS_THREADS 256
#define P_SCALE 448.0f
#define I8_MAX 127.0f
#define E4M3_MAX 448.0f
#define TILE_BYTES (KEY_TILE * HD)
#define KMEAN_STRIDE 8

// Position p of a 16-key group in vt holds key PERM16(p): the order in which a thread's score
// accumulators (keys 2q, 2q + 1, 8 + 2q, 8 + 2q + 1 of the group, q = lane % 4) meet the e4m3
// A fragment of wgmma (positions 4q to 4q + 3).
#define PERM16(p) ((((p) & 3) < 2) ? (2 * ((p) >> 2) + ((p) & 3)) : (8 + 2 * ((p) >> 2) + ((p) & 3) - 2))

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two e4m3 codes, lo in the lower byte (round to nearest even, saturated at ±448).
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
}

__device__ __forceinline__ u32 e4m3x4(float x0, float x1, float x2, float x3) {
    return e4m3x2(x0, x1) | (e4m3x2(x2, x3) << 16);
}

__device__ __forceinline__ u32 i8x4(float x0, float x1, float x2, float x3) {
    return ((u32)(__float2int_rn(x0) & 0xff)) | ((u32)(__float2int_rn(x1) & 0xff) << 8) |
           ((u32)(__float2int_rn(x2) & 0xff) << 16) | ((u32)(__float2int_rn(x3) & 0xff) << 24);
}

struct alignas(16) U32x4 {
    u32 w[4];
};

// The largest of v over groups of `group` consecutive threads of the block (a multiple of 32).
__device__ __forceinline__ float group_max(float v, float* red, int group) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    const int warp = threadIdx.x / WARP;
    if (threadIdx.x % WARP == 0) red[warp] = v;
    __syncthreads();
    const int per = group / WARP;
    const int first = warp / per * per;
    float m = 0.0f;
    for (int i = 0; i < per; ++i) m = fmaxf(m, red[first + i]);
    return m;
}

// 32 float16 values at p (64 bytes, 16-byte aligned) as float32.
__device__ __forceinline__ void load32(const u16* p, float* x) {
    const U32x4* v = reinterpret_cast<const U32x4*>(p);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const U32x4 w = v[u];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[8 * u + 2 * i] = h2f((u16)(w.w[i] & 0xffffu));
            x[8 * u + 2 * i + 1] = h2f((u16)(w.w[i] >> 16));
        }
    }
}

// The int8 codes of x[0..32] · inv at dst (32 bytes, 16-byte aligned).
__device__ __forceinline__ void store_i8x32(i8* dst, const float* x, float inv) {
    U32x4* out = reinterpret_cast<U32x4*>(dst);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        U32x4 w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* s = x + 16 * u + 4 * i;
            w.w[i] = i8x4(s[0] * inv, s[1] * inv, s[2] * inv, s[3] * inv);
        }
        out[u] = w;
    }
}

// 1. Grid (H, splits, B), STATS_THREADS threads: thread t reads 8 channels (16 bytes) of its
// head, (t % 16) · 8 to + 8, of the keys l0 + t / 16, l0 + t / 16 + 16, ... of its split (K only
// at multiples of KMEAN_STRIDE; rows_per_split is a multiple of 16); the 16 rows' partial results
// are then added in order through shared memory.
extern "C" __global__ void __launch_bounds__(STATS_THREADS) unstep_att8_stats_f16(
    const u16* k, const u16* v, float* ksum_part, float* vmax_part, int L, int D,
    i64 kv_batch_stride, int rows_per_split) {
    __shared__ float sums[16][HD];
    __shared__ float maxes[16][HD];
    const int h = blockIdx.x, split = blockIdx.y, b = blockIdx.z, splits = gridDim.y;
    const int t = threadIdx.x, c0 = (t % 16) * 8, lane_row = t / 16;
    const int l0 = split * rows_per_split;
    const int l1 = min(L, l0 + rows_per_split);
    const u16* kb = k + b * kv_batch_stride + h * HD + c0;
    const u16* vb = v + b * kv_batch_stride + h * HD + c0;
    float s[8], m[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = m[i] = 0.0f;
    const bool sampled = lane_row % KMEAN_STRIDE == 0;
    for (int l = l0 + lane_row; l < l1; l += 16) {
        const U32x4 vw = *reinterpret_cast<const U32x4*>(vb + (i64)l * D);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            m[2 * i] = fmaxf(m[2 * i], fabsf(h2f((u16)(vw.w[i] & 0xffffu))));
            m[2 * i + 1] = fmaxf(m[2 * i + 1], fabsf(h2f((u16)(vw.w[i] >> 16))));
        }
        if (sampled) {
            const U32x4 kw = *reinterpret_cast<const U32x4*>(kb + (i64)l * D);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[2 * i] += h2f((u16)(kw.w[i] & 0xffffu));
                s[2 * i + 1] += h2f((u16)(kw.w[i] >> 16));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        sums[lane_row][c0 + i] = s[i];
        maxes[lane_row][c0 + i] = m[i];
    }
    __syncthreads();
    if (t < HD) {
        float a = 0.0f, x = 0.0f;
        for (int r = 0; r < 16; ++r) {
            a += sums[r][t];
            x = fmaxf(x, maxes[r][t]);
        }
        const i64 at = ((i64)b * splits + split) * D + h * HD + t;
        ksum_part[at] = a;
        vmax_part[at] = x;
    }
}

// 2. One thread per (batch, channel): kmean = Σ_splits ksum / ⌈L / KMEAN_STRIDE⌉ (the keys
// summed), vscale = max vmax / 448.
extern "C" __global__ void __launch_bounds__(STATS_THREADS) unstep_att8_stats_reduce(
    const float* ksum_part, const float* vmax_part, float* kmean, float* vscale, int splits,
    int L, int D, int batch) {
    const i64 i = (i64)blockIdx.x * STATS_THREADS + threadIdx.x;
    if (i >= (i64)batch * D) return;
    const i64 b = i / D, c = i % D;
    float s = 0.0f, m = 0.0f;
    for (int p = 0; p < splits; ++p) {
        s += ksum_part[(b * splits + p) * D + c];
        m = fmaxf(m, vmax_part[(b * splits + p) * D + c]);
    }
    kmean[i] = s / (float)((L + KMEAN_STRIDE - 1) / KMEAN_STRIDE);
    vscale[i] = m / E4M3_MAX;
}

// 3. Grid (Spad / 64, H, B), QUANT_THREADS threads: thread t holds row t / 4 of the block's 64
// and channels (t % 4) * 32 to + 32 of its head; one scale per 16 rows (64 threads).
extern "C" __global__ void __launch_bounds__(QUANT_THREADS) unstep_att8_quant_q_f16(
    const u16* q, i8* qq, float* qscale, int S, int Spad, int D, i64 q_batch_stride) {
    __shared__ float red[QUANT_THREADS / WARP];
    const int h = blockIdx.y, b = blockIdx.z, H = gridDim.y;
    const int t = threadIdx.x, c0 = (t % 4) * 32;
    const int row = blockIdx.x * QUANT_ROWS + t / 4;
    float x[32];
    if (row < S) {
        load32(q + b * q_batch_stride + (i64)row * D + h * HD + c0, x);
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) x[i] = 0.0f;
    }
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) a = fmaxf(a, fabsf(x[i]));
    a = group_max(a, red, 64);
    const float inv = a > 0.0f ? I8_MAX / a : 0.0f;
    const i64 bh = (i64)b * H + h;
    if (t % 64 == 0) qscale[bh * (Spad / Q_GROUP) + row / Q_GROUP] = a / I8_MAX;
    store_i8x32(qq + (bh * Spad + row) * HD + c0, x, inv);
}

// 4. Grid (Lpad / 64, H, B), QUANT_THREADS threads, as 3 with one scale per 64 keys.
extern "C" __global__ void __launch_bounds__(QUANT_THREADS) unstep_att8_quant_k_f16(
    const u16* k, const float* kmean, i8* kq, float* kscale, int L, int Lpad, int D,
    i64 kv_batch_stride) {
    __shared__ float red[QUANT_THREADS / WARP];
    const int h = blockIdx.y, b = blockIdx.z, H = gridDim.y;
    const int t = threadIdx.x, c0 = (t % 4) * 32;
    const int row = blockIdx.x * QUANT_ROWS + t / 4;
    float x[32];
    if (row < L) {
        load32(k + b * kv_batch_stride + (i64)row * D + h * HD + c0, x);
        const float* mean = kmean + (i64)b * D + h * HD + c0;
#pragma unroll
        for (int i = 0; i < 32; ++i) x[i] -= mean[i];
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) x[i] = 0.0f;
    }
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) a = fmaxf(a, fabsf(x[i]));
    a = group_max(a, red, QUANT_THREADS);
    const float inv = a > 0.0f ? I8_MAX / a : 0.0f;
    const i64 bh = (i64)b * H + h;
    if (t == 0) kscale[bh * (Lpad / K_GROUP) + blockIdx.x] = a / I8_MAX;
    store_i8x32(kq + (bh * Lpad + row) * HD + c0, x, inv);
}

// 5. Grid (Lpad / 64, H, B), QUANT_THREADS threads: the block's 64 keys of one head through
// shared memory; thread t writes channel t / 2, positions (t % 2) * 32 to + 32 of the block.
extern "C" __global__ void __launch_bounds__(QUANT_THREADS) unstep_att8_quant_v_f16(
    const u16* v, const float* vscale, u8* vt, int L, int Lpad, int D, i64 kv_batch_stride) {
    __shared__ u16 tile[QUANT_ROWS][HD + 2];
    const int h = blockIdx.y, b = blockIdx.z, H = gridDim.y;
    const int t = threadIdx.x;
    {
        const int r = t / 4, c0 = (t % 4) * 32;
        const int row = blockIdx.x * QUANT_ROWS + r;
        if (row < L) {
            const U32x4* src =
                reinterpret_cast<const U32x4*>(v + b * kv_batch_stride + (i64)row * D + h * HD + c0);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const U32x4 w = src[u];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    tile[r][c0 + 8 * u + 2 * i] = (u16)(w.w[i] & 0xffffu);
                    tile[r][c0 + 8 * u + 2 * i + 1] = (u16)(w.w[i] >> 16);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; ++i) tile[r][c0 + i] = 0;
        }
    }
    __syncthreads();
    const int d = t / 2, first = (t % 2) * 32;
    const float s = vscale[(i64)b * D + h * HD + d];
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    float x[32];
#pragma unroll
    for (int p = 0; p < 32; ++p) {
        const int pos = first + p;
        x[p] = h2f(tile[(pos & ~15) + PERM16(pos & 15)][d]) * inv;
    }
    const i64 bh = (i64)b * H + h;
    U32x4* out = reinterpret_cast<U32x4*>(vt + (bh * HD + d) * Lpad + blockIdx.x * QUANT_ROWS + first);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        U32x4 w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* y = x + 16 * u + 4 * i;
            w.w[i] = e4m3x4(y[0], y[1], y[2], y[3]);
        }
        out[u] = w;
    }
}

// ---- wgmma on sm_90a ----

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Orders the mbarriers' initialisation before the bulk copies (the async proxy) use them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A wgmma descriptor of a K-major tile of rows of 128 bytes in the 128-byte swizzle: start
// address / 16 (bits 0-13), leading byte offset 16 (unused by this layout; bits 16-29), stride
// byte offset 1024, the distance between groups of 8 rows (bits 32-45), swizzle mode 1 = 128
// bytes (bits 62-63).
__device__ __forceinline__ u64 sw128_desc(u32 addr) {
    return (u64)((addr & 0x3ffff) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma
// fence or wait.
__device__ __forceinline__ void reg_fence(int& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The 64 accumulator registers of an m64n128 wgmma: their place in the instruction, and the
// operands that bind them (int32 scores, float32 output).
#define WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_OPS_S32(d) \
    "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
    "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
    "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
    "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), \
    "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), \
    "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), \
    "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), \
    "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
#define WG_OPS_F32(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 int32 per thread) = or += A·B: A 64 rows × 32 int8 (descriptor), B 128 × 32 int8
// (descriptor), both K-major.
__device__ __forceinline__ void wgmma_s8(int* d, u64 a, u64 b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " WG_D64 ", %64, %65, p;\n}\n"
        : WG_OPS_S32(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 float32 per thread) += A·B: A 64 rows × 32 e4m3 in registers, B 128 × 32 e4m3
// (descriptor, K-major).
__device__ __forceinline__ void wgmma_e4m3(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : WG_OPS_F32(d)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
}

// ---- The attention, pipelined: bulk tensor copies and mbarriers ----
//
// A thread block of 2 consumer warpgroups (64 query rows each) and one producer warpgroup, whose
// registers go to the consumers (setmaxnreg: a wgmma kernel's registers are allotted by
// warpgroups, so a lone producer warp would cost as many). The producer's first thread copies Q once and then the K and Vᵀ tiles of 128 keys into ATT_STAGES
// slots with the bulk tensor copy engine, each slot's arrival counted on its `full` mbarrier; the
// consumers free a slot by arriving on its `empty` mbarrier. So the two warpgroups run apart,
// one's softmax beside the other's matrix products. Within a warpgroup, the product Q·Kᵀ of the
// next tile is issued before P·V of this one, and the softmax of the next tile runs while P·V is
// in flight.

#define ATT_STAGES 4
#define ATT_WGS 2
#define ATT_THREADS (128 * ATT_WGS + 128)

// A CUtensorMap, passed by value (its layout is the driver's).
struct alignas(64) TensorMap {
    u64 opaque[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// A box of the tensor map at coordinates (x, y) into shared memory at dst, counted on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int x, int y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// The magic-number conversion of an int32 |s| < 2^22 to float: as_float(s + MAGIC_I) = MAGIC_F + s
// exactly. One integer add in place of a conversion, which runs at a quarter of the rate.
#define MAGIC_I 0x4B400000
#define MAGIC_F 12582912.0f

// The scores of one tile (S as wgmma left them) to P, in place (s then holds float32 bits): the
// row maxima m0 and m1 move to include this tile, alpha0 and alpha1 are the factors by which the
// earlier sums shrink, and l0 and l1 take the new weights. P is scaled by 448 for its e4m3 codes
// (2^(x + log2 448) = 448 · 2^x, so the scale costs nothing; l carries it too).
template <bool EDGE>
__device__ __forceinline__ void att8_softmax(int* s, float sc0, float sc1, int k0, int L, int qd,
                                             float& m0, float& m1, float& l0, float& l1,
                                             float& alpha0, float& alpha1) {
    constexpr bool edge = EDGE;
    if constexpr (edge) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = k0 + 8 * j + 2 * qd;
            if (col >= L) s[4 * j] = s[4 * j + 2] = -(1 << 22) + 1;
            if (col + 1 >= L) s[4 * j + 1] = s[4 * j + 3] = -(1 << 22) + 1;
        }
    }
    int a0 = s[0], b0 = s[32], a1 = s[2], b1 = s[34];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        a0 = max(a0, max(s[4 * j], s[4 * j + 1]));
        a1 = max(a1, max(s[4 * j + 2], s[4 * j + 3]));
        b0 = max(b0, max(s[32 + 4 * j], s[32 + 4 * j + 1]));
        b1 = max(b1, max(s[32 + 4 * j + 2], s[32 + 4 * j + 3]));
    }
    float x0 = fmaxf(m0, fmaxf((float)a0 * sc0, (float)b0 * sc1));
    float x1 = fmaxf(m1, fmaxf((float)a1 * sc0, (float)b1 * sc1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    alpha0 = ex2(m0 - x0);
    alpha1 = ex2(m1 - x1);
    m0 = x0;
    m1 = x1;
    const float log2_p = 8.807354922057604f;  // log2(448)
    // 2^(s·sc − m + log2 448) = 2^(as_float(s + MAGIC_I)·sc − (MAGIC_F·sc + m − log2 448))
    const float c00 = MAGIC_F * sc0 + x0 - log2_p, c01 = MAGIC_F * sc1 + x0 - log2_p;
    const float c10 = MAGIC_F * sc0 + x1 - log2_p, c11 = MAGIC_F * sc1 + x1 - log2_p;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const float sc = j < 8 ? sc0 : sc1;
        const float c0 = j < 8 ? c00 : c01, c1 = j < 8 ? c10 : c11;
        float f[4];
        f[0] = ex2(__fmaf_rn(__int_as_float(s[4 * j] + MAGIC_I), sc, -c0));
        f[1] = ex2(__fmaf_rn(__int_as_float(s[4 * j + 1] + MAGIC_I), sc, -c0));
        f[2] = ex2(__fmaf_rn(__int_as_float(s[4 * j + 2] + MAGIC_I), sc, -c1));
        f[3] = ex2(__fmaf_rn(__int_as_float(s[4 * j + 3] + MAGIC_I), sc, -c1));
        if constexpr (edge) {
            const int col = k0 + 8 * j + 2 * qd;
            if (col >= L) f[0] = f[2] = 0.0f;
            if (col + 1 >= L) f[1] = f[3] = 0.0f;
        }
        r0 += f[0] + f[1];
        r1 += f[2] + f[3];
#pragma unroll
        for (int e = 0; e < 4; ++e) s[4 * j + e] = __float_as_int(f[e]);

    }
    l0 = l0 * alpha0 + r0;
    l1 = l1 * alpha1 + r1;
}

// P (float32 bits in s) as e4m3 in wgmma's A fragments, 32 keys a step: registers 0 and 2 hold
// row g, 1 and 3 row g + 8; positions 4q to 4q + 3 are keys 2q, 2q + 1, 8 + 2q, 9 + 2q (PERM16).
__device__ __forceinline__ void att8_pack(const int* s, u32* p) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int* y = s + 16 * c;
#define F(i) __int_as_float(y[i])
        p[4 * c] = e4m3x4(F(0), F(1), F(4), F(5));
        p[4 * c + 1] = e4m3x4(F(2), F(3), F(6), F(7));
        p[4 * c + 2] = e4m3x4(F(8), F(9), F(12), F(13));
        p[4 * c + 3] = e4m3x4(F(10), F(11), F(14), F(15));
#undef F
    }
}

__device__ __forceinline__ void att8_qk(int* s, u64 desc_q, u32 s_k) {
    const u64 desc_k = sw128_desc(s_k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_s8(s, desc_q + 2 * kk, desc_k + 2 * kk, kk);
}

__device__ __forceinline__ void att8_pv(float* acc, const u32* p, u32 s_v) {
    const u64 desc_v = sw128_desc(s_v);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        wgmma_e4m3(acc, p[4 * c], p[4 * c + 1], p[4 * c + 2], p[4 * c + 3], desc_v + 2 * c);
    }
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The softmax of tile t's scores, the last tile's with its keys past L masked.
__device__ __forceinline__ void att8_scores(int* s, int t, int tiles, const float* ks, float qs,
                                            int L, int qd, float& m0, float& m1, float& l0,
                                            float& l1, float& alpha0, float& alpha1) {
    const float sc0 = ks[2 * t] * qs, sc1 = ks[2 * t + 1] * qs;
    if (t + 1 == tiles && tiles * KEY_TILE > L) {
        att8_softmax<true>(s, sc0, sc1, t * KEY_TILE, L, qd, m0, m1, l0, l1, alpha0, alpha1);
    } else {
        att8_softmax<false>(s, sc0, sc1, t * KEY_TILE, L, qd, m0, m1, l0, l1, alpha0, alpha1);
    }
}

// One step of the consumer loop (t + 1 < tiles): the scores Q·Kᵀ of tile t + 1, issued first,
// then tile t's P (in p) times its V; the softmax of tile t + 1 runs while P·V is in flight, and
// P is packed anew once P·V has read it.
__device__ __forceinline__ void att8_step(int t, int tiles, int* s, float* acc, u32* p, u64 desc_q,
                                          u32 s_tiles, u32 bars, const float* ks, float qs, int L,
                                          int qd, float& m0, float& m1, float& l0, float& l1) {
    const int slot = t % ATT_STAGES;
    const int next = (t + 1) % ATT_STAGES;
    mbar_wait(bars + 8 * next, ((t + 1) / ATT_STAGES) & 1);
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
    wgmma_fence();
    att8_qk(s, desc_q, s_tiles + next * 2 * TILE_BYTES);
    wgmma_commit();
    att8_pv(acc, p, s_tiles + slot * 2 * TILE_BYTES + TILE_BYTES);
    wgmma_commit();
    wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(s[i]);
    float alpha0, alpha1;
    att8_scores(s, t + 1, tiles, ks, qs, L, qd, m0, m1, l0, l1, alpha0, alpha1);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        reg_fence(acc[i]);
        reg_fence(s[i]);
    }
    __syncwarp();
    if (threadIdx.x % WARP == 0) mbar_arrive(bars + 8 * (ATT_STAGES + slot));
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        acc[4 * j] *= alpha0;
        acc[4 * j + 1] *= alpha0;
        acc[4 * j + 2] *= alpha1;
        acc[4 * j + 3] *= alpha1;
    }
    att8_pack(s, p);
}

// The consumer warpgroups' part of unstep_att8_fwd.
__device__ __forceinline__ void att8_consume(u32 s_q, u32 s_tiles, u32 bars, u32 q_bar, int warp,
                                             int lane, i64 bh, int b, int h, int q0, int tiles,
                                             const float* qscale, const float* kscale,
                                             const float* vscale, u16* o, int S, int Spad, int L,
                                             int D, i64 o_batch_stride, float qk_log2) {
    const int wg = warp / 4, wq = warp % 4, g = lane / 4, qd = lane % 4;
    const int row_w = q0 + wg * 64 + wq * 16;
    const float qs = qscale[bh * (Spad / Q_GROUP) + row_w / Q_GROUP] * qk_log2;
    const float* ks = kscale + bh * (2 * tiles);
    const u64 desc_q = sw128_desc(s_q + wg * 64 * 128);
    const float neg_inf = __int_as_float(0xff800000);

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    float m0 = neg_inf, m1 = neg_inf, l0 = 0.0f, l1 = 0.0f;
    int s[64];
    u32 p[16];

    mbar_wait(q_bar, 0);
    mbar_wait(bars, 0);
    wgmma_fence();
    att8_qk(s, desc_q, s_tiles);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(s[i]);
    {
        float alpha0, alpha1;
        att8_scores(s, 0, tiles, ks, qs, L, qd, m0, m1, l0, l1, alpha0, alpha1);
        att8_pack(s, p);
    }
    for (int i = 0; i + 1 < tiles; ++i) {
        att8_step(i, tiles, s, acc, p, desc_q, s_tiles, bars, ks, qs, L, qd, m0, m1, l0, l1);
    }
    {
        const int slot = (tiles - 1) % ATT_STAGES;
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
        wgmma_fence();
        att8_pv(acc, p, s_tiles + slot * 2 * TILE_BYTES + TILE_BYTES);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const int r0 = row_w + g, r1 = r0 + 8;
    const float* vs = vscale + (i64)b * D + h * HD;
    u16* out = o + b * o_batch_stride + h * HD;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int ch = 8 * j + 2 * qd;
        const float v0 = vs[ch], v1 = vs[ch + 1];
        if (r0 < S) {
            *reinterpret_cast<u32*>(out + (i64)r0 * D + ch) =
                (u32)f2h(acc[4 * j] * v0 * inv0) | ((u32)f2h(acc[4 * j + 1] * v1 * inv0) << 16);
        }
        if (r1 < S) {
            *reinterpret_cast<u32*>(out + (i64)r1 * D + ch) =
                (u32)f2h(acc[4 * j + 2] * v0 * inv1) | ((u32)f2h(acc[4 * j + 3] * v1 * inv1) << 16);
        }
    }
}

// Grid (Spad / 128, H, B), ATT_THREADS threads, dynamic shared memory (host):
// 1024 + ATT_WGS · 8192 + ATT_STAGES · 2 · TILE_BYTES + 8 · (2 · ATT_STAGES + 1).
// Tensor maps (uint8, 128-byte swizzle): q over qq as [B·H·Spad, 128] with a box of 64 rows,
// k over kq as [B·H·Lpad, 128] and v over vt as [B·H·128, Lpad], boxes of 128 × 128.
extern "C" __global__ void __launch_bounds__(ATT_THREADS, 1)
    unstep_att8_fwd(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                    const __grid_constant__ TensorMap map_v, const float* qscale, const float* kscale,
                    const float* vscale, u16* o, int S, int Spad, int L, int Lpad, int D,
                    i64 o_batch_stride, float qk_log2) {
    extern __shared__ u8 smem_raw[];
    const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const u32 s_q = base;
    const u32 s_tiles = s_q + ATT_WGS * 64 * 128;
    const u32 bars = s_tiles + ATT_STAGES * 2 * TILE_BYTES;  // full[ST], empty[ST], q
    const u32 q_bar = bars + 16 * ATT_STAGES;

    const int t = threadIdx.x, warp = t / WARP, lane = t % WARP;
    const int h = blockIdx.y, b = blockIdx.z, H = gridDim.y;
    const i64 bh = (i64)b * H + h;
    const int q0 = blockIdx.x * 64 * ATT_WGS;
    const int tiles = Lpad / KEY_TILE;

    if (t == 0) {
        for (int i = 0; i < ATT_STAGES; ++i) {
            mbar_init(bars + 8 * i, 1);
            mbar_init(bars + 8 * (ATT_STAGES + i), 4 * ATT_WGS);
        }
        mbar_init(q_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();

    if (warp >= 4 * ATT_WGS) {
        // The producer.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (t == 128 * ATT_WGS) {
            mbar_expect_tx(q_bar, ATT_WGS * 64 * 128);
            for (int w = 0; w < ATT_WGS; ++w) {
                tma_load(s_q + w * 64 * 128, &map_q, 0, (int)(bh * Spad) + q0 + 64 * w, q_bar);
            }
            for (int i = 0; i < tiles; ++i) {
                const int slot = i % ATT_STAGES;
                if (i >= ATT_STAGES) mbar_wait(bars + 8 * (ATT_STAGES + slot), ((i / ATT_STAGES) - 1) & 1);
                const u32 full = bars + 8 * slot;
                const u32 dst = s_tiles + slot * 2 * TILE_BYTES;
                mbar_expect_tx(full, 2 * TILE_BYTES);
                tma_load(dst, &map_k, 0, (int)(bh * Lpad) + i * KEY_TILE, full);
                tma_load(dst + TILE_BYTES, &map_v, i * KEY_TILE, (int)(bh * HD), full);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        att8_consume(s_q, s_tiles, bars, q_bar, warp, lane, bh, b, h, q0, tiles, qscale, kscale,
                     vscale, o, S, Spad, L, D, o_batch_stride, qk_log2);
    }
}

