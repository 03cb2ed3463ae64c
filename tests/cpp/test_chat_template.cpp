// Chat templates (include/diffattn/tokenize/chat_template.h): every vector of
// ../shared/data/chat_templates/vectors.jsonl (real templates rendered by Python's jinja2 in
// transformers' environment) byte for byte, then the engine feature by feature against
// renderings jinja2 gives (each expected string below was produced by jinja2 3.1 with
// transformers' settings), the error positions and every limit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "diffattn/tokenize/chat_template.h"
#include "temp_dir.h"

using diffattn::tokenize::ChatTemplate;
using diffattn::tokenize::ChatTemplateLimits;
using diffattn::tokenize::DateTime;
using diffattn::tokenize::ModelChatTemplates;
using diffattn::tokenize::RenderOptions;
using diffattn::tokenize::TemplateError;
using json = nlohmann::ordered_json;
using Kind = TemplateError::Kind;

namespace {

std::string data_dir() {
  if (const char* env = std::getenv("DIFFATTN_CHAT_TEMPLATE_DATA")) return env;
  return DIFFATTN_CHAT_TEMPLATE_DATA_DEFAULT;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The vectors' strftime_now date (render.py's FIXED_NOW).
DateTime fixed_now() { return DateTime{2024, 7, 26, 12, 0, 0, 0}; }

// The variables every feature test renders with (jinja2 rendered the expectations with the same).
json vars() {
  return json::parse(R"({"l": [3, 1, 2], "d": {"a": 1, "items": 2, "b": null}, "s": "Hello World", "e": [],
    "n": null, "u": "h\u00e9llo w\u00f6rld \u01c5 \u00df \u03a3",
    "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " yo "}]})");
}

std::string R(const std::string& src) {
  RenderOptions o;
  o.extra = vars();
  o.now = fixed_now();
  return ChatTemplate::parse(src, "t").render(json::array(), o);
}

// The error a template raises (parsing or rendering); a test failure when there is none.
TemplateError E(const std::string& src, const json& messages = json::array(), const ChatTemplateLimits& lim = {},
                RenderOptions o = {}) {
  try {
    if (o.extra.empty()) o.extra = vars();
    const std::string out = ChatTemplate::parse(src, "t.jinja", lim).render(messages, o);
    ADD_FAILURE() << "no error for " << src << " (rendered " << out.substr(0, 200) << ")";
  } catch (const TemplateError& e) {
    return e;
  }
  return TemplateError(Kind::kSyntax, "", "", 0, 0);
}

}  // namespace

TEST(ChatTemplateVectors, EveryVectorMatchesJinja2) {
  const std::string dir = data_dir();
  std::ifstream f(dir + "/vectors.jsonl");
  if (!f) GTEST_SKIP() << "no chat template vectors at " << dir << "/vectors.jsonl (set DIFFATTN_CHAT_TEMPLATE_DATA)";
  std::map<std::string, ChatTemplate> templates;
  std::string line;
  int renderings = 0, errors = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const json v = json::parse(line);
    const std::string name = v["template"].get<std::string>();
    if (!templates.count(name)) {
      templates.emplace(name, ChatTemplate::parse(read_text(dir + "/templates/" + name), name));
    }
    RenderOptions o;
    o.add_generation_prompt = v["add_generation_prompt"].get<bool>();
    o.tools = v["tools"];
    if (!v["bos_token"].is_null()) o.bos_token = v["bos_token"].get<std::string>();
    if (!v["eos_token"].is_null()) o.eos_token = v["eos_token"].get<std::string>();
    o.now = fixed_now();
    const std::string what = name + " / " + v["conversation"].get<std::string>() +
                             (o.add_generation_prompt ? " / generation prompt" : "");
    if (v.contains("expected")) {
      ++renderings;
      std::string got;
      try {
        got = templates.at(name).render(v["messages"], o);
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": threw " << e.what();
        continue;
      }
      EXPECT_EQ(got, v["expected"].get<std::string>()) << what;
    } else {
      ++errors;
      try {
        const std::string got = templates.at(name).render(v["messages"], o);
        ADD_FAILURE() << what << ": rendered where jinja2 raised " << v["expected_error_type"] << ": " << got;
      } catch (const TemplateError& e) {
        if (v["expected_error_type"] == "TemplateError") {
          EXPECT_EQ(e.kind(), Kind::kRaised) << what;
          EXPECT_EQ(e.message(), v["expected_error"].get<std::string>()) << what;
        }
      }
    }
  }
  EXPECT_EQ(renderings, 134);
  EXPECT_EQ(errors, 12);
}

// The server renders one parsed template from many threads at once.
TEST(ChatTemplateVectors, ConcurrentRendersOfOneTemplateAgree) {
  const std::string dir = data_dir();
  std::ifstream f(dir + "/templates/meta-llama-Llama-3.3-70B-Instruct.jinja");
  if (!f) GTEST_SKIP() << "no chat templates at " << dir << " (set DIFFATTN_CHAT_TEMPLATE_DATA)";
  std::stringstream ss;
  ss << f.rdbuf();
  const ChatTemplate t = ChatTemplate::parse(ss.str(), "llama-3.3");
  const json msgs = json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi é"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": [1, 2]}}}]},
    {"role": "tool", "content": "{\"t\": 1}"}, {"role": "user", "content": "And?"}])");
  RenderOptions o;
  o.add_generation_prompt = true;
  o.bos_token = "<|begin_of_text|>";
  o.tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}])");
  o.now = fixed_now();
  const std::string want = t.render(msgs, o);
  std::vector<std::thread> threads;
  std::vector<int> wrong(8, 0);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) wrong[static_cast<size_t>(k)] += t.render(msgs, o) != want;
    });
  }
  for (auto& th : threads) th.join();
  for (int w : wrong) EXPECT_EQ(w, 0);
  EXPECT_NE(want.find("26 Jul 2024"), std::string::npos);
}

// ---- features: every expected string is jinja2 3.1's rendering in transformers' environment ----

