#include "structured/ebnf_grammar.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "structured/byte_nfa.h"
#include "structured/json_grammar.h"

namespace gptoss::structured {

namespace {

using namespace detail;

constexpr size_t kMaxDfaStates = 20000;
constexpr int64_t kMaxWork = 5000000;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxNesting = 200;
constexpr size_t kMaxCachedMasks = 8;

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

struct ParsedRule {
    std::string name;
    NodePtr body;
    size_t at = 0;  // where its name is
};

class Parser {
public:
    explicit Parser(std::string_view text) : t_(text) {}

    // Rules in the order of their first mention (definition or reference); `defined` says which were defined.
    Status parse() {
        for (;;) {
            skip_space();
            if (!more()) break;
            const size_t at = i_;
            const std::string name = read_name();
            if (name.empty()) return error("expected a rule name");
            skip_space();
            if (t_.compare(i_, 3, "::=") != 0) return error("expected '::=' after the rule name '" + name + "'");
            i_ += 3;
            const int r = rule_index(name, at);
            if (defined_[static_cast<size_t>(r)]) return error_at(at, "the rule '" + name + "' is defined twice");
            defined_[static_cast<size_t>(r)] = 1;
            rules_[static_cast<size_t>(r)].at = at;
            StatusOr<NodePtr> body = alternation(0);
            if (!body.ok()) return body.status();
            rules_[static_cast<size_t>(r)].body = std::move(*body);
            skip_space();
            if (more() && peek() == ')') return error("unbalanced ')'");
        }
        for (size_t r = 0; r < rules_.size(); ++r)
            if (!defined_[r]) return error_at(first_use_[r], "the rule '" + rules_[r].name + "' is not defined");
        if (rules_.empty()) return error("the grammar has no rules");
        return ok_status();
    }

