// Speculative decoding by n-gram lookup: the drafter on its own, the scheduler's handling of drafts,
// and the engine with speculation on against the unpaged single-sequence reference (the same
// tokens, logprobs and finish as without speculation, for greedy, seeded and penalised requests,
// under batching, preemption and prefix caching), with drafts actually kept.
#include "runtime/speculative.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "model/random_checkpoint.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"

namespace gptoss::runtime {
namespace {

namespace fs = std::filesystem;
using namespace gptoss::runtime::testing;

std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int k, int nmin, int nmax) {
    std::vector<int32_t> d;
    const int n = propose_ngram_drafts(tokens, k, nmin, nmax, &d);
    EXPECT_EQ(n, static_cast<int>(d.size()));
    return d;
}

TEST(NgramDrafter, ProposesWhatFollowedTheLongestLatestMatch) {
    // Suffix (7 8 9): its only earlier occurrence is at 1..3, followed by 4 5 6.
    EXPECT_EQ(propose({0, 7, 8, 9, 4, 5, 6, 1, 7, 8, 9}, 3, 1, 4), (std::vector<int32_t>{4, 5, 6}));
    // The longest match wins over a later, shorter one: (2 3) at 0..1 → 10; (3) alone at 5 → 11.
    EXPECT_EQ(propose({2, 3, 10, 4, 4, 3, 11, 2, 3}, 1, 1, 4), (std::vector<int32_t>{10}));
    // Among equally long matches the latest: (5 6) at 0..1 → 1 and at 3..4 → 2.
    EXPECT_EQ(propose({5, 6, 1, 5, 6, 2, 9, 5, 6}, 2, 2, 2), (std::vector<int32_t>{2, 9}));
    // At most max_drafts, and no further than the end of the tokens.
    EXPECT_EQ(propose({1, 2, 3, 4, 5, 1, 2}, 2, 2, 3), (std::vector<int32_t>{3, 4}));
    EXPECT_EQ(propose({1, 2, 3, 1, 2}, 8, 2, 3), (std::vector<int32_t>{3, 1, 2}));
    // A run of one token: the match overlaps the suffix and proposes the run's continuation.
    EXPECT_EQ(propose({4, 4, 4, 4}, 5, 2, 3), (std::vector<int32_t>{4}));
}

// Matches far apart in a long context (the scan goes by blocks of 64): the longest wins, the
// latest among equals, whatever block they sit in.
TEST(NgramDrafter, LongContextMatchesAcrossBlocks) {
    std::vector<int32_t> t(1000);
    for (int i = 0; i < 1000; ++i) t[i] = 1000 + i;  // no accidental matches
    const std::vector<int32_t> tail = {1, 2, 3, 4};
    auto plant = [&](int at, std::vector<int32_t> gram, int32_t next) {
        for (size_t k = 0; k < gram.size(); ++k) t[at + k] = gram[k];
        t[at + gram.size()] = next;
    };
    plant(100, {1, 2, 3, 4}, 501);  // the 4-gram, far back
    plant(500, {2, 3, 4}, 502);     // a 3-gram
    plant(900, {3, 4}, 503);        // a 2-gram, latest
    plant(63, {3, 4}, 504);         // a 2-gram at a block edge
    t.insert(t.end(), tail.begin(), tail.end());
    EXPECT_EQ(propose(t, 1, 2, 4), (std::vector<int32_t>{501}));
    EXPECT_EQ(propose(t, 1, 2, 3), (std::vector<int32_t>{502}));
    EXPECT_EQ(propose(t, 1, 2, 2), (std::vector<int32_t>{503}));
    EXPECT_EQ(propose(t, 2, 4, 4), (std::vector<int32_t>{501, 1105}));
}

TEST(NgramDrafter, NothingBelowTheMinimumOrWithoutRoom) {
    EXPECT_TRUE(propose({1, 2, 3, 4}, 3, 1, 4).empty());     // the last token never occurred before
    EXPECT_TRUE(propose({1, 2, 9, 5, 2}, 3, 2, 4).empty());  // (2) matches, (5 2) does not: below min 2
    EXPECT_EQ(propose({1, 2, 9, 5, 2}, 3, 1, 4), (std::vector<int32_t>{9, 5, 2}));
    EXPECT_TRUE(propose({1, 2, 1, 2}, 0, 1, 4).empty());  // no room
    EXPECT_TRUE(propose({7}, 3, 1, 4).empty());           // nothing earlier
    EXPECT_TRUE(propose({}, 3, 1, 4).empty());
    EXPECT_EQ(propose({3, 3}, 2, 1, 64), (std::vector<int32_t>{3}));  // ngram_max past the tokens
}

TEST(NgramDrafter, ConfigRanges) {
    EXPECT_TRUE(validate_speculative_config({}).ok());
    EXPECT_TRUE(validate_speculative_config({.num_tokens = 16, .ngram_min = 1, .ngram_max = 64}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = -1}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 17}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 3, .ngram_min = 0}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 3, .ngram_min = 5, .ngram_max = 4}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 3, .ngram_min = 1, .ngram_max = 65}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 3, .max_running = -1}).ok());
}

