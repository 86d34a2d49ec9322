// The checkpoint format: atomic publishing, checksums, `latest` and its fallback, pruning, and a
// crash in the middle of a write.
#include "chorus/runtime/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {
namespace fs = std::filesystem;

std::string freshRoot(const std::string& name) {
  const std::string root = ::testing::TempDir() + "/chorus_ckpt_format_" + name;
  fs::remove_all(root);
  return root;
}

// Every rank writes "r<rank>.bin" with `payload` + its rank; rank 0 also "shared.bin".
void writeOnRanks(const std::string& root, int world, std::int64_t step, const std::string& payload,
                  int keep = 3) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        CheckpointOptions options;
        options.root = root;
        options.keep = keep;
        CheckpointWriter writer(options, store, rank, world);
        std::vector<CheckpointFile> files{
            {"r" + std::to_string(rank) + ".bin", payload + std::to_string(rank)}};
        if (rank == 0) files.push_back({"shared.bin", payload});
        writer.write(step, files);
      } catch (const std::exception& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) ASSERT_EQ(error, "");
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc | std::ios::binary) << text;
}

TEST(Checkpoint, ThreeRanksPublishOneCheckpointWithAManifest) {
  const std::string root = freshRoot("publish");
  writeOnRanks(root, 3, 7, "hello");
  const std::string dir = root + "/step-00000007";
  const Manifest manifest = readManifest(dir);
  EXPECT_EQ(manifest.step, 7);
  EXPECT_EQ(manifest.world_size, 3);
  EXPECT_EQ(manifest.files.size(), 4u);
  EXPECT_EQ(readCheckpointFile(dir, manifest, "r2.bin"), "hello2");
  EXPECT_EQ(readCheckpointFile(dir, manifest, "shared.bin"), "hello");
  EXPECT_EQ(readText(root + "/latest"), "step-00000007\n");
  EXPECT_EQ(resolveCheckpoint("latest", root), dir);
  EXPECT_EQ(resolveCheckpoint(root, ""), dir);
  EXPECT_EQ(resolveCheckpoint(dir, ""), dir);
}

TEST(Checkpoint, AFlippedByteIsFoundAndTheFileNamed) {
  const std::string root = freshRoot("flip");
  writeOnRanks(root, 2, 1, "0123456789");
  const std::string file = root + "/step-00000001/r1.bin";
  std::string bytes = readText(file);
  bytes[3] ^= 0x01;
  writeText(file, bytes);
  try {
    verifyCheckpoint(root + "/step-00000001");
    FAIL() << "the corruption went unnoticed";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("r1.bin' is corrupted"), std::string::npos)
        << error.what();
  }
}

TEST(Checkpoint, ATruncatedFileIsFoundAndTheFileNamed) {
  const std::string root = freshRoot("truncate");
  writeOnRanks(root, 2, 1, "0123456789");
  const std::string file = root + "/step-00000001/shared.bin";
  fs::resize_file(file, 4);
  try {
    verifyCheckpoint(root + "/step-00000001");
    FAIL() << "the truncation went unnoticed";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("shared.bin' is truncated"), std::string::npos)
        << error.what();
  }
}

TEST(Checkpoint, LatestFallsBackToTheNewestValidCheckpoint) {
  const std::string root = freshRoot("fallback");
  writeOnRanks(root, 2, 10, "older");
  writeOnRanks(root, 2, 20, "newer");
  fs::resize_file(root + "/step-00000020/r0.bin", 1);
  EXPECT_EQ(resolveCheckpoint("latest", root), root + "/step-00000010");
  // Nothing valid at all: one error that says why for each.
  fs::remove(root + "/step-00000010/MANIFEST.json");
  try {
    resolveCheckpoint("latest", root);
    FAIL() << "resolved a damaged checkpoint";
  } catch (const CheckpointError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("no valid checkpoint"), std::string::npos) << text;
    EXPECT_NE(text.find("r0.bin' is truncated"), std::string::npos) << text;
    EXPECT_NE(text.find("has no MANIFEST.json"), std::string::npos) << text;
  }
}

TEST(Checkpoint, KeepsOnlyTheNewestK) {
  const std::string root = freshRoot("keep");
  for (std::int64_t step : {1, 2, 3, 4}) writeOnRanks(root, 1, step, "x", /*keep=*/2);
  EXPECT_EQ(listCheckpoints(root), (std::vector<std::string>{"step-00000004", "step-00000003"}));
}

// A process killed (SIGKILL) in the middle of writing a checkpoint leaves the previous one as
// `latest`, loadable, and the partial one under a staging name that lookups ignore.
TEST(Checkpoint, AKillDuringAWriteLeavesThePreviousCheckpointLoadable) {
  const std::string root = freshRoot("kill");
  writeOnRanks(root, 1, 5, "good");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = std::make_shared<comm::MemoryStore>();
    CheckpointOptions options;
    options.root = root;
    options.after_file = [](const std::string&) { ::raise(SIGKILL); };
    CheckpointWriter writer(options, store, 0, 1);
    writer.write(9, {{"a.bin", std::string(1 << 20, 'a')}, {"b.bin", "b"}});
    ::_exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(fs::exists(root + "/.staging-step-00000009/a.bin"));
  EXPECT_FALSE(fs::exists(root + "/step-00000009"));
  EXPECT_EQ(resolveCheckpoint("latest", root), root + "/step-00000005");
  // The next successful write clears the stale staging directory of an older step.
  writeOnRanks(root, 1, 12, "next");
  EXPECT_FALSE(fs::exists(root + "/.staging-step-00000009"));
}

}  // namespace
}  // namespace chorus::runtime
