// Every route over real HTTP (FakeEngine behind, httplib client on an ephemeral loopback port):
// shapes, bad input with its status and error object, SSE framing, disconnect -> cancel, a slow
// reader not stalling others, many concurrent streams.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <thread>

#include "core/version.h"
#include "server_test_util.h"

namespace gptoss::server::testing {
namespace {

const char* kChat = R"({"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":8})";

// The model answers "Hello" on the final channel.
FakeScript hello_script() {
    return [](const EngineRequest&) { return harmony_ids("<|channel|>final<|message|>Hello<|return|>"); };
}

// Everything a raw connection receives until the server closes it or `timeout_s` passes.
std::string read_all(int fd) {
    std::string got;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return got;
}

class HttpServerTest : public ::testing::Test {
protected:
    void SetUp() override { REQUIRE_TOKENIZER(); }
};

TEST_F(HttpServerTest, HealthModelsMetrics) {
    TestServerOptions o = default_test_options();
    o.engine.ready = false;
    TestServer s(o);
    expect_error(s.get("/health"), 503);
    expect_error(s.post("/v1/chat/completions", kChat), 503);  // not before warm-up
    auto warming = s.get("/v1/models");                        // listed, its context not known yet
    ASSERT_TRUE(warming);
    EXPECT_EQ(warming->status, 200);
    EXPECT_TRUE(parse(warming->body)["data"][0]["max_model_len"].is_null()) << warming->body;
    s.engine.set_ready(true);
    auto h = s.get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    auto v = s.get("/version");  // vLLM's route: {"version": ...}
    ASSERT_TRUE(v);
    EXPECT_EQ(v->status, 200);
    EXPECT_EQ(parse(v->body)["version"], gptoss::kVersion) << v->body;
    expect_error(s.post("/version", "{}"), 405);

    auto m = s.get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    Json models = parse(m->body);
    EXPECT_EQ(models["object"], "list");
    EXPECT_EQ(models["data"][0]["id"], "test-model");
    EXPECT_EQ(models["data"][0]["object"], "model");
    EXPECT_EQ(models["data"][0]["max_model_len"], 4096);  // the fake engine's context
    auto one = s.get("/v1/models/test-model");
    ASSERT_TRUE(one);
    EXPECT_EQ(parse(one->body)["id"], "test-model");
    expect_error(s.get("/v1/models/nope"), 404);

    // A request is counted once its response is written, so the counts may trail the client a
    // little, the first /health's as much as the last one's (each is counted by whichever server
    // thread wrote it): wait for both.
    auto metrics = s.get("/metrics");
    const auto counted = [&] {
        return metrics && metrics->body.find("endpoint=\"/health\",status=\"200\"} 1") != std::string::npos &&
               metrics->body.find("endpoint=\"/health\",status=\"503\"} 1") != std::string::npos;
    };
    for (int i = 0; i < 200 && !counted(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        metrics = s.get("/metrics");
    }
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->status, 200);
    EXPECT_NE(metrics->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    for (const char* name : {"gptoss_http_requests_total{endpoint=\"/health\",status=\"503\"} 1",
                             "gptoss_http_requests_total{endpoint=\"/health\",status=\"200\"} 1",
                             "gptoss_prompt_tokens_total", "gptoss_generation_tokens_total",
                             "gptoss_time_to_first_token_seconds_bucket", "gptoss_inter_token_latency_seconds_bucket",
                             "gptoss_queue_depth 0", "gptoss_running_sequences 0", "gptoss_kv_blocks_in_use 0"}) {
        EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
    }
}

// vLLM's /tokenize and /detokenize: a prompt encodes as /v1/completions encodes it, messages render to exactly the
// ids a chat completion feeds the engine (without "<|start|>assistant" when add_generation_prompt is false);
// detokenize inverts; bad input is a 400; neither needs the engine warmed up.
TEST_F(HttpServerTest, TokenizeAndDetokenize) {
    TestServer s;
    s.engine.set_script(hello_script());
    auto t = s.post("/tokenize", R"({"prompt":"Hello world<|end|>","return_token_strs":true})");
    ASSERT_TRUE(t);
    ASSERT_EQ(t->status, 200) << t->body;
    Json tj = parse(t->body);
    EXPECT_EQ(tj["tokens"].get<std::vector<int32_t>>(), harmony_ids("Hello world<|end|>"));
    EXPECT_EQ(tj["count"], tj["tokens"].size());
    EXPECT_EQ(tj["max_model_len"], 4096);
    ASSERT_EQ(tj["token_strs"].size(), tj["tokens"].size());
    EXPECT_EQ(tj["token_strs"][0], "Hello");
    EXPECT_EQ(tj["token_strs"].back(), "<|end|>");
    EXPECT_TRUE(parse(s.post("/tokenize", R"({"prompt":"x"})")->body)["token_strs"].is_null());
    // o200k_harmony's reserved ids the tokenizer file does not list are special tokens too (tiktoken's), so what
    // /detokenize names them comes back as the same ids.
    Json reserved = parse(s.post("/tokenize", R"({"prompt":"<|reserved_200500|>a<|reserved_201087|>"})")->body);
    ASSERT_EQ(reserved["tokens"].size(), 3u) << reserved.dump();
    EXPECT_EQ(reserved["tokens"][0], 200500);
    EXPECT_EQ(reserved["tokens"][2], 201087);

    auto d = s.post("/detokenize", Json{{"tokens", tj["tokens"]}}.dump());
    ASSERT_TRUE(d);
    ASSERT_EQ(d->status, 200) << d->body;
    EXPECT_EQ(parse(d->body)["prompt"], "Hello world<|end|>");
    // An id the tokenizer file does not list but o200k_harmony reserves is named as the model's output names it.
    EXPECT_EQ(parse(s.post("/detokenize", R"({"tokens":[200013]})")->body)["prompt"], "<|reserved_200013|>");

    // Messages: the same ids the chat completion gives the engine.
    const std::string messages =
        R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])";
    auto c = s.post("/v1/chat/completions", "{" + messages + "}");
    ASSERT_TRUE(c);
    ASSERT_EQ(c->status, 200) << c->body;
    const std::vector<int32_t> fed = s.engine.last_request().prompt;
    auto tm = s.post("/tokenize", "{" + messages + "}");
    ASSERT_TRUE(tm);
    ASSERT_EQ(tm->status, 200) << tm->body;
    EXPECT_EQ(parse(tm->body)["tokens"].get<std::vector<int32_t>>(), fed);
    auto conv = s.post("/tokenize", "{" + messages + R"(,"add_generation_prompt":false})");
    ASSERT_TRUE(conv);
    const std::vector<int32_t> conv_ids = parse(conv->body)["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> gen_prompt = harmony_ids("<|start|>assistant");
    ASSERT_EQ(conv_ids.size() + gen_prompt.size(), fed.size()) << conv->body;
    EXPECT_TRUE(std::equal(conv_ids.begin(), conv_ids.end(), fed.begin()));
    EXPECT_TRUE(std::equal(gen_prompt.begin(), gen_prompt.end(), fed.end() - static_cast<long>(gen_prompt.size())));

    for (const char* bad : {R"({})", R"({"prompt":"a","messages":[{"role":"user","content":"b"}]})",
                            R"({"prompt":[1,2]})", R"({"prompt":"a","return_token_strs":"yes"})", R"({"messages":[]})",
                            R"([1])", "{", R"({"prompt":"a","add_generation_prompt":1})"})
        expect_error(s.post("/tokenize", bad), 400);
    for (const char* bad : {R"({})", R"({"tokens":"1 2"})", R"({"tokens":[-1]})", R"({"tokens":[1.5]})",
                            R"({"tokens":[201088]})", R"({"tokens":[1,"a"]})"})
        expect_error(s.post("/detokenize", bad), 400);
    expect_error(s.get("/tokenize"), 405);

    TestServerOptions o = default_test_options();
    o.engine.ready = false;
    TestServer warming(o);
    auto w = warming.post("/tokenize", R"({"prompt":"Hello"})");
    ASSERT_TRUE(w);
    EXPECT_EQ(w->status, 200) << w->body;
    EXPECT_TRUE(parse(w->body)["max_model_len"].is_null());
}

TEST_F(HttpServerTest, ChatCompletionShapeAndUsage) {
    TestServer s;
    s.engine.set_script([](const EngineRequest&) {
        return harmony_ids(
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
            "Hello there<|return|>");
    });
    auto r = s.post("/v1/chat/completions", R"({"model":"x","messages":[{"role":"user","content":"hi"}]})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    Json j = parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["model"], "test-model");
    EXPECT_TRUE(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["index"], 0);
    EXPECT_EQ(c["message"]["role"], "assistant");
    EXPECT_EQ(c["message"]["content"], "Hello there");
    EXPECT_EQ(c["message"]["reasoning_content"], "Think.");
    EXPECT_EQ(c["finish_reason"], "stop");
    const size_t generated = harmony_ids(
                                 "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>"
                                 "final<|message|>Hello there<|return|>")
                                 .size();
    EXPECT_EQ(j["usage"]["completion_tokens"], generated);
    EXPECT_EQ(j["usage"]["prompt_tokens"], s.engine.last_request().prompt.size());
    EXPECT_EQ(j["usage"]["total_tokens"],
              j["usage"]["prompt_tokens"].get<int64_t>() + j["usage"]["completion_tokens"].get<int64_t>());
    const int64_t reasoning = j["usage"]["completion_tokens_details"]["reasoning_tokens"];
    EXPECT_GT(reasoning, 0);
    EXPECT_LT(reasoning, static_cast<int64_t>(generated));
    // The engine got the Harmony stop ids and a max_tokens filling the context.
    EngineRequest req = s.engine.last_request();
    EXPECT_EQ(req.stop_ids, (std::vector<int32_t>{200002, 200012, 199999}));
    EXPECT_EQ(req.max_tokens, 4096 - static_cast<int>(req.prompt.size()));
    EXPECT_EQ(req.prompt.back(), 173781);  // ... <|start|>assistant
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, ChatStreamingSse) {
    TestServer s;
    s.engine.set_script([](const EngineRequest&) {
        return harmony_ids(
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
            "Hello there<|return|>");
    });
    auto r = s.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"stream":true,
                        "stream_options":{"include_usage":true}})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    std::string err;
    std::vector<SseEvent> events = parse_sse(r->body, &err);
    EXPECT_EQ(err, "");
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.back().data, "[DONE]");
    std::string content, reasoning, finish;
    Json usage;
    std::string id;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        Json chunk = parse(events[i].data);
        EXPECT_EQ(chunk["object"], "chat.completion.chunk");
        if (id.empty()) id = chunk["id"];
        EXPECT_EQ(chunk["id"], id);  // one id for the whole stream
        ASSERT_TRUE(chunk.contains("usage"));
        if (chunk["choices"].empty()) {
            usage = chunk["usage"];
            EXPECT_EQ(i, events.size() - 2) << "the usage chunk comes last";
            continue;
        }
        const Json& ch = chunk["choices"][0];
        if (i == 0) {
            EXPECT_EQ(ch["delta"]["role"], "assistant");
        }
        if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
        if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(content, "Hello there");
    EXPECT_EQ(reasoning, "Think.");
    EXPECT_EQ(finish, "stop");
    ASSERT_TRUE(usage.is_object());
    EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, ChatLengthFinish) {
    TestServer s;
    s.engine.set_script([](const EngineRequest&) {
        return harmony_ids("<|channel|>final<|message|>one two three four five six seven<|return|>");
    });
    auto r = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5})");
    ASSERT_TRUE(r);
    Json j = parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 5);
}

