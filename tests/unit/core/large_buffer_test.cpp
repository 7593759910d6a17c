#include "core/large_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace gptoss {
namespace {

// Small and large vectors hold and copy what is written; large ones are 2 MiB aligned (where huge pages can back
// them); growing across the threshold keeps the contents.
TEST(LargeBuffer, VectorsOfAnySizeHoldTheirBytes) {
    using Bytes = std::vector<uint8_t, LargeBufferAllocator<uint8_t>>;
    for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, large_buffer::kHugePage - 1, large_buffer::kHugePage,
                     large_buffer::kHugePage * 3 + 17}) {
        Bytes v(n);
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(v[i], 0) << n;  // value-initialized
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + 7);
        if (n >= large_buffer::kHugePage) {
            EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % large_buffer::kHugePage, 0u) << n;
        }
        Bytes copy = v;
        ASSERT_EQ(copy.size(), n);
        for (size_t i = 0; i < n; ++i) {
            if (copy[i] != static_cast<uint8_t>(i * 31 + 7)) FAIL() << n << " " << i;
        }
    }
    Bytes grow(100, 5);
    grow.resize(large_buffer::kHugePage * 2, 9);
    EXPECT_EQ(grow[99], 5);
    EXPECT_EQ(grow[100], 9);
    EXPECT_EQ(grow.back(), 9);
    grow.shrink_to_fit();
    grow.resize(10);
    grow.shrink_to_fit();
    EXPECT_EQ(grow[9], 5);
}

TEST(LargeBuffer, ImpossibleSizesThrowBadAlloc) {
    LargeBufferAllocator<uint64_t> a;
    EXPECT_THROW(a.allocate(static_cast<size_t>(-1) / 4), std::bad_alloc);
    EXPECT_THROW(a.allocate(static_cast<size_t>(-1) / 8), std::bad_alloc);
}

}  // namespace
}  // namespace gptoss
