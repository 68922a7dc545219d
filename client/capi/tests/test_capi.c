/* The C API against a real trisolved (TRISOLVE_SERVER, set by run_with_server.sh): every family
 * one-shot and as a persistent system, float64 and float32, every layout, the time-step stream
 * with staged updates, and the error codes with their messages. Residuals are computed here
 * from the caller's own arrays (float32 runs use arrays whose double copies hold exactly the
 * float values, so the residual is that of the system the server was given). Prints one line
 * per check; exits non-zero on any failure.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trisolve/trisolve.h"

static int failures = 0;
static trisolve_context* ctx = NULL;

static void check(int ok, const char* fmt, ...) {
  va_list ap;
  char what[200];
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  printf("%-72s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) {
    failures++;
    printf("    last error: %s\n", trisolve_last_error(ctx));
  }
}

static uint64_t seed = 12345;
static double rnd(void) { /* in [-1, 1) */
  seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(seed >> 11) / 4503599627370496.0 - 1.0;
}

static double* dalloc(int64_t n) { return calloc((size_t)n, sizeof(double)); }
static void fill(double* p, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * 0.5 * (rnd() + 1.0);
}

/* float32 runs: f = (float)d, and d rounded in place to the float values. */
static float* to_f32(double* d, int64_t n) {
  float* f = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; ++i) {
    f[i] = (float)d[i];
    d[i] = (double)f[i];
  }
  return f;
}
static void from_f32(const float* f, double* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = (double)f[i];
}

static const char* prec_name(int f32) { return f32 ? "f32" : "f64"; }
static double tol_of(int f32) { return f32 ? 2e-5 : 1e-12; }

/* Element k of system s of a batch in a tridiagonal/tree layout. */
static int64_t at(int layout, int64_t n, int64_t batch, int64_t k, int64_t s) {
  return layout == TRISOLVE_FLAT ? s * n + k : k * batch + s;
}

/* ---- residuals, max |A x - rhs| / (max |A| max |x| + max |rhs|) over the batch ---- */

static double rel(double r, double scale) { return scale > 0 ? r / scale : r; }

static double res_tri(int layout, int64_t n, int64_t batch, const double* a, const double* b,
                      const double* c, const double* x, const double* d) {
  double r = 0, scale = 0;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = at(layout, n, batch, k, s);
      double ax = b[i] * x[i];
      if (k > 0) ax += a[i] * x[at(layout, n, batch, k - 1, s)];
      if (k < n - 1) ax += c[i] * x[at(layout, n, batch, k + 1, s)];
      r = fmax(r, fabs(ax - d[i]));
      scale = fmax(scale, fabs(d[i]) + 4 * fabs(x[i]));
    }
  }
  return rel(r, scale);
}

static double res_tree(int layout, int64_t n, int64_t batch, const int32_t* parent,
                       int64_t parent_systems, const double* lower, const double* upper,
                       const double* diag, const double* x, const double* rhs) {
  double r = 0, scale = 0;
  double* ax = dalloc(n);
  for (int64_t s = 0; s < batch; ++s) {
    const int32_t* p = parent + (parent_systems == 1 ? 0 : s * n);
    for (int64_t i = 0; i < n; ++i) ax[i] = diag[at(layout, n, batch, i, s)] * x[at(layout, n, batch, i, s)];
    for (int64_t i = 1; i < n; ++i) {
      const int64_t ii = at(layout, n, batch, i, s), pp = at(layout, n, batch, p[i], s);
      ax[i] += lower[ii] * x[pp];
      ax[p[i]] += upper[ii] * x[ii];
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ii = at(layout, n, batch, i, s);
      r = fmax(r, fabs(ax[i] - rhs[ii]));
      scale = fmax(scale, fabs(rhs[ii]) + 8 * fabs(x[ii]));
    }
  }
  free(ax);
  return rel(r, scale);
}

/* A row-major: A[s][i][j]. */
static double res_dense(int64_t n, int64_t batch, const double* A, const double* x,
                        const double* b) {
  double r = 0, scale = 0;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < n; ++i) {
      double ax = 0, row = 0;
      for (int64_t j = 0; j < n; ++j) {
        ax += A[s * n * n + i * n + j] * x[s * n + j];
        row += fabs(A[s * n * n + i * n + j] * x[s * n + j]);
      }
      r = fmax(r, fabs(ax - b[s * n + i]));
      scale = fmax(scale, fabs(b[s * n + i]) + row);
    }
  }
  return rel(r, scale);
}

/* ||f - A y||_2 / ||f||_2 (the server's own measure for the block family). */
static double res_block(int64_t N, int64_t M, double* const co[5], const double* y,
                        const double* f) {
  const double *aC = co[0], *cC = co[1], *bC = co[2], *cA = co[3], *cB = co[4];
  double r2 = 0, f2 = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      double ay = cC[e] * y[e];
      if (k > 0) ay += aC[e] * y[e - 1];
      if (k < M - 1) ay += bC[e] * y[e + 1];
      if (i > 0) ay += cA[e] * y[e - M];
      if (i < N - 1) ay += cB[e] * y[e + M];
      r2 += (f[e] - ay) * (f[e] - ay);
      f2 += f[e] * f[e];
    }
  }
  return sqrt(r2 / f2);
}

/* ---- problems ---- */

enum { N_TRI = 50, B_TRI = 7, N_TREE = 40, B_TREE = 5, N_DENSE = 12, B_DENSE = 4, BN = 24, BM = 16 };

