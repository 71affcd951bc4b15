// Chat templates: rendering the parsed statements, with Python's values and jinja2's filters, tests and globals.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "kernels/base.h"

namespace tinygpt::data::jinja {
namespace {

using Kind = Value::Kind;
using nlohmann::ordered_json;

[[noreturn]] void fail(int line, const std::string& what) { throw Error(fmt::format("line {}: {}", line, what)); }

constexpr int64_t kMaxSteps = 1'000'000;         // statements and loop rounds: a hostile template ends, said so
constexpr size_t kMaxOutput = size_t(16) << 20;  // bytes rendered, or in one string
constexpr size_t kMaxItems = 100'000;            // items in one list

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t index, const char* name) const {
    if (index < pos.size()) return &pos[index];
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

const char* const kFilters[] = {"trim",   "length",  "count",      "tojson",     "string",  "int",  "float",
                                "upper",  "lower",   "capitalize", "first",      "last",    "join", "default",
                                "d",      "replace", "list",       "items",      "reverse", "safe", "abs",
                                "select", "reject",  "selectattr", "rejectattr", "map"};
const char* const kTests[] = {
    "defined", "undefined", "none",     "string",   "number",   "integer", "float", "boolean",     "true",
    "false",   "mapping",   "iterable", "sequence", "callable", "odd",     "even",  "divisibleby", "eq",
    "equalto", "==",        "ne",       "!=",       "lt",       "<",       "gt",    ">",           "le",
    "<=",      "ge",        ">=",       "in",       "sameas",   "lower",   "upper"};

class Renderer {
 public:
  explicit Renderer(const ordered_json& context) {
    scopes_.emplace_back();
    for (const char* f : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
      scopes_[0][f] = Value::function(f);
    }
    for (const auto& [k, v] : context.items()) scopes_[0][k] = from_json(v);
  }

  std::string render(const Node& root) {
    exec(root);
    return std::move(out_);
  }

 private:
  enum class Flow { Normal, Break, Continue };

  void step(int line) {
    if (++steps_ > kMaxSteps) fail(line, fmt::format("the template ran more than {} steps", kMaxSteps));
    if (out_.size() > kMaxOutput) fail(line, fmt::format("the template wrote more than {} MiB", kMaxOutput >> 20));
  }

  Flow exec_all(const std::vector<NodeP>& nodes) {
    for (const NodeP& n : nodes) {
      if (const Flow f = exec(*n); f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::Body:
        return exec_all(n.body);
      case Node::Kind::Text:
        out_ += n.text;
        return Flow::Normal;
      case Node::Kind::Output:
        out_ += to_str(eval(*n.expr));
        return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) return exec_all(body);
        }
        return exec_all(n.else_body);
      case Node::Kind::Set: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
          return Flow::Normal;
        }
        const Value ns = lookup(n.targets[0]);
        if (ns.kind != Kind::Dict || !ns.dict->is_namespace) {
          fail(n.line,
               fmt::format("cannot set '{}.{}': '{}' is not a namespace()", n.targets[0], n.targets[1], n.targets[0]));
        }
        ns.dict->set(n.targets[1], std::move(v));
        return Flow::Normal;
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
      case Node::Kind::For:
        return exec_for(n);
    }
    return Flow::Normal;
  }

  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (item.kind != Kind::List || item.list->items.size() != n.targets.size()) {
      fail(n.line, fmt::format("cannot unpack {} into {} loop variables", repr(item), n.targets.size()));
    }
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = item.list->items[k];
  }

  Flow exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.expr), n.line);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(n, item);
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_all(n.else_body);
    const int64_t count = int64_t(items.size());
    // One `loop` for the whole statement, its fields rewritten each round in place (jinja2's LoopContext is one
    // object too).
    Value loop = Value::new_dict();
    for (const char* key :
         {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"}) {
      loop.dict->set(key, Value{});
    }
    auto& f = loop.dict->items;
    for (int64_t k = 0; k < count; ++k) {
      step(n.line);
      scopes_.emplace_back();  // each round its own scope, as jinja2: a set inside is not seen by the next round
      bind(n, items[size_t(k)]);
      f[0].second = Value::integer(k + 1);
      f[1].second = Value::integer(k);
      f[2].second = Value::integer(count - k);
      f[3].second = Value::integer(count - k - 1);
      f[4].second = Value::boolean(k == 0);
      f[5].second = Value::boolean(k == count - 1);
      f[6].second = Value::integer(count);
      f[7].second = k > 0 ? items[size_t(k - 1)] : undefined("loop.previtem");
      f[8].second = k + 1 < count ? items[size_t(k + 1)] : undefined("loop.nextitem");
      scopes_.back()["loop"] = loop;
      const Flow f = exec_all(n.body);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > 0;) {
      if (auto it = scopes_[k].find(name); it != scopes_[k].end()) return it->second;
    }
    return undefined(name);
  }

  Args arguments(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& [key, x] : e.kwargs) a.kw.emplace_back(key, eval(*x));
    return a;
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Kind::Undefined) fail(line, fmt::format("'{}' is undefined", obj.s));
    if (obj.kind == Kind::Dict) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
    return undefined(name);
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Kind::Undefined) fail(line, fmt::format("'{}' is undefined", obj.s));
    if (obj.kind == Kind::Dict && key.kind == Kind::String) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      return undefined(key.s);
    }
    if ((obj.kind == Kind::List || obj.kind == Kind::String) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
      const std::vector<std::string> cs = obj.kind == Kind::String ? characters(obj.s) : std::vector<std::string>{};
      const int64_t n = obj.kind == Kind::List ? int64_t(obj.list->items.size()) : int64_t(cs.size());
      int64_t i = key.kind == Kind::Bool ? key.b : key.i;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return undefined(fmt::format("[{}]", to_str(key)));
      return obj.kind == Kind::List ? obj.list->items[size_t(i)] : Value::string(cs[size_t(i)]);
    }
    return undefined(to_str(key));
  }

  /// An expression's value, bounded: a string past kMaxOutput or a list past kMaxItems (a template doubling one in a
  /// loop) is an error, not the machine's memory.
  Value eval(const Expr& e) {
    Value v = eval_unbounded(e);
    if (v.kind == Kind::String && v.s.size() > kMaxOutput)
      fail(e.line, fmt::format("a string past {} MiB", kMaxOutput >> 20));
    if (v.kind == Kind::List && v.list->items.size() > kMaxItems)
      fail(e.line, fmt::format("a list past {} items", kMaxItems));
    return v;
  }

  Value eval_unbounded(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name:
        return lookup(e.name);
      case Expr::Kind::Attr:
        return attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::Item:
        return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.args[0]);
        if (obj.kind != Kind::List && obj.kind != Kind::String) {
          fail(e.line, fmt::format("cannot slice a value of type {}", type_name(obj)));
        }
        const std::vector<std::string> cs = obj.kind == Kind::String ? characters(obj.s) : std::vector<std::string>{};
        const int64_t n = obj.kind == Kind::List ? int64_t(obj.list->items.size()) : int64_t(cs.size());
        const std::vector<int64_t> idx = slice_indices(n, eval(*e.args[1]), eval(*e.args[2]), eval(*e.args[3]), e.line);
        if (obj.kind == Kind::String) {
          std::string s;
          for (const int64_t k : idx) s += cs[size_t(k)];
          return Value::string(s);
        }
        std::vector<Value> items;
        for (const int64_t k : idx) items.push_back(obj.list->items[size_t(k)]);
        return Value::new_list(std::move(items));
      }
      case Expr::Kind::List: {
        std::vector<Value> items;
        for (const ExprP& x : e.args) items.push_back(eval(*x));
        return Value::new_list(std::move(items));
      }
      case Expr::Kind::Dict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (key.kind != Kind::String) fail(e.line, "a dict's keys must be strings here");
          d.dict->set(key.s, eval(*e.args[k + 1]));
        }
        return d;
      }
      case Expr::Kind::Cond:
        return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.kind == Kind::Int || v.kind == Kind::Bool) {
          const int64_t i = v.kind == Kind::Bool ? v.b : v.i;
          return Value::integer(e.name == "-" ? -i : i);
        }
        const double x = number(v, e.line, e.name.c_str());
        return Value::real(e.name == "-" ? -x : x);
      }
      case Expr::Kind::Binary:
        return binary(e);
      case Expr::Kind::Call:
        return call(e);
      case Expr::Kind::Filter:
        return filter(e.name, eval(*e.args[0]), arguments(e, 1), e.line);
      case Expr::Kind::Test: {
        const bool r = test(e.name, eval(*e.args[0]), arguments(e, 1), e.line);
        return Value::boolean(e.negated ? !r : r);
      }
    }
    return {};
  }

  /// An arithmetic operator on integers as Python computes it: true with the result in r, false for a negative power
  /// (a float); an overflow past 64 bits fails.
  bool integer_arith(const std::string& op, int64_t i, int64_t j, int line, int64_t& r) {
    r = 0;
    bool overflow = false;
    if (op == "+")
      overflow = __builtin_add_overflow(i, j, &r);
    else if (op == "-")
      overflow = __builtin_sub_overflow(i, j, &r);
    else if (op == "*")
      overflow = __builtin_mul_overflow(i, j, &r);
    else if (j == -1 && (op == "//" || op == "%"))  // apart: INT64_MIN / -1 traps
      overflow = op == "//" && __builtin_sub_overflow(int64_t(0), i, &r);
    else if (op == "//")
      r = i / j - ((i % j != 0) && ((i < 0) != (j < 0)));
    else if (op == "%")
      r = ((i % j) + j) % j;
    else if (j >= 0) {  // **
      r = 1;            // by squaring: a base squared is used only while higher bits of the exponent remain
      int64_t base = i;
      for (int64_t n = j; n > 0 && !overflow; n >>= 1) {
        if (n & 1) overflow = __builtin_mul_overflow(r, base, &r);
        if (n > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (overflow) fail(line, fmt::format("integer overflow in {} {} {} (past 64 bits)", i, op, j));
    return op != "**" || j >= 0;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.args[0]);
    if (op == "and") return truthy(a) ? eval(*e.args[1]) : a;
    if (op == "or") return truthy(a) ? a : eval(*e.args[1]);
    const Value b = eval(*e.args[1]);
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in") return Value::boolean(contains(b, a, e.line));
    if (op == "not in") return Value::boolean(!contains(b, a, e.line));
    // Joined strings and lists are bounded before they are made (eval bounds every other value after).
    const auto bounded = [&](size_t n, size_t limit, const char* what) {
      if (n > limit) fail(e.line, fmt::format("{} past {}", what, limit));
    };
    if (op == "~") {
      std::string x = to_str(a), y = to_str(b);
      bounded(x.size() + y.size(), kMaxOutput, "a string of bytes");
      return Value::string(x + y);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.kind == Kind::String && b.kind == Kind::String) {
        c = a.s.compare(b.s);
      } else {
        const double x = number(a, e.line, op.c_str()), y = number(b, e.line, op.c_str());
        c = x < y ? -1 : x > y ? 1 : 0;
      }
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+" && a.kind == Kind::String && b.kind == Kind::String) {
      bounded(a.s.size() + b.s.size(), kMaxOutput, "a string of bytes");
      return Value::string(a.s + b.s);
    }
    if (op == "+" && a.kind == Kind::List && b.kind == Kind::List) {
      bounded(a.list->items.size() + b.list->items.size(), kMaxItems, "a list of items");
      std::vector<Value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return Value::new_list(std::move(items));
    }
    if (op == "*" && a.kind == Kind::String && b.kind == Kind::Int) {
      std::string s;
      for (int64_t k = 0; k < b.i && s.size() < kMaxOutput; ++k) s += a.s;
      return Value::string(s);
    }
    for (const Value* v : {&a, &b}) {
      if (v->kind == Kind::Undefined) fail(e.line, fmt::format("'{}' is undefined", v->s));
      if (!v->is_number()) {
        fail(e.line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
      }
    }
    const bool ints = a.kind != Kind::Float && b.kind != Kind::Float && op != "/";
    const double x = number(a, e.line, op.c_str()), y = number(b, e.line, op.c_str());
    if ((op == "/" || op == "//" || op == "%") && y == 0) fail(e.line, "division by zero");
    if (ints) {
      int64_t r = 0;
      const auto exact = [](const Value& v) { return v.kind == Kind::Int ? v.i : int64_t(v.b); };  // no double
      if (integer_arith(op, exact(a), exact(b), e.line, r)) return Value::integer(r);
    }
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "/") return Value::real(x / y);
    if (op == "//") return Value::real(std::floor(x / y));
    if (op == "%") return Value::real(x - y * std::floor(x / y));
    return Value::real(std::pow(x, y));
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    Args a = arguments(e, 1);
    if (callee.kind == Expr::Kind::Attr) {
      const Value obj = eval(*callee.args[0]);
      if (obj.kind == Kind::String || (obj.kind == Kind::Dict && !obj.dict->is_namespace)) {
        return method(obj, callee.name, a, e.line);
      }
    }
    const Value f = eval(callee);
    if (f.kind == Kind::Undefined) fail(e.line, fmt::format("'{}' is undefined", f.s));
    if (f.kind != Kind::Function) fail(e.line, fmt::format("'{}' object is not callable", type_name(f)));
    if (f.s == "raise_exception") {
      throw Error(fmt::format("the template raised: {}", a.pos.empty() ? "" : to_str(a.pos[0])));
    }
    if (f.s == "strftime_now") {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::string format = a.pos.empty() ? "" : to_str(a.pos[0]);
      const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }
    if (f.s == "namespace" || f.s == "dict") {
      Value d = Value::new_dict(f.s == "namespace");
      for (const Value& p : a.pos) {
        if (p.kind != Kind::Dict) fail(e.line, fmt::format("{}() takes a dict or keyword arguments", f.s));
        for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
      }
      for (const auto& [k, v] : a.kw) d.dict->set(k, v);
      return d;
    }
    // range
    std::vector<int64_t> r;
    for (const Value& p : a.pos) r.push_back(int64_t(number(p, e.line, "range")));
    const int64_t start = r.size() > 1 ? r[0] : 0, stop = r.size() == 1 ? r[0] : r.size() > 1 ? r[1] : 0;
    const int64_t st = r.size() > 2 ? r[2] : 1;
    if (st == 0) fail(e.line, "range() arg 3 must not be zero");
    std::vector<Value> items;
    for (int64_t k = start; st > 0 ? k < stop : k > stop; k += st) {
      if (items.size() >= kMaxItems) fail(e.line, fmt::format("range() of more than {} items", kMaxItems));
      items.push_back(Value::integer(k));
    }
    return Value::new_list(std::move(items));
  }

  Value method(const Value& obj, const std::string& name, const Args& a, int line) {
    if (obj.kind == Kind::Dict) {
      std::vector<Value> out;
      if (name == "get") {
        const Value key = a.pos.empty() ? Value{} : a.pos[0];
        const Value* v = key.kind == Kind::String ? obj.dict->find(key.s) : nullptr;
        return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
      }
      for (const auto& [k, v] : obj.dict->items) {
        if (name == "items")
          out.push_back(Value::new_list({Value::string(k), v}));
        else if (name == "keys")
          out.push_back(Value::string(k));
        else if (name == "values")
          out.push_back(v);
        else
          fail(line, fmt::format("dict has no method '{}' in tinygpt's template reader", name));
      }
      return Value::new_list(std::move(out));
    }
    const std::string& s = obj.s;
    const Value* a0 = a.get(0, "");
    const auto arg_str = [&](size_t k) {
      if (k >= a.pos.size() || a.pos[k].kind != Kind::String)
        fail(line, fmt::format("str.{}() needs a string argument", name));
      return a.pos[k].s;
    };
    if (name == "strip") return Value::string(strip(s, true, true, a0));
    if (name == "lstrip") return Value::string(strip(s, true, false, a0));
    if (name == "rstrip") return Value::string(strip(s, false, true, a0));
    if (name == "upper") return Value::string(ascii_case(s, true));
    if (name == "lower") return Value::string(ascii_case(s, false));
    if (name == "startswith") return Value::boolean(s.rfind(arg_str(0), 0) == 0);
    if (name == "endswith") {
      const std::string x = arg_str(0);
      return Value::boolean(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
    }
    if (name == "replace") {
      const std::string from = arg_str(0), to = arg_str(1);
      if (from.empty()) fail(line, "str.replace() with an empty pattern is not in tinygpt's template reader");
      std::string out;
      size_t p = 0, q;
      while ((q = s.find(from, p)) != std::string::npos) out += s.substr(p, q - p) + to, p = q + from.size();
      return Value::string(out + s.substr(p));
    }
    if (name == "split") {
      std::vector<Value> parts;
      if (a.pos.empty() || a.pos[0].kind == Kind::None) {
        std::string cur;
        for (const std::string& ch : characters(s)) {
          if (py_space(ch)) {
            if (!cur.empty()) parts.push_back(Value::string(cur)), cur.clear();
          } else {
            cur += ch;
          }
        }
        if (!cur.empty()) parts.push_back(Value::string(cur));
      } else {
        const std::string sep = arg_str(0);
        if (sep.empty()) fail(line, "empty separator");
        size_t p = 0, q;
        while ((q = s.find(sep, p)) != std::string::npos)
          parts.push_back(Value::string(s.substr(p, q - p))), p = q + sep.size();
        parts.push_back(Value::string(s.substr(p)));
      }
      return Value::new_list(std::move(parts));
    }
    fail(line, fmt::format("str has no method '{}' in tinygpt's template reader", name));
  }

  bool test(const std::string& name, const Value& v, const Args& a, int line) {
    const Value* arg = a.get(0, "value");
    const auto need = [&]() -> const Value& {
      if (arg == nullptr) fail(line, fmt::format("the test '{}' needs an argument", name));
      return *arg;
    };
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return v.kind == Kind::None;
    if (name == "string") return v.kind == Kind::String;
    if (name == "number") return v.kind == Kind::Int || v.kind == Kind::Float;
    if (name == "integer") return v.kind == Kind::Int;
    if (name == "float") return v.kind == Kind::Float;
    if (name == "boolean") return v.kind == Kind::Bool;
    if (name == "true") return v.kind == Kind::Bool && v.b;
    if (name == "false") return v.kind == Kind::Bool && !v.b;
    if (name == "mapping") return v.kind == Kind::Dict;
    if (name == "iterable")
      return v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::String || !v.defined();
    if (name == "sequence") return v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::String;
    if (name == "callable") return v.kind == Kind::Function;
    if (name == "odd" || name == "even") {
      const int64_t i = int64_t(number(v, line, name.c_str()));
      return (((i % 2) + 2) % 2 == 1) == (name == "odd");
    }
    if (name == "divisibleby") {
      const int64_t d = int64_t(number(need(), line, name.c_str()));
      return d != 0 && int64_t(number(v, line, name.c_str())) % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, need());
    if (name == "ne" || name == "!=") return !equal(v, need());
    if (name == "in") return contains(need(), v, line);
    if (name == "sameas")
      return v.kind == need().kind && (v.kind == Kind::None || v.kind == Kind::Undefined || equal(v, *arg));
    if (name == "lower") return v.kind == Kind::String && ascii_case(v.s, false) == v.s;
    if (name == "upper") return v.kind == Kind::String && ascii_case(v.s, true) == v.s;
    const double x = number(v, line, name.c_str()), y = number(need(), line, name.c_str());
    if (name == "lt" || name == "<") return x < y;
    if (name == "gt" || name == ">") return x > y;
    if (name == "le" || name == "<=") return x <= y;
    return x >= y;
  }

  /// The filter tojson(indent, ensure_ascii, separators, sort_keys).
  Value tojson(const Value& v, const Args& a, int line) {
    JsonStyle st;
    if (const Value* ind = a.get(1, "indent"); ind != nullptr && ind->kind != Kind::None)
      st.indent = int64_t(number(*ind, line, "indent"));
    if (a.get(0, "ensure_ascii") != nullptr && truthy(*a.get(0, "ensure_ascii"))) {
      fail(line, "tojson(ensure_ascii=true) is not in tinygpt's template reader");
    }
    st.item_sep = st.indent >= 0 ? "," : ", ";
    st.key_sep = ": ";
    if (const Value* sep = a.get(2, "separators");
        sep != nullptr && sep->kind == Kind::List && sep->list->items.size() == 2) {
      st.item_sep = to_str(sep->list->items[0]);
      st.key_sep = to_str(sep->list->items[1]);
    }
    if (const Value* sk = a.get(3, "sort_keys")) st.sort_keys = truthy(*sk);
    std::string out;
    to_json(v, st, 0, out, line);
    return Value::string(out);
  }

  /// The filters select, reject, selectattr and rejectattr over `items`.
  Value select(const std::string& name, const std::vector<Value>& items, const Args& a, int line) {
    const bool by_attr = name == "selectattr" || name == "rejectattr",
               keep_if = name == "select" || name == "selectattr";
    Args rest;
    for (size_t k = by_attr ? 2 : 1; k < a.pos.size(); ++k) rest.pos.push_back(a.pos[k]);
    const std::string test_name = a.pos.size() > (by_attr ? 1u : 0u) ? to_str(a.pos[by_attr ? 1 : 0]) : "";
    if (!test_name.empty() && !known_test(test_name))
      fail(line, fmt::format("the test '{}' is not one tinygpt's template reader knows", test_name));
    std::vector<Value> out;
    for (const Value& x : items) {
      Value subject = x;
      if (by_attr) {
        if (a.pos.empty()) fail(line, fmt::format("{}() needs an attribute", name));
        subject = x.kind == Kind::Dict && x.dict->find(to_str(a.pos[0])) ? *x.dict->find(to_str(a.pos[0]))
                                                                         : undefined(to_str(a.pos[0]));
      }
      const bool r = test_name.empty() ? truthy(subject) : test(test_name, subject, rest, line);
      if (r == keep_if) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }

  Value filter(const std::string& name, const Value& v, const Args& a, int line) {
    if (name == "trim") return Value::string(strip(to_str(v), true, true, a.get(0, "chars")));
    if (name == "length" || name == "count") return Value::integer(length(v, line));
    if (name == "string") return Value::string(to_str(v));
    if (name == "safe") return v;
    if (name == "upper" || name == "lower") return Value::string(ascii_case(to_str(v), name == "upper"));
    if (name == "capitalize") {
      std::string s = ascii_case(to_str(v), false);
      if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
      return Value::string(s);
    }
    if (name == "default" || name == "d") {
      const Value* boolean = a.get(1, "boolean");
      const bool use_default = boolean != nullptr && truthy(*boolean) ? !truthy(v) : !v.defined();
      const Value* dflt = a.get(0, "default_value");
      return use_default ? (dflt ? *dflt : Value::string("")) : v;
    }
    if (name == "tojson") return tojson(v, a, line);
    if (name == "int") {
      if (v.kind == Kind::String) {
        char* end = nullptr;
        const std::string t = strip(v.s, true, true);
        const long long i = std::strtoll(t.c_str(), &end, 10);
        return Value::integer(end != t.c_str() && *end == '\0' ? i : 0);
      }
      return Value::integer(v.is_number() ? int64_t(number(v, line, "int")) : 0);
    }
    if (name == "float")
      return Value::real(v.is_number()            ? number(v, line, "float")
                         : v.kind == Kind::String ? std::strtod(v.s.c_str(), nullptr)
                                                  : 0.0);
    if (name == "abs") {
      if (v.kind == Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
      return Value::real(std::fabs(number(v, line, "abs")));
    }
    std::vector<Value> items = iterate(v, line);
    if (name == "first") return items.empty() ? undefined("first") : items.front();
    if (name == "last") return items.empty() ? undefined("last") : items.back();
    if (name == "list") return Value::new_list(std::move(items));
    if (name == "reverse") {
      if (v.kind == Kind::String) {
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->s;
        return Value::string(s);
      }
      std::reverse(items.begin(), items.end());
      return Value::new_list(std::move(items));
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      std::string s;
      for (size_t k = 0; k < items.size(); ++k) s += (k ? (sep ? to_str(*sep) : "") : "") + to_str(items[k]);
      return Value::string(s);
    }
    if (name == "items") {
      if (v.kind != Kind::Dict) fail(line, "the filter 'items' needs a dict");
      return method(v, "items", {}, line);
    }
    if (name == "replace") {
      Args m;
      m.pos = {a.get(0, "old") ? *a.get(0, "old") : Value{}, a.get(1, "new") ? *a.get(1, "new") : Value{}};
      return method(Value::string(to_str(v)), "replace", m, line);
    }
    if (name == "map") {
      const Value* attr = a.get(99, "attribute");
      if (attr == nullptr) fail(line, "map() is read only with attribute= in tinygpt's template reader");
      for (Value& x : items)
        x = x.kind == Kind::Dict && x.dict->find(to_str(*attr)) ? *x.dict->find(to_str(*attr))
                                                                : undefined(to_str(*attr));
      return Value::new_list(std::move(items));
    }
    return select(name, items, a, line);  // select, reject, selectattr, rejectattr
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  int64_t steps_ = 0;
};

}  // namespace

bool known_filter(const std::string& name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool known_test(const std::string& name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) throw Error("a template's context must be an object");
  return Renderer(context).render(*root_);
}

}  // namespace tinygpt::data::jinja
