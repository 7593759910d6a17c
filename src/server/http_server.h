// The HTTP transport (cpp-httplib): routing to OpenAiRoutes, 404/405/413 as OpenAI error objects,
// SSE bodies written from each connection's own worker thread (a slow reader blocks only its own
// connection; the engine side is buffered per request), and a worker pool sized for hundreds of
// concurrent streams. Binds loopback by default.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"
#include "server/metrics.h"
#include "server/openai_routes.h"

namespace gptoss::server {

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;                          // 0: any free port (see port())
    size_t max_body_bytes = size_t{4} << 20;  // larger bodies get 413
    // Worker threads = the most connections served at once (each stream holds one for its life).
    int threads = 512;
    int listen_backlog = 1024;
    std::chrono::seconds read_timeout{30};   // for the request head and body
    std::chrono::seconds write_timeout{30};  // a client that reads nothing for this long is dropped
    int keep_alive_timeout_s = 5;
    // A request's line and headers: at most this many bytes (else 431) arriving within this time (else 408; the
    // read timeout bounds each read, this the whole block: clients that trickle header lines hold a worker no longer).
    size_t max_header_bytes = size_t{64} << 10;
    std::chrono::seconds header_timeout{30};
    // CORS, for browser clients (as vLLM's and llama.cpp's servers by default): every routed answer
    // carries Access-Control-Allow-Origin: cors_origin, and OPTIONS preflights of the known paths get
    // 204 with the allowed methods and headers. "": no CORS headers, OPTIONS gets 405.
    std::string cors_origin = "*";
    // API keys (vLLM's and llama.cpp's --api-key): when any is set, every request but GET/HEAD /health,
    // GET /metrics and CORS preflights must carry one, as `Authorization: Bearer <key>` (OpenAI's clients) or
    // `X-Api-Key: <key>`; others get 401 (OpenAI's invalid_api_key error, `WWW-Authenticate: Bearer`), their body
    // unread. Compared in time independent of where a key differs.
    std::vector<std::string> api_keys;
    // One stderr line an answered request (client address, method, path, HTTP version, status), as uvicorn's access
    // log in vLLM; headers and bodies are never logged.
    bool access_log = false;
};

// A request's field as the access log shows it: at most 512 bytes, printable ASCII as it is, the rest (control
// bytes, a quote, a backslash, bytes past 0x7e) as \xNN, so that no client can end a line or forge one.
std::string log_safe(std::string_view field);

// Whether `authorization` (an Authorization header: "Bearer <key>", the scheme in any case) or `x_api_key` (an
// X-Api-Key header) holds one of `keys`. Empty headers hold none.
bool api_key_accepted(const std::vector<std::string>& keys, std::string_view authorization, std::string_view x_api_key);

class HttpServer {
public:
    // `routes` and `metrics` must outlive the server.
    HttpServer(OpenAiRoutes& routes, ServerMetrics& metrics, HttpServerOptions options);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds the listening socket (port() is known afterwards).
    Status bind();
    int port() const { return port_; }
    // Serves until stop(); call after bind().
    Status listen();
    // bind() + listen() on a background thread (tests).
    Status start();
    // Stops accepting and returns once every worker is done (streams end first: see
    // RequestQueue::shutdown). Idempotent.
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    HttpServerOptions options_;
    int port_ = 0;
    std::atomic<bool> listening_{false};
    std::atomic<bool> stop_requested_{false};
    std::thread thread_;
};

}  // namespace gptoss::server
