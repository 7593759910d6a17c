// gptoss harmony render [--tokenizer PATH]   stdin: the `input` of a render vector
//                                            stdout: {"text": ..., "ids": [...]}
// gptoss harmony parse [--tokenizer PATH] [--length-limit]
//                                            stdin: the `input` of a parse vector (tokens, parser)
//                                            stdout: {"messages", "chat_completion", "warnings"[, "error"]}
// The shapes are those of shared/spec/harmony_vectors.json (HARMONY.md §9).
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "harmony/harmony_chat.h"
#include "harmony/harmony_json.h"
#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "server/openai_json.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

using harmony::Json;

struct HarmonyOptions {
    std::string tokenizer;
    bool length_limit = false;
};

StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> load_tokenizer(const std::string& path_flag) {
    std::optional<std::string> path = path_flag.empty() ? tokenizer::find_tokenizer_file("") : path_flag;
    if (!path) return not_found("no tokenizer.json found: pass --tokenizer PATH or set GPTOSS_TOKENIZER");
    return tokenizer::BpeTokenizer::from_file(*path);
}

// stdin as one JSON object; a whole vector ({"kind", "input", ...}) is accepted too.
StatusOr<Json> read_input() {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (std::string e = server::json_shape_error(text, kCliJsonDepth, kCliJsonMembers, "the JSON"); !e.empty())
        return invalid_argument("stdin: " + e);
    Json j = Json::parse(text, nullptr, false);
    if (j.is_discarded()) return invalid_argument("stdin is not valid JSON");
    if (!j.is_object()) return invalid_argument("stdin must be a JSON object");
    if (j.contains("kind") && j.contains("input") && j["input"].is_object()) return Json(j["input"]);
    return j;
}

void print(const Json& j) { std::cout << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n"; }

int run_render(const HarmonyOptions& o) {
    StatusOr<Json> input = read_input();
    if (!input.ok()) return fail(input.status().message());
    const Json& in = *input;
    std::string api = in.contains("api") && in["api"].is_string() ? in["api"].get<std::string>() : "";
    harmony::Conversation conversation;
    harmony::RenderOptions options;
    if (api == "harmony") {
        if (!in.contains("messages")) return fail("input.messages is required for api \"harmony\"");
        StatusOr<harmony::Conversation> conv = harmony::conversation_from_json(in["messages"]);
        if (!conv.ok()) return fail(conv.status().message());
        StatusOr<harmony::RenderOptions> ro = harmony::render_options_from_json(in.value("render", Json()));
        if (!ro.ok()) return fail(ro.status().message());
        conversation = std::move(*conv);
        options = *ro;
    } else if (api == "chat.completions") {
        if (!in.contains("request")) return fail("input.request is required for api \"chat.completions\"");
        StatusOr<harmony::ServerOptions> so = harmony::server_options_from_json(in.value("server_options", Json()));
        if (!so.ok()) return fail(so.status().message());
        StatusOr<harmony::ChatRequest> req = harmony::chat_request_from_json(in["request"], *so);
        if (!req.ok()) return fail(req.status().message());
        conversation = std::move(req->conversation);
        options = req->render_options;
    } else {
        return fail("input.api must be \"harmony\" or \"chat.completions\" (got " +
                    (in.contains("api") ? in["api"].dump(-1, ' ', false, Json::error_handler_t::replace) : "none") +
                    ")");
    }
    StatusOr<std::vector<harmony::Segment>> segments = harmony::render_segments(conversation, options);
    if (!segments.ok()) return fail(segments.status().message());
    auto tok = load_tokenizer(o.tokenizer);
    if (!tok.ok()) return fail(tok.status().message());
    print({{"text", harmony::segments_text(*segments)}, {"ids", harmony::encode_segments(**tok, *segments)}});
    return 0;
}

int run_parse(const HarmonyOptions& o) {
    StatusOr<Json> input = read_input();
    if (!input.ok()) return fail(input.status().message());
    const Json& in = *input;
    if (!in.contains("tokens") || !in["tokens"].is_array()) return fail("input.tokens must be an array of token ids");
    std::vector<int32_t> tokens;
    for (const Json& t : in["tokens"]) {
        bool fits = t.is_number_unsigned()  ? t.get<uint64_t>() <= std::numeric_limits<int32_t>::max()
                    : t.is_number_integer() ? t.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                                  t.get<int64_t>() <= std::numeric_limits<int32_t>::max()
                                            : false;
        if (!fits) return fail("input.tokens must hold 32-bit integer ids");
        tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    Json parser_json = in.value("parser", Json());
    StatusOr<harmony::ParserOptions> po = harmony::parser_options_from_json(parser_json);
    if (!po.ok()) return fail(po.status().message());
    bool feed_eos = true;
    if (parser_json.is_object() && parser_json.contains("feed_eos")) {
        if (!parser_json["feed_eos"].is_boolean()) return fail("parser.feed_eos must be a boolean");
        feed_eos = parser_json["feed_eos"].get<bool>();
    }
    auto tok = load_tokenizer(o.tokenizer);
    if (!tok.ok()) return fail(tok.status().message());

    harmony::StreamParser parser(**tok, *po);
    parser.push(tokens);
    if (feed_eos) parser.finish();
    harmony::ChatMappingOptions mapping;
    mapping.declared_functions = po->declared_functions;
    Json out = {{"messages", harmony::parsed_messages_to_json(parser.messages())},
                {"chat_completion", harmony::chat_completion_to_json(
                                        harmony::to_chat_completion(parser.messages(), mapping, o.length_limit))},
                {"warnings", parser.warnings()}};
    if (!parser.status().ok()) out["error"] = parser.status().message();
    print(out);
    return parser.status().ok() ? 0 : fail(parser.status().message());
}

// Library exceptions (bad_alloc, a JSON corner case) become a one-line error, never a crash.
int guarded(int (*run)(const HarmonyOptions&), const HarmonyOptions& o) {
    try {
        return run(o);
    } catch (const std::exception& e) {
        return fail(e.what());
    }
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<HarmonyOptions>();
    auto* harmony = app.add_subcommand("harmony", "Harmony prompt rendering and output parsing (JSON on stdin)");
    harmony->require_subcommand(1);
    auto* render = harmony->add_subcommand("render", "Render the `input` of a render vector: {\"text\", \"ids\"}");
    render->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: $GPTOSS_TOKENIZER or the fixture)")
        ->check(non_empty_path);
    render->callback([o, &exit_code] { exit_code = guarded(run_render, *o); });
    auto* parse = harmony->add_subcommand("parse", "Parse the `input` of a parse vector: messages, chat_completion");
    parse->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: $GPTOSS_TOKENIZER or the fixture)")
        ->check(non_empty_path);
    parse->add_flag("--length-limit", o->length_limit, "Generation stopped at max_tokens (finish_reason length)");
    parse->callback([o, &exit_code] { exit_code = guarded(run_parse, *o); });
});

}  // namespace
}  // namespace gptoss::cli