TEST_F(HttpServerTest, BadInputStatusesAndErrorShapes) {
    TestServerOptions o = default_test_options();
    o.engine.max_context_tokens = 300;
    TestServer s(o);
    s.engine.set_script(hello_script());
    struct Case {
        const char* path;
        std::string body;
        int status;
        const char* param;  // nullptr: no param
    };
    std::string words;
    for (int i = 0; i < 400; ++i) words += std::to_string(i * 7) + " ";
    const std::string long_prompt = R"({"messages":[{"role":"user","content":")" + words + R"("}]})";
    const Case cases[] = {
        {"/v1/chat/completions", "{not json", 400, nullptr},
        {"/v1/chat/completions", "", 400, nullptr},
        {"/v1/chat/completions", "[1,2]", 400, nullptr},
        {"/v1/chat/completions", R"({"model":"m"})", 400, "messages"},
        {"/v1/chat/completions", R"({"messages":[]})", 400, "messages"},
        {"/v1/chat/completions", R"({"messages":{"role":"user"}})", 400, "messages"},
        {"/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", 400, "max_tokens"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-3})", 400, "max_tokens"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":"warm"})", 400,
         "temperature"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100000})", 400,
         "max_tokens"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"top_p":-1e-300})", 400, "top_p"},
        {"/v1/chat/completions",
         R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function",
             "function":{"name":"a<|call|>b","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"y"}]})",
         400, "messages[1].tool_calls[0].function.name"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"bogus"}})",
         400, "response_format.type"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{}})", 400,
         "response_format.type"},
        {"/v1/chat/completions",
         R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})", 400,
         "response_format.json_schema"},
        {"/v1/chat/completions",
         R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":)"
         R"({"name":"n","schema":{"type":"object","properties":{"a":{"type":"string","minimum":1}}}}}})",
         400, "response_format.json_schema.schema"},
        {"/v1/responses", R"({"input":"x","text":{"format":{"type":"json_schema","schema":{}}}})", 400,
         "text.format.name"},
        {"/v1/responses", R"({"input":"x","text":{"format":{"type":"json_schema","name":"a b","schema":{}}}})", 400,
         "text.format.name"},
        // Errors found in the chat form name the Responses field.
        {"/v1/responses",
         R"({"instructions":"be brief","input":[{"role":"user","content":"x"},)"
         R"({"type":"function_call_output","call_id":"nope","output":"1"}]})",
         400, "input[1].call_id"},
        {"/v1/responses",
         R"({"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}})", 400,
         "tool_choice.name"},
        // An id that no call has is an error even when other calls exist (it was given to the last call).
        {"/v1/chat/completions",
         R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","type":"function",)"
         R"("function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"zz","content":"1"}]})",
         400, "messages[2].tool_call_id"},
        {"/v1/responses",
         R"({"input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},)"
         R"({"type":"function_call_output","call_id":"zz","output":"1"}]})",
         400, "input[2].call_id"},
        {"/v1/chat/completions", long_prompt, 400, "messages"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", 400, nullptr},
        {"/v1/responses", R"({"model":"m"})", 400, "input"},
        {"/v1/responses", R"({"input":"x","max_output_tokens":0})", 400, "max_output_tokens"},
        {"/v1/responses", R"({"input":"x","max_tokens":4})", 400, "max_tokens"},
        {"/v1/responses", R"({"input":"x","max_completion_tokens":4})", 400, "max_completion_tokens"},
        {"/v1/completions", R"({"prompt":[1,2,300000]})", 400, "prompt[2]"},
        {"/v1/completions", R"({"prompt":[1,9223372036854775808]})", 400, "prompt[1]"},
        {"/v1/completions", R"({"prompt":"x","max_tokens":0})", 400, "max_tokens"},
        {"/v1/completions", "\xff", 400, nullptr},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.body.substr(0, 200));
        Json e = expect_error(s.post(c.path, c.body), c.status);
        if (c.param) {
            EXPECT_EQ(e["param"], c.param);
        } else {
            EXPECT_TRUE(e["param"].is_null());
        }
        EXPECT_EQ(e["type"], "invalid_request_error");
    }
    // An id past INT64_MAX is named as sent, not wrapped negative.
    Json huge = expect_error(s.post("/v1/completions", R"({"prompt":[9223372036854775808]})"), 400);
    EXPECT_NE(huge["message"].get<std::string>().find("9223372036854775808 is outside"), std::string::npos)
        << huge["message"];
    Json ctx = expect_error(s.post("/v1/chat/completions", long_prompt), 400);
    EXPECT_EQ(ctx["code"], "context_length_exceeded");

    // Body over the limit: 413.
    std::string big = R"({"messages":[{"role":"user","content":")" + std::string(70 * 1024, 'x') + R"("}]})";
    Json too_big = expect_error(s.post("/v1/chat/completions", big), 413);
    EXPECT_EQ(too_big["code"], "request_too_large");
    // The same body sent chunked (no Content-Length), then 64 MB of whitespace: refused as soon as the
    // limit is passed, not buffered whole (httplib 0.11 enforces its limit only on Content-Length
    // bodies); a chunked body under the limit is served.
    {
        httplib::Client c = s.client();
        size_t sent = 0;
        auto r = c.Post(
            "/v1/chat/completions",
            [&](size_t, httplib::DataSink& sink) {
                const std::string piece(16 * 1024, ' ');  // JSON whitespace, 16 KB a chunk
                if (sent < big.size()) {
                    sink.write(big.data() + sent, std::min<size_t>(16 * 1024, big.size() - sent));
                    sent += 16 * 1024;
                } else if (sent < 64 * 1024 * 1024) {  // then keep sending: the server must stop first
                    if (!sink.write(piece.data(), piece.size())) return false;
                    sent += piece.size();
                } else {
                    sink.done();
                }
                return true;
            },
            "application/json");
        // The server answers 413 and closes without reading the rest; the client, still sending, may
        // see the connection reset before it reads that answer. Either way it could not send the
        // whole body, and the server serves the next request.
        if (r) {
            Json e = expect_error(r, 413);
            EXPECT_EQ(e["code"], "request_too_large");
        }
        EXPECT_LT(sent, static_cast<size_t>(64) * 1024 * 1024);
    }
    {
        httplib::Client c = s.client();
        bool done = false;
        auto r = c.Post(
            "/v1/chat/completions",
            [&](size_t, httplib::DataSink& sink) {
                if (!done)
                    sink.write(kChat, std::strlen(kChat));
                else
                    sink.done();
                done = true;
                return true;
            },
            "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << r->body;
        EXPECT_TRUE(s.wait_engine_idle());
    }
    // A Range header does not cut an API answer (it was a 200 with a JSON fragment).
    {
        auto r = s.client().Post("/v1/chat/completions", {{"Range", "bytes=0-10"}}, kChat, "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_FALSE(r->has_header("Content-Range"));
        EXPECT_TRUE(Json::accept(r->body)) << r->body;
        EXPECT_TRUE(s.wait_engine_idle());
        auto m = s.client().Get("/v1/models", {{"Range", "bytes=5-"}});
        ASSERT_TRUE(m);
        EXPECT_EQ(m->status, 200);
        EXPECT_TRUE(Json::accept(m->body)) << m->body;
    }
    // A compressed body (httplib would inflate it past every size limit): 415 before it is read.
    for (const char* enc : {"gzip", "deflate", "br", "GZIP"}) {
        SCOPED_TRACE(enc);
        httplib::Client c = s.client();
        auto r = c.Post("/v1/chat/completions", {{"Content-Encoding", enc}}, std::string("\x1f\x8b\x08\x00", 4),
                        "application/json");
        Json e = expect_error(r, 415);
        EXPECT_EQ(e["code"], "unsupported_content_encoding");
        EXPECT_EQ(e["type"], "invalid_request_error");
    }
    {
        auto r = s.client().Post("/v1/chat/completions", {{"Content-Encoding", "identity"}}, kChat, "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_TRUE(s.wait_engine_idle());
    }
    // Unknown route: 404; wrong method: 405 with Allow.
    expect_error(s.post("/v1/nothing", "{}"), 404);
    expect_error(s.get("/v2/models"), 404);
    auto get_chat = s.get("/v1/chat/completions");
    expect_error(get_chat, 405);
    EXPECT_EQ(get_chat->get_header_value("Allow"), "POST");
    auto del = s.client().Delete("/v1/models");
    expect_error(del, 405);
    expect_error(s.post("/health", "{}"), 405);
    // The stored-response routes on an id never stored (response_store_test.cpp has the rest).
    for (int k = 0; k < 3; ++k) {
        Json e = expect_error(k == 0   ? s.get("/v1/responses/resp_1")
                              : k == 1 ? s.client().Delete("/v1/responses/resp_1")
                                       : s.post("/v1/responses/resp_1/cancel", "{}"),
                              404);
        EXPECT_NE(e["message"].get<std::string>().find("'resp_1' not found"), std::string::npos) << e.dump();
    }
    // None of that reached the engine (but the chunked, the ranged and the identity-encoded
    // requests) or disturbed the server.
    EXPECT_EQ(s.engine.submitted(), 3);
    auto ok = s.post("/v1/chat/completions", kChat);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, CorsPreflightAndOriginHeader) {
    {
        TestServer s(default_test_options());  // cors_origin "*" by default, as vLLM and llama.cpp
        s.engine.set_script(hello_script());
        httplib::Client c = s.client();
        auto pre =
            c.Options("/v1/chat/completions", {{"Origin", "http://localhost:3000"},
                                               {"Access-Control-Request-Method", "POST"},
                                               {"Access-Control-Request-Headers", "content-type,authorization"}});
        ASSERT_TRUE(pre);
        EXPECT_EQ(pre->status, 204);
        EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "*");
        EXPECT_EQ(pre->get_header_value_count("Access-Control-Allow-Origin"), 1u);
        EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
        EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "content-type,authorization");
        auto models = s.client().Options("/v1/models");
        ASSERT_TRUE(models);
        EXPECT_EQ(models->status, 204);
        EXPECT_EQ(models->get_header_value("Access-Control-Allow-Methods"), "GET, HEAD, OPTIONS");
        // A stored response's routes (retrieve, delete, cancel, input_items) answered 404 to the preflight; each
        // says what it allows (all said "GET, POST, DELETE").
        for (const auto& [path, methods] :
             std::vector<std::pair<std::string, std::string>>{{"/v1/responses/resp_1", "GET, DELETE"},
                                                              {"/v1/responses/resp_1/cancel", "POST"},
                                                              {"/v1/responses/resp_1/input_items", "GET"}}) {
            auto r = s.client().Options(path.c_str(),
                                        {{"Origin", "http://a.com"}, {"Access-Control-Request-Method", "DELETE"}});
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 204) << path;
            EXPECT_EQ(r->get_header_value("Access-Control-Allow-Methods"), methods + ", OPTIONS") << path;
            auto put = s.client().Put(path.c_str(), "{}", "application/json");
            ASSERT_TRUE(put);
            EXPECT_EQ(put->status, 405);
            EXPECT_EQ(put->get_header_value("Allow"), methods) << path;
        }
        // Answers carry the origin header, errors from the routes too.
        auto ok = s.post("/v1/chat/completions", kChat);
        ASSERT_TRUE(ok);
        EXPECT_EQ(ok->status, 200);
        EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "*");
        auto bad = s.post("/v1/chat/completions", "{}");
        ASSERT_TRUE(bad);
        EXPECT_EQ(bad->status, 400);
        EXPECT_EQ(bad->get_header_value("Access-Control-Allow-Origin"), "*");
        EXPECT_TRUE(s.wait_engine_idle());
    }
    {
        TestServerOptions o = default_test_options();
        o.http.cors_origin = "https://app.example";
        TestServer s(o);
        auto health = s.get("/health");
        ASSERT_TRUE(health);
        EXPECT_EQ(health->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
        EXPECT_EQ(health->get_header_value("Vary"), "Origin");
    }
    {
        // X-Request-Id is echoed on every answer (errors too), unless it is not a plain token.
        TestServer s(default_test_options());
        s.engine.set_script(hello_script());
        auto echoed =
            s.client().Post("/v1/chat/completions", {{"X-Request-Id", "trace-7f3a"}}, kChat, "application/json");
        ASSERT_TRUE(echoed);
        EXPECT_EQ(echoed->get_header_value("X-Request-Id"), "trace-7f3a");
        auto error = s.client().Get("/v1/nowhere", {{"X-Request-Id", "trace-8"}});
        ASSERT_TRUE(error);
        EXPECT_EQ(error->get_header_value("X-Request-Id"), "trace-8");
        auto odd = s.client().Get("/health", {{"X-Request-Id", "a b"}});
        ASSERT_TRUE(odd);
        EXPECT_FALSE(odd->has_header("X-Request-Id"));
        EXPECT_FALSE(s.get("/health")->has_header("X-Request-Id"));
        EXPECT_TRUE(s.wait_engine_idle());
    }
    {
        TestServerOptions o = default_test_options();
        o.http.cors_origin = "";  // off: no header, OPTIONS is a wrong method
        TestServer s(o);
        auto pre = s.client().Options("/v1/chat/completions");
        expect_error(pre, 405);
        auto health = s.get("/health");
        ASSERT_TRUE(health);
        EXPECT_FALSE(health->has_header("Access-Control-Allow-Origin"));
    }
}

