// The run report: a log is read step by step (bad lines named), the ideal throughput is the sum
// of share / compute, and the HTML is self-contained with one line per rank in the per-rank plots;
// an elastic recovery is a marker on every plot and a line of the summary.
#include "chorus/observe/run_report.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "chorus/core/error.h"
#include "chorus/observe/svg_plot.h"

namespace chorus::observe {
namespace {

std::string writeLog(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

constexpr const char* kLog =
    R"({"step":1,"loss":2.3,"samples_per_s":100,"step_s":0.48,"lr":0.01,"shares":[16,16,16],"compute_s":[0.1,0.2,0.4],"wait_s":[0.3,0.2,0.0]}
{"step":2,"loss":2.1,"samples_per_s":150,"step_s":0.32,"lr":0.02,"shares":[28,14,6],"compute_s":[0.2,0.2,0.2],"wait_s":[0.0,0.0,0.0],"rebalance":"shares 28,14,6"}
{"step":3,"loss":1.9,"samples_per_s":160,"step_s":0.3,"lr":0.02,"shares":[28,14,6],"compute_s":[0.2,0.2,0.2],"wait_s":[0.0,0.0,0.0],"test_accuracy":0.5,"test_loss":1.8}
)";

TEST(RunReport, ReadsEveryStepOfALog) {
  const auto steps = readRunLog(writeLog("good.jsonl", kLog)).steps;
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[1].rebalance, "shares 28,14,6");
  EXPECT_DOUBLE_EQ(*steps[2].test_accuracy, 0.5);
  EXPECT_EQ(steps[0].shares.size(), 3u);
}

TEST(RunReport, NamesTheBadLineAndRefusesAnEmptyOrMissingLog) {
  try {
    readRunLog(writeLog("bad.jsonl", std::string(kLog) + "{\"step\": 4}\n"));
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("line 4"), std::string::npos) << error.what();
  }
  EXPECT_THROW(readRunLog(writeLog("empty.jsonl", "\n")), ConfigError);
  EXPECT_THROW(readRunLog("/nonexistent/run.jsonl"), ConfigError);
}

TEST(RunReport, IdealThroughputIsTheSumOfSharesOverComputeTimes) {
  const auto steps = readRunLog(writeLog("ideal.jsonl", kLog)).steps;
  EXPECT_DOUBLE_EQ(idealSamplesPerSecond(steps[0]), 16 / 0.1 + 16 / 0.2 + 16 / 0.4);
  EXPECT_DOUBLE_EQ(idealSamplesPerSecond(steps[1]), 48 / 0.2);
}

TEST(RunReport, HtmlIsSelfContainedWithALinePerRank) {
  const std::string html = renderRunReport(readRunLog(writeLog("html.jsonl", kLog)), "run.jsonl");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  const std::regex rank_line("data-series=\"rank (\\d)\" data-points=\"3\"");
  EXPECT_EQ(std::distance(std::sregex_iterator(html.begin(), html.end(), rank_line),
                          std::sregex_iterator()),
            9);  // shares, compute and wait for 3 ranks
  EXPECT_NE(html.find("data-series=\"test accuracy\" data-points=\"1\""), std::string::npos);
  EXPECT_NE(html.find("<td id=\"summary-ranks\">3</td>"), std::string::npos);
}

// Launch rank 1 of 3 is lost in step 3; ranks 0 and 2 redo it as ranks 0 and 1.
constexpr const char* kElasticLog =
    R"({"step":1,"loss":2.3,"samples_per_s":100,"step_s":0.5,"shares":[16,16,16],"compute_s":[0.1,0.2,0.4],"wait_s":[0.3,0.2,0.0]}
{"step":2,"loss":2.1,"samples_per_s":150,"step_s":0.3,"shares":[28,14,6],"compute_s":[0.2,0.2,0.2],"wait_s":[0,0,0],"test_accuracy":0.4}
{"event":"recovery","generation":1,"members":[0,2],"lost":[1],"reason":"rank 1 exited","redo_step":3,"source":0,"shares":[38,10],"agree_s":0.52,"rebuild_s":0.31}
{"event":"checkpoint","step":3}
{"step":3,"loss":1.9,"samples_per_s":120,"step_s":0.4,"shares":[38,10],"compute_s":[0.3,0.3],"wait_s":[0,0],"generation":1}
{"step":4,"loss":1.8,"samples_per_s":120,"step_s":0.4,"shares":[38,10],"compute_s":[0.3,0.3],"wait_s":[0,0],"generation":1}
)";

