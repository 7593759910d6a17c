// FP8 block-scaled GEMM (kernels/cuda/fp8_gemm.h): the quantizers against CPU loops (bit-exact bytes
// and scales), the reference kernel against a CPU GEMM on the dequantized operands, cuBLASLt against
// the reference kernel over gpt-oss shapes, and the end-to-end quantization error against bf16.
#include "kernels/cuda/fp8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "model/fp8_convert.h"

namespace gptoss::kernels::cuda {
namespace {

using test::close;
using test::Tol;

// cuBLASLt vs fp8_gemm_reference: both see identical e4m3 operands and power-of-two scales, so every
// product is exact in fp32; only accumulation differs. Hopper's FP8 tensor-core MMA adds its
// products in a narrower accumulator (about 13-14 mantissa bits: DeepSeek-V3 §3.3.2, SageAttention2)
// before cuBLASLt promotes each 128-deep block to fp32 with its scales, so ~1e-4 relative
// differences are expected where the fp32 table entry (1e-5) assumes fp32 sums. A scale-layout
// error (wrong stride, transposed blocks) gives O(1) errors here, because the test data gives every
// block its own power of two. Tighten to test::kTolF32 if the H200 shows it holds.
constexpr Tol kTolFp8Accum{5e-4, 2e-3};
// FP8 against bf16 on Gaussian data: e4m3 keeps 3 mantissa bits, a relative RMS rounding error of
// ~2.65% per operand (measured on 256k Gaussian samples with 128-wide power-of-two block scales);
// the two operands' errors are independent, so y = x·Wᵀ sees ~√2 · 2.65% ≈ 3.75% relative L2.
constexpr double kFp8VsBf16RelL2Min = 0.015, kFp8VsBf16RelL2Max = 0.05;

// Gaussian data with a different power of two per (row, 128-column block) and per 128×128 block,
// so that every activation and weight block gets its own scale (a layout bug cannot hide).
std::vector<float> block_varied(int rows, int cols, uint32_t seed, float scale) {
    std::vector<float> v = test::randn(static_cast<size_t>(rows) * cols, seed, scale);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const int e = static_cast<int>((static_cast<uint32_t>(r) * 7u + static_cast<uint32_t>(c / 128) * 5u +
                                            static_cast<uint32_t>(r / 128) * 3u + seed) %
                                           11u) -
                          5;
            v[static_cast<size_t>(r) * cols + c] = std::ldexp(v[static_cast<size_t>(r) * cols + c], e);
        }
    return v;
}

// CPU quantizer for activations, written from the layout in fp8_gemm.h: xq [m_pad, k_pad],
// xs [k_pad/128, m_pad].
void cpu_quantize_act(const std::vector<float>& x, int m, int k, int k_pad, std::vector<uint8_t>& xq,
                      std::vector<float>& xs) {
    const int m_pad = fp8_gemm_m_pad(m), groups = k_pad / 128;
    xq.assign(static_cast<size_t>(m_pad) * k_pad, 0);
    xs.assign(static_cast<size_t>(groups) * m_pad, 1.0f);
    for (int r = 0; r < m; ++r)
        for (int g = 0; g < groups; ++g) {
            float amax = 0.0f;
            for (int c = g * 128; c < std::min(k, (g + 1) * 128); ++c)
                amax = std::max(amax, std::fabs(x[static_cast<size_t>(r) * k + c]));
            const float s = model::fp8_block_scale(amax), inv = 1.0f / s;
            xs[static_cast<size_t>(g) * m_pad + r] = s;
            for (int c = g * 128; c < std::min(k, (g + 1) * 128); ++c)
                xq[static_cast<size_t>(r) * k_pad + c] = f32_to_fp8e4m3(x[static_cast<size_t>(r) * k + c] * inv);
        }
}

// The padded weight layout from the on-disk format: q [n, k_pad], s [⌈n/128⌉, k_pad/128].
void cpu_pad_weight(const std::vector<uint8_t>& q, const std::vector<float>& s, int n, int k, int k_pad,
                    std::vector<uint8_t>& qp, std::vector<float>& sp) {
    const int nbs = (n + 127) / 128, kbs = (k + 127) / 128, kbs_pad = k_pad / 128;
    qp.assign(static_cast<size_t>(n) * k_pad, 0);
    sp.assign(static_cast<size_t>(nbs) * kbs_pad, 1.0f);
    for (int r = 0; r < n; ++r)
        std::memcpy(&qp[static_cast<size_t>(r) * k_pad], &q[static_cast<size_t>(r) * k], static_cast<size_t>(k));
    for (int i = 0; i < nbs; ++i)
        for (int j = 0; j < kbs; ++j) sp[static_cast<size_t>(i) * kbs_pad + j] = s[static_cast<size_t>(i) * kbs + j];
}

template <typename T>
size_t first_mismatch(const std::vector<T>& got, const std::vector<T>& want) {
    for (size_t i = 0; i < want.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) return i;
    return want.size();
}

TEST(CudaFp8Gemm, ActivationQuantizerMatchesCpuBitExactly) {
    REQUIRE_GPU();
    for (auto [m, k, bf16] : {std::tuple<int, int, bool>{5, 2880, false},
                              {5, 2880, true},
                              {3, 200, false},
                              {37, 4096, true},
                              {130, 700, false}}) {
        const int k_pad = fp8_gemm_k_pad(k), m_pad = fp8_gemm_m_pad(m);
        std::vector<float> x = block_varied(m, k, static_cast<uint32_t>(m * 31 + k), 1.0f);
        for (int c = 0; c < std::min(k, 128); ++c) x[c] = 0.0f;  // an all-zero group: scale 1
        x[static_cast<size_t>(k) - 1] = 1e4f;                    // large values: scale > 1
        // A group of values below 448 · 2^-126 (a checkpoint's tiny MX scales): the scale's floor, 2^-126
        // (model::kFp8MinScale), where the exponent path gives none; without it 1 / s was infinite.
        // Normal floats from 1e-36 to 4.97e-36 (amax / 448 is subnormal), none flushed by the GPU.
        if (k > 256)
            for (int c = 128; c < 256; ++c)
                x[c] = (c % 2 ? -1.0f : 1.0f) * 1e-36f * (1.0f + static_cast<float>(c - 128) / 32.0f);
        if (bf16) x = test::bf16_round(x);
        std::vector<uint8_t> want_q;
        std::vector<float> want_s;
        cpu_quantize_act(x, m, k, k_pad, want_q, want_s);

        DeviceBuffer dx = bf16 ? test::to_device(test::to_bf16(x)) : test::to_device(x);
        DeviceBuffer dq = test::poisoned(want_q.size()), ds = test::poisoned(want_s.size() * sizeof(float));
        if (bf16) {
            quantize_act_fp8_bf16(dx.get(), m, k, k_pad, dq.as<uint8_t>(), ds.as<float>(), nullptr);
        } else {
            quantize_act_fp8(dx.as<float>(), m, k, k_pad, dq.as<uint8_t>(), ds.as<float>(), nullptr);
        }
        const auto got_q = test::to_host<uint8_t>(dq, want_q.size());
        const auto got_s = test::to_host<float>(ds, want_s.size());
        const size_t iq = first_mismatch(got_q, want_q), is = first_mismatch(got_s, want_s);
        EXPECT_EQ(iq, want_q.size()) << "m " << m << " k " << k << " bf16 " << bf16 << ": byte [" << iq / k_pad << ", "
                                     << iq % k_pad << "] got " << int(got_q[iq]) << " want " << int(want_q[iq]);
        EXPECT_EQ(is, want_s.size()) << "m " << m << " k " << k << ": scale [" << is / m_pad << ", " << is % m_pad
                                     << "] got " << got_s[is] << " want " << want_s[is];
    }
}

TEST(CudaFp8Gemm, WeightPreparationMatchesCpuBitExactly) {
    REQUIRE_GPU();
    for (auto [n, k] : {std::pair<int, int>{300, 700}, {2880, 2880}, {5120, 2880}, {2880, 4096}}) {
        const int k_pad = fp8_gemm_k_pad(k);
        const std::vector<float> w = test::bf16_round(block_varied(n, k, static_cast<uint32_t>(n + k), 0.02f));
        // The on-disk format, as `gptoss convert --to fp8` writes it.
        std::vector<uint8_t> q(static_cast<size_t>(n) * k);
        std::vector<float> s(static_cast<size_t>((n + 127) / 128) * ((k + 127) / 128));
        model::quantize_fp8_blocks(w.data(), n, k, q.data(), s.data());
        std::vector<uint8_t> want_q;
        std::vector<float> want_s;
        cpu_pad_weight(q, s, n, k, k_pad, want_q, want_s);

        DeviceBuffer dq = test::to_device(q), ds = test::to_device(s), dw = test::to_device(test::to_bf16(w));
        const Fp8Weight from_blocks = Fp8Weight::from_fp8_blocks(dq.as<uint8_t>(), ds.as<float>(), n, k, nullptr);
        const Fp8Weight from_bf16 = Fp8Weight::from_bf16(dw.get(), n, k, nullptr);
        for (const Fp8Weight* fw : {&from_blocks, &from_bf16}) {
            const char* what = fw == &from_blocks ? "from_fp8_blocks" : "from_bf16";
            ASSERT_EQ(fw->k_pad, k_pad);
            const auto got_q = test::to_host<uint8_t>(fw->q, want_q.size());
            const auto got_s = test::to_host<float>(fw->scales, want_s.size());
            const size_t iq = first_mismatch(got_q, want_q), is = first_mismatch(got_s, want_s);
            EXPECT_EQ(iq, want_q.size()) << what << " n " << n << " k " << k << ": byte [" << iq / k_pad << ", "
                                         << iq % k_pad << "] got " << int(got_q[iq]) << " want " << int(want_q[iq]);
            EXPECT_EQ(is, want_s.size()) << what << " n " << n << " k " << k << ": scale " << is << " got " << got_s[is]
                                         << " want " << want_s[is];
        }
    }
}

// quantize_weight_fp8_mxfp4 (a layer's experts straight from MXFP4, as the 120b prefill converts
// them a layer at a time) against the load-time conversion (mxfp4_to_bf16, then
// quantize_weight_fp8_bf16 per expert): the same bytes and scales in every K block that holds
// columns, experts without rows untouched. Group scales spread over 2^-12 .. 2^6 inside a block,
// so some blocks lose their smallest values to e4m3's range: those must round alike too. And the
// conversion is lossless wherever the value over its block scale stays ≥ 2^-6 (e4m3's normal
// range; e2m1 has one mantissa bit against e4m3's three).
TEST(CudaFp8Gemm, Mxfp4LayerConversionMatchesLoadPath) {
    REQUIRE_GPU();
    for (auto [E, n, k] : {std::tuple<int, int, int>{3, 200, 2880}, {2, 256, 96}, {4, 5760, 2880}}) {
        const int k_pad = fp8_gemm_k_pad(k), nbs = (n + 127) / 128, kbp = k_pad / 128, kbs = (k + 127) / 128;
        std::vector<uint8_t> blocks(static_cast<size_t>(E) * n * k / 2), scales(static_cast<size_t>(E) * n * k / 32);
        uint32_t st = static_cast<uint32_t>(E * 7919 + n * 31 + k);
        auto next = [&] {
            st = st * 1664525u + 1013904223u;
            return st >> 8;
        };
        for (auto& b : blocks) b = static_cast<uint8_t>(next());
        for (auto& sc : scales) sc = static_cast<uint8_t>(115 + next() % 19);  // 2^-12 .. 2^6
        // Expert 1 has no rows: it must be skipped.
        std::vector<int32_t> offsets(E + 1);
        for (int e = 0; e <= E; ++e) offsets[e] = e < 2 ? 5 * e : 5 + 7 * (e - 1);
        offsets[2] = offsets[1];
        DeviceBuffer db = test::to_device(blocks), ds = test::to_device(scales), doff = test::to_device(offsets);
        const size_t qn = static_cast<size_t>(E) * n * k_pad, sn = static_cast<size_t>(E) * nbs * kbp;
        DeviceBuffer jq(qn), js(sn * 4), lq(qn), ls(sn * 4), tmp(static_cast<size_t>(n) * k * 2);
        CUDA_CHECK(cudaMemset(jq.get(), 0xEE, qn));
        CUDA_CHECK(cudaMemset(js.get(), 0xEE, sn * 4));
        quantize_weight_fp8_mxfp4(db.as<uint8_t>(), ds.as<uint8_t>(), E, n, k, k_pad, doff.as<int32_t>(),
                                  jq.as<uint8_t>(), js.as<float>(), nullptr);
        for (int e = 0; e < E; ++e) {
            mxfp4_to_bf16(db.as<uint8_t>() + static_cast<size_t>(e) * n * k / 2,
                          ds.as<uint8_t>() + static_cast<size_t>(e) * n * k / 32, n, k, tmp.get(), nullptr);
            quantize_weight_fp8_bf16(tmp.get(), n, k, k_pad, lq.as<uint8_t>() + static_cast<size_t>(e) * n * k_pad,
                                     ls.as<float>() + static_cast<size_t>(e) * nbs * kbp, nullptr);
        }
        const auto gq = test::to_host<uint8_t>(jq, qn), wq = test::to_host<uint8_t>(lq, qn);
        const auto gs = test::to_host<float>(js, sn), ws = test::to_host<float>(ls, sn);
        int64_t bad_q = 0, bad_s = 0, untouched_bad = 0, lossy = 0, checked = 0;
        for (int e = 0; e < E; ++e) {
            const bool skipped = offsets[e + 1] == offsets[e];
            for (int r = 0; r < n; ++r)
                for (int c = 0; c < kbs * 128; ++c) {
                    const size_t i = (static_cast<size_t>(e) * n + r) * k_pad + c;
                    if (skipped) {
                        untouched_bad += gq[i] != 0xEE;
                        continue;
                    }
                    bad_q += gq[i] != wq[i];
                    if (c >= k) continue;
                    const size_t bi = (static_cast<size_t>(e) * n + r) * (k / 2) + c / 2;
                    const uint8_t code = static_cast<uint8_t>((blocks[bi] >> (4 * (c & 1))) & 15);
                    const float want = mxfp4_value(code, scales[(static_cast<size_t>(e) * n + r) * (k / 32) + c / 32]);
                    const float bs = gs[(static_cast<size_t>(e) * nbs + r / 128) * kbp + c / 128];
                    if (std::fabs(want) >= std::ldexp(bs, -6)) {
                        ++checked;
                        lossy += fp8e4m3_to_f32(gq[i]) * bs != want;
                    }
                }
            for (int b = 0; b < nbs; ++b)
                for (int kb = 0; kb < kbs; ++kb) {
                    const size_t i = (static_cast<size_t>(e) * nbs + b) * kbp + kb;
                    uint32_t bits;
                    std::memcpy(&bits, &gs[i], 4);
                    if (skipped)
                        untouched_bad += bits != 0xEEEEEEEEu;
                    else
                        bad_s += gs[i] != ws[i];
                }
        }
        std::printf(
            "  mxfp4 -> fp8 (E %d, n %d, k %d): %lld bytes differ, %lld scales differ, %lld of %lld "
            "normal-range values not exact\n",
            E, n, k, static_cast<long long>(bad_q), static_cast<long long>(bad_s), static_cast<long long>(lossy),
            static_cast<long long>(checked));
        EXPECT_EQ(bad_q, 0);
        EXPECT_EQ(bad_s, 0);
        EXPECT_EQ(untouched_bad, 0);
        EXPECT_EQ(lossy, 0);
        EXPECT_GT(checked, static_cast<int64_t>(E - 1) * n * k / 4);
    }
}

TEST(CudaFp8Gemm, ReferenceKernelMatchesCpuOnDequantizedOperands) {
    REQUIRE_GPU();
    for (auto [m, n, k, with_bias] :
         {std::tuple<int, int, int, bool>{37, 300, 700, true}, {2, 129, 2880, false}, {64, 256, 4096, true}}) {
        const int k_pad = fp8_gemm_k_pad(k), m_pad = fp8_gemm_m_pad(m);
        const std::vector<float> x = block_varied(m, k, static_cast<uint32_t>(m + 1), 1.0f);
        const std::vector<float> w = test::bf16_round(block_varied(n, k, static_cast<uint32_t>(n + 2), 0.02f));
        const std::vector<uint16_t> bias = test::to_bf16(test::randn(static_cast<size_t>(n), 9, 0.5f));
        DeviceBuffer dx = test::to_device(x), dw = test::to_device(test::to_bf16(w)), db = test::to_device(bias);
        DeviceBuffer xq(static_cast<size_t>(m_pad) * k_pad), xs(static_cast<size_t>(k_pad / 128) * m_pad * 4);
        quantize_act_fp8(dx.as<float>(), m, k, k_pad, xq.as<uint8_t>(), xs.as<float>(), nullptr);
        const Fp8Weight fw = Fp8Weight::from_bf16(dw.get(), n, k, nullptr);
        DeviceBuffer y = test::poisoned(static_cast<size_t>(m_pad) * n * 4);
        fp8_gemm_reference(xq.as<uint8_t>(), xs.as<float>(), fw, with_bias ? db.get() : nullptr, y.as<float>(), m,
                           nullptr);
        const auto got = test::to_host<float>(y, static_cast<size_t>(m) * n);

        // CPU: dequantize what the GPU produced (the quantizers are tested bit-exactly above), GEMM in double.
        const auto hq = test::to_host<uint8_t>(xq, static_cast<size_t>(m_pad) * k_pad);
        const auto hs = test::to_host<float>(xs, static_cast<size_t>(k_pad / 128) * m_pad);
        const auto wq = test::to_host<uint8_t>(fw.q, static_cast<size_t>(n) * k_pad);
        const auto ws = test::to_host<float>(fw.scales, static_cast<size_t>((n + 127) / 128) * (k_pad / 128));
        std::vector<double> xd(static_cast<size_t>(m) * k_pad), wd(static_cast<size_t>(n) * k_pad);
        for (int r = 0; r < m; ++r)
            for (int kk = 0; kk < k_pad; ++kk)
                xd[static_cast<size_t>(r) * k_pad + kk] =
                    static_cast<double>(fp8e4m3_to_f32(hq[static_cast<size_t>(r) * k_pad + kk])) *
                    hs[static_cast<size_t>(kk / 128) * m_pad + r];
        for (int c = 0; c < n; ++c)
            for (int kk = 0; kk < k_pad; ++kk)
                wd[static_cast<size_t>(c) * k_pad + kk] =
                    static_cast<double>(fp8e4m3_to_f32(wq[static_cast<size_t>(c) * k_pad + kk])) *
                    ws[static_cast<size_t>(c / 128) * (k_pad / 128) + kk / 128];
        std::vector<float> ref(static_cast<size_t>(m) * n);
        for (int r = 0; r < m; ++r)
            for (int c = 0; c < n; ++c) {
                double acc = with_bias ? bf16_to_f32(bias[c]) : 0.0;
                for (int kk = 0; kk < k_pad; ++kk)
                    acc += xd[static_cast<size_t>(r) * k_pad + kk] * wd[static_cast<size_t>(c) * k_pad + kk];
                ref[static_cast<size_t>(r) * n + c] = static_cast<float>(acc);
            }
        EXPECT_TRUE(close(got, ref, test::kTolF32, "fp8_gemm_reference vs CPU"));
    }
}

TEST(CudaFp8Gemm, CublasLtMatchesReferenceOnGptOssShapes) {
    REQUIRE_GPU();
    Fp8GemmRunner runner;
    // (n, k): fused QKV (5120 × 2880), attention out (2880 × 4096), expert gate_up (5760 × 2880) and
    // down (2880 × 2880); K padded to 3072 / 4096.
    for (auto [n, k] : {std::pair<int, int>{5120, 2880}, {2880, 4096}, {5760, 2880}, {2880, 2880}}) {
        const int k_pad = fp8_gemm_k_pad(k);
        ASSERT_EQ(k_pad, k == 4096 ? 4096 : 3072);
        DeviceBuffer dw = test::to_device(test::to_bf16(block_varied(n, k, static_cast<uint32_t>(n ^ k), 0.02f)));
        const Fp8Weight fw = Fp8Weight::from_bf16(dw.get(), n, k, nullptr);
        DeviceBuffer db = test::to_device(test::to_bf16(test::randn(static_cast<size_t>(n), 3, 0.5f)));
        for (int m : {2, 16, 128, 1000}) {
            const int m_pad = fp8_gemm_m_pad(m);
            DeviceBuffer dx = test::to_device(block_varied(m, k, static_cast<uint32_t>(m * 13 + n), 1.0f));
            DeviceBuffer xq(static_cast<size_t>(m_pad) * k_pad), xs(static_cast<size_t>(k_pad / 128) * m_pad * 4);
            quantize_act_fp8(dx.as<float>(), m, k, k_pad, xq.as<uint8_t>(), xs.as<float>(), nullptr);
            for (bool with_bias : {false, true}) {
                const void* bias = with_bias ? db.get() : nullptr;
                DeviceBuffer y_ref = test::poisoned(static_cast<size_t>(m_pad) * n * 4);
                DeviceBuffer y = test::poisoned(static_cast<size_t>(m_pad) * n * 4);
                fp8_gemm_reference(xq.as<uint8_t>(), xs.as<float>(), fw, bias, y_ref.as<float>(), m, nullptr);
                const Status st = runner.gemm(xq.as<uint8_t>(), xs.as<float>(), fw, bias, y.as<float>(), m, nullptr);
                ASSERT_TRUE(st.ok()) << "m " << m << " n " << n << " k " << k << ": " << st.to_string();
                const auto got = test::to_host<float>(y, static_cast<size_t>(m) * n);
                const auto ref = test::to_host<float>(y_ref, static_cast<size_t>(m) * n);
                const std::string what = "cuBLASLt fp8 m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                                         std::to_string(k) + (with_bias ? " +bias" : "");
                EXPECT_TRUE(close(got, ref, kTolFp8Accum, what.c_str()));
                // bf16 outputs (y_bf16): the reference's are its fp32 results rounded (same
                // arithmetic, bit for bit); cuBLASLt's, where it has an algorithm (the model falls
                // back to the reference where it has none: reported, not failed), within the FP8
                // accumulation bound plus the rounding (kTolBf16Out: 2^-9 relative).
                DeviceBuffer y16_ref = test::poisoned(static_cast<size_t>(m_pad) * n * 2);
                DeviceBuffer y16 = test::poisoned(static_cast<size_t>(m_pad) * n * 2);
                fp8_gemm_reference(xq.as<uint8_t>(), xs.as<float>(), fw, bias, y16_ref.get(), m, nullptr, true);
                const auto ref16 = test::to_host<uint16_t>(y16_ref, static_cast<size_t>(m) * n);
                size_t differ = 0;
                for (size_t i = 0; i < ref16.size(); ++i) differ += ref16[i] != f32_to_bf16(ref[i]);
                EXPECT_EQ(differ, 0u) << what << ": the reference's bf16 output is not its fp32 one rounded";
                const Status st16 =
                    runner.gemm(xq.as<uint8_t>(), xs.as<float>(), fw, bias, y16.get(), m, nullptr, true);
                if (!st16.ok()) {
                    std::printf("  %s, bf16 out: no cuBLASLt algorithm (%s)\n", what.c_str(), st16.to_string().c_str());
                    continue;
                }
                const auto got16 = test::from_bf16(test::to_host<uint16_t>(y16, static_cast<size_t>(m) * n));
                EXPECT_TRUE(close(got16, ref, test::kTolBf16Out, (what + " bf16 out").c_str()));
            }
        }
    }
    // Below two rows cuBLASLt refuses (measured): an answer, not a crash.
    DeviceBuffer dw_small = test::to_device(test::to_bf16(test::randn(128 * 512, 4)));
    const Fp8Weight fw = Fp8Weight::from_bf16(dw_small.get(), 128, 512, nullptr);
    DeviceBuffer xq(4 * 512), xs(4 * 4 * 4), y(4 * 128 * 4);
    const Status st = runner.gemm(xq.as<uint8_t>(), xs.as<float>(), fw, nullptr, y.as<float>(), 1, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
}

TEST(CudaFp8Gemm, QuantizationErrorAgainstBf16GemmIsAFewPercent) {
    REQUIRE_GPU();
    const int m = 256, n = 2880, k = 2880, k_pad = fp8_gemm_k_pad(k), m_pad = fp8_gemm_m_pad(m);
    const std::vector<uint16_t> x = test::to_bf16(test::randn(static_cast<size_t>(m) * k, 21));
    const std::vector<uint16_t> w = test::to_bf16(test::randn(static_cast<size_t>(n) * k, 22, 0.02f));
    DeviceBuffer dx = test::to_device(x), dw = test::to_device(w);

    // bf16 baseline: cuBLASLt bf16 with fp32 accumulation (its own error, ~1e-6, is negligible here).
    GemmRunner bf16_runner;
    DeviceBuffer y_bf16(static_cast<size_t>(m) * n * 4);
    bf16_runner.gemm(dx.get(), dw.get(), y_bf16.get(), GemmOut::kF32, m, n, k, nullptr);

    DeviceBuffer xq(static_cast<size_t>(m_pad) * k_pad), xs(static_cast<size_t>(k_pad / 128) * m_pad * 4);
    quantize_act_fp8_bf16(dx.get(), m, k, k_pad, xq.as<uint8_t>(), xs.as<float>(), nullptr);
    const Fp8Weight fw = Fp8Weight::from_bf16(dw.get(), n, k, nullptr);
    Fp8GemmRunner runner;
    DeviceBuffer y_fp8 = test::poisoned(static_cast<size_t>(m_pad) * n * 4);
    const Status st = runner.gemm(xq.as<uint8_t>(), xs.as<float>(), fw, nullptr, y_fp8.as<float>(), m, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();

    const auto ref = test::to_host<float>(y_bf16, static_cast<size_t>(m) * n);
    const auto got = test::to_host<float>(y_fp8, static_cast<size_t>(m) * n);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
        den += static_cast<double>(ref[i]) * ref[i];
    }
    const double rel = std::sqrt(num / den);
    std::printf("  fp8 vs bf16 GEMM (m %d n %d k %d): relative L2 %.4f (expected ~0.0375)\n", m, n, k, rel);
    EXPECT_GT(rel, kFp8VsBf16RelL2Min) << "suspiciously exact: is the fp8 path quantizing?";
    EXPECT_LT(rel, kFp8VsBf16RelL2Max);
}

}  // namespace
}  // namespace gptoss::kernels::cuda
