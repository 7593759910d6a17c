// The engine's version: `gptoss --version` and the server's `GET /version` (vLLM's route) print it.
#pragma once

namespace gptoss {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace gptoss
