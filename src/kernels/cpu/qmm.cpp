#include "kernels/cpu/qmm.h"

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/qmm_args.h"
#include "kernels/cpu/thread_pool.h"

namespace lmx::kernels::cpu {

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    case Isa::generic:
      return "generic";
  }
  return "?";
}

bool isa_available(Isa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::generic:
      return true;
  }
  return false;
#else
  return isa == Isa::generic;
#endif
}

namespace {

Isa detect_isa() {
  if (const char* env = std::getenv("LMX_CPU_ISA"); env && *env) {
    for (Isa isa : {Isa::avx512, Isa::avx2, Isa::generic}) {
      if (isa_name(isa) == env) {
        check(isa_available(isa), "LMX_CPU_ISA", "this CPU does not support ", env);
        return isa;
      }
    }
    fail("LMX_CPU_ISA", "expected avx512, avx2 or generic, got '", env, "'");
  }
  for (Isa isa : {Isa::avx512, Isa::avx2})
    if (isa_available(isa)) return isa;
  return Isa::generic;
}

}  // namespace

IsaKernels kernels_for(Isa isa) {
  check(isa_available(isa), "quantized_matmul", "this CPU does not support ", isa_name(isa));
  IsaKernels k = isa == Isa::avx512 ? kernels_avx512()
                 : isa == Isa::avx2 ? kernels_avx2()
                                    : kernels_generic();
  check(k.qmm_rows != nullptr, "quantized_matmul", "this build has no ", isa_name(isa), " kernel");
  return k;
}

namespace {
std::atomic<int>& int8_override() {
  static std::atomic<int> mode{-1};
  return mode;
}
}  // namespace

void set_int8_mode(std::optional<Int8Mode> mode) {
  int8_override().store(mode ? static_cast<int>(*mode) : -1, std::memory_order_relaxed);
}

Int8Mode int8_mode() {
  if (const int o = int8_override().load(std::memory_order_relaxed); o >= 0)
    return static_cast<Int8Mode>(o);
  static const Int8Mode mode = [] {
    const char* env = std::getenv("LMX_CPU_INT8");
    if (!env || !*env || std::strcmp(env, "1") == 0) return Int8Mode::best;
    if (std::strcmp(env, "0") == 0) return Int8Mode::off;
    if (std::strcmp(env, "all") == 0) return Int8Mode::all;
    fail("LMX_CPU_INT8", "expected 0, 1 or all, got '", env, "'");
  }();
  return mode;
}

namespace {

std::atomic<int>& packing_state() {
  static std::atomic<int> state = [] {
    const char* env = std::getenv("LMX_CPU_PACK");
    if (!env || !*env || std::strcmp(env, "1") == 0) return 1;
    if (std::strcmp(env, "0") == 0) return 0;
    fail("LMX_CPU_PACK", "expected 0 or 1, got '", env, "'");
  }();
  return state;
}

}  // namespace

bool packing() { return packing_state().load(std::memory_order_relaxed) != 0; }
void set_packing(bool on) { packing_state().store(on ? 1 : 0, std::memory_order_relaxed); }

namespace {

std::atomic<int>& widening_state() {
  static std::atomic<int> state = [] {
    const char* env = std::getenv("LMX_CPU_WIDEN");
    if (!env || !*env || std::strcmp(env, "1") == 0) return 1;
    if (std::strcmp(env, "0") == 0) return 0;
    fail("LMX_CPU_WIDEN", "expected 0 or 1, got '", env, "'");
  }();
  return state;
}

}  // namespace

bool widening() { return widening_state().load(std::memory_order_relaxed) != 0; }
void set_widening(bool on) { widening_state().store(on ? 1 : 0, std::memory_order_relaxed); }

namespace {

// The VNNI kernel for `isa`, or an empty one.
QmmI8Kernel i8_kernel(Isa isa) {
#if defined(__x86_64__)
  static const bool vnni512 = __builtin_cpu_supports("avx512vnni");
  static const bool vnni256 = __builtin_cpu_supports("avxvnni");
  if (isa == Isa::avx512 && vnni512) return kernels_i8_avx512vnni();
  if ((isa == Isa::avx512 || isa == Isa::avx2) && vnni256) return kernels_i8_avxvnni();
  if (isa == Isa::avx2) return kernels_i8_avx2();
#else
  (void)isa;
#endif
  return {};
}

}  // namespace

std::string int8_kernel_name(Isa isa) { return i8_kernel(isa).name; }

int int8_max_bits(Isa isa) { return i8_kernel(isa).rows ? i8_kernel(isa).max_bits : 0; }

bool int8_packed(Isa isa) { return i8_kernel(isa).packed_rows != nullptr && packing(); }

bool int8_all_rows(Isa isa) { return int8_packed(isa) || i8_kernel(isa).tile_rows != nullptr; }

