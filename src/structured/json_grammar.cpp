#include "structured/json_grammar.h"

#include "structured/regex_grammar.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <utility>

namespace gptoss::structured {

using Json = nlohmann::ordered_json;

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF), one byte at a time.
// State: 0 between characters; 1-3 that many continuation bytes (80-BF) left; 4 after E0 (A0-BF, then
// 1 more), 5 after ED (80-9F, then 1), 6 after F0 (90-BF, then 2), 7 after F4 (80-8F, then 2).
// Returns the next state, -1 for a byte that cannot come here.
int utf8_next(int state, uint8_t c) {
    switch (state) {
        case 0:
            if (c < 0x80) return 0;
            if (c >= 0xC2 && c <= 0xDF) return 1;
            if (c == 0xE0) return 4;
            if (c == 0xED) return 5;
            if (c >= 0xE1 && c <= 0xEF) return 2;
            if (c == 0xF0) return 6;
            if (c == 0xF4) return 7;
            if (c >= 0xF1 && c <= 0xF3) return 3;
            return -1;
        case 1:
        case 2:
        case 3: return c >= 0x80 && c <= 0xBF ? state - 1 : -1;
        case 4: return c >= 0xA0 && c <= 0xBF ? 1 : -1;
        case 5: return c >= 0x80 && c <= 0x9F ? 1 : -1;
        case 6: return c >= 0x90 && c <= 0xBF ? 2 : -1;
        case 7: return c >= 0x80 && c <= 0x8F ? 2 : -1;
        default: return -1;
    }
}

// A string's next byte. kStart: a character begins (counted); kMore: inside one; kClose: the closing quote.
enum class StrByte { kFail, kStart, kMore, kClose };

StrByte string_byte(JsonFrame& f, uint8_t c) {
    if (f.esc == 1) {
        if (c == 'u') {
            f.esc = 5;  // four hex digits follow
            return StrByte::kMore;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            f.esc = 0;
            return StrByte::kMore;
        }
        return StrByte::kFail;
    }
    if (f.esc >= 2) {
        if (!is_hex(c)) return StrByte::kFail;
        f.esc = f.esc == 2 ? 0 : static_cast<uint8_t>(f.esc - 1);
        return StrByte::kMore;
    }
    if (f.pending > 0) {
        const int next = utf8_next(f.pending, c);
        if (next < 0) return StrByte::kFail;
        f.pending = static_cast<uint8_t>(next);
        return StrByte::kMore;
    }
    if (c == '"') return StrByte::kClose;
    if (c == '\\') {
        f.esc = 1;
        return StrByte::kStart;
    }
    if (c < 0x20) return StrByte::kFail;
    if (c < 0x80) return StrByte::kStart;
    const int next = utf8_next(0, c);
    if (next < 0) return StrByte::kFail;
    f.pending = static_cast<uint8_t>(next);
    return StrByte::kStart;
}

// The byte a short escape's letter stands for.
uint8_t unescaped(uint8_t c) {
    switch (c) {
        case 'b': return 8;
        case 'f': return 12;
        case 'n': return 10;
        case 'r': return 13;
        case 't': return 9;
        default: return c;  // " \ /
    }
}

// A string's pattern DFA after `byte` from state s, or -1 (dead, or no longer reachable to a match).
int pattern_step(const SchemaNode& n, int s, uint8_t byte) {
    const int t = n.pattern->next(s, byte);
    return t >= 0 && (*n.pattern_live)[static_cast<size_t>(t)] ? t : -1;
}

// The UTF-8 state after plain string byte c from state `pending` (-1: c cannot appear there).
int plain_next(uint8_t c, int pending) {
    if (pending == 0 && (c == '"' || c == '\\' || c < 0x20)) return -1;
    return utf8_next(pending, c);
}

