// Parallel layouts on the CPU backend: the world layout, the simulated (thread) communicator's
// collectives, the shard plan at real gpt-oss sizes, and logits under every TP/EP/DP combination
// against the single-rank forward on the committed fixtures and a random checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "model/gpt_oss_forward.h"
#include "model/parallel_cpu_forward.h"
#include "model/random_checkpoint.h"
#include "model/weight_shard.h"
#include "parallel/local_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/world.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;
using model::ForwardSequence;
using model::GptOssConfig;
using model::GptOssWeights;
using parallel::ParallelConfig;

TEST(WorldTest, ParsesLayoutsInEverySpelling) {
    auto a = ParallelConfig::parse("tp=2,ep=4,dp=2");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->tp, 2);
    EXPECT_EQ(a->ep, 4);
    EXPECT_EQ(a->dp, 2);
    auto b = ParallelConfig::parse("EP4·DP1·TP4");
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->tp, 4);
    EXPECT_EQ(b->ep, 4);
    EXPECT_EQ(b->dp, 1);
    EXPECT_EQ(b->to_string(), "EP4·DP1·TP4");
    auto c = ParallelConfig::parse("tp8");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->ep, 1);
    EXPECT_EQ(c->world_size(), 8);
    for (const char* bad : {"tp=0", "tp=2,tp=2", "xx=3", "tp=", "ep=3,tp=2", "tp=-1", "tp=2;dp=2", "tp=2,dp=1073741824",
                            "tp=8,dp=536870912", "tp=2000", "tp=2x", "tp=2,", "junk"}) {
        EXPECT_FALSE(ParallelConfig::parse(bad).ok()) << bad;
    }
    // A trailing separator was taken as the end; an unknown key is quoted where it starts, not as two letters.
    EXPECT_NE(ParallelConfig::parse("tp=2x").status().message().find("ends in a separator"), std::string::npos);
    EXPECT_NE(ParallelConfig::parse("junk").status().message().find("at 'junk'"), std::string::npos);
    EXPECT_TRUE(ParallelConfig::parse("tp2xdp2").ok());
}

TEST(WorldTest, RankLayoutAndGroups) {
    ParallelConfig p{2, 2, 4};  // tp 2, dp 2, ep 4 on 4 ranks: moe_tp 1
    EXPECT_EQ(p.moe_tp(), 1);
    auto r3 = parallel::rank_layout(p, 3);
    EXPECT_EQ(r3.tp_rank, 1);
    EXPECT_EQ(r3.dp_rank, 1);
    EXPECT_EQ(r3.ep_rank, 3);
    EXPECT_EQ(parallel::tp_group_ranks(p, 3), (std::vector<int>{2, 3}));
    EXPECT_EQ(parallel::dp_group_ranks(p, 3), (std::vector<int>{1, 3}));
    // vLLM's uneven intermediate split of 90 MXFP4 groups (MODEL.md §2.4).
    std::vector<int> tp4, tp8;
    for (int i = 0; i < 4; ++i)
        tp4.push_back(32 * (parallel::ceil_split(90, 4, i).second - parallel::ceil_split(90, 4, i).first));
    for (int i = 0; i < 8; ++i)
        tp8.push_back(32 * (parallel::ceil_split(90, 8, i).second - parallel::ceil_split(90, 8, i).first));
    EXPECT_EQ(tp4, (std::vector<int>{736, 736, 736, 672}));
    EXPECT_EQ(tp8, (std::vector<int>{384, 384, 384, 384, 384, 384, 384, 192}));
    EXPECT_EQ(parallel::all_configs(1).size(), 1u);
    EXPECT_EQ(parallel::all_configs(2).size(), 4u);  // tp {1,2} × ep {1,2}
    EXPECT_EQ(parallel::all_configs(8).size(), 16u);
}

// Runs fn(rank, comm) on one thread per rank of a LocalGroup.
template <typename Fn>
void on_ranks(int n, Fn fn) {
    parallel::LocalGroup g(n);
    std::vector<std::unique_ptr<parallel::Communicator>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(g.communicator(r));
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
}

