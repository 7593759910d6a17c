#include "structured/structural_tag.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <set>

namespace gptoss::structured {

using Json = nlohmann::ordered_json;

// ---- StopScanner ---------------------------------------------------------------------------------------------

StopScanner::StopScanner(const std::vector<std::string>& stops) {
    std::vector<std::array<int32_t, 256>> go(1);
    go[0].fill(-1);
    std::vector<uint8_t> term(1, 0);
    for (const std::string& s : stops) {
        int32_t cur = 0;
        for (const char ch : s) {
            const auto b = static_cast<uint8_t>(ch);
            if (go[static_cast<size_t>(cur)][b] < 0) {
                go[static_cast<size_t>(cur)][b] = static_cast<int32_t>(go.size());
                go.emplace_back().fill(-1);
                term.push_back(0);
            }
            cur = go[static_cast<size_t>(cur)][b];
        }
        term[static_cast<size_t>(cur)] = 1;
    }
    // Breadth first: a state's failure state is shallower, so it is complete before the state is.
    std::vector<int32_t> fail(go.size(), 0);
    std::deque<int32_t> queue;
    for (int b = 0; b < 256; ++b) {
        int32_t& v = go[0][static_cast<size_t>(b)];
        if (v < 0) {
            v = 0;
        } else {
            fail[static_cast<size_t>(v)] = 0;
            queue.push_back(v);
        }
    }
    while (!queue.empty()) {
        const int32_t u = queue.front();
        queue.pop_front();
        term[static_cast<size_t>(u)] |= term[static_cast<size_t>(fail[static_cast<size_t>(u)])];
        for (int b = 0; b < 256; ++b) {
            int32_t& v = go[static_cast<size_t>(u)][static_cast<size_t>(b)];
            const int32_t via_fail = go[static_cast<size_t>(fail[static_cast<size_t>(u)])][static_cast<size_t>(b)];
            if (v < 0) {
                v = via_fail;
            } else {
                fail[static_cast<size_t>(v)] = via_fail;
                queue.push_back(v);
            }
        }
    }
    table_.resize(go.size() * 256);
    for (size_t u = 0; u < go.size(); ++u)
        for (int b = 0; b < 256; ++b) {
            const int32_t v = go[u][static_cast<size_t>(b)];
            table_[u * 256 + static_cast<size_t>(b)] = term[static_cast<size_t>(v)] ? -1 : v;
        }
    for (int b = 0; b < 256; ++b)
        if (table_[static_cast<size_t>(b)] == 0) start_loop_[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
}

// ---- parsing ----------------------------------------------------------------------------------------------------

namespace {

struct Format {
    enum class Kind {
        kConst,
        kJson,
        kRegex,
        kText,
        kSeq,
        kOr,
        kOptional,
        kPlus,
        kStar,
        kRepeat,
        kTag,
        kTriggered,
        kTagsSep,
        kDispatch
    };
    Kind kind = Kind::kConst;
    std::string value;                          // kConst; kTag: begin; kTagsSep: separator
    std::shared_ptr<const JsonGrammar> json;    // kJson
    std::shared_ptr<const RegexGrammar> regex;  // kRegex
    std::vector<std::string> strings;           // kText / kTriggered / kDispatch: excludes; kTag: ends
    std::vector<std::string> triggers;          // kTriggered: triggers; kDispatch: patterns (one a kid)
    int64_t max_chars = -1;                     // kText
    int64_t min = 0, max = -1;                  // kRepeat
    bool at_least_one = false, stop_after_first = false, loop = true;
    std::vector<Format> kids;  // kSeq / kOr: elements; kOptional..kRepeat, kTag: content; kTriggered / kTagsSep:
                               // tags; kDispatch: each pattern's format
};

std::string type_of(const Json& v) {
    switch (v.type()) {
        case Json::value_t::null: return "null";
        case Json::value_t::boolean: return "a boolean";
        case Json::value_t::string: return "a string";
        case Json::value_t::array: return "an array";
        case Json::value_t::object: return "an object";
        default: return "a number";
    }
}

constexpr int64_t kMaxRepeat = 1000;
constexpr size_t kMaxStringBytes = 4096;

class Parser {
public:
    Status format(const Json& j, const std::string& path, int depth, Format* out) {
        if (depth >= kMaxTagDepth)
            return invalid_argument(path + ": formats nest more than " + std::to_string(kMaxTagDepth) + " deep");
        if (!j.is_object()) return invalid_argument(path + ": must be a format object, not " + type_of(j));
        auto t = j.find("type");
        if (t == j.end() || !t->is_string()) return invalid_argument(path + ".type: is required (a string)");
        const std::string type = t->get<std::string>();
        static const std::set<std::string> token_level = {"token", "exclude_token", "any_tokens",
                                                          "token_triggered_tags", "token_dispatch"};
        if (token_level.count(type))
            return unimplemented(path + ".type: '" + type +
                                 "' is a token-level format, which is not supported (string-level formats only)");
        if (type == "grammar")
            return unimplemented(path +
                                 ".type: 'grammar' formats are not supported inside a structural tag (use "
                                 "regex or json_schema, or structured_outputs.grammar for a whole output)");
        if (type == "const_string") {
            RETURN_IF_ERROR(keys(j, path, {"value"}));
            out->kind = Format::Kind::kConst;
            return string(j, path, "value", true, &out->value);
        }
        if (type == "json_schema") {
            RETURN_IF_ERROR(keys(j, path, {"json_schema", "style", "any_order"}));
            if (auto s = j.find("style"); s != j.end() && !(s->is_string() && *s == "json"))
                return unimplemented(path + ".style: only \"json\" is supported");
            if (auto a = j.find("any_order"); a != j.end() && !(a->is_boolean() && !a->get<bool>()))
                return unimplemented(path + ".any_order: only false is supported (properties in the schema's order)");
            auto s = j.find("json_schema");
            if (s == j.end() || !(s->is_object() || s->is_boolean()))
                return invalid_argument(path + ".json_schema: is required (a JSON Schema: an object or a boolean)");
            return schema(*s, path + ".json_schema", out);
        }
        if (type == "regex") {
            RETURN_IF_ERROR(keys(j, path, {"pattern"}));
            std::string pattern;
            RETURN_IF_ERROR(string(j, path, "pattern", false, &pattern));
            auto g = RegexGrammar::compile(pattern);
            if (!g.ok()) return invalid_argument(path + ".pattern: " + g.status().message());
            out->kind = Format::Kind::kRegex;
            out->regex = *g;
            return ok_status();
        }
        if (type == "any_text") {
            RETURN_IF_ERROR(keys(j, path, {"excludes", "max_chars", "max_tokens"}));
            if (auto m = j.find("max_tokens"); m != j.end() && !m->is_null())
                return unimplemented(path + ".max_tokens: is not supported (max_chars is)");
            out->kind = Format::Kind::kText;
            RETURN_IF_ERROR(strings(j, path, "excludes", false, &out->strings));
            if (auto m = j.find("max_chars"); m != j.end() && !m->is_null()) {
                if (!m->is_number_integer() || m->get<int64_t>() < 0)
                    return invalid_argument(path + ".max_chars: must be an integer of at least 0, or null");
                out->max_chars = m->get<int64_t>();
            }
            return ok_status();
        }
        if (type == "sequence" || type == "or") {
            RETURN_IF_ERROR(keys(j, path, {"elements"}));
            out->kind = type == "or" ? Format::Kind::kOr : Format::Kind::kSeq;
            auto e = j.find("elements");
            if (e == j.end() || !e->is_array() || e->empty())
                return invalid_argument(path + ".elements: must be a non-empty array of formats");
            for (size_t i = 0; i < e->size(); ++i)
                RETURN_IF_ERROR(format((*e)[i], path + ".elements[" + std::to_string(i) + "]", depth + 1,
                                       &out->kids.emplace_back()));
            return ok_status();
        }
        if (type == "optional" || type == "plus" || type == "star" || type == "repeat") {
            const bool repeat = type == "repeat";
            RETURN_IF_ERROR(repeat ? keys(j, path, {"content", "min", "max"}) : keys(j, path, {"content"}));
            out->kind = type == "optional" ? Format::Kind::kOptional
                        : type == "plus"   ? Format::Kind::kPlus
                        : type == "star"   ? Format::Kind::kStar
                                           : Format::Kind::kRepeat;
            if (repeat) {
                auto mn = j.find("min"), mx = j.find("max");
                if (mn == j.end() || !mn->is_number_integer() || mn->get<int64_t>() < 0 ||
                    mn->get<int64_t>() > kMaxRepeat)
                    return invalid_argument(path + ".min: must be an integer from 0 to " + std::to_string(kMaxRepeat));
                if (mx == j.end() || !mx->is_number_integer() ||
                    (mx->get<int64_t>() != -1 &&
                     (mx->get<int64_t>() < mn->get<int64_t>() || mx->get<int64_t>() > kMaxRepeat)))
                    return invalid_argument(path + ".max: must be an integer from min to " +
                                            std::to_string(kMaxRepeat) + ", or -1 (no bound)");
                out->min = mn->get<int64_t>();
                out->max = mx->get<int64_t>();
            }
            return content(j, path, depth, out);
        }
        if (type == "tag") return tag(j, path, depth, out);
        if (type == "triggered_tags") {
            RETURN_IF_ERROR(keys(j, path, {"triggers", "tags", "at_least_one", "stop_after_first", "excludes"}));
            out->kind = Format::Kind::kTriggered;
            RETURN_IF_ERROR(strings(j, path, "triggers", true, &out->triggers));
            RETURN_IF_ERROR(strings(j, path, "excludes", false, &out->strings));
            RETURN_IF_ERROR(flags(j, path, out));
            RETURN_IF_ERROR(tags(j, path, depth, out));
            for (size_t i = 0; i < out->kids.size(); ++i) {
                const std::string& begin = out->kids[i].value;
                if (std::none_of(out->triggers.begin(), out->triggers.end(),
                                 [&](const std::string& t) { return begin.rfind(t, 0) == 0; }))
                    return invalid_argument(path + ".tags[" + std::to_string(i) + "].begin: '" + begin +
                                            "' does not start with any of the triggers");
            }
            return ok_status();
        }
        if (type == "tags_with_separator") {
            RETURN_IF_ERROR(keys(j, path, {"tags", "separator", "at_least_one", "stop_after_first"}));
            out->kind = Format::Kind::kTagsSep;
            RETURN_IF_ERROR(string(j, path, "separator", true, &out->value));
            RETURN_IF_ERROR(flags(j, path, out));
            return tags(j, path, depth, out);
        }
        if (type == "dispatch") {
            RETURN_IF_ERROR(keys(j, path, {"rules", "loop", "excludes"}));
            out->kind = Format::Kind::kDispatch;
            RETURN_IF_ERROR(strings(j, path, "excludes", false, &out->strings));
            if (auto l = j.find("loop"); l != j.end()) {
                if (!l->is_boolean()) return invalid_argument(path + ".loop: must be a boolean");
                out->loop = l->get<bool>();
            }
            auto r = j.find("rules");
            if (r == j.end() || !r->is_array() || r->empty())
                return invalid_argument(path + ".rules: must be a non-empty array of [pattern, format] pairs");
            for (size_t i = 0; i < r->size(); ++i) {
                const std::string p = path + ".rules[" + std::to_string(i) + "]";
                const Json& rule = (*r)[i];
                if (!rule.is_array() || rule.size() != 2 || !rule[0].is_string() || rule[0].get<std::string>().empty())
                    return invalid_argument(p + ": must be a [pattern, format] pair (a non-empty string and a format)");
                if (rule[0].get<std::string>().size() > kMaxStringBytes)
                    return invalid_argument(p + "[0]: at most " + std::to_string(kMaxStringBytes) + " bytes");
                out->triggers.push_back(rule[0].get<std::string>());
                RETURN_IF_ERROR(format(rule[1], p + "[1]", depth + 1, &out->kids.emplace_back()));
            }
            return ok_status();
        }
        return invalid_argument(path + ".type: unknown format '" + type +
                                "' (const_string, json_schema, regex, any_text, sequence, or, optional, plus, star, "
                                "repeat, tag, triggered_tags, tags_with_separator, dispatch)");
    }

    // The legacy form's structures: tags of JSON content.
    Status structures(const Json& j, Format* out) {
        out->kind = Format::Kind::kTriggered;
        auto s = j.find("structures");
        if (!s->is_array() || s->empty()) return invalid_argument("structures: must be a non-empty array");
        RETURN_IF_ERROR(strings(j, "", "triggers", true, &out->triggers));
        for (size_t i = 0; i < s->size(); ++i) {
            const std::string p = "structures[" + std::to_string(i) + "]";
            const Json& st = (*s)[i];
            if (!st.is_object()) return invalid_argument(p + ": must be an object with begin, schema and end");
            RETURN_IF_ERROR(keys(st, p, {"begin", "schema", "end"}));
            Format& t = out->kids.emplace_back();
            t.kind = Format::Kind::kTag;
            RETURN_IF_ERROR(string(st, p, "begin", false, &t.value));
            std::string end;
            RETURN_IF_ERROR(string(st, p, "end", true, &end));
            t.strings.push_back(end);
            auto sc = st.find("schema");
            if (sc == st.end() || !(sc->is_object() || sc->is_boolean()))
                return invalid_argument(p + ".schema: is required (a JSON Schema: an object or a boolean)");
            RETURN_IF_ERROR(schema(*sc, p + ".schema", &t.kids.emplace_back()));
            if (std::none_of(out->triggers.begin(), out->triggers.end(),
                             [&](const std::string& tr) { return t.value.rfind(tr, 0) == 0; }))
                return invalid_argument(p + ".begin: '" + t.value + "' does not start with any of the triggers");
        }
        return ok_status();
    }

private:
    static std::string key_path(const std::string& path, const char* key) {
        return path.empty() ? std::string(key) : path + "." + key;
    }
    static Status keys(const Json& j, const std::string& path, std::initializer_list<const char*> allowed) {
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (it.key() == "type") continue;
            if (std::none_of(allowed.begin(), allowed.end(), [&](const char* k) { return it.key() == k; })) {
                std::string list;
                for (const char* k : allowed) list += (list.empty() ? "" : ", ") + std::string(k);
                return invalid_argument(key_path(path, it.key().c_str()) + ": unknown field (this format takes " +
                                        list + ")");
            }
        }
        return ok_status();
    }
    static Status string(const Json& j, const std::string& path, const char* key, bool empty_ok, std::string* out) {
        auto v = j.find(key);
        if (v == j.end() || !v->is_string()) return invalid_argument(key_path(path, key) + ": is required (a string)");
        *out = v->get<std::string>();
        if (!empty_ok && out->empty()) return invalid_argument(key_path(path, key) + ": must not be empty");
        if (out->size() > kMaxStringBytes)
            return invalid_argument(key_path(path, key) + ": at most " + std::to_string(kMaxStringBytes) + " bytes");
        return ok_status();
    }
    static Status strings(const Json& j, const std::string& path, const char* key, bool required,
                          std::vector<std::string>* out) {
        auto v = j.find(key);
        if (v == j.end() || v->is_null()) {
            if (required) return invalid_argument(key_path(path, key) + ": is required (an array of strings)");
            return ok_status();
        }
        if (!v->is_array() || (required && v->empty()))
            return invalid_argument(key_path(path, key) + ": must be " + (required ? "a non-empty" : "an") +
                                    " array of non-empty strings");
        for (size_t i = 0; i < v->size(); ++i) {
            const Json& s = (*v)[i];
            if (!s.is_string() || s.get<std::string>().empty() || s.get<std::string>().size() > kMaxStringBytes)
                return invalid_argument(key_path(path, key) + "[" + std::to_string(i) +
                                        "]: must be a non-empty string of at most " + std::to_string(kMaxStringBytes) +
                                        " bytes");
            out->push_back(s.get<std::string>());
        }
        return ok_status();
    }
    static Status flags(const Json& j, const std::string& path, Format* out) {
        for (auto [key, flag] :
             {std::pair{"at_least_one", &out->at_least_one}, std::pair{"stop_after_first", &out->stop_after_first}}) {
            auto v = j.find(key);
            if (v == j.end()) continue;
            if (!v->is_boolean()) return invalid_argument(key_path(path, key) + ": must be a boolean");
            *flag = v->get<bool>();
        }
        return ok_status();
    }
    Status schema(const Json& s, const std::string& path, Format* out) {
        auto g = JsonGrammar::compile(s);
        if (!g.ok()) return invalid_argument(path + ": " + g.status().message());
        out->kind = Format::Kind::kJson;
        out->json = *g;
        return ok_status();
    }
    Status content(const Json& j, const std::string& path, int depth, Format* out) {
        auto c = j.find("content");
        if (c == j.end()) return invalid_argument(path + ".content: is required (a format)");
        return format(*c, path + ".content", depth + 1, &out->kids.emplace_back());
    }
    Status tag(const Json& j, const std::string& path, int depth, Format* out) {
        RETURN_IF_ERROR(keys(j, path, {"begin", "content", "end"}));
        out->kind = Format::Kind::kTag;
        if (auto b = j.find("begin"); b != j.end() && b->is_object())
            return unimplemented(path + ".begin: token begins are token-level, which is not supported (a string)");
        RETURN_IF_ERROR(string(j, path, "begin", true, &out->value));
        auto e = j.find("end");
        if (e != j.end() && e->is_object())
            return unimplemented(path + ".end: token ends are token-level, which is not supported (a string)");
        if (e != j.end() && e->is_array()) {
            if (e->empty()) return invalid_argument(path + ".end: must be a string or a non-empty array of strings");
            for (size_t i = 0; i < e->size(); ++i) {
                if (!(*e)[i].is_string() || (*e)[i].get<std::string>().size() > kMaxStringBytes)
                    return invalid_argument(path + ".end[" + std::to_string(i) + "]: must be a string of at most " +
                                            std::to_string(kMaxStringBytes) + " bytes");
                out->strings.push_back((*e)[i].get<std::string>());
            }
        } else {
            RETURN_IF_ERROR(string(j, path, "end", true, &out->strings.emplace_back()));
        }
        return content(j, path, depth, out);
    }
    Status tags(const Json& j, const std::string& path, int depth, Format* out) {
        auto t = j.find("tags");
        if (t == j.end() || !t->is_array() || t->empty())
            return invalid_argument(path + ".tags: must be a non-empty array of tag formats");
        for (size_t i = 0; i < t->size(); ++i) {
            const std::string p = path + ".tags[" + std::to_string(i) + "]";
            const Json& x = (*t)[i];
            if (!x.is_object()) return invalid_argument(p + ": must be a tag format, not " + type_of(x));
            if (auto ty = x.find("type"); ty != x.end() && !(ty->is_string() && *ty == "tag"))
                return invalid_argument(p + ".type: must be \"tag\"");
            RETURN_IF_ERROR(tag(x, p, depth + 1, &out->kids.emplace_back()));
        }
        return ok_status();
    }
};

}  // namespace

// ---- compiling ----------------------------------------------------------------------------------------------------

class TagCompiler {
public:
    explicit TagCompiler(StructuralTag* t) : t_(t) {}

