// Regular-expression constraints (vLLM's guided_regex / guided_choice, structured_outputs regex / choice): a
// pattern compiled to a byte-level DFA whose every live state can still reach a full match, so a token mask
// built from it never leads into a dead end.
//
//   auto g = RegexGrammar::compile("[0-9]{3}-[A-Z]+");     // or RegexGrammar::choice({"yes", "no"})
//   int s = (*g)->start();  s = (*g)->next(s, byte);  ... (*g)->accepting(s)
//
// The whole output must match (as vLLM's backends read a pattern); ^ and $ (and \A, \Z, \z) are empty.
// Syntax (Python's re): literals (UTF-8), ., [...] classes with ranges and negation, \d \w \s (ASCII, as
// JSON Schema's ECMA-262 patterns read them) and their negations, \n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH and
// escaped punctuation, groups ( ), (?: ), (?P<name> ), (?<name> ), alternation, the quantifiers * + ? {n} {n,}
// {n,m} {,m} and their lazy forms (the same language). '.' matches any code point but '\n', a negated class any
// outside it, '\n' included (the surrogates never). ^ and $ only where they can only be the output's start and
// end. Backreferences, lookaround, \b, possessive and stacked quantifiers, octal escapes, inline flags and POSIX
// classes are refused by position. Bounded: 200,000 automaton states while compiling, 20,000 in the DFA.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gptoss::structured {

class RegexGrammar {
public:
    static StatusOr<std::shared_ptr<const RegexGrammar>> compile(std::string_view pattern);
    // The output is exactly one of the options (each at least one byte, valid UTF-8).
    static StatusOr<std::shared_ptr<const RegexGrammar>> choice(const std::vector<std::string>& options);

    int start() const { return 0; }
    // The state after `byte`, or -1 when no full match can follow.
    int next(int state, uint8_t byte) const {
        return table_[static_cast<size_t>(state) * num_classes_ + class_of_[byte]];
    }
    bool accepting(int state) const { return accepting_[static_cast<size_t>(state)] != 0; }
    int num_states() const { return static_cast<int>(accepting_.size()); }
    // Feeds `bytes` from `state`; -1 once dead.
    int feed(int state, std::string_view bytes) const;
    // The bytes that lead from `state` back to itself (null: none).
    const uint64_t* loop_bytes(int state) const {
        return has_loop_[static_cast<size_t>(state)] ? loops_[static_cast<size_t>(state)].data() : nullptr;
    }

private:
    friend class RegexCompiler;
    RegexGrammar() = default;
    int num_classes_ = 0;
    uint8_t class_of_[256] = {};
    std::vector<int32_t> table_;                  // [state][class] -> state or -1
    std::vector<uint8_t> accepting_;              // [state]
    std::vector<std::array<uint64_t, 4>> loops_;  // [state]: bytes from it back to it
    std::vector<uint8_t> has_loop_;               // [state]
};

}  // namespace gptoss::structured
