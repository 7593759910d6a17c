// Scheduler + KvCacheManager without a model. A fake KV memory stores, at every slot the model
// would write, a value that identifies the token prefix up to that position; every read a real
// forward would make (all earlier positions for full layers, the window for sliding layers) is
// checked against the expected value. So prefix-cache hits, shared blocks, sliding-window releases
// and preemption are all verified for correctness, not just for bookkeeping.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <unordered_map>

namespace gptoss::runtime {
namespace {

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

class FakeKv {
public:
    FakeKv(const KvCacheManager& kv, int window)
        : kv_(kv),
          bs_(kv.block_size()),
          window_(window),
          full_(static_cast<size_t>(kv.full().num_blocks()) * bs_, 0),
          sliding_(static_cast<size_t>(kv.sliding().num_blocks()) * bs_, 0) {}

    // Checks reads and performs writes as a forward over `out` would. A position's K/V value is a hash
    // of tokens [0, pos].
    void run(const SchedulerOutput& out, int budget) {
        ASSERT_LE(out.num_tokens, budget);
        std::unordered_map<int64_t, int> written;  // slot -> count (full: +, sliding: -)
        for (const ScheduledSequence& ss : out.seqs) {
            const Sequence& s = *ss.seq;
            ASSERT_EQ(ss.start_pos, s.num_computed);
            ASSERT_GT(ss.num_new_tokens, 0);
            ASSERT_LE(ss.start_pos + ss.num_new_tokens, s.num_tokens());
            ASSERT_EQ(ss.sample, ss.start_pos + ss.num_new_tokens == s.num_tokens());
            ASSERT_EQ(s.status, SequenceStatus::kRunning);
            for (int pos = ss.start_pos; pos < ss.start_pos + ss.num_new_tokens; ++pos) {
                const int b = pos / bs_;
                ASSERT_LT(b, static_cast<int>(s.block_table_full.size()));
                const int fb = s.block_table_full[b];
                ASSERT_GE(fb, 0);
                ASSERT_EQ(kv_.full().ref_count(fb), 1) << "writing a shared full block";
                ASSERT_EQ(written[fb * bs_ + pos % bs_]++, 0) << "two writers of one slot";
                if (window_ > 0) {
                    const int sb = s.block_table_sliding[b];
                    ASSERT_GE(sb, 0);
                    ASSERT_EQ(kv_.sliding().ref_count(sb), 1) << "writing a shared sliding block";
                    ASSERT_EQ(written[-1 - (sb * bs_ + pos % bs_)]++, 0);
                }
            }
        }
        for (const ScheduledSequence& ss : out.seqs) {
            const Sequence& s = *ss.seq;
            uint64_t h = 0;
            std::vector<uint64_t> vals(static_cast<size_t>(ss.start_pos + ss.num_new_tokens));
            for (size_t i = 0; i < vals.size(); ++i) vals[i] = h = mix(h ^ static_cast<uint64_t>(s.tokens[i]));
            for (int pos = ss.start_pos; pos < ss.start_pos + ss.num_new_tokens; ++pos) {
                for (int j = 0; j < pos; ++j) {
                    const int fb = s.block_table_full[j / bs_];
                    ASSERT_EQ(full_[fb * bs_ + j % bs_], vals[j]) << "full layer reads a wrong K/V at " << j;
                }
                if (window_ > 0) {
                    for (int j = std::max(0, pos - window_ + 1); j < pos; ++j) {
                        const int sb = s.block_table_sliding[j / bs_];
                        ASSERT_GE(sb, 0) << "window block released too early (pos " << pos << ", key " << j << ")";
                        ASSERT_EQ(sliding_[sb * bs_ + j % bs_], vals[j]) << "sliding layer reads a wrong K/V";
                    }
                }
                full_[s.block_table_full[pos / bs_] * bs_ + pos % bs_] = vals[pos];
                if (window_ > 0) sliding_[s.block_table_sliding[pos / bs_] * bs_ + pos % bs_] = vals[pos];
            }
        }
    }

private:
    const KvCacheManager& kv_;
    int bs_, window_;
    std::vector<uint64_t> full_, sliding_;
};

struct SimRequest {
    std::unique_ptr<Sequence> seq;
    int max_tokens = 0;
};

std::unique_ptr<Sequence> make_seq(uint64_t id, std::vector<int32_t> prompt) {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->tokens = std::move(prompt);
    s->num_prompt_tokens = s->num_tokens();
    return s;
}

// Runs the scheduler with random arrivals (prompts sharing prefixes), cancellations and a fake
// sampler until everything finishes; FakeKv checks every step.
struct SimResult {
    int64_t preemptions = 0;
    int64_t cached = 0;
    int max_running = 0;
};

// copies > 1: a request comes with up to copies - 1 more of its prompt at once (the choices of an n > 1 request).
// priorities > 1: each request gets a priority in [0, priorities) (its copies the same).
SimResult simulate(int block_size, int window, KvBlockCounts counts, bool prefix_caching, SchedulerConfig cfg,
                   uint32_t seed, int num_requests, bool cancels, int copies = 1, int priorities = 1) {
    KvCacheManager kv(block_size, window, counts, prefix_caching);
    Scheduler sched(cfg, &kv);
    FakeKv mem(kv, window);
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> prefixes;
    for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> p(5 + rng() % 30);
        for (auto& t : p) t = static_cast<int32_t>(rng() % 50);
        prefixes.push_back(p);
    }
    std::vector<SimRequest> reqs;
    int submitted = 0, finished = 0;
    SimResult r;
    const int64_t capacity = kv.capacity_tokens();
    for (int step = 0; finished < num_requests; ++step) {
        EXPECT_LT(step, 100000) << "no progress";
        if (step >= 100000) break;
        while (submitted < num_requests && rng() % 3 == 0) {
            std::vector<int32_t> prompt;
            if (rng() % 2) prompt = prefixes[rng() % prefixes.size()];
            const int tail = 1 + static_cast<int>(rng() % 40);
            for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<int32_t>(rng() % 50));
            int max_tokens = 1 + static_cast<int>(rng() % 20);
            if (static_cast<int64_t>(prompt.size()) + max_tokens > capacity) {
                prompt.resize(static_cast<size_t>(capacity / 2));
                max_tokens = static_cast<int>(capacity / 4);
            }
            const int n = 1 + static_cast<int>(rng() % static_cast<uint32_t>(copies));
            const int priority = static_cast<int>(rng() % static_cast<uint32_t>(priorities));
            for (int c = 0; c < n && submitted < num_requests; ++c) {
                reqs.push_back({make_seq(static_cast<uint64_t>(submitted + 1), prompt), max_tokens});
                reqs.back().seq->priority = priority;
                sched.add(reqs.back().seq.get());
                ++submitted;
            }
        }
        if (cancels && !reqs.empty() && rng() % 7 == 0) {
            SimRequest& victim = reqs[rng() % reqs.size()];
            if (victim.seq->status != SequenceStatus::kFinished) {
                sched.remove(victim.seq.get());
                ++finished;
            }
        }
        SchedulerOutput out = sched.schedule();
        mem.run(out, cfg.max_num_batched_tokens);
        if (::testing::Test::HasFatalFailure()) return r;
        EXPECT_LE(sched.num_running(), cfg.max_num_seqs);
        r.max_running = std::max(r.max_running, sched.num_running());
        sched.on_step_done(out);
        for (const ScheduledSequence& ss : out.seqs) {
            if (!ss.sample) continue;
            Sequence& s = *ss.seq;
            s.tokens.push_back(static_cast<int32_t>(mix(s.id * 1000 + s.num_generated()) % 50));
            const auto it =
                std::find_if(reqs.begin(), reqs.end(), [&](const SimRequest& q) { return q.seq.get() == &s; });
            if (s.num_generated() >= it->max_tokens) {
                sched.remove(&s);
                ++finished;
            }
        }
    }
    EXPECT_EQ(kv.full().num_in_use(), 0);
    EXPECT_EQ(kv.sliding().num_in_use(), 0);
    EXPECT_FALSE(sched.has_work());
    r.preemptions = sched.num_preemptions();
    r.cached = sched.num_cached_prompt_tokens();
    return r;
}

