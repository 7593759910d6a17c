// Structured outputs: JSON (optionally shaped by a JSON Schema) as a byte-level matcher, and the
// set of vocabulary tokens that keep a partial output a prefix of some accepted document.
//
//   auto grammar = JsonGrammar::compile(schema);          // or JsonGrammar::any_object()
//   JsonMatcher m(*grammar);
//   m.feed("{\"a\":");                                   // false: not a prefix of any accepted text
//   TokenTrie trie(token_bytes);                          // once per vocabulary
//   trie.fill_mask(m, &mask);                             // mask[id] = 1 where feeding id's bytes stays valid
//   m.accepting();                                        // a complete document (end of output allowed)
//
// The supported JSON Schema subset (as xgrammar's, which vLLM uses): type (one or a list), enum,
// const, properties / required / additionalProperties (properties are generated in the schema's
// order; without additionalProperties an object with properties takes no others, as OpenAI's strict
// mode), items / prefixItems / minItems / maxItems, minLength / maxLength, anyOf / oneOf (matched as
// anyOf), a one-element allOf, nullable, $ref into #/$defs or #/definitions (recursion allowed).
// `pattern` on strings (ECMA-262 search semantics: unanchored unless it begins with ^ / ends with $; the
// regex_grammar.h subset; not with minLength / maxLength, not with anchors inside a top-level alternation;
// such a string spells characters directly or by the short escapes, not by \u); `format` date, time,
// date-time, email, uuid, ipv4 and hostname the same way (as patterns; another format, or one beside
// min/maxLength or pattern, is an annotation). Annotations (title, description, default, examples, ...) are
// ignored. minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, or draft 4's booleans) and multipleOf
// (at most kMaxStepDigits significant digits and decimals) on a schema of type number or integer: exact decimals;
// such a number is written without an exponent, in at most kMaxBoundedDigits digits, and only digits that can still
// end inside the bounds, on a multiple, are offered. uniqueItems where the items are an enum, a const or booleans (no
// prefixItems). Validation keywords the matcher cannot enforce (uniqueItems on other items, not, if, ...) are refused
// with an error naming them, rather than ignored.
//
// Bounds that keep generation finite: a run of whitespace is at most kMaxWhitespaceRun bytes, a
// number at most kMaxNumberBytes (exponents of at most kMaxExponentDigits digits), nesting at most
// kMaxDepth; at most kMaxThreads alternatives are followed at once (an anyOf may have no more).
// Object keys are matched in their canonical JSON form (as JSON.stringify writes them): a \u escape
// in a key is allowed only where a named property's canonical form has one. A schema that admits no
// finite document is refused; anyOf options that admit none are dropped.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace gptoss::structured {

inline constexpr int kMaxWhitespaceRun = 40;
inline constexpr int kMaxNumberBytes = 40;
inline constexpr int kMaxDepth = 64;
inline constexpr int kMaxThreads = 32;          // also the most options an anyOf may have
inline constexpr int kMaxNodes = 20000;         // compiled schema size
inline constexpr int kMaxExponentDigits = 2;    // 1e99 at most: parsers' doubles overflow past 1e308
inline constexpr int kMaxNamedProperties = 64;  // per object (a 64-bit candidate set)
inline constexpr int kMaxEnumValues = 64;
inline constexpr int kMaxBoundedDigits = 16;  // digits of a number held to minimum / maximum / multipleOf
inline constexpr int kMaxStepDigits = 12;     // multipleOf: significant digits, and decimal places

class RegexGrammar;  // structured/regex_grammar.h

struct SchemaNode {
    enum class Kind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kLiteral, kUnion };
    Kind kind = Kind::kAny;
    // kObject: named properties in order, their JSON-escaped names (the bytes between the quotes).
    std::vector<std::string> names;
    std::vector<int> props;  // node of each named property
    uint64_t required = 0;   // bit i: names[i] is required
    int additional = -1;     // node of other properties' values; -1: none allowed
    // kArray
    std::vector<int> prefix_items;
    int items = -1;  // node of items past prefix_items; -1: none allowed
    int min_items = 0, max_items = INT32_MAX;
    // uniqueItems (items that resolve to one kLiteral node of unique_literals values): an array frame's cand holds
    // the values its items used.
    bool unique_items = false;
    int unique_literals = 0;
    // kString (characters: code points, an escape counts once)
    int min_length = 0, max_length = INT32_MAX;
    // kString: `pattern` as a DFA over the value's UTF-8 bytes (search semantics folded in), and which of its
    // states can still reach a match through bytes a JSON string can spell (\u escapes are not followed).
    std::shared_ptr<const RegexGrammar> pattern;
    std::shared_ptr<const std::vector<uint8_t>> pattern_live;
    // kNumber / kInteger: minimum / maximum (exclusive or not) as exact decimals, digits × 10^-scale.
    struct Bound {
        bool set = false, exclusive = false, negative = false;
        std::string digits;
        int scale = 0;
    };
    Bound min, max;
    Bound multiple;  // multipleOf: positive
    bool bounded() const { return min.set || max.set || multiple.set; }
    // kLiteral: compact JSON texts, one of which must be produced exactly
    std::vector<std::string> literals;
    // kUnion
    std::vector<int> options;
    bool ref = false;  // a $ref's placeholder (one option, its target): never flattened into another union
};

