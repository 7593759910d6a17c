// The Responses API's stored responses: the store's budgets, and over HTTP (FakeEngine) store / retrieve /
// delete / input_items, previous_response_id (the prompt must equal the one the whole input would give),
// background responses (poll, replayed events, cancel) and the server without a store.
#include "server/response_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "server_test_util.h"

namespace gptoss::server {
namespace {

using namespace gptoss::server::testing;

std::shared_ptr<const StoredResponse> entry_of(size_t text_bytes) {
    auto e = std::make_shared<StoredResponse>();
    e->response = Json{{"t", std::string(text_bytes, 'x')}};
    return e;
}

TEST(ResponseStore, DropsTheLeastRecentlyUsedBeyondItsCount) {
    ResponseStore store(2, size_t{1} << 30);
    store.put("a", entry_of(1));
    store.put("b", entry_of(1));
    ASSERT_NE(store.get("a"), nullptr);  // a is now the most recently used
    store.put("c", entry_of(1));
    EXPECT_NE(store.get("a"), nullptr);
    EXPECT_EQ(store.get("b"), nullptr);
    EXPECT_NE(store.get("c"), nullptr);
    EXPECT_EQ(store.size(), 2u);
    EXPECT_TRUE(store.erase("a"));
    EXPECT_FALSE(store.erase("a"));
    EXPECT_EQ(store.size(), 1u);
}

TEST(ResponseStore, KeepsToItsByteBudgetButAlwaysTheNewest) {
    const size_t one = entry_of(1000)->bytes();
    ResponseStore store(100, 3 * one);
    for (const char* id : {"a", "b", "c"}) store.put(id, entry_of(1000));
    EXPECT_EQ(store.size(), 3u);
    EXPECT_EQ(store.bytes(), 3 * one);
    store.put("d", entry_of(1000));  // over by one: a goes
    EXPECT_EQ(store.get("a"), nullptr);
    EXPECT_EQ(store.size(), 3u);
    store.put("huge", entry_of(10 * 1000));  // larger than the whole budget: kept alone
    EXPECT_EQ(store.size(), 1u);
    EXPECT_NE(store.get("huge"), nullptr);
    // replace() updates an entry (and its bytes) only while the one it expects is there: not a deleted one, and not
    // a new response that took a deleted one's id (a background run ending after its response was deleted and its
    // request_id reused overwrote the new response).
    store.replace("gone", nullptr, entry_of(1));
    EXPECT_EQ(store.get("gone"), nullptr);
    // (The caller holds the entry it expects, as a background run does, so its address is not reused.)
    const std::shared_ptr<const StoredResponse> huge = store.get("huge");
    store.replace("huge", nullptr, entry_of(1));
    EXPECT_EQ(store.get("huge"), huge);
    const std::shared_ptr<const StoredResponse> small = entry_of(1);
    store.replace("huge", huge.get(), small);
    EXPECT_EQ(store.bytes(), small->bytes());
    auto newer = entry_of(2);
    store.put("huge", newer);
    store.replace("huge", small.get(), entry_of(3));  // `small` was deleted and its id reused
    EXPECT_EQ(store.get("huge"), newer);
    ResponseStore off(0, 1 << 20);
    EXPECT_FALSE(off.enabled());
    off.put("a", entry_of(1));
    EXPECT_EQ(off.get("a"), nullptr);
}

class NullSession final : public Session {
public:
    void open(std::string*) override {}
    bool on_event(const EngineEvent&, std::string*) override { return false; }
    void close(FinishReason, std::string*) override {}
    void fail(const ApiError&, std::string*) override {}
    Json body() const override { return Json{{"status", "completed"}}; }
};

TEST(ResponseStore, NeverDropsARunningBackgroundResponse) {
    ResponseStore store(2, size_t{1} << 30);
    auto running = std::make_shared<StoredResponse>();
    running->run = std::make_shared<BackgroundRun>(std::make_unique<NullSession>());
    store.put("bg", running);
    store.put("a", entry_of(1));
    store.put("b", entry_of(1));  // over by one: a goes, bg (older, running) stays
    EXPECT_NE(store.get("bg"), nullptr);
    EXPECT_EQ(store.get("a"), nullptr);
    store.put("c", entry_of(1));  // bg is now the most recently used; b goes
    EXPECT_EQ(store.get("b"), nullptr);
    running->run->step([](Session&, std::string* sse) { *sse += "event: x\ndata: {}\n\n"; }, nullptr, true);
    EXPECT_TRUE(running->run->done());
    EXPECT_EQ(running->run->snapshot(), (Json{{"status", "completed"}}));
    store.put("d", entry_of(1));
    store.put("e", entry_of(1));  // done now: it goes like any other
    EXPECT_EQ(store.get("bg"), nullptr);
    EXPECT_EQ(store.size(), 2u);
}

FakeScript final_script(const std::string& text) {
    return [text](const EngineRequest&) { return harmony_ids("<|channel|>final<|message|>" + text + "<|return|>"); };
}

class StoredResponsesTest : public ::testing::Test {
protected:
    void SetUp() override { REQUIRE_TOKENIZER(); }

