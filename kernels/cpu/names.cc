// Method and status names: the spelling users type and read.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "trisolve/backend.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/dense.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {

absl::string_view StatusName(SystemStatus s) {
  switch (s) {
    case SystemStatus::kOk: return "ok";
    case SystemStatus::kSingular: return "singular";
    case SystemStatus::kNotConverged: return "not_converged";
    case SystemStatus::kDiverged: return "diverged";
  }
  return "unknown";
}

namespace {
constexpr absl::string_view kNonFiniteInput = "trisolve.dev/non-finite-input";
constexpr absl::string_view kMemoryHeldByOthers = "trisolve.dev/memory-held-by-others";
}  // namespace

absl::Status NonFiniteInputError() {
  absl::Status s = absl::InvalidArgumentError("an input value is NaN or Inf");
  s.SetPayload(kNonFiniteInput, absl::Cord("1"));
  return s;
}
bool IsNonFiniteInput(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument &&
         s.GetPayload(kNonFiniteInput).has_value();
}

absl::Status MemoryHeldByOthers(absl::Status st) {
  if (st.code() == absl::StatusCode::kResourceExhausted)
    st.SetPayload(kMemoryHeldByOthers, absl::Cord("1"));
  return st;
}
bool IsMemoryHeldByOthers(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted &&
         s.GetPayload(kMemoryHeldByOthers).has_value();
}

namespace {
absl::Status UnknownMethod(absl::string_view family, absl::string_view name,
                           absl::string_view known) {
  // The name is the client's: at most 64 printable characters of it go into the message (a
  // whole 10,000-character name overflowed gRPC's metadata and failed the calls beside it).
  std::string shown;
  for (char ch : name.substr(0, 64)) shown.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  if (name.size() > 64) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat("method: unknown ", family, " method '",
                                                 shown, "' (expected one of ", known, ")"));
}
}  // namespace

absl::StatusOr<TridiagonalMethod> ParseTridiagonalMethod(absl::string_view name) {
  if (name.empty() || name == "auto") return TridiagonalMethod::kAuto;
  if (name == "thomas") return TridiagonalMethod::kThomas;
  if (name == "pcr") return TridiagonalMethod::kPcr;
  if (name == "partitioned") return TridiagonalMethod::kPartitioned;
  if (name == "pivoting") return TridiagonalMethod::kPivoting;
  return UnknownMethod("tridiagonal", name, "auto, thomas, pcr, partitioned, pivoting");
}
absl::string_view MethodName(TridiagonalMethod m) {
  switch (m) {
    case TridiagonalMethod::kAuto: return "auto";
    case TridiagonalMethod::kThomas: return "thomas";
    case TridiagonalMethod::kPcr: return "pcr";
    case TridiagonalMethod::kPartitioned: return "partitioned";
    case TridiagonalMethod::kPivoting: return "pivoting";
  }
  return "unknown";
}

absl::StatusOr<TreeMethod> ParseTreeMethod(absl::string_view name) {
  if (name.empty() || name == "auto") return TreeMethod::kAuto;
  if (name == "hines") return TreeMethod::kHines;
  if (name == "cables") return TreeMethod::kCables;
  if (name == "contraction") return TreeMethod::kContraction;
  return UnknownMethod("tree", name, "auto, hines, cables, contraction");
}
absl::string_view MethodName(TreeMethod m) {
  switch (m) {
    case TreeMethod::kAuto: return "auto";
    case TreeMethod::kHines: return "hines";
    case TreeMethod::kCables: return "cables";
    case TreeMethod::kContraction: return "contraction";
  }
  return "unknown";
}

absl::StatusOr<BlockMethod> ParseBlockMethod(absl::string_view name) {
  if (name.empty() || name == "auto") return BlockMethod::kAuto;
  if (name == "gauss-seidel") return BlockMethod::kGaussSeidel;
  if (name == "red-black") return BlockMethod::kRedBlack;
  if (name == "jacobi") return BlockMethod::kJacobi;
  if (name == "cg") return BlockMethod::kCg;
  if (name == "multigrid-cg") return BlockMethod::kMultigridCg;
  if (name == "multigrid-bicgstab") return BlockMethod::kMultigridBicgstab;
  return UnknownMethod("block-tridiagonal", name, "auto, gauss-seidel, red-black, jacobi, cg, multigrid-cg, multigrid-bicgstab");
}
absl::string_view MethodName(BlockMethod m) {
  switch (m) {
    case BlockMethod::kAuto: return "auto";
    case BlockMethod::kGaussSeidel: return "gauss-seidel";
    case BlockMethod::kRedBlack: return "red-black";
    case BlockMethod::kJacobi: return "jacobi";
    case BlockMethod::kCg: return "cg";
    case BlockMethod::kMultigridCg: return "multigrid-cg";
    case BlockMethod::kMultigridBicgstab: return "multigrid-bicgstab";
  }
  return "unknown";
}

absl::StatusOr<DenseMethod> ParseDenseMethod(absl::string_view name) {
  if (name.empty() || name == "auto") return DenseMethod::kAuto;
  if (name == "gauss-jordan") return DenseMethod::kGaussJordan;
  if (name == "householder-pcr") return DenseMethod::kHouseholderPcr;
  if (name == "lu") return DenseMethod::kLu;
  return UnknownMethod("dense", name, "auto, gauss-jordan, lu, householder-pcr");
}
absl::string_view MethodName(DenseMethod m) {
  switch (m) {
    case DenseMethod::kAuto: return "auto";
    case DenseMethod::kGaussJordan: return "gauss-jordan";
    case DenseMethod::kHouseholderPcr: return "householder-pcr";
    case DenseMethod::kLu: return "lu";
  }
  return "unknown";
}

}  // namespace trisolve
