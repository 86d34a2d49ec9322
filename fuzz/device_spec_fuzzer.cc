// Fuzz target: device specs ("cpu@0.5/512MiB,cuda:1/20GiB,auto"), as given to --devices.
// Besides "never crash", it checks that a list that parses prints (toString) to text that parses
// to the same list.
#include <cstdlib>

#include "chorus/core/device_spec.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  fuzz::guarded([&] {
    const std::vector<DeviceSpec> specs = parseDeviceSpecs(text);
    const std::string printed = toString(specs);
    std::vector<DeviceSpec> again;
    try {
      again = parseDeviceSpecs(printed);
    } catch (const Error& error) {
      std::fprintf(stderr, "'%s' printed as '%s', which does not parse: %s\n", text.c_str(),
                   printed.c_str(), error.what());
      std::abort();
    }
    if (toString(again) != printed) {
      std::fprintf(stderr, "'%s' -> '%s' -> '%s'\n", text.c_str(), printed.c_str(),
                   toString(again).c_str());
      std::abort();
    }
  });
  return 0;
}
