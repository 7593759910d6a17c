// Shared by the kernel benchmarks: exit with the failing call and CUDA's message on any error.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(expr)                                                                               \
    do {                                                                                               \
        cudaError_t e_ = (expr);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)
