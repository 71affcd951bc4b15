// Chat: the Jinja subset against what jinja2 renders (the expected strings are jinja2's, as transformers configures it:
// trim_blocks, lstrip_blocks, loop controls), the refusals, ChatML by hand, and a conversation whose KV cache is kept
// across turns against one read whole.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "data/chat.h"
#include "data/conversations.h"
#include "data/jinja.h"
#include "train/chat.h"

using namespace tinygpt;
using nlohmann::ordered_json;

namespace {

std::string render(const std::string& source, const ordered_json& context = ordered_json::object()) {
  return data::jinja::Template(source).render(context);
}

std::string error_of(const std::string& source, const ordered_json& context = ordered_json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE(
    "jinja: whitespace as transformers renders it (trim_blocks, lstrip_blocks, - markers, one trailing newline)") {
  CHECK(render("  {% if true %}\n  a\n  {% endif %}\n  {{ 'b' }}  \n{# c #}\n  d\n") == "  a\n  b  \n  d");
  CHECK(render("a  {{- 'b' -}}  c") == "abc");
  CHECK(render("{%- if true -%}  x  {%- endif %}\ny") == "xy");
  CHECK(render("x {% if true %}y{% endif %}") == "x y");  // not at a line's start: the spaces stay
  CHECK(render("a\r\nb\n\n") == "a\nb\n");
}

TEST_CASE("jinja: loops, their scope, namespaces, break and continue") {
  const ordered_json ctx = {{"ms", {"a", "b"}}};
  CHECK(render("{% for m in ms %}{{ loop.index }}{{ m }}{% if not loop.last %},{% endif %}{% endfor %}", ctx) ==
        "1a,2b");
  CHECK(render("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}<{{x}}>") == "[]<>");
  CHECK(render("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}<{{x}}>") == "[5][5]<5>");
  CHECK(render("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}") ==
        "6");
  CHECK(render("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}"
               "{{ i }}{% endfor %}") == "02");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}") == "2242");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
}

TEST_CASE("jinja: values print as Python prints them") {
  CHECK(render("{{ [1,'a',none,true,1.0,{'k':[2]}] }}|{{ 1.0 }}|{{ 10**18 }}|{{ 1e20 }}|{{ 'a\\'b' ~ 1 }}|{{ "
               "['it\\'s'] }}") ==
        "[1, 'a', None, True, 1.0, {'k': [2]}]|1.0|1000000000000000000|1e+20|a'b1|[\"it's\"]");
  CHECK(render("{{ undefined_thing }}|{{ none }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 'ab'[::-1] }}|"
               "{{ [1,2,3][1:] }}") == "|None|3|3.5|-4|2|ba|[2, 3]");
  CHECK(render("{{ x|tojson }}", {{"x", {{"a", {1, 2.5, nullptr, true}}, {"b", "é\n\"<"}}}}) ==
        "{\"a\": [1, 2.5, null, true], \"b\": \"é\\n\\\"<\"}");
  CHECK(
      render("{{ x|tojson(indent=2) }}", {{"x", {{"a", {1, ordered_json::object()}}, {"b", ordered_json::array()}}}}) ==
      "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
}

TEST_CASE("jinja: filters, tests, methods and operators that chat templates use") {
  const ordered_json ctx = {
      {"messages", {{{"role", "system"}, {"content", " S "}}, {{"role", "user"}, {"content", "U"}}}}};
  CHECK(render("{{ '\u00a0 x \u3000' | trim }}|{{ ' y '.strip() }}|{{ 'a-b'.split('-') }}|{{ 'Ab'.upper() }}") ==
        "x|y|['a', 'b']|AB");
  CHECK(render("{{ messages | map(attribute='role') | join(', ') }}|{{ messages | length }}|{{ messages[0]['content'] "
               "| trim }}",
               ctx) == "system, user|2|S");
  CHECK(render("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ ['a','b'] | "
               "reject('equalto', 'b') | join }}",
               ctx) == "1|a");
  CHECK(render("{{ messages[1:] | length }}|{{ messages[-1].role }}|{{ messages[5] is defined }}|{{ 'x' in 'xyz' }}|"
               "{{ 'q' not in ['a'] }}|{{ nothing | default('d') }}",
               ctx) == "1|user|False|True|True|d");
  CHECK(render("{% if messages[0].role == 'user' %}u{% elif messages[0].role == 'system' %}s{% else %}?{% endif %}",
               ctx) == "s");
  CHECK(render("{{ 'yes' if messages else 'no' }}|{{ 'a' if false }}|{{ (1, 2)[1] }}|{{ 'content' in messages[0] }}",
               ctx) == "yes||2|True");
  CHECK(render("{% if tools is not none %}t{% else %}n{% endif %}", {{"tools", nullptr}}) == "n");
  CHECK(render("{% generation %}reply{% endgeneration %}") == "reply");
}

TEST_CASE("jinja: what is outside the subset, or used wrongly, is an error naming it and its line") {
  CHECK(error_of("{{ x | wordwrap }}").find("the filter 'wordwrap'") != std::string::npos);
  CHECK(error_of("a\n{% macro m() %}{% endmacro %}").find("line 2: {% macro %}") != std::string::npos);
  CHECK(error_of("{% if true %}x").find("never closed") != std::string::npos);
  CHECK(error_of("{{ 'x' ").find("never closed") != std::string::npos);
  CHECK(error_of("{% endif %}").find("closes no open block") != std::string::npos);
  CHECK(error_of("{{ foo.bar }}").find("'foo' is undefined") != std::string::npos);
  CHECK(error_of("{{ raise_exception('no tools here') }}").find("no tools here") != std::string::npos);
  CHECK(error_of("{{ 'a' + 1 }}").find("unsupported operand types for +: 'str' and 'int'") != std::string::npos);
  CHECK(error_of("{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}").find("steps") !=
        std::string::npos);
  CHECK(error_of("{{ 10**19 }}").find("overflow") != std::string::npos);
  CHECK(render("{{ 1**4000000000000000000 }}|{{ (-1)**3 }}|{{ 2**62 }}") ==
        "1|-1|4611686018427387904");  // Python's integers have no bound; ours do
  // The one quotient of 64-bit integers that does not fit (the division would trap): an error, not a crash.
  CHECK(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("overflow") != std::string::npos);
  CHECK(render("{{ (-9223372036854775807 - 1) % -1 }}|{{ 7 // -1 }}|{{ -7 % -1 }}") == "0|-7|0");
  CHECK(error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
            .find("a string of bytes past") != std::string::npos);
  CHECK(error_of("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
            .find("a list of items past") != std::string::npos);
  CHECK(error_of("{{ x is frobnicated }}").find("the test 'frobnicated'") != std::string::npos);
}

TEST_CASE("chat: ChatML and Llama 3 built in, their end of turn, and the messages a file may hold") {
  const data::TokenizerConfig tc{"<|begin_of_text|>", "", ""};
  const data::Messages m = {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", " U "}}};
  const data::ChatTemplate chatml = data::chat_template_for(tc, "chatml");
  CHECK(chatml.render(m, true, tc) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n<|im_start|>assistant\n");
  CHECK(chatml.render(m, false, tc) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n");
  CHECK(chatml.end_of_turn(tc) == "<|im_end|>");
  const data::ChatTemplate llama3 = data::chat_template_for(tc, "llama3");
  CHECK(llama3.render(m, true, tc) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(llama3.end_of_turn(tc) == "<|eot_id|>");
  CHECK(data::chat_template_for({"", "", "{{ 'own' }}"}, "").render(m, true, tc) == "own");
  CHECK(data::chat_template_for({}, "").name() == "chatml");  // a model without a template: ChatML
  CHECK_THROWS_WITH_AS(data::chat_template_for(tc, "/nonexistent/t.jinja"), doctest::Contains("not a built-in"), Error);
  CHECK_THROWS_WITH_AS(data::ChatTemplate("T", "{% call x %}"), doctest::Contains("the chat template T cannot be read"),
                       Error);
  CHECK_THROWS_WITH_AS(data::parse_messages("{\"role\": \"user\"}", "F"), doctest::Contains("JSON array"), Error);
  CHECK_THROWS_WITH_AS(data::parse_messages("[{\"role\": \"user\", \"content\": 3}]", "F"),
                       doctest::Contains("F: message 0 must be an object"), Error);
  CHECK_THROWS_WITH_AS(data::parse_messages("[", "F"), doctest::Contains("F is not JSON"), Error);
}

namespace {

struct TinyChatModel {
  data::Tokenizer tok;
  nn::GPT model;
  static nn::GPTConfig config(int64_t vocab) {
    nn::GPTConfig c;
    c.vocab_size = vocab;
    c.block_size = 256;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.pos = nn::Positions::Rope;
    return c;
  }
  static data::CharVocab chars() {
    return data::CharVocab(data::decode_utf8("<|im_start|>system user assistant\nabcdefghijklmnopqrstuvwxyz .?!"));
  }
  explicit TinyChatModel(Generator gen = Generator(7)) : tok(chars()), model(config(tok.vocab_size()), gen) {
    model.train(false);
  }
};

}  // namespace

TEST_CASE("chat: a turn reads only what the cache lacks, and replies as a conversation read whole") {
  TinyChatModel m;
  const data::ChatTemplate chatml = data::chat_template_for({}, "chatml");
  GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0};
  ChatSession chat(m.model, m.tok, chatml, 256, greedy, 1);
  const ChatSession::Reply first = chat.reply("hello there", {});
  const ChatSession::Reply second = chat.reply("and then?", {});
  CHECK(first.tokens == 12);  // a random model never writes <|im_end|>: cut at max_new_tokens
  const std::string whole = chatml.render(chat.messages(), false, {});
  CHECK(second.read < int64_t(whole.size()) / 2);  // the first turn came from the cache

  ChatSession fresh(m.model, m.tok, chatml, 256, greedy, 1);
  fresh.add("user", "hello there");
  fresh.add("assistant", first.text);
  fresh.add("user", "and then?");
  const ChatSession::Reply again = fresh.respond({});
  CHECK(again.text == second.text);
  CHECK(again.read > second.read);

  // A window that holds about one turn: the oldest turns are dropped, and said so.
  ChatSession narrow(m.model, m.tok, chatml, 160, greedy, 1);
  narrow.reset("be brief");
  for (int k = 0; k < 3; ++k) narrow.reply("what is it", {});
  const ChatSession::Reply dropped = narrow.reply("what is it", {});
  CHECK(dropped.dropped > 0);
  CHECK(narrow.messages()[0]["role"] == "system");
  CHECK_THROWS_WITH_AS(narrow.reply(std::string(200, 'a'), {}), doctest::Contains("fit the window of 160"), Error);
}

TEST_CASE("sft: the assistant's tokens of a conversation, by hand (ChatML over characters), and their targets") {
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n";
  const data::Tokenizer tok(data::CharVocab(data::decode_utf8(text)));
  const data::ChatTemplate chatml = data::chat_template_for({}, "chatml");
  const data::Messages conv = {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}};
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  data::tokenize_conversation(conv, chatml, tok, ids, mask);
  REQUIRE(ids.size() == text.size());  // one character a token
  CHECK(tok.decode(ids) == text);
  // "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" is 52 characters; then "yo<|im_end|>" (12) is the
  // assistant's; the newline after it is not.
  for (size_t k = 0; k < ids.size(); ++k) CHECK_MESSAGE(mask[k] == (k >= 52 && k < 64), "token ", k);

  data::ConversationTokens rows;
  rows.add(ids, mask);
  const data::RowBatch b = data::row_batch(rows.rows(), 0, 1, 80);  // padded past the 65 tokens
  const auto y = b.y.to_vector<int32_t>();
  CHECK(b.targets == 12);
  for (size_t t = 0; t < 80; ++t) {
    const bool target = t >= 51 && t < 63;  // y[t] predicts token t + 1
    CHECK_MESSAGE(y[t] == (target ? int32_t(ids[t + 1]) : -1), "position ", t);
  }
  // Cut at the block: 40 positions hold no target (the reply starts at 52).
  CHECK(data::row_batch(rows.rows(), 0, 1, 40).targets == 0);
}

TEST_CASE("sft: JSON lines of OpenAI's and ShareGPT's conversations, and each bad line named by file and line") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tinygpt-sft-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir / name) << body;
    return dir / name;
  };
  const auto ok = write("ok.jsonl",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n\n"
                        "{\"conversations\": [{\"from\": \"system\", \"value\": \"s\"}, {\"from\": \"human\", "
                        "\"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"r\"}]}\n");
  const std::vector<data::Messages> c = data::read_conversations(ok);
  REQUIRE(c.size() == 2);
  CHECK(c[1].dump() ==
        "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"r\"}]");
  CHECK_THROWS_WITH_AS(data::read_conversations(write("a.jsonl", "{\"messages\": []}\n{\"x\": 1}\n")),
                       doctest::Contains("a.jsonl:2: neither \"messages\""), Error);
  CHECK_THROWS_WITH_AS(
      data::read_conversations(write("b.jsonl", "{\"conversations\": [{\"from\": \"bot\", \"value\": \"v\"}]}")),
      doctest::Contains("b.jsonl:1: turn 0 is from \"bot\""), Error);
  CHECK_THROWS_WITH_AS(data::read_conversations(write("c.jsonl", "\n\n{\"messages\": [\n")),
                       doctest::Contains("c.jsonl:3: not JSON"), Error);
  CHECK_THROWS_WITH_AS(
      data::read_conversations(write("d.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}")),
      doctest::Contains("d.jsonl:1: \"messages\": message 0 must be an object"), Error);
  std::filesystem::remove_all(dir);
}