TEST(ChatTemplateJinja2, WhitespaceControl) {
  EXPECT_EQ(R("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(R("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(R("a  {% if true %}b{% endif %}  c"), "a  b  c");
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
  EXPECT_EQ(R("a \n {%- if true -%} \n b \n {%- endif -%} \n c"), "abc");
  EXPECT_EQ(R("a\n  {{ 'x' }}\n  {{- 'y' -}}  \n z"), "a\n  xyz");
  EXPECT_EQ(R("  {# comment #}\nx\n  {#- c -#}  y\n{#+ c +#}\nz"), "xy\n\nz");
  EXPECT_EQ(R("{% raw %}  {{ not evaluated }} {% if %}{% endraw %}\n!"), "  {{ not evaluated }} {% if %}!");
  EXPECT_EQ(R("a\n  {%- raw -%}  r  {%- endraw -%}  \nb"), "arb");
  EXPECT_EQ(R("a\n\t {% for i in [1, 2] %}\n\t {{ i }}\n\t {% endfor %}\nend\n"), "a\n\t 1\n\t 2\nend");
  EXPECT_EQ(R("line\r\nbreaks\r{% if true %}\r\nkept{% endif %}"), "line\nbreaks\nkept");
  EXPECT_EQ(R("x \xe3\x80\x80""\n\xc2\xa0""{%- if true %}y{% endif %}"), "xy");
  EXPECT_EQ(R("{{ 'a' }}\n{{ 'b' }}\n{# trailing newline is dropped #}\n"), "a\nb\n");
  EXPECT_EQ(R("text\n\n"), "text\n");
  EXPECT_EQ(R("{% if true %}  \n  kept: spaces after the tag's newline\n{% endif %}"), "  \n  kept: spaces after the tag's newline\n");
}

TEST(ChatTemplateJinja2, Expressions) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 10 / 4 }}|{{ 10 // 4 }}|{{ 10 % 4 }}|{{ -10 // 4 }}|{{ 10.5 // 4 }}|{{ -10.5 % 4 }}|{{ 7 % -2 }}"), "7|9|64|4|2.5|2|2|-3|2.0|1.5|-1");
  EXPECT_EQ(R("{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' < 'b' }}|{{ [1, 2] < [1, 3] }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ none == none }}|{{ 1 != '1' }}"), "True|True|True|True|True|False|True|True");
  EXPECT_EQ(R("{{ 'a' in 'abc' }}|{{ 1 in l }}|{{ 'a' in d }}|{{ 'z' not in d }}|{{ 4 not in l }}|{{ 'x' in e }}|{{ 'x' in undefined_name }}"), "True|True|True|True|True|False|False");
  EXPECT_EQ(R("{{ 1 if s else 2 }}|{{ 1 if n else 2 }}|{{ 1 if n }}|{{ s and 'yes' }}|{{ n or 'no' }}|{{ not s }}|{{ not n and 0 }}|{{ e or l }}"), "1|2||yes|no|False|0|[3, 1, 2]");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ 2.0 ~ none ~ true ~ undefined_name }}|{{ 'a' + 'b' }}|{{ l + [4] }}|{{ (1, 2) + (3,) }}|{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ [1] * 3 }}|{{ 'a' * -1 }}|{{ true + 1 }}|{{ 1.5 + 1 }}"), "a12.0NoneTrue|ab|[3, 1, 2, 4]|(1, 2, 3)|ababab|ababab|[1, 1, 1]||2|2.5");
  EXPECT_EQ(R("{{ s|length + 1 }}|{{ 'a' ~ 'b'|upper }}|{{ -1|abs }}|{{ not 1 == 2 }}|{{ 2 * 3|string }}"), "12|aB|1|True|33");
  EXPECT_EQ(R("{{ 'a' 'b' }}|{{ 'it\\'s' }}|{{ \"\\x41\\u00e9\\t\\101\" }}|{{ '\\d\\w' }}|{{ 1_000 }}|{{ 0x1f }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1e3 }}|{{ 1.5e-3 }}|{{ True }}{{ None }}{{ FALSE is defined }}"), "ab|it's|A\xc3\xa9""\tA|\\d\\w|1000|31|15|5|1000.0|0.0015|TrueNoneFalse");
  EXPECT_EQ(R("{{ [1, 'a', none] }}|{{ {'k': [1, {'j': none}], 2: true} }}|{{ (1,) }}|{{ () }}|{{ (1, 'a') }}|{{ [1, 2,] }}|{{ {'a': 1,} }}"), "[1, 'a', None]|{'k': [1, {'j': None}], 2: True}|(1,)|()|(1, 'a')|[1, 2]|{'a': 1}");
}

TEST(ChatTemplateJinja2, Printing) {
  EXPECT_EQ(R("{{ l }}|{{ d }}|{{ [none, true, 1.0, \"it's\", 'say \"hi\"', \"both ' \\\"\"] }}"), "[3, 1, 2]|{'a': 1, 'items': 2, 'b': None}|[None, True, 1.0, \"it's\", 'say \"hi\"', 'both \\' \"']");
  EXPECT_EQ(R("{{ [\"\\x01\\u200d\\u00a0\\u00e9\\U0001F600\\n\\t\\\\\"] }}"), "['\\x01\\u200d\\xa0\xc3\xa9""\xf0\x9f\x98\x80""\\n\\t\\\\']");
  EXPECT_EQ(R("{{ 1.0 }}|{{ 1e16 }}|{{ 1e15 + 0.5 }}|{{ 0.1 + 0.2 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ -0.0 }}|{{ 123456789012345678 }}|{{ 1.5e300 * 1e10 }}|{{ 2.5e-7 }}|{{ 100.0 }}"), "1.0|1e+16|1000000000000000.5|0.30000000000000004|1e-05|0.0001|-0.0|123456789012345678|inf|2.5e-07|100.0");
  EXPECT_EQ(R("{{ range(3) }}|{{ range(1, 10, 3) }}|{{ d.items() }}|{{ d.keys() }}|{{ d.values() }}"), "range(0, 3)|range(1, 10, 3)|dict_items([('a', 1), ('items', 2), ('b', None)])|dict_keys(['a', 'items', 'b'])|dict_values([1, 2, None])");
  EXPECT_EQ(R("{% set ns = namespace(a=1, b=[1]) %}{{ ns }}|{% macro m() %}{% endmacro %}{{ m }}|{% for i in l %}{{ loop }}{% endfor %}"), "<Namespace {'a': 1, 'b': [1]}>|<Macro 'm'>|<LoopContext 1/3><LoopContext 2/3><LoopContext 3/3>");
}

