// The process's malloc heap.
#pragma once

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace lmx {

// Hands the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing). Buffers
// freed below glibc's mmap threshold, which rises to the largest buffer freed so far, otherwise
// stay resident until the heap's top is free (docs/memory.md).
inline void trim_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace lmx
