// EbnfGrammar: regular grammars against the regex DFA on random strings, recursive grammars against hand-written
// recognizers (every prefix the matcher keeps can still finish, every one it drops cannot), refusals by line and
// column, dead rules dropped, the stack bound, the token mask against feeding each token, the Harmony gate, and
// the o200k vocabulary under the mask.
#include "structured/ebnf_grammar.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "structured/harmony_json.h"
#include "structured/json_grammar.h"
#include "structured/regex_grammar.h"
#include "unit/structured/mask_step.h"
#include "unit/structured/test_vocab.h"
#include "unit/tokenizer/tokenizer_fixture.h"

namespace gptoss::structured {
namespace {

std::shared_ptr<const EbnfGrammar> compile(const std::string& text) {
    auto g = EbnfGrammar::compile(text);
    EXPECT_TRUE(g.ok()) << text << ": " << g.status().to_string();
    return g.ok() ? *g : nullptr;
}

bool matches(const EbnfGrammar& g, const std::string& s) {
    EbnfMatcher m(g);
    return m.feed(s) && m.accepting();
}
bool live(const EbnfGrammar& g, const std::string& s) {
    EbnfMatcher m(g);
    return m.feed(s);
}

// Regular grammars against the regex DFA (itself checked against std::regex): full matches and live prefixes.
TEST(EbnfGrammar, RegularGrammarsAgreeWithTheRegexDfa) {
    const std::pair<const char*, const char*> pairs[] = {
        {R"G(root ::= "abc")G", "abc"},
        {R"G(root ::= "a" | "b" | "cd")G", "a|b|cd"},
        {R"G(root ::= ("ab")*)G", "(ab)*"},
        {R"G(root ::= "a"+ "b"? "c"{2,3})G", "a+b?c{2,3}"},
        {R"G(root ::= [a-c]{1,4} "d"?)G", "[a-c]{1,4}d?"},
        {R"G(root ::= [^ab]+)G", "[^ab]+"},
        {"root ::= x y x\nx ::= [0-9]\ny ::= \"-\"+", "[0-9]-+[0-9]"},
        {"root ::= item (\",\" item)*\nitem ::= \"a\" | \"bc\"", "(a|bc)(,(a|bc))*"},
        {R"G(root ::= "a" . "c")G", "a[\\s\\S]c"},
        {R"G(root ::= "x"{3} | "y"{2,} | "a"{,2} "b")G", "x{3}|y{2,}|a{0,2}b"},
        {R"G(root ::= ("a" | "") "b"{0,2})G", "(a|)b{0,2}"},
        {R"G(root ::= [a\-]+)G", "[a\\-]+"},
        {R"G(root ::= ("a"|"b")* "abb")G", "(a|b)*abb"},
        {"# a comment\nroot ::= a\n  | b # more\na ::= \"a\"\nb ::= \"b\" \"b\"", "a|bb"},
        {R"G(root ::= "\x41\u0042\n" [\]] "\"")G", "AB\\n\\]\""},
        {"root ::= e \"!\"\ne ::= f?\nf ::= \"z\"", "z?!"},
        {"root ::= w (\" \" w)*\nw ::= [a-d]+", "[a-d]+( [a-d]+)*"},
        {"root ::= (a | b)+\na ::= \"0\" b?\nb ::= \"1\"", "(01?|1)+"},
    };
    std::mt19937 rng(11);
    const std::string alphabet = "abcdxy0123 -,.\n]AB\"!z";
    int accepted = 0;
    for (const auto& [grammar, pattern] : pairs) {
        auto g = compile(grammar);
        auto r = RegexGrammar::compile(pattern);
        ASSERT_TRUE(g && r.ok()) << grammar;
        for (int t = 0; t < 3000; ++t) {
            const std::string s = testing::random_string(rng, alphabet, 7);
            const int st = (*r)->feed((*r)->start(), s);
            const bool want = st >= 0 && (*r)->accepting(st);
            ASSERT_EQ(matches(*g, s), want) << grammar << " on '" << s << "'";
            ASSERT_EQ(live(*g, s), st >= 0) << grammar << " prefix '" << s << "'";
            accepted += want;
        }
    }
    EXPECT_GT(accepted, 500);  // the random strings do reach the matches
}

