// Subcommand registry: each src/cli/<command>.cpp registers itself with a static CommandRegistrar,
// so adding a command touches only its own file.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace gptoss::cli {

// Adds one subcommand to `app`. Its callback stores the process exit code in `exit_code`.
using CommandSetup = std::function<void(CLI::App& app, int& exit_code)>;

std::vector<CommandSetup>& command_registry();

struct CommandRegistrar {
    explicit CommandRegistrar(CommandSetup setup) { command_registry().push_back(std::move(setup)); }
};

// Check for a path option: an empty value is refused (a flag given as '' would otherwise read as absent and fall
// back to a default, e.g. `--tokenizer ''` to the fixture).
inline std::string non_empty_path(const std::string& text) {
    return text.empty() ? std::string("an empty path names no file") : std::string();
}

// Prints "error: <message>" on stderr and returns 1: the CLI's one-line error form.
int fail(const std::string& message);

}  // namespace gptoss::cli
