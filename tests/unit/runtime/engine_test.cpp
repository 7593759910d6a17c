// The engine on a small random checkpoint (written to a temp dir): batch invariance against an
// unpaged single-sequence reference (greedy and seeded; prompts longer than the sliding window;
// requests joining mid-flight), prefix-cache invariance, preemption under a tiny KV budget,
// random submit/cancel leaving no block allocated, stops, and request validation.
#include "runtime/engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "engine_test_util.h"
#include "model/gpt_oss_forward.h"
#include "model/random_checkpoint.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/token_constraint.h"

namespace gptoss::runtime {
namespace {

namespace fs = std::filesystem;
using namespace gptoss::runtime::testing;

model::GptOssConfig small_config() { return small_engine_config(300, 96); }

EngineConfig test_config(int full_blocks = 256, int sliding_blocks = 128) {
    return small_engine_test_config(full_blocks, sliding_blocks);
}

class EngineTest : public RandomCheckpointTest<EngineTest> {
public:
    static model::GptOssConfig config() { return small_config(); }
    static constexpr uint64_t kSeed = 11;
    static constexpr const char* kName = "gptoss_engine_test_";
};

TEST_F(EngineTest, SingleRequestMatchesTheUnpagedReference) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    for (int len : {1, 4, 5, 17, 40}) {
        Request r{.prompt = random_ids(len, 300, len), .sampling = {.temperature = 0.0f}, .max_tokens = 12};
        auto h = engine->submit(r);
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        Generation g = collect(*h);
        Generation want = reference_generate(*weights_, r);
        EXPECT_TRUE(g.same_tokens(want)) << len << ": " << describe(g) << " vs " << describe(want);
        EXPECT_EQ(g.finish, FinishReason::kLength);
        EXPECT_EQ(g.ids.size(), 12u);
    }
}

// The engine marks a request's progress at every step it takes part in, prefill chunks included:
// an 80-token prompt at 24 tokens a step is marked before its first token exists (the server's
// stall timeout reads this, so a long prefill is not a stall).
TEST_F(EngineTest, PrefillChunksMarkProgressBeforeTheFirstToken) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    auto h =
        engine->submit(Request{.prompt = random_ids(80, 300, 5), .sampling = {.temperature = 0.0f}, .max_tokens = 2});
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::chrono::steady_clock::time_point first_mark{};
    while (first_mark == std::chrono::steady_clock::time_point{} && std::chrono::steady_clock::now() < deadline) {
        first_mark = h->last_progress();
        std::this_thread::yield();
    }
    ASSERT_NE(first_mark, std::chrono::steady_clock::time_point{}) << "no progress marked";
    std::optional<TokenEvent> first = h->next(std::chrono::milliseconds(20000));
    ASSERT_TRUE(first.has_value());
    EXPECT_LE(first_mark, first->time);
    EXPECT_GE(h->last_progress(), first_mark);
}

// A runner that samples "on the device" the way the CUDA runner does: the CPU forward, then an
// arg-max per row (ties to the lower id) for the rows it draws, and the logits of the rows that ask
// for them (id -1). It counts which path each row took.
// With host_idle, it says its forward leaves the engine's thread idle (as the CUDA runner does), and sleeps
// forward_sleep first (a stand-in for the GPU's time), so the engine computes constraint masks beside it.
class DeviceSamplingRunner : public ModelRunner {
public:
    explicit DeviceSamplingRunner(std::shared_ptr<const model::GptOssWeights> w, bool host_idle = false,
                                  std::chrono::milliseconds forward_sleep = {}, bool defer = false)
        : inner_(std::move(w)), host_idle_(host_idle), forward_sleep_(forward_sleep), defer_(defer) {}
    bool host_idle_during_forward() const override { return host_idle_; }
    // With defer: rows asked to defer come back -2 and draw_deferred takes the arg-max of the allowed ids.
    bool can_defer_draws() const override { return defer_; }
    Status draw_deferred(std::span<const DeferredDraw> draws, std::vector<int32_t>* ids) override {
        const size_t V = static_cast<size_t>(config().vocab_size);
        for (const DeferredDraw& d : draws) {
            if (d.row < 0 || static_cast<size_t>(d.row) >= deferred_.size() || !deferred_[d.row])
                return internal_error("row " + std::to_string(d.row) + " was not deferred");
            deferred_[d.row] = false;
            const float* r = rows_.data() + static_cast<size_t>(d.row) * V;
            std::vector<float> edited;
            if (d.edits != nullptr) {  // the host sampler's bias and penalties, as the device applies them
                edited.assign(r, r + V);
                apply_logit_edits(*d.edits, edited.data());
                r = edited.data();
            }
            int32_t best = -1;
            for (size_t t = 0; t < V; ++t)
                if ((d.allowed == nullptr || d.allowed[t]) && (best < 0 || r[t] > r[best]))
                    best = static_cast<int32_t>(t);
            ++deferred_rows;
            ids->push_back(best);
        }
        return ok_status();
    }
    const model::GptOssConfig& config() const override { return inner_.config(); }
    KvGeometry kv_geometry(int block_size) const override { return inner_.kv_geometry(block_size); }
    size_t free_memory_bytes() const override { return inner_.free_memory_bytes(); }
    Status allocate_kv_cache(int block_size, KvBlockCounts counts) override {
        return inner_.allocate_kv_cache(block_size, counts);
    }
    Status forward(const Batch& batch, std::vector<float>* logits) override {
        ++host_steps;
        std::this_thread::sleep_for(forward_sleep_);
        return inner_.forward(batch, logits);
    }
    bool samples_on_device() const override { return true; }
    Status forward_sample(const Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                          std::vector<float>* logits) override {
        std::this_thread::sleep_for(forward_sleep_);
        rows_.clear();
        RETURN_IF_ERROR(inner_.forward(batch, &rows_));
        const size_t V = static_cast<size_t>(config().vocab_size);
        if (rows_.size() != params.size() * V) return internal_error("one parameter set per sampled row");
        deferred_.assign(params.size(), false);
        for (size_t i = 0; i < params.size(); ++i) {
            const float* r = rows_.data() + i * V;
            if (params[i].defer && defer_) {
                deferred_[i] = true;
                ids->push_back(-2);
            } else if (params[i].want_logits || params[i].defer) {
                ++host_rows;
                ids->push_back(-1);
                logits->insert(logits->end(), r, r + V);
            } else {
                ++device_rows;
                ids->push_back(static_cast<int32_t>(std::max_element(r, r + V) - r));
            }
        }
        return ok_status();
    }
    std::atomic<int> device_rows{0}, host_rows{0}, host_steps{0}, deferred_rows{0};

private:
    CpuModelRunner inner_;
    bool host_idle_;
    std::chrono::milliseconds forward_sleep_;
    bool defer_;
    std::vector<float> rows_;
    std::vector<bool> deferred_;
};

