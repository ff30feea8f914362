#include "nn/layers.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <numbers>
#include <typeinfo>

#include "cache/rows_cache.h"
#include "core/error.h"
#include "engine/memory.h"
#include "kernels/cpu/fused.h"
#include "kernels/cpu/qmm.h"
#include "kernels/cuda/qmm.h"
#include "kernels/cuda/routing.h"
#include "kernels/cuda/rows_attention.h"
#include "nn/adapter_router.h"
#include "nn/rows_tier.h"

namespace lmx::nn {

namespace {

// x[b:b + 1] along the batch axis.
mx::array row_of(const mx::array& x, int b) {
  mx::Shape start(x.ndim(), 0), stop = x.shape();
  start[0] = b;
  stop[0] = b + 1;
  return mx::slice(x, start, stop);
}

mx::Shape packed_shape(int out, int in, const QuantSpec& q) { return {out, in * q.bits / 32}; }

// Tier L3 for this quantized layer: the store asks for it and the kernels handle its layout.
bool use_cpu_kernel(const WeightStore& w, const QuantSpec& q, const mx::array& scales,
                    const std::optional<mx::array>& biases) {
  return w.cpu_kernels() && biases &&
         kernels::cpu::supports(q.bits, q.group_size, q.mode, scales.dtype());
}

// Tier L3 streams every weight byte once per token, and float32 scales and biases cost 2 of the
// 6 bits per weight of a 4-bit group-32 layer. Where both are float16 values exactly (a GGUF's
// Q4_1 / Q8_0 converted losslessly), they are kept as float16: the same numbers, 17% fewer bytes.
// Returns whether it did.
bool compact_scales(mx::array& scales, mx::array& biases) {
  if (scales.dtype() != mx::float32 || biases.dtype() != mx::float32) return false;
  mx::eval(scales, biases);  // a load-time step, not inside a forward
  if (!scales.flags().row_contiguous || !biases.flags().row_contiguous) return false;
  // On the host, value by value: stock ops' round trip and comparison held four temporaries of
  // the scales' size at once (~70 MB beside Gemma 3's embedding).
  auto exact = [](const mx::array& a) {
    const float* v = a.data<float>();
    for (size_t i = 0; i < a.size(); ++i)
      if (static_cast<float>(static_cast<mx::float16_t>(v[i])) != v[i])  // NaN too, as before
        return false;
    return true;
  };
  if (!exact(scales) || !exact(biases)) return false;
  auto narrow = [](const mx::array& a) {
    mx::array out(mx::allocator::malloc(a.size() * sizeof(mx::float16_t)), a.shape(), mx::float16);
    const float* v = a.data<float>();
    auto* o = out.data<mx::float16_t>();
    for (size_t i = 0; i < a.size(); ++i) o[i] = static_cast<mx::float16_t>(v[i]);
    return out;
  };
  scales = narrow(scales);
  biases = narrow(biases);
  return true;
}

// Tier L3's single copy of a weight (kernels/cpu/qmm.h pack_in_place): the checkpoint's arrays
// the layer holds or replaced leave the store at once, so the load never holds every tensor
// twice. weight: the layer is about to pack its weight in place.
void release_replaced(WeightStore& w, const std::string& path, bool weight, bool compacted) {
  if (weight) w.release(path + ".weight");
  if (compacted) {
    w.release(path + ".scales");
    w.release(path + ".biases");
  }
}

// The packed copy holds a weight's scales and biases too: MLX's go, for stand-ins that take no
// memory (kernels/cpu/qmm.h scales_in_place).
void drop_scales(const mx::array& packed, mx::array& scales, mx::array& biases) {
  if (auto s = kernels::cpu::scales_in_place(packed)) {
    scales = s->first;
    biases = s->second;
  }
}

// Tier L3 on the GPU: the store asks for it and the CUDA kernel handles the layout and shape
// (out features N, in features K); calls of more rows than it takes run mx::quantized_matmul.
bool use_cuda_kernel(const WeightStore& w, const QuantSpec& q, const mx::array& scales,
                     const std::optional<mx::array>& biases, int out, int in) {
  return w.cuda_kernels() && biases && kernels::cuda::routed(q.bits, q.group_size) &&
         kernels::cuda::supports(q.bits, q.group_size, q.mode, scales.dtype(), out, in);
}

mx::array cuda_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                      const mx::array& biases, const QuantSpec& q) {
  return kernels::cuda::quantized_matmul(x, w, scales, biases,
                                         {.group_size = q.group_size, .bits = q.bits});
}

mx::array kernel_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                        const mx::array& biases, const QuantSpec& q, bool from_mxfp4 = false) {
  kernels::cpu::QmmOptions opt;
  opt.group_size = q.group_size;
  opt.bits = q.bits;
  // The result type of stock quantized_matmul with the checkpoint's float32 scales, or x's for
  // MXFP4's uint8 ones.
  if (scales.dtype() == mx::float16) opt.out_dtype = mx::promote_types(x.dtype(), mx::float32);
  if (from_mxfp4) opt.out_dtype = x.dtype();
  return kernels::cpu::quantized_matmul(x, w, scales, biases, opt);
}

