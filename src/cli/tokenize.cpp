// gptoss tokenize   --tokenizer PATH [--jsonl] [--special]: stdin text -> JSON array(s) of ids
// gptoss detokenize --tokenizer PATH [--jsonl]: JSON array(s) of ids on stdin -> text
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/json_shape.h"
#include "harmony/harmony_render.h"
#include "harmony/harmony_types.h"
#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::cli {
namespace {

using Json = nlohmann::json;

struct TokenizeOptions {
    std::string tokenizer;
    bool jsonl = false;
    bool special = false;
};

StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> load_tokenizer(const std::string& flag) {
    std::string path = flag;
    if (path.empty()) {
        auto found = tokenizer::find_tokenizer_file("");
        if (!found) {
            return not_found("no tokenizer.json: pass --tokenizer PATH or set GPTOSS_TOKENIZER");
        }
        path = *found;
    }
    return tokenizer::BpeTokenizer::from_file(path);
}

std::string read_stdin() {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Calls f(line, line_number) for each line ("\n" or "\r\n" endings; no line after a last newline). An empty line
// is an error, as any line that is not what --jsonl asks for (skipped, it shifted every later output line).
template <typename F>
int for_each_line(const std::string& input, F&& f) {
    size_t pos = 0;
    int line_number = 0;
    while (pos < input.size()) {
        size_t end = input.find('\n', pos);
        if (end == std::string::npos) end = input.size();
        std::string_view line(input.data() + pos, end - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        ++line_number;
        pos = end + 1;
        if (line.empty())
            return fail("line " + std::to_string(line_number) + ": empty (each line must be one JSON value)");
        if (int rc = f(line, line_number); rc != 0) return rc;
    }
    return 0;
}

std::string ids_json(const std::vector<int32_t>& ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
    }
    out += ']';
    return out;
}

int run_tokenize(const TokenizeOptions& o) {
    auto tok = load_tokenizer(o.tokenizer);
    if (!tok.ok()) return fail(tok.status().message());
    auto encode = [&](std::string_view text) {
        return o.special ? harmony::encode_all_special(**tok, text) : (*tok)->encode_ordinary(text);
    };
    std::string input = read_stdin();
    if (!o.jsonl) {
        std::string line = ids_json(encode(input)) + "\n";
        std::fwrite(line.data(), 1, line.size(), stdout);
        return 0;
    }
    return for_each_line(input, [&](std::string_view line, int line_number) {
        Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);  // a string: flat by what it must be
        if (!j.is_string()) return fail("line " + std::to_string(line_number) + ": not a JSON string");
        std::string out = ids_json(encode(j.get_ref<const std::string&>())) + "\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    });
}

StatusOr<std::vector<int32_t>> parse_ids(std::string_view text) {
    // An array of numbers nests one deep (deep text would overflow the stack in nlohmann's recursive values).
    if (std::string e = json_shape_error(text, 1, INT32_MAX, "input"); !e.empty())
        return invalid_argument(e + " (not a JSON array of token ids)");
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) return invalid_argument("not a JSON array of token ids");
    std::vector<int32_t> ids;
    ids.reserve(j.size());
    for (const Json& v : j) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
            return invalid_argument("not a token id: " + v.dump());
        }
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
}

// Ids to bytes as tiktoken's o200k_harmony decodes them: o200k_harmony's reserved ids that the tokenizer file
// does not list (200019-201087 in one that stops at 200018) by their names ("<|reserved_200019|>").
StatusOr<std::string> decode_ids(const tokenizer::BpeTokenizer& tok, const std::vector<int32_t>& ids) {
    std::string out;
    for (int32_t id : ids) {
        if (std::optional<std::string_view> bytes = tok.token_bytes(id)) {
            out.append(*bytes);
        } else if (std::optional<std::string> name = harmony::special_token_text(id)) {
            out += *name;
        } else {
            return invalid_argument("unknown token id " + std::to_string(id));
        }
    }
    return out;
}

int run_detokenize(const TokenizeOptions& o) {
    auto tok = load_tokenizer(o.tokenizer);
    if (!tok.ok()) return fail(tok.status().message());
    std::string input = read_stdin();
    if (!o.jsonl) {
        auto ids = parse_ids(input);
        if (!ids.ok()) return fail(ids.status().message());
        auto text = decode_ids(**tok, *ids);
        if (!text.ok()) return fail(text.status().message());
        std::fwrite(text->data(), 1, text->size(), stdout);
        return 0;
    }
    return for_each_line(input, [&](std::string_view line, int line_number) {
        auto ids = parse_ids(line);
        if (!ids.ok()) return fail("line " + std::to_string(line_number) + ": " + ids.status().message());
        auto text = decode_ids(**tok, *ids);
        if (!text.ok()) return fail("line " + std::to_string(line_number) + ": " + text.status().message());
        // Bytes that are not UTF-8 (ids ending inside a character) become U+FFFD in the JSON string.
        std::string out = Json(*text).dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    });
}

CommandRegistrar reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<TokenizeOptions>();
    auto* tok = app.add_subcommand("tokenize", "Text on stdin to token ids (JSON)");
    tok->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: $GPTOSS_TOKENIZER or the fixture)")
        ->check(non_empty_path);
    tok->add_flag("--jsonl", o->jsonl, "Each stdin line is a JSON string; print one id array per line");
    tok->add_flag("--special", o->special, "Recognise special-token text such as <|start|>");
    tok->callback([o, &exit_code] { exit_code = run_tokenize(*o); });

    auto d = std::make_shared<TokenizeOptions>();
    auto* detok = app.add_subcommand("detokenize", "Token ids (JSON array) on stdin to text");
    detok->add_option("--tokenizer", d->tokenizer, "tokenizer.json (default: $GPTOSS_TOKENIZER or the fixture)")
        ->check(non_empty_path);
    detok->add_flag("--jsonl", d->jsonl, "Each stdin line is an id array; print one JSON string per line");
    detok->callback([d, &exit_code] { exit_code = run_detokenize(*d); });
});

}  // namespace
}  // namespace gptoss::cli
