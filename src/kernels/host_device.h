// GPTOSS_HOST_DEVICE: a small inline function callable from CUDA kernels and from host code (the
// bit helpers in kernels/*_bits.h, tested on the host).
#pragma once

#if defined(__CUDACC__)
#define GPTOSS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GPTOSS_HOST_DEVICE inline
#endif
