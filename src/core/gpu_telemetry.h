// GPU clocks and power during a measurement, so that a benchmark figure comes with the conditions
// it was taken under. r30 found the FP8 prefill at the H200's 700 W limit: the SM clock fell from
// 1,980 MHz to 1.37-1.8 GHz within a burst of prefills, and 8k latencies moved by 10% with what ran
// before. The readings come from NVML (libnvidia-ml.so.1, part of the NVIDIA driver), loaded at run
// time: hosts without it simply report no telemetry.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace gptoss {

// One reading of one GPU.
struct GpuReading {
    double sm_mhz = 0;     // current SM clock
    double power_w = 0;    // board power draw (NVML's power usage, averaged by the driver)
    uint64_t reasons = 0;  // NVML's clocks-event (throttle) reason bits at the time (kGpuReason*)
};

// NVML's clocks-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
inline constexpr uint64_t kGpuReasonIdle = 0x1;
inline constexpr uint64_t kGpuReasonAppClocks = 0x2;
inline constexpr uint64_t kGpuReasonSwPowerCap = 0x4;
inline constexpr uint64_t kGpuReasonHwSlowdown = 0x8;
inline constexpr uint64_t kGpuReasonSyncBoost = 0x10;
inline constexpr uint64_t kGpuReasonSwThermal = 0x20;
inline constexpr uint64_t kGpuReasonHwThermal = 0x40;
inline constexpr uint64_t kGpuReasonHwPowerBrake = 0x80;

// What a run of readings says: clock and power ranges, and every reason seen in any reading.
struct GpuTelemetrySummary {
    int samples = 0;
    double sm_mhz_min = 0, sm_mhz_mean = 0, sm_mhz_max = 0;
    double power_w_mean = 0, power_w_max = 0;
    uint64_t reasons = 0;
    // The limiting reasons seen, by name ("power cap", "thermal", ...), comma-separated; "" for none.
    // Idle and application-clock settings are not limits and are left out.
    std::string limits() const;
};
GpuTelemetrySummary summarize(std::span<const GpuReading> readings);

// One GPU through NVML.
class NvmlGpu {
public:
    // The GPU with this PCI bus id (cudaDeviceGetPCIBusId's form, "0000:3B:00.0"), or, when it is
    // empty, NVML's device `index`. An error when NVML or the device is not there.
    static StatusOr<std::unique_ptr<NvmlGpu>> open(const std::string& pci_bus_id, int index = 0);
    // nullopt when NVML fails to answer.
    std::optional<GpuReading> read() const;
    NvmlGpu(const NvmlGpu&) = delete;
    NvmlGpu& operator=(const NvmlGpu&) = delete;
    ~NvmlGpu();

private:
    explicit NvmlGpu(void* device) : device_(device) {}
    void* device_;
};

// Takes a reading every `interval` on its own thread between start() and stop() (the first right
// at start()); stop() returns the summary of the readings since start() (empty when not started).
// For the GPUs of a measurement the reading function may combine several (GpuTelemetry below).
class TelemetrySampler {
public:
    using ReadFn = std::function<std::optional<GpuReading>()>;
    explicit TelemetrySampler(ReadFn read, std::chrono::milliseconds interval = std::chrono::milliseconds(20));
    TelemetrySampler(const TelemetrySampler&) = delete;
    TelemetrySampler& operator=(const TelemetrySampler&) = delete;
    ~TelemetrySampler();
    void start();
    GpuTelemetrySummary stop();

private:
    ReadFn read_;
    std::chrono::milliseconds interval_;
    std::thread thread_;
    std::atomic<bool> running_{false};
    std::mutex mu_;
    std::vector<GpuReading> readings_;
};

// The GPUs of a benchmark, by PCI bus id: each reading is the slowest SM clock, the largest power
// draw and the union of the reasons over them. available() is false (and every summary empty)
// where NVML or a GPU cannot be opened; why() says why.
class GpuTelemetry {
public:
    explicit GpuTelemetry(const std::vector<std::string>& pci_bus_ids);
    GpuTelemetry(const GpuTelemetry&) = delete;  // the sampler reads through `this`
    GpuTelemetry& operator=(const GpuTelemetry&) = delete;
    bool available() const { return !gpus_.empty(); }
    const std::string& why() const { return why_; }
    void start();
    GpuTelemetrySummary stop();

private:
    std::vector<std::unique_ptr<NvmlGpu>> gpus_;
    std::string why_;
    std::unique_ptr<TelemetrySampler> sampler_;
};

}  // namespace gptoss
