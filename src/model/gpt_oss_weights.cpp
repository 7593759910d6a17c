#include "model/gpt_oss_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "core/dtype.h"
#include "core/logging.h"
#include "core/progress.h"
#include "kernels/cpu/cpu_common.h"

namespace gptoss::model {
namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};

class Loader {
public:
    Loader(const SafetensorsCheckpoint& ckpt, GptOssWeights& w) : ckpt_(ckpt), w_(w) {}

    Status dense(const std::string& name, int64_t rows, int64_t cols, DenseWeight* out) {
        if (ckpt_.find(name) == nullptr && ckpt_.find(name + "_fp8") != nullptr)
            return dense_fp8(name, rows, cols, out);
        ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.get_any(name, kFloatTypes, Shape{rows, cols}));
        used_.insert(name);
        *out = DenseWeight{t->data, t->dtype, static_cast<int>(rows), static_cast<int>(cols)};
        return ok_status();
    }

    // A dense weight stored as FP8 128×128 blocks (model/fp8_convert.h, --dense): dequantized to an
    // owned bf16 copy (exact: e4m3 times a power of two fits bf16).
    Status dense_fp8(const std::string& name, int64_t rows, int64_t cols, DenseWeight* out) {
        ASSIGN_OR_RETURN(const TensorInfo* q, ckpt_.get(name + "_fp8", DType::kFP8E4M3, Shape{rows, cols}));
        const auto blocks = [](int64_t n) { return (n + 127) / 128; };
        const int64_t bc = blocks(cols);
        ASSIGN_OR_RETURN(const TensorInfo* st, ckpt_.get(name + "_fp8_scale", DType::kF32, Shape{blocks(rows), bc}));
        used_.insert(name + "_fp8");
        used_.insert(name + "_fp8_scale");
        std::vector<uint8_t> buf(static_cast<size_t>(rows * cols) * 2);
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < cols; ++c) {
                float s;
                std::memcpy(&s, st->data + static_cast<size_t>((r / 128) * bc + c / 128) * 4, 4);  // byte-aligned
                const uint16_t b = f32_to_bf16(fp8e4m3_to_f32(q->data[r * cols + c]) * s);
                std::memcpy(buf.data() + static_cast<size_t>(r * cols + c) * 2, &b, 2);
            }
        }
        w_.owned.push_back(std::move(buf));
        *out = DenseWeight{w_.owned.back().data(), DType::kBF16, static_cast<int>(rows), static_cast<int>(cols)};
        return ok_status();
    }

    // Any float tensor of `shape`, converted to fp32.
    Status vec(const std::string& name, const Shape& shape, std::vector<float>* out) {
        ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.get_any(name, kFloatTypes, shape));
        used_.insert(name);
        out->resize(static_cast<size_t>(shape.numel()));
        kernels::cpu::row_to_f32(t->data, t->dtype, static_cast<int>(shape.numel()), out->data());
        return ok_status();
    }

    Status fp8(const std::string& name, int64_t e, int64_t rows, int64_t cols, const uint8_t** q, const float** s) {
        ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.get(name, DType::kFP8E4M3, Shape{e, rows, cols}));
        *q = t->data;
        const auto blocks = [](int64_t n) { return (n + 127) / 128; };
        ASSIGN_OR_RETURN(const TensorInfo* st,
                         ckpt_.get(name + "_scale", DType::kF32, Shape{e, blocks(rows), blocks(cols)}));
        used_.insert(name);
        used_.insert(name + "_scale");
        if (reinterpret_cast<uintptr_t>(st->data) % alignof(float) != 0) {  // safetensors data is only byte-aligned
            std::vector<uint8_t> copy(st->data, st->data + st->nbytes);
            w_.owned.push_back(std::move(copy));
            *s = reinterpret_cast<const float*>(w_.owned.back().data());
        } else {
            *s = reinterpret_cast<const float*>(st->data);
        }
        return ok_status();
    }

    Status u8(const std::string& name, const Shape& shape, const uint8_t** out) {
        ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.get(name, DType::kU8, shape));
        used_.insert(name);
        *out = t->data;
        return ok_status();
    }

    // HF's dequantized layout stores experts as [E, in, out]; the kernels want [E, out, in].
    Status transposed_experts(const std::string& name, int64_t e, int64_t in, int64_t out_f, const void** out,
                              DType* dtype) {
        ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.get_any(name, kFloatTypes, Shape{e, in, out_f}));
        used_.insert(name);
        const size_t es = dtype_size(t->dtype);
        std::vector<uint8_t> buf(t->nbytes);
        for (int64_t x = 0; x < e; ++x) {
            const uint8_t* src = t->data + static_cast<size_t>(x * in * out_f) * es;
            uint8_t* dst = buf.data() + static_cast<size_t>(x * in * out_f) * es;
            for (int64_t i = 0; i < in; ++i)
                for (int64_t o = 0; o < out_f; ++o)
                    std::memcpy(dst + static_cast<size_t>(o * in + i) * es,
                                src + static_cast<size_t>(i * out_f + o) * es, es);
        }
        w_.owned.push_back(std::move(buf));
        *out = w_.owned.back().data();
        *dtype = t->dtype;
        return ok_status();
    }

    // The checkpoint's tensors that no call above read, sorted.
    std::vector<std::string> unused() const {
        std::vector<std::string> out;
        for (const std::string& name : ckpt_.names())
            if (!used_.contains(name)) out.push_back(name);
        return out;
    }