TEST(ChatTemplateJinja2, Access) {
  EXPECT_EQ(R("{{ msgs[0].role }}|{{ msgs[0]['content'] }}|{{ msgs.0.role }}|{{ msgs[-1].content }}|{{ d.a }}|{{ d['a'] }}"), "user|hi|user| yo |1|1");
  EXPECT_EQ(R("{{ d.items is defined }}|{{ d['items'] }}|{{ d.zz is defined }}|{{ d['zz'] is defined }}|{{ l.foo is defined }}|{{ n.foo is defined }}|{{ n['x'] is defined }}"), "True|2|False|False|False|False|False");
  EXPECT_EQ(R("{{ s[0] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::2] }}|{{ s[::-1] }}|{{ s[-3:] }}|{{ s[:-3] }}|{{ s[100:] }}|{{ s[5] }}{{ s[50] }}"), "H|d|el|HloWrd|dlroW olleH|rld|Hello Wo|| ");
  EXPECT_EQ(R("{{ u[1:4] }}|{{ u[::-1] }}|{{ u[3] }}|{{ u[-1] }}|{{ u[::3] }}"), "\xc3\xa9""ll|\xce\xa3"" \xc3\x9f"" \xc7\x85"" dlr\xc3\xb6""w oll\xc3\xa9""h|l|\xce\xa3""|hlwl\xc7\x85"" ");
  EXPECT_EQ(R("{{ l[::-1] }}|{{ l[1:] }}|{{ l[-2:] }}|{{ l[5] }}|{{ l[-5:-1] }}|{{ l[::-2] }}|{{ l[3:0:-1] }}|{{ l[:] }}|{{ range(10)[2:8:2] }}"), "[2, 1, 3]|[1, 2]|[1, 2]||[3, 1]|[2, 3]|[2, 1]|[3, 1, 2]|range(2, 8, 2)");
}

TEST(ChatTemplateJinja2, Loops) {
  EXPECT_EQ(R("{% for i in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.depth }}{{ loop.depth0 }};{% endfor %}"), "1032TrueFalse3110;2121FalseFalse33210;3210FalseTrue3110;");
  EXPECT_EQ(R("{% for i in l if i > 1 %}{{ i }}{{ loop.index }}/{{ loop.length }} {% endfor %}|{% for i in e %}x{% else %}empty{% endfor %}|{% for i in l if i > 5 %}x{% else %}none passed{% endfor %}"), "31/2 22/2 |empty|none passed");
  EXPECT_EQ(R("{% for c in 'ab' %}{{ c }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for a, b in ['xy', 'zw'] %}{{ b }}{% endfor %}|{% for x in undefined_name %}x{% else %}else{% endfor %}"), "ab|aitemsb|a=1;items=2;b=None;|yw|else");
  EXPECT_EQ(R("{% for i in l %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}|{% for i in l %}{% if i == 1 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in l %}{% for j in l %}{% if j == 1 %}{% break %}{% endif %}{{ i }}{{ j }} {% endfor %}{% endfor %}"), "32|3|33 13 23 ");
  EXPECT_EQ(R("{% for i in l %}{{ loop.cycle('odd', 'even') }}{{ loop.changed(i > 1) }} {% endfor %}"), "oddTrue evenTrue oddTrue ");
  EXPECT_EQ(R("{% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}{% for i in [1, 2] %}{% set outer = loop %}{% for j in [3] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}"), "121|122|1121");
  EXPECT_EQ(R("{% set x = 5 %}{% for i in l %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}|{% for i in l %}{% if loop.first %}{% set y = 1 %}{% endif %}[{{ y }}]{% endfor %}|{% for i in l %}{% set z = i %}{% endfor %}{{ z }}"), "5351525|[1][][]|");
}

TEST(ChatTemplateJinja2, SetNamespaceWith) {
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set p, q = [1, 2] %}{{ q }}|{% if true %}{% set z = 3 %}{% endif %}{{ z }}"), "12|2|3");
  EXPECT_EQ(R("{% set ns = namespace(n=0, items=[]) %}{% for i in l %}{% set ns.n = ns.n + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.n }} {{ ns.items }}"), "6 [3, 1, 2]");
  EXPECT_EQ(R("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}|{% set ns2 = namespace() %}{% set ns2.x = 'v' %}{{ ns2['x'] }}"), "12|v");
  EXPECT_EQ(R("{% set x %}a{{ 1 }}b{% endset %}{{ x }}|{% set y | upper %}ab{% endset %}{{ y }}|{% filter upper %}abc {{ s }}{% endfilter %}|{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}"), "a1b|AB|ABC HELLO WORLD|3");
  EXPECT_EQ(R("{{ dict(a=1, b=2) }}|{{ dict([('x', 1)]) }}|{{ dict({'a': 1}, c=3) }}|{% set j = joiner(', ') %}{% for i in l %}{{ j() }}{{ i }}{% endfor %}"), "{'a': 1, 'b': 2}|{'x': 1}|{'a': 1, 'c': 3}|3, 1, 2");
}

TEST(ChatTemplateJinja2, Macros) {
  EXPECT_EQ(R("{% macro m(a, b=2, c=a) %}[{{ a }},{{ b }},{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c=9) }}{{ m() }}"), "[1,2,1][1,3,1][1,2,9][,2,]");
  EXPECT_EQ(R("{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, k=3) }}|{% macro w(a) %}{{ a }}{{ varargs }}{% endmacro %}{{ w(1, 2, 3) }}"), "(1, 2){'k': 3}|1(2, 3)");
  EXPECT_EQ(R("{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inner{% endcall %}|{% macro li(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) li(l) %}[{{ x }}]{% endcall %}"), "<inner>|[3][1][2]");
  EXPECT_EQ(R("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}|{% set g = 1 %}{% macro m() %}{{ g }}{{ s }}{% endmacro %}{% set g = 2 %}{{ m() }}"), "120|2Hello World");
  EXPECT_EQ(R("{% macro m(x) %}{% set x = x + 1 %}{{ x }}{% endmacro %}{% set x = 10 %}{{ m(1) }}{{ x }}|{{ m is callable }}"), "210|True");
}