// The engine with a runner that samples on the device: greedy requests take the device draw, and
// requests with logprobs, penalties or a logit bias get their logits rows in the same steps and
// the host sampler, or, where the runner defers draws, the penalty and bias ones a deferred draw with their edits.
// Every request's tokens (and logprobs) equal the all-host engine's.
TEST_F(EngineTest, DeviceSamplingRunnerMatchesHostSampling) {
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i)
        reqs.push_back(
            Request{.prompt = random_ids(3 + 5 * i, 300, 70 + i), .sampling = {.temperature = 0.0f}, .max_tokens = 9});
    Request lp{.prompt = random_ids(7, 300, 80), .sampling = {.temperature = 0.0f}, .max_tokens = 9};
    lp.logprobs = 3;
    reqs.push_back(lp);
    reqs.push_back(Request{.prompt = random_ids(6, 300, 81),
                           .sampling = {.temperature = 0.0f, .frequency_penalty = 0.7f},
                           .max_tokens = 9});
    reqs.push_back(Request{.prompt = random_ids(5, 300, 82),
                           .sampling = {.temperature = 0.0f, .logit_bias = {{17, 5.0f}}},
                           .max_tokens = 9});
    auto run = [&](Engine& engine) {
        std::vector<RequestHandle> hs;
        for (const Request& r : reqs) {
            auto h = engine.submit(r);
            EXPECT_TRUE(h.ok()) << h.status().to_string();
            if (h.ok()) hs.push_back(std::move(*h));
        }
        std::vector<Generation> out;
        for (auto& h : hs) out.push_back(collect(h));
        return out;
    };
    auto host_engine = make_engine(weights_, test_config());
    ASSERT_TRUE(host_engine);
    const std::vector<Generation> want = run(*host_engine);
    for (int mode = 0; mode < 3; ++mode) {
        const bool device = mode != 1, defer = mode == 2;
        auto runner = std::make_unique<DeviceSamplingRunner>(weights_, false, std::chrono::milliseconds{}, defer);
        DeviceSamplingRunner* r = runner.get();
        EngineConfig cfg = test_config();
        cfg.device_sampling = device;
        auto engine = Engine::create(std::move(runner), cfg);
        ASSERT_TRUE(engine.ok()) << engine.status().to_string();
        const std::vector<Generation> got = run(**engine);  // the engine (and `r`) live on below
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_TRUE(got[i].same_tokens(want[i]))
                << device << " " << i << ": " << describe(got[i]) << " vs " << describe(want[i]);
        if (defer) {
            EXPECT_EQ(r->host_steps, 0);
            EXPECT_EQ(r->device_rows, 4 * 9);    // the greedy requests' draws
            EXPECT_EQ(r->host_rows, 9);          // logprobs
            EXPECT_EQ(r->deferred_rows, 2 * 9);  // penalty, bias: edited on the "device"
        } else if (device) {
            EXPECT_EQ(r->host_steps, 0);
            EXPECT_EQ(r->device_rows, 4 * 9);  // the greedy requests' draws
            EXPECT_EQ(r->host_rows, 3 * 9);    // logprobs, penalty, bias
        } else {
            EXPECT_GT(r->host_steps, 0);
            EXPECT_EQ(r->device_rows + r->host_rows, 0);
        }
    }
}

// Prompt logprobs (vLLM's prompt_logprobs): every prompt token from the second scored under the rows
// before it, equal to the unpaged reference's all-rows forward, with chunks of at most 5 scored
// tokens a step shared by two scoring requests, a prompt whose prefix is cached (scored whole
// anyway), a request without them beside, and on a runner that samples on the device.
TEST_F(EngineTest, PromptLogprobsScoreEveryPromptToken) {
    std::vector<Request> reqs;
    const std::vector<int32_t> shared = random_ids(40, 300, 91);
    reqs.push_back(Request{.prompt = shared, .sampling = {.temperature = 0.0f}, .max_tokens = 3});
    Request scored = reqs[0];
    scored.prompt_logprobs = 3;
    reqs.push_back(scored);
    Request second{.prompt = random_ids(17, 300, 92), .sampling = {.temperature = 0.0f}, .max_tokens = 4};
    second.prompt_logprobs = 0;
    second.logprobs = 2;
    reqs.push_back(second);
    Request one{.prompt = {7}, .sampling = {.temperature = 0.0f}, .max_tokens = 2};  // nothing to score
    one.prompt_logprobs = 5;
    reqs.push_back(one);
    std::vector<Generation> want;
    for (const Request& r : reqs) want.push_back(reference_generate(*weights_, r));
    ASSERT_EQ(want[1].prompt_lps.size(), 39u);
    for (size_t p = 0; p < want[1].prompt_lps.size(); ++p) {  // the reference's own consistency
        const PromptLogprob& lp = want[1].prompt_lps[p];
        ASSERT_EQ(lp.top.size(), 3u);
        EXPECT_LE(lp.logprob, 0.0f);
        EXPECT_EQ(lp.rank == 1, lp.top[0].id == shared[p + 1] || lp.logprob == lp.top[0].logprob) << p;
        EXPECT_GE(lp.top[0].logprob, lp.logprob);
    }
    for (bool device : {false, true}) {
        EngineConfig cfg = test_config();
        cfg.scheduler.max_scored_tokens = 5;
        cfg.device_sampling = device;
        auto runner = std::make_unique<DeviceSamplingRunner>(weights_);
        auto engine = Engine::create(std::move(runner), cfg);
        ASSERT_TRUE(engine.ok()) << engine.status().to_string();
        std::vector<Generation> got;
        auto h0 = (*engine)->submit(reqs[0]);  // caches the shared prompt's blocks
        ASSERT_TRUE(h0.ok());
        got.push_back(collect(*h0));
        std::vector<RequestHandle> hs;
        for (size_t i = 1; i < reqs.size(); ++i) {
            auto h = (*engine)->submit(reqs[i]);
            ASSERT_TRUE(h.ok()) << h.status().to_string();
            hs.push_back(std::move(*h));
        }
        for (auto& h : hs) got.push_back(collect(h));
        for (size_t i = 0; i < reqs.size(); ++i)
            EXPECT_TRUE(got[i].same_tokens(want[i]))
                << device << " " << i << ": " << describe(got[i]) << " (" << got[i].prompt_lps.size()
                << " prompt logprobs) vs " << describe(want[i]);
        EXPECT_EQ(got[1].num_cached_tokens, 0) << "a scored prompt reuses no cached prefix";
        EXPECT_EQ(got[2].prompt_lps.size(), 16u);
        ASSERT_TRUE((*engine)->wait_idle(std::chrono::milliseconds(60000)));
        EngineStats st = (*engine)->stats();
        EXPECT_EQ(st.num_blocks_in_use.full, 0);
        // The same prompt without prompt logprobs afterwards still hits the cache.
        auto again = (*engine)->submit(reqs[0]);
        ASSERT_TRUE(again.ok());
        Generation g = collect(*again);
        EXPECT_TRUE(g.same_tokens(want[0]));
        EXPECT_GT(g.num_cached_tokens, 0);
    }
}

// `reqs` at once on a DeviceSamplingRunner (drawing on the "device" or not), speculation on; each one's tokens.
std::vector<Generation> run_on_sampling_runner(std::shared_ptr<const model::GptOssWeights> w,
                                               const std::vector<Request>& reqs, bool device) {
    EngineConfig cfg = test_config();
    cfg.device_sampling = device;
    cfg.speculative = SpeculativeConfig{.num_tokens = 3, .ngram_min = 1, .ngram_max = 3, .max_running = 0};
    auto engine = Engine::create(std::make_unique<DeviceSamplingRunner>(std::move(w)), cfg);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return {};
    std::vector<RequestHandle> hs;
    for (const Request& q : reqs) {
        auto h = (*engine)->submit(q);
        EXPECT_TRUE(h.ok()) << h.status().to_string();
        if (!h.ok()) return {};
        hs.push_back(std::move(*h));
    }
    std::vector<Generation> out;
    for (auto& h : hs) out.push_back(collect(h));
    return out;
}

// min_tokens (vLLM's): the stop ids are masked out of the first min_tokens draws, so a request whose greedy
// output would stop at once runs on; equal to the reference sampler given the same mask, on the host and on a
// runner that draws on the device (the masked draws come to the host), with speculation on.
TEST_F(EngineTest, MinTokensMasksTheStopIds) {
    const std::vector<int32_t> prompt = random_ids(9, 300, 401);
    Request free_run{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 12};
    const Generation g0 = reference_generate(*weights_, free_run);
    // Stop on the greedy output's first, third and fifth tokens: without min_tokens it stops at once.
    Request r = free_run;
    r.stop_ids = {g0.ids[0], g0.ids[2], g0.ids[4]};
    ASSERT_EQ(reference_generate(*weights_, r).ids.size(), 1u);
    r.min_tokens = 6;
    std::vector<Request> reqs = {r};
    Request seeded = r;
    seeded.sampling = SamplingParams{.temperature = 1.0f, .seed = 5};
    reqs.push_back(seeded);
    Request plain{.prompt = random_ids(5, 300, 402), .sampling = {.temperature = 0.0f}, .max_tokens = 10};
    reqs.push_back(plain);
    std::vector<Generation> want;
    for (const Request& q : reqs) want.push_back(reference_generate(*weights_, q));
    for (size_t i = 0; i < 2; ++i) {
        ASSERT_GE(want[i].ids.size(), 7u) << describe(want[i]);
        for (int k = 0; k < 6; ++k)
            EXPECT_EQ(std::count(r.stop_ids.begin(), r.stop_ids.end(), want[i].ids[static_cast<size_t>(k)]), 0);
    }
    for (bool device : {false, true}) {
        const std::vector<Generation> got = run_on_sampling_runner(weights_, reqs, device);
        ASSERT_EQ(got.size(), reqs.size());
        for (size_t i = 0; i < reqs.size(); ++i) {
            const Generation& g = got[i];
            if (device && i == 1) {  // seeded: the draws past min_tokens are the device stream's (arg-max here)
                EXPECT_EQ(std::vector<int32_t>(g.ids.begin(), g.ids.begin() + 6),
                          std::vector<int32_t>(want[i].ids.begin(), want[i].ids.begin() + 6));
                continue;
            }
            EXPECT_TRUE(g.same_tokens(want[i]))
                << device << " " << i << ": " << describe(g) << " vs " << describe(want[i]);
        }
    }
    Request bad = r;
    bad.min_tokens = 13;
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    auto h = engine->submit(bad);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.status().message().find("min_tokens"), std::string::npos) << h.status().to_string();
}

