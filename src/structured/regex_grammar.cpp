#include "structured/regex_grammar.h"

#include "structured/byte_nfa.h"
#include "structured/json_grammar.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <utility>

namespace gptoss::structured {

namespace {

using namespace detail;

constexpr size_t kMaxDfaStates = 20000;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxDepth = 200;
// NFA states visited by closures and kept in DFA state sets, in all: bounds the compile's time and memory
// (~0.1 s, ~20 MB) whatever the pattern (nested counted repeats blow up the subset construction).
constexpr int64_t kMaxWork = 5000000;

const Ranges& digit_ranges() {
    static const Ranges r = {{'0', '9'}};
    return r;
}
const Ranges& word_ranges() {
    static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    return r;
}
const Ranges& space_ranges() {
    static const Ranges r = {{'\t', '\r'}, {' ', ' '}};
    return r;
}

class Parser {
public:
    Parser(std::string_view p, RegexFlags flags) : p_(p), flags_(flags) {}

    StatusOr<NodePtr> parse() {
        StatusOr<NodePtr> n = alternation(0);
        if (!n.ok()) return n;
        if (i_ < p_.size()) return error("unbalanced ')'");
        return n;
    }

private:
    Status error(const std::string& what) const {
        return invalid_argument("the pattern at offset " + std::to_string(i_) + ": " + what);
    }
    bool more() const { return i_ < p_.size(); }
    char peek() const { return p_[i_]; }
    // A set as the flags read it (a case-insensitive pattern's letters match either case).
    Ranges cased(Ranges r) const { return flags_.ignore_case ? with_other_case(r) : normalize(std::move(r)); }

    StatusOr<NodePtr> alternation(int depth) {
        if (depth > kMaxDepth) return error("nested too deeply");
        NodePtr alt = make_node(Node::Kind::kAlt);
        for (;;) {
            StatusOr<NodePtr> c = concatenation(depth);
            if (!c.ok()) return c;
            alt->kids.push_back(std::move(*c));
            if (more() && peek() == '|') {
                ++i_;
                continue;
            }
            break;
        }
        if (alt->kids.size() == 1) return std::move(alt->kids[0]);
        return alt;
    }

    StatusOr<NodePtr> concatenation(int depth) {
        NodePtr cat = make_node(Node::Kind::kConcat);
        while (more() && peek() != '|' && peek() != ')') {
            StatusOr<NodePtr> a = atom(depth);
            if (!a.ok()) return a;
            StatusOr<NodePtr> q = quantified(std::move(*a));
            if (!q.ok()) return q;
            cat->kids.push_back(std::move(*q));
        }
        return cat;
    }

    // {n}, {n,}, {n,m}, {,m} at i_ (just past '{'); false if it is not a quantifier (a literal '{').
    bool braces(int* lo, int* hi) {
        size_t j = i_;
        auto number = [&](int* out) {
            const size_t s = j;
            long v = 0;
            while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') v = std::min<long>(v * 10 + (p_[j++] - '0'), 1000001);
            *out = static_cast<int>(v);
            return j > s;
        };
        int a = 0, b = -1;
        const bool has_a = number(&a);
        if (j < p_.size() && p_[j] == '}') {
            if (!has_a) return false;
            b = a;
        } else if (j < p_.size() && p_[j] == ',') {
            ++j;
            const bool has_b = number(&b);
            if (!has_b) b = -1;
            if (!has_a) a = 0;  // {,m}; {,} is {0,} (as Python reads them)
            if (j >= p_.size() || p_[j] != '}') return false;
        } else {
            return false;
        }
        i_ = j + 1;
        *lo = a;
        *hi = b;
        return true;
    }