TEST(SchedulerTest, RandomWorkloadKeepsEveryKvReadCorrect) {
    SchedulerConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 48};
    SimResult r = simulate(4, 6, {200, 60}, true, cfg, 1, 60, true);
    EXPECT_GT(r.cached, 0);
    EXPECT_EQ(r.max_running, 8);
}

TEST(SchedulerTest, TinyPoolsForcePreemptionAndStayCorrect) {
    SchedulerConfig cfg{.max_num_seqs = 16, .max_num_batched_tokens = 32};
    SimResult r = simulate(4, 6, {40, 12}, true, cfg, 2, 40, false);
    EXPECT_GT(r.preemptions, 0);
}

// Waiting for a shared prefix under random arrivals, cancellations and preemptions: every KV read stays
// correct, nothing starves, and more of the prompts come from the cache than without the wait.
TEST(SchedulerTest, SharedPrefixWaitsStayCorrectUnderRandomWorkloads) {
    for (uint32_t seed : {1u, 6u, 7u}) {
        SchedulerConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 48, .min_shared_prefix_tokens = 0};
        const SimResult eager = simulate(4, 6, {200, 60}, true, cfg, seed, 60, false, 4);
        cfg.min_shared_prefix_tokens = 4;
        const SimResult waiting = simulate(4, 6, {200, 60}, true, cfg, seed, 60, false, 4);
        EXPECT_GT(waiting.cached, eager.cached) << seed;
        simulate(4, 6, {200, 60}, true, cfg, seed, 60, true, 4);
        simulate(4, 6, {40, 12}, true,
                 SchedulerConfig{.max_num_seqs = 16, .max_num_batched_tokens = 32, .min_shared_prefix_tokens = 4}, seed,
                 40, false, 3);
    }
}

