// StructuralTag: random compositions of literals and patterns against the same language as one regular
// expression, triggered tags against a brute-force recognizer, the documented forms (legacy and xgrammar's) on
// hand-written outputs, refusals by path, the token mask against feeding each token, the Harmony gate, and the
// o200k vocabulary under the mask.
#include "structured/structural_tag.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "structured/harmony_json.h"
#include "unit/structured/mask_step.h"
#include "unit/structured/test_vocab.h"
#include "unit/tokenizer/tokenizer_fixture.h"

namespace gptoss::structured {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const StructuralTag> tag_of(const Json& j) {
    auto t = StructuralTag::parse(j);
    EXPECT_TRUE(t.ok()) << j.dump() << ": " << t.status().to_string();
    return t.ok() ? *t : nullptr;
}
std::shared_ptr<const StructuralTag> format_tag(const Json& format) {
    return tag_of(Json{{"type", "structural_tag"}, {"format", format}});
}
bool matches(const StructuralTag& t, const std::string& s) {
    StructuralTagMatcher m(t);
    return m.feed(s) && m.accepting();
}
bool live(const StructuralTag& t, const std::string& s) {
    StructuralTagMatcher m(t);
    return m.feed(s);
}

// A random format over literals and small patterns, and the regular expression of the same language.
struct Built {
    Json format;
    std::string regex;
};
Built random_format(std::mt19937& rng, int depth) {
    const unsigned pick = rng() % (depth >= 3 ? 2 : 8);
    Built b;
    if (pick == 0) {
        std::string lit;
        for (int k = 1 + static_cast<int>(rng() % 2); k > 0; --k) lit += "abc"[rng() % 3];
        b.format = {{"type", "const_string"}, {"value", lit}};
        b.regex = lit;
    } else if (pick == 1) {
        const char* pats[] = {"[ab]", "c+", "a?b", "[^a]"};
        const std::string p = pats[rng() % 4];
        b.format = {{"type", "regex"}, {"pattern", p}};
        b.regex = "(?:" + p + ")";
    } else if (pick == 2 || pick == 3) {
        Json elements = Json::array();
        std::string re;
        const int n = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < n; ++k) {
            Built kid = random_format(rng, depth + 1);
            elements.push_back(kid.format);
            re += (k && pick == 3 ? "|" : "") + kid.regex;
        }
        b.format = {{"type", pick == 2 ? "sequence" : "or"}, {"elements", elements}};
        b.regex = "(?:" + re + ")";
    } else {
        Built kid = random_format(rng, depth + 1);
        static const char* kinds[] = {"optional", "plus", "star", "repeat"};
        const std::string kind = kinds[pick - 4];
        b.format = {{"type", kind}, {"content", kid.format}};
        if (kind == "optional") b.regex = "(?:" + kid.regex + ")?";
        if (kind == "plus") b.regex = "(?:" + kid.regex + ")+";
        if (kind == "star") b.regex = "(?:" + kid.regex + ")*";
        if (kind == "repeat") {
            const int lo = static_cast<int>(rng() % 3), hi = rng() % 3 == 0 ? -1 : lo + static_cast<int>(rng() % 3);
            b.format["min"] = lo;
            b.format["max"] = hi;
            b.regex = "(?:" + kid.regex + "){" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "}";
        }
    }
    return b;
}

// Sequences, alternatives and repeats of literals and patterns accept exactly the strings the equivalent regular
// expression does, and keep exactly its live prefixes.
TEST(StructuralTag, CompositionsAgreeWithTheRegularExpression) {
    std::mt19937 rng(5);
    int accepted = 0, formats = 0;
    for (int round = 0; round < 150; ++round) {
        const Built b = random_format(rng, 0);
        auto t = format_tag(b.format);
        auto r = RegexGrammar::compile(b.regex);
        ASSERT_TRUE(t && r.ok()) << b.regex;
        ++formats;
        for (int k = 0; k < 400; ++k) {
            const std::string s = testing::random_string(rng, "abcd", 7);
            const int st = (*r)->feed((*r)->start(), s);
            const bool want = st >= 0 && (*r)->accepting(st);
            ASSERT_EQ(matches(*t, s), want) << b.format.dump() << " vs " << b.regex << " on '" << s << "'";
            ASSERT_EQ(live(*t, s), st >= 0) << b.format.dump() << " prefix '" << s << "'";
            accepted += want;
        }
    }
    EXPECT_EQ(formats, 150);
    EXPECT_GT(accepted, 2000);
}

