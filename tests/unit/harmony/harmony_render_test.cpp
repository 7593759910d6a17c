// Renderer and chat.completions adapter: schema -> TypeScript rules, CoT-drop policies, message
// mapping details and request validation (no tokenizer needed: the prompt text is compared).
#include "harmony/harmony_render.h"

#include <gtest/gtest.h>

#include "harmony/harmony_json.h"

namespace gptoss::harmony {
namespace {

std::string ts(const char* schema) { return schema_to_typescript(Json::parse(schema), ""); }

TEST(HarmonySchema, ScalarsArraysAndUnions) {
    EXPECT_EQ(ts(R"({"type":"integer","enum":[1,2]})"), "number");
    EXPECT_EQ(ts(R"({"type":"string","enum":["a",1,"b"]})"), "\"a\" | \"b\"");
    EXPECT_EQ(ts(R"({"type":["integer","null"]})"), "number | null");
    EXPECT_EQ(ts(R"({"type":"array","items":{"type":"boolean"}})"), "boolean[]");
    EXPECT_EQ(ts(R"({"type":"array"})"), "Array<any>");
    EXPECT_EQ(ts(R"({"type":"null"})"), "any");
    EXPECT_EQ(ts(R"({"anyOf":[{"type":"string"}]})"), "any");
    EXPECT_EQ(ts(R"("not a schema")"), "any");
    EXPECT_EQ(ts(R"({"type":"object"})"), "{\n}");
}

TEST(HarmonySchema, ObjectPropertiesInDocumentOrder) {
    EXPECT_EQ(ts(R"({"type":"object","properties":{"z":{"type":"string","default":"d"},"a":{"type":"number",
                 "nullable":true,"default":1.5},"e":{"type":"string","enum":["x"],"default":"x"}},"required":["a"]})"),
              "{\nz?: string, // default: \"d\"\na: number | null, // default: 1.5\ne?: \"x\", // default: x\n}");
}

TEST(HarmonySchema, NestedObjectsIndentFourSpaces) {
    EXPECT_EQ(ts(R"({"type":"object","properties":{"p":{"type":"object","description":"inner",
                 "properties":{"x":{"type":"number"}}}}})"),
              "{\n// inner\np?:     // inner\n{\n    x?: number,\n    },\n}");
}

TEST(HarmonySchema, TopLevelOneOf) {
    EXPECT_EQ(ts(R"({"oneOf":[{"type":"string","enum":["a"],"default":"a","description":"d"},{"type":"number",
                 "nullable":true}]})"),
              "\n | \"a\" // d default: \"a\"\n | number | null");
}

// Numbers in default comments as the harmony library's serde_json writes them (ryu's shortest form), not
// nlohmann's (1e-05, 1e+15); the expected texts are openai/harmony's at ec7606d.
TEST(HarmonySchema, DefaultNumbersAsSerdeJsonWritesThem) {
    const std::pair<const char*, const char*> cases[] = {{"1e-5", "0.00001"},
                                                         {"1e-7", "1e-7"},
                                                         {"1e15", "1000000000000000.0"},
                                                         {"1e16", "1e16"},
                                                         {"1.5", "1.5"},
                                                         {"-2.25", "-2.25"},
                                                         {"100", "100"},
                                                         {"1.0", "1.0"},
                                                         {"0.0", "0.0"},
                                                         {"-0.0", "-0.0"},
                                                         {"123456.789e3", "123456789.0"},
                                                         {"1.2345e-6", "1.2345e-6"},
                                                         {"1.2345e-5", "0.000012345"},
                                                         {"2.5e-300", "2.5e-300"},
                                                         {"1.7976931348623157e308", "1.7976931348623157e308"},
                                                         {"1e21", "1e21"},
                                                         {"18446744073709551616", "1.8446744073709552e19"}};
    for (const auto& [in, want] : cases) {
        EXPECT_EQ(
            ts((std::string(R"({"type":"object","properties":{"a":{"type":"number","default":)") + in + "}}}").c_str()),
            std::string("{\na?: number, // default: ") + want + "\n}")
            << in;
    }
    EXPECT_EQ(json_compact(Json::parse(R"({"b":[1e-5,{"c":"\u00e9\n"}],"a":true})")),
              "{\"b\":[0.00001,{\"c\":\"\u00e9\\n\"}],\"a\":true}");
}

