#pragma once

#include <cstdint>

namespace gptoss::kernels {

// One sequence's slice of a batched attention call: its new query tokens sit at rows
// [token_offset, token_offset + num_tokens) of q/out and have positions start_pos, start_pos+1, …
// Keys are read from the paged cache through block_table (logical block → physical block), which
// must cover every visible position (sliding layers: only the last `sliding_window` ones).
struct AttentionSeq {
    int token_offset = 0;
    int num_tokens = 0;
    int start_pos = 0;
    const int32_t* block_table = nullptr;  // [num_logical_blocks]
    int num_logical_blocks = 0;
};

// Causal GQA attention with per-head sinks (MODEL.md §4.4): query head h reads kv head
// h / (num_heads / num_kv_heads); scores scaled by `scale`; the sink logit (unscaled) joins the
// softmax denominator only. sliding_window > 0 limits keys to i - window < j <= i.
struct AttentionArgs {
    const float* q = nullptr;            // [num_tokens, num_heads, head_dim] (post-RoPE)
    float* out = nullptr;                // [num_tokens, num_heads, head_dim]
    const float* sinks = nullptr;        // [num_heads]
    const float* k_cache = nullptr;      // [num_blocks, block_size, num_kv_heads, head_dim]
    const float* v_cache = nullptr;      // same
    const AttentionSeq* seqs = nullptr;  // [num_seqs]
    int num_seqs = 0;
    int num_tokens = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int block_size = 0;
    int sliding_window = 0;
    float scale = 0.125f;
};

}  // namespace gptoss::kernels