void check_quant(const std::string& path, int in, const QuantSpec& q, const std::string& source) {
  check(q.bits >= 1 && q.bits <= 8 && q.group_size > 0, source, "module '", path,
        "' has unsupported quantization bits=", q.bits, " group_size=", q.group_size);
  check(in % q.group_size == 0 && (in * q.bits) % 32 == 0, source, "module '", path,
        "' input size ", in, " is not divisible by group_size ", q.group_size);
}

}  // namespace

bool widen_mxfp4_weight(mx::array& weight, std::optional<mx::array>& scales,
                        std::optional<mx::array>& biases, std::optional<QuantSpec>& quant) {
  if (!quant || quant->mode != "mxfp4" || quant->bits != 4 || quant->group_size != 32 || !scales ||
      biases || scales->dtype() != mx::uint8 || !kernels::cpu::widening())
    return false;
  // The copy takes a byte a weight where MXFP4 takes 17/32 (2.1x; gpt-oss-20b's experts 10 ->
  // 21.5 GB), and the checkpoint's arrays stay until the load ends. Only while MemAvailable keeps
  // 1 GiB and a tenth of the copy spare: past that the layer stays on MLX's ops (slower, as
  // before), so a model that fit before this path still loads.
  const size_t copy = weight.nbytes() * 2 + scales->size() * 4;
  const size_t avail = available_memory_bytes();
  if (avail > 0 && copy + copy / 10 + (size_t{1} << 30) > avail) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr,
                   "lmx: memory is short for the byte-wide copy of MXFP4 weights; the rest stay "
                   "on MLX's kernels (docs/cpu.md)\n");
    });
    return false;
  }
  std::optional<kernels::cpu::AffineWeight> a = kernels::cpu::widen_mxfp4(weight, *scales);
  if (!a) return false;
  weight = a->w;
  scales = a->scales;
  biases = a->biases;
  quant = QuantSpec{.bits = 8, .group_size = 32, .mode = "affine"};
  return true;
}

Linear Linear::load(WeightStore& w, const std::string& path, int in, int out, bool has_bias) {
  Linear l;
  l.quant = w.quant_for(path, in);
  if (l.quant) {
    check_quant(path, in, *l.quant, w.source());
    l.weight = w.take(path + ".weight", packed_shape(out, in, *l.quant));
    l.scales = w.take(path + ".scales", {out, in / l.quant->group_size});
    l.biases = w.take_optional(path + ".biases", {out, in / l.quant->group_size});
    check(l.biases || l.quant->mode != "affine", w.source(), "missing tensor '", path,
          ".biases' of an affine-quantized module");
    l.cpu_kernel = use_cpu_kernel(w, *l.quant, *l.scales, l.biases);
    l.cuda_kernel = use_cuda_kernel(w, *l.quant, *l.scales, l.biases, out, in);
  } else {
    l.weight = w.take(path + ".weight", {out, in});
  }
  if (has_bias) l.bias = w.take(path + ".bias", {out});
  // Before compacting: DoRA dequantizes the checkpoint's scales itself.
  if (w.adapters()) l.adapters = w.adapters()->linear(path, l, in, out);
  if (w.router()) l.routed = {w.router(), w.router()->add_site({path, false, in, out})};
  // After the adapters: DoRA keeps MLX's MXFP4 arrays, as it keeps float32 scales.
  if (w.cpu_kernels() && widen_mxfp4_weight(l.weight, l.scales, l.biases, l.quant))
    l.cpu_kernel = l.from_mxfp4 = true;
  if (l.cpu_kernel) {
    const bool compacted = !l.from_mxfp4 && compact_scales(*l.scales, *l.biases);
    // One copy of the weight (docs/cpu.md): its packed copy in place of MLX's bytes where the
    // calls use it and no adapter reads the base weight (DoRA dequantizes it). The store lets go
    // of what the layer holds first, so the packing can consume MLX's bytes.
    if (!l.from_mxfp4) release_replaced(w, path, l.adapters.empty(), compacted);
    std::optional<mx::array> packed;
    if (l.adapters.empty())
      packed = kernels::cpu::pack_in_place(l.weight, *l.scales, *l.biases, l.quant->group_size,
                                           l.quant->bits, /*consume=*/true);
    if (packed) {
      l.weight = *packed;
      drop_scales(l.weight, *l.scales, *l.biases);
    } else
      kernels::cpu::prepack(l.weight, *l.scales, *l.biases, l.quant->group_size, l.quant->bits);
  }
  return l;
}

