// The training loop: AdamW steps over micro-batches, a JSON-lines log, a progress bar, and a
// resume point written as one atomic file (weights, AdamW moments, step, options), so a run
// killed at any moment and resumed continues with exactly the losses it would have had.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "diffattn/data.h"
#include "model/json_util.h"

namespace diffattn::data {

using json = nlohmann::json;

namespace {

const char* kStateFile = "/train_state.safetensors";
const char* kLogFile = "/train_log.jsonl";

std::string fmt_double(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

std::string eta(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRId64 ":%02" PRId64 ":%02" PRId64, s / 3600, (s / 60) % 60,
                s % 60);
  return buf;
}

}  // namespace

std::string TrainOptions::to_json() const {
  json j;
  j["steps"] = steps;
  j["batch"] = batch;
  j["seq_len"] = seq_len;
  j["accum"] = accum;
  j["lr"] = adamw.lr;
  j["min_lr"] = adamw.min_lr;
  j["warmup"] = adamw.warmup;
  j["beta1"] = adamw.beta1;
  j["beta2"] = adamw.beta2;
  j["eps"] = adamw.eps;
  j["weight_decay"] = adamw.weight_decay;
  j["clip"] = adamw.clip;
  j["seed"] = seed;
  j["eval_every"] = eval_every;
  j["eval_batches"] = eval_batches;
  j["save_every"] = save_every;
  j["corpus"] = corpus;
  j["tokenizer"] = tokenizer;
  return j.dump();
}

TrainOptions TrainOptions::from_json(const std::string& text, const std::string& where) {
  const json j = parse_json_object(text, where);
  TrainOptions o;
  for (const auto& [k, v] : j.items()) {
    auto integer = [&]() {
      if (!v.is_number_integer()) throw InvalidArgument(where + ": \"" + k + "\" must be an integer");
      return v.get<int64_t>();
    };
    auto number = [&]() {
      if (!v.is_number()) throw InvalidArgument(where + ": \"" + k + "\" must be a number");
      return v.get<double>();
    };
    auto string = [&]() {
      if (!v.is_string()) throw InvalidArgument(where + ": \"" + k + "\" must be a string");
      return v.get<std::string>();
    };
    if (k == "steps") o.steps = integer();
    else if (k == "batch") o.batch = integer();
    else if (k == "seq_len") o.seq_len = integer();
    else if (k == "accum") o.accum = integer();
    else if (k == "lr") o.adamw.lr = number();
    else if (k == "min_lr") o.adamw.min_lr = number();
    else if (k == "warmup") o.adamw.warmup = integer();
    else if (k == "beta1") o.adamw.beta1 = number();
    else if (k == "beta2") o.adamw.beta2 = number();
    else if (k == "eps") o.adamw.eps = number();
    else if (k == "weight_decay") o.adamw.weight_decay = number();
    else if (k == "clip") o.adamw.clip = number();
    else if (k == "seed") o.seed = static_cast<uint64_t>(integer());
    else if (k == "eval_every") o.eval_every = integer();
    else if (k == "eval_batches") o.eval_batches = integer();
    else if (k == "save_every") o.save_every = integer();
    else if (k == "corpus") o.corpus = string();
    else if (k == "tokenizer") o.tokenizer = string();
    else throw InvalidArgument(where + ": unknown key \"" + k + "\"");
  }
  return o;
}

std::string StepLog::to_json() const {
  std::ostringstream os;
  os << "{\"step\":" << step << ",\"loss\":" << fmt_double(loss)
     << ",\"grad_norm\":" << fmt_double(grad_norm) << ",\"lr\":" << fmt_double(lr)
     << ",\"lambda\":[";
  for (size_t i = 0; i < lambdas.size(); ++i) os << (i ? "," : "") << fmt_double(lambdas[i]);
  os << "],\"tokens_per_s\":" << fmt_double(tokens_per_s);
  if (val_loss >= 0) os << ",\"val_loss\":" << fmt_double(val_loss);
  os << "}";
  return os.str();
}

Trainer::Trainer(const std::string& dir, Model model, const TrainOptions& opts)
    : dir_(dir), model_(std::move(model)), opts_(opts) {
  auto positive = [](const char* what, int64_t v) {
    if (v < 1) throw InvalidArgument(std::string("train: ") + what + " must be at least 1, got " + std::to_string(v));
  };
  positive("steps", opts_.steps);
  positive("batch", opts_.batch);
  positive("seq_len", opts_.seq_len);
  positive("accum", opts_.accum);
  if (opts_.seq_len > model_.config().max_seq_len) {
    throw InvalidArgument("train: seq_len = " + std::to_string(opts_.seq_len) +
                          " exceeds the model's max_seq_len = " +
                          std::to_string(model_.config().max_seq_len));
  }
  check_train_options(opts_, model_.config());
  opts_.adamw.total_steps = opts_.steps;
  adam_.reset(model_.params.size());
}

Trainer::Trainer(const std::string& dir, const ModelConfig& cfg, const TrainOptions& opts)
    : Trainer(dir, Model(cfg), opts) {
  model_.init_weights(opts_.seed);
}

Trainer Trainer::resume(const std::string& dir) {
  const std::string path = dir + kStateFile;
  const SafeTensorsFile f = read_safetensors(path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) throw IoError(path + ": metadata has no \"" + key + "\"");
    return it->second;
  };
  if (meta("format") != "diffattn-train/1") {
    throw IoError(path + ": metadata format is \"" + meta("format") + "\", expected \"diffattn-train/1\"");
  }
  const ModelConfig cfg = ModelConfig::from_json(meta("config"), path + " (metadata config)");
  Model m(cfg);
  load_weights(m, f, path, "", true);
  Trainer t(dir, std::move(m), TrainOptions::from_json(meta("train"), path + " (metadata train)"));
  t.step_ = std::stoll(meta("step"));
  t.adam_.t = std::stoll(meta("adamw_t"));
  for (const TensorInfo& ti : t.model_.tensors()) {
    for (const char* which : {"adamw.m.", "adamw.v."}) {
      auto it = f.tensors.find(which + ti.name);
      if (it == f.tensors.end() || it->second.shape != ti.shape) {
        throw IoError(path + ": missing or misshapen tensor \"" + std::string(which) + ti.name + "\"");
      }
      std::vector<float>& dst = which[6] == 'm' ? t.adam_.m : t.adam_.v;
      std::copy(it->second.data.begin(), it->second.data.end(), dst.begin() + ti.offset);
    }
  }
  // A kill during an atomic write leaves its temporary file (NAME.tmp.PID.N) behind; the file it
  // would have replaced is intact, so the leftover is removed.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") != std::string::npos &&
        (n.rfind("train_state.safetensors", 0) == 0 || n.rfind("model.safetensors", 0) == 0 ||
         n.rfind("config.json", 0) == 0 || n.rfind("train_log.jsonl", 0) == 0)) {
      std::filesystem::remove(e.path(), ec);
    }
  }
  // Cut the log back to the saved step; a line cut short by a kill is dropped with the rest.
  const std::string log_path = dir + kLogFile;
  std::string kept;
  struct stat st {};
  if (::stat(log_path.c_str(), &st) == 0) {
    std::istringstream in(read_file(log_path));
    std::string line;
    while (std::getline(in, line)) {
      long long s = -1;
      if (std::sscanf(line.c_str(), "{\"step\":%lld,", &s) == 1 && s <= t.step_ && !line.empty() &&
          line.back() == '}') {
        kept += line + "\n";
      }
    }
    write_file_atomic(log_path, kept);
  }
  return t;
}

