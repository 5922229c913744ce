/* Rank 0 waits in MPI_Recv while rank 1 computes (tests/test_run_realtime.py). */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static volatile double sink;

__attribute__((noinline)) static void compute(double seconds) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    double x = 0;
    do {
        for (int i = 0; i < 100000; i++) x += i * 0.5;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec) < seconds);
    sink = x;
}

__attribute__((noinline)) static double wait_for_result(void) {
    double v = 0;
    MPI_Recv(&v, 1, MPI_DOUBLE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return v;
}

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        double t = MPI_Wtime();
        wait_for_result();
        printf("rank 0 waited %.3f s\n", MPI_Wtime() - t);
    } else if (rank == 1) {
        compute(0.4);
        double v = 1.0;
        MPI_Send(&v, 1, MPI_DOUBLE, 0, 7, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