    // The node that matches `f` then continues at `next`; `stops`: the enclosing tag's ends, which free text
    // directly inside it does not run through.
    StatusOr<int32_t> build(const Format& f, int32_t next, const std::vector<std::string>& stops) {
        // (repeats of formats that compile to no node, e.g. empty strings, add no node to count)
        if (++builds_ > kMaxBuilds)
            return invalid_argument("the structural tag is too large (more than " + std::to_string(kMaxBuilds) +
                                    " formats once repeats are unrolled)");
        switch (f.kind) {
            case Format::Kind::kConst: return literal(f.value, next);
            case Format::Kind::kJson: {
                StructuralTag::Leaf l;
                l.kind = StructuralTag::Leaf::Kind::kJson;
                l.json = f.json;
                return leaf(std::move(l), next);
            }
            case Format::Kind::kRegex: {
                StructuralTag::Leaf l;
                l.kind = StructuralTag::Leaf::Kind::kRegex;
                l.regex = f.regex;
                return leaf(std::move(l), next);
            }
            case Format::Kind::kText: return text(f.strings, stops, f.max_chars, next);
            case Format::Kind::kSeq: {
                int32_t n = next;
                for (size_t i = f.kids.size(); i-- > 0;) {
                    ASSIGN_OR_RETURN(n, build(f.kids[i], n, {}));
                }
                return n;
            }
            case Format::Kind::kOr: {
                std::vector<int32_t> alts;
                for (const Format& k : f.kids) {
                    ASSIGN_OR_RETURN(int32_t a, build(k, next, stops));
                    alts.push_back(a);
                }
                return split(std::move(alts));
            }
            case Format::Kind::kOptional: {
                ASSIGN_OR_RETURN(int32_t body, build(f.kids[0], next, {}));
                return split({body, next});
            }
            case Format::Kind::kStar:
            case Format::Kind::kPlus: {
                ASSIGN_OR_RETURN(int32_t s, split({}));
                ASSIGN_OR_RETURN(int32_t body, build(f.kids[0], s, {}));
                t_->nodes_[static_cast<size_t>(s)].alts = {body, next};
                return f.kind == Format::Kind::kStar ? s : body;
            }
            case Format::Kind::kRepeat: {
                int32_t n = next;
                if (f.max < 0) {
                    ASSIGN_OR_RETURN(n, split({}));
                    ASSIGN_OR_RETURN(int32_t body, build(f.kids[0], n, {}));
                    t_->nodes_[static_cast<size_t>(n)].alts = {body, next};
                } else {
                    // X{0,k} = ε | X X{0,k-1}
                    for (int64_t k = 0; k < f.max - f.min; ++k) {
                        ASSIGN_OR_RETURN(int32_t body, build(f.kids[0], n, {}));
                        ASSIGN_OR_RETURN(n, split({body, next}));
                    }
                }
                for (int64_t k = 0; k < f.min; ++k) {
                    ASSIGN_OR_RETURN(n, build(f.kids[0], n, {}));
                }
                return n;
            }
            case Format::Kind::kTag: return tag(f, next);
            case Format::Kind::kTriggered: {
                std::vector<std::string> free_stops = f.triggers;
                free_stops.insert(free_stops.end(), f.strings.begin(), f.strings.end());
                free_stops.insert(free_stops.end(), stops.begin(), stops.end());
                auto tags_to = [&](int32_t k) { return any_tag(f.kids, k); };
                if (f.stop_after_first) {
                    if (f.at_least_one) return tags_to(next);
                    ASSIGN_OR_RETURN(int32_t after, tags_to(next));
                    ASSIGN_OR_RETURN(int32_t s, split({next, after}));
                    return text(free_stops, {}, -1, s);
                }
                // free → S; S → exit | tag → free
                ASSIGN_OR_RETURN(int32_t s, split({}));
                ASSIGN_OR_RETURN(int32_t free, text(free_stops, {}, -1, s));
                ASSIGN_OR_RETURN(int32_t tags, tags_to(free));
                t_->nodes_[static_cast<size_t>(s)].alts = {next, tags};
                return f.at_least_one ? tags : free;
            }
            case Format::Kind::kTagsSep: {
                auto tags_to = [&](int32_t k) { return any_tag(f.kids, k); };
                int32_t first;
                if (f.stop_after_first) {
                    ASSIGN_OR_RETURN(first, tags_to(next));
                } else {
                    // L → exit | separator tag L
                    ASSIGN_OR_RETURN(int32_t l, split({}));
                    ASSIGN_OR_RETURN(int32_t more, tags_to(l));
                    ASSIGN_OR_RETURN(int32_t sep, literal(f.value, more));
                    t_->nodes_[static_cast<size_t>(l)].alts = {next, sep};
                    ASSIGN_OR_RETURN(first, tags_to(l));
                }
                if (f.at_least_one) return first;
                return split({next, first});
            }
            case Format::Kind::kDispatch: {
                std::vector<std::string> free_stops = f.triggers;
                free_stops.insert(free_stops.end(), f.strings.begin(), f.strings.end());
                free_stops.insert(free_stops.end(), stops.begin(), stops.end());
                ASSIGN_OR_RETURN(int32_t s, split({}));
                ASSIGN_OR_RETURN(int32_t free, text(free_stops, {}, -1, s));
                std::vector<int32_t> alts{next};
                for (size_t i = 0; i < f.kids.size(); ++i) {
                    ASSIGN_OR_RETURN(int32_t body, build(f.kids[i], f.loop ? free : next, {}));
                    ASSIGN_OR_RETURN(int32_t a, literal(f.triggers[i], body));
                    alts.push_back(a);
                }
                t_->nodes_[static_cast<size_t>(s)].alts = std::move(alts);
                return free;
            }
        }
        return internal_error("structural tag: unknown format kind");
    }

