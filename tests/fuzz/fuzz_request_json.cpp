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
    if (auto completion = parse_completion_request(*json, 201088); !completion.ok()) {
        (void)error_body(api_error(completion.status()));
    }
    return 0;
}
