#include "harmony/harmony_json.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>

namespace gptoss::harmony {
namespace {

const Json* field(const Json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Status must_be(const std::string& where, const char* what) { return invalid_argument(where + " must be " + what); }

// Absent or null -> nullopt; a string -> its value; anything else -> invalid_argument.
StatusOr<std::optional<std::string>> opt_string(const Json& obj, const char* key, const std::string& where) {
    const Json* v = field(obj, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return must_be(where + "." + key, "a string");
    return std::optional<std::string>(v->get<std::string>());
}

StatusOr<bool> opt_bool(const Json& obj, const char* key, bool fallback, const std::string& where) {
    const Json* v = field(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return must_be(where + "." + key, "a boolean");
    return v->get<bool>();
}

std::string compact(const Json& j) { return json_compact(j); }

Json opt_json(const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); }

// Message content: a string, null, or an array of parts whose text is concatenated.
StatusOr<std::string> content_text(const Json& msg, const std::string& where) {
    const Json* c = field(msg, "content");
    if (c == nullptr) return std::string();
    if (c->is_string()) return c->get<std::string>();
    if (!c->is_array()) return must_be(where + ".content", "a string, null or an array of content parts");
    std::string text;
    for (size_t i = 0; i < c->size(); ++i) {
        const Json& part = (*c)[i];
        std::string part_where = where + ".content[" + std::to_string(i) + "]";
        if (part.is_string()) {
            text += part.get<std::string>();
            continue;
        }
        ASSIGN_OR_RETURN(std::optional<std::string> type, opt_string(part, "type", part_where));
        if (!part.is_object() || !type) return must_be(part_where, "a content part object with a \"type\"");
        if (*type == "text" || *type == "input_text" || *type == "output_text") {
            ASSIGN_OR_RETURN(std::optional<std::string> t, opt_string(part, "text", part_where));
            text += t.value_or("");
        } else if (*type == "refusal") {
            ASSIGN_OR_RETURN(std::optional<std::string> t, opt_string(part, "refusal", part_where));
            text += t.value_or("");
        } else {
            return invalid_argument(part_where + ": content type \"" + *type + "\" is not supported (text only)");
        }
    }
    return text;
}

// A function's parameter schema, normalized: absent/null or an object schema without properties
// renders `() => any` (HARMONY.md §4.3 normalization). A schema without "type" is an object schema
// unless it says otherwise (oneOf / anyOf / allOf / enum / const / items): a top-level union renders
// as the parameter `_` (`(_: \n | string\n | number) => any`), as the harmony library does, not as
// a function without arguments.
std::optional<Json> normalized_parameters(const Json* params) {
    if (params == nullptr) return std::nullopt;
    if (params->is_object()) {
        const Json* type = field(*params, "type");
        bool typed_otherwise = false;
        for (const char* key : {"oneOf", "anyOf", "allOf", "enum", "const", "items"})
            typed_otherwise = typed_otherwise || field(*params, key) != nullptr;
        bool object_schema =
            type == nullptr ? !typed_otherwise : type->is_string() && type->get<std::string>() == "object";
        const Json* props = field(*params, "properties");
        if (object_schema && (props == nullptr || !props->is_object() || props->empty())) return std::nullopt;
    }
    return *params;
}

StatusOr<ReasoningEffort> parse_effort(const std::string& s, const std::string& where) {
    if (s == "low" || s == "minimal" || s == "none") return ReasoningEffort::kLow;
    if (s == "medium") return ReasoningEffort::kMedium;
    if (s == "high" || s == "xhigh" || s == "max") return ReasoningEffort::kHigh;
    return invalid_argument(where + " must be one of low, medium, high (got \"" + s + "\")");
}

StatusOr<std::vector<ToolNamespace>> namespaces_from_json(const Json* j, const std::string& where) {
    std::vector<ToolNamespace> out;
    if (j == nullptr) return out;
    if (!j->is_array()) return must_be(where, "an array of tool namespaces");
    for (size_t i = 0; i < j->size(); ++i) {
        const Json& n = (*j)[i];
        std::string nw = where + "[" + std::to_string(i) + "]";
        if (!n.is_object()) return must_be(nw, "an object");
        ToolNamespace ns;
        ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(n, "name", nw));
        if (!name) return invalid_argument(nw + ".name is required");
        ns.name = *name;
        ASSIGN_OR_RETURN(ns.description, opt_string(n, "description", nw));
        if (const Json* tools = field(n, "tools")) {
            if (!tools->is_array()) return must_be(nw + ".tools", "an array");
            for (size_t k = 0; k < tools->size(); ++k) {
                const Json& t = (*tools)[k];
                std::string tw = nw + ".tools[" + std::to_string(k) + "]";
                if (!t.is_object()) return must_be(tw, "an object");
                ToolDescription tool;
                ASSIGN_OR_RETURN(std::optional<std::string> tname, opt_string(t, "name", tw));
                if (!tname) return invalid_argument(tw + ".name is required");
                tool.name = *tname;
                ASSIGN_OR_RETURN(std::optional<std::string> desc, opt_string(t, "description", tw));
                tool.description = desc.value_or("");
                if (const Json* p = field(t, "parameters")) tool.parameters = *p;
                ns.tools.push_back(std::move(tool));
            }
        }
        out.push_back(std::move(ns));
    }
    return out;
}

Json namespaces_to_json(const std::vector<ToolNamespace>& namespaces) {
    if (namespaces.empty()) return nullptr;
    Json out = Json::array();
    for (const ToolNamespace& ns : namespaces) {
        Json tools = Json::array();
        for (const ToolDescription& t : ns.tools) {
            tools.push_back({{"name", t.name},
                             {"description", t.description},
                             {"parameters", t.parameters ? *t.parameters : Json(nullptr)}});
        }
        out.push_back({{"name", ns.name}, {"description", opt_json(ns.description)}, {"tools", tools}});
    }
    return out;
}

StatusOr<Message> message_from_json(const Json& m, const std::string& where) {
    if (!m.is_object()) return must_be(where, "an object");
    Message msg;
    ASSIGN_OR_RETURN(std::optional<std::string> role, opt_string(m, "role", where));
    if (!role || !parse_role(*role))
        return invalid_argument(where + ".role must be system, developer, user, assistant or tool");
    msg.role = *parse_role(*role);
    ASSIGN_OR_RETURN(msg.name, opt_string(m, "name", where));
    ASSIGN_OR_RETURN(msg.recipient, opt_string(m, "recipient", where));
    ASSIGN_OR_RETURN(msg.channel, opt_string(m, "channel", where));
    ASSIGN_OR_RETURN(msg.content_type, opt_string(m, "content_type", where));
    ASSIGN_OR_RETURN(msg.content, content_text(m, where));
    if (const Json* sc = field(m, "system_content")) {
        std::string sw = where + ".system_content";
        if (!sc->is_object()) return must_be(sw, "an object");
        SystemContent sys;
        if (sc->contains("model_identity")) {
            ASSIGN_OR_RETURN(sys.model_identity, opt_string(*sc, "model_identity", sw));
        }
        if (sc->contains("knowledge_cutoff")) {
            ASSIGN_OR_RETURN(sys.knowledge_cutoff, opt_string(*sc, "knowledge_cutoff", sw));
        }
        ASSIGN_OR_RETURN(sys.conversation_start_date, opt_string(*sc, "conversation_start_date", sw));
        if (sc->contains("reasoning_effort")) {
            ASSIGN_OR_RETURN(std::optional<std::string> effort, opt_string(*sc, "reasoning_effort", sw));
            sys.reasoning_effort.reset();
            if (effort) {
                ASSIGN_OR_RETURN(sys.reasoning_effort, parse_effort(*effort, sw + ".reasoning_effort"));
            }
        }
        if (sc->contains("valid_channels")) {
            sys.valid_channels.clear();
            if (const Json* vc = field(*sc, "valid_channels")) {
                if (!vc->is_array()) return must_be(sw + ".valid_channels", "an array of strings");
                for (const Json& c : *vc) {
                    if (!c.is_string()) return must_be(sw + ".valid_channels", "an array of strings");
                    sys.valid_channels.push_back(c.get<std::string>());
                }
            }
        }
        ASSIGN_OR_RETURN(sys.channel_required, opt_bool(*sc, "channel_required", true, sw));
        ASSIGN_OR_RETURN(sys.tools, namespaces_from_json(field(*sc, "tools"), sw + ".tools"));
        msg.system_content = std::move(sys);
    }
    if (const Json* dc = field(m, "developer_content")) {
        std::string dw = where + ".developer_content";
        if (!dc->is_object()) return must_be(dw, "an object");
        DeveloperContent dev;
        ASSIGN_OR_RETURN(dev.instructions, opt_string(*dc, "instructions", dw));
        ASSIGN_OR_RETURN(dev.tools, namespaces_from_json(field(*dc, "tools"), dw + ".tools"));
        msg.developer_content = std::move(dev);
    }
    return msg;
}

StatusOr<Conversation> conversation_from_json_impl(const Json& messages) {
    if (!messages.is_array()) return must_be("messages", "an array");
    Conversation conv;
    for (size_t i = 0; i < messages.size(); ++i) {
        ASSIGN_OR_RETURN(Message m, message_from_json(messages[i], "messages[" + std::to_string(i) + "]"));
        conv.messages.push_back(std::move(m));
    }
    return conv;
}

struct FunctionTools {
    std::vector<ToolDescription> functions;
    bool browser = false;
    bool python = false;
};

StatusOr<FunctionTools> tools_from_request(const Json& request) {
    FunctionTools out;
    const Json* tools = field(request, "tools");
    if (tools == nullptr) return out;
    if (!tools->is_array()) return must_be("tools", "an array");
    for (size_t i = 0; i < tools->size(); ++i) {
        const Json& t = (*tools)[i];
        std::string where = "tools[" + std::to_string(i) + "]";
        if (!t.is_object()) return must_be(where, "an object");
        ASSIGN_OR_RETURN(std::optional<std::string> type, opt_string(t, "type", where));
        std::string ty = type.value_or("function");
        if (ty == "web_search" || ty == "web_search_preview" || ty == "browser_search" || ty == "browser") {
            out.browser = true;
            continue;
        }
        if (ty == "code_interpreter" || ty == "python") {
            out.python = true;
            continue;
        }
        if (ty != "function") return invalid_argument(where + ".type \"" + ty + "\" is not supported");
        const Json* fn = field(t, "function");
        if (fn == nullptr || !fn->is_object()) return invalid_argument(where + ".function must be an object");
        std::string fw = where + ".function";
        ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(*fn, "name", fw));
        if (!name || !valid_function_name(*name)) {
            return invalid_argument(fw + ".name must be a non-empty name of letters, digits, _ . : -");
        }
        for (const ToolDescription& seen : out.functions) {
            if (seen.name == *name) return invalid_argument("tools: function \"" + *name + "\" is declared twice");
        }
        ToolDescription tool;
        tool.name = *name;
        ASSIGN_OR_RETURN(std::optional<std::string> desc, opt_string(*fn, "description", fw));
        tool.description = desc.value_or("");
        const Json* params = field(*fn, "parameters");
        if (params != nullptr && !params->is_object()) return must_be(fw + ".parameters", "a JSON schema object");
        tool.parameters = normalized_parameters(params);
        out.functions.push_back(std::move(tool));
    }
    return out;
}

Status parse_tool_choice(const Json& request, const std::vector<ToolDescription>& functions, ChatRequest& out) {
    const Json* tc = field(request, "tool_choice");
    if (tc == nullptr) return ok_status();
    if (tc->is_string()) {
        const std::string& s = tc->get_ref<const std::string&>();
        if (s == "auto")
            out.tool_choice = ToolChoice::kAuto;
        else if (s == "none")
            out.tool_choice = ToolChoice::kNone;
        else if (s == "required")
            out.tool_choice = ToolChoice::kRequired;
        else
            return invalid_argument("tool_choice must be \"auto\", \"none\", \"required\" or a function");
        return ok_status();
    }
    const Json* fn = tc->is_object() ? field(*tc, "function") : nullptr;
    std::optional<std::string> name;
    if (fn != nullptr) {
        ASSIGN_OR_RETURN(name, opt_string(*fn, "name", "tool_choice.function"));
    }
    if (!name)
        return invalid_argument(
            "tool_choice must name a function: {\"type\":\"function\",\"function\":{\"name\":...}}");
    bool declared =
        std::any_of(functions.begin(), functions.end(), [&](const ToolDescription& t) { return t.name == *name; });
    if (!declared)
        return invalid_argument("tool_choice names function \"" + *name + "\", which tools does not declare");
    out.tool_choice = ToolChoice::kFunction;
    out.forced_function = name;
    return ok_status();
}

Status history_from_request(const Json& messages, const ServerOptions& options, std::vector<std::string>& instructions,
                            std::vector<Message>& history) {
    // tool_call_id -> function name, over the whole request (the last call with the id; for ids that a client
    // reuses across turns, a tool message takes the call before it: see the tool branch below).
    std::map<std::string, std::string> call_names;
    std::map<std::string, std::string> earlier_call_names;  // the same, over the messages before the current one
    for (const Json& m : messages) {
        const Json* calls = field(m, "tool_calls");
        if (calls == nullptr || !calls->is_array()) continue;
        for (const Json& c : *calls) {
            const Json* id = field(c, "id");
            const Json* fn = field(c, "function");
            const Json* name = fn != nullptr ? field(*fn, "name") : nullptr;
            if (id != nullptr && id->is_string() && name != nullptr && name->is_string()) {
                call_names[id->get<std::string>()] = name->get<std::string>();
            }
        }
    }
    std::vector<std::pair<std::string, std::string>> unanswered;  // (id, name), in call order
    bool leading = true;
    for (size_t i = 0; i < messages.size(); ++i) {
        const Json& m = messages[i];
        std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return must_be(where, "an object");
        ASSIGN_OR_RETURN(std::optional<std::string> role, opt_string(m, "role", where));
        if (!role) return invalid_argument(where + ".role is required");
        ASSIGN_OR_RETURN(std::string text, content_text(m, where));
        // Calls only come from the assistant (OpenAI's rule): elsewhere they would be counted as calls a tool message
        // can answer, yet never rendered.
        if (const Json* tc = field(m, "tool_calls");
            *role != "assistant" && tc != nullptr && !tc->is_null() && !(tc->is_array() && tc->empty()))
            return invalid_argument(where + ".tool_calls: only assistant messages carry tool calls");
        if (*role == "system" || *role == "developer") {
            if (text.empty()) continue;
            if (leading) {
                instructions.push_back(text);
            } else {  // a later system/developer message: its own developer message, in place
                Message dev;
                dev.role = Role::kDeveloper;
                dev.developer_content = DeveloperContent{text, {}, std::nullopt};
                history.push_back(std::move(dev));
            }
            continue;
        }
        leading = false;
        if (*role == "user") {
            history.push_back(Message::text(Role::kUser, text));
        } else if (*role == "assistant") {
            std::optional<std::string> reasoning;
            for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
                ASSIGN_OR_RETURN(reasoning, opt_string(m, key, where));
                if (reasoning && !reasoning->empty()) break;  // an empty alias does not hide a later one
            }
            if (reasoning && !reasoning->empty()) {
                Message a = Message::text(Role::kAssistant, *reasoning);
                a.channel = "analysis";
                history.push_back(std::move(a));
            }
            const Json* calls = field(m, "tool_calls");
            if (calls != nullptr && !calls->is_array()) return must_be(where + ".tool_calls", "an array");
            if (calls != nullptr && !calls->empty()) {
                if (!text.empty()) {  // content next to tool calls: a user-visible preamble
                    Message p = Message::text(Role::kAssistant, text);
                    p.channel = "commentary";
                    history.push_back(std::move(p));
                }
                for (size_t k = 0; k < calls->size(); ++k) {
                    const Json& c = (*calls)[k];
                    std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
                    const Json* fn = field(c, "function");
                    if (fn == nullptr || !fn->is_object()) return invalid_argument(cw + ".function must be an object");
                    ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(*fn, "name", cw + ".function"));
                    if (!name || !valid_function_name(*name))
                        return invalid_argument(cw +
                                                ".function.name must be a non-empty name of letters, digits, _ . : -");
                    // Absent or null arguments are a call without arguments: "{}" (an empty body is no JSON at
                    // all, and the model only ever sees a call's arguments as an object).
                    std::string args = "{}";
                    if (const Json* a = field(*fn, "arguments"); a != nullptr && !a->is_null())
                        args = a->is_string() ? a->get<std::string>() : compact(*a);
                    Message call = Message::text(Role::kAssistant, args);
                    call.recipient = "functions." + *name;
                    call.channel = "commentary";
                    if (!options.history_tool_call_content_type.empty()) {
                        call.content_type = options.history_tool_call_content_type;
                    }
                    history.push_back(std::move(call));
                    ASSIGN_OR_RETURN(std::optional<std::string> id, opt_string(c, "id", cw));
                    unanswered.emplace_back(id.value_or(""), *name);
                    if (id) earlier_call_names[*id] = *name;
                }
            } else if (!text.empty()) {
                Message f = Message::text(Role::kAssistant, text);
                f.channel = "final";
                history.push_back(std::move(f));
            }
        } else if (*role == "tool" || *role == "function") {
            ASSIGN_OR_RETURN(std::optional<std::string> call_id, opt_string(m, "tool_call_id", where));
            ASSIGN_OR_RETURN(std::optional<std::string> name_field, opt_string(m, "name", where));
            // An id that no call in the conversation has is an error for the server, as OpenAI's, unless the message
            // names its function itself; rendering alone follows HARMONY.md §5.2 (the most recent unanswered call).
            if (options.unmatched_tool_call_id_is_error && call_id && !call_id->empty() &&
                call_names.count(*call_id) == 0 && !(name_field && !name_field->empty()))
                return invalid_argument(where + ".tool_call_id: \"" + *call_id +
                                        "\" matches no tool call in the conversation");
            // The call it answers: the first unanswered call with its id, else the last earlier call with it (an
            // id a client reuses answers the call before it, not a later one), else any call with it.
            auto answered = unanswered.end();
            std::optional<std::string> name;
            if (call_id) {
                answered = std::find_if(unanswered.begin(), unanswered.end(),
                                        [&](const auto& u) { return u.first == *call_id; });
                if (answered != unanswered.end()) {
                    name = answered->second;
                } else if (auto e = earlier_call_names.find(*call_id); e != earlier_call_names.end()) {
                    name = e->second;
                } else if (auto a = call_names.find(*call_id); a != call_names.end()) {
                    name = a->second;
                }
            }
            // A name from a call renders as the call did ("functions." + its name, even one that starts with
            // "functions."); the message's own name field may carry the prefix already.
            bool from_field = false;
            if (!name && name_field && !name_field->empty()) {
                if (!valid_function_name(*name_field))
                    return invalid_argument(where + ".name must be a function name of letters, digits, _ . : -");
                name = *name_field;
                from_field = true;
            }
            if (!name && !unanswered.empty()) name = unanswered.back().second;
            if (!name) {
                return invalid_argument(where + ": tool message matches no tool call (set tool_call_id or name)");
            }
            if (answered == unanswered.end()) {
                answered = std::find_if(unanswered.begin(), unanswered.end(), [&](const auto& u) {
                    return call_id ? u.first == *call_id : u.second == *name;
                });
            }
            if (answered == unanswered.end() && !unanswered.empty()) answered = unanswered.end() - 1;
            if (answered != unanswered.end()) unanswered.erase(answered);
            Message t = Message::text(Role::kTool, text);
            t.name = from_field && name->rfind("functions.", 0) == 0 ? *name : "functions." + *name;
            t.recipient = "assistant";
            t.channel = "commentary";
            history.push_back(std::move(t));
        } else {
            return invalid_argument(where + ".role \"" + *role + "\" is not supported");
        }
    }
    return ok_status();
}

