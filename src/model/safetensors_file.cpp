#include "model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/logging.h"

namespace gptoss::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Containers nested deeper than this are rejected while parsing: a real header nests 3 deep
// (top object, tensor entry, shape array), and unbounded nesting would cost memory per level.
constexpr int kMaxJsonDepth = 8;

// Thrown from the JSON parse callback to stop parsing early; caught in parse_json_strict.
struct JsonRejected {
    std::string message;
};

// Names and keys come from the file: print at most 128 bytes, escaping anything non-printable.
std::string printable(std::string_view s) {
    std::string out = "'";
    size_t n = std::min<size_t>(s.size(), 128);
    for (size_t i = 0; i < n; ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            out += static_cast<char>(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        }
    }
    if (s.size() > n) out += "...";
    return out + "'";
}

// Parses `text` into `out`, rejecting duplicate keys in any object (nlohmann keeps the last one
// silently) and nesting deeper than kMaxJsonDepth. Returns "" on success, else the problem.
std::string parse_json_strict(std::string_view text, json* out) {
    std::vector<std::set<std::string>> keys;  // one per open container (arrays keep an empty set)
    auto callback = [&keys](int depth, json::parse_event_t event, json& parsed) -> bool {
        switch (event) {
            case json::parse_event_t::object_start:
            case json::parse_event_t::array_start:
                if (depth >= kMaxJsonDepth) {
                    throw JsonRejected{"JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
                }
                keys.emplace_back();
                break;
            case json::parse_event_t::object_end:
            case json::parse_event_t::array_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case json::parse_event_t::key: {
                const auto& k = parsed.get_ref<const std::string&>();
                if (!keys.empty() && !keys.back().insert(k).second) {
                    throw JsonRejected{depth == 1 ? "duplicate name " + printable(k)
                                                  : "duplicate key " + printable(k) + " in a nested object"};
                }
                break;
            }
            case json::parse_event_t::value: break;
        }
        return true;
    };
    try {
        *out = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
    } catch (const JsonRejected& e) {
        return e.message;
    } catch (const json::exception& e) {
        return std::string("not valid JSON: ") + e.what();
    } catch (const std::bad_alloc&) {
        return "out of memory while parsing JSON";
    } catch (const std::exception& e) {
        return std::string("JSON parse failed: ") + e.what();
    }
    return "";
}

// Runs `f`, turning an escaping exception (std::bad_alloc, or one thrown by a writer's fill
// callback) into a Status: nothing escapes this file's public functions.
template <typename F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return resource_exhausted(what + ": out of memory");
    } catch (const std::exception& e) {
        return internal_error(what + ": unexpected exception: " + e.what());
    }
}

