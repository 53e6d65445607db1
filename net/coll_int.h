/* Private to net/coll*.c: one collective fully described (struct coll_args),
 * its execution context (struct coll_run) and the helpers every algorithm
 * uses to post, wait and fail. */
#ifndef MESHRUN_COLL_INT_H
#define MESHRUN_COLL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/coll.h"
#include "net/xport.h"

/* Sends outstanding per collective in the ring and pairwise engines, and
 * receives posted ahead of the oldest unfinished one. Both are deep enough
 * that the net thread always holds queued work: a device thread woken late
 * (the net threads keep the cores busy) must not leave the link idle. */
#define COLL_SEND_WINDOW 8
#define COLL_RECV_AHEAD 64
/* Bytes of sends a pairwise exchange (all-to-all, permute) keeps
 * outstanding at most (at least one send, at most COLL_SEND_WINDOW): a
 * send completes when the peer has it, so this bounds what waits unread
 * in the peer's socket. With 8 MiB (8 segments of 1 MiB) both hosts of a
 * 16 MiB all-to-all sealed their whole block at once, receive queues
 * reached 6.7 MiB and went cold before they were read (a2a18,
 * bench/results/transport.md). MESHRUN_PAIR_SEND_BYTES=0 in the
 * environment lifts the bound, for A/B. */
#define COLL_PAIR_SEND_BYTES (2u << 20)
/* largest group that may use a direct (all-to-all) exchange */
#define COLL_DIRECT_MAX_N 16

struct coll_args {
	uint32_t op;              /* MESHRUN__COLL_OP__* value */
	uint32_t group;
	int n, rank;
	const int *devs;
	uint64_t seq, step;
	void *out;
	const void *in;
	size_t bytes;             /* all_gather: per rank; permute, broadcast: buffer */
	size_t count;             /* reduce_scatter: per rank; all_reduce: buffer */
	int shift, root;
	const size_t *send_bytes, *recv_bytes;
	/* the coll_*_v forms: the buffer is the runs' concatenation (count:
	 * all_reduce's floats), in place; reduce_scatter and all_gather:
	 * block b is counts[b] floats of it */
	bool runs;
	const struct coll_iov *iov;
	int niov;
	const size_t *counts;
	/* the list forms' own block (coll_move): filled before the
	 * collective (all_gather) or its sums added out after it
	 * (reduce_scatter) */
	const struct coll_move *own;
	int nown;
	size_t seg;               /* segment bytes, multiple of 4 */
	size_t direct_max;
	/* all_gather, reduce_scatter and all_reduce on a group of H x D
	 * devices: two levels (coll_hier.c) */
	bool two_level;
	/* the chunk numbers this run's messages use: [chunk_base, chunk_base
	 * + chunk_span) (span 0: all 65536), so the phases of a two-level
	 * collective, which share its group and sequence number, never match
	 * each other's messages */
	uint32_t chunk_base, chunk_span;
	/* a phase of a two-level collective: that collective's op (errors
	 * name it and the phase: across hosts or inside one); 0 otherwise */
	uint32_t parent_op;
	bool inter_phase;
};

/* A growable scratch buffer; one per executing thread of a device. */
struct coll_scratch {
	void *p;
	size_t cap;
};

struct coll_run {
	struct xport *x;
	int me;
	const struct coll_args *a;
	uint64_t deadline;
	struct coll_scratch *scr;
	char *err;
	size_t errlen;
};

/* Runs a (checked) collective to completion on the calling thread. */
int coll_exec(struct coll_run *R);

/* coll_ring.c */
int coll_ring_all_gather(struct coll_run *R);
int coll_ring_reduce_scatter(struct coll_run *R);
int coll_ring_all_reduce(struct coll_run *R);
int coll_chain_broadcast(struct coll_run *R);
int coll_dissemination_barrier(struct coll_run *R);
int coll_ring_all_reduce_v(struct coll_run *R);
int coll_ring_reduce_scatter_v(struct coll_run *R);
int coll_ring_all_gather_v(struct coll_run *R);
/* all_reduce of the runs in blocks of a->counts (a two-level phase) */
int coll_ring_all_reduce_blocks_v(struct coll_run *R);
/* coll_hier.c: whether a two-level form applies (a->two_level, the op,
 * the group H >= 2 hosts x D >= 2 devices, uniform and host-major), and
 * runs it */
bool coll_hier_applies(const struct coll_run *R);
int coll_hier_exec(struct coll_run *R);
/* coll_a2a.c */
int coll_pair_all_to_all(struct coll_run *R);
int coll_pair_permute(struct coll_run *R);

/* ---- helpers (coll_step.c) ---- */
void *coll_scratch_get(struct coll_scratch *s, size_t bytes);
int coll_post_send(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		   const void *buf, size_t len, struct xreq **out);
int coll_post_recv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		   void *buf, size_t len, struct xreq **out);
/* A receive that sums on arrival: buf = received + addend (xport_irecv_add). */
int coll_post_recv_add(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		       float *buf, const float *addend, size_t len, struct xreq **out);
/* One message over runs (xport_isendv / xport_irecvv; sum: adds into
 * the runs in place). */
int coll_post_sendv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		    const struct xrun *runs, int nruns, size_t base, size_t len, struct xreq **out);
int coll_post_recvv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		    const struct xrun *runs, int nruns, size_t base, size_t len, bool sum,
		    struct xreq **out);
/* Waits for *req (NULL: nothing to wait for) with the collective's deadline;
 * sets *req = NULL. */
int coll_wait_req(struct coll_run *R, struct xreq **req);
/* Like coll_wait_req without waiting: -EAGAIN (and *req kept) while it is
 * pending. */
int coll_test_req(struct coll_run *R, struct xreq **req);
/* After an error: abandons every non-NULL request in reqs (the transport is
 * failed first, so nothing more lands in the caller's buffers through a
 * local peer). */
void coll_abandon(struct coll_run *R, struct xreq **reqs, size_t n);
/* Formats "<op> (group g, seq s, step t): <detail>" into R->err, fails the
 * transport with it and returns rc. */
int coll_fail(struct coll_run *R, int rc, const char *detail);

/* A copy done a piece at a time between the passes of a schedule (the own
 * block of all_gather and all_to_all): one 8 MiB copy up front delays the
 * first RecvReady, or keeps a core from the link threads, by over a
 * millisecond. dst and src must not overlap. */
struct coll_copy {
	uint8_t *dst;
	const uint8_t *src;
	size_t len;
};

/* Copies up to chunk bytes (all that is left when chunk is 0). */
void coll_copy_step(struct coll_copy *c, size_t chunk);
/* Runs moves mv[0 .. n): dst = src, or (add) dst += src. */
void coll_moves_run(const struct coll_move *mv, int n, bool add);

#endif
