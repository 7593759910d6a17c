#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace gptoss::runtime {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int32_t argmax(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;  // first maximum wins
    return best;
}

}  // namespace

double uniform_at(uint64_t seed, uint64_t index) {
    return static_cast<double>(splitmix64(splitmix64(seed) ^ index) >> 11) * 0x1.0p-53;
}

int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& p, uint64_t seed,
                     uint64_t draw_index) {
    if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab_size);
    // Candidates sorted by logit (descending, ties to the lower id); truncated by top-k first.
    std::vector<int32_t> idx(vocab_size);
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    size_t keep = static_cast<size_t>(vocab_size);
    if (p.top_k > 0 && p.top_k < vocab_size) keep = static_cast<size_t>(p.top_k);
    if (keep < idx.size()) {
        std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(keep), idx.end(), by_logit);
        idx.resize(keep);
    } else {
        std::sort(idx.begin(), idx.end(), by_logit);
    }
    // Softmax at temperature, in double for a stable cumulative sum.
    const double inv_t = 1.0 / p.temperature;
    const double mx = logits[idx[0]];
    std::vector<double> prob(idx.size());
    double sum = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) {
        prob[i] = std::exp((logits[idx[i]] - mx) * inv_t);
        sum += prob[i];
    }
    for (double& x : prob) x /= sum;
    size_t n = idx.size();
    if (p.min_p > 0.0f) {
        const double cut = p.min_p * prob[0];
        while (n > 1 && prob[n - 1] < cut) --n;
    }
    if (p.top_p < 1.0f) {
        double cum = 0.0;
        size_t m = 0;
        while (m < n) {
            cum += prob[m++];
            if (cum >= p.top_p) break;
        }
        n = std::max<size_t>(1, m);
    }
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
    const double u = uniform_at(seed, draw_index) * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cum += prob[i];
        if (u < cum) return idx[i];
    }
    return idx[n - 1];
}

}  // namespace gptoss::runtime