    StatusOr<int32_t> accept() {
        ASSIGN_OR_RETURN(int32_t n, add_node());
        t_->nodes_[static_cast<size_t>(n)].accept = true;
        return n;
    }

private:
    StatusOr<int32_t> add_node() {
        if (t_->nodes_.size() >= static_cast<size_t>(kMaxTagNodes))
            return invalid_argument("the structural tag is too large (more than " + std::to_string(kMaxTagNodes) +
                                    " automaton nodes once repeats are unrolled)");
        t_->nodes_.emplace_back();
        return static_cast<int32_t>(t_->nodes_.size() - 1);
    }
    StatusOr<int32_t> split(std::vector<int32_t> alts) {
        ASSIGN_OR_RETURN(int32_t n, add_node());
        t_->nodes_[static_cast<size_t>(n)].alts = std::move(alts);
        return n;
    }
    StatusOr<int32_t> leaf(StructuralTag::Leaf l, int32_t next) {
        ASSIGN_OR_RETURN(int32_t n, add_node());
        t_->leaves_.push_back(std::move(l));
        t_->nodes_[static_cast<size_t>(n)].leaf = static_cast<int32_t>(t_->leaves_.size() - 1);
        t_->nodes_[static_cast<size_t>(n)].next = next;
        return n;
    }
    StatusOr<int32_t> literal(const std::string& s, int32_t next) {
        if (s.empty()) return next;
        StructuralTag::Leaf l;
        l.literal = s;
        return leaf(std::move(l), next);
    }
    StatusOr<int32_t> text(std::vector<std::string> a, const std::vector<std::string>& b, int64_t max_chars,
                           int32_t next) {
        a.insert(a.end(), b.begin(), b.end());
        a.erase(std::remove(a.begin(), a.end(), std::string()), a.end());
        std::sort(a.begin(), a.end());
        a.erase(std::unique(a.begin(), a.end()), a.end());
        // One scanner per set of stops (a repeat's copies share theirs); their tables are bounded together.
        size_t bytes = 0;
        for (const std::string& s : a) bytes += s.size();
        std::shared_ptr<const StopScanner>& scanner = scanners_[a];
        if (!scanner) {
            scanner_bytes_ += bytes + 1;
            if (scanner_bytes_ > kMaxScannerBytes)
                return invalid_argument(
                    "the structural tag's free text has too many stop strings (triggers, "
                    "excludes and ends: more than " +
                    std::to_string(kMaxScannerBytes) + " bytes of them in all)");
            scanner = std::make_shared<StopScanner>(a);
        }
        StructuralTag::Leaf l;
        l.kind = StructuralTag::Leaf::Kind::kText;
        l.text = scanner;
        l.max_chars = max_chars;
        return leaf(std::move(l), next);
    }
    // One of `tags`, then `next`.
    StatusOr<int32_t> any_tag(const std::vector<Format>& tags, int32_t next) {
        std::vector<int32_t> alts;
        for (const Format& t : tags) {
            ASSIGN_OR_RETURN(int32_t a, tag(t, next));
            alts.push_back(a);
        }
        return split(std::move(alts));
    }
    StatusOr<int32_t> tag(const Format& f, int32_t next) {
        std::vector<int32_t> ends;
        for (const std::string& e : f.strings) {
            ASSIGN_OR_RETURN(int32_t n, literal(e, next));
            ends.push_back(n);
        }
        ASSIGN_OR_RETURN(int32_t end, ends.size() == 1 ? StatusOr<int32_t>(ends[0]) : split(std::move(ends)));
        // (only free text, triggered tags, dispatch and the branches of an `or` read them)
        ASSIGN_OR_RETURN(int32_t body, build(f.kids[0], end, f.strings));
        return literal(f.value, body);
    }

