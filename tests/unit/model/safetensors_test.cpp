#include "model/safetensors_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace gptoss::model {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr const char* kName = "test.safetensors";

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
public:
    TempDir() {
        static std::atomic<int> counter{0};
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        path_ = fs::temp_directory_path() / ("gptoss_st_" + std::to_string(::getpid()) + "_" +
                                             std::to_string(counter++) + "_" + (info ? info->name() : "x"));
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string str() const { return path_.string(); }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    fs::path path_;
};

// A safetensors file from header text and `data_bytes` bytes of data (byte i = i & 0xff). With
// `pad` the header is padded with spaces to 8-byte alignment, as the spec asks.
Bytes make_file(std::string header, size_t data_bytes, bool pad = true) {
    if (pad) header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t n = header.size();
    Bytes b(8 + n + data_bytes);
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
    if (n > 0) std::memcpy(b.data() + 8, header.data(), n);
    for (size_t i = 0; i < data_bytes; ++i) b[8 + n + i] = static_cast<uint8_t>(i);
    return b;
}

Bytes with_length(uint64_t header_len, size_t total) {
    Bytes b(total, ' ');
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(header_len >> (8 * i));
    return b;
}

StatusOr<std::vector<TensorInfo>> parse(const Bytes& b) { return SafetensorsFile::parse(b.data(), b.size(), kName); }

// Every malformed input gives one error whose message names the file and contains `what`.
void expect_error(const Bytes& b, const std::string& what, StatusCode code = StatusCode::kDataLoss) {
    auto r = parse(b);
    ASSERT_FALSE(r.ok()) << "expected an error containing: " << what;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(kName), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
}

void write_bytes(const std::string& path, const Bytes& b) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes iota_bytes(size_t n, uint8_t start = 0) {
    Bytes b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + i);
    return b;
}

// ---- valid inputs ---------------------------------------------------------------------------

TEST(SafetensorsParse, ValidFileGivesTensorsSortedByName) {
    Bytes b = make_file(R"({"b":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                        R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"pt"}})",
                        22);
    auto r = parse(b);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->size(), 2u);
    const TensorInfo& a = (*r)[0];
    const TensorInfo& bt = (*r)[1];
    EXPECT_EQ(a.name, "a");
    EXPECT_EQ(a.dtype, DType::kBF16);
    EXPECT_EQ(a.shape, (Shape{3}));
    EXPECT_EQ(a.nbytes, 6u);
    EXPECT_EQ(a.file, kName);
    EXPECT_EQ(bt.name, "b");
    EXPECT_EQ(bt.shape, (Shape{2, 2}));
    const size_t data_start = b.size() - 22;
    EXPECT_EQ(bt.data, b.data() + data_start);
    EXPECT_EQ(a.data, b.data() + data_start + 16);
    TensorView v = a.view();
    EXPECT_EQ(v.data, a.data);
    EXPECT_EQ(v.nbytes(), 6u);
}

TEST(SafetensorsParse, AcceptsUnpaddedHeader) {
    std::string h = R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
    ASSERT_NE((8 + h.size()) % 8, 0u);
    Bytes b = make_file(h, 3, /*pad=*/false);  // outlives r, whose tensors point into it
    auto r = parse(b);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)[0].data[2], 2);
}

TEST(SafetensorsParse, AcceptsGapsBetweenTensors) {
    auto r = parse(make_file(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("y":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                             8));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
}

// The data region must end where the last tensor does: trailing bytes, or a header length a few bytes short
// (the header's padding spaces let the JSON parse, and every tensor then starts that many bytes early), are
// refused (they loaded as shifted weights: NaN logits, exit 0).
TEST(SafetensorsParse, RejectsADataRegionLongerThanItsTensors) {
    const std::string h = R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
    auto trailing = parse(make_file(h, 5));
    ASSERT_FALSE(trailing.ok());
    EXPECT_NE(trailing.status().message().find("the tensors end at 3"), std::string::npos)
        << trailing.status().message();
    Bytes b = make_file(h, 3);  // padded header
    ASSERT_TRUE(parse(b).ok());
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[i]) << (8 * i);
    ASSERT_GT(n, h.size());  // the padding this needs
    const uint64_t shorter = n - 1;
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(shorter >> (8 * i));
    EXPECT_FALSE(parse(b).ok());
}

