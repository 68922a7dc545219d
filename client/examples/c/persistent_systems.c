/* Persistent tridiagonal systems through the C API: create (both layouts), solve k right-hand
 * sides at once, update a coefficient, solve again, release; then a solve on the released
 * handle must give TRISOLVE_NOT_FOUND, and a call to no server TRISOLVE_UNAVAILABLE. Residuals are computed here from the caller's arrays.
 * Exits non-zero on any failure.
 *
 *   TRISOLVE_SERVER=127.0.0.1:50051 ./persistent_systems
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "trisolve/trisolve.h"

enum { N = 200, BATCH = 6, K = 3 };

static int failures = 0;

static void check(int ok, const char* what) {
  printf("%-60s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) failures++;
}

/* Index of element k of system s in a layout. */
static int64_t at(int layout, int64_t k, int64_t s) {
  return layout == TRISOLVE_FLAT ? s * N + k : k * BATCH + s;
}

/* max |A x - d| / max |d| over the batch, one right-hand side (arrays in `layout`). */
static double residual(int layout, const double* a, const double* b, const double* c,
                       const double* x, const double* d) {
  double r = 0, scale = 0;
  for (int64_t s = 0; s < BATCH; ++s) {
    for (int64_t k = 0; k < N; ++k) {
      double ax = b[at(layout, k, s)] * x[at(layout, k, s)];
      if (k > 0) ax += a[at(layout, k, s)] * x[at(layout, k - 1, s)];
      if (k < N - 1) ax += c[at(layout, k, s)] * x[at(layout, k + 1, s)];
      r = fmax(r, fabs(ax - d[at(layout, k, s)]));
      scale = fmax(scale, fabs(d[at(layout, k, s)]));
    }
  }
  return r / scale;
}

static double worst_of_k(int layout, const double* a, const double* b, const double* c,
                         const double* x, const double* d) {
  double w = 0;
  for (int j = 0; j < K; ++j) {
    w = fmax(w, residual(layout, a, b, c, x + j * N * BATCH, d + j * N * BATCH));
  }
  return w;
}

static void one_layout(trisolve_context* ctx, int layout) {
  static double a[N * BATCH], b[N * BATCH], c[N * BATCH], d[K * N * BATCH], x[K * N * BATCH];
  int status[K * BATCH];
  trisolve_system* sys = NULL;
  char what[128];
  const char* name = layout == TRISOLVE_FLAT ? "flat" : "interleaved";
  int rc;
  double res = 1;
  for (int64_t s = 0; s < BATCH; ++s) {
    for (int64_t k = 0; k < N; ++k) {
      const int64_t i = at(layout, k, s);
      a[i] = k > 0 ? -1.0 : 0.0;
      c[i] = k < N - 1 ? -1.0 : 0.0;
      b[i] = 2.0 + 0.1 * (double)(s + 1); /* a different matrix per system */
    }
  }
  for (int64_t i = 0; i < K * N * BATCH; ++i) d[i] = sin(0.37 * (double)i) + 0.5;

  rc = trisolve_system_create_tridiagonal(ctx, N, BATCH, a, b, c, layout, &sys);
  snprintf(what, sizeof what, "%s: create (n = %d, batch = %d)", name, N, BATCH);
  check(rc == TRISOLVE_OK, what);
  if (rc != TRISOLVE_OK) {
    fprintf(stderr, "  %s: %s\n", trisolve_code_name(rc), trisolve_last_error(ctx));
    return;
  }
  printf("  handle %s\n", trisolve_system_handle(sys));

  rc = trisolve_system_solve(sys, d, K, x, status);
  if (rc == TRISOLVE_OK) res = worst_of_k(layout, a, b, c, x, d);
  snprintf(what, sizeof what, "%s: solve %d right-hand sides (residual %.2e)", name, K, res);
  check(rc == TRISOLVE_OK && res < 1e-12, what);
  if (rc != TRISOLVE_OK) fprintf(stderr, "  %s: %s\n", trisolve_code_name(rc), trisolve_last_error(ctx));

  for (int64_t i = 0; i < N * BATCH; ++i) b[i] += 1.0; /* the caller's copy, for the residual */
  rc = trisolve_system_update(sys, "b", b);
  snprintf(what, sizeof what, "%s: update b", name);
  check(rc == TRISOLVE_OK, what);
  if (rc != TRISOLVE_OK) fprintf(stderr, "  %s: %s\n", trisolve_code_name(rc), trisolve_last_error(ctx));

  res = 1;
  rc = trisolve_system_solve(sys, d, 1, x, status);
  if (rc == TRISOLVE_OK) res = residual(layout, a, b, c, x, d);
  snprintf(what, sizeof what, "%s: solve after the update (residual %.2e)", name, res);
  check(rc == TRISOLVE_OK && res < 1e-12, what);

  rc = trisolve_system_update(sys, "nope", b);
  snprintf(what, sizeof what, "%s: update of an unknown array: %s", name, trisolve_code_name(rc));
  check(rc == TRISOLVE_INVALID_ARGUMENT, what);

  rc = trisolve_system_release(sys);
  snprintf(what, sizeof what, "%s: release", name);
  check(rc == TRISOLVE_OK, what);

  rc = trisolve_system_solve(sys, d, 1, x, status);
  snprintf(what, sizeof what, "%s: solve after release: %s", name, trisolve_code_name(rc));
  check(rc == TRISOLVE_NOT_FOUND, what);
  printf("  (the server said: %s)\n", trisolve_last_error(ctx));
  trisolve_system_destroy(sys);
}

int main(void) {
  trisolve_context* ctx = NULL;
  trisolve_system* sys = NULL;
  double one = 1;
  int rc;
  if (trisolve_create(NULL, NULL, &ctx) != TRISOLVE_OK) {
    fprintf(stderr, "trisolve_create: %s\n", trisolve_last_error(NULL));
    return 1;
  }
  one_layout(ctx, TRISOLVE_FLAT);
  one_layout(ctx, TRISOLVE_INTERLEAVED);
  rc = trisolve_system_create_tridiagonal(ctx, 1, 1, &one, &one, &one, 7, &sys);
  check(rc == TRISOLVE_INVALID_ARGUMENT && sys == NULL, "create with layout 7: INVALID_ARGUMENT");
  trisolve_destroy(ctx);

  /* No server on port 1: the first call says UNAVAILABLE, with gRPC's message. */
  if (trisolve_create("127.0.0.1:1", "a-token", &ctx) == TRISOLVE_OK) {
    double v[3] = {0, 2, 0}, x[1] = {1};
    trisolve_set_timeout(ctx, 10);
    rc = trisolve_gtsv_strided_batch(ctx, 1, v, v + 1, v + 2, x, 1, 1, NULL);
    printf("  (unreachable server: %s: %s)\n", trisolve_code_name(rc), trisolve_last_error(ctx));
    check(rc == TRISOLVE_UNAVAILABLE, "a call to an unreachable server: UNAVAILABLE");
    trisolve_destroy(ctx);
  } else {
    check(0, "trisolve_create for an unreachable server (connects lazily)");
  }
  printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
  return failures != 0;
}
