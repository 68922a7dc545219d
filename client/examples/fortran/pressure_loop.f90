! A 2D pressure time loop through trisolve's Fortran module: an implicit step of
!   (sigma - Laplacian) p_new = sigma * p_old + source(t)
! on an m x nb grid (5-point stencil, Dirichlet boundaries) is one block-tridiagonal system:
! nb block rows of order m, arrays (m, nb) in Fortran = the C API's nb x m row-major layout.
! The system is created by handle once; each step sends only the right-hand side, and every
! fifth step the time step changes, so the diagonal cC is updated by name. The residual
! ||f - A p||_2 / ||f||_2 is computed here in Fortran. Exits non-zero on any failure.
!
!   TRISOLVE_SERVER=127.0.0.1:50051 ./pressure_loop [m nb steps]
program pressure_loop
  use, intrinsic :: iso_c_binding, only: c_double
  use trisolve
  implicit none
  integer :: m = 96, nb = 64, steps = 20
  real(c_double), allocatable :: aC(:,:), cC(:,:), bC(:,:), cA(:,:), cB(:,:)
  real(c_double), allocatable :: p(:,:), f(:,:), pnew(:,:)
  type(trisolve_context) :: ctx
  type(trisolve_system) :: sys
  real(c_double) :: sigma, res, server_res, worst, t
  real(c_double), parameter :: tol = 1d-10
  integer :: rc, step, iters, failures
  integer(8) :: c0, c1, rate
  character(len=32) :: arg

  if (command_argument_count() >= 3) then
    call get_command_argument(1, arg); read (arg, *) m
    call get_command_argument(2, arg); read (arg, *) nb
    call get_command_argument(3, arg); read (arg, *) steps
  end if
  allocate(aC(m, nb), cC(m, nb), bC(m, nb), cA(m, nb), cB(m, nb))
  allocate(p(m, nb), f(m, nb), pnew(m, nb))

  ! The 5-point Laplacian, scaled by h^2: symmetric positive definite once sigma > 0.
  aC = -1; bC = -1; cA = -1; cB = -1
  aC(1, :) = 0      ! no neighbour below the first unknown of a block row
  bC(m, :) = 0      ! nor above the last
  cA(:, 1) = 0      ! no block row before the first
  cB(:, nb) = 0     ! nor after the last
  sigma = 0.5d0
  cC = 4 + sigma
  p = 0
  failures = 0

  rc = trisolve_create(ctx)   ! $TRISOLVE_SERVER, else 127.0.0.1:50051
  call check(rc, 'trisolve_create')
  call column_major_tridiagonal()

  rc = trisolve_system_create_block(ctx, nb, m, aC, cC, bC, cA, cB, sys, tol=tol)
  call check(rc, 'trisolve_system_create_block')
  print '(a, i0, a, i0, a, a)', 'pressure: ', m, ' x ', nb, ' grid, system ', &
    trisolve_system_handle(sys)

  worst = 0
  call system_clock(c0, rate)
  do step = 1, steps
    if (step > 1 .and. mod(step - 1, 5) == 0) then
      sigma = sigma * 0.8d0          ! a larger time step: a new diagonal, sent by name
      cC = 4 + sigma
      rc = trisolve_system_update(sys, 'cC', cC)
      call check(rc, 'trisolve_system_update cC')
    end if
    call rhs(step, f)
    rc = trisolve_system_solve(sys, f, pnew)
    call check(rc, 'trisolve_system_solve')
    rc = trisolve_system_last_summary(sys, server_res, iters)
    res = residual(pnew, f)
    worst = max(worst, res)
    print '(a, i3, a, f6.4, a, es9.2, a, es9.2, a, i0)', 'step ', step, '  sigma ', sigma, &
      '  residual ', res, '  (server ', server_res, ')  iterations ', iters
    if (.not. (res < 1d-8)) then
      print '(a, i0)', 'FAILED: residual too large at step ', step
      failures = failures + 1
    end if
    p = pnew
  end do
  call system_clock(c1)
  t = real(c1 - c0, c_double) / real(rate, c_double)
  print '(a, i0, a, f8.3, a, f8.1, a, es9.2)', 'steps: ', steps, ' in ', t, ' s: ', &
    steps / t, ' steps/s; worst residual ', worst

  ! The handle is gone once released: the server answers NOT_FOUND, with its message.
  rc = trisolve_system_release(sys)
  call check(rc, 'trisolve_system_release')
  rc = trisolve_system_solve(sys, f, pnew)
  if (rc /= TRISOLVE_NOT_FOUND) then
    print '(a, a)', 'FAILED: solve after release gave ', trisolve_code_name(rc)
    failures = failures + 1
  else
    print '(a, a)', 'solve after release: NOT_FOUND: ', trisolve_last_error(ctx)
  end if
  call trisolve_system_destroy(sys)
  call trisolve_destroy(ctx)
  if (failures > 0) then
    print '(a, i0, a)', 'FAILED (', failures, ' failures)'
    stop 1
  end if
  print '(a)', 'OK'

