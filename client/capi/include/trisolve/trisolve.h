/* libtrisolve: the C API of trisolve, a client of the trisolved gRPC service.
 *
 * Pure C (C99), usable from C, C++ and Fortran (iso_c_binding, see client/fortran/trisolve.f90).
 * Link with -ltrisolve (the shared library libtrisolve.so, CMake target trisolve_c).
 *
 * Conventions, the same in every call:
 *  - Return value: an int, TRISOLVE_OK (0) or one of the trisolve_code values, which mirror the
 *    gRPC status codes (TRISOLVE_INVALID_ARGUMENT = 3, TRISOLVE_NOT_FOUND = 5, ...), plus
 *    TRISOLVE_NOT_SOLVED (100): the call went through but at least one system was not solved
 *    (singular, not converged or diverged; see status_out). trisolve_last_error(ctx) gives the
 *    message (the server's, or the library's for arguments it rejects before sending).
 *  - Sizes and counts are int64_t numbers of elements (not bytes).
 *  - Arrays are passed as pointers to the caller's memory. The library reads inputs during the
 *    call only and keeps no pointer after it returns; outputs are written before it returns.
 *  - The memory layout is stated in every call, never guessed:
 *      * the gtsv calls follow cuSPARSE gtsv2StridedBatch: system i at p + i*batch_stride;
 *      * tridiagonal and tree systems take TRISOLVE_FLAT (each system contiguous: element k of
 *        system s at s*n + k; a Fortran array x(n, batch) is exactly this) or
 *        TRISOLVE_INTERLEAVED (element k of system s at k*batch + s; a Fortran array x(batch, n));
 *      * dense matrices take TRISOLVE_ROW_MAJOR (C A[batch][n][n]: A[s][i][j] at s*n*n + i*n + j)
 *        or TRISOLVE_COL_MAJOR (Fortran A(n, n, batch): A(i, j, s) at s*n*n + j*n + i); their
 *        right-hand sides and x are b[batch][n] = Fortran b(n, batch) either way;
 *      * block-tridiagonal arrays are N x M row-major (element (i, k) at i*M + k); a Fortran
 *        array X(M, N) is exactly this layout: X(k+1, i+1) is block row i, unknown k.
 *    The layout values of the families differ (0, 1 against 2, 3), so one passed to the wrong
 *    family is refused with TRISOLVE_INVALID_ARGUMENT.
 *  - Element types: every call on double has a float twin named ..._f32 (the gtsv pair follows
 *    cuSPARSE's D/S naming instead: trisolve_gtsv_strided_batch / trisolve_sgtsv_strided_batch).
 *    float32 arrays are solved in float32 on the server. A system or stream keeps the type it
 *    was created with; a call of the other type is refused (TRISOLVE_INVALID_ARGUMENT).
 *  - Per-system statuses (status_out, optional: NULL to skip) are TRISOLVE_SYSTEM_OK (0),
 *    TRISOLVE_SYSTEM_SINGULAR (1), TRISOLVE_SYSTEM_NOT_CONVERGED (2), TRISOLVE_SYSTEM_DIVERGED
 *    (3); a system that is not OK has x = 0 (never NaN).
 *  - Thread safety: the calls on one context may come from several threads (the connection is
 *    shared and thread-safe), but trisolve_last_error then gives the message of whichever call
 *    failed last: use one context per thread when the messages matter. A trisolve_system must
 *    not be used by two threads at once. Contexts are cheap; systems belong to the server
 *    identity (token) of the context that made them.
 */
#ifndef TRISOLVE_TRISOLVE_H_
#define TRISOLVE_TRISOLVE_H_

#include <stdint.h>

