#include "harmony/harmony_render.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::harmony {
namespace {

constexpr int kMaxSchemaDepth = 64;

const Json* get(const Json& j, const char* key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
}

const std::string* get_string(const Json& j, const char* key) {
    const Json* v = get(j, key);
    return v != nullptr && v->is_string() ? v->get_ptr<const std::string*>() : nullptr;
}

bool get_bool(const Json& j, const char* key) {
    const Json* v = get(j, key);
    return v != nullptr && v->is_boolean() && v->get<bool>();
}

// Compact JSON, as serde_json's Display writes it (json_compact).
std::string compact(const Json& j) { return json_compact(j); }

bool is_enum(const Json& schema) {
    const Json* e = get(schema, "enum");
    return e != nullptr && e->is_array() && !e->empty();
}

// "default: ..." for a property; `quote_enum_strings` is the top-level oneOf variant form, where a
// string default next to an enum is written as JSON (quoted) rather than bare.
std::string default_comment(const Json& schema, const Json& d, bool quote_enum_strings) {
    if (d.is_string()) {
        const std::string& s = d.get_ref<const std::string&>();
        if (!is_enum(schema)) return "default: \"" + s + "\"";
        if (!quote_enum_strings) return "default: " + s;
    }
    return "default: " + compact(d);
}

std::string with_nullable(const Json& schema, std::string type_text) {
    if (get_bool(schema, "nullable") && type_text.find("null") == std::string::npos) type_text += " | null";
    return type_text;
}

std::string ts(const Json& schema, const std::string& indent, int depth);

std::string ts_object(const Json& schema, const std::string& indent, int depth) {
    std::string out;
    if (const std::string* desc = get_string(schema, "description")) out += indent + "// " + *desc + "\n";
    out += "{\n";
    const Json* props = get(schema, "properties");
    if (props != nullptr && props->is_object()) {
        std::unordered_set<std::string> required;
        if (const Json* req = get(schema, "required"); req != nullptr && req->is_array()) {
            for (const Json& r : *req) {
                if (r.is_string()) required.insert(r.get<std::string>());
            }
        }
        for (const auto& [key, val] : props->items()) {
            const char* opt = required.count(key) != 0 ? "" : "?";
            if (const std::string* title = get_string(val, "title")) {
                out += indent + "// " + *title + "\n" + indent + "//\n";
            }
            const Json* one_of = get(val, "oneOf");
            if (one_of == nullptr) {
                if (const std::string* desc = get_string(val, "description")) out += indent + "// " + *desc + "\n";
            }
            if (const Json* examples = get(val, "examples"); examples != nullptr && examples->is_array()) {
                if (!examples->empty()) {
                    out += indent + "// Examples:\n";
                    for (const Json& ex : *examples) {
                        if (ex.is_string()) out += indent + "// - \"" + ex.get<std::string>() + "\"\n";
                    }
                }
            }
            if (one_of != nullptr && one_of->is_array()) {
                // Property-level oneOf: description above unless the first variant repeats it.
                const std::string* property_desc = get_string(val, "description");
                bool skip_property_desc = false;
                if (property_desc != nullptr && !one_of->empty()) {
                    const std::string* first_desc = get_string((*one_of)[0], "description");
                    skip_property_desc = first_desc != nullptr && *first_desc == *property_desc;
                }
                bool rendered_above = false;
                if (!skip_property_desc && property_desc != nullptr) {
                    out += indent + "// " + *property_desc + "\n";
                    rendered_above = true;
                }
                if (const Json* d = get(val, "default")) out += indent + "// " + default_comment(val, *d, false) + "\n";
                out += indent + key + opt + ":\n";
                for (size_t i = 0; i < one_of->size(); ++i) {
                    const Json& variant = (*one_of)[i];
                    out += indent + " | " + with_nullable(variant, ts(variant, indent + "   ", depth + 1));
                    std::vector<std::string> trailing;
                    if (!(i == 0 && rendered_above)) {
                        const std::string* vdesc = get_string(variant, "description");
                        if (vdesc != nullptr && (property_desc == nullptr || *vdesc != *property_desc)) {
                            trailing.push_back(*vdesc);
                        }
                    }
                    if (const Json* d = get(variant, "default"))
                        trailing.push_back(default_comment(variant, *d, false));
                    if (!trailing.empty()) {
                        out += " //";
                        for (const std::string& t : trailing) out += " " + t;
                    }
                    out += "\n";
                }
                out += indent + ",\n";
                continue;
            }
            out += indent + key + opt + ": " + with_nullable(val, ts(val, indent + "    ", depth + 1)) + ",";
            // A non-array oneOf falls through to here; harmony then omits the default comment.
            if (one_of == nullptr) {
                if (const Json* d = get(val, "default")) out += " // " + default_comment(val, *d, false);
            }
            out += "\n";
        }
    }
    out += indent + "}";
    return out;
}

std::string ts(const Json& schema, const std::string& indent, int depth) {
    if (depth > kMaxSchemaDepth) return "any";
    if (const Json* one_of = get(schema, "oneOf"); one_of != nullptr && one_of->is_array()) {
        std::string out;
        for (const Json& variant : *one_of) {
            out += "\n" + indent + " | " + with_nullable(variant, ts(variant, indent + "   ", depth + 1));
            std::vector<std::string> trailing;
            if (const std::string* desc = get_string(variant, "description")) trailing.push_back(*desc);
            if (const Json* d = get(variant, "default")) trailing.push_back(default_comment(variant, *d, true));
            if (!trailing.empty()) {
                out += " //";
                for (const std::string& t : trailing) out += " " + t;
            }
        }
        return out;
    }
    const Json* type = get(schema, "type");
    if (type != nullptr && type->is_array()) {
        std::string out;
        for (const Json& t : *type) {
            if (!t.is_string()) continue;
            std::string name = t.get<std::string>();
            if (name == "integer") name = "number";
            if (!out.empty()) out += " | ";
            out += name;
        }
        if (!out.empty()) return out;
    }
    if (type == nullptr || !type->is_string()) return "any";
    const std::string& ty = type->get_ref<const std::string&>();
    if (ty == "object") return ts_object(schema, indent, depth);
    if (ty == "string") {
        if (const Json* e = get(schema, "enum"); e != nullptr && e->is_array()) {
            std::string out;
            for (const Json& v : *e) {
                if (!v.is_string()) continue;
                if (!out.empty()) out += " | ";
                out += "\"" + v.get<std::string>() + "\"";
            }
            if (!out.empty()) return out;
        }
        return "string";
    }
    if (ty == "number" || ty == "integer") return "number";
    if (ty == "boolean") return "boolean";
    if (ty == "array") {
        if (const Json* items = get(schema, "items")) return ts(*items, indent, depth + 1) + "[]";
        return "Array<any>";
    }
    return "any";
}

// Rust str::lines(): split on \n, drop one trailing \r per line, no empty line after a final \n.
std::vector<std::string_view> lines(std::string_view text) {
    std::vector<std::string_view> out;
    while (!text.empty()) {
        size_t nl = text.find('\n');
        std::string_view line = text.substr(0, nl);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        out.push_back(line);
        if (nl == std::string_view::npos) break;
        text.remove_prefix(nl + 1);
    }
    return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out += sep;
        out += parts[i];
    }
    return out;
}

