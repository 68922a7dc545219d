// The family descriptors (trisolve/family.h): names, methods, the arrays' table, the structure
// checks with the messages the wire carries, and solves through the table on the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trisolve/backend.h"
#include "trisolve/family.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve {
namespace {

std::vector<std::string> Names(absl::Span<const absl::string_view> v) {
  return {v.begin(), v.end()};
}

TEST(Family, TableMatchesTheFamilies) {
  ASSERT_EQ(Families().size(), 4u);
  for (Family f : Families()) {
    const FamilyDescriptor& d = Describe(f);
    EXPECT_EQ(d.family, f);
    EXPECT_EQ(d.name, FamilyName(f));
    ASSERT_LE(d.arrays.size(), size_t(kMaxArrays));
    ASSERT_LE(d.coefficient_slots.size(), size_t(kMaxCoefficients));
    // The checks visit the arrays in this order; the wire's errors name the first bad one as
    // a map by name did.
    for (size_t i = 1; i < d.arrays.size(); ++i)
      EXPECT_LT(d.arrays[i - 1].name, d.arrays[i].name) << d.name;
    ASSERT_GE(d.rhs_slot, 0);
    EXPECT_EQ(d.arrays[size_t(d.rhs_slot)].role, ArrayRole::kRhs);
    for (size_t i = 0; i < d.coefficient_slots.size(); ++i) {
      const ArrayDescriptor& c = d.coefficient(int(i));
      EXPECT_EQ(c.coefficient, int(i)) << c.name;
      EXPECT_TRUE(c.role == ArrayRole::kCoefficient || c.role == ArrayRole::kParent) << c.name;
    }
    for (size_t i = 0; i < d.arrays.size(); ++i) {
      EXPECT_EQ(d.Find(d.arrays[i].name), int(i));
      EXPECT_EQ(d.Find(d.arrays[i].field), int(i)) << "the request field finds its array";
      if (!d.arrays[i].alias.empty()) {
        EXPECT_EQ(d.Find(d.arrays[i].alias), int(i));
      }
    }
    EXPECT_EQ(d.Find("no-such-array"), -1);
  }
}

// The server borrows a request's arrays by the descriptor's field names (server/translate.cc,
// BorrowAll): every Array field of a family's request must be an array of the table, and every
// array of the table a field of the request.
TEST(Family, FieldsAreTheRequestsArrays) {
  const std::pair<Family, const google::protobuf::Descriptor*> requests[] = {
      {Family::kTridiagonal, v1::TridiagonalRequest::descriptor()},
      {Family::kTree, v1::TreeRequest::descriptor()},
      {Family::kBlockTridiagonal, v1::BlockTridiagonalRequest::descriptor()},
      {Family::kDense, v1::DenseRequest::descriptor()}};
  ASSERT_EQ(std::size(requests), Families().size());
  for (const auto& [f, message] : requests) {
    const FamilyDescriptor& d = Describe(f);
    int array_fields = 0;
    for (int i = 0; i < message->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* field = message->field(i);
      if (field->message_type() != v1::Array::descriptor()) continue;
      ++array_fields;
      EXPECT_GE(d.Find(field->name()), 0) << message->name() << "." << field->name();
    }
    EXPECT_EQ(array_fields, int(d.arrays.size())) << message->name();
    for (const ArrayDescriptor& a : d.arrays) {
      const google::protobuf::FieldDescriptor* field =
          message->FindFieldByName(std::string(a.field));
      ASSERT_NE(field, nullptr) << message->name() << " has no field " << a.field;
      EXPECT_EQ(field->message_type(), v1::Array::descriptor()) << a.field;
      EXPECT_FALSE(field->is_repeated()) << a.field;
    }
  }
}

TEST(Family, CoefficientsInSystemSpecOrder) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Names(CoefficientNames(Family::kTridiagonal)), (V{"a", "b", "c"}));
  EXPECT_EQ(Names(CoefficientNames(Family::kTree)), (V{"lower", "upper", "diag", "parent"}));
  EXPECT_EQ(Names(CoefficientNames(Family::kBlockTridiagonal)), (V{"aC", "cC", "bC", "cA", "cB"}));
  EXPECT_EQ(Names(CoefficientNames(Family::kDense)), (V{"a"}));
  EXPECT_EQ(RhsName(Family::kTridiagonal), "d");
  EXPECT_EQ(RhsName(Family::kTree), "rhs");
  EXPECT_EQ(RhsName(Family::kBlockTridiagonal), "f");
  EXPECT_EQ(RhsName(Family::kDense), "b");
  // Aliases: the block family's proto spellings, dense "A"; arrays that are no coefficient.
  EXPECT_EQ(CoefficientIndex(Family::kBlockTridiagonal, "a_c"), 0);
  EXPECT_EQ(CoefficientIndex(Family::kBlockTridiagonal, "c_b"), 4);
  EXPECT_EQ(CoefficientIndex(Family::kBlockTridiagonal, "cC"), 1);
  EXPECT_EQ(CoefficientIndex(Family::kDense, "A"), 0);
  EXPECT_EQ(CoefficientIndex(Family::kTree, "parent"), 3);
  EXPECT_EQ(CoefficientIndex(Family::kTree, "A"), -1);
  EXPECT_EQ(CoefficientIndex(Family::kTridiagonal, "d"), -1);
  EXPECT_EQ(CoefficientIndex(Family::kTridiagonal, "lengths"), -1);
  EXPECT_EQ(CoefficientIndex(Family::kBlockTridiagonal, "y0"), -1);
}

