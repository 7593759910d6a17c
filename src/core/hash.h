// Small integer hashes shared by the host code (counter-based random streams).
#pragma once

#include <cstdint>

namespace gptoss {

// splitmix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix; x, x+1, … give independent-looking
// outputs, which is what counter-based random draws need. kernels/cuda/common.cuh has the device copy.
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace gptoss
