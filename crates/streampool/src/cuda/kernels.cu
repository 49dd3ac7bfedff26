// The CUDA backend's kernels, compiled by NVRTC once per device at first use.
//
// Every kernel is `extern "C"` so its name is stable, and takes sizes as 64-bit integers.
// Strided inputs come with a `Dims` block passed by value (see kernels.rs, which coalesces
// shapes to at most SP_MAX_DIMS dimensions). Accuracy matters more than the last few percent:
// no fast-math, erf-form GELU, row statistics accumulated in double.
//
// Floating-point kernels exist once per storage type, as `NAME_f32`, `NAME_f16` and
// `NAME_bf16` (SP_EXPORT3): a template over a type descriptor (F32, F16, BF16) that loads
// each element as float and rounds once on store. Half conversions are written out here
// (PTX `cvt` for f16, bit arithmetic for bf16) so NVRTC needs no CUDA headers.

// Kernel groups (`KernelGroup` in module.rs): built with SP_GROUP defined, the source holds
// that group's entry points alone, so a run-time compile builds only what a model launches
// (BERT in f16 never needs the f32 attention) and the groups compile on several threads at
// once. Without SP_GROUP it holds every kernel. The numbers are `KernelGroup::id`.
#define SP_GROUP_BASIC 1
#define SP_GROUP_NORM 2
#define SP_GROUP_POOL 3
#define SP_GROUP_ACT 4
#define SP_GROUP_ATTENTION 10
#define SP_GROUP_ATTENTION_MMA 20
#ifdef SP_GROUP
#define SP_WANT(g) (SP_GROUP == (g))
#else
#define SP_WANT(g) 1
#endif

#define SP_MAX_DIMS 8
typedef unsigned long long u64;
typedef long long i64;
#define SP_NEG_INF __int_as_float(0xff800000)

struct Dims {
    u64 rank;
    u64 shape[SP_MAX_DIMS];
    u64 sa[SP_MAX_DIMS];
    u64 sb[SP_MAX_DIMS];
};

// Offsets of row-major linear index `i` in the two strided operands.
__device__ __forceinline__ void sp_offsets(const Dims& d, u64 i, u64* oa, u64* ob) {
    u64 a = 0, b = 0;
    for (int k = (int)d.rank - 1; k >= 0; --k) {
        u64 n = d.shape[k];
        u64 idx = i % n;
        i /= n;
        a += idx * d.sa[k];
        b += idx * d.sb[k];
    }
    *oa = a;
    *ob = b;
}

#define SP_GRID_LOOP(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)


typedef unsigned short u16;

__device__ __forceinline__ float sp_h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 sp_f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float sp_b2f(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 sp_f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Type descriptors: storage type T, load as float, store from float.
// ld4/st4 move four consecutive elements in one access: `i` is a multiple of 4 and the
// pointer 16-byte aligned (the launcher checks both before choosing a vectorized kernel).
// ld8/st8 move eight: one 16-byte access for the half types, two for f32; `i` a multiple of 8.
struct F32 {
    typedef float T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return p[i]; }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = v; }
    static __device__ __forceinline__ void ld4(const T* p, u64 i, float* v) {
        float4 t = *(const float4*)(p + i);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    static __device__ __forceinline__ void st4(T* p, u64 i, const float* v) {
        *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
    static __device__ __forceinline__ void ld8(const T* p, u64 i, float* v) { ld4(p, i, v); ld4(p, i + 4, v + 4); }
    static __device__ __forceinline__ void st8(T* p, u64 i, const float* v) { st4(p, i, v); st4(p, i + 4, v + 4); }
};
struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return sp_h2f(p[i]); }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = sp_f2h(v); }
    static __device__ __forceinline__ void ld4(const T* p, u64 i, float* v) {
        uint2 t = *(const uint2*)(p + i);
        v[0] = sp_h2f((u16)(t.x & 0xffffu)); v[1] = sp_h2f((u16)(t.x >> 16));
        v[2] = sp_h2f((u16)(t.y & 0xffffu)); v[3] = sp_h2f((u16)(t.y >> 16));
    }
    static __device__ __forceinline__ void st4(T* p, u64 i, const float* v) {
        uint2 t;
        t.x = (unsigned)sp_f2h(v[0]) | ((unsigned)sp_f2h(v[1]) << 16);
        t.y = (unsigned)sp_f2h(v[2]) | ((unsigned)sp_f2h(v[3]) << 16);
        *(uint2*)(p + i) = t;
    }
    static __device__ __forceinline__ void ld8(const T* p, u64 i, float* v) {
        uint4 t = *(const uint4*)(p + i);
        const unsigned w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = sp_h2f((u16)(w[k] & 0xffffu));
            v[2 * k + 1] = sp_h2f((u16)(w[k] >> 16));
        }
    }
    static __device__ __forceinline__ void st8(T* p, u64 i, const float* v) {
        uint4 t;
        t.x = (unsigned)sp_f2h(v[0]) | ((unsigned)sp_f2h(v[1]) << 16);
        t.y = (unsigned)sp_f2h(v[2]) | ((unsigned)sp_f2h(v[3]) << 16);
        t.z = (unsigned)sp_f2h(v[4]) | ((unsigned)sp_f2h(v[5]) << 16);
        t.w = (unsigned)sp_f2h(v[6]) | ((unsigned)sp_f2h(v[7]) << 16);
        *(uint4*)(p + i) = t;
    }
};
struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return sp_b2f(p[i]); }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = sp_f2b(v); }
    static __device__ __forceinline__ void ld4(const T* p, u64 i, float* v) {
        uint2 t = *(const uint2*)(p + i);
        v[0] = sp_b2f((u16)(t.x & 0xffffu)); v[1] = sp_b2f((u16)(t.x >> 16));
        v[2] = sp_b2f((u16)(t.y & 0xffffu)); v[3] = sp_b2f((u16)(t.y >> 16));
    }
    static __device__ __forceinline__ void st4(T* p, u64 i, const float* v) {
        uint2 t;
        t.x = (unsigned)sp_f2b(v[0]) | ((unsigned)sp_f2b(v[1]) << 16);
        t.y = (unsigned)sp_f2b(v[2]) | ((unsigned)sp_f2b(v[3]) << 16);
        *(uint2*)(p + i) = t;
    }
    static __device__ __forceinline__ void ld8(const T* p, u64 i, float* v) {
        uint4 t = *(const uint4*)(p + i);
        const unsigned w[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = sp_b2f((u16)(w[k] & 0xffffu));
            v[2 * k + 1] = sp_b2f((u16)(w[k] >> 16));
        }
    }
    static __device__ __forceinline__ void st8(T* p, u64 i, const float* v) {
        uint4 t;
        t.x = (unsigned)sp_f2b(v[0]) | ((unsigned)sp_f2b(v[1]) << 16);
        t.y = (unsigned)sp_f2b(v[2]) | ((unsigned)sp_f2b(v[3]) << 16);
        t.z = (unsigned)sp_f2b(v[4]) | ((unsigned)sp_f2b(v[5]) << 16);
        t.w = (unsigned)sp_f2b(v[6]) | ((unsigned)sp_f2b(v[7]) << 16);
        *(uint4*)(p + i) = t;
    }
};

#define SP_EXPORT3(name, impl, params, args) \
    extern "C" __global__ void name##_f32 params { impl<F32> args; } \
    extern "C" __global__ void name##_f16 params { impl<F16> args; } \
    extern "C" __global__ void name##_bf16 params { impl<BF16> args; }

#define SP_IN(D, p) ((const typename D::T*)(p))
#define SP_OUT(D, p) ((typename D::T*)(p))

template <class D> __device__ __forceinline__ void fill_k(void* out, u64 n, float v) {
    typename D::T* o = SP_OUT(D, out);
    SP_GRID_LOOP(i, n) { D::st(o, i, v); }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_fill, fill_k, (void* out, u64 n, float v), (out, n, v))
