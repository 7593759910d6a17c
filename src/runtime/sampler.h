// Token sampling on host logits. Randomness is counter-based: the draw for a request's n-th
// generated token depends only on (seed, n), so a seeded request gives the same tokens whatever
// else shares its batch, and after a preemption that recomputes it.
#pragma once

#include <cstdint>
#include <optional>

namespace gptoss::runtime {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy
    float top_p = 1.0f;        // nucleus; 1 disables
    int top_k = 0;             // 0 disables
    float min_p = 0.0f;        // drop tokens with p < min_p · p_max; 0 disables
    std::optional<uint64_t> seed;  // nullopt: the engine draws one per request
};

// Returns the sampled token id. `logits` has `vocab_size` entries and is not modified.
// `draw_index` is the position of this draw in the request's output (0, 1, 2, …).
int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& params, uint64_t seed,
                     uint64_t draw_index);

// Uniform [0, 1) from (seed, index): splitmix64-based.
double uniform_at(uint64_t seed, uint64_t index);

}  // namespace gptoss::runtime
