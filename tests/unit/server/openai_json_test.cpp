// The JSON layer without sockets: validation of the three request bodies, the error mapping, the
// stop-string matcher and the Prometheus text.
#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/openai_json.h"
#include "server/sessions.h"
#include "structured/json_grammar.h"
#include "structured/structural_tag.h"

namespace gptoss::server {
namespace {

Json j(const char* text) { return Json::parse(text); }
Json j(const std::string& text) { return Json::parse(text); }

std::string param_of(const Status& st) { return api_error(st).param.value_or(""); }

TEST(ParseJsonBody, RejectsNonObjectsInvalidUtf8AndDeepNesting) {
    EXPECT_TRUE(parse_json_body(R"({"a":1})").ok());
    EXPECT_EQ(parse_json_body("").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parse_json_body("{").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parse_json_body("[1,2]").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parse_json_body("\"s\"").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parse_json_body("{\"a\":\"\xff\xfe\"}").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parse_json_body(R"({"a":"\ud800"})").status().code(), StatusCode::kInvalidArgument);
    std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
    EXPECT_EQ(parse_json_body(deep).status().code(), StatusCode::kInvalidArgument);
    // Brackets inside strings do not count as nesting.
    std::string in_string = "{\"a\":\"" + std::string(1000, '[') + "\"}";
    EXPECT_TRUE(parse_json_body(in_string).ok());
    // Objects of more than kMaxJsonMembers members are refused before parsing (the parser's cost is
    // quadratic in them): the limit holds per object, and colons inside strings or array elements
    // are not members.
    auto object_of = [](int n, const std::string& value) {
        std::string o = "{";
        for (int i = 0; i < n; ++i) o += (i ? ",\"" : "\"") + std::to_string(i) + "\":" + value;
        return o + "}";
    };
    EXPECT_TRUE(parse_json_body("{\"logit_bias\":" + object_of(kMaxJsonMembers, "1") + "}").ok());
    auto too_many = parse_json_body("{\"logit_bias\":" + object_of(kMaxJsonMembers + 1, "1") + "}");
    ASSERT_FALSE(too_many.ok());
    EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(too_many.status().message().find("more than 4096 members"), std::string::npos);
    EXPECT_TRUE(parse_json_body(object_of(kMaxJsonMembers, "\"a:b:c\"")).ok());
    EXPECT_TRUE(parse_json_body("{\"a\":[" + object_of(3000, "1") + "," + object_of(3000, "1") + "]}").ok());
    std::string colons = "{\"a\":\"" + std::string(10000, ':') + "\"}";
    EXPECT_TRUE(parse_json_body(colons).ok());
}

// vLLM's structured_outputs disable_any_whitespace: the JSON output (structured_outputs json / json_object, or chat's
// response_format) takes no whitespace between tokens; without it up to kMaxWhitespaceRun bytes a run.
TEST(ParseChatRequest, DisableAnyWhitespace) {
    auto feeds = [](const structured::JsonGrammar& g, const char* text) {
        structured::JsonMatcher m(g);
        return m.feed(text) && m.accepting();
    };
    auto chat = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"response_format":{
        "type":"json_schema","json_schema":{"name":"p","schema":{"type":"object","properties":{"x":{"type":"array"}}}}},
        "structured_outputs":{"disable_any_whitespace":true}})"));
    ASSERT_TRUE(chat.ok()) << chat.status().to_string();
    ASSERT_NE(chat->grammar, nullptr);
    EXPECT_TRUE(feeds(*chat->grammar, R"({"x":[1,"a b"]})"));
    EXPECT_FALSE(feeds(*chat->grammar, R"({"x": [1,"a b"]})"));
    EXPECT_FALSE(feeds(*chat->grammar, R"({"x":[1, 2]} )"));
    auto completion = parse_completion_request(
        j(R"({"prompt":"x","structured_outputs":{"disable_any_whitespace":true,"json_object":true}})"), 1000);
    ASSERT_TRUE(completion.ok()) << completion.status().to_string();
    ASSERT_NE(completion->sampling.grammar, nullptr);
    EXPECT_TRUE(feeds(*completion->sampling.grammar, R"({"a":{}})"));
    EXPECT_FALSE(feeds(*completion->sampling.grammar, "{ }"));
    auto spaced = parse_completion_request(j(R"({"prompt":"x","structured_outputs":{"json_object":true}})"), 1000);
    ASSERT_TRUE(spaced.ok());
    EXPECT_TRUE(feeds(*spaced->sampling.grammar, "{ }"));
    auto bad = parse_chat_request(
        j(R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{"disable_any_whitespace":"yes"}})"));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("disable_any_whitespace"), std::string::npos) << bad.status().message();
}

