#include "model/gpt_oss_config.h"

#include "core/json_shape.h"
#include "model/fp8_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace gptoss::model {

using json = nlohmann::json;

namespace {

// Upper bound for every size field: keeps products such as heads × head_dim and vocab × hidden
// well inside 64 bits (and int) everywhere downstream.
constexpr int kMaxSize = 1 << 24;
constexpr uint64_t kMaxConfigBytes = 16ull << 20;

std::string describe(const json& v) {
    std::string s = v.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

Status type_error(const std::string& key, const char* expected, const json& v) {
    return invalid_argument(key + " must be " + expected + ", got " + describe(v));
}

Status get_int(const std::string& key, const json& v, int* out) {
    if (!v.is_number_integer()) return type_error(key, "an integer", v);
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int>::max())) return type_error(key, "a 32-bit integer", v);
        *out = static_cast<int>(u);
        return ok_status();
    }
    int64_t i = v.get<int64_t>();
    if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max()) {
        return type_error(key, "a 32-bit integer", v);
    }
    *out = static_cast<int>(i);
    return ok_status();
}

Status get_double(const std::string& key, const json& v, double* out) {
    if (!v.is_number()) return type_error(key, "a number", v);
    *out = v.get<double>();
    return ok_status();
}

Status get_bool(const std::string& key, const json& v, bool* out) {
    if (!v.is_boolean()) return type_error(key, "true or false", v);
    *out = v.get<bool>();
    return ok_status();
}

Status get_string(const std::string& key, const json& v, std::string* out) {
    if (!v.is_string()) return type_error(key, "a string", v);
    *out = v.get<std::string>();
    return ok_status();
}