enum ObjPhase : uint8_t { kObjOpen, kObjKey, kObjColon, kObjAfterValue, kObjComma };
enum ArrPhase : uint8_t { kArrOpen, kArrAfterValue, kArrComma };
// Number phases; the terminal ones (a complete number) are kZero, kInt, kFrac, kExp.
enum NumPhase : uint8_t { kMinus = 1, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

bool number_terminal(uint8_t p) { return p == kZero || p == kInt || p == kFrac || p == kExp; }

// ---- numbers held to minimum / maximum ----
// A bounded number's frame keeps its digits (4 bits each in cand, at most kMaxBoundedDigits), how many (esc), how many
// came before the '.' (pending, once read) and its sign (aux: 1 after '-'; bounded numbers take no exponent).

// A non-negative decimal, mant × 10^-scale: mant without leading zeros ("0" for zero), without trailing zeros
// where scale > 0.
struct Dec {
    std::string mant = "0";
    int scale = 0;
};

Dec make_dec(std::string mant, int scale) {
    const size_t lead = std::min(mant.find_first_not_of('0'), mant.size());
    mant.erase(0, lead);
    while (scale > 0 && !mant.empty() && mant.back() == '0') {
        mant.pop_back();
        --scale;
    }
    if (mant.empty()) return Dec{};
    return Dec{std::move(mant), scale};
}

int compare(const Dec& a, const Dec& b) {
    if (a.mant == "0" || b.mant == "0") return a.mant == b.mant ? 0 : a.mant == "0" ? -1 : 1;
    const int s = std::max(a.scale, b.scale);
    const std::string x = a.mant + std::string(static_cast<size_t>(s - a.scale), '0');
    const std::string y = b.mant + std::string(static_cast<size_t>(s - b.scale), '0');
    if (x.size() != y.size()) return x.size() < y.size() ? -1 : 1;
    const int c = x.compare(y);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
}

// A digit string plus one.
std::string increment(std::string s) {
    size_t i = s.size();
    while (i > 0 && s[i - 1] == '9') s[--i] = '0';
    if (i == 0)
        s.insert(s.begin(), '1');
    else
        ++s[i - 1];
    return s;
}

using u128 = unsigned __int128;

u128 pow10(int e) {
    u128 r = 1;
    while (e-- > 0) r *= 10;
    return r;
}

std::string to_digits(u128 v) {
    std::string d;
    do {
        d.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
        v /= 10;
    } while (v != 0);
    std::reverse(d.begin(), d.end());
    return d;
}

// The sum of a digit string and v.
std::string add(const std::string& a, u128 v) {
    const std::string b = to_digits(v);
    std::string out;
    int carry = 0;
    for (size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
        const int x =
            (i < a.size() ? a[a.size() - 1 - i] - '0' : 0) + (i < b.size() ? b[b.size() - 1 - i] - '0' : 0) + carry;
        out.push_back(static_cast<char>('0' + x % 10));
        carry = x / 10;
    }
    std::reverse(out.begin(), out.end());
    return out;
}

// The least multiple of d × 10^-s at or above x (`above`: strictly above).
Dec step_ceil(const Dec& x, u128 d, int s, bool above) {
    std::string m;  // x × 10^s, rounded up
    bool exact = true;
    if (x.scale <= s) {
        m = x.mant == "0" ? "0" : x.mant + std::string(static_cast<size_t>(s - x.scale), '0');
    } else {  // x has a nonzero digit past 10^-s (it is normalized)
        const size_t drop = static_cast<size_t>(x.scale - s);
        m = increment(x.mant.size() > drop ? x.mant.substr(0, x.mant.size() - drop) : "0");
        exact = false;
    }
    u128 r = 0;
    for (char c : m) r = (r * 10 + static_cast<u128>(c - '0')) % d;
    if (r != 0)
        m = add(m, d - r);
    else if (above && exact)
        m = add(m, d);
    return make_dec(m, s);
}

// The least multiple of 10^-q at or above x (`above`: strictly above).
Dec grid_ceil(const Dec& x, int q, bool above) { return step_ceil(x, 1, q, above); }

// A bound on the magnitude y of a number of known sign.
struct MagnitudeBound {
    bool set = false, exclusive = false, negative = false;
    Dec v;
};

// What a number of known sign is held to, as limits on y = |x|: x = -y turns [min, max] into [-max, -min];
// multipleOf (step) is the same either way.
struct NumberLimits {
    MagnitudeBound lo, hi;
    bool has_step = false;
    Dec step;
};

NumberLimits number_limits(const SchemaNode& n, bool negative) {
    auto convert = [](const SchemaNode::Bound& b, bool flip) {
        MagnitudeBound m{.set = b.set, .exclusive = b.exclusive, .negative = false, .v = make_dec(b.digits, b.scale)};
        m.negative = (b.negative != flip) && m.v.mant != "0";
        return m;
    };
    NumberLimits l;
    l.lo = convert(negative ? n.max : n.min, negative);
    l.hi = convert(negative ? n.min : n.max, negative);
    l.has_step = n.multiple.set;
    if (l.has_step) l.step = make_dec(n.multiple.digits, n.multiple.scale);
    return l;
}

// Whether some multiple of 10^-q (and of the step) in [low, high) lies within the limits (on y >= 0).
bool grid_point_within(const Dec& low, const Dec& high, int q, const NumberLimits& l) {
    Dec from = low;
    bool strict = false;
    if (l.lo.set && !l.lo.negative) {
        if (const int c = compare(l.lo.v, low); c >= 0) {
            from = l.lo.v;
            strict = l.lo.exclusive;
        }
    }
    // The points: multiples of d × 10^-s, the least common multiple of 10^-q and the step (the step has at most
    // kMaxStepDigits digits and decimals, so d < 10^28).
    u128 d = 1;
    int s = q;
    if (l.has_step) {
        s = std::max(q, l.step.scale);
        u128 g = pow10(s - q), m = 0;
        for (char c : l.step.mant) m = m * 10 + static_cast<u128>(c - '0');
        m *= pow10(s - l.step.scale);
        u128 a = g, b = m;
        while (b != 0) a = std::exchange(b, a % b);
        d = g / a * m;
    }
    const Dec g = step_ceil(from, d, s, strict);
    if (compare(g, high) >= 0) return false;
    if (!l.hi.set) return true;
    if (l.hi.negative) return false;
    const int c = compare(g, l.hi.v);
    return c < 0 || (c == 0 && !l.hi.exclusive);
}

std::string bounded_digits(const JsonFrame& f) {
    std::string d;
    for (int i = 0; i < f.esc; ++i) d.push_back(static_cast<char>('0' + ((f.cand >> (4 * i)) & 15)));
    return d;
}

// Whether the integer part `p` (its first digits, not yet ended) can still end inside the bounds with at most
// `room` more digits.
bool integer_part_live(const std::string& p, int room, bool integer, const NumberLimits& l) {
    if (p == "0") return grid_point_within(Dec{}, make_dec("1", 0), integer ? 0 : room, l);
    for (int k = 0; k <= room; ++k) {
        const std::string zeros(static_cast<size_t>(k), '0');
        const Dec low = make_dec(p + zeros, 0);
        if (grid_point_within(low, make_dec(increment(p) + zeros, 0), integer ? 0 : room - k, l)) return true;
        if (l.hi.set && (l.hi.negative || compare(low, l.hi.v) > 0)) return false;  // longer ones are larger still
    }
    return false;
}

// Whether the bounded number begun in `f` (its phase and digits up to date) can still end inside its node's bounds.
// `max_digits`: the digit cap (a larger one asks whether any integer at all fits).
bool bounded_number_live(const SchemaNode& n, const JsonFrame& f, int max_digits = kMaxBoundedDigits) {
    const bool integer = n.kind == SchemaNode::Kind::kInteger;
    const NumberLimits l = number_limits(n, f.aux != 0);
    const std::string digits = bounded_digits(f);
    const int room = max_digits - f.esc;
    switch (f.phase) {
        case kMinus:  // no digit yet
            if (room < 1) return false;
            for (char d = '0'; d <= '9'; ++d)
                if (integer_part_live(std::string(1, d), room - 1, integer, l)) return true;
            return false;
        case kZero:
        case kInt: return integer_part_live(digits, room, integer, l);
        case kDot:
        case kFrac: {
            const int frac = f.esc - f.pending;
            if (frac == 0 && room == 0) return false;  // a '.' needs a digit
            return grid_point_within(make_dec(digits, frac), make_dec(increment(digits), frac), frac + room, l);
        }
        default: return false;
    }
}

// Whether the number in `f` may end here: a complete number, inside the bounds if its node has them.
bool number_may_end(const SchemaNode& n, const JsonFrame& f) {
    if (!number_terminal(f.phase)) return false;
    if (!n.bounded()) return true;
    const int scale = f.phase == kFrac ? f.esc - f.pending : 0;
    const Dec v = make_dec(bounded_digits(f), scale);
    return grid_point_within(v, grid_ceil(v, v.scale, true), v.scale, number_limits(n, f.aux != 0));
}

// A digit, '.' or '-' read into a bounded number's frame (its phase already advanced); false when the number can
// no longer end inside its bounds.
bool bounded_number_read(const SchemaNode& n, JsonFrame& f, uint8_t c) {
    if (f.phase == kE || f.phase == kESign || f.phase == kExp) return false;  // written without an exponent
    if (is_digit(c)) {
        if (f.esc >= kMaxBoundedDigits) return false;
        f.cand |= uint64_t{static_cast<uint64_t>(c - '0')} << (4 * f.esc);
        ++f.esc;
    } else if (c == '.') {
        f.pending = f.esc;
    } else if (c == '-') {
        f.aux = 1;
    }
    return bounded_number_live(n, f);
}

uint64_t low_bits(int n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

// Named properties that may come next in an object at count (properties in order, none required skipped).
uint64_t allowed_names(const SchemaNode& n, int count) {
    const int num = static_cast<int>(n.names.size());
    if (count >= num) return 0;
    const uint64_t ge = low_bits(num) & ~low_bits(count);
    const uint64_t req = n.required & ge;
    if (req == 0) return ge;
    const uint64_t first = req & (~req + 1);
    return ge & (first | (first - 1));
}

bool required_done(const SchemaNode& n, int count) {
    const int num = static_cast<int>(n.names.size());
    return count >= num || (n.required & ~low_bits(count)) == 0;
}

bool extra_ok(const SchemaNode& n, int count) { return n.additional >= 0 && required_done(n, count); }

int item_node(const SchemaNode& n, int index) {
    if (index < static_cast<int>(n.prefix_items.size())) return n.prefix_items[static_cast<size_t>(index)];
    return n.items;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Grammar

JsonGrammar::JsonGrammar() {
    any_ = add({});
    SchemaNode obj;
    obj.kind = SchemaNode::Kind::kObject;
    obj.additional = any_;
    any_object_ = add(obj);
    SchemaNode arr;
    arr.kind = SchemaNode::Kind::kArray;
    arr.items = any_;
    any_array_ = add(arr);
    SchemaNode str;
    str.kind = SchemaNode::Kind::kString;
    any_string_ = add(str);
    SchemaNode num;
    num.kind = SchemaNode::Kind::kNumber;
    any_number_ = add(num);
    SchemaNode b;
    b.kind = SchemaNode::Kind::kLiteral;
    b.literals = {"true", "false"};
    bool_ = add(b);
    SchemaNode null;
    null.kind = SchemaNode::Kind::kLiteral;
    null.literals = {"null"};
    null_ = add(null);
}

int JsonGrammar::add(SchemaNode n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::without_whitespace() const {
    auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar(*this));
    g->max_ws_ = 0;
    return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
    auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar());
    g->root_ = g->any_object_;
    return g;
}

class SchemaCompiler {
public:
    SchemaCompiler(const Json& root, JsonGrammar* g) : root_(root), g_(g) {}

    StatusOr<int> compile(const Json& s, const std::string& ptr, int depth) {
        if (depth > kMaxDepth) return fail(ptr, "is nested too deeply (at most " + std::to_string(kMaxDepth) + ")");
        if (g_->nodes_.size() > static_cast<size_t>(kMaxNodes))
            return fail(ptr, "makes the schema too large (over " + std::to_string(kMaxNodes) + " nodes)");
        if (s.is_boolean()) {
            if (s.get<bool>()) return g_->any_;
            return fail(ptr, "is the schema false, which no value matches");
        }
        if (!s.is_object()) return fail(ptr, "must be an object or a boolean");
        for (const char* k :
             {"patternProperties", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
              "propertyNames", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems", "$dynamicRef", "$recursiveRef"}) {
            if (s.contains(k))
                return fail(ptr + "/" + k, "is not supported in structured outputs (the output cannot be held to it)");
        }
        if (s.contains("pattern")) {  // held only where the value is a string (typed below)
            const auto t = s.find("type");
            const bool string_typed =
                t != s.end() && ((t->is_string() && *t == "string") ||
                                 (t->is_array() && std::find(t->begin(), t->end(), Json("string")) != t->end()));
            if (!string_typed || s.contains("enum") || s.contains("const") || s.contains("anyOf") ||
                s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
                return fail(ptr + "/pattern",
                            "is supported on a schema of type string (without enum, const, anyOf, "
                            "oneOf, allOf or $ref beside it)");
        }
        if (const auto u = s.find("uniqueItems"); u != s.end() && !(u->is_boolean() && !u->get<bool>())) {
            const auto t = s.find("type");
            const bool array_typed =
                t != s.end() ? ((t->is_string() && *t == "array") ||
                                (t->is_array() && std::find(t->begin(), t->end(), Json("array")) != t->end()))
                             : (s.contains("items") || s.contains("prefixItems"));
            if (!u->is_boolean()) return fail(ptr + "/uniqueItems", "must be a boolean");
            if (!array_typed || s.contains("enum") || s.contains("const") || s.contains("anyOf") ||
                s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
                return fail(ptr + "/uniqueItems",
                            "is supported on a schema of type array whose items are an enum, a const or booleans");
        }
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}) {
            if (!s.contains(k)) continue;  // held only where the value is a number (typed below)
            const auto t = s.find("type");
            auto numeric = [](const Json& name) { return name == "number" || name == "integer"; };
            const bool typed_numeric = t != s.end() && ((t->is_string() && numeric(*t)) ||
                                                        (t->is_array() && std::any_of(t->begin(), t->end(), numeric)));
            if (!typed_numeric || s.contains("enum") || s.contains("const") || s.contains("anyOf") ||
                s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
                return fail(ptr + "/" + k,
                            "is supported on a schema of type number or integer (without enum, const, anyOf, "
                            "oneOf, allOf or $ref beside it)");
        }
        int node;
        if (const auto it = s.find("$ref"); it != s.end()) {
            if (Status st = only_annotations_beside(s, "$ref", ptr); !st.ok()) return st;
            StatusOr<int> n = ref(*it, ptr + "/$ref", depth);
            if (!n.ok()) return n.status();
            node = *n;
        } else if (s.contains("enum") || s.contains("const")) {
            if (Status st = only_annotations_beside(s, s.contains("enum") ? "enum" : "const", ptr, "type"); !st.ok())
                return st;
            StatusOr<int> n = literal(s, ptr);
            if (!n.ok()) return n.status();
            node = *n;
        } else if (s.contains("anyOf") || s.contains("oneOf")) {
            const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
            if (s.contains("anyOf") && s.contains("oneOf")) return fail(ptr, "has both anyOf and oneOf");
            if (Status st = only_annotations_beside(s, key, ptr); !st.ok()) return st;
            const Json& list = s[key];
            if (!list.is_array() || list.empty()) return fail(ptr + "/" + key, "must be a non-empty array of schemas");
            SchemaNode u;
            u.kind = SchemaNode::Kind::kUnion;
            for (size_t i = 0; i < list.size(); ++i) {
                StatusOr<int> o = compile(list[i], ptr + "/" + key + "/" + std::to_string(i), depth + 1);
                if (!o.ok()) return o.status();
                add_option(&u, *o);
            }
            if (u.options.size() > static_cast<size_t>(kMaxThreads))
                return fail(ptr + "/" + key, "has more than " + std::to_string(kMaxThreads) + " options");
            node = g_->add(std::move(u));
        } else if (s.contains("allOf")) {
            if (Status st = only_annotations_beside(s, "allOf", ptr); !st.ok()) return st;
            const Json& list = s["allOf"];
            if (!list.is_array() || list.size() != 1)
                return fail(ptr + "/allOf", "is supported with exactly one schema (no merging)");
            StatusOr<int> o = compile(list[0], ptr + "/allOf/0", depth + 1);
            if (!o.ok()) return o.status();
            node = *o;
        } else if (const auto t = s.find("type"); t != s.end()) {
            if (t->is_string()) {
                StatusOr<int> n = typed(s, t->get<std::string>(), ptr, depth);
                if (!n.ok()) return n.status();
                node = *n;
            } else if (t->is_array() && !t->empty()) {
                SchemaNode u;
                u.kind = SchemaNode::Kind::kUnion;
                std::vector<std::string> seen;
                for (size_t i = 0; i < t->size(); ++i) {
                    if (!(*t)[i].is_string()) return fail(ptr + "/type/" + std::to_string(i), "must be a string");
                    if (std::find(seen.begin(), seen.end(), (*t)[i].get<std::string>()) != seen.end())
                        return fail(ptr + "/type/" + std::to_string(i), "repeats a type");
                    seen.push_back((*t)[i].get<std::string>());
                    bool admits_none = false;  // (a numeric type empty within the bounds is dropped)
                    StatusOr<int> o = typed(s, (*t)[i].get<std::string>(), ptr, depth, &admits_none);
                    if (!o.ok()) return o.status();
                    if (!admits_none) add_option(&u, *o);
                }
                const auto nb = s.find("nullable");
                if (u.options.empty() && !(nb != s.end() && nb->is_boolean() && nb->get<bool>()))
                    return fail(ptr, "admits no value: no type of the list has a number within its bounds");
                node = u.options.empty() ? g_->null_ : g_->add(std::move(u));
            } else {
                return fail(ptr + "/type", "must be a type name or a non-empty array of them");
            }
        } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
            StatusOr<int> n = typed(s, "object", ptr, depth);
            if (!n.ok()) return n.status();
            node = *n;
        } else if (s.contains("items") || s.contains("prefixItems")) {
            StatusOr<int> n = typed(s, "array", ptr, depth);
            if (!n.ok()) return n.status();
            node = *n;
        } else {
            node = g_->any_;
        }
        if (const auto nb = s.find("nullable"); nb != s.end() && nb->is_boolean() && nb->get<bool>()) {
            SchemaNode u;
            u.kind = SchemaNode::Kind::kUnion;
            add_option(&u, node);
            add_option(&u, g_->null_);
            node = g_->add(std::move(u));
        }
        return node;
    }

private:
    // Keywords that do not constrain a value: annotations, where a schema keeps its definitions, OpenAPI's
    // discriminator (its oneOf is held as anyOf) and vendor extensions (x-...). nullable is applied to whatever the
    // schema is (compile's end).
    static bool non_constraining(const std::string& k) {
        static const char* const kKeys[] = {
            "title",         "description", "default",   "examples",        "$comment",
            "$schema",       "$id",         "$anchor",   "$defs",           "definitions",
            "deprecated",    "readOnly",    "writeOnly", "contentEncoding", "contentMediaType",
            "discriminator", "nullable"};
        return k.rfind("x-", 0) == 0 || std::find(std::begin(kKeys), std::end(kKeys), k) != std::end(kKeys);
    }
    // A schema whose value `key` decides ($ref, enum / const, anyOf / oneOf, allOf): any other keyword but annotations
    // (and `also`) would be ignored by the compiled form, so it is refused rather than dropped (an enum beside
    // type: integer gave 2.5, a $ref beside required gave {}).
    static Status only_annotations_beside(const Json& s, const std::string& key, const std::string& ptr,
                                          const char* also = nullptr) {
        for (const auto& [k, v] : s.items()) {
            (void)v;
            if (k == key || non_constraining(k) || (also != nullptr && k == also)) continue;
            if ((key == "enum" && k == "const") || (key == "const" && k == "enum"))
                continue;  // both: checked in literal
            return fail(ptr + "/" + k, "beside " + key + " is not supported (the output could not be held to both)");
        }
        return ok_status();
    }
    // Whether a JSON value is of the JSON Schema type `t` (an integer: a number with no fractional part).
    static bool of_type(const Json& v, const std::string& t) {
        if (t == "integer")
            return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                             std::floor(v.get<double>()) == v.get<double>());
        if (t == "number") return v.is_number();
        if (t == "string") return v.is_string();
        if (t == "boolean") return v.is_boolean();
        if (t == "null") return v.is_null();
        if (t == "object") return v.is_object();
        if (t == "array") return v.is_array();
        return false;
    }

    // A JSON number as an exact decimal (a double by its shortest round-trip digits, as it was most likely written).
    static Status number_bound(const Json& v, const std::string& ptr, bool exclusive, SchemaNode::Bound* b) {
        if (!v.is_number()) return fail(ptr, "must be a number");
        std::string text;
        if (v.is_number_integer()) {
            text = v.dump();
        } else {
            const double d = v.get<double>();
            if (!std::isfinite(d)) return fail(ptr, "must be finite");
            char buf[64];
            const auto r = std::to_chars(buf, buf + sizeof buf, d);
            text.assign(buf, r.ptr);
        }
        SchemaNode::Bound out;
        out.set = true;
        out.exclusive = exclusive;
        size_t i = 0;
        if (i < text.size() && text[i] == '-') {
            out.negative = true;
            ++i;
        }
        int frac = 0;
        bool dot = false;
        for (; i < text.size() && (is_digit(static_cast<uint8_t>(text[i])) || text[i] == '.'); ++i) {
            if (text[i] == '.') {
                dot = true;
            } else {
                out.digits.push_back(text[i]);
                frac += dot ? 1 : 0;
            }
        }
        int exp = 0;
        if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) exp = std::atoi(text.c_str() + i + 1);
        out.scale = frac - exp;
        if (out.scale < 0) {
            out.digits.append(static_cast<size_t>(-out.scale), '0');
            out.scale = 0;
        }
        if (out.digits.find_first_not_of('0') == std::string::npos) out.negative = false;  // -0 is 0
        *b = std::move(out);
        return ok_status();
    }

    // Whether no value at all meets a numeric node's bounds, however many digits it had (the digit-capped probe
    // can refuse more): an integer range without an integer, or min above max. Not decided with multipleOf on a number.
    static bool numeric_type_empty(const SchemaNode& n) {
        if (n.kind == SchemaNode::Kind::kInteger) {
            JsonFrame probe{.kind = JsonFrame::kNumber, .phase = kMinus};
            if (bounded_number_live(n, probe, 400)) return false;  // (a double's bound has at most 309 digits)
            probe.aux = 1;
            return !bounded_number_live(n, probe, 400);
        }
        if (n.multiple.set || !n.min.set || !n.max.set) return false;
        const int c = compare_bounds(n.min, n.max);
        return c > 0 || (c == 0 && (n.min.exclusive || n.max.exclusive));
    }

    static int compare_bounds(const SchemaNode::Bound& a, const SchemaNode::Bound& b) {
        if (a.negative != b.negative) return a.negative ? -1 : 1;
        const int c = compare(make_dec(a.digits, a.scale), make_dec(b.digits, b.scale));
        return a.negative ? -c : c;
    }

    // minimum / exclusiveMinimum and maximum / exclusiveMaximum (numbers; draft 4's boolean exclusive* marks
    // minimum / maximum exclusive); the tighter of two bounds on one side.
    static Status number_bounds(const Json& s, const std::string& ptr, SchemaNode* n) {
        for (const bool lower : {true, false}) {
            const char* key = lower ? "minimum" : "maximum";
            const char* ex_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
            SchemaNode::Bound& side = lower ? n->min : n->max;
            if (const auto v = s.find(key); v != s.end())
                RETURN_IF_ERROR(number_bound(*v, ptr + "/" + key, false, &side));
            const auto e = s.find(ex_key);
            if (e == s.end()) continue;
            if (e->is_boolean()) {
                if (e->get<bool>() && !side.set) return fail(ptr + "/" + ex_key, std::string("true needs ") + key);
                side.exclusive = side.exclusive || e->get<bool>();
                continue;
            }
            SchemaNode::Bound ex;
            RETURN_IF_ERROR(number_bound(*e, ptr + "/" + ex_key, true, &ex));
            const int c = side.set ? compare_bounds(ex, side) : (lower ? 1 : -1);
            if (c == 0 || (lower ? c > 0 : c < 0)) side = std::move(ex);  // equal: the exclusive one is tighter
        }
        if (const auto m = s.find("multipleOf"); m != s.end()) {
            RETURN_IF_ERROR(number_bound(*m, ptr + "/multipleOf", false, &n->multiple));
            const Dec step = make_dec(n->multiple.digits, n->multiple.scale);
            if (n->multiple.negative || step.mant == "0") return fail(ptr + "/multipleOf", "must be above 0");
            if (static_cast<int>(step.mant.size()) > kMaxStepDigits || step.scale > kMaxStepDigits)
                return fail(ptr + "/multipleOf",
                            "with more than " + std::to_string(kMaxStepDigits) +
                                " digits (trailing zeros count) or decimal places is not supported");
        }
        return ok_status();
    }

    static Status fail(const std::string& ptr, const std::string& what) {
        return invalid_argument("at " + (ptr.empty() ? std::string("the root") : ptr) + ": " + what);
    }

    // RFC 3339 / JSON Schema formats as anchored patterns (null: not held). A date's day is within its month (30 in
    // April, June, September and November; February 29 only in a leap year: divisible by 4, not by 100 unless by 400).
#define GPTOSS_DATE                                                                                                    \
    "(\\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|\\d{4}-(0[469]|11)-(0[1-9]|[12]\\d|30)|\\d{4}-02-(0[1-9]|1\\d|2[" \
    "0-8])"                                                                                                            \
    "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
#define GPTOSS_TIME "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
    static const char* format_pattern(const std::string& format) {
        static const std::pair<const char*, const char*> table[] = {
            {"date", "^" GPTOSS_DATE "$"},
            {"time", "^" GPTOSS_TIME "$"},
            {"date-time", "^" GPTOSS_DATE "[Tt]" GPTOSS_TIME "$"},
            {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*$"},
            {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
            {"ipv4", "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$"},
            // At most 4 labels of at most 62 characters: a name then stays within RFC 1123's 253 (4 · 62 + 3 = 251); a
            // pattern cannot count the whole name's length, and unbounded labels ran to 900 characters.
            {"hostname",
             "^[A-Za-z0-9]([A-Za-z0-9-]{0,60}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,60}[A-Za-z0-9])?){0,3}$"},
        };
#undef GPTOSS_DATE
#undef GPTOSS_TIME
        for (const auto& [name, p] : table)
            if (format == name) return p;
        return nullptr;
    }

    // JSON Schema's `pattern` (a search, anchored only by a leading ^ / trailing $) as a full-match DFA, and the
    // states from which a match can be reached through bytes a JSON string spells: any from 0x20 up (the quote and
    // the backslash escaped) and those of the short escapes b, f, n, r, t.
    Status string_pattern(const std::string& p, const std::string& ptr, SchemaNode* n) {
        bool top_alt = false, anchors = false, in_class = false;
        int depth = 0;
        for (size_t i = 0; i < p.size(); ++i) {
            const char c = p[i];
            if (c == '\\') {
                ++i;
                continue;
            }
            if (in_class) {
                in_class = c != ']';
                continue;
            }
            if (c == '[') in_class = true;
            if (c == '(') ++depth;
            if (c == ')') --depth;
            if (c == '|' && depth == 0) top_alt = true;
            if (c == '^' || c == '$') anchors = true;
        }
        if (top_alt && anchors) return fail(ptr, "anchors (^, $) in a pattern with a top-level | are not supported");
        size_t backslashes = 0;
        for (size_t i = p.size() - 1; i > 0 && i < p.size() && p[i - 1] == '\\'; --i) ++backslashes;
        const bool starts = !top_alt && !p.empty() && p[0] == '^';
        const bool ends = !top_alt && !p.empty() && p.back() == '$' && backslashes % 2 == 0;
        const std::string full = (starts ? "" : "[\\s\\S]*") + std::string("(?:") + p + ")" + (ends ? "" : "[\\s\\S]*");
        // One compile a distinct pattern (a schema repeats its formats and patterns), and a bound on the DFA states
        // of all of them: each compile is bounded alone, but 960 copies of `a{1000}` in anyOf options took 75 s of
        // a core, which a client's disconnect did not stop.
        if (auto it = patterns_.find(full); it != patterns_.end()) {
            n->pattern = it->second.first;
            n->pattern_live = it->second.second;
            return ok_status();
        }
        StatusOr<std::shared_ptr<const RegexGrammar>> g = RegexGrammar::compile(full);
        if (!g.ok()) {
            // Offsets name the pattern as given, not the wrapped one.
            std::string why = g.status().message();
            return fail(ptr, why);
        }
        const RegexGrammar& r = **g;
        const int D = r.num_states();
        pattern_states_ += static_cast<size_t>(D);
        if (pattern_states_ > kMaxPatternStates) {
            return fail(ptr, "makes the schema's patterns and formats too large (over " +
                                 std::to_string(kMaxPatternStates) + " automaton states in all)");
        }
        std::vector<std::vector<int>> rev(static_cast<size_t>(D));
        for (int s = 0; s < D; ++s)
            for (int b = 0; b < 256; ++b) {
                if (b < 0x20 && b != 8 && b != 9 && b != 10 && b != 12 && b != 13) continue;
                if (const int t = r.next(s, static_cast<uint8_t>(b)); t >= 0) rev[static_cast<size_t>(t)].push_back(s);
            }
        auto live = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(D), 0);
        std::vector<int> stack;
        for (int s = 0; s < D; ++s)
            if (r.accepting(s)) {
                (*live)[static_cast<size_t>(s)] = 1;
                stack.push_back(s);
            }
        while (!stack.empty()) {
            const int t = stack.back();
            stack.pop_back();
            for (int s : rev[static_cast<size_t>(t)])
                if (!(*live)[static_cast<size_t>(s)]) {
                    (*live)[static_cast<size_t>(s)] = 1;
                    stack.push_back(s);
                }
        }
        if (!(*live)[static_cast<size_t>(r.start())])
            return fail(ptr, "matches no string a JSON document can spell without \\u escapes");
        n->pattern = *g;
        n->pattern_live = live;
        patterns_.emplace(full, std::make_pair(*g, std::move(live)));
        return ok_status();
    }

    // Unions are flat: an option that is itself a union contributes its options.
    void add_option(SchemaNode* u, int option) {
        const SchemaNode& o = g_->nodes_[static_cast<size_t>(option)];
        if (o.kind == SchemaNode::Kind::kUnion && !o.ref) {
            const std::vector<int> inner = o.options;
            for (int i : inner) add_option(u, i);
            return;
        }
        if (std::find(u->options.begin(), u->options.end(), option) == u->options.end()) u->options.push_back(option);
    }

    StatusOr<int> ref(const Json& r, const std::string& ptr, int depth) {
        if (!r.is_string()) return fail(ptr, "must be a string");
        const std::string target = r.get<std::string>();
        if (auto it = refs_.find(target); it != refs_.end()) return it->second;
        if (target.empty() || target[0] != '#')
            return fail(ptr, "'" + target + "' is not supported (only references into this schema, '#...')");
        // The fragment is a URI's: percent-encoded bytes are decoded before it is read as a JSON pointer (RFC 6901
        // §6; "#/$defs/a%20b" names "a b").
        std::string pointer;
        for (size_t i = 1; i < target.size(); ++i) {
            if (target[i] != '%') {
                pointer += target[i];
                continue;
            }
            const auto hex = [](char c) {
                return c >= '0' && c <= '9'   ? c - '0'
                       : c >= 'a' && c <= 'f' ? c - 'a' + 10
                       : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                              : -1;
            };
            if (i + 2 >= target.size() || hex(target[i + 1]) < 0 || hex(target[i + 2]) < 0)
                return fail(ptr, "'" + target + "' is not a valid URI fragment (a '%' not followed by two hex digits)");
            pointer += static_cast<char>(hex(target[i + 1]) * 16 + hex(target[i + 2]));
            i += 2;
        }
        const Json* at = nullptr;
        try {
            const Json::json_pointer jp(pointer);
            if (root_.contains(jp)) at = &root_.at(jp);
        } catch (const std::exception&) {
            return fail(ptr, "'" + target + "' is not a valid JSON pointer");
        }
        if (at == nullptr) return fail(ptr, "'" + target + "' names nothing in the schema");
        // A placeholder first, so that a recursive reference resolves to it: a one-option union.
        SchemaNode placeholder;
        placeholder.kind = SchemaNode::Kind::kUnion;
        placeholder.ref = true;
        const int node = g_->add(std::move(placeholder));
        refs_[target] = node;
        StatusOr<int> body = compile(*at, target, depth + 1);
        if (!body.ok()) return body.status();
        if (*body == node) return fail(ptr, "'" + target + "' refers only to itself");
        g_->nodes_[static_cast<size_t>(node)].options = {*body};
        return node;
    }

    // enum / const, with `type` beside it: the values of that type (none: refused). Values equal as JSON (1 and 1.0)
    // are one literal, written as first listed, so that uniqueItems never takes one value twice.
    StatusOr<int> literal(const Json& s, const std::string& ptr) {
        SchemaNode n;
        n.kind = SchemaNode::Kind::kLiteral;
        std::vector<std::string> types;
        if (const auto t = s.find("type"); t != s.end()) {
            if (t->is_string()) {
                types.push_back(t->get<std::string>());
            } else if (t->is_array()) {
                for (const Json& x : *t)
                    if (x.is_string())
                        types.push_back(x.get<std::string>());
                    else
                        return fail(ptr + "/type", "must be a type name or an array of them");
            } else {
                return fail(ptr + "/type", "must be a type name or an array of them");
            }
        }
        const auto typed_ok = [&](const Json& v) {
            return types.empty() ||
                   std::any_of(types.begin(), types.end(), [&](const std::string& t) { return of_type(v, t); });
        };
        std::vector<Json> values;
        if (s.contains("const")) {
            values.push_back(s["const"]);
            if (s.contains("enum")) {
                const Json& e = s["enum"];
                if (!e.is_array() || std::find(e.begin(), e.end(), s["const"]) == e.end())
                    return fail(ptr + "/const", "is not among the enum's values: no value matches both");
            }
        } else {
            const Json& e = s["enum"];
            if (!e.is_array() || e.empty()) return fail(ptr + "/enum", "must be a non-empty array");
            if (e.size() > static_cast<size_t>(kMaxEnumValues))
                return fail(ptr + "/enum", "has more than " + std::to_string(kMaxEnumValues) + " values");
            for (const Json& v : e)
                if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
        }
        for (const Json& v : values)
            if (typed_ok(v)) n.literals.push_back(v.dump());
        if (n.literals.empty())
            return fail(ptr + (s.contains("const") ? "/const" : "/enum"), "has no value of the schema's type");
        return g_->add(std::move(n));
    }

    StatusOr<int> nonneg(const Json& s, const char* key, const std::string& ptr, int fallback, int* out) {
        *out = fallback;
        const auto it = s.find(key);
        if (it == s.end()) return 0;
        if (!it->is_number_integer() || it->get<int64_t>() < 0)
            return fail(ptr + "/" + key, "must be a non-negative integer");
        *out = static_cast<int>(std::min<int64_t>(it->get<int64_t>(), INT32_MAX));
        return 0;
    }

    // `admits_none` (a type among several): a number or integer type that no value within its bounds fits sets it and
    // returns -1 instead of failing.
    StatusOr<int> typed(const Json& s, const std::string& type, const std::string& ptr, int depth,
                        bool* admits_none = nullptr) {
        SchemaNode n;
        if (type == "object") {
            n.kind = SchemaNode::Kind::kObject;
            if (const auto p = s.find("properties"); p != s.end()) {
                if (!p->is_object()) return fail(ptr + "/properties", "must be an object");
                if (p->size() > static_cast<size_t>(kMaxNamedProperties))
                    return fail(ptr + "/properties",
                                "has more than " + std::to_string(kMaxNamedProperties) + " properties");
                for (auto it = p->begin(); it != p->end(); ++it) {
                    const std::string quoted = Json(it.key()).dump();
                    n.names.push_back(quoted.substr(1, quoted.size() - 2));
                    n.props.push_back(-1);  // compiled below (a recursive $ref may reach this node first)
                }
            }
            const auto ap = s.find("additionalProperties");
            if (ap == s.end()) {
                n.additional = s.contains("properties") ? -1 : g_->any_;  // properties {} alone: only {}
            } else if (ap->is_boolean()) {
                n.additional = ap->get<bool>() ? g_->any_ : -1;
            } else {
                StatusOr<int> a = compile(*ap, ptr + "/additionalProperties", depth + 1);
                if (!a.ok()) return a.status();
                n.additional = *a;
            }
            if (const auto r = s.find("required"); r != s.end()) {
                if (!r->is_array()) return fail(ptr + "/required", "must be an array of property names");
                for (size_t i = 0; i < r->size(); ++i) {
                    const Json& name = (*r)[i];
                    const std::string rp = ptr + "/required/" + std::to_string(i);
                    if (!name.is_string()) return fail(rp, "must be a string");
                    const std::string quoted = Json(name.get<std::string>()).dump();
                    const auto at = std::find(n.names.begin(), n.names.end(), quoted.substr(1, quoted.size() - 2));
                    if (at == n.names.end() && n.additional < 0)
                        return fail(rp, "'" + name.get<std::string>() +
                                            "' is not among the properties, and the object takes no others");
                    if (at == n.names.end()) {
                        // Required but not listed: a property of the additional properties' schema (a valid JSON
                        // Schema; it comes after the listed ones).
                        if (n.names.size() >= static_cast<size_t>(kMaxNamedProperties))
                            return fail(rp, "makes more than " + std::to_string(kMaxNamedProperties) + " properties");
                        n.names.push_back(quoted.substr(1, quoted.size() - 2));
                        n.props.push_back(n.additional);
                        n.required |= uint64_t{1} << (n.names.size() - 1);
                        continue;
                    }
                    n.required |= uint64_t{1} << (at - n.names.begin());
                }
            }
            if (const auto p = s.find("properties"); p != s.end()) {
                size_t i = 0;
                for (auto it = p->begin(); it != p->end(); ++it, ++i) {
                    StatusOr<int> v = compile(it.value(), ptr + "/properties/" + it.key(), depth + 1);
                    if (!v.ok()) return v.status();
                    n.props[i] = *v;
                }
            }
        } else if (type == "array") {
            n.kind = SchemaNode::Kind::kArray;
            if (const auto p = s.find("prefixItems"); p != s.end()) {
                if (!p->is_array()) return fail(ptr + "/prefixItems", "must be an array of schemas");
                for (size_t i = 0; i < p->size(); ++i) {
                    StatusOr<int> v = compile((*p)[i], ptr + "/prefixItems/" + std::to_string(i), depth + 1);
                    if (!v.ok()) return v.status();
                    n.prefix_items.push_back(*v);
                }
            }
            const auto items = s.find("items");
            if (items == s.end()) {
                n.items = g_->any_;
            } else if (items->is_boolean()) {
                n.items = items->get<bool>() ? g_->any_ : -1;
            } else if (items->is_array()) {
                return fail(ptr + "/items", "as an array (draft 4 tuples) is not supported: use prefixItems");
            } else {
                StatusOr<int> v = compile(*items, ptr + "/items", depth + 1);
                if (!v.ok()) return v.status();
                n.items = *v;
            }
            if (StatusOr<int> r = nonneg(s, "minItems", ptr, 0, &n.min_items); !r.ok()) return r.status();
            if (StatusOr<int> r = nonneg(s, "maxItems", ptr, INT32_MAX, &n.max_items); !r.ok()) return r.status();
            if (n.min_items > n.max_items) return fail(ptr + "/minItems", "is above maxItems");
            if (n.items < 0 && n.min_items > static_cast<int>(n.prefix_items.size()))
                return fail(ptr + "/minItems", "asks for more items than the schema allows");
            if (const auto u = s.find("uniqueItems"); u != s.end() && u->is_boolean() && u->get<bool>()) {
                // Held where every item is one of a literal node's values: the array remembers which it used.
                int lit = n.items;
                while (lit >= 0 && g_->nodes_[static_cast<size_t>(lit)].kind == SchemaNode::Kind::kUnion &&
                       g_->nodes_[static_cast<size_t>(lit)].options.size() == 1)
                    lit = g_->nodes_[static_cast<size_t>(lit)].options[0];
                if (!n.prefix_items.empty() || lit < 0 ||
                    g_->nodes_[static_cast<size_t>(lit)].kind != SchemaNode::Kind::kLiteral)
                    return fail(ptr + "/uniqueItems",
                                "is supported where the items are an enum, a const or booleans (no prefixItems)");
                n.unique_items = true;
                n.unique_literals = static_cast<int>(g_->nodes_[static_cast<size_t>(lit)].literals.size());
                if (n.min_items > n.unique_literals)
                    return fail(ptr + "/minItems", "asks for more unique items than the items have values");
            }
        } else if (type == "string") {
            n.kind = SchemaNode::Kind::kString;
            if (StatusOr<int> r = nonneg(s, "minLength", ptr, 0, &n.min_length); !r.ok()) return r.status();
            if (StatusOr<int> r = nonneg(s, "maxLength", ptr, INT32_MAX, &n.max_length); !r.ok()) return r.status();
            if (n.min_length > n.max_length) return fail(ptr + "/minLength", "is above maxLength");
            if (const auto p = s.find("pattern"); p != s.end()) {
                if (s.contains("minLength") || s.contains("maxLength"))
                    return fail(ptr + "/pattern", "together with minLength / maxLength is not supported");
                if (!p->is_string()) return fail(ptr + "/pattern", "must be a string");
                RETURN_IF_ERROR(string_pattern(p->get<std::string>(), ptr + "/pattern", &n));
            } else if (const auto f = s.find("format");
                       f != s.end() && f->is_string() && !s.contains("minLength") && !s.contains("maxLength")) {
                // The formats OpenAI's strict mode holds (ipv6 and duration aside) as patterns; others stay
                // annotations, as does a format beside minLength / maxLength.
                if (const char* p = format_pattern(f->get<std::string>()))
                    RETURN_IF_ERROR(string_pattern(p, ptr + "/format", &n));
            }
        } else if (type == "number" || type == "integer") {
            n.kind = type == "number" ? SchemaNode::Kind::kNumber : SchemaNode::Kind::kInteger;
            RETURN_IF_ERROR(number_bounds(s, ptr, &n));
            if (n.bounded()) {
                JsonFrame probe{.kind = JsonFrame::kNumber, .phase = kMinus};  // no digit yet, either sign
                bool any = bounded_number_live(n, probe);
                probe.aux = 1;
                any = any || bounded_number_live(n, probe);
                if (!any && admits_none != nullptr && numeric_type_empty(n)) {
                    *admits_none = true;
                    return -1;
                }
                if (!any)
                    return fail(ptr, "admits no " + type + " of at most " + std::to_string(kMaxBoundedDigits) +
                                         " digits within its minimum / maximum / multipleOf");
            }
        } else if (type == "boolean") {
            return g_->bool_;
        } else if (type == "null") {
            return g_->null_;
        } else {
            return fail(ptr + "/type", "'" + type + "' is not a JSON Schema type");
        }
        return g_->add(std::move(n));
    }

    const Json& root_;
    JsonGrammar* g_;
    static constexpr size_t kMaxPatternStates = 60000;  // DFA states of all of a schema's distinct patterns
    std::map<std::string, std::pair<std::shared_ptr<const RegexGrammar>, std::shared_ptr<std::vector<uint8_t>>>>
        patterns_;
    size_t pattern_states_ = 0;
    std::map<std::string, int> refs_;
};

StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::compile(const Json& schema) {
    auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar());
    SchemaCompiler c(schema, g.get());
    StatusOr<int> root = c.compile(schema, "", 0);
    if (!root.ok()) return root.status();
    g->root_ = *root;
    // Unions reach their options without reading a byte: a cycle among them (a $ref chain back to
    // itself) would never end. 0 unseen, 1 on the path, 2 done.
    std::vector<uint8_t> mark(g->nodes_.size(), 0);
    std::function<bool(int)> cyclic = [&](int i) {
        if (mark[static_cast<size_t>(i)] == 1) return true;
        if (mark[static_cast<size_t>(i)] == 2 || g->nodes_[static_cast<size_t>(i)].kind != SchemaNode::Kind::kUnion)
            return false;
        mark[static_cast<size_t>(i)] = 1;
        for (int o : g->nodes_[static_cast<size_t>(i)].options)
            if (cyclic(o)) return true;
        mark[static_cast<size_t>(i)] = 2;
        return false;
    };
    for (size_t i = 0; i < g->nodes_.size(); ++i)
        if (cyclic(static_cast<int>(i)))
            return invalid_argument("a $ref cycle that produces nothing (a reference back to itself)");
    // Which nodes admit a finite document (a least fixed point): the root must; anyOf options that do
    // not are dropped, so that generation cannot walk into one and meet the depth bound.
    std::vector<uint8_t> finite(g->nodes_.size(), 0);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < g->nodes_.size(); ++i) {
            if (finite[i]) continue;
            const SchemaNode& n = g->nodes_[i];
            auto ok = [&](int node) { return node >= 0 && finite[static_cast<size_t>(node)]; };
            bool f = true;
            switch (n.kind) {
                case SchemaNode::Kind::kUnion: f = std::any_of(n.options.begin(), n.options.end(), ok); break;
                case SchemaNode::Kind::kObject:
                    for (size_t j = 0; j < n.names.size() && f; ++j)
                        if ((n.required >> j) & 1) f = ok(n.props[j]);
                    break;
                case SchemaNode::Kind::kArray:
                    for (int k = 0; k < n.min_items && f; ++k) f = ok(item_node(n, k));
                    break;
                default: break;
            }
            if (f) {
                finite[i] = 1;
                changed = true;
            }
        }
    }
    if (!finite[static_cast<size_t>(g->root_)])
        return invalid_argument("admits no finite document (a required property or item refers back to itself)");
    for (size_t i = 0; i < g->nodes_.size(); ++i) {
        std::vector<int>& opts = g->nodes_[i].options;
        if (g->nodes_[i].kind == SchemaNode::Kind::kUnion && finite[i])
            std::erase_if(opts, [&](int o) { return !finite[static_cast<size_t>(o)]; });
    }
    return std::shared_ptr<const JsonGrammar>(std::move(g));
}

