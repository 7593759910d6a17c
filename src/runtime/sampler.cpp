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
    // The largest non-NaN value (a vectorized pass: NaN compares false), then its first index.
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; ++i)
        if (logits[i] == mx) return i;
    return 0;  // every value NaN
}

// Candidates are packed as 64-bit keys ordered like "higher logit first, ties to the lower id":
// the upper half is the logit mapped to an order-preserving unsigned integer, the lower half the
// inverted id. Selections then compare plain integers instead of chasing ids into the logits.
uint64_t candidate_key(float logit, int32_t id) {
    uint32_t bits;
    std::memcpy(&bits, &logit, sizeof(bits));
    bits ^= static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;  // negative: ~bits (no branch)
    return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

int32_t key_id(uint64_t key) { return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key)); }

// Candidates by the top 12 bits of their key (sign, exponent and 3 mantissa bits of the logit): buckets in key
// order, so every key of a higher bucket ranks above every key of a lower one. Selections count or weigh the
// buckets in one pass, then sort only the bucket where the cut falls.
constexpr int kBucketBits = 12;
constexpr int kBuckets = 1 << kBucketBits;
int bucket_of(uint64_t key) { return static_cast<int>(key >> (64 - kBucketBits)); }

// Reorders `keys` so that its first k entries are the k best (in no particular order): bucket counts by the key's
// top 12 bits find the bucket where the k-th falls, a large cut bucket (a flat or offset row) is counted again by
// the next 12 bits (and once more), and nth_element finishes in the last one.
void select_top_k(std::vector<uint64_t>& keys, size_t k, std::vector<int32_t>& counts) {
    if (k >= keys.size()) return;
    constexpr size_t kSelectMax = 4096;
    auto first = keys.begin(), last = keys.end();  // the k-th lies among [first, last)
    size_t need = k;                               // of [first, last)
    for (int shift = 64 - kBucketBits;; shift -= kBucketBits) {
        const auto sub = [&](uint64_t key) { return static_cast<int>((key >> shift) & (kBuckets - 1)); };
        counts.assign(kBuckets, 0);
        for (auto it = first; it != last; ++it) ++counts[sub(*it)];
        int cut = kBuckets - 1;
        for (size_t above = 0; cut > 0 && above + static_cast<size_t>(counts[cut]) < need;)
            above += static_cast<size_t>(counts[cut--]);
        auto mid = std::partition(first, last, [&](uint64_t key) { return sub(key) > cut; });
        auto end = std::partition(mid, last, [&](uint64_t key) { return sub(key) == cut; });
        need -= static_cast<size_t>(mid - first);
        first = mid;
        last = end;
        if (static_cast<size_t>(last - first) <= kSelectMax || shift <= 64 - 3 * kBucketBits) break;
    }
    std::nth_element(first, first + static_cast<long>(need) - 1, last, std::greater<>());
    keys.resize(static_cast<size_t>(first - keys.begin()) + need);
}

// keys = the k best candidates of the row (NaN as -inf), in no particular order: bucket counts find the bucket
// where the k-th falls, keys are made only from there up.
void top_keys(const float* logits, int n, size_t k, std::vector<int32_t>& counts, std::vector<uint64_t>& keys) {
    const auto clean = [&](int i) { return logits[i] == logits[i] ? logits[i] : -INFINITY; };
    counts.assign(kBuckets, 0);
    for (int i = 0; i < n; ++i) ++counts[bucket_of(candidate_key(clean(i), 0))];
    int cut = kBuckets - 1;
    for (size_t above = 0; cut > 0 && above + static_cast<size_t>(counts[cut]) < k;)
        above += static_cast<size_t>(counts[cut--]);
    keys.clear();
    for (int i = 0; i < n; ++i) {
        const uint64_t key = candidate_key(clean(i), i);
        if (bucket_of(key) >= cut) keys.push_back(key);
    }
    select_top_k(keys, k, counts);
}

