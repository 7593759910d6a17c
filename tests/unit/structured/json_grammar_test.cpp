#include "structured/json_grammar.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "structured/harmony_json.h"
#include "unit/structured/mask_step.h"
#include "unit/tokenizer/tokenizer_fixture.h"

namespace gptoss::structured {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const JsonGrammar> compile(const char* schema) {
    auto g = JsonGrammar::compile(Json::parse(schema));
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? *g : nullptr;
}

// Whether `text` is accepted whole (a complete document), and whether it is a prefix of one.
bool complete(const JsonGrammar& g, std::string_view text) {
    JsonMatcher m(g);
    return m.feed(text) && m.accepting();
}
// (append, not operator+: GCC 12 warns falsely on some string sums.)
template <class... T>
std::string cat(const T&... parts) {
    std::string s;
    (s.append(parts), ...);
    return s;
}
bool prefix(const JsonGrammar& g, std::string_view text) {
    JsonMatcher m(g);
    return m.feed(text);
}

TEST(JsonGrammar, AnyObjectAcceptsJsonObjectsOnly) {
    auto g = JsonGrammar::any_object();
    for (const char* ok : {"{}", "{\"a\":1}", " { \"a\" : [1, -2.5e+3, true, null, \"x\\u00e9\\n\", {}] } ",
                           "{\"k\":{\"n\":{\"m\":[[],[{}]]}},\"k\":0}", "{\"\xc3\xa9\":\"\xe2\x82\xac\"}"})
        EXPECT_TRUE(complete(*g, ok)) << ok;
    for (const char* bad : {"[]", "1", "\"s\"", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":1.}",
                            "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{'a':1}", "{\"a\":\"\xc3\"}",
                            "{\"a\":\"\xff\"}", "{\"a\":1}}", "{\"a\":-}"})
        EXPECT_FALSE(complete(*g, bad)) << bad;
    // Prefixes of documents are accepted as such, not as complete.
    EXPECT_TRUE(prefix(*g, "{\"a\":[1,"));
    EXPECT_FALSE(complete(*g, "{\"a\":[1,"));
    EXPECT_TRUE(prefix(*g, "{\"a\":\"\xe2\x82"));  // a character split between tokens
    EXPECT_FALSE(prefix(*g, "x"));
}

TEST(JsonGrammar, WhitespaceRunsAndNumbersAreBounded) {
    auto g = JsonGrammar::any_object();
    // (std::string::append: GCC 12 warns falsely on operator+ here.)
    auto text = [](const char* head, int n, char c) { return std::string(head).append(static_cast<size_t>(n), c); };
    EXPECT_TRUE(prefix(*g, text("{", kMaxWhitespaceRun, ' ')));
    EXPECT_FALSE(prefix(*g, text("{", kMaxWhitespaceRun + 1, ' ')));
    EXPECT_TRUE(prefix(*g, text("{\"a\":", kMaxNumberBytes, '1')));
    EXPECT_FALSE(prefix(*g, text("{\"a\":", kMaxNumberBytes + 1, '1')));
    // Spaces inside strings are not whitespace runs.
    EXPECT_TRUE(prefix(*g, text("{\"a\":\"", 3 * kMaxWhitespaceRun, ' ')));
    // Depth.
    std::string deep = "{\"a\":";
    for (int i = 0; i < kMaxDepth; ++i) deep += "[";
    EXPECT_FALSE(prefix(*g, deep));
}

TEST(JsonGrammar, ObjectPropertiesInOrderWithRequired) {
    auto g = compile(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                         "tags":{"type":"array","items":{"type":"string"}}},"required":["name","tags"]})");
    EXPECT_TRUE(complete(*g, R"({"name":"x","age":3,"tags":[]})"));
    EXPECT_TRUE(complete(*g, R"({"name":"x","tags":["a","b"]})"));
    EXPECT_TRUE(complete(*g, "{\n  \"name\": \"x\",\n  \"tags\": [ \"a\" ]\n}"));
    EXPECT_FALSE(complete(*g, R"({"name":"x"})"));                      // tags required
    EXPECT_FALSE(prefix(*g, R"({"age":3)"));                            // name must come first
    EXPECT_FALSE(prefix(*g, R"({"name":"x","name")"));                  // no repeats
    EXPECT_FALSE(prefix(*g, R"({"name":"x","other")"));                 // no additional properties
    EXPECT_FALSE(prefix(*g, R"({"name":"x","age":3.5)"));               // integer
    EXPECT_FALSE(prefix(*g, R"({"name":1)"));                           // string
    EXPECT_FALSE(prefix(*g, R"({"name":"x","tags":[1)"));               // items are strings
    EXPECT_FALSE(prefix(*g, R"({"nam")") && !prefix(*g, R"({"name)"));  // a key prefix is fine
    EXPECT_TRUE(prefix(*g, R"({"nam)"));
    EXPECT_FALSE(prefix(*g, R"({"nb)"));
}

TEST(JsonGrammar, AdditionalPropertiesAndPrefixKeys) {
    auto g = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"boolean"}},
                         "additionalProperties":{"type":"null"}})");
    EXPECT_TRUE(complete(*g, R"({"a":1,"ab":true,"zz":null})"));
    EXPECT_TRUE(complete(*g, R"({"ab":false})"));
    EXPECT_TRUE(complete(*g, R"({"abc":null})"));
    EXPECT_FALSE(complete(*g, R"({"abc":1})"));
    EXPECT_FALSE(complete(*g, R"({"zz":null,"a":1})"));  // named ones come before the others
    EXPECT_FALSE(complete(*g, R"({"ab":true,"a":1})"));  // a is out of order
}

TEST(JsonGrammar, EnumsConstsUnionsAndNullable) {
    auto g = compile(R"({"type":"object","properties":{
        "unit":{"enum":["celsius","fahrenheit"]},
        "n":{"enum":[1,12,"12"]},
        "c":{"const":{"x":[1,2]}},
        "u":{"anyOf":[{"type":"string"},{"type":"integer"},{"type":"object","properties":{"k":{"type":"null"}}}]},
        "o":{"type":["boolean","null"]},
        "s":{"type":"string","nullable":true}},
        "required":["unit","n","c","u","o","s"]})");
    EXPECT_TRUE(complete(*g, R"({"unit":"celsius","n":12,"c":{"x":[1,2]},"u":"s","o":null,"s":null})"));
    EXPECT_TRUE(complete(*g, R"({"unit":"fahrenheit","n":1,"c":{"x":[1,2]},"u":5,"o":true,"s":"t"})"));
    EXPECT_TRUE(complete(*g, R"({"unit":"fahrenheit","n":"12","c":{"x":[1,2]},"u":{"k":null},"o":false,"s":""})"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"kelvin")"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"celsius","n":2)"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"celsius","n":123)"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"celsius","n":1,"c":{"x":[2)"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"celsius","n":1,"c":{"x":[1,2]},"u":true)"));
    EXPECT_FALSE(prefix(*g, R"({"unit":"celsius","n":1,"c":{"x":[1,2]},"u":1,"o":"x")"));
}

