// PowerSGD on the zoo GPT: the character-level GPT on a text corpus, trained data-parallel by two
// "hosts" (ranks as threads over one MemoryStore, one rank per host, so every gradient byte crosses
// the slow link), once with a plain fp32 all-reduce and once with PowerSGD (error feedback) —
// the same model, seed, global batches and split. Reports both loss curves' ends and the bytes the
// codec put on the link against the fp32 ring's (GradientCodec::stats()).
//
//   powersgd_gpt [--steps 200] [--hosts 2] [--batch 32] [--layers 2] [--width 128]
//                [--context 64] [--lr 0.001] [--seed 1] [--optimizer adamw|sgd] [--text PATH]
//                [--out FILE.json]
//                codec (CodecOptions, see parallel/compression.h): [--rank 4] [--iterations 2]
//                [--bf16-factors 1] [--start-step 0] [--min-rate 2] [--min-elements 4096]
//                [--error-feedback 1]
//
// "Final loss" is the mean global training loss of the last 10 steps (one step's loss is noisy:
// each step sees different samples). Both runs are in one process, one after the other.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <exception>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/data/sampler.h"
#include "chorus/data/text_corpus.h"
#include "chorus/model/gpt.h"
#include "chorus/parallel/compression.h"
#include "chorus/parallel/gradient_reducer.h"