// --api-key: every route but /health, /metrics and CORS preflights needs one of the keys, as a bearer token (the
// scheme in any case) or X-Api-Key; a missing or wrong key is 401 (OpenAI's invalid_api_key, WWW-Authenticate)
// before the body is read or anything reaches the engine, unknown paths included.
TEST_F(HttpServerTest, ApiKeysGuardEveryRouteButHealthMetricsAndVersion) {
    TestServerOptions o = default_test_options();
    o.http.api_keys = {"sk-first", "sk-second"};
    TestServer s(o);
    s.engine.set_script(hello_script());
    auto post = [&](const std::string& path, const httplib::Headers& h) {
        return s.client().Post(path.c_str(), h, kChat, "application/json");
    };
    auto expect_401 = [](const httplib::Result& r, const std::string& words) {
        Json e = expect_error(r, 401);
        EXPECT_EQ(e["code"], "invalid_api_key") << e.dump();
        EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << e.dump();
        if (r) {
            EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
        }
    };
    expect_401(post("/v1/chat/completions", {}), "Missing API key");
    for (const char* wrong :
         {"Bearer sk-firs", "Bearer sk-first2", "Bearer ", "Basic sk-first", "sk-first", "Bearer sk-first sk-second"})
        expect_401(post("/v1/chat/completions", {{"Authorization", wrong}}), "Incorrect API key");
    expect_401(post("/v1/chat/completions", {{"X-Api-Key", "nope"}}), "Incorrect API key");
    expect_401(s.client().Get("/v1/models"), "Missing API key");
    expect_401(post("/v1/completions", {}), "Missing API key");
    expect_401(post("/tokenize", {}), "Missing API key");
    expect_401(post("/v1/embeddings", {}), "Missing API key");  // unknown paths too: nothing is told without a key
    expect_401(s.client().Get("/v1/responses/resp_1"), "Missing API key");
    EXPECT_EQ(s.engine.submitted(), 0);
    for (const httplib::Headers& good :
         {httplib::Headers{{"Authorization", "Bearer sk-first"}},
          httplib::Headers{{"Authorization", "bearer  sk-second "}}, httplib::Headers{{"X-Api-Key", "sk-second"}}}) {
        auto r = post("/v1/chat/completions", good);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << r->body;
        auto m = s.client().Get("/v1/models", good);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->status, 200);
    }
    EXPECT_EQ(s.engine.submitted(), 3);
    for (const char* open : {"/health", "/metrics", "/version"}) {
        auto r = s.get(open);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << open;
    }
    auto pre = s.client().Options("/v1/chat/completions", {{"Access-Control-Request-Method", "POST"}});
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    // `Expect: 100-continue` without a key: the 401 comes instead of the 100, before the body is sent (the 100 came
    // first and the client uploaded its body to be refused); with the key, the 100 and then the answer.
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Expect: 100-continue\r\nContent-Length: " +
        std::to_string(std::string(kChat).size()) + "\r\n";
    int fd = send_raw(s.http.port(), head + "\r\n", 5);
    ASSERT_GE(fd, 0);
    std::string got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 401 Unauthorized") << got;
    EXPECT_NE(got.find("invalid_api_key"), std::string::npos) << got;
    EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
    // A body over the limit: 413 instead of the 100 (the 100 came first), and the connection ends at once (the
    // refusals' sockets waited out the keep-alive timeout for a body that never came).
    const auto t0 = std::chrono::steady_clock::now();
    fd = send_raw(s.http.port(),
                  "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Expect: 100-continue\r\nAuthorization: Bearer sk-first\r\nContent-Length: 5000000\r\n\r\n",
                  5);
    ASSERT_GE(fd, 0);
    got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 413 Payload Too Large") << got;
    EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    // A compressed body: 415 instead of the 100.
    fd = send_raw(s.http.port(), head + "Authorization: Bearer sk-first\r\nContent-Encoding: gzip\r\n\r\n", 5);
    ASSERT_GE(fd, 0);
    got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 415 Unsupported Media Type") << got;
    EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
    // No handler reads the body: the final answer instead of the 100 (an unknown path 404, a known one with another
    // method 405 with Allow), and the connection ends.
    for (const auto& [line, status] :
         std::vector<std::pair<std::string, std::string>>{{"POST /v1/embeddings", "404 Not Found"},
                                                          {"PUT /v1/chat/completions", "405 Method Not Allowed"},
                                                          {"POST /health", "405 Method Not Allowed"}}) {
        fd = send_raw(s.http.port(),
                      line +
                          " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                          "Authorization: Bearer sk-first\r\nContent-Length: 20\r\n\r\n",
                      5);
        ASSERT_GE(fd, 0);
        got = read_all(fd);
        EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 " + status) << line << ": " << got;
        EXPECT_EQ(got.find("100 Continue"), std::string::npos) << line << ": " << got;
        EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << line << ": " << got;
        if (status.rfind("405", 0) == 0) {
            EXPECT_NE(got.find("Allow: "), std::string::npos) << line << ": " << got;
        }
    }
    fd = send_raw(s.http.port(), head + "Authorization: Bearer sk-first\r\nConnection: close\r\n\r\n", 5);
    ASSERT_GE(fd, 0);
    char cont[64];
    const ssize_t n = ::recv(fd, cont, sizeof(cont), 0);
    ASSERT_GT(n, 0);
    EXPECT_EQ(std::string(cont, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u);
    ASSERT_EQ(::send(fd, kChat, std::string(kChat).size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(std::string(kChat).size()));
    got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 200 OK") << got;
    EXPECT_EQ(s.engine.submitted(), 4);
    EXPECT_TRUE(s.wait_engine_idle());

    EXPECT_EQ(log_safe("GET"), "GET");
    EXPECT_EQ(log_safe("/v1/a\r\n[http] forged\"\\\x1b\xc2\x85"),
              "/v1/a\\x0d\\x0a[http] forged\\x22\\x5c\\x1b\\xc2\\x85");
    EXPECT_EQ(log_safe(std::string(600, 'a')).size(), 512u);
    EXPECT_FALSE(api_key_accepted({}, "Bearer x", "x"));
    EXPECT_FALSE(api_key_accepted({""}, "Bearer ", ""));
    EXPECT_TRUE(api_key_accepted({"a", "b"}, "BEARER\tb", ""));
    EXPECT_FALSE(api_key_accepted({"ab"}, "Bearer a", "b"));
}

// A model whose vocabulary stops below Harmony's stop ids (a test model) still answers token-id completions: those
// ids, which it can never draw, are not among the request's stop ids (the engine refuses ids outside the
// vocabulary); a stop_token_ids entry outside it is still the request's 400.
TEST_F(HttpServerTest, SmallVocabularyCompletionsLeaveOutHarmonyStopIds) {
    TestServerOptions o = default_test_options();
    o.engine.vocab_size = 1024;
    TestServer s(o);
    s.engine.set_script([](const EngineRequest&) { return std::vector<int32_t>{5, 6, 7}; });
    auto ok = s.post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":3})");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    EXPECT_TRUE(s.engine.last_request().stop_ids.empty());
    auto kept = s.post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":3,"stop_token_ids":[7]})");
    ASSERT_TRUE(kept);
    EXPECT_EQ(kept->status, 200) << kept->body;
    EXPECT_EQ(s.engine.last_request().stop_ids, std::vector<int32_t>{7});
    for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/responses"}) {
        const std::string body = std::string(path) == "/v1/completions" ? R"({"prompt":[1,2,3],)"
                                 : std::string(path) == "/v1/responses"
                                     ? R"({"input":"x",)"
                                     : R"({"messages":[{"role":"user","content":"x"}],)";
        EXPECT_EQ(expect_error(s.post(path, body + R"("stop_token_ids":[7,5000]})"), 400)["param"], "stop_token_ids[1]")
            << path;
    }
    EXPECT_TRUE(s.wait_engine_idle());
}

