#include "io/gguf.h"

#include <cstring>
#include <limits>

#include "core/error.h"

namespace lmx::gguf {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;
constexpr int64_t kQK_K = 256;  // k-quant super-block

struct TypeEntry {
  uint32_t id;
  const char* name;
  int64_t block_size;
  int64_t type_size;
};

// gguf-py GGML_QUANT_SIZES (constants.py), block size and bytes per block.
constexpr TypeEntry kTypes[] = {
    {0, "F32", 1, 4},
    {1, "F16", 1, 2},
    {2, "Q4_0", 32, 2 + 16},
    {3, "Q4_1", 32, 2 + 2 + 16},
    {6, "Q5_0", 32, 2 + 4 + 16},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16},
    {8, "Q8_0", 32, 2 + 32},
    {9, "Q8_1", 32, 4 + 4 + 32},
    {10, "Q2_K", 256, 2 + 2 + kQK_K / 16 + kQK_K / 4},
    {11, "Q3_K", 256, 2 + kQK_K / 4 + kQK_K / 8 + 12},
    {12, "Q4_K", 256, 2 + 2 + kQK_K / 2 + 12},
    {13, "Q5_K", 256, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12},
    {14, "Q6_K", 256, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16},
    {15, "Q8_K", 256, 4 + kQK_K + kQK_K / 8},
    {16, "IQ2_XXS", 256, 2 + kQK_K / 4},
    {17, "IQ2_XS", 256, 2 + kQK_K / 4 + kQK_K / 32},
    {18, "IQ3_XXS", 256, 2 + kQK_K / 4 + kQK_K / 8},
    {19, "IQ1_S", 256, 2 + kQK_K / 8 + kQK_K / 16},
    {20, "IQ4_NL", 32, 2 + 16},
    {21, "IQ3_S", 256, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4},
    {22, "IQ2_S", 256, 2 + kQK_K / 4 + kQK_K / 16},
    {23, "IQ4_XS", 256, 2 + 2 + kQK_K / 2 + kQK_K / 64},
    {24, "I8", 1, 1},
    {25, "I16", 1, 2},
    {26, "I32", 1, 4},
    {27, "I64", 1, 8},
    {28, "F64", 1, 8},
    {29, "IQ1_M", 256, kQK_K / 8 + kQK_K / 16 + kQK_K / 32},
    {30, "BF16", 1, 2},
    {34, "TQ1_0", 256, 2 + 4 * 13},
    {35, "TQ2_0", 256, 2 + 64},
    {39, "MXFP4", 32, 1 + 16},
    {40, "NVFP4", 64, 4 + 32},
    {41, "Q1_0", 128, 2 + 16},
};

