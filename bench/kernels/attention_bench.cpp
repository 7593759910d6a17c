// Times the CUDA paged attention kernels (one attention layer of gpt-oss: 64 query heads, 8 kv
// heads, head_dim 64, block_size 16) and prints `case | µs | GB/s | TFLOP/s | % of measured peak`.
//
// Counting (the fewest a kernel must do; STYLE.md rule 17, METHOD.md "two numbers"):
//   FLOPs  = 4 · 64 (head_dim) · 64 (heads) per visible (query, key) pair: q·k and p·v, 2 per MAC.
//   bytes  = every visible K and V row once (256 B per key per kv head), q and out once; the
//            split-KV workspace is extra traffic and is not counted.
// Peaks measured on the H200: 4150 GB/s (device-to-device copy), 760 TFLOP/s (bf16 GEMM).
//
// Method: each case's launches are captured in a CUDA graph (decode: the decode + combine kernels
// once per KV set, rotating over enough sets of distinct physical blocks to exceed the 60 MB L2
// several times; prefill: one launch), warmed up, and replayed; the median over replays of event
// time / launches is reported. Usage: attention_bench [substring filter]. GPTOSS_ATTN_FP8_KV=1: the
// caches hold e4m3 (PagedAttentionArgs::kv_fp8; random bytes, the values do not matter for time),
// and the byte counts halve; GPTOSS_ATTN_FP8_DIRECT=1 with it: the decode kernel reading the e4m3
// tile directly (PagedAttentionArgs::fp8_direct).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/args/paged_attention_args.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/ops.h"