TEST(JsonGrammar, ArraysStringsAndRefs) {
    auto g = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                           "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
                           "required":["v"]}},
                         "type":"object","properties":{
                           "tree":{"$ref":"#/$defs/node"},
                           "pair":{"type":"array","prefixItems":[{"type":"string"},{"type":"number"}],"items":false},
                           "code":{"type":"string","minLength":2,"maxLength":3}},
                         "required":["tree","pair","code"]})");
    EXPECT_TRUE(complete(*g, R"({"tree":{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]},"pair":["a",1.5],"code":"ab"})"));
    EXPECT_TRUE(complete(*g, R"({"tree":{"v":1},"pair":["a",0],"code":"\u00e9\n\u0041"})"));
    EXPECT_FALSE(prefix(*g, R"({"tree":{"v":1,"kids":[{"v":2},{"v":3},)"));      // maxItems 2
    EXPECT_FALSE(prefix(*g, R"({"tree":{"v":1},"pair":["a",1,)"));               // items false
    EXPECT_FALSE(prefix(*g, R"({"tree":{"v":1},"pair":["a",1],"code":"a")"));    // minLength
    EXPECT_FALSE(prefix(*g, R"({"tree":{"v":1},"pair":["a",1],"code":"abcd)"));  // maxLength
    EXPECT_TRUE(prefix(*g, "{\"tree\":{\"v\":1},\"pair\":[\"a\",1],\"code\":\"\xc3\xa9\xc3\xa9\xc3\xa9"));
    EXPECT_FALSE(prefix(*g, "{\"tree\":{\"v\":1},\"pair\":[\"a\",1],\"code\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3"));
    // A $ref is a URI fragment: percent-encoded bytes are decoded before the JSON pointer is read (RFC 6901 §6; it
    // said "names nothing"), and its own escapes still apply.
    auto spaced = compile(R"({"$defs":{"a b":{"const":1},"c/d":{"const":2}},
                             "anyOf":[{"$ref":"#/$defs/a%20b"},{"$ref":"#/$defs/c~1d"}]})");
    ASSERT_NE(spaced, nullptr);
    EXPECT_TRUE(complete(*spaced, "1"));
    EXPECT_TRUE(complete(*spaced, "2"));
    EXPECT_FALSE(complete(*spaced, "3"));
    auto bad = JsonGrammar::compile(Json::parse(R"({"$defs":{"a":{}},"$ref":"#/$defs/a%2"})"));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().to_string().find("not a valid URI fragment"), std::string::npos) << bad.status().to_string();
}

TEST(JsonGrammar, TopLevelScalarsEndWhereTheTextEnds) {
    auto num = compile(R"({"type":"number"})");
    EXPECT_TRUE(complete(*num, "12"));
    EXPECT_TRUE(complete(*num, "-0.5e3 "));
    EXPECT_FALSE(complete(*num, "1."));
    auto lit = compile(R"({"enum":[1,12]})");
    EXPECT_TRUE(complete(*lit, "1"));
    EXPECT_TRUE(complete(*lit, "12"));
    EXPECT_FALSE(complete(*lit, "2"));
    EXPECT_TRUE(complete(*compile("true"), "[{\"x\":null}]"));
}

TEST(JsonGrammar, UnsupportedOrBrokenSchemasAreRefusedByName) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"type":"string","pattern":"^a","maxLength":3})", "/pattern"},
        {R"({"pattern":"^a"})", "/pattern"},
        {R"J({"type":"string","pattern":"(?=a)"})J", "/pattern"},
        {R"({"type":"string","pattern":"^a|b"})", "/pattern"},
        {R"({"type":"string","enum":["a"],"pattern":"a"})", "/pattern"},
        {R"({"type":"string","pattern":"^\u0001$"})", "/pattern"},
        {R"({"type":"string","pattern":7})", "/pattern"},
        {R"({"$defs":{"s":{"type":"string"}},"type":"string","$ref":"#/$defs/s","pattern":"a"})", "/pattern"},
        {R"({"type":"array","uniqueItems":true})", "/uniqueItems"},
        {R"({"multipleOf":2})", "/multipleOf"},
        {R"({"type":"number","multipleOf":0})", "/multipleOf"},
        {R"({"type":"number","multipleOf":-2})", "/multipleOf"},
        {R"({"type":"number","multipleOf":1.0000000000001})", "/multipleOf"},
        {R"({"type":"integer","multipleOf":5,"minimum":1,"maximum":4})", "admits no integer"},
        {R"({"minimum":0})", "/minimum"},
        {R"({"type":"string","maximum":3})", "/maximum"},
        {R"({"type":"integer","enum":[1,2],"minimum":0})", "/minimum"},
        {R"({"type":"integer","minimum":"1"})", "/minimum"},
        {R"({"type":"integer","exclusiveMinimum":true})", "/exclusiveMinimum"},
        {R"({"type":"integer","minimum":3,"maximum":2})", "admits no integer"},
        {R"({"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":2})", "admits no integer"},
        {R"({"type":"number","minimum":1e20})", "admits no number of at most 16 digits"},
        {R"({"type":"thing"})", "/type"},
        {R"({"properties":{"a":{}},"required":["b"]})", "/required/0"},
        {R"({"$ref":"#/$defs/missing"})", "names nothing"},
        {R"({"$ref":"https://example.com/s.json"})", "only references"},
        {R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "cycle"},
        {"false", "no value"},
        {"3", "must be an object"},
        {R"({"type":"array","minItems":3,"maxItems":2})", "/minItems"},
        {R"({"enum":[]})", "/enum"},
        {R"({"allOf":[{"type":"string"},{"minLength":1}]})", "/allOf"},
    };
    for (const auto& [schema, what] : cases) {
        auto g = JsonGrammar::compile(Json::parse(schema));
        ASSERT_FALSE(g.ok()) << schema;
        EXPECT_NE(g.status().to_string().find(what), std::string::npos) << schema << ": " << g.status().to_string();
    }
    // Annotations are ignored (and a format compiles).
    EXPECT_TRUE(JsonGrammar::compile(Json::parse(R"({"title":"T","description":"d","type":"string","format":"date",
                                                     "default":"x","examples":["y"],"$schema":"s"})"))
                    .ok());
}

// A keyword beside $ref / enum / const / anyOf / oneOf / allOf that the compiled form would ignore is refused
// (black-box tests, session 57: an enum beside type integer gave 2.5, a const beside maxLength 2 gave "xyz", a $ref
// beside required gave {}); type beside enum / const keeps the values of that type; annotations and nullable stay
// allowed.
TEST(JsonGrammar, KeywordsBesideAValueDecidingKeyword) {
    const std::pair<const char*, const char*> refused[] = {
        {R"({"type":"string","const":"xyz","maxLength":2})", "/maxLength"},
        {R"({"type":"string","enum":["a","bbbb"],"minLength":2})", "/minLength"},
        {R"({"type":"array","items":{"type":"integer"},"enum":[[1,2],["x"]]})", "/items"},
        {R"({"type":"string","enum":[1,2]})", "has no value of the schema's type"},
        {R"({"type":"integer","const":"x"})", "has no value of the schema's type"},
        {R"({"const":3,"enum":[1,2]})", "/const"},
        {R"({"$defs":{"o":{"type":"object","properties":{"a":{"type":"integer"}}}},"$ref":"#/$defs/o","required":["a"]})",
         "/required"},
        {R"({"anyOf":[{"type":"object"}],"required":["a"]})", "/required"},
        {R"({"oneOf":[{"type":"string"}],"minLength":3})", "/minLength"},
        {R"({"allOf":[{"type":"string"}],"type":"integer"})", "/type"},
        {R"({"enum":["a"],"anyOf":[{"type":"string"}]})", "/anyOf"},
    };
    for (const auto& [schema, what] : refused) {
        auto g = JsonGrammar::compile(Json::parse(schema));
        ASSERT_FALSE(g.ok()) << schema;
        EXPECT_NE(g.status().to_string().find(what), std::string::npos) << schema << ": " << g.status().to_string();
    }
    auto g = compile(R"({"type":"integer","enum":[1,2.5,"a",3.0],"title":"n","description":"d","x-order":1})");
    ASSERT_TRUE(g);
    EXPECT_TRUE(complete(*g, "1"));
    EXPECT_TRUE(complete(*g, "3.0"));
    EXPECT_FALSE(prefix(*g, "2"));
    EXPECT_FALSE(prefix(*g, "\""));
    auto ref = compile(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","nullable":true,"description":"d"})");
    ASSERT_TRUE(ref);
    EXPECT_TRUE(complete(*ref, "null"));  // nullable beside $ref was dropped before
    EXPECT_TRUE(complete(*ref, "\"s\""));
    auto both = compile(R"({"type":["string","null"],"enum":["a",null,1]})");
    ASSERT_TRUE(both);
    EXPECT_TRUE(complete(*both, "null"));
    EXPECT_FALSE(prefix(*both, "1"));
    // Pydantic's shapes: Optional[Model], a defaulted model field, a discriminated union.
    for (const char* ok : {R"({"$defs":{"M":{"type":"object"}},"anyOf":[{"$ref":"#/$defs/M"},{"type":"null"}],
                              "default":null,"title":"X"})",
                           R"({"$defs":{"M":{"type":"object"}},"allOf":[{"$ref":"#/$defs/M"}],"default":{},
                              "description":"d"})",
                           R"({"$defs":{"A":{"type":"object","properties":{"k":{"const":"a"}}},
                                        "B":{"type":"object","properties":{"k":{"const":"b"}}}},
                              "oneOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/B"}],
                              "discriminator":{"propertyName":"k","mapping":{"a":"#/$defs/A","b":"#/$defs/B"}}})"})
        EXPECT_TRUE(JsonGrammar::compile(Json::parse(ok)).ok()) << ok;
}

