#include "checkpoint/checkpoint_archive.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "checkpoint/pickle_storages.h"
#include "checkpoint/zip_records.h"
#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

// How a pickle opcode's argument is laid out (Python's pickletools, protocols 0 to 5).
enum class Arg : std::uint8_t {
  kUnknown,  // not an opcode: libtorch refuses it before reading on
  kNone,
  kFixed,   // `size` bytes
  kLines,   // `size` newline-terminated lines
  kLength,  // a little-endian length of `size` bytes, then that many bytes
  kFrame,   // an 8-byte frame length; the frame's opcodes follow
};
struct OpcodeArg {
  Arg kind;
  int size;
};

// Every opcode of pickle protocols 0 to 5 by its argument; the rest are kUnknown.
OpcodeArg opcodeArg(std::uint8_t op) {
  static const std::array<OpcodeArg, 256> table = [] {
    std::array<OpcodeArg, 256> args{};
    args.fill({Arg::kUnknown, 0});
    auto set = [&](std::string_view ops, OpcodeArg arg) {
      for (char op : ops) args[static_cast<std::uint8_t>(op)] = arg;
    };
    set("ILSVFgpP", {Arg::kLines, 1});
    set("ci", {Arg::kLines, 2});
    set("Khq\x80\x82", {Arg::kFixed, 1});
    set("M\x83", {Arg::kFixed, 2});
    set("Jjr\x84", {Arg::kFixed, 4});
    set("G", {Arg::kFixed, 8});
    set("\x8aUC\x8c", {Arg::kLength, 1});
    set("\x8bTBX", {Arg::kLength, 4});
    set("\x8e\x96\x8d", {Arg::kLength, 8});
    set("\x95", {Arg::kFrame, 8});
    set("\x97\x98N\x88\x89]ael)t\x85\x86\x87}dsu\x8f\x90\x91"
        "021(\x94\x93Rbo\x81\x92.Q",
        {Arg::kNone, 0});
    return args;
  }();
  return table[op];
}

// libtorch's unpickler allocates the length that a string, bytes or frame opcode announces
// before it reads the bytes (fuzz/checkpoint_archive_fuzzer.cc: a 7.5 KB archive made a restore
// touch 3.3 GB). No valid pickle announces more than it holds, so an archive whose pickle does
// is damaged: refused here, before libtorch reads it. So is a line (GLOBAL's module and name)
// that the record ends before: libtorch reads on into its stale buffer, appending it until
// std::bad_alloc (17 GB resident for a 7.5 KB archive). Stops where libtorch would stop reading
// (the STOP opcode, or an unknown one), so it refuses nothing libtorch reads whole.
void checkPickleLengths(const std::string& record, const std::uint8_t* data, std::size_t size) {
  std::size_t pos = 0;
  while (pos < size) {
    const std::uint8_t op = data[pos++];
    if (op == '.') return;  // STOP
    const OpcodeArg arg = opcodeArg(op);
    switch (arg.kind) {
      case Arg::kUnknown:
        return;
      case Arg::kNone:
        break;
      case Arg::kFixed:
        pos += static_cast<std::size_t>(arg.size);
        break;
      case Arg::kLines:
        for (int line = 0; line < arg.size; ++line) {
          const void* end = pos < size ? std::memchr(data + pos, '\n', size - pos) : nullptr;
          if (end == nullptr) {
            CHORUS_THROW(CheckpointError, "a checkpoint archive is damaged: its record '", record,
                         "' has a line at offset ", pos, " that the record ends before");
          }
          pos = static_cast<std::size_t>(static_cast<const std::uint8_t*>(end) - data) + 1;
        }
        break;
      case Arg::kLength:
      case Arg::kFrame: {
        const auto width = static_cast<std::size_t>(arg.size);
        if (size - pos < width) return;
        std::uint64_t length = 0;
        for (std::size_t i = width; i-- > 0;) length = (length << 8) | data[pos + i];
        pos += width;
        if (length > size - pos) {
          CHORUS_THROW(CheckpointError, "a checkpoint archive is damaged: its record '", record,
                       "' announces ", length, " bytes at offset ", pos - width - 1, " where only ",
                       size - pos, " remain");
        }
        if (arg.kind == Arg::kLength) pos += static_cast<std::size_t>(length);
        break;
      }
    }
  }
}

