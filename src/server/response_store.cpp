#include "server/response_store.h"

#include <unordered_set>

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

void ResponseStore::replace(const std::string& id, const StoredResponse* expected,
                            std::shared_ptr<const StoredResponse> entry) {
    const size_t bytes = entry->bytes();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(id);
    if (it == slots_.end() || it->second.entry.get() != expected) return;
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

std::shared_ptr<const void> ResponseStore::reserve(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_.count(id) != 0) return nullptr;
    std::lock_guard<std::mutex> held(reserved_->mu);
    if (!reserved_->ids.insert(id).second) return nullptr;
    class Handle {
    public:
        Handle(std::shared_ptr<Reserved> reserved, std::string id)
            : reserved_(std::move(reserved)), id_(std::move(id)) {}
        Handle(const Handle&) = delete;
        Handle& operator=(const Handle&) = delete;
        ~Handle() {
            std::lock_guard<std::mutex> lock(reserved_->mu);
            reserved_->ids.erase(id_);
        }

    private:
        const std::shared_ptr<Reserved> reserved_;
        const std::string id_;
    };
    return std::make_shared<const Handle>(reserved_, id);
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

std::unordered_map<std::string, Json> ResponseStore::find_items(const std::vector<std::string>& item_ids) {
    std::unordered_map<std::string, Json> found;
    std::unordered_set<std::string> wanted(item_ids.begin(), item_ids.end());
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::list<std::string>::iterator> used;
    auto take = [&](const Json& item) {
        if (!item.is_object()) return false;
        auto id = item.find("id");
        if (id == item.end() || !id->is_string()) return false;
        auto w = wanted.find(id->get_ref<const std::string&>());
        if (w == wanted.end()) return false;
        found.emplace(*w, item);
        wanted.erase(w);
        return true;
    };
    for (auto it = order_.begin(); it != order_.end() && !wanted.empty(); ++it) {
        const StoredResponse& e = *slots_.at(*it).entry;
        bool hit = false;
        for (const Json& item : e.context) hit |= take(item);
        // A background response's output: its run's, once done (the entry's answer is replaced a moment later).
        Json answer;
        const Json* response = &e.response;
        if (e.run) {
            if (!e.run->done())
                response = nullptr;
            else
                response = &(answer = e.run->snapshot());
        }
        if (response != nullptr)
            if (auto out = response->find("output"); out != response->end() && out->is_array())
                for (const Json& item : *out) hit |= take(item);
        if (hit) used.push_back(it);
    }
    for (auto it : used) order_.splice(order_.begin(), order_, it);
    return found;
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
