// o200k_harmony byte-level BPE (tiktoken algorithm), loaded from a Hugging Face tokenizer.json.
// Thread-safe after construction (encode/decode are const and keep no shared mutable state).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gptoss::tokenizer {

class BpeTokenizer {
public:
    // Loads vocab/merges, the pre-split regex and the added (special) tokens from tokenizer.json.
    static StatusOr<std::unique_ptr<BpeTokenizer>> from_file(const std::string& path);
    static StatusOr<std::unique_ptr<BpeTokenizer>> from_json(std::string_view json_text);
    ~BpeTokenizer();

    // Plain text to ids; special-token strings in `text` are ordinary text (tiktoken encode_ordinary).
    std::vector<int32_t> encode_ordinary(std::string_view text) const;
    // Same, appending to `out` (a prompt rendered piece by piece needs no temporary vectors).
    void encode_ordinary_append(std::string_view text, std::vector<int32_t>& out) const;
    // Special-token strings are recognised only when listed in `allowed_special` (by their text,
    // e.g. "<|start|>"); `allow_all_special` recognises every added token.
    std::vector<int32_t> encode(std::string_view text, std::span<const std::string> allowed_special,
                                bool allow_all_special = false) const;
    // Ids to raw bytes (specials as their literal text). May end inside a UTF-8 character when the
    // ids do; use StreamingDecoder for incremental, UTF-8-safe text. Unknown ids give an error.
    StatusOr<std::string> decode(std::span<const int32_t> ids) const;
    // The same, an id without bytes (out of range, or one of the model's ids the tokenizer file does not
    // list, e.g. o200k_harmony's reserved 200019-201087 in a tokenizer.json that stops at 200018) adding
    // nothing, as Hugging Face tokenizers' decode skips it: for text made of a model's output.
    std::string decode_lossy(std::span<const int32_t> ids) const;
    // Bytes of a single token (literal text for specials); nullopt for an unknown id.
    std::optional<std::string_view> token_bytes(int32_t id) const;
    std::optional<int32_t> special_token_id(std::string_view text) const;
    bool is_special(int32_t id) const;
    // One more than the largest id the tokenizer knows.
    int32_t vocab_size() const;

private:
    struct Impl;
    explicit BpeTokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Turns a stream of ids into UTF-8 text pieces, holding back the bytes of an incomplete character
// until the token that completes it arrives. flush() returns what is left (invalid bytes become
// U+FFFD).
class StreamingDecoder {
public:
    explicit StreamingDecoder(const BpeTokenizer& tok) : tok_(tok) {}
    std::string push(int32_t id);
    std::string flush();

private:
    const BpeTokenizer& tok_;
    std::string pending_;
};

// tokenizer.json to use: the model directory's own if it has one, else $GPTOSS_TOKENIZER, else the
// fixture fetched by scripts/setup.sh (.cache/tokenizer/tokenizer.json under the source tree).
// nullopt when none exists.
std::optional<std::string> find_tokenizer_file(const std::string& model_dir);

}  // namespace gptoss::tokenizer
