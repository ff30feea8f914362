// safetensors reading (mmap, validated header, zero-copy where MLX takes the pointer) and writing.
#pragma once

#include <mlx/mlx.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace lmx {

namespace mx = mlx::core;

using Weights = std::unordered_map<std::string, mx::array>;
using Metadata = std::map<std::string, std::string>;

// A read-only memory map of a whole file; arrays made from it keep it alive.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct TensorInfo {
  std::string name;
  mx::Dtype dtype = mx::float32;
  mx::Shape shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  Metadata metadata;
};

// Parses and validates the header: JSON size, dtypes, shapes against byte ranges, ranges inside
// the file. Throws lmx::Error naming the file and tensor.
SafetensorsHeader parse_safetensors_header(const MappedFile& file);

// Loads every tensor of one file.
Weights load_safetensors(const std::filesystem::path& path, Metadata* metadata = nullptr);

// Loads every `model*.safetensors` in a directory (mlx-lm's glob; the index is not consulted).
Weights load_model_weights(const std::filesystem::path& dir);

// Writes one file in MLX's layout (the same bytes as mx.save_safetensors), through a temporary
// file beside it renamed into place, so the path never holds a partly written file.
void save_safetensors(const std::filesystem::path& path, const Weights& weights,
                      const Metadata& metadata = {{"format", "mlx"}});

std::string dtype_name(mx::Dtype dtype);
std::string shape_str(const mx::Shape& shape);

}  // namespace lmx
