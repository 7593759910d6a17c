// Embedding, fused residual + RMSNorm, and bias + RoPE + KV write.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"

namespace gptoss::kernels::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const __nv_bfloat16* __restrict__ table, int hidden,
                                 float* __restrict__ x) {
    const int t = blockIdx.x;
    const __nv_bfloat16* row = table + static_cast<int64_t>(ids[t]) * hidden;
    float* out = x + static_cast<int64_t>(t) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

// One block per token. hidden_size ≤ 4 · blockDim · kMaxPerThread values kept in registers.
// 1024 threads: at decode (one block per token) the block's latency is the cost, so each thread
// handles only a few elements.
constexpr int kNormThreads = 1024;
constexpr int kMaxPerThread = 4;  // supports hidden_size up to 4096

__global__ void __launch_bounds__(kNormThreads) residual_rmsnorm_kernel(const ResidualRmsNormArgs a) {
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    const int H = a.hidden_size;
    float* x = a.x + static_cast<int64_t>(t) * H;
    float v[kMaxPerThread];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < H) {
            float xi = x[i];
            if (a.add != nullptr) {
                float acc = a.add_bias ? a.add_bias[i] : 0.0f;
                for (int k = 0; k < a.num_add; ++k) {
                    const float w = a.add_weights ? a.add_weights[t * a.num_add + k] : 1.0f;
                    acc += w * a.add[(static_cast<int64_t>(t) * a.num_add + k) * H + i];
                }
                xi += acc;
                x[i] = xi;
            }
            v[j] = xi;
            ss += xi * xi;
        }
    }
    if (a.out == nullptr && a.out_f32 == nullptr) return;
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(H) + a.eps);
    auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < H) {
            const float y = v[j] * inv * a.weight[i];
            if (out) out[static_cast<int64_t>(t) * H + i] = __float2bfloat16(y);
            if (a.out_f32) a.out_f32[static_cast<int64_t>(t) * H + i] = y;
        }
    }
}

// One block per token; one thread per rotation pair of every head (q, k) plus v copies.
__global__ void qkv_rope_kernel(const QkvRopeArgs a) {
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    const int t = blockIdx.x;
    const int hd = a.head_dim, half = hd / 2;
    const int nq = a.num_heads, nkv = a.num_kv_heads;
    const int width = (nq + 2 * nkv) * hd;
    const float* row = a.qkv + static_cast<int64_t>(t) * width;
    const float pos = static_cast<float>(a.positions[t]);
    const int slot = a.slot_mapping[t];
    auto* q_out = static_cast<__nv_bfloat16*>(a.q_out) + static_cast<int64_t>(t) * nq * hd;
    // Rotations: (nq + nkv) heads × half pairs.
    for (int idx = threadIdx.x; idx < (nq + nkv) * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        // As transformers: angle = position · inv_freq in fp32, cos/sin times the concentration.
        float s, c;
        sincosf(pos * a.inv_freq[i], &s, &c);
        c *= a.attention_scaling;
        s *= a.attention_scaling;
        const int base = h * hd;  // q heads first, then k heads
        const float x1 = row[base + i] + a.bias[base + i];
        const float x2 = row[base + i + half] + a.bias[base + i + half];
        const float y1 = x1 * c - x2 * s;
        const float y2 = x2 * c + x1 * s;
        if (h < nq) {
            q_out[base + i] = __float2bfloat16(y1);
            q_out[base + i + half] = __float2bfloat16(y2);
        } else if (slot >= 0) {
            const int64_t dst = static_cast<int64_t>(slot) * nkv * hd + (h - nq) * hd;
            store_kv(a.k_cache, dst + i, y1, a.kv_fp8);
            store_kv(a.k_cache, dst + i + half, y2, a.kv_fp8);
        }
    }
    if (slot >= 0) {
        for (int i = threadIdx.x; i < nkv * hd; i += blockDim.x) {
            const int src = (nq + nkv) * hd + i;
            store_kv(a.v_cache, static_cast<int64_t>(slot) * nkv * hd + i, row[src] + a.bias[src], a.kv_fp8);
        }
    }
}

__global__ void fill_random_bf16_kernel(__nv_bfloat16* out, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
        out[i] = __float2bfloat16(static_cast<float>(r >> 40) * 0x1.0p-24f * 4.0f - 2.0f);
    }
}

__global__ void fill_random_fp8_kernel(uint8_t* out, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
        out[i] =
            __nv_cvt_float_to_fp8(static_cast<float>(r >> 40) * 0x1.0p-24f * 4.0f - 2.0f, __NV_SATFINITE, __NV_E4M3);
    }
}

}  // namespace

void fill_random_fp8(void* out, int64_t n, uint64_t seed, cudaStream_t stream) {
    if (n == 0) return;
    fill_random_fp8_kernel<<<4096, 256, 0, stream>>>(static_cast<uint8_t*>(out), n, seed);
    CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(void* out, int64_t n, uint64_t seed, cudaStream_t stream) {
    if (n == 0) return;
    fill_random_bf16_kernel<<<4096, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), n, seed);
    CUDA_CHECK_LAUNCH();
}

void embedding(const int32_t* ids, int num_tokens, const void* table, int hidden, float* x, cudaStream_t stream) {
    if (num_tokens == 0) return;
    embedding_kernel<<<num_tokens, 256, 0, stream>>>(ids, static_cast<const __nv_bfloat16*>(table), hidden, x);
    CUDA_CHECK_LAUNCH();
}

void residual_rmsnorm(const ResidualRmsNormArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.hidden_size <= kNormThreads * kMaxPerThread, "hidden_size %d too large", a.hidden_size);
    if (a.num_tokens == 0) return;
    launch_pdl(residual_rmsnorm_kernel, a.num_tokens, kNormThreads, 0, stream, a);
}

void qkv_bias_rope_kv_write(const QkvRopeArgs& a, cudaStream_t stream) {
    if (a.num_tokens == 0) return;
    launch_pdl(qkv_rope_kernel, a.num_tokens, 1024, 0, stream, a);
}

}  // namespace gptoss::kernels::cuda
