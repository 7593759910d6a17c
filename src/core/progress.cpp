#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace gptoss {

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(isatty(STDERR_FILENO) == 1) {
    start_ = last_draw_ = std::chrono::steady_clock::now();
    draw(true);
}

Progress::~Progress() {
    if (!enabled_) return;
    done_ = total_;
    draw(true);
    std::fputc('\n', stderr);
}

void Progress::advance(uint64_t n) {
    done_ += n;
    draw(false);
}

void Progress::draw(bool force) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    if (frac > 1.0) frac = 1.0;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r%s [", label_.c_str());
    for (int i = 0; i < kWidth; ++i) std::fputc(i < filled ? '#' : '.', stderr);
    std::fprintf(stderr, "] %5.1f%% %6.1fs", 100.0 * frac, secs);
    std::fflush(stderr);
}

}  // namespace gptoss