    std::vector<ParsedRule>& rules() { return rules_; }
    Status error_at(size_t at, const std::string& what) const {
        size_t line = 1, col = 1;
        for (size_t k = 0; k < at && k < t_.size(); ++k) {
            if (t_[k] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return invalid_argument("the grammar at line " + std::to_string(line) + ", column " + std::to_string(col) +
                                ": " + what);
    }

private:
    Status error(const std::string& what) const { return error_at(i_, what); }
    bool more() const { return i_ < t_.size(); }
    char peek() const { return t_[i_]; }

    void skip_space() {
        while (more()) {
            const char c = peek();
            if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
                ++i_;
            } else if (c == '#') {
                while (more() && peek() != '\n') ++i_;
            } else {
                break;
            }
        }
    }
    std::string read_name() {
        const size_t s = i_;
        while (more() && name_char(peek())) ++i_;
        return std::string(t_.substr(s, i_ - s));
    }
    // A rule definition begins here (`name ::=`): the sequence before it has ended.
    bool at_definition() {
        const size_t s = i_;
        const bool named = !read_name().empty();
        skip_space();
        const bool yes = named && t_.compare(i_, 3, "::=") == 0;
        i_ = s;
        return yes;
    }
    int rule_index(const std::string& name, size_t at) {
        auto [it, fresh] = index_.emplace(name, static_cast<int>(rules_.size()));
        if (fresh) {
            rules_.push_back({name, nullptr, at});
            defined_.push_back(0);
            first_use_.push_back(at);
        }
        return it->second;
    }

    StatusOr<NodePtr> alternation(int depth) {
        if (depth > kMaxNesting) return error("nested too deeply");
        NodePtr alt = make_node(Node::Kind::kAlt);
        for (;;) {
            StatusOr<NodePtr> seq = sequence(depth);
            if (!seq.ok()) return seq;
            alt->kids.push_back(std::move(*seq));
            skip_space();
            if (more() && peek() == '|') {
                ++i_;
                continue;
            }
            break;
        }
        if (alt->kids.size() == 1) return std::move(alt->kids[0]);
        return alt;
    }

    StatusOr<NodePtr> sequence(int depth) {
        NodePtr cat = make_node(Node::Kind::kConcat);
        for (;;) {
            skip_space();
            if (!more() || peek() == '|' || peek() == ')' || at_definition()) break;
            StatusOr<NodePtr> item = primary(depth);
            if (!item.ok()) return item;
            StatusOr<NodePtr> q = postfix(std::move(*item));
            if (!q.ok()) return q;
            cat->kids.push_back(std::move(*q));
        }
        return cat;
    }

    StatusOr<NodePtr> postfix(NodePtr a) {
        for (;;) {
            const size_t before = i_;
            skip_space();
            if (!more()) return a;
            int lo = 0, hi = -1;
            const char c = peek();
            if (c == '*') {
                ++i_;
            } else if (c == '+') {
                lo = 1, ++i_;
            } else if (c == '?') {
                hi = 1, ++i_;
            } else if (c == '{') {
                ++i_;
                RETURN_IF_ERROR(braces(&lo, &hi));
            } else {
                i_ = before;
                return a;
            }
            NodePtr r = make_node(Node::Kind::kRepeat);
            r->min = lo;
            r->max = hi;
            r->kids.push_back(std::move(a));
            a = std::move(r);
        }
    }

    // {n}, {n,}, {n,m}, {,m} after the '{'.
    Status braces(int* lo, int* hi) {
        auto number = [&](int* out) {
            skip_space();
            const size_t s = i_;
            long v = 0;
            while (more() && peek() >= '0' && peek() <= '9') v = std::min<long>(v * 10 + (t_[i_++] - '0'), 1000001);
            *out = static_cast<int>(v);
            return i_ > s;
        };
        int a = 0, b = -1;
        const bool has_a = number(&a);
        skip_space();
        if (more() && peek() == '}') {
            if (!has_a) return error("an empty repetition count");
            b = a;
        } else if (more() && peek() == ',') {
            ++i_;
            if (!number(&b)) b = -1;
            skip_space();
            if (!more() || peek() != '}') return error("expected '}' to end the repetition count");
        } else {
            return error("expected a repetition count {n}, {n,}, {n,m} or {,m}");
        }
        ++i_;
        if (b >= 0 && a > b) return error("a repetition's minimum is above its maximum");
        if (a > kMaxRepeat || b > kMaxRepeat) return error("a repetition count above " + std::to_string(kMaxRepeat));
        *lo = a;
        *hi = b;
        return ok_status();
    }

    StatusOr<NodePtr> primary(int depth) {
        const char c = peek();
        if (c == '"') return literal();
        if (c == '[') return char_class();
        if (c == '.') {
            ++i_;
            return make_set(complement({}));
        }
        if (c == '(') {
            ++i_;
            StatusOr<NodePtr> inner = alternation(depth + 1);
            if (!inner.ok()) return inner;
            skip_space();
            if (!more() || peek() != ')') return error("expected ')'");
            ++i_;
            return inner;
        }
        if (name_char(c)) {
            const size_t at = i_;
            NodePtr ref = make_node(Node::Kind::kRef);
            ref->rule = rule_index(read_name(), at);
            return ref;
        }
        if (c == '*' || c == '+' || c == '?' || c == '{') return error("nothing to repeat");
        return error(std::string("unexpected '") + c + "'");
    }

    // One character of a literal or a class at i_ (an escape or UTF-8).
    Status character(uint32_t* cp) {
        if (peek() != '\\') {
            if (!next_code_point(t_, &i_, cp)) return error("invalid UTF-8");
            return ok_status();
        }
        ++i_;
        if (!more()) return error("a trailing backslash");
        const char e = t_[i_++];
        switch (e) {
            case 'n': *cp = '\n'; return ok_status();
            case 'r': *cp = '\r'; return ok_status();
            case 't': *cp = '\t'; return ok_status();
            case 'f': *cp = '\f'; return ok_status();
            case 'v': *cp = '\v'; return ok_status();
            case '0': *cp = 0; return ok_status();
            case '\\':
            case '"':
            case '\'':
            case '[':
            case ']':
            case '-':
            case '^':
            case '/': *cp = static_cast<uint8_t>(e); return ok_status();
            case 'x':
            case 'u':
            case 'U': {
                const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                const size_t at = i_;
                if (hex_code_point(t_, &i_, digits, cp)) return ok_status();
                if (i_ < at + static_cast<size_t>(digits))
                    return error("\\x, \\u and \\U take " + std::to_string(digits) + " hex digits");
                return error("not a character");
            }
            default: return error_at(i_ - 2, std::string("unknown escape \\") + e);
        }
    }

    StatusOr<NodePtr> literal() {
        ++i_;  // '"'
        NodePtr cat = make_node(Node::Kind::kConcat);
        for (;;) {
            if (!more()) return error("an unterminated string literal");
            if (peek() == '"') {
                ++i_;
                break;
            }
            uint32_t cp = 0;
            RETURN_IF_ERROR(character(&cp));
            cat->kids.push_back(make_set({{cp, cp}}));
        }
        return cat;
    }

    StatusOr<NodePtr> char_class() {
        ++i_;  // '['
        bool negate = false;
        if (more() && peek() == '^') {
            negate = true;
            ++i_;
        }
        Ranges r;
        for (;;) {
            if (!more()) return error("an unterminated character class");
            if (peek() == ']') {
                ++i_;
                break;
            }
            uint32_t lo = 0, hi = 0;
            RETURN_IF_ERROR(character(&lo));
            hi = lo;
            if (more() && peek() == '-' && i_ + 1 < t_.size() && t_[i_ + 1] != ']') {
                ++i_;
                RETURN_IF_ERROR(character(&hi));
                if (hi < lo) return error("a range out of order");
            }
            r.push_back({lo, hi});
        }
        r = normalize(std::move(r));
        return make_set(negate ? complement(r) : r);
    }

    std::string_view t_;
    size_t i_ = 0;
    std::vector<ParsedRule> rules_;
    std::vector<uint8_t> defined_;
    std::vector<size_t> first_use_;
    std::map<std::string, int> index_;
};

}  // namespace

class EbnfCompiler {
public:
    static StatusOr<std::shared_ptr<const EbnfGrammar>> compile(std::string_view text) {
        Parser p(text);
        RETURN_IF_ERROR(p.parse());
        std::vector<ParsedRule>& rules = p.rules();
        const size_t R = rules.size();
        int root = -1;
        for (size_t r = 0; r < R; ++r)
            if (rules[r].name == "root") root = static_cast<int>(r);
        if (root < 0) return invalid_argument("the grammar has no rule named 'root' (the output matches root)");

        Nfa nfa;
        std::vector<int32_t> starts(R), accepts(R), first(R);
        for (size_t r = 0; r < R; ++r) {
            first[r] = static_cast<int32_t>(nfa.states.size());
            starts[r] = nfa.add();
            accepts[r] = nfa.build(*rules[r].body, starts[r]);
        }
        if (nfa.overflow)
            return invalid_argument("the grammar is too large (over " + std::to_string(kMaxNfaStates) +
                                    " automaton states)");
        Dfa dfa;
        RETURN_IF_ERROR(determinize(nfa, starts, kMaxDfaStates, kMaxWork, "the grammar", &dfa));
        const size_t D = dfa.size();
        // A DFA state's NFA states all belong to one rule (no epsilon move crosses rules).
        std::vector<int32_t> rule_of(D);
        std::vector<uint8_t> acc(D, 0);
        for (size_t d = 0; d < D; ++d) {
            const int32_t s = dfa.sets[d][0];
            rule_of[d] = static_cast<int32_t>(std::upper_bound(first.begin(), first.end(), s) - first.begin()) - 1;
            acc[d] =
                std::binary_search(dfa.sets[d].begin(), dfa.sets[d].end(), accepts[static_cast<size_t>(rule_of[d])]);
        }
        // Productive rules (those that can finish): a fixpoint over which references may be followed.
        std::vector<uint8_t> productive(R, 0), live;
        for (bool changed = true; changed;) {
            changed = false;
            live = live_states(dfa, acc, &productive);
            for (size_t r = 0; r < R; ++r)
                if (!productive[r] && live[static_cast<size_t>(dfa.start_of[r])]) productive[r] = changed = true;
        }
        if (!productive[static_cast<size_t>(root)])
            return invalid_argument("the grammar admits no finite output (the rule 'root' can never end)");
        prune(live, &productive, &dfa);

        // Left recursion: a rule that can begin a rule (itself in the end) without reading a byte. Nullable rules
        // (those that can end without reading) first, then the "begins with" edges over nullable references.
        std::vector<uint8_t> nullable(R, 0);
        auto reach_without_bytes = [&](int32_t from, const std::function<void(int32_t)>& visit) {
            std::vector<int32_t> stack{from};
            std::vector<uint8_t> seen(D, 0);
            seen[static_cast<size_t>(from)] = 1;
            while (!stack.empty()) {
                const int32_t d = stack.back();
                stack.pop_back();
                visit(d);
                for (const auto& [rule, t] : dfa.refs[static_cast<size_t>(d)])
                    if (nullable[static_cast<size_t>(rule)] && !seen[static_cast<size_t>(t)]) {
                        seen[static_cast<size_t>(t)] = 1;
                        stack.push_back(t);
                    }
            }
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < R; ++r) {
                if (nullable[r] || !productive[r]) continue;
                bool ends = false;
                reach_without_bytes(dfa.start_of[r], [&](int32_t d) { ends = ends || acc[static_cast<size_t>(d)]; });
                if (ends) nullable[r] = changed = true;
            }
        }
        std::vector<std::vector<int32_t>> begins(R);
        for (size_t r = 0; r < R; ++r) {
            if (!productive[r]) continue;
            reach_without_bytes(dfa.start_of[r], [&](int32_t d) {
                for (const auto& [rule, t] : dfa.refs[static_cast<size_t>(d)]) begins[r].push_back(rule);
            });
        }
        std::vector<uint8_t> color(R, 0);  // 0 unseen, 1 on the path, 2 done
        std::function<int(int)> cycle = [&](int r) -> int {
            color[static_cast<size_t>(r)] = 1;
            for (int32_t s : begins[static_cast<size_t>(r)]) {
                if (color[static_cast<size_t>(s)] == 1) return s;
                if (color[static_cast<size_t>(s)] == 0)
                    if (const int c = cycle(s); c >= 0) return c;
            }
            color[static_cast<size_t>(r)] = 2;
            return -1;
        };
        for (size_t r = 0; r < R; ++r) {
            if (!productive[r] || color[r] != 0) continue;
            if (const int c = cycle(static_cast<int>(r)); c >= 0)
                return p.error_at(rules[static_cast<size_t>(c)].at,
                                  "the rule '" + rules[static_cast<size_t>(c)].name +
                                      "' is left-recursive (it can begin with itself without reading a character); "
                                      "write the repetition with * or +, e.g. list ::= item (\",\" item)*");
        }

