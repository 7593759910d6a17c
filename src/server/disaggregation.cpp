#include "server/disaggregation.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace gptoss::server {
namespace {

// Whether the request's prompt is worth a prefill worker's call: a whole block before its last token, more than
// min_prompt_tokens, and nothing that computes the prompt whole here anyway (prompt logprobs). A salted prompt
// (cache_salt) is computed here: the prefill worker's cache and a transfer's blocks are not salted.
bool worth_fetching(const EngineRequest& r, const runtime::KvFormat& f, int min_prompt_tokens) {
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    return !r.export_kv && !r.kv_prefix && r.cache_salt.empty() && r.prompt_logprobs < 0 && n > f.block_size &&
           n > min_prompt_tokens;
}

// Whether the local cache's `cached` tokens make a fetch not worth it: the blocks a transfer would add are at most
// `min_prompt_tokens` (the threshold short prompts have) or fewer than those already here.
bool mostly_cached(const std::vector<int32_t>& prompt, int cached, const runtime::KvFormat& f, int min_prompt_tokens) {
    if (cached <= 0 || f.block_size <= 0) return false;
    const int64_t whole = (static_cast<int64_t>(prompt.size()) - 1) / f.block_size * f.block_size;
    const int64_t fresh = whole - cached;
    return fresh <= min_prompt_tokens || fresh < cached;
}

}  // namespace

Json kv_format_to_json(const runtime::KvFormat& f) {
    Json j = Json::object();
    j["dtype"] = runtime::kv_dtype_name(f.dtype);
    j["dtype_id"] = static_cast<uint32_t>(f.dtype);
    j["num_hidden_layers"] = f.num_hidden_layers;
    j["num_key_value_heads"] = f.num_key_value_heads;
    j["head_dim"] = f.head_dim;
    j["hidden_size"] = f.hidden_size;
    j["vocab_size"] = f.vocab_size;
    j["sliding_window"] = f.sliding_window;
    j["block_size"] = f.block_size;
    j["layer_kinds"] = f.layer_kinds;
    j["bytes_per_block_full"] = f.bytes_per_block_full;
    j["bytes_per_block_sliding"] = f.bytes_per_block_sliding;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.model_id));
    j["model_id"] = hex;  // 64 bits as hex text: JSON numbers past 2^53 do not survive every parser
    return j;
}

StatusOr<runtime::KvFormat> kv_format_from_json(const Json& j) {
    if (!j.is_object()) return invalid_argument("kv_format: must be an object");
    auto number = [&](const char* key, uint64_t max, uint64_t* out) -> Status {
        auto it = j.find(key);
        // Parsed text holds non-negative integers as unsigned; a Json built in memory may hold them signed.
        const bool whole =
            it != j.end() && (it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0));
        if (!whole || it->get<uint64_t>() > max)
            return invalid_argument(std::string("kv_format.") + key + ": must be an integer in [0, " +
                                    std::to_string(max) + "]");
        *out = it->get<uint64_t>();
        return ok_status();
    };
    constexpr uint64_t kInt = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    uint64_t v[12];
    const char* keys[12] = {"dtype_id",    "num_hidden_layers",    "num_key_value_heads",     "head_dim",
                            "hidden_size", "vocab_size",           "sliding_window",          "block_size",
                            "layer_kinds", "bytes_per_block_full", "bytes_per_block_sliding", nullptr};
    for (int i = 0; i < 11; ++i)
        RETURN_IF_ERROR(number(keys[i], i >= 8 ? std::numeric_limits<uint64_t>::max() : kInt, &v[i]));
    if (v[0] < static_cast<uint64_t>(runtime::KvDtype::kF32) || v[0] > static_cast<uint64_t>(runtime::KvDtype::kE4m3))
        return invalid_argument("kv_format.dtype_id: unknown dtype " + std::to_string(v[0]));
    runtime::KvFormat f;
    f.dtype = static_cast<runtime::KvDtype>(v[0]);
    f.num_hidden_layers = static_cast<int>(v[1]);
    f.num_key_value_heads = static_cast<int>(v[2]);
    f.head_dim = static_cast<int>(v[3]);
    f.hidden_size = static_cast<int>(v[4]);
    f.vocab_size = static_cast<int>(v[5]);
    f.sliding_window = static_cast<int>(v[6]);
    f.block_size = static_cast<int>(v[7]);
    f.layer_kinds = v[8];
    f.bytes_per_block_full = v[9];
    f.bytes_per_block_sliding = v[10];
    auto id = j.find("model_id");
    if (id == j.end() || !id->is_string() || id->get_ref<const std::string&>().empty() ||
        id->get_ref<const std::string&>().size() > 16 ||
        id->get_ref<const std::string&>().find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        return invalid_argument("kv_format.model_id: must be 1 to 16 hex digits");
    f.model_id = std::stoull(id->get_ref<const std::string&>(), nullptr, 16);
    return f;
}

