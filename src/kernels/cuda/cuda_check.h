// Fatal checks for CUDA runtime / cuBLAS errors: programmer or driver errors, never user input.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                                \
    do {                                                                                                \
        cudaError_t _e = (expr);                                                                        \
        if (_e != cudaSuccess)                                                                          \
            ::gptoss::fatal_error(__FILE__, __LINE__, __func__, #expr, "%s (%s)", cudaGetErrorName(_e), \
                                  cudaGetErrorString(_e));                                              \
    } while (0)

#define CUBLAS_CHECK(expr)                                                                                        \
    do {                                                                                                          \
        cublasStatus_t _s = (expr);                                                                               \
        if (_s != CUBLAS_STATUS_SUCCESS)                                                                          \
            ::gptoss::fatal_error(__FILE__, __LINE__, __func__, #expr, "cublas status %d", static_cast<int>(_s)); \
    } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
