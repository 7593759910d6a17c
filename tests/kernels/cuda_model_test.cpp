// The whole CUDA forward against references: the committed transformers fixtures (tiny_a,
// tiny_a_bf16, tiny_b) and the CPU forward on a random checkpoint with the real gpt-oss widths.
//
// Tolerance: the CUDA path rounds activations to bf16 at every GEMM input and stores K/V in bf16
// (the CPU reference and transformers run fp32), so logits carry ~2^-9 relative noise per rounding
// accumulated over the layers: relative L2 ≤ 2e-2 per position (issue 5), argmax agreement ≥ 99%
// of positions (a flip needs a near-tie in the top two logits or in the router).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "cuda_test_util.h"
#include "model/cuda_model.h"
#include "model/gpt_oss_forward.h"
#include "model/random_checkpoint.h"
#include "model/safetensors_file.h"

namespace gptoss::test {
namespace {

namespace fs = std::filesystem;
using model::CudaModel;
using model::ForwardSequence;

// Issue 5's bar (bf16 activations and KV cache against fp32): last-position relative L2 ≤ 2e-2
// and top-1 on ≥ 99% of positions. Over all positions the p90 must meet the same 2e-2; single
// positions may reach kMaxWorstRelL2, as measured on the conditioned fixtures (one of 93 positions
// at 0.040, p90 0.0056): a bf16 rounding that swaps one expert at one position moves that row by a
// few percent without changing its argmax.
constexpr double kMaxRelL2 = 2e-2;
constexpr double kMaxWorstRelL2 = 6e-2;
constexpr double kMinArgmaxAgreement = 0.99;

struct Agreement {
    double worst_rel = 0;
    int positions = 0, same_argmax = 0;
    std::vector<double> rels;
    double percentile(double p) const {
        if (rels.empty()) return 0;
        std::vector<double> v = rels;
        std::sort(v.begin(), v.end());
        return v[static_cast<size_t>(p * (v.size() - 1))];
    }
    void add(const float* got, const float* ref, int V) {
        double num = 0, den = 0;
        int a = 0, b = 0;
        for (int i = 0; i < V; ++i) {
            const double d = static_cast<double>(got[i]) - ref[i];
            num += d * d;
            den += static_cast<double>(ref[i]) * ref[i];
            if (got[i] > got[a]) a = i;
            if (ref[i] > ref[b]) b = i;
        }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        rels.push_back(rel);
        worst_rel = std::max(worst_rel, rel);
        ++positions;
        same_argmax += a == b;
    }
    double agreement() const { return positions ? static_cast<double>(same_argmax) / positions : 0; }
};

model::CudaModelOptions small_options() {
    model::CudaModelOptions o;
    o.max_tokens = 512;
    o.max_seqs = 8;
    o.num_blocks_full = 256;
    o.num_blocks_sliding = 256;
    return o;
}

std::vector<int32_t> identity_table(int n) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = i;
    return t;
}

TEST(CudaModel, MatchesTransformersOnFixtures) {
    REQUIRE_GPU();
    const fs::path root = fs::path(GPTOSS_SOURCE_DIR) / "tests/data/checkpoints";
    for (const char* name : {"tiny_a", "tiny_a_bf16", "tiny_b"}) {
        const fs::path dir = root / name;
        const std::string ref_name = std::string(name) == "tiny_a_bf16" ? "tiny_a" : name;
        auto ref = model::SafetensorsFile::open((root / ref_name / "reference.safetensors").string());
        ASSERT_TRUE(ref.ok()) << ref.status().to_string();
        auto w = model::GptOssWeights::load(dir.string());
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        auto m = CudaModel::create(**w, small_options());
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        const int V = (*w)->config.vocab_size;
        Agreement whole, incremental, last;
        for (int i = 0;; ++i) {
            const auto* ids_t = (*ref)->find("prompt" + std::to_string(i) + ".ids");
            const auto* logits_t = (*ref)->find("prompt" + std::to_string(i) + ".logits");
            if (!ids_t || !logits_t) break;
            const auto* p = reinterpret_cast<const int32_t*>(ids_t->data);
            std::vector<int32_t> ids(p, p + ids_t->shape.numel());
            const auto* want = reinterpret_cast<const float*>(logits_t->data);
            const int T = static_cast<int>(ids.size());
            auto table = identity_table((T + 15) / 16 + 1);
            // Whole prompt in one call (T > 32 takes the bf16 grouped-GEMM MoE path).
            std::vector<float> got;
            ForwardSequence s{ids, 0, table, table, true};
            ASSERT_TRUE((*m)->forward(std::span(&s, 1), &got).ok());
            for (int t = 0; t < T; ++t)
                whole.add(got.data() + static_cast<size_t>(t) * V, want + static_cast<size_t>(t) * V, V);
            last.add(got.data() + static_cast<size_t>(T - 1) * V, want + static_cast<size_t>(T - 1) * V, V);
            // Half as prefill, then one token at a time (decode attention, MXFP4 experts).
            std::vector<float> inc;
            const int half = T / 2;
            if (half > 0) {
                ForwardSequence a{std::span(ids).first(half), 0, table, table, true};
                ASSERT_TRUE((*m)->forward(std::span(&a, 1), &inc).ok());
            }
            for (int t = half; t < T; ++t) {
                ForwardSequence d{std::span(ids).subspan(t, 1), t, table, table, true};
                ASSERT_TRUE((*m)->forward(std::span(&d, 1), &inc).ok());
            }
            for (int t = 0; t < T; ++t)
                incremental.add(inc.data() + static_cast<size_t>(t) * V, want + static_cast<size_t>(t) * V, V);
        }
        std::printf(
            "  %s: whole-prompt rel L2 median %.3g p90 %.3g worst %.3g (last positions: worst %.3g), argmax "
            "agreement %.4f (%d positions); incremental p90 %.3g worst %.3g, %.4f\n",
            name, whole.percentile(0.5), whole.percentile(0.9), whole.worst_rel, last.worst_rel, whole.agreement(),
            whole.positions, incremental.percentile(0.9), incremental.worst_rel, incremental.agreement());
        EXPECT_LE(last.worst_rel, kMaxRelL2) << name;
        EXPECT_LE(whole.percentile(0.9), kMaxRelL2) << name;
        EXPECT_LE(incremental.percentile(0.9), kMaxRelL2) << name;
        EXPECT_LE(whole.worst_rel, kMaxWorstRelL2) << name;
        EXPECT_LE(incremental.worst_rel, kMaxWorstRelL2) << name;
        EXPECT_GE(whole.agreement(), kMinArgmaxAgreement) << name;
        EXPECT_GE(incremental.agreement(), kMinArgmaxAgreement) << name;
    }
}

// Batches without a bf16 copy of the experts (how gpt-oss-120b fits one H200): up to 128 tokens
// the weight-only MXFP4 kernels (fp32 inputs), above that each active expert is dequantized into
// a scratch buffer before its GEMMs, which is exact, so those logits must equal the bf16-copy
// path's to fp32 noise; the MXFP4-kernel logits differ by the bf16 rounding of the GEMM inputs.
TEST(CudaModel, BatchesWithoutBf16ExpertCopyMatch) {
    REQUIRE_GPU();
    auto w = model::GptOssWeights::load(std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a");
    ASSERT_TRUE(w.ok());
    const int V = (*w)->config.vocab_size;
    for (const auto& [T, tol] : {std::pair<int, double>{200, 1e-6}, {100, 1e-2}}) {
        std::vector<int32_t> ids(T);
        for (int i = 0; i < T; ++i) ids[i] = (i * 53 + 7) % V;
        auto table = identity_table(T / 16 + 2);
        std::vector<float> out[2];
        for (int copy = 0; copy < 2; ++copy) {
            auto o = small_options();
            o.bf16_experts = copy == 1;
            auto m = CudaModel::create(**w, o);
            ASSERT_TRUE(m.ok()) << m.status().to_string();
            ForwardSequence s{ids, 0, table, table, true};
            ASSERT_TRUE((*m)->forward(std::span(&s, 1), &out[copy]).ok());
        }
        ASSERT_EQ(out[0].size(), out[1].size());
        double num = 0, den = 0;
        for (size_t i = 0; i < out[0].size(); ++i) {
            num += (out[0][i] - out[1][i]) * (out[0][i] - out[1][i]);
            den += out[1][i] * out[1][i];
        }
        std::printf("  %d tokens without the bf16 copy: rel L2 %.3g\n", T, std::sqrt(num / den));
        EXPECT_LE(std::sqrt(num / den), tol) << T << " tokens";
    }
}

// n token ids drawn uniformly from [0, vocab) with rng.
std::vector<int32_t> random_token_ids(std::mt19937& rng, int n, int vocab) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = static_cast<int32_t>(rng() % vocab);
    return v;
}

// gpt-oss-20b's widths (hidden 2880, 64/8 heads, 32 experts, window 128) with 2 layers and a
// 2,048-token vocabulary, written as a random checkpoint into a fresh temporary directory.
model::GptOssConfig real_width_config() {
    model::GptOssConfig c = *model::GptOssConfig::preset("gpt-oss-20b");
    c.num_hidden_layers = 2;
    c.layer_types = {model::LayerType::kSlidingAttention, model::LayerType::kFullAttention};
    c.vocab_size = 2048;
    c.eos_token_ids = {1};
    c.pad_token_id = 2;
    c.bos_token_id.reset();
    return c;
}
std::string write_real_width_checkpoint(const model::GptOssConfig& c, const std::string& name) {
    const std::string dir = (fs::temp_directory_path() / (name + std::to_string(::getpid()))).string();
    model::RandomCheckpointOptions ro;
    ro.seed = 3;
    EXPECT_TRUE(model::write_random_checkpoint(c, dir, ro).ok());
    return dir;
}

// Real gpt-oss widths (hidden 2880, 64/8 heads, 32 experts, window 128), 2 layers, small vocab:
// every kernel runs at its production shape; the CPU forward is the reference.
TEST(CudaModel, MatchesCpuAtRealWidthsWithBatchesAndLongPrompts) {
    REQUIRE_GPU();
    const model::GptOssConfig c = real_width_config();
    const std::string dir = write_real_width_checkpoint(c, "gptoss_cuda_model_");
    auto w = model::GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    // The 321-token prompt step runs the experts through moe_wgmma, then through per-expert cuBLAS;
    // then moe_wgmma with the FP8 (e4m3) KV cache, against CPU forwards whose caches round to e4m3
    // too (CpuKvCache fp8; the fp32 CPU keeps an fp32 cache, so its gap includes the FP8 cache's);
    // then the grouped bf16 kernels on the bf16 copy (GPTOSS_MOE_BF16_GROUPED=1, moe_bf16_grouped).
    size_t bf16_kv_bytes = 0;        // variant 0's cache: the FP8 cache must be half of it
    std::vector<float> bf16_prompt;  // variant 0's prompt logits: the FP8 cache must move them
    for (int variant : {0, 1, 2, 3}) {
        const bool wgmma = variant == 0 || variant == 2, kv8 = variant == 2, bf16_grouped = variant == 3;
        const char* name = bf16_grouped ? "prompt MoE by moe_bf16_grouped"
                           : wgmma      ? (kv8 ? "moe_wgmma, FP8 KV cache" : "prompt MoE by moe_wgmma")
                                        : "prompt MoE by cuBLAS";
        SCOPED_TRACE(name);
        auto o = small_options();
        o.moe_wgmma = wgmma ? 1 : 0;
        o.kv_fp8 = kv8;
        if (bf16_grouped) ::setenv("GPTOSS_MOE_BF16_GROUPED", "1", 1);  // read when the model is made
        auto m = CudaModel::create(**w, o);
        if (bf16_grouped) ::unsetenv("GPTOSS_MOE_BF16_GROUPED");
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        if (variant == 0) bf16_kv_bytes = (*m)->kv_cache_bytes();
        if (kv8) {
            EXPECT_EQ(2 * (*m)->kv_cache_bytes(), bf16_kv_bytes);
        }
        // Reference: the CPU forward rounding to bf16 where the CUDA path does (tight tolerance), and
        // the plain fp32 CPU forward (reported: the gap is the bf16 precision itself).
        model::CpuForward cpu(**w, /*emulate_bf16=*/true);
        model::CpuKvCache cpu_kv(c, 16, 256, 256, 0, kv8);
        model::CpuForward cpu32(**w);
        model::CpuKvCache cpu32_kv(c, 16, 256, 256);
        Agreement agree32;
        const int V = c.vocab_size;
        std::mt19937 rng(5);
        auto random_ids = [&](int n) { return random_token_ids(rng, n, V); };
        // Three sequences with disjoint block ranges: a 300-token prompt (past the window), a 20-token
        // one and a 1-token one, in one batch; then 8 decode steps for all three together.
        std::vector<std::vector<int32_t>> prompts = {random_ids(300), random_ids(20), random_ids(1)};
        std::vector<std::vector<int32_t>> tables(3);
        for (int s = 0; s < 3; ++s) {
            tables[s].resize(40);
            for (int b = 0; b < 40; ++b) tables[s][b] = s * 40 + b;
        }
        Agreement agree;
        std::vector<ForwardSequence> batch;
        for (int s = 0; s < 3; ++s) batch.push_back({prompts[s], 0, tables[s], tables[s], true});
        std::vector<float> g, r, r32;
        ASSERT_TRUE((*m)->forward(batch, &g).ok());
        ASSERT_TRUE(cpu.forward(batch, cpu_kv, &r).ok());
        ASSERT_TRUE(cpu32.forward(batch, cpu32_kv, &r32).ok());
        ASSERT_EQ(g.size(), r.size());
        if (variant == 0) bf16_prompt = g;
        if (kv8) {
            EXPECT_NE(g, bf16_prompt) << "the FP8 KV cache left the logits unchanged";
        }
        for (size_t row = 0; row < g.size() / V; ++row) {
            agree.add(g.data() + row * V, r.data() + row * V, V);
            agree32.add(g.data() + row * V, r32.data() + row * V, V);
        }
        std::vector<int32_t> lens = {300, 20, 1};
        for (int step = 0; step < 8; ++step) {
            std::vector<std::vector<int32_t>> next(3);
            batch.clear();
            for (int s = 0; s < 3; ++s) {
                next[s] = random_ids(1);
                batch.push_back({next[s], lens[s], tables[s], tables[s], false});
            }
            g.clear();
            r.clear();
            r32.clear();
            ASSERT_TRUE((*m)->forward(batch, &g).ok());
            ASSERT_TRUE(cpu.forward(batch, cpu_kv, &r).ok());
            ASSERT_TRUE(cpu32.forward(batch, cpu32_kv, &r32).ok());
            for (int s = 0; s < 3; ++s) {
                agree.add(g.data() + static_cast<size_t>(s) * V, r.data() + static_cast<size_t>(s) * V, V);
                agree32.add(g.data() + static_cast<size_t>(s) * V, r32.data() + static_cast<size_t>(s) * V, V);
                ++lens[s];
            }
        }
        std::printf(
            "  real widths (%s) vs bf16-emulating CPU: rel L2 median %.3g p90 %.3g worst %.3g, argmax agreement %.4f "
            "over %d positions\n",
            name, agree.percentile(0.5), agree.percentile(0.9), agree.worst_rel, agree.agreement(), agree.positions);
        std::printf("  real widths vs fp32 CPU: worst rel L2 %.3g, argmax agreement %.4f\n", agree32.worst_rel,
                    agree32.agreement());
        EXPECT_LE(agree.worst_rel, kMaxRelL2);
        EXPECT_GE(agree.agreement(), kMinArgmaxAgreement);
    }
    fs::remove_all(dir);
}

// options.fp8 (FP8 QKV, O, lm_head; FP8 experts for batches above mxfp4_max_tokens) on the
// real-width model, against the fp32 CPU forward. e4m3 keeps 3 mantissa bits (relative rounding
// ≤ 2^-4): one W8A8 GEMM on random data is off by 3.75% relative L2
// (CudaFp8Gemm.QuantizationErrorAgainstBf16GemmIsAFewPercent), and the prompt's logits here pass
// through ~9 of them. Measured on the H200 (2026-11-29, per-expert cuBLASLt experts): median 0.056,
// p90 0.060, worst 0.114, top-1 99.7% over 332 positions (bf16: ≤ 0.044, 100%). Bounds with ~1.5×
// room for other seeds: median ≤ 0.08, p90 ≤ 0.1, top-1 ≥ 97%. Three ways to run the prompt's
// experts: the grouped FP8 kernels (moe_fp8: activation rows with one scale each, the default), the
// per-expert cuBLASLt GEMMs on the FP8 copy (activations per 1×128), and the same without the copy
// (one expert converted at a time). Each must meet the bounds; the last two must give the same
// logits (same bytes, same GEMMs).
// The FP8 decode QKV and lm_head GEMVs read the norms' bf16 rows (r42); the GEMVs round x to bf16
// (RN) themselves, so the logits are the same bits as from the fp32 rows (GPTOSS_GEMV_X_F32=1),
// at 1, 2, 5 and 8 sequences.
TEST(CudaModel, Fp8GemvsOnBf16RowsAreTheSameBits) {
    REQUIRE_GPU();
    const model::GptOssConfig c = real_width_config();
    const std::string dir = write_real_width_checkpoint(c, "gptoss_cuda_lmhead_");
    auto w = model::GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::mt19937 rng(9);
    std::vector<std::vector<float>> got(2);
    for (int variant = 0; variant < 2; ++variant) {
        auto o = small_options();
        o.fp8 = true;
        o.moe_residual_tail = false;  // on the bf16 rows only (its h rounds other values; tested below)
        if (variant == 1) ::setenv("GPTOSS_GEMV_X_F32", "1", 1);  // read when the model is made
        auto m = CudaModel::create(**w, o);
        ::unsetenv("GPTOSS_GEMV_X_F32");
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        std::mt19937 r(rng);  // the same ids for both variants
        for (int n : {1, 2, 5, 8}) {
            std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n)), prompts(static_cast<size_t>(n));
            for (int s = 0; s < n; ++s) {
                tables[s].resize(4);
                for (int b = 0; b < 4; ++b) tables[s][b] = s * 4 + b;
                prompts[s] = random_token_ids(r, 5 + s, c.vocab_size);
            }
            std::vector<ForwardSequence> batch;
            for (int s = 0; s < n; ++s) batch.push_back({prompts[s], 0, tables[s], tables[s], false});
            std::vector<float> out;
            ASSERT_TRUE((*m)->forward(batch, &out).ok());
            for (int step = 0; step < 2; ++step) {  // decode steps: every row asked for, n <= 8
                std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n));
                batch.clear();
                for (int s = 0; s < n; ++s) {
                    ids[s] = random_token_ids(r, 1, c.vocab_size);
                    batch.push_back({ids[s], 5 + s + step, tables[s], tables[s], false});
                }
                out.clear();
                ASSERT_TRUE((*m)->forward(batch, &out).ok());
                got[variant].insert(got[variant].end(), out.begin(), out.end());
            }
        }
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    ASSERT_GT(got[0].size(), 0u);
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0);
}