#endif

// dtype codes: 0 f32, 1 f16, 2 bf16.
__device__ __forceinline__ float sp_ld_any(int t, const void* p, u64 i) {
    if (t == 1) return sp_h2f(((const u16*)p)[i]);
    if (t == 2) return sp_b2f(((const u16*)p)[i]);
    return ((const float*)p)[i];
}
#if SP_WANT(SP_GROUP_BASIC)
extern "C" __global__ void sp_cast(int from, int to, const void* x, void* out, u64 n) {
    SP_GRID_LOOP(i, n) {
        float v = sp_ld_any(from, x, i);
        if (to == 1) ((u16*)out)[i] = sp_f2h(v);
        else if (to == 2) ((u16*)out)[i] = sp_f2b(v);
        else ((float*)out)[i] = v;
    }
}
#endif

template <typename T>
__device__ void sp_copy(const T* src, T* out, u64 n, Dims d) {
    SP_GRID_LOOP(i, n) {
        u64 oa, ob;
        sp_offsets(d, i, &oa, &ob);
        out[i] = src[oa];
    }
}
#if SP_WANT(SP_GROUP_BASIC)
extern "C" __global__ void sp_copy16(const unsigned short* s, unsigned short* o, u64 n, Dims d) { sp_copy(s, o, n, d); }
extern "C" __global__ void sp_copy32(const unsigned int* s, unsigned int* o, u64 n, Dims d) { sp_copy(s, o, n, d); }
extern "C" __global__ void sp_copy64(const u64* s, u64* o, u64 n, Dims d) { sp_copy(s, o, n, d); }
#endif

__device__ __forceinline__ float sp_gelu(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

// op: 0 relu, 1 gelu, 2 tanh, 3 exp, 4 sqrt, 5 sqr, 6 neg, 7 recip, 8 affine.
__device__ __forceinline__ float sp_unop(int op, float v, float mul, float add) {
    switch (op) {
        case 0: return fmaxf(v, 0.0f);
        case 1: return sp_gelu(v);
        case 2: return tanhf(v);
        case 3: return expf(v);
        case 4: return sqrtf(v);
        case 5: return v * v;
        case 6: return -v;
        case 7: return 1.0f / v;
        default: return v * mul + add;
    }
}
template <class D> __device__ __forceinline__ void unary_k(int op, const void* x, void* out, u64 n, float mul, float add) {
    const typename D::T* xi = SP_IN(D, x);
    typename D::T* o = SP_OUT(D, out);
    SP_GRID_LOOP(i, n) { D::st(o, i, sp_unop(op, D::ld(xi, i), mul, add)); }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_unary, unary_k, (int op, const void* x, void* out, u64 n, float mul, float add), (op, x, out, n, mul, add))
#endif

__device__ __forceinline__ float sp_binop(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        default: return fmaxf(a, b);
    }
}

// op: 0 add, 1 sub, 2 mul, 3 div, 4 max. `contiguous` != 0: both operands are dense in `out`'s order.
template <class D>
__device__ __forceinline__ void binary_k(int op, const void* av, const void* bv, void* out, u64 n, int contiguous, const Dims& d) {
    const typename D::T* a = SP_IN(D, av);
    const typename D::T* b = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    if (contiguous) {
        SP_GRID_LOOP(i, n) { D::st(o, i, sp_binop(op, D::ld(a, i), D::ld(b, i))); }
    } else {
        SP_GRID_LOOP(i, n) {
            u64 oa, ob;
            sp_offsets(d, i, &oa, &ob);
            D::st(o, i, sp_binop(op, D::ld(a, oa), D::ld(b, ob)));
        }
    }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_binary, binary_k, (int op, const void* a, const void* b, void* out, u64 n, int contiguous, Dims d),
           (op, a, b, out, n, contiguous, d))
#endif

// Block-wide reductions for row kernels (blockDim.x is a multiple of 32, at most 1024).
__device__ float sp_block_max(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < warps ? sh[lane] : SP_NEG_INF;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ double sp_block_sum(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < warps ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ float sp_block_sumf(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < warps ? sh[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// One block per row of a contiguous [rows, cols]. The input is read three times (max, sum,
// output) rather than the output re-read, so a half output is rounded exactly once.
template <class D> __device__ __forceinline__ void softmax_k(const void* xv, void* out, u64 rows, u64 cols) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    typename D::T* o = SP_OUT(D, out);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        u64 base = r * cols;
        float m = SP_NEG_INF;
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, D::ld(x, base + c));
        m = sp_block_max(m, shf);
        double s = 0.0;
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x) s += expf(D::ld(x, base + c) - m);
        s = sp_block_sum(s, shd);
        float inv = (float)(1.0 / s);
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x) D::st(o, base + c, expf(D::ld(x, base + c) - m) * inv);
    }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_softmax, softmax_k, (const void* x, void* out, u64 rows, u64 cols), (x, out, rows, cols))
#endif

// out = layer_norm(x + residual) * gamma + beta, one block per row; `residual` may be null.
// Each thread keeps its columns' sums in registers when the row fits (cols <= 4 * blockDim),
// else re-reads the inputs; statistics in double.
template <class D>
__device__ __forceinline__ void layer_norm_k(const void* xv, const void* rv, const void* gv, const void* bv, void* out,
                                             u64 rows, u64 cols, float eps) {
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* res = SP_IN(D, rv);
    const typename D::T* gamma = SP_IN(D, gv);
    const typename D::T* beta = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    const bool cached = cols <= 4 * (u64)blockDim.x;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        u64 base = r * cols;
        float v[4];
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = 0.0f;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                u64 c = threadIdx.x + (u64)k * blockDim.x;
                if (c < cols) {
                    float t = D::ld(x, base + c);
                    if (res) t += D::ld(res, base + c);
                    v[k] = t;
                    s += t;
                }
            }
        } else {
            for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
                float t = D::ld(x, base + c);
                if (res) t += D::ld(res, base + c);
                s += t;
            }
        }
        double mean = sp_block_sum(s, shd) / (double)cols;
        double q = 0.0;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                u64 c = threadIdx.x + (u64)k * blockDim.x;
                if (c < cols) {
                    double dv = (double)v[k] - mean;
                    q += dv * dv;
                }
            }
        } else {
            for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
                float t = D::ld(x, base + c);
                if (res) t += D::ld(res, base + c);
                double dv = (double)t - mean;
                q += dv * dv;
            }
        }
        double var = sp_block_sum(q, shd) / (double)cols;
        float inv = (float)(1.0 / sqrt(var + (double)eps));
        float meanf = (float)mean;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                u64 c = threadIdx.x + (u64)k * blockDim.x;
                if (c < cols) D::st(o, base + c, (v[k] - meanf) * inv * D::ld(gamma, c) + D::ld(beta, c));
            }
        } else {
            for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
                float t = D::ld(x, base + c);
                if (res) t += D::ld(res, base + c);
                D::st(o, base + c, (t - meanf) * inv * D::ld(gamma, c) + D::ld(beta, c));
            }
        }
    }
}
#if SP_WANT(SP_GROUP_NORM)
SP_EXPORT3(sp_layer_norm, layer_norm_k,
           (const void* x, const void* residual, const void* gamma, const void* beta, void* out, u64 rows, u64 cols, float eps),
           (x, residual, gamma, beta, out, rows, cols, eps))
#endif

// GELU's tanh approximation (Activation::GeluTanh; cuBLASLt's GELU epilogue computes it too).
__device__ __forceinline__ float sp_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// act: 0 identity, 1 relu, 2 gelu, 3 tanh gelu (Activation's codes in kernels.rs).
__device__ __forceinline__ float sp_act(int act, float v) {
    return act == 0 ? v : (act == 1 ? fmaxf(v, 0.0f) : (act == 2 ? sp_gelu(v) : sp_gelu_tanh(v)));
}

