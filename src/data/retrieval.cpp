// The multi-needle retrieval task (retrieval.h): samples as a pure function of (spec, index), and
// the Dataset that feeds them to the trainer.
#include "diffattn/data/retrieval.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "diffattn/base/rng.h"

namespace diffattn::data {

namespace {

using json = nlohmann::json;

// splitmix64 as a counter-based stream: sample i of seed s starts from mix(s, i), so any sample
// is drawn without drawing the ones before it.
struct Stream {
  uint64_t s;
  uint64_t next() { return splitmix64(s); }
  // Uniform in [0, n), n >= 1 (the modulo bias is below 2^-40 for the n used here).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

Stream stream_of(uint64_t seed, uint64_t index) {
  Stream st{seed * 0xD1B54A32D192ED03ull ^ 0x7265747269657661ull};  // "retrieva"
  st.s = st.next() + index * kGolden64;
  st.next();
  return st;
}

std::string random_key(Stream& st, const RetrievalSpec& s) {
  std::string k;
  for (int64_t i = 0; i < s.key_len; ++i) k.push_back(static_cast<char>('A' + st.below(s.key_symbols)));
  return k;
}

int hamming(const std::string& a, const std::string& b) {
  int d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

void check_range(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    throw InvalidArgument(std::string("retrieval task: ") + field + " must be in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                          std::to_string(v));
  }
}

}  // namespace

void RetrievalSpec::validate() const {
  check_range("needles", needles, 1, 1000);
  check_range("queries", queries, 1, needles);
  check_range("near_misses", near_misses, -1, needles - queries);
  check_range("key_len", key_len, 1, 8);
  check_range("key_symbols", key_symbols, 2, 26);
  check_range("value_symbols", value_symbols, 2, 10);
  check_range("filler_symbols", filler_symbols, 1, 26);
  // Any needle can still be placed after N - 1 others block at most 2L - 1 starts each.
  const int64_t least = 2 * needles * needle_len();
  if (context < least) {
    throw InvalidArgument("retrieval task: context = " + std::to_string(context) + " is too short for " +
                          std::to_string(needles) + " needles of " + std::to_string(needle_len()) +
                          " tokens; it must be at least 2 * needles * (key_len + 2) = " +
                          std::to_string(least));
  }
  if (min_context != 0) check_range("min_context", min_context, least, context);
  // Distinct keys: every needle's, and enough one-symbol variants of a queried key.
  double keys = std::pow(static_cast<double>(key_symbols), static_cast<double>(key_len));
  if (keys < 2.0 * static_cast<double>(needles)) {
    throw InvalidArgument("retrieval task: " + std::to_string(key_symbols) + " key symbols and key_len " +
                          std::to_string(key_len) + " give " + std::to_string(static_cast<int64_t>(keys)) +
                          " keys, fewer than 2 * needles = " + std::to_string(2 * needles));
  }
  const int64_t m = near_misses < 0 ? needles - queries : near_misses;
  const int64_t per_key = (m + queries - 1) / queries;
  if (key_len * (key_symbols - 1) < per_key + queries) {
    throw InvalidArgument("retrieval task: " + std::to_string(m) + " near misses of " + std::to_string(queries) +
                          " keys need more one-symbol variants than key_len * (key_symbols - 1) = " +
                          std::to_string(key_len * (key_symbols - 1)));
  }
  if (!(depth <= 1.0) && !(depth < 0)) {
    throw InvalidArgument("retrieval task: depth must be in [0, 1] (or negative: random), got " +
                          std::to_string(depth));
  }
}

std::string RetrievalSpec::to_json() const {
  json j;
  j["task"] = "retrieval";
  j["context"] = context;
  j["min_context"] = min_context;
  j["needles"] = needles;
  j["queries"] = queries;
  j["near_misses"] = near_misses;
  j["key_len"] = key_len;
  j["key_symbols"] = key_symbols;
  j["value_symbols"] = value_symbols;
  j["filler_symbols"] = filler_symbols;
  j["seed"] = seed;
  return j.dump(2) + "\n";
}

RetrievalSpec RetrievalSpec::from_json(const std::string& text, const std::string& where) {
  const json j = parse_json_object(text, where);
  RetrievalSpec s;
  for (const auto& [k, v] : j.items()) {
    if (k == "task") {
      if (!v.is_string() || v.get<std::string>() != "retrieval") {
        throw InvalidArgument(where + ": \"task\" must be \"retrieval\", got " + json_brief(v));
      }
      continue;
    }
    if (!v.is_number_integer()) throw InvalidArgument(where + ": \"" + k + "\" must be an integer, got " + json_brief(v));
    const int64_t x = v.get<int64_t>();
    if (k == "context") s.context = x;
    else if (k == "min_context") s.min_context = x;
    else if (k == "needles") s.needles = x;
    else if (k == "queries") s.queries = x;
    else if (k == "near_misses") s.near_misses = x;
    else if (k == "key_len") s.key_len = x;
    else if (k == "key_symbols") s.key_symbols = x;
    else if (k == "value_symbols") s.value_symbols = x;
    else if (k == "filler_symbols") s.filler_symbols = x;
    else if (k == "seed") s.seed = static_cast<uint64_t>(x);
    else throw InvalidArgument(where + ": unknown key \"" + k + "\"");
  }
  s.validate();
  return s;
}

std::string RetrievalSample::text() const {
  std::string s;
  for (int32_t t : tokens) s.push_back(static_cast<char>(t));
  return s;
}

RetrievalSample make_retrieval_sample(const RetrievalSpec& spec, uint64_t index) {
  spec.validate();
  Stream st = stream_of(spec.seed, index);
  const int64_t N = spec.needles, R = spec.queries, L = spec.needle_len();
  const int64_t C = spec.min_context > 0
                        ? spec.min_context + st.below(spec.context - spec.min_context + 1)
                        : spec.context;
  const int64_t M = spec.near_misses < 0 ? N - R : spec.near_misses;

  // Keys: R queried ones, then M near misses of them (round robin), then random ones; all
  // distinct. Near misses change one symbol, so they differ from their twin in exactly one place.
  std::vector<RetrievalNeedle> nd(static_cast<size_t>(N));
  auto taken = [&](const std::string& k, int64_t upto) {
    for (int64_t i = 0; i < upto; ++i) {
      if (nd[static_cast<size_t>(i)].key == k) return true;
    }
    return false;
  };
  for (int64_t i = 0; i < N; ++i) {
    RetrievalNeedle& n = nd[static_cast<size_t>(i)];
    n.queried = i < R;
    for (int tries = 0;; ++tries) {
      if (tries == 10000) {
        throw InvalidArgument("retrieval task: cannot draw " + std::to_string(N) +
                              " distinct keys (near misses included) from " +
                              std::to_string(spec.key_symbols) + " symbols of key_len " +
                              std::to_string(spec.key_len) + "; use more key symbols");
      }
      if (i >= R && i < R + M) {
        const RetrievalNeedle& twin = nd[static_cast<size_t>((i - R) % R)];
        n.key = twin.key;
        const int64_t at = st.below(spec.key_len);
        const char old = n.key[static_cast<size_t>(at)];
        n.key[static_cast<size_t>(at)] = static_cast<char>('A' + (old - 'A' + 1 + st.below(spec.key_symbols - 1)) % spec.key_symbols);
      } else {
        n.key = random_key(st, spec);
      }
      if (!taken(n.key, i)) break;
    }
    n.value = static_cast<int32_t>(st.below(spec.value_symbols));
    if (i >= R) {
      // A near miss (by design, or by chance one symbol from another queried key) never shares
      // the value of a queried key it nearly matches: answering from it is always wrong.
      for (int tries = 0; tries < spec.value_symbols; ++tries) {
        bool clash = false;
        for (int64_t q = 0; q < R; ++q) {
          const RetrievalNeedle& t = nd[static_cast<size_t>(q)];
          clash = clash || (t.value == n.value && hamming(t.key, n.key) == 1);
        }
        if (!clash) break;
        n.value = static_cast<int32_t>((n.value + 1) % spec.value_symbols);
      }
      if (i < R + M) {
        n.near_miss_of = (i - R) % R;
      } else {
        for (int64_t q = 0; q < R && n.near_miss_of < 0; ++q) {
          if (hamming(n.key, nd[static_cast<size_t>(q)].key) == 1) n.near_miss_of = q;
        }
      }
    }
  }

  // The order of asking: a random permutation of the queried needles.
  std::vector<int64_t> order(static_cast<size_t>(R));
  for (int64_t q = 0; q < R; ++q) order[static_cast<size_t>(q)] = q;
  for (int64_t q = R - 1; q > 0; --q) std::swap(order[static_cast<size_t>(q)], order[static_cast<size_t>(st.below(q + 1))]);

  // Positions: the needle asked first at the chosen depth (if any), the others at random free
  // starts; validate() guarantees a free start exists for each.
  std::vector<char> used(static_cast<size_t>(C), 0);
  auto place = [&](RetrievalNeedle& n, int64_t start) {
    n.start = start;
    std::fill_n(used.begin() + start, L, 1);
  };
  if (spec.depth >= 0) {
    const int64_t first = order[0];
    place(nd[static_cast<size_t>(first)], std::llround(spec.depth * static_cast<double>(C - L)));
  }
  std::vector<int64_t> free_starts;
  for (int64_t i = 0; i < N; ++i) {
    if (spec.depth >= 0 && i == order[0]) continue;
    free_starts.clear();
    for (int64_t s = 0; s + L <= C; ++s) {
      if (std::none_of(used.begin() + s, used.begin() + s + L, [](char u) { return u != 0; })) {
        free_starts.push_back(s);
      }
    }
    place(nd[static_cast<size_t>(i)], free_starts[static_cast<size_t>(st.below(static_cast<int64_t>(free_starts.size())))]);
  }
  for (RetrievalNeedle& n : nd) n.depth = C > L ? static_cast<double>(n.start) / static_cast<double>(C - L) : 0.0;

  // Text: filler, the needles over it, then the queries.
  RetrievalSample out;
  out.context = C;
  const int64_t T = spec.sample_len(C);
  out.tokens.resize(static_cast<size_t>(T));
  out.targets.assign(static_cast<size_t>(T), -1);
  for (int64_t t = 0; t < C; ++t) out.tokens[static_cast<size_t>(t)] = 'a' + static_cast<int32_t>(st.below(spec.filler_symbols));
  auto write = [&](int64_t at, char mark, const RetrievalNeedle& n) {
    out.tokens[static_cast<size_t>(at)] = mark;
    for (int64_t k = 0; k < spec.key_len; ++k) out.tokens[static_cast<size_t>(at + 1 + k)] = n.key[static_cast<size_t>(k)];
    out.tokens[static_cast<size_t>(at + 1 + spec.key_len)] = '0' + n.value;
  };
  for (const RetrievalNeedle& n : nd) write(n.start, '#', n);
  for (int64_t q = 0; q < R; ++q) {
    const RetrievalNeedle& n = nd[static_cast<size_t>(order[static_cast<size_t>(q)])];
    const int64_t at = C + q * spec.query_len();
    write(at, '?', n);
    RetrievalQuery rq;
    rq.needle = order[static_cast<size_t>(q)];
    rq.answer_pos = at + spec.key_len;
    rq.answer = '0' + n.value;
    out.targets[static_cast<size_t>(rq.answer_pos)] = rq.answer;
    out.queries.push_back(rq);
  }

  // Needles in order of position; queries follow their needles' new indices.
  std::vector<int64_t> by_pos(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) by_pos[static_cast<size_t>(i)] = i;
  std::sort(by_pos.begin(), by_pos.end(), [&](int64_t a, int64_t b) {
    return nd[static_cast<size_t>(a)].start < nd[static_cast<size_t>(b)].start;
  });
  std::vector<int64_t> new_index(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    new_index[static_cast<size_t>(by_pos[static_cast<size_t>(i)])] = i;
    out.needles.push_back(nd[static_cast<size_t>(by_pos[static_cast<size_t>(i)])]);
  }
  for (RetrievalNeedle& n : out.needles) {
    if (n.near_miss_of >= 0) n.near_miss_of = new_index[static_cast<size_t>(n.near_miss_of)];
  }
  for (RetrievalQuery& q : out.queries) q.needle = new_index[static_cast<size_t>(q.needle)];
  return out;
}

RetrievalTask::RetrievalTask(RetrievalSpec spec) : spec_(spec) { spec_.validate(); }

std::optional<RetrievalSpec> read_retrieval_spec(const std::string& model_dir) {
  const std::string path = model_dir + "/retrieval.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return RetrievalSpec::from_json(read_file(path, kMaxJsonFileBytes), path);
}

RetrievalBatch make_retrieval_batch(const RetrievalSpec& spec, uint64_t first, int64_t B) {
  RetrievalBatch r;
  r.B = B;
  for (int64_t b = 0; b < B; ++b) {
    r.samples.push_back(make_retrieval_sample(spec, first + static_cast<uint64_t>(b)));
    r.T = std::max<int64_t>(r.T, static_cast<int64_t>(r.samples.back().tokens.size()));
  }
  r.tokens.assign(static_cast<size_t>(B * r.T), kRetrievalPad);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& t = r.samples[static_cast<size_t>(b)].tokens;
    std::copy(t.begin(), t.end(), r.tokens.begin() + b * r.T);
  }
  return r;
}

void RetrievalTask::batch(uint64_t index, int64_t B, int64_t T, int32_t* tokens,
                          int32_t* targets) const {
  if (T < max_len()) {
    throw InvalidArgument("retrieval task: rows of T = " + std::to_string(T) +
                          " tokens cannot hold a sample of up to " + std::to_string(max_len()) +
                          " (context " + std::to_string(spec_.context) + " + " +
                          std::to_string(spec_.queries) + " queries of " +
                          std::to_string(spec_.query_len()) + ")");
  }
  for (int64_t b = 0; b < B; ++b) {
    const RetrievalSample s = make_retrieval_sample(spec_, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b));
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    std::copy(s.tokens.begin(), s.tokens.end(), tokens + b * T);
    std::copy(s.targets.begin(), s.targets.end(), targets + b * T);
    std::fill(tokens + b * T + n, tokens + (b + 1) * T, kRetrievalPad);
    std::fill(targets + b * T + n, targets + (b + 1) * T, -1);
  }
}

std::string RetrievalTask::describe() const {
  std::string c = spec_.min_context > 0
                      ? std::to_string(spec_.min_context) + ".." + std::to_string(spec_.context)
                      : std::to_string(spec_.context);
  return "multi-needle retrieval (context " + c + ", " + std::to_string(spec_.needles) +
         " needles, " + std::to_string(spec_.queries) + " queried, seed " +
         std::to_string(spec_.seed) + ")";
}

}  // namespace diffattn::data