TEST(Family, MethodsParseAndName) {
  const std::vector<std::pair<Family, std::vector<std::string>>> methods = {
      {Family::kTridiagonal, {"auto", "thomas", "pcr", "partitioned", "pivoting"}},
      {Family::kTree, {"auto", "hines", "cables", "contraction"}},
      {Family::kBlockTridiagonal,
       {"auto", "gauss-seidel", "red-black", "jacobi", "cg", "multigrid-cg", "multigrid-bicgstab"}},
      {Family::kDense, {"auto", "gauss-jordan", "householder-pcr", "lu"}}};
  for (const auto& [f, names] : methods) {
    const FamilyDescriptor& d = Describe(f);
    for (const std::string& name : names) {
      auto m = d.parse_method(name);
      ASSERT_TRUE(m.ok()) << name;
      EXPECT_EQ(d.method_name(*m), name);
    }
    auto empty = d.parse_method("");
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(*empty, 0);
    auto bad = d.parse_method("nope");
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string prefix = absl::StrCat("method: unknown ", d.name, " method 'nope' (");
    EXPECT_EQ(bad.status().message().substr(0, prefix.size()), prefix);
  }
  SystemSpec s;
  s.family = Family::kDense;
  s.method = uint8_t(DenseMethod::kLu);
  EXPECT_EQ(SpecMethodName(s), "lu");
}

TEST(Family, StructureChecksNameTheArray) {
  // A tree of three nodes; node 2's parent out of range in the second system.
  std::vector<int32_t> parent = {-1, 0, 1, -1, 0, 5};
  SystemSpec s;
  s.family = Family::kTree;
  s.batch = 2;
  s.n = 3;
  s.parent_per_system = true;
  s.coefficients[3] = parent.data();
  const FamilyDescriptor& tree = Describe(Family::kTree);
  absl::Status st = tree.check_structure(s, {});
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().substr(0, 18), "parent: system 1: ");
  // An update names no system.
  st = tree.check_update(s, 3, parent.data());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().substr(0, 8), "parent: ");
  EXPECT_NE(st.message().substr(8, 7), "system ");
  EXPECT_TRUE(tree.check_update(s, 0, nullptr).ok()) << "lower: nothing but finiteness";
  parent[5] = 1;
  EXPECT_TRUE(tree.check_structure(s, {}).ok());

  // Variable-size tridiagonal batches: lengths at least 1, summing to n.
  std::vector<int32_t> lengths = {2, 0};
  SystemSpec t;
  t.family = Family::kTridiagonal;
  t.batch = 2;
  t.n = 4;
  OneShotArrays e;
  e.lengths = lengths.data();
  const FamilyDescriptor& tri = Describe(Family::kTridiagonal);
  EXPECT_EQ(tri.check_structure(t, e).message(),
            "lengths: lengths[1] is 0; every system needs at least one row");
  lengths[1] = 1;
  EXPECT_EQ(tri.check_structure(t, e).message(),
            "lengths: the 2 lengths sum to 3, but a, b, c and d hold 4 values (their sum must "
            "be the arrays' length)");
  lengths[1] = 2;
  EXPECT_TRUE(tri.check_structure(t, e).ok());

  // Symmetry, only where the method needs it.
  std::vector<double> a = {2, 1, 0, 2};
  SystemSpec dn;
  dn.family = Family::kDense;
  dn.n = 2;
  dn.coefficients[0] = a.data();
  const FamilyDescriptor& dense = Describe(Family::kDense);
  EXPECT_TRUE(dense.check_structure(dn, {}).ok());
  dn.method = uint8_t(DenseMethod::kHouseholderPcr);
  EXPECT_EQ(dense.check_structure(dn, {}).message(),
            "a: matrix 0 is not symmetric; householder-pcr needs symmetric A (use gauss-jordan)");
  a[2] = 1;
  EXPECT_TRUE(dense.check_structure(dn, {}).ok());
  // A persistent householder-pcr system's update of A: checked as A was.
  std::vector<double> skew = {2, 1, 0, 2}, sym = {2, 1, 1, 2};
  EXPECT_EQ(dense.check_update(dn, 0, skew.data()).message(),
            "a: matrix 0 is not symmetric; householder-pcr needs symmetric A (use gauss-jordan)");
  EXPECT_TRUE(dense.check_update(dn, 0, sym.data()).ok());
  dn.method = uint8_t(DenseMethod::kGaussJordan);
  EXPECT_TRUE(dense.check_update(dn, 0, skew.data()).ok()) << "gauss-jordan needs no symmetry";
}

