// The training loop: AdamW steps over micro-batches, a JSON-lines log, a progress bar, and a
// resume point written as one atomic file (weights, AdamW moments, step, options), so a run
// killed at any moment and resumed continues with exactly the losses it would have had.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"

namespace diffattn::train {

using json = nlohmann::json;

namespace {

const char* kStateFile = "/train_state.safetensors";
const char* kLogFile = "/train_log.jsonl";

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
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    const json& v = item.value();
    auto integer = [&]() {
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
        throw InvalidArgument(where + ": \"" + k + "\" must be an integer from -2^63 to 2^63-1, got " +
                              json_brief(v));
      }
      return v.get<int64_t>();
    };
    auto number = [&]() {
      if (!v.is_number()) throw InvalidArgument(where + ": \"" + k + "\" must be a number, got " + json_brief(v));
      return v.get<double>();
    };
    auto string = [&]() {
      if (!v.is_string()) throw InvalidArgument(where + ": \"" + k + "\" must be a string, got " + json_brief(v));
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
    else if (k == "seed") {
      if (!v.is_number_unsigned()) throw InvalidArgument(where + ": \"seed\" must be a whole number, got " + json_brief(v));
      o.seed = v.get<uint64_t>();
    }
    else if (k == "eval_every") o.eval_every = integer();
    else if (k == "eval_batches") o.eval_batches = integer();
    else if (k == "save_every") o.save_every = integer();
    else if (k == "corpus") o.corpus = string();
    else if (k == "tokenizer") {
      o.tokenizer = string();
      if (o.tokenizer != "bytes" && o.tokenizer != "sentencepiece") {
        throw InvalidArgument(where + ": \"tokenizer\" is " + json_brief(v) +
                              ", expected \"bytes\" or \"sentencepiece\"");
      }
    }
    else throw InvalidArgument(where + ": unknown key " + quote_name(k, 40));
  }
  return o;
}

std::string StepLog::to_json() const {
  // nlohmann writes every double so that it reads back exactly, and a diverged NaN or Inf
  // as null (a hand-written "nan" is not JSON); ordered keys keep "step" first.
  nlohmann::ordered_json j;
  j["step"] = step;
  j["loss"] = loss;
  j["grad_norm"] = grad_norm;
  j["lr"] = lr;
  j["lambda"] = lambdas;
  j["tokens_per_s"] = tokens_per_s;
  if (val_loss >= 0) j["val_loss"] = val_loss;
  return j.dump();
}

Trainer::Trainer(const std::string& dir, model::Model model, const TrainOptions& opts)
    : dir_(dir), model_(std::make_unique<model::Model>(std::move(model))), ctx_(*model_), opts_(opts) {
  auto positive = [](const char* what, int64_t v) {
    if (v < 1) throw InvalidArgument(std::string("train: ") + what + " must be at least 1, got " + std::to_string(v));
  };
  positive("steps", opts_.steps);
  positive("batch", opts_.batch);
  positive("seq_len", opts_.seq_len);
  positive("accum", opts_.accum);
  if (opts_.seq_len > model_->config().max_seq_len) {
    throw InvalidArgument("train: seq_len = " + std::to_string(opts_.seq_len) +
                          " exceeds the model's max_seq_len = " +
                          std::to_string(model_->config().max_seq_len));
  }
  check_train_options(opts_, model_->config());
  opts_.adamw.total_steps = opts_.steps;
  adam_.reset(model_->params().size());
}

Trainer::Trainer(const std::string& dir, const model::ModelConfig& cfg, const TrainOptions& opts)
    : Trainer(dir, model::Model(cfg), opts) {
  model_->init_weights(opts_.seed);
}

namespace {

// A metadata field that must be a whole number from lo to hi, in decimal digits only (no sign,
// no spaces, no exponent): "abc", "-5" and "1e3" are errors naming the file and the field.
int64_t whole_field(const std::string& s, const char* key, int64_t lo, int64_t hi,
                    const std::string& where) {
  auto bad = [&](const std::string& why) -> IoError {
    return IoError(where + ": metadata \"" + key + "\" is " + quote_name(s, 40) + ", " + why);
  };
  const std::string range =
      "expected a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) throw bad(range);
  if (s.size() > 18) throw bad(range);  // beyond 10^18 - 1: more than any count here
  const int64_t v = std::stoll(s);  // at most 18 digits: fits
  if (v < lo || v > hi) throw bad(range);
  return v;
}

}  // namespace

TrainState parse_train_state(const std::map<std::string, std::string>& metadata,
                             const std::string& where) {
  auto meta = [&](const char* key) -> const std::string& {
    auto it = metadata.find(key);
    if (it == metadata.end()) throw IoError(where + ": metadata has no \"" + key + "\"");
    return it->second;
  };
  if (meta("format") != "diffattn-train/1") {
    throw IoError(where + ": metadata format is " + quote_name(meta("format"), 40) +
                  ", expected \"diffattn-train/1\"");
  }
  TrainState st;
  try {
    st.config = model::ModelConfig::from_json(meta("config"), where + " (metadata config)");
    st.options = TrainOptions::from_json(meta("train"), where + " (metadata train)");
    check_train_options(st.options, st.config);
  } catch (const InvalidArgument& e) {
    // A bad resume point is a bad file: name it (a message from the checks starts with "train:").
    const std::string m = e.what();
    throw IoError(m.rfind(where, 0) == 0 ? m : where + " (metadata train): " + m);
  }
  st.step = whole_field(meta("step"), "step", 0, st.options.steps, where);
  st.adamw_t = whole_field(meta("adamw_t"), "adamw_t", 0, st.step, where);
  return st;
}

