// Helpers for the engine tests: run requests through an engine and through an independent
// reference (model::SingleSequence + the same Sampler/StopChecker, one request at a time, no paging,
// no scheduler), and the invariance checks shared by the random-checkpoint and fixture tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "model/gpt_oss_forward.h"
#include "model/gpt_oss_weights.h"
#include "model/random_checkpoint.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/engine.h"

namespace gptoss::runtime::testing {

// Prompt logprobs equal: ranks and top ids exactly, logprobs within `tol`.
inline bool same_prompt_logprobs(const std::vector<PromptLogprob>& a, const std::vector<PromptLogprob>& b, float tol) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].rank != b[i].rank || a[i].top.size() != b[i].top.size() ||
            std::fabs(a[i].logprob - b[i].logprob) > tol)
            return false;
        for (size_t k = 0; k < a[i].top.size(); ++k)
            if (a[i].top[k].id != b[i].top[k].id || std::fabs(a[i].top[k].logprob - b[i].top[k].logprob) > tol)
                return false;
    }
    return true;
}

// A gate a model runner's forward passes through: pass() marks it entered and waits until the test calls open();
// wait_entered() waits for the first pass. Tests use it to hold the engine's first step while they queue more.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, opened = false;
    void pass() {
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return opened; });
    }
    void wait_entered() {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return entered; });
    }
    void open() {
        std::lock_guard<std::mutex> lock(mu);
        opened = true;
        cv.notify_all();
    }
};

struct Generation {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;
    std::vector<PromptLogprob> prompt_lps;  // Request::prompt_logprobs, from the first event
    FinishReason finish = FinishReason::kError;
    int num_cached_tokens = 0;
    int trim_bytes = 0;

    bool same_tokens(const Generation& o) const {
        return ids == o.ids && logprobs == o.logprobs && finish == o.finish &&
               same_prompt_logprobs(prompt_lps, o.prompt_lps, 0.0f);
    }
    // Same ids and finish; logprobs within `tol` (sums regrouped across simulated ranks).
    bool same_tokens(const Generation& o, float tol) const {
        if (tol == 0.0f) return same_tokens(o);
        if (ids != o.ids || finish != o.finish || logprobs.size() != o.logprobs.size()) return false;
        for (size_t i = 0; i < logprobs.size(); ++i)
            if (std::fabs(logprobs[i] - o.logprobs[i]) > tol) return false;
        return same_prompt_logprobs(prompt_lps, o.prompt_lps, tol);
    }
};

inline std::string describe(const Generation& g) {
    std::string s = std::string(finish_reason_name(g.finish)) + " [";
    for (int32_t id : g.ids) s += std::to_string(id) + " ";
    return s + "]";
}

// Reads a handle to its final event.
inline Generation collect(RequestHandle& h) {
    Generation g;
    while (auto ev = h.next(std::chrono::milliseconds(60000))) {
        if (!ev->prompt_logprobs.empty()) g.prompt_lps = std::move(ev->prompt_logprobs);
        if (ev->id >= 0) {
            g.ids.push_back(ev->id);
            g.logprobs.push_back(ev->logprob);
            g.top.push_back(ev->top_logprobs);
        }
        if (ev->is_final()) {
            g.finish = *ev->finish_reason;
            g.num_cached_tokens = ev->num_cached_tokens;
            g.trim_bytes = ev->trim_bytes;
            return g;
        }
    }
    ADD_FAILURE() << "no final event within 60 s";
    return g;
}

