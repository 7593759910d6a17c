// The token-level engine: requests in (prompt ids + sampling + stops), token events out. One
// engine thread owns the model runner, the scheduler and the KV cache; callers reach it only through
// a thread-safe command queue (submit, cancel) and read their request's own event queue, so no
// caller can block the engine and the engine never waits on a caller.
//
//   auto engine = Engine::create(std::make_unique<CpuModelRunner>(weights), EngineConfig{});
//   auto handle = (*engine)->submit(Request{.prompt = ids, .max_tokens = 64});
//   while (auto ev = handle->next()) { use(ev->id); if (ev->is_final()) break; }
//
// Chat formats are the front end's business: the engine knows ids only (stop strings excepted,
// which go through the front end's detokenizer; see stop_checker.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/background_worker.h"
#include "core/status.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_transfer.h"
#include "runtime/model_runner.h"
#include "runtime/request_stream.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"
#include "runtime/stop_checker.h"
#include "runtime/token_constraint.h"

namespace gptoss::runtime {

struct Request {
    std::vector<int32_t> prompt{};  // token ids, non-empty, each in [0, vocab_size)
    SamplingParams sampling{};
    std::vector<int32_t> stop_ids{};          // generation ends after emitting one of these
    std::vector<std::string> stop_strings{};  // non-empty; need EngineConfig::detokenizer
    int max_tokens = 16;                      // > 0; prompt + max_tokens must fit the context
    // vLLM's: the first min_tokens (<= max_tokens) tokens are never stop ids (unless a constraint allows nothing
    // else: that one ends it), and no stop string ends generation before the token after them.
    int min_tokens = 0;
    // vLLM's bad_words as token sequences: the last token of each is never drawn where the output so far ends with
    // the others (a one-token sequence: never).
    std::vector<std::vector<int32_t>> bad_words{};
    int logprobs = -1;  // -1: none; 0: the sampled token's; N <= 20: also top N
    // -1: none; N in [0, 20]: each prompt token's logprob (from the first) under the positions before it,
    // its rank and the top N, on the first event. The prompt is then computed whole (no cached prefix).
    int prompt_logprobs = -1;
    // Optional: which tokens may come next (structured outputs); one TokenConstraint per request.
    std::shared_ptr<const TokenConstraintFactory> constraint{};
    // Disaggregated prefill (runtime/kv_transfer.h), the prefill worker's side: the prompt (a whole number of KV
    // blocks) is computed and the request ends with its first token (max_tokens and min_tokens are taken as 1
    // and 0), its final event carrying the prompt's KV (TokenEvent::kv). Needs a runner that can read its blocks
    // (ModelRunner::kv_format).
    bool export_kv = false;
    // The decode worker's side: the KV of the prompt's first kv_prefix->tokens.size() positions, computed by a
    // prefill worker, goes into the prefix cache before the request is queued, so only the rest is computed here.
    // It must be in this runner's format, a prefix of the prompt and shorter than it (invalid_argument
    // otherwise), and needs prefix caching. Where the cache has no room for it, it is dropped and the prompt
    // computed here (EngineStats::num_kv_imports_dropped); with prompt_logprobs it is not used.
    std::shared_ptr<const KvTransfer> kv_prefix{};
    // vLLM's cache_salt: the request reuses only cached prompt blocks of requests with the same salt (none of
    // unsalted ones), so that one tenant cannot tell from timing what prompts another sent. Not with kv_prefix.
    std::string cache_salt{};
    // vLLM's priority: lower values are scheduled (admitted, kept running) first, equal ones first come first
    // served; the last in that order are preempted first.
    int priority = 0;
    // Optional: receives every event on the engine thread instead of the handle's queue. It must
    // return quickly and not call into the engine (cancel() excepted).
    std::function<void(const TokenEvent&)> on_event{};
};

class CommandQueue;  // engine.cpp

// A submitted request: cheap (two shared pointers), movable, safe to use from any thread and to
// outlive the engine. Dropping a handle whose request is still running cancels it.
class RequestHandle {
public:
    RequestHandle() = default;
    RequestHandle(std::shared_ptr<RequestStream> stream, std::shared_ptr<CommandQueue> queue)
        : stream_(std::move(stream)), queue_(std::move(queue)) {}
    RequestHandle(RequestHandle&&) = default;
    RequestHandle& operator=(RequestHandle&& other);
    RequestHandle(const RequestHandle&) = delete;
    RequestHandle& operator=(const RequestHandle&) = delete;
    ~RequestHandle();

