#include "kernels/cuda/fp8_gemm.h"

#include <bit>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/logging.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_quant.cuh"
#include "kernels/cuda/mxfp4_e4m3.cuh"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kB = kFp8GemmBlock;

// fp8_pow2_scale, to_e4m3: fp8_quant.cuh.

__device__ float from_e4m3(uint32_t byte) {
    __nv_fp8_e4m3 v;
    v.__x = static_cast<__nv_fp8_storage_t>(byte);
    return static_cast<float>(v);
}

__device__ float load_f32(const float* p) { return *p; }
__device__ float load_f32(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// One warp per (row, 128-group) of the padded activation; lane l owns columns 4l..4l+3 of the group.
template <typename T>
__global__ void act_quant_fp8_kernel(const T* __restrict__ x, int m, int k, int k_pad, int m_pad,
                                     uint8_t* __restrict__ xq, float* __restrict__ xs) {
    const int groups = k_pad / kB;
    const int warp = static_cast<int>((blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (warp >= m_pad * groups) return;  // whole warps: blockDim is a multiple of 32
    const int r = warp / groups, g = warp - r * groups;
    const int c0 = g * kB + lane * 4;
    float v[4];
    float amax = 0.0f;
    for (int i = 0; i < 4; ++i) {
        const int c = c0 + i;
        v[i] = (r < m && c < k) ? load_f32(x + static_cast<int64_t>(r) * k + c) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = fp8_pow2_scale(amax);
    const float inv = fp8_pow2_inverse(s);  // exact: s is a power of two
    const uint32_t packed =
        static_cast<uint32_t>(to_e4m3(v[0] * inv)) | static_cast<uint32_t>(to_e4m3(v[1] * inv)) << 8 |
        static_cast<uint32_t>(to_e4m3(v[2] * inv)) << 16 | static_cast<uint32_t>(to_e4m3(v[3] * inv)) << 24;
    // 4-byte aligned: k_pad and c0 are multiples of 4 (little-endian: byte i is column c0 + i).
    *reinterpret_cast<uint32_t*>(xq + static_cast<int64_t>(r) * k_pad + c0) = packed;
    if (lane == 0) xs[static_cast<int64_t>(g) * m_pad + r] = s;
}

template <typename T>
void launch_act_quant(const T* x, int m, int k, int k_pad, uint8_t* xq, float* xs, cudaStream_t stream) {
    ENGINE_CHECK(m >= 0 && k > 0 && k_pad >= k && k_pad % kB == 0, "quantize_act_fp8: m %d k %d k_pad %d", m, k, k_pad);
    if (m == 0) return;
    const int m_pad = fp8_gemm_m_pad(m);
    const int64_t threads = static_cast<int64_t>(m_pad) * (k_pad / kB) * 32;
    const int block = 256;
    act_quant_fp8_kernel<T>
        <<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(x, m, k, k_pad, m_pad, xq, xs);
    CUDA_CHECK_LAUNCH();
}

// One CTA per 128×128 tile of the padded weight [n, k_pad]: amax over the elements present (as
// model::quantize_fp8_blocks), then quantize; columns k..k_pad become zeros.
__global__ void weight_quant_fp8_kernel(const __nv_bfloat16* __restrict__ w, int n, int k, int k_pad,
                                        uint8_t* __restrict__ q, float* __restrict__ s) {
    const int nb = blockIdx.y, kb = blockIdx.x;
    const int col = threadIdx.x & (kB - 1), row0 = threadIdx.x / kB, rstep = blockDim.x / kB;
    const int c = kb * kB + col;
    float amax = 0.0f;
    for (int rr = row0; rr < kB; rr += rstep) {
        const int r = nb * kB + rr;
        if (r < n && c < k) amax = fmaxf(amax, fabsf(__bfloat162float(w[static_cast<int64_t>(r) * k + c])));
    }
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
        amax = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (threadIdx.x == 0) red[0] = amax;
    }
    __syncthreads();
    const float sc = fp8_pow2_scale(red[0]);
    const float inv = 1.0f / sc;
    if (threadIdx.x == 0) s[static_cast<int64_t>(nb) * gridDim.x + kb] = sc;
    for (int rr = row0; rr < kB; rr += rstep) {
        const int r = nb * kB + rr;
        if (r >= n) break;
        const float v = c < k ? __bfloat162float(w[static_cast<int64_t>(r) * k + c]) : 0.0f;
        q[static_cast<int64_t>(r) * k_pad + c] = to_e4m3(v * inv);
    }
}

// weight_quant_fp8_kernel straight from MXFP4 (no bf16 staging), for a whole layer of experts.
// One CTA per (128-K block, 128-row block, expert); thread t owns the 16 columns 16·(t % 8) of rows
// t / 8 + 32·i: 8 packed bytes in, 16 e4m3 bytes out, through one table a 32-group (r24: a float
// conversion per value made this ALU-bound, ~2.5 ms a 120b layer). Every value passes through bf16
// as mxfp4_to_bf16 writes it, so the bytes and scales equal the load-time conversion's
// (mxfp4_to_bf16, then quantize_weight_fp8_bf16). Experts without rows (expert_offsets) are skipped.
__global__ void __launch_bounds__(256)
    weight_quant_fp8_mxfp4_kernel(const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales, int n, int k,
                                  int k_pad, const int* __restrict__ expert_offsets, uint8_t* __restrict__ q,
                                  float* __restrict__ s) {
    const int kb = blockIdx.x, nb = blockIdx.y, e = blockIdx.z;
    if (expert_offsets != nullptr && expert_offsets[e + 1] == expert_offsets[e]) return;
    const int c = threadIdx.x & 7, rr0 = threadIdx.x >> 3;
    const int col = kb * kB + 16 * c;  // this thread's first column
    const bool col_ok = col < k;       // k % 32 == 0: a thread's 16 columns are all in or all out
    const int64_t row_base = static_cast<int64_t>(e) * n + static_cast<int64_t>(nb) * kB;
    constexpr int kIters = kB / 32;
    uint2 packed[kIters];
    float gscale[kIters];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
        const int rr = rr0 + 32 * i;
        packed[i] = make_uint2(0u, 0u);
        gscale[i] = 0.0f;
        if (col_ok && nb * kB + rr < n) {
            const int64_t r = row_base + rr;
            packed[i] = *reinterpret_cast<const uint2*>(blocks + r * (k / 2) + col / 2);
            gscale[i] = e8m0_to_f32(scales[r * (k / 32) + col / 32]);
            // The largest magnitude code (e2m1 values grow with code & 7), bytewise.
            const uint32_t m4 = __vmaxu4(__vmaxu4(packed[i].x & 0x07070707u, (packed[i].x >> 4) & 0x07070707u),
                                         __vmaxu4(packed[i].y & 0x07070707u, (packed[i].y >> 4) & 0x07070707u));
            const uint32_t mc = max(max(m4 & 0xffu, (m4 >> 8) & 0xffu), max((m4 >> 16) & 0xffu, m4 >> 24));
            amax = fmaxf(amax, __bfloat162float(__float2bfloat16(e2m1_value(mc) * gscale[i])));
        }
    }
    __shared__ float red[8];
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = red[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) amax = fmaxf(amax, red[w]);
    const float sc = fp8_pow2_scale(amax);
    const float inv = 1.0f / sc;
    if (threadIdx.x == 0) s[(static_cast<int64_t>(e) * gridDim.y + nb) * (k_pad / kB) + kb] = sc;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
        const int rr = rr0 + 32 * i;
        if (nb * kB + rr >= n) break;
        uint4 out = make_uint4(0u, 0u, 0u, 0u);
        if (col_ok) {
            const uint2 t = e4m3_magnitude_table(gscale[i], inv);
            out = make_uint4(e2m1x4_to_e4m3(packed[i].x, t), e2m1x4_to_e4m3(packed[i].x >> 16, t),
                             e2m1x4_to_e4m3(packed[i].y, t), e2m1x4_to_e4m3(packed[i].y >> 16, t));
        }
        *reinterpret_cast<uint4*>(q + (row_base + rr) * k_pad + col) = out;
    }
}

__global__ void pad_fp8_weight_q_kernel(const uint8_t* __restrict__ src, int n, int k, int k_pad,
                                        uint8_t* __restrict__ dst) {
    const int64_t total = static_cast<int64_t>(n) * k_pad;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / k_pad;
        const int c = static_cast<int>(i - r * k_pad);
        dst[i] = c < k ? src[r * k + c] : 0;
    }
}

