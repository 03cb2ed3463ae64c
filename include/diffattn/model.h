// The Differential Transformer language model of docs/FORMAT.md ("diffattn/1"): its config,
// its weights in one flat buffer with a table of named tensors, the forward/backward over a
// batch, KV-cache inference, the sampler, AdamW, and checkpoint I/O (safetensors + config.json).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diffattn/attention_layer.h"
#include "diffattn/dtype.h"
#include "diffattn/error.h"
#include "diffattn/files.h"
#include "diffattn/nn.h"
#include "diffattn/rng.h"

namespace diffattn {

// ---- config.json ----
struct ModelConfig {
  nn::AttnKind attention = nn::AttnKind::DiffV1;
  int64_t vocab_size = 256;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // V1: pairs H; V2: output heads H (2H query heads); standard: heads
  int64_t n_kv_heads = 0;  // G, divides n_heads
  int64_t head_dim = 0;    // D
  int64_t ffn_dim = 0;
  int64_t max_seq_len = 0;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  std::optional<double> lambda_init;  // absent: 0.8 - 0.6 exp(-0.3 l), l 0-based
  nn::RopeScaling rope_scaling;       // none by default
  bool attn_bias = false;  // q, k, v and out projections have biases (diff_v1, standard)
  bool mlp_bias = false;   // gate, up and down projections have biases

  // lambda_init of layer l (0-based): the fixed value or the paper's schedule
  // (arXiv:2410.05258 section 2.1, with its 1-based l - 1 written as the 0-based l).
  float layer_lambda_init(int64_t l) const;
  nn::AttnLayerShape attn_shape(int64_t l) const;
  // Throws InvalidArgument naming the key when a size is out of range or inconsistent.
  void validate(const std::string& where = "config") const;
  std::string to_json() const;
  // Parses config.json text; unknown keys, missing keys and wrong types are errors naming the
  // key and `where` (the file).
  static ModelConfig from_json(const std::string& text, const std::string& where);
};

nn::AttnKind parse_attn_kind(const std::string& name, const std::string& where);

// Presets "tiny" and "small" for each attention kind, of (nearly) equal parameter counts:
// V1 matches standard exactly (H pairs of 2D replace 2H heads of D); V2's extra query heads
// and lambda_proj are paid for by a smaller ffn_dim (see README).
ModelConfig model_preset(const std::string& name, nn::AttnKind kind, int64_t vocab_size = 256);
// The V2 rule of equal size (the one place it is written): V2 adds H*D*C query weights and an
// (H, C) lambda_proj per layer; the SwiGLU's three (ffn, C) matrices give back as many rows,
// rounded to the nearest. Returns the V2 model's ffn_dim for a standard model's ffn.
int64_t v2_matched_ffn_dim(int64_t ffn, int64_t d_model, int64_t n_heads, int64_t head_dim);
// The same rule for any size: n_std heads of d_model / n_std for the standard model (V1: n_std / 2
// pairs, V2: n_std output heads and an FFN shrunk to pay for its extra query heads).
ModelConfig model_of_size(nn::AttnKind kind, int64_t d_model, int64_t n_layers, int64_t n_std,
                          int64_t ffn_dim, int64_t max_seq_len, int64_t vocab_size = 256);

// ---- weights ----
struct TensorInfo {
  std::string name;  // FORMAT.md name, e.g. "layers.0.attn.q_proj.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D tensors; see README)
};

// The tensors of a config in a fixed order, laid out so that each layer's q, k, v (and V2's
// lambda) projections are contiguous (one stacked (n_proj, C) weight) and so are gate and up.
std::vector<TensorInfo> tensor_table(const ModelConfig& cfg);

// A layer's tensors as indices into tensor_table (-1: absent for this config).
struct LayerTensors {
  int64_t attn_norm = -1, proj = -1, proj_bias = -1, out_proj = -1, out_bias = -1;
  int64_t lambda_q1 = -1, lambda_k1 = -1, lambda_q2 = -1, lambda_k2 = -1, subln = -1;
  int64_t ffn_norm = -1, gate = -1, up = -1, gate_bias = -1, up_bias = -1, down = -1,
          down_bias = -1;
};

// Weights kept as loaded instead of in Model::params: one typed view per tensor_table entry
// (BF16 and F16 matrices stay so; the small vectors are float32), and whatever keeps the memory
// alive (memory-mapped files, converted copies). Read only; models built on one share it.
struct WeightStore {
  virtual ~WeightStore() = default;
  std::vector<TypedPtr> tensors;
  std::string description;  // what `diffattn info` shows, e.g. "Hugging Face diffllama, BF16"
};

class Model {
 public:
  // A trainable model: float32 weights and gradients in params / grads.
  explicit Model(const ModelConfig& cfg);
  // An inference model over weights kept as loaded (no params, no grads; backward() refuses).
  Model(const ModelConfig& cfg, std::shared_ptr<const WeightStore> store);

