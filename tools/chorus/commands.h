// The `chorus` command line: each subcommand lives in its own file and registers itself here.
//
// A subcommand's add function creates its CLI11 subcommand, binds its options, and on selection
// stores in `action` the function main() calls after parsing. Actions return the process exit code
// (docs/cli.md); chorus::Error exceptions escape to main(), which prints one line and maps the type
// to an exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "chorus/core/error.h"

namespace chorus::cli {

using Action = std::function<int()>;

// Exit codes, documented in docs/cli.md.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitWorkerFailed = 3;
constexpr int kExitComm = 4;
constexpr int kExitDevice = 5;
constexpr int kExitCheckpoint = 6;
constexpr int kExitInterrupted = 130;

int exitCodeFor(const Error& error);

// The path of this chorus executable (/proc/self/exe): what workers and remote nodes run.
std::string selfExecutable();

// A number of seconds in [low, high]. CLI11's Range lets nan through (every comparison with it is
// false), and `--timeout nan` then became an undefined cast to milliseconds.
CLI::Validator secondsIn(double low, double high);

// Deadlines of workers' communication (--timeout): 1 ms to a week. Workers get the deadline in
// milliseconds as an int, which a week fits with room to spare.
constexpr double kMinTimeoutSeconds = 0.001;
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

void addDevicesCommand(CLI::App& app, Action& action);
void addRunCommand(CLI::App& app, Action& action);
void addTrainCommand(CLI::App& app, Action& action);
void addPlanCommand(CLI::App& app, Action& action);
void addSimulateCommand(CLI::App& app, Action& action);
void addBenchCommand(CLI::App& app, Action& action);
void addReportCommand(CLI::App& app, Action& action);
void addCheckpointCommand(CLI::App& app, Action& action);

}  // namespace chorus::cli
