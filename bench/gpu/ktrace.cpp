// A kernel tracer for the GPU machine, where Nsight Systems cannot make reports and Nsight
// Compute replays every kernel (minutes for one Qwen3-4B run). Loaded with LD_PRELOAD into any
// CUDA program (lmx, python3 -m mlx_lm), it records every kernel and memory copy through CUPTI's
// activity API, which timestamps them on the GPU without serialising them, and writes one CSV
// line per record at exit to $LMX_KTRACE (default ktrace.csv):
//   kind,start_ns,end_ns,stream,grid,block,name
// Built by bench/gpu/profile.sh's caller here (scripts/gpu/pack.sh) against the toolkit's CUPTI
// headers; at run time libcupti.so.13 comes from the machine (profile.sh finds it).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  char kind;  // 'K' kernel, 'M' memcpy, 'S' memset
  unsigned long long start, end;
  unsigned stream;
  std::string grid, block, name;
};

std::mutex mu;
std::vector<Record>* records = nullptr;
constexpr size_t kBufferBytes = 8u << 20;

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  for (char& c : s)
    if (c == ',' || c == '\n') c = ';';  // keep the CSV's columns
  return s;
}

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Record> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      got.push_back({'K', k->start, k->end, k->streamId,
                     std::to_string(k->gridX) + "x" + std::to_string(k->gridY) + "x" +
                         std::to_string(k->gridZ),
                     std::to_string(k->blockX) + "x" + std::to_string(k->blockY) + "x" +
                         std::to_string(k->blockZ),
                     demangle(k->name)});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      got.push_back({'M', m->start, m->end, m->streamId, std::to_string(m->bytes), "",
                     "memcpy kind " + std::to_string(m->copyKind)});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      got.push_back({'S', m->start, m->end, m->streamId, std::to_string(m->bytes), "", "memset"});
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(mu);
  if (records != nullptr) records->insert(records->end(), got.begin(), got.end());
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "[ktrace] %s failed: %s\n", what, msg != nullptr ? msg : "?");
}

__attribute__((constructor)) void start() {
  records = new std::vector<Record>();
  records->reserve(1 << 20);
  check(cuptiActivityRegisterCallbacks(requested, completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
}

__attribute__((destructor)) void stop() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("LMX_KTRACE");
  if (path == nullptr || *path == '\0') path = "ktrace.csv";
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "[ktrace] cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(f, "kind,start_ns,end_ns,stream,grid,block,name\n");
  for (const Record& r : *records)
    std::fprintf(f, "%c,%llu,%llu,%u,%s,%s,%s\n", r.kind, r.start, r.end, r.stream, r.grid.c_str(),
                 r.block.c_str(), r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "[ktrace] %zu records -> %s\n", records->size(), path);
}

}  // namespace