// A speculative step delivers several tokens at once. When a stop string ends the answer inside such a run, the
// tokens after it were never used: gptoss_generation_tokens_total agrees with the answers' usage (it counted them).
// And an answer a stop string ends still says its prompt's prefix-cache hits (its cached_tokens read 0: only the
// engine's finish event, which such an answer never sees, was read).
TEST_F(HttpServerTest, StopStringCutsKeepTheMetricsAndCachedTokensRight) {
    TestServerOptions o = default_test_options();
    o.engine.tokens_per_step = 4;
    o.engine.cached_prompt_tokens = 2;
    TestServer s(o);
    const std::vector<int32_t> plain = test_tokenizer()->encode("ab cd ef gh ij kl mn op", {});
    const std::vector<int32_t> chat = harmony_ids("<|channel|>final<|message|>ab cd ef gh ij kl mn op<|return|>");
    ASSERT_GE(plain.size(), 6u);
    s.engine.set_script([&](const EngineRequest& r) { return r.prompt.size() == 3 ? plain : chat; });
    int64_t usage_total = 0;
    const auto add_usage = [&](const httplib::Result& r) {
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        // A stream's usage is in its last chunk before [DONE].
        Json j;
        if (r->body.rfind("data: ", 0) == 0) {
            const std::vector<SseEvent> events = parse_sse(r->body);
            ASSERT_GE(events.size(), 2u);
            j = parse(events[events.size() - 2].data);
        } else {
            j = parse(r->body);
        }
        EXPECT_LT(j["usage"]["completion_tokens"].get<int64_t>(), 8) << r->body;  // cut early
        EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2) << r->body;
        usage_total += j["usage"]["completion_tokens"].get<int64_t>();
    };
    add_usage(s.post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":50,"stop":"cd"})"));
    add_usage(s.post("/v1/chat/completions",
                     R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50,"stop":["cd"]})"));
    add_usage(s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50,)"
                                             R"("stop":"cd","stream":true,"stream_options":{"include_usage":true}})"));
    ASSERT_TRUE(s.wait_engine_idle());
    auto metrics = s.get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("gptoss_generation_tokens_total " + std::to_string(usage_total) + "\n"),
              std::string::npos)
        << "usage total " << usage_total << "\n"
        << metrics->body;
}

