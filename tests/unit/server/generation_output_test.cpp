// What each API makes of Harmony-shaped model output (scripted by the FakeEngine): reasoning and
// final content, tool calls (streamed and whole), tool results in history, malformed output,
// stop strings, logprobs; the Responses event sequence; raw completions.
#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "server/sessions.h"
#include "server_test_util.h"

namespace gptoss::server::testing {
namespace {

class GenerationOutputTest : public ::testing::Test {
protected:
    void SetUp() override { REQUIRE_TOKENIZER(); }

    void script(const std::string& harmony_text) {
        std::vector<int32_t> ids = harmony_ids(harmony_text);
        server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    }

    Json post_json(const std::string& path, const std::string& body) {
        auto r = server_.post(path, body);
        EXPECT_TRUE(r);
        if (!r) return Json();
        EXPECT_EQ(r->status, 200) << r->body;
        return parse(r->body);
    }

    std::vector<Json> post_stream(const std::string& path, const std::string& body, bool* done = nullptr,
                                  std::vector<std::string>* names = nullptr) {
        auto r = server_.post(path, body);
        EXPECT_TRUE(r);
        std::vector<Json> out;
        if (!r) return out;
        EXPECT_EQ(r->status, 200) << r->body;
        std::string err;
        for (const SseEvent& e : parse_sse(r->body, &err)) {
            if (e.data == "[DONE]") {
                if (done) *done = true;
                continue;
            }
            out.push_back(parse(e.data));
            if (names) names->push_back(e.event);
        }
        EXPECT_EQ(err, "");
        return out;
    }

    // A function call's arguments on the Responses API for scripted output `out` and request `body` (without its
    // closing brace): the non-streamed item's, the streamed deltas joined, and the streamed done event's.
    struct ResponsesArguments {
        Json whole;
        std::string deltas;
        Json done;
    };
    ResponsesArguments responses_arguments(const std::string& out, const std::string& body) {
        ResponsesArguments a;
        script(out);
        Json r = post_json("/v1/responses", body + "}");
        EXPECT_EQ(r["output"].size(), 1u) << r.dump();
        if (r["output"].size() == 1) a.whole = r["output"][0]["arguments"];
        script(out);
        std::vector<std::string> names;
        const std::vector<Json> events = post_stream("/v1/responses", body + R"(,"stream":true})", nullptr, &names);
        for (size_t i = 0; i < events.size() && i < names.size(); ++i) {
            if (names[i] == "response.function_call_arguments.delta") a.deltas += events[i]["delta"].get<std::string>();
            if (names[i] == "response.function_call_arguments.done") a.done = events[i]["arguments"];
        }
        return a;
    }

    TestServer server_;
};

const char* kTools = R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";
// Two functions: tool_choice required then forces only `commentary to=functions.` (one function
// forces its whole header).
const char* kTwoTools = R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}])";

TEST_F(GenerationOutputTest, ChatToolCall) {
    script(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
    Json j = post_json("/v1/chat/completions",
                       std::string(R"({"messages":[{"role":"user","content":"Weather in Paris?"}],)") + kTools + "}");
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_TRUE(c["message"]["content"].is_null());
    EXPECT_EQ(c["message"]["reasoning_content"], "Need weather.");
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    const Json& call = c["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    EXPECT_TRUE(call["id"].get<std::string>().rfind("call_", 0) == 0);
    // The developer message declared the function.
    std::string prompt = *test_tokenizer()->decode(server_.engine.last_request().prompt);
    EXPECT_NE(prompt.find("type get_weather = (_: {"), std::string::npos) << prompt;
}

// response_format json_schema: the developer message names the format (HARMONY.md §4.4), the engine
// request carries a constraint that leaves the analysis free and holds the final message to the
// schema, and the JSON answer comes back as the content.
TEST_F(GenerationOutputTest, StructuredOutputsRenderAndConstrainTheFinalMessage) {
    const std::string reply =
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>{\"x\": "
        "1.5}<|return|>";
    script(reply);
    Json j = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"A point?"}],
        "response_format":{"type":"json_schema","json_schema":{"name":"point","description":"A point",
        "schema":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]},"strict":true}}})");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "{\"x\": 1.5}");
    const EngineRequest req = server_.engine.last_request();
    const std::string prompt = *test_tokenizer()->decode(req.prompt);
    EXPECT_NE(prompt.find("<|start|>developer<|message|># Response Formats\n\n## point\n\n// A point\n"
                          "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"required\":[\"x\"]}"
                          "<|end|>"),
              std::string::npos)
        << prompt;
    ASSERT_NE(req.constraint, nullptr);
    // Replaying the scripted reply through the request's constraint: free until the final message,
    // then each token of it allowed, the ones that break the schema not, <|return|> only at the end.
    auto c = req.constraint->start();
    std::vector<uint8_t> mask;
    const std::vector<int32_t> ids = harmony_ids(reply);
    const int32_t ret = *test_tokenizer()->special_token_id("<|return|>");
    bool constrained = false;
    for (int32_t id : ids) {
        const bool masked = c->allowed_next(&mask);
        if (masked) {
            EXPECT_TRUE(mask[static_cast<size_t>(id)]) << id;
            EXPECT_EQ(mask[static_cast<size_t>(ret)] != 0, id == ret);
            if (!constrained) {  // the message's first token: an object opens (or whitespace)
                for (const char* bad : {"}", "\"", "true", "[", "Sure"})
                    for (int32_t b : test_tokenizer()->encode_ordinary(bad))
                        EXPECT_FALSE(mask[static_cast<size_t>(b)]) << bad;
                for (int32_t b : test_tokenizer()->encode_ordinary("{")) EXPECT_TRUE(mask[static_cast<size_t>(b)]);
            }
            constrained = true;
        }
        c->accept(id);
    }
    EXPECT_TRUE(constrained);
    // A preamble (commentary without a recipient) would join the content; with a format it goes to reasoning.
    script(
        "<|channel|>commentary<|message|>One moment.<|end|><|start|>assistant<|channel|>final<|message|>{}<|return|>");
    Json pre = post_json("/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})");
    EXPECT_EQ(pre["choices"][0]["message"]["content"], "{}") << pre.dump();
    EXPECT_EQ(pre["choices"][0]["message"]["reasoning_content"], "One moment.") << pre.dump();
    script(reply);
    // json_object: no section, an object constraint; text: none.
    post_json("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"JSON please"}],"response_format":{"type":"json_object"}})");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    EXPECT_EQ(test_tokenizer()->decode(server_.engine.last_request().prompt)->find("# Response Formats"),
              std::string::npos);
    post_json("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})");
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
    // Responses: text.format json_schema, echoed back.
    Json r = post_json("/v1/responses", R"({"input":"A point?","text":{"format":{"type":"json_schema","name":"point",
        "schema":{"type":"object","properties":{"x":{"type":"number"}}}}}})");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], "{\"x\": 1.5}") << r.dump();
    EXPECT_EQ(r["text"]["format"]["name"], "point");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    EXPECT_NE(test_tokenizer()->decode(server_.engine.last_request().prompt)->find("## point\n\n{\"type\":\"object\""),
              std::string::npos);
}

// A function declared strict: true has its calls' arguments held to its parameters (the request carries
// a constraint; with tool_choice naming it the forced header already opens the arguments); one that is
// not strict adds no constraint; a strict function whose schema cannot be enforced is a 400.
TEST_F(GenerationOutputTest, StrictFunctionsConstrainTheirCalls) {
    const char* strict_tools = R"("tools":[{"type":"function","function":{"name":"get_weather","strict":true,
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";
    script("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
    post_json("/v1/chat/completions",
              std::string(R"({"messages":[{"role":"user","content":"Weather?"}],)") + kTools + "}");
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
    script("{\"city\":\"Paris\"}<|call|>");  // after the forced header
    Json j = post_json("/v1/chat/completions",
                       std::string(R"({"messages":[{"role":"user","content":"Weather?"}],)") + strict_tools +
                           R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
    EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    const EngineRequest req = server_.engine.last_request();
    ASSERT_NE(req.constraint, nullptr);
    auto c = req.constraint->start();
    std::vector<uint8_t> mask;
    ASSERT_TRUE(c->allowed_next(&mask));  // the forced header opened the arguments
    for (int32_t b : test_tokenizer()->encode_ordinary("{\"")) EXPECT_TRUE(mask[static_cast<size_t>(b)]);
    for (int32_t b : test_tokenizer()->encode_ordinary("Sure")) EXPECT_FALSE(mask[static_cast<size_t>(b)]);
    EXPECT_FALSE(mask[static_cast<size_t>(*test_tokenizer()->special_token_id("<|call|>"))]);
    // Responses: a strict function tool.
    post_json("/v1/responses", R"({"input":"Weather?","tools":[{"type":"function","name":"get_weather","strict":true,
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]})");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    Json err = expect_error(server_.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],
        "tools":[{"type":"function","function":{"name":"f","strict":true,
        "parameters":{"type":"object","properties":{"n":{"type":"array","uniqueItems":true}}}}}]})"),
                            400);
    EXPECT_EQ(err["param"], "tools[0].function.parameters") << err.dump();
    err = expect_error(server_.post("/v1/responses", R"({"input":"x","tools":[{"type":"function","name":"f",
        "strict":true,"parameters":{"type":"object","properties":{"n":{"pattern":"a"}}}}]})"),
                       400);
    EXPECT_EQ(err["param"], "tools[0].parameters") << err.dump();
}

// A call that tool_choice forces (a named function, or "required") has its arguments held to the function's
// parameters as vLLM's guided decoding holds them, strict or not: a client can parse them. With "auto" nothing is
// held; a schema that cannot be enforced leaves the forced call free (no 400: only strict asks for the schema).
TEST_F(GenerationOutputTest, ForcedCallsHoldTheirArgumentsToTheSchema) {
    const std::string user = R"({"messages":[{"role":"user","content":"Weather?"}],)";
    auto opens_arguments = [&](const EngineRequest& req) {
        EXPECT_NE(req.constraint, nullptr);
        if (req.constraint == nullptr) return;
        auto c = req.constraint->start();
        std::vector<uint8_t> mask;
        ASSERT_TRUE(c->allowed_next(&mask));  // the forced header opened the arguments
        for (int32_t b : test_tokenizer()->encode_ordinary("{\"")) EXPECT_TRUE(mask[static_cast<size_t>(b)]);
        for (int32_t b : test_tokenizer()->encode_ordinary("Sure")) EXPECT_FALSE(mask[static_cast<size_t>(b)]);
    };
    script("{\"city\":\"Paris\"}<|call|>");  // after the forced header
    Json j = post_json("/v1/chat/completions",
                       user + kTools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
    EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    opens_arguments(server_.engine.last_request());
    post_json("/v1/responses", R"({"input":"Weather?","tools":[{"type":"function","name":"get_weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
        "tool_choice":{"type":"function","name":"get_weather"}})");
    opens_arguments(server_.engine.last_request());
    // "required" with one function forces its whole header, so the arguments open at once too.
    post_json("/v1/chat/completions", user + kTools + R"(,"tool_choice":"required"})");
    opens_arguments(server_.engine.last_request());
    // "required" with two: each declared function's calls are held (the model writes the name first).
    script("get_time <|constrain|>json<|message|>{}<|call|>");
    post_json("/v1/chat/completions", user + kTwoTools + R"(,"tool_choice":"required"})");
    ASSERT_NE(server_.engine.last_request().constraint, nullptr);
    {
        // The name it writes is a declared function's (it could be any text, and never end).
        auto c = server_.engine.last_request().constraint->start();
        std::vector<uint8_t> mask;
        ASSERT_TRUE(c->allowed_next(&mask));
        EXPECT_TRUE(mask[static_cast<size_t>(test_tokenizer()->encode_ordinary("get_time")[0])]);
        EXPECT_FALSE(mask[static_cast<size_t>(test_tokenizer()->encode_ordinary("Sure")[0])]);
    }
    // auto and none: free.
    script("<|channel|>final<|message|>Sunny.<|return|>");
    post_json("/v1/chat/completions", user + kTools + R"(,"tool_choice":"auto"})");
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
    post_json("/v1/chat/completions", user + kTools + R"(,"tool_choice":"none"})");
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
    // A schema the constraint cannot enforce (uniqueItems), not strict: the forced call runs free, no 400.
    script("{\"n\":[1]}<|call|>");
    post_json("/v1/chat/completions", user + R"("tools":[{"type":"function","function":{"name":"f",
        "parameters":{"type":"object","properties":{"n":{"type":"array","uniqueItems":true}}}}}],
        "tool_choice":{"type":"function","function":{"name":"f"}}})");
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
}

TEST_F(GenerationOutputTest, ChatToolCallStreamed) {
    script("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
    bool done = false;
    std::vector<Json> chunks = post_stream(
        "/v1/chat/completions",
        std::string(R"({"messages":[{"role":"user","content":"Weather?"}],"stream":true,)") + kTools + "}", &done);
    EXPECT_TRUE(done);
    std::string args, name, id, finish;
    for (const Json& ch : chunks) {
        const Json& choice = ch["choices"][0];
        if (choice["delta"].contains("tool_calls")) {
            const Json& tc = choice["delta"]["tool_calls"][0];
            EXPECT_EQ(tc["index"], 0);
            if (tc.contains("id")) {
                id = tc["id"];
                name = tc["function"]["name"];
                EXPECT_EQ(tc["type"], "function");
            }
            args += tc["function"]["arguments"].get<std::string>();
        }
        EXPECT_FALSE(choice["delta"].contains("reasoning_content"));
        if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_FALSE(id.empty());
    EXPECT_EQ(args, "{\"city\":\"Paris\"}");
    EXPECT_EQ(finish, "tool_calls");
}

TEST_F(GenerationOutputTest, ToolResultsInHistoryAreRendered) {
    script("<|channel|>final<|message|>It is sunny.<|return|>");
    Json j = post_json("/v1/chat/completions", std::string(R"({"messages":[
        {"role":"system","content":"Be brief."},
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
            "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"{\"sky\":\"sunny\"}"}],)") +
                                                   kTools + "}");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "It is sunny.");
    std::string prompt = *test_tokenizer()->decode(server_.engine.last_request().prompt);
    EXPECT_NE(prompt.find("<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
                          "<|message|>{\"city\":\"Paris\"}<|call|>"),
              std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                          "{\"sky\":\"sunny\"}<|end|>"),
              std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("# Instructions\n\nBe brief."), std::string::npos);
}

TEST_F(GenerationOutputTest, ReasoningEffortAndToolChoiceNoneReachThePrompt) {
    script("<|channel|>final<|message|>ok<|return|>");
    post_json("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"x"}],
        "reasoning_effort":"high","tool_choice":"none",)") +
                                          kTools + "}");
    std::string prompt = *test_tokenizer()->decode(server_.engine.last_request().prompt);
    EXPECT_NE(prompt.find("Reasoning: high"), std::string::npos);
    EXPECT_EQ(prompt.find("get_weather"), std::string::npos);  // tool_choice none: no tools rendered
}