TEST(RunReport, ReadsRecoveriesAndSkipsOtherEvents) {
  const RunLog log = readRunLog(writeLog("elastic.jsonl", kElasticLog));
  ASSERT_EQ(log.steps.size(), 4u);
  EXPECT_EQ(log.steps[2].step, 3);
  ASSERT_EQ(log.recoveries.size(), 1u);
  const LoggedRecovery& recovery = log.recoveries[0];
  EXPECT_EQ(recovery.generation, 1);
  EXPECT_EQ(recovery.redo_step, 3);
  EXPECT_EQ(recovery.members, (std::vector<int>{0, 2}));
  EXPECT_EQ(recovery.lost, std::vector<int>{1});
  EXPECT_EQ(recovery.reason, "rank 1 exited");
  EXPECT_DOUBLE_EQ(recovery.agree_seconds, 0.52);
  EXPECT_DOUBLE_EQ(recovery.rebuild_seconds, 0.31);
}

TEST(RunReport, DrawsARecoveryOnEveryPlotAndListsItInTheSummary) {
  const std::string html =
      renderRunReport(readRunLog(writeLog("elastic_html.jsonl", kElasticLog)), "run.jsonl");
  const std::regex marker("<line class=\"marker\" data-marker=\"recovery: lost rank 1\"");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(html.begin(), html.end(), marker), std::sregex_iterator()),
      6);  // six plots
  // The loss plot: steps 1 to 4 on 552 pixels from x = 76, the redo step 3 at x = 444.
  EXPECT_NE(html.find("data-marker=\"recovery: lost rank 1\" x1=\"444\" x2=\"444\""),
            std::string::npos);
  EXPECT_NE(html.find(">recovery: lost rank 1</text>"), std::string::npos);  // the legend
  EXPECT_NE(html.find("<td id=\"summary-recoveries\">step 3: lost rank 1 (rank 1 exited), "
                      "generation 1, agree 0.520 s, rebuild 0.310 s</td>"),
            std::string::npos);
  // Launch rank 2 stays on its line after it became rank 1; rank 1's line ends at step 2.
  EXPECT_NE(html.find("data-series=\"rank 2\" data-points=\"4\""), std::string::npos);
  EXPECT_NE(html.find("data-series=\"rank 1\" data-points=\"2\""), std::string::npos);
  EXPECT_NE(html.find("<td id=\"summary-ranks\">3</td>"), std::string::npos);
}

TEST(SvgPlot, SaysNoDataAndEscapesNames) {
  EXPECT_NE(svgLinePlot({}, {}).find("no data"), std::string::npos);
  PlotOptions options;
  options.title = "a < b";
  const std::string svg = svgLinePlot({{"x&y", {1, 2}, {3, 4}}}, options);
  EXPECT_NE(svg.find("a &lt; b"), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"x&amp;y\" data-points=\"2\""), std::string::npos);
}

TEST(SvgPlot, StretchesTheAxisToTakeInAMarkerAndDrawsNoneWithoutData) {
  PlotOptions options;
  options.markers = {{5, "event"}};
  const std::string svg = svgLinePlot({{"line", {1, 3}, {1, 2}}}, options);
  // x from 1 to 5 on 552 pixels from x = 76: the marker at the right edge, the last point at 352.
  EXPECT_NE(svg.find("data-marker=\"event\" x1=\"628\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("points=\"76.0,"), std::string::npos) << svg;
  EXPECT_NE(svg.find(" 352.0,"), std::string::npos) << svg;
  EXPECT_EQ(svgLinePlot({}, options).find("marker"), std::string::npos);
}

}  // namespace
}  // namespace chorus::observe
