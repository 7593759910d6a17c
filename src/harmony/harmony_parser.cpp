#include "harmony/harmony_parser.h"

#include <algorithm>

#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::harmony {
namespace {

constexpr std::string_view kChannelMarker = "<|channel|>";
constexpr std::string_view kConstrainMarker = "<|constrain|>";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool is_special(int32_t id) { return id >= kFirstSpecialId && id < kVocabEnd; }
bool is_terminator(int32_t id) { return id == kEnd || id == kCall || id == kReturn; }

Terminator terminator_of(int32_t id) {
    if (id == kCall) return Terminator::kCall;
    if (id == kReturn) return Terminator::kReturn;
    return Terminator::kEnd;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Rust char::is_whitespace (Unicode White_Space) at s[i]; returns the sequence length, 0 if none.
size_t unicode_space_at(std::string_view s, size_t i) {
    auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
    unsigned char c = b(0);
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return 1;
    if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;
    if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return 3;  // U+1680
    if (c == 0xE2 && b(1) == 0x80) {
        unsigned char t = b(2);
        if ((t >= 0x80 && t <= 0x8A) || t == 0xA8 || t == 0xA9 || t == 0xAF) return 3;  // U+2000-200A, 2028/9, 202F
    }
    if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return 3;  // U+205F
    if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return 3;  // U+3000
    return 0;
}

// Rust str::trim().
std::string trim_unicode(std::string_view s) {
    size_t begin = 0;
    while (begin < s.size()) {
        size_t n = unicode_space_at(s, begin);
        if (n == 0) break;
        begin += n;
    }
    size_t end = begin;
    for (size_t i = begin; i < s.size();) {
        size_t n = unicode_space_at(s, i);
        if (n == 0) {
            ++i;
            end = i;
        } else {
            i += n;
        }
    }
    return std::string(s.substr(begin, end - begin));
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\x0C' || c == '\r'; }

// Rust str::split_ascii_whitespace().
std::vector<std::string> split_ascii_whitespace(std::string_view s) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_ascii_space(s[i])) ++i;
        size_t start = i;
        while (i < s.size() && !is_ascii_space(s[i])) ++i;
        if (i > start) parts.emplace_back(s.substr(start, i - start));
    }
    return parts;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out += sep;
        out += parts[i];
    }
    return out;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
    size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
        s.replace(pos, from.size(), to);
        pos += to.size();
    }
    return s;
}

// Inserts a space before every <|constrain|> so "to=x<|constrain|>json" splits (harmony rule).
std::string space_constrain(std::string s) {
    if (s.find(kConstrainMarker) == std::string::npos) return s;
    return trim_unicode(replace_all(std::move(s), kConstrainMarker, std::string(" ") + std::string(kConstrainMarker)));
}

// X11: zero-width and non-ASCII spaces in headers become ASCII spaces.
std::string normalize_header_spaces(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
        size_t n = unicode_space_at(s, i);
        if (n == 0 && b(0) == 0xE2 && b(1) == 0x80 && b(2) >= 0x8B && b(2) <= 0x8D) n = 3;  // U+200B-200D
        if (n == 0 && b(0) == 0xE2 && b(1) == 0x81 && b(2) == 0xA0) n = 3;                  // U+2060
        if (n == 0 && b(0) == 0xEF && b(1) == 0xBB && b(2) == 0xBF) n = 3;                  // U+FEFF
        if (n > 0) {
            out += ' ';
            i += n;
        } else {
            out += s[i++];
        }
    }
    return out;
}

bool is_known_channel(std::string_view c) { return c == "analysis" || c == "commentary" || c == "final"; }

bool valid_recipient(std::string_view r) {
    if (r.empty()) return false;
    return std::all_of(r.begin(), r.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
               c == ':' || c == '-';
    });
}

bool is_content_type_word(std::string_view w) {
    return w == "json" || w == "code" || w == "text" || w == "markdown" || w == "md" || w == "yaml" || w == "xml" ||
           w == "html";
}

bool is_declared(const std::optional<std::vector<std::string>>& declared, std::string_view name) {
    return declared && std::find(declared->begin(), declared->end(), name) != declared->end();
}