// out = act(x + bias).
template <class D> __device__ __forceinline__ void bias_act_k(const void* xv, const void* bv, void* out, u64 rows, u64 cols, int act) {
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* bias = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    u64 n = rows * cols;
    SP_GRID_LOOP(i, n) {
        D::st(o, i, sp_act(act, D::ld(x, i) + D::ld(bias, i % cols)));
    }
}
#if SP_WANT(SP_GROUP_ACT)
SP_EXPORT3(sp_bias_act, bias_act_k, (const void* x, const void* bias, void* out, u64 rows, u64 cols, int act),
           (x, bias, out, rows, cols, act))
#endif

// The vectorized forms of layer_norm_k and bias_act_k, for the shapes of transformer layers
// (cols a multiple of 4, at most 1024, aligned rows): the launcher picks them when they apply.
//
// layer_norm_rows_k<D, L, W, G>: L lanes per row (32: a warp, 16: a half-warp, two rows per
// warp), W consecutive elements per lane and access (4: 8 bytes in half types, 8: 16 bytes),
// up to G accesses per lane (rows of at most L * W * G columns), the row in registers; two-pass
// statistics in float from the registers (mean, then the sum of squared deviations: no
// cancellation), so the input is read once and the output written once. A block-per-row
// kernel with double statistics ran at a fifth of the memory bandwidth on the H100 (1.6 ms of
// a 5.8 ms MiniLM forward at batch 512 x 32 tokens). With L = 16 the rows of a warp always run
// the loop together (the row index is per warp, a row past the end is only masked), so the
// full-mask shuffles never wait for an exited lane; the xor offsets stay inside the L lanes.
template <class D, int W>
__device__ __forceinline__ void ld_w(const typename D::T* p, u64 i, float* v) {
    if constexpr (W == 8) D::ld8(p, i, v);
    else D::ld4(p, i, v);
}
template <class D, int W>
__device__ __forceinline__ void st_w(typename D::T* p, u64 i, const float* v) {
    if constexpr (W == 8) D::st8(p, i, v);
    else D::st4(p, i, v);
}
template <class D, int L, int W, int G>
__device__ __forceinline__ void layer_norm_rows_k(const void* xv, const void* rv, const void* gv, const void* bv,
                                                  void* out, u64 rows, u64 cols, float eps) {
    static_assert(L == 16 || L == 32, "a row spans a half-warp or a warp");
    constexpr int RPW = 32 / L;  // rows per warp
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* res = SP_IN(D, rv);
    const typename D::T* gamma = SP_IN(D, gv);
    const typename D::T* beta = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    const int lane = threadIdx.x % L, sub = (threadIdx.x / L) % RPW, warps = blockDim.x >> 5;
    const u64 chunks = cols / W;
    for (u64 rw = ((u64)blockIdx.x * warps + (threadIdx.x >> 5)) * RPW; rw < rows;
         rw += (u64)gridDim.x * warps * RPW) {
        const u64 r = rw + sub;
        const bool live = r < rows;
        const u64 base = r * cols;
        float v[G][W];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < G; ++k) {
            const u64 c = lane + L * k;
            if (live && c < chunks) {
                ld_w<D, W>(x, base + W * c, v[k]);
                if (res) {
                    float t[W];
                    ld_w<D, W>(res, base + W * c, t);
#pragma unroll
                    for (int e = 0; e < W; ++e) v[k][e] += t[e];
                }
#pragma unroll
                for (int e = 0; e < W; ++e) s += v[k][e];
            }
        }
        for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
        const float mean = s / (float)cols;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < G; ++k) {
            if (live && lane + L * k < chunks) {
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    const float dv = v[k][e] - mean;
                    q = fmaf(dv, dv, q);
                }
            }
        }
        for (int off = L / 2; off > 0; off >>= 1) q += __shfl_xor_sync(0xffffffff, q, off);
        const float inv = 1.0f / sqrtf(q / (float)cols + eps);
#pragma unroll
        for (int k = 0; k < G; ++k) {
            const u64 c = lane + L * k;
            if (live && c < chunks) {
                float gm[W], bt[W], y[W];
                ld_w<D, W>(gamma, W * c, gm);
                ld_w<D, W>(beta, W * c, bt);
#pragma unroll
                for (int e = 0; e < W; ++e) y[e] = (v[k][e] - mean) * inv * gm[e] + bt[e];
                st_w<D, W>(o, base + W * c, y);
            }
        }
    }
}

// The warp form (every dtype): a warp per row, 4 elements per access, rows of at most 1024.
#define SP_LN_GROUPS 8
template <class D>
__device__ __forceinline__ void layer_norm_warp_k(const void* xv, const void* rv, const void* gv, const void* bv,
                                                  void* out, u64 rows, u64 cols, float eps) {
    layer_norm_rows_k<D, 32, 4, SP_LN_GROUPS>(xv, rv, gv, bv, out, rows, cols, eps);
}
#if SP_WANT(SP_GROUP_NORM)
SP_EXPORT3(sp_layer_norm_warp, layer_norm_warp_k,
           (const void* x, const void* residual, const void* gamma, const void* beta, void* out, u64 rows, u64 cols, float eps),
           (x, residual, gamma, beta, out, rows, cols, eps))
#endif

// The half types' vec8 form: a half-warp per row, one 16-byte access per lane and step, up to
// G steps. At MiniLM's 384 columns each lane loads 3 chunks of x and 3 of the residual at once
// (the warp form: 3 + 3 accesses of 8 bytes), and a warp holds two rows.
#define SP_LN_VEC8(g)                                                                                                  \
    extern "C" __global__ void sp_layer_norm_vec8_g##g##_f16(const void* x, const void* r, const void* gm,            \
                                                            const void* bt, void* o, u64 rows, u64 cols, float eps) { \
        layer_norm_rows_k<F16, 16, 8, g>(x, r, gm, bt, o, rows, cols, eps);                                          \
    }                                                                                                                \
    extern "C" __global__ void sp_layer_norm_vec8_g##g##_bf16(const void* x, const void* r, const void* gm,           \
                                                             const void* bt, void* o, u64 rows, u64 cols, float eps) { \
        layer_norm_rows_k<BF16, 16, 8, g>(x, r, gm, bt, o, rows, cols, eps);                                         \
    }
#if SP_WANT(SP_GROUP_NORM)
SP_LN_VEC8(4)
SP_LN_VEC8(8)
#endif

// bias_act4_k: four consecutive elements per thread (cols a multiple of 4), 32-bit indexing
// (the launcher checks rows * cols < 2^32): a 64-bit modulo per element cost more than the
// memory traffic.
template <class D> __device__ __forceinline__ void bias_act4_k(const void* xv, const void* bv, void* out, unsigned n4, unsigned cols4, int act) {
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* bias = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += blockDim.x * gridDim.x) {
        float v[4], b[4];
        D::ld4(x, (u64)i * 4, v);
        D::ld4(bias, (u64)(i % cols4) * 4, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = sp_act(act, v[e] + b[e]);
        D::st4(o, (u64)i * 4, v);
    }
}
#if SP_WANT(SP_GROUP_ACT)
SP_EXPORT3(sp_bias_act4, bias_act4_k, (const void* x, const void* bias, void* out, unsigned n4, unsigned cols4, int act),
           (x, bias, out, n4, cols4, act))
#endif

