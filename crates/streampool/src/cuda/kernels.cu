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
struct F32 {
    typedef float T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return p[i]; }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = v; }
};
struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return sp_h2f(p[i]); }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = sp_f2h(v); }
};
struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float ld(const T* p, u64 i) { return sp_b2f(p[i]); }
    static __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = sp_f2b(v); }
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
SP_EXPORT3(sp_fill, fill_k, (void* out, u64 n, float v), (out, n, v))

// dtype codes: 0 f32, 1 f16, 2 bf16.
__device__ __forceinline__ float sp_ld_any(int t, const void* p, u64 i) {
    if (t == 1) return sp_h2f(((const u16*)p)[i]);
    if (t == 2) return sp_b2f(((const u16*)p)[i]);
    return ((const float*)p)[i];
}
extern "C" __global__ void sp_cast(int from, int to, const void* x, void* out, u64 n) {
    SP_GRID_LOOP(i, n) {
        float v = sp_ld_any(from, x, i);
        if (to == 1) ((u16*)out)[i] = sp_f2h(v);
        else if (to == 2) ((u16*)out)[i] = sp_f2b(v);
        else ((float*)out)[i] = v;
    }
}

template <typename T>
__device__ void sp_copy(const T* src, T* out, u64 n, Dims d) {
    SP_GRID_LOOP(i, n) {
        u64 oa, ob;
        sp_offsets(d, i, &oa, &ob);
        out[i] = src[oa];
    }
}
extern "C" __global__ void sp_copy16(const unsigned short* s, unsigned short* o, u64 n, Dims d) { sp_copy(s, o, n, d); }
extern "C" __global__ void sp_copy32(const unsigned int* s, unsigned int* o, u64 n, Dims d) { sp_copy(s, o, n, d); }
extern "C" __global__ void sp_copy64(const u64* s, u64* o, u64 n, Dims d) { sp_copy(s, o, n, d); }

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
SP_EXPORT3(sp_unary, unary_k, (int op, const void* x, void* out, u64 n, float mul, float add), (op, x, out, n, mul, add))

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
SP_EXPORT3(sp_binary, binary_k, (int op, const void* a, const void* b, void* out, u64 n, int contiguous, Dims d),
           (op, a, b, out, n, contiguous, d))

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
SP_EXPORT3(sp_softmax, softmax_k, (const void* x, void* out, u64 rows, u64 cols), (x, out, rows, cols))

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
SP_EXPORT3(sp_layer_norm, layer_norm_k,
           (const void* x, const void* residual, const void* gamma, const void* beta, void* out, u64 rows, u64 cols, float eps),
           (x, residual, gamma, beta, out, rows, cols, eps))

// out = act(x + bias); act: 0 identity, 1 relu, 2 gelu.
template <class D> __device__ __forceinline__ void bias_act_k(const void* xv, const void* bv, void* out, u64 rows, u64 cols, int act) {
    const typename D::T* x = SP_IN(D, xv);
    const typename D::T* bias = SP_IN(D, bv);
    typename D::T* o = SP_OUT(D, out);
    u64 n = rows * cols;
    SP_GRID_LOOP(i, n) {
        float v = D::ld(x, i) + D::ld(bias, i % cols);
        D::st(o, i, act == 0 ? v : (act == 1 ? fmaxf(v, 0.0f) : sp_gelu(v)));
    }
}
SP_EXPORT3(sp_bias_act, bias_act_k, (const void* x, const void* bias, void* out, u64 rows, u64 cols, int act),
           (x, bias, out, rows, cols, act))

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
SP_EXPORT3(sp_index_select, index_select_k,
           (const void* table, const i64* ids, void* out, u64 n_ids, u64 row_len, u64 table_rows),
           (table, ids, out, n_ids, row_len, table_rows))

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
SP_EXPORT3(sp_reduce, reduce_k, (int op, const void* x, void* out, u64 outer, u64 axis, u64 inner),
           (op, x, out, outer, axis, inner))

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
SP_EXPORT3(sp_reduce_rows, reduce_rows_k, (int op, const void* x, void* out, u64 rows, u64 axis), (op, x, out, rows, axis))

