#include "cli/kernel_trace.h"

#include <cstdio>
#include <cstdlib>

#if GPTOSS_HAVE_CUDA && __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>
#define GPTOSS_KERNEL_TRACE_AVAILABLE 1
#endif

namespace gptoss::cli {

#if GPTOSS_KERNEL_TRACE_AVAILABLE
namespace {

using RegisterFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
using KindFn = CUptiResult (*)(CUpti_ActivityKind);
using FlushFn = CUptiResult (*)(uint32_t);
using NextFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);

struct Api {
    RegisterFn register_callbacks = nullptr;
    KindFn enable = nullptr, disable = nullptr;
    FlushFn flush = nullptr;
    NextFn next = nullptr;
};

struct Record {
    std::string name;
    uint64_t start = 0, end = 0;
    int grid = 0, block = 0;
};

// CUPTI calls back into plain functions: the records land here.
std::mutex g_mu;
std::vector<Record> g_records;
NextFn g_next = nullptr;

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    std::lock_guard<std::mutex> lock(g_mu);
    while (g_next != nullptr && g_next(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        g_records.push_back({k->name != nullptr ? k->name : "?", k->start, k->end, k->gridX * k->gridY * k->gridZ,
                             k->blockX * k->blockY * k->blockZ});
    }
    std::free(buffer);
}

// A kernel's name demangled (CUPTI gives the mangled one), without its namespaces, cut to 100
// characters, commas replaced (CSV).
std::string short_name(std::string n) {
    int status = 0;
    if (char* d = abi::__cxa_demangle(n.c_str(), nullptr, nullptr, &status)) {
        if (status == 0) n = d;
        std::free(d);
    }
    for (const char* ns : {"gptoss::kernels::cuda::", "(anonymous namespace)::", "gptoss::kernels::"}) {
        for (size_t p; (p = n.find(ns)) != std::string::npos;) n.erase(p, std::string(ns).size());
    }
    std::replace(n.begin(), n.end(), ',', ';');
    if (n.size() > 100) n.resize(100);
    return n;
}

class CuptiTrace final : public KernelTrace {
public:
    CuptiTrace(Api api, std::string path) : api_(api), path_(std::move(path)) {}
    void start() override {
        {
            std::lock_guard<std::mutex> lock(g_mu);
            g_records.clear();
        }
        api_.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    }
    void stop(const std::string& label, const std::string& step_first) override {
        api_.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        api_.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        api_.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        std::vector<Record> recs;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            recs.swap(g_records);
        }
        std::sort(recs.begin(), recs.end(), [](const Record& a, const Record& b) { return a.start < b.start; });
        // The last complete step: from the second-to-last step start to the last one.
        std::vector<size_t> starts;
        for (size_t i = 0; i < recs.size(); ++i)
            if (recs[i].name.find(step_first) != std::string::npos) starts.push_back(i);
        if (starts.size() < 2) {
            std::fprintf(stderr, "kernel trace %s: %zu kernels, %zu step starts: no complete step\n", label.c_str(),
                         recs.size(), starts.size());
            return;
        }
        const size_t b = starts[starts.size() - 2], e = starts.back();
        FILE* f = std::fopen(path_.c_str(), "a");
        if (f == nullptr) {
            std::fprintf(stderr, "kernel trace: cannot append to %s\n", path_.c_str());
            return;
        }
        const uint64_t t0 = recs[b].start;
        const double step_us = (recs[e].start - t0) / 1e3;
        uint64_t prev_end = t0;  // the latest end so far: a kernel adds what it ends past it
        for (size_t i = b; i < e; ++i) {
            const Record& r = recs[i];
            const uint64_t adds = r.end > prev_end ? r.end - prev_end : 0;
            prev_end = std::max(prev_end, r.end);
            std::fprintf(f, "%s,%.3f,%zu,%s,%.3f,%.3f,%.3f,%d,%d\n", label.c_str(), step_us, i - b,
                         short_name(r.name).c_str(), (r.start - t0) / 1e3, (r.end - t0) / 1e3, adds / 1e3, r.grid,
                         r.block);
        }
        std::fclose(f);
        std::fprintf(stderr, "kernel trace %s: %zu kernels in the last step (%.1f us from start to start) -> %s\n",
                     label.c_str(), e - b, step_us, path_.c_str());
    }

private:
    Api api_;
    std::string path_;
};

}  // namespace

std::unique_ptr<KernelTrace> KernelTrace::from_env() {
    const char* path = std::getenv("GPTOSS_KERNEL_TRACE");
    if (path == nullptr || *path == '\0') return nullptr;
    void* h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) h = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        const char* e = dlerror();
        std::fprintf(stderr, "GPTOSS_KERNEL_TRACE: libcupti not loaded (%s)\n", e != nullptr ? e : "?");
        return nullptr;
    }
    Api api;
    api.register_callbacks = reinterpret_cast<RegisterFn>(dlsym(h, "cuptiActivityRegisterCallbacks"));
    api.enable = reinterpret_cast<KindFn>(dlsym(h, "cuptiActivityEnable"));
    api.disable = reinterpret_cast<KindFn>(dlsym(h, "cuptiActivityDisable"));
    api.flush = reinterpret_cast<FlushFn>(dlsym(h, "cuptiActivityFlushAll"));
    api.next = reinterpret_cast<NextFn>(dlsym(h, "cuptiActivityGetNextRecord"));
    if (!api.register_callbacks || !api.enable || !api.disable || !api.flush || !api.next) {
        std::fprintf(stderr, "GPTOSS_KERNEL_TRACE: libcupti lacks the activity API\n");
        return nullptr;
    }
    g_next = api.next;
    if (api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        std::fprintf(stderr, "GPTOSS_KERNEL_TRACE: cuptiActivityRegisterCallbacks failed\n");
        return nullptr;
    }
    std::FILE* f = std::fopen(path, "a");
    if (f == nullptr) {
        std::fprintf(stderr, "GPTOSS_KERNEL_TRACE: cannot write %s\n", path);
        return nullptr;
    }
    std::fprintf(f, "label,step_us,index,kernel,start_us,end_us,adds_us,grid,block\n");
    std::fclose(f);
    return std::make_unique<CuptiTrace>(api, path);
}
#else
std::unique_ptr<KernelTrace> KernelTrace::from_env() {
    if (std::getenv("GPTOSS_KERNEL_TRACE") != nullptr)
        std::fprintf(stderr, "GPTOSS_KERNEL_TRACE: not available in this build (no CUDA or no CUPTI headers)\n");
    return nullptr;
}
#endif

}  // namespace gptoss::cli
