// `diffattn convert`: between diffattn's model directories and Hugging Face ones (DiffLlama for
// diff_v1, Llama for standard), so a model trained here runs in transformers and a published
// checkpoint becomes a trainable float32 model here.
#include <sys/stat.h>

#include <iostream>

#include "cli/args.h"
#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

namespace {

int run_convert(const std::vector<std::string>& argv) {
  Args a("convert",
         "Write a model in the other format. --to hf: a diff_v1 model as a Hugging Face DiffLlama\n"
         "directory, a standard one as Llama (V1's learned per-head norm weight is folded into\n"
         "o_proj; DIFF V2 and a fixed lambda_init have no DiffLlama equivalent and are refused);\n"
         "a PolyNorm model (one read from a Motif-2 directory) as Motif-2's published layout.\n"
         "--to diffattn: any model diffattn loads (a Hugging Face directory included) in diffattn's\n"
         "format: float32 and trainable, or with --dtype bf16|f16 half the bytes, loaded for\n"
         "inference in that type (e.g. a DIFF V2 model to serve). The tokenizer files and\n"
         "generation_config.json beside the model are copied along. Loading either result gives\n"
         "the same logits (at --dtype f32). --out is replaced as a whole, atomically: at any moment\n"
         "it holds its old model or the new one, and its other files (not the old model's) stay.");
  a.option("--model", "DIR", "", "the model to convert (required)")
      .option("--to", "FORMAT", "", "hf or diffattn (required)")
      .option("--out", "DIR", "", "the directory to write (required)")
      .option("--dtype", "TYPE", "f32", "the stored type, f32, bf16 or f16")
      .option("--shards", "N", "1", "--to hf: number of safetensors files (with an index when > 1)");
  if (!a.parse(argv)) return 0;
  for (const char* k : {"--model", "--to", "--out"}) {
    if (!a.given(k)) throw UsageError(std::string(k) + " is required");
  }
  const std::string to = a.str("--to"), in = a.str("--model"), out = a.str("--out");
  if (to != "hf" && to != "diffattn") throw UsageError("--to is \"" + to + "\", expected hf or diffattn");
  const DType dtype = from_flags([&] { return parse_dtype(a.str("--dtype"), "--dtype"); });
  const int64_t shards = a.integer("--shards", 1, 9999);
  if (to == "diffattn" && a.given("--shards")) {
    throw UsageError("--shards applies to --to hf (diffattn's format is one file)");
  }
  const model::Model m = model::load_model(in);
  // The tokenizer and generation_config.json go with the model, in the same atomic replacement:
  // a kill at any moment leaves --out holding the old model or the new one, whole, and an old
  // model's tokenizer or weight files never survive beside the new one.
  const model::ModelFiles side = model::model_side_files(in);
  const std::string note = to == "hf" ? model::save_hf_model(m, out, dtype, shards, side) : model::save_model(m, out, dtype, side);
  if (!note.empty()) std::cerr << "diffattn convert: note: " << note << "\n";
  std::cout << "wrote " << out << " (" << (to == "hf" ? "Hugging Face " : "diffattn ")
            << (to == "hf" ? (m.config().mlp == model::MlpKind::PolyNorm           ? "motif"
                              : m.config().attention == nn::AttnKind::DiffV1 ? "diffllama"
                                                                             : "llama")
                           : nn::attn_kind_name(m.config().attention))
            << ", " << m.num_params() << " parameters)\n";
  return 0;
}

const CommandRegistration reg({"convert", "convert between diffattn and Hugging Face model directories", 15,
                               run_convert});

}  // namespace

}  // namespace diffattn::cli
