#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gptoss::kernels {

// Router: logits = x · Wrᵀ + br, top-k by value (ties to the lower index), weights = softmax over
// the k chosen logits (MODEL.md §4.5).
struct RouterArgs {
    const float* x = nullptr;      // [num_tokens, hidden_size]
    const void* weight = nullptr;  // [num_experts, hidden_size], weight_dtype
    DType weight_dtype = DType::kBF16;
    const float* bias = nullptr;      // [num_experts]
    int32_t* expert_ids = nullptr;    // [num_tokens, experts_per_token], by descending logit
    float* expert_weights = nullptr;  // [num_tokens, experts_per_token]
    float* logits = nullptr;          // [num_tokens, num_experts] scratch (also useful for debugging)
    int num_tokens = 0;
    int hidden_size = 0;
    int num_experts = 0;
    int experts_per_token = 0;
};

enum class ExpertFormat {
    kMxfp4,     // e2m1 codes + e8m0 scales per 32 inputs, [E, out, in/32, 16] + [E, out, in/32]
    kDense,     // [E, out, in] in dense_dtype
    kFp8Block,  // e4m3 [E, out, in] + fp32 scales [E, ⌈out/128⌉, ⌈in/128⌉] (model/fp8_convert.h)
};

// Experts with the clamped SwiGLU (MODEL.md §4.6):
//   gu = W_gu[e]·x + b_gu[e]; gate = min(gu[0::2], limit); up = clamp(gu[1::2], ±limit)
//   a = (up + 1) · gate · sigmoid(alpha · gate); y_e = W_down[e]·a + b_down[e]
//   y = Σ_k w_k · y_{e_k}
struct MoeArgs {
    const float* x = nullptr;               // [num_tokens, hidden_size]
    const int32_t* expert_ids = nullptr;    // [num_tokens, experts_per_token]
    const float* expert_weights = nullptr;  // [num_tokens, experts_per_token]
    float* y = nullptr;                     // [num_tokens, hidden_size], overwritten
    ExpertFormat format = ExpertFormat::kMxfp4;
    // kMxfp4
    const uint8_t* gate_up_blocks = nullptr;  // [E, 2I, H/32, 16]
    const uint8_t* gate_up_scales = nullptr;  // [E, 2I, H/32]
    const uint8_t* down_blocks = nullptr;     // [E, H, I/32, 16]
    const uint8_t* down_scales = nullptr;     // [E, H, I/32]
    // kDense ([out, in] per expert)
    const void* gate_up_dense = nullptr;  // [E, 2I, H]
    const void* down_dense = nullptr;     // [E, H, I]
    DType dense_dtype = DType::kBF16;
    // kFp8Block (e4m3 bytes, [out, in] per expert, and 128×128 block scales)
    const uint8_t* gate_up_fp8 = nullptr;
    const float* gate_up_fp8_scale = nullptr;
    const uint8_t* down_fp8 = nullptr;
    const float* down_fp8_scale = nullptr;
    const float* gate_up_bias = nullptr;  // [E, 2I], rows interleaved like the weights
    const float* down_bias = nullptr;     // [E, H]; may be null (no bias: another rank adds it)
    // Expert parallelism: the weights above hold experts [expert_begin, expert_begin + num_experts)
    // of the model; assignments to other experts contribute nothing here.
    int expert_begin = 0;
    int num_tokens = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_experts = 0;
    int experts_per_token = 0;
    float swiglu_limit = 7.0f;
    float swiglu_alpha = 1.702f;
};

}  // namespace gptoss::kernels