namespace {

ScaleType scale_type(mx::Dtype t) {
  if (t == mx::float32) return ScaleType::f32;
  if (t == mx::bfloat16) return ScaleType::bf16;
  return ScaleType::f16;
}

template <typename T>
void rows_to_f32(const mx::array& x, int M, int K, float* out) {
  const T* base = x.data<T>();
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const bool contiguous = x.flags().row_contiguous;
  for (int m = 0; m < M; ++m) {
    if (contiguous) {
      const T* row = base + static_cast<int64_t>(m) * K;
      for (int k = 0; k < K; ++k) out[static_cast<int64_t>(m) * K + k] = static_cast<float>(row[k]);
      continue;
    }
    // Offset of row m: unravel m over the leading axes.
    int64_t off = 0, r = m;
    for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
      off += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    for (int k = 0; k < K; ++k)
      out[static_cast<int64_t>(m) * K + k] = static_cast<float>(base[off + k * strides.back()]);
  }
}

class LmxQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  LmxQuantizedMatmul(mx::Stream s, int group_size, int bits, Isa isa, Int8Mode int8)
      : mx::UnaryPrimitive(s), group_size_(group_size), bits_(bits), isa_(isa), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& scales = inputs[2];
    const mx::array& biases = inputs[3];
    for (const mx::array* a : {&w, &scales, &biases})
      check(a->flags().row_contiguous, "quantized_matmul",
            "the weight, scales and biases must be row-contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const int K = x.shape(-1);
    const int M = static_cast<int>(x.size() / K);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const mx::array* a : {&x, &w, &scales, &biases}) enc.set_input_array(*a);
    enc.set_output_array(out);
    const QWeight qw = qweight(w, scales, biases, group_size_, bits_);
    enc.dispatch([qw, M, K, isa = isa_, int8 = int8_, x = mx::array::unsafe_weak_copy(x),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      std::vector<float> xf(static_cast<size_t>(M) * K);
      to_f32_rows(x, xf.data());
      if (out.dtype() == mx::float32) {
        qmm_f32(qw, xf.data(), M, out.data<float>(), isa, int8);
      } else {
        std::vector<float> of(static_cast<size_t>(M) * qw.N);
        qmm_f32(qw, xf.data(), M, of.data(), isa, int8);
        from_f32(of.data(), out);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("quantized_matmul", "the L3 CPU kernel has no GPU implementation");
  }

  const char* name() const override { return "LmxQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const LmxQuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && isa_ == o.isa_ && int8_ == o.int8_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(0);
    return {s};
  }

 private:
  int group_size_, bits_;
  Isa isa_;
  Int8Mode int8_;
};

// The int8 activations of one call (QmmI8Args).
struct I8Rows {
  std::vector<signed char> q;
  std::vector<short> q16;
  std::vector<float> d, sum, bsum;
};
}  // namespace

Isa active_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

QWeight qweight(const mx::array& w, const mx::array& scales, const mx::array& biases,
                int group_size, int bits) {
  for (const mx::array* a : {&w, &scales, &biases})
    check(a->flags().row_contiguous, "quantized_matmul",
          "the weight, scales and biases must be row-contiguous");
  return {w.data<unsigned char>(),
          scales.data<void>(),
          biases.data<void>(),
          scale_type(scales.dtype()),
          w.shape(0),
          w.shape(1) * 32 / bits,
          group_size,
          bits,
          w.data_shared_ptr()};
}

namespace {

bool widened_bits(int bits) { return (bits == 5 || bits == 6) && widening(); }

bool uses_int8(const QWeight& w, int M, Isa isa, Int8Mode int8) {
  const QmmI8Kernel k = i8_kernel(isa);
  const int bits = widened_bits(w.bits) ? 8 : w.bits;  // 5/6-bit: as their byte-wide copy
  if ((bits != 4 && bits != 8) || bits > k.max_bits || !k.rows || int8 == Int8Mode::off)
    return false;
  return int8 == Int8Mode::all || M <= kInt8MaxRows || int8_all_rows(isa);
}

// Rows per task for a weight of N rows: 16, or 64 for decode-sized calls on wide layers (longer
// sequential weight streams per thread). Each row is computed by one thread in a fixed order, so
// the result does not depend on the thread count or the task size.
int rows_per_task(int N, int M) { return M <= 4 && N >= 1024 ? 64 : 16; }

// The weight and output fields QmmArgs and QmmI8Args share.
template <typename Args>
void set_weight(Args& a, const QWeight& w, int M, float* out) {
  a.w = w.w;
  a.scales = w.scales;
  a.biases = w.biases;
  a.scale_type = w.scale_type;
  a.out = out;
  a.M = M;
  a.N = w.N;
  a.K = w.K;
  a.group_size = w.group_size;
  a.bits = w.bits;
}

// fn(i, n0, n1) for rows [n0, n1) of weight i, every row of every weight, as one parallel_for.
template <typename Fn>
void for_rows(int n, const QWeight* ws, int M, const Fn& fn) {
  std::vector<int> first(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    const int per = rows_per_task(ws[i].N, M);
    first[i + 1] = first[i] + (ws[i].N + per - 1) / per;
  }
  parallel_for(first[n], [&](int t) {
    int i = 0;
    while (t >= first[i + 1]) ++i;
    const int per = rows_per_task(ws[i].N, M);
    const int n0 = (t - first[i]) * per;
    fn(i, n0, std::min(ws[i].N, n0 + per));
  });
}

// The packed copy's bytes at `bits` (the layout's: a 5/6-bit weight's packing source is
// byte-wide).
long packed_bytes(const QWeight& w, int bits) {
  const long blocks = (w.N + kPackRows - 1) / kPackRows;
  return blocks * (w.K / w.group_size) * pack_group_bytes(w.group_size, bits, w.scale_type);
}

// Nibbles 0-3 of x -> the low nibbles of bytes 0-3.
uint32_t spread_nibbles(uint32_t x) {
  return (x & 0xFu) | (x & 0xF0u) << 4 | (x & 0xF00u) << 8 | (x & 0xF000u) << 12;
}

// spread_nibbles' inverse: the low nibbles of bytes 0-3 -> nibbles 0-3.
uint32_t gather_nibbles(uint32_t x) {
  return (x & 0xFu) | (x >> 4 & 0xF0u) | (x >> 8 & 0xF00u) | (x >> 12 & 0xF000u);
}

void pack_blocks(const QWeight& w, unsigned char* out, int b0, int b1, long ss, int groups,
                 long wbytes, long gbytes, long row_bytes, int bits);

// Hands the whole pages of [p, p + n) back to the system (their bytes read as 0 after it).
void drop_pages(const unsigned char* p, size_t n) {
  const uintptr_t page = 4096, a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page,
                  e = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
}

// The 5/6-bit packed layout (qmm_args.h): per block of 32 inputs, 4 steps of 64 bytes as the
// 4-bit layout's (byte 4 r + i of step s: the low nibbles of row r's inputs 8 s + i, i + 4), then
// for each bit above the nibble (4, and 5 for 6-bit) and step a 64-bit mask of inputs 8 s + i
// (bit 4 r + i) and one of 8 s + 4 + i. One row's values of a group (byte-wide, 0 .. 2^bits - 1)
// at q -> row r's bytes of that group at gp. The masks' bytes are shared by rows r and r ^ 1
// (cleared by the even row, then ORed; one block's rows are written by one task, in order).
void pack_planes(const unsigned char* q, unsigned char* gp, int r, int group_size, int bits) {
  for (int jb = 0; jb < group_size / 32; ++jb) {
    unsigned char* bp = gp + 64L * bits * jb;
    for (int s = 0; s < 4; ++s) {
      const unsigned char* v = q + 32 * jb + 8 * s;
      if (r % 2 == 0)  // the first of the two rows of these mask bytes
        for (int plane = 0; plane < bits - 4; ++plane) {
          unsigned char* m = bp + 256 + 64 * plane + 16 * s;
          m[r / 2] = m[8 + r / 2] = 0;
        }
      for (int i = 0; i < 4; ++i) {
        bp[64 * s + 4 * r + i] = static_cast<unsigned char>((v[i] & 15) | (v[i + 4] & 15) << 4);
        const int bit = 4 * r + i;
        for (int plane = 0; plane < bits - 4; ++plane) {
          unsigned char* m = bp + 256 + 64 * plane + 16 * s;
          m[bit / 8] |= static_cast<unsigned char>((v[i] >> (4 + plane) & 1) << (bit % 8));
          m[8 + bit / 8] |= static_cast<unsigned char>((v[i + 4] >> (4 + plane) & 1) << (bit % 8));
        }
      }
    }
  }
}

// pack_planes' inverse: row r's byte-wide values of a group into q.
void unpack_planes(const unsigned char* gp, int r, int group_size, int bits, unsigned char* q) {
  for (int jb = 0; jb < group_size / 32; ++jb) {
    const unsigned char* bp = gp + 64L * bits * jb;
    for (int s = 0; s < 4; ++s) {
      unsigned char* v = q + 32 * jb + 8 * s;
      for (int i = 0; i < 4; ++i) {
        const unsigned char b = bp[64 * s + 4 * r + i];
        v[i] = b & 15;
        v[i + 4] = b >> 4;
        const int bit = 4 * r + i;
        for (int plane = 0; plane < bits - 4; ++plane) {
          const unsigned char* m = bp + 256 + 64 * plane + 16 * s;
          v[i] |= static_cast<unsigned char>((m[bit / 8] >> (bit % 8) & 1) << (4 + plane));
          v[i + 4] |= static_cast<unsigned char>((m[8 + bit / 8] >> (bit % 8) & 1) << (4 + plane));
        }
      }
    }
  }
}

// MLX's layout -> the packed one (QmmI8Kernel::packed_rows) at `bits`, one block of rows per
// task: w's own bits, or 5/6 from w byte-wide (packing_source). consume: w.w's pages are handed
// back to the system as their rows are packed (w's owner is about to free them and nothing else
// reads them), so the packing never holds both whole.
void pack(const QWeight& w, unsigned char* out, int bits, bool consume = false) {
  const long ss = scale_bytes(w.scale_type);
  const int groups = w.K / w.group_size;
  const long wbytes = pack_weight_bytes(w.group_size, bits);
  const long gbytes = pack_group_bytes(w.group_size, bits, w.scale_type);
  const long row_bytes = static_cast<long>(w.K) * w.bits / 8;
  const int blocks = (w.N + kPackRows - 1) / kPackRows;
  // Chunks of blocks (4 MiB of w, at least one block) in order when consuming, else one.
  const int chunk = consume ? std::max<int>(1, (4L << 20) / (row_bytes * kPackRows)) : blocks;
  for (int b0 = 0; b0 < blocks; b0 += chunk) {
    const int b1 = std::min(blocks, b0 + chunk);
    pack_blocks(w, out, b0, b1, ss, groups, wbytes, gbytes, row_bytes, bits);
    // The whole pages of w's bytes before the last row packed so far.
    if (consume)
      drop_pages(w.w, std::min<long>(w.N, static_cast<long>(b1) * kPackRows) * row_bytes);
  }
}

// Blocks [b0, b1) of pack.
void pack_blocks(const QWeight& w, unsigned char* out, int b0, int b1, long ss, int groups,
                 long wbytes, long gbytes, long row_bytes, int bits) {
  parallel_for(b1 - b0, [&, b0](int t) {
    const int b = b0 + t;
    unsigned char* blk =
        out + static_cast<long>(b) * groups * gbytes;  // a fresh mapping: padding rows stay 0
    for (int r = 0; r < kPackRows && b * kPackRows + r < w.N; ++r) {
      const long n = static_cast<long>(b) * kPackRows + r;
      const unsigned char* src = w.w + n * row_bytes;
      for (int g = 0; g < groups; ++g) {
        unsigned char* gp = blk + g * gbytes;
        const unsigned char* q = src + static_cast<long>(g) * w.group_size * w.bits / 8;
        if (bits == 5 || bits == 6) {
          pack_planes(q, gp, r, w.group_size, bits);
        } else {
          // One 4-byte word per step and row: 4 inputs as stored (8-bit), or 8 nibbles k .. k + 7
          // (LSB first) -> byte i = nibble i | nibble i + 4 << 4 (4-bit).
          for (int step = 0; step < w.group_size * w.bits / 32; ++step) {
            uint32_t u;
            std::memcpy(&u, q + 4L * step, 4);
            if (w.bits == 4) u = spread_nibbles(u & 0xFFFFu) | spread_nibbles(u >> 16) << 4;
            std::memcpy(gp + 64L * step + 4L * r, &u, 4);
          }
        }
        const long at = (n * groups + g) * ss;
        std::memcpy(gp + wbytes + r * ss, static_cast<const char*>(w.scales) + at, ss);
        std::memcpy(gp + wbytes + (kPackRows + r) * ss, static_cast<const char*>(w.biases) + at,
                    ss);
      }
    }
  });
}

// Packed copies live in their own mappings, outside the malloc heap that the activations churn,
// on transparent huge pages where the kernel allows (a decode step streams every page once).
struct Mapping {
  unsigned char* p = nullptr;
  size_t bytes = 0;
  std::atomic<size_t>* held;  // the live bytes of this kind of copy (kernel_copies())
  Mapping(size_t n, std::atomic<size_t>& count) : bytes(n), held(&count) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check(m != MAP_FAILED, "quantized_matmul", "out of memory packing a weight of ", n, " bytes");
    madvise(m, n, MADV_HUGEPAGE);
    p = static_cast<unsigned char*>(m);
    *held += bytes;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    munmap(p, bytes);
    *held -= bytes;
  }
};

std::atomic<size_t> packed_held{0}, widened_held{0}, in_place_held{0};

struct Packed {
  std::weak_ptr<void> owner;
  const void* scales;
  int N, K, group_size, bits;
  ScaleType scale_type;
  std::unique_ptr<Mapping> data;  // null for a copy in place (pack_in_place): its array owns it
  const unsigned char* p;         // the packed bytes
};

// Whether two handles name one weight's buffer (its control block, not its address: a freed
// buffer's address can return).
bool same_owner(const std::weak_ptr<void>& a, const std::weak_ptr<void>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

bool same_weight(const Packed& p, const QWeight& w) {
  return same_owner(p.owner, w.owner) && !p.owner.expired() && p.scales == w.scales && p.N == w.N &&
         p.K == w.K && p.group_size == w.group_size && p.bits == w.bits;
}

// Every packed copy, named by the weight's bytes (for a copy in place, its own).
struct PackedCache {
  std::mutex mu;
  std::unordered_map<const unsigned char*, Packed> map;
  void drop_expired() {  // the copies of freed weights
    for (auto i = map.begin(); i != map.end();)
      i = i->second.owner.expired() ? map.erase(i) : std::next(i);
  }
};
PackedCache& packed_cache() {
  static PackedCache c;
  return c;
}

// The layout of a packed copy's bytes.
struct PackedRows {
  int N, K, group_size, bits;
  ScaleType scale_type;
  const unsigned char* p;
};

// w's layout when its bytes are a copy in place, else nullopt.
std::optional<PackedRows> in_place(const unsigned char* w, const std::weak_ptr<void>& owner) {
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.map.find(w);
  if (it == c.map.end() || it->second.data || it->second.owner.expired() ||
      !same_owner(it->second.owner, owner))
    return std::nullopt;
  const Packed& p = it->second;
  return PackedRows{p.N, p.K, p.group_size, p.bits, p.scale_type, p.p};
}

// The packed layout's row n -> its MLX bytes (K * bits / 8) at out: pack's inverse. A 5/6-bit
// weight's copy was packed from its byte-wide bytes (8 bits), narrowed back here.
void unpack_row(const PackedRows& p, long n, unsigned char* out) {
  const bool wide = p.bits == 5 || p.bits == 6;
  std::vector<unsigned char> bytes(wide ? p.K : 0);
  const int groups = p.K / p.group_size;
  const long gbytes = pack_group_bytes(p.group_size, p.bits, p.scale_type);
  const long b = n / kPackRows, r = n % kPackRows;
  const unsigned char* blk = p.p + b * groups * gbytes;
  for (int g = 0; g < groups; ++g) {
    const unsigned char* gp = blk + g * gbytes;
    if (wide) {
      unpack_planes(gp, static_cast<int>(r), p.group_size, p.bits,
                    bytes.data() + static_cast<long>(g) * p.group_size);
      continue;
    }
    unsigned char* q = out + static_cast<long>(g) * p.group_size * p.bits / 8;
    for (int step = 0; step < p.group_size * p.bits / 32; ++step) {
      uint32_t u;
      std::memcpy(&u, gp + 64L * step + 4L * r, 4);
      if (p.bits == 4)
        u = gather_nibbles(u & 0x0F0F0F0Fu) | gather_nibbles(u >> 4 & 0x0F0F0F0Fu) << 16;
      std::memcpy(q + 4L * step, &u, 4);
    }
  }
  if (!wide) return;
  for (long k = 0; k < p.K; k += 8) {  // widen's inverse: 8 values in `bits` bytes, LSB first
    uint64_t u = 0;
    for (int j = 0; j < 8; ++j) u |= static_cast<uint64_t>(bytes[k + j]) << (j * p.bits);
    std::memcpy(out + k / 8 * p.bits, &u, p.bits);
  }
}

// Row n's scales and biases (K / group_size values each, in the copy's scale type) from the
// packed layout, as MLX's arrays held them.
void unpack_affine_row(const PackedRows& p, long n, unsigned char* scales, unsigned char* biases) {
  const int groups = p.K / p.group_size;
  const long ss = scale_bytes(p.scale_type);
  const long wbytes = pack_weight_bytes(p.group_size, p.bits);
  const long gbytes = pack_group_bytes(p.group_size, p.bits, p.scale_type);
  const long b = n / kPackRows, r = n % kPackRows;
  const unsigned char* blk = p.p + b * groups * gbytes;
  for (int g = 0; g < groups; ++g) {
    const unsigned char* gp = blk + g * gbytes;
    std::memcpy(scales + g * ss, gp + wbytes + r * ss, ss);
    std::memcpy(biases + g * ss, gp + wbytes + (kPackRows + r) * ss, ss);
  }
}

// MLX's 5/6-bit rows (element k in bits [k * bits, (k + 1) * bits), LSB first: 8 elements in
// `bits` bytes) -> one byte per element, as MLX's 8-bit layout stores 0..255.
void widen(const QWeight& w, unsigned char* out) {
  const long row_bytes = static_cast<long>(w.K) * w.bits / 8;
  const unsigned mask = (1u << w.bits) - 1;
  parallel_for((w.N + 15) / 16, [&](int t) {
    for (long n = 16L * t; n < std::min<long>(w.N, 16L * t + 16); ++n) {
      const unsigned char* src = w.w + n * row_bytes;
      unsigned char* dst = out + n * w.K;
      for (long k = 0; k < w.K; k += 8) {
        uint64_t u = 0;
        std::memcpy(&u, src + k / 8 * w.bits, w.bits);
        for (int j = 0; j < 8; ++j)
          dst[k + j] = static_cast<unsigned char>(u >> (j * w.bits) & mask);
      }
    }
  });
}

// What the packing reads for w: w itself, or for a 5/6-bit weight its byte-wide copy (an 8-bit
// layout) made into `wide` for the packing only; the packed kernel reads nothing else.
QWeight packing_source(const QWeight& w, std::unique_ptr<Mapping>& wide) {
  if (w.bits != 5 && w.bits != 6) return w;
  wide = std::make_unique<Mapping>(static_cast<size_t>(w.N) * w.K, widened_held);
  widen(w, wide->p);
  QWeight src = w;
  src.w = wide->p;
  src.bits = 8;
  return src;
}

}  // namespace

// The owner's control block, not the address, names the weight: a freed buffer's address can
// return.
const unsigned char* packed_weight(const QWeight& w) {
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.map.find(w.w);
  if (it != c.map.end()) {
    const Packed& p = it->second;
    if (same_weight(p, w)) return p.p;
    // A live weight packed in place is its packed copy: there are no MLX bytes to pack again.
    check(p.data || p.owner.expired() || !same_owner(p.owner, w.owner), "quantized_matmul",
          "a weight packed in place met other scales or another layout than ",
          "it was packed with");
    c.map.erase(it);
  }
  c.drop_expired();
  std::unique_ptr<Mapping> wide;
  const QWeight src = packing_source(w, wide);
  auto data =
      std::make_unique<Mapping>(static_cast<size_t>(packed_bytes(src, w.bits)), packed_held);
  pack(src, data->p, w.bits);
  const unsigned char* p = data->p;
  c.map.emplace(w.w, Packed{w.owner, w.scales, w.N, w.K, w.group_size, w.bits, w.scale_type,
                            std::move(data), p});
  return p;
}

namespace {

// `bytes` in their own anonymous mapping after a header page whose last 8 bytes hold the size,
// where MLX's CPU buffers keep it (the data page-aligned); nullopt where MLX's buffers have
// another layout (checked at run time).
struct HeadedMapping {
  unsigned char* base;
  size_t total;
  mx::allocator::Buffer buf;
};
constexpr size_t kHead = 4096;  // the header page
std::optional<HeadedMapping> headed_mapping(size_t bytes, const char* what) {
  const size_t total = kHead + std::max<size_t>(bytes, 1);
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(m != MAP_FAILED, "quantized_matmul", "out of memory ", what, " of ", bytes, " bytes");
  auto* base = static_cast<unsigned char*>(m);
  mx::allocator::Buffer buf(base + kHead - sizeof(size_t));
  if (buf.raw_ptr() != base + kHead) {
    munmap(m, total);
    return std::nullopt;
  }
  std::memcpy(base + kHead - sizeof(size_t), &bytes, sizeof(size_t));
  return HeadedMapping{base, total, buf};
}

// An array over a buffer of `bytes` in its own anonymous mapping (as a Mapping: outside the
// malloc heap, where the packed copies made prefill 12-15% slower, and on huge pages where the
// kernel allows), freed with the array; where headed_mapping cannot serve, MLX's allocator gives
// the buffer.
mx::array in_place_array(size_t bytes, const mx::Shape& shape, mx::Dtype dtype) {
  in_place_held += bytes;
  const std::optional<HeadedMapping> h = headed_mapping(bytes, "packing a weight");
  if (!h)
    return mx::array(mx::allocator::Data(mx::allocator::allocator().malloc(bytes),
                                         [bytes](mx::allocator::Buffer b) {
                                           mx::allocator::allocator().free(b);
                                           in_place_held -= bytes;
                                         }),
                     shape, dtype);
  madvise(h->base + kHead, bytes, MADV_HUGEPAGE);
  return mx::array(
      mx::allocator::Data(h->buf,
                          [base = h->base, total = h->total, bytes](mx::allocator::Buffer) {
                            munmap(base, total);
                            in_place_held -= bytes;
                          }),
      shape, dtype);
}

}  // namespace

std::optional<mx::array> pack_in_place(const mx::array& w, const mx::array& scales,
                                       const mx::array& biases, int group_size, int bits,
                                       bool consume) {
  const Isa isa = active_isa();
  const bool wide = widened_bits(bits);  // packed from its byte-wide copy, as packed_weight does
  if (int8_mode() == Int8Mode::off || !int8_packed(isa) || (bits != 4 && bits != 8 && !wide) ||
      int8_max_bits(isa) < (wide ? 8 : bits) || w.ndim() != 2 || w.dtype() != mx::uint32)
    return std::nullopt;
  mx::eval(w, scales, biases);
  if (!w.flags().row_contiguous || !scales.flags().row_contiguous || !biases.flags().row_contiguous)
    return std::nullopt;  // the kernel's own error at the first call
  const QWeight q = qweight(w, scales, biases, group_size, bits);
  std::unique_ptr<Mapping> bytewide;
  const QWeight src = packing_source(q, bytewide);
  if (wide && consume && w.is_donatable()) drop_pages(q.w, w.nbytes());  // read: the copy has them
  const size_t bytes = static_cast<size_t>(packed_bytes(src, bits));
  check(bytes >= w.nbytes(), "pack_in_place", "a packed copy of ", bytes,
        " bytes is smaller than the weight's ", w.nbytes());
  mx::array out = in_place_array(bytes, w.shape(), w.dtype());
  auto* p = out.data<unsigned char>();
  // Padding rows 0 (the last block's); pack writes every other byte, so the pages of the copy
  // are touched as it goes while w's go (consume).
  const long last =
      packed_bytes(src, bits) -
      (src.K / src.group_size) * pack_group_bytes(src.group_size, bits, src.scale_type);
  std::memset(p + last, 0, bytes - last);
  // w's own pages go as they are packed where w is its caller's only handle on them.
  pack(src, p, bits, consume && !wide && w.is_donatable());
  bytewide.reset();
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.erase(p);
  c.drop_expired();
  c.map.emplace(p, Packed{out.data_shared_ptr(), q.scales, q.N, q.K, group_size, bits, q.scale_type,
                          nullptr, p});
  return out;
}

namespace {

// An array of `shape` over address space only: its bytes are never mapped in, and reading them
// faults. Null where MLX's buffers have another layout (headed_mapping).
std::optional<mx::array> reserved_array(const mx::Shape& shape, mx::Dtype dtype) {
  size_t bytes = dtype.size();
  for (int d : shape) bytes *= static_cast<size_t>(d);
  const std::optional<HeadedMapping> h = headed_mapping(bytes, "reserving scales");
  if (!h) return std::nullopt;
  mprotect(h->base + kHead, h->total - kHead, PROT_NONE);
  return mx::array(mx::allocator::Data(h->buf, [base = h->base, total = h->total](
                                                   mx::allocator::Buffer) { munmap(base, total); }),
                   shape, dtype);
}

mx::Dtype scale_dtype(ScaleType t) {
  return t == ScaleType::f32 ? mx::float32 : t == ScaleType::bf16 ? mx::bfloat16 : mx::float16;
}

}  // namespace

std::optional<std::pair<mx::array, mx::array>> scales_in_place(const mx::array& w) {
  if (w.ndim() != 2 || w.dtype() != mx::uint32 || !w.data_shared_ptr()) return std::nullopt;
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.map.find(w.data<unsigned char>());
  if (it == c.map.end() || it->second.data || it->second.owner.expired() ||
      !same_owner(it->second.owner, w.data_shared_ptr()))
    return std::nullopt;
  Packed& p = it->second;
  const mx::Shape shape{p.N, p.K / p.group_size};
  std::optional<mx::array> s = reserved_array(shape, scale_dtype(p.scale_type));
  std::optional<mx::array> b = reserved_array(shape, scale_dtype(p.scale_type));
  if (!s || !b) return std::nullopt;
  p.scales = s->data<void>();  // the kernels name the weight by its scales too (same_weight)
  return std::pair{*s, *b};
}

bool packed_in_place(const mx::array& w) {
  return w.ndim() == 2 && w.dtype() == mx::uint32 && w.data_shared_ptr() &&
         in_place(w.data<unsigned char>(), w.data_shared_ptr()).has_value();
}

KernelCopies kernel_copies() {
  return {packed_held.load(), widened_held.load(), in_place_held.load()};
}

namespace {

struct Widened {
  std::weak_ptr<void> owner;
  const void* scales;
  int N, K, group_size, bits;
  std::shared_ptr<Mapping> data;  // the widened weight's owner (its packed copy's name)
};

}  // namespace

// As packed_weight: named by the owner, copies of freed weights dropped at the next widening.
QWeight widened_weight(const QWeight& w) {
  if (w.bits != 5 && w.bits != 6) return w;
  static std::mutex mu;
  static std::unordered_map<const unsigned char*, Widened> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto as_8bit = [&](const Widened& c) {
    QWeight q = w;
    q.w = c.data->p;
    q.bits = 8;
    q.owner = c.data;
    return q;
  };
  auto it = cache.find(w.w);
  if (it != cache.end()) {
    const Widened& c = it->second;
    if (same_owner(c.owner, w.owner) && !c.owner.expired() && c.scales == w.scales && c.N == w.N &&
        c.K == w.K && c.group_size == w.group_size && c.bits == w.bits)
      return as_8bit(c);
    cache.erase(it);
  }
  for (auto i = cache.begin(); i != cache.end();)
    i = i->second.owner.expired() ? cache.erase(i) : std::next(i);
  Widened c{w.owner,
            w.scales,
            w.N,
            w.K,
            w.group_size,
            w.bits,
            std::make_shared<Mapping>(static_cast<size_t>(w.N) * w.K, widened_held)};
  widen(w, c.data->p);
  return as_8bit(cache.emplace(w.w, std::move(c)).first->second);
}

std::optional<AffineWeight> widen_mxfp4(const mx::array& w, const mx::array& scales) {
  const char* where = "widen_mxfp4";
  check(w.dtype() == mx::uint32 && scales.dtype() == mx::uint8, where,
        "expected a uint32 weight and uint8 scales, got ", w.dtype(), " and ", scales.dtype());
  check(w.ndim() >= 2 && scales.ndim() == w.ndim(), where,
        "expected w (..., N, K / 8) and scales (..., N, K / 32), got ", w.ndim(), " and ",
        scales.ndim(), " dims");
  mx::Shape want = w.shape();
  want.back() = w.shape(-1) / 4;
  check(w.shape(-1) % 4 == 0 && scales.shape() == want, where, "scales must be (..., ", w.shape(-2),
        ", ", w.shape(-1) / 4, ") for a weight of ", w.shape(-1), " words a row");
  const mx::array wc = mx::contiguous(w), sc = mx::contiguous(scales);
  mx::eval(wc, sc);
  const uint8_t* e = sc.data<uint8_t>();
  const size_t groups = sc.size();
  if (std::any_of(e, e + groups, [](uint8_t b) { return b > 251; })) return std::nullopt;
  // e2m1 nibble (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6) -> 2v + 12.
  static constexpr unsigned char kByte[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                              12, 11, 10, 9,  8,  6,  4,  0};
  mx::Shape wshape = w.shape();
  wshape.back() = w.shape(-1) * 2;
  AffineWeight out{mx::array(mx::allocator::malloc(groups * 32), wshape, mx::uint32),
                   mx::array(mx::allocator::malloc(groups * 2), scales.shape(), mx::bfloat16),
                   mx::array(mx::allocator::malloc(groups * 2), scales.shape(), mx::bfloat16)};
  const auto* src = wc.data<unsigned char>();  // 16 bytes a group: element 2j low nibble of byte j
  auto* dst = out.w.data<unsigned char>();
  auto* sd = out.scales.data<mx::bfloat16_t>();
  auto* bd = out.biases.data<mx::bfloat16_t>();
  parallel_for(static_cast<int>((groups + 4095) / 4096), [&](int t) {
    for (size_t g = 4096 * static_cast<size_t>(t); g < std::min(groups, 4096 * (t + size_t{1}));
         ++g) {
      for (int j = 0; j < 16; ++j) {
        const unsigned char v = src[16 * g + j];
        dst[32 * g + 2 * j] = kByte[v & 0xF];
        dst[32 * g + 2 * j + 1] = kByte[v >> 4];
      }
      // Exact: 2^(e - 128) >= 2^-128 is a float32 and bfloat16 subnormal at worst, and 12 times
      // it needs two significant bits.
      const float scale = std::ldexp(1.0f, static_cast<int>(e[g]) - 128);
      sd[g] = static_cast<mx::bfloat16_t>(scale);
      bd[g] = static_cast<mx::bfloat16_t>(-12.0f * scale);
    }
  });
  return out;
}

void prepack(const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size,
             int bits) {
  const bool wide = widened_bits(bits) && int8_max_bits(active_isa()) >= 8;
  const bool pack = (bits == 4 || bits == 8 || wide) && int8_packed(active_isa());
  if (int8_mode() == Int8Mode::off || !(wide || pack)) return;
  mx::eval(w, scales, biases);
  // Other layouts keep the kernel's own error at the first call.
  if (!w.flags().row_contiguous || !scales.flags().row_contiguous || !biases.flags().row_contiguous)
    return;
  const QWeight q = qweight(w, scales, biases, group_size, bits);
  if (pack)
    packed_weight(q);  // a 5/6-bit weight's byte-wide copy only while it is packed
  else
    widened_weight(q);
}

namespace {

// The weight as the int8 kernels read it: a 5/6-bit one through its packed copy (5/6-bit,
// packed from a byte-wide copy made for the packing only) or else as 8 bits, its byte-wide copy
// (widened_weight).
QWeight int8_layout(const QWeight& w, bool packed) {
  if (!widened_bits(w.bits)) return w;
  if (!packed) return widened_weight(w);
  return w;  // its bytes are read from packed_weight(w), 5/6-bit (pack_planes)
}

// ws: the weights as stored (5/6-bit ones too, taken as int8_layout).
void qmm_i8(int n, const QWeight* ws, const float* x, int M, float* const* outs, Isa isa) {
  const QmmI8Kernel kernel = i8_kernel(isa);
  const bool packed = kernel.packed_rows && packing();
  const QWeight w = int8_layout(ws[0], packed);
  const bool tile = !packed && kernel.tile_rows && (M >= kernel.tile_min_rows || w.bits == 8);
  thread_local I8Rows xq;  // reused across calls: a decode step makes hundreds
  xq.q.resize(static_cast<size_t>(M) * 2 * w.K);
  xq.d.resize(static_cast<size_t>(M) * (w.K / 32));
  xq.sum.resize(static_cast<size_t>(M) * (w.K / w.group_size));
  xq.bsum.resize(w.K / 32);
  // The packed layout takes xq in input order, as 8-bit weights do.
  kernel.quantize(x, M, w.K, w.group_size, packed || tile ? 8 : w.bits, xq.q.data(), xq.d.data(),
                  xq.sum.data(), xq.bsum.data());
  if (tile) {  // QmmI8Args::x16
    xq.q16.resize(static_cast<size_t>(M) * w.K);
    for (long m = 0; m < M; ++m)
      for (long k = 0; k < w.K; ++k)
        xq.q16[m * w.K + k] =
            static_cast<short>(128 * xq.q[2 * m * w.K + k] + xq.q[(2 * m + 1) * w.K + k]);
  }
  std::vector<QmmI8Args> args(n);
  for (int i = 0; i < n; ++i) {
    QmmI8Args& a = args[i];
    set_weight(a, int8_layout(ws[i], packed), M, outs[i]);
    a.x16 = xq.q16.data();
    if (packed) a.w = packed_weight(ws[i]);
    a.xq = xq.q.data();
    a.xd = xq.d.data();
    a.xsum = xq.sum.data();
  }
  if (packed) {
    for_rows(n, ws, M, [&](int i, int n0, int n1) { kernel.packed_rows(args[i], n0, n1); });
    return;
  }
  const QmmI8RowsFn rows = tile ? kernel.tile_rows : kernel.rows;
  for_rows(n, ws, M, [&](int i, int n0, int n1) {
    thread_local std::vector<float> sbuf;
    // QmmI8RowsFn: rows needs 8 K / 32, tile_rows 3 * 8 per group and 8 per x row of a pass.
    const size_t need = 24 * static_cast<size_t>(w.K / 32) + 256;
    if (sbuf.size() < need) sbuf.resize(need);
    rows(args[i], n0, n1, sbuf.data());
  });
}

void qmm_float(int n, const QWeight* ws, const float* x, int M, float* const* outs, Isa isa) {
  const QWeight& w = ws[0];
  QmmRowsFn kernel = kernels_for(isa).qmm_rows;
  std::vector<float> perm;
  if (w.bits == 4) {
    // Per block of 32: even elements first, then odd ones (QmmArgs::x).
    perm.resize(static_cast<size_t>(M) * w.K);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < w.K; b += 32)
        for (int64_t j = 0; j < 16; ++j) {
          perm[r * w.K + b + j] = x[r * w.K + b + 2 * j];
          perm[r * w.K + b + 16 + j] = x[r * w.K + b + 2 * j + 1];
        }
  }
  std::vector<QmmArgs> args(n);
  for (int i = 0; i < n; ++i) {
    QmmArgs& a = args[i];
    set_weight(a, ws[i], M, outs[i]);
    a.x = w.bits == 4 ? perm.data() : x;
  }
  for_rows(n, ws, M, [&](int i, int n0, int n1) {
    thread_local std::vector<float> wbuf;
    const size_t need = 4 * static_cast<size_t>(w.K);
    if (wbuf.size() < need) wbuf.resize(need);
    kernel(args[i], n0, n1, wbuf.data());
  });
}

}  // namespace