TEST(SafetensorsParse, AcceptsScalarsEmptyTensorsAndEmptyHeader) {
    auto r = parse(make_file(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F32","shape":[0,7],"data_offsets":[8,8]},)"
                             R"("e2":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                             8));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->size(), 3u);
    auto empty = parse(make_file("{}", 0));
    ASSERT_TRUE(empty.ok()) << empty.status().to_string();
    EXPECT_TRUE(empty->empty());
}

TEST(SafetensorsParse, AllSupportedDtypes) {
    const std::pair<const char*, DType> kTypes[] = {
        {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16}, {"F8_E4M3", DType::kFP8E4M3},
        {"U8", DType::kU8},   {"I32", DType::kI32},   {"I64", DType::kI64}};
    for (const auto& [s, d] : kTypes) {
        size_t n = 3 * dtype_size(d);
        auto r = parse(make_file(
            std::string(R"({"t":{"dtype":")") + s + R"(","shape":[3],"data_offsets":[0,)" + std::to_string(n) + "]}}",
            n));
        ASSERT_TRUE(r.ok()) << s << ": " << r.status().to_string();
        EXPECT_EQ((*r)[0].dtype, d);
        EXPECT_EQ(safetensors_dtype_string(d), s);
    }
}

TEST(SafetensorsParse, MetadataIsReturned) {
    Bytes b = make_file(R"({"__metadata__":{"format":"pt","k":"v"}})", 0);
    auto h = SafetensorsFile::parse_header(b.data(), b.size(), kName);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_EQ(h->metadata.at("format"), "pt");
    EXPECT_EQ(h->metadata.at("k"), "v");
    EXPECT_EQ(h->data_start, b.size());
}

// ---- malformed inputs: one test per case --------------------------------------------------------

TEST(SafetensorsParse, RejectsFileShorterThan8Bytes) {
    expect_error(Bytes{1, 2, 3, 4, 5}, "shorter than the 8-byte header length");
    expect_error(Bytes{}, "file is 0 bytes");
}

TEST(SafetensorsParse, RejectsHeaderLengthPastEndOfFile) {
    expect_error(with_length(1000, 64), "header length 1000 runs past the end of the file (64 bytes)");
}

TEST(SafetensorsParse, RejectsAbsurdHeaderLength) {
    expect_error(with_length(1ull << 40, 64), "exceeds the limit");
    expect_error(with_length(~0ull, 64), "exceeds the limit");
    // Just over 100 MB: rejected before looking at the file size.
    expect_error(with_length(kMaxSafetensorsHeaderBytes + 1, 64), "exceeds the limit of 104857600 bytes");
}

TEST(SafetensorsParse, RejectsInvalidJson) {
    expect_error(make_file(R"({"a": {"dtype": )", 0), "header: not valid JSON");
    expect_error(make_file("", 0), "header: not valid JSON");
    Bytes nul = make_file(R"({"a":1})", 0);
    nul[9] = 0;  // a NUL inside the header text
    expect_error(nul, "not valid JSON");
}

TEST(SafetensorsParse, RejectsHeaderThatIsNotAnObject) {
    expect_error(make_file("[1,2,3]", 0), "header is a JSON array, expected an object");
    expect_error(make_file("42", 0), "header is a JSON number, expected an object");
}

TEST(SafetensorsParse, RejectsEntryThatIsNotAnObject) {
    expect_error(make_file(R"({"a":[1,2]})", 0), "tensor 'a': entry is a JSON array, expected an object");
}

TEST(SafetensorsParse, RejectsMissingDtype) {
    expect_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1), "tensor 'a': missing 'dtype'");
}

TEST(SafetensorsParse, RejectsMissingShape) {
    expect_error(make_file(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", 1), "tensor 'a': missing 'shape'");
}

TEST(SafetensorsParse, RejectsMissingDataOffsets) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "tensor 'a': missing 'data_offsets'");
}

TEST(SafetensorsParse, RejectsWrongJsonTypes) {
    expect_error(make_file(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
                 "'dtype' is a JSON number, expected a string");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 1),
                 "'shape' is a JSON string, expected an array");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":{"b":0}}})", 1),
                 "expected [begin, end] as non-negative integers");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                 "expected [begin, end] as non-negative integers");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":["0",1]}})", 1),
                 "expected [begin, end] as non-negative integers");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1),
                 "expected [begin, end] as non-negative integers");
}

TEST(SafetensorsParse, RejectsNegativeDimension) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[2,-3],"data_offsets":[0,6]}})", 6),
                 "shape dimension 1 is -3, expected a non-negative integer");
}

