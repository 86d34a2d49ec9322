#include "chorus/observe/metrics_server.h"

#include <civetweb.h>

#include <cstring>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::observe {

struct MetricsServer::Context {
  MetricsServerOptions options;
  mg_context* server = nullptr;
};

namespace {

constexpr const char* kPrometheusText = "text/plain; version=0.0.4; charset=utf-8";

int sendBody(mg_connection* connection, const char* type, const std::string& body) {
  mg_send_http_ok(connection, type, static_cast<long long>(body.size()));
  mg_write(connection, body.data(), body.size());
  return 200;
}

// One handler for every path: civetweb hands it the context as callback data.
int handle(mg_connection* connection, void* data) {
  const auto& context = *static_cast<const MetricsServer::Context*>(data);
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string path = request->local_uri ? request->local_uri : "/";
  try {
    if (path == "/metrics") return sendBody(connection, kPrometheusText, context.options.metrics());
    if (path == "/api/state")
      return sendBody(connection, "application/json", context.options.state());
    if (path == "/" || path == "/index.html")
      return sendBody(connection, "text/html; charset=utf-8", livePageHtml());
    mg_send_http_error(connection, 404, "not found: %s", path.c_str());
    return 404;
  } catch (const std::exception& error) {
    mg_send_http_error(connection, 500, "%s", error.what());
    return 500;
  }
}

}  // namespace

void checkMetricsPort(int port, unsigned effective_uid) {
  CHORUS_CHECK_CONFIG(port >= 0 && port <= 65535, "--metrics-port ", port,
                      ": a TCP port is 0 (pick a free one) to 65535");
  CHORUS_CHECK_CONFIG(port == 0 || port >= 1024 || effective_uid == 0, "--metrics-port ", port,
                      ": ports below 1024 are privileged and this process is not root (uid ",
                      effective_uid, "); pick a port from 1024, or 0 for a free one");
}

MetricsServer::MetricsServer(MetricsServerOptions options) : context_(std::make_unique<Context>()) {
  CHORUS_CHECK_CONFIG(options.metrics && options.state,
                      "MetricsServer: the metrics and state callbacks are required");
  context_->options = std::move(options);
  const MetricsServerOptions& settings = context_->options;
  const std::string listening = settings.address + ":" + std::to_string(settings.port);
  const char* configuration[] = {"listening_ports",    listening.c_str(), "num_threads", "2",
                                 "request_timeout_ms", "10000",           nullptr};
  mg_callbacks callbacks{};
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = context_.get();
  init.configuration_options = configuration;
  char text[256] = {0};
  unsigned code = 0;
  mg_error_data error{};
  error.code = &code;
  error.text = text;
  error.text_buffer_size = sizeof text;
  context_->server = mg_start2(&init, &error);
  if (!context_->server)
    CHORUS_THROW(ConfigError, "--metrics-port ", settings.port, ": cannot listen on ", listening,
                 " (", text[0] ? text : "unknown error", "); is the port busy?");
  mg_set_request_handler(context_->server, "/", handle, context_.get());
  mg_server_port ports[4];
  const int count = mg_get_server_ports(context_->server, 4, ports);
  port_ = count > 0 ? ports[0].port : settings.port;
}

MetricsServer::~MetricsServer() {
  if (context_->server) mg_stop(context_->server);
}

}  // namespace chorus::observe