TrainState check_train_state_header(const model::SafeTensorsHeader& h, const std::string& where) {
  TrainState st = parse_train_state(h.metadata, where);
  // Weights and both moments, by name and shape, before the model they fill is allocated.
  model::check_weights_header(st.config, h, where, "", true);
  model::check_weights_header(st.config, h, where, "adamw.m.", true);
  model::check_weights_header(st.config, h, where, "adamw.v.", true);
  return st;
}

Trainer Trainer::resume(const std::string& dir) {
  const std::string path = dir + kStateFile;
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0 && errno == ENOENT) {
    throw IoError(dir + ": no resume point (train_state.safetensors): the run stopped before its "
                        "first checkpoint, or this is not a training directory; start it again "
                        "without --resume");
  }
  const model::SafeTensorsHeader h = model::read_safetensors_header(path);
  const TrainState ts = check_train_state_header(h, path);
  const model::SafeTensorsFile f = model::read_safetensors(path, h);
  model::Model m(ts.config, model::load_weights(ts.config, f, path, "", true));
  Trainer t(dir, std::move(m), ts.options);
  t.step_ = ts.step;
  t.adam_.t = ts.adamw_t;
  for (const char* which : {"adamw.m.", "adamw.v."}) {
    std::vector<float>& dst = which[6] == 'm' ? t.adam_.m : t.adam_.v;
    for (const model::TensorInfo& ti : t.model_->tensors()) {
      const std::vector<float>& src = f.tensors.at(which + ti.name).data;
      for (size_t i = 0; i < src.size(); ++i) {
        // v is a mean of squares: negative is as corrupt as NaN (sqrt(v) in the update).
        if (!std::isfinite(src[i]) || (which[6] == 'v' && src[i] < 0)) {
          throw IoError(path + ": tensor \"" + which + ti.name + "\" holds " +
                        std::to_string(src[i]) + " at flat index " + std::to_string(i) +
                        " (an AdamW moment must be finite" +
                        (which[6] == 'v' ? " and not negative)" : ")"));
        }
      }
      std::copy(src.begin(), src.end(), dst.begin() + ti.offset);
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
      // A line cut short by a kill does not parse; it goes with the lines after the step.
      nlohmann::json j;
      try {
        j = parse_json_object(line, log_path);
      } catch (const Error&) {
        continue;
      }
      if (j.contains("step") && j.at("step").is_number_integer() &&
          j.at("step").get<int64_t>() <= t.step_) {
        kept += line + "\n";
      }
    }
    write_file_atomic(log_path, kept);
  }
  return t;
}

const std::vector<std::string>& Trainer::checkpoint_files() {
  // The resume point first: with it alone the run resumes (it holds the weights and the config
  // too); then the model's files, model.safetensors and config.json, as one (save_model).
  static const std::vector<std::string> files = {"train_state.safetensors", "model.safetensors",
                                                 "config.json"};
  return files;
}

void Trainer::save() const {
  make_dirs(dir_);
  std::vector<model::SafeTensorRef> refs;
  for (const model::TensorInfo& t : model_->tensors()) refs.push_back({t.name, t.shape, model_->params().data() + t.offset});
  for (const model::TensorInfo& t : model_->tensors()) {
    refs.push_back({"adamw.m." + t.name, t.shape, adam_.m.data() + t.offset});
    refs.push_back({"adamw.v." + t.name, t.shape, adam_.v.data() + t.offset});
  }
  model::write_safetensors(dir_ + kStateFile, refs,
                    {{"format", "diffattn-train/1"},
                     {"step", std::to_string(step_)},
                     {"adamw_t", std::to_string(adam_.t)},
                     {"config", model_->config().to_json()},
                     {"train", opts_.to_json()}});
  // The model directory: config.json unchanged since the last save, model.safetensors is
  // renamed in alone; the first save swaps the whole model in.
  model::save_model(*model_, dir_, DType::F32, model_files);
}

StepLog Trainer::step(const Dataset& train) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t B = opts_.batch, T = opts_.seq_len;
  tok_.resize(static_cast<size_t>(B * T));
  tgt_.resize(tok_.size());
  ctx_.zero_grads();
  double loss = 0;
  for (int64_t micro = 0; micro < opts_.accum; ++micro) {
    // The data position: batch number step * accum + micro of the dataset.
    train.batch(static_cast<uint64_t>(step_ * opts_.accum + micro), B, T, tok_.data(), tgt_.data());
    loss += ctx_.forward(tok_.data(), tgt_.data(), B, T);
    ctx_.backward(1.0f / static_cast<float>(opts_.accum));
  }
  StepLog log;
  log.loss = loss / static_cast<double>(opts_.accum);
  log.lambdas = ctx_.layer_lambdas();
  log.lr = model::lr_at(opts_.adamw, step_);
  log.grad_norm = adam_.step(*model_, ctx_.grads(), opts_.adamw, log.lr);
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
        s.val_loss = data::eval_loss(ctx_, *valid, opts_.batch, opts_.seq_len, opts_.eval_batches);
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

}  // namespace diffattn::train
