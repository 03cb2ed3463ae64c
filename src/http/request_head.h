// The framing of an HTTP/1.1 request head, checked as RFC 9112 asks before httplib parses it
// (httplib 0.11 is lenient: it took the first of two Content-Length fields, ignored
// "Transfer-Encoding : chunked", kept a NUL in a value). Anything a second parser on the path (a
// proxy, a client library) could read differently is refused, so a request cannot hide another
// in its body (request smuggling): the server answers the status below and closes the
// connection, answering nothing that followed on it.
//
//   request-line   method SP request-target SP HTTP/1.x CRLF; method a token; target visible
//                  ASCII; one SP each; HTTP/1.0 or HTTP/1.1 (another version: 505)
//   field lines    name ":" OWS value OWS CRLF; name a token, nothing between it and the colon;
//                  value without control characters (HTAB allowed); no line folding (a line
//                  that starts with SP or HTAB); every line ends in CRLF (no bare CR or LF)
//   Host           exactly one in HTTP/1.1, at most one in HTTP/1.0
//   Content-Length one field line, 1*DIGIT, fits 64 bits
//   Transfer-Encoding  with Content-Length, in HTTP/1.0, or not ending in chunked: 400; ending
//                  in chunked: 411 (request bodies must come with a Content-Length)
//
// Empty lines before the request line are the reader's to skip (RFC 9112 section 2.2).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace diffattn::http {

struct HeadCheck {
  int status = 0;          // 0: well framed; else the answer (400, 411, 505)
  std::string message;     // why, for the error body
};

// head: the bytes of a request from its request line up to and including the CRLF CRLF that
// ends its head.
HeadCheck check_request_head(std::string_view head);

}  // namespace diffattn::http
