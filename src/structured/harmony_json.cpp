#include "structured/harmony_json.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace gptoss::structured {

namespace {

class FinalJsonConstraint : public runtime::TokenConstraint {
public:
    FinalJsonConstraint(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> final,
                        std::shared_ptr<const RegexGrammar> regex, std::shared_ptr<const EbnfGrammar> ebnf,
                        std::shared_ptr<const StructuralTag> tag, std::shared_ptr<const ToolGrammars> tools, bool raw)
        : so_(std::move(so)),
          final_(std::move(final)),
          regex_(std::move(regex)),
          ebnf_(std::move(ebnf)),
          tag_(std::move(tag)),
          tools_(std::move(tools)),
          raw_(raw) {
        if (raw) begin_final();
    }

    bool allowed_next(std::vector<uint8_t>* mask) override {
        if (state_ == State::kDone) {  // a raw completion past its end (ignore_eos): the end again, nothing else
            std::fill(mask->begin(), mask->end(), uint8_t{0});
            if (end_id_ >= 0 && static_cast<size_t>(end_id_) < mask->size()) (*mask)[static_cast<size_t>(end_id_)] = 1;
            return true;
        }
        if (state_ != State::kJson) return false;
        const TokenTrie& trie = so_->trie();
        const bool regex = rstate_ >= 0;
        const int64_t n = regex       ? trie.fill_mask(*regex_, rstate_, mask)
                          : ematcher_ ? trie.fill_mask(*ematcher_, mask)
                          : tmatcher_ ? trie.fill_mask(*tmatcher_, mask, &tlevels_)
                                      : trie.fill_mask(*matcher_, mask, &levels_);
        if (end_id_ >= 0 && static_cast<size_t>(end_id_) < mask->size()) {
            // The end once the document is complete; also when nothing else is left (a dead end the
            // grammar's bounds should never reach), rather than an empty mask.
            const bool done = regex       ? regex_->accepting(rstate_)
                              : ematcher_ ? ematcher_->accepting()
                              : tmatcher_ ? tmatcher_->accepting()
                                          : matcher_->accepting();
            if (done || n == 0) (*mask)[static_cast<size_t>(end_id_)] = 1;
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
                if (id == t.message) {
                    open_body();
                } else if (id == t.start) {
                    header_.clear();
                } else if (header_.size() < 1024) {
                    if (ordinary)
                        header_ += bytes[static_cast<size_t>(id)];
                    else
                        header_ += id == t.channel ? '\x01' : ' ';  // <|channel|>; other specials end a word
                }
                break;
            case State::kBody:
                if (id == t.end || id == t.call || id == t.ret) state_ = State::kBetween;
                break;
            case State::kJson:
                if (ordinary) {
                    // Drawn under the mask, so it fits; a token from elsewhere (no mask asked) that
                    // does not leaves the matcher as it was.
                    if (rstate_ >= 0) {
                        const int next = regex_->feed(rstate_, bytes[static_cast<size_t>(id)]);
                        if (next >= 0) rstate_ = next;
                    } else if (ematcher_) {
                        ematcher_->feed(bytes[static_cast<size_t>(id)]);
                    } else if (tmatcher_) {
                        tmatcher_->feed(bytes[static_cast<size_t>(id)]);
                    } else {
                        matcher_->feed(bytes[static_cast<size_t>(id)]);
                    }
                } else if (id == t.end || id == t.ret || id == t.call) {
                    // A raw completion is the constrained text and nothing after it: with ignore_eos the request
                    // goes on, and drew free text after the end (session 57); it may only repeat the end now.
                    state_ = raw_ ? State::kDone : State::kBetween;
                }
                break;
            case State::kDone: break;
            case State::kBetween:
                if (id == t.start) {
                    state_ = State::kHeader;
                    header_.clear();
                }
                break;
        }
    }

private:
    enum class State { kHeader, kBody, kJson, kBetween, kDone };

    // The word of `header_` after `from` (skipping spaces), up to a space, '<' or <|channel|>.
    std::string word_after(size_t from) const {
        while (from < header_.size() && (header_[from] == ' ' || header_[from] == '\t' || header_[from] == '\n'))
            ++from;
        const size_t to = header_.find_first_of(" \t\n<\x01", from);
        return header_.substr(from, to == std::string::npos ? std::string::npos : to - from);
    }

    // At a header's <|message|>: a call to a strict function (recipient "functions.NAME", in the role slot
    // or after the channel) is held to its parameters and ends with <|call|>; a final message to the
    // response format and ends with <|return|>; anything else is free.
    void open_body() {
        // As the server's robust header parser reads it: the channel's word case-folded and without
        // trailing punctuation ("Final", "final."); the recipient after "to=", else a word naming
        // "functions.NAME" anywhere in the header; a declared function may be named bare.
        const size_t ch = header_.find('\x01');
        std::string channel = ch == std::string::npos ? std::string() : word_after(ch + 1);
        for (char& c : channel) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        while (!channel.empty() && !std::isalnum(static_cast<unsigned char>(channel.back()))) channel.pop_back();
        std::string recipient;
        if (const size_t to = header_.find("to="); to != std::string::npos) {
            recipient = word_after(to + 3);
        } else if (const size_t fn = header_.find("functions."); fn != std::string::npos) {
            recipient = word_after(fn);
        }
        state_ = State::kBody;
        if (!recipient.empty()) {
            const std::string name = recipient.rfind("functions.", 0) == 0 ? recipient.substr(10) : recipient;
            if (tools_) {
                if (auto it = tools_->find(name); it != tools_->end()) begin(it->second.get(), so_->ids().call);
            }
        } else if ((final_ || regex_ || ebnf_ || tag_) && channel == "final") {
            begin_final();
        }
        header_.clear();
    }

