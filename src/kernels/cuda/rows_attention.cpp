#include "kernels/cuda/rows_attention.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/qmm.h"

#if LMX_CUDA_BUILD
#include <mlx/primitives.h>

#include "kernels/cuda/rows_attention_args.h"
#include "kernels/cuda/rows_attention_fatbin.h"
#include "kernels/cuda/runtime.h"
#endif

namespace lmx::kernels::cuda {

namespace {

constexpr const char* kWhere = "cuda rows_decode_attention";

std::atomic<long long> calls{0};

#if LMX_CUDA_BUILD
using detail::check_cu;

const char* dtype_name(mx::Dtype t) {
  return t == mx::bfloat16 ? "bf16" : t == mx::float16 ? "f16" : "f32";
}

// The fat binary's functions by name, loaded into the current (MLX's primary) context on first
// use.
CUfunction function(const std::string& name) {
  static std::once_flag once;
  static CUmodule mod = nullptr;
  static std::mutex mu;
  static std::unordered_map<std::string, CUfunction> fns;
  std::call_once(once, [] {
    // bin2c's array has byte alignment; the loader reads the image as 8-byte words.
    std::vector<unsigned long long> image((sizeof(lmx_rows_attention_fatbin) + 7) / 8);
    std::memcpy(image.data(), lmx_rows_attention_fatbin, sizeof(lmx_rows_attention_fatbin));
    check_cu(cuModuleLoadData(&mod, image.data()), "cuModuleLoadData(rows attention fatbin)");
  });
  std::lock_guard<std::mutex> lock(mu);
  auto it = fns.find(name);
  if (it != fns.end()) return it->second;
  CUfunction f = nullptr;
  check_cu(cuModuleGetFunction(&f, mod, name.c_str()), name.c_str());
  fns.emplace(name, f);
  return f;
}

int multiprocessors(int device) {
  static const int n = [device] {
    CUdevice dev = 0;
    int v = 0;
    check_cu(cuDeviceGet(&dev, device), "cuDeviceGet");
    check_cu(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
             "cuDeviceGetAttribute(multiprocessors)");
    return v;
  }();
  return n;
}

bool aligned16(const mx::array& a) {
  return reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(a)) % 16 == 0;
}

// Inputs: q, k_new, v_new (B, H, 1, D), then each row's key and value buffers; outputs: the
// attention (B, Hq, 1, D), then each row's buffers with the new position written.
class RowsAttention : public mx::Primitive {
 public:
  RowsAttention(mx::Stream s, std::vector<int> offsets, std::vector<bool> in_place, float scale,
                std::optional<float> prefill)
      : mx::Primitive(s),
        offsets_(std::move(offsets)),
        in_place_(std::move(in_place)),
        scale_(scale),
        prefill_(prefill) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    fail(kWhere, "runs on the GPU only, expected a GPU stream, got the CPU");
  }