TEST(HarmonySchema, PropertyOneOfWithSharedDescription) {
    EXPECT_EQ(ts(R"({"type":"object","properties":{"v":{"description":"same","oneOf":[{"type":"string",
                 "description":"same"},{"type":"number","description":"num"}]}}})"),
              "{\nv?:\n | string\n | number // num\n,\n}");
}

TEST(HarmonySchema, DeepNestingIsBounded) {
    Json schema = {{"type", "string"}};
    for (int i = 0; i < 500; ++i) schema = Json{{"type", "array"}, {"items", schema}};
    std::string text = schema_to_typescript(schema, "");
    EXPECT_EQ(text.rfind("any", 0), 0u);
}

TEST(HarmonyRender, ToolsSectionSortsNamespacesAndHandlesToollessOnes) {
    std::vector<ToolNamespace> ns = {python_namespace(), browser_namespace()};
    std::string text = render_tools_section(ns);
    EXPECT_EQ(text.rfind("# Tools\n\n## browser\n\n// Tool for browsing.", 0), 0u);
    EXPECT_NE(text.find("} // namespace browser\n\n## python\n\nUse this tool to execute Python code"),
              std::string::npos);
    EXPECT_EQ(text.find("namespace python"), std::string::npos);
}

Conversation history(std::initializer_list<std::pair<const char*, const char*>> items) {
    Conversation c;
    for (const auto& [channel, text] : items) {
        if (std::string(channel) == "user") {
            c.messages.push_back(Message::text(Role::kUser, text));
        } else {
            Message m = Message::text(Role::kAssistant, text);
            m.channel = channel;
            c.messages.push_back(m);
        }
    }
    return c;
}

TEST(HarmonyRender, CotDropPolicies) {
    Conversation c = history({{"user", "q1"},
                              {"analysis", "t1"},
                              {"final", "a1"},
                              {"user", "q2"},
                              {"analysis", "t2"},
                              {"final", "a2"},
                              {"user", "q3"},
                              {"analysis", "t3"}});
    auto kept = [&](CotDropPolicy p) {
        std::vector<Message> m = c.messages;
        apply_cot_drop(m, p);
        std::string s;
        for (const Message& x : m) s += x.content + " ";
        return s;
    };
    EXPECT_EQ(kept(CotDropPolicy::kNone), "q1 t1 a1 q2 t2 a2 q3 t3 ");
    EXPECT_EQ(kept(CotDropPolicy::kCompletedTurns), "q1 a1 q2 a2 q3 t3 ");
    EXPECT_EQ(kept(CotDropPolicy::kHarmonyLibrary), "q1 t1 a1 q2 t2 a2 q3 t3 ");  // last assistant is analysis
    c.messages.pop_back();
    c.messages.pop_back();
    EXPECT_EQ(kept(CotDropPolicy::kHarmonyLibrary), "q1 a1 q2 t2 a2 ");
}

TEST(HarmonyRender, TrainingModeEndsFinalAnswerWithReturn) {
    Conversation c = history({{"user", "q"}, {"final", "a"}});
    RenderOptions o;
    o.mode = RenderMode::kTraining;
    StatusOr<std::string> text = render_text(c, o);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "<|start|>user<|message|>q<|end|><|start|>assistant<|channel|>final<|message|>a<|return|>");
}

TEST(HarmonyRender, MessageHeaderDetails) {
    Conversation c;
    Message named = Message::text(Role::kUser, "hi");
    named.name = "alice";
    c.messages.push_back(named);
    Message all = Message::text(Role::kAssistant, "x");
    all.recipient = "all";
    c.messages.push_back(all);
    Message tool = Message::text(Role::kTool, "r");
    c.messages.push_back(tool);
    RenderOptions o;
    o.mode = RenderMode::kConversation;
    StatusOr<std::string> bad = render_text(c, o);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    c.messages.back().name = "python";
    StatusOr<std::string> text = render_text(c, o);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    EXPECT_EQ(*text,
              "<|start|>user:alice<|message|>hi<|end|><|start|>assistant<|message|>x<|call|>"
              "<|start|>python<|message|>r<|end|>");
}