mx::array Linear::operator()(const mx::array& x) const {
  // DoRA computes the whole output (the loader refuses adapters on sharded layers).
  if (!adapters.empty() && adapters.front()->replaces_base()) return (*adapters.front())(x, x);
  mx::array y = base(x);
  if (all_reduce) y = (*all_reduce)(y);
  for (const auto& a : adapters) y = (*a)(x, y);
  if (routed.router) y = routed.router->linear(routed.site, x, y);
  return y;
}

bool RoutedSite::active() const { return router && router->applies(site); }

mx::array Linear::base(const mx::array& x) const {
  if (cpu_kernel) {
    mx::array y = kernel_matmul(x, weight, *scales, *biases, *quant, from_mxfp4);
    return bias ? mx::add(y, *bias) : y;
  }
  if (cuda_kernel) {
    mx::array y = cuda_matmul(x, weight, *scales, *biases, *quant);
    return bias ? mx::add(y, *bias) : y;
  }
  if (quant) {
    mx::array y = mx::quantized_matmul(x, weight, *scales, biases, true, quant->group_size,
                                       quant->bits, quant->mode);
    return bias ? mx::add(y, *bias) : y;
  }
  if (bias) return mx::addmm(*bias, x, mx::transpose(weight));
  return mx::matmul(x, mx::transpose(weight));
}

Embedding Embedding::load(WeightStore& w, const std::string& path, int vocab, int dims) {
  Embedding e;
  bool compacted = false;
  e.quant = w.quant_for(path, dims);
  if (e.quant) {
    check_quant(path, dims, *e.quant, w.source());
    e.weight = w.take(path + ".weight", packed_shape(vocab, dims, *e.quant));
    e.scales = w.take(path + ".scales", {vocab, dims / e.quant->group_size});
    e.biases = w.take_optional(path + ".biases", {vocab, dims / e.quant->group_size});
    e.cpu_kernel = use_cpu_kernel(w, *e.quant, *e.scales, e.biases);
    e.cuda_kernel = use_cuda_kernel(w, *e.quant, *e.scales, e.biases, vocab, dims);
    if (e.cpu_kernel) {
      e.lookup_dtype = e.scales->dtype();
      compacted = compact_scales(*e.scales, *e.biases);
    }
  } else {
    e.weight = w.take(path + ".weight", {vocab, dims});
  }
  if (w.adapters()) e.adapters = w.adapters()->embedding(path, e, vocab, dims);
  if (w.router()) e.routed = {w.router(), w.router()->add_site({path, true, vocab, dims})};
  // One copy (as Linear's): the head's packed copy, which the lookup gathers its rows from.
  if (e.cpu_kernel) release_replaced(w, path, e.adapters.empty(), compacted);
  if (e.cpu_kernel && e.adapters.empty()) {
    if (auto packed = kernels::cpu::pack_in_place(e.weight, *e.scales, *e.biases,
                                                  e.quant->group_size, e.quant->bits,
                                                  /*consume=*/true)) {
      e.weight = *packed;
      e.packed_in_place = true;
      drop_scales(e.weight, *e.scales, *e.biases);
    }
  }
  return e;
}

mx::array Embedding::operator()(const mx::array& ids) const {
  mx::array y = lookup(ids);
  for (const auto& a : adapters) y = a->lookup(ids, y);
  if (routed.router) y = routed.router->lookup(routed.site, ids, y);
  return y;
}

mx::array Embedding::as_linear(const mx::array& x) const {
  mx::array y = head(x);
  for (const auto& a : adapters) y = a->as_linear(x, y);
  if (routed.router) y = routed.router->head(routed.site, x, y);
  return y;
}

mx::array Embedding::lookup(const mx::array& ids) const {
  if (quant) {
    using kernels::cpu::PackedPart;
    auto take = [&](const mx::array& a, PackedPart part) {
      return packed_in_place ? kernels::cpu::packed_take(weight, ids, part) : mx::take(a, ids, 0);
    };
    std::optional<mx::array> b;
    if (biases) b = take(*biases, PackedPart::biases);
    mx::array e =
        mx::dequantize(take(weight, PackedPart::weight), take(*scales, PackedPart::scales), b,
                       quant->group_size, quant->bits, quant->mode);
    return lookup_dtype && e.dtype() != *lookup_dtype ? mx::astype(e, *lookup_dtype) : e;
  }
  return mx::take(weight, ids, 0);
}

mx::array Embedding::head(const mx::array& x) const {
  if (cpu_kernel) return kernel_matmul(x, weight, *scales, *biases, *quant);
  if (cuda_kernel) return cuda_matmul(x, weight, *scales, *biases, *quant);
  if (quant) {
    return mx::quantized_matmul(x, weight, *scales, biases, true, quant->group_size, quant->bits,
                                quant->mode);
  }
  return mx::matmul(x, mx::transpose(weight));
}