// A required name that properties does not list is a property of the additional properties' schema (a valid JSON
// Schema, refused before: session 57); where the object takes no others it is still refused.
TEST(JsonGrammar, RequiredBeyondTheListedProperties) {
    auto g = compile(R"({"type":"object","required":["x"]})");
    ASSERT_TRUE(g);
    EXPECT_TRUE(complete(*g, R"({"x":1})"));
    EXPECT_TRUE(complete(*g, R"({"x":[],"y":2})"));
    EXPECT_FALSE(complete(*g, "{}"));
    EXPECT_FALSE(complete(*g, R"({"y":2})"));
    EXPECT_FALSE(prefix(*g, R"({"x":1,"x")"));
    auto typed = compile(R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":
                             {"type":"integer"},"required":["b","a"]})");
    ASSERT_TRUE(typed);
    EXPECT_TRUE(complete(*typed, R"({"a":"s","b":2})"));
    EXPECT_FALSE(prefix(*typed, R"({"a":"s","b":"t")"));
    EXPECT_FALSE(complete(*typed, R"({"a":"s"})"));
    for (const char* bad : {R"({"type":"object","properties":{"a":{}},"required":["b"]})",
                            R"({"type":"object","additionalProperties":false,"required":["b"]})"}) {
        auto r = JsonGrammar::compile(Json::parse(bad));
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("takes no others"), std::string::npos) << r.status().message();
    }
}

// Review findings (session 46): each once crashed, blew up, dead-ended or let the output past the schema.
// A JSON number without exponent (up to 8 digits each side of the point) × 10^8, exactly; nullopt if `s` is not one.
std::optional<int64_t> units(const std::string& s) {
    static const std::regex number("-?(0|[1-9][0-9]{0,7})(\\.[0-9]{1,8})?");
    if (!std::regex_match(s, number)) return std::nullopt;
    const bool negative = s[0] == '-';
    const size_t dot = s.find('.');
    const std::string whole =
        s.substr(negative ? 1 : 0, dot == std::string::npos ? std::string::npos : dot - (negative ? 1 : 0));
    std::string frac = dot == std::string::npos ? "" : s.substr(dot + 1);
    frac.resize(8, '0');
    const int64_t v = std::stoll(whole) * 100000000 + std::stoll(frac);
    return negative ? -v : v;
}

