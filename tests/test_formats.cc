#include <algorithm>
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
  // A type it does not take: the message names it and says how to convert.
  std::istringstream i16(NpyBytes("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }",
                                  std::string(4, '\0')));
  auto st = ReadNpy(i16, "i16.npy").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'<i2' is not supported"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("astype"), absl::string_view::npos) << st;
  std::istringstream no_order(NpyBytes("{'descr': '<f8', 'shape': (1,), }", std::string(8, '\0')));
  EXPECT_EQ(ReadNpy(no_order, "o.npy").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(NdArray::From<int64_t>({1}, {int64_t{1} << 40}).ConvertTo(DType::kInt32).ok());
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// np.save(f, x.T) writes Fortran order: the values column by column. Read back, the array is
// the one NumPy meant (C order), for 2-D and 3-D shapes and every type.
TEST(Npy, FortranOrderIsReadIntoCOrder) {
  // x = [[1, 2, 3], [4, 5, 6]] stored column-major: 1 4 2 5 3 6.
  const double f2[6] = {1, 4, 2, 5, 3, 6};
  std::istringstream in2(NpyBytes("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }",
                                  Bytes(f2, sizeof f2)));
  auto r2 = ReadNpy(in2, "f2.npy");
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<double>(r2->as<double>(), r2->as<double>() + 6),
            (std::vector<double>{1, 2, 3, 4, 5, 6}));
  // Shape (2, 3, 4), x[i][j][k] = 100 i + 10 j + k, column-major (i fastest).
  std::vector<int32_t> f3;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) f3.push_back(100 * i + 10 * j + k);
  std::istringstream in3(NpyBytes("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                                  Bytes(f3.data(), f3.size() * 4)));
  auto r3 = ReadNpy(in3, "f3.npy");
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->dtype, DType::kInt32);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(r3->as<int32_t>()[(i * 3 + j) * 4 + k], 100 * i + 10 * j + k) << i << j << k;
  // A 1-D Fortran-order array is the same bytes as a C-order one.
  const float f1[3] = {1, 2, 3};
  std::istringstream in1(NpyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }",
                                  Bytes(f1, sizeof f1)));
  auto r1 = ReadNpy(in1, "f1.npy");
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->as<float>()[2], 3.0f);
}

// '>f8' and friends: the values are swapped, not reinterpreted.
TEST(Npy, BigEndianValuesAreSwapped) {
  const double v[2] = {1.5, -2.25};
  std::string be = Bytes(v, sizeof v);
  std::reverse(be.begin(), be.begin() + 8);
  std::reverse(be.begin() + 8, be.end());
  std::istringstream in(NpyBytes("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", be));
  auto r = ReadNpy(in, "be.npy");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->as<double>()[0], 1.5);
  EXPECT_EQ(r->as<double>()[1], -2.25);
  const int64_t w = 258;  // 0x0102
  std::string bi = Bytes(&w, 8);
  std::reverse(bi.begin(), bi.end());
  std::istringstream in_i(NpyBytes("{'descr': '>i8', 'fortran_order': False, 'shape': (), }", bi));
  auto ri = ReadNpy(in_i, "bi.npy");
  ASSERT_TRUE(ri.ok()) << ri.status();
  EXPECT_EQ(ri->as<int64_t>()[0], 258);
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