// A copy of a prompt being computed (another choice of an n > 1 request) waits for its blocks instead of computing
// them again; sequences behind it are not held up; a prefix shorter than min_shared_prefix_tokens is not waited for.
TEST(SchedulerTest, SharedPrefixWaitsForTheFirstCopy) {
    std::vector<int32_t> prompt(30);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
    std::vector<int32_t> twelve(prompt.begin(), prompt.begin() + 12), four(prompt.begin(), prompt.begin() + 4);
    twelve.insert(twelve.end(), {90, 91, 92});
    four.insert(four.end(), {93, 94, 95, 96, 97});
    for (const int min_shared : {0, 8}) {
        KvCacheManager kv(4, 0, {100, 100}, true);
        Scheduler sched(
            SchedulerConfig{.max_num_seqs = 8, .max_num_batched_tokens = 100, .min_shared_prefix_tokens = min_shared},
            &kv);
        auto a = make_seq(1, prompt), b = make_seq(2, prompt), c = make_seq(3, std::vector<int32_t>(10, 50));
        auto d = make_seq(4, twelve), e = make_seq(5, four);
        for (Sequence* q : {a.get(), b.get(), c.get(), d.get(), e.get()}) sched.add(q);
        SchedulerOutput o = sched.schedule();
        std::vector<Sequence*> first;
        for (const ScheduledSequence& ss : o.seqs) first.push_back(ss.seq);
        if (min_shared == 0) {
            EXPECT_EQ(first, (std::vector<Sequence*>{a.get(), b.get(), c.get(), d.get(), e.get()}));
            EXPECT_EQ(sched.num_shared_prefix_waits(), 0);
            for (Sequence* q : {a.get(), b.get(), c.get(), d.get(), e.get()}) sched.remove(q);
            continue;
        }
        // b shares 7 blocks with a (28 tokens), d 3 (12): both wait; e shares one block (4 < 8) and goes.
        EXPECT_EQ(first, (std::vector<Sequence*>{a.get(), c.get(), e.get()}));
        EXPECT_EQ(sched.num_shared_prefix_waits(), 2);
        sched.on_step_done(o);
        for (Sequence* q : {a.get(), c.get(), e.get()}) q->tokens.push_back(1);
        o = sched.schedule();
        ASSERT_EQ(o.seqs.size(), 5u);  // a, c, e decode; then b and d are admitted
        EXPECT_EQ(o.seqs[3].seq, b.get());
        EXPECT_EQ(o.seqs[3].start_pos, 28);  // a's 7 blocks from the prefix cache
        EXPECT_EQ(o.seqs[3].num_new_tokens, 2);
        EXPECT_EQ(o.seqs[4].seq, d.get());
        EXPECT_EQ(o.seqs[4].start_pos, 12);
        EXPECT_EQ(sched.num_cached_prompt_tokens(), 28 + 12);
        for (Sequence* q : {a.get(), b.get(), c.get(), d.get(), e.get()}) sched.remove(q);
        EXPECT_EQ(kv.full().num_in_use(), 0);
    }
}

