#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace gptoss::server {
namespace {

// Prometheus wants "+Inf" and shortest-round-trip numbers.
std::string format_double(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
}

void header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
}

void gauge(std::string& out, std::string_view name, std::string_view help, double value) {
    header(out, name, help, "gauge");
    out += name;
    out += ' ';
    out += format_double(value);
    out += '\n';
}

void counter(std::string& out, std::string_view name, std::string_view help, double value) {
    header(out, name, help, "counter");
    out += name;
    out += ' ';
    out += format_double(value);
    out += '\n';
}

// Label values are our own endpoint names, but escape anyway.
std::string escape_label(std::string_view v) {
    std::string s;
    for (char c : v) {
        if (c == '\\' || c == '"') s += '\\';
        if (c == '\n') {
            s += "\\n";
            continue;
        }
        s += c;
    }
    return s;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
    const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[i];
    sum_ += value;
    ++total_;
}

uint64_t Histogram::count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
    std::vector<uint64_t> counts;
    double sum;
    uint64_t total;
    {
        std::lock_guard<std::mutex> lock(mu_);
        counts = counts_;
        sum = sum_;
        total = total_;
    }
    header(out, name, help, "histogram");
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
        cumulative += counts[i];
        out += name;
        out += "_bucket{le=\"";
        out += i < bounds_.size() ? format_double(bounds_[i]) : "+Inf";
        out += "\"} ";
        out += std::to_string(cumulative);
        out += '\n';
    }
    out += name;
    out += "_sum " + format_double(sum) + "\n";
    out += name;
    out += "_count " + std::to_string(total) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}) {}

void ServerMetrics::count_request(std::string_view endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{std::string(endpoint), status}];
}

int64_t ServerMetrics::requests_with_status(int status) const {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& [key, count] : requests_) {
        if (key.second == status) n += static_cast<int64_t>(count);
    }
    return n;
}

std::string ServerMetrics::render(const EngineStats& engine, int64_t requests_in_flight, bool ready) const {
    std::string out;
    header(out, "gptoss_http_requests_total", "HTTP requests by endpoint and status code.", "counter");
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [key, count] : requests_) {
            out += "gptoss_http_requests_total{endpoint=\"" + escape_label(key.first) + "\",status=\"" +
                   std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
        }
    }
    counter(out, "gptoss_prompt_tokens_total", "Prompt tokens submitted to the engine.",
            static_cast<double>(prompt_tokens_.load()));
    counter(out, "gptoss_generation_tokens_total", "Tokens generated.", static_cast<double>(generated_tokens_.load()));
    counter(out, "gptoss_requests_cancelled_total", "Requests cancelled before they finished (client gone).",
            static_cast<double>(cancelled_.load()));
    counter(out, "gptoss_spec_decode_draft_tokens_total", "Speculative draft tokens fed to the model.",
            static_cast<double>(engine.spec_draft_tokens));
    counter(out, "gptoss_spec_decode_accepted_tokens_total", "Speculative draft tokens kept.",
            static_cast<double>(engine.spec_accepted_tokens));
    counter(out, "gptoss_kv_imported_tokens_total", "Prompt positions whose KV came from a prefill worker.",
            static_cast<double>(engine.kv_imported_tokens));
    counter(out, "gptoss_kv_imports_dropped_total", "KV transfers received but not used (no room in the cache).",
            static_cast<double>(engine.kv_imports_dropped));
    counter(out, "gptoss_kv_exported_tokens_total", "Prompt positions whose KV was exported to a decode worker.",
            static_cast<double>(engine.kv_exported_tokens));
    counter(out, "gptoss_remote_prefills_total", "Prompts prefilled by the prefill worker.",
            static_cast<double>(engine.remote_prefills));
    counter(out, "gptoss_remote_prefill_failures_total",
            "Prefill worker calls that failed (the prompt was computed here).",
            static_cast<double>(engine.remote_prefill_failures));
    counter(out, "gptoss_remote_prefills_skipped_total",
            "Prompts mostly in the local prefix cache already, computed here without asking the prefill worker.",
            static_cast<double>(engine.remote_prefills_skipped));
    counter(out, "gptoss_remote_prefill_seconds_total",
            "Time in prefill worker calls that brought KV back (computing the prompt there and the transfer).",
            engine.remote_prefill_seconds);
    counter(out, "gptoss_remote_prefill_bytes_total", "KV bytes brought back by prefill worker calls.",
            static_cast<double>(engine.remote_prefill_bytes));
    ttft_.render(out, "gptoss_time_to_first_token_seconds", "Time from request arrival to its first token.");
    itl_.render(out, "gptoss_inter_token_latency_seconds", "Time between two tokens of one request.");
    gauge(out, "gptoss_requests_in_flight", "Requests the server is handling now.",
          static_cast<double>(requests_in_flight));
    gauge(out, "gptoss_queue_depth", "Requests waiting to be scheduled by the engine.",
          static_cast<double>(engine.waiting_requests));
    gauge(out, "gptoss_running_sequences", "Sequences the engine is generating now.",
          static_cast<double>(engine.running_sequences));
    gauge(out, "gptoss_kv_blocks_in_use", "KV cache blocks held by sequences.",
          static_cast<double>(engine.kv_blocks_in_use));
    gauge(out, "gptoss_kv_blocks_total", "KV cache blocks in the pool.", static_cast<double>(engine.kv_blocks_total));
    gauge(out, "gptoss_ready", "1 once the engine is warmed up.", ready ? 1.0 : 0.0);
    return out;
}

}  // namespace gptoss::server
