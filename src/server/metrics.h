// Server metrics in the Prometheus text format (version 0.0.4): requests by endpoint and status,
// prompt and generated tokens, time-to-first-token and inter-token latency histograms, and the
// engine's gauges (queue depth, running sequences, KV blocks in use). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/token_engine.h"

namespace gptoss::server {

// Cumulative histogram with fixed upper bounds (seconds).
class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double value);
    // Appends the _bucket/_sum/_count lines of metric `name`.
    void render(std::string& out, std::string_view name, std::string_view help) const;
    uint64_t count() const;

private:
    const std::vector<double> bounds_;
    mutable std::mutex mu_;
    std::vector<uint64_t> counts_;  // [bounds.size() + 1]: the last is +Inf
    double sum_ = 0.0;
    uint64_t total_ = 0;
};

class ServerMetrics {
public:
    ServerMetrics();

    // One finished HTTP exchange. Unknown paths are counted under endpoint "other".
    void count_request(std::string_view endpoint, int status);
    void add_prompt_tokens(int64_t n) { prompt_tokens_.fetch_add(n); }
    void add_generated_tokens(int64_t n) { generated_tokens_.fetch_add(n); }
    void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
    void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
    void add_cancelled(int64_t n) { cancelled_.fetch_add(n); }

    // The whole exposition: these counters plus the engine gauges and the server's in-flight count.
    std::string render(const EngineStats& engine, int64_t requests_in_flight, bool ready) const;

    int64_t requests_with_status(int status) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
    std::atomic<int64_t> prompt_tokens_{0};
    std::atomic<int64_t> generated_tokens_{0};
    std::atomic<int64_t> cancelled_{0};
    Histogram ttft_;
    Histogram itl_;
};

}  // namespace gptoss::server
