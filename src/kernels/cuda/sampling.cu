#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/sampling.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSplit = 32;  // CTAs per greedy row
constexpr int kSplitThreads = 256;
constexpr int kRecordWords = 2 * kSplit + 1;  // argmax_split_kernel's record a row

// The split draw's state a row (SampleArgs::split_draws), zero between calls (each sequence of launches leaves it
// so): the key histogram of a radix pass, the nucleus's mass and target, the largest logit's key, the kept floor,
// the radix prefix, a ticket, and the final pass's partial winners.
struct SplitState {
    unsigned long long hist[256];
    unsigned long long z, target, above;
    uint32_t mx_key, min_key, prefix, ticket;
    float part_val[kSplit];
    int part_idx[kSplit];
};
// A row's workspace: argmax_split_kernel's record, then its SplitState; rows at this stride whatever num_seqs is.
constexpr size_t kRecordBytes = (kRecordWords * 4 + 15) / 16 * 16;
constexpr size_t kRowBytes = kRecordBytes + (sizeof(SplitState) + 15) / 16 * 16;

__device__ __forceinline__ bool is_greedy(const SampleArgs& a, int s) {
    return a.temperature[s] <= 0.0f || a.top_k[s] == 1;
}

// Row s's logits and mask (SampleArgs::row_index, allowed_bits).
struct RowView {
    const float* row;
    const uint32_t* bits;  // nullptr: every token allowed
    __device__ RowView(const SampleArgs& a, int s) {
        const int r = a.row_index != nullptr ? a.row_index[s] : s;
        row = a.logits + static_cast<int64_t>(r) * a.vocab_size;
        bits =
            a.allowed_bits != nullptr ? a.allowed_bits + static_cast<int64_t>(s) * ((a.vocab_size + 31) / 32) : nullptr;
    }
    __device__ __forceinline__ bool allowed(int i) const {
        return bits == nullptr || ((bits[i >> 5] >> (i & 31)) & 1u);
    }
};

// (value, index) arg-max step: larger value, ties to the lower index (the CPU's rule).
__device__ __forceinline__ void take_best(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Block-wide arg-max: thread 0 ends with the block's (bv, bi). Returns whether any thread saw a
// non-finite value. wv, wi: shared scratch of blockDim.x / 32 entries. Every thread calls it.
__device__ __forceinline__ bool block_argmax(float& bv, int& bi, bool finite, float* wv, int* wi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take_best(bv, bi, ov, oi);
    }
    if ((threadIdx.x & 31) == 0) {
        wv[threadIdx.x >> 5] = bv;
        wi[threadIdx.x >> 5] = bi;
    }
    const bool bad = __syncthreads_or(!finite);
    if (threadIdx.x == 0)
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) take_best(bv, bi, wv[w], wi[w]);
    return bad;
}

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
__device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The pieces every sample kernel shares, so that the split draw gives the one-CTA kernel's tokens by construction:
// a draw's noise seed (the request's seed mixed with its draw index); token i's Gumbel-perturbed value l / T + g;
// a token's probability relative to the most probable one's in 2^-32 units (the nucleus's integer sums); and
// min_p's floor on the keys (p / p_max >= min_p: l >= mx + T ln(min_p)).
__device__ __forceinline__ uint64_t draw_seed(const SampleArgs& a, int s) {
    return splitmix64(a.seed[s]) ^ (a.draw_index[s] * 0x9e3779b97f4a7c15ull);
}
__device__ __forceinline__ float gumbel_value(float l, float inv_t, uint64_t seed, int i) {
    const double u = (static_cast<double>(splitmix64(seed ^ static_cast<uint64_t>(i)) >> 11) + 0.5) * 0x1.0p-53;
    return l * inv_t - logf(-logf(static_cast<float>(u)));
}
__device__ __forceinline__ unsigned long long mass_weight(float l, float mx, float inv_t) {
    return static_cast<unsigned long long>(__expf((l - mx) * inv_t) * 4294967296.0f);
}
__device__ __forceinline__ uint32_t min_p_key(float mx, float temp, float min_p) {
    return float_key(mx + temp * logf(min_p));
}

__device__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : -FLT_MAX;
    return warp_max(v);
}

