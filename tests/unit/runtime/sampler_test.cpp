// Sampler: greedy, truncations, seeded reproducibility, penalties, bias, logprobs, and that draws
// follow the softmax.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace gptoss::runtime {
namespace {

std::vector<float> random_logits(int n, uint32_t seed, float scale = 2.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

int argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

// The ids by logit, best first (ties to the lower id), and each id's place in that order.
struct Ranking {
    std::vector<int32_t> order;
    std::vector<int> rank;
};
Ranking rank_ids(const std::vector<float>& logits) {
    const int V = static_cast<int>(logits.size());
    Ranking r{std::vector<int32_t>(V), std::vector<int>(V)};
    for (int i = 0; i < V; ++i) r.order[i] = i;
    std::sort(r.order.begin(), r.order.end(),
              [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < V; ++i) r.rank[r.order[i]] = i;
    return r;
}

TEST(SamplerTest, GreedyAndDegenerateTruncationsPickTheArgmax) {
    auto logits = random_logits(1000, 1);
    Sampler s(1000);
    const int best = argmax(logits);
    for (SamplingParams p : {SamplingParams{.temperature = 0.0f}, SamplingParams{.top_k = 1},
                             SamplingParams{.top_p = 1e-6f}, SamplingParams{.min_p = 1.0f}}) {
        for (uint64_t seed = 0; seed < 5; ++seed) EXPECT_EQ(s.sample(logits.data(), p, seed, {}, {}, -1).id, best);
    }
}

TEST(SamplerTest, SameSeedAndIndexGiveTheSameDraw) {
    auto logits = random_logits(500, 2, 0.5f);
    Sampler a(500), b(500);
    SamplingParams p{.temperature = 0.9f, .top_p = 0.95f, .top_k = 100};
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
        const int32_t x = a.sample(logits.data(), p, 7, {}, out, -1).id;
        EXPECT_EQ(x, b.sample(logits.data(), p, 7, {}, out, -1).id);
        EXPECT_EQ(x, sample_token(logits.data(), 500, p, 7, out.size()));
        out.push_back(x);
    }
    // Different seeds differ somewhere.
    std::vector<int32_t> out2;
    for (int i = 0; i < 50; ++i) out2.push_back(a.sample(logits.data(), p, 8, {}, out2, -1).id);
    EXPECT_NE(out, out2);
}

TEST(SamplerTest, DrawsFollowTheTruncatedSoftmax) {
    std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -9.0f};
    SamplingParams p{.temperature = 0.7f, .top_k = 5};
    std::vector<double> want(6, 0.0);
    double z = 0.0;
    for (int i = 0; i < 5; ++i) z += want[i] = std::exp(logits[i] / 0.7);
    for (auto& w : want) w /= z;
    std::vector<int> count(6, 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++count[sample_token(logits.data(), 6, p, 123, static_cast<uint64_t>(i))];
    EXPECT_EQ(count[5], 0);  // outside the top 5
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(count[i] / static_cast<double>(n), want[i], 0.01) << i;
}

TEST(SamplerTest, TopPKeepsTheSmallestNucleus) {
    std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
    SamplingParams p{.top_p = 0.75f};  // 0.5 + 0.3 reaches it: ids 0 and 1 only
    std::vector<int> count(4, 0);
    for (int i = 0; i < 5000; ++i) ++count[sample_token(logits.data(), 4, p, 9, static_cast<uint64_t>(i))];
    EXPECT_EQ(count[2] + count[3], 0);
    EXPECT_NEAR(count[0] / 5000.0, 0.5 / 0.8, 0.03);
    SamplingParams m{.min_p = 0.5f};  // keeps p >= 0.25: ids 0 and 1
    for (int i = 0; i < 2000; ++i) EXPECT_LT(sample_token(logits.data(), 4, m, 3, static_cast<uint64_t>(i)), 2);
}

TEST(SamplerTest, LargeVocabularyNucleusMatchesAFullSort) {
    // The growing partial sort must give the same nucleus as sorting everything.
    auto logits = random_logits(20000, 4, 0.3f);  // flat: the nucleus is large
    SamplingParams p{.top_p = 0.9f};
    const std::vector<int32_t> ids = rank_ids(logits).order;
    double z = 0;
    for (float l : logits) z += std::exp(l - logits[ids[0]]);
    double cum = 0;
    size_t n = 0;
    while (cum < 0.9 * z) cum += std::exp(logits[ids[n++]] - logits[ids[0]]);
    std::vector<uint8_t> in(20000, 0);
    for (size_t i = 0; i < n; ++i) in[ids[i]] = 1;
    for (int i = 0; i < 300; ++i) EXPECT_TRUE(in[sample_token(logits.data(), 20000, p, 5, static_cast<uint64_t>(i))]);
}

// The bucketed top-k / nucleus selections and the vectorized exponentials against a full sort in double, on rows
// of up to o200k's size: every draw ranks inside the top k, inside the reference nucleus (one rank of slack at its
// edge, where float and double exponentials may disagree about the last token), and has p >= min_p (within 1e-5).
TEST(SamplerTest, TruncationsMatchAFullSortInDouble) {
    std::mt19937 rng(17);
    for (int trial = 0; trial < 24; ++trial) {
        const int V = trial % 3 == 0 ? 201088 : 1000 + 3000 * (trial % 5);
        const float scale = trial % 4 == 0 ? 0.3f : trial % 4 == 1 ? 1.0f : trial % 4 == 2 ? 3.0f : 8.0f;
        auto logits = random_logits(V, 100 + trial, scale);
        if (trial % 6 == 5)  // ties across the row
            for (int i = 0; i < V; i += 7) logits[i] = logits[(i * 31) % V];
        if (trial % 8 == 7)  // flat and offset: one bucket of the logit's top bits holds nearly every id
            for (float& l : logits) l = 6.0f + 0.01f * l;
        SamplingParams p;
        p.temperature = std::uniform_real_distribution<float>(0.3f, 1.5f)(rng);
        p.top_k = trial % 2 ? 0 : 1 + static_cast<int>(rng() % 200);
        p.top_p = trial % 3 == 1 ? 1.0f : std::uniform_real_distribution<float>(0.2f, 0.99f)(rng);
        p.min_p = trial % 4 == 3 ? 0.05f : 0.0f;
        const auto [order, rank] = rank_ids(logits);
        std::vector<double> prob(V);
        for (int i = 0; i < V; ++i)
            prob[i] = std::exp((static_cast<double>(logits[i]) - logits[order[0]]) / p.temperature);
        // The reference kept set: top k, then min_p, then the nucleus of what is left (ranks 0..n-1 of `order`).
        size_t n = p.top_k > 0 ? static_cast<size_t>(p.top_k) : static_cast<size_t>(V);
        std::vector<int32_t> kept;
        for (size_t r = 0; r < n; ++r)
            if (prob[order[r]] >= p.min_p) kept.push_back(order[r]);
        double total = 0.0;
        for (int32_t id : kept) total += prob[id];
        size_t nucleus = kept.size();
        if (p.top_p < 1.0f) {
            double acc = 0.0;
            for (size_t j = 0; j < kept.size(); ++j)
                if ((acc += prob[kept[j]]) >= p.top_p * total) {
                    nucleus = j + 1;
                    break;
                }
        }
        const int edge = nucleus < kept.size() ? rank[kept[nucleus - 1]] + 1 : V;  // one rank of slack
        Sampler s(V);
        for (uint64_t d = 0; d < 40; ++d) {
            const int32_t id = s.sample(logits.data(), p, 9, {}, std::vector<int32_t>(d, 0), -1).id;
            ASSERT_GE(id, 0);
            ASSERT_LT(id, V);
            if (p.top_k > 0) {
                EXPECT_LT(rank[id], p.top_k) << trial;
            }
            EXPECT_LE(rank[id], edge) << trial << " nucleus " << nucleus;
            EXPECT_GE(prob[id], p.min_p * (1.0 - 1e-5)) << trial;
            EXPECT_EQ(id, sample_token(logits.data(), V, p, 9, d)) << trial;
        }
    }
}

// ... and not smaller: on a flat row every one of the top 50 is drawn, and draws under top_p 0.5 reach the last
// ranks of the reference nucleus (a selection that dropped the bucket where the cut falls fails both).
TEST(SamplerTest, TruncationsKeepTheWholeSet) {
    const int V = 20000;
    auto logits = random_logits(V, 7, 0.05f);
    const auto [order, rank] = rank_ids(logits);
    std::vector<int> seen(50, 0);
    for (uint64_t d = 0; d < 3000; ++d) {
        const int32_t id = sample_token(logits.data(), V, SamplingParams{.top_k = 50}, 3, d);
        ASSERT_LT(rank[id], 50);
        ++seen[rank[id]];
    }
    for (int r = 0; r < 50; ++r) EXPECT_GT(seen[r], 0) << "rank " << r << " never drawn";
    double total = 0.0, acc = 0.0;
    for (float l : logits) total += std::exp(static_cast<double>(l) - logits[order[0]]);
    int nucleus = 0;
    while (acc < 0.5 * total) acc += std::exp(static_cast<double>(logits[order[nucleus++]]) - logits[order[0]]);
    int deepest = 0;
    for (uint64_t d = 0; d < 3000; ++d)
        deepest = std::max(deepest, rank[sample_token(logits.data(), V, SamplingParams{.top_p = 0.5f}, 4, d)]);
    EXPECT_LE(deepest, nucleus);
    EXPECT_GE(deepest, nucleus * 95 / 100) << "nucleus " << nucleus;  // ~1/3000 of the mass a rank: reached
}

TEST(SamplerTest, PenaltiesAndBiasChangeTheChoice) {
    std::vector<float> logits = {3.0f, 2.9f, 1.0f, -2.0f};
    Sampler s(4);
    SamplingParams greedy{.temperature = 0.0f};
    EXPECT_EQ(s.sample(logits.data(), greedy, 0, {}, {}, -1).id, 0);
    std::vector<int32_t> out = {0};
    SamplingParams pres = greedy;
    pres.presence_penalty = 0.2f;
    EXPECT_EQ(s.sample(logits.data(), pres, 0, {}, out, -1).id, 1);
    SamplingParams freq = greedy;
    freq.frequency_penalty = 0.06f;
    std::vector<int32_t> out2 = {0, 0};
    EXPECT_EQ(s.sample(logits.data(), freq, 0, {}, std::span<const int32_t>(out2).first(1), -1).id, 0);  // 3 - 0.06
    EXPECT_EQ(s.sample(logits.data(), freq, 0, {}, out2, -1).id, 1);                                     // 3 - 0.12
    SamplingParams rep = greedy;
    rep.repetition_penalty = 1.1f;  // 3 / 1.1 < 2.9; the prompt counts too
    std::vector<int32_t> prompt = {0};
    EXPECT_EQ(s.sample(logits.data(), rep, 0, prompt, {}, -1).id, 1);
    std::vector<float> neg = {-1.0f, -1.05f};
    Sampler s2(2);
    EXPECT_EQ(s2.sample(neg.data(), rep, 0, prompt, {}, -1).id, 1);  // negative logits are multiplied
    SamplingParams bias = greedy;
    bias.logit_bias = {{3, 10.0f}};
    EXPECT_EQ(s.sample(logits.data(), bias, 0, {}, {}, -1).id, 3);
}

TEST(SamplerTest, LogprobsComeFromTheRawLogits) {
    auto logits = random_logits(300, 5);
    Sampler s(300);
    SamplingParams p{.temperature = 0.8f};
    p.logit_bias = {{7, 5.0f}};
    SampledToken t = s.sample(logits.data(), p, 11, {}, {}, 5);
    double z = 0;
    for (float l : logits) z += std::exp(static_cast<double>(l));
    EXPECT_NEAR(t.logprob, logits[t.id] - std::log(z), 1e-4);
    ASSERT_EQ(t.top_logprobs.size(), 5u);
    EXPECT_EQ(t.top_logprobs[0].id, argmax(logits));
    for (size_t i = 1; i < 5; ++i) EXPECT_GE(t.top_logprobs[i - 1].logprob, t.top_logprobs[i].logprob);
    EXPECT_TRUE(s.sample(logits.data(), p, 11, {}, {}, 0).top_logprobs.empty());
}

TEST(SamplerTest, ValidationNamesTheBadField) {
    EXPECT_TRUE(validate_sampling_params({}, 10).ok());
    EXPECT_NE(validate_sampling_params({.temperature = -1}, 10).message().find("temperature"), std::string::npos);
    EXPECT_NE(validate_sampling_params({.top_p = 0}, 10).message().find("top_p"), std::string::npos);
    EXPECT_NE(validate_sampling_params({.top_k = -2}, 10).message().find("top_k"), std::string::npos);
    EXPECT_NE(validate_sampling_params({.min_p = 2}, 10).message().find("min_p"), std::string::npos);
    SamplingParams r;
    r.repetition_penalty = 0;
    EXPECT_NE(validate_sampling_params(r, 10).message().find("repetition_penalty"), std::string::npos);
    SamplingParams b;
    b.logit_bias = {{10, 1.0f}};
    EXPECT_NE(validate_sampling_params(b, 10).message().find("logit_bias"), std::string::npos);
    // An id twice (JSON keys "7" and "07"): refused, since the device applies a row's edits in parallel.
    b.logit_bias = {{7, 1.0f}, {3, 0.5f}, {7, -2.0f}};
    const Status dup = validate_sampling_params(b, 10);
    EXPECT_NE(dup.message().find("token id 7 appears more than once"), std::string::npos) << dup.to_string();
    b.logit_bias = {{7, 1.0f}, {3, 0.5f}};
    EXPECT_TRUE(validate_sampling_params(b, 10).ok());
}

// The edits a draw applies: bias, then repetition over the prompt's and output's ids once each, then frequency and
// presence per output id, each list without repeats.
TEST(SamplerTest, LogitEditsListEachIdOnce) {
    SamplingParams p;
    p.logit_bias = {{4, 2.0f}};
    p.repetition_penalty = 1.5f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    const std::vector<int32_t> prompt = {1, 2, 2}, output = {2, 5, 5, 5};
    const LogitEdits e = logit_edits(p, prompt, output);
    ASSERT_EQ(e.add.size(), 1u);
    EXPECT_EQ(e.repeat, (std::vector<int32_t>{1, 2, 5}));
    EXPECT_EQ(e.repetition, 1.5f);
    ASSERT_EQ(e.subtract.size(), 2u);
    EXPECT_EQ(e.subtract[0], (std::pair<int32_t, float>{2, 0.25f + 0.5f}));
    EXPECT_EQ(e.subtract[1], (std::pair<int32_t, float>{5, 0.25f * 3 + 0.5f}));
    std::vector<float> row = {1.0f, 3.0f, -2.0f, 0.5f, 0.0f, 6.0f};
    apply_logit_edits(e, row.data());
    EXPECT_EQ(row, (std::vector<float>{1.0f, 3.0f / 1.5f, -2.0f * 1.5f - 0.75f, 0.5f, 2.0f, 6.0f / 1.5f - 1.25f}));
    EXPECT_TRUE(logit_edits(SamplingParams{}, prompt, output).empty());
}

}  // namespace
}  // namespace gptoss::runtime