// vLLM's priority: 0 (or absent) everywhere; another value is a 400 naming it unless the server was started with
// --scheduling-policy priority, which hands it to the engine (whose scheduler orders by it: runtime tests).
TEST_F(HttpServerTest, RequestPriorityNeedsThePriorityPolicy) {
    const std::vector<std::pair<std::string, std::string>> requests = {
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2,"priority":)"},
        {"/v1/completions", R"({"prompt":"x","max_tokens":2,"priority":)"},
        {"/v1/responses", R"({"input":"x","max_output_tokens":2,"store":false,"priority":)"}};
    for (bool policy : {false, true}) {
        TestServerOptions o = default_test_options();
        o.routes.priority_scheduling = policy;
        TestServer s(o);
        s.engine.set_script(hello_script());
        for (const auto& [path, body] : requests) {
            auto zero = s.post(path, body + "0}");
            ASSERT_TRUE(zero);
            EXPECT_EQ(zero->status, 200) << path << zero->body;
            auto high = s.post(path, body + "-3}");
            ASSERT_TRUE(high);
            if (policy) {
                EXPECT_EQ(high->status, 200) << path << high->body;
                EXPECT_EQ(s.engine.last_request().priority, -3) << path;
            } else {
                EXPECT_EQ(expect_error(high, 400)["param"], "priority") << path;
            }
            expect_error(s.post(path, body + "1.5}"), 400);
        }
        EXPECT_TRUE(s.wait_engine_idle());
    }
}

TEST_F(HttpServerTest, EngineErrorsBecome500) {
    TestServer s;
    s.engine.set_script(hello_script());
    s.engine.fail_next_request("simulated failure");
    Json e = expect_error(s.post("/v1/chat/completions", kChat), 500);
    EXPECT_NE(e["message"].get<std::string>().find("simulated failure"), std::string::npos);
    // In a stream the error arrives as an SSE error object, then [DONE].
    s.engine.fail_next_request("again");
    auto r = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
    ASSERT_TRUE(r);
    std::vector<SseEvent> ev = parse_sse(r->body);
    ASSERT_GE(ev.size(), 2u);
    EXPECT_EQ(ev.back().data, "[DONE]");
    EXPECT_TRUE(parse(ev[ev.size() - 2].data).contains("error"));
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, StalledRequestsTimeOut) {
    TestServerOptions o = default_test_options();
    o.routes.request_timeout = std::chrono::seconds(1);
    TestServer s(o);
    s.engine.set_script(hello_script());
    s.engine.set_paused(true);  // no token ever comes
    Json e = expect_error(s.post("/v1/chat/completions", kChat), 504);
    EXPECT_NE(e["message"].get<std::string>().find("no progress"), std::string::npos);
    auto r = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
    ASSERT_TRUE(r);
    std::vector<SseEvent> ev = parse_sse(r->body);
    ASSERT_GE(ev.size(), 3u);
    EXPECT_EQ(ev.back().data, "[DONE]");
    EXPECT_EQ(parse(ev[ev.size() - 2].data)["error"]["message"], e["message"]);
    EXPECT_TRUE(s.wait_engine_idle());
    EXPECT_EQ(s.engine.cancelled_unfinished(), 2);
    s.engine.set_paused(false);
}

// A prefill longer than the stall timeout is progress, not a stall: the engine marks the request
// at every step (a probe's 12k-token prompt got 504 after --request-timeout 3 while computing).
TEST_F(HttpServerTest, LongPrefillIsNotAStall) {
    TestServerOptions o = default_test_options();
    o.routes.request_timeout = std::chrono::seconds(1);
    TestServer s(o);
    s.engine.set_script(hello_script());
    s.engine.set_prefill_time(std::chrono::milliseconds(2500));
    auto r = s.post("/v1/chat/completions", kChat);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    auto st = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
    ASSERT_TRUE(st);
    std::vector<SseEvent> ev = parse_sse(st->body);
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.back().data, "[DONE]");
    EXPECT_EQ(st->body.find("no progress"), std::string::npos) << st->body;
}

// A fake engine that takes 5 ms a token, and a final answer of n tokens for it (~n · 5 ms).
TestServerOptions slow_engine_options() {
    TestServerOptions o = default_test_options();
    o.engine.step_interval = std::chrono::milliseconds(5);
    return o;
}
void script_long_answer(TestServer& s, int n) {
    std::vector<int32_t> answer = harmony_ids("<|channel|>final<|message|>");
    answer.insert(answer.end(), n, 1234);
    s.engine.set_script([answer](const EngineRequest&) { return answer; });
}

TEST_F(HttpServerTest, ClientDisconnectCancelsAndFreesBlocks) {
    TestServer s(slow_engine_options());
    script_long_answer(s, 2000);

    httplib::Client c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":2000})";
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
    auto res = c.send(req);  // the receiver hangs up after three chunks
    EXPECT_GE(chunks, 3);
    EXPECT_TRUE(s.wait_engine_idle()) << "running=" << s.engine.stats().running_sequences
                                      << " kv=" << s.engine.stats().kv_blocks_in_use;
    EXPECT_EQ(s.engine.cancelled_unfinished(), 1);
    auto metrics = s.get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("gptoss_requests_cancelled_total 1\n"), std::string::npos);
}

