#include "server/openai_routes.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "harmony/harmony_render.h"
#include "server/disaggregation.h"
#include "server/harmony_bridge.h"

namespace gptoss::server {
namespace {

// The token events of `events` after `e` (one of them): read from the engine but never used once `e` ended the
// answer (GenerationStream::stop takes them back out of the generated-tokens count).
size_t tokens_after(const std::vector<EngineEvent>& events, const EngineEvent* e) {
    return static_cast<size_t>(
        std::count_if(e + 1, events.data() + events.size(), [](const EngineEvent& x) { return x.token_id >= 0; }));
}

constexpr std::chrono::milliseconds kPollInterval{100};

RouteResponse json_response(int status, const Json& body) {
    RouteResponse r;
    r.status = status;
    r.body = dump_json(body);
    return r;
}

ApiError timeout_error() {
    return api_error(504,
                     "the request made no progress (queued or stalled) for longer than the server's request timeout");
}
// Before the engine is warmed up its limits (context, vocabulary) are unknown: nothing is validated.
ApiError not_ready_error() { return api_error(503, "the engine is still warming up; retry shortly"); }
ApiError shutdown_error() { return api_error(503, "the server is shutting down"); }
ApiError engine_error(const std::string& message) {
    return api_error(500, "the engine failed the request: " + (message.empty() ? "unknown error" : message));
}

// The SSE body of one generation: the session's events as the engine's tokens arrive.
class SseStream final : public SseProducer {
public:
    SseStream(RequestQueue& queue, std::unique_ptr<GenerationStream> gen, std::unique_ptr<Session> session,
              std::chrono::seconds stall_timeout, std::chrono::milliseconds keepalive,
              std::function<void(const Json&)> on_done)
        : queue_(queue),
          gen_(std::move(gen)),
          session_(std::move(session)),
          stall_timeout_(stall_timeout),
          keepalive_(keepalive),
          on_done_(std::move(on_done)) {}

    bool next(std::string* out, std::chrono::milliseconds timeout) override {
        if (done_) return false;
        const size_t before = out->size();
        if (!opened_) {
            session_->open(out);
            opened_ = true;
        } else {
            events_.clear();
            if (gen_->next(&events_, timeout)) {
                last_event_ = Clock::now();
                for (const EngineEvent& e : events_) {
                    if (session_->on_event(e, out)) {
                        gen_->stop(tokens_after(events_, &e));
                        end(FinishReason::kStop, out);
                        break;
                    }
                    if (e.finish == FinishReason::kError) {
                        fail(engine_error(e.error), out);
                    } else if (e.finish == FinishReason::kCancelled) {
                        fail(shutdown_error(), out);
                    } else if (e.finish != FinishReason::kNone) {
                        end(e.finish, out);
                    }
                    if (done_) break;
                }
            } else if (queue_.shutting_down()) {
                fail(shutdown_error(), out);
            } else if (Clock::now() - std::max(last_event_, gen_->last_progress()) > stall_timeout_) {
                fail(timeout_error(), out);
            } else if (Clock::now() - last_output_ > keepalive_) {
                *out += ": keep-alive\n\n";  // an SSE comment; clients ignore it
            }
        }
        if (out->size() > before) last_output_ = Clock::now();
        return true;
    }

private:
    void end(FinishReason reason, std::string* out) {
        session_->close(reason, out);
        if (session_->sends_done()) *out += kSseDone;
        done_ = true;
        if (on_done_) on_done_(session_->body());
    }
    void fail(const ApiError& error, std::string* out) {
        session_->fail(error, out);
        if (session_->sends_done()) *out += kSseDone;
        done_ = true;
        if (on_done_) on_done_(session_->body());
    }

    RequestQueue& queue_;
    std::unique_ptr<GenerationStream> gen_;
    std::unique_ptr<Session> session_;
    const std::chrono::seconds stall_timeout_;
    const std::chrono::milliseconds keepalive_;
    const std::function<void(const Json&)> on_done_;
    std::vector<EngineEvent> events_;
    Clock::time_point last_output_ = Clock::now();
    Clock::time_point last_event_ = Clock::now();
    bool opened_ = false;
    bool done_ = false;
};

// A background response's events as an SSE body: those after a sequence number, then the rest as they come.
// Destroying it leaves the run alone (a background response outlives its client).
class RunTail final : public SseProducer {
public:
    RunTail(std::shared_ptr<const BackgroundRun> run, size_t from, std::chrono::milliseconds keepalive)
        : run_(std::move(run)), next_(from), keepalive_(keepalive) {}