// bad_words (vLLM's, as token sequences): a one-token word is never drawn, a longer one's last token never after
// the rest; equal to the reference sampler given the same mask, on the host and on a device-sampling runner.
TEST_F(EngineTest, BadWordsAreNeverCompleted) {
    Request free_run{.prompt = random_ids(11, 300, 501), .sampling = {.temperature = 0.0f}, .max_tokens = 10};
    const Generation g0 = reference_generate(*weights_, free_run);
    ASSERT_EQ(g0.ids.size(), 10u);
    Request one = free_run, two = free_run;
    one.bad_words = {{g0.ids[0]}};
    two.bad_words = {{g0.ids[0], g0.ids[1]}, {299, 298, 297}};
    Request seeded = two;
    seeded.sampling = SamplingParams{.temperature = 1.0f, .seed = 3};
    const std::vector<Request> reqs = {one, two, seeded};
    std::vector<Generation> want;
    for (const Request& q : reqs) want.push_back(reference_generate(*weights_, q));
    EXPECT_NE(want[0].ids[0], g0.ids[0]);
    EXPECT_EQ(want[1].ids[0], g0.ids[0]);
    EXPECT_NE(want[1].ids[1], g0.ids[1]);
    for (bool device : {false, true}) {
        const std::vector<Generation> got = run_on_sampling_runner(weights_, reqs, device);
        ASSERT_EQ(got.size(), reqs.size());
        for (size_t i = 0; i < reqs.size(); ++i) {
            const Generation& g = got[i];
            EXPECT_TRUE(g.same_tokens(want[i]))
                << device << " " << i << ": " << describe(g) << " vs " << describe(want[i]);
            for (size_t k = 1; k < g.ids.size(); ++k)
                EXPECT_FALSE(i > 0 && g.ids[k - 1] == g0.ids[0] && g.ids[k] == g0.ids[1]) << describe(g);
        }
    }
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    Request bad = free_run;
    bad.bad_words = {{}};
    EXPECT_FALSE(engine->submit(bad).ok());
    bad.bad_words = {{5, 300}};
    EXPECT_FALSE(engine->submit(bad).ok());
}

TEST_F(EngineTest, ConcurrentBatchEqualsEachRequestAlone) {
    EngineConfig cfg = test_config();
    cfg.enable_prefix_caching = false;
    EngineStats st;
    expect_batch_matches_reference(weights_, cfg, mixed_requests(300, 5, 16, 14, 1), &st);
    EXPECT_GT(st.num_steps, 0);
}

TEST_F(EngineTest, ConcurrentBatchWithPrefixCachingAndSharedPrompts) {
    // Requests that share prompts, with prefix caching on: hits inside a concurrent batch.
    std::vector<Request> reqs = mixed_requests(300, 5, 12, 10, 2);
    for (size_t i = 6; i < reqs.size(); ++i) {
        reqs[i].prompt = reqs[i - 6].prompt;
        reqs[i].prompt.push_back(static_cast<int32_t>(i));
    }
    EngineStats st;
    expect_batch_matches_reference(weights_, test_config(), reqs, &st);
    EXPECT_GT(st.num_cached_prompt_tokens, 0);
}

// The choices of an n > 1 request (copies of one prompt, each its own seed) arriving together: the copies wait for the
// first one's prompt blocks (SchedulerConfig::min_shared_prefix_tokens) and take them from the prefix cache, with the
// tokens each would have drawn alone.
TEST_F(EngineTest, CopiesOfAPromptArrivingTogetherComputeItOnce) {
    std::vector<Request> reqs = mixed_requests(300, 5, 4, 8, 3);
    const std::vector<int32_t> prompt = random_ids(41, 300, 17);
    for (int c = 0; c < 4; ++c)
        reqs.insert(reqs.begin() + c,
                    Request{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = 500 + c}, .max_tokens = 6});
    int64_t cached[2] = {0, 0};
    for (int wait : {0, 1}) {
        EngineConfig cfg = test_config();
        cfg.scheduler.min_shared_prefix_tokens = wait ? 8 : 0;
        EngineStats st;
        expect_batch_matches_reference(weights_, cfg, reqs, &st);
        cached[wait] = st.num_cached_prompt_tokens;
    }
    // Three copies each reuse the first's 40 leading tokens (10 blocks of 4) once they wait for them.
    EXPECT_GE(cached[1], 3 * 40);
    EXPECT_LT(cached[0], cached[1]);
}

TEST_F(EngineTest, ParallelLayoutsOnSimulatedRanksGiveTheSameGenerations) {
    // The engine over TP/EP/DP layouts (ranks as threads): every request's tokens equal the
    // unpaged single-rank reference, with prefix caching and shared prompts (under DP a sequence
    // follows its first block, so prompts sharing cached blocks share a group).
    std::vector<Request> reqs = mixed_requests(300, 5, 10, 8, 4);
    for (size_t i = 5; i < reqs.size(); ++i) {
        reqs[i].prompt = reqs[i - 5].prompt;
        reqs[i].prompt.push_back(static_cast<int32_t>(i));
    }
    for (const auto& layout :
         {parallel::ParallelConfig{2, 1, 1}, parallel::ParallelConfig{1, 2, 2}, parallel::ParallelConfig{2, 2, 2}}) {
        SCOPED_TRACE(layout.to_string());
        EngineStats st;
        // Logits move by ~1e-7 relative when sums are regrouped over ranks: logprobs within 1e-4.
        expect_batch_matches_reference(weights_, test_config(), reqs, &st, layout, 1e-4f);
        EXPECT_GT(st.num_cached_prompt_tokens, 0);
    }
}

// The CPU runner's FP8 KV cache (--kv-cache-dtype fp8) reaches the forward, on one rank and under
// DP (ranks as threads): its logits are the CPU forward's with an e4m3-rounding cache, not the
// fp32 cache's.
TEST_F(EngineTest, CpuRunnerFp8KvCacheReachesTheForward) {
    const model::GptOssConfig& c = weights_->config;
    const auto ids = random_ids(12, 300, 5);
    const std::vector<int32_t> table = {0, 1, 2, 3};
    auto run_reference = [&](bool fp8) {
        model::CpuKvCache kv(c, 4, 16, 16, 0, fp8);
        model::CpuForward fwd(*weights_);
        std::vector<float> out;
        model::ForwardSequence s0{std::span(ids).first(11), 0, table, table, false};  // last row only
        EXPECT_TRUE(fwd.forward(std::span(&s0, 1), kv, &out).ok());
        model::ForwardSequence s1{std::span(ids).subspan(11, 1), 11, table, table, true};
        EXPECT_TRUE(fwd.forward(std::span(&s1, 1), kv, &out).ok());
        return out;
    };
    const std::vector<float> want = run_reference(true), fp32_cache = run_reference(false);
    ASSERT_NE(want, fp32_cache);
    for (const char* layout : {"tp=1", "dp=2"}) {
        SCOPED_TRACE(layout);
        auto cfg = parallel::ParallelConfig::parse(layout);
        ASSERT_TRUE(cfg.ok());
        CpuModelRunner runner(weights_, *cfg, /*kv_fp8=*/true);
        ASSERT_TRUE(runner.allocate_kv_cache(4, KvBlockCounts{.full = 16, .sliding = 16}).ok());
        std::vector<float> got;
        Batch b0;
        b0.seqs.push_back({std::span(ids).first(11), 0, table, table, true});
        b0.num_tokens = 11;
        ASSERT_TRUE(runner.forward(b0, &got).ok());
        Batch b1;
        b1.seqs.push_back({std::span(ids).subspan(11, 1), 11, table, table, true});
        b1.num_tokens = 1;
        ASSERT_TRUE(runner.forward(b1, &got).ok());
        // The prompt's last row, then the decode step's. One rank: the same bits. DP=2: the ranks'
        // threads regroup sums (~1e-7 relative, as ParallelLayoutsOnSimulatedRanks...), so within
        // 1e-4 of the largest logit, while the fp32 cache's logits are ≥ 1e-3 away.
        ASSERT_EQ(got.size(), want.size());
        float d_want = 0.0f, d_fp32 = 0.0f, top = 0.0f;
        for (size_t i = 0; i < want.size(); ++i) {
            d_want = std::max(d_want, std::fabs(got[i] - want[i]));
            d_fp32 = std::max(d_fp32, std::fabs(got[i] - fp32_cache[i]));
            top = std::max(top, std::fabs(want[i]));
        }
        if (std::string(layout) == "tp=1") {
            EXPECT_EQ(got, want);
        }
        EXPECT_LE(d_want, 1e-4f * top);
        EXPECT_GT(d_fp32, 1e-3f * top);
    }
}

