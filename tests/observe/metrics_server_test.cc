// MetricsServer and NodeMonitor: one port serves /metrics, the live page and its JSON; a busy or
// privileged port is a ConfigError before anything runs; workers' reports reach the exposition
// through the node-local channel.
#include "chorus/observe/metrics_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/observe/metrics_channel.h"
#include "chorus/observe/node_monitor.h"
#include "http_get.h"

namespace chorus::observe {
namespace {

using chorus::testing::httpGet;

MetricsServerOptions fixedBodies() {
  MetricsServerOptions options;
  options.address = "127.0.0.1";
  options.metrics = [] { return std::string("chorus_test_metric 1\n"); };
  options.state = [] { return std::string("{\"ranks\":[]}"); };
  return options;
}

TEST(MetricsServer, PortZeroPicksAFreePortThatServesEveryPath) {
  MetricsServer server(fixedBodies());
  ASSERT_GT(server.port(), 0);
  const auto metrics = httpGet(server.port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.body, "chorus_test_metric 1\n");
  EXPECT_EQ(httpGet(server.port(), "/api/state").body, "{\"ranks\":[]}");
  const auto page = httpGet(server.port(), "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<svg id=\"chart-share\""), std::string::npos);
  // Self-contained: nothing fetched from elsewhere.
  EXPECT_EQ(page.body.find("http://"), page.body.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(page.body.find("https://"), std::string::npos);
  EXPECT_EQ(httpGet(server.port(), "/nothing").status, 404);
}

TEST(MetricsServer, ABusyPortIsAConfigErrorThatSaysSo) {
  MetricsServer first(fixedBodies());
  MetricsServerOptions second = fixedBodies();
  second.port = first.port();
  try {
    MetricsServer again(second);
    FAIL() << "a second server listened on a busy port";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("is the port busy?"), std::string::npos)
        << error.what();
  }
}

TEST(MetricsServer, PortsBelow1024NeedRootAndPortsAreBounded) {
  EXPECT_THROW(checkMetricsPort(80, 1000), ConfigError);
  EXPECT_NO_THROW(checkMetricsPort(80, 0));
  EXPECT_NO_THROW(checkMetricsPort(0, 1000));
  EXPECT_NO_THROW(checkMetricsPort(9400, 1000));
  EXPECT_THROW(checkMetricsPort(-2, 0), ConfigError);
  EXPECT_THROW(checkMetricsPort(70000, 0), ConfigError);
}

TEST(NodeMonitor, ReportsSentOnTheChannelReachTheExpositionAndTheState) {
  NodeMonitorOptions options;
  options.address = "127.0.0.1";
  options.node = 1;
  NodeMonitor monitor(options);
  MetricsSender sender(monitor.socketPath());
  RankReport report;
  report.rank = 2;
  report.member = 2;
  report.node = 1;
  report.device = "cpu@0.25";
  report.step = 1;
  report.global_batch = 32;
  report.share = 32;
  report.step_seconds = 0.2;
  report.link = "gloo";
  report.ops["all_reduce"] = {4, 4096, 0.01};
  report.unix_time = unixNow();
  ASSERT_TRUE(sender.send(toJson(report)));
  ASSERT_TRUE(sender.send("garbage"));
  // The monitor's thread takes them within its 100 ms poll; wait for it without a timed bound.
  for (int i = 0; i < 200 && monitor.metrics().reports() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto metrics = httpGet(monitor.port(), "/metrics");
  EXPECT_NE(metrics.body.find("chorus_collective_bytes_total{device=\"cpu@0.25\",link=\"gloo\","
                              "node=\"1\",op=\"all_reduce\",rank=\"2\"} 4096"),
            std::string::npos)
      << metrics.body;
  const auto state = nlohmann::json::parse(httpGet(monitor.port(), "/api/state").body);
  EXPECT_EQ(state["plan"]["shares"]["2"], 32);
  for (int i = 0; i < 200 && monitor.malformedReports() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(monitor.malformedReports(), 1);
}

TEST(MetricsSender, DropsInsteadOfBlockingWhenNoAgentListens) {
  std::string path;
  {
    MetricsReceiver receiver;
    path = receiver.path();
  }
  MetricsSender sender(path);
  EXPECT_FALSE(sender.send("{}"));
  EXPECT_EQ(sender.dropped(), 1);
}

}  // namespace
}  // namespace chorus::observe