// ---- the scheduler ----

Sequence decoding_sequence(uint64_t id, int len) {
    Sequence s;
    s.id = id;
    for (int i = 0; i < len; ++i) s.tokens.push_back(i);
    s.num_prompt_tokens = len;
    return s;
}

// Runs the prompt's prefill so that the sequence decodes next.
void prefill(Scheduler& sched, Sequence& s) {
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    ASSERT_EQ(out.seqs[0].num_new_tokens, s.num_tokens());
    sched.on_step_done(out);
    s.tokens.push_back(100);  // the sampled token
}

void add_drafts(Sequence& s, std::vector<int32_t> d) {
    s.tokens.insert(s.tokens.end(), d.begin(), d.end());
    s.num_draft = static_cast<int>(d.size());
}

TEST(SpeculativeScheduler, DraftsGoWholeAndRejectedOnesAreNotComputed) {
    KvCacheManager kv(4, 0, {64, 64}, true);
    Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 16}, &kv);
    Sequence s = decoding_sequence(1, 6);
    sched.add(&s);
    prefill(sched, s);
    add_drafts(s, {7, 8, 9});
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    EXPECT_EQ(out.seqs[0].num_new_tokens, 4);
    EXPECT_EQ(out.seqs[0].num_draft, 3);
    EXPECT_TRUE(out.seqs[0].sample);
    // Keep draft 7, reject 8 and 9: the engine's part, then the scheduler's.
    s.tokens.resize(s.tokens.size() - 2);
    s.num_draft = 0;
    const int rejected[] = {2};
    sched.on_step_done(out, rejected);
    EXPECT_EQ(s.num_computed, 8);  // the prompt's 6, token 100 and the kept draft
    EXPECT_EQ(s.num_tokens(), 8);
    EXPECT_EQ(s.num_generated(), 2);
}

TEST(SpeculativeScheduler, DraftsThatDoNotFitTheBudgetAreDropped) {
    KvCacheManager kv(4, 0, {64, 64}, true);
    Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 8}, &kv);
    Sequence a = decoding_sequence(1, 6), b = decoding_sequence(2, 5);
    sched.add(&a);
    sched.add(&b);
    SchedulerOutput first = sched.schedule();  // a's 6 and 2 of b's 5
    sched.on_step_done(first);
    a.tokens.push_back(100);
    SchedulerOutput second = sched.schedule();  // a decodes, b finishes its prompt
    sched.on_step_done(second);
    a.tokens.push_back(104);
    b.tokens.push_back(101);
    // a: 1 + 6 drafts = 7 of 8; b then gets 1. Next, a has 7 drafts: 8 fit, b gets nothing and loses
    // its drafts (not scheduled this step).
    add_drafts(a, {1, 2, 3, 4, 5, 6});
    add_drafts(b, {9});
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[0].num_draft, 6);
    EXPECT_EQ(out.seqs[1].num_draft, 0);  // 1 + 1 > the one token left: decodes alone
    EXPECT_EQ(out.seqs[1].num_new_tokens, 1);
    EXPECT_EQ(b.num_draft, 0);
    EXPECT_EQ(b.num_tokens(), 6);  // its prompt's 5 and token 101
    a.tokens.resize(a.tokens.size() - 6);
    a.num_draft = 0;
    const int rejected[] = {6, 0};
    sched.on_step_done(out, rejected);
    a.tokens.push_back(102);
    b.tokens.push_back(103);
    add_drafts(a, {1, 2, 3, 4, 5, 6, 7});
    add_drafts(b, {9, 9});
    out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    EXPECT_EQ(out.seqs[0].seq, &a);
    EXPECT_EQ(out.seqs[0].num_new_tokens, 8);
    EXPECT_EQ(b.num_draft, 0);
    EXPECT_EQ(b.num_tokens(), 7);
}

