#include "structured/harmony_json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "harmony/harmony_chat.h"
#include "harmony/harmony_parser.h"
#include "unit/tokenizer/tokenizer_fixture.h"

namespace gptoss::structured {
namespace {

// A toy vocabulary: the 256 bytes, some words, then the Harmony specials (no bytes).
class HarmonyJsonTest : public ::testing::Test {
protected:
    void SetUp() override {
        for (int b = 0; b < 256; ++b) bytes_.push_back(std::string(1, static_cast<char>(b)));
        for (const char* w : {"analysis", "final", "commentary", " to=functions.f", "json", "assistant", "{\"",
                              "\":", "\"}", "hello", " "})
            add(w);
        for (const char* s :
             {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}) {
            special_[s] = static_cast<int32_t>(bytes_.size());
            bytes_.push_back("");
        }
        bytes_.resize(bytes_.size() + 3);  // unused ids past the tokenizer's vocabulary
        HarmonyTokenIds ids{.start = special_["<|start|>"],
                            .channel = special_["<|channel|>"],
                            .message = special_["<|message|>"],
                            .end = special_["<|end|>"],
                            .ret = special_["<|return|>"],
                            .call = special_["<|call|>"]};
        so_ = std::make_shared<HarmonyStructuredOutputs>(bytes_, ids);
    }
    void add(const std::string& w) {
        words_[w] = static_cast<int32_t>(bytes_.size());
        bytes_.push_back(w);
    }
    int32_t id(const std::string& s) const {
        if (auto it = special_.find(s); it != special_.end()) return it->second;
        if (auto it = words_.find(s); it != words_.end()) return it->second;
        EXPECT_EQ(s.size(), 1u) << s;
        return static_cast<uint8_t>(s[0]);
    }
    void feed(runtime::TokenConstraint& c, std::initializer_list<const char*> toks) const {
        for (const char* t : toks) c.accept(id(t));
    }

