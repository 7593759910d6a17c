#include "tokenizer/tokenizer_json.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace gptoss::tokenizer {
namespace {

using Json = nlohmann::json;

// Code point -> byte for the GPT-2 alphabet (bytes_to_unicode): printable Latin-1 bytes stand for
// themselves, the other 68 bytes are spelled U+0100.. in byte order.
struct ByteLevelAlphabet {
    static constexpr uint32_t kMaxCodePoint = 0x100 + 68;
    int16_t byte_of[kMaxCodePoint];
    constexpr ByteLevelAlphabet() : byte_of() {
        for (auto& b : byte_of) b = -1;
        int next = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            byte_of[printable ? b : 0x100 + next++] = static_cast<int16_t>(b);
        }
    }
};
constexpr ByteLevelAlphabet kAlphabet{};

// nlohmann SAX handler (duck-typed: sax_parse is a template). model.vocab and model.merges go to
// the arenas of TokenizerJson; everything else is built into `root`.
class Handler {
public:
    explicit Handler(TokenizerJson& out) : out_(out) {}

    Json root;
    Status status;  // first error
    bool saw_vocab = false;
    bool saw_merges = false;

    bool null() { return scalar(Json(nullptr)); }
    bool boolean(bool v) { return scalar(Json(v)); }
    bool number_integer(Json::number_integer_t v) {
        if (top_mode() == Mode::kVocab) return v >= 0 ? vocab_id(static_cast<uint64_t>(v)) : fail("negative id");
        return scalar(Json(v));
    }
    bool number_unsigned(Json::number_unsigned_t v) {
        if (top_mode() == Mode::kVocab) return vocab_id(v);
        return scalar(Json(v));
    }
    bool number_float(Json::number_float_t v, const std::string&) {
        if (top_mode() == Mode::kVocab) return fail("model.vocab ids must be integers");
        return scalar(Json(v));
    }
    bool binary(Json::binary_t&) { return fail("unexpected binary value"); }

    bool string(std::string& v) {
        switch (top_mode()) {
            case Mode::kDom: return scalar(Json(std::move(v)));
            case Mode::kVocab: return fail("model.vocab ids must be integers");
            case Mode::kMerges: {  // legacy form "left right"
                size_t space = v.find(' ');
                if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
                    return fail("model.merges entry \"" + v + "\" is not \"left right\"");
                }
                pair_[0] = v.substr(0, space);
                pair_[1] = v.substr(space + 1);
                return add_merge();
            }
            case Mode::kMergePair:
                if (pair_count_ >= 2) return fail("model.merges entry has more than two strings");
                pair_[pair_count_++] = std::move(v);
                return true;
        }
        return false;
    }

    bool key(std::string& k) {
        if (top_mode() == Mode::kVocab) {
            pending_offset_ = out_.vocab_bytes.size();
            if (!byte_level_decode(k, out_.vocab_bytes)) {
                return fail("model.vocab token \"" + k + "\" is not in the byte-level alphabet");
            }
            return true;
        }
        key_ = std::move(k);
        return true;
    }

    bool start_object(std::size_t) {
        if (stack_.empty()) {
            root = Json::object();
            stack_.push_back({Mode::kDom, &root, false});
            return true;
        }
        const Frame& top = stack_.back();
        switch (top.mode) {
            case Mode::kDom:
                if (top.is_model && top.node->is_object() && key_ == "vocab") {
                    saw_vocab = true;
                    stack_.push_back({Mode::kVocab, nullptr, false});
                    return true;
                }
                return open_dom(Json::object());
            case Mode::kVocab: return fail("model.vocab ids must be integers");
            case Mode::kMerges:
            case Mode::kMergePair: return fail("model.merges entries must be strings or [left, right] pairs");
        }
        return false;
    }
    bool start_array(std::size_t) {
        if (stack_.empty()) return fail("the top level is not an object");
        const Frame& top = stack_.back();
        switch (top.mode) {
            case Mode::kDom:
                if (top.is_model && top.node->is_object() && key_ == "merges") {
                    saw_merges = true;
                    stack_.push_back({Mode::kMerges, nullptr, false});
                    return true;
                }
                return open_dom(Json::array());
            case Mode::kVocab: return fail("model.vocab ids must be integers");
            case Mode::kMerges:
                pair_count_ = 0;
                stack_.push_back({Mode::kMergePair, nullptr, false});
                return true;
            case Mode::kMergePair: return fail("model.merges entries must be strings or [left, right] pairs");
        }
        return false;
    }
    bool end_object() {
        stack_.pop_back();
        return true;
    }
    bool end_array() {
        bool ok = true;
        if (top_mode() == Mode::kMergePair) {
            if (pair_count_ != 2) return fail("model.merges entry is not a [left, right] pair");
            ok = add_merge();
        }
        stack_.pop_back();
        return ok;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
        if (status.ok()) status = data_loss(std::string("not valid JSON: ") + e.what());
        return false;
    }