// The request generated alone by the unpaged single-sequence decoder.
inline Generation reference_generate(const model::GptOssWeights& w, const Request& r,
                                     const Detokenizer* detok = nullptr) {
    Generation g;
    const int total = static_cast<int>(r.prompt.size()) + r.max_tokens;
    model::SingleSequence seq(w, total, 8);
    Sampler sampler(w.config.vocab_size);
    StopChecker stop(r.stop_ids, r.stop_strings, r.max_tokens, detok, r.min_tokens);
    const uint64_t seed = r.sampling.seed.value_or(0);
    std::vector<float> logits;
    // With prompt logprobs, every prompt position's row: row p scores prompt token p + 1, the last samples.
    const bool score = r.prompt_logprobs >= 0;
    Status st = seq.append(r.prompt, score, &logits);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (score) {
        const size_t V = static_cast<size_t>(w.config.vocab_size);
        for (size_t p = 0; p + 1 < r.prompt.size(); ++p)
            g.prompt_lps.push_back(sampler.score(logits.data() + p * V, r.prompt[p + 1], r.prompt_logprobs));
        logits.erase(logits.begin(), logits.end() - static_cast<long>(V));
    }
    std::vector<uint8_t> mask;
    for (;;) {
        // min_tokens: stop ids masked; bad_words: a sequence's last id where the output ends with the rest.
        mask.assign(static_cast<size_t>(w.config.vocab_size), 1);
        bool masked = false;
        if (static_cast<int>(g.ids.size()) < r.min_tokens)
            for (int32_t id : r.stop_ids) masked = true, mask[static_cast<size_t>(id)] = 0;
        for (const std::vector<int32_t>& b : r.bad_words) {
            const size_t n = b.size() - 1;
            if (g.ids.size() >= n && std::equal(b.begin(), b.end() - 1, g.ids.end() - static_cast<std::ptrdiff_t>(n)))
                masked = true, mask[static_cast<size_t>(b.back())] = 0;
        }
        SampledToken t = sampler.sample(logits.data(), r.sampling, seed, r.prompt, g.ids, r.logprobs,
                                        masked ? mask.data() : nullptr);
        g.ids.push_back(t.id);
        g.logprobs.push_back(t.logprob);
        g.top.push_back(t.top_logprobs);
        if (auto s = stop.push(t.id, static_cast<int>(g.ids.size()))) {
            g.finish = s->reason;
            g.trim_bytes = s->trim_bytes;
            return g;
        }
        logits.clear();
        st = seq.append(std::span<const int32_t>(&t.id, 1), false, &logits);
        if (!st.ok()) {
            ADD_FAILURE() << st.to_string();
            return g;
        }
    }
}

// A 3-layer random gpt-oss (hidden 64, 8 / 1 heads, 6 experts, window 5: sliding, full, sliding)
// small enough for engine tests on the CPU; EOS 1, pad 2.
inline model::GptOssConfig small_engine_config(int vocab_size, int max_position_embeddings) {
    auto c = model::GptOssConfig::preset("tiny");
    EXPECT_TRUE(c.ok());
    model::GptOssConfig cfg = *c;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 64;
    cfg.num_hidden_layers = 3;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 1;
    cfg.num_experts = 6;
    cfg.vocab_size = vocab_size;
    cfg.sliding_window = 5;
    cfg.max_position_embeddings = max_position_embeddings;
    cfg.layer_types = {model::LayerType::kSlidingAttention, model::LayerType::kFullAttention,
                       model::LayerType::kSlidingAttention};
    cfg.eos_token_ids = {1};
    cfg.pad_token_id = 2;
    cfg.bos_token_id.reset();
    return cfg;
}

// Writes a random checkpoint of `c` into a fresh temporary directory named `name` + pid (set in
// *dir) and loads it. For a suite's SetUpTestSuite; remove_checkpoint(*dir) in TearDownTestSuite.
inline std::shared_ptr<const model::GptOssWeights> load_random_checkpoint(const model::GptOssConfig& c, uint64_t seed,
                                                                          const std::string& name, std::string* dir) {
    *dir = (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))).string();
    model::RandomCheckpointOptions opt;
    opt.seed = seed;
    Status st = model::write_random_checkpoint(c, *dir, opt);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return nullptr;
    auto w = model::GptOssWeights::load(*dir);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return w.ok() ? std::shared_ptr<const model::GptOssWeights>(std::move(*w)) : nullptr;
}
inline void remove_checkpoint(const std::string& dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

// A test suite on one random checkpoint, written and loaded once for the suite (weights_) and
// removed after it. Derived (CRTP) gives `static model::GptOssConfig config()`, `kSeed` and `kName`
// (the temporary directory's prefix).
template <class Derived>
class RandomCheckpointTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        weights_ = load_random_checkpoint(Derived::config(), Derived::kSeed, Derived::kName, &dir_);
    }
    static void TearDownTestSuite() {
        weights_.reset();
        remove_checkpoint(dir_);
    }
    static inline std::string dir_;
    static inline std::shared_ptr<const model::GptOssWeights> weights_;
};

