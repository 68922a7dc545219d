// Each family's solve on the device (CudaBackend, cuda_backend.h): the tridiagonal batches
// (uniform and variable-size), the block, dense and tree families, with the host fall-backs
// and the pivoting re-solve each needs.
#include "cuda_backend.h"

#include <algorithm>

namespace trisolve::cuda_backend {

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveTri(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                                TridiagonalOutput<T> out, const SolveControl& c,
                                                const Resident<T>* resident) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  // auto and pivoting are certified (docs/kernels/tridiagonal.md, "Certified by dominance"):
  // the fast kernel auto chooses, its answer kept for each system whose rows are all
  // diagonally dominant; every other system (and every one whose pivot vanished) solved again
  // by partial pivoting. The pivoting kernel runs a thread a system: below a warp's worth of
  // systems each system is a sequential sweep at one GPU thread's pace, slower than the
  // host's, so there the flagged systems are solved again on the host, from the host arrays
  // (but those pivoting-split answers on the device, below).
  const bool certified = m == TridiagonalMethod::kAuto || m == TridiagonalMethod::kPivoting;
  const bool pivot_on_device = p.batch >= cuda::kPivotingDeviceBatch;
  // Few or long systems (one of 2^24 rows: the host's sweep took ~1 s) are offered to
  // pivoting-split on the device first (docs/kernels/tridiagonal.md, "Partial pivoting,
  // split"); below a warp's worth what it leaves flagged (its check failed) still goes to the
  // host.
  const bool split = certified && cuda::PivotingSplitByShape(p.n, p.batch, p.layout);
  const int64_t e = p.batch * p.n;
  cuda::LaterAnswer later;
  const bool resolve_on_device = certified && (pivot_on_device || split);
  Pool::Buffer pivot_scratch;
  cuda::PinnedWord pivot_count, split_any;
  cuda::PivotResolve resolve;
  if (resolve_on_device) {
    const int64_t split_bytes =
        split ? cuda::PivotingSplitScratchBytes(p.n, p.batch, sizeof(T) == 4) : 0;
    const int64_t sweep_bytes =
        pivot_on_device ? cuda::PivotingScratchBytes(p.n, p.batch, sizeof(T) == 4) : 0;
    auto scratch = device_pool_.Get(std::max(split_bytes, sweep_bytes));
    if (!scratch.ok()) return scratch.status();
    pivot_scratch = *std::move(scratch);
    auto word = cuda::PinnedWord::Take();
    if (!word.ok()) return word.status();
    pivot_count = *std::move(word);
    pivot_count.get()[0] = 0;
    pivot_count.get()[1] = 0;
    resolve = {pivot_scratch.get(), pivot_count.mapped(), pivot_count.get(), split_bytes,
               pivot_count.mapped() + 1, pivot_count.get() + 1, pivot_on_device};
    if (split) {  // (whether anything is flagged: the split launches nothing where not)
      auto any = cuda::PinnedWord::Take();
      if (!any.ok()) return any.status();
      split_any = *std::move(any);
      resolve.split_any = {split_any.mapped(), split_any.get()};
    }
  }
  // (below a warp's worth: auto's kernel, its flags read back for the host's second solve)
  const TridiagonalMethod run = certified && !pivot_on_device ? TridiagonalMethod::kAuto : m;
  std::vector<uint8_t> host_flags;
  if (certified && !pivot_on_device) host_flags.resize(size_t(p.batch));
  std::vector<Input<T>> in = {{p.a, e}, {p.b, e}, {p.c, e}, {p.d, e}};
  MarkResident(in, resident);
  auto solved = stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x,
                   out.status,
                   [&](const std::vector<T*>& d, T* dx, uint8_t* flags, cudaStream_t stream,
                       int64_t systems) -> absl::StatusOr<std::string> {
                     // systems < p.batch: a piece of a pipelined solve (staging.h), waited
                     // for here; the copy back of the piece before runs meanwhile. The
                     // pieces share the second solve's scratch (one after the other on the
                     // stream) and its count.
                     TridiagonalProblem<T> dp{systems, p.n, p.layout, d[0], d[1], d[2], d[3]};
                     auto k = cuda::SolveTridiagonalDevice(
                         dp, run, dx, flags, device_pool_, stream,
                         systems == p.batch ? &later : nullptr,
                         resolve_on_device ? &resolve : nullptr);
                     if (!k.ok()) return k.status();
                     return std::string(cuda::KernelName(*k));
                   },
                   &later, c.check_finite, nullptr,
                   host_flags.empty() ? nullptr : host_flags.data());
  if (solved.ok() && resolve_on_device && pivot_count.get()[1] > 0) {
    const int k = pivot_count.get()[1];
    solved->method += " + pivoting-split (" + std::to_string(k) + (k == 1 ? " system)" : " systems)");
  }
  if (solved.ok() && resolve_on_device && pivot_count.get()[0] > 0)
    solved->method += " + pivoting (" + std::to_string(pivot_count.get()[0]) + " systems)";
  if (solved.ok() && certified && !pivot_on_device) {
    // (on the host, from the host arrays: TriOnDeviceOnly sends no such call with its arrays
    // on the device) A system not certified (nor answered by the split) is marked SINGULAR for
    // the second solve, which answers it (its status then the sweep's).
    for (int64_t s = 0; s < p.batch; ++s)
      if (host_flags[size_t(s)] & cuda::kFlagNotDominant) out.status[s] = SystemStatus::kSingular;
    cpu::ResolveSingularWithPivoting(p, out, &*solved);
  }
  return solved;
}

