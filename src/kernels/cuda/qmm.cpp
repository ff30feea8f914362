#include "kernels/cuda/qmm.h"

#include <mlx/fast.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/qmv_source.h"
#include "kernels/cuda/routing.h"

#if LMX_CUDA_BUILD
#include <cuda.h>
#include <mlx/backend/cuda/device.h>
#include <mlx/primitives.h>

#include "kernels/cuda/qmv_fatbin.h"
#include "kernels/cuda/qmv_pipe_fatbin.h"
#include "kernels/cuda/runtime.h"
#endif

namespace lmx::kernels::cuda {

#if LMX_CUDA_BUILD
namespace {
CUfunction function(int index);  // the qmv fat binary's, below
}  // namespace

namespace detail {

void check_cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* msg = nullptr;
  cuGetErrorString(r, &msg);
  check(false, "cuda kernels", what, " failed, expected CUDA_SUCCESS, got ", int(r), " (",
        msg ? msg : "unknown", ")");
}

namespace {

// Device memory for the primitives' outputs. MLX's stream-ordered allocator is internal to
// libmlx, so outputs come from this cache: a buffer returns here when its array dies, which MLX
// delays until every kernel that used it has finished (eval keeps inputs alive to completion).
// A buffer MLX moved to managed memory (a host read of the output) is freed instead.
class OutputCache {
 public:
  mx::allocator::Data get(size_t nbytes, int device, CUstream stream) {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& v = free_[nbytes];
      if (!v.empty()) {
        p = v.back();
        v.pop_back();
      }
    }
    if (!p) {
      CUdeviceptr d = 0;
      check_cu(cuMemAllocAsync(&d, nbytes, stream), "cuMemAllocAsync");
      p = reinterpret_cast<void*>(d);
    }
    auto* buf = new mx::cu::CudaBuffer{p, nbytes, device};
    return mx::allocator::Data(mx::allocator::Buffer(buf), [this, device](mx::allocator::Buffer b) {
      auto* cb = static_cast<mx::cu::CudaBuffer*>(b.ptr());
      if (cb->device >= 0) {
        std::lock_guard<std::mutex> lock(mu_);
        free_[cb->size].push_back(cb->data);
      } else {
        // The deleter may run on MLX's completion thread, with no current context.
        CUcontext ctx = nullptr;
        CUdevice dev = 0;
        cuDeviceGet(&dev, device);
        cuDevicePrimaryCtxRetain(&ctx, dev);
        cuCtxPushCurrent(ctx);
        unsigned int managed = 0;
        const auto ptr = reinterpret_cast<CUdeviceptr>(cb->data);
        if (cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) == CUDA_SUCCESS &&
            managed)
          cuMemFree(ptr);
        else
          cuMemFreeHost(cb->data);
        cuCtxPopCurrent(&ctx);
        cuDevicePrimaryCtxRelease(dev);
      }
      delete cb;
    });
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
};

OutputCache& output_cache() {
  static auto* c = new OutputCache;  // outlives arrays freed at exit
  return *c;
}

}  // namespace

mx::allocator::Data device_buffer(size_t nbytes, int device, CUstream stream) {
  return output_cache().get(nbytes, device, stream);
}

namespace {

struct DenseStrides {
  long long shape[8];
  long long strides[8];
};

}  // namespace

mx::array dense_input(const mx::array& x, mx::cu::CommandEncoder& enc) {
  if (x.flags().row_contiguous) return x;
  const int esize = static_cast<int>(x.itemsize());
  check(x.ndim() <= 8 && (esize == 2 || esize == 4), "cuda kernels",
        "expected a strided input of at most 8 dims and 2- or 4-byte elements, got ", x.ndim(),
        " dims of ", esize, " bytes");
  mx::array tmp(x.shape(), x.dtype(), nullptr, {});
  CUstream cs = enc.stream();
  tmp.set_data(device_buffer(tmp.nbytes(), enc.device().cuda_device(), cs));
  DenseStrides st{};
  for (int d = 0; d < static_cast<int>(x.ndim()); ++d) {
    st.shape[d] = x.shape(d);
    st.strides[d] = x.strides()[d];
  }
  int ndim = static_cast<int>(x.ndim());
  long long n = static_cast<long long>(x.size());
  const void* ip = mx::gpu_ptr<void>(x);
  void* op = mx::gpu_ptr<void>(tmp);
  void* params[] = {&ip, &op, &st, &ndim, &n};
  enc.set_input_array(x);
  enc.set_output_array(tmp);
  const long long blocks = std::min<long long>((n + 255) / 256, 1024);
  enc.add_kernel_node_raw(function(esize == 2 ? 24 : 25), dim3(static_cast<unsigned>(blocks)),
                          dim3(256), dim3(), 0, params);
  enc.add_temporary(tmp);
  return tmp;
}

}  // namespace detail