class SegmentWriter {
public:
    void special(int32_t id) { segments_.push_back({id, {}}); }
    void text(std::string s) {
        if (!s.empty()) segments_.push_back({-1, std::move(s)});
    }
    std::vector<Segment>& segments() { return segments_; }

private:
    std::vector<Segment> segments_;
};

bool declares_function_tools(const Message& m) {
    if (!m.developer_content) return false;
    for (const ToolNamespace& ns : m.developer_content->tools) {
        if (ns.name == "functions" && !ns.tools.empty()) return true;
    }
    return false;
}

Status render_message(const Message& m, bool has_function_tools, SegmentWriter& w) {
    w.special(kStart);
    if (m.role == Role::kTool) {
        if (!m.name || m.name->empty()) return invalid_argument("a tool message needs an author name");
        w.text(*m.name);
    } else {
        w.text(std::string(role_name(m.role)));
        if (m.name) w.text(":" + *m.name);
    }
    if (m.recipient && *m.recipient != "all") w.text(" to=" + *m.recipient);
    if (m.channel) {
        w.special(kChannel);
        w.text(*m.channel);
    }
    if (m.content_type) {
        constexpr std::string_view kMarker = "<|constrain|>";
        std::string_view ct = *m.content_type;
        if (ct.substr(0, kMarker.size()) == kMarker) {
            w.text(" ");
            w.special(kConstrain);
            w.text(std::string(ct.substr(kMarker.size())));
        } else {
            w.text(" " + *m.content_type);
        }
    }
    w.special(kMessage);
    if (m.system_content) {
        if (m.role != Role::kSystem) return invalid_argument("system content may only appear in a system message");
        w.text(render_system_body(*m.system_content, has_function_tools));
    }
    if (m.developer_content) {
        if (m.role != Role::kDeveloper) {
            return invalid_argument("developer content may only appear in a developer message");
        }
        w.text(render_developer_body(*m.developer_content));
    }
    w.text(m.content);
    w.special(m.role == Role::kAssistant && m.recipient.has_value() ? kCall : kEnd);
    return ok_status();
}

}  // namespace

