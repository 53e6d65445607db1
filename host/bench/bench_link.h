/* `meshrun bench link`, the job: raw TLS throughput between two agents
 * over the same link code the collectives use, both directions at once. */
#ifndef MESHRUN_BENCH_LINK_H
#define MESHRUN_BENCH_LINK_H

#include <stdbool.h>
#include <stddef.h>

#include "host/agent/agent.h"
#include "host/bench/bench_coll.h"

struct link_opts {
	int nsizes;
	size_t sizes[BENCH_MAX_LIST];
	int iters;                 /* 0: about 512 MiB per size */
	bool oneway;               /* host 0 sends, host 1 receives */
	bool pingpong;             /* one message at a time, there and back */
};

/* An agent_job_fn for a 2-host mesh; dev->job_arg is a const struct
 * link_opts. Each device of host 0 exchanges messages of every size with
 * the same device of host 1 (a window of several in flight per
 * direction). Host 0 prints a header and one row per size: `size time_us
 * GBps` (bytes, mean microseconds per message, GB/s per direction).
 * oneway: host 0 only sends and host 1 only receives, for comparison with
 * a single TLS stream. 0 or -errno (-EHOSTDOWN a peer lost, -EIO corrupt
 * data). pingpong: one message at a time, host 0 to host 1 and back,
 * each receive posted before the send it waits for; the row is `size
 * oneway_us GBps`, half a round. */
int bench_link_job(struct device_ctx *dev);

#endif
