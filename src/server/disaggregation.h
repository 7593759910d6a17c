// Prefill/decode disaggregation across servers (runtime/kv_transfer.h for the engine's side).
//
//   gptoss serve --disaggregation-mode prefill --port 8100 ...          the prefill worker
//   gptoss serve --disaggregation-mode decode --prefill-url http://127.0.0.1:8100 ...
//
// Clients talk to the decode worker as to any server. For each request whose prompt has a whole KV
// block before its last token, the decode worker asks the prefill worker (POST /v1/kv/prefill) for
// the KV of those blocks, imports it into its prefix cache and computes only the rest (at least the
// last prompt token, whose logits it samples itself, so seeds and sampling stay the decode worker's).
// Whatever goes wrong on that path (the prefill worker down or slow, another model or KV format, no
// room in the cache) costs time, never the answer: the prompt is then computed on the decode worker.
// Both must load the same checkpoint: the format check sees shapes and dtypes, not weight values.
//
// POST /v1/kv/prefill (prefill workers only): {"prompt_token_ids": [ids], "kv_format": {...}} →
// application/octet-stream, one KV transfer (kv_transfer.h's wire format); 409 when kv_format (the
// decode worker's, optional) is not this worker's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/openai_json.h"
#include "server/token_engine.h"

namespace gptoss::server {

Json kv_format_to_json(const runtime::KvFormat& f);
StatusOr<runtime::KvFormat> kv_format_from_json(const Json& j);

// Asks a prefill worker for a prompt's KV. The URL is "http://host:port" (a path prefix is allowed).
// One fetch's cancellation (DisaggregatedEngine::cancel of its request while its KV is on the way): the fetch
// registers how to end itself early (PrefillClient::prefill: its connection's stop, so that the prefill worker sees
// the close and drops the prompt's work), and cancel() runs it.
class FetchCancel {
public:
    // `stop` runs at once if cancel() came already, else when it comes; an empty function unregisters (before what
    // `stop` refers to goes away).
    void on_cancel(std::function<void()> stop);
    void cancel();
    bool cancelled() const;

private:
    mutable std::mutex mu_;
    bool cancelled_ = false;
    std::function<void()> stop_;
};

class PrefillClient {
public:
    // `api_key` (may be empty): sent as `Authorization: Bearer <key>` to a prefill worker started with --api-key.
    static StatusOr<std::unique_ptr<PrefillClient>> create(const std::string& url, std::chrono::seconds timeout,
                                                           std::string api_key = {});
    // The KV of the prompt's whole blocks before its last token, in `format` (checked again on arrival).
    // The answer may be at most the transfer's size for the prompt in `format` (a larger one is refused).
    // `priority` (nonzero: sent as the body's "priority", which a prefill worker under --scheduling-policy priority
    // schedules by).
    // `cancel` (may be null): cancelling it closes the call's connection (the call fails at once).
    StatusOr<std::shared_ptr<const runtime::KvTransfer>> prefill(const std::vector<int32_t>& prompt,
                                                                 const runtime::KvFormat& format, int priority = 0,
                                                                 FetchCancel* cancel = nullptr) const;
    // Ends every call in flight (it fails at once) and refuses new ones: for shutdown.
    void stop();

private:
    PrefillClient() = default;
    std::string scheme_host_port_, path_;
    std::chrono::seconds timeout_{600};
    std::string api_key_;
    mutable std::mutex mu_;
    mutable std::vector<void*> active_;  // the httplib::Client of each call in flight
    bool stopped_ = false;
};

struct DisaggregationOptions {
    // Prompts of at most this many tokens are computed here without asking (a prefill worker's round trip
    // costs more than a short prompt); 0: every prompt with a whole block before its last token is sent. A prompt
    // whose start is in the local prefix cache is sent only when the blocks the transfer would add are more than
    // this and at least as many as those cached (a conversation's next turn is computed here).
    int min_prompt_tokens = 0;
    int fetch_threads = 16;  // prefill worker calls in flight at once; more queue
};

// The decode worker's engine: a TokenEngine in front of the local one that fetches each request's prompt KV
// from a prefill worker before submitting it there. submit() validates at once and never waits for the fetch;
// the request's events start once it is submitted locally. Queued fetches start in (priority, arrival) order.
class DisaggregatedEngine final : public TokenEngine {
public:
    // `priority`: the request's (vLLM's), for the prefill worker's scheduler.
    // `cancel`: the request's (cancel() of the request cancels it; PrefillClient::prefill takes it).
    using Fetch = std::function<StatusOr<std::shared_ptr<const runtime::KvTransfer>>(
        const std::vector<int32_t>& prompt, const runtime::KvFormat& format, int priority, FetchCancel& cancel)>;
    // `local` must outlive this object; `fetch` is called on the fetch threads; `interrupt` (optional) makes the
    // fetches in flight return at once (PrefillClient::stop), for the destructor.
    DisaggregatedEngine(TokenEngine& local, Fetch fetch, DisaggregationOptions options = {},
                        std::function<void()> interrupt = {});
    // Interrupts the fetches in flight (their requests are dropped) and joins the threads.
    ~DisaggregatedEngine() override;

    StatusOr<RequestId> submit(EngineRequest request) override;
    Status validate(const EngineRequest& request) const override { return local_.validate(request); }
    StatusOr<runtime::KvFormat> kv_format() const override { return local_.kv_format(); }
    bool next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) override;
    void cancel(RequestId id) override;
    EngineStats stats() const override;
    bool ready() const override { return local_.ready(); }
    int max_context_tokens() const override { return local_.max_context_tokens(); }
    int vocab_size() const override { return local_.vocab_size(); }
    Clock::time_point last_progress(RequestId id) const override;

private:
    struct Entry {
        EngineRequest request;    // until submitted
        RequestId local_id = 0;   // 0 while the prompt's KV is being fetched
        std::string error;        // the local submit failed after the fetch: one error event
        Clock::time_point since;  // queued, or its fetch began (last_progress while it is not submitted)
        std::shared_ptr<FetchCancel> fetch_cancel;  // while its fetch runs
    };
    void fetch_loop();

    TokenEngine& local_;
    const Fetch fetch_;
    const DisaggregationOptions options_;
    const std::function<void()> interrupt_;
    mutable std::mutex mu_;
    std::condition_variable cv_;  // an entry left the fetching state; a job was queued; stopping
    std::unordered_map<RequestId, Entry> entries_;
    std::deque<RequestId> jobs_;
    RequestId next_id_ = 1;
    bool stopping_ = false;
    int64_t fetched_ = 0, fetch_failures_ = 0, skipped_ = 0, fetched_bytes_ = 0;
    double fetch_seconds_ = 0;
    std::vector<std::thread> threads_;
};

}  // namespace gptoss::server
