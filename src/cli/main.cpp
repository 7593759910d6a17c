#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "core/version.h"

namespace gptoss::cli {

std::vector<CommandSetup>& command_registry() {
    static std::vector<CommandSetup> registry;
    return registry;
}

int fail(const std::string& message) {
    std::fprintf(stderr, "error: %s\n", terminal_safe(message).c_str());
    return 1;
}

}  // namespace gptoss::cli

namespace {

// A memory-mapped file that shrank under the process (a checkpoint copied over while served): the kernel raises SIGBUS
// at the next read of a lost page. Said in one line before the process ends (async-signal-safe calls only).
extern "C" void on_sigbus(int) {
    static const char kMsg[] =
        "fatal: bus error (SIGBUS): a memory-mapped file was truncated or replaced while in use (most likely the "
        "model's safetensors files: copy a new checkpoint to another directory, then restart)\n";
    ssize_t n = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    (void)n;
    ::_exit(135);
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGBUS, on_sigbus);
    CLI::App app{"gptoss: inference engine and OpenAI-compatible server for gpt-oss-20b/120b"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Expand all help");
    app.set_version_flag("--version", gptoss::kVersion);
    int exit_code = 0;
    for (auto& setup : gptoss::cli::command_registry()) setup(app, exit_code);
    if (argc > 1 && argv[1][0] != '-') {  // CLI11 says only "A subcommand is required" for a misspelled one
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
            known = known || sub->check_name(argv[1]);
        if (!known) {
            std::fprintf(stderr, "error: unknown command '%s' (gptoss --help lists the commands)\n", argv[1]);
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const std::bad_alloc&) {  // a size from the command line past what the machine can give
        std::fprintf(stderr,
                     "error: out of memory (a buffer too large to allocate: check sizes such as "
                     "--kv-cache-mb and --max-batched-tokens)\n");
        return 1;
    } catch (const std::exception& e) {  // never an abort with a C++ message: one error line
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    // Output that could not be written (a full disk, a closed pipe) is an error, not a silent success.
    std::cout.flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
        std::fprintf(stderr, "error: writing the output failed%s%s\n", errno ? ": " : "",
                     errno ? std::strerror(errno) : "");
        return exit_code != 0 ? exit_code : 1;
    }
    return exit_code;
}