TEST(ChatTemplateJinja2, Filters) {
  EXPECT_EQ(R("{{ s|length }}|{{ u|length }}|{{ l|length }}|{{ d|length }}|{{ l|count }}|{{ e|length }}|{{ undefined_name|length }}"), "11|17|3|3|3|0|0");
  EXPECT_EQ(R("{{ u|upper }}|{{ u|lower }}|{{ u|title }}|{{ u|capitalize }}|{{ 'hello-world (x) [y]'|title }}|{{ '\xc3\x89""COLE'|lower }}|{{ '\xce\xa3""\xce\x91""\xce\xa3""'|lower }}"), "H\xc3\x89""LLO W\xc3\x96""RLD \xc7\x84"" SS \xce\xa3""|h\xc3\xa9""llo w\xc3\xb6""rld \xc7\x86"" \xc3\x9f"" \xcf\x83""|H\xc3\xa9""llo W\xc3\xb6""rld \xc7\x84"" SS \xce\xa3""|H\xc3\xa9""llo w\xc3\xb6""rld \xc7\x86"" \xc3\x9f"" \xcf\x83""|Hello-World (X) [Y]|\xc3\xa9""cole|\xcf\x83""\xce\xb1""\xcf\x82""");
  EXPECT_EQ(R("{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ '\\u3000a\\u00a0'|trim }}|{{ none|trim }}|{{ s|replace('o', '0') }}|{{ s|replace('l', 'L', 2) }}|{{ s|wordcount }}|{{ 'x, y; z'|wordcount }}"), "a b|a|a|None|Hell0 W0rld|HeLLo World|2|3");
  EXPECT_EQ(R("{{ l|first }}|{{ l|last }}|{{ e|first is defined }}|{{ s|first }}|{{ s|last }}|{{ d|first }}"), "3|2|False|H|d|a");
  EXPECT_EQ(R("{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ ['b', 'A', 'c']|sort }}|{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}|{{ msgs|sort(attribute='role')|map(attribute='role')|list }}"), "[1, 2, 3]|[3, 2, 1]|['A', 'b', 'c']|['A', 'b', 'c']|['assistant', 'user']");
  EXPECT_EQ(R("{{ l|join }}|{{ l|join(', ') }}|{{ msgs|join(',', attribute='role') }}|{{ [1, none, 'a']|join('|') }}"), "312|3, 1, 2|user,assistant|1|None|a");
  EXPECT_EQ(R("{{ msgs|map(attribute='content')|list }}|{{ l|map('string')|list }}|{{ ['a', 'b']|map('upper')|join }}|{{ msgs|map(attribute='missing', default='D')|list }}|{{ l|map('default', 0)|list }}"), "['hi', ' yo ']|['3', '1', '2']|AB|['D', 'D']|[3, 1, 2]");
  EXPECT_EQ(R("{{ msgs|selectattr('role', 'equalto', 'user')|list }}|{{ msgs|rejectattr('role', 'equalto', 'user')|list|length }}|{{ l|select('odd')|list }}|{{ l|reject('odd')|list }}|{{ [0, 1, '', 'a', none]|select|list }}|{{ l|select('>', 1)|list }}"), "[{'role': 'user', 'content': 'hi'}]|1|[3, 1]|[2]|[1, 'a']|[3, 2]");
  EXPECT_EQ(R("{{ [1, 2, 1, 3]|unique|list }}|{{ ['a', 'A', 'b']|unique|list }}|{{ l|reverse|list }}|{{ 'abc'|reverse }}|{{ l|sum }}|{{ l|max }}|{{ l|min }}|{{ ['a', 'B']|max }}|{{ l|sum(start=10) }}"), "[1, 2, 3]|['a', 'b']|[2, 1, 3]|cba|6|3|1|B|16");
  EXPECT_EQ(R("{{ '42'|int }}|{{ '42.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(5) }}|{{ 3.9|int }}|{{ '0x1F'|int(base=16) }}|{{ '3.5'|float }}|{{ 'x'|float }}|{{ 3|float }}|{{ ' 1_0 '|int }}|{{ '1e3'|float }}"), "42|42|0|5|3|31|3.5|0.0|3.0|10|1000.0");
  EXPECT_EQ(R("{{ -3|abs }}|{{ -3.5|abs }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 2.1|round(method='ceil') }}|{{ 2.9|round(method='floor') }}|{{ 15|round(-1) }}|{{ 25|round(-1) }}|{{ 1.23456|round(3) }}|{{ 7|round }}"), "3|3.5|2.0|4.0|2.67|3.0|2.0|20|20|1.235|7");
  EXPECT_EQ(R("{{ undefined_name|default('D') }}|{{ n|default('D') }}|{{ ''|default('D', true) }}|{{ undefined_name|d('y') }}|{{ d.b|default('bd') }}|{{ d.zz|default('zd') }}"), "D|None|D|y|None|zd");
  EXPECT_EQ(R("{{ d|items|list }}|{{ d|dictsort }}|{{ d|dictsort(reverse=true) }}|{{ {'b': 1, 'a': 2}|dictsort(by='value') }}|{{ undefined_name|items|list }}"), "[('a', 1), ('items', 2), ('b', None)]|[('a', 1), ('b', None), ('items', 2)]|[('items', 2), ('b', None), ('a', 1)]|[('b', 1), ('a', 2)]|[]");
  EXPECT_EQ(R("{{ l|tojson }}|{{ d|tojson }}|{{ {'b': 1, 'a': [1, 2]}|tojson(indent=4) }}|{{ '\\u00e9\\n\"\\\\\\u007f'|tojson }}|{{ '\\u00e9\\U0001F600'|tojson(ensure_ascii=true) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}"), "[3, 1, 2]|{\"a\": 1, \"items\": 2, \"b\": null}|{\n    \"b\": 1,\n    \"a\": [\n        1,\n        2\n    ]\n}|\"\xc3\xa9""\\n\\\"\\\\\x7f""\"|\"\\u00e9\\ud83d\\ude00\"|{\"a\": 1, \"b\": null, \"items\": 2}|{\"a\":1,\"items\":2,\"b\":null}");
  EXPECT_EQ(R("{{ 1.0|tojson }}|{{ [1.5e300, 1e-7, -0.0]|tojson }}|{{ {}|tojson(indent=2) }}|{{ [[]]|tojson(indent=2) }}|{{ {1: 2, none: 3, true: 4, 1.5: 5}|tojson }}|{{ [1, [2]]|tojson(indent='--') }}|{{ (1, 2)|tojson }}"), "1.0|[1.5e+300, 1e-07, -0.0]|{}|[\n  []\n]|{\"1\": 4, \"null\": 3, \"1.5\": 5}|[\n--1,\n--[\n----2\n--]\n]|[1, 2]");
  EXPECT_EQ(R("{{ 'a\\tb'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}"), "a\tb|a\n  b\n\n  c|  a\n  b|a\n  \n  b|a\n> b");
  EXPECT_EQ(R("{{ l|list }}|{{ 'abc'|list }}|{{ d|list }}|{{ undefined_name|list }}|{{ n|string }}|{{ 1.5|string }}|{{ l|string }}|{{ l|batch(2)|list }}|{{ l|batch(2, 0)|list }}"), "[3, 1, 2]|['a', 'b', 'c']|['a', 'items', 'b']|[]|None|1.5|[3, 1, 2]|[[3, 1], [2]]|[[3, 1], [2, 0]]");
  EXPECT_EQ(R("{{ '<a href=\\'x\\'>&</a>'|e }}|{{ '<b>'|escape }}|{{ '<b>'|safe }}|{{ 'abc'|attr('upper') is callable }}|{{ d|attr('a') is defined }}|{{ 'x'|center(5) }}|{{ '%s-%d'|format('a', 3) }}"), "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;|&lt;b&gt;|<b>|True|False|  x  |a-3");
}

