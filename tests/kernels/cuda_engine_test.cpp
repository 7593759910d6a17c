// The engine on the CUDA backend with tokens drawn on the device (EngineConfig::device_sampling):
// greedy requests must produce exactly the tokens of the same engine drawing every token on the host
// (same forward passes, arg-max with the same tie rule); requests that need the host sampler
// (logprobs, penalties) share the batches and still get it; seeded sampled requests repeat.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "model/gpt_oss_forward.h"
#include "runtime/cuda_model_runner.h"
#include "runtime/sampler.h"
#include "unit/runtime/engine_test_util.h"

namespace gptoss::test {
namespace {

using runtime::Request;
using runtime::testing::collect;
using runtime::testing::describe;
using runtime::testing::Generation;
using runtime::testing::random_ids;

// The engine's first step waits here until the test opens the gate: the test submits its first request, waits
// for that step to begin, submits the rest and opens the gate, so that the rest form the second step whatever
// the threads' timing. The batches, and with them the kernels' arithmetic (which depends on a step's shape), are
// then the same in every run; a submission racing the engine thread made near-ties fall either way (r64).
struct StepGate : runtime::testing::Gate {
    std::atomic<int> deferred_rows{0};  // rows GatedRunner::draw_deferred passed on
};

class GatedRunner final : public runtime::ModelRunner {
public:
    GatedRunner(std::unique_ptr<runtime::ModelRunner> inner, std::shared_ptr<StepGate> gate)
        : inner_(std::move(inner)), gate_(std::move(gate)) {}
    const model::GptOssConfig& config() const override { return inner_->config(); }
    runtime::KvGeometry kv_geometry(int block_size) const override { return inner_->kv_geometry(block_size); }
    size_t free_memory_bytes() const override { return inner_->free_memory_bytes(); }
    size_t total_memory_bytes() const override { return inner_->total_memory_bytes(); }
    Status allocate_kv_cache(int block_size, runtime::KvBlockCounts counts) override {
        return inner_->allocate_kv_cache(block_size, counts);
    }
    Status forward(const runtime::Batch& batch, std::vector<float>* logits) override {
        gate_->pass();
        return inner_->forward(batch, logits);
    }
    bool samples_on_device() const override { return inner_->samples_on_device(); }
    bool host_idle_during_forward() const override { return inner_->host_idle_during_forward(); }
    bool can_defer_draws() const override { return inner_->can_defer_draws(); }
    Status draw_deferred(std::span<const DeferredDraw> draws, std::vector<int32_t>* ids) override {
        gate_->deferred_rows += static_cast<int>(draws.size());
        return inner_->draw_deferred(draws, ids);
    }
    int max_batch_entries() const override { return inner_->max_batch_entries(); }
    Status forward_sample(const runtime::Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                          std::vector<float>* logits) override {
        gate_->pass();
        return inner_->forward_sample(batch, params, ids, logits);
    }

private:
    std::unique_ptr<runtime::ModelRunner> inner_;
    std::shared_ptr<StepGate> gate_;
};

std::vector<Generation> run_engine(std::shared_ptr<const model::GptOssWeights> w, bool device_sampling,
                                   const std::vector<Request>& reqs, int speculative_tokens = 0,
                                   runtime::EngineStats* stats = nullptr, int* deferred_rows = nullptr) {
    runtime::SpeculativeConfig spec{.num_tokens = speculative_tokens, .ngram_min = 1, .ngram_max = 3, .max_running = 0};
    auto cuda_runner = runtime::CudaModelRunner::create(w, 8 + runtime::speculative_extra_entries(spec, 8), 256);
    EXPECT_TRUE(cuda_runner.ok()) << cuda_runner.status().to_string();
    if (!cuda_runner.ok()) return {};
    auto gate = std::make_shared<StepGate>();
    std::optional<std::unique_ptr<runtime::ModelRunner>> runner =
        std::make_unique<GatedRunner>(std::move(*cuda_runner), gate);
    runtime::EngineConfig cfg;
    cfg.device_sampling = device_sampling;
    cfg.scheduler.max_num_seqs = 8;  // the runner's, plus the drafts' entries
    cfg.speculative = spec;
    cfg.kv_budget.bytes = size_t{64} << 20;
    auto engine = runtime::Engine::create(std::move(*runner), cfg);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return {};
    std::vector<runtime::RequestHandle> handles;
    for (size_t i = 0; i < reqs.size(); ++i) {
        auto h = (*engine)->submit(reqs[i]);
        EXPECT_TRUE(h.ok()) << h.status().to_string();
        if (!h.ok()) {
            gate->open();
            return {};
        }
        handles.push_back(std::move(*h));
        if (i == 0) gate->wait_entered();  // the first step holds the first request alone
    }
    gate->open();
    std::vector<Generation> out;
    for (auto& h : handles) out.push_back(collect(h));
    EXPECT_TRUE((*engine)->wait_idle(std::chrono::milliseconds(60000)));
    if (stats) *stats = (*engine)->stats();
    if (deferred_rows) *deferred_rows = gate->deferred_rows;
    return out;
}

// The tiny_a test checkpoint (nullptr, with a test failure, if it does not load).
std::shared_ptr<const model::GptOssWeights> load_tiny_a() {
    auto loaded = model::GptOssWeights::load(std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a");
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return loaded.ok() ? std::shared_ptr<const model::GptOssWeights>(std::move(*loaded)) : nullptr;
}

TEST(CudaEngine, DeviceSamplingMatchesHostSampling) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    const int V = w->config.vocab_size;
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i)  // greedy, on the device
        reqs.push_back(
            Request{.prompt = random_ids(5 + 7 * i, V, 10 + i), .sampling = {.temperature = 0.0f}, .max_tokens = 14});
    Request lp{.prompt = random_ids(9, V, 30), .sampling = {.temperature = 0.0f}, .max_tokens = 14};
    lp.logprobs = 2;  // host: logprobs
    reqs.push_back(lp);
    reqs.push_back(Request{.prompt = random_ids(11, V, 31),
                           .sampling = {.temperature = 0.0f, .presence_penalty = 0.5f},
                           .max_tokens = 14});  // host: a penalty
    reqs.push_back(Request{.prompt = random_ids(6, V, 32),
                           .sampling = {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 7},
                           .max_tokens = 14});  // sampled on the device, seeded

