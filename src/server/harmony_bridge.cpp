#include "server/harmony_bridge.h"

#include <algorithm>

#include "harmony/harmony_render.h"
#include "harmony/harmony_types.h"

namespace gptoss::server {

StatusOr<ChatPrompt> render_chat_prompt(const harmony::Json& chat_body, const tokenizer::BpeTokenizer& tokenizer,
                                        const harmony::ServerOptions& options) {
    ASSIGN_OR_RETURN(harmony::ChatRequest request, harmony::chat_request_from_json(chat_body, options));
    ChatPrompt p;
    ASSIGN_OR_RETURN(p.ids, harmony::render(tokenizer, request.conversation, request.render_options));
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
    : mapping_(prompt.mapping), parser_(tokenizer, prompt.parser), mapper_(prompt.mapping) {}

harmony::ChatRoute HarmonyOutput::route(const harmony::MessageHeader& header) const {
    return harmony::chat_route(header, mapping_);
}

std::string HarmonyOutput::function_name(const harmony::MessageHeader& header) const {
    if (!header.recipient) return "";
    return harmony::function_name(*header.recipient, mapping_).value_or("");
}

HarmonyOutput::Step HarmonyOutput::mapped(std::vector<harmony::Event> events) {
    // Each token counts toward the message it ends up in: a message's tokens are known when it ends.
    for (const harmony::Event& e : events) {
        if (e.type == harmony::EventType::kMessageStart) current_route_ = route(e.header);
        if (e.type == harmony::EventType::kMessageEnd) {
            if (current_route_ == harmony::ChatRoute::kReasoning) reasoning_tokens_ += tokens_in_message_;
            tokens_in_message_ = 0;
        }
    }
    Step s;
    s.deltas = mapper_.on_events(events);
    s.events = std::move(events);
    return s;
}

HarmonyOutput::Step HarmonyOutput::push(int32_t id) {
    ++tokens_in_message_;
    return mapped(parser_.push(id));
}

HarmonyOutput::Step HarmonyOutput::finish() { return mapped(parser_.finish()); }

harmony::Json chat_message_json(const harmony::ChatCompletion& completion) {
    harmony::Json j = harmony::chat_completion_to_json(completion)["message"];
    j["role"] = "assistant";
    return j;
}

harmony::Json chat_delta_json(const harmony::ChatDelta& delta) { return harmony::chat_delta_to_json(delta); }

}  // namespace gptoss::server