TEST_F(EngineTest, PrefixCacheHitEqualsCold) { expect_prefix_hits_equal_cold(weights_, test_config(), 29, 3); }

// Engine::cached_prompt_tokens (asked from another thread, answered between steps): what the next request for the
// prompt reports as cached, also while the engine is busy; 0 before anything is cached.
TEST_F(EngineTest, CachedPromptTokensIsWhatTheNextRequestFinds) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    const std::vector<int32_t> prompt = random_ids(27, weights_->config.vocab_size, 7);
    EXPECT_EQ(engine->cached_prompt_tokens(prompt), 0);
    Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 3};
    auto h = engine->submit(copy_request(r));
    ASSERT_TRUE(h.ok());
    collect(*h);
    // A long request keeps the engine stepping while the probe is asked.
    Request busy{
        .prompt = random_ids(9, weights_->config.vocab_size, 8), .sampling = {.temperature = 0.0f}, .max_tokens = 40};
    auto hb = engine->submit(copy_request(busy));
    ASSERT_TRUE(hb.ok());
    const int cached = engine->cached_prompt_tokens(prompt);
    auto h2 = engine->submit(copy_request(r));
    ASSERT_TRUE(h2.ok());
    // Every event says it, not only the last (a request cancelled mid-way reported 0 cached tokens).
    int events = 0;
    while (auto ev = h2->next(std::chrono::milliseconds(60000))) {
        ++events;
        EXPECT_EQ(ev->num_cached_tokens, cached) << "event " << events;
        EXPECT_EQ(ev->num_prompt_tokens, 27) << "event " << events;
        if (ev->is_final()) break;
    }
    EXPECT_GE(events, 3);
    EXPECT_EQ(cached, (27 - 1) / test_config().block_size * test_config().block_size);
    collect(*hb);
}

TEST_F(EngineTest, PreemptionUnderATinyKvBudgetChangesNothing) {
    // 20 full blocks of 4 = 80 positions for 10 requests of up to ~35 tokens each; 6 sliding blocks.
    EngineConfig cfg = test_config(20, 6);
    cfg.scheduler.max_num_batched_tokens = 16;
    EngineStats st;
    expect_batch_matches_reference(weights_, cfg, mixed_requests(300, 5, 10, 12, 4), &st);
    EXPECT_GT(st.num_preemptions, 0);
    // And without prefix caching (recompute from scratch).
    cfg.enable_prefix_caching = false;
    expect_batch_matches_reference(weights_, cfg, mixed_requests(300, 5, 10, 12, 5), &st);
    EXPECT_GT(st.num_preemptions, 0);
}

TEST_F(EngineTest, ThousandRandomSubmitCancelOpsLeaveNoBlockAllocated) {
    EngineConfig cfg = test_config(40, 12);
    auto engine = make_engine(weights_, cfg);
    ASSERT_TRUE(engine);
    std::mt19937 rng(9);
    std::vector<RequestHandle> live;
    int submits = 0, cancels = 0, drops = 0;
    for (int op = 0; op < 1000; ++op) {
        const uint32_t what = rng() % 10;
        if (what < 5 || live.empty()) {
            Request r{.prompt = random_ids(1 + static_cast<int>(rng() % 30), 300, rng()),
                      .sampling = {.temperature = 1.0f, .seed = rng()},
                      .max_tokens = 1 + static_cast<int>(rng() % 20)};
            auto h = engine->submit(std::move(r));
            ASSERT_TRUE(h.ok()) << h.status().to_string();
            live.push_back(std::move(*h));
            ++submits;
        } else if (what < 8) {
            live[rng() % live.size()].cancel();
            ++cancels;
        } else {
            // Drop a handle: cancels if still running.
            live.erase(live.begin() + static_cast<long>(rng() % live.size()));
            ++drops;
        }
        if (rng() % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (RequestHandle& h : live) {
        Generation g = collect(h);
        EXPECT_TRUE(g.finish == FinishReason::kCancelled || g.finish == FinishReason::kLength) << describe(g);
    }
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EngineStats st = engine->stats();
    EXPECT_EQ(st.num_blocks_in_use.full, 0);
    EXPECT_EQ(st.num_blocks_in_use.sliding, 0);
    EXPECT_EQ(st.num_active, 0);
    EXPECT_EQ(st.num_running + st.num_waiting, 0);
    EXPECT_EQ(st.num_finished, submits);
    EXPECT_GT(cancels + drops, 300);
}

// Disaggregated prefill: the prefill worker's export of a prompt's whole blocks before its last token.
std::shared_ptr<const KvTransfer> export_prefix(Engine& producer, const std::vector<int32_t>& prompt, int bs,
                                                Generation* first = nullptr) {
    const size_t P = (prompt.size() - 1) / static_cast<size_t>(bs) * static_cast<size_t>(bs);
    if (P == 0) return nullptr;
    Request r{.prompt = std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(P)), .max_tokens = 9};
    r.export_kv = true;
    auto h = producer.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return nullptr;
    std::shared_ptr<const KvTransfer> kv;
    Generation g;
    while (auto ev = h->next(std::chrono::milliseconds(60000))) {
        if (ev->id >= 0) g.ids.push_back(ev->id);
        if (!ev->is_final()) continue;
        g.finish = *ev->finish_reason;
        EXPECT_TRUE(ev->kv) << ev->error;
        kv = ev->kv;
        break;
    }
    EXPECT_EQ(g.ids.size(), 1u);  // the export ends with its first token, whatever max_tokens says
    if (first) *first = g;
    return kv;
}

// A prefill worker exports each prompt's KV and a decode worker imports it and generates: every request's tokens
// are the unpaged reference's (greedy, seeded, penalties, logprobs), with the imported positions counted as cached
// and not computed again; on the FP8-rounding cache too. Without the import the decode worker computes everything.
TEST_F(EngineTest, DisaggregatedPrefillGivesTheReferenceGenerations) {
    std::vector<Request> reqs = mixed_requests(300, 5, 12, 6, 21);
    for (Request& r : reqs) r.prompt_logprobs = -1;  // a scored prompt is computed whole: nothing to import
    reqs.push_back(Request{.prompt = random_ids(60, 300, 9), .sampling = {.temperature = 0.0f}, .max_tokens = 5});
    for (bool fp8 : {false, true}) {
        SCOPED_TRACE(fp8 ? "fp8 cache" : "f32 cache");
        auto make = [&] {
            auto e = Engine::create(std::make_unique<CpuModelRunner>(weights_, parallel::ParallelConfig{}, fp8),
                                    test_config());
            EXPECT_TRUE(e.ok()) << e.status().to_string();
            return e.ok() ? std::move(*e) : nullptr;
        };
        auto producer = make(), consumer = make();
        ASSERT_TRUE(producer && consumer);
        int64_t imported = 0, positions = 0;
        for (const Request& r : reqs) {
            Request d = r;
            d.kv_prefix = export_prefix(*producer, r.prompt, 4);
            const int P = d.kv_prefix ? static_cast<int>(d.kv_prefix->tokens.size()) : 0;
            imported += P;
            positions += static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
            auto h = consumer->submit(std::move(d));
            ASSERT_TRUE(h.ok()) << h.status().to_string();
            Generation g = collect(*h);
            EXPECT_EQ(g.num_cached_tokens, P);
            if (fp8) {
                // The e4m3 cache is not the reference's: the same tokens as the producer computing it all.
                auto whole = producer->submit(copy_request(r));
                ASSERT_TRUE(whole.ok());
                const Generation want = collect(*whole);
                EXPECT_EQ(g.ids, want.ids);
            } else {
                const Generation want = reference_generate(*weights_, r);
                EXPECT_TRUE(g.same_tokens(want)) << describe(g) << " vs " << describe(want);
            }
        }
        ASSERT_TRUE(consumer->wait_idle(std::chrono::milliseconds(10000)));
        const EngineStats st = consumer->stats();
        EXPECT_GE(imported, 100);  // 128: the 60-token prompt gives 56, the mixed ones the rest
        EXPECT_EQ(st.num_imported_tokens, imported);
        EXPECT_EQ(st.num_kv_imports_dropped, 0);
        // Each generated token but the last is fed once; each prompt position not imported once.
        EXPECT_LE(st.num_tokens_computed, positions - imported);
        EXPECT_EQ(producer->stats().num_exported_tokens, imported);
    }
}

// The imported KV is what the decode worker reads: zeroed blocks change the first token's logprob.
TEST_F(EngineTest, ImportedKvIsWhatTheDecodeWorkerReads) {
    const std::vector<int32_t> prompt = random_ids(30, 300, 4);
    auto producer = make_engine(weights_, test_config()), consumer = make_engine(weights_, test_config());
    ASSERT_TRUE(producer && consumer);
    std::shared_ptr<const KvTransfer> kv = export_prefix(*producer, prompt, 4);
    ASSERT_TRUE(kv);
    auto zeroed = std::make_shared<KvTransfer>(*kv);
    std::fill(zeroed->full.begin(), zeroed->full.end(), 0);
    Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 1, .logprobs = 0};
    const Generation want = reference_generate(*weights_, r);
    r.kv_prefix = kv;
    auto h = consumer->submit(copy_request(r));
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(collect(*h).same_tokens(want));
    // Another engine (an empty cache), the same prompt with zeroed full-layer KV.
    auto consumer2 = make_engine(weights_, test_config());
    ASSERT_TRUE(consumer2);
    r.kv_prefix = zeroed;
    auto z = consumer2->submit(copy_request(r));
    ASSERT_TRUE(z.ok());
    const Generation got = collect(*z);
    EXPECT_EQ(got.num_cached_tokens, 28);
    ASSERT_EQ(got.logprobs.size(), 1u);
    EXPECT_NE(got.logprobs[0], want.logprobs[0]);
}