// triggered_tags against a brute-force recognizer: free text in which no trigger occurs, each tag whole (its
// begin, content and end) where a trigger starts, the flags.
TEST(StructuralTag, TriggeredTagsAgreeWithARecognizer) {
    struct Tag {
        std::string begin, content, end;  // content: a regular expression
    };
    const std::vector<std::string> triggers = {"<f", "#"};
    const std::vector<Tag> tags = {{"<fa>", "[0-9]+", "</f>"}, {"<fb>", "x?", "</f>"}, {"#", "[a-c]", ";"}};
    Json jtags = Json::array();
    for (const Tag& t : tags)
        jtags.push_back({{"type", "tag"},
                         {"begin", t.begin},
                         {"content", {{"type", "regex"}, {"pattern", t.content}}},
                         {"end", t.end}});
    auto contains_trigger = [&](const std::string& s) {
        for (const std::string& t : triggers)
            if (s.find(t) != std::string::npos) return true;
        return false;
    };
    // Whether s[i:] is (free text)(tag (free text))* with the flags, counting the tags.
    std::function<bool(const std::string&, size_t, int, bool, bool)> rest;
    rest = [&](const std::string& s, size_t i, int seen, bool at_least_one, bool stop_after_first) -> bool {
        if (stop_after_first && seen > 0) return i == s.size();
        for (size_t j = i; j <= s.size(); ++j) {
            const std::string free = s.substr(i, j - i);
            if (contains_trigger(free)) break;
            if (at_least_one && seen == 0 && j > i) break;  // no text before the first tag
            if (j == s.size() && (!at_least_one || seen > 0)) return true;
            for (const Tag& t : tags) {
                if (s.compare(j, t.begin.size(), t.begin) != 0) continue;
                const size_t c0 = j + t.begin.size();
                for (size_t c1 = c0; c1 <= s.size(); ++c1) {
                    if (!std::regex_match(s.substr(c0, c1 - c0), std::regex(t.content))) continue;
                    if (s.compare(c1, t.end.size(), t.end) != 0) continue;
                    if (rest(s, c1 + t.end.size(), seen + 1, at_least_one, stop_after_first)) return true;
                }
            }
        }
        return false;
    };
    std::mt19937 rng(17);
    const std::vector<std::string> pieces = {"<",    "f",    "a",          "b",        ">",   "</f>",
                                             "#",    ";",    "1",          "x",        "c",   " ",
                                             "<fa>", "<fb>", "<fa>12</f>", "<fb></f>", "#b;", "<fb>x</f>"};
    for (const bool at_least_one : {false, true})
        for (const bool stop_after_first : {false, true}) {
            auto t = format_tag({{"type", "triggered_tags"},
                                 {"triggers", triggers},
                                 {"tags", jtags},
                                 {"at_least_one", at_least_one},
                                 {"stop_after_first", stop_after_first}});
            ASSERT_TRUE(t);
            int accepted = 0;
            for (int k = 0; k < 4000; ++k) {
                std::string s;
                for (int n = static_cast<int>(rng() % 5); n > 0; --n) s += pieces[rng() % pieces.size()];
                const bool want = rest(s, 0, 0, at_least_one, stop_after_first);
                ASSERT_EQ(matches(*t, s), want) << at_least_one << stop_after_first << " '" << s << "'";
                if (want) {
                    ++accepted;
                    for (size_t p = 0; p <= s.size(); ++p)
                        ASSERT_TRUE(live(*t, s.substr(0, p))) << "prefix of '" << s << "'";
                }
            }
            EXPECT_GT(accepted, 100) << at_least_one << stop_after_first;
        }
}

