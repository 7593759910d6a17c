#include "model/gpt_oss_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

namespace gptoss::model {
namespace {

using json = nlohmann::json;

std::string layer_types_json(int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i)
        s += std::string(i ? "," : "") + (i % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
    return s + "]";
}

// The root config.json of openai/gpt-oss-20b / -120b (MODEL.md §1.1).
std::string published_config(int layers, int experts) {
    return R"({
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": 200002,
  "experts_per_token": 4,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2880,
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": )" +
           layer_types_json(layers) + R"(,
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": 64,
  "num_experts_per_tok": 4,
  "num_hidden_layers": )" +
           std::to_string(layers) + R"(,
  "num_key_value_heads": 8,
  "num_local_experts": )" +
           std::to_string(experts) + R"(,
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"
  },
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": false
  },
  "rope_theta": 150000,
  "router_aux_loss_coef": 0.9,
  "sliding_window": 128,
  "swiglu_limit": 7.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": 201088
})";
}

// The same model as transformers >= 5 spells it: rope_parameters with rope_theta inside,
// num_experts / experts_per_token, no layer_types (default alternation), eos as a list.
std::string transformers5_config(int layers, int experts) {
    return R"({
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": [200002],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2880,
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 2880,
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": 64,
  "experts_per_token": 4,
  "num_hidden_layers": )" +
           std::to_string(layers) + R"(,
  "num_key_value_heads": 8,
  "num_experts": )" +
           std::to_string(experts) + R"(,
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"
  },
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 4096,
    "truncate": false,
    "rope_theta": 150000.0
  },
  "router_aux_loss_coef": 0.9,
  "sliding_window": 128,
  "swiglu_limit": 7.0,
  "swiglu_alpha": 1.702,
  "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": 201088
})";
}

GptOssConfig parse_ok(const std::string& text) {
    auto c = GptOssConfig::from_json_text(text);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : GptOssConfig{};
}

GptOssConfig preset_ok(std::string_view name) {
    auto c = GptOssConfig::preset(name);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : GptOssConfig{};
}

void expect_parse_error(const std::string& text, const std::string& what) {
    auto c = GptOssConfig::from_json_text(text);
    ASSERT_FALSE(c.ok()) << "expected: " << what;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(what), std::string::npos) << c.status().message();
}

// Edits a copy of the published 20b config JSON and parses it.
void expect_edit_error(const std::function<void(json&)>& edit, const std::string& what) {
    json j = json::parse(published_config(24, 32));
    edit(j);
    expect_parse_error(j.dump(), what);
}

void expect_invalid(const GptOssConfig& c, const std::string& what) {
    Status st = c.validate();
    ASSERT_FALSE(st.ok()) << "expected: " << what;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), what);
}

// ---- parsing ------------------------------------------------------------------------------------

