#include "core/gpu_telemetry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

namespace gptoss {

std::string GpuTelemetrySummary::limits() const {
    std::string s;
    auto add = [&](uint64_t bit, const char* name) {
        if ((reasons & bit) != 0 && s.find(name) == std::string::npos) s += std::string(s.empty() ? "" : ", ") + name;
    };
    add(kGpuReasonSwPowerCap, "power cap");
    add(kGpuReasonHwPowerBrake, "power brake");
    add(kGpuReasonSwThermal, "thermal");
    add(kGpuReasonHwThermal, "thermal");
    add(kGpuReasonHwSlowdown, "hardware slowdown");
    add(kGpuReasonSyncBoost, "sync boost");
    return s;
}

GpuTelemetrySummary summarize(std::span<const GpuReading> readings) {
    GpuTelemetrySummary s;
    if (readings.empty()) return s;
    s.samples = static_cast<int>(readings.size());
    s.sm_mhz_min = s.sm_mhz_max = readings[0].sm_mhz;
    double mhz = 0, watts = 0;
    for (const GpuReading& r : readings) {
        s.sm_mhz_min = std::min(s.sm_mhz_min, r.sm_mhz);
        s.sm_mhz_max = std::max(s.sm_mhz_max, r.sm_mhz);
        s.power_w_max = std::max(s.power_w_max, r.power_w);
        mhz += r.sm_mhz;
        watts += r.power_w;
        s.reasons |= r.reasons;
    }
    s.sm_mhz_mean = mhz / s.samples;
    s.power_w_mean = watts / s.samples;
    return s;
}

// ---- NVML, loaded at run time ----------------------------------------------------------------
// The few entry points used, declared here as NVML's C API defines them (nvml.h): every call
// returns 0 (NVML_SUCCESS) on success; a device is an opaque pointer.
namespace {

using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char*, void**);
using NvmlByIndex = int (*)(unsigned, void**);
using NvmlClock = int (*)(void*, int, unsigned*);  // NVML_CLOCK_SM = 1
using NvmlPower = int (*)(void*, unsigned*);       // milliwatts
using NvmlReasons = int (*)(void*, unsigned long long*);

struct NvmlApi {
    NvmlByPci by_pci = nullptr;
    NvmlByIndex by_index = nullptr;
    NvmlClock clock = nullptr;
    NvmlPower power = nullptr;
    NvmlReasons reasons = nullptr;  // optional
    std::string error;              // why it is unusable ("" when usable)
};

const NvmlApi& nvml() {
    static NvmlApi a;
    static std::once_flag once;
    std::call_once(once, [] {
        void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            const char* e = dlerror();
            a.error = std::string("cannot load libnvidia-ml.so.1: ") + (e ? e : "unknown error");
            return;
        }
        auto init = reinterpret_cast<NvmlInit>(dlsym(h, "nvmlInit_v2"));
        a.by_pci = reinterpret_cast<NvmlByPci>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
        a.by_index = reinterpret_cast<NvmlByIndex>(dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
        a.clock = reinterpret_cast<NvmlClock>(dlsym(h, "nvmlDeviceGetClockInfo"));
        a.power = reinterpret_cast<NvmlPower>(dlsym(h, "nvmlDeviceGetPowerUsage"));
        a.reasons = reinterpret_cast<NvmlReasons>(dlsym(h, "nvmlDeviceGetCurrentClocksEventReasons"));
        if (a.reasons == nullptr)  // drivers before 535
            a.reasons = reinterpret_cast<NvmlReasons>(dlsym(h, "nvmlDeviceGetCurrentClocksThrottleReasons"));
        if (init == nullptr || a.by_pci == nullptr || a.by_index == nullptr || a.clock == nullptr ||
            a.power == nullptr) {
            a.error = "libnvidia-ml.so.1 lacks the NVML entry points used";
            return;
        }
        if (const int rc = init(); rc != 0) a.error = "nvmlInit_v2 failed (NVML error " + std::to_string(rc) + ")";
        // (never shut down: the handles live as long as the process)
    });
    return a;
}

}  // namespace

