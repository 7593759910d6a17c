#include "model/fp8_convert.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/dtype.h"
#include "core/progress.h"
#include "kernels/cpu/cpu_common.h"
#include "model/gpt_oss_weights.h"
#include "model/safetensors_file.h"

namespace gptoss::model {

float fp8_block_scale(float amax) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
    // The smallest scale: 1 / s stays finite (a subnormal s made it inf, and 0 · inf NaN).
    if (amax <= 448.0f * kFp8MinScale) return kFp8MinScale;
    int e = 0;
    std::frexp(amax / 448.0f, &e);               // amax / 448 = m · 2^e, m in [0.5, 1)
    float s = std::ldexp(1.0f, e);               // ≥ amax / 448
    if (amax / (s * 0.5f) <= 448.0f) s *= 0.5f;  // exact powers of two
    return s;
}

void quantize_fp8_blocks(const float* w, int rows, int cols, uint8_t* q, float* scales) {
    const int br = (rows + kFp8Block - 1) / kFp8Block, bc = (cols + kFp8Block - 1) / kFp8Block;
    for (int i = 0; i < br; ++i) {
        const int r0 = i * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
        for (int j = 0; j < bc; ++j) {
            const int c0 = j * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
            float amax = 0.0f;
            for (int r = r0; r < r1; ++r)
                for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * cols + c]));
            const float s = fp8_block_scale(amax);
            scales[static_cast<size_t>(i) * bc + j] = s;
            const float inv = 1.0f / s;  // exact: s is a power of two
            for (int r = r0; r < r1; ++r)
                for (int c = c0; c < c1; ++c) {
                    const size_t k = static_cast<size_t>(r) * cols + c;
                    q[k] = f32_to_fp8e4m3(w[k] * inv);
                }
        }
    }
}

