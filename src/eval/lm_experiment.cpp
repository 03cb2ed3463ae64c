// The paired language-model experiment (lm_experiment.h): paired initialisation, the corpus of
// scripts/corpus.py as bytes, per-document held-out loss, paired t-intervals, the report.
#include "diffattn/eval/lm_experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "diffattn/base/error.h"
#include "diffattn/base/files.h"
#include "diffattn/base/text.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/viz/viz.h"

namespace diffattn::eval {

namespace {

using json = nlohmann::json;

std::string label(nn::AttnKind k) {
  switch (k) {
    case nn::AttnKind::DiffV1: return "DIFF V1";
    case nn::AttnKind::DiffV2: return "DIFF V2";
    case nn::AttnKind::Standard: return "standard";
  }
  return "?";
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<LmDocument> read_split(const std::string& path, int64_t max_docs) {
  const std::string text = read_file(path);
  std::vector<LmDocument> docs;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    LmDocument d;
    try {
      const json j = json::parse(line);
      d.id = j.at("source").get<std::string>() + "/" + j.at("id").get<std::string>();
      const std::string t = j.at("text").get<std::string>();
      d.tokens.reserve(t.size());
      for (unsigned char c : t) d.tokens.push_back(c);
    } catch (const json::exception& e) {
      throw IoError(path + " line " + std::to_string(n) + ": not a corpus record {\"source\", \"id\", \"text\"} (" +
                    e.what() + ")");
    }
    docs.push_back(std::move(d));
    if (max_docs > 0 && static_cast<int64_t>(docs.size()) >= max_docs) break;
  }
  if (docs.empty()) throw IoError(path + ": no documents");
  return docs;
}

std::string ci(const Interval& c) {
  auto s = [](double v) { return (v >= 0 ? "+" : "") + fixed(v, 4); };
  return s(c.mean) + " [" + (std::isnan(c.lo) ? std::string("-") : s(c.lo)) + ", " +
         (std::isnan(c.hi) ? std::string("-") : s(c.hi)) + "]";
}

json interval_json(const Interval& c) {
  auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
  return {{"n", c.n}, {"mean", num(c.mean)}, {"lo", num(c.lo)}, {"hi", num(c.hi)}};
}

}  // namespace

LmCorpus read_lm_corpus(const std::string& dir, int64_t max_docs) {
  LmCorpus c;
  for (const char* f : {"/train.jsonl", "/heldout.jsonl"}) {
    if (!std::filesystem::is_regular_file(dir + f)) {
      throw IoError("corpus " + dir + f + " not found; build it with `make corpus` (scripts/corpus.py --out " + dir +
                    ")");
    }
  }
  std::vector<LmDocument> train = read_split(dir + "/train.jsonl", max_docs);
  c.train_documents = static_cast<int64_t>(train.size());
  for (size_t i = 0; i < train.size(); ++i) {
    if (i) c.train.insert(c.train.end(), {'\n', '\n'});
    c.train.insert(c.train.end(), train[i].tokens.begin(), train[i].tokens.end());
  }
  c.heldout = read_split(dir + "/heldout.jsonl", max_docs);
  return c;
}

void paired_init(model::Model& m, uint64_t seed, double init_std) {
  for (const model::TensorInfo& t : m.tensors()) {
    std::string key = std::to_string(seed) + "/" + t.name + "/";
    for (int64_t d : t.shape) key += std::to_string(d) + ",";
    uint64_t s = fnv1a(key);
    const bool ones = t.name.ends_with("norm.weight") || t.name.ends_with("subln.weight");
    const bool lam = t.name.find(".lambda_q") != std::string::npos || t.name.find(".lambda_k") != std::string::npos;
    const double sd = lam ? 0.1 : init_std;
    float* p = m.params().data() + t.offset;
    for (int64_t i = 0; i < t.numel; i += 2) {
      // Box-Muller on two uniforms in (0, 1]
      const double u1 = (static_cast<double>(splitmix(s) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double z0 = r * std::cos(6.283185307179586 * u2), z1 = r * std::sin(6.283185307179586 * u2);
      p[i] = ones ? 1.0f : static_cast<float>(sd * z0);
      if (i + 1 < t.numel) p[i + 1] = ones ? 1.0f : static_cast<float>(sd * z1);
    }
  }
}

int64_t check_pairing(const std::vector<const model::Model*>& models) {
  std::map<std::string, std::vector<std::pair<const model::Model*, const model::TensorInfo*>>> by;
  for (const model::Model* m : models) {
    for (const model::TensorInfo& t : m->tensors()) {
      std::string key = t.name + " (";
      for (int64_t d : t.shape) key += std::to_string(d) + ",";
      by[key + ")"].push_back({m, &t});
    }
  }
  int64_t shared = 0;
  for (const auto& [key, v] : by) {
    if (v.size() < 2) continue;
    ++shared;
    const float* a = v[0].first->params().data() + v[0].second->offset;
    for (size_t i = 1; i < v.size(); ++i) {
      const float* b = v[i].first->params().data() + v[i].second->offset;
      if (std::memcmp(a, b, static_cast<size_t>(v[0].second->numel) * sizeof(float)) != 0) {
        throw InvalidArgument("pairing: tensor " + key + " differs between the models");
      }
    }
  }
  return shared;
}

double t975(int64_t df) {
  static const double t[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                               2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                               2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return std::nan("");
  if (df <= 30) return t[df - 1];
  const double z = 1.959964, d = static_cast<double>(df);
  return z + (z * z * z + z) / (4 * d) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * d * d);
}

Interval t_interval(const std::vector<double>& x) {
  Interval c;
  c.n = static_cast<int64_t>(x.size());
  if (x.empty()) {
    c.mean = c.lo = c.hi = std::nan("");
    return c;
  }
  double s = 0;
  for (double v : x) s += v;
  c.mean = s / static_cast<double>(c.n);
  if (c.n < 2) {
    c.lo = c.hi = std::nan("");
    return c;
  }
  double ss = 0;
  for (double v : x) ss += (v - c.mean) * (v - c.mean);
  const double h = t975(c.n - 1) * std::sqrt(ss / static_cast<double>(c.n - 1) / static_cast<double>(c.n));
  c.lo = c.mean - h;
  c.hi = c.mean + h;
  return c;
}

std::vector<std::pair<int64_t, int64_t>> position_buckets(int64_t T) {
  std::vector<int64_t> e{0, 8, 64};
  while (e.back() * 4 < T) e.push_back(e.back() * 4);
  std::vector<int64_t> edges;
  for (int64_t v : e) {
    if (v < T) edges.push_back(v);
  }
  edges.push_back(T);
  std::vector<std::pair<int64_t, int64_t>> b;
  for (size_t i = 0; i + 1 < edges.size(); ++i) b.push_back({edges[i], edges[i + 1]});
  return b;
}

LmExperimentResult run_lm_experiment(const LmExperimentOptions& o, const std::function<void(const std::string&)>& log) {
  const auto t_start = std::chrono::steady_clock::now();
  if (o.seeds.empty() || o.kinds.empty()) throw InvalidArgument("experiment lm: no seeds or no kinds");
  if (o.eval_windows < 1) throw InvalidArgument("experiment lm: eval_windows must be >= 1");
  LmExperimentResult r;
  r.options = o;
  const LmCorpus corpus = read_lm_corpus(o.corpus_dir, o.max_docs);
  const int64_t T = o.train.seq_len;
  if (static_cast<int64_t>(corpus.train.size()) < T + 2) {
    throw InvalidArgument("experiment lm: " + std::to_string(corpus.train.size()) +
                          " training bytes, fewer than seq_len + 2");
  }
  r.train_tokens = static_cast<int64_t>(corpus.train.size());
  r.train_documents = corpus.train_documents;
  r.buckets = position_buckets(T);
  const size_t nd = corpus.heldout.size(), nb = r.buckets.size();
  for (const LmDocument& d : corpus.heldout) r.heldout_ids.push_back(d.id);

  // held-out windows: each document's first eval_windows windows of T predicted bytes
  struct Window {
    size_t doc;
    std::vector<int32_t> tokens, targets;
  };
  std::vector<Window> windows;
  for (size_t d = 0; d < nd; ++d) {
    const std::vector<int32_t>& a = corpus.heldout[d].tokens;
    for (int64_t w = 0; w < o.eval_windows; ++w) {
      const int64_t s = w * T;
      if (s + 1 >= static_cast<int64_t>(a.size())) break;
      Window win{d, std::vector<int32_t>(static_cast<size_t>(T), 0), std::vector<int32_t>(static_cast<size_t>(T), -1)};
      for (int64_t i = 0; i < T && s + i + 1 < static_cast<int64_t>(a.size()); ++i) {
        win.tokens[static_cast<size_t>(i)] = a[static_cast<size_t>(s + i)];
        win.targets[static_cast<size_t>(i)] = a[static_cast<size_t>(s + i + 1)];
        ++r.heldout_tokens_scored;
      }
      windows.push_back(std::move(win));
    }
  }

  for (uint64_t seed : o.seeds) {
    LmSeedResult sr;
    sr.seed = seed;
    const data::TokenWindows train(corpus.train, seed, "lm corpus");
    train::TrainOptions t = o.train;
    t.seed = seed;
    t.corpus = "lm-experiment";  // not a load_corpus spec: these runs are not resumed
    t.tokenizer = "bytes";
    std::vector<model::Model> inits;
    for (nn::AttnKind kind : o.kinds) {
      model::ModelConfig size = o.size;
      size.max_seq_len = T;
      inits.emplace_back(version_of_size(size, kind));
      paired_init(inits.back(), seed, o.init_std);
    }
    std::vector<const model::Model*> ptrs;
    for (const model::Model& m : inits) ptrs.push_back(&m);
    r.shared_tensors = check_pairing(ptrs);
    for (size_t k = 0; k < o.kinds.size(); ++k) {
      LmModelResult mr;
      mr.kind = o.kinds[k];
      mr.params = inits[k].num_params();
      if (log) {
        log("seed " + std::to_string(seed) + " " + label(mr.kind) + ": " + std::to_string(mr.params) +
            " parameters, " + std::to_string(t.steps) + " steps of " + std::to_string(t.batch) + " x " +
            std::to_string(T) + " bytes");
      }
      train::Trainer tr("", std::move(inits[k]), t);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < t.steps; ++s) mr.loss_curve.push_back(tr.step(train).loss);
      mr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      model::TrainContext& run = tr.context();
      const int64_t V = run.model().config().vocab_size;
      std::vector<double> dsum(nd, 0), dcnt(nd, 0);
      std::vector<std::vector<double>> bsum(nd, std::vector<double>(nb, 0)), bcnt = bsum;
      std::vector<double> lam_sum;
      for (const Window& w : windows) {
        run.forward(w.tokens.data(), w.targets.data(), 1, T);
        const std::vector<float>& lg = run.logits();
        for (int64_t i = 0; i < T; ++i) {
          const int32_t y = w.targets[static_cast<size_t>(i)];
          if (y < 0) continue;
          const float* row = &lg[static_cast<size_t>(i * V)];
          double mx = row[0];
          for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
          double z = 0;
          for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
          const double ce = mx + std::log(z) - row[y];
          dsum[w.doc] += ce;
          dcnt[w.doc] += 1;
          for (size_t b = 0; b < nb; ++b) {
            if (i >= r.buckets[b].first && i < r.buckets[b].second) {
              bsum[w.doc][b] += ce;
              bcnt[w.doc][b] += 1;
            }
          }
        }
        if (mr.kind == nn::AttnKind::DiffV2) {
          const std::vector<double> l = run.layer_lambdas();
          if (lam_sum.empty()) lam_sum.assign(l.size(), 0);
          for (size_t i = 0; i < l.size(); ++i) lam_sum[i] += l[i] / static_cast<double>(windows.size());
        }
      }
      mr.lambdas = mr.kind == nn::AttnKind::DiffV1 ? run.layer_lambdas() : lam_sum;
      double total = 0;
      for (size_t d = 0; d < nd; ++d) {
        mr.doc_loss.push_back(dcnt[d] > 0 ? dsum[d] / dcnt[d] : std::nan(""));
        total += mr.doc_loss.back();
        std::vector<double> bl(nb);
        for (size_t b = 0; b < nb; ++b) bl[b] = bcnt[d][b] > 0 ? bsum[d][b] / bcnt[d][b] : std::nan("");
        mr.bucket_loss.push_back(bl);
      }
      mr.loss_doc_mean = total / static_cast<double>(nd);
      if (log) {
        log("  " + fixed(mr.seconds, 1) + " s, held-out loss " + fixed(mr.loss_doc_mean, 4) + " nats per byte");
      }
      sr.models.push_back(std::move(mr));
    }
    r.seeds.push_back(std::move(sr));
  }

  for (size_t a = 0; a < o.kinds.size(); ++a) {
    for (size_t b = a + 1; b < o.kinds.size(); ++b) {
      // standard is always the B side when present
      size_t ia = a, ib = b;
      if (o.kinds[a] == nn::AttnKind::Standard) std::swap(ia, ib);
      LmPaired p{o.kinds[ia], o.kinds[ib], {}, {}, {}, {}};
      std::vector<double> pooled(nd, 0);
      std::vector<std::vector<double>> pooled_b(nb, std::vector<double>(nd, 0));
      std::vector<double> means;
      for (const LmSeedResult& s : r.seeds) {
        std::vector<double> d(nd);
        for (size_t i = 0; i < nd; ++i) {
          d[i] = s.models[ia].doc_loss[i] - s.models[ib].doc_loss[i];
          pooled[i] += d[i] / static_cast<double>(r.seeds.size());
          for (size_t k = 0; k < nb; ++k) {
            pooled_b[k][i] += (s.models[ia].bucket_loss[i][k] - s.models[ib].bucket_loss[i][k]) /
                              static_cast<double>(r.seeds.size());
          }
        }
        p.per_seed.push_back(t_interval(d));
        means.push_back(p.per_seed.back().mean);
      }
      p.pooled = t_interval(pooled);
      p.across_seeds = t_interval(means);
      for (size_t k = 0; k < nb; ++k) {
        std::vector<double> f;
        for (double v : pooled_b[k]) {
          if (std::isfinite(v)) f.push_back(v);
        }
        p.by_bucket.push_back(t_interval(f));
      }
      r.paired.push_back(std::move(p));
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return r;
}

std::vector<std::string> write_lm_report(const LmExperimentResult& r, const std::string& dir) {
  make_dirs(dir);
  const LmExperimentOptions& o = r.options;
  json j;
  j["format"] = "diffattn-lm-experiment/1";
  j["corpus"] = {{"dir", o.corpus_dir}, {"train_bytes", r.train_tokens}, {"train_documents", r.train_documents},
                 {"heldout_documents", r.heldout_ids.size()}, {"heldout_bytes_scored", r.heldout_tokens_scored},
                 {"heldout_ids", r.heldout_ids}};
  j["options"] = {{"d_model", o.size.d_model}, {"n_layers", o.size.n_layers}, {"n_heads", o.size.n_heads},
                  {"ffn_dim", o.size.ffn_dim}, {"seq_len", o.train.seq_len}, {"batch", o.train.batch},
                  {"steps", o.train.steps}, {"lr", o.train.adamw.lr}, {"warmup", o.train.adamw.warmup},
                  {"weight_decay", o.train.adamw.weight_decay}, {"init_std", o.init_std},
                  {"eval_windows", o.eval_windows}, {"seeds", o.seeds}};
  j["tokens_per_model"] = o.train.steps * o.train.batch * o.train.seq_len;
  j["buckets"] = r.buckets;
  j["pairing"] = {{"shared_tensors", r.shared_tensors}, {"identical", true}};
  j["ci_method"] = "95% Student-t interval of the mean per-document paired difference (documents as the unit)";
  j["seconds"] = r.seconds;
  for (const LmSeedResult& s : r.seeds) {
    json js = {{"seed", s.seed}};
    for (const LmModelResult& m : s.models) {
      json dl = json::array();
      for (double v : m.doc_loss) dl.push_back(std::isnan(v) ? json(nullptr) : json(v));
      js["models"][nn::attn_kind_name(m.kind)] = {{"params", m.params}, {"train_seconds", m.seconds},
                                                  {"loss_curve", m.loss_curve}, {"doc_loss", dl},
                                                  {"loss_doc_mean", m.loss_doc_mean}, {"lambdas", m.lambdas}};
    }
    j["seeds"].push_back(js);
  }
  for (const LmPaired& p : r.paired) {
    json jp = {{"a", nn::attn_kind_name(p.a)}, {"b", nn::attn_kind_name(p.b)}, {"pooled", interval_json(p.pooled)},
               {"across_seeds", interval_json(p.across_seeds)}};
    for (const Interval& c : p.per_seed) jp["per_seed"].push_back(interval_json(c));
    for (const Interval& c : p.by_bucket) jp["by_bucket"].push_back(interval_json(c));
    j["paired"].push_back(jp);
  }
  const std::string jpath = dir + "/report.json";
  write_file_atomic(jpath, j.dump(1) + "\n");

  std::ostringstream md;
  const int64_t tokens = o.train.steps * o.train.batch * o.train.seq_len;
  md << "# Paired language-model experiment (`diffattn experiment lm`)\n\n## Scale and budget\n\n"
     << "- Models: d_model " << o.size.d_model << ", " << o.size.n_layers << " layers, " << o.size.n_heads
     << " standard heads, SwiGLU " << o.size.ffn_dim << " (V2 narrower to match), byte vocabulary, seq_len "
     << o.train.seq_len << ". Parameters:";
  for (size_t k = 0; k < r.seeds.front().models.size(); ++k) {
    const LmModelResult& m = r.seeds.front().models[k];
    md << (k ? ", " : " ") << label(m.kind) << " " << m.params;
  }
  md << ".\n- Training: " << o.train.steps << " steps x batch " << o.train.batch << " x " << o.train.seq_len << " = "
     << tokens << " bytes per model (" << fixed(static_cast<double>(tokens) / static_cast<double>(r.train_tokens), 3)
     << " epochs of " << r.train_tokens << " training bytes, " << r.train_documents << " documents), "
     << r.seeds.size() << " seeds, AdamW lr " << o.train.adamw.lr << " (warmup " << o.train.adamw.warmup
     << ", cosine to lr / 10), weight decay " << o.train.adamw.weight_decay << ", float32 on the CPU. Wall time "
     << fixed(r.seconds, 1) << " s.\n"
     << "- Held out: " << r.heldout_ids.size() << " documents, each one's first " << o.eval_windows
     << " windows (" << r.heldout_tokens_scored << " predicted bytes).\n"
     << "- Pairing: per seed every model starts from tensors drawn by (seed, name, shape); " << r.shared_tensors
     << " tensors shared by at least two architectures were checked byte-identical; every model of a seed read "
        "the same windows in the same order.\n\n## Held-out loss (nats per byte, mean over documents)\n\n";
  std::vector<std::string> head{"seed"};
  for (nn::AttnKind k : o.kinds) head.push_back(label(k));
  std::vector<std::vector<std::string>> rows;
  for (const LmSeedResult& s : r.seeds) {
    std::vector<std::string> row{std::to_string(s.seed)};
    for (const LmModelResult& m : s.models) row.push_back(fixed(m.loss_doc_mean, 4));
    rows.push_back(row);
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\n## Paired differences (A - B, nats per byte; negative: A better)\n\n"
        "95% Student-t interval over held-out documents of the per-document difference; 'all seeds': each "
        "document's difference averaged over the seeds first; 'across seeds': the t-interval over the seeds' "
        "mean differences (the training noise, sampled by only a few seeds).\n\n";
  head = {"A - B"};
  for (const LmSeedResult& s : r.seeds) head.push_back("seed " + std::to_string(s.seed));
  head.push_back("all seeds");
  head.push_back("across seeds");
  rows.clear();
  for (const LmPaired& p : r.paired) {
    std::vector<std::string> row{label(p.a) + " - " + label(p.b)};
    for (const Interval& c : p.per_seed) row.push_back(ci(c));
    row.push_back(ci(p.pooled));
    row.push_back(ci(p.across_seeds));
    rows.push_back(row);
  }
  print_table(md, head, rows, TableStyle::Markdown);
  // per kind and bucket: the mean over seeds of the mean over documents
  const size_t nk = r.seeds.front().models.size();
  std::vector<std::vector<double>> bucket_mean(nk, std::vector<double>(r.buckets.size(), 0));
  for (size_t k = 0; k < nk; ++k) {
    for (size_t b = 0; b < r.buckets.size(); ++b) {
      for (const LmSeedResult& s : r.seeds) {
        double sum = 0, cnt = 0;
        for (const std::vector<double>& d : s.models[k].bucket_loss) {
          if (std::isfinite(d[b])) {
            sum += d[b];
            cnt += 1;
          }
        }
        bucket_mean[k][b] += (cnt > 0 ? sum / cnt : std::nan("")) / static_cast<double>(r.seeds.size());
      }
    }
  }
  md << "\n## Loss by position bucket (nats per byte; mean over documents, then over seeds)\n\n";
  head = {"positions"};
  for (nn::AttnKind k : o.kinds) head.push_back(label(k));
  rows.clear();
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    std::vector<std::string> row{std::to_string(r.buckets[b].first) + "-" + std::to_string(r.buckets[b].second - 1)};
    for (size_t k = 0; k < nk; ++k) row.push_back(fixed(bucket_mean[k][b], 4));
    rows.push_back(row);
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\n## Paired differences by position bucket (all seeds; position of the predicting byte)\n\n";
  head = {"positions"};
  for (const LmPaired& p : r.paired) head.push_back(label(p.a) + " - " + label(p.b));
  rows.clear();
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    std::vector<std::string> row{std::to_string(r.buckets[b].first) + "-" + std::to_string(r.buckets[b].second - 1)};
    for (const LmPaired& p : r.paired) row.push_back(ci(p.by_bucket[b]));
    rows.push_back(row);
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\n## Lambda per layer (after training)\n\nV1: the learned scalar; V2: the mean of sigmoid(lambda_proj x) "
        "over the held-out windows read.\n\n";
  head = {"model", "seed"};
  for (int64_t l = 0; l < o.size.n_layers; ++l) head.push_back("layer " + std::to_string(l));
  rows.clear();
  for (const LmSeedResult& s : r.seeds) {
    for (const LmModelResult& m : s.models) {
      if (m.lambdas.empty()) continue;
      std::vector<std::string> row{label(m.kind), std::to_string(s.seed)};
      for (double v : m.lambdas) row.push_back(fixed(v, 3));
      rows.push_back(row);
    }
  }
  print_table(md, head, rows, TableStyle::Markdown);
  md << "\n## What these numbers do and do not show\n\n"
        "- They compare the attention kinds at one small scale on one corpus (mostly technical documentation "
        "and one old book, byte tokens); they do not predict the ordering at the paper's scales.\n"
        "- The intervals over documents say how consistent a difference is across held-out documents for these "
        "trained weights; a few seeds sample the training noise, they do not bound it.\n"
        "- One set of hyperparameters serves every kind, tuned for none.\n"
        "- Held-out documents are whole pages never trained on, from the same packages as the training pages.\n";
  md << "\nCharts: `loss_by_position.png` (the bucket table), `training_loss.png` (mean over seeds).\n";
  const std::string mpath = dir + "/report.md";
  write_file_atomic(mpath, md.str());
  std::vector<viz::Series> series;
  for (size_t k = 0; k < nk; ++k) {
    viz::Series sr;
    sr.name = label(o.kinds[k]);
    for (size_t b = 0; b < r.buckets.size(); ++b) {
      sr.x.push_back(static_cast<double>(r.buckets[b].first));
      sr.y.push_back(bucket_mean[k][b]);
    }
    series.push_back(sr);
  }
  viz::ChartSpec spec;
  spec.title = "Held-out loss by position bucket (mean over documents and seeds)";
  spec.x_label = "first position of the bucket";
  spec.y_label = "nats per byte";
  const std::string ppath = dir + "/loss_by_position.png", tpath = dir + "/training_loss.png";
  viz::write_png(ppath, viz::render_line_chart(series, spec));
  series.clear();
  for (size_t k = 0; k < nk; ++k) {
    viz::Series sr;
    sr.name = label(o.kinds[k]);
    sr.markers = false;
    const size_t steps = r.seeds.front().models[k].loss_curve.size();
    const size_t w = std::max<size_t>(1, steps / 50);  // a moving mean over w steps
    for (size_t i = 0; i + w <= steps; i += w) {
      double sum = 0;
      for (const LmSeedResult& s : r.seeds) {
        for (size_t t = i; t < i + w; ++t) sum += s.models[k].loss_curve[t];
      }
      sr.x.push_back(static_cast<double>(i + w));
      sr.y.push_back(sum / static_cast<double>(w * r.seeds.size()));
    }
    series.push_back(sr);
  }
  spec.title = "Training loss (mean over seeds)";
  spec.x_label = "step";
  viz::write_png(tpath, viz::render_line_chart(series, spec));
  return {mpath, jpath, ppath, tpath};
}

}  // namespace diffattn::eval
