// MoE kernels: router top-k, routing plans, weight-only MXFP4 experts (small batches), and the
// gather / SwiGLU / scatter steps around the grouped bf16 GEMMs (large batches).
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kMaxExperts = 256;

// ---- router ---------------------------------------------------------------------------------
// The k largest logits (ties to the lower index), then softmax over them.
__device__ void select_topk(const float* logits, int num_experts, int k, int32_t* ids, float* weights) {
    int chosen[8];
    float vals[8];
    for (int s = 0; s < k; ++s) {
        int best = -1;
        for (int e = 0; e < num_experts; ++e) {
            bool taken = false;
            for (int q = 0; q < s; ++q) taken |= chosen[q] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        chosen[s] = best;
        vals[s] = logits[best];
    }
    float sum = 0.0f;
    const float mx = vals[0];
    for (int s = 0; s < k; ++s) {
        vals[s] = __expf(vals[s] - mx);
        sum += vals[s];
    }
    for (int s = 0; s < k; ++s) {
        ids[s] = chosen[s];
        weights[s] = vals[s] / sum;
    }
}

__global__ void router_topk_kernel(const RouterTopkArgs a) {
    __shared__ float logits[kMaxExperts];
    const int t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const float* h = a.h + static_cast<int64_t>(t) * a.hidden_size;
    const auto* w = static_cast<const __nv_bfloat16*>(a.weight);
    for (int e = warp; e < a.num_experts; e += nwarps) {
        const __nv_bfloat16* row = w + static_cast<int64_t>(e) * a.hidden_size;
        float acc = 0.0f;
        for (int i = lane; i < a.hidden_size; i += 32) acc += h[i] * __bfloat162float(row[i]);
        acc = warp_sum(acc);
        if (lane == 0) logits[e] = acc + a.bias[e];
    }
    __syncthreads();
    if (threadIdx.x == 0) select_topk(logits, a.num_experts, a.experts_per_token, a.expert_ids + t * a.experts_per_token,
                                      a.expert_weights + t * a.experts_per_token);
}

__global__ void topk_softmax_kernel(const float* logits, const float* bias, int E, int k, int32_t* ids, float* weights) {
    __shared__ float l[kMaxExperts];
    const int t = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x) l[e] = logits[static_cast<int64_t>(t) * E + e] + bias[e];
    __syncthreads();
    if (threadIdx.x == 0) select_topk(l, E, k, ids + t * k, weights + t * k);
}

// ---- routing plan -----------------------------------------------------------------------------
__global__ void moe_plan_kernel(const int32_t* __restrict__ ids, int n, int num_experts, bool stable,
                                int32_t* __restrict__ offsets, int32_t* __restrict__ sorted) {
    __shared__ int counts[kMaxExperts];
    __shared__ int starts[kMaxExperts + 1];
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < num_experts; ++e) {
            starts[e] = run;
            run += counts[e];
        }
        starts[num_experts] = run;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) offsets[e] = starts[e];
    if (stable) {
        // Rank inside the expert = earlier assignments with the same expert: deterministic order.
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int e = ids[i];
            int rank = 0;
            for (int j = 0; j < i; ++j) rank += ids[j] == e;
            sorted[starts[e] + rank] = i;
        }
    } else {
        __syncthreads();
        for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int e = ids[i];
            sorted[starts[e] + atomicAdd(&counts[e], 1)] = i;
        }
    }
}

// ---- weight-only MXFP4 experts ------------------------------------------------------------------
// One CTA per (expert, slice of output rows); the expert's tokens are processed kTok at a time with
// their inputs staged in shared memory as fp32, so each weight byte is read from memory once per
// kTok tokens. Within a row, 4 lanes share a 32-element group (one 32-bit word = 8 codes each), and
// a lane loads all of its words of the row before using any, to keep enough bytes in flight.
constexpr int kTok = 4;
constexpr int kWarps = 8;
constexpr int kMaxWordsPerLane = 16;  // rows of up to 32·4·16 = 4096 inputs