// Structural tags: chat's response_format {"type": "structural_tag", ...} (vLLM's and SGLang's form, legacy or
// xgrammar's `format`), structured_outputs.structural_tag as an object or as a string of one (vLLM's type) on chat
// and completions; errors name the field inside the tag; one constraint only.
TEST(ParseChatRequest, StructuralTags) {
    auto feeds = [](const structured::StructuralTag& t, const char* text) {
        structured::StructuralTagMatcher m(t);
        return m.feed(text) && m.accepting();
    };
    const std::string legacy =
        R"({"type":"structural_tag","structures":[{"begin":"<function=f>","schema":{"type":"object",)"
        R"("properties":{"a":{"type":"integer"}},"required":["a"]},"end":"</function>"}],"triggers":["<function="]})";
    auto chat =
        parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"response_format":)" + legacy + "}"));
    ASSERT_TRUE(chat.ok()) << chat.status().to_string();
    EXPECT_EQ(chat->grammar, nullptr);
    ASSERT_NE(chat->sampling.tag, nullptr);
    EXPECT_TRUE(feeds(*chat->sampling.tag, R"(Calling <function=f>{"a": 1}</function>.)"));
    EXPECT_FALSE(feeds(*chat->sampling.tag, R"(<function=f>{"a": "1"}</function>)"));
    // As a string inside structured_outputs, with disable_any_whitespace.
    auto dense = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{)"
                                      R"("disable_any_whitespace":true,"structural_tag":)" +
                                      Json(legacy).dump() + "}}"));
    ASSERT_TRUE(dense.ok()) << dense.status().to_string();
    ASSERT_NE(dense->sampling.tag, nullptr);
    EXPECT_TRUE(feeds(*dense->sampling.tag, R"(<function=f>{"a":1}</function>)"));
    EXPECT_FALSE(feeds(*dense->sampling.tag, R"(<function=f>{"a": 1}</function>)"));
    auto completion = parse_completion_request(
        j(R"({"prompt":"x","structured_outputs":{"structural_tag":{"type":"structural_tag","format":)"
          R"({"type":"const_string","value":"ok"}}}})"),
        1000);
    ASSERT_TRUE(completion.ok()) << completion.status().to_string();
    ASSERT_NE(completion->sampling.tag, nullptr);
    EXPECT_TRUE(feeds(*completion->sampling.tag, "ok"));
    const struct {
        std::string body;
        const char* param;
        StatusCode code;
    } bad[] = {
        {R"("response_format":{"type":"structural_tag","format":{"type":"tag","begin":"<a>","content":{"type":"any_text"}}})",
         "response_format.format.end", StatusCode::kInvalidArgument},
        {R"("response_format":{"type":"structural_tag","format":{"type":"token","token":3}})",
         "response_format.format.type", StatusCode::kUnimplemented},
        {R"("response_format":{"type":"structural_tag"})", "response_format.format", StatusCode::kInvalidArgument},
        {R"("structured_outputs":{"structural_tag":"{not json"})", "structured_outputs.structural_tag",
         StatusCode::kInvalidArgument},
        {R"("structured_outputs":{"structural_tag":7})", "structured_outputs.structural_tag",
         StatusCode::kInvalidArgument},
        {R"("structured_outputs":{"structural_tag":")" + std::string(300, '[') + R"("})",
         "structured_outputs.structural_tag", StatusCode::kInvalidArgument},
        {R"("structured_outputs":{"structural_tag":"{\"format\":{\"type\":\"regex\",\"pattern\":\"(\"}}"})",
         "structured_outputs.structural_tag.format.pattern", StatusCode::kInvalidArgument},
        {R"("structured_outputs":{"structural_tag":{"format":{"type":"const_string","value":"a"}},"regex":"a"})",
         "guided_json", StatusCode::kInvalidArgument},
        {R"("response_format":)" + legacy + R"(,"guided_regex":"a")", "response_format", StatusCode::kInvalidArgument},
    };
    for (const auto& b : bad) {
        auto r = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],)" + b.body + "}"));
        ASSERT_FALSE(r.ok()) << b.body;
        EXPECT_EQ(param_of(r.status()), b.param) << r.status().message();
        EXPECT_EQ(r.status().code(), b.code) << r.status().message();
    }
    // The Responses API's text.format has no structural tag (OpenAI's types).
    auto responses = parse_responses_request(
        j(R"({"input":"x","text":{"format":{"type":"structural_tag","format":{"type":"any_text"}}}})"), {});
    ASSERT_FALSE(responses.ok());
    EXPECT_EQ(param_of(responses.status()), "text.format.type") << responses.status().message();
}

// vLLM's completions take chat's response_format (it was ignored here): json_object, json_schema and structural_tag
// hold the whole output; with a guided_* field it is a 400.
TEST(ParseCompletionRequest, ResponseFormatHoldsTheOutput) {
    auto schema = parse_completion_request(
        j(R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"integer"}}}})"),
        1000);
    ASSERT_TRUE(schema.ok()) << schema.status().to_string();
    ASSERT_NE(schema->sampling.grammar, nullptr);
    structured::JsonMatcher m(*schema->sampling.grammar);
    EXPECT_TRUE(m.feed("12") && m.accepting());
    EXPECT_FALSE(m.feed("\"a\""));
    auto object = parse_completion_request(j(R"({"prompt":"x","response_format":{"type":"json_object"}})"), 1000);
    ASSERT_TRUE(object.ok());
    EXPECT_NE(object->sampling.grammar, nullptr);
    auto text = parse_completion_request(j(R"({"prompt":"x","response_format":{"type":"text"}})"), 1000);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(text->sampling.grammar, nullptr);
    auto tag = parse_completion_request(
        j(R"({"prompt":"x","response_format":{"type":"structural_tag","format":{"type":"const_string","value":"a"}}})"),
        1000);
    ASSERT_TRUE(tag.ok()) << tag.status().to_string();
    EXPECT_NE(tag->sampling.tag, nullptr);
    auto both = parse_completion_request(
        j(R"({"prompt":"x","response_format":{"type":"json_object"},"guided_regex":"a"})"), 1000);
    ASSERT_FALSE(both.ok());
    EXPECT_EQ(param_of(both.status()), "response_format");
    auto bad = parse_completion_request(j(R"({"prompt":"x","response_format":{"type":"xml"}})"), 1000);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(param_of(bad.status()), "response_format.type");
}

// vLLM's allowed_token_ids: a non-empty array of ids (whether they are in the vocabulary is the routes' check).
TEST(ParseCompletionRequest, AllowedTokenIds) {
    auto ok = parse_completion_request(j(R"({"prompt":"x","allowed_token_ids":[5,7,5]})"), 1000);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(ok->sampling.allowed_token_ids, (std::vector<int32_t>{5, 7, 5}));
    for (const auto& [body, param] :
         {std::pair{R"({"prompt":"x","allowed_token_ids":[]})", "allowed_token_ids"},
          std::pair{R"({"prompt":"x","allowed_token_ids":3})", "allowed_token_ids"},
          std::pair{R"({"prompt":"x","allowed_token_ids":[1,"a"]})", "allowed_token_ids[1]"},
          std::pair{R"({"prompt":"x","allowed_token_ids":[-1]})", "allowed_token_ids[0]"}}) {
        auto r = parse_completion_request(j(body), 1000);
        ASSERT_FALSE(r.ok()) << body;
        EXPECT_EQ(param_of(r.status()), param) << r.status().message();
    }
    auto chat = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"allowed_token_ids":[1]})"));
    ASSERT_TRUE(chat.ok());
    EXPECT_EQ(chat->sampling.allowed_token_ids, (std::vector<int32_t>{1}));
}