class JsonGrammar {
public:
    // Any JSON object at the top (response_format {"type": "json_object"}).
    static std::shared_ptr<const JsonGrammar> any_object();
    // A JSON Schema (a boolean or an object). Errors name the keyword and its JSON pointer.
    static StatusOr<std::shared_ptr<const JsonGrammar>> compile(const nlohmann::ordered_json& schema);

    // The same grammar with no whitespace between tokens (vLLM's structured_outputs disable_any_whitespace).
    std::shared_ptr<const JsonGrammar> without_whitespace() const;
    // The longest whitespace run allowed between tokens: kMaxWhitespaceRun, or 0.
    int max_whitespace_run() const { return max_ws_; }

    const SchemaNode& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
    int root() const { return root_; }
    // The nodes an unconstrained value takes by its first byte.
    int any_node() const { return any_; }
    int any_object_node() const { return any_object_; }
    int any_array_node() const { return any_array_; }
    int any_string_node() const { return any_string_; }
    int any_number_node() const { return any_number_; }
    int bool_node() const { return bool_; }
    int null_node() const { return null_; }

private:
    friend class SchemaCompiler;
    JsonGrammar();
    int add(SchemaNode n);
    std::vector<SchemaNode> nodes_;
    int root_ = 0, any_ = 0, any_object_ = 0, any_array_ = 0, any_string_ = 0, any_number_ = 0, bool_ = 0, null_ = 0;
    int max_ws_ = kMaxWhitespaceRun;
};

// One position of the pushdown matcher.
struct JsonFrame {
    enum Kind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };
    int32_t node = 0;
    uint8_t kind = kValue;
    uint8_t phase = 0;
    uint8_t esc = 0;      // string / key: 0 plain, 1 after '\', 2-5 hex digits left + 1
    uint8_t pending = 0;  // string / key: the UTF-8 state within a character (json_grammar.cpp utf8_next)
    int32_t count = 0;  // object: next named property; array: items begun; string: characters; number / literal: bytes
    int32_t aux = 0;    // object: the value node of the key just read; key: its length in bytes
    uint64_t cand = 0;  // object key: named properties it may still be; literal: literals it may still be
    bool operator==(const JsonFrame&) const = default;
};

struct JsonThread {
    std::vector<JsonFrame> stack;  // empty: the document is complete
    int ws_run = 0;
    bool operator==(const JsonThread&) const = default;
};

class JsonMatcher {
public:
    explicit JsonMatcher(const JsonGrammar& grammar);

    // Feeds bytes; false (and the matcher unchanged) if they leave no accepted continuation.
    bool feed(std::string_view bytes);
    bool feed_byte(uint8_t c);
    // A complete document: the output may end here.
    bool accepting() const;
    // The alternatives inside a string (a value, or an object key that may be any name) with no escape
    // pending: `room` the characters still allowed (INT32_MAX: any), `pending` the UTF-8 state. Plain
    // text never fails them (up to room). TokenTrie takes whole subtrees by these. Returns how many
    // (out: kMaxThreads entries).
    struct PlainString {
        int room;
        int pending;
        const uint64_t* loop = nullptr;  // a pattern's: only bytes that keep its DFA state (null: no pattern)
    };
    int plain_strings(PlainString* out) const;
    bool dead() const { return threads_.empty(); }
    const JsonGrammar& grammar() const { return *g_; }
    // The same grammar and position.
    bool operator==(const JsonMatcher& o) const { return g_ == o.g_ && threads_ == o.threads_; }

private:
    friend class TokenTrie;
    bool step_thread(JsonThread t, uint8_t c, std::vector<JsonThread>* out) const;
    bool start_value(JsonThread& t, uint8_t c, std::vector<JsonThread>* out) const;
    void finish_value(JsonThread& t) const;
    bool push_value(JsonThread& t, int node) const;

    const JsonGrammar* g_;
    std::vector<JsonThread> threads_;
    std::vector<JsonThread> scratch_;
};