using detail::check_cu;
using detail::dense_input;
#endif

namespace {

// An on/off switch from the environment: unset gives `fallback`, "0" or "1" set it, any other
// value is an error naming the variable.
bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  const std::string s = v ? v : (fallback ? "1" : "0");
  check(s == "0" || s == "1", name, "expected 0 or 1, got '", s, "'");
  return s == "1";
}

// One line that calls qmv.cuh's lmx_qmv; bench/gpu/qmv_bench.py uses the same line. MLX passes
// the shapes of x (..., K) and w (N, K * bits / 32) because the body names them, so x needs no
// reshape (each reshape is one more graph node for the host to run per call).
constexpr const char* kBody =
    "lmx_qmv<T, BITS, GS, TT>(x, w, scales, biases, out, lmx_qmv_rows(x_shape, x_ndim), "
    "w_shape[0], x_shape[x_ndim - 1]);";
constexpr int kThreads = 256;  // 32 * qmv.cuh's LMX_QMV_WARPS
constexpr int kFeatures = 16;  // output features per block

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "lmx_qmv", {"x", "w", "scales", "biases"}, {"out"}, kBody, detail::kQmvSource,
      /*ensure_row_contiguous=*/true);
  return k;
}

int rows_of(const mx::array& x) {
  return x.ndim() == 0 ? 0 : static_cast<int>(x.size() / x.shape(-1));
}

// LMX_CUDA_QMV_JIT=1: the kernel through mx::fast::cuda_kernel (NVRTC) instead of the primitive
// below, for comparing the two in one benchmark call.
[[maybe_unused]] bool use_jit() {
  static const bool on = env_switch("LMX_CUDA_QMV_JIT", false);
  return on;
}

#if LMX_CUDA_BUILD
// Tier L3's GEMV as an MLX primitive. mx::fast::cuda_kernel pays for the kernel's source text on
// every call (MLX builds the whole source string when the op is made, and hashes it again in
// eval_gpu to find the compiled module: about 9 KB twice per call, 253 calls per Qwen3-4B token),
// which made whole decode host-bound. Here the kernels are compiled ahead of time (nvcc,
// qmv_kernels.cu), loaded once, and a call costs what MLX's own kernels cost: one graph node.

// kernel index: dtype (bf16, f16) x bits (4, 8) x group size (32, 64, 128) x tiles (1, 2)
int kernel_index(mx::Dtype t, int bits, int gs, int tt) {
  const int g = gs == 32 ? 0 : gs == 64 ? 1 : 2;
  return (((t == mx::float16 ? 1 : 0) * 2 + (bits == 8 ? 1 : 0)) * 3 + g) * 2 + (tt - 1);
}

// Fused kernels (lmx_qmv_multi_*, lmx_qmv_swiglu_*): dtype x bits x group size (64, 128) x tiles.
int fused_index(mx::Dtype t, int bits, int gs, int tt) {
  return (((t == mx::float16 ? 1 : 0) * 2 + (bits == 8 ? 1 : 0)) * 2 + (gs == 128 ? 1 : 0)) * 2 +
         (tt - 1);
}
constexpr int kMultiBase = 26, kSwigluBase = 42, kQkRopeBase = 58, kFunctions = 66;

// lmx_qk_rope_*: dtype (bf16, f16) x head_dim (64, 128, 192, 256).
int qk_rope_index(mx::Dtype t, int head_dim) {
  return (t == mx::float16 ? 4 : 0) + head_dim / 64 - 1;
}

