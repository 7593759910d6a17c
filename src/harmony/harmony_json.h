// JSON adapters (nlohmann::ordered_json, so schemas keep their document order) between the wire
// formats and the Harmony types: an OpenAI chat.completions request + server options ->
// Conversation (HARMONY.md §5.2, §7), the harmony-native message format of harmony_vectors.json,
// parser options, and the parsed output / chat_completion / stream delta shapes. Bad input gives
// invalid_argument with the offending field named; no nlohmann exception escapes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "harmony/harmony_chat.h"
#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "harmony/harmony_types.h"

namespace gptoss::harmony {

// Server-side rendering choices for chat.completions requests.
struct ServerOptions {
    std::optional<std::string> current_date;  // "YYYY-MM-DD"; nullopt: today (UTC)
    std::string model_identity = std::string(kDefaultModelIdentity);
    std::string knowledge_cutoff = std::string(kDefaultKnowledgeCutoff);
    // Content type of historical tool calls; "" renders none (HARMONY.md §5.2).
    std::string history_tool_call_content_type = "<|constrain|>json";
    CotDropPolicy cot_drop_policy = CotDropPolicy::kCompletedTurns;
    bool browser_tool = false;  // built-in namespaces in the system message (§3.3)
    bool python_tool = false;
    bool drop_commentary_without_tools = false;  // "# Valid channels: analysis, final." then
    // A tool message whose tool_call_id no call in the conversation has, and which names no function: OpenAI's 400
    // (the server's choice) when set; else HARMONY.md §5.2's fallback, the most recent unanswered call.
    bool unmatched_tool_call_id_is_error = false;
};

enum class ToolChoice { kAuto, kNone, kRequired, kFunction };

// vLLM's continue_final_message: the request's last message, an assistant message without tool calls, left open
// for the model to continue. Its reasoning (reasoning_content, reasoning or thinking) is an analysis message, open
// when there is no content, closed before the final message otherwise; its content (null, or "" beside reasoning:
// none) the final message.
struct OpenMessage {
    std::optional<std::string> reasoning;
    std::optional<std::string> content;
};

// What the renderer and the output mapping need from one chat.completions request.
struct ChatRequest {
    Conversation conversation;  // system, developer (if any), history; CoT policy applied
    RenderOptions render_options;
    std::vector<std::string> declared_functions;
    ToolChoice tool_choice = ToolChoice::kAuto;
    std::optional<std::string> forced_function;  // tool_choice {"type":"function",...}
    bool parallel_tool_calls = true;             // false: at most one call a completion (HARMONY.md §7)
    ReasoningEffort reasoning_effort = ReasoningEffort::kMedium;
    // continue_final_message: the last message, not in `conversation` (which it continues).
    std::optional<OpenMessage> open_message;
};

// The `server_options` object of the render vectors (current_date, history_tool_call_content_type,
// cot_drop_policy, builtin_tools, model_identity, knowledge_cutoff, drop_commentary_without_tools).
StatusOr<ServerOptions> server_options_from_json(const Json& j);
// A function tool's name as harmony can carry it in a recipient: 1-128 of letters, digits, _ . : -
bool valid_function_name(const std::string& name);
// YYYY-MM-DD with a real month and day (2026-02-30 is not), or YYYY-MM when `day` is false.
bool valid_date(const std::string& s, bool day = true);
StatusOr<ChatRequest> chat_request_from_json(const Json& request, const ServerOptions& options);
// Mapping options for the completion of `request` (declared functions, tool_choice none).
ChatMappingOptions chat_mapping_options(const ChatRequest& request);

// Harmony-native messages ("harmony" api of the render vectors) and the `render` object.
StatusOr<Conversation> conversation_from_json(const Json& messages);
Json conversation_to_json(const Conversation& conversation);
StatusOr<RenderOptions> render_options_from_json(const Json& render);

// The `parser` object of the parse vectors: initial_role, strict, robust, declared_functions.
StatusOr<ParserOptions> parser_options_from_json(const Json& parser);
// {role, name, recipient, channel, content_type, content} (+ "recovered": true when set).
Json parsed_messages_to_json(const std::vector<ParsedMessage>& messages);
// {"message": {role, content, reasoning_content, tool_calls?}, "finish_reason": ...}.
Json chat_completion_to_json(const ChatCompletion& completion, bool include_ids = true);
// A chat.completion.chunk delta: {"content": ...} / {"reasoning_content": ...} / {"tool_calls": [...]}.
Json chat_delta_to_json(const ChatDelta& delta);

// Today's date in UTC as "YYYY-MM-DD".
std::string today_utc();

}  // namespace gptoss::harmony