TEST(GptOssConfig, Published20bParsesAndValidates) {
    GptOssConfig c = parse_ok(published_config(24, 32));
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    EXPECT_EQ(c.hidden_size, 2880);
    EXPECT_EQ(c.num_hidden_layers, 24);
    EXPECT_EQ(c.num_attention_heads, 64);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.num_experts, 32);
    EXPECT_EQ(c.experts_per_token, 4);
    EXPECT_EQ(c.intermediate_size, 2880);
    EXPECT_EQ(c.sliding_window, 128);
    EXPECT_EQ(c.vocab_size, 201088);
    EXPECT_EQ(c.swiglu_limit, 7.0);
    EXPECT_EQ(c.swiglu_alpha, 1.702);
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_EQ(c.rope_theta, 150000.0);
    ASSERT_TRUE(c.rope_scaling.has_value());
    EXPECT_EQ(c.rope_scaling->rope_type, "yarn");
    EXPECT_EQ(c.rope_scaling->factor, 32.0);
    EXPECT_EQ(c.rope_scaling->beta_fast, 32.0);
    EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
    EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
    EXPECT_FALSE(c.rope_scaling->truncate);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_TRUE(c.attention_bias);
    EXPECT_FALSE(c.tie_word_embeddings);
    ASSERT_EQ(c.layer_types.size(), 24u);
    EXPECT_EQ(c.layer_types[0], LayerType::kSlidingAttention);
    EXPECT_EQ(c.layer_types[1], LayerType::kFullAttention);
    EXPECT_EQ(c.eos_token_ids, std::vector<int>{200002});
    EXPECT_EQ(c.pad_token_id, 199999);
    EXPECT_FALSE(c.bos_token_id.has_value());
    ASSERT_TRUE(c.quantization.has_value());
    EXPECT_EQ(c.quantization->quant_method, "mxfp4");
    EXPECT_EQ(c.quantization->modules_to_not_convert.size(), 4u);
    EXPECT_EQ(c.quantization->modules_to_not_convert[1], "model.layers.*.mlp.router");
    // Unmapped keys land in extra; mapped ones (either spelling) do not.
    EXPECT_EQ(c.extra["model_type"], "gpt_oss");
    EXPECT_EQ(c.extra["initial_context_length"], 4096);
    EXPECT_EQ(c.extra["router_aux_loss_coef"], 0.9);
    EXPECT_FALSE(c.extra.contains("experts_per_token"));
    EXPECT_FALSE(c.extra.contains("num_local_experts"));
    EXPECT_FALSE(c.extra.contains("rope_scaling"));
    EXPECT_FALSE(c.extra.contains("quantization_config"));
    EXPECT_EQ(c.q_width(), 4096);
    EXPECT_EQ(c.kv_width(), 512);
}

TEST(GptOssConfig, Published120bParsesAndValidates) {
    GptOssConfig c = parse_ok(published_config(36, 128));
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    EXPECT_EQ(c.num_hidden_layers, 36);
    EXPECT_EQ(c.num_experts, 128);
    EXPECT_EQ(c.layer_types.size(), 36u);
    EXPECT_TRUE(c.is_sliding(34));
    EXPECT_FALSE(c.is_sliding(35));
}

TEST(GptOssConfig, BothSpellingsParseToTheSameConfig) {
    for (auto [layers, experts] : {std::pair{24, 32}, std::pair{36, 128}}) {
        GptOssConfig published = parse_ok(published_config(layers, experts));
        GptOssConfig t5 = parse_ok(transformers5_config(layers, experts));
        EXPECT_EQ(published, t5) << published.to_hf_json().dump() << "\n" << t5.to_hf_json().dump();
    }
}

TEST(GptOssConfig, OriginalOpenAiConfigSpelling) {
    // original/config.json (MODEL.md §1.2).
    GptOssConfig c = parse_ok(R"({"num_hidden_layers": 24, "num_experts": 32, "experts_per_token": 4,
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "swiglu_limit": 7.0,
        "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
        "initial_context_length": 4096, "rope_theta": 150000.0, "rope_scaling_factor": 32.0,
        "rope_ntk_alpha": 1.0, "rope_ntk_beta": 32.0})");
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    GptOssConfig published = parse_ok(published_config(24, 32));
    ASSERT_TRUE(c.rope_scaling.has_value());
    EXPECT_EQ(*c.rope_scaling, *published.rope_scaling);
    EXPECT_EQ(c.layer_types, published.layer_types);
    EXPECT_EQ(c.num_experts, 32);
    EXPECT_EQ(c.experts_per_token, 4);
}

TEST(GptOssConfig, DefaultLayerTypesAlternateStartingWithSliding) {
    json j = json::parse(published_config(24, 32));
    j.erase("layer_types");
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_EQ(c->layer_types.size(), 24u);
    for (int l = 0; l < 24; ++l) EXPECT_EQ(c->is_sliding(l), l % 2 == 0) << l;
    EXPECT_FALSE(c->is_sliding(-1));
    EXPECT_FALSE(c->is_sliding(24));
}

