// The subset of Jinja that chat templates are written in, rendered as transformers renders them: jinja2 with
// trim_blocks and lstrip_blocks on, loop controls (break, continue), the sandbox's default undefined, and the globals
// transformers adds (raise_exception, strftime_now, a tojson that keeps non-ASCII text). Statements: if/elif/else,
// for (with loop.*, an else, a filter), set (names and namespace attributes), break, continue, generation. Expressions:
// literals, lists, dicts, attributes, items, slices, calls, filters, tests, the operators and a conditional. A
// template that uses anything else is refused when it is parsed, naming what it uses and its line, so a conversation
// is never rendered differently from transformers' rendering without saying so.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace tinygpt::data::jinja {

struct Node;

class Template {
 public:
  /// Parses `source`; throws Error naming the line and the construct for a template outside the subset.
  explicit Template(std::string_view source);
  /// Renders with the variables of `context` (an object: messages, add_generation_prompt, bos_token, ...). Throws Error
  /// for what the template cannot do with them (raise_exception's message, a type error, an undefined value used).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace tinygpt::data::jinja
