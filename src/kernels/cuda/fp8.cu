#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.h"

namespace gptoss::kernels::cuda {
namespace {

__global__ void fp8_block_to_bf16_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales, int64_t n,
                                         int rows, int cols, __nv_bfloat16* __restrict__ out) {
    const int br = (rows + 127) / 128, bc = (cols + 127) / 128;
    const int64_t per_mat = static_cast<int64_t>(rows) * cols;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t m = i / per_mat, k = i - m * per_mat;
        const int r = static_cast<int>(k / cols), c = static_cast<int>(k - static_cast<int64_t>(r) * cols);
        __nv_fp8_e4m3 v;
        v.__x = q[i];
        const float s = scales[(m * br + r / 128) * bc + c / 128];
        out[i] = __float2bfloat16(static_cast<float>(v) * s);
    }
}

}  // namespace

void fp8_block_to_bf16(const uint8_t* q, const float* scales, int64_t mats, int rows, int cols, void* out,
                       cudaStream_t stream) {
    const int64_t n = mats * rows * cols;
    if (n <= 0) return;
    const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536));
    fp8_block_to_bf16_kernel<<<grid, 256, 0, stream>>>(q, scales, n, rows, cols, static_cast<__nv_bfloat16*>(out));
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