uint64_t read_le64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void write_le64(uint8_t* p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

const char* json_type(const json& j) { return j.type_name(); }

// A non-negative JSON integer that fits in int64 (so shapes and offsets stay signed-safe).
bool as_size(const json& j, uint64_t* out) {
    if (j.is_number_unsigned()) {
        uint64_t v = j.get<uint64_t>();
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
        *out = v;
        return true;
    }
    if (j.is_number_integer()) {
        int64_t v = j.get<int64_t>();
        if (v < 0) return false;
        *out = static_cast<uint64_t>(v);
        return true;
    }
    return false;
}

// Validates one header entry (anything but __metadata__). `data_size` = bytes after the header.
Status parse_entry(const std::string& file, const std::string& name, const json& entry, uint64_t data_size,
                   const uint8_t* data_base, TensorInfo* out) {
    const std::string where = file + ": tensor " + printable(name);
    if (!entry.is_object()) {
        return data_loss(where + ": entry is a JSON " + json_type(entry) + ", expected an object");
    }
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end()) return data_loss(where + ": missing 'dtype'");
    if (shape_it == entry.end()) return data_loss(where + ": missing 'shape'");
    if (offsets_it == entry.end()) return data_loss(where + ": missing 'data_offsets'");

    if (!dtype_it->is_string()) {
        return data_loss(where + ": 'dtype' is a JSON " + json_type(*dtype_it) + ", expected a string");
    }
    const auto& dtype_str = dtype_it->get_ref<const std::string&>();
    auto dtype = safetensors_dtype_from_string(dtype_str);
    const int foreign_bits = dtype.ok() ? 0 : safetensors_foreign_dtype_bits(dtype_str);
    if (!dtype.ok() && foreign_bits == 0) {
        return invalid_argument(file + ": unsupported dtype " + printable(dtype_str) + " for tensor " +
                                printable(name) + " (not a safetensors dtype)");
    }

    const json& shape_j = *shape_it;
    if (!shape_j.is_array()) {
        return data_loss(where + ": 'shape' is a JSON " + json_type(shape_j) + ", expected an array");
    }
    if (shape_j.size() > static_cast<size_t>(kMaxDims)) {
        return invalid_argument(where + ": rank " + std::to_string(shape_j.size()) + " is not supported (at most " +
                                std::to_string(kMaxDims) + " dimensions)");
    }
    Shape shape;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape_j.size(); ++i) {
        uint64_t d = 0;
        if (!as_size(shape_j[i], &d)) {
            return data_loss(where + ": shape dimension " + std::to_string(i) + " is " + shape_j[i].dump() +
                             ", expected a non-negative integer");
        }
        shape.dims[shape.rank++] = static_cast<int64_t>(d);
        overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    }
    uint64_t nbytes = 0;
    const uint64_t elem_bits = foreign_bits > 0 ? static_cast<uint64_t>(foreign_bits) : 8 * dtype_size(*dtype);
    overflow = overflow || __builtin_mul_overflow(numel, elem_bits, &nbytes);
    if (overflow || nbytes / 8 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return data_loss(where + ": shape " + shape.to_string() + " overflows (element count × dtype size > 2^63)");
    }
    if (nbytes % 8 != 0) {  // sub-byte types (F4, F6_*): whole bytes only, as the safetensors library requires
        return data_loss(where + ": " + dtype_str + " " + shape.to_string() + " is not a whole number of bytes");
    }
    nbytes /= 8;

    const json& off_j = *offsets_it;
    uint64_t begin = 0, end = 0;
    if (!off_j.is_array() || off_j.size() != 2 || !as_size(off_j[0], &begin) || !as_size(off_j[1], &end)) {
        return data_loss(where + ": 'data_offsets' is " + off_j.dump().substr(0, 100) +
                         ", expected [begin, end] as non-negative integers");
    }
    if (begin > end) {
        return data_loss(where + ": data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
    }
    if (end > data_size) {
        return data_loss(where + ": data_offsets end " + std::to_string(end) + " is past the end of the data region (" +
                         std::to_string(data_size) + " bytes after the header)");
    }
    if (end - begin != nbytes) {
        return data_loss(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
                         std::to_string(end - begin) + " bytes but " + dtype_str + " " + shape.to_string() + " needs " +
                         std::to_string(nbytes));
    }

    out->name = name;
    out->dtype = foreign_bits > 0 ? DType::kU8 : *dtype;
    out->foreign_dtype = foreign_bits > 0 ? dtype_str : std::string();
    out->shape = shape;
    out->data = data_base + begin;
    out->nbytes = static_cast<size_t>(nbytes);
    out->file = file;
    return ok_status();
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
    std::string s;
    for (DType d : dtypes) {
        if (!s.empty()) s += '|';
        s += safetensors_dtype_string(d);
    }
    return s;
}

bool is_safe_relative_file(const std::string& name) {
    if (name.empty() || name.find('\0') != std::string::npos) return false;
    fs::path p(name);
    if (p.is_absolute()) return false;
    for (const auto& part : p) {
        if (part == "..") return false;
    }
    return true;
}

}  // namespace

// ---- dtype strings ----------------------------------------------------------------------------