TEST_F(GenerationOutputTest, MalformedOutputNeverFailsTheRequest) {
    const char* outputs[] = {
        "I must refuse<|end|>",                                      // header without <|message|>
        "<|channel|>commentary?\?<|message|>text<|end|><|return|>",  // garbage channel, stray stop
        "<|message|><|message|><|start|><|start|>",                  // nonsense
        "<|channel|>final<|message|>\xf0\x9f",                       // truncated UTF-8
        "",                                                          // nothing at all
        "<|channel|>final<|message|>partial answer",                 // no terminator
        "<|channel|>analysis to=functions.unknown_fn code<|message|>{}<|call|>",
    };
    for (const char* out : outputs) {
        SCOPED_TRACE(out);
        script(out);
        Json j = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50})");
        ASSERT_TRUE(j.contains("choices"));
        EXPECT_TRUE(j["choices"][0]["message"].is_object());
        bool done = false;
        post_stream("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50,"stream":true})", &done);
        EXPECT_TRUE(done);
        post_json("/v1/responses", R"({"input":"x","max_output_tokens":50})");
    }
    EXPECT_TRUE(server_.wait_engine_idle());
}

TEST_F(GenerationOutputTest, StreamedEqualsNonStreamed) {
    script(
        "<|channel|>analysis<|message|>Plan: greet.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Preamble.<|end|><|start|>assistant<|channel|>final<|message|>Hi! 💖 ünïcödé<|return|>");
    Json whole = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
    std::vector<Json> chunks =
        post_stream("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
    std::string content, reasoning;
    for (const Json& ch : chunks) {
        const Json& d = ch["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    }
    EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
    EXPECT_EQ(reasoning, whole["choices"][0]["message"]["reasoning_content"]);
    EXPECT_EQ(content, "Preamble.\nHi! 💖 ünïcödé");
}

TEST_F(GenerationOutputTest, StopStringsCutFinalContentOnly) {
    script(
        "<|channel|>analysis<|message|>I will say END soon.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Alpha beta END gamma delta<|return|>");
    Json j = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":["END"]})");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Alpha beta ");
    EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "I will say END soon.");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    std::vector<Json> chunks = post_stream(
        "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":"END","stream":true})");
    std::string content;
    for (const Json& ch : chunks) {
        const Json& d = ch["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
    }
    EXPECT_EQ(content, "Alpha beta ");
    EXPECT_TRUE(server_.wait_engine_idle());
}

TEST_F(GenerationOutputTest, ChatLogprobsCoverContentTokens) {
    script(
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hello world<|return|>");
    Json j = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2})");
    const Json& lp = j["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), harmony_ids("Hello world").size());
    std::string text;
    for (const Json& e : lp) {
        text += e["token"].get<std::string>();
        EXPECT_TRUE(e["logprob"].is_number());
        EXPECT_TRUE(e["bytes"].is_array());
        EXPECT_EQ(e["top_logprobs"].size(), 2u);
    }
    EXPECT_EQ(text, "Hello world");

    // Streamed: each chunk's logprobs are the tokens of its own content (they rode one chunk late: the
    // first content chunk had none and the finish chunk, with no content, had the last token's).
    std::vector<Json> chunks = post_stream(
        "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"stream":true})");
    size_t entries = 0;
    for (const Json& c : chunks) {
        if (c["choices"].empty()) continue;
        const Json& choice = c["choices"][0];
        const std::string content = choice["delta"].value("content", std::string());
        std::string tokens;
        if (choice["logprobs"].is_object()) {
            for (const Json& e : choice["logprobs"]["content"]) tokens += e["token"].get<std::string>();
            entries += choice["logprobs"]["content"].size();
        }
        EXPECT_EQ(tokens, content) << c.dump();
    }
    EXPECT_EQ(entries, lp.size());
}

// vLLM's return_tokens_as_token_ids (tokens named "token_id:<id>", on chat and completions) and include_reasoning
// (false: no reasoning_content in the answer or its stream; the reasoning tokens still counted).
TEST_F(GenerationOutputTest, TokensAsIdsAndIncludeReasoning) {
    script(
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hello world<|return|>");
    Json j = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,)"
                                               R"("top_logprobs":1,"return_tokens_as_token_ids":true})");
    const Json& lp = j["choices"][0]["logprobs"]["content"];
    const std::vector<int32_t> ids = harmony_ids("Hello world");
    ASSERT_EQ(lp.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::string name = "token_id:" + std::to_string(ids[i]);
        EXPECT_EQ(lp[i]["token"], name);
        EXPECT_EQ(lp[i]["bytes"].size(), name.size());
        EXPECT_EQ(lp[i]["top_logprobs"][0]["token"].get<std::string>().rfind("token_id:", 0), 0u);
    }
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
    EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "hmm");

    Json hidden =
        post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"include_reasoning":false})");
    EXPECT_TRUE(hidden["choices"][0]["message"]["reasoning_content"].is_null()) << hidden.dump();
    EXPECT_EQ(hidden["choices"][0]["message"]["content"], "Hello world");
    EXPECT_GT(hidden["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
    for (const Json& c : post_stream("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)"
                                                             R"("include_reasoning":false,"stream":true})"))
        if (!c["choices"].empty()) {
            EXPECT_FALSE(c["choices"][0]["delta"].contains("reasoning_content")) << c.dump();
        }
    EXPECT_EQ(expect_error(server_.post("/v1/chat/completions",
                                        R"({"messages":[{"role":"user","content":"x"}],"include_reasoning":1})"),
                           400)["param"],
              "include_reasoning");

    std::vector<int32_t> answer = harmony_ids(" jumps over");
    answer.push_back(200002);
    server_.engine.set_script([answer](const EngineRequest&) { return answer; });
    Json c = post_json("/v1/completions",
                       R"({"prompt":"The fox","logprobs":1,"max_tokens":9,"return_tokens_as_token_ids":true})");
    const Json& clp = c["choices"][0]["logprobs"];
    ASSERT_EQ(clp["tokens"].size(), answer.size());
    for (size_t i = 0; i < answer.size(); ++i) {
        const std::string name = "token_id:" + std::to_string(answer[i]);
        EXPECT_EQ(clp["tokens"][i], name);
        EXPECT_EQ(clp["top_logprobs"][i][name], clp["token_logprobs"][i]);
    }
    EXPECT_EQ(c["choices"][0]["text"], " jumps over");
}

// vLLM's return_token_ids: the chat answer's prompt_token_ids (once, for n choices too) and each choice's
// token_ids (every token drawn, the <|return|> that ended it included), whole and streamed (prompt_token_ids in the
// first chunk, token_ids spread over the chunks); completions give both in each choice. Not asked: no such keys.
TEST_F(GenerationOutputTest, ReturnTokenIds) {
    const std::string text =
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hello world<|return|>";
    const std::vector<int32_t> ids = harmony_ids(text);
    script(text);
    Json j = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"return_token_ids":true,"n":2})");
    const std::vector<int32_t> prompt = server_.engine.last_request().prompt;
    ASSERT_FALSE(prompt.empty());
    EXPECT_EQ(j["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
    ASSERT_EQ(j["choices"].size(), 2u);
    for (const Json& c : j["choices"]) EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), ids) << c.dump();
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");

    std::vector<int32_t> streamed;
    int with_prompt = 0;
    const std::vector<Json> chunks =
        post_stream("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"return_token_ids":true,"stream":true})");
    ASSERT_FALSE(chunks.empty());
    EXPECT_EQ(chunks.front()["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
    for (const Json& c : chunks) {
        with_prompt += c.contains("prompt_token_ids");
        for (const Json& ch : c["choices"])
            for (const Json& id : ch["token_ids"]) streamed.push_back(id.get<int32_t>());
    }
    EXPECT_EQ(with_prompt, 1);
    EXPECT_EQ(streamed, ids);

    Json plain = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
    EXPECT_FALSE(plain.contains("prompt_token_ids"));
    EXPECT_FALSE(plain["choices"][0].contains("token_ids"));
    for (const Json& c : post_stream("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)"
                                                             R"("stream":true})")) {
        EXPECT_FALSE(c.contains("prompt_token_ids"));
        for (const Json& ch : c["choices"]) EXPECT_FALSE(ch.contains("token_ids")) << c.dump();
    }

    std::vector<int32_t> answer = harmony_ids(" jumps over");
    answer.push_back(200002);
    server_.engine.set_script([answer](const EngineRequest&) { return answer; });
    Json c = post_json("/v1/completions", R"({"prompt":"The fox","max_tokens":9,"return_token_ids":true})");
    const std::vector<int32_t> fox = harmony_ids("The fox");
    EXPECT_EQ(c["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), fox);
    EXPECT_EQ(c["choices"][0]["token_ids"].get<std::vector<int32_t>>(), answer);
    EXPECT_EQ(c["choices"][0]["text"], " jumps over");
    streamed.clear();
    with_prompt = 0;
    for (const Json& k : post_stream("/v1/completions",
                                     R"({"prompt":"The fox","max_tokens":9,"return_token_ids":true,"stream":true})")) {
        for (const Json& ch : k["choices"]) {
            if (ch.contains("prompt_token_ids")) {
                ++with_prompt;
                EXPECT_EQ(ch["prompt_token_ids"].get<std::vector<int32_t>>(), fox);
            }
            for (const Json& id : ch["token_ids"]) streamed.push_back(id.get<int32_t>());
        }
    }
    EXPECT_EQ(with_prompt, 1);
    EXPECT_EQ(streamed, answer);
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
        const std::string body = std::string(path) == "/v1/completions"
                                     ? R"({"prompt":"x","return_token_ids":"yes"})"
                                     : R"({"messages":[{"role":"user","content":"x"}],"return_token_ids":"yes"})";
        EXPECT_EQ(expect_error(server_.post(path, body), 400)["param"], "return_token_ids") << path;
    }
}

// vLLM's continue_final_message: the last message, the assistant's, is rendered open (its header and text, no
// <|end|>) and the model continues it; the answer holds the continuation alone (with vLLM's echo, the text before
// it too), whole and streamed alike. Reasoning alone continues the analysis message; reasoning with content closes
// it and continues the final one. /tokenize renders the same prompt. Misuse is a 400 naming the field.
TEST_F(GenerationOutputTest, ContinueFinalMessage) {
    const std::string user = R"({"role":"user","content":"What is six times seven?"})";
    auto body = [&](const std::string& last, const std::string& extra = "") {
        return R"({"messages":[)" + user + "," + last +
               R"(],"continue_final_message":true,"add_generation_prompt":false)" + extra + "}";
    };
    auto ends_with = [](const std::vector<int32_t>& ids, const std::vector<int32_t>& tail) {
        return ids.size() >= tail.size() && std::equal(tail.begin(), tail.end(), ids.end() - tail.size());
    };
    script(" 42.<|return|>");
    const std::string final_only = R"({"role":"assistant","content":"The answer is"})";
    Json j = post_json("/v1/chat/completions", body(final_only));
    EXPECT_EQ(j["choices"][0]["message"]["content"], " 42.") << j.dump();
    EXPECT_TRUE(j["choices"][0]["message"]["reasoning_content"].is_null());
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    const std::vector<int32_t> prompt = server_.engine.last_request().prompt;
    EXPECT_TRUE(ends_with(prompt, harmony_ids("<|start|>assistant<|channel|>final<|message|>The answer is")));
    Json t = post_json("/tokenize", body(final_only));
    EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), prompt);
    Json echoed = post_json("/v1/chat/completions", body(final_only, R"(,"echo":true)"));
    EXPECT_EQ(echoed["choices"][0]["message"]["content"], "The answer is 42.");
    for (bool echo : {false, true}) {
        std::string streamed;
        for (const Json& c : post_stream("/v1/chat/completions", body(final_only, echo ? R"(,"stream":true,"echo":true)"
                                                                                       : R"(,"stream":true)")))
            for (const Json& ch : c["choices"])
                if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
        EXPECT_EQ(streamed, echo ? "The answer is 42." : " 42.");
    }

    // Reasoning alone: the analysis message continues, then the model answers.
    script(" so 42.<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>");
    Json r = post_json("/v1/chat/completions", body(R"({"role":"assistant","reasoning_content":"6 x 7 is 42"})"));
    EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], " so 42.") << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"], "42");
    EXPECT_TRUE(ends_with(server_.engine.last_request().prompt,
                          harmony_ids("<|start|>assistant<|channel|>analysis<|message|>6 x 7 is 42")));
    // A stop string applies to what is generated, not to the echoed text (nor across the two).
    script(" there, 42.<|return|>");
    const std::string with_stop = R"({"role":"assistant","content":"Hello STOP"})";
    Json stopped = post_json("/v1/chat/completions", body(with_stop, R"(,"echo":true,"stop":["STOP there","42"])"));
    EXPECT_EQ(stopped["choices"][0]["message"]["content"], "Hello STOP there, ") << stopped.dump();
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
    std::string streamed_stop;
    for (const Json& c : post_stream("/v1/chat/completions",
                                     body(with_stop, R"(,"echo":true,"stop":["STOP there","42"],"stream":true)")))
        for (const Json& ch : c["choices"])
            if (ch["delta"].contains("content")) streamed_stop += ch["delta"]["content"].get<std::string>();
    EXPECT_EQ(streamed_stop, "Hello STOP there, ");
    // Reasoning with content "" (as clients send for none) continues the reasoning.
    script(" more<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>");
    Json empty =
        post_json("/v1/chat/completions", body(R"({"role":"assistant","reasoning_content":"hm","content":""})"));
    EXPECT_EQ(empty["choices"][0]["message"]["reasoning_content"], " more") << empty.dump();
    EXPECT_TRUE(ends_with(server_.engine.last_request().prompt,
                          harmony_ids("<|start|>assistant<|channel|>analysis<|message|>hm")));
    // Reasoning and content: the analysis closed, the final message continued.
    script(" 42<|return|>");
    Json both =
        post_json("/v1/chat/completions",
                  body(R"({"role":"assistant","reasoning":"Easy.","content":[{"type":"text","text":"It is"}]})"));
    EXPECT_EQ(both["choices"][0]["message"]["content"], " 42");
    EXPECT_TRUE(both["choices"][0]["message"]["reasoning_content"].is_null()) << both.dump();
    EXPECT_TRUE(ends_with(server_.engine.last_request().prompt,
                          harmony_ids("<|start|>assistant<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
                                      "<|channel|>final<|message|>It is")));

    auto param_of = [&](const std::string& b) {
        return expect_error(server_.post("/v1/chat/completions", b), 400)["param"];
    };
    EXPECT_EQ(param_of(R"({"messages":[)" + user + R"(],"continue_final_message":true})"), "messages[0].role");
    EXPECT_EQ(
        param_of(
            R"({"messages":[)" + user +
            R"(,{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}],"continue_final_message":true})"),
        "messages[1].tool_calls");
    EXPECT_EQ(param_of(R"({"messages":[)" + user + "," + final_only +
                       R"(],"continue_final_message":true,"add_generation_prompt":true})"),
              "add_generation_prompt");
    EXPECT_EQ(param_of(R"({"messages":[)" + user + R"(],"add_generation_prompt":false})"), "add_generation_prompt");
    EXPECT_EQ(param_of(body(final_only, R"(,"response_format":{"type":"json_object"})")), "continue_final_message");
    EXPECT_EQ(param_of(R"({"messages":[)" + user + "," + final_only + R"(],"continue_final_message":1})"),
              "continue_final_message");
    EXPECT_EQ(param_of(body(final_only, std::string(",") + kTools + R"(,"tool_choice":"required")")),
              "continue_final_message");
    // /tokenize checks the same.
    EXPECT_EQ(
        expect_error(server_.post("/tokenize", R"({"messages":[)" + user + "," + final_only +
                                                   R"(],"continue_final_message":true,"add_generation_prompt":true})"),
                     400)["param"],
        "add_generation_prompt");
}

