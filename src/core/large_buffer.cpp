#include "core/large_buffer.h"

#include <sys/mman.h>

#include <cstdint>

namespace gptoss::large_buffer {
namespace {

size_t round_up(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

}  // namespace

void* map(size_t bytes) {
    const size_t size = round_up(bytes);
    if (size < bytes) throw std::bad_alloc();
    // One huge page more than needed, then the unaligned head and the tail given back: a 2 MiB aligned range.
    const size_t span = size + kHugePage;
    if (span < size) throw std::bad_alloc();
    void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) ::munmap(raw, aligned - start);
    const size_t tail = start + span - (aligned + size);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
    void* p = reinterpret_cast<void*>(aligned);
    (void)::madvise(p, size, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB, nothing else changes
    return p;
}

void unmap(void* p, size_t bytes) { ::munmap(p, round_up(bytes)); }

}  // namespace gptoss::large_buffer