    bool next(std::string* out, std::chrono::milliseconds timeout) override {
        const size_t before = out->size();
        if (!run_->events_from(next_, out, &next_, timeout)) return false;
        if (out->size() > before) {
            last_output_ = Clock::now();
        } else if (Clock::now() - last_output_ > keepalive_) {
            *out += ": keep-alive\n\n";
            last_output_ = Clock::now();
        }
        return true;
    }

private:
    std::shared_ptr<const BackgroundRun> run_;
    size_t next_;
    const std::chrono::milliseconds keepalive_;
    Clock::time_point last_output_ = Clock::now();
};

// The ids that end a request's generation: the model's own (unless ignore_eos) and the request's stop_token_ids.
// Prompt logprobs entries (a prompt token's logprob and its k best) a request may ask for, over its prompts and
// choices: the answer's JSON holds each (~0.5 KB as a tree), and the engine brings a logits row a prompt token to
// the host.
constexpr int64_t kMaxPromptLogprobEntries = 1 << 18;

Status check_prompt_logprob_entries(int64_t entries, const char* param) {
    if (entries <= kMaxPromptLogprobEntries) return ok_status();
    return invalid_argument(std::string(param) + ": the prompt's tokens × (k + 1) × choices come to " +
                            std::to_string(entries) + " logprob entries, more than " +
                            std::to_string(kMaxPromptLogprobEntries) + " (shorten the prompt, lower k or n)");
}

// vLLM's truncate_prompt_tokens: the prompt's last k tokens (-1: the context less one, leaving room for one
// generated token). True when it cut something.
bool truncate_prompt(const SamplingRequest& s, int64_t context, std::vector<int32_t>* ids) {
    if (s.truncate_prompt_tokens == 0) return false;
    const int64_t k = s.truncate_prompt_tokens < 0 ? context - 1 : s.truncate_prompt_tokens;
    if (k < 1 || static_cast<int64_t>(ids->size()) <= k) return false;
    ids->erase(ids->begin(), ids->end() - k);
    return true;
}

// vLLM's continue_final_message and add_generation_prompt (chat): a continued message takes no generation prompt
// (true with it is vLLM's 400 too); a chat reply begins with the generation prompt, so false alone is refused; a
// structured output holds a whole final message, which a continued one is not.
Status check_continuation(const ChatParams& p) {
    if (p.continue_final_message) {
        if (p.add_generation_prompt.value_or(false))
            return invalid_argument(
                "add_generation_prompt: must be false with continue_final_message (the last message is continued; no "
                "new one begins)");
        const SamplingRequest& s = p.sampling;
        if (p.grammar || s.regex || s.ebnf || s.tag)
            return invalid_argument(
                "continue_final_message: cannot be combined with a structured output (response_format, guided_*, "
                "structured_outputs), which holds a whole final message");
    } else if (p.add_generation_prompt == false) {
        return invalid_argument(
            "add_generation_prompt: false is supported with continue_final_message only (a chat reply begins with the "
            "generation prompt, <|start|>assistant)");
    }
    return ok_status();
}

// vLLM's priority: taken under --scheduling-policy priority, else only 0 (vLLM's rule).
Status set_priority(const SamplingRequest& s, bool priority_scheduling, EngineRequest* req) {
    if (s.priority != 0 && !priority_scheduling)
        return invalid_argument(
            "priority: this server schedules first come, first served (start it with --scheduling-policy priority "
            "for request priorities); only 0 is accepted");
    req->priority = s.priority;
    return ok_status();
}

// vLLM's min_tokens, at most the request's max_tokens (its own, or what the context leaves), and its bad_words
// as token sequences: each word (leading spaces stripped) as it encodes, and with a space before it when that
// encodes to as many tokens from another first token (vLLM's rule: the word inside text too).
Status set_min_tokens_and_bad_words(const SamplingRequest& s, const char* max_tokens_param,
                                    const tokenizer::BpeTokenizer& tok, EngineRequest* req) {
    if (s.min_tokens > req->max_tokens)
        return invalid_argument("min_tokens: must be at most " + std::string(max_tokens_param) + " (" +
                                std::to_string(req->max_tokens) + "), got " + std::to_string(s.min_tokens));
    req->min_tokens = s.min_tokens;
    for (const std::string& word : s.bad_words) {
        const std::string w = word.substr(std::min(word.find_first_not_of(' '), word.size()));
        if (w.empty()) continue;
        std::vector<int32_t> plain = tok.encode_ordinary(w), spaced = tok.encode_ordinary(" " + w);
        if (plain.empty()) continue;
        const bool both = !spaced.empty() && spaced.size() == plain.size() && spaced[0] != plain[0];
        req->bad_words.push_back(std::move(plain));
        if (both) req->bad_words.push_back(std::move(spaced));
    }
    return ok_status();
}

// vLLM's allowed_token_ids: the request's constraint (or none) with every mask cut to the allowed ids. Where the two
// leave nothing, the allowed ids alone (the request's explicit set wins over a structure it cannot satisfy).
class AllowedIdsConstraint : public runtime::TokenConstraint {
public:
    AllowedIdsConstraint(std::unique_ptr<runtime::TokenConstraint> inner,
                         std::shared_ptr<const std::vector<uint8_t>> set)
        : inner_(std::move(inner)), set_(std::move(set)) {}
    bool allowed_next(std::vector<uint8_t>* mask) override {
        const std::vector<uint8_t>& set = *set_;
        if (inner_ && inner_->allowed_next(mask)) {
            bool any = false;
            for (size_t i = 0; i < mask->size(); ++i) {
                (*mask)[i] = (*mask)[i] && i < set.size() && set[i];
                any |= (*mask)[i] != 0;
            }
            if (any) return true;
        }
        mask->assign(std::max(mask->size(), set.size()), 0);
        std::copy(set.begin(), set.end(), mask->begin());
        return true;
    }
    void accept(int32_t id) override {
        if (inner_) inner_->accept(id);
    }

private:
    std::unique_ptr<runtime::TokenConstraint> inner_;
    std::shared_ptr<const std::vector<uint8_t>> set_;
};

class AllowedIdsFactory : public runtime::TokenConstraintFactory {
public:
    AllowedIdsFactory(std::shared_ptr<const runtime::TokenConstraintFactory> inner,
                      std::shared_ptr<const std::vector<uint8_t>> set)
        : inner_(std::move(inner)), set_(std::move(set)) {}
    std::unique_ptr<runtime::TokenConstraint> start() const override {
        return std::make_unique<AllowedIdsConstraint>(inner_ ? inner_->start() : nullptr, set_);
    }

private:
    std::shared_ptr<const runtime::TokenConstraintFactory> inner_;
    std::shared_ptr<const std::vector<uint8_t>> set_;
};

// Wraps req->constraint when the request names allowed_token_ids (each below the model's vocabulary).
Status restrict_to_allowed_ids(const SamplingRequest& s, int vocab_size, EngineRequest* req) {
    if (s.allowed_token_ids.empty()) return ok_status();
    auto set = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(vocab_size), 0);
    for (size_t i = 0; i < s.allowed_token_ids.size(); ++i) {
        const int32_t id = s.allowed_token_ids[i];
        if (id >= vocab_size)
            return invalid_argument("allowed_token_ids[" + std::to_string(i) + "]: id " + std::to_string(id) +
                                    " is outside the vocabulary (" + std::to_string(vocab_size) + " ids)");
        (*set)[static_cast<size_t>(id)] = 1;
    }
    req->constraint = std::make_shared<AllowedIdsFactory>(std::move(req->constraint), std::move(set));
    return ok_status();
}

// The request's stop ids: the model's own, left out where its vocabulary stops below them (a test model: it can
// never draw them, and the engine refuses stop ids outside the vocabulary), and stop_token_ids, each in the
// vocabulary (else a 400 naming the entry).
Status set_stop_ids(const SamplingRequest& s, int vocab_size, EngineRequest* req) {
    std::vector<int32_t>& ids = req->stop_ids;
    ids.clear();
    if (!s.ignore_eos)
        for (int32_t id : generation_stop_ids())
            if (id < vocab_size) ids.push_back(id);
    for (size_t i = 0; i < s.stop_token_ids.size(); ++i) {
        const int32_t id = s.stop_token_ids[i];
        if (id >= vocab_size)
            return invalid_argument("stop_token_ids[" + std::to_string(i) + "]: id " + std::to_string(id) +
                                    " is outside the vocabulary (" + std::to_string(vocab_size) + " ids)");
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    return ok_status();
}

// n copies of a request for n choices; a seeded request's choice i draws with seed + i (distinct
// choices, reproducible), an unseeded one draws its own seed per choice.
std::vector<EngineRequest> choice_requests(const EngineRequest& req, int n) {
    std::vector<EngineRequest> out(static_cast<size_t>(n), req);
    for (int i = 0; i < n; ++i)
        if (req.sampling.seed)
            out[static_cast<size_t>(i)].sampling.seed = *req.sampling.seed + static_cast<uint64_t>(i);
    return out;
}

// ---- several choices in one answer (n > 1, a completions batch) ---------------------------------
// Each choice is its own engine request and Session; the answer is one body with their choices in
// order (index i), or one stream whose chunks carry their choice's index under the first choice's id,
// the usage summed (a prompt counted once however many choices it has) and one [DONE] at the end.

// Adds the integer counts of `u` into `total`, nested objects (the *_details) key by key; skips
// total_tokens (the caller recomputes it) and, unless `counts_prompt`, the prompt's counts.
void add_counts(Json& total, const Json& u, bool counts_prompt) {
    if (!u.is_object()) return;
    for (auto it = u.begin(); it != u.end(); ++it) {
        const std::string& k = it.key();
        if (k == "total_tokens" || (!counts_prompt && (k == "prompt_tokens" || k == "prompt_tokens_details"))) continue;
        if (it->is_object()) {
            if (!total.contains(k)) total[k] = Json::object();
            add_counts(total[k], *it, true);
        } else if (it->is_number_integer()) {
            total[k] = total.value(k, int64_t{0}) + it->get<int64_t>();
        }
    }
}

// Adds the token counts of `u` into `total`; prompt counts only when `counts_prompt`.
void add_usage(Json& total, const Json& u, bool counts_prompt) {
    add_counts(total, u, counts_prompt);
    total["total_tokens"] = total.value("prompt_tokens", int64_t{0}) + total.value("completion_tokens", int64_t{0});
}

// `sum`'s members in the order of `shape`'s (a choice's own usage), the rest after: the summed usage of several
// choices in one order, whichever choice's usage came first (a streamed answer's then equals the whole one's).
Json in_order_of(const Json& sum, const Json& shape) {
    Json out = Json::object();
    if (shape.is_object())
        for (auto it = shape.begin(); it != shape.end(); ++it)
            if (sum.contains(it.key())) out[it.key()] = sum[it.key()];
    for (auto it = sum.begin(); it != sum.end(); ++it)
        if (!out.contains(it.key())) out[it.key()] = it.value();
    return out;
}

struct Choice {
    std::unique_ptr<GenerationStream> gen;
    std::unique_ptr<Session> session;
    bool counts_prompt = true;  // the first choice of its prompt
    bool done = false;
};

// Runs one choice's events through its session; sets `failure` when the request failed.
void feed(Choice& c, const std::vector<EngineEvent>& events, std::string* sse, std::optional<ApiError>* failure) {
    for (const EngineEvent& e : events) {
        if (c.session->on_event(e, sse)) {
            c.gen->stop(tokens_after(events, &e));
            c.session->close(FinishReason::kStop, sse);
            c.done = true;
            return;
        }
        if (e.finish == FinishReason::kError) {
            *failure = engine_error(e.error);
            return;
        }
        if (e.finish == FinishReason::kCancelled) {
            *failure = shutdown_error();
            return;
        }
        if (e.finish != FinishReason::kNone) {
            c.session->close(e.finish, sse);
            c.done = true;
            return;
        }
    }
}

class MultiSseStream final : public SseProducer {
public:
    MultiSseStream(RequestQueue& queue, std::vector<Choice> choices, std::chrono::seconds stall_timeout,
                   std::chrono::milliseconds keepalive)
        : queue_(queue), choices_(std::move(choices)), stall_timeout_(stall_timeout), keepalive_(keepalive) {}

    bool next(std::string* out, std::chrono::milliseconds timeout) override {
        if (done_) return false;
        const size_t before = out->size();
        if (!opened_) {
            for (size_t i = 0; i < choices_.size(); ++i) {
                std::string sse;
                choices_[i].session->open(&sse);
                relabel(sse, i, out);
            }
            opened_ = true;
        } else {
            size_t live = 0;
            for (const Choice& c : choices_) live += !c.done;
            const auto wait =
                std::max(std::chrono::milliseconds(1), timeout / static_cast<int>(std::max<size_t>(live, 1)));
            bool any = false;
            for (size_t i = 0; i < choices_.size() && !done_; ++i) {
                Choice& c = choices_[i];
                if (c.done) continue;
                events_.clear();
                if (!c.gen->next(&events_, any ? std::chrono::milliseconds(0) : wait)) continue;
                any = true;
                last_event_ = Clock::now();
                std::string sse;
                std::optional<ApiError> failure;
                feed(c, events_, &sse, &failure);
                relabel(sse, i, out);
                if (failure) fail(*failure, out);
            }
            if (!done_ && std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.done; })) {
                if (usage_template_.is_object()) {
                    usage_template_["usage"] = in_order_of(usage_, usage_template_["usage"]);
                    *out += sse_event(usage_template_);
                }
                *out += kSseDone;
                done_ = true;
            } else if (!done_ && !any) {
                Clock::time_point progress = last_event_;
                for (const Choice& c : choices_) progress = std::max(progress, c.gen->last_progress());
                if (queue_.shutting_down()) {
                    fail(shutdown_error(), out);
                } else if (Clock::now() - progress > stall_timeout_) {
                    fail(timeout_error(), out);
                } else if (Clock::now() - last_output_ > keepalive_) {
                    *out += ": keep-alive\n\n";
                }
            }
        }
        if (out->size() > before) last_output_ = Clock::now();
        return true;
    }

private:
    // A choice's SSE text with its choices' index set to `index`, under the first choice's id and time;
    // usage-only chunks summed (sent once at the end), [DONE] dropped.
    void relabel(std::string_view sse, size_t index, std::string* out) {
        size_t at = 0;
        while (at < sse.size()) {
            size_t end = sse.find("\n\n", at);
            if (end == std::string_view::npos) end = sse.size();
            std::string_view event = sse.substr(at, end - at);
            at = end + 2;
            if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
            Json j = Json::parse(event.substr(6), nullptr, false);
            if (j.is_discarded() || !j.is_object() || !j.contains("choices")) {  // an error event: as it is
                *out += std::string(event) + "\n\n";
                continue;
            }
            if (id_.is_null()) {
                id_ = j.value("id", Json());
                created_ = j.value("created", Json());
            }
            j["id"] = id_;
            j["created"] = created_;
            if (j["choices"].empty() && j.contains("usage") && j["usage"].is_object()) {
                add_usage(usage_, j["usage"], choices_[index].counts_prompt);
                usage_template_ = j;
                continue;
            }
            for (Json& c : j["choices"]) c["index"] = index;
            // (Continuous usage, stream_options.continuous_usage_stats, stays the choice's own: its prompt and its
            // tokens so far, as vLLM's.)
            *out += sse_event(j);
        }
    }
    void fail(const ApiError& error, std::string* out) {
        std::string sse;
        choices_.front().session->fail(error, &sse);
        *out += sse;
        *out += kSseDone;
        done_ = true;
    }