// Reorders `keys` so that its first n entries are the nucleus: the n best candidates, n the smallest count whose
// probability mass reaches target. `mass` holds the candidates' masses by bucket (every candidate's, though keys
// may hold only those of the buckets from the cut up: the rest are never inside). The buckets' masses find the
// bucket where the cut falls; only that bucket is sorted.
size_t nucleus_size(std::vector<uint64_t>& keys, const std::vector<float>& prob, double target,
                    std::vector<double>& mass) {
    // Level 0 buckets by the key's top 12 bits with the given masses; a cut bucket of more than kSortMax keys (a
    // flat or offset row) is split again by the next 12 bits, and once more (any bit field below an equal prefix
    // orders keys as the keys do).
    constexpr size_t kSortMax = 2048;
    auto first = keys.begin(), last = keys.end();  // the cut lies among [first, last)
    double acc = 0.0;                              // the mass of keys before `first`
    for (int shift = 64 - kBucketBits;; shift -= kBucketBits) {
        const auto sub = [&](uint64_t key) { return static_cast<int>((key >> shift) & (kBuckets - 1)); };
        if (shift != 64 - kBucketBits) {  // this level's masses, over the keys left
            mass.assign(kBuckets, 0.0);
            for (auto it = first; it != last; ++it) mass[sub(*it)] += prob[key_id(*it)];
        }
        int cut = kBuckets - 1;
        while (cut > 0 && acc + mass[cut] < target) acc += mass[cut--];
        auto mid = std::partition(first, last, [&](uint64_t key) { return sub(key) > cut; });
        auto end = std::partition(mid, last, [&](uint64_t key) { return sub(key) == cut; });
        first = mid;
        last = end;
        if (static_cast<size_t>(last - first) <= kSortMax || shift <= 64 - 3 * kBucketBits) break;
    }
    std::sort(first, last, std::greater<>());
    for (auto it = first; it != last; ++it) {
        acc += prob[key_id(*it)];
        if (acc >= target) return static_cast<size_t>(it - keys.begin()) + 1;
    }
    return std::max<size_t>(1, static_cast<size_t>(last - keys.begin()));
}

// e^x for x <= 0 (logits relative to their maximum), 0 below 2^-125. Branch-free, so the loops over a row
// vectorize (glibc's expf is a call a token: ~1 ms a 201k row). 2^x as 2^n · 2^r, |r| <= 1/2, 2^r by its Taylor
// polynomial of degree 7: relative error below 2e-7 near x = 0, growing with |x| by float's rounding of x · log2 e
// (5e-6 at e^-87, where the probability is negligible).
inline float exp_nonpositive(float x) {
    const float t = x * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
    const float r = t - n;
    float p = 1.54035304e-4f;
    p = p * r + 1.33335581e-3f;
    p = p * r + 9.61812911e-3f;
    p = p * r + 5.55041087e-2f;
    p = p * r + 2.40226507e-1f;
    p = p * r + 6.93147181e-1f;
    p = p * r + 1.0f;
    const int32_t e = (static_cast<int32_t>(std::max(n, -125.0f)) + 127) << 23;
    float scale;
    std::memcpy(&scale, &e, sizeof(scale));
    return t < -125.0f ? 0.0f : p * scale;
}

// prob[i] = e^((logits[i] - mx) · inv_t), 0 for a NaN logit (a broken row).
void relative_probs(const float* logits, int n, float mx, float inv_t, float* prob) {
    for (int i = 0; i < n; ++i) {
        const float l = logits[i];
        const float e = exp_nonpositive((l - mx) * inv_t);
        prob[i] = l == l ? e : 0.0f;
    }
}

// Σ w[0, n) in double: blocks of 8 interleaved partial sums (vectorized), blocks in order.
constexpr int kSumBlock = 256;
double block_sum(const float* w, int n) {
    double acc[8] = {};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += w[i + j];
    double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += w[i];
    return s;
}

