// One generation as each API presents it: a Session consumes the engine's token events and
// produces the API's output, as SSE events while streaming and as one JSON body at the end. The same
// code builds both, so a streamed result always equals the non-streamed one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/harmony_bridge.h"
#include "server/openai_json.h"
#include "server/token_engine.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::server {

// Finds stop strings in streamed text. push() returns the text that may be shown now: up to the
// first stop string once one matched (the rest is dropped), otherwise all but a held-back tail
// that could still begin a stop string.
class StopMatcher {
public:
    // include: the matched stop string is shown too (vLLM's include_stop_str_in_output).
    explicit StopMatcher(std::vector<std::string> stops, bool include = false)
        : stops_(std::move(stops)), include_(include) {}
    std::string push(std::string_view text);
    std::string flush();  // the held-back tail, at the end of generation
    bool matched() const { return matched_; }
    const std::string& matched_string() const { return matched_string_; }  // the stop string found ("" before)
    bool active() const { return !stops_.empty(); }
    // vLLM's min_tokens: while on, the text pushed may not end a match (a match found later must end past it).
    void hold(bool on) { hold_ = on; }

private:
    std::vector<std::string> stops_;
    bool include_ = false;
    std::string held_;
    bool matched_ = false;
    std::string matched_string_;
    bool hold_ = false;
    size_t total_ = 0;        // bytes pushed
    size_t protect_end_ = 0;  // no match may end at or before this byte (pushed while held)
};

// A token's bytes; o200k_harmony's reserved ids that the tokenizer file does not list by their Harmony name
// ("<|reserved_200013|>"), so that a logprobs entry never names a token "". "" for an id neither knows.
std::string token_text(const tokenizer::BpeTokenizer& tok, int32_t id);
// A special token: one the tokenizer file lists as added, or a reserved id it does not list that has a Harmony name
// (o200k_harmony's 200019-201087 where tokenizer.json stops at 200018; tiktoken counts them special).
bool is_special_token(const tokenizer::BpeTokenizer& tok, int32_t id);

struct SessionContext {
    const tokenizer::BpeTokenizer* tokenizer = nullptr;
    std::string model_id;
    bool reasoning_alias = false;  // RoutesOptions::reasoning_alias
};

class Session {
public:
    virtual ~Session() = default;
    // Events that open the stream.
    virtual void open(std::string* sse) = 0;
    // A queued (Responses background) request's engine work began: its events (response.in_progress).
    virtual void begin(std::string* sse) { (void)sse; }
    // One engine event. Returns true when generation should stop now (a stop string matched).
    virtual bool on_event(const EngineEvent& event, std::string* sse) = 0;
    // Generation is over (`reason`: the engine's, or kStop after a stop string): closing events.
    virtual void close(FinishReason reason, std::string* sse) = 0;
    // A Responses background run was cancelled: the output so far is closed as a cut answer's would be (the item
    // being written ends incomplete; a header never closed is recovered as reasoning, as at a length cut).
    virtual void cancel(std::string* sse) { (void)sse; }
    // The request failed after it started: the API's in-stream error.
    virtual void fail(const ApiError& error, std::string* sse) = 0;
    // The non-streaming body, after close() (or fail(): the Responses API's failed response).
    virtual Json body() const = 0;
    // The answer as it stands, under `status` (a Responses background run's queued, in_progress or cancelled:
    // the output so far); the other APIs have no such states and answer body().
    virtual Json snapshot(const char* status) const {
        (void)status;
        return body();
    }
    // Ends of stream after close()/fail(): chat and completions send "data: [DONE]".
    virtual bool sends_done() const { return true; }
};

// scores_prompt: this choice answers params.prompt_logprobs (the first of n).
std::unique_ptr<Session> make_chat_session(const SessionContext& ctx, const ChatPrompt& prompt,
                                           const ChatParams& params, int64_t prompt_tokens, bool scores_prompt = true);
std::unique_ptr<Session> make_responses_session(const SessionContext& ctx, const ChatPrompt& prompt,
                                                const ResponsesParams& params, int64_t prompt_tokens);
// prompt_ids: the prompt as the engine gets it (the echo's tokens; a text prompt echoes as given).
std::unique_ptr<Session> make_completion_session(const SessionContext& ctx, const CompletionParams& params,
                                                 const CompletionPrompt& prompt, std::vector<int32_t> prompt_ids);

}  // namespace gptoss::server