TEST(ParseChatRequest, ResponseFormats) {
    auto text =
        parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})"));
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(text->grammar, nullptr);
    auto object = parse_chat_request(
        j(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})"));
    ASSERT_TRUE(object.ok()) << object.status().to_string();
    ASSERT_NE(object->grammar, nullptr);
    EXPECT_EQ(object->grammar->node(object->grammar->root()).kind, structured::SchemaNode::Kind::kObject);
    auto schema = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"response_format":{
        "type":"json_schema","json_schema":{"name":"point","strict":true,
        "schema":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}}}})"));
    ASSERT_TRUE(schema.ok()) << schema.status().to_string();
    ASSERT_NE(schema->grammar, nullptr);
    structured::JsonMatcher m(*schema->grammar);
    EXPECT_TRUE(m.feed(R"({"x":1.5})") && m.accepting());
    // Errors name the field: a missing name, a bad one, a schema keyword the output cannot be held to.
    const std::pair<const char*, const char*> bad[] = {
        {R"({"type":"json_schema","json_schema":{}})", "response_format.json_schema.name"},
        {R"({"type":"json_schema","json_schema":{"name":"a/b"}})", "response_format.json_schema.name"},
        {R"({"type":"json_schema","json_schema":{"name":"n","schema":[]}})", "response_format.json_schema.schema"},
        {R"({"type":"json_schema","json_schema":{"name":"n","schema":{"properties":{"a":{"minimum":1}}}}})",
         "response_format.json_schema.schema"},
        {R"({"type":"json_schema"})", "response_format.json_schema"},
        {R"({"type":"yaml"})", "response_format.type"},
    };
    for (const auto& [rf, param] : bad) {
        auto p = parse_chat_request(
            j((std::string(R"({"messages":[{"role":"user","content":"x"}],"response_format":)") + rf + "}").c_str()));
        ASSERT_FALSE(p.ok()) << rf;
        EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << rf;
        EXPECT_EQ(api_error(p.status()).param, param) << p.status().to_string();
    }
    auto minimum = parse_chat_request(j(R"({"messages":[{"role":"user","content":"x"}],"response_format":{
        "type":"json_schema","json_schema":{"name":"n","schema":{"properties":{"a":{"minimum":1}}}}}})"));
    EXPECT_NE(minimum.status().message().find("/properties/a/minimum"), std::string::npos)
        << minimum.status().to_string();
}

TEST(ParseResponsesRequest, TextFormatJsonSchema) {
    auto r = parse_responses_request(j(R"({"input":"x","text":{"format":{"type":"json_schema","name":"p",
        "description":"a point","schema":{"type":"object","properties":{"x":{"type":"integer"}}},"strict":true}}})"));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_NE(r->chat.grammar, nullptr);
    // The chat form carries it for the developer message; the echo gives the format back.
    EXPECT_EQ(r->chat.chat_body["response_format"]["type"], "json_schema");
    EXPECT_EQ(r->chat.chat_body["response_format"]["json_schema"]["name"], "p");
    EXPECT_EQ(r->chat.chat_body["response_format"]["json_schema"]["description"], "a point");
    EXPECT_EQ(r->echo["text"]["format"]["name"], "p");
    auto o = parse_responses_request(j(R"({"input":"x","text":{"format":{"type":"json_object"}}})"));
    ASSERT_TRUE(o.ok());
    EXPECT_NE(o->chat.grammar, nullptr);
    EXPECT_EQ(o->echo["text"]["format"]["type"], "json_object");
}

TEST(ParseChatRequest, AcceptsAFullRequest) {
    auto p = parse_chat_request(j(R"({
        "model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": null, "reasoning_content": "r",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "reasoning_effort": "high", "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "seed": 3, "stop": ["x", "y"], "n": 1, "logprobs": true, "top_logprobs": 2,
        "stream": true, "stream_options": {"include_usage": true}})"));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->sampling.max_tokens, 7);
    EXPECT_FLOAT_EQ(p->sampling.sampling.temperature, 0.5f);
    EXPECT_EQ(p->sampling.sampling.seed, 3u);
    EXPECT_EQ(p->sampling.stop.size(), 2u);
    EXPECT_TRUE(p->logprobs);
    EXPECT_EQ(p->top_logprobs, 2);
    EXPECT_TRUE(p->stream);
    EXPECT_TRUE(p->include_usage);
    // top_logprobs 0 asks for nothing: accepted without logprobs (vLLM); 3 without it is refused (below).
    auto zero = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 0})"));
    ASSERT_TRUE(zero.ok()) << zero.status().message();
    EXPECT_FALSE(zero->logprobs);
}

TEST(ParseChatRequest, NamesTheBadField) {
    struct Case {
        const char* body;
        const char* param;
    };
    const Case cases[] = {
        {R"({})", "messages"},
        {R"({"messages": "hi"})", "messages"},
        {R"({"messages": []})", "messages"},
        {R"({"messages": [1]})", "messages[0]"},
        {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature"},
        {R"({"messages": [{"role": "user", "content": "x"}], "metadata": {"k": ["v"]}})", "metadata"},
        {R"({"messages": [{"role": "user", "content": "x"}], "verbosity": "terse"})", "verbosity"},
        {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_p": -0.1})", "top_p"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5})", "top_p"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5})", "max_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "max_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})", "max_completion_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 18446744073709551616})", "max_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9223372036854775808})", "max_tokens"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_k": "x"})", "top_k"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_k": -2})", "top_k"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_k": 1.5})", "top_k"},
        {R"({"messages": [{"role": "user", "content": "x"}], "min_p": 2})", "min_p"},
        {R"({"messages": [{"role": "user", "content": "x"}], "min_p": -0.1})", "min_p"},
        {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0})", "repetition_penalty"},
        {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": -1})", "repetition_penalty"},
        {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1e-300})", "repetition_penalty"},
        {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1e-45})", "repetition_penalty"},
        {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": "high"})", "repetition_penalty"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
         "stream_options"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stream": false, "stream_options": {}})",
         "stream_options"},
        {R"({"messages": [{"role": "user", "content": "x"}], "n": 129})", "n"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stop": 5})", "stop"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})", "top_logprobs"},
        {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50})", "top_logprobs"},
        {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})", "reasoning_effort"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0].function"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
        {R"({"messages": [{"role": "user", "content": "x"}],
             "tools": [{"type": "function", "function": {"name": "f"}}],
             "tool_choice": {"type": "function", "function": {"name": "g"}}})",
         "tool_choice.function.name"},
        {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]})",
         "messages[0].tool_calls[0].function.name"},
        {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
             "function": {"name": "f", "arguments": 5}}]}]})",
         "messages[0].tool_calls[0].function.arguments"},
    };
    for (const Case& c : cases) {
        auto p = parse_chat_request(j(c.body));
        ASSERT_FALSE(p.ok()) << c.body;
        EXPECT_EQ(http_status_for(p.status().code()), 400) << c.body;
        EXPECT_EQ(param_of(p.status()), c.param) << c.body << " -> " << p.status().message();
    }
    // Absent or null arguments are a call without arguments (rendered "{}", harmony_render_test).
    for (const char* fn : {R"({"name": "f"})", R"({"name": "f", "arguments": null})"}) {
        auto p = parse_chat_request(j(std::string(R"({"messages": [{"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": )") +
                                      fn + "}]}]}"));
        EXPECT_TRUE(p.ok()) << fn << " -> " << p.status().to_string();
    }
}

