// Fuzz target: the TOML reader (chorus::Config), with --set overrides and the canonical form.
// Input: a TOML document, optionally followed by kSeparator and `--set` assignments, one a line.
// Besides "never crash", it checks a property: the canonical text toToml() of whatever was read
// parses again.
#include <cstdlib>
#include <sstream>

#include "chorus/core/config.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  fuzz::guarded([&] {
    Config config = Config::parseString(fuzz::part(text, 0), "fuzz.toml");
    std::istringstream sets(fuzz::part(text, 1));
    for (std::string line; std::getline(sets, line);) {
      fuzz::guarded([&] { config.set(line); });
    }
    const std::string canonical = config.toToml();
    try {
      Config::parseString(canonical, "canonical");
    } catch (const ConfigError& error) {
      std::fprintf(stderr, "toToml() wrote text that does not parse: %s\n---\n%s\n---\n",
                   error.what(), canonical.c_str());
      std::abort();
    }
    // Typed reads of the keys every job has, as the job reader makes them.
    for (const char* key : {"train.global_batch", "seed", "devices", "model.name"}) {
      fuzz::guarded([&] { config.getInt(key, 0); });
      fuzz::guarded([&] { config.getDouble(key, 0.0); });
      fuzz::guarded([&] { config.getString(key, ""); });
      fuzz::guarded([&] { config.getStrings(key, {}); });
      fuzz::guarded([&] { config.getInts(key, {}); });
    }
    config.rejectUnknownKeys();
  });
  return 0;
}