    static Json post_ok(TestServer& s, const Json& body) {
        auto r = s.post("/v1/responses", body.dump());
        EXPECT_TRUE(r);
        if (!r) return Json();
        EXPECT_EQ(r->status, 200) << r->body;
        return Json::parse(r->body, nullptr, false);
    }
    static Json get_ok(TestServer& s, const std::string& path) {
        auto r = s.get(path);
        EXPECT_TRUE(r);
        if (!r) return Json();
        EXPECT_EQ(r->status, 200) << r->body;
        return Json::parse(r->body, nullptr, false);
    }
    // A background response whose model writes `start` and then 2,000 more tokens (a step every 3 ms: cancelled
    // long before its end); its id.
    static std::string start_long_background(TestServer& s, const std::string& start) {
        std::vector<int32_t> script = harmony_ids(start);
        script.insert(script.end(), 2000, 1234);
        s.engine.set_script([script](const EngineRequest&) { return script; });
        return post_ok(s, {{"input", "Hi"}, {"background", true}})["id"];
    }
    static TestServerOptions slow_steps() {
        TestServerOptions o = default_test_options();
        o.engine.step_interval = std::chrono::microseconds(3000);
        return o;
    }
    // POST .../cancel (200), then the response once finished.
    static Json cancel_and_wait(TestServer& s, const std::string& id) {
        auto c = s.post("/v1/responses/" + id + "/cancel", "");
        EXPECT_TRUE(c);
        if (c) {
            EXPECT_EQ(c->status, 200) << c->body;
        }
        return wait_finished(s, id);
    }
    // Polls GET /v1/responses/{id} until its status is not queued / in_progress (up to 10 s).
    static Json wait_finished(TestServer& s, const std::string& id) {
        Json r;
        for (int i = 0; i < 1000; ++i) {
            r = get_ok(s, "/v1/responses/" + id);
            const std::string st = r.value("status", std::string());
            if (st != "queued" && st != "in_progress") return r;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ADD_FAILURE() << "still running: " << r.dump();
        return r;
    }
};

TEST_F(StoredResponsesTest, StoredAnswersAreRetrievedListedAndDeleted) {
    TestServer s;
    s.engine.set_script(final_script("Hello"));
    const Json answer = post_ok(s, {{"input", "Hi there"}, {"metadata", {{"k", "v"}}}});
    ASSERT_TRUE(answer.is_object());
    EXPECT_EQ(answer["store"], true);
    EXPECT_EQ(answer["background"], false);
    const std::string id = answer["id"];
    EXPECT_EQ(get_ok(s, "/v1/responses/" + id), answer);  // the same object, output and usage included
    // Fields the openai SDK's Response type requires (session 67's conformance check): access_programs (null: the
    // standard fallback), usage.input_tokens_details.cache_write_tokens; completed_at, present when completed.
    EXPECT_TRUE(answer.contains("access_programs") && answer["access_programs"].is_null()) << answer.dump();
    EXPECT_EQ(answer["usage"]["input_tokens_details"]["cache_write_tokens"], 0) << answer.dump();
    ASSERT_TRUE(answer["completed_at"].is_number_integer()) << answer.dump();
    EXPECT_GE(answer["completed_at"].get<int64_t>(), answer["created_at"].get<int64_t>());
    EXPECT_LE(answer["completed_at"].get<int64_t>(), answer["created_at"].get<int64_t>() + 60);

    const Json items = get_ok(s, "/v1/responses/" + id + "/input_items");
    EXPECT_EQ(items["object"], "list");
    ASSERT_EQ(items["data"].size(), 1u) << items.dump();
    const Json& item = items["data"][0];
    EXPECT_EQ(item["type"], "message");
    EXPECT_EQ(item["role"], "user");
    EXPECT_EQ(item["content"], Json::parse(R"([{"type":"input_text","text":"Hi there"}])"));
    EXPECT_EQ(items["first_id"], item["id"]);
    EXPECT_EQ(items["last_id"], item["id"]);
    EXPECT_EQ(items["has_more"], false);

    auto del = s.client().Delete(("/v1/responses/" + id).c_str());
    ASSERT_TRUE(del);
    ASSERT_EQ(del->status, 200) << del->body;
    EXPECT_EQ(parse(del->body), (Json{{"id", id}, {"object", "response"}, {"deleted", true}}));
    Json e = expect_error(s.get("/v1/responses/" + id), 404);
    EXPECT_NE(e["message"].get<std::string>().find("not found"), std::string::npos) << e.dump();
    expect_error(s.client().Delete(("/v1/responses/" + id).c_str()), 404);

    // store: false is answered as such and kept nowhere.
    const Json unstored = post_ok(s, {{"input", "Hi"}, {"store", false}});
    EXPECT_EQ(unstored["store"], false);
    expect_error(s.get("/v1/responses/" + unstored["id"].get<std::string>()), 404);

    // A streamed answer is stored as its completed response.
    auto r = s.post("/v1/responses", R"({"input":"Hi","stream":true})");
    ASSERT_TRUE(r);
    std::vector<SseEvent> events = parse_sse(r->body);
    ASSERT_FALSE(events.empty());
    const Json completed = parse(events.back().data)["response"];
    EXPECT_EQ(completed["status"], "completed");
    EXPECT_EQ(get_ok(s, "/v1/responses/" + completed["id"].get<std::string>()), completed);
}

// GET's include query (include[]=reasoning.encrypted_content, as OpenAI's clients send it) adds the reasoning items'
// encrypted_content, as the creating request's include would have (it was ignored); an unknown value is a 400.
TEST_F(StoredResponsesTest, RetrieveTakesTheIncludeQuery) {
    TestServer s;
    s.engine.set_script([](const EngineRequest&) {
        return harmony_ids(
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>");
    });
    const Json answer = post_ok(s, {{"input", "Hi"}});
    const std::string id = answer["id"];
    ASSERT_EQ(answer["output"][0]["type"], "reasoning") << answer.dump();
    EXPECT_FALSE(answer["output"][0].contains("encrypted_content"));
    for (const char* q : {"?include[]=reasoning.encrypted_content", "?include=reasoning.encrypted_content"}) {
        const Json got = get_ok(s, "/v1/responses/" + id + q);
        const Json& rs = got["output"][0];
        ASSERT_TRUE(rs.contains("encrypted_content")) << got.dump();
        EXPECT_EQ(reasoning_from_encrypted_content(rs["encrypted_content"].get<std::string>()), "Think.");
        Json without = got;
        without["output"][0].erase("encrypted_content");
        EXPECT_EQ(without, answer);  // nothing else changes
    }
    EXPECT_EQ(get_ok(s, "/v1/responses/" + id + "?include[]=web_search_call.results"), answer);
    Json e = expect_error(s.get("/v1/responses/" + id + "?include[]=bogus"), 400);
    EXPECT_NE(e["message"].get<std::string>().find("bogus"), std::string::npos) << e.dump();
}

TEST_F(StoredResponsesTest, InputItemsPageInEitherOrder) {
    TestServer s;
    s.engine.set_script(final_script("ok"));
    Json input = Json::array();
    for (int i = 0; i < 5; ++i)
        input.push_back({{"role", "user"}, {"content", std::string(1, 'm').append(std::to_string(i))}});
    const std::string id = post_ok(s, {{"input", input}})["id"];
    const std::string base = "/v1/responses/" + id + "/input_items";
    const auto texts = [](const Json& list) {
        std::string t;
        for (const Json& item : list["data"]) t += item["content"][0]["text"].get<std::string>();
        return t;
    };
    Json desc = get_ok(s, base + "?limit=2");
    EXPECT_EQ(texts(desc), "m4m3");
    EXPECT_EQ(desc["has_more"], true);
    Json next = get_ok(s, base + "?limit=2&after=" + desc["last_id"].get<std::string>());
    EXPECT_EQ(texts(next), "m2m1");
    Json asc = get_ok(s, base + "?order=asc&limit=10");
    EXPECT_EQ(texts(asc), "m0m1m2m3m4");
    EXPECT_EQ(asc["has_more"], false);
    // Bad queries are 400s naming the parameter.
    EXPECT_EQ(expect_error(s.get(base + "?limit=0"), 400)["param"], "limit");
    EXPECT_EQ(expect_error(s.get(base + "?limit=abc"), 400)["param"], "limit");
    EXPECT_EQ(expect_error(s.get(base + "?order=up"), 400)["param"], "order");
    EXPECT_EQ(expect_error(s.get(base + "?after=msg_nope"), 400)["param"], "after");
    expect_error(s.get("/v1/responses/" + id + "/other"), 404);
}

TEST_F(StoredResponsesTest, PreviousResponseIdGivesThePromptOfTheWholeInput) {
    TestServer s;
    s.engine.set_script(final_script("Hello"));
    const Json first = post_ok(s, {{"input", "Hi"}, {"instructions", "Be brief."}});
    const std::string id = first["id"];
    const Json second = post_ok(s, {{"input", "And again?"}, {"previous_response_id", id}});
    EXPECT_EQ(second["previous_response_id"], id);
    const std::vector<int32_t> chained = s.engine.last_request().prompt;
    // The same conversation sent whole (instructions are not carried over, as OpenAI's).
    post_ok(s, {{"input", Json::array({{{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", "Hello"}},
                                       {{"role", "user"}, {"content", "And again?"}}})},
                {"store", false}});
    EXPECT_EQ(chained, s.engine.last_request().prompt);
    // A chain of three, with instructions on the last.
    const Json third =
        post_ok(s, {{"input", "Once more."}, {"previous_response_id", second["id"]}, {"instructions", "Be kind."}});
    const std::vector<int32_t> chained3 = s.engine.last_request().prompt;
    post_ok(s, {{"input", Json::array({{{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", "Hello"}},
                                       {{"role", "user"}, {"content", "And again?"}},
                                       {{"role", "assistant"}, {"content", "Hello"}},
                                       {{"role", "user"}, {"content", "Once more."}}})},
                {"instructions", "Be kind."},
                {"store", false}});
    EXPECT_EQ(chained3, s.engine.last_request().prompt);
    // input_items lists the request's own input only.
    EXPECT_EQ(get_ok(s, "/v1/responses/" + third["id"].get<std::string>() + "/input_items")["data"].size(), 1u);
    // The previous response's output item sent again beside previous_response_id was rendered twice: an id is one
    // item of the conversation (OpenAI's 400), and so are two input items with one id.
    Json again = third["output"][0];
    Json dup =
        expect_error(s.post("/v1/responses", Json{{"input", Json::array({again, {{"role", "user"}, {"content", "x"}}})},
                                                  {"previous_response_id", third["id"]}}
                                                 .dump()),
                     400);
    EXPECT_EQ(dup["param"], "input[0].id");
    EXPECT_NE(dup["message"].get<std::string>().find(again["id"].get<std::string>()), std::string::npos);
    Json twice = expect_error(s.post("/v1/responses", R"({"input":[{"id":"msg_d","role":"user","content":"a"},
                                                                   {"id":"msg_d","role":"user","content":"b"}]})"),
                              400);
    EXPECT_EQ(twice["param"], "input[1].id");

    Json e = expect_error(s.post("/v1/responses", R"({"input":"x","previous_response_id":"resp_nope"})"), 404);
    EXPECT_EQ(e["code"], "previous_response_not_found");
    EXPECT_EQ(e["param"], "previous_response_id");
    EXPECT_EQ(expect_error(s.post("/v1/responses", R"({"input":"x","previous_response_id":7})"), 400)["param"],
              "previous_response_id");
    // An error in the new input names the new input's item.
    e = expect_error(s.post("/v1/responses", Json{{"input", Json::array({{{"role", "user"}, {"content", "a"}},
                                                                         {{"role", "pilot"}, {"content", "b"}}})},
                                                  {"previous_response_id", id}}
                                                 .dump()),
                     400);
    EXPECT_EQ(e["param"], "input[1].role");
}

// item_reference inputs ({"type": "item_reference", "id"}, or {"id"} alone, OpenAI's ItemReference) stand for the
// stored item with that id, an input or an output item: the prompt equals the one with the items written out.
TEST_F(StoredResponsesTest, ItemReferencesStandForStoredItems) {
    TestServer s;
    s.engine.set_script(final_script("Hello"));
    const Json first = post_ok(s, {{"input", "Hi"}});
    const std::string id = first["id"];
    const Json input_item = get_ok(s, "/v1/responses/" + id + "/input_items")["data"][0];
    const Json output_item = first["output"].back();
    ASSERT_EQ(output_item["type"], "message") << first.dump();
    post_ok(s, {{"input", Json::array({{{"type", "item_reference"}, {"id", input_item["id"]}},
                                       {{"id", output_item["id"]}},
                                       {{"role", "user"}, {"content", "And again?"}}})},
                {"store", false}});
    const std::vector<int32_t> referenced = s.engine.last_request().prompt;
    post_ok(s, {{"input", Json::array({input_item, output_item, {{"role", "user"}, {"content", "And again?"}}})},
                {"store", false}});
    EXPECT_EQ(referenced, s.engine.last_request().prompt);
    post_ok(s, {{"input", Json::array({{{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", "Hello"}},
                                       {{"role", "user"}, {"content", "And again?"}}})},
                {"store", false}});
    EXPECT_EQ(referenced, s.engine.last_request().prompt);
    // A stored request's input items list the referenced items themselves.
    const Json second = post_ok(s, {{"input", Json::array({{{"type", "item_reference"}, {"id", output_item["id"]}}})}});
    EXPECT_EQ(get_ok(s, "/v1/responses/" + second["id"].get<std::string>() + "/input_items")["data"][0], output_item);
    // Unknown ids are 404s naming the item; a reference without an id is a 400.
    Json e =
        expect_error(s.post("/v1/responses",
                            R"({"input":[{"role":"user","content":"x"},{"type":"item_reference","id":"msg_nope"}]})"),
                     404);
    EXPECT_EQ(e["param"], "input[1].id");
    EXPECT_NE(e["message"].get<std::string>().find("msg_nope"), std::string::npos);
    EXPECT_EQ(expect_error(s.post("/v1/responses", R"({"input":[{"type":"item_reference"}]})"), 400)["param"],
              "input[0].id");
    Json not_string = expect_error(s.post("/v1/responses", R"({"input":[{"type":"item_reference","id":5}]})"), 400);
    EXPECT_EQ(not_string["param"], "input[0].id");
    EXPECT_NE(not_string["message"].get<std::string>().find("must be a string"), std::string::npos);
    // A null type is no type (OpenAI's ItemReference.type is optional and nullable).
    post_ok(s, {{"input", Json::array({{{"type", nullptr}, {"id", output_item["id"]}}})}, {"store", false}});
    // At most 1,024 references a request (the same item named many times is bounded by the JSON it resolves to too).
    Json many = Json::array();
    for (int i = 0; i < 1025; ++i) many.push_back({{"id", output_item["id"]}});
    EXPECT_EQ(expect_error(s.post("/v1/responses", Json{{"input", many}, {"store", false}}.dump()), 400)["param"],
              "input[1024]");
    many.erase(1024);  // 1,024 resolve, and then name one item twice (OpenAI's 400: an id is one item)
    Json dup = expect_error(s.post("/v1/responses", Json{{"input", many}, {"store", false}}.dump()), 400);
    EXPECT_EQ(dup["param"], "input[1].id");
    EXPECT_NE(dup["message"].get<std::string>().find("Duplicate item found with id"), std::string::npos);
    // A finished background response's output items can be referenced.
    const Json bg = post_ok(s, {{"input", "Hi"}, {"background", true}});
    const Json done = wait_finished(s, bg["id"]);
    ASSERT_FALSE(done["output"].empty()) << done.dump();
    post_ok(s, {{"input", Json::array({{{"type", "item_reference"}, {"id", done["output"].back()["id"]}}})},
                {"store", false}});
}

TEST_F(StoredResponsesTest, AToolResultContinuesFromTheCallsResponse) {
    TestServer s;
    s.engine.set_script([](const EngineRequest&) {
        return harmony_ids(
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
    });
    const Json tools = Json::parse(
        R"([{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}])");
    const Json first = post_ok(s, {{"input", "Weather in Paris?"}, {"tools", tools}});
    ASSERT_EQ(first["output"].size(), 2u) << first.dump();
    const Json call = first["output"][1];
    ASSERT_EQ(call["type"], "function_call");
    s.engine.set_script(final_script("Sunny."));
    const Json result = {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "sunny"}};
    // Without the earlier response the result matches no call: a 400.
    expect_error(s.post("/v1/responses", Json{{"input", Json::array({result})}, {"tools", tools}}.dump()), 400);
    const Json second =
        post_ok(s, {{"input", Json::array({result})}, {"tools", tools}, {"previous_response_id", first["id"]}});
    EXPECT_EQ(second["status"], "completed");
    // The result as an input item: with the status the SDK's ResponseFunctionToolCallOutputItem requires.
    const Json second_items = get_ok(s, "/v1/responses/" + second["id"].get<std::string>() + "/input_items");
    ASSERT_EQ(second_items["data"].size(), 1u) << second_items.dump();
    EXPECT_EQ(second_items["data"][0]["type"], "function_call_output");
    EXPECT_EQ(second_items["data"][0]["status"], "completed");
    const std::vector<int32_t> chained = s.engine.last_request().prompt;
    // The whole input: the user's message, the reasoning and the call (output items as given), the result.
    Json whole = Json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
    for (const Json& item : first["output"]) whole.push_back(item);
    whole.push_back(result);
    post_ok(s, {{"input", whole}, {"tools", tools}, {"store", false}});
    EXPECT_EQ(chained, s.engine.last_request().prompt);
    const std::string text = test_tokenizer()->decode(chained).value();
    EXPECT_NE(text.find("Need weather."), std::string::npos) << text;  // the tool loop's reasoning is kept
}

TEST_F(StoredResponsesTest, BackgroundResponsesArePolledReplayedAndCancelled) {
    TestServer s;
    s.engine.set_script(final_script("Hello there"));
    s.engine.set_paused(true);
    const Json queued = post_ok(s, {{"input", "Hi"}, {"background", true}});
    EXPECT_EQ(queued["background"], true);
    EXPECT_EQ(queued["status"], "queued");
    EXPECT_EQ(queued["output"], Json::array());
    const std::string id = queued["id"];
    const std::string st = get_ok(s, "/v1/responses/" + id)["status"];
    EXPECT_TRUE(st == "queued" || st == "in_progress") << st;
    // Continuing from it before it has finished is refused.
    expect_error(s.post("/v1/responses", Json{{"input", "x"}, {"previous_response_id", id}}.dump()), 400);
    s.engine.set_paused(false);
    const Json done = wait_finished(s, id);
    EXPECT_EQ(done["status"], "completed");
    EXPECT_EQ(done["background"], true);
    ASSERT_EQ(done["output"].size(), 1u) << done.dump();
    EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello there");
    EXPECT_TRUE(done["usage"].is_object());
    EXPECT_TRUE(s.wait_engine_idle());

    // Its events, replayed whole and after a sequence number.
    auto all = s.get("/v1/responses/" + id + "?stream=true");
    ASSERT_TRUE(all);
    ASSERT_EQ(all->status, 200) << all->body;
    std::vector<SseEvent> events = parse_sse(all->body);
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.front().event, "response.created");
    EXPECT_EQ(parse(events[0].data)["response"]["status"], "queued");  // as OpenAI's background streams
    EXPECT_EQ(events[1].event, "response.queued");
    EXPECT_EQ(events[2].event, "response.in_progress");
    EXPECT_EQ(events.back().event, "response.completed");
    EXPECT_EQ(parse(events.back().data)["response"], done);
    for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(parse(events[i].data)["sequence_number"], i);
    auto tail = s.get("/v1/responses/" + id + "?stream=true&starting_after=2");
    ASSERT_TRUE(tail);
    std::vector<SseEvent> rest = parse_sse(tail->body);
    ASSERT_EQ(rest.size(), events.size() - 3);
    EXPECT_EQ(parse(rest.front().data)["sequence_number"], 3);
    EXPECT_EQ(expect_error(s.get("/v1/responses/" + id + "?stream=maybe"), 400)["param"], "stream");
    // Cancelling a finished background response answers it as it is.
    auto again = s.post("/v1/responses/" + id + "/cancel", "");
    ASSERT_TRUE(again);
    EXPECT_EQ(parse(again->body)["status"], "completed");

    // A running one: cancelled, its engine request ended.
    s.engine.set_paused(true);
    const std::string id2 = post_ok(s, {{"input", "Hi"}, {"background", true}})["id"];
    auto c = s.post("/v1/responses/" + id2 + "/cancel", "");
    ASSERT_TRUE(c);
    ASSERT_EQ(c->status, 200) << c->body;
    EXPECT_EQ(parse(c->body)["status"], "cancelled");
    EXPECT_EQ(get_ok(s, "/v1/responses/" + id2)["status"], "cancelled");
    s.engine.set_paused(false);
    EXPECT_TRUE(s.wait_engine_idle());

    // Deleting a running one ends it too.
    s.engine.set_paused(true);
    const std::string id3 = post_ok(s, {{"input", "Hi"}, {"background", true}})["id"];
    auto del = s.client().Delete(("/v1/responses/" + id3).c_str());
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 200);
    s.engine.set_paused(false);
    EXPECT_TRUE(s.wait_engine_idle());
    expect_error(s.get("/v1/responses/" + id3), 404);

    // Only background responses can be cancelled or streamed again; unknown ids are 404s.
    const std::string plain = post_ok(s, {{"input", "Hi"}})["id"];
    expect_error(s.post("/v1/responses/" + plain + "/cancel", ""), 400);
    expect_error(s.get("/v1/responses/" + plain + "?stream=true"), 400);
    expect_error(s.post("/v1/responses/resp_nope/cancel", ""), 404);
    expect_error(s.post("/v1/responses/" + plain + "/other", ""), 404);
    EXPECT_EQ(expect_error(s.post("/v1/responses", R"({"input":"x","background":true,"store":false})"), 400)["param"],
              "background");
}

TEST_F(StoredResponsesTest, ABackgroundStreamOutlivesItsClient) {
    TestServer s;
    s.engine.set_script(final_script("Streamed in the background"));
    auto r = s.post("/v1/responses", R"({"input":"Hi","background":true,"stream":true})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::vector<SseEvent> events = parse_sse(r->body);
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.front().event, "response.created");
    const Json created = parse(events.front().data)["response"];
    EXPECT_EQ(created["background"], true);
    EXPECT_EQ(events.back().event, "response.completed");
    const std::string id = created["id"];
    EXPECT_EQ(wait_finished(s, id)["output"][0]["content"][0]["text"], "Streamed in the background");

    // A client that reads a little and goes away leaves the response running to its end.
    s.engine.set_paused(true);
    std::string id2;
    {
        const std::string body = R"({"input":"Hi","background":true,"stream":true})";
        const int fd = send_raw(s.http.port(),
                                "POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                "Content-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n" + body,
                                5);
        ASSERT_GE(fd, 0);
        std::string got;
        char buf[4096];
        while (got.find("event: response.queued") == std::string::npos) {  // the first two events
            const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
            if (n <= 0) break;
            got.append(buf, static_cast<size_t>(n));
        }
        ::close(fd);  // gone, mid-stream
        const size_t at = got.find("data: {");
        ASSERT_NE(at, std::string::npos) << got;
        id2 = parse(got.substr(at + 6, got.find('\n', at) - at - 6))["response"]["id"];
    }
    ASSERT_FALSE(id2.empty());
    // (queued: the paused engine has not begun it; in_progress only once it does, as OpenAI's status says)
    EXPECT_EQ(get_ok(s, "/v1/responses/" + id2)["status"], "queued");
    s.engine.set_paused(false);
    EXPECT_EQ(wait_finished(s, id2)["status"], "completed");
    EXPECT_TRUE(s.wait_engine_idle());
}

// A background response cancelled mid-generation reports its usage as it stands: the reasoning it wrote counts as
// reasoning tokens (it said 0, the session never having been closed).
TEST_F(StoredResponsesTest, ACancelledResponseCountsItsReasoning) {
    TestServer s(slow_steps());
    // A finished reasoning message, then a long one.
    const std::string id = start_long_background(
        s, "<|channel|>analysis<|message|>First thought.<|end|><|start|>assistant<|channel|>analysis<|message|>");
    Json now;
    for (int i = 0; i < 500; ++i) {  // some reasoning written
        now = get_ok(s, "/v1/responses/" + id);
        if (!now["output"].empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const Json done = cancel_and_wait(s, id);
    EXPECT_EQ(done["status"], "cancelled");
    ASSERT_FALSE(done["output"].empty()) << done.dump();
    EXPECT_EQ(done["output"][0]["type"], "reasoning");
    const Json& u = done["usage"];
    ASSERT_TRUE(u.is_object()) << done.dump();
    EXPECT_GT(u["output_tokens"].get<int64_t>(), 4);
    EXPECT_GT(u["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), 0) << u.dump();
    EXPECT_LE(u["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), u["output_tokens"].get<int64_t>());
    EXPECT_TRUE(s.wait_engine_idle());
}

// The item being generated shows in a poll as it stands (status in_progress), and a cancel keeps it as incomplete:
// the cancelled answer dropped the text of the message it was writing.
TEST_F(StoredResponsesTest, ACancelledResponseKeepsItsUnfinishedMessage) {
    TestServer s(slow_steps());
    const std::string id = start_long_background(s, "<|channel|>final<|message|>Hello there");
    Json now;
    for (int i = 0; i < 500; ++i) {  // the message begun
        now = get_ok(s, "/v1/responses/" + id);
        if (!now["output"].empty() && now["output"][0]["content"][0]["text"].get<std::string>().size() > 11) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(now["status"], "in_progress") << now.dump();
    ASSERT_EQ(now["output"].size(), 1u) << now.dump();
    EXPECT_EQ(now["output"][0]["type"], "message");
    EXPECT_EQ(now["output"][0]["status"], "in_progress");
    const Json done = cancel_and_wait(s, id);
    EXPECT_EQ(done["status"], "cancelled");
    ASSERT_EQ(done["output"].size(), 1u) << done.dump();
    const Json& item = done["output"][0];
    EXPECT_EQ(item["type"], "message");
    EXPECT_EQ(item["status"], "incomplete");
    const std::string text = item["content"][0]["text"];
    EXPECT_EQ(text.rfind("Hello there", 0), 0u) << text;
    EXPECT_GT(text.size(), now["output"][0]["content"][0]["text"].get<std::string>().size() - 1);
    // Polled again: the same answer (the final snapshot is kept, not rebuilt).
    EXPECT_EQ(get_ok(s, "/v1/responses/" + id), done);
    EXPECT_TRUE(s.wait_engine_idle());
}

// Cancelled while the model was still in a message header: the header's text is recovered as reasoning, as at a length
// cut (HARMONY.md §6.7 X10); the output was empty while output_tokens counted the header's tokens.
TEST_F(StoredResponsesTest, ACancelledHeaderIsRecoveredAsAtALengthCut) {
    TestServer s(slow_steps());
    const std::string id = start_long_background(s, "<|channel|>commentary");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const Json done = cancel_and_wait(s, id);
    EXPECT_EQ(done["status"], "cancelled");
    ASSERT_EQ(done["output"].size(), 1u) << done.dump();
    EXPECT_EQ(done["output"][0]["type"], "reasoning");
    EXPECT_FALSE(done["output"][0]["content"][0]["text"].get<std::string>().empty()) << done.dump();
    EXPECT_GT(done["usage"]["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), 0) << done.dump();
    EXPECT_TRUE(s.wait_engine_idle());
}

// POST /v1/responses/input_tokens: the prompt tokens the same body would be answered with (usage.input_tokens),
// previous_response_id and a forced call included; nothing generated or stored.
TEST_F(StoredResponsesTest, InputTokensCountsWhatTheRequestWouldSend) {
    TestServer s;
    s.engine.set_script(final_script("Hello"));
    const Json tools = Json::parse(R"([{"type":"function","name":"f","parameters":{"type":"object"}}])");
    const Json first = post_ok(s, {{"input", "Hi"}, {"instructions", "Be brief."}});
    const Json bodies[] = {
        {{"input", "Hi"}},
        {{"input", "Hi"}, {"instructions", "Be brief."}, {"reasoning", {{"effort", "high"}}}},
        {{"input", "Again"}, {"previous_response_id", first["id"]}},
        {{"input", "Call it"}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"name", "f"}}}},
    };
    for (const Json& body : bodies) {
        SCOPED_TRACE(body.dump());
        const int64_t submitted = s.engine.submitted();
        auto r = s.post("/v1/responses/input_tokens", body.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const Json count = parse(r->body);
        EXPECT_EQ(count["object"], "response.input_tokens");
        EXPECT_EQ(s.engine.submitted(), submitted);  // nothing ran
        Json real = body;
        real["store"] = false;
        EXPECT_EQ(count["input_tokens"], post_ok(s, real)["usage"]["input_tokens"]);
    }
    EXPECT_EQ(expect_error(s.post("/v1/responses/input_tokens", R"({"input":"x","previous_response_id":"resp_no"})"),
                           404)["code"],
              "previous_response_not_found");
    EXPECT_EQ(expect_error(s.post("/v1/responses/input_tokens", R"({"input":7})"), 400)["param"], "input");
    expect_error(s.post("/v1/responses/input_tokens", "{"), 400);
    expect_error(s.get("/v1/responses/input_tokens"), 405);
}

// Many clients at once, each creating responses (background or not, streamed or not), following up, polling,
// cancelling and deleting, against a store small enough to evict: every answer is well formed, nothing is left
// running, and the server shuts down with background runs in flight.
TEST_F(StoredResponsesTest, ConcurrentClientsOnASmallStore) {
    TestServerOptions o = default_test_options();
    o.routes.responses_store_entries = 16;
    o.engine.step_interval = std::chrono::microseconds(2000);
    auto s = std::make_unique<TestServer>(o);
    s->engine.set_script(final_script("one two three four five six seven eight"));
    std::atomic<int> bad{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 12; ++c) {
        clients.emplace_back([&, c] {
            httplib::Client http = s->client();
            std::string last;
            for (int k = 0; k < 12; ++k) {
                const int op = (c * 7 + k * 3) % 6;
                Json body = {{"input", "Hi"}};
                if (op == 1 || op == 4) body["background"] = true;
                if (op == 2 || op == 4) body["stream"] = true;
                if (op == 3 && !last.empty()) body["previous_response_id"] = last;
                auto r = http.Post("/v1/responses", body.dump(), "application/json");
                if (!r || (r->status != 200 && r->status != 404)) {  // 404: the previous one was evicted
                    ++bad;
                    continue;
                }
                if (r->status != 200) continue;
                std::string id;
                if (body.contains("stream")) {
                    std::vector<SseEvent> events = parse_sse(r->body);
                    if (events.empty()) {
                        ++bad;
                        continue;
                    }
                    id = parse(events.front().data)["response"]["id"];
                } else {
                    id = parse(r->body)["id"];
                }
                last = id;
                const std::string path = "/v1/responses/" + id;
                if (k % 4 == 1) http.Post((path + "/cancel").c_str(), "", "application/json");
                if (k % 4 == 2) http.Delete(path.c_str());
                auto g = http.Get(path.c_str());
                if (!g || (g->status != 200 && g->status != 404) ||
                    (g->status == 200 && !parse(g->body).contains("status")))
                    ++bad;
            }
        });
    }
    for (std::thread& t : clients) t.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_TRUE(s->wait_engine_idle());
    // Shutting down with background runs in flight ends them (the routes join their threads).
    s->engine.set_paused(true);
    for (int i = 0; i < 4; ++i) post_ok(*s, {{"input", "Hi"}, {"background", true}});
    s.reset();
}

// truncation: "auto": a conversation over the context (4,096 here) loses its first turns, the fewest that make the
// prompt leave max_output_tokens; the prompt is the one the kept turns sent whole give. "disabled" (the default): a
// 400 as before. Through previous_response_id too.
TEST_F(StoredResponsesTest, TruncationAutoDropsTheFirstTurns) {
    TestServer s;
    s.engine.set_script(final_script("ok"));
    std::string words;
    for (int i = 0; i < 120; ++i) words += " apple";
    Json turns = Json::array();
    for (int t = 0; t < 30; ++t) {
        turns.push_back({{"role", "user"}, {"content", "turn " + std::to_string(t) + words}});
        turns.push_back({{"role", "assistant"}, {"content", "noted" + words}});
    }
    turns.push_back({{"role", "user"}, {"content", "last question"}});
    const Json body = {{"input", turns}, {"max_output_tokens", 16}, {"store", false}};
    Json e = expect_error(s.post("/v1/responses", body.dump()), 400);
    EXPECT_EQ(e["code"], "context_length_exceeded");
    Json autob = body;
    autob["truncation"] = "auto";
    const Json r = post_ok(s, autob);
    EXPECT_EQ(r["truncation"], "auto");
    const int64_t used = r["usage"]["input_tokens"];
    EXPECT_LE(used + 16, 4096);
    // input_tokens counts what the request would send: the truncated prompt.
    auto counted = s.post("/v1/responses/input_tokens", autob.dump());
    ASSERT_TRUE(counted);
    ASSERT_EQ(counted->status, 200) << counted->body;
    EXPECT_EQ(Json::parse(counted->body)["input_tokens"], used);
    const std::vector<int32_t> truncated = s.engine.last_request().prompt;
    const std::string text = *test_tokenizer()->decode(truncated);
    EXPECT_NE(text.find("last question"), std::string::npos);
    EXPECT_EQ(text.find("turn 0 "), std::string::npos);
    // The prompt of the kept turns sent whole; one turn more would not have fit.
    size_t first = 0;
    while (text.find("turn " + std::to_string(first) + " ") == std::string::npos) ++first;
    Json kept(turns.begin() + static_cast<std::ptrdiff_t>(2 * first), turns.end());
    post_ok(s, {{"input", kept}, {"max_output_tokens", 16}, {"store", false}});
    EXPECT_EQ(s.engine.last_request().prompt, truncated);
    Json more(turns.begin() + static_cast<std::ptrdiff_t>(2 * first - 2), turns.end());
    expect_error(s.post("/v1/responses", Json{{"input", more}, {"max_output_tokens", 16}}.dump()), 400);

    // A chain: the stored conversation plus a long new input, truncated; the answer says whose follow-up it is.
    Json half(turns.begin(), turns.begin() + 30);
    const Json first_answer = post_ok(s, {{"input", half}, {"max_output_tokens", 16}});
    Json next(turns.begin() + 30, turns.end());
    const Json chained = post_ok(s, {{"input", next},
                                     {"previous_response_id", first_answer["id"]},
                                     {"truncation", "auto"},
                                     {"max_output_tokens", 16}});
    EXPECT_EQ(chained["previous_response_id"], first_answer["id"]);
    EXPECT_LE(chained["usage"]["input_tokens"].get<int64_t>() + 16, 4096);
    // The cut applied to that run only: the stored conversation is the whole one (input_items lists every input item
    // sent; it listed those that ran), so a follow-up without truncation does not fit, and one with it is cut again.
    const std::string chained_id = chained["id"];
    const Json listed = get_ok(s, "/v1/responses/" + chained_id + "/input_items?order=asc&limit=100");
    ASSERT_EQ(listed["data"].size(), next.size()) << listed.dump();
    EXPECT_EQ(listed["data"].front()["content"][0]["text"], next.front()["content"]);
    EXPECT_EQ(
        expect_error(
            s.post("/v1/responses",
                   Json{{"input", "and?"}, {"previous_response_id", chained_id}, {"max_output_tokens", 16}}.dump()),
            400)["code"],
        "context_length_exceeded");
    post_ok(
        s,
        {{"input", "and?"}, {"previous_response_id", chained_id}, {"truncation", "auto"}, {"max_output_tokens", 16}});
    // Nothing can fit (one message over the context): the context error, as without truncation.
    std::string huge;
    for (int i = 0; i < 5000; ++i) huge += " pear";
    EXPECT_EQ(expect_error(s.post("/v1/responses", Json{{"input", huge}, {"truncation", "auto"}}.dump()), 400)["code"],
              "context_length_exceeded");
}

TEST_F(StoredResponsesTest, AServerWithoutAStoreSaysSo) {
    TestServerOptions o = default_test_options();
    o.routes.responses_store_entries = 0;
    TestServer s(o);
    s.engine.set_script(final_script("Hello"));
    const Json answer = post_ok(s, {{"input", "Hi"}});
    EXPECT_EQ(answer["store"], false);
    for (int k = 0; k < 3; ++k) {
        Json e = expect_error(k == 0   ? s.get("/v1/responses/" + answer["id"].get<std::string>())
                              : k == 1 ? s.client().Delete("/v1/responses/resp_1")
                                       : s.post("/v1/responses/resp_1/cancel", "{}"),
                              404);
        EXPECT_NE(e["message"].get<std::string>().find("keeps no responses"), std::string::npos) << e.dump();
    }
    Json e = expect_error(s.post("/v1/responses", R"({"input":"x","previous_response_id":"resp_1"})"), 400);
    EXPECT_EQ(e["code"], "unsupported_parameter");
    e = expect_error(s.post("/v1/responses", R"({"input":"x","background":true})"), 400);
    EXPECT_EQ(e["code"], "unsupported_parameter");
    e = expect_error(s.post("/v1/responses", R"({"input":[{"type":"item_reference","id":"msg_1"}]})"), 400);
    EXPECT_EQ(e["code"], "unsupported_parameter");
    EXPECT_EQ(e["param"], "input[0]");
}

}  // namespace
}  // namespace gptoss::server