template <int kRows>
__device__ __forceinline__ void mxfp4_rows_dot(const uint8_t* const* blocks, const uint8_t* const* scales, int groups,
                                               const float* xs, int x_stride, int nt, float (&acc)[kRows][kTok]) {
    const int lane = threadIdx.x & 31;
    const int words = groups * 4;
    uint32_t w[kRows][kMaxWordsPerLane];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const uint32_t* b = reinterpret_cast<const uint32_t*>(blocks[r]);
#pragma unroll
        for (int i = 0; i < kMaxWordsPerLane; ++i) {
            const int word = lane + 32 * i;
            w[r][i] = word < words ? __ldg(b + word) : 0u;
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxWordsPerLane; ++i) {
        const int word = lane + 32 * i;
        if (word >= words) break;
        const int g = word >> 2, q = word & 3;
        const int col = 32 * g + 8 * q;  // first input of this word: byte 4q+b holds elements 8q+2b, 8q+2b+1
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float s = e8m0_to_f32(__ldg(scales[r] + g));
            float v[8];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const uint32_t byte = (w[r][i] >> (8 * b)) & 0xffu;
                v[2 * b] = e2m1_value(byte & 15u) * s;
                v[2 * b + 1] = e2m1_value(byte >> 4) * s;
            }
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
                if (t < nt) {
                    const float4 x0 = *reinterpret_cast<const float4*>(xs + t * x_stride + col);
                    const float4 x1 = *reinterpret_cast<const float4*>(xs + t * x_stride + col + 4);
                    acc[r][t] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y +
                                 v[6] * x1.z + v[7] * x1.w;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTok; ++t)
            if (t < nt) acc[r][t] = warp_sum(acc[r][t]);  // nt is warp-uniform
}

// 32 row pairs (gate_up) or rows (down) per CTA, 4 per warp: one pair per warp was measured slower
// (r3: 5.1 vs 3.6 ms per decode step) because every CTA stages the token's 11.5 KB input.
constexpr int kPairsPerCta = 32;
constexpr int kDownRowsPerCta = 32;

__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_mxfp4_kernel(const MoeMxfp4Args a) {
    extern __shared__ float xs[];  // [kTok, hidden_size]
    const int e = blockIdx.x;
    const int begin = a.expert_offsets[e], end = a.expert_offsets[e + 1];
    if (begin == end) return;
    const int H = a.hidden_size, I = a.intermediate_size, G = H / 32, K = a.experts_per_token;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const auto* h = static_cast<const __nv_bfloat16*>(a.h);
    for (int tb = begin; tb < end; tb += kTok) {
        const int nt = min(kTok, end - tb);
        __syncthreads();
        for (int t = 0; t < nt; ++t) {
            const int64_t base = static_cast<int64_t>(a.sorted_assignments[tb + t] / K) * H;
            if (a.h_f32) {
                const float4* src = reinterpret_cast<const float4*>(a.h_f32 + base);
                for (int c = threadIdx.x; c < H / 4; c += blockDim.x) reinterpret_cast<float4*>(xs + t * H)[c] = src[c];
            } else {
                for (int c = threadIdx.x; c < H; c += blockDim.x) xs[t * H + c] = __bfloat162float(h[base + c]);
            }
        }
        __syncthreads();
        for (int p = warp; p < kPairsPerCta; p += kWarps) {
            const int j = blockIdx.y * kPairsPerCta + p;
            if (j >= I) break;
            const int64_t row0 = static_cast<int64_t>(e) * 2 * I + 2 * j;  // gate row; up is row0 + 1
            const uint8_t* blocks[2] = {a.gate_up_blocks + row0 * G * 16, a.gate_up_blocks + (row0 + 1) * G * 16};
            const uint8_t* scales[2] = {a.gate_up_scales + row0 * G, a.gate_up_scales + (row0 + 1) * G};
            float acc[2][kTok];
            mxfp4_rows_dot<2>(blocks, scales, G, xs, H, nt, acc);
            if (lane < nt) {
                float gate = 0.0f, up = 0.0f;
#pragma unroll
                for (int t = 0; t < kTok; ++t)
                    if (t == lane) {
                        gate = acc[0][t];
                        up = acc[1][t];
                    }
                gate = fminf(gate + a.gate_up_bias[row0], a.swiglu_limit);
                up = fminf(fmaxf(up + a.gate_up_bias[row0 + 1], -a.swiglu_limit), a.swiglu_limit);
                const float glu = gate / (1.0f + __expf(-a.swiglu_alpha * gate));
                const int as = a.sorted_assignments[tb + lane];
                a.act[static_cast<int64_t>(as) * I + j] = (up + 1.0f) * glu;
            }
        }
    }
}