// A streaming request whose client gives up while nothing is being written (a long prompt: here a paused engine,
// with the keep-alive comments 20 s apart) is cancelled within a poll interval or so, not at the next keep-alive
// comment's failed write.
TEST_F(HttpServerTest, StreamingClientGoneBeforeAnyTokenCancels) {
    TestServerOptions o = slow_engine_options();
    o.routes.keepalive_interval = std::chrono::seconds(20);
    TestServer s(o);
    script_long_answer(s, 2000);
    s.engine.set_paused(true);
    {
        httplib::Client c = s.client();
        c.set_read_timeout(0, 300 * 1000);  // 300 ms without a byte, then the client gives up and closes
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":2000})";
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [](const char*, size_t, uint64_t, uint64_t) { return true; };
        c.send(req);
    }
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(s.wait_engine_idle()) << "running=" << s.engine.stats().running_sequences;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    EXPECT_EQ(s.engine.cancelled_unfinished(), 1);
    s.engine.set_paused(false);
    s.engine.set_script(hello_script());
    auto ok = s.post("/v1/chat/completions", kChat);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

// A non-streaming request whose client gives up (a read timeout, then the socket closed) is
// cancelled within a poll interval or so, not generated to its 2,000 tokens (~10 s here) for nobody.
TEST_F(HttpServerTest, NonStreamingClientDisconnectCancels) {
    TestServer s(slow_engine_options());
    script_long_answer(s, 2000);
    {
        httplib::Client c = s.client();
        c.set_read_timeout(0, 300 * 1000);  // 300 ms, then the client gives up and closes
        auto r = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2000})",
                        "application/json");
        EXPECT_FALSE(r) << (r ? std::to_string(r->status) + " " + r->body : std::string());
    }
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(s.wait_engine_idle()) << "running=" << s.engine.stats().running_sequences;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(s.engine.cancelled_unfinished(), 1);
    // The server serves the next request.
    s.engine.set_script(hello_script());
    auto ok = s.post("/v1/chat/completions", kChat);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

// Raw bytes to the server; the first line of its answer (or "" if none within 3 s), and how long it took.
std::pair<std::string, double> raw_exchange(int port, const std::string& bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string got;
    if (const int fd = send_raw(port, bytes, 3); fd >= 0) {
        char buf[512];
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n > 0) got.assign(buf, static_cast<size_t>(n));
        ::close(fd);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {got.substr(0, got.find("\r\n")), secs};
}

// A non-streaming request whose client resets the connection (RST: SO_LINGER 0) right after sending it is
// cancelled too. The server looked the socket up at its first poll, 100 ms in, when a reset socket no longer
// has the peer address it is found by; that request ran to its 2,000 tokens for nobody.
TEST_F(HttpServerTest, NonStreamingClientResetCancels) {
    TestServer s(slow_engine_options());
    script_long_answer(s, 2000);
    const std::string body = R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2000})";
    const std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = send_raw(s.http.port(), req, 3);
    ASSERT_GE(fd, 0);
    // Reset once the request is generating and before the server's first check (100 ms in).
    const auto sent = std::chrono::steady_clock::now();
    while (s.engine.submitted() == 0 && std::chrono::steady_clock::now() - sent < std::chrono::seconds(2))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(s.engine.submitted(), 1);
    linger lg{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    ::close(fd);  // RST
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(s.wait_engine_idle()) << "running=" << s.engine.stats().running_sequences;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(s.engine.cancelled_unfinished(), 1);
}

// Request framing httplib would end only at its 30 s read timeout is answered at once.
TEST_F(HttpServerTest, BrokenFramingIsAnsweredAtOnce) {
    TestServer s;
    s.engine.set_script(hello_script());
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
    struct Case {
        std::string headers;
        const char* status;
    };
    const Case cases[] = {
        {"", "HTTP/1.1 411"},                                          // no length at all
        {"Content-Length: -5\r\n", "HTTP/1.1 400"},                    // not a byte count
        {"Content-Length: 12abc\r\n", "HTTP/1.1 400"},                 //
        {"Content-Length: 99999999999999999999\r\n", "HTTP/1.1 413"},  // past 2^64
        {"Content-Length: 5000000\r\n", "HTTP/1.1 413"},               // over the 64 KB test limit, body never sent
        {"Transfer-Encoding: gzip\r\n", "HTTP/1.1 501"},
        {"Content-Length: 7\r\nContent-Length: 52\r\n", "HTTP/1.1 400"},  // lengths that disagree
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.headers);
        const auto [line, secs] = raw_exchange(s.http.port(), head + c.headers + "\r\n");
        EXPECT_EQ(line.substr(0, 12), c.status) << line;
        EXPECT_LT(secs, 2.0);
    }
    // A method the path does not allow, with a body that never comes (no length): 405 at once, not
    // after the read timeout.
    for (const char* request : {"PUT /v1/chat/completions", "PATCH /v1/responses", "DELETE /v1/completions",
                                "POST /v1/models", "PUT /health"}) {
        SCOPED_TRACE(request);
        const auto [line, secs] = raw_exchange(s.http.port(), std::string(request) + " HTTP/1.1\r\nHost: x\r\n\r\n");
        EXPECT_EQ(line.substr(0, 12), "HTTP/1.1 405") << line;
        EXPECT_LT(secs, 2.0);
    }
    // An unknown path with a method that may carry a body, no body sent: 404 at once (before session
    // 25 it held a worker for the read timeout, then answered 400).
    for (const char* request : {"POST /v1/embeddings", "PUT /v1/foo", "PATCH /v1/foo", "POST /"}) {
        SCOPED_TRACE(request);
        const auto [line, secs] = raw_exchange(s.http.port(), std::string(request) + " HTTP/1.1\r\nHost: x\r\n\r\n");
        EXPECT_EQ(line.substr(0, 12), "HTTP/1.1 404") << line;
        EXPECT_LT(secs, 2.0);
    }
    EXPECT_EQ(s.engine.submitted(), 0);
    // A target in absolute form names its path (RFC 9112 §3.2.2; before session 25: 404).
    for (const std::string target : {"http://127.0.0.1/health", "HTTP://localhost:8000/health"}) {
        const auto [line, secs] = raw_exchange(s.http.port(), "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n");
        EXPECT_EQ(line.substr(0, 12), "HTTP/1.1 200") << target << ": " << line;
    }
    auto ok = s.post("/v1/chat/completions", kChat);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

// Raw bytes to the server; everything it sends until it closes the connection (5 s at most).
std::string raw_read_all(int port, const std::string& bytes) {
    std::string got;
    if (const int fd = send_raw(port, bytes, 5); fd >= 0) {
        char buf[4096];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, static_cast<size_t>(n));
        ::close(fd);
    }
    return got;
}

// A body the server does not read must never run as the next request (request smuggling behind a proxy). httplib
// 0.11 reads the bodies of POST, PUT and PATCH only, and decides to keep a connection before it answers: a GET's
// body, a body left unread by an error (a bad length, too large), and whatever follows a request line it could not
// parse all ran as requests of their own on the same connection, while the answer said `Connection: close`.
TEST_F(HttpServerTest, UnreadBodiesNeverRunAsRequests) {
    TestServer s;
    s.engine.set_script(hello_script());
    const std::string inner_body = R"({"prompt":[1,2],"max_tokens":1})";
    const std::string inner =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(inner_body.size()) + "\r\n\r\n" + inner_body;
    const std::string length = "Content-Length: " + std::to_string(inner.size()) + "\r\n";
    struct Case {
        std::string request;  // sent with `inner` after it
        const char* status;
    };
    const Case cases[] = {
        {"GET /health HTTP/1.1\r\nHost: x\r\n" + length + "\r\n", "HTTP/1.1 200"},
        {"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + length + "\r\n", "HTTP/1.1 200"},
        {"HEAD /health HTTP/1.1\r\nHost: x\r\n" + length + "\r\n", "HTTP/1.1 200"},
        {"DELETE /v1/responses/resp_x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
             [&] {
                 std::ostringstream hex;
                 hex << std::hex << inner.size();
                 return hex.str() + "\r\n";
             }(),
         "HTTP/1.1 404"},
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", "HTTP/1.1 400"},
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n", "HTTP/1.1 413"},
        {"GET /health HTTP/1.2\r\nHost: x\r\n\r\n", "HTTP/1.1 400"},
        {"GET /health HTTP/1.1\r\n" + length + "\r\n", "HTTP/1.1 400"},  // no Host (RFC 9112 §3.2)
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n" + length + "\r\n",
         "HTTP/1.1 400"},
        {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + length + "\r\n",
         "HTTP/1.1 400"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.request);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string got = raw_read_all(s.http.port(), c.request + inner);
        EXPECT_EQ(got.substr(0, 12), c.status) << got;
        // One answer, which says the connection ends, and the connection ended at once (not after the keep-alive
        // timeout, nor the 5 s the read allows).
        size_t answers = 0;
        for (size_t at = got.find("HTTP/1."); at != std::string::npos; at = got.find("HTTP/1.", at + 1)) ++answers;
        EXPECT_EQ(answers, 1u) << got;
        EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    }
    EXPECT_EQ(s.engine.submitted(), 0);
    // A request that was read whole keeps its connection: two on one.
    const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    const std::string two = raw_read_all(s.http.port(), get + get +
                                                            "GET /health HTTP/1.1\r\nHost: x\r\n"
                                                            "Connection: close\r\n\r\n");
    size_t answers = 0;
    for (size_t at = two.find("HTTP/1.1 200"); at != std::string::npos; at = two.find("HTTP/1.1 200", at + 1))
        ++answers;
    EXPECT_EQ(answers, 3u) << two;
}

