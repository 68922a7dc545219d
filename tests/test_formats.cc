#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "gtest/gtest.h"
#include "trisolve/ndarray.h"
#include "trisolve/swc.h"

namespace trisolve {
namespace {

// Per process: ctest -j may run this suite's tests at once.
std::string Tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("trisolve_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// A version 1 .npy: the header dict padded as numpy pads it, then `body`.
std::string NpyBytes(std::string dict, const std::string& body) {
  dict.append(64 - (10 + dict.size() + 1) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(char(dict.size() & 0xff));
  out.push_back(char(dict.size() >> 8));
  return out + dict + body;
}

TEST(Npy, RoundTripEveryType) {
  auto d = NdArray::From<double>({2, 3}, {1, 2, 3, 4, 5, 6.5});
  ASSERT_TRUE(WriteNpy(Tmp("d.npy"), d.view()).ok());
  auto r = ReadNpy(Tmp("d.npy"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dtype, DType::kFloat64);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->as<double>()[5], 6.5);
  auto i = NdArray::From<int64_t>({4}, {-1, 0, 1, 1});
  ASSERT_TRUE(WriteNpy(Tmp("i.npy"), i.view()).ok());
  auto ri = ReadNpy(Tmp("i.npy"));
  ASSERT_TRUE(ri.ok());
  EXPECT_EQ(ri->dtype, DType::kInt64);
  EXPECT_EQ(ri->shape, (std::vector<int64_t>{4}));
  auto i32 = ri->ConvertTo(DType::kInt32);
  ASSERT_TRUE(i32.ok());
  EXPECT_EQ(i32->as<int32_t>()[0], -1);
  auto f = d.ConvertTo(DType::kFloat32);
  ASSERT_TRUE(WriteNpy(Tmp("f.npy"), f->view()).ok());
  EXPECT_EQ(ReadNpy(Tmp("f.npy"))->dtype, DType::kFloat32);
}

// Found by fuzzing the reader (tests/fuzz/fuzz_npy.cc): a shape whose byte count is huge or
// overflows made the CLI abort (std::bad_alloc / std::length_error from the allocation).
TEST(Npy, CraftedHeadersGiveErrorsNotAborts) {
  const std::string body(64, '\0');
  for (const std::string shape :
       {"(1000000000000,)", "(3037000500, 3037000500)", "(4611686018427387904, 4)",
        "(2305843009213693952,)", "(-1,)", "(9223372036854775808,)", "(9,)",
        "(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
        "1, 1, 1, 1,)"}) {
    std::istringstream in(NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': " + shape +
                                       ", }",
                                   body));
    auto r = ReadNpy(in, "crafted.npy");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << shape;
  }
  // The same reader on good bytes in memory: 8 float64 values, 64 bytes.
  std::istringstream good(NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }",
                                   body));
  auto r = ReadNpy(good, "good.npy");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(r->data.size(), 64u);
  // A client-supplied dtype is shown bounded in the message.
  std::istringstream long_descr(NpyBytes("{'descr': '" + std::string(5000, 'x') + "', }", ""));
  auto st = ReadNpy(long_descr, "descr.npy").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(st.message().size(), 200u) << st;
}

TEST(Npy, RejectsWhatItCannotRead) {
  {
    std::ofstream o(Tmp("bad.npy"), std::ios::binary);
    o << "not numpy";
  }
  EXPECT_EQ(ReadNpy(Tmp("bad.npy")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadNpy(Tmp("missing.npy")).status().code(), absl::StatusCode::kNotFound);
  // A Fortran-order header, hand-written as numpy would.
  {
    std::string h = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }";
    h.append(64 - (10 + h.size() + 1) % 64, ' ');
    h.push_back('\n');
    std::ofstream o(Tmp("fortran.npy"), std::ios::binary);
    o.write("\x93NUMPY\x01\x00", 8);
    const char l[2] = {char(h.size() & 0xff), char(h.size() >> 8)};
    o.write(l, 2);
    o << h;
    const double v[4] = {1, 2, 3, 4};
    o.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  auto st = ReadNpy(Tmp("fortran.npy")).status();
  EXPECT_NE(st.message().find("Fortran"), absl::string_view::npos) << st;
  EXPECT_FALSE(NdArray::From<int64_t>({1}, {int64_t{1} << 40}).ConvertTo(DType::kInt32).ok());
}

TEST(Swc, ParsesAndRenumbers) {
  auto m = ParseSwc("# comment\n10 1 0 0 0 5 -1\n12 3 1 0 0 1 10\n13 3 2 0 0 1 12\n20 3 0 1 0 1 10\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parent, (std::vector<int32_t>{-1, 0, 1, 0}));
  EXPECT_EQ(m->radius[0], 5);
}

TEST(Swc, RejectsWhatIsNotADepthFirstTree) {
  EXPECT_FALSE(ParseSwc("1 1 0 0 0 1 -1\n2 3 0 0 0 1 3\n3 3 0 0 0 1 1\n").ok());  // child first
  EXPECT_FALSE(ParseSwc("1 1 0 0 0 1 -1\n2 1 0 0 0 1 -1\n").ok());               // two roots
  EXPECT_FALSE(ParseSwc("1 1 0 0 0 -1\n").ok());                                   // 6 fields
  EXPECT_FALSE(ParseSwc("# nothing\n").ok());
  EXPECT_FALSE(ParseSwc("1 1 0 0 0 1 -1\n1 3 0 0 0 1 1\n").ok());  // duplicate id
}

TEST(Swc, TheRealMorphology) {
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), 3187);
  int branch_points = 0;
  std::vector<int> children(m->size());
  for (int64_t i = 1; i < m->size(); ++i) ++children[m->parent[i]];
  for (int c : children) branch_points += c > 1;
  EXPECT_GT(branch_points, 300);
}

}  // namespace
}  // namespace trisolve