// The engine tests' small engine: blocks of 4 (full / sliding counts as given), 16 sequences, 24
// tokens a step.
inline EngineConfig small_engine_test_config(int full_blocks = 256, int sliding_blocks = 128) {
    EngineConfig c;
    c.block_size = 4;
    c.kv_budget = KvBudget{.num_blocks_full = full_blocks, .num_blocks_sliding = sliding_blocks};
    c.scheduler = SchedulerConfig{.max_num_seqs = 16, .max_num_batched_tokens = 24};
    return c;
}

inline std::unique_ptr<Engine> make_engine(std::shared_ptr<const model::GptOssWeights> w, EngineConfig cfg,
                                           const parallel::ParallelConfig& layout = {}) {
    auto e = Engine::create(std::make_unique<CpuModelRunner>(std::move(w), layout), std::move(cfg));
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
}

inline std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return ids;
}

// A mix of greedy and seeded requests; prompt lengths from 1 to well past the sliding window.
inline std::vector<Request> mixed_requests(int vocab, int window, int count, int max_tokens, uint32_t seed) {
    std::vector<Request> reqs;
    std::mt19937 rng(seed);
    const int lens[] = {1, 3, window - 1, window + 1, 2 * window + 3, 3 * window + 5};
    for (int i = 0; i < count; ++i) {
        Request r;
        r.prompt = random_ids(std::max(1, lens[i % 6] + static_cast<int>(rng() % 3)), vocab, seed * 100 + i);
        r.max_tokens = max_tokens - static_cast<int>(rng() % 3);
        switch (i % 4) {
            case 0: r.sampling = SamplingParams{.temperature = 0.0f}; break;
            case 1: r.sampling = SamplingParams{.temperature = 1.0f, .seed = 1000 + i}; break;
            case 2: r.sampling = SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 77}; break;
            case 3:
                r.sampling = SamplingParams{.temperature = 1.2f, .min_p = 0.05f, .seed = 5 + i};
                r.sampling.frequency_penalty = 0.5f;
                r.sampling.presence_penalty = 0.3f;
                r.sampling.repetition_penalty = 1.2f;
                r.sampling.logit_bias = {{static_cast<int32_t>(i % vocab), 2.0f}};
                break;
        }
        r.logprobs = i % 3 == 0 ? 3 : (i % 3 == 1 ? 0 : -1);
        r.prompt_logprobs = i % 5 == 2 ? 2 : (i % 5 == 4 ? 0 : -1);
        reqs.push_back(r);
    }
    return reqs;
}

inline Request copy_request(const Request& r) { return r; }

// Every request of `reqs` in one concurrent run, the second half joining after the first half has
// produced tokens, each result compared with the reference. `cfg` sets the engine's budget.
inline void expect_batch_matches_reference(std::shared_ptr<const model::GptOssWeights> w, EngineConfig cfg,
                                           const std::vector<Request>& reqs, EngineStats* stats_out = nullptr,
                                           const parallel::ParallelConfig& layout = {}, float logprob_tol = 0.0f) {
    std::vector<Generation> want;
    for (const Request& r : reqs) want.push_back(reference_generate(*w, r));
    auto engine = make_engine(w, cfg, layout);
    ASSERT_TRUE(engine);
    const size_t first = (reqs.size() + 1) / 2;
    std::vector<RequestHandle> handles;
    for (size_t i = 0; i < first; ++i) {
        auto h = engine->submit(copy_request(reqs[i]));
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        handles.push_back(std::move(*h));
    }
    // Wait for the first request's first two tokens, then let the rest join mid-flight.
    std::vector<Generation> got(reqs.size());
    for (int k = 0; k < 2; ++k) {
        auto ev = handles[0].next(std::chrono::milliseconds(60000));
        ASSERT_TRUE(ev);
        if (!ev->prompt_logprobs.empty()) got[0].prompt_lps = std::move(ev->prompt_logprobs);
        if (ev->id >= 0) {
            got[0].ids.push_back(ev->id);
            got[0].logprobs.push_back(ev->logprob);
        }
        if (ev->is_final()) {
            got[0].finish = *ev->finish_reason;
            break;
        }
    }
    const bool first_done = got[0].finish != FinishReason::kError;
    for (size_t i = first; i < reqs.size(); ++i) {
        auto h = engine->submit(copy_request(reqs[i]));
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        handles.push_back(std::move(*h));
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
        if (i == 0) {
            if (!first_done) {
                Generation rest = collect(handles[0]);
                got[0].ids.insert(got[0].ids.end(), rest.ids.begin(), rest.ids.end());
                got[0].logprobs.insert(got[0].logprobs.end(), rest.logprobs.begin(), rest.logprobs.end());
                got[0].finish = rest.finish;
            }
        } else {
            got[i] = collect(handles[i]);
        }
        EXPECT_TRUE(got[i].same_tokens(want[i], logprob_tol))
            << "request " << i << " (prompt " << reqs[i].prompt.size() << "): engine " << describe(got[i])
            << " vs alone " << describe(want[i]);
    }
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EngineStats st = engine->stats();
    EXPECT_EQ(st.num_blocks_in_use.full, 0);
    EXPECT_EQ(st.num_blocks_in_use.sliding, 0);
    if (stats_out) *stats_out = st;
}

