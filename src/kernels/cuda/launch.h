// Kernel launches with programmatic dependent launch (PDL): the launch of a kernel overlaps the
// tail of the previous kernel in the stream (and its weight prefetch, if it does one before
// pdl_wait()). Every kernel launched this way must call pdl_wait() (common.cuh) before touching
// activations. GPTOSS_PDL=0 turns the attribute off (plain stream order) for A/B runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace gptoss::kernels::cuda {

inline bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("GPTOSS_PDL");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return on;
}

// Raises the kernel's limit of dynamic shared memory to smem bytes where it is below. The default
// limit is 48 KB less the kernel's static shared memory, so a check of smem alone against 48 KB
// misses kernels with static arrays (r29: the staged-x GEMV at 8 tokens, 46 KB dynamic + 4 KB
// static, failed to launch). Per device, host-side and capture-safe.
template <typename... KernelArgs>
void fit_dynamic_smem(void (*kernel)(KernelArgs...), size_t smem) {
    if (smem == 0) return;
    cudaFuncAttributes fa = {};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
    if (smem > static_cast<size_t>(fa.maxDynamicSharedSizeBytes))
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

// launch_pdl with thread-block clusters of `cluster` CTAs (grid a multiple of it in each dimension;
// more than 8 a cluster needs cudaFuncAttributeNonPortableClusterSizeAllowed on the kernel). A
// cluster of one CTA is a plain launch (no cluster attribute).
template <typename... KernelArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster.x;
    attr[1].val.clusterDim.y = cluster.y;
    attr[1].val.clusterDim.z = cluster.z;
    cfg.attrs = attr;
    cfg.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
    launch_pdl_cluster(kernel, grid, dim3(1, 1, 1), block, smem, stream, std::forward<Args>(args)...);
}

// How many clusters of `cluster` CTAs of `kernel` (block threads, smem bytes) the device can hold
// at once; 0 where it cannot schedule one (or the query fails; its error is cleared).
template <typename... KernelArgs>
int max_active_clusters(void (*kernel)(KernelArgs...), dim3 cluster, dim3 block, size_t smem) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = cluster;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x;
    attr[0].val.clusterDim.y = cluster.y;
    attr[0].val.clusterDim.z = cluster.z;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return clusters;
}

}  // namespace gptoss::kernels::cuda
