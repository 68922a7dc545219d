// The test data directory: $TRISOLVE_TEST_DATA where set (tests run from an installed or copied
// tree, the GPU machine's bundle), else the source tree's tests/data compiled in. Included into
// every test (tests/CMakeLists.txt), where TRISOLVE_TEST_DATA names TestDataDir().
#pragma once

#include <cstdlib>

namespace trisolve::testing {

inline const char* TestDataDir() {
  const char* dir = std::getenv("TRISOLVE_TEST_DATA");
  return dir != nullptr && *dir != '\0' ? dir : TRISOLVE_TEST_DATA_DIR;
}

}  // namespace trisolve::testing
