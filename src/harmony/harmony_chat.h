// Parsed Harmony output -> chat.completions result (HARMONY.md §6.5): `content` from final and
// preamble messages, `reasoning_content` from analysis and hidden text, `tool_calls` from messages
// addressed to functions, and finish_reason. One mapper serves streaming (per-event deltas) and
// non-streaming results, so both always agree.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harmony/harmony_parser.h"

namespace gptoss::harmony {

struct ChatMappingOptions {
    // Functions the request declared; a bare recipient that names one is a call (X7). nullopt: not
    // known, then any bare word recipient that is not a role or built-in counts as a function.
    std::optional<std::vector<std::string>> declared_functions;
    // false for tool_choice "none": calls become hidden text (reasoning).
    bool function_calls_enabled = true;
    // Commentary without a recipient (a preamble) goes to reasoning instead of content: set when the
    // content must be exactly the final message (a response format's JSON).
    bool preambles_to_reasoning = false;
    // Tool-call ids; default "call_" + 24 random alphanumerics.
    std::function<std::string()> make_tool_call_id;
};

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // the message content, whitespace-trimmed, verbatim (never re-encoded)
};

struct ChatCompletion {
    std::optional<std::string> content;
    std::optional<std::string> reasoning_content;
    std::vector<ToolCall> tool_calls;
    std::string finish_reason;  // "stop", "length" or "tool_calls"
};

struct ToolCallDelta {
    size_t index = 0;
    std::optional<std::string> id;    // first delta of a call only
    std::optional<std::string> name;  // first delta of a call only
    std::string arguments;
};

// One streaming delta; exactly one field is set.
struct ChatDelta {
    std::optional<std::string> content;
    std::optional<std::string> reasoning_content;
    std::optional<ToolCallDelta> tool_call;
};

// Where a message's text goes.
enum class ChatRoute { kContent, kReasoning, kToolCall, kHidden };
ChatRoute chat_route(const MessageHeader& header, const ChatMappingOptions& options);
// "functions.NAME" -> NAME; a declared bare name -> itself; otherwise nullopt.
std::optional<std::string> function_name(const std::string& recipient, const ChatMappingOptions& options);

class ChatMapper {
public:
    explicit ChatMapper(ChatMappingOptions options = {});
    // Deltas for the parser events of one push()/finish() (possibly none).
    std::vector<ChatDelta> on_events(const std::vector<Event>& events);
    // The whole result. `hit_length_limit`: generation stopped at max_tokens / the context; then an
    // unterminated tool call is not returned and finish_reason is "length" (unless a call was made).
    ChatCompletion result(bool hit_length_limit) const;

private:
    struct Call {
        ToolCall call;
        bool terminated = false;
        // Streamed arguments are the trimmed text too (HARMONY.md §6.5: streamed == non-streamed):
        // leading whitespace is never sent, trailing whitespace waits for the next non-space text.
        bool args_started = false;
        std::string args_held;
    };
    ChatMappingOptions options_;
    ChatRoute route_ = ChatRoute::kHidden;
    bool first_delta_ = true;  // of the current message
    std::string content_, reasoning_;
    bool has_content_ = false, has_reasoning_ = false;
    std::vector<Call> calls_;
};

// Non-streaming: the result for complete parsed messages (same rules as ChatMapper).
ChatCompletion to_chat_completion(const std::vector<ParsedMessage>& messages, const ChatMappingOptions& options,
                                  bool hit_length_limit);

// Coalesces per-token deltas: consecutive deltas of the same field are concatenated.
std::vector<ChatDelta> coalesce_deltas(const std::vector<ChatDelta>& deltas);

}  // namespace gptoss::harmony
