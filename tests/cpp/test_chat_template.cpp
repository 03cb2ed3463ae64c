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