// A runner whose first forward waits until the test opens the gate (the CPU runner inside does the work).
class GatedRunner final : public ModelRunner {
public:
    GatedRunner(std::unique_ptr<ModelRunner> inner, std::shared_ptr<Gate> gate)
        : inner_(std::move(inner)), gate_(std::move(gate)) {}
    const model::GptOssConfig& config() const override { return inner_->config(); }
    KvGeometry kv_geometry(int block_size) const override { return inner_->kv_geometry(block_size); }
    size_t free_memory_bytes() const override { return inner_->free_memory_bytes(); }
    Status allocate_kv_cache(int block_size, KvBlockCounts counts) override {
        return inner_->allocate_kv_cache(block_size, counts);
    }
    Status forward(const Batch& batch, std::vector<float>* logits) override {
        gate_->pass();
        return inner_->forward(batch, logits);
    }
    StatusOr<KvFormat> kv_format(int block_size) const override { return inner_->kv_format(block_size); }
    Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* data) override {
        return inner_->read_kv_blocks(sliding, ids, data);
    }
    Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* data) override {
        return inner_->write_kv_blocks(sliding, ids, data);
    }

private:
    std::unique_ptr<ModelRunner> inner_;
    std::shared_ptr<Gate> gate_;
};

// A prefill engine's export of `prompt`'s whole blocks before its last token (blocks of 4).
std::shared_ptr<const KvTransfer> exported_prefix(std::shared_ptr<const model::GptOssWeights> w,
                                                  const std::vector<int32_t>& prompt) {
    auto producer = make_engine(std::move(w), test_config());
    return producer ? export_prefix(*producer, prompt, 4) : nullptr;
}

StatusOr<std::unique_ptr<Engine>> gated_engine(std::shared_ptr<const model::GptOssWeights> w,
                                               std::shared_ptr<Gate> gate, EngineConfig cfg) {
    return Engine::create(
        std::make_unique<GatedRunner>(std::make_unique<CpuModelRunner>(std::move(w)), std::move(gate)), std::move(cfg));
}

// An imported prefix waits for its request: while the request queues behind another (one sequence at a time)
// whose moving window turns the small sliding pool over many times, the imported blocks stay (the request finds
// all 40 positions cached and gives the reference's tokens).
TEST_F(EngineTest, ImportedBlocksWaitForTheirRequest) {
    const std::vector<int32_t> prompt = random_ids(41, 300, 12);
    std::shared_ptr<const KvTransfer> kv = exported_prefix(weights_, prompt);
    ASSERT_TRUE(kv);
    EngineConfig one = test_config(256, 8);
    one.scheduler.max_num_seqs = 1;
    auto consumer = make_engine(weights_, one);
    ASSERT_TRUE(consumer);
    auto busy = consumer->submit(Request{.prompt = random_ids(20, 300, 3), .max_tokens = 60});
    ASSERT_TRUE(busy.ok());
    Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 4};
    const Generation want = reference_generate(*weights_, r);
    r.kv_prefix = kv;
    auto h = consumer->submit(std::move(r));
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(collect(*busy).ids.size(), 60u);
    const Generation got = collect(*h);
    EXPECT_EQ(got.num_cached_tokens, 40);
    EXPECT_TRUE(got.same_tokens(want)) << describe(got) << " vs " << describe(want);
    ASSERT_TRUE(consumer->wait_idle(std::chrono::milliseconds(10000)));
    EXPECT_EQ(consumer->stats().num_blocks_in_use.full, 0);  // the import's references went with the admission
    EXPECT_EQ(consumer->stats().num_blocks_in_use.sliding, 0);
}

// A held import never starves a running request: with 10 of 14 full blocks held for a waiting request and a running
// one needing more, the held blocks become ordinary cached ones (evictable) and both requests finish with the
// reference's tokens (before the holds could give way, this run hung).
TEST_F(EngineTest, HeldImportsGiveWayUnderPressure) {
    const std::vector<int32_t> prompt = random_ids(41, 300, 6);
    std::shared_ptr<const KvTransfer> kv = exported_prefix(weights_, prompt);
    ASSERT_TRUE(kv);
    auto gate = std::make_shared<Gate>();
    auto gated = gated_engine(weights_, gate, test_config(14, 6));
    ASSERT_TRUE(gated.ok()) << gated.status().to_string();
    Engine& e = **gated;
    const Request busy_req{.prompt = random_ids(20, 300, 2), .sampling = {.temperature = 0.0f}, .max_tokens = 30};
    auto busy = e.submit(copy_request(busy_req));
    ASSERT_TRUE(busy.ok());
    gate->wait_entered();
    Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 3};
    const Generation want = reference_generate(*weights_, r);
    r.kv_prefix = kv;
    auto h = e.submit(std::move(r));
    ASSERT_TRUE(h.ok());
    gate->open();
    const Generation b = collect(*busy), got = collect(*h);
    EXPECT_TRUE(b.same_tokens(reference_generate(*weights_, busy_req))) << describe(b);
    EXPECT_TRUE(got.same_tokens(want)) << describe(got) << " vs " << describe(want);
    EXPECT_EQ(e.stats().num_imported_tokens, 40);
    ASSERT_TRUE(e.wait_idle(std::chrono::milliseconds(10000)));
    EXPECT_EQ(e.stats().num_blocks_in_use.full, 0);
}

