/* An MPI program as users write them: every rank computes (rank k does k+1 units), then an
 * allreduce. Built with the MPI's own mpicc. Usage: mpi_app SECONDS_PER_UNIT */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "work.h"

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double unit = argc > 1 ? atof(argv[1]) : 0.2;
    double s = compute(unit * (rank + 1)), total = 0;
    MPI_Allreduce(&s, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("ranks %d sum %g\n", size, total);
    MPI_Finalize();
    return 0;
}
