// GptOssConfig: the model hyper-parameters under the engine's names (STYLE.md rule 9). This file is
// the only place that knows HF's key spellings (MODEL.md §1.1): num_local_experts / num_experts,
// num_experts_per_tok / experts_per_token, rope_scaling + rope_theta (published files) and
// rope_parameters (transformers >= 5, rope_theta inside).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gptoss::model {

enum class LayerType {
    kSlidingAttention,  // "sliding_attention": keys i-sliding_window < j <= i
    kFullAttention,     // "full_attention": causal over all keys
};

std::string_view layer_type_name(LayerType type);  // the HF spelling

// YaRN parameters (HF `rope_scaling`). MODEL.md §4.4.
struct RopeScaling {
    std::string rope_type = "yarn";
    double factor = 32.0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    int original_max_position_embeddings = 4096;
    bool truncate = false;  // false: the YaRN ramp bounds stay fractional (what the checkpoints use)
    // The concentration (cos / sin scale), as transformers' _compute_yarn_parameters: attention_factor when
    // given; else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are nonzero; else
    // get_mscale(factor) = 0.1·ln(factor) + 1 (the published checkpoints: 1.3466).
    std::optional<double> attention_factor;
    std::optional<double> mscale;
    std::optional<double> mscale_all_dim;

    double concentration() const;
    bool operator==(const RopeScaling&) const = default;
};

// HF `quantization_config`. Only expert weights are MXFP4 in the published checkpoints.
struct QuantizationConfig {
    std::string quant_method;                         // "mxfp4"
    std::vector<std::string> modules_to_not_convert;  // glob patterns such as "model.layers.*.self_attn"
    nlohmann::json extra = nlohmann::json::object();  // any other keys, kept for to_hf_json

    bool operator==(const QuantizationConfig&) const = default;
};

struct GptOssConfig {
    int hidden_size = 0;
    int num_hidden_layers = 0;
    int num_attention_heads = 0;  // q heads
    int num_key_value_heads = 0;
    int head_dim = 64;
    int num_experts = 0;        // HF: num_local_experts
    int experts_per_token = 0;  // HF: num_experts_per_tok
    int intermediate_size = 0;  // per expert
    int sliding_window = 128;
    int vocab_size = 0;
    double swiglu_limit = 7.0;
    double swiglu_alpha = 1.702;
    double rms_norm_eps = 1e-5;
    double rope_theta = 150000.0;
    // nullopt = plain RoPE. An absent key, null or {} is HF's default block (YaRN, the values above), as
    // transformers 5.17 reads it (tests/data/hf_rope_cases.json); {"rope_type": "default"} is plain RoPE.
    std::optional<RopeScaling> rope_scaling = RopeScaling{};
    int max_position_embeddings = 131072;
    bool attention_bias = true;
    bool tie_word_embeddings = false;
    std::vector<LayerType> layer_types;  // [num_hidden_layers]; default: even index = sliding
    std::vector<int> eos_token_ids;      // HF eos_token_id (an int or a list)
    std::optional<int> pad_token_id;
    std::optional<int> bos_token_id;
    std::optional<QuantizationConfig> quantization;   // HF quantization_config
    nlohmann::json extra = nlohmann::json::object();  // every top-level key not mapped above

    bool operator==(const GptOssConfig&) const = default;

    // Parses HF config.json text (either spelling). Checks JSON types and that the two spellings of
    // a key agree; does not call validate().
    static StatusOr<GptOssConfig> from_json_text(std::string_view text);
    static StatusOr<GptOssConfig> from_json(const nlohmann::json& j);
    static StatusOr<GptOssConfig> from_file(const std::string& path);
    // "gpt-oss-20b", "gpt-oss-120b" (MODEL.md §1.1) or "tiny" (4 layers, hidden 256, 8 experts;
    // real vocabulary so the real tokenizer works).
    static StatusOr<GptOssConfig> preset(std::string_view name);
    // eos_token_id of `dir`/generation_config.json (an int or a list; the published checkpoints list
    // <|return|>, <|endoftext|> and <|call|> there, config.json only <|return|>): what transformers'
    // and vLLM's generate stop on. Empty when the file is absent or has no eos_token_id; an error when
    // it is not JSON or the ids are not integers.
    static StatusOr<std::vector<int>> generation_eos_ids(const std::string& dir);

    // The published config.json spelling: rope_scaling + rope_theta, num_local_experts,
    // num_experts_per_tok (and the leftover experts_per_token), plus every key in `extra`.
    nlohmann::json to_hf_json() const;

    // Specific messages, e.g. "num_attention_heads (64) must be a multiple of num_key_value_heads (7)".
    Status validate() const;

    bool is_sliding(int layer) const {
        return layer >= 0 && layer < static_cast<int>(layer_types.size()) &&
               layer_types[static_cast<size_t>(layer)] == LayerType::kSlidingAttention;
    }
    int q_width() const { return num_attention_heads * head_dim; }   // 4096 for the real models
    int kv_width() const { return num_key_value_heads * head_dim; }  // 512 for the real models
};

}  // namespace gptoss::model