// vLLM's cache_salt reaches the engine from every endpoint (runtime tests check what it does there); an empty or
// non-string salt is a 400 naming it.
TEST_F(GenerationOutputTest, CacheSaltReachesTheEngine) {
    script("<|channel|>final<|message|>Hi<|return|>");
    const std::vector<std::pair<std::string, std::string>> requests = {
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"cache_salt":"s1")"},
        {"/v1/completions", R"({"prompt":"x","cache_salt":"s2")"},
        {"/v1/responses", R"({"input":"x","store":false,"cache_salt":"s3")"}};
    for (size_t i = 0; i < requests.size(); ++i) {
        const auto& [path, body] = requests[i];
        post_json(path, body + "}");
        const char* want[] = {"s1", "s2", "s3"};
        EXPECT_EQ(server_.engine.last_request().cache_salt, want[i]) << path;
        for (const char* bad : {R"(,"cache_salt":"")", R"(,"cache_salt":7)"}) {
            const std::string b = body.substr(0, body.find(R"(,"cache_salt")")) + bad + "}";
            EXPECT_EQ(expect_error(server_.post(path, b), 400)["param"], "cache_salt") << path << " " << b;
        }
    }
    post_json("/v1/completions", R"({"prompt":"x"})");
    EXPECT_EQ(server_.engine.last_request().cache_salt, "");
}

// vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's usage so far
// (its prompt, its completion tokens never decreasing; as vLLM's), the choices' last summing to the final usage
// chunk's; without it the chunks' usage stays null.
TEST_F(GenerationOutputTest, ContinuousUsageStats) {
    script(
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hello world<|return|>");
    const std::string chat = R"({"messages":[{"role":"user","content":"x"}],"stream":true,"n":2,)";
    const std::string completion = R"({"prompt":"x","max_tokens":9,"stream":true,"n":2,)";
    for (const std::string& prefix : {chat, completion}) {
        const std::string path = prefix == chat ? "/v1/chat/completions" : "/v1/completions";
        SCOPED_TRACE(path);
        const std::vector<Json> chunks =
            post_stream(path, prefix + R"("stream_options":{"include_usage":true,"continuous_usage_stats":true}})");
        ASSERT_GE(chunks.size(), 3u);
        const Json& final_usage = chunks.back()["usage"];
        ASSERT_TRUE(chunks.back()["choices"].empty());
        std::map<int, int64_t> last;  // by choice
        for (size_t i = 0; i + 1 < chunks.size(); ++i) {
            const Json& u = chunks[i]["usage"];
            ASSERT_TRUE(u.is_object()) << chunks[i].dump();
            ASSERT_EQ(chunks[i]["choices"].size(), 1u);
            const int index = chunks[i]["choices"][0]["index"].get<int>();
            EXPECT_EQ(u["prompt_tokens"], final_usage["prompt_tokens"]);  // one prompt: the choice's own usage
            const int64_t now = u["completion_tokens"].get<int64_t>();
            EXPECT_GE(now, last.count(index) ? last[index] : 0);
            EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int64_t>() + now);
            last[index] = now;
        }
        ASSERT_EQ(last.size(), 2u);
        EXPECT_EQ(last[0] + last[1], final_usage["completion_tokens"].get<int64_t>());
        for (const Json& c : post_stream(path, prefix + R"("stream_options":{"include_usage":true}})"))
            if (!c["choices"].empty()) {
                EXPECT_TRUE(c["usage"].is_null()) << c.dump();
            }
    }
}

// vLLM's request_id names the answer: "chatcmpl-<id>" / "cmpl-<id>", whole and in every chunk (n choices too); an
// empty, overlong or non-string one is a 400 naming it.
TEST_F(GenerationOutputTest, RequestIdNamesTheAnswer) {
    script("<|channel|>final<|message|>Hi<|return|>");
    const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":2,)", "chatcmpl-req-42"},
        {"/v1/completions", R"({"prompt":"x","max_tokens":4,"n":2,)", "cmpl-req-42"}};
    for (const auto& [path, prefix, want] : cases) {
        EXPECT_EQ(post_json(path, prefix + R"("request_id":"req-42"})")["id"], want) << path;
        for (const Json& c : post_stream(path, prefix + R"("request_id":"req-42","stream":true})"))
            EXPECT_EQ(c["id"], want) << path;
        EXPECT_NE(post_json(path, prefix + R"("stream":false})")["id"], want);
        const std::string overlong = "\"" + std::string(257, 'a') + "\"";
        for (const std::string& bad : {std::string(R"("")"), std::string("5"), overlong})
            EXPECT_EQ(expect_error(server_.post(path, prefix + R"("request_id":)" + bad + "}"), 400)["param"],
                      "request_id")
                << path << bad;
    }
}

// On the Responses API the request_id is the response's id itself (vLLM's default is "resp_<uuid>"): in the answer,
// in every streamed event's response, and as the stored response's key; a second request with a stored response's
// id is a 400 (it would replace that response), a bad one too.
TEST_F(GenerationOutputTest, ResponsesRequestIdIsTheResponseId) {
    script("<|channel|>final<|message|>Hi<|return|>");
    Json r = post_json("/v1/responses", R"({"input":"x","request_id":"resp_mine-1"})");
    EXPECT_EQ(r["id"], "resp_mine-1");
    auto stored = server_.get("/v1/responses/resp_mine-1");
    ASSERT_TRUE(stored);
    EXPECT_EQ(stored->status, 200) << stored->body;
    EXPECT_EQ(parse(stored->body)["id"], "resp_mine-1");
    Json again = expect_error(server_.post("/v1/responses", R"({"input":"y","request_id":"resp_mine-1"})"), 400);
    EXPECT_EQ(again["param"], "request_id");
    EXPECT_EQ(parse(server_.get("/v1/responses/resp_mine-1")->body)["output"], r["output"]);  // not replaced
    int events = 0;
    for (const Json& e : post_stream("/v1/responses", R"({"input":"x","request_id":"other","stream":true})"))
        if (e.contains("response")) {
            EXPECT_EQ(e["response"]["id"], "other");
            ++events;
        }
    EXPECT_GE(events, 3);
    // store: false keeps nothing, so the same id may come again
    for (int i = 0; i < 2; ++i)
        EXPECT_EQ(post_json("/v1/responses", R"({"input":"x","request_id":"unstored","store":false})")["id"],
                  "unstored");
    EXPECT_NE(post_json("/v1/responses", R"({"input":"x"})")["id"], "resp_mine-1");
    // An id that could not name the response in a URL (GET /v1/responses/{id}) is refused.
    for (const char* bad : {"a/b", "input_tokens", "sp ace", "a%2Fb", "q?x"})
        EXPECT_EQ(
            expect_error(server_.post("/v1/responses", std::string(R"({"input":"x","request_id":")") + bad + "\"}"),
                         400)["param"],
            "request_id")
            << bad;
    // One being made holds its id too: a second request with it, stored or background, is refused while the first
    // runs (it would have replaced the first in the store), and the first is stored whole.
    server_.engine.set_paused(true);
    auto first = std::async(std::launch::async,
                            [&] { return server_.post("/v1/responses", R"({"input":"one","request_id":"held"})"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (const char* extra : {"", R"(,"background":true)"})
        EXPECT_EQ(expect_error(
                      server_.post("/v1/responses", std::string(R"({"input":"two","request_id":"held")") + extra + "}"),
                      400)["param"],
                  "request_id")
            << extra;
    server_.engine.set_paused(false);
    auto made = first.get();
    ASSERT_TRUE(made);
    EXPECT_EQ(made->status, 200) << made->body;
    EXPECT_EQ(parse(server_.get("/v1/responses/held")->body)["output"], parse(made->body)["output"]);
    for (const std::string& bad : {std::string(R"("")"), std::string("5"), "\"" + std::string(257, 'a') + "\""})
        EXPECT_EQ(
            expect_error(server_.post("/v1/responses", R"({"input":"x","request_id":)" + bad + "}"), 400)["param"],
            "request_id")
            << bad;
}

// A byte-level token (a token whose bytes only start a UTF-8 character) has its logprobs entry like any other:
// chat's content entries are one a generated content token (the entry of a character's first byte rides with the
// text that completes it, streamed or not), the Responses output_text's too, and a completion's text_offset after a
// byte that never became a character counts the U+FFFD it became.
TEST_F(GenerationOutputTest, ByteTokensKeepTheirLogprobsEntries) {
    const auto byte_token = [](unsigned char b) {
        for (int32_t id = 0; id < 4096; ++id)
            if (test_tokenizer()->token_bytes(id) == std::string(1, static_cast<char>(b))) return id;
        ADD_FAILURE() << "no token for byte " << int{b};
        return int32_t{0};
    };
    const int32_t df = byte_token(0xDF), x92 = byte_token(0x92);  // "\xDF\x92" is U+07D2
    std::vector<int32_t> ids = harmony_ids("<|channel|>final<|message|>Hi");
    const size_t first = ids.size() - 1;                 // "Hi"
    for (int32_t id : {df, x92, df}) ids.push_back(id);  // a whole character, then a byte that never completes
    for (int32_t id : harmony_ids(" there<|return|>")) ids.push_back(id);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    const std::vector<int32_t> content(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end() - 1);

    Json r = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1})");
    const std::string text = r["choices"][0]["message"]["content"];
    EXPECT_EQ(text, "Hi\xDF\x92\xEF\xBF\xBD there");
    const Json& lp = r["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), content.size()) << lp.dump();
    std::string bytes;
    for (const Json& e : lp)
        for (const Json& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, "Hi\xDF\x92\xDF there");
    EXPECT_EQ(lp[1]["bytes"], Json::array({0xDF}));
    size_t streamed = 0;
    for (const Json& c : post_stream("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)"
                                                             R"("logprobs":true,"stream":true})"))
        for (const Json& ch : c["choices"])
            if (ch["logprobs"].is_object()) streamed += ch["logprobs"]["content"].size();
    EXPECT_EQ(streamed, content.size());

    Json resp = post_json("/v1/responses", R"({"input":"x","top_logprobs":1})");
    ASSERT_FALSE(resp["output"].empty()) << resp.dump();
    const Json& part = resp["output"].back()["content"][0];
    EXPECT_EQ(part["text"], text);
    EXPECT_EQ(part["logprobs"].size(), content.size()) << part.dump();
    size_t delta_entries = 0;
    for (const SseEvent& e :
         parse_sse(server_.post("/v1/responses", R"({"input":"x","stream":true,"top_logprobs":1})")->body))
        if (e.event == "response.output_text.delta") delta_entries += parse(e.data)["logprobs"].size();
    EXPECT_EQ(delta_entries, content.size());

    // A byte cut by the terminator: its entry, none for the terminator (whose step carries the U+FFFD).
    for (const char* end : {"<|return|>", "<|end|>"}) {
        std::vector<int32_t> cut = harmony_ids("<|channel|>final<|message|>Hi");
        cut.push_back(df);
        for (int32_t id : harmony_ids(end)) cut.push_back(id);
        server_.engine.set_script([cut](const EngineRequest&) { return cut; });
        Json rc = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})");
        EXPECT_EQ(rc["choices"][0]["logprobs"]["content"].size(), 2u) << end << rc.dump();
        Json rr = post_json("/v1/responses", R"({"input":"x","top_logprobs":1})");
        EXPECT_EQ(rr["output"].back()["content"][0]["logprobs"].size(), 2u) << end << rr.dump();
    }
    // A continued message whose first generated token starts a character (the forced start is not the token's).
    const std::vector<int32_t> cont = {df, x92, harmony_ids(" there<|return|>")[0], harmony_ids("<|return|>")[0]};
    server_.engine.set_script([cont](const EngineRequest&) { return cont; });
    Json rk = post_json("/v1/chat/completions",
                        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"The"}],)"
                        R"("continue_final_message":true,"add_generation_prompt":false,"logprobs":true})");
    EXPECT_EQ(rk["choices"][0]["logprobs"]["content"].size(), 3u) << rk.dump();

    // Completions: "Hi" "\xDF" "\x92" "\xDF" " there": offsets 0, 2, 2, 3, 4 (the lone byte is one U+FFFD).
    server_.engine.set_script([ids, first](const EngineRequest&) {
        return std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end() - 1);
    });
    Json c = post_json("/v1/completions", R"({"prompt":"x","max_tokens":10,"logprobs":0})");
    EXPECT_EQ(c["choices"][0]["text"], "Hi\xDF\x92\xEF\xBF\xBD there");
    const Json& off = c["choices"][0]["logprobs"]["text_offset"];
    ASSERT_EQ(off.size(), content.size()) << c.dump();
    EXPECT_EQ(off[0], 0);
    EXPECT_EQ(off[1], 2);
    EXPECT_EQ(off[2], 2);
    EXPECT_EQ(off[3], 3);
    EXPECT_EQ(off[4], 4);
    // Echo of a prompt that ends inside a character: the echoed prompt is decoded alone ("Hi" U+FFFD), the
    // generated "\x92" is a U+FFFD of its own: offsets 0, 2 (prompt), 3, 4.
    std::vector<int32_t> gen = {x92};
    for (int32_t id : harmony_ids(" x")) gen.push_back(id);
    server_.engine.set_script([gen](const EngineRequest&) { return gen; });
    const std::string hi = std::to_string(harmony_ids("Hi")[0]);
    Json e = post_json("/v1/completions", R"({"prompt":[)" + hi + "," + std::to_string(df) +
                                              R"(],"max_tokens":5,"logprobs":0,"echo":true})");
    EXPECT_EQ(e["choices"][0]["text"], "Hi\xEF\xBF\xBD\xEF\xBF\xBD x");
    EXPECT_EQ(e["choices"][0]["logprobs"]["text_offset"], Json::array({0, 2, 3, 4})) << e.dump();
}