// Balanced brackets and arithmetic: recursion the regex cannot express, checked against recognizers.
TEST(EbnfGrammar, RecursiveGrammarsAgreeWithRecognizers) {
    auto parens = compile(R"G(root ::= ( "(" root ")" | "[" root "]" )*)G");
    ASSERT_TRUE(parens);
    // A prefix is live while every closer matches the innermost opener; complete when none is open.
    auto bracket_state = [](const std::string& s, bool* ok) {
        std::string open;
        *ok = true;
        for (char c : s) {
            if (c == '(' || c == '[') {
                open += c;
            } else if ((c == ')' && !open.empty() && open.back() == '(') ||
                       (c == ']' && !open.empty() && open.back() == '[')) {
                open.pop_back();
            } else {
                *ok = false;
            }
        }
        return open.size();
    };
    std::mt19937 rng(3);
    int balanced = 0;
    for (int t = 0; t < 20000; ++t) {
        const std::string s = testing::random_string(rng, "()[]", 12);
        bool ok = true;
        const size_t open = bracket_state(s, &ok);
        ASSERT_EQ(live(*parens, s), ok) << s;
        ASSERT_EQ(matches(*parens, s), ok && open == 0) << s;
        balanced += ok && open == 0;
    }
    EXPECT_GT(balanced, 200);

    auto arith = compile(R"G(
        root   ::= expr
        expr   ::= term (("+" | "-") term)*
        term   ::= factor (("*" | "/") factor)*
        factor ::= [0-9]+ | "(" expr ")" | "-" factor
    )G");
    ASSERT_TRUE(arith);
    // Recursive descent over the same language.
    std::function<bool(const std::string&, size_t&)> expr, term, factor;
    factor = [&](const std::string& s, size_t& i) -> bool {
        if (i < s.size() && s[i] >= '0' && s[i] <= '9') {
            while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
            return true;
        }
        if (i < s.size() && s[i] == '-') return factor(s, ++i);
        if (i < s.size() && s[i] == '(') {
            if (!expr(s, ++i) || i >= s.size() || s[i] != ')') return false;
            ++i;
            return true;
        }
        return false;
    };
    term = [&](const std::string& s, size_t& i) -> bool {
        if (!factor(s, i)) return false;
        while (i < s.size() && (s[i] == '*' || s[i] == '/'))
            if (!factor(s, ++i)) return false;
        return true;
    };
    expr = [&](const std::string& s, size_t& i) -> bool {
        if (!term(s, i)) return false;
        while (i < s.size() && (s[i] == '+' || s[i] == '-'))
            if (!term(s, ++i)) return false;
        return true;
    };
    auto full = [&](const std::string& s) {
        size_t i = 0;
        return expr(s, i) && i == s.size();
    };
    int exprs = 0;
    for (int t = 0; t < 20000; ++t) {
        const std::string s = testing::random_string(rng, "12+-*/()", 9);
        const bool want = full(s);
        ASSERT_EQ(matches(*arith, s), want) << s;
        exprs += want;
        // Live: some completion exists. Every live prefix is completed by closing its parentheses after a digit.
        if (live(*arith, s)) {
            int depth = 0;
            for (char c : s) depth += c == '(' ? 1 : c == ')' ? -1 : 0;
            // An operand if the prefix ends in an operator or an opener, then the closers.
            std::string done = s;
            if (done.empty() || (done.back() != ')' && (done.back() < '0' || done.back() > '9'))) done.push_back('1');
            done.append(static_cast<size_t>(std::max(depth, 0)), ')');
            EXPECT_TRUE(full(done)) << "the live prefix '" << s << "' has no completion '" << done << "'";
        }
    }
    EXPECT_GT(exprs, 500);
}

// The vLLM documentation's example (indented, blank lines) and llama.cpp's JSON grammar.
TEST(EbnfGrammar, PublishedExamples) {
    auto sql = compile(R"G(
    root ::= select_statement

    select_statement ::= "SELECT " column " from " table " where " condition

    column ::= "col_1 " | "col_2 "

    table ::= "table_1 " | "table_2 "

    condition ::= column "= " number

    number ::= "1 " | "2 "
)G");
    ASSERT_TRUE(sql);
    EXPECT_TRUE(matches(*sql, "SELECT col_1  from table_2  where col_2 = 1 "));
    EXPECT_FALSE(matches(*sql, "SELECT col_3  from table_2  where col_2 = 1 "));
    auto json = compile(R"G(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)G");
    ASSERT_TRUE(json);
    for (const char* ok : {"{}", "{\"a\": [1, 2.5, \"x\\n\", {\"b\": null}], \"c\": true}", "{ \"é\":-0.5e+3}"})
        EXPECT_TRUE(matches(*json, ok)) << ok;
    for (const char* bad : {"[]", "{\"a\" 1}", "{\"a\": tru}", "{\"a\":\"\x01\"}", "{\"a\": [1,]}"})
        EXPECT_FALSE(matches(*json, bad)) << bad;
    EXPECT_TRUE(live(*json, "{\"a\": [1, {\"b\""));
}

TEST(EbnfGrammar, RefusalsNameTheProblem) {
    const std::pair<const char*, const char*> bad[] = {
        {"root ::= a", "'a' is not defined"},
        {"root ::= \"x\"\nroot ::= \"y\"", "defined twice"},
        {"start ::= \"x\"", "no rule named 'root'"},
        {"root ::= root \"x\" | \"y\"", "left-recursive"},
        {"root ::= a\na ::= b \"x\"\nb ::= a | \"y\"", "left-recursive"},
        {"root ::= \"x\"? root \"y\" | \"z\"", "left-recursive"},
        {"root ::= e root \"y\" | \"z\"\ne ::= \"q\"*", "left-recursive"},
        {"root ::= \"a\" root", "no finite output"},
        {"root ::= \"abc", "unterminated string"},
        {"root ::= [abc", "unterminated character class"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"\\x4\"", "hex digits"},
        {"root ::= \"\\uD800\"", "not a character"},
        {"root ::= \"a\"{3,2}", "minimum is above"},
        {"root ::= \"a\"{1001}", "above 1000"},
        {"root ::= \"a\"{x}", "repetition count"},
        {"root ::= [z-a]", "out of order"},
        {"root = \"a\"", "expected '::='"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= \"a\")", "unbalanced ')'"},
        {"root ::= *", "nothing to repeat"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
        {"", "no rules"},
        {"::= \"a\"", "expected a rule name"},
        {"root ::= ((((\"a\"){1000}){1000}){1000})", "too large"},
    };
    for (const auto& [text, words] : bad) {
        auto g = EbnfGrammar::compile(text);
        ASSERT_FALSE(g.ok()) << text;
        EXPECT_NE(g.status().message().find(words), std::string::npos) << text << ": " << g.status().message();
    }
    auto g = EbnfGrammar::compile("root ::= a\n\na ::= \"x\"\n  | b\n");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("line 4, column 5"), std::string::npos) << g.status().message();
    // Right recursion is fine; so is a nullable rule after a character.
    EXPECT_TRUE(EbnfGrammar::compile("root ::= \"x\" root | \"y\"").ok());
    EXPECT_TRUE(EbnfGrammar::compile("root ::= \"x\" e root | \"\"\ne ::= \"q\"*").ok());
}