  const ModelConfig& config() const { return cfg_; }
  // False for a model over a WeightStore.
  bool trainable() const { return store_ == nullptr; }
  // Where the weights live: "float32" or the store's description.
  std::string storage() const;
  // A tensor in its stored type, and a float32 copy of it.
  TypedPtr weight(const std::string& name) const;
  std::vector<float> weight_f32(const std::string& name) const;
  const std::vector<TensorInfo>& tensors() const { return table_; }
  const TensorInfo& tensor(const std::string& name) const;  // throws naming the tensor
  int64_t num_params() const;

  // Seeded initialisation: linear weights and embeddings N(0, 0.02), norms 1, V1 lambda
  // vectors N(0, 0.1) (the upstream code's convention). Same seed, same weights.
  void init_weights(uint64_t seed);

  // Forward over tokens (B, T). With targets (B, T) returns the mean cross-entropy over the
  // positions whose target is >= 0; without, 0. Logits stay in logits() (B, T, V).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // After forward with targets: grads += d(dloss_scale * mean loss)/dparams.
  void backward(float dloss_scale = 1.0f);
  void zero_grads();
  const std::vector<float>& logits() const { return logits_; }

  // Per-layer lambda: V1 the layer's scalar (Eq. 2); V2 the mean of sigmoid(lambda_proj x) over
  // the last forward's tokens and heads (NaN before any forward); standard: empty.
  std::vector<double> layer_lambdas() const;

  // One attention layer as the last forward() ran it, for looking inside (maps, analysis):
  // `params` views q and k after RoPE, v, lambda (V1: (H) broadcast; V2: (B, T, H)), the output
  // and the saved lse, so attention_probs(params, map, probs) recomputes the maps; nothing is
  // copied and the forward is unchanged (it keeps no T x T buffer). Valid until the next
  // forward; throws before any forward (infer() does not count: it saves no lse).
  struct LayerAttention {
    AttnBwdParams params;  // the forward's outputs read only
    nn::AttnLayerShape shape;
  };
  LayerAttention layer_attention(int64_t layer) const;
  // (B, T) of the last forward(); (0, 0) before any.
  int64_t last_batch() const { return B_; }
  int64_t last_len() const { return T_; }

  // ---- inference with a KV cache ----
  // The caches of every layer for B sequences of up to `capacity` positions (at most
  // max_seq_len), stored as kv_dtype (F32, or BF16/F16: half the bytes, rounded once when
  // written, read with float32 arithmetic).
  void cache_reset(int64_t B, int64_t capacity, DType kv_dtype = DType::F32);
  int64_t cache_len() const;
  // Appends tokens (B, Tn) at the cache's end and writes the logits of each sequence's last new
  // position into logits_last (B, V). Tn > 1 is a prefill, Tn == 1 a decode step.
  void infer(const int32_t* tokens, int64_t B, int64_t Tn, float* logits_last);

  // ---- inference over a paged KV pool (serving: src/serve/engine.cpp) ----
  // One KV pool per layer of n_blocks blocks of block_size positions, stored as kv_dtype;
  // throws InvalidArgument when they would not fit in the machine's memory.
  std::vector<nn::KVPool> kv_pools(int64_t n_blocks, int64_t block_size,
                                   DType kv_dtype = DType::F32) const;
  // A prompt chunk of one sequence: tokens (Tn) at positions pos0 .. pos0 + Tn - 1, their K/V
  // written into the sequence's blocks (table: table_len ids of each pool), and the logits of
  // the last one (V). The attention gathers the pos0 cached positions into a contiguous copy
  // (nn::attn_layer_fwd_paged); the same arithmetic as infer() on a contiguous cache.
  void prefill_paged(const int32_t* tokens, int64_t Tn, std::vector<nn::KVPool>& pools,
                     const int32_t* table, int64_t table_len, int64_t pos0, float* logits_last);
  // One decode step for the B sequences of seqs (seqs.lens[b]: positions after this step, so
  // token b goes to position lens[b] - 1): logits (B, V). Every matrix product (attention
  // projections, FFN, output head) runs once over the B rows, and each layer's attention is
  // one attention_decode_paged call over all B sequences reading the blocks in place.
  // Each row's logits equal infer() on that sequence alone up to the order of the sums.
  void decode_paged(const int32_t* tokens, std::vector<nn::KVPool>& pools,
                    const nn::PagedSeqs& seqs, float* logits);

