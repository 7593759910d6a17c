// A byte range for a kernel to ask L2 to fetch ahead of a later kernel (l2_prefetch_share in
// kernels/cuda/common.cuh says how and why).
#pragma once

#include <cstdint>

namespace gptoss::kernels::cuda {

struct L2Prefetch {
    const void* p = nullptr;  // 16-byte aligned; null: nothing
    int64_t bytes = 0;        // a multiple of 16
    int mode = 0;             // 0 off; 1 bulk pieces, 2 per-line prefetches (evict_last); 3 bulk, normal
};

}  // namespace gptoss::kernels::cuda