TEST(GptOssConfig, RopeScalingAbsentNullAndDefault) {
    json j = json::parse(published_config(24, 32));
    j.erase("rope_scaling");
    auto absent = GptOssConfig::from_json(j);  // HF's default block
    ASSERT_TRUE(absent.ok()) << absent.status().to_string();
    EXPECT_EQ(absent->rope_scaling, RopeScaling{});
    j["rope_scaling"] = nullptr;  // transformers keeps its default block (tools/hf_rope_probe.py)
    auto null = GptOssConfig::from_json(j);
    ASSERT_TRUE(null.ok()) << null.status().to_string();
    EXPECT_EQ(null->rope_scaling, RopeScaling{});
    EXPECT_TRUE(null->validate().ok());
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    auto plain = GptOssConfig::from_json(j);
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    EXPECT_FALSE(plain->rope_scaling.has_value());
    EXPECT_EQ(plain->rope_theta, 10000.0);
}

TEST(GptOssConfig, YarnTruncateDefaultsToTrueLikeTransformers) {
    json j = json::parse(published_config(24, 32));
    j["rope_scaling"].erase("truncate");
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(c->rope_scaling->truncate);
}

// transformers 5 (tools/hf_rope_probe.py on 5.17): a missing original_max_position_embeddings is
// max_position_embeddings (initial_context_length is not read), and a top-level one wins over the block's.
TEST(GptOssConfig, OriginalMaxPositionAsTransformersStandardizesIt) {
    json j = json::parse(published_config(24, 32));
    j["rope_scaling"].erase("original_max_position_embeddings");
    j["initial_context_length"] = 2048;
    j["max_position_embeddings"] = 65536;
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 65536);
    j["rope_scaling"]["original_max_position_embeddings"] = 4096;
    j["original_max_position_embeddings"] = 1024;
    c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 1024);
    j.erase("rope_scaling");  // the default block too
    c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 1024);
    j["original_max_position_embeddings"] = "1024";
    expect_parse_error(j.dump(), "original_max_position_embeddings must be an integer");
}

TEST(GptOssConfig, EosListAndBos) {
    json j = json::parse(published_config(24, 32));
    j["eos_token_id"] = {200002, 199999, 200012};
    j["bos_token_id"] = 199998;
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->eos_token_ids, (std::vector<int>{200002, 199999, 200012}));
    EXPECT_EQ(c->bos_token_id, 199998);
    j["pad_token_id"] = nullptr;
    auto no_pad = GptOssConfig::from_json(j);
    ASSERT_TRUE(no_pad.ok());
    EXPECT_FALSE(no_pad->pad_token_id.has_value());
}

TEST(GptOssConfig, QuantizationExtraKeysAreKept) {
    json j = json::parse(published_config(24, 32));
    j["quantization_config"]["dequantize"] = false;
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->quantization->extra["dequantize"], false);
    EXPECT_EQ(c->to_hf_json()["quantization_config"], j["quantization_config"]);
    j.erase("quantization_config");
    auto none = GptOssConfig::from_json(j);
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->quantization.has_value());
}

// ---- parse errors -------------------------------------------------------------------------------

TEST(GptOssConfigParse, InvalidJson) {
    expect_parse_error("{\"hidden_size\": ", "config is not valid JSON");
    expect_parse_error("[1, 2]", "config must be a JSON object");
}

TEST(GptOssConfigParse, MissingRequiredKey) {
    expect_edit_error([](json& j) { j.erase("hidden_size"); }, "missing hidden_size");
    expect_edit_error([](json& j) { j.erase("num_local_experts"); }, "missing num_local_experts");
    expect_edit_error(
        [](json& j) {
            j.erase("num_experts_per_tok");
            j.erase("experts_per_token");
        },
        "missing num_experts_per_tok");
}