const TypeEntry* find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// Bounds-checked little-endian reader over the mapped header.
class Cursor {
 public:
  Cursor(const MappedFile& f) : f_(f) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return f_.size() - pos_; }

  void need(uint64_t n, const std::string& what) const {
    check(n <= remaining(), f_.path(), "truncated file: ", what, " at byte ", pos_, " needs ", n,
          " bytes, only ", remaining(), " left");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, f_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (string length)");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(f_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const MappedFile& f_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of a type, to bound array counts before allocating.
uint64_t min_value_size(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kString:
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kArray:
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

json read_value(Cursor& c, ValueType type, const std::string& key, int depth,
                const std::string& path) {
  const std::string what = "value of '" + key + "'";
  switch (type) {
    case ValueType::kUint8:
      return c.read<uint8_t>(what);
    case ValueType::kInt8:
      return c.read<int8_t>(what);
    case ValueType::kUint16:
      return c.read<uint16_t>(what);
    case ValueType::kInt16:
      return c.read<int16_t>(what);
    case ValueType::kUint32:
      return c.read<uint32_t>(what);
    case ValueType::kInt32:
      return c.read<int32_t>(what);
    case ValueType::kFloat32:
      return static_cast<double>(c.read<float>(what));
    case ValueType::kBool: {
      const uint8_t b = c.read<uint8_t>(what);
      check(b <= 1, path, "metadata '", key, "': bool value ", int(b), ", expected 0 or 1");
      return b == 1;
    }
    case ValueType::kString:
      return c.read_string(what);
    case ValueType::kUint64:
      return c.read<uint64_t>(what);
    case ValueType::kInt64:
      return c.read<int64_t>(what);
    case ValueType::kFloat64:
      return c.read<double>(what);
    case ValueType::kArray: {
      check(depth < kMaxArrayDepth, path, "metadata '", key, "': arrays nested deeper than ",
            kMaxArrayDepth);
      const uint32_t et = c.read<uint32_t>(what + " (array type)");
      check(valid_value_type(et), path, "metadata '", key, "': unknown array element type ", et);
      const uint64_t n = c.read<uint64_t>(what + " (array length)");
      const ValueType elem = static_cast<ValueType>(et);
      check(n <= c.remaining() / min_value_size(elem), path, "metadata '", key, "': array of ", n,
            " ", value_type_name(elem), " values does not fit in the ", c.remaining(),
            " bytes left (truncated or corrupt file?)");
      json arr = json::array();
      arr.get_ref<json::array_t&>().reserve(n);
      for (uint64_t i = 0; i < n; ++i) arr.push_back(read_value(c, elem, key, depth + 1, path));
      return arr;
    }
  }
  fail(path, "metadata '", key, "': unknown value type ", static_cast<uint32_t>(type));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Every formula below multiplies an f16 scale by small integers, which is exact in float32, so
// the only rounding is the final product or sum, as in gguf-py's numpy code.

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(qs[j]);
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

void deq_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  // qs holds 4 chunks of 32 bytes; chunk c gives sub-block 2c (low nibbles) and 2c+1 (high).
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]);
    const float dm = dmin * static_cast<float>(mn[s]);
    const uint8_t* q = qs + (s / 2) * 32;
    const int shift = (s % 2) * 4;
    for (int e = 0; e < 32; ++e)
      y[s * 32 + e] = ds * static_cast<float>((q[e] >> shift) & 0x0f) - dm;
  }
}

void deq_q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  const uint8_t* qh = b + 16;  // 32 bytes: bit s of byte e is the 5th bit of sub-block s
  const uint8_t* qs = b + 48;
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]);
    const float dm = dmin * static_cast<float>(mn[s]);
    const uint8_t* q = qs + (s / 2) * 32;
    const int shift = (s % 2) * 4;
    for (int e = 0; e < 32; ++e) {
      const int v = ((q[e] >> shift) & 0x0f) | (((qh[e] >> s) & 1) << 4);
      y[s * 32 + e] = ds * static_cast<float>(v) - dm;
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;                                        // 128 bytes of low nibbles
  const uint8_t* qh = b + 128;                                  // 64 bytes of 2-bit high parts
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);  // 16 scales, one per 16 weights
  const float d = f16_at(b + 208);
  for (int i = 0; i < 256; ++i) {
    const int c = i / 128, rem = i % 128;
    const int lo = (ql[c * 64 + rem % 64] >> (4 * (rem / 64))) & 0x0f;
    const int hi = (qh[c * 32 + rem % 32] >> (2 * (rem / 32))) & 0x03;
    const float ds = d * static_cast<float>(sc[i / 16]);
    y[i] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

}  // namespace

