// Token sampling on host logits. Randomness is counter-based: the draw for a request's n-th
// generated token depends only on (seed, n), and penalties only on the request's own tokens, so a
// seeded request gives the same tokens whatever else shares its batch, and after a preemption that
// recomputes it.
//
// Order of operations on one row of raw logits (as vLLM):
//   1. logprobs (if asked) from the raw logits: log_softmax, before any of the steps below;
//   2. logit bias; repetition penalty over prompt + output tokens (logit > 0: divide, else
//      multiply); frequency and presence penalties over output tokens only;
//   3. greedy (temperature 0 or top_k 1): the first maximum;
//   4. else softmax at the temperature; keep top-k, then tokens with p >= min_p · p_max, then the
//      smallest most-probable set whose mass reaches top_p (ties to the lower id; the mass is
//      summed in a fixed order, found by quickselect rather than a sort); draw u from
//      (seed, n) and walk the kept tokens in ascending id order until the cumulative mass passes
//      u · kept mass. (Id order needs no sort, so plain sampling over 200k ids stays linear.)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gptoss::runtime {

inline constexpr int kMaxLogprobs = 20;  // top-N logprobs a request may ask for (OpenAI's limit)

struct SamplingParams {
    float temperature = 1.0f;                             // 0: greedy
    float top_p = 1.0f;                                   // nucleus; 1 disables
    int top_k = 0;                                        // 0 disables
    float min_p = 0.0f;                                   // drop tokens with p < min_p · p_max; 0 disables
    std::optional<uint64_t> seed{};                       // nullopt: the engine draws one per request
    float presence_penalty = 0.0f;                        // subtracted once from every token already in the output
    float frequency_penalty = 0.0f;                       // subtracted per occurrence in the output
    float repetition_penalty = 1.0f;                      // > 1 discourages tokens seen in prompt or output; 1 disables
    std::vector<std::pair<int32_t, float>> logit_bias{};  // (token id, bias added to its logit)
};

// A request's seed as vLLM and llama.cpp read it: -1 asks for a random draw (nullopt); any other
// 64-bit integer, signed or unsigned, is a seed of its own (a negative one by its two's complement).
inline std::optional<uint64_t> seed_from_signed(int64_t seed) {
    if (seed == -1) return std::nullopt;
    return static_cast<uint64_t>(seed);
}

// Checks ranges (temperature >= 0, 0 < top_p <= 1, top_k >= 0, 0 <= min_p <= 1,
// repetition_penalty > 0, finite penalties, logit_bias ids in [0, vocab_size)).
Status validate_sampling_params(const SamplingParams& params, int vocab_size);

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// A prompt token's logprob under the logits of the position before it (vLLM's prompt_logprobs).
struct PromptLogprob {
    float logprob = 0.0f;             // of the prompt token, raw logits
    int rank = 0;                     // 1 + the ids whose logit is larger than the prompt token's
    std::vector<TokenLogprob> top{};  // the top-N raw logprobs, most probable first
};

struct SampledToken {
    int32_t id = 0;
    float logprob = 0.0f;                    // of `id` under the raw logits (when logprobs were asked)
    std::vector<TokenLogprob> top_logprobs;  // the top-N raw logprobs, most probable first
};

// The edits bias and penalties make to a row of logits before a draw, in the order applied: logit[id] += value for
// each `add` entry (logit_bias), then l > 0 ? l / repetition : l · repetition for each `repeat` id (the prompt's
// and output's, once each), then logit[id] -= value for each `subtract` entry (frequency_penalty · count +
// presence_penalty, once per output id). Every id appears at most once in each list.
struct LogitEdits {
    std::vector<std::pair<int32_t, float>> add;
    std::vector<int32_t> repeat;
    float repetition = 1.0f;
    std::vector<std::pair<int32_t, float>> subtract;
    bool empty() const { return add.empty() && repeat.empty() && subtract.empty(); }
};
// The edits of `p` after `prompt` and `output` (empty without bias or penalties).
LogitEdits logit_edits(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> output);
// Applies edits to a row (float arithmetic, one rounding each, as written above).
void apply_logit_edits(const LogitEdits& e, float* row);

// Keeps scratch buffers between calls; one per thread.
class Sampler {
public:
    explicit Sampler(int vocab_size);

    // `logits`: one raw row [vocab_size], not modified. `prompt` and `output` are the request's
    // tokens so far (for penalties); the draw index is output.size(). num_logprobs < 0: none;
    // 0: only the sampled token's; N: also the top N. `allowed` (optional, [vocab_size], at least one
    // set): only tokens with allowed[id] != 0 may be drawn; they are masked after the bias and
    // penalties (logprobs stay those of the raw logits, as vLLM's).
    SampledToken sample(const float* logits, const SamplingParams& params, uint64_t seed,
                        std::span<const int32_t> prompt, std::span<const int32_t> output, int num_logprobs,
                        const uint8_t* allowed = nullptr);
    // The raw logprob of `token` under one row, its rank, and the top `num_logprobs` (0..vocab).
    PromptLogprob score(const float* logits, int32_t token, int num_logprobs);

private:
    // log Σ exp(logits) and, with n > 0, the n most probable ids' logprobs into `top` (ties to the lower id).
    double log_sum_exp_and_top(const float* logits, int n, std::vector<TokenLogprob>* top);

    int vocab_size_;
    std::vector<float> work_;             // [vocab_size] processed logits
    std::vector<float> prob_;             // [vocab_size] probabilities relative to the most probable token
    std::vector<uint64_t> keys_;          // candidates as (logit, id) sort keys
    std::vector<int32_t> ids_;            // kept ids, ascending
    std::vector<uint8_t> flags_;          // [vocab_size]
    std::vector<float> allowed_logits_;   // a mask's allowed logits, ascending ids
    std::vector<int32_t> allowed_ids_;    // their ids
    std::vector<float> kept_;             // the kept ids' probabilities
    std::vector<int32_t> bucket_counts_;  // scratch of the top-k selection
    std::vector<double> bucket_mass_;     // scratch of the nucleus
};

// Returns the sampled token id from already-processed logits (steps 3-4 above, no penalties).
// `draw_index` is the position of this draw in the request's output (0, 1, 2, …).
int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& params, uint64_t seed,
                     uint64_t draw_index);

// Uniform [0, 1) from (seed, index): splitmix64-based.
double uniform_at(uint64_t seed, uint64_t index);

}  // namespace gptoss::runtime