    std::vector<std::string> bytes_;
    std::map<std::string, int32_t> special_, words_;
    std::shared_ptr<HarmonyStructuredOutputs> so_;
};

TEST_F(HarmonyJsonTest, OnlyTheFinalMessageIsConstrained) {
    auto c = so_->final_json(JsonGrammar::any_object())->start();
    std::vector<uint8_t> mask;
    // The analysis header and body are free.
    EXPECT_FALSE(c->allowed_next(&mask));
    feed(*c, {"<|channel|>", "analysis", "<|message|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
    feed(*c, {"hello", "<|end|>", "<|start|>", "assistant"});
    EXPECT_FALSE(c->allowed_next(&mask));
    // A commentary tool call is free too.
    feed(*c, {"<|channel|>", "commentary", " to=functions.f", " ", "<|constrain|>", "json", "<|message|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
    feed(*c, {"x", "<|call|>", "<|start|>", "assistant", "<|channel|>", "final", " ", "<|constrain|>", "json"});
    EXPECT_FALSE(c->allowed_next(&mask));  // still in the header
    feed(*c, {"<|message|>"});
    ASSERT_TRUE(c->allowed_next(&mask));
    ASSERT_EQ(mask.size(), bytes_.size());
    EXPECT_TRUE(mask[static_cast<size_t>(id("{"))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id("{\""))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id(" "))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("hello"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("\""))]);
    for (const char* s : {"<|return|>", "<|end|>", "<|start|>", "<|channel|>", "<|message|>", "<|call|>"})
        EXPECT_FALSE(mask[static_cast<size_t>(id(s))]) << s;
    for (size_t i = bytes_.size() - 3; i < bytes_.size(); ++i) EXPECT_FALSE(mask[i]);
    feed(*c, {"{\"", "hello", "\":"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|return|>"))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id("1"))]);
    feed(*c, {"1", "}"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|return|>"))]);  // complete: the end is allowed
    EXPECT_TRUE(mask[static_cast<size_t>(id(" "))]);           // and trailing whitespace
    EXPECT_FALSE(mask[static_cast<size_t>(id(","))]);
    feed(*c, {"<|return|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
}

// A raw completion (the whole output constrained) past its end: with ignore_eos the engine goes on drawing, and the
// mask was lifted after <|return|> (free text followed, session 57); it allows only <|return|> again.
TEST_F(HarmonyJsonTest, ARawCompletionOnlyRepeatsItsEnd) {
    auto c = so_->raw_json(JsonGrammar::any_object())->start();
    std::vector<uint8_t> mask;
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("{"))]);
    feed(*c, {"{", "}"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|return|>"))]);
    for (int k = 0; k < 3; ++k) {
        feed(*c, {"<|return|>"});
        ASSERT_TRUE(c->allowed_next(&mask));
        EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
        EXPECT_TRUE(mask[static_cast<size_t>(id("<|return|>"))]);
    }
}

TEST_F(HarmonyJsonTest, CallsToStrictFunctionsAreHeldToTheirParameters) {
    auto params = JsonGrammar::compile(nlohmann::ordered_json::parse(
        R"({"type":"object","properties":{"hello":{"type":"integer"}},"required":["hello"]})"));
    ASSERT_TRUE(params.ok());
    auto tools = std::make_shared<ToolGrammars>();
    (*tools)["f"] = *params;
    auto c = so_->final_json(nullptr, {}, tools)->start();
    std::vector<uint8_t> mask;
    // The final message is free (no response format), a call to another function too.
    feed(*c, {"<|channel|>", "final", "<|message|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
    feed(*c, {"x", "<|end|>", "<|start|>", "assistant", "<|channel|>", "commentary", " ", "t", "o", "=", "g",
              "<|message|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
    // A call to f, its recipient in the role slot: held to f's parameters, ended by <|call|>.
    feed(*c, {"x", "<|call|>", "<|start|>", "assistant", " to=functions.f", "<|channel|>", "commentary", " ",
              "<|constrain|>", "json", "<|message|>"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("{\""))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|call|>"))]);
    feed(*c, {"{\"", "hello", "\":"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_FALSE(mask[static_cast<size_t>(id("\""))]);  // an integer, not a string
    EXPECT_TRUE(mask[static_cast<size_t>(id("1"))]);
    feed(*c, {"1", "}"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|call|>"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|return|>"))]);
    feed(*c, {"<|call|>"});
    EXPECT_FALSE(c->allowed_next(&mask));
    // The forced start of a named call (tool_choice) begins inside f's arguments.
    auto forced = so_->final_json(nullptr,
                                  {id("<|channel|>"), id("commentary"), id(" to=functions.f"), id(" "),
                                   id("<|constrain|>"), id("json"), id("<|message|>")},
                                  tools)
                      ->start();
    ASSERT_TRUE(forced->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("{"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("hello"))]);
}

// tool_choice "required" forces "…to=functions." and leaves the name to the model: it is held to a declared
// function's (HARMONY.md §7), then <|constrain|> or <|message|> may follow, and the call's arguments are held as
// before.
TEST_F(HarmonyJsonTest, ARequiredCallsNameIsADeclaredOne) {
    add(" to=functions.");
    add("get");
    add("_time");
    HarmonyTokenIds ids = so_->ids();
    ids.constrain = special_["<|constrain|>"];
    so_ = std::make_shared<HarmonyStructuredOutputs>(bytes_, ids);
    auto tools = std::make_shared<ToolGrammars>();
    (*tools)["get_time"] = JsonGrammar::any_object();
    auto factory = so_->final_json(nullptr, {id("<|channel|>"), id("commentary"), id(" to=functions.")}, tools, nullptr,
                                   nullptr, nullptr, std::vector<std::string>{"get_weather", "get_time"});
    auto c = factory->start();
    std::vector<uint8_t> mask;
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("get"))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id("g"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("x"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("hello"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|message|>"))]);  // no empty name
    feed(*c, {"get", "_time"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|constrain|>"))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|message|>"))]);
    EXPECT_TRUE(mask[static_cast<size_t>(id(" "))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("_"))]);  // "get_time_…" is no declared name
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|end|>"))]);
    feed(*c, {" ", "<|constrain|>"});
    // The content type is "json" (it had been free: a random model wrote words there until max_tokens and the
    // "required" call never came).
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("json"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("hello"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|message|>"))]);  // not before "json"
    EXPECT_FALSE(mask[static_cast<size_t>(id("<|end|>"))]);
    feed(*c, {"json"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|message|>"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("json"))]);
    feed(*c, {"<|message|>"});
    ASSERT_TRUE(c->allowed_next(&mask));  // get_time's arguments
    EXPECT_TRUE(mask[static_cast<size_t>(id("{"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("x"))]);
    // The other name, ended by <|message|> at once.
    c = factory->start();
    feed(*c, {"g", "e", "t", "_", "w", "e", "a", "t", "h", "e", "r"});
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("<|message|>"))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("s"))]);
    feed(*c, {"<|message|>"});
    EXPECT_FALSE(c->allowed_next(&mask));  // get_weather has no grammar here: its arguments are free
}

// Headers as the server's robust parser reads them: "Final" / "final." are the final channel; a
// "functions.f" word without "to=", or a declared function named bare, is a call.
TEST_F(HarmonyJsonTest, HeaderVariantsAreRoutedAsTheParserRoutesThem) {
    add("Final");
    add("final.");
    add(" functions.f");
    add(" to=f");
    so_ = std::make_shared<HarmonyStructuredOutputs>(bytes_, so_->ids());  // with the words added
    auto tools = std::make_shared<ToolGrammars>();
    (*tools)["f"] = JsonGrammar::any_object();
    auto factory = so_->final_json(JsonGrammar::any_object(), {}, tools);
    std::vector<uint8_t> mask;
    for (auto header :
         std::vector<std::vector<const char*>>{{"<|channel|>", "Final", "<|message|>"},
                                               {"<|channel|>", "final.", "<|message|>"},
                                               {"<|channel|>", "commentary", " functions.f", "<|message|>"},
                                               {"<|channel|>", "commentary", " to=f", "<|message|>"}}) {
        auto c = factory->start();
        for (const char* t : header) c->accept(id(t));
        ASSERT_TRUE(c->allowed_next(&mask)) << header[1];
        EXPECT_FALSE(mask[static_cast<size_t>(id("hello"))]) << header[1];
    }
}

TEST_F(HarmonyJsonTest, TheForcedStartOfTheReplyIsFollowedFirst) {
    auto schema = JsonGrammar::compile(nlohmann::ordered_json::parse(R"({"enum":["hello"]})"));
    ASSERT_TRUE(schema.ok());
    auto factory = so_->final_json(*schema, {id("<|channel|>"), id("final"), id("<|message|>")});
    auto c = factory->start();
    std::vector<uint8_t> mask;
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("\""))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("{"))]);
    feed(*c, {"\"", "hello"});
    ASSERT_TRUE(c->allowed_next(&mask));
    int64_t n = 0;
    for (uint8_t m : mask) n += m;
    EXPECT_EQ(n, 1);  // the closing quote alone ('"}' would go past the literal)
    EXPECT_TRUE(mask[static_cast<size_t>(id("\""))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("\"}"))]);
    // Each start is its own state.
    auto other = factory->start();
    ASSERT_TRUE(other->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(id("\""))]);
    EXPECT_FALSE(mask[static_cast<size_t>(id("h"))]);
}

}  // namespace
}  // namespace gptoss::structured

namespace gptoss::structured {
namespace {

// The o200k_harmony vocabulary: random documents drawn token by token under the masks end as
// documents of the schema, and the mask agrees with feeding the token's bytes on a sample of ids at
// every step (multi-byte characters split across tokens included).
TEST(HarmonyJsonO200k, RandomDocumentsUnderTheMaskMatchTheSchema) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    const auto t0 = std::chrono::steady_clock::now();
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto schema = JsonGrammar::compile(nlohmann::ordered_json::parse(R"({"type":"object","properties":{
        "name":{"type":"string","maxLength":12},
        "kind":{"enum":["cat","dog",3]},
        "scores":{"type":"array","items":{"type":"number"},"maxItems":4},
        "ok":{"type":"boolean"},
        "child":{"anyOf":[{"type":"null"},{"type":"object","properties":{"v":{"type":"integer"}},"required":["v"]}]}},
        "required":["name","kind","scores","ok","child"]})"));
    ASSERT_TRUE(schema.ok()) << schema.status().to_string();
    const HarmonyTokenIds& ids = (*so)->ids();
    const std::vector<std::string>& bytes = (*so)->token_bytes();
    std::mt19937 rng(3);
    std::vector<uint8_t> mask;
    int complete = 0, steps = 0;
    double mask_ms = 0;
    for (int doc = 0; doc < 12; ++doc) {
        auto c = (*so)->final_json(*schema, {ids.channel})->start();
        for (int32_t t : tok->encode_ordinary("final")) c->accept(t);
        c->accept(ids.message);
        JsonMatcher m(**schema);
        std::string text;
        for (int step = 0; step < 300; ++step, ++steps) {
            const auto s0 = std::chrono::steady_clock::now();
            ASSERT_TRUE(c->allowed_next(&mask));
            mask_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
            ASSERT_EQ(mask.size(), 201088u);
            for (int k = 0; k < 300; ++k) {
                const size_t id = rng() % mask.size();
                if (bytes[id].empty()) {
                    ASSERT_TRUE(!mask[id] || static_cast<int32_t>(id) == ids.ret) << id;
                    continue;
                }
                JsonMatcher probe = m;
                ASSERT_EQ(mask[id] != 0, probe.feed(bytes[id]))
                    << "id " << id << " '" << bytes[id] << "' after " << text;
            }
            std::vector<int32_t> allowed, closing;
            for (size_t id = 0; id < mask.size(); ++id) {
                if (!mask[id]) continue;
                allowed.push_back(static_cast<int32_t>(id));
                if (!bytes[id].empty() && bytes[id].find_first_of("\"}],") != std::string::npos)
                    closing.push_back(static_cast<int32_t>(id));
            }
            ASSERT_FALSE(allowed.empty());
            if (mask[static_cast<size_t>(ids.ret)] && rng() % 2 == 0) {
                ++complete;
                EXPECT_TRUE(m.accepting());
                const auto j = nlohmann::ordered_json::parse(text);
                EXPECT_TRUE(j["name"].is_string() && j["scores"].is_array() && j["ok"].is_boolean()) << text;
                EXPECT_TRUE(j["kind"] == "cat" || j["kind"] == "dog" || j["kind"] == 3) << text;
                EXPECT_TRUE(j["child"].is_null() || j["child"]["v"].is_number_integer()) << text;
                EXPECT_LE(j["scores"].size(), 4u);
                break;
            }
            const std::vector<int32_t>& pool = !closing.empty() && rng() % 3 == 0 ? closing : allowed;
            const int32_t pick = pool[rng() % pool.size()];
            if (pick == ids.ret) continue;
            c->accept(pick);
            ASSERT_TRUE(m.feed(bytes[static_cast<size_t>(pick)]));
            text += bytes[static_cast<size_t>(pick)];
        }
    }
    EXPECT_GE(complete, 6) << "too few documents completed to check";
    // The states that once walked the whole trie (review, session 46: 35-48 ms a mask): inside another
    // key of an object with named properties, and inside a string with two alternatives alive.
    auto extra = JsonGrammar::compile(nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{}},
        "additionalProperties":{"anyOf":[{"enum":["ab"]},{"type":"string"}]}})"));
    ASSERT_TRUE(extra.ok());
    std::vector<JsonMatcher> levels;
    for (const char* at : {"{\"zz", "{\"zz\":\"a"}) {
        JsonMatcher m(**extra);
        ASSERT_TRUE(m.feed(at));
        const auto s0 = std::chrono::steady_clock::now();
        const int64_t n = (*so)->trie().fill_mask(m, &mask, &levels);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
        std::printf("mask after '%s': %.2f ms, %lld tokens\n", at, ms, static_cast<long long>(n));
        EXPECT_GT(n, 100000);
    }
    std::printf("trie build %.0f ms; mask %.2f ms a step over %d steps\n", build_ms, mask_ms / steps, steps);
}

// The constraint follows the Harmony framing as the server's robust parser reads it (HARMONY.md §6.7): random
// replies made of framing tokens and words, drawn freely where the constraint leaves them free and from its mask
// where it holds them, with the missing <|start|> / <|end|>, stray terminators, headers ended without <|message|> and
// junk specials that real gpt-oss output has. Every message the parser then reports on the final channel was drawn
// under the mask: its text is a prefix of a schema document (session 59: after `<|end|>` then `<|channel|>final`
// with no <|start|>, or a `<|channel|>` inside an analysis body, the final message ran free).
TEST(HarmonyJsonO200k, FinalMessagesAsTheRobustParserReadsThemAreHeld) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    auto schema = JsonGrammar::compile(nlohmann::ordered_json::parse(
        R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false})"));
    ASSERT_TRUE(schema.ok());
    const HarmonyTokenIds& ids = (*so)->ids();
    auto sp = [&](const char* s) { return *tok->special_token_id(s); };
    // Phrases drawn where the reply is free: the framing's pieces, whole headers and words.
    auto enc = [&](const char* w) { return tok->encode_ordinary(w); };
    auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
        std::vector<int32_t> out;
        for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
        return out;
    };
    const std::vector<int32_t> cf = {ids.channel}, msg = {ids.message}, st = {ids.start}, en = {ids.end};
    const std::vector<std::vector<int32_t>> phrases = {st,
                                                       cf,
                                                       msg,
                                                       en,
                                                       {sp("<|constrain|>")},
                                                       {sp("<|endoftext|>")},
                                                       cat({cf, enc("final"), msg}),
                                                       cat({cf, enc("final"), msg}),
                                                       cat({st, enc("assistant"), cf, enc("final"), msg}),
                                                       cat({cf, enc("analysis"), msg}),
                                                       cat({cf, enc("Final"), enc(" json"), msg}),
                                                       cat({cf, enc("final?"), msg}),
                                                       cat({cf, enc("commentary"), enc(" to=functions.f"), msg}),
                                                       cat({cf, enc("final"), enc(" to=assistant"), msg}),
                                                       enc("final"),
                                                       enc("analysis"),
                                                       enc("assistant"),
                                                       enc(" "),
                                                       enc("hello"),
                                                       enc("json"),
                                                       enc(" to="),
                                                       enc("functions"),
                                                       enc("\n")};
    std::mt19937 rng(11);
    std::vector<uint8_t> mask;
    int finals = 0, held_steps = 0;
    for (int doc = 0; doc < 400; ++doc) {
        auto c = (*so)->final_json(*schema)->start();
        harmony::StreamParser parser(*tok);
        std::vector<int32_t> reply;
        bool stopped = false;
        auto take = [&](int32_t id) {
            reply.push_back(id);
            c->accept(id);
            parser.push(id);
            stopped = id == ids.ret || id == ids.call;
        };
        for (int step = 0; step < 24 && !stopped; ++step) {
            if (c->allowed_next(&mask)) {
                ++held_steps;
                std::vector<int32_t> allowed;
                for (size_t id = 0; id < mask.size(); ++id)
                    if (mask[id] && (id < 1000 || static_cast<int32_t>(id) == ids.ret))  // short ids: quick
                        allowed.push_back(static_cast<int32_t>(id));
                if (allowed.empty())
                    for (size_t id = 0; id < mask.size(); ++id)
                        if (mask[id]) allowed.push_back(static_cast<int32_t>(id));
                ASSERT_FALSE(allowed.empty());
                take(allowed[rng() % allowed.size()]);
                continue;
            }
            for (int32_t id : phrases[rng() % phrases.size()]) {
                if (stopped || c->allowed_next(&mask)) break;  // held from here on: the mask draws
                take(id);
            }
        }
        parser.finish();
        for (const harmony::ParsedMessage& m : parser.messages()) {
            // The answer's final content: routed to content (not recovered, not hidden) on the final channel.
            if (harmony::chat_route(m.header, harmony::ChatMappingOptions{}) != harmony::ChatRoute::kContent ||
                m.header.channel != std::optional<std::string>("final"))
                continue;
            ++finals;
            JsonMatcher matcher(**schema);
            EXPECT_TRUE(matcher.feed(m.content))
                << "final message '" << m.content << "' ran free; reply: " << *tok->decode(reply);
        }
    }
    EXPECT_GE(finals, 50) << "too few final messages to check";
    EXPECT_GE(held_steps, 100);
}

}  // namespace
}  // namespace gptoss::structured
