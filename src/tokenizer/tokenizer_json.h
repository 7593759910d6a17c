// Reads the parts of a Hugging Face tokenizer.json that a byte-level BPE tokenizer needs. The
// 27 MB vocab and merges are streamed through nlohmann's SAX parser straight into byte arenas (a DOM
// of them would cost about a second); the small rest of the file is kept as a DOM.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gptoss::tokenizer {

// GPT-2 byte-level alphabet: each byte is spelled as one code point in vocab and merges strings.
// Appends the bytes that `spelled` stands for; false if it has a code point outside the alphabet.
bool byte_level_decode(std::string_view spelled, std::string& out);

struct TokenizerJson {
    struct VocabEntry {
        uint32_t offset;  // in vocab_bytes
        uint32_t length;
        uint32_t id;
    };
    struct Merge {
        uint32_t offset;  // in merge_bytes: left bytes, then right bytes
        uint32_t left_length;
        uint32_t right_length;
    };
    struct AddedToken {
        uint32_t id;
        std::string content;
        bool special;
    };

    std::string vocab_bytes;  // raw bytes of every vocab token, concatenated
    std::vector<VocabEntry> vocab;
    std::string merge_bytes;
    std::vector<Merge> merges;
    std::string split_pattern;  // pre_tokenizer Split Regex
    std::vector<AddedToken> added_tokens;
};

// Errors: data_loss for JSON syntax, invalid_argument for a malformed field, unimplemented for a
// valid configuration this tokenizer does not support (normalizers, other models or pre-tokenizers).
StatusOr<TokenizerJson> parse_tokenizer_json(std::string_view text);

}  // namespace gptoss::tokenizer
