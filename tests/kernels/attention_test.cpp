// CUDA paged attention with sinks (prefill, split-KV decode, reference kernel) against the fp32 CPU
// reference kernels::cpu::attention, on fresh random inputs per case.
//
// Every case: bf16-rounded q/k/v (the CPU reference sees exactly the numbers the GPU sees), random
// sinks with a few large ones (the sink dominates those heads) and a very negative one, physical
// blocks shuffled through the block table, −1 in table entries that a sliding window must never
// read (and NaN in the 4 blocks in front of the cache, where block −1 would land), NaN in every
// cache slot that holds no key (past each sequence's end, unused blocks): any read of a key that
// is not visible turns into NaN in the output. Outputs are poisoned with 0xFF bytes (bf16 NaN)
// before each launch, so an unwritten element fails too. NaN never passes.
//
// Tolerances (bf16 output vs fp32 reference on identical inputs):
//   max |Δ| ≤ 1e-2 · max|ref|      the output is rounded to bf16 (≤ 2^-9 relative) and P is rounded
//                                  to bf16 for the P·V product (≤ 2^-9 relative per weight, so at
//                                  most another 2^-9 of the row): ≤ 4e-3 of max|ref|, 2.5× margin;
//   relative L2 ≤ 5e-3             the same errors are unbiased: ~1.5e-3 in RMS, 3× margin;
//   per (token, head) row: ‖Δ‖ ≤ 1e-2 ‖ref_row‖ + 2e-3 · max|ref|   so that rows with small outputs
//                                  (sink-dominated heads) cannot hide behind the global scale.
// Without a CUDA device every GPU test skips (the CPU harness self-check still runs).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/args/attention_args.h"
#include "kernels/args/paged_attention_args.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"

