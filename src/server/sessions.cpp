#include "server/sessions.h"

#include <algorithm>

namespace gptoss::server {

// ---- StopMatcher --------------------------------------------------------------------------------

std::string StopMatcher::push(std::string_view text) {
    if (matched_) return "";
    if (stops_.empty()) return std::string(text);
    held_ += text;
    total_ += text.size();
    if (hold_) protect_end_ = total_;
    const size_t base = total_ - held_.size();  // held_[0]'s byte in the whole text
    size_t first = std::string::npos, first_len = 0;
    const std::string* first_stop = nullptr;
    for (const std::string& s : stops_) {
        // A match at p ends at base + p + size: past protect_end_ from p = protect_end_ - base - size + 1.
        const size_t from = protect_end_ + 1 > base + s.size() ? protect_end_ + 1 - base - s.size() : 0;
        const size_t at = held_.find(s, from);
        if (at < first || (at == first && at != std::string::npos && s.size() > first_len)) {
            first = at;
            first_len = s.size();
            first_stop = &s;
        }
    }
    if (first != std::string::npos) {
        matched_ = true;
        matched_string_ = *first_stop;
        std::string out = held_.substr(0, first + (include_ ? first_len : 0));
        held_.clear();
        return out;
    }
    // Hold back the longest tail that is a proper prefix of a stop string. A stop string starts on
    // a character boundary, so the split never cuts a UTF-8 character.
    size_t keep = 0;
    for (const std::string& s : stops_) {
        for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
            if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    if (matched_) return "";
    std::string out = std::move(held_);
    held_.clear();
    return out;
}

std::string token_text(const tokenizer::BpeTokenizer& tok, int32_t id) {
    if (std::optional<std::string_view> b = tok.token_bytes(id)) return std::string(*b);
    return harmony::special_token_text(id).value_or(std::string());
}

bool is_special_token(const tokenizer::BpeTokenizer& tok, int32_t id) {
    return tok.is_special(id) || (!tok.token_bytes(id) && harmony::special_token_text(id).has_value());
}

namespace {

// A token as logprobs name it: its text (invalid UTF-8 replaced), or with vLLM's return_tokens_as_token_ids
// "token_id:<id>".
std::string token_label(const tokenizer::BpeTokenizer& tok, int32_t id, bool as_id) {
    return as_id ? "token_id:" + std::to_string(id) : lossy_utf8(token_text(tok, id));
}

// A generated token's logprob entry as chat.completions and the Responses API's output_text show it: {"token",
// "logprob", "bytes", "top_logprobs": [the top_k best, each {"token", "logprob", "bytes"}]}; `as_ids`: tokens as
// "token_id:<id>" and bytes those of that text (as vLLM's).
Json token_logprob_json(const tokenizer::BpeTokenizer& tok, const EngineEvent& e, int top_k, bool as_ids = false) {
    auto one = [&](int32_t id, float lp) {
        std::string bytes = as_ids ? token_label(tok, id, true) : token_text(tok, id);
        return Json{{"token", lossy_utf8(bytes)}, {"logprob", lp}, {"bytes", token_bytes_json(bytes)}};
    };
    Json entry = one(e.token_id, e.logprob);
    Json top = Json::array();
    for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int>(i) < top_k; ++i)
        top.push_back(one(e.top_logprobs[i].id, e.top_logprobs[i].logprob));
    entry["top_logprobs"] = std::move(top);
    return entry;
}

// vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...], entry i for prompt
// token i (from an engine event's prompt logprobs, entry i - 1): the prompt token and the k best; null where
// there is none (the first, or after an error).
Json vllm_prompt_logprobs(const tokenizer::BpeTokenizer& tok, const std::vector<int32_t>& prompt,
                          const std::vector<PromptLogprob>& plp, int k) {
    Json out = Json::array();
    for (size_t i = 0; i < prompt.size(); ++i) {
        if (i == 0 || i - 1 >= plp.size()) {
            out.push_back(nullptr);
            continue;
        }
        const PromptLogprob& p = plp[i - 1];
        Json d = Json::object();
        auto put = [&](int32_t id, float logprob, int rank) {
            d[std::to_string(id)] = {
                {"logprob", logprob}, {"rank", rank}, {"decoded_token", lossy_utf8(token_text(tok, id))}};
        };
        put(prompt[i], p.logprob, p.rank);
        for (size_t j = 0; j < p.top.size() && static_cast<int>(j) < k; ++j)
            put(p.top[j].id, p.top[j].logprob, static_cast<int>(j) + 1);
        out.push_back(std::move(d));
    }
    return out;
}

// The token that ended generation on one of the request's stop_token_ids: counted, not shown (vLLM's detokenizer
// drops it too).
bool is_request_stop(const EngineEvent& e, const std::vector<int32_t>& stop_token_ids) {
    return e.finish == FinishReason::kStop &&
           std::find(stop_token_ids.begin(), stop_token_ids.end(), e.token_id) != stop_token_ids.end();
}

// vLLM's stop_reason: the stop string that ended the text, else the request's stop_token_ids entry that ended
// generation, else null (a model's own end token, the length limit, ...).
Json stop_reason_json(const StopMatcher& stop, std::optional<int32_t> request_stop_id) {
    if (stop.matched()) return stop.matched_string();
    if (request_stop_id) return *request_stop_id;
    return nullptr;
}

const char* finish_reason_name(FinishReason r, bool hit_stop_string) {
    if (hit_stop_string) return "stop";
    switch (r) {
        case FinishReason::kLength: return "length";
        case FinishReason::kNone:
        case FinishReason::kStop:
        case FinishReason::kCancelled:
        case FinishReason::kError: return "stop";
    }
    return "stop";
}

// ---- chat.completions ---------------------------------------------------------------------------

class ChatSession final : public Session {
public:
    ChatSession(const SessionContext& ctx, const ChatPrompt& prompt, const ChatParams& params, int64_t prompt_tokens,
                bool scores_prompt)
        : ctx_(ctx),
          out_(*ctx.tokenizer, prompt),
          stop_(params.sampling.stop, params.sampling.include_stop_str),
          stop_token_ids_(params.sampling.stop_token_ids),
          stream_(params.stream),
          include_usage_(params.include_usage),
          continuous_usage_(params.continuous_usage),
          logprobs_(params.logprobs),
          tokens_as_ids_(params.tokens_as_ids),
          include_reasoning_(params.include_reasoning),
          top_logprobs_(params.top_logprobs),
          min_tokens_(params.sampling.min_tokens),
          prompt_logprobs_(scores_prompt ? params.prompt_logprobs : -1),
          return_token_ids_(params.return_token_ids),
          echo_continued_(prompt.continued && prompt.echo),
          shows_prompt_ids_(scores_prompt && params.return_token_ids),
          prompt_ids_(prompt_logprobs_ >= 0 || shows_prompt_ids_ ? prompt.ids : std::vector<int32_t>{}),
          id_(params.request_id ? "chatcmpl-" + *params.request_id : random_id("chatcmpl-")),
          created_(unix_time_now()) {
        usage_.prompt_tokens = prompt_tokens;
    }

    void open(std::string* sse) override {
        if (stream_) emit(sse, Json{{"role", "assistant"}, {"content", ""}}, nullptr, shows_prompt_ids_);
        // vLLM's echo of a continued message: its text so far opens the answer, as given (stop strings apply to
        // what is generated).
        if (echo_continued_) {
            for (const harmony::ChatDelta& d : out_.take_forced().deltas) {
                if (d.content) {
                    emit_content(*d.content, sse);
                } else if (include_reasoning_ || !d.reasoning_content || d.tool_call) {
                    emit(sse, chat_delta_json(d, ctx_.reasoning_alias), nullptr);
                }
            }
        }
    }

    bool on_event(const EngineEvent& e, std::string* sse) override {
        if (return_token_ids_ && e.token_id >= 0 && !stop_.matched()) {
            token_ids_.push_back(e.token_id);
            pending_token_ids_.push_back(e.token_id);
        }
        if (prompt_logprobs_ >= 0 && prompt_lp_json_.is_null()) {
            // The first event carries them (or nothing, after an error): the body's, and the first chunk's.
            prompt_lp_json_ = vllm_prompt_logprobs(*ctx_.tokenizer, prompt_ids_, e.prompt_logprobs, prompt_logprobs_);
            if (stream_) {
                Json chunk = base_chunk();
                chunk["choices"] = Json::array();
                chunk["prompt_logprobs"] = prompt_lp_json_;
                *sse += sse_event(chunk);
            }
        }
        if (e.token_id >= 0 && !stop_.matched()) {
            ++usage_.completion_tokens;
            stop_.hold(usage_.completion_tokens <= min_tokens_);  // (vLLM: checked once past min_tokens)
            if (!is_request_stop(e, stop_token_ids_))
                handle(out_.push(e.token_id), &e, sse);
            else
                request_stop_id_ = e.token_id;
        }
        // (On every token event: an answer a stop string ends sees no finish event.)
        if (e.cached_prompt_tokens > 0) usage_.cached_tokens = e.cached_prompt_tokens;
        if (e.finish != FinishReason::kNone) {
            hit_length_ = e.finish == FinishReason::kLength;
            usage_.cached_tokens = e.cached_prompt_tokens;
            handle(out_.finish(), nullptr, sse);
        }
        return stop_.matched();
    }

    void close(FinishReason reason, std::string* sse) override {
        if (reason == FinishReason::kLength) hit_length_ = true;
        usage_.reasoning_tokens = out_.reasoning_tokens();
        if (!stop_.matched()) {
            std::string tail = stop_.flush();
            if (!tail.empty()) emit_content(tail, sse);
        }
        result_ = out_.result(hit_length_ && !stop_.matched());
        if (stop_.matched() && result_.tool_calls.empty()) result_.finish_reason = "stop";
        // Content cut to nothing by a stop string is "" (there was an answer), not null (there was none).
        if (stop_.active())
            result_.content = has_content_      ? std::optional<std::string>(content_)
                              : result_.content ? std::optional<std::string>("")
                                                : std::nullopt;
        if (!stream_) return;
        Json choice = {{"index", 0}, {"delta", Json::object()}, {"logprobs", nullptr}};
        if (!pending_logprobs_.empty())
            choice["logprobs"] = {{"content", std::exchange(pending_logprobs_, {})}, {"refusal", nullptr}};
        choice["finish_reason"] = result_.finish_reason;
        choice["stop_reason"] = stop_reason_json(stop_, request_stop_id_);
        if (return_token_ids_) choice["token_ids"] = std::exchange(pending_token_ids_, {});
        Json chunk = base_chunk();
        chunk["choices"] = Json::array({choice});
        *sse += sse_event(chunk);
        if (include_usage_) {
            Json u = base_chunk();
            u["choices"] = Json::array();
            u["usage"] = chat_usage_json(usage_);
            *sse += sse_event(u);
        }
    }

    void fail(const ApiError& error, std::string* sse) override {
        if (stream_) *sse += sse_event(error_json(error));
    }

    Json body() const override {
        harmony::ChatCompletion shown = result_;
        if (!include_reasoning_) shown.reasoning_content.reset();
        Json choice = {
            {"index", 0}, {"message", chat_message_json(shown, ctx_.reasoning_alias)}, {"logprobs", nullptr}};
        if (logprobs_) choice["logprobs"] = {{"content", all_logprobs_}, {"refusal", nullptr}};
        choice["finish_reason"] = result_.finish_reason;
        choice["stop_reason"] = stop_reason_json(stop_, request_stop_id_);
        if (return_token_ids_) choice["token_ids"] = token_ids_;
        Json j = {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", ctx_.model_id}};
        j["choices"] = Json::array({choice});
        j["usage"] = chat_usage_json(usage_);
        j["system_fingerprint"] = nullptr;
        if (prompt_logprobs_ >= 0) j["prompt_logprobs"] = prompt_lp_json_;
        if (shows_prompt_ids_) j["prompt_token_ids"] = prompt_ids_;
        return j;
    }

private:
    Json base_chunk() const {
        Json j = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", ctx_.model_id}};
        j["system_fingerprint"] = nullptr;
        if (include_usage_) {
            Usage now = usage_;
            now.reasoning_tokens = out_.reasoning_tokens();
            j["usage"] = continuous_usage_ ? chat_usage_json(now) : Json(nullptr);
        }
        return j;
    }

    // One chunk for one delta; logprobs still waiting ride along with content, token ids (return_token_ids) with
    // any delta.
    void emit(std::string* sse, Json delta, const char* finish_reason, bool with_prompt_ids = false) {
        if (!stream_) return;
        Json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
        if (choice["delta"].contains("content") && !pending_logprobs_.empty()) {
            choice["logprobs"] = {{"content", std::exchange(pending_logprobs_, {})}, {"refusal", nullptr}};
        }
        choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
        if (return_token_ids_) choice["token_ids"] = std::exchange(pending_token_ids_, {});
        Json chunk = base_chunk();
        chunk["choices"] = Json::array({choice});
        if (with_prompt_ids) chunk["prompt_token_ids"] = prompt_ids_;
        *sse += sse_event(chunk);
    }

    void emit_content(const std::string& text, std::string* sse) {
        content_ += text;
        has_content_ = true;
        emit(sse, Json{{"content", text}}, nullptr);
    }

    void handle(const HarmonyOutput::Step& step, const EngineEvent* token, std::string* sse) {
        // A token with content: its logprob entry waits before the content is emitted, so that the chunk
        // carrying its text carries it too (it was added after, and rode with the next chunk). A token inside
        // the content whose bytes gave no text yet (a character split over tokens) has its entry too, riding
        // with the text that completes it.
        // (A special token has none: a terminator's step can carry content, the U+FFFD of a character it cut.)
        if (token && logprobs_ && !stop_.matched() && !is_special_token(*ctx_.tokenizer, token->token_id) &&
            (std::any_of(step.deltas.begin(), step.deltas.end(),
                         [](const harmony::ChatDelta& d) { return d.content.has_value(); }) ||
             (step.own_events == 0 && out_.in_content_body()))) {
            Json entry = logprob_entry(*token);
            all_logprobs_.push_back(entry);
            pending_logprobs_.push_back(std::move(entry));
        }
        for (const harmony::ChatDelta& d : step.deltas) {
            if (stop_.matched()) break;  // nothing after a stop string
            if (d.content) {
                std::string text = stop_.push(*d.content);
                if (!text.empty()) emit_content(text, sse);
            } else if (include_reasoning_ || !d.reasoning_content || d.tool_call) {
                emit(sse, chat_delta_json(d, ctx_.reasoning_alias), nullptr);
            }
        }
    }

    Json logprob_entry(const EngineEvent& e) const {
        return token_logprob_json(*ctx_.tokenizer, e, top_logprobs_, tokens_as_ids_);
    }

    const SessionContext ctx_;
    HarmonyOutput out_;
    StopMatcher stop_;
    const std::vector<int32_t> stop_token_ids_;
    std::optional<int32_t> request_stop_id_;  // the stop_token_ids entry that ended generation
    const bool stream_, include_usage_, continuous_usage_, logprobs_, tokens_as_ids_, include_reasoning_;
    const int top_logprobs_;
    const int min_tokens_;
    const int prompt_logprobs_;
    const bool return_token_ids_;
    const bool echo_continued_;              // continue_final_message with echo (ChatPrompt::echo)
    const bool shows_prompt_ids_;            // return_token_ids, in the first choice
    const std::vector<int32_t> prompt_ids_;  // with prompt_logprobs or shows_prompt_ids_
    Json prompt_lp_json_ = nullptr;          // vLLM's prompt_logprobs, from the first event
    const std::string id_;
    const int64_t created_;
    Usage usage_;
    std::vector<int32_t> token_ids_;          // return_token_ids: every token drawn
    std::vector<int32_t> pending_token_ids_;  // streaming: not yet sent with a chunk
    bool hit_length_ = false;
    std::string content_;  // user-visible content as emitted (after stop strings)
    bool has_content_ = false;
    Json all_logprobs_ = Json::array();
    Json pending_logprobs_ = Json::array();  // streaming: not yet sent with a content chunk
    harmony::ChatCompletion result_;
};

// ---- Responses ----------------------------------------------------------------------------------

class ResponsesSession final : public Session {
public:
    ResponsesSession(const SessionContext& ctx, const ChatPrompt& prompt, const ResponsesParams& params,
                     int64_t prompt_tokens)
        : ctx_(ctx),
          out_(*ctx.tokenizer, prompt),
          stream_(params.chat.stream),
          echo_(params.echo),
          stop_token_ids_(params.chat.sampling.stop_token_ids),
          encrypted_reasoning_(params.include_encrypted_reasoning),
          logprobs_(params.chat.logprobs),
          top_logprobs_(params.chat.top_logprobs),
          id_(params.chat.request_id ? *params.chat.request_id : random_id("resp_")),
          created_(unix_time_now()) {
        usage_.prompt_tokens = prompt_tokens;
    }

    bool sends_done() const override { return false; }

    void open(std::string* sse) override {
        // A background response was answered queued; its stream says so first (as OpenAI's: created and queued
        // with status queued, then in_progress once the engine works on it: begin()).
        if (echo_.value("background", false)) {
            emit(sse, "response.created", Json{{"response", response_json("queued", false)}});
            emit(sse, "response.queued", Json{{"response", response_json("queued", false)}});
            return;
        }
        emit(sse, "response.created", Json{{"response", response_json("in_progress", false)}});
        emit(sse, "response.in_progress", Json{{"response", response_json("in_progress", false)}});
    }

    void begin(std::string* sse) override {
        emit(sse, "response.in_progress", Json{{"response", response_json("in_progress", false)}});
    }

    bool on_event(const EngineEvent& e, std::string* sse) override {
        if (e.token_id >= 0) {
            ++usage_.completion_tokens;
            if (!is_request_stop(e, stop_token_ids_)) {
                // (a special token has no entry: a terminator's step can carry the U+FFFD of a character it cut)
                token_ = logprobs_ && !is_special_token(*ctx_.tokenizer, e.token_id) ? &e : nullptr;
                const HarmonyOutput::Step step = out_.push(e.token_id);
                for (const harmony::Event& h : step.events) handle(h, sse);
                // A message's token whose bytes gave no text yet (a character split over tokens): its entry
                // rides with the text that completes the character.
                if (token_ != nullptr && step.own_events == 0 && kind_ == Kind::kMessage)
                    pending_logprobs_.push_back(token_logprob_json(*ctx_.tokenizer, *token_, top_logprobs_));
                token_ = nullptr;
            }
        }
        // (On every token event: a cancelled answer, which sees no finish event, counts them too.)
        if (e.cached_prompt_tokens > 0) usage_.cached_tokens = e.cached_prompt_tokens;
        if (e.finish != FinishReason::kNone) {
            if (e.finish == FinishReason::kLength) hit_length_ = true;
            usage_.cached_tokens = e.cached_prompt_tokens;
            for (const harmony::Event& h : out_.finish().events) handle(h, sse);
        }
        return false;
    }

    void close(FinishReason reason, std::string* sse) override {
        if (reason == FinishReason::kLength) hit_length_ = true;
        usage_.reasoning_tokens = out_.reasoning_tokens();
        const char* status = hit_length_ ? "incomplete" : "completed";
        completed_at_ = unix_time_now();
        emit(sse, hit_length_ ? "response.incomplete" : "response.completed",
             Json{{"response", response_json(status, true)}});
        final_status_ = status;
    }

    void cancel(std::string* sse) override {
        for (const harmony::Event& h : out_.finish().events) handle(h, sse);
        usage_.reasoning_tokens = out_.reasoning_tokens();
    }

    void fail(const ApiError& error, std::string* sse) override {
        Json e = {{"code", error.code ? Json(*error.code) : Json(error.type)}, {"message", error.message}};
        e["param"] = error.param ? Json(*error.param) : Json(nullptr);
        emit(sse, "error", e);
        error_ = {{"code", "server_error"}, {"message", error.message}};
        final_status_ = "failed";
        emit(sse, "response.failed", Json{{"response", response_json("failed", true)}});
    }

    Json body() const override { return response_json(final_status_, true); }

    Json snapshot(const char* status) const override {
        Json r = response_json(status, true);
        const std::string s = status;
        // The item being generated is shown as it stands (a poll of a running background response showed only the
        // finished items).
        if (kind_ != Kind::kNone) r["output"].push_back(partial_item(s == "in_progress"));
        if (s == "queued" || s == "in_progress") r["usage"] = nullptr;
        return r;
    }

private:
    enum class Kind { kNone, kMessage, kReasoning, kFunctionCall };

    void emit(std::string* sse, const char* type, Json fields) {
        if (!stream_) return;
        Json j = {{"type", type}, {"sequence_number", sequence_number_++}};
        for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
        *sse += sse_event(j, type);
    }

    Json response_json(const char* status, bool with_output) const {
        Json r = {{"id", id_},           {"object", "response"}, {"created_at", created_},       {"status", status},
                  {"background", false}, {"error", nullptr},     {"incomplete_details", nullptr}};
        if (std::string(status) == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
        r["model"] = ctx_.model_id;
        r["output"] = with_output ? output_ : Json::array();
        for (auto it = echo_.begin(); it != echo_.end(); ++it) r[it.key()] = it.value();
        // (The reasoning count as it stands: a cancelled or failed answer was never closed.)
        Usage usage = usage_;
        usage.reasoning_tokens = out_.reasoning_tokens();
        r["usage"] = with_output ? responses_usage_json(usage) : Json(nullptr);
        if (std::string(status) == "failed") r["error"] = error_;
        // (The access program: none here, OpenAI's "standard fallback", which it writes as null.)
        r["access_programs"] = nullptr;
        if (std::string(status) == "completed") r["completed_at"] = completed_at_ != 0 ? completed_at_ : created_;
        return r;
    }

    // The item being generated as it stands: in progress while the response is; else as a cut item (end_item: a
    // message incomplete, a function call in progress, HARMONY.md §6.6).
    Json partial_item(bool running) const {
        Json item = item_;
        if (kind_ == Kind::kFunctionCall) {
            item["arguments"] = args_.text();
        } else {
            Json part = part_json();
            if (kind_ == Kind::kMessage) {
                Json lp = logprobs_so_far_;
                for (const Json& entry : pending_logprobs_) lp.push_back(entry);
                part["logprobs"] = std::move(lp);
            }
            item["content"] = Json::array({std::move(part)});
        }
        if (kind_ == Kind::kMessage) item["status"] = running ? "in_progress" : "incomplete";
        return item;
    }

    Json part_json() const {
        if (kind_ == Kind::kMessage) {
            return Json{{"type", "output_text"},
                        {"text", text_},
                        {"annotations", Json::array()},
                        {"logprobs", logprobs_so_far_}};
        }
        return Json{{"type", "reasoning_text"}, {"text", text_}};
    }

    void handle(const harmony::Event& h, std::string* sse) {
        switch (h.type) {
            case harmony::EventType::kMessageStart: start_item(h.header, sse); break;
            case harmony::EventType::kContentDelta:
                if (kind_ == Kind::kNone) break;
                text_ += h.delta;
                if (kind_ == Kind::kMessage) {
                    // The token whose text this is (its first delta: one entry a token), after those whose
                    // bytes began it.
                    Json lp = std::exchange(pending_logprobs_, Json::array());
                    for (const Json& entry : lp) logprobs_so_far_.push_back(entry);
                    if (token_ != nullptr) {
                        lp.push_back(token_logprob_json(*ctx_.tokenizer, *token_, top_logprobs_));
                        logprobs_so_far_.push_back(lp.back());
                        token_ = nullptr;
                    }
                    emit(sse, "response.output_text.delta",
                         Json{{"item_id", item_["id"]},
                              {"output_index", index_},
                              {"content_index", 0},
                              {"delta", h.delta},
                              {"logprobs", std::move(lp)}});
                } else if (kind_ == Kind::kReasoning) {
                    emit(sse, "response.reasoning_text.delta",
                         Json{{"item_id", item_["id"]},
                              {"output_index", index_},
                              {"content_index", 0},
                              {"delta", h.delta}});
                } else if (std::string d = args_.feed(h.delta); !d.empty()) {  // trimmed, as chat's
                    emit(sse, "response.function_call_arguments.delta",
                         Json{{"item_id", item_["id"]}, {"output_index", index_}, {"delta", std::move(d)}});
                }
                break;
            case harmony::EventType::kMessageEnd: end_item(h.terminator, sse); break;
        }
    }

    void start_item(const harmony::MessageHeader& header, std::string* sse) {
        text_.clear();
        args_ = harmony::TrimmedArguments{};
        logprobs_so_far_ = Json::array();
        index_ = static_cast<int64_t>(output_.size());
        switch (out_.route(header)) {
            case harmony::ChatRoute::kHidden: kind_ = Kind::kNone; return;
            case harmony::ChatRoute::kContent:
                kind_ = Kind::kMessage;
                item_ = {{"id", random_id("msg_")},
                         {"type", "message"},
                         {"status", "in_progress"},
                         {"role", "assistant"},
                         {"content", Json::array()}};
                break;
            case harmony::ChatRoute::kReasoning:
                kind_ = Kind::kReasoning;
                item_ = {{"id", random_id("rs_")},
                         {"type", "reasoning"},
                         {"summary", Json::array()},
                         {"content", Json::array()}};
                break;
            case harmony::ChatRoute::kToolCall:
                kind_ = Kind::kFunctionCall;
                item_ = {{"id", random_id("fc_")},
                         {"type", "function_call"},
                         {"status", "in_progress"},
                         {"call_id", random_id("call_")},
                         {"name", out_.function_name(header)},
                         {"arguments", ""}};
                break;
        }
        emit(sse, "response.output_item.added", Json{{"output_index", index_}, {"item", item_}});
        if (kind_ != Kind::kFunctionCall) {
            Json part = part_json();
            emit(sse, "response.content_part.added",
                 Json{{"item_id", item_["id"]}, {"output_index", index_}, {"content_index", 0}, {"part", part}});
        }
    }

    void end_item(harmony::Terminator terminator, std::string* sse) {
        if (kind_ == Kind::kNone) return;
        for (const Json& entry : std::exchange(pending_logprobs_, Json::array())) logprobs_so_far_.push_back(entry);
        const bool complete = terminator != harmony::Terminator::kNone;
        const Json id = item_["id"];
        if (kind_ == Kind::kFunctionCall) {
            if (complete && args_.text().empty()) {  // a whole call without arguments: "{}", as chat's
                args_.feed(harmony::kNoArguments);
                emit(sse, "response.function_call_arguments.delta",
                     Json{{"item_id", id}, {"output_index", index_}, {"delta", harmony::kNoArguments}});
            }
            item_["arguments"] = args_.text();
            item_["status"] = complete ? "completed" : "in_progress";  // HARMONY.md §6.6: a cut call stays in progress
            emit(sse, "response.function_call_arguments.done",
                 Json{{"item_id", id}, {"output_index", index_}, {"name", item_["name"]}, {"arguments", args_.text()}});
        } else {
            Json part = part_json();
            emit(sse, kind_ == Kind::kMessage ? "response.output_text.done" : "response.reasoning_text.done",
                 kind_ == Kind::kMessage
                     ? Json{{"item_id", id},
                            {"output_index", index_},
                            {"content_index", 0},
                            {"text", text_},
                            {"logprobs", logprobs_so_far_}}
                     : Json{{"item_id", id}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
            emit(sse, "response.content_part.done",
                 Json{{"item_id", id}, {"output_index", index_}, {"content_index", 0}, {"part", part}});
            item_["content"] = Json::array({part});
            if (kind_ == Kind::kMessage) item_["status"] = complete ? "completed" : "incomplete";
            if (kind_ == Kind::kReasoning && encrypted_reasoning_)
                item_["encrypted_content"] = reasoning_encrypted_content(text_);
        }
        emit(sse, "response.output_item.done", Json{{"output_index", index_}, {"item", item_}});
        output_.push_back(item_);
        kind_ = Kind::kNone;
    }

    const SessionContext ctx_;
    HarmonyOutput out_;
    const bool stream_;
    const Json echo_;
    const std::vector<int32_t> stop_token_ids_;
    const bool encrypted_reasoning_;  // include: ["reasoning.encrypted_content"]
    const bool logprobs_;             // output_text parts carry their tokens' logprobs
    const int top_logprobs_;
    const EngineEvent* token_ = nullptr;     // the token being pushed (logprobs only), until its first text delta
    Json logprobs_so_far_ = Json::array();   // the message item's entries
    Json pending_logprobs_ = Json::array();  // entries of tokens whose bytes gave no text yet
    const std::string id_;
    const int64_t created_;
    Usage usage_;
    bool hit_length_ = false;
    int64_t sequence_number_ = 0;
    Json output_ = Json::array();  // finished items
    Kind kind_ = Kind::kNone;      // the item being streamed
    Json item_;
    int64_t index_ = 0;
    std::string text_;
    harmony::TrimmedArguments args_;  // a function call's arguments, trimmed as chat's
    const char* final_status_ = "completed";
    int64_t completed_at_ = 0;  // close()'s time (Response.completed_at: "only present when the status is completed")
    Json error_;                // fail()'s, for the failed response
};

// ---- completions --------------------------------------------------------------------------------

class CompletionSession final : public Session {
public:
    CompletionSession(const SessionContext& ctx, const CompletionParams& params, const CompletionPrompt& prompt,
                      std::vector<int32_t> prompt_ids)
        : ctx_(ctx),
          stop_(params.sampling.stop, params.sampling.include_stop_str),
          stop_token_ids_(params.sampling.stop_token_ids),
          stream_(params.stream),
          include_usage_(params.include_usage),
          continuous_usage_(params.continuous_usage),
          logprobs_(params.logprobs),
          tokens_as_ids_(params.tokens_as_ids),
          echo_(params.echo),
          echo_only_(params.echo_only),
          prompt_logprobs_(params.prompt_logprobs),
          return_token_ids_(params.return_token_ids),
          skip_special_(params.skip_special_tokens),
          min_tokens_(params.sampling.min_tokens),
          prompt_ids_(std::move(prompt_ids)),
          id_(params.request_id ? "cmpl-" + *params.request_id : random_id("cmpl-")),
          created_(unix_time_now()) {
        usage_.prompt_tokens = static_cast<int64_t>(prompt_ids_.size());
        if (echo_) {
            if (prompt.text) {
                echo_text_ = *prompt.text;
            } else {
                std::string bytes;
                for (int32_t id : prompt_ids_) bytes += token_text(*ctx_.tokenizer, id);
                echo_text_ = lossy_utf8(bytes);
            }
        }
    }

    void open(std::string*) override {}

    bool on_event(const EngineEvent& e, std::string* sse) override {
        std::string text = take_prompt(e);
        Json lp = nullptr;
        if (echo_ && logprobs_ >= 0 && !echo_logprobs_sent_) {
            lp = all_logprobs_;  // the prompt's entries, the first chunk's
            echo_logprobs_sent_ = true;
        }
        // (On every token event: an answer a stop string ends sees no finish event.)
        if (e.cached_prompt_tokens > 0 || e.finish != FinishReason::kNone)
            usage_.cached_tokens = e.cached_prompt_tokens;
        if (e.token_id >= 0 && !stop_.matched() && !echo_only_) {
            ++usage_.completion_tokens;
            if (return_token_ids_) {
                token_ids_.push_back(e.token_id);
                pending_token_ids_.push_back(e.token_id);
            }
            stop_.hold(usage_.completion_tokens <= min_tokens_);  // (vLLM: checked once past min_tokens)
            // The stop id that ended generation is counted but not shown (as other servers do).
            if (is_request_stop(e, stop_token_ids_)) request_stop_id_ = e.token_id;
            const bool final_stop =
                (e.finish == FinishReason::kStop && is_generation_stop_id(e.token_id)) || request_stop_id_.has_value();
            const std::string bytes = token_text(*ctx_.tokenizer, e.token_id);
            // skip_special_tokens: a special token's text is not shown (its logprobs entry still names it).
            const bool hidden = skip_special_ && is_special_token(*ctx_.tokenizer, e.token_id);
            if (!final_stop && !hidden) pending_ += bytes;
            text += take_text(e.finish != FinishReason::kNone);
            if (logprobs_ >= 0) {
                Json one = add_logprobs(e, bytes, hidden ? std::string() : bytes);
                if (lp.is_null()) {
                    lp = std::move(one);
                } else {
                    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
                        lp[k].push_back(one[k][0]);
                }
            }
        } else if (e.finish != FinishReason::kNone) {
            text += take_text(true);
        }
        Json plp = nullptr;
        if (!prompt_lp_sent_ && !prompt_lp_json_.is_null()) {
            plp = prompt_lp_json_;
            prompt_lp_sent_ = true;
        }
        if (stream_ && (!text.empty() || !lp.is_null() || !plp.is_null() || !pending_token_ids_.empty() ||
                        (return_token_ids_ && !prompt_ids_sent_)))
            *sse += sse_event(chunk(text, std::move(lp), nullptr, std::move(plp)));
        return stop_.matched();
    }

    void close(FinishReason reason, std::string* sse) override {
        std::string tail = take_prompt(EngineEvent{});
        tail += take_text(true);
        finish_reason_ = echo_only_ ? "length" : finish_reason_name(reason, stop_.matched());
        if (!stream_) return;
        Json last = chunk(tail, nullptr, finish_reason_, nullptr);
        last["choices"][0]["stop_reason"] = stop_reason_json(stop_, request_stop_id_);
        *sse += sse_event(last);
        if (include_usage_) {
            Json u = base();
            u["choices"] = Json::array();
            u["usage"] = usage_json();
            *sse += sse_event(u);
        }
    }

    void fail(const ApiError& error, std::string* sse) override {
        if (stream_) *sse += sse_event(error_json(error));
    }

    Json body() const override {
        Json choice = {
            {"index", 0}, {"text", echo_text_ + text_}, {"logprobs", nullptr}, {"finish_reason", finish_reason_}};
        choice["stop_reason"] = stop_reason_json(stop_, request_stop_id_);
        // Every generated token's entry, a stop string's included (the text is cut, the tokens are not: they are in
        // token_ids and usage), as vLLM and the streamed answer give them.
        if (logprobs_ >= 0) choice["logprobs"] = all_logprobs_;
        if (prompt_logprobs_ >= 0) choice["prompt_logprobs"] = prompt_lp_json_;
        if (return_token_ids_) {
            choice["prompt_token_ids"] = prompt_ids_;
            choice["token_ids"] = token_ids_;
        }
        Json j = base();
        j["choices"] = Json::array({choice});
        j["usage"] = usage_json();
        return j;
    }

private:
    Json base() const {
        Json j = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", ctx_.model_id}};
        j["system_fingerprint"] = nullptr;
        return j;
    }
    Json usage_json() const {
        return Json{{"prompt_tokens", usage_.prompt_tokens},
                    {"completion_tokens", usage_.completion_tokens},
                    {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
                    {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens}}}};
    }
    // (Not const: it hands out the token ids waiting, and the prompt's ids once.)
    Json chunk(const std::string& text, Json logprobs, const char* finish_reason, Json prompt_logprobs) {
        Json j = base();
        Json choice = {{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}};
        choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
        if (!prompt_logprobs.is_null()) choice["prompt_logprobs"] = std::move(prompt_logprobs);
        if (return_token_ids_) {
            if (!prompt_ids_sent_) choice["prompt_token_ids"] = prompt_ids_;
            prompt_ids_sent_ = true;
            choice["token_ids"] = std::exchange(pending_token_ids_, {});
        }
        j["choices"] = Json::array({choice});
        if (include_usage_) j["usage"] = continuous_usage_ ? usage_json() : Json(nullptr);
        return j;
    }

    // Once, at the first event (or at the close when none came): the echoed prompt's text, its tokens'
    // logprobs entries (logprobs with echo) and vLLM's prompt_logprobs list, from the event's prompt
    // logprobs (entry i for prompt token i + 1; absent ones, after an error, are null).
    std::string take_prompt(const EngineEvent& e) {
        if (prompt_taken_) return {};
        prompt_taken_ = true;
        const std::vector<PromptLogprob>& plp = e.prompt_logprobs;
        auto entry = [&](size_t i) -> const PromptLogprob* {
            return i >= 1 && i - 1 < plp.size() ? &plp[i - 1] : nullptr;
        };
        if (echo_ && logprobs_ >= 0) {
            for (size_t i = 0; i < prompt_ids_.size(); ++i) {
                const std::string tok = token_label(*ctx_.tokenizer, prompt_ids_[i], tokens_as_ids_);
                const PromptLogprob* p = entry(i);
                Json top = nullptr;
                if (p != nullptr) {
                    top = Json::object();
                    for (size_t k = 0; k < p->top.size() && static_cast<int>(k) < logprobs_; ++k)
                        top[token_label(*ctx_.tokenizer, p->top[k].id, tokens_as_ids_)] = p->top[k].logprob;
                    if (!top.contains(tok)) top[tok] = p->logprob;  // the prompt token is always among them
                }
                all_logprobs_["tokens"].push_back(tok);
                all_logprobs_["token_logprobs"].push_back(p != nullptr ? Json(p->logprob) : Json(nullptr));
                all_logprobs_["top_logprobs"].push_back(std::move(top));
                all_logprobs_["text_offset"].push_back(text_offset_);
                advance_offset(token_text(*ctx_.tokenizer, prompt_ids_[i]));
            }
            // The echoed prompt is decoded on its own: bytes of a character it does not finish are its U+FFFD.
            const std::string cut = harmony::decode_utf8_lossy(offset_pending_, /*final_chunk=*/true);
            text_offset_ += std::count_if(cut.begin(), cut.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
        }
        if (prompt_logprobs_ >= 0)
            prompt_lp_json_ = vllm_prompt_logprobs(*ctx_.tokenizer, prompt_ids_, plp, prompt_logprobs_);
        return echo_text_;
    }

    // A token's bytes into the running offset: the characters (code points, as OpenAI's and vLLM's offsets count)
    // of the text decoded so far, a character split over tokens counted once it is complete (where it began).
    void advance_offset(const std::string& bytes) {
        offset_pending_ += bytes;
        const std::string done = harmony::decode_utf8_lossy(offset_pending_, /*final_chunk=*/false);
        text_offset_ += std::count_if(done.begin(), done.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
    }

    // Where a token with these bytes starts in the text: where the character split over the tokens before it
    // began if it continues that character, else after the U+FFFD those bytes become (an ill-formed sequence).
    int64_t offset_of(const std::string& bytes) const {
        if (offset_pending_.empty() || bytes.empty()) return text_offset_;
        std::string joined = offset_pending_ + bytes[0];
        const std::string next = harmony::decode_utf8_lossy(joined, /*final_chunk=*/false);
        if (next.empty() || next == offset_pending_ + bytes[0]) return text_offset_;  // the character goes on
        std::string left = offset_pending_;
        const std::string cut = harmony::decode_utf8_lossy(left, /*final_chunk=*/true);
        return text_offset_ + std::count_if(cut.begin(), cut.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
    }

    // Complete UTF-8 text decoded so far, through the stop matcher.
    std::string take_text(bool final_chunk) {
        std::string decoded = harmony::decode_utf8_lossy(pending_, final_chunk);
        std::string text = stop_.push(decoded);
        if (final_chunk) text += stop_.flush();
        text_ += text;
        return text;
    }

    // Logprobs of one token, in the legacy completions layout (also appended to the totals).
    // `shown`: the token's bytes in the text (what its offset advances by).
    Json add_logprobs(const EngineEvent& e, const std::string& bytes, const std::string& shown) {
        const std::string tok = tokens_as_ids_ ? token_label(*ctx_.tokenizer, e.token_id, true) : lossy_utf8(bytes);
        Json top = Json::object();
        for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int>(i) < logprobs_; ++i) {
            top[token_label(*ctx_.tokenizer, e.top_logprobs[i].id, tokens_as_ids_)] = e.top_logprobs[i].logprob;
        }
        // The sampled token is always among them (OpenAI: "up to logprobs + 1 elements", as vLLM
        // does), so logprobs 0 gives the sampled token alone rather than an empty object.
        if (!top.contains(tok)) top[tok] = e.logprob;
        Json one = {{"tokens", Json::array({tok})},
                    {"token_logprobs", Json::array({e.logprob})},
                    {"top_logprobs", Json::array({top})},
                    {"text_offset", Json::array({offset_of(shown)})}};
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
            all_logprobs_[k].push_back(one[k][0]);
        }
        advance_offset(shown);
        return one;
    }

    const SessionContext ctx_;
    StopMatcher stop_;
    const std::vector<int32_t> stop_token_ids_;
    std::optional<int32_t> request_stop_id_;  // the stop_token_ids entry that ended generation
    const bool stream_, include_usage_, continuous_usage_;
    const int logprobs_;
    const bool tokens_as_ids_;
    const bool echo_;
    const bool echo_only_;  // max_tokens 0: the generated token is dropped
    const int prompt_logprobs_;
    const bool return_token_ids_;
    const bool skip_special_;  // skip_special_tokens: their text is left out
    const int min_tokens_;
    const std::vector<int32_t> prompt_ids_;
    const std::string id_;
    const int64_t created_;
    Usage usage_;
    std::vector<int32_t> token_ids_;          // return_token_ids: every token drawn (the echo_only token not)
    std::vector<int32_t> pending_token_ids_;  // streaming: not yet sent with a chunk
    bool prompt_ids_sent_ = false;            // streaming: the first chunk carried prompt_token_ids
    std::string echo_text_;                   // with echo: the prompt, before the completion
    bool prompt_taken_ = false, echo_logprobs_sent_ = false, prompt_lp_sent_ = false;
    Json prompt_lp_json_ = nullptr;  // vLLM's prompt_logprobs, once taken
    std::string pending_;            // generated bytes not yet decoded (an incomplete UTF-8 character)
    std::string text_;               // the completion (after the echoed prompt)
    int64_t text_offset_ = 0;        // characters of the text so far (advance_offset)
    std::string offset_pending_;     // its bytes not yet a whole character
    Json all_logprobs_ = {{"tokens", Json::array()},
                          {"token_logprobs", Json::array()},
                          {"top_logprobs", Json::array()},
                          {"text_offset", Json::array()}};
    const char* finish_reason_ = "stop";
};

}  // namespace

std::unique_ptr<Session> make_chat_session(const SessionContext& ctx, const ChatPrompt& prompt,
                                           const ChatParams& params, int64_t prompt_tokens, bool scores_prompt) {
    return std::make_unique<ChatSession>(ctx, prompt, params, prompt_tokens, scores_prompt);
}

std::unique_ptr<Session> make_responses_session(const SessionContext& ctx, const ChatPrompt& prompt,
                                                const ResponsesParams& params, int64_t prompt_tokens) {
    return std::make_unique<ResponsesSession>(ctx, prompt, params, prompt_tokens);
}

std::unique_ptr<Session> make_completion_session(const SessionContext& ctx, const CompletionParams& params,
                                                 const CompletionPrompt& prompt, std::vector<int32_t> prompt_ids) {
    return std::make_unique<CompletionSession>(ctx, params, prompt, std::move(prompt_ids));
}

}  // namespace gptoss::server
