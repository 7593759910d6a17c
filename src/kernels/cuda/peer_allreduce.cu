#include "kernels/cuda/peer_allreduce.h"

#include <string>

#include "kernels/cuda/cuda_check.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr long long kTimeoutCycles = 20'000'000'000LL;  // ~10 s at 2 GHz

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void __launch_bounds__(kThreads)
    peer_allreduce_kernel(float* data, int count, int rank, int size, float* const* staging, uint32_t* const* flags,
                          uint32_t* epoch_ctr, size_t phase_stride) {
    __shared__ uint32_t s_epoch;
    if (threadIdx.x == 0) s_epoch = *epoch_ctr + 1u;
    __syncthreads();
    const uint32_t epoch = s_epoch;
    const size_t phase = epoch & 1u;
    float* mine = staging[rank] + phase * phase_stride;
    for (int i = threadIdx.x; i < count; i += kThreads) mine[i] = data[i];
    __syncthreads();  // every thread's staging stores precede thread 0's release below
    if (threadIdx.x == 0) {
        __threadfence_system();
        for (int p = 0; p < size; ++p) store_release_sys(flags[p] + phase * size + rank, epoch);
        const uint32_t* own = flags[rank] + phase * size;
        const long long t0 = clock64();
        for (int p = 0; p < size; ++p) {
            while (load_acquire_sys(own + p) != epoch) {
                if (clock64() - t0 > kTimeoutCycles) __trap();  // a rank that never came: fail, don't hang
            }
        }
        __threadfence_system();
        *epoch_ctr = epoch;
    }
    __syncthreads();
    // Every rank sums in rank order: identical results everywhere. Peers' buffers are read with
    // volatile loads (no stale L1 lines from an earlier call with the same phase).
    for (int i = threadIdx.x; i < count; i += kThreads) {
        float s = 0.0f;
        for (int p = 0; p < size; ++p) {
            const volatile float* src = staging[p] + phase * phase_stride;
            s += src[i];
        }
        data[i] = s;
    }
}

}  // namespace

StatusOr<std::vector<std::unique_ptr<PeerAllReduce>>> PeerAllReduce::create_group(std::span<const int> devices,
                                                                                  size_t max_floats) {
    const int n = static_cast<int>(devices.size());
    if (n < 1 || max_floats == 0 || max_floats > (size_t{1} << 28))
        return invalid_argument("peer all-reduce: " + std::to_string(n) + " ranks, " + std::to_string(max_floats) +
                                " floats");
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
            if (i == j || devices[i] == devices[j]) continue;
            int can = 0;
            CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]));
            if (!can) {
                CUDA_CHECK(cudaSetDevice(prev));
                return unimplemented("peer all-reduce: device " + std::to_string(devices[i]) +
                                     " cannot access device " + std::to_string(devices[j]));
            }
            CUDA_CHECK(cudaSetDevice(devices[i]));
            const cudaError_t e = cudaDeviceEnablePeerAccess(devices[j], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError();  // enabled by an earlier group: fine
            else
                CUDA_CHECK(e);
        }
    }
    std::vector<std::unique_ptr<PeerAllReduce>> out;
    std::vector<float*> staging(n);
    std::vector<uint32_t*> flags(n);
    for (int i = 0; i < n; ++i) {
        CUDA_CHECK(cudaSetDevice(devices[i]));
        std::unique_ptr<PeerAllReduce> p(new PeerAllReduce());
        p->rank_ = i;
        p->size_ = n;
        p->device_ = devices[i];
        p->max_floats_ = max_floats;
        p->staging_ = DeviceBuffer(2 * max_floats * sizeof(float));
        p->flags_ = DeviceBuffer(2 * static_cast<size_t>(n) * sizeof(uint32_t));
        p->epoch_ = DeviceBuffer(sizeof(uint32_t));
        CUDA_CHECK(cudaMemset(p->flags_.get(), 0, p->flags_.bytes()));
        CUDA_CHECK(cudaMemset(p->epoch_.get(), 0, p->epoch_.bytes()));
        staging[i] = p->staging_.as<float>();
        flags[i] = p->flags_.as<uint32_t>();
        out.push_back(std::move(p));
    }
    for (int i = 0; i < n; ++i) {
        CUDA_CHECK(cudaSetDevice(devices[i]));
        out[i]->peer_staging_ = DeviceBuffer::from_host(staging.data(), n * sizeof(float*));
        out[i]->peer_flags_ = DeviceBuffer::from_host(flags.data(), n * sizeof(uint32_t*));
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    CUDA_CHECK(cudaSetDevice(prev));
    return StatusOr<std::vector<std::unique_ptr<PeerAllReduce>>>(std::move(out));
}

void PeerAllReduce::all_reduce_f32(float* data, size_t count, cudaStream_t stream) {
    ENGINE_CHECK(count <= max_floats_, "peer all-reduce: %zu floats > %zu", count, max_floats_);
    if (count == 0) return;
    peer_allreduce_kernel<<<1, kThreads, 0, stream>>>(
        data, static_cast<int>(count), rank_, size_, peer_staging_.as<float* const>(),
        peer_flags_.as<uint32_t* const>(), epoch_.as<uint32_t>(), max_floats_);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