private:
    const SafetensorsCheckpoint& ckpt_;
    GptOssWeights& w_;
    std::set<std::string> used_;
};

}  // namespace

StatusOr<std::unique_ptr<GptOssWeights>> GptOssWeights::load(const std::string& dir) {
    auto w = std::make_unique<GptOssWeights>();
    // The directory itself first: a missing one, or a file given for it (--model DIR/config.json), was reported as
    // a missing or unreadable DIR/config.json.
    {
        std::error_code ec;
        const auto st = std::filesystem::status(dir, ec);
        if (ec && ec != std::errc::no_such_file_or_directory)  // a link loop, a permission on the way
            return invalid_argument("model directory " + dir + ": " + ec.message());
        if (!std::filesystem::exists(st)) return not_found("model directory " + dir + " does not exist");
        if (!std::filesystem::is_directory(st))
            return invalid_argument(dir + " is a file, not a model directory (give the directory holding config.json)");
    }
    ASSIGN_OR_RETURN(w->config, GptOssConfig::from_file(dir + "/config.json"));
    RETURN_IF_ERROR(w->config.validate().with_context(dir + "/config.json"));
    ASSIGN_OR_RETURN(w->checkpoint, SafetensorsCheckpoint::open_dir(dir));
    const GptOssConfig& c = w->config;
    const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, V = c.vocab_size;
    const int64_t qw = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
    const int64_t kvw = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
    Loader ld(*w->checkpoint, *w);

    // OpenAI's own layout (the repositories' original/ directory: embedding.weight, block.N.attn.qkv.weight, ...)
    // is not this loader's: say so rather than name the first Hugging Face tensor it lacks.
    if (w->checkpoint->find("model.embed_tokens.weight") == nullptr &&
        (w->checkpoint->find("embedding.weight") != nullptr ||
         w->checkpoint->find("block.0.attn.qkv.weight") != nullptr))
        return invalid_argument(dir +
                                ": this is OpenAI's original checkpoint layout (embedding.weight, block.N.*), not the "
                                "Hugging Face one this engine loads: point --model at the directory with the Hugging "
                                "Face model.safetensors files and config.json (the parent of original/)");
    // The experts' format, from layer 0's tensors; every layer must have the same.
    auto format_of = [&](int l) {
        const std::string x = "model.layers." + std::to_string(l) + ".mlp.experts.";
        return w->checkpoint->find(x + "gate_up_proj_fp8") != nullptr      ? kernels::ExpertFormat::kFp8Block
               : w->checkpoint->find(x + "gate_up_proj_blocks") != nullptr ? kernels::ExpertFormat::kMxfp4
                                                                           : kernels::ExpertFormat::kDense;
    };
    auto format_name = [](kernels::ExpertFormat f) {
        return f == kernels::ExpertFormat::kFp8Block ? "FP8 (gate_up_proj_fp8)"
               : f == kernels::ExpertFormat::kMxfp4  ? "MXFP4 (gate_up_proj_blocks)"
                                                     : "unquantized (gate_up_proj)";
    };
    const kernels::ExpertFormat format = format_of(0);
    const bool mxfp4 = format == kernels::ExpertFormat::kMxfp4;
    const bool fp8 = format == kernels::ExpertFormat::kFp8Block;
    // MXFP4 packs 32 values a group along each expert matrix's input: hidden_size for gate_up, intermediate_size for
    // down (unquantized and FP8 experts take any sizes).
    if (mxfp4 && (H % 32 != 0 || I % 32 != 0))
        return invalid_argument(dir + ": MXFP4 experts need hidden_size (" + std::to_string(H) +
                                ") and intermediate_size (" + std::to_string(I) +
                                ") to be multiples of 32 (the MXFP4 group size)");

    RETURN_IF_ERROR(ld.dense("model.embed_tokens.weight", V, H, &w->embed_tokens));
    // tie_word_embeddings: the output projection is the embedding, unless the checkpoint holds its own lm_head.weight
    // (or its FP8 form, lm_head.weight_fp8, which `convert --dense` writes for it), which is then used (as
    // transformers' tie_weights and vLLM do; a warning when it differs from the embedding).
    if (w->checkpoint->find("lm_head.weight") != nullptr || w->checkpoint->find("lm_head.weight_fp8") != nullptr ||
        !c.tie_word_embeddings) {
        RETURN_IF_ERROR(ld.dense("lm_head.weight", V, H, &w->lm_head));
        const DenseWeight& e = w->embed_tokens;
        const DenseWeight& o = w->lm_head;
        if (c.tie_word_embeddings &&
            (o.dtype != e.dtype || std::memcmp(o.data, e.data, static_cast<size_t>(V) * H * dtype_size(e.dtype)) != 0))
            LOG_WARN(
                "%s: config.json ties the word embeddings but the checkpoint's lm_head.weight differs from "
                "model.embed_tokens.weight; using lm_head.weight",
                dir.c_str());
    } else {
        w->lm_head = w->embed_tokens;
    }
    RETURN_IF_ERROR(ld.vec("model.norm.weight", Shape{H}, &w->norm));

    // The last layer's first tensor before any per-layer allocation: a num_hidden_layers past the checkpoint's layers
    // (up to 2^24) fails here at once instead of after sizing every layer.
    if (const std::string last = "model.layers." + std::to_string(c.num_hidden_layers - 1) + ".input_layernorm.weight";
        w->checkpoint->find(last) == nullptr)
        return not_found(dir + ": config.json has num_hidden_layers " + std::to_string(c.num_hidden_layers) +
                         " but the checkpoint has no tensor '" + last + "'");
    w->layers.resize(c.num_hidden_layers);
    Progress progress("loading " + dir, static_cast<uint64_t>(c.num_hidden_layers));
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        LayerWeights& L = w->layers[l];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        RETURN_IF_ERROR(ld.vec(p + "input_layernorm.weight", Shape{H}, &L.input_layernorm));
        RETURN_IF_ERROR(ld.dense(p + "self_attn.q_proj.weight", qw, H, &L.q_proj));
        RETURN_IF_ERROR(ld.dense(p + "self_attn.k_proj.weight", kvw, H, &L.k_proj));
        RETURN_IF_ERROR(ld.dense(p + "self_attn.v_proj.weight", kvw, H, &L.v_proj));
        RETURN_IF_ERROR(ld.dense(p + "self_attn.o_proj.weight", H, qw, &L.o_proj));
        if (c.attention_bias) {
            RETURN_IF_ERROR(ld.vec(p + "self_attn.q_proj.bias", Shape{qw}, &L.q_bias));
            RETURN_IF_ERROR(ld.vec(p + "self_attn.k_proj.bias", Shape{kvw}, &L.k_bias));
            RETURN_IF_ERROR(ld.vec(p + "self_attn.v_proj.bias", Shape{kvw}, &L.v_bias));
            RETURN_IF_ERROR(ld.vec(p + "self_attn.o_proj.bias", Shape{H}, &L.o_bias));
        } else {  // transformers' GptOssAttention: nn.Linear(..., bias=config.attention_bias); zeros add nothing
            L.q_bias.assign(static_cast<size_t>(qw), 0.0f);
            L.k_bias.assign(static_cast<size_t>(kvw), 0.0f);
            L.v_bias.assign(static_cast<size_t>(kvw), 0.0f);
            L.o_bias.assign(static_cast<size_t>(H), 0.0f);
        }
        RETURN_IF_ERROR(ld.vec(p + "self_attn.sinks", Shape{c.num_attention_heads}, &L.sinks));
        RETURN_IF_ERROR(ld.vec(p + "post_attention_layernorm.weight", Shape{H}, &L.post_attention_layernorm));
        RETURN_IF_ERROR(ld.dense(p + "mlp.router.weight", E, H, &L.router));
        RETURN_IF_ERROR(ld.vec(p + "mlp.router.bias", Shape{E}, &L.router_bias));
        const std::string x = p + "mlp.experts.";
        if (l > 0 && format_of(l) != format)
            return invalid_argument(dir + ": layer " + std::to_string(l) + "'s experts are " +
                                    format_name(format_of(l)) + " but layer 0's are " + format_name(format) +
                                    " (one format for every layer)");
        if (fp8) {
            L.expert_format = kernels::ExpertFormat::kFp8Block;
            RETURN_IF_ERROR(ld.fp8(x + "gate_up_proj_fp8", E, 2 * I, H, &L.gate_up_fp8, &L.gate_up_fp8_scale));
            RETURN_IF_ERROR(ld.fp8(x + "down_proj_fp8", E, H, I, &L.down_fp8, &L.down_fp8_scale));
        } else if (mxfp4) {
            L.expert_format = kernels::ExpertFormat::kMxfp4;
            RETURN_IF_ERROR(ld.u8(x + "gate_up_proj_blocks", Shape{E, 2 * I, H / 32, 16}, &L.gate_up_blocks));
            RETURN_IF_ERROR(ld.u8(x + "gate_up_proj_scales", Shape{E, 2 * I, H / 32}, &L.gate_up_scales));
            RETURN_IF_ERROR(ld.u8(x + "down_proj_blocks", Shape{E, H, I / 32, 16}, &L.down_blocks));
            RETURN_IF_ERROR(ld.u8(x + "down_proj_scales", Shape{E, H, I / 32}, &L.down_scales));
        } else {
            L.expert_format = kernels::ExpertFormat::kDense;
            DType gu_dtype, down_dtype;
            RETURN_IF_ERROR(ld.transposed_experts(x + "gate_up_proj", E, H, 2 * I, &L.gate_up_dense, &gu_dtype));
            RETURN_IF_ERROR(ld.transposed_experts(x + "down_proj", E, I, H, &L.down_dense, &down_dtype));
            if (gu_dtype != down_dtype) {
                return invalid_argument(x + "gate_up_proj and down_proj have different dtypes (" +
                                        std::string(dtype_name(gu_dtype)) + " vs " +
                                        std::string(dtype_name(down_dtype)) + ")");
            }
            L.dense_dtype = gu_dtype;
        }
        RETURN_IF_ERROR(ld.vec(x + "gate_up_proj_bias", Shape{E, 2 * I}, &L.gate_up_bias));
        RETURN_IF_ERROR(ld.vec(x + "down_proj_bias", Shape{E, H}, &L.down_bias));
        progress.advance(1);
    }
    // Tensors gpt-oss does not read are ignored, as transformers does, with a warning: a checkpoint with more
    // layers than config.json's num_hidden_layers, or another model's tensors, should not load silently.
    w->unused_tensors = ld.unused();
    if (!w->unused_tensors.empty()) {
        std::string some;
        for (size_t i = 0; i < w->unused_tensors.size() && i < 3; ++i) some += (i ? ", " : "") + w->unused_tensors[i];
        LOG_WARN("%s: %zu tensor%s not used by gpt-oss and ignored (%s%s); check config.json against the checkpoint",
                 dir.c_str(), w->unused_tensors.size(), w->unused_tensors.size() == 1 ? " is" : "s are", some.c_str(),
                 w->unused_tensors.size() > 3 ? ", ..." : "");
    }
    w->shard = WeightShard{0, c.num_attention_heads, 0, c.num_key_value_heads, 0,    c.num_experts,
                           0, c.intermediate_size,   0, c.vocab_size,          true, true};
    return w;
}

