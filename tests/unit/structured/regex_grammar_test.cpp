// RegexGrammar: full-match semantics against std::regex (ECMAScript) on random strings, UTF-8 classes, dead
// states pruned (every live prefix can still complete), refusals by position, choices, the token mask against
// feeding each token, the Harmony gate, and the o200k vocabulary under the mask.
#include "structured/regex_grammar.h"

#include <gtest/gtest.h>

#include "unit/structured/test_vocab.h"

#include <chrono>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "structured/harmony_json.h"
#include "structured/json_grammar.h"
#include "unit/structured/mask_step.h"
#include "unit/tokenizer/tokenizer_fixture.h"

namespace gptoss::structured {
namespace {

std::shared_ptr<const RegexGrammar> compile(const std::string& p) {
    auto g = RegexGrammar::compile(p);
    EXPECT_TRUE(g.ok()) << p << ": " << g.status().to_string();
    return g.ok() ? *g : nullptr;
}

bool matches(const RegexGrammar& g, const std::string& s) {
    const int st = g.feed(g.start(), s);
    return st >= 0 && g.accepting(st);
}

// Every prefix of a string the grammar accepts is live, and a dead prefix has no accepted extension: checked by
// the pruning's promise that a live state reaches an accepting one.
bool live(const RegexGrammar& g, const std::string& prefix) { return g.feed(g.start(), prefix) >= 0; }

TEST(RegexGrammar, FullMatchesAgreeWithStdRegex) {
    const char* patterns[] = {
        "abc",         "a|b|cd",      "(ab)*",      "a+b?c{2,3}", "[a-c]{1,4}d?",   "[^ab]+",
        "\\d{2}-\\d+", "\\w+\\s\\w*", "(?:a|bc)+x", "a.c",        "(a|)b{0,2}",     "[a\\-]+",
        "x{3}",        "x{2,}",       "(a?){3}b",   "[0-9a-f]+",  "(cat|car|ca)t?", "a*?b",
        "\\.\\*\\+",   "a{2}?b",      "\\D\\W\\S",  "(a|b)*abb",  "[[]x",           "a{,2}b",
        "^ab$",        "(?P<n>a)b",   "(?<n>a|b)c", "[a-]{2}",    "[\\d\\s]+",      "\\x41\\u0042",
    };
    std::mt19937 rng(7);
    const std::string alphabet = "abcdx0123 -.*+]\n_AB[";
    int total_accepted = 0;
    for (const char* p : patterns) {
        auto g = compile(p);
        ASSERT_TRUE(g) << p;
        std::string ecma = p;
        // ECMAScript spells the named groups (?<n>...) only; (?P<n> is Python's.
        if (const size_t k = ecma.find("(?P<"); k != std::string::npos) ecma.erase(k + 2, 1);
        if (ecma == "a{,2}b") ecma = "a{0,2}b";  // (Python's {,m})
        if (ecma == "(?<n>a)b" || ecma == "(?<n>a|b)c") ecma = ecma.substr(0, 1) + ecma.substr(5);
        const std::regex re(ecma, std::regex::ECMAScript);
        int accepted = 0;
        for (int t = 0; t < 3000; ++t) {
            std::string s;
            const int len = static_cast<int>(rng() % 8);
            for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
            const bool want = std::regex_match(s, re);
            ASSERT_EQ(matches(*g, s), want) << p << " on '" << s << "'";
            if (want) {
                ++accepted;
                for (size_t k = 0; k <= s.size(); ++k) ASSERT_TRUE(live(*g, s.substr(0, k))) << p << " " << s;
            }
        }
        total_accepted += accepted;
    }
    EXPECT_GT(total_accepted, 2000);  // the oracle said yes often enough to mean something
}

TEST(RegexGrammar, CodePointsAndUtf8) {
    auto greek = compile("[α-ω]+!");
    EXPECT_TRUE(matches(*greek, "αβγ!"));
    EXPECT_FALSE(matches(*greek, "ab!"));
    EXPECT_FALSE(matches(*greek, "\xce!"));  // a lead byte alone is not a character
    EXPECT_TRUE(live(*greek, "\xce"));       // ... but may begin one
    EXPECT_FALSE(live(*greek, "\xce\x41"));
    auto dot = compile("a.b");
    EXPECT_TRUE(matches(*dot, "a€b"));
    EXPECT_TRUE(matches(*dot,
                        "a\xf0\x9f\x98\x80"
                        "b"));  // U+1F600
    EXPECT_FALSE(matches(*dot, "a\nb"));
    EXPECT_FALSE(matches(*dot,
                         "a\xed\xa0\x80"
                         "b"));  // a surrogate's encoding is not UTF-8
    EXPECT_FALSE(matches(*dot,
                         "a\xc0\x80"
                         "b"));  // nor an overlong one
    auto neg = compile("[^a]");
    EXPECT_TRUE(matches(*neg, "é"));
    EXPECT_TRUE(matches(*neg, "\xf4\x8f\xbf\xbf"));   // U+10FFFF
    EXPECT_FALSE(matches(*neg, "\xf4\x90\x80\x80"));  // past it
    auto range = compile("[\\u00e0-\\u00ff\\U0001F600]");
    EXPECT_TRUE(matches(*range, "ÿ"));
    EXPECT_TRUE(matches(*range, "\xf0\x9f\x98\x80"));
    EXPECT_FALSE(matches(*range, "\xf0\x9f\x98\x81"));
    // Every 2- and 3-byte prefix of every code point in U+0080..U+FFFF: live exactly when a character of
    // the class can follow (a spot check of the byte-range splitting).
    auto mid = compile("[\\u0800-\\u0fff\\u2000]");
    for (uint32_t c = 0x700; c < 0x2100; ++c) {
        std::string s;
        if (c < 0x800) {
            s = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
        } else {
            s = {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
                 static_cast<char>(0x80 | (c & 0x3F))};
        }
        EXPECT_EQ(matches(*mid, s), (c >= 0x800 && c <= 0xFFF) || c == 0x2000) << std::hex << c;
    }
}

TEST(RegexGrammar, DeadEndsArePruned) {
    auto g = compile("ab|cd|a{3}x");
    EXPECT_TRUE(live(*g, "a"));
    EXPECT_FALSE(live(*g, "ac"));
    EXPECT_TRUE(live(*g, "aa"));
    EXPECT_FALSE(live(*g, "aaaa"));
    // A branch that can never finish ([^\s\S] matches nothing) leaves nothing live behind it.
    auto h = compile("xy[^\\s\\S]|xz");
    EXPECT_FALSE(live(*h, "xy"));
    EXPECT_TRUE(live(*h, "x"));
    EXPECT_FALSE(RegexGrammar::compile("[^\\s\\S]").ok());  // matches nothing at all
    // Python's reading of a ']' first in a class: a literal.
    auto br = compile("[]a]b");
    EXPECT_TRUE(matches(*br, "]b"));
    EXPECT_TRUE(matches(*br, "ab"));
}

TEST(RegexGrammar, RefusalsNameTheProblem) {
    const std::pair<const char*, const char*> bad[] = {
        {"(a)\\1", "backreference"},
        {"(?=a)", "lookahead"},
        {"(?<=a)b", "lookbehind"},
        {"\\bword", "word boundar"},
        {"a++", "possessive"},
        {"(ab", "missing ')'"},
        {"ab)", "unbalanced"},
        {"a{5,2}", "above"},
        {"x{1001}", "repetition"},
        {"*a", "nothing to repeat"},
        {"[a", "unterminated"},
        {"[z-a]", "out of order"},
        {"(?i)a", "inline flags"},
        {"[[:alpha:]]", "POSIX"},
        {"\\q", "unknown escape"},
        {"a\\", "trailing"},
        {"\xff", "UTF-8"},
        {"(a|b)*a(a|b){16}", "too large"},
        {"(((((((((((a{999}){999}){999})))))))))", "too large"},
        {"((a{0,30}){0,30}){0,30}", "too complex"},
        {"(\\w+\\s?){1,1000}", "too complex"},
        {"a**", "multiple repeat"},
        {"a{99999999}", "repetition"},
        {"\\012", "octal"},
        {"\\101", "octal"},  // three octal digits (it said "backreferences", session 57)
        {"[\\1]", "octal"},
        {"(a)\\1", "backreference"},
        {"(a)\\18", "backreference"},
        {"[\\d-z]", "bad character range"},
        {"^*a", "nothing to repeat"},
        {"a$+", "start / end"},
        {"a^b", "start / end"},
        {"a$b", "start / end"},
        {"a{2}{3}", "multiple repeat"},
    };
    for (const auto& [p, words] : bad) {
        auto g = RegexGrammar::compile(p);
        ASSERT_FALSE(g.ok()) << p;
        EXPECT_NE(g.status().message().find(words), std::string::npos) << p << ": " << g.status().message();
    }
    EXPECT_TRUE(RegexGrammar::compile("(a|b)*a(a|b){8}").ok());  // 2^9 states: fine
    // Python's readings: {,} is *, anchors at alternatives' edges, \0 alone is NUL.
    auto star = compile("a{,}b");
    EXPECT_TRUE(matches(*star, "b") && matches(*star, "aaab"));
    auto alts = compile("^ab$|(^c)|(?:^d$)");
    EXPECT_TRUE(matches(*alts, "ab") && matches(*alts, "c") && matches(*alts, "d"));
    auto nul = compile("a\\0");
    EXPECT_TRUE(matches(*nul, std::string("a\0", 2)));
}

TEST(RegexGrammar, Choices) {
    auto g = RegexGrammar::choice({"yes", "no", "yesterday", "ja"});
    ASSERT_TRUE(g.ok());
    for (const char* s : {"yes", "no", "yesterday", "ja"}) EXPECT_TRUE(matches(**g, s)) << s;
    for (const char* s : {"ye", "yesterda", "nope", "", "j"}) EXPECT_FALSE(matches(**g, s)) << s;
    EXPECT_TRUE(live(**g, "yest"));
    EXPECT_FALSE(live(**g, "yess"));
    auto special = RegexGrammar::choice({"a.b", "(x)"});  // literal, not patterns
    ASSERT_TRUE(special.ok());
    EXPECT_TRUE(matches(**special, "a.b"));
    EXPECT_FALSE(matches(**special, "acb"));
    EXPECT_TRUE(matches(**special, "(x)"));
    EXPECT_FALSE(RegexGrammar::choice({}).ok());
    EXPECT_FALSE(RegexGrammar::choice({"a", ""}).ok());
    EXPECT_FALSE(RegexGrammar::choice({"\xff"}).ok());
}

// The trie's mask is exactly the tokens whose bytes keep the automaton live, from several states.
TEST(RegexGrammar, TrieMaskEqualsFeedingEachToken) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    std::mt19937 rng(5);
    const std::string alphabet = "ab01-_ \xce\xb1\xe2\x82\xac";
    for (int i = 0; i < 3000; ++i) {
        std::string w;
        for (int k = 1 + static_cast<int>(rng() % 6); k > 0; --k) w += alphabet[rng() % alphabet.size()];
        bytes.push_back(w);
    }
    bytes.push_back("");  // a special token: never allowed
    TokenTrie trie(bytes);
    auto g = compile("(ab|[0-9]+-)*(α|€)?_?");
    std::vector<uint8_t> mask;
    for (const std::string prefix : {"", "a", "ab01", "ab0-", "α", "ab0-€"}) {
        const int s = g->feed(g->start(), prefix);
        ASSERT_GE(s, 0) << prefix;
        const int64_t n = trie.fill_mask(*g, s, &mask);
        int64_t count = 0;
        for (size_t id = 0; id < bytes.size(); ++id) {
            const bool want = !bytes[id].empty() && g->feed(s, bytes[id]) >= 0;
            ASSERT_EQ(mask[id] != 0, want) << "after '" << prefix << "': token '" << bytes[id] << "'";
            count += want;
        }
        EXPECT_EQ(n, count);
        EXPECT_GT(n, 0);
    }
}

// The Harmony gate with a pattern: the final message only, <|return|> once the text matches; raw mode from
// the first token.
TEST(RegexGrammar, HarmonyFinalMessageAndRawMode) {
    const int32_t final_id = testing::kByteVocabFinal;
    const HarmonyTokenIds ids = testing::kByteVocabIds;
    auto so = testing::byte_vocab_outputs();
    auto g = RegexGrammar::choice({"yes", "no"});
    ASSERT_TRUE(g.ok());
    auto c = so->final_json(nullptr, {}, nullptr, *g)->start();
    std::vector<uint8_t> mask;
    EXPECT_FALSE(c->allowed_next(&mask));  // the header is free
    c->accept(ids.channel);
    c->accept(final_id);
    c->accept(ids.message);
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask['y'] && mask['n']);
    EXPECT_FALSE(mask['x'] || mask[static_cast<size_t>(ids.ret)] || mask[final_id]);
    c->accept('n');
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask['o']);
    EXPECT_FALSE(mask[static_cast<size_t>(ids.ret)]);
    c->accept('o');
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(ids.ret)]);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
    auto raw = so->raw_json(nullptr, *g)->start();
    ASSERT_TRUE(raw->allowed_next(&mask));
    EXPECT_TRUE(mask['y'] && !mask['a']);
}

