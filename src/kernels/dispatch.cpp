// API -> params check -> backend. The reference is always here; faster backends register in
// this file, so the route a call takes is visible in one place.
#include <cstdlib>
#include <cstring>

#include "diffattn/attention.h"

namespace diffattn {

Backend resolve_backend(Backend requested) {
  Backend b = requested;
  if (b == Backend::Auto) {
    const char* env = std::getenv("DIFFATTN_BACKEND");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) {
      b = Backend::Reference;
    } else if (std::strcmp(env, "reference") == 0) {
      b = Backend::Reference;
    } else if (std::strcmp(env, "fused") == 0) {
      b = Backend::Fused;
    } else {
      throw InvalidArgument(std::string("DIFFATTN_BACKEND is \"") + env +
                            "\", expected \"auto\", \"fused\" or \"reference\"");
    }
  }
  if (b == Backend::Fused) {
    throw InvalidArgument("the fused backend is not part of this build");
  }
  return b;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Reference: return "reference";
    case Backend::Fused: return "fused";
  }
  return "?";
}

void attention_fwd(const AttnParams& p, Backend backend) {
  resolve_backend(backend);
  attention_fwd_ref(p);
}

void attention_bwd(const AttnBwdParams& p, Backend backend) {
  resolve_backend(backend);
  attention_bwd_ref(p);
}

}  // namespace diffattn
