// The retrieval experiment (experiment.h): one task, three attention kinds trained on identical
// batches, evaluated on held-out samples; the report's tables, charts and heatmaps.
#include "diffattn/eval/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "diffattn/base/text.h"
#include "diffattn/eval/lm_experiment.h"
#include "diffattn/kernels/runtime.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/viz/viz.h"

namespace diffattn::eval {

namespace {

std::string kind_label(nn::AttnKind k) {
  switch (k) {
    case nn::AttnKind::DiffV1: return "DIFF V1";
    case nn::AttnKind::DiffV2: return "DIFF V2";
    case nn::AttnKind::Standard: return "standard";
  }
  return "?";
}

std::string pct(double v) { return fixed(100.0 * v, 1) + "%"; }

// Scales every 2-D weight except the embeddings from the library's N(0, 0.02) to N(0, std).
void rescale_init(model::Model& m, double init_std) {
  if (init_std == 0.02) return;
  const float f = static_cast<float>(init_std / 0.02);
  const std::span<float> w = m.params();
  for (const model::TensorInfo& t : m.tensors()) {
    if (t.shape.size() != 2 || t.name == "embed_tokens.weight") continue;
    for (int64_t i = 0; i < t.numel; ++i) w[static_cast<size_t>(t.offset + i)] *= f;
  }
}

std::vector<std::string> model_header(const RetrievalExperimentResult& r, const std::string& first) {
  std::vector<std::string> h{first};
  for (const RetrievalModelResult& m : r.models) h.push_back(kind_label(m.kind));
  return h;
}

void tables(std::ostream& os, const RetrievalExperimentResult& r, bool md) {
  const RetrievalExperimentOptions& o = r.options;
  const std::string h = md ? "### " : "";
  const TableStyle style = md ? TableStyle::Markdown : TableStyle::Ruled;
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < o.lengths.size(); ++i) {
    std::vector<std::string> row{std::to_string(o.lengths[i])};
    for (const RetrievalModelResult& m : r.models) row.push_back(pct(m.acc_by_length[i]));
    rows.push_back(row);
  }
  os << h << "Accuracy by context length (" << o.eval_samples << " held-out samples x "
     << o.task.queries << " queries each)\n\n";
  print_table(os, model_header(r, "context"), rows, style);
  // What a model scores without matching keys: any needle's value, or (queries being asked of
  // distinct needles) one of the needles not asked for yet: query i has N - i candidates.
  double elimination = 0;
  for (int64_t i = 0; i < o.task.queries; ++i) elimination += 1.0 / static_cast<double>(o.task.needles - i);
  elimination /= static_cast<double>(o.task.queries);
  os << "\nWithout matching keys: a needle's value at random scores "
     << pct(1.0 / static_cast<double>(o.task.needles)) << "; one of the needles not asked for yet, "
     << pct(elimination) << ".\n";

  rows.clear();
  for (size_t i = 0; i < o.depths.size(); ++i) {
    std::vector<std::string> row{fixed(o.depths[i], 2)};
    for (const RetrievalModelResult& m : r.models) row.push_back(pct(m.acc_by_depth[i]));
    rows.push_back(row);
  }
  const int64_t dc = o.depth_context > 0 ? o.depth_context : o.task.context;
  os << "\n" << h << "Accuracy by needle depth (context " << dc << "; the first query's needle placed at the depth, "
     << o.eval_samples << " samples each)\n\n";
  print_table(os, model_header(r, "depth"), rows, style);

  rows.clear();
  for (const RetrievalModelResult& m : r.models) {
    const bool pair = m.kind != nn::AttnKind::Standard;
    auto add = [&](const std::string& layer, const NoiseStats& s, const std::string& map, double lam) {
      rows.push_back({kind_label(m.kind), layer, map, fixed(s.answer, 3), fixed(s.noise, 3), fixed(s.noise_abs, 3),
                      std::isnan(lam) ? std::string("-") : fixed(lam, 3)});
    };
    for (const NoiseLayer& l : m.noise.layers) {
      add(std::to_string(l.layer), l.main, pair ? "A1 - lambda A2" : "softmax", l.lambda);
      if (pair) add(std::to_string(l.layer), l.map1, "A1 alone", std::nan(""));
    }
    add("mean", m.noise.mean_main, pair ? "A1 - lambda A2" : "softmax", std::nan(""));
    if (pair) add("mean", m.noise.mean_map1, "A1 alone", std::nan(""));
  }
  os << "\n" << h << "Attention noise: shares of the answer rows' absolute attention mass ("
     << o.noise_samples << " held-out samples, context " << o.task.context << ")\n\n";
  print_table(os, {"model", "layer", "map", "answer", "noise", "noise |w|", "lambda"}, rows, style);
  os << (md ? "\n" : "") << "answer: weight on the queried needle; noise: signed weight on the rest of the context "
     << "(cancels); noise |w|: its absolute weight. Rows are the queries' answer positions, averaged over heads.\n";

