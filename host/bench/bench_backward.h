/* `meshrun bench backward`: what the split backward costs against the
 * full one, for the zero-bubble schedules' F, I and W slots: one layer
 * of each kind of a config's model (dense, MoE) on one device at its
 * microbatch, its forward (F), full backward (B), input-gradient
 * backward (I) and weight-gradient backward (W) timed in the same
 * rounds, and the bytes of its stash beside its saved activations. */
#ifndef MESHRUN_BENCH_BACKWARD_H
#define MESHRUN_BENCH_BACKWARD_H

struct cfg;

/* Times each kind of layer c's model has, with rows sequences of c's
 * length, over rounds rounds (the medians of each call's thread CPU
 * time and wall time, OpenBLAS on one thread), and prints two lines
 * per kind: F, B, I, W in ms, I/B, W/B, (I+W)/B, F:I:W with F = 1 and
 * the stash's bytes, with the weights' inputs copied into the stash and
 * read in place (model_mesh.pipe_w_reads_acts).
 * 0, -EINVAL or -ENOMEM (message printed). */
int bench_backward_run(const struct cfg *c, int rows, int rounds);

#endif
