// Bad-input table, checkpoints (CKPT- rows of docs/errors.md): truncated, bit-flipped, another
// model's and another version's checkpoints. `chorus train --resume` checks the files and that
// the checkpoint is of this job before any worker starts (exit 6); what only a trainer reading
// the archives finds fails in the workers, and the job exits 3 naming the rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "bad_input_table.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/core/config.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"
#include "chorus/runtime/train/trainer.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

namespace fs = std::filesystem;
using chorus::testing::BadInputRow;

const std::string kJob =
    testing::jobStart({.seed = 11, .balance = "off"},
                      {.steps = 4, .global_batch = 8, .eval_every = 0}) +
    testing::mlpOnSynthetic({.input_shape = "[1, 4, 4]", .hidden = "[8]", .size = 64}) +
    testing::optimizerTable({.name = "adamw"});

// `chorus train` exits 3 when a worker fails; the worker's own line names the CheckpointError.
constexpr int kWorkerFailed = 3;

JobConfig jobWith(const std::vector<std::string>& settings) {
  Config config = Config::parseString(kJob);
  for (const auto& setting : settings) config.set(setting);
  return readJobConfig(config);
}

std::unique_ptr<Trainer> makeTrainer(const std::vector<std::string>& settings) {
  InitOptions options = testing::threadRankOptions(0, 1, std::make_shared<comm::MemoryStore>());
  (*options.environment)["CHORUS_LOG_LEVEL"] = "error";
  return std::make_unique<Trainer>(jobWith(settings), init(options));
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The checkpoint directory under `root` that `latest` names.
fs::path latestOf(const fs::path& root) {
  std::string name = readFile(root / "latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return root / name;
}

// Rewrites the checkpoint under `root` through CheckpointWriter, with `change` applied to its
// files first: a well-formed checkpoint (manifest and checksums agree) holding other contents,
// as another model or another chorus version would write it.
void rewrite(const fs::path& root,
             const std::function<void(std::vector<CheckpointFile>&)>& change) {
  const fs::path dir = latestOf(root);
  const Manifest manifest = readManifest(dir.string());
  std::vector<CheckpointFile> files;
  for (const auto& entry : manifest.files)
    files.push_back({entry.name, readCheckpointFile(dir.string(), manifest, entry.name)});
  change(files);
  fs::remove_all(root);
  CheckpointOptions options;
  options.root = root.string();
  CheckpointWriter(options, std::make_shared<comm::MemoryStore>(), 0, 1)
      .write(manifest.step, files);
}

std::string& contentsOf(std::vector<CheckpointFile>& files, const std::string& name) {
  for (auto& file : files)
    if (file.name == name) return file.bytes;
  throw std::runtime_error("no file " + name);
}

void editManifest(const fs::path& root, const std::function<void(nlohmann::json&)>& change) {
  const fs::path path = latestOf(root) / "MANIFEST.json";
  nlohmann::json manifest = nlohmann::json::parse(readFile(path));
  change(manifest);
  writeFile(path, manifest.dump(1));
}

struct CheckpointRow {
  BadInputRow row;
  std::function<void(const fs::path& root)> damage;
  // Whether it takes a worker to find the fault: `chorus train --resume` first resolves the
  // checkpoint and checks that it fits the job (the job: kJob with `settings`), then each worker
  // resumes from it.
  bool worker = false;
  std::vector<std::string> settings = {};
};

// gtest prints a failing row by its id.
void PrintTo(const CheckpointRow& param, std::ostream* out) { *out << param.row.id; }

const std::vector<CheckpointRow>& checkpointRows() {
  static const std::vector<CheckpointRow> rows = {
      {{"CKPT-01", "CheckpointError", "model.pt' is truncated or damaged: "},
       [](const fs::path& root) {
         const fs::path model = latestOf(root) / "model.pt";
         fs::resize_file(model, fs::file_size(model) / 2);
       }},
      {{"CKPT-02", "CheckpointError",
        "optimizer.pt' is corrupted: its SHA-256 does not match the manifest"},
       [](const fs::path& root) {
         const fs::path optimizer = latestOf(root) / "optimizer.pt";
         std::string bytes = readFile(optimizer);
         bytes[bytes.size() / 2] ^= 0x10;
         writeFile(optimizer, bytes);
       }},
      {{"CKPT-03", "CheckpointError", "has no MANIFEST.json (incomplete or not a checkpoint)"},
       [](const fs::path& root) { fs::remove(latestOf(root) / "MANIFEST.json"); }},
      {{"CKPT-04", "CheckpointError", "MANIFEST.json is damaged: "},
       [](const fs::path& root) {
         const fs::path path = latestOf(root) / "MANIFEST.json";
         const std::string text = readFile(path);
         writeFile(path, text.substr(0, text.size() / 2));
       }},
      {{"CKPT-05", "CheckpointError", "format 2 is not supported (this chorus reads format 1)"},
       [](const fs::path& root) {
         editManifest(root, [](nlohmann::json& manifest) { manifest["format"] = 2; });
       }},
      {{"CKPT-06", "CheckpointError",
        "MANIFEST.json names a file '../model.pt' outside the checkpoint directory"},
       [](const fs::path& root) {
         editManifest(root, [](nlohmann::json& manifest) {
           for (auto& file : manifest["files"])
             if (file["name"] == "model.pt") file["name"] = "../model.pt";
         });
       }},
      {{"CKPT-07", "CheckpointError", "rank-0.pt' is missing"},
       [](const fs::path& root) { fs::remove(latestOf(root) / "rank-0.pt"); }},
      {{"CKPT-08", "CheckpointError", "no valid checkpoint under '"},
       [](const fs::path& root) {
         fs::remove_all(latestOf(root));
         fs::remove(root / "latest");
         fs::create_directories(root / "step-99999999999999999999");
       }},
      {{"CKPT-09", "CheckpointError", "is of another job: the model was mlp(input=16, hidden=8"},
       nullptr,
       false,
       {"model.hidden=[6]"}},
      {{"CKPT-10", "CheckpointError", "is of another job: seed was 11, the config says 12"},
       nullptr,
       false,
       {"seed=12"}},
      {{"CKPT-11", "CheckpointError",
        "trainer.json is damaged or from another chorus version: ", kWorkerFailed},
       [](const fs::path& root) {
         rewrite(root, [](std::vector<CheckpointFile>& files) {
           std::string& text = contentsOf(files, "trainer.json");
           nlohmann::json trainer = nlohmann::json::parse(text);
           trainer.erase("sampler");
           text = trainer.dump(1);
         });
       },
       true},
      {{"CKPT-12", "CheckpointError", "does not fit this model or optimizer: ", kWorkerFailed},
       [](const fs::path& root) {
         rewrite(root, [](std::vector<CheckpointFile>& files) {
           contentsOf(files, "model.pt") = "not a libtorch archive";
         });
       },
       true},
      {{"CKPT-13", "CheckpointError", "does not fit this model or optimizer: ", kWorkerFailed},
       [](const fs::path& root) {
         rewrite(root, [](std::vector<CheckpointFile>& files) {
           // Another version's rank file: the model's archive where the RNG state belongs.
           contentsOf(files, "rank-0.pt") = contentsOf(files, "model.pt");
         });
       },
       true},
      {{"CKPT-14", "CheckpointError",
        "is of another job: optimizer.name was adamw, the config "
        "says sgd"},
       nullptr,
       false,
       {"optimizer.name=sgd"}},
  };
  return rows;
}

class CheckpointBadInput : public ::testing::TestWithParam<CheckpointRow> {
 protected:
  // One good checkpoint of kJob after two steps, written once; each row damages a copy.
  static void SetUpTestSuite() {
    // Per process: ctest runs each row as its own process, possibly several at once.
    good_ = fs::path(::testing::TempDir()) / ("chorus_bad_ckpt_good_" + std::to_string(::getpid()));
    fs::remove_all(good_);
    auto trainer = makeTrainer({"checkpoint.dir=" + good_.string()});
    trainer->step();
    trainer->step();
    trainer->checkpoint();
  }

  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("chorus_bad_ckpt_" + std::to_string(::getpid()) + "_" + GetParam().row.id);
    fs::remove_all(root_);
    fs::copy(good_, root_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(root_); }
  static void TearDownTestSuite() { fs::remove_all(good_); }

  static fs::path good_;
  fs::path root_;
};

fs::path CheckpointBadInput::good_;

TEST_P(CheckpointBadInput, IsRefusedNamingTheCheckpoint) {
  const CheckpointRow& param = GetParam();
  if (param.damage) param.damage(root_);
  std::vector<std::string> settings = param.settings;
  settings.push_back("checkpoint.dir=" + root_.string());
  bool front_accepted = false;
  try {
    const std::string dir = resolveCheckpoint("latest", root_.string());
    validateResume(jobWith(settings), dir);
    front_accepted = true;
    makeTrainer(settings)->resume(dir);
    ADD_FAILURE() << param.row.id << ": the checkpoint was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(chorus::testing::matchesRow(error, param.row));
    EXPECT_NE(error.message().find(root_.string()), std::string::npos) << error.message();
    EXPECT_EQ(front_accepted, param.worker) << error.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, CheckpointBadInput, ::testing::ValuesIn(checkpointRows()),
                         chorus::testing::rowName<CheckpointRow>);

TEST(CheckpointBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("CKPT-", chorus::testing::rowsOf(checkpointRows()));
}

// Resuming needs a checkpoint root to look in.
TEST(CheckpointBadInputTable, LatestWithoutACheckpointDirIsRefused) {
  try {
    resolveCheckpoint("latest", "");
    ADD_FAILURE() << "accepted";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("--resume latest needs checkpoint.dir"), std::string::npos);
  }
}

}  // namespace
}  // namespace chorus::runtime
