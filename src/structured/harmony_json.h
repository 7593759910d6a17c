// Structured outputs for gpt-oss: the final channel's message held to a JSON grammar, everything
// before it (analysis, commentary, headers) left free (HARMONY.md §4.4, as vLLM after its PR 28000).
//
//   auto so = HarmonyStructuredOutputs::create(tokenizer, model_vocab_size);   // once per server
//   request.constraint = (*so)->final_json(grammar);                          // per request
//
// The generated tokens are followed through the Harmony framing: the header after <|start|> (the
// prompt ends inside the first one, after "assistant") is free; at its <|message|> a header whose
// channel is `final` starts the constrained body: only tokens that keep the text a prefix of an
// accepted document, and <|return|> once it is complete. A body of another channel is free until
// its <|end|> (or <|call|>); the next <|start|> opens a header again. A call to a function declared
// strict (recipient "functions.NAME") is held to its parameters' schema the same way, ended by <|call|>.
// The framing is followed as the server's robust parser reads it (harmony_parser.cpp, HARMONY.md §6.7), so that
// every message the answer reports as final was drawn under the constraint: a missing <|start|> (X2: text or
// <|channel|> after <|end|> opens a header), a missing <|end|> (X3: <|start|> or <|channel|> in a free body closes
// it), a header ended by a terminator or past 256 tokens (X10, X13: no message), specials ignored where it ignores
// them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/token_constraint.h"
#include "structured/ebnf_grammar.h"
#include "structured/json_grammar.h"
#include "structured/regex_grammar.h"
#include "structured/structural_tag.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::structured {

// Function name -> the grammar of its arguments (tools declared with strict: true).
using ToolGrammars = std::map<std::string, std::shared_ptr<const JsonGrammar>>;

struct HarmonyTokenIds {
    int32_t start = -1, channel = -1, message = -1, end = -1, ret = -1, call = -1;
    int32_t constrain = -1, end_of_text = -1;  // (-1 where the tokenizer has none)
};

class HarmonyStructuredOutputs : public std::enable_shared_from_this<HarmonyStructuredOutputs> {
public:
    // token_bytes[id]: an ordinary token's bytes, empty for special tokens and unused ids
    // (model_vocab_size entries); the ids of the Harmony specials.
    static StatusOr<std::shared_ptr<HarmonyStructuredOutputs>> create(const tokenizer::BpeTokenizer& tokenizer,
                                                                      int model_vocab_size);
    HarmonyStructuredOutputs(std::vector<std::string> token_bytes, HarmonyTokenIds ids);

    // A factory for requests whose final message must match `grammar` (null: free; or, without a grammar,
    // the structural tag `tag`, the EBNF grammar `ebnf`, or the pattern `regex`) and whose calls to the functions in
    // `tools` must match their parameters' grammars (a message to "functions.NAME", ended by <|call|>). `forced`:
    // tokens of the reply that are part of the prompt (the server's forced start of a tool call), followed first.
    // `declared_functions`: the request's functions, as the answer's parser and mapping have them (headers are read
    // and routed as they read and route them; nullopt: not known).
    std::shared_ptr<const runtime::TokenConstraintFactory> final_json(
        std::shared_ptr<const JsonGrammar> grammar, std::vector<int32_t> forced = {},
        std::shared_ptr<const ToolGrammars> tools = nullptr, std::shared_ptr<const RegexGrammar> regex = nullptr,
        std::shared_ptr<const EbnfGrammar> ebnf = nullptr, std::shared_ptr<const StructuralTag> tag = nullptr,
        std::optional<std::vector<std::string>> declared_functions = std::nullopt) const;

    // A factory for raw completions (no Harmony framing): the whole output must match `grammar` (or, without
    // one, `tag`, `ebnf`, or `regex`), then <|return|> ends it.
    std::shared_ptr<const runtime::TokenConstraintFactory> raw_json(
        std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const RegexGrammar> regex = nullptr,
        std::shared_ptr<const EbnfGrammar> ebnf = nullptr, std::shared_ptr<const StructuralTag> tag = nullptr) const;

    const std::vector<std::string>& token_bytes() const { return token_bytes_; }
    const HarmonyTokenIds& ids() const { return ids_; }
    // The trie over token_bytes, built on first use (~1 s for o200k) and shared.
    const TokenTrie& trie() const;

private:
    std::vector<std::string> token_bytes_;
    HarmonyTokenIds ids_;
    mutable std::once_flag trie_once_;
    mutable std::unique_ptr<TokenTrie> trie_;
};

}  // namespace gptoss::structured
