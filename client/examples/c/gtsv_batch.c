/* A batch of tridiagonal systems through the cuSPARSE-shaped call trisolve_gtsv_strided_batch,
 * contiguous (batch_stride = m) and strided (batch_stride > m), in float64 and float32. Computes
 * the residual max |A x - rhs| / max |rhs| itself and prints it with the time of each call.
 * Exits non-zero when a call fails or a residual is large.
 *
 *   TRISOLVE_SERVER=127.0.0.1:50051 ./gtsv_batch [m] [batch]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trisolve/trisolve.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A reproducible value in [-1, 1). */
static double rnd(uint64_t* s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*s >> 11) / 4503599627370496.0 - 1.0;
}

/* max over systems of max_k |row k of A x - rhs| / max |rhs|, systems at p + i*stride. */
static double residual(int64_t m, int64_t batch, int64_t stride, const double* dl,
                       const double* d, const double* du, const double* x, const double* rhs) {
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t o = s * stride;
    double r = 0, scale = 0;
    for (int64_t k = 0; k < m; ++k) {
      double ax = d[o + k] * x[o + k];
      if (k > 0) ax += dl[o + k] * x[o + k - 1];
      if (k < m - 1) ax += du[o + k] * x[o + k + 1];
      r = fmax(r, fabs(ax - rhs[o + k]));
      scale = fmax(scale, fabs(rhs[o + k]));
    }
    worst = fmax(worst, r / scale);
  }
  return worst;
}

static int run(trisolve_context* ctx, int64_t m, int64_t batch, int64_t stride, int single) {
  const int64_t len = batch * stride;
  double *dl = malloc(sizeof(double) * len), *d = malloc(sizeof(double) * len),
         *du = malloc(sizeof(double) * len), *rhs = malloc(sizeof(double) * len),
         *x = malloc(sizeof(double) * len);
  float *fdl = malloc(sizeof(float) * len), *fd = malloc(sizeof(float) * len),
        *fdu = malloc(sizeof(float) * len), *fx = malloc(sizeof(float) * len);
  int* status = malloc(sizeof(int) * batch);
  uint64_t seed = 12345 + (uint64_t)stride;
  int rc, failed = 0;
  int64_t i, s, bad = 0;
  double t, res;
  if (!dl || !d || !du || !rhs || !x || !fdl || !fd || !fdu || !fx || !status) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (i = 0; i < len; ++i) {
    /* Diagonally dominant; the padding between systems is NaN, never to be read. */
    const int64_t k = i % stride;
    if (k >= m) {
      dl[i] = d[i] = du[i] = rhs[i] = x[i] = NAN;
      continue;
    }
    dl[i] = rnd(&seed);
    du[i] = rnd(&seed);
    d[i] = 3.0 + rnd(&seed); /* |d| > 2 > |dl| + |du| */
    rhs[i] = rnd(&seed);
    if (k == 0) dl[i] = NAN;     /* unused, as in cuSPARSE */
    if (k == m - 1) du[i] = NAN; /* unused */
    x[i] = rhs[i];
  }
  if (single) {
    for (i = 0; i < len; ++i) {
      fdl[i] = (float)dl[i];
      fd[i] = (float)d[i];
      fdu[i] = (float)du[i];
      fx[i] = (float)rhs[i];
    }
  }
  t = now_s();
  rc = single ? trisolve_sgtsv_strided_batch(ctx, m, fdl, fd, fdu, fx, batch, stride, status)
              : trisolve_gtsv_strided_batch(ctx, m, dl, d, du, x, batch, stride, status);
  t = now_s() - t;
  if (rc != TRISOLVE_OK) {
    fprintf(stderr, "%s: %s: %s\n", single ? "sgtsv" : "gtsv", trisolve_code_name(rc),
            trisolve_last_error(ctx));
    return 1;
  }
  for (s = 0; s < batch; ++s) bad += status[s] != TRISOLVE_SYSTEM_OK;
  if (single) {
    for (i = 0; i < len; ++i) x[i] = (i % stride < m) ? (double)fx[i] : NAN;
    /* The float32 residual is of the float32 matrix. */
    for (i = 0; i < len; ++i) {
      if (i % stride >= m) continue;
      dl[i] = (double)fdl[i];
      d[i] = (double)fd[i];
      du[i] = (double)fdu[i];
      rhs[i] = (double)(float)rhs[i];
    }
  }
  /* The padding must come back untouched. */
  for (i = 0; i < len; ++i) {
    if (i % stride >= m && !(single ? isnan(fx[i]) : isnan(x[i]))) {
      fprintf(stderr, "padding element %lld was written\n", (long long)i);
      failed = 1;
      break;
    }
  }
  res = residual(m, batch, stride, dl, d, du, x, rhs);
  printf("%-7s m = %lld, batch = %lld, batch_stride = %lld: residual %.3e, %lld not OK, "
         "%.2f ms (%.1f M unknowns/s)\n",
         single ? "float32" : "float64", (long long)m, (long long)batch, (long long)stride, res,
         (long long)bad, 1e3 * t, (double)(m * batch) / t / 1e6);
  if (bad > 0 || !(res < (single ? 1e-5 : 1e-12))) failed = 1;
  free(dl); free(d); free(du); free(rhs); free(x);
  free(fdl); free(fd); free(fdu); free(fx); free(status);
  return failed;
}

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? atoll(argv[1]) : 1000;
  const int64_t batch = argc > 2 ? atoll(argv[2]) : 512;
  trisolve_context* ctx = NULL;
  int failed = 0, rc;
  double scratch = 0;
  if (trisolve_create(NULL, NULL, &ctx) != TRISOLVE_OK) {
    fprintf(stderr, "trisolve_create: %s\n", trisolve_last_error(NULL));
    return 1;
  }
  failed |= run(ctx, m, batch, m, 0);
  failed |= run(ctx, m, batch, m + 7, 0);
  failed |= run(ctx, m, batch, m, 1);
  failed |= run(ctx, m, batch, m + 3, 1);
  /* A stride below m is the caller's error, reported before anything is sent. */
  rc = trisolve_gtsv_strided_batch(ctx, 4, &scratch, &scratch, &scratch, &scratch, 2, 3, NULL);
  if (rc != TRISOLVE_INVALID_ARGUMENT) {
    fprintf(stderr, "batch_stride < m gave %s, expected INVALID_ARGUMENT\n", trisolve_code_name(rc));
    failed = 1;
  } else {
    printf("batch_stride < m: %s (%s)\n", trisolve_code_name(rc), trisolve_last_error(ctx));
  }
  trisolve_destroy(ctx);
  printf("%s\n", failed ? "FAILED" : "OK");
  return failed;
}
