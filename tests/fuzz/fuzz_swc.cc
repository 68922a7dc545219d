// libFuzzer: the SWC morphology parser (client/swc.cc) on arbitrary text. Every input must give a
// morphology whose parent array is a valid tree (parent[0] = -1, parent[i] < i), or an error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trisolve/swc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto m = trisolve::ParseSwc(text, "fuzz.swc");
  if (m.ok()) {
    const int64_t n = m->size();
    if (n < 1 || m->parent[0] != -1) __builtin_trap();
    for (int64_t i = 1; i < n; ++i)
      if (m->parent[size_t(i)] < 0 || m->parent[size_t(i)] >= i) __builtin_trap();
    if (int64_t(m->x.size()) != n || int64_t(m->radius.size()) != n) __builtin_trap();
  }
  return 0;
}