    // The scanners' tables take 1 KB a stop byte: 64 MB at most.
    static constexpr size_t kMaxScannerBytes = 65536;
    static constexpr int64_t kMaxBuilds = 4 * kMaxTagNodes;
    int64_t builds_ = 0;
    StructuralTag* t_;
    std::map<std::vector<std::string>, std::shared_ptr<const StopScanner>> scanners_;
    size_t scanner_bytes_ = 0;
};

StatusOr<std::shared_ptr<const StructuralTag>> StructuralTag::parse(const Json& j) {
    if (!j.is_object()) return invalid_argument("must be an object, not " + type_of(j));
    if (auto t = j.find("type"); t != j.end() && !(t->is_string() && *t == "structural_tag"))
        return invalid_argument("type: must be \"structural_tag\"");
    Parser p;
    Format f;
    if (j.contains("format")) {
        for (auto it = j.begin(); it != j.end(); ++it)
            if (it.key() != "type" && it.key() != "format")
                return invalid_argument(it.key() + ": unknown field (a structural tag takes type and format)");
        RETURN_IF_ERROR(p.format(j["format"], "format", 0, &f));
    } else if (j.contains("structures")) {
        for (auto it = j.begin(); it != j.end(); ++it)
            if (it.key() != "type" && it.key() != "structures" && it.key() != "triggers")
                return invalid_argument(it.key() +
                                        ": unknown field (the legacy form takes type, structures and triggers)");
        RETURN_IF_ERROR(p.structures(j, &f));
    } else {
        return invalid_argument("format: is required (or the legacy form's structures and triggers)");
    }
    auto tag = std::shared_ptr<StructuralTag>(new StructuralTag());
    TagCompiler c(tag.get());
    ASSIGN_OR_RETURN(int32_t accept, c.accept());
    ASSIGN_OR_RETURN(tag->root_, c.build(f, accept, {}));
    tag->find_accepting();
    return std::shared_ptr<const StructuralTag>(std::move(tag));
}

bool StructuralTag::empty_ok(const Leaf& l) {
    return l.kind == Leaf::Kind::kText || (l.kind == Leaf::Kind::kRegex && l.regex->accepting(l.regex->start()));
}

void StructuralTag::find_accepting() {
    // Backwards from the accept nodes over the epsilon edges (an alternative, or a leaf that matches the empty text).
    std::vector<std::vector<int32_t>> preds(nodes_.size());
    for (size_t n = 0; n < nodes_.size(); ++n) {
        for (int32_t a : nodes_[n].alts) preds[static_cast<size_t>(a)].push_back(static_cast<int32_t>(n));
        if (nodes_[n].leaf >= 0 && empty_ok(leaves_[static_cast<size_t>(nodes_[n].leaf)]))
            preds[static_cast<size_t>(nodes_[n].next)].push_back(static_cast<int32_t>(n));
    }
    reaches_accept_.assign(nodes_.size(), 0);
    std::vector<int32_t> work;
    for (size_t n = 0; n < nodes_.size(); ++n)
        if (nodes_[n].accept) reaches_accept_[n] = 1, work.push_back(static_cast<int32_t>(n));
    while (!work.empty()) {
        const int32_t n = work.back();
        work.pop_back();
        for (int32_t p : preds[static_cast<size_t>(n)])
            if (!reaches_accept_[static_cast<size_t>(p)])
                reaches_accept_[static_cast<size_t>(p)] = 1, work.push_back(p);
    }
}

std::shared_ptr<const StructuralTag> StructuralTag::without_whitespace() const {
    auto t = std::shared_ptr<StructuralTag>(new StructuralTag(*this));
    // One converted grammar for each grammar (a repeat's copies share theirs).
    std::map<const JsonGrammar*, std::shared_ptr<const JsonGrammar>> converted;
    for (Leaf& l : t->leaves_) {
        if (!l.json) continue;
        std::shared_ptr<const JsonGrammar>& c = converted[l.json.get()];
        if (!c) c = l.json->without_whitespace();
        l.json = c;
    }
    return t;
}

// ---- matching -------------------------------------------------------------------------------------------------------

bool TagThread::operator==(const TagThread& o) const {
    return node == o.node && state == o.state && chars == o.chars && utf8 == o.utf8 && json == o.json;
}

StructuralTagMatcher::StructuralTagMatcher(const StructuralTag& tag)
    : t_(&tag), seen_(static_cast<size_t>(tag.num_nodes()), 0) {
    next_epoch();
    enter(tag.root());
}

void StructuralTagMatcher::next_epoch() {
    if (++epoch_ == 0) {  // wrapped: every node unseen again
        std::fill(seen_.begin(), seen_.end(), 0);
        epoch_ = 1;
    }
}

bool StructuralTagMatcher::leaf_accepting(const TagThread& t) const {
    const StructuralTag::Leaf& l = t_->leaf(t_->node(t.node).leaf);
    switch (l.kind) {
        case StructuralTag::Leaf::Kind::kLiteral: return static_cast<size_t>(t.state) == l.literal.size();
        case StructuralTag::Leaf::Kind::kJson: return t.json->accepting();
        case StructuralTag::Leaf::Kind::kRegex: return l.regex->accepting(t.state);
        case StructuralTag::Leaf::Kind::kText: return l.max_chars < 0 || t.utf8 == 0;  // not inside a character
    }
    return false;
}

namespace {
// Free text under max_chars is strict UTF-8, counted in code points (session 57: continuation bytes counted as
// nothing, so stray ones ran on without limit, and the text could end inside a character). `u` is the thread's
// TagThread::utf8 (0 at a character boundary); returns the next, or -1 if `c` cannot follow; *lead: c starts one.
int32_t utf8_next(int32_t u, uint8_t c, bool* lead) {
    *lead = false;
    if (u != 0) {
        const int need = u & 0xFF, lo = u >> 8 & 0xFF, hi = u >> 16 & 0xFF;
        if (c < lo || c > hi) return -1;
        return need > 1 ? (need - 1) | 0x80 << 8 | 0xBF << 16 : 0;
    }
    *lead = true;
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) return 1 | 0x80 << 8 | 0xBF << 16;
    if (c == 0xE0) return 2 | 0xA0 << 8 | 0xBF << 16;
    if (c == 0xED) return 2 | 0x80 << 8 | 0x9F << 16;  // no surrogates
    if (c >= 0xE1 && c <= 0xEF) return 2 | 0x80 << 8 | 0xBF << 16;
    if (c == 0xF0) return 3 | 0x90 << 8 | 0xBF << 16;
    if (c >= 0xF1 && c <= 0xF3) return 3 | 0x80 << 8 | 0xBF << 16;
    if (c == 0xF4) return 3 | 0x80 << 8 | 0x8F << 16;
    return -1;
}
}  // namespace

