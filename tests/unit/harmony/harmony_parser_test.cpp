// StreamParser on a toy vocabulary (no tokenizer.json needed): UTF-8 across tokens, strict errors,
// harmony strict=false recovery, every robust repair of HARMONY.md §6.7, and random id streams.
#include "harmony/harmony_parser.h"

#include <gtest/gtest.h>

#include <random>

#include "harmony/harmony_chat.h"
#include "unit/harmony/toy_vocab.h"

namespace gptoss::harmony {
namespace {

using testing::kToyPieceBase;
using testing::toy_encode;
using testing::toy_token_bytes;

struct Parsed {
    std::vector<ParsedMessage> messages;
    std::vector<std::string> warnings;
    std::vector<std::string> deltas;
    Status status;
};

Parsed parse_ids(const std::vector<int32_t>& ids, ParserOptions options, bool feed_eos = true) {
    StreamParser parser(toy_token_bytes, options);
    Parsed p;
    auto collect = [&](const std::vector<Event>& events) {
        for (const Event& e : events) {
            if (e.type == EventType::kContentDelta) p.deltas.push_back(e.delta);
        }
    };
    for (int32_t id : ids) collect(parser.push(id));
    if (feed_eos) collect(parser.finish());
    p.messages = parser.messages();
    p.warnings = parser.warnings();
    p.status = parser.status();
    return p;
}

Parsed parse(std::string_view text, ParseMode mode = ParseMode::kRobust,
             std::optional<std::vector<std::string>> declared = std::nullopt, bool feed_eos = true) {
    ParserOptions o;
    o.mode = mode;
    o.declared_functions = std::move(declared);
    return parse_ids(toy_encode(text), o, feed_eos);
}

void expect_message(const ParsedMessage& m, Role role, std::optional<std::string> channel,
                    std::optional<std::string> recipient, std::optional<std::string> content_type,
                    const std::string& content, bool recovered = false) {
    EXPECT_EQ(m.header.role, role);
    EXPECT_EQ(m.header.channel, channel);
    EXPECT_EQ(m.header.recipient, recipient);
    EXPECT_EQ(m.header.content_type, content_type);
    EXPECT_EQ(m.content, content);
    EXPECT_EQ(m.header.recovered, recovered);
}

TEST(HarmonyParser, CanonicalCompletion) {
    Parsed p =
        parse("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
              ParseMode::kStrict);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[0], Role::kAssistant, "analysis", std::nullopt, std::nullopt, "Think.");
    expect_message(p.messages[1], Role::kAssistant, "final", std::nullopt, std::nullopt, "4");
    EXPECT_EQ(p.messages[0].terminator, Terminator::kEnd);
    EXPECT_EQ(p.messages[1].terminator, Terminator::kReturn);
}

TEST(HarmonyParser, MultiByteCharacterAcrossTokensIsHeldBack) {
    ParserOptions o;
    o.initial_role.reset();
    std::vector<int32_t> ids = toy_encode("<|start|>assistant<|message|>");
    ids.push_back(kToyPieceBase + 0);  // F0 9F
    ids.push_back(kToyPieceBase + 1);  // 92 96
    ids.push_back(kEnd);
    StreamParser parser(toy_token_bytes, o);
    size_t i = 0;
    for (; i + 3 < ids.size(); ++i) parser.push(ids[i]);
    std::vector<Event> first = parser.push(ids[i++]);
    EXPECT_TRUE(first.empty()) << "half a character yields no delta";
    std::vector<Event> second = parser.push(ids[i++]);
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second[0].delta, "\xF0\x9F\x92\x96");
    parser.push(ids[i]);
    ASSERT_EQ(parser.messages().size(), 1u);
    EXPECT_EQ(parser.messages()[0].content, "\xF0\x9F\x92\x96");
}

TEST(HarmonyParser, InvalidUtf8BecomesReplacementCharacters) {
    ParserOptions o;
    o.initial_role.reset();
    std::vector<int32_t> ids = toy_encode("<|start|>assistant<|message|>");
    ids.insert(ids.end(), {kToyPieceBase + 2, kToyPieceBase + 2, kToyPieceBase + 3, kEnd});
    Parsed p = parse_ids(ids, o);
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].content, " \xEF\xBF\xBD \xEF\xBF\xBDworked");
    std::string joined;
    for (const std::string& d : p.deltas) joined += d;
    EXPECT_EQ(joined, p.messages[0].content);
}

