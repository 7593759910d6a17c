// An allocator for large byte buffers that are written once, soon after they are allocated (the KV transfers of
// disaggregated prefill: ~200 MB for 8k tokens of gpt-oss-20b). From 2 MiB up it maps the memory itself, 2 MiB
// aligned, and asks for transparent huge pages (madvise MADV_HUGEPAGE, which works where the system's THP mode is
// "madvise" or "always"), so the first write faults one 2 MiB page at a time instead of 512 pages of 4 KiB: on the
// development VM a copy into a fresh 206 MB buffer took 650-690 ms with 4 KiB pages and 33-49 ms with huge pages
// (bench/NOTES.md r67). Below 2 MiB, and where the kernel gives no huge pages, it is ordinary memory.
#pragma once

#include <cstddef>
#include <new>

namespace gptoss {

namespace large_buffer {
constexpr size_t kHugePage = size_t{2} << 20;
// Memory of at least `bytes` (bytes ≥ kHugePage): 2 MiB aligned, huge pages asked for. Throws std::bad_alloc.
void* map(size_t bytes);
void unmap(void* p, size_t bytes);
}  // namespace large_buffer

template <typename T>
struct LargeBufferAllocator {
    using value_type = T;
    LargeBufferAllocator() noexcept = default;
    template <typename U>
    LargeBufferAllocator(const LargeBufferAllocator<U>&) noexcept {}

    T* allocate(size_t n) {
        if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
        const size_t bytes = n * sizeof(T);
        if (bytes < large_buffer::kHugePage) return static_cast<T*>(::operator new(bytes));
        return static_cast<T*>(large_buffer::map(bytes));
    }
    void deallocate(T* p, size_t n) noexcept {
        const size_t bytes = n * sizeof(T);
        if (bytes < large_buffer::kHugePage)
            ::operator delete(p);
        else
            large_buffer::unmap(p, bytes);
    }
    template <typename U>
    bool operator==(const LargeBufferAllocator<U>&) const noexcept {
        return true;
    }
};

}  // namespace gptoss
