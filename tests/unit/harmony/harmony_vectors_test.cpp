// Conformance against shared/spec/harmony_vectors.json (HARMONY.md §9): every render vector byte for
// byte (text, and ids when tokenizer.json is available), every parse vector structurally (messages,
// strict errors and lenient messages, warnings, chat_completion without ids, stream deltas).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harmony/harmony_chat.h"
#include "harmony/harmony_json.h"
#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::harmony {
namespace {

const std::string kVectorsPath = GPTOSS_SOURCE_DIR "/../shared/spec/harmony_vectors.json";

const Json* vectors() {
    static const std::optional<Json> v = []() -> std::optional<Json> {
        std::ifstream f(kVectorsPath);
        if (!f) return std::nullopt;
        Json j = Json::parse(f, nullptr, false);
        if (j.is_discarded() || !j.is_array()) return std::nullopt;
        return j;
    }();
    return v ? &*v : nullptr;
}

const tokenizer::BpeTokenizer* shared_tokenizer() {
    static const std::unique_ptr<tokenizer::BpeTokenizer> tok = []() -> std::unique_ptr<tokenizer::BpeTokenizer> {
        std::optional<std::string> path = tokenizer::find_tokenizer_file("");
        if (!path) return nullptr;
        auto t = tokenizer::BpeTokenizer::from_file(*path);
        return t.ok() ? std::move(t).value() : nullptr;
    }();
    return tok.get();
}

std::vector<std::string> vector_names(const std::string& kind) {
    std::vector<std::string> names;
    if (const Json* v = vectors()) {
        for (const Json& x : *v) {
            if (x.value("kind", "") == kind) names.push_back(x.value("name", ""));
        }
    }
    if (names.empty()) names.push_back("vectors_file_missing");
    return names;
}

const Json* find_vector(const std::string& name) {
    if (const Json* v = vectors()) {
        for (const Json& x : *v) {
            if (x.value("name", "") == name) return &x;
        }
    }
    return nullptr;
}

// nlohmann::json (std::map objects) so that key order does not matter in comparisons.
nlohmann::json unordered(const Json& j) { return nlohmann::json::parse(j.dump()); }

struct Rendered {
    std::vector<Segment> segments;
    std::optional<Conversation> conversation;  // chat.completions: the intermediate messages
};

StatusOr<Rendered> render_vector_input(const Json& input) {
    Rendered out;
    std::string api = input.value("api", "");
    Conversation conv;
    RenderOptions options;
    if (api == "harmony") {
        ASSIGN_OR_RETURN(conv, conversation_from_json(input["messages"]));
        ASSIGN_OR_RETURN(options, render_options_from_json(input.value("render", Json())));
    } else if (api == "chat.completions") {
        ASSIGN_OR_RETURN(ServerOptions so, server_options_from_json(input.value("server_options", Json())));
        ASSIGN_OR_RETURN(ChatRequest req, chat_request_from_json(input["request"], so));
        conv = req.conversation;
        options = req.render_options;
        out.conversation = conv;
    } else {
        return unimplemented("api " + api);
    }
    ASSIGN_OR_RETURN(out.segments, render_segments(conv, options));
    return out;
}

class RenderVectorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RenderVectorTest, MatchesTextIdsAndHarmonyMessages) {
    const Json* v = find_vector(GetParam());
    if (v == nullptr) GTEST_SKIP() << "harmony vectors not found at " << kVectorsPath;
    const Json& input = (*v)["input"];
    if (input.value("api", "") == "hf_chat_template") {
        GTEST_SKIP() << "HF template output is for comparison only (HARMONY.md §8), not a conformance target";
    }
    StatusOr<Rendered> r = render_vector_input(input);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(segments_text(r->segments), (*v)["expected"].get<std::string>());
    if (v->contains("expected_harmony_messages")) {
        ASSERT_TRUE(r->conversation.has_value());
        EXPECT_EQ(unordered(conversation_to_json(*r->conversation)), unordered((*v)["expected_harmony_messages"]));
    }
    if (!v->contains("expected_tokens")) return;
    const tokenizer::BpeTokenizer* tok = shared_tokenizer();
    if (tok == nullptr) GTEST_SKIP() << "tokenizer.json not found: token ids not checked";
    std::vector<int32_t> ids = encode_segments(*tok, r->segments);
    EXPECT_EQ(ids, (*v)["expected_tokens"].get<std::vector<int32_t>>());
}

