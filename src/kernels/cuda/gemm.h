// Dense GEMMs through cuBLASLt: C[M, N] = A[M, K] · W[N, K]ᵀ (torch.nn.Linear orientation),
// bf16 inputs, fp32 accumulation, fp32 or bf16 output. Heuristic choices are cached per shape, so
// warm-up (the first call per shape) happens before serving and before graph capture.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace gptoss::kernels::cuda {

enum class GemmOut { kF32, kBF16 };

class GemmRunner {
public:
    explicit GemmRunner(size_t workspace_bytes = 32u << 20);
    ~GemmRunner();
    GemmRunner(const GemmRunner&) = delete;
    GemmRunner& operator=(const GemmRunner&) = delete;

    // a: [m, k] bf16 row-major; w: [n, k] bf16 row-major; c: [m, n] row-major (ldc = n).
    void gemm(const void* a, const void* w, void* c, GemmOut out, int m, int n, int k, cudaStream_t stream);

private:
    struct Plan;
    Plan& plan_for(GemmOut out, int m, int n, int k);

    void* handle_ = nullptr;  // cublasLtHandle_t
    void* workspace_ = nullptr;
    size_t workspace_bytes_;
    std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

}  // namespace gptoss::kernels::cuda