TEST(SafetensorsParse, RejectsNonIntegerDimension) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2),
                 "shape dimension 0 is 2.5, expected a non-negative integer");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2),
                 "shape dimension 0 is \"2\"");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,2]}})", 2),
                 "shape dimension 0 is 18446744073709551615");
}

TEST(SafetensorsParse, RejectsShapeProductOverflow) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
                 "overflows");
    // numel fits but numel × 8 bytes does not.
    expect_error(make_file(R"({"a":{"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0),
                 "overflows");
    // A zero dimension does not hide an overflow in the others.
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296,0],)"
                           R"("data_offsets":[0,0]}})",
                           0),
                 "overflows");
}

TEST(SafetensorsParse, RejectsOffsetsBeginAfterEnd) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8),
                 "data_offsets begin 4 > end 2");
}

TEST(SafetensorsParse, RejectsOffsetsPastDataRegion) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 8),
                 "data_offsets end 12 is past the end of the data region (8 bytes after the header)");
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,)"
                           R"(9223372036854775807]}})",
                           8),
                 "past the end of the data region");
}

TEST(SafetensorsParse, RejectsByteSizeMismatch) {
    expect_error(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16),
                 "data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12");
}

TEST(SafetensorsParse, RejectsOverlappingTensors) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                           16),
                 "tensors 'a' [0, 8) and 'b' [6, 10) overlap");
    // The same range twice.
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                           4),
                 "overlap");
}

TEST(SafetensorsParse, RejectsDuplicateTensorNames) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2),
                 "duplicate name 'a'");
}

TEST(SafetensorsParse, RejectsDuplicateKeysInsideAnEntry) {
    expect_error(make_file(R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1),
                 "duplicate key 'dtype'");
}