// bias_act_rows8_k: for rows whose length is a multiple of 8 (cols8 = cols / 8 chunks, at
// most blockDim.x): thread c of a block owns columns 8c..8c+7 of every row the block visits,
// so its eight biases are loaded once and stay in registers (no per-element modulo), and
// each access moves 16 bytes of half data. Two rows per step keep two loads in flight per
// thread. The 4-wide kernel above ran MiniLM's GELU passes at about 2 TB/s on the H100.
template <class D>
__device__ __forceinline__ void bias_act_rows8_k(const void* xv, const void* bv, void* out, unsigned rows, unsigned cols8, int act) {
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* bias = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    const unsigned c = threadIdx.x;
    if (c >= cols8) return;
    float b[8];
    D::ld8(bias, (u64)c * 8, b);
    const u64 cols = (u64)cols8 * 8;
    u64 r = (u64)blockIdx.x * 2;
    for (; r + 1 < rows; r += (u64)gridDim.x * 2) {
        float v[8], w[8];
        D::ld8(x, r * cols + c * 8, v);
        D::ld8(x, (r + 1) * cols + c * 8, w);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = sp_act(act, v[e] + b[e]);
            w[e] = sp_act(act, w[e] + b[e]);
        }
        D::st8(o, r * cols + c * 8, v);
        D::st8(o, (r + 1) * cols + c * 8, w);
    }
    if (r < rows) {
        float v[8];
        D::ld8(x, r * cols + c * 8, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = sp_act(act, v[e] + b[e]);
        D::st8(o, r * cols + c * 8, v);
    }
}
#if SP_WANT(SP_GROUP_ACT)
SP_EXPORT3(sp_bias_act_rows8, bias_act_rows8_k, (const void* x, const void* bias, void* out, unsigned rows, unsigned cols8, int act),
           (x, bias, out, rows, cols8, act))
#endif

template <class D>
__device__ __forceinline__ void index_select_k(const void* tv, const i64* ids, void* out, u64 n_ids, u64 row_len, u64 table_rows) {
    const typename D::T* table = SP_IN(D, tv);
    typename D::T* o = SP_OUT(D, out);
    u64 n = n_ids * row_len;
    SP_GRID_LOOP(i, n) {
        i64 id = ids[i / row_len];
        o[i] = (id < 0 || (u64)id >= table_rows) ? (typename D::T)0 : table[(u64)id * row_len + i % row_len];
    }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_index_select, index_select_k,
           (const void* table, const i64* ids, void* out, u64 n_ids, u64 row_len, u64 table_rows),
           (table, ids, out, n_ids, row_len, table_rows))
#endif
// Kernel::IndexSelect in 16-byte chunks (rows a multiple of 16 bytes, table and out 16-byte
// aligned; any dtype): one chunk per thread instead of one element, and one id load and
// division per chunk. On the H100 MiniLM's 512 x 128 f16 word embeddings (50 MB out) took
// 108 us with the element kernel above and 19 us with this one (ncu, clocks locked).
#if SP_WANT(SP_GROUP_BASIC)
extern "C" __global__ void sp_index_select16(const uint4* table, const i64* ids, uint4* out, u64 n_ids, u64 chunks,
                                             u64 table_rows) {
    const u64 n = n_ids * chunks;
    SP_GRID_LOOP(i, n) {
        const u64 r = i / chunks, c = i - r * chunks;
        const i64 id = ids[r];
        out[i] = (id < 0 || (u64)id >= table_rows) ? make_uint4(0u, 0u, 0u, 0u) : table[(u64)id * chunks + c];
    }
}
#endif

// Reduces the middle axis of [outer, axis, inner]; op: 0 sum, 1 mean, 2 max. One thread per output.
template <class D> __device__ __forceinline__ void reduce_k(int op, const void* xv, void* out, u64 outer, u64 axis, u64 inner) {
    const typename D::T* x = SP_IN(D, xv);
    typename D::T* o = SP_OUT(D, out);
    u64 n = outer * inner;
    SP_GRID_LOOP(i, n) {
        u64 oo = i / inner, in = i % inner;
        u64 p = oo * axis * inner + in;
        if (op == 2) {
            float m = SP_NEG_INF;
            for (u64 a = 0; a < axis; ++a) m = fmaxf(m, D::ld(x, p + a * inner));
            D::st(o, i, m);
        } else {
            double s = 0.0;
            for (u64 a = 0; a < axis; ++a) s += D::ld(x, p + a * inner);
            D::st(o, i, (float)(op == 1 ? s / (double)axis : s));
        }
    }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_reduce, reduce_k, (int op, const void* x, void* out, u64 outer, u64 axis, u64 inner),
           (op, x, out, outer, axis, inner))
#endif

// The same for inner == 1 (reducing the last axis): one block per row.
template <class D> __device__ __forceinline__ void reduce_rows_k(int op, const void* xv, void* out, u64 rows, u64 axis) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    typename D::T* o = SP_OUT(D, out);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        u64 p = r * axis;
        if (op == 2) {
            float m = SP_NEG_INF;
            for (u64 a = threadIdx.x; a < axis; a += blockDim.x) m = fmaxf(m, D::ld(x, p + a));
            m = sp_block_max(m, shf);
            if (threadIdx.x == 0) D::st(o, r, m);
        } else {
            double s = 0.0;
            for (u64 a = threadIdx.x; a < axis; a += blockDim.x) s += D::ld(x, p + a);
            s = sp_block_sum(s, shd);
            if (threadIdx.x == 0) D::st(o, r, (float)(op == 1 ? s / (double)axis : s));
        }
    }
}
#if SP_WANT(SP_GROUP_BASIC)
SP_EXPORT3(sp_reduce_rows, reduce_rows_k, (int op, const void* x, void* out, u64 rows, u64 axis), (op, x, out, rows, axis))
#endif

// The rows of sequence b: a padded batch is [batch, seq] (rows b * seq.., all seq of them);
// a packed one (Kernel::Attention's `packed`, `offsets` non-null) takes them from the offsets,
// clamped to 0..tokens and cut at seq, exactly as cpu/kernels/packed.rs's seq_range does, so
// bad offsets never reach outside the tensors.
__device__ __forceinline__ void sp_seq_rows(const i64* offsets, u64 b, int seq, i64 tokens, u64* first, int* n) {
    if (!offsets) {
        *first = b * (u64)seq;
        *n = seq;
        return;
    }
    i64 s = offsets[b], e = offsets[b + 1];
    s = s < 0 ? 0 : (s > tokens ? tokens : s);
    e = e < s ? s : (e > tokens ? tokens : e);
    *first = (u64)s;
    *n = (int)(e - s < (i64)seq ? e - s : (i64)seq);
}

