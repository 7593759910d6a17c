// BlockAllocator: reference counts, free list, prefix index and LRU eviction.
#include "runtime/block_allocator.h"

#include <gtest/gtest.h>

#include <vector>

namespace gptoss::runtime {
namespace {

TEST(BlockAllocatorTest, AllocatesEveryBlockOnceThenRunsOut) {
    BlockAllocator a(4, 2);
    std::vector<int> got;
    for (int i = 0; i < 4; ++i) got.push_back(a.allocate());
    EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(a.allocate(), -1);
    EXPECT_EQ(a.num_free(), 0);
    EXPECT_EQ(a.num_in_use(), 4);
    a.unref(2);
    EXPECT_EQ(a.num_free(), 1);
    EXPECT_EQ(a.allocate(), 2);
}

TEST(BlockAllocatorTest, SharedBlockIsFreedAfterTheLastReference) {
    BlockAllocator a(2, 2);
    const int b = a.allocate();
    std::vector<int32_t> toks = {5, 6};
    a.index(b, 42, toks);
    a.ref(b);
    EXPECT_EQ(a.ref_count(b), 2);
    a.unref(b);
    EXPECT_EQ(a.num_in_use(), 1);
    a.unref(b);
    EXPECT_EQ(a.num_in_use(), 0);
    // Still findable (cached) although free.
    EXPECT_EQ(a.lookup(42, toks), b);
    a.ref(b);  // revived from the LRU list
    EXPECT_EQ(a.num_free(), 1);
    a.unref(b);
}

TEST(BlockAllocatorTest, LookupChecksTokensAgainstCollisions) {
    BlockAllocator a(2, 2);
    const int b = a.allocate();
    std::vector<int32_t> toks = {5, 6}, other = {5, 7};
    a.index(b, 42, toks);
    EXPECT_EQ(a.lookup(42, toks), b);
    EXPECT_EQ(a.lookup(42, other), -1);
    EXPECT_EQ(a.lookup(43, toks), -1);
}

TEST(BlockAllocatorTest, EvictsLeastRecentlyReleasedIndexedBlockAfterFreeOnes) {
    BlockAllocator a(3, 1);
    const int x = a.allocate(), y = a.allocate(), z = a.allocate();
    std::vector<int32_t> t1 = {1}, t2 = {2};
    a.index(x, 1, t1);
    a.index(y, 2, t2);
    a.unref(y);  // released first → evicted first
    a.unref(x);
    a.unref(z);  // plain free block: used before any eviction
    EXPECT_EQ(a.allocate(), z);
    EXPECT_EQ(a.num_indexed(), 2);
    EXPECT_EQ(a.allocate(), y);
    EXPECT_EQ(a.lookup(2, t2), -1);
    EXPECT_EQ(a.lookup(1, t1), x);
    EXPECT_EQ(a.allocate(), x);
    EXPECT_EQ(a.num_indexed(), 0);
    EXPECT_EQ(a.allocate(), -1);
}

TEST(BlockAllocatorTest, DuplicatePrefixStaysUnindexed) {
    BlockAllocator a(2, 1);
    const int x = a.allocate(), y = a.allocate();
    std::vector<int32_t> t = {9};
    a.index(x, 7, t);
    a.index(y, 7, t);  // same prefix computed twice: y is not indexed
    EXPECT_EQ(a.lookup(7, t), x);
    a.unref(y);
    EXPECT_EQ(a.num_indexed(), 1);
    EXPECT_EQ(a.allocate(), y);  // y went to the plain free list
}

TEST(BlockAllocatorTest, ChainedHashDependsOnTheWholePrefix) {
    std::vector<int32_t> a = {1, 2}, b = {1, 3};
    EXPECT_NE(hash_block(0, a), hash_block(0, b));
    EXPECT_NE(hash_block(1, a), hash_block(2, a));
    EXPECT_EQ(hash_block(5, a), hash_block(5, a));
}

}  // namespace
}  // namespace gptoss::runtime