// Calls f(i, logit) for this thread's share of a row's tokens, the raw logits (mask not applied). Two 16-byte loads
// in flight a thread where the row is 16-byte aligned: one CTA reads the whole row per pass, and one load at a time
// a thread left each pass latency-bound (sample_bench: 119 µs for a plain temperature draw of 201k tokens).
// The order of the calls is not the tokens' order: callers combine by order-free operations only.
template <typename F>
__device__ __forceinline__ void for_each_logit(const RowView& row, int n, F f) {
    const int step = static_cast<int>(blockDim.x);
    int first_scalar = 0;
    if ((reinterpret_cast<uintptr_t>(row.row) & 15u) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row.row);
        const int n4 = n / 4;
        int j = threadIdx.x;
        for (; j + step < n4; j += 2 * step) {
            const float4 a = r4[j], b = r4[j + step];
            f(4 * j, a.x), f(4 * j + 1, a.y), f(4 * j + 2, a.z), f(4 * j + 3, a.w);
            const int k = 4 * (j + step);
            f(k, b.x), f(k + 1, b.y), f(k + 2, b.z), f(k + 3, b.w);
        }
        if (j < n4) {
            const float4 a = r4[j];
            f(4 * j, a.x), f(4 * j + 1, a.y), f(4 * j + 2, a.z), f(4 * j + 3, a.w);
        }
        first_scalar = 4 * n4;
    }
    for (int i = first_scalar + threadIdx.x; i < n; i += step) f(i, row.row[i]);
}

// Shared scratch of radix_threshold: kHistCopies histograms of 256 bins (a copy per group of warps, fewer
// same-address atomics), and the pass's result.
constexpr int kHistCopies = 4;
struct RadixScratch {
    unsigned long long hist[kHistCopies][256];
    uint32_t prefix;
    unsigned long long above;
};