// vLLM's skip_special_tokens on completions: the text leaves out Harmony's special tokens (shown by default, so
// that the output parses as Harmony), streamed alike; logprobs entries still name them, and the text offsets
// count only the text shown.
// A reserved id the tokenizer file does not list (200500: tokenizer.json stops at 200018) is special too, as tiktoken
// counts it: shown by its Harmony name, left out with skip_special_tokens, and a stop string that spells it cannot
// match the text shown.
TEST_F(GenerationOutputTest, CompletionsSkipSpecialTokens) {
    std::vector<int32_t> ids = harmony_ids("<|channel|>final<|message|>Hi there<|end|><|start|>x");
    ASSERT_FALSE(test_tokenizer()->token_bytes(200500).has_value());
    ids.push_back(200500);
    ids.push_back(harmony_ids("<|return|>")[0]);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    Json shown = post_json("/v1/completions", R"({"prompt":"The fox","max_tokens":20})");
    EXPECT_EQ(shown["choices"][0]["text"], "<|channel|>final<|message|>Hi there<|end|><|start|>x<|reserved_200500|>");
    Json skipped =
        post_json("/v1/completions", R"({"prompt":"The fox","max_tokens":20,"skip_special_tokens":true,"logprobs":0})");
    EXPECT_EQ(skipped["choices"][0]["text"], "finalHi therex");
    const Json& lp = skipped["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), ids.size());
    EXPECT_EQ(lp["tokens"][0], "<|channel|>");
    EXPECT_EQ(lp["tokens"][ids.size() - 2], "<|reserved_200500|>");
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(lp["text_offset"][i], static_cast<int64_t>(text.size())) << i;
        if (!is_special_token(*test_tokenizer(), ids[i])) text += lp["tokens"][i].get<std::string>();
    }
    std::string streamed;
    for (const Json& k : post_stream(
             "/v1/completions", R"({"prompt":"The fox","max_tokens":20,"skip_special_tokens":true,"stream":true})"))
        for (const Json& ch : k["choices"]) streamed += ch["text"].get<std::string>();
    EXPECT_EQ(streamed, "finalHi therex");
    Json stop = post_json("/v1/completions", R"({"prompt":"The fox","max_tokens":20,"skip_special_tokens":true,)"
                                             R"("stop":["x<|reserved_200500|>"],"include_stop_str_in_output":true})");
    EXPECT_EQ(stop["choices"][0]["text"], "finalHi therex");
    EXPECT_EQ(stop["choices"][0]["finish_reason"], "stop");
    EXPECT_TRUE(stop["choices"][0]["stop_reason"].is_null()) << stop.dump();
    EXPECT_EQ(expect_error(server_.post("/v1/completions", R"({"prompt":"x","skip_special_tokens":1})"), 400)["param"],
              "skip_special_tokens");
}

// Responses logprobs (top_logprobs, include message.output_text.logprobs): the output_text part carries an entry per
// token of its text (none for the reasoning or the headers); streamed, each output_text delta carries its own
// token's, and the done events all of them.
TEST_F(GenerationOutputTest, ResponsesLogprobsCoverOutputTextTokens) {
    script(
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Hello world<|return|>");
    for (const char* ask : {R"("top_logprobs":2)", R"("include":["message.output_text.logprobs"])"}) {
        SCOPED_TRACE(ask);
        Json r = post_json("/v1/responses", std::string(R"({"input":"x",)") + ask + "}");
        ASSERT_EQ(r["output"].size(), 2u) << r.dump();
        const Json& part = r["output"][1]["content"][0];
        const Json& lp = part["logprobs"];
        ASSERT_EQ(lp.size(), harmony_ids("Hello world").size()) << part.dump();
        std::string text;
        for (const Json& e : lp) {
            text += e["token"].get<std::string>();
            EXPECT_EQ(e["logprob"], -0.25);
            EXPECT_TRUE(e["bytes"].is_array());
            EXPECT_EQ(e["top_logprobs"].size(), std::string(ask).find("top_logprobs") != std::string::npos ? 2u : 0u);
        }
        EXPECT_EQ(text, "Hello world");
        EXPECT_EQ(r["top_logprobs"], std::string(ask).find("top_logprobs") != std::string::npos ? 2 : 0);
    }
    // Not asked: empty lists, and the engine computes none.
    Json plain = post_json("/v1/responses", R"({"input":"x"})");
    EXPECT_EQ(plain["output"][1]["content"][0]["logprobs"], Json::array());
    EXPECT_EQ(server_.engine.last_request().top_logprobs, -1);

    auto streamed = server_.post("/v1/responses", R"({"input":"x","stream":true,"top_logprobs":1})");
    ASSERT_TRUE(streamed);
    size_t entries = 0;
    Json done_lp;
    for (const SseEvent& e : parse_sse(streamed->body)) {
        const Json d = parse(e.data);
        if (e.event == "response.output_text.delta") {
            std::string tokens;
            for (const Json& x : d["logprobs"]) tokens += x["token"].get<std::string>();
            EXPECT_EQ(tokens, d["delta"]) << d.dump();
            entries += d["logprobs"].size();
        }
        if (e.event == "response.output_text.done") done_lp = d["logprobs"];
    }
    EXPECT_EQ(entries, harmony_ids("Hello world").size());
    EXPECT_EQ(done_lp.size(), entries);
}

TEST_F(GenerationOutputTest, ResponsesOutputItems) {
    script("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>");
    Json r = post_json("/v1/responses", R"({"input":"hi","instructions":"Be nice.","reasoning":{"effort":"low"}})");
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["status"], "completed");
    EXPECT_TRUE(r["id"].get<std::string>().rfind("resp_", 0) == 0);
    ASSERT_EQ(r["output"].size(), 2u);
    EXPECT_EQ(r["output"][0]["type"], "reasoning");
    EXPECT_EQ(r["output"][0]["content"][0]["text"], "Think.");
    EXPECT_EQ(r["output"][1]["type"], "message");
    EXPECT_EQ(r["output"][1]["role"], "assistant");
    EXPECT_EQ(r["output"][1]["content"][0]["type"], "output_text");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], "Done.");
    EXPECT_GT(r["usage"]["output_tokens"].get<int>(), 0);
    EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
    EXPECT_EQ(r["instructions"], "Be nice.");
    std::string prompt = *test_tokenizer()->decode(server_.engine.last_request().prompt);
    EXPECT_NE(prompt.find("Reasoning: low"), std::string::npos);
    EXPECT_NE(prompt.find("# Instructions\n\nBe nice."), std::string::npos);
}

// include: ["reasoning.encrypted_content"] (a stateless client, as OpenAI's store: false): each reasoning item carries
// its text as encrypted_content, streamed and not; sent back alone (no content) in a tool loop it is the reasoning the
// prompt renders, as the item with its content would be.
TEST_F(GenerationOutputTest, ResponsesEncryptedReasoningRoundTrip) {
    script(
        "<|channel|>analysis<|message|>Need the weather. Ünïcode ✓<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>");
    const std::string tools = R"("tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}])";
    Json r = post_json("/v1/responses",
                       R"({"input":"hi","include":["reasoning.encrypted_content"],"store":false,)" + tools + "}");
    ASSERT_EQ(r["output"].size(), 2u) << r.dump();
    const Json reasoning = r["output"][0];
    ASSERT_TRUE(reasoning["encrypted_content"].is_string()) << reasoning.dump();
    EXPECT_EQ(reasoning_from_encrypted_content(reasoning["encrypted_content"].get<std::string>()),
              "Need the weather. Ünïcode ✓");
    EXPECT_FALSE(post_json("/v1/responses", R"({"input":"hi",)" + tools + "}")["output"][0].contains(
        "encrypted_content"));  // only when asked
    // Streamed: the finished item carries it.
    auto streamed = server_.post(
        "/v1/responses", R"({"input":"hi","stream":true,"include":["reasoning.encrypted_content"],)" + tools + "}");
    ASSERT_TRUE(streamed);
    bool seen = false;
    for (const SseEvent& e : parse_sse(streamed->body)) {
        if (e.event != "response.output_item.done") continue;
        const Json item = parse(e.data)["item"];
        if (item["type"] == "reasoning") seen = item["encrypted_content"] == reasoning["encrypted_content"];
    }
    EXPECT_TRUE(seen);

    Json sent = reasoning;
    sent.erase("content");
    const Json call = r["output"][1];
    const Json result = {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "sunny"}};
    script("<|channel|>final<|message|>Sunny.<|return|>");
    post_json("/v1/responses", Json{{"input", Json::array({{{"role", "user"}, {"content", "hi"}}, sent, call, result})},
                                    {"tools", Json::parse("[" + tools.substr(tools.find('{')))}}
                                   .dump());
    const std::vector<int32_t> from_encrypted = server_.engine.last_request().prompt;
    post_json("/v1/responses",
              Json{{"input", Json::array({{{"role", "user"}, {"content", "hi"}}, reasoning, call, result})},
                   {"tools", Json::parse("[" + tools.substr(tools.find('{')))}}
                  .dump());
    EXPECT_EQ(from_encrypted, server_.engine.last_request().prompt);
    EXPECT_NE(test_tokenizer()->decode(from_encrypted)->find("Need the weather."), std::string::npos);
    // Not this server's: a 400 naming the field.
    sent["encrypted_content"] = "gAAAAABopaque";
    auto bad =
        server_.post("/v1/responses",
                     Json{{"input", Json::array({{{"role", "user"}, {"content", "hi"}}, sent, call, result})}}.dump());
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_EQ(parse(bad->body)["error"]["param"], "input[1].encrypted_content") << bad->body;
}

// tool_choice allowed_tools: the prompt declares only the allowed functions; mode required with one of them forces
// its call's header (the same prompt as a named tool_choice), on both APIs.
TEST_F(GenerationOutputTest, AllowedToolsDeclareOnlyThoseFunctions) {
    script("<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{}<|call|>");
    const std::string tools =
        R"("tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}},
        {"type":"function","function":{"name":"delete_everything","parameters":{"type":"object"}}}])";
    post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                          R"(,"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required",
                  "tools":[{"type":"function","function":{"name":"lookup"}}]}}})");
    const std::vector<int32_t> allowed = server_.engine.last_request().prompt;
    const std::string text = *test_tokenizer()->decode(allowed);
    EXPECT_NE(text.find("type lookup"), std::string::npos) << text;
    EXPECT_EQ(text.find("delete_everything"), std::string::npos) << text;
    post_json("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"lookup",
              "parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"lookup"}}})");
    EXPECT_EQ(allowed, server_.engine.last_request().prompt);
    Json r = post_json("/v1/responses", R"({"input":"x","tools":[{"type":"function","name":"lookup",
        "parameters":{"type":"object"}},{"type":"function","name":"delete_everything","parameters":{"type":"object"}}],
        "tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"lookup"}]}})");
    EXPECT_EQ(r["output"].back()["type"], "function_call") << r.dump();
    EXPECT_EQ(*test_tokenizer()->decode(server_.engine.last_request().prompt), text);
}

// Effort names past low / medium / high are clamped, not refused (HARMONY.md §3.2; before session 26
// both routes answered 400): minimal and none to low, xhigh and max to high.
TEST_F(GenerationOutputTest, ReasoningEffortIsClamped) {
    script("<|channel|>final<|message|>Done.<|return|>");
    const struct {
        const char* effort;
        const char* want;
    } cases[] = {{"minimal", "Reasoning: low"},
                 {"none", "Reasoning: low"},
                 {"xhigh", "Reasoning: high"},
                 {"max", "Reasoning: high"},
                 {"medium", "Reasoning: medium"}};
    for (const auto& c : cases) {
        SCOPED_TRACE(c.effort);
        post_json(
            "/v1/chat/completions",
            std::string(R"({"messages":[{"role":"user","content":"hi"}],"reasoning_effort":")") + c.effort + R"("})");
        EXPECT_NE(test_tokenizer()->decode(server_.engine.last_request().prompt)->find(c.want), std::string::npos);
        Json r =
            post_json("/v1/responses", std::string(R"({"input":"hi","reasoning":{"effort":")") + c.effort + R"("}})");
        EXPECT_EQ(r["status"], "completed") << r.dump();
        EXPECT_NE(test_tokenizer()->decode(server_.engine.last_request().prompt)->find(c.want), std::string::npos);
    }
}

// An assistant message's refusal content part (as OpenAI's API returns them) is history text, not a
// 400 (before session 26); on a user message it still is.
TEST_F(GenerationOutputTest, AssistantRefusalPartsAreAccepted) {
    script("<|channel|>final<|message|>Done.<|return|>");
    post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"a"},
        {"role":"assistant","content":[{"type":"refusal","refusal":"I cannot help with that."}]},
        {"role":"user","content":"b"}]})");
    EXPECT_NE(test_tokenizer()->decode(server_.engine.last_request().prompt)->find("I cannot help with that."),
              std::string::npos);
    auto r = server_.post("/v1/chat/completions",
                          R"({"messages":[{"role":"user","content":[{"type":"refusal","refusal":"x"}]}]})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
}

TEST_F(GenerationOutputTest, ResponsesFunctionCallAndOutputRoundTrip) {
    script("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>");
    const char* tools = R"("tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}])";
    Json r = post_json("/v1/responses", std::string(R"({"input":"Weather in Oslo?",)") + tools + "}");
    ASSERT_EQ(r["output"].size(), 1u);
    const Json& fc = r["output"][0];
    EXPECT_EQ(fc["type"], "function_call");
    EXPECT_EQ(fc["name"], "get_weather");
    EXPECT_EQ(fc["arguments"], "{\"city\":\"Oslo\"}");
    EXPECT_EQ(fc["status"], "completed");

    script("<|channel|>final<|message|>Cold.<|return|>");
    Json input = Json::array({Json{{"role", "user"}, {"content", "Weather in Oslo?"}}, fc,
                              Json{{"type", "function_call_output"}, {"call_id", fc["call_id"]}, {"output", "-5C"}}});
    Json body = {{"input", input}};
    body["tools"] = Json::parse(std::string("{") + tools + "}")["tools"];
    Json r2 = post_json("/v1/responses", dump_json(body));
    EXPECT_EQ(r2["output"].back()["content"][0]["text"], "Cold.");
    std::string prompt = *test_tokenizer()->decode(server_.engine.last_request().prompt);
    EXPECT_NE(prompt.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>-5C<|end|>"),
              std::string::npos)
        << prompt;
}