    StatusOr<NodePtr> quantified(NodePtr a) {
        bool repeated = false;
        while (more()) {
            int lo, hi;
            const char c = peek();
            if (c == '*') {
                lo = 0, hi = -1, ++i_;
            } else if (c == '+') {
                lo = 1, hi = -1, ++i_;
            } else if (c == '?') {
                lo = 0, hi = 1, ++i_;
            } else if (c == '{') {
                ++i_;
                if (!braces(&lo, &hi)) {
                    --i_;
                    return a;  // a literal '{' follows
                }
            } else {
                return a;
            }
            if (repeated) return error("multiple repeat (a quantifier on a quantifier)");
            repeated = true;
            if (hi >= 0 && lo > hi) return error("a quantifier's minimum is above its maximum");
            if (lo > kMaxRepeat || hi > kMaxRepeat)
                return error("a repetition count above " + std::to_string(kMaxRepeat));
            if (more() && peek() == '?') {
                ++i_;  // lazy: the same language
            } else if (more() && peek() == '+') {
                return error("possessive quantifiers are not supported");
            }
            NodePtr r = make_node(Node::Kind::kRepeat);
            r->min = lo;
            r->max = hi;
            r->kids.push_back(std::move(a));
            a = std::move(r);
        }
        return a;
    }

    StatusOr<NodePtr> atom(int depth) {
        const char c = peek();
        if (c == '(') {
            ++i_;
            if (more() && peek() == '?') {
                ++i_;
                if (more() && peek() == ':') {
                    ++i_;
                } else if (more() && (peek() == 'P' || peek() == '<')) {
                    if (peek() == 'P') ++i_;
                    if (!more() || peek() != '<') return error("only (?: ) and named groups (?P<name> ) are supported");
                    ++i_;
                    if (more() && (peek() == '=' || peek() == '!')) return error("lookbehind is not supported");
                    while (more() && peek() != '>') ++i_;
                    if (!more()) return error("an unterminated group name");
                    ++i_;
                } else if (more() && (peek() == '=' || peek() == '!')) {
                    return error("lookahead is not supported");
                } else {
                    return error("inline flags and other (? ) groups are not supported");
                }
            }
            StatusOr<NodePtr> inner = alternation(depth + 1);
            if (!inner.ok()) return inner;
            if (!more() || peek() != ')') return error("missing ')'");
            ++i_;
            return inner;
        }
        if (c == ')') return error("unbalanced ')'");
        if (c == '*' || c == '+' || c == '?') return error("nothing to repeat");
        if (c == '{') {
            int lo, hi;
            const size_t at = i_;
            ++i_;
            const bool q = braces(&lo, &hi);
            i_ = at;
            if (q) return error("nothing to repeat");
        }
        if (c == '^' || c == '$') {
            // The whole output matches, so anchors are implied: accepted where they can only be that (a pattern's
            // or an alternative's start / end), refused elsewhere (a^b matches nothing in Python).
            const bool at_start =
                i_ == 0 || p_[i_ - 1] == '(' || p_[i_ - 1] == '|' || (i_ >= 3 && p_.compare(i_ - 3, 3, "(?:") == 0);
            const bool at_end = i_ + 1 == p_.size() || p_[i_ + 1] == ')' || p_[i_ + 1] == '|';
            if (c == '^' ? !at_start : !at_end)
                return error(std::string(1, c) + " only at the start / end of the pattern or of an alternative");
            ++i_;
            if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
                return error("nothing to repeat");
            return make_node(Node::Kind::kEmpty);
        }
        if (c == '.') {
            ++i_;
            return make_set(flags_.dot_all ? complement({}) : complement({{'\n', '\n'}}));
        }
        if (c == '[') return char_class();
        if (c == '\\') {
            Ranges r;
            bool empty = false;
            RETURN_IF_ERROR(escape(/*in_class=*/false, &r, &empty));
            return empty ? make_node(Node::Kind::kEmpty) : make_set(cased(std::move(r)));
        }
        uint32_t cp;
        if (!next_code_point(p_, &i_, &cp)) return error("invalid UTF-8");
        return make_set(cased({{cp, cp}}));
    }