TEST(ChatTemplateJinja2, Tests) {
  EXPECT_EQ(R("{{ s is string }}|{{ 1 is number }}|{{ 1 is integer }}|{{ 1.0 is float }}|{{ true is boolean }}|{{ true is number }}|{{ true is integer }}|{{ d is mapping }}"), "True|True|True|True|True|True|False|True");
  EXPECT_EQ(R("{{ l is iterable }}|{{ s is iterable }}|{{ 1 is iterable }}|{{ l is sequence }}|{{ d is sequence }}|{{ undefined_name is defined }}|{{ undefined_name is undefined }}|{{ n is none }}|{{ n is not none }}"), "True|True|False|True|True|False|True|True|False");
  EXPECT_EQ(R("{{ 3 is odd }}|{{ 4 is even }}|{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(4) }}|{{ 1 is eq 1 }}|{{ 1 is ne 2 }}|{{ 1 is lt 2 }}|{{ 2 is ge 2 }}|{{ 2 is gt 2 }}|{{ 2 is le 2 }}|{{ 1 is in l }}|{{ 'a' is in 'abc' }}"), "True|True|True|False|True|True|True|True|False|True|True|True");
  EXPECT_EQ(R("{{ s is true }}|{{ true is true }}|{{ false is false }}|{{ 0 is false }}|{{ 'abc' is lower }}|{{ 'ABC' is upper }}|{{ n is sameas none }}|{{ true is sameas true }}|{{ l is sameas l }}|{{ range is callable }}|{{ s is callable }}|{{ 'upper' is filter }}|{{ 'odd' is test }}|{{ 'nope' is filter }}"), "False|True|True|False|True|True|True|True|True|True|False|True|True|False");
  EXPECT_EQ(R("{{ 1 is equalto 1 }}|{{ 3 is greaterthan 2 }}|{{ 3 is lessthan 2 }}|{{ 3.0 is odd }}|{{ 'ab' is sequence }}|{{ d.items() is sequence }}|{{ l|select is iterable }}"), "True|True|False|True|True|False|True");
}

TEST(ChatTemplateJinja2, StringMethods) {
  EXPECT_EQ(R("{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ '  a  b  c '.split(None, 1) }}|{{ '  a  b  c '.rsplit(None, 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ''.split() }}|{{ ''.split(',') }}|{{ 'a b'.split(maxsplit=0) }}"), "['Hello', 'World']|['a', 'b', '', 'c']|['a', 'b c']|['a', 'b  c ']|['  a  b', 'c']|['a,b', 'c']|[]|['']|['a b']");
  EXPECT_EQ(R("{{ s.startswith('He') }}|{{ s.endswith('ld') }}|{{ s.startswith(('x', 'H')) }}|{{ s.startswith('llo', 2) }}|{{ s.find('o') }}|{{ s.rfind('o') }}|{{ s.find('o', 5) }}|{{ s.count('l') }}|{{ u.find('w') }}|{{ s.index('W') }}"), "True|True|True|True|4|7|7|3|6|6");
  EXPECT_EQ(R("{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ 'ab'.replace('', '-') }}|{{ s.upper() }}|{{ s.lower() }}|{{ u.title() }}|{{ u.swapcase() }}|{{ u.capitalize() }}|{{ 'hELLO wORLD'.capitalize() }}"), "HeLLo WorLd|HeLlo World|-a-b-|HELLO WORLD|hello world|H\xc3\xa9""llo W\xc3\xb6""rld \xc7\x85"" Ss \xce\xa3""|H\xc3\x89""LLO W\xc3\x96""RLD \xc7\x85"" SS \xcf\x83""|H\xc3\xa9""llo w\xc3\xb6""rld \xc7\x86"" \xc3\x9f"" \xcf\x83""|Hello world");
  EXPECT_EQ(R("{{ '  a  '.strip() }}|{{ '..a..'.lstrip('.') }}|{{ '..a..'.rstrip('.') }}|{{ 'xyax'.strip('xy') }}|{{ '\\n\\ta'.lstrip() }}"), "a|a..|..a|a|a");
  EXPECT_EQ(R("{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{x}!'.format(x=3) }}|{{ '{!r}'.format('q') }}|{{ '{{}}'.format() }}|{{ '%s-%d' % ('a', 3) }}|{{ '%5.2f|%-4d|%04d|%x|%o|%e' % (3.14159, 7, 42, 255, 8, 12345.678) }}|{{ '%(a)s' % {'a': 1} }}|{{ '%.3s|%5s|%c' % ('abcdef', 'ab', 65) }}"), "1 and b|aba|3!|'q'|{}|a-3| 3.14|7   |0042|ff|10|1.234568e+04|1|abc|   ab|A");
  EXPECT_EQ(R("{{ s.center(15, '*') }}|{{ s.ljust(13, '.') }}|{{ s.rjust(13) }}|{{ '42'.zfill(5) }}|{{ '-42'.zfill(5) }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'abc'.removeprefix('a') }}|{{ 'abc'.removesuffix('c') }}"), "**Hello World**|Hello World..|  Hello World|00042|-0042|('a', '=', 'b=c')|('a=b', '=', 'c')|bc|ab");
  EXPECT_EQ(R("{{ 'abc'.isalpha() }}|{{ '123'.isdigit() }}|{{ 'a1'.isalnum() }}|{{ '  '.isspace() }}|{{ 'Hello World'.istitle() }}|{{ 'abc'.islower() }}|{{ 'ABC'.isupper() }}|{{ ''.isalpha() }}|{{ '\\u00bd'.isnumeric() }}|{{ '\\u00bd'.isdigit() }}"), "True|True|True|True|True|True|True|False|True|False");
  EXPECT_EQ(R("{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'a\\nb\\n'.splitlines(true) }}|{{ ','.join(['a', 'b']) }}|{{ '-'.join('abc') }}|{{ d.get('a') }}|{{ d.get('zz', 5) }}|{{ d.get('zz') }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ l.index(1) }}|{{ l.count(3) }}|{{ l.copy() }}"), "['a', 'b', 'c']|['a\\n', 'b\\n']|a,b|a-b-c|1|5|None|['a', 'items', 'b']|[1, 2, None]|1|1|[3, 1, 2]");
}