// The fat binary's functions, loaded into the current (MLX's primary) context on first use.
// Indices 24 and 25: lmx_dense_copy_2, lmx_dense_copy_4; then kMultiBase + fused_index,
// kSwigluBase + fused_index and kQkRopeBase + qk_rope_index.
CUfunction function(int index) {
  static CUfunction fns[kFunctions] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    // bin2c's array has byte alignment; the loader reads the image as 8-byte words.
    // LMX_CUDA_QMV_PIPE=1: the build of the kernels with qmv.cuh's software pipeline.
    const bool pipe = env_switch("LMX_CUDA_QMV_PIPE", false);
    const unsigned char* bin = pipe ? lmx_qmv_pipe_fatbin : lmx_qmv_fatbin;
    const size_t bytes = pipe ? sizeof(lmx_qmv_pipe_fatbin) : sizeof(lmx_qmv_fatbin);
    std::vector<unsigned long long> image((bytes + 7) / 8);
    std::memcpy(image.data(), bin, bytes);
    CUmodule mod = nullptr;
    check_cu(cuModuleLoadData(&mod, image.data()), "cuModuleLoadData(qmv fatbin)");
    const char* types[2] = {"bf16", "f16"};
    const int bitss[2] = {4, 8}, gss[3] = {32, 64, 128};
    int i = 0;
    for (auto* t : types)
      for (int b : bitss)
        for (int g : gss)
          for (int tt = 1; tt <= 2; ++tt) {
            const std::string name = std::string("lmx_qmv_") + t + "_" + std::to_string(b) + "_" +
                                     std::to_string(g) + "_" + std::to_string(tt);
            check_cu(cuModuleGetFunction(&fns[i++], mod, name.c_str()), name.c_str());
          }
    check_cu(cuModuleGetFunction(&fns[24], mod, "lmx_dense_copy_2"), "lmx_dense_copy_2");
    check_cu(cuModuleGetFunction(&fns[25], mod, "lmx_dense_copy_4"), "lmx_dense_copy_4");
    i = 0;
    for (auto* t : types)
      for (int b : bitss)
        for (int g : {64, 128})
          for (int tt = 1; tt <= 2; ++tt) {
            const std::string tail = std::string(t) + "_" + std::to_string(b) + "_" +
                                     std::to_string(g) + "_" + std::to_string(tt);
            const std::string multi = "lmx_qmv_multi_" + tail, swiglu = "lmx_qmv_swiglu_" + tail;
            check_cu(cuModuleGetFunction(&fns[kMultiBase + i], mod, multi.c_str()), multi.c_str());
            check_cu(cuModuleGetFunction(&fns[kSwigluBase + i], mod, swiglu.c_str()),
                     swiglu.c_str());
            ++i;
          }
    for (auto* t : types)
      for (int d : {64, 128, 192, 256}) {
        const std::string name = std::string("lmx_qk_rope_") + t + "_" + std::to_string(d);
        check_cu(cuModuleGetFunction(
                     &fns[kQkRopeBase + qk_rope_index(t[0] == 'f' ? mx::float16 : mx::bfloat16, d)],
                     mod, name.c_str()),
                 name.c_str());
      }
  });
  return fns[index];
}

class Qmv : public mx::UnaryPrimitive {
 public:
  Qmv(mx::Stream s, int bits, int group_size, std::optional<float> prefill)
      : mx::UnaryPrimitive(s), bits_(bits), gs_(group_size), prefill_(prefill) {}

  void eval_cpu(const std::vector<mx::array>&, mx::array&) override {
    check(false, "cuda quantized_matmul",
          "runs on the GPU only, expected a GPU stream, got the CPU");
  }

  void eval_gpu(const std::vector<mx::array>& raw, mx::array& out) override {
    auto& enc = mx::cu::get_command_encoder(stream());
    const std::vector<mx::array> inputs = {dense_input(raw[0], enc), dense_input(raw[1], enc),
                                           dense_input(raw[2], enc), dense_input(raw[3], enc)};
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& s = inputs[2];
    const mx::array& b = inputs[3];
    CUstream cs = enc.stream();
    out.set_data(detail::device_buffer(out.nbytes(), enc.device().cuda_device(), cs));
    if (prefill_) {
      // For tests: stream-ordered before the graph that holds the kernel.
      const float v = *prefill_;
      unsigned short bits16 = 0;
      if (out.dtype() == mx::float16) {
        const _Float16 h = static_cast<_Float16>(v);
        std::memcpy(&bits16, &h, 2);
      } else {
        unsigned int f32 = 0;
        std::memcpy(&f32, &v, 4);
        bits16 = static_cast<unsigned short>(f32 >> 16);
      }
      check_cu(cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(mx::gpu_ptr<void>(out)), bits16,
                                out.size(), cs),
               "cuMemsetD16Async");
    }
    const int K = x.shape(-1), N = w.shape(0), M = rows_of(x);
    const int tt = M > 8 ? 2 : 1;
    const CUfunction f = function(kernel_index(x.dtype(), bits_, gs_, tt));
    const void* xp = mx::gpu_ptr<void>(x);
    const void* wp = mx::gpu_ptr<void>(w);
    const void* sp = mx::gpu_ptr<void>(s);
    const void* bp = mx::gpu_ptr<void>(b);
    void* op = mx::gpu_ptr<void>(out);
    void* params[] = {
        &xp, &wp, &sp, &bp, &op, const_cast<int*>(&M), const_cast<int*>(&N), const_cast<int*>(&K)};
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    enc.add_kernel_node_raw(f, dim3(N / kFeatures), dim3(kThreads), dim3(), 0, params);
  }

  const char* name() const override { return "LmxCudaQmv"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Qmv&>(other);
    return bits_ == o.bits_ && gs_ == o.gs_ && prefill_ == o.prefill_;
  }

 private:
  int bits_, gs_;
  std::optional<float> prefill_;
};