// ---------------------------------------------------------------------------------------------------
// Matcher

JsonMatcher::JsonMatcher(const JsonGrammar& grammar) : g_(&grammar) {
    JsonThread t;
    t.stack.push_back(JsonFrame{.node = grammar.root(), .kind = JsonFrame::kValue});
    threads_.push_back(std::move(t));
}

bool JsonMatcher::push_value(JsonThread& t, int node) const {
    if (node < 0 || static_cast<int>(t.stack.size()) >= kMaxDepth) return false;
    t.stack.push_back(JsonFrame{.node = node, .kind = JsonFrame::kValue});
    return true;
}

void JsonMatcher::finish_value(JsonThread& t) const {
    // An item of an array with uniqueItems: the array remembers the value (the one literal complete here).
    if (const JsonFrame& f = t.stack.back(); f.kind == JsonFrame::kLiteral && t.stack.size() >= 2) {
        JsonFrame& parent = t.stack[t.stack.size() - 2];
        if (parent.kind == JsonFrame::kArray && g_->node(parent.node).unique_items) {
            const SchemaNode& n = g_->node(f.node);
            for (uint64_t m = f.cand; m != 0; m &= m - 1)
                if (const int j = std::countr_zero(m);
                    static_cast<int>(n.literals[static_cast<size_t>(j)].size()) == f.count) {
                    parent.cand |= uint64_t{1} << j;
                    break;
                }
        }
    }
    t.stack.pop_back();
    t.ws_run = 0;
}