    int deferred = 0;
    const std::vector<Generation> dev = run_engine(w, true, reqs, 0, nullptr, &deferred),
                                  host = run_engine(w, false, reqs);
    ASSERT_EQ(dev.size(), reqs.size());
    ASSERT_EQ(host.size(), reqs.size());
    EXPECT_EQ(deferred, 14) << "the penalty request's draws: edited and drawn on the device";
    for (size_t i = 0; i + 1 < reqs.size(); ++i) {
        EXPECT_EQ(dev[i].ids, host[i].ids) << i << ": " << describe(dev[i]) << " vs " << describe(host[i]);
        EXPECT_EQ(dev[i].finish, runtime::FinishReason::kLength) << i;
    }
    // The logprobs request came through the host sampler in the device run too.
    ASSERT_EQ(dev[4].top.size(), 14u);
    EXPECT_EQ(dev[4].top[0].size(), 2u);
    EXPECT_EQ(dev[4].logprobs, host[4].logprobs);
    // The seeded sampled request: valid ids, the same again in a new engine.
    const std::vector<Generation> again = run_engine(w, true, reqs);
    ASSERT_EQ(again.size(), reqs.size());
    ASSERT_EQ(dev.back().ids.size(), 14u);
    for (int32_t id : dev.back().ids) EXPECT_TRUE(id >= 0 && id < V) << id;
    EXPECT_EQ(again.back().ids, dev.back().ids);
}

// The logits of the position after `ids` on the CPU reference and on the CUDA runner (one
// sequence, one prefill step).
struct PositionLogits {
    std::vector<float> cpu, cuda;
};
PositionLogits position_logits(std::shared_ptr<const model::GptOssWeights> w, const std::vector<int32_t>& ids) {
    PositionLogits out;
    model::SingleSequence seq(*w, static_cast<int>(ids.size()) + 1, 16);
    EXPECT_TRUE(seq.append(ids, false, &out.cpu).ok());
    auto runner = runtime::CudaModelRunner::create(w, 1, static_cast<int>(ids.size()));
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    if (!runner.ok()) return out;
    const int nb = static_cast<int>(ids.size()) / 16 + 1;
    EXPECT_TRUE((*runner)->allocate_kv_cache(16, {nb, nb}).ok());
    std::vector<int32_t> table(static_cast<size_t>(nb));
    for (int b = 0; b < nb; ++b) table[static_cast<size_t>(b)] = b;
    runtime::Batch batch;
    batch.seqs.push_back({ids, 0, table, table, true});
    batch.num_tokens = static_cast<int>(ids.size());
    EXPECT_TRUE((*runner)->forward(batch, &out.cuda).ok());
    return out;
}

// N-gram speculative decoding on the CUDA runner: a verification becomes single-token decode entries
// on the sequence's block tables (CudaModelRunner::prepare), each entry reading the K/V the entries
// before it wrote in the same layer. The tiny checkpoint's greedy outputs fall into cycles within
// 300 tokens (~30% of the tokens come from kept drafts on the CPU), so drafts are kept here too.
// Greedy and seeded outputs must be the non-speculative engine's, with fewer steps than tokens, up
// to the backend's batch variance: a verification's step holds more entries than the plain run's,
// so its rows may take other kernels (the weight-only MoE up to 5 rows, the grouped one above) and
// round differently. Where the two runs part, both tokens must be maxima of that position's logits
// within the CUDA backend's own error there (max |CUDA − CPU| over the row): a near-tie, not a
// wrong token (a wrong KV row or draft moves a logit by far more). A seeded request may part the
// same way where its draw falls near a boundary of the tokens' shares: the speculative token must be
// drawn by the host sampler from logits within twice that error of the CPU's (a wrong draw index or
// row would part at the first kept draft, where no boundary is near as a rule).
TEST(CudaEngine, SpeculativeDecodingKeepsTheTokens) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    const int V = w->config.vocab_size;
    std::vector<Request> reqs;
    for (int i = 0; i < 3; ++i)
        reqs.push_back(
            Request{.prompt = random_ids(3 + 4 * i, V, 50 + i), .sampling = {.temperature = 0.0f}, .max_tokens = 300});
    Request lp{.prompt = random_ids(4, V, 60), .sampling = {.temperature = 0.0f}, .max_tokens = 300};
    lp.logprobs = 1;  // its rows come back to the host sampler
    reqs.push_back(lp);
    reqs.push_back(Request{.prompt = random_ids(5, V, 61),
                           .sampling = {.temperature = 0.7f, .top_k = 20, .seed = 9},
                           .max_tokens = 300});  // seeded, on the device: the same draws
    runtime::EngineStats plain_st, spec_st;
    const std::vector<Generation> plain = run_engine(w, true, reqs, 0, &plain_st);
    const std::vector<Generation> spec = run_engine(w, true, reqs, 4, &spec_st);
    ASSERT_EQ(plain.size(), reqs.size());
    ASSERT_EQ(spec.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
        size_t first_diff = 0;
        while (first_diff < std::min(plain[i].ids.size(), spec[i].ids.size()) &&
               plain[i].ids[first_diff] == spec[i].ids[first_diff])
            ++first_diff;
        EXPECT_EQ(spec[i].finish, runtime::FinishReason::kLength) << i;
        EXPECT_EQ(spec[i].ids.size(), plain[i].ids.size()) << i;
        if (first_diff == plain[i].ids.size()) continue;
        ASSERT_LT(first_diff, std::min(plain[i].ids.size(), spec[i].ids.size())) << i;
        std::vector<int32_t> ids = reqs[i].prompt;
        ids.insert(ids.end(), plain[i].ids.begin(), plain[i].ids.begin() + static_cast<long>(first_diff));
        const PositionLogits l = position_logits(w, ids);
        ASSERT_EQ(l.cpu.size(), static_cast<size_t>(V));
        ASSERT_EQ(l.cuda.size(), static_cast<size_t>(V));
        float err = 0.0f;
        for (int v = 0; v < V; ++v) err = std::max(err, std::fabs(l.cuda[v] - l.cpu[v]));
        const int32_t a = plain[i].ids[first_diff], b = spec[i].ids[first_diff];
        if (reqs[i].sampling.temperature != 0.0f) {
            // A seeded draw: the same u (seed, draw index) fell near a boundary of the kept tokens'
            // shares (or of the top-k set), which the two runs' roundings put on different sides.
            // The speculative run's token must be what the host sampler (the device sampler's
            // reference) draws from logits within twice the backend's error of the CPU's: that
            // token's logit raised, the rest shifted to move the draw onto it from either side (the
            // shares are walked in id order: lower ids down and higher up moves it later). A wrong
            // draw index or KV row in the verification is not near any boundary as a rule. The plain
            // run's token is reported, not tested: that run is the backend's own rounding.
            auto drawable = [&](int32_t x) {
                for (const float dir : {1.0f, -1.0f}) {
                    std::vector<float> moved = l.cpu;
                    for (int v = 0; v < V; ++v)
                        moved[static_cast<size_t>(v)] += v == x ? 2 * err : (v < x ? -dir : dir) * 2 * err;
                    if (runtime::sample_token(moved.data(), V, reqs[i].sampling, *reqs[i].sampling.seed, first_diff) ==
                        x)
                        return true;
                }
                return false;
            };
            const int32_t cpu_draw =
                runtime::sample_token(l.cpu.data(), V, reqs[i].sampling, *reqs[i].sampling.seed, first_diff);
            std::printf(
                "[spec] seeded request %zu parts at token %zu: plain %d, speculative %d, CPU logits' draw %d "
                "(CPU logits %.5f / %.5f, CUDA error %.5f); within 2 x error: plain %s, speculative %s\n",
                i, first_diff, a, b, cpu_draw, l.cpu[a], l.cpu[b], err, drawable(a) ? "drawn" : "never drawn",
                drawable(b) ? "drawn" : "never drawn");
            EXPECT_TRUE(drawable(b)) << i;
            continue;
        }
        const float top = *std::max_element(l.cpu.begin(), l.cpu.end());
        std::printf("[spec] request %zu parts at token %zu: CPU logits %.5f / %.5f, max %.5f, CUDA error %.5f\n", i,
                    first_diff, l.cpu[a], l.cpu[b], top, err);
        EXPECT_GE(l.cpu[a], top - 2 * err) << i;
        EXPECT_GE(l.cpu[b], top - 2 * err) << i;
    }
    std::printf("[spec] plain: %lld steps for %lld tokens; speculative: %lld steps, %lld drafts, %lld kept\n",
                static_cast<long long>(plain_st.num_steps), static_cast<long long>(plain_st.num_tokens_generated),
                static_cast<long long>(spec_st.num_steps), static_cast<long long>(spec_st.num_draft_tokens),
                static_cast<long long>(spec_st.num_accepted_tokens));
    EXPECT_EQ(spec_st.num_tokens_generated, plain_st.num_tokens_generated);
    EXPECT_GT(spec_st.num_accepted_tokens, 0);
    EXPECT_LT(spec_st.num_steps, plain_st.num_steps);
    EXPECT_EQ(spec_st.num_blocks_in_use.full, 0);
}

