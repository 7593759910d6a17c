#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>

#include "core/hash.h"

namespace gptoss::runtime {
namespace {

// First maximum wins; NaN never wins (a row of NaN gives 0), so a broken row cannot produce an
// out-of-range id.
int32_t argmax(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
        if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
    return best;
}

// Candidates are packed as 64-bit keys ordered like "higher logit first, ties to the lower id":
// the upper half is the logit mapped to an order-preserving unsigned integer, the lower half the
// inverted id. Selections then compare plain integers instead of chasing ids into the logits.
uint64_t candidate_key(float logit, int32_t id) {
    uint32_t bits;
    std::memcpy(&bits, &logit, sizeof(bits));
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

int32_t key_id(uint64_t key) { return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key)); }

// Reorders `keys` so that its first n entries are the nucleus: the n best candidates, n the
// smallest count whose probability mass reaches top_p of all the candidates' mass. Quickselect on
// the mass (expected linear time): a flat 200k-token distribution needs no sort.
size_t nucleus_size(std::vector<uint64_t>& keys, const std::vector<float>& prob, double top_p) {
    double total = 0.0;
    for (uint64_t k : keys) total += prob[key_id(k)];
    const double target = top_p * total;
    size_t lo = 0, hi = keys.size();  // the cut lies in (lo, hi]; keys[0, lo) are all inside
    double acc = 0.0;                 // mass of keys[0, lo)
    while (hi - lo > 32) {
        // Median of three as the pivot; partition the rest into "better than the pivot" first.
        const uint64_t a = keys[lo], b = keys[lo + (hi - lo) / 2], c = keys[hi - 1];
        const uint64_t pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
        auto split = std::partition(keys.begin() + static_cast<long>(lo), keys.begin() + static_cast<long>(hi),
                                    [&](uint64_t k) { return k > pivot; });
        const size_t n_better = static_cast<size_t>(split - keys.begin()) - lo;
        double mass_better = 0.0;
        for (size_t i = lo; i < lo + n_better; ++i) mass_better += prob[key_id(keys[i])];
        if (acc + mass_better >= target) {
            hi = lo + n_better;
            continue;
        }
        // Everything better is inside; the pivot (the best of the rest) comes next.
        acc += mass_better;
        lo += n_better;
        std::iter_swap(keys.begin() + static_cast<long>(lo),
                       std::find(keys.begin() + static_cast<long>(lo), keys.begin() + static_cast<long>(hi), pivot));
        acc += prob[key_id(pivot)];
        if (acc >= target) return lo + 1;
        ++lo;
    }
    std::sort(keys.begin() + static_cast<long>(lo), keys.begin() + static_cast<long>(hi), std::greater<>());
    for (size_t i = lo; i < hi; ++i) {
        acc += prob[key_id(keys[i])];
        if (acc >= target) return i + 1;
    }
    return std::max<size_t>(1, hi);
}

struct DrawScratch {
    std::vector<float>& prob;     // [vocab_size]
    std::vector<uint64_t>& keys;  // candidates
    std::vector<int32_t>& ids;    // kept ids, ascending
    std::vector<uint8_t>& flags;  // [vocab_size]
};

// Steps 3-4 of the header comment on processed logits.
int32_t draw(const float* logits, int vocab_size, const SamplingParams& p, uint64_t seed, uint64_t draw_index,
             DrawScratch s) {
    if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab_size);
    const float mx = logits[argmax(logits, vocab_size)];
    const float inv_t = 1.0f / p.temperature;
    s.prob.resize(static_cast<size_t>(vocab_size));
    // Relative to the maximum (which gets exactly 1), so min_p compares against 1.
    // A NaN logit (a broken row) counts as -inf: probability 0, ranked last.
    for (int i = 0; i < vocab_size; ++i) s.prob[i] = std::isnan(logits[i]) ? 0.0f : std::exp((logits[i] - mx) * inv_t);

