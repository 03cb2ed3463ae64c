// The readers the architecture families share (src/model/arch.h): a directory's safetensors
// files memory-mapped (the shards of model.safetensors.index.json, or model.safetensors), every
// tensor's shape checked against the config and its values scanned for NaN/Inf, and three
// mappings onto the project's tensor table:
//  - Llama-like names (Llama, DiffLlama, Motif-2; docs/FORMAT.md, "Hugging Face directories"):
//    each layer's q|k|v rows permuted once onto the project's layout (Permutation, arch.h):
//    RoPE's rotate-half features to adjacent pairs; DiffLlama's halves and Motif-2's groups to
//    the project's adjacent sub-head pairs;
//  - Phi-4-mini-flash's published names as they are (docs/models/phi4flash.md);
//  - the project's own format with 16-bit tensors (each layer's q|k|v(|lambda_proj) stacked).
// The matrices that need no permutation (embeddings, o_proj, the MLP, lm_head) are used where
// they lie in the memory-mapped files, in their stored type; the permuted q|k|v block of each
// layer is one copy in the stored type; the small vectors (norms, lambdas, biases) are float32.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/files.h"
#include "diffattn/base/json_util.h"
#include "diffattn/base/memory.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"
#include "model/arch.h"

namespace diffattn::model {

using json = nlohmann::json;

namespace {

// One tensor of the checkpoint: its shard, header entry and where its bytes lie.
struct Located {
  const MappedFile* file = nullptr;
  const SafeTensorEntry* entry = nullptr;
  std::string name;
  const uint8_t* bytes() const { return file->data() + entry->begin; }
};

// The weights: mapped shards, converted copies, and the typed views into them.
struct HfStore : WeightStore {
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::vector<uint8_t>> owned;  // permuted projections, realigned tensors
  std::vector<std::vector<float>> small;    // norms, lambdas, biases (float32)
};

// The checkpoint's tensors: from model.safetensors.index.json's weight_map when there is one
// (shards named there, each a plain file name inside dir), else model.safetensors.
class Shards {
 public:
  // The weight files open_model_dir resolved: the index's weight_map, or model.safetensors.
  Shards(const ModelDir& dir, HfStore& store) : dir_(dir.path), store_(store) {
    if (!dir.weight_index.empty()) {
      map_ = dir.weight_map;
      where_ = dir.weight_index;
    } else {
      open("model.safetensors");
      for (const auto& [name, e] : headers_.at("model.safetensors").tensors) {
        map_[name] = "model.safetensors";
      }
      where_ = dir.file("model.safetensors");
    }
    // Every shard the index names exists and holds what the index says it holds.
    for (const auto& [name, file] : map_) {
      const SafeTensorsHeader& h = open(file);
      if (!h.tensors.count(name)) {
        throw IoError(where_ + ": tensor " + quote_name(name) + " is mapped to " + file +
                      ", which does not hold it");
      }
    }
  }

  const std::string& where() const { return where_; }
  const std::map<std::string, std::string>& names() const { return map_; }

  // The tensor `name` with its shape checked; errors name the file.
  Located get(const std::string& name, const Shape& shape) {
    auto it = map_.find(name);
    if (it == map_.end()) {
      throw IoError(where_ + ": missing tensor " + quote_name(name) + " of shape " +
                    shape_str(shape) + " (config.json asks for it)");
    }
    const SafeTensorsHeader& h = headers_.at(it->second);
    const SafeTensorEntry& e = h.tensors.at(name);
    const std::string path = dir_ + "/" + it->second;
    if (e.shape != shape) {
      throw IoError(path + ": tensor " + quote_name(name) + " has shape " + shape_str(e.shape) +
                    ", config.json implies " + shape_str(shape));
    }
    Located t;
    t.file = mapped_.at(it->second);
    t.entry = &e;
    t.name = name;
    return t;
  }

