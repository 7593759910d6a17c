#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
__device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : -FLT_MAX;
    return warp_max(v);
}

// Largest key threshold τ with count(key >= τ) >= k: the k-th largest key (radix select, MSB first).
__device__ uint32_t kth_largest_key(const float* row, int n, int k, float* scratch) {
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t candidate = prefix | (1u << bit);
        float cnt = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) cnt += float_key(row[i]) >= candidate ? 1.0f : 0.0f;
        cnt = block_sum(cnt, scratch);
        if (cnt >= static_cast<float>(k)) prefix = candidate;
    }
    return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
    __shared__ float scratch[32];
    __shared__ float best_val[32];
    __shared__ int best_idx[32];
    const int s = blockIdx.x;
    const int n = a.vocab_size;
    const float* row = a.logits + static_cast<int64_t>(s) * n;
    const float temp = a.temperature[s];
    const bool greedy = temp <= 0.0f || a.top_k[s] == 1;

    uint32_t min_key = 0;  // tokens with key < min_key are excluded
    float inv_t = 0.0f;
    uint64_t seed = 0;
    if (!greedy) {
        inv_t = 1.0f / temp;
        seed = splitmix64(a.seed[s]) ^ (a.draw_index[s] * 0x9e3779b97f4a7c15ull);
        if (a.top_k[s] > 0 && a.top_k[s] < n) min_key = kth_largest_key(row, n, a.top_k[s], scratch);
        const float top_p = a.top_p[s];
        if (top_p < 1.0f) {
            const float mx = block_max(
                [&] {
                    float m = -FLT_MAX;
                    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
                    return m;
                }(),
                scratch);
            float z = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x)
                if (float_key(row[i]) >= min_key) z += __expf((row[i] - mx) * inv_t);
            z = block_sum(z, scratch);
            // Highest threshold τ whose kept mass Σ_{key >= τ} p >= top_p: the smallest nucleus.
            // (mass is non-increasing in τ, so an MSB-first bitwise search finds it.)
            uint32_t prefix = 0;
            for (int bit = 31; bit >= 0; --bit) {
                const uint32_t candidate = prefix | (1u << bit);
                float mass = 0.0f;
                for (int i = threadIdx.x; i < n; i += blockDim.x) {
                    const uint32_t key = float_key(row[i]);
                    if (key >= candidate && key >= min_key) mass += __expf((row[i] - mx) * inv_t);
                }
                mass = block_sum(mass, scratch);
                if (mass >= top_p * z) prefix = candidate;
            }
            min_key = max(min_key, prefix);
        }
    }
    // Argmax of logit (greedy) or of logit/T + Gumbel noise over the kept tokens; ties to the lower id.
    float bv = -FLT_MAX;
    int bi = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float l = row[i];
        if (float_key(l) < min_key) continue;
        float v = l;
        if (!greedy) {
            const double u = (static_cast<double>(splitmix64(seed ^ static_cast<uint64_t>(i)) >> 11) + 0.5) * 0x1.0p-53;
            v = l * inv_t - logf(-logf(static_cast<float>(u)));
        }
        if (v > bv || (v == bv && i < bi)) {
            bv = v;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_val[warp] = bv;
        best_idx[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
            if (best_val[w] > bv || (best_val[w] == bv && best_idx[w] < bi)) {
                bv = best_val[w];
                bi = best_idx[w];
            }
        a.out[s] = bi < n ? bi : 0;
    }
}

}  // namespace

void sample(const SampleArgs& a, cudaStream_t stream) {
    if (a.num_seqs == 0) return;
    sample_kernel<<<a.num_seqs, kThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