void StructuralTagMatcher::add(TagThread t) {
    for (TagThread& o : threads_) {
        if (o.node != t.node || o.state != t.state || o.utf8 != t.utf8) continue;
        if (!t.json) {
            // Free text at the same place: the one with fewer characters so far allows all the other does.
            o.chars = std::min(o.chars, t.chars);
            return;
        }
        if (o.json == t.json) return;
    }
    if (threads_.size() >= static_cast<size_t>(kMaxTagThreads)) return;
    threads_.push_back(std::move(t));
}

void StructuralTagMatcher::enter(int start) {
    // Depth first, alternatives in order (an explicit stack: chains of empty-matching leaves may be long). Whether
    // the output may end here is known per node (StructuralTag::reaches_accept); once the threads are at their bound
    // nothing further is explored.
    std::vector<int32_t>& stack = stack_;
    stack.assign(1, start);
    while (!stack.empty()) {
        const int32_t n = stack.back();
        stack.pop_back();
        if (seen_[static_cast<size_t>(n)] == epoch_) continue;
        seen_[static_cast<size_t>(n)] = epoch_;
        if (t_->reaches_accept(n)) accept_ = true;
        if (threads_.size() >= static_cast<size_t>(kMaxTagThreads)) continue;
        const StructuralTag::Node& nd = t_->node(n);
        for (size_t k = nd.alts.size(); k-- > 0;) stack.push_back(nd.alts[k]);
        if (nd.leaf < 0) continue;
        const StructuralTag::Leaf& l = t_->leaf(nd.leaf);
        TagThread t;
        t.node = n;
        if (l.kind == StructuralTag::Leaf::Kind::kRegex) t.state = l.regex->start();
        if (l.kind == StructuralTag::Leaf::Kind::kJson) t.json.emplace(*l.json);
        add(std::move(t));
        // A leaf that matches the empty text (free text, a pattern that allows it) is also passed over.
        if (StructuralTag::empty_ok(l)) stack.push_back(nd.next);
    }
}