// The forms vLLM, SGLang and xgrammar document, on outputs written by hand.
TEST(StructuralTag, DocumentedForms) {
    const Json weather = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
    // vLLM's example (response_format and structured_outputs.structural_tag take this object).
    auto legacy =
        tag_of({{"type", "structural_tag"},
                {"structures", {{{"begin", "<function=get_weather>"}, {"schema", weather}, {"end", "</function>"}}}},
                {"triggers", {"<function="}}});
    ASSERT_TRUE(legacy);
    EXPECT_TRUE(matches(*legacy, ""));
    EXPECT_TRUE(matches(*legacy, "No call."));
    EXPECT_TRUE(matches(*legacy, "Calling: <function=get_weather>{\"city\": \"Boston\"}</function> then more text"));
    EXPECT_TRUE(matches(
        *legacy, "<function=get_weather>{\"city\":\"A\"}</function><function=get_weather>{\"city\":\"B\"}</function>"));
    EXPECT_FALSE(matches(*legacy, "<function=get_weather>{}</function>"));      // city is required
    EXPECT_FALSE(live(*legacy, "<function=get_time>"));                         // no such tag
    EXPECT_FALSE(matches(*legacy, "<function=get_weather>{\"city\": \"B\"}"));  // no end yet
    EXPECT_TRUE(live(*legacy, "<function=get_weather>{\"city\": \"B\"}</func"));
    EXPECT_TRUE(matches(*legacy, "a <function b"));  // text that only looks like the trigger

    // xgrammar's form: reasoning in a tag (any_text stops at the end), then tool calls in free text.
    auto seq =
        format_tag({{"type", "sequence"},
                    {"elements",
                     {{{"type", "tag"}, {"begin", "<think>"}, {"content", {{"type", "any_text"}}}, {"end", "</think>"}},
                      {{"type", "triggered_tags"},
                       {"triggers", {"<function="}},
                       {"tags",
                        {{{"type", "tag"},
                          {"begin", "<function=get_weather>"},
                          {"content", {{"type", "json_schema"}, {"json_schema", weather}}},
                          {"end", "</function>"}}}},
                       {"at_least_one", true},
                       {"stop_after_first", true}}}}});
    ASSERT_TRUE(seq);
    EXPECT_TRUE(matches(*seq, "<think>hmm < / </thin</think><function=get_weather>{\"city\": \"X\"}</function>"));
    EXPECT_FALSE(live(*seq, "<think>a</think>b</think>"));  // the tag ended at the first </think>
    EXPECT_FALSE(live(*seq, "<think>a</think>text"));       // at_least_one: no text before the tag
    EXPECT_FALSE(live(*seq, "<think></think><function=get_weather>{\"city\": \"X\"}</function> more"));
    EXPECT_FALSE(matches(*seq, "<think></think>"));

    // A tag with several ends; tags_with_separator; dispatch; const_string; any_text limits.
    auto ends = format_tag({{"type", "tag"},
                            {"begin", "<r>"},
                            {"content", {{"type", "any_text"}, {"max_chars", 3}}},
                            {"end", {"</r>", "</a>"}}});
    ASSERT_TRUE(ends);
    EXPECT_TRUE(matches(*ends, "<r>αβγ</a>"));  // code points, not bytes
    EXPECT_FALSE(live(*ends, "<r>abcd"));
    EXPECT_FALSE(live(*ends, "<r>a</r>b"));
    // Under max_chars the text is strict UTF-8 (session 57: stray continuation bytes counted as nothing and ran on,
    // and the text could end inside a character).
    EXPECT_FALSE(live(*ends, "<r>L\x91"));
    EXPECT_FALSE(live(*ends, "<r>\x91\xab\x92"));
    EXPECT_FALSE(live(*ends, "<r>\xc0\x80"));      // overlong
    EXPECT_FALSE(live(*ends, "<r>\xed\xa0\x80"));  // a surrogate
    EXPECT_FALSE(live(*ends, "<r>\xe7\xaa</r>"));  // the end inside a character
    EXPECT_TRUE(live(*ends, "<r>\xe7\xaa"));       // (a character under way)
    EXPECT_TRUE(matches(*ends,
                        "<r>\xe7\xaa\xa5\xf0\x9f\x98\x80"
                        "a</r>"));
    EXPECT_FALSE(live(*ends,
                      "<r>\xe7\xaa\xa5\xf0\x9f\x98\x80"
                      "ab"));  // a fourth code point
    auto sep = format_tag({{"type", "tags_with_separator"},
                           {"tags",
                            {{{"type", "tag"},
                              {"begin", "<i>"},
                              {"content", {{"type", "json_schema"}, {"json_schema", {{"type", "integer"}}}}},
                              {"end", "</i>"}}}},
                           {"separator", ","}});
    ASSERT_TRUE(sep);
    for (const char* ok : {"", "<i>1</i>", "<i>1</i>,<i>-2</i>,<i>3</i>"}) EXPECT_TRUE(matches(*sep, ok)) << ok;
    for (const char* bad : {"x", "<i>1</i>,", "<i>1</i> <i>2</i>", "<i>a</i>"}) EXPECT_FALSE(matches(*sep, bad)) << bad;
    auto dispatch =
        format_tag({{"type", "dispatch"},
                    {"rules", Json::array({Json::array({"@n:", {{"type", "regex"}, {"pattern", "[0-9]+;"}}})})},
                    {"loop", false},
                    {"excludes", {"END"}}});
    ASSERT_TRUE(dispatch);
    EXPECT_TRUE(matches(*dispatch, "text @n:42;"));
    EXPECT_TRUE(matches(*dispatch, "text without one"));
    EXPECT_FALSE(live(*dispatch, "text @n:42; after"));  // loop false: the dispatch ends after its format
    EXPECT_FALSE(live(*dispatch, "the END"));
    EXPECT_FALSE(live(*dispatch, "@n:x"));
    auto constant = format_tag({{"type", "const_string"}, {"value", "Answer: 42"}});
    ASSERT_TRUE(constant);
    EXPECT_TRUE(matches(*constant, "Answer: 42"));
    EXPECT_FALSE(live(*constant, "Answer: 43"));
    // disable_any_whitespace reaches the JSON inside.
    auto dense = legacy->without_whitespace();
    EXPECT_TRUE(matches(*dense, "<function=get_weather>{\"city\":\"B\"}</function>"));
    EXPECT_FALSE(live(*dense, "<function=get_weather>{ "));
}