// A body trickled in (a byte now and then, never a read timeout's silence) held a worker for as long as the client
// liked: past the header timeout's grace, a body must average 16 KB a second, or the client gets a 408.
TEST_F(HttpServerTest, TrickledBodyIsCutOff) {
    TestServerOptions o = default_test_options();
    o.http.header_timeout = std::chrono::seconds(1);
    TestServer s(o);
    const int fd = send_raw(s.http.port(),
                            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: 60000\r\n\r\n{",
                            5);
    ASSERT_GE(fd, 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::string got;
    for (int i = 0; i < 40 && got.empty(); ++i) {  // a byte every 100 ms, for up to 4 s
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        (void)::send(fd, " ", 1, MSG_NOSIGNAL);
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) {
            char buf[4096];
            const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
            if (n > 0) got.assign(buf, static_cast<size_t>(n));
        }
    }
    ::close(fd);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 408") << got;
    EXPECT_LT(secs, 3.0);
}

// Header blocks RFC 9112 has a server reject, which httplib 0.11 took (a proxy in front may read them otherwise): a
// line folded onto the one before (httplib dropped the continuation), a field line without a colon (dropped), a CR
// not before LF or a NUL (kept in the value). Each is a 400 with an OpenAI error object, and the connection ends.
// A chunked body's trailer fields are dropped (httplib answered them 400 before session 67), up to the header
// block's limit (431); a chunk size httplib's strtoul would read otherwise ("0x", a sign) is a 400; a multipart
// body a 415 (httplib parsed it as parts, and the plain read failed as "malformed").
TEST_F(HttpServerTest, HeaderLinesAndChunkFraming) {
    TestServer s;
    s.engine.set_script(hello_script());
    const std::string body = R"({"prompt":"Hello world"})";
    std::ostringstream hex_out;
    hex_out << std::hex << body.size();
    const std::string hex = hex_out.str();
    const auto chunked = [&](const std::string& size_line, const std::string& after_last_chunk) {
        return "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" +
               size_line + body + "\r\n0\r\n" + after_last_chunk;
    };
    struct Case {
        std::string request;
        const char* status;
        const char* says;  // in the body
    };
    const Case cases[] = {
        {"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", "HTTP/1.1 400", "obs-fold"},
        {"GET /health HTTP/1.1\r\n X-A: a\r\nHost: x\r\n\r\n", "HTTP/1.1 400", "obs-fold"},
        {"GET /health HTTP/1.1\r\nHost: x\r\nX-A\r\n\r\n", "HTTP/1.1 400", "without a colon"},
        {"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\rb\r\n\r\n", "HTTP/1.1 400", "CR not followed by LF"},
        {std::string("GET /health HTTP/1.1\r\nHost: x\r\nX-A: a") + '\0' + "b\r\n\r\n", "HTTP/1.1 400", "NUL byte"},
        {chunked(hex + "\r\n", "X-T: 1\r\nX-U: two words\r\n\r\n"), "HTTP/1.1 200", "\"tokens\""},
        {chunked(hex + ";name=value\r\n", "\r\n"), "HTTP/1.1 200", "\"tokens\""},
        {chunked("0x" + hex + "\r\n", "\r\n"), "HTTP/1.1 400", "followed by something other"},
        {chunked("-" + hex + "\r\n", "\r\n"), "HTTP/1.1 400", "does not begin with a hex digit"},
        {chunked("0000000000000000" + hex + "\r\n", "\r\n"), "HTTP/1.1 400", "more than 15 hex digits"},
        {chunked(hex + "\r\n", "X-T: " + std::string(70000, 'a') + "\r\n\r\n"), "HTTP/1.1 431", "trailer fields"},
        {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=x\r\n"
         "Content-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body,
         "HTTP/1.1 415", "multipart/form-data"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.request.substr(0, 200));
        const std::string got = raw_read_all(s.http.port(), c.request);
        EXPECT_EQ(got.substr(0, 12), c.status) << got;
        EXPECT_NE(got.find(c.says), std::string::npos) << got;
        if (std::string(c.status) != "HTTP/1.1 200") {
            EXPECT_NE(got.find(R"("type":"invalid_request_error")"), std::string::npos) << got;
        }
        size_t answers = 0;
        for (size_t at = got.find("HTTP/1."); at != std::string::npos; at = got.find("HTTP/1.", at + 1)) ++answers;
        EXPECT_EQ(answers, 1u) << got;
        EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
    }
    EXPECT_EQ(s.engine.submitted(), 0);
    EXPECT_EQ(s.get("/health")->status, 200);
    // A multipart content type on a request without a body is no body to refuse.
    const std::string got = raw_read_all(s.http.port(),
                                         "GET /health HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                                         "boundary=x\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 200") << got;
}

// Answers on a connection that ends say so once: `Connection: close` a single time and no
// `Keep-Alive` beside it (before session 26: twice where the request asked for close, and HTTP/1.0
// answers announced Keep-Alive on a connection the server then closed).
TEST_F(HttpServerTest, ConnectionCloseIsSaidOnce) {
    TestServer s;
    for (const char* request : {"POST /v1/foo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                "PUT /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                "Transfer-Encoding: gzip\r\n\r\n",
                                "GET /health HTTP/1.0\r\n\r\n", "GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n"}) {
        SCOPED_TRACE(request);
        const std::string got = raw_read_all(s.http.port(), request);
        const size_t split = got.find("\r\n\r\n");
        ASSERT_NE(split, std::string::npos) << got;
        std::string head = got.substr(0, split + 2);
        std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
        size_t n = 0;
        for (size_t at = head.find("\r\nconnection:"); at != std::string::npos;
             at = head.find("\r\nconnection:", at + 1))
            ++n;
        EXPECT_EQ(n, 1u) << head;
        EXPECT_NE(head.find("\r\nconnection: close\r\n"), std::string::npos) << head;
        EXPECT_EQ(head.find("keep-alive"), std::string::npos) << head;
    }
}

// An HTTP/1.0 client cannot decode chunked encoding (RFC 9112 §6.1): its stream comes unframed, the
// connection's close ending it (before session 25 it was chunked).
TEST_F(HttpServerTest, Http10StreamIsNotChunked) {
    TestServer s;
    s.engine.set_script(hello_script());
    const std::string body =
        R"({"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true})";
    const std::string got = raw_read_all(s.http.port(),
                                         "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: "
                                         "application/json\r\nContent-Length: " +
                                             std::to_string(body.size()) + "\r\n\r\n" + body);
    const size_t split = got.find("\r\n\r\n");
    ASSERT_NE(split, std::string::npos) << got;
    std::string head = got.substr(0, split);
    std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
    EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 200") << got;
    EXPECT_EQ(head.find("transfer-encoding"), std::string::npos) << head;
    EXPECT_NE(head.find("connection: close"), std::string::npos) << head;
    const std::string sse = got.substr(split + 4);
    EXPECT_EQ(sse.rfind("data: {", 0), 0u) << sse;
    ASSERT_GE(sse.size(), 14u) << sse;
    EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n") << sse;
    EXPECT_NE(sse.find("Hello"), std::string::npos) << sse;
}

TEST_F(HttpServerTest, DisconnectWhileQueuedIsNoticed) {
    TestServer s;
    s.engine.set_script(hello_script());
    s.engine.set_paused(true);  // nothing generates: the stream only sends keep-alive comments
    {
        httplib::Client c = s.client();
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true})";
        int chunks = 0;
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
        c.send(req);
    }
    EXPECT_TRUE(s.wait_engine_idle());
    EXPECT_EQ(s.engine.cancelled_unfinished(), 1);
    s.engine.set_paused(false);
}