TEST_F(EngineTest, KvTransfersThatDoNotFitAreRefusedOrDropped) {
    const std::vector<int32_t> prompt = random_ids(41, 300, 6);
    std::shared_ptr<const KvTransfer> kv = exported_prefix(weights_, prompt);
    ASSERT_TRUE(kv);
    auto producer = make_engine(weights_, test_config());  // the requests a prefill engine refuses
    ASSERT_TRUE(producer);
    ASSERT_EQ(kv->tokens.size(), 40u);
    auto expect_error = [](Engine& e, Request r, StatusCode code, const std::string& words) {
        auto h = e.submit(std::move(r));
        ASSERT_FALSE(h.ok());
        EXPECT_EQ(h.status().code(), code) << h.status().to_string();
        EXPECT_NE(h.status().message().find(words), std::string::npos) << h.status().message();
    };
    Request export_partial{.prompt = random_ids(10, 300, 1)};
    export_partial.export_kv = true;
    expect_error(*producer, export_partial, StatusCode::kInvalidArgument, "whole blocks");
    // Another block size; another prompt; the whole prompt (nothing left to compute).
    EngineConfig eight = test_config();
    eight.block_size = 8;
    auto other = make_engine(weights_, eight);
    ASSERT_TRUE(other);
    expect_error(*other, Request{.prompt = prompt, .kv_prefix = kv}, StatusCode::kInvalidArgument, "block 4");
    std::vector<int32_t> changed = prompt;
    changed[7] += 1;
    expect_error(*producer, Request{.prompt = changed, .kv_prefix = kv}, StatusCode::kInvalidArgument, "prefix");
    expect_error(*producer,
                 Request{.prompt = std::vector<int32_t>(prompt.begin(), prompt.begin() + 40), .kv_prefix = kv},
                 StatusCode::kInvalidArgument, "prefix");
    EngineConfig no_cache = test_config();
    no_cache.enable_prefix_caching = false;
    auto uncached = make_engine(weights_, no_cache);
    ASSERT_TRUE(uncached);
    expect_error(*uncached, Request{.prompt = prompt, .kv_prefix = kv}, StatusCode::kFailedPrecondition,
                 "prefix caching");
    // A simulated-rank layout cannot copy its blocks.
    auto ranks = make_engine(weights_, test_config(), parallel::ParallelConfig{2, 1, 1});
    ASSERT_TRUE(ranks);
    expect_error(*ranks, Request{.prompt = prompt, .kv_prefix = kv}, StatusCode::kFailedPrecondition, "layout");
    // A cache too small for the 10 blocks while another request holds 4 of its 13 (its first 16-token chunk):
    // dropped, and the prompt computed here gives the same tokens. The other request's first step waits at a gate
    // until the import is queued, so it holds its blocks when the import is taken.
    auto gate = std::make_shared<Gate>();
    auto gated = gated_engine(weights_, gate, test_config(13, 6));
    ASSERT_TRUE(gated.ok()) << gated.status().to_string();
    Engine* small = gated->get();
    Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 3};
    auto busy = small->submit(Request{.prompt = random_ids(20, 300, 2), .max_tokens = 30});
    ASSERT_TRUE(busy.ok());
    gate->wait_entered();
    r.kv_prefix = kv;
    auto h = small->submit(copy_request(r));
    ASSERT_TRUE(h.ok());
    gate->open();
    r.kv_prefix.reset();
    const Generation g = collect(*h);
    EXPECT_TRUE(g.same_tokens(reference_generate(*weights_, r))) << describe(g);
    collect(*busy);
    EXPECT_EQ(small->stats().num_kv_imports_dropped, 1);
    EXPECT_EQ(small->stats().num_imported_tokens, 0);
}

TEST_F(EngineTest, BadRequestsGetClearErrors) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    auto expect_error = [&](Request r, StatusCode code, const std::string& words) {
        auto h = engine->submit(std::move(r));
        ASSERT_FALSE(h.ok());
        EXPECT_EQ(h.status().code(), code) << h.status().to_string();
        EXPECT_NE(h.status().message().find(words), std::string::npos) << h.status().message();
    };
    expect_error(Request{.prompt = std::vector<int32_t>(97, 3)}, StatusCode::kOutOfRange, "context of 96");
    expect_error(Request{.prompt = std::vector<int32_t>(90, 3), .max_tokens = 7}, StatusCode::kOutOfRange,
                 "plus max_tokens");
    expect_error(Request{}, StatusCode::kInvalidArgument, "empty");
    expect_error(Request{.prompt = {5, 300}}, StatusCode::kInvalidArgument, "token id 300");
    expect_error(Request{.prompt = {-4}}, StatusCode::kInvalidArgument, "token id -4");
    expect_error(Request{.prompt = {5}, .max_tokens = 0}, StatusCode::kInvalidArgument, "max_tokens");
    expect_error(Request{.prompt = {5}, .sampling = {.top_p = 2.0f}}, StatusCode::kInvalidArgument, "top_p");
    expect_error(Request{.prompt = {5}, .logprobs = 21}, StatusCode::kInvalidArgument, "logprobs");
    Request bad_prompt_lp = Request{.prompt = {5, 6}};
    bad_prompt_lp.prompt_logprobs = 21;
    expect_error(bad_prompt_lp, StatusCode::kInvalidArgument, "prompt_logprobs");
    Request bad_stop_id = Request{.prompt = {5}};
    bad_stop_id.stop_ids.push_back(301);
    expect_error(bad_stop_id, StatusCode::kInvalidArgument, "stop id");
    Request stop_string = Request{.prompt = {5}};
    stop_string.stop_strings.push_back("x");
    expect_error(stop_string, StatusCode::kFailedPrecondition, "detokenizer");
    // Larger than the whole KV cache: 10 blocks of 4.
    auto small = make_engine(weights_, test_config(10, 6));
    ASSERT_TRUE(small);
    auto h = small->submit(Request{.prompt = std::vector<int32_t>(30, 3), .max_tokens = 11});
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().to_string();
    // The engine still works after all that.
    auto ok = engine->submit(Request{.prompt = {5, 6}, .max_tokens = 2});
    ASSERT_TRUE(ok.ok());
    EXPECT_EQ(collect(*ok).ids.size(), 2u);
}

// max_model_len (vLLM's --max-model-len) caps every sequence below the model's context of 96: the limit the
// server reads, prompts and prompt + max_tokens past it refused, exactly at it accepted; past the model's own
// context it is refused when the engine is created.
TEST_F(EngineTest, MaxModelLenCapsTheContext) {
    EngineConfig cfg = test_config();
    cfg.max_model_len = 40;
    auto engine = make_engine(weights_, cfg);
    ASSERT_TRUE(engine);
    EXPECT_EQ(engine->max_sequence_tokens(), 40);
    auto h = engine->submit(Request{.prompt = std::vector<int32_t>(41, 3), .max_tokens = 1});
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(h.status().message().find("context of 40"), std::string::npos) << h.status().message();
    h = engine->submit(Request{.prompt = std::vector<int32_t>(35, 3), .max_tokens = 6});
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kOutOfRange);
    auto ok = engine->submit(Request{.prompt = std::vector<int32_t>(35, 3), .max_tokens = 5});
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(collect(*ok).ids.size(), 5u);
    // Without it, the model's context.
    auto full = make_engine(weights_, test_config());
    ASSERT_TRUE(full);
    EXPECT_EQ(full->max_sequence_tokens(), 96);
    for (int64_t bad : {int64_t{97}, int64_t{-1}, int64_t{1}}) {
        cfg.max_model_len = bad;
        auto refused = Engine::create(std::make_unique<CpuModelRunner>(weights_), cfg);
        ASSERT_FALSE(refused.ok()) << bad;
        EXPECT_NE(refused.status().message().find("max_model_len"), std::string::npos) << refused.status().message();
    }
}

// EngineConfig::seed (vLLM's --seed): requests without a seed draw the same tokens in two engines given the same
// seed (the same requests in the same order), and different ones under another seed.
TEST_F(EngineTest, EngineSeedMakesUnseededDrawsRepeatable) {
    auto run = [&](std::optional<uint64_t> seed) {
        EngineConfig cfg = test_config();
        cfg.seed = seed;
        auto engine = make_engine(weights_, cfg);
        std::vector<std::vector<int32_t>> out;
        if (!engine) return out;
        for (int i = 0; i < 3; ++i) {
            auto h = engine->submit(Request{
                .prompt = {5, 6, static_cast<int32_t>(7 + i)}, .sampling = {.temperature = 1.5f}, .max_tokens = 12});
            if (!h.ok()) return out;
            out.push_back(collect(*h).ids);
        }
        return out;
    };
    const auto a = run(1234), b = run(1234), c = run(99);
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(a, b);
    // 36 draws at temperature 1.5 over 300 ids: equal under two seeds only by a vanishing chance.
    EXPECT_NE(a, c);
}