StatusOr<DType> safetensors_dtype_from_string(std::string_view s) {
    if (s == "F32") return DType::kF32;
    if (s == "BF16") return DType::kBF16;
    if (s == "F16") return DType::kF16;
    if (s == "F8_E4M3") return DType::kFP8E4M3;
    if (s == "U8") return DType::kU8;
    if (s == "I32") return DType::kI32;
    if (s == "I64") return DType::kI64;
    return invalid_argument("unsupported dtype " + printable(s));
}

int safetensors_foreign_dtype_bits(std::string_view s) {
    static constexpr std::pair<std::string_view, int> kTypes[] = {
        {"BOOL", 8}, {"I8", 8},      {"I16", 16},    {"U16", 16}, {"U32", 32},    {"U64", 64},   {"F64", 64},
        {"C64", 64}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
    for (const auto& [name, bits] : kTypes)
        if (s == name) return bits;
    return 0;
}

std::string TensorInfo::dtype_string() const {
    return foreign_dtype.empty() ? std::string(safetensors_dtype_string(dtype)) : foreign_dtype;
}

std::string_view safetensors_dtype_string(DType dtype) {
    switch (dtype) {
        case DType::kF32: return "F32";
        case DType::kBF16: return "BF16";
        case DType::kF16: return "F16";
        case DType::kFP8E4M3: return "F8_E4M3";
        case DType::kU8: return "U8";
        case DType::kI32: return "I32";
        case DType::kI64: return "I64";
    }
    return "?";
}

// ---- SafetensorsFile ----------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() {
    if (map_ != nullptr) ::munmap(map_, size_);
}

