// Fuzz target: request bodies of the three generation endpoints. The bytes are parsed and
// validated as a chat.completions, a Responses and a completions body, and whatever validates is
// turned into a Harmony conversation and rendered to text. None of it may crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "harmony/harmony_json.h"
#include "harmony/harmony_render.h"
#include "server/openai_json.h"

namespace {

void render(const gptoss::harmony::Json& chat_body) {
    static const gptoss::harmony::ServerOptions options = [] {
        gptoss::harmony::ServerOptions o;
        o.current_date = "2026-01-01";
        return o;
    }();
    auto request = gptoss::harmony::chat_request_from_json(chat_body, options);
    if (!request.ok()) {
        (void)gptoss::server::error_body(gptoss::server::api_error(request.status()));
        return;
    }
    (void)gptoss::harmony::render_text(request->conversation, request->render_options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gptoss::server;
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    auto json = parse_json_body(body);
    if (!json.ok()) {
        (void)error_body(api_error(json.status()));
        return 0;
    }
    if (auto chat = parse_chat_request(*json); chat.ok()) {
        render(chat->chat_body);
    } else {
        (void)error_body(api_error(chat.status()));
    }
    if (auto responses = parse_responses_request(*json); responses.ok()) {
        render(responses->chat.chat_body);
        (void)dump_json(responses->echo);
    } else {
        (void)error_body(api_error(responses.status()));
    }
    // As a follow-up (previous_response_id) of a stored conversation whose output was a tool call: the input's
    // items after the stored ones, then a follow-up of that answer's own items (input_items as stored).
    static const Json earlier = Json::parse(
        R"([{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}],"id":"msg_1"},
            {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"t"}]},
            {"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}"}])");
    const ResponsesContext chained{true, &earlier};
    if (auto follow = parse_responses_request(*json, chained); follow.ok()) {
        render(follow->chat.chat_body);
        Json again = earlier;
        for (const Json& item : follow->input_items) again.push_back(item);
        const ResponsesContext twice{true, &again};
        if (auto second = parse_responses_request(Json{{"input", "next"}, {"previous_response_id", "resp_1"}}, twice);
            second.ok()) {
            render(second->chat.chat_body);
        } else {
            (void)error_body(api_error(second.status()));
        }
    } else {
        (void)error_body(api_error(follow.status()));
    }
    if (auto completion = parse_completion_request(*json, 201088); !completion.ok()) {
        (void)error_body(api_error(completion.status()));
    }
    return 0;
}