RMSNorm RMSNorm::load(WeightStore& w, const std::string& path, int dims, float eps) {
  return {w.take(path + ".weight", {dims}), eps};
}

mx::array RMSNorm::operator()(const mx::array& x) const {
  return mx::fast::rms_norm(x, weight, eps);
}

LayerNorm LayerNorm::load(WeightStore& w, const std::string& path, int dims, float eps) {
  return {w.take(path + ".weight", {dims}), w.take(path + ".bias", {dims}), eps};
}

mx::array LayerNorm::operator()(const mx::array& x) const {
  return mx::fast::layer_norm(x, weight, bias, eps);
}

mx::array RoPE::operator()(const mx::array& x, const KVCacheBase& cache) const {
  const auto* rows = dynamic_cast<const RowsKVCache*>(&cache);
  if (!rows) return (*this)(x, cache.offset());
  const int B = x.shape(0);
  if (dynamic || mscale != 1.0f) {
    // The dynamic base depends on the row's position: row by row.
    std::vector<mx::array> out;
    out.reserve(B);
    for (int b = 0; b < B; ++b) out.push_back((*this)(row_of(x, b), rows->row(b).offset()));
    return mx::concatenate(out, 0);
  }
  return mx::fast::rope(x, dims, traditional, base, scale, rows->offsets(), freqs);
}

mx::array RoPE::operator()(const mx::array& x, int offset) const {
  mx::array in = x;
  if (mscale != 1.0f) {
    // x.at[..., :dims].multiply(mscale): the constant is a weak scalar (rounded to x's dtype).
    const int last = x.shape(-1);
    mx::array s(mscale, x.dtype());
    if (dims == last) {
      in = mx::multiply(x, s);
    } else {
      mx::Shape start(x.ndim(), 0), stop = x.shape();
      stop.back() = dims;
      in = mx::slice_update(x, mx::multiply(mx::slice(x, start, stop), s), start, stop);
    }
  }
  if (dynamic) {
    const int seq_len = std::max(x.shape(-2) + offset, max_position_embeddings);
    const double b =
        static_cast<double>(*base) *
        std::pow(static_cast<double>(dynamic_factor) * seq_len / max_position_embeddings -
                     (static_cast<double>(dynamic_factor) - 1),
                 static_cast<double>(dims) / (dims - 2));
    return mx::fast::rope(in, dims, traditional, static_cast<float>(b), 1.0f, offset);
  }
  return mx::fast::rope(in, dims, traditional, base, scale, offset, freqs);
}

