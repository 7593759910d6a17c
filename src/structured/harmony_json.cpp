#include "structured/harmony_json.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "harmony/harmony_chat.h"
#include "harmony/harmony_parser.h"

namespace gptoss::structured {

namespace {

class FinalJsonConstraint : public runtime::TokenConstraint {
public:
    FinalJsonConstraint(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> final,
                        std::shared_ptr<const RegexGrammar> regex, std::shared_ptr<const EbnfGrammar> ebnf,
                        std::shared_ptr<const StructuralTag> tag, std::shared_ptr<const ToolGrammars> tools,
                        std::optional<std::vector<std::string>> declared, bool raw)
        : so_(std::move(so)),
          final_(std::move(final)),
          regex_(std::move(regex)),
          ebnf_(std::move(ebnf)),
          tag_(std::move(tag)),
          tools_(std::move(tools)),
          raw_(raw) {
        mapping_.declared_functions = std::move(declared);
        if (raw) begin_final();
    }

    bool allowed_next(std::vector<uint8_t>* mask) override {
        if (state_ == State::kDone) {  // a raw completion past its end (ignore_eos): the end again, nothing else
            std::fill(mask->begin(), mask->end(), uint8_t{0});
            if (end_id_ >= 0 && static_cast<size_t>(end_id_) < mask->size()) (*mask)[static_cast<size_t>(end_id_)] = 1;
            return true;
        }
        if (name_state_ >= 0) {  // a forced call's function name (tool_choice "required"): a declared one
            so_->trie().fill_mask(*names_, name_state_, mask);
            if (names_->accepting(name_state_)) {
                for (int32_t id : {so_->ids().message, so_->ids().constrain})
                    if (id >= 0 && static_cast<size_t>(id) < mask->size()) (*mask)[static_cast<size_t>(id)] = 1;
            }
            return true;
        }
        if (ctype_state_ >= 0) {  // after the forced call's <|constrain|>: "json", then <|message|>
            so_->trie().fill_mask(*json_ctype(), ctype_state_, mask);
            const int32_t message = so_->ids().message;
            if (json_ctype()->accepting(ctype_state_) && message >= 0 && static_cast<size_t>(message) < mask->size())
                (*mask)[static_cast<size_t>(message)] = 1;
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
        const bool terminator = id == t.end || id == t.call || id == t.ret;
        if (name_state_ >= 0) {
            // The name ends at its first special (<|constrain|> or <|message|>); a token drawn without the mask that
            // leaves the names gives the phase up. After <|constrain|> the content type is held to "json" (it had
            // been free: a random model wrote words until max_tokens, and a "required" call never came).
            const bool to_ctype = id == t.constrain && names_->accepting(name_state_);
            const int next = ordinary ? names_->feed(name_state_, bytes[static_cast<size_t>(id)]) : -1;
            name_state_ = next;
            if (to_ctype) ctype_state_ = json_ctype()->start();
        } else if (ctype_state_ >= 0) {
            ctype_state_ = ordinary ? json_ctype()->feed(ctype_state_, bytes[static_cast<size_t>(id)]) : -1;
        }
        switch (state_) {
            case State::kHeader: header_token(id, ordinary); break;
            case State::kBody:
                if (terminator) {
                    state_ = State::kBetween;
                } else if (id == t.start) {  // X3: the message closed, a new header
                    open_header(std::nullopt);
                } else if (id == t.channel) {  // X3: closed, and this <|channel|> begins the next header
                    open_header(harmony::Role::kAssistant);
                    header_token(id, false);
                } else if (id == t.end_of_text) {
                    state_ = State::kBetween;
                }
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
                    open_header(std::nullopt);
                } else if (terminator || id == t.end_of_text) {  // X1: a stray terminator is ignored
                } else if (!ordinary && id != t.channel && id != t.message && id != t.constrain) {
                    // other specials are ignored
                } else if (ordinary && std::all_of(bytes[static_cast<size_t>(id)].begin(),
                                                   bytes[static_cast<size_t>(id)].end(), [](char c) {
                                                       return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
                                                              c == '\f' || c == '\v';
                                                   })) {
                    // whitespace between messages is ignored
                } else {  // X2: an implicit <|start|>assistant, this token its header's first
                    open_header(harmony::Role::kAssistant);
                    header_token(id, ordinary);
                }
                break;
        }
    }