TEST(GptOssConfigParse, WrongJsonTypes) {
    expect_edit_error([](json& j) { j["hidden_size"] = "2880"; }, "hidden_size must be an integer, got \"2880\"");
    expect_edit_error([](json& j) { j["hidden_size"] = 2880.5; }, "hidden_size must be an integer, got 2880.5");
    expect_edit_error([](json& j) { j["vocab_size"] = 1ll << 40; }, "vocab_size must be a 32-bit integer");
    expect_edit_error([](json& j) { j["rms_norm_eps"] = "tiny"; }, "rms_norm_eps must be a number");
    expect_edit_error([](json& j) { j["attention_bias"] = 1; }, "attention_bias must be true or false, got 1");
    expect_edit_error([](json& j) { j["rope_scaling"] = 32; }, "rope_scaling must be an object, got 32");
    expect_edit_error([](json& j) { j["rope_scaling"]["factor"] = "32"; }, "rope_scaling.factor must be a number");
    expect_edit_error([](json& j) { j["layer_types"] = "sliding"; }, "layer_types must be an array of strings");
    expect_edit_error([](json& j) { j["eos_token_id"] = {200002, "x"}; }, "eos_token_id[1] must be an integer");
    expect_edit_error([](json& j) { j["quantization_config"]["modules_to_not_convert"] = {1}; },
                      "quantization_config.modules_to_not_convert[] must be a string");
}

TEST(GptOssConfigParse, UnknownLayerType) {
    expect_edit_error([](json& j) { j["layer_types"][3] = "local_attention"; },
                      "layer_types[3] is \"local_attention\", expected \"sliding_attention\" or \"full_attention\"");
}

TEST(GptOssConfigParse, SpellingsThatDisagree) {
    expect_edit_error([](json& j) { j["experts_per_token"] = 2; },
                      "num_experts_per_tok (4) and experts_per_token (2) disagree");
    expect_edit_error([](json& j) { j["num_experts"] = 64; }, "num_local_experts (32) and num_experts (64) disagree");
    expect_edit_error(
        [](json& j) {
            j["rope_parameters"] = j["rope_scaling"];
            j["rope_parameters"]["rope_theta"] = 10000.0;
        },
        "rope_theta (150000) and rope_parameters.rope_theta (10000.0) disagree");
    expect_edit_error(
        [](json& j) {
            j["rope_parameters"] = j["rope_scaling"];
            j["rope_parameters"]["factor"] = 16.0;
        },
        "rope_scaling and rope_parameters disagree");
}

TEST(GptOssConfigParse, UnsupportedRopeKey) {
    expect_edit_error([](json& j) { j["rope_scaling"]["long_factor"] = 1.5; },
                      "rope_scaling: unsupported key 'long_factor'");
    expect_edit_error([](json& j) { j["rope_scaling"]["rope_theta"] = 150000; },
                      "rope_scaling must not contain rope_theta");
}