  std::vector<float> params;  // flat, laid out by tensors()
  std::vector<float> grads;   // same layout

 private:
  // What one layer's forward keeps for the backward (N = B*T rows).
  struct LayerActs {
    std::vector<float> x_in;      // (N, C) the residual stream entering the layer
    std::vector<float> an;        // (N, C) rmsnorm(x_in, attn_norm)
    std::vector<float> an_rstd;   // (N)
    std::vector<float> x_mid;     // (N, C) x_in + attn(an)
    std::vector<float> fn;        // (N, C) rmsnorm(x_mid, ffn_norm)
    std::vector<float> fn_rstd;   // (N)
    std::vector<float> gu;        // (N, 2F) [gate_proj fn | up_proj fn]
    std::vector<float> h;         // (N, F) silu(gate) * up
    std::vector<float> attn_out;  // (N, C) scratch: the attention, then the FFN branch output
    nn::AttnLayerActs attn;
  };
  // One decoder layer, the body training and KV-cache inference share: x_out = x_mid +
  // down(silu(gate f) * up f), f = rmsnorm(x_mid), x_mid = x_in + attn(rmsnorm(x_in)). a's
  // buffers are resized (no allocation once large enough); with save, a keeps what backward()
  // reads. x_out may be x_in (inference updates the stream in place).
  void layer_fwd(int64_t l, LayerActs& a, const float* x_in, float* x_out, int64_t B, int64_t T,
                 const float* cos_t, const float* sin_t, nn::KVCache* cache, bool save);
  // The FFN half of layer_fwd over BT rows: from a.x_mid to x_out.
  void ffn_fwd(int64_t l, LayerActs& a, float* x_out, int64_t BT);
  nn::AttnLayerWeights attn_weights(int64_t l) const;
  nn::AttnLayerGrads attn_grads(int64_t l);
  void rope_for(int64_t pos0, int64_t T);
  void require_trainable(const char* what) const;
  // Tensor i of the table: in its stored type, as float32 (throws if stored otherwise), and
  // its offset in params / grads (trainable models).
  TypedPtr wt(int64_t i) const;
  const float* wf(int64_t i) const { return i < 0 ? nullptr : wt(i).f32(); }
  int64_t off(int64_t i) const { return table_[static_cast<size_t>(i)].offset; }
  void index_tensors();

  ModelConfig cfg_;
  std::vector<TensorInfo> table_;
  std::map<std::string, size_t> index_;
  std::vector<LayerTensors> lt_;
  int64_t embed_ = 0, norm_ = 0, head_ = 0;  // tensor indices
  std::shared_ptr<const WeightStore> store_;
  std::vector<double> inv_freq_;  // RoPE frequencies (D/2), scaled per cfg_.rope_scaling