  rows.clear();
  for (const RetrievalModelResult& m : r.models) {
    double tail = 0;
    const size_t n = std::min<size_t>(m.loss_curve.size(), 50);
    for (size_t i = m.loss_curve.size() - n; i < m.loss_curve.size(); ++i) tail += m.loss_curve[i];
    std::string lam;
    for (size_t l = 0; l < m.lambdas.size(); ++l) lam += (l ? " " : "") + fixed(m.lambdas[l], 3);
    rows.push_back({kind_label(m.kind), std::to_string(m.params), fixed(m.seconds, 1),
                    fixed(n ? tail / static_cast<double>(n) : 0.0, 3), lam.empty() ? "-" : lam});
  }
  os << "\n" << h << "Models\n\n";
  print_table(os, {"model", "parameters", "train s", "final loss", "lambda per layer"}, rows, style);
}

}  // namespace

model::ModelConfig version_of_size(const model::ModelConfig& s, nn::AttnKind kind, int64_t vocab_size) {
  return model::model_of_size(kind, s.d_model, s.n_layers, s.n_heads, s.ffn_dim, s.max_seq_len, vocab_size);
}

data::RetrievalSpec heldout(const data::RetrievalSpec& task) {
  data::RetrievalSpec h = task;
  h.seed = task.seed + 1000000007ull;
  return h;
}

