// API -> params check -> backend -> kernel. Every route a call can take is in this file:
// Auto resolves to the fused CPU kernels (DIFFATTN_BACKEND=reference forces the oracle), and
// a forward with a few query rows against a long cache takes the split-KV decode path.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "diffattn/attention.h"
#include "kernels/fused.h"

namespace diffattn {

Backend parse_backend(const std::string& name, const std::string& where) {
  if (name == "auto") return Backend::Auto;
  if (name == "fused") return Backend::Fused;
  if (name == "reference") return Backend::Reference;
  throw InvalidArgument(where + " is \"" + name +
                        "\", expected \"auto\", \"fused\" or \"reference\"");
}

namespace {

// DIFFATTN_BACKEND, read once: Auto means the fused kernels unless it says "reference".
Backend env_backend() {
  static const Backend b = [] {
    const char* env = std::getenv("DIFFATTN_BACKEND");
    if (env == nullptr || *env == '\0') return Backend::Fused;
    const Backend named = parse_backend(env, "DIFFATTN_BACKEND");
    return named == Backend::Auto ? Backend::Fused : named;
  }();
  return b;
}

std::atomic<uint64_t> g_forward{0}, g_backward{0}, g_decode{0};

}  // namespace

KernelCalls kernel_calls() { return {g_forward.load(), g_backward.load(), g_decode.load()}; }

Backend resolve_backend(Backend requested) {
  return requested != Backend::Auto ? requested : env_backend();
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
  g_forward.fetch_add(1, std::memory_order_relaxed);
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
  g_decode.fetch_add(1, std::memory_order_relaxed);
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
  g_backward.fetch_add(1, std::memory_order_relaxed);
  if (resolve_backend(backend) == Backend::Reference) return attention_bwd_ref(p);
  check_params(p, p.maps == 2 ? "diff_attention_backward" : "attention_backward");
  attention_bwd_fused(p);
}

}  // namespace diffattn