private:
    enum class Mode : uint8_t { kDom, kVocab, kMerges, kMergePair };
    struct Frame {
        Mode mode;
        Json* node;     // the container being built (kDom)
        bool is_model;  // the top-level "model" object
    };

    Mode top_mode() const { return stack_.empty() ? Mode::kDom : stack_.back().mode; }

    bool fail(std::string message) {
        if (status.ok()) status = invalid_argument(std::move(message));
        return false;
    }

    // Adds `v` to the DOM container on top of the stack and returns where it went.
    Json* insert(Json v) {
        Json* node = stack_.back().node;
        if (node->is_object()) return &((*node)[key_] = std::move(v));
        node->push_back(std::move(v));
        return &node->back();
    }
    bool scalar(Json v) {
        switch (top_mode()) {
            case Mode::kDom: break;
            case Mode::kVocab: return fail("model.vocab ids must be integers");
            case Mode::kMerges:
            case Mode::kMergePair: return fail("model.merges entries must be strings or [left, right] pairs");
        }
        if (stack_.empty()) return fail("the top level is not an object");
        insert(std::move(v));
        return true;
    }
    bool open_dom(Json container) {
        bool is_model = stack_.size() == 1 && container.is_object() && key_ == "model";
        Json* child = insert(std::move(container));
        stack_.push_back({Mode::kDom, child, is_model});
        return true;
    }

    bool vocab_id(uint64_t id) {
        if (id > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) return fail("model.vocab id too large");
        size_t length = out_.vocab_bytes.size() - pending_offset_;
        if (length == 0) return fail("model.vocab has an empty token");
        if (out_.vocab_bytes.size() > std::numeric_limits<uint32_t>::max()) return fail("model.vocab too large");
        out_.vocab.push_back(
            {static_cast<uint32_t>(pending_offset_), static_cast<uint32_t>(length), static_cast<uint32_t>(id)});
        return true;
    }

    bool add_merge() {
        size_t offset = out_.merge_bytes.size();
        if (!byte_level_decode(pair_[0], out_.merge_bytes)) {
            return fail("model.merges token \"" + pair_[0] + "\" is not in the byte-level alphabet");
        }
        size_t left = out_.merge_bytes.size() - offset;
        if (!byte_level_decode(pair_[1], out_.merge_bytes)) {
            return fail("model.merges token \"" + pair_[1] + "\" is not in the byte-level alphabet");
        }
        size_t right = out_.merge_bytes.size() - offset - left;
        if (left == 0 || right == 0) return fail("model.merges has an empty token");
        if (out_.merge_bytes.size() > std::numeric_limits<uint32_t>::max()) return fail("model.merges too large");
        out_.merges.push_back(
            {static_cast<uint32_t>(offset), static_cast<uint32_t>(left), static_cast<uint32_t>(right)});
        return true;
    }

    TokenizerJson& out_;
    std::vector<Frame> stack_;
    std::string key_;
    size_t pending_offset_ = 0;
    std::string pair_[2];
    int pair_count_ = 0;
};

const Json* member(const Json& object, const char* name) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(name);
    return it == object.end() ? nullptr : &*it;
}

std::string type_of(const Json& object) {
    const Json* t = member(object, "type");
    return t && t->is_string() ? t->get<std::string>() : std::string("(no type)");
}

bool flag(const Json& object, const char* name, bool fallback) {
    const Json* v = member(object, name);
    return v && v->is_boolean() ? v->get<bool>() : fallback;
}

