// Harmony prompt renderer (HARMONY.md §2-§5): Conversation -> segments (special ids and text
// pieces) -> token ids. Text pieces are encoded one by one with encode_ordinary, so text never
// yields special ids (§1.2); special tokens are emitted by id.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "harmony/harmony_types.h"

namespace gptoss::tokenizer {
class BpeTokenizer;
}

namespace gptoss::harmony {

// Which assistant `analysis` messages are left out of the prompt (HARMONY.md §5.4).
enum class CotDropPolicy {
    kNone,            // keep everything (harmony auto_drop_analysis=false)
    kHarmonyLibrary,  // harmony auto_drop_analysis=true: only when the last assistant message is
                      // `final`, drop analysis messages before the FIRST final message
    kCompletedTurns,  // this server's rule: drop every analysis message (no recipient) that a later
                      // assistant `final` message follows
};

enum class RenderMode {
    kCompletion,    // conversation + "<|start|>{next_role}" (the generation prompt)
    kConversation,  // conversation only
    kTraining,      // conversation; a trailing assistant `final` message ends with <|return|>
};

struct RenderOptions {
    RenderMode mode = RenderMode::kCompletion;
    Role next_role = Role::kAssistant;
    CotDropPolicy cot_drop = CotDropPolicy::kCompletedTurns;
};

// One piece of a rendered prompt: a special token (special_id >= 0) or a text piece.
struct Segment {
    int32_t special_id = -1;
    std::string text;
};

// Removes the analysis messages the policy drops (idempotent).
void apply_cot_drop(std::vector<Message>& messages, CotDropPolicy policy);

// The prompt as segments. Fails (invalid_argument) on a tool message without an author name, or a
// system/developer content block in a message of another role.
StatusOr<std::vector<Segment>> render_segments(const Conversation& conversation, const RenderOptions& options);

// The prompt as token ids.
StatusOr<std::vector<int32_t>> render(const tokenizer::BpeTokenizer& tokenizer, const Conversation& conversation,
                                      const RenderOptions& options);

// The prompt as text, special tokens written literally ("<|start|>user<|message|>...").
StatusOr<std::string> render_text(const Conversation& conversation, const RenderOptions& options);

// Token ids of segments (text pieces encoded separately with encode_ordinary).
std::vector<int32_t> encode_segments(const tokenizer::BpeTokenizer& tokenizer, const std::vector<Segment>& segments);
std::string segments_text(const std::vector<Segment>& segments);

// Text to ids with every special token's text recognised, as tiktoken's o200k_harmony encodes with
// allowed_special="all": the tokenizer file's added tokens and the reserved ids it may not list ("<|reserved_200500|>"
// is 200500 where a tokenizer.json stops at 200018; "<|reserved_200018|>" is tiktoken's second name for 200018).
// The raw interfaces' encoding (`gptoss tokenize --special`, a completions text prompt, /tokenize's prompt).
std::vector<int32_t> encode_all_special(const tokenizer::BpeTokenizer& tokenizer, std::string_view text);

// The system / developer message bodies and the tools section (HARMONY.md §3.1, §4.1, §4.2).
std::string render_system_body(const SystemContent& system, bool conversation_has_function_tools);
std::string render_developer_body(const DeveloperContent& developer);
std::string render_tools_section(const std::vector<ToolNamespace>& namespaces);

// JSON schema -> TypeScript-like type text, TS(schema, indent) of HARMONY.md §4.3. Schemas nested
// deeper than 64 levels render as `any` (bounded recursion on request input).
std::string schema_to_typescript(const Json& schema, const std::string& indent);

}  // namespace gptoss::harmony
