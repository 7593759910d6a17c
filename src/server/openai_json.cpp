#include "server/openai_json.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "harmony/harmony_json.h"
#include "harmony/harmony_parser.h"
#include "structured/harmony_json.h"
#include "structured/json_grammar.h"
#include "tokenizer/utf8.h"

namespace gptoss::server {
namespace {

Status field_error(const std::string& param, const std::string& message) {
    return invalid_argument(param + ": " + message);
}

std::string type_name(const Json& j) {
    switch (j.type()) {
        case Json::value_t::null: return "null";
        case Json::value_t::object: return "an object";
        case Json::value_t::array: return "an array";
        case Json::value_t::string: return "a string";
        case Json::value_t::boolean: return "a boolean";
        case Json::value_t::number_integer:
        case Json::value_t::number_unsigned: return "an integer";
        case Json::value_t::number_float: return "a number";
        case Json::value_t::binary: return "binary";
        case Json::value_t::discarded: return "invalid";
    }
    return "invalid";
}

// Reads optional fields of one JSON object, recording the first error. Explicit null counts as
// absent (the OpenAI API treats it so).
class Fields {
public:
    Fields(const Json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

    std::string param(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
    const Json* get(const char* key) const {
        auto it = obj_.find(key);
        if (it == obj_.end() || it->is_null()) return nullptr;
        return &*it;
    }
    bool has(const char* key) const { return get(key) != nullptr; }

    std::optional<double> number(const char* key, double lo, double hi) {
        const Json* v = get(key);
        if (!v || !ok()) return std::nullopt;
        if (!v->is_number()) return fail(key, "must be a number, not " + type_name(*v));
        double d = v->get<double>();
        if (!(d >= lo && d <= hi)) {
            return fail(key, "must be between " + format(lo) + " and " + format(hi) + ", got " + format(d));
        }
        return d;
    }
    std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
        const Json* v = get(key);
        if (!v || !ok()) return std::nullopt;
        int64_t i;
        // (A bound at the 64-bit limit is no bound the caller chose: not named.)
        const auto out_of_range = [&](const std::string& got) {
            const std::string range = lo == INT64_MIN && hi == INT64_MAX ? "must be a 64-bit integer"
                                      : lo == INT64_MIN                  ? "must be at most " + std::to_string(hi)
                                      : hi == INT64_MAX
                                          ? "must be at least " + std::to_string(lo)
                                          : "must be between " + std::to_string(lo) + " and " + std::to_string(hi);
            return fail(key, range + ", got " + got);
        };
        if (v->is_number_unsigned()) {
            const uint64_t u = v->get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) return out_of_range(std::to_string(u));
            i = static_cast<int64_t>(u);
        } else if (v->is_number_integer()) {
            i = v->get<int64_t>();
        } else if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>() &&
                   std::fabs(v->get<double>()) < 9.0e18) {
            i = static_cast<int64_t>(v->get<double>());  // 16.0 (as vLLM's pydantic models accept)
        } else if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>()) {
            return out_of_range(v->dump());  // an integer past 64 bits (parsed as a double), printed whole
        } else {
            return fail(key, "must be an integer, not " + type_name(*v));
        }
        if (i < lo || i > hi) return out_of_range(std::to_string(i));
        return i;
    }
    std::optional<bool> boolean(const char* key) {
        const Json* v = get(key);
        if (!v || !ok()) return std::nullopt;
        if (!v->is_boolean()) return fail(key, "must be a boolean, not " + type_name(*v));
        return v->get<bool>();
    }
    std::optional<std::string> string(const char* key) {
        const Json* v = get(key);
        if (!v || !ok()) return std::nullopt;
        if (!v->is_string()) return fail(key, "must be a string, not " + type_name(*v));
        return v->get<std::string>();
    }
    const Json* object(const char* key) {
        const Json* v = get(key);
        if (!v || !ok()) return nullptr;
        if (!v->is_object()) return fail(key, "must be an object, not " + type_name(*v)), nullptr;
        return v;
    }
    const Json* array(const char* key) {
        const Json* v = get(key);
        if (!v || !ok()) return nullptr;
        if (!v->is_array()) return fail(key, "must be an array, not " + type_name(*v)), nullptr;
        return v;
    }
    std::optional<std::string> one_of(const char* key, std::initializer_list<const char*> allowed) {
        std::optional<std::string> s = string(key);
        if (!s) return s;
        for (const char* a : allowed) {
            if (*s == a) return s;
        }
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "'" : ", '") + std::string(a) + "'";
        return fail(key, "must be one of " + list + ", got '" + *s + "'");
    }

    std::nullopt_t fail(const char* key, const std::string& message) {
        if (status_.ok()) status_ = field_error(param(key), message);
        return std::nullopt;
    }
    void fail_status(Status s) {
        if (status_.ok()) status_ = std::move(s);
    }
    bool ok() const { return status_.ok(); }
    const Status& status() const { return status_; }

private:
    static std::string format(double d) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%g", d);
        return buf;
    }
    const Json& obj_;
    std::string prefix_;
    Status status_;
};

std::string indexed(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// vLLM's whitespace_pattern / guided_whitespace_pattern: "" (no whitespace between a JSON document's tokens, as
// disable_any_whitespace) is held; any other pattern is refused rather than ignored.
void whitespace_pattern(Fields& f, const char* key, const Json& v, bool* no_whitespace) {
    if (v.is_null()) return;
    if (!v.is_string()) {
        f.fail(key, "must be a string");
    } else if (!v.get_ref<const std::string&>().empty()) {
        f.fail(key, "is supported only as \"\" (no whitespace, as disable_any_whitespace)");
    } else {
        *no_whitespace = true;
    }
}

// A regular expression (a string) or a choice (an array of non-empty strings) compiled to a regex grammar;
// errors name `key`.
std::shared_ptr<const structured::RegexGrammar> regex_grammar(Fields& f, const char* key, const Json& v, bool choice) {
    StatusOr<std::shared_ptr<const structured::RegexGrammar>> g = invalid_argument("");
    if (choice) {
        if (!v.is_array() || v.empty()) {
            f.fail(key, "must be a non-empty array of strings");
            return nullptr;
        }
        if (v.size() > 1024) {
            f.fail(key, "at most 1024 choices");
            return nullptr;
        }
        std::vector<std::string> options;
        for (size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty()) {
                f.fail_status(field_error(indexed(f.param(key), i), "must be a non-empty string"));
                return nullptr;
            }
            options.push_back(v[i].get<std::string>());
        }
        g = structured::RegexGrammar::choice(options);
    } else {
        if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
            f.fail(key, "must be a non-empty string (a regular expression)");
            return nullptr;
        }
        if (v.get_ref<const std::string&>().size() > 65536) {
            f.fail(key, "is longer than 65,536 bytes");
            return nullptr;
        }
        g = structured::RegexGrammar::compile(v.get_ref<const std::string&>());
    }
    if (!g.ok()) {
        f.fail(key, g.status().message());
        return nullptr;
    }
    return *g;
}

// A structural tag (an object, or with `allow_string` a string of one, as vLLM's structured_outputs takes it)
// compiled; errors name the field inside it ("response_format.format.tags[0].end").
std::shared_ptr<const structured::StructuralTag> structural_tag(Fields& f, const char* key, const Json& v,
                                                                bool allow_string) {
    Json parsed;
    const Json* j = &v;
    if (v.is_string() && allow_string) {
        // (the body's own guards: nesting depth, members an object)
        if (std::string e = json_shape_error(v.get_ref<const std::string&>(), kMaxJsonDepth, kMaxJsonMembers);
            !e.empty()) {
            f.fail(key, "must be a structural tag: " + e);
            return nullptr;
        }
        parsed = Json::parse(v.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) {
            f.fail(key, "must be a structural tag: a JSON object, or a string of one (this string is not JSON)");
            return nullptr;
        }
        j = &parsed;
    }
    StatusOr<std::shared_ptr<const structured::StructuralTag>> t = structured::StructuralTag::parse(*j);
    if (t.ok()) return *t;
    const std::string m = t.status().message();
    const size_t colon = m.find(": ");
    const bool pathed = colon != std::string::npos && m.find(' ') > colon;
    f.fail_status(Status(t.status().code(), f.param(key) + (pathed ? "." : ": ") + m));
    return nullptr;
}

// A GBNF grammar (a string) compiled; errors name `key`.
std::shared_ptr<const structured::EbnfGrammar> ebnf_grammar(Fields& f, const char* key, const Json& v) {
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
        f.fail(key, "must be a non-empty string (a GBNF grammar: root ::= ...)");
        return nullptr;
    }
    const std::string& text = v.get_ref<const std::string&>();
    if (text.size() > 65536) {
        f.fail(key, "is longer than 65,536 bytes");
        return nullptr;
    }
    // Without ::= it is Lark's form, which vLLM converts for its xgrammar backend.
    std::string converted;
    if (structured::EbnfGrammar::looks_like_lark(text)) {
        StatusOr<std::string> gbnf = structured::EbnfGrammar::lark_to_gbnf(text);
        if (!gbnf.ok()) {
            f.fail(key, gbnf.status().message());
            return nullptr;
        }
        converted = std::move(*gbnf);
    }
    auto g = structured::EbnfGrammar::compile(converted.empty() ? text : converted);
    if (!g.ok()) {
        f.fail(key, g.status().message());
        return nullptr;
    }
    return *g;
}