// Prompt logprobs on the CUDA runner: a scored prompt chunk is one entry with every row (forward()), and
// beside device-sampled requests it runs through forward() before the others' forward_sample(). The values
// must be the CPU reference's within the backend's own error: each is a logit minus the row's log-sum-exp, so
// within twice the largest |CUDA - CPU| over the prompt's rows (measured here by the runner's forward of the
// whole prompt as one scored entry) plus float rounding.
TEST(CudaEngine, PromptLogprobsMatchTheCpuReference) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    const int V = w->config.vocab_size;
    const std::vector<int32_t> prompt = random_ids(45, V, 61);
    std::vector<float> cpu_rows, cuda_rows;
    {
        model::SingleSequence seq(*w, static_cast<int>(prompt.size()) + 1, 16);
        ASSERT_TRUE(seq.append(prompt, true, &cpu_rows).ok());
        auto runner = runtime::CudaModelRunner::create(w, 1, static_cast<int>(prompt.size()));
        ASSERT_TRUE(runner.ok()) << runner.status().to_string();
        const int nb = static_cast<int>(prompt.size()) / 16 + 1;
        ASSERT_TRUE((*runner)->allocate_kv_cache(16, {nb, nb}).ok());
        std::vector<int32_t> table(static_cast<size_t>(nb));
        for (int b = 0; b < nb; ++b) table[static_cast<size_t>(b)] = b;
        runtime::Batch batch;
        batch.seqs.push_back({prompt, 0, table, table, true, true, true});
        batch.num_tokens = static_cast<int>(prompt.size());
        ASSERT_TRUE((*runner)->forward(batch, &cuda_rows).ok());
    }
    ASSERT_EQ(cpu_rows.size(), prompt.size() * static_cast<size_t>(V));
    ASSERT_EQ(cuda_rows.size(), cpu_rows.size());
    float max_err = 0.0f;
    for (size_t i = 0; i < cpu_rows.size(); ++i) max_err = std::max(max_err, std::fabs(cpu_rows[i] - cuda_rows[i]));
    const float tol = 2.0f * max_err + 1e-4f;
    std::printf("prompt logprobs: max |CUDA - CPU| over the prompt's rows %.4g, tolerance %.4g\n", max_err, tol);
    runtime::Sampler sampler(V);
    std::vector<runtime::PromptLogprob> want;
    for (size_t p = 0; p + 1 < prompt.size(); ++p)
        want.push_back(sampler.score(cpu_rows.data() + p * static_cast<size_t>(V), prompt[p + 1], 3));

    auto runner = runtime::CudaModelRunner::create(w, 8, 256);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    runtime::EngineConfig cfg;
    cfg.scheduler.max_num_seqs = 8;
    cfg.scheduler.max_scored_tokens = 7;  // several chunks
    cfg.kv_budget.bytes = size_t{64} << 20;
    auto engine = runtime::Engine::create(std::move(*runner), cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    std::vector<runtime::RequestHandle> hs;
    for (int i = 0; i < 3; ++i) {  // greedy requests drawn on the device share the steps
        auto h = (*engine)->submit(
            Request{.prompt = random_ids(9 + i, V, 70 + i), .sampling = {.temperature = 0.0f}, .max_tokens = 12});
        ASSERT_TRUE(h.ok());
        hs.push_back(std::move(*h));
    }
    Request scored{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 6};
    scored.prompt_logprobs = 3;
    auto h = (*engine)->submit(scored);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const Generation g = collect(*h);
    for (auto& o : hs) EXPECT_EQ(collect(o).ids.size(), 12u);
    EXPECT_EQ(g.ids.size(), 6u) << describe(g);
    ASSERT_EQ(g.prompt_lps.size(), want.size());
    for (size_t p = 0; p < want.size(); ++p) {
        const runtime::PromptLogprob& a = g.prompt_lps[p];
        EXPECT_NEAR(a.logprob, want[p].logprob, tol) << p;
        ASSERT_EQ(a.top.size(), 3u) << p;
        EXPECT_NEAR(a.top[0].logprob, want[p].top[0].logprob, tol) << p;
        EXPECT_EQ(a.rank == 1, a.top[0].id == prompt[p + 1] || a.top[0].logprob == a.logprob) << p;
    }
    EXPECT_TRUE((*engine)->wait_idle(std::chrono::milliseconds(60000)));
}