TEST(ChatTemplateJinja2, Undefined) {
  EXPECT_EQ(R("[{{ undefined_name }}]|{{ undefined_name|length }}|{{ undefined_name is iterable }}|{{ undefined_name is sequence }}|{{ undefined_name is callable }}|{{ undefined_name is none }}|{{ undefined_name == undefined_name }}|{{ undefined_name|string }}|{{ undefined_name|upper }}|{{ undefined_name|join }}|{{ undefined_name|first is defined }}"), "[]|0|True|True|True|False|True||||False");
  EXPECT_EQ(R("[{{ d.zz }}]|[{{ l[9] }}]|[{{ n.x }}]|[{{ n['x'] }}]|[{{ 5.x }}]|[{{ d.update }}]|{{ d.zz is defined }}|{{ (1 if n) is defined }}|{{ l[9] is defined }}|{% if undefined_name %}t{% else %}f{% endif %}"), "[]|[]|[]|[]|[]|[]|False|False|False|f");
}

// ---- errors: kinds, messages and positions ----

TEST(ChatTemplateErrors, RaiseExceptionIsTheTemplatesMessageWithItsPosition) {
  const TemplateError e =
      E("{% for m in messages %}\n  {% if m.role == 'user' %}{{ raise_exception('Roles must alternate: ' ~ m.role) }}{% endif %}"
        "{% endfor %}",
        json::array({{{"role", "user"}, {"content", "x"}}}));
  EXPECT_EQ(e.kind(), Kind::kRaised);
  EXPECT_EQ(e.message(), "Roles must alternate: user");
  EXPECT_EQ(e.template_name(), "t.jinja");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.column(), 31);  // where raise_exception starts
  EXPECT_EQ(std::string(e.what()), "t.jinja, line 2, column 31: Roles must alternate: user");
}

TEST(ChatTemplateErrors, SyntaxErrorsNameLineAndColumn) {
  TemplateError e = E("ok\n{% for x in %}{% endfor %}");
  EXPECT_EQ(e.kind(), Kind::kSyntax);
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.column(), 13);
  EXPECT_EQ(e.message(), "Expected an expression, got 'end of statement block'");
  e = E("{% if x %}\n  {% for y in z %}\n{% endif %}");
  EXPECT_EQ(e.line(), 3);
  EXPECT_NE(e.message().find("Encountered unknown tag 'endif'. You probably made a nesting mistake"), std::string::npos)
      << e.message();
  e = E("{% if x %}never closed");
  EXPECT_NE(e.message().find("unexpected end of template"), std::string::npos) << e.message();
  EXPECT_EQ(E("{{ x | nosuchfilter }}").message(), "No filter named 'nosuchfilter'.");
  EXPECT_EQ(E("{{ x is nosuchtest }}").message(), "No test named 'nosuchtest'.");
  EXPECT_EQ(E("{% break %}").message(), "'break' outside loop");
  EXPECT_EQ(E("{{ 'a' @ 1 }}").message(), "unexpected char '@' at 7");
  EXPECT_EQ(E("{{ (1 ] }}").message(), "unexpected ']', expected ')'");
  EXPECT_EQ(E("{# open").message(), "Missing end of comment tag");
  EXPECT_EQ(E("{% raw %}open").message(), "Missing end of raw directive");
  EXPECT_NE(E("{% include 'x' %}").message().find("'include' tag is not supported"), std::string::npos);
  EXPECT_EQ(E("{% for x in y recursive %}{% endfor %}").message(), "recursive loops are not supported");
  EXPECT_EQ(E(std::string("{{ '\xff' }}")).message(), "the template is not valid UTF-8 (byte offset 4)");
  // Column in code points: the error after "é" is one column further, not two.
  EXPECT_EQ(E("\xc3\xa9{{ 1 +  }}").column(), 10);
}

TEST(ChatTemplateErrors, UnknownFilterInAnUntakenIfIsAnErrorOnlyWhenReached) {
  EXPECT_EQ(R("{% if false %}{{ x | nosuchfilter }}{% endif %}ok"), "ok");
  EXPECT_EQ(R("{{ 1 if true else x | nosuchfilter }}"), "1");
  EXPECT_EQ(E("{% if true %}{{ x | nosuchfilter }}{% endif %}").message(), "No filter named 'nosuchfilter' found.");
  // A loop body is not "inside the if" for jinja2's compiler: an error when parsing.
  EXPECT_EQ(E("{% if false %}{% for i in l %}{{ i | nosuchfilter }}{% endfor %}{% endif %}").message(),
            "No filter named 'nosuchfilter'.");
}

