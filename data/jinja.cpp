// Chat templates: the lexer (text and tags, with jinja2's whitespace rules as transformers sets them) and the parser.
#include "data/jinja.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "data/jinja_ast.h"
#include "data/text.h"
#include "kernels/base.h"

namespace tinygpt::data::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) { throw Error(fmt::format("line {}: {}", line, what)); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// A piece of the template: text, or the inside of a {{ }} or {% %} tag (comments are dropped by the lexer).
struct Chunk {
  enum class Kind { Text, Expr, Stmt } kind;
  std::string text;
  int line;
};

int count_lines(std::string_view s) {
  int n = 0;
  for (const char c : s) n += c == '\n';
  return n;
}

/// Where a tag that starts at `from` (inside it) closes with `close`, skipping quoted strings; npos if it does not.
size_t find_close(std::string_view src, size_t from, std::string_view close) {
  for (size_t i = from; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      for (++i; i < src.size() && src[i] != c; ++i) {
        if (src[i] == '\\') ++i;
      }
      continue;
    }
    if (src.substr(i, close.size()) == close) return i;
  }
  return std::string_view::npos;
}

/// Splits the template into chunks: `{{-` / `-}}` strip the whitespace beside them; trim_blocks drops the newline
/// after a block or comment tag; lstrip_blocks drops the spaces and tabs before one that starts a line.
std::vector<Chunk> lex(std::string src) {
  // jinja2 reads "\r\n" and "\r" as "\n", and drops one trailing newline (keep_trailing_newline is off).
  std::string s;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      s += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      s += src[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::vector<Chunk> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_newline = false, line_start = true;
  while (pos <= s.size()) {
    size_t open = pos;
    while ((open = s.find('{', open)) != std::string::npos) {
      if (open + 1 < s.size() && (s[open + 1] == '{' || s[open + 1] == '%' || s[open + 1] == '#')) break;
      ++open;
    }
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(text);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    strip_next = trim_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Chunk::Kind::Text, text, text_line});
      break;
    }
    const char type = s[open + 1];
    size_t inner = open + 2;
    const char mark = inner < s.size() ? s[inner] : '\0';
    if (mark == '-' || mark == '+') ++inner;
    if (mark == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (type != '{' && mark != '+') {  // lstrip_blocks: only spaces and tabs since the line's start
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if (nl != std::string::npos || line_start) {
        bool blank = true;
        for (size_t k = from; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
        if (blank) text.erase(from);
      }
    }
    if (!text.empty()) out.push_back({Chunk::Kind::Text, text, text_line});
    const std::string_view close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    const size_t end = type == '#' ? s.find("#}", inner) : find_close(s, inner, close);
    if (end == std::string::npos) {
      fail(line, fmt::format("a tag opened with '{{{}' is never closed with '{}'", type, close));
    }
    size_t content_end = end;
    if (end > inner && (s[end - 1] == '-' || s[end - 1] == '+')) {
      --content_end;
      strip_next = s[end - 1] == '-';
    }
    if (type != '{' && !strip_next && !(end > inner && s[end - 1] == '+')) trim_newline = true;
    const std::string content = s.substr(inner, content_end - inner);
    if (type != '#') out.push_back({type == '{' ? Chunk::Kind::Expr : Chunk::Kind::Stmt, content, line});
    line += count_lines(s.substr(open, end + 2 - open));
    pos = end + 2;
    // Whether the text after this tag starts a line (for lstrip_blocks): the tag's trimmed newline, or whitespace
    // stripped up to a newline.
    line_start = trim_newline && pos < s.size() && s[pos] == '\n';
    if (strip_next) {
      size_t k = pos;
      while (k < s.size() && is_space(s[k])) ++k;
      line_start = k > pos && s[k - 1] == '\n';
    }
  }
  return out;
}

struct Token {
  enum class Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;  // a name, an operator, a string's value
  int64_t i = 0;
  double f = 0;
};