        auto g = std::shared_ptr<EbnfGrammar>(new EbnfGrammar());
        g->num_classes_ = dfa.num_classes;
        std::copy(dfa.class_of, dfa.class_of + 256, g->class_of_);
        g->table_ = std::move(dfa.table);
        g->refs_ = std::move(dfa.refs);
        g->accepting_ = std::move(acc);
        g->reads_.assign(D, 0);
        for (size_t d = 0; d < D; ++d)
            for (size_t c = 0; c < static_cast<size_t>(g->num_classes_); ++c)
                if (g->table_[d * static_cast<size_t>(g->num_classes_) + c] >= 0) g->reads_[d] = 1;
        g->start_of_ = std::move(dfa.start_of);
        for (const ParsedRule& r : rules) g->names_.push_back(r.name);
        g->root_ = root;
        return std::shared_ptr<const EbnfGrammar>(std::move(g));
    }
};

// ---- Lark's form ----

namespace {

// Lark's common.lark terminals (what `%import common.NAME` brings in), in GBNF under `common-` names (a '-' no
// Lark name has). Where Lark's regular expressions use lookbehind (ESCAPED_STRING) or lazy matching (C_COMMENT),
// the same languages are written without it.
constexpr std::string_view kLarkCommon = R"G(common-DIGIT ::= [0-9]
common-HEXDIGIT ::= [a-fA-F0-9]
common-INT ::= common-DIGIT+
common-SIGNED_INT ::= [+\-]? common-INT
common-DECIMAL ::= common-INT "." common-INT? | "." common-INT
common-_EXP ::= [eE] common-SIGNED_INT
common-FLOAT ::= common-INT common-_EXP | common-DECIMAL common-_EXP?
common-SIGNED_FLOAT ::= [+\-]? common-FLOAT
common-NUMBER ::= common-FLOAT | common-INT
common-SIGNED_NUMBER ::= [+\-]? common-NUMBER
common-_STRING_INNER ::= [^\n]*
common-_STRING_ESC_INNER ::= ([^"\\\n] | "\\" [^\n])*
common-ESCAPED_STRING ::= "\"" common-_STRING_ESC_INNER "\""
common-LCASE_LETTER ::= [a-z]
common-UCASE_LETTER ::= [A-Z]
common-LETTER ::= common-UCASE_LETTER | common-LCASE_LETTER
common-WORD ::= common-LETTER+
common-CNAME ::= ("_" | common-LETTER) ("_" | common-LETTER | common-DIGIT)*
common-WS_INLINE ::= [ \t]+
common-WS ::= [ \t\f\r\n]+
common-CR ::= "\r"
common-LF ::= "\n"
common-NEWLINE ::= (common-CR? common-LF)+
common-SH_COMMENT ::= "#" [^\n]*
common-CPP_COMMENT ::= "//" [^\n]*
common-C_COMMENT ::= "/*" ([^*] | "*"+ [^*/])* "*"+ "/"
common-SQL_COMMENT ::= "--" [^\n]*
)G";

bool lark_common_has(std::string_view name) {
    const std::string key = "common-" + std::string(name) + " ::=";
    return kLarkCommon.find(key) == 0 || kLarkCommon.find("\n" + key) != std::string_view::npos;
}

// A line without its comment (// or # outside quotes and regular expressions).
std::string_view strip_lark_comment(std::string_view line) {
    char quote = 0;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quote != 0) {
            if (c == '\\')
                ++i;
            else if (c == quote)
                quote = 0;
        } else if (c == '"' || c == '\'' || c == '/') {
            if (c == '/' && i + 1 < line.size() && line[i + 1] == '/') return line.substr(0, i);
            quote = c;
        } else if (c == '#') {
            return line.substr(0, i);
        }
    }
    return line;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
}

bool lark_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool lark_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
// Lark's terminals are named in upper case (an optional leading '_'), its rules in lower case.
bool lark_is_terminal(std::string_view name) {
    const size_t i = name.find_first_not_of('_');
    return i != std::string_view::npos && std::isupper(static_cast<unsigned char>(name[i]));
}

// A Lark string's body (between its `quote`s) as characters, as Lark reads it: \n \f \t \r \xHH \uHHHH \UHHHHHHHH
// and the escaped quote are decoded, \\ is two backslashes and any other escape keeps its backslash ("\b" is two
// characters); then each pair of backslashes is one (so "\\" is one backslash, and so is "\x5c\x5c").
Status lark_string(std::string_view body, char quote, std::vector<uint32_t>* out) {
    std::vector<uint32_t> cps;
    for (size_t i = 0; i < body.size();) {
        uint32_t cp = 0;
        if (body[i] != '\\' || i + 1 >= body.size()) {
            if (!next_code_point(body, &i, &cp)) return invalid_argument("a string that is not UTF-8");
            cps.push_back(cp);
            continue;
        }
        const char e = body[i + 1];
        i += 2;
        switch (e) {
            case 'n': cps.push_back('\n'); break;
            case 'r': cps.push_back('\r'); break;
            case 't': cps.push_back('\t'); break;
            case 'f': cps.push_back('\f'); break;
            case '\\': cps.insert(cps.end(), {'\\', '\\'}); break;
            case 'x':
            case 'u':
            case 'U':
                if (!hex_code_point(body, &i, e == 'x' ? 2 : e == 'u' ? 4 : 8, &cp))
                    return invalid_argument(std::string("a bad \\") + e + " escape in a string");
                cps.push_back(cp);
                break;
            default:
                if (e != quote) cps.push_back('\\');
                i -= 1;  // the character after the backslash is read as itself
                break;
        }
    }
    for (size_t k = 0; k < cps.size(); ++k) {
        out->push_back(cps[k]);
        if (cps[k] == '\\' && k + 1 < cps.size() && cps[k + 1] == '\\') ++k;
    }
    return ok_status();
}

constexpr int kMaxLarkRegexDepth = 120;  // syntax-tree levels (~60 nested groups): GBNF nests at most 200

int node_depth(const Node& n) {
    int d = 0;
    for (const NodePtr& k : n.kids) d = std::max(d, node_depth(*k));
    return d + 1;
}

struct LarkContext {
    bool ignore_before_terminals = false;  // a rule's body under %ignore: `lark-ignore` before each terminal
    std::string_view start = "root";       // the name `start` becomes
};

// One Lark expansion (the text after `name:` or `|`) in GBNF; `line` for errors.
StatusOr<std::string> lark_expansion(std::string_view e, size_t line, const LarkContext& ctx) {
    auto error = [&](const std::string& what) {
        return invalid_argument("the Lark grammar at line " + std::to_string(line) + ": " + what);
    };
    std::string out;
    auto terminal = [&](const std::string& item) {
        if (ctx.ignore_before_terminals)
            out.append("(lark-ignore ").append(item).append(")");
        else
            out.append(item);
    };
    // A quoted string at `i` (at its quote): its characters; `i` past the closing quote.
    auto string_at = [&](size_t* i, std::vector<uint32_t>* cps) -> Status {
        const char q = e[*i];
        size_t j = *i + 1;
        for (; j < e.size() && e[j] != q; ++j)
            if (e[j] == '\\') ++j;
        if (j >= e.size()) return error("an unterminated string");
        if (Status s = lark_string(e.substr(*i + 1, j - *i - 1), q, cps); !s.ok()) return error(s.message());
        *i = j + 1;
        return ok_status();
    };
    int optional_depth = 0;
    for (size_t i = 0; i < e.size();) {
        const char c = e[i];
        if (std::isspace(static_cast<unsigned char>(c))) {
            out += ' ';
            ++i;
        } else if (c == '"' || c == '\'') {
            std::vector<uint32_t> cps;
            RETURN_IF_ERROR(string_at(&i, &cps));
            if (e.compare(i, 2, "..") == 0 && i + 2 < e.size() && (e[i + 2] == '"' || e[i + 2] == '\'')) {
                // "a".."z": a character range.
                std::vector<uint32_t> hi;
                i += 2;
                RETURN_IF_ERROR(string_at(&i, &hi));
                if (cps.size() != 1 || hi.size() != 1)
                    return error("a range \"a\"..\"z\" takes one character each side");
                if (hi[0] < cps[0]) return error("a range out of order");
                terminal(to_gbnf(*make_set({{cps[0], hi[0]}})));
                continue;
            }
            const bool ignore_case = i < e.size() && e[i] == 'i' && (i + 1 >= e.size() || !lark_name_char(e[i + 1]));
            if (ignore_case) ++i;
            NodePtr cat = make_node(Node::Kind::kConcat);
            for (uint32_t cp : cps)
                cat->kids.push_back(make_set(ignore_case ? with_other_case({{cp, cp}}) : Ranges{{cp, cp}}));
            terminal(to_gbnf(*cat));
        } else if (c == '/') {
            // A regular expression (Python's syntax, as regex_grammar.h reads it) and its flags.
            size_t j = i + 1;
            for (; j < e.size() && e[j] != '/'; ++j)
                if (e[j] == '\\') ++j;
            if (j >= e.size()) return error("an unterminated regular expression");
            const std::string_view pattern = e.substr(i + 1, j - i - 1);
            RegexFlags flags;
            for (i = j + 1; i < e.size() && std::strchr("imslux", e[i]) != nullptr; ++i) {  // Lark's flags
                if (e[i] == 'i')
                    flags.ignore_case = true;
                else if (e[i] == 's')
                    flags.dot_all = true;
                else if (e[i] == 'l' || e[i] == 'x')
                    return error(std::string("the regular-expression flag '") + e[i] +
                                 "' is not supported (i, s, m, u are)");
            }
            StatusOr<NodePtr> ast = parse_regex(pattern, flags);
            if (!ast.ok()) return error("/" + std::string(pattern) + "/: " + ast.status().message());
            // (each level may print as a group: keep well inside the GBNF parser's nesting bound)
            if (node_depth(**ast) > kMaxLarkRegexDepth)
                return error("/" + std::string(pattern) + "/ is nested too deeply (over " +
                             std::to_string(kMaxLarkRegexDepth) + " levels)");
            terminal(to_gbnf(**ast));
        } else if (c == '[') {
            out += '(';
            ++optional_depth;
            ++i;
        } else if (c == ']') {
            if (optional_depth == 0) return error("unbalanced ']'");
            out += ")?";
            --optional_depth;
            ++i;
        } else if (c == '~') {
            size_t j = i + 1;
            while (j < e.size() && e[j] == ' ') ++j;
            const size_t a = j;
            while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
            if (j == a) return error("~ takes a count (~n or ~n..m)");
            std::string rep(1, '{');
            rep.append(e.substr(a, j - a));
            if (e.compare(j, 2, "..") == 0) {
                const size_t b = j + 2;
                j = b;
                while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
                if (j == b) return error("~n..m takes a maximum");
                rep.append(1, ',').append(e.substr(b, j - b));
            }
            out.append(rep).append(1, '}');
            i = j;
        } else if (c == '-' && i + 1 < e.size() && e[i + 1] == '>') {
            i += 2;  // an alias: the name after it is dropped
            while (i < e.size() && e[i] == ' ') ++i;
            while (i < e.size() && lark_name_char(e[i])) ++i;
        } else if (lark_name_start(c)) {
            size_t j = i;
            while (j < e.size() && lark_name_char(e[j])) ++j;
            const std::string_view name = e.substr(i, j - i);
            if (j < e.size() && e[j] == '{') return error("rule templates (name{...}) are not supported");
            if (lark_is_terminal(name))
                terminal(std::string(name));
            else
                out += name == "start" ? std::string(ctx.start) : std::string(name);
            i = j;
        } else if (c == '(' || c == ')' || c == '|' || c == '*' || c == '+' || c == '?') {
            out += c;
            ++i;
        } else if (c == '%') {
            return error("a directive (%...) inside a rule");
        } else {
            return error(std::string("unexpected '") + c + "'");
        }
    }
    if (optional_depth != 0) return error("unbalanced '['");
    return out;
}

// `%import common.NAME`, `%import common.NAME -> ALIAS`, `%import common (NAME, ...)`: the (name, alias) pairs.
StatusOr<std::vector<std::pair<std::string, std::string>>> lark_import(
    std::string_view rest, const std::function<Status(std::string)>& error) {
    rest = trim(rest);
    size_t i = 0;
    while (i < rest.size() && (lark_name_char(rest[i]) || rest[i] == '.')) ++i;
    std::string_view path = rest.substr(0, i);
    std::vector<std::pair<std::string, std::string>> names;
    std::string_view module;
    const std::string_view tail = trim(rest.substr(i));
    if (!tail.empty() && tail.front() == '(') {
        module = path;
        if (tail.back() != ')') return error("expected %import module (NAME, ...)");
        std::string_view list = tail.substr(1, tail.size() - 2);
        while (!trim(list).empty()) {
            const size_t comma = std::min(list.find(','), list.size());
            const std::string_view name = trim(list.substr(0, comma));
            if (name.empty()) return error("an empty name in %import's list");
            names.emplace_back(name, name);
            list = comma < list.size() ? list.substr(comma + 1) : std::string_view();
        }
    } else {
        const size_t dot = path.rfind('.');
        if (dot == std::string_view::npos) return error("expected %import module.NAME");
        module = path.substr(0, dot);
        const std::string_view name = path.substr(dot + 1);
        std::string alias(name);
        if (!tail.empty()) {
            if (tail.compare(0, 2, "->") != 0) return error("expected -> ALIAS after %import's name");
            alias = std::string(trim(tail.substr(2)));
        }
        names.emplace_back(name, alias);
    }
    if (module != "common")
        return error("only Lark's common terminals can be imported (%import common.NAME), not '" + std::string(module) +
                     "'");
    for (const auto& [name, alias] : names) {
        if (!lark_common_has(name)) return error("Lark's common module has no terminal '" + name + "'");
        if (alias.empty() || !lark_name_start(alias[0]) ||
            !std::all_of(alias.begin(), alias.end(), [](char c) { return lark_name_char(c); }))
            return error("'" + alias + "' is not a name");
    }
    return names;
}

}  // namespace

