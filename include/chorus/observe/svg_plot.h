// Line plots as inline SVG, for self-contained HTML reports (`chorus report`): no script, no
// external resources. Each line is a <polyline> with data-series and data-points attributes, so
// that a test can check in a browser's DOM what was drawn.
#pragma once

#include <string>
#include <vector>

namespace chorus::observe {

// One line. Value type. xs and ys have the same length; non-finite points are skipped.
struct PlotSeries {
  std::string name;
  std::vector<double> xs;
  std::vector<double> ys;
  bool dashed = false;  // e.g. an ideal next to the measured line
};

struct PlotOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  // Default: 640 x 260 pixels.
  int width = 640;
  int height = 260;
  // Start the y axis at 0 (throughputs, shares). Default: true.
  bool y_from_zero = true;
};

// An <svg> element with axes, the lines and a legend; "no data" when every series is empty.
std::string svgLinePlot(const std::vector<PlotSeries>& series, const PlotOptions& options);

// `text` with &, <, >, " escaped for HTML and SVG.
std::string escapeXml(const std::string& text);

}  // namespace chorus::observe
