// Prefill/decode disaggregation across servers (server/disaggregation.h): a decode worker whose prompts' KV
// comes from a prefill worker over HTTP answers exactly as one server alone (a small random checkpoint on the CPU
// backend, where a cache hit changes no bits), and keeps answering when the prefill worker is down, has another KV
// format, or the request is cancelled while its KV is fetched; POST /v1/kv/prefill's refusals.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/cpu_model_runner.h"
#include "runtime/engine.h"
#include "server/disaggregation.h"
#include "server/runtime_engine.h"
#include "server_test_util.h"
#include "unit/runtime/engine_test_util.h"

namespace gptoss::server::testing {
namespace {

// One server: a CPU engine (blocks of `block_size`) behind the routes; a decode worker when `prefill_port` > 0.
class Worker {
public:
    Worker(std::shared_ptr<const model::GptOssWeights> w, bool producer, int block_size = 4, int prefill_port = 0) {
        engine.start([w, block_size]() -> StatusOr<std::unique_ptr<runtime::Engine>> {
            runtime::EngineConfig c = runtime::testing::small_engine_test_config();
            c.block_size = block_size;
            return runtime::Engine::create(std::make_unique<runtime::CpuModelRunner>(w), c);
        });
        TokenEngine* front = &engine;
        if (prefill_port > 0) {
            auto client =
                PrefillClient::create("http://127.0.0.1:" + std::to_string(prefill_port), std::chrono::seconds(30));
            EXPECT_TRUE(client.ok()) << client.status().to_string();
            prefill = std::move(*client);
            decode = std::make_unique<DisaggregatedEngine>(
                engine, [c = prefill.get()](const std::vector<int32_t>& p, const runtime::KvFormat& f, int priority,
                                            FetchCancel& cancel) { return c->prefill(p, f, priority, &cancel); });
            front = decode.get();
        }
        queue = std::make_unique<RequestQueue>(*front, metrics);
        RoutesOptions o;
        o.model_id = "small";
        o.kv_producer = producer;
        routes = std::make_unique<OpenAiRoutes>(*queue, *test_tokenizer(), o);
        HttpServerOptions h;
        h.port = 0;
        h.threads = 16;
        http = std::make_unique<HttpServer>(*routes, metrics, h);
        EXPECT_TRUE(http->start().ok());
        for (int i = 0; i < 2000 && !engine.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        EXPECT_TRUE(engine.ready());
    }
    ~Worker() {
        queue->shutdown();
        http->stop();
    }
    httplib::Result post(const std::string& path, const std::string& body, const char* type = "application/json") {
        httplib::Client c("127.0.0.1", http->port());
        c.set_read_timeout(60, 0);
        return c.Post(path.c_str(), body, type);
    }
    EngineStats stats() const { return queue->engine().stats(); }

    RuntimeEngineAdapter engine;
    std::unique_ptr<PrefillClient> prefill;
    std::unique_ptr<DisaggregatedEngine> decode;
    ServerMetrics metrics;
    std::unique_ptr<RequestQueue> queue;
    std::unique_ptr<OpenAiRoutes> routes;
    std::unique_ptr<HttpServer> http;
};

class DisaggregationTest : public runtime::testing::RandomCheckpointTest<DisaggregationTest> {
public:
    // The real vocabulary's size: the completions route adds the Harmony stop ids (<|return|> 200002, ...).
    static model::GptOssConfig config() { return runtime::testing::small_engine_config(201088, 256); }
    static constexpr uint64_t kSeed = 19;
    static constexpr const char* kName = "gptoss_disaggregation_test_";

protected:
    void SetUp() override {
        REQUIRE_TOKENIZER();
        ASSERT_TRUE(weights_);
    }
};

// A loopback socket listening on a free port: a stand-in prefill worker that accepts (or not) and never answers.
void listen_loopback(int* fd, int* port) {
    *fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(*fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::listen(*fd, 16), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(::getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    *port = ntohs(addr.sin_port);
}

// A completions body over token ids, greedy or seeded, with the sampled tokens' logprobs.
std::string completion(const std::vector<int32_t>& ids, int max_tokens, int seed) {
    Json j = Json::object();
    j["prompt"] = ids;
    j["max_tokens"] = max_tokens;
    j["logprobs"] = 1;
    if (seed < 0) {
        j["temperature"] = 0;
    } else {
        j["temperature"] = 1.0;
        j["seed"] = seed;
    }
    return dump_json(j);
}

struct Answer {
    Json logprobs;  // tokens and token_logprobs
    std::string finish;
    int cached = 0;
};
Answer answer(const httplib::Result& r) {
    Answer a;
    EXPECT_TRUE(r);
    if (!r) return a;
    EXPECT_EQ(r->status, 200) << r->body;
    if (r->status != 200) return a;
    const Json j = parse(r->body);
    a.logprobs = j["choices"][0]["logprobs"]["token_logprobs"];
    a.finish = j["choices"][0]["finish_reason"];
    a.cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
    return a;
}

TEST(KvFormatJson, RoundTripsAndRefusesBadFields) {
    runtime::KvFormat f;
    f.dtype = runtime::KvDtype::kE4m3;
    f.num_hidden_layers = 36;
    f.num_key_value_heads = 8;
    f.head_dim = 64;
    f.hidden_size = 2880;
    f.vocab_size = 201088;
    f.sliding_window = 128;
    f.block_size = 16;
    f.layer_kinds = 0x555555555ull;
    f.bytes_per_block_full = 18 * 2 * 16 * 8 * 64;
    f.bytes_per_block_sliding = f.bytes_per_block_full;
    f.model_id = 0xfedcba9876543210ull;  // past 2^53: hex text, not a JSON number
    const Json j = kv_format_to_json(f);
    EXPECT_EQ(j["model_id"], "fedcba9876543210");
    auto back = kv_format_from_json(j);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_TRUE(*back == f);
    for (const char* key : {"dtype_id", "block_size", "layer_kinds", "bytes_per_block_full"}) {
        Json missing = j;
        missing.erase(key);
        EXPECT_FALSE(kv_format_from_json(missing).ok()) << key;
        Json negative = j;
        negative[key] = -1;
        EXPECT_FALSE(kv_format_from_json(negative).ok()) << key;
        Json text = j;
        text[key] = "16";
        EXPECT_FALSE(kv_format_from_json(text).ok()) << key;
    }
    for (const Json& bad : {Json("xyz"), Json(""), Json("0123456789abcdef0"), Json(12), Json(nullptr)}) {
        Json m = j;
        m["model_id"] = bad;
        EXPECT_FALSE(kv_format_from_json(m).ok()) << bad;
    }
    Json no_id = j;
    no_id.erase("model_id");
    EXPECT_FALSE(kv_format_from_json(no_id).ok());
    Json big = j;
    big["block_size"] = uint64_t{1} << 40;
    EXPECT_FALSE(kv_format_from_json(big).ok());
    EXPECT_FALSE(kv_format_from_json(Json::array()).ok());
}

// --prefill-url: what httplib would misread is refused at startup. A port past 65535 had wrapped (107719 went to
// 42183), 0 and negatives had been taken, and user:password@, a query or a fragment had made every request fail with
// the password in the log.
TEST(PrefillClientUrl, RefusesWhatItCannotUseAsGiven) {
    for (const char* ok : {"http://127.0.0.1:8001", "http://localhost:1", "http://prefill-0.svc:65535/",
                           "http://10.0.0.2:8000/v2", "http://[::1]:8001", "http://[fe80::1]", "http://h"}) {
        auto c = PrefillClient::create(ok, std::chrono::seconds(5));
        EXPECT_TRUE(c.ok()) << ok << ": " << c.status().to_string();
    }
    for (const char* bad :
         {"http://127.0.0.1:107719", "http://127.0.0.1:99999", "http://127.0.0.1:65536", "http://127.0.0.1:0",
          "http://127.0.0.1:-5", "http://127.0.0.1:", "http://127.0.0.1:80x", "http://127.0.0.1:8000?x=1",
          "http://127.0.0.1:8000/p#frag", "http://h:1 /x", "http://user:pw@127.0.0.1:8000", "http://:8000",
          "http://[::1", "http://[::1]x", "http://[::1]:", "http://ho$t:1", "http://"}) {
        auto c = PrefillClient::create(bad, std::chrono::seconds(5));
        ASSERT_FALSE(c.ok()) << bad;
        EXPECT_EQ(c.status().message().rfind("--prefill-url: ", 0), 0u) << c.status().message();
        EXPECT_EQ(c.status().message().find("pw"), std::string::npos) << c.status().message();
    }
}

TEST_F(DisaggregationTest, DecodeWorkerAnswersAsOneServer) {
    Worker prefill(weights_, true), alone(weights_, false);
    Worker decode(weights_, false, 4, prefill.http->port());
    int64_t fetched = 0, imported = 0;
    for (int i = 0; i < 6; ++i) {
        const int n = std::vector<int>{3, 5, 9, 30, 61, 100}[static_cast<size_t>(i)];
        const std::string body = completion(runtime::testing::random_ids(n, 300, 40 + i), 8, i % 2 ? 7 + i : -1);
        const Answer want = answer(alone.post("/v1/completions", body));
        const Answer got = answer(decode.post("/v1/completions", body));
        EXPECT_EQ(got.logprobs, want.logprobs) << n;
        EXPECT_EQ(got.finish, want.finish) << n;
        const int P = (n - 1) / 4 * 4;  // the whole blocks before the last prompt token
        if (n > 4) {
            ++fetched;
            imported += P;
            EXPECT_EQ(got.cached, P) << n;
        } else {
            EXPECT_EQ(got.cached, 0);
        }
    }
    const EngineStats st = decode.stats();
    EXPECT_EQ(st.remote_prefills, fetched);
    EXPECT_EQ(st.remote_prefill_failures, 0);
    EXPECT_EQ(st.kv_imported_tokens, imported);
    EXPECT_EQ(prefill.stats().kv_exported_tokens, imported);
    // Every block's full-layer KV, and some sliding-window blocks (at most every block's).
    const runtime::KvFormat f = *decode.engine.kv_format();
    const int64_t blocks = imported / 4;
    EXPECT_GE(st.remote_prefill_bytes, blocks * static_cast<int64_t>(f.bytes_per_block_full));
    EXPECT_LE(st.remote_prefill_bytes,
              blocks * static_cast<int64_t>(f.bytes_per_block_full + f.bytes_per_block_sliding));
    EXPECT_GT(st.remote_prefill_seconds, 0.0);
    httplib::Client c("127.0.0.1", decode.http->port());
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("gptoss_kv_imported_tokens_total " + std::to_string(imported)), std::string::npos);
}

// A prompt the decode worker's own cache mostly holds (a conversation's next turn) is computed there without a
// fetch; one sharing only a short start with the cache is still fetched. Answers as one server's either way.
TEST_F(DisaggregationTest, MostlyCachedPromptsAreNotFetched) {
    Worker prefill(weights_, true), alone(weights_, false);
    Worker decode(weights_, false, 4, prefill.http->port());
    const std::vector<int32_t> first = runtime::testing::random_ids(40, 300, 60);
    std::vector<int32_t> next = first;
    for (int32_t id : {7, 8, 9}) next.push_back(id);
    std::vector<int32_t> other(first.begin(), first.begin() + 8);
    for (int32_t id : runtime::testing::random_ids(40, 300, 61)) other.push_back(id);
    int turn = 0;
    for (const auto& prompt : {first, next, other}) {
        const std::string body = completion(prompt, 5, -1);
        const Answer want = answer(alone.post("/v1/completions", body));
        const Answer got = answer(decode.post("/v1/completions", body));
        EXPECT_EQ(got.logprobs, want.logprobs) << turn;
        const EngineStats st = decode.stats();
        if (turn == 0) {
            EXPECT_EQ(got.cached, 36);  // imported
        }
        if (turn == 1) {
            EXPECT_EQ(got.cached, 40);  // the first turn's blocks, here already
            EXPECT_EQ(st.remote_prefills, 1);
            EXPECT_EQ(st.remote_prefills_skipped, 1);
        }
        if (turn == 2) {
            EXPECT_EQ(got.cached, 44);  // 8 cached + the rest imported
            EXPECT_EQ(st.remote_prefills, 2);
            EXPECT_EQ(st.remote_prefills_skipped, 1);
        }
        EXPECT_EQ(st.remote_prefill_failures, 0);
        ++turn;
    }
    httplib::Client c("127.0.0.1", decode.http->port());
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("gptoss_remote_prefills_skipped_total 1"), std::string::npos);
}

TEST_F(DisaggregationTest, PrefillWorkerDownOrOfAnotherFormatCostsTimeNotAnswers) {
    Worker alone(weights_, false);
    const std::string body = completion(runtime::testing::random_ids(40, 300, 3), 6, -1);
    const Answer want = answer(alone.post("/v1/completions", body));
    {
        // A port nobody listens on: the prompt is computed on the decode worker.
        int port = 0;
        {
            Worker gone(weights_, true);
            port = gone.http->port();
        }
        Worker decode(weights_, false, 4, port);
        const Answer got = answer(decode.post("/v1/completions", body));
        EXPECT_EQ(got.logprobs, want.logprobs);
        EXPECT_EQ(got.cached, 0);
        EXPECT_EQ(decode.stats().remote_prefill_failures, 1);
        EXPECT_EQ(decode.stats().remote_prefills, 0);
    }
    {
        // Blocks of 8 at the prefill worker, of 4 here: refused there (409) before any work, computed here.
        Worker eight(weights_, true, 8);
        Worker decode(weights_, false, 4, eight.http->port());
        const Answer got = answer(decode.post("/v1/completions", body));
        EXPECT_EQ(got.logprobs, want.logprobs);
        EXPECT_EQ(decode.stats().remote_prefill_failures, 1);
        EXPECT_EQ(eight.stats().kv_exported_tokens, 0);
        Json fmt = kv_format_to_json(*decode.engine.kv_format());
        Json req = Json::object();
        req["prompt_token_ids"] = runtime::testing::random_ids(20, 300, 1);
        req["kv_format"] = fmt;
        Json e = expect_error(eight.post("/v1/kv/prefill", dump_json(req)), 409);
        EXPECT_NE(e["message"].get<std::string>().find("block 4"), std::string::npos) << e;
    }
    {
        // A prefill worker on another checkpoint of the same shapes (another seed): the shapes agree, the KV would
        // not (its answer had been taken and gave other tokens without an error). Refused there by the model
        // fingerprint (KvFormat::model_id), computed here.
        std::string other_dir;
        auto other =
            runtime::testing::load_random_checkpoint(config(), kSeed + 1, "gptoss_disaggregation_other_", &other_dir);
        ASSERT_TRUE(other);
        {
            Worker foreign(other, true);
            Worker decode(weights_, false, 4, foreign.http->port());
            const Answer got = answer(decode.post("/v1/completions", body));
            EXPECT_EQ(got.logprobs, want.logprobs);
            EXPECT_EQ(got.cached, 0);
            EXPECT_EQ(decode.stats().remote_prefill_failures, 1);
            EXPECT_EQ(decode.stats().remote_prefills, 0);
            EXPECT_EQ(foreign.stats().kv_exported_tokens, 0);
            Json req = Json::object();
            req["prompt_token_ids"] = runtime::testing::random_ids(20, 300, 1);
            req["kv_format"] = kv_format_to_json(*decode.engine.kv_format());
            Json e = expect_error(foreign.post("/v1/kv/prefill", dump_json(req)), 409);
            EXPECT_NE(e["message"].get<std::string>().find("model "), std::string::npos) << e;
        }
        other.reset();
        runtime::testing::remove_checkpoint(other_dir);
    }
}

TEST_F(DisaggregationTest, KvPrefillRouteRefusesBadInput) {
    Worker prefill(weights_, true), plain(weights_, false);
    expect_error(plain.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,2,3,4,5,6]})"), 404);
    expect_error(prefill.post("/v1/kv/prefill", "{"), 400);
    expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[]})"), 400);
    expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,"a"]})"), 400);
    expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,-2,3,4,5,6]})"), 400);
    expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,2,3,4,5,201088]})"), 400);
    Json shorter = expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,2,3,4]})"), 400);
    EXPECT_NE(shorter["message"].get<std::string>().find("no whole KV block"), std::string::npos) << shorter;
    expect_error(prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[1,2,3,4,5,6],"kv_format":{"dtype_id":9}})"),
                 400);
    auto get = httplib::Client("127.0.0.1", prefill.http->port()).Get("/v1/kv/prefill");
    ASSERT_TRUE(get);
    EXPECT_EQ(get->status, 405);
    // A good one: a KV transfer of the 4 whole blocks before the last token, in the worker's format.
    auto ok = prefill.post("/v1/kv/prefill", R"({"prompt_token_ids":[5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21]})");
    ASSERT_TRUE(ok);
    ASSERT_EQ(ok->status, 200);
    EXPECT_EQ(ok->get_header_value("Content-Type"), "application/octet-stream");
    auto t = runtime::parse_kv_transfer(ok->body);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->tokens.size(), 16u);
    EXPECT_TRUE(t->format == *prefill.engine.kv_format());
    EXPECT_TRUE(runtime::check_kv_transfer(*t, t->format).ok());
}