StatusOr<SafetensorsHeader> SafetensorsFile::parse_header(const uint8_t* bytes, size_t file_size,
                                                          const std::string& name_for_errors) {
    return guarded(name_for_errors, [&]() -> StatusOr<SafetensorsHeader> {
        const std::string& file = name_for_errors;
        if (bytes == nullptr && file_size > 0) return invalid_argument(file + ": no buffer to parse");
        if (file_size < 8) {
            return data_loss(file + ": file is " + std::to_string(file_size) +
                             " bytes, shorter than the 8-byte header length");
        }
        const uint64_t header_len = read_le64(bytes);
        if (header_len > kMaxSafetensorsHeaderBytes) {
            return data_loss(file + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                             std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
        }
        if (header_len > file_size - 8) {
            return data_loss(file + ": header length " + std::to_string(header_len) +
                             " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
        }
        SafetensorsHeader header;
        header.data_start = 8 + header_len;
        const uint64_t data_size = file_size - header.data_start;
        const uint8_t* data_base = bytes + header.data_start;

        // The spec pads the header with spaces to a multiple of 8; JSON parsing skips them either way.
        json root;
        std::string problem =
            parse_json_strict(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), &root);
        if (!problem.empty()) return data_loss(file + ": header: " + problem);
        if (!root.is_object()) {
            return data_loss(file + ": header is a JSON " + std::string(json_type(root)) + ", expected an object");
        }

        {
            header.tensors.reserve(root.size());
            for (const auto& [name, entry] : root.items()) {
                if (name == "__metadata__") {
                    if (entry.is_null()) continue;
                    if (!entry.is_object()) {
                        return data_loss(file + ": __metadata__ is a JSON " + std::string(json_type(entry)) +
                                         ", expected an object of strings");
                    }
                    for (const auto& [k, v] : entry.items()) {
                        if (!v.is_string()) {
                            return data_loss(file + ": __metadata__ value for " + printable(k) + " is a JSON " +
                                             json_type(v) + ", expected a string");
                        }
                        header.metadata.emplace(k, v.get<std::string>());
                    }
                    continue;
                }
                TensorInfo info;
                RETURN_IF_ERROR(parse_entry(file, name, entry, data_size, data_base, &info));
                header.tensors.push_back(std::move(info));
            }
        }

        // Overlap check over the non-empty ranges, sorted by start. Gaps are allowed.
        std::vector<const TensorInfo*> by_offset;
        by_offset.reserve(header.tensors.size());
        for (const auto& t : header.tensors) {
            if (t.nbytes > 0) by_offset.push_back(&t);
        }
        std::sort(by_offset.begin(), by_offset.end(),
                  [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
        for (size_t i = 1; i < by_offset.size(); ++i) {
            const TensorInfo* prev = by_offset[i - 1];
            const TensorInfo* cur = by_offset[i];
            if (cur->data < prev->data + prev->nbytes) {
                auto range = [&](const TensorInfo* t) {
                    uint64_t b = static_cast<uint64_t>(t->data - data_base);
                    std::string r = "[";
                    r += std::to_string(b);
                    r += ", ";
                    r += std::to_string(b + t->nbytes);
                    return r + ")";
                };
                return data_loss(file + ": tensors " + printable(prev->name) + " " + range(prev) + " and " +
                                 printable(cur->name) + " " + range(cur) + " overlap");
            }
        }
        // The data region ends where the last tensor does (the reference reader's rule too): a header length
        // a few bytes short still parsed (its padding spaces absorbed it) and shifted every tensor onto the
        // header's last bytes, NaN logits with exit 0; trailing bytes are refused with it.
        uint64_t data_end = 0;
        for (const auto& t : header.tensors) {
            if (t.nbytes > 0)
                data_end = std::max<uint64_t>(data_end, static_cast<uint64_t>(t.data - data_base) + t.nbytes);
        }
        if (data_end != data_size) {
            return data_loss(file + ": the data region holds " + std::to_string(data_size) +
                             " bytes but the tensors end at " + std::to_string(data_end) +
                             " (a wrong header length, or trailing bytes)");
        }
        // root.items() iterates a std::map, so tensors are already sorted by name (find() relies on it).
        return header;
    });
}

StatusOr<std::vector<TensorInfo>> SafetensorsFile::parse(const uint8_t* bytes, size_t file_size,
                                                         const std::string& name_for_errors) {
    ASSIGN_OR_RETURN(SafetensorsHeader header, parse_header(bytes, file_size, name_for_errors));
    return std::move(header.tensors);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
    // O_NONBLOCK: opening a FIFO planted in a model directory must not hang (no effect on files).
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        std::string msg = path + ": cannot open: " + std::strerror(err);
        return err == ENOENT ? not_found(msg) : invalid_argument(msg);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return invalid_argument(path + ": cannot stat: " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return invalid_argument(path + ": not a regular file");
    }
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
        void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            return resource_exhausted(path + ": mmap of " + std::to_string(f->size_) +
                                      " bytes failed: " + std::strerror(err));
        }
        f->map_ = p;
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    ASSIGN_OR_RETURN(f->header_, parse_header(static_cast<const uint8_t*>(f->map_), f->size_, path));
    return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
    const auto& ts = header_.tensors;
    auto it = std::lower_bound(ts.begin(), ts.end(), name,
                               [](const TensorInfo& t, std::string_view n) { return t.name < n; });
    return it != ts.end() && it->name == name ? &*it : nullptr;
}

// ---- SafetensorsCheckpoint ----------------------------------------------------------------------

namespace {

// A link whose target is gone (a half-downloaded Hugging Face cache snapshot links into blobs/): named as such, not
// reported as a missing file or skipped.
Status refuse_broken_link(const fs::path& p) {
    std::error_code ec;
    if (!fs::is_symlink(p, ec) || fs::exists(p, ec)) return ok_status();
    const fs::path target = fs::read_symlink(p, ec);
    return not_found(p.string() + " is a broken symbolic link (to " + target.string() + ", which does not exist)");
}

// An index's file name as the directory holds it: "./a.safetensors" and "a.safetensors" are one shard.
std::string normal_shard_name(const std::string& f) { return fs::path(f).lexically_normal().string(); }

}  // namespace

Status SafetensorsCheckpoint::add_file(std::unique_ptr<SafetensorsFile> file) {
    for (const auto& t : file->tensors()) {
        auto [it, inserted] = by_name_.emplace(t.name, &t);
        if (!inserted) {
            return data_loss(dir_ + ": tensor " + printable(t.name) + " is in both " + it->second->file + " and " +
                             t.file);
        }
    }
    files_.push_back(std::move(file));
    return ok_status();
}

StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open_dir(const std::string& dir) {
    return guarded(dir, [&]() -> StatusOr<std::unique_ptr<SafetensorsCheckpoint>> {
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) return not_found("model directory " + dir + " does not exist");
        std::unique_ptr<SafetensorsCheckpoint> ck(new SafetensorsCheckpoint());
        ck->dir_ = dir;
        const fs::path root(dir);

        const fs::path index_path = root / kSafetensorsIndexFile;
        // model.safetensors first, then the index: transformers' order (from_pretrained looks for the single file
        // before the index), said when both are there: they may hold different weights.
        const fs::path single = root / kSafetensorsSingleFile;
        RETURN_IF_ERROR(refuse_broken_link(single));
        RETURN_IF_ERROR(refuse_broken_link(index_path));
        if (fs::exists(single, ec)) {
            if (fs::exists(index_path, ec))
                LOG_WARN("%s: both %s and %s are here; loading %s (as transformers does), the index is ignored",
                         dir.c_str(), kSafetensorsSingleFile, kSafetensorsIndexFile, kSafetensorsSingleFile);
            ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(single.string()));
            RETURN_IF_ERROR(ck->add_file(std::move(file)));
            return ck;
        }
        if (fs::exists(index_path, ec)) {
            const std::string where = index_path.string();
            std::error_code size_ec;
            uintmax_t size = fs::file_size(index_path, size_ec);
            if (size_ec) return invalid_argument(where + ": cannot read: " + size_ec.message());
            if (size > kMaxSafetensorsHeaderBytes) {
                return data_loss(where + ": " + std::to_string(size) + " bytes is larger than any plausible index");
            }
            std::ifstream in(index_path, std::ios::binary);
            std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            if (!in.good() && !in.eof()) return invalid_argument(where + ": read failed");
            json index;
            std::string problem = parse_json_strict(text, &index);
            if (!problem.empty()) return data_loss(where + ": " + problem);
            if (!index.is_object()) return data_loss(where + ": not a JSON object");
            auto wm = index.find("weight_map");
            if (wm == index.end() || !wm->is_object()) return data_loss(where + ": missing 'weight_map' object");

            std::set<std::string> shard_names;
            for (const auto& [name, file] : wm->items()) {
                if (!file.is_string()) {
                    return data_loss(where + ": weight_map entry for " + printable(name) + " is a JSON " +
                                     json_type(file) + ", expected a file name");
                }
                const auto& f = file.get_ref<const std::string&>();
                if (!is_safe_relative_file(f)) {
                    return data_loss(where + ": weight_map file " + printable(f) + " for tensor " + printable(name) +
                                     " must be a relative path inside the model directory");
                }
                shard_names.insert(normal_shard_name(f));
            }
            for (const auto& shard : shard_names) {
                const std::string shard_path = (root / shard).string();
                RETURN_IF_ERROR(refuse_broken_link(shard_path));
                if (!fs::exists(shard_path, ec)) {
                    return not_found(where + ": lists " + shard + " but " + shard_path + " does not exist");
                }
                ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(shard_path));
                RETURN_IF_ERROR(ck->add_file(std::move(file)));
            }
            for (const auto& [name, file] : wm->items()) {
                const std::string shard_path = (root / normal_shard_name(file.get<std::string>())).string();
                const TensorInfo* t = ck->find(name);
                if (t == nullptr) {
                    return data_loss(where + ": weight_map puts tensor " + printable(name) + " in " + shard_path +
                                     ", which does not hold it");
                }
                if (t->file != shard_path) {
                    return data_loss(where + ": weight_map puts tensor " + printable(name) + " in " + shard_path +
                                     " but it is in " + t->file);
                }
            }
            // A shard the index leaves out: its tensors go missing, and the error names a tensor, not the index.
            for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
                const std::string name = it->path().filename().string();
                if (it->path().extension() == ".safetensors" && name != kSafetensorsSingleFile &&
                    !shard_names.count(name))
                    LOG_WARN("%s: %s is not in %s's weight_map: its tensors are not loaded", dir.c_str(),
                             printable(name).c_str(), kSafetensorsIndexFile);
            }
            return ck;
        }

        std::vector<std::string> paths;
        for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
            if (it->path().extension() != ".safetensors") continue;
            RETURN_IF_ERROR(refuse_broken_link(it->path()));
            if (it->is_regular_file(ec)) paths.push_back(it->path().string());
        }
        if (ec) return invalid_argument(dir + ": cannot list directory: " + ec.message());
        if (paths.empty()) {
            return not_found(dir + ": no " + kSafetensorsIndexFile + ", " + kSafetensorsSingleFile +
                             " or *.safetensors files");
        }
        std::sort(paths.begin(), paths.end());
        for (const auto& p : paths) {
            ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(p));
            RETURN_IF_ERROR(ck->add_file(std::move(file)));
        }
        return ck;
    });
}