void Trainer::save() const {
  save_model(model_, dir_);
  std::vector<SafeTensorRef> refs;
  for (const TensorInfo& t : model_.tensors()) refs.push_back({t.name, t.shape, model_.params.data() + t.offset});
  for (const TensorInfo& t : model_.tensors()) {
    refs.push_back({"adamw.m." + t.name, t.shape, adam_.m.data() + t.offset});
    refs.push_back({"adamw.v." + t.name, t.shape, adam_.v.data() + t.offset});
  }
  write_safetensors(dir_ + kStateFile, refs,
                    {{"format", "diffattn-train/1"},
                     {"step", std::to_string(step_)},
                     {"adamw_t", std::to_string(adam_.t)},
                     {"config", model_.config().to_json()},
                     {"train", opts_.to_json()}});
}

StepLog Trainer::step(const Dataset& train) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t B = opts_.batch, T = opts_.seq_len;
  tok_.resize(static_cast<size_t>(B * T));
  tgt_.resize(tok_.size());
  model_.zero_grads();
  double loss = 0;
  for (int64_t micro = 0; micro < opts_.accum; ++micro) {
    // The data position: batch number step * accum + micro of the dataset.
    train.batch(static_cast<uint64_t>(step_ * opts_.accum + micro), B, T, tok_.data(), tgt_.data());
    loss += model_.forward(tok_.data(), tgt_.data(), B, T);
    model_.backward(1.0f / static_cast<float>(opts_.accum));
  }
  StepLog log;
  log.loss = loss / static_cast<double>(opts_.accum);
  log.lambdas = model_.layer_lambdas();
  log.lr = lr_at(opts_.adamw, step_);
  log.grad_norm = adam_.step(model_, opts_.adamw, log.lr);
  ++step_;
  log.step = step_;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log.tokens_per_s = static_cast<double>(B * T * opts_.accum) / std::max(dt, 1e-9);
  return log;
}

void Trainer::run(const Dataset& train, const std::vector<int32_t>* valid, int64_t until,
                  const std::function<void(const StepLog&)>& on_step) {
  make_dirs(dir_);
  const int64_t end = (until > 0 && until < opts_.steps) ? until : opts_.steps;
  const bool bar = progress && ::isatty(2);
  FILE* log = nullptr;
  if (write_log) {
    const std::string p = dir_ + kLogFile;
    log = std::fopen(p.c_str(), step_ == 0 ? "w" : "a");
    if (log == nullptr) throw IoError(p + ": cannot open the training log for writing");
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = step_;
  try {
    while (step_ < end) {
      StepLog s = step(train);
      if (valid && opts_.eval_every > 0 && (step_ % opts_.eval_every == 0 || step_ == end)) {
        s.val_loss = eval_loss(model_, *valid, opts_.batch, opts_.seq_len, opts_.eval_batches);
      }
      if (log) {
        std::fprintf(log, "%s\n", s.to_json().c_str());
        std::fflush(log);
      }
      if (opts_.save_every > 0 && step_ % opts_.save_every == 0 && step_ < end) save();
      if (bar) {
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double per = el / static_cast<double>(step_ - first);
        std::fprintf(stderr, "\rstep %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  ETA %s   ",
                     step_, end, s.loss, s.tokens_per_s, eta(per * static_cast<double>(end - step_)).c_str());
        std::fflush(stderr);
      }
      if (on_step) on_step(s);
    }
  } catch (...) {
    if (log) std::fclose(log);
    throw;
  }
  if (bar) std::fprintf(stderr, "\n");
  if (log) std::fclose(log);
  save();
}

}  // namespace diffattn::data