namespace {

// A Python float/int scalar meeting a float32 array: rounded to float32.
mx::array f32(double v) { return mx::array(static_cast<float>(v), mx::float32); }

double num(const json& scaling, const std::string& key, double fallback) {
  if (!scaling.contains(key) || scaling[key].is_null()) return fallback;
  return scaling[key].get<double>();
}

mx::array llama3_freqs(int dims, double base, const json& sc) {
  const double factor = sc.at("factor").get<double>();
  const double low = num(sc, "low_freq_factor", 1.0);
  const double high = num(sc, "high_freq_factor", 4.0);
  const double old_len = num(sc, "original_max_position_embeddings", 8192);
  const double low_wl = old_len / low;
  const double high_wl = old_len / high;
  // base ** (arange(0, dims, 2) / dims)
  mx::array exps = mx::divide(mx::arange(0, dims, 2), mx::array(dims));
  mx::array freqs = mx::power(f32(base), exps);
  mx::array wavelens = mx::multiply(f32(2 * std::numbers::pi), freqs);
  freqs = mx::where(mx::greater(wavelens, f32(low_wl)), mx::multiply(freqs, f32(factor)), freqs);
  mx::array medium =
      mx::logical_and(mx::greater(wavelens, f32(high_wl)), mx::less(wavelens, f32(low_wl)));
  mx::array smooth =
      mx::divide(mx::subtract(mx::divide(f32(old_len), wavelens), f32(low)), f32(high - low));
  mx::array smooth_freqs =
      mx::divide(freqs, mx::add(mx::divide(mx::subtract(f32(1), smooth), f32(factor)), smooth));
  return mx::where(medium, smooth_freqs, freqs);
}

struct Yarn {
  mx::array freqs;
  float mscale;
};

Yarn yarn_freqs(int dims, double base, const json& sc) {
  const double factor = sc.at("factor").get<double>();
  const double orig = num(sc, "original_max_position_embeddings", 4096);
  const double beta_fast = num(sc, "beta_fast", 32);
  const double beta_slow = num(sc, "beta_slow", 1);
  const double ms = num(sc, "mscale", 1);
  const double ms_all = num(sc, "mscale_all_dim", 0);
  auto correction_dim = [&](double rotations) {
    return (dims * std::log(orig / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  const double lo = std::max(std::floor(correction_dim(beta_fast)), 0.0);
  double hi = std::min(std::ceil(correction_dim(beta_slow)), static_cast<double>(dims - 1));
  auto get_mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  const double mscale = get_mscale(factor, ms) / get_mscale(factor, ms_all);
  mx::array extra =
      mx::power(f32(base), mx::divide(mx::arange(0, dims, 2, mx::float32), mx::array(dims)));
  mx::array inter = mx::multiply(f32(factor), extra);
  if (lo == hi) hi += 0.001;
  const int half = dims / 2;
  mx::array ramp =
      mx::clip(mx::divide(mx::subtract(mx::arange(half, mx::float32), f32(lo)), f32(hi - lo)),
               mx::array(0), mx::array(1));
  mx::array mask = mx::subtract(f32(1.0), ramp);
  mx::array freqs = mx::divide(
      mx::multiply(inter, extra),
      mx::add(mx::multiply(inter, mask), mx::multiply(extra, mx::subtract(f32(1), mask))));
  return {freqs, static_cast<float>(mscale)};
}

}  // namespace

RoPE su_scaled_rope(int dims, float base, int max_position_embeddings,
                    int original_max_position_embeddings, const json& long_factor,
                    const std::string& source) {
  check(original_max_position_embeddings > 0, source,
        "original_max_position_embeddings must be > 0, got ", original_max_position_embeddings);
  mx::array factors(0.0f);
  try {
    if (long_factor.is_array()) {
      const auto values = long_factor.get<std::vector<float>>();
      check(static_cast<int>(values.size()) == dims / 2, source, "rope_scaling long_factor has ",
            values.size(), " entries, expected ", dims / 2);
      factors = mx::array(values.data(), {static_cast<int>(values.size())}, mx::float32);
    } else {
      factors = mx::array(long_factor.get<float>(), mx::float32);
    }
  } catch (const json::exception&) {
    fail(source, "rope_scaling long_factor must be a number or a list of numbers, got ",
         long_factor.dump());
  }
  RoPE r;
  r.dims = dims;
  r.freqs = mx::multiply(
      factors,
      mx::power(f32(base), mx::divide(mx::arange(0, dims, 2, mx::float32), mx::array(dims))));
  const double factor =
      static_cast<double>(max_position_embeddings) / original_max_position_embeddings;
  if (factor > 1.0) {
    r.mscale = static_cast<float>(std::sqrt(
        1 + std::log(factor) / std::log(static_cast<double>(original_max_position_embeddings))));
  }
  return r;
}

RoPE make_rope(int dims, float base, bool traditional, const json& scaling,
               std::optional<int> max_position_embeddings, const std::string& source) {
  RoPE r;
  r.dims = dims;
  r.traditional = traditional;
  r.base = base;
  if (scaling.is_null()) return r;
  check(scaling.is_object(), source, "rope_scaling must be an object, got ", scaling.dump());
  std::string type = "default";
  if (scaling.contains("type") && scaling["type"].is_string()) {
    type = scaling["type"].get<std::string>();
  } else if (scaling.contains("rope_type") && scaling["rope_type"].is_string()) {
    type = scaling["rope_type"].get<std::string>();
  }
  auto need = [&](const char* key) {
    check(scaling.contains(key), source, "rope_scaling of type '", type, "' needs '", key, "'");
  };
  if (type == "default") return r;
  if (type == "linear") {
    need("factor");
    r.scale = static_cast<float>(1.0 / scaling["factor"].get<double>());
    return r;
  }
  if (type == "dynamic") {
    need("factor");
    check(max_position_embeddings.has_value(), source,
          "dynamic rope scaling needs max_position_embeddings");
    r.dynamic = true;
    r.dynamic_factor = scaling["factor"].get<float>();
    r.max_position_embeddings = *max_position_embeddings;
    return r;
  }
  if (type == "llama3") {
    need("factor");
    r.base.reset();
    r.freqs = llama3_freqs(dims, base, scaling);
    return r;
  }
  if (type == "yarn" || type == "deepseek_yarn" || type == "telechat3-yarn") {
    need("factor");
    Yarn y = yarn_freqs(dims, base, scaling);
    r.base.reset();
    r.freqs = y.freqs;
    r.mscale = y.mscale;
    return r;
  }
  if (type == "longrope") {
    need("original_max_position_embeddings");
    need("short_factor");
    need("long_factor");
    check(max_position_embeddings.has_value(), source,
          "longrope scaling needs max_position_embeddings");
    // SuScaledRoPE rotates halves whatever rope_traditional says.
    return su_scaled_rope(dims, base, *max_position_embeddings,
                          scaling["original_max_position_embeddings"].get<int>(),
                          scaling["long_factor"], source);
  }
  if (type == "proportional") {
    // Gemma 4's ProportionalRoPE: the leading rotated_dims frequencies base^(i / dims) (scaled
    // by factor), infinite ones (no rotation) for the rest of the head.
    const int rotated = static_cast<int>(dims * num(scaling, "partial_rotary_factor", 1.0));
    check(rotated <= dims, source, "partial_rotary_factor must be <= 1, got ",
          num(scaling, "partial_rotary_factor", 1.0));
    mx::array exps = mx::divide(mx::arange(0, rotated, 2, mx::float32), f32(dims));
    r.base.reset();
    r.freqs =
        mx::concatenate({mx::multiply(f32(num(scaling, "factor", 1.0)), mx::power(f32(base), exps)),
                         mx::full({(dims - rotated) / 2}, std::numeric_limits<float>::infinity())});
    return r;
  }
  fail(source, "unsupported rope_scaling type '", type,
       "', expected one of default, linear, dynamic, llama3, yarn, longrope, proportional");
}

namespace {

// The layers as kernels/cuda's fused calls take them, with their one layout; nullopt where one
// is not a plain quantized matmul on lmx's kernel or the kernel does not take x.
std::optional<std::pair<std::vector<kernels::cuda::QMatrix>, kernels::cuda::QmmOptions>> cuda_plain(
    const mx::array& x, const std::vector<const Linear*>& ls) {
  if (!ls[0]->cuda_kernel || !kernels::cuda::fused_routed()) return std::nullopt;
  std::vector<kernels::cuda::QMatrix> mats;
  for (const Linear* l : ls) {
    if (!l->cuda_kernel || l->bias || !l->adapters.empty() || l->routed.active() || l->all_reduce ||
        l->quant->bits != ls[0]->quant->bits || l->quant->group_size != ls[0]->quant->group_size)
      return std::nullopt;
    mats.push_back({l->weight, *l->scales, *l->biases});
  }
  const kernels::cuda::QmmOptions opt{.group_size = ls[0]->quant->group_size,
                                      .bits = ls[0]->quant->bits};
  if (!kernels::cuda::takes_fused(x, mats, opt)) return std::nullopt;
  return std::make_pair(std::move(mats), opt);
}

}  // namespace

namespace {

// The norm as the fused kernels take it, or nullopt where they cannot.
std::optional<std::optional<kernels::cuda::FusedNorm>> fused_norm(const mx::array& x,
                                                                  const RMSNorm* norm) {
  if (!norm) return std::optional<kernels::cuda::FusedNorm>();
  if (!kernels::cuda::norm_fold_routed() || norm->weight.dtype() != x.dtype() ||
      norm->weight.shape() != mx::Shape{x.shape(-1)})
    return std::nullopt;
  return std::optional<kernels::cuda::FusedNorm>(kernels::cuda::FusedNorm{norm->weight, norm->eps});
}

}  // namespace

std::optional<std::vector<mx::array>> cuda_fused_matmuls(const mx::array& x,
                                                         const std::vector<const Linear*>& ls,
                                                         const RMSNorm* norm) {
  auto p = cuda_plain(x, ls);
  if (!p) return std::nullopt;
  auto n = fused_norm(x, norm);
  if (!n) return std::nullopt;
  return kernels::cuda::qmv_multi(x, p->first, p->second, *n);
}

std::optional<mx::array> cuda_fused_add(const mx::array& x, const Linear& l,
                                        const mx::array& residual) {
  auto p = cuda_plain(x, {&l});
  if (!p || residual.dtype() != x.dtype()) return std::nullopt;
  mx::Shape shape = x.shape();
  shape.back() = l.weight.shape(0);
  if (residual.shape() != shape) return std::nullopt;
  return kernels::cuda::qmv_add(x, p->first[0], residual, p->second);
}

std::optional<mx::array> cuda_fused_swiglu(const mx::array& x, const Linear& gate, const Linear& up,
                                           const RMSNorm* norm) {
  auto p = cuda_plain(x, {&gate, &up});
  if (!p || gate.weight.shape(0) != up.weight.shape(0)) return std::nullopt;
  auto n = fused_norm(x, norm);
  if (!n) return std::nullopt;
  return kernels::cuda::qmv_swiglu(x, p->first[0], p->first[1], p->second, *n);
}

std::optional<std::pair<mx::array, mx::array>> cuda_qk_norm_rope(
    const mx::array& q, const mx::array& k, const RMSNorm* q_norm, const RMSNorm* k_norm,
    const RoPE& rope, const KVCacheBase& cache, int n_heads, int n_kv_heads, int head_dim) {
  if (dynamic_cast<const RowsKVCache*>(&cache) || rope.dims != head_dim || rope.traditional ||
      rope.dynamic || rope.mscale != 1.0f || (!rope.base && !rope.freqs) ||
      (q_norm == nullptr) != (k_norm == nullptr) ||
      (q_norm && (q_norm->eps != k_norm->eps || q_norm->weight.dtype() != q.dtype() ||
                  k_norm->weight.dtype() != q.dtype())))
    return std::nullopt;
  kernels::cuda::QkRopeOptions o{.n_heads = n_heads,
                                 .n_kv_heads = n_kv_heads,
                                 .head_dim = head_dim,
                                 .eps = q_norm ? q_norm->eps : 0.0f,
                                 .base = rope.base.value_or(0.0f),
                                 .scale = rope.scale,
                                 .offset = cache.offset()};
  if (!kernels::cuda::takes_qk_norm_rope(q, k, o)) return std::nullopt;
  if (q_norm && (q_norm->weight.shape() != mx::Shape{head_dim} ||
                 k_norm->weight.shape() != mx::Shape{head_dim}))
    return std::nullopt;
  if (rope.freqs &&
      (rope.freqs->dtype() != mx::float32 || rope.freqs->shape() != mx::Shape{head_dim / 2}))
    return std::nullopt;
  auto out = kernels::cuda::qk_norm_rope(
      q, k, q_norm ? std::optional<mx::array>(q_norm->weight) : std::nullopt,
      k_norm ? std::optional<mx::array>(k_norm->weight) : std::nullopt, rope.freqs, o);
  return std::make_pair(out[0], out[1]);
}

mx::array swiglu(const mx::array& gate, const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        const mx::array& g = in[0];
        return std::vector<mx::array>{mx::multiply(mx::multiply(g, mx::sigmoid(g)), in[1])};
      },
      /*shapeless=*/true);
  return fn({gate, x})[0];
}

mx::array gelu(const mx::array& x) {
  // x * (1 + erf(x / sqrt(2))) / 2
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        const mx::array& x = in[0];
        auto c = [&](double v) { return mx::array(static_cast<float>(v), x.dtype()); };
        mx::array e = mx::erf(mx::divide(x, c(std::sqrt(2.0))));
        return std::vector<mx::array>{mx::divide(mx::multiply(x, mx::add(c(1), e)), c(2))};
      },
      /*shapeless=*/true);
  return fn({x})[0];
}