    // A backslash escape at i_ (at the '\'): its set, or `empty` for \A \Z \z.
    Status escape(bool in_class, Ranges* out, bool* empty) {
        ++i_;
        if (!more()) return error("a trailing backslash");
        const char c = p_[i_++];
        auto one = [&](uint32_t cp) {
            out->push_back({cp, cp});
            return ok_status();
        };
        auto hex = [&](int digits) -> Status {
            const size_t at = i_;
            uint32_t v = 0;
            if (hex_code_point(p_, &i_, digits, &v)) return one(v);
            if (i_ < at + static_cast<size_t>(digits))
                return error("\\x, \\u and \\U take " + std::to_string(digits) + " hex digits");
            return error("not a character");
        };
        switch (c) {
            case 'd': *out = digit_ranges(); return ok_status();
            case 'D': *out = complement(digit_ranges()); return ok_status();
            case 'w': *out = word_ranges(); return ok_status();
            case 'W': *out = complement(word_ranges()); return ok_status();
            case 's': *out = space_ranges(); return ok_status();
            case 'S': *out = complement(space_ranges()); return ok_status();
            case 'n': return one('\n');
            case 't': return one('\t');
            case 'r': return one('\r');
            case 'f': return one('\f');
            case 'v': return one('\v');
            case '0':
                if (more() && peek() >= '0' && peek() <= '7') return error("octal escapes are not supported");
                return one(0);
            case 'x': return hex(2);
            case 'u': return hex(4);
            case 'U': return hex(8);
            case 'A':
            case 'Z':
            case 'z':
                if (in_class) return error(std::string{'\\', c} + " in a character class");
                *empty = true;
                return ok_status();
            case 'b':
            case 'B': return error("word boundaries are not supported");
            default: break;
        }
        // Python's reading: three octal digits (or any digits inside a class) are an octal escape, else \1-\99 a
        // backreference; both refused, each by its name.
        const auto octal = [](char d) { return d >= '0' && d <= '7'; };
        if (c >= '1' && c <= '9' &&
            (in_class || (octal(c) && i_ + 1 < p_.size() && octal(p_[i_]) && octal(p_[i_ + 1]))))
            return error("octal escapes are not supported");
        if (c >= '1' && c <= '9') return error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) return error("unknown escape \\" + std::string(1, c));
        --i_;
        uint32_t cp;
        if (!next_code_point(p_, &i_, &cp)) return error("invalid UTF-8");
        return one(cp);
    }

    StatusOr<NodePtr> char_class() {
        ++i_;  // '['
        bool negate = false;
        if (more() && peek() == '^') {
            negate = true;
            ++i_;
        }
        Ranges r;
        bool first = true;
        for (;;) {
            if (!more()) return error("an unterminated character class");
            if (peek() == ']' && !first) {
                ++i_;
                break;
            }
            if (peek() == '[' && i_ + 1 < p_.size() && (p_[i_ + 1] == ':' || p_[i_ + 1] == '=' || p_[i_ + 1] == '.'))
                return error("POSIX classes are not supported");
            first = false;
            // One class item: a character or an escape (a set: no range from it).
            Ranges item;
            bool single = true;
            uint32_t lo = 0;
            if (peek() == '\\') {
                bool empty = false;
                RETURN_IF_ERROR(escape(/*in_class=*/true, &item, &empty));
                single = item.size() == 1 && item[0].first == item[0].second;
                lo = single ? item[0].first : 0;
            } else {
                if (!next_code_point(p_, &i_, &lo)) return error("invalid UTF-8");
                item = {{lo, lo}};
            }
            // A range lo-hi (a '-' before ']' is a literal); a set (\d) cannot begin one.
            if (!single && more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']')
                return error("bad character range");
            if (single && more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
                ++i_;
                uint32_t hi = 0;
                if (peek() == '\\') {
                    Ranges end;
                    bool empty = false;
                    RETURN_IF_ERROR(escape(/*in_class=*/true, &end, &empty));
                    if (end.size() != 1 || end[0].first != end[0].second)
                        return error("a range must end with a character");
                    hi = end[0].first;
                } else if (!next_code_point(p_, &i_, &hi)) {
                    return error("invalid UTF-8");
                }
                if (hi < lo) return error("a range out of order");
                item = {{lo, hi}};
            }
            r.insert(r.end(), item.begin(), item.end());
        }
        r = cased(std::move(r));  // (a negated class leaves out both cases of its letters, as Python's does)
        return make_set(negate ? complement(r) : r);
    }

    std::string_view p_;
    RegexFlags flags_;
    size_t i_ = 0;
};

}  // namespace

