#include "structured/regex_grammar.h"

#include "structured/json_grammar.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <utility>

namespace gptoss::structured {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxNfaStates = 200000;
constexpr size_t kMaxDfaStates = 20000;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxDepth = 200;
// NFA states visited by closures and kept in DFA state sets, in all: bounds the compile's time and memory
// (~0.1 s, ~20 MB) whatever the pattern (nested counted repeats blow up the subset construction).
constexpr int64_t kMaxWork = 5000000;

// A set of code points: sorted, disjoint, non-adjacent ranges, the surrogates never in it.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) {
            out.back().second = std::max(out.back().second, hi);
        } else {
            out.push_back({lo, hi});
        }
    }
    // Take out the surrogates (not characters; never valid UTF-8).
    Ranges clean;
    for (const auto& [lo, hi] : out) {
        if (hi < 0xD800 || lo > 0xDFFF) {
            clean.push_back({lo, hi});
            continue;
        }
        if (lo < 0xD800) clean.push_back({lo, 0xD7FF});
        if (hi > 0xDFFF) clean.push_back({0xE000, hi});
    }
    return clean;
}

Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.push_back({next, lo - 1});
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return normalize(out);
}

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

struct Node {
    enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat };
    Kind kind = Kind::kEmpty;
    Ranges set;                               // kSet
    std::vector<std::unique_ptr<Node>> kids;  // kConcat, kAlt; kRepeat: one
    int min = 0, max = -1;                    // kRepeat; max -1: unbounded
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make(Node::Kind k) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    return n;
}
NodePtr make_set(Ranges r) {
    NodePtr n = make(Node::Kind::kSet);
    n->set = normalize(std::move(r));
    return n;
}

// Decodes one UTF-8 character of `s` at `*i` (advancing it); false on invalid UTF-8.
bool next_code_point(std::string_view s, size_t* i, uint32_t* cp) {
    const auto b0 = static_cast<uint8_t>(s[*i]);
    int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || *i + static_cast<size_t>(n) > s.size()) return false;
    uint32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int k = 1; k < n; ++k) {
        const auto b = static_cast<uint8_t>(s[*i + static_cast<size_t>(k)]);
        if ((b & 0xC0) != 0x80) return false;
        c = (c << 6) | (b & 0x3F);
    }
    static const uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_of[n] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) return false;
    *i += static_cast<size_t>(n);
    *cp = c;
    return true;
}

class Parser {
public:
    explicit Parser(std::string_view p) : p_(p) {}

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

    StatusOr<NodePtr> alternation(int depth) {
        if (depth > kMaxDepth) return error("nested too deeply");
        NodePtr alt = make(Node::Kind::kAlt);
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
        NodePtr cat = make(Node::Kind::kConcat);
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
            NodePtr r = make(Node::Kind::kRepeat);
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
            return make(Node::Kind::kEmpty);
        }
        if (c == '.') {
            ++i_;
            return make_set(complement({{'\n', '\n'}}));
        }
        if (c == '[') return char_class();
        if (c == '\\') {
            Ranges r;
            bool empty = false;
            RETURN_IF_ERROR(escape(/*in_class=*/false, &r, &empty));
            return empty ? make(Node::Kind::kEmpty) : make_set(std::move(r));
        }
        uint32_t cp;
        if (!next_code_point(p_, &i_, &cp)) return error("invalid UTF-8");
        return make_set({{cp, cp}});
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
            uint32_t v = 0;
            for (int k = 0; k < digits; ++k) {
                if (!more() || !std::isxdigit(static_cast<unsigned char>(peek())))
                    return error("\\x, \\u and \\U take " + std::to_string(digits) + " hex digits");
                const char h = p_[i_++];
                v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return error("not a character");
            return one(v);
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
                if (in_class) return error("\\" + std::string(1, c) + " in a character class");
                *empty = true;
                return ok_status();
            case 'b':
            case 'B': return error("word boundaries are not supported");
            default: break;
        }
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
        r = normalize(std::move(r));
        return make_set(negate ? complement(r) : r);
    }

    std::string_view p_;
    size_t i_ = 0;
};

// ---- NFA over bytes ----

struct NfaState {
    std::vector<int32_t> eps;
    uint8_t lo = 1, hi = 0;  // one byte-range edge (lo > hi: none)
    int32_t next = -1;
};

class Nfa {
public:
    std::vector<NfaState> states;
    bool overflow = false;

    int32_t add() {
        if (states.size() >= kMaxNfaStates) {
            overflow = true;
            return 0;
        }
        states.emplace_back();
        return static_cast<int32_t>(states.size() - 1);
    }
    void eps(int32_t a, int32_t b) {
        if (!overflow) states[static_cast<size_t>(a)].eps.push_back(b);
    }
    void edge(int32_t a, uint8_t lo, uint8_t hi, int32_t b) {
        if (overflow) return;
        NfaState& s = states[static_cast<size_t>(a)];
        s.lo = lo, s.hi = hi, s.next = b;
    }