 private:
  const SafeTensorsHeader& open(const std::string& file) {
    auto it = headers_.find(file);
    if (it != headers_.end()) return it->second;
    const std::string path = dir_ + "/" + file;
    SafeTensorsHeader h = read_safetensors_header(path);
    auto m = std::make_unique<MappedFile>(path);
    if (m->size() != h.file_size) throw IoError(path + ": the file changed while it was read");
    // The data start in the file: entries' begin/end are relative to it.
    for (auto& [n, e] : h.tensors) {
      e.begin += h.data_offset;
      e.end += h.data_offset;
    }
    mapped_[file] = m.get();
    store_.files.push_back(std::move(m));
    return headers_.emplace(file, std::move(h)).first->second;
  }

  std::string dir_, where_;
  HfStore& store_;
  std::map<std::string, std::string> map_;
  std::map<std::string, SafeTensorsHeader> headers_;
  std::map<std::string, const MappedFile*> mapped_;
};

// The first non-finite element of n values of type t, or -1.
int64_t first_non_finite(const uint8_t* p, DType t, int64_t n) {
  int64_t bad = -1;
  if (t == DType::F32) {
    const auto* f = reinterpret_cast<const uint32_t*>(p);
#pragma omp parallel for schedule(static) reduction(max : bad) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; ++i) {
      if ((f[i] & 0x7f800000u) == 0x7f800000u && bad < 0) bad = i;
    }
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
#pragma omp parallel for schedule(static) reduction(max : bad) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; ++i) {
      if ((h[i] & mask) == mask && bad < 0) bad = i;
    }
  }
  if (bad < 0) return -1;
  // The first one (threads may each have found a later one): rescan up to it.
  const size_t es = dtype_size(t);
  for (int64_t i = 0; i <= bad; ++i) {
    const uint8_t* q = p + static_cast<size_t>(i) * es;
    uint32_t u = 0;
    if (t == DType::F32) {
      std::memcpy(&u, q, 4);
      if ((u & 0x7f800000u) == 0x7f800000u) return i;
    } else {
      uint16_t h;
      std::memcpy(&h, q, 2);
      const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
      if ((h & mask) == mask) return i;
    }
  }
  return bad;
}

void check_finite(const Located& t) {
  const int64_t i = first_non_finite(t.bytes(), t.entry->dtype, t.entry->numel);
  if (i >= 0) {
    throw IoError(t.file->path() + ": tensor " + quote_name(t.name) + " holds NaN or Inf at flat index " +
                  std::to_string(i) + " of its " + std::to_string(t.entry->numel) + " values (shape " +
                  shape_str(t.entry->shape) + ")");
  }
}

class Loader {
 public:
  explicit Loader(const ModelDir& dir)
      : dir_(dir.path), cfg_(dir.config), L_(*dir.layout), perm_{L_}, store_(std::make_shared<HfStore>()),
        shards_(dir, *store_) {}