// Refusals name the field inside the tag; unsupported formats are kUnimplemented (the server's 400
// unsupported_parameter), malformed ones kInvalidArgument.
TEST(StructuralTag, RefusalsNameTheField) {
    const Json tag = {{"type", "tag"}, {"begin", "<a>"}, {"content", {{"type", "any_text"}}}, {"end", "</a>"}};
    const struct {
        Json j;
        const char* starts;
        StatusCode code;
    } cases[] = {
        {Json::array(), "must be an object", StatusCode::kInvalidArgument},
        {{{"type", "json_schema"}}, "type: must be", StatusCode::kInvalidArgument},
        {{{"type", "structural_tag"}}, "format: is required", StatusCode::kInvalidArgument},
        {{{"format", {{"type", "nope"}}}}, "format.type: unknown format 'nope'", StatusCode::kInvalidArgument},
        {{{"format", {{"type", "token"}, {"token", 5}}}},
         "format.type: 'token' is a token-level",
         StatusCode::kUnimplemented},
        {{{"format", {{"type", "grammar"}, {"grammar", "root ::= \"a\""}}}},
         "format.type: 'grammar'",
         StatusCode::kUnimplemented},
        {{{"format", {{"type", "sequence"}, {"elements", {tag, {{"type", "const_string"}}}}}}},
         "format.elements[1].value: is required",
         StatusCode::kInvalidArgument},
        {{{"format", {{"type", "triggered_tags"}, {"triggers", {"<b"}}, {"tags", {tag}}}}},
         "format.tags[0].begin: '<a>' does not start with any of the triggers",
         StatusCode::kInvalidArgument},
        {{{"format", {{"type", "triggered_tags"}, {"triggers", Json::array()}, {"tags", {tag}}}}},
         "format.triggers: must be a non-empty",
         StatusCode::kInvalidArgument},
        {{{"format",
           {{"type", "tag"}, {"begin", "<a>"}, {"content", {{"type", "any_text"}}}, {"end", "</a>"}, {"extra", 1}}}},
         "format.extra: unknown field",
         StatusCode::kInvalidArgument},
        {{{"format", {{"type", "json_schema"}, {"json_schema", {{"type", "string"}}}, {"style", "qwen_xml"}}}},
         "format.style: only \"json\"",
         StatusCode::kUnimplemented},
        {{{"format", {{"type", "json_schema"}, {"json_schema", {{"type", "strin"}}}}}},
         "format.json_schema: ",
         StatusCode::kInvalidArgument},
        {{{"format", {{"type", "regex"}, {"pattern", "a("}}}}, "format.pattern: ", StatusCode::kInvalidArgument},
        {{{"format", {{"type", "any_text"}, {"max_tokens", 4}}}},
         "format.max_tokens: is not supported",
         StatusCode::kUnimplemented},
        {{{"format", {{"type", "repeat"}, {"min", 3}, {"max", 2}, {"content", tag}}}},
         "format.max: must be",
         StatusCode::kInvalidArgument},
        {{{"format", {{"type", "tag"}, {"begin", {{"type", "token"}, {"token", 1}}}, {"content", tag}, {"end", "x"}}}},
         "format.begin: token begins",
         StatusCode::kUnimplemented},
        {{{"structures", {{{"begin", "<x>"}, {"schema", {{"type", "object"}}}, {"end", "</x>"}}}},
          {"triggers", {"<y"}}},
         "structures[0].begin: '<x>' does not start",
         StatusCode::kInvalidArgument},
        {{{"structures", {{{"begin", "<x>"}, {"end", "</x>"}}}}, {"triggers", {"<"}}},
         "structures[0].schema: is required",
         StatusCode::kInvalidArgument},
        {{{"format",
           {{"type", "repeat"},
            {"min", 1000},
            {"max", 1000},
            {"content", {{"type", "repeat"}, {"min", 1000}, {"max", 1000}, {"content", tag}}}}}},
         "the structural tag is too large",
         StatusCode::kInvalidArgument},
    };
    for (const auto& c : cases) {
        auto t = StructuralTag::parse(c.j);
        ASSERT_FALSE(t.ok()) << c.j.dump();
        EXPECT_EQ(t.status().message().rfind(c.starts, 0), 0u) << t.status().message();
        EXPECT_EQ(t.status().code(), c.code) << t.status().message();
    }
    // Free text's stop strings are bounded in all (their automata take 1 KB a byte): 17 triggers of 4,096 bytes are
    // over it, 15 are not; a repeat's copies share one automaton.
    Json many = {{"type", "triggered_tags"}, {"triggers", Json::array()}, {"tags", Json::array()}};
    for (int i = 0; i < 17; ++i) {
        const std::string trigger = std::string(4095, 'a') + static_cast<char>('A' + i);
        many["triggers"].push_back(trigger);
        many["tags"].push_back(
            {{"type", "tag"}, {"begin", trigger}, {"content", {{"type", "any_text"}}}, {"end", "e"}});
    }
    auto too_many = StructuralTag::parse({{"format", many}});
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(too_many.status().message().find("too many stop strings"), std::string::npos)
        << too_many.status().message();
    for (int i = 16; i >= 15; --i)
        many["triggers"].erase(static_cast<size_t>(i)), many["tags"].erase(static_cast<size_t>(i));
    auto repeated =
        StructuralTag::parse({{"format", {{"type", "repeat"}, {"min", 50}, {"max", 50}, {"content", many}}}});
    EXPECT_TRUE(repeated.ok()) << repeated.status().message();
    // 32 nested formats are fine; 33 are not.
    Json deep = {{"type", "const_string"}, {"value", "x"}};
    for (int i = 0; i < 31; ++i) deep = {{"type", "optional"}, {"content", deep}};
    EXPECT_TRUE(StructuralTag::parse({{"format", deep}}).ok());
    deep = {{"type", "optional"}, {"content", deep}};
    EXPECT_FALSE(StructuralTag::parse({{"format", deep}}).ok());
}