std::string decode_escapes(std::string_view s, int line) {
  std::string out;
  auto put_code = [&](uint32_t c) {
    if (c > 0x10FFFF) fail(line, "a string literal has an escape past U+10FFFF");
    out += encode_utf8(std::u32string(1, char32_t(c)));
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    const int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (hex > 0) {
      if (i + size_t(hex) >= s.size()) fail(line, "a string literal's \\x, \\u or \\U escape is cut short");
      const std::string digits(s.substr(i + 1, size_t(hex)));
      char* end = nullptr;
      const unsigned long c = std::strtoul(digits.c_str(), &end, 16);
      if (end != digits.c_str() + hex)
        fail(line, fmt::format("a string literal's escape \\{}{} is not hexadecimal", e, digits));
      put_code(uint32_t(c));
      i += size_t(hex);
      continue;
    }
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '0':
        out += '\0';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\\':
      case '\'':
      case '"':
        out += e;
        break;
      case '\n':
        break;  // a backslash before a newline joins the lines, as in Python
      default:
        out += '\\', out += e;  // Python keeps an unknown escape as it is
    }
  }
  return out;
}

std::vector<Token> tokenize(std::string_view s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i == s.size()) break;
    const char c = s[i];
    if (is_name_start(c)) {
      const size_t start = i;
      while (i < s.size() && (is_name_start(s[i]) || is_digit(s[i]))) ++i;
      out.push_back({Token::Kind::Name, std::string(s.substr(start, i - start))});
    } else if (is_digit(c)) {
      const size_t start = i;
      while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
      bool real = false;
      if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
        real = true;
        for (++i; i < s.size() && is_digit(s[i]);) ++i;
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        real = true;
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        while (i < s.size() && is_digit(s[i])) ++i;
      }
      std::string digits;
      for (const char d : s.substr(start, i - start)) {
        if (d != '_') digits += d;
      }
      Token t{real ? Token::Kind::Float : Token::Kind::Int, digits};
      if (real) {
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, fmt::format("the number {} does not fit in 64 bits", digits));
      }
      out.push_back(t);
    } else if (c == '\'' || c == '"') {
      const size_t start = ++i;
      while (i < s.size() && s[i] != c) i += s[i] == '\\' ? 2 : 1;
      if (i >= s.size()) fail(line, "a string literal is never closed");
      out.push_back({Token::Kind::String, decode_escapes(s.substr(start, i - start), line)});
      ++i;
    } else {
      static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".",
                                        ",",  ":",  "|",  "~",  "+",  "-",  "*", "/", "%", "<", ">", "="};
      bool found = false;
      for (const char* op : ops) {
        const std::string_view o(op);
        if (s.substr(i, o.size()) == o) {
          out.push_back({Token::Kind::Op, std::string(o)});
          i += o.size();
          found = true;
          break;
        }
      }
      if (!found) fail(line, fmt::format("unexpected character '{}' in a tag", c));
    }
  }
  out.push_back({Token::Kind::End, ""});
  return out;
}

