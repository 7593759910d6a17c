// The gpt-oss forward pass on the CPU backend (the reference): a batch of sequences, each adding
// some new tokens (a prefill chunk or one decode token) on top of what its paged KV cache holds.
// Reads top to bottom like the model: embed → L × (attention, MoE) → norm → lm_head.
#pragma once

#include <span>
#include <vector>

#include "core/status.h"
#include "model/gpt_oss_weights.h"
#include "parallel/communicator.h"

namespace gptoss::model {

// Paged KV cache in host memory, fp32. Full-attention layers and sliding-window layers have
// separate block id spaces (a sequence's sliding blocks can be freed as its window moves on).
// Each layer owns [num_blocks, block_size, num_key_value_heads, head_dim] for K and for V.
class CpuKvCache {
public:
    // num_kv_heads: the heads this cache holds (a TP shard's; 0 = the config's).
    // fp8: an FP8 (e4m3) cache, emulated: values are rounded to e4m3 as they are written (stored
    // as fp32), matching the CUDA backend's kv_fp8 cache.
    CpuKvCache(const GptOssConfig& config, int block_size, int num_blocks_full, int num_blocks_sliding,
               int num_kv_heads = 0, bool fp8 = false);

    int block_size() const { return block_size_; }
    int num_blocks(bool sliding) const { return sliding ? num_blocks_sliding_ : num_blocks_full_; }
    float* k(int layer) { return k_[layer].data(); }
    float* v(int layer) { return v_[layer].data(); }
    bool fp8() const { return fp8_; }
    size_t bytes() const;

private:
    int block_size_;
    int num_blocks_full_;
    int num_blocks_sliding_;
    bool fp8_;
    std::vector<std::vector<float>> k_, v_;  // per layer
};

struct ForwardSequence {
    std::span<const int32_t> tokens;  // the new tokens
    int start_pos = 0;                // absolute position of tokens[0]
    // Logical block b holds positions [b·block_size, (b+1)·block_size). Must cover every position
    // up to start_pos + tokens.size() - 1; sliding tables only need the last sliding_window
    // positions before each new token (earlier entries may be -1).
    std::span<const int32_t> block_table_full;
    std::span<const int32_t> block_table_sliding;
    bool all_logits = false;  // logits for every new token, else only for the last one
};

// The rotary inverse frequencies [head_dim / 2] of `c` (YaRN-blended, or plain RoPE without rope_scaling), as
// transformers' rope initialisers compute them; returns the concentration that scales cos and sin.
float rope_frequencies(const GptOssConfig& c, std::vector<float>* inv_freq);

class CpuForward {
public:
    // emulate_bf16: round activations to bf16 exactly where the CUDA backend stores them in bf16
    // (GEMM inputs after each norm, q/k/v after RoPE, the attention output), so the CPU reference
    // can check the CUDA path at tight tolerance independently of that precision choice.
    //
    // Parallel: with `comms`, the weights are one rank's shard (model/weight_shard.h) and every rank
    // of the world calls forward together, each with its DP group's sequences (the TP ranks of a
    // group with the same ones); logits come back whole on every rank of the group.
    explicit CpuForward(const GptOssWeights& weights, bool emulate_bf16 = false, parallel::RankComms* comms = nullptr);

    // Appends one row of vocab_size logits per requested position to `logits` (sequence order).
    // Validates token ids, positions and block tables first (invalid_argument / out_of_range).
    Status forward(std::span<const ForwardSequence> seqs, CpuKvCache& kv, std::vector<float>* logits);

    const GptOssWeights& weights() const { return w_; }
    // YaRN inverse frequencies [head_dim / 2] and the concentration that scales cos and sin.
    const std::vector<float>& inv_freq() const { return inv_freq_; }
    float attention_scaling() const { return attention_scaling_; }

    // The checks forward() starts with (token ids, positions, block tables).
    Status validate(std::span<const ForwardSequence> seqs, const CpuKvCache& kv) const;

private:
    const GptOssWeights& w_;
    bool emulate_bf16_ = false;
    parallel::RankComms* comms_ = nullptr;
    std::vector<float> inv_freq_;  // [head_dim / 2]
    float attention_scaling_ = 1.0f;
};

// One sequence with a private, contiguous KV cache: the simplest incremental decoder, used by
// `gptoss logits` and `gptoss generate` and by tests as the unbatched reference.
class SingleSequence {
public:
    // kv_fp8: the cache rounds to e4m3 as it stores (CpuKvCache's fp8).
    SingleSequence(const GptOssWeights& weights, int max_tokens, int block_size = 16, bool kv_fp8 = false);
    // Runs the new tokens; logits gets one row per new token (all_logits) or for the last one.
    Status append(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* logits);
    int length() const { return length_; }

private:
    CpuForward forward_;
    CpuKvCache kv_;
    std::vector<int32_t> block_table_;
    int max_tokens_;
    int length_ = 0;
};

}  // namespace gptoss::model
