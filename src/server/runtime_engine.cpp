#include "server/runtime_engine.h"

#include <algorithm>
#include <new>

namespace gptoss::server {
namespace {

FinishReason convert(runtime::FinishReason r) {
    switch (r) {
        case runtime::FinishReason::kStop: return FinishReason::kStop;
        case runtime::FinishReason::kLength: return FinishReason::kLength;
        case runtime::FinishReason::kCancelled: return FinishReason::kCancelled;
        case runtime::FinishReason::kError: return FinishReason::kError;
    }
    return FinishReason::kError;
}

EngineEvent convert(const runtime::TokenEvent& t) {
    EngineEvent e;
    e.token_id = t.id;
    e.logprob = t.logprob;
    e.top_logprobs.reserve(t.top_logprobs.size());
    for (const runtime::TokenLogprob& lp : t.top_logprobs) e.top_logprobs.push_back({lp.id, lp.logprob});
    e.prompt_logprobs.reserve(t.prompt_logprobs.size());
    for (const runtime::PromptLogprob& p : t.prompt_logprobs) {
        PromptLogprob q{p.logprob, p.rank, {}};
        for (const runtime::TokenLogprob& lp : p.top) q.top.push_back({lp.id, lp.logprob});
        e.prompt_logprobs.push_back(std::move(q));
    }
    if (t.finish_reason) e.finish = convert(*t.finish_reason);
    e.error = t.error;
    e.cached_prompt_tokens = t.num_cached_tokens;
    e.kv = t.kv;
    e.time = Clock::now();
    return e;
}

}  // namespace

void RuntimeEngineAdapter::start(Loader load, std::function<void(const Status&)> on_loaded) {
    loader_ = std::thread([this, load = std::move(load), on_loaded = std::move(on_loaded)] {
        // Nothing escapes the thread (an escaping exception ends the process): out of memory is a load error.
        Status st;
        try {
            st = load_and_warm_up(load);
        } catch (const std::bad_alloc&) {
            st = resource_exhausted("out of memory while loading the model");
        } catch (const std::exception& e) {
            st = internal_error(std::string("loading the model failed: ") + e.what());
        }
        if (st.ok()) ready_.store(true);
        if (on_loaded) on_loaded(st);
    });
}

RuntimeEngineAdapter::~RuntimeEngineAdapter() {
    if (loader_.joinable()) loader_.join();
    {
        std::lock_guard<std::mutex> lock(mu_);
        handles_.clear();  // dropping a handle cancels its request
    }
    engine_.reset();
}

Status RuntimeEngineAdapter::load_and_warm_up(const Loader& load) {
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, load());
    // min(model context, KV cache capacity): the longest sequence the engine accepts.
    const int64_t context = engine->max_sequence_tokens();
    max_context_.store(static_cast<int>(std::clamp<int64_t>(context, 1, INT32_MAX)));
    vocab_size_.store(engine->config().vocab_size);
    // Warm-up: one token through the whole path before /health says ready.
    runtime::Request warm;
    warm.prompt = {0};
    warm.max_tokens = 1;
    warm.sampling.temperature = 0.0f;
    ASSIGN_OR_RETURN(runtime::RequestHandle handle, engine->submit(std::move(warm)));
    for (;;) {
        std::optional<runtime::TokenEvent> ev = handle.next(std::chrono::milliseconds(600000));
        if (!ev) return internal_error("the engine's warm-up request timed out");
        if (ev->finish_reason == runtime::FinishReason::kError) return internal_error("warm-up failed: " + ev->error);
        if (ev->is_final()) break;
    }
    engine_ = std::move(engine);
    return ok_status();
}