// minimum / maximum / exclusive bounds: every string of up to 4 characters over digits, '.' and '-' (and random
// longer ones) is accepted exactly when it is a JSON number inside the bounds (an integer for type integer); every
// prefix the matcher keeps can still end inside them (a random walk over the bytes it allows always finishes).
TEST(JsonGrammar, NumberBoundsAreExact) {
    struct Case {
        const char* bounds;
        std::optional<int64_t> lo, hi;  // micro-units
        bool lo_ex, hi_ex;
        std::optional<int64_t> step = std::nullopt;  // multipleOf, micro-units
    };
    const Case cases[] = {
        {R"("minimum":0)", 0, std::nullopt, false, false},
        {R"("maximum":0)", std::nullopt, 0, false, false},
        {R"("minimum":-5,"maximum":5)", -5000000, 5000000, false, false},
        {R"("exclusiveMinimum":0)", 0, std::nullopt, true, false},
        {R"("minimum":1.5,"maximum":2.25)", 1500000, 2250000, false, false},
        {R"("exclusiveMinimum":-0.5,"exclusiveMaximum":0.5)", -500000, 500000, true, true},
        {R"("minimum":10,"maximum":99)", 10000000, 99000000, false, false},
        {R"("minimum":-100,"exclusiveMaximum":-99.5)", -100000000, -99500000, false, true},
        {R"("minimum":2,"exclusiveMinimum":true,"maximum":9.99)", 2000000, 9990000, true, false},
        {R"("minimum":7,"maximum":7)", 7000000, 7000000, false, false},
        {R"("minimum":0.001,"maximum":-0.0,"exclusiveMaximum":0.01)", 1000, 0, false, false},  // maximum -0 wins
        {R"("exclusiveMinimum":3,"minimum":3)", 3000000, std::nullopt, true, false},
        {R"("maximum":1e2,"minimum":-2.5e-1)", -250000, 100000000, false, false},
        {R"("multipleOf":0.25,"minimum":-1,"maximum":3)", -1000000, 3000000, false, false, 250000},
        {R"("multipleOf":3)", std::nullopt, std::nullopt, false, false, 3000000},
        {R"("multipleOf":7,"exclusiveMinimum":14,"maximum":100)", 14000000, 100000000, true, false, 7000000},
        {R"("multipleOf":0.01)", std::nullopt, std::nullopt, false, false, 10000},
        {R"("multipleOf":0.5,"exclusiveMaximum":2)", std::nullopt, 2000000, false, true, 500000},
        {R"("multipleOf":1.5,"minimum":-3)", -3000000, std::nullopt, false, false, 1500000},
    };
    const std::string alphabet = "0123456789.-";
    std::mt19937 rng(3);
    for (const Case& c : cases) {
        for (const char* type : {"number", "integer"}) {
            const std::string schema = cat("{\"type\":\"", type, "\",", c.bounds, "}");
            auto compiled = JsonGrammar::compile(Json::parse(schema));
            const bool integer = type[0] == 'i';
            auto inside = [&](const std::string& s) {
                const std::optional<int64_t> v = units(s);
                if (!v || (integer && s.find('.') != std::string::npos)) return false;
                if (c.lo && (*v < *c.lo * 100 || (c.lo_ex && *v == *c.lo * 100))) return false;
                if (c.hi && (*v > *c.hi * 100 || (c.hi_ex && *v == *c.hi * 100))) return false;
                return !c.step || *v % (*c.step * 100) == 0;
            };
            if (!compiled.ok()) {  // only where nothing fits (the 0.001..0 case)
                EXPECT_TRUE(c.lo && c.hi && *c.lo > *c.hi) << schema << ": " << compiled.status().to_string();
                continue;
            }
            const JsonGrammar& g = **compiled;
            int yes = 0;
            auto check = [&](const std::string& s) {
                const bool want = inside(s);
                ASSERT_EQ(complete(g, s), want) << schema << " on '" << s << "'";
                yes += want;
            };
            std::string s;
            for (int len = 1; len <= 4; ++len) {
                for (int code = 0, total = static_cast<int>(std::pow(12, len)); code < total; ++code) {
                    s.clear();
                    for (int k = 0, x = code; k < len; ++k, x /= 12) s.push_back(alphabet[static_cast<size_t>(x % 12)]);
                    check(s);
                    if (::testing::Test::HasFatalFailure()) return;
                }
            }
            for (int t = 0; t < 3000; ++t) {
                s.clear();
                const int len = 5 + static_cast<int>(rng() % 4);  // (within units()' 8 digits)
                if (rng() % 2) s.push_back('-');
                for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % 11]);  // digits and '.'
                check(s);
                if (::testing::Test::HasFatalFailure()) return;
            }
            EXPECT_GT(yes, 0) << schema;
            // Random walks over the allowed bytes never strand: each ends inside the bounds.
            for (int walk = 0; walk < 60; ++walk) {
                JsonMatcher m(g);
                std::string out;
                for (int step = 0;; ++step) {
                    std::vector<char> next;
                    for (char b : alphabet) {
                        JsonMatcher copy = m;
                        if (copy.feed(std::string(1, b))) next.push_back(b);
                    }
                    if (m.accepting() && (next.empty() || rng() % 4 == 0)) break;
                    ASSERT_FALSE(next.empty()) << schema << ": stranded after '" << out << "'";
                    ASSERT_LT(step, 40) << schema << " " << out;
                    const char b = next[rng() % next.size()];
                    ASSERT_TRUE(m.feed(std::string(1, b)));
                    out.push_back(b);
                }
                EXPECT_TRUE(out.size() > 8 || inside(out)) << schema << ": '" << out << "'";
                if (out.size() <= 8) continue;
                EXPECT_TRUE(m.accepting());
            }
        }
    }
    // A type list keeps the types that have a value within the bounds.
    auto mixed = compile(R"({"type":["integer","number","null"],"minimum":0.1,"maximum":0.9})");
    ASSERT_TRUE(mixed);
    EXPECT_TRUE(complete(*mixed, "0.5"));
    EXPECT_TRUE(complete(*mixed, "null"));
    EXPECT_FALSE(complete(*mixed, "1"));
    EXPECT_FALSE(JsonGrammar::compile(Json::parse(R"({"type":["integer"],"minimum":0.1,"maximum":0.9})")).ok());
    // ... but not one that only the 16-digit cap empties (refused, named); nullable still admits null.
    auto capped = JsonGrammar::compile(Json::parse(R"({"type":["number","string"],"minimum":1e17})"));
    ASSERT_FALSE(capped.ok());
    EXPECT_NE(capped.status().message().find("16 digits"), std::string::npos) << capped.status().message();
    auto null_only = compile(R"({"type":["integer"],"minimum":0.5,"maximum":0.7,"nullable":true})");
    ASSERT_TRUE(null_only);
    EXPECT_TRUE(complete(*null_only, "null"));
    EXPECT_FALSE(prefix(*null_only, "0"));
    // Inside a document, with other values after the number; no exponent under bounds.
    auto age = compile(R"({"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":150},
                           "score":{"type":["number","null"],"exclusiveMinimum":0,"maximum":1}},"required":["age"]})");
    ASSERT_TRUE(age);
    EXPECT_TRUE(complete(*age, R"({"age":42,"score":0.5})"));
    EXPECT_TRUE(complete(*age, R"({"age":150,"score":null})"));
    EXPECT_TRUE(complete(*age, R"({"age": 0 , "score":1})"));
    EXPECT_FALSE(complete(*age, R"({"age":151})"));
    EXPECT_TRUE(prefix(*age, R"({"age":-)"));  // -0 is 0
    EXPECT_FALSE(prefix(*age, R"({"age":-1)"));
    EXPECT_FALSE(prefix(*age, R"({"age":-0.)"));  // an integer
    EXPECT_FALSE(prefix(*age, R"({"age":2e)"));
    EXPECT_TRUE(prefix(*age, R"({"age":42,"score":1.00)"));  // 1.0... is 1, then only zeros
    EXPECT_FALSE(prefix(*age, R"({"age":42,"score":1.01)"));
    EXPECT_FALSE(complete(*age, R"({"age":42,"score":0})"));
    EXPECT_FALSE(prefix(*age, R"({"age":42,"score":-)"));
}

