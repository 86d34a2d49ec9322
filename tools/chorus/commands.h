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

void addDevicesCommand(CLI::App& app, Action& action);
void addRunCommand(CLI::App& app, Action& action);
void addTrainCommand(CLI::App& app, Action& action);
void addPlanCommand(CLI::App& app, Action& action);
void addSimulateCommand(CLI::App& app, Action& action);
void addBenchCommand(CLI::App& app, Action& action);

}  // namespace chorus::cli
