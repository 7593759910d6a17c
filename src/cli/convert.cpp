// gptoss convert --model DIR --to fp8 --out DIR2 [--dense]
// Experts (MXFP4 or bf16) -> FP8 e4m3 with 128×128 power-of-two block scales (--dense: the attention
// and lm_head weights too), everything else copied; the on-disk format is described in
// src/model/fp8_convert.h.
#include "cli/command.h"
#include "model/fp8_convert.h"

namespace gptoss::cli {
namespace {

struct ConvertOptions {
    std::string model;
    std::string to = "fp8";
    std::string out;
    bool dense = false;
};

int run_convert(const ConvertOptions& o) {
    if (o.to != "fp8") return fail("--to: only fp8 is supported");
    Status st = model::convert_to_fp8(o.model, o.out, o.dense);
    if (!st.ok()) return fail(st.message());
    std::fprintf(stderr, "wrote %s (FP8 experts%s, %s v%d)\n", o.out.c_str(), o.dense ? ", attention and lm_head" : "",
                 model::kFp8QuantMethod, model::kFp8FormatVersion);
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<ConvertOptions>();
    auto* sub = app.add_subcommand("convert", "Convert a checkpoint's experts to FP8 with 128x128 block scales");
    sub->add_option("--model", o->model, "Source model directory (published MXFP4 or bf16 layout)")
        ->required()
        ->check(non_empty_path);
    sub->add_option("--to", o->to, "Target format: fp8")->capture_default_str();
    sub->add_option("--out", o->out, "Output directory")->required()->check(non_empty_path);
    sub->add_flag("--dense", o->dense, "Also the attention projections and lm_head (lossy: bf16 -> e4m3)");
    sub->callback([o, &exit_code] { exit_code = run_convert(*o); });
});

}  // namespace
}  // namespace gptoss::cli
