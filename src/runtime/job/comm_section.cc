// [comm]: the job's keys checked, and as the plan's CommPlan, which the engines read (job_config.cc
// reads them).
//
// A job without a plan file becomes a plan with its [comm] (commOf); a plan made elsewhere (a
// plan file, the planner's under plan = "auto") brings its settings into the job (commUnderPlan),
// so that the job's checks judge what runs. A key the job writes and the plan contradicts is an
// error, never silently dropped (ZeroSection::stage_given is the same rule for zero.stage).
#include <sstream>

#include "chorus/core/error.h"
#include "job/job_sections.h"

namespace chorus::runtime {

const std::vector<std::string>& commKeysThePlanDecides() {
  static const std::vector<std::string> keys = {"bucket_mb",
                                                "first_bucket_mb",
                                                "min_buckets",
                                                "overlap",
                                                "algorithm",
                                                "compression",
                                                "powersgd_rank",
                                                "powersgd_iterations",
                                                "powersgd_bf16_factors",
                                                "powersgd_min_compression_rate",
                                                "powersgd_start_step",
                                                "topk_ratio",
                                                "error_feedback",
                                                "sync_every"};
  return keys;
}

namespace {

template <typename T>
std::string shown(const T& value) {
  std::ostringstream text;
  text << std::boolalpha << value;
  return text.str();
}

// The job's `value` of comm.`key` becomes the plan's `planned`, unless the job wrote another.
template <typename T, typename P>
void take(const CommSection& comm, const char* key, T& value, const P& planned) {
  const T wanted = static_cast<T>(planned);
  if (value == wanted) return;
  require(!comm.given.count(key), std::string("comm.") + key,
          "the plan runs " + shown(wanted) + ", the job says " + shown(value) +
              "; remove the key or run another plan");
  value = wanted;
}

}  // namespace

void checkComm(const CommSection& comm) {
  requireChoice(comm.algorithm, "comm.algorithm", {"flat", "auto", "hierarchical", "2d"});
  requireChoice(comm.compression, "comm.compression",
                {"none", "fp16", "bf16", "int8", "topk", "powersgd"});
  requireChoice(comm.cpu_transport, "comm.cpu_transport", {"auto", "gloo", "shm"});
  require(comm.powersgd_rank >= 1, "comm.powersgd_rank", "must be at least 1");
  require(comm.powersgd_iterations >= 1, "comm.powersgd_iterations", "must be at least 1");
  require(comm.powersgd_min_compression_rate >= 1, "comm.powersgd_min_compression_rate",
          "must be at least 1");
  require(comm.powersgd_start_step >= 0, "comm.powersgd_start_step", "must be >= 0");
  require(comm.topk_ratio > 0 && comm.topk_ratio <= 1, "comm.topk_ratio", "must be in (0, 1]");
  require(comm.sync_every >= 1, "comm.sync_every", "must be at least 1");
  // Local SGD averages parameters with one plain all-reduce over all ranks: neither a codec nor a
  // hierarchy would be applied, so neither is accepted with it.
  require(comm.sync_every == 1 || comm.compression == "none", "comm.compression",
          "cannot be combined with comm.sync_every > 1 (local SGD averages parameters with a "
          "plain all-reduce); set comm.compression = \"none\" or comm.sync_every = 1");
  require(comm.sync_every == 1 || comm.algorithm == "flat", "comm.algorithm",
          "cannot be combined with comm.sync_every > 1 (local SGD averages parameters with a "
          "plain all-reduce); set comm.algorithm = \"flat\" or comm.sync_every = 1");
  // A codec compresses what the host leaders exchange, a step only the hierarchical algorithm
  // has ("flat" runs it among all ranks as leaders of themselves; "auto" then picks
  // hierarchical); "2d" would silently become hierarchical.
  require(comm.compression == "none" || comm.algorithm != "2d", "comm.algorithm",
          "'2d' cannot carry a codec (comm.compression = '" + comm.compression +
              "'): use \"hierarchical\", or \"flat\" to run the codec among all ranks");
  // A codec's knobs do nothing without that codec (engine_settings.cc's jobCodec builds none for
  // "none"). A knob left at its default asks for nothing, and is let be.
  const CommSection defaults;
  const std::string& codec = comm.compression;
  const struct {
    const char* key;
    bool set;
    bool read;
    const char* reader;
  } knobs[] = {
      {"comm.powersgd_rank", comm.powersgd_rank != defaults.powersgd_rank, codec == "powersgd",
       "powersgd"},
      {"comm.powersgd_iterations", comm.powersgd_iterations != defaults.powersgd_iterations,
       codec == "powersgd", "powersgd"},
      {"comm.powersgd_bf16_factors", comm.powersgd_bf16_factors != defaults.powersgd_bf16_factors,
       codec == "powersgd", "powersgd"},
      {"comm.powersgd_min_compression_rate",
       comm.powersgd_min_compression_rate != defaults.powersgd_min_compression_rate,
       codec == "powersgd", "powersgd"},
      {"comm.powersgd_start_step", comm.powersgd_start_step != defaults.powersgd_start_step,
       codec == "powersgd", "powersgd"},
      {"comm.topk_ratio", comm.topk_ratio != defaults.topk_ratio, codec == "topk", "topk"},
      {"comm.error_feedback", comm.error_feedback != defaults.error_feedback, codec != "none",
       "a lossy codec"},
  };
  for (const auto& knob : knobs)
    require(!knob.set || knob.read, knob.key,
            "is read by comm.compression = " + std::string(knob.reader) +
                " only, and this job's is '" + codec + "'; remove the key");
  require(comm.bucket_mb > 0, "comm.bucket_mb", "must be positive");
  require(comm.first_bucket_mb > 0, "comm.first_bucket_mb", "must be positive");
  require(comm.min_buckets >= 1 && comm.min_buckets <= 1024, "comm.min_buckets",
          "must be in [1, 1024]");
  // Workers get the deadline as an int of milliseconds: 1 ms to a week fits.
  require(comm.timeout_s >= 0.001 && comm.timeout_s <= 7 * 24 * 3600, "comm.timeout_s",
          "must be in [0.001, 604800] seconds (1 ms to a week)");
}

plan::CommPlan commOf(const JobConfig& job) {
  const CommSection& section = job.comm;
  plan::CommPlan comm;
  comm.algorithm = parseAllReduceAlgorithm(section.algorithm);
  CodecOptions& codec = comm.codec;
  codec.kind = parseCodecKind(section.compression);
  codec.powersgd_rank = static_cast<int>(section.powersgd_rank);
  codec.powersgd_iterations = static_cast<int>(section.powersgd_iterations);
  codec.powersgd_bf16_factors = section.powersgd_bf16_factors;
  codec.powersgd_min_compression_rate = section.powersgd_min_compression_rate;
  codec.powersgd_start_step = static_cast<int>(section.powersgd_start_step);
  codec.topk_ratio = section.topk_ratio;
  codec.error_feedback = section.error_feedback;
  codec.seed = job.seed;
  comm.bucket_mb = section.bucket_mb;
  comm.first_bucket_mb = section.first_bucket_mb;
  comm.min_buckets = static_cast<int>(section.min_buckets);
  comm.overlap = section.overlap;
  comm.sync_period = static_cast<int>(section.sync_every);
  return comm;
}

CommSection commUnderPlan(CommSection comm, const plan::CommPlan& planned) {
  const CodecOptions& codec = planned.codec;
  // The knobs the job has no key for run at their defaults: a plan that sets them cannot run.
  const CodecOptions defaults;
  CHORUS_CHECK_CONFIG(codec.int8_chunk == defaults.int8_chunk &&
                          codec.powersgd_min_elements == defaults.powersgd_min_elements,
                      "plan: comm.int8_chunk and powersgd_min_elements are fixed at ",
                      defaults.int8_chunk, " and ", defaults.powersgd_min_elements,
                      " in chorus train");
  take(comm, "algorithm", comm.algorithm, std::string(toString(planned.algorithm)));
  take(comm, "compression", comm.compression, std::string(toString(codec.kind)));
  take(comm, "powersgd_rank", comm.powersgd_rank, codec.powersgd_rank);
  take(comm, "powersgd_iterations", comm.powersgd_iterations, codec.powersgd_iterations);
  take(comm, "powersgd_bf16_factors", comm.powersgd_bf16_factors, codec.powersgd_bf16_factors);
  take(comm, "powersgd_min_compression_rate", comm.powersgd_min_compression_rate,
       codec.powersgd_min_compression_rate);
  take(comm, "powersgd_start_step", comm.powersgd_start_step, codec.powersgd_start_step);
  take(comm, "topk_ratio", comm.topk_ratio, codec.topk_ratio);
  take(comm, "error_feedback", comm.error_feedback, codec.error_feedback);
  take(comm, "bucket_mb", comm.bucket_mb, planned.bucket_mb);
  take(comm, "first_bucket_mb", comm.first_bucket_mb, planned.first_bucket_mb);
  take(comm, "min_buckets", comm.min_buckets, planned.min_buckets);
  take(comm, "overlap", comm.overlap, planned.overlap);
  take(comm, "sync_every", comm.sync_every, planned.sync_period);
  checkComm(comm);
  return comm;
}

}  // namespace chorus::runtime