mx::array qmv_primitive(const mx::array& x, const mx::array& w, const mx::array& scales,
                        const mx::array& biases, const QmmOptions& opt,
                        std::optional<float> prefill) {
  mx::Shape out_shape = x.shape();
  out_shape.back() = w.shape(0);
  const mx::Stream s = mx::default_stream(mx::Device::gpu);
  return mx::array(std::move(out_shape), x.dtype(),
                   std::make_shared<Qmv>(s, opt.bits, opt.group_size, prefill),
                   {x, w, scales, biases});
}

// A multi-output primitive's arrays before its launch: the inputs made row-contiguous and
// registered with the encoder, the outputs given device buffers and registered.
std::vector<mx::array> bind_arrays(mx::cu::CommandEncoder& enc, const std::vector<mx::array>& raw,
                                   std::vector<mx::array>& outs) {
  std::vector<mx::array> in;
  in.reserve(raw.size());
  for (const auto& a : raw) in.push_back(dense_input(a, enc));
  const int dev = enc.device().cuda_device();
  for (auto& o : outs) o.set_data(detail::device_buffer(o.nbytes(), dev, enc.stream()));
  for (const auto& a : in) enc.set_input_array(a);
  for (const auto& o : outs) enc.set_output_array(o);
  return in;
}

// qmv.cuh's LmxQmvMulti and LmxQmvSwiglu, field for field (the kernels take them by value).
struct MultiArgs {
  const void* x;
  const void* w[3];
  const void* scales[3];
  const void* biases[3];
  void* out[3];
  const void* residual;
  int n[3];
  int first[4];
  int count, M, K;
  const void* norm;
  float eps;
};
struct SwigluArgs {
  const void* x;
  const void* w[2];
  const void* scales[2];
  const void* biases[2];
  void* out;
  int M, N, K;
  const void* norm;
  float eps;
};

enum class Fused { multi, add, swiglu };

// The fused kernels as one MLX primitive. Inputs: x, then (w, scales, biases) per weight, then
// the residual (add), then the fused norm's weight (with `norm`); outputs: one per weight
// (multi) or one.
class QmvFused : public mx::Primitive {
 public:
  QmvFused(mx::Stream s, Fused kind, int bits, int group_size, std::optional<float> norm_eps)
      : mx::Primitive(s), kind_(kind), bits_(bits), gs_(group_size), norm_eps_(norm_eps) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    check(false, "cuda fused quantized_matmul",
          "runs on the GPU only, expected a GPU stream, got the CPU");
  }

  void eval_gpu(const std::vector<mx::array>& raw, std::vector<mx::array>& outs) override {
    auto& enc = mx::cu::get_command_encoder(stream());
    const std::vector<mx::array> in = bind_arrays(enc, raw, outs);
    const mx::array& x = in[0];
    const int K = x.shape(-1), M = rows_of(x), tt = M > 8 ? 2 : 1;
    const int fi = fused_index(x.dtype(), bits_, gs_, tt);
    if (kind_ == Fused::swiglu) {
      SwigluArgs a{};
      a.x = mx::gpu_ptr<void>(x);
      for (int i = 0; i < 2; ++i) {
        a.w[i] = mx::gpu_ptr<void>(in[1 + 3 * i]);
        a.scales[i] = mx::gpu_ptr<void>(in[2 + 3 * i]);
        a.biases[i] = mx::gpu_ptr<void>(in[3 + 3 * i]);
      }
      a.out = mx::gpu_ptr<void>(outs[0]);
      a.M = M;
      a.N = in[1].shape(0);
      a.K = K;
      a.norm = norm_eps_ ? mx::gpu_ptr<void>(in.back()) : nullptr;
      a.eps = norm_eps_.value_or(0.0f);
      void* params[] = {&a};
      enc.add_kernel_node_raw(function(kSwigluBase + fi), dim3(a.N / kFeatures), dim3(kThreads),
                              dim3(), 0, params);
      return;
    }
    MultiArgs a{};
    a.x = mx::gpu_ptr<void>(x);
    a.count = kind_ == Fused::add ? 1 : static_cast<int>(outs.size());
    int blocks = 0;
    for (int i = 0; i < a.count; ++i) {
      a.w[i] = mx::gpu_ptr<void>(in[1 + 3 * i]);
      a.scales[i] = mx::gpu_ptr<void>(in[2 + 3 * i]);
      a.biases[i] = mx::gpu_ptr<void>(in[3 + 3 * i]);
      a.out[i] = mx::gpu_ptr<void>(outs[i]);
      a.n[i] = in[1 + 3 * i].shape(0);
      a.first[i] = blocks;
      blocks += a.n[i] / kFeatures;
    }
    a.first[a.count] = blocks;
    a.residual = kind_ == Fused::add ? mx::gpu_ptr<void>(in[1 + 3 * a.count]) : nullptr;
    a.M = M;
    a.K = K;
    a.norm = norm_eps_ ? mx::gpu_ptr<void>(in.back()) : nullptr;
    a.eps = norm_eps_.value_or(0.0f);
    void* params[] = {&a};
    enc.add_kernel_node_raw(function(kMultiBase + fi), dim3(blocks), dim3(kThreads), dim3(), 0,
                            params);
  }

  const char* name() const override { return "LmxCudaQmvFused"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QmvFused&>(other);
    return kind_ == o.kind_ && bits_ == o.bits_ && gs_ == o.gs_ && norm_eps_ == o.norm_eps_;
  }

 private:
  Fused kind_;
  int bits_, gs_;
  std::optional<float> norm_eps_;
};

