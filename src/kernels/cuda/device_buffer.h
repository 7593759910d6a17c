// RAII device allocation. Allocations happen at load/start-up only (STYLE.md §6), never in forward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace gptoss::kernels::cuda {

class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes_) CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
    }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFree(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    template <typename T = void>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    void* get() const { return ptr_; }
    size_t bytes() const { return bytes_; }

    // Uploads host bytes (synchronous; load time only).
    static DeviceBuffer from_host(const void* src, size_t bytes) {
        DeviceBuffer b(bytes);
        if (bytes) CUDA_CHECK(cudaMemcpy(b.ptr_, src, bytes, cudaMemcpyHostToDevice));
        return b;
    }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace gptoss::kernels::cuda