const TensorInfo* SafetensorsCheckpoint::find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
    std::vector<std::string> out;
    out.reserve(by_name_.size());
    for (const auto& [name, t] : by_name_) out.push_back(name);
    return out;
}

StatusOr<const TensorInfo*> SafetensorsCheckpoint::get(std::string_view name, DType dtype, const Shape& shape) const {
    return get_any(name, {dtype}, shape);
}

StatusOr<const TensorInfo*> SafetensorsCheckpoint::get_any(std::string_view name, std::initializer_list<DType> dtypes,
                                                           const Shape& shape) const {
    const TensorInfo* t = find(name);
    if (t == nullptr) return not_found("tensor " + printable(name) + " not found in checkpoint " + dir_);
    bool dtype_ok = t->foreign_dtype.empty() && std::find(dtypes.begin(), dtypes.end(), t->dtype) != dtypes.end();
    if (!dtype_ok || !(t->shape == shape)) {
        return invalid_argument("tensor " + printable(name) + " in " + t->file + ": expected " + dtype_list(dtypes) +
                                " " + shape.to_string() + ", got " + t->dtype_string() + " " + t->shape.to_string());
    }
    return t;
}

uint64_t SafetensorsCheckpoint::total_bytes() const {
    uint64_t total = 0;
    for (const auto& [name, t] : by_name_) total += t->nbytes;
    return total;
}

