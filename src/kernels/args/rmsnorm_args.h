#pragma once

namespace gptoss::kernels {

// y = x / sqrt(mean(x²) + eps) · weight, per row, in fp32.
struct RmsNormArgs {
    const float* x = nullptr;       // [num_tokens, hidden_size]
    const float* weight = nullptr;  // [hidden_size]
    float* y = nullptr;             // [num_tokens, hidden_size]; may alias x
    int num_tokens = 0;
    int hidden_size = 0;
    float eps = 1e-5f;
};

}  // namespace gptoss::kernels
