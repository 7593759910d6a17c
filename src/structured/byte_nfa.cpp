#include "structured/byte_nfa.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <string>

namespace gptoss::structured::detail {

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

NodePtr make_node(Node::Kind k) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    return n;
}
NodePtr make_set(Ranges r) {
    NodePtr n = make_node(Node::Kind::kSet);
    n->set = normalize(std::move(r));
    return n;
}

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

bool hex_code_point(std::string_view s, size_t* i, int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
        if (*i >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[*i]))) return false;
        const char h = s[(*i)++];
        v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return false;
    *cp = v;
    return true;
}

NodePtr make_literal(std::string_view s) {
    NodePtr cat = make_node(Node::Kind::kConcat);
    for (size_t i = 0; i < s.size();) {
        uint32_t cp = 0;
        if (!next_code_point(s, &i, &cp)) break;
        cat->kids.push_back(make_set({{cp, cp}}));
    }
    return cat;
}

Ranges with_other_case(const Ranges& r) {
    // Upper-case letters [lo, hi] and the distance to their lower case (single letters too: the other forms of s, k,
    // å, μ and ß that Python's case-insensitive matching pairs with them).
    struct Pair {
        uint32_t lo, hi;
        int32_t delta;
    };
    static constexpr Pair kPairs[] = {
        {0x41, 0x5A, 32},
        {0xC0, 0xD6, 32},
        {0xD8, 0xDE, 32},
        {0x178, 0x178, -121},  // A-Z, À-Þ, Ÿ-ÿ
        {0x17F, 0x17F, 0x73 - 0x17F},
        {0x212A, 0x212A, 0x6B - 0x212A},
        {0x212B, 0x212B, 0xE5 - 0x212B},  // ſ-s, K-k, Å-å
        {0x1E9E, 0x1E9E, 0xDF - 0x1E9E},
        {0xB5, 0xB5, 0x3BC - 0xB5},  // ẞ-ß, µ-μ
        {0x386, 0x386, 38},
        {0x388, 0x38A, 37},
        {0x38C, 0x38C, 64},
        {0x38E, 0x38F, 63},  // Greek, accented
        {0x391, 0x3A1, 32},
        {0x3A3, 0x3AB, 32},
        {0x3A3, 0x3A3, 31},  // Greek, Σ-ς
        {0x400, 0x40F, 80},
        {0x410, 0x42F, 32},  // Cyrillic
        {0x531, 0x556, 48},  // Armenian
    };
    // Blocks of alternating pairs: upper lo, lower lo + 1, upper lo + 2, ... up to hi.
    struct Alternating {
        uint32_t lo, hi;
    };
    static constexpr Alternating kAlternating[] = {
        {0x100, 0x12F},   {0x132, 0x137},   {0x139, 0x148}, {0x14A, 0x177}, {0x179, 0x17E},  // Latin Extended-A
        {0x1CD, 0x1DC},   {0x1DE, 0x1EF},   {0x1F8, 0x21F}, {0x222, 0x233},                  // Latin Extended-B
        {0x3E2, 0x3EF},                                                                      // Coptic in Greek
        {0x460, 0x481},   {0x48A, 0x4BF},   {0x4C1, 0x4CE}, {0x4D0, 0x52F},                  // Cyrillic
        {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF},  // Latin Extended Additional
    };
    auto shifted = [](uint32_t a, uint32_t b, int32_t d) {
        return std::pair<uint32_t, uint32_t>{static_cast<uint32_t>(static_cast<int64_t>(a) + d),
                                             static_cast<uint32_t>(static_cast<int64_t>(b) + d)};
    };
    Ranges out = normalize(r);
    // Twice, so that letters with three forms (σ ς Σ, k K K) reach each other.
    for (int pass = 0; pass < 2; ++pass) {
        Ranges add;
        for (const auto& [lo, hi] : out) {
            for (const Pair& p : kPairs) {
                const auto [llo, lhi] = shifted(p.lo, p.hi, p.delta);
                if (const uint32_t a = std::max(lo, p.lo), b = std::min(hi, p.hi); a <= b)
                    add.push_back(shifted(a, b, p.delta));
                if (const uint32_t a = std::max(lo, llo), b = std::min(hi, lhi); a <= b)
                    add.push_back(shifted(a, b, -p.delta));
            }
            for (const Alternating& p : kAlternating)
                for (uint32_t c = std::max(lo, p.lo), end = std::min(hi, p.hi); c <= end && c <= p.hi; ++c) {
                    const uint32_t other = (c - p.lo) % 2 == 0 ? c + 1 : c - 1;
                    add.push_back({other, other});
                }
        }
        out.insert(out.end(), add.begin(), add.end());
        out = normalize(std::move(out));
    }
    return out;
}