// Fused attention (Kernel::Attention): qkv is [batch, seq, 3, heads, d], out [batch, seq, heads, d]
// (packed: [tokens, 3, heads, d] and [tokens, heads, d], sequence b's rows from sp_seq_rows).
// Grid (ceil(seq / blockDim), heads, batch); one query per thread, its q and output row in
// registers (HD >= d, zero-padded), keys and values staged through shared memory as float in
// tiles of SP_KT; flash-attention style online softmax with float statistics, updated per key.
// F16/BF16 heads of width 16/32/64/128 take attention_mma_k below on sm_80 and later. A padded key (mask == 0) scores -FLT_MAX, as Hugging Face's additive mask.
#define SP_FLT_MAX 3.402823466e38f
template <class D, int HD, int KT>
__device__ __forceinline__ void attention_k(const void* qkvv, const float* mask, const i64* offsets, void* out, int seq,
                                            int heads, int d, i64 tokens) {
    __shared__ float ks[KT][HD];
    __shared__ float vs[KT][HD];
    __shared__ float ms[KT];
    const typename D::T* qkv = SP_IN(D, qkvv);
    typename D::T* o = SP_OUT(D, out);
    const int b = blockIdx.z, h = blockIdx.y;
    const int qi = blockIdx.x * blockDim.x + threadIdx.x;
    u64 first;
    int n;
    sp_seq_rows(offsets, b, seq, tokens, &first, &n);
    if (blockIdx.x * blockDim.x >= (unsigned)n) return;  // block-uniform, before any barrier
    const u64 hid = (u64)heads * d, row = 3 * hid;
    const u64 base = first * row;
    const bool active = qi < n;
    float q[HD], acc[HD];
#pragma unroll
    for (int c = 0; c < HD; ++c) {
        q[c] = (active && c < d) ? D::ld(qkv, base + (u64)qi * row + (u64)h * d + c) : 0.0f;
        acc[c] = 0.0f;
    }
    float m = SP_NEG_INF, l = 0.0f;
    for (int k0 = 0; k0 < n; k0 += KT) {
        const int nk = min(KT, n - k0);
        __syncthreads();
        for (int e = threadIdx.x; e < KT * HD; e += blockDim.x) {
            int j = e / HD, c = e % HD;
            float kv = 0.0f, vv = 0.0f;
            if (j < nk && c < d) {
                u64 t = base + (u64)(k0 + j) * row + (u64)h * d + c;
                kv = D::ld(qkv, t + hid);
                vv = D::ld(qkv, t + 2 * hid);
            }
            ks[j][c] = kv;
            vs[j][c] = vv;
        }
        for (int j = threadIdx.x; j < KT; j += blockDim.x) {
            ms[j] = j < nk ? (mask ? mask[first + k0 + j] : 1.0f) : -1.0f;
        }
        __syncthreads();
        if (!active) continue;
        // One key at a time, and only the head-width loops unrolled: unrolling chunks of
        // keys as well made NVRTC take about two minutes for this kernel's 12 instances
        // (a process compiles the module at first use), for a kernel that only serves f32
        // and the head widths the tensor-core kernel lacks.
#pragma unroll 1
        for (int j = 0; j < nk; ++j) {
            const float mk = ms[j];
            float v = SP_NEG_INF;
            if (mk == 0.0f) {
                v = -SP_FLT_MAX;
            } else if (mk > 0.0f) {
                v = 0.0f;
#pragma unroll
                for (int c = 0; c < HD; ++c) v = fmaf(q[c], ks[j][c], v);
            }
            // mx is finite: key j is inside the sequence.
            const float mx = fmaxf(m, v);
            const float corr = expf(m - mx);
            const float p = expf(v - mx);
            l = l * corr + p;
#pragma unroll
            for (int c = 0; c < HD; ++c) acc[c] = fmaf(p, vs[j][c], acc[c] * corr);
            m = mx;
        }
    }
    if (active) {
        const float inv = 1.0f / l;
        const u64 ob = (first + qi) * hid + (u64)h * d;
#pragma unroll
        for (int c = 0; c < HD; ++c) {
            if (c < d) D::st(o, ob + c, acc[c] * inv);
        }
    }
}
#define SP_ATTN(hd, kt)                                                                                         \
    template <class D>                                                                                          \
    __device__ __forceinline__ void attention##hd##_k(const void* qkv, const float* mask, const i64* offsets,   \
                                                      void* out, int seq, int heads, int d, i64 tokens) {     \
        attention_k<D, hd, kt>(qkv, mask, offsets, out, seq, heads, d, tokens);                                 \
    }                                                                                                           \
    SP_EXPORT3(sp_attention##hd, attention##hd##_k,                                                             \
               (const void* qkv, const float* mask, const i64* offsets, void* out, int seq, int heads, int d,   \
                i64 tokens),                                                                                    \
               (qkv, mask, offsets, out, seq, heads, d, tokens))
#if SP_WANT(SP_GROUP_ATTENTION + 0)
SP_ATTN(16, 64)
#endif
#if SP_WANT(SP_GROUP_ATTENTION + 1)
SP_ATTN(32, 64)
#endif
#if SP_WANT(SP_GROUP_ATTENTION + 2)
SP_ATTN(64, 64)
#endif
#if SP_WANT(SP_GROUP_ATTENTION + 3)
SP_ATTN(128, 32)
#endif

// Tensor-core attention for F16/BF16 with head width HD (16, 32, 64 or 128), on sm_80 and
// later: the same contract as attention_k, computed with `mma.sync.m16n8k16` (f32
// accumulation) in the register layout of FlashAttention-2. One warp owns 16 queries of one
// (batch, head): its Q fragments stay in registers. K and V tiles of KT keys are copied into
// shared memory row-major by `cp.async` (16 bytes per thread and copy, no register round
// trip), two tiles in flight: while the warps compute on one tile the next one is already
// on its way, so a block waits for global memory once instead of once per tile. Each warp
// computes its 16 x KT scores with K fragments read by `ldmatrix`, masks them, updates the
// online-softmax statistics (f32, per row), rounds the probabilities to the storage type and
// multiplies them by V, whose fragments `ldmatrix.trans` reads from the same row-major
// layout. The C fragment of the scores is the A fragment of the probabilities, so nothing
// goes through shared memory between the two products. Rows are padded by 8 elements so the
// eight 16-byte rows of an `ldmatrix` hit 32 different banks.
//
// History (H100, MiniLM f16, batch 512 x 128 tokens, 6 layers): the one-query-per-thread
// kernel above took 7.1 ms; the first tensor-core version, which loaded K/V with 32-bit loads
// and a transposing store into shared memory, one tile at a time, 1.7 ms (cuDNN: 0.58 ms).
#define SP_LOG2E 1.4426950408889634f

template <class D> struct Mma;
template <> struct Mma<F16> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // Two floats rounded into one register, `lo` in the low half.
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct Mma<BF16> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

__device__ __forceinline__ unsigned sp_ld2(const u16* p) { return *(const unsigned*)p; }
// 2^x by the hardware's approximation (2 ulp; -inf gives 0), without exp2f's denormal
// handling: the probabilities are rounded to 16 bits right after.
__device__ __forceinline__ float sp_ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ unsigned sp_smem(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// Copies `bytes` (16 or 4) from global to shared memory without waiting; `valid == false`
// zero-fills the destination instead of reading.
template <int BYTES>
__device__ __forceinline__ void sp_cp_async(void* dst, const void* src, bool valid) {
    if (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sp_smem(dst)), "l"(src), "r"(valid ? 16 : 0)
                     : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(sp_smem(dst)), "l"(src), "r"(valid ? 4 : 0)
                     : "memory");
    }
}
__device__ __forceinline__ void sp_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void sp_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void sp_ldmatrix4(unsigned* r, const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sp_smem(row))
                 : "memory");
}
__device__ __forceinline__ void sp_ldmatrix4_trans(unsigned* r, const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sp_smem(row))
                 : "memory");
}

// Keys per shared-memory tile: two tiles of K and V must fit in the 48 KiB of static shared memory.
template <int HD> struct MmaTile { static constexpr int KT = HD >= 128 ? 32 : 64; };

// Starts the copy of keys [k0, k0 + KT) of K, V and the mask into one tile buffer; rows
// past the sequence are zero-filled, so their (masked) probabilities multiply zeros, never
// stale data that could be NaN. Without a mask every key in the sequence counts as real.
template <int HD, int KT>
__device__ __forceinline__ void attention_tile_load(const u16* qkv, const float* mask, u16* ks, u16* vs, float* ms,
                                                    u64 base, u64 row, u64 hid, u64 mrow, int k0, int seq) {
    constexpr int P = HD + 8;
    constexpr int CH = HD / 8;  // 16-byte chunks per row
    for (int e = threadIdx.x; e < KT * CH; e += blockDim.x) {
        const int j = e / CH, c = (e % CH) * 8;
        const bool ok = k0 + j < seq;
        const u16* src = qkv + base + (u64)(ok ? k0 + j : 0) * row + c;
        sp_cp_async<16>(ks + j * P + c, src + hid, ok);
        sp_cp_async<16>(vs + j * P + c, src + 2 * hid, ok);
    }
    for (int j = threadIdx.x; j < KT; j += blockDim.x) {
        const bool ok = k0 + j < seq;
        if (mask) {
            sp_cp_async<4>(ms + j, mask + mrow + (ok ? k0 + j : 0), ok);
        } else {
            ms[j] = ok ? 1.0f : -1.0f;
        }
    }
}

