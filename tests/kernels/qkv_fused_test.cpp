// The fused decode QKV GEMV + bias + RoPE + KV write against the two-kernel path it replaces
// (gemv_bf16w legacy, then qkv_bias_rope_kv_write, itself tested against the CPU reference in
// ops_test.cpp). Same arithmetic in the same order: the outputs must agree to the bit, up to FMA
// contraction choices the compiler may make differently (≤ 1 bf16 ulp allowed, on < 0.1% of values).
// FP8 weights run every kernel (GemvFp8Kernel): one warp per row against the legacy GEMV; the
// tensor-core kernel, and its one-wave variant, against the plain GEMV of the same kind (the same
// tiles' sums, other rows per tile); the tensor-core kernel again with an FP8 (e4m3) KV cache,
// whose bytes must agree but for ≤ 0.1% that are neighbouring e4m3 codes (the same
// FMA-contraction caveat, one e4m3 step instead of one bf16 ulp); and the tensor-core kernels' f16
// MMAs (the default) against their bf16 MMAs, under the same bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/ops.h"

namespace gptoss::kernels::cuda {
namespace {

TEST(CudaQkvFused, MatchesGemvThenRope) {
    REQUIRE_GPU();
    const int H = 2880, hd = 64;
    // bf16; FP8 one warp per row; FP8 on the tensor cores; + FP8 KV; the one-wave tensor-core variant;
    // 5, 6: the tensor-core kernel and its one-wave variant (f16 MMAs, the default) against the plain
    // GEMV with bf16 MMAs (GemvArgs::mma_f16 = false: the same products but for x below 2^-14).
    for (int variant : {0, 1, 2, 3, 4, 5, 6}) {
        const bool fp8 = variant > 0, kv8 = variant == 3, ref_bf16_mma = variant >= 5;
        const GemvFp8Kernel kind = variant == 4 || variant == 6 ? GemvFp8Kernel::kMmaOneWave
                                   : variant >= 2               ? GemvFp8Kernel::kMma
                                                                : GemvFp8Kernel::kRowPerWarp;
        for (int nkv : {8, 4, 1}) {
            const int nq = 8 * nkv, n = (nq + 2 * nkv) * hd;
            for (int T : {1, 3, 8}) {
                const auto x = test::randn(static_cast<size_t>(T) * H, 11 + T);
                const auto w = test::to_bf16(test::randn(static_cast<size_t>(n) * H, 12, 0.02f));
                const auto b = test::randn(n, 13, 0.1f);
                std::vector<float> inv_freq(hd / 2);
                for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * i / hd);
                std::vector<int32_t> pos(T), slot(T);
                for (int t = 0; t < T; ++t) pos[t] = 1000 + 37 * t, slot[t] = (t == 1) ? -1 : 5 * t + 2;
                const int slots = 64;
                DeviceBuffer dx = DeviceBuffer::from_host(x.data(), x.size() * 4);
                DeviceBuffer dw = DeviceBuffer::from_host(w.data(), w.size() * 2);
                Fp8Weight f8;
                if (fp8) f8 = Fp8Weight::from_bf16(dw.get(), n, H, nullptr);
                DeviceBuffer db = DeviceBuffer::from_host(b.data(), b.size() * 4);
                DeviceBuffer df = DeviceBuffer::from_host(inv_freq.data(), inv_freq.size() * 4);
                DeviceBuffer dp = DeviceBuffer::from_host(pos.data(), pos.size() * 4);
                DeviceBuffer ds = DeviceBuffer::from_host(slot.data(), slot.size() * 4);
                DeviceBuffer qkv(static_cast<size_t>(T) * n * 4);
                const size_t q_bytes = static_cast<size_t>(T) * nq * hd * 2,
                             c_bytes = static_cast<size_t>(slots) * nkv * hd * 2;
                DeviceBuffer q[2] = {DeviceBuffer(q_bytes), DeviceBuffer(q_bytes)};
                DeviceBuffer kc[2] = {DeviceBuffer(c_bytes), DeviceBuffer(c_bytes)};
                DeviceBuffer vc[2] = {DeviceBuffer(c_bytes), DeviceBuffer(c_bytes)};
                for (int p = 0; p < 2; ++p) {
                    CUDA_CHECK(cudaMemset(q[p].get(), 0, q_bytes));
                    CUDA_CHECK(cudaMemset(kc[p].get(), 0, c_bytes));
                    CUDA_CHECK(cudaMemset(vc[p].get(), 0, c_bytes));
                    QkvRopeArgs r;
                    r.qkv = qkv.as<float>();
                    r.bias = db.as<float>();
                    r.positions = dp.as<int32_t>();
                    r.slot_mapping = ds.as<int32_t>();
                    r.inv_freq = df.as<float>();
                    r.attention_scaling = 1.3465736f;
                    r.q_out = q[p].get();
                    r.k_cache = kc[p].get();
                    r.v_cache = vc[p].get();
                    r.kv_fp8 = kv8;
                    r.num_tokens = T;
                    r.num_heads = nq;
                    r.num_kv_heads = nkv;
                    r.head_dim = hd;
                    GemvArgs g;
                    g.x = dx.get();
                    g.w = fp8 ? f8.q.get() : dw.get();
                    g.w_scale = fp8 ? f8.scales.as<float>() : nullptr;
                    g.w_ld = fp8 ? f8.k_pad : 0;
                    g.fp8_kernel = kind;
                    g.num_tokens = T;
                    g.n = n;
                    g.k = H;
                    if (p == 0) {
                        g.y = qkv.as<float>();
                        g.legacy = true;
                        g.mma_f16 = !ref_bf16_mma;
                        gemv_bf16w(g, nullptr);
                        qkv_bias_rope_kv_write(r, nullptr);
                    } else {
                        qkv_gemv_rope(g, r, nullptr);
                    }
                }
                CUDA_CHECK(cudaDeviceSynchronize());
                size_t differ = 0, total = 0;
                float worst = 0;
                if (kv8) {  // the caches as e4m3 bytes: equal, or neighbouring codes of one sign
                    for (DeviceBuffer* pair : {kc, vc}) {
                        const auto a = test::to_host<uint8_t>(pair[0], static_cast<size_t>(slots) * nkv * hd);
                        const auto b = test::to_host<uint8_t>(pair[1], a.size());
                        for (size_t i = 0; i < a.size(); ++i) {
                            ++total;
                            if (a[i] == b[i]) continue;
                            ++differ;
                            const int ma = a[i] & 0x7f, mb = b[i] & 0x7f;
                            const bool near = ((a[i] ^ b[i]) & 0x80) == 0 ? std::abs(ma - mb) <= 1 : ma + mb <= 1;
                            EXPECT_TRUE(near) << "variant " << variant << " T " << T << " cache byte " << i << ": "
                                              << int(a[i]) << " vs " << int(b[i]);
                        }
                    }
                }
                for (DeviceBuffer* pair : kv8 ? std::vector<DeviceBuffer*>{q} : std::vector<DeviceBuffer*>{q, kc, vc}) {
                    std::vector<uint16_t> a(pair[0].bytes() / 2), c(a.size());
                    CUDA_CHECK(cudaMemcpy(a.data(), pair[0].get(), pair[0].bytes(), cudaMemcpyDeviceToHost));
                    CUDA_CHECK(cudaMemcpy(c.data(), pair[1].get(), pair[1].bytes(), cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < a.size(); ++i) {
                        ++total;
                        if (a[i] == c[i]) continue;
                        ++differ;
                        const float fa = bf16_to_f32(a[i]), fc = bf16_to_f32(c[i]);
                        worst = std::max(worst, std::fabs(fa - fc) / std::max(std::fabs(fa), 1e-30f));
                    }
                }
                EXPECT_LE(differ * 1000, total)
                    << "variant " << variant << " nkv " << nkv << " T " << T << ": " << differ << " of " << total;
                EXPECT_LE(worst, 1.0f / 128) << "variant " << variant << " nkv " << nkv << " T " << T;
            }
        }
    }
}

// GemvArgs::x_ss_parts (MoeResidualTail's consumer, session 36): the GEMV of h = bf16(x · gain) with
// its sums scaled by 1 / rms from the tiles' Σ x², against the GEMV of the norm kernel's h =
// bf16((x · 1/rms) · gain). The two round different values to bf16 (≤ 2^-9 relative each), so the
// outputs agree to about that: a rel L2 bound of 4e-3 over q, k and v (measured: see the printout), and
// they must differ somewhere (else the scale was not applied). The QKV kernels with f16 and bf16 MMAs,
// one-wave and not, and the plain GEMV (y); a residual large enough that x · gain passes f16's range
// (the f16 staging's scaled-down pass).
TEST(CudaQkvFused, AppliesTheNormScale) {
    REQUIRE_GPU();
    const int H = 2880, hd = 64, nkv = 8, nq = 64, n = (nq + 2 * nkv) * hd, tiles = H / 16;
    const float eps = 1e-5f;
    const auto w = test::to_bf16(test::randn(static_cast<size_t>(n) * H, 41, 0.02f));
    DeviceBuffer dw = DeviceBuffer::from_host(w.data(), w.size() * 2);
    const Fp8Weight f8 = Fp8Weight::from_bf16(dw.get(), n, H, nullptr);
    const auto b = test::randn(n, 43, 0.1f);
    std::vector<float> inv_freq(hd / 2);
    for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * i / hd);
    const std::vector<int32_t> pos = {777}, slot = {9};
    DeviceBuffer db = DeviceBuffer::from_host(b.data(), b.size() * 4);
    DeviceBuffer df = DeviceBuffer::from_host(inv_freq.data(), inv_freq.size() * 4);
    DeviceBuffer dp = DeviceBuffer::from_host(pos.data(), 4), ds = DeviceBuffer::from_host(slot.data(), 4);
    const auto gain = test::randn(H, 45, 0.3f, 1.0f);
    DeviceBuffer dgain = DeviceBuffer::from_host(gain.data(), H * 4);
    for (float scale : {8.0f, 40000.0f}) {  // the second: |x · gain| past 65504
        const auto x = test::randn(H, 47, scale);
        // The tail's outputs, written out on the host: h = bf16(x · gain), Σ x² a tile.
        std::vector<uint16_t> hx(H);
        std::vector<float> parts(tiles, 0.0f);
        float hmax = 0;
        for (int i = 0; i < H; ++i) {
            hx[i] = f32_to_bf16(x[i] * gain[i]);
            hmax = std::max(hmax, std::fabs(x[i] * gain[i]));
            parts[i / 16] += x[i] * x[i];
        }
        if (scale > 1000) {
            ASSERT_GT(hmax, 65504.0f);
        }
        DeviceBuffer dhx = DeviceBuffer::from_host(hx.data(), H * 2),
                     dparts = DeviceBuffer::from_host(parts.data(), tiles * 4);
        // The reference's h: the norm kernel on x.
        DeviceBuffer dx = DeviceBuffer::from_host(x.data(), H * 4), dhn(H * 2);
        ResidualRmsNormArgs rn;
        rn.x = dx.as<float>();
        rn.weight = dgain.as<float>();
        rn.out = dhn.get();
        rn.num_tokens = 1;
        rn.hidden_size = H;
        rn.eps = eps;
        residual_rmsnorm(rn, nullptr);
        for (int variant = 0; variant < 5; ++variant) {
            const bool plain = variant == 4, f16 = variant % 2 == 0;
            const GemvFp8Kernel kind = variant < 2 ? GemvFp8Kernel::kMmaOneWave : GemvFp8Kernel::kMma;
            const size_t q_bytes = static_cast<size_t>(nq) * hd * 2, c_bytes = static_cast<size_t>(16) * nkv * hd * 2;
            std::vector<float> out[2];
            for (int p = 0; p < 2; ++p) {
                DeviceBuffer q(q_bytes), kc(c_bytes), vc(c_bytes), y(static_cast<size_t>(n) * 4);
                CUDA_CHECK(cudaMemset(q.get(), 0, q_bytes));
                CUDA_CHECK(cudaMemset(kc.get(), 0, c_bytes));
                CUDA_CHECK(cudaMemset(vc.get(), 0, c_bytes));
                GemvArgs g;
                g.x = p == 0 ? dhn.get() : dhx.get();
                g.x_bf16 = true;
                g.w = f8.q.get();
                g.w_scale = f8.scales.as<float>();
                g.w_ld = f8.k_pad;
                g.fp8_kernel = kind;
                g.mma_f16 = f16;
                g.num_tokens = 1;
                g.n = n;
                g.k = H;
                if (p == 1) {
                    g.x_ss_parts = dparts.as<float>();
                    g.x_ss_n = tiles;
                    g.x_eps = eps;
                }
                ASSERT_TRUE(gemv_fp8_mma_applies(g, !plain, hd));
                if (plain) {
                    g.y = y.as<float>();
                    g.bias = db.as<float>();
                    gemv_bf16w(g, nullptr);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    out[p] = test::to_host<float>(y, n);
                    continue;
                }
                QkvRopeArgs r;
                r.bias = db.as<float>();
                r.positions = dp.as<int32_t>();
                r.slot_mapping = ds.as<int32_t>();
                r.inv_freq = df.as<float>();
                r.attention_scaling = 1.3465736f;
                r.q_out = q.get();
                r.k_cache = kc.get();
                r.v_cache = vc.get();
                r.num_tokens = 1;
                r.num_heads = nq;
                r.num_kv_heads = nkv;
                r.head_dim = hd;
                qkv_gemv_rope(g, r, nullptr);
                CUDA_CHECK(cudaDeviceSynchronize());
                for (DeviceBuffer* d : {&q, &kc, &vc}) {
                    const auto v = test::from_bf16(test::to_host<uint16_t>(*d, d->bytes() / 2));
                    out[p].insert(out[p].end(), v.begin(), v.end());
                }
            }
            double num = 0, den = 0;
            for (size_t i = 0; i < out[0].size(); ++i) {
                num += (out[1][i] - out[0][i]) * (out[1][i] - out[0][i]);
                den += out[0][i] * out[0][i];
            }
            const double rel = std::sqrt(num / den);
            std::printf("  x_ss_parts, x x %g, variant %d: rel L2 %.3g against the norm kernel's h\n", scale, variant,
                        rel);
            EXPECT_LE(rel, 4e-3) << "variant " << variant << " x scale " << scale;
            EXPECT_GT(rel, 0.0) << "variant " << variant << ": the same bits (was the scale applied?)";
        }
    }
}

}  // namespace
}  // namespace gptoss::kernels::cuda
