#pragma once

#include <cstdint>

namespace gptoss::kernels {

// YaRN rotary embedding, NeoX (half-split) pairing, applied in place to q and k; then k and v are
// written into the paged KV cache at slot_mapping[t] (block * block_size + offset).
struct RopeKvWriteArgs {
    float* q = nullptr;                     // [num_tokens, num_heads, head_dim], rotated in place
    float* k = nullptr;                     // [num_tokens, num_kv_heads, head_dim], rotated in place
    const float* v = nullptr;               // [num_tokens, num_kv_heads, head_dim]
    const int32_t* positions = nullptr;     // [num_tokens] absolute positions
    const int32_t* slot_mapping = nullptr;  // [num_tokens]; -1 = do not write (e.g. padding)
    const float* inv_freq = nullptr;        // [head_dim / 2] YaRN-blended inverse frequencies
    float attention_scaling = 1.0f;         // YaRN concentration m; multiplies cos and sin
    float* k_cache = nullptr;               // [num_blocks, block_size, num_kv_heads, head_dim]
    float* v_cache = nullptr;               // same
    int num_tokens = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int block_size = 0;
    // An FP8 KV cache, emulated: the values written to k_cache / v_cache are rounded to e4m3 (round
    // to nearest even, saturating to ±448), as the CUDA backend's kv_fp8 cache stores them.
    bool round_fp8 = false;
};

}  // namespace gptoss::kernels