double retrieval_accuracy(model::TrainContext& run, const data::RetrievalSpec& spec, int64_t samples, bool only_first,
                          int64_t batch) {
  const int64_t V = run.model().config().vocab_size;
  int64_t correct = 0, total = 0;
  for (int64_t s0 = 0; s0 < samples; s0 += batch) {
    const int64_t B = std::min(batch, samples - s0);
    const data::RetrievalBatch rb = data::make_retrieval_batch(spec, static_cast<uint64_t>(s0), B);
    const std::vector<data::RetrievalSample>& ss = rb.samples;
    const int64_t T = rb.T;
    run.forward(rb.tokens.data(), nullptr, B, T);
    for (int64_t b = 0; b < B; ++b) {
      const auto& qs = ss[static_cast<size_t>(b)].queries;
      for (size_t q = 0; q < (only_first ? 1 : qs.size()); ++q) {
        const float* lg = &run.logits()[static_cast<size_t>((b * T + qs[q].answer_pos) * V)];
        correct += std::max_element(lg, lg + V) - lg == qs[q].answer;
        ++total;
      }
    }
  }
  return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

RetrievalExperimentResult run_retrieval_experiment(const RetrievalExperimentOptions& opts,
                                                   const std::function<void(const std::string&)>& log) {
  RetrievalExperimentResult r;
  r.options = opts;
  RetrievalExperimentOptions& o = r.options;
  o.task.validate();
  if (o.lengths.empty()) o.lengths = {o.task.context};
  if (o.depth_context <= 0) o.depth_context = o.task.context;
  const int64_t longest = std::max(*std::max_element(o.lengths.begin(), o.lengths.end()), o.depth_context);
  // Room for the longest evaluated sample (the model may see contexts longer than it trained on).
  o.size.max_seq_len = std::max(o.size.max_seq_len, o.task.sample_len(std::max(longest, o.task.context)));
  const data::RetrievalSpec held = heldout(o.task);
  for (int64_t c : o.lengths) {
    data::RetrievalSpec s = held;
    s.context = c;
    s.min_context = 0;
    s.validate();
  }
  for (double d : o.depths) {
    data::RetrievalSpec s = held;
    s.context = o.depth_context;
    s.min_context = 0;
    s.depth = d;
    s.validate();
  }
  const data::RetrievalTask task(o.task);
  train::TrainOptions t = o.train;
  t.seq_len = task.max_len();
  t.seed = o.task.seed;
  t.corpus = "retrieval";  // not a corpus: a model trained here resumes through this experiment only
  t.tokenizer = "bytes";

  for (nn::AttnKind kind : o.kinds) {
    RetrievalModelResult mr;
    mr.kind = kind;
    model::Model init(version_of_size(o.size, kind));
    if (o.paired_init) {
      paired_init(init, o.task.seed, o.init_std);
    } else {
      init.init_weights(o.task.seed);
      rescale_init(init, o.init_std);
    }
    mr.params = init.num_params();
    if (!o.out_dir.empty()) mr.dir = o.out_dir + "/models/" + nn::attn_kind_name(kind);
    if (log) {
      log(kind_label(kind) + ": " + std::to_string(mr.params) + " parameters, training " +
          std::to_string(t.steps) + " steps of " + std::to_string(t.batch) + " x " + std::to_string(t.seq_len) +
          " tokens on " + std::to_string(kernels::num_threads()) + " thread(s)...");
    }
    train::Trainer tr(mr.dir, std::move(init), t);
    tr.progress = o.progress;
    const auto t0 = std::chrono::steady_clock::now();
    if (mr.dir.empty()) {
      for (int64_t s = 0; s < t.steps; ++s) mr.loss_curve.push_back(tr.step(task).loss);
    } else {
      make_dirs(mr.dir);
      write_file_atomic(mr.dir + "/retrieval.json", o.task.to_json());
      tr.run(task, nullptr, 0, [&](const train::StepLog& s) { mr.loss_curve.push_back(s.loss); });
    }
    mr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    model::TrainContext& run = tr.context();
    for (int64_t c : o.lengths) {
      data::RetrievalSpec s = held;
      s.context = c;
      s.min_context = 0;
      mr.acc_by_length.push_back(retrieval_accuracy(run, s, o.eval_samples));
    }
    for (double d : o.depths) {
      data::RetrievalSpec s = held;
      s.context = o.depth_context;
      s.min_context = 0;
      s.depth = d;
      mr.acc_by_depth.push_back(retrieval_accuracy(run, s, o.eval_samples, true));
    }
    data::RetrievalSpec ns = held;
    ns.context = o.task.context;
    ns.min_context = 0;
    mr.noise = analyze_noise(run, ns, o.noise_samples);
    if (kind == nn::AttnKind::DiffV1) {
      mr.lambdas = run.model().layer_lambdas();
    } else if (kind == nn::AttnKind::DiffV2) {
      for (const NoiseLayer& l : mr.noise.layers) mr.lambdas.push_back(l.lambda);
    }
    if (log) {
      double tail = 0;
      const size_t n = std::min<size_t>(mr.loss_curve.size(), 50);
      for (size_t i = mr.loss_curve.size() - n; i < mr.loss_curve.size(); ++i) tail += mr.loss_curve[i];
      log(kind_label(kind) + ": " + fixed(mr.seconds, 1) + " s, final loss " + fixed(n ? tail / static_cast<double>(n) : 0.0, 3) +
          ", held-out accuracy at context " + std::to_string(o.lengths.back()) + ": " + pct(mr.acc_by_length.back()) +
          (mr.dir.empty() ? "" : "  -> " + mr.dir));
    }
    r.models.push_back(std::move(mr));
  }
  return r;
}

void print_retrieval_tables(std::ostream& os, const RetrievalExperimentResult& r) { tables(os, r, false); }

namespace {

// One held-out query's answer row in every layer and head of a model: (L*H, n) with row labels.
struct QueryRows {
  std::vector<float> w;
  std::vector<std::string> labels;
  int64_t rows = 0, n = 0;
  bool signed_map = false;
};

QueryRows query_rows(model::TrainContext& run, const data::RetrievalSample& s) {
  const int64_t T = static_cast<int64_t>(s.tokens.size());
  run.forward(s.tokens.data(), nullptr, 1, T);
  QueryRows q;
  const data::RetrievalQuery& first = s.queries[0];
  q.n = first.answer_pos + 1;
  MapOptions mo;
  mo.with_standard = false;
  for (int64_t l = 0; l < run.model().config().n_layers; ++l) {
    const LayerMaps mp = layer_maps(run, l, 0, mo);
    q.signed_map = mp.has_pair();
    const std::vector<float>& src = mp.has_pair() ? mp.diff : mp.standard;
    for (int64_t h = 0; h < mp.H; ++h) {
      const float* row = &src[static_cast<size_t>((h * T + first.answer_pos) * T)];
      q.w.insert(q.w.end(), row, row + q.n);
      q.labels.push_back("layer " + std::to_string(l) + " head " + std::to_string(h));
      ++q.rows;
    }
  }
  return q;
}

}  // namespace

std::vector<std::string> write_retrieval_report(RetrievalExperimentResult& r, const std::string& dir) {
  viz::make_dirs(dir);
  const RetrievalExperimentOptions& o = r.options;
  std::vector<std::string> files;
  const double chance = 1.0 / static_cast<double>(o.task.needles);
  auto chart = [&](const std::string& name, const std::string& title, const std::string& xl,
                   const std::vector<double>& xs, auto values) {
    std::vector<viz::Series> series;
    for (const RetrievalModelResult& m : r.models) {
      viz::Series s;
      s.name = kind_label(m.kind);
      s.x = xs;
      s.y = values(m);
      series.push_back(s);
    }
    viz::Series c;
    c.name = "a needle at random (1/N)";
    c.x = {xs.front(), xs.back()};
    c.y = {chance, chance};
    c.dashed = true;
    c.markers = false;
    series.push_back(c);
    viz::ChartSpec spec;
    spec.title = title;
    spec.x_label = xl;
    spec.y_label = "held-out accuracy";
    spec.ymin = 0;
    spec.ymax = 1.02;
    viz::write_png(dir + "/" + name, viz::render_line_chart(series, spec));
    files.push_back(dir + "/" + name);
  };
  std::vector<double> xs(o.lengths.begin(), o.lengths.end());
  chart("accuracy_by_length.png",
        "Multi-needle retrieval: accuracy by context length (N = " + std::to_string(o.task.needles) + ", R = " +
            std::to_string(o.task.queries) + ")",
        "context length (tokens)", xs, [](const RetrievalModelResult& m) { return m.acc_by_length; });
  chart("accuracy_by_depth.png",
        "Accuracy by depth of the queried needle (context " + std::to_string(o.depth_context) + ")",
        "needle depth (0 = start of the context, 1 = end)", o.depths,
        [](const RetrievalModelResult& m) { return m.acc_by_depth; });
  {
    std::vector<viz::Series> series;
    for (const RetrievalModelResult& m : r.models) {
      viz::Series s;
      s.name = kind_label(m.kind);
      s.markers = false;
      const size_t win = std::max<size_t>(1, m.loss_curve.size() / 50);
      for (size_t i = 0; i + win <= m.loss_curve.size(); i += win) {
        double a = 0;
        for (size_t k = i; k < i + win; ++k) a += m.loss_curve[k];
        s.x.push_back(static_cast<double>(i + win));
        s.y.push_back(a / static_cast<double>(win));
      }
      series.push_back(s);
    }
    viz::ChartSpec spec;
    spec.title = "Training loss on the answer tokens (same batches for every model)";
    spec.x_label = "step";
    spec.y_label = "cross-entropy (nats)";
    spec.ymin = 0;
    viz::write_png(dir + "/training_loss.png", viz::render_line_chart(series, spec));
    files.push_back(dir + "/training_loss.png");
  }
  // One held-out sample's first query, in every model that has its weights at hand.
  data::RetrievalSpec s = heldout(o.task);
  s.context = o.task.context;
  s.min_context = 0;
  s.depth = 0.5;
  const data::RetrievalSample sample = data::make_retrieval_sample(s, 0);
  std::vector<viz::Canvas> panels;
  for (RetrievalModelResult& mr : r.models) {
    if (mr.dir.empty()) continue;
    const model::Model m = model::load_model(mr.dir);
    model::TrainContext run(m);
    const QueryRows q = query_rows(run, sample);
    viz::HeatmapSpec spec;
    spec.title = kind_label(mr.kind) + (q.signed_map ? ": A1 - lambda A2" : ": softmax") + ", row of the query \"" +
                 sample.text().substr(static_cast<size_t>(sample.context), static_cast<size_t>(o.task.query_len() - 1)) + "\"";
    spec.row_labels = q.labels;
    spec.col_labels = byte_labels(std::vector<int32_t>(sample.tokens.begin(), sample.tokens.begin() + q.n));
    spec.row_axis = "layer, head";
    spec.row_px = 14;  // a few rows (layers x heads) of many key positions: a line of text each
    spec.col_axis = "key position";
    spec.scale = q.signed_map ? viz::ColorScale::Diverging : viz::ColorScale::Sequential;
    panels.push_back(viz::render_heatmap(q.w.data(), static_cast<int>(q.rows), static_cast<int>(q.n), spec));
    const std::string npy = dir + "/query_row_" + nn::attn_kind_name(mr.kind) + ".npy";
    viz::write_npy(npy, q.w.data(), {q.rows, q.n});
    files.push_back(npy);
  }
  if (!panels.empty()) {
    const data::RetrievalNeedle& nd = sample.needles[static_cast<size_t>(sample.queries[0].needle)];
    viz::write_png(dir + "/query_row.png",
                   viz::compose(panels, 1, "Where the first query looks (needle \"" + nd.key + "\" at positions " +
                                               std::to_string(nd.start) + "-" +
                                               std::to_string(nd.start + o.task.needle_len() - 1) + ")"));
    files.push_back(dir + "/query_row.png");
  }

  std::ostringstream md;
  md << "# Multi-needle retrieval: DIFF V1, DIFF V2 and standard attention\n\n"
     << "After the key-information-retrieval setup of arXiv:2410.05258 (section 3.4), at small scale on "
        "this machine. Produced by `diffattn experiment retrieval`.\n\n"
     << "- task: " << data::RetrievalTask(o.task).describe() << "; "
     << plural(o.task.near_misses < 0 ? o.task.needles - o.task.queries : o.task.near_misses, "near-miss needle")
     << " per context" << (o.task.near_misses < 0 ? " (every unqueried one)" : "")
     << "; keys of " << o.task.key_len << " symbols from "
     << o.task.key_symbols << ", values from " << o.task.value_symbols << "\n"
     << "- sample: `" << sample.text() << "`\n"
     << "- training: " << o.train.steps << " steps of " << o.train.batch << " sequences, lr " << o.train.adamw.lr
     << ", the same seed and batches for every model; loss on the answer tokens only\n"
     << "- models: d_model " << o.size.d_model << ", " << o.size.n_layers << " layers, " << o.size.n_heads
     << " standard heads (DIFF V1: " << o.size.n_heads / 2 << " pairs), initial weights N(0, " << o.init_std << ")\n"
     << "- held-out samples: seed " << heldout(o.task).seed << " (training: " << o.task.seed << ")\n\n";
  tables(md, r, true);
  md << "\n![accuracy by context length](accuracy_by_length.png)\n\n![accuracy by depth](accuracy_by_depth.png)\n\n"
     << "![training loss](training_loss.png)\n\n";
  if (!panels.empty()) md << "![the first query's attention row](query_row.png)\n\n";
  md << "Models: " ;
  for (const RetrievalModelResult& m : r.models) md << (m.dir.empty() ? "(not saved)" : "`" + m.dir + "`") << " ";
  md << "\n\nLook inside them with `diffattn maps --model DIR --prompt TEXT`, `diffattn analyze --model DIR` and "
        "`diffattn explore --model DIR`.\n";
  viz::write_file_atomic(dir + "/report.md", md.str());
  files.insert(files.begin(), dir + "/report.md");
  r.files = files;
  return files;
}

std::pair<double, double> wilson_interval(double k, double n) {
  if (n <= 0) return {std::nan(""), std::nan("")};
  const double z = 1.959964, p = k / n, z2n = z * z / n;
  const double c = (p + z2n / 2) / (1 + z2n);
  const double h = z * std::sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n);
  return {std::max(0.0, c - h), std::min(1.0, c + h)};
}