// A Responses stream's function-call arguments: the deltas joined, and the .done event.
// The arguments of a function_call item are trimmed as chat's tool calls are (HARMONY.md §6.5), streamed or not:
// the deltas add up to the trimmed text (whitespace before and after the JSON was kept).
TEST_F(GenerationOutputTest, ResponsesFunctionCallArgumentsAreTrimmed) {
    const char* out = "<|channel|>commentary to=functions.f <|constrain|>json<|message|> \n{\"a\": 1}\t\n  <|call|>";
    const char* body = R"({"input":"q","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}])";
    const ResponsesArguments a = responses_arguments(out, body);
    EXPECT_EQ(a.whole, "{\"a\": 1}");
    EXPECT_EQ(a.deltas, "{\"a\": 1}");
    EXPECT_EQ(a.done, "{\"a\": 1}");
    script(out);
    Json chat = post_json("/v1/chat/completions",
                          R"({"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function",
                              "function":{"name":"f","parameters":{"type":"object"}}}]})");
    EXPECT_EQ(chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], a.whole);
}

// A whole call with an empty body (`<|message|><|call|>`) has the arguments "{}", streamed or not, on both APIs: it had
// been "", which a client's JSON.parse of the arguments refuses.
TEST_F(GenerationOutputTest, ACallWithoutArgumentsHasAnEmptyObject) {
    const char* out = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>  <|call|>";
    const char* body = R"({"input":"q","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}])";
    const ResponsesArguments a = responses_arguments(out, body);
    EXPECT_EQ(a.whole, "{}");
    EXPECT_EQ(a.deltas, "{}");
    EXPECT_EQ(a.done, "{}");
    const char* chat_body = R"({"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function",
                              "function":{"name":"f","parameters":{"type":"object"}}}])";
    script(out);
    Json chat = post_json("/v1/chat/completions", std::string(chat_body) + "}");
    EXPECT_EQ(chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}") << chat.dump();
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "tool_calls");
    script(out);
    const std::vector<Json> events = post_stream("/v1/chat/completions", std::string(chat_body) + R"(,"stream":true})");
    std::string args;
    for (const Json& e : events)
        if (e.contains("choices"))
            for (const Json& c : e["choices"])
                if (c.contains("delta") && c["delta"].contains("tool_calls"))
                    for (const Json& t : c["delta"]["tool_calls"])
                        if (t.contains("function") && t["function"].contains("arguments"))
                            args += t["function"]["arguments"].get<std::string>();
    EXPECT_EQ(args, "{}");
}

TEST_F(GenerationOutputTest, ResponsesStreamEventSequence) {
    script("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>");
    std::vector<std::string> names;
    bool done = false;
    std::vector<Json> events = post_stream("/v1/responses", R"({"input":"hi","stream":true})", &done, &names);
    EXPECT_FALSE(done);  // the Responses stream has no [DONE]
    ASSERT_GE(events.size(), 12u);
    for (size_t i = 0; i < events.size(); ++i) {
        EXPECT_EQ(events[i]["type"], names[i]);  // "event:" line == type field
        EXPECT_EQ(events[i]["sequence_number"], i);
    }
    EXPECT_EQ(names.front(), "response.created");
    EXPECT_EQ(names[1], "response.in_progress");
    EXPECT_EQ(names.back(), "response.completed");
    const std::vector<std::string> expected_middle = {
        "response.output_item.added",   "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done",  "response.output_item.done",
        "response.output_item.added",   "response.content_part.added", "response.output_text.delta",
        "response.output_text.done",    "response.content_part.done",  "response.output_item.done"};
    std::vector<std::string> collapsed;  // runs of deltas collapsed to one
    for (size_t i = 2; i + 1 < names.size(); ++i) {
        if (!collapsed.empty() && collapsed.back() == names[i] && names[i].find(".delta") != std::string::npos) {
            continue;
        }
        collapsed.push_back(names[i]);
    }
    EXPECT_EQ(collapsed, expected_middle);
    const Json& final_response = events.back()["response"];
    EXPECT_EQ(final_response["status"], "completed");
    ASSERT_EQ(final_response["output"].size(), 2u);
    // Items in the final response are the ones streamed (same ids).
    EXPECT_EQ(final_response["output"][1]["id"], events[events.size() - 2]["item"]["id"]);
    std::string text;
    for (const Json& e : events) {
        if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
    }
    EXPECT_EQ(text, "Done.");
}

TEST_F(GenerationOutputTest, ResponsesIncompleteAtMaxOutputTokens) {
    script("<|channel|>final<|message|>one two three four five six<|return|>");
    Json r = post_json("/v1/responses", R"({"input":"hi","max_output_tokens":5})");
    EXPECT_EQ(r["status"], "incomplete");
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(r["usage"]["output_tokens"], 5);
}

// A function call cut by max_output_tokens stays an item with status in_progress (HARMONY.md §6.6;
// before session 26: incomplete, the message items' word).
TEST_F(GenerationOutputTest, ResponsesCutFunctionCallIsInProgress) {
    script(
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo and "
        "more\"}<|call|>");
    const char* tools = R"("tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}])";
    Json r = post_json("/v1/responses", std::string(R"({"input":"Weather?","max_output_tokens":12,)") + tools + "}");
    EXPECT_EQ(r["status"], "incomplete") << r.dump();
    ASSERT_EQ(r["output"].size(), 1u) << r.dump();
    EXPECT_EQ(r["output"][0]["type"], "function_call");
    EXPECT_EQ(r["output"][0]["status"], "in_progress") << r.dump();
}

// RoutesOptions::reasoning_alias (serve --reasoning-field-alias): the reasoning also as `reasoning`,
// whole and streamed; off by default.
TEST(GenerationOutputOptions, ReasoningFieldAlias) {
    REQUIRE_TOKENIZER();
    for (bool alias : {false, true}) {
        TestServerOptions o = default_test_options();
        o.routes.reasoning_alias = alias;
        TestServer s(o);
        const std::vector<int32_t> ids = harmony_ids(
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>");
        s.engine.set_script([ids](const EngineRequest&) { return ids; });
        auto r = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
        ASSERT_TRUE(r);
        const Json m = Json::parse(r->body)["choices"][0]["message"];
        EXPECT_EQ(m["reasoning_content"], "Think.");
        EXPECT_EQ(m.contains("reasoning"), alias) << m.dump();
        if (alias) {
            EXPECT_EQ(m["reasoning"], "Think.");
        }
        auto st = s.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
        ASSERT_TRUE(st);
        std::string reasoning, alias_text;
        size_t at = 0;
        for (size_t nl; (nl = st->body.find("\n", at)) != std::string::npos; at = nl + 1) {
            const std::string line = st->body.substr(at, nl - at);
            if (line.rfind("data: {", 0) != 0) continue;
            const Json d = Json::parse(line.substr(6))["choices"][0]["delta"];
            if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
            if (d.contains("reasoning")) alias_text += d["reasoning"].get<std::string>();
        }
        EXPECT_EQ(reasoning, "Think.");
        EXPECT_EQ(alias_text, alias ? "Think." : "");
    }
}

TEST_F(GenerationOutputTest, CompletionsTextIdsAndLogprobs) {
    std::vector<int32_t> answer = harmony_ids(" jumps over the lazy dog");
    std::vector<int32_t> with_stop = answer;
    with_stop.push_back(200002);
    server_.engine.set_script([with_stop](const EngineRequest&) { return with_stop; });
    Json j = post_json("/v1/completions", R"({"prompt":"The quick brown fox","logprobs":2,"max_tokens":50})");
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["choices"][0]["text"], " jumps over the lazy dog");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(j["usage"]["completion_tokens"], with_stop.size());
    EXPECT_EQ(j["usage"]["prompt_tokens"], harmony_ids("The quick brown fox").size());
    const Json& lp = j["choices"][0]["logprobs"];
    EXPECT_EQ(lp["tokens"].size(), with_stop.size());
    EXPECT_EQ(lp["token_logprobs"].size(), with_stop.size());
    EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
    EXPECT_EQ(lp["text_offset"][0], 0);
    EXPECT_EQ(server_.engine.last_request().prompt, harmony_ids("The quick brown fox"));

    // Token-id prompt, streamed with usage: logprob entries == completion_tokens.
    std::vector<Json> chunks = post_stream(
        "/v1/completions",
        R"({"prompt":[1,2,3],"logprobs":0,"stream":true,"stream_options":{"include_usage":true},"max_tokens":4})");
    ASSERT_FALSE(chunks.empty());
    size_t tokens = 0;
    std::string text;
    for (const Json& c : chunks) {
        if (c["choices"].empty()) continue;
        text += c["choices"][0]["text"].get<std::string>();
        if (c["choices"][0]["logprobs"].is_object()) tokens += c["choices"][0]["logprobs"]["tokens"].size();
    }
    EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 4);
    EXPECT_EQ(tokens, 4u);
    EXPECT_EQ(text, *test_tokenizer()->decode(std::vector<int32_t>(answer.begin(), answer.begin() + 4)));
    EXPECT_EQ(server_.engine.last_request().prompt, (std::vector<int32_t>{1, 2, 3}));

    // text_offset counts characters, not UTF-8 bytes: the stop token after " café naïve résumé" (18
    // characters, 22 bytes) is at 18.
    std::vector<int32_t> accented = harmony_ids(" café naïve résumé");
    accented.push_back(200002);
    server_.engine.set_script([accented](const EngineRequest&) { return accented; });
    Json u = post_json("/v1/completions", R"({"prompt":"a","logprobs":0,"max_tokens":20})");
    EXPECT_EQ(u["choices"][0]["text"], " café naïve résumé");
    const Json& ulp = u["choices"][0]["logprobs"];
    ASSERT_EQ(ulp["tokens"].size(), accented.size());
    ASSERT_EQ(ulp["text_offset"].size(), accented.size());
    EXPECT_EQ(ulp["text_offset"].back(), 18);
    // logprobs 0: each top_logprobs entry is the sampled token alone (OpenAI's "up to logprobs + 1").
    for (size_t i = 0; i < ulp["tokens"].size(); ++i) {
        const std::string t = ulp["tokens"][i];
        ASSERT_EQ(ulp["top_logprobs"][i].size(), 1u) << i;
        EXPECT_EQ(ulp["top_logprobs"][i][t], ulp["token_logprobs"][i]) << i;
    }
    int64_t chars = 0;
    for (size_t i = 0; i < ulp["tokens"].size(); ++i) {
        EXPECT_EQ(ulp["text_offset"][i], chars) << i;
        const std::string t = ulp["tokens"][i];
        chars += std::count_if(t.begin(), t.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
    }
}

// Streamed completions chunks' legacy logprobs added up: `entries` (null at first) gets `chunk`'s entries, if any.
void append_legacy_logprobs(Json& entries, const Json& chunk) {
    if (!chunk.is_object()) return;
    if (entries.is_null())
        entries = {{"tokens", Json::array()},
                   {"token_logprobs", Json::array()},
                   {"top_logprobs", Json::array()},
                   {"text_offset", Json::array()}};
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const Json& x : chunk[k]) entries[k].push_back(x);
}