namespace {

// One character in a GBNF literal or class: printable ASCII as is, the rest (and the characters the syntax
// uses) escaped.
void gbnf_char(uint32_t cp, bool in_class, std::string* out) {
    const bool special = cp == '\\' || cp == '"' || cp == '[' || cp == ']' || (in_class && (cp == '-' || cp == '^'));
    if (cp >= 0x20 && cp < 0x7F && !special) {
        out->push_back(static_cast<char>(cp));
        return;
    }
    char buf[16];
    std::snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", cp);
    out->append(buf);
}

bool one_character(const Node& n) {
    return n.kind == Node::Kind::kSet && n.set.size() == 1 && n.set[0].first == n.set[0].second;
}

void append_gbnf(const Node& n, std::string* out) {
    switch (n.kind) {
        case Node::Kind::kEmpty:
        case Node::Kind::kRef: out->append("\"\""); return;  // (no references in a regular expression's tree)
        case Node::Kind::kSet:
            if (one_character(n)) {
                out->push_back('"');
                gbnf_char(n.set[0].first, false, out);
                out->push_back('"');
                return;
            }
            out->push_back('[');
            for (const auto& [lo, hi] : n.set) {
                gbnf_char(lo, true, out);
                if (hi == lo) continue;
                if (hi > lo + 1) out->push_back('-');
                gbnf_char(hi, true, out);
            }
            out->push_back(']');
            return;
        case Node::Kind::kConcat:
            if (n.kids.empty()) {
                out->append("\"\"");
                return;
            }
            out->push_back('(');
            for (size_t k = 0; k < n.kids.size();) {
                if (k > 0) out->push_back(' ');
                if (!one_character(*n.kids[k])) {
                    append_gbnf(*n.kids[k++], out);
                    continue;
                }
                out->push_back('"');  // a run of single characters as one literal
                for (; k < n.kids.size() && one_character(*n.kids[k]); ++k)
                    gbnf_char(n.kids[k]->set[0].first, false, out);
                out->push_back('"');
            }
            out->push_back(')');
            return;
        case Node::Kind::kAlt:
            out->push_back('(');
            for (size_t k = 0; k < n.kids.size(); ++k) {
                if (k > 0) out->append(" | ");
                append_gbnf(*n.kids[k], out);
            }
            out->push_back(')');
            return;
        case Node::Kind::kRepeat:
            out->push_back('(');
            append_gbnf(*n.kids[0], out);
            out->push_back(')');
            if (n.max < 0 && n.min <= 1) {
                out->push_back(n.min == 0 ? '*' : '+');
            } else if (n.min == 0 && n.max == 1) {
                out->push_back('?');
            } else {
                out->push_back('{');
                out->append(std::to_string(n.min));
                if (n.max != n.min) {
                    out->push_back(',');
                    if (n.max >= 0) out->append(std::to_string(n.max));
                }
                out->push_back('}');
            }
            return;
    }
}

}  // namespace

std::string to_gbnf(const Node& n) {
    std::string out;
    append_gbnf(n, &out);
    return out;
}

