// The OpenAI-compatible endpoints, independent of the HTTP library: each takes the request body
// and answers with a whole body or an SSE stream that the transport pulls from. Validation errors
// become OpenAI error objects here; generation goes through the RequestQueue.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "harmony/harmony_json.h"
#include "server/openai_json.h"
#include "server/request_queue.h"
#include "server/response_store.h"
#include "server/sessions.h"
#include "structured/harmony_json.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::server {

struct RoutesOptions {
    std::string model_id = "gpt-oss";  // what /v1/models lists and responses name
    // (An unmatched tool_call_id is OpenAI's 400 here, not HARMONY.md §5.2's fallback.)
    harmony::ServerOptions harmony = [] {
        harmony::ServerOptions o;
        o.unmatched_tool_call_id_is_error = true;
        return o;
    }();
    // Chat answers carry the reasoning as `reasoning` too, beside `reasoning_content` (newer vLLM
    // and TensorRT-LLM use the former; HARMONY.md §6.5 makes it a server option).
    bool reasoning_alias = false;
    // A request (streaming or not) that gets no token for this long (queued or stalled) is ended.
    std::chrono::seconds request_timeout{600};
    // A stream that has had nothing to send for this long gets an SSE comment, so a client that
    // went away is noticed (the write fails) even while its request waits in the queue.
    std::chrono::milliseconds keepalive_interval{2000};
    // A prefill worker of disaggregated serving (server/disaggregation.h): POST /v1/kv/prefill is served.
    bool kv_producer = false;
    // The Responses API's stored responses (server/response_store.h): at most this many (0: none kept;
    // store is then answered false, previous_response_id and background refused) and about this many bytes.
    size_t responses_store_entries = 1000;
    size_t responses_store_bytes = size_t{256} << 20;
    // vLLM's --scheduling-policy priority: requests' `priority` orders the engine's queues. Off (fcfs), a nonzero
    // priority is a 400, as vLLM's.
    bool priority_scheduling = false;
};

// An SSE body pulled by the transport. Destroying it before it is complete cancels the request.
class SseProducer {
public:
    virtual ~SseProducer() = default;
    // Appends the next bytes to send (possibly none), waiting up to `timeout` for some. Returns
    // false once the stream is complete and everything was handed out.
    virtual bool next(std::string* out, std::chrono::milliseconds timeout) = 0;
};

struct RouteResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::unique_ptr<SseProducer> stream;  // set: a text/event-stream body instead of `body`
    // Non-empty: a large body sent as `body` and then these pieces as they are, not joined into one string first
    // (a KV transfer's payloads); `pieces_owner` keeps them alive until the answer is sent.
    std::vector<std::string_view> pieces;
    std::shared_ptr<const void> pieces_owner;
};

class OpenAiRoutes {
public:
    // `tokenizer` and `queue` must outlive the routes.
    OpenAiRoutes(RequestQueue& queue, const tokenizer::BpeTokenizer& tokenizer, RoutesOptions options);
    // Ends the background responses still running (failed: the server is shutting down) and waits for them.
    ~OpenAiRoutes();
    OpenAiRoutes(const OpenAiRoutes&) = delete;
    OpenAiRoutes& operator=(const OpenAiRoutes&) = delete;

    // `client_gone` (optional): whether the client has gone away; a non-streaming request asks it
    // while it waits and, when it says so, ends (the engine request is cancelled) with no answer
    // sent. (Streams notice a disconnect at their next write.)
    using ClientGone = std::function<bool()>;
    RouteResponse chat_completions(std::string_view body, const ClientGone& client_gone = {});
    RouteResponse responses(std::string_view body, const ClientGone& client_gone = {});
    // The stored responses (RoutesOptions::responses_store_entries): GET /v1/responses/{id} (the query's
    // stream=true with starting_after=N replays a background response's events after N, then follows it), DELETE
    // /v1/responses/{id}, POST /v1/responses/{id}/cancel (background responses) and GET
    // /v1/responses/{id}/input_items (after, limit, order). `path` is what follows "/v1/responses/".
    using QueryParams = std::multimap<std::string, std::string>;
    RouteResponse retrieve_response(std::string_view path, const QueryParams& query);
    RouteResponse delete_response(std::string_view path);
    // POST /v1/responses/input_tokens: {"object": "response.input_tokens", "input_tokens": N}, the prompt tokens a
    // Responses request with this body would have (previous_response_id's conversation and a forced tool call
    // included); nothing runs, nothing is stored.
    RouteResponse responses_input_tokens(std::string_view body);
    RouteResponse cancel_response(std::string_view path);
    RouteResponse completions(std::string_view body, const ClientGone& client_gone = {});
    // vLLM's /tokenize and /detokenize: {"prompt": text} (encoded as /v1/completions does) or {"messages": [...]}
    // (rendered as /v1/chat/completions does; "add_generation_prompt": false leaves off "<|start|>assistant"),
    // answered with {"count", "max_model_len", "tokens", "token_strs"}; {"tokens": [ids]} answered with
    // {"prompt": text}. Neither runs the model.
    RouteResponse tokenize(std::string_view body) const;
    RouteResponse detokenize(std::string_view body) const;
    // Disaggregated prefill (server/disaggregation.h): a prompt's KV for a decode worker, as
    // application/octet-stream; 404 unless options.kv_producer.
    RouteResponse kv_prefill(std::string_view body, const ClientGone& client_gone = {});
    RouteResponse models() const;
    RouteResponse model(std::string_view id) const;
    RouteResponse health() const;
    RouteResponse metrics() const;