// Lark's form (as vLLM converts it for xgrammar): rules and alternatives, both quotes, ranges, [optional], ~
// repeats, aliases and comments; refusals by line.
TEST(EbnfGrammar, LarkForm) {
    const std::string lark = R"L(
// The vLLM documentation's SQL example, in Lark
?start: select_statement
?select_statement: "SELECT " column " from " table [" where " condition]
column: "col_1 " | 'col_2 '    # both quotes
table: "table_1 "
     | "table_2 " -> second
condition: column "= " NUMBER
NUMBER.2: DIGIT~1..3
DIGIT: "0".."9"
)L";
    ASSERT_TRUE(EbnfGrammar::looks_like_lark(lark));
    EXPECT_FALSE(EbnfGrammar::looks_like_lark("root ::= \"a\"  # start: x"));
    EXPECT_FALSE(EbnfGrammar::looks_like_lark("  \n// nothing\n"));
    auto text = EbnfGrammar::lark_to_gbnf(lark);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    auto g = compile(*text);
    ASSERT_TRUE(g) << *text;
    EXPECT_TRUE(matches(*g, "SELECT col_1  from table_2 "));
    EXPECT_TRUE(matches(*g, "SELECT col_2  from table_1  where col_1 = 42"));
    EXPECT_FALSE(matches(*g, "SELECT col_2  from table_1  where col_1 = 4242"));
    EXPECT_FALSE(matches(*g, "SELECT col_3  from table_1 "));
    auto quotes = EbnfGrammar::lark_to_gbnf("start: 'say \"hi\"' | \"it\\'s\" x~2\nx: \"x\"");
    ASSERT_TRUE(quotes.ok()) << quotes.status().to_string();
    auto q = compile(*quotes);
    ASSERT_TRUE(q) << *quotes;
    EXPECT_TRUE(matches(*q, "say \"hi\""));
    EXPECT_TRUE(matches(*q, "it\\'sxx"));  // (Lark keeps the backslash of \' in a "string")
    const std::pair<const char*, const char*> bad[] = {
        {"start: /[a-z]+/x", "line 1: the regular-expression flag 'x'"},
        {"start: /a(/", "line 1: /a(/: the pattern at offset 2"},
        {"start: /abc", "unterminated regular expression"},
        {"start: \"ab\"..\"c\"", "one character each side"},
        {"%import python.NAME\nstart: \"a\"", "line 1: only Lark's common terminals"},
        {"%import common.NOPE\nstart: \"a\"", "no terminal 'NOPE'"},
        {"%import common.WS\nstart: \"a\"\nWS: \" \"", "line 3: 'WS' is defined twice"},
        {"%declare X\nstart: \"a\"", "line 1: the directive %declare is not supported"},
        {"start: _sep{\"a\"}", "templates"},
        {"start: \"a\"\nstart: \"b\"", "line 2: 'start' is defined twice"},
        {"rule: \"a\"", "no start rule"},
        {"start: \"a\"\n| \"b\"\nfoo bar", "line 3: expected ':'"},
        {"| \"a\"", "before any rule"},
        {"start: [\"a\"", "unbalanced '['"},
        {"start: x~", "count"},
        {"start: root\nroot: \"a\"", "rename"},
    };
    for (const auto& [t, words] : bad) {
        auto r = EbnfGrammar::lark_to_gbnf(t);
        ASSERT_FALSE(r.ok()) << t;
        EXPECT_NE(r.status().message().find(words), std::string::npos) << t << ": " << r.status().message();
    }
}

// The Lark grammar's language on a few texts: each of `yes` accepted whole, none of `no`.
void expect_lark(const std::string& lark, std::initializer_list<std::string> yes,
                 std::initializer_list<std::string> no) {
    auto text = EbnfGrammar::lark_to_gbnf(lark);
    ASSERT_TRUE(text.ok()) << lark << ": " << text.status().to_string();
    auto g = compile(*text);
    ASSERT_TRUE(g) << *text;
    for (const std::string& t : yes) EXPECT_TRUE(matches(*g, t)) << lark << " on '" << t << "'";
    for (const std::string& t : no) EXPECT_FALSE(matches(*g, t)) << lark << " on '" << t << "'";
}