// The concentration as transformers' _compute_yarn_parameters derives it (its get_mscale(scale, m) is
// 0.1·m·ln(scale) + 1, or 1 for scale ≤ 1), and its `or` defaults for the betas.
TEST(GptOssConfigParse, YarnAttentionFactorMscaleAndBetaDefaults) {
    auto parse = [](const std::function<void(json&)>& edit) {
        json j = json::parse(published_config(24, 32));
        edit(j);
        auto c = GptOssConfig::from_json(j);
        EXPECT_TRUE(c.ok()) << c.status().to_string();
        EXPECT_TRUE(c->validate().ok()) << c->validate().to_string();
        return *c->rope_scaling;
    };
    const double published = 0.1 * std::log(32.0) + 1.0;
    EXPECT_DOUBLE_EQ(parse([](json&) {}).concentration(), published);
    EXPECT_DOUBLE_EQ(parse([](json& j) { j["rope_scaling"]["attention_factor"] = 2.5; }).concentration(), 2.5);
    EXPECT_DOUBLE_EQ(parse([](json& j) {
                         j["rope_scaling"]["mscale"] = 0.707;
                         j["rope_scaling"]["mscale_all_dim"] = 0.5;
                     }).concentration(),
                     (0.1 * 0.707 * std::log(32.0) + 1.0) / (0.1 * 0.5 * std::log(32.0) + 1.0));
    // mscale alone, or beside a zero mscale_all_dim: the plain factor's value.
    EXPECT_DOUBLE_EQ(parse([](json& j) { j["rope_scaling"]["mscale"] = 2.0; }).concentration(), published);
    EXPECT_DOUBLE_EQ(parse([](json& j) {
                         j["rope_scaling"]["mscale"] = 1.0;
                         j["rope_scaling"]["mscale_all_dim"] = 0.0;
                     }).concentration(),
                     published);
    // attention_factor wins over mscale; factor 1 has concentration 1.
    EXPECT_DOUBLE_EQ(parse([](json& j) {
                         j["rope_scaling"]["attention_factor"] = 1.0;
                         j["rope_scaling"]["mscale"] = 0.707;
                         j["rope_scaling"]["mscale_all_dim"] = 0.707;
                     }).concentration(),
                     1.0);
    EXPECT_DOUBLE_EQ(parse([](json& j) { j["rope_scaling"]["factor"] = 1.0; }).concentration(), 1.0);
    // 0 or null betas are the defaults 32 / 1.
    const RopeScaling zero = parse([](json& j) {
        j["rope_scaling"]["beta_fast"] = 0;
        j["rope_scaling"]["beta_slow"] = nullptr;
    });
    EXPECT_EQ(zero.beta_fast, 32.0);
    EXPECT_EQ(zero.beta_slow, 1.0);
    const RopeScaling given = parse([](json& j) {
        j["rope_scaling"]["beta_fast"] = 16.0;
        j["rope_scaling"]["beta_slow"] = 2.0;
        j["rope_scaling"]["attention_factor"] = 1.25;
    });
    EXPECT_EQ(given.beta_fast, 16.0);
    EXPECT_EQ(given.beta_slow, 2.0);
    // The values survive a write and a read (convert's config.json).
    auto again = GptOssConfig::from_json(json::parse(published_config(24, 32)));
    ASSERT_TRUE(again.ok());
    again->rope_scaling = given;
    auto back = GptOssConfig::from_json(again->to_hf_json());
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back->rope_scaling, given);
    // A concentration that is not positive is refused.
    json j = json::parse(published_config(24, 32));
    j["rope_scaling"]["attention_factor"] = -1.0;
    auto bad = GptOssConfig::from_json(j);
    ASSERT_TRUE(bad.ok());
    EXPECT_NE(bad->validate().to_string().find("must be positive"), std::string::npos) << bad->validate().to_string();
    j["rope_scaling"]["attention_factor"] = "1";
    EXPECT_FALSE(GptOssConfig::from_json(j).ok());
}

// 100,000 nested arrays overflowed the stack in nlohmann's recursive values (a segfault at load): refused first.
TEST(GptOssConfigParse, DeepNestingIsRefusedBeforeParsing) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    auto c = GptOssConfig::from_json_text(deep);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().to_string().find("config is nested deeper than 64 levels"), std::string::npos)
        << c.status().to_string();
}

TEST(GptOssConfigParse, FromFile) {
    auto dir = std::filesystem::temp_directory_path() / ("gptoss_cfg_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "config.json").string();
    {
        std::ofstream f(path);
        f << published_config(24, 32);
    }
    auto c = GptOssConfig::from_file(path);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->num_experts, 32);
    {
        std::ofstream f(path);
        f << "{\"hidden_size\": true}";
    }
    auto bad = GptOssConfig::from_file(path);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find(path + ": hidden_size must be an integer"), std::string::npos)
        << bad.status().message();
    auto missing = GptOssConfig::from_file((dir / "nope.json").string());
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    // A directory where the file should be: said so (it read as an empty, invalid JSON text).
    std::filesystem::create_directories(dir / "sub" / "config.json");
    auto is_dir = GptOssConfig::from_file((dir / "sub" / "config.json").string());
    ASSERT_FALSE(is_dir.ok());
    EXPECT_NE(is_dir.status().message().find("is a directory"), std::string::npos) << is_dir.status().message();
    // A FIFO (the open blocked forever) and a symlink loop: refused at once, and said why.
    const std::string fifo = (dir / "fifo.json").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto is_fifo = GptOssConfig::from_file(fifo);
    ASSERT_FALSE(is_fifo.ok());
    EXPECT_NE(is_fifo.status().message().find("not a regular file"), std::string::npos) << is_fifo.status().message();
    std::filesystem::create_symlink(dir / "loop.json", dir / "loop.json");
    auto loop = GptOssConfig::from_file((dir / "loop.json").string());
    ASSERT_FALSE(loop.ok());
    EXPECT_NE(loop.status().code(), StatusCode::kNotFound) << loop.status().message();
    std::filesystem::remove_all(dir);
}