namespace {

using namespace chorus;

constexpr int kTail = 10;  // steps averaged into the final loss

struct Args {
  int steps = 200;
  int hosts = 2;
  std::int64_t batch = 32;
  std::int64_t layers = 2;
  std::int64_t width = 128;
  std::int64_t context = 64;
  double lr = 0.001;
  std::uint64_t seed = 1;           // of the model's initialization and the sampler
  std::string optimizer = "adamw";  // or "sgd" (momentum 0.9, as in the PowerSGD paper)
  std::string text = data::kDefaultTextPath;
  std::string out;
  // The compressed run's codec: CodecOptions' defaults except rank 4 (the target's), two power
  // iterations and bf16 factors (the same bytes as one fp32 iteration, and closer to fp32 loss).
  parallel::CodecOptions codec = [] {
    parallel::CodecOptions options;
    options.kind = parallel::CodecKind::kPowerSgd;
    options.powersgd_rank = 4;
    options.powersgd_iterations = 2;
    options.powersgd_bf16_factors = true;
    return options;
  }();
};

bool isOn(const std::string& value) { return value != "0" && value != "off" && value != "false"; }

Args parseArgs(int argc, char** argv) {
  Args args;
  auto& codec = args.codec;
  const std::map<std::string, std::function<void(const std::string&)>> flags = {
      {"--steps", [&](const std::string& v) { args.steps = std::stoi(v); }},
      {"--hosts", [&](const std::string& v) { args.hosts = std::stoi(v); }},
      {"--batch", [&](const std::string& v) { args.batch = std::stoll(v); }},
      {"--layers", [&](const std::string& v) { args.layers = std::stoll(v); }},
      {"--width", [&](const std::string& v) { args.width = std::stoll(v); }},
      {"--context", [&](const std::string& v) { args.context = std::stoll(v); }},
      {"--lr", [&](const std::string& v) { args.lr = std::stod(v); }},
      {"--seed", [&](const std::string& v) { args.seed = std::stoull(v); }},
      {"--optimizer", [&](const std::string& v) { args.optimizer = v; }},
      {"--text", [&](const std::string& v) { args.text = v; }},
      {"--out", [&](const std::string& v) { args.out = v; }},
      {"--rank", [&](const std::string& v) { codec.powersgd_rank = std::stoi(v); }},
      {"--iterations", [&](const std::string& v) { codec.powersgd_iterations = std::stoi(v); }},
      {"--bf16-factors", [&](const std::string& v) { codec.powersgd_bf16_factors = isOn(v); }},
      {"--start-step", [&](const std::string& v) { codec.powersgd_start_step = std::stoi(v); }},
      {"--min-rate",
       [&](const std::string& v) { codec.powersgd_min_compression_rate = std::stod(v); }},
      {"--min-elements",
       [&](const std::string& v) { codec.powersgd_min_elements = std::stoll(v); }},
      {"--error-feedback", [&](const std::string& v) { codec.error_feedback = isOn(v); }}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto found = flags.find(flag);
    if (found == flags.end()) CHORUS_THROW(ConfigError, "unknown flag ", flag);
    if (i + 1 >= argc) CHORUS_THROW(ConfigError, "flag ", flag, " needs a value");
    found->second(argv[++i]);
  }
  if (args.steps <= kTail || args.hosts < 2 || args.batch % args.hosts != 0)
    CHORUS_THROW(ConfigError, "need --steps > ", kTail, ", --hosts >= 2 dividing --batch");
  return args;
}

struct RunResult {
  std::vector<double> losses;  // global mean training loss per step
  parallel::CompressionStats stats;
  double seconds = 0;
  double finalLoss() const {
    double sum = 0;
    for (size_t i = losses.size() - kTail; i < losses.size(); ++i) sum += losses[i];
    return sum / kTail;
  }
};

// compressed / plain final loss − 1.
double lossGap(const RunResult& plain, const RunResult& compressed) {
  return compressed.finalLoss() / plain.finalLoss() - 1.0;
}

// Bytes an fp32 ring all-reduce sent over the bytes the codec sent.
double byteRatio(const RunResult& plain, const RunResult& compressed) {
  return static_cast<double>(plain.stats.wire_bytes) /
         static_cast<double>(compressed.stats.wire_bytes);
}

// One rank's training loop; rank 0 fills `result`.
void trainRank(const Args& args, const data::TextCorpus& corpus, parallel::CodecKind kind,
               std::shared_ptr<comm::Store> store, int rank, RunResult& result) {
  comm::CommOptions comm_options;
  comm_options.name = std::string("gpt-") + toString(kind);
  auto world = comm::Communicator::create(std::move(store), rank, args.hosts, comm_options);
  model::ModelConfig config;
  config.kind = "gpt";
  config.vocab = corpus.numClasses();
  config.layers = args.layers;
  config.width = args.width;
  config.context = args.context;
  model::Gpt gpt(config, args.seed);
  parallel::CodecOptions codec_options = args.codec;
  codec_options.kind = kind;
  auto codec = std::shared_ptr<parallel::GradientCodec>(parallel::makeCodec(codec_options));
  parallel::ReducerOptions reducer_options;
  reducer_options.codec = codec;
  parallel::GradientReducer reducer(gpt.parameters(), world, reducer_options);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (args.optimizer == "sgd")
    optimizer = std::make_unique<torch::optim::SGD>(
        gpt.parameters(), torch::optim::SGDOptions(args.lr).momentum(0.9));
  else
    optimizer = std::make_unique<torch::optim::AdamW>(gpt.parameters(),
                                                      torch::optim::AdamWOptions(args.lr));
  const data::GlobalSampler sampler(corpus.size(), args.batch, args.seed);
  const std::int64_t share = args.batch / args.hosts;
  for (int step = 0; step < args.steps; ++step) {
    const auto ids = sampler.batch(step);
    const std::vector<std::int64_t> mine(ids.begin() + rank * share,
                                         ids.begin() + (rank + 1) * share);
    const data::Batch batch = corpus.get(mine);
    optimizer->zero_grad();
    at::Tensor loss = gpt.lossSum(gpt.forward(batch.inputs), batch.targets);
    reducer.armForFinalBackward();
    loss.backward();
    reducer.finish(args.batch);
    optimizer->step();
    at::Tensor total = loss.detach().reshape({1}).clone();
    world->allReduce(total).wait();
    if (rank == 0) result.losses.push_back(total.item<double>() / static_cast<double>(args.batch));
  }
  if (rank == 0) result.stats = codec->stats();
}

RunResult train(const Args& args, const data::TextCorpus& corpus, parallel::CodecKind kind) {
  auto store = std::make_shared<comm::MemoryStore>();
  RunResult result;
  std::vector<std::exception_ptr> errors(args.hosts);
  std::vector<std::thread> threads;
  Stopwatch clock;
  for (int rank = 0; rank < args.hosts; ++rank)
    threads.emplace_back([&, rank] {
      try {
        trainRank(args, corpus, kind, store, rank, result);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
  result.seconds = clock.seconds();
  return result;
}

std::string lossList(const std::vector<double>& losses) {
  std::ostringstream text;
  text << std::setprecision(6) << "[";
  for (size_t i = 0; i < losses.size(); ++i) text << (i ? ", " : "") << losses[i];
  return text.str() + "]";
}

std::string resultJson(const Args& args, const RunResult& plain, const RunResult& compressed) {
  const parallel::CodecOptions& codec = args.codec;
  std::ostringstream json;
  json << std::setprecision(6) << std::boolalpha << "{\n  \"model\": \"gpt(layers=" << args.layers
       << ", width=" << args.width << ", context=" << args.context
       << ")\",\n  \"hosts\": " << args.hosts << ", \"steps\": " << args.steps
       << ", \"global_batch\": " << args.batch << ", \"seed\": " << args.seed
       << ", \"optimizer\": \"" << args.optimizer << "\", \"lr\": " << args.lr
       << ",\n  \"powersgd_rank\": " << codec.powersgd_rank
       << ", \"powersgd_iterations\": " << codec.powersgd_iterations
       << ", \"powersgd_bf16_factors\": " << codec.powersgd_bf16_factors
       << ", \"powersgd_start_step\": " << codec.powersgd_start_step
       << ", \"powersgd_min_compression_rate\": " << codec.powersgd_min_compression_rate
       << ", \"powersgd_min_elements\": " << codec.powersgd_min_elements
       << ", \"error_feedback\": " << codec.error_feedback
       << ",\n  \"final_loss_fp32\": " << plain.finalLoss()
       << ", \"final_loss_powersgd\": " << compressed.finalLoss()
       << ", \"final_loss_gap\": " << lossGap(plain, compressed)
       << ",\n  \"wire_bytes_fp32\": " << plain.stats.wire_bytes
       << ", \"wire_bytes_powersgd\": " << compressed.stats.wire_bytes
       << ", \"wire_ratio\": " << byteRatio(plain, compressed)
       << ", \"codec_wire_ratio\": " << compressed.stats.wireRatio()
       << ",\n  \"seconds_fp32\": " << plain.seconds
       << ", \"seconds_powersgd\": " << compressed.seconds
       << ",\n  \"losses_fp32\": " << lossList(plain.losses)
       << ",\n  \"losses_powersgd\": " << lossList(compressed.losses) << "\n}\n";
  return json.str();
}

int run(int argc, char** argv) {
  const Args args = parseArgs(argc, argv);
  at::set_num_threads(1);  // one intra-op thread per rank, as chorus workers run
  data::TextCorpusOptions corpus_options;
  corpus_options.context = args.context;
  const auto corpus = data::loadTextCorpus(args.text, corpus_options);
  const RunResult plain = train(args, *corpus, parallel::CodecKind::kNone);
  const RunResult compressed = train(args, *corpus, parallel::CodecKind::kPowerSgd);
  const std::string json = resultJson(args, plain, compressed);
  std::cout << json;
  if (!args.out.empty()) std::ofstream(args.out) << json;
  const double gap = lossGap(plain, compressed), ratio = byteRatio(plain, compressed);
  std::cout << "powersgd_gpt: final loss " << compressed.finalLoss() << " vs " << plain.finalLoss()
            << " (" << std::showpos << 100 * gap << std::noshowpos << "%), " << ratio
            << "x fewer bytes across the link" << std::endl;
  return std::abs(gap) <= 0.03 && ratio >= 10 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "powersgd_gpt: " << error.what() << std::endl;
    return 1;
  }
}
