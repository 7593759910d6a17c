#include "core/gpu_telemetry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace gptoss {
namespace {

TEST(GpuTelemetryTest, SummarizesClockPowerAndLimits) {
    const std::vector<GpuReading> r = {{1980, 310, 0},
                                       {1650, 695, kGpuReasonSwPowerCap},
                                       {1365, 706, kGpuReasonSwPowerCap | kGpuReasonIdle},
                                       {1965, 620, kGpuReasonHwThermal}};
    const GpuTelemetrySummary s = summarize(r);
    EXPECT_EQ(s.samples, 4);
    EXPECT_DOUBLE_EQ(s.sm_mhz_min, 1365);
    EXPECT_DOUBLE_EQ(s.sm_mhz_max, 1980);
    EXPECT_DOUBLE_EQ(s.sm_mhz_mean, (1980 + 1650 + 1365 + 1965) / 4.0);
    EXPECT_DOUBLE_EQ(s.power_w_mean, (310 + 695 + 706 + 620) / 4.0);
    EXPECT_DOUBLE_EQ(s.power_w_max, 706);
    EXPECT_EQ(s.reasons, kGpuReasonSwPowerCap | kGpuReasonIdle | kGpuReasonHwThermal);
    EXPECT_EQ(s.limits(), "power cap, thermal");  // idle is not a limit; thermal named once

    const GpuTelemetrySummary none = summarize({});
    EXPECT_EQ(none.samples, 0);
    EXPECT_EQ(none.limits(), "");
    EXPECT_EQ(summarize(std::vector<GpuReading>{{1980, 120, kGpuReasonIdle}}).limits(), "");
}

TEST(GpuTelemetryTest, SamplerReadsUntilStoppedAndSkipsFailedReadings) {
    std::atomic<int> calls{0};
    TelemetrySampler sampler(
        [&]() -> std::optional<GpuReading> {
            const int n = calls++;
            if (n % 2 == 1) return std::nullopt;  // NVML failing to answer: no reading
            return GpuReading{1000.0 + n, 100.0 + n, 0};
        },
        std::chrono::milliseconds(2));
    sampler.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    const GpuTelemetrySummary s = sampler.stop();
    const int after = calls.load();
    EXPECT_GE(after, 3);
    EXPECT_EQ(s.samples, (after + 1) / 2);  // the even calls only
    EXPECT_DOUBLE_EQ(s.sm_mhz_min, 1000);   // the first reading is taken at start()
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(calls.load(), after) << "the sampler kept reading after stop()";
    EXPECT_EQ(sampler.stop().samples, 0) << "a stop without a start reports the last run's readings";

    // A second run starts from no readings.
    sampler.start();
    const GpuTelemetrySummary again = sampler.stop();
    EXPECT_GE(again.samples, 0);
    EXPECT_LE(again.samples, calls.load() - after);
    if (again.samples > 0) {
        EXPECT_GE(again.sm_mhz_min, 1000.0 + after);
    }
}

TEST(GpuTelemetryTest, WithoutNvmlOrTheGpuItSaysWhyAndReportsNothing) {
    // No such PCI device on any host: never available, with a reason (NVML missing on CI hosts,
    // or the device unknown on GPU hosts).
    GpuTelemetry t({"0000:FF:1F.7"});
    EXPECT_FALSE(t.available());
    EXPECT_FALSE(t.why().empty());
    t.start();
    EXPECT_EQ(t.stop().samples, 0);

    // NVML's first device: on a GPU host a real reading, elsewhere an error that names the library.
    auto gpu = NvmlGpu::open("", 0);
    if (!gpu.ok()) {
        EXPECT_FALSE(gpu.status().message().empty());
    } else {
        const auto r = (*gpu)->read();
        ASSERT_TRUE(r.has_value());
        EXPECT_GT(r->sm_mhz, 0);
        EXPECT_GE(r->power_w, 0);
    }
}

}  // namespace
}  // namespace gptoss