// The largest key τ whose weight at or above it reaches `target`: W(key >= τ) >= target > W(key > τ), where a
// token weighs weight(l) (an integer: 1 to count, its probability in 2^-32 units to weigh; 0 for none) if its key
// is at least `floor`. Radix select on the 32-bit keys, 8 bits a pass (4 passes), with integer sums, so the result
// does not depend on the order of the atomics: a draw stays a function of (seed, draw index, logits).
// Every thread calls it.
template <typename Weight>
__device__ uint32_t radix_threshold(const RowView& row, int n, uint32_t floor, unsigned long long target, Weight weight,
                                    RadixScratch& sc) {
    uint32_t prefix = 0;
    unsigned long long above = 0;
    unsigned long long* hist = sc.hist[(threadIdx.x >> 5) % kHistCopies];
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        const uint32_t fixed = pass == 0 ? 0u : 0xffffffffu << (32 - 8 * pass);  // the bits decided so far
        for (int b = threadIdx.x; b < kHistCopies * 256; b += blockDim.x) (&sc.hist[0][0])[b] = 0;
        __syncthreads();
        // A thread sums a run of tokens in the same bin before its atomic: on a flat row nearly every token falls
        // in one bin, and same-address atomics serialize.
        uint32_t run_bin = 0;
        unsigned long long run = 0;
        for_each_logit(row, n, [&](int i, float raw) {
            const float l = row.allowed(i) ? raw : -INFINITY;
            const uint32_t key = float_key(l);
            if ((key & fixed) != prefix || key < floor) return;
            const unsigned long long w = weight(l);
            const uint32_t bin = (key >> shift) & 255u;
            if (bin != run_bin) {
                if (run != 0) atomicAdd(&hist[run_bin], run);
                run_bin = bin;
                run = 0;
            }
            run += w;
        });
        if (run != 0) atomicAdd(&hist[run_bin], run);
        __syncthreads();
        if (threadIdx.x == 0) {
            int d = 255;
            unsigned long long acc = above;
            for (; d > 0; --d) {
                unsigned long long m = 0;
                for (int c = 0; c < kHistCopies; ++c) m += sc.hist[c][d];
                if (acc + m >= target) break;
                acc += m;
            }
            sc.prefix = prefix | (static_cast<uint32_t>(d) << shift);
            sc.above = acc;
        }
        __syncthreads();
        prefix = sc.prefix;
        above = sc.above;
    }
    return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
    pdl_wait();  // the logits (and argmax_split_kernel's rows) come from the kernels just before
    pdl_trigger();
    __shared__ float scratch[32];
    __shared__ float best_val[32];
    __shared__ int best_idx[32];
    __shared__ RadixScratch radix;
    const int s = blockIdx.x;
    const int n = a.vocab_size;
    const RowView row(a, s);
    const float temp = a.temperature[s];
    const bool greedy = is_greedy(a, s);
    if (greedy && a.workspace != nullptr) return;  // argmax_split_kernel's row

    uint32_t min_key = 0;  // tokens with key < min_key are excluded
    float inv_t = 0.0f;
    uint64_t seed = 0;
    if (!greedy) {
        inv_t = 1.0f / temp;
        seed = draw_seed(a, s);
        if (a.top_k[s] > 0 && a.top_k[s] < n)  // the k-th largest key
            min_key = radix_threshold(
                row, n, 0u, static_cast<unsigned long long>(a.top_k[s]), [](float) { return 1ull; }, radix);
        const float top_p = a.top_p[s];
        const float min_p = a.min_p != nullptr ? a.min_p[s] : 0.0f;
        const float mx = top_p < 1.0f || min_p > 0.0f ? block_max(
                                                            [&] {
                                                                float m = -FLT_MAX;
                                                                for_each_logit(row, n, [&](int i, float raw) {
                                                                    if (row.allowed(i)) m = fmaxf(m, raw);
                                                                });
                                                                return m;
                                                            }(),
                                                            scratch)
                                                      : 0.0f;
        if (min_p > 0.0f) min_key = max(min_key, min_p_key(mx, temp, min_p));
        if (top_p < 1.0f) {
            // The smallest nucleus: the highest τ whose kept mass Σ_{key >= τ} p reaches top_p of all kept mass, p
            // relative to the most probable token in 2^-32 units (integer sums: deterministic).
            const auto weight = [&](float l) { return mass_weight(l, mx, inv_t); };
            unsigned long long z = 0;
            for_each_logit(row, n, [&](int i, float raw) {
                const float l = row.allowed(i) ? raw : -INFINITY;
                if (float_key(l) >= min_key) z += weight(l);
            });
            __shared__ unsigned long long zs[kThreads / 32];
            for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
            if ((threadIdx.x & 31) == 0) zs[threadIdx.x >> 5] = z;
            __syncthreads();
            z = 0;
            for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) z += zs[w];
            const auto target = static_cast<unsigned long long>(static_cast<double>(top_p) * static_cast<double>(z));
            if (target > 0) min_key = max(min_key, radix_threshold(row, n, min_key, target, weight, radix));
        }
    }
    // Argmax of logit (greedy) or of logit/T + Gumbel noise over the kept tokens; ties to the lower id.
    float bv = -FLT_MAX;
    int bi = n;
    bool finite = true;
    for_each_logit(row, n, [&](int i, float l) {
        finite = finite && isfinite(l);
        if (!row.allowed(i) || float_key(l) < min_key) return;
        float v = l;
        if (!greedy) v = gumbel_value(l, inv_t, seed, i);
        take_best(bv, bi, v, i);
    });
    const bool bad = block_argmax(bv, bi, finite, best_val, best_idx);
    // bi = n: every token masked (or, unmasked, every value -inf: then bad).
    if (threadIdx.x == 0) a.out[s] = bad ? -1 : bi < n ? bi : row.bits != nullptr ? -1 : 0;
}

