// CUDA ops against their CPU references (kernels/cpu) on fresh random inputs, over gpt-oss shapes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "kernels/mxfp4_bits.h"
#include "kernels/ops.h"
#include "runtime/sampler.h"

namespace gptoss::test {
namespace {

namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;
using kc::DeviceBuffer;

// Rows of a bf16 table as fp32, exactly: the 16-byte form (hidden % 8 == 0) at gpt-oss's 2,880 and
// the 2-byte form at widths it does not take (36: not a multiple of 8), ids repeated and out of order.
TEST(CudaOps, EmbeddingCopiesTheTableRows) {
    REQUIRE_GPU();
    for (int H : {2880, 64, 36}) {
        const int V = 50, T = 97;
        const auto table = to_bf16(randn(static_cast<size_t>(V) * H, 7 + H));
        std::vector<int32_t> ids(T);
        for (int t = 0; t < T; ++t) ids[t] = (t * 37 + 11) % V;
        auto dt = to_device(table), di = to_device(ids);
        auto dx = poisoned(static_cast<size_t>(T) * H * 4);
        kc::embedding(di.as<int32_t>(), T, dt.get(), H, dx.as<float>(), nullptr);
        const auto got = to_host<float>(dx, static_cast<size_t>(T) * H);
        std::vector<float> ref(got.size());
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < H; ++i)
                ref[static_cast<size_t>(t) * H + i] = bf16_to_f32(table[static_cast<size_t>(ids[t]) * H + i]);
        EXPECT_EQ(got, ref) << "hidden " << H;
    }
}

TEST(CudaOps, ResidualRmsNorm) {
    REQUIRE_GPU();
    // T = 300: the wide prefill kernel (≥ 64 tokens); K = 0: no residual add (only the norm);
    // K = -4: four adds held as bf16 (add_bf16, moe_fp8's y), the reference on the same values;
    // K = -1: one bf16 add without weights (the bf16 output projection, GPTOSS_GEMM_BF16_OUT);
    // K = 6 / -6: past the 4 adds the kernels hold in registers (fp32 / bf16); K = 3: three adds
    // without a bias.
    for (int T : {1, 7, 300}) {
        for (int Ks : {0, 1, 4, -4, -1, 6, -6, 3}) {
            const int H = 2880, K = std::abs(Ks);
            const bool add_bf16 = Ks < 0, unweighted = Ks == -1, no_bias = Ks == 3;
            auto x = randn(static_cast<size_t>(T) * H, 1 + T + K);
            auto add = randn(static_cast<size_t>(T) * std::max(K, 1) * H, 2 + T);
            if (add_bf16) add = bf16_round(add);
            auto w = randn(static_cast<size_t>(T) * std::max(K, 1), 3 + T, 0.3f, 0.5f);
            if (unweighted) std::fill(w.begin(), w.end(), 1.0f);
            auto bias = randn(H, 4, 0.1f);
            if (no_bias) std::fill(bias.begin(), bias.end(), 0.0f);
            auto gain = randn(H, 5, 0.2f, 1.0f);
            // Reference: x += Σ w·add + bias, then rmsnorm.
            std::vector<float> xr = x;
            for (int t = 0; t < T; ++t)
                for (int i = 0; i < H; ++i) {
                    float acc = K > 0 ? bias[i] : 0.0f;
                    for (int k = 0; k < K; ++k) acc += w[t * K + k] * add[(static_cast<size_t>(t) * K + k) * H + i];
                    xr[static_cast<size_t>(t) * H + i] += acc;
                }
            std::vector<float> ref(xr.size());
            cpu::rmsnorm({xr.data(), gain.data(), ref.data(), T, H, 1e-5f});
            auto dx = to_device(x), dadd = add_bf16 ? to_device(to_bf16(add)) : to_device(add), dw = to_device(w),
                 db = to_device(bias), dg = to_device(gain);
            auto out = poisoned(xr.size() * 2);
            auto out32 = poisoned(xr.size() * 4);
            kc::ResidualRmsNormArgs a;
            a.x = dx.as<float>();
            a.add = K > 0 ? dadd.as<float>() : nullptr;
            a.add_bf16 = add_bf16;
            a.add_weights = unweighted ? nullptr : dw.as<float>();
            a.add_bias = no_bias ? nullptr : db.as<float>();
            a.num_add = K;
            a.weight = dg.as<float>();
            a.out = out.get();
            a.out_f32 = out32.as<float>();
            a.num_tokens = T;
            a.hidden_size = H;
            kc::residual_rmsnorm(a, nullptr);
            EXPECT_TRUE(close(to_host<float>(dx, xr.size()), xr, kTolF32, "residual"));
            EXPECT_TRUE(close(to_host<float>(out32, ref.size()), ref, kTolF32, "rmsnorm f32"));
            EXPECT_TRUE(close(from_bf16(to_host<uint16_t>(out, ref.size())), ref, kTolBf16Out, "rmsnorm bf16"));
        }
    }
}

// The norm's rows quantized for an FP8 GEMM (ResidualRmsNormArgs::out_q): the bytes and scales of
// quantize_act_fp8_bf16 on its bf16 rows, bit for bit, padding rows (q_m_pad) and columns (q_k_pad)
// included; in the wide kernel (≥ 64 tokens, also without out) and through the quantizer after the
// norm (fewer tokens). The residual update is the same either way.
// A prefill norm's inputs: T rows of x (magnitudes varying by row: different quantizer scales),
// K bf16 expert rows a token with their weights, the gain, optionally the bias; seeds seed + 0..4.
// `a` points at the device copies (x and the outputs are the caller's).
struct NormInputs {
    std::vector<float> x;
    DeviceBuffer dadd, dw, db, dg;
    kc::ResidualRmsNormArgs a;
};
NormInputs norm_inputs(int T, int H, int K, uint64_t seed, bool with_bias) {
    NormInputs n;
    n.x = randn(static_cast<size_t>(T) * H, seed + T);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) n.x[static_cast<size_t>(t) * H + i] *= std::ldexp(1.0f, t % 9 - 4);
    n.dadd = to_device(to_bf16(bf16_round(randn(static_cast<size_t>(T) * K * H, seed + 1 + T))));
    n.dw = to_device(randn(static_cast<size_t>(T) * K, seed + 2 + T, 0.3f, 0.5f));
    if (with_bias) n.db = to_device(randn(H, seed + 3, 0.1f));
    n.dg = to_device(randn(H, seed + 4, 0.2f, 1.0f));
    n.a.add = n.dadd.as<float>();
    n.a.add_bf16 = true;
    n.a.add_weights = n.dw.as<float>();
    n.a.add_bias = with_bias ? n.db.as<float>() : nullptr;
    n.a.num_add = K;
    n.a.weight = n.dg.as<float>();
    n.a.num_tokens = T;
    n.a.hidden_size = H;
    return n;
}

TEST(CudaOps, ResidualRmsNormQuantizesLikeTheGemmQuantizer) {
    REQUIRE_GPU();
    const int H = 2880, K = 4, k_pad = kc::fp8_gemm_k_pad(H);
    for (int T : {5, 64, 301}) {
        const int m_pad = kc::fp8_gemm_m_pad(T);
        NormInputs in = norm_inputs(T, H, K, 31, true);
        const std::vector<float>& x = in.x;
        kc::ResidualRmsNormArgs a = in.a;
        // Reference: the norm, then the GEMM's quantizer on its bf16 rows.
        auto x_ref = to_device(x);
        auto out = poisoned(static_cast<size_t>(T) * H * 2);
        a.x = x_ref.as<float>();
        a.out = out.get();
        kc::residual_rmsnorm(a, nullptr);
        auto q_ref = poisoned(static_cast<size_t>(m_pad) * k_pad);
        auto s_ref = poisoned(static_cast<size_t>(k_pad / 128) * m_pad * 4);
        kc::quantize_act_fp8_bf16(out.get(), T, H, k_pad, q_ref.as<uint8_t>(), s_ref.as<float>(), nullptr);
        // With out_q, and (where the norm fuses it) without out.
        for (bool with_out : {true, false}) {
            auto x_q = to_device(x);
            auto out2 = poisoned(static_cast<size_t>(T) * H * 2);
            auto q = poisoned(static_cast<size_t>(m_pad) * k_pad);
            auto sc = poisoned(static_cast<size_t>(k_pad / 128) * m_pad * 4);
            kc::ResidualRmsNormArgs b = a;
            b.x = x_q.as<float>();
            b.out = with_out ? out2.get() : nullptr;
            b.out_q = q.as<uint8_t>();
            b.out_q_scale = sc.as<float>();
            b.q_k_pad = k_pad;
            b.q_m_pad = m_pad;
            if (!with_out && !kc::residual_rmsnorm_fuses_quant(b)) continue;  // needs out
            EXPECT_EQ(kc::residual_rmsnorm_fuses_quant(b), T >= 64) << "T=" << T;
            kc::residual_rmsnorm(b, nullptr);
            EXPECT_EQ(to_host<uint8_t>(q, q_ref.bytes()), to_host<uint8_t>(q_ref, q_ref.bytes()))
                << "T=" << T << (with_out ? "" : " without out");
            EXPECT_EQ(to_host<float>(sc, s_ref.bytes() / 4), to_host<float>(s_ref, s_ref.bytes() / 4))
                << "T=" << T << (with_out ? "" : " without out");
            EXPECT_EQ(to_host<float>(x_q, x.size()), to_host<float>(x_ref, x.size())) << "residual, T=" << T;
            if (with_out) {
                EXPECT_EQ(to_host<uint16_t>(out2, x.size()), to_host<uint16_t>(out, x.size())) << "out, T=" << T;
            }
        }
    }
}

// ResidualRmsNormArgs::out_row_q: the bytes moe_fp8_quant_rows(out, by_token = false) writes, in
// the norm (T >= 64, also without out where the norm fuses out_q) or after it; then
// moe_fp8_gather_rows of those rows equals moe_fp8_quant_rows(out, by_token = true) (and the MX
// order's _mx form) byte for byte.
TEST(CudaOps, ResidualRmsNormRowQuantAndGatherMatchTheMoeQuantizer) {
    REQUIRE_GPU();
    const int H = 2880, K = 4, k_pad = kc::fp8_gemm_k_pad(H), H_pad = (H + 127) / 128 * 128;
    for (int T : {5, 64, 301}) {
        const int m_pad = kc::fp8_gemm_m_pad(T), A = T * K;
        NormInputs in = norm_inputs(T, H, K, 41, false);
        const std::vector<float>& x = in.x;
        kc::ResidualRmsNormArgs a = in.a;
        auto x_ref = to_device(x);
        auto out = poisoned(static_cast<size_t>(T) * H * 2);
        a.x = x_ref.as<float>();
        a.out = out.get();
        kc::residual_rmsnorm(a, nullptr);
        auto q_ref = poisoned(static_cast<size_t>(T) * H), s_ref = poisoned(static_cast<size_t>(T) * 4);
        kc::moe_fp8_quant_rows(out.get(), false, nullptr, 1, T, H, q_ref.as<uint8_t>(), s_ref.as<float>(), nullptr);
        // mode 0: with out; 1: without out, with the fused GEMM quantization (out_q); 2: without
        // either (the rows are the norm's only output). 1 and 2 only where the norm kernel writes
        // the rows itself (T >= 64).
        for (int mode : {0, 1, 2}) {
            const bool with_out = mode == 0;
            auto x_q = to_device(x);
            auto out2 = poisoned(static_cast<size_t>(T) * H * 2);
            auto rq = poisoned(static_cast<size_t>(T) * H), rs = poisoned(static_cast<size_t>(T) * 4);
            auto gq = poisoned(static_cast<size_t>(m_pad) * k_pad);
            auto gs = poisoned(static_cast<size_t>(k_pad / 128) * m_pad * 4);
            kc::ResidualRmsNormArgs b = a;
            b.x = x_q.as<float>();
            b.out = with_out ? out2.get() : nullptr;
            b.out_row_q = rq.as<uint8_t>();
            b.out_row_scale = rs.as<float>();
            if (mode == 1) {
                b.out_q = gq.as<uint8_t>();
                b.out_q_scale = gs.as<float>();
                b.q_k_pad = k_pad;
                b.q_m_pad = m_pad;
            }
            EXPECT_EQ(kc::residual_rmsnorm_fuses_row_q(b), T >= 64) << "T=" << T << " mode " << mode;
            if (!with_out && !kc::residual_rmsnorm_fuses_row_q(b)) continue;  // needs out
            kc::residual_rmsnorm(b, nullptr);
            EXPECT_EQ(to_host<uint8_t>(rq, q_ref.bytes()), to_host<uint8_t>(q_ref, q_ref.bytes()))
                << "T=" << T << " mode " << mode;
            EXPECT_EQ(to_host<float>(rs, T), to_host<float>(s_ref, T)) << "T=" << T << " mode " << mode;
            EXPECT_EQ(to_host<float>(x_q, x.size()), to_host<float>(x_ref, x.size())) << "residual, T=" << T;
        }
        // The gather: a shuffled assignment order (sorted[i] / K is row i's token).
        std::vector<int32_t> sorted(A);
        for (int i = 0; i < A; ++i) sorted[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + 13) % A);
        auto dsorted = to_device(sorted);
        for (bool mx : {false, true}) {
            const int dp = mx ? H_pad : H;
            auto ref_q = poisoned(static_cast<size_t>(A) * dp), ref_s = poisoned(static_cast<size_t>(A) * 4);
            auto got_q = poisoned(static_cast<size_t>(A) * dp), got_s = poisoned(static_cast<size_t>(A) * 4);
            if (mx)
                kc::moe_fp8_quant_rows_mx(out.get(), true, dsorted.as<int32_t>(), K, A, H, H_pad, ref_q.as<uint8_t>(),
                                          ref_s.as<float>(), nullptr);
            else
                kc::moe_fp8_quant_rows(out.get(), true, dsorted.as<int32_t>(), K, A, H, ref_q.as<uint8_t>(),
                                       ref_s.as<float>(), nullptr);
            kc::moe_fp8_gather_rows(q_ref.as<uint8_t>(), s_ref.as<float>(), dsorted.as<int32_t>(), K, A, H, mx, dp,
                                    got_q.as<uint8_t>(), got_s.as<float>(), nullptr);
            EXPECT_EQ(to_host<uint8_t>(got_q, ref_q.bytes()), to_host<uint8_t>(ref_q, ref_q.bytes()))
                << "gather T=" << T << (mx ? " mx" : "");
            EXPECT_EQ(to_host<float>(got_s, A), to_host<float>(ref_s, A))
                << "gather scales T=" << T << (mx ? " mx" : "");
        }
    }
}

