#include "harmony/harmony_chat.h"

#include <algorithm>
#include <random>

namespace gptoss::harmony {
namespace {

std::string random_tool_call_id() {
    static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    return id;
}

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
std::string ltrim_ascii(const std::string& s) {
    size_t b = 0;
    while (b < s.size() && ascii_space(s[b])) ++b;
    return s.substr(b);
}
std::string rtrim_ascii(const std::string& s) {
    size_t e = s.size();
    while (e > 0 && ascii_space(s[e - 1])) --e;
    return s.substr(0, e);
}
std::string trim_ascii(const std::string& s) { return rtrim_ascii(ltrim_ascii(s)); }

bool is_bare_function_word(const std::string& r) {
    static const char* const kNotFunctions[] = {"assistant", "all",    "user",    "system",   "developer",
                                                "tool",      "python", "browser", "container"};
    if (r.empty()) return false;
    for (const char* w : kNotFunctions) {
        if (r == w) return false;
    }
    return std::all_of(r.begin(), r.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    });
}

}  // namespace

std::optional<std::string> function_name(const std::string& recipient, const ChatMappingOptions& options) {
    constexpr std::string_view kPrefix = "functions.";
    if (recipient.size() > kPrefix.size() && recipient.compare(0, kPrefix.size(), kPrefix) == 0) {
        return recipient.substr(kPrefix.size());
    }
    if (options.declared_functions) {
        const auto& d = *options.declared_functions;
        if (std::find(d.begin(), d.end(), recipient) != d.end()) return recipient;
        return std::nullopt;
    }
    if (is_bare_function_word(recipient)) return recipient;
    return std::nullopt;
}

ChatRoute chat_route(const MessageHeader& header, const ChatMappingOptions& options) {
    if (header.role != Role::kAssistant) return ChatRoute::kHidden;
    if (header.recipient) {
        if (function_name(*header.recipient, options) && options.function_calls_enabled) return ChatRoute::kToolCall;
        return ChatRoute::kReasoning;  // built-in tools, unknown recipients, disabled calls
    }
    if (header.recovered) return ChatRoute::kReasoning;
    if (header.channel && *header.channel == "final") return ChatRoute::kContent;
    if (header.channel && *header.channel == "commentary" && !options.preambles_to_reasoning)
        return ChatRoute::kContent;
    return ChatRoute::kReasoning;
}

ChatMapper::ChatMapper(ChatMappingOptions options) : options_(std::move(options)) {
    if (!options_.make_tool_call_id) options_.make_tool_call_id = random_tool_call_id;
}