std::vector<std::string> write_retrieval_seed_summary(const std::vector<RetrievalExperimentResult>& runs,
                                                      const std::string& dir) {
  if (runs.empty()) throw InvalidArgument("retrieval seed summary: no runs");
  make_dirs(dir);
  const RetrievalExperimentOptions& o = runs.front().options;
  const double n = static_cast<double>(o.eval_samples * o.task.queries);
  const double chance = 1.0 / static_cast<double>(o.task.needles);
  double elimination = 0;
  for (int64_t i = 0; i < o.task.queries; ++i) elimination += 1.0 / static_cast<double>(o.task.needles - i);
  elimination /= static_cast<double>(o.task.queries);
  auto ci = [](const Interval& c) {
    return pct(c.mean) + " [" + (std::isnan(c.lo) ? std::string("-") : pct(c.lo)) + ", " +
           (std::isnan(c.hi) ? std::string("-") : pct(c.hi)) + "]";
  };
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json j;
  j["format"] = "diffattn-retrieval-seeds/1";
  j["chance"] = chance;
  j["elimination"] = elimination;
  j["lengths"] = o.lengths;
  j["queries_per_seed"] = o.eval_samples * o.task.queries;
  std::ostringstream md;
  md << "# Multi-needle retrieval over " << runs.size() << " seeds\n\nSeeds:";
  for (const RetrievalExperimentResult& r : runs) md << " " << r.options.task.seed;
  md << " (one run each, in seed-N/). Each seed: " << o.train.steps << " training steps, " << o.eval_samples
     << " held-out samples x " << o.task.queries << " queries per context length; the models of a seed start "
     << (o.paired_init ? "from paired weights (every tensor of the same name and shape byte-identical)"
                       : "from the same seed")
     << " and read the same batches. Chance: " << pct(chance) << " (a needle's value at random); elimination "
     << "baseline " << pct(elimination) << ".\n\n## Accuracy by context length\n\nPer seed: accuracy [95% Wilson "
     << "interval over its " << static_cast<int64_t>(n) << " held-out queries]; mean: over seeds [95% Student-t "
     << "interval over seeds]. 'against chance': the mean's interval lies above or below " << pct(chance)
     << ", or contains it (not separated).\n\n";
  std::vector<std::string> head{"model", "context"};
  for (const RetrievalExperimentResult& r : runs) head.push_back("seed " + std::to_string(r.options.task.seed));
  head.insert(head.end(), {"mean over seeds", "against chance"});
  std::vector<std::vector<std::string>> rows;
  for (size_t k = 0; k < o.kinds.size(); ++k) {
    for (size_t l = 0; l < o.lengths.size(); ++l) {
      std::vector<std::string> row{kind_label(o.kinds[k]), std::to_string(o.lengths[l])};
      std::vector<double> acc;
      nlohmann::json js = nlohmann::json::array();
      for (const RetrievalExperimentResult& r : runs) {
        const double a = r.models[k].acc_by_length[l];
        const auto [lo, hi] = wilson_interval(a * n, n);
        acc.push_back(a);
        row.push_back(pct(a) + " [" + pct(lo) + ", " + pct(hi) + "]");
        js.push_back({{"seed", r.options.task.seed}, {"accuracy", a}, {"lo", lo}, {"hi", hi}});
      }
      const Interval c = t_interval(acc);
      row.push_back(ci(c));
      row.push_back(std::isnan(c.lo) ? "-" : c.lo > chance ? "above" : c.hi < chance ? "below" : "not separated");
      rows.push_back(row);
      j["accuracy"][nn::attn_kind_name(o.kinds[k])][std::to_string(o.lengths[l])] = {
          {"per_seed", js}, {"mean", c.mean}, {"lo", num(c.lo)}, {"hi", num(c.hi)}};
    }
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\n## Paired differences (A - B, accuracy points; per seed, then the t-interval over seeds)\n\n";
  head = {"A - B", "context"};
  for (const RetrievalExperimentResult& r : runs) head.push_back("seed " + std::to_string(r.options.task.seed));
  head.push_back("mean over seeds");
  rows.clear();
  for (size_t a = 0; a < o.kinds.size(); ++a) {
    for (size_t b = 0; b < o.kinds.size(); ++b) {
      const bool against_std = o.kinds[b] == nn::AttnKind::Standard && o.kinds[a] != nn::AttnKind::Standard;
      const bool v1_v2 = o.kinds[a] == nn::AttnKind::DiffV1 && o.kinds[b] == nn::AttnKind::DiffV2;
      if (!against_std && !v1_v2) continue;
      for (size_t l = 0; l < o.lengths.size(); ++l) {
        std::vector<std::string> row{kind_label(o.kinds[a]) + " - " + kind_label(o.kinds[b]),
                                     std::to_string(o.lengths[l])};
        std::vector<double> d;
        for (const RetrievalExperimentResult& r : runs) {
          d.push_back(r.models[a].acc_by_length[l] - r.models[b].acc_by_length[l]);
          row.push_back(pct(d.back()));
        }
        const Interval c = t_interval(d);
        row.push_back(ci(c));
        rows.push_back(row);
        j["paired"].push_back({{"a", nn::attn_kind_name(o.kinds[a])}, {"b", nn::attn_kind_name(o.kinds[b])},
                               {"context", o.lengths[l]}, {"per_seed", d}, {"mean", c.mean},
                               {"lo", num(c.lo)}, {"hi", num(c.hi)}});
      }
    }
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\nWith a few seeds the interval over seeds is wide: it samples the training noise, it does not bound it. "
        "The Wilson intervals cover the held-out sampling of one trained model only.\n";
  const std::string mpath = dir + "/summary.md", jpath = dir + "/summary.json";
  write_file_atomic(mpath, md.str());
  write_file_atomic(jpath, j.dump(1) + "\n");
  return {mpath, jpath};
}

}  // namespace diffattn::eval