// A word that names a tool the model may address: functions.*, a built-in, a declared function.
bool is_tool_name(std::string_view w, const std::optional<std::vector<std::string>>& declared) {
    if (!valid_recipient(w)) return false;
    return starts_with(w, "functions.") || starts_with(w, "browser.") || starts_with(w, "container.") ||
           w == "python" || w == "browser" || is_declared(declared, w);
}

// How many times `word` repeats to make up `part` (0 if it does not).
size_t repetitions(std::string_view part, std::string_view word) {
    if (word.empty() || part.empty() || part.size() % word.size() != 0) return 0;
    for (size_t i = 0; i < part.size(); i += word.size()) {
        if (part.substr(i, word.size()) != word) return 0;
    }
    return part.size() / word.size();
}

}  // namespace

std::string decode_utf8_lossy(std::string& bytes, bool final_chunk) {
    std::string out;
    const size_t n = bytes.size();
    size_t i = 0;
    while (i < n) {
        auto c = static_cast<unsigned char>(bytes[i]);
        if (c < 0x80) {
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        int need = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c == 0xE0) {
            need = 2;
            lo = 0xA0;
        } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
            need = 2;
        } else if (c == 0xED) {
            need = 2;
            hi = 0x9F;
        } else if (c == 0xF0) {
            need = 3;
            lo = 0x90;
        } else if (c >= 0xF1 && c <= 0xF3) {
            need = 3;
        } else if (c == 0xF4) {
            need = 3;
            hi = 0x8F;
        } else {
            out += kReplacement;
            ++i;
            continue;
        }
        size_t len = 1;
        bool bad = false;
        for (int k = 0; k < need; ++k) {
            if (i + len >= n) {
                if (!final_chunk) {  // an incomplete character: wait for the next token
                    bytes.erase(0, i);
                    return out;
                }
                out += kReplacement;
                i = n;
                bad = true;
                break;
            }
            auto cc = static_cast<unsigned char>(bytes[i + len]);
            if (cc < (k == 0 ? lo : 0x80) || cc > (k == 0 ? hi : 0xBF)) {
                out += kReplacement;  // one U+FFFD for the maximal invalid subpart
                i += len;
                bad = true;
                break;
            }
            ++len;
        }
        if (!bad) {
            out.append(bytes, i, len);
            i += len;
        }
    }
    bytes.clear();
    return out;
}

StatusOr<HeaderParseResult> parse_header_harmony(std::string h, std::optional<Role> preset_role, bool fields) {
    HeaderParseResult result;
    MessageHeader& header = result.header;
    if (size_t idx = h.find(kChannelMarker); idx != std::string::npos) {
        size_t value_begin = idx + kChannelMarker.size();
        size_t value_end = value_begin;
        while (value_end < h.size() && h[value_end] != '<' && unicode_space_at(h, value_end) == 0) ++value_end;
        if (value_end == value_begin) return data_loss("channel marker present but no channel value found in header");
        header.channel = h.substr(value_begin, value_end - value_begin);
        h = h.substr(0, idx) + h.substr(value_end);
    }
    h = space_constrain(trim_unicode(h));
    std::vector<std::string> parts = split_ascii_whitespace(h);

    std::optional<std::string> role_word;
    if (preset_role) {
        header.role = *preset_role;
    } else {
        if (parts.empty()) return data_loss("message header did not contain a role");
        role_word = parts[0];
        if (auto role = parse_role(parts[0])) {
            header.role = *role;
        } else if (parts.size() > 1 || starts_with(parts[0], "to=")) {
            parts.erase(parts.begin());  // a tool author, e.g. "browser.search to=assistant"
            header.role = Role::kTool;
        } else {
            return data_loss("Unknown role: " + parts[0]);
        }
    }
    if (!parts.empty() && parts[0] == role_name(header.role)) parts.erase(parts.begin());
    if (header.role == Role::kTool) header.name = role_word;

    if (fields && !parts.empty()) {
        const size_t num_parts = parts.size();
        std::string last = parts.back();
        parts.pop_back();
        if (starts_with(last, "to=")) {
            header.recipient = last.substr(3);
        } else if (num_parts == 1 && starts_with(last, kConstrainMarker)) {
            header.content_type = last;  // fix over harmony v0.0.8 (HARMONY.md §6.3 step 5)
        } else if (num_parts == 1) {
            header.recipient = last;  // a bare recipient
        } else {
            header.content_type = last;
            std::string raw = parts.back();
            parts.pop_back();
            header.recipient = starts_with(raw, "to=") ? raw.substr(3) : raw;
        }
    }
    result.leftover = join(parts, " ");
    return result;
}

