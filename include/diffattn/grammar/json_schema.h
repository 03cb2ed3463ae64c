// Constrained output (docs/serving.md, "Constrained output"): a JSON schema, or "any JSON
// object", compiled into a byte-level pushdown automaton that says which bytes may come next, so
// that a sampler (diffattn/grammar/token_mask.h) only ever picks tokens that keep the text a
// prefix of a valid document. Layer `grammar`: it knows no model and no tokenizer.
//
// Supported keywords (anything else is UnsupportedSchema naming it and its JSON pointer):
//   type (a name or a list), enum, const, anyOf, $ref ("#", "#/$defs/NAME",
//   "#/definitions/NAME"), $defs, definitions
//   object:  properties, required, additionalProperties (false, true, absent = true, a schema)
//   array:   items (one schema), minItems, maxItems, uniqueItems: false
//   string:  minLength, maxLength (code points)
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, as in draft 6+)
//   ignored: title, description, examples, default, $comment, $schema, deprecated, readOnly,
//            writeOnly, $id (at the root only)
//
// The documents it lets through (the policies; the tests check them against a validator):
//   - Whitespace: none, except at most one space after ':' and after ','. No newlines.
//   - Objects: declared properties in the schema's order (as written, when the schema comes
//     as text or ordered_json), each at most once, optional ones may be skipped, every
//     required one present. Other names, when additionalProperties allows them, may come
//     anywhere, are never a declared name, and are written with JSON's short escapes only
//     (\" \\ \b \f \n \r \t, \u00xx in lower case for other control characters), so that a
//     name has one spelling. Duplicates among such other names are not prevented.
//   - Strings: full JSON escapes in values (\uXXXX surrogates must pair), UTF-8 checked byte by
//     byte (no overlong forms, no surrogates, nothing above U+10FFFF), no raw control characters.
//   - Numbers: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? with at most 19 integer digits, 16 fraction
//     digits and 2 exponent digits; integers have no fraction and no exponent.
//   - enum / const values are written as their compact JSON text (no spaces); values that the
//     schema's other keywords reject are dropped.
//   - Nesting: at most kMaxDocumentDepth objects and arrays deep; an optional part that could
//     not be finished within that depth is not offered, so a parse can always be finished.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "diffattn/base/error.h"

namespace diffattn::grammar {

// Limits on what a schema may cost (docs/SECURITY.md).
inline constexpr int kMaxDocumentDepth = 32;        // objects and arrays nested in a document
inline constexpr int kMaxSchemaDepth = 64;          // schema objects nested in the schema
inline constexpr size_t kMaxSchemaNodes = 10000;    // compiled nodes (about one per subschema)
inline constexpr size_t kMaxAlternatives = 64;      // values one position may start, after anyOf,
                                                    // $ref and type lists are expanded
inline constexpr size_t kMaxLiteralBytes = 1 << 20; // enum/const texts and property names, total
inline constexpr size_t kMaxParses = 64;            // parses alive at once (ambiguous anyOf);
                                                    // beyond it the later ones are dropped
inline constexpr int kMaxIntegerDigits = 19;
inline constexpr int kMaxFractionDigits = 16;
inline constexpr int kMaxExponentDigits = 2;

// A schema that cannot be compiled: keyword() is the keyword at fault ("" for the schema as a
// whole), path() its JSON pointer in the schema ("/properties/name/pattern").
class SchemaError : public InvalidArgument {
 public:
  SchemaError(std::string keyword, std::string path, const std::string& message);
  const std::string& keyword() const { return keyword_; }
  const std::string& path() const { return path_; }

 private:
  std::string keyword_, path_;
};

// A keyword this engine does not implement (pattern, format, oneOf, allOf, not, ...): the
// server answers 400 naming keyword() and path().
class UnsupportedSchema : public SchemaError {
 public:
  using SchemaError::SchemaError;
};

namespace detail {
struct Program;
struct State;
}  // namespace detail

// A compiled grammar: immutable, cheap to copy (shared), safe to use from many threads.
class Grammar {
 public:
  // response_format {"type": "json_object"}: any JSON object.
  static Grammar json_object();
  // response_format {"type": "json_schema"}: the schema as ordered JSON keeps its properties'
  // written order; as nlohmann::json they come in name order.
  static Grammar json_schema(const nlohmann::ordered_json& schema);
  static Grammar json_schema(const nlohmann::json& schema);
  // The schema's JSON text (nesting at most 64 levels; invalid JSON is InvalidArgument).
  static Grammar json_schema_text(std::string_view text);

  const detail::Program& program() const { return *program_; }

 private:
  explicit Grammar(std::shared_ptr<const detail::Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const detail::Program> program_;
};

// Where a document is after the bytes given so far. A copy is an independent state.
class Matcher {
 public:
  explicit Matcher(Grammar g);
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  ~Matcher();

  Matcher clone() const { return *this; }
  // Takes all of bytes, or none: on false the state is as before.
  bool advance(std::string_view bytes);
  // The bytes so far are a whole document (an end of sequence may come now).
  bool accepts_end() const;
  // Takes the end of the document: true when it is complete; afterwards no byte is taken.
  bool end();
  bool ended() const;
  // The bytes advance() would take next, one at a time (empty once ended).
  std::bitset<256> allowed_bytes() const;

  const Grammar& grammar() const { return grammar_; }
  const detail::State& state() const { return *state_; }

 private:
  Grammar grammar_;
  std::unique_ptr<detail::State> state_;
  std::unique_ptr<detail::State> scratch_;
};

}  // namespace diffattn::grammar