StatusOr<std::unique_ptr<PrefillClient>> PrefillClient::create(const std::string& url, std::chrono::seconds timeout,
                                                               std::string api_key) {
    const std::string scheme = "http://";
    if (url.rfind("https://", 0) == 0)
        return invalid_argument("--prefill-url: https is not supported (the prefill worker is a private peer): " + url);
    if (url.rfind(scheme, 0) != 0 || url.size() == scheme.size())
        return invalid_argument("--prefill-url: expected http://host:port, got '" + url + "'");
    const size_t slash = url.find('/', scheme.size());
    const std::string authority = url.substr(scheme.size(), slash == std::string::npos ? slash : slash - scheme.size());
    // user:password@ would go out in clear and be logged with every failure: the workers share --api-key instead.
    // Not printed back, since it may hold a password.
    if (authority.find('@') != std::string::npos)
        return invalid_argument(
            "--prefill-url: user info (user:password@) is not supported; give both workers the "
            "same --api-key");
    if (url.find_first_of("?# \t\r\n") != std::string::npos)
        return invalid_argument(
            "--prefill-url: expected http://host:port[/path] without a query, fragment or "
            "spaces, got '" +
            url + "'");
    // host (a name, IPv4 or [IPv6]) and an optional port in 1..65535 (httplib would take 107719 as 42183).
    std::string host = authority, port;
    if (!authority.empty() && authority[0] == '[') {
        const size_t close = authority.find(']');
        if (close == std::string::npos || (close + 1 < authority.size() && authority[close + 1] != ':'))
            return invalid_argument("--prefill-url: a bracketed IPv6 host must be [address] or [address]:port, got '" +
                                    url + "'");
        host = authority.substr(0, close + 1);
        if (close + 1 < authority.size()) {
            port = authority.substr(close + 2);
            if (port.empty()) return invalid_argument("--prefill-url: an empty port in '" + url + "'");
        }
        if (host.size() <= 2 || host.find_first_not_of("[]0123456789abcdefABCDEF:.") != std::string::npos)
            return invalid_argument("--prefill-url: not an IPv6 address: '" + host + "'");
    } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
        host = authority.substr(0, colon);
        port = authority.substr(colon + 1);
    }
    if (host.empty() || (host[0] != '[' && host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                  "0123456789.-_") != std::string::npos))
        return invalid_argument("--prefill-url: not a host name or address: '" + host + "' in '" + url + "'");
    if (authority.find(':') != std::string::npos && host[0] != '[' && port.empty())
        return invalid_argument("--prefill-url: an empty port in '" + url + "'");
    if (!port.empty()) {
        if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
            std::stoi(port) > 65535)
            return invalid_argument("--prefill-url: the port must be a number in 1..65535, got '" + port + "'");
    }
    std::unique_ptr<PrefillClient> c(new PrefillClient());
    c->scheme_host_port_ = url.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : url.substr(slash);
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    c->path_ = prefix + "/v1/kv/prefill";
    c->timeout_ = timeout;
    c->api_key_ = std::move(api_key);
    httplib::Client probe(c->scheme_host_port_);
    if (!probe.is_valid()) return invalid_argument("--prefill-url: not a usable address: '" + url + "'");
    return c;
}

