// The check of the storages a checkpoint archive's pickle declares (pickle_storages.h): refused
// where libtorch would size a storage beyond its record or read out of bounds, left to libtorch
// where it refuses the pickle itself, and silent for every archive libtorch writes. Also the check
// of the sizes its zip directory announces (zip_records.h).
#include "../../src/runtime/checkpoint/pickle_storages.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "../../src/runtime/checkpoint/checkpoint_archive.h"
#include "../../src/runtime/checkpoint/zip_records.h"
#include "chorus/core/error.h"
#include "chorus_version.h"

namespace chorus::runtime {
namespace {

// --- Pickles written by hand, in the opcodes libtorch's unpickler reads ---

std::string littleEndian(std::uint64_t value, int width) {
  std::string bytes;
  for (int i = 0; i < width; ++i) bytes += static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

std::string text(const std::string& value) { return "X" + littleEndian(value.size(), 4) + value; }
std::string int64(std::int64_t value) {
  return "\x8a\x08" + littleEndian(static_cast<std::uint64_t>(value), 8);
}
std::string global(const std::string& module, const std::string& name) {
  return "c" + module + "\n" + name + "\n";
}
std::string storageTuple(const std::string& type, const std::string& key, std::int64_t count) {
  return "(" + text("storage") + global("torch", type) + text(key) + text("cpu") + int64(count) +
         "t";
}
std::string pickle(const std::string& body) { return "\x80\x02" + body + "."; }
std::string put(char index) { return {'q', index}; }  // BINPUT
std::string get(char index) { return {'h', index}; }  // BINGET

// A 16-byte record data/0, and data/1 of 64 bytes.
const std::map<std::string, std::uint64_t> kRecords = {{"data/0", 16}, {"data/1", 64}};

void check(const std::string& pickle) {
  checkPickleStorages("data.pkl", pickle, [](const std::string& name) {
    const auto record = kRecords.find(name);
    return record == kRecords.end() ? std::nullopt : std::optional<std::uint64_t>(record->second);
  });
}

// The message of the CheckpointError that checking `pickle` throws ("" if none).
std::string refusal(const std::string& pickle) {
  try {
    check(pickle);
  } catch (const CheckpointError& error) {
    return error.message();
  }
  return "";
}

bool contains(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

TEST(PickleStorages, StoragesWithinTheirRecordsPass) {
  EXPECT_NO_THROW(check(pickle(storageTuple("FloatStorage", "0", 4) + "Q")));
  EXPECT_NO_THROW(check(pickle(storageTuple("DoubleStorage", "1", 8) + "Q")));
  EXPECT_NO_THROW(check(pickle(storageTuple("ByteStorage", "1", 64) + "Q")));
  EXPECT_NO_THROW(check(pickle(storageTuple("FloatStorage", "absent", 0) + "Q")));
}

TEST(PickleStorages, StorageLargerThanItsRecordIsRefusedNamingBoth) {
  const std::string message = refusal(pickle(storageTuple("FloatStorage", "0", 5) + "Q"));
  EXPECT_EQ(message.rfind("a checkpoint archive is damaged: its record 'data.pkl' declares "
                          "storage '0' of 20 bytes (5 elements of 4) at offset ",
                          0),
            0u)
      << message;
  EXPECT_TRUE(contains(message, "but its record 'data/0' holds 16 bytes")) << message;
  // Element sizes as libtorch has them.
  EXPECT_TRUE(contains(refusal(pickle(storageTuple("ComplexDoubleStorage", "1", 5) + "Q")),
                       "of 80 bytes (5 elements of 16)"));
  EXPECT_TRUE(contains(refusal(pickle(storageTuple("BFloat16Storage", "0", 9) + "Q")),
                       "of 18 bytes (9 elements of 2)"));
}

TEST(PickleStorages, CountWhoseBytesOverflowIsRefused) {
  const std::string message =
      refusal(pickle(storageTuple("DoubleStorage", "1", std::int64_t{1} << 62) + "Q"));
  EXPECT_TRUE(contains(message, "of over 18446744073709551615 bytes")) << message;
}

TEST(PickleStorages, NegativeCountIsRefused) {
  const std::string message = refusal(pickle(storageTuple("FloatStorage", "0", -1) + "Q"));
  EXPECT_TRUE(contains(message, "declares storage '0' at offset 60 with -1 elements")) << message;
}

TEST(PickleStorages, MissingRecordIsRefusedOnlyForAPositiveCount) {
  EXPECT_TRUE(contains(refusal(pickle(storageTuple("FloatStorage", "7", 1) + "Q")),
                       "but the archive has no record 'data/7'"));
  EXPECT_NO_THROW(check(pickle(storageTuple("FloatStorage", "7", 0) + "Q")));
}

TEST(PickleStorages, ElementTypeThatIsNoStorageTypeIsRefused) {
  // libtorch takes any int for the type: 47 (Undefined) ended in SIGFPE, 200 in a SEGV.
  for (int type : {47, 200}) {
    const std::string tuple = "(" + text("storage") + "K" + littleEndian(type, 1) + text("0") +
                              text("cpu") + int64(1) + "tQ";
    EXPECT_TRUE(contains(refusal(pickle(tuple)),
                         "with element type " + std::to_string(type) + ", which is no storage"))
        << type;
  }
}

TEST(PickleStorages, ValuesFromTheMemoAreFollowed) {
  // As libtorch's pickler writes a second storage: 'storage', the type and 'cpu' memoized.
  const std::string first = "(" + text("storage") + put(0) + global("torch", "FloatStorage") +
                            put(1) + text("0") + text("cpu") + put(2) + int64(4) + "tQ";
  const std::string second = "(" + get(0) + get(1) + text("1") + get(2) + int64(17) + "tQ";
  EXPECT_TRUE(contains(refusal(pickle(first + second)), "declares storage '1' of 68 bytes"));
  // A whole tuple from the memo.
  const std::string tuple = storageTuple("FloatStorage", "0", 5) + put(3);
  EXPECT_TRUE(contains(refusal(pickle(tuple + get(3) + "Q")), "storage '0' of 20 bytes"));
}

TEST(PickleStorages, MemoIndexBeyondThePickleIsRefused) {
  // libtorch grows its memo table to the index: 16 bytes an entry, 64 GiB for this one.
  const std::string message = refusal(pickle("N" + std::string("r\xff\xff\xff\xff", 5)));
  EXPECT_TRUE(contains(message,
                       "stores memo entry 4294967295 at offset 3, more than a pickle of "
                       "9 bytes can have"))
      << message;
}

TEST(PickleStorages, WhereLibtorchRefusesThePickleTheCheckLeavesItToLibtorch) {
  const std::string bad = storageTuple("FloatStorage", "0", 1000) + "Q";
  EXPECT_FALSE(refusal(pickle(bad)).empty());
  EXPECT_EQ(refusal("\x80\x03" + bad + "."), "");                   // protocol 3
  EXPECT_EQ(refusal(pickle("I1\n" + bad)), "");                     // INT: no opcode of libtorch's
  EXPECT_EQ(refusal(pickle("Q" + bad)), "");                        // BINPERSID on an empty stack
  EXPECT_EQ(refusal(pickle("t" + bad)), "");                        // TUPLE without a mark
  EXPECT_EQ(refusal(pickle(get(0) + bad)), "");                     // a memo entry never stored
  EXPECT_EQ(refusal(pickle(bad.substr(0, bad.size() - 3))), "");    // the end of the bytes
  EXPECT_EQ(refusal(pickle(global("torch", "Tensor") + bad)), "");  // an unknown torch global
  // A tuple libtorch refuses as a storage: 'storage' misspelt, a location that is no string,
  // too few fields, no tuple at all.
  EXPECT_EQ(refusal(pickle("(" + text("storagf") + global("torch", "FloatStorage") + text("0") +
                           text("cpu") + int64(1000) + "tQ")),
            "");
  EXPECT_EQ(refusal(pickle("(" + text("storage") + global("torch", "FloatStorage") + text("0") +
                           "N" + int64(1000) + "tQ")),
            "");
  EXPECT_EQ(refusal(pickle("(" + text("storage") + global("torch", "FloatStorage") + text("0") +
                           text("cpu") + "tQ")),
            "");
  EXPECT_EQ(refusal(pickle(int64(5) + "Q")), "");
}

TEST(PickleStorages, StorageThatMayBeAnotherValueThanTheModelSeesIsRefused) {
  // An enum of the archive's code given a value none of its members has pushes nothing in
  // libtorch. Here BINPERSID would then take the storage tuple below, which the model, taking
  // the enum off the stack, cannot see.
  const std::string enum_value = global("__torch__", "Colour") + "K\x07" + "R";
  const std::string bad = storageTuple("FloatStorage", "0", 1000);
  EXPECT_TRUE(contains(refusal(pickle(bad + enum_value + "Q")), "cannot be followed back"));
  // In a tuple, it may make libtorch's one field shorter than the model's.
  const std::string tuple = "(" + text("storage") + enum_value + global("torch", "FloatStorage") +
                            text("0") + text("cpu") + int64(1000) + "tQ";
  EXPECT_TRUE(contains(refusal(pickle(tuple)), "cannot be followed back"));
  // Taken off the stack with a value above it (TUPLE2), it leaves the model unsure of all below;
  // storages built afresh are still checked.
  const std::string forget = "N" + enum_value + "N\x86\x81";
  EXPECT_TRUE(contains(refusal(pickle(bad + forget + "Q")), "cannot be followed back"));
  EXPECT_TRUE(contains(refusal(pickle(forget + bad + "Q")), "storage '0' of 4000 bytes"));
  EXPECT_EQ(refusal(pickle(forget + storageTuple("FloatStorage", "0", 4) + "Q")), "");
}

TEST(PickleStorages, FromTypeV2WithNoGlobalAfterItIsRefused) {
  // libtorch's _rebuild_from_type_v2 calls the global registered after it without looking: a
  // SEGV when there is none (torch 2.15, torch.jit.load).
  const std::string call = global("torch._tensor", "_rebuild_from_type_v2") + "(NN)}tR";
  EXPECT_TRUE(contains(refusal(pickle(call)), "calls _rebuild_from_type_v2 at offset 45"));
  // As Python writes it: the rebuild function after it, then torch.Tensor, which only pushes the
  // index of the newest global.
  const std::string written = global("torch._tensor", "_rebuild_from_type_v2") + "(" +
                              global("torch._utils", "_rebuild_tensor_v2") +
                              global("torch", "Tensor") + ")}tR";
  EXPECT_EQ(refusal(pickle(written)), "");
  EXPECT_TRUE(contains(refusal(pickle(written + storageTuple("FloatStorage", "0", 5) + "Q")),
                       "storage '0' of 20 bytes"));
}

// --- Archives libtorch writes ---

std::string recordOf(const std::string& archive, const std::string& name) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(archive.data(),
                                                             static_cast<off_t>(archive.size())));
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

// The archive with record `name` replaced by `contents`, written anew (a valid zip).
std::string withRecord(const std::string& archive, const std::string& name,
                       const std::string& contents) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(archive.data(),
                                                             static_cast<off_t>(archive.size())));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, std::size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const std::string& record : reader.getAllRecords()) {
    if (record == name) {
      writer.writeRecord(record, contents.data(), contents.size());
    } else {
      auto [data, size] = reader.getRecord(record);
      writer.writeRecord(record, data.get(), size);
    }
  }
  writer.writeEndOfFile();
  return out;
}