// Greedy rows: CTA (s, y) takes the y-th slice of row s; the last CTA of a row to finish (a ticket
// per row, reset by that CTA so graph replays find it zero) combines the slices in order.
__global__ void __launch_bounds__(kSplitThreads) argmax_split_kernel(const SampleArgs a) {
    pdl_wait();  // every CTA, so that this grid's end implies the logits' producer's
    pdl_trigger();
    const int s = blockIdx.x;
    if (!is_greedy(a, s)) return;
    const int n = a.vocab_size;
    // Row s's record (kSplit values, kSplit indices, its ticket) sits at s · kRecordWords whatever
    // num_seqs is: a later call with fewer rows must find its tickets where they were reset.
    uint32_t* rec =
        reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(a.workspace) + static_cast<size_t>(s) * kRowBytes);
    float* part_val = reinterpret_cast<float*>(rec);
    int* part_idx = reinterpret_cast<int*>(rec + kSplit);
    unsigned* ticket = rec + 2 * kSplit;
    const RowView row(a, s);
    const int chunk = (n + kSplit - 1) / kSplit;
    const int lo = blockIdx.y * chunk, hi = min(n, lo + chunk);
    float bv = -FLT_MAX;
    int bi = n;
    bool finite = true;
    if (row.bits == nullptr) {
#pragma unroll 8
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) {
            const float v = row.row[i];
            finite = finite && isfinite(v);
            take_best(bv, bi, v, i);
        }
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) {
            const float v = row.row[i];
            finite = finite && isfinite(v);
            if (row.allowed(i)) take_best(bv, bi, v, i);
        }
    }
    __shared__ float wv[kSplitThreads / 32];
    __shared__ int wi[kSplitThreads / 32];
    __shared__ bool last;
    const bool bad = block_argmax(bv, bi, finite, wv, wi);
    if (threadIdx.x == 0) {
        part_val[blockIdx.y] = bv;
        part_idx[blockIdx.y] = bad ? -1 : bi;
        __threadfence();
        last = atomicAdd(ticket, 1u) == kSplit - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    bv = -FLT_MAX;
    bi = n;
    bool any_bad = false;
    for (int y = 0; y < kSplit; ++y) {
        const float v = *static_cast<volatile float*>(part_val + y);
        const int i = *static_cast<volatile int*>(part_idx + y);
        any_bad = any_bad || i < 0;
        if (i >= 0) take_best(bv, bi, v, i);
    }
    a.out[s] = any_bad ? -1 : bi < n ? bi : row.bits != nullptr ? -1 : 0;
    *ticket = 0;
}

// ---- The split draw (SampleArgs::split_draws): a non-greedy row by kSplit CTAs a launch, in a fixed sequence of
// launches (the largest logit; top-k's four radix passes; the nucleus's mass; top-p's four radix passes; the Gumbel
// arg-max), each CTA on one slice of the row, each launch's last CTA a row (a ticket) folding the slices' integer
// sums or winners into the row's SplitState. The thresholds are the one-CTA kernel's (the same integer sums), and so
// are the tokens. Greedy rows are argmax_split_kernel's.
enum SplitPhase { kPhaseMax, kPhaseTopK, kPhaseMass, kPhaseTopP, kPhaseFinal };

__device__ __forceinline__ SplitState& split_state(const SampleArgs& a, int s) {
    return *reinterpret_cast<SplitState*>(static_cast<uint8_t*>(a.workspace) + static_cast<size_t>(s) * kRowBytes +
                                          kRecordBytes);
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Whether this CTA is the last of its row to finish the launch (its writes before it visible to the last).
__device__ __forceinline__ bool last_of_row(SplitState& st) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&st.ticket, 1u) == kSplit - 1;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v) {
    __shared__ unsigned long long ws[kSplitThreads / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < kSplitThreads / 32; ++w) v += ws[w];
    return v;
}