// What a review found (session 54): repeats of formats that compile to nothing, long chains of empty-matching
// leaves, free text re-entered by epsilons (its threads never merged, so the thread bound dropped valid ones),
// stop-string sets that differ only by a NUL, and an `or` directly inside a tag.
TEST(StructuralTag, ReviewedEdges) {
    const Json empty = {{"type", "const_string"}, {"value", ""}};
    Json nested = empty;
    for (int i = 0; i < 4; ++i) nested = {{"type", "repeat"}, {"min", 1000}, {"max", 1000}, {"content", nested}};
    const auto t0 = std::chrono::steady_clock::now();
    auto big = StructuralTag::parse({{"format", nested}});
    EXPECT_FALSE(big.ok());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);

    // 19 free texts 1,000 times over: 19,001 nodes, a step walks the thread bound, not the chain.
    Json texts = {{"type", "sequence"}, {"elements", Json::array()}};
    for (int i = 0; i < 19; ++i) texts["elements"].push_back({{"type", "any_text"}, {"excludes", {"zq"}}});
    auto chain = format_tag({{"type", "repeat"}, {"min", 1000}, {"max", 1000}, {"content", texts}});
    ASSERT_TRUE(chain);
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_TRUE(matches(*chain, std::string(2000, 'a')));
    EXPECT_FALSE(live(*chain, "azq"));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 2.0);

    const Json any = {{"type", "any_text"}};
    auto two_texts =
        format_tag({{"type", "sequence"}, {"elements", {any, any, {{"type", "const_string"}, {"value", "END"}}}}});
    ASSERT_TRUE(two_texts);
    EXPECT_TRUE(matches(*two_texts, std::string(200, 'a') + "END"));
    const Json t_tag = {
        {"type", "tag"}, {"begin", "<t>"}, {"content", {{"type", "const_string"}, {"value", "x"}}}, {"end", "</t>"}};
    auto loop = format_tag({{"type", "star"}, {"content", {{"type", "sequence"}, {"elements", {any, t_tag}}}}});
    ASSERT_TRUE(loop);
    std::string repeated;
    for (int i = 0; i < 100; ++i) repeated += "a<t>x</t>";
    EXPECT_TRUE(matches(*loop, repeated));
    auto star_text = format_tag(
        {{"type", "tag"}, {"begin", "<a>"}, {"content", {{"type", "star"}, {"content", any}}}, {"end", "</a>"}});
    ASSERT_TRUE(star_text);
    EXPECT_TRUE(matches(*star_text, "<a>" + std::string(100, 'b') + "</a>"));
    auto bounded = format_tag(
        {{"type", "sequence"},
         {"elements", {{{"type", "any_text"}, {"max_chars", 3}}, {{"type", "any_text"}, {"max_chars", 2}}}}});
    ASSERT_TRUE(bounded);
    EXPECT_TRUE(matches(*bounded, "abcde"));
    EXPECT_FALSE(live(*bounded, "abcdef"));

    auto nul = format_tag({{"type", "sequence"},
                           {"elements",
                            {{{"type", "any_text"}, {"excludes", {std::string("a\0b", 3)}}},
                             {{"type", "const_string"}, {"value", "|"}},
                             {{"type", "any_text"}, {"excludes", {"a", "b"}}}}}});
    ASSERT_TRUE(nul);
    EXPECT_TRUE(matches(*nul, "xa|"));
    EXPECT_FALSE(matches(*nul, "x|a"));

    auto alt =
        format_tag({{"type", "tag"},
                    {"begin", "<a>"},
                    {"content", {{"type", "or"}, {"elements", {any, {{"type", "const_string"}, {"value", "z"}}}}}},
                    {"end", "</a>"}});
    ASSERT_TRUE(alt);
    EXPECT_TRUE(matches(*alt, "<a>1</a>"));
    EXPECT_FALSE(live(*alt, "<a>1</a>2</a>"));

    // disable_any_whitespace converts a shared grammar once (a repeat's copies share it).
    Json obj = {{"type", "tag"},
                {"begin", "<j>"},
                {"content", {{"type", "json_schema"}, {"json_schema", {{"type", "object"}}}}},
                {"end", "</j>"}};
    auto many = format_tag({{"type", "repeat"}, {"min", 500}, {"max", 500}, {"content", obj}});
    ASSERT_TRUE(many);
    auto dense = many->without_whitespace();
    std::set<const JsonGrammar*> grammars;
    for (int n = 0; n < dense->num_nodes(); ++n)
        if (dense->node(n).leaf >= 0 && dense->leaf(dense->node(n).leaf).json)
            grammars.insert(dense->leaf(dense->node(n).leaf).json.get());
    EXPECT_EQ(grammars.size(), 1u);
}

