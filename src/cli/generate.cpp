// gptoss generate --model DIR (--ids 1,2,3 | --prompt TEXT) [--max-tokens N] [--temperature T]
//                 [--top-p P] [--top-k K] [--min-p P] [--seed S] [--stop TEXT]... [--ignore-eos]
// gptoss generate --model DIR --batch-file F.jsonl [same defaults]
//
// Both go through the token engine (runtime::Engine). A batch file has one request a line,
//   {"ids":[...], "max_tokens":N, "temperature":T, "top_p":P, "seed":S}
// (also "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
// "stop_ids", "stop" (strings), "ignore_eos"; a missing field takes the command-line value).
// Every line is submitted at once; the output has one JSON object a line, in input order:
//   {"ids":[...], "finish_reason":"stop"|"length"}   or   {"error":"..."} for a rejected line.
// Blank lines are skipped. Throughput goes to stderr.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <type_traits>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/speculative_flags.h"
#include "core/logging.h"
#include "parallel/world.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/cuda_model_runner.h"
#include "runtime/engine.h"
#include "server/openai_json.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

using nlohmann::json;

// --batch-file bounds: a line (one request; a 128k-token prompt as ids is ~1 MB) and the number of lines (the
// requests are all held at once).
constexpr size_t kMaxBatchLineBytes = size_t{16} << 20;
constexpr int kMaxBatchLines = 100000;

struct GenerateOptions {
    std::string layout = "tp=1";          // CUDA backend: parallel layout over several GPUs
    bool fp8 = false;                     // CUDA backend: FP8 weights (model::CudaModelOptions::fp8)
    bool fp8_experts = false;             // with fp8: model::CudaModelOptions::fp8_experts
    std::string kv_cache_dtype = "auto";  // fp8 = an e4m3 KV cache (cli::parse_kv_cache_dtype)
    std::string model;
    std::string ids;
    std::string prompt;
    std::string batch_file;
    std::string tokenizer;
    int max_tokens = 16;
    float temperature = 1.0f;
    float top_p = 1.0f;
    int top_k = 0;
    float min_p = 0.0f;
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;
    bool ignore_eos = false;
    std::string backend = "cpu";
    double kv_cache_mb = 0;  // 0: enough for every request at once (at most half the free memory)
    int max_num_seqs = 256;
    int max_batched_tokens = 512;
    int block_size = 16;
    SpeculativeFlags speculative;
};

struct Line {
    int line_number = 0;
    runtime::Request request;
    std::string error;  // set: the line is rejected before submission
};

StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> load_tokenizer(const GenerateOptions& o) {
    std::optional<std::string> path = o.tokenizer.empty() ? tokenizer::find_tokenizer_file(o.model) : o.tokenizer;
    if (!path) return not_found("no tokenizer: none in the model directory and none given with --tokenizer");
    return tokenizer::BpeTokenizer::from_file(*path);
}

// Reads an optional field of a batch line, type-checked.
template <typename T>
Status get_field(const json& j, const char* key, T* out);

// An integer field's value: a JSON integer (not 1.9, not 1e99) in T's range. nlohmann's get<int> converts
// any number without a check (4294967297 became id 1, 1.9 became 1).
template <typename T>
Status get_integer(const json& v, const std::string& what, T* out) {
    static_assert(std::is_integral_v<T>);
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                      : v.is_number_integer()
                          ? (std::is_signed_v<T> ? v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                                       v.get<int64_t>() <= std::numeric_limits<T>::max()
                                                 : v.get<int64_t>() >= 0)
                          : false;
    if (!v.is_number_integer() || !fits)
        return invalid_argument(what + " must be an integer in [" + std::to_string(std::numeric_limits<T>::min()) +
                                ", " + std::to_string(std::numeric_limits<T>::max()) + "], got " + v.dump());
    *out = v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
    return ok_status();
}

template <typename T>
Status get_field(const json& j, const char* key, T* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return ok_status();
    const std::string what = std::string("field \"") + key + "\"";
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        return get_integer(*it, what, out);
    } else if constexpr (std::is_same_v<T, std::vector<int32_t>>) {
        if (!it->is_array()) return invalid_argument(what + " must be an array of integers");
        std::vector<int32_t> v(it->size());
        for (size_t i = 0; i < it->size(); ++i)
            RETURN_IF_ERROR(get_integer((*it)[i], what + "[" + std::to_string(i) + "]", &v[i]));
        *out = std::move(v);
        return ok_status();
    } else {
        try {
            *out = it->get<T>();
        } catch (const json::exception&) {
            return invalid_argument(what + " has the wrong type");
        }
        return ok_status();
    }
}

