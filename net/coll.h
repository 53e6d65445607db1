/* Collectives over the point-to-point layer (net/xport.h), gloo style: the
 * algorithms are rank and segment arithmetic over isend/irecv/wait and never
 * touch a socket. Knows nothing about meshes or models: a group is a list of
 * global device ids in ring order (host-major, so ring hops inside a host are
 * memcpy and only block edges cross hosts).
 *
 * SPMD contract: every member of a group calls the same collectives on that
 * group in the same order with matching arguments. Each (device, group id)
 * pair keeps a sequence number that is taken when a collective is issued; it
 * and the group id go into every message tag, so collectives on different
 * groups, or several in flight on one group, never mix. Groups that share a
 * device must have different ids.
 *
 * Results are deterministic: the summation order of every element depends
 * only on the group size, the element count and the options of coll_dev_new,
 * so all_reduce is bit-identical run to run and on every rank.
 *
 * Errors: 0 or a negative errno. -EINVAL for bad arguments (nothing was
 * sent). Any other error means the transport is failed (xport_fail is called
 * so every other waiter on this host fails at once too); err then names the
 * collective, group, sequence number and step, followed by what the
 * transport said (which names the host and address of a lost peer). */
#ifndef MESHRUN_COLL_H
#define MESHRUN_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/xport.h"

struct coll_dev;
struct coll_handle;

/* A group as one member sees it. devs[0..n-1] are global device ids in ring
 * order; devs[rank] is the calling device. id < 65536, equal on every
 * member. devs is only read during the issuing call (it is copied). */
struct coll_group {
	uint32_t id;
	int n;
	int rank;
	const int *devs;
};

/* One per device; used by that device's thread only. Starts the device's
 * communication thread, which runs async collectives in issue order.
 * segment_bytes: ring segment size (rounded down to a multiple of 4, at
 * least 4); timeout_s: deadline of one collective. NULL on failure. */
struct coll_dev *coll_dev_new(struct xport *x, int device_id, size_t segment_bytes,
			      double timeout_s);
/* Waits for queued collectives to finish, stops the thread, frees. */
void coll_dev_free(struct coll_dev *d);
/* Training step recorded in messages and errors of later collectives. */
void coll_set_step(struct coll_dev *d, uint64_t step);
/* Buffers of at most this many bytes (the full buffer: all_gather output,
 * reduce_scatter input, all_reduce buffer) in groups of at most 16 use one
 * direct exchange instead of a ring. Default COLL_DIRECT_MAX_DEFAULT; 0 =
 * always ring. Every member of a group must use the same value (it changes
 * summation order). */
#define COLL_DIRECT_MAX_DEFAULT 65536
void coll_set_direct_max(struct coll_dev *d, size_t bytes);
/* all_gather, reduce_scatter and all_reduce (and their _v forms) on a
 * group of H >= 2 hosts x D >= 2 devices each, uniform and host-major,
 * run in two levels: within each host, then across hosts among the
 * devices of one local index ((H-1)/H of the buffer crosses from a host,
 * not (n-1)/n; docs/collectives.md). Other groups, and an all_gather of
 * a size that is not whole floats, keep the flat ring. Default off.
 * Every member of a group must use the same value (it changes the
 * summation order). */
void coll_set_two_level(struct coll_dev *d, bool on);
/* Whether g is such a group on x's map of devices to hosts (then *hosts
 * and *devices are H and D): the groups coll_set_two_level changes. */
bool coll_two_level_shape(const struct xport *x, const struct coll_group *g, int *hosts,
			  int *devices);

/* out (n * bytes_per_rank) = every rank's in, in rank order. in may be
 * out + rank * bytes_per_rank (in place). */
int coll_all_gather(struct coll_dev *d, const struct coll_group *g, void *out,
		    const void *in, size_t bytes_per_rank, char *err, size_t errlen);
/* out (count_per_rank floats) = sum over ranks of in's block `rank`
 * (in: n * count_per_rank floats). float32 sum. out must not overlap in. */
