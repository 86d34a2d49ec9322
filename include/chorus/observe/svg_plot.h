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

// A vertical line across the plot at `x` (an event such as an elastic recovery), with a legend
// entry `name`. Value type.
struct PlotMarker {
  double x = 0;
  std::string name;
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
  // Drawn where there is data (the x axis stretches to take them in). Default: none.
  std::vector<PlotMarker> markers;
};

// An <svg> element with axes, the lines, the markers (dashed grey <line class="marker">
// elements with data-marker) and a legend; "no data" when every series is empty.
std::string svgLinePlot(const std::vector<PlotSeries>& series, const PlotOptions& options);

// `text` with &, <, >, " escaped for HTML and SVG.
std::string escapeXml(const std::string& text);

}  // namespace chorus::observe