Status read_pre_tokenizer(const Json& root, TokenizerJson& out) {
    const Json* pre = member(root, "pre_tokenizer");
    if (!pre || !pre->is_object()) return unimplemented("pre_tokenizer is missing: need a Split Regex");
    std::vector<const Json*> steps;
    if (type_of(*pre) == "Sequence") {
        const Json* list = member(*pre, "pretokenizers");
        if (!list || !list->is_array()) return invalid_argument("pre_tokenizer.pretokenizers is not a list");
        for (const Json& step : *list) steps.push_back(&step);
    } else {
        steps.push_back(pre);
    }
    bool have_split = false;
    for (const Json* step : steps) {
        std::string type = type_of(*step);
        if (type == "Split") {
            if (have_split) return unimplemented("pre_tokenizer has more than one Split");
            const Json* pattern = member(*step, "pattern");
            const Json* regex = pattern ? member(*pattern, "Regex") : nullptr;
            if (!regex || !regex->is_string()) return unimplemented("pre_tokenizer Split pattern is not a Regex");
            const Json* behavior = member(*step, "behavior");
            if (!behavior || *behavior != "Isolated")
                return unimplemented("pre_tokenizer Split behavior is not Isolated");
            if (flag(*step, "invert", false)) return unimplemented("pre_tokenizer Split with invert");
            out.split_pattern = regex->get<std::string>();
            have_split = true;
        } else if (type == "ByteLevel") {
            if (flag(*step, "add_prefix_space", false)) return unimplemented("ByteLevel add_prefix_space");
            if (flag(*step, "use_regex", true)) return unimplemented("ByteLevel use_regex (GPT-2 pattern)");
        } else {
            return unimplemented("pre_tokenizer type " + type);
        }
    }
    if (!have_split) return unimplemented("pre_tokenizer has no Split Regex");
    return ok_status();
}

Status read_added_tokens(const Json& root, TokenizerJson& out) {
    const Json* added = member(root, "added_tokens");
    if (!added || added->is_null()) return ok_status();
    if (!added->is_array()) return invalid_argument("added_tokens is not a list");
    for (const Json& t : *added) {
        const Json* id = member(t, "id");
        const Json* content = member(t, "content");
        if (!id || !id->is_number_unsigned() || id->get<uint64_t>() > std::numeric_limits<int32_t>::max()) {
            return invalid_argument("added_tokens entry without a valid id");
        }
        if (!content || !content->is_string() || content->get<std::string>().empty()) {
            return invalid_argument("added_tokens entry " + std::to_string(id->get<uint64_t>()) + " has no content");
        }
        out.added_tokens.push_back(
            {static_cast<uint32_t>(id->get<uint64_t>()), content->get<std::string>(), flag(t, "special", true)});
    }
    return ok_status();
}

}  // namespace

bool byte_level_decode(std::string_view spelled, std::string& out) {
    const auto* p = reinterpret_cast<const uint8_t*>(spelled.data());
    size_t n = spelled.size();
    for (size_t i = 0; i < n;) {
        int len;
        uint32_t cp = decode_utf8(p + i, n - i, &len);
        if (len == 1 && cp >= 0x80) return false;  // ill-formed UTF-8
        if (cp >= ByteLevelAlphabet::kMaxCodePoint || kAlphabet.byte_of[cp] < 0) return false;
        out.push_back(static_cast<char>(kAlphabet.byte_of[cp]));
        i += len;
    }
    return true;
}

StatusOr<TokenizerJson> parse_tokenizer_json(std::string_view text) {
    TokenizerJson out;
    try {
        Handler handler(out);
        bool parsed = Json::sax_parse(text.data(), text.data() + text.size(), &handler);
        if (!handler.status.ok()) return handler.status;
        if (!parsed) return data_loss("not valid JSON");
        const Json& root = handler.root;
        if (!root.is_object()) return data_loss("not a JSON object");
        const Json* model = member(root, "model");
        if (!model || !model->is_object()) return invalid_argument("no \"model\" object");
        if (type_of(*model) != "BPE") return unimplemented("model type " + type_of(*model) + " (need BPE)");
        if (!handler.saw_vocab) return invalid_argument("model.vocab is missing or not an object");
        if (out.vocab.empty()) return invalid_argument("model.vocab is empty");
        const Json* normalizer = member(root, "normalizer");
        if (normalizer && !normalizer->is_null()) return unimplemented("normalizer " + type_of(*normalizer));
        if (flag(*model, "byte_fallback", false)) return unimplemented("model.byte_fallback");
        RETURN_IF_ERROR(read_pre_tokenizer(root, out));
        RETURN_IF_ERROR(read_added_tokens(root, out));
    } catch (const std::exception& e) {  // nlohmann type errors, bad_alloc
        return invalid_argument(std::string("cannot read: ") + e.what());
    }
    return out;
}

}  // namespace gptoss::tokenizer