bool EbnfGrammar::looks_like_lark(std::string_view text) {
    bool any = false;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t nl = std::min(text.find('\n', at), text.size());
        const std::string_view line = trim(strip_lark_comment(text.substr(at, nl - at)));
        at = nl + 1;
        if (line.empty()) continue;
        if (line.find("::=") != std::string_view::npos) return false;
        any = true;
    }
    return any;
}

StatusOr<std::string> EbnfGrammar::lark_to_gbnf(std::string_view text) {
    struct Line {
        std::string_view text;
        size_t number;
    };
    std::vector<Line> lines;
    bool ignore = false;  // %ignore may come after the rules it changes: read the lines first
    for (size_t at = 0, number = 1; at <= text.size(); ++number) {
        const size_t nl = std::min(text.find('\n', at), text.size());
        const std::string_view line = trim(strip_lark_comment(text.substr(at, nl - at)));
        at = nl + 1;
        if (line.empty()) continue;
        lines.push_back({line, number});
        ignore = ignore || (line.compare(0, 7, "%ignore") == 0);
    }
    LarkContext rule_ctx, terminal_ctx;
    rule_ctx.ignore_before_terminals = ignore;
    rule_ctx.start = terminal_ctx.start = ignore ? "lark-start" : "root";

    std::string out;
    std::vector<std::string> ignored;
    std::set<std::string, std::less<>> defined;
    bool has_start = false, common = false;
    const LarkContext* open = nullptr;  // the context of the rule a '|' line continues
    for (const Line& l : lines) {
        const std::string_view line = l.text;
        auto error = [&](const std::string& what) {
            return invalid_argument("the Lark grammar at line " + std::to_string(l.number) + ": " + what);
        };
        auto define = [&](const std::string& name) -> Status {
            if (!defined.insert(name).second) return error("'" + name + "' is defined twice");
            return ok_status();
        };
        if (line.front() == '%') {
            size_t i = 1;
            while (i < line.size() && std::isalpha(static_cast<unsigned char>(line[i]))) ++i;
            const std::string_view directive = line.substr(1, i - 1);
            open = nullptr;
            if (directive == "ignore") {
                StatusOr<std::string> x = lark_expansion(line.substr(i), l.number, terminal_ctx);
                if (!x.ok()) return x.status();
                if (trim(*x).empty()) return error("%ignore takes a terminal");
                ignored.push_back(*x);
            } else if (directive == "import") {
                StatusOr<std::vector<std::pair<std::string, std::string>>> names =
                    lark_import(line.substr(i), [&](const std::string& what) { return error(what); });
                if (!names.ok()) return names.status();
                for (const auto& [name, alias] : *names) {
                    RETURN_IF_ERROR(define(alias));
                    if (alias == "start" || alias == "root") return error("import the terminal under another name");
                    out.append(alias).append(" ::= common-").append(name).append("\n");
                }
                common = true;
            } else {
                return error("the directive %" + std::string(directive) +
                             " is not supported (%import common.NAME and %ignore are)");
            }
            continue;
        }
        if (line.front() == '|') {
            if (open == nullptr) return error("an alternative ('|') before any rule");
            StatusOr<std::string> alt = lark_expansion(line.substr(1), l.number, *open);
            if (!alt.ok()) return alt.status();
            out.pop_back();  // the rule's newline
            out.append(" | ").append(*alt).append("\n");
            continue;
        }
        // name: expansion (a ? or ! before the name, a .priority after it).
        size_t i = 0;
        if (line[i] == '?' || line[i] == '!') ++i;
        const size_t name_at = i;
        if (i >= line.size() || !lark_name_start(line[i])) return error("expected a rule (name: ...)");
        while (i < line.size() && lark_name_char(line[i])) ++i;
        const std::string_view name = line.substr(name_at, i - name_at);
        if (i < line.size() && line[i] == '.') {
            ++i;
            while (i < line.size() && (std::isdigit(static_cast<unsigned char>(line[i])) || line[i] == '-')) ++i;
        }
        while (i < line.size() && line[i] == ' ') ++i;
        if (i < line.size() && line[i] == '{') return error("rule templates (name{...}) are not supported");
        if (i >= line.size() || line[i] != ':')
            return error("expected ':' after the rule name '" + std::string(name) + "'");
        if (name == "root") return error("'root' is the converted grammar's own name for start: rename the rule");
        RETURN_IF_ERROR(define(std::string(name)));
        open = lark_is_terminal(name) ? &terminal_ctx : &rule_ctx;
        StatusOr<std::string> body = lark_expansion(line.substr(i + 1), l.number, *open);
        if (!body.ok()) return body.status();
        has_start = has_start || name == "start";
        out.append(name == "start" ? rule_ctx.start : name).append(" ::= ").append(*body).append("\n");
    }
    if (!has_start) return invalid_argument("the Lark grammar has no start rule");
    // Ignored text may come before each terminal of a rule (above) and at the end.
    if (ignore) {
        out += "root ::= lark-start lark-ignore\nlark-ignore ::= (";
        for (size_t k = 0; k < ignored.size(); ++k) out.append(k > 0 ? " | " : "").append(ignored[k]);
        out += ")*\n";
    }
    if (common) out += kLarkCommon;
    return out;
}

