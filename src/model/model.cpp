// The model's weights (the tensor table, seeded initialisation) and the const layer pieces its
// runners compose (docs/FORMAT.md, "The computation"): the training context's forward and
// backward (train_context.cpp) and the inference session (src/infer/session.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "diffattn/base/memory.h"
#include "diffattn/base/rng.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/nn/layers.h"

namespace diffattn::model {

namespace {

// Standard normal by Box-Muller from two uniforms in (0, 1], on splitmix64 (include/diffattn/
// rng.h) so seeded weights are the same everywhere (tests/python/model_helpers.py mirrors it).
double normal(uint64_t& s) {
  const double u1 = unit_double(splitmix64(s)) + 0x1.0p-53;
  const double u2 = unit_double(splitmix64(s));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// out = a + b (the residual stream's next value, written where the backward will read it).
void add3(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= nn::kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

OwnedWeights::OwnedWeights(const std::vector<TensorInfo>& table, Fill fill) {
  int64_t total = 0;
  for (const TensorInfo& t : table) total += t.numel;
  // The weights (4 bytes each) before anything is allocated and touched; a training context's
  // gradients check again for theirs.
  check_fits_in_memory(4.0 * static_cast<double>(total),
                       "a model of " + std::to_string(total) + " parameters");
  n_ = static_cast<size_t>(total);
  buf_.reset(fill == Fill::Zeros ? new float[n_]() : new float[n_]);
  for (const TensorInfo& t : table) tensors.emplace_back(buf_.get() + t.offset, t.shape);
  description = "float32";
}

OwnedWeights::OwnedWeights(const OwnedWeights& o)
    : WeightStore(o), buf_(new float[o.n_]), n_(o.n_) {
  std::copy_n(o.buf_.get(), n_, buf_.get());
  for (TensorView& v : tensors) v.data = buf_.get() + (v.f32() - o.buf_.get());
}

Model::Model(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  table_ = tensor_table(cfg_);
  owned_ = std::make_shared<OwnedWeights>(table_);
  store_ = owned_;
  index_tensors();
}

Model::Model(const ModelConfig& cfg, std::shared_ptr<const WeightStore> store)
    : cfg_(cfg), store_(std::move(store)) {
  cfg_.validate();
  table_ = tensor_table(cfg_);
  if (!store_ || store_->tensors.size() != table_.size()) {
    throw InvalidArgument("Model: a weight store with " +
                          std::to_string(store_ ? store_->tensors.size() : 0) +
                          " tensors for a config of " + std::to_string(table_.size()));
  }
  if (const auto* o = dynamic_cast<const OwnedWeights*>(store_.get())) {
    // Laid out by this config's table, or the offsets the trainer and optimizer use are wrong.
    int64_t total = 0;
    for (const TensorInfo& t : table_) total += t.numel;
    bool laid_out = static_cast<int64_t>(o->values().size()) == total;
    for (size_t i = 0; laid_out && i < table_.size(); ++i) {
      laid_out = o->tensors[i].data == o->values().data() + table_[i].offset;
    }
    if (!laid_out) {
      throw InvalidArgument("Model: owned float32 weights of " + std::to_string(o->values().size()) +
                            " values not laid out by the tensor table of this config (" +
                            std::to_string(total) + " values)");
    }
    // Created non-const (make_shared<OwnedWeights>), so writing it is defined; shared with
    // another holder it is copied, so this model never writes weights someone else reads.
    owned_ = store_.use_count() == 1 ? std::const_pointer_cast<OwnedWeights>(
                                           std::static_pointer_cast<const OwnedWeights>(store_))
                                     : std::make_shared<OwnedWeights>(*o);
    store_ = owned_;
  }
  index_tensors();
}

Model::Model(const Model& o)
    : cfg_(o.cfg_), table_(o.table_), index_(o.index_), lt_(o.lt_), sambay_(o.sambay_),
      derived_(o.derived_), embed_(o.embed_), norm_(o.norm_), head_(o.head_),
      norm_bias_(o.norm_bias_), store_(o.store_), inv_freq_(o.inv_freq_) {
  if (o.owned_) {
    owned_ = std::make_shared<OwnedWeights>(*o.owned_);
    store_ = owned_;
    index_tensors();  // the per-layer pieces point into this model's own weights
  }
}

Model& Model::operator=(const Model& o) {
  if (this != &o) *this = Model(o);
  return *this;
}

std::span<float> Model::params() {
  require_trainable("params");
  return owned_->values();
}

std::span<const float> Model::params() const {
  require_trainable("params");
  return owned_->values();
}

void Model::index_tensors() {
  index_.clear();
  lt_.clear();
  sambay_.clear();
  for (size_t i = 0; i < table_.size(); ++i) index_[table_[i].name] = i;
  auto at = [&](const std::string& n) -> int64_t {
    auto it = index_.find(n);
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  };
  embed_ = at("embed_tokens.weight");
  norm_ = at("norm.weight");
  if (cfg_.arch == Arch::SambaY) {
    head_ = embed_;
    norm_ = at("final_layernorm.weight");
    norm_bias_ = at("final_layernorm.bias");
    index_sambay();
    return;
  }
  head_ = cfg_.tie_embeddings ? embed_ : at("lm_head.weight");
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerTensors o;
    o.attn_norm = at(p + "attn_norm.weight");
    o.proj = at(p + "attn.q_proj.weight");
    o.proj_bias = at(p + "attn.q_proj.bias");
    o.out_proj = at(p + "attn.out_proj.weight");
    o.out_bias = at(p + "attn.out_proj.bias");
    o.lambda_q1 = at(p + "attn.lambda_q1");
    o.lambda_k1 = at(p + "attn.lambda_k1");
    o.lambda_q2 = at(p + "attn.lambda_q2");
    o.lambda_k2 = at(p + "attn.lambda_k2");
    o.subln = at(p + "attn.subln.weight");
    o.ffn_norm = at(p + "ffn_norm.weight");
    o.gate = at(p + "ffn.gate_proj.weight");
    o.up = at(p + "ffn.up_proj.weight");
    o.gate_bias = at(p + "ffn.gate_proj.bias");
    o.up_bias = at(p + "ffn.up_proj.bias");
    o.down = at(p + "ffn.down_proj.weight");
    o.down_bias = at(p + "ffn.down_proj.bias");
    o.act_w = at(p + "ffn.act_fn.weight");
    o.act_b = at(p + "ffn.act_fn.bias");
    lt_.push_back(o);
  }
  inv_freq_ = nn::rope_inv_freq(cfg_.head_dim, cfg_.rope_theta, cfg_.rope_scaling);
}

TensorView Model::wt(int64_t i) const {
  TensorView v = store_->tensors[static_cast<size_t>(i)];
  v.shape = table_[static_cast<size_t>(i)].shape;  // the table's: the store's views carry none
  return v;
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const TensorInfo& t : table_) n += t.numel;
  return n;
}

void require_backend(const Model& m, const nn::ExecContext& ctx, bool paged, DType kv_dtype,
                     const char* what) {
  bool seen[3] = {false, false, false};
  for (const TensorInfo& t : m.tensors()) {
    if (t.shape.size() != 2) continue;
    const DType dt = m.weight(t.name).dtype;
    if (seen[static_cast<int>(dt)]) continue;
    seen[static_cast<int>(dt)] = true;
    ctx.require(nn::Op::LinearFewRows, dt, what);
    ctx.require(nn::Op::LinearManyRows, dt, what);
  }
  ctx.require(nn::Op::RmsNorm, DType::F32, what);
  ctx.require(nn::Op::Rope, DType::F32, what);
  ctx.require(nn::Op::SwiGlu, DType::F32, what);
  if (m.config().mlp == MlpKind::PolyNorm) ctx.require(nn::Op::PolyNorm, DType::F32, what);
  if (m.config().arch == Arch::SambaY) ctx.require(nn::Op::LayerNorm, DType::F32, what);
  if (!paged) {
    ctx.require(nn::Op::Attention, DType::F32, what);
    return;
  }
  ctx.require(nn::Op::PagedAttention, kv_dtype, what);
  if (m.config().arch == Arch::SambaY) ctx.require(nn::Op::Attention, kv_dtype, what);
}

std::string Model::storage() const { return owned_ ? "float32" : store_->description; }

void Model::require_trainable(const char* what) const {
  if (owned_) return;
  throw InvalidArgument(std::string(what) + ": this model's weights are kept as loaded (" +
                        store_->description +
                        "); training needs a float32 model (diffattn convert --to diffattn)");
}

const TensorInfo& Model::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw InvalidArgument("model has no tensor \"" + name + "\"");
  return table_[it->second];
}

TensorView Model::weight(const std::string& name) const {
  tensor(name);  // throws naming an unknown tensor
  return wt(static_cast<int64_t>(index_.at(name)));
}

std::vector<float> Model::weight_f32(const std::string& name) const {
  const TensorInfo& t = tensor(name);
  std::vector<float> out(static_cast<size_t>(t.numel));
  const TensorView w = weight(name);
  convert_to_f32(out.data(), w.data, w.dtype, t.numel);
  return out;
}

void Model::init_weights(uint64_t seed) {
  require_trainable("init_weights");
  uint64_t s = seed ^ 0x6469666661747431ull;  // "diffatt1"
  for (const TensorInfo& t : table_) {
    float* w = owned_->values().data() + t.offset;
    const bool gain = t.name.find("norm.weight") != std::string::npos ||
                      t.name.find("subln.weight") != std::string::npos;
    const bool lam = t.name.find("attn.lambda_") != std::string::npos &&
                     t.name.find("lambda_proj") == std::string::npos;
    const bool poly_w = t.name.find("ffn.act_fn.weight") != std::string::npos;
    const bool poly_b = t.name.find("ffn.act_fn.bias") != std::string::npos;
    for (int64_t i = 0; i < t.numel; ++i) {
      if (poly_w || poly_b) {
        w[i] = poly_w ? 1.0f / 3.0f : 0.0f;  // PolyNorm's initialisation (arXiv:2411.03884)
      } else if (gain) {
        w[i] = 1.0f;
      } else {
        w[i] = static_cast<float>((lam ? 0.1 : 0.02) * normal(s));
      }
    }
  }
}

nn::AttnLayerWeights Model::attn_weights(int64_t l) const {
  if (cfg_.arch == Arch::SambaY) return sambay_layer(l).attn;
  const LayerTensors& o = lt_[static_cast<size_t>(l)];
  nn::AttnLayerWeights w;
  w.proj = wt(o.proj);
  w.out_proj = wt(o.out_proj);
  w.proj_bias = wf(o.proj_bias);
  w.out_bias = wf(o.out_bias);
  w.lambda_q1 = wf(o.lambda_q1);
  w.lambda_k1 = wf(o.lambda_k1);
  w.lambda_q2 = wf(o.lambda_q2);
  w.lambda_k2 = wf(o.lambda_k2);
  w.subln = wf(o.subln);
  return w;
}

void Model::layer(const nn::ExecContext& ctx, int64_t l, LayerActs& a, const float* x_in,
                  float* x_out, int64_t N, const AttnFn& attn) const {
  const int64_t C = cfg_.d_model;
  const size_t nx = static_cast<size_t>(N * C);
  // x_mid = x_in + attn(rmsnorm(x_in, attn_norm))
  a.an.resize(nx);
  a.an_rstd.resize(static_cast<size_t>(N));
  ctx.rmsnorm(a.an.data(), a.an_rstd.data(), x_in, wf(lt_[static_cast<size_t>(l)].attn_norm), N, C,
              cfg_.norm_eps);
  a.attn_out.resize(nx);
  attn(a.attn_out.data(), a.an.data());
  a.x_mid.resize(nx);
  add3(a.x_mid.data(), x_in, a.attn_out.data(), N * C);
  ffn_fwd(ctx, l, a, x_out, N);
}

void Model::ffn_fwd(const nn::ExecContext& ctx, int64_t l, LayerActs& a, float* x_out,
                    int64_t BT) const {
  const int64_t C = cfg_.d_model, F = cfg_.ffn_dim;
  const size_t nx = static_cast<size_t>(BT * C);
  const LayerTensors& o = lt_[static_cast<size_t>(l)];
  // x_out = x_mid + down(silu(gate f) * up f), f = rmsnorm(x_mid, ffn_norm)
  a.fn.resize(nx);
  a.attn_out.resize(nx);
  a.fn_rstd.resize(static_cast<size_t>(BT));
  ctx.rmsnorm(a.fn.data(), a.fn_rstd.data(), a.x_mid.data(), wf(o.ffn_norm), BT, C, cfg_.norm_eps);
  a.gu.resize(static_cast<size_t>(BT * 2 * F));
  const TensorView gate = wt(o.gate), up = wt(o.up);
  if (gate.dtype == up.dtype &&
      static_cast<const char*>(up.data) ==
          static_cast<const char*>(gate.data) + static_cast<size_t>(F * C) * dtype_size(gate.dtype)) {
    ctx.linear(a.gu.data(), a.fn.data(), gate, BT, C, 2 * F);  // stacked: one product
  } else {
    ctx.linear(a.gu.data(), a.fn.data(), gate, BT, C, F, 2 * F);
    ctx.linear(a.gu.data() + F, a.fn.data(), up, BT, C, F, 2 * F);
  }
  if (o.gate_bias >= 0) {
    nn::bias_add(a.gu.data(), wf(o.gate_bias), BT, F, 2 * F);
    nn::bias_add(a.gu.data() + F, wf(o.up_bias), BT, F, 2 * F);
  }
  a.h.resize(static_cast<size_t>(BT * F));
  if (cfg_.mlp == MlpKind::PolyNorm) {
    ctx.polynorm(a.h.data(), a.gu.data(), a.gu.data() + F, BT, F, 2 * F, wf(o.act_w),
                 wf(o.act_b), kPolyNormEps);
  } else {
    ctx.swiglu(a.h.data(), a.gu.data(), a.gu.data() + F, BT, F, 2 * F);
  }
  ctx.linear(a.attn_out.data(), a.h.data(), wt(o.down), BT, F, C);
  if (o.down_bias >= 0) nn::bias_add(a.attn_out.data(), wf(o.down_bias), BT, C);
  add3(x_out, a.x_mid.data(), a.attn_out.data(), BT * C);
}

std::vector<double> Model::layer_lambdas() const {
  std::vector<double> out;
  if (cfg_.attention == nn::AttnKind::Standard) return out;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    if (cfg_.arch == Arch::SambaY) {  // Mamba and GMU layers have none
      const LayerKind k = cfg_.layer_kind(l);
      out.push_back(k == LayerKind::Mamba || k == LayerKind::Gmu
                        ? std::numeric_limits<double>::quiet_NaN()
                        : nn::v1_lambda(attn_weights(l), cfg_.attn_shape(l)));
      continue;
    }
    if (cfg_.attention == nn::AttnKind::DiffV1) {
      out.push_back(nn::v1_lambda(attn_weights(l), cfg_.attn_shape(l)));
    } else {
      out.push_back(std::numeric_limits<double>::quiet_NaN());  // per token (TrainContext)
    }
  }
  return out;
}

void Model::embed(float* x, const int32_t* tokens, int64_t N) const {
  nn::embedding_fwd(x, tokens, wt(embed_), N, cfg_.d_model, cfg_.vocab_size);
}

void Model::head(const nn::ExecContext& ctx, float* logits, const float* x, int64_t N,
                 std::vector<float>& normed, std::vector<float>& rstd) const {
  const int64_t C = cfg_.d_model;
  normed.resize(static_cast<size_t>(N * C));
  rstd.resize(static_cast<size_t>(N));
  if (cfg_.arch == Arch::SambaY) {
    ctx.layernorm(normed.data(), x, wf(norm_), wf(norm_bias_), N, C, cfg_.norm_eps);
  } else {
    ctx.rmsnorm(normed.data(), rstd.data(), x, wf(norm_), N, C, cfg_.norm_eps);
  }
  ctx.linear(logits, normed.data(), wt(head_), N, C, cfg_.vocab_size);
}

}  // namespace diffattn::model
