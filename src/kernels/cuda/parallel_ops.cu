#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/parallel_ops.h"

namespace gptoss::kernels::cuda {

namespace {

__global__ void ep_localize_kernel(int32_t* ids, int n, int begin, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int e = ids[i] - begin;
    ids[i] = (e >= 0 && e < count) ? e : count;
}

// One CTA per token, float4 over the hidden dimension when it divides.
__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int k, int H,
                                   float* __restrict__ out) {
    const int t = blockIdx.x;
    const float* yt = y + static_cast<size_t>(t) * k * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < k; ++s) acc += w[t * k + s] * yt[static_cast<size_t>(s) * H + i];
        out[static_cast<size_t>(t) * H + i] = acc;
    }
}

__global__ void vocab_interleave_kernel(const float* __restrict__ g, int tp, int rows, int chunk, int vocab,
                                        float* __restrict__ out) {
    const int r = blockIdx.y;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vocab; v += gridDim.x * blockDim.x) {
        const int t = v / chunk, j = v - t * chunk;
        out[static_cast<size_t>(r) * vocab + v] = g[(static_cast<size_t>(t) * rows + r) * chunk + j];
    }
}

}  // namespace

void ep_localize(int32_t* ids, int n, int begin, int count, cudaStream_t stream) {
    if (n <= 0) return;
    ep_localize_kernel<<<(n + 255) / 256, 256, 0, stream>>>(ids, n, begin, count);
    CUDA_CHECK_LAUNCH();
}

void moe_combine(const float* y, const float* w, int T, int k, int H, float* out, cudaStream_t stream) {
    if (T <= 0) return;
    moe_combine_kernel<<<T, 256, 0, stream>>>(y, w, k, H, out);
    CUDA_CHECK_LAUNCH();
}

void vocab_interleave(const float* g, int tp, int rows, int chunk, int vocab, float* out, cudaStream_t stream) {
    if (rows <= 0) return;
    dim3 grid(std::min(1024, (vocab + 255) / 256), rows);
    vocab_interleave_kernel<<<grid, 256, 0, stream>>>(g, tp, rows, chunk, vocab, out);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