void qmm_f32(const QWeight& w, const float* x, int M, float* out, Isa isa, Int8Mode int8) {
  qmm_f32_shared(&w, 1, x, M, &out, isa, int8);
}

void qmm_f32_shared(const QWeight* ws, int n, const float* x, int M, float* const* outs, Isa isa,
                    Int8Mode int8) {
  bool same = true;
  for (int i = 1; i < n; ++i)
    same = same && ws[i].K == ws[0].K && ws[i].bits == ws[0].bits &&
           ws[i].group_size == ws[0].group_size;
  if (!same) {
    for (int i = 0; i < n; ++i) qmm_f32_shared(ws + i, 1, x, M, outs + i, isa, int8);
    return;
  }
  const bool int8_path = uses_int8(ws[0], M, isa, int8);
  if ((!int8_path || !i8_kernel(isa).packed_rows || !packing()) && in_place_held.load() > 0) {
    // A weight packed in place has no MLX layout to read: the paths other than the packed
    // kernel (LMX_CPU_INT8=0, LMX_CPU_PACK=0 after the load) read it rebuilt for the call.
    std::vector<QWeight> plain(ws, ws + n);
    std::vector<std::vector<unsigned char>> bytes;
    for (QWeight& w : plain) {
      const std::optional<PackedRows> p = in_place(w.w, w.owner);
      if (!p) continue;
      // The scales and biases too: where they were dropped (scales_in_place), the packed copy
      // holds the only ones.
      const long row = static_cast<long>(w.K) * w.bits / 8;
      const long srow = static_cast<long>(w.K / w.group_size) * scale_bytes(p->scale_type);
      bytes.emplace_back(static_cast<size_t>(w.N) * (row + 2 * srow));
      unsigned char* out = bytes.back().data();
      unsigned char* sc = out + static_cast<long>(w.N) * row;
      unsigned char* bi = sc + static_cast<long>(w.N) * srow;
      parallel_for((w.N + 63) / 64, [&](int t) {
        for (long r = 64L * t; r < std::min<long>(w.N, 64L * t + 64); ++r) {
          unpack_row(*p, r, out + r * row);
          unpack_affine_row(*p, r, sc + r * srow, bi + r * srow);
        }
      });
      w.w = out;
      w.scales = sc;
      w.biases = bi;
      w.owner = {};
    }
    if (!bytes.empty()) {
      qmm_f32_shared(plain.data(), n, x, M, outs, isa, int8);
      return;
    }
  }
  if (int8_path) {
    qmm_i8(n, ws, x, M, outs, isa);
  } else {
    qmm_float(n, ws, x, M, outs, isa);
  }
}

