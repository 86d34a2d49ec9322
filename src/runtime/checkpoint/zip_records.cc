// Contract: checkZipRecordSizes finds an archive's zip central directory as miniz 3 (libtorch's zip
// reader) does, reads each entry's sizes as its mz_zip_reader_file_stat does (zip64 fields
// included), and throws CheckpointError "a checkpoint archive is damaged: its zip entry 'N'
// announces U bytes, more than its C compressed bytes inflate to" where U exceeds what deflate can
// make of C bytes. libtorch's PyTorchStreamReader::getRecord allocates the announced size before
// inflating (fuzz/checkpoint_archive_fuzzer.cc: a 7.5 KB archive whose code/__torch__.py
// announced 4,093,640,703 bytes), and its constructor reads two records before anything else can
// look. Where miniz would not read the directory, the check returns and leaves the error to
// libtorch. It reads the directory once and allocates nothing.
#include "checkpoint/zip_records.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/core/text.h"

namespace chorus::runtime {
namespace {

constexpr std::uint32_t kEndSignature = 0x06054b50;  // end of central directory: 22 bytes
constexpr std::uint64_t kEndSize = 22;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;  // 20 bytes, before the end record
constexpr std::uint64_t kZip64LocatorSize = 20;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;  // zip64 end of central directory
constexpr std::uint64_t kZip64EndSize = 56;
constexpr std::uint32_t kEntrySignature = 0x02014b50;  // central directory entry: 46 bytes + more
constexpr std::uint64_t kEntrySize = 46;
constexpr std::uint16_t kZip64ExtraField = 0x0001;
constexpr std::uint64_t kEscape32 = 0xffffffff;  // "the value is in the zip64 field"

// deflate makes at most 1032 bytes of one (258-byte matches in 2-bit codes); the margin covers a
// stream's first bytes.
constexpr std::uint64_t kInflateRatio = 1032;
constexpr std::uint64_t kInflateMargin = 1024;

// The archive's bytes, read little-endian where the caller has checked they are there.
class Bytes {
 public:
  explicit Bytes(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t size() const { return bytes_.size(); }
  bool holds(std::uint64_t at, std::uint64_t count) const {
    return at <= size() && count <= size() - at;
  }
  std::uint64_t read(std::uint64_t at, int width) const {
    std::uint64_t value = 0;
    for (int i = width; i-- > 0;) value = (value << 8) | static_cast<std::uint8_t>(bytes_[at + i]);
    return value;
  }
  std::string_view text(std::uint64_t at, std::uint64_t count) const {
    return bytes_.substr(at, count);
  }

 private:
  std::string_view bytes_;
};

// Where miniz finds the end record: scanning back from the end in 4 KB chunks for the last
// signature with a whole record after it, giving up past 64 KB (its comment's limit).
std::optional<std::uint64_t> endRecord(const Bytes& zip) {
  constexpr std::int64_t kChunk = 4096;
  const auto size = static_cast<std::int64_t>(zip.size());
  if (size < static_cast<std::int64_t>(kEndSize)) return std::nullopt;
  std::int64_t chunk = std::max<std::int64_t>(size - kChunk, 0);
  for (;;) {
    const std::int64_t length = std::min(kChunk, size - chunk);
    for (std::int64_t i = length - 4; i >= 0; --i) {
      const auto at = static_cast<std::uint64_t>(chunk + i);
      if (zip.read(at, 4) == kEndSignature && zip.size() - at >= kEndSize) return at;
    }
    if (chunk == 0 || size - chunk >= 0xffff + static_cast<std::int64_t>(kEndSize))
      return std::nullopt;
    chunk = std::max<std::int64_t>(chunk - (kChunk - 3), 0);
  }
}

struct Directory {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t entries = 0;
};

// The zip64 end record, where a locator right before the end record points at one.
std::optional<std::uint64_t> zip64EndRecord(const Bytes& zip, std::uint64_t end) {
  if (end < kZip64LocatorSize + kZip64EndSize) return std::nullopt;
  const std::uint64_t locator = end - kZip64LocatorSize;
  if (zip.read(locator, 4) != kZip64LocatorSignature) return std::nullopt;
  const std::uint64_t record = zip.read(locator + 8, 8);
  if (!zip.holds(record, kZip64EndSize) || zip.read(record, 4) != kZip64EndSignature)
    return std::nullopt;
  return record;
}

// The central directory as miniz's mz_zip_reader_read_central_dir takes it; nullopt where it
// would refuse the archive.
std::optional<Directory> directoryOf(const Bytes& zip) {
  const std::optional<std::uint64_t> end = endRecord(zip);
  if (!end) return std::nullopt;
  Directory directory{zip.read(*end + 16, 4), zip.read(*end + 12, 4), zip.read(*end + 10, 2)};
  std::uint64_t entries_here = zip.read(*end + 8, 2);
  if (const std::optional<std::uint64_t> zip64 = zip64EndRecord(zip, *end)) {
    directory = {zip.read(*zip64 + 48, 8), zip.read(*zip64 + 40, 8), zip.read(*zip64 + 32, 8)};
    entries_here = zip.read(*zip64 + 24, 8);
  }
  if (directory.entries != entries_here || directory.entries > directory.size / kEntrySize ||
      !zip.holds(directory.offset, directory.size))
    return std::nullopt;
  return directory;
}

struct Sizes {
  std::uint64_t compressed;
  std::uint64_t uncompressed;
};

// An entry's sizes as mz_zip_reader_file_stat reads them: an escaped one (all 32 bits set) from
// the zip64 extra field, in its order; nullopt where that field is malformed (libtorch refuses
// the record before reading it).
std::optional<Sizes> sizesOf(const Bytes& zip, std::uint64_t entry) {
  Sizes sizes{zip.read(entry + 20, 4), zip.read(entry + 24, 4)};
  const std::uint64_t header_offset = zip.read(entry + 42, 4);
  if (std::max({sizes.compressed, sizes.uncompressed, header_offset}) != kEscape32) return sizes;
  std::uint64_t field = entry + kEntrySize + zip.read(entry + 28, 2);
  std::uint64_t remaining = zip.read(entry + 30, 2);
  while (remaining > 0) {
    if (remaining < 4) return std::nullopt;
    const std::uint64_t id = zip.read(field, 2), length = zip.read(field + 2, 2);
    if (length + 4 > remaining) return std::nullopt;
    if (id == kZip64ExtraField) {
      std::uint64_t at = field + 4, left = length;
      for (std::uint64_t* value : {&sizes.uncompressed, &sizes.compressed}) {
        if (*value != kEscape32) continue;
        if (left < 8) return std::nullopt;
        *value = zip.read(at, 8);
        at += 8;
        left -= 8;
      }
      return sizes;
    }
    field += 4 + length;
    remaining -= 4 + length;
  }
  return sizes;
}

void checkEntry(const Bytes& zip, std::uint64_t entry) {
  const std::optional<Sizes> sizes = sizesOf(zip, entry);
  if (!sizes) return;
  const std::uint64_t compressed = std::min(sizes->compressed, zip.size());
  if (sizes->uncompressed <= compressed * kInflateRatio + kInflateMargin) return;
  std::string name(zip.text(entry + kEntrySize, zip.read(entry + 28, 2)));
  for (char& c : name)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  CHORUS_THROW(CheckpointError, "a checkpoint archive is damaged: its zip entry '", name,
               "' announces ", sizes->uncompressed, " bytes, more than its ", sizes->compressed,
               " compressed bytes inflate to");
}

// Calls `visit` with the offset of each entry of the central directory, as far as miniz would
// read it.
template <typename Visit>
void forEachEntry(const Bytes& zip, const Visit& visit) {
  const std::optional<Directory> directory = directoryOf(zip);
  if (!directory) return;
  std::uint64_t entry = directory->offset;
  const std::uint64_t end = directory->offset + directory->size;
  for (std::uint64_t i = 0; i < directory->entries; ++i) {
    if (end - entry < kEntrySize || zip.read(entry, 4) != kEntrySignature) return;
    const std::uint64_t length =
        kEntrySize + zip.read(entry + 28, 2) + zip.read(entry + 30, 2) + zip.read(entry + 32, 2);
    if (length > end - entry) return;
    visit(entry);
    entry += length;
  }
}

}  // namespace

void checkZipRecordSizes(std::string_view archive) {
  const Bytes zip(archive);
  forEachEntry(zip, [&zip](std::uint64_t entry) { checkEntry(zip, entry); });
}

std::vector<std::uint64_t> debugRecordNameEnds(std::string_view archive) {
  const Bytes zip(archive);
  std::vector<std::uint64_t> ends;
  forEachEntry(zip, [&](std::uint64_t entry) {
    const std::uint64_t length = zip.read(entry + 28, 2);
    // miniz compares names ignoring case.
    if (endsWithIgnoringCase(zip.text(entry + kEntrySize, length), ".debug_pkl"))
      ends.push_back(entry + kEntrySize + length - 1);
  });
  return ends;
}

}  // namespace chorus::runtime