// vLLM's cache_salt: a prompt's cached blocks serve only later requests with the same salt (unsalted ones only
// unsalted ones); the tokens drawn do not change. A salt with an imported KV prefix is refused.
TEST_F(EngineTest, CacheSaltSeparatesPrefixCaches) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    const std::vector<int32_t> prompt = random_ids(30, 300, 5);
    auto run = [&](const std::string& salt) {
        Request r{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 4};
        r.cache_salt = salt;
        auto h = engine->submit(std::move(r));
        EXPECT_TRUE(h.ok()) << h.status().to_string();
        return h.ok() ? collect(*h) : Generation{};
    };
    const Generation a = run("tenant-a");
    const Generation b = run("tenant-b");
    const Generation a2 = run("tenant-a");
    const Generation plain = run("");
    const Generation plain2 = run("");
    EXPECT_EQ(a.num_cached_tokens, 0);
    EXPECT_EQ(b.num_cached_tokens, 0);
    EXPECT_GT(a2.num_cached_tokens, 0);
    EXPECT_EQ(plain.num_cached_tokens, 0);
    EXPECT_GT(plain2.num_cached_tokens, 0);
    for (const Generation* g : {&b, &a2, &plain, &plain2}) EXPECT_EQ(g->ids, a.ids);
    EXPECT_EQ(engine->cached_prompt_tokens(prompt), plain2.num_cached_tokens);  // the unsalted cache
    EXPECT_NE(cache_salt_hash("x"), 0u);
    EXPECT_EQ(cache_salt_hash(""), 0u);
    EXPECT_NE(cache_salt_hash("ab"), cache_salt_hash("ba"));
}

// A checkpoint whose weights hold a NaN gives non-finite logits: the request ends with an error that says so
// (the CPU runner sampled token 0 from a NaN row), for greedy and sampled requests one after the other.
TEST_F(EngineTest, NonFiniteLogitsEndTheRequestWithAnError) {
    auto loaded = model::GptOssWeights::load(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    std::shared_ptr<model::GptOssWeights> nan_weights = std::move(*loaded);
    nan_weights->norm[1] = std::nanf("");  // the final norm's gain: every logit reads hidden[1]
    auto engine = make_engine(nan_weights, test_config());
    ASSERT_TRUE(engine);
    for (float temperature : {0.0f, 1.0f}) {
        auto h = engine->submit(Request{.prompt = {5, 6}, .sampling = {.temperature = temperature}, .max_tokens = 3});
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        std::optional<TokenEvent> last;
        int tokens = 0;
        while (auto ev = h->next(std::chrono::milliseconds(60000))) {
            if (ev->id >= 0) ++tokens;
            if (ev->is_final()) {
                last = std::move(ev);
                break;
            }
        }
        ASSERT_TRUE(last.has_value());
        EXPECT_EQ(tokens, 0) << temperature;
        EXPECT_EQ(*last->finish_reason, FinishReason::kError) << temperature;
        EXPECT_NE(last->error.find("non-finite logits"), std::string::npos) << last->error;
    }
}

TEST_F(EngineTest, StopIdsAndStopStringsEndWithStop) {
    // Detokenizer: each id is two bytes "<letter><digit>".
    EngineConfig cfg = test_config();
    cfg.detokenizer = [](std::span<const int32_t> ids) {
        std::string s;
        for (int32_t id : ids) s += std::string{static_cast<char>('a' + id % 26), static_cast<char>('0' + id % 10)};
        return s;
    };
    auto engine = make_engine(weights_, cfg);
    ASSERT_TRUE(engine);
    Request base{.prompt = random_ids(9, 300, 5), .sampling = {.temperature = 0.0f}, .max_tokens = 10};
    Generation free_run = reference_generate(*weights_, base);
    ASSERT_EQ(free_run.ids.size(), 10u);

    Request by_id = base;
    by_id.stop_ids = {free_run.ids[3]};
    auto h = engine->submit(by_id);
    ASSERT_TRUE(h.ok());
    Generation g = collect(*h);
    const auto first = std::find(free_run.ids.begin(), free_run.ids.end(), free_run.ids[3]) - free_run.ids.begin();
    EXPECT_EQ(g.finish, FinishReason::kStop);
    EXPECT_EQ(g.ids.size(), static_cast<size_t>(first + 1));

    // A stop string made of the last byte of token 4 and the first byte of token 5.
    std::string text = cfg.detokenizer(free_run.ids);
    Request by_string = base;
    by_string.stop_strings = {"zzzz", text.substr(9, 2)};
    const size_t at = text.find(text.substr(9, 2));
    h = engine->submit(by_string);
    ASSERT_TRUE(h.ok());
    g = collect(*h);
    EXPECT_EQ(g.finish, FinishReason::kStop);
    // It ends with the token that completes the first occurrence; trim drops it from the text.
    EXPECT_EQ(g.ids.size(), (at + 2 + 1) / 2);
    EXPECT_EQ(static_cast<size_t>(g.trim_bytes), g.ids.size() * 2 - at);
    EXPECT_TRUE(std::equal(g.ids.begin(), g.ids.end(), free_run.ids.begin()));
}

TEST_F(EngineTest, CancelFreesBlocksAndCallbacksGetEveryEvent) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    Request r{.prompt = random_ids(20, 300, 8), .sampling = {.temperature = 0.0f}, .max_tokens = 70};
    auto h = engine->submit(r);
    ASSERT_TRUE(h.ok());
    auto ev = h->next(std::chrono::milliseconds(60000));
    ASSERT_TRUE(ev && ev->id >= 0);
    engine->cancel(*h);
    Generation g = collect(*h);
    EXPECT_EQ(g.finish, FinishReason::kCancelled);
    EXPECT_LT(g.ids.size(), 69u);
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_EQ(engine->stats().num_blocks_in_use.full, 0);

    std::mutex mu;
    std::vector<int32_t> seen;
    std::atomic<bool> final{false};
    Request c{.prompt = random_ids(7, 300, 9), .sampling = {.temperature = 0.0f}, .max_tokens = 5, .logprobs = 2};
    Generation want = reference_generate(*weights_, c);
    c.on_event = [&](const TokenEvent& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (e.id >= 0) seen.push_back(e.id);
        EXPECT_EQ(e.top_logprobs.size(), 2u);
        if (e.is_final()) final = true;
    };
    auto hc = engine->submit(std::move(c));
    ASSERT_TRUE(hc.ok());
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_TRUE(final.load());
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen, want.ids);
}

TEST_F(EngineTest, ShutdownCancelsWhatIsLeft) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    std::vector<RequestHandle> hs;
    for (int i = 0; i < 4; ++i) {
        auto h = engine->submit(Request{.prompt = random_ids(30, 300, i), .max_tokens = 60});
        ASSERT_TRUE(h.ok());
        hs.push_back(std::move(*h));
    }
    engine.reset();
    for (RequestHandle& h : hs) {
        Generation g = collect(h);
        EXPECT_TRUE(g.finish == FinishReason::kCancelled || g.finish == FinishReason::kLength);
    }
    hs.clear();  // handles outlive the engine safely
}

// A constraint that allows, at output index i, only the ids congruent to i mod 5 (until `free_after`
// tokens, then none): every drawn token must obey the mask of its own position, so the engine must
// ask before each draw and report each emitted token.
class ModuloConstraint : public TokenConstraint {
public:
    ModuloConstraint(int vocab, int free_after, std::chrono::milliseconds sleep = {})
        : vocab_(vocab), free_after_(free_after), sleep_(sleep) {}
    bool allowed_next(std::vector<uint8_t>* mask) override {
        std::this_thread::sleep_for(sleep_);  // a stand-in for a costly grammar's mask
        if (n_ >= free_after_) return false;
        mask->assign(static_cast<size_t>(vocab_), 0);
        for (int id = n_ % 5; id < vocab_; id += 5) (*mask)[static_cast<size_t>(id)] = 1;
        return true;
    }
    void accept(int32_t) override { ++n_; }

private:
    int vocab_, free_after_, n_ = 0;
    std::chrono::milliseconds sleep_;
};