HeaderParseResult parse_header_robust(std::string text, std::optional<Role> preset_role, bool fields,
                                      const std::optional<std::vector<std::string>>& declared,
                                      std::vector<std::string>& warnings) {
    HeaderParseResult result;
    MessageHeader& header = result.header;
    std::string h = normalize_header_spaces(text);

    // Channel (X5, X16): the first marker's value decides; every marker is removed with its value.
    std::optional<std::string> slot_recipient;
    bool first_marker = true;
    for (size_t idx; (idx = h.find(kChannelMarker)) != std::string::npos;) {
        size_t value_begin = idx + kChannelMarker.size();
        if (first_marker) {  // "<|channel|> final": take the next word
            while (value_begin < h.size() && is_ascii_space(h[value_begin])) ++value_begin;
        }
        size_t value_end = value_begin;
        while (value_end < h.size() && h[value_end] != '<' && !is_ascii_space(h[value_end])) ++value_end;
        std::string value = h.substr(value_begin, value_end - value_begin);
        h = h.substr(0, idx) + " " + h.substr(value_end);
        if (!first_marker) {
            warnings.push_back("duplicate <|channel|> marker removed");
            continue;
        }
        first_marker = false;
        if (value.empty()) {
            warnings.push_back("empty channel value");
            continue;
        }
        std::string candidate = starts_with(value, "to=") ? value.substr(3) : value;
        if (starts_with(value, "to=") || (!is_known_channel(value) && is_tool_name(candidate, declared))) {
            slot_recipient = candidate;
            header.channel = "commentary";
            warnings.push_back("recipient in channel slot");
            continue;
        }
        size_t b = 0;
        auto is_word_char = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
        while (b < value.size() && !is_word_char(value[b])) ++b;
        size_t e = b;
        while (e < value.size() && is_word_char(value[e])) ++e;
        std::string channel = value.substr(b, e - b);
        std::transform(channel.begin(), channel.end(), channel.begin(),
                       [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; });
        if (channel != value) warnings.push_back("channel sanitized '" + value + "'->'" + channel + "'");
        if (!is_known_channel(channel)) {
            warnings.push_back("unknown channel '" + channel + "' treated as analysis");
            channel = "analysis";
        }
        header.channel = channel;
    }
    h = space_constrain(trim_unicode(h));
    std::vector<std::string> parts = split_ascii_whitespace(h);

    // Role: pre-set, a role word, a tool author, or assistant.
    if (preset_role) {
        header.role = *preset_role;
    } else if (parts.empty() || starts_with(parts[0], "to=")) {
        header.role = Role::kAssistant;
    } else if (auto role = parse_role(parts[0])) {
        header.role = *role;
        if (*role == Role::kTool) header.name = parts[0];
    } else if (parts.size() > 1 && is_tool_name(parts[0], declared)) {
        header.role = Role::kTool;
        header.name = parts[0];
        parts.erase(parts.begin());
    } else {
        header.role = Role::kAssistant;
    }
    size_t role_words = 0;  // X4: "assistantassistant", "assistant assistant"
    while (!parts.empty()) {
        size_t n = repetitions(parts[0], role_name(header.role));
        if (n == 0) break;
        role_words += n;
        parts.erase(parts.begin());
    }
    if (role_words > 1) warnings.push_back("repeated role word stripped");

    if (!fields) {
        result.leftover = join(parts, " ");
        return result;
    }

    std::vector<std::string> rest;
    for (std::string& part : parts) {
        if (starts_with(part, "to=") && part.size() > 3) {
            // The last "to=" names the recipient (HARMONY.md §6.3 step 5, as the strict parser reads it); an
            // earlier one is a leftover word (X6).
            if (header.recipient) rest.push_back("to=" + *header.recipient);
            header.recipient = part.substr(3);
        } else if (starts_with(part, kConstrainMarker) && !header.content_type) {
            header.content_type = part;
        } else {
            rest.push_back(std::move(part));
        }
    }
    if (!header.recipient && slot_recipient) header.recipient = slot_recipient;
    if (!header.content_type) {
        auto it = std::find_if(rest.begin(), rest.end(), [](const std::string& w) { return is_content_type_word(w); });
        if (it == rest.end() && header.recipient && rest.size() == 1 && valid_recipient(rest[0])) it = rest.begin();
        if (it != rest.end()) {  // harmony: the word after the recipient is the content type
            header.content_type = *it;
            rest.erase(it);
        }
    }
    if (!header.recipient) {
        auto it =
            std::find_if(rest.begin(), rest.end(), [&](const std::string& w) { return is_tool_name(w, declared); });
        if (it != rest.end()) {
            header.recipient = *it;  // a bare recipient (harmony: "assistant python")
            rest.erase(it);
        }
    }
    if (header.recipient && !valid_recipient(*header.recipient)) {
        warnings.push_back("invalid recipient '" + *header.recipient + "' dropped");
        header.recipient.reset();
        header.recovered = true;
    }
    if (header.recipient && header.role == Role::kAssistant &&
        (*header.recipient == "assistant" || *header.recipient == "all")) {
        warnings.push_back("recipient '" + *header.recipient + "' on an assistant message dropped");
        header.recipient.reset();
        header.recovered = true;
    }
    if (header.recipient && declared) {  // X8: "functions.shelljson" -> functions.shell + json
        std::string_view r = *header.recipient;
        std::string_view prefix = starts_with(r, "functions.") ? "functions." : "";
        std::string_view base = r.substr(prefix.size());
        if (base.size() > 4 && base.substr(base.size() - 4) == "json" && !is_declared(declared, base) &&
            is_declared(declared, base.substr(0, base.size() - 4))) {
            header.recipient = std::string(prefix) + std::string(base.substr(0, base.size() - 4));
            if (!header.content_type) header.content_type = "json";
            warnings.push_back("glued json suffix split from recipient");
        }
    }
    if (!rest.empty()) {
        warnings.push_back("leftover header words dropped: " + join(rest, " "));
        bool function_call = header.recipient &&
                             (starts_with(*header.recipient, "functions.") || is_declared(declared, *header.recipient));
        if (!function_call) header.recovered = true;
    }
    return result;
}