// response_format {"type": "json_schema", "json_schema": {"name", "description"?, "schema"?}}: the format
// the developer message names (the server holds the output to the schema; this only renders it).
// Other types ("text", "json_object") render nothing.
StatusOr<std::optional<ResponseFormat>> response_format_from_request(const Json& request) {
    const Json* rf = field(request, "response_format");
    if (rf == nullptr || !rf->is_object()) return std::optional<ResponseFormat>{};
    const Json* type = field(*rf, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "json_schema")
        return std::optional<ResponseFormat>{};
    const Json* js = field(*rf, "json_schema");
    if (js == nullptr || !js->is_object()) return must_be("response_format.json_schema", "an object");
    ResponseFormat out;
    ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(*js, "name", "response_format.json_schema"));
    if (!name) return invalid_argument("response_format.json_schema.name is required");
    out.name = *name;
    ASSIGN_OR_RETURN(out.description, opt_string(*js, "description", "response_format.json_schema"));
    if (const Json* schema = field(*js, "schema"))
        out.schema = *schema;
    else
        out.schema = Json::object();
    return std::optional<ResponseFormat>(std::move(out));
}

StatusOr<ChatRequest> chat_request_from_json_impl(const Json& request, const ServerOptions& options) {
    if (!request.is_object()) return must_be("the request", "a JSON object");
    const Json* messages = field(request, "messages");
    if (messages == nullptr || !messages->is_array() || messages->empty()) {
        return invalid_argument("messages must be a non-empty array");
    }
    ChatRequest out;
    ASSIGN_OR_RETURN(std::optional<std::string> effort, opt_string(request, "reasoning_effort", "request"));
    if (!effort) {
        if (const Json* r = field(request, "reasoning"); r != nullptr && r->is_object()) {
            ASSIGN_OR_RETURN(effort, opt_string(*r, "effort", "reasoning"));
        }
    }
    if (effort) {
        ASSIGN_OR_RETURN(out.reasoning_effort, parse_effort(*effort, "reasoning_effort"));
    }
    ASSIGN_OR_RETURN(FunctionTools tools, tools_from_request(request));
    RETURN_IF_ERROR(parse_tool_choice(request, tools.functions, out));
    for (const ToolDescription& t : tools.functions) out.declared_functions.push_back(t.name);
    ASSIGN_OR_RETURN(out.parallel_tool_calls, opt_bool(request, "parallel_tool_calls", true, "request"));

    ASSIGN_OR_RETURN(const bool continue_final, opt_bool(request, "continue_final_message", false, "request"));
    Json earlier;  // continue_final_message: the messages before the open one
    if (continue_final) {
        const size_t last = messages->size() - 1;
        const std::string where = "messages[" + std::to_string(last) + "]";
        const Json& m = (*messages)[last];
        if (!m.is_object()) return must_be(where, "an object");
        ASSIGN_OR_RETURN(std::optional<std::string> role, opt_string(m, "role", where));
        if (role != "assistant")
            return invalid_argument(where +
                                    ".role: continue_final_message continues the last message, which must be the "
                                    "assistant's");
        if (const Json* calls = field(m, "tool_calls"); calls != nullptr && !(calls->is_array() && calls->empty()))
            return invalid_argument(where + ".tool_calls: a message with tool calls cannot be continued");
        OpenMessage open;
        for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
            ASSIGN_OR_RETURN(open.reasoning, opt_string(m, key, where));
            if (open.reasoning) break;
        }
        if (field(m, "content") != nullptr) {
            ASSIGN_OR_RETURN(std::string text, content_text(m, where));
            // "" beside reasoning (as many clients send for none) continues the reasoning.
            if (!text.empty() || !(open.reasoning && !open.reasoning->empty())) open.content = std::move(text);
        }
        out.open_message = std::move(open);
        earlier = Json::array();
        for (size_t i = 0; i < last; ++i) earlier.push_back((*messages)[i]);
        messages = &earlier;
    }

    std::vector<std::string> instructions;
    std::vector<Message> history;
    RETURN_IF_ERROR(history_from_request(*messages, options, instructions, history));

    const bool render_functions = !tools.functions.empty() && out.tool_choice != ToolChoice::kNone;
    Message system;
    system.role = Role::kSystem;
    SystemContent sys;
    sys.model_identity = options.model_identity;
    sys.knowledge_cutoff = options.knowledge_cutoff;
    sys.conversation_start_date = options.current_date ? *options.current_date : today_utc();
    sys.reasoning_effort = out.reasoning_effort;
    if (options.drop_commentary_without_tools && !render_functions) sys.valid_channels = {"analysis", "final"};
    if (options.browser_tool || tools.browser) sys.tools.push_back(browser_namespace());
    if (options.python_tool || tools.python) sys.tools.push_back(python_namespace());
    system.system_content = std::move(sys);
    out.conversation.messages.push_back(std::move(system));

    std::string joined;
    for (size_t i = 0; i < instructions.size(); ++i) joined += (i > 0 ? "\n\n" : "") + instructions[i];
    ASSIGN_OR_RETURN(std::optional<ResponseFormat> format, response_format_from_request(request));
    if (!joined.empty() || render_functions || format) {
        Message dev;
        dev.role = Role::kDeveloper;
        DeveloperContent content;
        if (!joined.empty()) content.instructions = joined;
        if (render_functions) content.tools.push_back(ToolNamespace{"functions", std::nullopt, tools.functions});
        content.response_format = std::move(format);
        dev.developer_content = std::move(content);
        out.conversation.messages.push_back(std::move(dev));
    }
    apply_cot_drop(history, options.cot_drop_policy);
    for (Message& m : history) out.conversation.messages.push_back(std::move(m));
    out.render_options.mode = RenderMode::kCompletion;
    out.render_options.next_role = Role::kAssistant;
    out.render_options.cot_drop = options.cot_drop_policy;
    return out;
}

}  // namespace

