// ThreadPool: GPTOSS_NUM_THREADS is taken from 1 to ThreadPool::kMaxThreads; anything else is said and the core
// count used (a count past what the system starts aborted every command, session 59); parallel_for covers [0, n).
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gptoss {
namespace {

class ThreadPoolEnv : public ::testing::Test {
protected:
    void SetUp() override {
        if (const char* v = std::getenv("GPTOSS_NUM_THREADS")) saved_ = v;
    }
    void TearDown() override {
        if (saved_)
            ::setenv("GPTOSS_NUM_THREADS", saved_->c_str(), 1);
        else
            ::unsetenv("GPTOSS_NUM_THREADS");
    }
    std::optional<std::string> saved_;
};

TEST_F(ThreadPoolEnv, CountFromTheEnvironmentWithinItsBounds) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ::setenv("GPTOSS_NUM_THREADS", "3", 1);
    EXPECT_EQ(ThreadPool(0).num_threads(), 3);
    for (const char* bad : {"100000", "0", "-5", "abc", "3x", "99999999999999999999"}) {
        ::setenv("GPTOSS_NUM_THREADS", bad, 1);
        EXPECT_EQ(ThreadPool(0).num_threads(), cores) << bad;
    }
    ::unsetenv("GPTOSS_NUM_THREADS");
    EXPECT_EQ(ThreadPool(0).num_threads(), cores);
    EXPECT_EQ(ThreadPool(2).num_threads(), 2);  // an explicit count is not the environment's
}

TEST(ThreadPool, ParallelForCoversTheRangeOnce) {
    ThreadPool pool(4);
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(1000, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace gptoss