StatusOr<ChatRequest> chat(const char* request, const char* server_options = R"({"current_date":"2025-06-28"})") {
    StatusOr<ServerOptions> so = server_options_from_json(Json::parse(server_options));
    if (!so.ok()) return so.status();
    return chat_request_from_json(Json::parse(request), *so);
}

std::string chat_text(const char* request, const char* server_options = R"({"current_date":"2025-06-28"})") {
    StatusOr<ChatRequest> r = chat(request, server_options);
    if (!r.ok()) return "ERROR " + r.status().to_string();
    StatusOr<std::string> text = render_text(r->conversation, r->render_options);
    return text.ok() ? *text : "ERROR " + text.status().to_string();
}

constexpr const char* kSystemPrefix =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>";

TEST(HarmonyChat, LaterSystemMessageBecomesDeveloperMessageInPlace) {
    EXPECT_EQ(chat_text(R"({"messages":[{"role":"system","content":"A"},{"role":"developer","content":[{"type":"text",
              "text":"B"}]},{"role":"user","content":"q"},{"role":"system","content":"C"}]})"),
              std::string(kSystemPrefix) +
                  "<|start|>developer<|message|># Instructions\n\nA\n\nB<|end|><|start|>user<|message|>q<|end|>"
                  "<|start|>developer<|message|># Instructions\n\nC<|end|><|start|>assistant");
}

TEST(HarmonyChat, ToolResultNameLookupAndArgumentObjects) {
    std::string text = chat_text(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}},
        {"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c2","content":"G"},{"role":"tool","content":[{"type":"text","text":"F"}]}]})",
                                 R"({"current_date":"2025-06-28","history_tool_call_content_type":null})");
    EXPECT_NE(text.find("<|start|>assistant to=functions.f<|channel|>commentary<|message|>{\"a\":1}<|call|>"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("<|start|>functions.g to=assistant<|channel|>commentary<|message|>G<|end|>"
                        "<|start|>functions.f to=assistant<|channel|>commentary<|message|>F<|end|>"),
              std::string::npos)
        << text;
}

// Clients that number call ids per turn reuse them: a tool message answers the call before it (the
// whole-request lookup gave the first turn's result to the second turn's function), and duplicate ids
// within one turn are answered in call order.
TEST(HarmonyChat, ReusedToolCallIdsAnswerTheCallBeforeThem) {
    std::string text = chat_text(R"({"messages":[{"role":"user","content":"Weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function",
         "function":{"name":"get_weather","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"call_0","content":"21C"},
        {"role":"assistant","content":"It is 21C."},{"role":"user","content":"Time?"},
        {"role":"assistant","content":null,"tool_calls":[
         {"id":"call_0","type":"function","function":{"name":"get_time","arguments":"{}"}},
         {"id":"call_0","type":"function","function":{"name":"get_date","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"call_0","content":"10:00"},
        {"role":"tool","tool_call_id":"call_0","content":"June"}]})",
                                 R"({"current_date":"2025-06-28","history_tool_call_content_type":null})");
    EXPECT_NE(text.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>21C<|end|>"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>10:00<|end|>"
                        "<|start|>functions.get_date to=assistant<|channel|>commentary<|message|>June<|end|>"),
              std::string::npos)
        << text;
    // A result before its call (an odd order) still finds the call's name over the whole request.
    text = chat_text(R"({"messages":[{"role":"user","content":"q"},
        {"role":"tool","tool_call_id":"c9","content":"X"},
        {"role":"assistant","tool_calls":[{"id":"c9","type":"function","function":{"name":"h","arguments":"{}"}}]}]})",
                     R"({"current_date":"2025-06-28"})");
    EXPECT_NE(text.find("<|start|>functions.h to=assistant<|channel|>commentary<|message|>X<|end|>"), std::string::npos)
        << text;
    // An id no call has, and no name: HARMONY.md §5.2's last fallback, the most recent unanswered call (it was an
    // error here too; the server keeps OpenAI's 400 with ServerOptions::unmatched_tool_call_id_is_error).
    const char* unmatched = R"({"messages":[{"role":"user","content":"x"},
        {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}},
                                         {"id":"c2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"zzz","content":"w"}]})";
    text = chat_text(unmatched);
    EXPECT_NE(text.find("<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>w<|end|>"),
              std::string::npos)
        << text;
    ServerOptions strict;
    strict.current_date = "2025-06-28";
    strict.unmatched_tool_call_id_is_error = true;
    StatusOr<ChatRequest> refused = chat_request_from_json(Json::parse(unmatched), strict);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("matches no tool call"), std::string::npos);
}

