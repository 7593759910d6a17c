#pragma once

#include "core/dtype.h"

namespace gptoss::kernels {

// y = x · Wᵀ + b, i.e. torch.nn.Linear with W in [out, in] order.
struct LinearArgs {
    const float* x = nullptr;           // [num_tokens, in_features]
    const void* weight = nullptr;       // [out_features, in_features], weight_dtype
    DType weight_dtype = DType::kBF16;  // kBF16, kF16 or kF32
    const float* bias = nullptr;        // [out_features] or nullptr
    float* y = nullptr;                 // [num_tokens, out_features]
    int num_tokens = 0;
    int in_features = 0;
    int out_features = 0;
};

}  // namespace gptoss::kernels