template <class D, int HD>
__device__ __forceinline__ void attention_mma_k(const void* qkvv, const float* mask, const i64* offsets, void* out,
                                                int seq, int heads, i64 tokens) {
#if __CUDA_ARCH__ >= 800
    constexpr int KT = MmaTile<HD>::KT;
    constexpr int P = HD + 8;  // tile row length in shared memory (elements)
    __shared__ __align__(16) u16 ks[2][KT * P];
    __shared__ __align__(16) u16 vs[2][KT * P];
    __shared__ __align__(16) float ms[2][KT];
    const u16* qkv = (const u16*)qkvv;
    u16* o = (u16*)out;
    const int b = blockIdx.z, h = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    u64 first;
    int seq_b;  // this sequence's length: `seq` when padded
    sp_seq_rows(offsets, b, seq, tokens, &first, &seq_b);
    // A block past its sequence's end (packed batches size the grid by the longest) leaves
    // at once; the test is block-uniform, so no barrier below misses a warp.
    if ((int)(blockIdx.x * (blockDim.x >> 5) * 16) >= seq_b) return;
    seq = seq_b;
    const int q0 = (blockIdx.x * (blockDim.x >> 5) + warp) * 16;
    const u64 hid = (u64)heads * HD, row = 3 * hid;
    const u64 base = first * row + (u64)h * HD, mrow = first;
    const int r0 = q0 + g, r1 = q0 + g + 8;
    const int ntiles = (seq + KT - 1) / KT;
    attention_tile_load<HD, KT>(qkv, mask, ks[0], vs[0], ms[0], base, row, hid, mrow, 0, seq);
    sp_cp_commit();
    unsigned qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const int c = kk * 16 + 2 * t;
        qa[kk][0] = r0 < seq ? sp_ld2(qkv + base + (u64)r0 * row + c) : 0u;
        qa[kk][1] = r1 < seq ? sp_ld2(qkv + base + (u64)r1 * row + c) : 0u;
        qa[kk][2] = r0 < seq ? sp_ld2(qkv + base + (u64)r0 * row + c + 8) : 0u;
        qa[kk][3] = r1 < seq ? sp_ld2(qkv + base + (u64)r1 * row + c + 8) : 0u;
    }
    float acc[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    // Running max and (this lane's partial) sum of rows g and g + 8.
    float m0 = SP_NEG_INF, m1 = SP_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    // ldmatrix row addresses of this lane: for K, keys 16 * n2 + (lane >> 4) * 8 + (lane & 7) at
    // column offset ((lane >> 3) & 1) * 8 (two key blocks of 8, both halves of a 16-wide k step);
    // for V, keys ((lane >> 3) & 1) * 8 + (lane & 7) at column (lane >> 4) * 8 (both key halves
    // of a k step, two column blocks of 8).
    const int krow = (lane >> 4) * 8 + (lane & 7), kcol = ((lane >> 3) & 1) * 8;
    const int vrow = ((lane >> 3) & 1) * 8 + (lane & 7), vcol = (lane >> 4) * 8;
    for (int tile = 0; tile < ntiles; ++tile) {
        const int buf = tile & 1, k0 = tile * KT;
        if (tile + 1 < ntiles) {
            // The other buffer was last read in the previous iteration, which ended at a barrier.
            attention_tile_load<HD, KT>(qkv, mask, ks[buf ^ 1], vs[buf ^ 1], ms[buf ^ 1], base, row, hid, mrow,
                                        k0 + KT, seq);
            sp_cp_commit();
            sp_cp_wait<1>();
        } else {
            sp_cp_wait<0>();
        }
        __syncthreads();
        if (q0 < seq) {  // warp-uniform: a warp past the end only helps with the copies
            const u16* kt = ks[buf];
            const u16* vt = vs[buf];
            float sc[KT / 8][4];
#pragma unroll
            for (int n2 = 0; n2 < KT / 16; ++n2) {
                float* s0 = sc[2 * n2];
                float* s1 = sc[2 * n2 + 1];
                s0[0] = s0[1] = s0[2] = s0[3] = 0.0f;
                s1[0] = s1[1] = s1[2] = s1[3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk) {
                    unsigned kb[4];
                    sp_ldmatrix4(kb, kt + (n2 * 16 + krow) * P + kk * 16 + kcol);
                    Mma<D>::run(s0, qa[kk], kb[0], kb[1]);
                    Mma<D>::run(s1, qa[kk], kb[2], kb[3]);
                }
            }
            // Padded keys score -FLT_MAX (Hugging Face's additive mask), keys past the end -inf.
            // A tile of real keys only (the usual case: batches of one length) skips the
            // per-score selects; the test is warp-uniform.
            const float* mt = ms[buf];
            bool all_real = true;
#pragma unroll
            for (int j = lane; j < KT; j += 32) all_real &= k0 + j < seq && mt[j] > 0.0f;
            if (!__all_sync(0xffffffff, all_real)) {
#pragma unroll
                for (int n = 0; n < KT / 8; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = n * 8 + 2 * t + (e & 1);
                        const float mk = mt[j];
                        const float v = sc[n][e];
                        sc[n][e] = k0 + j >= seq ? SP_NEG_INF : (mk > 0.0f ? v : (mk == 0.0f ? -SP_FLT_MAX : SP_NEG_INF));
                    }
                }
            }
            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int n = 0; n < KT / 8; ++n) {
                mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
                mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
            }
            // The four lanes of a quad share a row.
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 2));
            // mx0, mx1 are finite: the first tile holds key 0, which is real or padded, never -inf.
            const float c0 = sp_ex2((m0 - mx0) * SP_LOG2E), c1 = sp_ex2((m1 - mx1) * SP_LOG2E);
            const float b0 = mx0 * SP_LOG2E, b1 = mx1 * SP_LOG2E;
            l0 *= c0;
            l1 *= c1;
#pragma unroll
            for (int n = 0; n < HD / 8; ++n) {
                acc[n][0] *= c0;
                acc[n][1] *= c0;
                acc[n][2] *= c1;
                acc[n][3] *= c1;
            }
#pragma unroll
            for (int n = 0; n < KT / 8; ++n) {
                sc[n][0] = sp_ex2(fmaf(sc[n][0], SP_LOG2E, -b0));
                sc[n][1] = sp_ex2(fmaf(sc[n][1], SP_LOG2E, -b0));
                sc[n][2] = sp_ex2(fmaf(sc[n][2], SP_LOG2E, -b1));
                sc[n][3] = sp_ex2(fmaf(sc[n][3], SP_LOG2E, -b1));
                l0 += sc[n][0] + sc[n][1];
                l1 += sc[n][2] + sc[n][3];
            }
