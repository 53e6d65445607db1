/* Private to host/train: the communication the training job
 * (train_job.c) hands its trainer. job_coll.c gives the collectives by
 * axis set, in the foreground and the background, on the device's
 * communication threads; job_p2p.c a pipeline's point-to-point messages
 * over the host's transport. Calls go one way: train_job.c calls these
 * two files, they call nothing of it nor each other. Every hook returns
 * 0 or -errno with the context's err: -EHOSTDOWN when a collective or
 * message fails (a peer is gone or its link broke), -ENOMEM. */
#ifndef MESHRUN_JOB_COMM_H
#define MESHRUN_JOB_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/train/train.h"
#include "net/coll.h"


/* A collective group by axis set, made on first use. */
struct axes_group {
	uint32_t axes;
	struct mesh_group *mg;
	struct coll_group cg;
};

#define MAX_AXES_GROUPS 16

/* A point-to-point send not yet waited, by its name. */
struct p2p_send {
	struct xreq *r;
	int dev;
	uint32_t kind, idx;
};

struct job_ctx {
	struct coll_dev *coll;
	/* The batch split's expert exchanges run on a communication thread
	 * of their own (made on first use), so they never queue behind the
	 * FSDP window's gathers and reduce-scatters; their groups take ids
	 * XCHG_GROUP + the mesh group's, apart from those coll uses. */
	struct coll_dev *xcoll;
	size_t segment_bytes;
	bool two_level;             /* coll_two_level */
	const struct mesh *mesh;
	int device;
	struct axes_group grp[MAX_AXES_GROUPS];
	int ngrp;
	char *err;
	size_t errlen;
	struct trace *tr;
	double timeout_s;           /* collective_timeout_s */
	double waited_s;            /* blocked inside collectives so far */
	double bg_s;                /* background collectives ran so far */
	struct agent *agent;        /* byte counters */
	struct xport *xport;
	/* host-level faults (kill, stop): asked by the host's first device */
	const struct fault_plan *faults;
	int host;
	int64_t step;
	struct trainer *t;
	struct p2p_send *sends;     /* point-to-point sends not yet waited */
	int nsends, capsends;
	struct p2p_send posted[16]; /* receives posted by a probe, not yet waited (the executor keeps up to 8) */
	int nposted;
	int held[16];               /* peers owed a send that carries a held RecvReady (job_p2p_probe) */
	int nheld;
};

/* The group over axes, made on first use; NULL (with c->err) when out
 * of memory or of slots. */
const struct coll_group *job_group(struct job_ctx *c, uint32_t axes);

/* Fills comm's collectives (mc; with trace, the model's compute spans
 * too), its exact sum and its background collectives (bg). */
void job_coll_hooks(struct job_ctx *c, bool trace, struct train_comm *comm);

/* Sums doubles over the group of axes, the same way on every member. */
int job_sum(void *vctx, uint32_t axes, double *x, int n);

/* job_sum in the background (train_comm.sum_start, sum_wait). */
int job_sum_start(void *vctx, uint32_t axes, const double *x, int n, void **h);
int job_sum_wait(void *vctx, void *h, double *x);

/* Starts the expert exchanges' communication thread (once). */
int job_start_xcoll(struct job_ctx *c);

/* The pipeline's point-to-point messages (comm.p2p). */
struct pipe_p2p job_p2p_hooks(struct job_ctx *c);

#endif