mx::array gelu_approx(const mx::array& x) {
  // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        const mx::array& x = in[0];
        auto c = [&](double v) { return mx::array(static_cast<float>(v), x.dtype()); };
        mx::array cube = mx::multiply(c(0.044715), mx::power(x, c(3)));
        mx::array t = mx::tanh(mx::multiply(c(std::sqrt(2 / std::numbers::pi)), mx::add(x, cube)));
        return std::vector<mx::array>{mx::multiply(mx::multiply(c(0.5), x), mx::add(c(1), t))};
      },
      /*shapeless=*/true);
  return fn({x})[0];
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    const Mask& mask, const std::optional<mx::array>& sinks) {
  if (mask.array)
    return mx::fast::scaled_dot_product_attention(q, k, v, scale, "array", mask.array, sinks);
  return mx::fast::scaled_dot_product_attention(q, k, v, scale, mask.mode, std::nullopt, sinks);
}

mx::array quantized_attention(const mx::array& q, const QuantizedArray& k, const QuantizedArray& v,
                              float scale, const Mask& mask, const KVQuantization& quant) {
  const int B = q.shape(0), n_q_heads = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int n_kv_heads = k.packed.shape(-3);
  const int n_repeats = n_q_heads / n_kv_heads;
  mx::array queries = mx::multiply(q, mx::array(scale, q.dtype()));
  QuantizedArray qk = k, qv = v;
  if (n_repeats > 1) {
    // GQA: (B, n_kv_heads, n_repeats, L, D) against K/V with a broadcast head axis.
    queries = mx::reshape(queries, {B, n_kv_heads, n_repeats, L, D});
    auto expand = [](const QuantizedArray& x) {
      return QuantizedArray{mx::expand_dims(x.packed, -3), mx::expand_dims(x.scales, -3),
                            mx::expand_dims(x.biases, -3)};
    };
    qk = expand(k);
    qv = expand(v);
  }
  mx::array scores = mx::quantized_matmul(queries, qk.packed, qk.scales, qk.biases,
                                          /*transpose=*/true, quant.group_size, quant.bits);
  if (!mask.none()) {
    mx::array m = mask.array ? *mask.array : mx::array(false);
    if (!mask.array) {
      // "causal", bottom-right aligned: query i is position kL - qL + i.
      const int qL = scores.shape(-2), kL = scores.shape(-1);
      m = mx::greater_equal(mx::expand_dims(mx::arange(kL - qL, kL), 1),
                            mx::expand_dims(mx::arange(kL), 0));
    }
    if (n_repeats > 1 && m.ndim() > 3) m = mx::expand_dims(m, -3);
    if (m.dtype() == mx::bool_) {
      const double lowest = mx::finfo(scores.dtype()).min;
      scores = mx::where(m, scores, mx::array(static_cast<float>(lowest), scores.dtype()));
    } else {
      scores = mx::add(scores, m);
    }
  }
  scores = mx::softmax(scores, -1, /*precise=*/true);
  mx::array out = mx::quantized_matmul(scores, qv.packed, qv.scales, qv.biases,
                                       /*transpose=*/false, quant.group_size, quant.bits);
  if (n_repeats > 1) out = mx::reshape(out, {B, n_q_heads, L, D});
  return out;
}