    RequestQueue& queue_;
    std::vector<Choice> choices_;
    const std::chrono::seconds stall_timeout_;
    const std::chrono::milliseconds keepalive_;
    std::vector<EngineEvent> events_;
    Json id_, created_;
    Json usage_ = Json::object();
    Json usage_template_;
    Clock::time_point last_output_ = Clock::now();
    Clock::time_point last_event_ = Clock::now();
    bool opened_ = false;
    bool done_ = false;
};

}  // namespace

RouteResponse OpenAiRoutes::generate_many(std::vector<EngineRequest> requests,
                                          const std::function<std::unique_ptr<Session>(size_t)>& make_session,
                                          const std::vector<bool>& counts_prompt, bool stream,
                                          Clock::time_point arrival, const ClientGone& client_gone) {
    if (!stream && client_gone && client_gone())
        return error(api_error(499, "the client closed the connection", "client_closed"));
    // All or nothing: a choice refused (the in-flight limit) cancels those already submitted.
    std::vector<Choice> choices;
    for (size_t i = 0; i < requests.size(); ++i) {
        StatusOr<std::unique_ptr<GenerationStream>> submitted = queue_.submit(std::move(requests[i]), arrival);
        if (!submitted.ok()) return error(api_error(submitted.status()));
        choices.push_back(Choice{std::move(*submitted), make_session(i), counts_prompt[i], false});
    }
    if (stream) {
        RouteResponse r;
        r.content_type = "text/event-stream";
        r.stream = std::make_unique<MultiSseStream>(queue_, std::move(choices), options_.request_timeout,
                                                    options_.keepalive_interval);
        return r;
    }
    std::string unused;  // a non-streaming session writes no events
    for (Choice& c : choices) c.session->open(&unused);
    std::vector<EngineEvent> events;
    Clock::time_point last_event = arrival;
    Clock::time_point last_check = Clock::now();
    while (!std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.done; })) {
        if (client_gone && Clock::now() - last_check >= kPollInterval) {
            last_check = Clock::now();
            if (client_gone()) return error(api_error(499, "the client closed the connection", "client_closed"));
        }
        bool any = false;
        for (Choice& c : choices) {
            if (c.done) continue;
            events.clear();
            if (!c.gen->next(&events, any ? std::chrono::milliseconds(0) : std::chrono::milliseconds(10))) continue;
            any = true;
            last_event = Clock::now();
            std::optional<ApiError> failure;
            feed(c, events, &unused, &failure);
            if (failure) return error(*failure);
        }
        if (!any) {
            if (queue_.shutting_down()) return error(shutdown_error());
            Clock::time_point progress = last_event;
            for (const Choice& c : choices) progress = std::max(progress, c.gen->last_progress());
            if (Clock::now() - progress > options_.request_timeout) return error(timeout_error());
        }
    }
    Json body = choices.front().session->body();
    Json all = Json::array();
    Json usage = Json::object();
    for (size_t i = 0; i < choices.size(); ++i) {
        Json b = i == 0 ? body : choices[i].session->body();
        Json choice = b["choices"][0];
        choice["index"] = i;
        all.push_back(std::move(choice));
        add_usage(usage, b["usage"], choices[i].counts_prompt);
    }
    body["choices"] = std::move(all);
    body["usage"] = in_order_of(usage, body["usage"]);
    return json_response(200, body);
}

OpenAiRoutes::OpenAiRoutes(RequestQueue& queue, const tokenizer::BpeTokenizer& tokenizer, RoutesOptions options)
    : queue_(queue),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      created_(unix_time_now()),
      store_(options_.responses_store_entries, options_.responses_store_bytes) {}

OpenAiRoutes::~OpenAiRoutes() {
    stopping_ = true;
    std::lock_guard<std::mutex> lock(background_mu_);
    for (auto& [run, thread] : background_) thread.join();
}

RouteResponse OpenAiRoutes::error(const ApiError& error) {
    RouteResponse r;
    r.status = error.http_status;
    r.body = error_body(error);
    return r;
}

StatusOr<int64_t> OpenAiRoutes::max_tokens_for(int64_t prompt_tokens, const std::optional<int64_t>& requested,
                                               const char* prompt_param, const char* max_tokens_param) const {
    const int64_t context = queue_.engine().max_context_tokens();
    if (prompt_tokens >= context) {
        return out_of_range(std::string(prompt_param) + ": the prompt has " + std::to_string(prompt_tokens) +
                            " tokens; this model's maximum context length is " + std::to_string(context) +
                            " tokens, which leaves no room for a completion");
    }
    if (!requested) return context - prompt_tokens;
    if (*requested > context - prompt_tokens) {  // (not prompt + requested: that can overflow)
        return out_of_range(std::string(max_tokens_param) + ": this model's maximum context length is " +
                            std::to_string(context) + " tokens; you requested " + std::to_string(prompt_tokens) +
                            " in the prompt and " + std::to_string(*requested) + " for the completion");
    }
    return *requested;
}

RouteResponse OpenAiRoutes::generate(EngineRequest request,
                                     const std::function<std::unique_ptr<Session>()>& make_session, bool stream,
                                     Clock::time_point arrival, const ClientGone& client_gone,
                                     std::function<void(const Json&)> on_done) {
    // A non-streaming request asks once before it reaches the engine: that finds the connection's socket
    // while its peer is there. A socket the client has reset has no peer address left to be found by, so
    // a first question a poll interval in missed a client that reset at once, and its request ran to
    // max_tokens for nobody.
    if (!stream && client_gone && client_gone())
        return error(api_error(499, "the client closed the connection", "client_closed"));
    StatusOr<std::unique_ptr<GenerationStream>> submitted = queue_.submit(std::move(request), arrival);
    if (!submitted.ok()) return error(api_error(submitted.status()));
    std::unique_ptr<GenerationStream> gen = std::move(*submitted);
    std::unique_ptr<Session> session = make_session();

    if (stream) {
        RouteResponse r;
        r.content_type = "text/event-stream";
        r.stream = std::make_unique<SseStream>(queue_, std::move(gen), std::move(session), options_.request_timeout,
                                               options_.keepalive_interval, std::move(on_done));
        return r;
    }

    std::string unused;  // a non-streaming session writes no events
    session->open(&unused);
    std::vector<EngineEvent> events;
    FinishReason finish = FinishReason::kNone;
    Clock::time_point last_event = arrival;
    Clock::time_point last_check = Clock::now();
    while (finish == FinishReason::kNone) {
        events.clear();
        // A client that has gone away gets no answer: end here (destroying gen cancels the engine
        // request) rather than generate up to max_tokens for nobody. Asked every kPollInterval.
        if (client_gone && Clock::now() - last_check >= kPollInterval) {
            last_check = Clock::now();
            if (client_gone()) return error(api_error(499, "the client closed the connection", "client_closed"));
        }
        if (!gen->next(&events, kPollInterval)) {
            if (queue_.shutting_down()) return error(shutdown_error());
            if (Clock::now() - std::max(last_event, gen->last_progress()) > options_.request_timeout)
                return error(timeout_error());
            continue;
        }
        last_event = Clock::now();
        for (const EngineEvent& e : events) {
            if (session->on_event(e, &unused)) {
                gen->stop(tokens_after(events, &e));
                finish = FinishReason::kStop;
                break;
            }
            if (e.finish == FinishReason::kError) return error(engine_error(e.error));
            if (e.finish == FinishReason::kCancelled) return error(shutdown_error());
            finish = e.finish;
        }
    }
    session->close(finish, &unused);
    Json body = session->body();
    if (on_done) on_done(body);
    return json_response(200, body);
}