TEST(HarmonyParser, TruncatedCharacterAtEndOfStreamIsFlushed) {
    ParserOptions o;
    std::vector<int32_t> ids = toy_encode("<|channel|>final<|message|>ab");
    ids.push_back(kToyPieceBase + 4);  // E2 82: incomplete euro sign
    Parsed p = parse_ids(ids, o);
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].content, "ab\xEF\xBF\xBD");
    EXPECT_EQ(p.messages[0].terminator, Terminator::kNone);
}

TEST(HarmonyParser, DecodeUtf8LossyFollowsMaximalSubparts) {
    std::string bytes =
        "a\xC0\xAF"
        "b\xED\xA0\x80"
        "c\xF4\x90"
        "d\xE2\x82";
    EXPECT_EQ(decode_utf8_lossy(bytes, false),
              "a\xEF\xBF\xBD\xEF\xBF\xBD"
              "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
              "c\xEF\xBF\xBD\xEF\xBF\xBD"
              "d");
    EXPECT_EQ(bytes, "\xE2\x82");
    EXPECT_EQ(decode_utf8_lossy(bytes, true), "\xEF\xBF\xBD");
    EXPECT_TRUE(bytes.empty());
}

TEST(HarmonyParser, HeaderFormsTheModelEmits) {
    // HARMONY.md §2.3: all of these are the same tool call.
    for (std::string header : {"<|channel|>commentary to=functions.get_weather <|constrain|>json",
                               "<|channel|>commentary to=functions.get_weather<|constrain|>json",
                               " to=functions.get_weather<|channel|>commentary <|constrain|>json"}) {
        for (ParseMode mode : {ParseMode::kStrict, ParseMode::kRobust}) {
            Parsed p = parse(header + "<|message|>{}<|call|>", mode);
            ASSERT_TRUE(p.status.ok()) << header << ": " << p.status.to_string();
            ASSERT_EQ(p.messages.size(), 1u) << header;
            expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.get_weather", "<|constrain|>json",
                           "{}");
        }
    }
    Parsed code = parse("<|channel|>analysis to=browser.search code<|message|>{}<|call|>", ParseMode::kStrict);
    ASSERT_EQ(code.messages.size(), 1u);
    expect_message(code.messages[0], Role::kAssistant, "analysis", "browser.search", "code", "{}");
    // The constrain marker spelled as ordinary text (X15) parses the same.
    Parsed text_marker = parse("<|channel|>final <|constrain|>json<|message|>{}<|return|>", ParseMode::kStrict);
    ASSERT_EQ(text_marker.messages.size(), 1u);
    EXPECT_EQ(text_marker.messages[0].header.content_type, "<|constrain|>json");
    EXPECT_FALSE(text_marker.messages[0].header.recipient.has_value());
}

TEST(HarmonyParser, ToolReplyHeaderWithoutPresetRole) {
    ParserOptions o;
    o.initial_role.reset();
    o.mode = ParseMode::kStrict;
    Parsed p = parse_ids(toy_encode("<|start|>browser.search to=assistant<|channel|>commentary<|message|>r<|end|>"), o);
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].header.role, Role::kTool);
    EXPECT_EQ(p.messages[0].header.name, "browser.search");
    EXPECT_EQ(p.messages[0].header.recipient, "assistant");
}

TEST(HarmonyParser, StrictErrors) {
    ParserOptions o;
    o.initial_role.reset();
    o.mode = ParseMode::kStrict;
    Parsed p = parse_ids(toy_encode("hi"), o);
    EXPECT_NE(p.status.message().find("Unexpected token 104 while expecting start token 200006"), std::string::npos)
        << p.status.to_string();
    p = parse_ids(toy_encode("<|start|>wizard<|message|>x<|end|>"), o);
    EXPECT_NE(p.status.message().find("Unknown role: wizard"), std::string::npos) << p.status.to_string();
    p = parse_ids(toy_encode("<|start|>assistant<|channel|><|message|>x<|end|>"), o);
    EXPECT_NE(p.status.message().find("channel marker present but no channel value"), std::string::npos);
    p = parse("<|channel|>commentary Hello<|end|>", ParseMode::kStrict);
    EXPECT_NE(p.status.message().find("Unexpected EOS while waiting for message header to complete (strict)"),
              std::string::npos);
    // After an error, further ids are ignored and nothing aborts.
    StreamParser parser(toy_token_bytes, o);
    parser.push(5);
    EXPECT_FALSE(parser.status().ok());
    EXPECT_TRUE(parser.push(kStart).empty());
    EXPECT_TRUE(parser.finish().empty());
}