// ---- SafetensorsWriter --------------------------------------------------------------------------

namespace {

// numel × dtype size, or an error for negative dims or overflow.
StatusOr<uint64_t> checked_nbytes(const std::string& name, DType dtype, const Shape& shape) {
    if (shape.rank < 0 || shape.rank > kMaxDims) return invalid_argument("tensor " + printable(name) + ": bad rank");
    uint64_t n = dtype_size(dtype);
    for (int i = 0; i < shape.rank; ++i) {
        if (shape.dims[i] < 0) {
            return invalid_argument("tensor " + printable(name) + ": negative dimension in " + shape.to_string());
        }
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(shape.dims[i]), &n)) {
            return invalid_argument("tensor " + printable(name) + ": shape " + shape.to_string() + " overflows");
        }
    }
    return n;
}

std::string shard_name(size_t i, size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    return buf;
}

Status write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
    if (n > 0 && std::fwrite(p, 1, n, f) != n) {
        return resource_exhausted(path + ": write failed: " + std::strerror(errno));
    }
    return ok_status();
}

Status commit_file(const std::string& tmp, const std::string& path) {
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        fs::remove(tmp, ec);
        return internal_error(path + ": rename from " + tmp + " failed: " + ec.message());
    }
    return ok_status();
}

}  // namespace

