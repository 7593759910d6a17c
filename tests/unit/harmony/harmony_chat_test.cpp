// Parsed messages -> chat.completions: routing of each message kind, joining, truncation, tool
// choice, and streamed deltas equal to the non-streamed result (HARMONY.md §6.5).
#include "harmony/harmony_chat.h"

#include <gtest/gtest.h>

#include "harmony/harmony_json.h"
#include "unit/harmony/toy_vocab.h"

namespace gptoss::harmony {
namespace {

ParsedMessage msg(std::optional<std::string> channel, std::string content,
                  std::optional<std::string> recipient = std::nullopt, Terminator t = Terminator::kEnd) {
    ParsedMessage m;
    m.header.channel = std::move(channel);
    m.header.recipient = std::move(recipient);
    m.content = std::move(content);
    m.terminator = t;
    return m;
}

TEST(HarmonyChatMapping, RoutesEveryMessageKind) {
    ParsedMessage recovered = msg("final", "hidden");
    recovered.header.recovered = true;
    ParsedMessage tool_reply = msg("commentary", "reply");
    tool_reply.header.role = Role::kTool;
    std::vector<ParsedMessage> messages = {
        msg("analysis", "think"),
        msg("commentary", "Checking."),                  // preamble: user-visible
        msg("analysis", "{\"q\":1}", "browser.search"),  // built-in: hidden
        msg("commentary", " {\"a\":1}\n", "functions.f", Terminator::kCall),
        msg(std::nullopt, "no channel"),
        recovered,
        tool_reply,
        msg("final", "Done."),
    };
    ChatCompletion c = to_chat_completion(messages, {}, false);
    EXPECT_EQ(c.content, "Checking.\nDone.");
    EXPECT_EQ(c.reasoning_content, "think\n{\"q\":1}\nno channel\nhidden");
    ASSERT_EQ(c.tool_calls.size(), 1u);
    EXPECT_EQ(c.tool_calls[0].name, "f");
    EXPECT_EQ(c.tool_calls[0].arguments, "{\"a\":1}");
    EXPECT_EQ(c.tool_calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(c.tool_calls[0].id.size(), 29u);
    EXPECT_EQ(c.finish_reason, "tool_calls");
}

TEST(HarmonyChatMapping, EmptyCompletionHasNullFields) {
    ChatCompletion c = to_chat_completion({}, {}, false);
    EXPECT_FALSE(c.content.has_value());
    EXPECT_FALSE(c.reasoning_content.has_value());
    EXPECT_EQ(c.finish_reason, "stop");
    Json j = chat_completion_to_json(c);
    EXPECT_TRUE(j["message"]["content"].is_null());
    EXPECT_FALSE(j["message"].contains("tool_calls"));
}

TEST(HarmonyChatMapping, BareRecipients) {
    std::vector<ParsedMessage> m = {msg("analysis", "{}", "lookup_weather")};
    ChatMappingOptions unknown;
    EXPECT_EQ(to_chat_completion(m, unknown, false).tool_calls.size(), 1u);
    ChatMappingOptions declared;
    declared.declared_functions = std::vector<std::string>{"lookup_weather"};
    EXPECT_EQ(to_chat_completion(m, declared, false).tool_calls.size(), 1u);
    declared.declared_functions = std::vector<std::string>{"other"};
    ChatCompletion c = to_chat_completion(m, declared, false);
    EXPECT_TRUE(c.tool_calls.empty());
    EXPECT_EQ(c.reasoning_content, "{}");
    EXPECT_TRUE(to_chat_completion({msg("analysis", "x", "python")}, unknown, false).tool_calls.empty());
}

TEST(HarmonyChatMapping, LengthLimitDropsUnfinishedCall) {
    std::vector<ParsedMessage> m = {msg("analysis", "t"),
                                    msg("commentary", "{\"a\":", "functions.f", Terminator::kNone)};
    ChatCompletion c = to_chat_completion(m, {}, true);
    EXPECT_TRUE(c.tool_calls.empty());
    EXPECT_EQ(c.finish_reason, "length");
    EXPECT_EQ(c.reasoning_content, "t");
    // Without the limit the same stream is a call (the fixture form: no stop token, parsed with EOS).
    EXPECT_EQ(to_chat_completion(m, {}, false).finish_reason, "tool_calls");
    // A call ended by <|end|> or <|return|> instead of <|call|> is still a call (X9).
    m[1].terminator = Terminator::kReturn;
    EXPECT_EQ(to_chat_completion(m, {}, true).finish_reason, "tool_calls");
}

TEST(HarmonyChatMapping, ToolChoiceNoneHidesCalls) {
    ChatMappingOptions o;
    o.function_calls_enabled = false;
    ChatCompletion c = to_chat_completion({msg("commentary", "{}", "functions.f", Terminator::kCall)}, o, false);
    EXPECT_TRUE(c.tool_calls.empty());
    EXPECT_EQ(c.finish_reason, "stop");
}

// parallel_tool_calls false (max_tool_calls 1): a stream whose calls end with <|end|> (X9) holds two; the second is
// hidden text, as a disabled call is. And the mapping options of a request: without function tools its calls are
// disabled (a client that declared none got tool_calls), parallel_tool_calls false gives max_tool_calls 1.
TEST(HarmonyChatMapping, ParallelToolCallsFalseKeepsTheFirstCall) {
    const std::vector<ParsedMessage> m = {msg("commentary", "{\"a\":1}", "functions.f", Terminator::kEnd),
                                          msg("commentary", "{\"b\":2}", "functions.g", Terminator::kCall)};
    ChatMappingOptions o;
    EXPECT_EQ(to_chat_completion(m, o, false).tool_calls.size(), 2u);
    o.max_tool_calls = 1;
    ChatCompletion c = to_chat_completion(m, o, false);
    ASSERT_EQ(c.tool_calls.size(), 1u);
    EXPECT_EQ(c.tool_calls[0].name, "f");
    EXPECT_EQ(c.reasoning_content, "{\"b\":2}");
    EXPECT_EQ(c.finish_reason, "tool_calls");

    const ServerOptions so;
    auto req = [&](const char* body) {
        StatusOr<ChatRequest> r = chat_request_from_json(Json::parse(body), so);
        EXPECT_TRUE(r.ok()) << r.status().to_string();
        return r.ok() ? chat_mapping_options(*r) : ChatMappingOptions{};
    };
    EXPECT_FALSE(req(R"({"messages":[{"role":"user","content":"q"}]})").function_calls_enabled);
    const char* tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
    ChatMappingOptions with =
        req((std::string(R"({"messages":[{"role":"user","content":"q"}],)") + tools + "}").c_str());
    EXPECT_TRUE(with.function_calls_enabled);
    EXPECT_EQ(with.max_tool_calls, 0u);
    ChatMappingOptions single =
        req((std::string(R"({"messages":[{"role":"user","content":"q"}],"parallel_tool_calls":false,)") + tools + "}")
                .c_str());
    EXPECT_EQ(single.max_tool_calls, 1u);
    StatusOr<ChatRequest> bad = chat_request_from_json(
        Json::parse(R"({"messages":[{"role":"user","content":"q"}],"parallel_tool_calls":"no"})"), so);
    EXPECT_FALSE(bad.ok());
}

TEST(HarmonyChatMapping, StreamedDeltasMatchResult) {
    using testing::toy_encode;
    ParserOptions po;
    StreamParser parser(testing::toy_token_bytes, po);
    ChatMappingOptions mo;
    int next_id = 0;
    mo.make_tool_call_id = [&] { return "call_" + std::to_string(next_id++); };
    ChatMapper mapper(mo);
    std::vector<ChatDelta> deltas;
    for (int32_t id :
         toy_encode("<|channel|>analysis<|message|>ab<|end|><|start|>assistant<|channel|>analysis<|message|>cd<|end|>"
                    "<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{}<|call|>")) {
        std::vector<ChatDelta> d = mapper.on_events(parser.push(id));
        deltas.insert(deltas.end(), d.begin(), d.end());
    }
    std::vector<ChatDelta> tail = mapper.on_events(parser.finish());
    EXPECT_TRUE(tail.empty());
    std::vector<ChatDelta> merged = coalesce_deltas(deltas);
    ASSERT_EQ(merged.size(), 2u);
    EXPECT_EQ(chat_delta_to_json(merged[0]).dump(), R"({"reasoning_content":"ab\ncd"})");
    EXPECT_EQ(
        chat_delta_to_json(merged[1]).dump(),
        R"({"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":"{}"}}]})");
    ChatCompletion streamed = mapper.result(false);
    EXPECT_EQ(streamed.reasoning_content, "ab\ncd");
    ASSERT_EQ(streamed.tool_calls.size(), 1u);
    EXPECT_EQ(streamed.tool_calls[0].id, "call_0");
    EXPECT_EQ(streamed.finish_reason, "tool_calls");
}

// A call's streamed arguments add up to the non-streamed (trimmed) text, whatever the deltas'
// whitespace (HARMONY.md §6.5; before session 26 the streamed text was the raw content).
TEST(HarmonyChatMapping, StreamedArgumentsAreTrimmedLikeTheResult) {
    ChatMapper mapper;
    std::vector<Event> events(1);
    events[0].type = EventType::kMessageStart;
    events[0].header.channel = "commentary";
    events[0].header.recipient = "functions.f";
    std::string streamed;
    auto collect = [&](const std::vector<ChatDelta>& ds) {
        for (const ChatDelta& d : ds)
            if (d.tool_call) streamed += d.tool_call->arguments;
    };
    collect(mapper.on_events(events));
    for (const char* piece : {" ", "\n ", "{\"a\"", ": 1 ", "\n", " ", "}", " \n", "\t"}) {
        Event e;
        e.type = EventType::kContentDelta;
        e.delta = piece;
        collect(mapper.on_events({e}));
    }
    Event end;
    end.type = EventType::kMessageEnd;
    end.terminator = Terminator::kCall;
    collect(mapper.on_events({end}));
    const ChatCompletion c = mapper.result(false);
    ASSERT_EQ(c.tool_calls.size(), 1u);
    EXPECT_EQ(c.tool_calls[0].arguments, "{\"a\": 1 \n }");
    EXPECT_EQ(streamed, c.tool_calls[0].arguments);
}

}  // namespace
}  // namespace gptoss::harmony