// min_tokens on the CUDA runner: the first min_tokens draws are drawn on the device under a mask of the stop ids
// (deferred draws), the rest as usual; the tokens equal an all-host engine's (one request alone: the same batch
// shapes, so the same logits; arg-max with the same tie rule).
TEST(CudaEngine, MinTokensMasksTheStopIds) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    Request free_run{
        .prompt = random_ids(12, w->config.vocab_size, 81), .sampling = {.temperature = 0.0f}, .max_tokens = 10};
    const std::vector<Generation> base = run_engine(w, true, {free_run});
    ASSERT_EQ(base.size(), 1u);
    ASSERT_EQ(base[0].ids.size(), 10u);
    Request r = free_run;
    r.stop_ids = {base[0].ids[0], base[0].ids[1]};
    r.min_tokens = 4;
    const std::vector<Generation> dev = run_engine(w, true, {r}), host = run_engine(w, false, {r});
    ASSERT_EQ(dev.size(), 1u);
    ASSERT_EQ(host.size(), 1u);
    ASSERT_GE(dev[0].ids.size(), 5u) << describe(dev[0]);
    for (size_t k = 0; k < 4; ++k)
        EXPECT_EQ(std::count(r.stop_ids.begin(), r.stop_ids.end(), dev[0].ids[k]), 0) << k << ": " << describe(dev[0]);
    EXPECT_EQ(dev[0].ids, host[0].ids) << describe(dev[0]) << " vs " << describe(host[0]);
}