namespace {

// FNV-1a over 64-bit words (each mixed in whole), enough to tell checkpoints apart (not a cryptographic hash).
struct Fingerprint {
    uint64_t h = 1469598103934665603ull;
    void word(uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    void number(double v) {
        uint64_t b;
        std::memcpy(&b, &v, 8);
        word(b);
    }
    void value(float v) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        word(b);
    }
    void floats(const std::vector<float>& v) {
        word(v.size());
        for (float x : v) value(x);
    }
    void dense(const DenseWeight& d) {
        word((static_cast<uint64_t>(static_cast<uint32_t>(d.rows)) << 32) | static_cast<uint32_t>(d.cols));
        const size_t n = static_cast<size_t>(d.rows) * static_cast<size_t>(std::max(d.cols, 0));
        if (d.data == nullptr || n == 0) return;
        constexpr size_t kSamples = 257;
        for (size_t k = 0; k < kSamples; ++k) {
            const size_t i = n == 1 ? 0 : k * (n - 1) / (kSamples - 1);
            switch (d.dtype) {
                case DType::kBF16: value(bf16_to_f32(static_cast<const uint16_t*>(d.data)[i])); break;
                case DType::kF16: value(f16_to_f32(static_cast<const uint16_t*>(d.data)[i])); break;
                case DType::kF32: value(static_cast<const float*>(d.data)[i]); break;
                default: word(i); break;
            }
        }
    }
};

}  // namespace