    // After the forced "…to=functions." of tool_choice "required" (HARMONY.md §7: the recipient must be one of the
    // allowed functions): the name is held to `names` (each declared name, optionally followed by one space), then
    // <|constrain|> or <|message|> goes on as the header would. Unheld, a model could write a name no tool has, or
    // never end it (a random model wrote 200 tokens of name and no call).
    void begin_names(std::shared_ptr<const RegexGrammar> names) {
        static constexpr std::string_view kPrefix = "functions.";
        if (state_ != State::kHeader || header_.size() < kPrefix.size() ||
            header_.compare(header_.size() - kPrefix.size(), kPrefix.size(), kPrefix) != 0)
            return;
        names_ = std::move(names);
        name_state_ = names_->start();
    }

private:
    // kDone: a raw completion past its end. (After <|return|>, <|call|> or <|endoftext|> the parser reads nothing
    // more, X14; generation has stopped there but for ignore_eos, and what follows is still followed as if after
    // <|end|>: held where a final message would be, which the answer then drops.)
    enum class State { kHeader, kBody, kJson, kBetween, kDone };
    static constexpr size_t kMaxHeaderTokens = harmony::ParserOptions{}.max_header_tokens;  // X13

    // A header begins; `role`: set when the parser presets it (the prompt's "assistant", X2, X3 at <|channel|>).
    void open_header(std::optional<harmony::Role> role) {
        state_ = State::kHeader;
        header_.clear();
        header_tokens_ = 0;
        header_role_ = role;
    }
    // One token of a header, as the robust parser takes it: <|message|> opens the body; a terminator ends the header
    // without a message (X10); <|start|> restarts it (X4); specials other than <|channel|> and <|constrain|> are
    // ignored; past 256 tokens the header is given up (X13).
    void header_token(int32_t id, bool ordinary) {
        const HarmonyTokenIds& t = so_->ids();
        if (id == t.message) {
            open_body();
        } else if (id == t.end || id == t.call || id == t.ret || id == t.end_of_text) {
            // X10 (or a stray terminator): no message; the parser then expects <|start|>
            state_ = State::kBetween;
            header_.clear();
        } else if (id == t.start) {  // X4
            open_header(std::nullopt);
        } else if (ordinary || id == t.channel || id == t.constrain) {
            // the header's text as the parser spells it (its specials by name)
            header_ += ordinary ? so_->token_bytes()[static_cast<size_t>(id)]
                                : std::string(id == t.channel ? "<|channel|>" : "<|constrain|>");
            if (++header_tokens_ > kMaxHeaderTokens) {
                state_ = State::kBetween;
                header_.clear();
            }
        }
    }