TEST(ParseResponsesRequest, TranslatesItemsToChatMessages) {
    auto r = parse_responses_request(j(R"({
        "model": "m", "instructions": "be brief", "reasoning": {"effort": "low"}, "max_output_tokens": 9,
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": "weather?"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}]})"));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Json& chat = r->chat.chat_body;
    ASSERT_EQ(chat["messages"].size(), 5u);
    EXPECT_EQ(chat["messages"][0]["role"], "developer");
    EXPECT_EQ(chat["messages"][1]["content"], "weather?");
    // The reasoning item is dropped: an assistant message item follows it (HARMONY.md §5.3).
    EXPECT_FALSE(chat["messages"][2].contains("reasoning_content")) << chat["messages"][2].dump();
    EXPECT_EQ(chat["messages"][2]["tool_calls"][0]["function"]["name"], "f");
    EXPECT_EQ(chat["messages"][3]["role"], "tool");
    EXPECT_EQ(chat["messages"][3]["tool_call_id"], "c1");
    EXPECT_EQ(chat["messages"][4]["content"], "ok");
    EXPECT_EQ(chat["tools"][0]["function"]["name"], "f");
    // An earlier answer fed back with a refusal part (OpenAI's output message content: output_text | refusal).
    auto refused = parse_responses_request(j(R"({"input": [{"role": "user", "content": "x"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "y"}]})"));
    ASSERT_TRUE(refused.ok()) << refused.status().to_string();
    EXPECT_EQ(refused->chat.chat_body["messages"][1]["content"], "no");
    EXPECT_EQ(chat["reasoning_effort"], "low");
    EXPECT_EQ(r->chat.sampling.max_tokens, 9);
    EXPECT_EQ(r->echo["instructions"], "be brief");
}

// HARMONY.md §5.3: a reasoning item is kept only after the last assistant message item and while
// the last input item is a function_call_output (before session 26 it was kept unless a final
// followed, the chat rule).
TEST(ParseResponsesRequest, ReasoningItemsKeptOnlyInAToolLoop) {
    const std::string reasoning =
        R"({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]})";
    const std::string call = R"({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"})";
    const std::string output = R"({"type": "function_call_output", "call_id": "c1", "output": "sunny"})";
    const std::string user = R"({"role": "user", "content": "q"})";
    const std::string assistant =
        R"({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]})";
    const struct {
        std::string items;
        bool kept;
    } cases[] = {
        {user + "," + reasoning + "," + call + "," + output, true},
        {user + "," + assistant + "," + user + "," + reasoning + "," + call + "," + output, true},
        {user + "," + reasoning + "," + user, false},
        {user + "," + reasoning + "," + call + "," + output + "," + user, false},
        {user + "," + reasoning + "," + assistant + "," + user + "," + call + "," + output, false},
    };
    for (const auto& c : cases) {
        auto r = parse_responses_request(j((R"({"input": [)" + c.items + "]}").c_str()));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        bool found = false;
        for (const Json& m : r->chat.chat_body["messages"]) found |= m.contains("reasoning_content");
        EXPECT_EQ(found, c.kept) << c.items;
    }
}

TEST(ParseResponsesRequest, EchoesTheRequestsNumbers) {
    auto r = parse_responses_request(j(R"({"input": "x", "temperature": 0.3, "top_p": 0.9, "background": false})"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->echo["temperature"].dump(), "0.3");  // not the sampler's float, 0.30000001192092896
    EXPECT_EQ(r->echo["top_p"].dump(), "0.9");
    auto d = parse_responses_request(j(R"({"input": "x"})"));
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(d->echo["temperature"].is_number());
    EXPECT_TRUE(d->echo["user"].is_null());
    auto u = parse_responses_request(
        j(R"({"input": "x", "user": "u1", "truncation": "auto", "reasoning": {"summary": "auto"}})"));
    ASSERT_TRUE(u.ok()) << u.status().message();
    EXPECT_EQ(u->echo["user"], "u1");
    EXPECT_EQ(u->echo["truncation"], "auto");  // the first turns are dropped to fit the context (the routes do it)
    EXPECT_TRUE(u->truncation_auto);
    // reasoning.summary as asked (OpenAI echoes it; null before session 67), null when not asked.
    EXPECT_EQ(u->echo["reasoning"]["summary"], "auto");
    EXPECT_TRUE(d->echo["reasoning"]["summary"].is_null());
    // OpenAI's Response object carries these whether asked or not: the defaults, then the request's.
    EXPECT_EQ(d->echo["text"]["verbosity"], "medium");
    EXPECT_EQ(d->echo["parallel_tool_calls"], true);  // OpenAI's default, echoed as asked
    auto np = parse_responses_request(j(R"({"input": "x", "parallel_tool_calls": false})"));
    ASSERT_TRUE(np.ok());
    EXPECT_EQ(np->echo["parallel_tool_calls"], false);
    EXPECT_TRUE(d->echo["max_tool_calls"].is_null());
    EXPECT_TRUE(d->echo["prompt_cache_key"].is_null());
    EXPECT_TRUE(d->echo["safety_identifier"].is_null());
    auto v = parse_responses_request(j(R"({"input": "x", "text": {"verbosity": "low"}, "max_tool_calls": 3,
                                           "prompt_cache_key": "k1", "safety_identifier": "s1"})"));
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->echo["text"]["verbosity"], "low");
    EXPECT_EQ(v->echo["text"]["format"]["type"], "text");
    EXPECT_EQ(v->echo["max_tool_calls"], 3);
    EXPECT_EQ(v->echo["prompt_cache_key"], "k1");
    EXPECT_EQ(v->echo["safety_identifier"], "s1");
}