// A request cancelled while its KV is being fetched never reaches the local engine; one cancelled after leaves
// nothing running either.
TEST_F(DisaggregationTest, CancelWhileFetchingLeavesNothingBehind) {
    Worker local(weights_, false);
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    std::atomic<int> calls{0};
    DisaggregatedEngine d(local.engine,
                          [&](const std::vector<int32_t>&, const runtime::KvFormat&, int,
                              FetchCancel&) -> StatusOr<std::shared_ptr<const runtime::KvTransfer>> {
                              ++calls;
                              std::unique_lock<std::mutex> lock(mu);
                              cv.wait(lock, [&] { return release; });
                              return failed_precondition("no prefill worker in this test");
                          });
    EngineRequest r;
    r.prompt = runtime::testing::random_ids(30, 300, 8);
    r.max_tokens = 4;
    auto id = d.submit(r);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    while (calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<EngineEvent> events;
    EXPECT_FALSE(d.next_events(*id, &events, std::chrono::milliseconds(20)));  // still fetching
    EXPECT_EQ(d.stats().waiting_requests, 1);
    EXPECT_GT(d.last_progress(*id).time_since_epoch().count(), 0);  // a fetch is not a stall
    d.cancel(*id);
    auto second = d.submit(r);  // this one completes once the fetch fails
    ASSERT_TRUE(second.ok());
    {
        std::lock_guard<std::mutex> lock(mu);
        release = true;
    }
    cv.notify_all();
    events.clear();
    bool final = false;
    for (int i = 0; i < 200 && !final; ++i) {
        d.next_events(*second, &events, std::chrono::milliseconds(100));
        final = !events.empty() && events.back().finish != FinishReason::kNone;
    }
    ASSERT_TRUE(final);
    EXPECT_EQ(events.back().finish, FinishReason::kLength);
    d.cancel(*second);
    EXPECT_FALSE(d.next_events(*id, &events, std::chrono::milliseconds(10)));
    for (int i = 0; i < 200 && local.engine.stats().running_sequences + local.engine.stats().waiting_requests > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const EngineStats st = d.stats();
    EXPECT_EQ(st.running_sequences, 0);
    EXPECT_EQ(st.waiting_requests, 0);
    EXPECT_EQ(st.kv_blocks_in_use, 0);
    EXPECT_EQ(st.remote_prefill_failures, 1);  // the cancelled one was never submitted
    // Invalid requests are refused at once, without a fetch.
    EngineRequest bad = r;
    bad.prompt.push_back(201088);
    auto refused = d.submit(bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(calls.load(), 2);
}

// Queued fetches start in (priority, arrival) order, and each fetch is given its request's priority (for the
// prefill worker's scheduler): with one fetch thread busy, a later request of a lower priority value goes first.
TEST_F(DisaggregationTest, FetchesStartInPriorityOrder) {
    Worker local(weights_, false);
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    std::vector<int> order;
    DisaggregationOptions options;
    options.fetch_threads = 1;
    DisaggregatedEngine d(
        local.engine,
        [&](const std::vector<int32_t>&, const runtime::KvFormat&, int priority,
            FetchCancel&) -> StatusOr<std::shared_ptr<const runtime::KvTransfer>> {
            std::unique_lock<std::mutex> lock(mu);
            order.push_back(priority);
            cv.notify_all();
            cv.wait(lock, [&] { return release; });
            return failed_precondition("no prefill worker in this test");
        },
        options);
    std::vector<RequestId> ids;
    for (int priority : {0, 5, 1, -2, 5}) {
        EngineRequest r;
        // (Prompts of their own: one computed here would be found in the local cache, and not fetched again.)
        r.prompt = runtime::testing::random_ids(30, 300, 20 + static_cast<uint32_t>(ids.size()));
        r.max_tokens = 1;
        r.priority = priority;
        auto id = d.submit(r);
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        ids.push_back(*id);
        if (ids.size() == 1) {  // the first occupies the fetch thread before the rest arrive
            std::unique_lock<std::mutex> lock(mu);
            cv.wait(lock, [&] { return !order.empty(); });
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu);
        release = true;
    }
    cv.notify_all();
    std::vector<EngineEvent> events;
    for (RequestId id : ids) {
        bool final = false;
        for (int i = 0; i < 300 && !final; ++i) {
            events.clear();
            d.next_events(id, &events, std::chrono::milliseconds(100));
            final = !events.empty() && events.back().finish != FinishReason::kNone;
        }
        EXPECT_TRUE(final);
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, -2, 1, 5, 5}));
}

// Cancelling a request whose KV is on the way closes the fetch's connection, so the prefill worker (which drops a
// prompt whose client left) stops computing it: the call had run on until the answer or --prefill-timeout, and
// connections to a hung worker piled up. A stand-in worker reads the request and never answers; it must see the
// close soon after the cancel (the call's own timeout is 60 s).
TEST_F(DisaggregationTest, CancelClosesTheFetchConnection) {
    int fd = -1, port = 0;
    ASSERT_NO_FATAL_FAILURE(listen_loopback(&fd, &port));
    std::atomic<bool> got_request{false}, closed{false};
    std::thread worker([&] {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        std::string in;
        for (;;) {  // the request, then nothing but waiting for the client to go
            const ssize_t n = ::recv(c, buf, sizeof buf, 0);
            if (n <= 0) break;
            in.append(buf, static_cast<size_t>(n));
            if (in.find("prompt_token_ids") != std::string::npos) got_request = true;
        }
        closed = true;
        ::close(c);
    });
    auto client = PrefillClient::create("http://127.0.0.1:" + std::to_string(port), std::chrono::seconds(60));
    ASSERT_TRUE(client.ok());
    Worker local(weights_, false);
    {
        DisaggregatedEngine d(
            local.engine,
            [&](const std::vector<int32_t>& p, const runtime::KvFormat& f, int priority, FetchCancel& cancel) {
                return (*client)->prefill(p, f, priority, &cancel);
            },
            {}, [&] { (*client)->stop(); });
        EngineRequest r;
        r.prompt = runtime::testing::random_ids(30, 300, 8);
        r.max_tokens = 2;
        auto id = d.submit(r);
        ASSERT_TRUE(id.ok());
        for (int i = 0; i < 500 && !got_request; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ASSERT_TRUE(got_request);
        const auto t0 = std::chrono::steady_clock::now();
        d.cancel(*id);
        for (int i = 0; i < 500 && !closed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_TRUE(closed) << "the fetch's connection stayed open after the cancel";
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
        for (int i = 0; i < 300 && d.stats().remote_prefill_failures + d.stats().remote_prefills == 0 &&
                        local.engine.stats().waiting_requests + local.engine.stats().running_sequences > 0;
             ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(local.engine.stats().running_sequences, 0);  // the cancelled request never ran here
        EXPECT_EQ(local.engine.stats().waiting_requests, 0);
    }
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    worker.join();
}

// Shutdown does not wait for a prefill worker that never answers: the destructor stops the call in flight (a
// listening socket that accepts nothing stands in for the worker; the call's own timeout is 60 s).
TEST_F(DisaggregationTest, ShutdownInterruptsAFetchInFlight) {
    int fd = -1, port = 0;
    ASSERT_NO_FATAL_FAILURE(listen_loopback(&fd, &port));
    auto client = PrefillClient::create("http://127.0.0.1:" + std::to_string(port), std::chrono::seconds(60));
    ASSERT_TRUE(client.ok());
    Worker local(weights_, false);
    std::atomic<int> calls{0};
    auto started = std::chrono::steady_clock::now();
    {
        DisaggregatedEngine d(
            local.engine,
            [&](const std::vector<int32_t>& p, const runtime::KvFormat& f, int, FetchCancel&) {
                ++calls;
                return (*client)->prefill(p, f);
            },
            {}, [&] { (*client)->stop(); });
        EngineRequest r;
        r.prompt = runtime::testing::random_ids(30, 300, 8);
        r.max_tokens = 2;
        ASSERT_TRUE(d.submit(r).ok());
        while (calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the call is sent and waits for an answer
        started = std::chrono::steady_clock::now();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
    EXPECT_FALSE((*client)->prefill({1, 2, 3}, *local.engine.kv_format()).ok());  // stopped: refused at once
    ::close(fd);
}

// PrefillClient against a stand-in prefill worker (a plain HTTP server) that answers what a real one would, in small
// writes, or what a broken one might: the good answer arrives whole; a wrong, truncated, longer-than-possible or error
// answer is a clear error, never a crash.
TEST_F(DisaggregationTest, PrefillClientReadsAnswersAsTheyArrive) {
    Worker prefill(weights_, true);
    const std::vector<int32_t> prompt = runtime::testing::random_ids(21, 300, 4);
    const runtime::KvFormat format = *prefill.engine.kv_format();
    Json req = Json::object();
    req["prompt_token_ids"] = prompt;
    auto real = prefill.post("/v1/kv/prefill", dump_json(req));
    ASSERT_TRUE(real);
    ASSERT_EQ(real->status, 200);
    const std::string good = real->body;
    std::string answer = good;
    int status = 200;
    httplib::Server fake;
    fake.Post("/v1/kv/prefill", [&](const httplib::Request&, httplib::Response& res) {
        res.status = status;
        auto body = std::make_shared<std::string>(answer);
        res.set_content_provider(body->size(), status == 200 ? "application/octet-stream" : "application/json",
                                 [body](size_t offset, size_t, httplib::DataSink& sink) {
                                     return sink.write(body->data() + offset,
                                                       std::min<size_t>(1000, body->size() - offset));
                                 });
    });
    const int port = fake.bind_to_any_port("127.0.0.1");
    std::thread th([&] { fake.listen_after_bind(); });
    while (!fake.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto client = PrefillClient::create("http://127.0.0.1:" + std::to_string(port), std::chrono::seconds(30));
    ASSERT_TRUE(client.ok());
    auto got = (*client)->prefill(prompt, format);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    auto want = runtime::parse_kv_transfer(good);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ((*got)->tokens, want->tokens);
    EXPECT_EQ((*got)->full, want->full);
    EXPECT_EQ((*got)->sliding, want->sliding);
    auto expect_refused = [&](const std::string& words) {
        auto r = (*client)->prefill(prompt, format);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    };
    answer = good.substr(0, good.size() - 7);
    expect_refused("header describes");
    answer = good + std::string(1 << 20, 'x');  // more than the transfer of this prompt can be
    expect_refused("more bytes than the header describes");
    answer = "not a transfer at all, but long enough to hold a header of seventy-six bytes ........";
    expect_refused("GPTOSSKV");
    answer = good;
    answer[28] = 99;  // the hidden size: another format than the one asked for
    expect_refused("format");
    status = 500;
    answer = R"({"error":{"message":"out of memory"}})";
    expect_refused("answered 500: {\"error\":{\"message\":\"out of memory\"}}");
    fake.stop();
    th.join();
}

}  // namespace
}  // namespace gptoss::server::testing