    // Builds `n` from state `from`; returns its end state.
    int32_t build(const Node& n, int32_t from) {
        if (overflow) return from;
        switch (n.kind) {
            case Node::Kind::kEmpty: return from;
            case Node::Kind::kSet: return build_set(n.set, from);
            case Node::Kind::kConcat: {
                int32_t at = from;
                for (const NodePtr& k : n.kids) at = build(*k, at);
                return at;
            }
            case Node::Kind::kAlt: {
                const int32_t end = add();
                for (const NodePtr& k : n.kids) {
                    const int32_t s = add();
                    eps(from, s);
                    eps(build(*k, s), end);
                }
                return end;
            }
            case Node::Kind::kRepeat: {
                const Node& k = *n.kids[0];
                int32_t at = from;
                for (int i = 0; i < n.min && !overflow; ++i) at = build(k, at);
                if (n.max < 0) {  // a loop: at -> body -> at
                    const int32_t loop = add();
                    eps(at, loop);
                    const int32_t body = add();
                    eps(loop, body);
                    eps(build(k, body), loop);
                    return loop;
                }
                const int32_t end = add();
                for (int i = n.min; i < n.max && !overflow; ++i) {
                    eps(at, end);
                    at = build(k, at);
                }
                eps(at, end);
                return end;
            }
        }
        return from;
    }

private:
    // A code-point set as alternatives of UTF-8 byte-range sequences.
    int32_t build_set(const Ranges& set, int32_t from) {
        const int32_t end = add();
        for (const auto& [lo, hi] : set) {
            static const uint32_t bounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
            for (int n = 0; n < 4; ++n) {
                const uint32_t a = std::max(lo, bounds[n][0]), b = std::min(hi, bounds[n][1]);
                if (a <= b) split(a, b, n + 1, from, end);
            }
        }
        return end;
    }
    static void encode(uint32_t c, int n, uint8_t* out) {
        if (n == 1) {
            out[0] = static_cast<uint8_t>(c);
            return;
        }
        static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (int k = n - 1; k > 0; --k) {
            out[k] = static_cast<uint8_t>(0x80 | (c & 0x3F));
            c >>= 6;
        }
        out[0] = static_cast<uint8_t>(lead[n] | c);
    }
    // [a, b], all of encoded length n, as products of byte ranges (split where a continuation byte's range
    // would not cover 0x80-0xBF under a varying prefix).
    void split(uint32_t a, uint32_t b, int n, int32_t from, int32_t end) {
        if (overflow) return;
        for (int i = 1; i < n; ++i) {
            const uint32_t m = (1u << (6 * i)) - 1;
            if ((a & ~m) != (b & ~m)) {
                if ((a & m) != 0) {
                    split(a, a | m, n, from, end);
                    split((a | m) + 1, b, n, from, end);
                    return;
                }
                if ((b & m) != m) {
                    split(a, (b & ~m) - 1, n, from, end);
                    split(b & ~m, b, n, from, end);
                    return;
                }
            }
        }
        uint8_t ea[4], eb[4];
        encode(a, n, ea);
        encode(b, n, eb);
        int32_t at = from;
        for (int k = 0; k < n; ++k) {
            const int32_t to = k + 1 == n ? end : add();
            const int32_t s = add();  // one edge a state: a fresh state off `at`
            eps(at, s);
            edge(s, ea[k], eb[k], to);
            at = to;
        }
    }
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
        // Byte classes: bytes no edge tells apart share a column.
        std::vector<uint8_t> cut(257, 0);
        for (const NfaState& s : nfa.states) {
            if (s.lo > s.hi) continue;
            cut[s.lo] = 1;
            cut[static_cast<size_t>(s.hi) + 1] = 1;
        }
        auto g = std::shared_ptr<RegexGrammar>(new RegexGrammar());
        int cls = -1;
        for (int b = 0; b < 256; ++b) {
            if (b == 0 || cut[static_cast<size_t>(b)]) ++cls;
            g->class_of_[b] = static_cast<uint8_t>(cls);
        }
        g->num_classes_ = cls + 1;
        const size_t C = static_cast<size_t>(g->num_classes_);
        std::vector<uint8_t> rep(C);  // a byte of each class
        for (int b = 255; b >= 0; --b) rep[g->class_of_[b]] = static_cast<uint8_t>(b);