// MoeResidualTail (session 36): one-sequence decode steps with the residual update in each layer's down
// launch and the next norm's 1 / rms in the QKV GEMV, against the norm kernel between them. The h the
// GEMV reads rounds x · gain to bf16 instead of (x / rms) · gain, and Σ x² is summed in another order, so
// the logits differ a little: rel L2 ≤ 5e-3 (kTolBf16Out's; r51 measured 2.4e-3), and they must differ
// (else the tail did not run). For the decode MoE on MXFP4 (moe_decode_mma, the ticket in its down CTAs),
// on the FP8 experts alone (moe_decode_fp8), and on moe_decode_wg (moe_residual_tail after it), whose
// e4m3 activations (3 mantissa bits) turn the same perturbation into more: r51 measured 1.07e-2, bound
// 2e-2 (still a fifth of that path's distance from the fp32 CPU, Fp8WeightsStayCloseToFp32).
TEST(CudaModel, Fp8ResidualTailStaysClose) {
    REQUIRE_GPU();
    const model::GptOssConfig c = real_width_config();
    const std::string dir = write_real_width_checkpoint(c, "gptoss_cuda_tail_");
    auto w = model::GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const char* names[3] = {"moe_decode_mma", "moe_decode_wg", "FP8 experts only (moe_decode_fp8)"};
    for (int kind = 0; kind < 3; ++kind) {
        std::vector<float> got[2];
        for (int tail = 0; tail < 2; ++tail) {
            auto o = small_options();
            o.fp8 = true;
            o.moe_residual_tail = tail == 1;
            o.moe_decode_wg = kind == 1 ? 1 : 0;
            o.fp8_experts = kind == 2;
            auto m = CudaModel::create(**w, o);
            ASSERT_TRUE(m.ok()) << m.status().to_string();
            std::mt19937 r(31);  // the same ids for both
            const std::vector<int32_t> table = {0, 1, 2, 3};
            std::vector<int32_t> ids = random_token_ids(r, 7, c.vocab_size);  // the span's storage
            std::vector<ForwardSequence> batch = {{ids, 0, table, table, false}};
            std::vector<float> out;
            Status st = (*m)->forward(batch, &out);
            ASSERT_TRUE(st.ok()) << st.to_string();
            for (int step = 0; step < 6; ++step) {
                ids = random_token_ids(r, 1, c.vocab_size);
                batch = {{ids, 7 + step, table, table, false}};
                out.clear();
                st = (*m)->forward(batch, &out);
                ASSERT_TRUE(st.ok()) << st.to_string();
                got[tail].insert(got[tail].end(), out.begin(), out.end());
            }
        }
        ASSERT_EQ(got[0].size(), got[1].size());
        double num = 0, den = 0;
        for (size_t i = 0; i < got[0].size(); ++i) {
            num += (got[1][i] - got[0][i]) * (got[1][i] - got[0][i]);
            den += got[0][i] * got[0][i];
        }
        const double rel = std::sqrt(num / den);
        std::printf("  residual tail (%s) vs the norm kernel: rel L2 %.3g over 6 decode steps\n", names[kind], rel);
        EXPECT_LE(rel, kind == 1 ? 2e-2 : 5e-3) << names[kind];
        EXPECT_GT(rel, 0.0) << names[kind] << ": the same bits (did the tail run?)";
    }
}