// A tool result's author is the call's recipient: a function declared as "functions.get_weather" is called
// "to=functions.functions.get_weather", and its result is by "functions.functions.get_weather" (the prefix was taken
// off once, so the result no longer matched the call). A result's own name field may carry the prefix already, but
// must be a function name: free text there would end up in the header ("x to=python" as a second recipient). And
// only assistant messages carry calls: a user message's were counted as calls a result could answer, never rendered.
TEST(HarmonyChat, ToolResultAuthorsMatchTheirCalls) {
    std::string text = chat_text(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"functions.get_weather","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"R"}]})",
                                 R"({"current_date":"2025-06-28","history_tool_call_content_type":null})");
    EXPECT_NE(text.find("<|start|>assistant to=functions.functions.get_weather<|channel|>commentary<|message|>{}"
                        "<|call|><|start|>functions.functions.get_weather to=assistant<|channel|>commentary<|message|>"
                        "R<|end|>"),
              std::string::npos)
        << text;
    text = chat_text(R"({"messages":[{"role":"user","content":"q"},
        {"role":"tool","name":"functions.lookup","content":"A"},{"role":"tool","name":"lookup","content":"B"}]})");
    EXPECT_NE(text.find("<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>A<|end|>"
                        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>B<|end|>"),
              std::string::npos)
        << text;
    for (const char* bad : {"x to=python", "a b", "f<|end|>"}) {
        const std::string req = std::string(R"({"messages":[{"role":"user","content":"q"},)") +
                                R"({"role":"tool","tool_call_id":"zz","name":)" + Json(bad).dump() +
                                R"(,"content":"r"}]})";
        StatusOr<ChatRequest> r = chat(req.c_str());
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("messages[1].name"), std::string::npos) << r.status().to_string();
    }
    StatusOr<ChatRequest> user_calls = chat(R"({"messages":[{"role":"user","content":"q","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"r"}]})");
    ASSERT_FALSE(user_calls.ok());
    EXPECT_NE(user_calls.status().message().find("messages[0].tool_calls"), std::string::npos)
        << user_calls.status().to_string();
    // A call without arguments (absent or null) is rendered with "{}", not an empty body.
    for (const char* fn : {R"({"name":"f"})", R"({"name":"f","arguments":null})"}) {
        text = chat_text((std::string(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[
            {"id":"c1","type":"function","function":)") +
                          fn + R"(}]},{"role":"tool","tool_call_id":"c1","content":"R"}]})")
                             .c_str(),
                         R"({"current_date":"2025-06-28","history_tool_call_content_type":null})");
        EXPECT_NE(text.find("<|start|>assistant to=functions.f<|channel|>commentary<|message|>{}<|call|>"),
                  std::string::npos)
            << fn << "\n"
            << text;
    }
    // An empty or null list stays harmless anywhere.
    EXPECT_TRUE(chat(R"({"messages":[{"role":"user","content":"q","tool_calls":[]},)"
                     R"({"role":"system","content":"s","tool_calls":null}]})")
                    .ok());
}

TEST(HarmonyChat, ReasoningAliasesAndEffortClamping) {
    StatusOr<ChatRequest> r = chat(R"({"reasoning_effort":"minimal","messages":[{"role":"user","content":"q"},
        {"role":"assistant","thinking":"t"}]})");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->reasoning_effort, ReasoningEffort::kLow);
    EXPECT_EQ(r->conversation.messages.back().channel, "analysis");
    EXPECT_EQ(r->conversation.messages.back().content, "t");
    // An empty alias (clients send "reasoning_content": "" beside the field they use) does not hide a later one.
    r = chat(
        R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"","reasoning":"u"}]})");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->conversation.messages.back().channel, "analysis");
    EXPECT_EQ(r->conversation.messages.back().content, "u");
}