StatusOr<std::shared_ptr<const EbnfGrammar>> EbnfGrammar::compile(std::string_view text) {
    return EbnfCompiler::compile(text);
}

// ---- matcher ----

EbnfMatcher::EbnfMatcher(const EbnfGrammar& grammar) : g_(&grammar) {
    configs_.push_back(key(g_->start_of(g_->root()), -1));
    close(&configs_);
}

int32_t EbnfMatcher::push(int32_t ret, int32_t parent) {
    const int32_t depth = parent < 0 ? 1 : frames_[static_cast<size_t>(parent)].depth + 1;
    if (depth > kMaxDepth) return -1;
    auto [it, fresh] = frame_index_.emplace(key(ret, parent), static_cast<int32_t>(frames_.size()));
    if (fresh) frames_.push_back({ret, parent, depth});
    return it->second;
}

void EbnfMatcher::close(std::vector<uint64_t>* set) {
    std::vector<uint64_t>& out = *set;
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    const size_t seeds = out.size();
    // The seeds are sorted; what closure adds is searched in order while it is a handful, then hashed.
    seen_.clear();
    auto add = [&](uint64_t k) {
        if (std::binary_search(out.begin(), out.begin() + static_cast<long>(seeds), k)) return;
        if (out.size() - seeds <= 32) {
            if (std::find(out.begin() + static_cast<long>(seeds), out.end(), k) != out.end()) return;
            if (out.size() - seeds == 32) seen_.insert(out.begin() + static_cast<long>(seeds), out.end());
        } else if (seen_.count(k)) {
            return;
        }
        if (out.size() >= kMaxConfigs) {
            truncated_ = true;  // (what is kept can still finish: the output is only held tighter)
            return;
        }
        out.push_back(k);
        if (out.size() - seeds > 32) seen_.insert(k);
    };
    for (size_t i = 0; i < out.size(); ++i) {
        const int32_t s = state_of(out[i]), st = stack_of(out[i]);
        for (const auto& [rule, ret] : g_->refs(s))
            if (const int32_t f = push(ret, st); f >= 0) add(key(g_->start_of(rule), f));
        if (st >= 0 && g_->accepting(s)) {
            const Frame& fr = frames_[static_cast<size_t>(st)];
            add(key(fr.ret, fr.parent));
        }
    }
    // A configuration that can neither read nor end was only a way into rules (followed above) or is one the
    // stack bound refused: it adds nothing.
    std::erase_if(out, [&](uint64_t k) {
        const int32_t s = state_of(k);
        return !g_->reads(s) && !(g_->accepting(s) && stack_of(k) < 0);
    });
    std::sort(out.begin(), out.end());
}

