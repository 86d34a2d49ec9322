// Fuzz target: the job reader of `chorus train` (runtime::readJobConfig): TOML, `--set`
// overrides, and the validation of every key and of the keys against each other.
// Input: a job file, optionally followed by kSeparator and `--set` assignments, one a line.
// Besides "never crash", it checks a property: a job that reads is kept in checkpoints as its
// canonical TOML (job.toml), and that text must read again as a valid job.
#include <cstdlib>
#include <sstream>

#include "chorus/runtime/job/job_config.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  fuzz::guarded([&] {
    Config config = Config::parseString(fuzz::part(text, 0), "fuzz-job.toml");
    std::istringstream sets(fuzz::part(text, 1));
    for (std::string line; std::getline(sets, line);) config.set(line);
    const runtime::JobConfig job = runtime::readJobConfig(config);
    try {
      runtime::readJobConfig(Config::parseString(job.toml, "canonical"));
    } catch (const Error& error) {
      std::fprintf(stderr, "a valid job's canonical TOML does not read: %s\n---\n%s\n---\n",
                   error.what(), job.toml.c_str());
      std::abort();
    }
  });
  return 0;
}
