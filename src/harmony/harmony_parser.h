// Streaming Harmony output parser (HARMONY.md §6): token ids -> events (message start with its
// header, content deltas, message end). Never throws and never aborts, whatever ids arrive:
//  - kStrict:  harmony's default; malformed output stops parsing with an error status().
//  - kLenient: harmony's strict=false (a header that reaches a terminator becomes a message).
//  - kRobust:  production mode; repairs every failure of §6.7 (X1-X16) with a warning.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "harmony/harmony_types.h"

namespace gptoss::tokenizer {
class BpeTokenizer;
}

namespace gptoss::harmony {

enum class ParseMode { kStrict, kLenient, kRobust };

struct ParserOptions {
    // Role already rendered by the prompt ("<|start|>assistant"); nullopt starts expecting <|start|>.
    std::optional<Role> initial_role = Role::kAssistant;
    ParseMode mode = ParseMode::kRobust;
    // Function names the request declared (robust repairs X8, X16). nullopt: not known.
    std::optional<std::vector<std::string>> declared_functions;
    // Robust mode: a header longer than this is malformed (X13) and recovered. (Strict and lenient bound none, as
    // harmony.)
    size_t max_header_tokens = 256;
};

// Bytes of one ordinary token; nullopt for an id the vocabulary does not know. Special ids
// (>= 199998) never reach it: the parser spells them itself.
using TokenBytesFn = std::function<std::optional<std::string_view>(int32_t id)>;

enum class Terminator {
    kNone,       // stream ended inside the message (truncated)
    kEnd,        // <|end|>
    kCall,       // <|call|>
    kReturn,     // <|return|>
    kImplicit,   // robust: closed by a following <|start|> / <|channel|> (X3)
    kEndOfText,  // robust: <|endoftext|>
};

struct MessageHeader {
    Role role = Role::kAssistant;
    std::optional<std::string> name;  // tool author ("browser.search")
    std::optional<std::string> recipient;
    std::optional<std::string> channel;
    std::optional<std::string> content_type;
    bool recovered = false;  // repaired from malformed output: never user-visible
};

struct ParsedMessage {
    MessageHeader header;
    std::string content;
    Terminator terminator = Terminator::kNone;
};

// The message as Harmony history (e.g. to put a generated answer back into a conversation).
Message to_message(const ParsedMessage& parsed);

enum class EventType { kMessageStart, kContentDelta, kMessageEnd };

struct Event {
    EventType type = EventType::kMessageStart;
    size_t message_index = 0;                   // index into messages() once the message ends
    MessageHeader header;                       // kMessageStart
    std::string delta;                          // kContentDelta: valid UTF-8, never empty
    Terminator terminator = Terminator::kNone;  // kMessageEnd
};

class StreamParser {
public:
    // The tokenizer must outlive the parser.
    explicit StreamParser(const tokenizer::BpeTokenizer& tokenizer, ParserOptions options = {});
    explicit StreamParser(TokenBytesFn token_bytes, ParserOptions options = {});

    std::vector<Event> push(int32_t id);
    std::vector<Event> push(std::span<const int32_t> ids);
    // End of the stream (generation stopped or hit its limit). Further pushes are ignored.
    std::vector<Event> finish();

    // Messages completed so far (after finish(): all of them).
    const std::vector<ParsedMessage>& messages() const { return messages_; }
    // One line per robust repair or ignored id, in order.
    const std::vector<std::string>& warnings() const { return warnings_; }
    // Not OK once strict/lenient parsing failed (all later ids are ignored); always OK in robust mode.
    const Status& status() const { return status_; }
    // Robust mode: a <|call|>/<|return|> ended generation; later ids are discarded (X14).
    bool stopped() const { return state_ == State::kDone; }
    // The message being parsed, once its header is complete.
    const ParsedMessage* current() const { return state_ == State::kContent ? &current_ : nullptr; }

private:
    enum class State { kExpectStart, kHeader, kContent, kDone, kFailed };

    void process(int32_t id, std::vector<Event>& out);
    void process_expect_start(int32_t id, std::vector<Event>& out);
    void process_header(int32_t id, std::vector<Event>& out);
    void process_content(int32_t id, std::vector<Event>& out);

    void begin_header(std::optional<Role> preset_role);
    void complete_header(std::vector<Event>& out);
    // A header that never got <|message|>: a message (lenient/robust) or nothing.
    void recover_header(Terminator terminator, std::vector<Event>& out);
    void start_message(MessageHeader header, std::vector<Event>& out);
    void append_content(std::string_view bytes, std::vector<Event>& out);
    void end_message(Terminator terminator, std::vector<Event>& out);
    void after_stop_token();
    void fail(std::string message);
    void warn(std::string message);
    std::string header_text() const;

    TokenBytesFn token_bytes_;
    ParserOptions options_;
    State state_ = State::kExpectStart;
    std::optional<Role> header_role_;  // role pre-set for the header being read
    std::vector<int32_t> header_ids_;
    ParsedMessage current_;
    std::string pending_bytes_;  // content bytes of an incomplete UTF-8 character
    std::vector<ParsedMessage> messages_;
    std::vector<std::string> warnings_;
    Status status_;
    bool finished_ = false;
    bool warned_discard_ = false;
};

// Header parsing on decoded header text (special tokens spelled literally), HARMONY.md §6.3.
// Exposed for tests. `preset_role`: the role rendered by the prompt, if any.
struct HeaderParseResult {
    MessageHeader header;
    std::string leftover;  // header words that are not header fields (joined by single spaces)
};
// Harmony's rules. With `fields` false everything after the channel and role is leftover (the
// lenient recovery of a header without <|message|>).
StatusOr<HeaderParseResult> parse_header_harmony(std::string text, std::optional<Role> preset_role, bool fields);
// Robust rules (X4-X8, X11, X16); never fails. Repairs are appended to `warnings`.
HeaderParseResult parse_header_robust(std::string text, std::optional<Role> preset_role, bool fields,
                                      const std::optional<std::vector<std::string>>& declared_functions,
                                      std::vector<std::string>& warnings);

// Decodes `bytes` as UTF-8 the way Rust's from_utf8_lossy does (one U+FFFD per maximal invalid
// subpart). With `final_chunk` false an incomplete character at the end is left in `bytes`.
std::string decode_utf8_lossy(std::string& bytes, bool final_chunk);

}  // namespace gptoss::harmony