#if defined(_WIN32)
#define TRISOLVE_API __declspec(dllexport)
#else
#define TRISOLVE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: the gRPC status codes, and one of trisolve's own. */
typedef enum trisolve_code {
  TRISOLVE_OK = 0,
  TRISOLVE_CANCELLED = 1,
  TRISOLVE_UNKNOWN = 2,
  TRISOLVE_INVALID_ARGUMENT = 3,
  TRISOLVE_DEADLINE_EXCEEDED = 4,
  TRISOLVE_NOT_FOUND = 5,
  TRISOLVE_ALREADY_EXISTS = 6,
  TRISOLVE_PERMISSION_DENIED = 7,
  TRISOLVE_RESOURCE_EXHAUSTED = 8,
  TRISOLVE_FAILED_PRECONDITION = 9,
  TRISOLVE_ABORTED = 10,
  TRISOLVE_OUT_OF_RANGE = 11,
  TRISOLVE_UNIMPLEMENTED = 12,
  TRISOLVE_INTERNAL = 13,
  TRISOLVE_UNAVAILABLE = 14,
  TRISOLVE_DATA_LOSS = 15,
  TRISOLVE_UNAUTHENTICATED = 16,
  /* The call succeeded but at least one system's status is not TRISOLVE_SYSTEM_OK. */
  TRISOLVE_NOT_SOLVED = 100
} trisolve_code;

/* Per-system statuses written to status_out. */
enum {
  TRISOLVE_SYSTEM_OK = 0,
  TRISOLVE_SYSTEM_SINGULAR = 1,
  TRISOLVE_SYSTEM_NOT_CONVERGED = 2,
  TRISOLVE_SYSTEM_DIVERGED = 3
};

/* Layouts of a batch of tridiagonal or tree systems. */
enum {
  TRISOLVE_FLAT = 0,        /* element k of system s at s*n + k: C x[batch][n], Fortran x(n, batch) */
  TRISOLVE_INTERLEAVED = 1  /* element k of system s at k*batch + s: C x[n][batch], Fortran x(batch, n) */
};

/* Layouts of a batch of dense matrices. */
enum {
  TRISOLVE_ROW_MAJOR = 2, /* A[s][i][j] at s*n*n + i*n + j: C A[batch][n][n] */
  TRISOLVE_COL_MAJOR = 3  /* A(i, j, s) at s*n*n + j*n + i: Fortran A(n, n, batch) */
};

typedef struct trisolve_context trisolve_context; /* a connection to one server */
typedef struct trisolve_system trisolve_system;   /* a persistent system on the server */
typedef struct trisolve_stream trisolve_stream;   /* a time-step stream of one system */

/* The name of a code ("OK", "INVALID_ARGUMENT", ..., "NOT_SOLVED"); a static string. */
TRISOLVE_API const char* trisolve_code_name(int code);

/* ---- Contexts ------------------------------------------------------------------------------
 * trisolve_create: target "host:port" (NULL: the TRISOLVE_SERVER environment variable, else
 * "127.0.0.1:50051"); token: a bearer token sent with every call, or NULL / "" for none.
 * Connects lazily: an unreachable server shows at the first call (TRISOLVE_UNAVAILABLE).
 * *out is a new context (NULL on failure); free it with trisolve_destroy. */
TRISOLVE_API int trisolve_create(const char* target, const char* token, trisolve_context** out);
/* Frees the context (NULL is fine). Systems made with it must be destroyed first. */
TRISOLVE_API void trisolve_destroy(trisolve_context* ctx);
/* The message of the last failed call on this context ("" if none); valid until the next call
 * on the context. NULL ctx: the message of the last failed trisolve_create of this thread. */
TRISOLVE_API const char* trisolve_last_error(const trisolve_context* ctx);
/* Deadline of every later call on the context, in seconds (0: none, the default). */
TRISOLVE_API int trisolve_set_timeout(trisolve_context* ctx, double seconds);

/* ---- Progress and residual history of the one-shot solves ------------------------------------
 * trisolve_set_progress: every later one-shot solve on the context (trisolve_solve_*,
 * trisolve_gtsv_strided_batch) calls fn(user_data, ...) on the calling thread as the server
 * reports (at most once every interval_s seconds; 0: 0.1 s, else 0.01 .. 3600):
 *   phase          TRISOLVE_PHASE_RECEIVED (bytes_total: the request's), _QUEUED, _SOLVING,
 *                  _SENDING (bytes_total: x's); phases only move forward
 *   iteration      block solves while SOLVING: iterations done (non-decreasing), with
 *   max_iterations the request's limit (0 for the direct families), and
 *   residual       the relative residual at the last check (NaN before the first)
 *   elapsed_s      since the server got the call
 * The job then travels in one message (up to 64 MiB of arrays; larger ones report nothing).
 * fn NULL: off (the default). */