// uniqueItems where the items are literals (an enum, via $ref too, or booleans): an array is accepted exactly when its
// values are distinct; a walk over the allowed bytes never strands (no ',' once every value is used).
TEST(JsonGrammar, UniqueItemsOfLiterals) {
    const std::vector<std::string> values = {"\"a\"", "\"b\"", "1", "12", "true", "null"};
    auto g = compile(R"({"$defs":{"V":{"enum":["a","b",1,12,true,null]}},"type":"array","items":{"$ref":"#/$defs/V"},
                         "uniqueItems":true,"minItems":1})");
    ASSERT_TRUE(g);
    std::mt19937 rng(12);
    int yes = 0;
    for (int t = 0; t < 4000; ++t) {
        const int len = static_cast<int>(rng() % 8);
        std::vector<size_t> picks;
        std::string text = "[";
        for (int k = 0; k < len; ++k) {
            picks.push_back(rng() % values.size());
            text += (k ? (rng() % 2 ? ", " : ",") : "") + values[picks.back()];
        }
        text += "]";
        std::vector<size_t> sorted = picks;
        std::sort(sorted.begin(), sorted.end());
        const bool want = len >= 1 && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
        ASSERT_EQ(complete(*g, text), want) << text;
        yes += want;
    }
    EXPECT_GT(yes, 300);
    const std::string alphabet = "[],\"ab12truenl ";
    for (int walk = 0; walk < 200; ++walk) {
        JsonMatcher m(*g);
        std::string out;
        for (int step = 0; !m.accepting() || rng() % 4 != 0; ++step) {
            std::vector<char> next;
            for (char b : alphabet) {
                JsonMatcher copy = m;
                if (copy.feed(std::string(1, b))) next.push_back(b);
            }
            ASSERT_FALSE(next.empty()) << "stranded after " << out;
            ASSERT_LT(step, 400) << out;
            const char b = next[rng() % next.size()];
            ASSERT_TRUE(m.feed(std::string(1, b)));
            out.push_back(b);
        }
        EXPECT_TRUE(Json::parse(out).is_array()) << out;
    }
    auto flags = compile(R"({"type":"array","items":{"type":"boolean"},"uniqueItems":true})");
    ASSERT_TRUE(flags);
    EXPECT_TRUE(complete(*flags, "[true,false]"));
    EXPECT_FALSE(complete(*flags, "[false,false]"));
    EXPECT_FALSE(prefix(*flags, "[true,false,"));
    EXPECT_TRUE(
        complete(*compile(R"({"type":"array","items":{"type":"string"},"uniqueItems":false})"), R"(["a","a"])"));
    // 1 and 1.0 are one value (JSON Schema's equality): one literal, written as first listed (session 57: [2,1,1.0]).
    auto nums = compile(R"({"type":"array","items":{"enum":[1,1.0,2]},"uniqueItems":true,"minItems":2})");
    ASSERT_TRUE(nums);
    EXPECT_TRUE(complete(*nums, "[2,1]"));
    EXPECT_FALSE(prefix(*nums, "[1,1.0"));
    EXPECT_FALSE(prefix(*nums, "[1.0"));
    EXPECT_FALSE(prefix(*nums, "[2,1,"));  // both values used: no third item
    for (const char* bad : {R"({"type":"array","items":{"type":"string"},"uniqueItems":true})",
                            R"({"type":"array","items":{"enum":["a"]},"uniqueItems":true,"minItems":2})",
                            R"({"type":"array","prefixItems":[{"const":1}],"items":{"enum":[2]},"uniqueItems":true})",
                            R"({"uniqueItems":true})", R"({"type":"array","items":{"const":1},"uniqueItems":"yes"})"}) {
        auto r = JsonGrammar::compile(Json::parse(bad));
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("/"), std::string::npos) << r.status().message();
    }
}