// A stop string cuts the text, not the tokens: every generated token keeps its logprobs entry (it is in token_ids
// and usage), the stop string's too, as vLLM and chat keep it (the second " jumps" starts at offset 6, past the
// 4-character text); an empty suffix is no suffix. Streamed, the chunks add up to the same text and entries (with
// a stop, without one, and with a hold that lasts to the end: "umps jumpsX" holds " jumps").
TEST_F(GenerationOutputTest, CompletionsStopStringKeepsEveryTokensLogprobs) {
    std::vector<int32_t> ids = harmony_ids(" jumps jumps");
    ASSERT_EQ(ids.size(), 2u);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    Json j =
        post_json("/v1/completions",
                  R"({"prompt":"a","logprobs":1,"max_tokens":8,"stop":["ps j"],"suffix":"","return_token_ids":true})");
    EXPECT_EQ(j["choices"][0]["text"], " jum");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    const Json& lp = j["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 2u) << lp.dump();
    EXPECT_EQ(lp["tokens"], Json::array({" jumps", " jumps"}));
    EXPECT_EQ(lp["text_offset"], Json::array({0, 6}));
    EXPECT_EQ(lp["token_logprobs"].size(), 2u);
    EXPECT_EQ(lp["top_logprobs"].size(), 2u);
    EXPECT_EQ(j["choices"][0]["token_ids"].size(), 2u);
    EXPECT_EQ(j["usage"]["completion_tokens"], 2);

    for (const char* body : {R"({"prompt":"a","logprobs":1,"max_tokens":8,"stop":["ps j"],"stream":true})",
                             R"({"prompt":"a","logprobs":1,"max_tokens":8,"stream":true})",
                             R"({"prompt":"a","logprobs":1,"max_tokens":8,"stop":["umps jumpsX"],"stream":true})"}) {
        Json whole_req = parse(body);
        whole_req.erase("stream");
        Json whole = post_json("/v1/completions", whole_req.dump());
        EXPECT_EQ(whole["choices"][0]["logprobs"]["tokens"].size(), 2u) << body;
        std::string text;
        Json entries = nullptr;
        for (const Json& ch : post_stream("/v1/completions", body)) {
            const Json& cc = ch["choices"][0];
            text += cc["text"].get<std::string>();
            append_legacy_logprobs(entries, cc["logprobs"]);
        }
        EXPECT_EQ(text, whole["choices"][0]["text"]) << body;
        EXPECT_EQ(entries, whole["choices"][0]["logprobs"]) << body;
    }
}

// echo: the prompt before the completion (text as given, ids decoded), and with logprobs the prompt's tokens'
// entries first, the first one's null (lm-evaluation-harness's loglikelihood requests: ids, echo, logprobs 1,
// max_tokens 1); vLLM's prompt_logprobs as [null, {"<id>": {logprob, rank, decoded_token}}, ...]. Streamed
// chunks add up to the same text, entries and list. The fake engine scores prompt token i at
// -(i % 4) / 2 - 1/8, rank 1 + i % 3, its k best (prompt[i] + 1 + k) at -1/16 - k.
TEST_F(GenerationOutputTest, CompletionsEchoAndPromptLogprobs) {
    std::vector<int32_t> answer = harmony_ids(" jumps over");
    server_.engine.set_script([answer](const EngineRequest&) { return answer; });
    const std::vector<int32_t> prompt = harmony_ids("The quick brown fox");
    ASSERT_GE(prompt.size(), 3u);
    Json ids = prompt;
    Json j = post_json("/v1/completions",
                       R"({"prompt":)" + ids.dump() + R"(,"max_tokens":1,"logprobs":1,"echo":true,"temperature":0})");
    EXPECT_EQ(server_.engine.last_request().prompt_logprobs, 1);
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["text"], "The quick brown fox" + *test_tokenizer()->decode(std::vector<int32_t>{answer[0]}));
    EXPECT_FALSE(c.contains("prompt_logprobs"));
    const Json& lp = c["logprobs"];
    const size_t n = prompt.size();
    ASSERT_EQ(lp["tokens"].size(), n + 1) << lp.dump();
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    int64_t chars = 0;
    for (size_t i = 0; i < n + 1; ++i) {
        const std::string t = lp["tokens"][i];
        EXPECT_EQ(lp["text_offset"][i], chars) << i;
        chars += std::count_if(t.begin(), t.end(), [](char ch) { return (ch & 0xC0) != 0x80; });
        if (i == 0 || i == n) continue;
        EXPECT_EQ(t, token_text(*test_tokenizer(), prompt[i]));
        EXPECT_EQ(lp["token_logprobs"][i].get<float>(), -0.5f * static_cast<float>(i % 4) - 0.125f) << i;
        // logprobs 1: the best token and the prompt token itself.
        const Json& top = lp["top_logprobs"][i];
        EXPECT_EQ(top.size(), 2u) << top.dump();
        EXPECT_EQ(top[t], lp["token_logprobs"][i]);
        EXPECT_EQ(top[token_text(*test_tokenizer(), prompt[i] + 1)].get<float>(), -0.0625f);
    }
    EXPECT_EQ(lp["token_logprobs"][n].get<float>(), -0.25f);  // the completion's token

    // prompt_logprobs 2 without echo: the text is the completion's; the engine scores with 2.
    Json v = post_json("/v1/completions",
                       R"({"prompt":"The quick brown fox","max_tokens":2,"prompt_logprobs":2,"logprobs":0})");
    EXPECT_EQ(server_.engine.last_request().prompt_logprobs, 2);
    const Json& vc = v["choices"][0];
    EXPECT_EQ(vc["text"], *test_tokenizer()->decode(std::vector<int32_t>(answer.begin(), answer.begin() + 2)));
    EXPECT_EQ(vc["logprobs"]["tokens"].size(), 2u);
    const Json& plp = vc["prompt_logprobs"];
    ASSERT_EQ(plp.size(), n) << plp.dump();
    EXPECT_TRUE(plp[0].is_null());
    for (size_t i = 1; i < n; ++i) {
        const Json& d = plp[i];
        ASSERT_EQ(d.size(), 3u) << d.dump();  // the prompt token and the 2 best (all different ids here)
        const Json& self = d[std::to_string(prompt[i])];
        EXPECT_EQ(self["rank"], 1 + static_cast<int>(i % 3));
        EXPECT_EQ(self["logprob"].get<float>(), -0.5f * static_cast<float>(i % 4) - 0.125f);
        EXPECT_EQ(self["decoded_token"], token_text(*test_tokenizer(), prompt[i]));
        EXPECT_EQ(d[std::to_string(prompt[i] + 2)]["rank"], 2);
    }

    // Streamed: the same text, entries and list.
    for (const char* body :
         {R"({"prompt":"The quick brown fox","max_tokens":2,"logprobs":1,"echo":true,"stream":true})",
          R"({"prompt":"The quick brown fox","max_tokens":2,"prompt_logprobs":2,"stream":true})"}) {
        Json whole_req = parse(body);
        whole_req.erase("stream");
        Json whole = post_json("/v1/completions", whole_req.dump());
        std::string text;
        Json entries = nullptr;
        Json list = nullptr;
        for (const Json& ch : post_stream("/v1/completions", body)) {
            const Json& cc = ch["choices"][0];
            text += cc["text"].get<std::string>();
            append_legacy_logprobs(entries, cc["logprobs"]);
            if (cc.contains("prompt_logprobs")) {
                EXPECT_TRUE(list.is_null()) << "prompt_logprobs sent twice";
                list = cc["prompt_logprobs"];
            }
        }
        const Json& wc = whole["choices"][0];
        EXPECT_EQ(text, wc["text"]) << body;
        if (wc["logprobs"].is_object()) {
            EXPECT_EQ(entries, wc["logprobs"]) << body;
        }
        EXPECT_EQ(list, wc.contains("prompt_logprobs") ? wc["prompt_logprobs"] : Json(nullptr)) << body;
    }

    // Chat: vLLM's prompt_logprobs at the top level of the body, and in a chunk of its own before the content.
    script("<|channel|>final<|message|>Hi<|return|>");
    Json chat =
        post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1})");
    const std::vector<int32_t> chat_prompt = server_.engine.last_request().prompt;
    EXPECT_EQ(server_.engine.last_request().prompt_logprobs, 1);
    ASSERT_EQ(chat["prompt_logprobs"].size(), chat_prompt.size()) << chat.dump();
    EXPECT_TRUE(chat["prompt_logprobs"][0].is_null());
    EXPECT_EQ(chat["prompt_logprobs"][1][std::to_string(chat_prompt[1])]["rank"], 2);
    std::vector<Json> chunks = post_stream(
        "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1,"stream":true})");
    size_t with = 0;
    for (const Json& ch : chunks)
        if (ch.contains("prompt_logprobs")) {
            ++with;
            EXPECT_EQ(ch["prompt_logprobs"], chat["prompt_logprobs"]);
        }
    EXPECT_EQ(with, 1u);
    EXPECT_FALSE(post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})")
                     .contains("prompt_logprobs"));
    // n > 1: one choice scores the prompt; one list in the answer, one chunk in the stream.
    Json two =
        post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1,"n":2})");
    EXPECT_EQ(two["prompt_logprobs"], chat["prompt_logprobs"]);
    with = 0;
    for (const Json& ch : post_stream("/v1/chat/completions",
                                      R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1,"n":2,
                                          "stream":true})"))
        with += ch.contains("prompt_logprobs");
    EXPECT_EQ(with, 1u);
    // At most 262,144 entries a request: 2,000 tokens × 21 × 7 choices is too many.
    Json long_prompt = std::vector<int32_t>(2000, 1000);
    expect_error(server_.post("/v1/completions",
                              R"({"prompt":)" + long_prompt.dump() + R"(,"max_tokens":1,"prompt_logprobs":20,"n":7})"),
                 400);
    // max_tokens 0 with echo: the prompt alone (a token generated and dropped).
    Json only = post_json("/v1/completions", R"({"prompt":[5,6,7],"max_tokens":0,"echo":true,"logprobs":1})");
    EXPECT_EQ(server_.engine.last_request().max_tokens, 1);
    EXPECT_EQ(only["choices"][0]["text"], *test_tokenizer()->decode(std::vector<int32_t>{5, 6, 7})) << only.dump();
    EXPECT_EQ(only["choices"][0]["logprobs"]["tokens"].size(), 3u);
    EXPECT_EQ(only["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(only["usage"]["completion_tokens"], 0);
    expect_error(server_.post("/v1/completions", R"({"prompt":[5],"max_tokens":0})"), 400);
    server_.engine.set_script([answer](const EngineRequest&) { return answer; });

    // A character split over two tokens (o200k's byte tokens 127 = 0xC3 and 102 = 0xA9: "é") is counted once,
    // where it began: offsets follow the text, not each token's lossy bytes.
    server_.engine.set_script([](const EngineRequest&) { return std::vector<int32_t>{127, 102, 64}; });
    Json split = post_json("/v1/completions", R"({"prompt":[64,127,102,64],"max_tokens":3,"logprobs":0,"echo":true})");
    EXPECT_EQ(split["choices"][0]["text"], "aéaéa") << split.dump();
    EXPECT_EQ(split["choices"][0]["logprobs"]["text_offset"], Json::array({0, 1, 1, 2, 3, 3, 4})) << split.dump();
    server_.engine.set_script([answer](const EngineRequest&) { return answer; });

    // echo with a stop string: the prompt stays whole, the completion's text is cut (its tokens' entries stay).
    std::vector<int32_t> jj = harmony_ids(" jumps jumps");
    server_.engine.set_script([jj](const EngineRequest&) { return jj; });
    Json s2 =
        post_json("/v1/completions", R"({"prompt":"a b","logprobs":0,"echo":true,"max_tokens":8,"stop":["ps j"]})");
    EXPECT_EQ(s2["choices"][0]["text"], "a b jum");
    const Json& s2lp = s2["choices"][0]["logprobs"];
    ASSERT_EQ(s2lp["tokens"].size(), harmony_ids("a b").size() + 2) << s2lp.dump();
    EXPECT_EQ(s2lp["text_offset"].back(), 9);
}

// Chat answer details OpenAI's clients read: content cut to nothing by a stop string is "" (not null: there was
// an answer), the message and the logprobs carry "refusal": null, and a reserved id the tokenizer file does not
// list is named in logprobs ("<|reserved_200013|>"), never "".
TEST_F(GenerationOutputTest, ChatContentRefusalAndReservedTokenNames) {
    script("<|channel|>final<|message|>END of it<|return|>");
    Json j = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"stop":["END"],"logprobs":true})");
    const Json& choice = j["choices"][0];
    EXPECT_EQ(choice["message"]["content"], "");
    EXPECT_TRUE(choice["message"].contains("refusal") && choice["message"]["refusal"].is_null()) << choice.dump();
    EXPECT_TRUE(choice["logprobs"].contains("refusal") && choice["logprobs"]["refusal"].is_null()) << choice.dump();

    std::vector<int32_t> ids = harmony_ids("<|channel|>final<|message|>a");
    ids.push_back(200013);
    ids.push_back(200002);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    Json r = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1})");
    bool named = false;
    for (const Json& e : r["choices"][0]["logprobs"]["content"]) {
        EXPECT_NE(e["token"], "") << e.dump();
        named = named || e["token"] == "<|reserved_200013|>";
    }
    Json c = post_json("/v1/completions", R"({"prompt":"a","logprobs":0,"max_tokens":8})");
    for (const Json& t : c["choices"][0]["logprobs"]["tokens"]) {
        EXPECT_NE(t, "");
        named = named || t == "<|reserved_200013|>";
    }
    EXPECT_TRUE(named);
}

// n > 1: n engine requests (a seed s gives choice i the seed s + i), one answer with choices 0..n-1, the prompt
// counted once in the usage; streamed, every chunk carries its choice's index under one id, one usage chunk
// and one [DONE] at the end, and each choice's text equals the non-streamed one.
TEST_F(GenerationOutputTest, ChatNChoices) {
    std::mutex mu;
    std::vector<uint64_t> seeds;
    server_.engine.set_script([&](const EngineRequest& r) {
        std::lock_guard<std::mutex> lock(mu);
        seeds.push_back(r.sampling.seed.value_or(0));
        return harmony_ids("<|channel|>final<|message|>Choice " + std::to_string(*r.sampling.seed) + "<|return|>");
    });
    Json one = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"seed":7})");
    Json three = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"seed":7,"n":3})");
    ASSERT_EQ(three["choices"].size(), 3u) << three.dump();
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(three["choices"][i]["index"], i);
        EXPECT_EQ(three["choices"][i]["message"]["content"], "Choice " + std::to_string(7 + i));
        EXPECT_EQ(three["choices"][i]["finish_reason"], "stop");
    }
    EXPECT_EQ(three["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    EXPECT_EQ(three["usage"]["completion_tokens"], 3 * one["usage"]["completion_tokens"].get<int>());
    EXPECT_EQ(three["usage"]["total_tokens"],
              three["usage"]["prompt_tokens"].get<int>() + three["usage"]["completion_tokens"].get<int>());
    {
        std::lock_guard<std::mutex> lock(mu);
        std::vector<uint64_t> got(seeds.begin() + 1, seeds.end());
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, (std::vector<uint64_t>{7, 8, 9}));
    }

    bool done = false;
    std::vector<Json> chunks =
        post_stream("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"seed":7,"n":3,"stream":true,)"
                    R"("stream_options":{"include_usage":true}})",
                    &done);
    EXPECT_TRUE(done);
    std::vector<std::string> content(3);
    std::vector<int> finishes(3, 0), roles(3, 0);
    int usage_chunks = 0;
    for (const Json& c : chunks) {
        EXPECT_EQ(c["id"], chunks.front()["id"]);
        if (c["choices"].empty()) {
            ++usage_chunks;
            EXPECT_EQ(c["usage"], three["usage"]);
            continue;
        }
        const Json& ch = c["choices"][0];
        const int i = ch["index"].get<int>();
        ASSERT_TRUE(i >= 0 && i < 3) << c.dump();
        if (ch["delta"].contains("role")) ++roles[i];
        if (ch["delta"].contains("content")) content[i] += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) ++finishes[i];
    }
    EXPECT_EQ(usage_chunks, 1);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(content[i], three["choices"][i]["message"]["content"]) << i;
        EXPECT_EQ(finishes[i], 1) << i;
        EXPECT_EQ(roles[i], 1) << i;
    }
    // One choice failing fails the request (and the others are cancelled).
    server_.engine.fail_next_request("boom");
    auto failed = server_.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":2})");
    ASSERT_TRUE(failed);
    EXPECT_EQ(failed->status, 500) << failed->body;
    EXPECT_TRUE(server_.wait_engine_idle());
}