enum {
  TRISOLVE_PHASE_RECEIVED = 1,
  TRISOLVE_PHASE_QUEUED = 2,
  TRISOLVE_PHASE_SOLVING = 3,
  TRISOLVE_PHASE_SENDING = 4
};
typedef void (*trisolve_progress_fn)(void* user_data, int phase, int64_t iteration,
                                     int64_t max_iterations, double residual,
                                     int64_t bytes_total, double elapsed_s);
TRISOLVE_API int trisolve_set_progress(trisolve_context* ctx, trisolve_progress_fn fn,
                                       void* user_data, double interval_s);
/* on != 0: later trisolve_solve_block / _f32 calls on the context keep the solve's residual
 * history (at most 1024 points, from iteration 0 to the final iterations and residual), read
 * with trisolve_residual_history. */
TRISOLVE_API int trisolve_set_residual_history(trisolve_context* ctx, int on);
/* The history of the last block solve on the context: copies min(points, capacity) points into
 * iterations[] and residuals[] (either NULL to only count) and returns the number of points
 * (0 when none was kept; -1 for a NULL ctx). */
TRISOLVE_API int64_t trisolve_residual_history(const trisolve_context* ctx, int64_t* iterations,
                                               double* residuals, int64_t capacity);

/* ---- One-shot batched tridiagonal solves, shaped as cuSPARSE gtsv2StridedBatch ------------
 * batch systems of order m; system i is dl, d, du, x + i*batch_stride (batch_stride >= m; the
 * elements between systems are neither read nor written). Row k of a system:
 *   dl[k] x[k-1] + d[k] x[k] + du[k] x[k+1] = rhs[k]
 * dl[0] and du[m-1] of each system are not used (not even read for NaN checks).
 * x: in, the right-hand sides; out, the solutions (in place, as cuSPARSE).
 * status_out: NULL or batch ints, one status per system.
 * Switching from cuSPARSE: cusparseDgtsv2StridedBatch(handle, m, dl, d, du, x, batch, stride,
 * buffer) becomes trisolve_gtsv_strided_batch(ctx, m, dl, d, du, x, batch, stride, NULL), with
 * host pointers. Returns TRISOLVE_NOT_SOLVED if a system was not solved (its x set to 0). */
TRISOLVE_API int trisolve_gtsv_strided_batch(trisolve_context* ctx, int64_t m, const double* dl,
                                             const double* d, const double* du, double* x,
                                             int64_t batch, int64_t batch_stride,
                                             int* status_out);
/* The same in float32 (solved in float32 on the server). */
TRISOLVE_API int trisolve_sgtsv_strided_batch(trisolve_context* ctx, int64_t m, const float* dl,
                                              const float* d, const float* du, float* x,
                                              int64_t batch, int64_t batch_stride,
                                              int* status_out);


/* ---- One-shot solves of every family (coefficients and right-hand sides in one call) --------
 * x has the right-hand side's size and layout (x may equal the right-hand side); status_out:
 * NULL or one int per system (batch; 1 for the block family). */

/* Tridiagonal: batch systems of order n in `layout`; row k: a[k] x[k-1] + b[k] x[k] +
 * c[k] x[k+1] = d[k]; a[0] and c[n-1] of each system are not used (pass 0). */
TRISOLVE_API int trisolve_solve_tridiagonal(trisolve_context* ctx, int64_t n, int64_t batch,
                                            const double* a, const double* b, const double* c,
                                            const double* d, double* x, int layout,
                                            int* status_out);
TRISOLVE_API int trisolve_solve_tridiagonal_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                                const float* a, const float* b, const float* c,
                                                const float* d, float* x, int layout,
                                                int* status_out);
