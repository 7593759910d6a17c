// A libFuzzer-compatible driver for CI: runs LLVMFuzzerTestOneInput on every file of a seed corpus,
// then on a bounded number of seeded random mutations of those files. A crash (or sanitizer report
// in a sanitized build) fails the test; finishing means every input was handled.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

Bytes mutate(const Bytes& in, const std::vector<Bytes>& corpus, std::mt19937_64& rng) {
    Bytes b = in;
    int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
        switch (rng() % 7) {
            case 0:  // flip a bit
                if (!b.empty()) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
                break;
            case 1:  // random byte
                if (!b.empty()) b[rng() % b.size()] = static_cast<uint8_t>(rng());
                break;
            case 2:  // insert bytes
                for (size_t k = 0, n = 1 + rng() % 8; k < n; ++k)
                    b.insert(b.begin() + static_cast<long>(b.empty() ? 0 : rng() % (b.size() + 1)),
                             static_cast<uint8_t>(rng()));
                break;
            case 3:  // erase a range
                if (!b.empty()) {
                    size_t at = rng() % b.size();
                    size_t len = 1 + rng() % std::min<size_t>(16, b.size() - at);
                    b.erase(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(at + len));
                }
                break;
            case 4:  // truncate
                if (!b.empty()) b.resize(rng() % b.size());
                break;
            case 5: {  // splice with another corpus entry
                const Bytes& o = corpus[rng() % corpus.size()];
                if (!o.empty()) {
                    size_t at = b.empty() ? 0 : rng() % b.size();
                    size_t from = rng() % o.size();
                    b.resize(at);
                    b.insert(b.end(), o.begin() + static_cast<long>(from), o.end());
                }
                break;
            }
            case 6: {  // interesting integers (lengths, offsets)
                static const uint64_t kVals[] = {
                    0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0xffffffff, 0xffffffffffffffffull, 1ull << 40};
                if (b.size() >= 8) {
                    uint64_t v = kVals[rng() % std::size(kVals)];
                    std::memcpy(&b[rng() % (b.size() - 7)], &v, 8);
                }
                break;
            }
        }
    }
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    long iterations = 10000;
    uint64_t seed = 12345;
    std::vector<std::string> dirs;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--iterations" && i + 1 < argc) {
            iterations = std::atol(argv[++i]);
        } else if (a == "--seed" && i + 1 < argc) {
            seed = std::strtoull(argv[++i], nullptr, 10);
        } else {
            dirs.push_back(a);
        }
    }
    std::vector<Bytes> corpus;
    for (const auto& d : dirs) {
        std::error_code ec;
        if (!std::filesystem::is_directory(d, ec)) continue;
        for (const auto& entry : std::filesystem::directory_iterator(d)) {
            if (!entry.is_regular_file()) continue;
            std::ifstream f(entry.path(), std::ios::binary);
            corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        }
    }
    if (corpus.empty()) corpus.push_back(Bytes{});
    for (const auto& c : corpus) LLVMFuzzerTestOneInput(c.data(), c.size());
    std::mt19937_64 rng(seed);
    for (long i = 0; i < iterations; ++i) {
        Bytes b = mutate(corpus[rng() % corpus.size()], corpus, rng);
        LLVMFuzzerTestOneInput(b.data(), b.size());
    }
    std::printf("fuzz: %zu seeds + %ld mutations, no crash\n", corpus.size(), iterations);
    return 0;
}