  // The project's own layout (docs/FORMAT.md) with 16-bit tensors: each layer's q|k|v (and
  // V2's lambda_proj) stacked into one block, as the model runs them as one product (likewise
  // their biases); every other matrix where it lies in the mapped file, 1-D tensors as float32.
  // Names and shapes were checked against the config already.
  std::shared_ptr<HfStore> load_native() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    std::map<std::string, size_t> idx;
    for (size_t i = 0; i < table.size(); ++i) idx[table[i].name] = i;
    store_->tensors.assign(table.size(), TensorView{});
    std::set<std::string> used;
    auto at = [&](const std::string& name) { return get(name, table[idx.at(name)].shape, used); };
    auto put = [&](const std::string& name, TensorView p) { store_->tensors[idx.at(name)] = p; };
    const bool v2 = cfg_.attention == nn::AttnKind::DiffV2;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".attn.";
      const Located q = at(p + "q_proj.weight"), k = at(p + "k_proj.weight"), v = at(p + "v_proj.weight");
      const int64_t nq = q.entry->shape[0], nk = k.entry->shape[0];
      Located lam;
      if (v2) lam = at(p + "lambda_proj.weight");
      const TensorView proj = permuted_qkv(q, k, v, cfg_.d_model, v2 ? &lam : nullptr);
      const size_t row = static_cast<size_t>(cfg_.d_model) * dtype_size(proj.dtype);
      const auto* base = static_cast<const uint8_t*>(proj.data);
      put(p + "q_proj.weight", proj);
      put(p + "k_proj.weight", {base + static_cast<size_t>(nq) * row, proj.dtype});
      put(p + "v_proj.weight", {base + static_cast<size_t>(nq + nk) * row, proj.dtype});
      if (v2) put(p + "lambda_proj.weight", {base + static_cast<size_t>(nq + 2 * nk) * row, proj.dtype});
      if (cfg_.attn_bias) {
        const float* b = permuted_qkv_bias(at(p + "q_proj.bias"), at(p + "k_proj.bias"), at(p + "v_proj.bias"));
        put(p + "q_proj.bias", typed(b));
        put(p + "k_proj.bias", typed(b + nq));
        put(p + "v_proj.bias", typed(b + nq + nk));
      }
    }
    for (const TensorInfo& t : table) {
      if (store_->tensors[idx.at(t.name)].data != nullptr) continue;  // stacked above
      put(t.name, t.shape.size() == 2 ? in_place(at(t.name)) : small(at(t.name)));
    }
    store_->description = "diffattn " + std::string(nn::attn_kind_name(cfg_.attention)) + ", " +
                          stored_types() + ", memory-mapped";
    return store_;
  }

  // Phi-4-mini-flash: every tensor under its published name (tensor_table's name after
  // "model."), matrices where they lie in the mapped files, the rest as float32.
  std::shared_ptr<HfStore> load_sambay() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    store_->tensors.assign(table.size(), TensorView{});
    std::set<std::string> used;
    for (size_t i = 0; i < table.size(); ++i) {
      const Located t = get("model." + table[i].name, table[i].shape, used);
      // A_log is (E, N) but read as float32 like the vectors (A = -exp(A_log) at load).
      const bool matrix = table[i].shape.size() == 2 && table[i].name.find("A_log") == std::string::npos;
      store_->tensors[i] = matrix ? in_place(t) : small(t);
    }
    for (const auto& [name, file] : shards_.names()) {
      if (used.count(name) || name == "lm_head.weight") continue;  // tying replaces lm_head
      throw IoError(dir_ + "/" + file + ": extra tensor " + quote_name(name) +
                    " is not part of a Phi-4-mini-flash (phi4flash) model with this config.json");
    }
    store_->description = "Hugging Face phi4flash, " + stored_types() + ", " +
                          std::to_string(store_->files.size()) +
                          (store_->files.size() == 1 ? " file" : " files") + " memory-mapped";
    return store_;
  }

  std::shared_ptr<HfStore> load() {
    const std::vector<TensorInfo> table = tensor_table(cfg_);
    std::map<std::string, size_t> idx;
    for (size_t i = 0; i < table.size(); ++i) idx[table[i].name] = i;
    store_->tensors.assign(table.size(), TensorView{});
    auto set = [&](const std::string& ours, TensorView p) { store_->tensors[idx.at(ours)] = p; };
    std::set<std::string> used;
    const int64_t C = cfg_.d_model, V = cfg_.vocab_size, F = cfg_.ffn_dim;

    set("embed_tokens.weight", in_place(get("model.embed_tokens.weight", {V, C}, used)));
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string hf = "model.layers." + std::to_string(l) + ".";
      const std::string p = "layers." + std::to_string(l) + ".";
      set(p + "attn_norm.weight", small(get(hf + "input_layernorm.weight", {C}, used)));
      // q | k | v: one permuted copy per layer
      const Located q = get(hf + "self_attn.q_proj.weight", {L_.H * L_.d, C}, used);
      const Located k = get(hf + "self_attn.k_proj.weight", {L_.Hkv * L_.d, C}, used);
      const Located v = get(hf + "self_attn.v_proj.weight", {L_.Hkv * L_.d, C}, used);
      const nn::AttnLayerShape s = cfg_.attn_shape(l);
      const int64_t nq = s.n_q(), nk = L_.Hkv * L_.d;  // nq: the project's q rows
      const TensorView proj = permuted_qkv(q, k, v, C, nullptr, nq);
      const size_t es = dtype_size(proj.dtype);
      const auto* base = static_cast<const uint8_t*>(proj.data);
      set(p + "attn.q_proj.weight", proj);
      set(p + "attn.k_proj.weight", {base + static_cast<size_t>(nq * C) * es, proj.dtype});
      set(p + "attn.v_proj.weight", {base + static_cast<size_t>((nq + nk) * C) * es, proj.dtype});
      if (cfg_.attn_bias) {
        const Located qb = get(hf + "self_attn.q_proj.bias", {nq}, used);
        const Located kb = get(hf + "self_attn.k_proj.bias", {nk}, used);
        const Located vb = get(hf + "self_attn.v_proj.bias", {nk}, used);
        const float* b = permuted_qkv_bias(qb, kb, vb);
        set(p + "attn.q_proj.bias", typed(b));
        set(p + "attn.k_proj.bias", typed(b + nq));
        set(p + "attn.v_proj.bias", typed(b + nq + nk));
        set(p + "attn.out_proj.bias", small(get(hf + "self_attn.o_proj.bias", {C}, used)));
      }
      set(p + "attn.out_proj.weight", in_place(get(hf + "self_attn.o_proj.weight", {C, s.n_out()}, used)));
      if (L_.diff) {
        for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
          set(p + "attn." + n, small(get(hf + "self_attn." + n, {L_.d}, used)));
        }
        if (L_.motif) {
          set(p + "attn.subln.weight", small(get(hf + "self_attn.subln.weight", {2 * L_.d}, used)));
        } else {
          // DiffLlama's per-head RMSNorm has no weight: ones.
          store_->small.emplace_back(static_cast<size_t>(2 * L_.d), 1.0f);
          set(p + "attn.subln.weight", typed(store_->small.back().data()));
        }
      }
      set(p + "ffn_norm.weight", small(get(hf + "post_attention_layernorm.weight", {C}, used)));
      set(p + "ffn.gate_proj.weight", in_place(get(hf + "mlp.gate_proj.weight", {F, C}, used)));
      set(p + "ffn.up_proj.weight", in_place(get(hf + "mlp.up_proj.weight", {F, C}, used)));
      set(p + "ffn.down_proj.weight", in_place(get(hf + "mlp.down_proj.weight", {C, F}, used)));
      if (cfg_.mlp == MlpKind::PolyNorm) {
        set(p + "ffn.act_fn.weight", small(get(hf + "mlp.act_fn.weight", {3}, used)));
        set(p + "ffn.act_fn.bias", small(get(hf + "mlp.act_fn.bias", {1}, used)));
      }
      if (cfg_.mlp_bias) {
        set(p + "ffn.gate_proj.bias", small(get(hf + "mlp.gate_proj.bias", {F}, used)));
        set(p + "ffn.up_proj.bias", small(get(hf + "mlp.up_proj.bias", {F}, used)));
        set(p + "ffn.down_proj.bias", small(get(hf + "mlp.down_proj.bias", {C}, used)));
      }
    }
    set("norm.weight", small(get("model.norm.weight", {C}, used)));
    if (!cfg_.tie_embeddings) set("lm_head.weight", in_place(get("lm_head.weight", {V, C}, used)));

    // Anything else in the checkpoint is a layout this reader does not know: an error, except
    // the RoPE buffers older exports saved and an lm_head that tying replaces.
    for (const auto& [name, file] : shards_.names()) {
      if (used.count(name)) continue;
      static const std::string kRotary = "rotary_emb.inv_freq";
      const bool rotary = name.size() >= kRotary.size() &&
                          name.compare(name.size() - kRotary.size(), kRotary.size(), kRotary) == 0;
      if (rotary || (cfg_.tie_embeddings && name == "lm_head.weight")) continue;
      throw IoError(dir_ + "/" + file + ": extra tensor " + quote_name(name) +
                    " is not part of a " + family() + " model with this config.json");
    }
    store_->description = std::string("Hugging Face ") +
                          (L_.motif ? "motif" : L_.diff ? "diffllama" : "llama") + ", " +
                          stored_types() + ", " + std::to_string(store_->files.size()) +
                          (store_->files.size() == 1 ? " file" : " files") + " memory-mapped";
    return store_;
  }

 private:
  std::string family() const { return L_.motif ? "Motif" : L_.diff ? "DiffLlama" : "Llama"; }
  Located get(const std::string& name, const Shape& shape, std::set<std::string>& used) {
    Located t = shards_.get(name, shape);
    check_finite(t);
    used.insert(name);
    dtypes_[name] = t.entry->dtype;
    return t;
  }
  // The stored types of the tensors read, e.g. "BF16" or "BF16+F32".
  std::string stored_types() const {
    std::set<std::string> names;
    for (const auto& [tensor, dt] : dtypes_) names.insert(dtype_name(dt));
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : "+") + n;
    return out;
  }

  // The tensor where it lies in the mapping (copied only when misaligned for its type).
  TensorView in_place(const Located& t) {
    const DType dt = t.entry->dtype;
    t.file->will_need(t.entry->begin, t.entry->end);
    if (reinterpret_cast<uintptr_t>(t.bytes()) % dtype_size(dt) == 0) return {t.bytes(), dt};
    const size_t n = static_cast<size_t>(t.entry->end - t.entry->begin);
    store_->owned.emplace_back(n + 4);
    uint8_t* dst = store_->owned.back().data();
    dst += (4 - reinterpret_cast<uintptr_t>(dst) % 4) % 4;
    std::memcpy(dst, t.bytes(), n);
    t.file->drop(t.entry->begin, t.entry->end);
    return {dst, dt};
  }

  // A small tensor as float32.
  TensorView small(const Located& t) {
    std::vector<float> f(static_cast<size_t>(t.entry->numel));
    copy_f32(f.data(), t, 0, t.entry->numel);
    store_->small.push_back(std::move(f));
    return typed(store_->small.back().data());
  }

  // n elements of t from element `from` as float32 (alignment-safe).
  static void copy_f32(float* dst, const Located& t, int64_t from, int64_t n) {
    const DType dt = t.entry->dtype;
    const size_t es = dtype_size(dt);
    const uint8_t* src = t.bytes() + static_cast<size_t>(from) * es;
    if (dt == DType::F32) {
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + static_cast<size_t>(i) * 2, 2);
      dst[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }

  int64_t q_src(int64_t r) const { return perm_.q_src(r); }
  int64_t k_src(int64_t r) const { return perm_.k_src(r); }
  int64_t v_src(int64_t r) const { return perm_.v_src(r); }

  // q | k | v stacked and permuted, in their common stored type (float32 when they differ);
  // `extra` (V2's lambda_proj) is appended as it is, so the block is the layer's one product.
  // nq_out: the q rows produced (0: q's own; Motif repeats shared noise rows).
  TensorView permuted_qkv(const Located& q, const Located& k, const Located& v, int64_t C,
                        const Located* extra = nullptr, int64_t nq_out = 0) {
    const bool same = q.entry->dtype == k.entry->dtype && q.entry->dtype == v.entry->dtype &&
                      (!extra || extra->entry->dtype == q.entry->dtype);
    const DType dt = same ? q.entry->dtype : DType::F32;
    const size_t es = dtype_size(dt);
    const int64_t nq = nq_out ? nq_out : q.entry->shape[0], nk = k.entry->shape[0];  // v has nk rows too
    const int64_t ne = extra ? extra->entry->shape[0] : 0;
    const int64_t rows = nq + 2 * nk + ne;
    const size_t row_bytes = static_cast<size_t>(C) * es;
    check_fits_in_memory(static_cast<double>(rows) * static_cast<double>(row_bytes),
                         "the permuted q/k/v projections of one layer");
    store_->owned.emplace_back(static_cast<size_t>(rows) * row_bytes + 4);
    uint8_t* dst = store_->owned.back().data();
    dst += (4 - reinterpret_cast<uintptr_t>(dst) % 4) % 4;
    auto copy_rows = [&](uint8_t* out, const Located& t, int64_t n, auto src_of) {
      const size_t src_es = dtype_size(t.entry->dtype);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t s = src_of(r);
        uint8_t* o = out + static_cast<size_t>(r) * row_bytes;
        if (t.entry->dtype == dt) {
          std::memcpy(o, t.bytes() + static_cast<size_t>(s * C) * src_es, row_bytes);
        } else {
          copy_f32(reinterpret_cast<float*>(o), t, s * C, C);
        }
      }
      t.file->drop(t.entry->begin, t.entry->end);
    };
    copy_rows(dst, q, nq, [&](int64_t r) { return q_src(r); });
    copy_rows(dst + static_cast<size_t>(nq) * row_bytes, k, nk, [&](int64_t r) { return k_src(r); });
    copy_rows(dst + static_cast<size_t>(nq + nk) * row_bytes, v, nk,
              [&](int64_t r) { return v_src(r); });
    if (extra) {
      copy_rows(dst + static_cast<size_t>(nq + 2 * nk) * row_bytes, *extra, ne,
                [](int64_t r) { return r; });
    }
    return {dst, dt};
  }

  const float* permuted_qkv_bias(const Located& q, const Located& k, const Located& v) {
    const int64_t nq = q.entry->shape[0], nk = k.entry->shape[0];
    std::vector<float> qf(static_cast<size_t>(nq)), kf(static_cast<size_t>(nk)), vf(static_cast<size_t>(nk));
    copy_f32(qf.data(), q, 0, nq);
    copy_f32(kf.data(), k, 0, nk);
    copy_f32(vf.data(), v, 0, nk);
    std::vector<float> b(static_cast<size_t>(nq + 2 * nk));
    for (int64_t r = 0; r < nq; ++r) b[static_cast<size_t>(r)] = qf[static_cast<size_t>(q_src(r))];
    for (int64_t r = 0; r < nk; ++r) {
      b[static_cast<size_t>(nq + r)] = kf[static_cast<size_t>(k_src(r))];
      b[static_cast<size_t>(nq + nk + r)] = vf[static_cast<size_t>(v_src(r))];
    }
    store_->small.push_back(std::move(b));
    return store_->small.back().data();
  }

  std::string dir_;
  ModelConfig cfg_;
  ArchLayout L_;
  Permutation perm_;
  std::shared_ptr<HfStore> store_;
  Shards shards_;
  std::map<std::string, DType> dtypes_;
};
}  // namespace