    static RouteResponse error(const ApiError& error);
    const RoutesOptions& options() const { return options_; }

private:
    Json max_model_len() const;  // null while warming up
    // Checks readiness and the context, submits, and runs `session` to the end or as a stream.
    // `on_done` (optional): the session's body once it closed or failed (the Responses API stores it).
    RouteResponse generate(EngineRequest request, const std::function<std::unique_ptr<Session>()>& make_session,
                           bool stream, Clock::time_point arrival, const ClientGone& client_gone,
                           std::function<void(const Json&)> on_done = {});
    // A background response: submitted, stored as queued, generated by a thread of its own; the answer is the
    // queued response, or (stream) its events as they come (a client that leaves does not end it).
    // previous_response_id (a string, with a store): `earlier` gets that response's context and output, and
    // `context` points at it; an error for an unknown id or a response still running.
    std::optional<ApiError> previous_conversation(const Json& body, Json* earlier, ResponsesContext* context);
    // A Responses body's `input` items that refer to stored items ({"type": "item_reference", "id"}) replaced by
    // those items.
    std::optional<ApiError> resolve_item_references(Json* body);
    // A Responses body as POST /v1/responses and .../input_tokens read it: item references resolved, the previous
    // response's conversation (`earlier`) before it, parsed, rendered, and cut as it would be sent (truncation: auto,
    // truncate_prompt_tokens).
    struct PreparedResponse {
        Json earlier = Json::array();
        std::optional<ResponsesParams> params;
        std::optional<ChatPrompt> prompt;
        // With truncation "auto" and a cut made: the conversation as the request gave it (the previous response's
        // items, then its input items), which is what is stored; `earlier` and params->input_items are what ran.
        std::optional<std::pair<Json, Json>> untruncated;
    };
    std::optional<ApiError> prepare_response(std::string_view body, PreparedResponse* out);
    // truncation: "auto" (OpenAI's): when the prompt leaves less than max_output_tokens (or 1) of the context, the
    // conversation (`earlier`, then the request's input items) loses its first items, cut before a user message, the
    // fewest that make it fit; `params`, `prompt` and `earlier` become the truncated request's. Unchanged when no
    // cut fits (the context error follows).
    void truncate_conversation(const Json& body, Json* earlier, ResponsesParams* params, ChatPrompt* prompt) const;
    RouteResponse start_background(EngineRequest request, std::unique_ptr<Session> session, StoredResponse entry,
                                   bool stream, Clock::time_point arrival);
    void run_background(std::unique_ptr<GenerationStream> gen, std::shared_ptr<BackgroundRun> run,
                        std::shared_ptr<StoredResponse> entry, std::string id);
    // The same for several choices (n > 1, a completions batch): request i answered by session i; a
    // choice's prompt tokens count in the usage when counts_prompt[i].
    RouteResponse generate_many(std::vector<EngineRequest> requests,
                                const std::function<std::unique_ptr<Session>(size_t)>& make_session,
                                const std::vector<bool>& counts_prompt, bool stream, Clock::time_point arrival,
                                const ClientGone& client_gone);
    // max_tokens for the engine: the requested one if prompt + it fits the context, else an error
    // (out_of_range); by default all the context left after the prompt.
    StatusOr<int64_t> max_tokens_for(int64_t prompt_tokens, const std::optional<int64_t>& requested,
                                     const char* prompt_param, const char* max_tokens_param) const;

    // The constraint for a response format's grammar and strict functions' argument grammars (none of
    // either: no constraint): the final channel's message and the calls are held to them, `forced` (the
    // prompt's start of the reply) followed first; `raw` (completions): the whole output is.
    // `regex` / `ebnf` / `tag`: the final message's (raw: the output's) pattern, GBNF grammar or structural tag
    // instead of a JSON grammar.
    StatusOr<std::shared_ptr<const runtime::TokenConstraintFactory>> constraint_for(
        const std::shared_ptr<const structured::JsonGrammar>& grammar,
        const std::shared_ptr<const structured::RegexGrammar>& regex,
        const std::shared_ptr<const structured::EbnfGrammar>& ebnf,
        const std::shared_ptr<const structured::StructuralTag>& tag, const std::vector<int32_t>& forced,
        bool raw = false, const std::shared_ptr<const structured::ToolGrammars>& tools = nullptr,
        const std::optional<std::vector<std::string>>& declared_functions = std::nullopt) const;

    RequestQueue& queue_;
    const tokenizer::BpeTokenizer& tokenizer_;
    const RoutesOptions options_;
    const int64_t created_;
    mutable std::mutex structured_mu_;
    mutable std::shared_ptr<structured::HarmonyStructuredOutputs> structured_;  // made on first use
    ResponseStore store_;
    std::mutex background_mu_;
    std::vector<std::pair<std::shared_ptr<BackgroundRun>, std::thread>> background_;  // joined once done
    std::atomic<bool> stopping_{false};
};

}  // namespace gptoss::server