    const bool top_k = p.top_k > 0 && p.top_k < vocab_size;
    if (!top_k && p.top_p >= 1.0f) {
        // No ranking needed: the kept ids are all ids (minus min_p's cut), already ascending.
        s.ids.clear();
        for (int i = 0; i < vocab_size; ++i)
            if (s.prob[i] >= p.min_p && s.prob[i] > 0.0f) s.ids.push_back(i);
    } else {
        s.keys.resize(static_cast<size_t>(vocab_size));
        for (int i = 0; i < vocab_size; ++i)
            s.keys[i] = candidate_key(std::isnan(logits[i]) ? -INFINITY : logits[i], i);
        if (top_k) {
            std::nth_element(s.keys.begin(), s.keys.begin() + (p.top_k - 1), s.keys.end(), std::greater<>());
            s.keys.resize(static_cast<size_t>(p.top_k));
        }
        if (p.min_p > 0.0f) std::erase_if(s.keys, [&](uint64_t k) { return s.prob[key_id(k)] < p.min_p; });
        if (p.top_p < 1.0f) s.keys.resize(nucleus_size(s.keys, s.prob, static_cast<double>(p.top_p)));
        // Back to ascending ids: a sort when few are kept, else one pass over a flag per id.
        s.ids.clear();
        if (s.keys.size() * 16 < static_cast<size_t>(vocab_size)) {
            for (uint64_t k : s.keys) s.ids.push_back(key_id(k));
            std::sort(s.ids.begin(), s.ids.end());
        } else {
            s.flags.assign(static_cast<size_t>(vocab_size), 0);
            for (uint64_t k : s.keys) s.flags[key_id(k)] = 1;
            for (int i = 0; i < vocab_size; ++i)
                if (s.flags[i]) s.ids.push_back(i);
        }
    }
    // Non-finite logits (NaN) leave nothing to draw from: fall back to the argmax, never index an
    // empty list.
    if (s.ids.empty()) return argmax(logits, vocab_size);
    double kept = 0.0;
    for (int32_t id : s.ids) kept += s.prob[id];
    const double u = uniform_at(seed, draw_index) * kept;
    double cum = 0.0;
    for (int32_t id : s.ids) {
        cum += s.prob[id];
        if (u < cum) return id;
    }
    return s.ids.back();
}

}  // namespace

double uniform_at(uint64_t seed, uint64_t index) {
    return static_cast<double>(splitmix64(splitmix64(seed) ^ index) >> 11) * 0x1.0p-53;
}

Status validate_sampling_params(const SamplingParams& p, int vocab_size) {
    if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
        return invalid_argument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return invalid_argument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    if (p.top_k < 0) return invalid_argument("top_k must be >= 0 (0 disables it), got " + std::to_string(p.top_k));
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return invalid_argument("min_p must be in [0, 1], got " + std::to_string(p.min_p));
    if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
        return invalid_argument("repetition_penalty must be a finite number > 0, got " +
                                std::to_string(p.repetition_penalty));
    if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
        return invalid_argument("presence_penalty and frequency_penalty must be finite");
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < 0 || id >= vocab_size)
            return invalid_argument("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                    std::to_string(vocab_size) + ")");  // ("param: text" names the API field)
        if (!std::isfinite(bias))
            return invalid_argument("logit_bias: the bias for token " + std::to_string(id) + " is not finite");
    }
    return ok_status();
}

int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& params, uint64_t seed,
                     uint64_t draw_index) {
    std::vector<float> prob;
    std::vector<uint64_t> keys;
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;
    return draw(logits, vocab_size, params, seed, draw_index, DrawScratch{prob, keys, ids, flags});
}

Sampler::Sampler(int vocab_size) : vocab_size_(vocab_size) {}