// Fused attention (Kernel::Attention): qkv is [batch, seq, 3, heads, d], out [batch, seq, heads, d].
// Grid (ceil(seq / blockDim), heads, batch); one query per thread, its q and output row in
// registers (HD >= d, zero-padded), keys and values staged through shared memory as float in
// tiles of SP_KT; flash-attention style online softmax with float statistics, updated once per
// chunk of 16 keys. A padded key (mask == 0) scores -FLT_MAX, as Hugging Face's additive mask.
#define SP_FLT_MAX 3.402823466e38f
template <class D, int HD, int KT>
__device__ __forceinline__ void attention_k(const void* qkvv, const float* mask, void* out, int seq, int heads, int d) {
    __shared__ float ks[KT][HD];
    __shared__ float vs[KT][HD];
    __shared__ float ms[KT];
    const typename D::T* qkv = SP_IN(D, qkvv);
    typename D::T* o = SP_OUT(D, out);
    const int b = blockIdx.z, h = blockIdx.y;
    const int qi = blockIdx.x * blockDim.x + threadIdx.x;
    const u64 hid = (u64)heads * d, row = 3 * hid;
    const u64 base = (u64)b * seq * row;
    const bool active = qi < seq;
    float q[HD], acc[HD];
#pragma unroll
    for (int c = 0; c < HD; ++c) {
        q[c] = (active && c < d) ? D::ld(qkv, base + (u64)qi * row + (u64)h * d + c) : 0.0f;
        acc[c] = 0.0f;
    }
    float m = SP_NEG_INF, l = 0.0f;
    for (int k0 = 0; k0 < seq; k0 += KT) {
        const int nk = min(KT, seq - k0);
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
            ms[j] = j < nk ? (mask ? mask[(u64)b * seq + k0 + j] : 1.0f) : -1.0f;
        }
        __syncthreads();
        if (!active) continue;
        for (int j0 = 0; j0 < nk; j0 += 16) {
            float s[16];
            float mx = m;
#pragma unroll
            for (int jj = 0; jj < 16; ++jj) {
                const int j = j0 + jj;
                float v = SP_NEG_INF;
                const float mk = ms[j];
                if (mk == 0.0f) {
                    v = -SP_FLT_MAX;
                } else if (mk > 0.0f) {
                    v = 0.0f;
#pragma unroll
                    for (int c = 0; c < HD; ++c) v = fmaf(q[c], ks[j][c], v);
                }
                s[jj] = v;
                mx = fmaxf(mx, v);
            }
            // mx is finite: chunk j0 holds at least one key of this tile.
            const float corr = expf(m - mx);
            l *= corr;
#pragma unroll
            for (int c = 0; c < HD; ++c) acc[c] *= corr;
#pragma unroll
            for (int jj = 0; jj < 16; ++jj) {
                const float p = expf(s[jj] - mx);
                l += p;
#pragma unroll
                for (int c = 0; c < HD; ++c) acc[c] = fmaf(p, vs[j0 + jj][c], acc[c]);
            }
            m = mx;
        }
    }
    if (active) {
        const float inv = 1.0f / l;
        const u64 ob = ((u64)b * seq + qi) * hid + (u64)h * d;
#pragma unroll
        for (int c = 0; c < HD; ++c) {
            if (c < d) D::st(o, ob + c, acc[c] * inv);
        }
    }
}
#define SP_ATTN(hd, kt)                                                                                         \
    template <class D>                                                                                          \
    __device__ __forceinline__ void attention##hd##_k(const void* qkv, const float* mask, void* out, int seq,  \
                                                      int heads, int d) {                                      \
        attention_k<D, hd, kt>(qkv, mask, out, seq, heads, d);                                                  \
    }                                                                                                           \
    SP_EXPORT3(sp_attention##hd, attention##hd##_k,                                                             \
               (const void* qkv, const float* mask, void* out, int seq, int heads, int d),                      \
               (qkv, mask, out, seq, heads, d))
SP_ATTN(16, 64)
SP_ATTN(32, 64)
SP_ATTN(64, 64)
SP_ATTN(128, 32)

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
SP_EXPORT3(sp_mean_pool_norm, mean_pool_norm_k, (const void* x, const float* mask, float* out, u64 batch, u64 seq, u64 dim),
           (x, mask, out, batch, seq, dim))

// Keeps one thread busy for `nanos` of GPU time, so later work on the stream starts no sooner.
extern "C" __global__ void sp_sleep(u64 nanos) {
    u64 start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanos);
}
