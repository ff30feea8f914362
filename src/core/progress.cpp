#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lmx {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf,
                  v < 10    ? "%.2f %s"
                  : v < 100 ? "%.1f %s"
                            : "%.0f %s",
                  v, units[u]);
  return buf;
}

namespace {

std::string format_duration(double s) {
  if (s < 0 || s > 99 * 3600) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, uint64_t total, uint64_t initial, ProgressOptions o)
    : label_(std::move(label)),
      total_(total),
      initial_(initial),
      done_(initial),
      enabled_(o.enabled),
      tty_(o.force_tty < 0 ? isatty(STDERR_FILENO) != 0 : o.force_tty == 1),
      unit_(o.unit),
      start_(Clock::now()),
      last_draw_(start_) {
  if (!enabled_) return;
  if (tty_)
    draw(false);
  else if (initial_)
    std::fprintf(stderr, "%s: resuming at %s\n", label_.c_str(), format_bytes(initial_).c_str());
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since < (tty_ ? 0.1 : 10.0)) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void ProgressBar::draw(bool final) {
  auto amount = [this](uint64_t n) {
    return unit_.empty() ? format_bytes(n) : std::to_string(n) + " " + unit_;
  };
  auto rate_text = [this](double r) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f %s/s", r, unit_.c_str());
    return unit_.empty() ? format_bytes(static_cast<uint64_t>(r)) + "/s" : std::string(buf);
  };
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_ - initial_) / elapsed : 0.0;
  std::string line = label_;
  line.resize(std::max<size_t>(line.size(), 24), ' ');
  line += "  ";
  if (total_) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    char pct[16];
    std::snprintf(pct, sizeof pct, "%3d%% ", static_cast<int>(frac * 100));
    line += pct;
    if (tty_) {
      constexpr int kWidth = 24;
      const int fill = static_cast<int>(frac * kWidth);
      line.push_back('|');
      line.append(fill, '#').append(kWidth - fill, ' ').append("| ");
    }
    line += amount(done_) + " / " + amount(total_);
  } else {
    line += amount(done_);
  }
  line += "  " + rate_text(rate);
  if (final)
    line += "  in " + format_duration(elapsed);
  else if (total_ && rate > 0)
    line +=
        "  ETA " + format_duration(static_cast<double>(total_ - std::min(total_, done_)) / rate);
  if (tty_)
    std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace lmx