// The top is a value frame of a concrete (non-union) node and c is not whitespace.
bool JsonMatcher::start_value(JsonThread& t, uint8_t c, std::vector<JsonThread>* out) const {
    JsonFrame& f = t.stack.back();
    const SchemaNode* n = &g_->node(f.node);
    if (n->kind == SchemaNode::Kind::kAny) {
        int node;
        if (c == '{')
            node = g_->any_object_node();
        else if (c == '[')
            node = g_->any_array_node();
        else if (c == '"')
            node = g_->any_string_node();
        else if (c == '-' || is_digit(c))
            node = g_->any_number_node();
        else if (c == 't' || c == 'f')
            node = g_->bool_node();
        else if (c == 'n')
            node = g_->null_node();
        else
            return false;
        f.node = node;
        n = &g_->node(node);
    }
    t.ws_run = 0;
    switch (n->kind) {
        case SchemaNode::Kind::kObject:
            if (c != '{' || static_cast<int>(t.stack.size()) >= kMaxDepth) return false;  // room for a child
            f = JsonFrame{.node = f.node, .kind = JsonFrame::kObject, .phase = kObjOpen};
            break;
        case SchemaNode::Kind::kArray:
            if (c != '[' || static_cast<int>(t.stack.size()) >= kMaxDepth) return false;
            f = JsonFrame{.node = f.node, .kind = JsonFrame::kArray, .phase = kArrOpen};
            break;
        case SchemaNode::Kind::kString:
            if (c != '"') return false;
            f = JsonFrame{.node = f.node, .kind = JsonFrame::kString, .aux = n->pattern ? n->pattern->start() : 0};
            break;
        case SchemaNode::Kind::kNumber:
        case SchemaNode::Kind::kInteger:
            if (c == '-')
                f = JsonFrame{.node = f.node, .kind = JsonFrame::kNumber, .phase = kMinus, .count = 1};
            else if (c == '0')
                f = JsonFrame{.node = f.node, .kind = JsonFrame::kNumber, .phase = kZero, .count = 1};
            else if (is_digit(c))
                f = JsonFrame{.node = f.node, .kind = JsonFrame::kNumber, .phase = kInt, .count = 1};
            else
                return false;
            if (n->bounded() && !bounded_number_read(*n, f, c)) return false;
            break;
        case SchemaNode::Kind::kLiteral: {
            uint64_t cand = 0, used = 0;  // used: the values an array with uniqueItems already has
            if (t.stack.size() >= 2) {
                const JsonFrame& parent = t.stack[t.stack.size() - 2];
                if (parent.kind == JsonFrame::kArray && g_->node(parent.node).unique_items) used = parent.cand;
            }
            bool all_done = true;
            for (size_t i = 0; i < n->literals.size(); ++i)
                if (static_cast<uint8_t>(n->literals[i][0]) == c && !(used >> i & 1)) {
                    cand |= uint64_t{1} << i;
                    all_done = all_done && n->literals[i].size() == 1;
                }
            if (cand == 0) return false;
            f = JsonFrame{.node = f.node, .kind = JsonFrame::kLiteral, .count = 1, .cand = cand};
            if (all_done) finish_value(t);
            break;
        }
        case SchemaNode::Kind::kAny:
        case SchemaNode::Kind::kUnion: return false;  // not reached: any and unions are resolved before
    }
    out->push_back(std::move(t));
    return true;
}