bool EbnfMatcher::step(const std::vector<uint64_t>& from, uint8_t byte, std::vector<uint64_t>* to) {
    to->clear();
    for (uint64_t k : from)
        if (const int t = g_->next(state_of(k), byte); t >= 0) to->push_back(key(t, stack_of(k)));
    if (to->empty()) return false;
    close(to);
    return !to->empty();
}

bool EbnfMatcher::feed(std::string_view bytes) {
    std::vector<uint64_t> cur = configs_;
    for (char c : bytes) {
        if (!step(cur, static_cast<uint8_t>(c), &work_)) return false;
        cur.swap(work_);
    }
    configs_ = std::move(cur);
    return true;
}

bool EbnfMatcher::accepting() const {
    for (uint64_t k : configs_)
        if (stack_of(k) < 0 && g_->accepting(state_of(k))) return true;
    return false;
}

size_t EbnfMatcher::SetHash::operator()(const std::vector<uint64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t k : v) h = (h ^ k) * 1099511628211ull;
    return static_cast<size_t>(h ^ (h >> 29));
}

int32_t EbnfMatcher::intern(const std::vector<uint64_t>& set) {
    auto [it, fresh] = set_index_.emplace(set, static_cast<int32_t>(sets_.size()));
    if (fresh) {
        sets_.push_back(set);
        next_.resize(sets_.size() * static_cast<size_t>(g_->num_classes()), -2);
    }
    return it->second;
}

