// `chorus report LOG.jsonl [--out report.html]`: the run report of a --log-json log
// (observe/run_report.h), one self-contained HTML file.
#include <fstream>
#include <iostream>
#include <memory>

#include "chorus/observe/run_report.h"
#include "commands.h"

namespace chorus::cli {

void addReportCommand(CLI::App& app, Action& action) {
  auto* report = app.add_subcommand(
      "report", "Write a self-contained HTML report (SVG plots) of a chorus train --log-json log");
  report->footer("Example: chorus report run.jsonl --out report.html");
  struct Args {
    std::string log;
    std::string out = "report.html";
  };
  auto args = std::make_shared<Args>();
  report->add_option("log", args->log, "The per-step JSON log (chorus train --log-json)")
      ->required();
  report->add_option("--out", args->out, "Where to write the HTML (default report.html)");
  report->callback([&action, args] {
    action = [args] {
      const observe::RunLog log = observe::readRunLog(args->log);
      const std::string html = observe::renderRunReport(log, args->log);
      std::ofstream out(args->out, std::ios::trunc);
      if (!out || !(out << html) || !out.flush())
        CHORUS_THROW(ConfigError, "chorus report: cannot write ", args->out);
      std::cout << "chorus report: " << log.steps.size() << " steps of " << args->log << " -> "
                << args->out << std::endl;
      return kExitOk;
    };
  });
}

}  // namespace chorus::cli
