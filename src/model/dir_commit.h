// Shared by the two model writers (checkpoint.cpp: diffattn's format; hf_writer.cpp: Hugging
// Face's): committing a model directory's files as one.
#pragma once

#include <string>

#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"

namespace diffattn::model {

// Writes files.extra into the update (after the model's own files: they win) and commits it,
// replacing what is_model_file calls the model in dir (its old index's shards included).
std::string commit_model_dir(DirectoryUpdate& u, const std::string& dir, const ModelFiles& files);

}  // namespace diffattn::model
