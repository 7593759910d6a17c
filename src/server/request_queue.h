// The bridge between HTTP worker threads and the engine: admission (a cap on requests in flight,
// refusal while shutting down), one RAII GenerationStream per request that always releases its
// engine request (so a client that goes away frees its KV blocks), and the token/latency metrics.
// HTTP threads block only here, on their own request's events, with a timeout; the engine thread
// never waits on them.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "core/status.h"
#include "server/metrics.h"
#include "server/token_engine.h"

namespace gptoss::server {

struct RequestQueueOptions {
    int64_t max_in_flight = 1024;  // requests past this get 503
};

class RequestQueue;

// One submitted request. Destroying it ends the engine request (cancel if still generating).
class GenerationStream {
public:
    ~GenerationStream();
    GenerationStream(const GenerationStream&) = delete;
    GenerationStream& operator=(const GenerationStream&) = delete;

    // Appends the events that arrived, waiting up to `timeout` for one. False when none came. Also
    // returns false at once after the last event and while the server shuts down.
    bool next(std::vector<EngineEvent>* out, std::chrono::milliseconds timeout);
    // Ends generation now (the server has what it needs, e.g. a stop string matched): the engine
    // request is released at once and not counted as cancelled. `unread` is how many token events of
    // the last batch came after the one that ended it (a speculative step delivers several): they are
    // taken back out of the generated-tokens count, which then agrees with the answer's usage.
    void stop(size_t unread = 0);
    bool finished() const { return finished_; }
    // The engine's last step for this request (TokenEngine::last_progress).
    Clock::time_point last_progress() const;
    int64_t prompt_tokens() const { return prompt_tokens_; }
    int64_t generated_tokens() const { return generated_; }

private:
    friend class RequestQueue;
    GenerationStream(RequestQueue& queue, RequestId id, int64_t prompt_tokens, Clock::time_point arrival);

    RequestQueue& queue_;
    const RequestId id_;
    const int64_t prompt_tokens_;
    const Clock::time_point arrival_;
    Clock::time_point last_token_time_;
    int64_t generated_ = 0;
    bool finished_ = false;
    bool released_ = false;
};

class RequestQueue {
public:
    RequestQueue(TokenEngine& engine, ServerMetrics& metrics, RequestQueueOptions options = {});

    // Errors: those of TokenEngine::submit, failed_precondition when shutting down or full.
    StatusOr<std::unique_ptr<GenerationStream>> submit(EngineRequest request, Clock::time_point arrival);

    // New submissions fail; waiting streams return at once so HTTP threads can finish.
    void shutdown() { shutting_down_.store(true); }
    bool shutting_down() const { return shutting_down_.load(); }

    int64_t in_flight() const { return in_flight_.load(); }
    const TokenEngine& engine() const { return engine_; }
    ServerMetrics& metrics() const { return metrics_; }

private:
    friend class GenerationStream;
    TokenEngine& engine_;
    ServerMetrics& metrics_;
    const RequestQueueOptions options_;
    std::atomic<bool> shutting_down_{false};
    std::atomic<int64_t> in_flight_{0};
};

}  // namespace gptoss::server
