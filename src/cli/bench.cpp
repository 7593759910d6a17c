// gptoss bench: prefill latency by input length and decode speed by batch size and context, as
// fractions of the physical limit (bytes over measured bandwidth, FLOPs over measured peak) and as
// cost per million tokens. Decode contexts are "pretended": the KV cache is filled with random
// values and each sequence starts at the given position, which costs exactly what a real context of
// that length costs (attention reads every cached key) without a prefill per configuration.
// --layout runs one parallel layout (EPx·DPy·TPz, parallel/world.h); --sweep runs every valid layout
// on 1, 2, 4 and 8 GPUs (as many as are visible, or --gpus) and names the best one per regime.
// Costs count every GPU of the layout; limits use the layout's aggregate bandwidth and peak.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#if GPTOSS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/kernel_trace.h"
#include "core/gpu_telemetry.h"
#include "model/cuda_model.h"
#include "model/gpt_oss_forward.h"
#include "model/parallel_cuda_model.h"
#include "model/synthetic_weights.h"
#include "parallel/world.h"

namespace gptoss::cli {
namespace {

struct BenchOptions {
    std::string model;
    std::string synthetic;  // a preset built in memory instead of --model
    std::string backend = "cuda";
    std::string prefill = "128,1024,2048,8192,32768";
    std::string batch = "1,2,4,8,16,32,64,128";
    std::string context = "1024,8192,32768";
    int decode_steps = 16;
    int repeats = 3;
    double bandwidth = 4.15e12;  // measured device copy bandwidth, bytes/s
    // Tensor-core rate the prefill is measured against, FLOP/s; 0: the measured FP8 rate (1,344 TFLOP/s) with --fp8,
    // whose GEMMs run on e4m3 (r59's tables measured --fp8 against the bf16 rate, 760: 98% "of peak" at 747),
    // else the measured bf16 rate (760).
    double peak_flops = 0;
    double price = 3.0;  // $ per GPU-hour
    std::string json_out;
    std::string md_out;
    std::string layout = "tp=1";
    bool sweep = false;
    int gpus = 0;      // sweep: largest world (0: every visible GPU)
    bool fp8 = false;  // FP8 attention / lm_head / large-batch experts (model::CudaModelOptions::fp8)
    std::string kv_cache_dtype = "auto";  // cli::parse_kv_cache_dtype: bf16 or fp8 (kv_fp8)
    bool kv_fp8 = false;                  // parsed from kv_cache_dtype by run_bench
    // Prefill is timed as the engine runs it, the first token sampled on the device (greedy) and
    // only its id copied back; with prefill_logits the last position's logits go to the host
    // instead (the measure before r29; r29 call 4, 8k --fp8: 20b 81.41 ms sampled, 81.03 with the
    // logits, 120b 168.11 / 167.85: the same within run-to-run noise).
    bool prefill_logits = false;
    bool fp8_experts = false;  // model::CudaModelOptions::fp8_experts (with --fp8)
};

double peak_flops_per_gpu(const BenchOptions& o) { return o.peak_flops > 0 ? o.peak_flops : o.fp8 ? 1344e12 : 760e12; }

using Clock = std::chrono::steady_clock;

// The layout's GPUs (devices 0 .. W − 1) by PCI bus id, for NVML (which ignores
// CUDA_VISIBLE_DEVICES).
std::vector<std::string> pci_bus_ids(int W) {
    std::vector<std::string> ids;
#if GPTOSS_HAVE_CUDA
    for (int d = 0; d < W; ++d) {
        char id[32] = {};
        if (cudaDeviceGetPCIBusId(id, sizeof id, d) != cudaSuccess) return {};
        ids.emplace_back(id);
    }
#else
    (void)W;
#endif
    return ids;
}

// The clock and power columns of a table row ("–" without telemetry) and the report's fields.
std::string telemetry_cells(const GpuTelemetrySummary& t) {
    if (t.samples == 0) return " – | – |";
    char cell[96];
    std::snprintf(cell, sizeof cell, " %.0f (%.0f) | %.0f |", t.sm_mhz_mean, t.sm_mhz_min, t.power_w_max);
    return cell;
}
void add_telemetry(nlohmann::json& row, const GpuTelemetrySummary& t) {
    if (t.samples == 0) return;
    row["sm_mhz_mean"] = t.sm_mhz_mean;
    row["sm_mhz_min"] = t.sm_mhz_min;
    row["power_w_mean"] = t.power_w_mean;
    row["power_w_max"] = t.power_w_max;
    row["gpu_limits"] = t.limits();
}

struct ModelCounts {
    double dense_bytes_per_token;  // attention + router + lm_head bytes read per decode step (batch-independent)
    double expert_bytes;           // one expert, as stored for decode (MXFP4: 4.25 bits/weight)
    double flops_per_token;        // 2 × active weights (linear layers, lm_head excluded)
    double lm_head_flops;          // 2 × vocab × hidden
    int full_layers, sliding_layers;
};

ModelCounts count(const model::GptOssConfig& c, bool fp8, bool fp8_experts) {
    ModelCounts m{};
    const double H = c.hidden_size, I = c.intermediate_size, E = c.num_experts;
    const double qw = c.q_width(), kvw = c.kv_width();
    const double attn = H * (qw + 2 * kvw) + qw * H;  // weights per layer
    // FP8: QKV, O and lm_head at one byte a weight (block scales: 1/16384 of that); the router stays bf16.
    const double wb = fp8 ? 1.0 : 2.0;
    m.dense_bytes_per_token = c.num_hidden_layers * (attn * wb + E * H * 2) + c.vocab_size * H * wb;
    // FP8 experts (--fp8-experts): one byte a weight with K padded to a multiple of 512 (the FP8
    // GEMMs' k_pad, kernels/cuda/fp8_gemm.h), + a 4-byte scale per 128×128 block.
    const auto kpad = [](double k) { return std::ceil(k / 512) * 512; };
    m.expert_bytes = fp8_experts ? 2 * I * kpad(H) + H * kpad(I) +
                                       4 * (std::ceil(2 * I / 128) * kpad(H) / 128 + std::ceil(H / 128) * kpad(I) / 128)
                                 : (2 * I * H + H * I) * 4.25 / 8;
    m.flops_per_token = 2.0 * c.num_hidden_layers * (attn + E * H + c.experts_per_token * (2 * I * H + H * I));
    m.lm_head_flops = 2.0 * c.vocab_size * H;
    m.sliding_layers =
        static_cast<int>(std::count(c.layer_types.begin(), c.layer_types.end(), model::LayerType::kSlidingAttention));
    m.full_layers = c.num_hidden_layers - m.sliding_layers;
    return m;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Lists {
    std::vector<int32_t> prefill, batches, contexts;
};

// Benchmarks one layout into `report` (JSON) and `md` (Markdown). Returns a non-empty error message
// when the layout cannot run.
std::string run_layout(const BenchOptions& o, const Lists& lists, const model::GptOssWeights& weights,
                       const parallel::ParallelConfig& layout, nlohmann::json& report, std::string& md) {
    const auto& prefill = lists.prefill;
    const auto& batches = lists.batches;
    const auto& contexts = lists.contexts;
    const model::GptOssConfig& c = weights.config;
    const int W = layout.world_size();
    const int max_prefill = prefill.empty() ? 0 : *std::max_element(prefill.begin(), prefill.end());
    const int max_batch = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
    model::CudaModelOptions opt;
    opt.max_tokens = std::max({max_prefill, max_batch, 256});
    opt.max_seqs = std::max(max_batch, 1);
    opt.fp8 = o.fp8;
    // (the model ignores it for experts not stored as MXFP4; so do the byte counts and labels)
    opt.fp8_experts = o.fp8 && o.fp8_experts && !weights.layers.empty() &&
                      weights.layers[0].expert_format == kernels::ExpertFormat::kMxfp4;
    opt.kv_fp8 = o.kv_fp8;
    // A one-shot prefill writes every position into the sliding layers too.
    opt.num_blocks_sliding = std::max(opt.max_seqs * ((c.sliding_window + 15) / 16 + 2), max_prefill / 16 + 2);
    auto created = model::ParallelCudaModel::create(weights, layout, opt);
    if (!created.ok()) return created.status().message();
    model::ParallelCudaModel& m = **created;
    const ModelCounts mc = count(c, o.fp8, opt.fp8_experts);
    const double bandwidth = o.bandwidth * W, peak = peak_flops_per_gpu(o) * W, price = o.price * W;
    report["layout"] = layout.to_string();
    report["weights"] = opt.fp8_experts ? "fp8 (experts fp8)" : o.fp8 ? "fp8" : "bf16";
    report["kv_cache_dtype"] = o.kv_fp8 ? "fp8_e4m3" : "bf16";
    report["gpus"] = W;
    const int bs = m.block_size();
    std::mt19937 rng(1);
    auto random_ids = [&](int n) {
        std::vector<int32_t> v(n);
        for (auto& x : v) x = static_cast<int32_t>(rng() % c.vocab_size);
        return v;
    };
    // Clocks and power during each measurement (core/gpu_telemetry.h: the FP8 prefill runs at the
    // board's power limit, r30).
    GpuTelemetry telemetry(pci_bus_ids(W));
    if (!telemetry.available()) std::fprintf(stderr, "no GPU telemetry: %s\n", telemetry.why().c_str());
    std::string limits_seen;
    auto note_limits = [&](const GpuTelemetrySummary& t) {
        const std::string l = t.limits();
        if (!l.empty() && limits_seen.find(l) == std::string::npos)
            limits_seen += (limits_seen.empty() ? "" : "; ") + l;
    };
    report["weight_bytes"] = m.weight_bytes();
    report["kv_cache_bytes"] = m.kv_cache_bytes();
    md += "## " + layout.to_string() +
          (opt.fp8_experts ? ", FP8 weights and experts"
           : o.fp8         ? ", FP8 weights"
                           : "") +
          (o.kv_fp8 ? ", FP8 KV cache" : "") + " (" + std::to_string(W) + " GPU" + (W > 1 ? "s" : "") +
          ")\n\n### Prefill (batch 1)\n\n| input tokens | latency ms | tok/s | TFLOP/s | % of peak | $ / 1M input tok "
          "| SM MHz mean (min) | W max |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";

    // ---- prefill ----
    // GPTOSS_KERNEL_TRACE=<csv>: each prompt length's last run and each decode configuration's last
    // step, kernel by kernel, through CUPTI (cli/kernel_trace.h). Tracing costs time: the tables'
    // figures of a traced run are not the engine's.
    const std::unique_ptr<KernelTrace> trace = KernelTrace::from_env();
    for (int L : prefill) {
        const int blocks = (L + bs - 1) / bs;
        if (blocks > m.num_blocks(false) || blocks > m.num_blocks(true)) {
            md += "| " + std::to_string(L) + " | KV does not fit | | | | | | |\n";
            continue;
        }
        std::vector<int32_t> table(blocks);
        for (int i = 0; i < blocks; ++i) table[i] = i;
        auto ids = random_ids(L);
        std::vector<double> times;
        const model::CudaModel::SampleParams greedy;
        for (int r = 0; r < o.repeats + 1; ++r) {
            std::vector<float> logits;
            std::vector<int32_t> first;
            model::ForwardSequence s{ids, 0, table, table, false};
            if (r == 1) telemetry.start();                                 // over the timed runs
            if (trace && r == std::max(0, o.repeats - 1)) trace->start();  // two starts: one whole run
            auto t0 = Clock::now();
            Status st = o.prefill_logits ? m.forward(std::span(&s, 1), &logits)
                                         : m.forward_sample(std::span(&s, 1), std::span(&greedy, 1), &first);
            auto t1 = Clock::now();
            if (!st.ok()) return st.message();
            if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());  // first run warms up
        }
        if (trace) trace->stop("prefill " + std::to_string(L), "embedding");
        const GpuTelemetrySummary tel = telemetry.stop();
        note_limits(tel);
        const double t = median(times);
        double attn_flops = 0;
        for (int l = 0; l < c.num_hidden_layers; ++l) {
            // QKᵀ and PV: 4·head_dim FLOPs per visible (query, key) pair per head.
            const double pairs = c.is_sliding(l) ? static_cast<double>(L) * std::min(L, c.sliding_window)
                                                 : static_cast<double>(L) * (L + 1) / 2;
            attn_flops += 4.0 * c.head_dim * c.num_attention_heads * pairs;
        }
        const double flops = mc.flops_per_token * L + mc.lm_head_flops + attn_flops;
        const double tflops = flops / t / 1e12;
        const double cost = price / 3600.0 / (L / t) * 1e6;
        nlohmann::json row = {{"tokens", L},
                              {"latency_ms", t * 1e3},
                              {"tok_per_s", L / t},
                              {"tflops", tflops},
                              {"pct_of_peak", 100.0 * flops / peak / t},
                              {"usd_per_m_tokens", cost}};
        add_telemetry(row, tel);
        report["prefill"].push_back(row);
        char line[256];
        std::snprintf(line, sizeof line, "| %d | %.2f | %.0f | %.1f | %.1f%% | %.4f |", L, t * 1e3, L / t, tflops,
                      100.0 * flops / peak / t, cost);
        md += line + telemetry_cells(tel) + "\n";
        std::fprintf(stderr, "%s prefill %6d tokens: %8.2f ms", layout.to_string().c_str(), L, t * 1e3);
        if (tel.samples > 0)
            std::fprintf(stderr, "  (SM %.0f MHz mean, %.0f min; %.0f W max%s%s)", tel.sm_mhz_mean, tel.sm_mhz_min,
                         tel.power_w_max, tel.limits().empty() ? "" : "; ", tel.limits().c_str());
        std::fprintf(stderr, "\n");
    }

    // ---- decode ----
    md +=
        "\n### Decode\n\n| context | batch | step ms | tok/s per seq | tok/s total | GB/step | % of bandwidth limit | "
        "$ "
        "/ 1M output tok |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    m.fill_kv_random(7);
    for (int C : contexts) {
        for (int B : batches) {
            const int steps = o.decode_steps;
            const int blocks_per_seq = (C + steps + 2 + bs - 1) / bs;  // positions C .. C + steps + 1
            // Sliding layers keep a window per sequence: the bench maps every sequence's sliding
            // blocks onto a private ring of window-covering blocks.
            const int ring = (c.sliding_window + bs - 1) / bs + 1;
            if (static_cast<int64_t>(B) * blocks_per_seq > m.num_blocks(false) || B * ring > m.num_blocks(true)) {
                md += "| " + std::to_string(C) + " | " + std::to_string(B) + " | KV does not fit | | | | | |\n";
                report["decode"].push_back({{"context", C}, {"batch", B}, {"fits", false}});
                continue;
            }
            std::vector<std::vector<int32_t>> tf(B), ts(B);
            for (int s = 0; s < B; ++s) {
                tf[s].resize(blocks_per_seq);
                ts[s].assign(blocks_per_seq, -1);
                for (int b = 0; b < blocks_per_seq; ++b) {
                    tf[s][b] = s * blocks_per_seq + b;
                    ts[s][b] = s * ring + b % ring;
                }
            }
            std::vector<int32_t> tokens = random_ids(B);
            std::vector<model::CudaModel::SampleParams> params(B);
            std::vector<int32_t> next;
            std::vector<double> times, spans;
            if (trace) trace->start();
            for (int step = 0; step < steps + 2; ++step) {
                std::vector<model::ForwardSequence> seqs(B);
                for (int s = 0; s < B; ++s) seqs[s] = {std::span(&tokens[s], 1), C + step, tf[s], ts[s], false};
                if (step == 2) telemetry.start();  // over the timed steps
                auto t0 = Clock::now();
                Status st = m.forward_sample(seqs, params, &next);
                auto t1 = Clock::now();
                if (!st.ok()) return st.message();
                tokens = next;
                if (step >= 2) times.push_back(std::chrono::duration<double>(t1 - t0).count());
                if (step >= 2 && m.last_step_span_ms() >= 0) spans.push_back(m.last_step_span_ms() * 1e-3);
            }
            const GpuTelemetrySummary tel = telemetry.stop();
            if (trace) trace->stop("context " + std::to_string(C) + " batch " + std::to_string(B), "embedding");
            note_limits(tel);
            const double t = median(times);
            const double distinct =
                c.num_experts * (1.0 - std::pow(1.0 - static_cast<double>(c.experts_per_token) / c.num_experts, B));
            const double kv = static_cast<double>(B) * 2.0 * c.kv_width() * (o.kv_fp8 ? 1.0 : 2.0) *
                              (mc.full_layers * (C + 1.0) + mc.sliding_layers * std::min(C + 1, c.sliding_window));
            const double bytes = mc.dense_bytes_per_token + c.num_hidden_layers * distinct * mc.expert_bytes + kv;
            const double limit = bytes / bandwidth;
            const double cost = price / 3600.0 / (B / t) * 1e6;
            nlohmann::json row = {{"context", C},
                                  {"batch", B},
                                  {"fits", true},
                                  {"step_ms", t * 1e3},
                                  {"tok_per_s_per_seq", 1.0 / t},
                                  {"tok_per_s_total", B / t},
                                  {"bytes_per_step", bytes},
                                  {"pct_of_bandwidth_limit", 100.0 * limit / t},
                                  {"usd_per_m_tokens", cost}};
            add_telemetry(row, tel);
            report["decode"].push_back(row);
            char line[256];
            std::snprintf(line, sizeof line, "| %d | %d | %.3f | %.1f | %.0f | %.2f | %.1f%% | %.4f |\n", C, B, t * 1e3,
                          1.0 / t, B / t, bytes / 1e9, 100.0 * limit / t, cost);
            md += line;
            std::fprintf(stderr, "%s decode ctx %6d batch %4d: %8.3f ms/step\n", layout.to_string().c_str(), C, B,
                         t * 1e3);
            if (!spans.empty()) {  // GPTOSS_STEP_EVENTS=1: the device's span of a step against the wall step
                const double span = median(spans);
                report["decode"].back()["device_span_ms"] = span * 1e3;
                std::fprintf(stderr, "%s decode ctx %6d batch %4d: device span %8.3f ms/step (host share %.3f)\n",
                             layout.to_string().c_str(), C, B, span * 1e3, (t - span) * 1e3);
            }
        }
    }
    md += "\n";
    if (!limits_seen.empty()) {
        md += "GPU clock limits seen during the measurements (NVML): " + limits_seen + ".\n\n";
        report["gpu_limits"] = limits_seen;
    }
    return "";
}

// Best layout per regime: lowest prefill latency per input length; per (context, batch) decode,
// the fastest per sequence and the cheapest per million tokens.
std::string best_per_regime(const nlohmann::json& runs, nlohmann::json& best) {
    std::map<int, std::pair<double, std::string>> prefill;
    std::map<std::pair<int, int>, std::pair<double, std::string>> fastest, cheapest;
    for (const auto& r : runs) {
        if (!r.contains("layout") || r.contains("error")) continue;
        const std::string name = r["layout"];
        for (const auto& p : r.value("prefill", nlohmann::json::array())) {
            auto& b = prefill[p["tokens"]];
            if (b.second.empty() || p["latency_ms"] < b.first) b = {p["latency_ms"], name};
        }
        for (const auto& d : r.value("decode", nlohmann::json::array())) {
            if (!d.value("fits", false)) continue;
            const std::pair<int, int> key{d["context"], d["batch"]};
            auto& f = fastest[key];
            if (f.second.empty() || d["step_ms"] < f.first) f = {d["step_ms"], name};
            auto& c = cheapest[key];
            if (c.second.empty() || d["usd_per_m_tokens"] < c.first) c = {d["usd_per_m_tokens"], name};
        }
    }
    std::string md = "## Best layout per regime\n\n| regime | fastest | cheapest per 1M tokens |\n|---|---|---|\n";
    char line[256];
    for (auto& [L, b] : prefill) {
        std::snprintf(line, sizeof line, "| prefill %d | %s (%.2f ms) | |\n", L, b.second.c_str(), b.first);
        md += line;
        best["prefill"].push_back({{"tokens", L}, {"fastest", b.second}, {"latency_ms", b.first}});
    }
    for (auto& [key, f] : fastest) {
        const auto& c = cheapest[key];
        std::snprintf(line, sizeof line, "| decode ctx %d batch %d | %s (%.3f ms/step) | %s ($%.4f) |\n", key.first,
                      key.second, f.second.c_str(), f.first, c.second.c_str(), c.first);
        md += line;
        best["decode"].push_back({{"context", key.first},
                                  {"batch", key.second},
                                  {"fastest", f.second},
                                  {"step_ms", f.first},
                                  {"cheapest", c.second},
                                  {"usd_per_m_tokens", c.first}});
    }
    return md;
}

int run_bench(BenchOptions o) {
    const auto kv_fp8 = parse_kv_cache_dtype(o.kv_cache_dtype);
    if (!kv_fp8.ok()) return fail(kv_fp8.status().message());
    o.kv_fp8 = *kv_fp8;
    auto list = [](const std::string& s) {
        return s.empty() ? StatusOr<std::vector<int32_t>>(std::vector<int32_t>{}) : parse_id_list(s, "a count");
    };
    auto prefill = list(o.prefill);
    auto batches = list(o.batch);
    auto contexts = list(o.context);
    if (!prefill.ok() || !batches.ok() || !contexts.ok()) return fail("bad --prefill/--batch/--context list");
    if (o.backend != "cuda") return fail("gptoss bench measures the cuda backend (CPU throughput: see bench-cpu)");
    if (o.fp8_experts && !o.fp8) return fail("--fp8-experts needs --fp8");
    if (!(o.bandwidth > 0) || !(o.peak_flops >= 0) || !(o.price >= 0))
        return fail("--bandwidth must be positive, --peak-flops and --price not negative");
    std::vector<parallel::ParallelConfig> layouts;
    if (o.sweep) {
        const int visible = model::cuda_device_count();
        const int gpus = o.gpus > 0 ? std::min(o.gpus, visible) : visible;
        if (gpus < 1) return fail("--sweep needs a CUDA device");
        for (int w = 1; w <= std::min(gpus, 8); w *= 2)
            for (const auto& p : parallel::all_configs(w)) layouts.push_back(p);
    } else {
        auto p = parallel::ParallelConfig::parse(o.layout);
        if (!p.ok()) return fail(p.status().message());
        layouts.push_back(*p);
    }
    if (o.model.empty() == o.synthetic.empty()) return fail("give exactly one of --model and --synthetic");
    // The report files are checked before the run (a bad path failed silently after it).
    std::optional<OutputTarget> json_target, md_target;
    for (auto [path, target] : {std::pair{&o.json_out, &json_target}, std::pair{&o.md_out, &md_target}}) {
        if (path->empty()) continue;
        auto t = resolve_output_target(*path);
        if (!t.ok()) return fail(t.status().message());
        *target = *t;
    }
    StatusOr<std::unique_ptr<model::GptOssWeights>> weights = failed_precondition("no weights");
    if (!o.synthetic.empty()) {
        auto preset = model::GptOssConfig::preset(o.synthetic);
        if (!preset.ok()) return fail(preset.status().message());
        if (std::string e = synthetic_memory_error(*preset, o.synthetic); !e.empty()) return fail(e);
        weights = model::make_synthetic_weights(*preset, 1);
    } else {
        weights = model::GptOssWeights::load(o.model);
    }
    if (!weights.ok()) return fail(weights.status().message());
    const model::GptOssConfig& c = (*weights)->config;
    const Lists lists{*prefill, *batches, *contexts};
    nlohmann::json report;
    report["model"] = o.synthetic.empty() ? o.model : "synthetic " + o.synthetic;
    report["config"] = {{"layers", c.num_hidden_layers}, {"experts", c.num_experts}, {"hidden", c.hidden_size}};
    report["assumptions"] = {{"bandwidth_bytes_per_s_per_gpu", o.bandwidth},
                             {"peak_flops_per_gpu", peak_flops_per_gpu(o)},
                             {"price_per_gpu_hour", o.price}};
    std::string md;
    int failures = 0;
    for (const auto& layout : layouts) {
        nlohmann::json run;
        std::string err = run_layout(o, lists, **weights, layout, run, md);
        if (!err.empty()) {
            std::fprintf(stderr, "%s: %s\n", layout.to_string().c_str(), err.c_str());
            run["layout"] = layout.to_string();
            run["error"] = err;
            md += "## " + layout.to_string() + "\n\nnot run: " + err + "\n\n";
            ++failures;
        }
        report["runs"].push_back(run);
    }
    if (layouts.size() > 1) md += best_per_regime(report["runs"], report["best"]);
    std::cout << md;
    if (json_target)
        if (Status st = write_output(*json_target, report.dump(2) + "\n"); !st.ok()) return fail(st.message());
    if (md_target)
        if (Status st = write_output(*md_target, md); !st.ok()) return fail(st.message());
    // A single layout that cannot run is an error; a sweep reports the layouts that did not fit.
    return failures == static_cast<int>(layouts.size()) ? 1 : 0;
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<BenchOptions>();
    auto* sub = app.add_subcommand("bench", "Prefill latency and decode speed against the physical limits");
    sub->add_option("--model", o->model, "Model directory")->check(non_empty_path);
    sub->add_option("--synthetic", o->synthetic, "Random weights of a preset built in memory (gpt-oss-120b, ...)");
    sub->add_option("--backend", o->backend, "cuda")->capture_default_str();
    sub->add_option("--prefill", o->prefill, "Input lengths (comma-separated; empty: none)")->capture_default_str();
    sub->add_option("--batch", o->batch, "Decode batch sizes")->capture_default_str();
    sub->add_option("--context", o->context, "Decode context lengths")->capture_default_str();
    sub->add_option("--decode-steps", o->decode_steps, "Timed decode steps per configuration")->capture_default_str();
    sub->add_option("--repeats", o->repeats, "Timed prefill runs per length")->capture_default_str();
    sub->add_flag("--prefill-logits", o->prefill_logits,
                  "Time prefill with the last position's logits copied to the host (default: the first token "
                  "sampled on the device, as the engine does)");
    sub->add_option("--bandwidth", o->bandwidth, "Measured memory bandwidth, bytes/s")->capture_default_str();
    sub->add_option("--peak-flops", o->peak_flops,
                    "Tensor-core peak, FLOP/s (default: the H200's measured 1.344e15 with --fp8, else 7.6e14)");
    sub->add_option("--price", o->price, "$ per GPU-hour")->capture_default_str();
    sub->add_option("--json", o->json_out, "Write the report as JSON");
    sub->add_option("--markdown", o->md_out, "Write the tables as Markdown");
    sub->add_option("--layout", o->layout, "Parallel layout, e.g. tp=2,ep=2 or EP4·DP1·TP4")->capture_default_str();
    sub->add_flag("--sweep", o->sweep, "Every valid layout on 1, 2, 4, 8 GPUs, and the best per regime");
    sub->add_flag("--fp8", o->fp8, "FP8 block-scaled QKV, O, lm_head and large-batch experts (default bf16)");
    sub->add_flag("--fp8-experts", o->fp8_experts,
                  "With --fp8 and MXFP4 experts: keep the experts only in FP8 (every batch on the FP8 kernels; "
                  "fits gpt-oss-120b on one H200; decode reads ~2x the bytes)");
    sub->add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV cache: auto (bf16), bf16, fp8 (e4m3, scale 1)")
        ->capture_default_str();
    sub->add_option("--gpus", o->gpus, "Largest world for --sweep (default: every visible GPU)");
    sub->callback([o, &exit_code] { exit_code = run_bench(*o); });
});

}  // namespace
}  // namespace gptoss::cli