// The trie's mask is exactly the tokens whose bytes keep the matcher live (free text taken whole, JSON strings
// taken whole, patterns' loops), from several positions.
TEST(StructuralTag, TrieMaskEqualsFeedingEachToken) {
    const std::vector<std::string> bytes = testing::random_vocab("<f=a>/{}\":1 x\xce\xb1", 6000, 7);
    TokenTrie trie(bytes);
    const Json schema = {{"type", "object"},
                         {"properties", {{"x", {{"type", "string"}}}, {"n", {{"type", "integer"}}}}}};
    const Json json_tag = {{"type", "tag"},
                           {"begin", "<f=a>"},
                           {"content", {{"type", "json_schema"}, {"json_schema", schema}}},
                           {"end", "</f>"}};
    const Json regex_tag = {
        {"type", "tag"}, {"begin", "<f=aa>"}, {"content", {{"type", "regex"}, {"pattern", "[1x]*"}}}, {"end", "</f>"}};
    const Json text_tag = {
        {"type", "tag"}, {"begin", "<f=x>"}, {"content", {{"type", "any_text"}, {"max_chars", 7}}}, {"end", "</f>"}};
    auto t = format_tag({{"type", "triggered_tags"}, {"triggers", {"<f="}}, {"tags", {json_tag, regex_tag, text_tag}}});
    ASSERT_TRUE(t);
    std::vector<uint8_t> mask;
    std::vector<StructuralTagMatcher> levels;
    for (const std::string prefix : {"",
                                     "a",
                                     "<",
                                     "<f",
                                     "<f=",
                                     "<f=a",
                                     "<f=a>",
                                     "<f=a>{\"x\":\"",
                                     "<f=a>{\"x\":\"\xce",
                                     "<f=a>{\"n\":1",
                                     "<f=a>{}",
                                     "<f=a>{}</",
                                     "<f=a>{}</f>",
                                     "<f=aa>1x",
                                     "<f=aa></f>x",
                                     "<f=x>",
                                     "<f=x>ab",
                                     "<f=x>\xce\xb1"
                                     "bcd",
                                     "<f=x>abcdef",
                                     "<f=x>abcdefg"}) {
        StructuralTagMatcher m(*t);
        ASSERT_TRUE(m.feed(prefix)) << prefix;
        const int64_t n = trie.fill_mask(m, &mask, &levels);
        int64_t count = 0;
        for (size_t id = 0; id < bytes.size(); ++id) {
            StructuralTagMatcher copy = m;
            const bool want = !bytes[id].empty() && copy.feed(bytes[id]);
            ASSERT_EQ(mask[id] != 0, want) << "after '" << prefix << "': token '" << bytes[id] << "'";
            count += want;
        }
        EXPECT_EQ(n, count) << prefix;
        EXPECT_GT(n, 0) << prefix;
    }
}

