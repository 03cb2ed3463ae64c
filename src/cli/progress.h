// A progress bar on stderr for the tool's long loops that do not go through Trainer::run (which
// draws the same bar): "label  step 300/1500  loss 2.3456  ETA 0:00:12", redrawn in place, only
// when stderr is a terminal (a log or a pipe gets nothing).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace diffattn::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total)
      : label_(std::move(label)), total_(total), on_(::isatty(2) != 0),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { done(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int64_t step, double loss) {
    if (!on_) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const auto left = static_cast<int64_t>(el / static_cast<double>(step) * static_cast<double>(total_ - step) + 0.5);
    std::fprintf(stderr, "\r%s  step %" PRId64 "/%" PRId64 "  loss %.4f  ETA %" PRId64 ":%02" PRId64 ":%02" PRId64 "   ",
                 label_.c_str(), step, total_, loss, left / 3600, (left / 60) % 60, left % 60);
    std::fflush(stderr);
    drawn_ = true;
  }
  // Ends the bar's line (once).
  void done() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  std::string label_;
  int64_t total_;
  bool on_, drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace diffattn::cli
