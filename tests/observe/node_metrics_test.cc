// NodeMetrics and LiveState: reports become Prometheus series with conventional names, counters
// advance by the growth of the ranks' running totals, the live state keeps bounded histories and
// raises the hold-back and lost alerts; after an elastic recovery the lost ranks leave both and
// the elastic figures appear.
#include "chorus/observe/node_metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "chorus/core/error.h"
#include "chorus/observe/live_state.h"
#include "chorus/observe/rank_report.h"

namespace chorus::observe {
namespace {

RankReport report(int rank, std::int64_t step, double compute, double wait) {
  RankReport r;
  r.rank = rank;
  r.member = rank;
  r.device = rank == 0 ? "cpu" : "cpu@0.5";
  r.emulated = rank != 0;
  r.step = step;
  r.global_batch = 64;
  r.share = rank == 0 ? 40 : 24;
  r.step_seconds = 0.1;
  r.samples_per_second = 640;
  r.compute_seconds = compute;
  r.wait_seconds = wait;
  r.pad_seconds_total = 0.01 * step;
  r.loss = 2.0 / step;
  r.lr = 0.1;
  r.memory_used = 1000 + rank;
  r.memory_reserved = 2000;
  r.memory_peak = 1500;
  r.memory_budget = rank == 1 ? 4096 : 0;
  r.link = "shm";
  r.ops["all_reduce"] = {static_cast<std::uint64_t>(3 * step),
                         static_cast<std::uint64_t>(100 * step), 0.001 * step};
  r.unix_time = 1000.0 + step;
  return r;
}

// The value of the series `name{labels...}` in an exposition, or -1.
double sample(const std::string& text, const std::string& name, const std::string& label) {
  const std::regex line("(^|\n)" + name + "\\{([^}]*)\\} ([^\n]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it)
    if ((*it)[2].str().find(label) != std::string::npos) return std::stod((*it)[3].str());
  return -1;
}

TEST(RankReport, RoundTripsThroughJsonAndRefusesGarbage) {
  RankReport original = report(1, 7, 0.05, 0.01);
  original.test_accuracy = 0.75;
  const RankReport back = rankReportFromJson(toJson(original));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.share, 24);
  EXPECT_EQ(back.device, "cpu@0.5");
  EXPECT_EQ(back.ops.at("all_reduce").bytes, 700u);
  EXPECT_DOUBLE_EQ(*back.test_accuracy, 0.75);
  EXPECT_DOUBLE_EQ(back.utilization(), 0.5);
  EXPECT_THROW(rankReportFromJson("{\"rank\": 1}"), ConfigError);
  EXPECT_THROW(rankReportFromJson("not json"), ConfigError);
}

// The report of launch rank `member`, rank `rank` of generation 1 after launch rank `lost` was
// lost at step 3 of a 3-rank job.
RankReport survivor(int member, int rank, std::int64_t step, int lost) {
  RankReport r = report(member, step, 0.05, 0.01);
  r.rank = rank;
  r.share = 32;
  r.generation = 1;
  r.recoveries_total = 1;
  r.last_agree_seconds = 0.5;
  r.last_rebuild_seconds = 0.25;
  r.lost = {lost};
  return r;
}

TEST(RankReport, RoundTripsTheElasticFieldsAndReadsReportsWithoutThem) {
  const RankReport back = rankReportFromJson(toJson(survivor(2, 1, 3, 1)));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.member, 2);
  EXPECT_EQ(back.generation, 1);
  EXPECT_EQ(back.recoveries_total, 1u);
  EXPECT_DOUBLE_EQ(back.last_agree_seconds, 0.5);
  EXPECT_DOUBLE_EQ(back.last_rebuild_seconds, 0.25);
  EXPECT_EQ(back.lost, std::vector<int>{1});
  // A report of a worker built before elastic recovery.
  nlohmann::json old = nlohmann::json::parse(toJson(report(1, 7, 0.05, 0.01)));
  for (const char* key :
       {"member", "generation", "recoveries_total", "agree_s", "rebuild_s", "lost"})
    ASSERT_EQ(old.erase(key), 1u) << key;
  const RankReport parsed = rankReportFromJson(old.dump());
  EXPECT_EQ(parsed.member, 1);  // its rank
  EXPECT_EQ(parsed.generation, 0);
  EXPECT_EQ(parsed.recoveries_total, 0u);
  EXPECT_TRUE(parsed.lost.empty());
}

TEST(NodeMetrics, ExposesConventionalNamesWithRankDeviceAndNodeLabels) {
  NodeMetrics metrics(3);
  metrics.update(report(0, 1, 0.05, 0.02));
  metrics.update(report(1, 1, 0.07, 0.0));
  const std::string text = metrics.exposition();
  EXPECT_NE(text.find("# TYPE chorus_step_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE chorus_collective_bytes_total counter"), std::string::npos);
  EXPECT_EQ(sample(text, "chorus_share_samples", "rank=\"0\""), 40);
  EXPECT_EQ(sample(text, "chorus_share_samples", "rank=\"1\""), 24);
  EXPECT_NE(text.find("device=\"cpu@0.5\""), std::string::npos);
  EXPECT_NE(text.find("node=\"3\""), std::string::npos);
  EXPECT_EQ(sample(text, "chorus_memory_budget_bytes", "rank=\"1\""), 4096);
  EXPECT_EQ(sample(text, "chorus_memory_budget_bytes", "rank=\"0\""), -1);  // no budget
  EXPECT_EQ(sample(text, "chorus_global_batch_samples", "node=\"3\""), 64);
  EXPECT_EQ(sample(text, "chorus_rank_info", "emulated=\"true\""), 1);
  EXPECT_EQ(sample(text, "chorus_collective_bytes_total", "op=\"all_reduce\""), 100);
  EXPECT_EQ(sample(text, "chorus_metrics_reports_dropped_total", "rank=\"0\""), 0);
}

TEST(NodeMetrics, CountersAdvanceByTheGrowthOfRunningTotals) {
  NodeMetrics metrics(0);
  metrics.update(report(0, 1, 0.05, 0.02));
  metrics.update(report(0, 2, 0.05, 0.02));
  metrics.update(report(0, 5, 0.05, 0.02));  // two reports were dropped on the way
  const std::string text = metrics.exposition();
  EXPECT_EQ(sample(text, "chorus_collective_bytes_total", "rank=\"0\""), 500);
  EXPECT_EQ(sample(text, "chorus_collective_operations_total", "rank=\"0\""), 15);
  EXPECT_EQ(sample(text, "chorus_steps_total", "rank=\"0\""), 5);
  EXPECT_EQ(sample(text, "chorus_step_seconds_count", "rank=\"0\""), 3);
  EXPECT_EQ(metrics.reports(), 3);
}

TEST(NodeMetrics, ElasticFiguresAreZeroBeforeAnyRecovery) {
  NodeMetrics metrics(3);
  metrics.update(report(0, 1, 0.05, 0.02));
  const std::string text = metrics.exposition();
  for (const char* line :
       {"# HELP chorus_elastic_generation Elastic generation of the job (0 before any recovery)\n"
        "# TYPE chorus_elastic_generation gauge\nchorus_elastic_generation{node=\"3\"} 0\n",
        "# TYPE chorus_elastic_recoveries_total counter\n"
        "chorus_elastic_recoveries_total{node=\"3\"} 0\n",
        "# TYPE chorus_elastic_lost_ranks gauge\nchorus_elastic_lost_ranks{node=\"3\"} 0\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nnot in\n" << text;
  EXPECT_EQ(text.find("chorus_elastic_recovery_seconds{"), std::string::npos);  // no recovery yet
}

TEST(NodeMetrics, ARecoveryShowsInTheElasticFiguresAndRemovesTheLostRank) {
  NodeMetrics metrics(0);
  for (int step = 1; step <= 2; ++step)
    for (int rank = 0; rank < 3; ++rank) metrics.update(report(rank, step, 0.05, 0.01));
  metrics.update(survivor(0, 0, 3, 1));
  metrics.update(survivor(2, 1, 3, 1));
  metrics.update(report(1, 3, 0.05, 0.01));  // the lost worker, late: ignored
  EXPECT_EQ(metrics.reports(), 8);
  const std::string text = metrics.exposition();
  for (const char* line : {"\nchorus_elastic_generation{node=\"0\"} 1\n",
                           "\nchorus_elastic_recoveries_total{node=\"0\"} 1\n",
                           "\nchorus_elastic_recovery_seconds{node=\"0\",phase=\"agree\"} 0.5\n",
                           "\nchorus_elastic_recovery_seconds{node=\"0\",phase=\"rebuild\"} 0.25\n",
                           "\nchorus_elastic_lost_ranks{node=\"0\"} 1\n",
                           "# TYPE chorus_elastic_recovery_seconds gauge\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nnot in\n" << text;
  EXPECT_EQ(text.find("rank=\"1\""), std::string::npos) << text;  // every series of rank 1
  // Launch rank 2, now rank 1, keeps its series: its label is its launch rank.
  EXPECT_EQ(sample(text, "chorus_share_samples", "rank=\"2\""), 32);
  EXPECT_EQ(sample(text, "chorus_steps_total", "rank=\"2\""), 3);
  EXPECT_EQ(sample(text, "chorus_collective_bytes_total", "rank=\"2\""), 300);
}

TEST(NodeMetrics, JobFiguresComeFromTheLowestSurvivorOnceRankZeroIsLost) {
  NodeMetrics metrics(0);
  metrics.update(report(0, 1, 0.05, 0.01));
  metrics.update(report(1, 1, 0.05, 0.01));
  RankReport next = survivor(1, 0, 2, 0);
  next.loss = 0.125;
  metrics.update(next);
  const std::string text = metrics.exposition();
  EXPECT_EQ(sample(text, "chorus_loss", "node=\"0\""), 0.125);
  EXPECT_EQ(sample(text, "chorus_elastic_recoveries_total", "node=\"0\""), 1);
  EXPECT_EQ(text.find("rank=\"0\""), std::string::npos) << text;
}

// A user's program under `chorus run` need not give chorus.step its loss: no chorus_loss then,
// rather than a loss of 0.
TEST(NodeMetrics, AnUnknownLossHasNoSeriesAndSurvivesTheJsonForm) {
  RankReport unknown = report(0, 1, 0.05, 0.01);
  unknown.loss_known = false;
  const RankReport back = rankReportFromJson(toJson(unknown));
  EXPECT_FALSE(back.loss_known);
  EXPECT_TRUE(rankReportFromJson(toJson(report(0, 1, 0.05, 0.01))).loss_known);
  NodeMetrics metrics(0);
  metrics.update(back);
  const std::string text = metrics.exposition();
  EXPECT_EQ(text.find("chorus_loss{"), std::string::npos) << text;
  EXPECT_EQ(sample(text, "chorus_learning_rate", "node=\"0\""), 0.1);
}

TEST(LiveState, KeepsABoundedHistoryPerRankAndThePlan) {
  LiveState state(0, 4);
  for (int step = 1; step <= 10; ++step) {
    state.update(report(0, step, 0.05, 0.01));
    state.update(report(1, step, 0.05, 0.01));
  }
  const auto json = nlohmann::json::parse(state.json(1011.0));
  ASSERT_EQ(json["ranks"].size(), 2u);
  EXPECT_EQ(json["ranks"][1]["series"]["step"].size(), 4u);
  EXPECT_EQ(json["ranks"][1]["series"]["step"].back(), 10);
  EXPECT_EQ(json["job"]["loss"].size(), 4u);
  EXPECT_EQ(json["plan"]["shares"]["0"], 40);
  EXPECT_EQ(json["plan"]["global_batch"], 64);
  EXPECT_TRUE(json["alerts"].empty());
}

TEST(LiveState, NamesTheRankThatHoldsBackTheStep) {
  LiveState state(0);
  state.update(report(0, 1, 0.02, 0.06));  // waited 60% of the step
  state.update(report(1, 1, 0.09, 0.0));
  const auto alerts = state.alerts(1001.0);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_NE(alerts[0].find("rank 1 (cpu@0.5) holds back the steps: over the last ones it computed "
                           "90 ms a step while the others waited 60 ms"),
            std::string::npos)
      << alerts[0];
}

TEST(LiveState, NamesARankThatStoppedReportingAsLost) {
  LiveState state(0);
  for (int step = 1; step <= 30; ++step) state.update(report(0, step, 0.05, 0.01));
  state.update(report(1, 2, 0.05, 0.01));  // last seen at t = 1002
  const auto alerts = state.alerts(1030.0);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_NE(alerts[0].find("rank 1 (cpu@0.5) lost: no report for 28 s, last at step 2"),
            std::string::npos)
      << alerts[0];
}

TEST(LiveState, SaysWhichRankWasLostInWhichGenerationAndDropsIt) {
  LiveState state(0);
  for (int step = 1; step <= 2; ++step)
    for (int rank = 0; rank < 3; ++rank) state.update(report(rank, step, 0.05, 0.01));
  state.update(survivor(0, 0, 3, 1));
  state.update(survivor(2, 1, 3, 1));
  state.update(report(1, 3, 0.05, 0.01));  // the lost worker, late: ignored
  // Long after rank 1's last report: named lost by the recovery, not as silent.
  EXPECT_EQ(state.alerts(1004.0), std::vector<std::string>{"rank 1 lost (generation 1)"});
  const auto json = nlohmann::json::parse(state.json(1004.0));
  ASSERT_EQ(json["ranks"].size(), 2u);
  EXPECT_EQ(json["ranks"][0]["rank"], 0);
  EXPECT_EQ(json["ranks"][1]["rank"], 2);
  EXPECT_EQ(json["ranks"][1]["series"]["step"].size(), 3u);
  EXPECT_EQ(json["generation"], 1);
  EXPECT_EQ(json["lost"], nlohmann::json::array({1}));
  EXPECT_EQ(json["plan"]["shares"]["2"], 32);
  EXPECT_FALSE(json["plan"]["shares"].contains("1"));
}

}  // namespace
}  // namespace chorus::observe