/* Tree (Hines): nodes numbered depth-first from the root 0, parent[0] = -1, parent[i] < i;
 * A[i][i] = diag[i], A[i][parent[i]] = lower[i], A[parent[i]][i] = upper[i]. lower, upper,
 * diag, rhs and x are n*batch values in `layout`; parent is n values (parent_systems = 1: one
 * morphology for the batch) or batch*n values, system by system whatever the layout
 * (parent_systems = batch; Fortran parent(n, batch)). */
TRISOLVE_API int trisolve_solve_tree(trisolve_context* ctx, int64_t n, int64_t batch,
                                     const int32_t* parent, int64_t parent_systems,
                                     const double* lower, const double* upper,
                                     const double* diag, const double* rhs, double* x,
                                     int layout, int* status_out);
TRISOLVE_API int trisolve_solve_tree_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                         const int32_t* parent, int64_t parent_systems,
                                         const float* lower, const float* upper,
                                         const float* diag, const float* rhs, float* x,
                                         int layout, int* status_out);
/* Block-tridiagonal: as trisolve_system_create_block below, with the right-hand side f and the
 * solution y (N x M row-major). */
TRISOLVE_API int trisolve_solve_block(trisolve_context* ctx, int64_t N, int64_t M,
                                      const double* aC, const double* cC, const double* bC,
                                      const double* cA, const double* cB, const double* f,
                                      double* y, double tol, int64_t max_iterations,
                                      int* status_out);
TRISOLVE_API int trisolve_solve_block_f32(trisolve_context* ctx, int64_t N, int64_t M,
                                          const float* aC, const float* cC, const float* bC,
                                          const float* cA, const float* cB, const float* f,
                                          float* y, double tol, int64_t max_iterations,
                                          int* status_out);
/* Dense: batch systems A x = b of order n; A is batch n x n matrices in `layout`
 * (TRISOLVE_ROW_MAJOR or TRISOLVE_COL_MAJOR), b and x are batch*n values, system by system. */
TRISOLVE_API int trisolve_solve_dense(trisolve_context* ctx, int64_t n, int64_t batch,
                                      const double* A, const double* b, double* x, int layout,
                                      int* status_out);
TRISOLVE_API int trisolve_solve_dense_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                          const float* A, const float* b, float* x, int layout,
                                          int* status_out);

/* ---- Persistent systems --------------------------------------------------------------------
 * The coefficients are sent once; each solve sends only right-hand sides. A system lives on the
 * server until trisolve_system_release, or until idle for the server's TTL (600 s by default).
 *
 * Tridiagonal: batch systems of order n, a (sub), b (main), c (super diagonal), each n*batch
 * values in `layout` (TRISOLVE_FLAT or TRISOLVE_INTERLEAVED); a[0] and c[n-1] of each system are
 * not used (pass 0). Row k: a[k] x[k-1] + b[k] x[k] + c[k] x[k+1] = d[k]. */
TRISOLVE_API int trisolve_system_create_tridiagonal(trisolve_context* ctx, int64_t n,
                                                    int64_t batch, const double* a,
                                                    const double* b, const double* c, int layout,
                                                    trisolve_system** out);
TRISOLVE_API int trisolve_system_create_tridiagonal_f32(trisolve_context* ctx, int64_t n,
                                                        int64_t batch, const float* a,
                                                        const float* b, const float* c,
                                                        int layout, trisolve_system** out);
/* Tree (Hines): the arrays of trisolve_solve_tree, without the right-hand side. */
TRISOLVE_API int trisolve_system_create_tree(trisolve_context* ctx, int64_t n, int64_t batch,
                                             const int32_t* parent, int64_t parent_systems,
                                             const double* lower, const double* upper,
                                             const double* diag, int layout,
                                             trisolve_system** out);
TRISOLVE_API int trisolve_system_create_tree_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                                 const int32_t* parent, int64_t parent_systems,
                                                 const float* lower, const float* upper,
                                                 const float* diag, int layout,
                                                 trisolve_system** out);