// A variable-size batch (p.offsets) or one in the unified-vector layout (p.unified(), a
// uniform one given offsets s * n): the variable kernel for auto and partitioned, reading
// the rows as they are staged (abc in place: no transpose anywhere), after its plan
// (variable.h), which goes first so that its int64 offsets are aligned whatever the arrays'
// length (16 bytes a unit, for a's loads).
template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveTriVariable(const TridiagonalProblem<T>& given,
                                                        TridiagonalMethod m, TridiagonalOutput<T> out,
                                                        const SolveControl& c,
                                                        const Resident<T>* resident) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  if (!cuda::VariableOnDevice(m)) return Host(cpu::SolveTridiagonal(given, m, out));
  TridiagonalProblem<T> p = given;
  std::vector<int64_t> uniform;
  if (!p.variable()) {
    uniform.resize(size_t(p.batch) + 1);
    for (int64_t s = 0; s <= p.batch; ++s) uniform[size_t(s)] = s * p.n;
    p.offsets = uniform.data();
  }
  const cuda::VariablePlan plan = cuda::PlanVariable(p.offsets, p.batch);
  cuda::LaterAnswer later;  // the block-diagonal form's (variable.h), answered after the wait
  std::vector<uint8_t> host_flags(m == TridiagonalMethod::kAuto ? size_t(p.batch) : 0);
  std::vector<T> meta((plan.meta.size() + 15) / 16 * (16 / sizeof(T)));
  std::memcpy(meta.data(), plan.meta.data(), plan.meta.size());
  const int64_t e = p.unknowns();
  std::vector<Input<T>> in = {{meta.data(), int64_t(meta.size()), nullptr, /*scanned=*/false}};
  if (p.unified()) {
    in.push_back({p.a, 3 * e});
    in.push_back({p.d, e});
  } else {
    for (const T* q : {p.a, p.b, p.c, p.d}) in.push_back({q, e});
    // (after the plan's entry: a, b, c)
    if (resident != nullptr)
      for (size_t i = 0; i < 3; ++i) in[i + 1].device = (*resident)[i];
  }
  auto solved = stager_.Staged<T>(
      in, p.batch, p.n, Layout::kFlat, out.x, out.status,
      [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
          cudaStream_t stream) -> absl::StatusOr<std::string> {
        TridiagonalProblem<T> dp = p;
        if (p.unified()) {
          dp.a = d[1];
          dp.b = d[1] + 1;
          dp.c = d[1] + 2;
          dp.d = d[2];
        } else {
          dp.a = d[1];
          dp.b = d[2];
          dp.c = d[3];
          dp.d = d[4];
        }
        // (a client's device memory is read in place: its couplings are not ours to cut)
        const bool own = dp.a != given.a && dp.c != given.c;
        return cuda::SolveVariableDevice(dp, plan, reinterpret_cast<const std::byte*>(d[0]), m,
                                         dx, flags, device_pool_, stream, own, &later);
      },
      &later, c.check_finite, p.offsets,
      m == TridiagonalMethod::kAuto ? host_flags.data() : nullptr);
  // auto, certified as the uniform batches' (SolveTri): a system the kernels did not certify
  // (a row not dominant) or whose pivot vanished is solved again by the host's pivoting.
  if (solved.ok() && m == TridiagonalMethod::kAuto) {
    for (int64_t s = 0; s < p.batch; ++s)
      if (host_flags[size_t(s)] & cuda::kFlagNotDominant) out.status[s] = SystemStatus::kSingular;
    cpu::ResolveSingularWithPivoting(p, out, &*solved);
  }
  return solved;
}

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveBlockOnDevice(const BlockTridiagonalProblem<T>& p, BlockMethod m,
                                                          const BlockOptions& o, BlockOutput<T> out,
                                                          const SolveControl& c,
                                                          const Resident<T>* resident,
                                                          std::optional<bool> symmetric,
                                                          const cuda::BlockDeviceSetup<T>* setup) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  const int64_t size = p.N * p.M;
  const bool automatic = m == BlockMethod::kAuto;
  // Auto's choice needs p's symmetry: known (a prepared system's), else tested on the device
  // once the arrays are there (a host thread's pass took longer than the solve's copies).
  const bool test_on_device = automatic && o.tol > 0 && !symmetric.has_value();
  if (!test_on_device) m = cuda::ResolveBlockMethod(p, m, o, symmetric);  // block/dispatch.cu
  std::vector<Input<T>> in = {{p.aC, size}, {p.cC, size}, {p.bC, size},
                              {p.cA, size}, {p.cB, size}, {p.f, size}};
  if (p.y0) in.push_back({p.y0, size});
  MarkResident(in, resident);
  SystemStatus st = SystemStatus::kOk;
  SolveInfo solved;
  auto info = stager_.Staged<T>(
      in, 1, size, Layout::kFlat, out.y, out.status,
      [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
          cudaStream_t stream) -> absl::StatusOr<std::string> {
        if (p.y0)
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dx, d[6], size * sizeof(T),
                                                        cudaMemcpyDeviceToDevice, stream));
        else
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dx, 0, size * sizeof(T), stream));
        BlockTridiagonalProblem<T> dp{p.N, p.M, d[0], d[1], d[2], d[3], d[4], d[5], nullptr};
        if (test_on_device) {
          auto sym = cuda::IsSymmetricDevice(dp, stream);
          if (!sym.ok()) return sym.status();
          m = cuda::ResolveBlockMethod(dp, m, o, *sym);
        }
        auto r = cuda::SolveBlockTridiagonalDevice(dp, m, o, dx, &st, device_pool_, c, stream,
                                                   setup);
        if (!r.ok()) return r.status();
        solved = *r;
        // Singular or diverged: the answer is zeros (Staged zeroes flagged systems).
        if (st == SystemStatus::kSingular || st == SystemStatus::kDiverged)
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 1, 1, stream));
        return r->method;
      },
      nullptr, c.check_finite);
  if (!info.ok()) return info.status();
  out.status[0] = st;
  info->iterations = solved.iterations;
  info->residual = solved.residual;
  info->residual_history = std::move(solved.residual_history);
  // auto, where CG could not run or met indefiniteness on the device, or red-black's line
  // solves met a vanished pivot (a singular C_i, the matrix perhaps not): the CPU
  // reference's fallback on the host (BiCGStab with the V-cycle, the line solves or nothing,
  // from y0), never SINGULAR for a nonsingular matrix. The method says both: "multigrid-cg
  // (stopped: indefinite) -> multigrid-bicgstab (host)"; the iterations count both.
  const bool lines_singular = st == SystemStatus::kSingular;
  if (automatic && (lines_singular || (st == SystemStatus::kNotConverged &&
                                       (info->method.find("indefinite") != std::string::npos ||
                                        info->method.find("not run") != std::string::npos)))) {
    // Its progress and history continue the device's iteration count.
    SolveControl hc = c;
    const int64_t ran = info->iterations;
    if (c.progress) hc.progress = [&c, ran](int64_t it, double r) { c.progress(ran + it, r); };
    auto host = cpu::SolveBlockIndefinite(p, o, out, hc);
    if (!host.ok()) return host.status();
    host->method = info->method + (lines_singular ? " (a line block is singular)" : "") +
                   " -> " + host->method + " (host)";
    host->iterations += info->iterations;
    for (ResidualPoint& q : host->residual_history) q.iteration += ran;
    if (!info->residual_history.empty()) info->residual_history.pop_back();  // not the end
    host->residual_history.insert(host->residual_history.begin(),
                                  info->residual_history.begin(), info->residual_history.end());
    auto& hist = host->residual_history;  // within the limit still: every other point dropped
    while (c.history_limit > 1 && int64_t(hist.size()) > std::max<int64_t>(c.history_limit, 2)) {
      size_t kept = 0;
      for (size_t i = 0; i + 1 < hist.size(); i += 2) hist[kept++] = hist[i];
      hist[kept++] = hist.back();
      hist.resize(kept);
    }
    return host;
  }
  return info;
}

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveDenseOnDevice(const DenseProblem<T>& p, DenseMethod m,
                                                          DenseOutput<T> out, const SolveControl& c,
                                                          const Resident<T>* resident) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  const cuda::DensePath path = cuda::ChooseDensePath(p.n, m);  // dense/dispatch.cc
  std::vector<Input<T>> in = {{p.A, p.batch * p.n * p.n}, {p.b, p.batch * p.n}};
  MarkResident(in, resident);
  return stager_.Staged<T>(in, p.batch, p.n,
                   Layout::kFlat, out.x, out.status,
                   [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                       cudaStream_t stream) -> absl::StatusOr<std::string> {
                     DenseProblem<T> dp{p.batch, p.n, d[0], d[1]};
                     if (path == cuda::DensePath::kHouseholderPcrBlock) {
                       auto st = cuda::SolveDenseHouseholderPcrBlockDevice(dp, dx, flags, stream);
                       if (!st.ok()) return st;
                       return std::string("householder-pcr-block");
                     }
                     if (path == cuda::DensePath::kHouseholderPcr) {
                       auto st = cuda::SolveDenseHouseholderPcrDevice(dp, dx, flags, dense_libs_,
                                                                      device_pool_, stream);
                       if (!st.ok()) return st;
                       return std::string("householder-pcr (cusolver sytrd)");
                     }
                     if (path == cuda::DensePath::kGaussJordanBlocked) {
                       auto st = cuda::SolveDenseGaussJordanBlockedDevice(
                           dp, dx, flags, dense_libs_, device_pool_, stream);
                       if (!st.ok()) return st;
                       return std::string("gauss-jordan-blocked");
                     }
                     if (path == cuda::DensePath::kLu)
                       return cuda::SolveDenseLuDevice(dp, dx, flags, dense_libs_, device_pool_,
                                                       stream);
                     auto st = cuda::SolveDenseWarpDevice(dp, dx, flags, stream);
                     if (!st.ok()) return st;
                     return std::string(p.n <= cuda::kDenseWarpMaxN       ? "gauss-jordan-warp"
                                        : p.n <= cuda::kDenseTwoWarpsMaxN ? "gauss-jordan-2warps"
                                                                         : "gauss-jordan-block");
                   },
                   nullptr, c.check_finite);
}

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveTreeOnDevice(const TreeProblem<T>& p, TreeMethod m,
                                                         TreeOutput<T> out, const SolveControl& c,
                                                         const Resident<T>* resident) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  const bool per_cell = p.parent_per_system && p.batch > 1;
  // One morphology: its plan (cached), which the choice reads (tree/dispatch.cc).
  std::shared_ptr<const cuda::TreeCablesPlan> plan;
  if (cuda::TreeWantsPlan(p, m)) {
    auto made = plans_.Get(p.parent, p.n, device_pool_, nullptr);
    if (!made.ok()) return made.status();
    plan = *made;
  }
  const cuda::TreePath path = cuda::ChooseTreePath(p, m, plan.get());
  if (path == cuda::TreePath::kHost) {
    if (resident == nullptr && ClientDevice(p, out.x)) return ThroughHost(p, m, out, c);
    return Host(cpu_->Solve(p, m, out, c));
  }
  const bool contraction = path == cuda::TreePath::kContractionBlock;
  const bool block = path == cuda::TreePath::kCablesBlock;
  const bool cables = block || path == cuda::TreePath::kCables;
  const int64_t e = p.batch * p.n;
  std::vector<Input<T>> in = {{p.lower, e}, {p.upper, e}, {p.diag, e}, {p.rhs, e}};
  MarkResident(in, resident);
  if (contraction || cables) {
    return stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
                     [&](const std::vector<T*>& d, T* dx, uint8_t* flags, cudaStream_t stream,
                         int64_t systems) -> absl::StatusOr<std::string> {
                       TreeProblem<T> dp = p;
                       dp.batch = systems;  // a piece of a pipelined solve: cells of one tree
                       dp.parent = nullptr;  // the plan holds the tree
                       dp.parent_per_system = false;
                       dp.lower = d[0];
                       dp.upper = d[1];
                       dp.diag = d[2];
                       dp.rhs = d[3];
                       if (contraction) {
                         auto st = cuda::SolveTreeContractionBlockDevice(dp, *plan, dx, flags,
                                                                         stream);
                         if (!st.ok()) return st;
                         return std::string("contraction-block");
                       }
                       if (block) {
                         auto st = cuda::SolveTreeCablesBlockDevice(dp, *plan, dx, flags,
                                                                    stream);
                         if (!st.ok()) return st;
                         return std::string("cables-block");
                       }
                       auto st = cuda::SolveTreeCablesDevice(dp, *plan, dx, flags,
                                                             device_pool_, stream);
                       if (!st.ok()) return st;
                       return std::string("cables");
                     },
                     nullptr, c.check_finite);
  }
  const int64_t trees = per_cell ? p.batch : 1;
  std::vector<uint8_t> nf(static_cast<size_t>(trees * p.n));
  for (int64_t s = 0; s < trees; ++s) {
    const std::vector<uint8_t> f = cuda::TreeNodeFlags(p.parent + s * p.n, p.n);
    std::memcpy(nf.data() + s * p.n, f.data(), size_t(p.n));
  }
  auto meta = device_pool_.Get(trees * p.n * 5);
  if (!meta.ok()) return meta.status();
  auto* dparent = static_cast<int32_t*>(meta->get());
  auto* dflags = reinterpret_cast<uint8_t*>(dparent + trees * p.n);
  return stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
                   [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                       cudaStream_t stream) -> absl::StatusOr<std::string> {
                     TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                         dparent, p.parent, trees * p.n * 4, cudaMemcpyHostToDevice, stream));
                     TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                         dflags, nf.data(), trees * p.n, cudaMemcpyHostToDevice, stream));
                     TreeProblem<T> dp = p;
                     dp.parent = dparent;
                     dp.parent_per_system = per_cell;
                     dp.lower = d[0];
                     dp.upper = d[1];
                     dp.diag = d[2];
                     dp.rhs = d[3];
                     auto st = cuda::SolveTreeBatchDevice(dp, dflags, dx, flags, device_pool_,
                                                          stream);
                     if (!st.ok()) return st;
                     return std::string("hines-batch");
                   },
                   nullptr, c.check_finite);
}