TEST(ChatTemplateErrors, RuntimeErrorsAsPythonRaisesThem) {
  struct Case {
    const char* src;
    Kind kind;
    const char* message;
  };
  const Case cases[] = {
      {"{{ x.y }}", Kind::kUndefined, "'x' is undefined"},
      {"{{ d.zz.y }}", Kind::kUndefined, "'dict object' has no attribute 'zz'"},
      {"{{ l[5].x }}", Kind::kUndefined, "list object has no element 5"},
      {"{{ x + 1 }}", Kind::kUndefined, "'x' is undefined"},
      {"{{ n + 1 }}", Kind::kType, "unsupported operand type(s) for +: 'NoneType' and 'int'"},
      {"{{ 'a' + 1 }}", Kind::kType, "can only concatenate str (not \"int\") to str"},
      {"{{ 'a' + d }}", Kind::kType, "can only concatenate str (not \"dict\") to str"},
      {"{{ l.append(4) }}", Kind::kSecurity, "access to attribute 'append' of 'list' object is unsafe."},
      {"{{ d.update({}) }}", Kind::kSecurity, "access to attribute 'update' of 'dict' object is unsafe."},
      {"{{ 1 / 0 }}", Kind::kValue, "division by zero"},
      {"{{ 1 % 0 }}", Kind::kValue, "integer division or modulo by zero"},
      {"{{ 'abc' < 1 }}", Kind::kType, "'<' not supported between instances of 'str' and 'int'"},
      {"{{ n|length }}", Kind::kType, "object of type 'NoneType' has no len()"},
      {"{% for i in 5 %}{% endfor %}", Kind::kType, "'int' object is not iterable"},
      {"{% for a, b in [1] %}{% endfor %}", Kind::kType, "'int' object is not iterable"},
      {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", Kind::kValue, "too many values to unpack (expected 2)"},
      {"{{ [1, 'a']|sort }}", Kind::kType, "'<' not supported between instances of 'str' and 'int'"},
      {"{{ x|tojson }}", Kind::kType, "Object of type Undefined is not JSON serializable"},
      {"{{ 'abc'.index('z') }}", Kind::kValue, "substring not found"},
      {"{{ 'x'() }}", Kind::kType, "'str' object is not callable"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", Kind::kType, "macro 'm' takes not more than 1 argument(s)"},
      {"{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}", Kind::kUndefined, "No caller defined"},
      {"{% set n2 = 5 %}{% set n2.a = 1 %}", Kind::kType, "cannot assign attribute on non-namespace object"},
      {"{% set ns = namespace() %}{% set ns._p = 1 %}", Kind::kSecurity,
       "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '_p'. Please rename the attribute."},
      {"{{ range(1, 2, 0) }}", Kind::kValue, "range() arg 3 must not be zero"},
      {"{{ [1][1:2:0] }}", Kind::kValue, "slice step cannot be zero"},
      // A slice is Python's own subscript in jinja2 (not the sandbox's getitem): errors, not undefined.
      {"{{ l[1:'a'] }}", Kind::kType, "slice indices must be integers or None or have an __index__ method"},
      {"{{ d[1:2] }}", Kind::kType, "unhashable type: 'slice'"},
      {"{{ n[1:] }}", Kind::kType, "'NoneType' object is not subscriptable"},
      {"{{ (1 if false).x }}", Kind::kUndefined,
       "the inline if-expression on line 1 evaluated to false and no else section was defined."},
      {"{{ 9223372036854775807 + 1 }}", Kind::kValue, "integer overflow (this engine's integers are 64-bit)"},
  };
  for (const Case& c : cases) {
    const TemplateError e = E(c.src);
    EXPECT_EQ(e.kind(), c.kind) << c.src;
    EXPECT_EQ(e.message(), c.message) << c.src;
    EXPECT_EQ(e.line(), 1) << c.src;
    EXPECT_GT(e.column(), 0) << c.src;
  }
}

// ---- limits: a template is outside input ----

TEST(ChatTemplateLimits, SourceSizeAndNesting) {
  ChatTemplateLimits lim;
  lim.max_source_bytes = 100;
  EXPECT_EQ(E(std::string(101, 'x'), json::array(), lim).kind(), Kind::kLimit);
  EXPECT_EQ(E("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}").kind(), Kind::kLimit);
  std::string ifs;
  for (int i = 0; i < 200; ++i) ifs += "{% if true %}";
  EXPECT_EQ(E(ifs).kind(), Kind::kLimit);
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += "+1";
  EXPECT_EQ(E(sum + " }}").kind(), Kind::kLimit);  // a left-deep tree, built by a loop
  std::string chain = "{{ s";
  for (int i = 0; i < 100000; ++i) chain += "|trim";
  EXPECT_EQ(E(chain + " }}").kind(), Kind::kLimit);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_EQ(E(nots + "1 }}").kind(), Kind::kLimit);
  std::string elifs = "{% if false %}";
  for (int i = 0; i < 20000; ++i) elifs += "{% elif false %}";
  EXPECT_EQ(ChatTemplate::parse(elifs + "{% else %}flat{% endif %}", "t").render(json::array()), "flat");
}

TEST(ChatTemplateLimits, RecursionCallsAndDepth) {
  EXPECT_NE(E("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}").message().find("macros call each other deeper than 32"),
            std::string::npos);
  ChatTemplateLimits lim;
  lim.max_call_depth = 100000;  // then the interpreter's own recursion bound holds
  EXPECT_NE(E("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", json::array(), lim).message().find("recurses deeper"),
            std::string::npos);
  EXPECT_EQ(E("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}").message(),
            "values nested deeper than 128 levels");
  // A namespace that holds itself: printing it is bounded (an error, not a stack overflow), and
  // the cycle is broken when the rendering ends (the fuzzer's leak checker sees no leak).
  EXPECT_EQ(E("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").kind(), Kind::kLimit);
  RenderOptions o;
  o.extra = json{{"v", json::parse(std::string(150, '[') + std::string(150, ']'))}};
  EXPECT_EQ(E("{{ v }}", json::array(), {}, o).message(), "values nested deeper than 128 levels");
}

TEST(ChatTemplateLimits, OutputStepsWorkRangeAndItems) {
  ChatTemplateLimits lim;
  lim.max_output_bytes = 1000;
  EXPECT_NE(E("{% for i in range(1000) %}xx{% endfor %}", json::array(), lim).message().find("the rendering is longer than 1000 bytes"),
            std::string::npos);
  EXPECT_EQ(E("{% set x = 'a' * 2000 %}", json::array(), lim).kind(), Kind::kLimit);
  EXPECT_EQ(E("{% set x = 'ab' * 9223372036854775807 %}", json::array(), lim).kind(), Kind::kLimit);
  EXPECT_EQ(E("{% set x = ('a' * 600) ~ ('b' * 600) %}", json::array(), lim).kind(), Kind::kLimit);
  ChatTemplateLimits steps;
  steps.max_steps = 100000;
  EXPECT_NE(E("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::array(), steps)
                .message()
                .find("more than 100000 steps"),
            std::string::npos);
  ChatTemplateLimits work;
  work.max_work_bytes = 1 << 20;
  EXPECT_NE(E("{% set ns = namespace(s='x' * 1000) %}{% for i in range(100000) %}{% set ns.t = ns.s ~ ns.s %}{% endfor %}",
              json::array(), work)
                .message()
                .find("bytes of strings"),
            std::string::npos);
  EXPECT_EQ(E("{{ range(100001) }}").message(),
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_EQ(R("{{ range(100000)|length }}"), "100000");
  EXPECT_EQ(E("{{ ([1] * 2000000)|length }}").kind(), Kind::kLimit);
  // The defaults stop a runaway template too: 10^10 loop turns end at max_steps.
  EXPECT_EQ(E("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").kind(), Kind::kLimit);
}

// ---- options and model directories ----

TEST(ChatTemplateOptions, TokensToolsDocumentsExtraAndNow) {
  const ChatTemplate t = ChatTemplate::parse(
      "{{ bos_token is defined }}/{{ bos_token }}/{{ eos_token is defined }}/{{ tools|length if tools else tools }}/"
      "{{ documents }}/{{ add_generation_prompt }}/{{ extra_var }}/{{ strftime_now('%d %b %Y') }}",
      "t");
  RenderOptions o;
  o.now = fixed_now();
  o.extra = json{{"extra_var", "x"}};
  EXPECT_EQ(t.render(json::array(), o), "False//False/None/None/False/x/26 Jul 2024");
  o.bos_token = "";
  o.eos_token = "</s>";
  o.tools = json::array({json::object()});
  o.documents = json::array({"doc"});
  o.add_generation_prompt = true;
  EXPECT_EQ(t.render(json::array(), o), "True//True/1/['doc']/True/x/26 Jul 2024");
  o.extra = json{{"messages", 1}};
  EXPECT_THROW(t.render(json::array(), o), TemplateError);
  // The local clock: this year.
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_EQ(ChatTemplate::parse("{{ strftime_now('%Y') }}", "t").render(json::array()), std::to_string(1900 + tm.tm_year));
  // Input strings must be UTF-8.
  EXPECT_THROW(ChatTemplate::parse("{{ messages }}", "t").render(json::array({std::string("\xff")})), TemplateError);
}

TEST(ChatTemplateModelDir, ConfigStringListAndJinjaFile) {
  diffattn::testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
  };
  // No template at all: loads, and says so.
  write("tokenizer_config.json", R"({"bos_token": null, "eos_token": "</s>"})");
  ModelChatTemplates m = ModelChatTemplates::load(dir.str());
  EXPECT_FALSE(m.has_template());
  EXPECT_THROW(m.render(json::array()), diffattn::InvalidArgument);
  // A string; bos as an AddedToken object.
  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"})");
  m = ModelChatTemplates::load(dir.str());
  ASSERT_TRUE(m.has_template());
  EXPECT_EQ(m.render(json::array({{{"role", "user"}, {"content", "hi"}}})), "<s>[hi]</s>");
  // A list: "default" without tools, "tool_use" with them.
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools:{{ tools|length }}"},
                              {"name": "rag", "template": "{{ unparsed"}]})");
  m = ModelChatTemplates::load(dir.str());
  EXPECT_EQ(m.render(json::array()), "plain");
  RenderOptions o;
  o.tools = json::array({json::object(), json::object()});
  EXPECT_EQ(m.render(json::array(), o), "tools:2");
  EXPECT_FALSE(m.bos_token().has_value());
  // chat_template.jinja wins over the config's template.
  write("chat_template.jinja", "from the file\n");
  m = ModelChatTemplates::load(dir.str());
  EXPECT_EQ(m.render(json::array(), o), "from the file");
  EXPECT_EQ(m.source(), dir / "chat_template.jinja");
  // A template that does not parse is an error naming the file and the line.
  write("chat_template.jinja", "line one\n{% for %}");
  try {
    ModelChatTemplates::load(dir.str());
    ADD_FAILURE() << "a broken template loaded";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.template_name(), dir / "chat_template.jinja");
    EXPECT_EQ(e.line(), 2);
  }
  std::remove((dir / "chat_template.jinja").c_str());
  write("tokenizer_config.json", "{not json");
  EXPECT_THROW(ModelChatTemplates::load(dir.str()), TemplateError);
  write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(ModelChatTemplates::load(dir.str()), TemplateError);
}

