#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane (a 2880-wide row in 2 rounds)

__device__ __forceinline__ void load_x8(const float* x, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x) + 1);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
}
__device__ __forceinline__ void load_x8(const __nv_bfloat16* x, float (&v)[8]) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(x));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// One warp per output row; lanes stride over 8-element chunks of the row.
template <typename XT>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvArgs a) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * kWarps + warp;
    if (row >= a.n) return;
    const int chunks = a.k / 8;
    const uint4* w =
        reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.w) + static_cast<int64_t>(row) * a.k);
    const XT* x = static_cast<const XT*>(a.x);
    float acc[kGemvMaxTokens];
#pragma unroll
    for (int m = 0; m < kGemvMaxTokens; ++m) acc[m] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        uint4 wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int c = c0 + 32 * u;
            wv[u] = c < chunks ? __ldg(w + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int c = c0 + 32 * u;
            if (c >= chunks) break;
            const uint32_t ww[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
            float wf[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wf[2 * i] = __uint_as_float(ww[i] << 16);
                wf[2 * i + 1] = __uint_as_float(ww[i] & 0xffff0000u);
            }
#pragma unroll
            for (int m = 0; m < kGemvMaxTokens; ++m) {
                if (m < a.num_tokens) {
                    float xv[8];
                    load_x8(x + static_cast<int64_t>(m) * a.k + 8 * c, xv);
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[m] += wf[i] * xv[i];
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < kGemvMaxTokens; ++m) {
        if (m < a.num_tokens) {
            const float s = warp_sum(acc[m]);
            if (lane == 0) a.y[static_cast<int64_t>(m) * a.n + row] = s + (a.bias ? a.bias[row] : 0.0f);
        }
    }
}

}  // namespace

void gemv_bf16w(const GemvArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.num_tokens >= 1 && a.num_tokens <= kGemvMaxTokens && a.k % 8 == 0,
                 "gemv: %d tokens, k %d unsupported", a.num_tokens, a.k);
    const int blocks = (a.n + kWarps - 1) / kWarps;
    if (a.x_bf16)
        gemv_kernel<__nv_bfloat16><<<blocks, kWarps * 32, 0, stream>>>(a);
    else
        gemv_kernel<float><<<blocks, kWarps * 32, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