namespace {

thread_local bool cuda_rows = false;

}  // namespace

CudaRowsGuard::CudaRowsGuard(bool on) : prev_(cuda_rows) { cuda_rows = on; }
CudaRowsGuard::~CudaRowsGuard() { cuda_rows = prev_; }
bool cuda_rows_kernel() { return cuda_rows; }

namespace {

// Tier L3, decode: every row on a plain cache, in one primitive (kernels/cpu/fused.h on the CPU,
// kernels/cuda/rows_attention.h on the GPU) that writes each row's K/V into its cache and attends
// over it; nullopt where it does not apply (other caches, masks, shapes: the per-row path).
std::optional<mx::array> rows_kernel_attention(const mx::array& q, const mx::array& k,
                                               const mx::array& v, RowsKVCache& rows, float scale,
                                               const Mask& mask) {
  const bool cpu = rows.cpu_kernels(), cuda = !cpu && cuda_rows_kernel();
  if (!(cpu || cuda) || q.shape(2) != 1) return std::nullopt;
  const int H = k.shape(1), Dk = k.shape(3), Dv = v.shape(3);
  if (Dk != Dv) return std::nullopt;
  if (cpu && q.shape(3) > 256) return std::nullopt;
  if (cuda && (k.dtype() != q.dtype() || v.dtype() != q.dtype() ||
               !kernels::cuda::rows_attention_supports(q.dtype(), q.shape(3), q.shape(1), H)))
    return std::nullopt;
  std::vector<KVCache*> plain;
  for (int b = 0; b < rows.size(); ++b) {
    auto* c = dynamic_cast<KVCache*>(&rows.row(b));
    if (!c || typeid(*c) != typeid(KVCache) || (!mask.rows.empty() && !mask.rows[b].none()))
      return std::nullopt;
    plain.push_back(c);
  }
  std::vector<mx::array> keys, values;
  std::vector<int> offsets;
  std::vector<bool> in_place;
  for (KVCache* c : plain) {
    offsets.push_back(c->offset());
    auto buf = c->reserve(1, H, Dk, Dv, k.dtype(), 1);
    keys.push_back(buf.keys);
    values.push_back(buf.values);
    in_place.push_back(buf.in_place);
  }
  auto out =
      cuda ? kernels::cuda::rows_decode_attention(q, k, v, keys, values, offsets, in_place, scale)
           : kernels::cpu::rows_decode_attention(q, k, v, keys, values, offsets, in_place, scale);
  for (size_t b = 0; b < plain.size(); ++b) plain[b]->commit(out[1 + 2 * b], out[2 + 2 * b], 1);
  return out[0];
}

}  // namespace