// Prefix-cache invariance: the same prompt again, and a prompt sharing a long prefix, hit the
// cache and give exactly what they give cold.
inline void expect_prefix_hits_equal_cold(std::shared_ptr<const model::GptOssWeights> w, EngineConfig cfg,
                                          int prefix_len, uint32_t seed) {
    const int V = w->config.vocab_size;
    std::vector<int32_t> prefix = random_ids(prefix_len, V, seed);
    Request a{.prompt = prefix, .sampling = {.temperature = 0.0f}, .max_tokens = 6};
    a.prompt.push_back(1);
    Request b = a;
    b.prompt.back() = 2;
    b.prompt.push_back(3);
    b.sampling = SamplingParams{.temperature = 1.0f, .top_k = 20, .seed = 4};
    auto engine = make_engine(w, cfg);
    ASSERT_TRUE(engine);
    auto run = [&](const Request& r) {
        auto h = engine->submit(copy_request(r));
        EXPECT_TRUE(h.ok());
        return h.ok() ? collect(*h) : Generation{};
    };
    Generation a_cold = run(a);
    EXPECT_EQ(a_cold.num_cached_tokens, 0);
    Generation a_hit = run(a);
    Generation b_hit = run(b);
    const int bs = cfg.block_size;
    EXPECT_EQ(a_hit.num_cached_tokens, (static_cast<int>(a.prompt.size()) - 1) / bs * bs);
    EXPECT_GE(b_hit.num_cached_tokens, prefix_len / bs * bs - bs);
    EXPECT_GT(b_hit.num_cached_tokens, 0);
    EXPECT_TRUE(a_hit.same_tokens(a_cold)) << describe(a_hit) << " vs " << describe(a_cold);
    EXPECT_TRUE(a_cold.same_tokens(reference_generate(*w, a)));
    EXPECT_TRUE(b_hit.same_tokens(reference_generate(*w, b))) << describe(b_hit);
    // Concurrent requests sharing the prefix (some hit blocks another is still using).
    std::vector<RequestHandle> hs;
    std::vector<Request> rs;
    for (int i = 0; i < 6; ++i) {
        Request r = b;
        r.prompt.push_back(static_cast<int32_t>(10 + i));
        r.sampling.seed = 100 + i;
        rs.push_back(r);
        auto h = engine->submit(copy_request(r));
        ASSERT_TRUE(h.ok());
        hs.push_back(std::move(*h));
    }
    for (int i = 0; i < 6; ++i) {
        Generation g = collect(hs[i]);
        EXPECT_GT(g.num_cached_tokens, 0);
        EXPECT_TRUE(g.same_tokens(reference_generate(*w, rs[i]))) << i << ": " << describe(g);
    }
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_EQ(engine->stats().num_blocks_in_use.full, 0);
    EXPECT_GT(engine->stats().num_cached_prompt_tokens, 0);
}

}  // namespace gptoss::runtime::testing