        // Subset construction.
        std::vector<uint32_t> mark(nfa.states.size(), 0);
        uint32_t gen = 0;
        int64_t work = 0;
        auto closure = [&](std::vector<int32_t> set) {
            ++gen;
            std::vector<int32_t> stack = set, out;
            for (int32_t s : set) mark[static_cast<size_t>(s)] = gen;
            while (!stack.empty()) {
                const int32_t s = stack.back();
                stack.pop_back();
                out.push_back(s);
                ++work;
                for (int32_t t : nfa.states[static_cast<size_t>(s)].eps)
                    if (mark[static_cast<size_t>(t)] != gen) {
                        mark[static_cast<size_t>(t)] = gen;
                        stack.push_back(t);
                    }
            }
            std::sort(out.begin(), out.end());
            return out;
        };
        std::map<std::vector<int32_t>, int32_t> index;
        std::vector<std::vector<int32_t>> sets;
        std::vector<int32_t> table;
        sets.push_back(closure({start}));
        index[sets[0]] = 0;
        for (size_t d = 0; d < sets.size(); ++d) {
            table.resize((d + 1) * C, -1);
            for (size_t c = 0; c < C; ++c) {
                const uint8_t b = rep[c];
                std::vector<int32_t> to;
                for (int32_t s : sets[d]) {
                    const NfaState& ns = nfa.states[static_cast<size_t>(s)];
                    if (ns.lo <= b && b <= ns.hi) to.push_back(ns.next);
                }
                if (to.empty()) continue;
                std::sort(to.begin(), to.end());
                to.erase(std::unique(to.begin(), to.end()), to.end());
                std::vector<int32_t> cl = closure(std::move(to));
                if (work > kMaxWork)
                    return invalid_argument("the pattern is too complex to compile (over " + std::to_string(kMaxWork) +
                                            " automaton steps)");
                auto [it, fresh] = index.emplace(cl, static_cast<int32_t>(sets.size()));
                if (fresh) {
                    work += static_cast<int64_t>(cl.size());
                    if (sets.size() >= kMaxDfaStates)
                        return invalid_argument("the pattern's automaton is too large (over " +
                                                std::to_string(kMaxDfaStates) + " states)");
                    sets.push_back(std::move(cl));
                }
                table[d * C + c] = it->second;
            }
        }
        const size_t D = sets.size();
        std::vector<uint8_t> acc(D, 0);
        for (size_t d = 0; d < D; ++d) acc[d] = std::binary_search(sets[d].begin(), sets[d].end(), accept) ? 1 : 0;
        // States that cannot reach a full match are dead: their edges go to -1, so no mask leads there.
        std::vector<std::vector<int32_t>> rev(D);
        for (size_t d = 0; d < D; ++d)
            for (size_t c = 0; c < C; ++c)
                if (const int32_t t = table[d * C + c]; t >= 0)
                    rev[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
        std::vector<uint8_t> live(D, 0);
        std::vector<int32_t> stack;
        for (size_t d = 0; d < D; ++d)
            if (acc[d]) {
                live[d] = 1;
                stack.push_back(static_cast<int32_t>(d));
            }
        while (!stack.empty()) {
            const int32_t t = stack.back();
            stack.pop_back();
            for (int32_t s : rev[static_cast<size_t>(t)])
                if (!live[static_cast<size_t>(s)]) {
                    live[static_cast<size_t>(s)] = 1;
                    stack.push_back(s);
                }
        }
        if (!live[0]) return invalid_argument("the pattern matches nothing");
        for (int32_t& t : table)
            if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
        g->table_ = std::move(table);
        g->accepting_ = std::move(acc);
        return std::shared_ptr<const RegexGrammar>(std::move(g));
    }
};

StatusOr<std::shared_ptr<const RegexGrammar>> RegexGrammar::compile(std::string_view pattern) {
    Parser p(pattern);
    StatusOr<NodePtr> ast = p.parse();
    if (!ast.ok()) return ast.status();
    return RegexCompiler::from_ast(**ast);
}

StatusOr<std::shared_ptr<const RegexGrammar>> RegexGrammar::choice(const std::vector<std::string>& options) {
    if (options.empty()) return invalid_argument("no choices");
    NodePtr alt = make(Node::Kind::kAlt);
    size_t total = 0;
    for (size_t k = 0; k < options.size(); ++k) {
        const std::string& o = options[k];
        if (o.empty()) return invalid_argument("choice " + std::to_string(k) + " is empty");
        total += o.size();
        if (total > kMaxNfaStates / 2) return invalid_argument("the choices are too long");
        NodePtr cat = make(Node::Kind::kConcat);
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
    int64_t count = 0;
    if (state < 0) return 0;
    struct Frame {
        uint32_t node;
        int state;
    };
    std::vector<Frame> stack{{0, state}};
    while (!stack.empty()) {
        const Frame f = stack.back();
        stack.pop_back();
        const Node& nd = nodes_[f.node];
        for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c) {
            const Node& ch = nodes_[c];
            const int next = g.next(f.state, ch.byte);
            if (next < 0) continue;
            take(ch.lo, ch.lo + ch.own, mask->data(), &count);
            if (ch.num_children > 0) stack.push_back({c, next});
        }
    }
    return count;
}

int RegexGrammar::feed(int state, std::string_view bytes) const {
    for (char c : bytes) {
        if (state < 0) return -1;
        state = next(state, static_cast<uint8_t>(c));
    }
    return state;
}

}  // namespace gptoss::structured