typedef struct {
  double *a, *b, *c;
} Tri;
static void make_tri(Tri* t, int layout) {
  const int64_t total = N_TRI * B_TRI;
  t->a = dalloc(total), t->b = dalloc(total), t->c = dalloc(total);
  fill(t->a, total, -1, 1);
  fill(t->c, total, -1, 1);
  fill(t->b, total, 2.5, 4);
  for (int64_t s = 0; s < B_TRI; ++s) {
    t->a[at(layout, N_TRI, B_TRI, 0, s)] = 0;
    t->c[at(layout, N_TRI, B_TRI, N_TRI - 1, s)] = 0;
  }
}

typedef struct {
  int32_t* parent; /* N_TREE or B_TREE * N_TREE */
  int64_t parent_systems;
  double *lower, *upper, *diag;
} TreeSys;
/* Depth-first numbered trees: node i hangs off i-1 or one of its first few ancestors. Diagonals
 * dominate their rows and columns. */
static void make_tree(TreeSys* t, int layout, int64_t parent_systems) {
  const int64_t total = N_TREE * B_TREE;
  t->parent_systems = parent_systems;
  t->parent = malloc(sizeof(int32_t) * (size_t)(N_TREE * parent_systems));
  for (int64_t s = 0; s < parent_systems; ++s) {
    int32_t* p = t->parent + s * N_TREE;
    p[0] = -1;
    for (int64_t i = 1; i < N_TREE; ++i) {
      int32_t q = (int32_t)(i - 1);
      for (int up = (int)((rnd() + 1) * 1.5); up > 0 && p[q] >= 0; --up) q = p[q];
      p[i] = q;
    }
  }
  t->lower = dalloc(total), t->upper = dalloc(total), t->diag = dalloc(total);
  fill(t->lower, total, -1, 0);
  fill(t->upper, total, -1, 0);
  for (int64_t s = 0; s < B_TREE; ++s) {
    const int32_t* p = t->parent + (parent_systems == 1 ? 0 : s * N_TREE);
    t->lower[at(layout, N_TREE, B_TREE, 0, s)] = 0;
    t->upper[at(layout, N_TREE, B_TREE, 0, s)] = 0;
    for (int64_t i = 0; i < N_TREE; ++i) t->diag[at(layout, N_TREE, B_TREE, i, s)] = 1.5;
    for (int64_t i = 1; i < N_TREE; ++i) {
      const int64_t ii = at(layout, N_TREE, B_TREE, i, s), pp = at(layout, N_TREE, B_TREE, p[i], s);
      t->diag[ii] += fabs(t->lower[ii]) + fabs(t->upper[ii]);
      t->diag[pp] += fabs(t->lower[ii]) + fabs(t->upper[ii]);
    }
  }
}

/* Row-major A[s][i][j], diagonally dominant; col: the same matrices column-major. */
static void make_dense(double* A, double* col) {
  for (int64_t s = 0; s < B_DENSE; ++s) {
    for (int64_t i = 0; i < N_DENSE; ++i) {
      for (int64_t j = 0; j < N_DENSE; ++j) {
        const double v = rnd() + (i == j ? 2.0 * N_DENSE : 0.0);
        A[s * N_DENSE * N_DENSE + i * N_DENSE + j] = v;
        col[s * N_DENSE * N_DENSE + j * N_DENSE + i] = v;
      }
    }
  }
}

/* A 2D pressure step (sigma - Laplacian) on an N x M grid: symmetric positive definite. */
static void make_block(double* co[5], double sigma) {
  const int64_t total = BN * BM;
  for (int j = 0; j < 5; ++j) co[j] = dalloc(total);
  for (int64_t i = 0; i < BN; ++i) {
    for (int64_t k = 0; k < BM; ++k) {
      const int64_t e = i * BM + k;
      co[0][e] = k > 0 ? -1 : 0;
      co[2][e] = k < BM - 1 ? -1 : 0;
      co[3][e] = i > 0 ? -1 : 0;
      co[4][e] = i < BN - 1 ? -1 : 0;
      co[1][e] = 4 + sigma;
    }
  }
}

/* ---- one-shot solves ---- */

static void one_shot_tridiagonal(int f32, int layout) {
  const int64_t total = N_TRI * B_TRI;
  Tri t;
  double *d = dalloc(total), *x = dalloc(total);
  int status[B_TRI];
  int rc;
  make_tri(&t, layout);
  fill(d, total, -1, 1);
  if (f32) {
    float *fa = to_f32(t.a, total), *fb = to_f32(t.b, total), *fc = to_f32(t.c, total),
          *fd = to_f32(d, total), *fx = malloc(sizeof(float) * total);
    rc = trisolve_solve_tridiagonal_f32(ctx, N_TRI, B_TRI, fa, fb, fc, fd, fx, layout, status);
    from_f32(fx, x, total);
    free(fa), free(fb), free(fc), free(fd), free(fx);
  } else {
    rc = trisolve_solve_tridiagonal(ctx, N_TRI, B_TRI, t.a, t.b, t.c, d, x, layout, status);
  }
  const double r = res_tri(layout, N_TRI, B_TRI, t.a, t.b, t.c, x, d);
  check(rc == TRISOLVE_OK && status[B_TRI - 1] == TRISOLVE_SYSTEM_OK && r < tol_of(f32),
        "solve_tridiagonal %s %s: residual %.1e", prec_name(f32),
        layout == TRISOLVE_FLAT ? "flat" : "interleaved", r);
  free(t.a), free(t.b), free(t.c), free(d), free(x);
}

