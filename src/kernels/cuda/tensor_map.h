// The driver's cuTensorMapEncodeTiled, reached through the runtime (no libcuda link): host code
// of the TMA kernels (moe_fp8.cu, moe_wgmma.cu, attention.cu).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace gptoss::kernels::cuda {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link); null when
// the driver does not have it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

}  // namespace gptoss::kernels::cuda
