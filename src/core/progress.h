// A progress line on standard error for long work measured in bytes (downloads, conversion) or in
// counted units (prompt tokens of a long prefill): done / total, rate and ETA. On a terminal one
// line redrawn in place at most ten times a second; otherwise (a log, a pipe) plain lines: one
// every 10 seconds and one at the end (and one at the start of a resumed file).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace lmx {

struct ProgressOptions {
  bool enabled = true;
  int force_tty = -1;     // -1: isatty(stderr), 0: plain lines, 1: one redrawn line
  std::string unit = "";  // empty: bytes (kB, MB...); else a count of these ("tokens")
};

class ProgressBar {
 public:
  // total 0: unknown size (no percentage or ETA). initial: bytes already there (a resumed file),
  // counted in done but not in the rate.
  ProgressBar(std::string label, uint64_t total, uint64_t initial = 0, ProgressOptions o = {});
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(uint64_t done);  // absolute byte count
  // Prints the final line (done, average rate) once; the destructor calls it too.
  void finish();

 private:
  void draw(bool final);

  using Clock = std::chrono::steady_clock;
  std::string label_;
  uint64_t total_, initial_, done_;
  bool enabled_, tty_, finished_ = false;
  std::string unit_;
  Clock::time_point start_, last_draw_;
};

// "1.50 GB", "12.3 MB", "512 B" (decimal units, as the hub's pages show sizes).
std::string format_bytes(uint64_t bytes);

}  // namespace lmx
