! module trisolve: trisolve's client for Fortran, iso_c_binding over the C API (trisolve.h).
!
!   use trisolve
!   type(trisolve_context) :: ctx
!   type(trisolve_system)  :: sys
!   rc = trisolve_create(ctx, '127.0.0.1:50051')          ! or no target: $TRISOLVE_SERVER
!   rc = trisolve_system_create_block(ctx, n, m, aC, cC, bC, cA, cB, sys, tol=1d-10)
!   rc = trisolve_system_solve(sys, f, p)                  ! f, p: real(8) (m, n)
!   if (rc /= TRISOLVE_OK) print *, trisolve_last_error(ctx)
!
! Every function returns an integer code: TRISOLVE_OK (0), or the gRPC code of the failure
! (TRISOLVE_INVALID_ARGUMENT = 3, TRISOLVE_NOT_FOUND = 5, ...), or TRISOLVE_NOT_SOLVED (100) when
! a system was not solved (see the optional status argument). trisolve_last_error(ctx) is the
! message, as a Fortran string.
!
! Layouts, column-major callers first:
!  - tridiagonal batches: a Fortran array x(n, nbatch) (each system a column, contiguous) is
!    TRISOLVE_FLAT; x(nbatch, n) is TRISOLVE_INTERLEAVED. The layout is an argument, never
!    guessed: the server cannot tell the two apart.
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
  integer, parameter, public :: TRISOLVE_FLAT = 0, TRISOLVE_INTERLEAVED = 1

  ! A connection to one server (trisolve_create / trisolve_destroy).
  type, public :: trisolve_context
    type(c_ptr) :: ptr = c_null_ptr
  end type
  ! A persistent system on the server (trisolve_system_create_* / trisolve_system_destroy).
  type, public :: trisolve_system
    type(c_ptr) :: ptr = c_null_ptr
  end type

  public :: trisolve_create, trisolve_destroy, trisolve_last_error, trisolve_code_name, &
    trisolve_set_timeout, trisolve_gtsv_strided_batch, trisolve_dgtsv_strided_batch, &
    trisolve_sgtsv_strided_batch, trisolve_system_create_tridiagonal, &
    trisolve_system_create_block, trisolve_system_solve, trisolve_system_update, &
    trisolve_system_release, trisolve_system_destroy, trisolve_system_handle, &
    trisolve_system_last_summary

  ! real(8) and real(4), arrays of rank 1 (dl(*)) or 2 (dl(batch_stride, *)), under one name.
  interface trisolve_gtsv_strided_batch
    module procedure trisolve_dgtsv_strided_batch, trisolve_sgtsv_strided_batch, &
      dgtsv_rank2, sgtsv_rank2
  end interface

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
    integer(c_int) function c_gtsv(ctx, m, dl, d, du, x, batch, stride, status) &
        bind(c, name='trisolve_gtsv_strided_batch')
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: ctx, status
      integer(c_int64_t), value :: m, batch, stride
      real(c_double), intent(in) :: dl(*), d(*), du(*)
      real(c_double), intent(inout) :: x(*)
    end function
    integer(c_int) function c_sgtsv(ctx, m, dl, d, du, x, batch, stride, status) &
        bind(c, name='trisolve_sgtsv_strided_batch')
      import :: c_ptr, c_int, c_int64_t, c_float
      type(c_ptr), value :: ctx, status
      integer(c_int64_t), value :: m, batch, stride
      real(c_float), intent(in) :: dl(*), d(*), du(*)
      real(c_float), intent(inout) :: x(*)
    end function
    integer(c_int) function c_create_tridiagonal(ctx, n, batch, a, b, c, layout, out) &
        bind(c, name='trisolve_system_create_tridiagonal')
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: ctx
      integer(c_int64_t), value :: n, batch
      real(c_double), intent(in) :: a(*), b(*), c(*)
      integer(c_int), value :: layout
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_create_block(ctx, nn, mm, aC, cC, bC, cA, cB, tol, max_it, out) &
        bind(c, name='trisolve_system_create_block')
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: ctx
      integer(c_int64_t), value :: nn, mm, max_it
      real(c_double), intent(in) :: aC(*), cC(*), bC(*), cA(*), cB(*)
      real(c_double), value :: tol
      type(c_ptr), intent(out) :: out
    end function
    integer(c_int) function c_solve(sys, rhs, k, x, status) bind(c, name='trisolve_system_solve')
      import :: c_ptr, c_int, c_int64_t, c_double
      type(c_ptr), value :: sys, status
      real(c_double), intent(in) :: rhs(*)
      integer(c_int64_t), value :: k
      real(c_double), intent(inout) :: x(*)
    end function
    integer(c_int) function c_update(sys, name, values) bind(c, name='trisolve_system_update')
      import :: c_ptr, c_int, c_char, c_double
      type(c_ptr), value :: sys
      character(kind=c_char), dimension(*), intent(in) :: name
      real(c_double), intent(in) :: values(*)
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
    integer(c_size_t) function c_strlen(s) bind(c, name='strlen')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
    end function
  end interface

