/* `meshrun bench collectives`, the job each agent's devices run: an
 * nccl-tests-style bandwidth table of every collective across real agents,
 * and a correctness sweep used by the tests. */
#ifndef MESHRUN_BENCH_COLL_H
#define MESHRUN_BENCH_COLL_H

#include <stdbool.h>
#include <stddef.h>

#include "host/agent/agent.h"

#define BENCH_MAX_LIST 32

enum bop { B_AG, B_RS, B_AR, B_A2A, B_PERM, B_BCAST, B_NOPS };

extern const char *const bench_coll_op_names[B_NOPS];

struct bench_opts {
	bool all_ops;
	int op;                   /* enum bop when !all_ops */
	int nsizes;
	size_t sizes[BENCH_MAX_LIST];
	int ncounts;              /* > 0: check mode */
	size_t counts[BENCH_MAX_LIST];
	int iters, warmup;
	long direct_max;          /* -1: default */
	bool corrupt;             /* test hook: corrupt one result element */
	bool barrier;             /* a barrier before each timed iteration */
	bool async;               /* the _async forms and coll_wait, where they exist */
	bool lists_only;          /* check mode: only the list forms (a test's
				   * faults land in their messages) */
	bool check_bits;          /* check mode: all_reduce's bits the same on
				   * every rank and on a rerun */
};

/* An agent_job_fn; dev->job_arg is a const struct bench_opts. Global
 * device 0 prints one row per size: size count time_us algbw_GBps
 * busbw_GBps wrong. With ncounts every op runs at those per-rank element
 * counts and every element is verified. 0, or -errno: -EIO if any element
 * was wrong (the first mismatch is printed), -EHOSTDOWN a peer lost. */
int bench_coll_job(struct device_ctx *dev);

#endif