// metadata as OpenAI limits it: 16 pairs, keys of 64 characters, values of 512 (characters, not bytes).
TEST(ParseRequests, MetadataLimits) {
    auto body = [](const Json& metadata) {
        return Json{{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}, {"metadata", metadata}};
    };
    auto responses_body = [](const Json& metadata) { return Json{{"input", "x"}, {"metadata", metadata}}; };
    Json sixteen = Json::object(), seventeen;
    for (char c = 'a'; c < 'a' + 16; ++c) sixteen[std::string(1, c)] = "v";
    seventeen = sixteen;
    seventeen["q"] = "v";
    std::string key64, value512, key65, value513;
    for (int i = 0; i < 64; ++i) key64.append("\xc3\xa9");          // é: 2 bytes, 1 character
    for (int i = 0; i < 512; ++i) value512.append("\xe2\x82\xac");  // €: 3 bytes, 1 character
    key65 = key64;
    key65.push_back('a');
    value513 = value512;
    value513.push_back('a');
    const Json at_limit = {{key64, value512}};
    const Json long_key = {{key65, "v"}};
    const Json long_value = {{"k", value513}};
    for (const Json& ok : {sixteen, at_limit}) {
        EXPECT_TRUE(parse_chat_request(body(ok)).ok()) << ok.dump();
        EXPECT_TRUE(parse_responses_request(responses_body(ok)).ok()) << ok.dump();
    }
    for (const Json& bad : {seventeen, long_key, long_value}) {
        auto c = parse_chat_request(body(bad));
        ASSERT_FALSE(c.ok()) << bad.dump();
        EXPECT_EQ(param_of(c.status()), "metadata") << c.status().message();
        auto r = parse_responses_request(responses_body(bad));
        ASSERT_FALSE(r.ok()) << bad.dump();
        EXPECT_EQ(param_of(r.status()), "metadata") << r.status().message();
    }
}

// The deprecated function-calling fields are refused with OpenAI's unsupported_parameter code (they were
// silently ignored: the functions never reached the model).
TEST(ParseChatRequest, RefusesTheDeprecatedFunctionFields) {
    for (const char* field :
         {R"("functions": [{"name": "f", "parameters": {"type": "object"}}])", R"("function_call": "auto")"}) {
        auto r = parse_chat_request(
            j((std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + field + "}").c_str()));
        ASSERT_FALSE(r.ok()) << field;
        EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << field;
        EXPECT_NE(r.status().message().find("use tools and tool_choice"), std::string::npos) << r.status().message();
    }
    EXPECT_TRUE(parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "functions": null})")).ok());
}

// vLLM's and llama.cpp's sampling extensions reach the engine's parameters (they were ignored
// before session 25); -1 and 0 turn top_k off; a seed may be any 64-bit integer, signed or unsigned (-1: random).
TEST(ParseChatRequest, SamplingExtensionsAndSeeds) {
    auto p = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "top_k": 1, "min_p": 0.25,
                                     "repetition_penalty": 1.3, "seed": 18446744073709551615})"));
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->sampling.sampling.top_k, 1);
    EXPECT_FLOAT_EQ(p->sampling.sampling.min_p, 0.25f);
    EXPECT_FLOAT_EQ(p->sampling.sampling.repetition_penalty, 1.3f);
    ASSERT_TRUE(p->sampling.sampling.seed.has_value());
    EXPECT_EQ(*p->sampling.sampling.seed, 18446744073709551615ull);
    for (const char* k : {"-1", "0"}) {
        auto q = parse_chat_request(
            j((std::string(R"({"messages": [{"role": "user", "content": "x"}], "top_k": )") + k + "}").c_str()));
        ASSERT_TRUE(q.ok()) << q.status().message();
        EXPECT_EQ(q->sampling.sampling.top_k, 0) << k;
    }
    // -1 asks for a random seed (vLLM, llama.cpp); other negative seeds are seeds by their two's complement.
    auto random = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "seed": -1})"));
    ASSERT_TRUE(random.ok()) << random.status().message();
    EXPECT_FALSE(random->sampling.sampling.seed.has_value());
    auto neg = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "seed": -2})"));
    ASSERT_TRUE(neg.ok()) << neg.status().message();
    ASSERT_TRUE(neg->sampling.sampling.seed.has_value());
    EXPECT_EQ(*neg->sampling.sampling.seed, 18446744073709551614ull);
    auto big =
        parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "seed": 9223372036854775808})"));
    ASSERT_TRUE(big.ok()) << big.status().message();
    EXPECT_EQ(*big->sampling.sampling.seed, 9223372036854775808ull);
    // Past 2^64: the range said int64's (though 2^64 - 1 is taken) and printed the value as 1.84467e+19.
    auto past =
        parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "seed": 18446744073709551616})"));
    ASSERT_FALSE(past.ok());
    EXPECT_NE(past.status().message().find(
                  "must be an integer from -9223372036854775808 to 18446744073709551615, got 1.8446744073709552e+19"),
              std::string::npos)
        << past.status().message();
    // A max_tokens past 64 bits: the message named int64's limits as if they were the field's range.
    auto huge =
        parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9223372036854775808})"));
    ASSERT_FALSE(huge.ok());
    EXPECT_NE(huge.status().message().find("must be a 64-bit integer, got 9223372036854775808"), std::string::npos)
        << huge.status().message();
    auto streamed = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
                                            "stream_options": {"include_usage": true}})"));
    ASSERT_TRUE(streamed.ok()) << streamed.status().message();
    EXPECT_TRUE(streamed->include_usage);
}

TEST(ParseChatRequest, IntegralFloatsAreIntegers) {
    // 16.0 is an integer to vLLM's request models; 1.5 is not (rejected above).
    auto p = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 16.0})"));
    ASSERT_TRUE(p.ok()) << p.status().message();
    ASSERT_TRUE(p->sampling.max_tokens.has_value());
    EXPECT_EQ(*p->sampling.max_tokens, 16);
}

