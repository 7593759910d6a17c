#include "model/synthetic_weights.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/hash.h"
#include "core/thread_pool.h"

namespace gptoss::model {
namespace {

// Uniform in [-1, 1) from a counter: thread-count independent.
float uniform(uint64_t seed, uint64_t i) {
    return static_cast<float>(static_cast<double>(splitmix64(seed ^ (i * 0x9e3779b97f4a7c15ull)) >> 11) * 0x1p-52 -
                              1.0);
}

class Builder {
public:
    Builder(GptOssWeights& w, uint64_t seed) : w_(w), seed_(seed) {}

    // bf16 [rows, cols] with values uniform in ±scale.
    DenseWeight dense(int64_t rows, int64_t cols, float scale) {
        std::vector<uint8_t> buf(static_cast<size_t>(rows * cols) * 2);
        auto* p = reinterpret_cast<uint16_t*>(buf.data());
        const uint64_t s = next();
        ThreadPool::global().parallel_for(
            rows * cols,
            [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) p[i] = f32_to_bf16(scale * uniform(s, static_cast<uint64_t>(i)));
            },
            1 << 16);
        w_.owned.push_back(std::move(buf));
        return DenseWeight{w_.owned.back().data(), DType::kBF16, static_cast<int>(rows), static_cast<int>(cols)};
    }
    std::vector<float> vec(int64_t n, float center, float scale) {
        std::vector<float> v(static_cast<size_t>(n));
        const uint64_t s = next();
        for (int64_t i = 0; i < n; ++i) v[i] = center + scale * uniform(s, static_cast<uint64_t>(i));
        return v;
    }
    // MXFP4 blocks (random codes) and scales (`scale_byte`: 2^(scale_byte - 127)).
    const uint8_t* bytes(int64_t n, bool random, uint8_t fill) {
        std::vector<uint8_t> buf(static_cast<size_t>(n), fill);
        if (random) {
            const uint64_t s = next();
            ThreadPool::global().parallel_for(
                n / 8,
                [&](int64_t b, int64_t e) {
                    for (int64_t i = b; i < e; ++i) {
                        const uint64_t r = splitmix64(s ^ static_cast<uint64_t>(i));
                        std::memcpy(buf.data() + i * 8, &r, 8);
                    }
                },
                1 << 16);
        }
        w_.owned.push_back(std::move(buf));
        return w_.owned.back().data();
    }

private:
    uint64_t next() { return splitmix64(seed_ + ++counter_); }
    GptOssWeights& w_;
    uint64_t seed_, counter_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<GptOssWeights>> make_synthetic_weights(const GptOssConfig& c, uint64_t seed) {
    RETURN_IF_ERROR(c.validate());
    if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0) {
        return invalid_argument("synthetic MXFP4 experts need hidden and intermediate sizes divisible by 32");
    }
    auto w = std::make_unique<GptOssWeights>();
    w->config = c;
    w->owned.reserve(static_cast<size_t>(c.num_hidden_layers) * 16 + 4);  // pointers stay put anyway
    Builder b(*w, seed);
    const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, V = c.vocab_size;
    const int64_t qw = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
    const int64_t kvw = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
    const float inv_h = 1.0f / std::sqrt(static_cast<float>(H));
    w->embed_tokens = b.dense(V, H, 1.0f);
    w->lm_head = b.dense(V, H, inv_h);
    w->norm = b.vec(H, 1.0f, 0.1f);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        LayerWeights L;
        L.input_layernorm = b.vec(H, 1.0f, 0.1f);
        L.q_proj = b.dense(qw, H, inv_h);
        L.k_proj = b.dense(kvw, H, inv_h);
        L.v_proj = b.dense(kvw, H, inv_h);
        L.o_proj = b.dense(H, qw, 1.0f / std::sqrt(static_cast<float>(qw)));
        L.q_bias = b.vec(qw, 0.0f, 0.05f);
        L.k_bias = b.vec(kvw, 0.0f, 0.05f);
        L.v_bias = b.vec(kvw, 0.0f, 0.05f);
        L.o_bias = b.vec(H, 0.0f, 0.05f);
        L.sinks = b.vec(c.num_attention_heads, 0.0f, 1.0f);
        L.post_attention_layernorm = b.vec(H, 1.0f, 0.1f);
        L.router = b.dense(E, H, inv_h);
        L.router_bias = b.vec(E, 0.0f, 0.05f);
        L.expert_format = kernels::ExpertFormat::kMxfp4;
        // Scale byte 119: codes up to ±6 · 2^-8 ≈ ±0.023, about 1/√2880 in RMS.
        L.gate_up_blocks = b.bytes(E * 2 * I * H / 2, true, 0);
        L.gate_up_scales = b.bytes(E * 2 * I * H / 32, false, 119);
        L.down_blocks = b.bytes(E * H * I / 2, true, 0);
        L.down_scales = b.bytes(E * H * I / 32, false, 119);
        L.gate_up_bias = b.vec(E * 2 * I, 0.0f, 0.05f);
        L.down_bias = b.vec(E * H, 0.0f, 0.05f);
        w->layers.push_back(std::move(L));
    }
    w->shard = WeightShard{0, c.num_attention_heads, 0, c.num_key_value_heads, 0,    c.num_experts,
                           0, c.intermediate_size,   0, c.vocab_size,          true, true};
    return w;
}

uint64_t synthetic_weight_bytes(const GptOssConfig& c) {
    const uint64_t H = static_cast<uint64_t>(c.hidden_size), I = static_cast<uint64_t>(c.intermediate_size);
    const uint64_t E = static_cast<uint64_t>(c.num_experts), V = static_cast<uint64_t>(c.vocab_size);
    const uint64_t qw = static_cast<uint64_t>(c.num_attention_heads) * static_cast<uint64_t>(c.head_dim);
    const uint64_t kvw = static_cast<uint64_t>(c.num_key_value_heads) * static_cast<uint64_t>(c.head_dim);
    const uint64_t dense = 2 * (2 * V * H) + 4 * H;                   // embedding, lm_head (bf16), final norm (fp32)
    const uint64_t layer = 2 * ((qw + 2 * kvw) * H + H * qw + E * H)  // attention, router (bf16)
                           + 4 * (2 * H + qw + 2 * kvw + H + static_cast<uint64_t>(c.num_attention_heads) + E) +
                           3 * E * I * H / 2 + 3 * E * I * H / 32  // MXFP4 blocks and scales
                           + 4 * (E * 2 * I + E * H);              // expert biases (fp32)
    return dense + static_cast<uint64_t>(c.num_hidden_layers) * layer;
}

}  // namespace gptoss::model