__global__ void pad_fp8_weight_scales_kernel(const float* __restrict__ src, int nbs, int kbs, int kbs_pad,
                                             float* __restrict__ dst) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nbs * kbs_pad) return;
    const int nb = i / kbs_pad, kb = i - nb * kbs_pad;
    dst[i] = kb < kbs ? src[nb * kbs + kb] : 1.0f;
}

// One thread per output; 4 bytes of each operand per load (rows are k_pad long, k_pad % 128 == 0).
template <typename OutT>  // float or __nv_bfloat16
__global__ void fp8_gemm_reference_kernel(const uint8_t* __restrict__ xq, const float* __restrict__ xs,
                                          const uint8_t* __restrict__ wq, const float* __restrict__ ws,
                                          const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ y, int m,
                                          int m_pad, int n, int k_pad) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= n || r >= m) return;
    const int kbs = k_pad / kB;
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(xq + static_cast<int64_t>(r) * k_pad);
    const uint32_t* wr = reinterpret_cast<const uint32_t*>(wq + static_cast<int64_t>(c) * k_pad);
    float acc = 0.0f;
    for (int kb = 0; kb < kbs; ++kb) {
        float blk = 0.0f;
        for (int j = kb * (kB / 4); j < (kb + 1) * (kB / 4); ++j) {
            const uint32_t a = xr[j], b = wr[j];
            for (int i = 0; i < 4; ++i)
                blk = fmaf(from_e4m3((a >> (8 * i)) & 0xffu), from_e4m3((b >> (8 * i)) & 0xffu), blk);
        }
        acc = fmaf(blk, xs[static_cast<int64_t>(kb) * m_pad + r] * ws[static_cast<int64_t>(c / kB) * kbs + kb], acc);
    }
    if (bias) acc += __bfloat162float(bias[c]);
    if constexpr (std::is_same_v<OutT, float>)
        y[static_cast<int64_t>(r) * n + c] = acc;
    else
        y[static_cast<int64_t>(r) * n + c] = __float2bfloat16(acc);
}

