// TokenEngine over the real runtime::Engine. The engine is built (weights loaded, KV cache planned)
// and warmed up on a background thread, so the HTTP server can answer /health with 503 meanwhile.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/engine.h"
#include "server/token_engine.h"

namespace gptoss::server {

class RuntimeEngineAdapter final : public TokenEngine {
public:
    using Loader = std::function<StatusOr<std::unique_ptr<runtime::Engine>>()>;

    RuntimeEngineAdapter() = default;
    // Runs `load` on a background thread, then one short warm-up request; ready() turns true after
    // that. `on_loaded` (optional) is told the outcome, on that thread. Call once.
    void start(Loader load, std::function<void(const Status&)> on_loaded = {});
    // Cancels what is left and joins the engine thread.
    ~RuntimeEngineAdapter() override;

    StatusOr<RequestId> submit(EngineRequest request) override;
    Status validate(const EngineRequest& request) const override;
    StatusOr<runtime::KvFormat> kv_format() const override;
    int cached_prompt_tokens(const std::vector<int32_t>& prompt) const override;
    bool next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) override;
    Clock::time_point last_progress(RequestId id) const override;
    void cancel(RequestId id) override;
    EngineStats stats() const override;
    bool ready() const override { return ready_.load(); }
    int max_context_tokens() const override { return max_context_.load(); }
    int vocab_size() const override { return vocab_size_.load(); }

private:
    Status load_and_warm_up(const Loader& load);
    // The runtime request for `request` (export_kv: the prompt cut to its whole blocks before the last token).
    StatusOr<runtime::Request> to_runtime(EngineRequest request) const;

    std::unique_ptr<runtime::Engine> engine_;  // set once, before ready_
    std::atomic<bool> ready_{false};
    std::atomic<int> max_context_{1};
    std::atomic<int> vocab_size_{1};
    mutable std::mutex mu_;
    std::unordered_map<RequestId, std::shared_ptr<runtime::RequestHandle>> handles_;
    RequestId next_id_ = 1;
    std::thread loader_;
};

}  // namespace gptoss::server
