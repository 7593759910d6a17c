// Embedding, RMSNorm and linear layers on the CPU (fp32 arithmetic).
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace gptoss::kernels::cpu {

void embedding(const int32_t* ids, int num_tokens, const void* table, DType dtype, int hidden_size, float* out) {
    const size_t row_bytes = static_cast<size_t>(hidden_size) * dtype_size(dtype);
    for (int t = 0; t < num_tokens; ++t) {
        const auto* row = static_cast<const uint8_t*>(table) + static_cast<size_t>(ids[t]) * row_bytes;
        row_to_f32(row, dtype, hidden_size, out + static_cast<size_t>(t) * hidden_size);
    }
}

void rmsnorm(const RmsNormArgs& a) {
    for (int t = 0; t < a.num_tokens; ++t) {
        const float* x = a.x + static_cast<size_t>(t) * a.hidden_size;
        float* y = a.y + static_cast<size_t>(t) * a.hidden_size;
        float ss = dot(x, x, a.hidden_size);
        float inv = 1.0f / std::sqrt(ss / static_cast<float>(a.hidden_size) + a.eps);
        for (int i = 0; i < a.hidden_size; ++i) y[i] = x[i] * inv * a.weight[i];
    }
}

void linear(const LinearArgs& a) {
    // Parallel over output rows: each weight row is converted to fp32 once and used for every token.
    // (Session 49 tried a bf16 dot that converts inside the loop for decode-sized batches: ~25% faster on the tiny
    // model, but the compiler contracted its multiply-adds differently from dot()'s, so decode and prefill rows no
    // longer agreed to the bit and the batch-invariance tests failed: one arithmetic path for every batch size.)
    ThreadPool::global().parallel_for(
        a.out_features,
        [&](int64_t begin, int64_t end) {
            std::vector<float> w(a.in_features);
            const size_t row_bytes = static_cast<size_t>(a.in_features) * dtype_size(a.weight_dtype);
            for (int64_t o = begin; o < end; ++o) {
                row_to_f32(static_cast<const uint8_t*>(a.weight) + o * row_bytes, a.weight_dtype, a.in_features,
                           w.data());
                const float b = a.bias ? a.bias[o] : 0.0f;
                for (int t = 0; t < a.num_tokens; ++t) {
                    a.y[static_cast<size_t>(t) * a.out_features + o] =
                        dot(w.data(), a.x + static_cast<size_t>(t) * a.in_features, a.in_features) + b;
                }
            }
        },
        16);
}

}  // namespace gptoss::kernels::cpu