__global__ void add_bias_rows_kernel(float* __restrict__ y, const __nv_bfloat16* __restrict__ bias, int rows, int n) {
    const int64_t total = static_cast<int64_t>(rows) * n;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] += __bfloat162float(bias[i % n]);
}

int grid_for(int64_t n, int block) { return static_cast<int>(std::min<int64_t>((n + block - 1) / block, 65536)); }

}  // namespace

void quantize_act_fp8(const float* x, int m, int k, int k_pad, uint8_t* xq, float* xs, cudaStream_t stream) {
    launch_act_quant(x, m, k, k_pad, xq, xs, stream);
}

void quantize_act_fp8_bf16(const void* x, int m, int k, int k_pad, uint8_t* xq, float* xs, cudaStream_t stream) {
    launch_act_quant(static_cast<const __nv_bfloat16*>(x), m, k, k_pad, xq, xs, stream);
}

void pad_fp8_weight(const uint8_t* q_src, const float* scales_src, int n, int k, int k_pad, uint8_t* q_out,
                    float* s_out, cudaStream_t stream) {
    ENGINE_CHECK(n > 0 && k > 0 && k_pad >= k && k_pad % kB == 0, "pad_fp8_weight: n %d k %d k_pad %d", n, k, k_pad);
    pad_fp8_weight_q_kernel<<<grid_for(static_cast<int64_t>(n) * k_pad, 256), 256, 0, stream>>>(q_src, n, k, k_pad,
                                                                                                q_out);
    CUDA_CHECK_LAUNCH();
    const int nbs = (n + kB - 1) / kB, kbs = (k + kB - 1) / kB, kbs_pad = k_pad / kB;
    pad_fp8_weight_scales_kernel<<<grid_for(static_cast<int64_t>(nbs) * kbs_pad, 256), 256, 0, stream>>>(
        scales_src, nbs, kbs, kbs_pad, s_out);
    CUDA_CHECK_LAUNCH();
}

void quantize_weight_fp8_bf16(const void* w, int n, int k, int k_pad, uint8_t* q_out, float* s_out,
                              cudaStream_t stream) {
    ENGINE_CHECK(n > 0 && k > 0 && k_pad >= k && k_pad % kB == 0, "quantize_weight_fp8_bf16: n %d k %d k_pad %d", n, k,
                 k_pad);
    const dim3 grid(k_pad / kB, (n + kB - 1) / kB);
    weight_quant_fp8_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(w), n, k, k_pad, q_out, s_out);
    CUDA_CHECK_LAUNCH();
}

void quantize_weight_fp8_mxfp4(const uint8_t* blocks, const uint8_t* scales, int num_experts, int n, int k, int k_pad,
                               const int* expert_offsets, uint8_t* q_out, float* s_out, cudaStream_t stream) {
    ENGINE_CHECK(num_experts > 0 && n > 0 && k > 0 && k % 32 == 0 && k_pad >= k && k_pad % kB == 0 &&
                     q_out != nullptr && s_out != nullptr,
                 "quantize_weight_fp8_mxfp4: %d experts, n %d k %d k_pad %d", num_experts, n, k, k_pad);
    const dim3 grid((k + kB - 1) / kB, (n + kB - 1) / kB, num_experts);
    weight_quant_fp8_mxfp4_kernel<<<grid, 256, 0, stream>>>(blocks, scales, n, k, k_pad, expert_offsets, q_out, s_out);
    CUDA_CHECK_LAUNCH();
}

