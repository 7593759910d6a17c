// Structural tags (vLLM's structured_outputs structural_tag and response_format {"type": "structural_tag"}, as
// xgrammar and SGLang read them): an output described as a tree of formats, compiled into one automaton whose
// edges are whole sub-languages (a literal, a JSON Schema document, a regular expression, free text), matched
// by a set of threads.
//
//   auto tag = StructuralTag::parse(json);   // {"type": "structural_tag", "format": {...}} or the legacy form
//   StructuralTagMatcher m(**tag);  m.feed("I'll check. <function=get_weather>{\"city\": ");
//   trie.fill_mask(m, &mask, &levels);  m.accepting();
//
// Formats (xgrammar's string-level ones; `path` in errors is the JSON path inside the tag, e.g.
// "format.tags[0].end"):
//   const_string {value}; json_schema {json_schema, style "json" only, any_order false only} (json_grammar.h's
//   subset); regex {pattern} (regex_grammar.h's subset, matched whole); any_text {excludes, max_chars}: text that
//   contains none of `excludes` (nor, as the direct content of a tag, any of the tag's ends: the end is where it
//   stops), of at most max_chars code points;
//   sequence / or {elements}; optional / plus / star {content}; repeat {min, max (-1: unbounded), content};
//   tag {begin, content, end (a string or several)};
//   triggered_tags {triggers, tags, at_least_one, stop_after_first, excludes}: free text that contains no trigger
//   (and none of excludes), in which each occurrence of a trigger must begin one of the tags (each tag's begin
//   starts with a trigger), then free text again; at_least_one: at least one tag and no text before the first;
//   stop_after_first: nothing after the first tag;
//   tags_with_separator {tags, separator, at_least_one, stop_after_first}: tags separated by the separator, nothing
//   else;
//   dispatch {rules: [[pattern, format], ...], loop, excludes}: free text in which each occurrence of a pattern is
//   followed by its format (loop false: at most one).
// The legacy form {"structures": [{"begin", "schema", "end"}], "triggers": [...]} is triggered_tags of tags with
// json_schema content. Refused by name: the token-level formats (token, exclude_token, any_tokens,
// token_triggered_tags, token_dispatch), `grammar` inside a tag, any_text's max_tokens, JSON styles other than
// "json", any_order true, unknown keys.
//
// Bounds: nesting 32 formats deep, kMaxTagNodes automaton nodes (repeat is unrolled), kMaxTagThreads threads at
// once (past it the output is held tighter than the tag, never looser).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "structured/json_grammar.h"
#include "structured/regex_grammar.h"

namespace gptoss::structured {

inline constexpr int kMaxTagNodes = 20000;
inline constexpr int kMaxTagThreads = 64;
inline constexpr int kMaxTagDepth = 32;

// Text that contains none of a set of strings: an Aho-Corasick automaton whose transitions into a completed
// string are -1.
class StopScanner {
public:
    explicit StopScanner(const std::vector<std::string>& stops);
    int next(int state, uint8_t byte) const { return table_[static_cast<size_t>(state) * 256 + byte]; }
    // The bytes that keep the start state (the first bytes of no stop).
    const std::array<uint64_t, 4>& start_loop() const { return start_loop_; }

private:
    std::vector<int32_t> table_;  // [state][byte] -> state or -1
    std::array<uint64_t, 4> start_loop_{};
};

class StructuralTag {
public:
    // `j`: {"type": "structural_tag", "format": F} or {"type": "structural_tag", "structures": [...], "triggers":
    // [...]} ("type" may be left out).
    static StatusOr<std::shared_ptr<const StructuralTag>> parse(const nlohmann::ordered_json& j);
    // The same tag with no whitespace between the tokens of its JSON documents.
    std::shared_ptr<const StructuralTag> without_whitespace() const;

    // One edge of the automaton: a sub-language.
    struct Leaf {
        enum class Kind : uint8_t { kLiteral, kJson, kRegex, kText };
        Kind kind = Kind::kLiteral;
        std::string literal;                        // kLiteral (not empty)
        std::shared_ptr<const JsonGrammar> json;    // kJson
        std::shared_ptr<const RegexGrammar> regex;  // kRegex
        std::shared_ptr<const StopScanner> text;    // kText
        int64_t max_chars = -1;                     // kText: at most this many code points (-1: any)
    };
    // A node: leaf >= 0: that leaf's language, then `next`; else `accept` (the output may end) or epsilon edges to
    // `alts`.
    struct Node {
        int32_t leaf = -1;
        int32_t next = -1;
        bool accept = false;
        std::vector<int32_t> alts;
    };
    const Leaf& leaf(int i) const { return leaves_[static_cast<size_t>(i)]; }
    // Whether the output may end once node n is entered (epsilon edges, leaves that match the empty text).
    bool reaches_accept(int n) const { return reaches_accept_[static_cast<size_t>(n)] != 0; }
    static bool empty_ok(const Leaf& l);
    const Node& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
    int num_nodes() const { return static_cast<int>(nodes_.size()); }
    int root() const { return root_; }

private:
    friend class TagCompiler;
    StructuralTag() = default;
    void find_accepting();
    std::vector<Leaf> leaves_;
    std::vector<Node> nodes_;
    std::vector<uint8_t> reaches_accept_;  // [node]
    int root_ = 0;
};

struct TagThread {
    int32_t node = 0;   // a leaf node
    int32_t state = 0;  // kLiteral: bytes matched; kRegex: the DFA state; kText: the scanner's state
    int64_t chars = 0;  // kText under max_chars: code points so far (else 0)
    int32_t utf8 = 0;   // kText under max_chars: inside a character, the bytes still due | the next one's range << 8
    std::optional<JsonMatcher> json;
    bool operator==(const TagThread& o) const;
};

class StructuralTagMatcher {
public:
    explicit StructuralTagMatcher(const StructuralTag& tag);
    // Feeds bytes; false (and the matcher unchanged) if they leave no accepted continuation.
    bool feed(std::string_view bytes);
    bool feed_byte(uint8_t c);
    // The output may end here.
    bool accepting() const { return accept_; }
    bool dead() const { return threads_.empty(); }
    const StructuralTag& tag() const { return *t_; }

private:
    friend class TokenTrie;
    // *this = `from` after `c`; false when no thread survives (then *this is not a usable matcher).
    bool step(const StructuralTagMatcher& from, uint8_t c);
    // Adds the threads that begin at node `start` (epsilons followed), marking nodes in this step's `seen_`.
    void enter(int start);
    void next_epoch();
    void add(TagThread t);
    bool leaf_accepting(const TagThread& t) const;

    const StructuralTag* t_;
    std::vector<TagThread> threads_;
    bool accept_ = false;
    std::vector<uint32_t> seen_;  // [node]: the epoch that entered it
    uint32_t epoch_ = 0;
    std::vector<int32_t> stack_;  // enter()'s scratch
};

}  // namespace gptoss::structured