int coll_reduce_scatter(struct coll_dev *d, const struct coll_group *g, float *out,
			const float *in, size_t count_per_rank, char *err, size_t errlen);
/* buf (count floats, any count including 0) = elementwise sum over ranks. */
int coll_all_reduce(struct coll_dev *d, const struct coll_group *g, float *buf,
		    size_t count, char *err, size_t errlen);
/* ---- lists of runs, in place ----
 * The buffer of these is the concatenation of the runs iov[0 .. niov)
 * (any number of runs, any counts, 0 too), each worked on where it
 * lies: no packing copy and one collective's latency for the whole
 * list. They run the same ring with the same segments and messages as
 * the contiguous op on the concatenation: a segment is cut by size, and
 * one that spans several runs is one message written and landed run by
 * run (xport_isendv), so the sums are bit for bit that op's and the
 * message count does not grow with the runs. iov and counts are only
 * read during the issuing call (copied). */
struct coll_iov {
	float *buf;
	size_t count;
};

/* The concatenation (count floats in all) = elementwise sum over ranks:
 * coll_all_reduce on it. */
int coll_all_reduce_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
		      int niov, char *err, size_t errlen);
/* The concatenation is n blocks, block b counts[b] floats (the same on
 * every rank; their sum the runs' count). On return block `rank` holds
 * the sum over ranks of their block `rank`; the other blocks hold
 * partial sums. The same bits as coll_reduce_scatter over the blocks
 * each padded with zeros to the largest count. */
int coll_reduce_scatter_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
			  int niov, const size_t *counts, char *err, size_t errlen);
/* Blocks as coll_reduce_scatter_v's; block `rank` is this rank's input,
 * and on return block b holds rank b's. */
int coll_all_gather_v(struct coll_dev *d, const struct coll_group *g, const struct coll_iov *iov,
		      int niov, const size_t *counts, char *err, size_t errlen);

/* The own block's copies, done by the collective (on the communication
 * thread for the async forms), so the caller's thread copies nothing: a
 * list all-gather's own block filled from where this rank keeps it, a
 * list reduce-scatter's own sums added into where it keeps them. A move
 * is count floats from src to dst; moves are run in order, element by
 * element in index order, and are copied by the issuing call. */
struct coll_move {
	float *dst;
	const float *src;
	size_t count;
};

/* coll_all_gather_v_async whose own block is filled by the collective:
 * dst = src for each of own[0 .. nown), each float before it is sent.
 * The moves' dsts, one after another, are block `rank`'s floats in
 * order (their counts add up to counts[rank], else -EINVAL), so the
 * ring fills the block a segment ahead of its sends (a two-level or
 * direct one first, whole). The srcs must not be written until
 * coll_wait returns. */
struct coll_handle *coll_all_gather_v_fill_async(struct coll_dev *d, const struct coll_group *g,
						 const struct coll_iov *iov, int niov, const size_t *counts,
						 const struct coll_move *own, int nown, char *err,
						 size_t errlen);
/* coll_reduce_scatter_v_async that, once block `rank` holds its sums and
 * only if the collective succeeded, adds them out: dst[j] += src[j] for
 * each of own[0 .. nown) (the srcs lie in block `rank`; the dsts must
 * not be touched until coll_wait returns). The same bits as the caller
 * adding them after coll_wait. */
struct coll_handle *coll_reduce_scatter_v_add_async(struct coll_dev *d, const struct coll_group *g,
						    const struct coll_iov *iov, int niov, const size_t *counts,
						    const struct coll_move *own, int nown, char *err,
						    size_t errlen);

/* Rank r sends in's block i (send_bytes[i] bytes, blocks packed in rank
 * order) to rank i and receives rank i's block for it into out's block i
 * (recv_bytes[i] bytes, packed in rank order). Zeros allowed; rank i's
 * send_bytes[r] must equal rank r's recv_bytes[i]. Both arrays have n
 * entries and are copied. */
int coll_all_to_all(struct coll_dev *d, const struct coll_group *g, void *out,
		    const size_t *recv_bytes, const void *in, const size_t *send_bytes,
		    char *err, size_t errlen);