/// An expression parser over one tag's tokens, with jinja2's precedence: a conditional, or, and, not, comparisons
/// (in, not in), + and -, ~, * / // %, **, unary - and +, then attributes, items, calls, filters and tests.
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  ExprP expression(bool with_condition = true) {
    ExprP e = parse_or();
    while (with_condition && is_name("if")) {
      ++p_;
      ExprP cond = parse_or();
      ExprP otherwise;
      if (is_name("else")) {
        ++p_;
        otherwise = expression();
      }
      e = make(Expr::Kind::Cond, "", {cond, e, otherwise ? otherwise : literal(Value{})});
    }
    return e;
  }
  bool is_name(const char* n) const { return t_[p_].kind == Token::Kind::Name && t_[p_].text == n; }
  bool is_op(const char* o) const { return t_[p_].kind == Token::Kind::Op && t_[p_].text == o; }
  bool at_end() const { return t_[p_].kind == Token::Kind::End; }
  std::string take_name(const char* what) {
    if (t_[p_].kind != Token::Kind::Name) fail(line_, fmt::format("expected {}, found '{}'", what, shown()));
    return t_[p_++].text;
  }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(line_, fmt::format("expected '{}', found '{}'", o, shown()));
    ++p_;
  }
  void expect_end() {
    if (!at_end()) fail(line_, fmt::format("unexpected '{}' in a tag", shown()));
  }

 private:
  std::string shown() const { return at_end() ? "the tag's end" : t_[p_].text; }
  ExprP make(Expr::Kind k, std::string name, std::vector<ExprP> args) const {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    e->name = std::move(name);
    e->args = std::move(args);
    return e;
  }
  ExprP literal(Value v) const {
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::Literal;
    e->line = line_;
    e->literal = std::move(v);
    return e;
  }
  ExprP binary_left(ExprP (ExprParser::*next)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*next)();
    while (true) {
      const char* found = nullptr;
      for (const char* o : ops) {
        if (is_op(o) || is_name(o)) found = o;
      }
      if (found == nullptr) return e;
      ++p_;
      e = make(Expr::Kind::Binary, found, {e, (this->*next)()});
    }
  }
  ExprP parse_or() { return binary_left(&ExprParser::parse_and, {"or"}); }
  ExprP parse_and() { return binary_left(&ExprParser::parse_not, {"and"}); }
  ExprP parse_not() {
    if (is_name("not")) {
      ++p_;
      return make(Expr::Kind::Unary, "not", {parse_not()});
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=") || is_name("in")) {
        op = t_[p_++].text;
      } else if (is_name("not") && p_ + 1 < t_.size() && t_[p_ + 1].kind == Token::Kind::Name &&
                 t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = make(Expr::Kind::Binary, op, {e, parse_math1()});
    }
  }
  ExprP parse_math1() { return binary_left(&ExprParser::parse_concat, {"+", "-"}); }
  ExprP parse_concat() { return binary_left(&ExprParser::parse_math2, {"~"}); }
  ExprP parse_math2() { return binary_left(&ExprParser::parse_pow, {"*", "/", "//", "%"}); }
  ExprP parse_pow() { return binary_left(&ExprParser::parse_unary_filtered, {"**"}); }
  ExprP parse_unary_filtered() { return parse_unary(true); }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const std::string op = t_[p_++].text;
      e = make(Expr::Kind::Unary, op, {parse_unary(false)});
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(e) : e;
  }
  ExprP primary() {
    const Token& t = t_[p_];
    if (t.kind == Token::Kind::Name) {
      ++p_;
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
      if (t.text == "none" || t.text == "None") return literal(Value::none());
      return make(Expr::Kind::Name, t.text, {});
    }
    if (t.kind == Token::Kind::String) {
      std::string s;
      while (t_[p_].kind == Token::Kind::String) s += t_[p_++].text;  // adjacent literals join, as in Python
      return literal(Value::string(s));
    }
    if (t.kind == Token::Kind::Int) return ++p_, literal(Value::integer(t.i));
    if (t.kind == Token::Kind::Float) return ++p_, literal(Value::real(t.f));
    if (is_op("(")) {
      ++p_;
      std::vector<ExprP> items;
      bool tuple = false;
      while (!is_op(")")) {
        items.push_back(expression());
        if (!is_op(",")) break;
        ++p_;
        tuple = true;
      }
      expect_op(")");
      if (!tuple && items.size() == 1) return items[0];
      return make(Expr::Kind::List, "", items);
    }
    if (is_op("[")) {
      ++p_;
      std::vector<ExprP> items;
      while (!is_op("]")) {
        items.push_back(expression());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return make(Expr::Kind::List, "", items);
    }
    if (is_op("{")) {
      ++p_;
      std::vector<ExprP> items;  // key, value, key, value...
      while (!is_op("}")) {
        items.push_back(expression());
        expect_op(":");
        items.push_back(expression());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return make(Expr::Kind::Dict, "", items);
    }
    fail(line_, fmt::format("expected a value, found '{}'", shown()));
  }
  void call_arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (t_[p_].kind == Token::Kind::Name && p_ + 1 < t_.size() && t_[p_ + 1].kind == Token::Kind::Op &&
          t_[p_ + 1].text == "=") {
        const std::string key = t_[p_].text;
        p_ += 2;
        e.kwargs.emplace_back(key, expression());
      } else {
        if (!e.kwargs.empty()) fail(line_, "a positional argument follows a keyword argument");
        e.args.push_back(expression());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  ExprP postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        ++p_;
        if (t_[p_].kind == Token::Kind::Int) {
          e = make(Expr::Kind::Item, "", {e, literal(Value::integer(t_[p_++].i))});
        } else {
          e = make(Expr::Kind::Attr, take_name("an attribute's name"), {e});
        }
      } else if (is_op("[")) {
        ++p_;
        std::vector<ExprP> parts(3);  // start, stop, step of a slice; parts[0] alone for an item
        bool slice = false;
        for (size_t k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (!is_op(":")) break;
          ++p_;
          slice = true;
        }
        expect_op("]");
        if (!slice) {
          if (!parts[0]) fail(line_, "an empty subscript []");
          e = make(Expr::Kind::Item, "", {e, parts[0]});
        } else {
          for (auto& part : parts) {
            if (!part) part = literal(Value::none());
          }
          e = make(Expr::Kind::Slice, "", {e, parts[0], parts[1], parts[2]});
        }
      } else if (is_op("(")) {
        auto call = std::make_shared<Expr>();
        call->kind = Expr::Kind::Call;
        call->line = line_;
        call->args.push_back(e);
        call_arguments(*call);
        e = call;
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++p_;
        std::string name = take_name("a filter's name");
        if (!known_filter(name))
          fail(line_, fmt::format("the filter '{}' is not one tinygpt's template reader knows", name));
        auto f = std::make_shared<Expr>();
        f->kind = Expr::Kind::Filter;
        f->line = line_;
        f->name = name;
        f->args.push_back(e);
        if (is_op("(")) call_arguments(*f);
        e = f;
      } else if (is_name("is")) {
        ++p_;
        auto t = std::make_shared<Expr>();
        t->kind = Expr::Kind::Test;
        t->line = line_;
        if (is_name("not")) ++p_, t->negated = true;
        t->name = take_name("a test's name");
        if (!known_test(t->name))
          fail(line_, fmt::format("the test '{}' is not one tinygpt's template reader knows", t->name));
        t->args.push_back(e);
        if (is_op("(")) {
          call_arguments(*t);
        } else if (t_[p_].kind == Token::Kind::String || t_[p_].kind == Token::Kind::Int ||
                   t_[p_].kind == Token::Kind::Float ||
                   (t_[p_].kind == Token::Kind::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("is") && !is_name("not"))) {
          t->args.push_back(postfix(primary()));  // `x is sameas false`, `n is divisibleby 3`
        }
        e = t;
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
};

std::shared_ptr<Node> make_node(Node::Kind k, int line) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->line = line;
  return n;
}

/// Parses the chunks into statements: a body ends at one of `ends` (its keyword is returned), or at the template's
/// end where `ends` is empty.
class StmtParser {
 public:
  explicit StmtParser(std::vector<Chunk> chunks) : c_(std::move(chunks)) {}

  std::vector<NodeP> body(std::initializer_list<const char*> ends, std::string& ended, int opened_at) {
    std::vector<NodeP> out;
    while (p_ < c_.size()) {
      const Chunk& ch = c_[p_++];
      if (ch.kind == Chunk::Kind::Text) {
        auto n = make_node(Node::Kind::Text, ch.line);
        n->text = ch.text;
        out.push_back(n);
        continue;
      }
      ExprParser ep(tokenize(ch.text, ch.line), ch.line);
      if (ch.kind == Chunk::Kind::Expr) {
        auto n = make_node(Node::Kind::Output, ch.line);
        n->expr = ep.expression();
        ep.expect_end();
        out.push_back(n);
        continue;
      }
      const std::string keyword = ep.take_name("a statement");
      for (const char* e : ends) {
        if (keyword == e) {
          ended = keyword;
          if (keyword == "elif")
            pending_ = std::make_unique<ExprParser>(std::move(ep));
          else
            ep.expect_end();
          return out;
        }
      }
      out.push_back(statement(keyword, ep, ch.line));
    }
    if (ends.size() > 0) {
      fail(opened_at, fmt::format("this block is never closed (expected {{% {} %}})", *(ends.end() - 1)));
    }
    return out;
  }

 private:
  NodeP statement(const std::string& keyword, ExprParser& ep, int line) {
    std::string ended;
    if (keyword == "if") {
      auto n = make_node(Node::Kind::If, line);
      ExprP cond = ep.expression();
      ep.expect_end();
      while (true) {
        std::vector<NodeP> b = body({"elif", "else", "endif"}, ended, line);
        n->branches.emplace_back(cond, std::move(b));
        if (ended != "elif") break;
        cond = pending_->expression();
        pending_->expect_end();
        pending_.reset();
      }
      if (ended == "else") n->else_body = body({"endif"}, ended, line);
      return n;
    }
    if (keyword == "for") {
      auto n = make_node(Node::Kind::For, line);
      n->targets.push_back(ep.take_name("a loop variable"));
      while (ep.is_op(",")) {
        ep.expect_op(",");
        n->targets.push_back(ep.take_name("a loop variable"));
      }
      if (!ep.is_name("in")) fail(line, "expected 'in' in a for loop");
      ep.take_name("in");
      n->expr = ep.expression(false);
      if (ep.is_name("if")) {
        ep.take_name("if");
        n->filter = ep.expression(false);
      }
      if (ep.is_name("recursive")) fail(line, "recursive for loops are not in tinygpt's template reader");
      ep.expect_end();
      n->body = body({"else", "endfor"}, ended, line);
      if (ended == "else") n->else_body = body({"endfor"}, ended, line);
      return n;
    }
    if (keyword == "set") {
      auto n = make_node(Node::Kind::Set, line);
      n->targets.push_back(ep.take_name("a variable"));
      if (ep.is_op(".")) {
        ep.expect_op(".");
        n->targets.push_back(ep.take_name("an attribute"));
      }
      if (ep.is_op(",")) fail(line, "{% set a, b = ... %} (unpacking) is not in tinygpt's template reader");
      if (!ep.is_op("=")) fail(line, "{% set NAME %}...{% endset %} (a block set) is not in tinygpt's template reader");
      ep.expect_op("=");
      n->expr = ep.expression();
      ep.expect_end();
      return n;
    }
    if (keyword == "break" || keyword == "continue") {
      ep.expect_end();
      return make_node(keyword == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
    }
    if (keyword.rfind("end", 0) == 0 || keyword == "else" || keyword == "elif") {
      fail(line, fmt::format("{{% {} %}} closes no open block", keyword));
    }
    if (keyword == "generation") {  // transformers' marker of the assistant's tokens: rendered as its contents
      ep.expect_end();
      auto n = make_node(Node::Kind::Body, line);
      n->body = body({"endgeneration"}, ended, line);
      return n;
    }
    fail(line,
         fmt::format("{{% {} %}} is not a statement tinygpt's template reader knows (it reads if, for, set, break, "
                     "continue and generation)",
                     keyword));
  }

  std::vector<Chunk> c_;
  size_t p_ = 0;
  std::unique_ptr<ExprParser> pending_;  // an elif's condition, parsed by the if that reads it
};

}  // namespace

NodeP parse_template(std::string_view source) {
  StmtParser parser(lex(std::string(source)));
  std::string ended;
  auto root = make_node(Node::Kind::Body, 1);
  root->body = parser.body({}, ended, 1);
  return root;
}

Template::Template(std::string_view source) : root_(parse_template(source)) {}

}  // namespace tinygpt::data::jinja