    void begin(const JsonGrammar* g, int32_t end_id) {
        matcher_.emplace(*g);
        ematcher_.reset();
        tmatcher_.reset();
        levels_.clear();
        rstate_ = -1;
        end_id_ = end_id;
        state_ = State::kJson;
    }
    // The final message (or a raw completion): the JSON grammar, the structural tag, the EBNF grammar or the
    // regex, ended by <|return|>.
    void begin_final() {
        if (final_) {
            begin(final_.get(), so_->ids().ret);
            return;
        }
        if (tag_) {
            tmatcher_.emplace(*tag_);
            rstate_ = -1;
            end_id_ = so_->ids().ret;
            state_ = State::kJson;
            return;
        }
        if (ebnf_) {
            ematcher_.emplace(*ebnf_);
            rstate_ = -1;
            end_id_ = so_->ids().ret;
            state_ = State::kJson;
            return;
        }
        rstate_ = regex_->start();
        end_id_ = so_->ids().ret;
        state_ = State::kJson;
    }

    std::shared_ptr<const HarmonyStructuredOutputs> so_;
    std::shared_ptr<const JsonGrammar> final_;
    std::shared_ptr<const RegexGrammar> regex_;  // the final message's pattern (when final_ is null)
    std::shared_ptr<const EbnfGrammar> ebnf_;    // or its grammar (when final_ is null)
    std::shared_ptr<const StructuralTag> tag_;   // or its structural tag (when final_ is null)
    std::shared_ptr<const ToolGrammars> tools_;
    bool raw_ = false;  // a raw completion: the whole output is the constrained text
    std::optional<JsonMatcher> matcher_;
    std::optional<EbnfMatcher> ematcher_;           // the body follows ebnf_'s
    std::optional<StructuralTagMatcher> tmatcher_;  // or tag_'s
    std::vector<StructuralTagMatcher> tlevels_;
    int rstate_ = -1;  // >= 0: the body follows regex_ (its DFA state)
    std::vector<JsonMatcher> levels_;
    int32_t end_id_ = -1;
    State state_ = State::kHeader;  // the prompt ends with "<|start|>assistant"
    std::string header_;            // the current header's text, <|channel|> as \x01
};

class FinalJsonFactory : public runtime::TokenConstraintFactory {
public:
    FinalJsonFactory(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> final,
                     std::shared_ptr<const RegexGrammar> regex, std::shared_ptr<const EbnfGrammar> ebnf,
                     std::shared_ptr<const StructuralTag> tag, std::shared_ptr<const ToolGrammars> tools,
                     std::vector<int32_t> forced, bool raw)
        : so_(std::move(so)),
          final_(std::move(final)),
          regex_(std::move(regex)),
          ebnf_(std::move(ebnf)),
          tag_(std::move(tag)),
          tools_(std::move(tools)),
          forced_(std::move(forced)),
          raw_(raw) {}
    std::unique_ptr<runtime::TokenConstraint> start() const override {
        auto c = std::make_unique<FinalJsonConstraint>(so_, final_, regex_, ebnf_, tag_, tools_, raw_);
        for (int32_t id : forced_) c->accept(id);
        return c;
    }

private:
    std::shared_ptr<const HarmonyStructuredOutputs> so_;
    std::shared_ptr<const JsonGrammar> final_;
    std::shared_ptr<const RegexGrammar> regex_;
    std::shared_ptr<const EbnfGrammar> ebnf_;
    std::shared_ptr<const StructuralTag> tag_;
    std::shared_ptr<const ToolGrammars> tools_;
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
    std::shared_ptr<const JsonGrammar> grammar, std::vector<int32_t> forced, std::shared_ptr<const ToolGrammars> tools,
    std::shared_ptr<const RegexGrammar> regex, std::shared_ptr<const EbnfGrammar> ebnf,
    std::shared_ptr<const StructuralTag> tag) const {
    if (grammar) regex.reset(), ebnf.reset(), tag.reset();
    if (tag) regex.reset(), ebnf.reset();
    if (ebnf) regex.reset();
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::move(regex), std::move(ebnf),
                                              std::move(tag), std::move(tools), std::move(forced), false);
}

std::shared_ptr<const runtime::TokenConstraintFactory> HarmonyStructuredOutputs::raw_json(
    std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const RegexGrammar> regex,
    std::shared_ptr<const EbnfGrammar> ebnf, std::shared_ptr<const StructuralTag> tag) const {
    if (grammar) regex.reset(), ebnf.reset(), tag.reset();
    if (tag) regex.reset(), ebnf.reset();
    if (ebnf) regex.reset();
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::move(regex), std::move(ebnf),
                                              std::move(tag), nullptr, std::vector<int32_t>{}, true);
}

}  // namespace gptoss::structured