// A sequence waiting for a shared prefix keeps its place among max_num_seqs (a later request does not take it and hold
// it for a whole generation); nobody waits for a sequence that scores its prompt (it computes max_scored_tokens a
// step).
TEST(SchedulerTest, SharedPrefixWaitKeepsItsSlotAndSkipsScoredPrompts) {
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
    {
        KvCacheManager kv(4, 0, {100, 100}, true);
        Scheduler sched(
            SchedulerConfig{.max_num_seqs = 2, .max_num_batched_tokens = 100, .min_shared_prefix_tokens = 8}, &kv);
        auto a = make_seq(1, prompt), b = make_seq(2, prompt), c = make_seq(3, std::vector<int32_t>(6, 77));
        for (Sequence* q : {a.get(), b.get(), c.get()}) sched.add(q);
        SchedulerOutput o = sched.schedule();
        ASSERT_EQ(o.seqs.size(), 1u);  // a; b waits for a's blocks and keeps the second place from c
        EXPECT_EQ(o.seqs[0].seq, a.get());
        sched.on_step_done(o);
        a->tokens.push_back(1);
        o = sched.schedule();
        ASSERT_EQ(o.seqs.size(), 2u);
        EXPECT_EQ(o.seqs[1].seq, b.get());
        EXPECT_EQ(o.seqs[1].start_pos, 36);
        for (Sequence* q : {a.get(), b.get(), c.get()}) sched.remove(q);
    }
    {
        KvCacheManager kv(4, 0, {100, 100}, true);
        Scheduler sched(SchedulerConfig{.max_num_seqs = 4,
                                        .max_num_batched_tokens = 100,
                                        .max_scored_tokens = 8,
                                        .min_shared_prefix_tokens = 8},
                        &kv);
        auto a = make_seq(1, prompt), b = make_seq(2, prompt);
        a->score_prompt = true;
        for (Sequence* q : {a.get(), b.get()}) sched.add(q);
        SchedulerOutput o = sched.schedule();
        ASSERT_EQ(o.seqs.size(), 2u);  // b computes its own prompt beside the scoring a
        EXPECT_EQ(o.seqs[0].num_new_tokens, 8);
        EXPECT_EQ(o.seqs[1].seq, b.get());
        EXPECT_EQ(sched.num_shared_prefix_waits(), 0);
        for (Sequence* q : {a.get(), b.get()}) sched.remove(q);
    }
}

TEST(SchedulerTest, WithoutPrefixCachingOrSlidingLayers) {
    SchedulerConfig cfg{.max_num_seqs = 4, .max_num_batched_tokens = 16};
    SimResult r = simulate(8, 0, {30, 30}, false, cfg, 3, 30, true);
    EXPECT_EQ(r.cached, 0);
    simulate(3, 0, {25, 25}, true, cfg, 4, 30, true);
    simulate(5, 13, {60, 9}, true, SchedulerConfig{.max_num_seqs = 6, .max_num_batched_tokens = 7}, 5, 30, true);
}