TEST(SpeculativeScheduler, DraftsNeverCostAnotherSequenceItsBlocks) {
    // 4 full blocks of 4: a holds 2 (6 tokens + 1), b holds 2. a's drafts would need a third.
    KvCacheManager kv(4, 0, {4, 4}, false);
    Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 32}, &kv);
    Sequence a = decoding_sequence(1, 6), b = decoding_sequence(2, 7);
    sched.add(&a);
    sched.add(&b);
    SchedulerOutput first = sched.schedule();
    ASSERT_EQ(first.seqs.size(), 2u);
    sched.on_step_done(first);
    a.tokens.push_back(100);
    b.tokens.push_back(101);
    add_drafts(a, {1, 2, 3});
    SchedulerOutput out = sched.schedule();
    EXPECT_TRUE(out.preempted.empty());
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[0].num_draft, 0);
    EXPECT_EQ(out.seqs[0].num_new_tokens, 1);
    EXPECT_EQ(a.num_tokens(), 7);
}

// Drafts do not count against max_num_seqs (concurrency): a waiting sequence is admitted beside
// a drafting one. The runner's extra entries for them are the engine's and the CLI's business.
TEST(SpeculativeScheduler, DraftsDoNotTakePlacesOfMaxNumSeqs) {
    KvCacheManager kv(4, 0, {64, 64}, false);
    Scheduler sched({.max_num_seqs = 2, .max_num_batched_tokens = 32}, &kv);
    Sequence a = decoding_sequence(1, 3);
    sched.add(&a);
    prefill(sched, a);
    Sequence b = decoding_sequence(2, 3);
    sched.add(&b);
    add_drafts(a, {1, 2});
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[0].num_draft, 2);
    EXPECT_EQ(out.seqs[1].seq, &b);
    EXPECT_EQ(sched.num_waiting(), 0);
}

TEST(SpeculativeConfigTest, ExtraRunnerEntries) {
    EXPECT_EQ(speculative_extra_entries({.num_tokens = 0}, 8), 0);
    EXPECT_EQ(speculative_extra_entries({.num_tokens = 4, .max_running = 8}, 1), 4);     // one drafting sequence
    EXPECT_EQ(speculative_extra_entries({.num_tokens = 4, .max_running = 8}, 256), 32);  // at most 8 draft
    EXPECT_EQ(speculative_extra_entries({.num_tokens = 3, .max_running = 0}, 16), 48);   // all may
}

// ---- the engine ----

// Vocabulary 40: small: random weights fall into loops the drafter predicts.
model::GptOssConfig small_config() { return small_engine_config(40, 128); }

EngineConfig spec_config(int num_tokens, int full_blocks = 256, int sliding_blocks = 128) {
    EngineConfig c = small_engine_test_config(full_blocks, sliding_blocks);
    c.speculative = SpeculativeConfig{.num_tokens = num_tokens, .ngram_min = 1, .ngram_max = 3, .max_running = 0};
    return c;
}

class SpeculativeEngineTest : public RandomCheckpointTest<SpeculativeEngineTest> {
public:
    static model::GptOssConfig config() { return small_config(); }
    static constexpr uint64_t kSeed = 5;
    static constexpr const char* kName = "gptoss_spec_test_";
};