std::string today_utc() {
    std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[16];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
    return buf;
}

static StatusOr<ServerOptions> server_options_from_json_impl(const Json& j) {
    ServerOptions o;
    if (j.is_null()) return o;
    if (!j.is_object()) return must_be("server_options", "an object");
    const std::string w = "server_options";
    ASSIGN_OR_RETURN(o.current_date, opt_string(j, "current_date", w));
    if (o.current_date && !valid_date(*o.current_date)) return must_be(w + ".current_date", "a YYYY-MM-DD date");
    ASSIGN_OR_RETURN(std::optional<std::string> s, opt_string(j, "model_identity", w));
    if (s) o.model_identity = *s;
    ASSIGN_OR_RETURN(s, opt_string(j, "knowledge_cutoff", w));
    if (s) o.knowledge_cutoff = *s;
    if (j.contains("history_tool_call_content_type")) {
        ASSIGN_OR_RETURN(s, opt_string(j, "history_tool_call_content_type", w));
        o.history_tool_call_content_type = s.value_or("");
    }
    ASSIGN_OR_RETURN(s, opt_string(j, "cot_drop_policy", w));
    if (s) {
        if (*s == "completed_turns")
            o.cot_drop_policy = CotDropPolicy::kCompletedTurns;
        else if (*s == "none" || *s == "keep")
            o.cot_drop_policy = CotDropPolicy::kNone;
        else if (*s == "harmony" || *s == "auto_drop_analysis")
            o.cot_drop_policy = CotDropPolicy::kHarmonyLibrary;
        else
            return must_be(w + ".cot_drop_policy", "\"completed_turns\", \"harmony\" or \"none\"");
    }
    if (const Json* b = field(j, "builtin_tools")) {
        // ["browser", "python"], [{"type": "browser"}], or {"browser": true, "python": false}.
        std::vector<std::string> names;
        if (b->is_object()) {
            for (const auto& [key, enabled] : b->items()) {
                if (!enabled.is_boolean() || enabled.get<bool>()) names.push_back(key);
            }
        } else if (b->is_array()) {
            for (const Json& t : *b) {
                std::optional<std::string> name;
                if (t.is_string()) {
                    name = t.get<std::string>();
                } else if (t.is_object()) {
                    ASSIGN_OR_RETURN(name, opt_string(t, "type", w + ".builtin_tools[]"));
                    if (!name) {
                        ASSIGN_OR_RETURN(name, opt_string(t, "name", w + ".builtin_tools[]"));
                    }
                }
                if (!name) return must_be(w + ".builtin_tools[]", "a tool name");
                names.push_back(*name);
            }
        } else {
            return must_be(w + ".builtin_tools", "an array of tool names");
        }
        for (const std::string& name : names) {
            if (name == "browser" || name == "browser_search" || name == "web_search" || name == "web_search_preview") {
                o.browser_tool = true;
            } else if (name == "python" || name == "code_interpreter") {
                o.python_tool = true;
            } else {
                return invalid_argument(w + ".builtin_tools: unknown built-in \"" + name + "\" (browser, python)");
            }
        }
    }
    ASSIGN_OR_RETURN(o.drop_commentary_without_tools, opt_bool(j, "drop_commentary_without_tools", false, w));
    return o;
}