static void one_shot_tree(int f32, int layout, int64_t parent_systems) {
  const int64_t total = N_TREE * B_TREE;
  TreeSys t;
  double *rhs = dalloc(total), *x = dalloc(total);
  int status[B_TREE];
  int rc;
  make_tree(&t, layout, parent_systems);
  fill(rhs, total, -1, 1);
  if (f32) {
    float *fl = to_f32(t.lower, total), *fu = to_f32(t.upper, total), *fdg = to_f32(t.diag, total),
          *fr = to_f32(rhs, total), *fx = malloc(sizeof(float) * total);
    rc = trisolve_solve_tree_f32(ctx, N_TREE, B_TREE, t.parent, parent_systems, fl, fu, fdg, fr,
                                 fx, layout, status);
    from_f32(fx, x, total);
    free(fl), free(fu), free(fdg), free(fr), free(fx);
  } else {
    rc = trisolve_solve_tree(ctx, N_TREE, B_TREE, t.parent, parent_systems, t.lower, t.upper,
                             t.diag, rhs, x, layout, status);
  }
  const double r =
      res_tree(layout, N_TREE, B_TREE, t.parent, parent_systems, t.lower, t.upper, t.diag, x, rhs);
  check(rc == TRISOLVE_OK && status[0] == TRISOLVE_SYSTEM_OK && r < tol_of(f32),
        "solve_tree %s %s, %s: residual %.1e", prec_name(f32),
        layout == TRISOLVE_FLAT ? "flat" : "interleaved",
        parent_systems == 1 ? "one morphology" : "a morphology per system", r);
  free(t.parent), free(t.lower), free(t.upper), free(t.diag), free(rhs), free(x);
}

static void one_shot_dense(int f32) {
  const int64_t nn = N_DENSE * N_DENSE * B_DENSE, nb = N_DENSE * B_DENSE;
  double *A = dalloc(nn), *col = dalloc(nn), *b = dalloc(nb), *x = dalloc(nb), *xc = dalloc(nb);
  int status[B_DENSE];
  int rc, rc2;
  make_dense(A, col);
  fill(b, nb, -1, 1);
  if (f32) {
    float *fA = to_f32(A, nn), *fc = to_f32(col, nn), *fb = to_f32(b, nb),
          *fx = malloc(sizeof(float) * nb), *fxc = malloc(sizeof(float) * nb);
    rc = trisolve_solve_dense_f32(ctx, N_DENSE, B_DENSE, fA, fb, fx, TRISOLVE_ROW_MAJOR, status);
    rc2 = trisolve_solve_dense_f32(ctx, N_DENSE, B_DENSE, fc, fb, fxc, TRISOLVE_COL_MAJOR, NULL);
    from_f32(fx, x, nb);
    from_f32(fxc, xc, nb);
    free(fA), free(fc), free(fb), free(fx), free(fxc);
  } else {
    rc = trisolve_solve_dense(ctx, N_DENSE, B_DENSE, A, b, x, TRISOLVE_ROW_MAJOR, status);
    rc2 = trisolve_solve_dense(ctx, N_DENSE, B_DENSE, col, b, xc, TRISOLVE_COL_MAJOR, NULL);
  }
  const double r = res_dense(N_DENSE, B_DENSE, A, x, b);
  check(rc == TRISOLVE_OK && status[0] == TRISOLVE_SYSTEM_OK && r < tol_of(f32),
        "solve_dense %s row-major: residual %.1e", prec_name(f32), r);
  check(rc2 == TRISOLVE_OK && memcmp(x, xc, sizeof(double) * nb) == 0,
        "solve_dense %s column-major: the same x, bit for bit", prec_name(f32));
  free(A), free(col), free(b), free(x), free(xc);
}

static void one_shot_block(int f32) {
  const int64_t total = BN * BM;
  double* co[5];
  double *f = dalloc(total), *y = dalloc(total);
  int status[1];
  int rc;
  make_block(co, 0.5);
  fill(f, total, -1, 1);
  if (f32) {
    float* fc[5];
    for (int j = 0; j < 5; ++j) fc[j] = to_f32(co[j], total);
    float *ff = to_f32(f, total), *fy = malloc(sizeof(float) * total);
    rc = trisolve_solve_block_f32(ctx, BN, BM, fc[0], fc[1], fc[2], fc[3], fc[4], ff, fy, -1, 0,
                                  status);
    from_f32(fy, y, total);
    for (int j = 0; j < 5; ++j) free(fc[j]);
    free(ff), free(fy);
  } else {
    rc = trisolve_solve_block(ctx, BN, BM, co[0], co[1], co[2], co[3], co[4], f, y, 1e-10, 0,
                              status);
  }
  const double r = res_block(BN, BM, co, y, f);
  check(rc == TRISOLVE_OK && status[0] == TRISOLVE_SYSTEM_OK && r < (f32 ? 5e-5 : 1e-9),
        "solve_block %s %dx%d: ||f - Ay|| / ||f|| = %.1e", prec_name(f32), BN, BM, r);
  for (int j = 0; j < 5; ++j) free(co[j]);
  free(f), free(y);
}

/* ---- progress callbacks and the residual history ---- */

typedef struct {
  int calls, solving, phase_back, iteration_back, received_bytes_ok;
  int last_phase;
  int64_t last_iteration, max_iterations;
  double last_residual;
} Reports;

static void on_progress(void* user_data, int phase, int64_t iteration, int64_t max_iterations,
                        double residual, int64_t bytes_total, double elapsed_s) {
  Reports* r = (Reports*)user_data;
  (void)elapsed_s;
  r->calls++;
  if (phase < r->last_phase) r->phase_back++;
  if (phase == TRISOLVE_PHASE_RECEIVED && bytes_total == 6 * BN * BM * 8) r->received_bytes_ok++;
  if (phase == TRISOLVE_PHASE_SOLVING) {
    r->solving++;
    if (iteration < r->last_iteration) r->iteration_back++;
    r->last_iteration = iteration;
    r->max_iterations = max_iterations;
    r->last_residual = residual;
  }
  r->last_phase = phase;
}

