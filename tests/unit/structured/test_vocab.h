// A vocabulary for mask tests: the 256 single bytes, n random words of 1-6 characters from `alphabet`, and an empty
// entry (a special token, never allowed).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace gptoss::structured::testing {

inline std::vector<std::string> random_vocab(const std::string& alphabet, int n, uint32_t seed) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    std::mt19937 rng(seed);
    for (int i = 0; i < n; ++i) {
        std::string w;
        for (int k = 1 + static_cast<int>(rng() % 6); k > 0; --k) w += alphabet[rng() % alphabet.size()];
        bytes.push_back(w);
    }
    bytes.push_back("");  // a special token: never allowed
    return bytes;
}

}  // namespace gptoss::structured::testing
