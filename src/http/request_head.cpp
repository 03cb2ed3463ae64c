// RFC 9112 framing of a request head (request_head.h). Pure: bytes in, a verdict out, so the
// rules are unit-tested and fuzzed (fuzz/fuzz_http_head.cpp) apart from any socket.
#include "http/request_head.h"

#include <cstdint>
#include <vector>

namespace diffattn::http {

namespace {

// RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_"
// / "`" / "|" / "~" / DIGIT / ALPHA
bool is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  for (char t : std::string_view("!#$%&'*+-.^_`|~")) {
    if (c == static_cast<unsigned char>(t)) return true;
  }
  return false;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_tchar(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A byte for a message: printable ASCII as itself, anything else as \xNN.
std::string shown(unsigned char c) {
  if (c >= 0x21 && c <= 0x7e) return std::string("'") + static_cast<char>(c) + "'";
  const char* d = "0123456789abcdef";
  return std::string("\\x") + d[c >> 4] + d[c & 15];
}

// A field name for a message (a token, so printable), cut.
std::string name_of(std::string_view n) {
  return "\"" + std::string(n.substr(0, 40)) + (n.size() > 40 ? "..." : "") + "\"";
}

HeadCheck bad(std::string message, int status = 400) { return {status, std::move(message)}; }

}  // namespace

HeadCheck check_request_head(std::string_view head) {
  // Lines: each must end in CRLF; a CR or LF anywhere else is an error (RFC 9112 2.2: a bare CR
  // must be refused; a bare LF as a line end is allowed, not required, and is refused here so
  // that no other parser can split the head differently).
  std::vector<std::string_view> lines;
  size_t at = 0;
  while (at < head.size()) {
    size_t i = at;
    while (i < head.size() && head[i] != '\r' && head[i] != '\n') ++i;
    if (i == head.size()) return bad("the request head does not end with CRLF CRLF");
    if (head[i] == '\n') {
      return bad("a line of the request head ends in a bare LF (line " + std::to_string(lines.size() + 1) +
                 "; HTTP lines end in CRLF)");
    }
    if (i + 1 >= head.size() || head[i + 1] != '\n') {
      return bad("a bare CR in line " + std::to_string(lines.size() + 1) + " of the request head");
    }
    lines.push_back(head.substr(at, i - at));
    at = i + 2;
    if (lines.back().empty()) break;  // the blank line: the end of the head
  }
  if (lines.empty() || !lines.back().empty() || at != head.size()) {
    return bad("the request head does not end with one blank line");
  }
  lines.pop_back();
  if (lines.empty()) return bad("no request line");

  // request-line = method SP request-target SP HTTP-version
  const std::string_view rl = lines[0];
  const size_t sp1 = rl.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || rl.find(' ', sp2 + 1) != std::string_view::npos) {
    return bad("the request line is not METHOD SP TARGET SP VERSION (one space between each)");
  }
  const std::string_view method = rl.substr(0, sp1), target = rl.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = rl.substr(sp2 + 1);
  if (!is_token(method)) return bad("the method is not a token");
  if (target.empty()) return bad("the request target is empty");
  for (char ch : target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f) return bad("the request target holds the byte " + shown(c));
  }
  const bool well_formed_version = version.size() == 8 && version.substr(0, 5) == "HTTP/" &&
                                   version[5] >= '0' && version[5] <= '9' && version[6] == '.' &&
                                   version[7] >= '0' && version[7] <= '9';
  if (!well_formed_version) return bad("the HTTP version is not HTTP/<digit>.<digit>");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return bad("HTTP version " + std::string(version) + " is not supported (HTTP/1.1 or HTTP/1.0)", 505);
  }
  const bool http10 = version == "HTTP/1.0";

  int hosts = 0, lengths = 0;
  std::string_view length;
  std::vector<std::string_view> codings;  // Transfer-Encoding's list, every field line joined
  bool has_te = false;
  for (size_t n = 1; n < lines.size(); ++n) {
    const std::string_view line = lines[n];
    if (line.front() == ' ' || line.front() == '\t') {
      return bad("line " + std::to_string(n + 1) + " of the request head starts with whitespace "
                 "(obsolete line folding is not accepted)");
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return bad("line " + std::to_string(n + 1) + " of the request head has no colon");
    const std::string_view name = line.substr(0, colon);
    if (name.empty()) return bad("a header field has an empty name");
    if (name.back() == ' ' || name.back() == '\t') {
      return bad("whitespace between the header name " + name_of(trim_ows(name)) + " and its colon");
    }
    for (char ch : name) {
      if (!is_tchar(static_cast<unsigned char>(ch))) {
        return bad("a header name holds the byte " + shown(static_cast<unsigned char>(ch)));
      }
    }
    const std::string_view raw = line.substr(colon + 1);
    for (char ch : raw) {
      const auto c = static_cast<unsigned char>(ch);
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        return bad("the value of " + name_of(name) + " holds the control byte " + shown(c));
      }
    }
    const std::string_view value = trim_ows(raw);
    if (iequals(name, "host")) {
      ++hosts;
    } else if (iequals(name, "content-length")) {
      ++lengths;
      length = value;
    } else if (iequals(name, "transfer-encoding")) {
      has_te = true;
      size_t b = 0;
      while (b <= value.size()) {
        size_t e = value.find(',', b);
        if (e == std::string_view::npos) e = value.size();
        std::string_view c = trim_ows(value.substr(b, e - b));
        const size_t semi = c.find(';');  // transfer parameters
        if (semi != std::string_view::npos) c = trim_ows(c.substr(0, semi));
        if (!c.empty()) codings.push_back(c);
        b = e + 1;
      }
    }
  }
  if (hosts > 1) return bad("the request has " + std::to_string(hosts) + " Host fields (one is allowed)");
  if (hosts == 0 && !http10) return bad("an HTTP/1.1 request must have a Host field");
  if (lengths > 1) {
    return bad("the request has " + std::to_string(lengths) +
               " Content-Length fields (one is allowed, so no reader takes another length)");
  }
  if (lengths == 1) {
    if (length.empty()) return bad("Content-Length is empty");
    uint64_t v = 0;
    for (char c : length) {
      if (c < '0' || c > '9') {
        return bad("Content-Length is not a number of bytes (one field, digits only: no sign, list or spaces)");
      }
      if (v > (UINT64_MAX - 9) / 10) return bad("Content-Length does not fit in 64 bits");
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
  }
  if (has_te) {
    if (lengths > 0) {
      return bad("the request has both Transfer-Encoding and Content-Length (its length would be "
                 "read two ways)");
    }
    if (http10) return bad("an HTTP/1.0 request must not have a Transfer-Encoding");
    if (codings.empty() || !iequals(codings.back(), "chunked")) {
      return bad("Transfer-Encoding does not end in chunked, so the body's length cannot be known");
    }
    return bad("a request body must come with a Content-Length, not a Transfer-Encoding", 411);
  }
  return {};
}

}  // namespace diffattn::http
