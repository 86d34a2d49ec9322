// Fuzz target: plan JSON (`chorus simulate --plan P.json`, plan/plan_json.h), checked against a
// cluster file as the CLI does. Input: the plan JSON, optionally followed by kSeparator and a
// cluster file. Besides "never crash", it checks that a plan that parses is written (toJson) as
// JSON that parses again.
#include <cstdlib>

#include "chorus/plan/cluster_file.h"
#include "chorus/plan/plan_json.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  fuzz::guarded([&] {
    const plan::Plan plan = plan::parsePlanJson(fuzz::part(text, 0), "fuzz-plan.json");
    const std::string written = plan::toJson(plan).dump();
    try {
      plan::parsePlanJson(written, "written");
    } catch (const Error& error) {
      std::fprintf(stderr, "toJson wrote a plan that does not parse: %s\n%s\n", error.what(),
                   written.c_str());
      std::abort();
    }
    fuzz::guarded([&] { plan.validate(64); });
    const std::string cluster_text = fuzz::part(text, 1);
    if (!cluster_text.empty()) {
      const plan::Cluster cluster = plan::parseClusterToml(cluster_text, "fuzz-cluster.toml");
      plan::checkPlanAgainstCluster(plan, cluster);
    }
  });
  return 0;
}
