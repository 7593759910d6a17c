// Non-owning views over host or device memory. Ownership lives with whoever allocated (a mmap'd
// file, a std::vector, a device arena); a view never frees.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace gptoss {

// Ranks up to 8: the model's tensors have at most 4 dimensions, a checkpoint's unread extras may have more.
constexpr int kMaxDims = 8;

struct Shape {
    int rank = 0;
    std::array<int64_t, kMaxDims> dims{};

    Shape() = default;
    Shape(std::initializer_list<int64_t> d) {
        ENGINE_CHECK(d.size() <= kMaxDims, "rank %zu > %d", d.size(), kMaxDims);
        for (int64_t v : d) dims[rank++] = v;
    }
    int64_t operator[](int i) const { return dims[i]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < rank; ++i) n *= dims[i];
        return n;
    }
    bool operator==(const Shape& o) const {
        if (rank != o.rank) return false;
        for (int i = 0; i < rank; ++i)
            if (dims[i] != o.dims[i]) return false;
        return true;
    }
    std::string to_string() const {
        std::string s = "[";
        for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
        return s + "]";
    }
};

// A contiguous, row-major tensor view.
struct TensorView {
    const void* data = nullptr;
    DType dtype = DType::kF32;
    Shape shape;

    int64_t numel() const { return shape.numel(); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
    template <typename T>
    const T* as() const {
        return static_cast<const T*>(data);
    }
};

}  // namespace gptoss