// Lark's regular-expression terminals are the patterns RegexGrammar reads (checked against std::regex in
// regex_grammar_test), with or without the i flag (against std::regex's icase here); the s flag lets '.' match '\n'.
TEST(EbnfGrammar, LarkRegexTerminalsAreThePatterns) {
    const char* patterns[] = {
        "abc",         "a|b|cd",    "(ab)*",      "a+b?c{2,3}", "[a-c]{1,4}d?", "[^ab]+",       "\\d{2}-\\d+",
        "\\w+\\s\\w*", "a.c",       "(a|)b{0,2}", "[a\\-]+",    "x{2,}",        "(a?){3}b",     "(cat|car|ca)t?",
        "\\.\\*\\+",   "\\D\\W\\S", "(a|b)*abb",  "[[]x",       "[\\d\\s]+",    "\\x41\\u0042", "[^\\n]*x",
    };
    std::mt19937 rng(11);
    const std::string alphabet = "abcdxABCX0123 -.*+]\n_[";
    int accepted = 0;
    for (const char* p : patterns) {
        for (const bool icase : {false, true}) {
            const std::string lark = std::string("start: /") + p + (icase ? "/i" : "/");
            auto text = EbnfGrammar::lark_to_gbnf(lark);
            ASSERT_TRUE(text.ok()) << lark << ": " << text.status().to_string();
            auto g = compile(*text);
            ASSERT_TRUE(g) << lark << " -> " << *text;
            const std::regex re(p, icase ? std::regex::ECMAScript | std::regex::icase : std::regex::ECMAScript);
            for (int t = 0; t < 1500; ++t) {
                std::string s;
                const int len = static_cast<int>(rng() % 8);
                for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
                const bool want = std::regex_match(s, re);
                ASSERT_EQ(matches(*g, s), want) << lark << " -> " << *text << " on '" << s << "'";
                accepted += want;
            }
        }
    }
    EXPECT_GT(accepted, 1500);
    expect_lark("start: /a.b/ | /c.d/s", {"a-b", "c\nd"}, {"a\nb"});
    // Case-insensitive strings, beyond ASCII too (Latin-1, Greek's three sigmas, Cyrillic).
    expect_lark("start: \"select\"i \" \" \"éσж\"i", {"SeLeCT éσж", "select ÉΣЖ", "SELECT Éςж"},
                {"SELECT e\xcf\x83ж" /* e is not é */, "SELECt  éσж"});
    // More scripts' pairs: Latin Extended-A (alternating), Vietnamese, Armenian, accented Greek, Kelvin and long s.
    expect_lark("start: \"łódź\"i \" \" \"Ếա\"i \" \" \"ά\"i /k/i \"s\"i", {"ŁÓDŹ ếԱ Ά\u212A\u017F", "łóDź ẾԱ άKS"},
                {"LODZ ếա άks"});
    expect_lark("start: \"ab\" \"\\x41\\u00e9\\n\"", {"abAé\n"}, {"ABAé\n"});
    // Escapes as Lark reads them: \n \f \t \r \x \u \U, \\ and the quote; others keep their backslash.
    expect_lark(R"L(start: "\b" "\\" "a\"b" 'it\'s' "\'" "\t")L", {"\\b\\a\"bit's\\'\t"}, {"\b\\a\"bit's\\'\t"});
    // Then pairs of backslashes are one, however they were written.
    expect_lark(R"L(start: "\x5c\x5c" "-" "\\\\" "-" "\x5c\b")L", {"\\-\\\\-\\b"}, {});
    // A regex's flags are Lark's letters only: /b/iB is /b/i then the terminal B.
    expect_lark("start: /b/iB\nB: \"c\"", {"Bc"}, {"BC"});
    // Nesting the GBNF parser could not take back is refused at the Lark line.
    auto nested = [](int levels) {  // start: /(?:b(?:b...c|d)|d)/
        std::string t = "start: /";
        for (int k = 0; k < levels; ++k) t += "(?:b";
        t += "c";
        for (int k = 0; k < levels; ++k) t += "|d)";
        return t + "/";
    };
    auto d = EbnfGrammar::lark_to_gbnf(nested(70));
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("line 1: /"), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find("nested too deeply"), std::string::npos) << d.status().message();
    expect_lark(nested(25), {std::string(25, 'b') + "c", "bbd"}, {"bbbd" + std::string(25, 'b')});
}

// Lark's ESCAPED_STRING is /".*?(?<!\\)(\\\\)*?"/: a quote, then text up to the first quote not escaped by an
// odd run of backslashes, no newline. Its C_COMMENT is "/*" /(.|\n)*?/ "*/": up to the first "*/".
bool lark_escaped_string(const std::string& s) {
    if (s.size() < 2 || s[0] != '"') return false;
    size_t backslashes = 0;
    for (size_t i = 1; i < s.size(); ++i) {
        if (s[i] == '\n') return false;
        if (s[i] == '"' && backslashes % 2 == 0) return i + 1 == s.size();
        backslashes = s[i] == '\\' ? backslashes + 1 : 0;
    }
    return false;
}
bool lark_c_comment(const std::string& s) {
    return s.size() >= 4 && s.compare(0, 2, "/*") == 0 && s.find("*/", 2) == s.size() - 2;
}