// The archive's bytes as libtorch's zip reader is to read them. Without the debug records
// (".debug_pkl": the source ranges of the archive's TorchScript code, for error messages only):
// the last byte of each one's name reads '~', so libtorch finds none. Its source range unpickler
// trusts the text indices in them (fuzz/checkpoint_archive_fuzzer.cc: a SEGV in
// SourceRangeDeserializer::deserialize_source, reached through a syntax error in the code).
// And without MemoryReadAdapter's memcpy into the null buffer libtorch gives an empty record
// (undefined behaviour, though harmless; the fuzzer, UBSan, with an empty 'version' record).
class ArchiveBytes {
 public:
  explicit ArchiveBytes(const std::string& bytes)
      : bytes_(bytes), hidden_(debugRecordNameEnds(bytes)) {}

  std::size_t size() const { return bytes_.size(); }

  std::size_t read(std::uint64_t pos, void* buf, std::size_t n) const {
    if (pos >= bytes_.size()) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, bytes_.size() - pos));
    if (n == 0) return 0;
    std::memcpy(buf, bytes_.data() + pos, n);
    for (auto at = std::lower_bound(hidden_.begin(), hidden_.end(), pos);
         at != hidden_.end() && *at < pos + n; ++at)
      static_cast<char*>(buf)[*at - pos] = '~';
    return n;
  }

 private:
  const std::string& bytes_;
  const std::vector<std::uint64_t> hidden_;
};

// ArchiveBytes for a PyTorchStreamReader.
class ArchiveBytesAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit ArchiveBytesAdapter(const ArchiveBytes& bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n,
                   const char* /*what*/ = "") const override {
    return bytes_.read(pos, buf, n);
  }

 private:
  const ArchiveBytes& bytes_;
};

// Before libtorch reads them, the zip directory is checked for the sizes it announces
// (zip_records.h), and every pickle of the archive is walked for the lengths it announces and
// followed for the storages it declares (pickle_storages.h). libtorch reads it without its debug
// records (ArchiveBytes).
void checkArchive(caffe2::serialize::PyTorchStreamReader& reader) {
  const RecordSizeLookup record_size = [&reader](const std::string& name) {
    return reader.hasRecord(name) ? std::optional<std::uint64_t>(reader.getRecordSize(name))
                                  : std::nullopt;
  };
  for (const std::string& record : reader.getAllRecords()) {
    if (!isPickleRecord(record)) continue;
    auto [data, size] = reader.getRecord(record);
    const auto* pickle = static_cast<const std::uint8_t*>(data.get());
    checkPickleLengths(record, pickle, size);
    checkPickleStorages(record, {reinterpret_cast<const char*>(pickle), size}, record_size);
  }
}

}  // namespace

std::string rankFile(int rank) { return "rank-" + std::to_string(rank) + ".pt"; }

std::string archiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

torch::serialize::InputArchive archiveOf(const std::string& bytes) {
  checkZipRecordSizes(bytes);
  const ArchiveBytes archive_bytes(bytes);
  {
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_shared<ArchiveBytesAdapter>(archive_bytes));
    checkArchive(reader);
  }
  torch::serialize::InputArchive archive;
  archive.load_from([&archive_bytes](std::uint64_t pos, void* buf,
                                     std::size_t n) { return archive_bytes.read(pos, buf, n); },
                    [&archive_bytes] { return archive_bytes.size(); });
  return archive;
}

// As torch::pickle_load reads it ("data.pkl", its storages under "data/"), after the same checks
// as archiveOf and through the same ArchiveBytes; every storage is read onto the CPU.
c10::IValue pickledValueOf(const std::string& bytes) {
  checkZipRecordSizes(bytes);
  const ArchiveBytes archive_bytes(bytes);
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<ArchiveBytesAdapter>(archive_bytes));
  checkArchive(reader);
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           /*type_resolver=*/std::nullopt,
                                           /*obj_loader=*/std::nullopt, at::Device(at::kCPU),
                                           reader);
}

at::Tensor generatorState(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void setGeneratorState(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Generator cpuGenerator() { return at::detail::getDefaultCPUGenerator(); }

nlohmann::json samplerJson(const data::GlobalSampler& sampler, std::int64_t step) {
  const data::SamplerState state = sampler.state(step);
  return {{"epoch", state.epoch}, {"position", state.position}, {"step", state.step}};
}

std::int64_t resumeSampler(const data::GlobalSampler& sampler, const nlohmann::json& saved) {
  return sampler.resume({saved.at("epoch").get<std::int64_t>(),
                         saved.at("position").get<std::int64_t>(),
                         saved.at("step").get<std::int64_t>()});
}

void translateRestoreErrors(const std::string& dir, const std::function<void()>& restore) {
  try {
    restore();
  } catch (const nlohmann::json::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "': trainer.json is damaged or from another chorus version: ", error.what());
  } catch (const c10::Error& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "' does not fit this model or optimizer: ", error.what_without_backtrace());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is damaged: ", error.what());
  }
}

}  // namespace chorus::runtime