void FetchCancel::on_cancel(std::function<void()> stop) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = std::move(stop);
    if (cancelled_ && stop_) stop_();
}

void FetchCancel::cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (stop_) stop_();
}

bool FetchCancel::cancelled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
}

StatusOr<std::shared_ptr<const runtime::KvTransfer>> PrefillClient::prefill(const std::vector<int32_t>& prompt,
                                                                            const runtime::KvFormat& format,
                                                                            int priority, FetchCancel* cancel) const {
    httplib::Client cli(scheme_host_port_);
    cli.set_connection_timeout(std::chrono::seconds(5));
    cli.set_read_timeout(timeout_);
    cli.set_write_timeout(std::chrono::seconds(30));
    // A cancelled request closes the connection: the prefill worker drops the prompt's work (its client is gone),
    // where the call had run on until the answer or --prefill-timeout. Unregistered before cli goes.
    struct CancelHook {
        FetchCancel* c;
        ~CancelHook() {
            if (c != nullptr) c->on_cancel(nullptr);
        }
    } hook{cancel};
    if (cancel != nullptr) {
        cancel->on_cancel([&cli] { cli.stop(); });
        if (cancel->cancelled()) return cancelled("the request was cancelled");
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) return failed_precondition("shutting down");
        active_.push_back(&cli);
    }
    struct Unregister {
        const PrefillClient* c;
        void* cli;
        ~Unregister() {
            std::lock_guard<std::mutex> lock(c->mu_);
            std::erase(c->active_, cli);
        }
    } unregister{this, &cli};
    Json body = Json::object();
    body["prompt_token_ids"] = prompt;
    body["kv_format"] = kv_format_to_json(format);
    if (priority != 0) body["priority"] = priority;
    // The largest answer a prompt of this length can have: the header, its ids and every block of both pools.
    const size_t blocks = prompt.size() / static_cast<size_t>(std::max(1, format.block_size)) + 1;
    const size_t limit = 4096 + prompt.size() * sizeof(int32_t) +
                         blocks * (format.bytes_per_block_full + format.bytes_per_block_sliding);
    // The answer is read into the transfer's own buffers as it arrives (runtime::KvTransferReader); an error
    // answer's JSON is kept, its first 512 bytes.
    runtime::KvTransferReader reader(limit);
    Status read_error;
    int status = 0;
    std::string error_body;
    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.headers = {{"Content-Type", "application/json"}};
    if (!api_key_.empty()) req.headers.emplace("Authorization", "Bearer " + api_key_);
    req.body = dump_json(body);
    req.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (status != 200) {
            error_body.append(data, std::min(n, 512 - std::min<size_t>(512, error_body.size())));
            return true;
        }
        read_error = reader.feed(data, n);
        return read_error.ok() && !(cancel != nullptr && cancel->cancelled());
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    if (!cli.send(req, res, err)) {
        if (cancel != nullptr && cancel->cancelled()) return cancelled("the request was cancelled");
        if (!read_error.ok())
            return failed_precondition("the prefill worker's answer is not a KV transfer of this prompt (at most " +
                                       std::to_string(limit) + " bytes): " + read_error.message());
        return failed_precondition("the prefill worker at " + scheme_host_port_ + " did not answer (" +
                                   httplib::to_string(err) + ")");
    }
    if (res.status != 200)
        return failed_precondition("the prefill worker answered " + std::to_string(res.status) + ": " + error_body);
    ASSIGN_OR_RETURN(runtime::KvTransfer t, reader.finish());
    RETURN_IF_ERROR(runtime::check_kv_transfer(t, format));
    return std::shared_ptr<const runtime::KvTransfer>(std::make_shared<runtime::KvTransfer>(std::move(t)));
}