namespace gptoss::kernels {
namespace {

constexpr int kHeads = 64, kKvHeads = 8, kHeadDim = 64;
constexpr int kGuardBlocks = 4;  // NaN blocks in front of block 0 of the device caches
constexpr uint16_t kBf16Nan = 0xFFFF;
constexpr double kTolMax = 1e-2, kTolL2 = 5e-3, kTolRow = 1e-2, kTolRowFloor = 2e-3;

#define CK(expr)                                                                                              \
    do {                                                                                                      \
        cudaError_t e_ = (expr);                                                                              \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

bool gpu_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU()                                                                                        \
    if (!gpu_available())                                                                                    \
    GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none): the CUDA attention tests run on the " \
                    "H200 machine"

// Small fast RNG (splitmix64): the data volume (up to ~10^9 values per run) makes mt19937 slow.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 12345) {}
    uint64_t next() {
        uint64_t x = (s += 0x9e3779b97f4a7c15ull);
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        return x ^ (x >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }          // [0, 1)
    float sym(float amp) { return static_cast<float>((2.0 * uniform() - 1.0) * amp); }  // (−amp, amp)
    int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

struct SeqSpec {
    int start_pos;  // tokens already in the cache
    int num_new;    // new query tokens
};

// Everything a case needs, on the host. Caches are [num_blocks, block_size, 8, 64] bf16.
struct HostCase {
    int block_size = 16;
    int window = 0;
    int num_seqs = 0;
    int num_tokens = 0;
    int max_query_len = 0;
    int max_context_len = 0;
    int max_blocks_per_seq = 0;
    int num_blocks = 0;
    std::vector<SeqSpec> seqs;
    std::vector<int32_t> query_start, seq_start_pos, block_tables;
    std::vector<uint16_t> q, k_cache, v_cache;  // bf16 bits
    // FP8 KV cache: the device caches are these e4m3 bytes (free blocks 0xFF, e4m3 NaN), and
    // k_cache / v_cache hold the same values as bf16 (exact), so every reference is unchanged.
    bool fp8 = false;
    std::vector<uint8_t> k8, v8;
    std::vector<float> sinks;
    float scale = 0.125f;
    size_t block_elems() const { return static_cast<size_t>(block_size) * kKvHeads * kHeadDim; }
};

HostCase make_case(const std::vector<SeqSpec>& seqs, int window, int block_size, float q_amp, uint64_t seed,
                   bool fp8 = false) {
    Rng rng(seed);
    HostCase c;
    c.fp8 = fp8;
    c.block_size = block_size;
    c.window = window;
    c.seqs = seqs;
    c.num_seqs = static_cast<int>(seqs.size());
    c.query_start.push_back(0);
    int needed = 0;
    for (const SeqSpec& s : seqs) {
        c.seq_start_pos.push_back(s.start_pos);
        c.query_start.push_back(c.query_start.back() + s.num_new);
        c.max_query_len = std::max(c.max_query_len, s.num_new);
        const int ctx = s.start_pos + s.num_new;
        c.max_context_len = std::max(c.max_context_len, ctx);
        const int logical = (ctx + block_size - 1) / block_size;
        c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, logical);
        const int first_key = window > 0 ? std::max(0, s.start_pos - window + 1) : 0;
        needed += logical - first_key / block_size;
    }
    c.num_tokens = c.query_start.back();
    c.max_blocks_per_seq += 2;               // slack columns (−1), as an allocator's table would have
    c.num_blocks = needed + needed / 8 + 3;  // a few free blocks (NaN) mixed in
    std::vector<int32_t> perm(c.num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = c.num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);

    c.block_tables.assign(static_cast<size_t>(c.num_seqs) * c.max_blocks_per_seq, -1);
    c.k_cache.assign(c.num_blocks * c.block_elems(), kBf16Nan);
    c.v_cache.assign(c.num_blocks * c.block_elems(), kBf16Nan);
    if (fp8) {
        c.k8.assign(c.num_blocks * c.block_elems(), 0xFF);
        c.v8.assign(c.num_blocks * c.block_elems(), 0xFF);
    }
    const float kv_amp = 1.7320508f;  // uniform with unit variance
    int next = 0;
    for (int si = 0; si < c.num_seqs; ++si) {
        const SeqSpec& s = seqs[si];
        const int ctx = s.start_pos + s.num_new;
        const int first_block = (window > 0 ? std::max(0, s.start_pos - window + 1) : 0) / block_size;
        for (int b = first_block; b * block_size < ctx; ++b) {
            const int phys = perm[next++];
            c.block_tables[static_cast<size_t>(si) * c.max_blocks_per_seq + b] = phys;
            for (int o = 0; o < block_size && b * block_size + o < ctx; ++o) {
                const size_t base = (static_cast<size_t>(phys) * block_size + o) * kKvHeads * kHeadDim;
                for (int e = 0; e < kKvHeads * kHeadDim; ++e) {
                    if (fp8) {  // e4m3 of the same distribution; bf16 of e4m3 is exact
                        c.k8[base + e] = f32_to_fp8e4m3(rng.sym(kv_amp));
                        c.v8[base + e] = f32_to_fp8e4m3(rng.sym(kv_amp));
                        c.k_cache[base + e] = f32_to_bf16(fp8e4m3_to_f32(c.k8[base + e]));
                        c.v_cache[base + e] = f32_to_bf16(fp8e4m3_to_f32(c.v8[base + e]));
                    } else {
                        c.k_cache[base + e] = f32_to_bf16(rng.sym(kv_amp));
                        c.v_cache[base + e] = f32_to_bf16(rng.sym(kv_amp));
                    }
                }
            }
        }
    }
    c.q.resize(static_cast<size_t>(c.num_tokens) * kHeads * kHeadDim);
    for (auto& x : c.q) x = f32_to_bf16(rng.sym(q_amp * kv_amp));
    c.sinks.resize(kHeads);
    for (auto& s : c.sinks) s = rng.sym(3.0f);
    c.sinks[rng.below(kHeads)] = 12.0f;                // dominates every row of that head
    c.sinks[rng.below(kHeads)] = 4.0f + 2.0f * q_amp;  // comparable to the larger scores
    c.sinks[rng.below(kHeads)] = -30.0f;               // negligible
    return c;
}

// CPU fp32 reference on rows `tokens` (all when empty): one AttentionSeq per selected token.
std::vector<float> cpu_reference(const HostCase& c, const std::vector<int>& tokens) {
    std::vector<float> q(c.q.size()), k(c.k_cache.size()), v(c.v_cache.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(c.q[i]);
    for (size_t i = 0; i < k.size(); ++i) {
        k[i] = bf16_to_f32(c.k_cache[i]);
        v[i] = bf16_to_f32(c.v_cache[i]);
    }
    std::vector<AttentionSeq> seqs;
    for (int s = 0; s < c.num_seqs; ++s) {
        for (int t = c.query_start[s]; t < c.query_start[s + 1]; ++t) {
            if (!tokens.empty() && !std::binary_search(tokens.begin(), tokens.end(), t)) continue;
            AttentionSeq as;
            as.token_offset = t;
            as.num_tokens = 1;
            as.start_pos = c.seq_start_pos[s] + (t - c.query_start[s]);
            as.block_table = c.block_tables.data() + static_cast<size_t>(s) * c.max_blocks_per_seq;
            as.num_logical_blocks = c.max_blocks_per_seq;
            seqs.push_back(as);
        }
    }
    std::vector<float> out(q.size(), std::nanf(""));
    AttentionArgs a;
    a.q = q.data();
    a.out = out.data();
    a.sinks = c.sinks.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.seqs = seqs.data();
    a.num_seqs = static_cast<int>(seqs.size());
    a.num_tokens = c.num_tokens;
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.block_size = c.block_size;
    a.sliding_window = c.window;
    a.scale = c.scale;
    cpu::attention(a);
    return out;
}

// The paged bf16 semantics written out on the host (what the reference kernel does), used by the
// CPU-only self-check of this harness.
std::vector<uint16_t> host_paged_attention(const HostCase& c) {
    std::vector<uint16_t> out(c.q.size(), kBf16Nan);
    for (int s = 0; s < c.num_seqs; ++s) {
        const int32_t* table = c.block_tables.data() + static_cast<size_t>(s) * c.max_blocks_per_seq;
        for (int t = c.query_start[s]; t < c.query_start[s + 1]; ++t) {
            const int pos = c.seq_start_pos[s] + (t - c.query_start[s]);
            const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
            for (int h = 0; h < kHeads; ++h) {
                const uint16_t* qh = c.q.data() + (static_cast<size_t>(t) * kHeads + h) * kHeadDim;
                const int g = h / (kHeads / kKvHeads);
                auto row = [&](int j) {
                    const size_t slot = static_cast<size_t>(table[j / c.block_size]) * c.block_size + j % c.block_size;
                    return (slot * kKvHeads + g) * kHeadDim;
                };
                std::vector<double> sc(pos - lo + 1);
                double mx = c.sinks[h];
                for (int j = lo; j <= pos; ++j) {
                    double d = 0;
                    for (int e = 0; e < kHeadDim; ++e) d += bf16_to_f32(qh[e]) * bf16_to_f32(c.k_cache[row(j) + e]);
                    sc[j - lo] = d * c.scale;
                    mx = std::max(mx, sc[j - lo]);
                }
                double den = std::exp(c.sinks[h] - mx);
                std::vector<double> acc(kHeadDim, 0.0);
                for (int j = lo; j <= pos; ++j) {
                    const double p = std::exp(sc[j - lo] - mx);
                    den += p;
                    for (int e = 0; e < kHeadDim; ++e) acc[e] += p * bf16_to_f32(c.v_cache[row(j) + e]);
                }
                uint16_t* o = out.data() + (static_cast<size_t>(t) * kHeads + h) * kHeadDim;
                for (int e = 0; e < kHeadDim; ++e) o[e] = f32_to_bf16(static_cast<float>(acc[e] / den));
            }
        }
    }
    return out;
}

struct Verdict {
    bool pass = true;
    std::string report;
};

// Compares bf16 `got` with `want` (fp32, NaN = row not computed) over the rows `want` covers;
// every element of `got` must be finite (written) whatever the rows compared.
Verdict compare(const std::string& label, const std::vector<uint16_t>& got, const std::vector<float>& want,
                const HostCase& c) {
    const int64_t rows = static_cast<int64_t>(c.num_tokens) * kHeads;
    int64_t non_finite = 0, first_non_finite = -1;
    for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
        if (!std::isfinite(bf16_to_f32(got[i]))) {
            if (first_non_finite < 0) first_non_finite = i;
            ++non_finite;
        }
    }
    double max_ref = 0.0;
    int64_t rows_checked = 0;
    for (int64_t r = 0; r < rows; ++r) {
        if (std::isnan(want[r * kHeadDim])) continue;
        ++rows_checked;
        for (int e = 0; e < kHeadDim; ++e)
            max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[r * kHeadDim + e])));
    }
    double max_err = 0.0, err2 = 0.0, ref2 = 0.0, worst_row = 0.0;
    int64_t worst = -1, worst_row_idx = -1;
    std::vector<int64_t> mismatches;
    for (int64_t r = 0; r < rows; ++r) {
        if (std::isnan(want[r * kHeadDim])) continue;
        double re2 = 0.0, rr2 = 0.0;
        for (int e = 0; e < kHeadDim; ++e) {
            const int64_t i = r * kHeadDim + e;
            const double g = bf16_to_f32(got[i]), w = want[i];
            const double d = std::isfinite(g) ? std::fabs(g - w) : INFINITY;
            if (!(d <= max_err)) {
                max_err = d;
                worst = i;
            }
            if (!(d <= kTolMax * max_ref) && mismatches.size() < 8) mismatches.push_back(i);
            re2 += d * d;
            rr2 += w * w;
        }
        err2 += re2;
        ref2 += rr2;
        const double row_excess = std::sqrt(re2) / (kTolRow * std::sqrt(rr2) + kTolRowFloor * max_ref);
        if (!(row_excess <= worst_row)) {
            worst_row = row_excess;
            worst_row_idx = r;
        }
    }
    const double rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    Verdict v;
    v.pass =
        non_finite == 0 && rows_checked > 0 && max_err <= kTolMax * max_ref && rel_l2 <= kTolL2 && worst_row <= 1.0;
    char line[512];
    std::snprintf(line, sizeof line,
                  "[attn] %-58s | max|d| %.2e (max|ref| %.2e, %.1f%% of tol) | relL2 %.2e | worst row %.2f of tol | "
                  "rows %lld/%lld | %s",
                  label.c_str(), max_err, max_ref, max_ref > 0 ? 100.0 * max_err / (kTolMax * max_ref) : 0.0, rel_l2,
                  worst_row, static_cast<long long>(rows_checked), static_cast<long long>(rows),
                  v.pass ? "PASS" : "FAIL");
    v.report = line;
    auto where = [&](int64_t i) {
        const int64_t r = i / kHeadDim;
        char b[200];
        std::snprintf(b, sizeof b, "token %lld head %lld dim %lld: got %.6g want %.6g",
                      static_cast<long long>(r / kHeads), static_cast<long long>(r % kHeads),
                      static_cast<long long>(i % kHeadDim), static_cast<double>(bf16_to_f32(got[i])),
                      static_cast<double>(want[i]));
        return std::string(b);
    };
    if (!v.pass) {
        if (non_finite) {
            v.report += "\n    " + std::to_string(non_finite) + " non-finite (unwritten or NaN) outputs; first at " +
                        where(first_non_finite);
        }
        if (worst >= 0) v.report += "\n    worst element: " + where(worst);
        if (worst_row_idx >= 0) {
            v.report += "\n    worst row: token " + std::to_string(worst_row_idx / kHeads) + " head " +
                        std::to_string(worst_row_idx % kHeads);
        }
        for (int64_t i : mismatches) v.report += "\n    mismatch: " + where(i);
    }
    return v;
}