static void progress_and_history(void) {
  const int64_t total = BN * BM;
  double* co[5];
  double *f = dalloc(total), *y = dalloc(total);
  int status[1];
  Reports rep;
  memset(&rep, 0, sizeof rep);
  make_block(co, 0.0);  /* the pure Laplacian: slow enough for gauss-seidel to be seen */
  fill(f, total, -1, 1);
  check(trisolve_set_progress(ctx, on_progress, &rep, 0.001) == TRISOLVE_INVALID_ARGUMENT,
        "set_progress: interval 0.001 s refused");
  check(trisolve_set_progress(ctx, on_progress, &rep, 0.01) == TRISOLVE_OK, "set_progress");
  check(trisolve_set_residual_history(ctx, 1) == TRISOLVE_OK, "set_residual_history");
  int rc = trisolve_solve_block(ctx, BN, BM, co[0], co[1], co[2], co[3], co[4], f, y, 1e-10,
                                100000, status);
  check(rc == TRISOLVE_OK && status[0] == TRISOLVE_SYSTEM_OK, "solve_block with progress: %s",
        trisolve_code_name(rc));
  check(rep.calls >= 2 && rep.received_bytes_ok == 1 && rep.phase_back == 0 &&
            rep.iteration_back == 0,
        "progress: %d reports, received first, never backwards", rep.calls);
  const int64_t n = trisolve_residual_history(ctx, NULL, NULL, 0);
  int64_t* its = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  double* res = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  check(n >= 2 && n <= 1024 && trisolve_residual_history(ctx, its, res, n) == n,
        "residual_history: %lld points", (long long)n);
  int increasing = 1;
  for (int64_t i = 1; i < n; ++i) increasing &= its[i] > its[i - 1];
  const double r = res_block(BN, BM, co, y, f);
  check(n >= 2 && its[0] == 0 && fabs(res[0] - 1.0) < 1e-12 && increasing &&
            res[n - 1] <= 1e-10 && fabs(res[n - 1] - r) < 1e-6 * (r + 1e-12),
        "history: 0 .. %lld, ends at the final residual %.1e", n > 0 ? (long long)its[n - 1] : -1LL,
        n > 0 ? res[n - 1] : -1.0);
  check(rep.solving == 0 || (rep.max_iterations == 100000 && rep.last_iteration <= its[n - 1]),
        "progress: iterations within the answer's");
  /* Off again: no reports, no history. */
  memset(&rep, 0, sizeof rep);
  trisolve_set_progress(ctx, NULL, NULL, 0);
  trisolve_set_residual_history(ctx, 0);
  rc = trisolve_solve_block(ctx, BN, BM, co[0], co[1], co[2], co[3], co[4], f, y, 1e-10, 100000,
                            status);
  check(rc == TRISOLVE_OK && rep.calls == 0 && trisolve_residual_history(ctx, NULL, NULL, 0) == 0,
        "progress off: no reports, no history");
  check(trisolve_residual_history(NULL, NULL, NULL, 0) == -1, "residual_history(NULL) = -1");
  free(its), free(res);
  for (int j = 0; j < 5; ++j) free(co[j]);
  free(f), free(y);
}

/* ---- persistent systems, every family, and their streams ----
 * Each family is described once: its coefficient arrays (double copies, rounded to float for
 * f32), a create call, a residual, and the array an update replaces. */

enum { TRI, TREE, DENSE, BLOCK };
typedef struct {
  int kind;
  const char* family;
  int64_t rhs_len, statuses; /* values and statuses per right-hand side */
  int ncoef;
  const char* names[5];
  double* coef[5];
  int64_t coef_len[5];
  int layout;
  int32_t* parent; /* tree */
  int64_t parent_systems;
  double tol;
} Family;

static void family_tri(Family* F, int layout) {
  Tri t;
  make_tri(&t, layout);
  *F = (Family){TRI, "tridiagonal", N_TRI * B_TRI, B_TRI, 3, {"a", "b", "c"}, {t.a, t.b, t.c},
                {N_TRI * B_TRI, N_TRI * B_TRI, N_TRI * B_TRI}, layout, NULL, 1, 0};
}
static void family_tree(Family* F, int layout) {
  TreeSys t;
  make_tree(&t, layout, B_TREE);
  *F = (Family){TREE, "tree", N_TREE * B_TREE, B_TREE, 3, {"lower", "upper", "diag"},
                {t.lower, t.upper, t.diag}, {N_TREE * B_TREE, N_TREE * B_TREE, N_TREE * B_TREE},
                layout, t.parent, B_TREE, 0};
}
static void family_dense(Family* F) {
  double *A = dalloc(N_DENSE * N_DENSE * B_DENSE), *col = dalloc(N_DENSE * N_DENSE * B_DENSE);
  make_dense(A, col);
  free(A);
  *F = (Family){DENSE, "dense", N_DENSE * B_DENSE, B_DENSE, 1, {"A"}, {col}, {N_DENSE * N_DENSE * B_DENSE},
                TRISOLVE_COL_MAJOR, NULL, 1, 0};
}
static void family_block(Family* F) {
  *F = (Family){BLOCK, "block", BN * BM, 1, 5, {"aC", "cC", "bC", "cA", "cB"}, {0}, {0}, 0, NULL, 1, 1e-11};
  make_block(F->coef, 0.5);
  for (int j = 0; j < 5; ++j) F->coef_len[j] = BN * BM;
}

