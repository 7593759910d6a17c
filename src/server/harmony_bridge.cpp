#include "server/harmony_bridge.h"

#include <algorithm>
#include <iterator>
#include <span>

#include "harmony/harmony_render.h"
#include "harmony/harmony_types.h"

namespace gptoss::server {
namespace {

// The forced reply start of tool_choice "required" / a named function (HARMONY.md §7), in the form
// the model itself emits most (§6.3: "<|channel|>commentary to=functions.x <|constrain|>json").
// "required" forces the recipient prefix up to and including "functions." so that the reply can
// only be a function call; the model writes the name and the rest of the header. Text pieces are
// encoded with encode_ordinary, special tokens by id, like the renderer (§1.2).
std::vector<harmony::Segment> forced_reply_start(const harmony::ChatRequest& request) {
    std::vector<harmony::Segment> s;
    auto special = [&](int32_t id) { s.push_back(harmony::Segment{id, ""}); };
    auto text = [&](std::string t) { s.push_back(harmony::Segment{-1, std::move(t)}); };
    // `required` with one declared function can only mean that function: the whole header is forced
    // (its name then cannot come out misspelled or undeclared).
    std::optional<std::string> named;
    if (request.tool_choice == harmony::ToolChoice::kFunction) named = request.forced_function;
    if (request.tool_choice == harmony::ToolChoice::kRequired && request.declared_functions.size() == 1)
        named = request.declared_functions[0];
    if (request.tool_choice == harmony::ToolChoice::kRequired && !named) {
        special(harmony::kChannel);
        text("commentary to=functions.");
    } else if (named) {
        special(harmony::kChannel);
        text("commentary to=functions." + *named + " ");
        special(harmony::kConstrain);
        text("json");
        special(harmony::kMessage);
    }
    return s;
}

// continue_final_message: the open last message after "<|start|>assistant" (HARMONY.md §2: a message's header,
// <|message|>, its text; no terminator, so the model's next token continues the text).
std::vector<harmony::Segment> open_message_start(const harmony::OpenMessage& open) {
    std::vector<harmony::Segment> s;
    auto message = [&](const char* channel, const std::string& text) {
        s.push_back(harmony::Segment{harmony::kChannel, ""});
        s.push_back(harmony::Segment{-1, channel});
        s.push_back(harmony::Segment{harmony::kMessage, ""});
        if (!text.empty()) s.push_back(harmony::Segment{-1, text});
    };
    const bool reasoning = open.reasoning && !open.reasoning->empty();
    if (reasoning && !open.content) {
        message("analysis", *open.reasoning);  // the reasoning itself continues
        return s;
    }
    if (reasoning) {
        message("analysis", *open.reasoning);
        s.push_back(harmony::Segment{harmony::kEnd, ""});
        s.push_back(harmony::Segment{harmony::kStart, ""});
        s.push_back(harmony::Segment{-1, "assistant"});
    }
    message("final", open.content.value_or(""));
    return s;
}

}  // namespace

StatusOr<ChatPrompt> render_chat_prompt(const harmony::Json& chat_body, const tokenizer::BpeTokenizer& tokenizer,
                                        const harmony::ServerOptions& options) {
    ASSIGN_OR_RETURN(harmony::ChatRequest request, harmony::chat_request_from_json(chat_body, options));
    ChatPrompt p;
    ASSIGN_OR_RETURN(p.ids, harmony::render(tokenizer, request.conversation, request.render_options));
    std::vector<harmony::Segment> start = forced_reply_start(request);
    if (request.open_message) {
        if (!start.empty())
            return invalid_argument(
                "continue_final_message: tool_choice \"required\" or a named function starts a new reply; the two "
                "cannot be combined");
        start = open_message_start(*request.open_message);
        p.continued = true;
    }
    p.forced = harmony::encode_segments(tokenizer, start);
    p.ids.insert(p.ids.end(), p.forced.begin(), p.forced.end());
    p.mapping = harmony::chat_mapping_options(request);
    p.parser.declared_functions = request.declared_functions;
    return p;
}

std::vector<int32_t> generation_stop_ids() {
    return std::vector<int32_t>(std::begin(harmony::kGenerationStopIds), std::end(harmony::kGenerationStopIds));
}

bool is_generation_stop_id(int32_t id) {
    return std::find(std::begin(harmony::kGenerationStopIds), std::end(harmony::kGenerationStopIds), id) !=
           std::end(harmony::kGenerationStopIds);
}

HarmonyOutput::HarmonyOutput(const tokenizer::BpeTokenizer& tokenizer, const ChatPrompt& prompt)
    : mapping_(prompt.mapping), parser_(tokenizer, prompt.parser), mapper_(prompt.mapping) {
    // The forced header is prompt: parsed (so the reply continues inside it) but not counted as
    // completion tokens; its events (a tool call's start) go out with the first generated token.
    forced_events_ = parser_.push(std::span<const int32_t>(prompt.forced));
    // A continued message's text so far is the request's, not the answer's (unless echoed).
    if (prompt.continued && !prompt.echo)
        std::erase_if(forced_events_,
                      [](const harmony::Event& e) { return e.type == harmony::EventType::kContentDelta; });
}

harmony::ChatRoute HarmonyOutput::route(const harmony::MessageHeader& header) const {
    return harmony::chat_route(header, mapping_);
}

std::string HarmonyOutput::function_name(const harmony::MessageHeader& header) const {
    if (!header.recipient) return "";
    return harmony::function_name(*header.recipient, mapping_).value_or("");
}

HarmonyOutput::Step HarmonyOutput::mapped(std::vector<harmony::Event> events) {
    const size_t own = events.size();
    if (!forced_events_.empty()) {
        events.insert(events.begin(), std::make_move_iterator(forced_events_.begin()),
                      std::make_move_iterator(forced_events_.end()));
        forced_events_.clear();
    }
    // Each token counts toward the message it ends up in: a message's tokens are known when it ends.
    for (const harmony::Event& e : events) {
        if (e.type == harmony::EventType::kMessageStart) current_route_ = route(e.header), in_body_ = true;
        if (e.type == harmony::EventType::kMessageEnd) {
            in_body_ = false;
            if (current_route_ == harmony::ChatRoute::kReasoning) reasoning_tokens_ += tokens_in_message_;
            tokens_in_message_ = 0;
        }
    }
    Step s;
    s.own_events = own;
    s.deltas = mapper_.on_events(events);
    s.events = std::move(events);
    return s;
}

HarmonyOutput::Step HarmonyOutput::push(int32_t id) {
    ++tokens_in_message_;
    return mapped(parser_.push(id));
}

HarmonyOutput::Step HarmonyOutput::finish() { return mapped(parser_.finish()); }

HarmonyOutput::Step HarmonyOutput::take_forced() { return forced_events_.empty() ? Step{} : mapped({}); }

harmony::Json chat_message_json(const harmony::ChatCompletion& completion, bool reasoning_alias) {
    harmony::Json j = harmony::chat_completion_to_json(completion)["message"];
    j["role"] = "assistant";
    if (!j.contains("refusal")) j["refusal"] = nullptr;  // OpenAI's message always has it
    if (reasoning_alias) j["reasoning"] = j["reasoning_content"];
    return j;
}

harmony::Json chat_delta_json(const harmony::ChatDelta& delta, bool reasoning_alias) {
    harmony::Json j = harmony::chat_delta_to_json(delta);
    if (reasoning_alias && j.contains("reasoning_content")) j["reasoning"] = j["reasoning_content"];
    return j;
}

}  // namespace gptoss::server
