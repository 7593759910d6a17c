#include "model/random_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "core/hash.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "model/safetensors_file.h"

namespace gptoss::model {
namespace {

uint64_t hash_name(const std::string& s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

// Counter-based normal deviates: element i of a tensor depends only on (seed, name, i).
float normal_at(uint64_t key, uint64_t i) {
    uint64_t r = splitmix64(key ^ splitmix64(i));
    double u1 = (static_cast<double>(r >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(splitmix64(r) >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

// bf16 tensor with values offset + scale·N(0,1).
SafetensorsWriter::FillFn bf16_fill(uint64_t key, int64_t n, float offset, float scale) {
    return [=](uint8_t* dst) {
        auto* out = reinterpret_cast<uint16_t*>(dst);
        ThreadPool::global().parallel_for(
            n,
            [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(offset + scale * normal_at(key, i));
            },
            1 << 16);
    };
}

// Uniformly random e2m1 codes (both nibbles of every byte).
SafetensorsWriter::FillFn code_fill(uint64_t key, int64_t n) {
    return [=](uint8_t* dst) {
        ThreadPool::global().parallel_for((n + 7) / 8,
                                          [&](int64_t b, int64_t e) {
                                              for (int64_t w = b; w < e; ++w) {
                                                  uint64_t r = splitmix64(key ^ splitmix64(w));
                                                  for (int j = 0; j < 8 && w * 8 + j < n; ++j)
                                                      dst[w * 8 + j] = static_cast<uint8_t>(r >> (8 * j));
                                              }
                                          },
                                          1 << 14);
    };
}

// E8M0 scales around 2^center_exp (±1), so weights have std ≈ 1/√fan_in.
SafetensorsWriter::FillFn scale_fill(uint64_t key, int64_t n, int center_exp) {
    return [=](uint8_t* dst) {
        ThreadPool::global().parallel_for(
            n,
            [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) {
                    int jitter = static_cast<int>(splitmix64(key ^ splitmix64(i)) % 3) - 1;
                    dst[i] = static_cast<uint8_t>(127 + center_exp + jitter);
                }
            },
            1 << 16);
    };
}

// The experts_per_token distinct experts that token t prefers (the conditioned init's S(t)).
void preferred_experts(uint64_t key, int64_t t, int num_experts, int k, int64_t* out) {
    uint64_t r = splitmix64(key ^ splitmix64(static_cast<uint64_t>(t)));
    for (int j = 0; j < k; ++j) {
        bool dup = true;
        while (dup) {
            r = splitmix64(r);
            out[j] = static_cast<int64_t>(r % static_cast<uint64_t>(num_experts));
            dup = false;
            for (int i = 0; i < j; ++i) dup |= out[i] == out[j];
        }
    }
}

// Random e2m1 codes have RMS √(68.5/8) ≈ 2.93; choose 2^e ≈ 1/(2.93·√fan_in).
int mxfp4_scale_exp(int64_t fan_in) {
    return static_cast<int>(std::lround(std::log2(1.0 / (2.93 * std::sqrt(static_cast<double>(fan_in))))));
}

}  // namespace

Status write_random_checkpoint(const GptOssConfig& c, const std::string& dir, const RandomCheckpointOptions& opt) {
    RETURN_IF_ERROR(c.validate());
    if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0)  // the experts are written as MXFP4
        return invalid_argument("random checkpoints have MXFP4 experts: hidden_size (" + std::to_string(c.hidden_size) +
                                ") and intermediate_size (" + std::to_string(c.intermediate_size) +
                                ") must be multiples of 32 (the MXFP4 group size)");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return invalid_argument("cannot create directory " + dir + ": " + ec.message());

    const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, V = c.vocab_size;
    const int64_t qw = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
    const int64_t kvw = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
    SafetensorsWriter wr;
    // Progress is counted as tensors are generated (each fill runs once, during write()).
    auto progress = std::make_shared<std::unique_ptr<Progress>>();
    auto add = [&](const std::string& name, DType dtype, Shape shape, SafetensorsWriter::FillFn fill) {
        const uint64_t bytes = static_cast<uint64_t>(shape.numel()) * dtype_size(dtype);
        wr.add_lazy(name, dtype, shape, [fill = std::move(fill), progress, bytes](uint8_t* dst) {
            fill(dst);
            if (*progress) (*progress)->advance(bytes);
        });
    };
    auto key = [&](const std::string& name) { return splitmix64(opt.seed) ^ hash_name(name); };
    auto bf16 = [&](const std::string& name, Shape shape, float offset, float scale) {
        add(name, DType::kBF16, shape, bf16_fill(key(name), shape.numel(), offset, scale));
    };
    auto weight = [&](const std::string& name, int64_t out, int64_t in, float gain = 1.0f) {
        bf16(name, Shape{out, in}, 0.0f, gain / std::sqrt(static_cast<float>(in)));
    };
    // The matrices that write into the residual stream (o_proj, down_proj) get a 1/√(2·layers)
    // gain, as in GPT-2's initialisation: a deep random network then stays well-conditioned (the
    // residual stream does not blow up and small numeric differences are not amplified layer after
    // layer), as a trained one is.
    const float branch_gain = 1.0f / std::sqrt(2.0f * static_cast<float>(c.num_hidden_layers));
    const bool conditioned = opt.init == RandomInit::kConditioned;
    // Conditioned init (see the header for the reasons and bench/NOTES.md for the measurements).
    const float embed_affinity = conditioned ? 0.5f : 0.0f;    // a: e_t = N + a·Σ_{e∈S(t)} d_e
    const float router_affinity = conditioned ? 16.0f : 0.0f;  // ρ: router row = (N + ρ/√H·d_e)/√H
    const float lm_head_scale = conditioned ? 2.0f : 1.0f;     // s: logit noise std ≈ s
    const float lm_head_peak = conditioned ? 12.0f : 0.0f;     // κ: peak ≈ κ·cos(e_src, h)·s
    const int gate_up_exp = conditioned ? 1 : 0;               // gate_up gain 2^1: the clamp is reached
    const int down_exp = conditioned ? -2 : 0;                 // down_proj 2^-2: same expert output size
    const int K = std::min(c.experts_per_token, c.num_experts);
    const uint64_t dir_key = key("gptoss.router_directions");  // d_e, [E, H], shared by all layers
    const uint64_t embed_key = key("model.embed_tokens.weight");
    const uint64_t pref_key = key("gptoss.preferred_experts");
    const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));

    if (!conditioned) {
        bf16("model.embed_tokens.weight", Shape{V, H}, 0.0f, 1.0f);
    } else {
        add("model.embed_tokens.weight", DType::kBF16, Shape{V, H}, [=](uint8_t* dst) {
            auto* out = reinterpret_cast<uint16_t*>(dst);
            ThreadPool::global().parallel_for(
                V,
                [&](int64_t b, int64_t e) {
                    std::vector<int64_t> pref(K);
                    for (int64_t t = b; t < e; ++t) {
                        preferred_experts(pref_key, t, static_cast<int>(E), K, pref.data());
                        for (int64_t i = 0; i < H; ++i) {
                            float v = normal_at(embed_key, t * H + i);
                            for (int j = 0; j < K; ++j) v += embed_affinity * normal_at(dir_key, pref[j] * H + i);
                            out[t * H + i] = f32_to_bf16(v);
                        }
                    }
                },
                64);
        });
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        bf16(p + "input_layernorm.weight", Shape{H}, 1.0f, 0.2f);
        weight(p + "self_attn.q_proj.weight", qw, H);
        bf16(p + "self_attn.q_proj.bias", Shape{qw}, 0.0f, 0.1f);
        weight(p + "self_attn.k_proj.weight", kvw, H);
        bf16(p + "self_attn.k_proj.bias", Shape{kvw}, 0.0f, 0.1f);
        weight(p + "self_attn.v_proj.weight", kvw, H);
        bf16(p + "self_attn.v_proj.bias", Shape{kvw}, 0.0f, 0.1f);
        weight(p + "self_attn.o_proj.weight", H, qw, branch_gain);
        bf16(p + "self_attn.o_proj.bias", Shape{H}, 0.0f, 0.1f);
        bf16(p + "self_attn.sinks", Shape{c.num_attention_heads}, 0.0f, 1.0f);
        bf16(p + "post_attention_layernorm.weight", Shape{H}, 1.0f, 0.2f);
        if (!conditioned) {
            weight(p + "mlp.router.weight", E, H);
        } else {
            const uint64_t rk = key(p + "mlp.router.weight");
            add(p + "mlp.router.weight", DType::kBF16, Shape{E, H}, [=](uint8_t* dst) {
                auto* out = reinterpret_cast<uint16_t*>(dst);
                for (int64_t i = 0; i < E * H; ++i) {
                    const float v = normal_at(rk, i) + router_affinity * inv_sqrt_h * normal_at(dir_key, i);
                    out[i] = f32_to_bf16(inv_sqrt_h * v);
                }
            });
        }
        bf16(p + "mlp.router.bias", Shape{E}, 0.0f, 0.1f);
        const std::string x = p + "mlp.experts.";
        add(x + "gate_up_proj_blocks", DType::kU8, Shape{E, 2 * I, H / 32, 16},
            code_fill(key(x + "gate_up_proj_blocks"), E * 2 * I * H / 2));
        add(x + "gate_up_proj_scales", DType::kU8, Shape{E, 2 * I, H / 32},
            scale_fill(key(x + "gate_up_proj_scales"), E * 2 * I * H / 32, mxfp4_scale_exp(H) + gate_up_exp));
        bf16(x + "gate_up_proj_bias", Shape{E, 2 * I}, 0.0f, 0.1f);
        add(x + "down_proj_blocks", DType::kU8, Shape{E, H, I / 32, 16},
            code_fill(key(x + "down_proj_blocks"), E * H * I / 2));
        add(x + "down_proj_scales", DType::kU8, Shape{E, H, I / 32},
            scale_fill(key(x + "down_proj_scales"), E * H * I / 32,
                       mxfp4_scale_exp(I) + static_cast<int>(std::lround(std::log2(branch_gain))) + down_exp));
        bf16(x + "down_proj_bias", Shape{E, H}, 0.0f, 0.1f);
    }
    bf16("model.norm.weight", Shape{H}, 1.0f, 0.2f);
    if (!conditioned) {
        weight("lm_head.weight", V, H);
    } else {
        // Row v = s·(N/√H + κ·n_{src(v)}/H), n_t the N(0,1) part of token t's embedding: the logit of
        // v is then ≈ s·κ·cos(n_src(v), h) above noise of std ≈ s when the current token is src(v).
        auto src = std::make_shared<std::vector<int32_t>>(V);
        std::iota(src->begin(), src->end(), 0);
        uint64_t r = key("gptoss.next_token_permutation");
        for (int64_t i = V - 1; i > 0; --i) {  // Fisher-Yates
            r = splitmix64(r);
            std::swap((*src)[i], (*src)[static_cast<int64_t>(r % static_cast<uint64_t>(i + 1))]);
        }
        const uint64_t lk = key("lm_head.weight");
        add("lm_head.weight", DType::kBF16, Shape{V, H}, [=](uint8_t* dst) {
            auto* out = reinterpret_cast<uint16_t*>(dst);
            ThreadPool::global().parallel_for(
                V,
                [&](int64_t b, int64_t e) {
                    for (int64_t v = b; v < e; ++v) {
                        const int64_t t = (*src)[v];
                        for (int64_t i = 0; i < H; ++i) {
                            const float noise = normal_at(lk, v * H + i) * inv_sqrt_h;
                            const float peak = lm_head_peak * normal_at(embed_key, t * H + i) * inv_sqrt_h * inv_sqrt_h;
                            out[v * H + i] = f32_to_bf16(lm_head_scale * (noise + peak));
                        }
                    }
                },
                64);
        });
    }

    {
        std::ofstream f(dir + "/config.json");
        f << c.to_hf_json().dump(2) << "\n";
        if (!f) return invalid_argument("cannot write " + dir + "/config.json");
    }
    *progress = std::make_unique<Progress>("writing " + dir, wr.total_bytes());
    Status st = wr.write(dir, {{"format", "pt"}, {"gptoss_init", conditioned ? "conditioned-v1" : "plain"}},
                         opt.max_shard_bytes);
    progress->reset();
    return st;
}

}  // namespace gptoss::model