  void eval_gpu(const std::vector<mx::array>& raw, std::vector<mx::array>& out) override {
    auto& enc = mx::cu::get_command_encoder(stream());
    CUstream cs = enc.stream();
    const int dev = enc.device().cuda_device();
    auto dense = [&](const mx::array& a) {
      mx::array d = detail::dense_input(a, enc);
      check(aligned16(d), kWhere, "expected 16-byte aligned inputs");
      return d;
    };
    const mx::array q = dense(raw[0]), kn = dense(raw[1]), vn = dense(raw[2]);
    const int B = q.shape(0), Hq = q.shape(1), D = q.shape(3), Hkv = kn.shape(1);
    const int esize = static_cast<int>(q.itemsize());

    out[0].set_data(detail::device_buffer(out[0].nbytes(), dev, cs));
    if (prefill_) {
      const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(mx::gpu_ptr<void>(out[0]));
      if (esize == 4) {
        unsigned int bits = 0;
        std::memcpy(&bits, &*prefill_, 4);
        check_cu(cuMemsetD32Async(p, bits, out[0].size(), cs), "cuMemsetD32Async");
      } else {
        unsigned short bits = 0;
        if (q.dtype() == mx::float16) {
          const _Float16 h = static_cast<_Float16>(*prefill_);
          std::memcpy(&bits, &h, 2);
        } else {
          unsigned int f = 0;
          std::memcpy(&f, &*prefill_, 4);
          bits = static_cast<unsigned short>(f >> 16);
        }
        check_cu(cuMemsetD16Async(p, bits, out[0].size(), cs), "cuMemsetD16Async");
      }
    }

    // Each row's buffers: written where they lie when the cache vouches for them (MLX keeps
    // only stream-ordered references of its own, for kernels queued before this one), else
    // copied whole first.
    for (size_t t = 1; t < out.size(); ++t) {
      const mx::array& in = raw[2 + t];
      if (in_place_[(t - 1) / 2] && in.flags().row_contiguous && aligned16(in)) {
        out[t].copy_shared_buffer(in);
        continue;
      }
      const mx::array src = dense(in);
      out[t].set_data(detail::device_buffer(out[t].nbytes(), dev, cs));
      const void* ip = mx::gpu_ptr<void>(src);
      void* op = mx::gpu_ptr<void>(out[t]);
      long long n16 = static_cast<long long>(out[t].nbytes() / 16);
      void* params[] = {&ip, &op, &n16};
      enc.set_input_array(src);
      enc.set_output_array(out[t]);
      const long long blocks = std::min<long long>((n16 + 255) / 256, 1024);
      enc.add_kernel_node_raw(function("lmx_rows_copy16"), dim3(static_cast<unsigned>(blocks)),
                              dim3(256), dim3(), 0, params);
    }

    const int G = Hq / Hkv;
    const int GB = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    const std::string suffix = std::string(dtype_name(q.dtype())) + "_" + std::to_string(D);
    const CUfunction attn = function("lmx_rows_attn_" + suffix + "_" + std::to_string(GB));
    const CUfunction reduce = function("lmx_rows_attn_reduce_" + suffix);
    const auto* qp = static_cast<const char*>(mx::gpu_ptr<void>(q));
    const auto* kp = static_cast<const char*>(mx::gpu_ptr<void>(kn));
    const auto* vp = static_cast<const char*>(mx::gpu_ptr<void>(vn));
    auto* op = static_cast<char*>(mx::gpu_ptr<void>(out[0]));
    for (int r0 = 0; r0 < B; r0 += kLmxRowsPerLaunch) {
      const int n = std::min(kLmxRowsPerLaunch, B - r0);
      LmxRowsAttnArgs a{};
      a.q = qp + static_cast<size_t>(r0) * Hq * D * esize;
      a.k_new = kp + static_cast<size_t>(r0) * Hkv * D * esize;
      a.v_new = vp + static_cast<size_t>(r0) * Hkv * D * esize;
      a.out = op + static_cast<size_t>(r0) * Hq * D * esize;
      a.Hq = Hq;
      a.Hkv = Hkv;
      a.scale_log2 = scale_ * 1.4426950408889634f;
      a.n = n;
      int max_len = 1;
      for (int i = 0; i < n; ++i) {
        const int b = r0 + i;
        a.rows[i] = {mx::gpu_ptr<void>(out[1 + 2 * b]), mx::gpu_ptr<void>(out[2 + 2 * b]),
                     offsets_[b] + 1, out[1 + 2 * b].shape(2)};
        max_len = std::max(max_len, offsets_[b] + 1);
      }
      // Split the positions over blocks (flash-decoding) only where the rows and heads alone
      // leave the GPU's multiprocessors idle: at least 128 positions a split.
      const int blocks = Hq / GB * n, target = 2 * multiprocessors(dev);
      int splits = 1;
      if (blocks < target)
        splits = std::max(1, std::min((target + blocks - 1) / blocks, (max_len + 127) / 128));
      a.chunk = (max_len + splits - 1) / splits;
      a.splits = splits = (max_len + a.chunk - 1) / a.chunk;
      std::optional<mx::array> part;
      if (splits > 1) {
        part = mx::array({n * Hq * splits * (D + 2)}, mx::float32, nullptr, {});
        part->set_data(detail::device_buffer(part->nbytes(), dev, cs));
        a.part = static_cast<float*>(mx::gpu_ptr<void>(*part));
      }
      void* params[] = {&a};
      enc.set_input_array(q);
      enc.set_input_array(kn);
      enc.set_input_array(vn);
      for (int i = 0; i < n; ++i) {
        enc.set_input_array(out[1 + 2 * (r0 + i)]);
        enc.set_input_array(out[2 + 2 * (r0 + i)]);
        enc.set_output_array(out[1 + 2 * (r0 + i)]);
        enc.set_output_array(out[2 + 2 * (r0 + i)]);
      }
      if (part) {
        enc.set_output_array(*part);
      } else {
        enc.set_output_array(out[0]);
      }
      enc.add_kernel_node_raw(attn,
                              dim3(static_cast<unsigned>(Hq / GB), static_cast<unsigned>(n),
                                   static_cast<unsigned>(splits)),
                              dim3(128), dim3(), 0, params);
      if (part) {
        enc.set_input_array(*part);
        enc.set_output_array(out[0]);
        enc.add_kernel_node_raw(reduce, dim3(static_cast<unsigned>(Hq), static_cast<unsigned>(n)),
                                dim3(static_cast<unsigned>(D)), dim3(), 0, params);
        enc.add_temporary(*part);
      }
    }
  }

