// gptoss serve --model DIR [--host 127.0.0.1] [--port 8000] [--backend cpu|cuda] [--max-body-bytes N]
//              [--http-threads N] [--max-in-flight N] [--kv-cache-mb N] [--max-num-seqs N]
//              [--served-model-name NAME] [--tokenizer FILE] [--request-timeout S]
//              [--disaggregation-mode none|prefill|decode] [--prefill-url http://host:port]
// The OpenAI-compatible HTTP server. It listens at once (/health answers 503 while the model loads
// and warms up) and shuts down cleanly on SIGINT/SIGTERM/SIGHUP: open streams end, then the engine.
#include <pthread.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/speculative_flags.h"
#include "harmony/harmony_json.h"
#include "model/gpt_oss_weights.h"
#include "parallel/world.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/cuda_model_runner.h"
#include "runtime/engine.h"
#include "server/disaggregation.h"
#include "server/http_server.h"
#include "server/runtime_engine.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

struct ServeOptions {
    std::string model;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string backend = "cpu";
    std::string layout = "tp=1";
    bool fp8 = false;                     // cuda: FP8 weights (model::CudaModelOptions::fp8)
    bool fp8_experts = false;             // cuda, with fp8: the experts only in FP8 (CudaModelOptions::fp8_experts)
    std::string kv_cache_dtype = "auto";  // fp8 = an e4m3 KV cache (cli::parse_kv_cache_dtype)
    int64_t max_body_bytes = int64_t{4} << 20;  // (signed: -1 is refused, not read as 2^64 - 1)
    std::string cors_origin = "*";
    int http_threads = 512;
    int64_t max_in_flight = 1024;
    std::optional<size_t> kv_cache_mb;  // default: 512 on the CPU; CUDA: by gpu_memory_utilization
    double gpu_memory_utilization = 0.9;
    int max_num_seqs = 256;
    int max_num_batched_tokens = 0;  // 0: 512 on the CPU, 8192 on CUDA (bench serve's settings)
    std::string served_model_name;
    std::string tokenizer;
    int request_timeout_s = 600;
    // The Responses API's stored responses (server/response_store.h): how many, and their budget in MiB.
    int64_t responses_store = 1000;
    int64_t responses_store_mib = 256;
    // Harmony rendering (HARMONY.md §3.1, §5.2, §6.5): the system message's date and cutoff, the
    // content type of historical tool calls, the commentary channel without function tools, and
    // the reasoning's second field name.
    std::string current_date;  // YYYY-MM-DD; empty: today (UTC)
    std::string knowledge_cutoff;
    std::string history_tool_call_content_type = "<|constrain|>json";
    bool drop_commentary_without_tools = false;
    bool reasoning_alias = false;
    SpeculativeFlags speculative;
    // Prefill/decode disaggregation (server/disaggregation.h): none, prefill (serve /v1/kv/prefill) or decode
    // (fetch prompts' KV from --prefill-url).
    std::string disaggregation_mode = "none";
    std::string prefill_url;
    int prefill_min_tokens = 0;
    int prefill_timeout_s = 600;
    // API keys every request but /health and /metrics must carry (HttpServerOptions::api_keys); GPTOSS_API_KEY
    // adds one (keeps it off the process list).
    std::vector<std::string> api_keys;
    int64_t max_model_len = 0;  // 0: the model's context (EngineConfig::max_model_len)
    bool enable_prefix_caching = true;
    std::optional<std::string> seed;  // EngineConfig::seed
    bool disable_access_log = false;
    std::string scheduling_policy = "fcfs";  // or priority (RoutesOptions::priority_scheduling)
};

constexpr int kMaxHttpThreads = 8192;