INSTANTIATE_TEST_SUITE_P(HarmonyVectors, RenderVectorTest, ::testing::ValuesIn(vector_names("render")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

void expect_messages(const std::vector<ParsedMessage>& got, const Json& expected) {
    ASSERT_EQ(got.size(), expected.size()) << parsed_messages_to_json(got).dump(1);
    Json got_json = parsed_messages_to_json(got);
    for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE("message " + std::to_string(i));
        for (const char* key : {"role", "name", "recipient", "channel", "content_type", "content"}) {
            EXPECT_EQ(got_json[i][key], expected[i].value(key, Json())) << key;
        }
        EXPECT_EQ(got[i].header.recovered, expected[i].value("recovered", false));
    }
}

struct ParseRun {
    std::vector<ParsedMessage> messages;
    std::vector<std::string> warnings;
    Status status;
    std::vector<ChatDelta> deltas;
    ChatCompletion streamed;
};

ParseRun run_parser(const tokenizer::BpeTokenizer& tok, const std::vector<int32_t>& tokens, const ParserOptions& po,
                    bool feed_eos, const ChatMappingOptions& mo) {
    StreamParser parser(tok, po);
    ChatMapper mapper(mo);
    ParseRun run;
    std::string streamed_text;
    for (int32_t id : tokens) {
        std::vector<ChatDelta> d = mapper.on_events(parser.push(id));
        run.deltas.insert(run.deltas.end(), d.begin(), d.end());
    }
    if (feed_eos) {
        std::vector<ChatDelta> d = mapper.on_events(parser.finish());
        run.deltas.insert(run.deltas.end(), d.begin(), d.end());
    }
    run.messages = parser.messages();
    run.warnings = parser.warnings();
    run.status = parser.status();
    run.streamed = mapper.result(false);
    return run;
}

class ParseVectorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ParseVectorTest, MatchesMessagesWarningsAndChatCompletion) {
    const Json* v = find_vector(GetParam());
    if (v == nullptr) GTEST_SKIP() << "harmony vectors not found at " << kVectorsPath;
    const tokenizer::BpeTokenizer* tok = shared_tokenizer();
    if (tok == nullptr) GTEST_SKIP() << "tokenizer.json not found: parse vectors need it to decode ids";
    const Json& input = (*v)["input"];
    const Json& expected = (*v)["expected"];
    std::vector<int32_t> tokens = input["tokens"].get<std::vector<int32_t>>();
    StatusOr<ParserOptions> po = parser_options_from_json(input["parser"]);
    ASSERT_TRUE(po.ok()) << po.status().to_string();
    bool feed_eos = input["parser"].value("feed_eos", true);
    ChatMappingOptions mo;
    mo.declared_functions = po->declared_functions;

    ParseRun run = run_parser(*tok, tokens, *po, feed_eos, mo);
    if (expected.contains("error")) {
        ASSERT_FALSE(run.status.ok()) << "strict parsing should fail";
        EXPECT_NE(run.status.message().find(expected["error"].get<std::string>()), std::string::npos)
            << run.status.message();
        ParserOptions lenient = *po;
        lenient.mode = ParseMode::kLenient;
        ParseRun l = run_parser(*tok, tokens, lenient, feed_eos, mo);
        ASSERT_TRUE(l.status.ok()) << l.status.to_string();
        expect_messages(l.messages, expected["messages_non_strict"]);
        return;
    }
    ASSERT_TRUE(run.status.ok()) << run.status.to_string();
    if (expected.contains("messages")) {
        expect_messages(run.messages, expected["messages"]);
    }
    if (expected.contains("warnings")) {
        EXPECT_EQ(Json(run.warnings), expected["warnings"]);
    }

    ChatCompletion completion = to_chat_completion(run.messages, mo, false);
    if (expected.contains("chat_completion")) {
        nlohmann::json want = unordered(expected["chat_completion"]);
        EXPECT_EQ(unordered(chat_completion_to_json(completion, false)), want);
        for (const ToolCall& c : completion.tool_calls) EXPECT_EQ(c.id.rfind("call_", 0), 0u) << c.id;
    }
    // Streaming and non-streaming give the same result.
    EXPECT_EQ(unordered(chat_completion_to_json(run.streamed, false)),
              unordered(chat_completion_to_json(completion, false)));

    if (expected.contains("delta_sequence_per_token")) {
        Json deltas = Json::array();
        for (const ChatDelta& d : run.deltas) deltas.push_back(chat_delta_to_json(d));
        EXPECT_EQ(deltas, expected["delta_sequence_per_token"]);
        Json coalesced = Json::array();
        for (const ChatDelta& d : coalesce_deltas(run.deltas)) coalesced.push_back(chat_delta_to_json(d));
        EXPECT_EQ(coalesced, expected["coalesced"]);
        Json final_chunk = {{"delta", Json::object()}, {"finish_reason", run.streamed.finish_reason}};
        EXPECT_EQ(unordered(final_chunk), unordered(expected["final_chunk"]));
    }
}

INSTANTIATE_TEST_SUITE_P(HarmonyVectors, ParseVectorTest, ::testing::ValuesIn(vector_names("parse")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(HarmonyVectors, FileHasBothKinds) {
    if (vectors() == nullptr) GTEST_SKIP() << "harmony vectors not found at " << kVectorsPath;
    EXPECT_GE(vector_names("render").size(), 20u);
    EXPECT_GE(vector_names("parse").size(), 20u);
}

// The special ids the renderer and parser hard-code are the tokenizer's (HARMONY.md §1.1).
TEST(HarmonyVectors, SpecialIdsMatchTokenizer) {
    const tokenizer::BpeTokenizer* tok = shared_tokenizer();
    if (tok == nullptr) GTEST_SKIP() << "tokenizer.json not found";
    for (int32_t id = kFirstSpecialId; id <= kEndOfPrompt; ++id) {
        std::string text = *special_token_text(id);
        EXPECT_EQ(tok->special_token_id(text), std::optional<int32_t>(id)) << text;
    }
}

}  // namespace
}  // namespace gptoss::harmony
