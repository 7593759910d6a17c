// Grammar constraints (vLLM's guided_grammar and structured_outputs grammar, llama.cpp's grammar): a
// context-free grammar in GBNF, the EBNF form that llama.cpp and xgrammar read, held as one byte-level DFA a
// rule whose edges are bytes or references to rules, and matched by a set of rule stacks.
//
//   auto g = EbnfGrammar::compile(R"(root ::= "(" expr ")"   expr ::= [0-9]+ | "(" expr ")")");
//   EbnfMatcher m(*g);  m.feed("((4");  m.accepting();  trie.fill_mask(m, &mask);
//
// Syntax: rules `name ::= alternatives` (names of letters, digits, '_', '-', '.'; the output matches `root`);
// alternatives separated by '|', sequences of items, each an optional postfix * + ? {n} {n,} {n,m} {,m};
// items: "literals" (escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH), character classes [a-z] [^\n]
// (the same escapes, and \- \^), '.' (any character), a rule's name, ( groups ). '#' comments to the end of a
// line. A rule ends where the next `name ::=` begins, so rules may span lines. Characters are Unicode code
// points matched as UTF-8. Refused with the line and column: undefined or twice-defined rules, no `root`,
// left recursion (a rule that can begin with itself without reading a character), a grammar that admits no
// finite output. Rules that can never finish are dropped. Bounded: 200,000 automaton states while compiling,
// 20,000 in the DFAs, 5,000,000 compile steps, rule stacks 1,000 deep, 4,096 configurations at once (each way
// of reading an ambiguous output is one: past the bound the output is held tighter than the grammar, never looser).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gptoss::structured {

class EbnfGrammar {
public:
    static StatusOr<std::shared_ptr<const EbnfGrammar>> compile(std::string_view text);

    // Lark's form, as vLLM reads a guided_grammar without `::=` (its xgrammar backend converts it to EBNF):
    // `name: expansion` rules and terminals (a leading ? or !, a .priority ignored), alternatives on lines that
    // begin with '|', "strings" and 'strings' ("..."i: either case), "a".."z" ranges, /regular expressions/ (flags
    // i, s; m, u change nothing), [optional], ~n and ~n..m repeats, -> aliases dropped, // and # comments; `start`
    // is the root. `%import common.NAME [-> ALIAS]` / `%import common (NAME, ...)` bring in Lark's common
    // terminals; `%ignore X` lets X stand before every terminal of a rule (upper-case names, strings, regexes)
    // and at the end. The result is a context-free language: Lark's longest-match lexing is not modelled.
    // Other directives and templates are refused by line.
    static bool looks_like_lark(std::string_view text);
    static StatusOr<std::string> lark_to_gbnf(std::string_view text);

    // DFA states of all rules together; a state belongs to one rule.
    int num_states() const { return static_cast<int>(accepting_.size()); }
    // The state after `byte` within the state's rule, or -1.
    int next(int state, uint8_t byte) const {
        return table_[static_cast<size_t>(state) * num_classes_ + class_of_[byte]];
    }
    // The rules that may begin here, each with the state reached once it has matched.
    const std::vector<std::pair<int32_t, int32_t>>& refs(int state) const { return refs_[static_cast<size_t>(state)]; }
    // The state's rule may end here.
    bool accepting(int state) const { return accepting_[static_cast<size_t>(state)] != 0; }
    // The state has an edge on some byte.
    bool reads(int state) const { return reads_[static_cast<size_t>(state)] != 0; }
    int num_classes() const { return num_classes_; }
    int class_of(uint8_t byte) const { return class_of_[byte]; }
    int start_of(int rule) const { return start_of_[static_cast<size_t>(rule)]; }
    int root() const { return root_; }
    int num_rules() const { return static_cast<int>(names_.size()); }
    const std::string& rule_name(int rule) const { return names_[static_cast<size_t>(rule)]; }

private:
    friend class EbnfCompiler;
    EbnfGrammar() = default;
    int num_classes_ = 0;
    uint8_t class_of_[256] = {};
    std::vector<int32_t> table_;                                  // [state][class] -> state or -1
    std::vector<std::vector<std::pair<int32_t, int32_t>>> refs_;  // [state] -> (rule, state after it)
    std::vector<uint8_t> accepting_;                              // [state]
    std::vector<uint8_t> reads_;                                  // [state]
    std::vector<int32_t> start_of_;                               // [rule]
    std::vector<std::string> names_;                              // [rule]
    int root_ = 0;
};