TEST(SafetensorsParse, RejectsStringsThatAreNoDtype) {
    for (const char* d : {"u8", "", "F128", "float32", "F8_E4M3 "}) {
        expect_error(make_file(std::string(R"({"w":{"dtype":")") + d + R"(","shape":[1],"data_offsets":[0,1]}})", 8),
                     std::string("unsupported dtype '") + d + "' for tensor 'w'", StatusCode::kInvalidArgument);
    }
}

// The format's other dtypes load as raw bytes of the right size (a checkpoint may carry tensors the model does not
// read); reading one as a model tensor is refused by name.
TEST(SafetensorsParse, CarriesForeignDtypesAsRawBytes) {
    const std::tuple<const char*, const char*, size_t> kTypes[] = {
        {"F64", "[2,3]", 48},  {"BOOL", "[5]", 5},    {"I8", "[3]", 3},   {"I16", "[3]", 6},
        {"U16", "[3]", 6},     {"U32", "[2]", 8},     {"U64", "[2]", 16}, {"C64", "[1]", 8},
        {"F8_E5M2", "[7]", 7}, {"F8_E8M0", "[4]", 4}, {"F4", "[2,3]", 3}, {"F6_E2M3", "[4]", 3},
        {"F6_E3M2", "[8]", 6}, {"F64", "[0]", 0}};
    for (const auto& [d, shape, n] : kTypes) {
        Bytes b = make_file(std::string(R"({"w":{"dtype":")") + d + R"(","shape":)" + shape + R"(,"data_offsets":[0,)" +
                                std::to_string(n) + "]}}",
                            n);
        auto r = parse(b);
        ASSERT_TRUE(r.ok()) << d << ": " << r.status().to_string();
        const TensorInfo& t = (*r)[0];
        EXPECT_EQ(t.nbytes, n) << d;
        EXPECT_EQ(t.foreign_dtype, d);
        EXPECT_EQ(t.dtype_string(), d);
        EXPECT_EQ(t.view().nbytes(), n) << d;
    }
    // Sub-byte types must fill whole bytes; sizes are still checked.
    expect_error(make_file(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
                 "F4 [3] is not a whole number of bytes");
    expect_error(make_file(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 8),
                 "hold 8 bytes but F64 [2] needs 16");
}

TEST(SafetensorsParse, RejectsRankAboveEight) {
    expect_error(make_file(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
                 "tensor 'a': rank 9 is not supported (at most 8 dimensions)", StatusCode::kInvalidArgument);
    auto r = parse(make_file(R"({"a":{"dtype":"F64","shape":[1,2,1,1,1,1,1,3],"data_offsets":[0,48]}})", 48));
    ASSERT_TRUE(r.ok()) << r.status().to_string();  // rank 8 of a foreign dtype: an unread extra, carried
    EXPECT_EQ((*r)[0].shape.rank, 8);
    EXPECT_EQ((*r)[0].nbytes, 48u);
}

TEST(SafetensorsParse, RejectsNonStringMetadata) {
    expect_error(make_file(R"({"__metadata__":{"n":1}})", 0), "__metadata__ value for 'n' is a JSON number");
    expect_error(make_file(R"({"__metadata__":[1]})", 0), "__metadata__ is a JSON array");
}

TEST(SafetensorsParse, RejectsDeepNesting) {
    std::string deep = R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
    expect_error(make_file(deep, 0), "JSON nests deeper than 8 levels");
}

TEST(SafetensorsParse, HostileNamesArePrintedEscaped) {
    auto r = parse(make_file("{\"a\\u0001b\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'a\\x01b'"), std::string::npos) << r.status().message();
}

// ---- SafetensorsFile::open ----------------------------------------------------------------------

TEST(SafetensorsFileOpen, MapsAndFinds) {
    TempDir dir;
    SafetensorsWriter w;
    w.add("x", DType::kF32, Shape{2}, iota_bytes(8, 10));
    w.add("y", DType::kU8, Shape{3}, iota_bytes(3, 100));
    ASSERT_TRUE(w.write(dir.str(), {{"format", "pt"}}).ok());
    auto f = SafetensorsFile::open(dir.file("model.safetensors"));
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const SafetensorsFile& file = **f;
    EXPECT_EQ(file.metadata().at("format"), "pt");
    ASSERT_EQ(file.tensors().size(), 2u);
    const TensorInfo* x = file.find("x");
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(std::memcmp(x->data, iota_bytes(8, 10).data(), 8), 0);
    EXPECT_EQ(x->file, dir.file("model.safetensors"));
    EXPECT_EQ(file.find("z"), nullptr);
    EXPECT_EQ(file.find("y")->data[2], 102);
}

TEST(SafetensorsFileOpen, MissingFileIsNotFound) {
    TempDir dir;
    auto f = SafetensorsFile::open(dir.file("nope.safetensors"));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
    EXPECT_NE(f.status().message().find("nope.safetensors"), std::string::npos);
}

TEST(SafetensorsFileOpen, EmptyAndDirectoryAreErrors) {
    TempDir dir;
    write_bytes(dir.file("empty.safetensors"), {});
    auto e = SafetensorsFile::open(dir.file("empty.safetensors"));
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("empty.safetensors: file is 0 bytes"), std::string::npos)
        << e.status().message();
    auto d = SafetensorsFile::open(dir.str());
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos) << d.status().message();
    // A FIFO must not block the open.
    ASSERT_EQ(::mkfifo(dir.file("fifo.safetensors").c_str(), 0600), 0);
    auto p = SafetensorsFile::open(dir.file("fifo.safetensors"));
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("not a regular file"), std::string::npos) << p.status().message();
}

TEST(SafetensorsFileOpen, CorruptFileNamesThePath) {
    TempDir dir;
    write_bytes(dir.file("bad.safetensors"), with_length(500, 20));
    auto f = SafetensorsFile::open(dir.file("bad.safetensors"));
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.status().message().find(dir.file("bad.safetensors") + ": header length 500"), std::string::npos)
        << f.status().message();
}

// ---- SafetensorsWriter --------------------------------------------------------------------------

TEST(SafetensorsWriter, HeaderIsAlignedAndTensorsAreNaturallyAligned) {
    TempDir dir;
    SafetensorsWriter w;
    w.add("odd_bytes", DType::kU8, Shape{3}, iota_bytes(3));
    w.add("f32", DType::kF32, Shape{2, 3}, iota_bytes(24));
    w.add("bf16", DType::kBF16, Shape{5}, iota_bytes(10));
    w.add("i64", DType::kI64, Shape{1}, iota_bytes(8));
    ASSERT_TRUE(w.write(dir.str(), {}).ok());
    auto f = SafetensorsFile::open(dir.file("model.safetensors"));
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const uint8_t* base = (*f)->find("i64")->data;  // 8-byte elements go first: the start of the data
    for (const auto& t : (*f)->tensors()) {
        EXPECT_GE(t.data, base) << t.name;
        EXPECT_EQ(static_cast<size_t>(t.data - base) % dtype_size(t.dtype), 0u) << t.name;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << t.name;
    }
    // 8 + header length is a multiple of 8, and the tensors are packed with no gaps (HF's reader
    // rejects gaps).
    std::ifstream in(dir.file("model.safetensors"), std::ios::binary);
    uint8_t len[8];
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(fs::file_size(dir.file("model.safetensors")), 8 + n + 3 + 24 + 10 + 8);
}