bool JsonMatcher::step_thread(JsonThread t, uint8_t c, std::vector<JsonThread>* out) const {
    for (;;) {
        auto whitespace = [&]() {
            if (++t.ws_run > g_->max_whitespace_run()) return false;
            out->push_back(std::move(t));
            return true;
        };
        if (t.stack.empty()) return is_ws(c) && whitespace();
        JsonFrame& f = t.stack.back();
        const SchemaNode& n = g_->node(f.node);
        switch (f.kind) {
            case JsonFrame::kValue: {
                if (is_ws(c)) return whitespace();
                if (n.kind == SchemaNode::Kind::kUnion) {
                    bool any = false;
                    for (int o : n.options) {
                        JsonThread u = t;
                        u.stack.back().node = o;
                        if (g_->node(o).kind == SchemaNode::Kind::kUnion) {
                            any = step_thread(std::move(u), c, out) || any;  // a $ref placeholder
                        } else {
                            any = start_value(u, c, out) || any;
                        }
                    }
                    return any;
                }
                return start_value(t, c, out);
            }
            case JsonFrame::kObject: {
                switch (f.phase) {
                    case kObjOpen:
                    case kObjComma:
                        if (is_ws(c)) return whitespace();
                        if (c == '"') {
                            const uint64_t allowed = allowed_names(n, f.count);
                            if (allowed == 0 && !extra_ok(n, f.count)) return false;
                            f.phase = kObjKey;
                            f.esc = 0;
                            f.pending = 0;
                            f.aux = 0;
                            f.cand = low_bits(static_cast<int>(n.names.size()));
                            t.ws_run = 0;
                            out->push_back(std::move(t));
                            return true;
                        }
                        if (c == '}' && f.phase == kObjOpen && required_done(n, f.count)) {
                            finish_value(t);
                            out->push_back(std::move(t));
                            return true;
                        }
                        return false;
                    case kObjKey: {
                        const StrByte b = string_byte(f, c);
                        if (b == StrByte::kFail) return false;
                        const uint64_t allowed = allowed_names(n, f.count);
                        if (b == StrByte::kClose) {
                            int exact = -1;
                            for (uint64_t m = f.cand; m != 0; m &= m - 1) {
                                const int j = std::countr_zero(m);
                                if (static_cast<int>(n.names[static_cast<size_t>(j)].size()) == f.aux) exact = j;
                            }
                            if (exact >= 0) {
                                if (!((allowed >> exact) & 1)) return false;  // a repeat, or out of order
                                f.count = exact + 1;
                                f.aux = n.props[static_cast<size_t>(exact)];
                            } else {
                                if (!extra_ok(n, f.count)) return false;
                                f.count = static_cast<int32_t>(n.names.size());
                                f.aux = n.additional;
                            }
                            f.cand = 0;
                            f.phase = kObjColon;
                            out->push_back(std::move(t));
                            return true;
                        }
                        uint64_t cand = 0;
                        for (uint64_t m = f.cand; m != 0; m &= m - 1) {
                            const int j = std::countr_zero(m);
                            const std::string& name = n.names[static_cast<size_t>(j)];
                            if (static_cast<int>(name.size()) > f.aux && static_cast<uint8_t>(name[f.aux]) == c)
                                cand |= uint64_t{1} << j;
                        }
                        f.cand = cand;
                        ++f.aux;
                        if ((cand & allowed) == 0 && !extra_ok(n, f.count)) return false;
                        // Keys are canonical: a \u escape could spell a named key another way.
                        if (c == 'u' && f.esc == 5 && cand == 0 && !n.names.empty()) return false;
                        out->push_back(std::move(t));
                        return true;
                    }
                    case kObjColon:
                        if (is_ws(c)) return whitespace();
                        if (c != ':') return false;
                        f.phase = kObjAfterValue;
                        t.ws_run = 0;
                        if (!push_value(t, f.aux)) return false;
                        out->push_back(std::move(t));
                        return true;
                    case kObjAfterValue:
                        if (is_ws(c)) return whitespace();
                        if (c == ',') {
                            if (allowed_names(n, f.count) == 0 && !extra_ok(n, f.count)) return false;
                            f.phase = kObjComma;
                            t.ws_run = 0;
                            out->push_back(std::move(t));
                            return true;
                        }
                        if (c == '}' && required_done(n, f.count)) {
                            finish_value(t);
                            out->push_back(std::move(t));
                            return true;
                        }
                        return false;
                    default: return false;
                }
            }
            case JsonFrame::kArray: {
                if (is_ws(c)) return whitespace();
                if (c == ']' && f.phase != kArrComma) {
                    if (f.count < n.min_items) return false;
                    finish_value(t);
                    out->push_back(std::move(t));
                    return true;
                }
                if (f.phase == kArrAfterValue) {
                    if (c != ',' || f.count >= n.max_items || item_node(n, f.count) < 0) return false;
                    if (n.unique_items && std::popcount(f.cand) >= n.unique_literals) return false;  // none left
                    f.phase = kArrComma;
                    t.ws_run = 0;
                    out->push_back(std::move(t));
                    return true;
                }
                // An item begins with c.
                if (f.count >= n.max_items) return false;
                const int item = item_node(n, f.count);
                f.phase = kArrAfterValue;
                ++f.count;
                if (!push_value(t, item)) return false;
                continue;  // c starts the item
            }
            case JsonFrame::kString: {
                const uint8_t esc_before = f.esc;
                const StrByte b = string_byte(f, c);
                if (b == StrByte::kFail) return false;
                if (n.pattern) {  // the value's bytes through the pattern's DFA (kept in aux)
                    int s = f.aux;
                    if (esc_before == 1) {
                        if (c == 'u') return false;  // \u escapes are not followed under a pattern
                        s = pattern_step(n, s, unescaped(c));
                    } else if (b == StrByte::kClose) {
                        if (!n.pattern->accepting(s)) return false;
                    } else if (f.esc != 1) {
                        s = pattern_step(n, s, c);
                    } else {  // the backslash: some short escape must lead on
                        bool any = false;
                        for (uint8_t e : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'})
                            any = any || pattern_step(n, s, unescaped(e)) >= 0;
                        if (!any) return false;
                    }
                    if (s < 0) return false;
                    f.aux = s;
                }
                if (b == StrByte::kClose) {
                    if (f.count < n.min_length) return false;
                    finish_value(t);
                } else if (b == StrByte::kStart) {
                    if (f.count >= n.max_length) return false;
                    ++f.count;
                }
                out->push_back(std::move(t));
                return true;
            }
            case JsonFrame::kNumber: {
                const bool integer = n.kind == SchemaNode::Kind::kInteger;
                uint8_t next = 0;
                switch (f.phase) {
                    case kMinus: next = c == '0' ? kZero : is_digit(c) ? kInt : 0; break;
                    case kZero:
                    case kInt:
                        if (f.phase == kInt && is_digit(c))
                            next = kInt;
                        else if (c == '.' && !integer)
                            next = kDot;
                        else if ((c == 'e' || c == 'E') && !integer)
                            next = kE;
                        break;
                    case kDot:
                    case kFrac:
                        if (is_digit(c))
                            next = kFrac;
                        else if (f.phase == kFrac && (c == 'e' || c == 'E'))
                            next = kE;
                        break;
                    case kE: next = (c == '+' || c == '-') ? kESign : is_digit(c) ? kExp : 0; break;
                    case kESign:
                    case kExp: next = is_digit(c) ? kExp : 0; break;
                    default: break;
                }
                if (next != 0) {
                    // A phase that needs another digit to end is entered only with room for it.
                    if (++f.count + (number_terminal(next) ? 0 : 1) > kMaxNumberBytes) return false;
                    if (next == kExp && ++f.aux > kMaxExponentDigits) return false;
                    f.phase = next;
                    if (n.bounded() && !bounded_number_read(n, f, c)) return false;
                    out->push_back(std::move(t));
                    return true;
                }
                if (!number_may_end(n, f)) return false;
                finish_value(t);
                continue;  // c belongs to what follows the number
            }
            case JsonFrame::kLiteral: {
                uint64_t cand = 0;
                bool complete = false, all_done = true;
                for (uint64_t m = f.cand; m != 0; m &= m - 1) {
                    const int j = std::countr_zero(m);
                    const std::string& lit = n.literals[static_cast<size_t>(j)];
                    if (static_cast<int>(lit.size()) == f.count) complete = true;
                    if (static_cast<int>(lit.size()) > f.count && static_cast<uint8_t>(lit[f.count]) == c) {
                        cand |= uint64_t{1} << j;
                        all_done = all_done && static_cast<int>(lit.size()) == f.count + 1;
                    }
                }
                if (cand != 0) {
                    f.cand = cand;
                    ++f.count;
                    if (all_done) finish_value(t);
                    out->push_back(std::move(t));
                    return true;
                }
                if (!complete) return false;
                finish_value(t);
                continue;  // c follows the literal (a number among the literals)
            }
        }
        return false;
    }
}

bool JsonMatcher::feed_byte(uint8_t c) {
    scratch_.clear();
    for (const JsonThread& t : threads_) step_thread(t, c, &scratch_);
    if (scratch_.empty()) return false;
    // Alternatives that reached the same position are one.
    size_t kept = 0;
    for (size_t i = 0; i < scratch_.size(); ++i) {
        bool dup = false;
        for (size_t j = 0; j < kept && !dup; ++j) dup = scratch_[j] == scratch_[i];
        if (dup || kept >= static_cast<size_t>(kMaxThreads)) continue;
        if (kept != i) scratch_[kept] = std::move(scratch_[i]);
        ++kept;
    }
    scratch_.resize(kept);
    threads_.swap(scratch_);
    return true;
}

bool JsonMatcher::feed(std::string_view bytes) {
    const std::vector<JsonThread> saved = threads_;
    for (char ch : bytes)
        if (!feed_byte(static_cast<uint8_t>(ch))) {
            threads_ = saved;
            return false;
        }
    return true;
}

bool JsonMatcher::accepting() const {
    for (const JsonThread& t : threads_) {
        if (t.stack.empty()) return true;
        if (t.stack.size() != 1) continue;
        const JsonFrame& f = t.stack.back();
        if (f.kind == JsonFrame::kNumber && number_may_end(g_->node(f.node), f)) return true;
        if (f.kind == JsonFrame::kLiteral) {
            const SchemaNode& n = g_->node(f.node);
            for (uint64_t m = f.cand; m != 0; m &= m - 1)
                if (static_cast<int>(n.literals[static_cast<size_t>(std::countr_zero(m))].size()) == f.count)
                    return true;
        }
    }
    return false;
}

int JsonMatcher::plain_strings(PlainString* out) const {
    int n_out = 0;
    for (const JsonThread& t : threads_) {
        if (t.stack.empty()) continue;
        const JsonFrame& f = t.stack.back();
        if (f.esc != 0) continue;
        const SchemaNode& n = g_->node(f.node);
        int room;
        const uint64_t* loop = nullptr;
        if (f.kind == JsonFrame::kString) {
            if (n.pattern) {  // its text must also follow the pattern: whole subtrees only where its DFA loops
                loop = f.pending == 0 ? n.pattern->loop_bytes(f.aux) : nullptr;
                if (loop == nullptr) continue;
            }
            room = n.max_length == INT32_MAX ? INT32_MAX : n.max_length - f.count;
        } else if (f.kind == JsonFrame::kObject && f.phase == kObjKey && extra_ok(n, f.count)) {
            room = INT32_MAX;  // the key may be any other name: plain text never fails it
        } else {
            continue;
        }
        out[n_out++] = PlainString{room, f.pending, loop};
    }
    return n_out;
}

// ---------------------------------------------------------------------------------------------------
// Token trie

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes) : vocab_size_(static_cast<int>(token_bytes.size())) {
    for (size_t id = 0; id < token_bytes.size(); ++id)
        if (!token_bytes[id].empty()) order_.push_back(static_cast<int32_t>(id));
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
        return token_bytes[static_cast<size_t>(a)] != token_bytes[static_cast<size_t>(b)]
                   ? token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)]
                   : a < b;
    });
    auto bytes_of = [&](uint32_t k) -> const std::string& { return token_bytes[static_cast<size_t>(order_[k])]; };
    nodes_.push_back(Node{.lo = 0, .hi = static_cast<uint32_t>(order_.size())});
    // Children of node i (depth d) over its range: entries longer than d, grouped by their byte d.
    struct Todo {
        uint32_t node;
        uint32_t depth;
    };
    std::vector<Todo> todo{{0, 0}};
    while (!todo.empty()) {
        const Todo cur = todo.back();
        todo.pop_back();
        Node& nd = nodes_[cur.node];
        uint32_t k = nd.lo;
        while (k < nd.hi && bytes_of(k).size() == cur.depth) ++k;
        nodes_[cur.node].own = k - nodes_[cur.node].lo;
        const uint32_t hi = nodes_[cur.node].hi;
        const uint32_t first = static_cast<uint32_t>(nodes_.size());
        while (k < hi) {
            const uint8_t b = static_cast<uint8_t>(bytes_of(k)[cur.depth]);
            uint32_t e = k;
            while (e < hi && static_cast<uint8_t>(bytes_of(e)[cur.depth]) == b) ++e;
            nodes_.push_back(Node{.lo = k, .hi = e, .byte = b});
            k = e;
        }
        nodes_[cur.node].first_child = first;
        nodes_[cur.node].num_children = static_cast<uint32_t>(nodes_.size()) - first;
        for (uint32_t c = first; c < nodes_.size(); ++c) todo.push_back({c, cur.depth + 1});
        max_len_ = std::max(max_len_, static_cast<int>(cur.depth));
    }
    // Bottom-up (children come after their parent): the longest token below, and which continuation
    // states leave every path below plain string text.
    below_.assign(nodes_.size(), {});
    for (size_t i = nodes_.size(); i-- > 1;) {
        Node& nd = nodes_[i];
        below_[i][nd.byte >> 6] |= uint64_t{1} << (nd.byte & 63);
        for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c)
            for (int w = 0; w < 4; ++w) below_[i][static_cast<size_t>(w)] |= below_[c][static_cast<size_t>(w)];
        uint16_t rest = 0;
        uint8_t safe = 0;
        for (int p = 0; p < 8; ++p) {
            const int next = plain_next(nd.byte, p);
            bool ok = next >= 0;
            for (uint32_t c = nd.first_child; ok && c < nd.first_child + nd.num_children; ++c)
                ok = (nodes_[c].safe >> next) & 1;
            if (ok) safe |= static_cast<uint8_t>(1u << p);
        }
        for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c)
            rest = std::max(rest, nodes_[c].max_rest);
        nd.max_rest = static_cast<uint16_t>(std::min(rest + 1, 65535));
        nd.safe = safe;
    }
}