contains

  ! Column-major callers: x(ld, nbatch) through the cuSPARSE-shaped call (batch_stride = ld),
  ! in real(8) and real(4) (one generic name), and x(n, nbatch) as a TRISOLVE_FLAT system.
  subroutine column_major_tridiagonal()
    integer, parameter :: n = 50, ld = 53, nbat = 8
    real(c_double) :: dl(ld, nbat), d(ld, nbat), du(ld, nbat), x(ld, nbat), b(ld, nbat)
    real(c_double) :: y(n, nbat)
    real(4) :: sdl(ld, nbat), sd(ld, nbat), sdu(ld, nbat), sx(ld, nbat)
    integer :: st(nbat), s, k
    type(trisolve_system) :: tri
    real(c_double) :: r, r4, rf
    do s = 1, nbat
      do k = 1, ld
        dl(k, s) = -1 + 0.01d0 * k
        du(k, s) = -1 - 0.01d0 * s
        d(k, s) = 4 + 0.1d0 * s
        b(k, s) = sin(0.3d0 * k + s)
      end do
    end do
    x = b
    rc = trisolve_gtsv_strided_batch(ctx, n, dl, d, du, x, nbat, ld, st)
    call check(rc, 'trisolve_gtsv_strided_batch (real(8))')
    r = tri_residual(n, ld, nbat, dl, d, du, b, x)
    sdl = real(dl, 4); sd = real(d, 4); sdu = real(du, 4); sx = real(b, 4)
    rc = trisolve_gtsv_strided_batch(ctx, n, sdl, sd, sdu, sx, nbat, ld)
    call check(rc, 'trisolve_gtsv_strided_batch (real(4))')
    x(1:n, :) = real(sx(1:n, :), c_double)
    r4 = tri_residual(n, ld, nbat, dl, d, du, b, x)
    ! The same systems kept on the server, the arrays (n, nbatch): TRISOLVE_FLAT.
    dl(1, :) = 0
    du(n, :) = 0
    rc = trisolve_system_create_tridiagonal(ctx, n, nbat, dl(1:n, :), d(1:n, :), du(1:n, :), &
                                            TRISOLVE_FLAT, tri)
    call check(rc, 'trisolve_system_create_tridiagonal')
    rc = trisolve_system_solve(tri, b(1:n, :), y)
    call check(rc, 'trisolve_system_solve (tridiagonal)')
    x(1:n, :) = y
    rf = tri_residual(n, ld, nbat, dl, d, du, b, x)
    call trisolve_system_destroy(tri)
    print '(a, es9.2, a, es9.2, a, es9.2)', 'tridiagonal x(n, nbatch): gtsv real(8) residual ', &
      r, ', real(4) ', r4, ', TRISOLVE_FLAT system ', rf
    if (.not. (r < 1d-12 .and. r4 < 1d-5 .and. rf < 1d-12) .or. any(st /= TRISOLVE_SYSTEM_OK)) then
      print '(a)', 'FAILED: column-major tridiagonal residuals'
      failures = failures + 1
    end if
  end subroutine

  subroutine check(code, what)
    integer, intent(in) :: code
    character(len=*), intent(in) :: what
    if (code /= TRISOLVE_OK) then
      print '(a, a, a, a, a, a)', 'FAILED: ', what, ': ', trisolve_code_name(code), ': ', &
        trisolve_last_error(ctx)
      stop 1
    end if
  end subroutine

  ! max |A x - b| / max |b| over a batch stored x(ld, nbat), systems of order n.
  real(c_double) function tri_residual(n, ld, nbat, dl, d, du, b, x) result(w)
    integer, intent(in) :: n, ld, nbat
    real(c_double), intent(in) :: dl(ld, nbat), d(ld, nbat), du(ld, nbat), b(ld, nbat)
    real(c_double), intent(in) :: x(ld, nbat)
    real(c_double) :: ax
    integer :: s, k
    w = 0
    do s = 1, nbat
      do k = 1, n
        ax = d(k, s) * x(k, s)
        if (k > 1) ax = ax + dl(k, s) * x(k - 1, s)
        if (k < n) ax = ax + du(k, s) * x(k + 1, s)
        w = max(w, abs(ax - b(k, s)))
      end do
    end do
    w = w / maxval(abs(b(1:n, :)))
  end function

  ! sigma * p_old plus a source that moves across the grid.
  subroutine rhs(step, out)
    integer, intent(in) :: step
    real(c_double), intent(out) :: out(:,:)
    integer :: i, k
    real(c_double) :: x, y, cx
    cx = 0.2d0 + 0.6d0 * step / real(steps, c_double)
    do i = 1, nb
      do k = 1, m
        x = real(k, c_double) / m
        y = real(i, c_double) / nb
        out(k, i) = sigma * p(k, i) + exp(-40 * ((x - cx)**2 + (y - 0.5d0)**2))
      end do
    end do
  end subroutine

  ! ||f - A y||_2 / ||f||_2 for the current coefficients.
  real(c_double) function residual(y, rhs_) result(r)
    real(c_double), intent(in) :: y(:,:), rhs_(:,:)
    real(c_double) :: ay, num, den
    integer :: i, k
    num = 0
    den = 0
    do i = 1, nb
      do k = 1, m
        ay = cC(k, i) * y(k, i)
        if (k > 1) ay = ay + aC(k, i) * y(k - 1, i)
        if (k < m) ay = ay + bC(k, i) * y(k + 1, i)
        if (i > 1) ay = ay + cA(k, i) * y(k, i - 1)
        if (i < nb) ay = ay + cB(k, i) * y(k, i + 1)
        num = num + (rhs_(k, i) - ay)**2
        den = den + rhs_(k, i)**2
      end do
    end do
    r = sqrt(num / den)
  end function

end program pressure_loop
