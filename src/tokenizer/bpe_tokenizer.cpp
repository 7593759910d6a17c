#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tokenizer/byte_pair.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/rank_table.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace gptoss::tokenizer {

namespace {

// Ids beyond this are taken as a corrupt file rather than allocated for; so are larger files.
constexpr uint32_t kMaxVocabSize = 1u << 24;
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;

struct SpecialToken {
    std::string_view text;  // into Impl::special_bytes
    int32_t id;
};

}  // namespace

struct BpeTokenizer::Impl {
    RankTable ranks;                         // ordinary tokens only: encode never yields a special id
    PairTable pairs;                         // (left, right) -> merged id
    std::array<uint32_t, 256> byte_id{};     // id of each single-byte token
    std::string special_bytes;               // literal text of the added tokens, concatenated
    std::vector<SpecialToken> specials;      // sorted by id
    std::vector<std::string_view> id_bytes;  // [vocab_size] bytes of each id; empty: unknown id
    std::vector<uint8_t> special_flag;       // [vocab_size]
    std::unique_ptr<PreTokenizer> pre;
    int32_t vocab_size = 0;

    void encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const {
        const size_t n = text.size();
        size_t pos = 0;
        while (pos < n) {
            // The pre-tokenizer sees well-formed UTF-8 only; an ill-formed byte is a piece of its own.
            size_t valid = valid_utf8_prefix(text.data() + pos, n - pos);
            if (valid > 0) {
                const BpeTables tables{ranks, pairs, byte_id.data()};
                pre->split(text.substr(pos, valid), [&](std::string_view piece) {
                    encode_piece(reinterpret_cast<const uint8_t*>(piece.data()), piece.size(), tables, out);
                });
                pos += valid;
            }
            if (pos < n) out.push_back(static_cast<int32_t>(byte_id[static_cast<uint8_t>(text[pos++])]));
        }
    }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::from_file(const std::string& path) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (std::filesystem::is_directory(st)) return invalid_argument("tokenizer path is a directory: " + path);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
        return invalid_argument("tokenizer path is not a regular file: " + path);
    if (ec && ec != std::errc::no_such_file_or_directory)
        return invalid_argument("tokenizer file " + path + ": " + ec.message());
    if (!std::filesystem::is_regular_file(st)) return not_found("tokenizer file not found: " + path);
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open tokenizer file: " + path);
    auto size = std::filesystem::file_size(path, ec);
    if (ec) return data_loss("cannot read tokenizer file: " + path + ": " + ec.message());
    if (size > kMaxFileBytes) return invalid_argument("tokenizer file is implausibly large: " + path);
    std::string text(static_cast<size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (static_cast<size_t>(in.gcount()) != text.size()) return data_loss("cannot read tokenizer file: " + path);
    auto tok = from_json(text);
    if (!tok.ok()) return tok.status().with_context(path);
    return tok;
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::from_json(std::string_view json_text) {
    auto parsed = parse_tokenizer_json(json_text);
    if (!parsed.ok()) return parsed.status().with_context("tokenizer.json");
    TokenizerJson& tj = *parsed;
    auto impl = std::make_unique<Impl>();
    auto bad = [](const std::string& m) { return invalid_argument("tokenizer.json: " + m); };

    uint32_t max_id = 0;
    for (const auto& v : tj.vocab) max_id = std::max(max_id, v.id);
    for (const auto& a : tj.added_tokens) max_id = std::max(max_id, a.id);
    if (max_id >= kMaxVocabSize) return bad("token id " + std::to_string(max_id) + " is implausibly large");
    const uint32_t vocab_size = max_id + 1;
    impl->vocab_size = static_cast<int32_t>(vocab_size);

    // Added tokens: literal text, never produced by BPE.
    impl->special_flag.assign(vocab_size, 0);
    std::vector<std::pair<uint32_t, uint32_t>> special_span(vocab_size, {0, 0});  // offset, length
    for (const auto& a : tj.added_tokens) {
        if (impl->special_flag[a.id]) return bad("added token id " + std::to_string(a.id) + " appears twice");
        impl->special_flag[a.id] = 1;
        special_span[a.id] = {static_cast<uint32_t>(impl->special_bytes.size()),
                              static_cast<uint32_t>(a.content.size())};
        impl->special_bytes += a.content;
    }

    // Ordinary tokens in id order, for the rank table (rank = id, the tiktoken rule).
    std::vector<int64_t> entry_of(vocab_size, -1);
    for (size_t i = 0; i < tj.vocab.size(); ++i) {
        uint32_t id = tj.vocab[i].id;
        if (entry_of[id] >= 0) return bad("model.vocab id " + std::to_string(id) + " appears twice");
        entry_of[id] = static_cast<int64_t>(i);
    }
    std::string arena;
    arena.reserve(tj.vocab_bytes.size());
    std::vector<uint32_t> offsets(vocab_size + 1, 0);
    for (uint32_t id = 0; id < vocab_size; ++id) {
        offsets[id] = static_cast<uint32_t>(arena.size());
        if (entry_of[id] >= 0 && !impl->special_flag[id]) {
            const auto& v = tj.vocab[static_cast<size_t>(entry_of[id])];
            arena.append(tj.vocab_bytes, v.offset, v.length);
        }
    }
    offsets[vocab_size] = static_cast<uint32_t>(arena.size());
    uint32_t dup_a = 0, dup_b = 0;
    if (!impl->ranks.build(std::move(arena), std::move(offsets), &dup_a, &dup_b)) {
        return bad("model.vocab ids " + std::to_string(dup_a) + " and " + std::to_string(dup_b) +
                   " have the same bytes");
    }
    for (int b = 0; b < 256; ++b) {
        uint8_t byte = static_cast<uint8_t>(b);
        uint32_t id = impl->ranks.find(&byte, 1);
        if (id == kNoRank) return bad("model.vocab has no token for byte " + std::to_string(b));
        impl->byte_id[b] = id;
    }

    // tiktoken merges the adjacent pair whose concatenation has the lowest id; Hugging Face merges
    // the listed pair that comes first in model.merges. They agree when the merges are ordered by
    // the id they make (checked here) and list every split of a token into two tokens (true of
    // every tiktoken-converted file; the unit tests check it for o200k_harmony). BPE then looks up
    // the listed pairs; without merges, every two-token split of every token is a pair.
    if (!tj.merges.empty()) {
        impl->pairs.reserve(tj.merges.size());
        uint32_t previous = 0;
        for (size_t i = 0; i < tj.merges.size(); ++i) {
            const auto& m = tj.merges[i];
            const auto* p = reinterpret_cast<const uint8_t*>(tj.merge_bytes.data()) + m.offset;
            uint32_t left = impl->ranks.find(p, m.left_length);
            uint32_t right = impl->ranks.find(p + m.left_length, m.right_length);
            uint32_t merged = impl->ranks.find(p, m.left_length + m.right_length);
            if (left == kNoRank || right == kNoRank || merged == kNoRank) {
                return bad("model.merges entry " + std::to_string(i) + " uses or makes a token not in model.vocab");
            }
            if (merged < previous) {
                return unimplemented("tokenizer.json: model.merges is not ordered by token id (entry " +
                                     std::to_string(i) + "), so tiktoken ranks would not reproduce it");
            }
            previous = merged;
            impl->pairs.insert(left, right, merged);
        }
    } else {
        for (uint32_t id = 0; id < vocab_size; ++id) {
            std::string_view bytes = impl->ranks.bytes(id);
            const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
            for (size_t k = 1; k < bytes.size(); ++k) {
                uint32_t left = impl->ranks.find(p, k);
                uint32_t right = left == kNoRank ? kNoRank : impl->ranks.find(p + k, bytes.size() - k);
                if (right != kNoRank) impl->pairs.insert(left, right, id);
            }
        }
    }

    auto pre = PreTokenizer::create(tj.split_pattern);
    if (!pre.ok()) return pre.status().with_context("tokenizer.json");
    impl->pre = std::move(*pre);

    impl->id_bytes.resize(vocab_size);
    for (uint32_t id = 0; id < vocab_size; ++id) {
        if (impl->special_flag[id]) {
            auto [off, len] = special_span[id];
            impl->id_bytes[id] = std::string_view(impl->special_bytes).substr(off, len);
            impl->specials.push_back({impl->id_bytes[id], static_cast<int32_t>(id)});
        } else {
            impl->id_bytes[id] = impl->ranks.bytes(id);
        }
    }
    return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 4 + 8);
    impl_->encode_ordinary_into(text, out);
    return out;
}

void BpeTokenizer::encode_ordinary_append(std::string_view text, std::vector<int32_t>& out) const {
    impl_->encode_ordinary_into(text, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, std::span<const std::string> allowed_special,
                                          bool allow_all_special) const {
    std::vector<const SpecialToken*> allowed;
    for (const auto& s : impl_->specials) {
        if (allow_all_special ||
            std::find(allowed_special.begin(), allowed_special.end(), s.text) != allowed_special.end()) {
            allowed.push_back(&s);
        }
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 4 + 8);
    if (allowed.empty()) {
        impl_->encode_ordinary_into(text, out);
        return out;
    }
    bool first_byte[256] = {};
    for (const auto* s : allowed) first_byte[static_cast<uint8_t>(s->text[0])] = true;
    // Leftmost, then longest special (Hugging Face's added-token matching); text between is ordinary.
    size_t segment_start = 0;
    for (size_t pos = 0; pos < text.size(); ++pos) {
        if (!first_byte[static_cast<uint8_t>(text[pos])]) continue;
        const SpecialToken* best = nullptr;
        for (const auto* s : allowed) {
            if (text.compare(pos, s->text.size(), s->text) == 0 && (!best || s->text.size() > best->text.size())) {
                best = s;
            }
        }
        if (!best) continue;
        impl_->encode_ordinary_into(text.substr(segment_start, pos - segment_start), out);
        out.push_back(best->id);
        pos += best->text.size() - 1;
        segment_start = pos + 1;
    }
    if (segment_start < text.size()) impl_->encode_ordinary_into(text.substr(segment_start), out);
    return out;
}

StatusOr<std::string> BpeTokenizer::decode(std::span<const int32_t> ids) const {
    size_t total = 0;
    for (int32_t id : ids) {
        auto bytes = token_bytes(id);
        if (!bytes) return invalid_argument("unknown token id " + std::to_string(id));
        total += bytes->size();
    }
    std::string out;
    out.reserve(total);
    for (int32_t id : ids) out.append(impl_->id_bytes[static_cast<size_t>(id)]);
    return out;
}

std::string BpeTokenizer::decode_lossy(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) {
        if (auto bytes = token_bytes(id)) out.append(*bytes);
    }
    return out;
}

std::optional<std::string_view> BpeTokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= impl_->vocab_size) return std::nullopt;
    std::string_view bytes = impl_->id_bytes[static_cast<size_t>(id)];
    if (bytes.empty()) return std::nullopt;
    return bytes;
}