__global__ void __launch_bounds__(kWarps * 32) moe_down_mxfp4_kernel(const MoeMxfp4Args a) {
    extern __shared__ float xs[];  // [kTok, intermediate_size]
    const int e = blockIdx.x;
    const int begin = a.expert_offsets[e], end = a.expert_offsets[e + 1];
    if (begin == end) return;
    const int H = a.hidden_size, I = a.intermediate_size, G = I / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int tb = begin; tb < end; tb += kTok) {
        const int nt = min(kTok, end - tb);
        __syncthreads();
        for (int t = 0; t < nt; ++t) {
            const float4* src = reinterpret_cast<const float4*>(a.act + static_cast<int64_t>(a.sorted_assignments[tb + t]) * I);
            for (int c = threadIdx.x; c < I / 4; c += blockDim.x) reinterpret_cast<float4*>(xs + t * I)[c] = src[c];
        }
        __syncthreads();
        for (int p = warp; p < kDownRowsPerCta; p += kWarps) {
            const int r = blockIdx.y * kDownRowsPerCta + p;
            if (r >= H) break;
            const int64_t row = static_cast<int64_t>(e) * H + r;
            const uint8_t* blocks[1] = {a.down_blocks + row * G * 16};
            const uint8_t* scales[1] = {a.down_scales + row * G};
            float acc[1][kTok];
            mxfp4_rows_dot<1>(blocks, scales, G, xs, I, nt, acc);
            if (lane < nt) {
                float v = 0.0f;
#pragma unroll
                for (int t = 0; t < kTok; ++t)
                    if (t == lane) v = acc[0][t];
                const int as = a.sorted_assignments[tb + lane];
                a.y[static_cast<int64_t>(as) * H + r] = v + a.down_bias[row];
            }
        }
    }
}

// ---- large-batch helpers ------------------------------------------------------------------------
__device__ __forceinline__ int expert_of(const int32_t* offsets, int num_experts, int i) {
    int lo = 0, hi = num_experts - 1;  // largest e with offsets[e] <= i
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__global__ void gather_kernel(const __nv_bfloat16* h, const int32_t* sorted, int k, int H, __nv_bfloat16* xg) {
    const int i = blockIdx.x;
    const __nv_bfloat16* src = h + static_cast<int64_t>(sorted[i] / k) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) xg[static_cast<int64_t>(i) * H + c] = src[c];
}

__global__ void swiglu_sorted_kernel(const float* gu, const float* bias, const int32_t* offsets, int num_experts,
                                     int I, float limit, float alpha, __nv_bfloat16* act) {
    const int i = blockIdx.x;
    const int e = expert_of(offsets, num_experts, i);
    const float* row = gu + static_cast<int64_t>(i) * 2 * I;
    const float* b = bias + static_cast<int64_t>(e) * 2 * I;
    for (int j = threadIdx.x; j < I; j += blockDim.x) {
        const float gate = fminf(row[2 * j] + b[2 * j], limit);
        const float up = fminf(fmaxf(row[2 * j + 1] + b[2 * j + 1], -limit), limit);
        const float glu = gate / (1.0f + __expf(-alpha * gate));
        act[static_cast<int64_t>(i) * I + j] = __float2bfloat16((up + 1.0f) * glu);
    }
}

__global__ void scatter_kernel(const float* yd, const float* bias, const int32_t* offsets, int num_experts,
                               const int32_t* sorted, int H, float* y) {
    const int i = blockIdx.x;
    const int e = expert_of(offsets, num_experts, i);
    float* dst = y + static_cast<int64_t>(sorted[i]) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x)
        dst[c] = yd[static_cast<int64_t>(i) * H + c] + bias[static_cast<int64_t>(e) * H + c];
}

__global__ void mxfp4_to_bf16_kernel(const uint8_t* blocks, const uint8_t* scales, int64_t n_bytes,
                                     __nv_bfloat16* out) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_bytes;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint32_t byte = blocks[i];
        const float s = e8m0_to_f32(scales[i / 16]);  // 16 bytes per 32-element group
        out[2 * i] = __float2bfloat16(e2m1_value(byte & 15u) * s);
        out[2 * i + 1] = __float2bfloat16(e2m1_value(byte >> 4) * s);
    }
}

}  // namespace