void PrefillClient::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (void* c : active_) static_cast<httplib::Client*>(c)->stop();
}

DisaggregatedEngine::DisaggregatedEngine(TokenEngine& local, Fetch fetch, DisaggregationOptions options,
                                         std::function<void()> interrupt)
    : local_(local), fetch_(std::move(fetch)), options_(options), interrupt_(std::move(interrupt)) {
    for (int i = 0; i < std::max(1, options_.fetch_threads); ++i) threads_.emplace_back([this] { fetch_loop(); });
}

DisaggregatedEngine::~DisaggregatedEngine() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (interrupt_) interrupt_();
    for (std::thread& t : threads_) t.join();
    std::vector<RequestId> local;
    for (auto& [id, e] : entries_)
        if (e.local_id != 0) local.push_back(e.local_id);
    for (RequestId id : local) local_.cancel(id);
}

StatusOr<RequestId> DisaggregatedEngine::submit(EngineRequest request) {
    if (!local_.ready()) return failed_precondition("the engine is not loaded yet");
    const StatusOr<runtime::KvFormat> format = local_.kv_format();
    if (!format.ok() || !worth_fetching(request, *format, options_.min_prompt_tokens)) {
        ASSIGN_OR_RETURN(RequestId local, local_.submit(std::move(request)));
        std::lock_guard<std::mutex> lock(mu_);
        const RequestId id = next_id_++;
        entries_[id].local_id = local;
        return id;
    }
    RETURN_IF_ERROR(local_.validate(request));
    RequestId id = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return failed_precondition("the server is shutting down");
        id = next_id_++;
        Entry& e = entries_[id];
        const int priority = request.priority;
        e.request = std::move(request);
        e.since = Clock::now();
        // (priority, arrival) order: after every queued job of this priority or a lower value.
        auto at = std::find_if(jobs_.begin(), jobs_.end(), [&](RequestId j) {
            auto it = entries_.find(j);
            return it != entries_.end() && it->second.request.priority > priority;
        });
        jobs_.insert(at, id);
    }
    cv_.notify_all();
    return id;
}

void DisaggregatedEngine::fetch_loop() {
    for (;;) {
        RequestId id = 0;
        std::vector<int32_t> prompt;
        int priority = 0;
        auto fetch_cancel = std::make_shared<FetchCancel>();
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
            if (stopping_) return;
            id = jobs_.front();
            jobs_.pop_front();
            auto it = entries_.find(id);
            if (it == entries_.end()) continue;  // cancelled while queued
            prompt = it->second.request.prompt;
            priority = it->second.request.priority;
            it->second.since = Clock::now();
            it->second.fetch_cancel = fetch_cancel;
        }
        const StatusOr<runtime::KvFormat> format = local_.kv_format();
        // A prompt mostly in the local prefix cache already (the next turn of a conversation this worker decoded)
        // is computed here: a transfer would carry every block again for a few new ones.
        const bool skip = format.ok() && mostly_cached(prompt, local_.cached_prompt_tokens(prompt), *format,
                                                       options_.min_prompt_tokens);
        const Clock::time_point fetch_start = Clock::now();
        StatusOr<std::shared_ptr<const runtime::KvTransfer>> kv =
            skip          ? failed_precondition("the local prefix cache holds most of it")
            : format.ok() ? fetch_(prompt, *format, priority, *fetch_cancel)
                          : StatusOr<std::shared_ptr<const runtime::KvTransfer>>(format.status());
        const double fetch_seconds = std::chrono::duration<double>(Clock::now() - fetch_start).count();
        EngineRequest request;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = entries_.find(id);
            if (it == entries_.end() || stopping_) continue;  // cancelled during the fetch
            it->second.fetch_cancel.reset();
            request = std::move(it->second.request);
        }
        // Submitted outside the lock (the transfer's checks take time proportional to it).
        StatusOr<RequestId> local = failed_precondition("not submitted");
        if (kv.ok()) {
            EngineRequest with = request;
            with.kv_prefix = *kv;
            local = local_.submit(std::move(with));
        }
        bool fetched = local.ok();
        if (!local.ok()) {  // no KV, or the local engine refused it: compute the prompt here
            const Status why = kv.ok() ? local.status() : kv.status();
            if (!skip)
                std::fprintf(stderr, "[serve] prefill worker not used for a %zu-token prompt: %s\n", prompt.size(),
                             why.to_string().c_str());
            local = local_.submit(std::move(request));
        }
        RequestId orphan = 0;
        {
            std::lock_guard<std::mutex> lock(mu_);
            ++(fetched ? fetched_ : skip ? skipped_ : fetch_failures_);
            if (fetched) {
                fetch_seconds_ += fetch_seconds;
                fetched_bytes_ += static_cast<int64_t>((*kv)->full.size() + (*kv)->sliding.size());
            }
            auto it = entries_.find(id);
            if (it == entries_.end()) {  // cancelled while it was being submitted
                if (local.ok()) orphan = *local;
            } else if (local.ok()) {
                it->second.local_id = *local;
            } else {
                it->second.error = local.status().to_string();
            }
        }
        if (orphan != 0) local_.cancel(orphan);
        cv_.notify_all();
    }
}