TEST(HarmonyParser, LenientRecoversFirstHeaderWithoutMessageToken) {
    // harmony test_streamable_parser_missing_message_token_tool_call (strict=false).
    Parsed p = parse(
        "... Let's use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
        "<|message|>{\"location\": \"Tokyo\"}<|call|>",
        ParseMode::kLenient);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[0], Role::kAssistant, std::nullopt, std::nullopt, std::nullopt,
                   "... Let's use the tool.");
    expect_message(p.messages[1], Role::kAssistant, "commentary", "functions.get_weather", "json",
                   "{\"location\": \"Tokyo\"}");
    Parsed strict = parse(
        "... Let's use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
        "<|message|>{}<|call|>",
        ParseMode::kStrict);
    EXPECT_NE(strict.status.message().find("unexpected tokens remaining in message header"), std::string::npos);
}

TEST(HarmonyParser, RobustStrayTerminatorsAreIgnored) {  // X1
    Parsed p = parse("<|channel|>final<|message|>5<|end|><|end|><|call|>");
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.warnings,
              (std::vector<std::string>{"stray stop token 200007 ignored", "stray stop token 200012 ignored"}));
}

TEST(HarmonyParser, RobustImplicitStart) {  // X2
    Parsed p = parse("<|channel|>analysis<|message|>A<|end|><|channel|>final<|message|>B<|return|>");
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[1], Role::kAssistant, "final", std::nullopt, std::nullopt, "B");
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"missing <|start|>: implicit '<|start|>assistant'"}));
}

TEST(HarmonyParser, RobustImplicitEnd) {  // X3
    Parsed p =
        parse("<|channel|>analysis<|message|>Thinking.<|start|>assistant<|channel|>final<|message|>Done.<|return|>");
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[0], Role::kAssistant, "analysis", std::nullopt, std::nullopt, "Thinking.");
    EXPECT_EQ(p.messages[0].terminator, Terminator::kImplicit);
    expect_message(p.messages[1], Role::kAssistant, "final", std::nullopt, std::nullopt, "Done.");
    Parsed c = parse("<|channel|>analysis<|message|>T<|channel|>final<|message|>D<|return|>");
    ASSERT_EQ(c.messages.size(), 2u);
    expect_message(c.messages[1], Role::kAssistant, "final", std::nullopt, std::nullopt, "D");
}

TEST(HarmonyParser, RobustRepeatedStartAndRoleWords) {  // X4
    Parsed p = parse("<|start|>assistant<|channel|>final<|message|>Hi.<|return|>");
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "final", std::nullopt, std::nullopt, "Hi.");
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"repeated <|start|> ignored"}));
    Parsed glued = parse("assistantassistant<|channel|>final<|message|>Hi.<|return|>");
    ASSERT_EQ(glued.messages.size(), 1u);
    expect_message(glued.messages[0], Role::kAssistant, "final", std::nullopt, std::nullopt, "Hi.");
    // A non-empty header cut by <|start|> is recovered, then parsing restarts.
    Parsed cut = parse("I refuse<|start|>assistant<|channel|>final<|message|>No.<|return|>");
    ASSERT_EQ(cut.messages.size(), 2u);
    expect_message(cut.messages[0], Role::kAssistant, std::nullopt, std::nullopt, std::nullopt, "I refuse", true);
}

TEST(HarmonyParser, RobustChannelGarbage) {  // X5
    Parsed p = parse("<|channel|>analysis?\?<|message|>x<|end|>");
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].header.channel, "analysis");
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"channel sanitized 'analysis?\?'->'analysis'"}));
    Parsed dashes = parse(
        "<|channel|>\xE2\x80\x93\xE2\x80\x93"
        "commentary<|message|>x<|end|>");
    EXPECT_EQ(dashes.messages.at(0).header.channel, "commentary");
    Parsed unknown = parse("<|channel|>thoughts<|message|>x<|end|>");
    EXPECT_EQ(unknown.messages.at(0).header.channel, "analysis");
}

TEST(HarmonyParser, RobustDoubledChannelAndToAssistant) {  // X5 + X6
    Parsed p = parse(
        "<|channel|>commentary to=assistant<|channel|>commentary?<|message|>Plan.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Hi.<|return|>");
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", std::nullopt, std::nullopt, "Plan.", true);
    expect_message(p.messages[1], Role::kAssistant, "final", std::nullopt, std::nullopt, "Hi.");
    ChatCompletion c = to_chat_completion(p.messages, {}, false);
    EXPECT_EQ(c.content, "Hi.");
    EXPECT_EQ(c.reasoning_content, "Plan.");
}