std::string schema_to_typescript(const Json& schema, const std::string& indent) { return ts(schema, indent, 0); }

std::string render_tools_section(const std::vector<ToolNamespace>& namespaces) {
    std::vector<const ToolNamespace*> sorted;
    for (const ToolNamespace& ns : namespaces) sorted.push_back(&ns);
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const ToolNamespace* a, const ToolNamespace* b) { return a->name < b->name; });
    std::vector<std::string> sections = {"# Tools"};
    for (const ToolNamespace* ns : sorted) {
        std::vector<std::string> parts = {"## " + ns->name + "\n"};
        if (ns->description) {
            for (std::string_view line : lines(*ns->description)) {
                parts.push_back(ns->tools.empty() ? std::string(line) : "// " + std::string(line));
            }
        }
        if (!ns->tools.empty()) {
            parts.push_back("namespace " + ns->name + " {\n");
            for (const ToolDescription& tool : ns->tools) {
                for (std::string_view line : lines(tool.description)) parts.push_back("// " + std::string(line));
                if (tool.parameters) {
                    parts.push_back("type " + tool.name + " = (_: " + schema_to_typescript(*tool.parameters, "") +
                                    ") => any;\n");
                } else {
                    parts.push_back("type " + tool.name + " = () => any;\n");
                }
            }
            parts.push_back("} // namespace " + ns->name);
        }
        sections.push_back(join(parts, "\n"));
    }
    return join(sections, "\n\n");
}

std::string render_system_body(const SystemContent& sys, bool conversation_has_function_tools) {
    std::vector<std::string> sections;
    std::vector<std::string> top;
    if (sys.model_identity) top.push_back(*sys.model_identity);
    if (sys.knowledge_cutoff) top.push_back("Knowledge cutoff: " + *sys.knowledge_cutoff);
    if (sys.conversation_start_date) top.push_back("Current date: " + *sys.conversation_start_date);
    if (!top.empty()) sections.push_back(join(top, "\n"));
    if (sys.reasoning_effort)
        sections.push_back("Reasoning: " + std::string(reasoning_effort_name(*sys.reasoning_effort)));
    if (!sys.tools.empty()) sections.push_back(render_tools_section(sys.tools));
    if (!sys.valid_channels.empty()) {
        std::string channels = "# Valid channels: " + join(sys.valid_channels, ", ") + ".";
        if (sys.channel_required) channels += " Channel must be included for every message.";
        if (conversation_has_function_tools) {
            channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
        }
        sections.push_back(channels);
    }
    return join(sections, "\n\n");
}

std::string render_developer_body(const DeveloperContent& dev) {
    std::vector<std::string> sections;
    if (dev.instructions && !dev.instructions->empty()) {
        sections.push_back("# Instructions");
        sections.push_back(*dev.instructions);
    }
    // The tools block only with at least one tool (§4.1): a "functions" namespace with none renders nothing.
    if (std::any_of(dev.tools.begin(), dev.tools.end(), [](const ToolNamespace& ns) { return !ns.tools.empty(); }))
        sections.push_back(render_tools_section(dev.tools));
    if (dev.response_format) {
        const ResponseFormat& rf = *dev.response_format;
        std::string section = "# Response Formats\n\n## " + rf.name + "\n\n";
        if (rf.description) {
            for (std::string_view line : lines(*rf.description)) section += "// " + std::string(line) + "\n";
        }
        section += compact(rf.schema);  // (serde's number forms, as everywhere else: 1e20, not 1e+20)
        sections.push_back(std::move(section));
    }
    return join(sections, "\n\n");
}

void apply_cot_drop(std::vector<Message>& messages, CotDropPolicy policy) {
    auto is_analysis = [](const Message& m) { return m.channel && *m.channel == "analysis"; };
    auto is_final = [](const Message& m) { return m.channel && *m.channel == "final"; };
    std::vector<bool> drop(messages.size(), false);
    switch (policy) {
        case CotDropPolicy::kNone: return;
        case CotDropPolicy::kHarmonyLibrary: {
            bool last_assistant_is_final = false;
            for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
                if (it->role == Role::kAssistant) {
                    last_assistant_is_final = is_final(*it);
                    break;
                }
            }
            if (!last_assistant_is_final) return;
            auto first_final = std::find_if(messages.begin(), messages.end(), is_final);
            for (auto it = messages.begin(); it != first_final; ++it) drop[it - messages.begin()] = is_analysis(*it);
            break;
        }
        case CotDropPolicy::kCompletedTurns: {
            bool final_follows = false;
            for (size_t i = messages.size(); i-- > 0;) {
                const Message& m = messages[i];
                if (m.role != Role::kAssistant) continue;
                if (is_final(m) && !m.recipient) final_follows = true;
                drop[i] = final_follows && is_analysis(m) && !m.recipient;
            }
            break;
        }
    }
    size_t out = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (drop[i]) continue;
        if (out != i) messages[out] = std::move(messages[i]);
        ++out;
    }
    messages.resize(out);
}