// At output index i only the ids congruent to i mod 5 (a stand-in for a grammar's mask).
class ModuloConstraint final : public runtime::TokenConstraint {
public:
    explicit ModuloConstraint(int vocab) : vocab_(vocab) {}
    bool allowed_next(std::vector<uint8_t>* mask) override {
        mask->assign(static_cast<size_t>(vocab_), 0);
        for (int id = n_ % 5; id < vocab_; id += 5) (*mask)[static_cast<size_t>(id)] = 1;
        return true;
    }
    void accept(int32_t) override { ++n_; }

private:
    int vocab_, n_ = 0;
};
class ModuloFactory final : public runtime::TokenConstraintFactory {
public:
    explicit ModuloFactory(int vocab) : vocab_(vocab) {}
    std::unique_ptr<runtime::TokenConstraint> start() const override {
        return std::make_unique<ModuloConstraint>(vocab_);
    }

private:
    int vocab_;
};

// Constrained requests and bad_words on the CUDA runner are drawn on the device under their masks (deferred draws,
// counted by the gated runner), beside unconstrained ones: the greedy ones give the all-host engine's tokens, the
// seeded sampled one obeys its mask and repeats in a new engine; every constrained id is allowed.
TEST(CudaEngine, MaskedDrawsRunOnTheDevice) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    const int V = w->config.vocab_size;
    auto modulo = std::make_shared<ModuloFactory>(V);
    std::vector<Request> reqs;
    for (int i = 0; i < 3; ++i) {
        Request r{.prompt = random_ids(6 + 5 * i, V, 60 + i), .sampling = {.temperature = 0.0f}, .max_tokens = 12};
        if (i < 2) r.constraint = modulo;  // the third is unconstrained
        reqs.push_back(r);
    }
    Request bad{.prompt = random_ids(8, V, 70), .sampling = {.temperature = 0.0f}, .max_tokens = 12};
    reqs.push_back(bad);
    Request sampled{
        .prompt = random_ids(7, V, 71), .sampling = {.temperature = 0.9f, .top_p = 0.95f, .seed = 3}, .max_tokens = 12};
    sampled.constraint = modulo;
    reqs.push_back(sampled);
    // bad_words: the unconstrained greedy run's first two tokens, banned everywhere.
    const std::vector<Generation> free_run = run_engine(w, true, {bad});
    ASSERT_EQ(free_run.size(), 1u);
    ASSERT_GE(free_run[0].ids.size(), 2u);
    reqs[3].bad_words = {{free_run[0].ids[0]}, {free_run[0].ids[1]}};

    int deferred = 0, deferred_host = 0;
    const std::vector<Generation> dev = run_engine(w, true, reqs, 0, nullptr, &deferred);
    const std::vector<Generation> host = run_engine(w, false, reqs, 0, nullptr, &deferred_host);
    ASSERT_EQ(dev.size(), reqs.size());
    ASSERT_EQ(host.size(), reqs.size());
    EXPECT_EQ(deferred, 4 * 12) << "two constrained greedy, bad_words and the sampled constrained request";
    EXPECT_EQ(deferred_host, 0);
    for (size_t i = 0; i < 4; ++i) {
        ASSERT_EQ(dev[i].ids.size(), 12u) << i << ": " << describe(dev[i]);
        EXPECT_EQ(dev[i].ids, host[i].ids) << i << ": " << describe(dev[i]) << " vs " << describe(host[i]);
    }
    for (size_t i : {size_t{0}, size_t{1}, size_t{4}})
        for (size_t k = 0; k < dev[i].ids.size(); ++k)
            EXPECT_EQ(dev[i].ids[k] % 5, static_cast<int32_t>(k % 5)) << i << ": " << describe(dev[i]);
    for (int32_t id : dev[3].ids) EXPECT_TRUE(id != free_run[0].ids[0] && id != free_run[0].ids[1]) << describe(dev[3]);
    const std::vector<Generation> again = run_engine(w, true, reqs);
    ASSERT_EQ(again.size(), reqs.size());
    EXPECT_EQ(again[4].ids, dev[4].ids);
}

