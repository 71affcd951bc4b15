// Chat templates: values as Python and jinja2 treat them (truth, printing, tojson, comparison, iteration, slices).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/jinja_ast.h"
#include "kernels/base.h"

namespace tinygpt::data::jinja {

using Kind = Value::Kind;
using nlohmann::ordered_json;

namespace {

[[noreturn]] void fail(int line, const std::string& what) { throw Error(fmt::format("line {}: {}", line, what)); }

}  // namespace

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Function:
      return "function";
  }
  return "?";
}

Value undefined(std::string name) {
  Value v;
  v.s = std::move(name);  // what was looked up, for the message if it is used
  return v;
}

Value from_json(const ordered_json& j) {
  switch (j.type()) {
    case ordered_json::value_t::null:
      return Value::none();
    case ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value::real(double(u)) : Value::integer(int64_t(u));
    }
    case ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::new_list(std::move(items));
    }
    case ordered_json::value_t::object: {
      Value d = Value::new_dict();
      for (const auto& [k, x] : j.items()) d.dict->set(k, from_json(x));
      return d;
    }
    default:
      return Value::none();
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.b;
    case Kind::Int:
      return v.i != 0;
    case Kind::Float:
      return v.f != 0;
    case Kind::String:
      return !v.s.empty();
    case Kind::List:
      return !v.list->items.empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    case Kind::Function:
      return true;
  }
  return false;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

/// Python's repr of a string: single quotes unless it holds one and no double quote.
std::string string_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += '\\', out += char(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  return out + q;
}

std::string repr(const Value& v);

/// Python's str().
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.b ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.i);
    case Kind::Float:
      return float_repr(v.f);
    case Kind::String:
      return v.s;
    case Kind::List: {
      std::string s = "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) s += (k ? ", " : "") + repr(v.list->items[k]);
      return s + "]";
    }
    case Kind::Dict: {
      if (v.dict->is_namespace) return "<Namespace>";
      std::string s = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items)
        s += (first ? "" : ", ") + string_repr(k) + ": " + repr(x), first = false;
      return s + "}";
    }
    case Kind::Function:
      return "<function " + v.s + ">";
  }
  return "";
}

std::string repr(const Value& v) { return v.kind == Kind::String ? string_repr(v.s) : to_str(v); }

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += char(c);
    }
  }
  out += '"';
}

void to_json(const Value& v, const JsonStyle& st, int64_t level, std::string& out, int line) {
  const auto newline = [&](int64_t l) {
    if (st.indent >= 0) out += '\n' + std::string(size_t(st.indent * l), ' ');
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Kind::String:
      json_string(v.s, out);
      return;
    case Kind::List: {
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        to_json(v.list->items[k], st, level + 1, out, line);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        json_string(items[k]->first, out);
        out += st.key_sep;
        to_json(items[k]->second, st, level + 1, out, line);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      fail(line, fmt::format("tojson: a value of type {} is not JSON serializable", type_name(v)));
  }
}

/// The UTF-8 characters of a string, as Python indexes them.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

/// Python's str.isspace() for one UTF-8 character.
bool py_space(const std::string& ch) {
  static const char* const spaces[] = {" ",
                                       "\t",
                                       "\n",
                                       "\r",
                                       "\v",
                                       "\f",
                                       "\x1c",
                                       "\x1d",
                                       "\x1e",
                                       "\x1f",
                                       "\xc2\x85",
                                       "\xc2\xa0",
                                       "\xe1\x9a\x80",
                                       "\xe2\x80\x80",
                                       "\xe2\x80\x81",
                                       "\xe2\x80\x82",
                                       "\xe2\x80\x83",
                                       "\xe2\x80\x84",
                                       "\xe2\x80\x85",
                                       "\xe2\x80\x86",
                                       "\xe2\x80\x87",
                                       "\xe2\x80\x88",
                                       "\xe2\x80\x89",
                                       "\xe2\x80\x8a",
                                       "\xe2\x80\xa8",
                                       "\xe2\x80\xa9",
                                       "\xe2\x80\xaf",
                                       "\xe2\x81\x9f",
                                       "\xe3\x80\x80"};
  for (const char* s : spaces) {
    if (ch == s) return true;
  }
  return false;
}

/// str.strip / lstrip / rstrip: Python's whitespace, or the characters of `chars`.
std::string strip(const std::string& s, bool left, bool right, const Value* chars) {
  const std::vector<std::string> cs = characters(s);
  std::vector<std::string> set;
  if (chars != nullptr && chars->kind == Kind::String) set = characters(chars->s);
  const auto strippable = [&](const std::string& ch) {
    return chars != nullptr && chars->kind == Kind::String ? std::find(set.begin(), set.end(), ch) != set.end()
                                                           : py_space(ch);
  };
  size_t b = 0, e = cs.size();
  while (left && b < e && strippable(cs[b])) ++b;
  while (right && e > b && strippable(cs[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cs[k];
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = char(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double number(const Value& v, int line, const char* op) {
  if (v.kind == Kind::Int) return double(v.i);
  if (v.kind == Kind::Bool) return v.b ? 1 : 0;
  if (v.kind == Kind::Float) return v.f;
  if (v.kind == Kind::Undefined) fail(line, fmt::format("'{}' is undefined", v.s));
  fail(line, fmt::format("'{}' needs numbers, got {}", op, type_name(v)));
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float)
      return (a.kind == Kind::Bool ? a.b : a.i) == (b.kind == Kind::Bool ? b.b : b.i);
    return number(a, 0, "==") == number(b, 0, "==");
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
    case Kind::Function:
      return a.s == b.s;
    case Kind::List:
      if (a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k) {
        if (!equal(a.list->items[k], b.list->items[k])) return false;
      }
      return true;
    case Kind::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (y == nullptr || !equal(x, *y)) return false;
      }
      return true;
    default:
      return false;
  }
}

int64_t length(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return int64_t(characters(v.s).size());
    case Kind::List:
      return int64_t(v.list->items.size());
    case Kind::Dict:
      return int64_t(v.dict->items.size());
    default:
      fail(line, fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

/// What `for` walks: a list's items, a dict's keys, a string's characters, nothing for undefined.
std::vector<Value> iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return v.list->items;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> out;
      for (auto& ch : characters(v.s)) out.push_back(Value::string(ch));
      return out;
    }
    default:
      fail(line, fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

bool contains(const Value& container, const Value& x, int line) {
  switch (container.kind) {
    case Kind::String:
      if (x.kind != Kind::String) fail(line, fmt::format("'in <string>' requires a string, not {}", type_name(x)));
      return container.s.find(x.s) != std::string::npos;
    case Kind::List:
      return std::any_of(container.list->items.begin(), container.list->items.end(),
                         [&](const Value& y) { return equal(x, y); });
    case Kind::Dict:
      return x.kind == Kind::String && container.dict->find(x.s) != nullptr;
    case Kind::Undefined:
      fail(line, fmt::format("'{}' is undefined", container.s));
    default:
      fail(line, fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

/// Python's slice indices over n items.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step, int line) {
  const int64_t st = step.kind == Kind::None ? 1 : int64_t(number(step, line, "slice"));
  if (st == 0) fail(line, "slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t dflt) {
    if (v.kind == Kind::None) return dflt;
    int64_t x = int64_t(number(v, line, "slice"));
    if (x < 0) x += n;
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : n - 1), e = bound(stop, st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) out.push_back(k);
  return out;
}

}  // namespace tinygpt::data::jinja