// Hands out the keys of one JSON object and remembers which were used, so the rest go to `extra`.
class KeyReader {
public:
    KeyReader(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

    // nullptr when absent. `null` values count as present (callers decide what null means).
    const json* take(const std::string& key) {
        used_.insert(key);
        auto it = obj_.find(key);
        return it == obj_.end() ? nullptr : &*it;
    }
    // One value under either of two spellings; both present and different is an error.
    Status take_either(const std::string& a, const std::string& b, const json** out) {
        const json* va = take(a);
        const json* vb = take(b);
        if (va != nullptr && vb != nullptr && *va != *vb) {
            return invalid_argument(name(a) + " (" + describe(*va) + ") and " + name(b) + " (" + describe(*vb) +
                                    ") disagree");
        }
        *out = va != nullptr ? va : vb;
        return ok_status();
    }
    std::string name(const std::string& key) const { return prefix_ + key; }

    Status take_int(const std::string& key, int* out, bool required) {
        const json* v = take(key);
        return finish_int(key, v, out, required);
    }
    Status take_int_either(const std::string& a, const std::string& b, int* out, bool required) {
        const json* v = nullptr;
        RETURN_IF_ERROR(take_either(a, b, &v));
        return finish_int(a, v, out, required);
    }
    Status take_double(const std::string& key, double* out) {
        const json* v = take(key);
        return v == nullptr ? ok_status() : get_double(name(key), *v, out);
    }
    Status take_bool(const std::string& key, bool* out) {
        const json* v = take(key);
        return v == nullptr ? ok_status() : get_bool(name(key), *v, out);
    }
    Status take_optional_int(const std::string& key, std::optional<int>* out) {
        const json* v = take(key);
        if (v == nullptr || v->is_null()) return ok_status();
        int x = 0;
        RETURN_IF_ERROR(get_int(name(key), *v, &x));
        *out = x;
        return ok_status();
    }

    json leftovers() const {
        json out = json::object();
        for (const auto& [k, v] : obj_.items()) {
            if (!used_.count(k)) out[k] = v;
        }
        return out;
    }
    std::vector<std::string> unused_keys() const {
        std::vector<std::string> out;
        for (const auto& [k, v] : obj_.items()) {
            if (!used_.count(k)) out.push_back(k);
        }
        return out;
    }

private:
    Status finish_int(const std::string& key, const json* v, int* out, bool required) {
        if (v == nullptr) return required ? invalid_argument("missing " + name(key)) : ok_status();
        return get_int(name(key), *v, out);
    }

    const json& obj_;
    std::string prefix_;
    std::set<std::string> used_;
};

// One rope block: HF `rope_scaling` (published) or `rope_parameters` (transformers >= 5, which also
// holds rope_theta). rope_type "default" means plain RoPE.
struct RopeBlock {
    std::optional<RopeScaling> scaling;
    std::optional<double> theta;
};

// The YaRN original context as transformers 5 standardizes it: a top-level original_max_position_embeddings
// wins over the block's own (Phi-3's convention, applied to every model), else the block's, else
// max_position_embeddings (initial_context_length is not read: tools/hf_rope_probe.py's cases).
struct OriginalContext {
    std::optional<int> top_level;
    int max_position_embeddings = 0;
};

Status parse_rope_block(const std::string& key, const json& v, const OriginalContext& original, RopeBlock* out) {
    if (!v.is_object()) return type_error(key, "an object", v);
    KeyReader r(v, key + ".");
    const json* type = nullptr;
    RETURN_IF_ERROR(r.take_either("rope_type", "type", &type));  // "type" is the older HF spelling
    std::string rope_type = "default";
    if (type != nullptr) RETURN_IF_ERROR(get_string(r.name("rope_type"), *type, &rope_type));
    if (const json* t = r.take("rope_theta"); t != nullptr) {
        double theta = 0;
        RETURN_IF_ERROR(get_double(r.name("rope_theta"), *t, &theta));
        out->theta = theta;
    }
    if (rope_type != "default") {
        RopeScaling s;
        s.rope_type = rope_type;
        const json* factor = r.take("factor");
        if (factor == nullptr) return invalid_argument("missing " + r.name("factor"));
        RETURN_IF_ERROR(get_double(r.name("factor"), *factor, &s.factor));
        // null is absent, and so is 0 for the betas (transformers reads `get("beta_fast") or 32`).
        auto take_optional = [&](const char* k, std::optional<double>* dst) -> Status {
            const json* x = r.take(k);
            if (x == nullptr || x->is_null()) return ok_status();
            double d = 0;
            RETURN_IF_ERROR(get_double(r.name(k), *x, &d));
            *dst = d;
            return ok_status();
        };
        std::optional<double> beta_fast, beta_slow;
        RETURN_IF_ERROR(take_optional("beta_fast", &beta_fast));
        RETURN_IF_ERROR(take_optional("beta_slow", &beta_slow));
        if (beta_fast && *beta_fast != 0) s.beta_fast = *beta_fast;
        if (beta_slow && *beta_slow != 0) s.beta_slow = *beta_slow;
        RETURN_IF_ERROR(take_optional("attention_factor", &s.attention_factor));
        RETURN_IF_ERROR(take_optional("mscale", &s.mscale));
        RETURN_IF_ERROR(take_optional("mscale_all_dim", &s.mscale_all_dim));
        // transformers' YaRN defaults to truncate=true when the key is absent; the published
        // checkpoints say false explicitly.
        s.truncate = true;
        RETURN_IF_ERROR(r.take_bool("truncate", &s.truncate));
        const json* orig = r.take("original_max_position_embeddings");
        s.original_max_position_embeddings = original.max_position_embeddings;
        if (orig != nullptr && !orig->is_null()) {
            RETURN_IF_ERROR(
                get_int(r.name("original_max_position_embeddings"), *orig, &s.original_max_position_embeddings));
        }
        if (original.top_level) s.original_max_position_embeddings = *original.top_level;
        out->scaling = s;
    }
    // Anything else (partial_rotary_factor, long_factor, ...) would change the numerics: refuse rather than
    // ignore it.
    for (const auto& k : r.unused_keys()) {
        const json& x = v.at(k);
        if (!x.is_null()) return invalid_argument(key + ": unsupported key '" + k + "' (" + describe(x) + ")");
    }
    return ok_status();
}

Status parse_layer_types(const json& v, std::vector<LayerType>* out) {
    if (!v.is_array()) return type_error("layer_types", "an array of strings", v);
    out->clear();
    for (size_t i = 0; i < v.size(); ++i) {
        const json& t = v[i];
        if (t == "sliding_attention") {
            out->push_back(LayerType::kSlidingAttention);
        } else if (t == "full_attention") {
            out->push_back(LayerType::kFullAttention);
        } else {
            return invalid_argument("layer_types[" + std::to_string(i) + "] is " + describe(t) +
                                    ", expected \"sliding_attention\" or \"full_attention\"");
        }
    }
    return ok_status();
}

Status parse_quantization(const json& v, std::optional<QuantizationConfig>* out) {
    if (v.is_null()) return ok_status();
    if (!v.is_object()) return type_error("quantization_config", "an object", v);
    KeyReader r(v, "quantization_config.");
    QuantizationConfig q;
    const json* method = r.take("quant_method");
    if (method == nullptr) return invalid_argument("missing quantization_config.quant_method");
    RETURN_IF_ERROR(get_string(r.name("quant_method"), *method, &q.quant_method));
    if (const json* m = r.take("modules_to_not_convert"); m != nullptr && !m->is_null()) {
        if (!m->is_array()) return type_error(r.name("modules_to_not_convert"), "an array of strings", *m);
        for (const auto& s : *m) {
            if (!s.is_string()) return type_error(r.name("modules_to_not_convert[]"), "a string", s);
            q.modules_to_not_convert.push_back(s.get<std::string>());
        }
    }
    q.extra = r.leftovers();
    *out = std::move(q);
    return ok_status();
}

std::vector<LayerType> alternating_layers(int n) {
    std::vector<LayerType> out;
    for (int i = 0; i < n; ++i) out.push_back(i % 2 == 0 ? LayerType::kSlidingAttention : LayerType::kFullAttention);
    return out;
}

Status parse_config(const json& j, GptOssConfig* out) {
    if (!j.is_object()) return type_error("config", "a JSON object", j);
    GptOssConfig c;
    KeyReader r(j, "");
    RETURN_IF_ERROR(r.take_int("hidden_size", &c.hidden_size, true));
    RETURN_IF_ERROR(r.take_int("num_hidden_layers", &c.num_hidden_layers, true));
    RETURN_IF_ERROR(r.take_int("num_attention_heads", &c.num_attention_heads, true));
    RETURN_IF_ERROR(r.take_int("num_key_value_heads", &c.num_key_value_heads, true));
    RETURN_IF_ERROR(r.take_int("head_dim", &c.head_dim, false));
    RETURN_IF_ERROR(r.take_int_either("num_local_experts", "num_experts", &c.num_experts, true));
    RETURN_IF_ERROR(r.take_int_either("num_experts_per_tok", "experts_per_token", &c.experts_per_token, true));
    RETURN_IF_ERROR(r.take_int("intermediate_size", &c.intermediate_size, true));
    // null: no window (transformers' None), which only a model without sliding layers can have (checked below).
    const bool no_window = j.is_object() && j.contains("sliding_window") && j["sliding_window"].is_null();
    if (no_window)
        r.take("sliding_window");
    else
        RETURN_IF_ERROR(r.take_int("sliding_window", &c.sliding_window, false));
    RETURN_IF_ERROR(r.take_int("vocab_size", &c.vocab_size, true));
    RETURN_IF_ERROR(r.take_double("swiglu_limit", &c.swiglu_limit));
    RETURN_IF_ERROR(r.take_double("swiglu_alpha", &c.swiglu_alpha));
    RETURN_IF_ERROR(r.take_double("rms_norm_eps", &c.rms_norm_eps));
    RETURN_IF_ERROR(r.take_int("max_position_embeddings", &c.max_position_embeddings, false));
    RETURN_IF_ERROR(r.take_bool("attention_bias", &c.attention_bias));
    RETURN_IF_ERROR(r.take_bool("tie_word_embeddings", &c.tie_word_embeddings));
    RETURN_IF_ERROR(r.take_optional_int("pad_token_id", &c.pad_token_id));
    RETURN_IF_ERROR(r.take_optional_int("bos_token_id", &c.bos_token_id));

    // initial_context_length is a leftover of OpenAI's original config (= the YaRN original
    // context). It stays in `extra`; it only fills a missing original_max_position_embeddings.
    std::optional<int> initial_context_length;
    if (auto it = j.find("initial_context_length"); it != j.end() && !it->is_null()) {
        int v = 0;
        RETURN_IF_ERROR(get_int("initial_context_length", *it, &v));
        initial_context_length = v;
    }

    // RoPE: rope_theta + rope_scaling (published) and/or rope_parameters (transformers >= 5), or
    // OpenAI's original/config.json keys (MODEL.md §1.2).
    const json* theta_j = r.take("rope_theta");
    const json* scaling_j = r.take("rope_scaling");
    const json* params_j = r.take("rope_parameters");
    const json* orig_factor = r.take("rope_scaling_factor");
    const json* orig_alpha = r.take("rope_ntk_alpha");
    const json* orig_beta = r.take("rope_ntk_beta");
    std::optional<double> theta;
    if (theta_j != nullptr) {
        double t = 0;
        RETURN_IF_ERROR(get_double("rope_theta", *theta_j, &t));
        theta = t;
    }
    RopeBlock from_scaling, from_params;
    // transformers makes head_dim · factor / 2 frequencies of it, which gpt-oss's whole-head rotation cannot take.
    if (const json* prf = r.take("partial_rotary_factor"); prf != nullptr && !prf->is_null()) {
        double f = 0;
        RETURN_IF_ERROR(get_double("partial_rotary_factor", *prf, &f));
        if (f != 1.0) {
            return invalid_argument("partial_rotary_factor (" + describe(*prf) +
                                    ") is not supported: gpt-oss rotates whole heads (1.0)");
        }
    }
    OriginalContext original;
    original.max_position_embeddings = c.max_position_embeddings;
    RETURN_IF_ERROR(r.take_optional_int("original_max_position_embeddings", &original.top_level));
    // null or {} is no block: transformers (`rope_scaling or default`) then keeps the model's default, the published
    // YaRN block (tools/hf_rope_probe.py's rope_scaling_null and empty_rope_scaling).
    auto no_block = [](const json* b) { return b != nullptr && (b->is_null() || (b->is_object() && b->empty())); };
    if (no_block(scaling_j)) scaling_j = nullptr;
    if (no_block(params_j)) params_j = nullptr;
    if (scaling_j != nullptr) RETURN_IF_ERROR(parse_rope_block("rope_scaling", *scaling_j, original, &from_scaling));
    if (params_j != nullptr) RETURN_IF_ERROR(parse_rope_block("rope_parameters", *params_j, original, &from_params));
    if (from_scaling.theta) return invalid_argument("rope_scaling must not contain rope_theta (use rope_parameters)");
    if (from_params.theta) {
        if (theta && *theta != *from_params.theta) {
            return invalid_argument("rope_theta (" + describe(*theta_j) + ") and rope_parameters.rope_theta (" +
                                    describe(params_j->at("rope_theta")) + ") disagree");
        }
        theta = from_params.theta;
    }
    if (theta) c.rope_theta = *theta;
    if (scaling_j != nullptr && params_j != nullptr && from_scaling.scaling != from_params.scaling) {
        return invalid_argument("rope_scaling and rope_parameters disagree");
    }
    if (params_j != nullptr) {
        c.rope_scaling = from_params.scaling;
    } else if (scaling_j != nullptr) {
        c.rope_scaling = from_scaling.scaling;
    } else if (orig_factor != nullptr) {
        RopeScaling s;  // rope_ntk_beta -> beta_fast, rope_ntk_alpha -> beta_slow (MODEL.md §1.2)
        RETURN_IF_ERROR(get_double("rope_scaling_factor", *orig_factor, &s.factor));
        if (orig_alpha != nullptr) RETURN_IF_ERROR(get_double("rope_ntk_alpha", *orig_alpha, &s.beta_slow));
        if (orig_beta != nullptr) RETURN_IF_ERROR(get_double("rope_ntk_beta", *orig_beta, &s.beta_fast));
        if (initial_context_length) s.original_max_position_embeddings = *initial_context_length;
        c.rope_scaling = s;
    } else if (c.rope_scaling && original.top_level) {  // HF's default YaRN block (the struct default)
        c.rope_scaling->original_max_position_embeddings = *original.top_level;
    }

    if (const json* lt = r.take("layer_types"); lt != nullptr && !lt->is_null()) {
        RETURN_IF_ERROR(parse_layer_types(*lt, &c.layer_types));
    } else {
        c.layer_types = alternating_layers(std::clamp(c.num_hidden_layers, 0, kMaxSize));
    }
    if (no_window) {
        for (size_t l = 0; l < c.layer_types.size(); ++l)
            if (c.layer_types[l] == LayerType::kSlidingAttention)
                return invalid_argument("sliding_window is null (no window) but layer " + std::to_string(l) +
                                        " is sliding_attention");
    }

    if (const json* eos = r.take("eos_token_id"); eos != nullptr && !eos->is_null()) {
        if (eos->is_array()) {
            for (size_t i = 0; i < eos->size(); ++i) {
                int id = 0;
                RETURN_IF_ERROR(get_int("eos_token_id[" + std::to_string(i) + "]", (*eos)[i], &id));
                c.eos_token_ids.push_back(id);
            }
        } else {
            int id = 0;
            RETURN_IF_ERROR(get_int("eos_token_id", *eos, &id));
            c.eos_token_ids.push_back(id);
        }
    }
    if (const json* q = r.take("quantization_config"); q != nullptr) {
        RETURN_IF_ERROR(parse_quantization(*q, &c.quantization));
    }
    c.extra = r.leftovers();
    // A window at least as long as the context is full attention: no position sees more than max_position_embeddings
    // keys. Held at the context so that the KV cache's window rings are sized by what can be visible (a window near
    // 2^31 overflowed their block counts; one past the context asked for more blocks than any sequence can use).
    if (c.max_position_embeddings > 0 && c.sliding_window > c.max_position_embeddings)
        c.sliding_window = c.max_position_embeddings;
    *out = std::move(c);
    return ok_status();
}

json rope_scaling_json(const RopeScaling& s) {
    json j = {{"rope_type", s.rope_type},
              {"factor", s.factor},
              {"beta_fast", s.beta_fast},
              {"beta_slow", s.beta_slow},
              {"original_max_position_embeddings", s.original_max_position_embeddings},
              {"truncate", s.truncate}};
    if (s.attention_factor) j["attention_factor"] = *s.attention_factor;
    if (s.mscale) j["mscale"] = *s.mscale;
    if (s.mscale_all_dim) j["mscale_all_dim"] = *s.mscale_all_dim;
    return j;
}

// Keys of the published config.json that the engine does not use (MODEL.md §1.1).
json published_extras() {
    return {{"architectures", {"GptOssForCausalLM"}},
            {"model_type", "gpt_oss"},
            {"hidden_act", "silu"},
            {"attention_dropout", 0.0},
            {"initial_context_length", 4096},
            {"initializer_range", 0.02},
            {"output_router_logits", false},
            {"router_aux_loss_coef", 0.9},
            {"use_cache", true},
            {"transformers_version", "4.55.0.dev0"}};
}

GptOssConfig published_base() {
    GptOssConfig c;
    c.hidden_size = 2880;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.experts_per_token = 4;
    c.intermediate_size = 2880;
    c.sliding_window = 128;
    c.vocab_size = 201088;
    c.swiglu_limit = 7.0;
    c.swiglu_alpha = 1.702;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 150000.0;
    c.rope_scaling = RopeScaling{};
    c.max_position_embeddings = 131072;
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    c.eos_token_ids = {200002};
    c.pad_token_id = 199999;
    c.quantization =
        QuantizationConfig{"mxfp4",
                           {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"},
                           json::object()};
    c.extra = published_extras();
    return c;
}

}  // namespace

double RopeScaling::concentration() const {
    if (attention_factor) return *attention_factor;
    auto get_mscale = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
    if (mscale && mscale_all_dim && *mscale != 0 && *mscale_all_dim != 0)
        return get_mscale(*mscale) / get_mscale(*mscale_all_dim);
    return get_mscale(1.0);
}

std::string_view layer_type_name(LayerType type) {
    switch (type) {
        case LayerType::kSlidingAttention: return "sliding_attention";
        case LayerType::kFullAttention: return "full_attention";
    }
    return "?";
}

StatusOr<GptOssConfig> GptOssConfig::from_json(const json& j) {
    GptOssConfig c;
    try {
        RETURN_IF_ERROR(parse_config(j, &c));
    } catch (const std::exception& e) {  // nlohmann throws on misuse; nothing may escape
        return internal_error(std::string("config: unexpected error: ") + e.what());
    }
    return c;
}

StatusOr<GptOssConfig> GptOssConfig::from_json_text(std::string_view text) {
    // A real config nests 3 deep; far deeper text would overflow the stack in nlohmann's recursive values.
    if (std::string e = json_shape_error(text, 64, 1 << 16, "config"); !e.empty()) return invalid_argument(e);
    json j;
    try {
        j = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        return invalid_argument(std::string("config is not valid JSON: ") + e.what());
    } catch (const std::exception& e) {
        return invalid_argument(std::string("config could not be parsed: ") + e.what());
    }
    return from_json(j);
}

namespace {

// A config file's text (at most kMaxConfigBytes); nullopt when it cannot be opened.
StatusOr<std::optional<std::string>> read_config_text(const std::string& path) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (std::filesystem::is_directory(st)) return invalid_argument(path + ": is a directory, not a file");
    // A FIFO, socket or device would block the open or the read forever (a FIFO config.json hung the load).
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
        return invalid_argument(path + ": not a regular file");
    if (ec && ec != std::errc::no_such_file_or_directory)  // a link loop, a permission on the way
        return invalid_argument(path + ": " + ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (std::filesystem::exists(st)) return invalid_argument(path + ": cannot be read: " + std::strerror(errno));
        return std::optional<std::string>{};
    }
    std::string text;
    char buf[1 << 16];
    while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
        text.append(buf, static_cast<size_t>(in.gcount()));
        if (text.size() > kMaxConfigBytes) return invalid_argument(path + ": larger than any plausible config");
    }
    return std::optional<std::string>(std::move(text));
}

}  // namespace