Status parse_line(const std::string& text, const GenerateOptions& o, const std::vector<int>& eos, Line* line) {
    if (std::string e = server::json_shape_error(text, kCliJsonDepth, kCliJsonMembers, "the line"); !e.empty())
        return invalid_argument(e);
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        return invalid_argument(std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) return invalid_argument("a batch line must be a JSON object");
    runtime::Request& r = line->request;
    if (!j.contains("ids")) return invalid_argument("missing \"ids\"");
    RETURN_IF_ERROR(get_field(j, "ids", &r.prompt));
    r.max_tokens = o.max_tokens;
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.top_k = o.top_k;
    r.sampling.min_p = o.min_p;
    r.sampling.seed = o.seed;
    r.stop_strings = o.stop;
    bool ignore_eos = o.ignore_eos;
    RETURN_IF_ERROR(get_field(j, "max_tokens", &r.max_tokens));
    RETURN_IF_ERROR(get_field(j, "temperature", &r.sampling.temperature));
    RETURN_IF_ERROR(get_field(j, "top_p", &r.sampling.top_p));
    RETURN_IF_ERROR(get_field(j, "top_k", &r.sampling.top_k));
    RETURN_IF_ERROR(get_field(j, "min_p", &r.sampling.min_p));
    RETURN_IF_ERROR(get_field(j, "presence_penalty", &r.sampling.presence_penalty));
    RETURN_IF_ERROR(get_field(j, "frequency_penalty", &r.sampling.frequency_penalty));
    RETURN_IF_ERROR(get_field(j, "repetition_penalty", &r.sampling.repetition_penalty));
    if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
        // As the server reads it: any 64-bit integer, -1 for a random seed.
        if (it->is_number_unsigned()) {
            r.sampling.seed = it->get<uint64_t>();
        } else {
            int64_t seed = 0;
            RETURN_IF_ERROR(get_field(j, "seed", &seed));
            r.sampling.seed = runtime::seed_from_signed(seed);
        }
    }
    RETURN_IF_ERROR(get_field(j, "stop_ids", &r.stop_ids));
    RETURN_IF_ERROR(get_field(j, "stop", &r.stop_strings));
    RETURN_IF_ERROR(get_field(j, "ignore_eos", &ignore_eos));
    if (!ignore_eos) r.stop_ids.insert(r.stop_ids.end(), eos.begin(), eos.end());
    return ok_status();
}

// A KV budget that holds every request at once, capped at half of the free memory.
runtime::KvBudget default_budget(const GenerateOptions& o, const runtime::ModelRunner& runner,
                                 const std::vector<Line>& lines) {
    runtime::KvBudget b;
    if (o.kv_cache_mb > 0) {
        b.bytes = static_cast<size_t>(o.kv_cache_mb * 1024 * 1024);
        return b;
    }
    const runtime::KvGeometry g = runner.kv_geometry(o.block_size);
    int64_t blocks = 0, tokens = 0;
    // A request past the model's context is refused by the engine: sizing for more than the context only
    // allocated memory for it first (a --max-tokens of 2^31 grew the cache for minutes before the refusal).
    const int64_t context = std::max(1, runner.config().max_position_embeddings);
    for (const Line& l : lines) {
        const int64_t n = std::min<int64_t>(
            static_cast<int64_t>(l.request.prompt.size()) + std::max<int64_t>(l.request.max_tokens, 0), context);
        blocks += (n + o.block_size - 1) / o.block_size + 1;
        tokens += n;
    }
    // A step's new tokens sit in the sliding cache beside each window: at most --max-batched-tokens, and never
    // more than the requests hold (a huge --max-batched-tokens sized gigabytes for a two-token prompt).
    const int64_t step_tokens = std::min<int64_t>(o.max_batched_tokens, tokens);
    const int64_t window_blocks = g.sliding_window > 0 ? (g.sliding_window + o.block_size - 1) / o.block_size + 2 : 0;
    const int64_t sliding =
        static_cast<int64_t>(lines.size()) * window_blocks + (step_tokens + o.block_size - 1) / o.block_size + 2;
    const size_t want =
        static_cast<size_t>(blocks) * g.bytes_per_block_full + static_cast<size_t>(sliding) * g.bytes_per_block_sliding;
    const size_t cap = runner.free_memory_bytes() / 2;
    if (want <= cap && blocks < INT32_MAX / 2 && sliding < INT32_MAX / 2) {
        b.num_blocks_full = static_cast<int>(blocks);
        b.num_blocks_sliding = static_cast<int>(sliding);
    } else {
        b.bytes = cap;
    }
    return b;
}

