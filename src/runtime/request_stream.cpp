#include "runtime/request_stream.h"

namespace gptoss::runtime {

void RequestStream::push(TokenEvent event) {
    event.time = std::chrono::steady_clock::now();
    const bool final = event.is_final();
    if (callback_) {
        callback_(event);
        std::lock_guard<std::mutex> lock(mu_);
        done_ = done_ || final;
        drained_ = done_;
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(event));
        done_ = done_ || final;
    }
    cv_.notify_all();
}

std::optional<TokenEvent> RequestStream::next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty() || drained_; })) return std::nullopt;
    if (events_.empty()) return std::nullopt;
    TokenEvent ev = std::move(events_.front());
    events_.pop_front();
    if (ev.is_final()) drained_ = true;
    return ev;
}

std::optional<TokenEvent> RequestStream::next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !events_.empty() || drained_; });
    if (events_.empty()) return std::nullopt;
    TokenEvent ev = std::move(events_.front());
    events_.pop_front();
    if (ev.is_final()) drained_ = true;
    return ev;
}

bool RequestStream::next_all(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty() || drained_; })) return false;
    if (events_.empty()) return false;
    for (TokenEvent& ev : events_) {
        if (ev.is_final()) drained_ = true;
        out->push_back(std::move(ev));
    }
    events_.clear();
    return true;
}

bool RequestStream::done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
}

bool RequestStream::drained() const {
    std::lock_guard<std::mutex> lock(mu_);
    return drained_;
}

}  // namespace gptoss::runtime
