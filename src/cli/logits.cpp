// gptoss logits --model DIR --ids 1,2,3 [--positions last|all] [--backend cpu] [--layout tp=2,ep=2]
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "model/cuda_model.h"
#include "model/gpt_oss_forward.h"
#include "model/parallel_cpu_forward.h"
#include "model/parallel_cuda_model.h"
#include "model/safetensors_file.h"
#include "parallel/world.h"

namespace gptoss::cli {
namespace {

struct LogitsOptions {
    std::string model;
    std::string ids;
    std::string positions = "last";
    std::string backend = "cpu";
    std::string out;  // write a safetensors file instead of JSON
    std::string layout = "tp=1";
    bool fp8 = false;                     // cuda: FP8 weights (model::CudaModelOptions::fp8)
    bool fp8_experts = false;             // cuda, with fp8: model::CudaModelOptions::fp8_experts
    std::string kv_cache_dtype = "auto";  // fp8 = an e4m3 KV cache (cli::parse_kv_cache_dtype)
};

int run_logits(const LogitsOptions& o) {
    auto ids = parse_id_list(o.ids);
    if (!ids.ok()) return fail(ids.status().message());
    // --out is checked before the model loads: a bad path fails at once.
    std::optional<OutputTarget> target;
    if (!o.out.empty()) {
        auto t = resolve_output_target(o.out);
        if (!t.ok()) return fail(t.status().message());
        target = *t;
        // Never into the checkpoint being read (a --out of model/model.safetensors replaced the weights).
        std::error_code ec;
        const auto model_dir = std::filesystem::weakly_canonical(std::filesystem::path(o.model), ec);
        const auto out_path = std::filesystem::weakly_canonical(target->path, ec);
        if (!model_dir.empty() && !out_path.empty()) {
            const auto rel = out_path.lexically_relative(model_dir);
            if (!rel.empty() && *rel.begin() != "..")
                return fail("--out " + o.out + " is inside the model directory " + o.model +
                            ": write the logits elsewhere");
        }
    }
    auto weights = model::GptOssWeights::load(o.model);
    if (!weights.ok()) return fail(weights.status().message());
    const bool all = o.positions == "all";
    auto layout = parallel::ParallelConfig::parse(o.layout);
    if (!layout.ok()) return fail(layout.status().message());
    if (o.fp8 && o.backend != "cuda") return fail("--fp8 needs --backend cuda");
    if (o.fp8_experts && !o.fp8) return fail("--fp8-experts needs --fp8");
    const auto kv_fp8 = parse_kv_cache_dtype(o.kv_cache_dtype);
    if (!kv_fp8.ok()) return fail(kv_fp8.status().message());
    std::vector<float> logits;
    if (o.backend == "cpu" && !layout->trivial()) {
        // Simulated ranks (threads) with LocalGroup collectives: the parallel reference.
        const int bs = 16, blocks = static_cast<int>(ids->size() + bs - 1) / bs;
        auto p = model::ParallelCpuForward::create(**weights, *layout, bs, blocks, blocks, false, *kv_fp8);
        if (!p.ok()) return fail(p.status().message());
        std::vector<int32_t> table(blocks);
        for (int i = 0; i < blocks; ++i) table[i] = i;
        model::ForwardSequence s{*ids, 0, table, table, all};
        if (Status st = (*p)->forward(std::span(&s, 1), {}, &logits); !st.ok()) return fail(st.message());
    } else if (o.backend == "cpu") {
        model::SingleSequence seq(**weights, static_cast<int>(ids->size()), 16, *kv_fp8);
        if (Status st = seq.append(*ids, all, &logits); !st.ok()) return fail(st.message());
    } else if (o.backend == "cuda") {
        model::CudaModelOptions opt;
        opt.max_tokens = std::max<int>(static_cast<int>(ids->size()), 1024);
        opt.max_seqs = 4;
        opt.fp8 = o.fp8;
        opt.fp8_experts = o.fp8_experts;
        opt.kv_fp8 = *kv_fp8;
        // One call writes every position of the prompt, sliding layers included.
        opt.num_blocks_sliding = static_cast<int>(ids->size() / 16 + 2);
        auto m = model::ParallelCudaModel::create(**weights, *layout, opt);
        if (!m.ok()) return fail(m.status().message());
        const int bs = (*m)->block_size();
        std::vector<int32_t> table((ids->size() + bs - 1) / bs);
        for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
        if (static_cast<int>(table.size()) > (*m)->num_blocks(false) ||
            static_cast<int>(table.size()) > (*m)->num_blocks(true)) {
            // Sliding layers need only the window, but a one-shot prompt writes every position.
            return fail("prompt too long for the KV cache");
        }
        model::ForwardSequence s{*ids, 0, table, table, all};
        if (Status st = (*m)->forward(std::span(&s, 1), &logits); !st.ok()) return fail(st.message());
    } else {
        return fail("unknown backend '" + o.backend + "' (cpu or cuda)");
    }
    const int vocab = (*weights)->config.vocab_size;
    const int rows = static_cast<int>(logits.size() / vocab);
    const int first = static_cast<int>(ids->size()) - rows;
    // NaN or Inf logits (NaN in the checkpoint, or an overflow) are an error, as generate's: they were printed as
    // null (or written) with exit status 0.
    if (auto bad = std::find_if(logits.begin(), logits.end(), [](float v) { return !std::isfinite(v); });
        bad != logits.end()) {
        const long at = bad - logits.begin();
        return fail("non-finite logits (" + std::to_string(*bad) + " at position " +
                    std::to_string(first + at / vocab) + ", token " + std::to_string(at % vocab) +
                    "): the checkpoint or the activations hold NaN or Inf");
    }
    if (target) {
        model::SafetensorsWriter w;
        std::vector<int32_t> pos(rows);
        for (int r = 0; r < rows; ++r) pos[r] = first + r;
        std::vector<uint8_t> pbytes(reinterpret_cast<uint8_t*>(pos.data()),
                                    reinterpret_cast<uint8_t*>(pos.data()) + rows * 4);
        std::vector<uint8_t> lbytes(reinterpret_cast<uint8_t*>(logits.data()),
                                    reinterpret_cast<uint8_t*>(logits.data()) + logits.size() * 4);
        w.add("positions", DType::kI32, Shape{rows}, std::move(pbytes));
        w.add("logits", DType::kF32, Shape{rows, vocab}, std::move(lbytes));
        // The writer names its file model.safetensors: write into a private temporary directory (mkdtemp: a name
        // no one else has) beside the target, then move the file into place (or copy it through to a FIFO or
        // device, cli_util.h).
        namespace fs = std::filesystem;
        std::string pattern = (temporary_dir_for(*target) / ".gptoss-logits.tmp-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr)
            return fail("cannot write " + o.out + ": cannot make a temporary directory beside it");
        const fs::path tmp(pattern);
        Status st = w.write(tmp.string(), {{"backend", o.backend}});
        if (st.ok()) st = place_output_file(*target, tmp / "model.safetensors");
        std::error_code ec;
        fs::remove_all(tmp, ec);
        if (!st.ok()) return fail(st.message());
        return 0;
    }
    // Written a row at a time: the whole text of every position (2,000 positions: 4.2 GB) was held in memory.
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
        std::cout << out;
        out.clear();
    }
    out += "]}\n";
    std::cout << out;
    return 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<LogitsOptions>();
    auto* sub = app.add_subcommand("logits", "Print the logits of a prompt as JSON");
    sub->add_option("--model", o->model, "Model directory (Hugging Face layout)")->required()->check(non_empty_path);
    sub->add_option("--ids", o->ids, "Comma-separated token ids")->required();
    sub->add_option("--positions", o->positions, "last or all")
        ->check(CLI::IsMember({"last", "all"}))
        ->capture_default_str();
    sub->add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
    sub->add_option("--layout", o->layout, "Parallel layout: tp=2,ep=2,dp=1 (CPU: simulated ranks)")
        ->capture_default_str();
    sub->add_option("--out", o->out, "Write positions and logits to this .safetensors file instead of JSON")
        ->check(non_empty_path);
    sub->add_flag("--fp8", o->fp8, "cuda: FP8 block-scaled QKV, O, lm_head and large-batch experts");
    sub->add_flag("--fp8-experts", o->fp8_experts,
                  "cuda, with --fp8 and MXFP4 experts: keep the experts only in FP8 (every batch on the FP8 "
                  "kernels; fits gpt-oss-120b on one H200; decode reads ~2x the bytes)");
    sub->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                    "KV cache auto (bf16), bf16 or fp8 (e4m3, scale 1; cpu: emulated)")
        ->capture_default_str();
    sub->callback([o, &exit_code] { exit_code = run_logits(*o); });
});

}  // namespace
}  // namespace gptoss::cli