void to_f32_rows(const mx::array& x, float* out) {
  const int K = x.shape(-1);
  const int M = static_cast<int>(x.size() / K);
  if (x.dtype() == mx::float32)
    rows_to_f32<float>(x, M, K, out);
  else if (x.dtype() == mx::bfloat16)
    rows_to_f32<mx::bfloat16_t>(x, M, K, out);
  else
    rows_to_f32<mx::float16_t>(x, M, K, out);
}

void from_f32(const float* src, mx::array& out) {
  const size_t n = out.size();
  if (out.dtype() == mx::float32) {
    std::memcpy(out.data<float>(), src, n * sizeof(float));
  } else if (out.dtype() == mx::bfloat16) {
    auto* o = out.data<mx::bfloat16_t>();
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<mx::bfloat16_t>(src[i]);
  } else {
    auto* o = out.data<mx::float16_t>();
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<mx::float16_t>(src[i]);
  }
}

bool supports(int bits, int group_size, const std::string& mode, mx::Dtype scale_dtype) {
  const bool b = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  const bool g = group_size == 32 || group_size == 64 || group_size == 128;
  const bool s =
      scale_dtype == mx::float32 || scale_dtype == mx::bfloat16 || scale_dtype == mx::float16;
  return b && g && s && mode == "affine";
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, const QmmOptions& opt) {
  const char* where = "quantized_matmul";
  check(supports(opt.bits, opt.group_size, "affine", scales.dtype()), where,
        "unsupported layout, expected bits 2/3/4/5/6/8, group size 32/64/128 and float scales, "
        "got bits=",
        opt.bits, " group_size=", opt.group_size, " scales ", scales.dtype());
  check(x.ndim() >= 1 && w.ndim() == 2 && w.dtype() == mx::uint32, where,
        "expected x (..., K) and a 2-D uint32 weight, got x of ", x.ndim(), " dims, weight of ",
        w.ndim(), " dims");
  check(x.dtype() == mx::float32 || x.dtype() == mx::bfloat16 || x.dtype() == mx::float16, where,
        "x must be float32, bfloat16 or float16, got ", x.dtype());
  const int K = x.shape(-1);
  const int N = w.shape(0);
  check(w.shape(1) * 32 == K * opt.bits, where, "x has K=", K, ", expected ",
        w.shape(1) * 32 / opt.bits, " for the packed weight of ", w.shape(1), " words");
  const mx::Shape gshape{N, K / opt.group_size};
  check(K % opt.group_size == 0 && scales.shape() == gshape && biases.shape() == gshape &&
            biases.dtype() == scales.dtype(),
        where, "scales and biases must both be (", N, ", ", K / opt.group_size, ") of one dtype");
  mx::Shape out_shape = x.shape();
  out_shape.back() = N;
  const Isa isa = opt.isa.value_or(active_isa());
  kernels_for(isa);  // a forced ISA the CPU lacks fails here, not inside eval
  // MLX's quantized_matmul: the result type of x and the scales.
  return mx::array(
      out_shape, opt.out_dtype.value_or(mx::promote_types(x.dtype(), scales.dtype())),
      std::make_shared<LmxQuantizedMatmul>(mx::default_stream(mx::Device::cpu), opt.group_size,
                                           opt.bits, isa, opt.int8.value_or(int8_mode())),
      {x, w, scales, biases});
}

