// gptoss logits --model DIR --ids 1,2,3 [--positions last|all] [--backend cpu]
#include <iostream>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "model/gpt_oss_forward.h"

namespace gptoss::cli {
namespace {

struct LogitsOptions {
    std::string model;
    std::string ids;
    std::string positions = "last";
    std::string backend = "cpu";
};

int run_logits(const LogitsOptions& o) {
    auto ids = parse_id_list(o.ids);
    if (!ids.ok()) return fail(ids.status().message());
    if (o.backend != "cpu") return fail("backend '" + o.backend + "' is not available in this build");
    auto weights = model::GptOssWeights::load(o.model);
    if (!weights.ok()) return fail(weights.status().message());
    const bool all = o.positions == "all";
    model::SingleSequence seq(**weights, static_cast<int>(ids->size()));
    std::vector<float> logits;
    if (Status st = seq.append(*ids, all, &logits); !st.ok()) return fail(st.message());
    const int vocab = (*weights)->config.vocab_size;
    const int rows = static_cast<int>(logits.size() / vocab);
    const int first = static_cast<int>(ids->size()) - rows;
    std::string out = "{\"positions\":[";
    for (int r = 0; r < rows; ++r) out += (r ? "," : "") + std::to_string(first + r);
    out += "],\"logits\":[";
    for (int r = 0; r < rows; ++r) {
        out += r ? ",[" : "[";
        for (int v = 0; v < vocab; ++v) {
            if (v) out += ',';
            out += json_float(logits[static_cast<size_t>(r) * vocab + v]);
        }
        out += ']';
    }
    out += "]}\n";
    std::cout << out;
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<LogitsOptions>();
    auto* sub = app.add_subcommand("logits", "Print the logits of a prompt as JSON");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required();
    sub->add_option("--ids", o->ids, "Comma-separated token ids")->required();
    sub->add_option("--positions", o->positions, "last or all")
        ->check(CLI::IsMember({"last", "all"}))
        ->capture_default_str();
    sub->add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
    sub->callback([o, &exit_code] { exit_code = run_logits(*o); });
});

}  // namespace
}  // namespace gptoss::cli