namespace {

// Cells `which` (ascending) of a forest p (host arrays) as a forest of their own: solved by
// `solve(problem, output)`, then x and the statuses put back in their places in out.
template <typename T, typename Solve>
absl::StatusOr<SolveInfo> SolveSomeCells(const TreeProblem<T>& p, const std::vector<int32_t>& which,
                                         TreeOutput<T> out, Solve solve) {
  std::vector<int64_t> offsets = {0};
  int64_t n = 0;
  for (int32_t k : which) {
    offsets.push_back(offsets.back() + p.offsets[k + 1] - p.offsets[k]);
    n = std::max<int64_t>(n, p.offsets[k + 1] - p.offsets[k]);
  }
  const size_t total = size_t(offsets.back());
  std::vector<int32_t> parent(total);
  std::vector<T> lower(total), upper(total), diag(total), rhs(total), x(total);
  std::vector<SystemStatus> status(which.size());
  for (size_t q = 0; q < which.size(); ++q) {
    const int64_t a = p.offsets[which[q]], len = offsets[q + 1] - offsets[q];
    std::copy(p.parent + a, p.parent + a + len, parent.begin() + offsets[q]);
    std::copy(p.lower + a, p.lower + a + len, lower.begin() + offsets[q]);
    std::copy(p.upper + a, p.upper + a + len, upper.begin() + offsets[q]);
    std::copy(p.diag + a, p.diag + a + len, diag.begin() + offsets[q]);
    std::copy(p.rhs + a, p.rhs + a + len, rhs.begin() + offsets[q]);
  }
  TreeProblem<T> sub = p;
  sub.batch = int64_t(which.size());
  sub.n = n;
  sub.parent = parent.data();
  sub.offsets = offsets.data();
  sub.lower = lower.data();
  sub.upper = upper.data();
  sub.diag = diag.data();
  sub.rhs = rhs.data();
  auto info = solve(sub, TreeOutput<T>{x.data(), status.data()});
  if (!info.ok()) return info;
  for (size_t q = 0; q < which.size(); ++q) {
    std::copy(x.begin() + offsets[q], x.begin() + offsets[q + 1], out.x + p.offsets[which[q]]);
    out.status[which[q]] = status[q];
  }
  return info;
}

}  // namespace

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForest(
    const TreeProblem<T>& p, TreeMethod m, TreeOutput<T> out, const SolveControl& c,
    const Resident<T>* resident, std::shared_ptr<const cuda::TreeCellsPlan> held) {
  const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
  // hines is one thread a cell on the device (hines-batch, cells of one size); the host's
  // sweeps, a cell a thread, instead.
  if (m == TreeMethod::kHines) return Host(cpu_->Solve(p, m, out, c));
  // The forest's plan is kept by its cells (a time-stepping client's same cells find it). Its
  // analysis is one tree contraction (cable decomposition) per distinct cell structure, on host
  // threads: auto builds it only for cells it sees a second time, and solves the first sight
  // on the host.
  const int eb = int(sizeof(T));
  const cuda::TreeCellsKind kind =
      m == TreeMethod::kCables ? cuda::TreeCellsKind::kCables : cuda::TreeCellsKind::kContraction;
  std::shared_ptr<const cuda::TreeCellsPlan> plan =
      held != nullptr ? std::move(held) : cell_plans_.Find(p.parent, p.offsets, p.batch, eb, kind);
  if (plan == nullptr && m == TreeMethod::kAuto && resident == nullptr &&
      !cell_plans_.SeenBefore(p.parent, p.offsets, p.batch)) {
    auto host = cpu_->Solve(p, m, out, c);
    if (host.ok()) host->method += " (host; the cells' plan is built if they come again)";
    return host;
  }
  if (plan == nullptr) {
    auto made = cell_plans_.Get(p.parent, p.offsets, p.batch, eb, kind, device_pool_, nullptr);
    if (!made.ok()) return made.status();
    plan = *made;
  }
  const int64_t structures = plan->structures();
  SolveInfo solved;
  solved.method = absl::StrCat(kind == cuda::TreeCellsKind::kCables ? "cables-block"
                                                                    : "contraction-block",
                               " (per-cell plans, ", structures,
                               structures == 1 ? " structure)" : " structures)");
  if (plan->block_cells() > 0) {
    const int64_t total = p.unknowns();
    std::vector<Input<T>> in = {
        {p.lower, total}, {p.upper, total}, {p.diag, total}, {p.rhs, total}};
    MarkResident(in, resident);
    auto blocks = stager_.Staged<T>(
        in, p.batch, p.n, Layout::kFlat, out.x, out.status,
        [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
            cudaStream_t stream) -> absl::StatusOr<std::string> {
          TreeProblem<T> dp = p;
          dp.parent = nullptr;  // the plan holds the cells' trees
          dp.lower = d[0];
          dp.upper = d[1];
          dp.diag = d[2];
          dp.rhs = d[3];
          if (auto st = cuda::SolveTreeCellsBlockDevice(dp, *plan, dx, flags, stream); !st.ok())
            return st;
          return solved.method;
        },
        nullptr, c.check_finite, p.offsets);
    if (!blocks.ok()) return blocks;
    const std::string method = solved.method;
    solved = *blocks;
    solved.method = method;
  }
  // Cells too large for a block (their x and statuses from the staged copy are not theirs):
  // the cells as one tree.
  const std::vector<int32_t>& rest = plan->rest();
  if (!rest.empty()) {
    auto joined = SolveSomeCells(p, rest, out, [&](const TreeProblem<T>& q, TreeOutput<T> o) {
      return SolveTreeForestJoined(q, m, o, c, resident != nullptr);
    });
    if (!joined.ok()) return joined;
    absl::StrAppend(&solved.method, "; ", rest.size(),
                    rest.size() == 1 ? " cell" : " cells", " too large for a block: ",
                    joined->method);
  }
  // A cell whose pivot vanished in its block (flagged singular, x = 0): solved again on the
  // host, alone with the others flagged; its status is then the CPU reference's.
  std::vector<int32_t> flagged;
  {
    std::vector<char> in_rest(size_t(p.batch), 0);
    for (int32_t k : rest) in_rest[size_t(k)] = 1;
    for (int64_t k = 0; k < p.batch; ++k)
      if (!in_rest[size_t(k)] && out.status[k] != SystemStatus::kOk) flagged.push_back(int32_t(k));
  }
  if (!flagged.empty()) {
    auto again = SolveSomeCells(p, flagged, out, [&](const TreeProblem<T>& q, TreeOutput<T> o) {
      return cpu_->Solve(q, m, o, c);
    });
    if (!again.ok()) return again.status();
    int64_t singular = 0;
    for (int32_t k : flagged) singular += out.status[k] == SystemStatus::kSingular;
    absl::StrAppend(&solved.method, "; a pivot vanished in ", flagged.size(),
                    flagged.size() == 1 ? " cell" : " cells", ": solved again by ",
                    again->method, " on the host (", singular, " singular)");
  }
  return solved;
}

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForestJoined(const TreeProblem<T>& p,
                                                             TreeMethod m, TreeOutput<T> out,
                                                             const SolveControl& c,
                                                             bool prepared) {
  // hines is one thread a cell on the device (hines-batch, cells of one size): a forest as one
  // tree would be one thread. The host's sweeps, a cell a thread, instead.
  const int64_t total = p.unknowns();
  // (contraction runs on the device one block a tree: the plan's rounds exist below 65,535
  // nodes, and a larger forest would build a plan only to run on the host.)
  if (m == TreeMethod::kHines || (m == TreeMethod::kContraction && total >= 65535))
    return Host(cpu_->Solve(p, m, out, c));
  const std::vector<int32_t> parent = ForestAsOneTree(p.parent, p.offsets, p.batch);
  TreeProblem<T> one = p;
  one.batch = 1;
  one.n = total;
  one.offsets = nullptr;
  one.parent = parent.data();
  one.parent_per_system = false;
  // The joined tree's plan is kept by its parent array (a time-stepping client's same cells find
  // it). Its analysis is host work of some 30-45 ns a node, single-threaded (H100 host: 1.4 s for
  // 20,326 cells, 32.6 M nodes; bench_tree), against 4.2-5 ms for the device's solve and a few
  // hundred ms for the host's sweeps over every core: auto builds it only for cells it sees a
  // second time, and solves the first sight on the host (a prepared system's cells come again).
  std::shared_ptr<const cuda::TreeCablesPlan> plan = plans_.Find(parent.data(), total);
  if (plan == nullptr && m == TreeMethod::kAuto && !prepared &&
      !plans_.SeenBefore(parent.data(), total)) {
    auto host = cpu_->Solve(p, m, out, c);
    if (host.ok()) host->method += " (host; the cells' plan is built if they come again)";
    return host;
  }
  if (plan == nullptr) {
    auto made = plans_.Get(parent.data(), total, device_pool_, nullptr);
    if (!made.ok()) return made.status();
    plan = *made;
  }
  const cuda::TreePath path = cuda::ChooseTreePath(one, m, plan.get());
  // (kHinesBatch is not chosen with a plan; contraction too large for a block: the host's.)
  if (path == cuda::TreePath::kHost || path == cuda::TreePath::kHinesBatch)
    return Host(cpu_->Solve(p, m, out, c));
  // The roots whose couplings join the cells, staged with the arrays (int32 packed in T).
  const int64_t joins = p.batch - 1;
  std::vector<T> roots((size_t(std::max<int64_t>(joins, 1)) * 4 + sizeof(T) - 1) / sizeof(T));
  auto* r32 = reinterpret_cast<int32_t*>(roots.data());
  for (int64_t k = 1; k < p.batch; ++k) r32[k - 1] = int32_t(p.offsets[k]);
  std::vector<Input<T>> in = {{p.lower, total}, {p.upper, total}, {p.diag, total}, {p.rhs, total},
                              {roots.data(), int64_t(roots.size()), nullptr, /*scanned=*/false}};
  SystemStatus joined = SystemStatus::kOk;
  auto solved = stager_.Staged<T>(
      in, 1, total, Layout::kFlat, out.x, &joined,
      [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
          cudaStream_t stream) -> absl::StatusOr<std::string> {
        if (auto st = cuda::ZeroForestCouplings(d[0], d[1], reinterpret_cast<const int32_t*>(d[4]),
                                                joins, stream);
            !st.ok())
          return st;
        TreeProblem<T> dp = one;
        dp.parent = nullptr;  // the plan holds the tree
        dp.lower = d[0];
        dp.upper = d[1];
        dp.diag = d[2];
        dp.rhs = d[3];
        if (path == cuda::TreePath::kContractionBlock) {
          if (auto st = cuda::SolveTreeContractionBlockDevice(dp, *plan, dx, flags, stream);
              !st.ok())
            return st;
          return std::string("contraction-block");
        }
        if (path == cuda::TreePath::kCablesBlock) {
          if (auto st = cuda::SolveTreeCablesBlockDevice(dp, *plan, dx, flags, stream); !st.ok())
            return st;
          return std::string("cables-block");
        }
        if (auto st = cuda::SolveTreeCablesDevice(dp, *plan, dx, flags, device_pool_, stream);
            !st.ok())
          return st;
        return std::string("cables");
      },
      nullptr, c.check_finite);
  if (!solved.ok()) return solved;
  solved->method += " (the cells as one tree)";
  if (joined == SystemStatus::kOk) {
    std::fill(out.status, out.status + p.batch, SystemStatus::kOk);
    return solved;
  }
  // A pivot vanished in some cell, and past it the joined elimination carried 0/0 into the
  // roots above: every cell is solved again on its own, on the host (the arrays are host
  // memory: SolveFamily sent a client's device arrays through the host).
  auto again = cpu_->Solve(p, m, out, c);
  if (!again.ok()) return again.status();
  const int64_t singular = std::count(out.status, out.status + p.batch, SystemStatus::kSingular);
  solved->method += absl::StrCat("; a pivot vanished: the cells solved again by ", again->method,
                                 " on the host (", singular, singular == 1 ? " cell" : " cells",
                                 " singular)");
  return solved;
}

