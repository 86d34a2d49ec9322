// Gradient codecs: bytes against fp32, encode+decode speed against a plain copy measured in the
// same run, and error on a gradient-like matrix (decaying spectrum plus noise).
//
//   compression_bench [OUTPUT.json]   (default bench/results/compression.json, from the repo root)
//
// Speeds are single-threaded (one intra-op thread, as chorus workers run) medians of 5 runs.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/parallel/compression.h"

namespace {

using namespace chorus;
using parallel::CodecKind;

constexpr std::int64_t kRows = 1024;
constexpr std::int64_t kCols = 1024;
constexpr int kRepeats = 5;

double medianSeconds(const std::function<void()>& run) {
  std::vector<double> seconds;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    Stopwatch clock;
    run();
    seconds.push_back(clock.seconds());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[kRepeats / 2];
}

// sum_i (1/i) a_i b_iᵀ over 64 terms plus 1% noise: most energy in few directions, like real
// gradients of weight matrices.
at::Tensor gradientLike() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor a = at::randn({kRows, 64}, generator, at::kFloat);
  const at::Tensor b = at::randn({64, kCols}, generator, at::kFloat);
  const at::Tensor decay = 1.0 / (at::arange(64) + 1).to(at::kFloat);
  at::Tensor m = (a * decay).matmul(b) / 8.0;
  return (m + 0.01 * m.std() * at::randn({kRows, kCols}, generator, at::kFloat)).view({-1});
}

struct Row {
  std::string codec;
  double payload_ratio = 0;        // fp32 bytes / payload bytes
  std::vector<double> wire_ratio;  // for 2, 4, 8 ranks
  double gbps = 0;                 // fp32 bytes encoded+decoded per second
  double vs_copy = 0;              // gbps over a plain copy's
  double relative_error = 0;       // ‖x − x̂‖ / ‖x‖, one step, no feedback
};

// Wire bytes per rank of a fp32 ring all-reduce over those of the codec's collective.
double wireRatio(CodecKind kind, double payload_ratio, int ranks) {
  const bool gathers = kind == CodecKind::kInt8 || kind == CodecKind::kTopK;
  return gathers ? payload_ratio * 2.0 / ranks : payload_ratio;
}

Row measureElement(CodecKind kind, const at::Tensor& x, double copy_gbps) {
  parallel::CodecOptions options;
  options.kind = kind;
  auto codec = parallel::makeElementCodec(options);
  at::Tensor back;
  const double seconds = medianSeconds([&] { back = codec->decode(codec->encode(x)); });
  Row row;
  row.codec = codec->name();
  row.payload_ratio = 4.0 * static_cast<double>(x.numel()) / codec->encodedBytes(x.numel());
  for (int ranks : {2, 4, 8}) row.wire_ratio.push_back(wireRatio(kind, row.payload_ratio, ranks));
  row.gbps = static_cast<double>(x.nbytes()) / seconds / 1e9;
  row.vs_copy = row.gbps / copy_gbps;
  row.relative_error = ((back - x).norm() / x.norm()).item<double>();
  return row;
}

// PowerSGD needs its all-reduces: a group of one rank makes them local copies.
Row measurePowerSgd(const at::Tensor& x, double copy_gbps) {
  auto comm = comm::Communicator::create(std::make_shared<comm::MemoryStore>(), 0, 1);
  parallel::CodecOptions options;
  options.kind = CodecKind::kPowerSgd;
  options.error_feedback = false;
  auto codec = parallel::makeCodec(options);
  const parallel::FlatLayout layout{{{"w", 0, {kRows, kCols}}}};
  at::Tensor back;
  const double seconds = medianSeconds([&] {
    back = x.clone();
    codec->allReduce("w", back, layout, *comm);
  });
  Row row;
  row.codec = "powersgd";
  row.payload_ratio = static_cast<double>(kRows * kCols) /
                      (options.powersgd_rank * static_cast<double>(kRows + kCols));
  for (int ranks : {2, 4, 8})
    row.wire_ratio.push_back(wireRatio(CodecKind::kPowerSgd, row.payload_ratio, ranks));
  row.gbps = static_cast<double>(x.nbytes()) / seconds / 1e9;
  row.vs_copy = row.gbps / copy_gbps;
  row.relative_error = ((back - x).norm() / x.norm()).item<double>();  // after 5 warm steps
  return row;
}

std::string toJson(const std::vector<Row>& rows, double copy_gbps) {
  std::ostringstream out;
  out << "{\n  \"tensor\": [" << kRows << ", " << kCols << "],\n  \"threads\": 1,\n"
      << "  \"copy_gbps\": " << copy_gbps << ",\n  \"codecs\": [\n";
  for (size_t index = 0; index < rows.size(); ++index) {
    const Row& row = rows[index];
    out << "    {\"codec\": \"" << row.codec << "\", \"payload_ratio\": " << row.payload_ratio
        << ", \"wire_ratio_2_4_8\": [" << row.wire_ratio[0] << ", " << row.wire_ratio[1] << ", "
        << row.wire_ratio[2] << "], \"gbps\": " << row.gbps << ", \"vs_copy\": " << row.vs_copy
        << ", \"relative_error\": " << row.relative_error << "}"
        << (index + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string output = argc > 1 ? argv[1] : "bench/results/compression.json";
  at::set_num_threads(1);
  const at::Tensor x = gradientLike();
  at::Tensor copy;
  const double copy_gbps =
      static_cast<double>(x.nbytes()) / medianSeconds([&] { copy = x.clone(); }) / 1e9;
  std::vector<Row> rows;
  for (auto kind : {CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kTopK})
    rows.push_back(measureElement(kind, x, copy_gbps));
  rows.push_back(measurePowerSgd(x, copy_gbps));
  std::printf("%-9s %8s %22s %9s %8s %10s\n", "codec", "payload", "wire x (2/4/8 ranks)", "GB/s",
              "vs copy", "rel.error");
  for (const Row& row : rows)
    std::printf("%-9s %7.1fx %7.1f %6.1f %6.1f %9.3f %8.3f %10.2e\n", row.codec.c_str(),
                row.payload_ratio, row.wire_ratio[0], row.wire_ratio[1], row.wire_ratio[2],
                row.gbps, row.vs_copy, row.relative_error);
  std::printf("copy baseline: %.2f GB/s\n", copy_gbps);
  std::ofstream(output) << toJson(rows, copy_gbps);
  std::printf("wrote %s\n", output.c_str());
  return 0;
}