StatusOr<std::vector<Segment>> render_segments(const Conversation& conversation, const RenderOptions& options) {
    bool has_function_tools =
        std::any_of(conversation.messages.begin(), conversation.messages.end(), declares_function_tools);
    std::vector<Message> kept = conversation.messages;
    apply_cot_drop(kept, options.cot_drop);
    SegmentWriter w;
    for (const Message& m : kept) RETURN_IF_ERROR(render_message(m, has_function_tools, w));
    switch (options.mode) {
        case RenderMode::kCompletion:
            w.special(kStart);
            w.text(std::string(role_name(options.next_role)));
            break;
        case RenderMode::kConversation: break;
        case RenderMode::kTraining:
            if (!conversation.messages.empty()) {
                const Message& last = conversation.messages.back();
                if (last.role == Role::kAssistant && last.channel && *last.channel == "final" &&
                    !w.segments().empty() && w.segments().back().special_id == kEnd) {
                    w.segments().back().special_id = kReturn;
                }
            }
            break;
    }
    return std::move(w.segments());
}

std::vector<int32_t> encode_segments(const tokenizer::BpeTokenizer& tokenizer, const std::vector<Segment>& segments) {
    std::vector<int32_t> ids;
    for (const Segment& s : segments) {
        if (s.special_id >= 0) {
            ids.push_back(s.special_id);
        } else {
            std::vector<int32_t> piece = tokenizer.encode_ordinary(s.text);
            ids.insert(ids.end(), piece.begin(), piece.end());
        }
    }
    return ids;
}

std::string segments_text(const std::vector<Segment>& segments) {
    std::string text;
    for (const Segment& s : segments)
        text += s.special_id >= 0 ? special_token_text(s.special_id).value_or("") : s.text;
    return text;
}

StatusOr<std::vector<int32_t>> render(const tokenizer::BpeTokenizer& tokenizer, const Conversation& conversation,
                                      const RenderOptions& options) {
    ASSIGN_OR_RETURN(std::vector<Segment> segments, render_segments(conversation, options));
    return encode_segments(tokenizer, segments);
}

StatusOr<std::string> render_text(const Conversation& conversation, const RenderOptions& options) {
    ASSIGN_OR_RETURN(std::vector<Segment> segments, render_segments(conversation, options));
    return segments_text(segments);
}

namespace {

// The id of "<|reserved_N|>" as tiktoken's o200k_harmony lists it (N in 200000-201087 where harmony reserves it, its
// <|endofprompt|> 200018 included) when the tokenizer file does not list that text (a tokenizer.json stops at
// 200018); nullopt otherwise.
std::optional<int32_t> unlisted_reserved_id(const tokenizer::BpeTokenizer& tok, std::string_view name) {
    constexpr std::string_view kPrefix = "<|reserved_";
    if (!name.starts_with(kPrefix) || !name.ends_with("|>") || tok.special_token_id(name)) return std::nullopt;
    if (tok.special_token_id("<|start|>") != kStart) return std::nullopt;  // not the harmony vocabulary
    const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - 2);
    if (digits.empty() || digits.size() > 6 || digits[0] == '0') return std::nullopt;
    int32_t id = 0;
    for (char c : digits) {
        if (c < '0' || c > '9') return std::nullopt;
        id = id * 10 + (c - '0');
    }
    if (id == kEndOfPrompt || special_token_text(id) == std::string(name)) return id;
    return std::nullopt;
}

}  // namespace

std::vector<int32_t> encode_all_special(const tokenizer::BpeTokenizer& tok, std::string_view text) {
    std::vector<int32_t> out;
    size_t start = 0;  // text not encoded yet
    for (size_t pos = text.find("<|reserved_"); pos != std::string_view::npos;
         pos = text.find("<|reserved_", pos + 1)) {
        const size_t end = text.find("|>", pos);
        if (end == std::string_view::npos) break;
        const std::optional<int32_t> id = unlisted_reserved_id(tok, text.substr(pos, end + 2 - pos));
        if (!id) continue;
        std::vector<int32_t> before = tok.encode(text.substr(start, pos - start), {}, /*allow_all_special=*/true);
        out.insert(out.end(), before.begin(), before.end());
        out.push_back(*id);
        start = end + 2;
        pos = end + 1;
    }
    std::vector<int32_t> rest = tok.encode(text.substr(start), {}, /*allow_all_special=*/true);
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
}

}  // namespace gptoss::harmony
