! module trisolve: trisolve's client for Fortran, iso_c_binding over the C API (trisolve.h).
!
!   use trisolve
!   type(trisolve_context) :: ctx
!   type(trisolve_system)  :: sys
!   type(trisolve_stream)  :: st
!   rc = trisolve_create(ctx, '127.0.0.1:50051')          ! or no target: $TRISOLVE_SERVER
!   rc = trisolve_system_create_block(ctx, n, m, aC, cC, bC, cA, cB, sys, tol=1d-10)
!   rc = trisolve_system_solve(sys, f, p)                  ! f, p: (m, n)
!   rc = trisolve_stream_open(sys, st)                     ! or step by step over one stream:
!   rc = trisolve_stream_update(st, 'cC', cC); rc = trisolve_stream_send(st, f)
!   rc = trisolve_stream_receive(st, p);       rc = trisolve_stream_close(st)
!   if (rc /= TRISOLVE_OK) print *, trisolve_last_error(ctx)
!
! Every function returns an integer code: TRISOLVE_OK (0), or the gRPC code of the failure
! (TRISOLVE_INVALID_ARGUMENT = 3, TRISOLVE_NOT_FOUND = 5, ...), or TRISOLVE_NOT_SOLVED (100) when
! a system was not solved (see the optional status argument). trisolve_last_error(ctx) is the
! message, as a Fortran string.
!
! Types and ranks: every call that takes values is generic over real(8) and real(4) (solved in
! that precision on the server; a system keeps the kind it was created with, and a call of the
! other kind is refused), and its arrays may have any rank (they are assumed-rank and contiguous:
! x(n, nbatch), x(n*nbatch), sections, which are copied in and out). Each kind-specific procedure
! is one statement, c_loc of its arrays to its kind's C entry point (a float64 entry point and its
! float32 twin share one interface); defaults and the optional status are handled once, below.
!
! Layouts, column-major callers first (the server cannot tell them apart, so each call says):
!  - tridiagonal and tree batches: x(n, nbatch) (each system a column) is TRISOLVE_FLAT;
!    x(nbatch, n) is TRISOLVE_INTERLEAVED. A tree's parent is parent(n) (one morphology) or
!    parent(n, nbatch) (one per system), integer(c_int32_t), 0-based as the C API's.
!  - dense: A(n, n, nbatch) is TRISOLVE_COL_MAJOR (transposed by the library); TRISOLVE_ROW_MAJOR
!    takes A(j, i, s) = A_s[i][j]. Right-hand sides and x are b(n, nbatch) either way.
!  - block-tridiagonal: every array is X(M, N) (M unknowns of a block row down a column, N block
!    rows), which is the C API's N x M row-major layout. X(k, i) is unknown k of block row i.
!  - gtsv (cuSPARSE gtsv2StridedBatch): system i starts at element i*batch_stride + 1; with
!    x(ld, nbatch) and ld >= m, batch_stride = ld.
! Integers (sizes, counts) are default integers, converted to int64 for the C API.
! A context serves one thread at a time as far as trisolve_last_error is concerned: use one
! context per thread (or OpenMP critical sections) when several threads call.
module trisolve
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer, parameter, public :: TRISOLVE_OK = 0, TRISOLVE_CANCELLED = 1, TRISOLVE_UNKNOWN = 2, &
    TRISOLVE_INVALID_ARGUMENT = 3, TRISOLVE_DEADLINE_EXCEEDED = 4, TRISOLVE_NOT_FOUND = 5, &
    TRISOLVE_ALREADY_EXISTS = 6, TRISOLVE_PERMISSION_DENIED = 7, &
    TRISOLVE_RESOURCE_EXHAUSTED = 8, TRISOLVE_FAILED_PRECONDITION = 9, TRISOLVE_ABORTED = 10, &
    TRISOLVE_OUT_OF_RANGE = 11, TRISOLVE_UNIMPLEMENTED = 12, TRISOLVE_INTERNAL = 13, &
    TRISOLVE_UNAVAILABLE = 14, TRISOLVE_DATA_LOSS = 15, TRISOLVE_UNAUTHENTICATED = 16, &
    TRISOLVE_NOT_SOLVED = 100
  integer, parameter, public :: TRISOLVE_SYSTEM_OK = 0, TRISOLVE_SYSTEM_SINGULAR = 1, &
    TRISOLVE_SYSTEM_NOT_CONVERGED = 2, TRISOLVE_SYSTEM_DIVERGED = 3
  integer, parameter, public :: TRISOLVE_FLAT = 0, TRISOLVE_INTERLEAVED = 1, &
    TRISOLVE_ROW_MAJOR = 2, TRISOLVE_COL_MAJOR = 3

  ! A connection to one server (trisolve_create / trisolve_destroy).
  type, public :: trisolve_context
    type(c_ptr) :: ptr = c_null_ptr
  end type
  ! A persistent system on the server (trisolve_system_create_* / trisolve_system_destroy).
  type, public :: trisolve_system
    type(c_ptr) :: ptr = c_null_ptr
  end type
  ! The time-step stream of one system (trisolve_stream_open / trisolve_stream_close).
  type, public :: trisolve_stream
    type(c_ptr) :: ptr = c_null_ptr
  end type

  public :: trisolve_create, trisolve_destroy, trisolve_last_error, trisolve_code_name, &
    trisolve_set_timeout, trisolve_gtsv_strided_batch, trisolve_dgtsv_strided_batch, &
    trisolve_sgtsv_strided_batch, trisolve_solve_tridiagonal, trisolve_solve_tree, &
    trisolve_solve_block, trisolve_solve_dense, trisolve_system_create_tridiagonal, &
    trisolve_system_create_tree, trisolve_system_create_block, trisolve_system_create_dense, &
    trisolve_system_create_tridiagonal_variable, trisolve_system_create_tree_variable, &
    trisolve_system_solve, trisolve_system_update, trisolve_system_release, &
    trisolve_system_destroy, trisolve_system_handle, trisolve_system_last_summary, &
    trisolve_stream_open, trisolve_stream_update, trisolve_stream_send, &
    trisolve_stream_receive, trisolve_stream_close, trisolve_set_progress, &
    trisolve_set_residual_history, trisolve_residual_history

  ! Phases of a progress report (trisolve_set_progress).
  integer, parameter, public :: TRISOLVE_PHASE_RECEIVED = 1, TRISOLVE_PHASE_QUEUED = 2, &
    TRISOLVE_PHASE_SOLVING = 3, TRISOLVE_PHASE_SENDING = 4

  ! What a progress callback looks like: a bind(c) procedure, called on the solving thread as
  ! the server reports; residual is NaN before the first check.
  abstract interface
    subroutine trisolve_progress_fn(user_data, phase, iteration, max_iterations, residual, &
                                    bytes_total, elapsed_s) bind(c)
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: user_data
      integer(c_int), value :: phase
      integer(c_int64_t), value :: iteration, max_iterations, bytes_total
      real(c_double), value :: residual, elapsed_s
    end subroutine
  end interface

  ! ---- The generic names: one specific procedure per kind, any rank ----
  interface trisolve_gtsv_strided_batch
    module procedure trisolve_dgtsv_strided_batch, trisolve_sgtsv_strided_batch
  end interface
  interface trisolve_solve_tridiagonal
    module procedure solve_tridiagonal_r8, solve_tridiagonal_r4
  end interface
  interface trisolve_solve_tree
    module procedure solve_tree_r8, solve_tree_r4
  end interface
  interface trisolve_solve_block
    module procedure solve_block_r8, solve_block_r4
  end interface
  interface trisolve_solve_dense
    module procedure solve_dense_r8, solve_dense_r4
  end interface
  interface trisolve_system_create_tridiagonal
    module procedure create_tridiagonal_r8, create_tridiagonal_r4
  end interface
  interface trisolve_system_create_tree
    module procedure create_tree_r8, create_tree_r4
  end interface
  interface trisolve_system_create_tridiagonal_variable
    module procedure create_tridiagonal_variable_r8, create_tridiagonal_variable_r4
  end interface
  interface trisolve_system_create_tree_variable
    module procedure create_tree_variable_r8, create_tree_variable_r4
  end interface
  interface trisolve_system_create_block
    module procedure create_block_r8, create_block_r4
  end interface
  interface trisolve_system_create_dense
    module procedure create_dense_r8, create_dense_r4
  end interface
  interface trisolve_system_solve
    module procedure system_solve_r8, system_solve_r4
  end interface
  interface trisolve_system_update
    module procedure system_update_r8, system_update_r4
  end interface
  interface trisolve_stream_update
    module procedure stream_update_r8, stream_update_r4
  end interface
  interface trisolve_stream_send
    module procedure stream_send_r8, stream_send_r4
  end interface
  interface trisolve_stream_receive
    module procedure stream_receive_r8, stream_receive_r4
  end interface

  ! ---- The C API. Arrays travel as c_loc addresses, so a float64 entry point and its float32
  ! twin share one interface; the kind-agnostic bodies below pick the entry point. ----
  abstract interface
    integer(c_int) function gtsv_fn(ctx, m, dl, d, du, x, batch, stride, status) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, dl, d, du, x, status
      integer(c_int64_t), value :: m, batch, stride
    end function
    integer(c_int) function solve_tridiagonal_fn(ctx, n, batch, a, b, c, d, x, layout, &
                                                 status) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, a, b, c, d, x, status
      integer(c_int64_t), value :: n, batch
      integer(c_int), value :: layout
    end function
    integer(c_int) function solve_tree_fn(ctx, n, batch, parent, parent_systems, lower, upper, &
                                          diag, rhs, x, layout, status) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, parent, lower, upper, diag, rhs, x, status
      integer(c_int64_t), value :: n, batch, parent_systems
      integer(c_int), value :: layout
    end function
    integer(c_int) function solve_block_fn(ctx, nn, mm, aC, cC, bC, cA, cB, f, y, tol, max_it, &
                                           status) bind(c)
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: ctx, aC, cC, bC, cA, cB, f, y, status
      integer(c_int64_t), value :: nn, mm, max_it
      real(c_double), value :: tol
    end function
    integer(c_int) function solve_dense_fn(ctx, n, batch, A, b, x, layout, status) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, A, b, x, status
      integer(c_int64_t), value :: n, batch
      integer(c_int), value :: layout
    end function
    integer(c_int) function create_tridiagonal_fn(ctx, n, batch, a, b, c, layout, out) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, a, b, c
      integer(c_int64_t), value :: n, batch
      integer(c_int), value :: layout
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function create_tree_fn(ctx, n, batch, parent, parent_systems, lower, upper, &
                                           diag, layout, out) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, parent, lower, upper, diag
      integer(c_int64_t), value :: n, batch, parent_systems
      integer(c_int), value :: layout
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function create_tridiagonal_variable_fn(ctx, systems, lengths, total, a, b, &
                                                           c, out) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, lengths, a, b, c
      integer(c_int64_t), value :: systems, total
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function create_tree_variable_fn(ctx, cells, lengths, total, parent, lower, &
                                                    upper, diag, out) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, lengths, parent, lower, upper, diag
      integer(c_int64_t), value :: cells, total
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function create_block_fn(ctx, nn, mm, aC, cC, bC, cA, cB, tol, max_it, out) &
        bind(c)
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: ctx, aC, cC, bC, cA, cB
      integer(c_int64_t), value :: nn, mm, max_it
      real(c_double), value :: tol
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function create_dense_fn(ctx, n, batch, A, layout, out) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: ctx, A
      integer(c_int64_t), value :: n, batch
      integer(c_int), value :: layout
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function solve_fn(sys, rhs, k, x, status) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: sys, rhs, x, status
      integer(c_int64_t), value :: k
    end function
    integer(c_int) function update_fn(obj, name, values) bind(c)
      import :: c_ptr, c_int, c_char
      type(c_ptr), value :: obj, values
      character(kind=c_char), dimension(*), intent(in) :: name
    end function
    integer(c_int) function send_fn(st, rhs, k) bind(c)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: st, rhs
      integer(c_int64_t), value :: k
    end function
    integer(c_int) function receive_fn(st, x, status) bind(c)
      import :: c_ptr, c_int
      type(c_ptr), value :: st, x, status
    end function
  end interface

  procedure(gtsv_fn), bind(c, name='trisolve_gtsv_strided_batch') :: c_gtsv
  procedure(gtsv_fn), bind(c, name='trisolve_sgtsv_strided_batch') :: c_sgtsv
  procedure(solve_tridiagonal_fn), bind(c, name='trisolve_solve_tridiagonal') :: c_solve_tri
  procedure(solve_tridiagonal_fn), bind(c, name='trisolve_solve_tridiagonal_f32') :: &
    c_solve_tri_f32
  procedure(solve_tree_fn), bind(c, name='trisolve_solve_tree') :: c_solve_tree
  procedure(solve_tree_fn), bind(c, name='trisolve_solve_tree_f32') :: c_solve_tree_f32
  procedure(solve_block_fn), bind(c, name='trisolve_solve_block') :: c_solve_block
  procedure(solve_block_fn), bind(c, name='trisolve_solve_block_f32') :: c_solve_block_f32
  procedure(solve_dense_fn), bind(c, name='trisolve_solve_dense') :: c_solve_dense
  procedure(solve_dense_fn), bind(c, name='trisolve_solve_dense_f32') :: c_solve_dense_f32
  procedure(create_tridiagonal_fn), bind(c, name='trisolve_system_create_tridiagonal') :: &
    c_create_tri
  procedure(create_tridiagonal_fn), bind(c, name='trisolve_system_create_tridiagonal_f32') :: &
    c_create_tri_f32
  procedure(create_tree_fn), bind(c, name='trisolve_system_create_tree') :: c_create_tree
  procedure(create_tree_fn), bind(c, name='trisolve_system_create_tree_f32') :: c_create_tree_f32
  procedure(create_tridiagonal_variable_fn), &
    bind(c, name='trisolve_system_create_tridiagonal_variable') :: c_create_tri_var
  procedure(create_tridiagonal_variable_fn), &
    bind(c, name='trisolve_system_create_tridiagonal_variable_f32') :: c_create_tri_var_f32
  procedure(create_tree_variable_fn), bind(c, name='trisolve_system_create_tree_variable') :: &
    c_create_tree_var
  procedure(create_tree_variable_fn), &
    bind(c, name='trisolve_system_create_tree_variable_f32') :: c_create_tree_var_f32
  procedure(create_block_fn), bind(c, name='trisolve_system_create_block') :: c_create_block
  procedure(create_block_fn), bind(c, name='trisolve_system_create_block_f32') :: &
    c_create_block_f32
  procedure(create_dense_fn), bind(c, name='trisolve_system_create_dense') :: c_create_dense
  procedure(create_dense_fn), bind(c, name='trisolve_system_create_dense_f32') :: &
    c_create_dense_f32
  procedure(solve_fn), bind(c, name='trisolve_system_solve') :: c_system_solve
  procedure(solve_fn), bind(c, name='trisolve_system_solve_f32') :: c_system_solve_f32
  procedure(update_fn), bind(c, name='trisolve_system_update') :: c_system_update
  procedure(update_fn), bind(c, name='trisolve_system_update_f32') :: c_system_update_f32
  procedure(update_fn), bind(c, name='trisolve_stream_update') :: c_stream_update
  procedure(update_fn), bind(c, name='trisolve_stream_update_f32') :: c_stream_update_f32
  procedure(send_fn), bind(c, name='trisolve_stream_send') :: c_stream_send
  procedure(send_fn), bind(c, name='trisolve_stream_send_f32') :: c_stream_send_f32
  procedure(receive_fn), bind(c, name='trisolve_stream_receive') :: c_stream_receive
  procedure(receive_fn), bind(c, name='trisolve_stream_receive_f32') :: c_stream_receive_f32

  interface
    integer(c_int) function c_create(target, token, out) bind(c, name='trisolve_create')
      import :: c_int, c_char, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: target, token
      type(c_ptr), intent(out) :: out
    end function
    subroutine c_destroy(ctx) bind(c, name='trisolve_destroy')
      import :: c_ptr
      type(c_ptr), value :: ctx
    end subroutine
    type(c_ptr) function c_last_error(ctx) bind(c, name='trisolve_last_error')
      import :: c_ptr
      type(c_ptr), value :: ctx
    end function
    type(c_ptr) function c_code_name(code) bind(c, name='trisolve_code_name')
      import :: c_ptr, c_int
      integer(c_int), value :: code
    end function
    integer(c_int) function c_set_timeout(ctx, seconds) bind(c, name='trisolve_set_timeout')
      import :: c_ptr, c_int, c_double
      type(c_ptr), value :: ctx
      real(c_double), value :: seconds
    end function
    integer(c_int) function c_set_progress(ctx, fn, user_data, interval_s) &
        bind(c, name='trisolve_set_progress')
      import :: c_ptr, c_int, c_double, c_funptr
      type(c_ptr), value :: ctx
      type(c_funptr), value :: fn
      type(c_ptr), value :: user_data
      real(c_double), value :: interval_s
    end function
    integer(c_int) function c_set_residual_history(ctx, on) &
        bind(c, name='trisolve_set_residual_history')
      import :: c_ptr, c_int
      type(c_ptr), value :: ctx
      integer(c_int), value :: on
    end function
    integer(c_int64_t) function c_residual_history(ctx, iterations, residuals, capacity) &
        bind(c, name='trisolve_residual_history')
      import :: c_ptr, c_int64_t
      type(c_ptr), value :: ctx, iterations, residuals
      integer(c_int64_t), value :: capacity
    end function
    integer(c_int) function c_release(sys) bind(c, name='trisolve_system_release')
      import :: c_ptr, c_int
      type(c_ptr), value :: sys
    end function
    subroutine c_system_destroy(sys) bind(c, name='trisolve_system_destroy')
      import :: c_ptr
      type(c_ptr), value :: sys
    end subroutine
    type(c_ptr) function c_system_handle(sys) bind(c, name='trisolve_system_handle')
      import :: c_ptr
      type(c_ptr), value :: sys
    end function
    integer(c_int) function c_last_summary(sys, residual, iterations, method) &
        bind(c, name='trisolve_system_last_summary')
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: sys
      real(c_double), intent(out) :: residual
      integer(c_int64_t), intent(out) :: iterations
      type(c_ptr), value :: method
    end function
    integer(c_int) function c_stream_open(sys, out) bind(c, name='trisolve_stream_open')
      import :: c_ptr, c_int
      type(c_ptr), value :: sys
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_stream_close(st) bind(c, name='trisolve_stream_close')
      import :: c_ptr, c_int
      type(c_ptr), value :: st
    end function
    integer(c_size_t) function c_strlen(s) bind(c, name='strlen')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
    end function
  end interface