// The words of a call header that are not its fields (HARMONY.md §6.7 X10 for a header with "to="): the
// header less its <|channel|> value, its to=... word and a content type after <|constrain|> or a bare "json".
// `to=functions.f <|constrain|>json{"a":1}` leaves `{"a":1}`; `to=functions.` leaves nothing.
std::string call_header_leftover(std::string_view text) {
    std::string h = normalize_header_spaces(text);
    auto erase_word_after = [&](size_t at, size_t marker_size, bool skip_spaces, bool identifier_only) {
        size_t e = at + marker_size;
        if (skip_spaces)
            while (e < h.size() && is_ascii_space(h[e])) ++e;
        auto in_word = [&](char c) {
            if (identifier_only) return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
            return c != '<' && !is_ascii_space(c);
        };
        while (e < h.size() && in_word(h[e])) ++e;
        h = h.substr(0, at) + " " + h.substr(e);
    };
    for (size_t at; (at = h.find(kChannelMarker)) != std::string::npos;)
        erase_word_after(at, kChannelMarker.size(), true, false);
    for (size_t at; (at = h.find("to=")) != std::string::npos;) erase_word_after(at, 3, false, false);
    for (size_t at; (at = h.find(kConstrainMarker)) != std::string::npos;)
        erase_word_after(at, kConstrainMarker.size(), true, true);
    std::string rest(trim_unicode(h));
    for (std::string_view word : {"json", "assistant"}) {  // a bare content type; the role word
        if (starts_with(rest, word) &&
            (rest.size() == word.size() ||
             !(std::isalnum(static_cast<unsigned char>(rest[word.size()])) || rest[word.size()] == '_')))
            rest = std::string(trim_unicode(rest.substr(word.size())));
    }
    return rest;
}