// Sampling fields shared by the three endpoints.
// A JSON Schema given as an object (or a boolean), or as a string of JSON text (vLLM takes both for
// guided_json), compiled; errors (bad JSON, keywords the output cannot be held to) name `key`.
std::shared_ptr<const structured::JsonGrammar> schema_grammar(Fields& f, const char* key, const Json& v) {
    Json schema;
    if (v.is_string()) {
        const std::string& text = v.get_ref<const std::string&>();
        if (std::string why = json_shape_error(text, kMaxJsonDepth, kMaxJsonMembers); !why.empty()) {
            f.fail(key, why);
            return nullptr;
        }
        try {
            schema = Json::parse(text);
        } catch (const Json::exception&) {
            f.fail(key, "is not valid JSON");
            return nullptr;
        }
    } else if (v.is_object() || v.is_boolean()) {
        schema = v;
    } else {
        f.fail(key, "must be a JSON Schema (an object, or a string of one), not " + type_name(v));
        return nullptr;
    }
    auto g = structured::JsonGrammar::compile(schema);
    if (!g.ok()) {
        f.fail(key, g.status().message());
        return nullptr;
    }
    return *g;
}

void read_sampling(Fields& f, SamplingRequest* out) {
    if (auto pr = f.integer("priority", INT32_MIN, INT32_MAX)) out->priority = static_cast<int>(*pr);
    if (auto salt = f.string("cache_salt")) {
        if (salt->empty()) f.fail("cache_salt", "must be a non-empty string");
        out->cache_salt = std::move(*salt);
    }
    if (auto t = f.number("temperature", 0.0, 2.0)) out->sampling.temperature = static_cast<float>(*t);
    // top_p 0 (OpenAI's range is 0-1 inclusive) keeps only the most probable token, as the
    // smallest positive nucleus does (a positive double rounding to 0 as a float too).
    if (auto p = f.number("top_p", 0.0, 1.0))
        out->sampling.top_p = std::max(static_cast<float>(*p), std::numeric_limits<float>::min());
    // A seed is any 64-bit integer, signed or unsigned (2^63 .. 2^64 - 1 are seeds of their own);
    // -1 asks for a random one, as in vLLM and llama.cpp (runtime::seed_from_signed).
    if (const Json* sv = f.get("seed"); sv != nullptr && sv->is_number_unsigned())
        out->sampling.seed = sv->get<uint64_t>();
    else if (sv != nullptr && sv->is_number_float() && std::fabs(sv->get<double>()) >= 9.0e18)
        f.fail("seed", "must be an integer from -9223372036854775808 to 18446744073709551615, got " + sv->dump());
    else if (auto s = f.integer("seed", INT64_MIN, INT64_MAX))
        out->sampling.seed = runtime::seed_from_signed(*s);
    // vLLM's and llama.cpp's sampling extensions, with vLLM's ranges: top_k ≥ 1 (-1 or 0: off),
    // min_p in [0, 1] (0: off), repetition_penalty > 0 (1: off).
    if (auto k = f.integer("top_k", -1, INT32_MAX)) out->sampling.top_k = *k < 0 ? 0 : static_cast<int>(*k);
    if (auto mp = f.number("min_p", 0.0, 1.0)) out->sampling.min_p = static_cast<float>(*mp);
    if (auto rp = f.number("repetition_penalty", 0.0, std::numeric_limits<float>::max())) {
        // As the 32-bit float the sampler divides by: 1e-300 is 0 there, and a subnormal would make every positive
        // logit it touches infinite.
        if (static_cast<float>(*rp) >= std::numeric_limits<float>::min())
            out->sampling.repetition_penalty = static_cast<float>(*rp);
        else
            f.fail("repetition_penalty", "must be at least 1.17549435e-38 (a positive 32-bit float)");
    }
    if (auto pp = f.number("presence_penalty", -2.0, 2.0)) out->sampling.presence_penalty = static_cast<float>(*pp);
    if (auto fp = f.number("frequency_penalty", -2.0, 2.0)) out->sampling.frequency_penalty = static_cast<float>(*fp);
    if (const Json* allowed = f.get("allowed_token_ids"); allowed != nullptr && f.ok()) {
        if (!allowed->is_array() || allowed->empty() || allowed->size() > (size_t{1} << 20)) {
            f.fail("allowed_token_ids", "must be a non-empty array of token ids");
        } else {
            for (size_t i = 0; i < allowed->size() && f.ok(); ++i) {
                const Json& id = (*allowed)[i];
                if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
                    f.fail_status(field_error(indexed(f.param("allowed_token_ids"), i), "must be a token id"));
                else
                    out->allowed_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
            }
        }
    }
    if (const Json* bias = f.object("logit_bias")) {
        // {"<token id>": bias in [-100, 100]}; the engine checks the ids against its vocabulary.
        for (auto it = bias->begin(); it != bias->end(); ++it) {
            const std::string& key = it.key();
            const bool digits = !key.empty() && key.size() <= 9 &&
                                std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
            if (!digits) {
                f.fail("logit_bias", "keys must be token ids, got '" + key + "'");
                return;
            }
            if (!it.value().is_number() || !(it.value().get<double>() >= -100 && it.value().get<double>() <= 100)) {
                f.fail("logit_bias", "values must be numbers in [-100, 100]");
                return;
            }
            out->sampling.logit_bias.emplace_back(std::stoi(key), it.value().get<float>());
        }
    }
    // vLLM's stop_token_ids and ignore_eos (its benchmark clients send the latter for exact output lengths).
    if (const Json* ids = f.get("stop_token_ids")) {
        if (!ids->is_array() || ids->size() > 1024) {
            f.fail("stop_token_ids", "must be an array of at most 1024 token ids");
            return;
        }
        for (size_t i = 0; i < ids->size(); ++i) {
            const Json& id = (*ids)[i];
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
                f.fail_status(field_error(indexed(f.param("stop_token_ids"), i), "must be a token id"));
                return;
            }
            out->stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
    }
    out->ignore_eos = f.boolean("ignore_eos").value_or(false);
    out->min_tokens = static_cast<int>(f.integer("min_tokens", 0, INT32_MAX).value_or(0));
    out->include_stop_str = f.boolean("include_stop_str_in_output").value_or(false);
    if (auto t = f.integer("truncate_prompt_tokens", -1, INT32_MAX)) {
        if (*t == 0) f.fail("truncate_prompt_tokens", "must be at least 1 (or -1: the context)");
        out->truncate_prompt_tokens = *t;
    }
    if (const Json* bw = f.get("bad_words"); bw != nullptr && f.ok()) {
        if (!bw->is_array()) {
            f.fail("bad_words", "must be an array of strings");
        } else if (bw->size() > 256) {
            f.fail("bad_words", "at most 256 words");
        } else {
            for (size_t i = 0; i < bw->size() && f.ok(); ++i) {
                const Json& w = (*bw)[i];
                if (!w.is_string() || w.get_ref<const std::string&>().size() > 1024)
                    f.fail_status(
                        field_error(indexed(f.param("bad_words"), i), "must be a string of at most 1024 bytes"));
                else if (!w.get_ref<const std::string&>().empty())
                    out->bad_words.push_back(w.get<std::string>());
            }
        }
    }
    // vLLM's constraints: guided_json (a schema, or a string of one), guided_json_object, guided_regex,
    // guided_choice, guided_grammar, structured_outputs {"json": schema} / {"json_object": true} / {"regex": ...}
    // / {"choice": [...]} / {"grammar": ...}; llama.cpp's grammar. At most one.
    int given = 0;
    for (const char* key : {"guided_grammar", "grammar"}) {
        if (const Json* v = f.get(key); v != nullptr && !v->is_null() && f.ok()) {
            out->ebnf = ebnf_grammar(f, key, *v);
            ++given;
        }
    }
    for (const char* key : {"guided_regex", "guided_choice"}) {
        if (const Json* v = f.get(key); v != nullptr && f.ok()) {
            out->regex = regex_grammar(f, key, *v, key[7] == 'c');
            ++given;
        }
    }
    if (const Json* gj = f.get("guided_json"); gj != nullptr && f.ok()) {
        out->grammar = schema_grammar(f, "guided_json", *gj);
        ++given;
    }
    if (f.ok() && f.boolean("guided_json_object").value_or(false)) {
        out->grammar = structured::JsonGrammar::any_object();
        ++given;
    }
    if (const Json* so = f.object("structured_outputs"); so != nullptr && f.ok()) {
        Fields s(*so, f.param("structured_outputs"));
        for (auto it = so->begin(); it != so->end() && s.ok(); ++it) {
            if (it.value().is_null()) continue;
            if (it.key() == "json") {
                out->grammar = schema_grammar(s, "json", it.value());
                ++given;
            } else if (it.key() == "json_object") {
                if (s.boolean("json_object").value_or(false)) {
                    out->grammar = structured::JsonGrammar::any_object();
                    ++given;
                }
            } else if (it.key() == "regex" || it.key() == "choice") {
                out->regex =
                    regex_grammar(s, it.key() == "regex" ? "regex" : "choice", it.value(), it.key() == "choice");
                ++given;
            } else if (it.key() == "grammar") {
                out->ebnf = ebnf_grammar(s, "grammar", it.value());
                ++given;
            } else if (it.key() == "disable_any_whitespace") {
                out->disable_any_whitespace =
                    s.boolean("disable_any_whitespace").value_or(false) || out->disable_any_whitespace;
            } else if (it.key() == "structural_tag") {
                out->tag = structural_tag(s, "structural_tag", it.value(), /*allow_string=*/true);
                ++given;
            } else if (it.key() == "whitespace_pattern") {
                whitespace_pattern(s, "whitespace_pattern", it.value(), &out->disable_any_whitespace);
            } else if (it.key() == "disable_fallback" || it.key() == "disable_additional_properties") {
                // vLLM's: there is one backend (no fallback), and an object with properties already takes no others.
                (void)s.boolean(it.key().c_str());
            } else if (it.key() != "backend" && it.key() != "_backend") {
                // A misspelled constraint ran the request unconstrained (session 57).
                s.fail(it.key().c_str(),
                       "is not a structured_outputs field (json, json_object, regex, choice, grammar, "
                       "structural_tag, disable_any_whitespace, whitespace_pattern)");
            }
        }
        // An empty one says nothing (a client's bug); disable_any_whitespace alone shapes another constraint
        // (chat's response_format).
        if (s.ok() && std::none_of(so->begin(), so->end(), [](const Json& v) { return !v.is_null(); }))
            s.fail_status(field_error(f.param("structured_outputs"),
                                      "names no constraint (json, json_object, regex, choice, grammar or "
                                      "structural_tag)"));
        f.fail_status(s.status());
    }
    if (const Json* wp = f.get("guided_whitespace_pattern"); wp != nullptr && f.ok())
        whitespace_pattern(f, "guided_whitespace_pattern", *wp, &out->disable_any_whitespace);
    if (f.ok() && out->disable_any_whitespace && out->grammar) out->grammar = out->grammar->without_whitespace();
    if (f.ok() && out->disable_any_whitespace && out->tag) out->tag = out->tag->without_whitespace();
    if (f.ok() && given > 1)
        f.fail_status(field_error("guided_json",
                                  "give one constraint (guided_json, guided_json_object, guided_regex, guided_choice, "
                                  "guided_grammar or structured_outputs), not several"));
    if (!f.ok()) return;
    if (const Json* stop = f.get("stop")) {
        if (stop->is_string()) {
            if (!stop->get<std::string>().empty()) out->stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            if (stop->size() > kMaxStopStrings) {
                f.fail("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings");
                return;
            }
            for (size_t i = 0; i < stop->size(); ++i) {
                const Json& s = (*stop)[i];
                if (!s.is_string()) {
                    f.fail_status(field_error(indexed(f.param("stop"), i), "must be a string"));
                    return;
                }
                if (!s.get<std::string>().empty()) out->stop.push_back(s.get<std::string>());
            }
        } else {
            f.fail("stop", "must be a string or an array of strings, not " + type_name(*stop));
        }
    }
}