std::string value_type_name(ValueType t) {
  static const char* names[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                "UINT64", "INT64",   "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "type " + std::to_string(i);
}

std::string type_name(GGMLType t) {
  const TypeEntry* e = find_type(static_cast<uint32_t>(t));
  return e ? e->name : "ggml type " + std::to_string(static_cast<uint32_t>(t));
}

bool can_dequantize(GGMLType t) {
  switch (t) {
    case GGMLType::kF32:
    case GGMLType::kF16:
    case GGMLType::kBF16:
    case GGMLType::kQ4_0:
    case GGMLType::kQ4_1:
    case GGMLType::kQ5_0:
    case GGMLType::kQ5_1:
    case GGMLType::kQ8_0:
    case GGMLType::kQ4_K:
    case GGMLType::kQ5_K:
    case GGMLType::kQ6_K:
      return true;
    default:
      return false;
  }
}

std::optional<BlockLayout> block_layout(uint32_t type) {
  const TypeEntry* e = find_type(type);
  if (!e) return std::nullopt;
  return BlockLayout{e->block_size, e->type_size};
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t TensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

mx::Shape TensorInfo::shape() const {
  mx::Shape s;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) s.push_back(static_cast<int>(*it));
  return s;
}

File::File(const fs::path& path) : file_(std::make_shared<MappedFile>(path)) {
  const std::string& where = file_->path();
  Cursor c(*file_);
  check(file_->size() >= 4 && std::memcmp(file_->data(), "GGUF", 4) == 0, where,
        "not a GGUF file: bad magic, expected 'GGUF'");
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  check(version_ == 2 || version_ == 3, where, "unsupported GGUF version ", version_,
        ", expected 2 or 3");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each entry needs at least a length-prefixed name and a type, so bound the counts by the file.
  check(n_kv <= c.remaining() / 13, where, "metadata count ", n_kv, " cannot fit in a file of ",
        file_->size(), " bytes (truncated or corrupt file?)");
  check(n_tensors <= c.remaining() / 24, where, "tensor count ", n_tensors,
        " cannot fit in a file of ", file_->size(), " bytes (truncated or corrupt file?)");

  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.read_string("metadata key #" + std::to_string(i));
    const uint32_t t = c.read<uint32_t>("type of '" + key + "'");
    check(valid_value_type(t), where, "metadata '", key, "': unknown value type ", t);
    Value v;
    v.type = static_cast<ValueType>(t);
    if (v.type == ValueType::kArray) {
      // Peek the element type for typed access; read_value reads it again.
      c.need(4, "array type of '" + key + "'");
      uint32_t et;
      std::memcpy(&et, file_->data() + c.pos(), 4);
      v.array_type = static_cast<ValueType>(et);
    }
    v.value = read_value(c, v.type, key, 0, where);
    check(metadata_.emplace(key, std::move(v)).second, where, "duplicate metadata key '", key, "'");
  }

  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    const Value& a = it->second;
    check(a.value.is_number_integer(), where, "general.alignment has type ",
          value_type_name(a.type), ", expected an integer");
    const int64_t al = a.value.get<int64_t>();
    check(al > 0 && (al & (al - 1)) == 0 && al <= (1 << 20), where, "general.alignment ", al,
          " is not a power of two");
    alignment_ = static_cast<uint64_t>(al);
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = c.read_string("name of tensor #" + std::to_string(i));
    const std::string tw = "tensor '" + t.name + "'";
    const uint32_t nd = c.read<uint32_t>("n_dims of " + tw);
    check(nd >= 1 && nd <= kMaxDims, where, tw, " has ", nd, " dimensions, expected 1 to ",
          kMaxDims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t v = c.read<uint64_t>("dims of " + tw);
      check(v >= 1 && v < (1ull << 31), where, tw, " has invalid dimension ", v);
      check(numel <= (1ull << 62) / v, where, tw, " has too many elements");
      numel *= v;
      t.dims.push_back(static_cast<int64_t>(v));
    }
    const uint32_t type = c.read<uint32_t>("type of " + tw);
    const auto layout = block_layout(type);
    check(layout.has_value(), where, tw, " has unknown ggml type ", type);
    t.type = static_cast<GGMLType>(type);
    check(t.dims[0] % layout->block_size == 0, where, tw, " row length ", t.dims[0],
          " is not a multiple of the ", type_name(t.type), " block size ", layout->block_size);
    t.nbytes = numel / layout->block_size * layout->type_size;
    t.offset = c.read<uint64_t>("offset of " + tw);
    check(t.offset % alignment_ == 0, where, tw, " data offset ", t.offset,
          " is not a multiple of the alignment ", alignment_);
    check(index_.emplace(t.name, tensors_.size()).second, where, "duplicate tensor name '", t.name,
          "'");
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    const uint64_t rel = t.offset;
    check(rel <= file_->size() && data_offset_ <= file_->size() - rel &&
              t.nbytes <= file_->size() - data_offset_ - rel,
          where, "tensor '", t.name, "' (", type_name(t.type), ", ", t.nbytes,
          " bytes at data offset ", rel, ") extends past the end of the file (", file_->size(),
          " bytes; truncated file?)");
    t.offset = data_offset_ + rel;
  }
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  check(t != nullptr, path(), "tensor '", name, "' not found");
  return *t;
}