// qk_rope.cuh's LmxQkRope, field for field.
struct QkRopeArgs {
  const void* q;
  const void* k;
  const void* q_weight;
  const void* k_weight;
  const float* freqs;
  void* q_out;
  void* k_out;
  float eps, log2_base, scale;
  int L, Hq, Hk, offset, rows;
};

// Per-head norms and RoPE of q and k in one kernel. Inputs: q, k, then the two norm weights
// (with a norm), then freqs (with them); outputs (B, Hq, L, D) and (B, Hk, L, D).
class QkRope : public mx::Primitive {
 public:
  QkRope(mx::Stream s, const QkRopeOptions& o) : mx::Primitive(s), o_(o) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    check(false, "cuda qk_norm_rope", "runs on the GPU only, expected a GPU stream, got the CPU");
  }

  void eval_gpu(const std::vector<mx::array>& raw, std::vector<mx::array>& outs) override {
    auto& enc = mx::cu::get_command_encoder(stream());
    const std::vector<mx::array> in = bind_arrays(enc, raw, outs);
    const mx::array& q = in[0];
    const int D = o_.head_dim, L = q.shape(1);
    QkRopeArgs a{};
    a.q = mx::gpu_ptr<void>(in[0]);
    a.k = mx::gpu_ptr<void>(in[1]);
    size_t next = 2;
    if (o_.norm) {
      a.q_weight = mx::gpu_ptr<void>(in[next++]);
      a.k_weight = mx::gpu_ptr<void>(in[next++]);
    }
    if (o_.freqs) a.freqs = mx::gpu_ptr<float>(in[next++]);
    a.q_out = mx::gpu_ptr<void>(outs[0]);
    a.k_out = mx::gpu_ptr<void>(outs[1]);
    a.eps = o_.eps;
    a.log2_base = std::log2(o_.base);
    a.scale = o_.scale;
    a.L = L;
    a.Hq = o_.n_heads;
    a.Hk = o_.n_kv_heads;
    a.offset = o_.offset;
    a.rows = q.shape(0) * L;
    const long long warps = static_cast<long long>(a.rows) * (a.Hq + a.Hk);
    void* params[] = {&a};
    enc.add_kernel_node_raw(function(kQkRopeBase + qk_rope_index(q.dtype(), D)),
                            dim3(static_cast<unsigned>((warps + 3) / 4)), dim3(128), dim3(), 0,
                            params);
  }

  const char* name() const override { return "LmxCudaQkRope"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QkRope&>(other).o_;
    return o.n_heads == o_.n_heads && o.n_kv_heads == o_.n_kv_heads && o.head_dim == o_.head_dim &&
           o.norm == o_.norm && o.eps == o_.eps && o.base == o_.base && o.scale == o_.scale &&
           o.freqs == o_.freqs && o.offset == o_.offset;
  }

 private:
  QkRopeOptions o_;
};

