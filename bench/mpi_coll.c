/* Open MPI baseline for `meshrun bench collectives`: the same ops, sizes,
 * statistic and bus-bandwidth arithmetic (nccl-tests definitions,
 * docs/collectives.md#bandwidth-figures), float32. By default, as meshrun's default: one barrier, then the
 * iterations back to back, the slowest rank's loop time over the
 * iterations. --barrier, as meshrun's --barrier: a barrier before each
 * iteration, the slowest rank's time of each, averaged. 2 warm-ups.
 * Built and run by bench/peers.sh; not part of meshrun. Sizes 64 KiB,
 * 1 MiB, 16 MiB (a size given 0 iterations is skipped); any number of ranks.
 * MPI_COLL_OP=OP in the environment runs that op only.
 * usage: mpi_coll [ITERS_16M [ITERS_64K [ITERS_1M]]] [--barrier] */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* Mean of the slowest rank's time; *cpu_us: CPU of all ranks per
 * iteration, *cores: that against the loop's wall time. */
static double run(const char *op, size_t bytes, int iters, int n, int rank, bool each,
		  double *cpu_us, double *cores)
{
	double c0 = 0, w0 = 0;
	size_t cnt = bytes / 4;
	float *a = malloc(bytes + 64), *b = malloc(bytes + 64);
	for (size_t i = 0; i < cnt; i++)
		a[i] = (float)(i % 7);
	double sum = 0;
	for (int it = -2; it < iters; it++) {
		if (it <= 0 || each)
			MPI_Barrier(MPI_COMM_WORLD);
		if (it == 0) {
			c0 = cpu_s();
			w0 = MPI_Wtime();
		}
		double t0 = MPI_Wtime();
		if (!strcmp(op, "all_gather"))
			MPI_Allgather(a, (int)(cnt / n), MPI_FLOAT, b, (int)(cnt / n), MPI_FLOAT, MPI_COMM_WORLD);
		else if (!strcmp(op, "reduce_scatter"))
			MPI_Reduce_scatter_block(a, b, (int)(cnt / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		else if (!strcmp(op, "all_reduce"))
			MPI_Allreduce(a, b, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		else if (!strcmp(op, "all_to_all"))
			MPI_Alltoall(a, (int)(cnt / n), MPI_FLOAT, b, (int)(cnt / n), MPI_FLOAT, MPI_COMM_WORLD);
		else if (!strcmp(op, "permute"))
			MPI_Sendrecv(a, (int)cnt, MPI_FLOAT, (rank + 1) % n, 0, b, (int)cnt, MPI_FLOAT,
				     (rank + n - 1) % n, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		else if (!strcmp(op, "broadcast"))
			MPI_Bcast(a, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
		if (each) {
			double dt = MPI_Wtime() - t0, mx;
			MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			if (it >= 0)
				sum += mx;
		}
	}
	double mine[2] = { cpu_s() - c0, MPI_Wtime() - w0 }, all[2];
	if (!each)
		MPI_Allreduce(&mine[1], &sum, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	*cpu_us = all[0] / iters * 1e6;
	*cores = all[0] / (all[1] / n);
	free(a);
	free(b);
	return sum / iters;
}

int main(int argc, char **argv)
{
	int n, rank;
	const char *ops[] = { "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute", "broadcast" };
	size_t sizes[] = { 65536, 1u << 20, 16u << 20 };
	int iters[3] = { 500, 100, 20 };
	bool each = false;
	MPI_Init(&argc, &argv);
	int k = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--barrier"))
			each = true;
		else if (k < 3) {
			/* ITERS_16M, ITERS_64K, ITERS_1M */
			static const int slot[3] = { 2, 0, 1 };
			iters[slot[k++]] = atoi(argv[i]);
		}
	}
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	const char *only = getenv("MPI_COLL_OP"); /* one op only (bench/syscalls.sh) */
	for (int o = 0; o < 6; o++)
		for (int s = 0; s < 3; s++) {
			if (only && strcmp(only, ops[o]))
				continue;
			double cpu, cores;
			if (iters[s] <= 0)
				continue; /* a size with 0 iterations is skipped */
			double t = run(ops[o], sizes[s], iters[s], n, rank, each, &cpu, &cores);
			double alg = sizes[s] / t / 1e9, f = (double)(n - 1) / n;
			double bus = !strcmp(ops[o], "all_reduce") ? alg * 2 * f :
				     (!strcmp(ops[o], "permute") || !strcmp(ops[o], "broadcast")) ? alg : alg * f;
			if (rank == 0)
				printf("openmpi %-14s %9zu time_us %10.1f algbw %6.3f busbw %6.3f "
				       "cpu_us %10.1f cores %4.2f\n", ops[o], sizes[s], t * 1e6, alg, bus,
				       cpu, cores);
		}
	MPI_Finalize();
	return 0;
}
