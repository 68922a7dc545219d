! The Fortran module against a real trisolved ($TRISOLVE_SERVER, set by run_with_server.sh):
! every family one-shot in real(8) and real(4), arrays of rank 1, 2 and 3 through the same
! generic names, column-major dense matrices, persistent tree and dense systems, and a time
! loop over the step stream with the diagonal updated each step. Residuals are computed here
! from the caller's arrays. Exits with status 1 on any failure.
! What the progress callback saw (a bind(c) procedure must live in a module).
module progress_counts
  use, intrinsic :: iso_c_binding
  implicit none
  integer :: reports = 0, solving_reports = 0, last_phase = 0
  integer(c_int64_t) :: last_iteration = -1
  logical :: monotone = .true.
contains
  subroutine count_reports(user_data, phase, iteration, max_iterations, residual, bytes_total, &
                           elapsed_s) bind(c)
    type(c_ptr), value :: user_data
    integer(c_int), value :: phase
    integer(c_int64_t), value :: iteration, max_iterations, bytes_total
    real(c_double), value :: residual, elapsed_s
    reports = reports + 1
    ! (no user data was given; sizes and times are never negative; a residual is NaN or >= 0)
    if (c_associated(user_data) .or. bytes_total < 0 .or. elapsed_s < 0) monotone = .false.
    if (max_iterations < 0 .or. residual < 0) monotone = .false.
    if (phase < last_phase) monotone = .false.
    if (phase == 3) then
      solving_reports = solving_reports + 1
      if (iteration < last_iteration) monotone = .false.
      last_iteration = iteration
    end if
    last_phase = phase
  end subroutine
end module

