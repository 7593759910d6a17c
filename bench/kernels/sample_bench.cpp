// kc::sample on one to eight rows of o200k's size, timed with CUDA events (the mean of 200 calls after 20 of warm-up):
// greedy (the split arg-max), temperature alone, top-k, top-p, min-p, on N(0, 2) rows and on flat rows
// (6 + 0.01 · N(0, 2): what a random checkpoint's logits look like).
//   sample_bench [rows]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/sampling.h"

namespace kc = gptoss::kernels::cuda;

int main(int argc, char** argv) {
    const int S = argc > 1 ? std::atoi(argv[1]) : 1, V = 201088;
    if (S < 1 || S > 256) {
        std::fprintf(stderr, "rows must be in [1, 256]\n");
        return 1;
    }
    std::vector<float> peaked(static_cast<size_t>(S) * V), flat(peaked.size());
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (size_t i = 0; i < peaked.size(); ++i) {
        peaked[i] = nd(rng);
        flat[i] = 6.0f + 0.01f * peaked[i];
    }
    float *d_peaked, *d_flat, *d_temp, *d_top_p, *d_min_p;
    int32_t *d_top_k, *d_out;
    uint64_t *d_seed, *d_draw;
    void* d_work;
    CHECK_CUDA(cudaMalloc(&d_peaked, peaked.size() * 4));
    CHECK_CUDA(cudaMalloc(&d_flat, flat.size() * 4));
    CHECK_CUDA(cudaMemcpy(d_peaked, peaked.data(), peaked.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_flat, flat.data(), flat.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&d_temp, S * 4));
    CHECK_CUDA(cudaMalloc(&d_top_p, S * 4));
    CHECK_CUDA(cudaMalloc(&d_min_p, S * 4));
    CHECK_CUDA(cudaMalloc(&d_top_k, S * 4));
    CHECK_CUDA(cudaMalloc(&d_out, S * 4));
    CHECK_CUDA(cudaMalloc(&d_seed, S * 8));
    CHECK_CUDA(cudaMalloc(&d_draw, S * 8));
    CHECK_CUDA(cudaMalloc(&d_work, kc::sample_workspace_bytes(S)));
    CHECK_CUDA(cudaMemset(d_work, 0, kc::sample_workspace_bytes(S)));
    CHECK_CUDA(cudaMemset(d_seed, 0, S * 8));
    CHECK_CUDA(cudaMemset(d_draw, 0, S * 8));
    struct Case {
        const char* name;
        float temp, top_p, min_p;
        int top_k;
    };
    const Case cases[] = {{"greedy", 0.0f, 1.0f, 0.0f, 0},          {"T 1", 1.0f, 1.0f, 0.0f, 0},
                          {"T 0.7 top_k 50", 0.7f, 1.0f, 0.0f, 50}, {"T 0.7 top_p 0.9", 0.7f, 0.9f, 0.0f, 0},
                          {"T 1 min_p 0.05", 1.0f, 1.0f, 0.05f, 0}, {"T 0.7 top_p 0.9 top_k 50", 0.7f, 0.9f, 0.0f, 50}};
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::printf("rows %d, vocab %d: us a call (one CTA a sampled row / split_draws)\n%-26s %21s %21s\n", S, V, "case",
                "peaked", "flat");
    for (const Case& c : cases) {
        const std::vector<float> t(S, c.temp), p(S, c.top_p), m(S, c.min_p);
        const std::vector<int32_t> k(S, c.top_k);
        CHECK_CUDA(cudaMemcpy(d_temp, t.data(), S * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_top_p, p.data(), S * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_min_p, m.data(), S * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_top_k, k.data(), S * 4, cudaMemcpyHostToDevice));
        float us[4];
        for (int f = 0; f < 4; ++f) {
            kc::SampleArgs a;
            a.logits = f / 2 ? d_flat : d_peaked;
            a.split_draws = f % 2 == 1;
            a.temperature = d_temp;
            a.top_p = d_top_p;
            a.top_k = d_top_k;
            a.min_p = d_min_p;
            a.seed = d_seed;
            a.draw_index = d_draw;
            a.out = d_out;
            a.num_seqs = S;
            a.vocab_size = V;
            a.workspace = d_work;
            for (int i = 0; i < 20; ++i) kc::sample(a, nullptr);
            CHECK_CUDA(cudaEventRecord(e0));
            for (int i = 0; i < 200; ++i) kc::sample(a, nullptr);
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            us[f] = 1000.0f * ms / 200;
        }
        std::printf("%-26s %10.1f %10.1f %10.1f %10.1f\n", c.name, us[0], us[1], us[2], us[3]);
    }
    return 0;
}