#pragma unroll
            for (int kk = 0; kk < KT / 16; ++kk) {
                unsigned pa[4];
                pa[0] = Mma<D>::pack(sc[2 * kk][0], sc[2 * kk][1]);
                pa[1] = Mma<D>::pack(sc[2 * kk][2], sc[2 * kk][3]);
                pa[2] = Mma<D>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[3] = Mma<D>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
                for (int n2 = 0; n2 < HD / 16; ++n2) {
                    unsigned vb[4];
                    sp_ldmatrix4_trans(vb, vt + (kk * 16 + vrow) * P + n2 * 16 + vcol);
                    Mma<D>::run(acc[2 * n2], pa, vb[0], vb[1]);
                    Mma<D>::run(acc[2 * n2 + 1], pa, vb[2], vb[3]);
                }
            }
            m0 = mx0;
            m1 = mx1;
        }
        // Every warp is done with this buffer before the next iteration refills it.
        __syncthreads();
    }
    if (q0 >= seq) return;
    l0 += __shfl_xor_sync(0xffffffff, l0, 1);
    l0 += __shfl_xor_sync(0xffffffff, l0, 2);
    l1 += __shfl_xor_sync(0xffffffff, l1, 1);
    l1 += __shfl_xor_sync(0xffffffff, l1, 2);
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        const u64 c = (u64)h * HD + n * 8 + 2 * t;
        if (r0 < seq) *(unsigned*)(o + (first + r0) * hid + c) = Mma<D>::pack(acc[n][0] * i0, acc[n][1] * i0);
        if (r1 < seq) *(unsigned*)(o + (first + r1) * hid + c) = Mma<D>::pack(acc[n][2] * i1, acc[n][3] * i1);
    }
#endif
}
// Blocks of 4 warps (64 queries; the launcher's SP_MMA_WARPS), with the register budget
// that lets `minb` of them share an SM: measured on the H100 at MiniLM's 512 x 128 tokens,
// 4 warps at 5 blocks per SM ran head width 32 in 140 us where 8 warps at the compiler's
// choice (2 blocks) took 174, and width 64 in 217 us (4 blocks) against 346
// (examples/kernel_bench.rs).
#define SP_ATTN_MMA(hd, minb)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128, minb) sp_attention_mma##hd##_f16(                       \
        const void* qkv, const float* mask, const i64* offsets, void* out, int seq, int heads, i64 tokens) {    \
        attention_mma_k<F16, hd>(qkv, mask, offsets, out, seq, heads, tokens);                                  \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(128, minb) sp_attention_mma##hd##_bf16(                      \
        const void* qkv, const float* mask, const i64* offsets, void* out, int seq, int heads, i64 tokens) {    \
        attention_mma_k<BF16, hd>(qkv, mask, offsets, out, seq, heads, tokens);                                 \
    }
#if SP_WANT(SP_GROUP_ATTENTION_MMA + 0)
SP_ATTN_MMA(16, 5)
#endif
#if SP_WANT(SP_GROUP_ATTENTION_MMA + 1)
SP_ATTN_MMA(32, 5)
#endif
#if SP_WANT(SP_GROUP_ATTENTION_MMA + 2)
SP_ATTN_MMA(64, 4)
#endif
#if SP_WANT(SP_GROUP_ATTENTION_MMA + 3)
SP_ATTN_MMA(128, 3)
#endif

// Kernel::MeanPoolNorm: one block per sentence; thread c sums column c over the real tokens.
template <class D>
__device__ __forceinline__ void mean_pool_norm_k(const void* xv, const float* mask, float* out, u64 batch, u64 seq, u64 dim) {
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    for (u64 b = blockIdx.x; b < batch; b += gridDim.x) {
        const float* mb = mask + b * seq;
        double cnt = 0.0;
        for (u64 s = threadIdx.x; s < seq; s += blockDim.x) cnt += mb[s];
        cnt = sp_block_sum(cnt, shd);
        const float count = (float)fmax(cnt, 1e-9);
        double sq = 0.0;
        for (u64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float acc = 0.0f;
            for (u64 s = 0; s < seq; ++s) {
                float w = mb[s];
                if (w != 0.0f) acc = fmaf(w, D::ld(x, (b * seq + s) * dim + c), acc);
            }
            float mean = acc / count;
            out[b * dim + c] = mean;
            sq += (double)mean * mean;
        }
        sq = sp_block_sum(sq, shd);
        const float inv = (float)(1.0 / fmax(sqrt(sq), 1e-12));
        for (u64 c = threadIdx.x; c < dim; c += blockDim.x) out[b * dim + c] *= inv;
    }
}
#if SP_WANT(SP_GROUP_POOL)
SP_EXPORT3(sp_mean_pool_norm, mean_pool_norm_k, (const void* x, const float* mask, float* out, u64 batch, u64 seq, u64 dim),
           (x, mask, out, batch, seq, dim))
#endif

// Kernel::MeanPoolNorm (padded: `mask` [batch, seq]) and Kernel::MeanPoolNormPacked
// (`offsets`, rows from sp_seq_rows) for rows of at most SP_POOL_MAX_DIM columns: one block of
// SP_POOL_WARPS warps per sentence; warp w sums the sentence's rows w, w + SP_POOL_WARPS, ...,
// lane l columns 2l and 2l + 1 of every 64, so each step reads whole rows and the rows are
// spread over the warps. The kernel above walks every row with one thread per column: at
// 64 x 512 tokens it took 0.2 ms of a 4.3 ms forward on the H100 (64 blocks, 512 rows one
// after another). Partial sums meet in shared memory; the norm's sum is in double. Rows of a
// multiple of 8 columns take 16-byte loads, two rows per warp and step (at 512 x 128 x 384 in
// f16 the 4-byte form ran at a third of the H100's memory bandwidth: 56 us).
#define SP_POOL_WARPS 8
#define SP_POOL_MAX_DIM 1024
#define SP_POOL_ROWS 2
// Widest row of the 16-byte form: 2 chunks of 8 columns per lane (wider rows take the 4-byte
// form; four chunks per lane took 96 registers, two blocks per SM).
#define SP_POOL_VEC_DIM 512
template <class D>
__device__ __forceinline__ void pool_rows_k(const void* xv, const float* mask, const i64* offsets, float* out,
                                            u64 batch, int seq, u64 dim, i64 tokens) {
    __shared__ float part[SP_POOL_WARPS][SP_POOL_MAX_DIM];
    __shared__ float counts[SP_POOL_WARPS];
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // Whole 16-byte chunks: rows of a multiple of 8 columns (at most SP_POOL_VEC_DIM) from a
    // 16-byte aligned start.
    const bool vec = dim % 8 == 0 && dim <= SP_POOL_VEC_DIM && ((unsigned long long)xv & 15) == 0;
    for (u64 b = blockIdx.x; b < batch; b += gridDim.x) {
        u64 first;
        int n;
        sp_seq_rows(offsets, b, seq, tokens, &first, &n);
        float cnt = 0.0f;
        if (vec) {
            // Lane l holds columns 8l..8l+7 of every 256: one 16-byte load per 8 columns
            // (two for f32), and SP_POOL_ROWS rows in flight per step.
            float acc[SP_POOL_VEC_DIM / 256][8];
#pragma unroll
            for (int k = 0; k < SP_POOL_VEC_DIM / 256; ++k)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[k][e] = 0.0f;
            for (int s0 = warp; s0 < n; s0 += SP_POOL_ROWS * SP_POOL_WARPS) {
                float w[SP_POOL_ROWS];
                u64 row[SP_POOL_ROWS];
#pragma unroll
                for (int j = 0; j < SP_POOL_ROWS; ++j) {
                    const int sj = s0 + j * SP_POOL_WARPS;
                    w[j] = sj < n ? (mask ? mask[first + sj] : 1.0f) : 0.0f;
                    row[j] = (first + (sj < n ? sj : s0)) * dim;
                    cnt += w[j];
                }
#pragma unroll
                for (int k = 0; k < SP_POOL_VEC_DIM / 256; ++k) {
                    const u64 c = 8 * (lane + 32 * k);
                    if (c < dim) {
                        float v[SP_POOL_ROWS][8];
#pragma unroll
                        for (int j = 0; j < SP_POOL_ROWS; ++j) {
                            // Rows of weight 0 are not read (warp-uniform): padding may hold
                            // anything, and 0 * inf would poison the sum.
                            if (w[j] != 0.0f) D::ld8(x, row[j] + c, v[j]);
                            else
#pragma unroll
                                for (int e = 0; e < 8; ++e) v[j][e] = 0.0f;
                        }
#pragma unroll
                        for (int j = 0; j < SP_POOL_ROWS; ++j)
#pragma unroll
                            for (int e = 0; e < 8; ++e) acc[k][e] = fmaf(w[j], v[j][e], acc[k][e]);
                    }
                }
            }
            __syncthreads();  // the previous sentence is done with part[] and counts[]
#pragma unroll
            for (int k = 0; k < SP_POOL_VEC_DIM / 256; ++k) {
                const u64 c = 8 * (lane + 32 * k);
                if (c < dim)
#pragma unroll
                    for (int e = 0; e < 8; ++e) part[warp][c + e] = acc[k][e];
            }
        } else {
            float acc[SP_POOL_MAX_DIM / 64][2];
#pragma unroll
            for (int k = 0; k < SP_POOL_MAX_DIM / 64; ++k) acc[k][0] = acc[k][1] = 0.0f;
            for (int s = warp; s < n; s += SP_POOL_WARPS) {
                const float w = mask ? mask[first + s] : 1.0f;
                cnt += w;
                if (w == 0.0f) continue;  // warp-uniform
                const u64 r = (first + s) * dim;
#pragma unroll
                for (int k = 0; k < SP_POOL_MAX_DIM / 64; ++k) {
                    const u64 c = 2 * lane + 64 * k;
                    if (c < dim) acc[k][0] = fmaf(w, D::ld(x, r + c), acc[k][0]);
                    if (c + 1 < dim) acc[k][1] = fmaf(w, D::ld(x, r + c + 1), acc[k][1]);
                }
            }
            __syncthreads();  // the previous sentence is done with part[] and counts[]
#pragma unroll
            for (int k = 0; k < SP_POOL_MAX_DIM / 64; ++k) {
                const u64 c = 2 * lane + 64 * k;
                if (c < dim) part[warp][c] = acc[k][0];
                if (c + 1 < dim) part[warp][c + 1] = acc[k][1];
            }
        }
        if (lane == 0) counts[warp] = cnt;
        __syncthreads();
        float count = 0.0f;
#pragma unroll
        for (int w = 0; w < SP_POOL_WARPS; ++w) count += counts[w];
        count = fmaxf(count, 1e-9f);
        double sq = 0.0;
        // Each thread reads and rewrites only its own columns of part[0].
        for (u64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < SP_POOL_WARPS; ++w) sum += part[w][c];
            const float mean = sum / count;
            part[0][c] = mean;
            sq += (double)mean * mean;
        }
        sq = sp_block_sum(sq, shd);
        const float inv = (float)(1.0 / fmax(sqrt(sq), 1e-12));
        for (u64 c = threadIdx.x; c < dim; c += blockDim.x) out[b * dim + c] = part[0][c] * inv;
    }
}
// At most 64 registers, so four blocks (a sentence each) fit an SM: at 95 registers two did,
// and 512 sentences ran in two waves.
#define SP_POOL_ROWS_K(suffix, D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * SP_POOL_WARPS, 4)                                              \
        sp_pool_rows_##suffix(const void* x, const float* mask, const i64* offsets, float* out, u64 batch, int seq, \
                              u64 dim, i64 tokens) {                                                                 \
        pool_rows_k<D>(x, mask, offsets, out, batch, seq, dim, tokens);                                              \
    }