// response_format (chat: {"type", "json_schema": {"name", "schema", ...}}) / text.format (responses:
// {"type", "name", "schema", ...}): "text", "json_object" (any JSON object) or "json_schema" (the schema
// compiled into a grammar; what it cannot enforce is refused by name). The grammar holds the final
// channel's message (structured/harmony_json.h); null for "text". `chat_form` (optional) gets the
// chat.completions shape of the format, which the developer message renders.
std::shared_ptr<const structured::JsonGrammar> read_response_format(
    Fields& f, const char* key, bool responses_shape, Json* chat_form,
    std::shared_ptr<const structured::StructuralTag>* tag = nullptr) {
    const Json* rf = f.object(key);
    if (rf == nullptr) return nullptr;
    Fields r(*rf, f.param(key));
    const std::optional<std::string> type =
        tag ? r.one_of("type", {"text", "json_object", "json_schema", "structural_tag"})
            : r.one_of("type", {"text", "json_object", "json_schema"});
    if (r.ok() && !type) r.fail("type", "is required");
    if (r.ok() && *type == "structural_tag") {
        // (vLLM's and SGLang's chat form: the whole object is the tag)
        *tag = structural_tag(f, key, *rf, /*allow_string=*/false);
        return nullptr;
    }
    if (!r.ok() || *type == "text") {
        f.fail_status(r.status());
        return nullptr;
    }
    if (*type == "json_object") {
        if (chat_form) *chat_form = {{"type", "json_object"}};
        return structured::JsonGrammar::any_object();
    }
    const Json* js = responses_shape ? rf : r.object("json_schema");
    if (js == nullptr) {
        if (r.ok()) r.fail("json_schema", "is required for type 'json_schema'");
        f.fail_status(r.status());
        return nullptr;
    }
    Fields s(*js, responses_shape ? f.param(key) : r.param("json_schema"));
    const std::optional<std::string> name = s.string("name");
    if (s.ok() && !name) s.fail("name", "is required");
    if (s.ok() && (name->empty() || name->size() > 64 || !std::all_of(name->begin(), name->end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                   })))
        s.fail("name", "must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'");
    const std::optional<std::string> description = s.string("description");
    const std::optional<bool> strict = s.boolean("strict");
    const Json* schema = s.object("schema");
    // The Responses API's text.format requires the schema (OpenAI's and vLLM's request models); chat's json_schema
    // may leave it out (any JSON object).
    if (s.ok() && responses_shape && !schema) s.fail("schema", "is required");
    std::shared_ptr<const structured::JsonGrammar> grammar;
    if (s.ok()) {
        auto g = structured::JsonGrammar::compile(schema ? *schema : Json::object());
        if (g.ok())
            grammar = *g;
        else
            s.fail("schema", g.status().message());
    }
    r.fail_status(s.status());
    f.fail_status(r.status());
    if (!f.ok()) return nullptr;
    if (chat_form) {
        Json j = {{"name", *name}};
        if (description) j["description"] = *description;
        j["schema"] = schema ? *schema : Json::object();
        if (strict) j["strict"] = *strict;
        *chat_form = {{"type", "json_schema"}, {"json_schema", std::move(j)}};
    }
    return grammar;
}

// Unicode characters of UTF-8 text (the request's strings are valid UTF-8: the JSON parser checks).
size_t utf8_chars(const std::string& s) {
    return static_cast<size_t>(
        std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0u) != 0x80u; }));
}

// metadata: OpenAI's type and limits: at most 16 pairs, string keys of at most 64 characters and string values of
// at most 512 (other values were accepted and dropped; past the limits OpenAI answers 400 too).
void read_metadata(Fields& f) {
    constexpr size_t kMaxPairs = 16, kMaxKey = 64, kMaxValue = 512;
    const Json* m = f.object("metadata");
    if (m == nullptr) return;
    if (m->size() > kMaxPairs) {
        f.fail("metadata", "has " + std::to_string(m->size()) + " pairs; at most " + std::to_string(kMaxPairs));
        return;
    }
    for (auto it = m->begin(); it != m->end(); ++it) {
        if (!it.value().is_string()) {
            f.fail("metadata", "values must be strings ('" + it.key() + "' is " + type_name(it.value()) + ")");
            return;
        }
        if (utf8_chars(it.key()) > kMaxKey) {
            f.fail("metadata", "keys are at most " + std::to_string(kMaxKey) + " characters ('" +
                                   it.key().substr(0, 16) + "...' is " + std::to_string(utf8_chars(it.key())) + ")");
            return;
        }
        if (utf8_chars(it.value().get_ref<const std::string&>()) > kMaxValue) {
            f.fail("metadata", "values are at most " + std::to_string(kMaxValue) + " characters ('" + it.key() +
                                   "' has " + std::to_string(utf8_chars(it.value().get_ref<const std::string&>())) +
                                   ")");
            return;
        }
    }
}

// n: choices per prompt, each generated as its own request (at most kMaxChoices in a request).
int read_n(Fields& f) { return static_cast<int>(f.integer("n", 1, kMaxChoices).value_or(1)); }

// vLLM's request_id: a string of 1 to 256 bytes (it names the answer).
std::optional<std::string> read_request_id(Fields& f) {
    std::optional<std::string> id = f.string("request_id");
    if (id && (id->empty() || id->size() > 256)) f.fail("request_id", "must be a string of 1 to 256 bytes");
    return id;
}

void read_stream(Fields& f, bool* stream, bool* include_usage, bool* continuous_usage) {
    *stream = f.boolean("stream").value_or(false);
    if (f.has("stream_options") && !*stream && f.ok()) {  // as OpenAI and vLLM answer
        f.fail("stream_options", "is only allowed when stream is true");
        return;
    }
    if (const Json* so = f.object("stream_options")) {
        Fields s(*so, f.param("stream_options"));
        *include_usage = s.boolean("include_usage").value_or(false);
        // vLLM's continuous_usage_stats: with include_usage, every chunk carries the usage so far.
        *continuous_usage = *include_usage && s.boolean("continuous_usage_stats").value_or(false);
        f.fail_status(s.status());
    }
}

// A content value of a chat message: a string, an array of text parts, or null.
// null_ok: an assistant message's content, which may also hold refusal parts (their text is rendered).
Status check_chat_content(const Json& content, const std::string& param, bool null_ok) {
    if (content.is_null()) return null_ok ? ok_status() : field_error(param, "is required");
    if (content.is_string()) return ok_status();
    if (!content.is_array()) return field_error(param, "must be a string or an array of content parts");
    for (size_t i = 0; i < content.size(); ++i) {
        const Json& part = content[i];
        const std::string p = indexed(param, i);
        if (!part.is_object()) return field_error(p, "must be an object");
        auto type = part.find("type");
        if (type == part.end() || !type->is_string()) return field_error(p + ".type", "is required");
        const std::string t = type->get<std::string>();
        if (t == "refusal" && null_ok) {
            auto refusal = part.find("refusal");
            if (refusal == part.end() || !refusal->is_string()) return field_error(p + ".refusal", "must be a string");
            continue;
        }
        if (t != "text" && t != "input_text" && t != "output_text") {
            return field_error(p + ".type", "content part type '" + t + "' is not supported (text only)");
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) return field_error(p + ".text", "must be a string");
    }
    return ok_status();
}