TEST(SafetensorsWriter, LazyTensorsAreFilledOncePerWrite) {
    TempDir dir;
    SafetensorsWriter w;
    int calls = 0;
    w.add_lazy("big", DType::kBF16, Shape{4, 1024}, [&calls](uint8_t* dst) {
        ++calls;
        for (int i = 0; i < 8192; ++i) dst[i] = static_cast<uint8_t>(i * 7);
    });
    w.add_lazy("small", DType::kU8, Shape{2}, [](uint8_t* dst) { dst[1] = 9; });  // dst[0] left as zero
    EXPECT_EQ(w.total_bytes(), 8194u);
    ASSERT_TRUE(w.write(dir.str(), {}).ok());
    EXPECT_EQ(calls, 1);
    auto f = SafetensorsFile::open(dir.file("model.safetensors"));
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const TensorInfo* big = (*f)->find("big");
    for (int i = 0; i < 8192; ++i) ASSERT_EQ(big->data[i], static_cast<uint8_t>(i * 7)) << i;
    EXPECT_EQ((*f)->find("small")->data[0], 0);
    EXPECT_EQ((*f)->find("small")->data[1], 9);
}

TEST(SafetensorsWriter, RejectsWrongByteCount) {
    TempDir dir;
    SafetensorsWriter w;
    w.add("w", DType::kF32, Shape{3}, iota_bytes(11));
    Status st = w.write(dir.str(), {});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("tensor 'w': 11 bytes given but F32 [3] needs 12"), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
}

TEST(SafetensorsWriter, RejectsDuplicateAndReservedNames) {
    TempDir dir;
    SafetensorsWriter w;
    w.add("w", DType::kU8, Shape{1}, iota_bytes(1));
    w.add("w", DType::kU8, Shape{1}, iota_bytes(1));
    Status st = w.write(dir.str(), {});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("tensor 'w' added twice"), std::string::npos) << st.message();
    SafetensorsWriter w2;
    w2.add("__metadata__", DType::kU8, Shape{1}, iota_bytes(1));
    EXPECT_FALSE(w2.write(dir.str(), {}).ok());
}

TEST(SafetensorsWriter, RejectsNegativeDimension) {
    TempDir dir;
    SafetensorsWriter w;
    Shape s;
    s.rank = 1;
    s.dims[0] = -2;
    w.add_lazy("w", DType::kU8, s, [](uint8_t*) {});
    Status st = w.write(dir.str(), {});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("negative dimension"), std::string::npos) << st.message();
}

TEST(SafetensorsWriter, ShardsWithIndexAndHfFileNames) {
    TempDir dir;
    SafetensorsWriter w;
    for (int i = 0; i < 5; ++i)
        w.add(std::string("t").append(std::to_string(i)), DType::kU8, Shape{100}, iota_bytes(100, uint8_t(i)));
    ASSERT_TRUE(w.write(dir.str(), {{"format", "pt"}}, /*max_shard_bytes=*/250).ok());
    // Greedy: [t0 t1] [t2 t3] [t4].
    EXPECT_TRUE(fs::exists(dir.file("model-00001-of-00003.safetensors")));
    EXPECT_TRUE(fs::exists(dir.file("model-00002-of-00003.safetensors")));
    EXPECT_TRUE(fs::exists(dir.file("model-00003-of-00003.safetensors")));
    EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
    std::ifstream in(dir.file("model.safetensors.index.json"));
    auto index = nlohmann::json::parse(in);
    EXPECT_EQ(index["metadata"]["total_size"], 500);
    EXPECT_EQ(index["weight_map"]["t3"], "model-00002-of-00003.safetensors");
    EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");

    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->num_tensors(), 5u);
    EXPECT_EQ((*ck)->total_bytes(), 500u);
    EXPECT_EQ((*ck)->files().size(), 3u);
    EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"t0", "t1", "t2", "t3", "t4"}));
    EXPECT_EQ((*ck)->find("t3")->data[0], 3);
    EXPECT_EQ((*ck)->find("t3")->file, dir.file("model-00002-of-00003.safetensors"));
    EXPECT_EQ((*ck)->files()[0]->metadata().at("format"), "pt");
}