StatusOr<std::unique_ptr<NvmlGpu>> NvmlGpu::open(const std::string& pci_bus_id, int index) {
    const NvmlApi& a = nvml();
    if (!a.error.empty()) return failed_precondition(a.error);
    void* dev = nullptr;
    const int rc =
        pci_bus_id.empty() ? a.by_index(static_cast<unsigned>(index), &dev) : a.by_pci(pci_bus_id.c_str(), &dev);
    if (rc != 0 || dev == nullptr)
        return not_found("NVML has no GPU " + (pci_bus_id.empty() ? std::to_string(index) : pci_bus_id) +
                         " (NVML error " + std::to_string(rc) + ")");
    return std::unique_ptr<NvmlGpu>(new NvmlGpu(dev));
}

std::optional<GpuReading> NvmlGpu::read() const {
    const NvmlApi& a = nvml();
    unsigned mhz = 0, mw = 0;
    if (a.clock(device_, 1, &mhz) != 0 || a.power(device_, &mw) != 0) return std::nullopt;
    GpuReading r;
    r.sm_mhz = mhz;
    r.power_w = mw / 1000.0;
    unsigned long long reasons = 0;
    if (a.reasons != nullptr && a.reasons(device_, &reasons) == 0) r.reasons = reasons;
    return r;
}

NvmlGpu::~NvmlGpu() = default;

// ---- sampling --------------------------------------------------------------------------------

TelemetrySampler::TelemetrySampler(ReadFn read, std::chrono::milliseconds interval)
    : read_(std::move(read)), interval_(interval) {}

TelemetrySampler::~TelemetrySampler() {
    if (running_) (void)stop();
}

void TelemetrySampler::start() {
    if (running_) (void)stop();
    {
        std::lock_guard<std::mutex> lock(mu_);
        readings_.clear();
    }
    running_ = true;
    thread_ = std::thread([this] {
        auto next = std::chrono::steady_clock::now();
        while (running_) {
            if (auto r = read_()) {
                std::lock_guard<std::mutex> lock(mu_);
                readings_.push_back(*r);
            }
            // (after a slow read, the next one a whole interval later: no burst of catch-up reads
            // weighting the slow stretch)
            next = std::max(next + interval_, std::chrono::steady_clock::now());
            std::this_thread::sleep_until(next);
        }
    });
}

GpuTelemetrySummary TelemetrySampler::stop() {
    if (!running_) return {};  // not started (or stopped already): no readings of its own to report
    running_ = false;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return summarize(readings_);
}

GpuTelemetry::GpuTelemetry(const std::vector<std::string>& pci_bus_ids) {
    for (const std::string& id : pci_bus_ids) {
        auto g = NvmlGpu::open(id);
        if (!g.ok()) {
            why_ = g.status().message();
            gpus_.clear();
            return;
        }
        gpus_.push_back(std::move(*g));
    }
    if (gpus_.empty()) {
        why_ = "no GPUs to watch";
        return;
    }
    sampler_ = std::make_unique<TelemetrySampler>([this]() -> std::optional<GpuReading> {
        GpuReading all;
        bool first = true;
        for (const auto& g : gpus_) {
            auto r = g->read();
            if (!r) return std::nullopt;
            all.sm_mhz = first ? r->sm_mhz : std::min(all.sm_mhz, r->sm_mhz);
            all.power_w = std::max(all.power_w, r->power_w);
            all.reasons |= r->reasons;
            first = false;
        }
        return all;
    });
}

void GpuTelemetry::start() {
    if (sampler_) sampler_->start();
}

GpuTelemetrySummary GpuTelemetry::stop() { return sampler_ ? sampler_->stop() : GpuTelemetrySummary{}; }

}  // namespace gptoss