// The index i whose cumulative weight w[0..i] first exceeds u · Σ w (u in [0, 1)), by block sums then one
// block's scan; the last index with positive weight when rounding leaves u at the total. -1 if every weight is 0.
int64_t weighted_pick(const float* w, int64_t n, double u) {
    const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
    double total = 0.0;
    std::vector<double> sums(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
        sums[static_cast<size_t>(b)] =
            block_sum(w + b * kSumBlock, static_cast<int>(std::min<int64_t>(kSumBlock, n - b * kSumBlock)));
        total += sums[static_cast<size_t>(b)];
    }
    if (!(total > 0.0)) return -1;
    const double target = u * total;
    double cum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
        if (cum + sums[static_cast<size_t>(b)] <= target && b + 1 < blocks) {
            cum += sums[static_cast<size_t>(b)];
            continue;
        }
        for (int64_t i = b * kSumBlock; i < std::min(n, (b + 1) * kSumBlock); ++i) {
            cum += w[i];
            if (target < cum) return i;
        }
    }
    for (int64_t i = n - 1; i >= 0; --i)
        if (w[i] > 0.0f) return i;
    return -1;
}

struct DrawScratch {
    std::vector<float>& prob;      // [vocab_size]
    std::vector<uint64_t>& keys;   // candidates
    std::vector<int32_t>& ids;     // kept ids, ascending
    std::vector<uint8_t>& flags;   // [vocab_size]
    std::vector<float>& kept;      // the kept ids' probabilities
    std::vector<int32_t>& counts;  // bucket counts
    std::vector<double>& mass;     // bucket masses
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
    relative_probs(logits, vocab_size, mx, inv_t, s.prob.data());
    const double u = uniform_at(seed, draw_index);

    const bool top_k = p.top_k > 0 && p.top_k < vocab_size;
    if (!top_k && p.top_p >= 1.0f) {
        // No ranking needed: every id with p >= min_p, in id order; the rest weigh 0.
        if (p.min_p > 0.0f)
            for (int i = 0; i < vocab_size; ++i) s.prob[i] = s.prob[i] >= p.min_p ? s.prob[i] : 0.0f;
        const int64_t i = weighted_pick(s.prob.data(), vocab_size, u);
        // Non-finite logits (NaN) leave nothing to draw from: fall back to the argmax.
        return i >= 0 ? static_cast<int32_t>(i) : argmax(logits, vocab_size);
    }
    // Ranked: bucket counts (top-k) or masses (top-p) over the row find where the cut can fall; keys are made only
    // for the candidates from that bucket up.
    const auto clean = [&](int i) { return logits[i] == logits[i] ? logits[i] : -INFINITY; };
    const auto bucket = [&](int i) { return bucket_of(candidate_key(clean(i), 0)); };
    s.keys.clear();
    if (top_k) {
        top_keys(logits, vocab_size, static_cast<size_t>(p.top_k), s.counts, s.keys);
        if (p.min_p > 0.0f) std::erase_if(s.keys, [&](uint64_t k) { return s.prob[key_id(k)] < p.min_p; });
        if (p.top_p < 1.0f) {
            s.mass.assign(kBuckets, 0.0);
            for (uint64_t k : s.keys) s.mass[bucket_of(k)] += s.prob[key_id(k)];
            double total = 0.0;
            for (int b = kBuckets - 1; b >= 0; --b) total += s.mass[b];
            s.keys.resize(nucleus_size(s.keys, s.prob, static_cast<double>(p.top_p) * total, s.mass));
        }
    } else {  // top-p over every id with p >= min_p
        s.mass.assign(kBuckets, 0.0);
        for (int i = 0; i < vocab_size; ++i)
            if (s.prob[i] >= p.min_p) s.mass[bucket(i)] += s.prob[i];
        double total = 0.0;
        for (int b = kBuckets - 1; b >= 0; --b) total += s.mass[b];
        const double target = static_cast<double>(p.top_p) * total;
        int cut = kBuckets - 1;
        for (double acc = 0.0; cut > 0 && acc + s.mass[cut] < target;) acc += s.mass[cut--];
        for (int i = 0; i < vocab_size; ++i)
            if (bucket(i) >= cut && s.prob[i] >= p.min_p) s.keys.push_back(candidate_key(clean(i), i));
        s.keys.resize(nucleus_size(s.keys, s.prob, target, s.mass));
    }
    // Back to ascending ids: a sort when few are kept, else one pass over a flag per id.
    s.ids.clear();
    if (s.keys.size() * 64 < static_cast<size_t>(vocab_size)) {
        for (uint64_t k : s.keys) s.ids.push_back(key_id(k));
        std::sort(s.ids.begin(), s.ids.end());
    } else {
        s.flags.assign(static_cast<size_t>(vocab_size), 0);
        for (uint64_t k : s.keys) s.flags[key_id(k)] = 1;
        for (int i = 0; i < vocab_size; ++i)
            if (s.flags[i]) s.ids.push_back(i);
    }
    s.kept.resize(s.ids.size());
    for (size_t j = 0; j < s.ids.size(); ++j) s.kept[j] = s.prob[s.ids[j]];
    const int64_t j = weighted_pick(s.kept.data(), static_cast<int64_t>(s.kept.size()), u);
    return j >= 0 ? s.ids[static_cast<size_t>(j)] : argmax(logits, vocab_size);
}

}  // namespace