// A top-level union is a parameter, not "no arguments" (it rendered `() => any`); `{}`, a bare object and empty
// properties still normalize to `() => any` (HARMONY.md §4.3).
TEST(HarmonyChat, TopLevelUnionParametersAreRendered) {
    auto tool_text = [](const char* parameters) {
        std::string text = chat_text((std::string(R"({"tools":[{"type":"function","function":{"name":"f",
            "parameters":)") + parameters +
                                      R"(}}],"messages":[{"role":"user","content":"q"}]})")
                                         .c_str());
        const size_t at = text.find("type f = ");
        return at == std::string::npos ? text : text.substr(at, text.find('\n', text.find("=> any", at)) - at);
    };
    EXPECT_EQ(tool_text(R"({"oneOf":[{"type":"string"},{"type":"number"}]})"),
              "type f = (_: \n | string\n | number) => any;");
    EXPECT_EQ(tool_text(R"({"anyOf":[{"type":"string"},{"type":"number"}]})"), "type f = (_: any) => any;");
    EXPECT_EQ(tool_text(R"({"enum":["a","b"]})"), "type f = (_: any) => any;");
    for (const char* none : {"{}", R"({"type":"object"})", R"({"type":"object","properties":{}})", "null"})
        EXPECT_EQ(tool_text(none), "type f = () => any;") << none;
}

TEST(HarmonyChat, ToolChoiceNoneRendersNoFunctions) {
    StatusOr<ChatRequest> r = chat(R"({"tool_choice":"none","tools":[{"type":"function","function":{"name":"f"}}],
        "messages":[{"role":"user","content":"q"}]})");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->conversation.messages.size(), 2u);  // system + user: no developer message
    EXPECT_FALSE(chat_mapping_options(*r).function_calls_enabled);
}

TEST(HarmonyChat, BuiltinToolsAndChannelOption) {
    std::string text = chat_text(R"({"messages":[{"role":"user","content":"q"}]})",
                                 R"({"current_date":"2025-06-28","builtin_tools":["python"],
                                    "drop_commentary_without_tools":true})");
    EXPECT_NE(text.find("# Tools\n\n## python\n\nUse this tool"), std::string::npos) << text;
    EXPECT_NE(text.find("# Valid channels: analysis, final."), std::string::npos) << text;
    std::string both = chat_text(R"({"messages":[{"role":"user","content":"q"}]})",
                                 R"({"current_date":"2025-06-28","builtin_tools":{"browser":true,"python":false}})");
    EXPECT_NE(both.find("## browser"), std::string::npos);
    EXPECT_EQ(both.find("## python"), std::string::npos);
    EXPECT_FALSE(server_options_from_json(Json::parse(R"({"builtin_tools":["shell"]})")).ok());
}

