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
    // false for tool_choice "none" and requests without function tools: calls become hidden text (reasoning).
    bool function_calls_enabled = true;
    // parallel_tool_calls false: 1, calls after the first become hidden text (reasoning); 0: no limit. gpt-oss ends a
    // call with <|call|>, a stop token, so only a stream whose calls end with <|end|> holds two (HARMONY.md X9).
    size_t max_tool_calls = 0;
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

// A tool call's arguments streamed without the whitespace around them (HARMONY.md §6.5: the content,
// whitespace-trimmed): feed() returns what a delta adds to the trimmed text so far, holding back trailing
// whitespace until more text follows it; the deltas concatenated are trim(all fed text).
// The arguments of a whole call whose body is empty (ChatMapper, the Responses stream).
inline constexpr const char* kNoArguments = "{}";

class TrimmedArguments {
public:
    std::string feed(const std::string& delta);
    const std::string& text() const { return text_; }  // trimmed, so far

private:
    bool started_ = false;
    std::string held_;  // trailing whitespace not yet known to be inside the arguments
    std::string text_;
};

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
        TrimmedArguments args;
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
