// Entry point of the `chorus` CLI: parses the command line, runs the chosen subcommand, and turns
// any chorus::Error into one clear line on stderr and a documented exit code.
#include <unistd.h>

#include <c10/util/Exception.h>

#include <iostream>

#include "chorus/chorus.h"
#include "commands.h"

namespace chorus::cli {

int exitCodeFor(const Error& error) {
  if (dynamic_cast<const ConfigError*>(&error)) return kExitUsage;
  if (dynamic_cast<const CommError*>(&error)) return kExitComm;
  if (dynamic_cast<const DeviceError*>(&error)) return kExitDevice;
  if (dynamic_cast<const CheckpointError*>(&error)) return kExitCheckpoint;
  if (dynamic_cast<const LaunchError*>(&error)) return kExitWorkerFailed;
  return kExitFailure;
}

std::string selfExecutable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) CHORUS_THROW(LaunchError, "cannot find the chorus executable (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(length));
}

CLI::Validator secondsIn(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        std::size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !(value >= low && value <= high))
          return detail::concat("'", text, "' is not a number of seconds in [", low, ", ", high,
                                "]");
        return "";
      },
      detail::concat("SECONDS in [", low, ", ", high, "]"));
}

namespace {

// CLI11 reports a mistyped subcommand as "A subcommand is required"; name it instead.
void rejectUnknownSubcommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--log-level") {
      ++i;
      continue;
    }
    if (word.rfind("-", 0) == 0) continue;
    for (const CLI::App* sub : app.get_subcommands({}))
      if (sub->get_name() == word) return;
    CHORUS_THROW(ConfigError, "unknown subcommand '", word,
                 "'; expected devices, run, train, plan, simulate, bench, report or "
                 "checkpoint (see chorus --help)");
  }
}

int runCli(int argc, char** argv) {
  CLI::App app{"chorus: train one model across unlike devices (GPUs of any kind, and CPUs)",
               "chorus"};
  app.set_version_flag("--version", std::string("chorus ") + versionString());
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();
  Action action;
  addDevicesCommand(app, action);
  addRunCommand(app, action);
  addTrainCommand(app, action);
  addPlanCommand(app, action);
  addSimulateCommand(app, action);
  addBenchCommand(app, action);
  addReportCommand(app, action);
  addCheckpointCommand(app, action);
  rejectUnknownSubcommand(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }
  Logger::instance().setLevel(parseLogLevel(log_level));
  return action ? action() : kExitUsage;
}

}  // namespace
}  // namespace chorus::cli

int main(int argc, char** argv) {
  try {
    return chorus::cli::runCli(argc, argv);
  } catch (const chorus::Error& error) {
    std::cerr << "chorus: " << error.kind() << ": " << error.message() << std::endl;
    return chorus::cli::exitCodeFor(error);
  } catch (const c10::OutOfMemoryError& error) {
    // A device (or an emulated budget) ran out of memory inside libtorch: the same exit and form
    // as chorus's own OutOfMemoryError, without libtorch's backtrace.
    std::cerr << "chorus: OutOfMemoryError: " << error.what_without_backtrace() << std::endl;
    return chorus::cli::kExitDevice;
  } catch (const std::exception& error) {
    std::cerr << "chorus: unexpected error: " << error.what() << std::endl;
    return chorus::cli::kExitFailure;
  }
}
