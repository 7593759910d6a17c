// The per-request event queue between the engine thread (producer) and whoever consumes the
// request (a CLI loop, an HTTP handler): the engine never blocks on it (a push takes a short lock),
// consumers wait with a timeout or get a callback instead.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kv_transfer.h"
#include "runtime/sampler.h"
#include "runtime/stop_checker.h"

namespace gptoss::runtime {

struct TokenEvent {
    int32_t id = -1;                         // the generated token; -1 on a final event without a token (cancel, error)
    int index = -1;                          // its position in the output (0, 1, …)
    float logprob = 0;                       // raw logprob of `id` (when the request asked for logprobs)
    std::vector<TokenLogprob> top_logprobs;  // top-N raw logprobs (when asked for)
    // On the request's first event, with Request::prompt_logprobs: entry i for prompt token i + 1.
    std::vector<PromptLogprob> prompt_logprobs;
    // Set on the request's last event only.
    std::optional<FinishReason> finish_reason;
    std::optional<int32_t> stop_id;              // finish_reason stop: the stop id that ended it
    std::optional<int> stop_string_index;        // finish_reason stop: the stop string that ended it
    int trim_bytes = 0;                          // bytes to drop from the end of the decoded output
    int num_prompt_tokens = 0;                   // usage: on every token event and the last
    int num_cached_tokens = 0;                   // prompt tokens served by the prefix cache (the same events)
    std::string error;                           // finish_reason error: what went wrong
    std::shared_ptr<const KvTransfer> kv;        // Request::export_kv: the prompt's KV, on the last event
    std::chrono::steady_clock::time_point time;  // when the engine produced it

    bool is_final() const { return finish_reason.has_value(); }
};

class RequestStream {
public:
    using Callback = std::function<void(const TokenEvent&)>;
    explicit RequestStream(uint64_t id, Callback callback = {}) : id_(id), callback_(std::move(callback)) {}

    uint64_t id() const { return id_; }

    // Engine side. With a callback the event goes to it (on the engine thread), else to the queue.
    void push(TokenEvent event);

    // Consumer side. The next event, waiting at most `timeout`; nullopt on timeout and once the
    // final event has been taken.
    std::optional<TokenEvent> next(std::chrono::milliseconds timeout);
    // The same without a time limit: nullopt only once the final event has been taken.
    std::optional<TokenEvent> next();
    // Appends every queued event to `out`, waiting at most `timeout` for the first; false if none.
    bool next_all(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout);
    bool done() const;     // the final event was pushed
    bool drained() const;  // ... and taken

    // Engine side: the request took part in a step (a prefill chunk or a token). Consumers read
    // when that last happened (a time-point zero before the first step), so a long prefill, which
    // emits no event, is not taken for a stall.
    void mark_progress() {
        progress_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
    std::chrono::steady_clock::time_point last_progress() const {
        return std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(progress_ns_.load(std::memory_order_relaxed)));
    }

private:
    const uint64_t id_;
    Callback callback_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<TokenEvent> events_;
    bool done_ = false;
    bool drained_ = false;
    std::atomic<std::chrono::steady_clock::rep> progress_ns_{0};
};

}  // namespace gptoss::runtime