TEST(SchedulerTest, ChunkedPrefillMixesWithDecodeUnderTheBudget) {
    KvCacheManager kv(4, 0, {100, 100}, false);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 4, .max_num_batched_tokens = 10}, &kv);
    auto a = make_seq(1, std::vector<int32_t>(3, 1));
    auto b = make_seq(2, std::vector<int32_t>(25, 2));
    sched.add(a.get());
    sched.add(b.get());
    SchedulerOutput o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 2u);
    EXPECT_EQ(o.seqs[0].num_new_tokens, 3);  // a's whole prompt
    EXPECT_TRUE(o.seqs[0].sample);
    EXPECT_EQ(o.seqs[1].num_new_tokens, 7);  // b's first chunk fills the budget
    EXPECT_FALSE(o.seqs[1].sample);
    sched.on_step_done(o);
    a->tokens.push_back(9);
    o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 2u);
    EXPECT_EQ(o.seqs[0].seq, a.get());  // a decodes (oldest first)
    EXPECT_EQ(o.seqs[0].num_new_tokens, 1);
    EXPECT_EQ(o.seqs[1].start_pos, 7);
    EXPECT_EQ(o.seqs[1].num_new_tokens, 9);
    sched.remove(a.get());
    sched.remove(b.get());
    EXPECT_EQ(kv.full().num_in_use(), 0);
}

// Request priorities (vLLM's priority policy) under random arrivals, cancellations and tiny pools: every KV read
// stays correct and everything finishes.
TEST(SchedulerTest, PrioritiesStayCorrectUnderPreemption) {
    for (uint32_t seed : {3u, 4u}) {
        SchedulerConfig cfg{.max_num_seqs = 16, .max_num_batched_tokens = 32};
        SimResult r = simulate(4, 6, {40, 12}, true, cfg, seed, 50, true, 2, 4);
        EXPECT_GT(r.preemptions, 0) << seed;
    }
}

// A later request of a lower priority value is admitted before an earlier one (which waits for blocks), and the
// KV's shortage preempts the last in priority order, not the newest arrival.
TEST(SchedulerTest, PriorityOrdersAdmissionAndPreemption) {
    KvCacheManager kv(4, 0, {6, 6}, false);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv);
    auto a = make_seq(1, std::vector<int32_t>(16, 1));  // 4 blocks, priority 0
    auto b = make_seq(2, std::vector<int32_t>(8, 2));   // 2 blocks, priority 5: waits
    auto c = make_seq(3, std::vector<int32_t>(8, 3));   // 2 blocks, priority -1: first
    b->priority = 5;
    c->priority = -1;
    for (Sequence* q : {a.get(), b.get(), c.get()}) sched.add(q);
    SchedulerOutput o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 2u);
    EXPECT_EQ(o.seqs[0].seq, c.get());
    EXPECT_EQ(o.seqs[1].seq, a.get());
    EXPECT_EQ(sched.num_waiting(), 1);
    sched.on_step_done(o);
    // Each samples a token; c's needs a third block, and the pool is full: a (priority 0) is preempted for it,
    // though c arrived later.
    for (Sequence* q : {a.get(), c.get()}) q->tokens.push_back(7);
    o = sched.schedule();
    ASSERT_EQ(o.preempted.size(), 1u);
    EXPECT_EQ(o.preempted[0], a.get());
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].seq, c.get());
    for (Sequence* q : {a.get(), b.get(), c.get()}) sched.remove(q);
}

TEST(SchedulerTest, AdmissionIsFcfsAndWaitsForFreeBlocks) {
    KvCacheManager kv(4, 0, {6, 6}, false);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv);
    auto a = make_seq(1, std::vector<int32_t>(16, 1));  // 4 blocks
    auto b = make_seq(2, std::vector<int32_t>(12, 2));  // 3 blocks: must wait
    auto c = make_seq(3, std::vector<int32_t>(2, 3));   // would fit, but FCFS keeps it behind b
    sched.add(a.get());
    sched.add(b.get());
    sched.add(c.get());
    SchedulerOutput o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].seq, a.get());
    EXPECT_EQ(sched.num_waiting(), 2);
    sched.on_step_done(o);
    sched.remove(a.get());
    o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 2u);
    EXPECT_EQ(o.seqs[0].seq, b.get());
    EXPECT_EQ(o.seqs[1].seq, c.get());
    sched.remove(b.get());
    sched.remove(c.get());
}

