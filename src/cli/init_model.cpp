// gptoss init-model --preset tiny|gpt-oss-20b|gpt-oss-120b --out DIR [--seed S]
#include <charconv>
#include <filesystem>

#include "cli/command.h"
#include "model/random_checkpoint.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

struct InitModelOptions {
    std::string preset = "tiny";
    std::string out;
    uint64_t seed = 0;
    double shard_gb = 0;
};

int run_init_model(const InitModelOptions& o) {
    auto config = model::GptOssConfig::preset(o.preset);
    if (!config.ok()) return fail(config.status().message());
    if (!(o.shard_gb >= 0.0 && o.shard_gb <= 1e6))  // (NaN too)
        return fail("--shard-gb must be a size in GB, or 0 for the preset's default; got " +
                    std::to_string(o.shard_gb));
    model::RandomCheckpointOptions opt;
    opt.seed = o.seed;
    // Full-size presets are sharded like the published checkpoints (about 5 GB a file).
    double shard_gb = o.shard_gb > 0 ? o.shard_gb : (o.preset == "tiny" ? 0.0 : 5.0);
    opt.max_shard_bytes = static_cast<uint64_t>(shard_gb * 1e9);
    Status st = model::write_random_checkpoint(*config, o.out, opt);
    if (!st.ok()) return fail(st.message());
    // A model directory carries its tokenizer when the vocabulary is the real one.
    if (config->vocab_size == 201088) {
        if (auto tok = tokenizer::find_tokenizer_file(""); tok) {
            std::error_code ec;
            std::filesystem::copy_file(*tok, o.out + "/tokenizer.json",
                                       std::filesystem::copy_options::overwrite_existing, ec);
            if (ec) return fail("cannot copy tokenizer.json into " + o.out + ": " + ec.message());
        }
    }
    std::fprintf(stderr, "wrote %s (%s, seed %llu)\n", o.out.c_str(), o.preset.c_str(),
                 static_cast<unsigned long long>(o.seed));
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<InitModelOptions>();
    auto* sub = app.add_subcommand("init-model", "Write a random gpt-oss checkpoint in the published layout");
    sub->add_option("--preset", o->preset, "tiny, gpt-oss-20b or gpt-oss-120b")
        ->check(CLI::IsMember({"tiny", "gpt-oss-20b", "gpt-oss-120b"}))
        ->capture_default_str();
    sub->add_option("--out", o->out, "Output directory")->required()->check(non_empty_path);
    sub->add_option("--seed", o->seed, "Random seed (0 to 2^64 - 1)")
        ->capture_default_str()
        ->check([](const std::string& text) {
            // (CLI11 saturated a larger number to 2^64 - 1 silently.)
            uint64_t v = 0;
            const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            if (!text.empty() && text[0] == '-') return std::string("the seed must be 0 or more");
            if (ec == std::errc::result_out_of_range) return std::string("the seed must be at most 2^64 - 1");
            if (ec != std::errc() || ptr != text.data() + text.size())
                return std::string("the seed must be a whole number");
            return std::string();
        });
    sub->add_option("--shard-gb", o->shard_gb, "Shard size in GB (default: 5 for full-size presets)");
    sub->callback([o, &exit_code] { exit_code = run_init_model(*o); });
});

}  // namespace
}  // namespace gptoss::cli
