// Router (top-k, softmax over the chosen k) and the MoE experts with the clamped SwiGLU (CPU).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace gptoss::kernels::cpu {

void router(const RouterArgs& a) {
    LinearArgs lin;
    lin.x = a.x;
    lin.weight = a.weight;
    lin.weight_dtype = a.weight_dtype;
    lin.bias = a.bias;
    lin.y = a.logits;
    lin.num_tokens = a.num_tokens;
    lin.in_features = a.hidden_size;
    lin.out_features = a.num_experts;
    linear(lin);
    std::vector<int> order(a.num_experts);
    for (int t = 0; t < a.num_tokens; ++t) {
        const float* r = a.logits + static_cast<size_t>(t) * a.num_experts;
        std::iota(order.begin(), order.end(), 0);
        // Descending by logit; ties to the lower expert index.
        std::partial_sort(order.begin(), order.begin() + a.experts_per_token, order.end(),
                          [&](int x, int y) { return r[x] > r[y] || (r[x] == r[y] && x < y); });
        int32_t* ids = a.expert_ids + static_cast<size_t>(t) * a.experts_per_token;
        float* w = a.expert_weights + static_cast<size_t>(t) * a.experts_per_token;
        const float mx = r[order[0]];
        float sum = 0.0f;
        for (int k = 0; k < a.experts_per_token; ++k) {
            ids[k] = order[k];
            w[k] = std::exp(r[order[k]] - mx);
            sum += w[k];
        }
        for (int k = 0; k < a.experts_per_token; ++k) w[k] /= sum;
    }
}

namespace {

// One expert's rows [row_begin, row_end) of a [out, in] weight applied to the listed inputs.
struct ExpertMatrix {
    const MoeArgs* a;
    bool gate_up;  // true: W_gu [2I, H]; false: W_down [H, I]

    int in_features() const { return gate_up ? a->hidden_size : a->intermediate_size; }
    int out_features() const { return gate_up ? 2 * a->intermediate_size : a->hidden_size; }

    void row(int e, int r, float* out) const {
        const int in = in_features();
        const size_t row_index = static_cast<size_t>(e) * out_features() + r;
        if (a->format == ExpertFormat::kMxfp4) {
            const int groups = in / kMxfp4GroupSize;
            const uint8_t* blocks = gate_up ? a->gate_up_blocks : a->down_blocks;
            const uint8_t* scales = gate_up ? a->gate_up_scales : a->down_scales;
            mxfp4_row_to_f32(blocks + row_index * groups * kMxfp4BytesPerGroup, scales + row_index * groups, in, out);
        } else if (a->format == ExpertFormat::kFp8Block) {
            const uint8_t* q = (gate_up ? a->gate_up_fp8 : a->down_fp8) + row_index * in;
            const int bc = (in + 127) / 128, br = (out_features() + 127) / 128;
            const float* s =
                (gate_up ? a->gate_up_fp8_scale : a->down_fp8_scale) + (static_cast<size_t>(e) * br + r / 128) * bc;
            for (int c = 0; c < in; ++c) out[c] = fp8e4m3_to_f32(q[c]) * s[c / 128];
        } else {
            const void* w = gate_up ? a->gate_up_dense : a->down_dense;
            row_to_f32(static_cast<const uint8_t*>(w) + row_index * in * dtype_size(a->dense_dtype), a->dense_dtype, in,
                       out);
        }
    }
};

}  // namespace

void moe(const MoeArgs& a) {
    const int k = a.experts_per_token;
    const int num_assign = a.num_tokens * k;  // assignment index = token * k + slot
    const int I = a.intermediate_size;
    const int H = a.hidden_size;
    // Group assignments by expert so each weight row is decoded once per step for all its tokens.
    std::vector<std::vector<int>> by_expert(a.num_experts);
    for (int as = 0; as < num_assign; ++as) {
        const int e = a.expert_ids[as] - a.expert_begin;
        if (e >= 0 && e < a.num_experts) by_expert[e].push_back(as);  // else another rank's expert
    }
    std::vector<int> active;
    for (int e = 0; e < a.num_experts; ++e)
        if (!by_expert[e].empty()) active.push_back(e);

    std::vector<float> gu(static_cast<size_t>(num_assign) * 2 * I);
    std::vector<float> act(static_cast<size_t>(num_assign) * I);
    std::vector<float> down(static_cast<size_t>(num_assign) * H);
    auto run = [&](const ExpertMatrix& m, const float* in, size_t in_stride, bool in_by_token, float* out,
                   const float* bias) {
        const int rows = m.out_features();
        const int in_f = m.in_features();
        ThreadPool::global().parallel_for(
            static_cast<int64_t>(active.size()) * rows,
            [&](int64_t begin, int64_t end) {
                std::vector<float> w(in_f);
                for (int64_t item = begin; item < end; ++item) {
                    const int e = active[item / rows];
                    const int r = static_cast<int>(item % rows);
                    m.row(e, r, w.data());
                    const float b = bias ? bias[static_cast<size_t>(e) * rows + r] : 0.0f;
                    for (int as : by_expert[e]) {
                        const float* x =
                            in + (in_by_token ? static_cast<size_t>(as / k) : static_cast<size_t>(as)) * in_stride;
                        out[static_cast<size_t>(as) * rows + r] = dot(w.data(), x, in_f) + b;
                    }
                }
            },
            32);
    };
    run(ExpertMatrix{&a, true}, a.x, H, true, gu.data(), a.gate_up_bias);
    for (int as = 0; as < num_assign; ++as) {
        const float* g = gu.data() + static_cast<size_t>(as) * 2 * I;
        float* o = act.data() + static_cast<size_t>(as) * I;
        for (int j = 0; j < I; ++j) {
            float gate = std::min(g[2 * j], a.swiglu_limit);  // interleaved: even = gate, odd = up
            float up = std::clamp(g[2 * j + 1], -a.swiglu_limit, a.swiglu_limit);
            float glu = gate / (1.0f + std::exp(-a.swiglu_alpha * gate));
            o[j] = (up + 1.0f) * glu;
        }
    }
    run(ExpertMatrix{&a, false}, act.data(), I, false, down.data(), a.down_bias);
    for (int t = 0; t < a.num_tokens; ++t) {
        float* y = a.y + static_cast<size_t>(t) * H;
        std::fill(y, y + H, 0.0f);
        for (int s = 0; s < k; ++s) {  // fixed slot order: deterministic and batch-invariant
            const int e = a.expert_ids[t * k + s] - a.expert_begin;
            if (e < 0 || e >= a.num_experts) continue;
            const float w = a.expert_weights[t * k + s];
            const float* d = down.data() + static_cast<size_t>(t * k + s) * H;
            for (int i = 0; i < H; ++i) y[i] += w * d[i];
        }
    }
}

}  // namespace gptoss::kernels::cpu