// Sequences scoring their prompt (prompt logprobs) share max_scored_tokens a step and reuse no cached prefix;
// the others are not held back by them while running, and admission stays FCFS.
TEST(SchedulerTest, ScoredPromptsShareTheirBudgetAndSkipThePrefixCache) {
    KvCacheManager kv(4, 0, {64, 64}, true);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 8, .max_num_batched_tokens = 100, .max_scored_tokens = 5}, &kv);
    const std::vector<int32_t> prompt(12, 7);
    auto warm = make_seq(1, prompt);  // fills the prefix cache with the prompt's blocks
    sched.add(warm.get());
    SchedulerOutput o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 1u);
    sched.on_step_done(o);
    sched.remove(warm.get());

    auto a = make_seq(2, prompt);
    a->score_prompt = true;
    auto b = make_seq(3, std::vector<int32_t>(9, 8));
    b->score_prompt = true;
    auto c = make_seq(4, prompt);  // not scoring: hits the cache
    sched.add(a.get());
    sched.add(b.get());
    sched.add(c.get());
    o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 1u);  // a takes the 5 scored tokens; b waits, and c behind it (FCFS)
    EXPECT_EQ(o.seqs[0].seq, a.get());
    EXPECT_EQ(o.seqs[0].start_pos, 0) << "a scored prompt reuses no cached prefix";
    EXPECT_EQ(o.seqs[0].num_new_tokens, 5);
    sched.on_step_done(o);
    o = sched.schedule();  // a's next 5; b still waits
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].num_new_tokens, 5);
    sched.on_step_done(o);
    a->score_prompt = false;  // (the engine clears it once the prompt is scored)
    o = sched.schedule();     // a's last 2 tokens unscored; b its 5; c admitted with its cached blocks
    ASSERT_EQ(o.seqs.size(), 3u);
    EXPECT_EQ(o.seqs[0].num_new_tokens, 2);
    EXPECT_EQ(o.seqs[1].seq, b.get());
    EXPECT_EQ(o.seqs[1].num_new_tokens, 5);
    EXPECT_EQ(o.seqs[2].seq, c.get());
    EXPECT_EQ(o.seqs[2].start_pos, 8);
    sched.on_step_done(o);
    for (auto* s : {a.get(), b.get(), c.get()}) sched.remove(s);
}

TEST(SchedulerTest, PreemptsTheNewestSequenceWhenBlocksRunOut) {
    KvCacheManager kv(2, 0, {4, 4}, false);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv);
    auto a = make_seq(1, {1, 2, 3, 4});  // 2 blocks
    auto b = make_seq(2, {5, 6, 7, 8});  // 2 blocks
    sched.add(a.get());
    sched.add(b.get());
    SchedulerOutput o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 2u);
    sched.on_step_done(o);
    a->tokens.push_back(9);
    b->tokens.push_back(9);
    o = sched.schedule();  // a needs a third block: b (newest) is preempted
    ASSERT_EQ(o.preempted.size(), 1u);
    EXPECT_EQ(o.preempted[0], b.get());
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].seq, a.get());
    EXPECT_EQ(b->num_computed, 0);
    EXPECT_EQ(b->status, SequenceStatus::kWaiting);
    EXPECT_EQ(b->num_preemptions, 1);
    sched.on_step_done(o);
    sched.remove(a.get());
    o = sched.schedule();  // b is recomputed: prompt and generated token
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].num_new_tokens, 5);
    EXPECT_TRUE(o.seqs[0].sample);
    sched.remove(b.get());
}