TEST(JsonGrammar, RecursionBoundsAndCanonicalKeys) {
    // A $ref back to the root inside an anyOf: refused as a cycle when nothing else ends it, fine beside null.
    EXPECT_FALSE(JsonGrammar::compile(Json::parse(R"({"anyOf":[{"$ref":"#"}]})")).ok());
    auto list = compile(R"({"anyOf":[{"type":"null"},{"type":"array","items":{"$ref":"#"},"maxItems":2}]})");
    EXPECT_TRUE(complete(*list, "[[null],[[],null]]"));
    EXPECT_TRUE(complete(*list, "null"));
    // A required self-reference admits no finite document.
    auto inf =
        JsonGrammar::compile(Json::parse(R"({"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},
        "required":["c"]}},"$ref":"#/$defs/n"})"));
    ASSERT_FALSE(inf.ok());
    EXPECT_NE(inf.status().message().find("no finite document"), std::string::npos) << inf.status().to_string();
    // An anyOf option with no finite document is dropped: only the other can be started.
    auto drop = compile(R"({"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},"required":["c"]}},
        "anyOf":[{"$ref":"#/$defs/n"},{"type":"string"}]})");
    EXPECT_FALSE(prefix(*drop, "{"));
    EXPECT_TRUE(complete(*drop, "\"s\""));
    // Repeated type names are refused (each copy compiled its properties again: 2^depth).
    EXPECT_FALSE(JsonGrammar::compile(Json::parse(R"({"type":["object","object"]})")).ok());
    std::string deep = R"({"type":"string"})";
    for (int i = 0; i < 16; ++i)  // 2^16 nodes' worth
        deep = R"({"type":["object","array"],"properties":{"x":)" + deep + R"(},"items":)" + deep + "}";
    EXPECT_FALSE(JsonGrammar::compile(Json::parse(deep)).ok());  // over the node budget, not minutes of compiling
    // More anyOf options than are followed at once: refused, not silently cut.
    std::string many = R"({"anyOf":[)";
    for (int i = 0; i <= kMaxThreads; ++i) many = cat(many, i ? "," : "", R"({"const":)", std::to_string(i), "}");
    EXPECT_FALSE(JsonGrammar::compile(Json::parse(cat(many, "]}"))).ok());
    // Numbers end within their byte bound; exponents stay within a double's range.
    auto num = compile(R"({"type":"number"})");
    const std::string d38(38, '1'), d39(39, '1');
    EXPECT_FALSE(prefix(*num, cat(d39, ".")));
    EXPECT_TRUE(complete(*num, cat(d38, "e1")));
    EXPECT_FALSE(prefix(*num, cat(d38, "e-")));
    EXPECT_TRUE(complete(*num, "1e99"));
    EXPECT_FALSE(prefix(*num, "1e100"));
    // A container opens only where its children fit under the depth bound.
    auto any = JsonGrammar::any_object();
    std::string nest = "{";
    for (int i = 0; i < kMaxDepth - 2; ++i) nest.append(R"("k":{)");
    EXPECT_TRUE(prefix(*any, nest));
    EXPECT_FALSE(prefix(*any, cat(nest, R"("k":{)")));
    EXPECT_TRUE(prefix(*any, cat(nest, R"("k":1)")));
    // Keys are canonical: \u0061 would be "a" another way (a repeat, or a value of the wrong type).
    auto keys = compile(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})");
    EXPECT_FALSE(prefix(*keys, R"({"\u0061")"));
    EXPECT_FALSE(prefix(*keys, R"({"a":1,"\u0061")"));
    EXPECT_TRUE(complete(*keys, R"({"a":1,"b\n":"x"})"));
    // properties {} alone takes only {} (OpenAI's strict reading).
    auto empty = compile(R"({"type":"object","properties":{}})");
    EXPECT_TRUE(complete(*empty, "{}"));
    EXPECT_FALSE(prefix(*empty, "{\""));
}

// Strings are strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
TEST(JsonGrammar, StringsAreStrictUtf8) {
    auto g = compile(R"({"type":"string"})");
    for (const char* ok :
         {"\"\xe2\x82\xac\"", "\"\xf0\x9f\x98\x80\"", "\"\xed\x9f\xbf\"", "\"\xf4\x8f\xbf\xbf\"", "\"\xc2\x80\""})
        EXPECT_TRUE(complete(*g, ok)) << ok;
    for (const char* bad : {"\"\xe0\x80\x80\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
                            "\"\xf0\x80\x80\x80\"", "\"\xf5\x80\x80\x80\"", "\"\x80\""})
        EXPECT_FALSE(prefix(*g, bad)) << bad;
}

// The token mask against the byte matcher: a token is in the mask exactly when feeding its bytes
// succeeds, for every state along random documents (the subtree shortcut included).
// `pattern` on strings: ECMA-262 search semantics (std::regex_search on the decoded value) on random strings,
// spelled directly or with short escapes; \u escapes are not followed.
TEST(JsonGrammar, StringPatternsAgreeWithStdRegexSearch) {
    const char* patterns[] = {"^[0-9]{3}-[0-9]{4}$",
                              "ab",
                              "^a",
                              "b$",
                              "^(a|bc)+$",
                              "a.c",
                              "^$",
                              "[\"\\\\]x",
                              "^\\d+(\\.\\d{1,2})?$",
                              "x|y",
                              "^\\w+@\\w+\\.com$",
                              "^a\\nb$"};
    std::mt19937 rng(17);
    const std::string alphabet = "abcxy019-.@\"\\\n";
    int accepted = 0;
    for (const char* p : patterns) {
        const std::string schema = Json{{"type", "string"}, {"pattern", p}}.dump();
        auto g = JsonGrammar::compile(Json::parse(schema));
        ASSERT_TRUE(g.ok()) << p << ": " << g.status().to_string();
        const std::regex re(p, std::regex::ECMAScript);
        for (int t = 0; t < 2000; ++t) {
            std::string value;
            for (int k = static_cast<int>(rng() % 9); k > 0; --k) value += alphabet[rng() % alphabet.size()];
            const bool want = std::regex_search(value, re);
            // The value as JSON text (nlohmann escapes " \ and \n with the short forms).
            const std::string doc = Json(value).dump();
            ASSERT_EQ(complete(**g, doc), want) << p << " on " << doc;
            accepted += want;
            if (want) {
                // Every prefix of an accepted document is live (no dead end on the way).
                for (size_t k = 0; k < doc.size(); ++k) ASSERT_TRUE(prefix(**g, doc.substr(0, k))) << p << doc;
            }
        }
    }
    EXPECT_GT(accepted, 1000);
    // No dead ends: a live prefix of JSON text (escapes, quotes and all) is complete or some byte leads on.
    for (const char* p : patterns) {
        auto g = JsonGrammar::compile(Json{{"type", "string"}, {"pattern", p}});
        ASSERT_TRUE(g.ok());
        for (int t = 0; t < 3000; ++t) {
            std::string text = "\"";
            for (int k = static_cast<int>(rng() % 7); k > 0; --k) text += "abc019-.@\"\\nxy"[rng() % 15];
            JsonMatcher m(**g);
            if (!m.feed(text) || m.accepting()) continue;
            bool on = false;
            for (int b = 0; b < 256 && !on; ++b) {
                JsonMatcher probe = m;
                on = probe.feed(std::string(1, static_cast<char>(b)));
            }
            ASSERT_TRUE(on) << p << ": the live prefix " << text << " has no way on";
        }
    }
    auto ab = compile(R"({"type":"string","pattern":"^ab$"})");
    EXPECT_TRUE(complete(*ab, "\"ab\""));
    EXPECT_FALSE(prefix(*ab, "\"\\u0061"));  // \u escapes are not followed under a pattern
    EXPECT_FALSE(prefix(*ab, "\"b"));
    EXPECT_FALSE(complete(*ab, "\"a\""));
    // Inside an object, beside other properties and in a nullable type list.
    auto obj = compile(R"({"type":"object","properties":{"id":{"type":["string","null"],"pattern":"^[A-Z]{2}\\d$"},
                           "n":{"type":"integer"}},"required":["id","n"]})");
    EXPECT_TRUE(complete(*obj, R"({"id":"AB1","n":3})"));
    EXPECT_TRUE(complete(*obj, R"({"id":null,"n":3})"));
    EXPECT_FALSE(complete(*obj, R"({"id":"A1","n":3})"));
    EXPECT_FALSE(prefix(*obj, R"({"id":"ABC)"));
}

