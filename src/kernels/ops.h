// The op table: one entry per op, the same argument struct for every backend (STYLE.md §2).
#pragma once

#include "kernels/args/attention_args.h"
#include "kernels/args/linear_args.h"
#include "kernels/args/moe_args.h"
#include "kernels/args/rmsnorm_args.h"
#include "kernels/args/rope_args.h"

namespace gptoss::kernels::cpu {

// Rows of a [vocab, hidden] table (bf16/f16/f32) gathered to fp32. Ids must be in range
// (validated by the caller).
void embedding(const int32_t* ids, int num_tokens, const void* table, DType dtype, int hidden_size, float* out);
void rmsnorm(const RmsNormArgs& args);
void linear(const LinearArgs& args);
void rope_kv_write(const RopeKvWriteArgs& args);
void attention(const AttentionArgs& args);
void router(const RouterArgs& args);
void moe(const MoeArgs& args);

// YaRN inverse frequencies and concentration (MODEL.md §4.4, transformers _compute_yarn_parameters).
struct YarnParams {
    float rope_theta = 150000.0f;
    float factor = 32.0f;
    float beta_fast = 32.0f;
    float beta_slow = 1.0f;
    int original_max_position_embeddings = 4096;
    bool truncate = false;
    float attention_factor = 0.0f;  // 0: derive as 0.1·ln(factor) + 1
};
// Fills inv_freq[head_dim / 2]; returns the attention scaling (concentration).
float yarn_inv_freq(const YarnParams& params, int head_dim, float* inv_freq);

}  // namespace gptoss::kernels::cpu
