// The Responses API's stored responses (OpenAI's store: true, its default): what GET / DELETE
// /v1/responses/{id}, .../input_items, .../cancel and a follow-up's previous_response_id act on. Kept in
// memory, at most a count and a byte budget of them; the least recently used go first. A server restart
// forgets them all (vLLM's in-memory store does the same).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "server/openai_json.h"
#include "server/sessions.h"

namespace gptoss::server {

// A background response's generation (background: true): its session (fed by the generation's thread), the
// events it has streamed (GET .../{id}?stream=true&starting_after=N replays them) and the cancel request.
// Thread-safe: the session is used under the run's lock only.
class BackgroundRun {
public:
    explicit BackgroundRun(std::unique_ptr<Session> session) : session_(std::move(session)) {}

    // The response as it stands (status queued, in_progress, then completed / incomplete / failed / cancelled).
    Json snapshot() const;
    bool done() const;
    // Appends the events from sequence number `from` on as SSE text, waiting up to `timeout` for one; `*next` is
    // the number after the last appended. False when there are none and the run is over (none will come).
    bool events_from(size_t from, std::string* out, size_t* next, std::chrono::milliseconds timeout) const;

    // The generation's side: runs f(session, sse) under the lock; the SSE text it appends becomes events (one per
    // blank-line-ended block). `status` (non-null): the run's status from now on. `done`: the run is over, its
    // answer the session's snapshot(status), or body() when status is null.
    void step(const std::function<void(Session&, std::string*)>& f, const char* status, bool done);
    void request_cancel();
    bool cancel_requested() const;
    // Waits until done() or `timeout` passes; done().
    bool wait_done(std::chrono::milliseconds timeout) const;
    size_t event_bytes() const;

private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::unique_ptr<Session> session_;
    const char* status_ = "queued";
    Json final_;                       // once done
    std::vector<std::string> events_;  // one SSE event each, index = sequence number
    size_t event_bytes_ = 0;
    bool done_ = false;
    bool cancel_ = false;
};

struct StoredResponse {
    Json response;  // the answer (a background one's final answer once it is done; until then see `run`)
    // The conversation before this response's input (a previous response's context, input and output), then
    // this request's input items: a follow-up continues from these and `response.output`.
    Json context = Json::array();
    size_t input_begin = 0;              // context[input_begin..] are this request's input items
    std::shared_ptr<BackgroundRun> run;  // background: true

    // The response now (a running background one's current state).
    Json current() const { return run ? run->snapshot() : response; }
    size_t bytes() const;
};

class ResponseStore {
public:
    // max_entries 0: keeps nothing (enabled() false).
    ResponseStore(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

    bool enabled() const { return max_entries_ > 0; }
    // Adds or replaces `id`'s entry, then drops the least recently used entries beyond the budgets (never the one
    // just put, so one answer larger than the byte budget is kept until the next, and never a background response
    // still running).
    void put(const std::string& id, std::shared_ptr<const StoredResponse> entry);
    // put() where `id`'s entry is still `expected` (a response deleted meanwhile stays deleted, and a new response
    // that took its id since is not overwritten); the entry keeps its place.
    void replace(const std::string& id, const StoredResponse* expected, std::shared_ptr<const StoredResponse> entry);
    // The entry, marked most recently used; null when there is none.
    std::shared_ptr<const StoredResponse> get(const std::string& id);
    // Holds `id` for a response being made (a request's own id, vLLM's request_id) until the returned handle is
    // dropped: null when a stored response or another held one has it. (The handle may outlive the store.)
    std::shared_ptr<const void> reserve(const std::string& id);
    bool erase(const std::string& id);
    // The items with these ids (input or output items of stored responses; a running background response's input
    // only), by id, in one pass over the store, most recently used responses first; the responses they came from
    // become the most recently used. Ids no response has are left out.
    std::unordered_map<std::string, Json> find_items(const std::vector<std::string>& item_ids);
    size_t size() const;
    size_t bytes() const;

private:
    struct Slot {
        std::shared_ptr<const StoredResponse> entry;
        size_t bytes = 0;
        std::list<std::string>::iterator order;
    };
    struct Reserved {
        std::mutex mu;
        std::unordered_set<std::string> ids;
    };
    const size_t max_entries_;
    const size_t max_bytes_;
    const std::shared_ptr<Reserved> reserved_ = std::make_shared<Reserved>();
    mutable std::mutex mu_;
    std::unordered_map<std::string, Slot> slots_;
    std::list<std::string> order_;  // most recently used first
    size_t bytes_ = 0;
};

}  // namespace gptoss::server
