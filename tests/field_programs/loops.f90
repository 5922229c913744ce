! Fortran, HPC's language: a do loop nest (lines 9-13) called from the main program.
module kernels
contains
  subroutine smooth(a, n, sweeps)
    integer, intent(in) :: n, sweeps
    double precision, intent(inout) :: a(n, n)
    integer :: i, j, k
    do k = 1, sweeps
      do j = 2, n - 1
        do i = 2, n - 1
          a(i, j) = 0.25d0 * (a(i-1, j) + a(i+1, j) + a(i, j-1) + a(i, j+1))
        end do
      end do
    end do
  end subroutine smooth
end module kernels

program main
  use kernels
  implicit none
  integer, parameter :: n = 400
  double precision, allocatable :: a(:, :)
  character(len=32) :: arg
  integer :: sweeps
  sweeps = 200
  if (command_argument_count() > 0) then
    call get_command_argument(1, arg)
    read (arg, *) sweeps
  end if
  allocate (a(n, n))
  a = 1.0d0
  a(1, :) = 0.0d0
  call smooth(a, n, sweeps)
  print *, a(n / 2, n / 2)
end program main