TEST(HarmonyParser, RobustLeftoverWords) {  // X6
    Parsed p = parse("<|channel|>commentary to=functions.f json extra words<|message|>{}<|call|>", ParseMode::kRobust,
                     std::vector<std::string>{"f"});
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.f", "json", "{}", false);
    Parsed hidden = parse("<|channel|>final 2?<|message|>x<|return|>");
    ASSERT_EQ(hidden.messages.size(), 1u);
    EXPECT_TRUE(hidden.messages[0].header.recovered);
    Parsed bad = parse("<|channel|>commentary to=fun{ctions<|message|>x<|end|>");
    ASSERT_EQ(bad.messages.size(), 1u);
    EXPECT_FALSE(bad.messages[0].header.recipient.has_value());
    EXPECT_TRUE(bad.messages[0].header.recovered);
}

// Two "to=" words: the last names the recipient, as §6.3 step 5 and the strict parser read it (robust mode took the
// first, calling an undeclared function over the declared one); the other is a dropped leftover (X6).
TEST(HarmonyParser, RobustLastToWordIsTheRecipient) {
    Parsed p = parse("<|channel|>commentary to=functions.a to=functions.f json<|message|>{}<|call|>",
                     ParseMode::kRobust, std::vector<std::string>{"f"});
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.f", "json", "{}", false);
    ASSERT_EQ(p.warnings.size(), 1u);
    EXPECT_NE(p.warnings[0].find("to=functions.a"), std::string::npos) << p.warnings[0];
}

TEST(HarmonyParser, RobustGluedJsonSuffix) {  // X8
    Parsed p = parse("<|channel|>commentary to=functions.shelljson<|message|>{}<|call|>", ParseMode::kRobust,
                     std::vector<std::string>{"shell"});
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.shell", "json", "{}");
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"glued json suffix split from recipient"}));
}

TEST(HarmonyParser, RobustHeaderWithoutMessageToken) {  // X10
    Parsed p = parse("<|channel|>commentary 2?<|end|><|start|>assistant<|channel|>final<|message|>Hi.<|return|>");
    ASSERT_EQ(p.messages.size(), 2u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", std::nullopt, std::nullopt, "2?", true);
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"header without <|message|> recovered as content"}));
    Parsed eos = parse("I must refuse");
    ASSERT_EQ(eos.messages.size(), 1u);
    expect_message(eos.messages[0], Role::kAssistant, std::nullopt, std::nullopt, std::nullopt, "I must refuse", true);
}

TEST(HarmonyParser, RobustStreamEndingInACallHeaderGivesNothing) {
    // max_tokens cut the header of a call (tool_choice "required" forces "to=functions."): no
    // content, no call; a header without a recipient is still recovered as content (above).
    for (const char* cut :
         {"<|channel|>commentary to=functions. Fran", "<|channel|>commentary to=functions.get_weather",
          "<|channel|>commentary to=functions.get_weather <|constrain|>js", "to=functions.f"}) {
        SCOPED_TRACE(cut);
        Parsed p = parse(cut, ParseMode::kRobust, std::vector<std::string>{"get_weather"});
        EXPECT_TRUE(p.status.ok());
        EXPECT_TRUE(p.messages.empty());
        EXPECT_EQ(p.warnings, (std::vector<std::string>{"header of a cut call dropped"}));
    }
    // The same header ended by a stop token, its recipient never named (the model stopped right after the
    // forced "to=functions."): nothing, where it was recovered as content ("to=functions." as reasoning).
    for (const char* stopped :
         {"<|channel|>commentary to=functions.<|call|>", "<|channel|>commentary to=functions.<|end|>",
          "<|channel|>commentary to=functions. <|constrain|><|return|>"}) {
        SCOPED_TRACE(stopped);
        Parsed p = parse(stopped, ParseMode::kRobust, std::vector<std::string>{"get_weather"});
        EXPECT_TRUE(p.status.ok());
        EXPECT_TRUE(p.messages.empty());
        EXPECT_EQ(p.warnings, (std::vector<std::string>{"header of a cut call dropped"}));
    }
}