// ---- costs: rendering is per request, so nothing may be quadratic in a message's length ----

TEST(ChatTemplateCosts, LongNeedlesAndNonAsciiTextStayLinear) {
  // Substring search with needles over 64 bytes (Knuth-Morris-Pratt): the same answers as a
  // plain search, on text built so that a naive search would compare ~n*m bytes.
  RenderOptions o;
  // (200050 is not a multiple of the needle's period: a matcher that restarts wrongly misses it.)
  const std::string hay = std::string(200050, 'a') + "b" + std::string(100, 'a') + "b";
  const std::string needle = std::string(100, 'a') + "b";
  o.extra = json{{"hay", hay}, {"needle", needle}};
  const std::string src =
      "{{ needle in hay }}|{{ hay.find(needle) }}|{{ hay.rfind(needle) }}|{{ hay.count(needle) }}|"
      "{{ hay.split(needle)|length }}|{{ hay.rsplit(needle, 1)[1] }}|{{ hay.replace(needle, 'X')|length }}|"
      "{{ hay.rpartition(needle)[2] }}|{{ (hay ~ 'c').index(needle) }}|{{ ('x' * 70) in ('y' * 70) }}";
  EXPECT_EQ(ChatTemplate::parse(src, "t").render(json::array(), o),
            "True|199950|200051|2|3||199952||199950|False");
  // Non-ASCII text: len() is stored, indexing a code point walks the text but is charged for it.
  std::string wide;
  for (int i = 0; i < 50000; ++i) wide += "\xc3\xa9";  // é
  o.extra = json{{"w", wide}};
  EXPECT_EQ(ChatTemplate::parse("{{ w|length }}{% for i in range(1000) %}{{ w|length > 0 }}{% endfor %}", "t")
                .render(json::array(), o)
                .size(),
            5 + 4000u);
  ChatTemplateLimits lim;
  lim.max_steps = 200'000;
  EXPECT_EQ(E("{% for i in range(100000) %}{{ w[49999] }}{% endfor %}", json::array(), lim, o).kind(), Kind::kLimit);
}
