// GGUF reading: header, typed metadata (arrays included), tensor infos and the aligned data
// section, validated against the file size; block dequantization to float32 for the formats lmx
// converts.
//
// Layout (gguf-py / llama.cpp): "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata
// count, metadata as (string key, u32 type, value), tensor infos as (string name, u32 n_dims,
// u64 dims fastest-varying first, u32 ggml type, u64 offset into the data section), then the data
// section at the next multiple of `general.alignment` (default 32). Strings are u64 length + bytes.
#pragma once

#include <mlx/mlx.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "io/safetensors.h"

namespace lmx::gguf {

namespace mx = mlx::core;

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string value_type_name(ValueType t);

// ggml tensor types (gguf-py GGMLQuantizationType). Only the ones with a block size known here can
// be read; `dequantize` supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
enum class GGMLType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};
std::string type_name(GGMLType t);
bool can_dequantize(GGMLType t);

struct BlockLayout {
  int64_t block_size = 0;  // weights per block
  int64_t type_size = 0;   // bytes per block
};
// Block layout of any ggml type id gguf-py knows; nullopt for unknown ids.
std::optional<BlockLayout> block_layout(uint32_t type);

// One metadata value. Scalars and strings are stored as JSON scalars, arrays as JSON arrays
// (nested arrays nest). `array_type` is the element type of a top-level array.
struct Value {
  ValueType type = ValueType::kUint8;
  ValueType array_type = ValueType::kUint8;
  json value;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  GGMLType type = GGMLType::kF32;
  uint64_t offset = 0;  // absolute offset in the file
  uint64_t nbytes = 0;
  int64_t numel() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t rows() const;     // product of the other dims
  mx::Shape shape() const;  // row-major (reversed dims): a GGUF [in, out] matrix is [out, in]
};

class File {
 public:
  // Maps and validates the whole header. Throws lmx::Error naming the file and the field.
  explicit File(const std::filesystem::path& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, Value>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  const TensorInfo& tensor(const std::string& name) const;  // throws when missing
  const uint8_t* data(const TensorInfo& t) const { return file_->data() + t.offset; }

  bool has(const std::string& key) const { return metadata_.count(key) > 0; }
  const Value& value(const std::string& key) const;  // throws when missing
  // Typed getters: integer getters accept any integer type, float getters any number.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::optional<std::string> opt_string(const std::string& key) const;
  std::optional<int64_t> opt_int(const std::string& key) const;
  std::optional<double> opt_float(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  // A top-level array whose elements have type `elem` (or any type when nullopt).
  const json& get_array(const std::string& key, std::optional<ValueType> elem = {}) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, Value> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Dequantizes `n` weights (a multiple of the block size) of type `type` from `src` to float32,
// with gguf-py's arithmetic (`gguf.quants.dequantize`), so the values are bit-identical to it.
void dequantize_row(GGMLType type, const uint8_t* src, float* dst, int64_t n);

// The whole tensor as float32 in row-major shape `t.shape()`.
mx::array dequantize(const File& file, const TensorInfo& t);

}  // namespace lmx::gguf
