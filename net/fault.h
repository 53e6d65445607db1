/* Fault injection for drills and tests: a small spec language, parsed
 * into a plan, and the per-link decision the fault point (net/link.c
 * link_fault) asks for every data frame a host sends. Host-level faults
 * (kill, stop at a training step) are parsed here too and asked for by
 * the training job. Grammar and meaning: docs/failures.md.
 *
 *   close:link=A-B:frame=K      close:link=A-B:bytes=N
 *   delay:link=A-B:ms=T[:from=K]
 *   corrupt:link=A-B:frame=K
 *   blackhole:link=A-B:frame=K:s=T
 *   drop:link=A-B:frame=K
 *   halfopen:link=A-B:frame=K[:dir=out|both]
 *   kill:host=H:step=S          stop:host=H:step=S
 *
 * A link fault is host A's: it counts the data frames (CollectiveChunk)
 * A sends to B, from 1, so it fires at the same frame in every run of the
 * same job. */
#ifndef MESHRUN_FAULT_H
#define MESHRUN_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAULT_MAX 16

enum fault_kind {
	FAULT_CLOSE,
	FAULT_DELAY,
	FAULT_CORRUPT,
	FAULT_BLACKHOLE,
	FAULT_DROP,
	FAULT_HALFOPEN,
	FAULT_KILL,
	FAULT_STOP,
};

struct fault_spec {
	enum fault_kind kind;
	int from_host, to_host;        /* link A-B; host H is from_host */
	uint64_t frame;                /* 0: not given */
	uint64_t bytes;                /* close: after this many payload bytes */
	uint64_t hold_ns;              /* delay ms, blackhole s */
	int64_t step;                  /* kill, stop */
	bool both;                     /* halfopen: reads stop too (dir=both) */
	/* progress on its link (net thread only) */
	uint64_t seen_frames, seen_bytes;
	bool fired;
};

/* A job's faults. Zeroed: none. Copied by value into each net, which
 * keeps the counters of its own copy. */
struct fault_plan {
	int n;
	struct fault_spec spec[FAULT_MAX];
};

/* Parses one spec and appends it to p. 0, or -EINVAL with a one-line
 * message naming the spec and what is wrong. num_hosts > 0 also checks
 * the host ids. */
int fault_parse(struct fault_plan *p, const char *spec, int num_hosts, char *err, size_t errlen);

/* What the link must do with the next data frame host self sends to
 * peer, carrying payload bytes. */
struct fault_hit {
	enum fault_kind kind;          /* valid when fault_decide returns true */
	uint64_t frame;                /* the data frame it fired at, from 1 */
	uint64_t hold_ns;              /* delay, blackhole: how long */
	bool first;                    /* a delay's first frame (others repeat) */
	bool both;                     /* halfopen: both directions */
};

/* Counts the frame against every spec of link self-peer; true with *hit
 * when one fires (the first, in spec order). A delay fires at every frame
 * from its `from`; the others once. */
bool fault_decide(struct fault_plan *p, int self, int peer, uint64_t bytes,
		  struct fault_hit *hit);

/* FAULT_KILL or FAULT_STOP if a spec says host must do that as step
 * starts, else -1. */
int fault_host_action(const struct fault_plan *p, int host, int64_t step);

/* "close", "delay", ... */
const char *fault_kind_name(enum fault_kind k);

#endif