    // At a header's <|message|>: the header read as the server's robust parser reads it (harmony::parse_header_robust)
    // and routed as the answer routes it (harmony::chat_route): a call to a function with a grammar is held to its
    // parameters and ends with <|call|>; a final message (content) to the response format, ended by <|return|>;
    // anything else is free.
    void open_body() {
        std::vector<std::string> warnings;
        const harmony::HeaderParseResult r =
            harmony::parse_header_robust(harmony::decode_utf8_lossy(header_, /*final_chunk=*/true), header_role_, true,
                                         mapping_.declared_functions, warnings);
        state_ = State::kBody;
        const harmony::ChatRoute route = harmony::chat_route(r.header, mapping_);
        if (route == harmony::ChatRoute::kToolCall) {
            if (const std::optional<std::string> name = harmony::function_name(*r.header.recipient, mapping_);
                name && tools_) {
                if (auto it = tools_->find(*name); it != tools_->end()) begin(it->second.get(), so_->ids().call);
            }
        } else if (route == harmony::ChatRoute::kContent && r.header.channel == std::optional<std::string>("final") &&
                   (final_ || regex_ || ebnf_ || tag_)) {
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
    std::string header_;            // the current header's bytes, its specials spelled as the parser spells them
    size_t header_tokens_ = 0;      // the tokens it has taken (the prompt's "assistant" not counted)
    std::optional<harmony::Role> header_role_ = harmony::Role::kAssistant;  // preset by the prompt
    harmony::ChatMappingOptions mapping_;        // the declared functions, as the answer's mapping has them
    std::shared_ptr<const RegexGrammar> names_;  // begin_names
    int name_state_ = -1;                        // >= 0: the name being written follows names_ (its DFA state)
    int ctype_state_ = -1;                       // >= 0: the forced call's content type after <|constrain|>
    // The content type a forced call may give after <|constrain|>: "json" (HARMONY.md §6.3).
    static const std::shared_ptr<const RegexGrammar>& json_ctype() {
        static const std::shared_ptr<const RegexGrammar> g = *RegexGrammar::choice({"json"});
        return g;
    }
};

class FinalJsonFactory : public runtime::TokenConstraintFactory {
public:
    FinalJsonFactory(std::shared_ptr<const HarmonyStructuredOutputs> so, std::shared_ptr<const JsonGrammar> final,
                     std::shared_ptr<const RegexGrammar> regex, std::shared_ptr<const EbnfGrammar> ebnf,
                     std::shared_ptr<const StructuralTag> tag, std::shared_ptr<const ToolGrammars> tools,
                     std::vector<int32_t> forced, std::optional<std::vector<std::string>> declared, bool raw)
        : so_(std::move(so)),
          final_(std::move(final)),
          regex_(std::move(regex)),
          ebnf_(std::move(ebnf)),
          tag_(std::move(tag)),
          tools_(std::move(tools)),
          forced_(std::move(forced)),
          declared_(std::move(declared)),
          raw_(raw) {
        if (!forced_.empty() && declared_ && !declared_->empty()) {
            std::vector<std::string> options;
            for (const std::string& n : *declared_) options.insert(options.end(), {n, n + " "});
            if (auto g = RegexGrammar::choice(options); g.ok()) names_ = *g;
        }
    }
    std::unique_ptr<runtime::TokenConstraint> start() const override {
        auto c = std::make_unique<FinalJsonConstraint>(so_, final_, regex_, ebnf_, tag_, tools_, declared_, raw_);
        for (int32_t id : forced_) c->accept(id);
        if (names_) c->begin_names(names_);
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
    std::optional<std::vector<std::string>> declared_;
    bool raw_;
    std::shared_ptr<const RegexGrammar> names_;  // the declared names, for a forced "…to=functions." (begin_names)
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
    ids.constrain = tok.special_token_id("<|constrain|>").value_or(-1);
    ids.end_of_text = tok.special_token_id("<|endoftext|>").value_or(-1);
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
    std::shared_ptr<const StructuralTag> tag, std::optional<std::vector<std::string>> declared_functions) const {
    if (grammar) regex.reset(), ebnf.reset(), tag.reset();
    if (tag) regex.reset(), ebnf.reset();
    if (ebnf) regex.reset();
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::move(regex), std::move(ebnf),
                                              std::move(tag), std::move(tools), std::move(forced),
                                              std::move(declared_functions), false);
}

std::shared_ptr<const runtime::TokenConstraintFactory> HarmonyStructuredOutputs::raw_json(
    std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const RegexGrammar> regex,
    std::shared_ptr<const EbnfGrammar> ebnf, std::shared_ptr<const StructuralTag> tag) const {
    if (grammar) regex.reset(), ebnf.reset(), tag.reset();
    if (tag) regex.reset(), ebnf.reset();
    if (ebnf) regex.reset();
    return std::make_shared<FinalJsonFactory>(shared_from_this(), std::move(grammar), std::move(regex), std::move(ebnf),
                                              std::move(tag), nullptr, std::vector<int32_t>{}, std::nullopt, true);
}

}  // namespace gptoss::structured