std::vector<mx::array> fused_primitive(Fused kind, const mx::array& x,
                                       const std::vector<QMatrix>& mats,
                                       const std::optional<mx::array>& residual,
                                       const QmmOptions& opt, const FusedNorm* norm = nullptr) {
  std::vector<mx::array> inputs = {x};
  std::vector<mx::Shape> shapes;
  for (const auto& m : mats) {
    inputs.insert(inputs.end(), {m.w, m.scales, m.biases});
    mx::Shape sh = x.shape();
    sh.back() = m.w.shape(0);
    shapes.push_back(std::move(sh));
  }
  if (kind != Fused::multi) shapes.resize(1);
  if (residual) inputs.push_back(*residual);
  if (norm) inputs.push_back(norm->weight);
  const std::vector<mx::Dtype> dtypes(shapes.size(), x.dtype());
  return mx::array::make_arrays(
      std::move(shapes), dtypes,
      std::make_shared<QmvFused>(mx::default_stream(mx::Device::gpu), kind, opt.bits,
                                 opt.group_size,
                                 norm ? std::optional<float>(norm->eps) : std::nullopt),
      inputs);
}
#endif

}  // namespace

bool available() {
  static const bool on = std::string(LMX_BACKEND) == "cuda" && mx::cu::is_available();
  return on && mx::default_device() == mx::Device::gpu;
}

bool enabled() {
  static const bool on = env_switch("LMX_CUDA_KERNELS", true);
  return on;
}

bool supports(int bits, int group_size, const std::string& mode, mx::Dtype scale_dtype, int N,
              int K) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) &&
         (scale_dtype == mx::bfloat16 || scale_dtype == mx::float16) && mode == "affine" && N > 0 &&
         N % kFeatures == 0 && K > 0 && K % 128 == 0;
}

bool routed(int bits, int group_size) { return group_size != 32; }

bool rows_routed() {
  static const bool on = env_switch("LMX_CUDA_ROWS", true);
  return on;
}

bool fused_routed() {
  static const bool on = env_switch("LMX_CUDA_FUSED", true);
  return on;
}

bool norm_fold_routed() {
  static const bool on = env_switch("LMX_CUDA_NORM_FOLD", true);
  return on;
}

namespace {

// The kernel runs here and takes this layout, whatever the row count.
bool takes_layout(const mx::array& x, const mx::array& w, const mx::array& scales,
                  const QmmOptions& opt) {
  return x.ndim() >= 1 && w.ndim() == 2 && available() && x.dtype() == scales.dtype() &&
         supports(opt.bits, opt.group_size, "affine", scales.dtype(), w.shape(0), x.shape(-1));
}

}  // namespace

bool takes_kernel(const mx::array& x, const mx::array& w, const mx::array& scales,
                  const QmmOptions& opt) {
  if (!takes_layout(x, w, scales, opt)) return false;
  const int M = rows_of(x);
  return M >= 1 && M <= kMaxRows;
}

mx::array qmv(const mx::array& x, const mx::array& w, const mx::array& scales,
              const mx::array& biases, const QmmOptions& opt, std::optional<float> prefill) {
  const char* where = "cuda quantized_matmul";
  check(x.ndim() >= 1 && w.ndim() == 2 && w.dtype() == mx::uint32, where,
        "expected x (..., K) and a 2-D uint32 weight, got x of ", x.ndim(), " dims, weight of ",
        w.ndim(), " dims");
  const int K = x.shape(-1), N = w.shape(0), M = rows_of(x);
  check(supports(opt.bits, opt.group_size, "affine", scales.dtype(), N, K), where,
        "unsupported layout, expected bits 4/8, group size 32/64/128, bfloat16/float16 scales, ",
        "N % 16 == 0 and K % 128 == 0, got bits=", opt.bits, " group_size=", opt.group_size,
        " scales ", scales.dtype(), " N=", N, " K=", K);
  check(x.dtype() == scales.dtype(), where, "x must have the scales' dtype ", scales.dtype(),
        ", got ", x.dtype());
  check(M >= 1 && M <= kMaxRows, where, "expected 1 to ", kMaxRows, " rows, got ", M);
  check(w.shape(1) * 32 == K * opt.bits, where, "x has K=", K, ", expected ",
        w.shape(1) * 32 / opt.bits, " for the packed weight of ", w.shape(1), " words");
  const mx::Shape gshape{N, K / opt.group_size};
  check(scales.shape() == gshape && biases.shape() == gshape && biases.dtype() == scales.dtype(),
        where, "scales and biases must both be (", N, ", ", K / opt.group_size, ") of one dtype");
  check(available(), where, "needs a CUDA build running on the GPU");
#if LMX_CUDA_BUILD
  if (!use_jit()) return qmv_primitive(x, w, scales, biases, opt, prefill);
#endif
  mx::Shape out_shape = x.shape();
  out_shape.back() = N;
  std::vector<mx::array> outs = kernel()(
      {x, w, scales, biases}, {out_shape}, {x.dtype()}, {N / kFeatures * kThreads, 1, 1},
      {kThreads, 1, 1},
      {{"T", x.dtype()}, {"BITS", opt.bits}, {"GS", opt.group_size}, {"TT", M > 8 ? 2 : 1}},
      prefill, false, {});
  return outs[0];
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, const QmmOptions& opt) {
  if (takes_kernel(x, w, scales, opt)) return qmv(x, w, scales, biases, opt);
  const int M = takes_layout(x, w, scales, opt) ? rows_of(x) : 0;
  if (M > kMaxRows && M <= kChunkedRows) {
    // A batched decode step of 17-64 rows: the kernel kMaxRows rows at a time. MLX's quantized
    // matmul at these row counts made a 17-row Qwen3-4B step cost 2x a 16-row one on an H100
    // (docs/benchmarks.md).
    const int K = x.shape(-1);
    mx::array x2 = mx::reshape(x, {M, K});
    std::vector<mx::array> parts;
    for (int r = 0; r < M; r += kMaxRows)
      parts.push_back(
          qmv(mx::slice(x2, {r, 0}, {std::min(r + kMaxRows, M), K}), w, scales, biases, opt));
    mx::Shape out_shape = x.shape();
    out_shape.back() = w.shape(0);
    return mx::reshape(mx::concatenate(parts, 0), out_shape);
  }
  return mx::quantized_matmul(x, w, scales, biases, true, opt.group_size, opt.bits, "affine");
}

