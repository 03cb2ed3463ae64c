// Looking inside a trained model: the attention maps of a layer recomputed from the saved
// statistics of the fused forward (TrainContext::layer_attention and attention_probs: the forward
// itself keeps no T x T buffer), and the attention-noise analysis of arXiv:2410.05258's
// Table 3 on held-out multi-needle retrieval contexts (retrieval.h).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "diffattn/data/retrieval.h"
#include "diffattn/eval/views.h"
#include "diffattn/model/model.h"
#include "diffattn/model/train_context.h"

namespace diffattn::eval {

// The maps of one layer for one sequence of the model's last forward(). H is the layer's
// number of pairs (DIFF) or heads (standard).
//   map1, map2  DIFF only: softmax(s Q1 K1^T), softmax(s Q2 K2^T) of each pair
//   diff        DIFF only: A1 - lambda A2 (signed, the paper's operator; or clamp mode)
//   standard    a standard model: its one map. A DIFF model: the pair read as one standard
//               head of the full width, softmax([q1;q2].[k1;k2] / sqrt(2D)) (the textbook's
//               "standard view"); for V2, whose maps share one key head, k1 = k2 = k.
struct LayerMaps {
  nn::AttnKind kind = nn::AttnKind::DiffV1;
  int64_t layer = 0, H = 0, T = 0;
  std::vector<float> map1, map2, diff;  // (H, T, T)
  std::vector<float> standard;          // (H, T, T)
  std::vector<float> lambda;            // (H, T): the lambda row i of pair h used (DIFF only)
  bool has_pair() const { return !map1.empty(); }
};

struct MapOptions {
  // NaN: the model's own lambda (V1: the layer's; V2: sigmoid(lambda_proj x) per token).
  // A number replaces it for the differential map (the explorer's slider).
  double lambda = std::numeric_limits<double>::quiet_NaN();
  kernels::DiffMode mode = kernels::DiffMode::Signed;
  bool with_standard = true;  // DIFF models: also compute the full-width standard view
};

// After run.forward(...) over B sequences: the maps of `layer` for sequence b.
LayerMaps layer_maps(const model::TrainContext& run, int64_t layer, int64_t b, const MapOptions& o = {});

// The views of one head (or the mean over heads, head = -1), in the form views.h exports and
// the explorer draws. tokens label the T positions. A standard model has only `standard`.
AttentionViews head_views(const LayerMaps& maps, int64_t head, const std::vector<std::string>& tokens);
// The mean of several layers' views (same T and kind), e.g. every layer's head mean.
AttentionViews mean_views(const std::vector<AttentionViews>& views);

// Token labels of byte-level text, one per byte (control bytes escaped by viz::display_label).
std::vector<std::string> byte_labels(const std::vector<int32_t>& tokens);

// ---- attention noise (arXiv:2410.05258 Table 3) ----
//
// For each query of a held-out retrieval sample, the row of attention weights w at the query's
// answer position (the row that must retrieve the value) is split into
//   answer   the queried needle's span ('#' key value)
//   noise    the rest of the context (filler and the other needles)
// and reported as shares of the row's absolute mass sum_j |w_j| (softmax rows: 1; signed
// differential rows: 1 - lambda when no weight is negative, more when some are):
//   answer      sum_{answer} w / sum |w|
//   noise       sum_{noise} w / sum |w|        (signed: negative weights cancel positive ones)
//   noise_abs   sum_{noise} |w| / sum |w|      (what cancellation cannot hide)
// The remainder is the query's own tokens. Averaged over heads, queries and samples per layer.
struct NoiseStats {
  double answer = 0, noise = 0, noise_abs = 0;
};

struct NoiseLayer {
  int64_t layer = 0;
  NoiseStats main;       // the differential map (DIFF) or the softmax map (standard)
  NoiseStats map1;       // DIFF only: map 1 alone, before the subtraction
  double lambda = std::numeric_limits<double>::quiet_NaN();  // mean lambda of the answer rows
};

struct NoiseAnalysis {
  nn::AttnKind kind = nn::AttnKind::Standard;
  int64_t samples = 0, rows = 0;  // held-out samples, answer rows (queries) in them
  std::vector<NoiseLayer> layers;
  NoiseStats mean_main, mean_map1;  // over layers
  double accuracy = 0;              // share of the answers the model predicts (argmax)
};

// Runs `samples` held-out samples of `spec` (its seed is used as given: pass one the model was
// not trained on) through the model in batches and accumulates the shares.
NoiseAnalysis analyze_noise(model::TrainContext& run, const data::RetrievalSpec& spec, int64_t samples,
                            int64_t batch = 16);

// The shares of one weight row over keys [0, n): `answer_begin..answer_end` is the answer span,
// [0, context) the context. Exposed for tests.
NoiseStats row_noise(const float* w, int64_t n, int64_t context, int64_t answer_begin,
                     int64_t answer_end);

}  // namespace diffattn::eval