// String formats held as patterns (OpenAI's strict-mode set less ipv6 and duration); others, and a format
// beside minLength / maxLength, stay annotations.
TEST(JsonGrammar, StringFormats) {
    const std::tuple<const char*, std::vector<const char*>, std::vector<const char*>> cases[] = {
        {"date",
         {"2024-02-29", "2000-02-29", "1999-12-31", "2023-04-30", "2023-02-28"},
         {"2024-13-01", "2024-1-01", "24-01-01", "2024-01-32", "3030-02-30", "2023-02-29", "1900-02-29", "2023-04-31",
          "2023-11-31"}},
        {"time", {"23:59:60Z", "08:30:00.123+05:30", "00:00:00z"}, {"24:00:00Z", "08:30:00", "8:30:00Z"}},
        {"date-time",
         {"2024-06-01T12:00:00Z", "2024-06-01t12:00:00.5-07:00", "2024-02-29T00:00:00Z"},
         {"2024-06-01 12:00:00Z", "2024-06-01", "3030-02-30T02:02:02Z", "2023-06-31T00:00:00Z"}},
        {"email", {"a.b+c@example.com", "x@y"}, {"@example.com", "a@", "a b@c.d"}},
        {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567-e89b-12d3-a456-42661417400", "xyz"}},
        {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "1.2.3", "01.2.3.4"}},
        {"hostname",
         {"example.com", "a-b.c", "x", "a.b.c.d"},
         {"-a.com", "a..b", "a_b.com", "a.b.c.d.e"}},  // (at most 4 labels: the name within 253 bytes)
    };
    for (const auto& [format, good, bad] : cases) {
        auto g = JsonGrammar::compile(Json{{"type", "string"}, {"format", format}});
        ASSERT_TRUE(g.ok()) << format << ": " << g.status().to_string();
        for (const char* v : good) EXPECT_TRUE(complete(**g, Json(v).dump())) << format << " " << v;
        for (const char* v : bad) EXPECT_FALSE(complete(**g, Json(v).dump())) << format << " " << v;
    }
    for (const char* free : {R"({"type":"string","format":"date","maxLength":20})",
                             R"({"type":"string","format":"color"})", R"({"type":"string","format":"ipv6"})"})
        EXPECT_TRUE(complete(*compile(free), "\"not a date\"")) << free;
}

// 30 properties of 32 anyOf options with the pattern a{1000} took 75 s of a core to compile (each pattern bounded
// alone): a distinct pattern compiles once, and all of them together are bounded, so such schemas take well under a
// second either way.
TEST(JsonGrammar, ManyPatternsAreCompiledOnceAndBoundedTogether) {
    auto schema = [](bool distinct) {
        Json props = Json::object();
        int k = 0;
        for (int p = 0; p < 30; ++p) {
            Json options = Json::array();
            for (int o = 0; o < 32; ++o) {
                std::string pattern = "a{";
                pattern += std::to_string(distinct ? 1000 - k++ : 1000);
                pattern += '}';
                options.push_back(Json{{"type", "string"}, {"pattern", pattern}});
            }
            std::string name = "p";
            name += std::to_string(p);
            props[name] = Json{{"anyOf", options}};
        }
        return Json{{"type", "object"}, {"properties", props}};
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto same = JsonGrammar::compile(schema(false));
    ASSERT_TRUE(same.ok()) << same.status().to_string();
    std::string doc = "{\"p0\":\"";
    doc.append(1000, 'a');
    doc += "\"}";
    EXPECT_TRUE(complete(**same, doc));
    auto distinct = JsonGrammar::compile(schema(true));
    ASSERT_FALSE(distinct.ok());
    EXPECT_NE(distinct.status().to_string().find("automaton states in all"), std::string::npos)
        << distinct.status().to_string();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 20.0);  // was minutes; ~1-2 s here in a debug build on 2 cores
}