Status check_chat_message(const Json& m, const std::string& param) {
    if (!m.is_object()) return field_error(param, "must be an object, not " + type_name(m));
    auto role_it = m.find("role");
    if (role_it == m.end() || role_it->is_null()) return field_error(param + ".role", "is required");
    if (!role_it->is_string()) return field_error(param + ".role", "must be a string");
    const std::string role = role_it->get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
        return field_error(param + ".role",
                           "unknown role '" + role + "' (expected system, developer, user, assistant or tool)");
    }
    Fields f(m, param);
    f.string("name");
    if (role == "assistant") {
        f.string("reasoning_content");
        f.string("reasoning");
        f.string("thinking");
        const Json* calls = f.array("tool_calls");
        RETURN_IF_ERROR(f.status());
        if (calls) {
            for (size_t i = 0; i < calls->size(); ++i) {
                const std::string p = indexed(param + ".tool_calls", i);
                const Json& c = (*calls)[i];
                if (!c.is_object()) return field_error(p, "must be an object");
                Fields cf(c, p);
                cf.string("id");
                cf.one_of("type", {"function"});
                const Json* fn = cf.object("function");
                RETURN_IF_ERROR(cf.status());
                if (!fn) return field_error(p + ".function", "is required");
                Fields ff(*fn, p + ".function");
                if (!ff.string("name") && ff.ok()) return field_error(p + ".function.name", "is required");
                if (const Json* a = ff.get("arguments"); a && !a->is_string() && !a->is_object()) {
                    return field_error(p + ".function.arguments", "must be a string");
                }
                RETURN_IF_ERROR(ff.status());
            }
        }
        auto content = m.find("content");
        return check_chat_content(content == m.end() ? Json() : *content, param + ".content", true);
    }
    if (role == "tool") {
        f.string("tool_call_id");
        RETURN_IF_ERROR(f.status());
    }
    RETURN_IF_ERROR(f.status());
    auto content = m.find("content");
    return check_chat_content(content == m.end() ? Json() : *content, param + ".content", false);
}

// The arguments' grammar of a function declared strict: its parameters schema (none: an empty object).
// Errors name `param` (the parameters' field).
StatusOr<std::shared_ptr<const structured::JsonGrammar>> strict_tool_grammar(const Json* parameters,
                                                                             const std::string& param) {
    auto g = structured::JsonGrammar::compile(parameters ? *parameters
                                                         : Json{{"type", "object"}, {"properties", Json::object()}});
    if (!g.ok())
        return field_error(param, g.status().message() + " (the function is strict: its arguments are held to it)");
    return *g;
}

// vLLM's guided decoding of forced calls: with tool_choice "required", or naming a function, the arguments of the
// calls it forces are held to the function's parameters schema as a strict function's are (clients parse them as
// JSON), where that schema compiles; one that does not is left free, as without the choice (not a 400: only
// `strict` asks for the schema). `chat`: the chat.completions form (tools, tool_choice; allowed_tools applied).
void add_forced_call_grammars(const Json& chat, structured::ToolGrammars* grammars) {
    const auto tc = chat.find("tool_choice");
    const auto tools = chat.find("tools");
    if (tc == chat.end() || tools == chat.end() || !tools->is_array()) return;
    std::optional<std::string> only;  // a named choice's function
    if (tc->is_object()) {
        const auto fn = tc->find("function");
        if (fn == tc->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) return;
        only = (*fn)["name"].get<std::string>();
    } else if (!(tc->is_string() && tc->get<std::string>() == "required")) {
        return;
    }
    for (const Json& t : *tools) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
        const Json& fn = t["function"];
        if (!fn.contains("name") || !fn["name"].is_string()) continue;
        const std::string name = fn["name"].get<std::string>();
        if ((only && name != *only) || grammars->contains(name)) continue;
        const auto params = fn.find("parameters");
        auto g = structured::JsonGrammar::compile(params != fn.end() && params->is_object()
                                                      ? *params
                                                      : Json{{"type", "object"}, {"properties", Json::object()}});
        if (g.ok()) (*grammars)[name] = *g;
    }
}

// `grammars` (optional) gets the argument grammars of the functions declared strict.
Status check_chat_tools(const Json& body, std::vector<std::string>* names, structured::ToolGrammars* grammars) {
    auto tools = body.find("tools");
    if (tools == body.end() || tools->is_null()) return ok_status();
    if (!tools->is_array()) return field_error("tools", "must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
        const Json& t = (*tools)[i];
        const std::string p = indexed("tools", i);
        if (!t.is_object()) return field_error(p, "must be an object");
        Fields f(t, p);
        if (!f.one_of("type", {"function"})) {
            RETURN_IF_ERROR(f.status());
            return field_error(p + ".type", "is required");
        }
        const Json* fn = f.object("function");
        RETURN_IF_ERROR(f.status());
        if (!fn) return field_error(p + ".function", "is required");
        Fields ff(*fn, p + ".function");
        std::optional<std::string> name = ff.string("name");
        ff.string("description");
        const Json* parameters = ff.object("parameters");
        const bool strict = ff.boolean("strict").value_or(false);
        RETURN_IF_ERROR(ff.status());
        if (!name || name->empty()) return field_error(p + ".function.name", "is required");
        names->push_back(*name);
        if (strict && grammars) {
            ASSIGN_OR_RETURN(std::shared_ptr<const structured::JsonGrammar> g,
                             strict_tool_grammar(parameters, p + ".function.parameters"));
            (*grammars)[*name] = std::move(g);
        }
    }
    return ok_status();
}

// OpenAI's tool_choice {"type": "allowed_tools", ...}: the model may call only the tools listed, as `mode` ("auto":
// or answer; "required": one of them). `spec` holds mode and tools (chat: tool_choice.allowed_tools, each tool
// {"type": "function", "function": {"name"}}; Responses: tool_choice itself, each {"type": "function", "name"}).
// Rewrites `chat` (the chat.completions form harmony renders) to offer only those tools, tool_choice = mode.
Status apply_allowed_tools(const Json& spec, const std::string& param, bool responses_shape, Json* chat) {
    if (!spec.is_object()) return field_error(param, "must be an object");
    Fields f(spec, param);
    const std::optional<std::string> mode = f.one_of("mode", {"auto", "required"});
    const Json* tools = f.array("tools");
    RETURN_IF_ERROR(f.status());
    if (!mode) return field_error(f.param("mode"), "is required");
    if (!tools || tools->empty()) return field_error(f.param("tools"), "must list at least one tool");
    std::vector<std::string> allowed;
    for (size_t i = 0; i < tools->size(); ++i) {
        const std::string tp = indexed(f.param("tools"), i);
        const Json& t = (*tools)[i];
        if (!t.is_object()) return field_error(tp, "must be an object");
        Fields tf(t, tp);
        tf.one_of("type", {"function"});
        std::optional<std::string> name;
        if (responses_shape) {
            name = tf.string("name");
        } else if (const Json* fn = tf.object("function")) {
            Fields ff(*fn, tp + ".function");
            name = ff.string("name");
            RETURN_IF_ERROR(ff.status());
        }
        RETURN_IF_ERROR(tf.status());
        if (!name) return field_error(tp + (responses_shape ? ".name" : ".function.name"), "is required");
        allowed.push_back(*name);
    }
    Json kept = Json::array();
    if (chat->contains("tools") && (*chat)["tools"].is_array()) {
        for (const Json& t : (*chat)["tools"]) {
            const std::string name = t["function"].value("name", std::string());
            if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) kept.push_back(t);
        }
    }
    for (size_t i = 0; i < allowed.size(); ++i) {
        const bool declared = std::any_of(kept.begin(), kept.end(), [&](const Json& t) {
            return t["function"].value("name", std::string()) == allowed[i];
        });
        if (!declared)
            return field_error(indexed(f.param("tools"), i) + (responses_shape ? ".name" : ".function.name"),
                               "no tool named '" + allowed[i] + "' in tools");
    }
    (*chat)["tools"] = std::move(kept);
    (*chat)["tool_choice"] = *mode;
    return ok_status();
}

// tool_choice of chat.completions: "auto" | "none" | "required" | {"type":"function","function":{"name"}}.
Status check_tool_choice(const Json& body, const std::vector<std::string>& names) {
    auto tc = body.find("tool_choice");
    if (tc == body.end() || tc->is_null()) return ok_status();
    if (tc->is_string()) {
        const std::string s = tc->get<std::string>();
        if (s == "auto" || s == "none") return ok_status();
        if (s == "required") {
            if (names.empty()) return field_error("tool_choice", "'required' needs at least one tool");
            return ok_status();
        }
        return field_error("tool_choice", "must be 'auto', 'none', 'required' or a named function");
    }
    if (!tc->is_object()) return field_error("tool_choice", "must be a string or an object");
    Fields f(*tc, "tool_choice");
    f.one_of("type", {"function", "allowed_tools"});  // (allowed_tools is rewritten before: apply_allowed_tools)
    const Json* fn = f.object("function");
    RETURN_IF_ERROR(f.status());
    if (!fn) return field_error("tool_choice.function", "is required");
    Fields ff(*fn, "tool_choice.function");
    std::optional<std::string> name = ff.string("name");
    RETURN_IF_ERROR(ff.status());
    if (!name) return field_error("tool_choice.function.name", "is required");
    if (std::find(names.begin(), names.end(), *name) == names.end()) {
        return field_error("tool_choice.function.name", "no tool named '" + *name + "' in tools");
    }
    return ok_status();
}

std::string random_alnum(size_t n) {
    static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string s;
    for (size_t i = 0; i < n; ++i) s += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    return s;
}

// Text of a Responses content value (string, or parts with "text"; an assistant message's output may also hold
// refusal parts, as OpenAI's output messages do: their text is the message's, as chat renders them).
StatusOr<std::string> responses_text(const Json& content, const std::string& param, bool assistant) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null()) return field_error(param, "is required");
    RETURN_IF_ERROR(check_chat_content(content, param, assistant));
    std::string text;
    for (const Json& part : content)
        text += part.value("type", std::string()) == "refusal" ? part["refusal"].get<std::string>()
                                                               : part["text"].get<std::string>();
    return text;
}

