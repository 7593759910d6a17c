// Engine invariances on the committed tiny checkpoints made by transformers
// (tests/data/checkpoints/tiny_a, tiny_b); skipped when they are absent.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine_test_util.h"

namespace gptoss::runtime {
namespace {

namespace fs = std::filesystem;
using namespace gptoss::runtime::testing;

class EngineFixtureTest : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        const fs::path dir = fs::path(GPTOSS_SOURCE_DIR) / "tests/data/checkpoints" / GetParam();
        if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " is not there yet";
        auto w = model::GptOssWeights::load(dir.string());
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        weights_ = std::shared_ptr<const model::GptOssWeights>(std::move(*w));
    }
    EngineConfig config(int full_blocks, int sliding_blocks) const {
        EngineConfig c;
        c.block_size = 8;
        c.kv_budget = KvBudget{.num_blocks_full = full_blocks, .num_blocks_sliding = sliding_blocks};
        c.scheduler = SchedulerConfig{.max_num_seqs = 16, .max_num_batched_tokens = 48};
        return c;
    }
    int window() const { return weights_->config.sliding_window; }
    std::shared_ptr<const model::GptOssWeights> weights_;
};

TEST_P(EngineFixtureTest, BatchInvarianceGreedyAndSeededWithMidFlightJoins) {
    EngineConfig cfg = config(256, 128);
    cfg.enable_prefix_caching = false;
    expect_batch_matches_reference(weights_, cfg, mixed_requests(weights_->config.vocab_size, window(), 12, 10, 1));
}

TEST_P(EngineFixtureTest, PrefixCacheHitEqualsCold) {
    expect_prefix_hits_equal_cold(weights_, config(256, 128), 3 * window() + 3, 2);
}

TEST_P(EngineFixtureTest, PreemptionUnderATinyBudgetChangesNothing) {
    // Room for about two of the longest requests at once.
    const int W = window();
    const int longest = 3 * W + 7 + 10;
    const int full = 2 * ((longest + 7) / 8) + 1;
    const int sliding = (W + 16 + 7) / 8 + 3;
    EngineConfig cfg = config(full, sliding);
    cfg.scheduler.max_num_batched_tokens = 16;
    EngineStats st;
    expect_batch_matches_reference(weights_, cfg, mixed_requests(weights_->config.vocab_size, W, 10, 10, 3), &st);
    EXPECT_GT(st.num_preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, EngineFixtureTest, ::testing::Values("tiny_a", "tiny_b"));

}  // namespace
}  // namespace gptoss::runtime