bool DisaggregatedEngine::next_events(RequestId id, std::vector<EngineEvent>* out, std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    RequestId local = 0;
    {
        std::unique_lock<std::mutex> lock(mu_);
        auto settled = [&] {
            auto it = entries_.find(id);
            return stopping_ || it == entries_.end() || it->second.local_id != 0 || !it->second.error.empty();
        };
        if (!cv_.wait_until(lock, deadline, settled)) return false;
        auto it = entries_.find(id);
        if (it == entries_.end()) return false;
        if (!it->second.error.empty()) {
            EngineEvent ev;
            ev.finish = FinishReason::kError;
            ev.error = std::move(it->second.error);
            ev.time = Clock::now();
            out->push_back(std::move(ev));
            it->second.error.clear();
            it->second.local_id = std::numeric_limits<RequestId>::max();  // done: nothing follows
            return true;
        }
        local = it->second.local_id;
    }
    if (local == 0 || local == std::numeric_limits<RequestId>::max()) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return local_.next_events(local, out, std::max(left, std::chrono::milliseconds(0)));
}

void DisaggregatedEngine::cancel(RequestId id) {
    RequestId local = 0;
    std::shared_ptr<FetchCancel> fetch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(id);
        if (it == entries_.end()) return;
        local = it->second.local_id;
        fetch = std::move(it->second.fetch_cancel);
        entries_.erase(it);
    }
    if (fetch) fetch->cancel();  // its connection closes: the prefill worker drops the prompt's work
    cv_.notify_all();
    if (local != 0 && local != std::numeric_limits<RequestId>::max()) local_.cancel(local);
}

Clock::time_point DisaggregatedEngine::last_progress(RequestId id) const {
    RequestId local = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(id);
        if (it == entries_.end()) return {};
        // Queued for a fetch thread, or with the prefill worker: progress as of then (the server's request
        // timeout ends a request that waits longer).
        if (it->second.local_id == 0) return it->second.since;
        local = it->second.local_id;
    }
    return local == std::numeric_limits<RequestId>::max() ? Clock::time_point{} : local_.last_progress(local);
}

EngineStats DisaggregatedEngine::stats() const {
    EngineStats s = local_.stats();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : entries_)
        if (e.local_id == 0 && e.error.empty()) ++s.waiting_requests;
    s.remote_prefills = fetched_;
    s.remote_prefill_failures = fetch_failures_;
    s.remote_prefills_skipped = skipped_;
    s.remote_prefill_seconds = fetch_seconds_;
    s.remote_prefill_bytes = fetched_bytes_;
    return s;
}

}  // namespace gptoss::server