Message to_message(const ParsedMessage& parsed) {
    Message m;
    m.role = parsed.header.role;
    m.name = parsed.header.name;
    m.recipient = parsed.header.recipient;
    m.channel = parsed.header.channel;
    m.content_type = parsed.header.content_type;
    m.content = parsed.content;
    return m;
}

StreamParser::StreamParser(const tokenizer::BpeTokenizer& tokenizer, ParserOptions options)
    : StreamParser([&tokenizer](int32_t id) { return tokenizer.token_bytes(id); }, std::move(options)) {}

StreamParser::StreamParser(TokenBytesFn token_bytes, ParserOptions options)
    : token_bytes_(std::move(token_bytes)), options_(std::move(options)) {
    if (options_.initial_role) begin_header(options_.initial_role);
}

std::vector<Event> StreamParser::push(int32_t id) {
    std::vector<Event> out;
    if (!finished_) process(id, out);
    return out;
}

std::vector<Event> StreamParser::push(std::span<const int32_t> ids) {
    std::vector<Event> out;
    for (int32_t id : ids) {
        if (!finished_) process(id, out);
    }
    return out;
}

std::vector<Event> StreamParser::finish() {
    std::vector<Event> out;
    if (finished_) return out;
    finished_ = true;
    switch (state_) {
        case State::kContent: end_message(Terminator::kNone, out); break;
        case State::kHeader:
            if (options_.mode == ParseMode::kRobust) {
                recover_header(Terminator::kNone, out);
            } else {
                fail("Unexpected EOS while waiting for message header to complete");
            }
            break;
        case State::kExpectStart:
        case State::kDone:
        case State::kFailed: break;
    }
    return out;
}

void StreamParser::fail(std::string message) {
    if (options_.mode == ParseMode::kStrict) message += " (strict)";
    status_ = data_loss(std::move(message));
    state_ = State::kFailed;
}

void StreamParser::warn(std::string message) { warnings_.push_back(std::move(message)); }

void StreamParser::process(int32_t id, std::vector<Event>& out) {
    if (state_ == State::kFailed) return;
    if (state_ == State::kDone) {
        if (!warned_discard_) warn("tokens after a stop token discarded");
        warned_discard_ = true;
        return;
    }
    if (!is_special(id) && !token_bytes_(id)) {
        if (options_.mode == ParseMode::kStrict) {
            fail("unknown token id " + std::to_string(id));
        } else {
            warn("unknown token id " + std::to_string(id) + " ignored");
        }
        return;
    }
    switch (state_) {
        case State::kExpectStart: process_expect_start(id, out); break;
        case State::kHeader: process_header(id, out); break;
        case State::kContent: process_content(id, out); break;
        case State::kDone:
        case State::kFailed: break;
    }
}

void StreamParser::begin_header(std::optional<Role> preset_role) {
    state_ = State::kHeader;
    header_role_ = preset_role;
    header_ids_.clear();
}

void StreamParser::process_expect_start(int32_t id, std::vector<Event>& out) {
    if (id == kStart) {
        begin_header(std::nullopt);
        return;
    }
    if (options_.mode != ParseMode::kRobust) {
        fail("Unexpected token " + std::to_string(id) + " while expecting start token " + std::to_string(kStart));
        return;
    }
    if (is_terminator(id)) {  // X1
        warn("stray stop token " + std::to_string(id) + " ignored");
        if (id != kEnd) state_ = State::kDone;
        return;
    }
    if (id == kEndOfText) {
        state_ = State::kDone;
        return;
    }
    if (is_special(id) && id != kChannel && id != kMessage && id != kConstrain) {
        warn("unexpected special token " + special_token_text(id).value_or("") + " ignored");
        return;
    }
    if (!is_special(id)) {
        std::optional<std::string_view> bytes = token_bytes_(id);
        if (bytes && std::all_of(bytes->begin(), bytes->end(), is_ascii_space)) {
            warn("stray whitespace between messages ignored");
            return;
        }
    }
    warn("missing <|start|>: implicit '<|start|>assistant'");  // X2
    begin_header(Role::kAssistant);
    process_header(id, out);
}

