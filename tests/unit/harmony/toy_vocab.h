// A tiny stand-in vocabulary for parser tests that must not need tokenizer.json: ids 0-255 are
// single bytes, a few ids are multi-byte pieces (to split UTF-8 characters across tokens), and the
// Harmony special ids are spelled "<|start|>" etc. in toy_encode's input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harmony/harmony_types.h"

namespace gptoss::harmony::testing {

inline constexpr int32_t kToyPieceBase = 1000;
// Multi-byte pieces: "💖" = F0 9F 92 96 split in two; a lone lead byte; a 3-byte prefix.
inline const std::vector<std::string>& toy_pieces() {
    static const std::vector<std::string> pieces = {"\xF0\x9F", "\x92\x96", " \xF0\x9F", "worked", "\xE2\x82"};
    return pieces;
}

inline std::optional<std::string_view> toy_token_bytes(int32_t id) {
    static const std::vector<std::string> bytes = [] {
        std::vector<std::string> b(256);
        for (int i = 0; i < 256; ++i) b[i] = std::string(1, static_cast<char>(i));
        return b;
    }();
    if (id >= 0 && id < 256) return std::string_view(bytes[id]);
    if (id >= kToyPieceBase && id < kToyPieceBase + static_cast<int32_t>(toy_pieces().size())) {
        return std::string_view(toy_pieces()[id - kToyPieceBase]);
    }
    return std::nullopt;
}

// Text -> ids: every "<|name|>" that spells a Harmony special token becomes its id; every other
// byte becomes its own id.
inline std::vector<int32_t> toy_encode(std::string_view text) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
        bool matched = false;
        if (text.substr(i, 2) == "<|") {
            for (int32_t id = kFirstSpecialId; id <= kEndOfPrompt; ++id) {
                std::string name = *special_token_text(id);
                if (text.substr(i, name.size()) == name) {
                    ids.push_back(id);
                    i += name.size();
                    matched = true;
                    break;
                }
            }
        }
        if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
}

}  // namespace gptoss::harmony::testing
