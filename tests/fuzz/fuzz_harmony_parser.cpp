// Fuzz target: model output as token ids -> StreamParser (every mode) -> chat.completions result.
// Must never crash, and robust mode must never report an error.
//
// Input bytes: byte 0 picks options (bits 0-1 mode: strict, lenient, robust, robust; bit 2 no
// initial role; bit 3 declared functions; bit 4 length-limited). Each following byte b is
//   00xxxxxx  special id 199998 + x % 21
//   01xxxxxx  ordinary id x (0-63)
//   10xxxxxx  ordinary id (x << 8) | next byte
//   11xxxxxx  x = 63: raw int32 from the next 4 bytes; x = 62: 199998 + 5 * next byte (reserved and
//             out-of-range ids); else the ids of a header word (" to=functions.get_weather", ...)
// Ids decode with tokenizer.json when find_tokenizer_file finds it, else with a byte vocabulary
// (id = byte), so the target runs without the file.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harmony/harmony_chat.h"
#include "harmony/harmony_json.h"
#include "harmony/harmony_parser.h"
#include "tokenizer/bpe_tokenizer.h"

namespace {

using namespace gptoss;
using namespace gptoss::harmony;

const char* const kWords[] = {"assistant",
                              " to=functions.get_weather",
                              "analysis",
                              "commentary",
                              "final",
                              " json",
                              " code",
                              " <|constrain|>json",
                              "to=assistant",
                              " to=browser.search",
                              "functions.shelljson",
                              "??",
                              " ",
                              "\n",
                              "{\"city\":\"Paris\"}",
                              "\xC2\xA0\xE2\x80\x8B",
                              "\xF0\x9F",
                              "\x92\x96",
                              "user",
                              "browser.search",
                              "get_weather"};

struct Vocab {
    std::unique_ptr<tokenizer::BpeTokenizer> tokenizer;
    std::vector<std::string> bytes;  // byte vocabulary when there is no tokenizer
    std::vector<std::vector<int32_t>> words;

    std::optional<std::string_view> token_bytes(int32_t id) const {
        if (tokenizer) return tokenizer->token_bytes(id);
        if (id >= 0 && id < 256) return std::string_view(bytes[id]);
        return std::nullopt;
    }
};

const Vocab& vocab() {
    static const Vocab* v = [] {
        auto* out = new Vocab;
        if (std::optional<std::string> path = tokenizer::find_tokenizer_file("")) {
            auto t = tokenizer::BpeTokenizer::from_file(*path);
            if (t.ok()) out->tokenizer = std::move(t).value();
        }
        for (int i = 0; i < 256; ++i) out->bytes.emplace_back(1, static_cast<char>(i));
        for (const char* w : kWords) {
            if (out->tokenizer) {
                out->words.push_back(out->tokenizer->encode_ordinary(w));
            } else {
                std::vector<int32_t> ids;
                for (const char* p = w; *p != '\0'; ++p) ids.push_back(static_cast<unsigned char>(*p));
                out->words.push_back(ids);
            }
        }
        return out;
    }();
    return *v;
}

std::vector<int32_t> decode_input(const uint8_t* data, size_t size) {
    const Vocab& v = vocab();
    std::vector<int32_t> ids;
    for (size_t i = 1; i < size; ++i) {
        uint8_t b = data[i];
        uint8_t x = b & 0x3F;
        switch (b >> 6) {
            case 0: ids.push_back(kFirstSpecialId + x % 21); break;
            case 1: ids.push_back(x); break;
            case 2: ids.push_back((x << 8) | (i + 1 < size ? data[++i] : 0)); break;
            default:
                if (x == 63) {
                    uint32_t raw = 0;
                    for (int k = 0; k < 4 && i + 1 < size; ++k) raw = (raw << 8) | data[++i];
                    int32_t id;
                    std::memcpy(&id, &raw, sizeof(id));
                    ids.push_back(id);
                } else if (x == 62) {
                    ids.push_back(kFirstSpecialId + 5 * (i + 1 < size ? data[++i] : 0));
                } else {
                    const std::vector<int32_t>& w = v.words[x % v.words.size()];
                    ids.insert(ids.end(), w.begin(), w.end());
                }
                break;
        }
    }
    return ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const Vocab& v = vocab();
    ParserOptions options;
    options.mode = (data[0] & 3) == 0   ? ParseMode::kStrict
                   : (data[0] & 3) == 1 ? ParseMode::kLenient
                                        : ParseMode::kRobust;
    if (data[0] & 4) options.initial_role.reset();
    if (data[0] & 8) options.declared_functions = std::vector<std::string>{"get_weather", "shell"};
    const bool length_limit = (data[0] & 16) != 0;

    StreamParser parser([&v](int32_t id) { return v.token_bytes(id); }, options);
    ChatMappingOptions mapping;
    mapping.declared_functions = options.declared_functions;
    ChatMapper mapper(mapping);
    std::vector<std::string> streamed;  // content per message, from the deltas
    auto consume = [&](const std::vector<Event>& events) {
        for (const Event& e : events) {
            if (e.type == EventType::kMessageStart) streamed.emplace_back();
            if (e.type == EventType::kContentDelta) streamed.back() += e.delta;
        }
        for (const ChatDelta& d : mapper.on_events(events)) chat_delta_to_json(d).dump();
    };
    for (int32_t id : decode_input(data, size)) consume(parser.push(id));
    consume(parser.finish());

    const std::vector<ParsedMessage>& messages = parser.messages();
    if (options.mode == ParseMode::kRobust && !parser.status().ok()) std::abort();
    if (streamed.size() < messages.size()) std::abort();
    for (size_t i = 0; i < messages.size(); ++i) {
        if (streamed[i] != messages[i].content) std::abort();
    }
    ChatCompletion completion = to_chat_completion(messages, mapping, length_limit);
    ChatCompletion from_stream = mapper.result(length_limit);
    // Streamed and non-streamed results agree (a strict failure may leave a message unfinished).
    if (parser.status().ok() &&
        (completion.content != from_stream.content || completion.reasoning_content != from_stream.reasoning_content ||
         completion.tool_calls.size() != from_stream.tool_calls.size() ||
         completion.finish_reason != from_stream.finish_reason)) {
        std::abort();
    }
    chat_completion_to_json(completion).dump();
    parsed_messages_to_json(messages).dump();
    return 0;
}