const Value& File::value(const std::string& key) const {
  auto it = metadata_.find(key);
  check(it != metadata_.end(), path(), "missing metadata key '", key, "'");
  return it->second;
}

std::string File::get_string(const std::string& key) const {
  const Value& v = value(key);
  check(v.type == ValueType::kString, path(), "metadata '", key, "' has type ",
        value_type_name(v.type), ", expected STRING");
  return v.value.get<std::string>();
}

int64_t File::get_int(const std::string& key) const {
  const Value& v = value(key);
  check(v.value.is_number_integer(), path(), "metadata '", key, "' has type ",
        value_type_name(v.type), ", expected an integer");
  if (v.value.is_number_unsigned()) {
    const uint64_t u = v.value.get<uint64_t>();
    check(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path(), "metadata '",
          key, "' value ", u, " is too large");
    return static_cast<int64_t>(u);
  }
  return v.value.get<int64_t>();
}

double File::get_float(const std::string& key) const {
  const Value& v = value(key);
  check(v.value.is_number(), path(), "metadata '", key, "' has type ", value_type_name(v.type),
        ", expected a number");
  return v.value.get<double>();
}

bool File::get_bool(const std::string& key) const {
  const Value& v = value(key);
  check(v.value.is_boolean(), path(), "metadata '", key, "' has type ", value_type_name(v.type),
        ", expected BOOL");
  return v.value.get<bool>();
}

std::optional<std::string> File::opt_string(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}
std::optional<int64_t> File::opt_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}
std::optional<double> File::opt_float(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}
std::optional<bool> File::opt_bool(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}

const json& File::get_array(const std::string& key, std::optional<ValueType> elem) const {
  const Value& v = value(key);
  check(v.type == ValueType::kArray, path(), "metadata '", key, "' has type ",
        value_type_name(v.type), ", expected ARRAY");
  check(!elem || v.array_type == *elem, path(), "metadata '", key, "' is an array of ",
        value_type_name(v.array_type), ", expected ", value_type_name(*elem));
  return v.value;
}

void dequantize_row(GGMLType type, const uint8_t* src, float* dst, int64_t n) {
  auto blocks = [&](int64_t bs, int64_t ts, void (*f)(const uint8_t*, float*)) {
    for (int64_t i = 0; i < n / bs; ++i) f(src + i * ts, dst + i * bs);
  };
  switch (type) {
    case GGMLType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case GGMLType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      return;
    case GGMLType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    case GGMLType::kQ4_0:
      return blocks(32, 18, deq_q4_0);
    case GGMLType::kQ4_1:
      return blocks(32, 20, deq_q4_1);
    case GGMLType::kQ5_0:
      return blocks(32, 22, deq_q5_0);
    case GGMLType::kQ5_1:
      return blocks(32, 24, deq_q5_1);
    case GGMLType::kQ8_0:
      return blocks(32, 34, deq_q8_0);
    case GGMLType::kQ4_K:
      return blocks(256, 144, deq_q4_k);
    case GGMLType::kQ5_K:
      return blocks(256, 176, deq_q5_k);
    case GGMLType::kQ6_K:
      return blocks(256, 210, deq_q6_k);
    default:
      fail("gguf", "cannot dequantize ", type_name(type),
           ", supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K");
  }
}

mx::array dequantize(const File& file, const TensorInfo& t) {
  check(
      can_dequantize(t.type), file.path(), "tensor '", t.name, "' has type ", type_name(t.type),
      ", which lmx cannot read (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K)");
  const int64_t n = t.numel();
  auto* buf = new float[n];
  const int64_t row = t.row_length();
  const int64_t row_bytes = static_cast<int64_t>(t.nbytes) / t.rows();
  const uint8_t* src = file.data(t);
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row(t.type, src + r * row_bytes, buf + r * row, row);
  return mx::array(buf, t.shape(), mx::float32, [](void* p) { delete[] static_cast<float*>(p); });
}

}  // namespace lmx::gguf