bool takes_fused(const mx::array& x, const std::vector<QMatrix>& mats, const QmmOptions& opt) {
  if (mats.empty() || !routed(opt.bits, opt.group_size)) return false;
  for (const auto& m : mats)
    if (m.biases.dtype() != m.scales.dtype() || !takes_kernel(x, m.w, m.scales, opt) ||
        m.w.shape(1) * 32 != x.shape(-1) * opt.bits)
      return false;
  return true;
}

namespace {

void check_fused(const char* where, const mx::array& x, const std::vector<QMatrix>& mats,
                 const QmmOptions& opt) {
  check(!mats.empty() && mats.size() <= 3, where, "expected 1 to 3 weights, got ", mats.size());
  check(routed(opt.bits, opt.group_size), where, "expected group size 64 or 128, got ",
        opt.group_size);
  for (const auto& m : mats) {
    // qmv's checks: layout, dtypes, rows, K.
    check(m.w.ndim() == 2, where, "expected 2-D weights, got ", m.w.ndim(), " dims");
    const int N = m.w.shape(0), K = x.shape(-1);
    check(supports(opt.bits, opt.group_size, "affine", m.scales.dtype(), N, K), where,
          "unsupported layout: bits=", opt.bits, " group_size=", opt.group_size, " N=", N,
          " K=", K);
    check(m.w.dtype() == mx::uint32 && m.w.shape(1) * 32 == K * opt.bits, where, "x has K=", K,
          ", expected ", m.w.shape(1) * 32 / opt.bits, " for a weight of ", m.w.shape(1),
          " uint32 words");
    const mx::Shape gshape{N, K / opt.group_size};
    check(m.scales.shape() == gshape && m.biases.shape() == gshape &&
              m.scales.dtype() == x.dtype() && m.biases.dtype() == x.dtype(),
          where, "scales and biases must be (", N, ", ", K / opt.group_size, ") of x's dtype ",
          x.dtype());
  }
  const int M = rows_of(x);
  check(M >= 1 && M <= kMaxRows, where, "expected 1 to ", kMaxRows, " rows, got ", M);
  check(available(), where, "needs a CUDA build running on the GPU");
}

}  // namespace

namespace {

void check_norm(const char* where, const mx::array& x, const std::optional<FusedNorm>& norm) {
  if (!norm) return;
  check(norm->weight.ndim() == 1 && norm->weight.shape(0) == x.shape(-1) &&
            norm->weight.dtype() == x.dtype(),
        where, "expected a norm weight (", x.shape(-1), ") of x's dtype, got ", norm->weight.ndim(),
        " dims of ", norm->weight.ndim() ? norm->weight.shape(0) : 0);
}

}  // namespace

std::vector<mx::array> qmv_multi(const mx::array& x, const std::vector<QMatrix>& mats,
                                 const QmmOptions& opt, const std::optional<FusedNorm>& norm) {
  check_fused("cuda qmv_multi", x, mats, opt);
  check_norm("cuda qmv_multi", x, norm);
#if LMX_CUDA_BUILD
  return fused_primitive(Fused::multi, x, mats, std::nullopt, opt, norm ? &*norm : nullptr);
#else
  return {};
#endif
}