  const char* name() const override { return "LmxCudaRowsAttention"; }

 private:
  std::vector<int> offsets_;
  std::vector<bool> in_place_;
  float scale_;
  std::optional<float> prefill_;
};
#endif

}  // namespace

bool rows_attention_supports(mx::Dtype dtype, int head_dim, int n_q_heads, int n_kv_heads) {
  return available() && (dtype == mx::bfloat16 || dtype == mx::float16 || dtype == mx::float32) &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256) && n_kv_heads > 0 &&
         n_q_heads % n_kv_heads == 0;
}

std::vector<mx::array> rows_decode_attention(const mx::array& q, const mx::array& k_new,
                                             const mx::array& v_new,
                                             const std::vector<mx::array>& keys,
                                             const std::vector<mx::array>& values,
                                             const std::vector<int>& offsets,
                                             const std::vector<bool>& in_place, float scale,
                                             std::optional<float> prefill) {
  check(q.ndim() == 4 && q.shape(2) == 1 && k_new.ndim() == 4 && v_new.shape() == k_new.shape() &&
            k_new.shape(0) == q.shape(0) && k_new.shape(2) == 1 && k_new.shape(3) == q.shape(3) &&
            k_new.shape(1) > 0 && q.shape(1) % k_new.shape(1) == 0,
        kWhere, "expected q (B, Hq, 1, D) and k, v (B, Hkv, 1, D) with Hq a multiple of Hkv");
  const int B = q.shape(0), Hkv = k_new.shape(1), D = q.shape(3);
  check(k_new.dtype() == q.dtype() && v_new.dtype() == q.dtype(), kWhere,
        "expected q, k and v of one dtype, got ", q.dtype(), ", ", k_new.dtype(), ", ",
        v_new.dtype());
  check(rows_attention_supports(q.dtype(), D, q.shape(1), Hkv), kWhere,
        "expected a CUDA build on the GPU, bfloat16/float16/float32 and head_dim 64/128/256, got ",
        q.dtype(), " and head_dim ", D);
  check(static_cast<int>(keys.size()) == B && values.size() == keys.size() &&
            offsets.size() == keys.size() && in_place.size() == keys.size(),
        kWhere, "expected one buffer pair, offset and in-place flag per row, got ", keys.size(),
        " for ", B, " rows");
  std::vector<mx::array> in = {q, k_new, v_new};
  std::vector<mx::Shape> shapes = {q.shape()};
  std::vector<mx::Dtype> dtypes = {q.dtype()};
  for (int b = 0; b < B; ++b) {
    for (const mx::array* buf : {&keys[b], &values[b]}) {
      check(buf->ndim() == 4 && buf->shape(0) == 1 && buf->shape(1) == Hkv && buf->shape(3) == D &&
                offsets[b] >= 0 && offsets[b] < buf->shape(2),
            kWhere, "row ", b, ": expected cache buffers (1, ", Hkv, ", > ", offsets[b], ", ", D,
            ")");
      if (buf->dtype() == q.dtype()) {
        in.push_back(*buf);
      } else {
        in.push_back(mx::astype(*buf, q.dtype()));  // a new array: the kernel's own
      }
      shapes.push_back(buf->shape());
      dtypes.push_back(q.dtype());
    }
  }
#if LMX_CUDA_BUILD
  ++calls;
  auto prim = std::make_shared<RowsAttention>(mx::default_stream(mx::Device::gpu), offsets,
                                              in_place, scale, prefill);
  return mx::array::make_arrays(std::move(shapes), std::move(dtypes), prim, std::move(in));
#else
  (void)scale;
  (void)prefill;
  fail(kWhere, "needs a CUDA build");
#endif
}

long long rows_attention_calls() { return calls.load(); }

}  // namespace lmx::kernels::cuda