/* Systems of different sizes: `systems` tridiagonal systems (tree cells) whose sizes
 * lengths[0 .. systems-1], each >= 1, sum to `total`; every array holds the systems' rows (the
 * cells' nodes) one system after the other, `total` values (a tree cell's parent values count
 * from its own root: its node 0 has parent -1). A solve takes k right-hand sides of `total`
 * values each and answers k * systems statuses; an update takes `total` values. The lengths
 * are fixed: other sizes are another system. */
TRISOLVE_API int trisolve_system_create_tridiagonal_variable(trisolve_context* ctx,
                                                             int64_t systems,
                                                             const int32_t* lengths,
                                                             int64_t total, const double* a,
                                                             const double* b, const double* c,
                                                             trisolve_system** out);
TRISOLVE_API int trisolve_system_create_tridiagonal_variable_f32(trisolve_context* ctx,
                                                                 int64_t systems,
                                                                 const int32_t* lengths,
                                                                 int64_t total, const float* a,
                                                                 const float* b, const float* c,
                                                                 trisolve_system** out);
TRISOLVE_API int trisolve_system_create_tree_variable(trisolve_context* ctx, int64_t cells,
                                                      const int32_t* lengths, int64_t total,
                                                      const int32_t* parent, const double* lower,
                                                      const double* upper, const double* diag,
                                                      trisolve_system** out);
TRISOLVE_API int trisolve_system_create_tree_variable_f32(trisolve_context* ctx, int64_t cells,
                                                          const int32_t* lengths, int64_t total,
                                                          const int32_t* parent,
                                                          const float* lower, const float* upper,
                                                          const float* diag,
                                                          trisolve_system** out);
/* Dense: batch matrices of order n in `layout` (TRISOLVE_ROW_MAJOR or TRISOLVE_COL_MAJOR). */
TRISOLVE_API int trisolve_system_create_dense(trisolve_context* ctx, int64_t n, int64_t batch,
                                              const double* A, int layout,
                                              trisolve_system** out);
TRISOLVE_API int trisolve_system_create_dense_f32(trisolve_context* ctx, int64_t n,
                                                  int64_t batch, const float* A, int layout,
                                                  trisolve_system** out);
/* Block-tridiagonal (the 2D pressure / hemodynamics family): N block rows of order M. Block
 * row i: diag(cA[i]) Y[i-1] + C_i Y[i] + diag(cB[i]) Y[i+1] = F[i], C_i tridiagonal with aC[i]
 * (sub), cC[i] (main), bC[i] (super diagonal). Every array is N x M ROW-MAJOR (element (i, k)
 * at i*M + k) = a Fortran array X(M, N). aC[i][0], bC[i][M-1], cA[0][*], cB[N-1][*] are not
 * used (pass 0). tol: the relative residual ||F - AY||_2 / ||F||_2 to stop at; < 0 for the
 * server's default (1e-10 in float64, 1e-5 in float32), 0 for exactly max_iterations sweeps (as the thesis' experiments);
 * max_iterations: <= 0 for the server's default (1000). The method is the server's
 * auto (multigrid-cg for symmetric systems, else gauss-seidel / red-black). */
TRISOLVE_API int trisolve_system_create_block(trisolve_context* ctx, int64_t N, int64_t M,
                                              const double* aC, const double* cC,
                                              const double* bC, const double* cA,
                                              const double* cB, double tol,
                                              int64_t max_iterations, trisolve_system** out);
TRISOLVE_API int trisolve_system_create_block_f32(trisolve_context* ctx, int64_t N, int64_t M,
                                                  const float* aC, const float* cC,
                                                  const float* bC, const float* cA,
                                                  const float* cB, double tol,
                                                  int64_t max_iterations, trisolve_system** out);
/* Solves k >= 1 right-hand sides, one after the other in rhs (each in the system's shape and
 * layout: n*batch values for tridiagonal, tree and dense, N*M for block), writing k solutions
 * to x likewise (x may equal rhs). status_out: NULL or k*batch ints (k for block systems),
 * right-hand side by right-hand side. Returns TRISOLVE_NOT_FOUND once the system is released
 * or expired. */
TRISOLVE_API int trisolve_system_solve(trisolve_system* sys, const double* rhs, int64_t k,
                                       double* x, int* status_out);