int32_t EbnfMatcher::next_set(int32_t id, uint8_t byte) {
    const size_t at =
        static_cast<size_t>(id) * static_cast<size_t>(g_->num_classes()) + static_cast<size_t>(g_->class_of(byte));
    if (next_[at] != -2) return next_[at];
    // Bytes of one class move every state alike, so the class's answer is the byte's.
    const int32_t to = step(sets_[static_cast<size_t>(id)], byte, &scratch_) ? intern(scratch_) : -1;
    next_[at] = to;
    return to;
}

const uint64_t* EbnfMatcher::loop_bytes(int32_t id) {
    if (loops_.size() < sets_.size()) loops_.resize(sets_.size());
    if (!loops_[static_cast<size_t>(id)].known) {
        // By class: every byte of a class moves the set alike (next_set may grow loops_: index again after).
        std::array<int16_t, 256> rep;
        rep.fill(-1);
        for (int b = 255; b >= 0; --b)
            rep[static_cast<size_t>(g_->class_of(static_cast<uint8_t>(b)))] = static_cast<int16_t>(b);
        std::array<uint8_t, 256> stays{};
        for (size_t c = 0; c < static_cast<size_t>(g_->num_classes()); ++c)
            stays[c] = next_set(id, static_cast<uint8_t>(rep[c])) == id;
        if (loops_.size() < sets_.size()) loops_.resize(sets_.size());
        Loop& l = loops_[static_cast<size_t>(id)];
        for (int b = 0; b < 256; ++b)
            if (stays[static_cast<size_t>(g_->class_of(static_cast<uint8_t>(b)))]) {
                l.bytes[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
                l.any = true;
            }
        l.known = true;
    }
    const Loop& l = loops_[static_cast<size_t>(id)];
    return l.any ? l.bytes.data() : nullptr;
}

void EbnfMatcher::reset_cache() {
    loops_.clear();
    sets_.clear();
    set_index_.clear();
    next_.clear();
    cache_.clear();
    if (frames_.size() <= kMaxFrames) return;
    // Keep the frames the current configurations stand on, renumbered.
    std::vector<Frame> old;
    old.swap(frames_);
    frame_index_.clear();
    std::unordered_map<int32_t, int32_t> renumbered;
    std::function<int32_t(int32_t)> copy = [&](int32_t f) -> int32_t {
        if (f < 0) return -1;
        if (auto it = renumbered.find(f); it != renumbered.end()) return it->second;
        const Frame& fr = old[static_cast<size_t>(f)];
        const int32_t id = push(fr.ret, copy(fr.parent));
        renumbered[f] = id;
        return id;
    };
    for (uint64_t& k : configs_) k = key(state_of(k), copy(stack_of(k)));
    std::sort(configs_.begin(), configs_.end());
}

// TokenTrie's walk for a grammar: a node's configuration set is its parent's after the node's byte.
int64_t TokenTrie::fill_mask(EbnfMatcher& m, std::vector<uint8_t>* mask) const {
    if (mask->size() < static_cast<size_t>(vocab_size_)) mask->resize(static_cast<size_t>(vocab_size_));
    if (m.configs_.empty()) {
        std::fill(mask->begin(), mask->end(), 0);
        return 0;
    }
    if (m.sets_.size() > EbnfMatcher::kMaxSets || m.frames_.size() > EbnfMatcher::kMaxFrames) m.reset_cache();
    const int32_t root = m.intern(m.configs_);
    for (EbnfMatcher::CachedMask& c : m.cache_)
        if (c.set == root) {
            std::copy(c.mask.begin(), c.mask.end(), mask->begin());
            std::fill(mask->begin() + vocab_size_, mask->end(), 0);
            c.used = ++m.clock_;
            return c.count;
        }
    std::fill(mask->begin(), mask->end(), 0);
    const int64_t count = walk_states(
        root, [&](int32_t set, uint8_t byte) { return m.next_set(set, byte); },
        // Near the root only: finding a set's loop bytes costs its every transition, and deep subtrees are small.
        [&](int32_t set, int32_t depth) { return depth < 2 ? m.loop_bytes(set) : nullptr; }, mask->data());
    // Keep the mask for this set (the least recently used one goes).
    EbnfMatcher::CachedMask* slot = nullptr;
    if (m.cache_.size() < kMaxCachedMasks) {
        slot = &m.cache_.emplace_back();
    } else {
        slot = &*std::min_element(m.cache_.begin(), m.cache_.end(),
                                  [](const auto& a, const auto& b) { return a.used < b.used; });
    }
    slot->set = root;
    slot->mask.assign(mask->begin(), mask->begin() + vocab_size_);
    slot->count = count;
    slot->used = ++m.clock_;
    return count;
}

}  // namespace gptoss::structured