class RegexCompiler {
public:
    static StatusOr<std::shared_ptr<const RegexGrammar>> from_ast(const Node& root) {
        Nfa nfa;
        const int32_t start = nfa.add();
        const int32_t accept = nfa.build(root, start);
        if (nfa.overflow)
            return invalid_argument("the pattern is too large (over " + std::to_string(kMaxNfaStates) +
                                    " automaton states)");
        Dfa dfa;
        RETURN_IF_ERROR(determinize(nfa, {start}, kMaxDfaStates, kMaxWork, "the pattern", &dfa));
        const size_t D = dfa.size();
        std::vector<uint8_t> acc(D, 0);
        for (size_t d = 0; d < D; ++d) acc[d] = std::binary_search(dfa.sets[d].begin(), dfa.sets[d].end(), accept);
        // States that cannot reach a full match are dead: their edges go to -1, so no mask leads there.
        const std::vector<uint8_t> live = live_states(dfa, acc, nullptr);
        if (!live[0]) return invalid_argument("the pattern matches nothing");
        prune(live, nullptr, &dfa);
        auto g = std::shared_ptr<RegexGrammar>(new RegexGrammar());
        g->num_classes_ = dfa.num_classes;
        std::copy(dfa.class_of, dfa.class_of + 256, g->class_of_);
        g->table_ = std::move(dfa.table);
        g->accepting_ = std::move(acc);
        // The bytes that keep each state where it is ([^"]* and the like).
        g->loops_.assign(D, {});
        g->has_loop_.assign(D, 0);
        for (size_t d = 0; d < D; ++d)
            for (int b = 0; b < 256; ++b)
                if (g->next(static_cast<int>(d), static_cast<uint8_t>(b)) == static_cast<int>(d)) {
                    g->loops_[d][static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
                    g->has_loop_[d] = 1;
                }
        return std::shared_ptr<const RegexGrammar>(std::move(g));
    }
};

StatusOr<NodePtr> detail::parse_regex(std::string_view pattern, RegexFlags flags) {
    return Parser(pattern, flags).parse();
}

StatusOr<std::shared_ptr<const RegexGrammar>> RegexGrammar::compile(std::string_view pattern) {
    StatusOr<NodePtr> ast = parse_regex(pattern);
    if (!ast.ok()) return ast.status();
    return RegexCompiler::from_ast(**ast);
}

StatusOr<std::shared_ptr<const RegexGrammar>> RegexGrammar::choice(const std::vector<std::string>& options) {
    if (options.empty()) return invalid_argument("no choices");
    NodePtr alt = make_node(Node::Kind::kAlt);
    size_t total = 0;
    for (size_t k = 0; k < options.size(); ++k) {
        const std::string& o = options[k];
        if (o.empty()) return invalid_argument("choice " + std::to_string(k) + " is empty");
        total += o.size();
        if (total > kMaxNfaStates / 2) return invalid_argument("the choices are too long");
        NodePtr cat = make_node(Node::Kind::kConcat);
        for (size_t i = 0; i < o.size();) {
            uint32_t cp;
            if (!next_code_point(o, &i, &cp)) return invalid_argument("choice " + std::to_string(k) + " is not UTF-8");
            cat->kids.push_back(make_set({{cp, cp}}));
        }
        alt->kids.push_back(std::move(cat));
    }
    return RegexCompiler::from_ast(*alt);
}

// TokenTrie's walk for a regex: a node's state is its parent's after the node's byte.
int64_t TokenTrie::fill_mask(const RegexGrammar& g, int state, std::vector<uint8_t>* mask) const {
    if (mask->size() < static_cast<size_t>(vocab_size_)) mask->resize(static_cast<size_t>(vocab_size_));
    std::fill(mask->begin(), mask->end(), 0);
    if (state < 0) return 0;
    return walk_states(
        state, [&](int32_t s, uint8_t byte) { return g.next(s, byte); },
        [&](int32_t s, int32_t) { return g.loop_bytes(s); }, mask->data());
}

int RegexGrammar::feed(int state, std::string_view bytes) const {
    for (char c : bytes) {
        if (state < 0) return -1;
        state = next(state, static_cast<uint8_t>(c));
    }
    return state;
}

}  // namespace gptoss::structured