TEST(TokenTrie, MaskEqualsFeedingEachToken) {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t :
         {"{\"",    "\":",      "\",",      "\"}",      "\"}}",        "},",           "]}",       "[\"",
          "name",   "na",       "nam",      "ab",       "abc",         " \"",          "  ",       "\n  ",
          "\\n",    "\\u00",    "true",     "null",     "false",       "12",           "-1",       ".5",
          "e+",     "\xc3\xa9", "\xc3",     "\xa9\"",   "caf\xc3\xa9", "\xe2\x82\xac", "\xe2\x82", "\x82\xac",
          "\"\xe2", "\xed",     "\xa0\x80", "\x9f\xbf", "\xf0\x9f",    "\x98\x80",     "\xf4\x90", "hello world",
          " world", "x\"",      "\"x",      ",\"",      "\":\"",       "\": ",         "\":[",     "1,",
          "\t",     "\r\n"})
        vocab.push_back(t);
    vocab.push_back("");  // an id that is never allowed (a special)
    TokenTrie trie(vocab);
    auto schemas = {
        JsonGrammar::any_object(),
        compile(R"({"type":"object","properties":{"name":{"type":"string","maxLength":5},
                    "tags":{"type":"array","items":{"enum":["ab","abc",12]}}},"required":["name"]})"),
        // Other keys beside named ones (plain keys), two string alternatives alive at once.
        compile(R"({"type":"object","properties":{"na":{"type":"string"}},
                    "additionalProperties":{"anyOf":[{"enum":["ab","x\u00e9"]},{"type":"string","maxLength":3}]}})"),
        // Patterns: one followed byte by byte, one whose loop takes plain-text subtrees whole.
        compile(R"({"type":"object","properties":{"t":{"type":"string","pattern":"^[a-z \\n]*x?$"}}})"),
        compile(R"({"type":"object","properties":{"name":{"type":"string","pattern":"^(ab|café)( world)?\\n?$"}}})"),
        // Numbers held to bounds (multi-digit tokens, a sign, a fraction).
        compile(R"({"type":"array","items":{"type":"number","minimum":-1.5,"exclusiveMaximum":12}})"),
        // Unique literal items (the array remembers the values used).
        compile(R"({"type":"array","items":{"enum":["ab","abc",12,1]},"uniqueItems":true})"),
    };
    std::mt19937 rng(7);
    std::vector<uint8_t> mask;
    std::vector<JsonMatcher> levels;
    for (const auto& g : schemas) {
        for (int doc = 0; doc < 20; ++doc) {
            JsonMatcher m(*g);
            for (int step = 0; step < 40; ++step) {
                const int64_t n = trie.fill_mask(m, &mask, &levels);
                std::vector<int> allowed;
                for (size_t id = 0; id < vocab.size(); ++id) {
                    JsonMatcher probe = m;
                    const bool fits = !vocab[id].empty() && probe.feed(vocab[id]);
                    ASSERT_EQ(mask[id] != 0, fits) << "token '" << vocab[id] << "' at step " << step;
                    if (fits) allowed.push_back(static_cast<int>(id));
                }
                ASSERT_EQ(n, static_cast<int64_t>(allowed.size()));
                if (m.accepting() || allowed.empty()) break;
                ASSERT_TRUE(m.feed(vocab[static_cast<size_t>(allowed[rng() % allowed.size()])]));
            }
        }
    }
}

// Random documents drawn under the mask over o200k for a schema with patterns: every finished one matches them;
// the mask's cost a step is printed (a permissive pattern takes plain-text subtrees whole where its DFA loops).
struct DrawnDocuments {
    int steps = 0, done = 0;
    double ms = 0;  // mask time, summed
};

// Documents of `g` drawn under the o200k mask (raw completions): each step an allowed token at random, <|return|> as
// soon as it is allowed, past `close_after` steps the last allowed token for which `closes(bytes)` holds; `check` gets
// every finished document. At most `max_steps` steps a document.
void draw_documents(const HarmonyStructuredOutputs& so, const std::shared_ptr<const JsonGrammar>& g, int docs,
                    int max_steps, int close_after, uint32_t seed,
                    const std::function<bool(const std::string&)>& closes,
                    const std::function<void(const std::string&)>& check, DrawnDocuments* r) {
    const std::vector<std::string>& bytes = so.token_bytes();
    const int32_t ret = so.ids().ret;
    std::mt19937 rng(seed);
    std::vector<uint8_t> mask;
    for (int doc = 0; doc < docs; ++doc) {
        auto c = so.raw_json(g)->start();
        std::string out;
        for (int step = 0; step < max_steps; ++step, ++r->steps) {
            const testing::MaskStep s = testing::mask_step(*c, &mask, &r->ms);
            ASSERT_TRUE(s.constrained);
            ASSERT_FALSE(s.allowed.empty()) << out;
            int32_t pick = mask[static_cast<size_t>(ret)] ? ret : s.allowed[rng() % s.allowed.size()];
            if (step > close_after && pick != ret)
                for (int32_t id : s.allowed)
                    if (closes(bytes[static_cast<size_t>(id)])) pick = id;
            if (pick == ret) {
                check(out);
                ++r->done;
                break;
            }
            c->accept(pick);
            out += bytes[static_cast<size_t>(pick)];
        }
    }
}

TEST(JsonGrammarO200k, PatternStringsUnderTheMask) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    auto g = compile(R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},
                         "note":{"type":"string","pattern":"^[^<>]*$"}},"required":["code","note"]})");
    ASSERT_TRUE(g);
    const std::regex code("^[A-Z]{2}-[0-9]{3}$"), note("^[^<>]*$");
    DrawnDocuments r;
    // Prefer a closing quote past 30 steps so that the note can end.
    draw_documents(
        **so, g, 6, 60, 30, 4, [](const std::string& t) { return t == "\"" || t == "\"}"; },
        [&](const std::string& out) {
            const Json j = Json::parse(out);
            EXPECT_TRUE(std::regex_search(j["code"].get<std::string>(), code)) << out;
            EXPECT_TRUE(std::regex_search(j["note"].get<std::string>(), note)) << out;
        },
        &r);
    std::printf("pattern schema over o200k: %d steps, mask %.3f ms a step; %d documents ended\n", r.steps,
                r.ms / r.steps, r.done);
    EXPECT_GT(r.done, 0);
}

// Numbers held to bounds under the o200k mask (multi-digit tokens): every finished document's numbers are inside them.
TEST(JsonGrammarO200k, BoundedNumbersUnderTheMask) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    auto g = compile(R"({"type":"object","properties":{
        "xs":{"type":"array","items":{"type":"number","minimum":-2.5,"exclusiveMaximum":1000},"maxItems":6},
        "n":{"type":"integer","minimum":18,"maximum":120,"multipleOf":3}},"required":["xs","n"]})");
    ASSERT_TRUE(g);
    DrawnDocuments r;
    // Past 40 steps prefer structure over more digits, so that the document closes.
    draw_documents(
        **so, g, 8, 80, 40, 8, [](const std::string& t) { return t.find_first_of("],}") != std::string::npos; },
        [](const std::string& out) {
            const Json j = Json::parse(out);
            for (const Json& x : j["xs"]) EXPECT_TRUE(x.get<double>() >= -2.5 && x.get<double>() < 1000) << out;
            const int64_t n = j["n"].get<int64_t>();
            EXPECT_TRUE(n >= 18 && n <= 120 && n % 3 == 0) << out;
        },
        &r);
    std::printf("bounded numbers over o200k: %d steps, mask %.3f ms a step; %d documents ended\n", r.steps,
                r.ms / r.steps, r.done);
    EXPECT_GT(r.done, 0);
}

}  // namespace
}  // namespace gptoss::structured
