// Vocabularies and strings for the structured-output tests. random_vocab: the 256 single bytes, n random words of 1-6
// characters from `alphabet`, and an empty entry (a special token, never allowed). byte_vocab_outputs: the 256 bytes,
// "final" and the Harmony specials at the ids below, for the Harmony gate's tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "structured/harmony_json.h"

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

inline std::string random_string(std::mt19937& rng, const std::string& alphabet, int max_len) {
    std::string s;
    const int len = static_cast<int>(rng() % static_cast<unsigned>(max_len + 1));
    for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
}

inline constexpr int32_t kByteVocabFinal = 256;
inline constexpr HarmonyTokenIds kByteVocabIds{
    .start = 257, .channel = 258, .message = 259, .end = 260, .ret = 261, .call = 262};

inline std::shared_ptr<HarmonyStructuredOutputs> byte_vocab_outputs() {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    bytes.push_back("final");
    bytes.resize(263);
    return std::make_shared<HarmonyStructuredOutputs>(bytes, kByteVocabIds);
}

}  // namespace gptoss::structured::testing