std::optional<int32_t> BpeTokenizer::special_token_id(std::string_view text) const {
    for (const auto& s : impl_->specials) {
        if (s.text == text) return s.id;
    }
    return std::nullopt;
}

bool BpeTokenizer::is_special(int32_t id) const {
    return id >= 0 && id < impl_->vocab_size && impl_->special_flag[static_cast<size_t>(id)];
}

int32_t BpeTokenizer::vocab_size() const { return impl_->vocab_size; }

std::string StreamingDecoder::push(int32_t id) {
    auto bytes = tok_.token_bytes(id);
    if (!bytes) bytes = std::string_view("\xEF\xBF\xBD");  // an unknown id shows as U+FFFD
    pending_.append(*bytes);
    std::string out;
    size_t consumed = append_utf8_lossy(pending_, out, /*hold_incomplete=*/true);
    pending_.erase(0, consumed);
    return out;
}

std::string StreamingDecoder::flush() {
    std::string out;
    append_utf8_lossy(pending_, out, /*hold_incomplete=*/false);
    pending_.clear();
    return out;
}

std::optional<std::string> find_tokenizer_file(const std::string& model_dir) {
    auto exists = [](const std::string& path) {
        std::error_code ec;
        return !path.empty() && std::filesystem::is_regular_file(path, ec);
    };
    if (!model_dir.empty()) {
        std::string own = (std::filesystem::path(model_dir) / "tokenizer.json").string();
        // The model's own, when there is anything of that name (a directory or a broken link too: the caller's
        // error then names it; the fallback's vocabulary may not be the model's).
        std::error_code ec;
        if (std::filesystem::exists(std::filesystem::symlink_status(own, ec))) return own;
    }
    // Named by the environment, it is the one (a missing file is then the caller's clear error, not the fixture).
    if (const char* env = std::getenv("GPTOSS_TOKENIZER"); env && *env) return std::string(env);
#ifdef GPTOSS_SOURCE_DIR
    std::string fixture = std::string(GPTOSS_SOURCE_DIR) + "/.cache/tokenizer/tokenizer.json";
    if (exists(fixture)) return fixture;
#endif
    return std::nullopt;
}

}  // namespace gptoss::tokenizer
