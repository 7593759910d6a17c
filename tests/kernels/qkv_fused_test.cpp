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

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/args/paged_attention_args.h"
#include "kernels/cuda/attention.h"
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

// qkv_gemv_rope_attention (gemv.h QkvAttnTailArgs): the decode attention in the QKV kernel's last CTA of each kv
// head. Against qkv_gemv_rope then paged_attention_decode on copies of the same cache: q and the cache to the bit
// (the same projection), and the attention output against an fp64 CPU attention of the q and cache the kernel
// wrote, with the attention tests' bounds (attention_test.cpp: bf16 output and P rounded to bf16 for P·V:
// max |Δ| ≤ 1e-2 · max|ref|, rel L2 ≤ 5e-3, each head's row ≤ 1e-2 ‖ref row‖ + 2e-3 · max|ref|). The cache holds
// NaN in every slot that is not a visible key of the sequence and −1 in the table entries the window must not
// read, so a read outside the window is a NaN output; the output is poisoned before each launch. Positions from
// an empty history to a full window not aligned to 64, windows 128, 40 and 300 and full layers (up to 2,048 keys:
// 16 chunks), 8 and 2 kv heads, block sizes 16, 32 and 64, the kernel variants (one-wave or not, f16 or bf16
// MMAs, x in bf16 or fp32), the norm's 1 / rms applied (x_ss_parts). The tickets must be back at zero after
// every launch (the next layer, or a replayed graph, reuses them).
TEST(CudaQkvFused, AttentionTailMatchesTheCpu) {
    REQUIRE_GPU();
    const int H = 2880, hd = 64;
    struct Case {
        int nkv, window, bs, variant;
        std::vector<int> positions;
    };
    // window 0: a full layer (chunks of 128 keys one after another, double-buffered); 300: a window past one chunk.
    const std::vector<Case> cases = {
        {8, 128, 16, 0, {0, 1, 63, 126, 127, 128, 200, 1000}},
        {8, 128, 64, 1, {5, 127, 130, 777}},
        {2, 40, 16, 2, {0, 39, 40, 41, 300}},
        {8, 128, 32, 3, {129, 999}},
        {8, 0, 16, 0, {0, 100, 127, 128, 255, 256, 1000, 2047}},
        {2, 0, 64, 3, {383, 1500}},
        {8, 300, 16, 1, {299, 300, 1200}},
        {8, 128, 16, 4, {500}},
        {8, 0, 16, 4, {700}},
    };
    for (const Case& cs : cases) {
        const int nkv = cs.nkv, nq = 8 * nkv, n = (nq + 2 * nkv) * hd, bs = cs.bs;
        // Variants: 0 one-wave, f16 MMAs, the norm's 1 / rms (x_ss_parts); 1 two CTAs an SM, f16; 2 one-wave, bf16
        // MMAs; 3 two an SM, bf16; 4 one-wave, f16, x in fp32 (GPTOSS_GEMV_X_F32=1's rows).
        const bool one_wave = cs.variant % 2 == 0, f16 = cs.variant < 2 || cs.variant == 4, ss = cs.variant == 0,
                   x32 = cs.variant == 4;
        const auto w = test::to_bf16(test::randn(static_cast<size_t>(n) * H, 61 + nkv, 0.02f));
        DeviceBuffer dw = DeviceBuffer::from_host(w.data(), w.size() * 2);
        const Fp8Weight f8 = Fp8Weight::from_bf16(dw.get(), n, H, nullptr);
        const auto b = test::randn(n, 63, 0.1f);
        std::vector<float> inv_freq(hd / 2);
        for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * i / hd);
        std::vector<float> sinks = test::randn(nq, 65, 1.0f);
        sinks[1] = 8.0f, sinks[3] = -30.0f;  // a head the sink dominates, one it does not touch
        DeviceBuffer db = DeviceBuffer::from_host(b.data(), b.size() * 4);
        DeviceBuffer df = DeviceBuffer::from_host(inv_freq.data(), inv_freq.size() * 4);
        DeviceBuffer dsink = DeviceBuffer::from_host(sinks.data(), sinks.size() * 4);
        DeviceBuffer counters(static_cast<size_t>(nkv) * 4);
        CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
        for (int pos : cs.positions) {
            const auto x = test::randn(H, 67 + pos, 1.0f);
            // Variant 0 the norm's form: h = bf16(x) and Σ x² parts of mean 0.25 (the sums times 1 / rms = 2).
            std::vector<uint16_t> hx = test::to_bf16(x);
            std::vector<float> parts(H / 16, 0.25f * 16);
            DeviceBuffer dx = DeviceBuffer::from_host(hx.data(), H * 2), dparts = test::to_device(parts);
            DeviceBuffer dx32 = test::to_device(x);
            // Blocks shuffled through the table; the blocks wholly before the window are −1.
            const int kv_lo = cs.window > 0 ? std::max(0, pos - cs.window + 1) : 0, nblk = pos / bs + 1,
                      phys = nblk + 3;
            std::vector<int32_t> table(nblk + 2, -1), perm(phys);
            for (int i = 0; i < phys; ++i) perm[i] = i;
            std::mt19937 rng(pos + 1);
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int blk = kv_lo / bs; blk < nblk; ++blk) table[blk] = perm[blk];
            // Earlier keys of the window random bf16; every other slot NaN (the token's own is written).
            const size_t row = static_cast<size_t>(nkv) * hd, slots = static_cast<size_t>(phys) * bs;
            std::vector<uint16_t> kc0(slots * row, 0xFFFFu), vc0(slots * row, 0xFFFFu);
            std::mt19937 rk(pos + 5);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (int j = kv_lo; j < pos; ++j) {
                const size_t slot = static_cast<size_t>(table[j / bs]) * bs + j % bs;
                for (size_t e = 0; e < row; ++e) {
                    kc0[slot * row + e] = f32_to_bf16(2.0f * nd(rk));
                    vc0[slot * row + e] = f32_to_bf16(nd(rk));
                }
            }
            const int32_t slot_now = table[pos / bs] * bs + pos % bs;
            const std::vector<int32_t> vpos = {pos}, vslot = {slot_now}, qstart = {0, 1};
            DeviceBuffer dp = test::to_device(vpos), ds = test::to_device(vslot), dq0 = test::to_device(qstart);
            DeviceBuffer dtable = test::to_device(table);
            const int max_splits = 64;
            DeviceBuffer ws(static_cast<size_t>(nq) * max_splits * (hd + 2) * 4);
            std::vector<uint16_t> q_out[2], k_out[2], v_out[2], a_out[2];
            for (int p = 0; p < 2; ++p) {
                DeviceBuffer q = test::poisoned(static_cast<size_t>(nq) * hd * 2);
                DeviceBuffer kc = test::to_device(kc0), vc = test::to_device(vc0);
                DeviceBuffer out = test::poisoned(static_cast<size_t>(nq) * hd * 2);
                GemvArgs g;
                g.x = x32 ? dx32.get() : dx.get();
                g.x_bf16 = !x32;
                g.w = f8.q.get();
                g.w_scale = f8.scales.as<float>();
                g.w_ld = f8.k_pad;
                g.fp8_kernel = one_wave ? GemvFp8Kernel::kMmaOneWave : GemvFp8Kernel::kMma;
                g.mma_f16 = f16;
                g.num_tokens = 1;
                g.n = n;
                g.k = H;
                if (ss) {
                    g.x_ss_parts = dparts.as<float>();
                    g.x_ss_n = H / 16;
                    g.x_eps = 0.0f;
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
                ASSERT_TRUE(qkv_attention_tail_applies(g, r, 1, cs.window, false, bs, 2048));
                if (p == 0) {
                    qkv_gemv_rope(g, r, nullptr);
                    PagedAttentionArgs pa;
                    pa.q = q.get();
                    pa.out = out.get();
                    pa.sinks = dsink.as<float>();
                    pa.k_cache = kc.get();
                    pa.v_cache = vc.get();
                    pa.block_tables = dtable.as<int32_t>();
                    pa.seq_start_pos = dp.as<int32_t>();
                    pa.query_start = dq0.as<int32_t>();
                    pa.max_blocks_per_seq = static_cast<int>(table.size());
                    pa.num_seqs = 1;
                    pa.num_tokens = 1;
                    pa.max_query_len = 1;
                    pa.max_context_len = pos + 1;
                    pa.num_heads = nq;
                    pa.num_kv_heads = nkv;
                    pa.head_dim = hd;
                    pa.block_size = bs;
                    pa.sliding_window = cs.window;
                    pa.scale = 0.125f;
                    pa.workspace = ws.as<float>();
                    pa.max_splits = max_splits;
                    paged_attention_decode(pa, nullptr);
                } else {
                    QkvAttnTailArgs t;
                    t.out = out.get();
                    t.sinks = dsink.as<float>();
                    t.block_table = dtable.as<int32_t>();
                    t.seq_start_pos = dp.as<int32_t>();
                    t.query_start = dq0.as<int32_t>();
                    t.counters = counters.as<uint32_t>();
                    t.block_size = bs;
                    t.window = cs.window;
                    t.scale = 0.125f;
                    // Twice without a host sync: the second launch takes the tickets the first left at zero (as
                    // the next layer's, or a replayed graph's, does), and writes the same values again.
                    qkv_gemv_rope_attention(g, r, t, nullptr);
                    qkv_gemv_rope_attention(g, r, t, nullptr);
                }
                CUDA_CHECK(cudaDeviceSynchronize());
                q_out[p] = test::to_host<uint16_t>(q, static_cast<size_t>(nq) * hd);
                k_out[p] = test::to_host<uint16_t>(kc, kc0.size());
                v_out[p] = test::to_host<uint16_t>(vc, vc0.size());
                a_out[p] = test::to_host<uint16_t>(out, static_cast<size_t>(nq) * hd);
            }
            const std::string where = "nkv " + std::to_string(nkv) + " window " + std::to_string(cs.window) + " bs " +
                                      std::to_string(bs) + " variant " + std::to_string(cs.variant) + " pos " +
                                      std::to_string(pos);
            EXPECT_TRUE(q_out[0] == q_out[1]) << where << ": q differs";
            EXPECT_TRUE(k_out[0] == k_out[1]) << where << ": the K cache differs";
            EXPECT_TRUE(v_out[0] == v_out[1]) << where << ": the V cache differs";
            for (uint32_t c : test::to_host<uint32_t>(counters, nkv)) EXPECT_EQ(c, 0u) << where << ": a ticket left";
            // fp64 attention of the written q and cache (MODEL.md §4.4: the sink in the denominator only).
            std::vector<double> ref(static_cast<size_t>(nq) * hd);
            for (int h = 0; h < nq; ++h) {
                const int kvh = h / 8;
                std::vector<double> sc;
                double mx = sinks[h];
                for (int j = kv_lo; j <= pos; ++j) {
                    const size_t base = (static_cast<size_t>(table[j / bs]) * bs + j % bs) * row + kvh * hd;
                    double d = 0;
                    for (int e = 0; e < hd; ++e)
                        d += static_cast<double>(bf16_to_f32(q_out[1][h * hd + e])) * bf16_to_f32(k_out[1][base + e]);
                    sc.push_back(d * 0.125);
                    mx = std::max(mx, sc.back());
                }
                double den = std::exp(sinks[h] - mx);
                for (int j = kv_lo; j <= pos; ++j) {
                    const double pj = std::exp(sc[j - kv_lo] - mx);
                    den += pj;
                    const size_t base = (static_cast<size_t>(table[j / bs]) * bs + j % bs) * row + kvh * hd;
                    for (int e = 0; e < hd; ++e) ref[h * hd + e] += pj * bf16_to_f32(v_out[1][base + e]);
                }
                for (int e = 0; e < hd; ++e) ref[h * hd + e] /= den;
            }
            double max_ref = 0;
            for (double v : ref) max_ref = std::max(max_ref, std::fabs(v));
            for (int p = 0; p < 2; ++p) {
                double max_err = 0, e2 = 0, r2 = 0, worst_row = 0;
                for (int h = 0; h < nq; ++h) {
                    double re2 = 0, rr2 = 0;
                    for (int e = 0; e < hd; ++e) {
                        const double got = bf16_to_f32(a_out[p][h * hd + e]), want = ref[h * hd + e];
                        const double d = std::isfinite(got) ? std::fabs(got - want) : INFINITY;
                        max_err = std::max(max_err, d);
                        re2 += d * d;
                        rr2 += want * want;
                    }
                    e2 += re2;
                    r2 += rr2;
                    worst_row = std::max(worst_row, std::sqrt(re2) / (1e-2 * std::sqrt(rr2) + 2e-3 * max_ref));
                }
                const double rel = std::sqrt(e2 / r2);
                std::printf("  attention tail %s: %s max|d| %.2e (max|ref| %.2e) rel L2 %.2e worst row %.2f of tol\n",
                            where.c_str(), p == 0 ? "decode kernel" : "tail        ", max_err, max_ref, rel, worst_row);
                EXPECT_LE(max_err, 1e-2 * max_ref) << where << (p ? " tail" : " decode kernel");
                EXPECT_LE(rel, 5e-3) << where << (p ? " tail" : " decode kernel");
                EXPECT_LE(worst_row, 1.0) << where << (p ? " tail" : " decode kernel");
            }
        }
    }
}