namespace {

using gptoss::kernels::PagedAttentionArgs;
namespace cuda = gptoss::kernels::cuda;

constexpr int kHeads = 64, kKvHeads = 8, kHeadDim = 64, kBlockSize = 16, kWindow = 128;
constexpr double kPeakGBs = 4150.0, kPeakTflops = 760.0;
constexpr size_t kRowBytes = kKvHeads * kHeadDim * 2;   // one slot of K (or V): 1 KB
constexpr size_t kBlockBytes = kBlockSize * kRowBytes;  // 16 KB
constexpr size_t kRotationBytes = size_t{512} << 20;    // ≥ 8× L2 of K+V per rotation

struct DevBuf {
    void* p = nullptr;
    DevBuf() = default;
    explicit DevBuf(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

uint64_t g_rng = 0x243f6a8885a308d3ull;
uint64_t next_rand() {
    uint64_t x = (g_rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Random bf16 in (−2, 2) (never zeros: METHOD.md), written as bit patterns.
std::vector<uint16_t> random_bf16(size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) {
        const float f = static_cast<float>(static_cast<double>(next_rand() >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return v;
}

// Fills `bytes` of device memory with copies of a 64 MB random pattern (one upload, then
// device-to-device copies).
void fill_random(void* dst, size_t bytes) {
    static const std::vector<uint16_t> pattern = random_bf16(size_t{32} << 20);
    const size_t chunk = pattern.size() * 2;
    char* d = static_cast<char*>(dst);
    CHECK_CUDA(cudaMemcpy(d, pattern.data(), std::min(chunk, bytes), cudaMemcpyHostToDevice));
    for (size_t off = chunk; off < bytes; off += chunk)
        CHECK_CUDA(cudaMemcpy(d + off, d, std::min(chunk, bytes - off), cudaMemcpyDeviceToDevice));
}

struct Result {
    std::string name;
    double us, gbs, tflops;
};

// Median of `reps` replays of `graph` (holding `launches` launches), in µs per launch.
double time_graph(cudaGraphExec_t exec, cudaStream_t stream, int launches, int reps) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        CHECK_CUDA(cudaEventRecord(a, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(b, stream));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(1e3 * ms / launches);
    }
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Common {
    DevBuf sinks{kHeads * 4};
    DevBuf workspace;
    int max_splits = 132;
    bool fp8_kv = false;         // GPTOSS_ATTN_FP8_KV=1
    bool fp8_direct = false;     // GPTOSS_ATTN_FP8_DIRECT=1 (PagedAttentionArgs::fp8_direct)
    bool prefill_wgmma = false;  // GPTOSS_ATTN_PREFILL_WGMMA=0: off (PagedAttentionArgs::prefill_wgmma)
    bool prefill_tma = false;    // GPTOSS_ATTN_PREFILL_TMA=0: off (PagedAttentionArgs::prefill_tma)
    bool prefill_pipe = false;   // GPTOSS_ATTN_PREFILL_PIPE=0: off (PagedAttentionArgs::prefill_pipe)
    // PagedAttentionArgs::prefill_pingpong: the model's rule (full layers of >= 2,048 queries)
    // unless GPTOSS_ATTN_PINGPONG=0 (never) or =1 (always).
    int pingpong = -1;
    // Prefill q from raw QKV rows, rotated as each query tile loads (PagedAttentionArgs::q_raw), as
    // the model's default; GPTOSS_ATTN_QROPE=0: the rotated q.
    bool q_raw = true;
    // With q_raw: the query tiles copy their (cos, sin) from a table made once (rope_cos_sin_table,
    // PagedAttentionArgs::q_rope_cs), as the model's prompt path; GPTOSS_ROPE_TABLE=0: computed.
    bool rope_table = true;
    // Prefill rows quantized for the O projection in the epilogue (PagedAttentionArgs::out_q, the FP8
    // model's default) with GPTOSS_ATTN_OUT_Q=1; bf16 rows otherwise.
    bool out_q = false;
    // PagedAttentionArgs::prefill_zero_all_rows with GPTOSS_ATTN_ZERO_ALL=1 (the kernel before r46).
    bool zero_all = false;
    Common(int max_seqs) : workspace(static_cast<size_t>(max_seqs) * kHeads * 132 * (kHeadDim + 2) * 4) {
        std::vector<float> s(kHeads);
        for (int h = 0; h < kHeads; ++h) s[h] = static_cast<float>(h % 7) * 0.5f - 1.5f;
        CHECK_CUDA(cudaMemcpy(sinks.p, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
        const char* f = std::getenv("GPTOSS_ATTN_FP8_KV");
        fp8_kv = f != nullptr && std::string(f) == "1";
        const char* fd = std::getenv("GPTOSS_ATTN_FP8_DIRECT");
        fp8_direct = fd != nullptr && std::string(fd) == "1";
        const char* pw = std::getenv("GPTOSS_ATTN_PREFILL_WGMMA");
        prefill_wgmma = pw == nullptr || std::string(pw) != "0";  // the model's default
        const char* pt = std::getenv("GPTOSS_ATTN_PREFILL_TMA");
        prefill_tma = pt == nullptr || std::string(pt) != "0";  // the model's default
        const char* pp = std::getenv("GPTOSS_ATTN_PREFILL_PIPE");
        prefill_pipe = pp == nullptr || std::string(pp) != "0";  // the model's default
        const char* ppg = std::getenv("GPTOSS_ATTN_PINGPONG");
        pingpong = ppg == nullptr ? -1 : std::string(ppg) != "0";
        const char* qr = std::getenv("GPTOSS_ATTN_QROPE");
        q_raw = qr == nullptr || std::string(qr) != "0";
        const char* rt = std::getenv("GPTOSS_ROPE_TABLE");
        rope_table = rt == nullptr || std::string(rt) != "0";
        const char* oq = std::getenv("GPTOSS_ATTN_OUT_Q");
        out_q = oq != nullptr && std::string(oq) == "1";
        const char* za = std::getenv("GPTOSS_ATTN_ZERO_ALL");
        zero_all = za != nullptr && std::string(za) == "1";
    }
    double kv_elem_bytes() const { return fp8_kv ? 1.0 : 2.0; }
};

PagedAttentionArgs base_args(const Common& c) {
    PagedAttentionArgs a;
    a.sinks = c.sinks.as<float>();
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.head_dim = kHeadDim;
    a.block_size = kBlockSize;
    a.scale = 0.125f;
    a.workspace = c.workspace.as<float>();
    a.max_splits = c.max_splits;
    a.kv_fp8 = c.fp8_kv;
    a.fp8_direct = c.fp8_direct;
    a.prefill_wgmma = c.prefill_wgmma;
    a.prefill_tma = c.prefill_tma;
    a.prefill_pipe = c.prefill_pipe;
    a.prefill_pingpong = c.pingpong == 1;
    a.prefill_zero_all_rows = c.zero_all;
    return a;
}

Result bench_decode(Common& common, int batch, int ctx, int window, cudaStream_t stream) {
    const int blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
    const size_t set_bytes = static_cast<size_t>(batch) * blocks_per_seq * kBlockBytes * 2;  // K + V
    const int sets = static_cast<int>(std::clamp<size_t>(kRotationBytes / set_bytes, 1, 128));
    const size_t pool_blocks = static_cast<size_t>(sets) * batch * blocks_per_seq;
    DevBuf k(pool_blocks * kBlockBytes), v(pool_blocks * kBlockBytes);
    fill_random(k.p, pool_blocks * kBlockBytes);
    fill_random(v.p, pool_blocks * kBlockBytes);
    // Each set: its own shuffled physical blocks.
    std::vector<int32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[next_rand() % (i + 1)]);
    DevBuf tables(pool_blocks * 4);
    CHECK_CUDA(cudaMemcpy(tables.p, perm.data(), pool_blocks * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> start(batch, ctx - 1), qstart(batch + 1);
    std::iota(qstart.begin(), qstart.end(), 0);
    DevBuf d_start(batch * 4), d_qstart((batch + 1) * 4);
    CHECK_CUDA(cudaMemcpy(d_start.p, start.data(), batch * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_qstart.p, qstart.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    const size_t q_elems = static_cast<size_t>(batch) * kHeads * kHeadDim;
    DevBuf q(q_elems * 2), out(q_elems * 2);
    fill_random(q.p, q_elems * 2);

    PagedAttentionArgs a = base_args(common);
    a.q = q.p;
    a.out = out.p;
    a.k_cache = k.p;
    a.v_cache = v.p;
    a.seq_start_pos = d_start.as<int32_t>();
    a.query_start = d_qstart.as<int32_t>();
    a.max_blocks_per_seq = blocks_per_seq;
    a.num_seqs = batch;
    a.num_tokens = batch;
    a.max_query_len = 1;
    a.max_context_len = ctx;
    a.sliding_window = window;
    const int splits = cuda::paged_attention_decode_split_count(a);  // what paged_attention_decode launches

    a.block_tables = tables.as<int32_t>();
    cuda::paged_attention_decode(a, stream);  // warm-up outside capture
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const int launches = std::max(sets, 8);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) {
        a.block_tables = tables.as<int32_t>() + static_cast<size_t>(i % sets) * batch * blocks_per_seq;
        cuda::paged_attention_decode(a, stream);
    }
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const double us = time_graph(exec, stream, launches, 20);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));

    const double keys = window > 0 ? std::min(ctx, window) : ctx;
    const double bytes = batch * keys * kKvHeads * kHeadDim * common.kv_elem_bytes() * 2 + 2.0 * q_elems * 2;
    const double flops = 4.0 * kHeadDim * kHeads * batch * keys;
    char name[96];
    std::snprintf(name, sizeof name, "decode B=%-3d ctx=%-5d %s (splits %d, %d sets)%s", batch, ctx,
                  window > 0 ? "sliding" : "full   ", splits, sets,
                  common.fp8_kv ? (common.fp8_direct ? " fp8 direct" : " fp8") : "");
    return {name, us, bytes / us * 1e-3, flops / us * 1e-6};
}

Result bench_prefill(Common& common, int tokens, int window, cudaStream_t stream) {
    const int blocks = (tokens + kBlockSize - 1) / kBlockSize;
    DevBuf k(static_cast<size_t>(blocks) * kBlockBytes), v(static_cast<size_t>(blocks) * kBlockBytes);
    fill_random(k.p, static_cast<size_t>(blocks) * kBlockBytes);
    fill_random(v.p, static_cast<size_t>(blocks) * kBlockBytes);
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = blocks - 1; i > 0; --i) std::swap(perm[i], perm[next_rand() % (i + 1)]);
    DevBuf tables(blocks * 4);
    CHECK_CUDA(cudaMemcpy(tables.p, perm.data(), blocks * 4, cudaMemcpyHostToDevice));
    const int32_t zero = 0, qs[2] = {0, tokens};
    DevBuf d_start(4), d_qstart(8);
    CHECK_CUDA(cudaMemcpy(d_start.p, &zero, 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_qstart.p, qs, 8, cudaMemcpyHostToDevice));
    const size_t q_elems = static_cast<size_t>(tokens) * kHeads * kHeadDim;
    DevBuf q(q_elems * 2), out(q_elems * 2);
    fill_random(q.p, q_elems * 2);

    PagedAttentionArgs a = base_args(common);
    a.q = q.p;
    a.out = out.p;
    a.k_cache = k.p;
    a.v_cache = v.p;
    a.block_tables = tables.as<int32_t>();
    a.seq_start_pos = d_start.as<int32_t>();
    a.query_start = d_qstart.as<int32_t>();
    a.max_blocks_per_seq = blocks;
    a.num_seqs = 1;
    a.num_tokens = tokens;
    a.max_query_len = tokens;
    a.max_context_len = tokens;
    a.sliding_window = window;
    if (common.pingpong < 0) a.prefill_pingpong = window == 0 && tokens >= 2048;  // the model's rule
    // q_raw: [T, (64 + 2·8)·64] bf16 rows (the q part random), zero bias, positions 0.., gpt-oss-like
    // frequencies; the same bytes read as from q, plus the rotation.
    constexpr int kQkvWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
    DevBuf raw(common.q_raw ? static_cast<size_t>(tokens) * kQkvWidth * 2 : 16), bias(kQkvWidth * 4),
        pos(static_cast<size_t>(tokens) * 4), freq(kHeadDim / 2 * 4),
        cs(common.q_raw && common.rope_table ? static_cast<size_t>(tokens) * kHeadDim * 4 : 16);
    if (common.q_raw) {
        fill_random(raw.p, static_cast<size_t>(tokens) * kQkvWidth * 2);
        CHECK_CUDA(cudaMemset(bias.p, 0, kQkvWidth * 4));
        std::vector<int32_t> p(tokens);
        std::iota(p.begin(), p.end(), 0);
        std::vector<float> f(kHeadDim / 2);
        for (int i = 0; i < kHeadDim / 2; ++i) f[i] = static_cast<float>(std::pow(150000.0, -2.0 * i / kHeadDim));
        CHECK_CUDA(cudaMemcpy(pos.p, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(freq.p, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
        a.q = nullptr;
        a.q_raw = raw.p;
        a.q_raw_stride = kQkvWidth;
        a.q_bias = bias.as<float>();
        a.q_positions = pos.as<int32_t>();
        a.rope_inv_freq = freq.as<float>();
        a.rope_scaling = 1.3f;
        if (common.rope_table) {
            cuda::rope_cos_sin_table(pos.as<int32_t>(), tokens, freq.as<float>(), kHeadDim / 2, a.rope_scaling,
                                     cs.as<float>(), stream);
            a.q_rope_cs = cs.as<float>();
        }
    }
    const int m_pad = (tokens + 3) / 4 * 4;  // fp8_gemm_m_pad
    DevBuf xq(common.out_q ? static_cast<size_t>(m_pad) * kHeads * kHeadDim : 16),
        xs(common.out_q ? static_cast<size_t>(kHeads * kHeadDim / 128) * m_pad * 4 : 16);
    if (common.out_q) {
        a.out_q = xq.as<uint8_t>();
        a.out_q_scale = xs.as<float>();
        a.out_q_m_pad = m_pad;
    }
    cuda::paged_attention_prefill(a, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::paged_attention_prefill(a, stream);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const double us = time_graph(exec, stream, 1, tokens >= 32768 ? 7 : 15);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));

    double pairs = 0;  // visible (query, key) pairs
    for (int64_t i = 0; i < tokens; ++i) pairs += window > 0 ? std::min<int64_t>(i + 1, window) : i + 1;
    const double flops = 4.0 * kHeadDim * kHeads * pairs;
    const double bytes = 2.0 * q_elems * 2 + static_cast<double>(tokens) * kRowBytes / 2 * common.kv_elem_bytes() * 2;
    char name[96];
    std::snprintf(name, sizeof name, "prefill T=%-5d %s", tokens, window > 0 ? "sliding" : "full   ");
    return {name, us, bytes / us * 1e-3, flops / us * 1e-6};
}

void print(const Result& r) {
    const double bw = r.gbs / kPeakGBs, fl = r.tflops / kPeakTflops;
    std::printf("%-52s | %10.1f | %8.0f | %8.1f | %5.1f%% %s\n", r.name.c_str(), r.us, r.gbs, r.tflops,
                100.0 * std::max(bw, fl), bw >= fl ? "bw" : "flop");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string filter = argc > 1 ? argv[1] : "";
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        std::printf("attention_bench: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MB; peaks used: %.0f GB/s, %.0f TFLOP/s\n", prop.name,
                prop.multiProcessorCount, prop.l2CacheSize >> 20, kPeakGBs, kPeakTflops);
    std::printf("%-52s | %10s | %8s | %8s | %s\n", "case", "us", "GB/s", "TFLOP/s", "% of measured peak");
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Common common(128);
    for (int batch : {1, 2, 4, 8, 16, 32, 64, 128}) {
        for (int ctx : {1024, 8192, 32768}) {
            const std::string tag = "decode B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx);
            if (tag.find(filter) == std::string::npos && !filter.empty()) continue;
            print(bench_decode(common, batch, ctx, 0, stream));
        }
    }
    if (filter.empty() || std::string("decode sliding").find(filter) != std::string::npos)
        print(bench_decode(common, 128, 32768, kWindow, stream));
    for (int tokens : {1024, 8192, 32768}) {
        for (int window : {0, kWindow}) {
            const std::string tag = "prefill T=" + std::to_string(tokens);
            if (tag.find(filter) == std::string::npos && !filter.empty()) continue;
            print(bench_prefill(common, tokens, window, stream));
        }
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
}
