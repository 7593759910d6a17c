// A scan of JSON text before parsing it: nlohmann's values are built, copied and freed recursively (a text of a
// million '[' overflows the stack), and its insertion-ordered objects find each new key by a linear search.
#pragma once

#include <string>
#include <string_view>

namespace gptoss {

// Why JSON text is refused before parsing, or "" when it is within bounds (brackets and colons outside strings,
// stopping at the first excess): nested deeper than depth_limit, or an object with more than member_limit
// members; the message starts with `subject`. Both bound the parser's cost: a body of a million '[' would overflow
// the stack, and n keys of one insertion-ordered object cost n²/2 comparisons (200,000 keys in 1.9 MB took 29 s).
std::string json_shape_error(std::string_view body, int depth_limit, int member_limit,
                             std::string_view subject = "the request body");

}  // namespace gptoss