// A sliding window at least as long as the context is full attention: held at max_position_embeddings (a window near
// 2^31 overflowed the KV cache's block count and aborted the engine; one past the context asked for blocks no
// sequence can use). A shorter one is kept.
TEST(GptOssConfigParse, SlidingWindowHeldAtTheContext) {
    json j = json::parse(published_config(24, 32));
    j["max_position_embeddings"] = 4096;
    for (int64_t w : {int64_t{2147483647}, int64_t{4097}, int64_t{4096}}) {
        j["sliding_window"] = w;
        auto c = GptOssConfig::from_json(j);
        ASSERT_TRUE(c.ok()) << c.status().to_string();
        EXPECT_EQ(c->sliding_window, 4096) << w;
    }
    j["sliding_window"] = 4095;
    auto c = GptOssConfig::from_json(j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->sliding_window, 4095);
}

// sliding_window null is transformers' None (no window): a model whose layers are all full_attention reads it; one
// with a sliding layer is refused, naming it (it was "must be an integer, got null" for both).
TEST(GptOssConfigParse, SlidingWindowNullOnlyWithoutSlidingLayers) {
    json j = json::parse(published_config(24, 32));
    j["sliding_window"] = nullptr;
    auto sliding = GptOssConfig::from_json(j);
    ASSERT_FALSE(sliding.ok());
    EXPECT_NE(sliding.status().message().find("sliding_window is null (no window) but layer 0 is sliding_attention"),
              std::string::npos)
        << sliding.status().message();
    j["layer_types"] = json::array();
    for (int l = 0; l < 24; ++l) j["layer_types"].push_back("full_attention");
    auto full = GptOssConfig::from_json(j);
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    EXPECT_TRUE(full->validate().ok());
    for (LayerType t : full->layer_types) EXPECT_EQ(t, LayerType::kFullAttention);
}

// ---- presets and round trips --------------------------------------------------------------------

TEST(GptOssConfigPreset, PresetsMatchThePublishedConfigs) {
    EXPECT_EQ(preset_ok("gpt-oss-20b"), parse_ok(published_config(24, 32)));
    EXPECT_EQ(preset_ok("gpt-oss-120b"), parse_ok(published_config(36, 128)));
    // to_hf_json writes the published file back, key for key.
    EXPECT_EQ(preset_ok("gpt-oss-20b").to_hf_json(), json::parse(published_config(24, 32)));
    EXPECT_EQ(preset_ok("gpt-oss-120b").to_hf_json(), json::parse(published_config(36, 128)));
}

TEST(GptOssConfigPreset, TinyIsValidAndSmall) {
    GptOssConfig c = preset_ok("tiny");
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    EXPECT_EQ(c.hidden_size, 256);
    EXPECT_EQ(c.num_hidden_layers, 4);
    EXPECT_EQ(c.num_attention_heads, 8);
    EXPECT_EQ(c.num_key_value_heads, 1);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.experts_per_token, 4);
    EXPECT_EQ(c.intermediate_size, 256);
    EXPECT_EQ(c.sliding_window, 32);
    EXPECT_EQ(c.vocab_size, 201088);
    EXPECT_EQ(c.layer_types.size(), 4u);
    EXPECT_TRUE(c.quantization.has_value());
}