    bool valid() const { return stream_ != nullptr; }  // false when default-constructed or moved from
    uint64_t id() const { return stream_->id(); }
    // The next event; nullopt on timeout and after the final event was taken.
    std::optional<TokenEvent> next(std::chrono::milliseconds timeout) { return stream_->next(timeout); }
    std::optional<TokenEvent> next() { return stream_->next(); }
    // Every queued event, waiting at most `timeout` for the first; false if none came.
    bool next_all(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout) {
        return stream_->next_all(out, timeout);
    }
    // Asks the engine to stop the request and free its blocks; its final event has reason
    // cancelled (unless it finished first). Returns at once.
    void cancel();
    bool done() const { return stream_->done(); }  // the final event was produced
    // When the engine last computed anything for the request (RequestStream::last_progress).
    std::chrono::steady_clock::time_point last_progress() const { return stream_->last_progress(); }

private:
    std::shared_ptr<RequestStream> stream_;
    std::shared_ptr<CommandQueue> queue_;
};

struct EngineConfig {
    int block_size = 16;
    KvBudget kv_budget{.bytes = size_t{512} << 20};
    SchedulerConfig scheduler;  // its max_scored_tokens bounds the logits rows of prompt logprobs a step
    bool enable_prefix_caching = true;
    // The longest sequence (prompt + output) a request may have (vLLM's --max-model-len); 0: the model's
    // max_position_embeddings. More than the model's is refused.
    int64_t max_model_len = 0;
    // Seeds of requests that give none derive from this (vLLM's --seed: the same requests in the same order draw
    // the same tokens); unset: from std::random_device.
    std::optional<uint64_t> seed;
    Detokenizer detokenizer;  // for stop strings; may be empty when no request uses them
    // Draw tokens on the device where the runner can (ModelRunner::samples_on_device) for requests
    // that ask for nothing only the host sampler does (logprobs, min-p, penalties, logit bias):
    // only their ids leave the GPU. Off: every row's logits come to the host. GPTOSS_DEVICE_SAMPLING=0
    // turns it off too. A seed then names a draw of the device's stream (Gumbel-max on
    // counter-based noise), not of the host sampler's: same distribution, different tokens.
    bool device_sampling = true;
    // N-gram speculative decoding (runtime/speculative.h); off unless num_tokens > 0. A verification
    // feeds 1 + drafts tokens of a sequence, each a logits row: the drafts of a step are at most the
    // runner's max_batch_entries() beyond max_num_seqs (create the CUDA runner for max_num_seqs +
    // speculative_extra_entries(speculative, max_num_seqs) sequences).
    SpeculativeConfig speculative;
    // Structured-output masks computed on a worker thread during the forward where the runner's forward leaves the
    // host idle (ModelRunner::host_idle_during_forward: the CUDA runner); off, or GPTOSS_MASK_OVERLAP=0: at the draw.
    bool overlap_masks = true;
    // With device sampling, draws that need only a mask (a constraint, min_tokens, bad_words) are drawn on the
    // device under it (ModelRunner::can_defer_draws) instead of bringing their logits to the host;
    // off, or GPTOSS_DEFER_MASKED_DRAWS=0: on the host. A seed then names a draw of the device's stream.
    bool defer_masked_draws = true;
};

struct EngineStats {
    int num_running = 0;
    int num_waiting = 0;
    int num_active = 0;  // submitted and not finished
    KvBlockCounts num_blocks;
    KvBlockCounts num_blocks_in_use;   // held by some sequence (indexed-but-free ones excluded)
    KvBlockCounts num_blocks_indexed;  // in the prefix cache
    int max_chunk_tokens = 0;
    int64_t num_steps = 0;
    int64_t num_tokens_computed = 0;  // fed through the model (prefill chunks and decode tokens)
    int64_t num_tokens_generated = 0;
    int64_t num_preemptions = 0;
    int64_t num_cached_prompt_tokens = 0;  // reused from the prefix cache (admissions and readmissions)
    int64_t num_finished = 0;
    int64_t num_draft_tokens = 0;        // speculative drafts fed to the model
    int64_t num_accepted_tokens = 0;     // of them, kept
    int64_t num_imported_tokens = 0;     // prompt positions whose KV came in a Request::kv_prefix
    int64_t num_kv_imports_dropped = 0;  // kv_prefix transfers not used (no room in the cache, or a copy failed)
    int64_t num_exported_tokens = 0;     // prompt positions exported (Request::export_kv)
};

class Engine {
public:
    // Plans and allocates the KV cache and starts the engine thread.
    static StatusOr<std::unique_ptr<Engine>> create(std::unique_ptr<ModelRunner> runner, EngineConfig config);
    // Cancels what is left (each gets its final cancelled event) and joins the engine thread.
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Validates the request (clear invalid_argument / out_of_range / resource_exhausted errors for
    // an empty or over-long prompt, ids outside the vocabulary, max_tokens <= 0, bad sampling
    // parameters, a request larger than the whole KV cache) and queues it.
    StatusOr<RequestHandle> submit(Request request);
    void cancel(const RequestHandle& handle) const;
    // submit()'s checks alone (nothing is queued).
    Status validate(const Request& request) const;
    // The prompt tokens a request for `prompt` would find in the prefix cache now (taken on the engine thread
    // between steps: the call waits up to a step). 0 without prefix caching or once shutting down.
    int cached_prompt_tokens(std::vector<int32_t> prompt) const;

    const model::GptOssConfig& config() const { return runner_->config(); }
    int block_size() const { return config_.block_size; }
    // The runner's KV format for transfers (Request::export_kv / kv_prefix), or why it has none.
    const StatusOr<KvFormat>& kv_format() const { return kv_format_; }
    // Longest sequence (prompt + max_tokens) a request may ask for: the context (max_model_len) or the KV cache.
    int64_t max_sequence_tokens() const;
    // A snapshot, refreshed after every engine step.
    EngineStats stats() const;
    // Waits until nothing is queued or running (true) or the timeout passes (false).
    bool wait_idle(std::chrono::milliseconds timeout);

private:
    struct Active;
    Engine(std::unique_ptr<ModelRunner> runner, EngineConfig config, KvBlockCounts counts);
    void loop();
    void propose_drafts();
    // Records the prompt logprobs of this step's scored chunks (rows at host_row[row_base[i] + t]).
    void score_prompts(const SchedulerOutput& out, std::span<const int> row_base, std::span<const int64_t> host_row);
    void step();
    // `allowed` (null: every id) less the ids min_tokens and bad_words ban at output index `index`, in a.allowed;
    // the same pointer when nothing is banned. Bans that would leave nothing allowed are dropped (a constraint wins).
    const uint8_t* mask_banned(Active& a, const uint8_t* allowed, int V, int index, std::span<const int32_t> output);
    const uint8_t* constraint_mask(Active& a, int V);
    Status draw_deferred(const std::vector<Active*>& samplers, const std::vector<int>& first_row,
                         const std::vector<int>& first_index);
    void finish(Active& a, TokenEvent event);
    // Request::kv_prefix into the prefix cache (on the engine thread, before request `seq_id` is queued), held for
    // it until it is admitted (KvCacheManager::hold_import).
    void import_kv(uint64_t seq_id, const KvTransfer& t);
    // The KV of a computed prompt (Request::export_kv) while the sequence still holds its blocks.
    StatusOr<std::shared_ptr<const KvTransfer>> export_kv(const Sequence& seq);
    void publish_stats();

    std::unique_ptr<ModelRunner> runner_;
    const EngineConfig config_;
    std::shared_ptr<CommandQueue> queue_;
    // Engine-thread state.
    KvCacheManager kv_;
    Scheduler scheduler_;
    std::unordered_map<uint64_t, std::unique_ptr<Active>> active_;  // by request id
    std::vector<float> logits_;
    std::vector<int32_t> device_ids_;
    std::vector<ModelRunner::DeviceSample> device_params_;
    std::vector<int32_t> draft_scratch_;
    bool device_sampling_ = false;
    bool overlap_masks_ = false;
    bool defer_draws_ = false;
    EngineStats counters_;

    const StatusOr<KvFormat> kv_format_;  // the runner's, for KV transfers
    const int64_t capacity_tokens_;
    const int64_t context_tokens_;  // max_model_len, or the model's context
    const uint64_t seed_base_;      // seeds of requests that give none
    std::atomic<uint64_t> next_id_{1};

    mutable std::mutex stats_mu_;
    std::condition_variable stats_cv_;
    EngineStats stats_;
    uint64_t submitted_ = 0;
    bool idle_ = true;
    std::unique_ptr<BackgroundWorker> mask_worker_;  // constraint masks beside the forward (made when first needed)
    std::thread thread_;
};

}  // namespace gptoss::runtime
