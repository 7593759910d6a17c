#include "server/fake_engine.h"

#include <algorithm>

namespace gptoss::server {

FakeEngine::FakeEngine(FakeEngineOptions options) : options_(options), ready_(options.ready) {
    script_ = [](const EngineRequest&) { return std::vector<int32_t>{}; };
    thread_ = std::thread([this] { loop(); });
}

FakeEngine::~FakeEngine() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
}

void FakeEngine::set_script(FakeScript script) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(script);
}

void FakeEngine::set_paused(bool paused) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        paused_ = paused;
    }
    work_cv_.notify_all();
}

void FakeEngine::set_prefill_time(std::chrono::milliseconds t) {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_time_ = t;
}

Clock::time_point FakeEngine::last_progress(RequestId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seqs_.find(id);
    return it == seqs_.end() ? Clock::time_point{} : it->second->progress;
}

void FakeEngine::fail_next_request(std::string error) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = std::move(error);
}

EngineRequest FakeEngine::last_request() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
}

int64_t FakeEngine::blocks_for(int64_t tokens) const {
    return (tokens + options_.kv_block_size - 1) / options_.kv_block_size;
}

StatusOr<RequestId> FakeEngine::submit(EngineRequest request) {
    if (request.prompt.empty()) return invalid_argument("empty prompt");
    for (int32_t id : request.prompt) {
        if (id < 0 || id >= options_.vocab_size) return invalid_argument("token id out of range");
    }
    for (int32_t id : request.stop_ids) {  // (as the real engine checks them)
        if (id < 0 || id >= options_.vocab_size)
            return invalid_argument("stop id " + std::to_string(id) + " is outside the vocabulary");
    }
    if (request.max_tokens <= 0) return invalid_argument("max_tokens must be positive");
    if (static_cast<int64_t>(request.prompt.size()) >= options_.max_context_tokens) {
        return out_of_range("prompt longer than the context");
    }
    auto seq = std::make_shared<Sequence>();
    RequestId id;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return failed_precondition("engine is shutting down");
        seq->script = script_(request);
        seq->fail_with = std::move(fail_next_);
        fail_next_.clear();
        last_request_ = request;
        seq->request = std::move(request);
        id = next_id_++;
        seqs_.emplace(id, seq);
        submitted_.fetch_add(1);
    }
    work_cv_.notify_all();
    return id;
}

bool FakeEngine::next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return false;
    std::shared_ptr<Sequence> seq = it->second;  // stays alive if cancelled meanwhile
    seq->cv.wait_for(lock, timeout, [&] { return !seq->events.empty() || stop_; });
    if (seq->events.empty()) return false;
    while (!seq->events.empty()) {
        out->push_back(std::move(seq->events.front()));
        seq->events.pop_front();
    }
    return true;
}

void FakeEngine::cancel(RequestId id) {
    std::shared_ptr<Sequence> seq;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = seqs_.find(id);
        if (it == seqs_.end()) return;
        seq = it->second;
        if (!seq->finished) cancelled_unfinished_.fetch_add(1);
        if (seq->running) {
            kv_blocks_in_use_ -= blocks_for(static_cast<int64_t>(seq->request.prompt.size() + seq->generated));
        }
        seqs_.erase(it);
    }
    seq->cv.notify_all();
    work_cv_.notify_all();
}

EngineStats FakeEngine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s;
    for (const auto& [id, seq] : seqs_) {
        if (seq->finished) continue;
        if (seq->running) {
            ++s.running_sequences;
        } else {
            ++s.waiting_requests;
        }
    }
    s.kv_blocks_in_use = kv_blocks_in_use_;
    s.kv_blocks_total = options_.kv_blocks_total;
    return s;
}

void FakeEngine::finish_locked(Sequence& s, EngineEvent event) {
    event.cached_prompt_tokens = options_.cached_prompt_tokens;
    if (s.running) {
        kv_blocks_in_use_ -= blocks_for(static_cast<int64_t>(s.request.prompt.size() + s.generated));
    }
    s.running = false;
    s.finished = true;
    event.time = Clock::now();
    s.events.push_back(std::move(event));
    s.cv.notify_all();
}

