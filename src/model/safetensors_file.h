// Safetensors reading (mmap'd, validated against hostile input) and writing (streamed, optionally
// sharded with an HF-style index). Format: 8-byte little-endian header length N, N bytes of JSON
// `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}`, then the data;
// offsets count from the first byte after the header. MODEL.md §2.1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gptoss::model {

// Headers larger than this are rejected before parsing (the 120b header is about 100 KB; the HF
// reference implementation uses the same limit).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";
constexpr const char* kSafetensorsSingleFile = "model.safetensors";

// "F32", "BF16", "F16", "F8_E4M3", "U8", "I32", "I64". Anything else is invalid_argument.
StatusOr<DType> safetensors_dtype_from_string(std::string_view s);
std::string_view safetensors_dtype_string(DType dtype);
// The other dtypes of the safetensors format (BOOL, I8, I16, U16, U32, U64, F64, C64, F8_E5M2, F8_E8M0, F4,
// F6_E2M3, F6_E3M2): bits an element, 0 for a string that is not a safetensors dtype at all. A checkpoint may
// hold tensors of these types that the model does not read; they load (and convert copies them) as raw bytes.
int safetensors_foreign_dtype_bits(std::string_view s);

// One tensor inside a mapped file (or inside the buffer given to SafetensorsFile::parse).
struct TensorInfo {
    std::string name;
    DType dtype = DType::kU8;
    Shape shape;
    // The file's dtype when it is none of DType's (safetensors_foreign_dtype_bits): dtype is then kU8 as a
    // placeholder, SafetensorsCheckpoint::get / get_any refuse the tensor, and view() is its raw bytes.
    std::string foreign_dtype;
    // Points into the mapping; valid while the file object lives. Aligned to the element size when
    // the header is padded to 8 bytes and tensors are packed by element size (our writer does both;
    // foreign files may not, so copy with memcpy rather than casting if alignment matters).
    const uint8_t* data = nullptr;
    size_t nbytes = 0;  // == shape.numel() * dtype_size(dtype) (foreign: numel × bits / 8)
    std::string file;   // path of the file that holds it (for error messages)

    TensorView view() const {
        return foreign_dtype.empty() ? TensorView{data, dtype, shape}
                                     : TensorView{data, DType::kU8, Shape{static_cast<int64_t>(nbytes)}};
    }
    std::string dtype_string() const;  // as the file names it
};

// A parsed header: tensors sorted by name, pointing into the buffer that was parsed.
struct SafetensorsHeader {
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;  // __metadata__
    uint64_t data_start = 0;                      // 8 + header length
};

// One .safetensors file, mapped read-only (PROT_READ, MAP_PRIVATE) and unmapped in the destructor.
class SafetensorsFile {
public:
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    // not_found if the file is missing; data_loss / invalid_argument naming the file and the problem
    // for anything malformed.
    static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);

    // Parses and validates the header of a whole file held in memory (`file_size` = total bytes at
    // `bytes`). Every returned range lies inside [bytes, bytes + file_size), ranges do not overlap,
    // and nbytes matches dtype × shape. Never reads outside the buffer, never throws.
    static StatusOr<std::vector<TensorInfo>> parse(const uint8_t* bytes, size_t file_size,
                                                   const std::string& name_for_errors);
    // Same, also returning __metadata__.
    static StatusOr<SafetensorsHeader> parse_header(const uint8_t* bytes, size_t file_size,
                                                    const std::string& name_for_errors);

    const TensorInfo* find(std::string_view name) const;  // nullptr if absent
    const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
    const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
    const std::string& path() const { return path_; }
    size_t file_size() const { return size_; }

private:
    SafetensorsFile() = default;

    std::string path_;
    void* map_ = nullptr;
    size_t size_ = 0;
    SafetensorsHeader header_;
};

// A model directory: model.safetensors if present (with a warning when an index is beside it), else
// model.safetensors.index.json (weight_map: name -> file), else every *.safetensors in the directory. That is
// transformers' order. A broken symbolic link among them is an error that names it.
class SafetensorsCheckpoint {
public:
    // Validates that every weight_map file exists and holds the tensors the index claims; a tensor
    // present in two files is an error.
    static StatusOr<std::unique_ptr<SafetensorsCheckpoint>> open_dir(const std::string& dir);

    const TensorInfo* find(std::string_view name) const;  // nullptr if absent
    std::vector<std::string> names() const;               // sorted
    // Checked access: not_found if missing; invalid_argument naming the tensor with expected vs
    // actual dtype and shape.
    StatusOr<const TensorInfo*> get(std::string_view name, DType dtype, const Shape& shape) const;
    // Same, accepting any of `dtypes` (e.g. BF16, F16 or F32 for dense weights).
    StatusOr<const TensorInfo*> get_any(std::string_view name, std::initializer_list<DType> dtypes,
                                        const Shape& shape) const;
    uint64_t total_bytes() const;  // sum of tensor data bytes
    size_t num_tensors() const { return by_name_.size(); }
    const std::string& dir() const { return dir_; }
    const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

private:
    SafetensorsCheckpoint() = default;
    Status add_file(std::unique_ptr<SafetensorsFile> file);

    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, const TensorInfo*, std::less<>> by_name_;
};

// Builds a checkpoint for `gptoss init-model` and tests. Tensor data is produced one tensor at a
// time while writing, so a 65 GB checkpoint never sits in memory (peak = the largest tensor).
class SafetensorsWriter {
public:
    // Writes the tensor's bytes into `dst` (exactly numel × dtype size bytes).
    using FillFn = std::function<void(uint8_t* dst)>;

    // The byte count must equal numel × dtype size; a mismatch (or a duplicate name) is reported
    // by write().
    void add(std::string name, DType dtype, Shape shape, std::vector<uint8_t> bytes);
    // `fill` runs during write(), once per tensor, into a scratch buffer that is then written out.
    void add_lazy(std::string name, DType dtype, Shape shape, FillFn fill);
    // `t`'s bytes as they are, under its dtype (foreign ones included) and shape; `t` must outlive write().
    void add_copy(const TensorInfo& t);

    // Writes model.safetensors, or, when max_shard_bytes > 0 and the tensors do not fit in one
    // shard, model-0000i-of-0000N.safetensors (1-based, HF's convention) plus
    // model.safetensors.index.json. Shards are filled greedily in insertion order; a tensor larger
    // than max_shard_bytes gets a shard of its own. `metadata` goes into every file's __metadata__.
    // Files are written under a temporary name and renamed when complete.
    Status write(const std::string& dir, const std::map<std::string, std::string>& metadata,
                 uint64_t max_shard_bytes = 0);

    size_t num_tensors() const { return entries_.size(); }
    uint64_t total_bytes() const;

private:
    struct Entry {
        std::string name;
        DType dtype;
        Shape shape;
        uint64_t nbytes;
        std::vector<uint8_t> bytes;  // used when fill is empty
        FillFn fill;
        std::string foreign_dtype;  // add_copy of a foreign tensor: the dtype written (`dtype` unused)
        size_t align = 1;           // bytes an element (at least 1): the order in the file
    };
    Status write_file(const std::string& path, const std::vector<const Entry*>& entries,
                      const std::map<std::string, std::string>& metadata, std::vector<uint8_t>& scratch) const;

    std::vector<Entry> entries_;
    Status deferred_;  // first error from add()/add_lazy(), returned by write()
};

}  // namespace gptoss::model
