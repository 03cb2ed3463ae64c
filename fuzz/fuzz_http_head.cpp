// Fuzzes the HTTP request-head check (src/http/request_head.cpp) that runs before httplib parses a
// request. Any input gets a verdict without crashing; a head it accepts has the framing every
// reader agrees on: lines that end in CRLF (no other CR or LF), at most one Content-Length of
// digits, no Transfer-Encoding, no control byte but HTAB in a field line, no field line that
// starts with whitespace or has whitespace before its colon.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "http/request_head.h"

namespace {

bool starts_with_name(std::string_view line, std::string_view name) {
  if (line.size() <= name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = line[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != name[i]) return false;
  }
  return line[name.size()] == ':';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view head(reinterpret_cast<const char*>(data), size);
  const diffattn::http::HeadCheck c = diffattn::http::check_request_head(head);
  if (c.status != 0) {
    if (c.status != 400 && c.status != 411 && c.status != 505) std::abort();
    if (c.message.empty()) std::abort();
    return 0;
  }
  if (head.size() < 4 || head.substr(head.size() - 4) != "\r\n\r\n") std::abort();
  int lengths = 0;
  size_t at = 0, n = 0;
  while (at < head.size()) {
    const size_t end = head.find("\r\n", at);
    if (end == std::string_view::npos) std::abort();
    const std::string_view line = head.substr(at, end - at);
    at = end + 2;
    if (line.empty()) break;
    for (char ch : line) {
      const auto b = static_cast<unsigned char>(ch);
      if (b == '\r' || b == '\n' || b == 0 || (b < 0x20 && b != '\t') || b == 0x7f) std::abort();
    }
    if (n++ == 0) continue;  // the request line
    if (line[0] == ' ' || line[0] == '\t') std::abort();
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 || line[colon - 1] == ' ' || line[colon - 1] == '\t') std::abort();
    if (starts_with_name(line, "transfer-encoding")) std::abort();
    if (starts_with_name(line, "content-length")) {
      ++lengths;
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      if (v.empty()) std::abort();
      for (char d : v) {
        if (d < '0' || d > '9') std::abort();
      }
    }
  }
  if (at != head.size() || lengths > 1) std::abort();
  return 0;
}