// bf16 → fp32 with NaN for rows not to be compared (used for GPU-vs-GPU comparisons: all rows).
std::vector<float> to_f32(const std::vector<uint16_t>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
    return y;
}

// ---- device side -------------------------------------------------------------------------------

class DevBuf {
public:
    DevBuf() = default;
    ~DevBuf() {
        if (p_) cudaFree(p_);
    }
    // Returns false when cudaMalloc fails.
    bool alloc(size_t bytes) {
        if (p_) cudaFree(p_);
        p_ = nullptr;
        bytes_ = bytes;
        return cudaMalloc(&p_, std::max<size_t>(bytes, 16)) == cudaSuccess;
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    template <typename T = void>
    T* as() const {
        return static_cast<T*>(p_);
    }
    size_t bytes() const { return bytes_; }

private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

struct DeviceCase {
    DevBuf q, out, sinks, k, v, tables, start_pos, query_start, workspace;
    PagedAttentionArgs args;
    size_t out_elems = 0;
};

constexpr int kMaxSplits = 64;

// Uploads a case. Device caches get kGuardBlocks NaN blocks in front of block 0.
void upload(const HostCase& c, DeviceCase& d) {
    const size_t be = c.block_elems();
    const size_t elem = c.fp8 ? 1 : 2;  // bytes per cache element
    const size_t cache_bytes = (c.num_blocks + kGuardBlocks) * be * elem;
    const size_t ws_bytes = static_cast<size_t>(std::max(c.num_seqs, 1)) * kHeads * kMaxSplits * (kHeadDim + 2) * 4;
    const bool ok = d.q.alloc(c.q.size() * 2) && d.out.alloc(c.q.size() * 2) && d.sinks.alloc(kHeads * 4) &&
                    d.k.alloc(cache_bytes) && d.v.alloc(cache_bytes) && d.tables.alloc(c.block_tables.size() * 4) &&
                    d.start_pos.alloc(c.seq_start_pos.size() * 4) && d.query_start.alloc(c.query_start.size() * 4) &&
                    d.workspace.alloc(ws_bytes);
    ASSERT_TRUE(ok) << "cudaMalloc failed";
    CK(cudaMemcpy(d.q.as(), c.q.data(), c.q.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.sinks.as(), c.sinks.data(), kHeads * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d.k.as(), 0xFF, kGuardBlocks * be * elem));  // bf16 and e4m3 NaN alike
    CK(cudaMemset(d.v.as(), 0xFF, kGuardBlocks * be * elem));
    uint8_t* k0 = d.k.as<uint8_t>() + kGuardBlocks * be * elem;
    uint8_t* v0 = d.v.as<uint8_t>() + kGuardBlocks * be * elem;
    if (c.fp8) {
        CK(cudaMemcpy(k0, c.k8.data(), c.k8.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v0, c.v8.data(), c.v8.size(), cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(k0, c.k_cache.data(), c.k_cache.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v0, c.v_cache.data(), c.v_cache.size() * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(d.tables.as(), c.block_tables.data(), c.block_tables.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.start_pos.as(), c.seq_start_pos.data(), c.seq_start_pos.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.query_start.as(), c.query_start.data(), c.query_start.size() * 4, cudaMemcpyHostToDevice));
    PagedAttentionArgs& a = d.args;
    a.q = d.q.as();
    a.out = d.out.as();
    a.sinks = d.sinks.as<float>();
    a.k_cache = k0;
    a.v_cache = v0;
    a.kv_fp8 = c.fp8;
    a.block_tables = d.tables.as<int32_t>();
    a.seq_start_pos = d.start_pos.as<int32_t>();
    a.query_start = d.query_start.as<int32_t>();
    a.max_blocks_per_seq = c.max_blocks_per_seq;
    a.num_seqs = c.num_seqs;
    a.num_tokens = c.num_tokens;
    a.max_query_len = c.max_query_len;
    a.max_context_len = c.max_context_len;
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.block_size = c.block_size;
    a.sliding_window = c.window;
    a.scale = c.scale;
    a.workspace = d.workspace.as<float>();
    a.max_splits = kMaxSplits;
    d.out_elems = c.q.size();
}

enum class Kernel { kPrefill, kDecode, kReference };

// Poisons out, launches, synchronises, downloads. splits: 0 = the launcher's own choice.
void run_kernel(DeviceCase& d, Kernel k, int splits, std::vector<uint16_t>& out) {
    CK(cudaMemset(d.out.as(), 0xFF, d.out_elems * 2));
    switch (k) {
        case Kernel::kPrefill: cuda::paged_attention_prefill(d.args, nullptr); break;
        case Kernel::kDecode:
            if (splits == 0)
                cuda::paged_attention_decode(d.args, nullptr);
            else
                cuda::paged_attention_decode_splits(d.args, splits, nullptr);
            break;
        case Kernel::kReference: cuda::paged_attention_reference_cuda(d.args, nullptr); break;
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    out.resize(d.out_elems);
    CK(cudaMemcpy(out.data(), d.out.as(), d.out_elems * 2, cudaMemcpyDeviceToHost));
}

// The rows quantized for the O projection (PagedAttentionArgs::out_q) by the kernel d.args selects:
// the e4m3 bytes and scales must be quantize_act_fp8_bf16's of `rows`, that kernel's bf16 output,
// padding rows included (zeros, scale 1: several cases have T % 4 != 0). Both outputs start poisoned.
void check_out_q(DeviceCase& d, const HostCase& c, const std::string& label, const std::vector<uint16_t>& rows) {
    const int T = c.num_tokens, K = kHeads * kHeadDim;
    if (T == 0) return;
    const int m_pad = cuda::fp8_gemm_m_pad(T);
    const size_t qb = static_cast<size_t>(m_pad) * K, sb = static_cast<size_t>(K / 128) * m_pad * 4;
    DevBuf xq, xs, xq_ref, xs_ref, drows;
    ASSERT_TRUE(xq.alloc(qb) && xs.alloc(sb) && xq_ref.alloc(qb) && xs_ref.alloc(sb) && drows.alloc(rows.size() * 2));
    CK(cudaMemset(xq.as(), 0x7F, qb));  // e4m3 0x7F: NaN
    CK(cudaMemset(xs.as(), 0xFF, sb));
    d.args.out_q = xq.as<uint8_t>();
    d.args.out_q_scale = xs.as<float>();
    d.args.out_q_m_pad = m_pad;
    std::vector<uint16_t> unused;
    run_kernel(d, Kernel::kPrefill, 0, unused);
    d.args.out_q = nullptr;
    d.args.out_q_scale = nullptr;
    d.args.out_q_m_pad = 0;
    if (::testing::Test::HasFatalFailure()) return;
    CK(cudaMemcpy(drows.as(), rows.data(), rows.size() * 2, cudaMemcpyHostToDevice));
    cuda::quantize_act_fp8_bf16(drows.as(), T, K, K, xq_ref.as<uint8_t>(), xs_ref.as<float>(), nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> got_q(qb), want_q(qb);
    std::vector<float> got_s(sb / 4), want_s(sb / 4);
    CK(cudaMemcpy(got_q.data(), xq.as(), qb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want_q.data(), xq_ref.as(), qb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got_s.data(), xs.as(), sb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want_s.data(), xs_ref.as(), sb, cudaMemcpyDeviceToHost));
    size_t dq = 0, ds = 0;
    for (size_t i = 0; i < qb; ++i) dq += got_q[i] != want_q[i];
    for (size_t i = 0; i < got_s.size(); ++i) ds += std::memcmp(&got_s[i], &want_s[i], 4) != 0;
    EXPECT_EQ(dq, 0u) << label << ": e4m3 bytes differ from quantize_act_fp8_bf16 of the bf16 rows";
    EXPECT_EQ(ds, 0u) << label << ": scales differ from quantize_act_fp8_bf16 of the bf16 rows";
}

// q straight from the QKV rows (PagedAttentionArgs::q_raw): random bf16 QKV rows (no bias, not
// rotated), a bias, positions from the case's sequences and YaRN-like frequencies; the RoPE kernel
// (qkv_bias_rope_kv_write, no cache writes: every slot −1) makes q, then every prefill kernel runs
// on that q and on the raw rows. The rotation and the bias are the RoPE kernel's code
// (rope_cos_sin / rope_rotate), so the outputs must be the same bits; they must also be finite (an
// unwritten output would be the 0xFFFF poison in both).
void check_q_raw(const HostCase& c, DeviceCase& d, const std::string& tag, uint64_t seed) {
    const int T = c.num_tokens, width = (kHeads + 2 * kKvHeads) * kHeadDim;
    if (T == 0) return;
    Rng rng(seed ^ 0x51ab0e7ull);
    std::vector<uint16_t> raw(static_cast<size_t>(T) * width);
    for (auto& x : raw) x = f32_to_bf16(rng.sym(2.0f));
    std::vector<float> bias(width), inv_freq(kHeadDim / 2);
    for (auto& b : bias) b = rng.sym(0.5f);
    for (int i = 0; i < kHeadDim / 2; ++i)
        inv_freq[i] = static_cast<float>(std::pow(150000.0, -2.0 * i / kHeadDim) * (i < 8 ? 1.0 : 1.0 / 32.0));
    std::vector<int32_t> pos(T), slots(T, -1);
    for (int s = 0; s < c.num_seqs; ++s)
        for (int t = c.query_start[s]; t < c.query_start[s + 1]; ++t)
            pos[t] = c.seq_start_pos[s] + t - c.query_start[s];
    DevBuf draw, dbias, dfreq, dpos, dslots, dq;
    ASSERT_TRUE(draw.alloc(raw.size() * 2) && dbias.alloc(width * 4) && dfreq.alloc(inv_freq.size() * 4) &&
                dpos.alloc(T * 4) && dslots.alloc(T * 4) && dq.alloc(static_cast<size_t>(T) * kHeads * kHeadDim * 2));
    CK(cudaMemcpy(draw.as(), raw.data(), raw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbias.as(), bias.data(), width * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dfreq.as(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos.as(), pos.data(), T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dslots.as(), slots.data(), T * 4, cudaMemcpyHostToDevice));
    cuda::QkvRopeArgs r;
    r.qkv = draw.as();
    r.qkv_bf16 = true;
    r.bias = dbias.as<float>();
    r.positions = dpos.as<int32_t>();
    r.slot_mapping = dslots.as<int32_t>();
    r.inv_freq = dfreq.as<float>();
    r.attention_scaling = 1.2f;
    r.q_out = dq.as();
    r.k_cache = const_cast<void*>(d.args.k_cache);
    r.v_cache = const_cast<void*>(d.args.v_cache);
    r.kv_fp8 = c.fp8;
    r.num_tokens = T;
    r.num_heads = kHeads;
    r.num_kv_heads = kKvHeads;
    r.head_dim = kHeadDim;
    cuda::qkv_bias_rope_kv_write(r, nullptr);
    CK(cudaGetLastError());
    DevBuf dcs;  // the (cos, sin) table of the same positions
    ASSERT_TRUE(dcs.alloc(static_cast<size_t>(T) * kHeadDim * 4));
    cuda::rope_cos_sin_table(dpos.as<int32_t>(), T, dfreq.as<float>(), kHeadDim / 2, 1.2f, dcs.as<float>(), nullptr);
    CK(cudaGetLastError());

    struct Variant {
        const char* name;
        bool wgmma, tma, pipe, pingpong;
        int order;  // prefill_softmax_order
    };
    const Variant variants[] = {{"mma.sync", false, false, false, false, 1},
                                {"wgmma", true, false, false, false, 1},
                                {"tma", true, true, false, false, 1},
                                {"pipe", true, true, true, false, 1},
                                {"pingpong", true, true, true, true, 1},
                                {"pipe unordered", true, true, true, false, 0},
                                {"pingpong unordered", true, true, true, true, 0}};
    const PagedAttentionArgs base = d.args;
    for (const Variant& v : variants) {
        d.args = base;
        d.args.prefill_wgmma = v.wgmma;
        d.args.prefill_tma = v.tma;
        d.args.prefill_pipe = v.pipe;
        d.args.prefill_pingpong = v.pingpong;
        d.args.prefill_softmax_order = v.order;
        d.args.q = dq.as();
        std::vector<uint16_t> want, got;
        run_kernel(d, Kernel::kPrefill, 0, want);
        d.args.q = nullptr;
        d.args.q_raw = draw.as();
        d.args.q_raw_stride = width;
        d.args.q_bias = dbias.as<float>();
        d.args.q_positions = dpos.as<int32_t>();
        d.args.rope_inv_freq = dfreq.as<float>();
        d.args.rope_scaling = 1.2f;
        run_kernel(d, Kernel::kPrefill, 0, got);
        // The same with the (cos, sin) table (PagedAttentionArgs::q_rope_cs) instead of sincosf.
        std::vector<uint16_t> got_table;
        d.args.q_rope_cs = dcs.as<float>();
        run_kernel(d, Kernel::kPrefill, 0, got_table);
        d.args = base;
        if (::testing::Test::HasFatalFailure()) return;
        size_t differ = 0, bad = 0, differ_table = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            differ += got[i] != want[i];
            differ_table += got_table[i] != want[i];
            bad += (want[i] & 0x7fffu) >= 0x7f80u;  // inf or NaN
        }
        EXPECT_EQ(bad, 0u) << tag << " q_raw " << v.name << ": non-finite outputs from the RoPE kernel's q";
        EXPECT_EQ(differ, 0u) << tag << " q_raw " << v.name << ": differs from the kernel on the RoPE kernel's q";
        EXPECT_EQ(differ_table, 0u) << tag << " q_raw + table " << v.name
                                    << ": differs from the kernel on the RoPE kernel's q";
    }
}

// Fluent tester (STYLE.md rule 13).
class AttentionTester {
public:
    AttentionTester& name(std::string n) {
        name_ = std::move(n);
        return *this;
    }
    AttentionTester& seqs(std::vector<SeqSpec> s) {
        seqs_ = std::move(s);
        return *this;
    }
    AttentionTester& window(int w) {
        window_ = w;
        return *this;
    }
    AttentionTester& block_size(int b) {
        block_size_ = b;
        return *this;
    }
    AttentionTester& q_amp(float a) {
        q_amp_ = a;
        return *this;
    }
    AttentionTester& decode(std::vector<int> splits) {
        decode_ = true;
        splits_ = std::move(splits);
        return *this;
    }
    // CPU reference on every n-th token of each sequence plus its last 8 (the GPU reference kernel
    // still checks every row).
    AttentionTester& ref_stride(int n) {
        ref_stride_ = n;
        return *this;
    }
    AttentionTester& seed(uint64_t s) {
        seed_ = s;
        return *this;
    }
    AttentionTester& fp8_kv() {
        fp8_ = true;
        return *this;
    }

    void run() {
        const HostCase c = make_case(seqs_, window_, block_size_, q_amp_, seed_, fp8_);
        std::vector<int> rows;
        if (ref_stride_ > 1) {
            for (int s = 0; s < c.num_seqs; ++s)
                for (int t = c.query_start[s]; t < c.query_start[s + 1]; ++t)
                    if ((t - c.query_start[s]) % ref_stride_ == 0 || t >= c.query_start[s + 1] - 8) rows.push_back(t);
        }
        const std::vector<float> ref = cpu_reference(c, rows);
        DeviceCase d;
        upload(c, d);
        if (::testing::Test::HasFatalFailure()) return;
        char tag[160];
        std::snprintf(tag, sizeof tag, "%s/w%d/bs%d%s", name_.c_str(), window_, block_size_, fp8_ ? "/fp8kv" : "");

        std::vector<uint16_t> ref_gpu;
        run_kernel(d, Kernel::kReference, 0, ref_gpu);
        if (::testing::Test::HasFatalFailure()) return;
        check(std::string(tag) + " reference_cuda", ref_gpu, ref, c);

        std::vector<uint16_t> got;
        if (!decode_) {
            run_kernel(d, Kernel::kPrefill, 0, got);
            if (::testing::Test::HasFatalFailure()) return;
            check(std::string(tag) + " prefill", got, ref, c);
            check(std::string(tag) + " prefill vs reference_cuda", got, to_f32(ref_gpu), c);
            // The warpgroup (wgmma) prefill kernel against the same references.
            d.args.prefill_wgmma = true;
            run_kernel(d, Kernel::kPrefill, 0, got);
            d.args.prefill_wgmma = false;
            if (::testing::Test::HasFatalFailure()) return;
            check(std::string(tag) + " prefill wgmma", got, ref, c);
            check(std::string(tag) + " prefill wgmma vs reference_cuda", got, to_f32(ref_gpu), c);
            // Its TMA variant (bf16 caches with block_size % 16 == 0; otherwise the call falls back
            // to the kernel above). The caches' unused slots are poisoned: rows outside a query's
            // range reach shared memory here and must be zeroed or masked, not read.
            d.args.prefill_wgmma = true;
            d.args.prefill_tma = true;
            run_kernel(d, Kernel::kPrefill, 0, got);
            d.args.prefill_wgmma = false;
            d.args.prefill_tma = false;
            if (::testing::Test::HasFatalFailure()) return;
            check(std::string(tag) + " prefill tma", got, ref, c);
            check(std::string(tag) + " prefill tma vs reference_cuda", got, to_f32(ref_gpu), c);
            // The pipelined TMA kernel (P·V of the previous tile under the current softmax): the
            // same operations on o, m and l in the same order, so the same bits as the TMA kernel.
            if (!c.fp8 && block_size_ % 16 == 0) {
                std::vector<uint16_t> piped;
                d.args.prefill_wgmma = true;
                d.args.prefill_tma = true;
                d.args.prefill_pipe = true;
                run_kernel(d, Kernel::kPrefill, 0, piped);
                d.args.prefill_wgmma = false;
                d.args.prefill_tma = false;
                d.args.prefill_pipe = false;
                if (::testing::Test::HasFatalFailure()) return;
                check(std::string(tag) + " prefill pipe", piped, ref, c);
                size_t differ = 0;
                for (size_t i = 0; i < got.size(); ++i) differ += piped[i] != got[i];
                EXPECT_EQ(differ, 0u) << tag << ": the pipelined kernel differs from the TMA kernel";
                // With every V row outside a query tile's keys zeroed (prefill_zero_all_rows, the
                // kernel before r46): the same bits, since the rows no longer zeroed are written keys
                // (the unused slots are NaN here, so a missed one shows).
                for (bool pingpong : {false, true}) {
                    std::vector<uint16_t> zeroed;
                    d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = true;
                    d.args.prefill_pingpong = pingpong;
                    d.args.prefill_zero_all_rows = true;
                    run_kernel(d, Kernel::kPrefill, 0, zeroed);
                    d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = false;
                    d.args.prefill_pingpong = d.args.prefill_zero_all_rows = false;
                    if (::testing::Test::HasFatalFailure()) return;
                    size_t zd = 0;
                    for (size_t i = 0; i < got.size(); ++i) zd += zeroed[i] != piped[i];
                    EXPECT_EQ(zd, 0u) << tag << ": zeroing every row outside the keys changes the output (pingpong "
                                      << pingpong << ")";
                }
                // Its warpgroups taking turns at the tensor cores (prefill_pingpong): only the order of
                // issue changes, so the same bits.
                std::vector<uint16_t> turns;
                d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = d.args.prefill_pingpong = true;
                run_kernel(d, Kernel::kPrefill, 0, turns);
                d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = d.args.prefill_pingpong = false;
                if (::testing::Test::HasFatalFailure()) return;
                size_t moved = 0;
                for (size_t i = 0; i < got.size(); ++i) moved += turns[i] != piped[i];
                EXPECT_EQ(moved, 0u) << tag << ": the ping-pong kernel differs from the pipelined kernel";
                // Without the store that keeps the softmax before the P·V wait (prefill_softmax_order = 0,
                // the kernel before session 34): only the schedule changes, so the same bits, in both
                // loops and with the quantizing epilogue.
                for (bool pingpong : {false, true}) {
                    std::vector<uint16_t> rows;
                    d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = true;
                    d.args.prefill_pingpong = pingpong;
                    d.args.prefill_softmax_order = 0;
                    run_kernel(d, Kernel::kPrefill, 0, rows);
                    check_out_q(d, c, std::string(tag) + " out_q unordered pingpong " + std::to_string(pingpong), rows);
                    d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = d.args.prefill_pingpong = false;
                    d.args.prefill_softmax_order = 1;
                    if (::testing::Test::HasFatalFailure()) return;
                    size_t od = 0;
                    for (size_t i = 0; i < got.size(); ++i) od += rows[i] != piped[i];
                    EXPECT_EQ(od, 0u) << tag << ": the unordered softmax changes the output (pingpong " << pingpong
                                      << ")";
                }
                // The rows quantized for the O projection: in the epilogue of the pipelined and
                // ping-pong kernels; after the TMA kernel by the quantizer.
                d.args.prefill_wgmma = d.args.prefill_tma = d.args.prefill_pipe = true;
                check_out_q(d, c, std::string(tag) + " out_q pipe", piped);
                d.args.prefill_pingpong = true;
                check_out_q(d, c, std::string(tag) + " out_q pingpong", turns);
                d.args.prefill_pipe = d.args.prefill_pingpong = false;
                check_out_q(d, c, std::string(tag) + " out_q tma", got);
                d.args.prefill_wgmma = d.args.prefill_tma = false;
                if (::testing::Test::HasFatalFailure()) return;
            }
            check_q_raw(c, d, tag, seed_);
        } else {
            for (int sp : splits_) {
                run_kernel(d, Kernel::kDecode, sp, got);
                if (c.fp8) {  // the direct e4m3 kernel too (f16 MMAs; same combine), the same references
                    std::vector<uint16_t> direct;
                    d.args.fp8_direct = true;
                    run_kernel(d, Kernel::kDecode, sp, direct);
                    d.args.fp8_direct = false;
                    if (::testing::Test::HasFatalFailure()) return;
                    const std::string which =
                        " decode fp8 direct splits=" + (sp == 0 ? std::string("auto") : std::to_string(sp));
                    check(std::string(tag) + which, direct, ref, c);
                    check(std::string(tag) + which + " vs reference_cuda", direct, to_f32(ref_gpu), c);
                }
                if (::testing::Test::HasFatalFailure()) return;
                const std::string which =
                    sp == 0 ? std::string(" decode splits=auto") : " decode splits=" + std::to_string(sp);
                check(std::string(tag) + which, got, ref, c);
                check(std::string(tag) + which + " vs reference_cuda", got, to_f32(ref_gpu), c);
            }
        }
    }

private:
    static void check(const std::string& label, const std::vector<uint16_t>& got, const std::vector<float>& want,
                      const HostCase& c) {
        const Verdict v = compare(label, got, want, c);
        std::printf("%s\n", v.report.c_str());
        EXPECT_TRUE(v.pass) << v.report;
    }

    std::string name_ = "case";
    std::vector<SeqSpec> seqs_;
    int window_ = 0;
    int block_size_ = 16;
    float q_amp_ = 1.0f;
    bool decode_ = false;
    std::vector<int> splits_;
    int ref_stride_ = 1;
    uint64_t seed_ = 1;
    bool fp8_ = false;
};

uint64_t case_seed(const std::string& s, int i) {
    uint64_t h = 1469598103934665603ull;
    for (char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
    return h ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
}

// ---- the CPU-only self-check of the harness ------------------------------------------------------

// Runs without a GPU: the host transcription of the paged bf16 semantics against cpu::attention on
// small cases (tables, −1 entries, NaN slots, windows, mixed batches), so that a harness bug is not
// mistaken for a kernel bug on the H200.
TEST(AttentionHarness, CpuSelfCheck) {
    const std::vector<std::pair<std::vector<SeqSpec>, int>> cases = {
        {{{0, 17}}, 0},
        {{{0, 40}}, 16},
        {{{100, 3}, {0, 1}, {0, 0}, {37, 20}}, 16},
        {{{70, 1}, {5, 1}, {200, 1}}, 32},
    };
    int i = 0;
    for (const auto& [seqs, window] : cases) {
        for (int bs : {16, 32}) {
            const HostCase c = make_case(seqs, window, bs, 1.5f, case_seed("self", i++));
            const std::vector<float> ref = cpu_reference(c, {});
            const Verdict v = compare("self-check host paged vs cpu::attention", host_paged_attention(c), ref, c);
            std::printf("%s\n", v.report.c_str());
            EXPECT_TRUE(v.pass) << v.report;
        }
    }
}

// ---- prefill -------------------------------------------------------------------------------------

TEST(PagedAttentionCuda, PrefillSingleSequence) {
    REQUIRE_GPU();
    const int block_sizes[] = {16, 32, 64};
    int i = 0;
    for (int len : {1, 17, 128, 129, 1000, 4100}) {
        for (int window : {0, 128}) {
            const int bs = block_sizes[i % 3];
            AttentionTester()
                .name("prefill len" + std::to_string(len))
                .seqs({{0, len}})
                .window(window)
                .block_size(bs)
                .q_amp(i % 2 ? 2.0f : 1.0f)
                .ref_stride(len > 2000 && window == 0 ? 3 : 1)
                .seed(case_seed("prefill", i))
                .run();
            ++i;
        }
    }
}

TEST(PagedAttentionCuda, PrefillChunkedAfterCachedPrefix) {
    REQUIRE_GPU();
    struct C {
        SeqSpec s;
        int window, bs;
    };
    const C cases[] = {
        {{1000, 300}, 0, 16},
        {{1000, 300}, 128, 32},
        {{4000, 100}, 128, 16},
        {{4000, 100}, 0, 64},
        {{127, 1}, 0, 16},
        {{128, 129}, 128, 64},
        {{5000, 700}, 0, 32},
        {{63, 2}, 128, 16},
        // One query against a whole first tile (keys 0..31, 0..63), then against two tiles.
        {{31, 1}, 0, 16},
        {{63, 1}, 0, 16},
        {{64, 1}, 0, 16},
    };
    int i = 0;
    for (const C& c : cases) {
        AttentionTester()
            .name("chunked start" + std::to_string(c.s.start_pos) + "+" + std::to_string(c.s.num_new))
            .seqs({c.s})
            .window(c.window)
            .block_size(c.bs)
            .q_amp(1.5f)
            .seed(case_seed("chunked", i++))
            .run();
    }
}

TEST(PagedAttentionCuda, PrefillMixedBatch) {
    REQUIRE_GPU();
    const std::vector<SeqSpec> batch = {{0, 17}, {500, 129}, {0, 1}, {3000, 64}, {130, 200}, {0, 0}, {77, 5}, {0, 300}};
    int i = 0;
    for (int window : {0, 128}) {
        for (int bs : {16, 64}) {
            AttentionTester()
                .name("mixed batch of 8")
                .seqs(batch)
                .window(window)
                .block_size(bs)
                .q_amp(2.0f)
                .seed(case_seed("mixed", i++))
                .run();
        }
    }
    // A decode-shaped batch through the prefill kernel (one token per sequence).
    AttentionTester()
        .name("prefill kernel, 1 token x 5 seqs")
        .seqs({{0, 1}, {1, 1}, {127, 1}, {128, 1}, {2047, 1}})
        .window(128)
        .block_size(32)
        .seed(case_seed("mixed", 99))
        .run();
}

std::vector<SeqSpec> decode_batch(const std::vector<int>& contexts) {
    std::vector<SeqSpec> s;
    for (int ctx : contexts) s.push_back({ctx - 1, 1});
    return s;
}

// The FP8 (e4m3) KV cache: the kernels read e4m3 bytes and widen them to bf16 in shared memory (and
// the decode kernel's direct variant, PagedAttentionArgs::fp8_direct, into f16 MMA fragments); the
// references see the same values, so the bf16 tolerances apply unchanged. Prefill (one sequence,
// chunked after a cached prefix, a mixed batch) and decode (batch 1 and 3, several split counts).
TEST(PagedAttentionCuda, Fp8KvCache) {
    REQUIRE_GPU();
    int i = 0;
    for (int window : {0, 128}) {
        AttentionTester()
            .name("fp8 kv prefill len 1000")
            .seqs({{0, 1000}})
            .window(window)
            .block_size(16)
            .q_amp(2.0f)
            .seed(case_seed("fp8kv", i++))
            .fp8_kv()
            .run();
        AttentionTester()
            .name("fp8 kv chunked 4000+100")
            .seqs({{4000, 100}})
            .window(window)
            .block_size(32)
            .q_amp(1.5f)
            .seed(case_seed("fp8kv", i++))
            .fp8_kv()
            .run();
        AttentionTester()
            .name("fp8 kv mixed batch")
            .seqs({{0, 17}, {500, 129}, {0, 1}, {130, 200}, {77, 5}})
            .window(window)
            .block_size(64)
            .q_amp(2.0f)
            .seed(case_seed("fp8kv", i++))
            .fp8_kv()
            .run();
        for (const std::vector<int>& ctxs : {std::vector<int>{8192}, std::vector<int>{33000, 1, 129}}) {
            AttentionTester()
                .name("fp8 kv decode B" + std::to_string(ctxs.size()))
                .seqs(decode_batch(ctxs))
                .window(window)
                .block_size(16)
                .q_amp(2.0f)
                .decode({0, 1, 7})
                .seed(case_seed("fp8kv", i++))
                .fp8_kv()
                .run();
        }
    }
}

// ---- decode ----------------------------------------------------------------------------------------

TEST(PagedAttentionCuda, DecodeBatch1) {
    REQUIRE_GPU();
    int i = 0;
    for (int ctx : {1, 127, 128, 129, 1000, 8192, 33000}) {
        for (int window : {0, 128}) {
            if (window > 0 && ctx > 1000 && ctx != 33000) continue;
            AttentionTester()
                .name("decode B1 ctx" + std::to_string(ctx))
                .seqs(decode_batch({ctx}))
                .window(window)
                .block_size(i % 2 ? 32 : 16)
                .q_amp(i % 3 == 0 ? 2.5f : 1.0f)
                .decode({0, 1, 2, 7, 64})
                .seed(case_seed("decode1", i))
                .run();
            ++i;
        }
    }
}

TEST(PagedAttentionCuda, DecodeBatch3) {
    REQUIRE_GPU();
    int i = 0;
    for (const std::vector<int>& ctxs : {std::vector<int>{33000, 1, 129}, std::vector<int>{8192, 127, 1000}}) {
        for (int window : {0, 128}) {
            AttentionTester()
                .name("decode B3")
                .seqs(decode_batch(ctxs))
                .window(window)
                .block_size(64)
                .q_amp(2.0f)
                .decode({0, 1, 3, 16})
                .seed(case_seed("decode3", i++))
                .run();
        }
    }
}

TEST(PagedAttentionCuda, DecodeBatch64And128) {
    REQUIRE_GPU();
    const int cycle[] = {1, 127, 128, 129, 1000, 8192, 33000};
    std::vector<int> b64, b128;
    for (int s = 0; s < 64; ++s) b64.push_back(cycle[s % 7]);
    for (int s = 0; s < 128; ++s) b128.push_back(s % 32 == 5 ? 33000 : cycle[s % 6]);
    AttentionTester()
        .name("decode B64")
        .seqs(decode_batch(b64))
        .block_size(16)
        .q_amp(1.5f)
        .decode({0, 1, 5, 16})
        .seed(11)
        .run();
    AttentionTester()
        .name("decode B64")
        .seqs(decode_batch(b64))
        .window(128)
        .block_size(32)
        .decode({0, 2})
        .seed(12)
        .run();
    AttentionTester()
        .name("decode B128")
        .seqs(decode_batch(b128))
        .block_size(32)
        .q_amp(2.0f)
        .decode({0, 1, 3})
        .seed(13)
        .run();
    AttentionTester()
        .name("decode B128")
        .seqs(decode_batch(b128))
        .window(128)
        .block_size(16)
        .decode({0, 1})
        .seed(14)
        .run();
}

// Zero-token sequences in a decode batch (graph buckets pad this way) are skipped.
TEST(PagedAttentionCuda, DecodePaddingSequence) {
    REQUIRE_GPU();
    AttentionTester()
        .name("decode with empty seqs")
        .seqs({{99, 1}, {0, 0}, {5000, 1}, {0, 0}})
        .decode({0, 1, 4})
        .seed(21)
        .run();
}

// Decode captured once in a CUDA graph with a generous max_context_len, then replayed after the
// device-side positions changed (the split rule must follow the device data).
TEST(PagedAttentionCuda, DecodeGraphReplayWithNewPositions) {
    REQUIRE_GPU();
    const std::vector<int> final_ctx = {4000, 1, 20000, 129, 700, 64, 9000, 3};
    HostCase c = make_case(decode_batch(final_ctx), 0, 16, 1.5f, 31);
    DeviceCase d;
    upload(c, d);
    if (HasFatalFailure()) return;
    d.args.max_context_len = 32768;  // the bucket's bound, not the batch's
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cuda::paged_attention_decode(d.args, stream);  // warm-up outside capture (attributes, module load)
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::paged_attention_decode(d.args, stream);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 3; ++round) {
        // Round 0: earlier positions (shorter contexts); 1: the final ones; 2: shuffled q.
        std::vector<int32_t> pos = c.seq_start_pos;
        if (round == 0)
            for (auto& p : pos) p = p / 3;
        HostCase cr = c;
        cr.seq_start_pos = pos;
        if (round == 2) {
            Rng rng(77);
            for (auto& x : cr.q) x = f32_to_bf16(rng.sym(2.0f));
            CK(cudaMemcpy(d.q.as(), cr.q.data(), cr.q.size() * 2, cudaMemcpyHostToDevice));
        }
        CK(cudaMemcpy(d.start_pos.as(), pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(d.out.as(), 0xFF, d.out_elems * 2));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        std::vector<uint16_t> got(d.out_elems);
        CK(cudaMemcpy(got.data(), d.out.as(), d.out_elems * 2, cudaMemcpyDeviceToHost));
        const Verdict v = compare("decode graph replay round " + std::to_string(round), got, cpu_reference(cr, {}), cr);
        std::printf("%s\n", v.report.c_str());
        EXPECT_TRUE(v.pass) << v.report;
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(stream));
}

TEST(PagedAttentionCuda, ChooseDecodeSplits) {
    // Host-only heuristic; runs everywhere but lives with the GPU tests it configures.
    EXPECT_EQ(cuda::choose_decode_splits(1, 8, 32768, 0, 64, 132), 49);   // 396 slots / 8 CTAs
    EXPECT_EQ(cuda::choose_decode_splits(1, 8, 1000, 0, 64, 132), 8);     // 16 tiles / 2 per split
    EXPECT_EQ(cuda::choose_decode_splits(1, 8, 32768, 128, 64, 132), 2);  // a window spans ≤ 3 tiles
    EXPECT_EQ(cuda::choose_decode_splits(8, 8, 32768, 0, 64, 132), 6);
    EXPECT_EQ(cuda::choose_decode_splits(64, 8, 32768, 0, 64, 132), 1);
    EXPECT_EQ(cuda::choose_decode_splits(1, 8, 32768, 0, 1, 132), 1);
    EXPECT_EQ(cuda::choose_decode_splits(1, 8, 32768, 0, 16, 132), 16);
}

}  // namespace
}  // namespace gptoss::kernels
