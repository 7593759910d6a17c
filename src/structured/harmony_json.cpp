#include "structured/harmony_json.h"

#include <algorithm>

namespace gptoss::structured {

namespace {

class FinalJsonConstraint : public runtime::TokenConstraint {
public:
    FinalJsonConstraint(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> grammar,
                        bool raw)
        : so_(std::move(so)),
          grammar_(std::move(grammar)),
          matcher_(*grammar_),
          state_(raw ? State::kJson : State::kHeader) {}

    bool allowed_next(std::vector<uint8_t>* mask) override {
        if (state_ != State::kJson) return false;
        const TokenTrie& trie = so_->trie();
        const int64_t n = trie.fill_mask(matcher_, mask, &levels_);
        const int32_t ret = so_->ids().ret;
        if (ret >= 0 && static_cast<size_t>(ret) < mask->size()) {
            // The end once the document is complete; also when nothing else is left (a dead end the
            // grammar's bounds should never reach), rather than an empty mask.
            if (matcher_.accepting() || n == 0) (*mask)[static_cast<size_t>(ret)] = 1;
        }
        return true;
    }

    void accept(int32_t id) override {
        const HarmonyTokenIds& t = so_->ids();
        const std::vector<std::string>& bytes = so_->token_bytes();
        const bool ordinary =
            id >= 0 && static_cast<size_t>(id) < bytes.size() && !bytes[static_cast<size_t>(id)].empty();
        switch (state_) {
            case State::kHeader:
                if (id == t.channel) {
                    in_channel_ = true;
                    channel_.clear();
                } else if (id == t.message) {
                    const std::string name = channel_.substr(0, channel_.find_first_of(" \t\n<"));
                    state_ = in_channel_ && name == "final" ? State::kJson : State::kBody;
                    if (state_ == State::kJson) matcher_ = JsonMatcher(*grammar_);
                } else if (id == t.start) {
                    in_channel_ = false;
                    channel_.clear();
                } else if (in_channel_) {
                    if (ordinary) {
                        if (channel_.size() < 256) channel_ += bytes[static_cast<size_t>(id)];
                    } else {
                        channel_ += ' ';  // a special (<|constrain|>) ends the channel's name
                    }
                }
                break;
            case State::kBody:
                if (id == t.end || id == t.call || id == t.ret) state_ = State::kBetween;
                break;
            case State::kJson:
                if (ordinary) {
                    // Drawn under the mask, so it fits; a token from elsewhere (no mask asked) that
                    // does not leaves the matcher as it was.
                    matcher_.feed(bytes[static_cast<size_t>(id)]);
                } else if (id == t.end || id == t.ret || id == t.call) {
                    state_ = State::kBetween;
                }
                break;
            case State::kBetween:
                if (id == t.start) {
                    state_ = State::kHeader;
                    in_channel_ = false;
                    channel_.clear();
                }
                break;
        }
    }

private:
    enum class State { kHeader, kBody, kJson, kBetween };
    std::shared_ptr<const HarmonyStructuredOutputs> so_;
    std::shared_ptr<const JsonGrammar> grammar_;
    JsonMatcher matcher_;
    std::vector<JsonMatcher> levels_;
    State state_;  // kHeader: the prompt ends with "<|start|>assistant"; kJson: raw
    bool in_channel_ = false;
    std::string channel_;
};

class FinalJsonFactory : public runtime::TokenConstraintFactory {
public:
    FinalJsonFactory(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> grammar,
                     std::vector<int32_t> forced, bool raw)
        : so_(std::move(so)), grammar_(std::move(grammar)), forced_(std::move(forced)), raw_(raw) {}
    std::unique_ptr<runtime::TokenConstraint> start() const override {
        auto c = std::make_unique<FinalJsonConstraint>(so_, grammar_, raw_);
        for (int32_t id : forced_) c->accept(id);
        return c;
    }

private:
    std::shared_ptr<const HarmonyStructuredOutputs> so_;
    std::shared_ptr<const JsonGrammar> grammar_;
    std::vector<int32_t> forced_;
    bool raw_;
};

}  // namespace

HarmonyStructuredOutputs::HarmonyStructuredOutputs(std::vector<std::string> token_bytes, HarmonyTokenIds ids)
    : token_bytes_(std::move(token_bytes)), ids_(ids) {}

StatusOr<std::shared_ptr<HarmonyStructuredOutputs>> HarmonyStructuredOutputs::create(const tokenizer::BpeTokenizer& tok,
                                                                                     int model_vocab_size) {
    HarmonyTokenIds ids;
    const std::pair<int32_t*, const char*> names[] = {{&ids.start, "<|start|>"},     {&ids.channel, "<|channel|>"},
                                                      {&ids.message, "<|message|>"}, {&ids.end, "<|end|>"},
                                                      {&ids.ret, "<|return|>"},      {&ids.call, "<|call|>"}};
    for (const auto& [id, name] : names) {
        const std::optional<int32_t> found = tok.special_token_id(name);
        if (!found) return failed_precondition(std::string("structured outputs need the Harmony token ") + name);
        *id = *found;
    }
    const int n = std::max(model_vocab_size, tok.vocab_size());
    std::vector<std::string> bytes(static_cast<size_t>(n));
    for (int32_t id = 0; id < std::min(model_vocab_size, tok.vocab_size()); ++id) {
        if (tok.is_special(id)) continue;
        if (std::optional<std::string_view> b = tok.token_bytes(id)) bytes[static_cast<size_t>(id)] = std::string(*b);
    }
    bytes.resize(static_cast<size_t>(model_vocab_size));
    return std::make_shared<HarmonyStructuredOutputs>(std::move(bytes), ids);
}

const TokenTrie& HarmonyStructuredOutputs::trie() const {
    std::call_once(trie_once_, [&] { trie_ = std::make_unique<TokenTrie>(token_bytes_); });
    return *trie_;
}

std::shared_ptr<const runtime::TokenConstraintFactory> HarmonyStructuredOutputs::final_json(
    std::shared_ptr<const JsonGrammar> grammar, std::vector<int32_t> forced) const {
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::move(forced), false);
}

std::shared_ptr<const runtime::TokenConstraintFactory> HarmonyStructuredOutputs::raw_json(
    std::shared_ptr<const JsonGrammar> grammar) const {
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::vector<int32_t>{}, true);
}

}  // namespace gptoss::structured
