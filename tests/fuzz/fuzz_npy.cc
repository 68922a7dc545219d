// libFuzzer: the .npy reader (client/npy.cc) on arbitrary bytes. Every input must give an array
// or an error status: no crash, no leak, no undefined behaviour, no allocation beyond the bytes
// the input holds.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "trisolve/ndarray.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto a = trisolve::ReadNpy(in, "fuzz.npy");
  if (a.ok()) {
    // What the reader promises: the data are the shape's bytes.
    const int64_t bytes = a->elements() * trisolve::DTypeSize(a->dtype);
    if (bytes != int64_t(a->data.size()) || bytes > int64_t(size)) __builtin_trap();
  }
  return 0;
}
