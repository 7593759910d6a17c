#include "core/background_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace gptoss {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(BackgroundWorker, RunsBesideTheCallerAndWaitReturnsAfterTheJob) {
    BackgroundWorker w;
    std::atomic<int> done{0};
    const auto t0 = steady_clock::now();
    w.run([&] {
        std::this_thread::sleep_for(milliseconds(150));
        done = 1;
    });
    const auto started = steady_clock::now();
    std::this_thread::sleep_for(milliseconds(150));  // the caller's own work, at the same time
    w.wait();
    const auto total = steady_clock::now() - t0;
    EXPECT_EQ(done.load(), 1);
    EXPECT_LT(started - t0, milliseconds(100)) << "run() must not wait for the job";
    // 150 ms side by side; one after the other would be 300 ms.
    EXPECT_LT(total, milliseconds(280));
}

TEST(BackgroundWorker, JobsRunInOrderAndWaitWithoutAJobReturns) {
    BackgroundWorker w;
    w.wait();
    int value = 0;
    for (int i = 1; i <= 50; ++i) w.run([&value, i] { value = value * 3 % 1000003 + i; });  // run waits for the last
    w.wait();
    int expect = 0;
    for (int i = 1; i <= 50; ++i) expect = expect * 3 % 1000003 + i;
    EXPECT_EQ(value, expect);
}

TEST(BackgroundWorker, AJobsExceptionComesBackFromWaitOnce) {
    BackgroundWorker w;
    w.run([] { throw std::runtime_error("mask failed"); });
    EXPECT_THROW(w.wait(), std::runtime_error);
    w.wait();  // taken: nothing left to rethrow
    bool ran = false;
    w.run([&] { ran = true; });
    w.wait();
    EXPECT_TRUE(ran);
}

TEST(BackgroundWorker, DestructionWaitsForARunningJob) {
    std::atomic<bool> finished{false};
    {
        BackgroundWorker w;
        w.run([&] {
            std::this_thread::sleep_for(milliseconds(50));
            finished = true;
        });
    }
    EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace gptoss