// The Harmony gate with a structural tag: the final message only, <|return|> once the text may end; raw mode from
// the first token.
TEST(StructuralTag, HarmonyFinalMessageAndRawMode) {
    const int32_t final_id = testing::kByteVocabFinal;
    const HarmonyTokenIds ids = testing::kByteVocabIds;
    auto so = testing::byte_vocab_outputs();
    auto t = format_tag(
        {{"type", "tag"}, {"begin", "<"}, {"content", {{"type", "regex"}, {"pattern", "x+"}}}, {"end", ">"}});
    ASSERT_TRUE(t);
    auto c = so->final_json(nullptr, {}, nullptr, nullptr, nullptr, t)->start();
    std::vector<uint8_t> mask;
    EXPECT_FALSE(c->allowed_next(&mask));  // the header is free
    c->accept(ids.channel);
    c->accept(final_id);
    c->accept(ids.message);
    for (char ch : std::string("<xx")) {
        ASSERT_TRUE(c->allowed_next(&mask));
        EXPECT_FALSE(mask[static_cast<size_t>(ids.ret)]);
        ASSERT_TRUE(mask[static_cast<uint8_t>(ch)]) << ch;
        c->accept(static_cast<uint8_t>(ch));
    }
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask['x'] && mask['>']);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 2);
    c->accept('>');
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(ids.ret)]);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
    auto raw = so->raw_json(nullptr, nullptr, nullptr, t)->start();
    ASSERT_TRUE(raw->allowed_next(&mask));
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
    EXPECT_TRUE(mask['<']);
}