// Responses input items -> chat.completions messages (HARMONY.md §5.3).
// origins: the param of the item each new message came from (a call joined to the message before
// adds none).
Status responses_input_to_messages(const Json& input, Json* messages, std::vector<std::string>* origins) {
    if (input.is_string()) {
        messages->push_back({{"role", "user"}, {"content", input.get<std::string>()}});
        origins->push_back("input");
        return ok_status();
    }
    if (!input.is_array()) return field_error("input", "must be a string or an array of input items");
    if (input.empty()) return field_error("input", "must contain at least one item");
    // A reasoning item is kept only after the last assistant message item and while a tool loop is
    // in progress (the last item a function_call_output); otherwise it is dropped (HARMONY.md §5.3).
    size_t after_assistant = 0;
    for (size_t i = 0; i < input.size(); ++i) {
        const Json& item = input[i];
        if (item.is_object() && item.value("type", std::string("message")) == "message" &&
            item.value("role", std::string()) == "assistant")
            after_assistant = i + 1;
    }
    const bool tool_loop =
        input.back().is_object() && input.back().value("type", std::string()) == "function_call_output";
    for (size_t i = 0; i < input.size(); ++i) {
        const Json& item = input[i];
        const std::string p = indexed("input", i);
        const size_t before = messages->size();
        if (!item.is_object()) return field_error(p, "must be an object");
        Fields f(item, p);
        std::string type = f.string("type").value_or("message");
        RETURN_IF_ERROR(f.status());
        if (type == "message") {
            std::optional<std::string> role = f.one_of("role", {"user", "assistant", "system", "developer"});
            RETURN_IF_ERROR(f.status());
            if (!role) return field_error(p + ".role", "is required");
            auto content = item.find("content");
            if (content == item.end()) return field_error(p + ".content", "is required");
            ASSIGN_OR_RETURN(std::string text, responses_text(*content, p + ".content", *role == "assistant"));
            messages->push_back({{"role", *role}, {"content", text}});
        } else if (type == "function_call") {
            std::optional<std::string> call_id = f.string("call_id");
            std::optional<std::string> name = f.string("name");
            std::optional<std::string> args = f.string("arguments");
            RETURN_IF_ERROR(f.status());
            if (!call_id) return field_error(p + ".call_id", "is required");
            if (!name) return field_error(p + ".name", "is required");
            Json call = {{"id", *call_id},
                         {"type", "function"},
                         {"function", {{"name", *name}, {"arguments", args.value_or("{}")}}}};
            // Consecutive calls (and a reasoning item before them) form one assistant message.
            const bool join = !messages->empty() && messages->back().value("role", "") == "assistant" &&
                              !messages->back().contains("content");
            if (join) {
                Json& last = messages->back();
                if (!last.contains("tool_calls")) last["tool_calls"] = Json::array();
                last["tool_calls"].push_back(call);
            } else {
                messages->push_back({{"role", "assistant"}, {"tool_calls", Json::array({call})}});
            }
        } else if (type == "function_call_output") {
            std::optional<std::string> call_id = f.string("call_id");
            RETURN_IF_ERROR(f.status());
            if (!call_id) return field_error(p + ".call_id", "is required");
            auto output = item.find("output");
            if (output == item.end()) return field_error(p + ".output", "is required");
            ASSIGN_OR_RETURN(std::string text, responses_text(*output, p + ".output", false));
            messages->push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", text}});
        } else if (type == "reasoning") {
            std::string text;
            for (const char* key : {"content", "summary"}) {
                const Json* parts = f.array(key);
                RETURN_IF_ERROR(f.status());
                if (!parts || !text.empty()) continue;
                for (size_t k = 0; k < parts->size(); ++k) {
                    const Json& part = (*parts)[k];
                    if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) {
                        return field_error(indexed(p + "." + key, k) + ".text", "must be a string");
                    }
                    text += part["text"].get<std::string>();
                }
            }
            // A stateless client's reasoning comes back as encrypted_content alone (its content left out).
            const std::optional<std::string> encrypted = f.string("encrypted_content");
            RETURN_IF_ERROR(f.status());
            if (encrypted) {
                const std::optional<std::string> decoded = reasoning_from_encrypted_content(*encrypted);
                if (!decoded) {
                    return field_error(p + ".encrypted_content",
                                       "is not reasoning this server encrypted (pass the reasoning item as it was "
                                       "answered, or its content)");
                }
                if (text.empty()) text = *decoded;
            }
            if (tool_loop && i >= after_assistant)
                messages->push_back({{"role", "assistant"}, {"reasoning_content", text}});
        } else {
            return field_error(p + ".type", "input item type '" + type + "' is not supported");
        }
        if (messages->size() > before) origins->push_back(p);
    }
    return ok_status();
}

// A (valid) Responses input as the items OpenAI lists for it: a string as one user message, a message's string
// content as one input_text part (output_text for an assistant's), every item with an id (kept where it has one).
Json input_items_with_ids(const Json& input) {
    Json items = Json::array();
    if (input.is_string()) {
        items.push_back({{"id", random_id("msg_")},
                         {"type", "message"},
                         {"role", "user"},
                         {"status", "completed"},
                         {"content", Json::array({{{"type", "input_text"}, {"text", input.get<std::string>()}}})}});
        return items;
    }
    for (const Json& given : input) {
        Json item = given;
        const std::string type = item.value("type", std::string("message"));
        item["type"] = type;
        if (type == "message") {
            const bool assistant = item.value("role", std::string()) == "assistant";
            if (item["content"].is_string()) {
                Json part = {{"type", assistant ? "output_text" : "input_text"},
                             {"text", item["content"].get<std::string>()}};
                if (assistant) part["annotations"] = Json::array();
                item["content"] = Json::array({std::move(part)});
            }
        }
        // (A status the SDK's item types require: messages, function calls and their outputs as listed.)
        if ((type == "message" || type == "function_call" || type == "function_call_output") &&
            (!item.contains("status") || item["status"].is_null()))
            item["status"] = "completed";
        if (!item.contains("id") || !item["id"].is_string()) {
            const char* prefix = type == "message"                ? "msg_"
                                 : type == "function_call"        ? "fc_"
                                 : type == "function_call_output" ? "fco_"
                                                                  : "rs_";
            item["id"] = random_id(prefix);
        }
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace

// ---- errors -------------------------------------------------------------------------------------

int http_status_for(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return 200;
        case StatusCode::kInvalidArgument: return 400;
        case StatusCode::kOutOfRange: return 400;  // prompt over the context: OpenAI answers 400
        case StatusCode::kDataLoss: return 400;
        case StatusCode::kUnimplemented: return 400;  // a valid request we do not support
        case StatusCode::kNotFound: return 404;
        case StatusCode::kResourceExhausted: return 413;
        case StatusCode::kFailedPrecondition: return 503;  // not ready, shutting down, at capacity
        case StatusCode::kCancelled: return 500;
        case StatusCode::kInternal: return 500;
    }
    return 500;
}

ApiError api_error(int http_status, std::string message, std::optional<std::string> code) {
    ApiError e;
    e.http_status = http_status;
    e.message = std::move(message);
    e.code = std::move(code);
    if (http_status == 503) {
        e.type = "service_unavailable_error";
    } else if (http_status >= 500) {
        e.type = "server_error";
    } else {
        e.type = "invalid_request_error";
    }
    return e;
}

ApiError api_error(const Status& status) {
    std::optional<std::string> code;
    if (status.code() == StatusCode::kOutOfRange) code = "context_length_exceeded";
    if (status.code() == StatusCode::kUnimplemented) code = "unsupported_parameter";
    ApiError e = api_error(http_status_for(status.code()), status.message(), code);
    // "<param>: <text>" names the field (see the header).
    // harmony/ words its errors "<param> must be ..." (both forms are accepted).
    const std::string& m = status.message();
    size_t end = m.find(": ");
    const size_t space = m.find(' ');
    if (end == std::string::npos || (space != std::string::npos && space < end)) {
        end = m.compare(space == std::string::npos ? 0 : space, 9, " must be ") == 0 ? space : std::string::npos;
    }
    if (end != std::string::npos && end > 0) {
        const std::string head = m.substr(0, end);
        const bool is_path = std::all_of(head.begin(), head.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' || c == ']';
        });
        if (is_path) e.param = head;
    }
    return e;
}

// An error message as sent: at most kMaxErrorMessageBytes (a message quoting a 4 MB field would
// be 4 MB), cut at a UTF-8 character boundary, with what was cut said.
std::string bounded_message(const std::string& m) {
    constexpr size_t kMaxErrorMessageBytes = 1024;
    if (m.size() <= kMaxErrorMessageBytes) return m;
    size_t cut = kMaxErrorMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    return m.substr(0, cut) + "... (" + std::to_string(m.size() - cut) + " more bytes)";
}

Json error_json(const ApiError& error) {
    Json inner;
    inner["message"] = bounded_message(error.message);
    inner["type"] = error.type;
    inner["param"] = error.param ? Json(*error.param) : Json(nullptr);
    inner["code"] = error.code ? Json(*error.code) : Json(nullptr);
    return Json{{"error", inner}};
}

std::string error_body(const ApiError& error) { return dump_json(error_json(error)); }

// ---- parsing ------------------------------------------------------------------------------------

StatusOr<Json> parse_json_body(std::string_view body) {
    if (body.empty()) return invalid_argument("the request body is empty (expected a JSON object)");
    if (std::string why = json_shape_error(body, kMaxJsonDepth, kMaxJsonMembers); !why.empty()) {
        return invalid_argument(why);
    }
    try {
        Json j = Json::parse(body.begin(), body.end());
        if (!j.is_object()) return invalid_argument("the request body must be a JSON object, not " + type_name(j));
        return j;
    } catch (const Json::exception& e) {
        // nlohmann rejects invalid UTF-8 and lone surrogates here too. Its "[json.exception.
        // parse_error.101] " prefix names the library, not the problem: dropped.
        std::string why = e.what();
        if (why.rfind("[json.exception.", 0) == 0) {
            if (const size_t end = why.find("] "); end != std::string::npos) why.erase(0, end + 2);
        }
        return invalid_argument("the request body is not valid JSON: " + why);
    }
}