void FakeEngine::admit_locked() {
    int64_t running = 0;
    for (const auto& [id, seq] : seqs_) running += seq->running ? 1 : 0;
    for (auto& [id, seq] : seqs_) {
        if (running >= options_.max_running) break;
        if (seq->running || seq->finished) continue;
        const int64_t need = blocks_for(static_cast<int64_t>(seq->request.prompt.size()) + 1);
        if (kv_blocks_in_use_ + need > options_.kv_blocks_total) break;  // FIFO: wait for blocks
        kv_blocks_in_use_ += need;
        seq->running = true;
        seq->started = Clock::now();
        ++running;
    }
}

void FakeEngine::step_locked() {
    for (auto& [id, seq_ptr] : seqs_) {
        Sequence& s = *seq_ptr;
        if (!s.running) continue;
        if (!s.fail_with.empty()) {
            EngineEvent e;
            e.finish = FinishReason::kError;
            e.error = s.fail_with;
            finish_locked(s, std::move(e));
            continue;
        }
        s.progress = Clock::now();
        if (s.progress - s.started < prefill_time_) continue;  // still "prefilling"
        // One token a step, or several (options_.tokens_per_step: a speculative step's accepted run, delivered
        // together).
        for (int step_token = 0; step_token < options_.tokens_per_step && !s.finished; ++step_token) {
            if (s.generated >= s.script.size()) {
                EngineEvent e;
                e.finish = FinishReason::kStop;
                finish_locked(s, std::move(e));
                break;
            }
            const int64_t len_before = static_cast<int64_t>(s.request.prompt.size() + s.generated);
            EngineEvent e;
            if (s.generated == 0 && s.request.prompt_logprobs >= 0) {
                // Made-up but checkable: prompt token i scores -(i % 4) / 2 - 1/8 at rank 1 + i % 3, then the k best.
                const std::vector<int32_t>& p = s.request.prompt;
                for (size_t i = 1; i < p.size(); ++i) {
                    PromptLogprob lp{-0.5f * static_cast<float>(i % 4) - 0.125f, 1 + static_cast<int>(i % 3), {}};
                    for (int k = 0; k < s.request.prompt_logprobs; ++k)
                        lp.top.push_back({(p[i] + 1 + k) % options_.vocab_size, -0.0625f - static_cast<float>(k)});
                    e.prompt_logprobs.push_back(std::move(lp));
                }
            }
            e.token_id = s.script[s.generated++];
            if (s.request.top_logprobs >= 0) {
                e.logprob = -0.25f;
                e.top_logprobs.push_back({e.token_id, -0.25f});
                for (int k = 1; k < s.request.top_logprobs; ++k) {
                    e.top_logprobs.push_back({(e.token_id + k) % options_.vocab_size, -0.25f - static_cast<float>(k)});
                }
                if (s.request.top_logprobs == 0) e.top_logprobs.clear();
            }
            // (The real engine never draws a stop id among the first min_tokens: a scripted one does not end it.)
            const bool stop = std::find(s.request.stop_ids.begin(), s.request.stop_ids.end(), e.token_id) !=
                                  s.request.stop_ids.end() &&
                              static_cast<int>(s.generated) > s.request.min_tokens;
            const int64_t len = len_before + 1;
            kv_blocks_in_use_ += blocks_for(len) - blocks_for(len_before);
            if (stop) {
                e.finish = FinishReason::kStop;
            } else if (static_cast<int>(s.generated) >= s.request.max_tokens || len >= options_.max_context_tokens) {
                e.finish = FinishReason::kLength;
            }
            if (e.finish != FinishReason::kNone) {
                finish_locked(s, std::move(e));
            } else {
                e.time = Clock::now();
                e.cached_prompt_tokens = options_.cached_prompt_tokens;
                s.events.push_back(std::move(e));
                s.cv.notify_all();
            }
        }
    }
}

void FakeEngine::loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
        admit_locked();
        const bool has_work =
            std::any_of(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second->running; });
        if (!has_work || paused_) {
            work_cv_.wait_for(lock, std::chrono::milliseconds(50));
            continue;
        }
        step_locked();
        // Sleep outside the lock so readers and submitters are never held up by the engine.
        lock.unlock();
        std::this_thread::sleep_for(options_.step_interval);
        lock.lock();
    }
    for (auto& [id, seq] : seqs_) seq->cv.notify_all();
}

}  // namespace gptoss::server