TEST(SafetensorsWriter, EverythingFitsGivesOneFileAndRemovesStaleIndex) {
    TempDir dir;
    SafetensorsWriter big;
    big.add("a", DType::kU8, Shape{10}, iota_bytes(10));
    big.add("b", DType::kU8, Shape{10}, iota_bytes(10));
    ASSERT_TRUE(big.write(dir.str(), {}, 10).ok());
    ASSERT_TRUE(fs::exists(dir.file("model.safetensors.index.json")));
    SafetensorsWriter w;
    w.add("c", DType::kU8, Shape{10}, iota_bytes(10));
    ASSERT_TRUE(w.write(dir.str(), {}, 1000).ok());
    EXPECT_TRUE(fs::exists(dir.file("model.safetensors")));
    EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->names(), std::vector<std::string>{"c"});
}

// ---- SafetensorsCheckpoint ----------------------------------------------------------------------

// Writes a one-file checkpoint with the given tensors (U8 [n]) under `name`.
void write_shard(const std::string& path, const std::vector<std::pair<std::string, int>>& tensors) {
    SafetensorsWriter w;
    for (const auto& [n, size] : tensors) w.add(n, DType::kU8, Shape{size}, iota_bytes(static_cast<size_t>(size)));
    TempDir tmp;
    ASSERT_TRUE(w.write(tmp.str(), {}).ok());
    fs::copy_file(tmp.file("model.safetensors"), path);
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
}

TEST(SafetensorsCheckpoint, ReadsPublishedOffByOneShardNamesThroughIndex) {
    // The published 20b has model-00000-of-00002 .. model-00002-of-00002 (3 files); MODEL.md §2.1.
    TempDir dir;
    write_shard(dir.file("model-00000-of-00002.safetensors"), {{"a", 4}});
    write_shard(dir.file("model-00001-of-00002.safetensors"), {{"b", 4}, {"c", 2}});
    write_shard(dir.file("model-00002-of-00002.safetensors"), {{"d", 1}});
    write_text(dir.file("model.safetensors.index.json"), R"({"metadata":{"total_size":11},"weight_map":{
        "a":"model-00000-of-00002.safetensors","b":"model-00001-of-00002.safetensors",
        "c":"model-00001-of-00002.safetensors","d":"model-00002-of-00002.safetensors"}})");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"a", "b", "c", "d"}));
    EXPECT_EQ((*ck)->total_bytes(), 11u);
}

TEST(SafetensorsCheckpoint, ReadsEverySafetensorsFileWithoutIndex) {
    TempDir dir;
    write_shard(dir.file("one.safetensors"), {{"a", 4}});
    write_shard(dir.file("two.safetensors"), {{"b", 4}});
    write_text(dir.file("notes.txt"), "not a shard");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"a", "b"}));
}

TEST(SafetensorsCheckpoint, TensorInTwoFilesIsAnError) {
    TempDir dir;
    write_shard(dir.file("one.safetensors"), {{"a", 4}});
    write_shard(dir.file("two.safetensors"), {{"a", 4}});
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(ck.ok());
    EXPECT_NE(ck.status().message().find("tensor 'a' is in both"), std::string::npos) << ck.status().message();
}

// model.safetensors beside an index: the single file is loaded (transformers' order; the index was), a writer's
// shards replace a stale single file, "./x" in the index is the file x, and a broken link is named as one.
TEST(SafetensorsCheckpoint, SingleFileFirstDotSlashShardsAndBrokenLinks) {
    TempDir dir;
    write_shard(dir.file("s1.safetensors"), {{"a", 4}});
    write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"./s1.safetensors"}})");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();  // "./s1" and "s1" were "in both"
    EXPECT_EQ((*ck)->names(), std::vector<std::string>{"a"});
    write_shard(dir.file("model.safetensors"), {{"z", 2}});
    ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->names(), std::vector<std::string>{"z"});

    SafetensorsWriter w;
    w.add("p", DType::kU8, Shape{10}, iota_bytes(10));
    w.add("q", DType::kU8, Shape{10}, iota_bytes(10));
    ASSERT_TRUE(w.write(dir.str(), {}, 10).ok());
    EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
    ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"p", "q"}));

    for (const char* link : {"model.safetensors", "model-00001-of-00002.safetensors"}) {
        TempDir d2;
        if (std::string(link) != "model.safetensors") {
            write_shard(d2.file("model-00002-of-00002.safetensors"), {{"b", 4}});
            write_text(
                d2.file("model.safetensors.index.json"),
                R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
        }
        fs::create_symlink(d2.file("blobs/gone"), d2.file(link));
        auto bad = SafetensorsCheckpoint::open_dir(d2.str());
        ASSERT_FALSE(bad.ok()) << link;
        EXPECT_NE(bad.status().message().find(std::string(link) + " is a broken symbolic link"), std::string::npos)
            << bad.status().message();
    }
    TempDir d3;  // without an index, a broken shard link was skipped: the error named a missing tensor
    write_shard(d3.file("one.safetensors"), {{"a", 4}});
    fs::create_symlink(d3.file("gone"), d3.file("two.safetensors"));
    auto bad = SafetensorsCheckpoint::open_dir(d3.str());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("two.safetensors is a broken symbolic link"), std::string::npos)
        << bad.status().message();
}