void SafetensorsWriter::add(std::string name, DType dtype, Shape shape, std::vector<uint8_t> bytes) {
    auto nbytes = checked_nbytes(name, dtype, shape);
    if (nbytes.ok() && bytes.size() != *nbytes && deferred_.ok()) {
        deferred_ = invalid_argument("tensor " + printable(name) + ": " + std::to_string(bytes.size()) +
                                     " bytes given but " + std::string(safetensors_dtype_string(dtype)) + " " +
                                     shape.to_string() + " needs " + std::to_string(*nbytes));
    }
    entries_.push_back(Entry{
        std::move(name), dtype, shape, nbytes.ok() ? *nbytes : 0, std::move(bytes), nullptr, {}, dtype_size(dtype)});
    if (!nbytes.ok() && deferred_.ok()) deferred_ = nbytes.status();
}

void SafetensorsWriter::add_lazy(std::string name, DType dtype, Shape shape, FillFn fill) {
    auto nbytes = checked_nbytes(name, dtype, shape);
    if (!nbytes.ok() && deferred_.ok()) deferred_ = nbytes.status();
    if (!fill && deferred_.ok()) deferred_ = invalid_argument("tensor " + printable(name) + ": empty fill function");
    entries_.push_back(
        Entry{std::move(name), dtype, shape, nbytes.ok() ? *nbytes : 0, {}, std::move(fill), {}, dtype_size(dtype)});
}

void SafetensorsWriter::add_copy(const TensorInfo& t) {
    if (t.foreign_dtype.empty()) {
        add_lazy(t.name, t.dtype, t.shape, [&t](uint8_t* dst) { std::memcpy(dst, t.data, t.nbytes); });
        return;
    }
    entries_.push_back(Entry{t.name,
                             DType::kU8,
                             t.shape,
                             t.nbytes,
                             {},
                             [&t](uint8_t* dst) { std::memcpy(dst, t.data, t.nbytes); },
                             t.foreign_dtype,
                             static_cast<size_t>(std::max(1, safetensors_foreign_dtype_bits(t.foreign_dtype) / 8))});
}

uint64_t SafetensorsWriter::total_bytes() const {
    uint64_t total = 0;
    for (const auto& e : entries_) total += e.nbytes;
    return total;
}