// X10 for a named call: a terminator before <|message|> with words past the header's fields (the arguments
// written without <|message|>): those words are recovered as reasoning, and no call is made (they were dropped
// with the header, leaving an empty answer).
TEST(HarmonyParser, RobustCallHeaderWithoutMessageTokenKeepsItsWords) {
    const struct {
        const char* text;
        const char* content;
    } cases[] = {
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json{\"city\":\"Paris\"}<|call|>",
         "{\"city\":\"Paris\"}"},
        {"<|channel|>commentary to=functions.get_weather json {\"a\":1}<|end|>", "{\"a\":1}"},
        {"to=functions.get_weather<|channel|>commentary {\"a\":1}<|call|>", "{\"a\":1}"},
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json checking the city<|return|>",
         "checking the city"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.text);
        Parsed p = parse(c.text, ParseMode::kRobust, std::vector<std::string>{"get_weather"});
        EXPECT_TRUE(p.status.ok());
        ASSERT_EQ(p.messages.size(), 1u);
        expect_message(p.messages[0], Role::kAssistant, "commentary", std::nullopt, std::nullopt, c.content, true);
        EXPECT_EQ(p.warnings, (std::vector<std::string>{"call header without <|message|> recovered as content"}));
    }
    // Only its fields: nothing to keep.
    for (const char* bare : {"<|channel|>commentary to=functions.get_weather<|call|>",
                             "<|channel|>commentary to=functions.get_weather <|constrain|>json<|end|>"}) {
        SCOPED_TRACE(bare);
        Parsed p = parse(bare, ParseMode::kRobust, std::vector<std::string>{"get_weather"});
        EXPECT_TRUE(p.messages.empty());
        EXPECT_EQ(p.warnings, (std::vector<std::string>{"header of a cut call dropped"}));
    }
}

TEST(HarmonyParser, RobustUnicodeJunkAroundRecipient) {  // X11
    Parsed p = parse(
        "<|channel|>commentary to=functions.get_weather\xC2\xA0\xE2\x80\x8B <|constrain|>json<|message|>{}<|call|>");
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.get_weather", "<|constrain|>json", "{}");
    EXPECT_TRUE(p.warnings.empty());
}

TEST(HarmonyParser, RobustLongHeaderIsCut) {  // X13
    std::string header(300, 'x');
    Parsed p = parse(header + "<|message|>y<|end|>");
    EXPECT_TRUE(p.status.ok());
    ASSERT_FALSE(p.messages.empty());
    EXPECT_TRUE(p.messages[0].header.recovered);
    // Strict and lenient bound no header, as harmony (before session 67 both failed at 256 tokens): strict takes the
    // one word as the recipient (harmony's parse_header_from_string: "a standalone recipient"), and a lenient
    // completion that writes a long answer without <|message|> keeps it whole (harmony strict=false), while strict
    // fails at the end of the stream.
    Parsed strict = parse(header + "<|message|>y<|end|>", ParseMode::kStrict);
    ASSERT_TRUE(strict.status.ok()) << strict.status.to_string();
    ASSERT_EQ(strict.messages.size(), 1u);
    expect_message(strict.messages[0], Role::kAssistant, std::nullopt, header, std::nullopt, "y");
    std::string words = "word";
    for (int i = 1; i < 150; ++i) words += " word";
    EXPECT_GT(toy_encode(words).size(), ParserOptions{}.max_header_tokens);
    Parsed lenient = parse(words + "<|end|>", ParseMode::kLenient);
    ASSERT_TRUE(lenient.status.ok()) << lenient.status.to_string();
    ASSERT_EQ(lenient.messages.size(), 1u);
    expect_message(lenient.messages[0], Role::kAssistant, std::nullopt, std::nullopt, std::nullopt, words);
    Parsed strict_words = parse(words + "<|end|>", ParseMode::kStrict);
    EXPECT_NE(strict_words.status.message().find("Unexpected EOS while waiting for message header to complete"),
              std::string::npos)
        << strict_words.status.to_string();
}

TEST(HarmonyParser, RobustDiscardsAfterStopToken) {  // X14
    Parsed p = parse(
        "<|channel|>commentary to=functions.f json<|message|>{}<|call|><|start|>assistant<|channel|>commentary"
        "<|message|>more<|end|>");
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.warnings, (std::vector<std::string>{"tokens after a stop token discarded"}));
}

