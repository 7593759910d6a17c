// The n-gram drafter's lookup (runtime/speculative.h propose_ngram_drafts), one core: a decode step
// pays it for every sequence that may draft. Random contexts of 8k-128k tokens over the o200k
// vocabulary, no earlier occurrence of the last token (the whole context is scanned: the worst
// case), and a context whose last 4 tokens occur near its start (the match is found last).
//   ngram_bench [--benchmark_filter=NoMatch]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/speculative.h"

namespace {

std::vector<int32_t> random_context(int n) {
    std::mt19937 rng(1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % 200000u);
    return t;
}

void NoMatch(benchmark::State& state) {
    std::vector<int32_t> t = random_context(static_cast<int>(state.range(0)));
    t.back() = 200500;  // outside the context's ids: never seen before
    std::vector<int32_t> drafts;
    for (auto _ : state) {
        drafts.clear();
        benchmark::DoNotOptimize(gptoss::runtime::propose_ngram_drafts(t, 4, 2, 4, &drafts));
    }
    state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(NoMatch)->Arg(8192)->Arg(32768)->Arg(131072);

void MatchAtTheStart(benchmark::State& state) {
    std::vector<int32_t> t = random_context(static_cast<int>(state.range(0)));
    const int32_t g[4] = {200501, 200502, 200503, 200504};
    for (int k = 0; k < 4; ++k) t[10 + k] = g[k];
    t.insert(t.end(), g, g + 4);
    std::vector<int32_t> drafts;
    for (auto _ : state) {
        drafts.clear();
        benchmark::DoNotOptimize(gptoss::runtime::propose_ngram_drafts(t, 4, 2, 4, &drafts));
    }
    state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(MatchAtTheStart)->Arg(131072);

}  // namespace

BENCHMARK_MAIN();