TEST(CudaOps, QkvBiasRopeKvWrite) {
    REQUIRE_GPU();
    // head_dim 64 (gpt-oss: the kernel specialised for it) and 32 (the generic instantiation).
    for (const int hd : {64, 32}) {
        const int nq = 64, nkv = 8, bs = 16, nblocks = 64;
        const int width = (nq + 2 * nkv) * hd;
        std::vector<float> inv_freq(hd / 2);
        cpu::YarnParams yp;
        const float scaling = cpu::yarn_inv_freq(yp, hd, inv_freq.data());
        for (int T : {1, 5, 200}) {
            auto qkv = randn(static_cast<size_t>(T) * width, 10 + T);
            auto bias = randn(width, 11, 0.1f);
            std::vector<int32_t> pos(T), slots(T);
            std::mt19937 rng(T);
            for (int t = 0; t < T; ++t) {
                pos[t] = static_cast<int32_t>(rng() % 131072);
                slots[t] = t % 3 == 2 ? -1 : static_cast<int32_t>((t * 7919) % (nblocks * bs));  // some skipped
            }
            // CPU reference on (qkv + bias).
            std::vector<float> q(static_cast<size_t>(T) * nq * hd), k(static_cast<size_t>(T) * nkv * hd), v(k.size());
            for (int t = 0; t < T; ++t) {
                for (int i = 0; i < nq * hd; ++i)
                    q[t * nq * hd + i] = qkv[static_cast<size_t>(t) * width + i] + bias[i];
                for (int i = 0; i < nkv * hd; ++i) {
                    k[t * nkv * hd + i] = qkv[static_cast<size_t>(t) * width + nq * hd + i] + bias[nq * hd + i];
                    v[t * nkv * hd + i] =
                        qkv[static_cast<size_t>(t) * width + (nq + nkv) * hd + i] + bias[(nq + nkv) * hd + i];
                }
            }
            std::vector<float> kc_ref(static_cast<size_t>(nblocks) * bs * nkv * hd, 0.0f), vc_ref(kc_ref.size(), 0.0f);
            kernels::RopeKvWriteArgs r;
            r.q = q.data();
            r.k = k.data();
            r.v = v.data();
            r.positions = pos.data();
            r.slot_mapping = slots.data();
            r.inv_freq = inv_freq.data();
            r.attention_scaling = scaling;
            r.k_cache = kc_ref.data();
            r.v_cache = vc_ref.data();
            r.num_tokens = T;
            r.num_heads = nq;
            r.num_kv_heads = nkv;
            r.head_dim = hd;
            r.block_size = bs;
            cpu::rope_kv_write(r);

            auto dqkv = to_device(qkv), db = to_device(bias), dpos = to_device(pos), dslots = to_device(slots),
                 dfreq = to_device(inv_freq);
            auto dq = poisoned(q.size() * 2);
            DeviceBuffer dk(kc_ref.size() * 2), dv(kc_ref.size() * 2);
            cudaMemset(dk.get(), 0, dk.bytes());
            cudaMemset(dv.get(), 0, dv.bytes());
            kc::QkvRopeArgs a;
            a.qkv = dqkv.as<float>();
            a.bias = db.as<float>();
            a.positions = dpos.as<int32_t>();
            a.slot_mapping = dslots.as<int32_t>();
            a.inv_freq = dfreq.as<float>();
            a.attention_scaling = scaling;
            a.q_out = dq.get();
            a.k_cache = dk.get();
            a.v_cache = dv.get();
            a.num_tokens = T;
            a.num_heads = nq;
            a.num_kv_heads = nkv;
            a.head_dim = hd;
            kc::qkv_bias_rope_kv_write(a, nullptr);
            // Angles up to 131072 rad: fp32 sincos on both sides of the same fp32 angle; bf16 outputs.
            EXPECT_TRUE(close(from_bf16(to_host<uint16_t>(dq, q.size())), q, kTolBf16Out, "rope q"));
            EXPECT_TRUE(close(from_bf16(to_host<uint16_t>(dk, kc_ref.size())), kc_ref, kTolBf16Out, "k cache"));
            EXPECT_TRUE(close(from_bf16(to_host<uint16_t>(dv, vc_ref.size())), vc_ref, kTolBf16Out, "v cache"));

            // The FP8 (e4m3) cache: each byte is the e4m3 rounding of the CPU's value, or (where the GPU's
            // fp32 value sits across a rounding boundary from the CPU's: sincos and summation order differ
            // in the last bits) its neighbouring code; the latter on ≤ 0.1% of the bytes.
            DeviceBuffer dk8(kc_ref.size()), dv8(kc_ref.size());
            cudaMemset(dk8.get(), 0, dk8.bytes());
            cudaMemset(dv8.get(), 0, dv8.bytes());
            a.k_cache = dk8.get();
            a.v_cache = dv8.get();
            a.kv_fp8 = true;
            kc::qkv_bias_rope_kv_write(a, nullptr);
            size_t off_by_one = 0;
            for (const auto& [dev, ref] : {std::pair{&dk8, &kc_ref}, {&dv8, &vc_ref}}) {
                const auto got = to_host<uint8_t>(*dev, ref->size());
                for (size_t i = 0; i < got.size(); ++i) {
                    const uint8_t want = f32_to_fp8e4m3((*ref)[i]);
                    if (got[i] == want) continue;
                    ++off_by_one;
                    const int mg = got[i] & 0x7f, mw = want & 0x7f;
                    const bool near = ((got[i] ^ want) & 0x80) == 0 ? std::abs(mg - mw) <= 1 : mg + mw <= 1;
                    ASSERT_TRUE(near) << "fp8 cache byte " << i << ": " << int(got[i]) << " for " << (*ref)[i];
                }
            }
            EXPECT_LE(off_by_one * 1000, 2 * kc_ref.size()) << off_by_one << " neighbouring codes";

            // qkv as bf16 (QkvRopeArgs::qkv_bf16, the FP8 GEMM's bf16 output): on bf16-representable
            // values, the same bits as from fp32 rows holding them.
            const std::vector<float> qkv_r = bf16_round(qkv);
            auto dqkv_r = to_device(qkv_r), dqkv16 = to_device(to_bf16(qkv_r));
            std::vector<std::vector<uint16_t>> outs;
            for (bool in_bf16 : {false, true}) {
                auto q_o = poisoned(q.size() * 2);
                DeviceBuffer k_o(kc_ref.size() * 2), v_o(kc_ref.size() * 2);
                cudaMemset(k_o.get(), 0, k_o.bytes());
                cudaMemset(v_o.get(), 0, v_o.bytes());
                a.qkv = in_bf16 ? dqkv16.get() : dqkv_r.get();
                a.qkv_bf16 = in_bf16;
                a.q_out = q_o.get();
                a.k_cache = k_o.get();
                a.v_cache = v_o.get();
                a.kv_fp8 = false;
                kc::qkv_bias_rope_kv_write(a, nullptr);
                for (auto* b : {&q_o, &k_o, &v_o}) outs.push_back(to_host<uint16_t>(*b, b->bytes() / 2));
            }
            for (int i = 0; i < 3; ++i) EXPECT_EQ(outs[i], outs[i + 3]) << "bf16 qkv input, output " << i;

            // k and v only (q_out = null, the prefill attention rotating q itself; 4 tokens a block
            // at head_dim 64): the same cache bits as the run that also wrote q (T = 1, 5, 200: a
            // last block with 1-3 tokens).
            DeviceBuffer k_o(kc_ref.size() * 2), v_o(kc_ref.size() * 2);
            cudaMemset(k_o.get(), 0, k_o.bytes());
            cudaMemset(v_o.get(), 0, v_o.bytes());
            a.q_out = nullptr;
            a.k_cache = k_o.get();
            a.v_cache = v_o.get();
            kc::qkv_bias_rope_kv_write(a, nullptr);
            EXPECT_EQ(to_host<uint16_t>(k_o, k_o.bytes() / 2), outs[4]) << "k cache without q, T " << T;
            EXPECT_EQ(to_host<uint16_t>(v_o, v_o.bytes() / 2), outs[5]) << "v cache without q, T " << T;
            // The same from fp32 rows into e4m3 caches: the FP8 run's bytes above.
            DeviceBuffer k8(kc_ref.size()), v8(kc_ref.size());
            cudaMemset(k8.get(), 0, k8.bytes());
            cudaMemset(v8.get(), 0, v8.bytes());
            a.qkv = dqkv.as<float>();
            a.qkv_bf16 = false;
            a.k_cache = k8.get();
            a.v_cache = v8.get();
            a.kv_fp8 = true;
            kc::qkv_bias_rope_kv_write(a, nullptr);
            EXPECT_EQ(to_host<uint8_t>(k8, k8.bytes()), to_host<uint8_t>(dk8, dk8.bytes()))
                << "e4m3 k without q, T " << T;
            EXPECT_EQ(to_host<uint8_t>(v8, v8.bytes()), to_host<uint8_t>(dv8, dv8.bytes()))
                << "e4m3 v without q, T " << T;
        }
    }
}

TEST(CudaOps, GemmMatchesCpuLinear) {
    REQUIRE_GPU();
    kc::GemmRunner g;
    for (auto [m, n, k] : {std::tuple{1, 5120, 2880}, {7, 2880, 4096}, {300, 1000, 2880}}) {
        auto a = bf16_round(randn(static_cast<size_t>(m) * k, m + n));
        auto w = to_bf16(randn(static_cast<size_t>(n) * k, n, 1.0f / std::sqrt(static_cast<float>(k))));
        std::vector<float> ref(static_cast<size_t>(m) * n);
        kernels::LinearArgs la;
        la.x = a.data();
        la.weight = w.data();
        la.weight_dtype = DType::kBF16;
        la.y = ref.data();
        la.num_tokens = m;
        la.in_features = k;
        la.out_features = n;
        cpu::linear(la);
        auto da = to_device(to_bf16(a)), dw = to_device(w);
        auto dc = poisoned(ref.size() * 4);
        g.gemm(da.get(), dw.get(), dc.get(), kc::GemmOut::kF32, m, n, k, nullptr);
        EXPECT_TRUE(close(to_host<float>(dc, ref.size()), ref, kTolF32, "gemm"));
    }
}

TEST(CudaOps, GemvMatchesCpuLinear) {
    REQUIRE_GPU();
    for (auto [m, n, k] : {std::tuple{1, 5120, 2880}, {3, 2880, 4096}, {8, 32, 2880}, {5, 201088, 2880}}) {
        // The weights (579 M values for lm_head: most of the test's time) once for both inputs.
        const auto w = to_bf16(randn(static_cast<size_t>(n) * k, n, 1.0f / std::sqrt(static_cast<float>(k))));
        const auto bias = randn(n, 3, 0.1f);
        auto dw = to_device(w), db = to_device(bias);
        for (bool xb : {false, true}) {
            auto x = randn(static_cast<size_t>(m) * k, m + n);
            if (xb) x = bf16_round(x);
            std::vector<float> ref(static_cast<size_t>(m) * n);
            kernels::LinearArgs la;
            la.x = x.data();
            la.weight = w.data();
            la.weight_dtype = DType::kBF16;
            la.bias = bias.data();
            la.y = ref.data();
            la.num_tokens = m;
            la.in_features = k;
            la.out_features = n;
            cpu::linear(la);
            auto dx = xb ? to_device(to_bf16(x)) : to_device(x);
            auto dy = poisoned(ref.size() * 4);
            kc::GemvArgs g;
            g.x = dx.get();
            g.x_bf16 = xb;
            g.w = dw.get();
            g.bias = db.as<float>();
            g.y = dy.as<float>();
            g.num_tokens = m;
            g.n = n;
            g.k = k;
            kc::gemv_bf16w(g, nullptr);
            EXPECT_TRUE(close(to_host<float>(dy, ref.size()), ref, kTolF32, "gemv"));
        }
    }
}

// Random MXFP4 experts with the scale of real weights, plus biases.
struct RandomExperts {
    int E, H, I;
    std::vector<uint8_t> gu_blocks, gu_scales, down_blocks, down_scales;
    std::vector<float> gu_bias, down_bias;
    RandomExperts(int e, int h, int i, uint32_t seed) : E(e), H(h), I(i) {
        std::mt19937 rng(seed);
        auto fill = [&](std::vector<uint8_t>& v, size_t n, int lo, int hi) {
            v.resize(n);
            if (lo == 0 && hi == 255) {  // full-range bytes four per draw (128 experts: 1.6 GB)
                for (size_t i = 0; i < n; i += 4) {
                    const uint32_t r = rng();
                    for (size_t j = 0; j < 4 && i + j < n; ++j) v[i + j] = static_cast<uint8_t>(r >> (8 * j));
                }
                return;
            }
            for (auto& b : v) b = static_cast<uint8_t>(lo + static_cast<int>(rng() % (hi - lo + 1)));
        };
        fill(gu_blocks, static_cast<size_t>(E) * 2 * I * H / 2, 0, 255);
        fill(gu_scales, static_cast<size_t>(E) * 2 * I * H / 32, 118, 122);
        fill(down_blocks, static_cast<size_t>(E) * H * I / 2, 0, 255);
        fill(down_scales, static_cast<size_t>(E) * H * I / 32, 118, 122);
        gu_bias = randn(static_cast<size_t>(E) * 2 * I, seed + 1, 0.5f);
        down_bias = randn(static_cast<size_t>(E) * H, seed + 2, 0.1f);
    }
};

// moe_mxfp4's arguments over device copies of the experts' weights, for T tokens routed by a plan
// (offsets, sorted), with act and y as outputs. h: bf16 rows; h32: the same in fp32 (or null).
kc::MoeMxfp4Args mxfp4_args(const RandomExperts& ex, const DeviceBuffer& gub, const DeviceBuffer& gus,
                            const DeviceBuffer& gubias, const DeviceBuffer& db, const DeviceBuffer& ds,
                            const DeviceBuffer& dbias, const void* h, const float* h32, const DeviceBuffer& offsets,
                            const DeviceBuffer& sorted, DeviceBuffer& act, DeviceBuffer& y, int T, int K) {
    kc::MoeMxfp4Args a;
    a.h = h;
    a.h_f32 = h32;
    a.expert_offsets = offsets.as<int32_t>();
    a.sorted_assignments = sorted.as<int32_t>();
    a.gate_up_blocks = gub.as<uint8_t>();
    a.gate_up_scales = gus.as<uint8_t>();
    a.gate_up_bias = gubias.as<float>();
    a.down_blocks = db.as<uint8_t>();
    a.down_scales = ds.as<uint8_t>();
    a.down_bias = dbias.as<float>();
    a.act = act.as<float>();
    a.y = y.as<float>();
    a.num_tokens = T;
    a.hidden_size = ex.H;
    a.intermediate_size = ex.I;
    a.num_experts = ex.E;
    a.experts_per_token = K;
    return a;
}