LogitEdits logit_edits(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> output) {
    LogitEdits e;
    e.add = p.logit_bias;
    if (p.repetition_penalty != 1.0f) {
        e.repeat.assign(prompt.begin(), prompt.end());
        e.repeat.insert(e.repeat.end(), output.begin(), output.end());
        std::sort(e.repeat.begin(), e.repeat.end());
        e.repeat.erase(std::unique(e.repeat.begin(), e.repeat.end()), e.repeat.end());
        e.repetition = p.repetition_penalty;
    }
    if (!output.empty() && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)) {
        std::vector<int32_t> counts(output.begin(), output.end());
        std::sort(counts.begin(), counts.end());
        for (size_t i = 0; i < counts.size();) {
            size_t j = i;
            while (j < counts.size() && counts[j] == counts[i]) ++j;
            e.subtract.emplace_back(counts[i], p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty);
            i = j;
        }
    }
    return e;
}

void apply_logit_edits(const LogitEdits& e, float* row) {
    for (const auto& [id, v] : e.add) row[id] += v;
    for (int32_t id : e.repeat) {
        float& l = row[id];
        l = l > 0.0f ? l / e.repetition : l * e.repetition;
    }
    for (const auto& [id, v] : e.subtract) row[id] -= v;
}

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
    std::vector<int32_t> bias_ids;
    for (const auto& [id, bias] : p.logit_bias) bias_ids.push_back(id);
    std::sort(bias_ids.begin(), bias_ids.end());
    if (std::adjacent_find(bias_ids.begin(), bias_ids.end()) != bias_ids.end())
        return invalid_argument("logit_bias: token id " +
                                std::to_string(*std::adjacent_find(bias_ids.begin(), bias_ids.end())) +
                                " appears more than once");
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
    std::vector<float> prob, kept;
    std::vector<uint64_t> keys;
    std::vector<int32_t> ids, counts;
    std::vector<uint8_t> flags;
    std::vector<double> mass;
    return draw(logits, vocab_size, params, seed, draw_index, DrawScratch{prob, keys, ids, flags, kept, counts, mass});
}

Sampler::Sampler(int vocab_size) : vocab_size_(vocab_size) {}

double Sampler::log_sum_exp_and_top(const float* logits, int num, std::vector<TokenLogprob>* top) {
    const int V = vocab_size_;
    const float mx = logits[argmax(logits, V)];
    prob_.resize(static_cast<size_t>(V));
    relative_probs(logits, V, mx, 1.0f, prob_.data());
    double sum = 0.0;
    for (int b = 0; b < V; b += kSumBlock) sum += block_sum(prob_.data() + b, std::min(kSumBlock, V - b));
    const double lse = mx + std::log(sum);
    const int n = std::min(num, V);
    if (n > 0) {
        top_keys(logits, V, static_cast<size_t>(n), bucket_counts_, keys_);
        std::sort(keys_.begin(), keys_.begin() + n, std::greater<>());
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
    const LogitEdits edits = logit_edits(p, prompt, output);
    if (!edits.empty()) {
        work_.assign(logits, logits + V);
        apply_logit_edits(edits, work_.data());
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
                               DrawScratch{prob_, keys_, ids_, flags_, kept_, bucket_counts_, bucket_mass_});
        out.id = allowed_ids_[static_cast<size_t>(k)];
    } else {
        out.id = draw(processed, V, p, seed, output.size(),
                      DrawScratch{prob_, keys_, ids_, flags_, kept_, bucket_counts_, bucket_mass_});
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
