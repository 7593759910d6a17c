// The OpenAI wire format: request bodies -> validated internal structs, and the JSON shapes of
// responses, stream chunks and errors. No I/O and no engine here; every nlohmann exception is
// caught in this layer (bad input gives a Status, never a throw).
//
// Error convention: a Status about one request field has the message "<param>: <text>", e.g.
// "messages[2].role: unknown role 'robot'"; api_error() turns that into the OpenAI error object
// with "param" set. harmony/'s adapters name fields the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_shape.h"
#include "core/status.h"
#include "harmony/harmony_types.h"
#include "runtime/sampler.h"

#include "structured/harmony_json.h"

namespace gptoss::server {

using Json = harmony::Json;  // insertion-ordered: tool schemas keep their order

inline constexpr int kMaxJsonDepth = 64;  // deeper request bodies are refused (bounded recursion)
// Request bodies with an object of more members are refused (the insertion-ordered parser's cost is
// quadratic in an object's members: 4,096 take ~10 ms); logit_bias is the one field that could want
// more.
inline constexpr int kMaxJsonMembers = 4096;

using gptoss::json_shape_error;  // core/json_shape.h
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxTopLogprobs = 20;

// ---- errors -------------------------------------------------------------------------------------

// The one place where Status codes become HTTP statuses.
int http_status_for(StatusCode code);

struct ApiError {
    int http_status = 500;
    std::string message;
    std::string type;  // "invalid_request_error", "not_found_error", "server_error", ...
    std::optional<std::string> param;
    std::optional<std::string> code;
};
ApiError api_error(const Status& status);
ApiError api_error(int http_status, std::string message, std::optional<std::string> code = std::nullopt);
// {"error":{"message","type","param","code"}}
Json error_json(const ApiError& error);
std::string error_body(const ApiError& error);

// ---- parsing ------------------------------------------------------------------------------------

// Parses a request body: must be a JSON object of valid UTF-8, nested at most kMaxJsonDepth deep,
// no object with more than kMaxJsonMembers members.
StatusOr<Json> parse_json_body(std::string_view body);

struct SamplingRequest {
    runtime::SamplingParams sampling;
    // vLLM's cache_salt (a non-empty string): cached prompt blocks are shared only with requests of the same salt.
    std::string cache_salt;
    int priority = 0;  // vLLM's (runtime::Request::priority); nonzero needs RoutesOptions::priority_scheduling
    std::optional<int64_t> max_tokens;  // nullopt: up to the context
    std::vector<std::string> stop;      // stop strings (matched on user-visible text)
    // vLLM's extensions: more ids that end generation (the one that does is not shown, as vLLM's detokenizer
    // drops it), and generation past the model's own stop ids (<|return|>, <|call|>, <|endoftext|>).
    std::vector<int32_t> stop_token_ids;
    bool ignore_eos = false;
    int min_tokens = 0;             // vLLM's: no stop id or stop string ends generation within the first min_tokens
    bool include_stop_str = false;  // vLLM's include_stop_str_in_output: the matched stop string is shown
    std::vector<std::string> bad_words;  // vLLM's: words never generated (their last token banned after the rest)
    // vLLM's allowed_token_ids: only these ids are ever drawn (within a structured output's mask too).
    std::vector<int32_t> allowed_token_ids;
    // vLLM's truncate_prompt_tokens: keep only the prompt's last k tokens (-1: the context less one); 0: off.
    int64_t truncate_prompt_tokens = 0;
    // vLLM's guided_json / guided_json_object / structured_outputs: what the output must match (chat: its
    // final message; completions: the whole text); null: free.
    std::shared_ptr<const structured::JsonGrammar> grammar;
    // vLLM's guided_regex / guided_choice / structured_outputs regex, choice (no grammar then).
    std::shared_ptr<const structured::RegexGrammar> regex;
    // vLLM's guided_grammar / structured_outputs grammar, llama.cpp's grammar: GBNF (no grammar or regex then).
    std::shared_ptr<const structured::EbnfGrammar> ebnf;
    // vLLM's structured_outputs structural_tag and chat's response_format {"type": "structural_tag"} (none of the
    // above then): structured/structural_tag.h.
    std::shared_ptr<const structured::StructuralTag> tag;
    // vLLM's structured_outputs disable_any_whitespace: a JSON output (guided_json, structured_outputs json /
    // json_object, chat's response_format) has no whitespace between its tokens.
    bool disable_any_whitespace = false;
};

struct ChatParams {
    Json chat_body;  // the request, passed on to harmony's chat adapter (or built from a Responses body)
    int n = 1;       // choices (each its own engine request; a seed s gives choice i the seed s + i)
    SamplingRequest sampling;
    bool logprobs = false;
    int top_logprobs = 0;
    // vLLM's return_tokens_as_token_ids: logprob entries name tokens "token_id:<id>" (bytes: of that text).
    bool tokens_as_ids = false;
    // vLLM's include_reasoning (chat): false leaves reasoning_content out of the answer and its stream.
    bool include_reasoning = true;
    int prompt_logprobs = -1;  // vLLM's (chat only): -1 none; k: each prompt token's logprob, rank and the k best
    // vLLM's return_token_ids (chat): the answer's prompt_token_ids and each choice's token_ids (every token drawn,
    // the one that ended generation included); streamed, prompt_token_ids in the first chunk, token_ids in each.
    bool return_token_ids = false;
    // vLLM's continue_final_message (chat): the last message, the assistant's, is continued rather than answered
    // (harmony::OpenMessage); its add_generation_prompt (given or not); its echo: a continued message's text so far
    // is part of the answer.
    bool continue_final_message = false;
    std::optional<bool> add_generation_prompt;
    bool echo = false;
    bool stream = false;
    bool include_usage = false;
    bool continuous_usage = false;  // vLLM's stream_options.continuous_usage_stats (with include_usage)
    // vLLM's request_id: the answer's id is "chatcmpl-<request_id>" (chat) or "cmpl-<request_id>" (completions).
    std::optional<std::string> request_id;
    // response_format (chat) / text.format (responses) json_object or json_schema: what the final
    // message must match; null for plain text.
    std::shared_ptr<const structured::JsonGrammar> grammar;
    // Functions declared strict: true, by name: their calls' arguments are held to their parameters.
    std::shared_ptr<const structured::ToolGrammars> tool_grammars;
};
StatusOr<ChatParams> parse_chat_request(const Json& body);

// A Responses request, translated into the chat.completions form that harmony's adapter takes
// (HARMONY.md §5.3), plus what the response object echoes back.
struct ResponsesParams {
    ChatParams chat;
    Json echo;  // instructions, tools, tool_choice, temperature, top_p, max_output_tokens, reasoning, ...
    // The Responses field each chat message came from ("instructions", "input", "input[3]"), by
    // message index: errors found in the chat form (rendering) name the caller's field.
    std::vector<std::string> message_params;
    // The stored-response fields (server/response_store.h).
    std::optional<std::string> previous_response_id;
    bool store = false;  // the answer is kept (the server keeps responses and the request did not say store: false)
    bool background = false;  // answered at once, generated in the background (needs store)
    // This request's input as Responses items (a string input as one user message item), each with an id: what
    // GET /v1/responses/{id}/input_items lists, and with the items before it and the output, what a follow-up's
    // previous_response_id continues from.
    Json input_items = Json::array();
    // include: ["reasoning.encrypted_content"]: reasoning items carry their text as encrypted_content too.
    bool include_encrypted_reasoning = false;
    // truncation: "auto": a conversation over the context loses its first turns (OpenAiRoutes::responses).
    bool truncation_auto = false;
};
// What a Responses request is parsed against: whether the server keeps responses, and for a request with
// previous_response_id the conversation items it continues (that response's context: its earlier items, its input
// and its output; instructions are not carried over, as OpenAI's).
struct ResponsesContext {
    bool store_enabled = false;
    const Json* previous_items = nullptr;
};
StatusOr<ResponsesParams> parse_responses_request(const Json& body, const ResponsesContext& context = {});
// `status` with a chat message's param ("messages[i]...") renamed to its Responses field
// (message_params; a tool message's tool_call_id is its item's call_id).
Status responses_status(const Status& status, const ResponsesParams& params);

// Choices one request may ask for: n × the prompts of a completions batch (each is an engine request).
inline constexpr int kMaxChoices = 128;

struct CompletionPrompt {
    std::optional<std::string> text;  // exactly one of text / ids
    std::vector<int32_t> ids;
};
struct CompletionParams {
    std::vector<CompletionPrompt> prompts;  // a batch: one choice (or n) per prompt, in order
    int n = 1;                              // choices per prompt
    SamplingRequest sampling;
    int logprobs = -1;  // -1: none; k: logprob of each token + the k best
    // The prompt before the completion in the text (and, with logprobs, the prompt tokens' logprobs,
    // the first one's null, before the completion's).
    bool echo = false;
    bool echo_only = false;      // max_tokens 0 with echo: the prompt alone (one token generated and dropped)
    int prompt_logprobs = -1;    // vLLM's: -1 none; k: each prompt token's logprob, rank and the k best
    bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:<id>"
    // vLLM's return_token_ids: each choice's prompt_token_ids and token_ids (streamed: prompt_token_ids in the first
    // chunk, token_ids in each).
    bool return_token_ids = false;
    // vLLM's skip_special_tokens: the text leaves out special tokens (Harmony's <|channel|> and the rest); the
    // default here is false (they are shown, so the output can be parsed as Harmony).
    bool skip_special_tokens = false;
    bool stream = false;
    bool include_usage = false;
    bool continuous_usage = false;  // vLLM's stream_options.continuous_usage_stats (with include_usage)
    // vLLM's request_id: the answer's id is "chatcmpl-<request_id>" (chat) or "cmpl-<request_id>" (completions).
    std::optional<std::string> request_id;
};
// Token ids must be < vocab_size.
StatusOr<CompletionParams> parse_completion_request(const Json& body, int vocab_size);

// ---- response shapes ----------------------------------------------------------------------------

struct Usage {
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t reasoning_tokens = 0;
    int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};
Json chat_usage_json(const Usage& usage);       // prompt/completion/total + completion_tokens_details
Json responses_usage_json(const Usage& usage);  // input/output/total + details

// "chatcmpl-…", "cmpl-…", "resp_…", "msg_…", "rs_…", "fc_…": prefix + 24 random alphanumerics.
std::string random_id(std::string_view prefix);

// A reasoning item's encrypted_content (include: ["reasoning.encrypted_content"], for clients that keep no state
// and send reasoning back that way, as with OpenAI's store: false): its text in an opaque, versioned form (base64,
// not encrypted: this server shows the reasoning text anyway), and back; nullopt for a string this server did not
// make.
std::string reasoning_encrypted_content(std::string_view text);
// One of OpenAI's Responses `include` values (POST body or GET query).
bool responses_include_value(std::string_view v);
std::optional<std::string> reasoning_from_encrypted_content(std::string_view encrypted);
int64_t unix_time_now();

// One SSE event: "data: <json>\n\n", or with an event name "event: <name>\ndata: <json>\n\n".
std::string sse_event(const Json& data, std::string_view event_name = {});
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// JSON text of generated output: invalid UTF-8 (which the engine's tokens can produce) is replaced,
// never thrown on.
std::string dump_json(const Json& j);

// A token's text for logprob entries (lossy UTF-8) and its raw bytes.
Json token_bytes_json(std::string_view bytes);
std::string lossy_utf8(std::string_view bytes);

}  // namespace gptoss::server
