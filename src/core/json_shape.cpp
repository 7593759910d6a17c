#include "core/json_shape.h"

#include <vector>

namespace gptoss {

std::string json_shape_error(std::string_view body, int depth_limit, int member_limit, std::string_view subject) {
    std::vector<int> members;  // per open container: members so far (-1 for an array)
    bool in_string = false, escape = false;
    for (char c : body) {
        if (in_string) {
            if (escape) {
                escape = false;
            } else if (c == '\\') {
                escape = true;
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (static_cast<int>(members.size()) >= depth_limit)
                return std::string(subject) + " is nested deeper than " + std::to_string(depth_limit) + " levels";
            members.push_back(c == '{' ? 0 : -1);
        } else if (c == ']' || c == '}') {
            if (!members.empty()) members.pop_back();
        } else if (c == ':' && !members.empty() && members.back() >= 0) {
            if (++members.back() > member_limit)
                return std::string(subject) + " has an object with more than " + std::to_string(member_limit) +
                       " members";
        }
    }
    return "";
}

}  // namespace gptoss
