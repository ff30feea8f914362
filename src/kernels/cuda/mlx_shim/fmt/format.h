// MLX's installed CUDA backend header mlx/backend/cuda/lru_cache.h includes <fmt/format.h>, which
// the wheel does not ship, for one error message inside a template lmx never instantiates;
// qmm.cpp needs the header's neighbours (device.h: the command encoder), so a declaration does.
#pragma once
#include <string>
namespace fmt {
template <typename... Args>
std::string format(const char* f, Args&&... args);
}  // namespace fmt
