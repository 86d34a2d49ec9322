// `chorus checkpoint consolidate FILE` for the Python front's checkpoints: the model of one file
// that chorus.save wrote (python/chorus/checkpoint.py) as the same model.pt the directory path
// writes (one tensor per dotted name), read without Python.
//
// Contract: the file is checked against the hex SHA-256 in FILE.sha256 before anything reads it,
// then by archiveOf's checks (pickledValueOf: a forged pickle cannot make libtorch over-read or
// over-allocate), then read by libtorch's unpickler. chorus.save pickles only what that reads
// (python/chorus/checkpoint.py, the module's note):
//   {"chorus": {"format": "chorus-python-checkpoint/1"},
//    "model": {name: tensor}, "model_python_only": [name, ...],   (when a model was saved)
//    "python": uint8 tensor}                                         (the rest, for Python only)
// A file of the earlier layout (one int beyond 32 bits in random.getstate(), which libtorch
// refuses), of another format, without a model, or with entries of other types is refused with
// a CheckpointError naming the file. Entries of the model's state dict that libtorch cannot read
// (an extra state, a sparse tensor: "model_python_only") are left out of model.pt with a warning.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <cctype>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_archive.h"
#include "checkpoint/checkpoint_files.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/checkpoint/checkpoint.h"

namespace chorus::runtime {
namespace {

constexpr const char* kPythonFormat = "chorus-python-checkpoint/1";
// What a file libtorch cannot read may be.
constexpr const char* kEarlier =
    " (not a file of chorus.save, or one of a chorus before consolidate read them, which "
    "chorus.load still reads): ";

// The whole file, checked against FILE.sha256 as chorus.load checks it.
std::string readCheckedFile(const std::string& file) {
  const std::string digest_file = file + ".sha256";
  if (!std::filesystem::exists(digest_file)) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' has no '", digest_file,
                 "' beside it: not a checkpoint chorus.save wrote, or one whose checksum is lost");
  }
  const std::string bytes = readWholeFile(file);
  std::string expected = readWholeFile(digest_file);
  while (!expected.empty() && std::isspace(static_cast<unsigned char>(expected.back())))
    expected.pop_back();
  if (sha256Hex(bytes) != expected) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is damaged: its SHA-256 does not match ",
                 digest_file);
  }
  return bytes;
}

// The dict the file pickles, read by libtorch; its errors as CheckpointError naming the file.
c10::impl::GenericDict outerDict(const std::string& file, const std::string& bytes) {
  c10::IValue value;
  try {
    value = pickledValueOf(bytes);
  } catch (const CheckpointError& error) {  // archiveOf's checks: the archive is forged or damaged
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "': ", error.message());
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' cannot be read by libtorch", kEarlier,
                 error.what_without_backtrace());
  } catch (const std::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' cannot be read by libtorch", kEarlier,
                 error.what());
  }
  if (!value.isGenericDict())
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is not a chorus.save checkpoint");
  return value.toGenericDict();
}

// dict[key], or a None IValue where the dict has no such string key.
c10::IValue entry(const c10::impl::GenericDict& dict, const std::string& key) {
  const auto found = dict.find(c10::IValue(key));
  return found == dict.end() ? c10::IValue() : found->value();
}

void checkFormat(const std::string& file, const c10::impl::GenericDict& outer) {
  const c10::IValue chorus = entry(outer, "chorus");
  const c10::IValue format =
      chorus.isGenericDict() ? entry(chorus.toGenericDict(), "format") : c10::IValue();
  if (!format.isString()) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file,
                 "' is not a chorus.save checkpoint (it has no chorus format)");
  }
  if (format.toStringRef() != kPythonFormat) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is of format '", format.toStringRef(),
                 "', this chorus reads '", kPythonFormat, "'");
  }
}

// The names of "model_python_only", for the warning.
std::string pythonOnlyNames(const std::string& file, const c10::IValue& names) {
  if (names.isNone()) return "";
  if (!names.isList())
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is damaged: model_python_only");
  std::string joined;
  for (const c10::IValue& name : names.toListRef()) {
    if (!name.isString())
      CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is damaged: model_python_only");
    joined += (joined.empty() ? "" : ", ") + name.toStringRef();
  }
  return joined;
}

}  // namespace

std::int64_t consolidatePythonCheckpoint(const std::string& file, const std::string& out) {
  const std::string bytes = readCheckedFile(file);
  const c10::impl::GenericDict outer = outerDict(file, bytes);
  checkFormat(file, outer);
  const c10::IValue model = entry(outer, "model");
  if (model.isNone()) {
    CHORUS_THROW(CheckpointError, "checkpoint '", file,
                 "' holds no model: chorus.save was called without model=");
  }
  if (!model.isGenericDict())
    CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is damaged: its model is no dict");
  torch::serialize::OutputArchive archive;
  std::int64_t count = 0;
  for (const auto& item : model.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      CHORUS_THROW(CheckpointError, "checkpoint '", file,
                   "' is damaged: its model holds an entry that is no named tensor");
    }
    const at::Tensor& tensor = item.value().toTensor();
    // chorus.save puts only dense tensors there (the rest goes to model_python_only). A forged
    // quantized tensor whose quantizer libtorch cannot name made the archive writer terminate
    // the process (fuzz/seeds/python_checkpoint/forged_quantized_tensor).
    if (tensor.layout() != at::kStrided || tensor.is_quantized()) {
      CHORUS_THROW(CheckpointError, "checkpoint '", file, "' is damaged: its model entry '",
                   item.key().toStringRef(),
                   "' is not a dense tensor (chorus.save writes only those there)");
    }
    archive.write(item.key().toStringRef(), tensor);
    ++count;
  }
  const std::string left_out = pythonOnlyNames(file, entry(outer, "model_python_only"));
  if (!left_out.empty()) {
    logWarn("chorus checkpoint: ", file, ": not in ", out,
            " (state dict entries only Python reads): ", left_out);
  }
  writeFileDurably(out, archiveBytes(archive));
  return count;
}

bool isPythonCheckpointFile(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

}  // namespace chorus::runtime