StatusOr<GptOssConfig> GptOssConfig::from_file(const std::string& path) {
    ASSIGN_OR_RETURN(std::optional<std::string> text, read_config_text(path));
    if (!text) return not_found(path + ": cannot open config");
    auto c = from_json_text(*text);
    if (!c.ok()) return c.status().with_context(path);
    return c;
}

StatusOr<std::vector<int>> GptOssConfig::generation_eos_ids(const std::string& dir) {
    const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
    ASSIGN_OR_RETURN(std::optional<std::string> text, read_config_text(path));
    if (!text) return std::vector<int>{};
    if (std::string e = json_shape_error(*text, 64, 1 << 16, path); !e.empty()) return invalid_argument(e);
    json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument(path + ": not valid JSON");
    if (!j.is_object()) return invalid_argument(path + ": not a JSON object");
    std::vector<int> ids;
    auto eos = j.find("eos_token_id");
    if (eos == j.end() || eos->is_null()) return ids;
    const json list = eos->is_array() ? *eos : json::array({*eos});
    for (size_t i = 0; i < list.size(); ++i) {
        int id = 0;
        Status st = get_int("eos_token_id[" + std::to_string(i) + "]", list[i], &id);
        if (!st.ok()) return st.with_context(path);
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    return ids;
}

StatusOr<GptOssConfig> GptOssConfig::preset(std::string_view name) {
    GptOssConfig c = published_base();
    if (name == "gpt-oss-20b") {
        c.num_hidden_layers = 24;
        c.num_experts = 32;
    } else if (name == "gpt-oss-120b") {
        c.num_hidden_layers = 36;
        c.num_experts = 128;
    } else if (name == "tiny") {
        // Small synthetic model for demos and tests: same structure (8:1 GQA, head_dim 64, top-4,
        // MXFP4 experts, YaRN), full vocabulary so the real tokenizer works.
        c.hidden_size = 256;
        c.num_hidden_layers = 4;
        c.num_attention_heads = 8;
        c.num_key_value_heads = 1;
        c.num_experts = 8;
        c.intermediate_size = 256;
        c.sliding_window = 32;
    } else {
        return invalid_argument("unknown model preset '" + std::string(name) +
                                "' (expected gpt-oss-20b, gpt-oss-120b or tiny)");
    }
    c.layer_types = alternating_layers(c.num_hidden_layers);
    return c;
}

json GptOssConfig::to_hf_json() const {
    json j = extra.is_object() ? extra : json::object();
    j["hidden_size"] = hidden_size;
    j["num_hidden_layers"] = num_hidden_layers;
    j["num_attention_heads"] = num_attention_heads;
    j["num_key_value_heads"] = num_key_value_heads;
    j["head_dim"] = head_dim;
    j["num_local_experts"] = num_experts;
    j["num_experts_per_tok"] = experts_per_token;
    j["experts_per_token"] = experts_per_token;  // leftover key the published files also carry
    j["intermediate_size"] = intermediate_size;
    j["sliding_window"] = sliding_window;
    j["vocab_size"] = vocab_size;
    j["swiglu_limit"] = swiglu_limit;
    if (swiglu_alpha != 1.702) j["swiglu_alpha"] = swiglu_alpha;  // the published files omit it
    j["rms_norm_eps"] = rms_norm_eps;
    j["rope_theta"] = rope_theta;
    // Explicit null for "no scaling": an absent key means HF's default YaRN block.
    // Plain RoPE as its own block: null (or no block) is transformers' default YaRN block.
    j["rope_scaling"] = rope_scaling ? rope_scaling_json(*rope_scaling) : json{{"rope_type", "default"}};
    j["max_position_embeddings"] = max_position_embeddings;
    j["attention_bias"] = attention_bias;
    j["tie_word_embeddings"] = tie_word_embeddings;
    json lt = json::array();
    for (LayerType t : layer_types) lt.push_back(layer_type_name(t));
    j["layer_types"] = lt;
    if (eos_token_ids.size() == 1) {
        j["eos_token_id"] = eos_token_ids[0];
    } else if (!eos_token_ids.empty()) {
        j["eos_token_id"] = eos_token_ids;
    }
    if (pad_token_id) j["pad_token_id"] = *pad_token_id;
    if (bos_token_id) j["bos_token_id"] = *bos_token_id;
    if (quantization) {
        json q = quantization->extra.is_object() ? quantization->extra : json::object();
        q["quant_method"] = quantization->quant_method;
        q["modules_to_not_convert"] = quantization->modules_to_not_convert;
        j["quantization_config"] = q;
    }
    return j;
}

Status GptOssConfig::validate() const {
    const std::pair<const char*, int> sizes[] = {
        {"hidden_size", hidden_size},
        {"num_hidden_layers", num_hidden_layers},
        {"num_attention_heads", num_attention_heads},
        {"num_key_value_heads", num_key_value_heads},
        {"head_dim", head_dim},
        {"num_experts", num_experts},
        {"experts_per_token", experts_per_token},
        {"intermediate_size", intermediate_size},
        {"vocab_size", vocab_size},
        {"max_position_embeddings", max_position_embeddings},
    };
    for (const auto& [name, v] : sizes) {
        if (v <= 0) return invalid_argument(std::string(name) + " (" + std::to_string(v) + ") must be positive");
        if (v > kMaxSize) {
            return invalid_argument(std::string(name) + " (" + std::to_string(v) + ") is larger than " +
                                    std::to_string(kMaxSize));
        }
    }
    auto num = [](double v) {
        std::ostringstream s;
        s << v;
        return s.str();
    };
    if (num_attention_heads % num_key_value_heads != 0) {
        return invalid_argument("num_attention_heads (" + std::to_string(num_attention_heads) +
                                ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) +
                                ")");
    }
    if (static_cast<int64_t>(num_attention_heads) * head_dim > kMaxSize) {
        return invalid_argument("num_attention_heads × head_dim (" +
                                std::to_string(static_cast<int64_t>(num_attention_heads) * head_dim) +
                                ") is larger than " + std::to_string(kMaxSize));
    }
    if (head_dim % 2 != 0) {
        return invalid_argument("head_dim (" + std::to_string(head_dim) + ") must be even (RoPE rotates pairs)");
    }
    if (experts_per_token > num_experts) {
        return invalid_argument("experts_per_token (" + std::to_string(experts_per_token) +
                                ") must be at most num_experts (" + std::to_string(num_experts) + ")");
    }
    if (sliding_window < 1) {
        return invalid_argument("sliding_window (" + std::to_string(sliding_window) + ") must be at least 1");
    }
    if (layer_types.size() != static_cast<size_t>(num_hidden_layers)) {
        return invalid_argument("layer_types has " + std::to_string(layer_types.size()) +
                                " entries but num_hidden_layers is " + std::to_string(num_hidden_layers));
    }
    if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0)) {
        return invalid_argument("rms_norm_eps (" + num(rms_norm_eps) + ") must be positive");
    }
    if (!(std::isfinite(rope_theta) && rope_theta > 0)) {
        return invalid_argument("rope_theta (" + num(rope_theta) + ") must be positive");
    }
    if (rope_scaling && !(rope_theta > 1)) {  // YaRN's correction range divides by ln(rope_theta)
        return invalid_argument("rope_theta (" + num(rope_theta) + ") must be greater than 1 with YaRN rope_scaling");
    }
    if (!(std::isfinite(swiglu_limit) && swiglu_limit > 0)) {
        return invalid_argument("swiglu_limit (" + num(swiglu_limit) + ") must be positive");
    }
    if (!(std::isfinite(swiglu_alpha) && swiglu_alpha > 0)) {
        return invalid_argument("swiglu_alpha (" + num(swiglu_alpha) + ") must be positive");
    }
    if (rope_scaling) {
        const RopeScaling& s = *rope_scaling;
        if (s.rope_type != "yarn" && s.rope_type != "linear") {
            return invalid_argument("rope_scaling.rope_type '" + s.rope_type +
                                    "' is not supported (\"yarn\", \"linear\" or \"default\")");
        }
        if (!(std::isfinite(s.factor) && s.factor >= 1)) {
            return invalid_argument("rope_scaling.factor (" + num(s.factor) + ") must be at least 1");
        }
        if (!(std::isfinite(s.beta_fast) && std::isfinite(s.beta_slow) && s.beta_slow > 0 &&
              s.beta_fast > s.beta_slow)) {
            return invalid_argument("rope_scaling.beta_fast (" + num(s.beta_fast) +
                                    ") must be greater than beta_slow (" + num(s.beta_slow) + ") > 0");
        }
        for (const auto& [k, x] : {std::pair{"attention_factor", s.attention_factor}, std::pair{"mscale", s.mscale},
                                   std::pair{"mscale_all_dim", s.mscale_all_dim}}) {
            if (x && !std::isfinite(*x)) return invalid_argument("rope_scaling." + std::string(k) + " must be finite");
        }
        if (const double m = s.concentration(); !(std::isfinite(m) && m > 0)) {
            return invalid_argument("rope_scaling: the attention factor (" + num(m) +
                                    ") from attention_factor / mscale / mscale_all_dim must be positive");
        }
        if (s.original_max_position_embeddings <= 0) {
            return invalid_argument("rope_scaling.original_max_position_embeddings (" +
                                    std::to_string(s.original_max_position_embeddings) + ") must be positive");
        }
    }
    auto check_token = [&](const char* what, int id) -> Status {
        if (id < 0 || id >= vocab_size) {
            return invalid_argument(std::string(what) + " (" + std::to_string(id) + ") is outside the vocabulary [0, " +
                                    std::to_string(vocab_size) + ")");
        }
        return ok_status();
    };
    for (int id : eos_token_ids) RETURN_IF_ERROR(check_token("eos_token_id", id));
    if (pad_token_id) RETURN_IF_ERROR(check_token("pad_token_id", *pad_token_id));
    if (bos_token_id) RETURN_IF_ERROR(check_token("bos_token_id", *bos_token_id));
    if (quantization && quantization->quant_method.empty()) {
        return invalid_argument("quantization_config.quant_method is empty");
    }
    // Another quantization or model family would be read as gpt-oss's tensors (an AWQ or a llama config over
    // gpt-oss tensors loaded silently): refused by name.
    if (quantization && quantization->quant_method != "mxfp4" && quantization->quant_method != kFp8QuantMethod) {
        return invalid_argument("quantization_config.quant_method '" + quantization->quant_method +
                                "' is not supported (\"mxfp4\", as published, or \"" + kFp8QuantMethod +
                                "\" from gptoss convert)");
    }
    if (auto mt = extra.find("model_type"); mt != extra.end() && !mt->is_null() && *mt != "gpt_oss") {
        return invalid_argument("model_type " + mt->dump() + " is not gpt-oss's (\"gpt_oss\")");
    }
    return ok_status();
}

}  // namespace gptoss::model