mx::array qmv_add(const mx::array& x, const QMatrix& m, const mx::array& residual,
                  const QmmOptions& opt) {
  check_fused("cuda qmv_add", x, {m}, opt);
  mx::Shape shape = x.shape();
  shape.back() = m.w.shape(0);
  check(residual.shape() == shape && residual.dtype() == x.dtype(), "cuda qmv_add",
        "the residual must have the product's shape and x's dtype ", x.dtype());
#if LMX_CUDA_BUILD
  return fused_primitive(Fused::add, x, {m}, residual, opt)[0];
#else
  return residual;
#endif
}

mx::array qmv_swiglu(const mx::array& x, const QMatrix& gate, const QMatrix& up,
                     const QmmOptions& opt, const std::optional<FusedNorm>& norm) {
  check_fused("cuda qmv_swiglu", x, {gate, up}, opt);
  check(gate.w.shape(0) == up.w.shape(0), "cuda qmv_swiglu",
        "gate and up must have one output size, got ", gate.w.shape(0), " and ", up.w.shape(0));
  check_norm("cuda qmv_swiglu", x, norm);
#if LMX_CUDA_BUILD
  return fused_primitive(Fused::swiglu, x, {gate, up}, std::nullopt, opt,
                         norm ? &*norm : nullptr)[0];
#else
  return x;
#endif
}

namespace {

std::string shape_str(const mx::Shape& shape) {
  std::string r = "(";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + ")";
}

}  // namespace

bool takes_qk_norm_rope(const mx::array& q, const mx::array& k, const QkRopeOptions& o) {
  // LMX_CUDA_QK_ROPE=0: the unfused norms and RoPE (for A/B runs in one benchmark call).
  static const bool on = env_switch("LMX_CUDA_QK_ROPE", true);
  const int D = o.head_dim;
  return on && available() && enabled() && q.ndim() == 3 && k.ndim() == 3 &&
         (q.dtype() == mx::bfloat16 || q.dtype() == mx::float16) && k.dtype() == q.dtype() &&
         (D == 64 || D == 128 || D == 192 || D == 256) && o.n_heads > 0 && o.n_kv_heads > 0 &&
         q.shape(0) == k.shape(0) && q.shape(1) == k.shape(1) && q.shape(1) <= kMaxRows &&
         q.shape(2) == o.n_heads * D && k.shape(2) == o.n_kv_heads * D && o.offset >= 0;
}

std::vector<mx::array> qk_norm_rope(const mx::array& q, const mx::array& k,
                                    const std::optional<mx::array>& q_weight,
                                    const std::optional<mx::array>& k_weight,
                                    const std::optional<mx::array>& freqs,
                                    const QkRopeOptions& opt) {
  check(takes_qk_norm_rope(q, k, opt), "cuda qk_norm_rope",
        "expected bfloat16 or float16 q (B, L <= ", kMaxRows, ", n_heads * head_dim) and k of ",
        "n_kv_heads heads, head_dim 64/128/192/256, on the GPU; got q ", shape_str(q.shape()),
        " and k ", shape_str(k.shape()), " with head_dim ", opt.head_dim);
  QkRopeOptions o = opt;
  o.norm = q_weight.has_value();
  o.freqs = freqs.has_value();
  std::vector<mx::array> inputs = {q, k};
  if (o.norm) {
    check(k_weight && q_weight->shape() == mx::Shape{o.head_dim} &&
              k_weight->shape() == mx::Shape{o.head_dim} && q_weight->dtype() == q.dtype() &&
              k_weight->dtype() == q.dtype(),
          "cuda qk_norm_rope", "expected q and k norm weights (", o.head_dim, ") of q's dtype");
    inputs.insert(inputs.end(), {*q_weight, *k_weight});
  }
  if (o.freqs) {
    check(freqs->dtype() == mx::float32 && freqs->shape() == mx::Shape{o.head_dim / 2},
          "cuda qk_norm_rope", "expected float32 freqs (", o.head_dim / 2, "), got ",
          shape_str(freqs->shape()));
    inputs.push_back(*freqs);
  }
#if LMX_CUDA_BUILD
  const int B = q.shape(0), L = q.shape(1);
  return mx::array::make_arrays(
      {{B, o.n_heads, L, o.head_dim}, {B, o.n_kv_heads, L, o.head_dim}}, {q.dtype(), q.dtype()},
      std::make_shared<QkRope>(mx::default_stream(mx::Device::gpu), o), inputs);
#else
  return inputs;
#endif
}

const char* kernel_source() { return detail::kQmvSource; }
const char* kernel_body() { return kBody; }

}  // namespace lmx::kernels::cuda