// A client that never reads its stream blocks only its own connection.
TEST_F(HttpServerTest, SlowReaderDoesNotStallOthers) {
    TestServerOptions o = default_test_options();
    o.http.write_timeout = std::chrono::seconds(30);
    o.engine.step_interval = std::chrono::microseconds(50);
    TestServer s(o);
    std::vector<int32_t> answer = harmony_ids("<|channel|>final<|message|>");
    for (int i = 0; i < 6000; ++i) answer.push_back(1234);
    s.engine.set_script([answer](const EngineRequest&) { return answer; });

    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    int small = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(s.http.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string body =
        R"({"messages":[{"role":"user","content":"x"}],"stream":true,"logprobs":true,"top_logprobs":5,"max_tokens":6000})";
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its socket buffers fill up

    s.engine.set_script(hello_script());
    const auto t0 = Clock::now();
    for (int i = 0; i < 5; ++i) {
        auto r = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_EQ(parse_sse(r->body).back().data, "[DONE]");
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
    ::close(fd);
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, ManyConcurrentStreamsSomeAbort) {
    TestServerOptions o = default_test_options();
    o.engine.max_running = 16;
    o.engine.step_interval = std::chrono::milliseconds(1);
    TestServer s(o);
    std::vector<int32_t> answer = harmony_ids("<|channel|>final<|message|>");
    for (int i = 0; i < 40; ++i) answer.push_back(1234);
    answer.push_back(200002);
    s.engine.set_script([answer](const EngineRequest&) { return answer; });

    constexpr int kClients = 64;
    std::atomic<int> complete{0}, aborted{0}, bad{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
        threads.emplace_back([&, i] {
            httplib::Client c = s.client();
            httplib::Request req;
            req.method = "POST";
            req.path = "/v1/chat/completions";
            req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true,
                           "stream_options":{"include_usage":true}})";
            std::string body;
            const bool abort_early = i % 4 == 0;
            int chunks = 0;
            req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
                body.append(d, n);
                return !(abort_early && ++chunks >= 2);
            };
            c.send(req);
            if (abort_early) {
                ++aborted;
                return;
            }
            std::vector<SseEvent> ev = parse_sse(body);
            if (ev.size() < 3 || ev.back().data != "[DONE]") {
                ++bad;
                return;
            }
            Json usage = parse(ev[ev.size() - 2].data)["usage"];
            if (!usage.is_object() || usage["completion_tokens"] != answer.size()) ++bad;
            ++complete;
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(complete.load(), kClients - kClients / 4);
    EXPECT_TRUE(s.wait_engine_idle());
}

// 260 streams open at the same moment (the engine holds every token until all have their first
// chunk), then all of them complete.
TEST_F(HttpServerTest, TwoHundredFiftySixOpenStreamsAtOnce) {
    TestServerOptions o = default_test_options();
    o.http.threads = 320;
    o.engine.max_running = 300;
    TestServer s(o);
    s.engine.set_script(hello_script());
    s.engine.set_paused(true);
    constexpr int kClients = 260;
    std::atomic<int> opened{0}, done{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
        threads.emplace_back([&] {
            httplib::Client c = s.client();
            httplib::Request req;
            req.method = "POST";
            req.path = "/v1/chat/completions";
            req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true})";
            std::string body;
            bool first = true;
            req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
                if (first) ++opened;
                first = false;
                body.append(d, n);
                return true;
            };
            c.send(req);
            if (body.size() >= kSseDone.size() &&
                body.compare(body.size() - kSseDone.size(), kSseDone.size(), kSseDone) == 0) {
                ++done;
            }
        });
    }
    for (int i = 0; i < 3000 && opened.load() < kClients; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(opened.load(), kClients);
    EXPECT_EQ(s.queue.in_flight(), kClients);
    s.engine.set_paused(false);
    for (auto& t : threads) t.join();
    EXPECT_EQ(done.load(), kClients);
    EXPECT_TRUE(s.wait_engine_idle());
}

TEST_F(HttpServerTest, ShutdownEndsOpenStreams) {
    auto s = std::make_unique<TestServer>();
    s->engine.set_script(hello_script());
    s->engine.set_paused(true);
    std::string body;
    std::thread client([&] {
        httplib::Client c = s->client();
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true})";
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
            body.append(d, n);
            return true;
        };
        c.send(req);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = Clock::now();
    s->queue.shutdown();
    s->http.stop();
    client.join();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
    EXPECT_NE(body.find("shutting down"), std::string::npos) << body;
    EXPECT_NE(body.find("[DONE]"), std::string::npos);
}

// The header block is held to max_header_bytes (431) and header_timeout (408), and the connection ends: httplib
// bounds each header line (8 KB) but not their count, so a client could make the server hold gigabytes of header
// lines (a probe's 4 connections of 250 MB each took 2 GB), and one that trickled a line each read timeout held its
// worker for as long as it liked. Headers within the limit are served as before.
TEST_F(HttpServerTest, HeaderBlockLimits) {
    TestServerOptions o = default_test_options();
    o.http.max_header_bytes = 16 << 10;
    o.http.header_timeout = std::chrono::seconds(2);
    TestServer s(o);
    std::string big = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 40; ++i) big += "X-Pad-" + std::to_string(i) + ": " + std::string(1000, 'a') + "\r\n";
    int fd = send_raw(s.http.port(), big, 5);  // (no blank line: the server must not wait for one)
    ASSERT_GE(fd, 0);
    std::string got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 431 Request Header Fields Too Large") << got;
    EXPECT_NE(got.find(R"("type":"invalid_request_error")"), std::string::npos) << got;  // (an OpenAI error object)
    EXPECT_EQ(got.find("HTTP/1.1 400"), std::string::npos) << got;  // httplib's own answer is not sent after it

    std::string fits = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
    for (int i = 0; i < 12; ++i) fits += "X-Pad-" + std::to_string(i) + ": " + std::string(1000, 'a') + "\r\n";
    fd = send_raw(s.http.port(), fits + "\r\n", 5);
    ASSERT_GE(fd, 0);
    got = read_all(fd);
    EXPECT_EQ(got.substr(0, got.find("\r\n")), "HTTP/1.1 200 OK") << got;

    // A line a second: 408 at the 2 s deadline, not at the end of the trickle.
    fd = send_raw(s.http.port(), "GET /health HTTP/1.1\r\nHost: x\r\n", 8);
    ASSERT_GE(fd, 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::thread trickle([fd] {
        for (int i = 0; i < 6; ++i) {
            if (::send(fd, "X-A: b\r\n", 8, MSG_NOSIGNAL) != 8) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(700));
        }
    });
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    trickle.join();
    ::close(fd);
    ASSERT_GT(n, 0);
    const std::string line(buf, static_cast<size_t>(n));
    EXPECT_EQ(line.substr(0, line.find("\r\n")), "HTTP/1.1 408 Request Timeout") << line;
    EXPECT_GT(secs, 1.5);
    EXPECT_LT(secs, 3.5);
    // The server serves others throughout.
    EXPECT_EQ(s.get("/health")->status, 200);
}

// Pipelined requests on one connection get an answer each, in order (httplib 0.11 dropped the bytes it had read
// past the first request: one answer, then the connection waited out its keep-alive timeout).
TEST_F(HttpServerTest, PipelinedRequestsAreAllAnswered) {
    TestServer s;
    s.engine.set_script(hello_script());
    const std::string body = R"({"prompt":"Hello world"})";
    const std::string post =
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd =
        send_raw(s.http.port(),
                 "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                     post + "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                 5);
    ASSERT_GE(fd, 0);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string got = read_all(fd);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
    size_t answers = 0;
    for (size_t at = got.find("HTTP/1.1 200 OK"); at != std::string::npos; at = got.find("HTTP/1.1 200 OK", at + 1))
        ++answers;
    EXPECT_EQ(answers, 5u) << got;
    const size_t tokens = got.find("\"tokens\"");
    const size_t models = got.find("\"object\":\"list\"");
    ASSERT_NE(tokens, std::string::npos) << got;
    ASSERT_NE(models, std::string::npos) << got;
    EXPECT_LT(tokens, models);  // in order
    EXPECT_NE(got.find("\"tokens\"", models), std::string::npos);
}

}  // namespace
}  // namespace gptoss::server::testing
