#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include "kernels/cuda/cuda_check.h"

namespace gptoss::kernels::cuda {

// Row-major C[m,n] = A[m,k]·W[n,k]ᵀ is column-major Cᵀ[n,m] = Wᵀᵀ·Aᵀ: cuBLASLt's A is W (stored
// k×n column-major, transposed by opA), its B is A (k×m column-major, not transposed).
struct GemmRunner::Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
    ~Plan() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
    }
};

GemmRunner::GemmRunner(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
    cublasLtHandle_t h;
    CUBLAS_CHECK(cublasLtCreate(&h));
    handle_ = h;
    CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmRunner::~GemmRunner() {
    plans_.clear();
    if (workspace_) cudaFree(workspace_);
    if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

GemmRunner::Plan& GemmRunner::plan_for(GemmOut out, int m, int n, int k) {
    auto key = std::make_tuple(static_cast<int>(out), m, n, k);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    const cudaDataType_t ctype = out == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, ctype, n, m, n));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                      sizeof(workspace_bytes_)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a, p->b, p->c, p->c,
                                                pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    ENGINE_CHECK(found > 0, "cuBLASLt found no algorithm for %d x %d x %d", m, n, k);
    p->algo = result.algo;
    p->has_algo = true;
    auto& ref = *p;
    plans_.emplace(key, std::move(p));
    return ref;
}

void GemmRunner::gemm(const void* a, const void* w, void* c, GemmOut out, int m, int n, int k, cudaStream_t stream) {
    if (m == 0) return;
    Plan& p = plan_for(out, m, n, k);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w, p.a, a, p.b, &beta, c, p.c,
                                c, p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace gptoss::kernels::cuda