// Greedy, seeded, top-p, penalised and logprob requests, half joining mid-flight: every one equals
// the unpaged reference (tokens, logprobs, finish), and drafts were proposed and kept. (This
// checkpoint's greedy outputs settle into a cycle of ~36 tokens, which the drafter then predicts.)
TEST_F(SpeculativeEngineTest, BatchMatchesTheReferenceAndKeepsDrafts) {
    for (int k : {1, 4, 8}) {
        EngineStats st;
        expect_batch_matches_reference(weights_, spec_config(k), mixed_requests(40, 5, 8, 90, 3 + k), &st);
        EXPECT_GT(st.num_draft_tokens, 0) << k;
        EXPECT_GT(st.num_accepted_tokens, st.num_draft_tokens / 4) << k;  // cycles: most drafts kept
        EXPECT_LT(st.num_steps, st.num_tokens_generated) << k;            // fewer steps than tokens
    }
}

// A single greedy request: more than one token a step once the output cycles; the same tokens.
TEST_F(SpeculativeEngineTest, GreedyRequestTakesSeveralTokensAStep) {
    Request r{.prompt = random_ids(6, 40, 9), .sampling = {.temperature = 0.0f}, .max_tokens = 100};
    const Generation want = reference_generate(*weights_, r);
    auto engine = make_engine(weights_, spec_config(6));
    ASSERT_TRUE(engine);
    auto h = engine->submit(r);
    ASSERT_TRUE(h.ok());
    const Generation got = collect(*h);
    EXPECT_TRUE(got.same_tokens(want)) << describe(got) << " vs " << describe(want);
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    const EngineStats st = engine->stats();
    EXPECT_EQ(st.num_tokens_generated, 100);
    EXPECT_LT(st.num_steps, 60);  // 1 prefill step + ≤ 99 decode steps without speculation
    EXPECT_EQ(st.num_blocks_in_use.full, 0);
}

// Stops inside a run of kept drafts end the request there: stop ids, stop strings and max_tokens
// (which also caps the drafts: never a token past it).
TEST_F(SpeculativeEngineTest, StopsInsideKeptDrafts) {
    const Detokenizer detok = [](std::span<const int32_t> ids) {
        std::string s;
        for (int32_t id : ids) s += static_cast<char>('A' + id % 26);
        return s;
    };
    EngineConfig cfg = spec_config(6);
    cfg.detokenizer = detok;
    auto engine = make_engine(weights_, cfg);
    ASSERT_TRUE(engine);
    const std::vector<int32_t> prompt = random_ids(6, 40, 9);
    auto greedy = [&](int max_tokens) {
        Request r;
        r.prompt = prompt;
        r.sampling.temperature = 0.0f;
        r.max_tokens = max_tokens;
        return r;
    };
    const Generation free_run = reference_generate(*weights_, greedy(100));
    ASSERT_EQ(free_run.ids.size(), 100u);
    std::vector<Request> reqs;
    // The 80th token's id as a stop id: far into the cycle, where drafts are kept.
    reqs.push_back(greedy(100));
    reqs.back().stop_ids = {free_run.ids[79]};
    // A stop string made of tokens 70..72's letters.
    reqs.push_back(greedy(100));
    reqs.back().stop_strings = {detok(std::span(free_run.ids).subspan(70, 3))};
    for (int m : {37, 61, 75, 93}) reqs.push_back(greedy(m));
    for (const Request& r : reqs) {
        auto h = engine->submit(r);
        ASSERT_TRUE(h.ok());
        const Generation got = collect(*h);
        const Generation want = reference_generate(*weights_, r, &detok);
        EXPECT_TRUE(got.same_tokens(want)) << describe(got) << " vs " << describe(want);
        EXPECT_EQ(got.trim_bytes, want.trim_bytes);
        EXPECT_LE(got.ids.size(), static_cast<size_t>(r.max_tokens));
    }
    EXPECT_EQ(reqs[0].stop_ids.size(), 1u);
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_GT(engine->stats().num_accepted_tokens, 0);
    EXPECT_EQ(engine->stats().num_blocks_in_use.full, 0);
}