#if SP_WANT(SP_GROUP_POOL)
SP_POOL_ROWS_K(f32, F32)
SP_POOL_ROWS_K(f16, F16)
SP_POOL_ROWS_K(bf16, BF16)
#endif

// Keeps one thread busy for `nanos` of GPU time, so later work on the stream starts no sooner.
#if SP_WANT(SP_GROUP_BASIC)
extern "C" __global__ void sp_sleep(u64 nanos) {
    u64 start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanos);
}
#endif

// ---- Ops of the model families past BERT (RMSNorm, rotary positions, gated MLPs) ----
// Plain kernels, one thread per element or one block per row, as the CPU loops in
// cpu/kernels/{rms_norm,rope,gated}.rs.

// out = x / sqrt(mean(x^2) + eps) * gamma, one block per row; statistics in double.
template <class D>
__device__ __forceinline__ void rms_norm_k(const void* xv, const void* gv, void* out, u64 rows, u64 cols, float eps) {
    __shared__ double shd[32];
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* gamma = SP_IN(D, gv);
    typename D::T* o = SP_OUT(D, out);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        u64 base = r * cols;
        double s = 0.0;
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x) {
            double t = D::ld(x, base + c);
            s += t * t;
        }
        double ms = sp_block_sum(s, shd) / (double)cols;
        float inv = (float)(1.0 / sqrt(ms + (double)eps));
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x) D::st(o, base + c, D::ld(x, base + c) * inv * D::ld(gamma, c));
    }
}
#if SP_WANT(SP_GROUP_NORM)
SP_EXPORT3(sp_rms_norm, rms_norm_k, (const void* x, const void* gamma, void* out, u64 rows, u64 cols, float eps),
           (x, gamma, out, rows, cols, eps))
#endif

// Rotary positions, rotate-half form, on [batch, seq, heads, head_dim]; one thread per
// (row, i < head_dim / 2) pair; cos and sin are f32 [positions, head_dim / 2]. Heads from
// `rotated` on are copied unchanged (the values of a fused QKV projection).
template <class D>
__device__ __forceinline__ void rope_k(const void* xv, const float* cs, const float* sn, void* out, u64 batch, u64 seq,
                                       u64 heads, u64 head_dim, u64 rotated) {
    const typename D::T* x = SP_IN(D, xv);
    typename D::T* o = SP_OUT(D, out);
    const u64 half = head_dim / 2;
    SP_GRID_LOOP(i, batch * seq * heads * half) {
        u64 j = i % half, row = i / half, p = (row / heads) % seq, base = row * head_dim;
        float x1 = D::ld(x, base + j), x2 = D::ld(x, base + j + half);
        if (row % heads >= rotated) {
            D::st(o, base + j, x1);
            D::st(o, base + j + half, x2);
            continue;
        }
        float c = cs[p * half + j], s = sn[p * half + j];
        D::st(o, base + j, x1 * c - x2 * s);
        D::st(o, base + j + half, x2 * c + x1 * s);
    }
}
#if SP_WANT(SP_GROUP_ACT)
SP_EXPORT3(sp_rope, rope_k,
           (const void* x, const float* cs, const float* sn, void* out, u64 batch, u64 seq, u64 heads, u64 head_dim,
            u64 rotated),
           (x, cs, sn, out, batch, seq, heads, head_dim, rotated))
#endif

// act: 0 GELU (erf), 1 GELU (tanh), 2 SiLU (GateActivation's codes in kernels.rs).
__device__ __forceinline__ float sp_gate_act(int act, float v) {
    if (act == 0) return sp_gelu(v);
    if (act == 1) return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    return v / (1.0f + expf(-v));
}

// out[r, c] = act(x[r, c]) * x[r, cols + c] over x: [rows, 2 * cols].
template <class D>
__device__ __forceinline__ void gated_act_k(const void* xv, void* out, u64 rows, u64 cols, int act) {
    const typename D::T* x = SP_IN(D, xv);
    typename D::T* o = SP_OUT(D, out);
    SP_GRID_LOOP(i, rows * cols) {
        u64 r = i / cols, c = i % cols;
        D::st(o, i, sp_gate_act(act, D::ld(x, r * 2 * cols + c)) * D::ld(x, r * 2 * cols + cols + c));
    }
}
#if SP_WANT(SP_GROUP_ACT)
SP_EXPORT3(sp_gated_act, gated_act_k, (const void* x, void* out, u64 rows, u64 cols, int act), (x, out, rows, cols, act))
#endif