std::vector<ChatDelta> ChatMapper::on_events(const std::vector<Event>& events) {
    std::vector<ChatDelta> out;
    for (const Event& e : events) {
        switch (e.type) {
            case EventType::kMessageStart:
                route_ = chat_route(e.header, options_);
                if (route_ == ChatRoute::kToolCall && options_.max_tool_calls > 0 &&
                    calls_.size() >= options_.max_tool_calls)
                    route_ = ChatRoute::kReasoning;
                first_delta_ = true;
                if (route_ == ChatRoute::kToolCall) {
                    Call c;
                    c.call.id = options_.make_tool_call_id();
                    c.call.name = function_name(*e.header.recipient, options_).value_or("");
                    calls_.push_back(c);
                    ChatDelta d;
                    d.tool_call = ToolCallDelta{calls_.size() - 1, c.call.id, c.call.name, ""};
                    out.push_back(std::move(d));
                }
                break;
            case EventType::kContentDelta: {
                // Texts of several messages in one field are joined with "\n"; the separator goes
                // out with the next message's first delta, so streamed == non-streamed.
                auto append = [&](std::string& field, bool& has_field) {
                    std::string text = first_delta_ && has_field ? "\n" + e.delta : e.delta;
                    field += text;
                    has_field = true;
                    return text;
                };
                ChatDelta d;
                switch (route_) {
                    case ChatRoute::kContent: d.content = append(content_, has_content_); break;
                    case ChatRoute::kReasoning: d.reasoning_content = append(reasoning_, has_reasoning_); break;
                    case ChatRoute::kToolCall: {
                        Call& c = calls_.back();
                        c.call.arguments += e.delta;
                        std::string text = c.args.feed(e.delta);
                        if (text.empty()) continue;
                        d.tool_call = ToolCallDelta{calls_.size() - 1, std::nullopt, std::nullopt, text};
                        break;
                    }
                    case ChatRoute::kHidden: continue;
                }
                first_delta_ = false;
                out.push_back(std::move(d));
                break;
            }
            case EventType::kMessageEnd:
                if (route_ == ChatRoute::kToolCall) {
                    Call& c = calls_.back();
                    c.terminated = e.terminator != Terminator::kNone;
                    // A whole call without arguments (`<|message|><|call|>`) has "{}", what a client's JSON.parse
                    // takes and an argument-less function gets; it had been "", which no JSON parser reads.
                    if (c.terminated && c.args.text().empty()) {
                        c.call.arguments = kNoArguments;
                        c.args.feed(kNoArguments);
                        ChatDelta d;
                        d.tool_call = ToolCallDelta{calls_.size() - 1, std::nullopt, std::nullopt, kNoArguments};
                        out.push_back(std::move(d));
                    }
                }
                route_ = ChatRoute::kHidden;
                break;
        }
    }
    return out;
}

std::string TrimmedArguments::feed(const std::string& delta) {
    std::string text = delta;
    if (!started_) {
        text = ltrim_ascii(text);
        if (text.empty()) return text;
        started_ = true;
    }
    text = held_ + text;
    const size_t keep = rtrim_ascii(text).size();
    held_ = text.substr(keep);
    text.resize(keep);
    text_ += text;
    return text;
}

ChatCompletion ChatMapper::result(bool hit_length_limit) const {
    ChatCompletion r;
    if (has_content_) r.content = content_;
    if (has_reasoning_) r.reasoning_content = reasoning_;
    for (const Call& c : calls_) {
        if (hit_length_limit && !c.terminated) continue;  // a truncated call is not a call
        ToolCall call = c.call;
        call.arguments = trim_ascii(call.arguments);
        r.tool_calls.push_back(std::move(call));
    }
    r.finish_reason = !r.tool_calls.empty() ? "tool_calls" : hit_length_limit ? "length" : "stop";
    return r;
}

ChatCompletion to_chat_completion(const std::vector<ParsedMessage>& messages, const ChatMappingOptions& options,
                                  bool hit_length_limit) {
    ChatMapper mapper(options);
    for (size_t i = 0; i < messages.size(); ++i) {
        std::vector<Event> events(3);
        events[0].type = EventType::kMessageStart;
        events[0].header = messages[i].header;
        events[1].type = EventType::kContentDelta;
        events[1].delta = messages[i].content;
        events[2].type = EventType::kMessageEnd;
        events[2].terminator = messages[i].terminator;
        for (Event& e : events) e.message_index = i;
        if (messages[i].content.empty()) events.erase(events.begin() + 1);
        mapper.on_events(events);
    }
    return mapper.result(hit_length_limit);
}

std::vector<ChatDelta> coalesce_deltas(const std::vector<ChatDelta>& deltas) {
    std::vector<ChatDelta> out;
    for (const ChatDelta& d : deltas) {
        if (!out.empty()) {
            ChatDelta& last = out.back();
            if (d.content && last.content) {
                *last.content += *d.content;
                continue;
            }
            if (d.reasoning_content && last.reasoning_content) {
                *last.reasoning_content += *d.reasoning_content;
                continue;
            }
            if (d.tool_call && last.tool_call && d.tool_call->index == last.tool_call->index && !d.tool_call->id) {
                last.tool_call->arguments += d.tool_call->arguments;
                continue;
            }
        }
        out.push_back(d);
    }
    return out;
}

}  // namespace gptoss::harmony
