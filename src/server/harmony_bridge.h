// Every call the server makes into harmony/ goes through this file: rendering a chat.completions
// request (or a Responses request translated to one) into prompt ids, and following the generated
// ids with harmony's streaming parser and chat mapper. The server adds only API shapes on top.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "harmony/harmony_chat.h"
#include "harmony/harmony_json.h"
#include "harmony/harmony_parser.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::server {

struct ChatPrompt {
    // [num_prompt_tokens]: rendered conversation + "<|start|>assistant" + `forced`.
    std::vector<int32_t> ids;
    // The forced start of the assistant's reply (a suffix of `ids`) for tool_choice "required"
    // ("<|channel|>commentary to=functions.") or a named function N ("<|channel|>commentary
    // to=functions.N <|constrain|>json<|message|>"); empty otherwise. Part of the prompt, not of the
    // completion: HarmonyOutput feeds these ids to the parser first.
    std::vector<int32_t> forced;
    // continue_final_message: `forced` is the open last message ("<|channel|>final<|message|>" and its text, after
    // its reasoning), whose text is not part of the answer unless `echo` (vLLM's chat echo) is set.
    bool continued = false;
    bool echo = false;
    harmony::ChatMappingOptions mapping;
    harmony::ParserOptions parser;
};

// Renders a chat.completions body (already checked by parse_chat_request). Errors name the field.
StatusOr<ChatPrompt> render_chat_prompt(const harmony::Json& chat_body, const tokenizer::BpeTokenizer& tokenizer,
                                        const harmony::ServerOptions& options);

// Ids that end generation (HARMONY.md §2.4): <|return|>, <|call|>, <|endoftext|>.
std::vector<int32_t> generation_stop_ids();
bool is_generation_stop_id(int32_t id);

// Follows one completion token by token.
class HarmonyOutput {
public:
    HarmonyOutput(const tokenizer::BpeTokenizer& tokenizer, const ChatPrompt& prompt);

    struct Step {
        std::vector<harmony::Event> events;      // parser events of this token (or of finish())
        std::vector<harmony::ChatDelta> deltas;  // chat.completions deltas of those events
        size_t own_events = 0;  // of `events`, the parser's for this token (the rest: a forced start's, first)
    };
    Step push(int32_t id);
    Step finish();  // end of generation
    // The forced start's events and deltas now (else they go out with the first token's): a continued message's
    // echoed text, which is the request's and no stop string may cut.
    Step take_forced();

    // Where a message with this header goes, and the function it calls (kToolCall only).
    harmony::ChatRoute route(const harmony::MessageHeader& header) const;
    std::string function_name(const harmony::MessageHeader& header) const;

    // The whole result (same rules as the deltas). `hit_length_limit`: stopped by max_tokens.
    harmony::ChatCompletion result(bool hit_length_limit) const { return mapper_.result(hit_length_limit); }
    // Tokens of messages that went to reasoning (header and terminator included), so far.
    int64_t reasoning_tokens() const { return reasoning_tokens_; }
    // Inside the body of a message routed to content (a token pushed now whose bytes gave no delta yet, the start
    // of a character split over tokens, is still the content's).
    bool in_content_body() const { return in_body_ && current_route_ == harmony::ChatRoute::kContent; }

private:
    Step mapped(std::vector<harmony::Event> events);

    harmony::ChatMappingOptions mapping_;
    harmony::StreamParser parser_;
    harmony::ChatMapper mapper_;
    harmony::ChatRoute current_route_ = harmony::ChatRoute::kHidden;
    bool in_body_ = false;           // between a message's start and its end
    int64_t tokens_in_message_ = 0;  // pushed since the last message ended
    int64_t reasoning_tokens_ = 0;
    std::vector<harmony::Event> forced_events_;  // of prompt.forced; go out with the first step
};

// {"role":"assistant","content","reasoning_content","tool_calls"?} of a chat.completion.
harmony::Json chat_message_json(const harmony::ChatCompletion& completion, bool reasoning_alias = false);
// A chat.completion.chunk delta object.
harmony::Json chat_delta_json(const harmony::ChatDelta& delta, bool reasoning_alias = false);

}  // namespace gptoss::server