int run_serve(const ServeOptions& o) {
    if (o.backend != "cpu" && o.backend != "cuda") return fail("unknown backend '" + o.backend + "' (cpu or cuda)");
    if (o.port < 0 || o.port > 65535) return fail("--port must be in [0, 65535]");
    // (each is a thread of its own, started at once: far more than the system allows would hang the start)
    if (o.http_threads < 8 || o.http_threads > kMaxHttpThreads)
        return fail("--http-threads must be in [8, " + std::to_string(kMaxHttpThreads) + "], got " +
                    std::to_string(o.http_threads));
    // (0 answered 413 to every request with a body; a negative timeout ended every request at once)
    if (o.max_body_bytes < 1024 || o.max_body_bytes > (int64_t{1} << 40))
        return fail("--max-body-bytes must be in [1024, 2^40], got " + std::to_string(o.max_body_bytes));
    if (o.request_timeout_s < 1)
        return fail("--request-timeout must be at least 1 second, got " + std::to_string(o.request_timeout_s));
    // 0 started a server that answered 503 to every request.
    if (o.max_in_flight < 1) return fail("--max-in-flight must be at least 1, got " + std::to_string(o.max_in_flight));
    if (o.max_num_seqs < 1) return fail("--max-num-seqs must be at least 1, got " + std::to_string(o.max_num_seqs));
    if (o.max_num_batched_tokens < 0)
        return fail("--max-num-batched-tokens must be at least 1 (0: the backend's default), got " +
                    std::to_string(o.max_num_batched_tokens));
    if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
        return fail("--gpu-memory-utilization must be in (0, 1], got " + std::to_string(o.gpu_memory_utilization));
    auto layout_or = parallel::ParallelConfig::parse(o.layout);
    if (!layout_or.ok()) return fail(layout_or.status().message());
    const parallel::ParallelConfig layout = *layout_or;
    if (o.fp8 && o.backend != "cuda") return fail("--fp8 needs --backend cuda");
    if (o.fp8_experts && !o.fp8) return fail("--fp8-experts needs --fp8");
    const auto kv_fp8_or = parse_kv_cache_dtype(o.kv_cache_dtype);
    if (!kv_fp8_or.ok()) return fail(kv_fp8_or.status().message());
    const bool kv_fp8 = *kv_fp8_or;
    if (!o.current_date.empty() && !harmony::valid_date(o.current_date, true))
        return fail("--current-date must be a date YYYY-MM-DD, got '" + o.current_date + "'");
    if (!o.knowledge_cutoff.empty() && !harmony::valid_date(o.knowledge_cutoff, false))
        return fail("--knowledge-cutoff must be YYYY-MM, got '" + o.knowledge_cutoff + "'");
    if (o.disaggregation_mode != "none" && o.disaggregation_mode != "prefill" && o.disaggregation_mode != "decode")
        return fail("--disaggregation-mode must be none, prefill or decode, got '" + o.disaggregation_mode + "'");
    if ((o.disaggregation_mode == "decode") != !o.prefill_url.empty())
        return fail("--prefill-url and --disaggregation-mode decode go together");
    if (o.disaggregation_mode != "none" && !layout.trivial())
        return fail(
            "--disaggregation-mode needs a model on one GPU or rank (no --layout): KV blocks of a parallel "
            "layout are not exported or imported yet");
    if (o.disaggregation_mode == "decode" && !o.enable_prefix_caching)
        return fail(
            "--disaggregation-mode decode needs prefix caching (the prefill worker's KV enters through the prefix "
            "cache): drop --no-enable-prefix-caching");
    if (o.prefill_min_tokens < 0)
        return fail("--prefill-min-tokens must be at least 0, got " + std::to_string(o.prefill_min_tokens));
    if (o.prefill_timeout_s < 1)
        return fail("--prefill-timeout must be at least 1 second, got " + std::to_string(o.prefill_timeout_s));
    std::vector<std::string> api_keys = o.api_keys;
    if (const char* env = std::getenv("GPTOSS_API_KEY"); env != nullptr && *env != '\0') api_keys.emplace_back(env);
    for (const std::string& k : api_keys) {
        // A header value: visible ASCII, no spaces (a key with a space or a newline could never be sent).
        const bool printable = std::all_of(k.begin(), k.end(), [](char ch) { return ch > ' ' && ch < 0x7f; });
        if (k.empty() || !printable)
            return fail("an API key (--api-key or GPTOSS_API_KEY) must be non-empty printable ASCII without spaces");
    }
    if (o.scheduling_policy != "fcfs" && o.scheduling_policy != "priority")
        return fail("--scheduling-policy must be fcfs or priority, got '" + o.scheduling_policy + "'");
    if (o.max_model_len < 0 || o.max_model_len == 1)
        return fail(
            "--max-model-len must be at least 2 (a prompt token and an output token; 0: the model's context), got " +
            std::to_string(o.max_model_len));
    std::optional<uint64_t> seed;
    if (o.seed) {
        auto parsed = parse_seed(*o.seed);
        if (!parsed.ok()) return fail("--seed: " + parsed.status().message());
        seed = *parsed;
    }
    std::unique_ptr<server::PrefillClient> prefill_client;
    if (!o.prefill_url.empty()) {
        // The prefill worker is asked with this server's first key (deployments give both workers the same).
        auto client = server::PrefillClient::create(o.prefill_url, std::chrono::seconds(o.prefill_timeout_s),
                                                    api_keys.empty() ? std::string() : api_keys.front());
        if (!client.ok()) return fail(client.status().message());
        prefill_client = std::move(*client);
    }
    if (o.history_tool_call_content_type != "" && o.history_tool_call_content_type != "<|constrain|>json" &&
        o.history_tool_call_content_type != "json")
        return fail("--history-tool-call-content-type must be '<|constrain|>json', 'json' or '' (none), got '" +
                    o.history_tool_call_content_type + "'");

    // Block the stop signals in every thread (all are created below, and inherit the mask); one
    // thread waits for them with sigwait, so no handler runs inside a worker.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);  // the terminal gone (an ssh session without nohup): the same clean stop
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    std::optional<std::string> tok_path = o.tokenizer.empty() ? tokenizer::find_tokenizer_file(o.model) : o.tokenizer;
    if (!tok_path) return fail("no tokenizer.json in " + o.model + " and none given with --tokenizer");
    auto tok = tokenizer::BpeTokenizer::from_file(*tok_path);
    if (!tok.ok()) return fail(tok.status().message());

    // The KV cache is allocated when the model loads, on a loader thread: a size no machine can give aborted
    // the process there (std::bad_alloc; -1 wraps to 2^64 - 1) or had it killed for memory.
    if (o.host.empty()) return fail("--host must name an address or a host name (e.g. 127.0.0.1, 0.0.0.0, ::)");
    // A header value: a control byte (a CR or LF above all) made every answer's CORS header invalid (httplib
    // dropped it, silently).
    if (std::any_of(o.cors_origin.begin(), o.cors_origin.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
        return fail("--cors-origin must be printable text (an origin such as https://example.com, or *)");
    const bool cuda = o.backend == "cuda";
    // The default KV cache: 512 MiB on the CPU; on CUDA what --gpu-memory-utilization leaves once the model is
    // loaded (as vLLM sizes it), found in `load` below.
    const std::optional<size_t> kv_cache_mb = o.kv_cache_mb ? o.kv_cache_mb
                                              : cuda        ? std::nullopt
                                                            : std::optional<size_t>(512);
    if (kv_cache_mb && (*kv_cache_mb == 0 || *kv_cache_mb > (size_t{1} << 24)))
        return fail("--kv-cache-mb must be between 1 and 16777216 (16 TiB), got " + std::to_string(*kv_cache_mb));
    if (const size_t ram_mb = physical_memory_mib(); !cuda && ram_mb > 0 && kv_cache_mb.value_or(0) > ram_mb)
        return fail("--kv-cache-mb " + std::to_string(*kv_cache_mb) + " is more than this machine's memory (" +
                    std::to_string(ram_mb) + " MiB)");
    const std::string model_dir = o.model;
    runtime::EngineConfig engine_config;
    if (kv_cache_mb) engine_config.kv_budget = runtime::KvBudget{.bytes = *kv_cache_mb << 20};
    engine_config.scheduler.max_num_seqs = o.max_num_seqs;
    engine_config.max_model_len = o.max_model_len;
    engine_config.enable_prefix_caching = o.enable_prefix_caching;
    engine_config.seed = seed;
    engine_config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens
                                                     : cuda                       ? 8192
                                                                                  : 512;
    auto spec = resolve_speculative_flags(o.speculative);
    if (!spec.ok()) return fail(spec.status().message());
    engine_config.speculative = *spec;
    const bool fp8 = o.fp8, fp8_experts = o.fp8_experts;
    const double utilization = o.gpu_memory_utilization;
    // EngineConfig's default budget is 512 MiB, so whether to size by utilization is this flag, not bytes == 0 (which
    // left every CUDA server at 512 MiB until r59 ran serve on the H200).
    const bool size_by_utilization = !kv_cache_mb;
    // The largest Harmony id the chat endpoints render (<|start|> and its kin, 2000xx): a model whose vocabulary
    // stops below it can answer only token-id completions; said once at load rather than as every request's 400.
    const int32_t harmony_start = (*tok)->special_token_id("<|start|>").value_or(-1);
    auto load = [model_dir, engine_config, cuda, layout, fp8, kv_fp8, fp8_experts, utilization, size_by_utilization,
                 harmony_start]() mutable -> StatusOr<std::unique_ptr<runtime::Engine>> {
        ASSIGN_OR_RETURN(std::unique_ptr<model::GptOssWeights> weights, model::GptOssWeights::load(model_dir));
        if (harmony_start >= weights->config.vocab_size)
            std::fprintf(stderr,
                         "[serve] warning: the tokenizer's Harmony tokens (<|start|> = %d) are outside the model's "
                         "vocabulary (%d): chat and responses requests will be refused; only /v1/completions with "
                         "token ids inside the vocabulary can run\n",
                         harmony_start, weights->config.vocab_size);
        std::shared_ptr<const model::GptOssWeights> shared(std::move(weights));
        std::unique_ptr<runtime::ModelRunner> runner;
        if (cuda) {
            const int seqs =
                engine_config.scheduler.max_num_seqs +
                runtime::speculative_extra_entries(engine_config.speculative, engine_config.scheduler.max_num_seqs);
            ASSIGN_OR_RETURN(
                runner, runtime::CudaModelRunner::create(shared, seqs, engine_config.scheduler.max_num_batched_tokens,
                                                         layout, fp8, kv_fp8, fp8_experts));
        } else {
            runner = std::make_unique<runtime::CpuModelRunner>(shared, layout, kv_fp8);  // ranks as threads
        }
        if (size_by_utilization) {
            engine_config.kv_budget = runtime::KvBudget{};
            ASSIGN_OR_RETURN(
                engine_config.kv_budget.bytes,
                runtime::kv_bytes_for_utilization(runner->free_memory_before_bytes(), runner->free_memory_bytes(),
                                                  runner->total_memory_bytes(), utilization));
            std::fprintf(stderr, "[serve] KV cache: %zu MiB (--gpu-memory-utilization %.2f)\n",
                         engine_config.kv_budget.bytes >> 20, utilization);
        }
        return runtime::Engine::create(std::move(runner), engine_config);
    };

    std::atomic<bool> load_failed{false};
    server::ServerMetrics metrics;
    std::unique_ptr<server::HttpServer> http;
    server::RuntimeEngineAdapter engine;
    // A decode worker puts the prefill worker's KV in front of its engine.
    std::unique_ptr<server::DisaggregatedEngine> decode_worker;
    if (prefill_client) {
        server::DisaggregationOptions d;
        d.min_prompt_tokens = o.prefill_min_tokens;
        decode_worker = std::make_unique<server::DisaggregatedEngine>(
            engine,
            [client = prefill_client.get()](const std::vector<int32_t>& prompt, const runtime::KvFormat& format,
                                            int priority, server::FetchCancel& cancel) {
                return client->prefill(prompt, format, priority, &cancel);
            },
            d, [client = prefill_client.get()] { client->stop(); });
    }

    server::RequestQueueOptions queue_options;
    queue_options.max_in_flight = o.max_in_flight;
    server::RequestQueue queue(decode_worker ? static_cast<server::TokenEngine&>(*decode_worker) : engine, metrics,
                               queue_options);
    server::RoutesOptions routes_options;
    // The directory's name, also when given with a trailing separator ("dir/" normalizes to a path
    // whose filename is empty).
    std::filesystem::path model_path = std::filesystem::path(o.model).lexically_normal();
    if (!model_path.has_filename()) model_path = model_path.parent_path();
    routes_options.model_id = o.served_model_name.empty() ? model_path.filename().string() : o.served_model_name;
    if (routes_options.model_id.empty()) routes_options.model_id = "gpt-oss";
    routes_options.request_timeout = std::chrono::seconds(o.request_timeout_s);
    if (!o.current_date.empty()) routes_options.harmony.current_date = o.current_date;
    if (!o.knowledge_cutoff.empty()) routes_options.harmony.knowledge_cutoff = o.knowledge_cutoff;
    routes_options.harmony.history_tool_call_content_type = o.history_tool_call_content_type;
    routes_options.harmony.drop_commentary_without_tools = o.drop_commentary_without_tools;
    routes_options.reasoning_alias = o.reasoning_alias;
    routes_options.kv_producer = o.disaggregation_mode == "prefill";
    routes_options.priority_scheduling = o.scheduling_policy == "priority";
    routes_options.responses_store_entries = static_cast<size_t>(o.responses_store);
    routes_options.responses_store_bytes = static_cast<size_t>(o.responses_store_mib) << 20;
    server::OpenAiRoutes routes(queue, **tok, routes_options);
    server::HttpServerOptions http_options;
    http_options.host = o.host;
    http_options.port = o.port;
    http_options.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
    http_options.cors_origin = o.cors_origin;
    http_options.threads = o.http_threads;
    http_options.api_keys = api_keys;
    http_options.access_log = !o.disable_access_log;
    http = std::make_unique<server::HttpServer>(routes, metrics, http_options);
    Status st = http->bind();
    if (!st.ok()) return fail(st.message());
    std::fprintf(stderr, "[serve] tokenizer: %s\n", tok_path->c_str());  // the model's, or the fallback found
    std::fprintf(stderr, "[serve] listening on http://%s:%d (model %s, loading)\n", o.host.c_str(), http->port(),
                 routes_options.model_id.c_str());
    if (o.disaggregation_mode == "prefill") std::fprintf(stderr, "[serve] prefill worker: POST /v1/kv/prefill\n");
    if (prefill_client) std::fprintf(stderr, "[serve] decode worker: prompts' KV from %s\n", o.prefill_url.c_str());
    std::fflush(stderr);
    // Load only once the port is ours, so a bind error does not wait for the weights.
    engine.start(load, [&](const Status& st) {
        if (st.ok()) {
            std::fprintf(stderr, "[serve] model loaded and warmed up; ready\n");
            return;
        }
        std::fprintf(stderr, "error: cannot load the model: %s\n", terminal_safe(st.message()).c_str());
        load_failed.store(true);
        kill(getpid(), SIGTERM);  // the signal thread shuts everything down
    });

    std::thread signal_thread([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (sig == SIGINT || !load_failed.load())
            std::fprintf(stderr, "[serve] shutting down%s\n", sig == SIGHUP ? " (SIGHUP)" : "");
        queue.shutdown();  // open streams end with an error event; new requests get 503
        http->stop();
    });
    st = http->listen();
    // listen() returned: either stop() ran (signal), or the server failed; make sure the signal
    // thread finishes too.
    if (!queue.shutting_down()) kill(getpid(), SIGTERM);
    signal_thread.join();
    if (load_failed.load()) return 1;
    if (!st.ok()) return fail(st.message());
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<ServeOptions>();
    auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, responses, completions)");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required()->check(non_empty_path);
    sub->add_option("--host", o->host, "Address to bind (loopback by default)")->capture_default_str();
    sub->add_option("--port", o->port, "Port (0: any free port)")->capture_default_str();
    sub->add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
    sub->add_option("--layout", o->layout, "Parallel layout: tp=2,ep=2,dp=1 (cuda: GPUs; cpu: simulated ranks)")
        ->capture_default_str();
    sub->add_flag("--fp8", o->fp8, "cuda: FP8 block-scaled QKV, O, lm_head and large-batch experts");
    sub->add_flag("--fp8-experts", o->fp8_experts,
                  "cuda, with --fp8 and MXFP4 experts: keep the experts only in FP8 (every batch on the FP8 "
                  "kernels; fits gpt-oss-120b on one H200; decode reads ~2x the bytes)");
    sub->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                    "KV cache auto (bf16), bf16 or fp8 (e4m3, scale 1; cpu: emulated)")
        ->capture_default_str();
    sub->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (bigger: 413)")->capture_default_str();
    sub->add_option("--cors-origin", o->cors_origin,
                    "Access-Control-Allow-Origin for browser clients (\"\": no CORS, OPTIONS gets 405)")
        ->capture_default_str();
    sub->add_option("--http-threads", o->http_threads, "HTTP worker threads = concurrent connections")
        ->capture_default_str();
    sub->add_option("--max-in-flight", o->max_in_flight, "Requests handled at once (more: 503)")->capture_default_str();
    sub->add_option("--kv-cache-mb", o->kv_cache_mb,
                    "KV cache size in MiB (default: 512 on the CPU; CUDA: --gpu-memory-utilization)");
    sub->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                    "cuda without --kv-cache-mb: the share of the GPU's memory the server may hold; the KV cache gets "
                    "what the model leaves of it (vLLM's flag)")
        ->capture_default_str();
    sub->add_option("--max-num-seqs", o->max_num_seqs, "Sequences generated at once")->capture_default_str();
    sub->add_option("--max-num-batched-tokens,--max-batched-tokens", o->max_num_batched_tokens,
                    "Token budget of one engine step (0: 512 on the CPU, 8192 on CUDA)")
        ->capture_default_str();
    sub->add_option("--served-model-name", o->served_model_name, "Model id in the API (default: directory name)")
        ->check([](const std::string& text) {
            return text.empty() ? std::string("an empty name names no model") : std::string();
        });
    sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model's, else the fixture)")
        ->check(non_empty_path);
    sub->add_option("--request-timeout", o->request_timeout_s,
                    "Seconds a request may go without a token (queued or stalled) before it is ended")
        ->capture_default_str();
    sub->add_option("--responses-store", o->responses_store,
                    "Responses API: answers kept for previous_response_id, GET /v1/responses/{id} and background "
                    "(0: none; store is then answered false); the least recently used go first")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
        ->capture_default_str();
    sub->add_option("--responses-store-mib", o->responses_store_mib,
                    "Responses API: the stored answers' budget in MiB (their JSON text's size)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    sub->add_option("--current-date", o->current_date,
                    "Date in the Harmony system message, YYYY-MM-DD (default: today, UTC): pin it for reproducible "
                    "prompts and prefix-cache hits across days");
    sub->add_option("--knowledge-cutoff", o->knowledge_cutoff, "Knowledge cutoff in the system message, YYYY-MM");
    sub->add_option("--history-tool-call-content-type", o->history_tool_call_content_type,
                    "Content type rendered on earlier turns' tool calls: '<|constrain|>json', 'json' or '' (none)")
        ->capture_default_str();
    sub->add_flag("--drop-commentary-without-tools", o->drop_commentary_without_tools,
                  "Declare only the analysis and final channels when a request has no function tools");
    add_speculative_flags(sub, &o->speculative);
    sub->add_option("--disaggregation-mode", o->disaggregation_mode,
                    "Prefill/decode disaggregation: none, prefill (serve POST /v1/kv/prefill to decode workers) or "
                    "decode (take prompts' KV from --prefill-url); both must load the same checkpoint")
        ->capture_default_str();
    sub->add_option("--prefill-url", o->prefill_url, "Decode worker: the prefill worker, http://host:port");
    sub->add_option("--prefill-min-tokens", o->prefill_min_tokens,
                    "Decode worker: prompts of at most this many tokens (not counting what its prefix cache holds) "
                    "are computed here without asking")
        ->capture_default_str();
    sub->add_option("--prefill-timeout", o->prefill_timeout_s,
                    "Decode worker: seconds to wait for the prefill worker (then the prompt is computed here)")
        ->capture_default_str();
    sub->add_flag("--reasoning-field-alias", o->reasoning_alias,
                  "Chat answers repeat reasoning_content as `reasoning` (newer vLLM's field name)");
    sub->add_option("--api-key", o->api_keys,
                    "Require this API key (one or more; also GPTOSS_API_KEY) on every request but /health and "
                    "/metrics, as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>' (vLLM's flag)");
    sub->add_option("--max-model-len", o->max_model_len,
                    "Longest sequence (prompt + output) a request may have (0: the model's context; vLLM's flag)")
        ->capture_default_str();
    sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                  "Reuse the KV of prompt prefixes computed before (default on; vLLM's flags)");
    sub->add_option("--seed", o->seed,
                    "Seed the draws of requests that give none (the same requests in the same order draw the same "
                    "tokens; default: random)");
    sub->add_option("--scheduling-policy", o->scheduling_policy,
                    "fcfs (first come, first served; a request's nonzero priority is refused) or priority (lower "
                    "`priority` first, then arrival; the last preempted first): vLLM's flag")
        ->capture_default_str();
    sub->add_flag("--disable-access-log,--disable-uvicorn-access-log", o->disable_access_log,
                  "No stderr line per answered request (address, method, path, status; vLLM's flag name too)");
    sub->callback([o, &exit_code] { exit_code = run_serve(*o); });
});

}  // namespace
}  // namespace gptoss::cli
