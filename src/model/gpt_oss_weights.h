// gpt-oss weights as the CPU reference uses them: large matrices stay where the checkpoint put them
// (mmap'd bf16; MXFP4 experts packed), small vectors (norms, biases, sinks) are converted to fp32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/args/moe_args.h"
#include "model/gpt_oss_config.h"
#include "model/safetensors_file.h"

namespace gptoss::model {

// A dense [rows, cols] matrix in [out, in] order (torch.nn.Linear), bf16, f16 or f32.
struct DenseWeight {
    const void* data = nullptr;
    DType dtype = DType::kBF16;
    int rows = 0;
    int cols = 0;
};

struct LayerWeights {
    std::vector<float> input_layernorm;           // [hidden_size]
    DenseWeight q_proj;                           // [num_attention_heads * head_dim, hidden_size]
    DenseWeight k_proj;                           // [num_key_value_heads * head_dim, hidden_size]
    DenseWeight v_proj;                           // [num_key_value_heads * head_dim, hidden_size]
    DenseWeight o_proj;                           // [hidden_size, num_attention_heads * head_dim]
    std::vector<float> q_bias, k_bias, v_bias;    // [q width], [kv width], [kv width]
    std::vector<float> o_bias;                    // [hidden_size]
    std::vector<float> sinks;                     // [num_attention_heads]
    std::vector<float> post_attention_layernorm;  // [hidden_size]
    DenseWeight router;                           // [num_experts, hidden_size]
    std::vector<float> router_bias;               // [num_experts]

    kernels::ExpertFormat expert_format = kernels::ExpertFormat::kMxfp4;
    const uint8_t* gate_up_blocks = nullptr;  // [E, 2I, H/32, 16]
    const uint8_t* gate_up_scales = nullptr;  // [E, 2I, H/32]
    const uint8_t* down_blocks = nullptr;     // [E, H, I/32, 16]
    const uint8_t* down_scales = nullptr;     // [E, H, I/32]
    const void* gate_up_dense = nullptr;      // [E, 2I, H] ([out, in]; transposed from HF's [E, H, 2I] at load)
    const void* down_dense = nullptr;         // [E, H, I]
    DType dense_dtype = DType::kBF16;
    const uint8_t* gate_up_fp8 = nullptr;      // kFp8Block: [E, 2I, H] e4m3 (model/fp8_convert.h)
    const float* gate_up_fp8_scale = nullptr;  // [E, ⌈2I/128⌉, ⌈H/128⌉]
    const uint8_t* down_fp8 = nullptr;         // [E, H, I]
    const float* down_fp8_scale = nullptr;     // [E, ⌈H/128⌉, ⌈I/128⌉]
    std::vector<float> gate_up_bias;           // [E, 2I], interleaved (even = gate)
    std::vector<float> down_bias;              // [E, H]
};

// The slice of the model a set of weights holds (parallel/world.h): attention heads and lm_head
// vocabulary rows (TP), experts (EP) and the experts' intermediate units (MoE-TP). The default is
// the whole model. Head, expert and unit ranges index the full model.
struct WeightShard {
    int q_head_begin = 0, num_q_heads = -1;  // -1: all (set by load)
    int kv_head_begin = 0, num_kv_heads = -1;
    int expert_begin = 0, num_experts = -1;
    int inter_begin = 0, inter_size = -1;  // expert intermediate units [begin, begin + size)
    int vocab_begin = 0, vocab_size = -1;  // lm_head rows
    bool add_o_bias = true;                // this shard adds the attention output bias before the TP
                                           // all-reduce (CPU); the CUDA path adds it after, on every rank
    bool add_down_bias = true;             // this shard adds the experts' down bias
};

struct GptOssWeights {
    GptOssConfig config;
    WeightShard shard;         // what the views below hold (config describes the whole model)
    DenseWeight embed_tokens;  // [vocab_size, hidden_size]
    DenseWeight lm_head;       // [vocab_size, hidden_size]
    std::vector<float> norm;   // [hidden_size] final RMSNorm gain
    std::vector<LayerWeights> layers;

    std::unique_ptr<SafetensorsCheckpoint> checkpoint;  // owns the mappings the views point into (null in
                                                        // a shard: the full weights must outlive it)
    std::vector<std::vector<uint8_t>> owned;            // buffers made at load (transposed experts)
    std::vector<std::string> unused_tensors;            // checkpoint tensors load() did not read (warned), sorted

    // Loads config.json and the safetensors of a Hugging Face gpt-oss directory, in the published
    // layout (MXFP4 expert blocks/scales) or the dequantized layout transformers saves
    // (gate_up_proj [E, H, 2I], down_proj [E, I, H]). Every tensor's dtype and shape is checked
    // against the config; any mismatch or missing tensor is one clear error.
    static StatusOr<std::unique_ptr<GptOssWeights>> load(const std::string& dir);
};

// A fingerprint of the model whose KV a cache holds, for the prefill/decode handoff (runtime::KvFormat::model_id):
// the config's numbers that the forward uses and, of every dense tensor on the attention path (embedding, norms,
// q/k/v/o and their biases, sinks, routers and their biases, lm_head), 257 evenly spaced values read as floats (so
// that bf16 and f32 copies of one model agree). The experts are left out: MXFP4, FP8 (gptoss convert) and
// dequantized copies of one checkpoint hold the same model in different bytes. Two checkpoints that differ on the
// attention path (another seed, another fine-tune, another rope) differ here. Never 0. A few ms.
uint64_t model_fingerprint(const GptOssWeights& w);

}  // namespace gptoss::model
