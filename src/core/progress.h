// A progress bar on stderr for long loads and conversions; silent unless stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gptoss {

class Progress {
public:
    Progress(std::string label, uint64_t total);
    ~Progress();  // finishes the line
    void advance(uint64_t n);

private:
    void draw(bool force);
    std::string label_;
    uint64_t total_;
    uint64_t done_ = 0;
    bool enabled_;
    std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace gptoss
