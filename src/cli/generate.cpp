// gptoss generate --model DIR (--ids 1,2,3 | --prompt TEXT) --max-tokens N [--temperature T]
//                 [--top-p P] [--seed S]
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "model/gpt_oss_forward.h"
#include "runtime/sampler.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

struct GenerateOptions {
    std::string model;
    std::string ids;
    std::string prompt;
    std::string tokenizer;
    int max_tokens = 16;
    float temperature = 1.0f;
    float top_p = 1.0f;
    int top_k = 0;
    std::optional<uint64_t> seed;
    bool ignore_eos = false;
    std::string backend = "cpu";
};

int run_generate(const GenerateOptions& o) {
    if (o.ids.empty() == o.prompt.empty()) return fail("give exactly one of --ids and --prompt");
    if (o.max_tokens <= 0) return fail("--max-tokens must be positive");
    if (o.temperature < 0 || !(o.top_p > 0 && o.top_p <= 1)) return fail("need --temperature >= 0 and 0 < --top-p <= 1");
    if (o.backend != "cpu") return fail("backend '" + o.backend + "' is not available in this build");

    std::unique_ptr<tokenizer::BpeTokenizer> tok;
    std::optional<std::string> tok_path = o.tokenizer.empty() ? tokenizer::find_tokenizer_file(o.model) : o.tokenizer;
    if (tok_path) {
        auto t = tokenizer::BpeTokenizer::from_file(*tok_path);
        if (!t.ok()) return fail(t.status().message());
        tok = std::move(*t);
    }
    std::vector<int32_t> prompt;
    if (!o.ids.empty()) {
        auto ids = parse_id_list(o.ids);
        if (!ids.ok()) return fail(ids.status().message());
        prompt = std::move(*ids);
    } else {
        if (!tok) return fail("--prompt needs a tokenizer: none in the model directory and none given with --tokenizer");
        prompt = tok->encode_ordinary(o.prompt);
        if (prompt.empty()) return fail("the prompt encodes to no tokens");
    }

    auto weights = model::GptOssWeights::load(o.model);
    if (!weights.ok()) return fail(weights.status().message());
    const model::GptOssConfig& c = (*weights)->config;
    const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
    if (total > c.max_position_embeddings) {
        return fail("prompt (" + std::to_string(prompt.size()) + ") + max tokens (" + std::to_string(o.max_tokens) +
                    ") exceed the model's context of " + std::to_string(c.max_position_embeddings));
    }
    runtime::SamplingParams sp;
    sp.temperature = o.temperature;
    sp.top_p = o.top_p;
    sp.top_k = o.top_k;
    const uint64_t seed = o.seed ? *o.seed : std::random_device{}();

    model::SingleSequence seq(**weights, static_cast<int>(total));
    std::vector<float> logits;
    std::vector<int32_t> out;
    std::string finish = "length";
    auto t0 = std::chrono::steady_clock::now();
    Status st = seq.append(prompt, false, &logits);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; st.ok() && i < o.max_tokens; ++i) {
        int32_t next = runtime::sample_token(logits.data(), c.vocab_size, sp, seed, static_cast<uint64_t>(i));
        out.push_back(next);
        if (!o.ignore_eos && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end()) {
            finish = "stop";
            break;
        }
        if (i + 1 == o.max_tokens) break;
        logits.clear();
        st = seq.append(std::span<const int32_t>(&next, 1), false, &logits);
    }
    if (!st.ok()) return fail(st.message());
    auto t2 = std::chrono::steady_clock::now();

    nlohmann::json j;
    j["ids"] = out;
    if (tok) {
        auto text = tok->decode(out);
        if (text.ok()) j["text"] = *text;
    }
    j["finish_reason"] = finish;
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    j["timing"] = {{"prompt_tokens", prompt.size()},
                   {"prefill_s", prefill_s},
                   {"decode_tokens", out.size() > 0 ? out.size() - 1 : 0},
                   {"decode_s", decode_s},
                   {"decode_tok_per_s", out.size() > 1 ? (out.size() - 1) / decode_s : 0.0}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<GenerateOptions>();
    auto* sub = app.add_subcommand("generate", "Generate tokens from a prompt (one sequence)");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required();
    sub->add_option("--ids", o->ids, "Prompt as comma-separated token ids");
    sub->add_option("--prompt", o->prompt, "Prompt text (encoded without special tokens)");
    sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model's, else the fixture)");
    sub->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
    sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--top-p", o->top_p, "Nucleus sampling threshold")->capture_default_str();
    sub->add_option("--top-k", o->top_k, "Top-k (0 = off)")->capture_default_str();
    sub->add_option("--seed", o->seed, "Sampling seed (default: random)");
    sub->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's EOS ids");
    sub->add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
    sub->callback([o, &exit_code] { exit_code = run_generate(*o); });
});

}  // namespace
}  // namespace gptoss::cli