StatusOr<std::shared_ptr<const runtime::TokenConstraintFactory>> OpenAiRoutes::constraint_for(
    const std::shared_ptr<const structured::JsonGrammar>& grammar,
    const std::shared_ptr<const structured::RegexGrammar>& regex,
    const std::shared_ptr<const structured::EbnfGrammar>& ebnf,
    const std::shared_ptr<const structured::StructuralTag>& tag, const std::vector<int32_t>& forced, bool raw,
    const std::shared_ptr<const structured::ToolGrammars>& tools,
    const std::optional<std::vector<std::string>>& declared_functions) const {
    // (A forced reply start that leaves the function name open asks for one too: tool_choice "required" holds the
    // name to the declared functions'.)
    const auto leaves_name_open = [&] {
        if (forced.empty() || raw) return false;
        const StatusOr<std::string> text = tokenizer_.decode(forced);
        return text.ok() && text->ends_with("functions.");
    };
    if (!grammar && !regex && !ebnf && !tag && !tools && !leaves_name_open())
        return std::shared_ptr<const runtime::TokenConstraintFactory>{};
    std::lock_guard<std::mutex> lock(structured_mu_);
    if (!structured_) {
        StatusOr<std::shared_ptr<structured::HarmonyStructuredOutputs>> so =
            structured::HarmonyStructuredOutputs::create(tokenizer_, queue_.engine().vocab_size());
        if (!so.ok())
            return unimplemented("response_format: structured outputs are unavailable: " + so.status().message());
        structured_ = std::move(*so);
    }
    return raw ? structured_->raw_json(grammar, regex, ebnf, tag)
               : structured_->final_json(grammar, forced, tools, regex, ebnf, tag, declared_functions);
}

