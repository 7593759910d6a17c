// Fuzz target for the safetensors header parser (STYLE.md rule 18): any input must give either
// tensors whose ranges lie inside the buffer, or an error Status; never a crash, a sanitizer report
// or an exception.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using gptoss::model::SafetensorsFile;
    auto header = SafetensorsFile::parse_header(data, size, "fuzz.safetensors");
    if (!header.ok()) {
        if (header.status().message().empty()) std::abort();  // every error must say what is wrong
        return 0;
    }
    const uint8_t* data_begin = data + header->data_start;
    const uint8_t* end = data + size;
    unsigned sum = 0;
    const std::string* prev_name = nullptr;
    for (const auto& t : header->tensors) {
        if (t.data < data_begin || t.data > end || t.nbytes > static_cast<size_t>(end - t.data)) std::abort();
        const uint64_t bits =
            t.foreign_dtype.empty()
                ? 8 * gptoss::dtype_size(t.dtype)
                : static_cast<uint64_t>(gptoss::model::safetensors_foreign_dtype_bits(t.foreign_dtype));
        if (bits == 0 || static_cast<uint64_t>(t.shape.numel()) * bits != 8 * t.nbytes) std::abort();
        if (t.view().nbytes() != t.nbytes) std::abort();
        // Names are unique and sorted (find() binary-searches them).
        if (prev_name != nullptr && !(*prev_name < t.name)) std::abort();
        prev_name = &t.name;
        // Touch every byte: under ASan an out-of-range view is reported here.
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    }
    volatile unsigned sink = sum;
    (void)sink;
    return 0;
}
