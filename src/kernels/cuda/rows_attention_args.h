// The parameters of rows_attention.cuh's kernels, passed by value (one launch takes up to
// kLmxRowsPerLaunch rows: 1.6 KB of the 4 KB a launch's parameters may hold). Plain C++, shared
// by the kernels and the host side (rows_attention.cpp).
#pragma once

constexpr int kLmxRowsPerLaunch = 64;

struct LmxRowsAttnRow {
  void* k;  // (Hkv, cap, D) of this row's dtype
  void* v;
  int len;  // positions attended, the new one included (offset + 1)
  int cap;  // positions the buffers hold
};

struct LmxRowsAttnArgs {
  const void* q;      // (n, Hq, D)
  const void* k_new;  // (n, Hkv, D)
  const void* v_new;
  void* out;    // (n, Hq, D)
  float* part;  // (n, Hq, splits, D + 2) when splits > 1, else null
  int Hq, Hkv;
  int chunk;         // positions per split
  int splits;        // gridDim.z
  float scale_log2;  // scale * log2(e)
  int n;
  LmxRowsAttnRow rows[kLmxRowsPerLaunch];
};
