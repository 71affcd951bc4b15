// The chat-template reader's insides (data/jinja.h is its interface): values, the parsed expressions and statements.
// jinja.cpp lexes and parses a template into Nodes; jinja_eval.cpp renders them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tinygpt::data::jinja {

struct ListValue;
struct DictValue;

/// A template value, as Python holds it: Undefined is jinja2's default undefined (prints as nothing, is false,
/// iterates as empty; using its attributes is an error).
struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function } kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                    // a string, or a function's name
  std::shared_ptr<ListValue> list;  // shared as Python shares: a namespace set in a loop is seen after it
  std::shared_ptr<DictValue> dict;

  static Value none() { return with(Kind::None); }
  static Value boolean(bool v) {
    Value x = with(Kind::Bool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with(Kind::Int);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = with(Kind::Float);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = with(Kind::String);
    x.s = std::move(v);
    return x;
  }
  static Value function(std::string name) {
    Value x = with(Kind::Function);
    x.s = std::move(name);
    return x;
  }
  static Value new_list(std::vector<Value> items = {});
  static Value new_dict(bool is_namespace = false);

  bool defined() const { return kind != Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }

 private:
  static Value with(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

struct ListValue {
  std::vector<Value> items;
};

struct DictValue {
  std::vector<std::pair<std::string, Value>> items;  // in insertion order, as Python's dicts
  bool is_namespace = false;                         // namespace(): its attributes may be set
  const Value* find(const std::string& key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

inline Value Value::new_list(std::vector<Value> items) {
  Value x = with(Kind::List);
  x.list = std::make_shared<ListValue>();
  x.list->items = std::move(items);
  return x;
}

inline Value Value::new_dict(bool is_namespace) {
  Value x = with(Kind::Dict);
  x.dict = std::make_shared<DictValue>();
  x.dict->is_namespace = is_namespace;
  return x;
}

struct Expr;
using ExprP = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind { Literal, Name, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Cond, List, Dict } kind;
  int line = 0;
  Value literal;                                      // Literal
  std::string name;                                   // Name, Attr, Filter, Test; Unary's and Binary's operator
  std::vector<ExprP> args;                            // operands (Attr/Item/Slice/Filter/Test/Call: the object first)
  std::vector<std::pair<std::string, ExprP>> kwargs;  // a call's, a filter's or a test's keyword arguments
  bool negated = false;                               // Test: `is not`
};

struct Node;
using NodeP = std::shared_ptr<const Node>;

struct Node {
  enum class Kind { Body, Text, Output, If, For, Set, Break, Continue } kind;
  int line = 0;
  std::string text;                                            // Text
  ExprP expr;                                                  // Output; Set's value; For's iterable
  std::vector<std::pair<ExprP, std::vector<NodeP>>> branches;  // If: (condition, body), in order
  std::vector<NodeP> body, else_body;                          // Body, For (else: no items), If (else)
  std::vector<std::string> targets;  // For: the loop's names; Set: a name, or namespace and attribute
  ExprP filter;                      // For: `for x in xs if cond`
};

// Values as Python and jinja2 treat them (jinja_values.cpp); `line` is the template's, for errors.
const char* type_name(const Value& v);
Value undefined(std::string name);  // jinja2's undefined, remembering what was looked up
Value from_json(const nlohmann::ordered_json& j);
bool truthy(const Value& v);
std::string to_str(const Value& v);  // Python's str()
std::string repr(const Value& v);    // Python's repr()
/// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...), transformers' tojson.
struct JsonStyle {
  int64_t indent = -1;  // -1: None
  std::string item_sep, key_sep;
  bool sort_keys = false;
};
void to_json(const Value& v, const JsonStyle& st, int64_t level, std::string& out, int line);
std::vector<std::string> characters(const std::string& s);  // UTF-8 characters, as Python indexes a str
bool py_space(const std::string& ch);                       // str.isspace() of one character
/// str.strip / lstrip / rstrip: Python's whitespace, or the characters of `chars` (a string value).
std::string strip(const std::string& s, bool left, bool right, const Value* chars = nullptr);
std::string ascii_case(std::string s, bool upper);
double number(const Value& v, int line, const char* op);  // a number's value; an error for anything else
bool equal(const Value& a, const Value& b);
int64_t length(const Value& v, int line);
std::vector<Value> iterate(const Value& v, int line);  // a list's items, a dict's keys, a string's characters
bool contains(const Value& container, const Value& x, int line);
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step, int line);

/// Parses a template (jinja.cpp); throws Error naming the line and the construct outside the subset.
NodeP parse_template(std::string_view source);
/// Whether the renderer knows a filter or a test of that name (jinja_eval.cpp): the parser refuses the others.
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

}  // namespace tinygpt::data::jinja