// CudaModelOptions::qkv_attn_tail (session 42): one-sequence decode steps with the attention in the QKV kernel's
// last CTAs (gemv.h QkvAttnTailArgs; 1: the sliding layer, 2: both layers), against its own launch. A 150-token
// prompt, so that the decode steps see a full 128-key window that is not 64-aligned, through a permuted block
// table. The tail's P rounds to bf16 under per-warp maxima instead of per-tile ones (≤ 2^-9 relative a weight,
// the attention tests' bound), the same size of perturbation as the residual tail's h rounding above: rel L2
// ≤ 5e-3, and the logits must differ (else the tail did not run).
TEST(CudaModel, Fp8AttentionTailStaysClose) {
    REQUIRE_GPU();
    const model::GptOssConfig c = real_width_config();
    const std::string dir = write_real_width_checkpoint(c, "gptoss_cuda_attn_tail_");
    auto w = model::GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::vector<float> got[3];
    for (int mode = 0; mode < 3; ++mode) {
        auto o = small_options();
        o.fp8 = true;
        o.qkv_attn_tail = mode;
        auto m = CudaModel::create(**w, o);
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        std::mt19937 r(37);  // the same ids for every mode
        std::vector<int32_t> table(16);
        for (int i = 0; i < 16; ++i) table[i] = (i * 5 + 3) % 16;  // a permutation of 0..15
        std::vector<int32_t> ids = random_token_ids(r, 150, c.vocab_size);
        std::vector<ForwardSequence> batch = {{ids, 0, table, table, false}};
        std::vector<float> out;
        Status st = (*m)->forward(batch, &out);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (int step = 0; step < 6; ++step) {
            ids = random_token_ids(r, 1, c.vocab_size);
            batch = {{ids, 150 + step, table, table, false}};
            out.clear();
            st = (*m)->forward(batch, &out);
            ASSERT_TRUE(st.ok()) << st.to_string();
            got[mode].insert(got[mode].end(), out.begin(), out.end());
        }
    }
    for (int mode = 1; mode < 3; ++mode) {
        ASSERT_EQ(got[0].size(), got[mode].size());
        double num = 0, den = 0, num12 = 0;
        for (size_t i = 0; i < got[0].size(); ++i) {
            num += (got[mode][i] - got[0][i]) * (got[mode][i] - got[0][i]);
            den += got[0][i] * got[0][i];
            num12 += (got[mode][i] - got[1][i]) * (got[mode][i] - got[1][i]);
        }
        const double rel = std::sqrt(num / den);
        std::printf("  attention tail %d vs the decode attention launch: rel L2 %.3g over 6 decode steps\n", mode, rel);
        EXPECT_LE(rel, 5e-3) << "mode " << mode;
        EXPECT_GT(rel, 0.0) << "mode " << mode << ": the same bits (did the tail run?)";
        if (mode == 2) {
            EXPECT_GT(num12, 0.0) << "mode 2 the same bits as mode 1 (did the full layer's tail run?)";
        }
    }
}