Fp8Weight Fp8Weight::from_fp8_blocks(const uint8_t* q_src, const float* scales_src, int n, int k, cudaStream_t stream) {
    Fp8Weight w;
    w.n = n;
    w.k = k;
    w.k_pad = fp8_gemm_k_pad(k);
    w.q = DeviceBuffer(static_cast<size_t>(n) * w.k_pad);
    w.scales = DeviceBuffer(static_cast<size_t>((n + kB - 1) / kB) * (w.k_pad / kB) * sizeof(float));
    pad_fp8_weight(q_src, scales_src, n, k, w.k_pad, w.q.as<uint8_t>(), w.scales.as<float>(), stream);
    return w;
}

Fp8Weight Fp8Weight::from_bf16(const void* src, int n, int k, cudaStream_t stream) {
    Fp8Weight w;
    w.n = n;
    w.k = k;
    w.k_pad = fp8_gemm_k_pad(k);
    w.q = DeviceBuffer(static_cast<size_t>(n) * w.k_pad);
    w.scales = DeviceBuffer(static_cast<size_t>((n + kB - 1) / kB) * (w.k_pad / kB) * sizeof(float));
    quantize_weight_fp8_bf16(src, n, k, w.k_pad, w.q.as<uint8_t>(), w.scales.as<float>(), stream);
    return w;
}

void fp8_gemm_reference(const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y, int m,
                        cudaStream_t stream, bool y_bf16) {
    ENGINE_CHECK(m >= 0 && w.n > 0 && w.k_pad % kB == 0, "fp8_gemm_reference: m %d n %d k_pad %d", m, w.n, w.k_pad);
    if (m == 0) return;
    const dim3 grid((w.n + 127) / 128, m);
    const auto* b = static_cast<const __nv_bfloat16*>(bias);
    if (y_bf16)
        fp8_gemm_reference_kernel<<<grid, 128, 0, stream>>>(xq, xs, w.q.as<uint8_t>(), w.scales.as<float>(), b,
                                                            static_cast<__nv_bfloat16*>(y), m, fp8_gemm_m_pad(m), w.n,
                                                            w.k_pad);
    else
        fp8_gemm_reference_kernel<<<grid, 128, 0, stream>>>(xq, xs, w.q.as<uint8_t>(), w.scales.as<float>(), b,
                                                            static_cast<float*>(y), m, fp8_gemm_m_pad(m), w.n, w.k_pad);
    CUDA_CHECK_LAUNCH();
}

// ---- cuBLASLt ------------------------------------------------------------------------------------

struct Fp8GemmRunner::Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;             // an algorithm was found
    bool bias_epilogue = false;  // the bias is added by cuBLASLt (else by add_bias_rows_kernel)
    int cols = 0;                // M the layouts b and d describe now
    ~Plan() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (d) cublasLtMatrixLayoutDestroy(d);
    }
};

Fp8GemmRunner::Fp8GemmRunner(size_t workspace_bytes) : workspace_(workspace_bytes), workspace_bytes_(workspace_bytes) {
    cublasLtHandle_t h;
    CUBLAS_CHECK(cublasLtCreate(&h));
    handle_ = h;
}

Fp8GemmRunner::~Fp8GemmRunner() {
    plans_.clear();
    if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

namespace {

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

// Plans are cached per M bucket (m_pad up to 64, then the next power of two): the MoE's per-expert
// GEMMs see a different M for nearly every expert and step, and a heuristic query per M would cost
// more host time than the GEMMs take. gemm() sets the real M on the cached layouts.
static int fp8_gemm_m_bucket(int m_pad) {
    return m_pad <= 64 ? m_pad : static_cast<int>(std::bit_ceil(static_cast<unsigned>(m_pad)));
}

Fp8GemmRunner::Plan& Fp8GemmRunner::plan_for(int m_pad, int n, int k_pad, bool bias, bool y_bf16, bool exact) {
    // Exact plans (asked for when a bucket's algorithm refused an M) are keyed by the negated M.
    const int bucket = exact ? m_pad : fp8_gemm_m_bucket(m_pad);
    const auto key = std::make_tuple(exact ? -m_pad : bucket, n, k_pad, bias, y_bf16);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    m_pad = bucket;  // the heuristic sees the bucket's M
    auto p = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    // The attributes are int32_t (cublasLt.h); the enum's values are what cuBLASLt reads.
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;  // W: one scale per 128×128
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;      // x: one per row per 128 of K
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
    // Placeholders (any device address) so the heuristic sees a fully described problem; gemm() sets
    // the real pointers on every call.
    const void* placeholder = workspace_.get();
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, placeholder);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, placeholder);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k_pad, n, k_pad));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k_pad, m_pad, k_pad));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, y_bf16 ? CUDA_R_16BF : CUDA_R_32F, n, m_pad, n));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                      sizeof(workspace_bytes_)));
    const auto query = [&]() {
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        // Not CUBLAS_CHECK: an unsupported combination is an answer (kUnimplemented), not a crash.
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a,
                                                                 p->b, p->d, p->d, pref, 1, &result, &found);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
        p->algo = result.algo;
        return true;
    };
    if (bias) {
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
        // FP8 inputs with an fp32 or bf16 output take a bf16 bias (cuBLAS docs, cublasLtMatmul FP8
        // table).
        const int32_t bias_type = CUDA_R_16BF;
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, placeholder);
        p->bias_epilogue = p->ok = query();
        if (!p->ok) set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
    }
    if (!p->ok) p->ok = query();
    cublasLtMatmulPreferenceDestroy(pref);
    p->cols = m_pad;
    auto& ref = *p;
    plans_.emplace(key, std::move(p));
    return ref;
}