namespace {

bool is_expert_weight(const std::string& name) {
    const auto ends = [&](const char* s) {
        const std::string t(s);
        return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    return name.find(".mlp.experts.") != std::string::npos &&
           (ends("gate_up_proj_blocks") || ends("gate_up_proj_scales") || ends("down_proj_blocks") ||
            ends("down_proj_scales") || ends("experts.gate_up_proj") || ends("experts.down_proj"));
}

// The dense weights `--dense` converts: attention projections and an untied lm_head (the router,
// tiny, and the embedding, a row gather, stay as they are).
bool is_dense_target(const std::string& name) {
    const auto ends = [&](const char* s) {
        const std::string t(s);
        return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    return name == "lm_head.weight" ||
           (name.find(".self_attn.") != std::string::npos &&
            (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight") || ends("o_proj.weight")));
}

// Row r of expert e's matrix (gate_up when `gate_up`), fp32, from either source layout.
void expert_row(const LayerWeights& L, const GptOssConfig& c, bool gate_up, int e, int r, float* out) {
    const int H = c.hidden_size, I = c.intermediate_size;
    const int in = gate_up ? H : I, rows = gate_up ? 2 * I : H;
    const size_t row = static_cast<size_t>(e) * rows + r;
    if (L.expert_format == kernels::ExpertFormat::kMxfp4) {
        const int g = in / 32;
        const uint8_t* blocks = gate_up ? L.gate_up_blocks : L.down_blocks;
        const uint8_t* scales = gate_up ? L.gate_up_scales : L.down_scales;
        kernels::cpu::mxfp4_row_to_f32(blocks + row * g * 16, scales + row * g, in, out);
    } else {
        const void* w = gate_up ? L.gate_up_dense : L.down_dense;
        kernels::cpu::row_to_f32(static_cast<const uint8_t*>(w) + row * in * dtype_size(L.dense_dtype), L.dense_dtype,
                                 in, out);
    }
}

}  // namespace

Status convert_to_fp8(const std::string& in_dir, const std::string& out_dir, bool dense) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::equivalent(in_dir, out_dir, ec)) return invalid_argument("--out must differ from --model");
    ASSIGN_OR_RETURN(std::unique_ptr<GptOssWeights> w, GptOssWeights::load(in_dir));
    const GptOssConfig& c = w->config;
    if (w->layers.empty() || w->layers[0].expert_format == kernels::ExpertFormat::kFp8Block) {
        return invalid_argument(in_dir + " already holds FP8 experts");
    }
    const int H = c.hidden_size, I = c.intermediate_size, E = c.num_experts;
    SafetensorsWriter writer;
    const auto blocks = [](int n) { return static_cast<int64_t>((n + kFp8Block - 1) / kFp8Block); };
    // Everything but the expert weights (and, with `dense`, the attention and lm_head weights),
    // byte for byte.
    // Tensors the model does not read (a config with fewer layers than the file, extra tensors) are copied as
    // they are, experts included: the output holds what the input held, converted where the model reads it.
    const std::set<std::string> unread(w->unused_tensors.begin(), w->unused_tensors.end());
    for (const std::string& name : w->checkpoint->names()) {
        if (is_expert_weight(name) && !unread.contains(name)) continue;
        const TensorInfo* t = w->checkpoint->find(name);
        if (dense && is_dense_target(name) && !unread.contains(name)) {
            if (t->shape.rank != 2 || (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32))
                return invalid_argument(name + ": expected a 2-D float tensor");
            const int rows = static_cast<int>(t->shape[0]), cols = static_cast<int>(t->shape[1]);
            auto cache = std::make_shared<std::pair<std::vector<uint8_t>, std::vector<float>>>();
            auto produce = [=]() {
                if (!cache->first.empty()) return;
                std::vector<float> m(static_cast<size_t>(rows) * cols);
                for (int r = 0; r < rows; ++r)
                    kernels::cpu::row_to_f32(t->data + static_cast<size_t>(r) * cols * dtype_size(t->dtype), t->dtype,
                                             cols, m.data() + static_cast<size_t>(r) * cols);
                cache->first.resize(m.size());
                cache->second.resize(static_cast<size_t>(blocks(rows) * blocks(cols)));
                quantize_fp8_blocks(m.data(), rows, cols, cache->first.data(), cache->second.data());
            };
            writer.add_lazy(name + "_fp8", DType::kFP8E4M3, Shape{rows, cols}, [=](uint8_t* dst) {
                produce();
                std::memcpy(dst, cache->first.data(), cache->first.size());
            });
            writer.add_lazy(name + "_fp8_scale", DType::kF32, Shape{blocks(rows), blocks(cols)}, [=](uint8_t* dst) {
                produce();
                std::memcpy(dst, cache->second.data(), cache->second.size() * 4);
                std::vector<uint8_t>().swap(cache->first);
                std::vector<float>().swap(cache->second);
            });
            continue;
        }
        writer.add_copy(*t);
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const LayerWeights* L = &w->layers[l];
        const std::string x = "model.layers." + std::to_string(l) + ".mlp.experts.";
        for (const bool gate_up : {true, false}) {
            const int rows = gate_up ? 2 * I : H, cols = gate_up ? H : I;
            const std::string base = x + (gate_up ? "gate_up_proj_fp8" : "down_proj_fp8");
            // The quantized bytes and scales of one matrix are produced together; the writer asks
            // for them as two tensors, so the second fill reuses the first's work.
            auto cache = std::make_shared<std::pair<std::vector<uint8_t>, std::vector<float>>>();
            auto produce = [=, &c]() {
                if (!cache->first.empty()) return;
                cache->first.resize(static_cast<size_t>(E) * rows * cols);
                cache->second.resize(static_cast<size_t>(E) * blocks(rows) * blocks(cols));
                std::vector<float> m(static_cast<size_t>(rows) * cols);
                for (int e = 0; e < E; ++e) {
                    for (int r = 0; r < rows; ++r)
                        expert_row(*L, c, gate_up, e, r, m.data() + static_cast<size_t>(r) * cols);
                    quantize_fp8_blocks(m.data(), rows, cols,
                                        cache->first.data() + static_cast<size_t>(e) * rows * cols,
                                        cache->second.data() + static_cast<size_t>(e) * blocks(rows) * blocks(cols));
                }
            };
            writer.add_lazy(base, DType::kFP8E4M3, Shape{E, rows, cols}, [=](uint8_t* dst) {
                produce();
                std::memcpy(dst, cache->first.data(), cache->first.size());
            });
            writer.add_lazy(base + "_scale", DType::kF32, Shape{E, blocks(rows), blocks(cols)}, [=](uint8_t* dst) {
                produce();
                std::memcpy(dst, cache->second.data(), cache->second.size() * 4);
                std::vector<uint8_t>().swap(cache->first);  // both tensors written: free the matrix
                cache->first.clear();
                cache->second.clear();
                cache->second.shrink_to_fit();
            });
        }
    }
    fs::create_directories(out_dir, ec);
    if (ec) return invalid_argument("cannot create " + out_dir + ": " + ec.message());
    RETURN_IF_ERROR(
        writer.write(out_dir, {{"format", "pt"}, {"gptoss_weight_format", "fp8-block128-v1"}}, uint64_t{5} << 30));
    // config.json (and the other small files) with the new quantization_config.
    GptOssConfig out = c;
    QuantizationConfig q;
    q.quant_method = kFp8QuantMethod;
    if (dense) {
        q.modules_to_not_convert = {"model.layers.*.mlp.router", "model.embed_tokens"};
    } else {
        q.modules_to_not_convert =
            c.quantization ? c.quantization->modules_to_not_convert
                           : std::vector<std::string>{"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                      "model.embed_tokens", "lm_head"};
    }
    q.extra = {
        {"format_version", kFp8FormatVersion}, {"weight_block_size", {kFp8Block, kFp8Block}}, {"dense_fp8", dense}};
    out.quantization = q;
    // The small files replace what --out held (a symbolic link there is replaced, not written through: it wrote
    // the new config.json into the linked checkpoint).
    const fs::path config_path = fs::path(out_dir) / "config.json";
    fs::remove(config_path, ec);
    std::ofstream config(config_path);
    config << out.to_hf_json().dump(2) << "\n";
    config.close();
    if (!config) return invalid_argument("cannot write " + config_path.string());
    for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
        if (fs::exists(fs::path(in_dir) / f)) {
            fs::remove(fs::path(out_dir) / f, ec);
            fs::copy_file(fs::path(in_dir) / f, fs::path(out_dir) / f, fs::copy_options::overwrite_existing, ec);
        }
    }
    return ok_status();
}

}  // namespace gptoss::model