// Where the tail applies (host only: runs without a GPU).
TEST(CudaQkvFused, AttentionTailApplies) {
    GemvArgs g;
    g.w = reinterpret_cast<const void*>(16);
    g.w_scale = reinterpret_cast<const float*>(16);
    g.w_ld = 3072;
    g.num_tokens = 1;
    g.n = 80 * 64;
    g.k = 2880;
    QkvRopeArgs r;
    r.num_tokens = 1;
    r.num_heads = 64;
    r.num_kv_heads = 8;
    r.head_dim = 64;
    EXPECT_TRUE(qkv_attention_tail_applies(g, r, 1, 128, false, 16, 1 << 20));  // one chunk at any context
    EXPECT_TRUE(qkv_attention_tail_applies(g, r, 1, 1, false, 64, 4096));
    EXPECT_TRUE(qkv_attention_tail_applies(g, r, 1, 0, false, 16, 2048));  // a full layer: ≤ 16 chunks
    EXPECT_FALSE(qkv_attention_tail_applies(g, r, 1, 0, false, 16, 2049));
    EXPECT_TRUE(qkv_attention_tail_applies(g, r, 1, 300, false, 16, 1 << 20));  // 300 keys at most
    EXPECT_FALSE(qkv_attention_tail_applies(g, r, 1, 4000, false, 16, 1 << 20));
    EXPECT_FALSE(qkv_attention_tail_applies(g, r, 2, 128, false, 16, 2048));  // two sequences
    EXPECT_FALSE(qkv_attention_tail_applies(g, r, 1, 128, true, 16, 2048));   // an e4m3 cache
    EXPECT_FALSE(qkv_attention_tail_applies(g, r, 1, 128, false, 24, 2048));  // block size not a power of two
    GemvArgs g2 = g;
    g2.num_tokens = 2;
    EXPECT_FALSE(qkv_attention_tail_applies(g2, r, 1, 128, false, 16, 2048));
    g2 = g;
    g2.w_scale = nullptr;  // bf16 weights: not the tensor-core kernels
    EXPECT_FALSE(qkv_attention_tail_applies(g2, r, 1, 128, false, 16, 2048));
    QkvRopeArgs r2 = r;
    r2.num_heads = 32;  // 4 q heads a kv head
    g2 = g;
    g2.n = (32 + 16) * 64;
    EXPECT_FALSE(qkv_attention_tail_applies(g2, r2, 1, 128, false, 16, 2048));
}

}  // namespace
}  // namespace gptoss::kernels::cuda
