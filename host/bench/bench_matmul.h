/* sgemm peak: `meshrun bench matmul` and the figure the training loop
 * divides by for MFU. */
#ifndef MESHRUN_BENCH_MATMUL_H
#define MESHRUN_BENCH_MATMUL_H

/* `meshrun bench matmul [--threads N] [--size N] [--reps N]`; argv[0] is
 * "matmul". Prints the best GFLOP/s of square sgemm (matmul_forward) and
 * returns an exit code (enum exit_code). */
int bench_matmul_main(int argc, char **argv);

/* Best GFLOP/s of 1024^3 matmul_forward with OpenBLAS set to `threads`
 * (0: as it is) over about `seconds` (at least two calls, the first a
 * warm-up); OpenBLAS's thread count is restored afterwards. Returns 0 if
 * the buffers cannot be allocated. */
double bench_sgemm_peak_gflops(int threads, double seconds);

#endif