std::string twoTensorArchive() {
  torch::serialize::OutputArchive archive;
  archive.write("large", torch::arange(64, torch::kFloat32));
  archive.write("small", torch::arange(4, torch::kFloat32));
  return archiveBytes(archive);
}

TEST(PickleStorages, ArchivesLibtorchWritesLoad) {
  torch::serialize::InputArchive archive = archiveOf(twoTensorArchive());
  torch::Tensor large, small;
  archive.read("large", large);
  archive.read("small", small);
  EXPECT_TRUE(large.equal(torch::arange(64, torch::kFloat32)));
  EXPECT_TRUE(small.equal(torch::arange(4, torch::kFloat32)));
}

// What the fuzzer found, on an archive written here: the larger tensor's storage key changed to
// the smaller one's, so that both read the 16-byte record.
TEST(PickleStorages, ArchiveWhoseStorageKeyNamesASmallerRecordIsRefused) {
  const std::string bytes = twoTensorArchive();
  const std::string small_key = recordOf(bytes, "data/0").size() == 16 ? "0" : "1";
  const std::string large_key = small_key == "0" ? "1" : "0";
  ASSERT_EQ(recordOf(bytes, "data/" + large_key).size(), 256u);
  std::string data_pickle = recordOf(bytes, "data.pkl");
  const std::size_t at = data_pickle.find(text(large_key));
  ASSERT_NE(at, std::string::npos);
  data_pickle.replace(at, text(large_key).size(), text(small_key));
  const std::string forged = withRecord(bytes, "data.pkl", data_pickle);
  try {
    archiveOf(forged);
    FAIL() << "a forged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_TRUE(contains(error.message(), "its record 'data.pkl' declares storage '" + small_key +
                                              "' of 256 bytes (64 elements of 4)"))
        << error.message();
    EXPECT_TRUE(contains(error.message(), "its record 'data/" + small_key + "' holds 16 bytes"))
        << error.message();
  }
  // The same rewrite keeping the keys loads: the rewriting is not what is refused.
  EXPECT_NO_THROW(archiveOf(withRecord(bytes, "data.pkl", recordOf(bytes, "data.pkl"))));
}