void TokenTrie::take(uint32_t lo, uint32_t hi, uint8_t* mask, int64_t* count) const {
    for (uint32_t k = lo; k < hi; ++k) mask[order_[k]] = 1;
    *count += hi - lo;
}

bool TokenTrie::plain_subtree(const JsonMatcher::PlainString* plain, int num_plain, uint32_t c) const {
    const Node& ch = nodes_[c];
    // One alternative inside a plain string that takes the whole subtree is enough (the mask is the union over
    // the alternatives).
    for (int k = 0; k < num_plain; ++k) {
        const uint64_t* l = plain[k].loop;
        if (((ch.safe >> plain[k].pending) & 1) && ch.max_rest <= plain[k].room &&
            (l == nullptr || ((below_[c][0] & ~l[0]) == 0 && (below_[c][1] & ~l[1]) == 0 &&
                              (below_[c][2] & ~l[2]) == 0 && (below_[c][3] & ~l[3]) == 0)))
            return true;
    }
    return false;
}

void TokenTrie::walk(uint32_t node, int depth, std::vector<JsonMatcher>& levels, uint8_t* mask, int64_t* count) const {
    const Node& nd = nodes_[node];
    const JsonMatcher& cur = levels[static_cast<size_t>(depth)];
    JsonMatcher::PlainString plain[kMaxThreads];
    const int num_plain = cur.plain_strings(plain);
    for (uint32_t c = nd.first_child; c < nd.first_child + nd.num_children; ++c) {
        const Node& ch = nodes_[c];
        if (plain_subtree(plain, num_plain, c)) {
            take(ch.lo, ch.hi, mask, count);
            continue;
        }
        JsonMatcher& next = levels[static_cast<size_t>(depth) + 1];
        next.threads_ = cur.threads_;
        if (!next.feed_byte(ch.byte)) continue;
        take(ch.lo, ch.lo + ch.own, mask, count);
        if (ch.num_children > 0) walk(c, depth + 1, levels, mask, count);
    }
}

int64_t TokenTrie::fill_mask(const JsonMatcher& m, std::vector<uint8_t>* mask, std::vector<JsonMatcher>* levels) const {
    if (mask->size() < static_cast<size_t>(vocab_size_)) mask->resize(static_cast<size_t>(vocab_size_));
    std::fill(mask->begin(), mask->end(), 0);
    if (levels->size() < static_cast<size_t>(max_len_) + 2 || &(*levels)[0].grammar() != &m.grammar())
        levels->assign(static_cast<size_t>(max_len_) + 2, m);
    (*levels)[0].threads_ = m.threads_;
    int64_t count = 0;
    walk(0, 0, *levels, mask->data(), &count);
    return count;
}

}  // namespace gptoss::structured