class ModuloFactory : public TokenConstraintFactory {
public:
    ModuloFactory(int vocab, int free_after, std::chrono::milliseconds sleep = {})
        : vocab_(vocab), free_after_(free_after), sleep_(sleep) {}
    std::unique_ptr<TokenConstraint> start() const override {
        ++started;
        return std::make_unique<ModuloConstraint>(vocab_, free_after_, sleep_);
    }
    mutable std::atomic<int> started{0};

private:
    int vocab_, free_after_;
    std::chrono::milliseconds sleep_;
};

// A constraint that allows only `end` from output index `at` (anything before): with min_tokens past `at`, the
// stop id is the only choice and ends the request there (vLLM's mask would leave nothing), never running on
// unconstrained.
class EndAtConstraint : public TokenConstraint {
public:
    EndAtConstraint(int vocab, int at, int32_t end) : vocab_(vocab), at_(at), end_(end) {}
    bool allowed_next(std::vector<uint8_t>* mask) override {
        if (n_ < at_) return false;
        mask->assign(static_cast<size_t>(vocab_), 0);
        (*mask)[static_cast<size_t>(end_)] = 1;
        return true;
    }
    void accept(int32_t) override { ++n_; }

private:
    int vocab_, at_;
    int32_t end_;
    int n_ = 0;
};
class EndAtFactory : public TokenConstraintFactory {
public:
    EndAtFactory(int vocab, int at, int32_t end) : vocab_(vocab), at_(at), end_(end) {}
    std::unique_ptr<TokenConstraint> start() const override {
        return std::make_unique<EndAtConstraint>(vocab_, at_, end_);
    }

private:
    int vocab_, at_;
    int32_t end_;
};

TEST_F(EngineTest, MinTokensYieldToAConstraintThatCanOnlyEnd) {
    auto engine = make_engine(weights_, test_config());
    ASSERT_TRUE(engine);
    Request r{.prompt = random_ids(7, 300, 77), .sampling = {.temperature = 0.0f}, .max_tokens = 12};
    r.stop_ids = {1, 17};
    r.min_tokens = 8;
    r.constraint = std::make_shared<EndAtFactory>(300, 3, 17);
    auto h = engine->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const Generation g = collect(*h);
    ASSERT_EQ(g.ids.size(), 4u) << describe(g);
    EXPECT_EQ(g.ids.back(), 17);
    EXPECT_EQ(g.finish, FinishReason::kStop);
    for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(g.ids[k] != 1 && g.ids[k] != 17) << describe(g);
}

TEST_F(EngineTest, ConstrainedRequestsDrawOnlyAllowedTokens) {
    const int V = small_config().vocab_size;
    auto factory = std::make_shared<ModuloFactory>(V, 1000);
    for (int mode = 0; mode < 8; ++mode) {
        const bool device = mode % 2 == 0;
        const bool host_idle = (mode / 2) % 2 == 1;  // masks computed beside the forward
        const bool defer = mode >= 4;                // masked draws on the "device"
        for (int spec : {0, 3}) {
            auto runner =
                std::make_unique<DeviceSamplingRunner>(weights_, host_idle, std::chrono::milliseconds{}, defer);
            DeviceSamplingRunner* r = runner.get();
            EngineConfig cfg = test_config();
            cfg.device_sampling = device;
            if (spec > 0) cfg.speculative = SpeculativeConfig{.num_tokens = spec, .ngram_min = 1, .ngram_max = 3};
            auto engine = Engine::create(std::move(runner), cfg);
            ASSERT_TRUE(engine.ok()) << engine.status().to_string();
            std::vector<RequestHandle> hs;
            // Greedy and seeded constrained requests beside an unconstrained greedy one (a repetitive
            // prompt, so that n-gram drafts would be proposed).
            std::vector<int32_t> prompt = random_ids(6, 300, 90);
            for (int k = 0; k < 3; ++k) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 6);
            for (float t : {0.0f, 1.0f}) {
                Request req{.prompt = prompt, .sampling = {.temperature = t, .seed = 5}, .max_tokens = 16};
                req.constraint = factory;
                auto h = (*engine)->submit(req);
                ASSERT_TRUE(h.ok());
                hs.push_back(std::move(*h));
            }
            auto free =
                (*engine)->submit(Request{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 16});
            ASSERT_TRUE(free.ok());
            for (int k = 0; k < 2; ++k) {
                const Generation g = collect(hs[static_cast<size_t>(k)]);
                ASSERT_EQ(g.ids.size(), 16u) << describe(g);
                for (size_t i = 0; i < g.ids.size(); ++i)
                    EXPECT_EQ(g.ids[i] % 5, static_cast<int32_t>(i % 5)) << device << spec << " " << describe(g);
            }
            const Generation g = collect(*free);
            EXPECT_EQ(g.ids.size(), 16u);
            // The unconstrained one is not all congruent (it would be by chance with odds 5^-15).
            bool all = true;
            for (size_t i = 0; i < g.ids.size(); ++i) all = all && g.ids[i] % 5 == static_cast<int32_t>(i % 5);
            EXPECT_FALSE(all) << describe(g);
            if (device && !defer) {
                EXPECT_EQ(r->host_rows, 2 * 16) << "constrained rows are drawn on the host";
                EXPECT_EQ(r->deferred_rows, 0);
            }
            if (device && defer) {
                EXPECT_EQ(r->host_rows, 0) << "constrained rows are drawn on the device, under their masks";
                EXPECT_EQ(r->deferred_rows, 2 * 16);
            }
            if (!device) {
                EXPECT_EQ(r->deferred_rows, 0);
            }
        }
    }
    EXPECT_EQ(factory->started.load(), 32);
}

// Where the runner's forward leaves the engine's thread idle, a constraint's mask is computed beside it: with a
// forward and a mask of 60 ms each, a step takes ~60 ms, not ~120. The tokens are those of the engine that asks at
// the draw (the same masks, the same logits). Sleeps, not work: the 2-core CI's load does not change them.
TEST_F(EngineTest, ConstraintMasksAreComputedBesideAForwardThatLeavesTheHostIdle) {
    const int V = small_config().vocab_size;
    const auto sleep = std::chrono::milliseconds(60);
    auto factory = std::make_shared<ModuloFactory>(V, 1000, sleep);
    Generation gens[2];
    double seconds[2];
    for (int host_idle = 0; host_idle < 2; ++host_idle) {
        auto engine =
            Engine::create(std::make_unique<DeviceSamplingRunner>(weights_, host_idle == 1, sleep), test_config());
        ASSERT_TRUE(engine.ok()) << engine.status().to_string();
        Request req{.prompt = random_ids(5, 300, 93), .sampling = {.temperature = 1.0f, .seed = 9}, .max_tokens = 8};
        req.constraint = factory;
        const auto t0 = std::chrono::steady_clock::now();
        auto h = (*engine)->submit(req);
        ASSERT_TRUE(h.ok());
        gens[host_idle] = collect(*h);
        seconds[host_idle] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_EQ(gens[host_idle].ids.size(), 8u) << describe(gens[host_idle]);
        for (size_t i = 0; i < 8; ++i) EXPECT_EQ(gens[host_idle].ids[i] % 5, static_cast<int32_t>(i % 5));
    }
    EXPECT_TRUE(gens[1].same_tokens(gens[0])) << describe(gens[1]) << " vs " << describe(gens[0]);
    // 8 steps: at the draw ≥ 8 · 120 ms = 0.96 s; beside the forward ~8 · 60 ms = 0.48 s plus the tiny model.
    EXPECT_GE(seconds[0], 0.96);
    EXPECT_LT(seconds[1], 0.75) << "at the draw " << seconds[0] << " s";
}

TEST_F(EngineTest, RejectsAKvBudgetTooSmallForTheWindow) {
    auto e = Engine::create(std::make_unique<CpuModelRunner>(weights_), test_config(10, 2));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted) << e.status().to_string();
}

}  // namespace
}  // namespace gptoss::runtime
