#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lmx {

namespace fs = std::filesystem;

MappedFile::MappedFile(const fs::path& path) : path_(path.string()) {
  int fd = ::open(path_.c_str(), O_RDONLY);
  check(fd >= 0, path_, "cannot open file: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path_, "cannot stat file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    check(p != MAP_FAILED, path_, "mmap failed: ", std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

struct DtypeName {
  const char* name;
  mx::Dtype dtype;
};

// F8 formats have no MLX dtype; MLX reads them as raw bytes.
constexpr DtypeName kDtypes[] = {
    {"F32", mx::float32}, {"F16", mx::float16},   {"BF16", mx::bfloat16}, {"F64", mx::float64},
    {"I8", mx::int8},     {"I16", mx::int16},     {"I32", mx::int32},     {"I64", mx::int64},
    {"U8", mx::uint8},    {"U16", mx::uint16},    {"U32", mx::uint32},    {"U64", mx::uint64},
    {"BOOL", mx::bool_},  {"C64", mx::complex64}, {"F8_E4M3", mx::uint8}, {"F8_E8M0", mx::uint8},
};

constexpr size_t kMaxHeader = 100'000'000;

// Drops the resident pages wholly inside [offset, offset + n) of a read-only private mapping
// (they are read again from the file if touched), for ranges already copied out. Advice only: a
// failure leaves the pages resident, which is correct, just larger.
void release_pages(const MappedFile& file, size_t offset, size_t n) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page;
  const size_t end = std::min(offset + n, file.size()) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(file.data()) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace

std::string dtype_name(mx::Dtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "unknown";
}

std::string shape_str(const mx::Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsHeader parse_safetensors_header(const MappedFile& file) {
  const std::string& where = file.path();
  check(file.size() >= 8, where, "file too small for a safetensors header (", file.size(),
        " bytes)");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  check(n > 0 && n < kMaxHeader, where, "header length ", n, " is invalid");
  check(8 + n <= file.size(), where, "header length ", n, " exceeds the file size ", file.size(),
        " (truncated file?)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file.data() + 8, file.data() + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail(where, "corrupt safetensors header: ", e.what());
  }
  check(j.is_object(), where, "safetensors header is not a JSON object");
  SafetensorsHeader h;
  const size_t data_start = 8 + n;
  const size_t data_size = file.size() - data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;  // MLX writes null when there is no metadata
      check(it->is_object(), where, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        check(m->is_string(), where, "__metadata__ value '", m.key(), "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tw = where + ": tensor '" + it.key() + "'";
    const auto& t = *it;
    check(t.is_object() && t.contains("dtype") && t.contains("shape") && t.contains("data_offsets"),
          tw, "needs dtype, shape and data_offsets");
    TensorInfo info;
    info.name = it.key();
    check(t["dtype"].is_string(), tw, "dtype is not a string");
    const std::string ds = t["dtype"].get<std::string>();
    auto d = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                          [&](const DtypeName& x) { return ds == x.name; });
    check(d != std::end(kDtypes), tw, "unsupported dtype '", ds, "'");
    info.dtype = d->dtype;
    check(t["shape"].is_array(), tw, "shape is not an array");
    size_t numel = 1;
    for (const auto& s : t["shape"]) {
      check(s.is_number_unsigned() && s.get<uint64_t>() < (1ull << 31), tw, "invalid dimension ",
            s.dump());
      info.shape.push_back(s.get<int>());
      numel *= s.get<size_t>();
    }
    const auto& off = t["data_offsets"];
    check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
              off[1].is_number_unsigned(),
          tw, "data_offsets must be two unsigned integers");
    const size_t b = off[0].get<size_t>(), e = off[1].get<size_t>();
    check(b <= e && e <= data_size, tw, "data_offsets [", b, ", ", e,
          "] fall outside the data section of ", data_size, " bytes (truncated file?)");
    const size_t expect = numel * mx::size_of(info.dtype);
    check(e - b == expect, tw, "byte size ", e - b, " does not match shape ", shape_str(info.shape),
          " of ", ds, ", expected ", expect);
    info.offset = data_start + b;
    info.nbytes = e - b;
    h.tensors.push_back(std::move(info));
  }
  return h;
}

Weights load_safetensors(const fs::path& path, Metadata* metadata) {
  auto file = std::make_shared<MappedFile>(path);
  SafetensorsHeader h = parse_safetensors_header(*file);
  if (metadata) *metadata = h.metadata;
  Weights out;
  // MLX wraps the mapping where its allocator can (no copy; the deleter keeps the mapping alive),
  // else lmx copies each tensor into an MLX buffer itself, a few MiB at a time, dropping the pages
  // already copied: a load peaks at one copy of the weights plus one chunk, not two copies or one
  // plus the largest tensor (the embedding).
  bool wraps = false;
  for (const auto& t : h.tensors)
    if (t.nbytes > 0) {
      void* ptr = const_cast<uint8_t*>(file->data() + t.offset);
      mx::allocator::Buffer b = mx::allocator::make_buffer(ptr, t.nbytes);
      if (b.ptr() != nullptr) {
        mx::allocator::release(b);
        wraps = true;
      }
      break;
    }
  // In file order, so that the pages a tensor shares with the one before it are dropped too.
  std::vector<const TensorInfo*> order;
  for (const auto& t : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t released = 0, run_end = 0;  // the run's pages before `released` are dropped already
  for (const auto* tp : order) {
    const auto& t = *tp;
    const uint8_t* src = file->data() + t.offset;
    if (t.nbytes == 0) {
      out.emplace(t.name, mx::zeros(t.shape, t.dtype));
    } else if (wraps) {
      out.emplace(t.name, mx::array(const_cast<uint8_t*>(src), t.shape, t.dtype, [file](void*) {}));
    } else {
      if (t.offset != run_end) released = t.offset;
      mx::allocator::Data data = mx::allocator::malloc(t.nbytes);
      auto* dst = static_cast<uint8_t*>(data.buffer().raw_ptr());
      constexpr size_t kChunk = size_t{4} << 20;
      for (size_t done = 0; done < t.nbytes;) {
        // chunks end on kChunk boundaries of the file, so each released range is whole pages
        const size_t end =
            std::min(t.nbytes, (t.offset + done) / kChunk * kChunk + kChunk - t.offset);
        std::memcpy(dst + done, src + done, end - done);
        release_pages(*file, released, t.offset + end - released);
        released = std::max(released, (t.offset + end) / page * page);
        done = end;
      }
      run_end = t.offset + t.nbytes;
      out.emplace(t.name, mx::array(std::move(data), t.shape, t.dtype));
    }
  }
  return out;
}

Weights load_model_weights(const fs::path& dir) {
  check(fs::is_directory(dir), dir.string(), "model directory does not exist");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model", 0) == 0 && e.path().extension() == ".safetensors")
      files.push_back(e.path());
  }
  check(!files.empty(), dir.string(), "no model*.safetensors files found");
  std::sort(files.begin(), files.end());
  Weights all;
  for (const auto& f : files) {
    for (auto& [k, v] : load_safetensors(f)) {
      check(!all.count(k), f.string(), "tensor '", k, "' appears in more than one shard");
      all.emplace(k, std::move(v));
    }
  }
  return all;
}

void save_safetensors(const fs::path& path, const Weights& weights, const Metadata& metadata) {
  // mx::save_safetensors appends the extension when it is missing; keep that naming.
  fs::path target = path;
  if (target.extension() != ".safetensors") target += ".safetensors";
  // Written beside the target and renamed over it: a reader (or a kill at any moment) sees the
  // old file or the whole new one, never a torn one. The name keeps MLX's extension.
  std::string name = ".";
  name.append(target.filename().string())
      .append(".partial-")
      .append(std::to_string(::getpid()))
      .append(".safetensors");
  const fs::path tmp = target.parent_path() / name;
  std::unordered_map<std::string, mx::array> w(weights.begin(), weights.end());
  std::unordered_map<std::string, std::string> m(metadata.begin(), metadata.end());
  try {
    mx::save_safetensors(tmp.string(), std::move(w), std::move(m));
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(target.string(), "cannot write safetensors: ", e.what());
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail(target.string(), "cannot move ", tmp.string(), " into place: ", ec.message());
  }
}

}  // namespace lmx
