#include "convert/gguf_quant.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace lmx::convert {

using gguf::GGMLType;

namespace {

static_assert(std::endian::native == std::endian::little,
              "MLX packing is a little-endian bitstream; this code writes bytes");

template <typename T>
mx::array owned(std::vector<T>&& v, mx::Shape shape, mx::Dtype dtype) {
  auto* heap = new std::vector<T>(std::move(v));
  return mx::array(heap->data(), std::move(shape), dtype, [heap](void*) { delete heap; });
}

float f16_bits_to_float(const uint8_t* p) {
  // Routed through MLX's half type: exact for every f16 value.
  mx::float16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
}

// Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed into 12 bytes.
void k_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3f;
    mn[i] = s[4 + i] & 0x3f;
    sc[4 + i] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
    mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
  }
}

// One block: q in [0, 2^bits) for its 32 (legacy) or 256 (k-quant) weights, and one scale and
// bias per group of 32. Products of an f16 and a small integer are exact in float32.
void unpack_block(GGMLType type, const uint8_t* b, uint8_t* q, float* scale, float* bias) {
  switch (type) {
    case GGMLType::kQ4_0: {
      scale[0] = f16_bits_to_float(b);
      bias[0] = -8.0f * scale[0];
      for (int j = 0; j < 16; ++j) {
        q[j] = b[2 + j] & 0x0f;
        q[j + 16] = b[2 + j] >> 4;
      }
      return;
    }
    case GGMLType::kQ4_1: {
      scale[0] = f16_bits_to_float(b);
      bias[0] = f16_bits_to_float(b + 2);
      for (int j = 0; j < 16; ++j) {
        q[j] = b[4 + j] & 0x0f;
        q[j + 16] = b[4 + j] >> 4;
      }
      return;
    }
    case GGMLType::kQ5_0:
    case GGMLType::kQ5_1: {
      const bool has_min = type == GGMLType::kQ5_1;
      scale[0] = f16_bits_to_float(b);
      bias[0] = has_min ? f16_bits_to_float(b + 2) : -16.0f * scale[0];
      const uint8_t* qhp = b + (has_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, qhp, 4);
      const uint8_t* qs = qhp + 4;
      for (int j = 0; j < 16; ++j) {
        q[j] = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      }
      return;
    }
    case GGMLType::kQ8_0: {
      scale[0] = f16_bits_to_float(b);
      bias[0] = -128.0f * scale[0];
      for (int j = 0; j < 32; ++j) q[j] = b[2 + j] ^ 0x80;  // int8 q -> q + 128
      return;
    }
    case GGMLType::kQ4_K:
    case GGMLType::kQ5_K: {
      const bool five = type == GGMLType::kQ5_K;
      const float d = f16_bits_to_float(b), dmin = f16_bits_to_float(b + 2);
      uint8_t sc[8], mn[8];
      k_scale_min(b + 4, sc, mn);
      const uint8_t* qh = b + 16;  // Q5_K: bit s of byte e is the 5th bit of sub-block s
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        scale[s] = d * static_cast<float>(sc[s]);
        bias[s] = -(dmin * static_cast<float>(mn[s]));
        // qs: 4 chunks of 32 bytes; chunk c holds sub-block 2c (low nibbles) and 2c+1 (high).
        const uint8_t* chunk = qs + (s / 2) * 32;
        const int shift = (s % 2) * 4;
        for (int e = 0; e < 32; ++e) {
          uint8_t v = (chunk[e] >> shift) & 0x0f;
          if (five) v |= ((qh[e] >> s) & 1) << 4;
          q[s * 32 + e] = v;
        }
      }
      return;
    }
    default:
      fail("gguf", "not an affine block type: ", gguf::type_name(type));
  }
}

// Element j of a row occupies stream bits [j*bits, (j+1)*bits), LSB first.
void pack_values(const uint8_t* q, int n, int bits, int64_t first, uint8_t* row_bytes) {
  for (int j = 0; j < n; ++j) {
    const uint64_t pos = static_cast<uint64_t>(first + j) * bits;
    const uint32_t v = static_cast<uint32_t>(q[j]) << (pos % 8);
    uint8_t* p = row_bytes + pos / 8;
    p[0] |= static_cast<uint8_t>(v);
    if ((pos % 8) + bits > 8) p[1] |= static_cast<uint8_t>(v >> 8);
  }
}

}  // namespace