TEST(Family, SolvesThroughTheTable) {
  auto backend = MakeCpuBackend(1);
  const FamilyDescriptor& tri = Describe(Family::kTridiagonal);
  // [2 1 0; 1 2 1; 0 1 2] x = [3 4 3]: x = 1 1 1.
  std::vector<double> a = {0, 1, 1}, b = {2, 2, 2}, c = {1, 1, 0}, d = {3, 4, 3}, x(3);
  SystemSpec s;
  s.family = Family::kTridiagonal;
  s.n = 3;
  s.coefficients = {a.data(), b.data(), c.data()};
  std::vector<SystemStatus> status(1);
  auto info = tri.ops<double>().solve(*backend, s, d.data(), {}, x.data(), status.data(), {});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(status[0], SystemStatus::kOk);
  for (double v : x) EXPECT_NEAR(v, 1.0, 1e-14);
  EXPECT_LT(tri.ops<double>().backward_error(s, d.data(), {}, x.data(), status.data()), 1e-15);
  // The same rows in the unified layout, as two systems of 1 and 2 rows: [2] x = [2] and
  // [2 1; 1 2] x = [3 3], x = 1 each.
  std::vector<double> abc = {0, 2, 0, 0, 2, 1, 1, 2, 0}, d2 = {2, 3, 3}, x2(3);
  std::vector<int32_t> lengths = {1, 2};
  SystemSpec v;
  v.family = Family::kTridiagonal;
  v.batch = 2;
  v.n = 3;
  OneShotArrays e;
  e.unified = abc.data();
  e.lengths = lengths.data();
  std::vector<SystemStatus> st2(2);
  info = tri.ops<double>().solve(*backend, v, d2.data(), e, x2.data(), st2.data(), {});
  ASSERT_TRUE(info.ok()) << info.status();
  for (double q : x2) EXPECT_NEAR(q, 1.0, 1e-14);
  EXPECT_LT(tri.ops<double>().backward_error(v, d2.data(), e, x2.data(), st2.data()), 1e-15);
  // A wrong answer shows in the residual.
  x2[2] = 2;
  EXPECT_GT(tri.ops<double>().backward_error(v, d2.data(), e, x2.data(), st2.data()), 0.1);

  // The block family reports its own residual: no backward error in the table.
  EXPECT_EQ(Describe(Family::kBlockTridiagonal).ops<float>().backward_error, nullptr);
  EXPECT_TRUE(Describe(Family::kBlockTridiagonal).iterative);

  // Dense float32 through the table: [4 1; 1 3] x = [5 4], x = 1 1.
  std::vector<float> A = {4, 1, 1, 3}, rhs = {5, 4}, xf(2);
  SystemSpec dn;
  dn.family = Family::kDense;
  dn.precision = Precision::kFloat32;
  dn.n = 2;
  dn.coefficients[0] = A.data();
  std::vector<SystemStatus> st3(1);
  const FamilyDescriptor& dense = Describe(Family::kDense);
  info = dense.ops<float>().solve(*backend, dn, rhs.data(), {}, xf.data(), st3.data(), {});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NEAR(xf[0], 1.0f, 1e-6f);
  EXPECT_NEAR(xf[1], 1.0f, 1e-6f);
  EXPECT_LT(dense.ops<float>().backward_error(dn, rhs.data(), {}, xf.data(), st3.data()), 1e-6);
}

}  // namespace
}  // namespace trisolve