namespace {

// packed_take: rows of a weight packed in place, or of its scales or biases, rebuilt in MLX's
// layout.
class LmxPackedTake : public mx::UnaryPrimitive {
 public:
  LmxPackedTake(mx::Stream s, PackedPart part, int cols)
      : mx::UnaryPrimitive(s), part_(part), cols_(cols) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& ids = inputs[0];
    const mx::array& w = inputs[1];
    const std::optional<PackedRows> p = in_place(w.data<unsigned char>(), w.data_shared_ptr());
    check(p.has_value(), "packed_take", "the weight is not packed in place");
    check(ids.flags().row_contiguous && ids.dtype() == mx::int32, "packed_take",
          "expected row-contiguous int32 ids");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(ids);
    enc.set_input_array(w);
    enc.set_output_array(out);
    enc.dispatch([p = *p, part = part_, ids = mx::array::unsafe_weak_copy(ids),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      const long row = part == PackedPart::weight
                           ? static_cast<long>(p.K) * p.bits / 8
                           : static_cast<long>(p.K / p.group_size) * scale_bytes(p.scale_type);
      std::vector<unsigned char> other(part == PackedPart::weight ? 0 : row);
      const int32_t* id = ids.data<int32_t>();
      auto* o = out.data<unsigned char>();
      for (size_t i = 0; i < ids.size(); ++i) {
        // As MLX's take: a negative id counts from the end; one out of range (which take does
        // not check) is clamped rather than read past the weight.
        const long r = std::clamp<long>(id[i] < 0 ? id[i] + p.N : id[i], 0, p.N - 1);
        unsigned char* dst = o + static_cast<long>(i) * row;
        if (part == PackedPart::weight)
          unpack_row(p, r, dst);
        else if (part == PackedPart::scales)
          unpack_affine_row(p, r, dst, other.data());
        else
          unpack_affine_row(p, r, other.data(), dst);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("packed_take", "a weight packed in place has no GPU implementation");
  }

  const char* name() const override { return "LmxPackedTake"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return static_cast<const LmxPackedTake&>(other).part_ == part_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.push_back(cols_);
    return {s};
  }

 private:
  PackedPart part_;
  int cols_;  // per id: K * bits / 32 words, or K / group_size scales
};

}  // namespace

mx::array packed_take(const mx::array& w, const mx::array& ids, PackedPart part) {
  check(w.ndim() == 2 && w.dtype() == mx::uint32, "packed_take", "expected a 2-D uint32 weight");
  mx::Shape shape = ids.shape();
  mx::Dtype dtype = mx::uint32;
  if (part == PackedPart::weight) {
    shape.push_back(w.shape(1));
  } else {
    // The layout is known once w is evaluated; a weight packed in place always is.
    const std::optional<PackedRows> p = in_place(w.data<unsigned char>(), w.data_shared_ptr());
    check(p.has_value(), "packed_take", "the weight is not packed in place");
    shape.push_back(p->K / p->group_size);
    dtype = scale_dtype(p->scale_type);
  }
  return mx::array(
      shape, dtype,
      std::make_shared<LmxPackedTake>(mx::default_stream(mx::Device::cpu), part, shape.back()),
      {mx::contiguous(mx::astype(ids, mx::int32)), w});
}

mx::array quantized_matmul_reference(const mx::array& x, const mx::array& w,
                                     const mx::array& scales, const mx::array& biases,
                                     int group_size, int bits) {
  mx::array wf = mx::dequantize(w, mx::astype(scales, mx::float32), mx::astype(biases, mx::float32),
                                group_size, bits);
  return mx::matmul(mx::astype(x, mx::float32), mx::transpose(wf));
}

void qmm_f32_pairs(const QWeight* ws, int n, const float* const* xs, const int* Ms,
                   float* const* outs, Isa isa, Int8Mode int8) {
  // Per pair, the path qmm_f32 would take for its rows: int8 (packed, tiles or rows) or float.
  enum class Path { float32, rows, tile, packed };
  const QmmI8Kernel kernel = i8_kernel(isa);
  const QmmRowsFn float_rows = kernels_for(isa).qmm_rows;
  std::vector<Path> path(n);
  std::vector<I8Rows> xq(n);
  std::vector<std::vector<float>> perm(n);
  std::vector<QmmI8Args> a8(n);
  std::vector<QmmArgs> af(n);
  std::vector<int> first(n + 1, 0);
  int max_k = 0;
  const bool packed = kernel.packed_rows && packing();
  for (int i = 0; i < n; ++i) {
    const int M = Ms[i];
    const QWeight w = M > 0 && uses_int8(ws[i], M, isa, int8) ? int8_layout(ws[i], packed) : ws[i];
    max_k = std::max(max_k, w.K);
    first[i + 1] =
        first[i] + (M > 0 ? (w.N + rows_per_task(w.N, M) - 1) / rows_per_task(w.N, M) : 0);
    if (M <= 0) continue;
    if (uses_int8(w, M, isa, int8)) {
      const bool tile = !packed && kernel.tile_rows && (M >= kernel.tile_min_rows || w.bits == 8);
      path[i] = packed ? Path::packed : tile ? Path::tile : Path::rows;
      I8Rows& q = xq[i];
      q.q.resize(static_cast<size_t>(M) * 2 * w.K);
      q.d.resize(static_cast<size_t>(M) * (w.K / 32));
      q.sum.resize(static_cast<size_t>(M) * (w.K / w.group_size));
      q.bsum.resize(w.K / 32);
      kernel.quantize(xs[i], M, w.K, w.group_size, packed || tile ? 8 : w.bits, q.q.data(),
                      q.d.data(), q.sum.data(), q.bsum.data());
      if (tile) {
        q.q16.resize(static_cast<size_t>(M) * w.K);
        for (long m = 0; m < M; ++m)
          for (long k = 0; k < w.K; ++k)
            q.q16[m * w.K + k] =
                static_cast<short>(128 * q.q[2 * m * w.K + k] + q.q[(2 * m + 1) * w.K + k]);
      }
      QmmI8Args& a = a8[i];
      set_weight(a, w, M, outs[i]);
      a.x16 = q.q16.data();
      if (packed) a.w = packed_weight(ws[i]);
      a.xq = q.q.data();
      a.xd = q.d.data();
      a.xsum = q.sum.data();
    } else {
      path[i] = Path::float32;
      const float* x = xs[i];
      if (w.bits == 4) {  // QmmArgs::x: per block of 32, even elements then odd ones
        perm[i].resize(static_cast<size_t>(M) * w.K);
        for (int64_t r = 0; r < M; ++r)
          for (int64_t b = 0; b < w.K; b += 32)
            for (int64_t j = 0; j < 16; ++j) {
              perm[i][r * w.K + b + j] = x[r * w.K + b + 2 * j];
              perm[i][r * w.K + b + 16 + j] = x[r * w.K + b + 2 * j + 1];
            }
        x = perm[i].data();
      }
      set_weight(af[i], w, M, outs[i]);
      af[i].x = x;
    }
  }
  parallel_for(first[n], [&](int t) {
    const int i =
        static_cast<int>(std::upper_bound(first.begin(), first.end(), t) - first.begin()) - 1;
    const QWeight& w = ws[i];
    const int per = rows_per_task(w.N, Ms[i]);
    const int n0 = (t - first[i]) * per, n1 = std::min(w.N, n0 + per);
    thread_local std::vector<float> buf;
    // QmmRowsFn: 4 K; QmmI8RowsFn: rows 8 K / 32, tile_rows 3 * 8 per group and 8 per x row.
    const size_t need =
        std::max(4 * static_cast<size_t>(max_k), 24 * static_cast<size_t>(max_k / 32) + 256);
    if (buf.size() < need) buf.resize(need);
    switch (path[i]) {
      case Path::float32:
        float_rows(af[i], n0, n1, buf.data());
        break;
      case Path::packed:
        kernel.packed_rows(a8[i], n0, n1);
        break;
      case Path::tile:
        kernel.tile_rows(a8[i], n0, n1, buf.data());
        break;
      case Path::rows:
        kernel.rows(a8[i], n0, n1, buf.data());
        break;
    }
  });
}

}  // namespace lmx::kernels::cpu
