// YaRN RoPE + KV-cache write, and causal GQA attention with sinks over a paged KV cache (CPU).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace gptoss::kernels::cpu {

float yarn_inv_freq(const YarnParams& p, int head_dim, float* inv_freq) {
    // Mirrors transformers' _compute_yarn_parameters: frequencies in fp32, correction range in double.
    const int half = head_dim / 2;
    auto correction_dim = [&](double num_rotations) {
        return (head_dim * std::log(p.original_max_position_embeddings / (num_rotations * 2.0 * M_PI))) /
               (2.0 * std::log(static_cast<double>(p.rope_theta)));
    };
    double low = correction_dim(p.beta_fast);
    double high = correction_dim(p.beta_slow);
    if (p.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;  // avoid a zero-width ramp
    for (int i = 0; i < half; ++i) {
        float pos_freq = std::pow(p.rope_theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
        float extrapolation = 1.0f / pos_freq;
        float interpolation = 1.0f / (p.factor * pos_freq);
        // torch's order: (arange(half, f32) - low) / (high - low), each scalar rounded to f32 first.
        float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
        ramp = std::clamp(ramp, 0.0f, 1.0f);
        float extrapolation_factor = 1.0f - ramp;
        inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    if (p.attention_factor > 0.0f) return p.attention_factor;
    return static_cast<float>(0.1 * std::log(static_cast<double>(p.factor)) + 1.0);
}

namespace {

// NeoX / half-split rotation of one head vector: x' = [a·C − b·S, b·C + a·S].
void rotate(float* x, const float* cos_v, const float* sin_v, int half) {
    for (int i = 0; i < half; ++i) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_v[i] - b * sin_v[i];
        x[i + half] = b * cos_v[i] + a * sin_v[i];
    }
}

}  // namespace

void rope_kv_write(const RopeKvWriteArgs& a) {
    const int half = a.head_dim / 2;
    const int kv_row = a.num_kv_heads * a.head_dim;
    std::vector<float> cos_v(half), sin_v(half);
    for (int t = 0; t < a.num_tokens; ++t) {
        const float pos = static_cast<float>(a.positions[t]);
        for (int i = 0; i < half; ++i) {
            // As transformers: angle = position · inv_freq in fp32, then cos/sin times the scaling.
            const float angle = pos * a.inv_freq[i];
            cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * a.attention_scaling;
            sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * a.attention_scaling;
        }
        float* q = a.q + static_cast<size_t>(t) * a.num_heads * a.head_dim;
        for (int h = 0; h < a.num_heads; ++h) rotate(q + h * a.head_dim, cos_v.data(), sin_v.data(), half);
        float* k = a.k + static_cast<size_t>(t) * kv_row;
        for (int h = 0; h < a.num_kv_heads; ++h) rotate(k + h * a.head_dim, cos_v.data(), sin_v.data(), half);
        const int slot = a.slot_mapping[t];
        if (slot < 0) continue;
        const float* v = a.v + static_cast<size_t>(t) * kv_row;
        float* kd = a.k_cache + static_cast<size_t>(slot) * kv_row;
        float* vd = a.v_cache + static_cast<size_t>(slot) * kv_row;
        if (a.round_fp8) {
            for (int i = 0; i < kv_row; ++i) {
                kd[i] = fp8e4m3_to_f32(f32_to_fp8e4m3(k[i]));
                vd[i] = fp8e4m3_to_f32(f32_to_fp8e4m3(v[i]));
            }
        } else {
            std::copy(k, k + kv_row, kd);
            std::copy(v, v + kv_row, vd);
        }
    }
}

void attention(const AttentionArgs& a) {
    const int group = a.num_heads / a.num_kv_heads;
    const int kv_row = a.num_kv_heads * a.head_dim;
    const int hd = a.head_dim;
    // Work items: (sequence token, kv head); each handles the `group` query heads sharing that kv head.
    std::vector<std::pair<int, int>> token_seq;  // flat token -> (seq, index in seq)
    token_seq.reserve(a.num_tokens);
    for (int s = 0; s < a.num_seqs; ++s)
        for (int i = 0; i < a.seqs[s].num_tokens; ++i) token_seq.emplace_back(s, i);
    ThreadPool::global().parallel_for(
        static_cast<int64_t>(token_seq.size()) * a.num_kv_heads, [&](int64_t begin, int64_t end) {
            std::vector<float> scores;
            std::vector<float> acc(hd);
            for (int64_t item = begin; item < end; ++item) {
                const auto [s, i] = token_seq[item / a.num_kv_heads];
                const int g = static_cast<int>(item % a.num_kv_heads);
                const AttentionSeq& seq = a.seqs[s];
                const int t = seq.token_offset + i;
                const int pos = seq.start_pos + i;
                const int lo = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
                const int n_keys = pos - lo + 1;
                scores.resize(n_keys);
                for (int hh = 0; hh < group; ++hh) {
                    const int h = g * group + hh;
                    const float* q = a.q + (static_cast<size_t>(t) * a.num_heads + h) * hd;
                    float m = a.sinks[h];  // the running max starts at the sink (MODEL.md §4.4)
                    for (int j = lo; j <= pos; ++j) {
                        const int block = seq.block_table[j / a.block_size];
                        const size_t slot = static_cast<size_t>(block) * a.block_size + j % a.block_size;
                        const float* k = a.k_cache + slot * kv_row + g * hd;
                        const float sc = dot(q, k, hd) * a.scale;
                        scores[j - lo] = sc;
                        m = std::max(m, sc);
                    }
                    float denom = std::exp(a.sinks[h] - m);
                    std::fill(acc.begin(), acc.end(), 0.0f);
                    for (int j = lo; j <= pos; ++j) {
                        const float p = std::exp(scores[j - lo] - m);
                        denom += p;
                        const int block = seq.block_table[j / a.block_size];
                        const size_t slot = static_cast<size_t>(block) * a.block_size + j % a.block_size;
                        const float* v = a.v_cache + slot * kv_row + g * hd;
                        for (int d = 0; d < hd; ++d) acc[d] += p * v[d];
                    }
                    float* out = a.out + (static_cast<size_t>(t) * a.num_heads + h) * hd;
                    const float inv = 1.0f / denom;
                    for (int d = 0; d < hd; ++d) out[d] = acc[d] * inv;
                }
            }
        });
}

}  // namespace gptoss::kernels::cpu