template <typename T>
absl::Status CudaBackend::KeepDenseFactors(DevicePrepared& s) {
  const SystemSpec& spec = s.spec();
  const cuda::DensePath path = cuda::ChooseDensePath(spec.n, DenseMethod(spec.method));
  const cuda::DenseFactorsKind kind = path == cuda::DensePath::kLu
                                          ? cuda::DenseFactorsKind::kLu
                                          : cuda::DenseFactorsKind::kGaussJordan;
  const int64_t a_bytes = spec.coefficient_bytes(0);
  auto a = device_pool_.Get(a_bytes);
  if (!a.ok()) return a.status();
  auto buf = device_pool_.Get(cuda::DenseFactorsBytes(kind, spec.batch, spec.n, int(sizeof(T))));
  if (!buf.ok()) return buf.status();
  if (auto st = stager_.CopyToDevice(spec.coefficients[0], a->get(), a_bytes); !st.ok())
    return st;
  cuda::DenseFactorsDevice<T> f = cuda::DenseFactorsAt<T>(kind, spec.batch, spec.n, buf->get());
  const DenseProblem<T> p{spec.batch, spec.n, a->as<const T>(), nullptr};
  cudaSetDevice(options_.device);
  const cuda::Stager::LaneLease lease(&stager_);
  cudaStream_t stream = lease.lane().stream;
  if (kind == cuda::DenseFactorsKind::kLu) {
    if (auto st = cuda::FactorDenseLuDevice(p, f, dense_libs_, device_pool_, stream); !st.ok())
      return st;
  } else {
    if (auto st = cuda::FactorDenseGaussJordanDevice(p, f, stream); !st.ok()) return st;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before `a` returns
  }
  s.factors = *std::move(buf);
  s.factors_kind = kind;
  s.factors_name = f.name;
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<SolveInfo> CudaBackend::SolveDenseFactored(DevicePrepared& s, RhsBlock<T> rhs,
                                                          T* x, SystemStatus* status,
                                                          const SolveControl& c) {
  const SystemSpec& spec = s.spec();
  const int64_t systems = rhs.k * spec.batch;
  cuda::DenseFactorsDevice<T> f =
      cuda::DenseFactorsAt<T>(s.factors_kind, spec.batch, spec.n, s.factors.get());
  const std::string name = s.factors_name;
  std::vector<Input<T>> in = {{rhs.rhs, systems * spec.n}};
  return stager_.Staged<T>(
      in, systems, spec.n, Layout::kFlat, x, status,
      [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
          cudaStream_t stream) -> absl::StatusOr<std::string> {
        if (f.kind == cuda::DenseFactorsKind::kLu) {
          auto st = cuda::SolveDenseLuFactoredDevice(f, rhs.k, d[0], dx, flags, dense_libs_,
                                                     device_pool_, stream);
          if (!st.ok()) return st;
        } else {
          auto st = cuda::SolveDenseGaussJordanFactoredDevice(f, rhs.k, d[0], dx, flags, stream);
          if (!st.ok()) return st;
        }
        return name;
      },
      nullptr, c.check_finite);
}

// The two precisions every caller uses.
template absl::Status CudaBackend::KeepDenseFactors<double>(DevicePrepared&);
template absl::Status CudaBackend::KeepDenseFactors<float>(DevicePrepared&);
template absl::StatusOr<SolveInfo> CudaBackend::SolveDenseFactored<double>(
    DevicePrepared&, RhsBlock<double>, double*, SystemStatus*, const SolveControl&);
template absl::StatusOr<SolveInfo> CudaBackend::SolveDenseFactored<float>(
    DevicePrepared&, RhsBlock<float>, float*, SystemStatus*, const SolveControl&);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTri<double>(
    const TridiagonalProblem<double>&, TridiagonalMethod, TridiagonalOutput<double>,
    const SolveControl&, const Resident<double>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTri<float>(
    const TridiagonalProblem<float>&, TridiagonalMethod, TridiagonalOutput<float>,
    const SolveControl&, const Resident<float>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTriVariable<double>(
    const TridiagonalProblem<double>&, TridiagonalMethod, TridiagonalOutput<double>,
    const SolveControl&, const Resident<double>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTriVariable<float>(
    const TridiagonalProblem<float>&, TridiagonalMethod, TridiagonalOutput<float>,
    const SolveControl&, const Resident<float>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveBlockOnDevice<double>(
    const BlockTridiagonalProblem<double>&, BlockMethod, const BlockOptions&, BlockOutput<double>,
    const SolveControl&, const Resident<double>*, std::optional<bool>,
    const cuda::BlockDeviceSetup<double>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveBlockOnDevice<float>(
    const BlockTridiagonalProblem<float>&, BlockMethod, const BlockOptions&, BlockOutput<float>,
    const SolveControl&, const Resident<float>*, std::optional<bool>,
    const cuda::BlockDeviceSetup<float>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveDenseOnDevice<double>(
    const DenseProblem<double>&, DenseMethod, DenseOutput<double>, const SolveControl&,
    const Resident<double>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveDenseOnDevice<float>(
    const DenseProblem<float>&, DenseMethod, DenseOutput<float>, const SolveControl&,
    const Resident<float>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeOnDevice<double>(
    const TreeProblem<double>&, TreeMethod, TreeOutput<double>, const SolveControl&,
    const Resident<double>*);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForest<double>(
    const TreeProblem<double>&, TreeMethod, TreeOutput<double>, const SolveControl&,
    const Resident<double>*, std::shared_ptr<const cuda::TreeCellsPlan>);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForest<float>(
    const TreeProblem<float>&, TreeMethod, TreeOutput<float>, const SolveControl&,
    const Resident<float>*, std::shared_ptr<const cuda::TreeCellsPlan>);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForestJoined<double>(
    const TreeProblem<double>&, TreeMethod, TreeOutput<double>, const SolveControl&, bool);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeForestJoined<float>(
    const TreeProblem<float>&, TreeMethod, TreeOutput<float>, const SolveControl&, bool);
template absl::StatusOr<SolveInfo> CudaBackend::SolveTreeOnDevice<float>(
    const TreeProblem<float>&, TreeMethod, TreeOutput<float>, const SolveControl&,
    const Resident<float>*);

}  // namespace trisolve::cuda_backend
