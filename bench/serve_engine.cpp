// The serving scheduler without HTTP (a benchmark, not a test): N sequences submitted at once to
// infer::Scheduler, each a short prompt and --max-tokens sampled tokens, timed to the last token.
// Reports aggregate generated tokens/s per N, and the same N sequences decoded one after another
// with infer::generate_ids (one sequence at a time, a contiguous store of its own) for reference.
//   build/bench/bench_serve_engine MODEL_DIR [max_tokens=128] [N,N,...=1,4,16,64] [engine]
// (a fourth argument "engine" skips the one-at-a-time runs: for profiling the engine alone)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"
#include "diffattn/infer/scheduler.h"

using namespace diffattn;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_serve_engine MODEL_DIR [max_tokens] [N,N,...] [engine]\n");
    return 2;
  }
  try {
    model::Model m = model::load_model(argv[1]);
    const int64_t max_tokens = argc > 2 ? std::atoll(argv[2]) : 128;
    std::vector<int64_t> ns;
    std::stringstream list(argc > 3 ? argv[3] : "1,4,16,64");
    for (std::string x; std::getline(list, x, ',');) ns.push_back(std::atoll(x.c_str()));
    const int64_t V = m.config().vocab_size;
    const bool engine_only = argc > 4 && std::string(argv[4]) == "engine";
    auto prompt = [&](int64_t i) {
      std::vector<int32_t> p;
      for (int64_t t = 0; t < 16; ++t) p.push_back(static_cast<int32_t>((i * 31 + t * 7 + 1) % V));
      return p;
    };
    std::printf("%s: %lld new tokens a sequence, 16-token prompts\n", argv[1],
                static_cast<long long>(max_tokens));
    std::printf("%8s %16s %22s %8s\n", "streams", "engine tokens/s", "one-at-a-time tokens/s", "ratio");
    for (const int64_t n : ns) {
      infer::SchedulerOptions eo;
      eo.max_batch = n;
      eo.max_waiting = n;
      infer::Scheduler e(m, eo);
      const auto t0 = Clock::now();
      std::vector<std::shared_ptr<infer::Sequence>> seqs;
      for (int64_t i = 0; i < n; ++i) {
        infer::SeqRequest r;
        r.prompt = prompt(i);
        r.max_tokens = max_tokens;
        r.sampler.temperature = 0.8;
        r.sampler.seed = static_cast<uint64_t>(i);
        seqs.push_back(e.submit(r));
      }
      int64_t tokens = 0;
      for (auto& s : seqs) {
        std::vector<int32_t> got;
        while (s->wait(got.size(), got, std::chrono::milliseconds(100)) == infer::Finish::kNone) {
        }
        s->wait(got.size(), got, std::chrono::milliseconds(0));
        tokens += static_cast<int64_t>(got.size());
      }
      const double engine_s = std::chrono::duration<double>(Clock::now() - t0).count();
      e.shutdown();
      if (engine_only) {
        std::printf("%8lld %16.1f\n", static_cast<long long>(n), tokens / engine_s);
        std::fflush(stdout);
        continue;
      }
      const auto t1 = Clock::now();
      int64_t alone_tokens = 0;
      for (int64_t i = 0; i < n; ++i) {
        infer::GenerateOptions go;
        go.max_new = max_tokens;
        go.sampler.temperature = 0.8;
        go.sampler.seed = static_cast<uint64_t>(i);
        alone_tokens += static_cast<int64_t>(infer::generate_ids(m, prompt(i), go).size());
      }
      const double alone_s = std::chrono::duration<double>(Clock::now() - t1).count();
      std::printf("%8lld %16.1f %22.1f %8.2f\n", static_cast<long long>(n), tokens / engine_s,
                  alone_tokens / alone_s, (tokens / engine_s) / (alone_tokens / alone_s));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_serve_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