static double family_residual(const Family* F, const double* x, const double* rhs) {
  switch (F->kind) {
    case TRI: return res_tri(F->layout, N_TRI, B_TRI, F->coef[0], F->coef[1], F->coef[2], x, rhs);
    case TREE:
      return res_tree(F->layout, N_TREE, B_TREE, F->parent, F->parent_systems, F->coef[0],
                      F->coef[1], F->coef[2], x, rhs);
    case DENSE: { /* dense, held column-major: transpose for the residual */
      const int64_t nn = N_DENSE * N_DENSE * B_DENSE;
      double* A = dalloc(nn);
      for (int64_t s = 0; s < B_DENSE; ++s)
        for (int64_t i = 0; i < N_DENSE; ++i)
          for (int64_t j = 0; j < N_DENSE; ++j)
            A[s * N_DENSE * N_DENSE + i * N_DENSE + j] = F->coef[0][s * N_DENSE * N_DENSE + j * N_DENSE + i];
      const double r = res_dense(N_DENSE, B_DENSE, A, x, rhs);
      free(A);
      return r;
    }
    default: return res_block(BN, BM, F->coef, x, rhs);
  }
}

/* The coefficients as the call's type: doubles, or float copies (freed by the caller). */
static const void* as_type(double* p, int64_t n, int f32) { return f32 ? (const void*)to_f32(p, n) : p; }

static int family_create(const Family* F, int f32, trisolve_system** sys) {
  const void* c[5] = {0};
  int rc = TRISOLVE_INTERNAL;
  for (int j = 0; j < F->ncoef; ++j) c[j] = as_type(F->coef[j], F->coef_len[j], f32);
  switch (F->kind) {
    case TRI:
      rc = f32 ? trisolve_system_create_tridiagonal_f32(ctx, N_TRI, B_TRI, c[0], c[1], c[2], F->layout, sys)
               : trisolve_system_create_tridiagonal(ctx, N_TRI, B_TRI, c[0], c[1], c[2], F->layout, sys);
      break;
    case TREE:
      rc = f32 ? trisolve_system_create_tree_f32(ctx, N_TREE, B_TREE, F->parent, F->parent_systems,
                                                 c[0], c[1], c[2], F->layout, sys)
               : trisolve_system_create_tree(ctx, N_TREE, B_TREE, F->parent, F->parent_systems,
                                             c[0], c[1], c[2], F->layout, sys);
      break;
    case DENSE:
      rc = f32 ? trisolve_system_create_dense_f32(ctx, N_DENSE, B_DENSE, c[0], F->layout, sys)
               : trisolve_system_create_dense(ctx, N_DENSE, B_DENSE, c[0], F->layout, sys);
      break;
    default: {
      const double tol = f32 ? -1 : F->tol;
      rc = f32 ? trisolve_system_create_block_f32(ctx, BN, BM, c[0], c[1], c[2], c[3], c[4], tol, 0, sys)
               : trisolve_system_create_block(ctx, BN, BM, c[0], c[1], c[2], c[3], c[4], tol, 0, sys);
    }
  }
  if (f32)
    for (int j = 0; j < F->ncoef; ++j) free((void*)c[j]);
  return rc;
}

/* k right-hand sides (values in all) in the call's type; x back as doubles. */
static int solve_any(trisolve_system* sys, int f32, double* rhs, int64_t values, int64_t k,
                     double* x, int* st) {
  if (!f32) return trisolve_system_solve(sys, rhs, k, x, st);
  float *fr = to_f32(rhs, values), *fx = malloc(sizeof(float) * values);
  const int rc = trisolve_system_solve_f32(sys, fr, k, fx, st);
  from_f32(fx, x, values);
  free(fr), free(fx);
  return rc;
}

/* The array the update replaces: the diagonal-bearing one, scaled up (stays dominant). */
static int update_index(const Family* F) {
  switch (F->kind) {
    case TRI: return 1;   /* b */
    case TREE: return 2;  /* diag */
    case BLOCK: return 1; /* cC */
    default: return 0;    /* A */
  }
}