// A KV budget so small that sequences are preempted (and lose their drafts) and drafts often do
// not fit: nothing changes.
TEST_F(SpeculativeEngineTest, PreemptionAndTightBlocksChangeNothing) {
    EngineStats st;
    expect_batch_matches_reference(weights_, spec_config(5, 40, 24), mixed_requests(40, 5, 6, 80, 21), &st);
    EXPECT_GT(st.num_preemptions, 0);
    EXPECT_GT(st.num_accepted_tokens, 0);
}

// Rejected drafts leave their K/V in the blocks, to be overwritten; only computed positions are
// offered to the prefix cache. Requests whose prompts continue an earlier speculative run (so they
// hit its blocks) equal their cold references.
TEST_F(SpeculativeEngineTest, PrefixCacheAfterRejectedDrafts) {
    auto engine = make_engine(weights_, spec_config(4));
    ASSERT_TRUE(engine);
    auto run = [&](const Request& r) {
        auto h = engine->submit(r);
        EXPECT_TRUE(h.ok());
        return h.ok() ? collect(*h) : Generation{};
    };
    const Request a{.prompt = random_ids(7, 40, 31), .sampling = {.temperature = 0.0f}, .max_tokens = 60};
    const Generation ga = run(a);
    ASSERT_TRUE(ga.same_tokens(reference_generate(*weights_, a)));
    for (int cut : {5, 22, 41, 60}) {
        Request b{.prompt = a.prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 30};
        b.prompt.insert(b.prompt.end(), ga.ids.begin(), ga.ids.begin() + cut);
        if (cut % 2 == 1) b.prompt.push_back(static_cast<int32_t>(cut % 40));  // leave the cycle
        const Generation gb = run(b);
        EXPECT_GT(gb.num_cached_tokens, 0) << cut;
        EXPECT_TRUE(gb.same_tokens(reference_generate(*weights_, b))) << cut << ": " << describe(gb);
    }
    ASSERT_TRUE(engine->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_GT(engine->stats().num_draft_tokens, engine->stats().num_accepted_tokens);  // some were rejected
}

// Speculation waits while more sequences run than max_running, and for none at num_tokens 0.
TEST_F(SpeculativeEngineTest, OffAboveMaxRunningAndAtZeroTokens) {
    std::vector<Request> reqs = mixed_requests(40, 5, 6, 60, 8);
    EngineConfig cfg = spec_config(4);
    cfg.speculative.max_running = 2;
    EngineStats st;
    // 6 requests: the first 3 run together, the rest join; speculation only once ≤ 2 remain.
    expect_batch_matches_reference(weights_, cfg, reqs, &st);
    EngineStats all, off;
    expect_batch_matches_reference(weights_, spec_config(4), reqs, &all);
    expect_batch_matches_reference(weights_, spec_config(0), reqs, &off);
    EXPECT_LT(st.num_draft_tokens, all.num_draft_tokens);
    EXPECT_EQ(off.num_draft_tokens, 0);
    EXPECT_FALSE(Engine::create(std::make_unique<CpuModelRunner>(weights_),
                                [] {
                                    EngineConfig c = spec_config(4);
                                    c.speculative.ngram_min = 0;
                                    return c;
                                }())
                     .ok());
}

// Backing off after verifications that keep nothing: fewer drafts fed, a larger share of them
// kept, the same tokens.
TEST_F(SpeculativeEngineTest, BackOffAfterRejectedDrafts) {
    const std::vector<Request> reqs = mixed_requests(40, 5, 6, 90, 17);
    EngineConfig eager = spec_config(4), patient = spec_config(4);
    eager.speculative.max_backoff = 0;
    patient.speculative.max_backoff = 32;
    EngineStats e, p;
    expect_batch_matches_reference(weights_, eager, reqs, &e);
    expect_batch_matches_reference(weights_, patient, reqs, &p);
    EXPECT_LT(p.num_draft_tokens, e.num_draft_tokens);
    EXPECT_GT(p.num_accepted_tokens * e.num_draft_tokens, e.num_accepted_tokens * p.num_draft_tokens);
    EXPECT_GT(p.num_accepted_tokens, 0);
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 2, .max_backoff = -1}).ok());
    EXPECT_FALSE(validate_speculative_config({.num_tokens = 2, .max_backoff = 1025}).ok());
}