int run_generate(const GenerateOptions& o) {
    const int modes = !o.ids.empty() + !o.prompt.empty() + !o.batch_file.empty();
    if (modes != 1) return fail("give exactly one of --ids, --prompt and --batch-file");
    // (A block of 10^6 tokens took 8 GB and 13 s for a 3-token prompt: every sequence holds at least one.)
    if (o.block_size <= 0 || o.block_size > 1024)
        return fail("--block-size must be 1 to 1024 tokens, got " + std::to_string(o.block_size));
    if (!(o.kv_cache_mb >= 0) || o.kv_cache_mb > 1e9)  // NaN, negative, or past any machine (a PB)
        return fail("--kv-cache-mb must be between 0 (room for every request) and 1e9");
    // The CPU cache is zeroed at once: more than the machine's memory got the process killed.
    if (const size_t ram_mb = physical_memory_mib(); o.backend != "cuda" && ram_mb > 0 && o.kv_cache_mb > ram_mb)
        return fail("--kv-cache-mb " + std::to_string(o.kv_cache_mb) + " is more than this machine's memory (" +
                    std::to_string(ram_mb) + " MiB)");
    if (o.backend != "cpu" && o.backend != "cuda") return fail("unknown backend '" + o.backend + "' (cpu or cuda)");

    auto loaded = model::GptOssWeights::load(o.model);
    if (!loaded.ok()) return fail(loaded.status().message());
    std::shared_ptr<const model::GptOssWeights> weights(std::move(*loaded));
    const model::GptOssConfig& c = weights->config;
    // Stop ids: config.json's eos_token_id and generation_config.json's, as transformers' and vLLM's
    // generate use (the published checkpoints list <|return|>, <|endoftext|> and <|call|> in the latter).
    std::vector<int32_t> eos_ids(c.eos_token_ids.begin(), c.eos_token_ids.end());
    {
        auto gen_eos = model::GptOssConfig::generation_eos_ids(o.model);
        if (!gen_eos.ok()) return fail(gen_eos.status().message());
        for (int id : *gen_eos) {
            if (id < 0 || id >= c.vocab_size)
                return fail("generation_config.json: eos_token_id " + std::to_string(id) +
                            " is outside the vocabulary (" + std::to_string(c.vocab_size) + ")");
            if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) eos_ids.push_back(id);
        }
    }

    // The tokenizer: needed for --prompt and stop strings; used for "text" in single mode if found.
    std::unique_ptr<tokenizer::BpeTokenizer> tok;
    const bool need_tok = !o.prompt.empty() || !o.stop.empty();
    if (need_tok || o.batch_file.empty()) {
        auto t = load_tokenizer(o);
        if (t.ok()) {
            tok = std::move(*t);
        } else if (need_tok) {
            return fail(t.status().message());
        } else {
            // Said, not silently a result without "text" (a tokenizer.json that cannot be read, or none at all).
            LOG_WARN("the output has no \"text\": %s", t.status().message().c_str());
        }
    }

    std::vector<Line> lines;
    bool any_stop_strings = false;
    if (!o.batch_file.empty()) {
        std::error_code ec;
        if (std::filesystem::is_directory(o.batch_file, ec))
            return fail("--batch-file " + o.batch_file + " is a directory, not a JSONL file");
        std::ifstream in(o.batch_file);
        if (!in) return fail("cannot open --batch-file " + o.batch_file);
        std::string text;
        for (int n = 1;; ++n) {
            // Read a line at most kMaxBatchLineBytes long: std::getline grew without bound on a file with no
            // newline (--batch-file /dev/zero).
            text.clear();
            bool got = false, too_long = false;
            for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
                got = true;
                if (c == '\n') break;
                if (text.size() == kMaxBatchLineBytes) {
                    too_long = true;
                    break;
                }
                text.push_back(static_cast<char>(c));
            }
            if (!got) break;
            if (too_long)
                return fail("--batch-file " + o.batch_file + ": line " + std::to_string(n) + " is longer than " +
                            std::to_string(kMaxBatchLineBytes >> 20) + " MiB");
            if (n > kMaxBatchLines)
                return fail("--batch-file " + o.batch_file + " has more than " + std::to_string(kMaxBatchLines) +
                            " lines (split it)");
            if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
            Line line;
            line.line_number = n;
            if (Status st = parse_line(text, o, eos_ids, &line); !st.ok()) {
                line.error = "line " + std::to_string(n) + ": " + st.message();
            }
            any_stop_strings = any_stop_strings || !line.request.stop_strings.empty();
            lines.push_back(std::move(line));
        }
        if (in.bad()) return fail("cannot read --batch-file " + o.batch_file);
        if (lines.empty()) return fail("--batch-file " + o.batch_file + " has no requests (one JSON object a line)");
    } else {
        Line line;
        runtime::Request& r = line.request;
        if (!o.ids.empty()) {
            auto ids = parse_id_list(o.ids);
            if (!ids.ok()) return fail(ids.status().message());
            r.prompt = std::move(*ids);
        } else {
            r.prompt = tok->encode_ordinary(o.prompt);
            if (r.prompt.empty()) return fail("the prompt encodes to no tokens");
        }
        r.max_tokens = o.max_tokens;
        r.sampling = runtime::SamplingParams{
            .temperature = o.temperature, .top_p = o.top_p, .top_k = o.top_k, .min_p = o.min_p, .seed = o.seed};
        r.stop_strings = o.stop;
        if (!o.ignore_eos) r.stop_ids = eos_ids;
        any_stop_strings = !o.stop.empty();
        lines.push_back(std::move(line));
    }
    if (any_stop_strings && !tok) {
        auto t = load_tokenizer(o);
        if (!t.ok()) return fail("stop strings need a tokenizer: " + t.status().message());
        tok = std::move(*t);
    }

    auto spec = resolve_speculative_flags(o.speculative);
    if (!spec.ok()) return fail(spec.status().message());
    std::unique_ptr<runtime::ModelRunner> runner;
    auto layout = parallel::ParallelConfig::parse(o.layout);
    if (!layout.ok()) return fail(layout.status().message());
    if (o.fp8 && o.backend != "cuda") return fail("--fp8 needs --backend cuda");
    if (o.fp8_experts && !o.fp8) return fail("--fp8-experts needs --fp8");
    const auto kv_fp8 = parse_kv_cache_dtype(o.kv_cache_dtype);
    if (!kv_fp8.ok()) return fail(kv_fp8.status().message());
    if (o.backend == "cuda") {
        auto r = runtime::CudaModelRunner::create(
            weights, o.max_num_seqs + runtime::speculative_extra_entries(*spec, o.max_num_seqs), o.max_batched_tokens,
            *layout, o.fp8, *kv_fp8, o.fp8_experts);
        if (!r.ok()) return fail(r.status().message());
        runner = std::move(*r);
    } else {
        runner = std::make_unique<runtime::CpuModelRunner>(weights, *layout, *kv_fp8);  // ranks as threads
    }
    runtime::EngineConfig ec;
    ec.speculative = *spec;
    ec.block_size = o.block_size;
    ec.kv_budget = default_budget(o, *runner, lines);
    ec.scheduler =
        runtime::SchedulerConfig{.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.max_batched_tokens};
    if (tok) {
        const tokenizer::BpeTokenizer* t = tok.get();
        // Output ids the tokenizer file does not list (o200k_harmony's reserved ones) add no text; a strict
        // decode failed the whole window, and stop strings across it went unseen.
        ec.detokenizer = [t](std::span<const int32_t> ids) { return t->decode_lossy(ids); };
    }
    auto engine = runtime::Engine::create(std::move(runner), std::move(ec));
    if (!engine.ok()) return fail(engine.status().message());

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::optional<runtime::RequestHandle>> handles(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
        if (!lines[i].error.empty()) continue;
        auto h = (*engine)->submit(lines[i].request);
        if (!h.ok()) {
            lines[i].error = (o.batch_file.empty() ? "" : "line " + std::to_string(lines[i].line_number) + ": ") +
                             h.status().message();
            continue;
        }
        handles[i] = std::move(*h);
    }

    int exit_code = 0;
    int64_t generated = 0, prompt_tokens = 0;
    std::optional<std::chrono::steady_clock::time_point> first_token;
    for (size_t i = 0; i < lines.size(); ++i) {
        json out;
        if (!handles[i]) {
            if (o.batch_file.empty()) return fail(lines[i].error);
            out["error"] = lines[i].error;  // (may quote a line's bytes that are not UTF-8)
            exit_code = 1;
            std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
            continue;
        }
        std::vector<int32_t> ids;
        std::string finish = "error", error;
        int trim = 0;
        while (auto ev = handles[i]->next()) {
            if (ev->id >= 0) {
                if (!first_token) first_token = ev->time;
                ids.push_back(ev->id);
            }
            if (ev->is_final()) {
                finish = runtime::finish_reason_name(*ev->finish_reason);
                error = ev->error;
                trim = ev->trim_bytes;
                break;
            }
        }
        generated += static_cast<int64_t>(ids.size());
        prompt_tokens += static_cast<int64_t>(lines[i].request.prompt.size());
        out["ids"] = ids;
        out["finish_reason"] = finish;
        if (!error.empty()) {
            out["error"] = error;
            exit_code = 1;
        }
        if (o.batch_file.empty()) {
            if (tok) {
                // decode_lossy: a reserved id the tokenizer file does not list dropped the whole "text" field.
                const std::string text = tok->decode_lossy(ids);
                out["text"] = text.substr(0, text.size() - std::min<size_t>(text.size(), trim));
            }
            const auto t2 = std::chrono::steady_clock::now();
            const double prefill_s = std::chrono::duration<double>(first_token.value_or(t2) - t0).count();
            const double decode_s = std::chrono::duration<double>(t2 - first_token.value_or(t2)).count();
            out["timing"] = {{"prompt_tokens", prompt_tokens},
                             {"prefill_s", prefill_s},
                             {"decode_tokens", ids.empty() ? 0 : ids.size() - 1},
                             {"decode_s", decode_s},
                             {"decode_tok_per_s", ids.size() > 1 ? (ids.size() - 1) / decode_s : 0.0}};
            if (o.speculative.config.num_tokens > 0 || !o.speculative.config_json.empty()) {
                (*engine)->wait_idle(std::chrono::seconds(10));  // the last step's counters published
                const runtime::EngineStats st = (*engine)->stats();
                out["timing"]["steps"] = st.num_steps;
                out["timing"]["draft_tokens"] = st.num_draft_tokens;
                out["timing"]["accepted_tokens"] = st.num_accepted_tokens;
            }
        }
        std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    if (!o.batch_file.empty()) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "%zu requests: %lld prompt + %lld generated tokens in %.3f s (%.1f generated tok/s)\n",
                     lines.size(), static_cast<long long>(prompt_tokens), static_cast<long long>(generated), s,
                     generated / s);
    }
    return exit_code;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<GenerateOptions>();
    auto* sub = app.add_subcommand("generate", "Generate tokens through the engine (one prompt or a JSONL batch)");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required()->check(non_empty_path);
    sub->add_option("--ids", o->ids, "Prompt as comma-separated token ids");
    sub->add_option("--prompt", o->prompt, "Prompt text (encoded without special tokens)");
    sub->add_option("--batch-file", o->batch_file, "JSONL requests, all run at once; one JSON result a line");
    sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model's, else the fixture)")
        ->check(non_empty_path);
    sub->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
    sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--top-p", o->top_p, "Nucleus sampling threshold")->capture_default_str();
    sub->add_option("--top-k", o->top_k, "Top-k (0 = off)")->capture_default_str();
    sub->add_option("--min-p", o->min_p, "Min-p (0 = off)")->capture_default_str();
    sub->add_option_function<std::string>(
        "--seed",
        [o](const std::string& text) {
            auto seed = parse_seed(text);
            if (!seed.ok()) throw CLI::ValidationError("--seed", seed.status().message());
            o->seed = *seed;
        },
        "Sampling seed, any 64-bit integer (default or -1: random per request)");
    sub->add_option("--stop", o->stop, "Stop string (repeatable; needs a tokenizer)");
    sub->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's EOS ids");
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
    sub->add_option("--kv-cache-mb", o->kv_cache_mb, "KV cache budget (default: room for every request)");
    sub->add_option("--max-num-seqs", o->max_num_seqs, "Most sequences running at once")->capture_default_str();
    sub->add_option("--max-batched-tokens", o->max_batched_tokens, "Token budget of one engine step")
        ->capture_default_str();
    sub->add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
    add_speculative_flags(sub, &o->speculative);
    sub->callback([o, &exit_code] { exit_code = run_generate(*o); });
});

}  // namespace
}  // namespace gptoss::cli