program test_trisolve
  use, intrinsic :: iso_c_binding
  use trisolve
  use progress_counts
  implicit none
  integer, parameter :: n = 30, nb = 4, nd = 8
  type(trisolve_context) :: ctx
  integer :: failures = 0, rc

  rc = trisolve_create(ctx)
  if (rc /= TRISOLVE_OK) then
    print '(a, a)', 'trisolve_create: ', trisolve_last_error()
    stop 1
  end if
  call tridiagonal()
  call tree(.true.)
  call tree(.false.)
  call dense()
  call block()
  call block_progress()
  call tree_time_loop()
  call dense_system()
  call variable_systems()
  call trisolve_destroy(ctx)
  if (failures > 0) then
    print '(a, i0, a)', 'FAILED (', failures, ' failures)'
    stop 1
  end if
  print '(a)', 'OK (0 failures)'

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      print '(a, t72, a)', what, 'ok'
    else
      print '(a, t72, a)', what, 'FAILED'
      print '(4x, a, a)', 'last error: ', trisolve_last_error(ctx)
      failures = failures + 1
    end if
  end subroutine

  ! max |A x - d| / max(|d| + |b x|) over a (n, nb) batch of tridiagonal systems.
  real(8) function res_tri(a, b, c, x, d) result(r)
    real(8), intent(in) :: a(n, nb), b(n, nb), c(n, nb), x(n, nb), d(n, nb)
    real(8) :: ax, scale
    integer :: k, s
    r = 0
    scale = 0
    do s = 1, nb
      do k = 1, n
        ax = b(k, s) * x(k, s)
        if (k > 1) ax = ax + a(k, s) * x(k - 1, s)
        if (k < n) ax = ax + c(k, s) * x(k + 1, s)
        r = max(r, abs(ax - d(k, s)))
        scale = max(scale, abs(d(k, s)) + abs(b(k, s) * x(k, s)))
      end do
    end do
    r = r / scale
  end function

  subroutine tridiagonal()
    real(8) :: a(n, nb), b(n, nb), c(n, nb), d(n, nb), x(n, nb)
    real(4) :: sx(n * nb)
    integer(c_int) :: st(nb)
    call random_number(a)
    call random_number(c)
    call random_number(d)
    a = -a
    c = -c
    a(1, :) = 0
    c(n, :) = 0
    b = 3
    rc = trisolve_solve_tridiagonal(ctx, n, nb, a, b, c, d, x, TRISOLVE_FLAT, st)
    call check(rc == TRISOLVE_OK .and. all(st == TRISOLVE_SYSTEM_OK) .and. &
               res_tri(a, b, c, x, d) < 1d-13, 'solve_tridiagonal real(8) x(n, nbatch), FLAT')
    ! real(4), rank-1 x against rank-2 coefficients: the same generic name.
    a = real(real(a, 4), 8)
    c = real(real(c, 4), 8)
    d = real(real(d, 4), 8)
    rc = trisolve_solve_tridiagonal(ctx, n, nb, real(a, 4), real(b, 4), real(c, 4), &
                                    reshape(real(d, 4), [n * nb]), sx, TRISOLVE_FLAT)
    x = reshape(real(sx, 8), [n, nb])
    call check(rc == TRISOLVE_OK .and. res_tri(a, b, c, x, d) < 2d-6, &
               'solve_tridiagonal real(4), rank-1 x')
  end subroutine

  ! Depth-first trees: node i (1-based) hangs off i-1 or an ancestor of it; 0-based in parent.
  subroutine make_tree(parent)
    integer(c_int32_t), intent(out) :: parent(n)
    integer :: i, q, up
    real(8) :: u
    parent(1) = -1
    do i = 2, n
      q = i - 1
      call random_number(u)
      do up = 1, int(3 * u)
        if (parent(q) < 0) exit
        q = parent(q) + 1
      end do
      parent(i) = int(q - 1, c_int32_t)
    end do
  end subroutine

  ! Dominant diagonals for the trees of parent (one column of parent a system, or one for all).
  subroutine tree_coefficients(parent, lower, upper, diag)
    integer(c_int32_t), intent(in) :: parent(:, :)
    real(8), intent(out) :: lower(n, nb), upper(n, nb), diag(n, nb)
    integer :: s, i, p
    call random_number(lower)
    call random_number(upper)
    lower = -lower
    upper = -upper
    lower(1, :) = 0
    upper(1, :) = 0
    diag = 1.5d0
    do s = 1, nb
      do i = 2, n
        p = parent(i, min(s, size(parent, 2))) + 1
        diag(i, s) = diag(i, s) - lower(i, s) - upper(i, s)
        diag(p, s) = diag(p, s) - lower(i, s) - upper(i, s)
      end do
    end do
  end subroutine

  real(8) function res_tree(parent, lower, upper, diag, x, rhs) result(r)
    integer(c_int32_t), intent(in) :: parent(:, :)
    real(8), intent(in) :: lower(n, nb), upper(n, nb), diag(n, nb), x(n, nb), rhs(n, nb)
    real(8) :: ax(n)
    integer :: s, i, p
    r = 0
    do s = 1, nb
      ax = diag(:, s) * x(:, s)
      do i = 2, n
        p = parent(i, min(s, size(parent, 2))) + 1
        ax(i) = ax(i) + lower(i, s) * x(p, s)
        ax(p) = ax(p) + upper(i, s) * x(i, s)
      end do
      r = max(r, maxval(abs(ax - rhs(:, s))) / maxval(abs(rhs(:, s)) + abs(diag(:, s) * x(:, s))))
    end do
  end function

  subroutine tree(shared)
    logical, intent(in) :: shared
    integer(c_int32_t), allocatable :: parent(:, :)
    real(8) :: lower(n, nb), upper(n, nb), diag(n, nb), rhs(n, nb), x(n, nb)
    real(4) :: sx(n, nb)
    integer :: s
    integer(c_int) :: st(nb)
    character(len=20) :: which
    if (shared) then
      allocate(parent(n, 1))
      which = 'parent(n)'
    else
      allocate(parent(n, nb))
      which = 'parent(n, nbatch)'
    end if
    do s = 1, size(parent, 2)
      call make_tree(parent(:, s))
    end do
    call tree_coefficients(parent, lower, upper, diag)
    call random_number(rhs)
    if (shared) then
      rc = trisolve_solve_tree(ctx, n, nb, parent(:, 1), lower, upper, diag, rhs, x, &
                               TRISOLVE_FLAT, st)
    else
      rc = trisolve_solve_tree(ctx, n, nb, parent, lower, upper, diag, rhs, x, TRISOLVE_FLAT, st)
    end if
    call check(rc == TRISOLVE_OK .and. all(st == TRISOLVE_SYSTEM_OK) .and. &
               res_tree(parent, lower, upper, diag, x, rhs) < 1d-13, &
               'solve_tree real(8), ' // trim(which))
    lower = real(real(lower, 4), 8)
    upper = real(real(upper, 4), 8)
    diag = real(real(diag, 4), 8)
    rhs = real(real(rhs, 4), 8)
    rc = trisolve_solve_tree(ctx, n, nb, parent, real(lower, 4), real(upper, 4), real(diag, 4), &
                             real(rhs, 4), sx, TRISOLVE_FLAT)
    x = real(sx, 8)
    call check(rc == TRISOLVE_OK .and. res_tree(parent, lower, upper, diag, x, rhs) < 5d-6, &
               'solve_tree real(4), ' // trim(which))
  end subroutine

  subroutine make_dense(A)
    real(8), intent(out) :: A(nd, nd, nb)
    integer :: i
    call random_number(A)
    A = A - 0.5d0
    do i = 1, nd
      A(i, i, :) = A(i, i, :) + 2 * nd
    end do
  end subroutine

  real(8) function res_dense(A, x, b) result(r)
    real(8), intent(in) :: A(nd, nd, nb), x(nd, nb), b(nd, nb)
    integer :: s
    r = 0
    do s = 1, nb
      r = max(r, maxval(abs(matmul(A(:, :, s), x(:, s)) - b(:, s))) / &
                 maxval(abs(b(:, s)) + matmul(abs(A(:, :, s)), abs(x(:, s)))))
    end do
  end function

  subroutine dense()
    real(8) :: A(nd, nd, nb), At(nd, nd, nb), b(nd, nb), x(nd, nb), xt(nd, nb)
    integer :: s
    call make_dense(A)
    call random_number(b)
    rc = trisolve_solve_dense(ctx, nd, nb, A, b, x, TRISOLVE_COL_MAJOR)
    call check(rc == TRISOLVE_OK .and. res_dense(A, x, b) < 1d-14, &
               'solve_dense real(8) A(n, n, nbatch), COL_MAJOR')
    do s = 1, nb
      At(:, :, s) = transpose(A(:, :, s))
    end do
    rc = trisolve_solve_dense(ctx, nd, nb, At, b, xt, TRISOLVE_ROW_MAJOR)
    call check(rc == TRISOLVE_OK .and. all(x == xt), &
               'solve_dense: the transposes as ROW_MAJOR give the same x, bit for bit')
    rc = trisolve_solve_dense(ctx, nd, nb, A, b, x, TRISOLVE_FLAT)
    call check(rc == TRISOLVE_INVALID_ARGUMENT, &
               'solve_dense with TRISOLVE_FLAT: ' // trisolve_code_name(rc))
  end subroutine

  ! (sigma - Laplacian) on an m x nblk grid, arrays (m, nblk), real(4).
  subroutine block()
    integer, parameter :: m = 12, nblk = 10
    real(4), dimension(m, nblk) :: aC, cC, bC, cA, cB, f, y
    real(8) :: r2, f2, ay
    integer :: i, k
    integer(c_int) :: st(1)
    aC = -1
    bC = -1
    cA = -1
    cB = -1
    cC = 4.5
    aC(1, :) = 0
    bC(m, :) = 0
    cA(:, 1) = 0
    cB(:, nblk) = 0
    call random_number(f)
    rc = trisolve_solve_block(ctx, nblk, m, aC, cC, bC, cA, cB, f, y, st)
    r2 = 0
    f2 = 0
    do i = 1, nblk
      do k = 1, m
        ay = cC(k, i) * real(y(k, i), 8)
        if (k > 1) ay = ay + aC(k, i) * real(y(k - 1, i), 8)
        if (k < m) ay = ay + bC(k, i) * real(y(k + 1, i), 8)
        if (i > 1) ay = ay + cA(k, i) * real(y(k, i - 1), 8)
        if (i < nblk) ay = ay + cB(k, i) * real(y(k, i + 1), 8)
        r2 = r2 + (f(k, i) - ay)**2
        f2 = f2 + real(f(k, i), 8)**2
      end do
    end do
    call check(rc == TRISOLVE_OK .and. st(1) == TRISOLVE_SYSTEM_OK .and. sqrt(r2 / f2) < 5d-5, &
               'solve_block real(4) X(m, nblocks)')
  end subroutine

  ! The progress callback and the residual history of a block solve to a tolerance.
  subroutine block_progress()
    integer, parameter :: m = 24, nblk = 24
    real(8), dimension(m, nblk) :: aC, cC, bC, cA, cB, f, y
    integer(c_int) :: st(1)
    integer(c_int64_t) :: its(2000)
    real(8) :: res(2000)
    integer :: points
    aC = -1
    bC = -1
    cA = -1
    cB = -1
    cC = 4.1d0
    aC(1, :) = 0
    bC(m, :) = 0
    cA(:, 1) = 0
    cB(:, nblk) = 0
    call random_number(f)
    reports = 0
    solving_reports = 0
    last_phase = 0
    last_iteration = -1
    monotone = .true.
    rc = trisolve_set_progress(ctx, count_reports, interval_s=0.01d0)
    call check(rc == TRISOLVE_OK, 'set_progress')
    rc = trisolve_set_residual_history(ctx, .true.)
    call check(rc == TRISOLVE_OK, 'set_residual_history')
    rc = trisolve_solve_block(ctx, nblk, m, aC, cC, bC, cA, cB, f, y, st, tol=1d-10)
    call check(rc == TRISOLVE_OK .and. st(1) == TRISOLVE_SYSTEM_OK, 'solve_block with progress')
    call check(reports >= 2 .and. monotone, 'progress: reports come, phases and iterations rise')
    points = trisolve_residual_history(ctx, its, res)
    call check(points >= 2 .and. points <= 1024, 'residual history: points kept')
    if (points >= 2) then
      call check(its(1) == 0 .and. its(points) > 0 .and. res(points) <= 1d-10, &
                 'residual history: from iteration 0 to the final residual')
    end if
    rc = trisolve_set_progress(ctx)
    call check(rc == TRISOLVE_OK, 'set_progress off')
    reports = 0
    rc = trisolve_solve_block(ctx, nblk, m, aC, cC, bC, cA, cB, f, y, st, tol=1d-10)
    call check(rc == TRISOLVE_OK .and. reports == 0, 'no reports once off')
    rc = trisolve_set_residual_history(ctx, .false.)
  end subroutine

  ! A cable-like loop by handle over one stream: the diagonal changes every step (staged with
  ! the step), the right-hand side is the last solution. Two steps are kept in flight.
  subroutine tree_time_loop()
    integer, parameter :: steps = 12
    integer(c_int32_t) :: parent(n, 1)
    real(8) :: lower(n, nb), upper(n, nb), diag(n, nb), base(n, nb)
    real(8) :: v(n, nb), rhs(n, nb, 0:steps), x(n, nb), diags(n, nb, 0:steps), worst
    type(trisolve_system) :: sys
    type(trisolve_stream) :: st
    integer :: step, got
    logical :: ok
    call make_tree(parent(:, 1))
    call tree_coefficients(parent, lower, upper, base)
    rc = trisolve_system_create_tree(ctx, n, nb, parent(:, 1), lower, upper, base, &
                                     TRISOLVE_FLAT, sys)
    call check(rc == TRISOLVE_OK, 'system_create_tree real(8) ' // trisolve_system_handle(sys))
    rc = trisolve_stream_open(sys, st)
    call check(rc == TRISOLVE_OK, 'stream_open')
    call random_number(v)
    ok = .true.
    worst = 0
    got = 0
    ! The right-hand side of step k is the answer of step k-2 (two in flight), or v at first.
    do step = 0, steps
      diag = base * (1 + 0.01d0 * step)
      diags(:, :, step) = diag
      if (step < 2) then
        rhs(:, :, step) = v
      else
        rc = trisolve_stream_receive(st, x)
        ok = ok .and. rc == TRISOLVE_OK
        worst = max(worst, res_tree(parent, lower, upper, diags(:, :, got), x, rhs(:, :, got)))
        got = got + 1
        rhs(:, :, step) = x
      end if
      rc = trisolve_stream_update(st, 'diag', diag)
      ok = ok .and. rc == TRISOLVE_OK
      rc = trisolve_stream_send(st, rhs(:, :, step))
      ok = ok .and. rc == TRISOLVE_OK
    end do
    do while (got <= steps)
      rc = trisolve_stream_receive(st, x)
      ok = ok .and. rc == TRISOLVE_OK
      worst = max(worst, res_tree(parent, lower, upper, diags(:, :, got), x, rhs(:, :, got)))
      got = got + 1
    end do
    call check(ok .and. worst < 1d-13, 'stream: 13 steps, diag updated each step, 2 in flight')
    rc = trisolve_stream_close(st)
    call check(rc == TRISOLVE_OK, 'stream_close')
    rc = trisolve_system_update(sys, 'diag', real(diag, 4))
    call check(rc == TRISOLVE_INVALID_ARGUMENT, 'a real(4) update of a real(8) system: ' // &
               trisolve_code_name(rc))
    call trisolve_system_destroy(sys)
  end subroutine

  ! A real(4) dense system, column-major, two right-hand sides in one call.
  subroutine dense_system()
    real(8) :: A(nd, nd, nb), b(nd, nb, 2)
    real(4) :: sx(nd, nb, 2)
    type(trisolve_system) :: sys
    integer(c_int) :: st(nb, 2)
    call make_dense(A)
    A = real(real(A, 4), 8)
    call random_number(b)
    b = real(real(b, 4), 8)
    rc = trisolve_system_create_dense(ctx, nd, nb, real(A, 4), TRISOLVE_COL_MAJOR, sys)
    call check(rc == TRISOLVE_OK, 'system_create_dense real(4)')
    rc = trisolve_system_solve(sys, real(b, 4), sx, k=2, status=st)
    call check(rc == TRISOLVE_OK .and. all(st == TRISOLVE_SYSTEM_OK) .and. &
               max(res_dense(A, real(sx(:, :, 1), 8), b(:, :, 1)), &
                   res_dense(A, real(sx(:, :, 2), 8), b(:, :, 2))) < 1d-6, &
               'system_solve real(4), 2 right-hand sides')
    rc = trisolve_system_release(sys)
    rc = trisolve_system_solve(sys, real(b, 4), sx, k=2)
    call check(rc == TRISOLVE_NOT_FOUND, 'solve after release: ' // trisolve_code_name(rc))
    call trisolve_system_destroy(sys)
  end subroutine

  ! Tridiagonal systems of 3, 1 and 6 rows by handle (a, b, c concatenated): each system's
  ! residual from its own rows; then the hand-worked tree cells of 1, 2 and 5 nodes, real(4).
  subroutine variable_systems()
    integer(c_int32_t), parameter :: lengths(3) = [3, 1, 6]
    real(8) :: a(10), b(10), c(10), d(10), x(10), r, ax, scale
    integer(c_int) :: st(3)
    type(trisolve_system) :: sys
    integer :: s, k, o, m
    integer(c_int32_t), parameter :: cells(3) = [1, 2, 5]
    integer(c_int32_t), parameter :: parent(8) = [-1, -1, 0, -1, 0, 1, 0, 3]
    real(4), parameter :: lower(8) = [9., 3.5, 1., 6., 1., -1., 0.5, 1.]
    real(4), parameter :: upper(8) = [-9., -2.5, 1., -6., 2., 1., -1., 0.5]
    real(4), parameter :: diag(8) = [4., 3., 2., 5., 4., 3., 4., 2.]
    real(4), parameter :: rhs(8) = [8., 2., -1., 10., 12., 7., -2.5, 3.]
    real(4), parameter :: want(8) = [2., 1., -1., 1., 2., 3., -1., 2.]
    real(4) :: xs(8)
    call random_number(a)
    call random_number(c)
    call random_number(d)
    b = 3
    rc = trisolve_system_create_tridiagonal_variable(ctx, lengths, a, b, c, sys)
    call check(rc == TRISOLVE_OK, 'system_create_tridiagonal_variable real(8)')
    rc = trisolve_system_solve(sys, d, x, status=st)
    r = 0
    scale = 0
    o = 0
    do s = 1, 3
      m = lengths(s)
      do k = 1, m
        ax = b(o + k) * x(o + k)
        if (k > 1) ax = ax + a(o + k) * x(o + k - 1)
        if (k < m) ax = ax + c(o + k) * x(o + k + 1)
        r = max(r, abs(ax - d(o + k)))
        scale = max(scale, abs(d(o + k)) + abs(b(o + k) * x(o + k)))
      end do
      o = o + m
    end do
    call check(rc == TRISOLVE_OK .and. all(st == TRISOLVE_SYSTEM_OK) .and. r / scale < 1d-14, &
               'variable systems by handle: each residual')
    call trisolve_system_destroy(sys)
    rc = trisolve_system_create_tree_variable(ctx, cells, parent, lower, upper, diag, sys)
    call check(rc == TRISOLVE_OK, 'system_create_tree_variable real(4)')
    rc = trisolve_system_solve(sys, rhs, xs, status=st)
    call check(rc == TRISOLVE_OK .and. all(st == TRISOLVE_SYSTEM_OK) .and. &
               maxval(abs(xs - want)) < 1e-5, 'tree cells by handle: x as hand-worked')
    call trisolve_system_destroy(sys)
  end subroutine

end program