// Where a partial output stands: the set of configurations (a state and the stack of states to return to)
// that can have produced it. Every configuration can still finish (dead branches are pruned at compile time).
// Sets met while walking the vocabulary are interned with their transitions by byte class, so later masks
// follow a table instead of recomputing the closure (a lazily built automaton over configuration sets).
class EbnfMatcher {
public:
    static constexpr int kMaxDepth = 1000;         // rule stack frames
    static constexpr size_t kMaxConfigs = 4096;    // configurations followed at once
    static constexpr size_t kMaxSets = 50000;      // interned sets before the cache starts over
    static constexpr size_t kMaxFrames = 1000000;  // stack frames before they are compacted

    explicit EbnfMatcher(const EbnfGrammar& grammar);

    // Feeds bytes; false (and the matcher unchanged) if they leave no accepted continuation.
    bool feed(std::string_view bytes);
    // The output may end here.
    bool accepting() const;
    bool dead() const { return configs_.empty(); }
    // Some configurations were dropped at kMaxConfigs (a highly ambiguous grammar: each way of reading the output
    // so far is a stack): every continuation offered is still valid, but some valid ones may not be.
    bool truncated() const { return truncated_; }
    const EbnfGrammar& grammar() const { return *g_; }

private:
    friend class TokenTrie;
    struct Frame {
        int32_t ret;     // the state to continue in after the rule ends
        int32_t parent;  // the frame below, -1 at the root
        int32_t depth;
    };
    static uint64_t key(int32_t state, int32_t stack) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(stack + 1);
    }
    static int32_t state_of(uint64_t k) { return static_cast<int32_t>(k >> 32); }
    static int32_t stack_of(uint64_t k) { return static_cast<int32_t>(static_cast<uint32_t>(k)) - 1; }
    int32_t push(int32_t ret, int32_t parent);
    // Adds every configuration reachable without reading (rules beginning, rules ending), drops those that can
    // neither read nor end; sorts, dedups.
    void close(std::vector<uint64_t>* set);
    // The closed set after `byte` from the closed set `from`; false if empty.
    bool step(const std::vector<uint64_t>& from, uint8_t byte, std::vector<uint64_t>* to);
    // The interned set's id (a new one if unseen).
    int32_t intern(const std::vector<uint64_t>& set);
    // The set after a byte of class `cls` from set `id` (-1: none), computed once.
    int32_t next_set(int32_t id, uint8_t byte);
    // The bytes that lead from set `id` back to itself (null: none).
    const uint64_t* loop_bytes(int32_t id);
    // Starts the set cache over (and compacts the frames to those the current set uses).
    void reset_cache();

    struct SetHash {
        size_t operator()(const std::vector<uint64_t>& v) const;
    };
    const EbnfGrammar* g_;
    std::vector<Frame> frames_;                          // hash-consed: equal stacks have one id
    std::unordered_map<uint64_t, int32_t> frame_index_;  // key(ret, parent) -> frame
    std::vector<uint64_t> configs_;                      // closed, sorted
    std::vector<uint64_t> work_, scratch_;
    std::unordered_set<uint64_t> seen_;        // close()'s scratch
    std::vector<std::vector<uint64_t>> sets_;  // interned closed sets
    std::unordered_map<std::vector<uint64_t>, int32_t, SetHash> set_index_;
    std::vector<int32_t> next_;  // [set][byte class] -> set, -1 none, -2 not yet computed
    struct Loop {
        std::array<uint64_t, 4> bytes{};
        bool known = false, any = false;
    };
    std::vector<Loop> loops_;  // [set]
    std::vector<int32_t> levels_;
    // Masks of recent sets (a loop over free text comes back to the same set).
    struct CachedMask {
        int32_t set = -1;
        std::vector<uint8_t> mask;
        int64_t count = 0;
        uint64_t used = 0;
    };
    std::vector<CachedMask> cache_;
    uint64_t clock_ = 0;
    bool truncated_ = false;
};

}  // namespace gptoss::structured