static void persistent(Family* F, int f32) {
  const int K = 2;
  const int64_t len = F->rhs_len;
  double *rhs = dalloc(K * len), *x = dalloc(K * len);
  int* st = calloc((size_t)(K * F->statuses), sizeof(int));
  trisolve_system* sys = NULL;
  const double tol = F->kind == BLOCK ? (f32 ? 5e-5 : 1e-9) : tol_of(f32);
  int rc = family_create(F, f32, &sys);
  check(rc == TRISOLVE_OK && sys != NULL && trisolve_system_is_f32(sys) == f32,
        "system %s %s: create (handle %.12s...)", F->family, prec_name(f32),
        sys ? trisolve_system_handle(sys) : "none");
  if (rc != TRISOLVE_OK) {
    free(rhs), free(x), free(st);
    return;
  }
  fill(rhs, K * len, -1, 1);
  rc = solve_any(sys, f32, rhs, K * len, K, x, st);
  double r = 0;
  for (int j = 0; j < K; ++j) r = fmax(r, family_residual(F, x + j * len, rhs + j * len));
  check(rc == TRISOLVE_OK && st[K * F->statuses - 1] == TRISOLVE_SYSTEM_OK && r < tol,
        "system %s %s: solve %d right-hand sides: residual %.1e", F->family, prec_name(f32), K, r);

  /* An update: the array scaled by 1.5 (exactly representable in float as well). */
  const int u = update_index(F);
  for (int64_t i = 0; i < F->coef_len[u]; ++i) F->coef[u][i] *= 1.5;
  if (f32) {
    float* fv = to_f32(F->coef[u], F->coef_len[u]);
    rc = trisolve_system_update_f32(sys, F->names[u], fv);
    free(fv);
  } else {
    rc = trisolve_system_update(sys, F->names[u], F->coef[u]);
  }
  check(rc == TRISOLVE_OK, "system %s %s: update %s", F->family, prec_name(f32), F->names[u]);
  rc = solve_any(sys, f32, rhs, len, 1, x, st);
  r = family_residual(F, x, rhs);
  check(rc == TRISOLVE_OK && r < tol, "system %s %s: solve after the update: residual %.1e",
        F->family, prec_name(f32), r);

  /* The other type's calls are refused, naming the right one. */
  if (f32) {
    rc = trisolve_system_solve(sys, rhs, 1, x, NULL);
  } else {
    float fr[1] = {0};
    rc = trisolve_system_solve_f32(sys, fr, 1, (float*)x, NULL);
  }
  check(rc == TRISOLVE_INVALID_ARGUMENT && strstr(trisolve_last_error(ctx), "_f32") != NULL,
        "system %s %s: a call of the other type: %s", F->family, prec_name(f32),
        trisolve_code_name(rc));
  rc = f32 ? trisolve_system_update_f32(sys, "parent", (const float*)rhs)
           : trisolve_system_update(sys, "parent", rhs);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strstr(trisolve_last_error(ctx), F->names[0]) != NULL,
        "system %s %s: update of 'parent' refused, naming the arrays", F->family, prec_name(f32));

  /* The stream: three steps sent ahead, an update staged before the second. */
  trisolve_stream* stream = NULL;
  rc = trisolve_stream_open(sys, &stream);
  check(rc == TRISOLVE_OK, "system %s %s: stream open", F->family, prec_name(f32));
  if (rc == TRISOLVE_OK) {
    double* xs = dalloc(3 * len);
    float* frhs = f32 ? to_f32(rhs, len) : NULL;
    float* fxs = f32 ? malloc(sizeof(float) * 3 * len) : NULL;
    int ok = 1;
    double worst = 0;
    double* before = dalloc(F->coef_len[u]);
    memcpy(before, F->coef[u], sizeof(double) * F->coef_len[u]);
    for (int step = 0; step < 3 && ok; ++step) {
      if (step == 1) {
        for (int64_t i = 0; i < F->coef_len[u]; ++i) F->coef[u][i] *= 2;
        if (f32) {
          float* fv = to_f32(F->coef[u], F->coef_len[u]);
          rc = trisolve_stream_update_f32(stream, F->names[u], fv);
          free(fv);
        } else {
          rc = trisolve_stream_update(stream, F->names[u], F->coef[u]);
        }
        ok &= rc == TRISOLVE_OK;
      }
      rc = f32 ? trisolve_stream_send_f32(stream, frhs, 1) : trisolve_stream_send(stream, rhs, 1);
      ok &= rc == TRISOLVE_OK;
    }
    for (int step = 0; step < 3 && ok; ++step) {
      rc = f32 ? trisolve_stream_receive_f32(stream, fxs + step * len, st)
               : trisolve_stream_receive(stream, xs + step * len, st);
      ok &= rc == TRISOLVE_OK;
    }
    if (f32 && ok) from_f32(fxs, xs, 3 * len);
    /* Step 0 solved with the coefficients before the staged update, steps 1 and 2 after. */
    double* after = F->coef[u];
    F->coef[u] = before;
    if (ok) worst = family_residual(F, xs, rhs);
    F->coef[u] = after;
    if (ok) worst = fmax(worst, fmax(family_residual(F, xs + len, rhs), family_residual(F, xs + 2 * len, rhs)));
    check(ok && worst < tol, "system %s %s: stream of 3 steps, update at step 2: residual %.1e",
          F->family, prec_name(f32), worst);
    rc = f32 ? trisolve_stream_receive_f32(stream, fxs, NULL) : trisolve_stream_receive(stream, xs, NULL);
    check(rc == TRISOLVE_FAILED_PRECONDITION, "system %s %s: receive with no step waiting: %s",
          F->family, prec_name(f32), trisolve_code_name(rc));
    rc = trisolve_stream_close(stream);
    check(rc == TRISOLVE_OK, "system %s %s: stream close", F->family, prec_name(f32));
    free(before), free(xs), free(frhs), free(fxs);
  }

  rc = trisolve_system_release(sys);
  check(rc == TRISOLVE_OK, "system %s %s: release", F->family, prec_name(f32));
  rc = solve_any(sys, f32, rhs, len, 1, x, st);
  check(rc == TRISOLVE_NOT_FOUND, "system %s %s: solve after release: %s", F->family,
        prec_name(f32), trisolve_code_name(rc));
  /* A stream on a released system: the server ends it with NOT_FOUND at the first step. */
  rc = trisolve_stream_open(sys, &stream);
  if (rc == TRISOLVE_OK) {
    float* frhs = f32 ? to_f32(rhs, len) : NULL;
    rc = f32 ? trisolve_stream_send_f32(stream, frhs, 1) : trisolve_stream_send(stream, rhs, 1);
    if (rc == TRISOLVE_OK) {
      rc = f32 ? trisolve_stream_receive_f32(stream, (float*)x, NULL)
               : trisolve_stream_receive(stream, x, NULL);
    }
    const int close_rc = trisolve_stream_close(stream);
    check(rc == TRISOLVE_NOT_FOUND && close_rc == TRISOLVE_NOT_FOUND,
          "system %s %s: a stream on a released system: %s", F->family, prec_name(f32),
          trisolve_code_name(rc));
    free(frhs);
  } else {
    check(rc == TRISOLVE_NOT_FOUND, "system %s %s: a stream on a released system: %s",
          F->family, prec_name(f32), trisolve_code_name(rc));
  }
  trisolve_system_destroy(sys);
  free(rhs), free(x), free(st);
}