double Sampler::log_sum_exp_and_top(const float* logits, int num, std::vector<TokenLogprob>* top) {
    const int V = vocab_size_;
    const float mx = logits[argmax(logits, V)];
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
    const double lse = mx + std::log(sum);
    const int n = std::min(num, V);
    if (n > 0) {
        keys_.resize(static_cast<size_t>(V));
        for (int i = 0; i < V; ++i) keys_[i] = candidate_key(logits[i], i);
        std::partial_sort(keys_.begin(), keys_.begin() + n, keys_.end(), std::greater<>());
        for (int i = 0; i < n; ++i) {
            const int32_t id = key_id(keys_[i]);
            top->push_back({id, static_cast<float>(logits[id] - lse)});
        }
    }
    return lse;
}

PromptLogprob Sampler::score(const float* logits, int32_t token, int num_logprobs) {
    PromptLogprob out;
    const double lse = log_sum_exp_and_top(logits, num_logprobs, &out.top);
    out.logprob = static_cast<float>(logits[token] - lse);
    const float x = logits[token];
    out.rank = 1 + static_cast<int>(std::count_if(logits, logits + vocab_size_, [x](float v) { return v > x; }));
    return out;
}

SampledToken Sampler::sample(const float* logits, const SamplingParams& p, uint64_t seed,
                             std::span<const int32_t> prompt, std::span<const int32_t> output, int num_logprobs,
                             const uint8_t* allowed) {
    const int V = vocab_size_;
    SampledToken out;

    // 1. Logprobs from the raw logits.
    double lse = 0.0;
    if (num_logprobs >= 0) lse = log_sum_exp_and_top(logits, num_logprobs, &out.top_logprobs);

    // 2. Bias and penalties on a private copy (only when there are any).
    const float* processed = logits;
    const bool penalised = !p.logit_bias.empty() || p.repetition_penalty != 1.0f ||
                           (!output.empty() && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f));
    if (penalised) {
        work_.assign(logits, logits + V);
        for (const auto& [id, bias] : p.logit_bias) work_[id] += bias;
        if (p.repetition_penalty != 1.0f) {
            counts_.assign(prompt.begin(), prompt.end());
            counts_.insert(counts_.end(), output.begin(), output.end());
            std::sort(counts_.begin(), counts_.end());
            counts_.erase(std::unique(counts_.begin(), counts_.end()), counts_.end());
            for (int32_t id : counts_) {
                float& l = work_[id];
                l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
            }
        }
        if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
            counts_.assign(output.begin(), output.end());
            std::sort(counts_.begin(), counts_.end());
            for (size_t i = 0; i < counts_.size();) {
                size_t j = i;
                while (j < counts_.size() && counts_[j] == counts_[i]) ++j;
                work_[counts_[i]] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
                i = j;
            }
        }
        processed = work_.data();
    }
    // 3-4. Draw. Under a mask, over the allowed tokens alone (ascending ids): the masked-out ones would have
    // probability 0 and rank below every allowed one, so the kept ids, their probabilities and the draw are the
    // same, for the exponentials of the allowed tokens only.
    if (allowed != nullptr) {
        allowed_logits_.clear();
        allowed_ids_.clear();
        for (int i = 0; i < V; ++i)
            if (allowed[i]) {
                allowed_logits_.push_back(processed[i]);
                allowed_ids_.push_back(i);
            }
    }
    if (allowed != nullptr && !allowed_ids_.empty()) {
        const int32_t k = draw(allowed_logits_.data(), static_cast<int>(allowed_ids_.size()), p, seed, output.size(),
                               DrawScratch{prob_, keys_, ids_, flags_});
        out.id = allowed_ids_[static_cast<size_t>(k)];
    } else {
        out.id = draw(processed, V, p, seed, output.size(), DrawScratch{prob_, keys_, ids_, flags_});
    }
    if (allowed != nullptr && !allowed[out.id]) {
        // Every allowed logit is -inf or NaN (a broken row): the first allowed token, never another.
        for (int i = 0; i < V; ++i)
            if (allowed[i]) {
                out.id = i;
                break;
            }
    }
    if (num_logprobs >= 0) out.logprob = static_cast<float>(logits[out.id] - lse);
    return out;
}

}  // namespace gptoss::runtime
