#include "harmony/harmony_types.h"

#include <charconv>
#include <cmath>

namespace gptoss::harmony {

std::string json_float_text(double v) {
    if (!std::isfinite(v)) return "null";
    if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
    // The shortest round-trip digits d1 d2 ... dn and the exponent, then ryu's layout (ryu::pretty::format64):
    // with 10^(kk-1) <= |v| < 10^kk and k = kk - n, plain digits up to 16 integer places, "0.000ddd" down to
    // 1e-5, scientific ("1e16", "1.5e-7": no '+', no leading zeros in the exponent) beyond.
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
    if (ec != std::errc()) return "null";
    const std::string_view sci(buf, static_cast<size_t>(end - buf));
    const size_t e = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, e))
        if (c != '.') digits += c;
    int exp10 = 0;
    std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exp10);
    const int n = static_cast<int>(digits.size()), kk = exp10 + 1, k = kk - n;
    std::string out = v < 0 ? "-" : "";
    if (k >= 0 && kk <= 16) {
        out += digits + std::string(static_cast<size_t>(k), '0') + ".0";
    } else if (kk > 0 && kk <= 16) {
        out += digits.substr(0, static_cast<size_t>(kk)) + "." + digits.substr(static_cast<size_t>(kk));
    } else if (kk > -5 && kk <= 0) {
        out += "0." + std::string(static_cast<size_t>(-kk), '0') + digits;
    } else if (n == 1) {
        out += digits + "e" + std::to_string(kk - 1);
    } else {
        out += digits.substr(0, 1) + "." + digits.substr(1) + "e" + std::to_string(kk - 1);
    }
    return out;
}

namespace {

void write_compact(const Json& j, std::string& out) {
    if (j.is_object()) {
        out += '{';
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!first) out += ',';
            first = false;
            out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace);
            out += ':';
            write_compact(it.value(), out);
        }
        out += '}';
    } else if (j.is_array()) {
        out += '[';
        for (size_t i = 0; i < j.size(); ++i) {
            if (i) out += ',';
            write_compact(j[i], out);
        }
        out += ']';
    } else if (j.is_number_float()) {
        out += json_float_text(j.get<double>());
    } else {
        out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
}

}  // namespace

std::string json_compact(const Json& j) {
    std::string out;
    write_compact(j, out);
    return out;
}

std::optional<std::string> special_token_text(int32_t id) {
    if (id < kFirstSpecialId || id >= kVocabEnd) return std::nullopt;
    switch (id) {
        case kStartOfText: return "<|startoftext|>";
        case kEndOfText: return "<|endoftext|>";
        case kReturn: return "<|return|>";
        case kConstrain: return "<|constrain|>";
        case kChannel: return "<|channel|>";
        case kStart: return "<|start|>";
        case kEnd: return "<|end|>";
        case kMessage: return "<|message|>";
        case kCall: return "<|call|>";
        case kEndOfPrompt: return "<|endofprompt|>";
        default: return "<|reserved_" + std::to_string(id) + "|>";
    }
}

std::string_view role_name(Role role) {
    switch (role) {
        case Role::kSystem: return "system";
        case Role::kDeveloper: return "developer";
        case Role::kUser: return "user";
        case Role::kAssistant: return "assistant";
        case Role::kTool: return "tool";
    }
    return "unknown";
}

std::optional<Role> parse_role(std::string_view name) {
    if (name == "system") return Role::kSystem;
    if (name == "developer") return Role::kDeveloper;
    if (name == "user") return Role::kUser;
    if (name == "assistant") return Role::kAssistant;
    if (name == "tool") return Role::kTool;
    return std::nullopt;
}

std::string_view reasoning_effort_name(ReasoningEffort effort) {
    switch (effort) {
        case ReasoningEffort::kLow: return "low";
        case ReasoningEffort::kMedium: return "medium";
        case ReasoningEffort::kHigh: return "high";
    }
    return "medium";
}

ToolNamespace browser_namespace() {
    ToolNamespace ns;
    ns.name = "browser";
    ns.description =
        "Tool for browsing.\n"
        "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
        "Cite information from the tool using the following format:\n"
        "`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\n"
        "Do not quote more than 10 words directly from the tool output.\n"
        "sources=web (default: web)";
    ns.tools.push_back(
        {"search", "Searches for information related to `query` and displays `topn` results.",
         Json::parse(R"({"type":"object","properties":{"query":{"type":"string"},)"
                     R"("topn":{"type":"number","default":10},"source":{"type":"string"}},"required":["query"]})")});
    ns.tools.push_back(
        {"open",
         "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing "
         "`num_lines` lines.\n"
         "Valid link ids are displayed with the formatting: `【{id}†.*】`.\n"
         "If `cursor` is not provided, the most recent page is implied.\n"
         "If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
         "If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered "
         "on the most relevant passage, if available.\n"
         "Use this function without `id` to scroll to a new location of an opened page.",
         Json::parse(R"({"type":"object","properties":{"id":{"type":["number","string"],"default":-1},)"
                     R"("cursor":{"type":"number","default":-1},"loc":{"type":"number","default":-1},)"
                     R"("num_lines":{"type":"number","default":-1},"view_source":{"type":"boolean","default":false},)"
                     R"("source":{"type":"string"}}})")});
    ns.tools.push_back({"find", "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.",
                        Json::parse(R"({"type":"object","properties":{"pattern":{"type":"string"},)"
                                    R"("cursor":{"type":"number","default":-1}},"required":["pattern"]})")});
    return ns;
}

ToolNamespace python_namespace() {
    ToolNamespace ns;
    ns.name = "python";
    ns.description =
        "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. "
        "This tool should be used for internal reasoning, but not for code that is intended to be visible to the "
        "user (e.g. when creating plots, tables, or files).\n\n"
        "When you send a message containing Python code to python, it will be executed in a stateful Jupyter "
        "notebook environment. python will respond with the output of the execution or time out after 120.0 "
        "seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this "
        "session is UNKNOWN. Depends on the cluster.";
    return ns;
}

}  // namespace gptoss::harmony