// OpenAI's tool_choice allowed_tools: only the listed tools are offered (as the chat form harmony renders), the
// mode becoming tool_choice; both request shapes.
TEST(ParseToolChoice, AllowedToolsOfferOnlyThoseTools) {
    const char* tools = R"("tools": [{"type": "function", "function": {"name": "a"}},
                                      {"type": "function", "function": {"name": "b"}},
                                      {"type": "function", "function": {"name": "c"}}])";
    auto chat = parse_chat_request(j(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + tools +
                                     R"(, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required",
                                        "tools": [{"type": "function", "function": {"name": "c"}},
                                                  {"type": "function", "function": {"name": "a"}}]}}})"));
    ASSERT_TRUE(chat.ok()) << chat.status().message();
    EXPECT_EQ(chat->chat_body["tool_choice"], "required");
    ASSERT_EQ(chat->chat_body["tools"].size(), 2u);
    EXPECT_EQ(chat->chat_body["tools"][0]["function"]["name"], "a");  // in the declared order
    EXPECT_EQ(chat->chat_body["tools"][1]["function"]["name"], "c");
    auto r = parse_responses_request(j(R"({"input": "x", "tools": [{"type": "function", "name": "a"},
        {"type": "function", "name": "b"}], "tool_choice": {"type": "allowed_tools", "mode": "auto",
        "tools": [{"type": "function", "name": "b"}]}})"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->chat.chat_body["tool_choice"], "auto");
    ASSERT_EQ(r->chat.chat_body["tools"].size(), 1u);
    EXPECT_EQ(r->chat.chat_body["tools"][0]["function"]["name"], "b");
    EXPECT_EQ(r->echo["tool_choice"]["type"], "allowed_tools");  // echoed as given
    const std::pair<std::string, const char*> bad[] = {
        {R"("tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto",
            "tools": [{"type": "function", "function": {"name": "z"}}]}})",
         "tool_choice.allowed_tools.tools[0].function.name"},
        {R"("tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": [
            {"type": "function", "function": {"name": "a"}}]}})",
         "tool_choice.allowed_tools.mode"},
        {R"("tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "none", "tools": []}})",
         "tool_choice.allowed_tools.mode"},
        {R"("tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}})",
         "tool_choice.allowed_tools.tools"},
        {R"("tool_choice": {"type": "allowed_tools"})", "tool_choice.allowed_tools"},
    };
    for (const auto& [choice, param] : bad) {
        auto e = parse_chat_request(
            j(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + tools + ", " + choice + "}"));
        ASSERT_FALSE(e.ok()) << choice;
        EXPECT_EQ(api_error(e.status()).param, param) << e.status().message();
    }
}

TEST(EncryptedReasoning, RoundTripsAnyTextAndRefusesWhatItDidNotMake) {
    for (const std::string& text :
         std::vector<std::string>{"", "a", "ab", "abc", "abcd", "Ünïcode ✓ 思考", std::string(1000, 'z')}) {
        const std::string e = reasoning_encrypted_content(text);
        EXPECT_EQ(reasoning_from_encrypted_content(e), text) << e;
        EXPECT_EQ(e.find(text.size() > 3 ? text : std::string("\x01")), std::string::npos);  // not the plain text
    }
    const std::string good = reasoning_encrypted_content("abcd");
    for (const std::string& bad :
         std::vector<std::string>{std::string("gAAAAAB"), good.substr(0, good.size() - 1),
                                  good + "====", good.substr(0, good.size() - 4) + "*AAA",
                                  good.substr(0, good.size() - 4) + "A=AA", reasoning_encrypted_content("\xff\xfe")}) {
        EXPECT_EQ(reasoning_from_encrypted_content(bad), std::nullopt) << bad;
    }
    auto r = parse_responses_request(j(R"({"input": "x", "include": ["reasoning.encrypted_content"]})"));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->include_encrypted_reasoning);
    EXPECT_FALSE(parse_responses_request(j(R"({"input": "x"})"))->include_encrypted_reasoning);
}

TEST(ParseResponsesRequest, StoredResponsesContext) {
    const ResponsesContext store{true, nullptr};
    // store: OpenAI's default is true; the echo says what happened.
    auto r = parse_responses_request(j(R"({"input": "x"})"), store);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->store);
    EXPECT_EQ(r->echo["store"], true);
    EXPECT_EQ(r->echo["background"], false);
    EXPECT_TRUE(r->echo["previous_response_id"].is_null());
    ASSERT_EQ(r->input_items.size(), 1u);
    EXPECT_EQ(r->input_items[0]["role"], "user");
    EXPECT_EQ(r->input_items[0]["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_FALSE(parse_responses_request(j(R"({"input": "x", "store": false})"), store)->store);
    EXPECT_FALSE(parse_responses_request(j(R"({"input": "x"})"))->store);  // a server without a store
    auto bg = parse_responses_request(j(R"({"input": "x", "background": true})"), store);
    ASSERT_TRUE(bg.ok());
    EXPECT_TRUE(bg->background);
    EXPECT_EQ(bg->echo["background"], true);
    auto no = parse_responses_request(j(R"({"input": "x", "background": true, "store": false})"), store);
    ASSERT_FALSE(no.ok());
    EXPECT_EQ(no.status().message().rfind("background: ", 0), 0u) << no.status().message();
    // Items keep their ids; string contents become parts; the earlier conversation comes first and its messages
    // are named previous_response_id.
    const Json earlier = j(R"([{"type": "message", "role": "user", "content": "a", "id": "msg_1"},
                               {"type": "message", "role": "assistant", "content": "b", "id": "msg_2"}])");
    const ResponsesContext chained{true, &earlier};
    auto c = parse_responses_request(
        j(R"({"input": [{"role": "user", "content": "c", "id": "msg_3"}, {"role": "user", "content": [
             {"type": "input_text", "text": "d"}]}], "previous_response_id": "resp_1"})"),
        chained);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->echo["previous_response_id"], "resp_1");
    ASSERT_EQ(c->input_items.size(), 2u);
    EXPECT_EQ(c->input_items[0]["id"], "msg_3");
    EXPECT_EQ(c->input_items[0]["content"], j(R"([{"type": "input_text", "text": "c"}])"));
    EXPECT_EQ(c->input_items[1]["content"][0]["text"], "d");
    const Json& messages = c->chat.chat_body["messages"];
    ASSERT_EQ(messages.size(), 4u) << messages.dump();
    EXPECT_EQ(messages[0]["content"], "a");
    EXPECT_EQ(messages[1]["role"], "assistant");
    EXPECT_EQ(messages[3]["content"], "d");
    EXPECT_EQ(c->message_params,
              (std::vector<std::string>{"previous_response_id", "previous_response_id", "input[0]", "input[1]"}));
    // previous_response_id without its items (the routes found none) or of the wrong type.
    EXPECT_FALSE(parse_responses_request(j(R"({"input": "x", "previous_response_id": "resp_1"})"), store).ok());
    auto t = parse_responses_request(j(R"({"input": "x", "previous_response_id": 5})"), store);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().message().rfind("previous_response_id: ", 0), 0u);
}