// %import common: the imported terminals are Lark's (checked on random strings where Lark's own definition uses
// lookbehind or lazy matching); %ignore lets the ignored terminals stand between any two tokens of a rule and at
// either end, never inside a terminal.
TEST(EbnfGrammar, LarkImportsAndIgnore) {
    const std::string json = R"L(
?start: value
?value: dict
      | list
      | string
      | SIGNED_NUMBER      -> number
      | "true" | "false" | "null"
list : "[" [value ("," value)*] "]"
dict : "{" [pair ("," pair)*] "}"
pair : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
)L";
    auto text = EbnfGrammar::lark_to_gbnf(json);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    auto g = compile(*text);
    ASSERT_TRUE(g) << *text;
    for (const char* ok : {"{\"a\":1}", " { \"a\" : [1, -2.5e3, \"x\\\"y\" ] ,\n\"b\":true}\n", "[ ]", "\t-7",
                           "[[],{},null]", "\"\\\\\"", "1.", ".5E+2"})
        EXPECT_TRUE(matches(*g, ok)) << ok;
    for (const char* bad : {"{\"a\" 1}", "[1,]", "\"abc", "[tr ue]", "\"a\nb\"", "- 7", "1 .5", "{}x"})
        EXPECT_FALSE(matches(*g, bad)) << bad;

    expect_lark(
        "start: N (SEP N)* C?\n%import common (INT, WORD)\n%import common.INT -> N\n%import common.C_COMMENT -> C\n"
        "SEP: \",\" | WORD\n%ignore \" \"\n%ignore /\\t+/",
        {" 1 ,2 and\t\t3 /* note */ "}, {"1 , 2 a nd 3", "1 /* a */ b */"});

    std::mt19937 rng(5);
    for (const auto& [name, oracle] :
         {std::pair{"ESCAPED_STRING", &lark_escaped_string}, {"C_COMMENT", &lark_c_comment}}) {
        auto t = EbnfGrammar::lark_to_gbnf(std::string("start: X\n%import common.") + name + " -> X");
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        auto c = compile(*t);
        ASSERT_TRUE(c) << *t;
        const std::string alphabet = name[0] == 'E' ? "\"\\a\n" : "/*a\n";
        int yes = 0;
        for (int k = 0; k < 20000; ++k) {
            std::string s = name[0] == 'E' ? "\"" : "/*";
            const int len = static_cast<int>(rng() % 7);
            for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
            ASSERT_EQ(matches(*c, s), oracle(s)) << name << " on '" << s << "'";
            yes += oracle(s);
        }
        EXPECT_GT(yes, 500) << name;
    }
}

// Dead branches leave nothing live behind them; unreachable or unproductive rules are dropped.
TEST(EbnfGrammar, DeadRulesAreDropped) {
    auto g = compile("root ::= \"a\" | \"b\" loop | \"c\" []\nloop ::= \"x\" loop\nunused ::= \"q\"");
    ASSERT_TRUE(g);
    EXPECT_TRUE(matches(*g, "a"));
    EXPECT_FALSE(live(*g, "b"));
    EXPECT_FALSE(live(*g, "c"));
    auto empty_ok = compile("root ::= \"\"");
    EXPECT_TRUE(matches(*empty_ok, ""));
    EXPECT_FALSE(live(*empty_ok, "a"));
}

// Nesting past the stack bound is refused, not followed: no crash, no unbounded memory.
TEST(EbnfGrammar, StackDepthIsBounded) {
    auto g = compile(R"G(root ::= "(" root ")" | "x")G");
    ASSERT_TRUE(g);
    EbnfMatcher m(*g);
    const int limit = EbnfMatcher::kMaxDepth;
    ASSERT_TRUE(m.feed(std::string(static_cast<size_t>(limit - 1), '(')));
    EXPECT_FALSE(m.feed("(("));  // past the bound
    EXPECT_TRUE(m.feed("x" + std::string(static_cast<size_t>(limit - 1), ')')));
    EXPECT_TRUE(m.accepting());
}

// The trie's mask is exactly the tokens whose bytes keep the matcher live, from several positions, and a mask
// from the cache equals the one walked.
TEST(EbnfGrammar, TrieMaskEqualsFeedingEachToken) {
    const std::vector<std::string> bytes = testing::random_vocab("()[]a1, \"\xce\xb1", 4000, 5);
    TokenTrie trie(bytes);
    auto g = compile(R"G(
        root ::= list
        list ::= "[" ws (item ("," ws item)*)? "]"
        item ::= list | "a"+ | "\"" [^"]* "\"" | "(" root ")"
        ws ::= " "?
    )G");
    ASSERT_TRUE(g);
    std::vector<uint8_t> mask, again;
    for (const std::string prefix : {"", "[", "[a", "[[", "[\"", "[\"α", "[([a", "[a, (["}) {
        EbnfMatcher m(*g);
        ASSERT_TRUE(m.feed(prefix)) << prefix;
        const int64_t n = trie.fill_mask(m, &mask);
        int64_t count = 0;
        for (size_t id = 0; id < bytes.size(); ++id) {
            EbnfMatcher copy = m;
            const bool want = !bytes[id].empty() && copy.feed(bytes[id]);
            ASSERT_EQ(mask[id] != 0, want) << "after '" << prefix << "': token '" << bytes[id] << "'";
            count += want;
        }
        EXPECT_EQ(n, count);
        EXPECT_GT(n, 0);
        EXPECT_EQ(trie.fill_mask(m, &again), n);  // from the cache
        EXPECT_EQ(again, mask);
    }
}

// The Harmony gate with a grammar: the final message only, <|return|> once the text is complete; raw mode
// from the first token.
TEST(EbnfGrammar, HarmonyFinalMessageAndRawMode) {
    const int32_t final_id = testing::kByteVocabFinal;
    const HarmonyTokenIds ids = testing::kByteVocabIds;
    auto so = testing::byte_vocab_outputs();
    auto g = compile(R"G(root ::= "(" root ")" | "x")G");
    auto c = so->final_json(nullptr, {}, nullptr, nullptr, g)->start();
    std::vector<uint8_t> mask;
    EXPECT_FALSE(c->allowed_next(&mask));  // the header is free
    c->accept(ids.channel);
    c->accept(final_id);
    c->accept(ids.message);
    for (char ch : std::string("((x)")) {
        ASSERT_TRUE(c->allowed_next(&mask));
        EXPECT_FALSE(mask[static_cast<size_t>(ids.ret)]);
        ASSERT_TRUE(mask[static_cast<uint8_t>(ch)]) << ch;
        c->accept(static_cast<uint8_t>(ch));
    }
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[')']);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
    c->accept(')');
    ASSERT_TRUE(c->allowed_next(&mask));
    EXPECT_TRUE(mask[static_cast<size_t>(ids.ret)]);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
    auto raw = so->raw_json(nullptr, nullptr, g)->start();
    ASSERT_TRUE(raw->allowed_next(&mask));
    EXPECT_TRUE(mask['('] && mask['x'] && !mask[')']);
}

