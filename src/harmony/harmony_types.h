// Harmony data model (HARMONY.md §2-§4): roles, messages with their header fields, the system and
// developer contents, tool namespaces, and the special-token ids of o200k_harmony.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss::harmony {

// Insertion-ordered JSON: tool parameter schemas are rendered in document order (HARMONY.md §4.3).
using Json = nlohmann::ordered_json;

// Special tokens (HARMONY.md §1.1). Emitted by id, never produced from text.
inline constexpr int32_t kStartOfText = 199998;  // HF BOS; never rendered by Harmony
inline constexpr int32_t kEndOfText = 199999;    // pad / legacy EOS; safety stop id
inline constexpr int32_t kReturn = 200002;       // end of the final answer; stop token
inline constexpr int32_t kConstrain = 200003;    // "<|constrain|>json" content types
inline constexpr int32_t kChannel = 200005;
inline constexpr int32_t kStart = 200006;
inline constexpr int32_t kEnd = 200007;  // ends a message; NOT a stop token
inline constexpr int32_t kMessage = 200008;
inline constexpr int32_t kCall = 200012;         // ends a tool call; stop token
inline constexpr int32_t kEndOfPrompt = 200018;  // unused by Harmony
inline constexpr int32_t kFirstSpecialId = 199998;
inline constexpr int32_t kVocabEnd = 201088;  // one past the largest id of o200k_harmony

// Compact JSON as serde_json writes it (the harmony library's renderer): no spaces, floats in ryu's shortest form
// (1e-5 -> 0.00001, 1e15 -> 1000000000000000.0, 1e16 -> 1e16, -0.0 -> -0.0) where nlohmann writes 1e-05 /
// 1e+15 / -0.0 differently. Invalid UTF-8 in strings is replaced, never thrown on.
std::string json_compact(const Json& j);
// A finite double as serde_json / ryu writes it; NaN and infinities as null.
std::string json_float_text(double v);

// Literal text of a special id ("<|start|>", "<|reserved_200013|>"); nullopt for ordinary ids.
std::optional<std::string> special_token_text(int32_t id);
// Ids that end generation (HARMONY.md §2.4): <|return|>, <|call|>, and <|endoftext|> as a safety net.
inline constexpr int32_t kGenerationStopIds[] = {kReturn, kCall, kEndOfText};

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool };
std::string_view role_name(Role role);
std::optional<Role> parse_role(std::string_view name);

enum class ReasoningEffort { kLow, kMedium, kHigh };
std::string_view reasoning_effort_name(ReasoningEffort effort);

inline constexpr std::string_view kDefaultModelIdentity = "You are ChatGPT, a large language model trained by OpenAI.";
inline constexpr std::string_view kDefaultKnowledgeCutoff = "2024-06";

struct ToolDescription {
    std::string name;
    std::string description;         // may span lines; "" renders no comment
    std::optional<Json> parameters;  // JSON schema; nullopt renders `() => any`
};

// A namespace of tools: "functions" (developer message) or a built-in ("browser", "python").
struct ToolNamespace {
    std::string name;
    std::optional<std::string> description;
    std::vector<ToolDescription> tools;
};

// The canonical built-in namespaces the model was trained on (HARMONY.md §3.3).
ToolNamespace browser_namespace();
ToolNamespace python_namespace();

struct SystemContent {
    std::optional<std::string> model_identity = std::string(kDefaultModelIdentity);
    std::optional<std::string> knowledge_cutoff = std::string(kDefaultKnowledgeCutoff);
    std::optional<std::string> conversation_start_date;  // "YYYY-MM-DD"; line omitted when unset
    std::optional<ReasoningEffort> reasoning_effort = ReasoningEffort::kMedium;
    std::vector<std::string> valid_channels = {"analysis", "commentary", "final"};  // empty: no line
    bool channel_required = true;
    std::vector<ToolNamespace> tools;  // built-ins; rendered sorted by namespace name
};

// A structured-output format (HARMONY.md §4.4): rendered after the tools as "# Response Formats".
struct ResponseFormat {
    std::string name;
    std::optional<std::string> description;
    Json schema;  // rendered compact
};

struct DeveloperContent {
    std::optional<std::string> instructions;  // rendered only when non-empty
    std::vector<ToolNamespace> tools;         // normally one namespace, "functions"
    std::optional<ResponseFormat> response_format{};
};

// One Harmony message. For role kTool, `name` is the author ("functions.get_weather"); for other
// roles an optional name renders as "role:name". The body is system_content (system messages),
// developer_content (developer messages) or plain `content`.
struct Message {
    Role role = Role::kUser;
    std::optional<std::string> name;
    std::optional<std::string> recipient;     // "functions.x", "browser.search", "assistant"
    std::optional<std::string> channel;       // "analysis", "commentary", "final"
    std::optional<std::string> content_type;  // "<|constrain|>json", "json", "code"
    std::string content;
    std::optional<SystemContent> system_content;
    std::optional<DeveloperContent> developer_content;

    static Message text(Role role, std::string content) {
        Message m;
        m.role = role;
        m.content = std::move(content);
        return m;
    }
};

struct Conversation {
    std::vector<Message> messages;
};

}  // namespace gptoss::harmony
