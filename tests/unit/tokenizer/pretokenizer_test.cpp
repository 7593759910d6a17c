// The pre-tokenizer: the hand-written o200k splitter against PCRE2 running the pattern itself, its
// Unicode classes against PCRE2's, known splits, and the PCRE2 path for other patterns.
#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "tokenizer/unicode_classes.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace gptoss::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

Pieces split(const PreTokenizer& pre, std::string_view text) {
    Pieces pieces;
    pre.split(text, [&](std::string_view p) { pieces.emplace_back(p); });
    return pieces;
}

// Anchored single-character PCRE2 matcher.
class Pcre2Class {
public:
    explicit Pcre2Class(const char* pattern) {
        int err;
        PCRE2_SIZE off;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
        data_ = pcre2_match_data_create(1, nullptr);
    }
    ~Pcre2Class() {
        pcre2_match_data_free(data_);
        pcre2_code_free(code_);
    }
    bool operator()(const std::string& s) const {
        return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, data_, nullptr) >= 0;
    }

private:
    pcre2_code* code_;
    pcre2_match_data* data_;
};

// Our table is Unicode 16.0 (what tiktoken and Hugging Face use); Debian 12's PCRE2 is Unicode 14.0.
// They must agree wherever PCRE2 knows the character.
TEST(UnicodeClasses, AgreeWithPcre2ForEveryCodePointItKnows) {
    Pcre2Class upper("[\\p{Lu}\\p{Lt}]"), lower("\\p{Ll}"), letter_other("[\\p{Lm}\\p{Lo}]"), mark("\\p{M}"),
        number("\\p{N}"), unassigned("\\p{Cn}");
    const auto& table = UnicodeClassTable::get();
    int newer = 0;
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        std::string s = utf8(cp);
        CharClass expected = upper(s)          ? CharClass::kUpper
                             : lower(s)        ? CharClass::kLower
                             : letter_other(s) ? CharClass::kLetterOther
                             : mark(s)         ? CharClass::kMark
                             : number(s)       ? CharClass::kNumber
                                               : CharClass::kOther;
        CharClass got = table.lookup(cp);
        if (got == CharClass::kSpace || got == CharClass::kNewline) got = CharClass::kOther;  // checked below
        if (got == expected) continue;
        ASSERT_TRUE(unassigned(s) && expected == CharClass::kOther)
            << "U+" << std::hex << cp << ": ours " << static_cast<int>(got) << ", PCRE2 " << static_cast<int>(expected);
        ++newer;
    }
    EXPECT_LT(newer, 20000) << "characters assigned after Unicode 14";
    for (uint32_t cp : {0x09u, 0x0Bu, 0x0Cu, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x2029u, 0x202Fu,
                        0x205Fu, 0x3000u}) {
        EXPECT_EQ(table.lookup(cp), CharClass::kSpace) << std::hex << cp;
    }
    EXPECT_EQ(table.lookup('\n'), CharClass::kNewline);
    EXPECT_EQ(table.lookup('\r'), CharClass::kNewline);
    EXPECT_EQ(table.lookup(0x180E), CharClass::kOther);  // not White_Space since Unicode 6.3
    EXPECT_EQ(table.lookup(0x200B), CharClass::kOther);
    EXPECT_EQ(table.lookup(0x11F00), CharClass::kMark);         // Kawi, Unicode 15.0
    EXPECT_EQ(table.lookup(0x2EBF0), CharClass::kLetterOther);  // CJK Extension I, 15.1
    EXPECT_EQ(table.lookup(0x105C0), CharClass::kLetterOther);  // Todhri, 16.0
}

TEST(RewriteWhiteSpace, ReplacesEscapesInAndOutOfClasses) {
    const std::string ws =
        "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";
    EXPECT_EQ(rewrite_white_space_escapes("\\s+"), "[" + ws + "]+");
    EXPECT_EQ(rewrite_white_space_escapes("\\S"), "[^" + ws + "]");
    EXPECT_EQ(rewrite_white_space_escapes("[^\\s\\p{L}]"), "[^" + ws + "\\p{L}]");
    EXPECT_EQ(rewrite_white_space_escapes("\\\\s"), "\\\\s");           // an escaped backslash, then 's'
    EXPECT_EQ(rewrite_white_space_escapes("[]\\s]"), "[]" + ws + "]");  // leading ']' is literal
    EXPECT_EQ(rewrite_white_space_escapes("[[:alpha:]\\s]x"), "[[:alpha:]" + ws + "]x");
    EXPECT_EQ(rewrite_white_space_escapes("[\\S]"), "[\\S]");  // no class-body form; PCRE2's own
}