// ---- random grammars against a reference recognizer ----

// A grammar as the generator builds it, rendered to GBNF for the compiler and matched directly by `Reference`.
struct Expr {
    enum Kind { kLit, kClass, kRef, kSeq, kAlt, kRep } kind = kLit;
    std::string text;  // kLit: the literal; kClass: the characters
    bool negate = false;
    int rule = 0;
    std::vector<Expr> kids;
    int min = 0, max = -1;
};

Expr random_expr(std::mt19937& rng, int rules, int depth) {
    Expr e;
    const unsigned pick = rng() % (depth >= 3 ? 3 : 6);
    if (pick == 0) {
        e.kind = Expr::kLit;
        for (int k = static_cast<int>(rng() % 3); k > 0; --k) e.text += "abc"[rng() % 3];
    } else if (pick == 1) {
        e.kind = Expr::kClass;
        e.negate = rng() % 3 == 0;
        e.text = std::string(1, "abc"[rng() % 3]);
        if (rng() % 2) e.text += "abc"[rng() % 3];
    } else if (pick == 2) {
        e.kind = Expr::kRef;
        e.rule = static_cast<int>(rng() % static_cast<unsigned>(rules));
    } else if (pick == 5) {
        e.kind = Expr::kRep;
        static const int bounds[][2] = {{0, 1}, {0, -1}, {1, -1}, {2, 3}, {0, 2}, {1, 1}};
        const auto& b = bounds[rng() % 6];
        e.min = b[0], e.max = b[1];
        e.kids.push_back(random_expr(rng, rules, depth + 1));
    } else {
        e.kind = pick == 3 ? Expr::kSeq : Expr::kAlt;
        for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) e.kids.push_back(random_expr(rng, rules, depth + 1));
    }
    return e;
}

std::string rule_name(int r) {
    std::string name = r == 0 ? "root" : "r";
    if (r != 0) name += std::to_string(r);
    return name;
}

std::string render(const Expr& e) {
    switch (e.kind) {
        case Expr::kLit: return "\"" + e.text + "\"";
        case Expr::kClass: return std::string(e.negate ? "[^" : "[") + e.text + "]";
        case Expr::kRef: return rule_name(e.rule);
        case Expr::kSeq:
        case Expr::kAlt: {
            std::string out = "(";
            for (size_t k = 0; k < e.kids.size(); ++k)
                out += (k ? (e.kind == Expr::kSeq ? " " : " | ") : "") + render(e.kids[k]);
            return out + ")";
        }
        case Expr::kRep: {
            const std::string kid = render(e.kids[0]);
            if (e.min == 0 && e.max == 1) return kid + "?";
            if (e.min == 0 && e.max < 0) return kid + "*";
            if (e.min == 1 && e.max < 0) return kid + "+";
            return kid + "{" + std::to_string(e.min) + "," + (e.max < 0 ? "" : std::to_string(e.max)) + "}";
        }
    }
    return "";
}

// The language by brute force: the positions where an expression can end from position i of `s`, with kOpen
// for "ran past the end of s" (s is then a prefix of something longer it can match).
class Reference {
public:
    explicit Reference(const std::vector<Expr>& rules) : rules_(rules) {
        // Productive rules (they can derive some finite string), a fixpoint.
        productive_.assign(rules.size(), 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < rules.size(); ++r)
                if (!productive_[r] && productive(rules[r])) productive_[r] = changed = true;
        }
        // Left recursion: a rule that can begin with itself before reading a character.
        nullable_.assign(rules.size(), 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < rules.size(); ++r)
                if (!nullable_[r] && nullable(rules[r])) nullable_[r] = changed = true;
        }
    }
    bool root_productive() const { return productive_[0] != 0; }
    bool left_recursive() const {
        std::vector<std::vector<int>> begins(rules_.size());
        for (size_t r = 0; r < rules_.size(); ++r) collect_begins(rules_[r], &begins[r]);
        std::vector<int> color(rules_.size(), 0);
        std::function<bool(int)> cycle = [&](int r) {
            color[static_cast<size_t>(r)] = 1;
            for (int s : begins[static_cast<size_t>(r)])
                if (color[static_cast<size_t>(s)] == 1 || (color[static_cast<size_t>(s)] == 0 && cycle(s))) return true;
            color[static_cast<size_t>(r)] = 2;
            return false;
        };
        for (size_t r = 0; r < rules_.size(); ++r)
            if (color[r] == 0 && cycle(static_cast<int>(r))) return true;
        return false;
    }
    // 1: s is in the language; 2: s is a proper prefix of a string in it (or both: 3); 0: neither.
    int classify(const std::string& s) {
        s_ = s;
        memo_.clear();
        const std::set<int> e = ends(rules_[0], 0);
        const int n = static_cast<int>(s.size());
        return (e.count(n) ? 1 : 0) | (e.count(n + 1) ? 2 : 0);
    }