namespace gptoss::runtime {
namespace {

// A broken logits row (NaN, as a faulty backend could produce) must still give an in-range id:
// an out-of-range id would index the penalty tables and the KV bookkeeping.
TEST(SamplerTest, NonFiniteLogitsStillGiveAnInRangeId) {
    const int V = 1000;
    Sampler s(V);
    std::vector<float> nan_row(V, std::nanf(""));
    std::vector<float> some_nan(V, 0.0f);
    for (int i = 0; i < V; i += 3) some_nan[i] = std::nanf("");
    some_nan[7] = 5.0f;
    for (float temperature : {0.0f, 0.7f}) {
        for (float top_p : {1.0f, 0.5f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_p = top_p;
            for (uint64_t seed = 0; seed < 20; ++seed) {
                SampledToken a = s.sample(nan_row.data(), p, seed, {}, {}, -1);
                EXPECT_GE(a.id, 0);
                EXPECT_LT(a.id, V);
                SampledToken b = s.sample(some_nan.data(), p, seed, {}, {}, -1);
                EXPECT_GE(b.id, 0);
                EXPECT_LT(b.id, V);
                EXPECT_NE(b.id % 3, 0) << "a NaN logit was drawn";
            }
        }
    }
}

// A mask (structured outputs) draws over the allowed tokens alone: the same token as the draw over the whole row
// with every other logit -inf, for every truncation, and always an allowed one.
TEST(SamplerTest, MaskedDrawsEqualTheFullRowWithTheRestAtMinusInfinity) {
    const int V = 5000;
    Sampler s(V);
    std::mt19937 rng(21);
    int checked = 0;
    for (int trial = 0; trial < 60; ++trial) {
        const std::vector<float> logits = random_logits(V, 100 + static_cast<uint32_t>(trial), 3.0f);
        std::vector<uint8_t> mask(V, 0);
        const int every = 1 + static_cast<int>(rng() % 50);
        for (int i = static_cast<int>(rng() % 7); i < V; i += every) mask[static_cast<size_t>(i)] = 1;
        std::vector<float> masked = logits;
        for (int i = 0; i < V; ++i)
            if (!mask[static_cast<size_t>(i)]) masked[static_cast<size_t>(i)] = -INFINITY;
        SamplingParams p;
        p.temperature = trial % 5 == 0 ? 0.0f : 0.3f + 0.2f * static_cast<float>(trial % 6);
        p.top_k = trial % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % 200);
        p.top_p = trial % 4 == 0 ? 1.0f : 0.5f + 0.1f * static_cast<float>(trial % 5);
        p.min_p = trial % 7 == 0 ? 0.05f : 0.0f;
        for (uint64_t seed = 0; seed < 20; ++seed) {
            const SampledToken a = s.sample(logits.data(), p, seed, {}, {}, -1, mask.data());
            ASSERT_TRUE(mask[static_cast<size_t>(a.id)]) << trial;
            EXPECT_EQ(a.id, sample_token(masked.data(), V, p, seed, 0)) << "trial " << trial << " seed " << seed;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 1200);
}

}  // namespace
}  // namespace gptoss::runtime
