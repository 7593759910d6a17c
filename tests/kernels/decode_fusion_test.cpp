// The decode-path kernels of r11 against the CPU reference: the fused router (logits → top-k →
// softmax → plan in one launch) and the persistent row-prefetch GEMV, over batch 1..8 and the real
// widths (hidden 2880, q width 4096, qkv 5120, vocabulary 201,088).
#include <algorithm>
#include <numeric>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"

namespace gptoss::test {
namespace {

namespace kc = kernels::cuda;
namespace cpu = kernels::cpu;
using kc::DeviceBuffer;

// moe_plan on the host: offsets[e] = #assignments with a lower expert; inside an
// expert, assignments in index order.
void host_plan(const std::vector<int32_t>& ids, int E, std::vector<int32_t>* offsets, std::vector<int32_t>* sorted) {
    offsets->assign(E + 1, 0);
    for (int32_t e : ids) ++(*offsets)[e + 1];
    for (int e = 0; e < E; ++e) (*offsets)[e + 1] += (*offsets)[e];
    sorted->assign(ids.size(), -1);
    std::vector<int32_t> fill(offsets->begin(), offsets->end() - 1);
    for (size_t i = 0; i < ids.size(); ++i) (*sorted)[fill[ids[i]]++] = static_cast<int32_t>(i);
}

// The CPU router (logits with the bias, top-k, softmax) and the stable plan: the reference of the
// fused router kernel.
struct RouterRef {
    std::vector<int32_t> ids, offsets, sorted;
    std::vector<float> weights, logits;
};
RouterRef cpu_router_plan(const std::vector<float>& h, const std::vector<uint16_t>& w, const std::vector<float>& b,
                          int T, int H, int E, int K) {
    RouterRef r;
    r.ids.resize(T * K);
    r.weights.resize(T * K);
    r.logits.resize(static_cast<size_t>(T) * E);
    kernels::RouterArgs ra;
    ra.x = h.data();
    ra.weight = w.data();
    ra.bias = b.data();
    ra.expert_ids = r.ids.data();
    ra.expert_weights = r.weights.data();
    ra.logits = r.logits.data();
    ra.num_tokens = T;
    ra.hidden_size = H;
    ra.num_experts = E;
    ra.experts_per_token = K;
    cpu::router(ra);
    host_plan(r.ids, E, &r.offsets, &r.sorted);
    return r;
}

struct RouterCase {
    int E, T;
    bool ties;       // experts 5, 9 and 20 share one weight row and bias: exact ties, lower index wins
    bool same_rows;  // every token has the same hidden row: all tokens pick the same experts
    int H = 2880;
};

TEST(CudaDecodeFusion, RouterPlanSmallMatchesCpu) {
    REQUIRE_GPU();
    std::vector<RouterCase> cases;
    for (int E : {32, 128})
        for (int T = 1; T <= 8; ++T) cases.push_back({E, T, false, false});
    cases.push_back({32, 1, true, false});
    cases.push_back({32, 8, true, true});
    cases.push_back({128, 5, false, true});
    // Expert counts other than the models': 64, and 20 (not a multiple of 32).
    for (int T : {1, 4}) {
        cases.push_back({64, T, false, false});
        cases.push_back({20, T, false, false});
    }
    // Rows wider than one chunk a thread in the cluster kernel (hidden 4096: two), and 256 experts
    // (beyond the cluster kernel's 128: the ticket kernel).
    cases.push_back({32, 3, false, false, 4096});
    cases.push_back({128, 2, false, false, 4096});
    cases.push_back({256, 1, false, false});
    cases.push_back({256, 4, false, false});
    const int K = 4;
    DeviceBuffer counter(4);
    ASSERT_EQ(cudaMemset(counter.get(), 0, 4), cudaSuccess);
    for (const RouterCase& rc : cases) {
        const int E = rc.E, T = rc.T, H = rc.H;
        auto h = randn(static_cast<size_t>(T) * H, 7 * E + T);
        if (rc.same_rows)
            for (int t = 1; t < T; ++t) std::copy(h.begin(), h.begin() + H, h.begin() + static_cast<size_t>(t) * H);
        auto wf = randn(static_cast<size_t>(E) * H, E + 1, 1.0f / std::sqrt(static_cast<float>(H)));
        auto b = randn(E, E + 2, 0.1f);
        if (rc.ties) {
            // Make 5, 9, 20 the clear favourites and exactly equal (same row, same bias).
            for (int i = 0; i < H; ++i) wf[static_cast<size_t>(5) * H + i] = 3.0f * h[i] / std::sqrt(2880.0f);
            for (int e : {9, 20}) std::copy(wf.begin() + 5 * H, wf.begin() + 6 * H, wf.begin() + e * H);
            b[9] = b[20] = b[5];
        }
        auto w = to_bf16(wf);
        const RouterRef ref = cpu_router_plan(h, w, b, T, H, E, K);
        const auto &ids_ref = ref.ids, &off_ref = ref.offsets, &sorted_ref = ref.sorted;
        const auto &w_ref = ref.weights, &logits_ref = ref.logits;

        auto dh = to_device(h), dw = to_device(w), db = to_device(b);
        auto dl = poisoned(logits_ref.size() * 4), dids = poisoned(ids_ref.size() * 4),
             dws = poisoned(w_ref.size() * 4), doff = poisoned((E + 1) * 4), dsorted = poisoned(T * K * 4);
        kc::RouterPlanSmallArgs a;
        a.h = dh.as<float>();
        a.weight = dw.get();
        a.bias = db.as<float>();
        a.logits = dl.as<float>();
        a.expert_ids = dids.as<int32_t>();
        a.expert_weights = dws.as<float>();
        a.expert_offsets = doff.as<int32_t>();
        a.sorted_assignments = dsorted.as<int32_t>();
        a.counter = counter.as<uint32_t>();
        a.num_tokens = T;
        a.hidden_size = H;
        a.num_experts = E;
        a.experts_per_token = K;
        // Five calls on the same counter (the ticket kernel's, 256 experts): each must find it reset
        // by the one before; outputs poisoned again. Calls 0-2 ask for clusters of up to 8 CTAs, calls
        // 3 and 4 for up to 16 (RouterPlanSmallArgs::cluster_ctas: 8 experts a CTA for 65-128 experts,
        // 4 for 33-64).
        for (int rep = 0; rep < 5; ++rep) {
            for (DeviceBuffer* b : {&dl, &dids, &dws, &doff, &dsorted})
                ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
            a.cluster_ctas = rep >= 3 ? 16 : 8;
            kc::router_plan_small(a, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            SCOPED_TRACE(::testing::Message()
                         << "E=" << E << " T=" << T << " H=" << H << " cluster " << a.cluster_ctas
                         << (rc.ties ? " ties" : "") << (rc.same_rows ? " same rows" : "") << " call " << rep);
            // fp32 dot products of identical inputs on both sides: only the summation order differs.
            EXPECT_TRUE(close(to_host<float>(dl, logits_ref.size()), logits_ref, kTolF32, "router logits"));
            // Random fp32 logits: the chance of a near-tie flipping the order is negligible; the
            // constructed ties are exact on both sides (identical rows) and go to the lower index.
            EXPECT_EQ(to_host<int32_t>(dids, ids_ref.size()), ids_ref);
            EXPECT_TRUE(close(to_host<float>(dws, w_ref.size()), w_ref, kTolF32, "router weights"));
            EXPECT_EQ(to_host<int32_t>(doff, E + 1), off_ref);
            EXPECT_EQ(to_host<int32_t>(dsorted, T * K), sorted_ref);
            EXPECT_EQ(to_host<uint32_t>(counter, 1)[0], 0u);
        }
        if (rc.ties) {
            const auto ids = to_host<int32_t>(dids, 3);
            EXPECT_EQ(ids, (std::vector<int32_t>{5, 9, 20}));
        }
    }
}

// The router with the post-attention residual update and RMSNorm fused in (the decode model's
// default): v = x + (o_bias + o), h = v · rsqrt(mean v² + eps) · w_norm, then the router on h.
// Block 0's writes: v exactly (the same fp32 additions in the same order), h at the fp32 tolerance
// (1 / rms summed in another order), h in bf16; and the router's outputs as in the unfused test.
TEST(CudaDecodeFusion, RouterPlanSmallFusesTheNorm) {
    REQUIRE_GPU();
    const int H = 2880, K = 4;
    const float eps = 1e-5f;
    DeviceBuffer counter(4);
    ASSERT_EQ(cudaMemset(counter.get(), 0, 4), cudaSuccess);
    for (int E : {32, 64, 128})
        for (int T : {1, 3, 8}) {
            SCOPED_TRACE(::testing::Message() << "E=" << E << " T=" << T);
            const auto x = randn(static_cast<size_t>(T) * H, 31 * E + T, 3.0f);
            const auto o = randn(static_cast<size_t>(T) * H, 37 * E + T, 0.5f);
            const auto ob = randn(H, 41, 0.1f);
            auto nw = randn(H, 43, 0.2f);
            for (auto& v : nw) v += 1.0f;
            std::vector<float> v(x.size()), hn(x.size());
            for (int t = 0; t < T; ++t) {
                double ss = 0.0;
                for (int i = 0; i < H; ++i) {
                    const size_t j = static_cast<size_t>(t) * H + i;
                    v[j] = x[j] + (ob[i] + o[j]);
                    ss += static_cast<double>(v[j]) * v[j];
                }
                const float inv = static_cast<float>(1.0 / std::sqrt(ss / H + eps));
                for (int i = 0; i < H; ++i) {
                    const size_t j = static_cast<size_t>(t) * H + i;
                    hn[j] = v[j] * inv * nw[i];
                }
            }
            auto wf = randn(static_cast<size_t>(E) * H, E + 5, 1.0f / std::sqrt(2880.0f));
            auto b = randn(E, E + 6, 0.1f);
            auto w = to_bf16(wf);
            const RouterRef ref = cpu_router_plan(hn, w, b, T, H, E, K);
            const auto &ids_ref = ref.ids, &off_ref = ref.offsets, &sorted_ref = ref.sorted;
            const auto &w_ref = ref.weights, &logits_ref = ref.logits;

            auto dx = to_device(x), dox = to_device(o), dob = to_device(ob), dnw = to_device(nw), dw = to_device(w),
                 db = to_device(b);
            auto dl = poisoned(logits_ref.size() * 4), dids = poisoned(ids_ref.size() * 4),
                 dws = poisoned(w_ref.size() * 4), doff = poisoned((E + 1) * 4), dsorted = poisoned(T * K * 4),
                 dxo = poisoned(x.size() * 4), dh = poisoned(x.size() * 4), dh16 = poisoned(x.size() * 2);
            kc::RouterPlanSmallArgs a;
            a.weight = dw.get();
            a.bias = db.as<float>();
            a.logits = dl.as<float>();
            a.expert_ids = dids.as<int32_t>();
            a.expert_weights = dws.as<float>();
            a.expert_offsets = doff.as<int32_t>();
            a.sorted_assignments = dsorted.as<int32_t>();
            a.counter = counter.as<uint32_t>();
            a.num_tokens = T;
            a.hidden_size = H;
            a.num_experts = E;
            a.experts_per_token = K;
            a.residual = dx.as<float>();
            a.add = dox.as<float>();
            a.add_bias = dob.as<float>();
            a.norm_weight = dnw.as<float>();
            a.eps = eps;
            a.residual_out = dxo.as<float>();
            a.h_out = dh.as<float>();
            a.h_bf16_out = dh16.get();
            for (int cc : {8, 16}) {  // clusters of up to 8 CTAs, of up to 16 (the default)
                SCOPED_TRACE(::testing::Message() << "cluster " << cc);
                a.cluster_ctas = cc;
                for (DeviceBuffer* b : {&dl, &dids, &dws, &doff, &dsorted, &dxo, &dh, &dh16})
                    ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
                kc::router_plan_small(a, nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                EXPECT_EQ(to_host<float>(dxo, v.size()), v);
                EXPECT_TRUE(close(to_host<float>(dh, hn.size()), hn, kTolF32, "fused norm h"));
                {  // against the unfused kernel it replaces: the same residual bit for bit
                    auto dx2 = to_device(x), dh2 = poisoned(x.size() * 4), dh2b = poisoned(x.size() * 2);
                    kc::ResidualRmsNormArgs rn;
                    rn.x = dx2.as<float>();
                    rn.add = dox.as<float>();
                    rn.add_bias = dob.as<float>();
                    rn.num_add = 1;
                    rn.weight = dnw.as<float>();
                    rn.out = dh2b.get();
                    rn.out_f32 = dh2.as<float>();
                    rn.num_tokens = T;
                    rn.hidden_size = H;
                    rn.eps = eps;
                    kc::residual_rmsnorm(rn, nullptr);
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    EXPECT_EQ(to_host<float>(dxo, v.size()), to_host<float>(dx2, v.size()));
                    EXPECT_TRUE(close(to_host<float>(dh, hn.size()), to_host<float>(dh2, hn.size()), kTolF32,
                                      "fused norm h vs residual_rmsnorm"));
                }
                EXPECT_TRUE(close(from_bf16(to_host<uint16_t>(dh16, hn.size())), hn, kTolBf16Out, "fused norm h bf16"));
                // The logits come from Σ w·(v·w_norm) times 1/rms (the unfused kernel scales first):
                // fp32 rounding apart, the same sums.
                EXPECT_TRUE(close(to_host<float>(dl, logits_ref.size()), logits_ref, kTolF32, "fused router logits"));
                EXPECT_EQ(to_host<int32_t>(dids, ids_ref.size()), ids_ref);
                EXPECT_TRUE(close(to_host<float>(dws, w_ref.size()), w_ref, kTolF32, "fused router weights"));
                EXPECT_EQ(to_host<int32_t>(doff, E + 1), off_ref);
                EXPECT_EQ(to_host<int32_t>(dsorted, T * K), sorted_ref);
                EXPECT_EQ(to_host<uint32_t>(counter, 1)[0], 0u);
            }
        }
}

// The fused router inside a CUDA graph, replayed: the counter protocol must survive replays.
TEST(CudaDecodeFusion, RouterPlanSmallReplaysInAGraph) {
    REQUIRE_GPU();
    const int E = 32, T = 2, H = 2880, K = 4;
    auto h = randn(static_cast<size_t>(T) * H, 99);
    auto w = to_bf16(randn(static_cast<size_t>(E) * H, 100, 1.0f / std::sqrt(2880.0f)));
    auto b = randn(E, 101, 0.1f);
    const RouterRef ref = cpu_router_plan(h, w, b, T, H, E, K);
    const auto& ids_ref = ref.ids;
    const auto& logits_ref = ref.logits;
    auto dh = to_device(h), dw = to_device(w), db = to_device(b);
    DeviceBuffer counter(4), dl(logits_ref.size() * 4), dids(T * K * 4), dws(T * K * 4), doff((E + 1) * 4),
        dsorted(T * K * 4);
    ASSERT_EQ(cudaMemset(counter.get(), 0, 4), cudaSuccess);
    kc::RouterPlanSmallArgs a;
    a.h = dh.as<float>();
    a.weight = dw.get();
    a.bias = db.as<float>();
    a.logits = dl.as<float>();
    a.expert_ids = dids.as<int32_t>();
    a.expert_weights = dws.as<float>();
    a.expert_offsets = doff.as<int32_t>();
    a.sorted_assignments = dsorted.as<int32_t>();
    a.counter = counter.as<uint32_t>();
    a.num_tokens = T;
    a.hidden_size = H;
    a.num_experts = E;
    a.experts_per_token = K;
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    {
        cudaGraph_t graph;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        for (int layer = 0; layer < 4; ++layer) kc::router_plan_small(a, stream);  // back-to-back, like 24 layers
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int rep = 0; rep < 5; ++rep) {
            ASSERT_EQ(cudaMemset(dids.get(), 0xff, T * K * 4), cudaSuccess);
            ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            EXPECT_EQ(to_host<int32_t>(dids, ids_ref.size()), ids_ref) << "replay " << rep;
            EXPECT_EQ(to_host<uint32_t>(counter, 1)[0], 0u);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(stream);
}

// Both GEMV kernels (v2 default, r2 legacy) against cpu::linear. Shapes: the model's projections
// (qkv 5120×2880, o 2880×4096, router 32×2880, lm_head 201088×2880) and small odd ones (rows not a
// multiple of the CTA's warps, k not a multiple of 256, the narrowest per-lane template).
TEST(CudaDecodeFusion, GemvMatchesCpuOverBatches) {
    REQUIRE_GPU();
    struct Shape {
        int n, k;
        std::vector<int> batches;
    };
    const std::vector<Shape> shapes = {
        {5120, 2880, {1, 2, 3, 4, 5, 6, 7, 8}},
        {2880, 4096, {1, 2, 3, 4, 5, 6, 7, 8}},
        {32, 2880, {1, 8}},
        {201088, 2880, {1, 8}},
        {37, 72, {1, 3}},
        {1000, 1032, {2, 7}},
    };
    for (const Shape& sh : shapes) {
        const int n = sh.n, k = sh.k;
        auto w = to_bf16(randn(static_cast<size_t>(n) * k, n + k, 1.0f / std::sqrt(static_cast<float>(k))));
        auto bias = randn(n, 3, 0.1f);
        auto dw = to_device(w), db = to_device(bias);
        for (int m : sh.batches) {
            for (bool xb : {false, true}) {
                auto x = randn(static_cast<size_t>(m) * k, m + n);
                if (xb) x = bf16_round(x);
                std::vector<float> ref(static_cast<size_t>(m) * n);
                kernels::LinearArgs la;
                la.x = x.data();
                la.weight = w.data();
                la.weight_dtype = DType::kBF16;
                la.bias = (m & 1) ? bias.data() : nullptr;  // with and without a bias
                la.y = ref.data();
                la.num_tokens = m;
                la.in_features = k;
                la.out_features = n;
                cpu::linear(la);
                auto dx = xb ? to_device(to_bf16(x)) : to_device(x);
                for (bool legacy : {false, true}) {
                    auto dy = poisoned(ref.size() * 4);
                    kc::GemvArgs g;
                    g.x = dx.get();
                    g.x_bf16 = xb;
                    g.w = dw.get();
                    g.bias = (m & 1) ? db.as<float>() : nullptr;
                    g.y = dy.as<float>();
                    g.num_tokens = m;
                    g.n = n;
                    g.k = k;
                    g.legacy = legacy;
                    kc::gemv_bf16w(g, nullptr);
                    // fp32 accumulation of identical products: only the summation order differs.
                    EXPECT_TRUE(close(to_host<float>(dy, ref.size()), ref, kTolF32, "gemv"))
                        << "n=" << n << " k=" << k << " m=" << m << (xb ? " bf16 x" : " f32 x")
                        << (legacy ? " legacy" : " v2");
                }
            }
        }
    }
}

}  // namespace
}  // namespace gptoss::test