TEST(HarmonyParser, RobustRecipientInChannelSlot) {  // X16
    Parsed p = parse("<|channel|>functions.get_weather <|constrain|>json<|message|>{\"city\":\"Rome\"}<|call|>");
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "commentary", "functions.get_weather", "<|constrain|>json",
                   "{\"city\":\"Rome\"}");
    ChatCompletion c = to_chat_completion(p.messages, {}, false);
    ASSERT_EQ(c.tool_calls.size(), 1u);
    EXPECT_EQ(c.tool_calls[0].name, "get_weather");
    EXPECT_EQ(c.finish_reason, "tool_calls");
}

TEST(HarmonyParser, RobustToolCallOnAnalysisChannel) {  // X7 / X9 neighbours: a valid header, no warning
    Parsed p = parse("<|channel|>analysis to=functions.ffgrep code<|message|>{\"path\":\"\"}<|call|>",
                     ParseMode::kRobust, std::vector<std::string>{"ffgrep"});
    ASSERT_EQ(p.messages.size(), 1u);
    expect_message(p.messages[0], Role::kAssistant, "analysis", "functions.ffgrep", "code", "{\"path\":\"\"}");
    EXPECT_TRUE(p.warnings.empty());
}

TEST(HarmonyParser, SpecialTokensInsideContent) {
    // Strict keeps harmony's behaviour (literal text); robust drops unexpected specials.
    Parsed strict = parse("<|channel|>final<|message|>a<|constrain|>b<|return|>", ParseMode::kStrict);
    EXPECT_EQ(strict.messages.at(0).content, "a<|constrain|>b");
    Parsed robust = parse("<|channel|>final<|message|>a<|constrain|>b<|return|>");
    EXPECT_EQ(robust.messages.at(0).content, "ab");
    EXPECT_EQ(robust.warnings.size(), 1u);
}

TEST(HarmonyParser, UnknownIdsNeverCrash) {
    ParserOptions o;
    for (ParseMode mode : {ParseMode::kStrict, ParseMode::kLenient, ParseMode::kRobust}) {
        o.mode = mode;
        StreamParser parser(toy_token_bytes, o);
        for (int32_t id : {-1, 5000, 201088, 300000, 2147483647, -2147483647 - 1}) parser.push(id);
        parser.finish();
        if (mode == ParseMode::kStrict) {
            EXPECT_FALSE(parser.status().ok());
        } else {
            EXPECT_EQ(parser.warnings().size(), 6u);
        }
        // Lenient keeps harmony's error for EOS inside a header; robust never fails.
        if (mode == ParseMode::kRobust) {
            EXPECT_TRUE(parser.status().ok());
        }
    }
}

TEST(HarmonyParser, RandomStreamsKeepInvariants) {
    std::mt19937 rng(7);
    for (int iter = 0; iter < 3000; ++iter) {
        ParserOptions o;
        o.mode = static_cast<ParseMode>(iter % 3);
        if (iter % 5 == 0) o.initial_role.reset();
        if (iter % 7 == 0) o.declared_functions = std::vector<std::string>{"f", "get_weather"};
        StreamParser parser(toy_token_bytes, o);
        std::vector<std::string> contents;
        int n = static_cast<int>(rng() % 80);
        for (int i = 0; i < n; ++i) {
            int32_t id;
            switch (rng() % 4) {
                case 0: id = kFirstSpecialId + static_cast<int32_t>(rng() % 21); break;
                case 1: id = static_cast<int32_t>(rng() % 256); break;
                case 2: id = kToyPieceBase + static_cast<int32_t>(rng() % 6); break;
                default: id = static_cast<int32_t>("to=functions.f json analysis final commentary "[rng() % 46]); break;
            }
            for (const Event& e : parser.push(id)) {
                if (e.type == EventType::kMessageStart) contents.emplace_back();
                if (e.type == EventType::kContentDelta) contents.back() += e.delta;
            }
        }
        for (const Event& e : parser.finish()) {
            if (e.type == EventType::kMessageStart) contents.emplace_back();
            if (e.type == EventType::kContentDelta) contents.back() += e.delta;
        }
        if (o.mode == ParseMode::kRobust) {
            ASSERT_TRUE(parser.status().ok());
        }
        // Deltas of each message add up to its content (a strict failure may leave one unfinished).
        if (parser.status().ok()) {
            ASSERT_EQ(contents.size(), parser.messages().size());
        }
        ASSERT_GE(contents.size(), parser.messages().size());
        for (size_t i = 0; i < parser.messages().size(); ++i) EXPECT_EQ(contents[i], parser.messages()[i].content);
        to_chat_completion(parser.messages(), {}, iter % 2 == 0);
    }
}

}  // namespace
}  // namespace gptoss::harmony