template <SplitPhase kPhase>
__global__ void __launch_bounds__(kSplitThreads) split_draw_kernel(const SampleArgs a, int pass) {
    pdl_wait();
    pdl_trigger();
    const int s = blockIdx.x;
    if (is_greedy(a, s)) return;
    const int n = a.vocab_size;
    const RowView row(a, s);
    SplitState& st = split_state(a, s);
    const int chunk = (n + kSplit - 1) / kSplit;
    const int lo = blockIdx.y * chunk, hi = min(n, lo + chunk);
    const float temp = a.temperature[s], inv_t = 1.0f / temp;
    const int top_k = a.top_k[s];
    const float top_p = a.top_p[s], min_p = a.min_p != nullptr ? a.min_p[s] : 0.0f;
    const auto masked = [&](int i) { return row.allowed(i) ? row.row[i] : -INFINITY; };
    const float mx = key_float(st.mx_key);
    const auto mass = [&](float l) { return mass_weight(l, mx, inv_t); };
    // The floor the draw keeps: top-k's and the nucleus's (in st.min_key), min_p's from the largest logit.
    const auto floor_with_min_p = [&](uint32_t k) { return min_p > 0.0f ? max(k, min_p_key(mx, temp, min_p)) : k; };
    if constexpr (kPhase == kPhaseMax) {
        float m = -FLT_MAX;
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) m = fmaxf(m, masked(i));
        __shared__ float scratch[32];
        m = block_max(m, scratch);
        if (threadIdx.x == 0) atomicMax(&st.mx_key, float_key(m));
    } else if constexpr (kPhase == kPhaseTopK || kPhase == kPhaseTopP) {
        const bool topk = kPhase == kPhaseTopK;
        if (topk ? !(top_k > 0 && top_k < n) : !(top_p < 1.0f)) return;
        const unsigned long long target = topk ? static_cast<unsigned long long>(top_k) : st.target;
        if (target == 0) return;
        const uint32_t floor = topk ? 0u : st.min_key;
        const int shift = 24 - 8 * pass;
        const uint32_t fixed = pass == 0 ? 0u : 0xffffffffu << (32 - 8 * pass);
        const uint32_t prefix = st.prefix;
        __shared__ unsigned long long hist[256];
        for (int b = threadIdx.x; b < 256; b += kSplitThreads) hist[b] = 0;
        __syncthreads();
        uint32_t run_bin = 0;
        unsigned long long run = 0;
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) {
            const float l = masked(i);
            const uint32_t key = float_key(l);
            if ((key & fixed) != prefix || (!topk && key < floor)) continue;
            const uint32_t bin = (key >> shift) & 255u;
            if (bin != run_bin) {
                if (run != 0) atomicAdd(&hist[run_bin], run);
                run_bin = bin;
                run = 0;
            }
            run += topk ? 1ull : mass(l);
        }
        if (run != 0) atomicAdd(&hist[run_bin], run);
        __syncthreads();
        for (int b = threadIdx.x; b < 256; b += kSplitThreads)
            if (hist[b] != 0) atomicAdd(&st.hist[b], hist[b]);
        if (!last_of_row(st)) return;
        if (threadIdx.x == 0) {
            int d = 255;
            unsigned long long acc = st.above;
            for (; d > 0; --d) {
                const unsigned long long m = __ldcg(&st.hist[d]);
                if (acc + m >= target) break;
                acc += m;
            }
            const uint32_t next = prefix | (static_cast<uint32_t>(d) << shift);
            if (pass == 3) {  // the threshold: keep keys >= it
                st.min_key = max(st.min_key, next);
                st.prefix = 0;
                st.above = 0;
            } else {
                st.prefix = next;
                st.above = acc;
            }
            st.ticket = 0;
        }
        __syncthreads();  // thread 0 has read the histogram
        for (int b = threadIdx.x; b < 256; b += kSplitThreads) st.hist[b] = 0;
    } else if constexpr (kPhase == kPhaseMass) {
        if (!(top_p < 1.0f)) return;
        const uint32_t floor = floor_with_min_p(st.min_key);
        unsigned long long z = 0;
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) {
            const float l = masked(i);
            if (float_key(l) >= floor) z += mass(l);
        }
        z = block_sum_u64(z);
        if (threadIdx.x == 0) atomicAdd(&st.z, z);
        if (!last_of_row(st)) return;
        if (threadIdx.x == 0) {
            const unsigned long long total = __ldcg(&st.z);
            st.min_key = floor;
            st.target = static_cast<unsigned long long>(static_cast<double>(top_p) * static_cast<double>(total));
            st.z = 0;
            st.ticket = 0;
        }
    } else {  // kPhaseFinal: the Gumbel arg-max over the kept tokens of the slice, then of the slices
        const uint32_t floor = floor_with_min_p(st.min_key);
        const uint64_t seed = draw_seed(a, s);
        float bv = -FLT_MAX;
        int bi = n;
        bool finite = true;
        for (int i = lo + threadIdx.x; i < hi; i += kSplitThreads) {
            const float l = row.row[i];
            finite = finite && isfinite(l);
            if (!row.allowed(i) || float_key(l) < floor) continue;
            take_best(bv, bi, gumbel_value(l, inv_t, seed, i), i);
        }
        __shared__ float wv[kSplitThreads / 32];
        __shared__ int wi[kSplitThreads / 32];
        const bool bad = block_argmax(bv, bi, finite, wv, wi);
        if (threadIdx.x == 0) {
            st.part_val[blockIdx.y] = bv;
            st.part_idx[blockIdx.y] = bad ? -1 : bi;
        }
        if (!last_of_row(st)) return;
        if (threadIdx.x != 0) return;
        bv = -FLT_MAX;
        bi = n;
        bool any_bad = false;
        for (int y = 0; y < kSplit; ++y) {
            const float v = __ldcg(&st.part_val[y]);
            const int i = __ldcg(&st.part_idx[y]);
            any_bad = any_bad || i < 0;
            if (i >= 0) take_best(bv, bi, v, i);
        }
        a.out[s] = any_bad ? -1 : bi < n ? bi : row.bits != nullptr ? -1 : 0;
        st.mx_key = 0;
        st.min_key = 0;
        st.target = 0;
        st.ticket = 0;
    }
}

