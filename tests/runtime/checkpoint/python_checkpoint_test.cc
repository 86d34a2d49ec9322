// consolidatePythonCheckpoint (checkpoint.h): the model of a file in chorus.save's layout
// (python/chorus/checkpoint.py) written as model.pt, and the refusals: a checksum missing or not
// matching, a forged pickle (refused before libtorch reads it), another format, no model, a model
// entry that is no tensor. The files are written here by torch::pickle_save, whose bytes are
// torch.save's; tests/python/test_checkpoint_consolidate.py consolidates files Python wrote.
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "../../src/runtime/checkpoint/checkpoint_archive.h"
#include "../../src/runtime/checkpoint/checkpoint_files.h"
#include "chorus/core/error.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus_version.h"

namespace chorus::runtime {
namespace {

using Dict = c10::impl::GenericDict;

Dict stringDict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

Dict chorusEntry(const std::string& format = "chorus-python-checkpoint/1") {
  Dict chorus = stringDict();
  chorus.insert("format", format);
  return chorus;
}

// What chorus.save pickles for a model of two tensors.
Dict savedDict(const at::Tensor& weight, const at::Tensor& steps) {
  Dict model = stringDict();
  model.insert("layer.weight", weight);
  model.insert("layer.num_batches_tracked", steps);
  Dict outer = stringDict();
  outer.insert("chorus", chorusEntry());
  outer.insert("model", model);
  outer.insert("model_python_only", c10::List<std::string>({"layer._extra_state"}));
  outer.insert("python", torch::arange(16, torch::kUInt8));
  return outer;
}

std::string pickled(const c10::IValue& value) {
  const std::vector<char> bytes = torch::jit::pickle_save(value);
  return {bytes.begin(), bytes.end()};
}

class PythonCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("chorus_python_checkpoint_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `bytes` as checkpoint.pt, with its SHA-256 beside it (as chorus.save writes both).
  std::string write(const std::string& bytes, bool with_checksum = true) {
    const std::string file = (dir_ / "checkpoint.pt").string();
    std::ofstream(file, std::ios::binary) << bytes;
    if (with_checksum) std::ofstream(file + ".sha256") << sha256Hex(bytes) << "\n";
    return file;
  }
  std::string out() const { return (dir_ / "model.pt").string(); }

  // The message of the CheckpointError consolidating `file` throws ("" if none).
  std::string refusal(const std::string& file) {
    try {
      consolidatePythonCheckpoint(file, out());
    } catch (const CheckpointError& error) {
      EXPECT_FALSE(std::filesystem::exists(out()));
      return error.message();
    }
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(PythonCheckpoint, ModelEntryIsWrittenAsTheModelPtTheDirectoryPathWrites) {
  const at::Tensor weight = torch::randn({3, 4});
  const at::Tensor steps = torch::tensor(7, torch::kInt64);
  const std::string file = write(pickled(savedDict(weight, steps)));
  EXPECT_TRUE(isPythonCheckpointFile(file));
  EXPECT_FALSE(isPythonCheckpointFile(dir_.string()));
  EXPECT_EQ(consolidatePythonCheckpoint(file, out()), 2);
  std::ifstream in(out(), std::ios::binary);
  auto archive = archiveOf({std::istreambuf_iterator<char>(in), {}});
  std::map<std::string, at::Tensor> read;
  for (const std::string& key : archive.keys()) archive.read(key, read[key]);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_TRUE(read["layer.weight"].equal(weight));
  EXPECT_TRUE(read["layer.num_batches_tracked"].equal(steps));
}

TEST_F(PythonCheckpoint, MissingChecksumIsRefused) {
  const std::string file =
      write(pickled(savedDict(torch::ones({2}), torch::zeros({}))), /*with_checksum=*/false);
  EXPECT_NE(refusal(file).find("has no '" + file + ".sha256' beside it"), std::string::npos);
}

TEST_F(PythonCheckpoint, FlippedByteIsRefusedByItsChecksum) {
  std::string bytes = pickled(savedDict(torch::ones({2}), torch::zeros({})));
  const std::string file = write(bytes);
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(file, std::ios::binary) << bytes;
  EXPECT_NE(refusal(file).find("is damaged: its SHA-256 does not match " + file + ".sha256"),
            std::string::npos);
}

// A forger writes the checksum too: archiveOf's checks still refuse a pickle that announces more
// bytes than it holds, before libtorch allocates them.
TEST_F(PythonCheckpoint, ForgedPickleIsRefusedBeforeLibtorchReadsIt) {
  const std::string valid = pickled(savedDict(torch::ones({2}), torch::zeros({})));
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(valid.data(),
                                                             static_cast<off_t>(valid.size())));
  std::string forged;
  caffe2::serialize::PyTorchStreamWriter writer([&forged](const void* data, std::size_t size) {
    forged.append(static_cast<const char*>(data), size);
    return size;
  });
  bool replaced = false;
  for (const std::string& record : reader.getAllRecords()) {
    if (record == "data.pkl") {
      const std::string pickle = std::string("\x80\x02X\x00\x00\x00\x70", 7) + "abc.";
      writer.writeRecord(record, pickle.data(), pickle.size());
      replaced = true;
    } else {
      auto [data, size] = reader.getRecord(record);
      writer.writeRecord(record, data.get(), size);
    }
  }
  writer.writeEndOfFile();
  ASSERT_TRUE(replaced);
  EXPECT_NE(refusal(write(forged)).find("announces 1879048192 bytes"), std::string::npos);
}

TEST_F(PythonCheckpoint, AnotherFormatIsRefused) {
  Dict outer = savedDict(torch::ones({2}), torch::zeros({}));
  outer.insert_or_assign("chorus", chorusEntry("chorus-python-checkpoint/9"));
  EXPECT_NE(refusal(write(pickled(outer))).find("is of format 'chorus-python-checkpoint/9'"),
            std::string::npos);
  EXPECT_NE(refusal(write(pickled(torch::ones({2})))).find("is not a chorus.save checkpoint"),
            std::string::npos);
}

TEST_F(PythonCheckpoint, FileWithoutModelIsRefused) {
  Dict outer = stringDict();
  outer.insert("chorus", chorusEntry());
  outer.insert("python", torch::arange(4, torch::kUInt8));
  EXPECT_NE(
      refusal(write(pickled(outer))).find("holds no model: chorus.save was called without model="),
      std::string::npos);
}

TEST_F(PythonCheckpoint, ModelEntryThatIsNoTensorIsRefused) {
  Dict outer = savedDict(torch::ones({2}), torch::zeros({}));
  Dict model = stringDict();
  model.insert("layer.weight", std::string("not a tensor"));
  outer.insert_or_assign("model", model);
  EXPECT_NE(refusal(write(pickled(outer))).find("is damaged: its model holds an entry"),
            std::string::npos);
}

// The python_checkpoint fuzzer's seeds: chorus.save's files consolidate (all but the one saved
// without a model), and its findings are CheckpointErrors. forged_quantized_tensor: a model
// entry forged into a quantized tensor whose quantizer libtorch cannot name, which made the
// archive writer terminate the process (std::terminate from inside libtorch's exporter).
TEST_F(PythonCheckpoint, EveryConsolidateFuzzerSeedConsolidatesOrIsACheckpointError) {
  const std::filesystem::path seeds =
      std::filesystem::path(CHORUS_SOURCE_DIR) / "fuzz/seeds/python_checkpoint";
  int count = 0;
  for (const auto& seed : std::filesystem::directory_iterator(seeds)) {
    std::ifstream in(seed.path(), std::ios::binary);
    const std::string file = write({std::istreambuf_iterator<char>(in), {}});
    const std::string name = seed.path().filename().string();
    if (name == "mlp_and_optimizer" || name == "batchnorm_and_extra") {
      EXPECT_GT(consolidatePythonCheckpoint(file, out()), 0) << name;
      std::filesystem::remove(out());
    } else {
      const std::string message = refusal(file);
      if (name == "forged_quantized_tensor")
        EXPECT_NE(message.find("is not a dense tensor"), std::string::npos) << message;
      if (name == "no_model") EXPECT_NE(message.find("holds no model"), std::string::npos);
    }
    ++count;
  }
  EXPECT_GE(count, 4);
}

// The archive fuzzer's seeds (fuzz/seeds/checkpoint_archive: chorus's archives, and the forged
// ones that crashed or exhausted libtorch's reader) through libtorch's unpickler as consolidate
// reads a file: each a CheckpointError (none is chorus.save's), the forged ones refused by
// archiveOf's checks before libtorch reads them.
TEST_F(PythonCheckpoint, EveryArchiveFuzzerSeedIsACheckpointError) {
  const std::filesystem::path seeds =
      std::filesystem::path(CHORUS_SOURCE_DIR) / "fuzz/seeds/checkpoint_archive";
  int count = 0;
  for (const auto& seed : std::filesystem::directory_iterator(seeds)) {
    std::ifstream in(seed.path(), std::ios::binary);
    const std::string message = refusal(write({std::istreambuf_iterator<char>(in), {}}));
    EXPECT_NE(message.find("checkpoint '" + (dir_ / "checkpoint.pt").string() + "'"),
              std::string::npos)
        << seed.path() << ": " << message;
    if (seed.path().filename() == "pickle_announces_2_8_gb")
      EXPECT_NE(message.find("its record 'data.pkl' announces 2827878655 bytes"), std::string::npos)
          << message;
    if (seed.path().filename() == "storage_larger_than_its_record")
      EXPECT_NE(message.find("declares storage '1' of 5056 bytes"), std::string::npos) << message;
    ++count;
  }
  EXPECT_GE(count, 9);
}

}  // namespace
}  // namespace chorus::runtime