RouteResponse OpenAiRoutes::chat_completions(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    StatusOr<ChatParams> params = parse_chat_request(*json);
    if (!params.ok()) return error(api_error(params.status()));
    if (Status st = check_continuation(*params); !st.ok()) return error(api_error(st));
    StatusOr<ChatPrompt> prompt = render_chat_prompt(params->chat_body, tokenizer_, options_.harmony);
    if (!prompt.ok()) return error(api_error(prompt.status()));
    prompt->echo = params->echo;
    // The content is the final message alone (JSON, or the pattern's text).
    if (params->grammar || params->sampling.regex || params->sampling.ebnf || params->sampling.tag)
        prompt->mapping.preambles_to_reasoning = true;
    truncate_prompt(params->sampling, queue_.engine().max_context_tokens(), &prompt->ids);  // (as vLLM: the start)
    const int64_t n = static_cast<int64_t>(prompt->ids.size());
    StatusOr<int64_t> max_tokens =
        max_tokens_for(n, params->sampling.max_tokens, "messages",
                       params->chat_body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
    if (!max_tokens.ok()) return error(api_error(max_tokens.status()));

    EngineRequest req;
    req.prompt = prompt->ids;
    req.sampling = params->sampling.sampling;
    if (Status st = set_stop_ids(params->sampling, queue_.engine().vocab_size(), &req); !st.ok())
        return error(api_error(st));
    req.cache_salt = params->sampling.cache_salt;
    if (Status st = set_priority(params->sampling, options_.priority_scheduling, &req); !st.ok())
        return error(api_error(st));
    req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
    if (Status st = set_min_tokens_and_bad_words(params->sampling, "max_tokens", tokenizer_, &req); !st.ok())
        return error(api_error(st));
    req.top_logprobs = params->logprobs ? params->top_logprobs : -1;
    req.prompt_logprobs = params->prompt_logprobs;  // (one choice scores the prompt: the answer has one list)
    if (params->prompt_logprobs >= 0)
        if (Status st = check_prompt_logprob_entries(n * (params->prompt_logprobs + 1), "prompt_logprobs"); !st.ok())
            return error(api_error(st));
    StatusOr<std::shared_ptr<const runtime::TokenConstraintFactory>> constraint =
        constraint_for(params->grammar, params->sampling.regex, params->sampling.ebnf, params->sampling.tag,
                       prompt->forced, false, params->tool_grammars, prompt->parser.declared_functions);
    if (!constraint.ok()) return error(api_error(constraint.status()));
    req.constraint = std::move(*constraint);
    if (Status st = restrict_to_allowed_ids(params->sampling, queue_.engine().vocab_size(), &req); !st.ok())
        return error(api_error(st));
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    if (params->n > 1) {
        std::vector<EngineRequest> reqs = choice_requests(req, params->n);
        for (size_t i = 1; i < reqs.size(); ++i) reqs[i].prompt_logprobs = -1;
        std::vector<bool> counts(reqs.size(), false);
        counts[0] = true;  // one prompt, n choices: its tokens count once
        return generate_many(
            std::move(reqs), [&](size_t i) { return make_chat_session(ctx, *prompt, *params, n, i == 0); }, counts,
            params->stream, arrival, client_gone);
    }
    return generate(
        std::move(req), [&] { return make_chat_session(ctx, *prompt, *params, n); }, params->stream, arrival,
        client_gone);
}

RouteResponse OpenAiRoutes::responses(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    PreparedResponse prepared;
    if (std::optional<ApiError> e = prepare_response(body, &prepared)) return error(*e);
    Json& earlier = prepared.earlier;
    std::optional<ResponsesParams>& params = prepared.params;
    std::optional<ChatPrompt>& prompt = prepared.prompt;
    // A request_id names the response: one stored, or one another request is making, would be replaced by this one
    // in the store. The id is held from here until this response is stored (or fails).
    std::shared_ptr<const void> id_held;
    if (const std::optional<std::string>& id = params->chat.request_id; id && params->store) {
        id_held = store_.reserve(*id);
        if (!id_held)
            return error(api_error(
                invalid_argument("request_id: a stored response, or one being made, has the id '" + *id + "'")));
    }
    const int64_t n = static_cast<int64_t>(prompt->ids.size());
    StatusOr<int64_t> max_tokens = max_tokens_for(n, params->chat.sampling.max_tokens, "input", "max_output_tokens");
    if (!max_tokens.ok()) return error(api_error(max_tokens.status()));

    EngineRequest req;
    req.prompt = prompt->ids;
    req.sampling = params->chat.sampling.sampling;
    if (Status st = set_stop_ids(params->chat.sampling, queue_.engine().vocab_size(), &req); !st.ok())
        return error(api_error(st));
    req.cache_salt = params->chat.sampling.cache_salt;
    if (Status st = set_priority(params->chat.sampling, options_.priority_scheduling, &req); !st.ok())
        return error(api_error(st));
    req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
    req.top_logprobs = params->chat.logprobs ? params->chat.top_logprobs : -1;
    if (Status st = set_min_tokens_and_bad_words(params->chat.sampling, "max_output_tokens", tokenizer_, &req);
        !st.ok())
        return error(api_error(st));
    StatusOr<std::shared_ptr<const runtime::TokenConstraintFactory>> constraint = constraint_for(
        params->chat.grammar, params->chat.sampling.regex, params->chat.sampling.ebnf, params->chat.sampling.tag,
        prompt->forced, false, params->chat.tool_grammars, prompt->parser.declared_functions);
    if (!constraint.ok()) return error(api_error(constraint.status()));
    req.constraint = std::move(*constraint);
    if (Status st = restrict_to_allowed_ids(params->chat.sampling, queue_.engine().vocab_size(), &req); !st.ok())
        return error(api_error(st));
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    if (!params->store) {
        return generate(
            std::move(req), [&] { return make_responses_session(ctx, *prompt, *params, n); }, params->chat.stream,
            arrival, client_gone);
    }
    // Stored: the whole conversation, as given (a truncated request's cut applies to this run only: OpenAI's
    // input_items lists the input as sent, and a follow-up is truncated, or refused, on its own).
    StoredResponse entry;
    entry.context = prepared.untruncated ? std::move(prepared.untruncated->first) : std::move(earlier);
    entry.input_begin = entry.context.size();
    for (const Json& item : prepared.untruncated ? prepared.untruncated->second : params->input_items)
        entry.context.push_back(item);
    if (params->background) {
        // Its session always makes the stream's events: GET ...?stream=true replays them.
        ResponsesParams streamed = *params;
        streamed.chat.stream = true;
        return start_background(std::move(req), make_responses_session(ctx, *prompt, streamed, n), std::move(entry),
                                params->chat.stream, arrival);
    }
    // on_done runs once (the session closed or failed): the entry, context and all, moves into the store uncopied.
    std::function<void(const Json&)> on_done = [this, e = std::make_shared<StoredResponse>(std::move(entry)),
                                                id_held = std::move(id_held)](const Json& answer) mutable {
        if (!e) return;
        e->response = answer;
        store_.put(answer.value("id", std::string()), std::move(e));
        id_held.reset();  // stored: the store's own entry holds the id from now on
    };
    return generate(
        std::move(req), [&] { return make_responses_session(ctx, *prompt, *params, n); }, params->chat.stream, arrival,
        client_gone, std::move(on_done));
}

void OpenAiRoutes::truncate_conversation(const Json& body, Json* earlier, ResponsesParams* params,
                                         ChatPrompt* prompt) const {
    const int64_t context = queue_.engine().max_context_tokens();
    const int64_t need = params->chat.sampling.max_tokens.value_or(1);
    const auto fits = [&](const ChatPrompt& p) { return static_cast<int64_t>(p.ids.size()) + need <= context; };
    if (fits(*prompt)) return;
    // The whole conversation as items; a cut may fall only before a user message (a turn's start), so that no tool
    // result loses its call.
    Json items = *earlier;
    for (const Json& item : params->input_items) items.push_back(item);
    std::vector<size_t> cuts;
    for (size_t i = 1; i < items.size(); ++i)
        if (items[i].value("type", std::string()) == "message" && items[i].value("role", std::string()) == "user")
            cuts.push_back(i);
    // The request as if it had sent items[cut..] whole, parsed and rendered.
    const auto attempt = [&](size_t cut) -> std::optional<std::pair<ResponsesParams, ChatPrompt>> {
        Json b = body;
        b.erase("previous_response_id");
        b["input"] = Json(items.begin() + static_cast<std::ptrdiff_t>(cut), items.end());
        StatusOr<ResponsesParams> p = parse_responses_request(b, ResponsesContext{store_.enabled(), nullptr});
        if (!p.ok()) return std::nullopt;
        StatusOr<ChatPrompt> pr = render_chat_prompt(p->chat.chat_body, tokenizer_, options_.harmony);
        if (!pr.ok()) return std::nullopt;
        return std::make_pair(std::move(*p), std::move(*pr));
    };
    // The earliest cut that fits (fewer items, fewer tokens: a binary search over the cuts).
    size_t lo = 0, hi = cuts.size();
    std::optional<std::pair<ResponsesParams, ChatPrompt>> best;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        auto a = attempt(cuts[mid]);
        if (a && fits(a->second)) {
            best = std::move(a);
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if (!best) return;  // nothing fits: the context error follows, as without truncation
    const size_t cut = cuts[lo];
    const size_t before = earlier->size();
    Json kept_earlier = Json::array();
    for (size_t i = cut; i < before; ++i) kept_earlier.push_back(items[i]);
    Json kept_input = Json::array();
    for (size_t i = std::max(cut, before); i < items.size(); ++i) kept_input.push_back(items[i]);
    // The truncated request keeps the original's echo (previous_response_id, truncation) and stored-response fields.
    ResponsesParams& p = best->first;
    p.echo = params->echo;
    p.previous_response_id = params->previous_response_id;
    p.input_items = std::move(kept_input);
    *params = std::move(p);
    *prompt = std::move(best->second);
    *earlier = std::move(kept_earlier);
}

// Bounds on a request's item references: their count, and the JSON text they resolve to (the same item may be
// named many times; 4 MiB of references to a large stored item would otherwise build gigabytes).
constexpr size_t kMaxItemReferences = 1024;
constexpr size_t kMaxReferencedBytes = size_t{16} << 20;

std::optional<ApiError> OpenAiRoutes::resolve_item_references(Json* body) {
    auto input = body->find("input");
    if (input == body->end() || !input->is_array()) return std::nullopt;
    // The references, checked; then one pass over the store for all their ids.
    std::vector<size_t> at;
    std::vector<std::string> ids;
    for (size_t i = 0; i < input->size(); ++i) {
        const Json& item = (*input)[i];
        if (!item.is_object()) continue;
        auto type = item.find("type");
        // OpenAI's ItemReference: {"id", "type": "item_reference"}, its type optional and nullable (an item with
        // neither a type nor a role).
        const bool untyped = type == item.end() || type->is_null();
        const bool reference = untyped ? !item.contains("role") && item.contains("id") : *type == "item_reference";
        if (!reference) continue;
        const std::string param = "input[" + std::to_string(i) + "]";
        auto id = item.find("id");
        if (id == item.end() || id->is_null())
            return api_error(invalid_argument(param + ".id: is required (the id of a stored item)"));
        if (!id->is_string()) return api_error(invalid_argument(param + ".id: must be a string"));
        if (!store_.enabled())
            return api_error(unimplemented(param + ": item references need stored responses, and this server keeps "
                                                   "none (--responses-store 0)"));
        if (at.size() >= kMaxItemReferences)
            return api_error(invalid_argument(param + ": at most " + std::to_string(kMaxItemReferences) +
                                              " item references a request"));
        at.push_back(i);
        ids.push_back(id->get<std::string>());
    }
    if (at.empty()) return std::nullopt;
    const std::unordered_map<std::string, Json> found = store_.find_items(ids);
    // What the references become is bounded as a body is (the same item may be named many times).
    size_t bytes = 0;
    std::unordered_map<std::string, size_t> sizes;
    for (size_t k = 0; k < at.size(); ++k) {
        auto f = found.find(ids[k]);
        if (f == found.end()) {
            ApiError e = api_error(404, "Item with id '" + ids[k] + "' not found.", std::nullopt);
            e.param = "input[" + std::to_string(at[k]) + "].id";
            return e;
        }
        auto [sz, fresh] = sizes.emplace(ids[k], 0);
        if (fresh) sz->second = f->second.dump().size();
        bytes += sz->second;
        if (bytes > kMaxReferencedBytes)
            return api_error(resource_exhausted("input: the referenced items come to more than " +
                                                std::to_string(kMaxReferencedBytes >> 20) + " MiB"));
    }
    for (size_t k = 0; k < at.size(); ++k) (*input)[at[k]] = found.at(ids[k]);
    return std::nullopt;
}

std::optional<ApiError> OpenAiRoutes::previous_conversation(const Json& body, Json* earlier,
                                                            ResponsesContext* context) {
    auto prev = body.find("previous_response_id");
    if (!store_.enabled() || !body.is_object() || prev == body.end() || !prev->is_string()) return std::nullopt;
    const std::string id = prev->get<std::string>();
    std::shared_ptr<const StoredResponse> entry = store_.get(id);
    if (!entry) {
        ApiError e = api_error(404, "Previous response with id '" + id + "' not found.",
                               std::optional<std::string>("previous_response_not_found"));
        e.param = "previous_response_id";
        return e;
    }
    const Json previous = entry->current();
    const std::string status = previous.value("status", std::string());
    if (status == "queued" || status == "in_progress")
        return api_error(invalid_argument("previous_response_id: response '" + id + "' is still " + status +
                                          "; continue from it once it has finished"));
    *earlier = entry->context;
    if (previous.contains("output") && previous["output"].is_array())
        for (const Json& item : previous["output"]) earlier->push_back(item);
    context->previous_items = earlier;
    return std::nullopt;
}

std::optional<ApiError> OpenAiRoutes::prepare_response(std::string_view body, PreparedResponse* out) {
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return api_error(json.status());
    ResponsesContext context{store_.enabled(), nullptr};
    if (std::optional<ApiError> e = resolve_item_references(&*json)) return e;
    if (std::optional<ApiError> e = previous_conversation(*json, &out->earlier, &context)) return e;
    // An item id names one item of the conversation (OpenAI's 400): a repeated id made input_items' `after` paging
    // loop, and the previous response's items sent again beside previous_response_id were rendered twice.
    if (auto input = json->find("input"); input != json->end() && input->is_array()) {
        std::set<std::string> ids;
        for (const Json& item : out->earlier)
            if (item.is_object() && item.contains("id") && item["id"].is_string())
                ids.insert(item["id"].get<std::string>());
        for (size_t i = 0; i < input->size(); ++i) {
            const Json& item = (*input)[i];
            if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) continue;
            if (!ids.insert(item["id"].get<std::string>()).second) {
                ApiError e = api_error(invalid_argument(
                    "Duplicate item found with id " + item["id"].get<std::string>() +
                    (out->earlier.empty() ? "." : " (in the previous response's conversation or this input).")));
                e.param = "input[" + std::to_string(i) + "].id";
                return e;
            }
        }
    }
    StatusOr<ResponsesParams> params = parse_responses_request(*json, context);
    if (!params.ok()) return api_error(params.status());
    StatusOr<ChatPrompt> prompt = render_chat_prompt(params->chat.chat_body, tokenizer_, options_.harmony);
    if (!prompt.ok()) return api_error(responses_status(prompt.status(), *params));
    out->params = std::move(*params);
    out->prompt = std::move(*prompt);
    if (out->params->truncation_auto) {
        Json earlier = out->earlier, input = out->params->input_items;
        const size_t before = out->earlier.size() + out->params->input_items.size();
        truncate_conversation(*json, &out->earlier, &*out->params, &*out->prompt);
        if (out->earlier.size() + out->params->input_items.size() != before)
            out->untruncated.emplace(std::move(earlier), std::move(input));
    }
    const SamplingRequest& s = out->params->chat.sampling;
    if (out->params->chat.grammar || s.regex || s.ebnf || s.tag) out->prompt->mapping.preambles_to_reasoning = true;
    truncate_prompt(s, queue_.engine().max_context_tokens(), &out->prompt->ids);
    return std::nullopt;
}

RouteResponse OpenAiRoutes::responses_input_tokens(std::string_view body) {
    if (!queue_.engine().ready()) return error(not_ready_error());
    // (what POST /v1/responses would send: truncation included)
    PreparedResponse prepared;
    if (std::optional<ApiError> e = prepare_response(body, &prepared)) return error(*e);
    return json_response(200, Json{{"object", "response.input_tokens"},
                                   {"input_tokens", static_cast<int64_t>(prepared.prompt->ids.size())}});
}

RouteResponse OpenAiRoutes::start_background(EngineRequest request, std::unique_ptr<Session> session,
                                             StoredResponse entry, bool stream, Clock::time_point arrival) {
    StatusOr<std::unique_ptr<GenerationStream>> submitted = queue_.submit(std::move(request), arrival);
    if (!submitted.ok()) return error(api_error(submitted.status()));
    auto run = std::make_shared<BackgroundRun>(std::move(session));
    const Json queued = run->snapshot();
    const std::string id = queued.value("id", std::string());
    entry.response = queued;
    entry.run = run;
    auto shared = std::make_shared<StoredResponse>(std::move(entry));
    store_.put(id, shared);
    {
        std::lock_guard<std::mutex> lock(background_mu_);
        // Threads whose runs are over are joined here (and at shutdown).
        for (auto it = background_.begin(); it != background_.end();) {
            if (it->first->done()) {
                it->second.join();
                it = background_.erase(it);
            } else {
                ++it;
            }
        }
        background_.emplace_back(
            run, std::thread(&OpenAiRoutes::run_background, this, std::move(*submitted), run, std::move(shared), id));
    }
    if (!stream) return json_response(200, queued);
    RouteResponse r;
    r.content_type = "text/event-stream";
    r.stream = std::make_unique<RunTail>(run, 0, options_.keepalive_interval);
    return r;
}

void OpenAiRoutes::run_background(std::unique_ptr<GenerationStream> gen, std::shared_ptr<BackgroundRun> run,
                                  std::shared_ptr<StoredResponse> entry, std::string id) {
    // Queued until the engine works on the request (a prefill chunk or a first event: OpenAI's in_progress), not
    // while it waits behind others for a place in the batch.
    run->step([](Session& s, std::string* sse) { s.open(sse); }, nullptr, false);
    bool started = false;
    const auto start = [&] {
        if (started) return;
        started = true;
        run->step([](Session& s, std::string* sse) { s.begin(sse); }, "in_progress", false);
    };
    std::vector<EngineEvent> events;
    Clock::time_point last_event = Clock::now();
    const auto fail = [&](const ApiError& e) {
        run->step([&](Session& s, std::string* sse) { s.fail(e, sse); }, nullptr, true);
    };
    while (!run->done()) {
        if (stopping_ || queue_.shutting_down()) {
            fail(shutdown_error());
            break;
        }
        if (run->cancel_requested()) {
            gen->stop();
            run->step([](Session& s, std::string* sse) { s.cancel(sse); }, "cancelled", true);
            break;
        }
        events.clear();
        if (!gen->next(&events, std::chrono::milliseconds(50))) {
            if (gen->last_progress() != Clock::time_point{}) start();
            if (Clock::now() - std::max(last_event, gen->last_progress()) > options_.request_timeout)
                fail(timeout_error());
            continue;
        }
        start();
        last_event = Clock::now();
        bool ended = false;
        run->step(
            [&](Session& s, std::string* sse) {
                std::optional<ApiError> failure;
                bool closed = false;
                for (const EngineEvent& e : events) {
                    if (s.on_event(e, sse)) {
                        gen->stop(tokens_after(events, &e));
                        s.close(FinishReason::kStop, sse);
                        closed = true;
                        break;
                    }
                    if (e.finish == FinishReason::kError) {
                        failure = engine_error(e.error);
                    } else if (e.finish == FinishReason::kCancelled) {
                        failure = shutdown_error();
                    } else if (e.finish != FinishReason::kNone) {
                        s.close(e.finish, sse);
                        closed = true;
                    }
                    if (failure || closed) break;
                }
                if (failure) s.fail(*failure, sse);
                ended = closed || failure.has_value();
            },
            nullptr, false);
        // The session closed or failed: its body is the answer.
        if (ended) run->step([](Session&, std::string*) {}, nullptr, true);
    }
    gen.reset();  // the engine request ends here (cancelled if still running)
    // The answer replaces the queued one in the store, unless the response was deleted meanwhile (and its id maybe
    // taken by a new request's request_id: that response is left alone).
    auto final_entry = std::make_shared<StoredResponse>(*entry);
    final_entry->response = run->snapshot();
    store_.replace(id, entry.get(), std::move(final_entry));
}

namespace {

// "<id>" or "<id>/<action>" after "/v1/responses/".
std::pair<std::string, std::string> split_response_path(std::string_view path) {
    const size_t slash = path.find('/');
    if (slash == std::string_view::npos) return {std::string(path), ""};
    return {std::string(path.substr(0, slash)), std::string(path.substr(slash + 1))};
}

ApiError response_not_found(const std::string& id) {
    return api_error(404, "Response with id '" + id + "' not found.");
}

ApiError store_disabled(const std::string& method, std::string_view path) {
    return api_error(404, "this server keeps no responses (started with --responses-store 0): " + method +
                              " /v1/responses/" + std::string(path) + " has nothing to act on");
}

// One query parameter's value: absent, or its (last) value.
std::optional<std::string> query_value(const OpenAiRoutes::QueryParams& q, const char* key) {
    std::optional<std::string> v;
    for (auto [it, end] = q.equal_range(key); it != end; ++it) v = it->second;
    return v;
}

StatusOr<bool> query_bool(const OpenAiRoutes::QueryParams& q, const char* key) {
    const std::optional<std::string> v = query_value(q, key);
    if (!v || *v == "false" || *v == "0") return false;
    if (*v == "true" || *v == "1") return true;
    return invalid_argument(std::string(key) + ": must be true or false, got '" + *v + "'");
}

StatusOr<int64_t> query_int(const OpenAiRoutes::QueryParams& q, const char* key, int64_t lo, int64_t hi,
                            int64_t fallback) {
    const std::optional<std::string> v = query_value(q, key);
    if (!v) return fallback;
    int64_t x = 0;
    const char* end = v->data() + v->size();
    auto [ptr, ec] = std::from_chars(v->data(), end, x);
    if (ec != std::errc() || ptr != end || v->empty())
        return invalid_argument(std::string(key) + ": must be an integer, got '" + *v + "'");
    if (x < lo || x > hi)
        return invalid_argument(std::string(key) + ": must be between " + std::to_string(lo) + " and " +
                                std::to_string(hi) + ", got " + *v);
    return x;
}

}  // namespace

RouteResponse OpenAiRoutes::retrieve_response(std::string_view path, const QueryParams& query) {
    if (!store_.enabled()) return error(store_disabled("GET", path));
    const auto [id, action] = split_response_path(path);
    if (!action.empty() && action != "input_items")
        return error(api_error(404, "unknown route GET /v1/responses/" + std::string(path)));
    std::shared_ptr<const StoredResponse> entry = store_.get(id);
    if (!entry) return error(response_not_found(id));
    if (action == "input_items") {
        StatusOr<int64_t> limit = query_int(query, "limit", 1, 100, 20);
        if (!limit.ok()) return error(api_error(limit.status()));
        const std::string order = query_value(query, "order").value_or("desc");
        if (order != "asc" && order != "desc")
            return error(api_error(invalid_argument("order: must be 'asc' or 'desc', got '" + order + "'")));
        std::vector<const Json*> items;
        for (size_t i = entry->input_begin; i < entry->context.size(); ++i) items.push_back(&entry->context[i]);
        if (order == "desc") std::reverse(items.begin(), items.end());
        size_t begin = 0;
        if (const std::optional<std::string> after = query_value(query, "after")) {
            auto it = std::find_if(items.begin(), items.end(),
                                   [&](const Json* item) { return item->value("id", std::string()) == *after; });
            if (it == items.end())
                return error(api_error(
                    invalid_argument("after: response '" + id + "' has no input item with id '" + *after + "'")));
            begin = static_cast<size_t>(it - items.begin()) + 1;
        }
        const size_t end = std::min(items.size(), begin + static_cast<size_t>(*limit));
        Json data = Json::array();
        for (size_t i = begin; i < end; ++i) data.push_back(*items[i]);
        Json list = {{"object", "list"}, {"data", data}, {"has_more", end < items.size()}};
        list["first_id"] = data.empty() ? Json(nullptr) : data.front().value("id", Json(nullptr));
        list["last_id"] = data.empty() ? Json(nullptr) : data.back().value("id", Json(nullptr));
        return json_response(200, list);
    }
    StatusOr<bool> stream = query_bool(query, "stream");
    if (!stream.ok()) return error(api_error(stream.status()));
    StatusOr<int64_t> after = query_int(query, "starting_after", -1, INT64_MAX - 1, -1);
    if (!after.ok()) return error(api_error(after.status()));
    if (!*stream) {
        // include (the GET's query: include[]=... as OpenAI's clients send it, or include=...): with
        // reasoning.encrypted_content the reasoning items carry it, as when the request asked for it.
        bool encrypted = false;
        for (const char* key : {"include", "include[]"}) {
            for (auto [it, end] = query.equal_range(key); it != end; ++it) {
                if (!responses_include_value(it->second))
                    return error(api_error(invalid_argument("include: '" + it->second + "' is not an include value")));
                encrypted |= it->second == "reasoning.encrypted_content";
            }
        }
        Json answer = entry->current();
        if (encrypted && answer.contains("output") && answer["output"].is_array()) {
            for (Json& item : answer["output"]) {
                if (item.value("type", std::string()) != "reasoning" || item.contains("encrypted_content")) continue;
                std::string text;
                if (item.contains("content") && item["content"].is_array())
                    for (const Json& part : item["content"]) text += part.value("text", std::string());
                item["encrypted_content"] = reasoning_encrypted_content(text);
            }
        }
        return json_response(200, answer);
    }
    if (!entry->run) {
        return error(api_error(400, "stream: only a background response's events can be streamed again (response '" +
                                        id + "' was answered in its own request)"));
    }
    RouteResponse r;
    r.content_type = "text/event-stream";
    r.stream = std::make_unique<RunTail>(entry->run, static_cast<size_t>(*after + 1), options_.keepalive_interval);
    return r;
}

RouteResponse OpenAiRoutes::delete_response(std::string_view path) {
    if (!store_.enabled()) return error(store_disabled("DELETE", path));
    const auto [id, action] = split_response_path(path);
    if (!action.empty()) return error(api_error(404, "unknown route DELETE /v1/responses/" + std::string(path)));
    std::shared_ptr<const StoredResponse> entry = store_.get(id);
    if (!entry || !store_.erase(id)) return error(response_not_found(id));
    if (entry->run) entry->run->request_cancel();  // a running background response ends with its entry
    return json_response(200, Json{{"id", id}, {"object", "response"}, {"deleted", true}});
}

RouteResponse OpenAiRoutes::cancel_response(std::string_view path) {
    if (!store_.enabled()) return error(store_disabled("POST", path));
    const auto [id, action] = split_response_path(path);
    if (action != "cancel") return error(api_error(404, "unknown route POST /v1/responses/" + std::string(path)));
    std::shared_ptr<const StoredResponse> entry = store_.get(id);
    if (!entry) return error(response_not_found(id));
    if (!entry->run) {
        return error(api_error(400, "Only responses created with background set to true can be cancelled (response '" +
                                        id + "' was answered in its own request)."));
    }
    // A finished run is answered as it is (cancelling is idempotent); a running one ends at its next step.
    entry->run->request_cancel();
    entry->run->wait_done(std::chrono::seconds(10));
    return json_response(200, entry->run->snapshot());
}

RouteResponse OpenAiRoutes::completions(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    StatusOr<CompletionParams> params = parse_completion_request(*json, queue_.engine().vocab_size());
    if (!params.ok()) return error(api_error(params.status()));
    // One engine request per prompt of the batch and choice (n of each).
    std::vector<EngineRequest> reqs;
    std::vector<size_t> prompt_of;  // request -> its prompt in the batch
    std::vector<std::vector<int32_t>> prompt_ids;
    std::vector<CompletionPrompt> shown;  // what echo shows: the text as given, or the (truncated) ids
    std::vector<bool> counts;
    const bool batch = params->prompts.size() > 1;
    const int score_k = std::max(params->prompt_logprobs, params->echo ? params->logprobs : -1);
    int64_t scored_entries = 0;
    for (size_t p = 0; p < params->prompts.size(); ++p) {
        const CompletionPrompt& cp = params->prompts[p];
        const std::string param = batch ? "prompt[" + std::to_string(p) + "]" : "prompt";
        std::vector<int32_t> ids = cp.ids;
        if (cp.text) {
            // The raw interface: special-token text in the prompt is the special token (the whole
            // prompt is the caller's, so there is no chat framing to protect).
            ids = harmony::encode_all_special(tokenizer_, *cp.text);
            if (ids.empty()) return error(api_error(invalid_argument(param + ": encodes to no tokens")));
        }
        const bool truncated = truncate_prompt(params->sampling, queue_.engine().max_context_tokens(), &ids);
        shown.push_back(truncated ? CompletionPrompt{std::nullopt, ids} : cp);
        const int64_t n = static_cast<int64_t>(ids.size());
        if (score_k >= 0) {
            scored_entries += n * (score_k + 1) * params->n;
            if (Status st = check_prompt_logprob_entries(scored_entries,
                                                         params->prompt_logprobs >= 0 ? "prompt_logprobs" : "echo");
                !st.ok())
                return error(api_error(st));
        }
        StatusOr<int64_t> max_tokens = max_tokens_for(n, params->sampling.max_tokens, param.c_str(), "max_tokens");
        if (!max_tokens.ok()) return error(api_error(max_tokens.status()));
        EngineRequest req;
        req.prompt = std::move(ids);
        req.sampling = params->sampling.sampling;
        if (Status st = set_stop_ids(params->sampling, queue_.engine().vocab_size(), &req); !st.ok())
            return error(api_error(st));
        req.cache_salt = params->sampling.cache_salt;
        if (Status st = set_priority(params->sampling, options_.priority_scheduling, &req); !st.ok())
            return error(api_error(st));
        req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
        if (Status st = set_min_tokens_and_bad_words(params->sampling, "max_tokens", tokenizer_, &req); !st.ok())
            return error(api_error(st));
        req.top_logprobs = params->logprobs;
        // Prompt logprobs for vLLM's prompt_logprobs, and for the echoed prompt's entries under logprobs.
        req.prompt_logprobs = std::max(params->prompt_logprobs, params->echo ? params->logprobs : -1);
        StatusOr<std::shared_ptr<const runtime::TokenConstraintFactory>> constraint =
            constraint_for(params->sampling.grammar, params->sampling.regex, params->sampling.ebnf,
                           params->sampling.tag, {}, /*raw=*/true);
        if (!constraint.ok()) return error(api_error(constraint.status()));
        req.constraint = std::move(*constraint);
        if (Status st = restrict_to_allowed_ids(params->sampling, queue_.engine().vocab_size(), &req); !st.ok())
            return error(api_error(st));
        for (EngineRequest& r : choice_requests(req, params->n)) {
            counts.push_back(prompt_of.size() % static_cast<size_t>(params->n) == 0);  // first of its prompt
            prompt_of.push_back(p);
            reqs.push_back(std::move(r));
        }
        prompt_ids.push_back(reqs.back().prompt);
    }
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    if (reqs.size() > 1) {
        return generate_many(
            std::move(reqs),
            [&](size_t i) {
                const size_t p = prompt_of[i];
                return make_completion_session(ctx, *params, shown[p], prompt_ids[p]);
            },
            counts, params->stream, arrival, client_gone);
    }
    return generate(
        std::move(reqs[0]), [&] { return make_completion_session(ctx, *params, shown[0], prompt_ids[0]); },
        params->stream, arrival, client_gone);
}

namespace {

// An optional boolean field: `fallback` when absent or null, an error when not a boolean.
StatusOr<bool> optional_bool(const Json& body, const char* key, bool fallback) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return invalid_argument(std::string(key) + ": must be a boolean");
    return it->get<bool>();
}

// The largest id a request may name: the model's vocabulary once the engine knows it, else the tokenizer's.
int32_t id_limit(const TokenEngine& engine, const tokenizer::BpeTokenizer& tok) {
    return engine.ready() ? std::max<int32_t>(engine.vocab_size(), tok.vocab_size()) : tok.vocab_size();
}

}  // namespace