private:
    bool productive(const Expr& e) const {
        switch (e.kind) {
            case Expr::kLit:
            case Expr::kClass: return true;
            case Expr::kRef: return productive_[static_cast<size_t>(e.rule)];
            case Expr::kSeq:
                return std::all_of(e.kids.begin(), e.kids.end(), [&](const Expr& k) { return productive(k); });
            case Expr::kAlt:
                return std::any_of(e.kids.begin(), e.kids.end(), [&](const Expr& k) { return productive(k); });
            case Expr::kRep: return e.min == 0 || productive(e.kids[0]);
        }
        return false;
    }
    bool nullable(const Expr& e) const {
        switch (e.kind) {
            case Expr::kLit: return e.text.empty();
            case Expr::kClass: return false;
            case Expr::kRef: return nullable_[static_cast<size_t>(e.rule)] && productive_[static_cast<size_t>(e.rule)];
            case Expr::kSeq:
                return std::all_of(e.kids.begin(), e.kids.end(), [&](const Expr& k) { return nullable(k); });
            case Expr::kAlt:
                return std::any_of(e.kids.begin(), e.kids.end(), [&](const Expr& k) { return nullable(k); });
            case Expr::kRep: return e.min == 0 || nullable(e.kids[0]);
        }
        return false;
    }
    // The rules a productive expression can call before reading (through productive paths).
    void collect_begins(const Expr& e, std::vector<int>* out) const {
        if (!productive(e)) return;
        switch (e.kind) {
            case Expr::kRef: out->push_back(e.rule); return;
            case Expr::kSeq:
                for (const Expr& k : e.kids) {
                    collect_begins(k, out);
                    if (!nullable(k)) return;
                }
                return;
            case Expr::kAlt:
            case Expr::kRep:
                for (const Expr& k : e.kids) collect_begins(k, out);
                return;
            default: return;
        }
    }
    std::set<int> ends(const Expr& e, int i) {
        const int n = static_cast<int>(s_.size()), open = n + 1;
        if (i == open) return productive(e) ? std::set<int>{open} : std::set<int>{};
        switch (e.kind) {
            case Expr::kLit: {
                int j = i;
                for (char c : e.text) {
                    if (j == n) return {open};
                    if (s_[static_cast<size_t>(j)] != c) return {};
                    ++j;
                }
                return {j};
            }
            case Expr::kClass: {
                if (i == n) return {open};
                const bool in = e.text.find(s_[static_cast<size_t>(i)]) != std::string::npos;
                return in != e.negate ? std::set<int>{i + 1} : std::set<int>{};
            }
            case Expr::kRef: {
                if (!productive_[static_cast<size_t>(e.rule)]) return {};
                const std::pair<int, int> k{e.rule, i};
                if (auto it = memo_.find(k); it != memo_.end()) return it->second;
                memo_[k] = {};  // (left recursion is skipped by the caller)
                std::set<int> out = ends(rules_[static_cast<size_t>(e.rule)], i);
                memo_[k] = out;
                return out;
            }
            case Expr::kSeq: {
                std::set<int> at{i};
                for (const Expr& k : e.kids) {
                    std::set<int> next;
                    for (int p : at)
                        for (int q : ends(k, p)) next.insert(q);
                    at.swap(next);
                }
                return at;
            }
            case Expr::kAlt: {
                std::set<int> out;
                for (const Expr& k : e.kids)
                    for (int q : ends(k, i)) out.insert(q);
                return out;
            }
            case Expr::kRep: {
                std::set<int> out, at{i};
                if (e.min == 0) out.insert(i);
                for (int count = 1; e.max < 0 || count <= e.max; ++count) {
                    std::set<int> next;
                    for (int p : at)
                        for (int q : ends(e.kids[0], p)) next.insert(q);
                    const size_t before = out.size();
                    if (count >= e.min) out.insert(next.begin(), next.end());
                    if (next.empty() || (count > e.min + n + 2 && out.size() == before)) break;
                    at.swap(next);
                }
                return out;
            }
        }
        return {};
    }

    const std::vector<Expr>& rules_;
    std::vector<uint8_t> productive_, nullable_;
    std::string s_;
    std::map<std::pair<int, int>, std::set<int>> memo_;
};