// Random outputs drawn under the mask over o200k always match (tool calls in free text, and a forced reasoning
// tag, unbounded or of at most 400 characters, then one call); the mask's cost a step is printed.
TEST(StructuralTagO200k, RandomOutputsUnderTheMaskMatch) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    const std::vector<std::string>& bytes = (*so)->token_bytes();
    const int32_t ret = (*so)->ids().ret;
    const Json weather = {{"type", "object"},
                          {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                          {"required", {"city"}}};
    const Json call = {{"type", "tag"},
                       {"begin", "<function=get_weather>"},
                       {"content", {{"type", "json_schema"}, {"json_schema", weather}}},
                       {"end", "</function>"}};
    const Json think = {
        {"type", "tag"}, {"begin", "<think>"}, {"content", {{"type", "any_text"}}}, {"end", "</think>"}};
    const Json free_calls = {{"type", "triggered_tags"}, {"triggers", {"<function="}}, {"tags", {call}}};
    Json one_call = free_calls;
    one_call["at_least_one"] = true;
    one_call["stop_after_first"] = true;
    const Json reason_then_call = {{"type", "sequence"}, {"elements", {think, one_call}}};
    Json bounded_think = think;
    bounded_think["content"]["max_chars"] = 400;
    const Json bounded_reason_then_call = {{"type", "sequence"}, {"elements", {bounded_think, one_call}}};
    const std::pair<Json, std::string> tags[] = {
        {{{"type", "structural_tag"}, {"format", free_calls}},
         "Checking. <function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function> Done."},
        {{{"type", "structural_tag"}, {"format", reason_then_call}},
         "<think>Let me see.</think><function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function>"},
        {{{"type", "structural_tag"}, {"format", bounded_reason_then_call}},
         "<think>Let me see.</think><function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function>"},
    };
    std::mt19937 rng(3);
    std::vector<uint8_t> mask;
    for (const auto& [j, want_text] : tags) {
        auto t = tag_of(j);
        ASSERT_TRUE(t);
        double mask_ms = 0;
        int steps = 0, done = 0;
        for (int doc = 0; doc < 6; ++doc) {
            auto c = (*so)->raw_json(nullptr, nullptr, nullptr, t)->start();
            std::string out;
            std::string target = want_text;
            for (int step = 0; step < 120; ++step, ++steps) {
                const testing::MaskStep s = testing::mask_step(*c, &mask, &mask_ms);
                ASSERT_TRUE(s.constrained);
                ASSERT_FALSE(s.allowed.empty()) << out;
                // Mostly the longest allowed token that continues `target` (so that the documents go through the
                // structured parts), else any allowed token.
                int32_t pick = s.allowed[rng() % s.allowed.size()];
                if (rng() % 4 != 0) {
                    size_t best = 0;
                    for (int32_t id : s.allowed) {
                        const std::string& b = bytes[static_cast<size_t>(id)];
                        if (b.size() > best && target.compare(0, b.size(), b) == 0) best = b.size(), pick = id;
                    }
                    if (best > 0) target.erase(0, best);
                }
                if (mask[static_cast<size_t>(ret)] && (target.empty() || rng() % 20 == 0)) pick = ret;
                if (pick == ret) {
                    EXPECT_TRUE(matches(*t, out)) << out;
                    ++done;
                    break;
                }
                c->accept(pick);
                out += bytes[static_cast<size_t>(pick)];
                ASSERT_TRUE(live(*t, out)) << out;
            }
        }
        std::printf("structural tag over o200k: %d steps, mask %.3f ms a step; %d outputs ended\n", steps,
                    mask_ms / steps, done);
        EXPECT_GT(done, 0);
    }
}

}  // namespace
}  // namespace gptoss::structured
