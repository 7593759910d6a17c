// Shared fixtures for the server tests: the real tokenizer (the fixture scripts/setup.sh fetches),
// a FakeEngine-backed server on an ephemeral loopback port, and small HTTP/SSE helpers.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "server/fake_engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_json.h"
#include "server/openai_routes.h"
#include "server/request_queue.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::server::testing {

// Loaded once per test binary; nullptr when the fixture is missing.
inline const tokenizer::BpeTokenizer* test_tokenizer() {
    static std::unique_ptr<tokenizer::BpeTokenizer> tok = [] {
        std::unique_ptr<tokenizer::BpeTokenizer> t;
        if (auto path = tokenizer::find_tokenizer_file("")) {
            auto loaded = tokenizer::BpeTokenizer::from_file(*path);
            if (loaded.ok()) t = std::move(*loaded);
        }
        return t;
    }();
    return tok.get();
}

#define REQUIRE_TOKENIZER()                                                                       \
    do {                                                                                          \
        if (!::gptoss::server::testing::test_tokenizer()) GTEST_SKIP() << "no tokenizer fixture"; \
    } while (0)

// Model output written as Harmony text (special tokens spelled literally) -> ids.
inline std::vector<int32_t> harmony_ids(const std::string& text) {
    return test_tokenizer()->encode(text, {}, /*allow_all_special=*/true);
}

struct TestServerOptions {
    FakeEngineOptions engine;
    HttpServerOptions http;
    RoutesOptions routes;
    RequestQueueOptions queue;
};

inline TestServerOptions default_test_options() {
    TestServerOptions o;
    o.http.port = 0;
    o.http.threads = 96;
    o.http.max_body_bytes = 64 * 1024;
    o.http.write_timeout = std::chrono::seconds(5);
    o.routes.model_id = "test-model";
    o.routes.harmony.current_date = "2026-01-01";
    o.routes.keepalive_interval = std::chrono::milliseconds(200);
    return o;
}

// FakeEngine + queue + routes + HTTP server on 127.0.0.1:<ephemeral>.
class TestServer {
public:
    explicit TestServer(TestServerOptions o = default_test_options())
        : engine(o.engine),
          queue(engine, metrics, o.queue),
          routes(queue, *test_tokenizer(), o.routes),
          http(routes, metrics, o.http) {
        Status st = http.start();
        EXPECT_TRUE(st.ok()) << st.to_string();
    }
    ~TestServer() {
        queue.shutdown();
        http.stop();
    }

    httplib::Client client() const {
        httplib::Client c("127.0.0.1", http.port());
        c.set_read_timeout(30, 0);
        return c;
    }

    httplib::Result post(const std::string& path, const std::string& body) const {
        return client().Post(path.c_str(), body, "application/json");
    }
    httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }

    // Waits (up to 20 s) until the engine has no running sequence and no KV block in use.
    bool wait_engine_idle() const {
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

    FakeEngine engine;
    ServerMetrics metrics;
    RequestQueue queue;
    OpenAiRoutes routes;
    HttpServer http;
};

// The data payloads of an SSE body, in order ("[DONE]" included), each with its event name.
struct SseEvent {
    std::string event;
    std::string data;
};
inline std::vector<SseEvent> parse_sse(const std::string& body, std::string* error = nullptr) {
    std::vector<SseEvent> out;
    size_t pos = 0;
    while (pos < body.size()) {
        size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) {
            if (error) *error = "unterminated SSE event at byte " + std::to_string(pos);
            break;
        }
        std::string block = body.substr(pos, end - pos);
        pos = end + 2;
        SseEvent e;
        size_t lp = 0;
        bool any = false;
        while (lp <= block.size()) {
            size_t le = block.find('\n', lp);
            if (le == std::string::npos) le = block.size();
            std::string line = block.substr(lp, le - lp);
            lp = le + 1;
            if (line.empty() || line[0] == ':') continue;  // comment (keep-alive)
            if (line.rfind("event: ", 0) == 0) e.event = line.substr(7);
            if (line.rfind("data: ", 0) == 0) {
                e.data = line.substr(6);
                any = true;
            }
        }
        if (any) out.push_back(std::move(e));
    }
    return out;
}

// A loopback socket to the server with a receive timeout, `bytes` sent; -1 if that failed.
inline int send_raw(int port, const std::string& bytes, int timeout_s) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    timeval tv{timeout_s, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::send(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
        ::close(fd);
        return -1;
    }
    return fd;
}

inline Json parse(const std::string& s) { return Json::parse(s); }

// Checks the OpenAI error shape and returns the error object.
inline Json expect_error(const httplib::Result& res, int status) {
    EXPECT_TRUE(res) << "no response";
    if (!res) return Json();
    EXPECT_EQ(res->status, status) << res->body;
    Json j = Json::parse(res->body, nullptr, false);
    EXPECT_TRUE(j.is_object()) << res->body;
    if (!j.is_object() || !j.contains("error")) {
        ADD_FAILURE() << "no error object: " << res->body;
        return Json();
    }
    const Json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param"));
    EXPECT_TRUE(e.contains("code"));
    return e;
}

}  // namespace gptoss::server::testing