TEST(SchedulerTest, SlidingBlocksAreReleasedAsTheWindowMoves) {
    // Window 5, blocks of 4: the token at p reads p-4..p.
    KvCacheManager kv(4, 5, {20, 20}, false);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 2, .max_num_batched_tokens = 6}, &kv);
    auto a = make_seq(1, std::vector<int32_t>(17, 1));
    sched.add(a.get());
    SchedulerOutput o = sched.schedule();  // chunk [0, 6): blocks 0, 1
    EXPECT_EQ(kv.sliding().num_in_use(), 2);
    sched.on_step_done(o);  // next token 6 reads from 2: block 0 still needed
    EXPECT_EQ(kv.sliding().num_in_use(), 2);
    o = sched.schedule();  // chunk [6, 12): blocks 0..2 while it runs
    EXPECT_EQ(kv.sliding().num_in_use(), 3);
    sched.on_step_done(o);  // next token 12 reads from 8: blocks 0, 1 released
    EXPECT_EQ(kv.sliding().num_in_use(), 1);
    EXPECT_EQ(a->block_table_sliding[0], -1);
    EXPECT_EQ(a->block_table_sliding[1], -1);
    EXPECT_EQ(kv.full().num_in_use(), 3);  // full layers keep everything
    sched.remove(a.get());
    EXPECT_EQ(kv.sliding().num_in_use(), 0);
    EXPECT_EQ(kv.full().num_in_use(), 0);
}

TEST(SchedulerTest, PrefixHitNeedsTheSlidingBlocksOfTheWindow) {
    KvCacheManager kv(4, 5, {40, 40}, true);
    Scheduler sched(SchedulerConfig{.max_num_seqs = 2, .max_num_batched_tokens = 64}, &kv);
    std::vector<int32_t> prefix(16);
    for (int i = 0; i < 16; ++i) prefix[i] = i;
    auto a = make_seq(1, prefix);
    a->tokens.push_back(100);
    a->num_prompt_tokens = 17;
    sched.add(a.get());
    SchedulerOutput o = sched.schedule();
    sched.on_step_done(o);
    sched.remove(a.get());  // its blocks stay indexed
    EXPECT_EQ(kv.full().num_in_use(), 0);

    auto b = make_seq(2, prefix);
    b->tokens.push_back(200);
    b->num_prompt_tokens = 17;
    // Reuse point 16: the window of token 16 is 12..15 → sliding block 3 must be indexed. a released
    // sliding blocks 0-2 when its window passed them, and block 3 when it finished: all indexed.
    EXPECT_EQ(kv.match_prefix(*b), 16);
    // A 14-token prompt reuses 3 blocks: the window of token 12 needs sliding block 2 (8..11),
    // released by a when its window moved on and still indexed.
    auto c = make_seq(3, prefix);
    c->tokens.resize(14);
    c->num_prompt_tokens = 14;
    EXPECT_EQ(kv.match_prefix(*c), 12);
    sched.add(b.get());
    o = sched.schedule();
    ASSERT_EQ(o.seqs.size(), 1u);
    EXPECT_EQ(o.seqs[0].start_pos, 16);
    EXPECT_EQ(b->num_cached_tokens, 16);
    EXPECT_EQ(b->block_table_sliding[2], -1);  // not needed by the window at 16
    EXPECT_GE(b->block_table_sliding[3], 0);
    sched.on_step_done(o);
    sched.remove(b.get());
}

TEST(SchedulerTest, PrefixHitFallsBackWhenWindowBlocksWereEvicted) {
    KvCacheManager kv(4, 5, {40, 6}, true);
    std::vector<int32_t> prefix(16);
    for (int i = 0; i < 16; ++i) prefix[i] = i;
    auto a = make_seq(1, prefix);
    a->tokens.push_back(100);
    a->num_prompt_tokens = 17;
    ASSERT_TRUE(kv.can_admit(*a, 0, 17));
    kv.admit(*a, 0);
    kv.allocate(*a, 17);
    a->num_computed = 17;
    kv.on_computed(*a);
    kv.free(*a);
    // An unrelated sequence takes all 6 sliding blocks: every indexed one is evicted.
    auto z = make_seq(9, std::vector<int32_t>(24, 77));
    ASSERT_TRUE(kv.can_admit(*z, 0, 24));
    kv.admit(*z, 0);
    kv.allocate(*z, 24);
    EXPECT_EQ(kv.sliding().num_indexed(), 0);
    kv.free(*z);
    auto b = make_seq(2, prefix);
    b->tokens.push_back(200);
    b->num_prompt_tokens = 17;
    // Full blocks are all still indexed, but no sliding block is: only a hit at 0 is exact.
    EXPECT_EQ(kv.match_prefix(*b), 0);
}

