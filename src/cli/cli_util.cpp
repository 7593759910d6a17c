#include <unistd.h>

#include "cli/cli_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "model/synthetic_weights.h"
#include "runtime/sampler.h"
#include "tokenizer/utf8.h"

namespace gptoss::cli {

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const char* what) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t b = item.find_first_not_of(" \t");
        size_t e = item.find_last_not_of(" \t");
        if (b == std::string::npos) return invalid_argument("empty item in the list \"" + text + "\"");
        item = item.substr(b, e - b + 1);
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (ec != std::errc() || ptr != item.data() + item.size() || v < 0 || v > INT32_MAX) {
            return invalid_argument(std::string("not ") + what + ": \"" + item + "\"");
        }
        ids.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return ids;
}

StatusOr<bool> parse_kv_cache_dtype(const std::string& text) {
    if (text == "auto" || text == "bf16" || text == "bfloat16") return false;
    if (text == "fp8" || text == "fp8_e4m3") return true;
    return invalid_argument("--kv-cache-dtype '" + text + "': expected auto, bf16, fp8 or fp8_e4m3");
}

StatusOr<std::optional<uint64_t>> parse_seed(std::string_view text) {
    const char* end = text.data() + text.size();
    if (!text.empty() && text[0] == '-') {
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end) return runtime::seed_from_signed(v);
    } else {
        uint64_t v = 0;
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end) return std::optional<uint64_t>(v);
    }
    return invalid_argument("seed \"" + std::string(text) +
                            "\": expected an integer in [-9223372036854775808, 18446744073709551615] (-1: random)");
}

std::string terminal_safe(std::string_view message) {
    std::string out;
    out.reserve(message.size());
    size_t i = 0;
    while (i < message.size()) {
        const size_t ok = tokenizer::valid_utf8_prefix(message.data() + i, message.size() - i);
        for (size_t k = i; k < i + ok; ++k) {
            const auto c = static_cast<unsigned char>(message[k]);
            if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) {
                char buf[8];
                std::snprintf(buf, sizeof(buf), "\\x%02x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
        i += ok;
        if (i < message.size()) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(message[i]));
            out += buf;
            ++i;
        }
    }
    return out;
}

std::string json_float(float v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    return std::string(buf, ptr);
}

size_t physical_memory_mib() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (static_cast<size_t>(pages) * static_cast<size_t>(page)) >> 20 : 0;
}

std::string synthetic_memory_error(const model::GptOssConfig& config, const std::string& preset) {
    const size_t ram_mib = physical_memory_mib();
    const uint64_t need_mib = model::synthetic_weight_bytes(config) >> 20;
    if (ram_mib == 0 || need_mib < ram_mib) return {};
    return "--synthetic " + preset + " builds its weights in host memory: " + std::to_string(need_mib) +
           " MiB, more than this machine's " + std::to_string(ram_mib) + " MiB";
}

StatusOr<OutputTarget> resolve_output_target(const std::string& out) {
    namespace fs = std::filesystem;
    if (out.empty()) return invalid_argument("an empty output path");
    struct stat st {};
    if (::stat(out.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return invalid_argument("cannot write " + out + ": it is a directory");
        if (::access(out.c_str(), W_OK) != 0)
            return invalid_argument("cannot write " + out + ": " + std::strerror(errno));
        // A FIFO, a device, a terminal or a pipe behind /dev/stdout: open it as it is named.
        if (!S_ISREG(st.st_mode)) return OutputTarget{fs::path(out), true};
        std::error_code ec;
        const fs::path path = fs::canonical(fs::path(out), ec);  // the file itself, past any links
        if (ec) return invalid_argument("cannot write " + out + ": " + ec.message());
        if (::access(path.parent_path().c_str(), W_OK | X_OK) != 0)
            return invalid_argument("cannot write " + out + ": its directory " + path.parent_path().string() +
                                    " is not writable");
        return OutputTarget{path, false};
    }
    if (errno != ENOENT) return invalid_argument("cannot write " + out + ": " + std::strerror(errno));
    struct stat lst {};
    // A link to a file not there yet: opening it creates the file it names.
    if (::lstat(out.c_str(), &lst) == 0) return OutputTarget{fs::path(out), true};
    std::error_code ec;
    const fs::path path = fs::absolute(fs::path(out), ec);
    if (ec || !path.has_filename()) return invalid_argument("cannot write " + out + ": not a file name");
    const fs::path parent = path.parent_path();
    if (!fs::is_directory(parent, ec))
        return invalid_argument("cannot write " + out + ": no directory " + parent.string());
    if (::access(parent.c_str(), W_OK | X_OK) != 0)
        return invalid_argument("cannot write " + out + ": its directory " + parent.string() + " is not writable");
    return OutputTarget{path, false};
}

std::filesystem::path temporary_dir_for(const OutputTarget& target) {
    std::error_code ec;
    return target.write_through ? std::filesystem::temp_directory_path(ec) : target.path.parent_path();
}

namespace {

Status write_through(const std::filesystem::path& path, std::string_view bytes) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return invalid_argument("cannot write " + path.string() + ": " + std::strerror(errno));
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const int err = errno;
    if (std::fclose(f) != 0 || !ok)
        return invalid_argument("cannot write " + path.string() + ": " + std::strerror(ok ? errno : err));
    return Status::ok_status();
}

}  // namespace

Status write_output(const OutputTarget& target, std::string_view bytes) {
    if (target.write_through) return write_through(target.path, bytes);
    std::string name = ".";  // (appended: GCC 12's -Wrestrict misfires on "." + string + "...")
    name.append(target.path.filename().string()).append(".tmp-XXXXXX");
    std::string tmp = (target.path.parent_path() / name).string();
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) return invalid_argument("cannot write " + target.path.string() + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            return invalid_argument("cannot write " + target.path.string() + ": " + std::strerror(err));
        }
        done += static_cast<size_t>(n);
    }
    // mkstemp's file is 0600: give it what a newly created file would get (0666 less the umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    if (::close(fd) != 0 || std::rename(tmp.c_str(), target.path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        return invalid_argument("cannot write " + target.path.string() + ": " + std::strerror(err));
    }
    return Status::ok_status();
}

Status place_output_file(const OutputTarget& target, const std::filesystem::path& finished) {
    if (!target.write_through) {
        std::error_code ec;
        std::filesystem::rename(finished, target.path, ec);
        if (ec) return invalid_argument("cannot write " + target.path.string() + ": " + ec.message());
        return Status::ok_status();
    }
    std::ifstream in(finished, std::ios::binary);
    std::FILE* f = std::fopen(target.path.c_str(), "wb");
    if (!in || f == nullptr) {
        if (f != nullptr) std::fclose(f);
        return invalid_argument("cannot write " + target.path.string() + ": " + std::strerror(errno));
    }
    std::vector<char> buf(1 << 20);
    bool ok = true;
    while (ok && in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        const size_t n = static_cast<size_t>(in.gcount());
        ok = std::fwrite(buf.data(), 1, n, f) == n;
    }
    const int err = errno;
    if (std::fclose(f) != 0 || !ok)
        return invalid_argument("cannot write " + target.path.string() + ": " + std::strerror(ok ? errno : err));
    return Status::ok_status();
}

}  // namespace gptoss::cli