class EbnfMatcher;           // structured/ebnf_grammar.h
class StructuralTagMatcher;  // structured/structural_tag.h

// The ordinary tokens of a vocabulary as a byte trie: for a matcher, the tokens whose bytes it
// accepts. Built once per vocabulary (~1 s for 200k tokens), shared by every request.
class TokenTrie {
public:
    // token_bytes[id]: the bytes of token id; empty for ids that are never allowed (special tokens,
    // ids past the tokenizer's vocabulary).
    explicit TokenTrie(const std::vector<std::string>& token_bytes);
    int vocab_size() const { return vocab_size_; }
    // mask[id] = 1 for every token that `m` accepts, 0 for every other (mask: vocab_size() entries or
    // more); returns the count allowed. `levels`: the caller's scratch (fill_mask keeps no state).
    int64_t fill_mask(const JsonMatcher& m, std::vector<uint8_t>* mask, std::vector<JsonMatcher>* levels) const;
    // The same for a regex's DFA in `state` (regex_grammar.cpp).
    int64_t fill_mask(const RegexGrammar& g, int state, std::vector<uint8_t>* mask) const;
    // The same for a grammar's matcher (ebnf_grammar.cpp); `m` keeps its recent masks.
    int64_t fill_mask(EbnfMatcher& m, std::vector<uint8_t>* mask) const;
    // The same for a structural tag's matcher (structural_tag.cpp); `levels`: the caller's scratch.
    int64_t fill_mask(const StructuralTagMatcher& m, std::vector<uint8_t>* mask,
                      std::vector<StructuralTagMatcher>* levels) const;

private:
    struct Node {
        uint32_t first_child = 0;
        uint32_t num_children = 0;
        uint32_t lo = 0, hi = 0;  // the subtree's tokens: order_[lo, hi), those ending here first
        uint32_t own = 0;         // how many end here
        uint16_t max_rest = 0;    // the longest token below, in bytes past this node's parent
        uint8_t byte = 0;
        uint8_t safe = 0;  // bit p: every path from this byte down is plain string text from UTF-8 state p
    };
    void walk(uint32_t node, int depth, std::vector<JsonMatcher>& levels, uint8_t* mask, int64_t* count) const;
    void walk_tag(uint32_t node, int depth, std::vector<StructuralTagMatcher>& levels, uint8_t* mask,
                  int64_t* count) const;
    // Whether every token below child `c` keeps one of a matcher's plain strings (JsonMatcher::plain_strings) alive.
    bool plain_subtree(const JsonMatcher::PlainString* plain, int num_plain, uint32_t c) const;
    // Marks the tokens along whose bytes an automaton stays live from `start` (`next(state, byte)`: the state
    // after the byte, negative when dead); returns how many. The regex's DFA and the grammar's set automaton.
    // `stay(state, depth)`: the bytes that lead from the state back to itself (null: none known) at a node
    // `depth` bytes down; a subtree whose bytes all do is taken whole (free text under a loop is most of the
    // vocabulary).
    template <class Next, class Stay>
    int64_t walk_states(int32_t start, Next&& next, Stay&& stay, uint8_t* mask) const {
        int64_t count = 0;
        struct Frame {
            uint32_t node;
            int32_t state;
            int32_t depth;
        };
        std::vector<Frame> stack{{0, start, 0}};
        while (!stack.empty()) {
            const Frame f = stack.back();
            stack.pop_back();
            const Node& nd = nodes_[f.node];
            const uint64_t* loop = stay(f.state, f.depth);
            for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c) {
                const Node& ch = nodes_[c];
                if (loop && (below_[c][0] & ~loop[0]) == 0 && (below_[c][1] & ~loop[1]) == 0 &&
                    (below_[c][2] & ~loop[2]) == 0 && (below_[c][3] & ~loop[3]) == 0) {
                    take(ch.lo, ch.hi, mask, &count);
                    continue;
                }
                const int32_t to = next(f.state, ch.byte);
                if (to < 0) continue;
                take(ch.lo, ch.lo + ch.own, mask, &count);
                if (ch.num_children > 0) stack.push_back({c, to, f.depth + 1});
            }
        }
        return count;
    }
    void take(uint32_t lo, uint32_t hi, uint8_t* mask, int64_t* count) const;
    int vocab_size_;
    int max_len_ = 0;
    std::vector<Node> nodes_;                     // nodes_[0]: the root; a node's children are contiguous
    std::vector<std::array<uint64_t, 4>> below_;  // [node]: the bytes of it and every node below it
    std::vector<int32_t> order_;                  // token ids by their bytes
};

}  // namespace gptoss::structured