// The experts' decode-layout copy (moe_pack_decode) for MoeMxfp4Args::gate_up_packed etc.
struct PackedExperts {
    DeviceBuffer gub, gus, db, ds;
    PackedExperts(const RandomExperts& ex, const DeviceBuffer& gu_blocks, const DeviceBuffer& gu_scales,
                  const DeviceBuffer& d_blocks, const DeviceBuffer& d_scales) {
        const int64_t gu_rows = static_cast<int64_t>(ex.E) * 2 * ex.I, d_rows = static_cast<int64_t>(ex.E) * ex.H;
        const int gu_g = ex.H / 32, d_g = ex.I / 32;
        gub = DeviceBuffer(kc::moe_packed_decode_bytes(gu_rows, gu_g, false));
        gus = DeviceBuffer(kc::moe_packed_decode_bytes(gu_rows, gu_g, true));
        db = DeviceBuffer(kc::moe_packed_decode_bytes(d_rows, d_g, false));
        ds = DeviceBuffer(kc::moe_packed_decode_bytes(d_rows, d_g, true));
        kc::moe_pack_decode(gu_blocks.as<uint8_t>(), gu_scales.as<uint8_t>(), gu_rows, gu_g, gub.as<uint8_t>(),
                            gus.as<uint8_t>(), nullptr);
        kc::moe_pack_decode(d_blocks.as<uint8_t>(), d_scales.as<uint8_t>(), d_rows, d_g, db.as<uint8_t>(),
                            ds.as<uint8_t>(), nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    void fill(kc::MoeMxfp4Args& a) const {
        a.gate_up_packed = gub.as<uint8_t>();
        a.gate_up_packed_scales = gus.as<uint8_t>();
        a.down_packed = db.as<uint8_t>();
        a.down_packed_scales = ds.as<uint8_t>();
    }
};

// MoeResidualTail in down's epilogue (one token): the residual x, the token's routing weights, the next
// norm's gain, and the outputs h, the Σ x² parts and the tickets' counters.
void attach_tail(kc::MoeMxfp4Args& a, DeviceBuffer& x, const DeviceBuffer& weights, const DeviceBuffer& gain,
                 DeviceBuffer& h, DeviceBuffer& ss_parts, DeviceBuffer& counters) {
    a.tail.x = x.as<float>();
    a.tail.weights = weights.as<float>();
    a.tail.gain = gain.as<float>();
    a.tail.h = h.get();
    a.tail.ss_parts = ss_parts.as<float>();
    a.tail.counters = counters.as<uint32_t>();
}

// The CPU MoE (fp32) on T tokens of h with the given routing: the reference the expert kernels are
// compared with.
std::vector<float> cpu_moe_reference(const RandomExperts& ex, const std::vector<float>& h,
                                     const std::vector<int32_t>& ids, const std::vector<float>& wts, int T, int K,
                                     float swiglu_limit = 7.0f) {
    std::vector<float> ref(static_cast<size_t>(T) * ex.H);
    kernels::MoeArgs m;
    m.x = h.data();
    m.expert_ids = ids.data();
    m.expert_weights = wts.data();
    m.y = ref.data();
    m.gate_up_blocks = ex.gu_blocks.data();
    m.gate_up_scales = ex.gu_scales.data();
    m.down_blocks = ex.down_blocks.data();
    m.down_scales = ex.down_scales.data();
    m.gate_up_bias = ex.gu_bias.data();
    m.down_bias = ex.down_bias.data();
    m.num_tokens = T;
    m.hidden_size = ex.H;
    m.intermediate_size = ex.I;
    m.num_experts = ex.E;
    m.experts_per_token = K;
    m.swiglu_limit = swiglu_limit;
    cpu::moe(m);
    return ref;
}

// The W4A8 scheme on the CPU: each activation row (h, then the bf16 SwiGLU output) quantized to
// e4m3 with one scale per row (amax / 448, as moe_quant_rows_fp8), the MXFP4 weights exact, fp32
// sums; combined with the routing weights as cpu_moe_reference is. What moe_w4a8 computes, up to
// the order of the fp32 sums. Each expert's rows are decoded once for all its assignments.
std::vector<float> cpu_moe_w4a8(const RandomExperts& ex, const std::vector<float>& h, const std::vector<int32_t>& ids,
                                const std::vector<float>& wts, int T, int K) {
    const int H = ex.H, I = ex.I;
    auto quant_row = [](const float* x, int n, float* out) {
        float m = 0.0f;
        for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
        const float scale = m > 0.0f ? m / 448.0f : 1.0f;
        const float inv = m > 0.0f ? std::min(448.0f / m, 3.0e38f) : 1.0f;
        for (int i = 0; i < n; ++i) out[i] = fp8e4m3_to_f32(f32_to_fp8e4m3(x[i] * inv)) * scale;
    };
    std::vector<float> xq(static_cast<size_t>(T) * H);
    for (int t = 0; t < T; ++t)
        quant_row(h.data() + static_cast<size_t>(t) * H, H, xq.data() + static_cast<size_t>(t) * H);
    std::vector<float> y(static_cast<size_t>(T) * H, 0.0f), w(std::max(H, I));
    for (int e = 0; e < ex.E; ++e) {
        std::vector<int> as;  // assignments t·K + k routed to e
        for (int i = 0; i < T * K; ++i)
            if (ids[i] == e) as.push_back(i);
        if (as.empty()) continue;
        const int n = static_cast<int>(as.size());
        std::vector<float> gu(static_cast<size_t>(n) * 2 * I), act(static_cast<size_t>(n) * I), aq(act.size());
        for (int r = 0; r < 2 * I; ++r) {
            const size_t row = static_cast<size_t>(e) * 2 * I + r;
            cpu::mxfp4_row_to_f32(ex.gu_blocks.data() + row * H / 2, ex.gu_scales.data() + row * H / 32, H, w.data());
            for (int a = 0; a < n; ++a) {
                const float* x = xq.data() + static_cast<size_t>(as[a] / K) * H;
                float d = 0.0f;
                for (int c = 0; c < H; ++c) d += w[c] * x[c];
                gu[static_cast<size_t>(a) * 2 * I + r] = d + ex.gu_bias[row];
            }
        }
        for (int a = 0; a < n; ++a)
            for (int j = 0; j < I; ++j) {
                const float gate = std::min(gu[static_cast<size_t>(a) * 2 * I + 2 * j], 7.0f);
                const float up = std::clamp(gu[static_cast<size_t>(a) * 2 * I + 2 * j + 1], -7.0f, 7.0f);
                act[static_cast<size_t>(a) * I + j] = (up + 1.0f) * gate / (1.0f + std::exp(-1.702f * gate));
            }
        act = bf16_round(std::move(act));  // the kernels' act is bf16
        for (int a = 0; a < n; ++a)
            quant_row(act.data() + static_cast<size_t>(a) * I, I, aq.data() + static_cast<size_t>(a) * I);
        for (int r = 0; r < H; ++r) {
            const size_t row = static_cast<size_t>(e) * H + r;
            cpu::mxfp4_row_to_f32(ex.down_blocks.data() + row * I / 2, ex.down_scales.data() + row * I / 32, I,
                                  w.data());
            for (int a = 0; a < n; ++a) {
                const float* x = aq.data() + static_cast<size_t>(a) * I;
                float d = 0.0f;
                for (int c = 0; c < I; ++c) d += w[c] * x[c];
                y[static_cast<size_t>(as[a] / K) * H + r] += wts[as[a]] * (d + ex.down_bias[row]);
            }
        }
    }
    return y;
}

// Per-assignment expert outputs y [T·K, H] (device) combined with the routing weights: what the
// model consumes, comparable with cpu_moe_reference.
std::vector<float> combine_assignments(const DeviceBuffer& y, const std::vector<float>& wts, int T, int K, int H) {
    const auto yh = to_host<float>(y, static_cast<size_t>(T) * K * H);
    std::vector<float> got(static_cast<size_t>(T) * H, 0.0f);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
            for (int i = 0; i < H; ++i)
                got[static_cast<size_t>(t) * H + i] += wts[t * K + k] * yh[(static_cast<size_t>(t) * K + k) * H + i];
    return got;
}

// Random router inputs (fp32 h [T, H], bf16 W [E, H], bias) and the CPU router's choice,
// weights and logits (with the bias): the reference of the router kernels.
struct RouterCase {
    std::vector<float> h, b, weights, logits;
    std::vector<uint16_t> w;
    std::vector<int32_t> ids;
    RouterCase(int T, int E, int H, int K)
        : h(randn(static_cast<size_t>(T) * H, E + T)),
          b(randn(E, E + 2, 0.1f)),
          weights(static_cast<size_t>(T) * K),
          logits(static_cast<size_t>(T) * E),
          w(to_bf16(randn(static_cast<size_t>(E) * H, E + 1, 1.0f / std::sqrt(2880.0f)))),
          ids(static_cast<size_t>(T) * K) {
        kernels::RouterArgs ra;
        ra.x = h.data();
        ra.weight = w.data();
        ra.bias = b.data();
        ra.expert_ids = ids.data();
        ra.expert_weights = weights.data();
        ra.logits = logits.data();
        ra.num_tokens = T;
        ra.hidden_size = H;
        ra.num_experts = E;
        ra.experts_per_token = K;
        cpu::router(ra);
    }
};

// The implementations: the tiled logits + warp selection (with a logits scratch; token counts
// that take each tile height and partial tiles), the same on the tensor cores
// (RouterTopkArgs::tensor_cores), and the one-CTA-per-token kernel (without a scratch).
// Tensor-core logits: h split into bf16 hi + lo leaves at most 2^-17 |h| per element, the lo
// rounding 2^-18 |h|, so each logit is within 2^-16 Σ|h·w| of the exact sum (plus fp32 sums): a
// wrong fragment or row is O(1) off.
TEST(CudaOps, RouterTopk) {
    REQUIRE_GPU();
    for (int E : {32, 40, 128}) {              // 40: a partial 32-expert tile
        for (int T : {65, 600, 2051, 4200}) {  // 4,200: the tensor-core kernel's split at its scratch's bound
            for (int mode : {0, 1, 2}) {       // tiled fp32, tensor cores, one CTA per token
                const bool tiled = mode != 2, tc = mode == 1;
                if ((!tiled || E == 40) && T != 65 && !tc) continue;
                if (T == 4200 && (!tc || E != 32)) continue;
                const int H = 2880, K = 4;
                const RouterCase rc(T, E, H, K);
                const auto& h = rc.h;
                const auto& w = rc.w;
                const auto& b = rc.b;
                const auto& ids_ref = rc.ids;
                const auto& w_ref = rc.weights;
                const auto& logits = rc.logits;
                auto dh = to_device(h), dw = to_device(w), db = to_device(b);
                auto dids = poisoned(ids_ref.size() * 4), dws = poisoned(w_ref.size() * 4);
                auto dlog = poisoned(static_cast<size_t>(kc::router_topk_scratch(T, E)) * 4);
                kc::RouterTopkArgs a;
                a.h = dh.as<float>();
                a.weight = dw.get();
                a.bias = db.as<float>();
                a.expert_ids = dids.as<int32_t>();
                a.expert_weights = dws.as<float>();
                a.logits = tiled ? dlog.as<float>() : nullptr;
                a.tensor_cores = tc;
                a.num_tokens = T;
                a.hidden_size = H;
                a.num_experts = E;
                a.experts_per_token = K;
                kc::router_topk(a, nullptr);
                auto ids = to_host<int32_t>(dids, ids_ref.size());
                auto wts = to_host<float>(dws, w_ref.size());
                // fp32 on both sides: a flip needs a near-tie (< 1e-5 apart); count them (at most
                // one per ~500 tokens) and compare the weights of the tokens without one.
                int flips = 0;
                std::vector<float> got_w, want_w;
                for (int t = 0; t < T; ++t) {
                    bool same = true;
                    for (int k = 0; k < K; ++k) same = same && ids[t * K + k] == ids_ref[t * K + k];
                    flips += !same;
                    for (int k = 0; same && k < K; ++k) {
                        got_w.push_back(wts[t * K + k]);
                        want_w.push_back(w_ref[t * K + k]);
                    }
                }
                EXPECT_LE(flips, 1 + T / 500) << "E=" << E << " T=" << T << " mode=" << mode;
                if (!tc) {
                    EXPECT_TRUE(close(got_w, want_w, kTolF32, "router weights")) << "E=" << E << " T=" << T;
                }
                if (tiled) {  // the scratch holds the logits without the bias, as partial sums over K
                    const int splits = kc::router_topk_splits(T, E, H, tc);
                    EXPECT_EQ(splits > 1, tc || T < 1024) << "T=" << T;  // both kinds covered
                    auto part = to_host<float>(dlog, static_cast<size_t>(splits) * logits.size());
                    std::vector<float> lg(logits.size(), 0.0f), want(logits.size());
                    for (int p = 0; p < splits; ++p)
                        for (size_t i = 0; i < lg.size(); ++i) lg[i] += part[p * lg.size() + i];
                    for (int t = 0; t < T; ++t)
                        for (int e = 0; e < E; ++e)
                            want[static_cast<size_t>(t) * E + e] = logits[static_cast<size_t>(t) * E + e] - b[e];
                    if (!tc) {
                        EXPECT_TRUE(close(lg, want, kTolF32, "router logits")) << "E=" << E << " T=" << T;
                    } else {
                        int bad = 0;
                        double worst = 0.0;
                        for (int t = 0; t < T; ++t)
                            for (int e = 0; e < E; ++e) {
                                double mag = 0.0;
                                for (int c = 0; c < H; ++c)
                                    mag += std::fabs(h[static_cast<size_t>(t) * H + c] *
                                                     bf16_to_f32(w[static_cast<size_t>(e) * H + c]));
                                const size_t i = static_cast<size_t>(t) * E + e;
                                const double d = std::fabs(static_cast<double>(lg[i]) - want[i]);
                                worst = std::max(worst, d / mag);
                                bad += !(d <= std::ldexp(mag, -16) + 1e-6);
                            }
                        std::printf(
                            "  router logits on tensor cores (E %d, T %d): worst |d| / sum|h w| %.3g, %d "
                            "outside 2^-16\n",
                            E, T, worst, bad);
                        EXPECT_EQ(bad, 0) << "E=" << E << " T=" << T;
                        // The weights of tokens with the same choice: softmax of logits a few 1e-5 apart.
                        EXPECT_TRUE(close(got_w, want_w, Tol{1e-4, 1e-3}, "router weights (tensor cores)"))
                            << "E=" << E << " T=" << T;
                    }
                }
            }
        }
    }
}

// The router normalizing the residual stream itself (RouterTopkArgs::norm_inv_rms, with the norm's
// ResidualRmsNormArgs::out_inv_rms) against the router on the norm's fp32 rows (out_f32): the same
// logits, ids and weights, bit for bit. 32, 64 and 128 experts; the wide norm (≥ 64 tokens)
// and the one-CTA norm would give different rows only through 1 / rms, which both write.
TEST(CudaOps, RouterNormalizingTheResidualMatchesTheNormsRows) {
    REQUIRE_GPU();
    const int H = 2880, K = 4;
    for (int E : {32, 64, 128}) {       // the three n8-tile widths of the tensor-core router
        for (int T : {30, 70, 1000}) {  // 30: the one-CTA norm kernel
            ASSERT_TRUE(kc::router_topk_normalizes(E, H, true));
            auto x = randn(static_cast<size_t>(T) * H, 11 + T);
            for (int t = 0; t < T; ++t)  // rows of different scales
                for (int i = 0; i < H; ++i) x[static_cast<size_t>(t) * H + i] *= std::ldexp(1.0f, t % 9 - 4);
            const auto add = bf16_round(randn(static_cast<size_t>(T) * H, 12 + T));
            const auto bias = randn(H, 13, 0.1f);
            const auto gain = randn(H, 14, 0.2f, 1.0f);
            const auto w = bf16_round(randn(static_cast<size_t>(E) * H, 15 + E, 0.05f));
            const auto rb = randn(E, 16, 0.1f);
            auto dx = to_device(x), dadd = to_device(to_bf16(add)), dbias = to_device(bias), dg = to_device(gain),
                 dw = to_device(to_bf16(w)), drb = to_device(rb);
            auto out = poisoned(static_cast<size_t>(T) * H * 2), out32 = poisoned(static_cast<size_t>(T) * H * 4),
                 inv = poisoned(static_cast<size_t>(T) * 4);
            kc::ResidualRmsNormArgs n;
            n.x = dx.as<float>();
            n.add = dadd.as<float>();
            n.add_bf16 = true;
            n.add_bias = dbias.as<float>();
            n.num_add = 1;
            n.weight = dg.as<float>();
            n.out = out.get();
            n.out_f32 = out32.as<float>();
            n.out_inv_rms = inv.as<float>();
            n.num_tokens = T;
            n.hidden_size = H;
            kc::residual_rmsnorm(n, nullptr);
            // 1 / rms against the CPU's (fp32 sums in a different order).
            const auto xr = to_host<float>(dx, x.size());
            const auto got_inv = to_host<float>(inv, T);
            for (int t = 0; t < T; t += 7) {
                double ss = 0.0;
                for (int i = 0; i < H; ++i)
                    ss += static_cast<double>(xr[static_cast<size_t>(t) * H + i]) * xr[static_cast<size_t>(t) * H + i];
                EXPECT_NEAR(got_inv[t], 1.0 / std::sqrt(ss / H + 1e-5), 1e-5 / std::sqrt(ss / H + 1e-5)) << "t " << t;
            }
            std::vector<int32_t> ids[2];
            std::vector<float> wts[2], lg[2];
            for (int v = 0; v < 2; ++v) {
                auto dids = poisoned(static_cast<size_t>(T) * K * 4), dws = poisoned(static_cast<size_t>(T) * K * 4);
                auto dlog = poisoned(static_cast<size_t>(kc::router_topk_scratch(T, E)) * 4);
                kc::RouterTopkArgs a;
                a.h = v == 0 ? out32.as<float>() : dx.as<float>();
                a.norm_inv_rms = v == 0 ? nullptr : inv.as<float>();
                a.norm_weight = v == 0 ? nullptr : dg.as<float>();
                a.weight = dw.get();
                a.bias = drb.as<float>();
                a.expert_ids = dids.as<int32_t>();
                a.expert_weights = dws.as<float>();
                a.logits = dlog.as<float>();
                a.tensor_cores = true;
                a.num_tokens = T;
                a.hidden_size = H;
                a.num_experts = E;
                a.experts_per_token = K;
                kc::router_topk(a, nullptr);
                ids[v] = to_host<int32_t>(dids, static_cast<size_t>(T) * K);
                wts[v] = to_host<float>(dws, static_cast<size_t>(T) * K);
                lg[v] = to_host<float>(dlog, static_cast<size_t>(kc::router_topk_splits(T, E, H, true)) * T * E);
            }
            EXPECT_EQ(lg[1], lg[0]) << "logits, E " << E << " T " << T;
            EXPECT_EQ(ids[1], ids[0]) << "E " << E << " T " << T;
            EXPECT_EQ(wts[1], wts[0]) << "E " << E << " T " << T;
        }
    }
}

TEST(CudaOps, RouterSmallBatchMatchesCpu) {
    REQUIRE_GPU();
    for (int E : {32, 128}) {
        for (int T : {1, 3, 8}) {
            const int H = 2880, K = 4;
            const RouterCase rc(T, E, H, K);
            const auto& h = rc.h;
            const auto& w = rc.w;
            const auto& b = rc.b;
            const auto& ids_ref = rc.ids;
            const auto& w_ref = rc.weights;
            const auto& logits = rc.logits;
            auto dh = to_device(h), dw = to_device(w), db = to_device(b);
            auto dl = poisoned(logits.size() * 4), dids = poisoned(ids_ref.size() * 4),
                 dws = poisoned(w_ref.size() * 4);
            kc::router_logits_small(dh.as<float>(), dw.get(), T, H, E, dl.as<float>(), nullptr);
            kc::topk_softmax(dl.as<float>(), db.as<float>(), T, E, K, dids.as<int32_t>(), dws.as<float>(), nullptr);
            // cpu::router's logits include the bias; the GEMV's do not.
            std::vector<float> no_bias = logits;
            for (int t = 0; t < T; ++t)
                for (int e = 0; e < E; ++e) no_bias[static_cast<size_t>(t) * E + e] -= b[e];
            EXPECT_TRUE(close(to_host<float>(dl, logits.size()), no_bias, kTolF32, "router logits"));
            EXPECT_EQ(to_host<int32_t>(dids, ids_ref.size()), ids_ref);
            EXPECT_TRUE(close(to_host<float>(dws, w_ref.size()), w_ref, kTolF32, "router weights"));
        }
    }
}

// Routing weights differ per slot (random, summing to 1 per token) so that a wrong pairing of
// outputs and assignments shows. Batches cover one pass (1, 2), partial passes of 4 (5, 17), many
// experts, 128 experts (120b), and every token on the same 4 experts (several passes per expert).
// moe_plan against a host counting sort: offsets are the exclusive prefix sums of the counts and,
// inside an expert, assignments keep their index order. Sizes around the kernel's warp chunks and
// 128-assignment groups (1, 31, 33, 1,000, 32,768 = 20b's 8k prompt, 65,537), expert counts of the
// models (32, 128), an EP plan's extra bucket (129, 257), one expert, and skewed routings (every
// assignment to one expert; two experts alternating) where many lanes of a warp share an expert.
TEST(CudaOps, MoePlanIsAStableCountingSort) {
    REQUIRE_GPU();
    std::mt19937 rng(3);
    struct Case {
        int n, E, mode;  // mode 0 uniform, 1 all to the last expert, 2 two experts alternating, 3 skewed
    };
    const Case cases[] = {{1, 32, 0},      {31, 32, 0},     {33, 128, 0},   {1000, 32, 0},        {32768, 32, 0},
                          {32768, 128, 0}, {65537, 129, 0}, {5000, 257, 0}, {4096, 1, 0},         {32768, 32, 1},
                          {9999, 128, 2},  {32768, 128, 3}, {0, 32, 0},     {128 * 32 + 5, 64, 0}};
    for (const Case& c : cases) {
        std::vector<int32_t> ids(c.n);
        std::uniform_int_distribution<int> uni(0, c.E - 1);
        for (int i = 0; i < c.n; ++i) {
            switch (c.mode) {
                case 1: ids[i] = c.E - 1; break;
                case 2: ids[i] = (i & 1) ? 0 : c.E - 1; break;
                case 3: ids[i] = uni(rng) % 4 == 0 ? uni(rng) : uni(rng) % 3; break;
                default: ids[i] = uni(rng);
            }
        }
        std::vector<int32_t> ref_off(c.E + 1, 0), ref_sorted(c.n, -1);
        for (int32_t e : ids) ++ref_off[e + 1];
        for (int e = 0; e < c.E; ++e) ref_off[e + 1] += ref_off[e];
        std::vector<int32_t> fill(ref_off.begin(), ref_off.end() - 1);
        for (int i = 0; i < c.n; ++i) ref_sorted[fill[ids[i]]++] = i;
        auto dids = to_device(ids.empty() ? std::vector<int32_t>{0} : ids);
        auto offsets = poisoned((c.E + 1) * 4), sorted = poisoned(std::max(c.n, 1) * 4);
        kc::moe_plan(dids.as<int32_t>(), c.n, c.E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
        EXPECT_EQ(to_host<int32_t>(offsets, c.E + 1), ref_off) << "n " << c.n << " E " << c.E << " mode " << c.mode;
        if (c.n > 0) {
            EXPECT_EQ(to_host<int32_t>(sorted, c.n), ref_sorted) << "n " << c.n << " E " << c.E << " mode " << c.mode;
        }
    }
}

TEST(CudaOps, MoeMxfp4MatchesCpu) {
    REQUIRE_GPU();
    const int H = 2880, I = 2880, K = 4;
    for (int E : {32, 128}) {
        RandomExperts ex(E, H, I, 42 + E);
        auto dgub = to_device(ex.gu_blocks), dgus = to_device(ex.gu_scales), ddb = to_device(ex.down_blocks),
             dds = to_device(ex.down_scales), dgubias = to_device(ex.gu_bias), ddbias = to_device(ex.down_bias);
        struct Case {
            int T;
            bool same_experts;
        };
        for (const Case c : {Case{1, false}, Case{2, false}, Case{5, false}, Case{8, false}, Case{17, false},
                             Case{32, false}, Case{5, true}, Case{32, true}}) {
            const int T = c.T;
            auto h = bf16_round(randn(static_cast<size_t>(T) * H, 100 * E + T));
            std::vector<int32_t> ids(T * K);
            std::vector<float> wts(T * K);
            std::mt19937 rng(1000 * E + T + (c.same_experts ? 7 : 0));
            std::uniform_real_distribution<float> uni(0.05f, 1.0f);
            const int fixed[4] = {3, E - 1, 11, 30};
            for (int t = 0; t < T; ++t) {
                std::vector<int> perm(E);
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                float sum = 0.0f;
                for (int k = 0; k < K; ++k) {
                    ids[t * K + k] = c.same_experts ? fixed[(k + t) % K] : perm[k];
                    wts[t * K + k] = uni(rng);
                    sum += wts[t * K + k];
                }
                for (int k = 0; k < K; ++k) wts[t * K + k] /= sum;
            }
            // CPU: the weighted sum over the slots, which is what the model consumes.
            const std::vector<float> ref = cpu_moe_reference(ex, h, ids, wts, T, K);

            auto dids = to_device(ids);
            DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
            auto act = poisoned(static_cast<size_t>(T) * K * I * 4);
            kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
            // Both input forms: bf16 rows (h) and fp32 rows (h_f32, the decode path); same values.
            // Both kernels: the fp32 weight-only ones (0) and, up to 8 tokens, moe_decode_mma (1).
            for (int kernel : {0, 1})
                for (bool f32_input : {false, true}) {
                    auto dh = to_device(to_bf16(h)), dh32 = to_device(h);
                    auto y = poisoned(static_cast<size_t>(T) * K * H * 4);
                    kc::MoeMxfp4Args a =
                        mxfp4_args(ex, dgub, dgus, dgubias, ddb, dds, ddbias, dh.get(),
                                   f32_input ? dh32.as<float>() : nullptr, offsets, sorted, act, y, T, K);
                    a.kernel = kernel;
                    EXPECT_EQ(cudaMemset(act.get(), 0xff, act.bytes()), cudaSuccess);  // poison again
                    kc::moe_mxfp4(a, nullptr);
                    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
                    const std::vector<float> got = combine_assignments(y, wts, T, K, H);
                    // The fp32 kernels: fp32 math on identical inputs and exactly decoded weights, only
                    // the summation order differs. moe_decode_mma rounds the inputs and act to bf16 (the
                    // grouped kernels' tolerance).
                    const bool mma = kernel != 0 && T <= kc::kMoeDecodeMmaMaxTokens;
                    EXPECT_TRUE(close(got, ref, mma ? kTolBf16Out : kTolF32, mma ? "moe decode mma" : "moe mxfp4"))
                        << "E=" << E << " T=" << T << (c.same_experts ? " same experts" : "")
                        << (f32_input ? " f32 input" : " bf16 input") << " kernel " << kernel;
                }
        }
    }
}

// moe_decode_mma at a MoE-TP2 shard's widths (I = 1440: down has 45 groups, so the last K step of
// a warp is partial and the warps' shares differ) with the scales of MoeMmaEdgeShapesAndScales
// below: 129–132 on two experts' gate_up (the two-multiply path) and 0 on one expert's down; 1, 2,
// 3 and 8 tokens, with a shared expert for every token (at 2 tokens, gate_up's early-staged form
// with two of a tile's assignments in different token columns). Tolerance as MoeMxfp4MatchesCpu's for it.
// moe_pack_decode against the layout as moe.h states it (words in the decode bit order), on 2 tiles of 16 rows:
// 45 groups (a last step of one group, padded with zeros), 90 (two) and 8 (none).
TEST(CudaOps, MoePackDecodeIsTheStatedLayout) {
    REQUIRE_GPU();
    for (int G : {45, 90, 8}) {
        const int64_t rows = 32;
        std::vector<uint8_t> blocks(static_cast<size_t>(rows) * G * 16), scales(static_cast<size_t>(rows) * G);
        std::mt19937 rng(500 + G);
        for (auto& b : blocks) b = static_cast<uint8_t>(rng());
        for (auto& b : scales) b = static_cast<uint8_t>(rng());
        auto db = to_device(blocks), ds = to_device(scales);
        const int64_t nb = kc::moe_packed_decode_bytes(rows, G, false), ns = kc::moe_packed_decode_bytes(rows, G, true);
        const int S = (G + 3) / 4;
        ASSERT_EQ(nb, rows / 16 * S * 1024);
        ASSERT_EQ(ns, rows / 16 * S * 64);
        DeviceBuffer pb(nb), ps(ns);
        kc::moe_pack_decode(db.as<uint8_t>(), ds.as<uint8_t>(), rows, G, pb.as<uint8_t>(), ps.as<uint8_t>(), nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto hb = to_host<uint8_t>(pb, nb), hs = to_host<uint8_t>(ps, ns);
        std::vector<uint8_t> eb(nb, 0), es(ns, 0);
        for (int64_t tile = 0; tile < rows / 16; ++tile)
            for (int s = 0; s < S; ++s)
                for (int g = 0; g < 8; ++g)
                    for (int t = 0; t < 4 && 4 * s + t < G; ++t)
                        for (int h = 0; h < 2; ++h) {
                            const int64_t row = 16 * tile + g + 8 * h, grp = 4 * s + t, l = 4 * g + t;
                            const int64_t step = tile * S + s;
                            // each little-endian word in the decode bit order
                            for (int wd = 0; wd < 4; ++wd) {
                                uint32_t word;
                                std::memcpy(&word, &blocks[(row * G + grp) * 16 + 4 * wd], 4);
                                word = gptoss::kernels::e2m1x8_to_decode_bits(word);
                                std::memcpy(&eb[(64 * step + 32 * h + l) * 16 + 4 * wd], &word, 4);
                            }
                            es[64 * step + 2 * l + h] = scales[row * G + grp];
                        }
        EXPECT_EQ(hb, eb) << "G=" << G << ": codes";
        EXPECT_EQ(hs, es) << "G=" << G << ": scales";
    }
}

TEST(CudaOps, MoeDecodeMmaEdgeShapesAndScales) {
    REQUIRE_GPU();
    const int H = 2880, I = 1440, K = 4, E = 32;
    RandomExperts ex(E, H, I, 93);
    const size_t gu_s = static_cast<size_t>(2) * I * H / 32, dn_s = static_cast<size_t>(H) * I / 32;
    for (int e : {3, 30})
        for (size_t i = 0; i < gu_s; ++i) ex.gu_scales[e * gu_s + i] = static_cast<uint8_t>(129 + i % 4);
    for (size_t i = 0; i < dn_s; ++i) ex.down_scales[11 * dn_s + i] = 0;
    auto dgub = to_device(ex.gu_blocks), dgus = to_device(ex.gu_scales), ddb = to_device(ex.down_blocks),
         dds = to_device(ex.down_scales), dgubias = to_device(ex.gu_bias), ddbias = to_device(ex.down_bias);
    const PackedExperts packed(ex, dgub, dgus, ddb, dds);
    for (int T : {1, 2, 3, 8}) {
        auto h = bf16_round(randn(static_cast<size_t>(T) * H, 94 + T));
        std::vector<int32_t> ids(T * K);
        std::vector<float> wts(T * K, 0.25f);
        for (int t = 0; t < T; ++t) {
            ids[t * K] = t % 2 ? 3 : 30;
            ids[t * K + 1] = 11;
            ids[t * K + 2] = 12 + t;
            ids[t * K + 3] = 20 + (t + 1) % 8;
        }
        const std::vector<float> ref = cpu_moe_reference(ex, h, ids, wts, T, K);
        auto dids = to_device(ids), dh32 = to_device(h), dh = to_device(to_bf16(h));
        DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
        kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
        for (bool f32_input : {true, false}) {  // h_f32, or the bf16 rows (the same values)
            auto act = poisoned(static_cast<size_t>(T) * K * I * 4);
            auto y = poisoned(static_cast<size_t>(T) * K * H * 4);
            kc::MoeMxfp4Args a = mxfp4_args(ex, dgub, dgus, dgubias, ddb, dds, ddbias, dh.get(),
                                            f32_input ? dh32.as<float>() : nullptr, offsets, sorted, act, y, T, K);
            ASSERT_TRUE(kc::moe_decode_mma_supported(a));
            kc::moe_decode_mma(a, nullptr);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_TRUE(close(combine_assignments(y, wts, T, K, H), ref, kTolBf16Out, "moe decode mma edge shapes"))
                << "T=" << T << (f32_input ? " fp32 h" : " bf16 h");
            // The decode layout (I / 32 = 45 groups: a last step of one group; H / 32 = 90: of two): the same bits.
            const auto y0 = to_host<float>(y, static_cast<size_t>(T) * K * H);
            packed.fill(a);
            kc::moe_decode_mma(a, nullptr);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_EQ(to_host<float>(y, static_cast<size_t>(T) * K * H), y0)
                << "T=" << T << (f32_input ? " fp32 h" : " bf16 h") << ": the decode layout";
        }
    }
}

// moe_decode_fp8: the decode MoE on the FP8 copy of the experts, made as the model makes it (MXFP4
// -> bf16 -> FP8 128×128 with power-of-two block scales: lossless at these group scales), against
// the CPU MoE on the MXFP4 weights at moe_decode_mma's tolerance (both round the inputs and act to
// bf16; the products are the same, the fp32 sums' order differs). E 32 and 128 (find_slot past 32
// experts), 1, 2, 5 and 8 tokens, fp32 and bf16 h, a pair of experts shared by every token (tiles
// with several assignments: MMA columns past 0). Then the staging's second pass: token 1's h times
// 2^17 (beyond f16's 65504) with the SwiGLU clamp lifted, so that act passes f16's range too; every
// token compared on its own (the large one would hide the others' errors).
// The FP8 copy of RandomExperts in moe_decode_fp8's layout (MoeFp8Args': e4m3 [E, n, k_pad] and 128×128
// block scales), converted on the device from their MXFP4 bytes as the model converts them at load.
struct Fp8ExpertCopy {
    int kph = 0, kpi = 0;
    DeviceBuffer guq, gus, dnq, dns;
    explicit Fp8ExpertCopy(const RandomExperts& ex) {
        const int E = ex.E, H = ex.H, I = ex.I;
        kph = kc::fp8_gemm_k_pad(H), kpi = kc::fp8_gemm_k_pad(I);
        const auto nb = [](int n) { return (n + 127) / 128; };
        guq = DeviceBuffer(static_cast<size_t>(E) * 2 * I * kph);
        gus = DeviceBuffer(static_cast<size_t>(E) * nb(2 * I) * (kph / 128) * 4);
        dnq = DeviceBuffer(static_cast<size_t>(E) * H * kpi);
        dns = DeviceBuffer(static_cast<size_t>(E) * nb(H) * (kpi / 128) * 4);
        auto dgub = to_device(ex.gu_blocks), dgus = to_device(ex.gu_scales), ddb = to_device(ex.down_blocks),
             dds = to_device(ex.down_scales);
        DeviceBuffer tmp(static_cast<size_t>(2) * I * H * 2);
        for (int e = 0; e < E; ++e) {
            kc::mxfp4_to_bf16(dgub.as<uint8_t>() + static_cast<size_t>(e) * 2 * I * H / 2,
                              dgus.as<uint8_t>() + static_cast<size_t>(e) * 2 * I * H / 32, 2 * I, H, tmp.get(),
                              nullptr);
            kc::quantize_weight_fp8_bf16(tmp.get(), 2 * I, H, kph,
                                         guq.as<uint8_t>() + static_cast<size_t>(e) * 2 * I * kph,
                                         gus.as<float>() + static_cast<size_t>(e) * nb(2 * I) * (kph / 128), nullptr);
            kc::mxfp4_to_bf16(ddb.as<uint8_t>() + static_cast<size_t>(e) * H * I / 2,
                              dds.as<uint8_t>() + static_cast<size_t>(e) * H * I / 32, H, I, tmp.get(), nullptr);
            kc::quantize_weight_fp8_bf16(tmp.get(), H, I, kpi, dnq.as<uint8_t>() + static_cast<size_t>(e) * H * kpi,
                                         dns.as<float>() + static_cast<size_t>(e) * nb(H) * (kpi / 128), nullptr);
        }
        CUDA_CHECK(cudaDeviceSynchronize());  // tmp is freed on return
    }
    void fill(kc::MoeMxfp4Args& a) const {
        a.gate_up_f8 = guq.as<uint8_t>();
        a.gate_up_f8_scale = gus.as<float>();
        a.gate_up_k_pad = kph;
        a.down_f8 = dnq.as<uint8_t>();
        a.down_f8_scale = dns.as<float>();
        a.down_k_pad = kpi;
    }
};

TEST(CudaOps, MoeDecodeFp8MatchesCpu) {
    REQUIRE_GPU();
    const int H = 2880, I = 2880, K = 4;
    for (int E : {32, 128}) {
        RandomExperts ex(E, H, I, 77 + E);
        const Fp8ExpertCopy f8(ex);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto dgubias = to_device(ex.gu_bias), ddbias = to_device(ex.down_bias);
        for (int c = 0; c < 5; ++c) {
            const int T = c == 4 ? 3 : c == 0 ? 1 : c == 1 ? 2 : c == 2 ? 5 : 8;
            const bool big = c == 4;
            const float limit = big ? 1e30f : 7.0f;
            auto h = randn(static_cast<size_t>(T) * H, 300 * E + c);
            if (big)
                for (int i = 0; i < H; ++i) h[H + i] *= 131072.0f;
            h = bf16_round(h);
            std::vector<int32_t> ids(T * K);
            std::vector<float> wts(T * K);
            std::mt19937 rng(500 * E + c);
            std::uniform_real_distribution<float> uni(0.05f, 1.0f);
            for (int t = 0; t < T; ++t) {
                std::vector<int> perm(E);
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                std::erase_if(perm, [&](int e) { return e == 5 || e == E - 2; });
                ids[t * K] = 5, ids[t * K + 1] = E - 2, ids[t * K + 2] = perm[0], ids[t * K + 3] = perm[1];
                float sum = 0.0f;
                for (int k = 0; k < K; ++k) sum += (wts[t * K + k] = uni(rng));
                for (int k = 0; k < K; ++k) wts[t * K + k] /= sum;
            }
            const std::vector<float> ref = cpu_moe_reference(ex, h, ids, wts, T, K, limit);
            auto dids = to_device(ids), dh32 = to_device(h), dh = to_device(to_bf16(h));
            DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
            kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
            for (bool f32_input : {true, false}) {
                auto act = poisoned(static_cast<size_t>(T) * K * I * 4);
                auto y = poisoned(static_cast<size_t>(T) * K * H * 4);
                kc::MoeMxfp4Args a;
                a.h = dh.get();
                a.h_f32 = f32_input ? dh32.as<float>() : nullptr;
                a.expert_offsets = offsets.as<int32_t>();
                a.sorted_assignments = sorted.as<int32_t>();
                f8.fill(a);
                a.gate_up_bias = dgubias.as<float>();
                a.down_bias = ddbias.as<float>();
                a.act = act.as<float>();
                a.y = y.as<float>();
                a.num_tokens = T;
                a.hidden_size = H;
                a.intermediate_size = I;
                a.num_experts = E;
                a.experts_per_token = K;
                a.swiglu_limit = limit;
                ASSERT_TRUE(kc::moe_decode_fp8_supported(a));
                kc::moe_decode_fp8(a, nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                const std::vector<float> got = combine_assignments(y, wts, T, K, H);
                for (int t = 0; t < T; ++t) {
                    const std::vector<float> gt(got.begin() + t * H, got.begin() + (t + 1) * H);
                    const std::vector<float> rt(ref.begin() + t * H, ref.begin() + (t + 1) * H);
                    EXPECT_TRUE(close(gt, rt, kTolBf16Out, "moe decode fp8"))
                        << "E=" << E << " T=" << T << " token " << t << (big ? " (token 1 x 2^17)" : "")
                        << (f32_input ? " fp32 h" : " bf16 h");
                }
            }
        }
    }
}

// MoeResidualTail (session 36): at one token the decode MoE's down launch also updates the residual,
// x[i] += Σ_k w_k · y_k[i], and writes h = bf16(x · gain) and each 16-element tile's Σ x². Checked
// against the host on the launch's own y rows, to the bit (the tail's fused multiply-adds in k order,
// its rounded product and its 16-lane tree are written out here): moe_decode_mma (a ticket a tile in its
// down CTAs), moe_decode_fp8 (the same epilogue behind its own plan), the fp32 weight-only kernels and
// moe_decode_wg (moe_residual_tail after them). Each twice: the tickets must leave the counters at zero.
TEST(CudaOps, MoeResidualTailMatchesTheHost) {
    REQUIRE_GPU();
    const int H = 2880, I = 2880, K = 4, tiles = H / kc::kMoeTailTile;
    for (int E : {32, 128}) {
        RandomExperts ex(E, H, I, 91 + E);
        const Fp8ExpertCopy f8(ex);
        auto gub = to_device(ex.gu_blocks), gus = to_device(ex.gu_scales), gubias = to_device(ex.gu_bias);
        auto db = to_device(ex.down_blocks), ds = to_device(ex.down_scales), dbias = to_device(ex.down_bias);
        const auto h = bf16_round(randn(H, 17 * E));
        auto dh = to_device(to_bf16(h)), dh32 = to_device(h);
        // Experts 0 and E - 1 (the scan's ends) and two others; weights summing to one.
        const std::vector<int32_t> ids = {E - 1, 0, E / 2 + 1, 3};
        const std::vector<float> wts = {0.4f, 0.1f, 0.3f, 0.2f};
        auto dids = to_device(ids), dw = to_device(wts);
        DeviceBuffer offsets((E + 1) * 4), sorted(K * 4);
        kc::moe_plan(dids.as<int32_t>(), K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
        const auto x0 = randn(H, 23 * E, 4.0f);
        const auto gain = randn(H, 29 * E, 0.3f, 1.0f);
        auto dgain = to_device(gain);
        // -1: moe_decode_fp8; else MoeMxfp4Args::kernel (1 moe_decode_mma, 0 the fp32 kernels, 4 moe_decode_wg).
        for (int kernel : {1, -1, 0, 4}) {
            DeviceBuffer counters(tiles * 4);
            CUDA_CHECK(cudaMemset(counters.get(), 0, tiles * 4));
            for (int rep = 0; rep < 2; ++rep) {
                auto act = poisoned(static_cast<size_t>(K) * I * 4);
                auto y = poisoned(static_cast<size_t>(K) * H * 4);
                auto dx = to_device(x0);
                auto hb = poisoned(static_cast<size_t>(H) * 2);
                auto parts = poisoned(static_cast<size_t>(tiles) * 4);
                kc::MoeMxfp4Args a = mxfp4_args(ex, gub, gus, gubias, db, ds, dbias, dh.get(), dh32.as<float>(),
                                                offsets, sorted, act, y, 1, K);
                attach_tail(a, dx, dw, dgain, hb, parts, counters);
                const char* name = kernel == -1  ? "moe_decode_fp8"
                                   : kernel == 1 ? "moe_decode_mma"
                                   : kernel == 4 ? "moe_decode_wg"
                                                 : "fp32 kernels";
                if (kernel == -1) {
                    f8.fill(a);
                    ASSERT_TRUE(kc::moe_decode_fp8_supported(a));
                    kc::moe_decode_fp8(a, nullptr);
                } else {
                    a.kernel = kernel;
                    kc::moe_mxfp4(a, nullptr);
                }
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name;
                const auto yh = to_host<float>(y, static_cast<size_t>(K) * H);
                const auto xg = to_host<float>(dx, H);
                const auto hg = to_host<uint16_t>(hb, H);
                const auto pg = to_host<float>(parts, tiles);
                const auto cg = to_host<uint32_t>(counters, tiles);
                size_t bad_x = 0, bad_h = 0, bad_p = 0;
                for (int j = 0; j < tiles; ++j) {
                    float sq[kc::kMoeTailTile];
                    for (int l = 0; l < kc::kMoeTailTile; ++l) {
                        const int i = j * kc::kMoeTailTile + l;
                        float acc = 0.0f;
                        for (int k = 0; k < K; ++k) acc = std::fmaf(wts[k], yh[static_cast<size_t>(k) * H + i], acc);
                        const float v = x0[i] + acc;
                        bad_x += xg[i] != v;
                        bad_h += hg[i] != f32_to_bf16(v * gain[i]);
                        sq[l] = v * v;
                    }
                    for (int o = 8; o > 0; o >>= 1) {  // the 16-lane butterfly: lane l adds lane l ^ o
                        float nx[kc::kMoeTailTile];
                        for (int l = 0; l < kc::kMoeTailTile; ++l) nx[l] = sq[l] + sq[l ^ o];
                        std::copy(nx, nx + kc::kMoeTailTile, sq);
                    }
                    bad_p += pg[j] != sq[0];
                }
                EXPECT_EQ(bad_x, 0u) << name << " E=" << E << " rep " << rep << ": residual";
                EXPECT_EQ(bad_h, 0u) << name << " E=" << E << " rep " << rep << ": h = x · gain";
                EXPECT_EQ(bad_p, 0u) << name << " E=" << E << " rep " << rep << ": Σ x² of the tiles";
                EXPECT_EQ(std::count(cg.begin(), cg.end(), 0u), tiles) << name << " E=" << E << ": counters left set";
                // y itself: the MoE of h (W4A8's e4m3 activations have their own tests and bounds).
                if (kernel != 4) {
                    EXPECT_TRUE(close(combine_assignments(y, wts, 1, K, H), cpu_moe_reference(ex, h, ids, wts, 1, K),
                                      kTolBf16Out, name))
                        << name << " E=" << E;
                }
            }
        }
    }
}

// moe_decode_mma_loop_kernel (session 37, MoeMxfp4Args::decode_loop): gate_up at 1-2 tokens as a loop
// over tiles must give the one-tile kernel's act to the bit (the same sums in the same order), with the
// resident grid and with 7 and 1 CTAs (hundreds of tiles a CTA: the copies of red and s_as rotate), at
// 32 and 128 experts, with experts shared by both tokens at 2; and down after it the same y. Down as a loop
// too (moe_decode_mma_down_loop_kernel, decode_down_loop) in variants 4-6, and at one token with
// MoeResidualTail: the same residual, h and Σ x² parts, the counters back at zero.
TEST(CudaOps, MoeDecodeMmaLoopIsTheSameBits) {
    REQUIRE_GPU();
    const int H = 2880, I = 2880, K = 4;
    for (int E : {32, 128}) {
        RandomExperts ex(E, H, I, 301 + E);
        auto gub = to_device(ex.gu_blocks), gus = to_device(ex.gu_scales), gubias = to_device(ex.gu_bias);
        auto db = to_device(ex.down_blocks), ds = to_device(ex.down_scales), dbias = to_device(ex.down_bias);
        for (int T : {1, 2}) {
            const auto h = bf16_round(randn(static_cast<size_t>(T) * H, 303 + E + T));
            auto dh = to_device(to_bf16(h));
            std::vector<int32_t> ids = {E - 1, 0, 7, 3};
            if (T == 2) ids.insert(ids.end(), {3, E / 2, E - 1, 11});  // experts 3 and E - 1 in both tokens
            auto dids = to_device(ids);
            DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
            kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
            // One-tile kernels; gate_up looping on the resident grid, 7 CTAs, 1 CTA; the same with down looping;
            // then the decode layout (moe_pack_decode): one-tile kernels, gate_up looping, both looping, gate_up
            // looping on one CTA.
            PackedExperts packed(ex, gub, gus, db, ds);
            constexpr int kVariants = 11;
            const int tiles = H / kc::kMoeTailTile;
            const auto x0 = randn(H, 307 + E, 4.0f);
            const auto gain = randn(H, 309 + E, 0.3f, 1.0f);
            auto dgain = to_device(gain);
            const std::vector<float> wts = {0.4f, 0.1f, 0.3f, 0.2f};
            auto dw = to_device(wts);
            DeviceBuffer counters(tiles * 4);
            CUDA_CHECK(cudaMemset(counters.get(), 0, tiles * 4));
            std::vector<float> acts[kVariants], ys[kVariants], xs[kVariants], parts_h[kVariants];
            std::vector<uint16_t> hs[kVariants];
            for (int v = 0; v < kVariants; ++v) {
                auto act = poisoned(static_cast<size_t>(T) * K * I * 4);
                auto y = poisoned(static_cast<size_t>(T) * K * H * 4);
                kc::MoeMxfp4Args a =
                    mxfp4_args(ex, gub, gus, gubias, db, ds, dbias, dh.get(), nullptr, offsets, sorted, act, y, T, K);
                a.kernel = 1;
                if (v < 7) {
                    a.decode_loop = v == 0 ? 0 : 1;
                    a.decode_down_loop = v >= 4 ? 1 : 0;
                    const int shape = v >= 4 ? v - 3 : v;
                    a.decode_loop_grid = shape == 2 ? 7 : shape == 3 ? 1 : 0;
                } else {
                    packed.fill(a);
                    a.decode_loop = v == 7 ? 0 : 1;
                    a.decode_down_loop = v == 9 ? 1 : 0;
                    a.decode_loop_grid = v == 10 ? 1 : 0;  // one CTA taking every tile in turn
                }
                auto dx = to_device(x0);
                auto hb = poisoned(static_cast<size_t>(H) * 2);
                auto parts = poisoned(static_cast<size_t>(tiles) * 4);
                if (T == 1) attach_tail(a, dx, dw, dgain, hb, parts, counters);  // MoeResidualTail in down's epilogue
                kc::moe_mxfp4(a, nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                acts[v] = to_host<float>(act, static_cast<size_t>(T) * K * I);
                ys[v] = to_host<float>(y, static_cast<size_t>(T) * K * H);
                if (T == 1) {
                    xs[v] = to_host<float>(dx, H);
                    hs[v] = to_host<uint16_t>(hb, H);
                    parts_h[v] = to_host<float>(parts, tiles);
                    const auto cg = to_host<uint32_t>(counters, tiles);
                    EXPECT_EQ(std::count(cg.begin(), cg.end(), 0u), tiles) << "variant " << v << ": counters left set";
                }
            }
            for (int v = 1; v < kVariants; ++v) {
                if (acts[v] != acts[0]) {  // where they differ: which act columns (8 a 16-row gate_up tile)
                    std::string where;
                    int n = 0;
                    for (size_t i = 0; i < acts[0].size(); ++i)
                        if (acts[v][i] != acts[0][i] && n++ < 24) where.append(1, ' ').append(std::to_string(i));
                    // Each wrong 8-value block (one gate_up tile's act columns): whose values it holds, if any.
                    std::string from;
                    int shown = 0;
                    for (size_t b = 0; b + 8 <= acts[0].size() && shown < 12; b += 8) {
                        if (std::equal(acts[v].begin() + b, acts[v].begin() + b + 8, acts[0].begin() + b)) continue;
                        size_t src = SIZE_MAX;
                        for (size_t c = 0; c + 8 <= acts[0].size(); c += 8)
                            if (std::equal(acts[v].begin() + b, acts[v].begin() + b + 8, acts[0].begin() + c)) src = c;
                        from.append(" ").append(std::to_string(b / 8)).append("<-");
                        from.append(src == SIZE_MAX ? std::string("?") : std::to_string(src / 8));
                        ++shown;
                    }
                    ADD_FAILURE() << "E=" << E << " T=" << T << " variant " << v << ": act differs at " << n << " of "
                                  << acts[0].size() << ":" << where
                                  << "; blocks (8 values) <- the reference's:" << from;
                }
                EXPECT_EQ(ys[v], ys[0]) << "E=" << E << " T=" << T << " variant " << v << ": y";
                if (T == 1) {
                    EXPECT_EQ(xs[v], xs[0]) << "E=" << E << " variant " << v << ": the residual tail's x";
                    EXPECT_EQ(hs[v], hs[0]) << "E=" << E << " variant " << v << ": the residual tail's h";
                    EXPECT_EQ(parts_h[v], parts_h[0]) << "E=" << E << " variant " << v << ": Σ x² parts";
                }
            }
        }
    }
}

// Grouped tensor-core kernels: moe_mma with 16- or 64-row tiles, moe_wgmma with 16- to 128-row
// tiles, itself or warp-specialized (x gathered first).
// moe_mma's 16-row tiles (small: MoeMmaArgs::small_kernel): the register-weights kernel (2, the
// default where n % 192 == 0), its 3-CTA build (3), its shared-memory-landing variant (5), or the
// shared-memory kernel (0). w4a8: moe_w4a8 (FP8 activation rows, 32- or 64-row tiles).
struct GroupedKernel {
    bool wgmma;
    int rows;
    bool ws = false;
    int small = -1;
    bool w4a8 = false;
    std::string name() const {
        return (w4a8    ? "w4a8 "
                : wgmma ? (ws ? "wgmma-ws " : "wgmma ")
                        : "mma ") +
               std::to_string(rows) + "-row" + (small >= 0 ? " (kernel " + std::to_string(small) + ")" : "");
    }
};
constexpr GroupedKernel kGroupedKernels[] = {{false, 16, false, 2},
                                             {false, 16, false, 0},
                                             {false, 16, false, 3},
                                             {false, 16, false, 5},
                                             {false, 64},
                                             {true, 16},
                                             {true, 32},
                                             {true, 64},
                                             {true, 128},
                                             {true, 16, true},
                                             {true, 32, true},
                                             {true, 64, true},
                                             {true, 128, true},
                                             {true, 32, false, -1, true},
                                             {true, 64, false, -1, true}};
// W4A8 rounds both GEMMs' activations to e4m3 with one scale per row: 3 mantissa bits, a relative
// error up to 2^-4 per element (RMS ~3.6%), which reaches a dot product's relative error about
// 1:1 with random signs; two such GEMMs with the SwiGLU between: ~5% rel L2 expected. A wrong
// fragment, order or scale is O(1).
constexpr Tol kTolW4A8{0.08, 0.3};
// moe_w4a8 against cpu_moe_w4a8 (the same scheme): the fp32 sums differ in order, which can move a
// bf16 act value across an e4m3 rounding boundary (one e4m3 step, ~6%) for the odd element.
constexpr Tol kTolW4A8Scheme{1e-2, 5e-2};

// The grouped tensor-core path on a routing plan (offsets, sorted) already on the device: tile
// list, gate_up + SwiGLU into act, down into y (per assignment). Returns y [T·K, H].
DeviceBuffer run_moe_mma(const RandomExperts& ex, const DeviceBuffer& dh, const DeviceBuffer& offsets,
                         const DeviceBuffer& sorted, int T, int K, GroupedKernel kind) {
    const int H = ex.H, I = ex.I, E = ex.E;
    auto dgub = to_device(ex.gu_blocks), dgus = to_device(ex.gu_scales), ddb = to_device(ex.down_blocks),
         dds = to_device(ex.down_scales), dgubias = to_device(ex.gu_bias), ddbias = to_device(ex.down_bias);
    const bool large = !kind.wgmma && kind.rows == kc::moe_mma_block_rows(true);
    const int bm = kind.wgmma ? kind.rows : kc::moe_mma_block_rows(large);
    const int max_tiles = (T * K + bm - 1) / bm + E;
    DeviceBuffer tiles(2 * max_tiles * 4), count(4);
    kc::moe_mma_tiles(offsets.as<int32_t>(), E, bm, max_tiles, tiles.as<int32_t>(), count.as<int32_t>(), nullptr);
    auto act = poisoned(static_cast<size_t>(T) * K * I * 2);
    auto y = poisoned(static_cast<size_t>(T) * K * H * 4);
    kc::MoeMmaArgs a;
    a.x = dh.get();
    a.x_by_token = true;
    a.experts_per_token = K;
    a.expert_offsets = offsets.as<int32_t>();
    a.sorted_assignments = sorted.as<int32_t>();
    a.tiles = tiles.as<int32_t>();
    a.tile_count = count.as<int32_t>();
    a.max_tiles = max_tiles;
    a.large = large;
    a.small_kernel = kind.small;
    a.blocks = dgub.as<uint8_t>();
    a.scales = dgus.as<uint8_t>();
    a.bias = dgubias.as<float>();
    a.act = act.get();
    a.n = 2 * I;
    a.k = H;
    a.num_experts = E;
    DeviceBuffer xg, xq, xs;
    if (kind.w4a8) {  // e4m3 rows in tile-row order, one scale each
        xq = DeviceBuffer(static_cast<size_t>(T) * K * std::max(H, I));
        xs = DeviceBuffer(static_cast<size_t>(T) * K * 4);
        kc::moe_quant_rows_fp8(dh.get(), true, sorted.as<int32_t>(), K, T * K, H, xq.as<uint8_t>(), xs.as<float>(),
                               nullptr);
        a.x = xq.get();
        a.x_by_token = false;
        a.x_scale = xs.as<float>();
    }
    if (kind.ws) {  // the warp-specialized kernel reads x in tile-row order
        xg = DeviceBuffer(static_cast<size_t>(T) * K * H * 2);
        kc::moe_gather(dh.get(), sorted.as<int32_t>(), T * K, K, H, xg.get(), nullptr);
        a.x = xg.get();
        a.x_by_token = false;
        a.num_rows = T * K;
    }
    auto run = [&](bool gate_up) {
        if (kind.w4a8)
            kc::moe_w4a8(a, gate_up, kind.rows, nullptr);
        else if (kind.wgmma)
            kc::moe_wgmma(a, gate_up, kind.rows, nullptr, kind.ws);
        else
            kc::moe_mma(a, gate_up, nullptr);
    };
    run(true);
    a.x = act.get();
    a.x_by_token = false;
    if (kind.w4a8) {
        kc::moe_quant_rows_fp8(act.get(), false, nullptr, K, T * K, I, xq.as<uint8_t>(), xs.as<float>(), nullptr);
        a.x = xq.get();
    }
    a.blocks = ddb.as<uint8_t>();
    a.scales = dds.as<uint8_t>();
    a.bias = ddbias.as<float>();
    a.y = y.as<float>();
    a.n = H;
    a.k = I;
    run(false);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y;
}

// The tensor-core grouped path (moe_plan, moe_mma_tiles, moe_mma gate_up + down) against
// the fp32 CPU MoE. The GPU rounds h and the SwiGLU output to bf16 (the inputs of the bf16 MMAs):
// relative error ~2^-9 per element, so the bf16-output tolerance (rel L2 5e-3) applies; a wrong
// fragment, scale or row mapping is O(1). Every grouped kernel and tile height; batches with a few rows per expert,
// with every token on the same 4 experts (several row tiles each), and 128 experts.
TEST(CudaOps, MoeMmaMatchesCpu) {
    REQUIRE_GPU();
    const int H = 2880, I = 2880, K = 4;
    for (int E : {32, 128}) {
        RandomExperts ex(E, H, I, 77 + E);
        for (const auto& [T, same] : {std::pair{9, false}, {64, false}, {150, true}, {40, true}}) {
            if (E == 128 && T > 64) continue;  // CPU time
            auto h = bf16_round(randn(static_cast<size_t>(T) * H, 300 * E + T));
            std::vector<int32_t> ids(T * K);
            std::vector<float> wts(T * K);
            std::mt19937 rng(2000 * E + T);
            std::uniform_real_distribution<float> uni(0.05f, 1.0f);
            const int fixed[4] = {3, E - 1, 11, 30};
            for (int t = 0; t < T; ++t) {
                std::vector<int> perm(E);
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                float sum = 0.0f;
                for (int k = 0; k < K; ++k) {
                    ids[t * K + k] = same ? fixed[(k + t) % K] : perm[k];
                    wts[t * K + k] = uni(rng);
                    sum += wts[t * K + k];
                }
                for (int k = 0; k < K; ++k) wts[t * K + k] /= sum;
            }
            const std::vector<float> ref = cpu_moe_reference(ex, h, ids, wts, T, K);
            auto dids = to_device(ids), dh = to_device(to_bf16(h));
            DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
            kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
            // W4A8 also against its own scheme on the CPU, tightly (the fp32 check above bounds the
            // scheme's error; this one the kernel's), where the CPU emulation is cheap (≤ 40 tokens).
            std::vector<float> ref_w4a8;
            if (T <= 40) ref_w4a8 = cpu_moe_w4a8(ex, h, ids, wts, T, K);
            for (const GroupedKernel& kind : kGroupedKernels) {
                const DeviceBuffer y = run_moe_mma(ex, dh, offsets, sorted, T, K, kind);
                const std::vector<float> got = combine_assignments(y, wts, T, K, H);
                EXPECT_TRUE(close(got, ref, kind.w4a8 ? kTolW4A8 : kTolBf16Out, ("moe " + kind.name()).c_str()))
                    << "E=" << E << " T=" << T << (same ? " same experts" : "");
                if (kind.w4a8 && !ref_w4a8.empty()) {
                    EXPECT_TRUE(close(got, ref_w4a8, kTolW4A8Scheme, ("moe scheme " + kind.name()).c_str()))
                        << "E=" << E << " T=" << T << (same ? " same experts" : "");
                }
            }
        }
    }
}

// The same path at a MoE-TP2 shard's widths (I = 1440: gate_up n = 2880 takes moe_mma's 64-column
// tiles, down k = 1440 has 45 groups, so moe_mma's last 4-group stage and moe_wgmma's last 2-group
// step are partial) with scales the random
// experts above never have: 129–132 (2^(s - 1) is not a bf16: the two-multiply path) on two
// experts' gate_up, and 0 (2^-127) on one expert's down.
TEST(CudaOps, MoeMmaEdgeShapesAndScales) {
    REQUIRE_GPU();
    const int H = 2880, I = 1440, K = 4, E = 32, T = 40;
    RandomExperts ex(E, H, I, 91);
    const size_t gu_s = static_cast<size_t>(2) * I * H / 32, dn_s = static_cast<size_t>(H) * I / 32;
    for (int e : {3, 30})
        for (size_t i = 0; i < gu_s; ++i) ex.gu_scales[e * gu_s + i] = static_cast<uint8_t>(129 + i % 4);
    for (size_t i = 0; i < dn_s; ++i) ex.down_scales[11 * dn_s + i] = 0;
    auto h = bf16_round(randn(static_cast<size_t>(T) * H, 92));
    std::vector<int32_t> ids(T * K);
    std::vector<float> wts(T * K, 0.25f);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) ids[t * K + k] = (k == 0 ? (t % 2 ? 3 : 30) : k == 1 ? 11 : (7 * t + 5 * k) % E);
    for (int t = 0; t < T; ++t)  // distinct experts per token
        if (ids[t * K + 2] == ids[t * K + 3] || ids[t * K + 2] == ids[t * K] || ids[t * K + 2] == 11 ||
            ids[t * K + 3] == ids[t * K] || ids[t * K + 3] == 11) {
            ids[t * K + 2] = 20;
            ids[t * K + 3] = 21;
        }
    const std::vector<float> ref = cpu_moe_reference(ex, h, ids, wts, T, K);
    // W4A8 against its own scheme on the CPU: on these rows the scheme itself is 0.207 (rel L2) off
    // the fp32 MoE (r21: the GPU and the CPU emulation agree on it to 4 digits, element 74,879
    // included), because the extreme gate_up scales saturate the SwiGLU and the per-row e4m3 scale
    // then rounds whole rows of ±42 the same way.
    const std::vector<float> ref_w4a8 = cpu_moe_w4a8(ex, h, ids, wts, T, K);
    auto dids = to_device(ids), dh = to_device(to_bf16(h));
    DeviceBuffer offsets((E + 1) * 4), sorted(T * K * 4);
    kc::moe_plan(dids.as<int32_t>(), T * K, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
    for (const GroupedKernel& kind : kGroupedKernels) {
        if (kind.rows == 64 && !kind.wgmma) continue;  // MoeMmaMatchesCpu covers it; the 16-row tiles run here
        const DeviceBuffer y = run_moe_mma(ex, dh, offsets, sorted, T, K, kind);
        EXPECT_TRUE(close(combine_assignments(y, wts, T, K, H), kind.w4a8 ? ref_w4a8 : ref,
                          kind.w4a8 ? kTolW4A8Scheme : kTolBf16Out,
                          ("moe edge shapes and scales, " + kind.name()).c_str()));
    }
}

// W4A8 with activations e4m3 holds exactly: every row is e4m3 values times 2^-8 and contains
// ±1.75 (448 · 2^-8), so its scale is exactly 2^-8 and quantizing loses nothing. Checks the
// quantizer bit for bit (scale, element order inside each group), and gate_up + SwiGLU against the
// CPU at the bf16-output tolerance: a flushed e4m3 subnormal or a scale a few percent off fails
// here, where MoeMmaMatchesCpu's FP8 tolerance would not see it.
// moe_w4a8's arguments over e4m3 rows xq (one scale each in xs, tile-row order) and a routing plan:
// the bm-row tiles listed on the device; the caller adds the weights, the output, n and k.
struct W4A8Tiles {
    static constexpr int bm = 32;
    int max_tiles;
    DeviceBuffer tiles, count;
    kc::MoeMmaArgs args;
    W4A8Tiles(const DeviceBuffer& xq, const DeviceBuffer& xs, const DeviceBuffer& offsets, const DeviceBuffer& sorted,
              int E, int K, int A)
        : max_tiles((A + bm - 1) / bm + E), tiles(2 * max_tiles * 4), count(4) {
        kc::moe_mma_tiles(offsets.as<int32_t>(), E, bm, max_tiles, tiles.as<int32_t>(), count.as<int32_t>(), nullptr);
        args.x = xq.get();
        args.x_by_token = false;
        args.x_scale = xs.as<float>();
        args.experts_per_token = K;
        args.expert_offsets = offsets.as<int32_t>();
        args.sorted_assignments = sorted.as<int32_t>();
        args.tiles = tiles.as<int32_t>();
        args.tile_count = count.as<int32_t>();
        args.max_tiles = max_tiles;
        args.num_experts = E;
    }
};

// Rows of e4m3 values times 2^-8, each with a ±1.75 (448 · 2^-8): their FP8 scale is exactly 2^-8.
std::vector<float> exact_e4m3_rows(int rows, int dim, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> h(static_cast<size_t>(rows) * dim);
    for (int t = 0; t < rows; ++t) {
        for (int k = 0; k < dim; ++k) {
            uint8_t b;
            do {
                b = static_cast<uint8_t>(rng());
            } while ((b & 0x7f) == 0x7f);  // e4m3 NaN
            h[static_cast<size_t>(t) * dim + k] = std::ldexp(fp8e4m3_to_f32(b), -8);
        }
        h[static_cast<size_t>(t) * dim + (97 * t) % dim] = (t & 1) ? -1.75f : 1.75f;
    }
    return h;
}

// Also with MoeMmaEdgeShapesAndScales' scale bytes on gate_up (129–132 on expert 1, 0 on expert 2),
// which the W4A8 kernels failed in r21 (rel L2 0.21): this isolates gate_up from down.
TEST(CudaOps, MoeW4A8ExactActivations) {
    REQUIRE_GPU();
    for (bool extreme : {false, true}) {
        const int H = 2880, I = 1440, K = 4, E = 4, T = 16, A = T * K;
        RandomExperts ex(E, H, I, 123);
        if (extreme) {
            const size_t gu_s = static_cast<size_t>(2) * I * H / 32;
            for (size_t i = 0; i < gu_s; ++i) {
                ex.gu_scales[gu_s + i] = static_cast<uint8_t>(129 + i % 4);
                ex.gu_scales[2 * gu_s + i] = 0;
            }
        }
        const std::vector<float> h = exact_e4m3_rows(T, H, 9);
        std::vector<int32_t> ids(A);
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k) ids[t * K + k] = (t + k) % E;
        auto dids = to_device(ids), dh = to_device(to_bf16(h));
        DeviceBuffer offsets((E + 1) * 4), sorted(A * 4);
        kc::moe_plan(dids.as<int32_t>(), A, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
        DeviceBuffer xq(static_cast<size_t>(A) * H), xs(A * 4);
        kc::moe_quant_rows_fp8(dh.get(), true, sorted.as<int32_t>(), K, A, H, xq.as<uint8_t>(), xs.as<float>(),
                               nullptr);
        const auto srt = to_host<int32_t>(sorted, A), off = to_host<int32_t>(offsets, E + 1);
        const auto q = to_host<uint8_t>(xq, static_cast<size_t>(A) * H);
        const auto sc = to_host<float>(xs, A);
        for (int i = 0; i < A; ++i) {
            ASSERT_EQ(sc[i], std::ldexp(1.0f, -8)) << "row " << i;
            const int tok = srt[i] / K;
            for (int k = 0; k < H; ++k) {
                const int r = k & 31, pos = (k - r) + (r & 1) * 16 + (r >> 3) * 4 + ((r & 7) >> 1);
                ASSERT_EQ(std::ldexp(fp8e4m3_to_f32(q[static_cast<size_t>(i) * H + pos]), -8),
                          h[static_cast<size_t>(tok) * H + k])
                    << "row " << i << " element " << k;
            }
        }

        W4A8Tiles w4(xq, xs, offsets, sorted, E, K, A);
        auto dgub = to_device(ex.gu_blocks), dgus = to_device(ex.gu_scales), dgubias = to_device(ex.gu_bias);
        auto act = poisoned(static_cast<size_t>(A) * I * 2);
        kc::MoeMmaArgs& a = w4.args;
        a.blocks = dgub.as<uint8_t>();
        a.scales = dgus.as<uint8_t>();
        a.bias = dgubias.as<float>();
        a.act = act.get();
        a.n = 2 * I;
        a.k = H;
        kc::moe_w4a8(a, true, W4A8Tiles::bm, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = from_bf16(to_host<uint16_t>(act, static_cast<size_t>(A) * I));

        // ref: SwiGLU of the exact pre-activations; slack: how far SwiGLU moves when gate and up move
        // by the accumulation bound 2^-12 · Σ|w·x| (FP8 wgmma sums each 32-product group keeping
        // ~14 bits, DeepSeek-V3 §3.3.2; each group then meets the fp32 accumulator). On the extreme
        // scales (×4 .. ×32) the pre-activations reach hundreds, so that bound is what the bf16
        // tolerance cannot cover; on regular scales it is far below it.
        std::vector<float> ref(static_cast<size_t>(A) * I), slack(ref.size()), w0(H), w1(H);
        const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
        auto swiglu = [&](double gate, double up) {
            gate = std::min(gate, static_cast<double>(lim));
            up = std::clamp(up, -static_cast<double>(lim), static_cast<double>(lim));
            return (up + 1.0) * gate / (1.0 + std::exp(-alpha * gate));
        };
        for (int e = 0; e < E; ++e)
            for (int n = 0; n < 2 * I; n += 2) {
                const size_t row = static_cast<size_t>(e) * 2 * I + n;  // gate row; up is row + 1
                cpu::mxfp4_row_to_f32(ex.gu_blocks.data() + row * H / 2, ex.gu_scales.data() + row * H / 32, H,
                                      w0.data());
                cpu::mxfp4_row_to_f32(ex.gu_blocks.data() + (row + 1) * H / 2, ex.gu_scales.data() + (row + 1) * H / 32,
                                      H, w1.data());
                for (int i = off[e]; i < off[e + 1]; ++i) {
                    const float* x = h.data() + static_cast<size_t>(srt[i] / K) * H;
                    double gate = 0.0, up = 0.0, mg = 0.0, mu = 0.0;
                    for (int k = 0; k < H; ++k) {
                        gate += static_cast<double>(w0[k]) * x[k];
                        up += static_cast<double>(w1[k]) * x[k];
                        mg += std::fabs(static_cast<double>(w0[k]) * x[k]);
                        mu += std::fabs(static_cast<double>(w1[k]) * x[k]);
                    }
                    gate += ex.gu_bias[row];
                    up += ex.gu_bias[row + 1];
                    const double y = swiglu(gate, up), bg = std::ldexp(mg, -12), bu = std::ldexp(mu, -12);
                    double move = 0.0;  // the box [gate ± bg] × [up ± bu] on a 9 × 9 grid
                    for (int p = -4; p <= 4; ++p)
                        for (int q = -4; q <= 4; ++q)
                            move = std::max(move, std::fabs(swiglu(gate + p * bg / 4, up + q * bu / 4) - y));
                    const size_t o = static_cast<size_t>(i) * I + n / 2;
                    ref[o] = static_cast<float>(y);
                    slack[o] = static_cast<float>(1.25 * move);
                }
            }
        if (!extreme) {
            EXPECT_TRUE(close(got, ref, kTolBf16Out, "w4a8 gate_up on exact activations"));
        } else {
            // Per element: the bf16 output's rounding (2^-8 relative) plus the slack, plus 1e-3 absolute
            // for outputs near zero (the slack is 2^-12 of a typical group's precision, DeepSeek-V3's
            // "about 14 bits", not a worst case: so this errs towards false failures, not passes).
            int bad = 0;
            float worst_slack = 0.0f;
            for (size_t i = 0; i < ref.size(); ++i) {
                worst_slack = std::max(worst_slack, slack[i]);
                const float tol = std::ldexp(std::fabs(ref[i]), -8) + slack[i] + 1e-3f;
                if (!(std::fabs(got[i] - ref[i]) <= tol) && ++bad <= 5)
                    ADD_FAILURE() << "extreme scales, element " << i << ": " << got[i] << " vs " << ref[i] << " (tol "
                                  << tol << ")";
            }
            std::printf(
                "  w4a8 gate_up, extreme scales: %d of %zu outside bf16 rounding + accumulation slack "
                "(largest slack %.3g)\n",
                bad, ref.size(), worst_slack);
            EXPECT_EQ(bad, 0);
            EXPECT_TRUE(close(got, ref, Tol{5e-3, 1.0}, "w4a8 gate_up, extreme scales (rel L2 only)"));
        }
    }
}

// The W4A8 down projection alone at k = 1440 (45 groups: the last K step holds one) on exact e4m3
// activation rows, with down scales 0 (2^-127) on expert 2: y rows at their assignments against the
// CPU at the bf16-output tolerance (the products are exact; only the fp32 sums differ).
TEST(CudaOps, MoeW4A8ExactDown) {
    REQUIRE_GPU();
    const int H = 2880, I = 1440, K = 4, E = 4, T = 16, A = T * K;
    RandomExperts ex(E, H, I, 124);
    const size_t dn_s = static_cast<size_t>(H) * I / 32;
    for (size_t i = 0; i < dn_s; ++i) ex.down_scales[2 * dn_s + i] = 0;
    const std::vector<float> x = exact_e4m3_rows(A, I, 10);  // row i: the input of sorted row i
    std::vector<int32_t> ids(A);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) ids[t * K + k] = (t + k) % E;
    auto dids = to_device(ids), dx = to_device(to_bf16(x));
    DeviceBuffer offsets((E + 1) * 4), sorted(A * 4);
    kc::moe_plan(dids.as<int32_t>(), A, E, offsets.as<int32_t>(), sorted.as<int32_t>(), nullptr);
    DeviceBuffer xq(static_cast<size_t>(A) * I), xs(A * 4);
    kc::moe_quant_rows_fp8(dx.get(), false, nullptr, K, A, I, xq.as<uint8_t>(), xs.as<float>(), nullptr);
    const auto srt = to_host<int32_t>(sorted, A), off = to_host<int32_t>(offsets, E + 1);
    W4A8Tiles w4(xq, xs, offsets, sorted, E, K, A);
    auto ddb = to_device(ex.down_blocks), dds = to_device(ex.down_scales), ddbias = to_device(ex.down_bias);
    auto y = poisoned(static_cast<size_t>(A) * H * 4);
    kc::MoeMmaArgs& a = w4.args;
    a.blocks = ddb.as<uint8_t>();
    a.scales = dds.as<uint8_t>();
    a.bias = ddbias.as<float>();
    a.y = y.as<float>();
    a.n = H;
    a.k = I;
    kc::moe_w4a8(a, false, W4A8Tiles::bm, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<float>(y, static_cast<size_t>(A) * H);
    std::vector<float> ref(static_cast<size_t>(A) * H), w(I);
    for (int e = 0; e < E; ++e)
        for (int n = 0; n < H; ++n) {
            const size_t row = static_cast<size_t>(e) * H + n;
            cpu::mxfp4_row_to_f32(ex.down_blocks.data() + row * I / 2, ex.down_scales.data() + row * I / 32, I,
                                  w.data());
            for (int i = off[e]; i < off[e + 1]; ++i) {
                double d = 0.0;
                for (int k = 0; k < I; ++k) d += static_cast<double>(w[k]) * x[static_cast<size_t>(i) * I + k];
                ref[static_cast<size_t>(srt[i]) * H + n] = static_cast<float>(d) + ex.down_bias[row];
            }
        }
    EXPECT_TRUE(close(got, ref, kTolBf16Out, "w4a8 down on exact activations"));
}

TEST(CudaOps, Mxfp4ToBf16IsExact) {
    REQUIRE_GPU();
    RandomExperts ex(2, 64, 96, 7);
    const int64_t rows = 2 * 2 * 96;
    std::vector<float> ref(static_cast<size_t>(rows) * 64);
    for (int64_t r = 0; r < rows; ++r)
        cpu::mxfp4_row_to_f32(ex.gu_blocks.data() + r * 2 * 16, ex.gu_scales.data() + r * 2, 64, ref.data() + r * 64);
    auto db = to_device(ex.gu_blocks), ds = to_device(ex.gu_scales);
    auto out = poisoned(ref.size() * 2);
    kc::mxfp4_to_bf16(db.as<uint8_t>(), ds.as<uint8_t>(), rows, 64, out.get(), nullptr);
    auto got = from_bf16(to_host<uint16_t>(out, ref.size()));
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i], ref[i]) << i;
}

// One call of kc::sample on device logits: every row with the same parameters (temperature per row where `temps`
// is given); `extra` sets the optional fields (row_index, allowed_bits, workspace) on the args before the call.
std::vector<int32_t> run_sample(const DeviceBuffer& logits, int rows, int V, std::vector<float> temps, float top_p,
                                int top_k, uint64_t seed, uint64_t draw,
                                const std::function<void(kc::SampleArgs&)>& extra = {}) {
    std::vector<float> p(rows, top_p);
    std::vector<int32_t> k(rows, top_k);
    std::vector<uint64_t> sd(rows, seed), dr(rows, draw);
    auto dt = to_device(temps), dp = to_device(p), dk = to_device(k), dsd = to_device(sd), ddr = to_device(dr);
    auto out = poisoned(rows * 4);
    kc::SampleArgs a;
    a.logits = logits.as<float>();
    a.temperature = dt.as<float>();
    a.top_p = dp.as<float>();
    a.top_k = dk.as<int32_t>();
    a.seed = dsd.as<uint64_t>();
    a.draw_index = ddr.as<uint64_t>();
    a.out = out.as<int32_t>();
    a.num_seqs = rows;
    a.vocab_size = V;
    if (extra) extra(a);
    kc::sample(a, nullptr);
    return to_host<int32_t>(out, rows);
}

TEST(CudaOps, SamplingGreedyTopKTopP) {
    REQUIRE_GPU();
    constexpr int S = 8, V = 201088;
    auto logits = randn(static_cast<size_t>(S) * V, 99, 2.0f);
    auto dl = to_device(logits);
    // The split arg-max's workspace (zeroed once; the kernels must leave it zeroed).
    DeviceBuffer work(kc::sample_workspace_bytes(S));
    ASSERT_EQ(cudaMemset(work.get(), 0, kc::sample_workspace_bytes(S)), cudaSuccess);
    // temps: per-row temperatures (empty: `temp` for all); split: greedy rows by argmax_split_kernel.
    auto run = [&](float temp, float top_p, int top_k, uint64_t seed, uint64_t draw, bool split = false,
                   std::vector<float> t = {}, const DeviceBuffer* rows = nullptr, int n = 0) {
        if (n == 0) n = S;
        if (t.empty()) t.assign(S, temp);
        t.resize(n);
        return run_sample(rows != nullptr ? *rows : dl, n, V, t, top_p, top_k, seed, draw,
                          [&](kc::SampleArgs& a) { a.workspace = split ? work.get() : nullptr; });
    };
    auto greedy = run(0.0f, 1.0f, 0, 1, 0);
    for (int s = 0; s < S; ++s) {
        const float* row = logits.data() + static_cast<size_t>(s) * V;
        EXPECT_EQ(greedy[s], std::max_element(row, row + V) - row);
    }
    EXPECT_EQ(run(1.0f, 1.0f, 1, 5, 3), greedy);  // top-k 1 is greedy
    // The split arg-max: the same tokens, twice in a row (its tickets reset themselves), and in a
    // batch mixing greedy and sampled rows, each row as when alone.
    EXPECT_EQ(run(0.0f, 1.0f, 0, 1, 0, true), greedy);
    EXPECT_EQ(run(0.0f, 1.0f, 0, 1, 0, true), greedy);
    {  // fewer rows on the same workspace, then all again: each row's ticket stays where it was reset
        const auto few = run(0.0f, 1.0f, 0, 1, 0, true, {}, nullptr, 3);
        for (int s = 0; s < 3; ++s) EXPECT_EQ(few[s], greedy[s]) << s;
        EXPECT_EQ(run(0.0f, 1.0f, 0, 1, 0, true), greedy);
    }
    {
        std::vector<float> mixed(S);
        for (int s = 0; s < S; ++s) mixed[s] = s % 2 ? 0.7f : 0.0f;
        const auto sampled = run(0.7f, 1.0f, 0, 9, 2);
        const auto got = run(0.0f, 1.0f, 0, 9, 2, true, mixed);
        for (int s = 0; s < S; ++s) EXPECT_EQ(got[s], s % 2 ? sampled[s] : greedy[s]) << s;
    }
    {  // ties: the lower id, across the split's slices and within one
        auto tied = logits;
        for (int s = 0; s < S; ++s) {
            float* row = tied.data() + static_cast<size_t>(s) * V;
            for (int i : {150001, 70000 + s, 150000, 70001 + s}) row[i] = 100.0f;
        }
        auto dtied = to_device(tied);
        const auto a = run(0.0f, 1.0f, 0, 1, 0, true, {}, &dtied), b = run(0.0f, 1.0f, 0, 1, 0, false, {}, &dtied);
        for (int s = 0; s < S; ++s) {
            EXPECT_EQ(a[s], 70000 + s);
            EXPECT_EQ(b[s], 70000 + s);
        }
    }
    // top-k 5: every draw is among the 5 largest; top-p 0.5 at temperature 0.5: inside the nucleus.
    for (uint64_t draw = 0; draw < 20; ++draw) {
        auto got = run(1.0f, 1.0f, 5, 11, draw);
        auto nucleus = run(0.5f, 0.5f, 0, 12, draw);
        for (int s = 0; s < S; ++s) {
            const float* row = logits.data() + static_cast<size_t>(s) * V;
            std::vector<int> idx(V);
            std::iota(idx.begin(), idx.end(), 0);
            std::partial_sort(idx.begin(), idx.begin() + 64, idx.end(), [&](int a, int b) { return row[a] > row[b]; });
            EXPECT_NE(std::find(idx.begin(), idx.begin() + 5, got[s]), idx.begin() + 5);
            // Nucleus at T=0.5 over N(0, 2²) logits: p ∝ e^{2l}; the kept set is tiny and sorted first.
            double z = 0, mass = 0;
            for (int i = 0; i < V; ++i) z += std::exp(2.0 * (row[i] - row[idx[0]]));
            int rank = 0;
            while (idx[rank] != nucleus[s] && rank < 63) mass += std::exp(2.0 * (row[idx[rank++]] - row[idx[0]])) / z;
            EXPECT_LT(mass, 0.5 + 1e-6) << "draw outside the nucleus";
        }
    }
    // Same seed and draw -> same token; a different draw index -> (almost surely) some differ.
    EXPECT_EQ(run(1.0f, 1.0f, 0, 77, 4), run(1.0f, 1.0f, 0, 77, 4));
    EXPECT_NE(run(1.0f, 1.0f, 0, 77, 4), run(1.0f, 1.0f, 0, 77, 5));
}

// The split draw (SampleArgs::split_draws: kSplit CTAs a row over a sequence of launches) gives the one-CTA
// kernel's tokens: peaked and flat rows, greedy rows among sampled ones, temperature alone, top-k, top-p, min-p and
// their mixes, a mask, many draws; calls in a row and a smaller call between (the per-row state left zeroed).
TEST(CudaOps, SplitDrawsAreTheOneCtaDraws) {
    REQUIRE_GPU();
    constexpr int S = 6, V = 201088, W = (V + 31) / 32;
    for (int flat = 0; flat < 2; ++flat) {
        auto logits = randn(static_cast<size_t>(S) * V, 31 + flat, 2.0f);
        if (flat)
            for (float& l : logits) l = 6.0f + 0.01f * l;
        auto dl = to_device(logits);
        std::vector<uint32_t> bits(static_cast<size_t>(S) * W, ~0u);
        for (int i = 0; i < V; i += 3) bits[static_cast<size_t>(4) * W + i / 32] &= ~(1u << (i % 32));  // row 4
        auto dbits = to_device(bits);
        DeviceBuffer work(kc::sample_workspace_bytes(S));
        ASSERT_EQ(cudaMemset(work.get(), 0, kc::sample_workspace_bytes(S)), cudaSuccess);
        const std::vector<float> mp = {0.0f, 0.0f, 0.05f, 0.0f, 0.02f, 0.0f};
        auto dmp = to_device(mp);
        struct Case {
            float top_p;
            int top_k;
        };
        for (const Case& c : {Case{1.0f, 0}, Case{0.9f, 0}, Case{1.0f, 40}, Case{0.8f, 100}, Case{0.5f, 0}}) {
            for (uint64_t draw = 0; draw < 5; ++draw) {
                // Rows 1 and 5 greedy; the others at temperatures 0.6-1.4.
                const std::vector<float> temps = {0.6f, 0.0f, 1.0f, 1.4f, 0.8f, 0.0f};
                for (int rows : {S, 3}) {
                    const auto setup = [&](bool split) {
                        return [&, split](kc::SampleArgs& a) {
                            a.min_p = dmp.as<float>();
                            a.allowed_bits = dbits.as<uint32_t>();
                            a.workspace = split ? work.get() : nullptr;
                            a.split_draws = split;
                        };
                    };
                    const std::vector<float> t(temps.begin(), temps.begin() + rows);
                    const auto one = run_sample(dl, rows, V, t, c.top_p, c.top_k, 17, draw, setup(false));
                    const auto split = run_sample(dl, rows, V, t, c.top_p, c.top_k, 17, draw, setup(true));
                    EXPECT_EQ(split, one) << "flat " << flat << " top_p " << c.top_p << " top_k " << c.top_k << " draw "
                                          << draw << " rows " << rows;
                    for (int r = 0; r < rows; ++r) EXPECT_GE(split[r], 0) << r;
                }
            }
        }
    }
}

// The host sampler's edits on the device (edit_logits): rows through row_index, bias, repetition (both signs) and
// penalties, bit for bit the host's apply_logit_edits; then min_p: every draw within the cut.
TEST(CudaOps, LogitEditsAreTheHostsAndMinPCuts) {
    REQUIRE_GPU();
    constexpr int S = 3, V = 201088;
    auto logits = randn(static_cast<size_t>(S) * V, 77, 2.0f);
    std::mt19937 rng(3);
    std::vector<runtime::LogitEdits> edits(S);
    for (int s = 0; s < S; ++s) {
        std::vector<int32_t> ids(V);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        runtime::LogitEdits& e = edits[s];
        for (int j = 0; j < 10 * s; ++j) e.add.emplace_back(ids[j], 0.37f * static_cast<float>(j % 7) - 1.0f);
        e.repeat.assign(ids.begin() + 100, ids.begin() + 100 + 700 * s);
        e.repetition = 1.0f + 0.3f * static_cast<float>(s);
        for (int j = 0; j < 400; ++j) e.subtract.emplace_back(ids[5000 + j], 0.11f * static_cast<float>(j % 5) + 0.5f);
    }
    // Device row r holds host row S - 1 - r.
    std::vector<float> dev(logits.size());
    for (int s = 0; s < S; ++s)
        std::copy_n(logits.data() + static_cast<size_t>(s) * V, V, dev.data() + static_cast<size_t>(S - 1 - s) * V);
    std::vector<int32_t> index(S), add_off{0}, rep_off{0}, sub_off{0}, add_id, rep_id, sub_id;
    std::vector<float> add_v, rep_f, sub_v;
    for (int s = 0; s < S; ++s) {
        index[s] = S - 1 - s;
        for (auto [id, v] : edits[s].add) add_id.push_back(id), add_v.push_back(v);
        for (int32_t id : edits[s].repeat) rep_id.push_back(id);
        for (auto [id, v] : edits[s].subtract) sub_id.push_back(id), sub_v.push_back(v);
        add_off.push_back(static_cast<int32_t>(add_id.size()));
        rep_off.push_back(static_cast<int32_t>(rep_id.size()));
        sub_off.push_back(static_cast<int32_t>(sub_id.size()));
        rep_f.push_back(edits[s].repetition);
    }
    add_id.push_back(0), add_v.push_back(0.0f);  // no empty buffers
    auto dl = to_device(dev), dindex = to_device(index), dao = to_device(add_off), dro = to_device(rep_off),
         dso = to_device(sub_off), dai = to_device(add_id), dav = to_device(add_v), dri = to_device(rep_id),
         drf = to_device(rep_f), dsi = to_device(sub_id), dsv = to_device(sub_v);
    kc::LogitEditArgs ea;
    ea.logits = dl.as<float>();
    ea.row_index = dindex.as<int32_t>();
    ea.num_seqs = S;
    ea.vocab_size = V;
    ea.add_offset = dao.as<int32_t>();
    ea.add_id = dai.as<int32_t>();
    ea.add_value = dav.as<float>();
    ea.repeat_offset = dro.as<int32_t>();
    ea.repeat_id = dri.as<int32_t>();
    ea.repetition = drf.as<float>();
    ea.subtract_offset = dso.as<int32_t>();
    ea.subtract_id = dsi.as<int32_t>();
    ea.subtract_value = dsv.as<float>();
    kc::edit_logits(ea, nullptr);
    const auto got = to_host<float>(dl, dev.size());
    for (int s = 0; s < S; ++s) {
        std::vector<float> want(logits.begin() + static_cast<long>(s) * V,
                                logits.begin() + static_cast<long>(s + 1) * V);
        runtime::apply_logit_edits(edits[s], want.data());
        ASSERT_EQ(std::memcmp(want.data(), got.data() + static_cast<size_t>(S - 1 - s) * V, 4u * V), 0) << s;
    }
    // min_p 0.2 at temperature 1 on the edited rows: p / p_max >= 0.2 for every draw (1e-5 for the exp's rounding).
    const std::vector<float> mp(S, 0.2f);
    auto dmp = to_device(mp);
    for (uint64_t draw = 0; draw < 20; ++draw) {
        const auto ids = run_sample(dl, S, V, std::vector<float>(S, 1.0f), 1.0f, 0, 5, draw,
                                    [&](kc::SampleArgs& a) { a.min_p = dmp.as<float>(); });
        for (int s = 0; s < S; ++s) {
            const float* row = got.data() + static_cast<size_t>(s) * V;
            const float mx = *std::max_element(row, row + V);
            ASSERT_GE(ids[s], 0);
            EXPECT_GE(std::exp(static_cast<double>(row[ids[s]]) - mx), 0.2 * (1 - 1e-5)) << s << " " << ids[s];
        }
    }
}

// The masked draw (SampleArgs::allowed_bits, row_index): token for token the draw on rows whose excluded logits
// are -1e30 (finite, so the row check still passes; exp underflows to 0 and no Gumbel noise lifts it, so it is the
// draw with those tokens at -inf), for greedy rows on both arg-max kernels, top-k, top-p and plain temperature;
// every id allowed; rows read through row_index; an all-excluded row gives -1 and a NaN row -1.
TEST(CudaOps, SamplingUnderAMaskIsTheDrawWithTheRestAtMinusInfinity) {
    REQUIRE_GPU();
    constexpr int S = 6, V = 201088, W = (V + 31) / 32;
    auto logits = randn(static_cast<size_t>(S) * V, 41, 2.0f);
    std::vector<uint32_t> bits(static_cast<size_t>(S) * W, 0u);
    std::vector<float> masked = logits;
    std::mt19937 rng(5);
    for (int s = 0; s < S; ++s) {
        // Row s allows 1 in 2^s of the tokens (row 5 about 6,000), plus the last one (a partial last word).
        const uint32_t keep = (1u << s) - 1;
        for (int i = 0; i < V; ++i) {
            const bool ok = (rng() & keep) == 0 || i == V - 1;
            if (ok)
                bits[static_cast<size_t>(s) * W + i / 32] |= 1u << (i % 32);
            else
                masked[static_cast<size_t>(s) * V + i] = -1e30f;
        }
    }
    // Rows read in reverse through row_index: the logits buffer holds them as S - 1 - s.
    std::vector<float> reversed(logits.size());
    for (int s = 0; s < S; ++s)
        std::copy_n(logits.data() + static_cast<size_t>(s) * V, V,
                    reversed.data() + static_cast<size_t>(S - 1 - s) * V);
    std::vector<int32_t> index(S);
    for (int s = 0; s < S; ++s) index[s] = S - 1 - s;
    auto drev = to_device(reversed), dmasked = to_device(masked), dbits = to_device(bits), dindex = to_device(index);
    DeviceBuffer work(kc::sample_workspace_bytes(S));
    ASSERT_EQ(cudaMemset(work.get(), 0, kc::sample_workspace_bytes(S)), cudaSuccess);
    auto run = [&](bool with_mask, float temp, float top_p, int top_k, uint64_t draw, bool split) {
        return run_sample(with_mask ? drev : dmasked, S, V, std::vector<float>(S, temp), top_p, top_k, 13, draw,
                          [&](kc::SampleArgs& a) {
                              a.row_index = with_mask ? dindex.as<int32_t>() : nullptr;
                              a.allowed_bits = with_mask ? dbits.as<uint32_t>() : nullptr;
                              a.workspace = split ? work.get() : nullptr;
                          });
    };
    struct Case {
        float temp, top_p;
        int top_k;
        bool split;
    };
    for (const Case& c : {Case{0.0f, 1.0f, 0, false}, Case{0.0f, 1.0f, 0, true}, Case{1.0f, 1.0f, 0, false},
                          Case{0.8f, 1.0f, 20, false}, Case{0.7f, 0.6f, 0, true}, Case{1.2f, 0.9f, 50, false}}) {
        for (uint64_t draw = 0; draw < 6; ++draw) {
            const auto got = run(true, c.temp, c.top_p, c.top_k, draw, c.split);
            const auto want = run(false, c.temp, c.top_p, c.top_k, draw, c.split);
            EXPECT_EQ(got, want) << c.temp << " " << c.top_p << " " << c.top_k << " " << c.split << " draw " << draw;
            for (int s = 0; s < S; ++s) {
                ASSERT_GE(got[s], 0);
                EXPECT_TRUE((bits[static_cast<size_t>(s) * W + got[s] / 32] >> (got[s] % 32)) & 1u)
                    << s << " " << got[s];
            }
        }
    }
    // Nothing allowed in row 2, a NaN in row 4: -1 for those rows only, on both kernels.
    std::vector<uint32_t> none = bits;
    std::fill_n(none.begin() + 2 * W, W, 0u);
    reversed[static_cast<size_t>(S - 1 - 4) * V + 77] = std::nanf("");
    drev = to_device(reversed);
    dbits = to_device(none);
    for (bool split : {false, true})
        for (float temp : {0.0f, 1.0f}) {
            const auto got = run(true, temp, 1.0f, 0, 0, split);
            for (int s = 0; s < S; ++s) {
                if (s == 2 || s == 4) {
                    EXPECT_EQ(got[s], -1) << s << " " << split << " " << temp;
                } else {
                    EXPECT_GE(got[s], 0) << s;
                }
            }
        }
}

}  // namespace
}  // namespace gptoss::test