  // training activations
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, nf_;      // (N, C) the last layer's output, rmsnorm(., norm)
  std::vector<float> nf_rstd_, lse_, losses_;  // (N)
  std::vector<float> logits_;             // (N, V)
  int64_t counted_ = 0;
  std::vector<float> cos_, sin_;
  int64_t rope_pos0_ = -1, rope_T_ = -1;
  nn::AttnLayerScratch scratch_;
  std::vector<float> dx_, dbuf_;  // (N, C) gradient of the residual stream; scratch
  std::vector<float> dbig_, dgu_;  // (N, F), (N, 2F)
  std::vector<float> dlogits_;     // (N, V)
  // inference
  std::vector<nn::KVCache> caches_;
  // infer()'s buffers, reused by every layer and every call: after the prefill, decoding a
  // token allocates nothing here.
  struct InferScratch {
    LayerActs layer;
    std::vector<float> x, cos, sin, last, normed, rstd;
    nn::KVCache gathered;  // prefill_paged: a sequence's cached positions, contiguous
  } infer_;
};

// ---- safetensors ----
// DType: include/diffattn/dtype.h.

struct SafeTensor {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<float> data;  // converted to float32
};

struct SafeTensorsFile {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes float32 tensors (name, shape, data) and metadata, atomically, stored as dtype (BF16 and
// F16 rounded to nearest even).
struct SafeTensorRef {
  std::string name;
  Shape shape;
  const float* data = nullptr;
};
void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       DType dtype = DType::F32);
// The header alone: every tensor's dtype, shape and byte range in the data (checked: sizes
// without overflow, ranges inside the data, no overlaps), and the metadata.
struct SafeTensorEntry {
  DType dtype = DType::F32;
  Shape shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range in the data that follows the header
};
struct SafeTensorsHeader {
  std::map<std::string, SafeTensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data starts in the file
  uint64_t file_size = 0;
};
// The longest JSON header accepted (the reference implementation's limit too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Reads and checks only the first 8 + header-length bytes of path.
SafeTensorsHeader read_safetensors_header(const std::string& path);
// The same checks on bytes in memory (name: what messages call it).
SafeTensorsHeader parse_safetensors_header(const std::string& bytes, const std::string& name);
// Reads and checks a whole file: header length, JSON, dtype, shapes, offsets within the data,
// overlaps; the decoded tensors are checked against the machine's memory before allocation.
// Errors (IoError) name the file and the tensor.
SafeTensorsFile read_safetensors(const std::string& path);
// The data of a header already read by read_safetensors_header(path) (the file must still have
// the size it had).
SafeTensorsFile read_safetensors(const std::string& path, const SafeTensorsHeader& header);
// A whole safetensors file in memory (name: what messages call it).
SafeTensorsFile parse_safetensors(const std::string& bytes, const std::string& name);

// ---- model directories ----
// DIR/config.json + DIR/model.safetensors (F32). Creates DIR if needed.
void save_model(const Model& m, const std::string& dir);
// Loads a model directory; every FORMAT.md error is reported with the tensor or key and file.
Model load_model(const std::string& dir);
// Checks a header's tensor names and shapes against the config's tensor table (missing, extra,
// misshapen: the same errors as load_weights), before any model is allocated.
void check_weights_header(const ModelConfig& cfg, const SafeTensorsHeader& h, const std::string& where,
                          const std::string& prefix = "", bool allow_extra = false);
// Copies a model's tensors from a parsed file, checking names and shapes against the config, and
// that every value is finite (a NaN or Inf is an error naming the tensor and its first index).
void load_weights(Model& m, const SafeTensorsFile& f, const std::string& where,
                  const std::string& prefix = "", bool allow_extra = false);

// ---- Hugging Face checkpoints (docs/FORMAT.md, "Hugging Face directories") ----
// True when DIR/config.json has a "model_type" (and no "format"): a transformers directory.
bool is_hf_model_dir(const std::string& dir);
// The ModelConfig a transformers config.json ("llama" or "diffllama") maps onto; anything
// unsupported is an error naming `where` and the key.
ModelConfig hf_model_config(const std::string& text, const std::string& where);
// model.safetensors.index.json's weight_map: tensor name -> shard file (a plain name inside the
// directory: no '/', not "." or ".."); errors name `where`.
std::map<std::string, std::string> parse_hf_weight_map(const std::string& text,
                                                       const std::string& where);
// A LlamaForCausalLM or DiffLlamaForCausalLM directory: config.json, model.safetensors or the
// shards of model.safetensors.index.json. Weights stay in their stored type (F32, BF16, F16),
// memory-mapped where the layout allows; q/k/v rows are permuted once onto the project's layout.
// An inference model (Model::trainable() is false). load_model(dir) calls it for such a directory.
Model load_hf_model(const std::string& dir);
// Writes a diff_v1 model as a DiffLlama directory, a standard one as a Llama directory
// (config.json, generation_config.json, model.safetensors or `shards` files with their index),
// tensors stored as dtype. What DiffLlama lacks is folded in exactly or refused: V1's learned
// subln weight multiplies o_proj's columns; a fixed lambda_init, diff_v2 and biases on a
// diff_v2 model are errors naming the reason. load_hf_model(dir) gives back the same logits.
void save_hf_model(const Model& m, const std::string& dir, DType dtype = DType::F32,
                   int64_t shards = 1);

// ---- optimizer ----
struct AdamWOptions {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 10, total_steps = 100;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip = 1.0;  // global gradient-norm clip; 0 turns it off
};

// Learning rate at step (0-based): linear warmup to lr over `warmup` steps, then cosine decay
// to min_lr at total_steps.
double lr_at(const AdamWOptions& o, int64_t step);

struct AdamW {
  std::vector<float> m, v;  // first and second moments, laid out like Model::params
  int64_t t = 0;            // updates taken
  void reset(size_t n);
  // Clips grads to o.clip (global L2 norm, summed in double in a fixed order), then takes one
  // decoupled-weight-decay step. Returns the gradient norm before clipping.
  double step(Model& m, const AdamWOptions& o, double lr);
};

double grad_norm(const std::vector<float>& g);

// ---- sampling ----
struct SamplerOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // nucleus: smallest set with probability >= top_p
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);
  int32_t sample(const float* logits, int64_t V);

 private:
  SamplerOptions o_;
  Rng rng_;
};

// Number of parameters of a config (all tensors).
int64_t count_params(const ModelConfig& cfg);

}  // namespace diffattn