TEST(SafetensorsCheckpoint, IndexNamingMissingFileIsNotFound) {
    TempDir dir;
    write_shard(dir.file("s1.safetensors"), {{"a", 4}});
    write_text(dir.file("model.safetensors.index.json"),
               R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(ck.ok());
    EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
    EXPECT_NE(ck.status().message().find("lists s2.safetensors but"), std::string::npos) << ck.status().message();
}

TEST(SafetensorsCheckpoint, IndexClaimingAbsentTensorIsAnError) {
    TempDir dir;
    write_shard(dir.file("s1.safetensors"), {{"a", 4}});
    write_text(dir.file("model.safetensors.index.json"),
               R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(ck.ok());
    EXPECT_NE(ck.status().message().find("puts tensor 'ghost' in"), std::string::npos) << ck.status().message();
    EXPECT_NE(ck.status().message().find("which does not hold it"), std::string::npos) << ck.status().message();
}

TEST(SafetensorsCheckpoint, IndexPointingAtWrongShardIsAnError) {
    TempDir dir;
    write_shard(dir.file("s1.safetensors"), {{"a", 4}});
    write_shard(dir.file("s2.safetensors"), {{"b", 4}});
    write_text(dir.file("model.safetensors.index.json"),
               R"({"weight_map":{"a":"s2.safetensors","b":"s1.safetensors"}})");
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(ck.ok());
    EXPECT_NE(ck.status().message().find("but it is in"), std::string::npos) << ck.status().message();
}

TEST(SafetensorsCheckpoint, MalformedIndexIsAnError) {
    TempDir dir;
    write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"x","a":"y"}})");
    auto dup = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(dup.ok());
    EXPECT_NE(dup.status().message().find("duplicate key 'a'"), std::string::npos) << dup.status().message();
    write_text(dir.file("model.safetensors.index.json"), R"({"metadata":{}})");
    auto none = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().message().find("missing 'weight_map' object"), std::string::npos);
    write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":3}})");
    auto type = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(type.ok());
    EXPECT_NE(type.status().message().find("expected a file name"), std::string::npos);
}

TEST(SafetensorsCheckpoint, IndexMayNotLeaveTheDirectory) {
    TempDir dir;
    for (const char* f : {"../x.safetensors", "/etc/passwd", ""}) {
        write_text(dir.file("model.safetensors.index.json"), std::string(R"({"weight_map":{"a":")") + f + R"("}})");
        auto ck = SafetensorsCheckpoint::open_dir(dir.str());
        ASSERT_FALSE(ck.ok()) << f;
        EXPECT_NE(ck.status().message().find("must be a relative path inside the model directory"), std::string::npos)
            << ck.status().message();
    }
}

TEST(SafetensorsCheckpoint, EmptyOrMissingDirectoryIsNotFound) {
    TempDir dir;
    auto empty = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
    EXPECT_NE(empty.status().message().find("no model.safetensors.index.json"), std::string::npos);
    auto missing = SafetensorsCheckpoint::open_dir(dir.file("does_not_exist"));
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsCheckpoint, CorruptShardErrorNamesTheShard) {
    TempDir dir;
    write_bytes(dir.file("model.safetensors"),
                make_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16));
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_FALSE(ck.ok());
    EXPECT_NE(ck.status().message().find(dir.file("model.safetensors") + ": unsupported dtype 'F128' for tensor 'a'"),
              std::string::npos)
        << ck.status().message();
}