// One CTA a row; the three lists in order, each in parallel over its (unique) ids.
__global__ void __launch_bounds__(256) edit_logits_kernel(const LogitEditArgs a) {
    const int s = blockIdx.x;
    float* row = a.logits + static_cast<int64_t>(a.row_index != nullptr ? a.row_index[s] : s) * a.vocab_size;
    for (int j = a.add_offset[s] + threadIdx.x; j < a.add_offset[s + 1]; j += blockDim.x)
        row[a.add_id[j]] = __fadd_rn(row[a.add_id[j]], a.add_value[j]);
    __syncthreads();
    const float r = a.repetition[s];
    for (int j = a.repeat_offset[s] + threadIdx.x; j < a.repeat_offset[s + 1]; j += blockDim.x) {
        const float l = row[a.repeat_id[j]];
        row[a.repeat_id[j]] = l > 0.0f ? __fdiv_rn(l, r) : __fmul_rn(l, r);
    }
    __syncthreads();
    for (int j = a.subtract_offset[s] + threadIdx.x; j < a.subtract_offset[s + 1]; j += blockDim.x)
        row[a.subtract_id[j]] = __fsub_rn(row[a.subtract_id[j]], a.subtract_value[j]);
}

}  // namespace

size_t sample_workspace_bytes(int num_seqs) { return static_cast<size_t>(num_seqs) * kRowBytes; }

void edit_logits(const LogitEditArgs& a, cudaStream_t stream) {
    if (a.num_seqs == 0) return;
    edit_logits_kernel<<<a.num_seqs, 256, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

void sample(const SampleArgs& a, cudaStream_t stream) {
    if (a.num_seqs == 0) return;
    if (a.workspace != nullptr) {
        // Both launched with PDL (r39's trace: 5.8 + 1.4 µs a batch-1 step, each after a full launch gap).
        launch_pdl(argmax_split_kernel, dim3(a.num_seqs, kSplit), dim3(kSplitThreads), 0, stream, a);
        CUDA_CHECK_LAUNCH();
    }
    if (a.workspace != nullptr && a.split_draws) {
        const dim3 grid(a.num_seqs, kSplit), block(kSplitThreads);
        launch_pdl(split_draw_kernel<kPhaseMax>, grid, block, 0, stream, a, 0);
        for (int pass = 0; pass < 4; ++pass) launch_pdl(split_draw_kernel<kPhaseTopK>, grid, block, 0, stream, a, pass);
        launch_pdl(split_draw_kernel<kPhaseMass>, grid, block, 0, stream, a, 0);
        for (int pass = 0; pass < 4; ++pass) launch_pdl(split_draw_kernel<kPhaseTopP>, grid, block, 0, stream, a, pass);
        launch_pdl(split_draw_kernel<kPhaseFinal>, grid, block, 0, stream, a, 0);
        CUDA_CHECK_LAUNCH();
        return;
    }
    launch_pdl(sample_kernel, dim3(a.num_seqs), dim3(kThreads), 0, stream, a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
