#include "server/response_store.h"

#include <algorithm>
#include <utility>

namespace gptoss::server {

Json BackgroundRun::snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ ? final_ : session_->snapshot(status_);
}

bool BackgroundRun::done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
}

bool BackgroundRun::events_from(size_t from, std::string* out, size_t* next, std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return done_ || events_.size() > from; });
    for (size_t i = from; i < events_.size(); ++i) *out += events_[i];
    *next = std::max(from, events_.size());
    return !(done_ && from >= events_.size());
}

void BackgroundRun::step(const std::function<void(Session&, std::string*)>& f, const char* status, bool done) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (done_) return;
        std::string sse;
        f(*session_, &sse);
        size_t at = 0;
        while (at < sse.size()) {
            size_t end = sse.find("\n\n", at);
            end = end == std::string::npos ? sse.size() : end + 2;
            event_bytes_ += end - at;
            events_.push_back(sse.substr(at, end - at));
            at = end;
        }
        if (status != nullptr) status_ = status;
        if (done) {
            final_ = status != nullptr ? session_->snapshot(status) : session_->body();
            done_ = true;
        }
    }
    cv_.notify_all();
}

void BackgroundRun::request_cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = true;
}

bool BackgroundRun::cancel_requested() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_;
}

bool BackgroundRun::wait_done(std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
}

size_t BackgroundRun::event_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return event_bytes_;
}

size_t StoredResponse::bytes() const {
    // The JSON text's size stands for the tree's (a parsed tree takes a few times its text; the budget says so).
    size_t n = dump_json(response).size() + dump_json(context).size();
    if (run) n += run->event_bytes();
    return n;
}

void ResponseStore::put(const std::string& id, std::shared_ptr<const StoredResponse> entry) {
    if (!enabled()) return;
    const size_t bytes = entry->bytes();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(id);
    if (it != slots_.end()) {
        bytes_ -= it->second.bytes;
        order_.erase(it->second.order);
        slots_.erase(it);
    }
    order_.push_front(id);
    slots_[id] = Slot{std::move(entry), bytes, order_.begin()};
    bytes_ += bytes;
    // Victims from the least recently used on, past running background responses (they stay pollable and
    // cancellable until done; the queue's in-flight limit bounds them).
    auto victim = order_.end();
    while (order_.size() > 1 && (order_.size() > max_entries_ || bytes_ > max_bytes_)) {
        do {
            --victim;
            const StoredResponse& e = *slots_.at(*victim).entry;
            if (!e.run || e.run->done()) break;
        } while (victim != order_.begin());
        if (victim == order_.begin()) break;  // nothing evictable but the newest
        auto slot = slots_.find(*victim);
        bytes_ -= slot->second.bytes;
        slots_.erase(slot);
        victim = order_.erase(victim);
    }
}

void ResponseStore::replace(const std::string& id, std::shared_ptr<const StoredResponse> entry) {
    const size_t bytes = entry->bytes();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(id);
    if (it == slots_.end()) return;
    bytes_ = bytes_ - it->second.bytes + bytes;
    it->second.entry = std::move(entry);
    it->second.bytes = bytes;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(id);
    if (it == slots_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.order);
    return it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(id);
    if (it == slots_.end()) return false;
    bytes_ -= it->second.bytes;
    order_.erase(it->second.order);
    slots_.erase(it);
    return true;
}

std::optional<Json> ResponseStore::find_item(const std::string& item_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto has_id = [&](const Json& item) {
        auto id = item.find("id");
        return item.is_object() && id != item.end() && id->is_string() && id->get_ref<const std::string&>() == item_id;
    };
    for (const std::string& id : order_) {
        const StoredResponse& e = *slots_.at(id).entry;
        for (const Json& item : e.context)
            if (has_id(item)) return item;
        if (e.run && !e.run->done()) continue;  // (its answer is still the queued one)
        if (auto out = e.response.find("output"); out != e.response.end() && out->is_array())
            for (const Json& item : *out)
                if (has_id(item)) return item;
    }
    return std::nullopt;
}

size_t ResponseStore::size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return slots_.size();
}

size_t ResponseStore::bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
}

}  // namespace gptoss::server