RouteResponse OpenAiRoutes::kv_prefill(std::string_view body, const ClientGone& client_gone) {
    if (!options_.kv_producer)
        return error(
            api_error(404, "this server is not a prefill worker (start it with --disaggregation-mode prefill)"));
    const Clock::time_point arrival = Clock::now();
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    const Json& j = *json;
    auto ids_it = j.find("prompt_token_ids");
    if (ids_it == j.end() || !ids_it->is_array() || ids_it->empty())
        return error(api_error(invalid_argument("prompt_token_ids: must be a non-empty array of token ids")));
    EngineRequest request;
    for (const Json& v : *ids_it) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            return error(api_error(invalid_argument("prompt_token_ids: must be a non-empty array of token ids")));
        request.prompt.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    if (!queue_.engine().ready()) return error(not_ready_error());
    // Every id, the last one too (the export computes the prompt up to its last whole block).
    for (int32_t id : request.prompt)
        if (id >= queue_.engine().vocab_size())
            return error(api_error(
                invalid_argument("prompt_token_ids: id " + std::to_string(id) + " is outside the vocabulary")));
    StatusOr<runtime::KvFormat> mine = queue_.engine().kv_format();
    if (!mine.ok()) return error(api_error(mine.status()));
    if (auto f = j.find("kv_format"); f != j.end() && !f->is_null()) {
        StatusOr<runtime::KvFormat> theirs = kv_format_from_json(*f);
        if (!theirs.ok()) return error(api_error(theirs.status()));
        if (!(*theirs == *mine))
            return error(api_error(409, "the decode worker's KV format (" + theirs->describe() +
                                            ") is not this prefill worker's (" + mine->describe() + ")"));
    }
    // The decode worker's request priority (vLLM's): scheduled by under --scheduling-policy priority, else FCFS.
    if (auto p = j.find("priority"); p != j.end() && !p->is_null()) {
        const bool in_range = p->is_number_unsigned() ? p->get<uint64_t>() <= uint64_t{INT32_MAX}
                              : p->is_number_integer()
                                  ? p->get<int64_t>() >= INT32_MIN && p->get<int64_t>() <= INT32_MAX
                                  : false;
        if (!in_range) return error(api_error(invalid_argument("priority: must be a 32-bit integer")));
        if (options_.priority_scheduling) request.priority = static_cast<int>(p->get<int64_t>());
    }
    request.max_tokens = 1;
    request.sampling.temperature = 0.0f;
    request.export_kv = true;
    StatusOr<std::unique_ptr<GenerationStream>> submitted = queue_.submit(std::move(request), arrival);
    if (!submitted.ok()) return error(api_error(submitted.status()));
    std::unique_ptr<GenerationStream> gen = std::move(*submitted);
    std::vector<EngineEvent> events;
    Clock::time_point last_check = Clock::now();
    for (;;) {
        if (client_gone && Clock::now() - last_check >= kPollInterval) {
            last_check = Clock::now();
            if (client_gone()) return error(api_error(499, "the client closed the connection", "client_closed"));
        }
        events.clear();
        if (!gen->next(&events, kPollInterval)) {
            if (queue_.shutting_down()) return error(shutdown_error());
            if (Clock::now() - std::max(arrival, gen->last_progress()) > options_.request_timeout)
                return error(timeout_error());
            continue;
        }
        for (const EngineEvent& e : events) {
            if (e.finish == FinishReason::kNone) continue;
            if (e.finish == FinishReason::kError) return error(engine_error(e.error));
            if (e.finish == FinishReason::kCancelled) return error(shutdown_error());
            if (!e.kv) return error(engine_error("the prompt's KV was not exported"));
            RouteResponse r;
            r.content_type = "application/octet-stream";
            r.body = runtime::serialize_kv_transfer_head(*e.kv);
            r.pieces = {std::string_view(reinterpret_cast<const char*>(e.kv->full.data()), e.kv->full.size()),
                        std::string_view(reinterpret_cast<const char*>(e.kv->sliding.data()), e.kv->sliding.size())};
            r.pieces_owner = e.kv;
            return r;
        }
    }
}