Status SafetensorsWriter::write_file(const std::string& path, const std::vector<const Entry*>& entries,
                                     const std::map<std::string, std::string>& metadata,
                                     std::vector<uint8_t>& scratch) const {
    // Larger elements first (stable), so every tensor starts at a multiple of its element size with
    // no padding between tensors: the header is padded to 8 bytes, and HF's reader rejects gaps.
    std::vector<const Entry*> order = entries;
    std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) { return a->align > b->align; });
    std::string text;
    try {
        json header = json::object();
        if (!metadata.empty()) header["__metadata__"] = metadata;
        uint64_t offset = 0;
        for (const Entry* e : order) {
            json shape = json::array();
            for (int i = 0; i < e->shape.rank; ++i) shape.push_back(e->shape.dims[i]);
            header[e->name] = {{"dtype", e->foreign_dtype.empty() ? std::string(safetensors_dtype_string(e->dtype))
                                                                  : e->foreign_dtype},
                               {"shape", shape},
                               {"data_offsets", {offset, offset + e->nbytes}}};
            offset += e->nbytes;
        }
        text = header.dump();
    } catch (const json::exception& e) {
        return invalid_argument(path + ": cannot encode header (tensor names and metadata must be UTF-8): " + e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // 8 + len is then a multiple of 8

    const std::string tmp = path + ".partial";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return invalid_argument(tmp + ": cannot create: " + std::strerror(errno));
    auto fail = [&](Status st) {
        std::fclose(f);
        std::error_code ec;
        fs::remove(tmp, ec);
        return st;
    };
    uint8_t len[8];
    write_le64(len, text.size());
    Status st = write_all(f, len, 8, tmp);
    if (st.ok()) st = write_all(f, text.data(), text.size(), tmp);
    for (const Entry* e : order) {
        if (!st.ok()) break;
        if (e->fill) {
            if (scratch.size() < e->nbytes) scratch.resize(e->nbytes);
            std::memset(scratch.data(), 0, e->nbytes);  // a fill that skips bytes writes zeros, not stale data
            e->fill(scratch.data());
            st = write_all(f, scratch.data(), e->nbytes, tmp);
        } else {
            st = write_all(f, e->bytes.data(), e->bytes.size(), tmp);
        }
    }
    if (!st.ok()) return fail(st);
    if (std::fflush(f) != 0) return fail(resource_exhausted(tmp + ": write failed: " + std::strerror(errno)));
    if (std::fclose(f) != 0) {
        std::error_code ec;
        fs::remove(tmp, ec);
        return resource_exhausted(tmp + ": close failed: " + std::strerror(errno));
    }
    return commit_file(tmp, path);
}

Status SafetensorsWriter::write(const std::string& dir, const std::map<std::string, std::string>& metadata,
                                uint64_t max_shard_bytes) {
    return guarded(dir, [&]() -> Status {
        RETURN_IF_ERROR(deferred_);
        std::set<std::string_view> seen;
        for (const auto& e : entries_) {
            if (e.name.empty() || e.name == "__metadata__") {
                return invalid_argument("tensor name " + printable(e.name) + " is not allowed");
            }
            if (!seen.insert(e.name).second) return invalid_argument("tensor " + printable(e.name) + " added twice");
        }
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) return invalid_argument(dir + ": cannot create directory: " + ec.message());
        const fs::path root(dir);

        std::vector<std::vector<const Entry*>> shards(1);
        uint64_t shard_bytes = 0;
        for (const auto& e : entries_) {
            if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + e.nbytes > max_shard_bytes) {
                shards.emplace_back();
                shard_bytes = 0;
            }
            shards.back().push_back(&e);
            shard_bytes += e.nbytes;
        }

        std::vector<uint8_t> scratch;
        const fs::path index_path = root / kSafetensorsIndexFile;
        if (shards.size() == 1) {
            RETURN_IF_ERROR(write_file((root / kSafetensorsSingleFile).string(), shards[0], metadata, scratch));
            if (fs::exists(index_path, ec)) {
                // A stale index beside the file just written: ignored when reading (the single file comes first),
                // but a reader that goes by the index (vLLM) would load it.
                LOG_WARN("removing stale %s", index_path.c_str());
                fs::remove(index_path, ec);
            }
            return ok_status();
        }

        // A stale single file would take precedence over the shards when reading (transformers' order).
        if (const fs::path single = root / kSafetensorsSingleFile; fs::exists(single, ec)) {
            LOG_WARN("removing stale %s", single.c_str());
            fs::remove(single, ec);
        }
        json weight_map = json::object();
        for (size_t i = 0; i < shards.size(); ++i) {
            const std::string name = shard_name(i, shards.size());
            RETURN_IF_ERROR(write_file((root / name).string(), shards[i], metadata, scratch));
            for (const Entry* e : shards[i]) weight_map[e->name] = name;
        }
        json index = {{"metadata", {{"total_size", total_bytes()}}}, {"weight_map", weight_map}};
        const std::string tmp = index_path.string() + ".partial";
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            out << index.dump(2) << "\n";
            out.close();
            if (!out) {
                fs::remove(tmp, ec);
                return resource_exhausted(tmp + ": write failed");
            }
        }
        return commit_file(tmp, index_path.string());
    });
}

}  // namespace gptoss::model
