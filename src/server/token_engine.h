// The engine as the server sees it: token ids in, a stream of token events out. The server is
// written against this interface only; FakeEngine (scripted streams, for tests) and
// RuntimeEngineAdapter (the real runtime::Engine) implement it.
//
// Threading contract: every method is called from HTTP worker threads, concurrently, and must be
// thread-safe. submit() and cancel() never wait for generation; next_events() waits at most its
// timeout. An implementation buffers each request's events itself, so a request whose reader is
// slow never holds up the engine thread or another request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/kv_transfer.h"
#include "runtime/sampler.h"
#include "runtime/token_constraint.h"

namespace gptoss::server {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

struct EngineRequest {
    std::vector<int32_t> prompt;  // [num_prompt_tokens] token ids, non-empty
    runtime::SamplingParams sampling;
    // Generation ends after emitting one of these ids (the id itself is the last event's token).
    std::vector<int32_t> stop_ids;
    int max_tokens = 16;  // tokens to generate at most, > 0
    int min_tokens = 0;   // vLLM's: the first min_tokens are never stop ids; no stop id or string ends before
    // vLLM's bad_words as token sequences (runtime::Request::bad_words).
    std::vector<std::vector<int32_t>> bad_words;
    int top_logprobs = -1;  // -1: no logprobs; k >= 0: the sampled token's logprob + the k best
    // -1: none; k >= 0: each prompt token's logprob (from the second), its rank and the k best, on the
    // first event. The prompt is then computed whole (no prefix-cache reuse).
    int prompt_logprobs = -1;
    // Optional: which tokens may come next (structured outputs; runtime/token_constraint.h).
    std::shared_ptr<const runtime::TokenConstraintFactory> constraint;
    // Disaggregated prefill (runtime/kv_transfer.h), the prefill worker's side: the KV of the prompt's whole
    // blocks before its last token is computed and comes back on the final event (EngineEvent::kv); the request
    // ends with one token.
    bool export_kv = false;
    // The decode worker's side: a prefix of the prompt's KV computed by a prefill worker (runtime::Request::kv_prefix).
    std::shared_ptr<const runtime::KvTransfer> kv_prefix;
    // vLLM's cache_salt (runtime::Request::cache_salt): prompt blocks are shared only among requests with the same.
    std::string cache_salt;
    int priority = 0;  // vLLM's (runtime::Request::priority)
};

enum class FinishReason {
    kNone,       // not finished (a token event in the middle of the stream)
    kStop,       // a stop id was generated
    kLength,     // max_tokens or the context limit
    kCancelled,  // cancel() or engine shutdown
    kError,      // the engine failed this request (message in EngineEvent::error)
};

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// A prompt token's logprob under the positions before it (EngineRequest::prompt_logprobs).
struct PromptLogprob {
    float logprob = 0.0f;
    int rank = 0;                   // 1 + the ids more probable than the prompt token
    std::vector<TokenLogprob> top;  // best first
};

// One generated token, or the end of the request. The last event of every request has
// finish != kNone; it carries a token (token_id >= 0) when a token ended it (stop id, length).
struct EngineEvent {
    int32_t token_id = -1;                   // -1: no token (an end without a token: cancelled, error)
    float logprob = 0.0f;                    // of token_id, when logprobs were asked for
    std::vector<TokenLogprob> top_logprobs;  // [top_logprobs] best first
    // The first token's event, with EngineRequest::prompt_logprobs: entry i for prompt token i + 1.
    std::vector<PromptLogprob> prompt_logprobs;
    FinishReason finish = FinishReason::kNone;
    std::string error;                              // kError only
    int cached_prompt_tokens = 0;                   // last event: prompt tokens served from the prefix cache
    std::shared_ptr<const runtime::KvTransfer> kv;  // last event of an export_kv request: the prompt's KV
    Clock::time_point time;                         // when the engine produced it (for the latency histograms)
};

// Gauges for /metrics and the load tests' leak checks.
struct EngineStats {
    int64_t waiting_requests = 0;   // submitted, not yet scheduled
    int64_t running_sequences = 0;  // scheduled, holding KV blocks
    int64_t kv_blocks_in_use = 0;
    int64_t kv_blocks_total = 0;
    int64_t spec_draft_tokens = 0;     // speculative drafts fed to the model (counter)
    int64_t spec_accepted_tokens = 0;  // of them, kept (counter)
    // Disaggregated prefill (counters).
    int64_t kv_imported_tokens = 0;       // prompt positions whose KV came from a prefill worker
    int64_t kv_imports_dropped = 0;       // transfers received but not used (no room in the cache)
    int64_t kv_exported_tokens = 0;       // prompt positions exported to decode workers
    int64_t remote_prefills = 0;          // prefill worker calls that brought KV back
    int64_t remote_prefill_failures = 0;  // calls that failed (the prompt was computed here)
    int64_t remote_prefills_skipped = 0;  // prompts mostly in the local prefix cache: computed here, not fetched
    double remote_prefill_seconds = 0;    // time in the calls that brought KV back (the transfer's share of TTFT)
    int64_t remote_prefill_bytes = 0;     // KV bytes those calls brought
};

class TokenEngine {
public:
    virtual ~TokenEngine() = default;

    // Queues a request. Errors (nothing is queued): invalid_argument (bad ids, bad parameters),
    // out_of_range (prompt + max_tokens past the context), failed_precondition (shutting down).
    virtual StatusOr<RequestId> submit(EngineRequest request) = 0;
    // submit()'s checks alone, nothing queued (the same errors).
    virtual Status validate(const EngineRequest& request) const {
        (void)request;
        return ok_status();
    }
    // The KV cache's format for disaggregated prefill's transfers, or why there is none.
    virtual StatusOr<runtime::KvFormat> kv_format() const {
        return unimplemented("this engine cannot export or import KV");
    }
    // The prompt tokens a request for `prompt` would find in the local prefix cache now (may wait up to an engine
    // step); 0 where nothing is cached or known.
    virtual int cached_prompt_tokens(const std::vector<int32_t>& prompt) const {
        (void)prompt;
        return 0;
    }
    // Appends the request's buffered events to `out`, waiting up to `timeout` for at least one.
    // Returns false when none came (or the id is unknown). After the event with finish != kNone
    // there are no more events.
    virtual bool next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) = 0;
    // Ends the request: stops it if it is still generating, frees its KV blocks, forgets the id.
    // The server calls it exactly once for every submitted id, finished or not.
    virtual void cancel(RequestId id) = 0;

    virtual EngineStats stats() const = 0;
    // True once the engine is loaded and warmed up (/health answers 200 only then).
    virtual bool ready() const = 0;
    // Longest sequence (prompt + generated tokens) one request may reach.
    virtual int max_context_tokens() const = 0;
    // Token ids must be < vocab_size().
    virtual int vocab_size() const = 0;
    // When the engine last computed anything for the request: a prefill chunk or a token (a
    // time-point zero if never or unknown). The server's stall timeout counts from the later of
    // this and the last event, so a long prefill is not a stall.
    virtual Clock::time_point last_progress(RequestId) const { return {}; }
};

}  // namespace gptoss::server