bool StructuralTagMatcher::step(const StructuralTagMatcher& from, uint8_t c) {
    t_ = from.t_;
    if (seen_.size() != from.seen_.size()) seen_.assign(from.seen_.size(), 0);
    threads_.clear();
    accept_ = false;
    next_epoch();
    for (const TagThread& t : from.threads_) {
        const StructuralTag::Leaf& l = t_->leaf(t_->node(t.node).leaf);
        TagThread n;
        n.node = t.node;
        switch (l.kind) {
            case StructuralTag::Leaf::Kind::kLiteral:
                if (static_cast<size_t>(t.state) >= l.literal.size() ||
                    static_cast<uint8_t>(l.literal[static_cast<size_t>(t.state)]) != c)
                    continue;
                n.state = t.state + 1;
                break;
            case StructuralTag::Leaf::Kind::kRegex:
                n.state = l.regex->next(t.state, c);
                if (n.state < 0) continue;
                break;
            case StructuralTag::Leaf::Kind::kText:
                n.state = l.text->next(t.state, c);
                if (n.state < 0) continue;
                if (l.max_chars >= 0) {
                    bool lead = false;
                    n.utf8 = utf8_next(t.utf8, c, &lead);
                    n.chars = t.chars + (lead ? 1 : 0);
                    if (n.utf8 < 0 || n.chars > l.max_chars) continue;
                }
                break;
            case StructuralTag::Leaf::Kind::kJson:
                n.json = t.json;
                if (!n.json->feed_byte(c)) continue;
                break;
        }
        add(std::move(n));
    }
    // The threads that finished their leaf continue: the next leaves begin (the loop grows threads_, which the
    // index bound leaves out).
    const size_t stepped = threads_.size();
    for (size_t i = 0; i < stepped; ++i)
        if (leaf_accepting(threads_[i])) enter(t_->node(threads_[i].node).next);
    return !threads_.empty() || accept_;
}