void StreamParser::process_header(int32_t id, std::vector<Event>& out) {
    const bool robust = options_.mode == ParseMode::kRobust;
    if (id == kMessage) {
        complete_header(out);
        return;
    }
    if (is_terminator(id) && options_.mode != ParseMode::kStrict) {  // X10 / harmony strict=false
        if (robust && header_ids_.empty()) {
            warn("stray stop token " + std::to_string(id) + " ignored");
            state_ = id == kEnd ? State::kExpectStart : State::kDone;
            return;
        }
        recover_header(terminator_of(id), out);
        if (robust && id != kEnd && state_ != State::kFailed) state_ = State::kDone;
        return;
    }
    if (robust) {
        if (id == kStart) {  // X4
            recover_header(Terminator::kImplicit, out);
            begin_header(std::nullopt);
            return;
        }
        if (id == kEndOfText) {
            recover_header(Terminator::kEndOfText, out);
            state_ = State::kDone;
            return;
        }
        if (is_special(id) && id != kChannel && id != kConstrain) {
            warn("unexpected special token " + special_token_text(id).value_or("") + " ignored in header");
            return;
        }
    }
    header_ids_.push_back(id);
    // X13 is robust mode's rule: strict and lenient parse as harmony does, which bounds no header (a lenient
    // completion that writes a long answer without <|message|> is recovered whole at its terminator, as harmony's
    // strict=false; the stream's own length bounds the header).
    if (robust && header_ids_.size() > options_.max_header_tokens) {
        warn("header longer than " + std::to_string(options_.max_header_tokens) + " tokens");
        recover_header(Terminator::kNone, out);
    }
}

std::string StreamParser::header_text() const {
    std::string bytes;
    for (int32_t id : header_ids_) {
        if (is_special(id)) {
            bytes += special_token_text(id).value_or("");
        } else if (std::optional<std::string_view> b = token_bytes_(id)) {
            bytes += *b;
        }
    }
    return decode_utf8_lossy(bytes, true);
}

void StreamParser::complete_header(std::vector<Event>& out) {
    if (options_.mode == ParseMode::kRobust) {
        HeaderParseResult r =
            parse_header_robust(header_text(), header_role_, true, options_.declared_functions, warnings_);
        start_message(std::move(r.header), out);
        return;
    }
    StatusOr<HeaderParseResult> r = parse_header_harmony(header_text(), header_role_, true);
    if (!r.ok()) {
        fail(r.status().message());
        return;
    }
    if (!r->leftover.empty()) {
        fail("unexpected tokens remaining in message header: [\"" + r->leftover + "\"]");
        return;
    }
    start_message(std::move(r->header), out);
}

