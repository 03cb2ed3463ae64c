// API -> params check -> backend -> kernel. Every route a call can take is in this file:
// Auto resolves to the fused CPU kernels (DIFFATTN_BACKEND=reference forces the oracle), and
// a forward with a few query rows against a long cache takes the split-KV decode path.
#include <cstdlib>
#include <cstring>

#include "diffattn/attention.h"
#include "kernels/fused.h"

namespace diffattn {

Backend resolve_backend(Backend requested) {
  if (requested != Backend::Auto) return requested;
  const char* env = std::getenv("DIFFATTN_BACKEND");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0 ||
      std::strcmp(env, "fused") == 0) {
    return Backend::Fused;
  }
  if (std::strcmp(env, "reference") == 0) return Backend::Reference;
  throw InvalidArgument(std::string("DIFFATTN_BACKEND is \"") + env +
                        "\", expected \"auto\", \"fused\" or \"reference\"");
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Reference: return "reference";
    case Backend::Fused: return "fused";
  }
  return "?";
}

namespace {

// The decode path serves signed and standard attention; clamp needs its two passes.
bool decode_capable(const AttnParams& p) { return p.maps == 1 || p.mode == DiffMode::Signed; }

}  // namespace

void attention_fwd(const AttnParams& p, Backend backend) {
  const char* op = p.maps == 2 ? "diff_attention" : "attention";
  if (resolve_backend(backend) == Backend::Reference) return attention_fwd_ref(p);
  check_params(p, op);
  if (p.Tq <= fused::DecodeTiles::kMaxRows && p.Tk >= fused::DecodeTiles::kMinKeys &&
      decode_capable(p)) {
    return attention_decode_fused(AttnDecodeParams(p));
  }
  attention_fwd_fused(p);
}

void attention_decode(const AttnDecodeParams& p, Backend backend) {
  const char* op = p.maps == 2 ? "diff_attention_decode" : "attention_decode";
  if (resolve_backend(backend) == Backend::Reference) return attention_fwd_ref(p);
  check_params(p, op);
  if (p.key_chunk < 0) {
    throw InvalidArgument(std::string(op) + ": key_chunk must be >= 0 (0 picks), got " +
                          std::to_string(p.key_chunk));
  }
  if (!decode_capable(p)) return attention_fwd_fused(p);
  attention_decode_fused(p);
}

void attention_bwd(const AttnBwdParams& p, Backend backend) {
  if (resolve_backend(backend) == Backend::Reference) return attention_bwd_ref(p);
  check_params(p, p.maps == 2 ? "diff_attention_backward" : "attention_backward");
  attention_bwd_fused(p);
}

}  // namespace diffattn