namespace {

void encode_utf8(uint32_t c, int n, uint8_t* out) {
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

}  // namespace

// ---- NFA over bytes ----

int32_t Nfa::add() {
    if (states.size() >= kMaxNfaStates) {
        overflow = true;
        return 0;
    }
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
}

void Nfa::eps(int32_t a, int32_t b) {
    if (!overflow) states[static_cast<size_t>(a)].eps.push_back(b);
}

void Nfa::edge(int32_t a, uint8_t lo, uint8_t hi, int32_t b) {
    if (overflow) return;
    NfaState& s = states[static_cast<size_t>(a)];
    s.lo = lo, s.hi = hi, s.next = b;
}

// Builds `n` from state `from`; returns its end state.
int32_t Nfa::build(const Node& n, int32_t from) {
    if (overflow) return from;
    switch (n.kind) {
        case Node::Kind::kEmpty: return from;
        case Node::Kind::kRef: {
            const int32_t end = add();
            const int32_t s = add();  // one edge a state: a fresh state off `from`
            eps(from, s);
            if (!overflow) {
                states[static_cast<size_t>(s)].ref = n.rule;
                states[static_cast<size_t>(s)].next = end;
            }
            return end;
        }
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

// A code-point set as alternatives of UTF-8 byte-range sequences.
int32_t Nfa::build_set(const Ranges& set, int32_t from) {
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
// [a, b], all of encoded length n, as products of byte ranges (split where a continuation byte's range
// would not cover 0x80-0xBF under a varying prefix).
void Nfa::split(uint32_t a, uint32_t b, int n, int32_t from, int32_t end) {
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
    encode_utf8(a, n, ea);
    encode_utf8(b, n, eb);
    int32_t at = from;
    for (int k = 0; k < n; ++k) {
        const int32_t to = k + 1 == n ? end : add();
        const int32_t s = add();  // one edge a state: a fresh state off `at`
        eps(at, s);
        edge(s, ea[k], eb[k], to);
        at = to;
    }
}

int byte_classes(const Nfa& nfa, uint8_t* class_of) {
    std::vector<uint8_t> cut(257, 0);
    for (const NfaState& s : nfa.states) {
        if (s.lo > s.hi) continue;
        cut[s.lo] = 1;
        cut[static_cast<size_t>(s.hi) + 1] = 1;
    }
    int cls = -1;
    for (int b = 0; b < 256; ++b) {
        if (b == 0 || cut[static_cast<size_t>(b)]) ++cls;
        class_of[b] = static_cast<uint8_t>(cls);
    }
    return cls + 1;
}

}  // namespace gptoss::structured::detail

namespace gptoss::structured::detail {

Status determinize(const Nfa& nfa, const std::vector<int32_t>& starts, size_t max_states, int64_t max_work,
                   const std::string& what, Dfa* out) {
    Dfa& d = *out;
    d.num_classes = byte_classes(nfa, d.class_of);
    const size_t C = static_cast<size_t>(d.num_classes);
    std::vector<uint8_t> rep(C);  // a byte of each class
    for (int b = 255; b >= 0; --b) rep[d.class_of[b]] = static_cast<uint8_t>(b);
    std::vector<uint32_t> mark(nfa.states.size(), 0);
    uint32_t gen = 0;
    int64_t work = 0;
    auto closure = [&](std::vector<int32_t> set) {
        ++gen;
        std::vector<int32_t> stack = set, closed;
        for (int32_t s : set) mark[static_cast<size_t>(s)] = gen;
        while (!stack.empty()) {
            const int32_t s = stack.back();
            stack.pop_back();
            closed.push_back(s);
            ++work;
            for (int32_t t : nfa.states[static_cast<size_t>(s)].eps)
                if (mark[static_cast<size_t>(t)] != gen) {
                    mark[static_cast<size_t>(t)] = gen;
                    stack.push_back(t);
                }
        }
        std::sort(closed.begin(), closed.end());
        return closed;
    };
    std::map<std::vector<int32_t>, int32_t> index;
    auto intern = [&](std::vector<int32_t> set) -> StatusOr<int32_t> {
        std::vector<int32_t> cl = closure(std::move(set));
        if (work > max_work)
            return invalid_argument(what + " is too complex to compile (over " + std::to_string(max_work) +
                                    " automaton steps)");
        auto [it, fresh] = index.emplace(cl, static_cast<int32_t>(d.sets.size()));
        if (fresh) {
            work += static_cast<int64_t>(cl.size());
            if (d.sets.size() >= max_states)
                return invalid_argument(what + "'s automaton is too large (over " + std::to_string(max_states) +
                                        " states)");
            d.sets.push_back(std::move(cl));
        }
        return it->second;
    };
    for (int32_t s : starts) {
        StatusOr<int32_t> st = intern({s});
        if (!st.ok()) return st.status();
        d.start_of.push_back(*st);
    }
    for (size_t k = 0; k < d.sets.size(); ++k) {
        d.table.resize((k + 1) * C, -1);
        d.refs.resize(k + 1);
        for (size_t c = 0; c < C; ++c) {
            const uint8_t b = rep[c];
            std::vector<int32_t> to;
            for (int32_t s : d.sets[k]) {
                const NfaState& ns = nfa.states[static_cast<size_t>(s)];
                if (ns.lo <= b && b <= ns.hi) to.push_back(ns.next);
            }
            if (to.empty()) continue;
            std::sort(to.begin(), to.end());
            to.erase(std::unique(to.begin(), to.end()), to.end());
            StatusOr<int32_t> t = intern(std::move(to));
            if (!t.ok()) return t.status();
            d.table[k * C + c] = *t;
        }
        // Rule references: one target set a rule.
        std::map<int32_t, std::vector<int32_t>> by_rule;
        for (int32_t s : d.sets[k]) {
            const NfaState& ns = nfa.states[static_cast<size_t>(s)];
            if (ns.ref >= 0) by_rule[ns.ref].push_back(ns.next);
        }
        for (auto& [rule, to] : by_rule) {
            std::sort(to.begin(), to.end());
            to.erase(std::unique(to.begin(), to.end()), to.end());
            StatusOr<int32_t> t = intern(std::move(to));
            if (!t.ok()) return t.status();
            d.refs[k].push_back({rule, *t});
        }
    }
    return ok_status();
}

std::vector<uint8_t> live_states(const Dfa& dfa, const std::vector<uint8_t>& accepting,
                                 const std::vector<uint8_t>* usable) {
    const size_t D = dfa.size(), C = static_cast<size_t>(dfa.num_classes);
    std::vector<std::vector<int32_t>> rev(D);
    for (size_t d = 0; d < D; ++d) {
        for (size_t c = 0; c < C; ++c)
            if (const int32_t t = dfa.table[d * C + c]; t >= 0)
                rev[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
        if (usable)
            for (const auto& [rule, t] : dfa.refs[d])
                if ((*usable)[static_cast<size_t>(rule)])
                    rev[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
    }
    std::vector<uint8_t> live(D, 0);
    std::vector<int32_t> stack;
    for (size_t d = 0; d < D; ++d)
        if (accepting[d]) {
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
    return live;
}

void prune(const std::vector<uint8_t>& live, const std::vector<uint8_t>* usable, Dfa* dfa) {
    for (int32_t& t : dfa->table)
        if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
    for (auto& refs : dfa->refs)
        std::erase_if(refs, [&](const std::pair<int32_t, int32_t>& r) {
            return !usable || !(*usable)[static_cast<size_t>(r.first)] || !live[static_cast<size_t>(r.second)];
        });
}

}  // namespace gptoss::structured::detail