TEST(CudaModel, Fp8WeightsStayCloseToFp32) {
    REQUIRE_GPU();
    const model::GptOssConfig c = real_width_config();
    const std::string dir = write_real_width_checkpoint(c, "gptoss_cuda_fp8_");
    auto w = model::GptOssWeights::load(dir);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const int V = c.vocab_size;
    std::mt19937 rng(5);
    auto random_ids = [&](int n) { return random_token_ids(rng, n, V); };
    // A 300-token and a 20-token prompt in one batch (W8A8 GEMMs, FP8 experts), then 6 decode
    // steps of both (FP8 GEMVs, MXFP4 experts; or the FP8 ones: variants 6, 10, 11).
    std::vector<std::vector<int32_t>> steps_ids[7];
    steps_ids[0] = {random_ids(300), random_ids(20)};
    for (int st = 1; st < 7; ++st) steps_ids[st] = {random_ids(1), random_ids(1)};
    std::vector<std::vector<int32_t>> tables(2);
    for (int s = 0; s < 2; ++s) {
        tables[s].resize(40);
        for (int b = 0; b < 40; ++b) tables[s][b] = s * 40 + b;
    }
    auto run = [&](auto&& fwd) {
        std::vector<float> all;
        std::vector<int32_t> lens = {0, 0};
        for (int st = 0; st < 7; ++st) {
            std::vector<ForwardSequence> batch;
            for (int s = 0; s < 2; ++s) batch.push_back({steps_ids[st][s], lens[s], tables[s], tables[s], st == 0});
            std::vector<float> out;
            EXPECT_TRUE(fwd(batch, &out));
            all.insert(all.end(), out.begin(), out.end());
            for (int s = 0; s < 2; ++s) lens[s] += static_cast<int>(steps_ids[st][s].size());
        }
        return all;
    };
    model::CpuForward cpu32(**w);
    model::CpuKvCache cpu32_kv(c, 16, 256, 256);
    const auto ref = run([&](auto& b, auto* out) { return cpu32.forward(b, cpu32_kv, out).ok(); });
    const char* names[12] = {"grouped FP8 experts",
                             "per-expert cuBLASLt",
                             "no expert copy",
                             "no expert copy, converted a layer at a time",
                             "no expert copy, MXFP4 experts as they are",
                             "MXFP4 experts as they are, W4A8 decode on wgmma",
                             "FP8 experts only (--fp8-experts)",
                             "MXFP4 experts as they are at every batch (decode steps too)",
                             "grouped FP8 experts, h's rows quantized per assignment (GPTOSS_MOE_ROWQ=0)",
                             "MXFP4 experts as they are, h's rows quantized per assignment (GPTOSS_MOE_ROWQ=0)",
                             "grouped FP8 experts, decode steps on the FP8 copy (moe_decode_fp8)",
                             "FP8 experts only, decode steps on moe_decode_fp8"};
    std::vector<float> got[12];
    for (int v_run = 0; v_run < 12; ++v_run) {
        // 8 and 9: variants 0 and 4 without the norm's e4m3 token rows (the MoE quantizes h's rows
        // per assignment itself): the same bytes reach the same kernels. 10 and 11: variants 0 and 6
        // with their decode steps' experts on moe_decode_fp8.
        const int v = v_run == 8 || v_run == 10 ? 0 : v_run == 9 ? 4 : v_run == 11 ? 6 : v_run;
        auto o = small_options();
        o.fp8 = true;
        o.bf16_experts = v < 2;  // false: no FP8 expert copy either (one expert at a time)
        o.moe_fp8_grouped = v == 0 ? -1 : 0;
        // The prompt step (320 tokens) converts the layer's experts into the scratch, the 2-token
        // decode steps stay on the MXFP4 kernels.
        o.moe_fp8_jit_min_tokens = v == 7 ? 1 : v >= 3 ? 64 : 0;
        o.moe_mx = v >= 4 ? 1 : 0;         // moe_mxfp4_fp8 in place of the conversion
        o.moe_decode_wg = v == 5 ? 1 : 0;  // the decode steps' experts on e4m3 activations
        o.moe_mma_max_tokens = 0;          // the 320-row prompt step through the FP8 experts,
        o.moe_wgmma = 0;                   // not the grouped MXFP4 kernels
        o.fp8_experts = v == 6;            // the MXFP4 bytes dropped: the decode steps on the grouped FP8 kernels too
        o.moe_decode_fp8_tokens = v_run >= 10 ? 8 : 0;
        if (v_run >= 8) ::setenv("GPTOSS_MOE_ROWQ", "0", 1);  // read when the model is made
        auto m = CudaModel::create(**w, o);
        if (v_run >= 8) ::unsetenv("GPTOSS_MOE_ROWQ");
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        got[v_run] = run([&](auto& b, auto* out) { return (*m)->forward(b, out).ok(); });
        ASSERT_EQ(got[v_run].size(), ref.size());
        Agreement agree;
        for (size_t row = 0; row < ref.size() / V; ++row)
            agree.add(got[v_run].data() + row * V, ref.data() + row * V, V);
        std::printf(
            "  fp8 (%s) vs fp32 CPU: rel L2 median %.3g p90 %.3g worst %.3g, argmax agreement %.4f over %d "
            "positions\n",
            names[v_run], agree.percentile(0.5), agree.percentile(0.9), agree.worst_rel, agree.agreement(),
            agree.positions);
        EXPECT_LE(agree.percentile(0.5), 0.08) << names[v_run];
        EXPECT_LE(agree.percentile(0.9), 0.1) << names[v_run];
        EXPECT_GE(agree.agreement(), 0.97) << names[v_run];
    }
    EXPECT_EQ(got[8], got[0]) << "the norm's e4m3 token rows changed the grouped FP8 MoE's logits";
    EXPECT_EQ(got[9], got[4]) << "the norm's e4m3 token rows changed the MX MoE's logits";
    auto rel = [&](const std::vector<float>& a, const std::vector<float>& b) {
        double num = 0, den = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            num += (a[i] - b[i]) * (a[i] - b[i]);
            den += b[i] * b[i];
        }
        return std::sqrt(num / den);
    };
    std::printf("  fp8 grouped vs per-expert experts: rel L2 %.3g (activation scales per row vs per 1x128)\n",
                rel(got[0], got[1]));
    std::printf("  fp8 without the expert copy vs with: rel L2 %.3g\n", rel(got[2], got[1]));
    EXPECT_LE(rel(got[2], got[1]), 1e-6);
    // The same expert bytes (quantize_weight_fp8_mxfp4 against the load-time conversion) through
    // the same grouped kernels: the same logits.
    std::printf("  fp8 converted a layer at a time vs the grouped FP8 copy: rel L2 %.3g\n", rel(got[3], got[0]));
    EXPECT_LE(rel(got[3], got[0]), 1e-6);
    // moe_mxfp4_fp8: the exact MXFP4 weights instead of their FP8 128×128 rounding, the same
    // activation rows: within the bounds above against fp32 (checked in the loop), and near the
    // converted copy (the two differ by the conversion's rounding only: well under the ~0.06 each
    // is from fp32; not yet measured, so the bound is loose).
    std::printf("  fp8 on MXFP4 experts as they are vs converted a layer at a time: rel L2 %.3g\n",
                rel(got[4], got[3]));
    EXPECT_LE(rel(got[4], got[3]), 0.1);
    EXPECT_GT(rel(got[4], got[3]), 0.0) << "the MXFP4 path did not run (same logits as the conversion)";
    // moe_decode_wg: only the decode steps' experts change (e4m3 activations); within the bounds
    // against fp32 above.
    std::printf("  fp8 with W4A8 decode experts (wgmma) vs bf16-activation ones: rel L2 %.3g\n", rel(got[5], got[4]));
    EXPECT_GT(rel(got[5], got[4]), 0.0) << "moe_decode_wg did not run";
    // FP8 experts only: the prompt step's rows are variant 0's bit for bit (the same converted bytes
    // through the same grouped kernels); the decode steps, on the FP8 experts instead of the MXFP4
    // weight-only kernels, differ (within the bounds against fp32 above).
    const size_t prompt = (steps_ids[0][0].size() + steps_ids[0][1].size()) * V;
    ASSERT_LE(prompt, got[6].size());
    EXPECT_TRUE(std::equal(got[6].begin(), got[6].begin() + prompt, got[0].begin()))
        << "the FP8-only prompt step differs from the FP8 copy's";
    std::printf("  fp8 experts only vs the FP8 copy beside MXFP4: rel L2 %.3g (decode steps)\n", rel(got[6], got[0]));
    EXPECT_GT(rel(got[6], got[0]), 0.0) << "the decode steps did not take the FP8 experts";
    // moe_decode_fp8 for the 2-row decode steps (CudaModelOptions::moe_decode_fp8_tokens): the prompt
    // step is variant 0's bit for bit; the decode steps differ from variant 0's MXFP4 kernel by the
    // order of the fp32 sums only (the same products; then bf16 roundings downstream: 3.0e-4 at
    // r50), bounded by kTolBf16Out's rel L2 (5e-3). With the FP8 copy as the only one, the same
    // kernels on the same bytes: variant 10's logits bit for bit.
    ASSERT_LE(prompt, got[10].size());
    EXPECT_TRUE(std::equal(got[10].begin(), got[10].begin() + prompt, got[0].begin()))
        << "moe_decode_fp8 changed the prompt step";
    std::printf("  fp8 decode MoE on the FP8 copy vs on MXFP4: rel L2 %.3g (decode steps)\n", rel(got[10], got[0]));
    EXPECT_LE(rel(got[10], got[0]), 5e-3);
    EXPECT_GT(rel(got[10], got[0]), 0.0) << "moe_decode_fp8 did not run";
    EXPECT_EQ(got[11], got[10]) << "moe_decode_fp8 with the FP8 copy alone differs from beside MXFP4";
    // The MX kernels at every batch size: the prompt step is variant 4's bit for bit (the same
    // kernels); the 2-token decode steps run them too (32-token-wide wgmmas by default, 8 with
    // GPTOSS_MOE_NARROW_TAIL=8, as gpu_check's mx_decode runs this test too; e4m3 activations)
    // instead of the weight-only kernels on bf16 activations, so they differ (within the bounds
    // against fp32 above).
    ASSERT_LE(prompt, got[7].size());
    EXPECT_TRUE(std::equal(got[7].begin(), got[7].begin() + prompt, got[4].begin()))
        << "the prompt step on the MX kernels differs between thresholds";
    std::printf("  fp8 MX kernels at every batch vs only from 64 tokens: rel L2 %.3g (decode steps)\n",
                rel(got[7], got[4]));
    EXPECT_GT(rel(got[7], got[4]), 0.0) << "the decode steps did not take the MX kernels";
    fs::remove_all(dir);
}

}  // namespace
}  // namespace gptoss::test
