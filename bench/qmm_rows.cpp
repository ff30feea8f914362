// Microbenchmark of the L3 CPU quantized matmul per shape and row count (docs/cpu.md): times
// kernels::cpu::qmm_f32 on random weights in a model's shapes for each M and int8 mode, and
// prints a Markdown table of microseconds per call (the median of --repeat runs of calls that
// take at least --min-ms together). --clock cpu times the process's CPU time instead of the wall
// clock: on a shared machine, with LMX_CPU_THREADS=1, the work of the call rather than its wait.
//
// usage: lmx_bench_qmm [--shapes smollm2|gemma3] [--rows 1,2,4,8,16,64] [--modes best,all,off]
//                      [--bits 4] [--repeat 5] [--min-ms 50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/qmm.h"

namespace kc = lmx::kernels::cpu;
namespace mx = mlx::core;

namespace {

struct Shape {
  const char* name;
  int N, K, bits;
};

std::vector<int> ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(std::stoi(t));
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string set = "smollm2", rows = "1,2,4,8,16,64", modes = "best,all,off";
  int repeat = 5, min_ms = 50, gs = 64, bits = 0;
  bool cpu = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--shapes")
      set = v;
    else if (k == "--rows")
      rows = v;
    else if (k == "--modes")
      modes = v;
    else if (k == "--repeat")
      repeat = std::stoi(v);
    else if (k == "--min-ms")
      min_ms = std::stoi(v);
    else if (k == "--group-size")
      gs = std::stoi(v);
    else if (k == "--bits")
      bits = std::stoi(v);
    else if (k == "--clock")
      cpu = v == "cpu";
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  // SmolLM2-135M: q/o, k/v, gate/up, down, the tied head. Gemma 3 270M: q, k/v, o, gate/up,
  // down, the 262k head (8-bit in `lmx convert`'s mix).
  std::vector<Shape> shapes;
  if (set == "gemma3")
    shapes = {{"q", 1024, 640, 4},     {"kv", 256, 640, 4},      {"o", 640, 1024, 4},
              {"gate", 2048, 640, 4},  {"down", 640, 2048, 4},   {"q8", 1024, 640, 8},
              {"gate8", 2048, 640, 8}, {"head8", 262144, 640, 8}};
  else
    shapes = {{"qo", 576, 576, 4},     {"kv", 192, 576, 4},     {"gate", 1536, 576, 4},
              {"down", 576, 1536, 4},  {"head", 49152, 576, 4}, {"gate8", 1536, 576, 8},
              {"head8", 49152, 576, 8}};
  const kc::Isa isa = kc::active_isa();
  std::printf("isa %s, int8 kernel %s (to %d bits), %s time\n\n", kc::isa_name(isa).c_str(),
              kc::int8_kernel_name(isa).c_str(), kc::int8_max_bits(isa), cpu ? "CPU" : "wall");
  std::printf(
      "| shape | N x K | bits | M | mode | us/call | us/row |\n|---|---|---|---|---|---|---|\n");
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    if (bits && s.bits != bits) continue;
    mx::array wf =
        mx::random::normal({s.N, s.K}, mx::float32, 0.0f, 0.05f, mx::random::key(seed++));
    auto q = mx::quantize(mx::astype(wf, mx::bfloat16), gs, s.bits);
    mx::eval(q);
    const kc::QWeight w = kc::qweight(q[0], q[1], q[2], gs, s.bits);
    for (int M : ints(rows)) {
      mx::array x = mx::random::normal({M, s.K}, mx::float32, mx::random::key(seed++));
      mx::eval(x);
      std::vector<float> out(static_cast<size_t>(M) * s.N);
      for (const std::string& mode : words(modes)) {
        const kc::Int8Mode m = mode == "all"   ? kc::Int8Mode::all
                               : mode == "off" ? kc::Int8Mode::off
                                               : kc::Int8Mode::best;
        auto call = [&] { kc::qmm_f32(w, x.data<float>(), M, out.data(), isa, m); };
        call();  // packs where the kernel packs
        std::vector<double> per;
        for (int r = 0; r < repeat; ++r) {
          auto now = [cpu] {
            if (!cpu)
              return std::chrono::duration<double, std::micro>(
                         std::chrono::steady_clock::now().time_since_epoch())
                  .count();
            timespec ts;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
            return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
          };
          int n = 0;
          const double t0 = now();
          double el = 0;
          do {
            call();
            ++n;
            el = now() - t0;
          } while (el < min_ms * 1000.0);
          per.push_back(el / n);
        }
        std::sort(per.begin(), per.end());
        const double med = per[per.size() / 2];
        std::printf("| %s | %d x %d | %d | %d | %s | %.1f | %.1f |\n", s.name, s.N, s.K, s.bits, M,
                    mode.c_str(), med, med / M);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