/* Sends in to rank (rank + shift) mod n, receives out from rank
 * (rank - shift) mod n; shift may be negative. out must not overlap in. */
int coll_permute(struct coll_dev *d, const struct coll_group *g, void *out,
		 const void *in, size_t bytes, int shift, char *err, size_t errlen);
/* buf on every rank = buf on root (pipelined chain from root). */
int coll_broadcast(struct coll_dev *d, const struct coll_group *g, void *buf,
		   size_t bytes, int root, char *err, size_t errlen);
/* Returns on a rank only after every rank has entered (dissemination). */
int coll_barrier(struct coll_dev *d, const struct coll_group *g, char *err, size_t errlen);

/* Async forms: queue the collective on the device's communication thread
 * and return at once. Buffers must stay untouched until coll_wait returns.
 * Arguments are checked here: NULL with err filled for bad arguments or no
 * memory (nothing was queued and no sequence number was used). Collectives
 * run in issue order, one at a time; a synchronous collective runs on the
 * calling thread and may overlap a queued one. */
struct coll_handle *coll_all_gather_async(struct coll_dev *d, const struct coll_group *g,
					  void *out, const void *in, size_t bytes_per_rank,
					  char *err, size_t errlen);
struct coll_handle *coll_reduce_scatter_async(struct coll_dev *d, const struct coll_group *g,
					      float *out, const float *in,
					      size_t count_per_rank, char *err, size_t errlen);
struct coll_handle *coll_all_reduce_async(struct coll_dev *d, const struct coll_group *g,
					  float *buf, size_t count, char *err, size_t errlen);
struct coll_handle *coll_all_reduce_v_async(struct coll_dev *d, const struct coll_group *g,
					    const struct coll_iov *iov, int niov, char *err, size_t errlen);
struct coll_handle *coll_reduce_scatter_v_async(struct coll_dev *d, const struct coll_group *g,
						const struct coll_iov *iov, int niov, const size_t *counts,
						char *err, size_t errlen);
struct coll_handle *coll_all_gather_v_async(struct coll_dev *d, const struct coll_group *g,
					    const struct coll_iov *iov, int niov, const size_t *counts,
					    char *err, size_t errlen);
/* send_bytes and recv_bytes are copied: the caller may reuse them at once */
struct coll_handle *coll_all_to_all_async(struct coll_dev *d, const struct coll_group *g,
					  void *out, const size_t *recv_bytes, const void *in,
					  const size_t *send_bytes, char *err, size_t errlen);
struct coll_handle *coll_permute_async(struct coll_dev *d, const struct coll_group *g,
				       void *out, const void *in, size_t bytes, int shift,
				       char *err, size_t errlen);

/* Waits for h until deadline_ns (CLOCK_MONOTONIC, xport_now_ns; 0 = just
 * test). Returns the collective's result and frees h; or -EAGAIN (deadline
 * 0, still running: h stays valid). If a non-zero deadline passes first:
 * -ETIMEDOUT, the transport is failed, h is abandoned (the communication
 * thread frees it) and its buffers must stay valid until coll_dev_free. */
int coll_wait(struct coll_handle *h, uint64_t deadline_ns, char *err, size_t errlen);
/* coll_wait that also says when the communication thread ran the
 * collective: from *run_ns to *done_ns (xport_now_ns clock), for a trace
 * of what was in flight; both 0 unless it returned 0 or the collective's
 * own error. Either pointer may be NULL. */
int coll_wait_times(struct coll_handle *h, uint64_t deadline_ns, uint64_t *run_ns, uint64_t *done_ns,
		    char *err, size_t errlen);

/* The most bytes of sends one pairwise exchange (all-to-all, permute) of
 * this process has had outstanding at once (COLL_PAIR_SEND_BYTES bounds
 * it past the first send; tests/check_coll.c checks that). */
size_t coll_pair_send_peak(void);

/* Name of a MESHRUN__COLL_OP__* value ("all_gather", ...), for messages. */
const char *coll_op_name(uint32_t op);

#endif