// fuzz/make_archive_seeds.py: an archive of a scripted module with an enum attribute, forged so
// that the enum's global, called on a value it lacks, sits between a storage tuple declaring
// 137,856 bytes and BINPERSID. torch.jit.load (2.15) loads it, the storage over a 16-byte record.
TEST(PickleStorages, ArchiveWithAStorageBehindAnAbsentEnumIsRefused) {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) +
                       "/fuzz/seeds/checkpoint_archive/storage_behind_an_absent_enum",
                   std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_GT(bytes.size(), 1000u);
  try {
    archiveOf(bytes);
    FAIL() << "a forged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_TRUE(contains(error.message(), "its record 'data.pkl' declares a storage at offset "))
        << error.message();
    EXPECT_TRUE(contains(error.message(), "that cannot be followed back")) << error.message();
  }
}

// zip_records.h: an archive whose zip directory says data/0 holds 2 GiB (it holds 256 bytes):
// libtorch would allocate that before reading the record.
TEST(ZipRecords, EntryAnnouncingMoreThanItsBytesInflateToIsRefused) {
  std::string bytes = twoTensorArchive();
  const std::string name = "archive/data/0";
  std::size_t entry = 0;
  while ((entry = bytes.find("PK\x01\x02", entry + 1)) != std::string::npos) {
    if (bytes.compare(entry + 46, name.size(), name) == 0) break;
  }
  ASSERT_NE(entry, std::string::npos);
  bytes.replace(entry + 24, 4, littleEndian(0x7fffffff, 4));  // its uncompressed size
  try {
    archiveOf(bytes);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_TRUE(contains(error.message(),
                         "its zip entry 'archive/data/0' announces 2147483647 "
                         "bytes, more than its "))
        << error.message();
  }
}