// vLLM's stop_token_ids (generation ends on them; the id that ends it is counted, not shown) and ignore_eos (the
// model's own stop ids no longer end it); its malformed fields (a structural_tag without a format among them) are
// refused, not ignored; its JSON ones (guided_json, guided_json_object, structured_outputs.json) constrain the output.
TEST_F(GenerationOutputTest, StopTokenIdsAndIgnoreEos) {
    const std::vector<int32_t> two = harmony_ids(" two");
    ASSERT_EQ(two.size(), 1u);
    std::vector<int32_t> ids = harmony_ids(" one two three");
    ids.push_back(200002);  // <|return|>
    for (int32_t id : harmony_ids(" four five")) ids.push_back(id);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    const std::string stop_two = R"("stop_token_ids":[)" + std::to_string(two[0]) + "]";
    Json a = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20,)" + stop_two + "}");
    EXPECT_EQ(a["choices"][0]["text"], " one") << a.dump();
    EXPECT_EQ(a["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(a["choices"][0]["stop_reason"], two[0]);  // vLLM's: the stop id that ended it
    EXPECT_EQ(a["usage"]["completion_tokens"], 2);
    std::vector<Json> as =
        post_stream("/v1/completions", R"({"prompt":"x","max_tokens":20,"stream":true,)" + stop_two + "}");
    ASSERT_FALSE(as.empty());
    EXPECT_EQ(as.back()["choices"][0]["stop_reason"], two[0]) << as.back().dump();
    Json b = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20})");
    EXPECT_EQ(b["choices"][0]["text"], " one two three") << b.dump();
    EXPECT_EQ(b["usage"]["completion_tokens"], 4);
    EXPECT_TRUE(b["choices"][0]["stop_reason"].is_null()) << b.dump();  // the model's own end token
    Json bs = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20,"stop":["ee","thr"]})");
    EXPECT_EQ(bs["choices"][0]["text"], " one two ") << bs.dump();
    EXPECT_EQ(bs["choices"][0]["stop_reason"], "thr");  // the string that matched first in the text
    Json c = post_json("/v1/completions", R"({"prompt":"x","max_tokens":5,"ignore_eos":true})");
    EXPECT_EQ(c["choices"][0]["text"], " one two three<|return|> four") << c.dump();
    EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
    EXPECT_TRUE(c["choices"][0]["stop_reason"].is_null());
    EXPECT_EQ(c["usage"]["completion_tokens"], 5);

    script("<|channel|>final<|message|>Hello two more<|return|>");
    Json d = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],)" + stop_two + "}");
    EXPECT_EQ(d["choices"][0]["message"]["content"], "Hello") << d.dump();
    EXPECT_EQ(d["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(d["choices"][0]["stop_reason"], two[0]);
    Json ds = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"stop":"o m"})");
    EXPECT_EQ(ds["choices"][0]["message"]["content"], "Hello tw") << ds.dump();
    EXPECT_EQ(ds["choices"][0]["stop_reason"], "o m");
    std::vector<Json> dss = post_stream("/v1/chat/completions",
                                        R"({"messages":[{"role":"user","content":"hi"}],"stop":"o m","stream":true})");
    ASSERT_FALSE(dss.empty());
    EXPECT_EQ(dss.back()["choices"][0]["stop_reason"], "o m") << dss.back().dump();
    Json dn = post_json("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
    EXPECT_TRUE(dn["choices"][0]["stop_reason"].is_null()) << dn.dump();
    Json e = post_json("/v1/responses", R"({"input":"hi",)" + stop_two + "}");
    EXPECT_EQ(e["output"].back()["content"][0]["text"], "Hello") << e.dump();

    for (const char* bad : {R"("min_tokens":21)",
                            R"("min_tokens":-1)",
                            R"("guided_choice":[])",
                            R"("guided_choice":["a",""])",
                            R"("guided_choice":"a")",
                            R"("guided_regex":"a(")",
                            R"("guided_regex":"(?=a)b")",
                            R"("guided_regex":7)",
                            R"("guided_regex":"a","guided_choice":["b"])",
                            R"("guided_regex":"a","guided_json":{})",
                            R"("structured_outputs":{"regex":"\1"})",
                            R"("structured_outputs":{"grammar":"root ::= x"})",
                            R"("structured_outputs":{"structural_tag":"{}"})",
                            R"("structured_outputs":{"jsonn":{"type":"integer"}})",  // session 57: ran unconstrained
                            R"("structured_outputs":{})",
                            R"("structured_outputs":{"json":null})",
                            R"("structured_outputs":{"json":{},"whitespace_pattern":"[ ]*"})",
                            R"("guided_json":{},"guided_whitespace_pattern":"\s*")",
                            R"("guided_json":{},"guided_whitespace_pattern":3)",
                            R"("guided_grammar":"root ::= x")",
                            R"("guided_grammar":"start: /a+/x")",
                            R"("guided_grammar":["root ::= \"a\""])",
                            R"("grammar":"root ::= root \"a\" | \"b\"")",
                            R"("guided_grammar":"root ::= \"a\"","guided_regex":"a")",
                            R"("guided_json":"{not json")",
                            R"("guided_json":5)",
                            R"("guided_json":{"type":"string","pattern":"^x","maxLength":4})",
                            R"("guided_json":{},"guided_json_object":true)",
                            R"("bad_words":"x")",
                            R"("bad_words":[1])",
                            R"("stop_token_ids":"1")",
                            R"("stop_token_ids":[-1])",
                            R"("stop_token_ids":[1.5])",
                            R"("ignore_eos":"yes")"}) {
        Json err = expect_error(server_.post("/v1/completions", std::string(R"({"prompt":"x",)") + bad + "}"), 400);
        EXPECT_FALSE(err.is_null()) << bad;
    }
    post_json("/v1/completions", R"({"prompt":"x","min_tokens":0,"bad_words":[],"guided_json":null})");
    // vLLM's whitespace pattern "" is disable_any_whitespace; disable_fallback and a backend name are accepted.
    post_json("/v1/completions",
              R"({"prompt":"x","guided_json":{"type":"array"},"guided_whitespace_pattern":"","max_tokens":2})");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    post_json("/v1/completions", R"({"prompt":"x","max_tokens":2,"structured_outputs":{"json":{"type":"array"},
              "whitespace_pattern":"","disable_fallback":true,"backend":"xgrammar"}})");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    server_.engine.set_script([ids](const EngineRequest&) { return ids; });
    // min_tokens reaches the engine; a stop string inside its first min_tokens tokens does not cut (" one two"
    // is 2 tokens: " two" is the second), one ending later does; a stop id before it does not end (the fake
    // engine skips it as the real one never draws it).
    Json m = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20,"min_tokens":2,"stop":["two"]})");
    EXPECT_EQ(server_.engine.last_request().min_tokens, 2);
    EXPECT_EQ(m["choices"][0]["text"], " one two three") << m.dump();
    Json m2 = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20,"min_tokens":1,"stop":["two"]})");
    EXPECT_EQ(m2["choices"][0]["text"], " one ") << m2.dump();
    // vLLM's bad_words: each word (leading spaces stripped) as token ids, and with a space before it where that is
    // as many tokens from another first token.
    post_json("/v1/completions", R"({"prompt":"x","max_tokens":2,"bad_words":["hello","  world",""]})");
    const std::vector<std::vector<int32_t>>& bw = server_.engine.last_request().bad_words;
    ASSERT_EQ(bw.size(), 4u);
    EXPECT_EQ(bw[0], harmony_ids("hello"));
    EXPECT_EQ(bw[1], harmony_ids(" hello"));
    EXPECT_EQ(bw[2], harmony_ids("world"));
    EXPECT_EQ(bw[3], harmony_ids(" world"));
    // vLLM's truncate_prompt_tokens: the prompt's last k tokens reach the engine; echo shows them.
    Json tr =
        post_json("/v1/completions", R"({"prompt":[5,6,7,8,9],"max_tokens":1,"truncate_prompt_tokens":2,"echo":true})");
    EXPECT_EQ(server_.engine.last_request().prompt, (std::vector<int32_t>{8, 9}));
    EXPECT_EQ(tr["usage"]["prompt_tokens"], 2);
    EXPECT_EQ(
        tr["choices"][0]["text"].get<std::string>().rfind(*test_tokenizer()->decode(std::vector<int32_t>{8, 9}), 0), 0u)
        << tr.dump();
    post_json("/v1/completions", R"({"prompt":[5,6],"max_tokens":1,"truncate_prompt_tokens":4})");
    EXPECT_EQ(server_.engine.last_request().prompt, (std::vector<int32_t>{5, 6}));
    post_json("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"truncate_prompt_tokens":3})");
    EXPECT_EQ(server_.engine.last_request().prompt.size(), 3u);
    expect_error(server_.post("/v1/completions", R"({"prompt":"x","truncate_prompt_tokens":0})"), 400);
    Json inc = post_json("/v1/completions",
                         R"({"prompt":"x","max_tokens":20,"stop":["two"],"include_stop_str_in_output":true})");
    EXPECT_EQ(inc["choices"][0]["text"], " one two") << inc.dump();
    EXPECT_EQ(inc["choices"][0]["finish_reason"], "stop");
    Json m3 = post_json("/v1/completions", R"({"prompt":"x","max_tokens":20,"min_tokens":4})");
    EXPECT_EQ(m3["choices"][0]["text"], " one two three<|return|> four five") << m3.dump();
    expect_error(server_.post("/v1/chat/completions",
                              R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"min_tokens":4})"),
                 400);
    EXPECT_EQ(server_.engine.last_request().constraint, nullptr);
    // vLLM's JSON constraints: on completions the whole output is held to them from its first token.
    for (const char* json : {R"("guided_json":{"type":"object"})", R"("guided_json":"{\"type\":\"object\"}")",
                             R"("structured_outputs":{"json":{"type":"object"}})", R"("guided_json_object":true)"}) {
        post_json("/v1/completions", std::string(R"({"prompt":"x","max_tokens":3,)") + json + "}");
        ASSERT_NE(server_.engine.last_request().constraint, nullptr) << json;
        std::vector<uint8_t> mask;
        auto c = server_.engine.last_request().constraint->start();
        ASSERT_TRUE(c->allowed_next(&mask)) << json;
        EXPECT_TRUE(mask[static_cast<size_t>(harmony_ids("{")[0])]);
        EXPECT_FALSE(mask[static_cast<size_t>(harmony_ids("[")[0])]);
    }
    // A string pattern (JSON Schema's search semantics): after the opening quote only digits, then the quote.
    post_json("/v1/completions",
              R"({"prompt":"x","max_tokens":3,"guided_json":{"type":"string","pattern":"^[0-9]{2,3}$"}})");
    {
        auto c = server_.engine.last_request().constraint->start();
        std::vector<uint8_t> mask;
        c->accept(harmony_ids("\"")[0]);
        ASSERT_TRUE(c->allowed_next(&mask));
        const size_t q = static_cast<size_t>(harmony_ids("\"")[0]);
        EXPECT_TRUE(mask[static_cast<size_t>(harmony_ids("7")[0])] && mask[static_cast<size_t>(harmony_ids("42")[0])]);
        EXPECT_FALSE(mask[static_cast<size_t>(harmony_ids("a")[0])] || mask[q]);
        c->accept(harmony_ids("42")[0]);
        ASSERT_TRUE(c->allowed_next(&mask));
        EXPECT_TRUE(mask[q] && mask[static_cast<size_t>(harmony_ids("7")[0])]);
    }
    // On chat, guided_json holds the final message (as response_format), and only one of them may be given.
    script("<|channel|>final<|message|>{}<|return|>");
    post_json("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"guided_json":{"type":"object"}})");
    EXPECT_NE(server_.engine.last_request().constraint, nullptr);
    expect_error(server_.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],
        "guided_json":{"type":"object"},"response_format":{"type":"json_object"}})"),
                 400);
    expect_error(server_.post("/v1/responses", R"({"input":"hi","guided_json":{"type":"object"}})"), 400);
    EXPECT_TRUE(server_.wait_engine_idle());
}

// vLLM's guided_choice / guided_regex (and structured_outputs' choice / regex): on completions the whole output,
// on chat the final message (preambles go to the reasoning), <|return|> once the text matches.
TEST_F(GenerationOutputTest, GuidedChoiceAndRegex) {
    const int32_t ret = 200002;
    auto first_mask = [&](const std::string& body, const char* path) {
        post_json(path, body);
        std::vector<uint8_t> mask;
        auto f = server_.engine.last_request().constraint;
        EXPECT_NE(f, nullptr) << body;
        if (!f) return mask;
        auto c = f->start();
        EXPECT_TRUE(c->allowed_next(&mask)) << body;
        return mask;
    };
    auto id = [](const std::string& t) {
        std::vector<int32_t> ids = harmony_ids(t);
        EXPECT_EQ(ids.size(), 1u) << t;
        return static_cast<size_t>(ids[0]);
    };
    server_.engine.set_script([](const EngineRequest&) { return harmony_ids("yes"); });
    for (const char* body : {R"({"prompt":"ok?","max_tokens":3,"guided_choice":["yes","no"]})",
                             R"({"prompt":"ok?","max_tokens":3,"structured_outputs":{"choice":["yes","no"]}})",
                             R"J({"prompt":"ok?","max_tokens":3,"guided_regex":"(yes|no)"})J",
                             R"({"prompt":"ok?","max_tokens":3,"structured_outputs":{"regex":"yes|no"}})"}) {
        std::vector<uint8_t> m = first_mask(body, "/v1/completions");
        ASSERT_FALSE(m.empty());
        EXPECT_TRUE(m[id("yes")] && m[id("no")] && m[id("y")]) << body;
        EXPECT_FALSE(m[id("maybe")] || m[id(" yes")] || m[ret]) << body;
    }
    // A number pattern: digits only, then <|return|> once there are two.
    std::vector<uint8_t> m =
        first_mask(R"({"prompt":"n?","max_tokens":3,"guided_regex":"[0-9]{2,3}"})", "/v1/completions");
    ASSERT_FALSE(m.empty());
    EXPECT_TRUE(m[id("7")] && m[id("42")] && m[id("123")]);
    EXPECT_FALSE(m[id("a")] || m[id(" ")] || m[ret]);
    auto c = server_.engine.last_request().constraint->start();
    c->accept(static_cast<int32_t>(id("42")));
    ASSERT_TRUE(c->allowed_next(&m));
    EXPECT_TRUE(m[ret] && m[id("7")]);
    EXPECT_FALSE(m[id("42")]);
    // Chat: the final message; the analysis before it is free.
    script("<|channel|>final<|message|>no<|return|>");
    Json j = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"hi"}],"guided_choice":["yes","no"]})");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "no");
    auto chat = server_.engine.last_request().constraint;
    ASSERT_NE(chat, nullptr);
    auto cc = chat->start();
    EXPECT_FALSE(cc->allowed_next(&m));  // the header is free
    expect_error(server_.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],
        "guided_regex":"a+","response_format":{"type":"json_object"}})"),
                 400);
    EXPECT_TRUE(server_.wait_engine_idle());
}