TEST(RegexGrammarO200k, RandomOutputsUnderTheMaskMatch) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    const std::string pattern = "\\d{3}-[a-z]{2,5}( [A-Z][a-z]{1,8}){0,3}\\.";
    auto g = compile(pattern);
    const std::regex re(pattern, std::regex::ECMAScript);
    const std::vector<std::string>& bytes = (*so)->token_bytes();
    const int32_t ret = (*so)->ids().ret;
    std::mt19937 rng(9);
    std::vector<uint8_t> mask;
    double mask_ms = 0;
    int steps = 0, done = 0;
    for (int doc = 0; doc < 20; ++doc) {
        auto c = (*so)->raw_json(nullptr, g)->start();
        std::string text;
        for (int step = 0; step < 60; ++step, ++steps) {
            const testing::MaskStep s = testing::mask_step(*c, &mask, &mask_ms);
            ASSERT_TRUE(s.constrained);
            const std::vector<int32_t>& allowed = s.allowed;
            ASSERT_FALSE(allowed.empty()) << text;
            const int32_t pick = mask[static_cast<size_t>(ret)] && rng() % 2 ? ret : allowed[rng() % allowed.size()];
            if (pick == ret) {
                EXPECT_TRUE(std::regex_match(text, re)) << text;
                ++done;
                break;
            }
            c->accept(pick);
            text += bytes[static_cast<size_t>(pick)];
            ASSERT_GE(g->feed(g->start(), text), 0) << text;
        }
    }
    std::printf("regex over o200k: %d steps, mask %.3f ms a step; %d outputs ended\n", steps, mask_ms / steps, done);
    EXPECT_GT(done, 5);
}

}  // namespace
}  // namespace gptoss::structured