TEST(LocalCommunicatorTest, CollectivesMatchTheirDefinitions) {
    for (int n : {1, 2, 3, 4, 8}) {
        const size_t count = 37;
        auto value = [](int r, size_t i) { return static_cast<float>(r * 1000 + i) * 0.5f; };
        std::vector<std::vector<float>> reduced(n), gathered(n), scattered(n), a2a(n), bcast(n);
        std::vector<std::vector<uint16_t>> bf(n);
        on_ranks(n, [&](int r, parallel::Communicator& c) {
            EXPECT_EQ(c.rank(), r);
            EXPECT_EQ(c.size(), n);
            // Several rounds back to back: the protocol must not let a fast rank overtake.
            for (int round = 0; round < 3; ++round) {
                std::vector<float> v(count);
                for (size_t i = 0; i < count; ++i) v[i] = value(r, i) + round;
                ASSERT_TRUE(c.all_reduce_sum(v.data(), count, DType::kF32).ok());
                reduced[r] = v;
            }
            std::vector<float> mine(count);
            for (size_t i = 0; i < count; ++i) mine[i] = value(r, i);
            gathered[r].resize(count * n);
            ASSERT_TRUE(c.all_gather(mine.data(), gathered[r].data(), count, DType::kF32).ok());
            std::vector<float> big(count * n);
            for (size_t i = 0; i < big.size(); ++i) big[i] = value(r, i);
            scattered[r].resize(count);
            ASSERT_TRUE(c.reduce_scatter_sum(big.data(), scattered[r].data(), count, DType::kF32).ok());
            a2a[r].resize(count * n);
            ASSERT_TRUE(c.all_to_all(big.data(), a2a[r].data(), count, DType::kF32).ok());
            bcast[r] = mine;
            ASSERT_TRUE(c.broadcast(bcast[r].data(), count * sizeof(float), n - 1).ok());
            bf[r].assign(count, f32_to_bf16(static_cast<float>(r + 1)));
            ASSERT_TRUE(c.all_reduce_sum(bf[r].data(), count, DType::kBF16).ok());
        });
        for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) {
                float sum = 0, rs = 0;
                for (int q = 0; q < n; ++q) sum += value(q, i) + 2;
                for (int q = 0; q < n; ++q) rs += value(q, r * count + i);
                EXPECT_EQ(reduced[r][i], sum);
                EXPECT_EQ(scattered[r][i], rs);
                EXPECT_EQ(bcast[r][i], value(n - 1, i));
                EXPECT_EQ(bf16_to_f32(bf[r][i]), static_cast<float>(n * (n + 1) / 2));
                for (int q = 0; q < n; ++q) {
                    EXPECT_EQ(gathered[r][q * count + i], value(q, i));
                    EXPECT_EQ(a2a[r][q * count + i], value(q, r * count + i));
                }
            }
        }
    }
}

TEST(LocalCommunicatorTest, RejectsUnsupportedTypes) {
    on_ranks(2, [](int, parallel::Communicator& c) {
        int32_t x = 1;
        EXPECT_FALSE(c.all_reduce_sum(&x, 1, DType::kI32).ok());
        uint8_t y = 0;
        EXPECT_FALSE(c.all_gather(&y, &y, 1, DType::kU8).ok());
    });
}

TEST(NcclTest, ReportsWhyItIsUnavailableInsteadOfFailingLater) {
    std::string why;
    if (parallel::nccl_available(&why)) GTEST_SKIP() << "NCCL loads here; the GPU run tests it";
    EXPECT_FALSE(why.empty());
    std::vector<int> devices{0, 1};
    auto w = parallel::make_nccl_world(ParallelConfig{2, 1, 1}, devices);
    EXPECT_FALSE(w.ok());
}

TEST(ShardPlanTest, RealSizes) {
    for (const char* name : {"gpt-oss-20b", "gpt-oss-120b"}) {
        GptOssConfig c = *GptOssConfig::preset(name);
        for (const ParallelConfig& p : {ParallelConfig{4, 1, 4}, ParallelConfig{8, 1, 1}, ParallelConfig{2, 4, 8}}) {
            ASSERT_TRUE(model::check_parallel_config(c, p).ok()) << name << " " << p.to_string();
            int heads = 0, experts = 0, vocab = 0;
            std::vector<int> inter(c.num_experts, 0);
            for (int r = 0; r < p.world_size(); ++r) {
                auto s = model::plan_shard(c, p, r);
                ASSERT_TRUE(s.ok());
                const auto lay = parallel::rank_layout(p, r);
                if (lay.dp_rank == 0) heads += s->num_q_heads, vocab += s->vocab_size;
                EXPECT_EQ(s->num_kv_heads, std::max(1, 8 / p.tp));
                EXPECT_EQ(s->kv_head_begin, s->q_head_begin / 8);
                experts += lay.moe_tp_rank == 0 ? s->num_experts : 0;
                for (int e = s->expert_begin; e < s->expert_begin + s->num_experts; ++e) inter[e] += s->inter_size;
                EXPECT_EQ(s->add_o_bias, lay.tp_rank == 0);
                EXPECT_EQ(s->add_down_bias, lay.moe_tp_rank == 0);
            }
            EXPECT_EQ(heads, 64);
            EXPECT_EQ(experts, c.num_experts);
            EXPECT_EQ(vocab, c.vocab_size);
            for (int e = 0; e < c.num_experts; ++e) EXPECT_EQ(inter[e], 2880) << "expert " << e;
        }
        EXPECT_FALSE(model::check_parallel_config(c, ParallelConfig{3, 1, 1}).ok());    // 64 heads
        EXPECT_FALSE(model::check_parallel_config(c, ParallelConfig{128, 1, 1}).ok());  // half a head
        EXPECT_FALSE(model::check_parallel_config(c, ParallelConfig{2, 3, 3}).ok());    // 3 ∤ experts
    }
}

