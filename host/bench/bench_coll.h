/* `meshrun bench collectives`: nccl-tests-style bandwidth table of every
 * collective across real agents, and a correctness sweep used by the tests. */
#ifndef MESHRUN_BENCH_COLL_H
#define MESHRUN_BENCH_COLL_H

/* argv[0] is "collectives".
 *   bench collectives --hosts N [--devices-per-host D] --op OP|all
 *       --sizes 64K,1M,16M [--iters K] [--warmup W] [key=value ...]
 *   bench collectives --hosts N [--devices-per-host D] --check-counts 0,1,7
 * Launches N local agents (local_launch); each runs the job on its devices
 * (the children run `bench collectives --agent ...`). Global device 0 prints
 * one row per size: size count time_us algbw_GBps busbw_GBps wrong. With
 * --check-counts every op runs at those per-rank element counts and every
 * element is verified. Returns an exit code: non-zero if any element was
 * wrong (the first mismatch is printed). */
int bench_coll_main(int argc, char **argv);

#endif