static void free_family(Family* F) {
  for (int j = 0; j < F->ncoef; ++j) free(F->coef[j]);
  free(F->parent);
}

/* ---- errors ---- */

static void errors(void) {
  double v[16] = {0, 2, 1, 2, 1, 0}, x[16] = {0};
  int32_t parent[2] = {-1, 0};
  int status[4] = {9, 9, 9, 9};
  trisolve_system* sys = (trisolve_system*)&status; /* must be reset to NULL on failure */
  int rc = trisolve_solve_dense(ctx, 2, 1, v, v, x, TRISOLVE_FLAT, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strstr(trisolve_last_error(ctx), "ROW_MAJOR"),
        "dense with layout TRISOLVE_FLAT: %s", trisolve_code_name(rc));
  rc = trisolve_solve_tridiagonal(ctx, 2, 1, v, v, v, v, x, TRISOLVE_COL_MAJOR, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strstr(trisolve_last_error(ctx), "INTERLEAVED"),
        "tridiagonal with layout TRISOLVE_COL_MAJOR: %s", trisolve_code_name(rc));
  rc = trisolve_system_create_tree(ctx, 2, 3, parent, 2, v, v, v, TRISOLVE_FLAT, &sys);
  check(rc == TRISOLVE_INVALID_ARGUMENT && sys == NULL && strstr(trisolve_last_error(ctx), "parent_systems"),
        "tree with parent_systems 2 of a batch of 3: %s", trisolve_code_name(rc));
  rc = trisolve_solve_tree(ctx, 2, 1, parent, 1, v, NULL, v, v, x, TRISOLVE_FLAT, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strcmp(trisolve_last_error(ctx), "upper is NULL") == 0,
        "tree with upper NULL: %s (%s)", trisolve_code_name(rc), trisolve_last_error(ctx));
  rc = trisolve_solve_block(ctx, 0, 4, v, v, v, v, v, v, x, -1, 0, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT, "block with N = 0: %s", trisolve_code_name(rc));

  /* The server's own refusals: a NaN named by its array; a parent that is not a tree. */
  double nan_b[2] = {2, NAN};
  rc = trisolve_solve_tridiagonal(ctx, 2, 1, v, nan_b, v, v, x, TRISOLVE_FLAT, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strncmp(trisolve_last_error(ctx), "b: ", 3) == 0,
        "a NaN in b: %s (%s)", trisolve_code_name(rc), trisolve_last_error(ctx));
  int32_t bad_parent[2] = {-1, 5};
  rc = trisolve_solve_tree(ctx, 2, 1, bad_parent, 1, v, v, v, v, x, TRISOLVE_FLAT, NULL);
  check(rc == TRISOLVE_INVALID_ARGUMENT, "a parent array that is not a tree: %s (%s)",
        trisolve_code_name(rc), trisolve_last_error(ctx));

  /* A singular system is NOT_SOLVED with its status and x = 0, the others solved. */
  double A[8] = {1, 2, 2, 4, /* singular */ 2, 0, 0, 4};
  double b[4] = {1, 1, 2, 4};
  x[0] = x[1] = 7;
  rc = trisolve_solve_dense(ctx, 2, 2, A, b, x, TRISOLVE_ROW_MAJOR, status);
  check(rc == TRISOLVE_NOT_SOLVED && status[0] == TRISOLVE_SYSTEM_SINGULAR &&
            status[1] == TRISOLVE_SYSTEM_OK && x[0] == 0 && x[1] == 0 && x[2] == 1 && x[3] == 1,
        "a singular dense system among two: %s, statuses %d %d", trisolve_code_name(rc),
        status[0], status[1]);
  check(strcmp(trisolve_code_name(TRISOLVE_NOT_SOLVED), "NOT_SOLVED") == 0 &&
            strcmp(trisolve_code_name(TRISOLVE_NOT_FOUND), "NOT_FOUND") == 0,
        "trisolve_code_name");
  check(trisolve_stream_open(NULL, NULL) == TRISOLVE_INVALID_ARGUMENT, "stream_open(NULL)");
}

/* ---- systems of different sizes by handle ----
 * Tridiagonal systems of 1, 2, 5 and 40 rows, the third all zero (singular): a solve of two
 * right-hand sides answers 2 x 4 statuses, that system SINGULAR in each and the others solved to
 * the residual; an update of b that cures it leaves every system OK; lengths are checked by the
 * server. Then the hand-worked tree cells (1, 2 and 5 nodes) with x known exactly. */