// vLLM's guided_grammar (and structured_outputs' grammar, llama.cpp's grammar): GBNF; on completions the whole
// output, on chat the final message, <|return|> once the text is complete; refusals name the line and column.
TEST_F(GenerationOutputTest, GuidedGrammar) {
    const int32_t ret = 200002;
    auto id = [](const std::string& t) {
        std::vector<int32_t> ids = harmony_ids(t);
        EXPECT_EQ(ids.size(), 1u) << t;
        return static_cast<size_t>(ids[0]);
    };
    server_.engine.set_script([](const EngineRequest&) { return harmony_ids("(1)"); });
    const std::string grammar = R"G(root ::= expr\nexpr ::= [0-9]+ | \"(\" expr (\"+\" expr)* \")\")G";
    for (const std::string& field :
         {"\"guided_grammar\":\"" + grammar + "\"", "\"structured_outputs\":{\"grammar\":\"" + grammar + "\"}",
          "\"grammar\":\"" + grammar + "\""}) {
        post_json("/v1/completions", R"({"prompt":"n?","max_tokens":5,)" + field + "}");
        auto f = server_.engine.last_request().constraint;
        ASSERT_NE(f, nullptr) << field;
        auto c = f->start();
        std::vector<uint8_t> m;
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[id("(")] && m[id("7")] && m[id("42")]) << field;
        EXPECT_FALSE(m[id(")")] || m[id("a")] || m[id(" (")] || m[ret]) << field;
        c->accept(static_cast<int32_t>(id("(")));
        c->accept(static_cast<int32_t>(id("42")));
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[id(")")] && m[id("+")] && m[id("7")]);
        EXPECT_FALSE(m[ret] || m[id("(")]);
        c->accept(static_cast<int32_t>(id(")")));
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[ret]);
        EXPECT_EQ(std::count(m.begin(), m.end(), 1), 1);
    }
    // Lark's form (vLLM converts it): the same language.
    post_json(
        "/v1/completions",
        R"({"prompt":"n?","max_tokens":5,"guided_grammar":"start: expr\nexpr: DIGIT+ | \"(\" expr (\"+\" expr)* \")\"\nDIGIT: \"0\"..\"9\""})");
    {
        auto c = server_.engine.last_request().constraint->start();
        std::vector<uint8_t> m;
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[id("(")] && m[id("7")] && m[id("42")]);
        EXPECT_FALSE(m[id(")")] || m[id("a")] || m[ret]);
        EXPECT_FALSE(m[id(" (")]);
    }
    // With a regular-expression terminal, an import and %ignore: blanks may stand before any token.
    post_json(
        "/v1/completions",
        R"({"prompt":"n?","max_tokens":5,"guided_grammar":"start: expr\nexpr: NUM | \"(\" expr (\"+\" expr)* \")\"\nNUM: /[0-9]+/\n%import common.WS_INLINE\n%ignore WS_INLINE"})");
    {
        auto c = server_.engine.last_request().constraint->start();
        std::vector<uint8_t> m;
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[id("(")] && m[id(" (")] && m[id("7")] && m[id("42")]);
        EXPECT_FALSE(m[id(")")] || m[id("a")] || m[ret]);
        c->accept(static_cast<int32_t>(id("42")));
        ASSERT_TRUE(c->allowed_next(&m));
        EXPECT_TRUE(m[ret] && m[id("7")] && m[id(" ")]);
        EXPECT_FALSE(m[id("(")] || m[id("a")]);
    }
    Json lark_err = expect_error(
        server_.post("/v1/completions", R"({"prompt":"x","guided_grammar":"%declare X\nstart: \"a\""})"), 400);
    EXPECT_NE(lark_err["message"].get<std::string>().find("line 1: the directive %declare"), std::string::npos)
        << lark_err.dump();
    // Chat: the final message; the header before it is free.
    script("<|channel|>final<|message|>(1)<|return|>");
    Json j = post_json("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"hi"}],"guided_grammar":")" + grammar + "\"}");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "(1)") << j.dump();
    auto chat = server_.engine.last_request().constraint;
    ASSERT_NE(chat, nullptr);
    std::vector<uint8_t> m;
    EXPECT_FALSE(chat->start()->allowed_next(&m));
    Json err = expect_error(
        server_.post("/v1/completions", R"({"prompt":"x","guided_grammar":"root ::= a\n\na ::= \"x\" | b"})"), 400);
    EXPECT_NE(err["message"].get<std::string>().find("line 3, column 13"), std::string::npos) << err.dump();
    EXPECT_NE(err["message"].get<std::string>().find("'b' is not defined"), std::string::npos) << err.dump();
    EXPECT_EQ(err["param"], "guided_grammar") << err.dump();
    EXPECT_TRUE(server_.wait_engine_idle());
}

// A completions batch: one choice per prompt (times n), in order; prompt tokens summed over the prompts.
TEST_F(GenerationOutputTest, CompletionsBatchOfPrompts) {
    server_.engine.set_script([](const EngineRequest& r) {
        std::vector<int32_t> out = harmony_ids(" after " + std::to_string(r.prompt.size()));
        out.push_back(200002);
        return out;
    });
    Json j = post_json("/v1/completions", R"({"prompt":["one", [1, 2, 3], "one two three four"],"max_tokens":8})");
    ASSERT_EQ(j["choices"].size(), 3u) << j.dump();
    const int64_t a = harmony_ids("one").size(), c = harmony_ids("one two three four").size();
    EXPECT_EQ(j["choices"][0]["text"], " after " + std::to_string(a));
    EXPECT_EQ(j["choices"][1]["text"], " after 3");
    EXPECT_EQ(j["choices"][2]["text"], " after " + std::to_string(c));
    EXPECT_EQ(j["usage"]["prompt_tokens"], a + 3 + c);
    // The summed usage has the one-choice shape: total_tokens at the top only, details by key.
    EXPECT_EQ(j["usage"]["total_tokens"],
              j["usage"]["prompt_tokens"].get<int64_t>() + j["usage"]["completion_tokens"].get<int64_t>());
    for (const char* details : {"prompt_tokens_details", "completion_tokens_details"})
        EXPECT_FALSE(j["usage"].value(details, Json::object()).contains("total_tokens")) << j["usage"];
    Json n2 = post_json("/v1/completions", R"({"prompt":["one", [1, 2, 3]],"max_tokens":8,"n":2})");
    ASSERT_EQ(n2["choices"].size(), 4u);
    EXPECT_EQ(n2["choices"][1]["text"], " after " + std::to_string(a));  // prompt 0, choice 1
    EXPECT_EQ(n2["choices"][2]["text"], " after 3");
    EXPECT_EQ(n2["usage"]["prompt_tokens"], a + 3);  // each prompt once

    bool done = false;
    std::vector<Json> chunks =
        post_stream("/v1/completions", R"({"prompt":["one", [1, 2, 3]],"max_tokens":8,"stream":true})", &done);
    EXPECT_TRUE(done);
    std::vector<std::string> text(2);
    for (const Json& ch : chunks) text.at(ch["choices"][0]["index"].get<size_t>()) += ch["choices"][0]["text"];
    EXPECT_EQ(text[0], " after " + std::to_string(a));
    EXPECT_EQ(text[1], " after 3");
    EXPECT_TRUE(server_.wait_engine_idle());
}

// ---- tool_choice "required" / named function: the reply start is forced in the prompt -----------

std::vector<int32_t> forced_named_header(const std::string& name) {
    const tokenizer::BpeTokenizer& tok = *test_tokenizer();
    std::vector<int32_t> ids = harmony_ids("<|start|>assistant<|channel|>");
    std::vector<int32_t> text = tok.encode_ordinary("commentary to=functions." + name + " ");
    ids.insert(ids.end(), text.begin(), text.end());
    ids.push_back(200003);  // <|constrain|>
    std::vector<int32_t> json = tok.encode_ordinary("json");
    ids.insert(ids.end(), json.begin(), json.end());
    ids.push_back(200008);  // <|message|>
    return ids;
}

std::vector<int32_t> forced_required_header() {
    std::vector<int32_t> ids = harmony_ids("<|start|>assistant<|channel|>");
    std::vector<int32_t> text = test_tokenizer()->encode_ordinary("commentary to=functions.");
    ids.insert(ids.end(), text.begin(), text.end());
    return ids;
}

bool ends_with(const std::vector<int32_t>& ids, const std::vector<int32_t>& suffix) {
    return ids.size() >= suffix.size() && std::equal(suffix.begin(), suffix.end(), ids.end() - suffix.size());
}

const char* kNamedChoice = R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})";

TEST_F(GenerationOutputTest, ToolChoiceNamedForcesHeader) {
    script("{\"x\":1}<|call|>");
    Json j = post_json("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") +
                                                   kTools + "," + kNamedChoice + "}");
    const std::vector<int32_t> prompt = server_.engine.last_request().prompt;
    const std::vector<int32_t> forced = forced_named_header("get_weather");
    EXPECT_TRUE(ends_with(prompt, forced)) << *test_tokenizer()->decode(prompt);
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_TRUE(c["message"]["content"].is_null());
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
    // The forced header is prompt; the completion is only what the engine generated.
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["completion_tokens"], harmony_ids("{\"x\":1}<|call|>").size());
    EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

TEST_F(GenerationOutputTest, ToolChoiceNamedStreamed) {
    script("{\"x\":1}<|call|>");
    bool done = false;
    std::vector<Json> chunks =
        post_stream("/v1/chat/completions",
                    std::string(R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,)") + kTools + "," +
                        kNamedChoice + "}",
                    &done);
    EXPECT_TRUE(done);
    EXPECT_TRUE(ends_with(server_.engine.last_request().prompt, forced_named_header("get_weather")));
    std::string args, name, finish;
    int starts = 0;
    for (const Json& ch : chunks) {
        const Json& choice = ch["choices"][0];
        EXPECT_FALSE(choice["delta"].contains("reasoning_content")) << ch.dump();
        if (choice["delta"].contains("content")) {
            EXPECT_EQ(choice["delta"]["content"], "") << ch.dump();
        }
        if (choice["delta"].contains("tool_calls")) {
            const Json& tc = choice["delta"]["tool_calls"][0];
            if (tc.contains("id")) {
                ++starts;
                name = tc["function"]["name"];
            }
            args += tc["function"]["arguments"].get<std::string>();
        }
        if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    EXPECT_EQ(starts, 1);
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(args, "{\"x\":1}");
    EXPECT_EQ(finish, "tool_calls");
}

TEST_F(GenerationOutputTest, ToolChoiceNamedCutByLength) {
    // The generated text still streams as the forced call's arguments; a truncated call is not a
    // call in the result (finish_reason "length"), as for any call cut by max_tokens.
    script("{\"city\":\"Paris\",\"days\":3}<|call|>");
    std::vector<Json> chunks =
        post_stream("/v1/chat/completions",
                    std::string(R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":2,)") +
                        kTools + "," + kNamedChoice + "}");
    std::string name, finish;
    bool args_streamed = false;
    for (const Json& ch : chunks) {
        const Json& choice = ch["choices"][0];
        EXPECT_FALSE(choice["delta"].contains("reasoning_content")) << ch.dump();
        if (choice["delta"].contains("tool_calls")) {
            const Json& tc = choice["delta"]["tool_calls"][0];
            if (tc.contains("id")) name = tc["function"]["name"];
            if (!tc["function"]["arguments"].get<std::string>().empty()) args_streamed = true;
        }
        if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_TRUE(args_streamed);
    EXPECT_EQ(finish, "length");
}

TEST_F(GenerationOutputTest, ToolChoiceRequiredForcesRecipientPrefix) {
    const std::string generated = "get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    script(generated);
    Json j = post_json("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") +
                                                   kTwoTools + R"(,"tool_choice":"required"})");
    const std::vector<int32_t> prompt = server_.engine.last_request().prompt;
    EXPECT_TRUE(ends_with(prompt, forced_required_header())) << *test_tokenizer()->decode(prompt);
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_TRUE(c["message"]["content"].is_null());
    EXPECT_TRUE(c["message"]["reasoning_content"].is_null());
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["completion_tokens"], harmony_ids(generated).size());

    // Streamed: one call, its name from the generated header.
    std::vector<Json> chunks = post_stream(
        "/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,)") +
                                    kTwoTools + R"(,"tool_choice":"required"})");
    std::string args, name, finish;
    for (const Json& ch : chunks) {
        const Json& choice = ch["choices"][0];
        if (choice["delta"].contains("tool_calls")) {
            const Json& tc = choice["delta"]["tool_calls"][0];
            if (tc.contains("id")) name = tc["function"]["name"];
            args += tc["function"]["arguments"].get<std::string>();
        }
        if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(args, "{\"city\":\"Paris\"}");
    EXPECT_EQ(finish, "tool_calls");
}

TEST_F(GenerationOutputTest, ToolChoiceRequiredCutInTheNameGivesNoCallAndNoText) {
    // max_tokens ends the reply inside the forced call header (session 15's probe: the header's words
    // came back as reasoning_content). Finish "length", no call, no content, no reasoning.
    script(" Fran");
    for (const char* path : {"/v1/chat/completions", "/v1/responses"}) {
        SCOPED_TRACE(path);
        const bool chat = std::string(path) == "/v1/chat/completions";
        Json j = post_json(
            path, chat ? std::string(R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,)") + kTwoTools +
                             R"(,"tool_choice":"required"})"
                       : std::string(R"({"input":"Hi","max_output_tokens":1,"tools":[{"type":"function",)"
                                     R"("name":"get_weather","parameters":{"type":"object"}},)"
                                     R"({"type":"function","name":"get_time","parameters":{"type":"object"}}],)"
                                     R"("tool_choice":"required"})"));
        if (chat) {
            const Json& c = j["choices"][0];
            EXPECT_EQ(c["finish_reason"], "length");
            EXPECT_TRUE(c["message"]["content"].is_null()) << j.dump();
            EXPECT_TRUE(!c["message"].contains("reasoning_content") || c["message"]["reasoning_content"].is_null())
                << j.dump();
            EXPECT_TRUE(!c["message"].contains("tool_calls") || c["message"]["tool_calls"].empty()) << j.dump();
        } else {
            EXPECT_EQ(j["status"], "incomplete") << j.dump();
            EXPECT_TRUE(j["output"].empty()) << j.dump();
        }
    }
}

// tool_choice required with a single declared function forces that function's whole header, as a
// named choice does (before session 26: only `commentary to=functions.`, the name left to the model).
TEST_F(GenerationOutputTest, ToolChoiceRequiredWithOneFunctionForcesItsName) {
    script("{\"city\":\"Oslo\"}<|call|>");
    Json j = post_json("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") +
                                                   kTools + R"(,"tool_choice":"required"})");
    EXPECT_TRUE(ends_with(server_.engine.last_request().prompt, forced_named_header("get_weather")));
    const Json& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << j.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << j.dump();
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
}

TEST_F(GenerationOutputTest, ToolChoiceNoneAndAutoForceNothing) {
    for (const char* choice : {R"("none")", R"("auto")"}) {
        script("<|channel|>final<|message|>Hello.<|return|>");
        Json j = post_json("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") +
                                                       kTools + R"(,"tool_choice":)" + choice + "}");
        const std::vector<int32_t> prompt = server_.engine.last_request().prompt;
        EXPECT_TRUE(ends_with(prompt, harmony_ids("<|end|><|start|>assistant"))) << choice;
        EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello.");
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
        EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    }
}

TEST_F(GenerationOutputTest, ToolChoiceUnknownFunctionIs400) {
    auto r =
        server_.post("/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") + kTools +
                                                 R"(,"tool_choice":{"type":"function","function":{"name":"nope"}}})");
    Json e = expect_error(r, 400);
    ASSERT_TRUE(e["param"].is_string()) << e.dump();
    EXPECT_EQ(e["param"].get<std::string>().rfind("tool_choice", 0), 0u) << e.dump();
}

}  // namespace
}  // namespace gptoss::server::testing
