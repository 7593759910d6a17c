// What a phase boundary costs on the GPU, the number that decides whether the decode step should
// become one persistent kernel (NOTES r37, Next 1). r36's trace put every decode kernel at >= 4 µs
// on the critical path however little it does; a layer has 7 of them.
//
// Three ways to run N dependent phases over a grid of G CTAs, each phase a token amount of work
// (every CTA reads the previous phase's value and CTA 0 writes the next one):
//   graph_pdl   N kernel launches in a CUDA graph with programmatic dependent launch (the engine's
//               decode graphs): each kernel pdl_wait()s, then pdl_trigger()s.
//   graph       the same launches without PDL.
//   persistent  one kernel, the phases separated by a grid barrier (one global counter and a
//               generation word: every CTA's thread 0 fences, takes the counter, and spins on the
//               generation until the last arrival bumps it). G must be co-resident: checked with
//               the occupancy API.
// Each mode checks its chain: the final value must be N, and in the persistent mode every phase
// must see all G CTAs' increments of the phase before (else the barrier is broken).
//
// Usage: boundary_bench [phases=256]. Prints µs per boundary for G in {66, 132, 264} and 128 / 384
// threads a CTA.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"

namespace {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One phase of a launched chain: every CTA reads chain[i] (the previous phase's value), CTA 0
// writes chain[i + 1] = chain[i] + 1. The reads keep each CTA dependent on the kernel before.
__global__ void phase_kernel(unsigned* chain, int i, unsigned* sink, bool pdl) {
    if (pdl) {
        pdl_wait();
        pdl_trigger();
    }
    const unsigned v = *(volatile unsigned*)(chain + i);
    if (blockIdx.x == 0 && threadIdx.x == 0) chain[i + 1] = v + 1;
    if (v == 0xffffffffu) sink[threadIdx.x] = v;  // never: keeps the load
}

// Grid barrier: count / gen in global memory, count zero and gen anything at the start.
__device__ void grid_barrier(unsigned* count, unsigned* gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = ld_acquire(gen);
        __threadfence();  // this CTA's writes before the arrival
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            *count = 0;
            st_release(gen, g + 1);
        } else {
            while (ld_acquire(gen) == g) {
            }
        }
    }
    __syncthreads();
}

// N phases in one kernel. Phase i: every CTA adds 1 to slot[i] and reads chain[i]; CTA 0 writes
// chain[i + 1]. After the barrier, CTA 0 checks slot[i] == G (counting errors).
__global__ void persistent_kernel(unsigned* chain, unsigned* slot, int phases, unsigned* count, unsigned* gen,
                                  unsigned* errors) {
    for (int i = 0; i < phases; ++i) {
        const unsigned v = *(volatile unsigned*)(chain + i);
        if (threadIdx.x == 0) atomicAdd(slot + i, 1u);
        if (blockIdx.x == 0 && threadIdx.x == 0) chain[i + 1] = v + 1;
        grid_barrier(count, gen);
        if (blockIdx.x == 0 && threadIdx.x == 0 && *(volatile unsigned*)(slot + i) != gridDim.x) atomicAdd(errors, 1u);
    }
}

struct Bufs {
    unsigned *chain = nullptr, *slot = nullptr, *count = nullptr, *gen = nullptr, *errors = nullptr, *sink = nullptr;
};

float time_graph(const Bufs& b, int grid, int threads, int phases, bool pdl, bool* ok) {
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < phases; ++i) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(threads);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CHECK_CUDA(cudaLaunchKernelEx(&cfg, phase_kernel, b.chain, i, b.sink, pdl));
    }
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    *ok = true;
    for (int rep = 0; rep < 6; ++rep) {  // the first a warm-up
        CHECK_CUDA(cudaMemsetAsync(b.chain, 0, (phases + 1) * sizeof(unsigned), s));
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_CUDA(cudaGraphLaunch(exec, s));
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < best) best = ms;
        unsigned last = 0;
        CHECK_CUDA(cudaMemcpy(&last, b.chain + phases, sizeof(unsigned), cudaMemcpyDeviceToHost));
        *ok = *ok && last == static_cast<unsigned>(phases);
    }
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaStreamDestroy(s));
    return best * 1000.0f / phases;
}

float time_persistent(const Bufs& b, int grid, int threads, int phases, bool* ok) {
    int per_sm = 0, sms = 0, dev = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, threads, 0));
    if (grid > per_sm * sms) {
        *ok = false;
        return -1.0f;
    }
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    *ok = true;
    for (int rep = 0; rep < 6; ++rep) {
        CHECK_CUDA(cudaMemset(b.chain, 0, (phases + 1) * sizeof(unsigned)));
        CHECK_CUDA(cudaMemset(b.slot, 0, phases * sizeof(unsigned)));
        CHECK_CUDA(cudaMemset(b.count, 0, sizeof(unsigned)));
        CHECK_CUDA(cudaMemset(b.errors, 0, sizeof(unsigned)));
        CHECK_CUDA(cudaEventRecord(e0));
        persistent_kernel<<<grid, threads>>>(b.chain, b.slot, phases, b.count, b.gen, b.errors);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaDeviceSynchronize());
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < best) best = ms;
        unsigned last = 0, errors = 0;
        CHECK_CUDA(cudaMemcpy(&last, b.chain + phases, sizeof(unsigned), cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(&errors, b.errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
        *ok = *ok && last == static_cast<unsigned>(phases) && errors == 0;
    }
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return best * 1000.0f / phases;
}

}  // namespace

int main(int argc, char** argv) {
    const int phases = argc > 1 ? std::atoi(argv[1]) : 256;
    if (phases < 1 || phases > 1 << 20) {
        std::fprintf(stderr, "usage: boundary_bench [phases 1..1048576]\n");
        return 2;
    }
    Bufs b;
    CHECK_CUDA(cudaMalloc(&b.chain, (phases + 1) * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&b.slot, phases * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&b.count, sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&b.gen, sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&b.errors, sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&b.sink, 1024 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(b.gen, 0, sizeof(unsigned)));
    std::printf("phases %d; µs per boundary (best of 5 timed runs)\n", phases);
    std::printf("| grid | threads | graph | graph_pdl | persistent |\n|---:|---:|---:|---:|---:|\n");
    bool all_ok = true;
    for (int threads : {128, 384})
        for (int grid : {66, 132, 264}) {
            bool ok1 = false, ok2 = false, ok3 = false;
            const float g = time_graph(b, grid, threads, phases, false, &ok1);
            const float p = time_graph(b, grid, threads, phases, true, &ok2);
            const float q = time_persistent(b, grid, threads, phases, &ok3);
            std::printf("| %d | %d | %.2f%s | %.2f%s | %.2f%s |\n", grid, threads, g, ok1 ? "" : " (FAILED)", p,
                        ok2 ? "" : " (FAILED)", q, ok3 ? "" : (q < 0 ? " (not co-resident)" : " (FAILED)"));
            all_ok = all_ok && ok1 && ok2 && (ok3 || q < 0);
        }
    std::printf(all_ok ? "all chains checked\n" : "CHAIN CHECK FAILED\n");
    return all_ok ? 0 : 1;
}