TEST(GptOssConfigPreset, UnknownPresetIsAnError) {
    auto c = GptOssConfig::preset("gpt-oss-7b");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("unknown model preset 'gpt-oss-7b'"), std::string::npos);
}

TEST(GptOssConfig, RoundTripThroughHfJson) {
    std::vector<GptOssConfig> configs = {preset_ok("gpt-oss-20b"), preset_ok("gpt-oss-120b"), preset_ok("tiny"),
                                         parse_ok(transformers5_config(24, 32))};
    GptOssConfig odd = preset_ok("tiny");
    odd.rope_scaling.reset();
    odd.swiglu_alpha = 1.5;
    odd.rms_norm_eps = 1e-6;
    odd.eos_token_ids = {200002, 200012};
    odd.bos_token_id = 199998;
    odd.pad_token_id.reset();
    odd.quantization.reset();
    odd.layer_types = {LayerType::kFullAttention, LayerType::kFullAttention, LayerType::kSlidingAttention,
                       LayerType::kFullAttention};
    odd.extra["custom_key"] = {{"nested", {1, 2, 3}}};
    configs.push_back(odd);
    for (const GptOssConfig& c : configs) {
        // Through text too, as config.json is written and read.
        std::string text = c.to_hf_json().dump(2);
        auto back = GptOssConfig::from_json_text(text);
        ASSERT_TRUE(back.ok()) << back.status().to_string();
        EXPECT_EQ(*back, c) << text;
    }
}

// ---- validation: one test per rule --------------------------------------------------------------

GptOssConfig base() { return preset_ok("gpt-oss-20b"); }

TEST(GptOssConfigValidate, HeadsMultipleOfKvHeads) {
    GptOssConfig c = base();
    c.num_key_value_heads = 7;
    expect_invalid(c, "num_attention_heads (64) must be a multiple of num_key_value_heads (7)");
}

// Widths that are not multiples of 32 are a valid config (unquantized or FP8 experts take them); the MXFP4 group
// size is the loader's check, for MXFP4 experts only (forward_test: ExpertWidths).
TEST(GptOssConfigValidate, AnyHiddenAndIntermediateSize) {
    GptOssConfig c = base();
    c.hidden_size = 2888;
    c.intermediate_size = 100;
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
}

TEST(GptOssConfigValidate, HeadDimEven) {
    GptOssConfig c = base();
    c.head_dim = 63;
    expect_invalid(c, "head_dim (63) must be even (RoPE rotates pairs)");
}

TEST(GptOssConfigValidate, ExpertsPerTokenAtMostNumExperts) {
    GptOssConfig c = base();
    c.experts_per_token = 33;
    expect_invalid(c, "experts_per_token (33) must be at most num_experts (32)");
}

TEST(GptOssConfigValidate, LayerTypesLength) {
    GptOssConfig c = base();
    c.layer_types.pop_back();
    expect_invalid(c, "layer_types has 23 entries but num_hidden_layers is 24");
}

TEST(GptOssConfigValidate, PositiveSizes) {
    GptOssConfig c = base();
    c.hidden_size = 0;
    expect_invalid(c, "hidden_size (0) must be positive");
    c = base();
    c.num_key_value_heads = -8;
    expect_invalid(c, "num_key_value_heads (-8) must be positive");
    c = base();
    c.vocab_size = 1 << 30;
    expect_invalid(c, "vocab_size (1073741824) is larger than 16777216");
    c = base();
    c.num_hidden_layers = 0;
    c.layer_types.clear();
    expect_invalid(c, "num_hidden_layers (0) must be positive");
}