bool is_affine_block_type(GGMLType t) { return affine_block_bits(t) != 0; }

int affine_block_bits(GGMLType t) {
  switch (t) {
    case GGMLType::kQ4_0:
    case GGMLType::kQ4_1:
    case GGMLType::kQ4_K:
      return 4;
    case GGMLType::kQ5_0:
    case GGMLType::kQ5_1:
    case GGMLType::kQ5_K:
      return 5;
    case GGMLType::kQ8_0:
      return 8;
    default:
      return 0;
  }
}

std::optional<Repacked> repack_affine_blocks(const gguf::File& file, const gguf::TensorInfo& t,
                                             mx::Dtype dtype,
                                             const std::vector<int64_t>* row_order) {
  check(is_affine_block_type(t.type), file.path(), "tensor '", t.name,
        "': ", gguf::type_name(t.type), " is not an affine block type");
  check(t.dims.size() == 2, file.path(), "tensor '", t.name, "' has ", t.dims.size(),
        " dimensions, expected a 2-D matrix");
  const int bits = affine_block_bits(t.type);
  const auto layout = *gguf::block_layout(static_cast<uint32_t>(t.type));
  const int64_t block = layout.block_size, per_block = block / 32;
  const int64_t cols = t.dims[0], rows = t.dims[1], nblocks = cols / block, ngroups = cols / 32;
  const int64_t row_bytes_in = nblocks * layout.type_size;
  const int64_t words = cols * bits / 32;
  check(!row_order || static_cast<int64_t>(row_order->size()) == rows, file.path(), "tensor '",
        t.name, "': row order has ", row_order ? row_order->size() : 0, " rows, expected ", rows);

  std::vector<uint32_t> packed(rows * words, 0);
  std::vector<float> scale(rows * ngroups), bias(rows * ngroups);
  const uint8_t* src = file.data(t);
  std::vector<uint8_t> q(block);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = src + (row_order ? (*row_order)[r] : r) * row_bytes_in;
    auto* out = reinterpret_cast<uint8_t*>(packed.data() + r * words);
    for (int64_t k = 0; k < nblocks; ++k) {
      const int64_t g = r * ngroups + k * per_block;
      unpack_block(t.type, in + k * layout.type_size, q.data(), &scale[g], &bias[g]);
      pack_values(q.data(), static_cast<int>(block), bits, k * block, out);
    }
  }
  const mx::Shape sshape = {static_cast<int>(rows), static_cast<int>(ngroups)};
  mx::array s32 = owned(std::move(scale), sshape, mx::float32);
  mx::array b32 = owned(std::move(bias), sshape, mx::float32);
  mx::array scales = mx::astype(s32, dtype);
  mx::array biases = mx::astype(b32, dtype);
  mx::array finite = mx::logical_and(mx::all(mx::isfinite(scales)), mx::all(mx::isfinite(biases)));
  mx::array exact = mx::logical_and(mx::all(mx::equal(mx::astype(scales, mx::float32), s32)),
                                    mx::all(mx::equal(mx::astype(biases, mx::float32), b32)));
  mx::eval(scales, biases, finite, exact);
  if (!finite.item<bool>()) return std::nullopt;
  mx::array weight =
      owned(std::move(packed), {static_cast<int>(rows), static_cast<int>(words)}, mx::uint32);
  return Repacked{AffineTensor{weight, scales, biases, bits, 32}, exact.item<bool>()};
}

AffineTensor quantize_float(const mx::array& w, int bits, int group_size, mx::Dtype dtype) {
  auto q = mx::quantize(w, group_size, bits);
  mx::array scales = mx::astype(q[1], dtype), biases = mx::astype(q[2], dtype);
  mx::eval(q[0], scales, biases);
  return AffineTensor{q[0], scales, biases, bits, group_size};
}

}  // namespace lmx::convert
