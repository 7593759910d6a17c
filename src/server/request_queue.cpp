#include "server/request_queue.h"

#include <algorithm>

namespace gptoss::server {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GenerationStream::GenerationStream(RequestQueue& queue, RequestId id, int64_t prompt_tokens, Clock::time_point arrival)
    : queue_(queue), id_(id), prompt_tokens_(prompt_tokens), arrival_(arrival), last_token_time_(arrival) {}

GenerationStream::~GenerationStream() {
    if (!released_) {
        if (!finished_) queue_.metrics_.add_cancelled(1);
        queue_.engine_.cancel(id_);
    }
    queue_.in_flight_.fetch_sub(1);
}

void GenerationStream::stop(size_t unread) {
    if (released_) return;
    const auto n = static_cast<int64_t>(std::min<size_t>(unread, static_cast<size_t>(generated_)));
    generated_ -= n;
    queue_.metrics_.add_generated_tokens(-n);
    queue_.engine_.cancel(id_);
    released_ = true;
    finished_ = true;
}

Clock::time_point GenerationStream::last_progress() const { return queue_.engine_.last_progress(id_); }

bool GenerationStream::next(std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) {
    if (finished_ || released_ || queue_.shutting_down()) return false;
    const size_t first = out->size();
    if (!queue_.engine_.next_events(id_, out, timeout)) return false;
    for (size_t i = first; i < out->size(); ++i) {
        const EngineEvent& e = (*out)[i];
        if (e.token_id >= 0) {
            const Clock::time_point t = e.time == Clock::time_point{} ? Clock::now() : e.time;
            if (generated_ == 0) {
                queue_.metrics_.observe_time_to_first_token(seconds_between(arrival_, t));
            } else {
                queue_.metrics_.observe_inter_token_latency(seconds_between(last_token_time_, t));
            }
            last_token_time_ = t;
            ++generated_;
            queue_.metrics_.add_generated_tokens(1);
        }
        if (e.finish != FinishReason::kNone) {
            finished_ = true;
            out->resize(i + 1);  // nothing follows the last event
            break;
        }
    }
    return true;
}

RequestQueue::RequestQueue(TokenEngine& engine, ServerMetrics& metrics, RequestQueueOptions options)
    : engine_(engine), metrics_(metrics), options_(options) {}

StatusOr<std::unique_ptr<GenerationStream>> RequestQueue::submit(EngineRequest request, Clock::time_point arrival) {
    if (shutting_down()) return failed_precondition("the server is shutting down");
    if (in_flight_.fetch_add(1) >= options_.max_in_flight) {
        in_flight_.fetch_sub(1);
        return failed_precondition("the server is at its limit of " + std::to_string(options_.max_in_flight) +
                                   " requests in flight; retry later");
    }
    const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
    StatusOr<RequestId> id = engine_.submit(std::move(request));
    if (!id.ok()) {
        in_flight_.fetch_sub(1);
        return id.status();
    }
    metrics_.add_prompt_tokens(prompt_tokens);
    return std::unique_ptr<GenerationStream>(new GenerationStream(*this, *id, prompt_tokens, arrival));
}

}  // namespace gptoss::server