contains

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

  ! cuSPARSE gtsv2StridedBatch: nbatch systems of order m, system i at element i*batch_stride + 1
  ! of dl, d, du, x (batch_stride >= m); dl(1) and du(m) of each system are not used. x: in, the
  ! right-hand sides; out, the solutions. status: optional, nbatch per-system statuses.
  integer function trisolve_dgtsv_strided_batch(ctx, m, dl, d, du, x, nbatch, batch_stride, &
                                                status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_double), intent(in) :: dl(*), d(*), du(*)
    real(c_double), intent(inout) :: x(*)
    integer(c_int), intent(out), optional, target :: status(*)
    type(c_ptr) :: sp
    sp = c_null_ptr
    if (present(status)) sp = c_loc(status(1))
    rc = int(c_gtsv(ctx%ptr, int(m, c_int64_t), dl, d, du, x, int(nbatch, c_int64_t), &
                    int(batch_stride, c_int64_t), sp))
  end function

  integer function trisolve_sgtsv_strided_batch(ctx, m, dl, d, du, x, nbatch, batch_stride, &
                                                status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_float), intent(in) :: dl(*), d(*), du(*)
    real(c_float), intent(inout) :: x(*)
    integer(c_int), intent(out), optional, target :: status(*)
    type(c_ptr) :: sp
    sp = c_null_ptr
    if (present(status)) sp = c_loc(status(1))
    rc = int(c_sgtsv(ctx%ptr, int(m, c_int64_t), dl, d, du, x, int(nbatch, c_int64_t), &
                     int(batch_stride, c_int64_t), sp))
  end function

  ! The same with arrays x(batch_stride, nbatch).
  integer function dgtsv_rank2(ctx, m, dl, d, du, x, nbatch, batch_stride, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_double), intent(in) :: dl(batch_stride, *), d(batch_stride, *), du(batch_stride, *)
    real(c_double), intent(inout) :: x(batch_stride, *)
    integer(c_int), intent(out), optional, target :: status(*)
    type(c_ptr) :: sp
    sp = c_null_ptr
    if (present(status)) sp = c_loc(status(1))
    rc = int(c_gtsv(ctx%ptr, int(m, c_int64_t), dl, d, du, x, int(nbatch, c_int64_t), &
                    int(batch_stride, c_int64_t), sp))
  end function

  integer function sgtsv_rank2(ctx, m, dl, d, du, x, nbatch, batch_stride, status) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: m, nbatch, batch_stride
    real(c_float), intent(in) :: dl(batch_stride, *), d(batch_stride, *), du(batch_stride, *)
    real(c_float), intent(inout) :: x(batch_stride, *)
    integer(c_int), intent(out), optional, target :: status(*)
    type(c_ptr) :: sp
    sp = c_null_ptr
    if (present(status)) sp = c_loc(status(1))
    rc = int(c_sgtsv(ctx%ptr, int(m, c_int64_t), dl, d, du, x, int(nbatch, c_int64_t), &
                     int(batch_stride, c_int64_t), sp))
  end function

  ! nbatch tridiagonal systems of order n kept on the server: a (sub), b (main), c (super
  ! diagonal), n*nbatch values in layout TRISOLVE_FLAT (arrays (n, nbatch)) or
  ! TRISOLVE_INTERLEAVED (arrays (nbatch, n)).
  integer function trisolve_system_create_tridiagonal(ctx, n, nbatch, a, b, c, layout, sys) &
      result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: n, nbatch, layout
    real(c_double), intent(in) :: a(*), b(*), c(*)
    type(trisolve_system), intent(out) :: sys
    rc = int(c_create_tridiagonal(ctx%ptr, int(n, c_int64_t), int(nbatch, c_int64_t), a, b, c, &
                                  int(layout, c_int), sys%ptr))
  end function

  ! A block-tridiagonal system kept on the server: nblocks block rows of order m, every array
  ! (m, nblocks). Block row i: diag(cA(:,i)) Y(:,i-1) + C_i Y(:,i) + diag(cB(:,i)) Y(:,i+1) =
  ! F(:,i), C_i tridiagonal with aC(:,i) below, cC(:,i) on and bC(:,i) above the diagonal.
  ! tol: relative residual to reach (absent: the server's default 1e-10; 0: exactly
  ! max_iterations sweeps); max_iterations: absent for the server's default (1000).
  integer function trisolve_system_create_block(ctx, nblocks, m, aC, cC, bC, cA, cB, sys, tol, &
                                                max_iterations) result(rc)
    type(trisolve_context), intent(in) :: ctx
    integer, intent(in) :: nblocks, m
    real(c_double), intent(in) :: aC(*), cC(*), bC(*), cA(*), cB(*)
    type(trisolve_system), intent(out) :: sys
    real(c_double), intent(in), optional :: tol
    integer, intent(in), optional :: max_iterations
    real(c_double) :: t
    integer(c_int64_t) :: it
    t = -1
    it = 0
    if (present(tol)) t = tol
    if (present(max_iterations)) it = int(max_iterations, c_int64_t)
    rc = int(c_create_block(ctx%ptr, int(nblocks, c_int64_t), int(m, c_int64_t), aC, cC, bC, &
                            cA, cB, t, it, sys%ptr))
  end function

  ! Solves k right-hand sides (default 1) stored one after the other in rhs, each in the
  ! system's shape, into x (the same shape; x may not alias rhs in Fortran). status: optional,
  ! k*nbatch (tridiagonal) or k (block) statuses.
  integer function trisolve_system_solve(sys, rhs, x, k, status) result(rc)
    type(trisolve_system), intent(in) :: sys
    real(c_double), intent(in) :: rhs(*)
    real(c_double), intent(inout) :: x(*)
    integer, intent(in), optional :: k
    integer(c_int), intent(out), optional, target :: status(*)
    type(c_ptr) :: sp
    integer(c_int64_t) :: kk
    sp = c_null_ptr
    kk = 1
    if (present(status)) sp = c_loc(status(1))
    if (present(k)) kk = int(k, c_int64_t)
    rc = int(c_solve(sys%ptr, rhs, kk, x, sp))
  end function

  ! Replaces one coefficient array by name ('a', 'b', 'c'; 'aC', 'cC', 'bC', 'cA', 'cB'), in the
  ! system's shape and layout.
  integer function trisolve_system_update(sys, name, values) result(rc)
    type(trisolve_system), intent(in) :: sys
    character(len=*), intent(in) :: name
    real(c_double), intent(in) :: values(*)
    rc = int(c_update(sys%ptr, trim(name) // c_null_char, values))
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

end module trisolve