StatusOr<ChatParams> parse_chat_request(const Json& body) {
    try {
        ChatParams p;
        Fields f(body, "");
        f.string("model");
        auto messages = body.find("messages");
        if (messages == body.end() || messages->is_null()) return field_error("messages", "is required");
        if (!messages->is_array()) return field_error("messages", "must be an array, not " + type_name(*messages));
        if (messages->empty()) return field_error("messages", "must contain at least one message");
        for (size_t i = 0; i < messages->size(); ++i) {
            RETURN_IF_ERROR(check_chat_message((*messages)[i], indexed("messages", i)));
        }
        // The deprecated function-calling fields are refused, not ignored (the functions were not offered to the
        // model, and its answer would not come back as message.function_call).
        for (const char* old_field : {"functions", "function_call"}) {
            if (const Json* v = f.get(old_field); v != nullptr && !v->is_null())
                return unimplemented(std::string(old_field) + ": the deprecated function-calling fields are not " +
                                     "supported; use tools and tool_choice");
        }
        std::vector<std::string> tool_names;
        auto tool_grammars = std::make_shared<structured::ToolGrammars>();
        RETURN_IF_ERROR(check_chat_tools(body, &tool_names, tool_grammars.get()));
        // tool_choice allowed_tools: the chat form offers only those tools (the body as harmony renders it).
        std::optional<Json> restricted;
        if (auto tc = body.find("tool_choice");
            tc != body.end() && tc->is_object() && tc->value("type", std::string()) == "allowed_tools") {
            restricted = body;
            const Json spec = tc->contains("allowed_tools") ? (*tc)["allowed_tools"] : Json();
            RETURN_IF_ERROR(apply_allowed_tools(spec, "tool_choice.allowed_tools", false, &*restricted));
        } else {
            RETURN_IF_ERROR(check_tool_choice(body, tool_names));
        }
        add_forced_call_grammars(restricted ? *restricted : body, tool_grammars.get());
        if (!tool_grammars->empty()) p.tool_grammars = std::move(tool_grammars);
        // HARMONY.md §3.2: minimal / none clamp to low, xhigh / max to high (harmony's parse_effort).
        f.one_of("reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"});
        f.boolean("parallel_tool_calls");
        f.one_of("verbosity", {"low", "medium", "high"});  // OpenAI's; gpt-oss has no such control: checked, unused
        std::shared_ptr<const structured::StructuralTag> format_tag;
        p.grammar = read_response_format(f, "response_format", /*responses_shape=*/false, nullptr, &format_tag);
        const bool response_format_grammar = p.grammar != nullptr || format_tag != nullptr;
        read_metadata(f);
        f.string("user");
        read_sampling(f, &p.sampling);
        if (p.sampling.grammar || p.sampling.regex || p.sampling.ebnf || p.sampling.tag) {
            if (response_format_grammar)
                f.fail_status(field_error("response_format",
                                          "give one of response_format and vLLM's guided_* / "
                                          "structured_outputs, not both"));
            p.grammar = p.sampling.grammar;
        } else if (format_tag) {
            p.sampling.tag = std::move(format_tag);
            if (p.sampling.disable_any_whitespace) p.sampling.tag = p.sampling.tag->without_whitespace();
        }
        if (p.sampling.disable_any_whitespace && p.grammar) p.grammar = p.grammar->without_whitespace();
        p.n = read_n(f);
        // max_completion_tokens is the current name; max_tokens the deprecated one. Both count.
        std::optional<int64_t> mt = f.integer("max_tokens", INT64_MIN, INT64_MAX);
        std::optional<int64_t> mct = f.integer("max_completion_tokens", INT64_MIN, INT64_MAX);
        if (mt && *mt <= 0) f.fail("max_tokens", "must be at least 1");
        if (mct && *mct <= 0) f.fail("max_completion_tokens", "must be at least 1");
        p.sampling.max_tokens = mct ? mct : mt;
        p.logprobs = f.boolean("logprobs").value_or(false);
        if (auto k = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
            // (0 asks for nothing: accepted without logprobs, as vLLM does)
            if (!p.logprobs && *k > 0) f.fail("top_logprobs", "requires logprobs to be true");
            p.top_logprobs = static_cast<int>(*k);
        }
        if (auto plp = f.integer("prompt_logprobs", 0, runtime::kMaxLogprobs))
            p.prompt_logprobs = static_cast<int>(*plp);
        p.tokens_as_ids = f.boolean("return_tokens_as_token_ids").value_or(false);
        p.return_token_ids = f.boolean("return_token_ids").value_or(false);
        p.include_reasoning = f.boolean("include_reasoning").value_or(true);
        p.continue_final_message = f.boolean("continue_final_message").value_or(false);
        p.add_generation_prompt = f.boolean("add_generation_prompt");
        p.echo = f.boolean("echo").value_or(false);
        read_stream(f, &p.stream, &p.include_usage, &p.continuous_usage);
        p.request_id = read_request_id(f);
        RETURN_IF_ERROR(f.status());
        p.chat_body = restricted ? std::move(*restricted) : body;
        return p;
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

Status responses_status(const Status& status, const ResponsesParams& params) {
    const std::string& m = status.message();
    if (m.rfind("messages[", 0) != 0) return status;
    const size_t close = m.find(']');
    if (close == std::string::npos) return status;
    size_t index = 0;
    for (size_t k = 9; k < close; ++k) {
        if (m[k] < '0' || m[k] > '9') return status;
        index = index * 10 + static_cast<size_t>(m[k] - '0');
    }
    if (index >= params.message_params.size()) return status;
    std::string rest = m.substr(close + 1);
    const std::string& origin = params.message_params[index];
    // A tool message is a function_call_output item: its tool_call_id is the item's call_id, and a
    // message-level complaint about the match is about that field too.
    if (rest.rfind(".tool_call_id", 0) == 0) {
        rest = ".call_id" + rest.substr(13);
    } else if (rest.rfind(": tool message", 0) == 0) {
        rest = ".call_id" + rest;
    }
    return Status(status.code(), origin + rest);
}

StatusOr<ResponsesParams> parse_responses_request(const Json& body, const ResponsesContext& context) {
    try {
        ResponsesParams r;
        ChatParams& p = r.chat;
        Fields f(body, "");
        f.string("model");
        r.previous_response_id = f.string("previous_response_id");
        RETURN_IF_ERROR(f.status());
        if (r.previous_response_id) {
            if (!context.store_enabled) {
                return unimplemented(
                    "previous_response_id: this server keeps no responses (started with --responses-store 0); send "
                    "the whole input");
            }
            if (context.previous_items == nullptr)
                return field_error("previous_response_id", "no stored response has this id");
        }
        if (const Json* conv = f.get("conversation"); conv != nullptr && !conv->is_null()) {
            return unimplemented(
                "conversation: this server keeps no conversations; send the whole input or use previous_response_id");
        }
        // A stored prompt template (OpenAI's dashboard prompts) would be answered from `input` alone.
        if (f.has("prompt")) return unimplemented("prompt: this server keeps no prompt templates; send the input");
        // include: the extra output this server can add is none; the entries that ask for output
        // it would silently leave out are refused (tool-call result entries name tools it refuses).
        if (const Json* include = f.array("include")) {
            for (size_t i = 0; i < include->size(); ++i) {
                const Json& it = (*include)[i];
                if (!it.is_string()) return field_error(indexed("include", i), "must be a string");
                const std::string v = it.get<std::string>();
                if (!responses_include_value(v))
                    return field_error(indexed("include", i), "'" + v + "' is not an include value");
                if (v == "reasoning.encrypted_content") r.include_encrypted_reasoning = true;
                if (v == "message.output_text.logprobs") p.logprobs = true;
            }
        }
        // top_logprobs (OpenAI's 0-20): the k best at each output_text token; with it or the include, each output_text
        // part carries its tokens' logprobs.
        if (auto k = f.integer("top_logprobs", 0, 20)) {
            p.top_logprobs = static_cast<int>(*k);
            if (*k > 0) p.logprobs = true;
        }
        const std::optional<bool> store = f.boolean("store");
        r.store = context.store_enabled && store.value_or(true);  // OpenAI's default: stored
        if (f.boolean("background").value_or(false)) {
            if (!context.store_enabled) {
                return unimplemented(
                    "background: this server keeps no responses to poll (started with --responses-store 0); leave it "
                    "out or false");
            }
            if (!r.store) return field_error("background", "needs store: true (a background response is polled by id)");
            r.background = true;
        }
        RETURN_IF_ERROR(f.status());
        auto input = body.find("input");
        if (input == body.end() || input->is_null()) return field_error("input", "is required");
        Json messages = Json::array();
        std::optional<std::string> instructions = f.string("instructions");
        RETURN_IF_ERROR(f.status());
        if (instructions && !instructions->empty()) {
            messages.push_back({{"role", "developer"}, {"content", *instructions}});
            r.message_params.push_back("instructions");
        }
        if (context.previous_items == nullptr) {
            RETURN_IF_ERROR(responses_input_to_messages(*input, &messages, &r.message_params));
            r.input_items = input_items_with_ids(*input);
        } else {
            // The input's own errors name its own items; then the whole conversation is rendered, the stored items'
            // messages named previous_response_id.
            Json unused = Json::array();
            std::vector<std::string> unused_params;
            RETURN_IF_ERROR(responses_input_to_messages(*input, &unused, &unused_params));
            r.input_items = input_items_with_ids(*input);
            Json all = *context.previous_items;
            for (const Json& item : r.input_items) all.push_back(item);
            std::vector<std::string> params;
            RETURN_IF_ERROR(responses_input_to_messages(all, &messages, &params));
            const size_t earlier = context.previous_items->size();
            for (const std::string& origin : params) {
                size_t index = 0, at = 6;  // "input[<index>]..."
                while (at < origin.size() && origin[at] >= '0' && origin[at] <= '9')
                    index = index * 10 + static_cast<size_t>(origin[at++] - '0');
                if (index < earlier) {
                    r.message_params.push_back("previous_response_id");
                } else {
                    r.message_params.push_back(input->is_string()
                                                   ? std::string("input")
                                                   : indexed("input", index - earlier) + origin.substr(at + 1));
                }
            }
        }

        Json chat = Json::object();
        chat["messages"] = std::move(messages);
        Json tools_echo = Json::array();
        if (const Json* tools = f.array("tools")) {
            Json chat_tools = Json::array();
            for (size_t i = 0; i < tools->size(); ++i) {
                const Json& t = (*tools)[i];
                const std::string tp = indexed("tools", i);
                if (!t.is_object()) return field_error(tp, "must be an object");
                Fields tf(t, tp);
                std::optional<std::string> type = tf.string("type");
                RETURN_IF_ERROR(tf.status());
                if (type != "function") {
                    return field_error(tp + ".type",
                                       "tool type '" + type.value_or("") + "' is not supported (function tools only)");
                }
                std::optional<std::string> name = tf.string("name");
                std::optional<std::string> description = tf.string("description");
                const Json* parameters = tf.object("parameters");
                const bool strict = tf.boolean("strict").value_or(false);
                RETURN_IF_ERROR(tf.status());
                if (!name || name->empty()) return field_error(tp + ".name", "is required");
                if (!harmony::valid_function_name(*name))
                    return field_error(tp + ".name", "must be a name of letters, digits, _ . : - (at most 128)");
                if (strict) {
                    ASSIGN_OR_RETURN(std::shared_ptr<const structured::JsonGrammar> g,
                                     strict_tool_grammar(parameters, tp + ".parameters"));
                    if (!p.tool_grammars) p.tool_grammars = std::make_shared<structured::ToolGrammars>();
                    std::const_pointer_cast<structured::ToolGrammars>(p.tool_grammars)->emplace(*name, std::move(g));
                }
                Json fn = {{"name", *name}};
                if (description) fn["description"] = *description;
                if (parameters) fn["parameters"] = *parameters;
                chat_tools.push_back({{"type", "function"}, {"function", fn}});
                tools_echo.push_back(t);
            }
            chat["tools"] = std::move(chat_tools);
        }
        RETURN_IF_ERROR(f.status());
        Json tool_choice_echo = "auto";
        if (const Json* tc = f.get("tool_choice")) {
            if (tc->is_string()) {
                chat["tool_choice"] = *tc;
            } else if (tc->is_object() && tc->value("type", std::string()) == "allowed_tools") {
                RETURN_IF_ERROR(apply_allowed_tools(*tc, "tool_choice", true, &chat));
            } else if (tc->is_object()) {
                Fields tcf(*tc, "tool_choice");
                tcf.one_of("type", {"function", "allowed_tools"});
                std::optional<std::string> name = tcf.string("name");
                RETURN_IF_ERROR(tcf.status());
                if (!name) return field_error("tool_choice.name", "is required");
                chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
            } else {
                return field_error("tool_choice", "must be a string or an object");
            }
            tool_choice_echo = *tc;
        }
        {
            auto forced = p.tool_grammars ? std::make_shared<structured::ToolGrammars>(*p.tool_grammars)
                                          : std::make_shared<structured::ToolGrammars>();
            add_forced_call_grammars(chat, forced.get());
            if (!forced->empty()) p.tool_grammars = std::move(forced);
        }
        Json reasoning_echo = {{"effort", nullptr}, {"summary", nullptr}};
        if (const Json* reasoning = f.object("reasoning")) {
            Fields rf(*reasoning, "reasoning");
            if (auto effort = rf.one_of("effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"})) {
                chat["reasoning_effort"] = *effort;
                reasoning_echo["effort"] = *effort;
            }
            // No summaries are made (the output's reasoning items carry `summary: []`); the setting is echoed, as
            // OpenAI's answer does.
            if (auto summary = rf.one_of("summary", {"auto", "concise", "detailed"}))
                reasoning_echo["summary"] = *summary;
            rf.one_of("generate_summary", {"auto", "concise", "detailed"});
            RETURN_IF_ERROR(rf.status());
        }
        read_sampling(f, &p.sampling);
        if (!p.sampling.stop.empty()) f.fail("stop", "is not a Responses API parameter");
        for (const char* k : {"guided_json", "guided_json_object", "structured_outputs"})
            if (f.has(k)) f.fail(k, "is not a Responses API parameter: use text.format");
        // Chat's names for the length limit are refused, not ignored (a request meant to be capped
        // would run to the context's end): as OpenAI's API answers them.
        for (const char* k : {"max_tokens", "max_completion_tokens"})
            if (f.has(k)) f.fail(k, "is not a Responses API parameter: use max_output_tokens");
        if (auto mot = f.integer("max_output_tokens", INT64_MIN, INT64_MAX)) {
            if (*mot <= 0) f.fail("max_output_tokens", "must be at least 1");
            p.sampling.max_tokens = mot;
        }
        p.stream = f.boolean("stream").value_or(false);
        // Echoed as asked (OpenAI's default true); false holds the output to one call (HARMONY.md §7).
        const bool parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
        chat["parallel_tool_calls"] = parallel_tool_calls;
        read_metadata(f);
        // vLLM's request_id: here it is the response's id itself (vLLM's default is "resp_<uuid>"), so it must name
        // the response in a URL path too (GET /v1/responses/{id}): letters, digits and . _ : ~ -, and not the
        // fixed route under /v1/responses/.
        p.request_id = read_request_id(f);
        if (const std::optional<std::string>& id = p.request_id;
            id && (*id == "input_tokens" || !std::all_of(id->begin(), id->end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '~' ||
                       c == '-';
            })))
            f.fail("request_id",
                   "on the Responses API names the response in URLs: letters, digits and . _ : ~ - only, and not "
                   "'input_tokens'");
        Json text_format = {{"type", "text"}};  // echoed back
        std::string verbosity = "medium";       // OpenAI's default; gpt-oss has no such control: checked, echoed
        Json chat_format;
        if (const Json* text = f.object("text")) {
            Fields t(*text, "text");
            p.grammar = read_response_format(t, "format", /*responses_shape=*/true, &chat_format);
            if (auto v = t.one_of("verbosity", {"low", "medium", "high"})) verbosity = *v;
            f.fail_status(t.status());
            if (p.grammar) text_format = (*text)["format"];
        }
        // max_tool_calls: OpenAI's cap on built-in tool calls; this server runs no built-in tools and gpt-oss makes
        // at most one function call a turn, so it only has to be a valid count (echoed).
        const std::optional<int64_t> max_tool_calls = f.integer("max_tool_calls", 1, INT64_MAX);
        const std::optional<std::string> prompt_cache_key = f.string("prompt_cache_key");
        const std::optional<std::string> safety_identifier = f.string("safety_identifier");
        const std::optional<std::string> user = f.string("user");
        // "auto": a conversation over the context loses its first turns (the routes do it, rendering each try).
        r.truncation_auto = f.one_of("truncation", {"auto", "disabled"}) == std::optional<std::string>("auto");
        RETURN_IF_ERROR(f.status());
        if (chat.contains("tool_choice")) {
            std::vector<std::string> names;
            if (chat.contains("tools")) {
                for (const Json& t : chat["tools"]) names.push_back(t["function"]["name"].get<std::string>());
            }
            // (the chat form's tool_choice.function.name is tool_choice.name in a Responses request)
            if (Status s = check_tool_choice(chat, names); !s.ok()) {
                std::string m = s.message();
                const std::string chat_name = "tool_choice.function.name";
                if (m.rfind(chat_name, 0) == 0) m = "tool_choice.name" + m.substr(chat_name.size());
                return Status(s.code(), m);
            }
        }
        if (!chat_format.is_null()) chat["response_format"] = std::move(chat_format);
        p.chat_body = std::move(chat);

        Json& echo = r.echo;
        echo["instructions"] = instructions ? Json(*instructions) : Json(nullptr);
        echo["max_output_tokens"] = p.sampling.max_tokens ? Json(*p.sampling.max_tokens) : Json(nullptr);
        echo["metadata"] =
            body.contains("metadata") && body["metadata"].is_object() ? body["metadata"] : Json::object();
        echo["parallel_tool_calls"] = parallel_tool_calls;
        echo["previous_response_id"] = r.previous_response_id ? Json(*r.previous_response_id) : Json(nullptr);
        echo["reasoning"] = reasoning_echo;
        echo["store"] = r.store;
        echo["background"] = r.background;
        // the request's own numbers (the sampler's floats would echo 0.3 as 0.30000001192092896)
        echo["temperature"] = body.contains("temperature") && body["temperature"].is_number()
                                  ? body["temperature"]
                                  : Json(p.sampling.sampling.temperature);
        echo["text"] = {{"format", std::move(text_format)}, {"verbosity", verbosity}};
        echo["max_tool_calls"] = max_tool_calls ? Json(*max_tool_calls) : Json(nullptr);
        echo["prompt_cache_key"] = prompt_cache_key ? Json(*prompt_cache_key) : Json(nullptr);
        echo["safety_identifier"] = safety_identifier ? Json(*safety_identifier) : Json(nullptr);
        echo["tool_choice"] = tool_choice_echo;
        echo["tools"] = tools_echo;
        echo["top_p"] =
            body.contains("top_p") && body["top_p"].is_number() ? body["top_p"] : Json(p.sampling.sampling.top_p);
        echo["truncation"] = r.truncation_auto ? "auto" : "disabled";
        echo["top_logprobs"] = p.top_logprobs;
        echo["user"] = user ? Json(*user) : Json(nullptr);
        return r;
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

StatusOr<CompletionParams> parse_completion_request(const Json& body, int vocab_size) {
    try {
        CompletionParams p;
        Fields f(body, "");
        f.string("model");
        auto prompt = body.find("prompt");
        if (prompt == body.end() || prompt->is_null()) return field_error("prompt", "is required");
        // One prompt (text or token ids), or a batch: an array of texts or of token-id arrays.
        auto one = [&](const Json& pr, const std::string& param) -> Status {
            CompletionPrompt out;
            if (pr.is_string()) {
                if (pr.get<std::string>().empty()) return field_error(param, "must not be empty");
                out.text = pr.get<std::string>();
            } else if (pr.is_array()) {
                if (pr.empty()) return field_error(param, "must not be empty");
                for (size_t i = 0; i < pr.size(); ++i) {
                    const Json& id = pr[i];
                    if (!id.is_number_integer())
                        return field_error(indexed(param, i), "must be a token id (an integer), not " + type_name(id));
                    // (id.dump(), not v: an id past INT64_MAX would be reported wrapped negative)
                    const bool huge = id.is_number_unsigned() && id.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
                    const int64_t v = huge ? INT64_MAX : id.get<int64_t>();
                    if (v < 0 || v >= vocab_size) {
                        return field_error(indexed(param, i), "token id " + id.dump() +
                                                                  " is outside the vocabulary [0, " +
                                                                  std::to_string(vocab_size) + ")");
                    }
                    out.ids.push_back(static_cast<int32_t>(v));
                }
            } else {
                return field_error(param, "must be a string or an array of token ids, not " + type_name(pr));
            }
            p.prompts.push_back(std::move(out));
            return ok_status();
        };
        const Json& pr = *prompt;
        const bool batch = pr.is_array() && !pr.empty() && (pr[0].is_string() || pr[0].is_array());
        if (batch) {
            for (size_t i = 0; i < pr.size(); ++i) {
                if (!pr[i].is_string() && !pr[i].is_array())
                    return field_error(indexed("prompt", i),
                                       "must be a string or an array of token ids, like the "
                                       "batch's first prompt, not " +
                                           type_name(pr[i]));
                RETURN_IF_ERROR(one(pr[i], indexed("prompt", i)));
            }
        } else {
            RETURN_IF_ERROR(one(pr, "prompt"));
        }
        read_sampling(f, &p.sampling);
        // vLLM's completions take chat's response_format too (json_object, json_schema, structural_tag): the whole
        // output is held to it.
        std::shared_ptr<const structured::StructuralTag> format_tag;
        if (std::shared_ptr<const structured::JsonGrammar> g =
                read_response_format(f, "response_format", /*responses_shape=*/false, nullptr, &format_tag);
            g || format_tag) {
            if (p.sampling.grammar || p.sampling.regex || p.sampling.ebnf || p.sampling.tag)
                f.fail_status(field_error("response_format",
                                          "give one of response_format and vLLM's guided_* / structured_outputs, "
                                          "not both"));
            p.sampling.grammar = p.sampling.disable_any_whitespace && g ? g->without_whitespace() : g;
            p.sampling.tag =
                p.sampling.disable_any_whitespace && format_tag ? format_tag->without_whitespace() : format_tag;
        }
        p.n = read_n(f);
        if (static_cast<int64_t>(p.prompts.size()) * p.n > kMaxChoices)
            f.fail("n", "the batch of " + std::to_string(p.prompts.size()) + " prompts with n=" + std::to_string(p.n) +
                            " asks for more than " + std::to_string(kMaxChoices) + " choices");
        p.echo = f.boolean("echo").value_or(false);
        if (auto mt = f.integer("max_tokens", INT64_MIN, INT64_MAX)) {
            // max_tokens 0 with echo scores the prompt alone (OpenAI's legacy form, vLLM's echo without generation:
            // one token is generated and dropped).
            if (*mt == 0 && p.echo) {
                p.echo_only = true;
                mt = 1;
            }
            if (*mt <= 0) f.fail("max_tokens", "must be at least 1 (0 only with echo)");
            p.sampling.max_tokens = mt;
        } else if (!body.contains("max_tokens")) {
            p.sampling.max_tokens = 16;  // the OpenAI default for completions
        }                                // (an explicit null: up to the context's end, as vLLM reads it)
        // OpenAI's limit is 5; vLLM's (and the engine's) 20.
        if (auto lp = f.integer("logprobs", 0, runtime::kMaxLogprobs)) p.logprobs = static_cast<int>(*lp);
        if (auto plp = f.integer("prompt_logprobs", 0, runtime::kMaxLogprobs))
            p.prompt_logprobs = static_cast<int>(*plp);
        p.tokens_as_ids = f.boolean("return_tokens_as_token_ids").value_or(false);
        p.return_token_ids = f.boolean("return_token_ids").value_or(false);
        p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(false);
        if (auto b = f.integer("best_of", 1, 128); b && *b != 1) f.fail("best_of", "only best_of=1 is supported");
        // An empty suffix is no suffix (OpenAI accepts it); text after the completion is not supported.
        if (auto suffix = f.string("suffix"); suffix && !suffix->empty()) f.fail("suffix", "is not supported");
        f.string("user");
        read_stream(f, &p.stream, &p.include_usage, &p.continuous_usage);
        p.request_id = read_request_id(f);
        RETURN_IF_ERROR(f.status());
        return p;
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

// ---- response shapes ----------------------------------------------------------------------------

Json chat_usage_json(const Usage& u) {
    return Json{{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

Json responses_usage_json(const Usage& u) {
    return Json{
        {"input_tokens", u.prompt_tokens},
        // (cache_write_tokens: OpenAI's billed cache writes, which this server has none of; the SDK requires it)
        {"input_tokens_details", {{"cache_write_tokens", 0}, {"cached_tokens", u.cached_tokens}}},
        {"output_tokens", u.completion_tokens},
        {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
        {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string random_id(std::string_view prefix) { return std::string(prefix) + random_alnum(24); }

namespace {
constexpr std::string_view kEncryptedReasoningPrefix = "gptoss-reasoning-v1:";
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

bool responses_include_value(std::string_view v) {
    // reasoning.encrypted_content and message.output_text.logprobs add output; OpenAI's other values name output of
    // tools this server refuses: accepted, nothing to add.
    static constexpr std::string_view kKnown[] = {"reasoning.encrypted_content",
                                                  "message.output_text.logprobs",
                                                  "file_search_call.results",
                                                  "web_search_call.results",
                                                  "web_search_call.action.sources",
                                                  "message.input_image.image_url",
                                                  "computer_call_output.output.image_url",
                                                  "code_interpreter_call.outputs"};
    return std::find(std::begin(kKnown), std::end(kKnown), v) != std::end(kKnown);
}

std::string reasoning_encrypted_content(std::string_view text) {
    std::string out(kEncryptedReasoningPrefix);
    size_t i = 0;
    for (; i + 3 <= text.size(); i += 3) {
        const uint32_t v = (static_cast<uint8_t>(text[i]) << 16) | (static_cast<uint8_t>(text[i + 1]) << 8) |
                           static_cast<uint8_t>(text[i + 2]);
        for (int s = 18; s >= 0; s -= 6) out += kBase64[(v >> s) & 63];
    }
    if (const size_t rest = text.size() - i; rest > 0) {
        uint32_t v = static_cast<uint8_t>(text[i]) << 16;
        if (rest == 2) v |= static_cast<uint8_t>(text[i + 1]) << 8;
        out += kBase64[(v >> 18) & 63];
        out += kBase64[(v >> 12) & 63];
        out += rest == 2 ? kBase64[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

std::optional<std::string> reasoning_from_encrypted_content(std::string_view encrypted) {
    if (encrypted.substr(0, kEncryptedReasoningPrefix.size()) != kEncryptedReasoningPrefix) return std::nullopt;
    std::string_view b = encrypted.substr(kEncryptedReasoningPrefix.size());
    if (b.size() % 4 != 0) return std::nullopt;
    size_t pad = 0;
    while (pad < 2 && !b.empty() && b[b.size() - 1 - pad] == '=') ++pad;
    std::string out;
    out.reserve(b.size() / 4 * 3);
    for (size_t i = 0; i < b.size(); i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = b[i + k];
            uint32_t d;
            if (c >= 'A' && c <= 'Z') {
                d = static_cast<uint32_t>(c - 'A');
            } else if (c >= 'a' && c <= 'z') {
                d = static_cast<uint32_t>(c - 'a' + 26);
            } else if (c >= '0' && c <= '9') {
                d = static_cast<uint32_t>(c - '0' + 52);
            } else if (c == '+') {
                d = 62;
            } else if (c == '/') {
                d = 63;
            } else if (c == '=' && i + 4 == b.size() && k >= 4 - pad) {
                d = 0;
            } else {
                return std::nullopt;
            }
            v = (v << 6) | d;
        }
        const size_t bytes = i + 4 == b.size() ? 3 - pad : 3;
        for (size_t k = 0; k < bytes; ++k) out += static_cast<char>((v >> (16 - 8 * k)) & 0xFF);
    }
    if (tokenizer::valid_utf8_prefix(out.data(), out.size()) != out.size()) return std::nullopt;
    return out;
}

int64_t unix_time_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_event(const Json& data, std::string_view event_name) {
    std::string out;
    if (!event_name.empty()) {
        out += "event: ";
        out += event_name;
        out += '\n';
    }
    out += "data: ";
    out += dump_json(data);  // one line: dump() escapes every newline
    out += "\n\n";
    return out;
}

std::string lossy_utf8(std::string_view bytes) {
    std::string b(bytes);
    return harmony::decode_utf8_lossy(b, true);
}

Json token_bytes_json(std::string_view bytes) {
    Json a = Json::array();
    for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
    return a;
}

}  // namespace gptoss::server