mx::array cached_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           KVCacheBase& cache, float scale, const Mask& mask,
                           const std::optional<mx::array>& sinks) {
  if (auto* rows = dynamic_cast<RowsKVCache*>(&cache)) {
    if (!sinks) {
      if (auto out = rows_kernel_attention(q, k, v, *rows, scale, mask)) return *out;
    }
    // Rows hold different lengths: each attends over its own cache, as it would alone.
    std::vector<mx::array> out;
    out.reserve(rows->size());
    for (int b = 0; b < rows->size(); ++b)
      out.push_back(cached_attention(row_of(q, b), row_of(k, b), row_of(v, b), rows->row(b), scale,
                                     mask.rows.empty() ? mask : mask.rows[b], sinks));
    return mx::concatenate(out, 0);
  }
  if (auto quant = cache.quantization()) {
    check(!sinks, "attention",
          "a quantized KV cache does not support attention sinks, expected "
          "an unquantized cache (leave kv_bits unset for this model)");
    auto [qk, qv] = cache.update_and_fetch_quantized(k, v);
    return quantized_attention(q, qk, qv, scale, mask, *quant);
  }
  auto [keys, values] = cache.update_and_fetch(k, v);
  return attention(q, keys, values, scale, mask, sinks);
}

}  // namespace lmx::nn
