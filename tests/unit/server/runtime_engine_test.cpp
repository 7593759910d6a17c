// The server over the real runtime::Engine (through RuntimeEngineAdapter), with a scripted model
// runner instead of weights: warm-up gating, usage, logprobs, the context limit, and a client that
// disconnects mid-stream freeing its KV blocks in the real block allocator.
#include <regex>
#include <thread>

#include "model/gpt_oss_config.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "server/runtime_engine.h"
#include "server_test_util.h"

namespace gptoss::server::testing {
namespace {

constexpr int kBlockSize = 16;
constexpr int kBlocks = 64;  // context: 64 blocks of 16 tokens = 1024 tokens
constexpr int32_t kToken = 1234;

// Always predicts kToken (10 against -30 for every other id), optionally slowly.
class ScriptedRunner final : public runtime::ModelRunner {
public:
    explicit ScriptedRunner(std::chrono::microseconds step_time) : step_time_(step_time) {
        config_ = *model::GptOssConfig::preset("tiny");
    }
    const model::GptOssConfig& config() const override { return config_; }
    runtime::KvGeometry kv_geometry(int block_size) const override {
        runtime::KvGeometry g;
        g.block_size = block_size;
        g.sliding_window = config_.sliding_window;
        g.bytes_per_block_full = 1024;
        g.bytes_per_block_sliding = 1024;
        return g;
    }
    size_t free_memory_bytes() const override { return size_t{1} << 30; }
    Status allocate_kv_cache(int, runtime::KvBlockCounts) override { return ok_status(); }
    Status forward(const runtime::Batch& batch, std::vector<float>* logits) override {
        std::this_thread::sleep_for(step_time_);
        for (const runtime::BatchSequence& s : batch.seqs) {
            for (int r = 0; r < s.num_logits(); ++r) {
                const size_t at = logits->size();
                logits->resize(at + static_cast<size_t>(config_.vocab_size), -30.0f);
                (*logits)[at + kToken] = 10.0f;
            }
        }
        return ok_status();
    }

private:
    model::GptOssConfig config_;
    std::chrono::microseconds step_time_;
};

class RuntimeServer {
public:
    explicit RuntimeServer(std::chrono::microseconds step_time, std::chrono::milliseconds load_delay = {})
        : queue(engine, metrics), routes(queue, *test_tokenizer(), options()), http(routes, metrics, http_options()) {
        EXPECT_TRUE(http.start().ok());
        engine.start([step_time, load_delay]() -> StatusOr<std::unique_ptr<runtime::Engine>> {
            std::this_thread::sleep_for(load_delay);
            runtime::EngineConfig c;
            c.block_size = kBlockSize;
            c.kv_budget = runtime::KvBudget{.num_blocks_full = kBlocks, .num_blocks_sliding = kBlocks};
            c.scheduler.max_num_seqs = 32;
            return runtime::Engine::create(std::make_unique<ScriptedRunner>(step_time), c);
        });
    }
    ~RuntimeServer() {
        queue.shutdown();
        http.stop();
    }
    bool wait_ready() {
        for (int i = 0; i < 2000 && !engine.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return engine.ready();
    }
    bool wait_idle() {
        for (int i = 0; i < 2000; ++i) {
            EngineStats s = engine.stats();
            if (s.running_sequences == 0 && s.waiting_requests == 0 && s.kv_blocks_in_use == 0 &&
                queue.in_flight() == 0) {
                return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }
    httplib::Result post(const std::string& path, const std::string& body) {
        httplib::Client c("127.0.0.1", http.port());
        c.set_read_timeout(60, 0);
        return c.Post(path.c_str(), body, "application/json");
    }

    RuntimeEngineAdapter engine;
    ServerMetrics metrics;
    RequestQueue queue;
    OpenAiRoutes routes;
    HttpServer http;

private:
    static RoutesOptions options() {
        RoutesOptions o;
        o.model_id = "scripted";
        o.harmony.current_date = "2026-01-01";
        o.keepalive_interval = std::chrono::milliseconds(200);
        return o;
    }
    static HttpServerOptions http_options() {
        HttpServerOptions o;
        o.port = 0;
        o.threads = 64;
        return o;
    }
};

class RuntimeEngineTest : public ::testing::Test {
protected:
    void SetUp() override { REQUIRE_TOKENIZER(); }
};

TEST_F(RuntimeEngineTest, HealthWaitsForLoadAndWarmUp) {
    RuntimeServer s(std::chrono::microseconds(0), std::chrono::milliseconds(300));
    httplib::Client c("127.0.0.1", s.http.port());
    auto early = c.Get("/health");
    ASSERT_TRUE(early);
    EXPECT_EQ(early->status, 503);
    expect_error(s.post("/v1/completions", R"({"prompt":[1,2],"max_tokens":2})"), 503);
    ASSERT_TRUE(s.wait_ready());
    auto later = c.Get("/health");
    ASSERT_TRUE(later);
    EXPECT_EQ(later->status, 200);
    EXPECT_EQ(s.engine.max_context_tokens(), kBlocks * kBlockSize);
    EXPECT_EQ(s.engine.vocab_size(), 201088);
}

TEST_F(RuntimeEngineTest, CompletionsAndChatThroughTheRealEngine) {
    RuntimeServer s(std::chrono::microseconds(0));
    ASSERT_TRUE(s.wait_ready());
    auto r = s.post("/v1/completions", R"({"prompt":"Hello","max_tokens":5,"logprobs":2})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    Json j = parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 5);
    EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 5u);
    EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
    EXPECT_EQ(j["choices"][0]["text"], *test_tokenizer()->decode(std::vector<int32_t>(5, kToken)));

    // A logit_bias id outside the vocabulary (the engine's check): 400 naming the field.
    Json bias = expect_error(
        s.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logit_bias":{"300000":1}})"),
        400);
    EXPECT_EQ(bias["param"], "logit_bias");

    auto chat = s.post("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,
                           "stream_options":{"include_usage":true}})");
    ASSERT_TRUE(chat);
    std::vector<SseEvent> ev = parse_sse(chat->body);
    ASSERT_GE(ev.size(), 3u);
    EXPECT_EQ(ev.back().data, "[DONE]");
    EXPECT_EQ(parse(ev[ev.size() - 2].data)["usage"]["completion_tokens"], 4);

    // The same 40-token prompt again: its full blocks come from the prefix cache.
    std::string ids;
    for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(100 + i);
    const std::string same = R"({"prompt":[)" + ids + R"(],"max_tokens":2})";
    ASSERT_TRUE(s.post("/v1/completions", same));
    auto again = s.post("/v1/completions", same);
    ASSERT_TRUE(again);
    EXPECT_GE(parse(again->body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 32) << again->body;

    // Past the context (1024 tokens): 400 before anything reaches the engine.
    Json e = expect_error(s.post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":1022})"), 400);
    EXPECT_EQ(e["code"], "context_length_exceeded");
    EXPECT_TRUE(s.wait_idle());
}

// Structured outputs through the real engine and sampler: the scripted model prefers one token the
// schema never allows, so every draw is decided by the mask (ties to the lowest id). The completion is
// held to the schema from its first token and ends with <|return|> (a stop) once it is complete.
TEST_F(RuntimeEngineTest, GuidedJsonHoldsTheCompletion) {
    RuntimeServer s(std::chrono::microseconds(0));
    ASSERT_TRUE(s.wait_ready());
    for (const char* schema :
         {R"({"enum":["no","yes"]})", R"({"type":"array","items":{"type":"boolean"},"maxItems":2})",
          R"({"type":"object","properties":{"a":{"type":"null"}},"required":["a"]})"}) {
        auto r = s.post("/v1/completions",
                        std::string(R"({"prompt":"Answer:","max_tokens":100,"guided_json":)") + schema + "}");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const Json j = parse(r->body);
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
        const std::string text = j["choices"][0]["text"];
        Json doc;
        ASSERT_NO_THROW(doc = Json::parse(text)) << text;
        if (doc.is_string()) {
            EXPECT_TRUE(doc == "no" || doc == "yes") << text;
        }
        if (doc.is_array()) {
            EXPECT_LE(doc.size(), 2u);
            for (const Json& b : doc) EXPECT_TRUE(b.is_boolean()) << text;
        }
        if (doc.is_object()) {
            EXPECT_TRUE(doc.size() == 1 && doc["a"].is_null()) << text;
        }
        EXPECT_FALSE(doc.is_number()) << text;
    }
    // guided_choice / guided_regex: the runner always prefers another token; the output still matches.
    for (const char* c : {R"("guided_choice":["no","yes","maybe"])", R"J("guided_regex":"[0-9]{2,4}(px|em)")J",
                          R"J("guided_grammar":"root ::= \"(\" num (\",\" num){0,3} \")\"\nnum ::= [0-9]{1,3}")J"}) {
        auto r = s.post("/v1/completions", std::string(R"({"prompt":"Answer:","max_tokens":50,)") + c + "}");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const Json j = parse(r->body);
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
        const std::string text = j["choices"][0]["text"];
        if (std::string(c).find("choice") != std::string::npos) {
            EXPECT_TRUE(text == "no" || text == "yes" || text == "maybe") << text;
        } else if (std::string(c).find("grammar") != std::string::npos) {
            EXPECT_TRUE(std::regex_match(text, std::regex("\\([0-9]{1,3}(,[0-9]{1,3}){0,3}\\)"))) << text;
        } else {
            EXPECT_TRUE(std::regex_match(text, std::regex("[0-9]{2,4}(px|em)"))) << text;
        }
    }
    EXPECT_TRUE(s.wait_idle());
}

// A structural tag through the real engine and sampler: the tag must begin at once and end the output
// (at_least_one, stop_after_first), so the mask decides every draw: the begin, a JSON document of the schema,
// the end, then <|return|>.
TEST_F(RuntimeEngineTest, StructuralTagHoldsTheCompletion) {
    RuntimeServer s(std::chrono::microseconds(0));
    ASSERT_TRUE(s.wait_ready());
    const Json format = {
        {"type", "triggered_tags"},
        {"triggers", {"<call="}},
        {"tags",
         {{{"type", "tag"},
           {"begin", "<call=sum>"},
           {"content",
            {{"type", "json_schema"},
             {"json_schema",
              {{"type", "object"},
               {"properties", {{"xs", {{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 3}}}}},
               {"required", {"xs"}}}}}},
           {"end", "</call>"}}}},
        {"at_least_one", true},
        {"stop_after_first", true}};
    const Json tag = {{"type", "structural_tag"}, {"format", format}};
    // (vLLM's structured_outputs takes the tag as a string.) Greedy and without whitespace between JSON tokens, so that
    // the output is one (the lowest allowed id each step) and finishes well inside max_tokens.
    const Json body = {{"prompt", "Answer:"},
                       {"max_tokens", 200},
                       {"temperature", 0},
                       {"structured_outputs", {{"structural_tag", tag.dump()}, {"disable_any_whitespace", true}}}};
    auto r = s.post("/v1/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json j = parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
    const std::string text = j["choices"][0]["text"];
    ASSERT_EQ(text.rfind("<call=sum>", 0), 0u) << text;
    ASSERT_GE(text.size(), std::string("<call=sum></call>").size()) << text;
    ASSERT_EQ(text.substr(text.size() - 7), "</call>") << text;
    Json doc;
    ASSERT_NO_THROW(doc = Json::parse(text.substr(10, text.size() - 17))) << text;
    ASSERT_TRUE(doc.is_object() && doc.size() == 1 && doc["xs"].is_array()) << text;
    EXPECT_LE(doc["xs"].size(), 3u);
    // Integers (of any length: past 64 bits nlohmann reads them as doubles): no fraction or exponent in the array.
    for (const Json& x : doc["xs"]) EXPECT_TRUE(x.is_number()) << text;
    const size_t open = text.find('['), close = text.rfind(']');
    ASSERT_TRUE(open != std::string::npos && close != std::string::npos) << text;
    EXPECT_EQ(text.substr(open, close - open).find_first_of(".eE"), std::string::npos) << text;
    EXPECT_TRUE(s.wait_idle());
}

// vLLM's allowed_token_ids through the real engine: every drawn token is one of them (named by id through
// return_tokens_as_token_ids), alone or within a guided_choice's mask; an id outside the vocabulary is a 400.
TEST_F(RuntimeEngineTest, AllowedTokenIdsHoldEveryDraw) {
    RuntimeServer s(std::chrono::microseconds(0));
    ASSERT_TRUE(s.wait_ready());
    const std::vector<int32_t> allowed = {300, 301, 302, 777};
    const Json body = {{"prompt", "Answer:"},
                       {"max_tokens", 12},
                       {"temperature", 1},
                       {"seed", 3},
                       {"allowed_token_ids", allowed},
                       {"logprobs", 0},
                       {"return_tokens_as_token_ids", true}};
    auto r = s.post("/v1/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json tokens = parse(r->body)["choices"][0]["logprobs"]["tokens"];
    ASSERT_EQ(tokens.size(), 12u) << r->body;
    for (const Json& t : tokens) {
        const int32_t id = std::stoi(t.get<std::string>().substr(9));
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), id), allowed.end()) << t;
    }
    // Within a choice's mask: only the allowed ids that continue a choice.
    const std::vector<int32_t> yes = test_tokenizer()->encode_ordinary("yes");
    const std::vector<int32_t> no = test_tokenizer()->encode_ordinary("no");
    ASSERT_EQ(yes.size(), 1u);
    ASSERT_EQ(no.size(), 1u);
    const Json choice = {{"prompt", "Answer:"},
                         {"max_tokens", 4},
                         {"guided_choice", {"yes", "no"}},
                         {"allowed_token_ids", {no[0], 200002}}};
    auto c = s.post("/v1/completions", choice.dump());
    ASSERT_TRUE(c);
    ASSERT_EQ(c->status, 200) << c->body;
    EXPECT_EQ(parse(c->body)["choices"][0]["text"], "no") << c->body;
    auto bad = s.post("/v1/completions", R"({"prompt":"x","allowed_token_ids":[1,999999999]})");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << bad->body;
    EXPECT_EQ(parse(bad->body)["error"]["param"], "allowed_token_ids[1]") << bad->body;
    EXPECT_TRUE(s.wait_idle());
}

// lm-evaluation-harness's loglikelihood request through the real engine: every prompt token's logprob under
// the runner's rows (kToken: log of ~1, any other: -40 at rank 2), the prompt computed whole even when its
// prefix is cached, and vLLM's prompt_logprobs alongside.
TEST_F(RuntimeEngineTest, EchoedPromptLogprobsThroughTheRealEngine) {
    RuntimeServer s(std::chrono::microseconds(0));
    ASSERT_TRUE(s.wait_ready());
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back(i % 3 == 0 ? kToken : 100 + i);
    const std::string body = R"({"prompt":)" + Json(prompt).dump() +
                             R"(,"max_tokens":1,"logprobs":1,"echo":true,"temperature":0,"prompt_logprobs":0})";
    for (int round = 0; round < 2; ++round) {  // the second finds the prompt's blocks cached
        auto r = s.post("/v1/completions", body);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const Json j = parse(r->body);
        EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << round;
        const Json& c = j["choices"][0];
        const Json& lp = c["logprobs"];
        ASSERT_EQ(lp["token_logprobs"].size(), prompt.size() + 1);
        EXPECT_TRUE(lp["token_logprobs"][0].is_null());
        const Json& plp = c["prompt_logprobs"];
        ASSERT_EQ(plp.size(), prompt.size());
        EXPECT_TRUE(plp[0].is_null());
        const std::string best = token_text(*test_tokenizer(), kToken);
        for (size_t i = 1; i <= prompt.size(); ++i) {
            const bool hit = i == prompt.size() || prompt[i] == kToken;  // the last entry is the completion's
            const float got = lp["token_logprobs"][i].get<float>();
            EXPECT_NEAR(got, hit ? 0.0f : -40.0f, 1e-4f) << i;
            EXPECT_NEAR(lp["top_logprobs"][i][best].get<float>(), 0.0f, 1e-4f) << i;
            if (i == prompt.size()) continue;
            const Json& self = plp[i][std::to_string(prompt[i])];
            EXPECT_EQ(self["rank"], hit ? 1 : 2) << i;
            EXPECT_EQ(self["logprob"], lp["token_logprobs"][i]) << i;
        }
    }
    EXPECT_TRUE(s.wait_idle());
}

TEST_F(RuntimeEngineTest, DisconnectFreesKvBlocks) {
    RuntimeServer s(std::chrono::milliseconds(2));
    ASSERT_TRUE(s.wait_ready());
    httplib::Client c("127.0.0.1", s.http.port());
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt":"Once upon a time","max_tokens":900,"stream":true})";
    int chunks = 0;
    int64_t blocks_while_running = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
        if (++chunks == 5) blocks_while_running = s.engine.stats().kv_blocks_in_use;
        return chunks < 5;
    };
    c.send(req);
    EXPECT_GT(blocks_while_running, 0);
    EXPECT_TRUE(s.wait_idle()) << "running=" << s.engine.stats().running_sequences
                               << " kv=" << s.engine.stats().kv_blocks_in_use;
}

}  // namespace
}  // namespace gptoss::server::testing