TEST(ParseResponsesRequest, Rejects) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({})", "input"},
        {R"({"input": 5})", "input"},
        {R"({"input": []})", "input"},
        {R"({"input": [{"type": "image", "role": "user"}]})", "input[0].type"},
        {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
        {R"({"input": [{"type": "function_call_output", "output": "x"}]})", "input[0].call_id"},
        {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
        // A name harmony cannot carry: the Responses path (it said tools[0].function.name, the chat form's).
        {R"({"input": "x", "tools": [{"type": "function", "name": "a b"}]})", "tools[0].name"},
        {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
        {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
        {R"({"input": "x", "reasoning": {"effort": "turbo"}})", "reasoning.effort"},
        {R"({"input": "x", "background": true})", "background"},
        {R"({"input": "x", "background": "yes"})", "background"},
        {R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}})", "text.format.name"},
        {R"({"input": "x", "text": {"format": {"type": "jsonl"}}})", "text.format.type"},
        // Stored state and output this server cannot give: refused, not ignored.
        {R"({"input": "x", "conversation": "conv_1"})", "conversation"},
        {R"({"input": "x", "include": [5]})", "include[0]"},
        {R"({"input": "x", "top_logprobs": 21})", "top_logprobs"},
        {R"({"input": "x", "include": "reasoning.encrypted_content"})", "include"},
        // Values OpenAI refuses are refused here too (they were accepted).
        {R"({"input": "x", "include": ["bogus"]})", "include[0]"},
        {R"({"input": "x", "truncation": "bogus"})", "truncation"},
        {R"({"input": "x", "reasoning": {"summary": "long"}})", "reasoning.summary"},
        // A stored prompt template was answered from input alone; metadata values must be strings (OpenAI's type).
        {R"({"input": "x", "prompt": {"id": "pmpt_1"}})", "prompt"},
        {R"({"input": "x", "metadata": {"a": 1}})", "metadata"},
        // OpenAI's enums and counts (they were ignored).
        {R"({"input": "x", "text": {"verbosity": "terse"}})", "text.verbosity"},
        // text.format json_schema without its schema (required in OpenAI's and vLLM's Responses models).
        {R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}})", "text.format.schema"},
        {R"({"input": "x", "max_tool_calls": 0})", "max_tool_calls"},
        {R"({"input": "x", "max_tool_calls": "3"})", "max_tool_calls"},
        {R"({"input": "x", "prompt_cache_key": 5})", "prompt_cache_key"},
        // A refusal part is an assistant message's only (OpenAI's output content), not a user's.
        {R"({"input": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]})",
         "input[0].content[0].type"},
    };
    for (const auto& [body, param] : cases) {
        auto r = parse_responses_request(j(body));
        ASSERT_FALSE(r.ok()) << body;
        EXPECT_EQ(http_status_for(r.status().code()), 400) << body;
        EXPECT_EQ(param_of(r.status()), param) << body << " -> " << r.status().message();
    }
}