contains

  ! ---- Helpers ----

  ! A C string (NUL-terminated, owned by the library) as a Fortran string.
  function from_c(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function

  ! The address of an optional status array, or NULL.
  type(c_ptr) function status_ptr(status)
    integer(c_int), intent(in), optional, target, contiguous :: status(..)
    status_ptr = c_null_ptr
    if (present(status)) status_ptr = c_loc(status)
  end function

  ! One morphology (size(parent) = n) or one per system (n*nbatch): the C API's parent_systems.
  integer(c_int64_t) function parent_systems(parent, n)
    integer(c_int32_t), intent(in) :: parent(..)
    integer, intent(in) :: n
    parent_systems = int(size(parent), c_int64_t) / max(int(n, c_int64_t), 1_c_int64_t)
  end function

  integer(c_int64_t) function i64(v)
    integer, intent(in) :: v
    i64 = int(v, c_int64_t)
  end function

  ! ---- Contexts ----

  ! Connects to target ("host:port"; absent or blank: $TRISOLVE_SERVER, else 127.0.0.1:50051),
  ! with an optional bearer token. Lazily: an unreachable server shows at the first call.
  integer function trisolve_create(ctx, target, token) result(rc)
    type(trisolve_context), intent(out) :: ctx
    character(len=*), intent(in), optional :: target, token
    character(len=:), allocatable :: t, k
    t = c_null_char
    k = c_null_char
    if (present(target)) t = trim(target) // c_null_char
    if (present(token)) k = trim(token) // c_null_char
    rc = int(c_create(t, k, ctx%ptr))
  end function

  subroutine trisolve_destroy(ctx)
    type(trisolve_context), intent(inout) :: ctx
    call c_destroy(ctx%ptr)
    ctx%ptr = c_null_ptr
  end subroutine

  ! The message of the last failed call on ctx (without ctx: of the last failed trisolve_create).
  function trisolve_last_error(ctx) result(msg)
    type(trisolve_context), intent(in), optional :: ctx
    character(len=:), allocatable :: msg
    if (present(ctx)) then
      msg = from_c(c_last_error(ctx%ptr))
    else
      msg = from_c(c_last_error(c_null_ptr))
    end if
  end function

  ! "OK", "INVALID_ARGUMENT", ..., "NOT_SOLVED".
  function trisolve_code_name(code) result(name)
    integer, intent(in) :: code
    character(len=:), allocatable :: name
    name = from_c(c_code_name(int(code, c_int)))
  end function

  ! The deadline of every later call on ctx, in seconds (0: none).
  integer function trisolve_set_timeout(ctx, seconds) result(rc)
    type(trisolve_context), intent(in) :: ctx
    real(c_double), intent(in) :: seconds
    rc = int(c_set_timeout(ctx%ptr, seconds))
  end function

  ! Every later one-shot solve on ctx calls fn(user_data, phase, iteration, max_iterations,
  ! residual, bytes_total, elapsed_s) as the server reports, at most once every interval_s
  ! seconds (absent or 0: 0.1 s); fn absent: off. fn may not stop the solve.
  integer function trisolve_set_progress(ctx, fn, user_data, interval_s) result(rc)
    type(trisolve_context), intent(in) :: ctx
    procedure(trisolve_progress_fn), optional :: fn
    type(c_ptr), intent(in), optional :: user_data
    real(c_double), intent(in), optional :: interval_s
    type(c_funptr) :: f
    type(c_ptr) :: u
    real(c_double) :: every
    f = c_null_funptr
    u = c_null_ptr
    every = 0
    if (present(fn)) f = c_funloc(fn)
    if (present(user_data)) u = user_data
    if (present(interval_s)) every = interval_s
    rc = int(c_set_progress(ctx%ptr, f, u, every))
  end function

  ! on: later block solves on ctx keep their residual history (at most 1024 points).
  integer function trisolve_set_residual_history(ctx, on) result(rc)
    type(trisolve_context), intent(in) :: ctx
    logical, intent(in) :: on
    rc = int(c_set_residual_history(ctx%ptr, merge(1_c_int, 0_c_int, on)))
  end function

  ! The history of the last block solve on ctx: the number of points it holds (0: none kept);
  ! copies as many as fit into iterations(:) and residuals(:), when given.
  integer function trisolve_residual_history(ctx, iterations, residuals) result(points)
    type(trisolve_context), intent(in) :: ctx
    integer(c_int64_t), intent(out), optional, target, contiguous :: iterations(:)
    real(c_double), intent(out), optional, target, contiguous :: residuals(:)
    type(c_ptr) :: pi, pr
    integer(c_int64_t) :: capacity
    pi = c_null_ptr
    pr = c_null_ptr
    capacity = 0
    if (present(iterations) .and. present(residuals)) then
      capacity = min(size(iterations, kind=c_int64_t), size(residuals, kind=c_int64_t))
      if (capacity > 0) then
        pi = c_loc(iterations)
        pr = c_loc(residuals)
      end if
    end if
    points = int(c_residual_history(ctx%ptr, pi, pr, capacity))
  end function

  ! ---- cuSPARSE gtsv2StridedBatch: nbatch systems of order m, system i at element
  ! i*batch_stride + 1 of dl, d, du, x (batch_stride >= m); dl(1) and du(m) of each system are
  ! not used. x: in, the right-hand sides; out, the solutions. status: nbatch statuses. ----

  integer function trisolve_dgtsv_strided_batch(ctx, m, dl, d, du, x, nbatch, batch_stride, &
                                                status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_double), intent(in), target, contiguous :: dl(..), d(..), du(..)
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_gtsv(ctx%ptr, i64(m), c_loc(dl), c_loc(d), c_loc(du), c_loc(x), i64(nbatch), &
                i64(batch_stride), status_ptr(status))
  end function
  integer function trisolve_sgtsv_strided_batch(ctx, m, dl, d, du, x, nbatch, batch_stride, &
                                                status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_float), intent(in), target, contiguous :: dl(..), d(..), du(..)
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_sgtsv(ctx%ptr, i64(m), c_loc(dl), c_loc(d), c_loc(du), c_loc(x), i64(nbatch), &
                 i64(batch_stride), status_ptr(status))
  end function

  ! ---- One-shot solves. x has the right-hand side's shape; status: nbatch statuses (1 for
  ! the block family). ----

  ! nbatch tridiagonal systems of order n: a (sub), b (main), c (super diagonal), d and x in
  ! `layout` (TRISOLVE_FLAT: (n, nbatch); TRISOLVE_INTERLEAVED: (nbatch, n)).
  integer function solve_tridiagonal_r8(ctx, n, nbatch, a, b, c, d, x, layout, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_double), intent(in), target, contiguous :: a(..), b(..), c(..), d(..)
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_tri(ctx%ptr, i64(n), i64(nbatch), c_loc(a), c_loc(b), c_loc(c), c_loc(d), &
                     c_loc(x), int(layout, c_int), status_ptr(status))
  end function
  integer function solve_tridiagonal_r4(ctx, n, nbatch, a, b, c, d, x, layout, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_float), intent(in), target, contiguous :: a(..), b(..), c(..), d(..)
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_tri_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(a), c_loc(b), c_loc(c), c_loc(d), &
                         c_loc(x), int(layout, c_int), status_ptr(status))
  end function

  ! nbatch tree (Hines) systems of n nodes: parent(n) or parent(n, nbatch), 0-based, -1 at the
  ! root; lower, upper, diag, rhs, x in `layout`.
  integer function solve_tree_r8(ctx, n, nbatch, parent, lower, upper, diag, rhs, x, layout, &
                                 status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    integer(c_int32_t), intent(in), target, contiguous :: parent(..)
    real(c_double), intent(in), target, contiguous :: lower(..), upper(..), diag(..), rhs(..)
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_tree(ctx%ptr, i64(n), i64(nbatch), c_loc(parent), parent_systems(parent, n), &
                      c_loc(lower), c_loc(upper), c_loc(diag), c_loc(rhs), c_loc(x), &
                      int(layout, c_int), status_ptr(status))
  end function
  integer function solve_tree_r4(ctx, n, nbatch, parent, lower, upper, diag, rhs, x, layout, &
                                 status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    integer(c_int32_t), intent(in), target, contiguous :: parent(..)
    real(c_float), intent(in), target, contiguous :: lower(..), upper(..), diag(..), rhs(..)
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_tree_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(parent), parent_systems(parent, n), &
                          c_loc(lower), c_loc(upper), c_loc(diag), c_loc(rhs), c_loc(x), &
                          int(layout, c_int), status_ptr(status))
  end function

  ! A block-tridiagonal system (arrays (m, nblocks), as trisolve_system_create_block) with its
  ! right-hand side f, solved into y.
  integer function solve_block_r8(ctx, nblocks, m, aC, cC, bC, cA, cB, f, y, status, tol, &
                                  max_iterations) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: nblocks, m
    real(c_double), intent(in), target, contiguous :: aC(..), cC(..), bC(..), cA(..), cB(..), f(..)
    real(c_double), intent(inout), target, contiguous :: y(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    real(c_double), intent(in), optional :: tol
    integer, intent(in), optional :: max_iterations
    rc = c_solve_block(ctx%ptr, i64(nblocks), i64(m), c_loc(aC), c_loc(cC), c_loc(bC), &
                       c_loc(cA), c_loc(cB), c_loc(f), c_loc(y), tol_or_default(tol), &
                       iterations_or_default(max_iterations), status_ptr(status))
  end function
  integer function solve_block_r4(ctx, nblocks, m, aC, cC, bC, cA, cB, f, y, status, tol, &
                                  max_iterations) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: nblocks, m
    real(c_float), intent(in), target, contiguous :: aC(..), cC(..), bC(..), cA(..), cB(..), f(..)
    real(c_float), intent(inout), target, contiguous :: y(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    real(c_double), intent(in), optional :: tol
    integer, intent(in), optional :: max_iterations
    rc = c_solve_block_f32(ctx%ptr, i64(nblocks), i64(m), c_loc(aC), c_loc(cC), c_loc(bC), &
                           c_loc(cA), c_loc(cB), c_loc(f), c_loc(y), tol_or_default(tol), &
                           iterations_or_default(max_iterations), status_ptr(status))
  end function

  ! nbatch dense systems A x = b of order n: A(n, n, nbatch) with TRISOLVE_COL_MAJOR (or the
  ! transposes with TRISOLVE_ROW_MAJOR), b and x (n, nbatch).
  integer function solve_dense_r8(ctx, n, nbatch, A, b, x, layout, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_double), intent(in), target, contiguous :: A(..), b(..)
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_dense(ctx%ptr, i64(n), i64(nbatch), c_loc(A), c_loc(b), c_loc(x), &
                       int(layout, c_int), status_ptr(status))
  end function
  integer function solve_dense_r4(ctx, n, nbatch, A, b, x, layout, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_float), intent(in), target, contiguous :: A(..), b(..)
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_solve_dense_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(A), c_loc(b), c_loc(x), &
                           int(layout, c_int), status_ptr(status))
  end function

  ! ---- Persistent systems: the coefficients once, then right-hand sides by handle ----

  ! nbatch tridiagonal systems of order n, arrays in `layout` as trisolve_solve_tridiagonal.
  integer function create_tridiagonal_r8(ctx, n, nbatch, a, b, c, layout, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_double), intent(in), target, contiguous :: a(..), b(..), c(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tri(ctx%ptr, i64(n), i64(nbatch), c_loc(a), c_loc(b), c_loc(c), &
                      int(layout, c_int), sys%ptr)
  end function
  integer function create_tridiagonal_r4(ctx, n, nbatch, a, b, c, layout, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_float), intent(in), target, contiguous :: a(..), b(..), c(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tri_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(a), c_loc(b), c_loc(c), &
                          int(layout, c_int), sys%ptr)
  end function

  ! nbatch tree systems, arrays as trisolve_solve_tree (the parent array cannot be updated).
  integer function create_tree_r8(ctx, n, nbatch, parent, lower, upper, diag, layout, sys) &
      result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    integer(c_int32_t), intent(in), target, contiguous :: parent(..)
    real(c_double), intent(in), target, contiguous :: lower(..), upper(..), diag(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tree(ctx%ptr, i64(n), i64(nbatch), c_loc(parent), parent_systems(parent, n), &
                       c_loc(lower), c_loc(upper), c_loc(diag), int(layout, c_int), sys%ptr)
  end function
  integer function create_tree_r4(ctx, n, nbatch, parent, lower, upper, diag, layout, sys) &
      result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    integer(c_int32_t), intent(in), target, contiguous :: parent(..)
    real(c_float), intent(in), target, contiguous :: lower(..), upper(..), diag(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tree_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(parent), &
                           parent_systems(parent, n), c_loc(lower), c_loc(upper), c_loc(diag), &
                           int(layout, c_int), sys%ptr)
  end function

  ! Systems of different sizes: size(lengths) tridiagonal systems of lengths(s) rows each, a, b
  ! and c their rows one system after the other (sum(lengths) values). A solve takes k
  ! right-hand sides of sum(lengths) values and answers k * size(lengths) statuses.
  integer function create_tridiagonal_variable_r8(ctx, lengths, a, b, c, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer(c_int32_t), intent(in), target, contiguous :: lengths(:)
    real(c_double), intent(in), target, contiguous :: a(:), b(:), c(:)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tri_var(ctx%ptr, size(lengths, kind=c_int64_t), c_loc(lengths), &
                          size(a, kind=c_int64_t), c_loc(a), c_loc(b), c_loc(c), sys%ptr)
  end function
  integer function create_tridiagonal_variable_r4(ctx, lengths, a, b, c, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer(c_int32_t), intent(in), target, contiguous :: lengths(:)
    real(c_float), intent(in), target, contiguous :: a(:), b(:), c(:)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tri_var_f32(ctx%ptr, size(lengths, kind=c_int64_t), c_loc(lengths), &
                              size(a, kind=c_int64_t), c_loc(a), c_loc(b), c_loc(c), sys%ptr)
  end function

  ! Tree cells of different sizes: size(lengths) cells, every array their nodes one cell after
  ! the other; a cell's parent values count from its own root (parent -1 at its node 0, in C
  ! numbering). Solves as the variable tridiagonal systems'.
  integer function create_tree_variable_r8(ctx, lengths, parent, lower, upper, diag, sys) &
      result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer(c_int32_t), intent(in), target, contiguous :: lengths(:), parent(:)
    real(c_double), intent(in), target, contiguous :: lower(:), upper(:), diag(:)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tree_var(ctx%ptr, size(lengths, kind=c_int64_t), c_loc(lengths), &
                           size(parent, kind=c_int64_t), c_loc(parent), c_loc(lower), &
                           c_loc(upper), c_loc(diag), sys%ptr)
  end function
  integer function create_tree_variable_r4(ctx, lengths, parent, lower, upper, diag, sys) &
      result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer(c_int32_t), intent(in), target, contiguous :: lengths(:), parent(:)
    real(c_float), intent(in), target, contiguous :: lower(:), upper(:), diag(:)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_tree_var_f32(ctx%ptr, size(lengths, kind=c_int64_t), c_loc(lengths), &
                               size(parent, kind=c_int64_t), c_loc(parent), c_loc(lower), &
                               c_loc(upper), c_loc(diag), sys%ptr)
  end function

  ! A block-tridiagonal system: nblocks block rows of order m, every array (m, nblocks). Block
  ! row i: diag(cA(:,i)) Y(:,i-1) + C_i Y(:,i) + diag(cB(:,i)) Y(:,i+1) = F(:,i), C_i
  ! tridiagonal with aC(:,i) below, cC(:,i) on and bC(:,i) above the diagonal. tol: relative
  ! residual to reach (absent: the server's default, 1e-10 in real(8), 1e-5 in real(4); 0:
  ! exactly max_iterations sweeps); max_iterations: absent for the server's default (1000).
  integer function create_block_r8(ctx, nblocks, m, aC, cC, bC, cA, cB, sys, tol, &
                                   max_iterations) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: nblocks, m
    real(c_double), intent(in), target, contiguous :: aC(..), cC(..), bC(..), cA(..), cB(..)
    type(trisolve_system), intent(out) :: sys
    real(c_double), intent(in), optional :: tol
    integer, intent(in), optional :: max_iterations
    rc = c_create_block(ctx%ptr, i64(nblocks), i64(m), c_loc(aC), c_loc(cC), c_loc(bC), &
                        c_loc(cA), c_loc(cB), tol_or_default(tol), &
                        iterations_or_default(max_iterations), sys%ptr)
  end function
  integer function create_block_r4(ctx, nblocks, m, aC, cC, bC, cA, cB, sys, tol, &
                                   max_iterations) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: nblocks, m
    real(c_float), intent(in), target, contiguous :: aC(..), cC(..), bC(..), cA(..), cB(..)
    type(trisolve_system), intent(out) :: sys
    real(c_double), intent(in), optional :: tol
    integer, intent(in), optional :: max_iterations
    rc = c_create_block_f32(ctx%ptr, i64(nblocks), i64(m), c_loc(aC), c_loc(cC), c_loc(bC), &
                            c_loc(cA), c_loc(cB), tol_or_default(tol), &
                            iterations_or_default(max_iterations), sys%ptr)
  end function

  real(c_double) function tol_or_default(tol)
    real(c_double), intent(in), optional :: tol
    tol_or_default = -1
    if (present(tol)) tol_or_default = tol
  end function
  integer(c_int64_t) function iterations_or_default(max_iterations)
    integer, intent(in), optional :: max_iterations
    iterations_or_default = 0
    if (present(max_iterations)) iterations_or_default = i64(max_iterations)
  end function

  ! nbatch dense matrices of order n, A(n, n, nbatch) in `layout` as trisolve_solve_dense.
  integer function create_dense_r8(ctx, n, nbatch, A, layout, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_double), intent(in), target, contiguous :: A(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_dense(ctx%ptr, i64(n), i64(nbatch), c_loc(A), int(layout, c_int), sys%ptr)
  end function
  integer function create_dense_r4(ctx, n, nbatch, A, layout, sys) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_float), intent(in), target, contiguous :: A(..)
    type(trisolve_system), intent(out) :: sys
    rc = c_create_dense_f32(ctx%ptr, i64(n), i64(nbatch), c_loc(A), int(layout, c_int), sys%ptr)
  end function

  ! Solves k right-hand sides (default 1) stored one after the other in rhs, each in the
  ! system's shape, into x (the same shape; x may not alias rhs in Fortran). status: k*nbatch
  ! (k for the block family) statuses.
  integer function system_solve_r8(sys, rhs, x, k, status) result(rc)
    type(trisolve_system), intent(in) :: sys
    real(c_double), intent(in), target, contiguous :: rhs(..)
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer, intent(in), optional :: k
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_system_solve(sys%ptr, c_loc(rhs), count_or_one(k), c_loc(x), status_ptr(status))
  end function
  integer function system_solve_r4(sys, rhs, x, k, status) result(rc)
    type(trisolve_system), intent(in) :: sys
    real(c_float), intent(in), target, contiguous :: rhs(..)
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer, intent(in), optional :: k
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_system_solve_f32(sys%ptr, c_loc(rhs), count_or_one(k), c_loc(x), status_ptr(status))
  end function

  integer(c_int64_t) function count_or_one(k)
    integer, intent(in), optional :: k
    count_or_one = 1
    if (present(k)) count_or_one = i64(k)
  end function

  ! Replaces one coefficient array by name ('a', 'b', 'c'; 'lower', 'upper', 'diag'; 'A';
  ! 'aC', 'cC', 'bC', 'cA', 'cB'), in the system's shape and layout.
  integer function system_update_r8(sys, name, values) result(rc)
    type(trisolve_system), intent(in) :: sys
    character(len=*), intent(in) :: name
    real(c_double), intent(in), target, contiguous :: values(..)
    rc = c_system_update(sys%ptr, trim(name) // c_null_char, c_loc(values))
  end function
  integer function system_update_r4(sys, name, values) result(rc)
    type(trisolve_system), intent(in) :: sys
    character(len=*), intent(in) :: name
    real(c_float), intent(in), target, contiguous :: values(..)
    rc = c_system_update_f32(sys%ptr, trim(name) // c_null_char, c_loc(values))
  end function

  ! Frees the system on the server; later solves give TRISOLVE_NOT_FOUND. sys stays allocated
  ! until trisolve_system_destroy.
  integer function trisolve_system_release(sys) result(rc)
    type(trisolve_system), intent(in) :: sys
    rc = int(c_release(sys%ptr))
  end function

  ! Releases the system if still held and frees sys.
  subroutine trisolve_system_destroy(sys)
    type(trisolve_system), intent(inout) :: sys
    call c_system_destroy(sys%ptr)
    sys%ptr = c_null_ptr
  end subroutine

  function trisolve_system_handle(sys) result(handle)
    type(trisolve_system), intent(in) :: sys
    character(len=:), allocatable :: handle
    handle = from_c(c_system_handle(sys%ptr))
  end function

  ! The server's relative residual and iterations of the last solve on sys.
  integer function trisolve_system_last_summary(sys, residual, iterations) result(rc)
    type(trisolve_system), intent(in) :: sys
    real(c_double), intent(out) :: residual
    integer, intent(out), optional :: iterations
    integer(c_int64_t) :: it
    rc = int(c_last_summary(sys%ptr, residual, it, c_null_ptr))
    if (present(iterations)) iterations = int(it)
  end function

  ! ---- The time-step stream: steps sent (ahead if wished), answers received in order ----

  integer function trisolve_stream_open(sys, st) result(rc)
    type(trisolve_system), intent(in) :: sys
    type(trisolve_stream), intent(out) :: st
    rc = c_stream_open(sys%ptr, st%ptr)
  end function

  ! Stages a coefficient array for the next step (copied now; kept by the system after it).
  integer function stream_update_r8(st, name, values) result(rc)
    type(trisolve_stream), intent(in) :: st
    character(len=*), intent(in) :: name
    real(c_double), intent(in), target, contiguous :: values(..)
    rc = c_stream_update(st%ptr, trim(name) // c_null_char, c_loc(values))
  end function
  integer function stream_update_r4(st, name, values) result(rc)
    type(trisolve_stream), intent(in) :: st
    character(len=*), intent(in) :: name
    real(c_float), intent(in), target, contiguous :: values(..)
    rc = c_stream_update_f32(st%ptr, trim(name) // c_null_char, c_loc(values))
  end function

  ! Sends a step of k right-hand sides (default 1) with the staged updates.
  integer function stream_send_r8(st, rhs, k) result(rc)
    type(trisolve_stream), intent(in) :: st
    real(c_double), intent(in), target, contiguous :: rhs(..)
    integer, intent(in), optional :: k
    rc = c_stream_send(st%ptr, c_loc(rhs), count_or_one(k))
  end function
  integer function stream_send_r4(st, rhs, k) result(rc)
    type(trisolve_stream), intent(in) :: st
    real(c_float), intent(in), target, contiguous :: rhs(..)
    integer, intent(in), optional :: k
    rc = c_stream_send_f32(st%ptr, c_loc(rhs), count_or_one(k))
  end function

  ! The answer of the oldest step not yet received.
  integer function stream_receive_r8(st, x, status) result(rc)
    type(trisolve_stream), intent(in) :: st
    real(c_double), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_stream_receive(st%ptr, c_loc(x), status_ptr(status))
  end function
  integer function stream_receive_r4(st, x, status) result(rc)
    type(trisolve_stream), intent(in) :: st
    real(c_float), intent(inout), target, contiguous :: x(..)
    integer(c_int), intent(out), optional, target, contiguous :: status(..)
    rc = c_stream_receive_f32(st%ptr, c_loc(x), status_ptr(status))
  end function

  ! Ends the stream and frees it: the server's final status.
  integer function trisolve_stream_close(st) result(rc)
    type(trisolve_stream), intent(inout) :: st
    rc = c_stream_close(st%ptr)
    st%ptr = c_null_ptr
  end function

end module trisolve