RouteResponse OpenAiRoutes::tokenize(std::string_view body) const {
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    const Json& j = *json;
    StatusOr<bool> add_generation_prompt = optional_bool(j, "add_generation_prompt", true);
    if (!add_generation_prompt.ok()) return error(api_error(add_generation_prompt.status()));
    StatusOr<bool> return_token_strs = optional_bool(j, "return_token_strs", false);
    if (!return_token_strs.ok()) return error(api_error(return_token_strs.status()));
    if (auto it = j.find("model"); it != j.end() && !it->is_null() && !it->is_string())
        return error(api_error(invalid_argument("model: must be a string")));
    const bool has_messages = j.contains("messages") && !j["messages"].is_null();
    const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
    if (has_messages == has_prompt)
        return error(api_error(invalid_argument("give exactly one of prompt and messages")));
    std::vector<int32_t> ids;
    if (has_prompt) {
        if (!j["prompt"].is_string()) return error(api_error(invalid_argument("prompt: must be a string")));
        // As /v1/completions encodes a text prompt: special-token text is the special token.
        ids = harmony::encode_all_special(tokenizer_, j["prompt"].get_ref<const std::string&>());
    } else {
        StatusOr<ChatParams> params = parse_chat_request(j);
        if (!params.ok()) return error(api_error(params.status()));
        if (params->continue_final_message) {
            if (Status st = check_continuation(*params); !st.ok()) return error(api_error(st));
        }
        // A continued last message is rendered open, with or without add_generation_prompt.
        if (*add_generation_prompt || params->continue_final_message) {
            StatusOr<ChatPrompt> prompt = render_chat_prompt(params->chat_body, tokenizer_, options_.harmony);
            if (!prompt.ok()) return error(api_error(prompt.status()));
            ids = std::move(prompt->ids);
        } else {
            StatusOr<harmony::ChatRequest> request =
                harmony::chat_request_from_json(params->chat_body, options_.harmony);
            if (!request.ok()) return error(api_error(request.status()));
            request->render_options.mode = harmony::RenderMode::kConversation;
            StatusOr<std::vector<int32_t>> rendered =
                harmony::render(tokenizer_, request->conversation, request->render_options);
            if (!rendered.ok()) return error(api_error(rendered.status()));
            ids = std::move(*rendered);
        }
    }
    Json strs = nullptr;
    if (*return_token_strs) {
        strs = Json::array();
        for (int32_t id : ids) strs.push_back(lossy_utf8(token_text(tokenizer_, id)));
    }
    return json_response(200, Json{{"count", ids.size()},
                                   {"max_model_len", max_model_len()},
                                   {"tokens", ids},
                                   {"token_strs", std::move(strs)}});
}