TEST(KvBudgetTest, PlansBlocksFromBytesAndFractions) {
    KvGeometry g{
        .block_size = 16, .sliding_window = 128, .bytes_per_block_full = 1000, .bytes_per_block_sliding = 1000};
    auto c = plan_kv_blocks(g, KvBudget{.bytes = 1'000'000}, 0, 4, 256);
    ASSERT_TRUE(c.ok());
    // Sliding demand: 4 · (ceil(127/16) + 2) + 256/16 = 56 blocks; the rest is full.
    EXPECT_EQ(c->sliding, 56);
    EXPECT_EQ(c->full, 1000 - 56);
    auto f = plan_kv_blocks(g, KvBudget{.fraction_of_free = 0.5}, 200'000, 64, 256);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->sliding, 50);  // capped at half of the bytes
    EXPECT_EQ(f->full, 50);
    auto e = plan_kv_blocks(g, KvBudget{.num_blocks_full = 7, .num_blocks_sliding = 3}, 0, 1, 1);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->full, 7);
    EXPECT_EQ(e->sliding, 3);
    EXPECT_FALSE(plan_kv_blocks(g, KvBudget{.bytes = 10}, 0, 1, 1).ok());
    EXPECT_FALSE(plan_kv_blocks(g, KvBudget{}, 0, 1, 1).ok());
    KvGeometry full_only{.block_size = 16, .sliding_window = 0, .bytes_per_block_full = 100};
    auto n = plan_kv_blocks(full_only, KvBudget{.bytes = 1000}, 0, 1, 1);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->full, 10);
}

// --gpu-memory-utilization as vLLM reads it, a share of the device per server: the KV cache gets u · total minus what
// this process holds, at most what is free.
TEST(KvBudgetTest, BytesForAGpuMemoryUtilization) {
    constexpr size_t kGiB = size_t{1} << 30;
    // Alone on a 140 GiB device (1 GiB held by the driver): the model takes 40 GiB.
    auto kv = kv_bytes_for_utilization(139 * kGiB, 99 * kGiB, 140 * kGiB, 0.9);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    EXPECT_EQ(*kv, 86 * kGiB);  // 0.9 · 140 − 40
    auto all = kv_bytes_for_utilization(139 * kGiB, 99 * kGiB, 140 * kGiB, 1.0);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(*all, 99 * kGiB);  // 140 − 40 is more than is free: what is free
    // A second server beside one that holds 63 GiB (0.45 of the device): its share does not count the other's.
    auto second = kv_bytes_for_utilization(76 * kGiB, 36 * kGiB, 140 * kGiB, 0.45);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(*second, 23 * kGiB);  // 0.45 · 140 − 40
    // Another process took what the share would give: what is free.
    auto squeezed = kv_bytes_for_utilization(50 * kGiB, 10 * kGiB, 140 * kGiB, 0.45);
    ASSERT_TRUE(squeezed.ok());
    EXPECT_EQ(*squeezed, 10 * kGiB);
    // The model already holds more than the share: an error that gives the figures.
    auto none = kv_bytes_for_utilization(139 * kGiB, 9 * kGiB, 140 * kGiB, 0.9);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(none.status().message().find("the share is 129024 of 143360 MiB, the model holds 133120 MiB"),
              std::string::npos)
        << none.status().message();
    for (double bad : {0.0, -0.5, 1.5, std::nan("")})
        EXPECT_EQ(kv_bytes_for_utilization(139 * kGiB, 99 * kGiB, 140 * kGiB, bad).status().code(),
                  StatusCode::kInvalidArgument)
            << bad;
    EXPECT_FALSE(kv_bytes_for_utilization(0, 0, 0, 0.9).ok());  // no device memory known (a host runner)
    EXPECT_FALSE(kv_bytes_for_utilization(150 * kGiB, 99 * kGiB, 140 * kGiB, 0.9).ok());  // more free than the device
}

}  // namespace
}  // namespace gptoss::runtime