TEST(ParseCompletionRequest, PromptForms) {
    auto text = parse_completion_request(j(R"({"prompt": "hello"})"), 100);
    ASSERT_TRUE(text.ok());
    ASSERT_EQ(text->prompts.size(), 1u);
    EXPECT_EQ(text->prompts[0].text, "hello");
    EXPECT_EQ(text->sampling.max_tokens, 16);  // OpenAI's default for completions
    // An explicit null asks for no limit but the context's (vLLM's reading; it gave the default 16).
    auto unlimited = parse_completion_request(j(R"({"prompt": "hello", "max_tokens": null})"), 100);
    ASSERT_TRUE(unlimited.ok());
    EXPECT_FALSE(unlimited->sampling.max_tokens.has_value());
    auto ids = parse_completion_request(j(R"({"prompt": [1, 2, 99], "logprobs": 2, "max_tokens": 4})"), 100);
    ASSERT_TRUE(ids.ok());
    ASSERT_EQ(ids->prompts.size(), 1u);
    EXPECT_EQ(ids->prompts[0].ids, (std::vector<int32_t>{1, 2, 99}));
    EXPECT_EQ(ids->logprobs, 2);
    EXPECT_FALSE(ids->echo);
    EXPECT_EQ(ids->prompt_logprobs, -1);
    // lm-evaluation-harness's loglikelihood request; vLLM's prompt_logprobs (null is none); logprobs to 20.
    auto scored = parse_completion_request(
        j(R"({"prompt": [1, 2], "echo": true, "logprobs": 20, "max_tokens": 1, "prompt_logprobs": 3})"), 100);
    ASSERT_TRUE(scored.ok()) << scored.status().message();
    EXPECT_TRUE(scored->echo);
    EXPECT_EQ(scored->logprobs, 20);
    EXPECT_EQ(scored->prompt_logprobs, 3);
    auto null_plp = parse_completion_request(j(R"({"prompt": [1], "prompt_logprobs": null, "echo": false})"), 100);
    ASSERT_TRUE(null_plp.ok());
    EXPECT_EQ(null_plp->prompt_logprobs, -1);
    auto one_of_batch = parse_completion_request(j(R"({"prompt": ["a"]})"), 100);
    ASSERT_TRUE(one_of_batch.ok());
    ASSERT_EQ(one_of_batch->prompts.size(), 1u);
    EXPECT_EQ(one_of_batch->prompts[0].text, "a");
    // Batches (OpenAI's and vLLM's): texts or token-id lists, mixed; n choices of each.
    auto batch = parse_completion_request(j(R"({"prompt": ["a", [5, 6], "b"], "n": 2})"), 100);
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    ASSERT_EQ(batch->prompts.size(), 3u);
    EXPECT_EQ(batch->prompts[1].ids, (std::vector<int32_t>{5, 6}));
    EXPECT_EQ(batch->prompts[2].text, "b");
    EXPECT_EQ(batch->n, 2);

    const std::pair<const char*, const char*> bad[] = {
        {R"({})", "prompt"},
        {R"({"prompt": ""})", "prompt"},
        {R"({"prompt": []})", "prompt"},
        {R"({"prompt": [1, 100]})", "prompt[1]"},
        {R"({"prompt": [1, -1]})", "prompt[1]"},
        {R"({"prompt": ["a", 5]})", "prompt[1]"},
        {R"({"prompt": ["a", ""]})", "prompt[1]"},
        {R"({"prompt": [[1], [1, 100]]})", "prompt[1][1]"},
        {R"({"prompt": {"x": 1}})", "prompt"},
        {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
        {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
        {R"({"prompt": "a", "echo": "yes"})", "echo"},
        {R"({"prompt": "a", "prompt_logprobs": 21})", "prompt_logprobs"},
        {R"({"prompt": "a", "prompt_logprobs": -1})", "prompt_logprobs"},
        {R"({"prompt": "a", "n": 129})", "n"},
        {R"({"prompt": ["a", "b", "c"], "n": 43})", "n"},  // 129 choices
    };
    for (const auto& [body, param] : bad) {
        auto r = parse_completion_request(j(body), 100);
        ASSERT_FALSE(r.ok()) << body;
        EXPECT_EQ(param_of(r.status()), param) << body << " -> " << r.status().message();
    }
}

TEST(ApiError, MapsStatusCodesInOnePlace) {
    EXPECT_EQ(api_error(invalid_argument("x")).http_status, 400);
    EXPECT_EQ(api_error(out_of_range("messages: too long")).http_status, 400);
    EXPECT_EQ(api_error(out_of_range("messages: too long")).code, "context_length_exceeded");
    EXPECT_EQ(api_error(resource_exhausted("big")).http_status, 413);
    EXPECT_EQ(api_error(failed_precondition("busy")).http_status, 503);
    EXPECT_EQ(api_error(internal_error("bug")).http_status, 500);
    EXPECT_EQ(api_error(not_found("x")).http_status, 404);
    Json e = error_json(api_error(invalid_argument("messages[0].role: unknown role")));
    EXPECT_EQ(e["error"]["param"], "messages[0].role");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(e["error"]["code"].is_null());
    // A message that does not start with a field path has no param.
    EXPECT_FALSE(api_error(invalid_argument("the body is not JSON: x")).param.has_value());
    // 404s are invalid_request_error, as OpenAI's (with code model_not_found for a model).
    EXPECT_EQ(error_json(api_error(404, "the model 'm' does not exist", "model_not_found"))["error"]["type"],
              "invalid_request_error");
    // A message quoting a huge field is cut to ~1 KB at a character boundary, and says so.
    const std::string huge = "role: unknown role '" + std::string(4000, 'a') + "\xc3\xa9" + std::string(100000, 'b');
    const std::string m = error_json(api_error(invalid_argument(huge)))["error"]["message"].get<std::string>();
    EXPECT_LE(m.size(), 1100u);
    EXPECT_NE(m.find("more bytes)"), std::string::npos);
    const std::string multibyte = std::string(1023, 'a') + "\xc3\xa9" + std::string(10, 'b');  // é across the cut
    const std::string cut = error_json(api_error(invalid_argument(multibyte)))["error"]["message"].get<std::string>();
    EXPECT_EQ(cut.substr(0, 1024), std::string(1023, 'a') + ".") << "cut before the character, not inside it";
}

TEST(ParseJsonBody, SyntaxErrorsDoNotNameTheLibrary) {
    auto r = parse_json_body("{\"a\": }");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message().find("json.exception"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
}

TEST(ParseChatRequest, TopPZeroKeepsTheMostProbableToken) {
    auto p = parse_chat_request(j(R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})"));
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_GT(p->sampling.sampling.top_p, 0.0f);
    EXPECT_LT(p->sampling.sampling.top_p, 1e-30f);
}

TEST(StopMatcher, HoldsBackPossibleStartsAndCutsAtTheFirstMatch) {
    StopMatcher m({"STOP", "xy"});
    EXPECT_EQ(m.push("hello S"), "hello ");
    EXPECT_EQ(m.push("T"), "");
    EXPECT_EQ(m.push("OOP"), "STOOP");
    EXPECT_EQ(m.push("ab x"), "ab ");
    EXPECT_EQ(m.push("yz and more"), "");
    EXPECT_TRUE(m.matched());
    EXPECT_EQ(m.push("later"), "");
    EXPECT_EQ(m.flush(), "");

    StopMatcher tail({"END"});
    EXPECT_EQ(tail.push("the E"), "the ");
    EXPECT_EQ(tail.flush(), "E");
    EXPECT_FALSE(tail.matched());

    StopMatcher none({});
    EXPECT_EQ(none.push("anything"), "anything");
}

// vLLM's include_stop_str_in_output: the matched string is shown; the longer of two matches at one place.
TEST(StopMatcher, IncludeShowsTheStopString) {
    StopMatcher m({"ST", "STOP"}, /*include=*/true);
    EXPECT_EQ(m.push("hello S"), "hello ");
    EXPECT_EQ(m.push("TOP and more"), "STOP");
    EXPECT_TRUE(m.matched());
    StopMatcher n({"b"}, true);
    EXPECT_EQ(n.push("abc"), "ab");
}

// min_tokens: text pushed while held may not end a match; a match ending later may begin in it.
TEST(StopMatcher, HeldTextEndsNoMatch) {
    StopMatcher m({"ab", "xyz"});
    m.hold(true);
    EXPECT_EQ(m.push("1ab2ab x"), "1ab2ab ");  // two "ab" inside the held text: shown; " x" may begin "xyz"
    EXPECT_EQ(m.push("y"), "");
    m.hold(false);
    EXPECT_EQ(m.push("z tail"), "");  // "xyz" ends past the held text: a match
    EXPECT_TRUE(m.matched());
    StopMatcher n({"ab"});
    n.hold(true);
    EXPECT_EQ(n.push("a"), "");
    n.hold(false);
    EXPECT_EQ(n.push("b c"), "");  // "ab" begins in held text, ends past it
    EXPECT_TRUE(n.matched());
    StopMatcher o({"ab"});
    o.hold(true);
    EXPECT_EQ(o.push("ab"), "ab");
    o.hold(false);
    EXPECT_EQ(o.push("c"), "c");
    EXPECT_FALSE(o.matched());
}

TEST(ServerMetrics, RendersPrometheusText) {
    ServerMetrics m;
    m.count_request("/v1/chat/completions", 200);
    m.count_request("/v1/chat/completions", 200);
    m.count_request("other", 404);
    m.add_prompt_tokens(10);
    m.add_generated_tokens(3);
    m.observe_time_to_first_token(0.03);
    m.observe_inter_token_latency(0.002);
    EngineStats s;
    s.waiting_requests = 2;
    s.running_sequences = 1;
    s.kv_blocks_in_use = 5;
    s.kv_blocks_total = 100;
    std::string text = m.render(s, 3, true);
    EXPECT_NE(text.find("gptoss_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"),
              std::string::npos);
    EXPECT_NE(text.find("gptoss_http_requests_total{endpoint=\"other\",status=\"404\"} 1\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_prompt_tokens_total 10\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_generation_tokens_total 3\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_time_to_first_token_seconds_bucket{le=\"0.02\"} 0\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_inter_token_latency_seconds_count 1\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_queue_depth 2\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_running_sequences 1\n"), std::string::npos);
    EXPECT_NE(text.find("gptoss_kv_blocks_in_use 5\n"), std::string::npos);
    EXPECT_NE(text.find("# TYPE gptoss_time_to_first_token_seconds histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace gptoss::server
