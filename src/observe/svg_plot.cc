#include "chorus/observe/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace chorus::observe {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr int kLeft = 76, kRight = 12, kTop = 28, kBottom = 44;

std::string number(double value) {
  char text[32];
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e7 || (magnitude > 0 && magnitude < 0.01))
    std::snprintf(text, sizeof text, "%.3g", value);
  else if (magnitude >= 100 || std::floor(value) == value)
    std::snprintf(text, sizeof text, "%.0f", value);
  else
    std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

}  // namespace

std::string escapeXml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svgLinePlot(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const double inf = std::numeric_limits<double>::infinity();
  double x0 = inf, x1 = -inf, y0 = options.y_from_zero ? 0.0 : inf, y1 = -inf;
  for (const PlotSeries& line : series)
    for (size_t i = 0; i < line.xs.size() && i < line.ys.size(); ++i) {
      if (!std::isfinite(line.xs[i]) || !std::isfinite(line.ys[i])) continue;
      x0 = std::min(x0, line.xs[i]);
      x1 = std::max(x1, line.xs[i]);
      y0 = std::min(y0, line.ys[i]);
      y1 = std::max(y1, line.ys[i]);
    }
  if (x0 <= x1)
    for (const PlotMarker& marker : options.markers)
      if (std::isfinite(marker.x)) {
        x0 = std::min(x0, marker.x);
        x1 = std::max(x1, marker.x);
      }
  const int w = options.width, h = options.height;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << w << "\" height=\""
      << h << "\" viewBox=\"0 0 " << w << ' ' << h << "\" data-title=\"" << escapeXml(options.title)
      << "\">\n<text x=\"" << w / 2
      << "\" y=\"16\" text-anchor=\"middle\" font-weight=\"bold\" font-size=\"13\">"
      << escapeXml(options.title) << "</text>\n";
  if (!(x0 <= x1) || !(y0 <= y1)) {
    svg << "<text x=\"" << w / 2 << "\" y=\"" << h / 2
        << "\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n</svg>\n";
    return svg.str();
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : std::fabs(y0) * 0.1);
  const double pw = w - kLeft - kRight, ph = h - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - y0) / (y1 - y0) * ph; };
  svg << "<g font-size=\"11\" fill=\"#333\">\n";
  for (int tick = 0; tick <= 4; ++tick) {
    const double y = y0 + (y1 - y0) * tick / 4;
    const double x = x0 + (x1 - x0) * tick / 4;
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << w - kRight << "\" y1=\"" << sy(y) << "\" y2=\""
        << sy(y) << "\" stroke=\"#eee\"/><text x=\"" << kLeft - 4 << "\" y=\"" << sy(y) + 4
        << "\" text-anchor=\"end\">" << number(y) << "</text>\n<text x=\"" << sx(x) << "\" y=\""
        << kTop + ph + 14 << "\" text-anchor=\"middle\">" << number(x) << "</text>\n";
  }
  svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\""
      << kTop + ph << "\" stroke=\"#888\"/><line x1=\"" << kLeft << "\" x2=\"" << w - kRight
      << "\" y1=\"" << kTop + ph << "\" y2=\"" << kTop + ph << "\" stroke=\"#888\"/>\n<text x=\""
      << kLeft + pw / 2 << "\" y=\"" << h - 18 << "\" text-anchor=\"middle\">"
      << escapeXml(options.x_label) << "</text>\n<text transform=\"translate(11," << kTop + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escapeXml(options.y_label) << "</text>\n";
  double legend_x = kLeft;
  for (size_t s = 0; s < series.size(); ++s) {
    const PlotSeries& line = series[s];
    const char* color = kColors[s % (sizeof kColors / sizeof *kColors)];
    std::ostringstream points;
    int count = 0;
    for (size_t i = 0; i < line.xs.size() && i < line.ys.size(); ++i) {
      if (!std::isfinite(line.xs[i]) || !std::isfinite(line.ys[i])) continue;
      char point[48];
      std::snprintf(point, sizeof point, "%s%.1f,%.1f", count ? " " : "", sx(line.xs[i]),
                    sy(line.ys[i]));
      points << point;
      ++count;
    }
    svg << "<polyline class=\"series\" data-series=\"" << escapeXml(line.name)
        << "\" data-points=\"" << count << "\" fill=\"none\" stroke=\"" << color
        << "\" stroke-width=\"1.5\"" << (line.dashed ? " stroke-dasharray=\"5,3\"" : "")
        << " points=\"" << points.str() << "\"/>\n";
    svg << "<rect x=\"" << legend_x << "\" y=\"" << h - 10 << "\" width=\"10\" height=\"3\" fill=\""
        << color << "\"/><text x=\"" << legend_x + 14 << "\" y=\"" << h - 6 << "\">"
        << escapeXml(line.name) << "</text>\n";
    legend_x += 24 + 7.0 * static_cast<double>(line.name.size());
  }
  for (const PlotMarker& marker : options.markers) {
    if (!std::isfinite(marker.x)) continue;
    svg << "<line class=\"marker\" data-marker=\"" << escapeXml(marker.name) << "\" x1=\""
        << sx(marker.x) << "\" x2=\"" << sx(marker.x) << "\" y1=\"" << kTop << "\" y2=\""
        << kTop + ph << "\" stroke=\"#666\" stroke-dasharray=\"2,2\"/>\n<line x1=\"" << legend_x
        << "\" x2=\"" << legend_x + 10 << "\" y1=\"" << h - 8 << "\" y2=\"" << h - 8
        << "\" stroke=\"#666\" stroke-dasharray=\"2,2\"/><text x=\"" << legend_x + 14 << "\" y=\""
        << h - 6 << "\">" << escapeXml(marker.name) << "</text>\n";
    legend_x += 24 + 7.0 * static_cast<double>(marker.name.size());
  }
  svg << "</g>\n</svg>\n";
  return svg.str();
}

}  // namespace chorus::observe