// A foreign dtype's placeholder (U8) never passes for a U8 tensor; add_copy writes it back under its own dtype,
// byte for byte, beside ordinary tensors.
TEST(SafetensorsCheckpoint, ForeignDtypesAreRefusedByGetAndCopiedWhole) {
    TempDir src, dst;
    Bytes b = make_file(R"({"flags":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},)"
                        R"("d":{"dtype":"F64","shape":[2],"data_offsets":[8,24]}})",
                        24);
    for (size_t i = b.size() - 24; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 7 + 1);
    write_bytes(src.file("model.safetensors"), b);
    auto ck = SafetensorsCheckpoint::open_dir(src.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    auto as_u8 = (*ck)->get("flags", DType::kU8, Shape{3});
    ASSERT_FALSE(as_u8.ok());
    EXPECT_NE(as_u8.status().message().find("expected U8 [3], got BOOL [3]"), std::string::npos)
        << as_u8.status().message();
    EXPECT_FALSE((*ck)->get_any("d", {DType::kF32, DType::kU8}, Shape{2}).ok());
    EXPECT_EQ((*ck)->total_bytes(), 19u);

    SafetensorsWriter w;
    w.add("n", DType::kF32, Shape{1}, iota_bytes(4));
    for (const std::string& name : (*ck)->names()) w.add_copy(*(*ck)->find(name));
    ASSERT_TRUE(w.write(dst.str(), {}).ok());
    auto back = SafetensorsCheckpoint::open_dir(dst.str());
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    for (const std::string& name : (*ck)->names()) {
        const TensorInfo* x = (*ck)->find(name);
        const TensorInfo* y = (*back)->find(name);
        ASSERT_NE(y, nullptr) << name;
        EXPECT_EQ(y->dtype_string(), x->dtype_string());
        EXPECT_TRUE(y->shape == x->shape) << name;
        ASSERT_EQ(y->nbytes, x->nbytes);
        EXPECT_EQ(std::memcmp(y->data, x->data, x->nbytes), 0) << name;
        // The writer packs by element size: the F64 tensor starts 8-byte aligned (the mapping is page-aligned).
        if (name == "d") {
            EXPECT_EQ(reinterpret_cast<uintptr_t>(y->data) % 8, 0u);
        }
    }
    auto n = (*back)->get("n", DType::kF32, Shape{1});
    EXPECT_TRUE(n.ok());
}

TEST(SafetensorsCheckpoint, CheckedGet) {
    TempDir dir;
    SafetensorsWriter w;
    w.add("model.norm.weight", DType::kBF16, Shape{2, 3}, iota_bytes(12));
    ASSERT_TRUE(w.write(dir.str(), {}).ok());
    auto ck = SafetensorsCheckpoint::open_dir(dir.str());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const SafetensorsCheckpoint& c = **ck;

    auto good = c.get("model.norm.weight", DType::kBF16, Shape{2, 3});
    ASSERT_TRUE(good.ok()) << good.status().to_string();
    EXPECT_EQ((*good)->nbytes, 12u);

    auto missing = c.get("lm_head.weight", DType::kBF16, Shape{2, 3});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("tensor 'lm_head.weight' not found"), std::string::npos);

    auto dtype = c.get("model.norm.weight", DType::kF32, Shape{2, 3});
    ASSERT_FALSE(dtype.ok());
    EXPECT_EQ(dtype.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dtype.status().message().find("tensor 'model.norm.weight'"), std::string::npos);
    EXPECT_NE(dtype.status().message().find("expected F32 [2, 3], got BF16 [2, 3]"), std::string::npos)
        << dtype.status().message();

    auto shape = c.get("model.norm.weight", DType::kBF16, Shape{3, 2});
    ASSERT_FALSE(shape.ok());
    EXPECT_NE(shape.status().message().find("expected BF16 [3, 2], got BF16 [2, 3]"), std::string::npos)
        << shape.status().message();

    auto any = c.get_any("model.norm.weight", {DType::kF32, DType::kBF16, DType::kF16}, Shape{2, 3});
    ASSERT_TRUE(any.ok()) << any.status().to_string();
    auto any_bad = c.get_any("model.norm.weight", {DType::kF32, DType::kF16}, Shape{2, 3});
    ASSERT_FALSE(any_bad.ok());
    EXPECT_NE(any_bad.status().message().find("expected F32|F16 [2, 3], got BF16 [2, 3]"), std::string::npos)
        << any_bad.status().message();
}

}  // namespace
}  // namespace gptoss::model