void router_topk(const RouterTopkArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.num_experts <= kMaxExperts && a.experts_per_token <= 8 && a.experts_per_token <= a.num_experts,
                 "router: %d experts, k %d unsupported", a.num_experts, a.experts_per_token);
    if (a.num_tokens == 0) return;
    router_topk_kernel<<<a.num_tokens, 256, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

void topk_softmax(const float* logits, const float* bias, int T, int E, int k, int32_t* ids, float* weights,
                  cudaStream_t stream) {
    ENGINE_CHECK(E <= kMaxExperts && k <= 8 && k <= E, "topk: %d experts, k %d unsupported", E, k);
    if (T == 0) return;
    topk_softmax_kernel<<<T, 32, 0, stream>>>(logits, bias, E, k, ids, weights);
    CUDA_CHECK_LAUNCH();
}

void moe_plan(const int32_t* ids, int n, int num_experts, bool stable, int32_t* offsets, int32_t* sorted,
              cudaStream_t stream) {
    ENGINE_CHECK(num_experts <= kMaxExperts, "moe_plan: %d experts", num_experts);
    moe_plan_kernel<<<1, 1024, 0, stream>>>(ids, n, num_experts, stable, offsets, sorted);
    CUDA_CHECK_LAUNCH();
}

void moe_mxfp4(const MoeMxfp4Args& a, cudaStream_t stream) {
    ENGINE_CHECK(a.hidden_size % 32 == 0 && a.intermediate_size % 32 == 0 && a.hidden_size <= 4096 &&
                     a.intermediate_size <= 4096,
                 "moe_mxfp4: unsupported sizes %d/%d", a.hidden_size, a.intermediate_size);
    if (a.num_tokens == 0) return;
    const int smem_gu = kTok * a.hidden_size * static_cast<int>(sizeof(float));
    const int smem_down = kTok * a.intermediate_size * static_cast<int>(sizeof(float));
    static bool configured = false;
    if (!configured) {  // shared-memory opt-in beyond 48 KB, once per process
        CUDA_CHECK(cudaFuncSetAttribute(moe_gate_up_mxfp4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kTok * 4096 * 4));
        CUDA_CHECK(cudaFuncSetAttribute(moe_down_mxfp4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kTok * 4096 * 4));
        configured = true;
    }
    dim3 grid_gu(a.num_experts, (a.intermediate_size + kPairsPerCta - 1) / kPairsPerCta);
    moe_gate_up_mxfp4_kernel<<<grid_gu, kWarps * 32, smem_gu, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    dim3 grid_down(a.num_experts, (a.hidden_size + kDownRowsPerCta - 1) / kDownRowsPerCta);
    moe_down_mxfp4_kernel<<<grid_down, kWarps * 32, smem_down, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

void moe_gather(const void* h, const int32_t* sorted, int n, int k, int H, void* xg, cudaStream_t stream) {
    if (n == 0) return;
    gather_kernel<<<n, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(h), sorted, k, H,
                                         static_cast<__nv_bfloat16*>(xg));
    CUDA_CHECK_LAUNCH();
}

void moe_swiglu_sorted(const float* gu, const float* bias, const int32_t* offsets, int num_experts, int n, int I,
                       float limit, float alpha, void* act, cudaStream_t stream) {
    if (n == 0) return;
    swiglu_sorted_kernel<<<n, 256, 0, stream>>>(gu, bias, offsets, num_experts, I, limit, alpha,
                                                static_cast<__nv_bfloat16*>(act));
    CUDA_CHECK_LAUNCH();
}

void moe_scatter(const float* yd, const float* bias, const int32_t* offsets, int num_experts, const int32_t* sorted,
                 int n, int H, float* y, cudaStream_t stream) {
    if (n == 0) return;
    scatter_kernel<<<n, 256, 0, stream>>>(yd, bias, offsets, num_experts, sorted, H, y);
    CUDA_CHECK_LAUNCH();
}

void mxfp4_to_bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int cols, void* out,
                   cudaStream_t stream) {
    const int64_t n_bytes = rows * cols / 2;
    const int grid = static_cast<int>(std::min<int64_t>((n_bytes + 255) / 256, 65536));
    mxfp4_to_bf16_kernel<<<grid, 256, 0, stream>>>(blocks, scales, n_bytes, static_cast<__nv_bfloat16*>(out));
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
