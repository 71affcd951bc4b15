#include "train/plots.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "data/text.h"
#include "train/run_dir.h"

namespace tinygpt {

namespace fs = std::filesystem;

namespace {

std::string escape_xml(std::string_view s) {
  std::string out;
  for (char c : s) {
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

/// A character as an axis label: visible names for whitespace.
/// A token's text as a label: newline, space and tab drawn as symbols, other control bytes and bytes that are not
/// UTF-8 (part of a character, in a BPE's token) as \xNN.
std::string token_label(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto b = uint8_t(bytes[i]);
    size_t len = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
    bool valid = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (uint8_t(bytes[i + k]) & 0xc0) == 0x80;
    if (!valid) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
      continue;
    }
    if (b == '\n') {
      out += "\u21b5";
    } else if (b == ' ') {
      out += "\u2423";
    } else if (b == '\t') {
      out += "\u21e5";
    } else if (b < 0x20 || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += escape_xml(bytes.substr(i, len));
    }
    i += len;
  }
  return out;
}

/// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * step; v += step) out.push_back(v);
  return out;
}

struct Point {
  double x, y;
};

/// A run's curves: the training loss of every iteration, its moving average, and the evaluations.
struct Curves {
  std::vector<Point> loss, smooth, train_eval, val_eval;
};

Curves read_curves(const fs::path& metrics_jsonl) {
  if (!std::ifstream(metrics_jsonl))
    throw Error(fmt::format("cannot read '{}' (train into the run directory first)", metrics_jsonl.string()));
  Curves c;
  std::vector<Point>&loss = c.loss, &train_eval = c.train_eval, &val_eval = c.val_eval;
  for (const MetricsRow& r : read_metrics(metrics_jsonl)) {
    const double it = double(r.iter);
    if (r.loss) loss.push_back({it, *r.loss});
    if (r.val_loss && r.train_loss) {
      val_eval.push_back({it, *r.val_loss});
      train_eval.push_back({it, *r.train_loss});
    }
  }
  if (loss.empty() && val_eval.empty())
    throw Error(fmt::format("'{}' holds no training iterations", metrics_jsonl.string()));
  // Moving average over a window of 2% of the run (at least 1).
  std::vector<Point>& smooth = c.smooth;
  const size_t w = std::max<size_t>(1, loss.size() / 50);
  double acc = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    acc += loss[i].y;
    if (i >= w) acc -= loss[i - w].y;
    if (i + 1 >= w) smooth.push_back({loss[i].x, acc / double(w)});
  }

  return c;
}

/// The legend at the top right (right, top: the plot's corner), with the best evaluation.
std::string legend_svg(double right, double top, const std::vector<Point>& val_eval) {
  std::string svg;
  const std::pair<const char*, const char*> legend[] = {{"#1f77b4", "training loss (batch, moving average)"},
                                                        {"#2ca02c", "train loss (evaluation)"},
                                                        {"#d62728", "val loss (evaluation)"}};
  double ly = top + 18;
  for (const auto& [color, label] : legend) {
    svg += fmt::format(R"svg(<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="3"/>)svg"
                       "\n",
                       right - 290, right - 265, ly - 4, ly - 4, color);
    svg += fmt::format(R"svg(<text x="{}" y="{}">{}</text>)svg"
                       "\n",
                       right - 258, ly, label);
    ly += 18;
  }
  if (!val_eval.empty()) {
    const auto best =
        *std::min_element(val_eval.begin(), val_eval.end(), [](const Point& a, const Point& b) { return a.y < b.y; });
    svg += fmt::format(R"svg(<text x="{}" y="{}">best val loss {:.4f} at iteration {:g}</text>)svg"
                       "\n",
                       right - 290, ly + 4, best.y, best.x);
  }
  return svg;
}

}  // namespace