Status Fp8GemmRunner::gemm(const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y, int m,
                           cudaStream_t stream, bool y_bf16) {
    ENGINE_CHECK(w.n > 0 && w.k_pad % kFp8GemmKAlign == 0 && w.k_pad >= w.k,
                 "Fp8GemmRunner: weight n %d k %d k_pad %d (k_pad must be a multiple of %d)", w.n, w.k, w.k_pad,
                 kFp8GemmKAlign);
    if (m < 2) return unimplemented("fp8 gemm: cuBLASLt block-scaled FP8 refuses m = " + std::to_string(m));
    const int m_pad = fp8_gemm_m_pad(m);
    Status st =
        run(plan_for(m_pad, w.n, w.k_pad, bias != nullptr, y_bf16, false), xq, xs, w, bias, y, m_pad, y_bf16, stream);
    if (st.ok()) return st;
    // The bucket's algorithm does not take this M (or there is none at the bucket's M): ask the
    // heuristic for this exact M once (cached either way).
    st = run(plan_for(m_pad, w.n, w.k_pad, bias != nullptr, y_bf16, true), xq, xs, w, bias, y, m_pad, y_bf16, stream);
    if (!st.ok() && warned_.insert(std::make_tuple(m_pad, w.n, w.k_pad, bias != nullptr, y_bf16)).second)
        LOG_WARN("%s (callers fall back to a slower kernel)", st.message().c_str());
    return st;
}

Status Fp8GemmRunner::run(Plan& p, const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y,
                          int m_pad, bool y_bf16, cudaStream_t stream) {
    if (bias && !p.bias_epilogue && y_bf16)  // the bias pass below adds to fp32 rows only
        return unimplemented("fp8 gemm: no bias epilogue for a bf16 output");
    if (!p.ok) {
        return unimplemented("fp8 gemm: no cuBLASLt block-scaled FP8 algorithm for m " + std::to_string(m_pad) + " n " +
                             std::to_string(w.n) + " k " + std::to_string(w.k_pad));
    }
    if (p.cols != m_pad) {  // another M of the bucket: same algorithm, this call's layouts
        const uint64_t cols = static_cast<uint64_t>(m_pad);
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p.d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)));
        p.cols = m_pad;
    }
    const void* a_scale = w.scales.get();
    const void* b_scale = xs;
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    if (p.bias_epilogue) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    const float alpha = 1.0f, beta = 0.0f;
    // Not CUBLAS_CHECK: the bucket's algorithm may not take this M; the caller falls back.
    const cublasStatus_t st =
        cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w.q.get(), p.a, xq, p.b, &beta, y, p.d,
                       y, p.d, &p.algo, workspace_.get(), workspace_bytes_, stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return unimplemented("fp8 gemm: cuBLASLt status " + std::to_string(static_cast<int>(st)) + " at m " +
                             std::to_string(m_pad) + " n " + std::to_string(w.n) + " k " + std::to_string(w.k_pad));
    if (bias && !p.bias_epilogue) {
        add_bias_rows_kernel<<<grid_for(static_cast<int64_t>(m_pad) * w.n, 256), 256, 0, stream>>>(
            static_cast<float*>(y), static_cast<const __nv_bfloat16*>(bias), m_pad, w.n);
        CUDA_CHECK_LAUNCH();
    }
    return ok_status();
}

}  // namespace gptoss::kernels::cuda