// The CUDA runner's KV blocks to and from host memory: what was written reads back bit for bit, in any block
// order, with -1 entries skipped on the way in; on the bf16 and the e4m3 cache.
TEST(CudaEngine, KvBlocksRoundTripThroughTheHost) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    for (bool kv_fp8 : {false, true}) {
        SCOPED_TRACE(kv_fp8 ? "e4m3 cache" : "bf16 cache");
        auto runner = runtime::CudaModelRunner::create(w, 2, 64, {}, false, kv_fp8);
        ASSERT_TRUE(runner.ok()) << runner.status().to_string();
        ASSERT_TRUE((*runner)->allocate_kv_cache(16, {12, 8}).ok());
        auto format = (*runner)->kv_format(16);
        ASSERT_TRUE(format.ok()) << format.status().to_string();
        EXPECT_EQ(format->dtype, kv_fp8 ? runtime::KvDtype::kE4m3 : runtime::KvDtype::kBf16);
        for (bool sliding : {false, true}) {
            const size_t B = sliding ? format->bytes_per_block_sliding : format->bytes_per_block_full;
            ASSERT_GT(B, 0u);
            std::vector<uint8_t> in(4 * B);
            std::mt19937 rng(sliding ? 5 : 6);
            for (auto& b : in) b = static_cast<uint8_t>(rng());
            const std::vector<int32_t> ids = {7, 0, -1, 3};  // the third is skipped
            ASSERT_TRUE((*runner)->write_kv_blocks(sliding, ids, in.data()).ok());
            std::vector<uint8_t> out(3 * B);
            const std::vector<int32_t> back = {3, 7, 0};
            ASSERT_TRUE((*runner)->read_kv_blocks(sliding, back, out.data()).ok());
            EXPECT_TRUE(std::equal(out.begin(), out.begin() + B, in.begin() + 3 * B));
            EXPECT_TRUE(std::equal(out.begin() + B, out.begin() + 2 * B, in.begin()));
            EXPECT_TRUE(std::equal(out.begin() + 2 * B, out.end(), in.begin() + B));
            const std::vector<int32_t> bad = {-1};
            EXPECT_FALSE((*runner)->read_kv_blocks(sliding, bad, out.data()).ok());
            const std::vector<int32_t> past = {sliding ? 8 : 12};
            EXPECT_FALSE((*runner)->write_kv_blocks(sliding, past, in.data()).ok());
        }
    }
}

