// A scripted TokenEngine for the server's tests: each request "generates" the token ids a script
// gives it, one per engine step, with the real engine's bookkeeping around it (a running-sequence
// limit, a waiting queue, KV blocks per sequence, max_tokens, stop ids, cancellation), so tests can
// check Harmony-shaped output, latency paths and leaks without a model.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "server/token_engine.h"

namespace gptoss::server {

struct FakeEngineOptions {
    int max_context_tokens = 4096;
    int vocab_size = 201088;
    int max_running = 8;  // sequences generating at once; the rest wait
    int kv_block_size = 16;
    int64_t kv_blocks_total = 4096;
    std::chrono::microseconds step_interval{200};  // time between two steps
    int tokens_per_step = 1;
    int cached_prompt_tokens = 0;  // said on every event (as the real engine's prefix cache hits are)  // tokens a
                                   // sequence gets a step, delivered together (as speculative decoding's)
    bool ready = true;
};

// The tokens a request produces (before max_tokens and stop ids cut it). When the script runs
// out before a stop id, the request ends with kStop and no token.
using FakeScript = std::function<std::vector<int32_t>(const EngineRequest&)>;

class FakeEngine final : public TokenEngine {
public:
    explicit FakeEngine(FakeEngineOptions options = {});
    ~FakeEngine() override;

    StatusOr<RequestId> submit(EngineRequest request) override;
    bool next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) override;
    void cancel(RequestId id) override;
    Clock::time_point last_progress(RequestId id) const override;
    EngineStats stats() const override;
    bool ready() const override { return ready_.load(); }
    int max_context_tokens() const override { return options_.max_context_tokens; }
    int vocab_size() const override { return options_.vocab_size; }

    void set_ready(bool ready) { ready_.store(ready); }
    void set_script(FakeScript script);
    // While paused no tokens are produced (requests stay running, holding their KV blocks).
    void set_paused(bool paused);
    // A running sequence's "prefill": no token for this long after it starts running, its progress
    // marked every step meanwhile (as the real engine marks prefill chunks).
    void set_prefill_time(std::chrono::milliseconds t);
    // Fails the next submitted request with this engine error event (empty: none).
    void fail_next_request(std::string error);

    int64_t submitted() const { return submitted_.load(); }
    // cancel() calls on requests that had not finished yet.
    int64_t cancelled_unfinished() const { return cancelled_unfinished_.load(); }
    // The last request submitted (copied).
    EngineRequest last_request() const;

private:
    struct Sequence {
        EngineRequest request;
        std::vector<int32_t> script;
        size_t generated = 0;
        bool running = false;
        bool finished = false;
        Clock::time_point started{};   // when it began running
        Clock::time_point progress{};  // its last step
        std::string fail_with;
        std::deque<EngineEvent> events;
        std::condition_variable cv;
    };

    void loop();
    void admit_locked();
    void step_locked();
    void finish_locked(Sequence& s, EngineEvent event);
    int64_t blocks_for(int64_t tokens) const;

    const FakeEngineOptions options_;
    std::atomic<bool> ready_;
    std::atomic<int64_t> submitted_{0};
    std::atomic<int64_t> cancelled_unfinished_{0};

    mutable std::mutex mu_;
    std::condition_variable work_cv_;
    bool stop_ = false;
    bool paused_ = false;
    std::chrono::milliseconds prefill_time_{0};
    FakeScript script_;
    std::string fail_next_;
    EngineRequest last_request_;
    RequestId next_id_ = 1;
    std::map<RequestId, std::shared_ptr<Sequence>> seqs_;  // ordered: FIFO admission
    int64_t kv_blocks_in_use_ = 0;
    std::thread thread_;
};

}  // namespace gptoss::server
