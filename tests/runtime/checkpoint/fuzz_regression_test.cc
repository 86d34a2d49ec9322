// Inputs that the fuzz targets of fuzz/ found to break the checkpoint reader, each pinned down as
// the behaviour it must have now (docs/security.md, "Fuzzing": the findings and their fixes).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../../src/runtime/checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus_version.h"

namespace chorus::runtime {
namespace {

std::string seedArchive(const std::string& name) {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/fuzz/seeds/checkpoint_archive/" + name,
                   std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What the restore of a rank's state does with an archive (trainer_checkpoint.cc).
void restoreRankStateFrom(const std::string& bytes) {
  translateRestoreErrors("ckpt", [&] {
    torch::serialize::InputArchive archive = archiveOf(bytes);
    at::Tensor rng;
    archive.read("rng_cpu", rng);
  });
}

TEST(CheckpointFuzzRegression, SeedArchiveReads) {
  const std::string bytes = seedArchive("rank_state");
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_NO_THROW(restoreRankStateFrom(bytes));
}

// fuzz/checkpoint_archive_fuzzer.cc: one byte changed in an archive's pickle, naming the unknown
// global torch._utils._rebuild_tensor_v3, made libtorch throw torch::jit::ErrorReport, which is
// no c10::Error: it escaped translateRestoreErrors and ended the process (std::terminate in the
// fuzzer; an unexpected exception in `chorus train --resume`). It is a CheckpointError now.
TEST(CheckpointFuzzRegression, ArchiveWithAnUnknownPickleGlobalIsACheckpointError) {
  std::string bytes = seedArchive("rank_state");
  const std::string known = "_rebuild_tensor_v2";
  const std::size_t at = bytes.find(known);
  ASSERT_NE(at, std::string::npos);
  bytes[at + known.size() - 1] = '3';
  try {
    restoreRankStateFrom(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_EQ(error.message().rfind("checkpoint 'ckpt' is damaged: ", 0), 0u) << error.message();
    EXPECT_NE(error.message().find("_rebuild_tensor_v3"), std::string::npos) << error.message();
  }
}

// fuzz/checkpoint_archive_fuzzer.cc: an archive whose pickle announced a 2.8 GB string made
// libtorch allocate and fill that much before it found the archive too short (3.3 GB resident
// for a 7.5 KB file). The announced lengths are checked against the records first now.
TEST(CheckpointFuzzRegression, PickleAnnouncingMoreThanItHoldsIsRefusedBeforeLibtorchReadsIt) {
  std::string bytes = seedArchive("rank_state");
  // BINUNICODE in data.pkl (stored uncompressed): 'X', a 4-byte little-endian length, the text.
  const std::string key = std::string("X\x07", 2) + std::string(3, '\0') + "rng_cpu";
  const std::size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 4] = '\x10';  // 7 + 256 MiB
  try {
    restoreRankStateFrom(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("its record 'data.pkl' announces 268435463 bytes"),
              std::string::npos)
        << error.message();
  }
}

// fuzz/checkpoint_archive_fuzzer.cc (SEGV in CPUGeneratorImpl::set_state): a rank-state archive
// whose pickle names storage '1' (the 16-byte loss scale) for the 5056-byte generator state, one
// digit changed. libtorch made a storage of 5056 bytes over the 16-byte record, and set_state read
// past it. The storages a pickle declares are checked against their records first now.
TEST(CheckpointFuzzRegression, StorageLargerThanItsRecordIsRefusedBeforeLibtorchReadsIt) {
  const std::string bytes = seedArchive("storage_larger_than_its_record");
  ASSERT_GT(bytes.size(), 1000u);
  try {
    restoreRankStateFrom(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("a checkpoint archive is damaged: its record 'data.pkl' "
                                   "declares storage '1' of 5056 bytes"),
              std::string::npos)
        << error.message();
    EXPECT_NE(error.message().find("its record 'data/1' holds 16 bytes"), std::string::npos)
        << error.message();
  }
}

// fuzz/checkpoint_archive_fuzzer.cc (out of memory): a rank-state archive whose zip directory
// says code/__torch__.py inflates to 4,093,640,703 bytes (176 compressed). libtorch's
// PyTorchStreamReader::getRecord allocates the announced size before inflating. The directory's
// sizes are checked against what deflate can make of the compressed bytes first now.
TEST(CheckpointFuzzRegression, RecordAnnouncingMoreThanItsBytesInflateToIsRefused) {
  const std::string bytes = seedArchive("record_announcing_4_gb");
  ASSERT_GT(bytes.size(), 1000u);
  try {
    restoreRankStateFrom(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("a checkpoint archive is damaged: its zip entry "
                                   "'rank_state/code/__torch__.py' announces 4093640703 bytes, "
                                   "more than its 176 compressed bytes inflate to"),
              std::string::npos)
        << error.message();
  }
}

// fuzz/checkpoint_manifest_fuzzer.cc (UBSan, `scripts/fuzz ci` on 2026-12-05): a MANIFEST.json
// whose world_size is 1111111111111111111111111112, more than an int64 holds, which nlohmann keeps
// as a double and get<int>() cast: undefined behaviour. Every integer field is read in its range
// now.
TEST(CheckpointFuzzRegression, AManifestNumberPastItsRangeIsDamageNotACast) {
  const std::string dir = ::testing::TempDir() + "/chorus_manifest_range/step-00000010";
  std::filesystem::create_directories(dir);
  struct Case {
    const char* key;
    const char* step;
    const char* world_size;
  };
  for (const Case& bad : {Case{"world_size", "10", "1111111111111111111111111112"},
                          Case{"world_size", "10", "4294967297"}, Case{"world_size", "10", "2.5"},
                          Case{"step", "1e300", "1"}}) {
    std::ofstream(dir + "/MANIFEST.json", std::ios::trunc)
        << "{\"format\": 1, \"step\": " << bad.step << ", \"world_size\": " << bad.world_size
        << ", \"files\": []}";
    try {
      readManifest(dir);
      ADD_FAILURE() << "read a manifest with step " << bad.step << ", world_size "
                    << bad.world_size;
    } catch (const CheckpointError& error) {
      EXPECT_NE(error.message().find(std::string("MANIFEST.json is damaged: '") + bad.key + "'"),
                std::string::npos)
          << error.message();
    }
  }
}

// fuzz/checkpoint_archive_fuzzer.cc (UBSan): an archive whose 'version' record is empty. libtorch
// gives an empty record a null buffer, and libtorch's MemoryReadAdapter (a header, compiled into
// archiveOf) copied nothing into it with memcpy: undefined behaviour, though harmless. archiveOf
// reads the bytes through its own adapter now; the archive is refused as libtorch refuses it.
TEST(CheckpointFuzzRegression, ArchiveWithAnEmptyVersionRecordIsACheckpointError) {
  const std::string bytes = seedArchive("empty_version_record");
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_THROW(restoreRankStateFrom(bytes), CheckpointError);
}

// fuzz/checkpoint_archive_fuzzer.cc (SEGV in libtorch): an archive whose TorchScript code has a
// syntax error and whose debug record (code/...py.debug_pkl) has a text index past its table.
// libtorch's parser highlighted the error through the debug record, and its source range
// unpickler indexed its text table unchecked (torch.jit.load died of SIGSEGV too). libtorch reads
// archives without their debug records now: the syntax error is a CheckpointError.
TEST(CheckpointFuzzRegression, DebugRecordWithATextIndexPastItsTableIsNotRead) {
  const std::string bytes = seedArchive("debug_record_text_index_out_of_range");
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_THROW(restoreRankStateFrom(bytes), CheckpointError);
}

// fuzz/checkpoint_archive_fuzzer.cc (out of memory): a model archive whose pickle record is named
// data.Pkl and stores memo entry 772,567,394. libtorch finds data.pkl ignoring case, as miniz
// compares names, and grew its memo to the index (12 GB); the checks took the record for none of
// the archive's pickles. They take every record libtorch may read as one now.
TEST(CheckpointFuzzRegression, PickleRecordNamedInCapitalsIsChecked) {
  const std::string bytes = seedArchive("pickle_record_named_in_capitals");
  ASSERT_GT(bytes.size(), 1000u);
  try {
    restoreRankStateFrom(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("its record 'data.Pkl' stores memo entry 772567394"),
              std::string::npos)
        << error.message();
  }
}

}  // namespace
}  // namespace chorus::runtime
