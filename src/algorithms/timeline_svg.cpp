#include "algorithms/timeline_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace topoccl::algo {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", value);
  return buf;
}

std::string px(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", value);
  return buf;
}

// Distinct hues around the colour wheel, alternating lightness so neighbours differ.
std::string rankColour(int rank, int nranks) {
  const int n = std::max(nranks, 1);
  const int hue = (rank * 360 / n + (rank % 2) * 180 / n) % 360;
  return "hsl(" + std::to_string(hue) + ",70%," + (rank % 2 ? "45%" : "60%") + ")";
}

// A tick step of 1, 2 or 5 times a power of ten giving about `target` ticks.
double tickStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

}  // namespace

std::string timelineSvg(const SimResult& result, const CostModel& model) {
  constexpr double kLabelWidth = 300, kPlotWidth = 900, kRowHeight = 18, kTop = 40, kRight = 20;
  const size_t rows = model.resources().size();
  int nranks = model.nranks();
  for (const SimEvent& e : result.events) nranks = std::max(nranks, std::max(e.srcRank, e.dstRank) + 1);
  double span = result.finishUs;
  for (const SimEvent& e : result.events) span = std::max(span, e.endUs);
  if (span <= 0) span = 1;
  const double scale = kPlotWidth / span;
  const double plotBottom = kTop + static_cast<double>(rows) * kRowHeight;
  const double legendTop = plotBottom + 40;
  const int legendPerRow = 8;
  const double height = legendTop + std::ceil(static_cast<double>(nranks) / legendPerRow) * 20 + 20;
  const double width = kLabelWidth + kPlotWidth + kRight;

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<title>simulated timeline: " + num(result.finishUs) + " us, algbw " + num(result.algbwGBs) +
         " GB/s, busbw " + num(result.busbwGBs) + " GB/s</title>\n";
  svg += "<text x=\"10\" y=\"20\" font-size=\"13\">finish " + num(result.finishUs) + " us, algbw " +
         num(result.algbwGBs) + " GB/s, busbw " + num(result.busbwGBs) + " GB/s, " +
         std::to_string(result.messages) + " messages</text>\n";

  // Rows: alternating background bands and the resource names.
  svg += "<g class=\"rows\">\n";
  for (size_t i = 0; i < rows; ++i) {
    const double y = kTop + static_cast<double>(i) * kRowHeight;
    if (i % 2 == 0) {
      svg += "<line x1=\"" + px(kLabelWidth) + "\" y1=\"" + px(y + kRowHeight / 2) + "\" x2=\"" +
             px(kLabelWidth + kPlotWidth) + "\" y2=\"" + px(y + kRowHeight / 2) +
             "\" stroke=\"#f0f0f0\" stroke-width=\"" + px(kRowHeight) + "\"/>\n";
    }
    std::string label = model.resources()[i].name;
    if (i < result.resources.size()) label += " (" + num(100 * result.resources[i].utilization) + "%)";
    svg += "<text x=\"" + px(kLabelWidth - 6) + "\" y=\"" + px(y + kRowHeight - 5) + "\" text-anchor=\"end\">" +
           escape(label) + "</text>\n";
  }
  svg += "</g>\n";

  // Time axis.
  const double step = tickStep(span, 10);
  svg += "<g class=\"axis\" stroke=\"#444\">\n";
  svg += "<line x1=\"" + px(kLabelWidth) + "\" y1=\"" + px(plotBottom) + "\" x2=\"" + px(kLabelWidth + kPlotWidth) +
         "\" y2=\"" + px(plotBottom) + "\"/>\n";
  for (int k = 0; k * step <= span * (1 + 1e-9); ++k) {
    const double x = kLabelWidth + k * step * scale;
    svg += "<line x1=\"" + px(x) + "\" y1=\"" + px(kTop) + "\" x2=\"" + px(x) + "\" y2=\"" + px(plotBottom + 5) +
           "\" stroke=\"#ddd\"/>\n";
    svg += "<text x=\"" + px(x) + "\" y=\"" + px(plotBottom + 18) + "\" text-anchor=\"middle\" stroke=\"none\">" +
           num(k * step) + "</text>\n";
  }
  svg += "<text x=\"" + px(kLabelWidth + kPlotWidth / 2) + "\" y=\"" + px(plotBottom + 32) +
         "\" text-anchor=\"middle\" stroke=\"none\">time (us)</text>\n";
  svg += "</g>\n";

  // Transfers.
  svg += "<g class=\"events\" stroke=\"#222\" stroke-width=\"0.3\">\n";
  for (const SimEvent& e : result.events) {
    if (e.resource < 0 || static_cast<size_t>(e.resource) >= rows) continue;
    const double x = kLabelWidth + e.startUs * scale;
    const double w = std::max((e.endUs - e.startUs) * scale, 0.5);
    const double y = kTop + e.resource * kRowHeight + 2;
    svg += "<rect class=\"event\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" +
           px(kRowHeight - 4) + "\" fill=\"" + rankColour(e.srcRank, nranks) + "\"><title>rank " +
           std::to_string(e.srcRank) + " -&gt; " + std::to_string(e.dstRank) + " ch " + std::to_string(e.channel) +
           " lane " + std::to_string(e.lane) + " step " + std::to_string(e.step) + " slice " +
           std::to_string(e.slice) + " " + bufferName(e.chunks.buffer) + "[" + std::to_string(e.chunks.offset) + "+" +
           std::to_string(e.chunks.count) + "] " + num(e.bytes) + " B, " + num(e.startUs) + "-" + num(e.endUs) +
           " us</title></rect>\n";
  }
  svg += "</g>\n";

  // Legend.
  svg += "<g class=\"legend\">\n";
  svg += "<text x=\"10\" y=\"" + px(legendTop + 10) + "\">source rank:</text>\n";
  for (int r = 0; r < nranks; ++r) {
    const double x = kLabelWidth + (r % legendPerRow) * 80.0;
    const double y = legendTop + (r / legendPerRow) * 20.0;
    svg += "<rect class=\"legend\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"12\" height=\"12\" fill=\"" +
           rankColour(r, nranks) + "\"/>\n";
    svg += "<text x=\"" + px(x + 16) + "\" y=\"" + px(y + 10) + "\">rank " + std::to_string(r) + "</text>\n";
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace topoccl::algo