uint64_t model_fingerprint(const GptOssWeights& w) {
    Fingerprint f;
    const GptOssConfig& c = w.config;
    for (int v : {c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                  c.num_experts, c.experts_per_token, c.intermediate_size, c.sliding_window, c.vocab_size})
        f.word(static_cast<uint64_t>(static_cast<uint32_t>(v)));
    for (double v : {c.swiglu_limit, c.swiglu_alpha, c.rms_norm_eps, c.rope_theta}) f.number(v);
    f.word(c.attention_bias ? 1 : 0);
    for (LayerType t : c.layer_types) f.word(static_cast<uint64_t>(t) + 7);
    if (c.rope_scaling) {
        const RopeScaling& r = *c.rope_scaling;
        for (char ch : r.rope_type) f.word(static_cast<uint8_t>(ch));
        for (double v : {r.factor, r.beta_fast, r.beta_slow}) f.number(v);
        f.word(static_cast<uint64_t>(r.original_max_position_embeddings) * 2 + (r.truncate ? 1 : 0));
        for (const std::optional<double>& v : {r.attention_factor, r.mscale, r.mscale_all_dim})
            v ? f.number(*v) : f.word(0x6e6f6e65ull);
    }
    f.dense(w.embed_tokens);
    for (const LayerWeights& l : w.layers) {
        f.floats(l.input_layernorm);
        for (const DenseWeight* d : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.router}) f.dense(*d);
        for (const std::vector<float>* v :
             {&l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias, &l.sinks, &l.post_attention_layernorm, &l.router_bias})
            f.floats(*v);
    }
    f.floats(w.norm);
    f.dense(w.lm_head);
    return f.h == 0 ? 1 : f.h;
}

}  // namespace gptoss::model
