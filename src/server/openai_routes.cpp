#include "server/openai_routes.h"

#include "server/harmony_bridge.h"

namespace gptoss::server {
namespace {

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
              std::chrono::seconds stall_timeout, std::chrono::milliseconds keepalive)
        : queue_(queue),
          gen_(std::move(gen)),
          session_(std::move(session)),
          stall_timeout_(stall_timeout),
          keepalive_(keepalive) {}

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
                        gen_->stop();
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
    }
    void fail(const ApiError& error, std::string* out) {
        session_->fail(error, out);
        if (session_->sends_done()) *out += kSseDone;
        done_ = true;
    }

    RequestQueue& queue_;
    std::unique_ptr<GenerationStream> gen_;
    std::unique_ptr<Session> session_;
    const std::chrono::seconds stall_timeout_;
    const std::chrono::milliseconds keepalive_;
    std::vector<EngineEvent> events_;
    Clock::time_point last_output_ = Clock::now();
    Clock::time_point last_event_ = Clock::now();
    bool opened_ = false;
    bool done_ = false;
};

}  // namespace

OpenAiRoutes::OpenAiRoutes(RequestQueue& queue, const tokenizer::BpeTokenizer& tokenizer, RoutesOptions options)
    : queue_(queue), tokenizer_(tokenizer), options_(std::move(options)), created_(unix_time_now()) {}

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
                                     Clock::time_point arrival, const ClientGone& client_gone) {
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
                                               options_.keepalive_interval);
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
                gen->stop();
                finish = FinishReason::kStop;
                break;
            }
            if (e.finish == FinishReason::kError) return error(engine_error(e.error));
            if (e.finish == FinishReason::kCancelled) return error(shutdown_error());
            finish = e.finish;
        }
    }
    session->close(finish, &unused);
    return json_response(200, session->body());
}

RouteResponse OpenAiRoutes::chat_completions(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    StatusOr<ChatParams> params = parse_chat_request(*json);
    if (!params.ok()) return error(api_error(params.status()));
    StatusOr<ChatPrompt> prompt = render_chat_prompt(params->chat_body, tokenizer_, options_.harmony);
    if (!prompt.ok()) return error(api_error(prompt.status()));
    const int64_t n = static_cast<int64_t>(prompt->ids.size());
    StatusOr<int64_t> max_tokens =
        max_tokens_for(n, params->sampling.max_tokens, "messages",
                       params->chat_body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
    if (!max_tokens.ok()) return error(api_error(max_tokens.status()));

    EngineRequest req;
    req.prompt = prompt->ids;
    req.sampling = params->sampling.sampling;
    req.stop_ids = generation_stop_ids();
    req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
    req.top_logprobs = params->logprobs ? params->top_logprobs : -1;
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    return generate(
        std::move(req), [&] { return make_chat_session(ctx, *prompt, *params, n); }, params->stream, arrival,
        client_gone);
}

RouteResponse OpenAiRoutes::responses(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    StatusOr<ResponsesParams> params = parse_responses_request(*json);
    if (!params.ok()) return error(api_error(params.status()));
    StatusOr<ChatPrompt> prompt = render_chat_prompt(params->chat.chat_body, tokenizer_, options_.harmony);
    if (!prompt.ok()) return error(api_error(responses_status(prompt.status(), *params)));
    const int64_t n = static_cast<int64_t>(prompt->ids.size());
    StatusOr<int64_t> max_tokens = max_tokens_for(n, params->chat.sampling.max_tokens, "input", "max_output_tokens");
    if (!max_tokens.ok()) return error(api_error(max_tokens.status()));

    EngineRequest req;
    req.prompt = prompt->ids;
    req.sampling = params->chat.sampling.sampling;
    req.stop_ids = generation_stop_ids();
    req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    return generate(
        std::move(req), [&] { return make_responses_session(ctx, *prompt, *params, n); }, params->chat.stream, arrival,
        client_gone);
}

RouteResponse OpenAiRoutes::completions(std::string_view body, const ClientGone& client_gone) {
    const Clock::time_point arrival = Clock::now();
    if (!queue_.engine().ready()) return error(not_ready_error());
    StatusOr<Json> json = parse_json_body(body);
    if (!json.ok()) return error(api_error(json.status()));
    StatusOr<CompletionParams> params = parse_completion_request(*json, queue_.engine().vocab_size());
    if (!params.ok()) return error(api_error(params.status()));
    std::vector<int32_t> ids = params->prompt_ids;
    if (params->prompt_text) {
        // The raw interface: special-token text in the prompt is the special token (the whole
        // prompt is the caller's, so there is no chat framing to protect).
        ids = tokenizer_.encode(*params->prompt_text, {}, /*allow_all_special=*/true);
        if (ids.empty()) return error(api_error(invalid_argument("prompt: encodes to no tokens")));
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    StatusOr<int64_t> max_tokens = max_tokens_for(n, params->sampling.max_tokens, "prompt", "max_tokens");
    if (!max_tokens.ok()) return error(api_error(max_tokens.status()));

    EngineRequest req;
    req.prompt = std::move(ids);
    req.sampling = params->sampling.sampling;
    req.stop_ids = generation_stop_ids();
    req.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, INT32_MAX));
    req.top_logprobs = params->logprobs;
    SessionContext ctx{&tokenizer_, options_.model_id, options_.reasoning_alias};
    return generate(
        std::move(req), [&] { return make_completion_session(ctx, *params, n); }, params->stream, arrival, client_gone);
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
