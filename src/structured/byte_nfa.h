// Internal to structured/: the pieces the regex and EBNF compilers share. Code-point sets, a small syntax tree
// (sets, concatenation, alternation, counted repetition and, for grammars, references to rules) and its
// translation into a byte-level NFA whose edges are UTF-8 byte ranges, epsilon moves and rule references.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gptoss::structured::detail {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr size_t kMaxNfaStates = 200000;

// A set of code points: sorted, disjoint, non-adjacent ranges, the surrogates never in it.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r);
Ranges complement(const Ranges& r);

// Decodes one UTF-8 character of `s` at `*i` (advancing it); false on invalid UTF-8.
bool next_code_point(std::string_view s, size_t* i, uint32_t* cp);
// `digits` hex digits of `s` at `*i` (advancing it) as a character; false if they are missing or name no
// character (a surrogate, past U+10FFFF).
bool hex_code_point(std::string_view s, size_t* i, int digits, uint32_t* cp);

struct Node {
    enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kRef };
    Kind kind = Kind::kEmpty;
    Ranges set;                               // kSet
    std::vector<std::unique_ptr<Node>> kids;  // kConcat, kAlt; kRepeat: one
    int min = 0, max = -1;                    // kRepeat; max -1: unbounded
    int rule = -1;                            // kRef: the rule it stands for
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make_node(Node::Kind k);
NodePtr make_set(Ranges r);
// The UTF-8 text `s` (valid) as a concatenation of one-character sets.
NodePtr make_literal(std::string_view s);

// The set with each letter's other case added (a case-insensitive match: Latin, Greek, Cyrillic and Armenian
// letters with one-to-one pairs, and Python's extra forms of s, k, å, μ, ß; other scripts are not paired).
Ranges with_other_case(const Ranges& r);

// Python's regular-expression flags that change a pattern's language.
struct RegexFlags {
    bool ignore_case = false;  // re.I
    bool dot_all = false;      // re.S: '.' matches '\n' too
};
// The pattern's tree (regex_grammar.h's syntax).
StatusOr<NodePtr> parse_regex(std::string_view pattern, RegexFlags flags = {});

// A tree of sets, concatenations, alternations and repetitions (no references) as a GBNF expression.
std::string to_gbnf(const Node& n);

struct NfaState {
    std::vector<int32_t> eps;
    uint8_t lo = 1, hi = 0;  // one byte-range edge (lo > hi: none)
    int32_t ref = -1;        // or one rule-reference edge: `ref` is the rule, `next` the state after it
    int32_t next = -1;
};

class Nfa {
public:
    std::vector<NfaState> states;
    bool overflow = false;  // past kMaxNfaStates: the states are incomplete

    int32_t add();
    void eps(int32_t a, int32_t b);
    // Builds `n` from state `from`; returns its end state.
    int32_t build(const Node& n, int32_t from);

private:
    void edge(int32_t a, uint8_t lo, uint8_t hi, int32_t b);
    int32_t build_set(const Ranges& set, int32_t from);
    void split(uint32_t a, uint32_t b, int n, int32_t from, int32_t end);
};

// Byte classes: bytes that no byte edge of `nfa` tells apart share a class. Fills class_of[256]; returns the
// number of classes.
int byte_classes(const Nfa& nfa, uint8_t* class_of);

// The subset construction: a DFA over byte classes (and rule references) whose states are the epsilon-closed
// sets of NFA states reachable from each start.
struct Dfa {
    int num_classes = 0;
    uint8_t class_of[256] = {};
    std::vector<int32_t> table;                                  // [state][class] -> state or -1
    std::vector<std::vector<std::pair<int32_t, int32_t>>> refs;  // [state] -> (rule, the state after it)
    std::vector<std::vector<int32_t>> sets;                      // [state] -> its NFA states, sorted
    std::vector<int32_t> start_of;                               // [i] -> the state of starts[i]

    size_t size() const { return sets.size(); }
    int32_t next(size_t state, uint8_t byte) const {
        return table[state * static_cast<size_t>(num_classes) + class_of[byte]];
    }
};
// Errors name `what` ("the pattern", "the grammar"): more than `max_states` states, or more than `max_work` NFA
// states visited by closures and kept in sets (a bound on time and memory whatever the input).
Status determinize(const Nfa& nfa, const std::vector<int32_t>& starts, size_t max_states, int64_t max_work,
                   const std::string& what, Dfa* out);

// The states from which an accepting one can be reached by bytes and by the references to rules that
// `usable` marks (null: no reference is usable).
std::vector<uint8_t> live_states(const Dfa& dfa, const std::vector<uint8_t>& accepting,
                                 const std::vector<uint8_t>* usable);
// Takes out every edge into a state that is not live and every reference to a rule that is not usable.
void prune(const std::vector<uint8_t>& live, const std::vector<uint8_t>* usable, Dfa* dfa);

}  // namespace gptoss::structured::detail