TRISOLVE_API int trisolve_system_solve_f32(trisolve_system* sys, const float* rhs, int64_t k,
                                           float* x, int* status_out);
/* Replaces one coefficient array by name, in the layout the system was created with: "a",
 * "b", "c" (tridiagonal), "lower", "upper", "diag" (tree; the parent array is fixed), "A"
 * (dense), "aC", "cC", "bC", "cA", "cB" (block); values has that array's size. A failed
 * update leaves the system as it was. */
TRISOLVE_API int trisolve_system_update(trisolve_system* sys, const char* name,
                                        const double* values);
TRISOLVE_API int trisolve_system_update_f32(trisolve_system* sys, const char* name,
                                            const float* values);
/* Frees the system on the server. The trisolve_system stays valid (later solves give
 * TRISOLVE_NOT_FOUND) until trisolve_system_destroy. */
TRISOLVE_API int trisolve_system_release(trisolve_system* sys);
/* Releases the system on the server if not yet released (errors ignored) and frees the
 * trisolve_system (NULL is fine). */
TRISOLVE_API void trisolve_system_destroy(trisolve_system* sys);
/* The server's handle of the system (a static string owned by sys). */
TRISOLVE_API const char* trisolve_system_handle(const trisolve_system* sys);
/* 1 if the system was created from float arrays (use the _f32 calls), else 0. */
TRISOLVE_API int trisolve_system_is_f32(const trisolve_system* sys);
/* The summary of the last successful solve on this system: the relative residual the server
 * computed, the iterations (block family) and the server's method name (owned by sys). Any
 * pointer may be NULL. */
TRISOLVE_API int trisolve_system_last_summary(const trisolve_system* sys, double* residual,
                                              int64_t* iterations, const char** method);

/* ---- The time-step stream of a persistent system -------------------------------------------
 * One open call (gRPC bidirectional stream) carries every step: send a step's right-hand sides
 * (with coefficient updates staged before it), receive its answer; answers come in the order of
 * the steps, and steps may be sent ahead of their answers (a window of a few keeps the server
 * busy while the caller prepares the next). A step that fails ends the stream: its receive
 * returns the server's code and message.
 *
 *   trisolve_stream_open(sys, &st);
 *   for each step:  trisolve_stream_update(st, "b", b);   (optional, any number of arrays)
 *                   trisolve_stream_send(st, rhs, 1);
 *                   trisolve_stream_receive(st, x, status);
 *   trisolve_stream_close(st);
 *
 * A stream belongs to its system: close it before destroying the system. */
TRISOLVE_API int trisolve_stream_open(trisolve_system* sys, trisolve_stream** out);
/* Stages a new coefficient array (names as trisolve_system_update) for the next step: the
 * values are copied here, applied on the server before that step's solve and kept after it. */
TRISOLVE_API int trisolve_stream_update(trisolve_stream* st, const char* name,
                                        const double* values);
TRISOLVE_API int trisolve_stream_update_f32(trisolve_stream* st, const char* name,
                                            const float* values);
/* Sends one step: k >= 1 right-hand sides as in trisolve_system_solve, with the staged updates. */
TRISOLVE_API int trisolve_stream_send(trisolve_stream* st, const double* rhs, int64_t k);
TRISOLVE_API int trisolve_stream_send_f32(trisolve_stream* st, const float* rhs, int64_t k);
/* Receives the answer of the oldest step not yet received: its k solutions into x, statuses
 * into status_out (NULL, or k*batch ints; k for block systems). */
TRISOLVE_API int trisolve_stream_receive(trisolve_stream* st, double* x, int* status_out);
TRISOLVE_API int trisolve_stream_receive_f32(trisolve_stream* st, float* x, int* status_out);
/* Ends the stream (answers not received are dropped) and frees it (NULL is fine); the
 * server's final status: TRISOLVE_OK, or the code of the step that ended the stream. */
TRISOLVE_API int trisolve_stream_close(trisolve_stream* st);

#ifdef __cplusplus
}
#endif

#endif /* TRISOLVE_TRISOLVE_H_ */