std::string loss_curves_svg(const fs::path& metrics_jsonl) {
  const Curves c = read_curves(metrics_jsonl);
  const std::vector<Point>&loss = c.loss, &smooth = c.smooth, &train_eval = c.train_eval, &val_eval = c.val_eval;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto* series : {&loss, &train_eval, &val_eval}) {
    for (const Point& p : *series) {
      if (!std::isfinite(p.y)) continue;
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x), y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  y0 = std::max(0.0, y0 - 0.05 * (y1 - y0));
  const double W = 900, H = 520, L = 70, R = 30, T = 50, B = 60;
  auto sx = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto sy = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  auto polyline = [&](const std::vector<Point>& pts, const char* color, double width, double opacity) {
    std::string s =
        fmt::format(R"svg(<polyline fill="none" stroke="{}" stroke-width="{}" stroke-opacity="{}" points=")svg", color,
                    width, opacity);
    for (const Point& p : pts) {
      if (std::isfinite(p.y)) s += fmt::format("{:.1f},{:.1f} ", sx(p.x), sy(p.y));
    }
    return s + "\"/>\n";
  };

  std::string svg = fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif" font-size="13">)svg"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  svg += fmt::format(R"svg(<text x="{}" y="28" font-size="17" text-anchor="middle">Loss: {}</text>)svg"
                     "\n",
                     W / 2, escape_xml(metrics_jsonl.parent_path().filename().string()));
  for (double v : ticks(y0, y1, 6)) {
    svg += fmt::format(R"svg(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#e5e5e5"/>)svg"
                       "\n",
                       L, W - R, sy(v), sy(v));
    svg += fmt::format(R"svg(<text x="{}" y="{:.1f}" text-anchor="end">{:g}</text>)svg"
                       "\n",
                       L - 8, sy(v) + 4, v);
  }
  for (double v : ticks(x0, x1, 8)) {
    svg += fmt::format(R"svg(<line x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#e5e5e5"/>)svg"
                       "\n",
                       sx(v), sx(v), T, H - B);
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{:g}</text>)svg"
                       "\n",
                       sx(v), H - B + 20, v);
  }
  svg += fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#444"/>)svg"
                     "\n",
                     L, T, W - L - R, H - T - B);
  svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">iteration</text>)svg"
                     "\n",
                     (L + W - R) / 2, H - 18);
  svg += fmt::format(
      R"svg(<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">loss (nats per character)</text>)svg"
      "\n",
      (T + H - B) / 2);
  svg += polyline(loss, "#1f77b4", 1, 0.25);
  svg += polyline(smooth, "#1f77b4", 2, 1);
  svg += polyline(train_eval, "#2ca02c", 2, 1);
  svg += polyline(val_eval, "#d62728", 2, 1);
  for (const Point& p : val_eval) {
    if (std::isfinite(p.y))
      svg += fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="#d62728"/>)svg"
                         "\n",
                         sx(p.x), sy(p.y));
  }
  svg += legend_svg(W - R, T, val_eval);
  return svg + "</svg>\n";
}

std::string attention_svg(const Tensor& weights, const std::vector<std::string>& tokens, int64_t layer,
                          const std::vector<int64_t>& heads) {
  if (weights.ndim() != 3 || weights.size(1) != int64_t(tokens.size()) || weights.size(2) != int64_t(tokens.size())) {
    throw Error(fmt::format("attention_svg: weights must be (NH, T, T) with T = {}, got {}", tokens.size(),
                            weights.shape().str()));
  }
  const int64_t NH = weights.size(0), Tn = weights.size(1);
  const std::vector<float> w = weights.to(DType::F32).to_vector<float>();
  const double cell = std::clamp(480.0 / double(Tn), 6.0, 22.0);
  const double label = 18, gap = 40, side = label + cell * double(Tn);
  const int64_t cols = std::min<int64_t>(int64_t(heads.size()), 2);
  const int64_t rows = (int64_t(heads.size()) + cols - 1) / cols;
  const double W = double(cols) * (side + gap) + gap, H = double(rows) * (side + gap + 24) + 60;
  std::string svg = fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" font-family="monospace" font-size="{2:.0f}">)svg"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, std::min(cell * 0.8, 13.0));
  svg += fmt::format(
      R"svg(<text x="{:.0f}" y="28" font-family="sans-serif" font-size="16" text-anchor="middle">Attention weights, layer {} (row: query character, column: key character; darker = more weight)</text>)svg"
      "\n",
      W / 2, layer);
  for (size_t i = 0; i < heads.size(); ++i) {
    const int64_t h = heads[i];
    if (h < 0 || h >= NH) throw Error(fmt::format("head {} does not exist (the layer has heads 0 to {})", h, NH - 1));
    const double ox = gap + double(int64_t(i) % cols) * (side + gap),
                 oy = 60 + double(int64_t(i) / cols) * (side + gap + 24);
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" font-family="sans-serif" font-size="14">head {}</text>)svg"
                       "\n",
                       ox + label, oy - 6, h);
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t s = 0; s <= t; ++s) {
        const float v = w[size_t((h * Tn + t) * Tn + s)];
        svg += fmt::format(
            R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#08306b" fill-opacity="{:.3f}"/>)svg",
            ox + label + double(s) * cell, oy + label + double(t) * cell, cell, cell, std::clamp(v, 0.0f, 1.0f));
      }
      svg += "\n";
    }
    svg += fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#888"/>)svg"
                       "\n",
                       ox + label, oy + label, cell * double(Tn), cell * double(Tn));
    for (int64_t t = 0; t < Tn; ++t) {
      const std::string c = token_label(tokens[size_t(t)]);
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)svg",
                         ox + label + (double(t) + 0.5) * cell, oy + label - 4, c);
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)svg"
                         "\n",
                         ox + label - 3, oy + label + (double(t) + 0.75) * cell, c);
    }
  }
  return svg + "</svg>\n";
}

}  // namespace tinygpt