// ---- logits invariance ----

// Sequences of a multi-sequence step: a prefill longer than the sliding window, then decode steps.
struct Workload {
    std::vector<std::vector<int32_t>> prompts;
    int decode_steps = 3;
};

// Runs the workload with `run(step_seqs, dp_groups, logits)` and returns every logits row.
template <typename Run>
std::vector<float> run_workload(const Workload& wl, int vocab, int block_size, int dp, Run run) {
    const int n = static_cast<int>(wl.prompts.size());
    std::vector<std::vector<int32_t>> tables(n);
    std::vector<int> next_block(dp, 0), group(n);
    std::vector<int> len(n, 0);
    for (int i = 0; i < n; ++i) {
        group[i] = i % dp;
        const int blocks = (static_cast<int>(wl.prompts[i].size()) + wl.decode_steps + block_size - 1) / block_size;
        for (int b = 0; b < blocks; ++b) tables[i].push_back(next_block[group[i]]++);
    }
    std::vector<float> all;
    std::vector<std::vector<int32_t>> pending(wl.prompts);
    for (int step = 0; step <= wl.decode_steps; ++step) {
        std::vector<ForwardSequence> seqs(n);
        for (int i = 0; i < n; ++i) {
            seqs[i].tokens = pending[i];
            seqs[i].start_pos = len[i];
            seqs[i].block_table_full = tables[i];
            seqs[i].block_table_sliding = tables[i];
            seqs[i].all_logits = step == 0;
        }
        std::vector<float> logits;
        Status st = run(seqs, group, &logits);
        EXPECT_TRUE(st.ok()) << st.to_string();
        if (!st.ok()) return all;
        all.insert(all.end(), logits.begin(), logits.end());
        // Next token: greedy from the last row of each sequence (same ids for every layout, taken
        // from this run's own logits; diverging argmax would show up as a logits mismatch anyway).
        size_t row = 0;
        for (int i = 0; i < n; ++i) {
            row += seqs[i].all_logits ? seqs[i].tokens.size() : 1;
            const float* last = logits.data() + (row - 1) * vocab;
            len[i] += static_cast<int>(seqs[i].tokens.size());
            pending[i] = {static_cast<int32_t>(std::max_element(last, last + vocab) - last)};
        }
    }
    return all;
}

class InvarianceTest : public ::testing::Test {
protected:
    static void check(const GptOssWeights& w, const std::vector<ParallelConfig>& layouts, const Workload& wl) {
        const int bs = 4, blocks = 64, V = w.config.vocab_size;
        model::CpuKvCache kv(w.config, bs, blocks, blocks);
        model::CpuForward ref(w);
        // The reference runs the whole batch on one rank (dp = 1); each DP layout gives every group
        // its own cache, and the sequences must not care which group ran them.
        const std::vector<float> expect =
            run_workload(wl, V, bs, 1, [&](std::span<const ForwardSequence> s, std::span<const int>, auto* out) {
                return ref.forward(s, kv, out);
            });
        float scale = 0;
        for (float v : expect) scale = std::max(scale, std::fabs(v));
        for (const ParallelConfig& p : layouts) {
            auto pf = model::ParallelCpuForward::create(w, p, bs, blocks, blocks);
            ASSERT_TRUE(pf.ok()) << p.to_string() << ": " << pf.status().to_string();
            const std::vector<float> got = run_workload(
                wl, V, bs, p.dp, [&](std::span<const ForwardSequence> s, std::span<const int> g, auto* out) {
                    return (*pf)->forward(s, g, out);
                });
            ASSERT_EQ(got.size(), expect.size()) << p.to_string();
            // fp32 sums regrouped across ranks (o_proj over heads, experts over shards): expected
            // differences ~1e-6 relative; 1e-4 of the largest logit catches any wrong slice, missing
            // or doubled bias, which all move logits by O(1e-2) or more.
            float worst = 0;
            size_t argmax_diff = 0;
            for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - expect[i]));
            for (size_t r = 0; r < got.size() / V; ++r) {
                auto a = std::max_element(got.begin() + r * V, got.begin() + (r + 1) * V) - got.begin();
                auto b = std::max_element(expect.begin() + r * V, expect.begin() + (r + 1) * V) - expect.begin();
                argmax_diff += a != b;
            }
            EXPECT_LE(worst, 1e-4f * scale) << p.to_string() << " worst |Δ| " << worst << " of max " << scale;
            EXPECT_EQ(argmax_diff, 0u) << p.to_string();
        }
    }
    static Workload workload(int vocab, int window) {
        Workload wl;
        std::mt19937 rng(11);
        for (int len : {window + 9, 5, 2 * window + 3}) {
            std::vector<int32_t> p(len);
            for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
            wl.prompts.push_back(p);
        }
        return wl;
    }
};

