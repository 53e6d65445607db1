/* `meshrun bench link`: raw TLS throughput between two local agents over
 * the same link code the collectives use, both directions at once. */
#ifndef MESHRUN_BENCH_LINK_H
#define MESHRUN_BENCH_LINK_H

/* argv[0] is "link".
 *   bench link --hosts 2 --sizes 16M[,64K...] [--iters K] [--oneway] [key=value ...]
 * Starts two agents (local_launch); each device of host 0 exchanges
 * messages of every size with the same device of host 1 (a window of
 * several in flight per direction). Host 0 prints a header and one row per
 * size: `size time_us GBps` (bytes, mean microseconds per message, GB/s per
 * direction). --oneway: host 0 only sends and host 1 only receives, for
 * comparison with a single TLS stream. Returns an exit code. */
int bench_link_main(int argc, char **argv);

#endif