// A runner that draws on the "device" (greedy rows: argmax; rows with logprobs or penalties come
// back as logits): a verification asks for one draw a fed token, each with its own draw index.
class DeviceSamplingRunner : public ModelRunner {
public:
    explicit DeviceSamplingRunner(std::shared_ptr<const model::GptOssWeights> w) : inner_(std::move(w)) {}
    const model::GptOssConfig& config() const override { return inner_.config(); }
    KvGeometry kv_geometry(int block_size) const override { return inner_.kv_geometry(block_size); }
    size_t free_memory_bytes() const override { return inner_.free_memory_bytes(); }
    Status allocate_kv_cache(int block_size, KvBlockCounts counts) override {
        return inner_.allocate_kv_cache(block_size, counts);
    }
    Status forward(const Batch& batch, std::vector<float>* logits) override { return inner_.forward(batch, logits); }
    bool samples_on_device() const override { return true; }
    int max_batch_entries() const override { return 16 + 2; }  // spec_config's max_num_seqs + 2
    Status forward_sample(const Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                          std::vector<float>* logits) override {
        rows_.clear();
        RETURN_IF_ERROR(inner_.forward(batch, &rows_));
        const size_t V = static_cast<size_t>(config().vocab_size);
        if (rows_.size() != params.size() * V) return internal_error("one parameter set per logits row");
        for (size_t i = 0; i < params.size(); ++i) {
            const float* r = rows_.data() + i * V;
            draw_indices.push_back(params[i].draw_index);
            if (params[i].want_logits) {
                ids->push_back(-1);
                logits->insert(logits->end(), r, r + V);
            } else {
                ids->push_back(static_cast<int32_t>(std::max_element(r, r + V) - r));
            }
        }
        max_rows = std::max(max_rows, static_cast<int>(params.size()));
        return ok_status();
    }
    std::vector<uint64_t> draw_indices;
    int max_rows = 0;

private:
    CpuModelRunner inner_;
    std::vector<float> rows_;
};

TEST_F(SpeculativeEngineTest, DeviceDrawsOneRowPerVerifiedToken) {
    std::vector<Request> reqs;
    reqs.push_back(Request{.prompt = random_ids(6, 40, 9), .sampling = {.temperature = 0.0f}, .max_tokens = 90});
    Request lp{.prompt = random_ids(5, 40, 10), .sampling = {.temperature = 0.0f}, .max_tokens = 90};
    lp.logprobs = 2;
    reqs.push_back(lp);
    reqs.push_back(Request{.prompt = random_ids(4, 40, 12),
                           .sampling = {.temperature = 0.0f, .repetition_penalty = 1.3f},
                           .max_tokens = 90});
    auto runner = std::make_unique<DeviceSamplingRunner>(weights_);
    DeviceSamplingRunner* r = runner.get();
    auto engine = Engine::create(std::move(runner), spec_config(4));
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    std::vector<RequestHandle> hs;
    for (const Request& q : reqs) hs.push_back(std::move(*(*engine)->submit(q)));
    for (size_t i = 0; i < reqs.size(); ++i) {
        const Generation got = collect(hs[i]);
        const Generation want = reference_generate(*weights_, reqs[i]);
        EXPECT_TRUE(got.same_tokens(want)) << i << ": " << describe(got) << " vs " << describe(want);
    }
    ASSERT_TRUE((*engine)->wait_idle(std::chrono::milliseconds(60000)));
    EXPECT_GT((*engine)->stats().num_accepted_tokens, 0);
    EXPECT_GT(r->max_rows, static_cast<int>(reqs.size()));  // some step verified drafts
    // The drafts of a step take at most the runner's 2 entries beyond max_num_seqs.
    EXPECT_LE(r->max_rows, static_cast<int>(reqs.size()) + 2);
}
}  // namespace
}  // namespace gptoss::runtime