TEST(HarmonyChat, InvalidRequestsAreInvalidArgument) {
    for (
        const char* bad : {
            R"([])",
            R"({"messages":[]})",
            R"({"messages":[{"role":"wizard","content":"x"}]})",
            R"({"messages":[{"content":"x"}]})",
            R"({"messages":[{"role":"user","content":42}]})",
            R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
            R"({"messages":[{"role":"tool","content":"orphan"}]})",
            R"({"reasoning_effort":"extreme","messages":[{"role":"user","content":"q"}]})",
            R"({"tools":[{"type":"function","function":{"name":"bad name"}}],"messages":[{"role":"user","content":"q"}]})",
            R"({"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}],
                "messages":[{"role":"user","content":"q"}]})",
            R"({"tools":{"x":1},"messages":[{"role":"user","content":"q"}]})",
            R"({"tool_choice":{"type":"function","function":{"name":"g"}},"messages":[{"role":"user","content":"q"}]})",
            R"({"messages":[{"role":"assistant","tool_calls":[{"function":"x"}]}]})",
        }) {
        StatusOr<ChatRequest> r = chat(bad);
        EXPECT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
    EXPECT_FALSE(server_options_from_json(Json::parse(R"({"current_date":"June 1"})")).ok());
    EXPECT_FALSE(server_options_from_json(Json::parse(R"({"cot_drop_policy":"sometimes"})")).ok());
    EXPECT_FALSE(conversation_from_json(Json::parse(R"([{"role":"user","system_content":3}])")).ok());
}

}  // namespace
}  // namespace gptoss::harmony

namespace gptoss::harmony {
namespace {

// HARMONY.md §4.1: the developer message's tools block only with at least one tool. A "functions" namespace with
// none rendered "# Tools\n\n## functions\n" after the instructions.
TEST(HarmonyDeveloperBody, NamespaceWithoutToolsRendersNoToolsBlock) {
    DeveloperContent dev;
    dev.instructions = "Be brief.";
    dev.tools.push_back(ToolNamespace{"functions", std::nullopt, {}});
    EXPECT_EQ(render_developer_body(dev), "# Instructions\n\nBe brief.");
    dev.tools[0].tools.push_back(ToolDescription{"f", "Does f.", std::nullopt});
    EXPECT_EQ(render_developer_body(dev),
              "# Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Does f.\n"
              "type f = () => any;\n\n} // namespace functions");
}

// HARMONY.md §4.4: the response format after the instructions and tools, its description as comment
// lines, the schema compact; and the chat adapter builds it from response_format json_schema only.
TEST(HarmonyResponseFormat, RenderedAfterTheToolsAndFromTheChatRequest) {
    DeveloperContent dev;
    dev.instructions = "Be brief.";
    dev.response_format = ResponseFormat{"shopping_list", "Entries\nof the list",
                                         Json::parse(R"({"type": "object", "properties": {"items": {}}})")};
    EXPECT_EQ(render_developer_body(dev),
              "# Instructions\n\nBe brief.\n\n# Response Formats\n\n## shopping_list\n\n// Entries\n// of the list\n"
              "{\"type\":\"object\",\"properties\":{\"items\":{}}}");
    // Numbers as serde_json writes them, as in the tools' section (nlohmann's dump wrote 1e+20 before session 67).
    dev.response_format->schema = Json::parse(R"({"type": "number", "maximum": 1e20, "minimum": -0.5})");
    EXPECT_NE(render_developer_body(dev).find("\n{\"type\":\"number\",\"maximum\":1e20,\"minimum\":-0.5}"),
              std::string::npos)
        << render_developer_body(dev);
    ServerOptions options;
    options.current_date = "2026-01-01";
    auto with = chat_request_from_json(Json::parse(R"({"messages":[{"role":"user","content":"x"}],
        "response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"string"}}}})"),
                                       options);
    ASSERT_TRUE(with.ok()) << with.status().to_string();
    const std::string text = *render_text(with->conversation, with->render_options);
    EXPECT_NE(text.find("<|start|>developer<|message|># Response Formats\n\n## n\n\n{\"type\":\"string\"}<|end|>"),
              std::string::npos)
        << text;
    for (const char* rf : {R"({"type":"json_object"})", R"({"type":"text"})"}) {
        auto without = chat_request_from_json(
            Json::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],"response_format":)") + rf + "}"),
            options);
        ASSERT_TRUE(without.ok());
        EXPECT_EQ(render_text(without->conversation, without->render_options)->find("Response Formats"),
                  std::string::npos);
    }
}

}  // namespace
}  // namespace gptoss::harmony