// Random grammars (up to 4 rules, recursion, nullable parts, repetition) against the reference: full matches and
// live prefixes on every string of up to 5 characters over a, b, c, d; refusals only where the reference finds
// left recursion or no finite output; the mask against feeding each token.
TEST(EbnfGrammar, RandomGrammarsAgreeWithAReference) {
    std::mt19937 rng(2025);
    std::vector<std::string> strings{""};
    for (size_t k = 0; k < strings.size() && strings[k].size() < 5; ++k)
        for (char c : std::string("abcd")) strings.push_back(strings[k] + c);
    const std::vector<std::string> vocab = testing::random_vocab("abcd", 300, 8);
    const TokenTrie trie(vocab);
    int compiled = 0, refused_left = 0, refused_empty = 0, in_language = 0, exact = 0, truncated = 0;
    for (int g = 0; g < 4000; ++g) {
        const int R = 1 + static_cast<int>(rng() % 4);
        std::vector<Expr> rules;
        std::string text;
        for (int r = 0; r < R; ++r) {
            rules.push_back(random_expr(rng, R, 0));
            text += rule_name(r) + " ::= " + render(rules.back()) + "\n";
        }
        Reference ref(rules);
        auto compiled_grammar = EbnfGrammar::compile(text);
        if (!compiled_grammar.ok()) {
            const std::string why = compiled_grammar.status().message();
            if (why.find("left-recursive") != std::string::npos) {
                EXPECT_TRUE(ref.left_recursive()) << text << why;
                ++refused_left;
            } else {
                EXPECT_NE(why.find("no finite output"), std::string::npos) << text << why;
                EXPECT_FALSE(ref.root_productive()) << text;
                ++refused_empty;
            }
            continue;
        }
        ASSERT_TRUE(ref.root_productive()) << text;
        if (ref.left_recursive()) continue;  // (accepted where the recursion runs through dead branches only)
        ++compiled;
        const EbnfGrammar& eg = **compiled_grammar;
        for (const std::string& s : strings) {
            const int want = ref.classify(s);
            EbnfMatcher m(eg);
            const bool fed = m.feed(s);
            if (m.truncated()) {  // held tighter, never looser
                ++truncated;
                ASSERT_TRUE(!fed || want != 0) << text << "live '" << s << "'";
                ASSERT_TRUE(!(fed && m.accepting()) || (want & 1)) << text << "match '" << s << "'";
                continue;
            }
            ++exact;
            ASSERT_EQ(fed, want != 0) << text << "live '" << s << "'";
            ASSERT_EQ(fed && m.accepting(), (want & 1) != 0) << text << "match '" << s << "'";
            in_language += want & 1;
        }
        if (g % 8 == 0) {
            std::vector<uint8_t> mask;
            for (const std::string& s : {std::string(), std::string("a"), std::string("ab"), std::string("cd")}) {
                EbnfMatcher m(eg);
                if (!m.feed(s)) continue;
                trie.fill_mask(m, &mask);
                for (size_t id = 0; id < vocab.size(); ++id) {
                    EbnfMatcher copy = m;
                    ASSERT_EQ(mask[id] != 0, !vocab[id].empty() && copy.feed(vocab[id])) << text << s << vocab[id];
                }
            }
        }
    }
    std::printf(
        "random grammars: %d compiled, %d refused as left-recursive, %d as empty; %d strings matched; %d of %d "
        "checks past the configuration bound\n",
        compiled, refused_left, refused_empty, in_language, truncated, exact + truncated);
    EXPECT_LT(truncated * 100, exact + truncated);  // rare: under 1%
    EXPECT_GT(compiled, 200);
    EXPECT_GT(in_language, 1000);
}

// Random outputs drawn under the mask over o200k always parse; the mask's cost a step is printed.
TEST(EbnfGrammarO200k, RandomOutputsUnderTheMaskMatch) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    auto so = HarmonyStructuredOutputs::create(*tok, 201088);
    ASSERT_TRUE(so.ok()) << so.status().to_string();
    (*so)->trie();
    const std::vector<std::string>& bytes = (*so)->token_bytes();
    const int32_t ret = (*so)->ids().ret;
    const char* grammars[] = {
        // Small alternatives (few tokens a step).
        R"G(root ::= "SELECT " cols " FROM " name (" WHERE " name " = " num)?
           cols ::= name (", " name)*
           name ::= [a-z_]{1,12}
           num  ::= [0-9]{1,6})G",
        // Free text inside a recursive structure (most of the vocabulary a step).
        R"G(root ::= item ("\n" item){0,3}
           item ::= "- " [^\n]{1,60} | "> " quote
           quote ::= "(" [^()\n]{0,40} (quote [^()\n]{0,10})? ")")G",
        // Unbounded free text (a loop: subtrees of the vocabulary taken whole).
        R"G(root ::= "Answer: " [^\n]* "\nScore: " [0-9]+)G",
        // Lark's JSON with %ignore WS (whitespace may stand before every token).
        "",
    };
    std::mt19937 rng(9);
    std::vector<uint8_t> mask;
    auto lark = EbnfGrammar::lark_to_gbnf(R"L(?start: value
?value: dict | list | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
list : "[" [value ("," value)*] "]"
dict : "{" [pair ("," pair)*] "}"
pair : ESCAPED_STRING ":" value
%import common (ESCAPED_STRING, SIGNED_NUMBER, WS)
%ignore WS)L");
    ASSERT_TRUE(lark.ok()) << lark.status().to_string();
    for (const char* text : grammars) {
        auto g = compile(*text ? std::string(text) : *lark);
        ASSERT_TRUE(g);
        double mask_ms = 0;
        int steps = 0, done = 0;
        for (int doc = 0; doc < 8; ++doc) {
            auto c = (*so)->raw_json(nullptr, nullptr, g)->start();
            std::string out;
            for (int step = 0; step < 40; ++step, ++steps) {
                const testing::MaskStep s = testing::mask_step(*c, &mask, &mask_ms);
                ASSERT_TRUE(s.constrained);
                const std::vector<int32_t>& allowed = s.allowed;
                ASSERT_FALSE(allowed.empty()) << out;
                const int32_t pick =
                    mask[static_cast<size_t>(ret)] && rng() % 3 == 0 ? ret : allowed[rng() % allowed.size()];
                if (pick == ret) {
                    EXPECT_TRUE(matches(*g, out)) << out;
                    ++done;
                    break;
                }
                c->accept(pick);
                out += bytes[static_cast<size_t>(pick)];
                ASSERT_TRUE(live(*g, out)) << out;
            }
        }
        std::printf("grammar over o200k: %d steps, mask %.3f ms a step; %d outputs ended\n", steps, mask_ms / steps,
                    done);
        EXPECT_GT(done, 0);
    }
}

}  // namespace
}  // namespace gptoss::structured