std::vector<ParallelConfig> layouts_for(int max_world) {
    std::vector<ParallelConfig> out;
    for (int w = 2; w <= max_world; w *= 2)
        for (const ParallelConfig& p : parallel::all_configs(w)) out.push_back(p);
    return out;
}

TEST_F(InvarianceTest, FixtureTinyAEveryLayoutUpTo8Ranks) {
    auto w = GptOssWeights::load(GPTOSS_SOURCE_DIR "/tests/data/checkpoints/tiny_a");
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    // 8 heads, 1 kv head (replicated under TP), 8 experts, intermediate 96 = 3 groups: MoE-TP4 and
    // MoE-TP8 leave some ranks with no units at all.
    check(**w, layouts_for(8), workload((*w)->config.vocab_size, (*w)->config.sliding_window));
}

TEST_F(InvarianceTest, FixtureTinyBShardedAndDenseLayouts) {
    for (const char* dir : {"/tests/data/checkpoints/tiny_b", "/tests/data/checkpoints/tiny_a_bf16"}) {
        auto w = GptOssWeights::load(std::string(GPTOSS_SOURCE_DIR) + dir);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        std::vector<ParallelConfig> ls;
        for (auto p : {ParallelConfig{2, 1, 1}, ParallelConfig{2, 1, 2}, ParallelConfig{1, 2, 2},
                       ParallelConfig{4, 1, 2}, ParallelConfig{2, 2, 4}}) {
            if (model::check_parallel_config((*w)->config, p).ok()) ls.push_back(p);
        }
        ASSERT_GE(ls.size(), 3u) << dir;
        check(**w, ls, workload((*w)->config.vocab_size, (*w)->config.sliding_window));
    }
}

TEST_F(InvarianceTest, RandomCheckpointWithEightKvHeads) {
    // gpt-oss's head structure in small: 16 q heads over 8 kv heads (TP8 = 1 kv head per rank).
    GptOssConfig c = *GptOssConfig::preset("tiny");
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 16;
    c.num_experts = 8;
    c.vocab_size = 997;  // not a multiple of 8: uneven lm_head split
    c.sliding_window = 6;
    c.max_position_embeddings = 128;
    c.layer_types = {model::LayerType::kSlidingAttention, model::LayerType::kFullAttention};
    c.eos_token_ids = {1};
    c.pad_token_id = 2;
    c.bos_token_id.reset();
    const std::string dir =
        (fs::temp_directory_path() / ("gptoss_parallel_test_" + std::to_string(::getpid()))).string();
    model::RandomCheckpointOptions opt;
    opt.seed = 5;
    ASSERT_TRUE(model::write_random_checkpoint(c, dir, opt).ok());
    auto w = GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    check(**w, layouts_for(8), workload(c.vocab_size, c.sliding_window));
    std::error_code ec;
    fs::remove_all(dir, ec);
}

TEST(ParallelForwardTest, RejectsBadLayoutsAndInputsWithoutHanging) {
    auto w = GptOssWeights::load(GPTOSS_SOURCE_DIR "/tests/data/checkpoints/tiny_a");
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE(model::ParallelCpuForward::create(**w, ParallelConfig{3, 1, 1}, 4, 8, 8).ok());
    EXPECT_FALSE(model::ParallelCpuForward::create(**w, ParallelConfig{2, 1, 16}, 4, 8, 8).ok());
    auto pf = model::ParallelCpuForward::create(**w, ParallelConfig{2, 2, 2}, 4, 8, 8);
    ASSERT_TRUE(pf.ok());
    std::vector<int32_t> toks{1, 2, 100000};
    std::vector<int32_t> table{0, 1};
    ForwardSequence s{toks, 0, table, table, false};
    std::vector<float> logits;
    std::vector<int> g{1};
    EXPECT_EQ((*pf)->forward({&s, 1}, g, &logits).code(), StatusCode::kInvalidArgument);  // token id
    std::vector<int> bad{2};
    toks[2] = 3;
    EXPECT_EQ((*pf)->forward({&s, 1}, bad, &logits).code(), StatusCode::kInvalidArgument);  // group
    EXPECT_TRUE((*pf)->forward({&s, 1}, g, &logits).ok());                                  // group 0 idle this step
}

}  // namespace
}  // namespace gptoss