// Disaggregated prefill on the CUDA runner: a decode engine that imports a prefill engine's KV for a prompt's
// whole blocks gives exactly the tokens and logprobs of an engine that computed those blocks itself by the same
// prefill (a prefix-cache hit): the same kernels compute the same bits, only the place differs. Prompts shorter
// and longer than the sliding window (16), greedy and seeded; the bf16 and the e4m3 cache.
TEST(CudaEngine, DisaggregatedPrefillKeepsTheTokens) {
    REQUIRE_GPU();
    const std::shared_ptr<const model::GptOssWeights> w = load_tiny_a();
    ASSERT_TRUE(w);
    const int V = w->config.vocab_size;
    for (bool kv_fp8 : {false, true}) {
        SCOPED_TRACE(kv_fp8 ? "e4m3 cache" : "bf16 cache");
        auto make = [&] {
            auto runner = runtime::CudaModelRunner::create(w, 8, 256, {}, false, kv_fp8);
            EXPECT_TRUE(runner.ok()) << runner.status().to_string();
            runtime::EngineConfig cfg;
            cfg.scheduler.max_num_seqs = 8;
            cfg.scheduler.max_num_batched_tokens = 256;
            cfg.kv_budget.bytes = size_t{64} << 20;
            auto e = runtime::Engine::create(std::move(*runner), cfg);
            EXPECT_TRUE(e.ok()) << e.status().to_string();
            return e.ok() ? std::move(*e) : nullptr;
        };
        auto producer = make(), consumer = make(), local = make();
        ASSERT_TRUE(producer && consumer && local);
        int64_t imported = 0;
        for (int i = 0; i < 5; ++i) {
            const int n = std::vector<int>{17, 33, 50, 129, 200}[static_cast<size_t>(i)];
            Request r{.prompt = random_ids(n, V, 90 + i), .max_tokens = 10, .logprobs = 0};
            r.sampling = i % 2 ? runtime::SamplingParams{.temperature = 0.0f}
                               : runtime::SamplingParams{.temperature = 0.9f, .top_p = 0.95f, .seed = 11u + i};
            const size_t P = static_cast<size_t>(n - 1) / 16 * 16;
            Request prefix{.prompt = std::vector<int32_t>(r.prompt.begin(), r.prompt.begin() + static_cast<long>(P)),
                           .max_tokens = 1};
            // The prefill worker's export, and the local engine's own prefill of the same blocks.
            Request exp = prefix;
            exp.export_kv = true;
            auto eh = producer->submit(std::move(exp));
            ASSERT_TRUE(eh.ok()) << eh.status().to_string();
            std::shared_ptr<const runtime::KvTransfer> kv;
            while (auto ev = eh->next(std::chrono::milliseconds(60000)))
                if (ev->is_final()) {
                    kv = ev->kv;
                    break;
                }
            ASSERT_TRUE(kv);
            auto lh = local->submit(std::move(prefix));
            ASSERT_TRUE(lh.ok());
            collect(*lh);
            Request d = r;
            d.kv_prefix = kv;
            auto dh = consumer->submit(std::move(d));
            ASSERT_TRUE(dh.ok()) << dh.status().to_string();
            const Generation got = collect(*dh);
            auto wh = local->submit(r);
            ASSERT_TRUE(wh.ok());
            const Generation want = collect(*wh);
            EXPECT_EQ(got.num_cached_tokens, static_cast<int>(P));
            EXPECT_EQ(want.num_cached_tokens, static_cast<int>(P));
            EXPECT_EQ(got.ids, want.ids) << n << ": " << describe(got) << " vs " << describe(want);
            EXPECT_EQ(got.logprobs, want.logprobs) << n;
            imported += static_cast<int64_t>(P);
        }
        EXPECT_EQ(consumer->stats().num_imported_tokens, imported);
        EXPECT_EQ(consumer->stats().num_kv_imports_dropped, 0);
    }
}

}  // namespace
}  // namespace gptoss::test
