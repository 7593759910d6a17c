// Small-batch GEMV for decode: y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n]) for m < num_tokens ≤ 8,
// bf16 weights [N, K] read once at full bandwidth (16-byte loads, one warp per row, several loads in
// flight), activations in fp32 or bf16, fp32 accumulation and output. cuBLASLt's choices at M = 1
// read weights far below bandwidth (bench/NOTES.md r2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

constexpr int kGemvMaxTokens = 8;

struct GemvArgs {
    const void* x = nullptr;  // [num_tokens, k], fp32 (x_bf16 = false) or bf16
    bool x_bf16 = false;
    const void* w = nullptr;      // [n, k] bf16
    const float* bias = nullptr;  // [n] or nullptr
    float* y = nullptr;           // [num_tokens, n]
    int num_tokens = 0;           // 1 .. kGemvMaxTokens
    int n = 0;
    int k = 0;  // multiple of 8
};
void gemv_bf16w(const GemvArgs& args, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
