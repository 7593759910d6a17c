// gptoss bench-cpu --model DIR [--concurrency 1,4,16] [--prompt-len 32] [--max-tokens 32]
//                  [--temperature 0] [--repeats 1] [--json]
// Total throughput of the token engine on the CPU backend: for each concurrency C, C requests with
// distinct random prompts are submitted at once (EOS ignored, so each generates exactly
// --max-tokens) and timed from the first submission to the last token. Prints a Markdown table
// (or JSON lines): generated tok/s is the headline; total tok/s also counts the prompt tokens.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/engine.h"

namespace gptoss::cli {
namespace {

struct BenchCpuOptions {
    std::string model;
    std::string concurrency = "1,4,16";
    int prompt_len = 32;
    int max_tokens = 32;
    float temperature = 0.0f;
    int repeats = 1;
    int max_batched_tokens = 512;
    int block_size = 16;
    bool json_output = false;
};

struct Run {
    double wall_s = 0;
    double mean_ttft_s = 0;
    int64_t prompt_tokens = 0;
    int64_t generated = 0;
    int64_t steps = 0;
};

StatusOr<Run> run_once(std::shared_ptr<const model::GptOssWeights> weights, const BenchCpuOptions& o, int concurrency,
                       uint32_t seed) {
    const int V = weights->config.vocab_size;
    runtime::EngineConfig ec;
    ec.block_size = o.block_size;
    ec.enable_prefix_caching = false;  // distinct prompts anyway; measure the plain path
    ec.scheduler = runtime::SchedulerConfig{.max_num_seqs = std::max(concurrency, 1),
                                            .max_num_batched_tokens = o.max_batched_tokens};
    const int per_seq = (o.prompt_len + o.max_tokens + o.block_size - 1) / o.block_size + 1;
    const int window = weights->config.sliding_window;
    ec.kv_budget = runtime::KvBudget{
        .num_blocks_full = concurrency * per_seq,
        .num_blocks_sliding = concurrency * (per_seq + 2) + (window + o.max_batched_tokens) / o.block_size + 2};
    ASSIGN_OR_RETURN(auto engine,
                     runtime::Engine::create(std::make_unique<runtime::CpuModelRunner>(weights), std::move(ec)));
    std::mt19937 rng(seed);
    std::vector<runtime::Request> reqs(static_cast<size_t>(concurrency));
    for (runtime::Request& r : reqs) {
        r.prompt.resize(static_cast<size_t>(o.prompt_len));
        for (int32_t& id : r.prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
        r.max_tokens = o.max_tokens;
        r.sampling.temperature = o.temperature;
        r.sampling.seed = rng();
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<runtime::RequestHandle> handles;
    for (runtime::Request& r : reqs) {
        ASSIGN_OR_RETURN(runtime::RequestHandle h, engine->submit(std::move(r)));
        handles.push_back(std::move(h));
    }
    Run run;
    std::chrono::steady_clock::time_point last = t0;
    for (runtime::RequestHandle& h : handles) {
        bool first = true;
        while (auto ev = h.next()) {
            if (ev->id >= 0) {
                ++run.generated;
                if (first) run.mean_ttft_s += std::chrono::duration<double>(ev->time - t0).count();
                first = false;
                last = std::max(last, ev->time);
            }
            if (ev->is_final()) {
                if (ev->finish_reason != runtime::FinishReason::kLength)
                    return internal_error(std::string("a request ended with ") +
                                          runtime::finish_reason_name(*ev->finish_reason) + " " + ev->error);
                run.prompt_tokens += ev->num_prompt_tokens;
                break;
            }
        }
    }
    run.wall_s = std::chrono::duration<double>(last - t0).count();
    run.mean_ttft_s /= concurrency;
    engine->wait_idle(std::chrono::milliseconds(10000));
    run.steps = engine->stats().num_steps;
    return run;
}

int run_bench_cpu(const BenchCpuOptions& o) {
    auto conc = parse_id_list(o.concurrency);
    if (!conc.ok()) return fail("--concurrency: " + conc.status().message());
    if (o.prompt_len <= 0 || o.max_tokens <= 0 || o.repeats <= 0)
        return fail("--prompt-len, --max-tokens and --repeats must be positive");
    auto loaded = model::GptOssWeights::load(o.model);
    if (!loaded.ok()) return fail(loaded.status().message());
    std::shared_ptr<const model::GptOssWeights> weights(std::move(*loaded));

    // Warm-up: page the weights in and start the thread pool.
    if (auto w = run_once(weights, o, 1, 0); !w.ok()) return fail(w.status().message());
    if (!o.json_output) {
        std::cout << "| concurrency | prompt tok | generated tok | wall s | generated tok/s | total tok/s | "
                     "mean TTFT s | steps |\n|---|---|---|---|---|---|---|---|\n";
    }
    for (int32_t c : *conc) {
        if (c <= 0) return fail("--concurrency values must be positive");
        Run best;
        for (int r = 0; r < o.repeats; ++r) {
            auto run = run_once(weights, o, c, static_cast<uint32_t>(1000 * c + r));
            if (!run.ok()) return fail(run.status().message());
            if (r == 0 || run->wall_s < best.wall_s) best = *run;  // best of the repeats
        }
        const double gen_tps = best.generated / best.wall_s;
        const double total_tps = (best.generated + best.prompt_tokens) / best.wall_s;
        if (o.json_output) {
            nlohmann::json j = {{"concurrency", c},
                                {"prompt_tokens", best.prompt_tokens},
                                {"generated_tokens", best.generated},
                                {"wall_s", best.wall_s},
                                {"generated_tok_per_s", gen_tps},
                                {"total_tok_per_s", total_tps},
                                {"mean_ttft_s", best.mean_ttft_s},
                                {"steps", best.steps}};
            std::cout << j.dump() << "\n";
        } else {
            char line[256];
            std::snprintf(line, sizeof(line), "| %d | %lld | %lld | %.3f | %.1f | %.1f | %.3f | %lld |\n", c,
                          static_cast<long long>(best.prompt_tokens), static_cast<long long>(best.generated),
                          best.wall_s, gen_tps, total_tps, best.mean_ttft_s, static_cast<long long>(best.steps));
            std::cout << line << std::flush;
        }
    }
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<BenchCpuOptions>();
    auto* sub = app.add_subcommand("bench-cpu", "Total tok/s of the token engine on the CPU backend by concurrency");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required();
    sub->add_option("--concurrency", o->concurrency, "Comma-separated request counts")->capture_default_str();
    sub->add_option("--prompt-len", o->prompt_len, "Prompt tokens per request")->capture_default_str();
    sub->add_option("--max-tokens", o->max_tokens, "Generated tokens per request")->capture_default_str();
    sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--repeats", o->repeats, "Runs per concurrency (the fastest is reported)")->capture_default_str();
    sub->add_option("--max-batched-tokens", o->max_batched_tokens, "Token budget of one engine step")
        ->capture_default_str();
    sub->add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
    sub->add_flag("--json", o->json_output, "JSON lines instead of a Markdown table");
    sub->callback([o, &exit_code] { exit_code = run_bench_cpu(*o); });
});

}  // namespace
}  // namespace gptoss::cli