StatusOr<runtime::Request> RuntimeEngineAdapter::to_runtime(EngineRequest request) const {
    if (request.export_kv) {
        const size_t bs = static_cast<size_t>(engine_->block_size());
        const size_t keep = request.prompt.empty() ? 0 : (request.prompt.size() - 1) / bs * bs;
        if (keep == 0)
            return invalid_argument("a prompt of " + std::to_string(request.prompt.size()) +
                                    (request.prompt.size() == 1 ? " token" : " tokens") +
                                    " has no whole KV block before its last token (blocks of " + std::to_string(bs) +
                                    ")");
        request.prompt.resize(keep);
    }
    runtime::Request r;
    r.prompt = std::move(request.prompt);
    r.sampling = request.sampling;
    r.stop_ids = std::move(request.stop_ids);
    r.max_tokens = request.max_tokens;
    r.min_tokens = request.min_tokens;
    r.bad_words = std::move(request.bad_words);
    r.logprobs = request.top_logprobs;
    r.prompt_logprobs = request.prompt_logprobs;
    r.constraint = std::move(request.constraint);
    r.export_kv = request.export_kv;
    r.kv_prefix = std::move(request.kv_prefix);
    r.cache_salt = std::move(request.cache_salt);
    r.priority = request.priority;
    return r;
}

Status RuntimeEngineAdapter::validate(const EngineRequest& request) const {
    if (!ready()) return failed_precondition("the engine is not loaded yet");
    ASSIGN_OR_RETURN(runtime::Request r, to_runtime(request));
    return engine_->validate(r);
}

StatusOr<runtime::KvFormat> RuntimeEngineAdapter::kv_format() const {
    if (!ready()) return failed_precondition("the engine is not loaded yet");
    return engine_->kv_format();
}

int RuntimeEngineAdapter::cached_prompt_tokens(const std::vector<int32_t>& prompt) const {
    return ready() ? engine_->cached_prompt_tokens(prompt) : 0;
}

StatusOr<RequestId> RuntimeEngineAdapter::submit(EngineRequest request) {
    if (!ready()) return failed_precondition("the engine is not loaded yet");
    ASSIGN_OR_RETURN(runtime::Request r, to_runtime(std::move(request)));
    StatusOr<runtime::RequestHandle> handle = engine_->submit(std::move(r));
    if (!handle.ok()) {
        // Past the KV cache's capacity is, for a client, past the context (400, not 413).
        if (handle.status().code() == StatusCode::kResourceExhausted) return out_of_range(handle.status().message());
        return handle.status();
    }
    std::lock_guard<std::mutex> lock(mu_);
    const RequestId id = next_id_++;
    handles_.emplace(id, std::make_shared<runtime::RequestHandle>(std::move(*handle)));
    return id;
}

bool RuntimeEngineAdapter::next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) {
    std::shared_ptr<runtime::RequestHandle> h;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = handles_.find(id);
        if (it == handles_.end()) return false;
        h = it->second;
    }
    // Only the request's own HTTP thread reads it, so waiting outside the lock is safe.
    std::optional<runtime::TokenEvent> ev = h->next(timeout);
    if (!ev) return false;
    for (;;) {
        out->push_back(convert(*ev));
        if (ev->is_final()) break;
        ev = h->next(std::chrono::milliseconds(0));
        if (!ev) break;
    }
    return true;
}

Clock::time_point RuntimeEngineAdapter::last_progress(RequestId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(id);
    return it == handles_.end() ? Clock::time_point{} : it->second->last_progress();
}

void RuntimeEngineAdapter::cancel(RequestId id) {
    std::shared_ptr<runtime::RequestHandle> h;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = handles_.find(id);
        if (it == handles_.end()) return;
        h = std::move(it->second);
        handles_.erase(it);
    }
    if (!h->done()) h->cancel();
}

EngineStats RuntimeEngineAdapter::stats() const {
    EngineStats s;
    if (!ready()) return s;
    const runtime::EngineStats r = engine_->stats();
    s.waiting_requests = r.num_waiting;
    s.running_sequences = r.num_running;
    s.kv_blocks_in_use = static_cast<int64_t>(r.num_blocks_in_use.full) + r.num_blocks_in_use.sliding;
    s.kv_blocks_total = static_cast<int64_t>(r.num_blocks.full) + r.num_blocks.sliding;
    s.spec_draft_tokens = r.num_draft_tokens;
    s.spec_accepted_tokens = r.num_accepted_tokens;
    s.kv_imported_tokens = r.num_imported_tokens;
    s.kv_imports_dropped = r.num_kv_imports_dropped;
    s.kv_exported_tokens = r.num_exported_tokens;
    return s;
}

}  // namespace gptoss::server