RouteResponse OpenAiRoutes::detokenize(std::string_view body) const {
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    const Json& j = *json;
    auto tokens = j.find("tokens");
    if (tokens == j.end() || tokens->is_null()) return error(api_error(invalid_argument("tokens: is required")));
    if (!tokens->is_array()) return error(api_error(invalid_argument("tokens: must be an array of token ids")));
    const int32_t limit = id_limit(queue_.engine(), tokenizer_);
    std::string bytes;
    for (size_t i = 0; i < tokens->size(); ++i) {
        const Json& t = (*tokens)[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= limit)
            return error(api_error(invalid_argument("tokens[" + std::to_string(i) + "]: must be a token id in [0, " +
                                                    std::to_string(limit) + ")")));
        bytes += token_text(tokenizer_, static_cast<int32_t>(t.get<int64_t>()));
    }
    return json_response(200, Json{{"prompt", lossy_utf8(bytes)}});
}

// The context length once known: null while the engine warms up (it is sized then).
Json OpenAiRoutes::max_model_len() const {
    return queue_.engine().ready() ? Json(queue_.engine().max_context_tokens()) : Json(nullptr);
}

RouteResponse OpenAiRoutes::models() const {
    Json model = {{"id", options_.model_id},
                  {"object", "model"},
                  {"created", created_},
                  {"owned_by", "gptoss"},
                  {"max_model_len", max_model_len()}};
    return json_response(200, Json{{"object", "list"}, {"data", Json::array({model})}});
}

RouteResponse OpenAiRoutes::model(std::string_view id) const {
    if (id != options_.model_id) {
        return error(api_error(404, "the model '" + std::string(id) + "' does not exist", "model_not_found"));
    }
    return json_response(200, Json{{"id", options_.model_id},
                                   {"object", "model"},
                                   {"created", created_},
                                   {"owned_by", "gptoss"},
                                   {"max_model_len", max_model_len()}});
}

RouteResponse OpenAiRoutes::health() const {
    if (!queue_.engine().ready()) return error(api_error(503, "the engine is still warming up"));
    if (queue_.shutting_down()) return error(shutdown_error());
    return json_response(200, Json{{"status", "ok"}});
}

RouteResponse OpenAiRoutes::metrics() const {
    RouteResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    const TokenEngine& engine = queue_.engine();
    r.body = queue_.metrics().render(engine.stats(), queue_.in_flight(), engine.ready());
    return r;
}

}  // namespace gptoss::server
