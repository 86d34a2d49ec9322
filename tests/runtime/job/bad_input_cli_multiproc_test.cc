// Bad-input table, the command line (CLI- rows of docs/errors.md): the `chorus` binary run with
// a bad command line, checked for the one line it prints and its exit code.
#include <gtest/gtest.h>

#include <sstream>

#include "bad_input_table.h"
#include "runtime/chorus_cli.h"

namespace chorus::runtime {
namespace {

using chorus::testing::BadInputRow;

struct CliRow {
  BadInputRow row;
  std::string args;  // after `chorus`; {examples} is the repository's examples/ directory
};

// gtest prints a failing row by its id.
void PrintTo(const CliRow& param, std::ostream* out) { *out << param.row.id; }

// A job that passes every check on any host without data sets, for rows about other flags.
const std::string kSyntheticJob =
    "--set devices=cpu --set model.kind=mlp --set data.dataset=synthetic";

const std::vector<CliRow>& cliRows() {
  static const std::vector<CliRow> rows = {
      {{"CLI-01", "ConfigError", "unknown subcommand 'trian'; expected devices, run, train"},
       "trian"},
      {{"CLI-02", chorus::testing::kUsage, "The following argument was not expected: --stpes"},
       "train --stpes 5"},
      {{"CLI-03", chorus::testing::kUsage, "--steps: Value 0 not in range 1 to"},
       "train --steps 0"},
      {{"CLI-04", "ConfigError", "invalid --set 'train.steps': expected KEY=VALUE"},
       "train --set train.steps"},
      {{"CLI-05", "ConfigError",
        "unknown config key: 'train.stepz' (--set; did you mean 'train.steps'?)"},
       "train --set train.stepz=5"},
      {{"CLI-06", "ConfigError",
        "cannot read config file 'no-such-job.toml': No such file or directory"},
       "train no-such-job.toml"},
      {{"CLI-07", "ConfigError", "cannot read config file '/': it is a directory"}, "train /"},
      {{"CLI-08", "ConfigError",
        "cannot read config file '/dev/zero': larger than 64 MiB (not a config file)"},
       "train /dev/zero"},
      {{"CLI-09", "ConfigError", "--log-json: cannot write /nonexistent/dir/log.jsonl"},
       "train --log-json /nonexistent/dir/log.jsonl"},
      {{"CLI-10", "CheckpointError",
        "cannot resume from '/nonexistent': neither a checkpoint nor a checkpoint directory"},
       "train " + kSyntheticJob + " --resume /nonexistent"},
      {{"CLI-11", "ConfigError",
        "invalid device spec 'cpu@0': the speed '0' must be a number in [0.001, 1]"},
       "run --devices cpu@0 -- true"},
      {{"CLI-12", "ConfigError", "device spec 'cuda:7': this host has "},
       "run --devices cuda:7 -- true"},
      {{"CLI-13", chorus::testing::kUsage, "command is required"}, "run --devices cpu"},
      {{"CLI-14", "ConfigError", "chorus run: --node-rank 3 is outside [0, 2)"},
       "run --nnodes 2 --node-rank 3 -- true"},
      {{"CLI-15", "ConfigError", "a job of several nodes needs --rdzv-endpoint HOST:PORT"},
       "run --nnodes 2 -- true"},
      {{"CLI-16", "ConfigError", "invalid endpoint 'nohost': expected HOST:PORT"},
       "run --rdzv-endpoint nohost -- true"},
      {{"CLI-17", chorus::testing::kUsage,
        "--timeout: 'nan' is not a number of seconds in [0.001, 604800]"},
       "run --timeout nan -- true"},
      {{"CLI-18", chorus::testing::kUsage, "--grace: '-1' is not a number of seconds in [0, 3600]"},
       "run --grace -1 -- true"},
      {{"CLI-19", "LaunchError",
        "cannot start rank 0: cannot execute '/nonexistent/program': No such file or directory"},
       "run --devices cpu -- /nonexistent/program"},
      {{"CLI-20", "ConfigError",
        "invalid log level 'loud': expected debug, info, warn, error or off"},
       "--log-level loud devices"},
      {{"CLI-21", chorus::testing::kUsage, "--devices requires --cluster-toml"},
       "devices --devices cpu@0.5"},
      {{"CLI-22", "ConfigError", "cannot read cluster file '/': it is a directory"},
       "plan --cluster / --model gpt3-1.3b --global-batch 8"},
      {{"CLI-23", "ConfigError", "unknown model 'gpt-5'; known: gpt3-1.3b"},
       "plan --cluster {examples}/clusters/a100-t4.toml --model gpt-5 --global-batch 8"},
      {{"CLI-24", chorus::testing::kUsage, "--global-batch: Value 0 not in range 1 to 1073741824"},
       "plan --cluster {examples}/clusters/a100-t4.toml --model gpt3-1.3b --global-batch 0"},
      {{"CLI-25", "ConfigError", "calibration 'A100': expected TYPE[:DTYPE]=EFFICIENCY"},
       "plan --cluster {examples}/clusters/a100-t4.toml --model gpt3-1.3b --global-batch 8 "
       "--calibration A100"},
      {{"CLI-26", "ConfigError",
        "cannot read plan file 'no-such-plan.json': No such file or directory"},
       "simulate --cluster {examples}/clusters/a100-t4.toml --plan no-such-plan.json"},
      {{"CLI-27", chorus::testing::kUsage,
        "--timeout: '0' is not a number of seconds in [0.001, 604800]"},
       "bench comm --timeout 0"},
      {{"CLI-28", "ConfigError",
        "--metrics-port 70000: a TCP port is 0 (pick a free one) to 65535"},
       "train " + kSyntheticJob + " --metrics-port 70000"},
      {{"CLI-29", "ConfigError", "--trace: cannot write '/nonexistent/dir/trace.json'"},
       "train " + kSyntheticJob + " --trace /nonexistent/dir/trace.json"},
      {{"CLI-30", "ConfigError", "chorus report: cannot read /nonexistent/run.jsonl"},
       "report /nonexistent/run.jsonl"},
      {{"CLI-31", "ConfigError", "-H: devices 'auto': list one device per slot of the host list"},
       "run -H a:2,b:1 --devices auto -- true"},
      {{"CLI-32", "ConfigError", "-H: 'a:0': the slots after ':' must be a positive integer"},
       "run -H a:0 --devices cpu -- true"},
      {{"CLI-33", "ConfigError", "-H numbers the nodes itself (one per host)"},
       "train " + kSyntheticJob + " -H a,b --nnodes 2"},
      {{"CLI-34", "ConfigError", "--secret-stdin and --secret-file both name the job secret"},
       "run --devices cpu --secret-stdin --secret-file /nonexistent -- true"},
      {{"CLI-35", "ConfigError", "--join needs --rdzv-endpoint HOST:PORT"},
       "run --join --devices cpu --secret-file /nonexistent -- true"},
      {{"CLI-36", "ConfigError", "--join needs the job's secret"},
       "run --join --devices cpu --rdzv-endpoint 127.0.0.1:1 -- true"},
      {{"CLI-37", "ConfigError",
        "--set train.steps=5: only devices and elastic.max_restarts are this node's"},
       "train --join --rdzv-endpoint 127.0.0.1:1 --secret-file /nonexistent --set train.steps=5"},
      {{"CLI-38", "ConfigError", "-H starts a whole job and --join adds a node to a running one"},
       "run -H a,b --join --devices cpu,cpu -- true"},
  };
  return rows;
}

// Built with a stream: GCC 12 warns falsely on `std::string + ...` chains here (array-bounds).
std::string commandLine(const std::string& args) {
  const std::string placeholder = "{examples}";
  std::ostringstream line;
  line << CHORUS_BINARY << ' ';
  size_t from = 0;
  for (size_t at; (at = args.find(placeholder, from)) != std::string::npos;) {
    line << args.substr(from, at - from) << CHORUS_SOURCE_DIR "/examples";
    from = at + placeholder.size();
  }
  line << args.substr(from);
  return line.str();
}

class CliBadInput : public ::testing::TestWithParam<CliRow> {};

// The user sees one line naming the error type (none for the parser's own errors) and the
// documented exit code; nothing is left running.
TEST_P(CliBadInput, PrintsOneClearLineAndExitsWithItsCode) {
  const CliRow& param = GetParam();
  const chorus::testing::CommandResult result =
      chorus::testing::runCommand(commandLine(param.args));
  EXPECT_EQ(result.exit_code, chorus::testing::exitCodeOf(param.row)) << result.output;
  if (param.row.type == chorus::testing::kUsage) {
    EXPECT_NE(result.output.find(param.row.excerpt), std::string::npos) << result.output;
  } else {
    const std::string prefix = "chorus: " + param.row.type + ": ";
    const size_t line = result.output.find(prefix);
    ASSERT_NE(line, std::string::npos) << result.output;
    EXPECT_NE(result.output.find(param.row.excerpt, line), std::string::npos) << result.output;
  }
  EXPECT_EQ(result.output.find("unexpected error"), std::string::npos) << result.output;
  EXPECT_LT(result.seconds, 60) << "took " << result.seconds << " s";
}

INSTANTIATE_TEST_SUITE_P(Rows, CliBadInput, ::testing::ValuesIn(cliRows()),
                         chorus::testing::rowName<CliRow>);

TEST(CliBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("CLI-", chorus::testing::rowsOf(cliRows()));
}

}  // namespace
}  // namespace chorus::runtime