// A config of another quantization or model family over gpt-oss's tensors loaded silently as gpt-oss.
TEST(GptOssConfigValidate, OtherQuantMethodsAndModelTypesAreRefused) {
    auto parsed = [](const std::function<void(json&)>& edit) {
        json j = json::parse(published_config(24, 32));
        edit(j);
        auto c = GptOssConfig::from_json(j);
        EXPECT_TRUE(c.ok()) << c.status().to_string();
        return *c;
    };
    expect_invalid(parsed([](json& j) { j["quantization_config"]["quant_method"] = "awq"; }),
                   "quantization_config.quant_method 'awq' is not supported (\"mxfp4\", as published, or "
                   "\"gptoss_fp8_block\" from gptoss convert)");
    expect_invalid(parsed([](json& j) { j["model_type"] = "llama"; }),
                   "model_type \"llama\" is not gpt-oss's (\"gpt_oss\")");
    EXPECT_TRUE(parsed([](json& j) { j.erase("model_type"); }).validate().ok());
    EXPECT_TRUE(parsed([](json& j) { j.erase("quantization_config"); }).validate().ok());
    EXPECT_TRUE(parsed([](json& j) { j["quantization_config"]["quant_method"] = "gptoss_fp8_block"; }).validate().ok());
}

TEST(GptOssConfigValidate, RopeTypeYarnOrLinear) {
    GptOssConfig c = base();
    c.rope_scaling->rope_type = "llama3";
    expect_invalid(c, "rope_scaling.rope_type 'llama3' is not supported (\"yarn\", \"linear\" or \"default\")");
    c.rope_scaling->rope_type = "linear";
    EXPECT_TRUE(c.validate().ok());
    // The parser keeps the type so validate() can say which one.
    json j = json::parse(published_config(24, 32));
    j["rope_scaling"]["rope_type"] = "dynamic";
    auto parsed = GptOssConfig::from_json(j);
    ASSERT_TRUE(parsed.ok());
    expect_invalid(*parsed, "rope_scaling.rope_type 'dynamic' is not supported (\"yarn\", \"linear\" or \"default\")");
}

TEST(GptOssConfigValidate, RopeParameters) {
    GptOssConfig c = base();
    c.rope_scaling->factor = 0.5;
    expect_invalid(c, "rope_scaling.factor (0.5) must be at least 1");
    c = base();
    c.rope_scaling->beta_fast = 1.0;
    expect_invalid(c, "rope_scaling.beta_fast (1) must be greater than beta_slow (1) > 0");
    c = base();
    c.rope_scaling->original_max_position_embeddings = 0;
    expect_invalid(c, "rope_scaling.original_max_position_embeddings (0) must be positive");
    c = base();
    c.rope_theta = -1;
    expect_invalid(c, "rope_theta (-1) must be positive");
    // YaRN's correction range divides by ln(rope_theta): theta 1 gave NaN logits.
    c = base();
    c.rope_theta = 1.0;
    expect_invalid(c, "rope_theta (1) must be greater than 1 with YaRN rope_scaling");
    c.rope_scaling.reset();
    EXPECT_TRUE(c.validate().ok());
}

TEST(GptOssConfigValidate, SlidingWindowAtLeastOne) {
    GptOssConfig c = base();
    c.sliding_window = 0;
    expect_invalid(c, "sliding_window (0) must be at least 1");
}

TEST(GptOssConfigValidate, PositiveFloats) {
    GptOssConfig c = base();
    c.rms_norm_eps = 0;
    expect_invalid(c, "rms_norm_eps (0) must be positive");
    c = base();
    c.swiglu_limit = -7;
    expect_invalid(c, "swiglu_limit (-7) must be positive");
    c = base();
    c.swiglu_alpha = std::numeric_limits<double>::quiet_NaN();
    expect_invalid(c, "swiglu_alpha (nan) must be positive");
}

TEST(GptOssConfigValidate, TokenIdsInsideVocabulary) {
    GptOssConfig c = base();
    c.eos_token_ids.push_back(201088);
    expect_invalid(c, "eos_token_id (201088) is outside the vocabulary [0, 201088)");
    c = base();
    c.pad_token_id = -1;
    expect_invalid(c, "pad_token_id (-1) is outside the vocabulary [0, 201088)");
    c = base();
    c.bos_token_id = 300000;
    expect_invalid(c, "bos_token_id (300000) is outside the vocabulary [0, 201088)");
}

}  // namespace
}  // namespace gptoss::model