StatusOr<ChatRequest> chat_request_from_json(const Json& request, const ServerOptions& options) {
    try {
        return chat_request_from_json_impl(request, options);
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

ChatMappingOptions chat_mapping_options(const ChatRequest& request) {
    ChatMappingOptions o;
    o.declared_functions = request.declared_functions;
    // No function tools declared: a client that offered none gets no tool_calls; a stray call is hidden text, as
    // under tool_choice "none" (HARMONY.md §7).
    o.function_calls_enabled = request.tool_choice != ToolChoice::kNone && !request.declared_functions.empty();
    o.max_tool_calls = request.parallel_tool_calls ? 0 : 1;
    return o;
}

StatusOr<Conversation> conversation_from_json(const Json& messages) {
    try {
        return conversation_from_json_impl(messages);
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed messages: ") + e.what());
    }
}

Json conversation_to_json(const Conversation& conversation) {
    Json out = Json::array();
    for (const Message& m : conversation.messages) {
        Json j = Json::object();
        j["role"] = std::string(role_name(m.role));
        if (m.system_content) {
            const SystemContent& s = *m.system_content;
            Json channels = Json(nullptr);
            if (!s.valid_channels.empty()) channels = s.valid_channels;
            j["system_content"] = {
                {"model_identity", opt_json(s.model_identity)},
                {"knowledge_cutoff", opt_json(s.knowledge_cutoff)},
                {"conversation_start_date", opt_json(s.conversation_start_date)},
                {"reasoning_effort",
                 s.reasoning_effort ? Json(std::string(reasoning_effort_name(*s.reasoning_effort))) : Json(nullptr)},
                {"valid_channels", channels},
                {"channel_required", s.channel_required},
                {"tools", namespaces_to_json(s.tools)}};
        }
        if (m.developer_content) {
            j["developer_content"] = {{"instructions", opt_json(m.developer_content->instructions)},
                                      {"tools", namespaces_to_json(m.developer_content->tools)}};
        }
        if (m.name) j["name"] = *m.name;
        if (m.recipient) j["recipient"] = *m.recipient;
        if (m.channel) j["channel"] = *m.channel;
        if (m.content_type) j["content_type"] = *m.content_type;
        if (!m.system_content && !m.developer_content) j["content"] = m.content;
        out.push_back(std::move(j));
    }
    return out;
}

static StatusOr<RenderOptions> render_options_from_json_impl(const Json& render) {
    RenderOptions o;
    o.cot_drop = CotDropPolicy::kHarmonyLibrary;  // harmony's auto_drop_analysis default
    if (render.is_null()) return o;
    if (!render.is_object()) return must_be("render", "an object");
    ASSIGN_OR_RETURN(std::optional<std::string> mode, opt_string(render, "mode", "render"));
    if (mode) {
        if (*mode == "completion")
            o.mode = RenderMode::kCompletion;
        else if (*mode == "conversation")
            o.mode = RenderMode::kConversation;
        else if (*mode == "training")
            o.mode = RenderMode::kTraining;
        else
            return must_be("render.mode", "\"completion\", \"conversation\" or \"training\"");
    }
    ASSIGN_OR_RETURN(std::optional<std::string> next_role, opt_string(render, "next_role", "render"));
    if (next_role) {
        std::optional<Role> r = parse_role(*next_role);
        if (!r) return must_be("render.next_role", "a role");
        o.next_role = *r;
    }
    ASSIGN_OR_RETURN(bool auto_drop, opt_bool(render, "auto_drop_analysis", true, "render"));
    o.cot_drop = auto_drop ? CotDropPolicy::kHarmonyLibrary : CotDropPolicy::kNone;
    return o;
}

static StatusOr<ParserOptions> parser_options_from_json_impl(const Json& parser) {
    ParserOptions o;
    if (parser.is_null()) return o;
    if (!parser.is_object()) return must_be("parser", "an object");
    const std::string w = "parser";
    if (parser.contains("initial_role")) {
        ASSIGN_OR_RETURN(std::optional<std::string> role, opt_string(parser, "initial_role", w));
        o.initial_role.reset();
        if (role) {
            o.initial_role = parse_role(*role);
            if (!o.initial_role) return must_be(w + ".initial_role", "a role or null");
        }
    }
    ASSIGN_OR_RETURN(bool robust, opt_bool(parser, "robust", false, w));
    ASSIGN_OR_RETURN(bool strict, opt_bool(parser, "strict", !robust, w));
    o.mode = robust ? ParseMode::kRobust : strict ? ParseMode::kStrict : ParseMode::kLenient;
    if (const Json* d = field(parser, "declared_functions")) {
        if (!d->is_array()) return must_be(w + ".declared_functions", "an array of names");
        std::vector<std::string> names;
        for (const Json& n : *d) {
            if (!n.is_string()) return must_be(w + ".declared_functions", "an array of names");
            names.push_back(n.get<std::string>());
        }
        o.declared_functions = std::move(names);
    }
    return o;
}

Json parsed_messages_to_json(const std::vector<ParsedMessage>& messages) {
    Json out = Json::array();
    for (const ParsedMessage& m : messages) {
        Json j = {{"role", std::string(role_name(m.header.role))},   {"name", opt_json(m.header.name)},
                  {"recipient", opt_json(m.header.recipient)},       {"channel", opt_json(m.header.channel)},
                  {"content_type", opt_json(m.header.content_type)}, {"content", m.content}};
        if (m.header.recovered) j["recovered"] = true;
        out.push_back(std::move(j));
    }
    return out;
}

Json chat_completion_to_json(const ChatCompletion& c, bool include_ids) {
    Json message = {
        {"role", "assistant"}, {"content", opt_json(c.content)}, {"reasoning_content", opt_json(c.reasoning_content)}};
    if (!c.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ToolCall& t : c.tool_calls) {
            Json call = Json::object();
            if (include_ids) call["id"] = t.id;
            call["type"] = "function";
            call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
            calls.push_back(std::move(call));
        }
        message["tool_calls"] = std::move(calls);
    }
    return {{"message", std::move(message)}, {"finish_reason", c.finish_reason}};
}

Json chat_delta_to_json(const ChatDelta& d) {
    Json j = Json::object();
    if (d.content) j["content"] = *d.content;
    if (d.reasoning_content) j["reasoning_content"] = *d.reasoning_content;
    if (d.tool_call) {
        Json call = {{"index", d.tool_call->index}};
        if (d.tool_call->id) {
            call["id"] = *d.tool_call->id;
            call["type"] = "function";
        }
        Json fn = Json::object();
        if (d.tool_call->name) fn["name"] = *d.tool_call->name;
        fn["arguments"] = d.tool_call->arguments;
        call["function"] = std::move(fn);
        j["tool_calls"] = Json::array({std::move(call)});
    }
    return j;
}

StatusOr<ServerOptions> server_options_from_json(const Json& j) {
    try {
        return server_options_from_json_impl(j);
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed server_options: ") + e.what());
    }
}

StatusOr<RenderOptions> render_options_from_json(const Json& render) {
    try {
        return render_options_from_json_impl(render);
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed render_options: ") + e.what());
    }
}

StatusOr<ParserOptions> parser_options_from_json(const Json& parser) {
    try {
        return parser_options_from_json_impl(parser);
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed parser_options: ") + e.what());
    }
}

bool valid_date(const std::string& s, bool day) {
    const size_t n = day ? 10 : 7;
    if (s.size() != n || s[4] != '-' || (day && s[7] != '-')) return false;
    for (size_t i = 0; i < n; ++i)
        if (i != 4 && i != 7 && (s[i] < '0' || s[i] > '9')) return false;
    const int month = (s[5] - '0') * 10 + (s[6] - '0');
    if (month < 1 || month > 12) return false;
    if (!day) return true;
    const int year = std::stoi(s.substr(0, 4)), d = (s[8] - '0') * 10 + (s[9] - '0');
    static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return d >= 1 && d <= (month == 2 && !leap ? 28 : kDays[month - 1]);
}

bool valid_function_name(const std::string& name) {
    if (name.empty() || name.size() > 128) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
               c == '.' || c == ':';
    });
}

}  // namespace gptoss::harmony
