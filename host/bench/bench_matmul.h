/* sgemm peak: `meshrun bench matmul` and the figure the training loop
 * divides by for MFU. */
#ifndef MESHRUN_BENCH_MATMUL_H
#define MESHRUN_BENCH_MATMUL_H

/* Prints the best and mean GFLOP/s of square size^3 sgemm
 * (matmul_forward) over reps calls with OpenBLAS set to threads (0: as it
 * is). 0 or -ENOMEM (message printed). */
int bench_matmul_run(int threads, int size, int reps);

/* Best GFLOP/s of 1024^3 matmul_forward with OpenBLAS set to `threads`
 * (0: as it is) over about `seconds` (at least two calls, the first a
 * warm-up); OpenBLAS's thread count is restored afterwards. Returns 0 if
 * the buffers cannot be allocated. */
double bench_sgemm_peak_gflops(int threads, double seconds);

#endif