TEST(O200kSplitter, KnownSplits) {
    auto pre = PreTokenizer::create(kO200kPattern);
    ASSERT_TRUE(pre.ok());
    ASSERT_TRUE((*pre)->uses_fast_path());
    const std::pair<std::string, Pieces> kCases[] = {
        {"Hello world", {"Hello", " world"}},
        {"   hello", {"  ", " hello"}},
        {"hello   ", {"hello", "   "}},
        {"don't STOP'S we'LL I'd", {"don't", " STOP'S", " we'LL", " I'd"}},
        {"HTTPServer parseJSON", {"HTTPServer", " parse", "JSON"}},
        {"$100,000.50", {"$", "100", ",", "000", ".", "50"}},
        {"1234567", {"123", "456", "7"}},
        {"a\n\n  b", {"a", "\n\n", " ", " b"}},
        {"x \r\n\ty", {"x", " \r\n", "\ty"}},
        {"//comment\n/**/", {"//", "comment", "\n", "/**/"}},
        {"foo();\n", {"foo", "();\n"}},
        {" ?!", {" ?!"}},
        {"?!\n\n/x", {"?!\n\n/", "x"}},
        {"<|end|>", {"<|", "end", "|>"}},
        {"naïve CAFÉ", {"naïve", " CAFÉ"}},
        {"中文abc", {"中文abc"}},
        {"\u0301x", {"\u0301x"}},
        {"\u0301 ", {"\u0301", " "}},
        {"ǅemal", {"ǅemal"}},
        {"a\u00a0b", {"a", "\u00a0b"}},
        {"a \u3000", {"a", " \u3000"}},
        {"it\u017fs 'ſ", {"it\u017fs", " '", "ſ"}},
        {"A's", {"A's"}},
    };
    for (const auto& [text, expected] : kCases) EXPECT_EQ(split(**pre, text), expected) << text;
}

// Random text mixing the characters each alternative cares about; PCRE2 runs the pattern itself.
TEST(O200kSplitter, MatchesPcre2OnRandomText) {
    auto fast = PreTokenizer::create(kO200kPattern, /*fast_path=*/true);
    auto slow = PreTokenizer::create(kO200kPattern, /*fast_path=*/false);
    ASSERT_TRUE(fast.ok() && slow.ok());
    ASSERT_TRUE((*fast)->uses_fast_path());
    ASSERT_FALSE((*slow)->uses_fast_path());
    static const char* kAtoms[] = {
        "a",    "z",      "A",          "Z",          "0",         "9",      " ",      " ",  "  ",  "\t",
        "\n",   "\r",     "\r\n",       "\x0b",       "'",         "'s",     "'S",     "'t", "'re", "'VE",
        "'m",   "'ll",    "'D",         "'x",         "\u017f",    ".",      "!",      "/",  "//",  "<|",
        "|>",   "\"",     "-",          "_",          "\u0301",    "\u0903", "\u20dd", "é",  "É",   "ß",
        "ǅ",    "ʰ",      "ー",         "中",         "の",        "я",      "Я",      "²",  "½",   "Ⅻ",
        "٣",    "\u00a0", "\u3000",     "\u2028",     "\u0085",    "\u180e", "\u200b", "😀",  "€",   "\x00",
        "\x1f", "\u00ad", "\U00011F00", "\U000105C0", "\U0001E5D0"};
    Pcre2Class unassigned("\\p{Cn}");
    const auto& table = UnicodeClassTable::get();
    std::mt19937 rng(2024);
    for (int i = 0; i < 20000; ++i) {
        std::string text;
        size_t len = 1 + rng() % 24;
        for (size_t k = 0; k < len; ++k) {
            if (rng() % 8) {
                text += kAtoms[rng() % (sizeof(kAtoms) / sizeof(kAtoms[0]))];
                continue;
            }
            uint32_t cp;
            std::string s;
            do {
                cp = rng() % 0x110000;
                s = (cp >= 0xD800 && cp < 0xE000) ? std::string() : utf8(cp);
                // Skip characters newer than PCRE2's Unicode, where only our table is right.
            } while (s.empty() || (unassigned(s) && table.lookup(cp) != CharClass::kOther));
            text += s;
        }
        if (text.find("\U00011F00") != std::string::npos || text.find("\U000105C0") != std::string::npos ||
            text.find("\U0001E5D0") != std::string::npos) {
            continue;  // atoms newer than PCRE2's tables: kept above for the fast path's own sake only
        }
        Pieces a = split(**fast, text), b = split(**slow, text);
        ASSERT_EQ(a, b) << "case " << i << ": " << ::testing::PrintToString(text);
    }
}

TEST(PreTokenizer, Pcre2PathKeepsGapsAndSkipsEmptyMatches) {
    auto pre = PreTokenizer::create("a+");
    ASSERT_TRUE(pre.ok());
    EXPECT_FALSE((*pre)->uses_fast_path());
    EXPECT_EQ(split(**pre, "xxaayaz"), Pieces({"xx", "aa", "y", "a", "z"}));
    auto empty = PreTokenizer::create("b*");
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(split(**empty, "abbé"), Pieces({"a", "bb", "é"}));
    auto bad = PreTokenizer::create("(");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    // \s means White_Space, not PCRE2's own set (which has U+180E).
    auto ws = PreTokenizer::create("\\s+|\\S+");
    ASSERT_TRUE(ws.ok());
    EXPECT_EQ(split(**ws, "a\u180e b"), Pieces({"a\u180e", " ", "b"}));
}

}  // namespace
}  // namespace gptoss::tokenizer