std::map<std::string, std::string> parse_hf_weight_map(const std::string& text,
                                                       const std::string& where) {
  const json j = parse_json_object(text, where);
  if (!j.contains("weight_map") || !j.at("weight_map").is_object()) {
    throw IoError(where + ": missing \"weight_map\" (an object from tensor name to file)");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, f] : j.at("weight_map").items()) {
    if (!f.is_string()) {
      throw IoError(where + ": weight_map[" + quote_name(name) + "] must be a file name, got " +
                    json_brief(f));
    }
    const std::string file = f.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file.find('\0') != std::string::npos ||
        file == "." || file == "..") {
      throw IoError(where + ": weight_map[" + quote_name(name) + "] names " + json_brief(f) +
                    ", which is not a file name inside the directory");
    }
    out[name] = file;
  }
  return out;
}

std::shared_ptr<const WeightStore> load_llama_like(const ModelDir& dir) { return Loader(dir).load(); }
std::shared_ptr<const WeightStore> load_sambay_weights(const ModelDir& dir) { return Loader(dir).load_sambay(); }
std::shared_ptr<const WeightStore> load_native_weights(const ModelDir& dir) {
  // The header first: a config whose sizes the weights do not match is an error before anything
  // sized by the config is allocated.
  const std::string path = dir.file("model.safetensors");
  const SafeTensorsHeader h = read_safetensors_header(path);
  check_weights_header(dir.config, h, path);
  for (const auto& [name, t] : h.tensors) {
    if (t.dtype != DType::F32) return Loader(dir).load_native();  // kept as stored, mapped
  }
  // All float32: the model's own buffer (trainable), copied once from the mapped file.
  return read_f32_weights(path, h, dir.config);
}

}  // namespace diffattn::model
