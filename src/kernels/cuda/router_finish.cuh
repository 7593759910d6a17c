// The decode router's end, shared by the fused router kernels (moe.cu) and the O projection's
// router tail (gemv.cu, GemvRouterTail): top-k, softmax over the chosen k, and the stable MoE plan
// from logits every thread of the CTA can read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

constexpr int kRouterMaxK = 8;

// The router's end (router_plan_small_kernel's last CTA; Args: RouterPlanSmallArgs or GemvRouterTail,
// their plan fields): every logit is readable through `load(t, e)`; a warp per token takes the top-k by k rounds of a
// warp arg-max over (value descending, index ascending), a strict total order, so every lane ends with the same winner
// and ties go to the lower index as in cpu::router; softmax over the chosen k; then the stable plan of
// moe_plan (offsets[e] = #assignments with a lower expert; an assignment's place = its expert's
// offset + #earlier assignments of the same expert; ≤ 64 assignments). Every thread of the CTA calls
// it; `warps` = the CTA's warps, kChunks · 32 ≥ the experts.
template <int kChunks, typename Args, typename Load>
__device__ __forceinline__ void router_finish(const Args& a, int warps, Load load, int32_t* s_ids) {
    const int T = a.num_tokens, E = a.num_experts, K = a.experts_per_token;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int t = warp; t < T; t += warps) {
        float v[kChunks];
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            const int ex = lane + 32 * j;
            v[j] = ex < E ? load(t, ex) : 0.0f;
        }
        // Each value as an unsigned key in the same order (-0 as +0: they tie, as the float compare
        // has them; NaN lowest), so that a round is two warp reductions (redux.sync): the largest key,
        // then the lowest index holding it. r52: the butterfly of (value, index) pairs it replaces
        // took 5 shuffle pairs a round.
        uint32_t key[kChunks];
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            const uint32_t u = v[j] == 0.0f ? 0u : __float_as_uint(v[j]);
            key[j] = v[j] != v[j] ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        }
        uint32_t taken = 0;
        float top_v[kRouterMaxK];
        int top_e[kRouterMaxK];
#pragma unroll
        for (int s = 0; s < kRouterMaxK; ++s) {
            top_v[s] = 0.0f;
            top_e[s] = 0;
            if (s < K) {
                uint32_t bk = 0u, bi = 0xffffffffu;  // this lane's best: key descending, index ascending
#pragma unroll
                for (int j = 0; j < kChunks; ++j) {
                    const int ex = lane + 32 * j;
                    if (ex < E && !((taken >> j) & 1u) && (bi == 0xffffffffu || key[j] > bk)) {
                        bk = key[j];
                        bi = static_cast<uint32_t>(ex);
                    }
                }
                const uint32_t wk = __reduce_max_sync(0xffffffffu, bi == 0xffffffffu ? 0u : bk);
                const uint32_t we = __reduce_min_sync(0xffffffffu, bi != 0xffffffffu && bk == wk ? bi : 0xffffffffu);
                const int be = static_cast<int>(we);
                if ((be & 31) == lane) taken |= 1u << (be >> 5);
                top_v[s] = __uint_as_float((wk & 0x80000000u) ? (wk & 0x7fffffffu) : ~wk);
                top_e[s] = be;
            }
        }
        if (lane == 0) {
            float w[kRouterMaxK];
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < kRouterMaxK; ++s) {
                w[s] = s < K ? expf(top_v[s] - top_v[0]) : 0.0f;
                sum += w[s];
            }
#pragma unroll
            for (int s = 0; s < kRouterMaxK; ++s) {
                if (s < K) {
                    a.expert_ids[t * K + s] = top_e[s];
                    a.expert_weights[t * K + s] = w[s] / sum;
                    s_ids[t * K + s] = top_e[s];
                }
            }
        }
    }
    __syncthreads();
    // The stable plan of moe_plan: offsets[e] = #assignments with a lower expert; an assignment's
    // place = its expert's offset + #earlier assignments of the same expert (≤ 64 assignments).
    const int A = T * K;
    for (int i = threadIdx.x; i <= E; i += blockDim.x) {
        int c = 0;
        for (int j = 0; j < A; ++j) c += s_ids[j] < i;
        a.expert_offsets[i] = c;
    }
    for (int i = threadIdx.x; i < A; i += blockDim.x) {
        const int ei = s_ids[i];
        int start = 0, rank = 0;
        for (int j = 0; j < A; ++j) {
            start += s_ids[j] < ei;
            rank += j < i && s_ids[j] == ei;
        }
        a.sorted_assignments[start + rank] = i;
    }
}

}  // namespace gptoss::kernels::cuda