// zip_records.h: the names libtorch takes for debug records, which archiveOf hides from it.
TEST(ZipRecords, DebugRecordNamesAreFoundIgnoringCase) {
  std::string bytes = twoTensorArchive();
  const std::vector<std::uint64_t> ends = debugRecordNameEnds(bytes);
  ASSERT_FALSE(ends.empty());
  for (std::uint64_t end : ends) {
    EXPECT_EQ(bytes.compare(end - 9, 10, ".debug_pkl"), 0);
    bytes.replace(end - 9, 10, ".DEBUG_PKL");
  }
  EXPECT_EQ(debugRecordNameEnds(bytes), ends);
  EXPECT_NO_THROW(archiveOf(bytes));
}

TEST(PickleStorages, PickleEndingInsideAGlobalsLineIsRefused) {
  // libtorch reads such a line on into its stale buffer until std::bad_alloc (17 GB resident).
  const std::string forged = withRecord(twoTensorArchive(), "data.pkl",
                                        "\x80\x02"
                                        "c" +
                                            std::string(300, 'a'));
  try {
    archiveOf(forged);
    FAIL() << "a damaged archive was read";
  } catch (const CheckpointError& error) {
    EXPECT_TRUE(contains(error.message(),
                         "its record 'data.pkl' has a line at offset 3 that the "
                         "record ends before"))
        << error.message();
  }
}

}  // namespace
}  // namespace chorus::runtime