bool StructuralTagMatcher::feed_byte(uint8_t c) {
    StructuralTagMatcher next(*this);
    if (!next.step(*this, c) || next.threads_.empty()) {
        // The end alone may follow (accept_ with no thread): no byte can.
        return false;
    }
    *this = std::move(next);
    return true;
}

bool StructuralTagMatcher::feed(std::string_view bytes) {
    StructuralTagMatcher cur(*this), next(*this);
    for (const char ch : bytes) {
        if (!next.step(cur, static_cast<uint8_t>(ch)) || next.threads_.empty()) return false;
        std::swap(cur, next);
    }
    *this = std::move(cur);
    return true;
}

// ---- the token mask
// --------------------------------------------------------------------------------------------------

void TokenTrie::walk_tag(uint32_t node, int depth, std::vector<StructuralTagMatcher>& levels, uint8_t* mask,
                         int64_t* count) const {
    const Node& nd = nodes_[node];
    const StructuralTagMatcher& cur = levels[static_cast<size_t>(depth)];
    // The byte sets whose every subtree one thread takes whole: free text in its start state (no limit), a pattern's
    // loop, a JSON document's plain strings.
    struct Loop {
        const uint64_t* bytes;
        int64_t room;  // the most bytes a token below may have (free text under max_chars: the code points left)
    };
    Loop loops[kMaxTagThreads];
    int num_loops = 0;
    uint64_t ascii_loops[kMaxTagThreads][4];
    int num_ascii = 0;
    const JsonMatcher* jsons[kMaxTagThreads];
    int num_jsons = 0;
    for (const TagThread& t : cur.threads_) {
        const StructuralTag::Leaf& l = cur.t_->leaf(cur.t_->node(t.node).leaf);
        if (l.kind == StructuralTag::Leaf::Kind::kText && t.state == 0 && l.max_chars < 0) {
            loops[num_loops++] = {l.text->start_loop().data(), INT64_MAX};
        } else if (l.kind == StructuralTag::Leaf::Kind::kText && t.state == 0 && t.utf8 == 0) {
            // Under max_chars only ASCII subtrees are taken whole (any byte sequence of them is whole characters, one
            // a byte); the rest is stepped, so that every token's bytes are checked as UTF-8.
            uint64_t* a = ascii_loops[num_ascii++];
            const uint64_t* sl = l.text->start_loop().data();
            a[0] = sl[0], a[1] = sl[1], a[2] = 0, a[3] = 0;
            loops[num_loops++] = {a, l.max_chars - t.chars};
        } else if (l.kind == StructuralTag::Leaf::Kind::kRegex) {
            if (const uint64_t* lb = l.regex->loop_bytes(t.state)) loops[num_loops++] = {lb, INT64_MAX};
        } else if (l.kind == StructuralTag::Leaf::Kind::kJson) {
            jsons[num_jsons++] = &*t.json;
        }
    }
    JsonMatcher::PlainString plain[kMaxThreads];
    for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c) {
        const Node& ch = nodes_[c];
        bool whole = false;
        for (int k = 0; k < num_loops && !whole; ++k) {
            const uint64_t* l = loops[k].bytes;
            whole = ch.max_rest <= loops[k].room && (below_[c][0] & ~l[0]) == 0 && (below_[c][1] & ~l[1]) == 0 &&
                    (below_[c][2] & ~l[2]) == 0 && (below_[c][3] & ~l[3]) == 0;
        }
        for (int k = 0; k < num_jsons && !whole; ++k) whole = plain_subtree(plain, jsons[k]->plain_strings(plain), c);
        if (whole) {
            take(ch.lo, ch.hi, mask, count);
            continue;
        }
        StructuralTagMatcher& next = levels[static_cast<size_t>(depth) + 1];
        if (!next.step(cur, ch.byte) || next.threads_.empty()) continue;
        take(ch.lo, ch.lo + ch.own, mask, count);
        if (ch.num_children > 0) walk_tag(c, depth + 1, levels, mask, count);
    }
}

int64_t TokenTrie::fill_mask(const StructuralTagMatcher& m, std::vector<uint8_t>* mask,
                             std::vector<StructuralTagMatcher>* levels) const {
    if (mask->size() < static_cast<size_t>(vocab_size_)) mask->resize(static_cast<size_t>(vocab_size_));
    std::fill(mask->begin(), mask->end(), 0);
    if (levels->size() < static_cast<size_t>(max_len_) + 2 || &(*levels)[0].tag() != &m.tag())
        levels->assign(static_cast<size_t>(max_len_) + 2, m);
    (*levels)[0] = m;
    int64_t count = 0;
    walk_tag(0, 0, *levels, mask->data(), &count);
    return count;
}

}  // namespace gptoss::structured