static void variable_systems(void) {
  enum { S = 4, T = 48 };
  const int32_t lengths[S] = {1, 2, 5, 40};
  double a[T], b[T], c[T], d[2 * T], x[2 * T];
  int status[2 * S];
  for (int64_t i = 0; i < T; ++i) {
    a[i] = rnd();
    c[i] = rnd();
    b[i] = 3 + rnd();
    d[i] = rnd();
    d[T + i] = 2 * d[i] - 1;
  }
  for (int64_t i = 3; i < 8; ++i) a[i] = b[i] = c[i] = 0; /* system 2: rows 3 .. 7 */
  trisolve_system* sys = NULL;
  int rc = trisolve_system_create_tridiagonal_variable(ctx, S, lengths, T, a, b, c, &sys);
  check(rc == TRISOLVE_OK, "variable tridiagonal system create: %s", trisolve_code_name(rc));
  if (rc != TRISOLVE_OK) return;
  rc = trisolve_system_solve(sys, d, 2, x, status);
  int ok = rc == TRISOLVE_NOT_SOLVED;
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < S; ++s)
      ok &= status[j * S + s] == (s == 2 ? TRISOLVE_SYSTEM_SINGULAR : TRISOLVE_SYSTEM_OK);
  /* Each solved system's residual, from the caller's arrays. */
  int64_t o = 0;
  double worst = 0;
  for (int s = 0; s < S; o += lengths[s], ++s) {
    if (s == 2) continue;
    for (int j = 0; j < 2; ++j)
      worst = fmax(worst, res_tri(TRISOLVE_FLAT, lengths[s], 1, a + o, b + o, c + o,
                                  x + j * T + o, d + j * T + o));
  }
  check(ok && worst < 1e-13, "variable: k = 2, only system 2 singular, residual %.1e (%s)",
        worst, trisolve_code_name(rc));
  for (int64_t i = 3; i < 8; ++i) b[i] = 2;
  rc = trisolve_system_update(sys, "b", b);
  check(rc == TRISOLVE_OK, "variable: update b: %s", trisolve_code_name(rc));
  rc = trisolve_system_solve(sys, d, 1, x, status);
  o = 0;
  worst = 0;
  for (int s = 0; s < S; o += lengths[s], ++s)
    worst = fmax(worst, res_tri(TRISOLVE_FLAT, lengths[s], 1, a + o, b + o, c + o, x + o, d + o));
  check(rc == TRISOLVE_OK && worst < 1e-13, "variable: after the update all ok, residual %.1e (%s)",
        worst, trisolve_code_name(rc));
  trisolve_system_destroy(sys);

  const int32_t short_lengths[S] = {1, 2, 5, 39}; /* sum 47, not 48 */
  sys = (trisolve_system*)&status;
  rc = trisolve_system_create_tridiagonal_variable(ctx, S, short_lengths, T, a, b, c, &sys);
  check(rc == TRISOLVE_INVALID_ARGUMENT && sys == NULL &&
            strstr(trisolve_last_error(ctx), "lengths: the 4 lengths sum to 47") != NULL,
        "variable: lengths summing short: %s", trisolve_code_name(rc));
  rc = trisolve_system_create_tridiagonal_variable(ctx, S, NULL, T, a, b, c, &sys);
  check(rc == TRISOLVE_INVALID_ARGUMENT && strcmp(trisolve_last_error(ctx), "lengths is NULL") == 0,
        "variable: lengths NULL: %s", trisolve_code_name(rc));

  /* Tree cells: the hand-worked forest of tests/tree_cells.h, x = 2 1 -1 1 2 3 -1 2. */
  const int32_t cells[3] = {1, 2, 5};
  const int32_t parent[8] = {-1, -1, 0, -1, 0, 1, 0, 3};
  const float lower[8] = {9, 3.5f, 1, 6, 1, -1, 0.5f, 1};
  const float upper[8] = {-9, -2.5f, 1, -6, 2, 1, -1, 0.5f};
  const float diag[8] = {4, 3, 2, 5, 4, 3, 4, 2};
  const float rhs[8] = {8, 2, -1, 10, 12, 7, -2.5f, 3};
  const float want[8] = {2, 1, -1, 1, 2, 3, -1, 2};
  float xf[8];
  rc = trisolve_system_create_tree_variable_f32(ctx, 3, cells, 8, parent, lower, upper, diag, &sys);
  check(rc == TRISOLVE_OK, "variable tree cells (f32) create: %s", trisolve_code_name(rc));
  if (rc != TRISOLVE_OK) return;
  rc = trisolve_system_solve_f32(sys, rhs, 1, xf, status);
  double err = 0;
  for (int i = 0; i < 8; ++i) err = fmax(err, fabs(xf[i] - want[i]));
  check(rc == TRISOLVE_OK && status[0] == 0 && status[1] == 0 && status[2] == 0 && err < 1e-5,
        "variable tree cells: x as hand-worked, error %.1e (%s)", err, trisolve_code_name(rc));
  trisolve_system_destroy(sys);
}

int main(void) {
  if (trisolve_create(NULL, NULL, &ctx) != TRISOLVE_OK) {
    fprintf(stderr, "trisolve_create: %s\n", trisolve_last_error(NULL));
    return 1;
  }
  for (int f32 = 0; f32 <= 1; ++f32) {
    one_shot_tridiagonal(f32, TRISOLVE_FLAT);
    one_shot_tridiagonal(f32, TRISOLVE_INTERLEAVED);
    one_shot_tree(f32, TRISOLVE_FLAT, 1);
    one_shot_tree(f32, TRISOLVE_INTERLEAVED, 1);
    one_shot_tree(f32, TRISOLVE_FLAT, B_TREE);
    one_shot_tree(f32, TRISOLVE_INTERLEAVED, B_TREE);
    one_shot_dense(f32);
    one_shot_block(f32);
  }
  for (int f32 = 0; f32 <= 1; ++f32) {
    Family F;
    family_tri(&F, f32 ? TRISOLVE_INTERLEAVED : TRISOLVE_FLAT);
    persistent(&F, f32);
    free_family(&F);
    family_tree(&F, f32 ? TRISOLVE_FLAT : TRISOLVE_INTERLEAVED);
    persistent(&F, f32);
    free_family(&F);
    family_dense(&F);
    persistent(&F, f32);
    free_family(&F);
    family_block(&F);
    persistent(&F, f32);
    free_family(&F);
  }
  progress_and_history();
  variable_systems();
  errors();
  trisolve_destroy(ctx);
  printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures != 0;
}