void StreamParser::recover_header(Terminator terminator, std::vector<Event>& out) {
    const bool robust = options_.mode == ParseMode::kRobust;
    std::optional<Role> role = header_role_;
    const bool empty = header_ids_.empty();
    state_ = State::kExpectStart;
    header_role_.reset();
    if (!robust) {
        // harmony strict=false: only the completion's first header (role pre-set) is kept.
        if (!role || empty) return;
        StatusOr<HeaderParseResult> r = parse_header_harmony(header_text(), role, false);
        if (!r.ok()) {
            fail(r.status().message());
            return;
        }
        start_message(std::move(r->header), out);
        append_content(r->leftover, out);
        end_message(terminator, out);
        return;
    }
    std::vector<std::string> warnings;
    const std::string text = header_text();
    HeaderParseResult r = parse_header_robust(text, role, false, options_.declared_functions, warnings);
    warnings_.insert(warnings_.end(), warnings.begin(), warnings.end());
    // A stream that ends inside a call's header (max_tokens, or a forced "to=functions." prefix the
    // model never completed), or a header whose "to=" names no recipient ended by any terminator (the
    // model stopped right after tool_choice "required"'s forced "to=functions."): the header's words are
    // not content (they were partly the server's own prompt), and no call was made.
    // A call header that a terminator ends before <|message|> (X10): what is left past its fields (the
    // arguments the model wrote without <|message|>) is kept as recovered reasoning; no call is made.
    const bool has_to = text.find("to=") != std::string::npos;
    if (has_to) {
        const std::string rest = terminator == Terminator::kNone ? std::string() : call_header_leftover(text);
        if (rest.empty()) {
            warn("header of a cut call dropped");
            return;
        }
        warn("call header without <|message|> recovered as content");
        r.header.recipient.reset();
        r.header.content_type.reset();
        r.header.recovered = true;
        start_message(std::move(r.header), out);
        append_content(rest, out);
        end_message(terminator, out);
        return;
    }
    if (r.leftover.empty()) {
        if (terminator == Terminator::kImplicit) {
            warn("repeated <|start|> ignored");
        } else if (!empty) {
            warn("header without <|message|> dropped");
        }
        return;
    }
    warn("header without <|message|> recovered as content");
    r.header.recovered = true;
    start_message(std::move(r.header), out);
    append_content(r.leftover, out);
    end_message(terminator, out);
}

void StreamParser::start_message(MessageHeader header, std::vector<Event>& out) {
    current_ = ParsedMessage{};
    current_.header = std::move(header);
    pending_bytes_.clear();
    state_ = State::kContent;
    Event e;
    e.type = EventType::kMessageStart;
    e.message_index = messages_.size();
    e.header = current_.header;
    out.push_back(std::move(e));
}

void StreamParser::append_content(std::string_view bytes, std::vector<Event>& out) {
    pending_bytes_.append(bytes);
    std::string text = decode_utf8_lossy(pending_bytes_, false);
    if (text.empty()) return;
    current_.content += text;
    Event e;
    e.type = EventType::kContentDelta;
    e.message_index = messages_.size();
    e.delta = std::move(text);
    out.push_back(std::move(e));
}

void StreamParser::end_message(Terminator terminator, std::vector<Event>& out) {
    std::string rest = decode_utf8_lossy(pending_bytes_, true);
    if (!rest.empty()) {
        current_.content += rest;
        Event e;
        e.type = EventType::kContentDelta;
        e.message_index = messages_.size();
        e.delta = std::move(rest);
        out.push_back(std::move(e));
    }
    current_.terminator = terminator;
    messages_.push_back(std::move(current_));
    current_ = ParsedMessage{};
    state_ = State::kExpectStart;
    Event e;
    e.type = EventType::kMessageEnd;
    e.message_index = messages_.size() - 1;
    e.terminator = terminator;
    out.push_back(std::move(e));
}

void StreamParser::process_content(int32_t id, std::vector<Event>& out) {
    if (is_terminator(id)) {
        end_message(terminator_of(id), out);
        if (options_.mode == ParseMode::kRobust && id != kEnd) state_ = State::kDone;  // X14
        return;
    }
    if (options_.mode == ParseMode::kRobust) {
        if (id == kStart) {  // X3
            warn("missing <|end|>: message closed at <|start|>");
            end_message(Terminator::kImplicit, out);
            begin_header(std::nullopt);
            return;
        }
        if (id == kChannel) {
            warn("missing <|end|>: message closed at <|channel|>");
            end_message(Terminator::kImplicit, out);
            begin_header(Role::kAssistant);
            header_ids_.push_back(id);
            return;
        }
        if (id == kEndOfText) {
            end_message(Terminator::kEndOfText, out);
            state_ = State::kDone;
            return;
        }
        if (is_special(id)) {
            warn("unexpected special token " + special_token_text(id).value_or("") + " dropped from content");
            return;
        }
    }
    if (is_special(id)) {
        append_content(special_token_text(id).value_or(""), out);
    } else if (std::optional<std::string_view> bytes = token_bytes_(id)) {
        append_content(*bytes, out);
    }
}

}  // namespace gptoss::harmony
