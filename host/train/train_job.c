/* The training job every agent runs (`meshrun agent`, `meshrun local`):
 * one trainer per device thread. Its rows of the global batch follow from
 * the axes that split activation_batch; everything else (which weights are
 * gathered per layer, which partial sums are all-reduced, where tokens go)
 * comes from the model's plans (host/mesh/plan.h); this file supplies the
 * collectives by axis set and drives the step loop (host/train/loop.h).
 * Every hook returns 0 or -errno: -EHOSTDOWN when a collective fails (a
 * peer is gone or its link broke), -ENOMEM. Global device 0 prints
 * the step log, writes metrics and checkpoints; on --resume it loads the
 * checkpoint and broadcasts it, so only host 0 needs the directory. */
#include "host/train/train_job.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/mesh/plan.h"
#include "host/train/check.h"
#include "host/train/loop.h"
#include "host/mesh/shard.h"
#include "host/obs/trace.h"
#include "host/util/clock.h"
#include "host/util/threads.h"
#include "net/coll.h"
#include "proto/meshrun.pb-c.h"

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
};

/* Runs a collective call, recording its span and the time spent in it. */
#define SPAN(c, name, call) ({ double t0_ = util_now_s(); int r_ = (call); double t1_ = util_now_s(); \
	(c)->waited_s += t1_ - t0_; trace_span((c)->tr, name, "comm", t0_, t1_); r_; })

/* The group over axes; NULL (with err) when out of memory or slots. */
static const struct coll_group *group_of(struct job_ctx *c, uint32_t axes)
{
	for (int i = 0; i < c->ngrp; i++)
		if (c->grp[i].axes == axes)
			return &c->grp[i].cg;
	struct axes_group *g = &c->grp[c->ngrp];
	if (c->ngrp == MAX_AXES_GROUPS || !(g->mg = malloc(sizeof(*g->mg)))) {
		snprintf(c->err, c->errlen, "train: out of memory for collective groups");
		return NULL;
	}
	mesh_group(c->mesh, c->device, axes, g->mg);
	g->axes = axes;
	g->cg = (struct coll_group){ .id = g->mg->id, .n = g->mg->n, .rank = g->mg->rank,
				     .devs = g->mg->devs };
	c->ngrp++;
	return &g->cg;
}

/* Span names say what moved and over which axes ("all_reduce data"). */
static void span_name(char *out, size_t outlen, const char *op, uint32_t axes)
{
	char a[96];
	plan_mask_text(axes, a, sizeof(a));
	snprintf(out, outlen, "%s %s", op, a);
}

static int job_all_reduce(void *vctx, uint32_t axes, float *buf, size_t n)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	char name[128];
	if (!g)
		return -ENOMEM;
	if (g->n == 1)
		return 0;
	span_name(name, sizeof(name), "all_reduce", axes);
	return SPAN(c, name, coll_all_reduce(c->coll, g, buf, n, c->err, c->errlen)) ? -EHOSTDOWN : 0;
}

static int job_all_gather(void *vctx, uint32_t axes, void *out, const void *in, size_t bytes)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	char name[128];
	if (!g)
		return -ENOMEM;
	if (g->n == 1) {
		memmove(out, in, bytes);
		return 0;
	}
	span_name(name, sizeof(name), "all_gather", axes);
	return SPAN(c, name, coll_all_gather(c->coll, g, out, in, bytes, c->err, c->errlen)) ? -EHOSTDOWN : 0;
}

static int job_reduce_scatter(void *vctx, uint32_t axes, float *out, const float *in, size_t n)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	char name[128];
	if (!g)
		return -ENOMEM;
	if (g->n == 1) {
		memmove(out, in, n * sizeof(float));
		return 0;
	}
	span_name(name, sizeof(name), "reduce_scatter", axes);
	return SPAN(c, name, coll_reduce_scatter(c->coll, g, out, in, n, c->err, c->errlen)) ? -EHOSTDOWN : 0;
}

static int job_all_to_all(void *vctx, uint32_t axes, void *out, const size_t *recv_bytes,
			  const void *in, const size_t *send_bytes)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	char name[128];
	if (!g)
		return -ENOMEM;
	span_name(name, sizeof(name), "all_to_all", axes);
	return SPAN(c, name, coll_all_to_all(c->coll, g, out, recv_bytes, in, send_bytes, c->err,
					     c->errlen)) ? -EHOSTDOWN : 0;
}

/* Background collectives (FSDP's prefetch, the batch split's expert
 * exchanges): queued on a communication thread of the device's. The
 * trace gets the time spent waiting (cat "comm", "wait " and the model's
 * name when it gave one) and, on that thread's row, when it ran it (cat
 * "flight"). */
struct job_pending {
	struct coll_handle *h;
	char name[160];
	bool named;
	bool xchg;              /* on the exchanges' thread */
	double t_issue;         /* util_now_s() when queued */
};

/* h: from coll_*_async, queued at t_issue (util_now_s() taken before the
 * call: the thread may start it before the call returns). */
static int job_start(struct job_ctx *c, double t_issue, struct coll_handle *h, const char *op, uint32_t axes,
		     const char *name, void **out)
{
	if (!h)
		return -EIO;            /* c->err says why */
	struct job_pending *p = malloc(sizeof(*p));
	if (!p) {
		coll_wait(h, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9), c->err, c->errlen);
		snprintf(c->err, c->errlen, "train: out of memory");
		return -ENOMEM;
	}
	p->h = h;
	p->named = name != NULL;
	p->xchg = false;
	if (name)
		snprintf(p->name, sizeof(p->name), "%s", name);
	else
		span_name(p->name, sizeof(p->name), op, axes);
	p->t_issue = t_issue;
	*out = p;
	return 0;
}

static int job_start_all_gather(void *vctx, uint32_t axes, void *out, const void *in, size_t bytes, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	if (!g)
		return -ENOMEM;
	double t = util_now_s();
	return job_start(c, t, coll_all_gather_async(c->coll, g, out, in, bytes, c->err, c->errlen),
			 "all_gather (prefetch)", axes, NULL, h);
}

static int job_start_reduce_scatter(void *vctx, uint32_t axes, float *out, const float *in, size_t n, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	if (!g)
		return -ENOMEM;
	double t = util_now_s();
	return job_start(c, t, coll_reduce_scatter_async(c->coll, g, out, in, n, c->err, c->errlen),
			 "reduce_scatter (background)", axes, NULL, h);
}

/* The FSDP window's collectives over a list of every member's runs, in
 * place: a layer group's gather straight into its window (op all_gather)
 * and its gradients' reduce-scatter out of it. */
static int job_start_win_v(struct job_ctx *c, uint32_t op, uint32_t axes, const struct model_run *run,
			   int nrun, const size_t *counts, void **h)
{
	const struct coll_group *g = group_of(c, axes);
	if (!g)
		return -ENOMEM;
	struct coll_iov *iov = malloc(sizeof(*iov) * (size_t)(nrun + 1));
	if (!iov) {
		snprintf(c->err, c->errlen, "train: out of memory for a list of %d runs", nrun);
		return -ENOMEM;
	}
	for (int i = 0; i < nrun; i++)
		iov[i] = (struct coll_iov){ run[i].buf, run[i].n };
	double t = util_now_s();
	bool ag = op == MESHRUN__COLL_OP__COLL_ALL_GATHER;
	struct coll_handle *ch = ag ? coll_all_gather_v_async(c->coll, g, iov, nrun, counts, c->err, c->errlen)
				    : coll_reduce_scatter_v_async(c->coll, g, iov, nrun, counts, c->err, c->errlen);
	free(iov);  /* copied by the call */
	return job_start(c, t, ch, ag ? "all_gather (prefetch)" : "reduce_scatter (background)", axes,
			 NULL, h);
}

static int job_start_all_gather_v(void *vctx, uint32_t axes, const struct model_run *run, int nrun,
				  const size_t *counts, void **h)
{
	return job_start_win_v(vctx, MESHRUN__COLL_OP__COLL_ALL_GATHER, axes, run, nrun, counts, h);
}

static int job_start_reduce_scatter_v(void *vctx, uint32_t axes, const struct model_run *run, int nrun,
				      const size_t *counts, void **h)
{
	return job_start_win_v(vctx, MESHRUN__COLL_OP__COLL_REDUCE_SCATTER, axes, run, nrun, counts, h);
}

#define XCHG_GROUP 0x4000u  /* above every mesh group id (axis masks), below P2P_GROUP */

/* The expert exchanges' communication thread, started on first use (or
 * before the device thread raises its nice value: it inherits it). */
static int start_xcoll(struct job_ctx *c)
{
	if (c->xcoll)
		return 0;
	c->xcoll = coll_dev_new(c->xport, c->device, c->segment_bytes, c->timeout_s);
	if (!c->xcoll) {
		snprintf(c->err, c->errlen, "train: unable to start the expert exchanges' communication thread");
		return -EAGAIN;
	}
	coll_set_step(c->xcoll, (uint64_t)c->step);
	return 0;
}

static int job_start_all_to_all(void *vctx, uint32_t axes, void *out, const size_t *recv_bytes,
				const void *in, const size_t *send_bytes, const char *name, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	if (!g)
		return -ENOMEM;
	int rc = start_xcoll(c);
	if (rc)
		return rc;
	struct coll_group x = *g;
	x.id += XCHG_GROUP;
	double t = util_now_s();
	rc = job_start(c, t, coll_all_to_all_async(c->xcoll, &x, out, recv_bytes, in, send_bytes, c->err,
						    c->errlen), "all_to_all", axes, name, h);
	if (!rc)
		((struct job_pending *)*h)->xchg = true;
	return rc;
}

/* The optimizer's background collectives (host/optim/optim.h, struct
 * optim_bg): queued on the communication thread, named by their
 * layers, waited for by job_wait; h from coll_*_async. */
static int job_bg_start(struct job_ctx *c, double t_issue, struct coll_handle *h, const char *op, uint32_t axes,
			const char *name, void **out)
{
	int rc = job_start(c, t_issue, h, op, axes, name, out);
	if (!rc)  /* its wait span carries the bucket's name alone */
		((struct job_pending *)*out)->named = false;
	return rc;
}

/* The gradient buckets' collectives (optim_bg), named by their layers:
 * one over each bucket's list of runs, in place (coll_*_v); a group of
 * one has nothing to move. */
static int job_bg_v(struct job_ctx *c, uint32_t op, uint32_t axes, float *base, const struct optim_run *run,
		    int nrun, const size_t *counts, const char *name, void **h)
{
	const struct coll_group *g = group_of(c, axes);
	*h = NULL;
	if (!g)
		return -ENOMEM;
	if (g->n == 1)
		return 0;
	struct coll_iov *iov = malloc(sizeof(*iov) * (size_t)(nrun + 1));
	if (!iov) {
		snprintf(c->err, c->errlen, "train: out of memory");
		return -ENOMEM;
	}
	for (int i = 0; i < nrun; i++)
		iov[i] = (struct coll_iov){ base + run[i].off, run[i].n };
	double t = util_now_s();
	struct coll_handle *ch;
	if (op == MESHRUN__COLL_OP__COLL_ALL_REDUCE)
		ch = coll_all_reduce_v_async(c->coll, g, iov, nrun, c->err, c->errlen);
	else if (op == MESHRUN__COLL_OP__COLL_REDUCE_SCATTER)
		ch = coll_reduce_scatter_v_async(c->coll, g, iov, nrun, counts, c->err, c->errlen);
	else
		ch = coll_all_gather_v_async(c->coll, g, iov, nrun, counts, c->err, c->errlen);
	free(iov);  /* copied by the call */
	return job_bg_start(c, t, ch, coll_op_name(op), axes, name, h);
}

static int job_bg_all_reduce_v(void *vctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
			       const char *name, void **h)
{
	return job_bg_v(vctx, MESHRUN__COLL_OP__COLL_ALL_REDUCE, axes, base, run, nrun, NULL, name, h);
}

static int job_bg_reduce_scatter_v(void *vctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
				   const size_t *counts, const char *name, void **h)
{
	return job_bg_v(vctx, MESHRUN__COLL_OP__COLL_REDUCE_SCATTER, axes, base, run, nrun, counts, name, h);
}

static int job_bg_all_gather_v(void *vctx, uint32_t axes, float *base, const struct optim_run *run, int nrun,
			       const size_t *counts, const char *name, void **h)
{
	return job_bg_v(vctx, MESHRUN__COLL_OP__COLL_ALL_GATHER, axes, base, run, nrun, counts, name, h);
}

/* Waits for a background collective (the FSDP window's or a gradient
 * bucket's): the time blocked is a "comm" span; on the flight track,
 * how long it sat in the queue ("q " and its name) and when the
 * communication thread ran it (its name). */
static int job_wait(void *vctx, void *vh)
{
	struct job_ctx *c = vctx;
	struct job_pending *p = vh;
	uint64_t run = 0, done = 0;
	char wait[192];
	snprintf(wait, sizeof(wait), "%s%s", p->named ? "wait " : "", p->name);
	int rc = SPAN(c, wait, coll_wait_times(p->h, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9),
					       &run, &done, c->err, c->errlen));
	if (!rc && run && done) {  /* the same clock as util_now_s */
		c->bg_s += (double)(done - run) * 1e-9;
		if (!p->xchg) {  /* the exchanges' row holds their flights only */
			char q[24];
			snprintf(q, sizeof(q), "q %.21s", p->name);
			trace_flight(c->tr, 1, q, p->t_issue, (double)run * 1e-9);
		}
		trace_flight(c->tr, p->xchg ? 2 : 1, p->name, (double)run * 1e-9, (double)done * 1e-9);
	}
	free(p);
	return rc ? -EHOSTDOWN : 0;
}

static void job_span(void *vctx, const char *name, double t0, double t1)
{
	trace_span(((struct job_ctx *)vctx)->tr, name, "compute", t0, t1);
}

/* Sums doubles over a group exactly the same way on every member:
 * gathered, then added in rank order. */
static int job_sum(void *vctx, uint32_t axes, double *x, int n)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = group_of(c, axes);
	if (!g)
		return -ENOMEM;
	if (g->n == 1)
		return 0;
	double *all = malloc(sizeof(double) * (size_t)n * g->n);
	if (!all) {
		snprintf(c->err, c->errlen, "train: out of memory");
		return -ENOMEM;
	}
	/* timed but not traced: the trace shows the model's collectives */
	double t0 = util_now_s();
	int rc = coll_all_gather(c->coll, g, all, x, sizeof(double) * n, c->err, c->errlen);
	c->waited_s += util_now_s() - t0;
	for (int i = 0; !rc && i < n; i++) {
		double s = 0;
		for (int r = 0; r < g->n; r++)
			s += all[(size_t)r * n + i];
		x[i] = s;
	}
	free(all);
	return rc ? -EHOSTDOWN : 0;
}

/* Point-to-point messages of a pipeline: their own group id (above any
 * mesh group's, which are axis masks), the step and kind in the sequence
 * number, the index as the chunk. */
#define P2P_GROUP 0xfff0u

static struct xmeta p2p_meta(const struct job_ctx *c, uint32_t kind, uint32_t idx)
{
	return (struct xmeta){ .op = MESHRUN__COLL_OP__COLL_P2P, .group = P2P_GROUP,
			       .seq = ((uint64_t)c->step << 3) | (kind & 7), .step = (uint64_t)c->step,
			       .chunk = idx & 0xffff };
}

/* The trace's row of point-to-point messages (a flight lane of the
 * device): per message of kind/idx, "s"/"r" from the send's or receive's
 * post to its completion, and "sn"/"rn" from when the net layer took it
 * (a send: its receive was posted at the peer; a receive: its data began
 * to arrive) to the same end; "sc" the send call itself. Taken from the
 * request the thread's last xport_wait completed. */
#define P2P_LANE 3

static const char *p2p_kind(uint32_t kind)
{
	return kind == 2 ? "act" : kind == 5 ? "grad" : "io";
}

static void p2p_flight(struct job_ctx *c, bool send, uint32_t kind, uint32_t idx)
{
	struct xtimes t = xport_last_times();
	char name[24];
	if (!c->tr || !t.done_ns)
		return;
	snprintf(name, sizeof(name), "%s %s %u", send ? "s" : "r", p2p_kind(kind), idx);
	trace_flight(c->tr, P2P_LANE, name, t.issued_ns * 1e-9, t.done_ns * 1e-9);
	if (!t.net_ns)
		return;
	snprintf(name, sizeof(name), "%s %s %u", send ? "sn" : "rn", p2p_kind(kind), idx);
	trace_flight(c->tr, P2P_LANE, name, t.net_ns * 1e-9, t.done_ns * 1e-9);
}

static int job_p2p_send(void *vctx, int dev, uint32_t kind, uint32_t idx, const void *buf, size_t bytes)
{
	struct job_ctx *c = vctx;
	struct xmeta m = p2p_meta(c, kind, idx);
	struct xreq *r;
	if (c->nsends == c->capsends) {
		int cap = c->capsends ? 2 * c->capsends : 64;
		struct p2p_send *n = realloc(c->sends, sizeof(*n) * (size_t)cap);
		if (!n) {
			snprintf(c->err, c->errlen, "train: out of memory");
			return -ENOMEM;
		}
		c->sends = n;
		c->capsends = cap;
	}
	double t0 = util_now_s(), c0 = c->tr ? util_thread_cpu_s() : 0;
	int rc = xport_isend(c->xport, c->device, dev, &m, buf, bytes, &r);
	if (rc) {
		xport_failed(c->xport, c->err, c->errlen);
		return rc == -ENOMEM ? rc : -EHOSTDOWN;
	}
	if (c->tr) {  /* the call on the device row with its CPU (encrypting and
		       * writing, when it writes), and on the p2p row */
		double t1 = util_now_s(), cpu = util_thread_cpu_s() - c0;
		char name[24];
		snprintf(name, sizeof(name), "stage send %s %u", p2p_kind(kind), idx);
		trace_span_cpu(c->tr, name, "comm", t0, t1, cpu);
		snprintf(name, sizeof(name), "sc %s %u", p2p_kind(kind), idx);
		trace_flight(c->tr, P2P_LANE, name, t0, t1);
	}
	c->sends[c->nsends++] = (struct p2p_send){ .r = r, .dev = dev, .kind = kind, .idx = idx };
	return 0;
}

/* A receive a probe posted (r NULL: it has arrived): taken out of
 * c->posted; false when there is none. */
static bool take_posted(struct job_ctx *c, int dev, uint32_t kind, uint32_t idx, struct xreq **r)
{
	for (int i = 0; i < c->nposted; i++) {
		struct p2p_send *p = &c->posted[i];
		if (p->dev != dev || p->kind != kind || p->idx != idx)
			continue;
		*r = p->r;
		*p = c->posted[--c->nposted];
		return true;
	}
	*r = NULL;
	return false;
}

/* Posts the receive (once) and tests it without waiting; the recv after
 * it takes the posted one. */
static int job_p2p_probe(void *vctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes)
{
	struct job_ctx *c = vctx;
	struct xmeta m = p2p_meta(c, kind, idx);
	struct xreq *r;
	int rc = 0;
	if (take_posted(c, dev, kind, idx, &r) && !r) {
		c->posted[c->nposted++] = (struct p2p_send){ .dev = dev, .kind = kind, .idx = idx };
		return 1;
	}
	if (!r && c->nposted == (int)(sizeof(c->posted) / sizeof(c->posted[0])))
		return 1;  /* no room: not filled, the recv posts it */
	double t0 = util_now_s(), c0 = c->tr ? util_thread_cpu_s() : 0;
	if (!r && (rc = xport_irecv(c->xport, dev, c->device, &m, buf, bytes, &r))) {
		xport_failed(c->xport, c->err, c->errlen);
		return rc == -ENOMEM ? rc : -EHOSTDOWN;
	}
	rc = xport_test(r, c->err, c->errlen);
	if (rc && rc != -EAGAIN)
		return -EHOSTDOWN;  /* abandoned: the transport failed */
	if (!rc)
		p2p_flight(c, false, kind, idx);
	if (c->tr) {  /* posting (and testing: it may read the link) */
		char name[24];
		snprintf(name, sizeof(name), "stage post %s %u", p2p_kind(kind), idx);
		trace_span_cpu(c->tr, name, "comm", t0, util_now_s(), util_thread_cpu_s() - c0);
	}
	c->posted[c->nposted++] = (struct p2p_send){ .r = rc ? r : NULL, .dev = dev, .kind = kind, .idx = idx };
	return !rc;
}

static int job_p2p_recv(void *vctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes)
{
	struct job_ctx *c = vctx;
	struct xmeta m = p2p_meta(c, kind, idx);
	struct xreq *r;
	bool probed = take_posted(c, dev, kind, idx, &r);
	double t0 = util_now_s(), c0 = c->tr ? util_thread_cpu_s() : 0;
	int rc = probed ? 0 : xport_irecv(c->xport, dev, c->device, &m, buf, bytes, &r);
	if (rc)
		xport_failed(c->xport, c->err, c->errlen);
	else if (r && !(rc = xport_wait(r, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9), c->err,
					 c->errlen)))  /* r NULL: a probe saw it arrive */
		p2p_flight(c, false, kind, idx);
	double t1 = util_now_s();
	c->waited_s += t1 - t0;
	if (c->tr) {  /* its wall is the wait; its CPU the thread's work in it
		       * (polling the link: reading, decrypting) */
		char name[24];
		snprintf(name, sizeof(name), "stage recv %s %u", p2p_kind(kind), idx);
		trace_span_cpu(c->tr, name, "comm", t0, t1, util_thread_cpu_s() - c0);
	}
	return rc ? (rc == -ENOMEM ? rc : -EHOSTDOWN) : 0;
}

/* Waits for one send of this step (the executor reuses its buffer). */
static int job_p2p_wait_send(void *vctx, int dev, uint32_t kind, uint32_t idx)
{
	struct job_ctx *c = vctx;
	for (int i = 0; i < c->nsends; i++) {
		struct p2p_send *p = &c->sends[i];
		if (p->dev != dev || p->kind != kind || p->idx != idx)
			continue;
		double t0 = util_now_s(), c0 = c->tr ? util_thread_cpu_s() : 0;
		int rc = xport_wait(p->r, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9), c->err, c->errlen);
		if (!rc)
			p2p_flight(c, true, kind, idx);
		*p = c->sends[--c->nsends];
		c->waited_s += util_now_s() - t0;
		if (c->tr)
			trace_span_cpu(c->tr, "stage send wait", "comm", t0, util_now_s(), util_thread_cpu_s() - c0);
		return rc ? -EHOSTDOWN : 0;
	}
	return 0;
}

static int job_p2p_flush(void *vctx)
{
	struct job_ctx *c = vctx;
	int rc = 0;
	double t0 = util_now_s(), c0 = c->tr ? util_thread_cpu_s() : 0;
	for (int i = 0; i < c->nsends; i++) {
		int r = xport_wait(c->sends[i].r, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9),
				   rc ? NULL : c->err, rc ? 0 : c->errlen);
		if (!r)
			p2p_flight(c, true, c->sends[i].kind, c->sends[i].idx);
		if (r && !rc)
			rc = -EHOSTDOWN;
	}
	c->nsends = 0;
	/* a receive probed and never waited: only after a failed step */
	for (int i = 0; i < c->nposted; i++)
		if (c->posted[i].r)
			xport_wait(c->posted[i].r, 1, NULL, 0);
	c->nposted = 0;
	c->waited_s += util_now_s() - t0;
	if (c->tr)
		trace_span_cpu(c->tr, "stage send wait", "comm", t0, util_now_s(), util_thread_cpu_s() - c0);
	return rc;
}

/* Resume: device 0 loaded the checkpoint (whole tensors, the step and
 * the data position); every device takes it, then its own shards. */
static int broadcast_state(struct trainer *t, struct job_ctx *jc, const struct coll_group *all,
			   int64_t *start, char *err, size_t errlen)
{
	struct ckpt_state cs;
	trainer_ckpt_state(t, &cs, *start);
	size_t n = cs.numel;
	int64_t s[3] = { *start, cs.data_sample, cs.data_epoch_rows };
	if (coll_broadcast(jc->coll, all, cs.params, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, cs.m, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, cs.v, n * sizeof(float), 0, err, errlen) ||
	    coll_broadcast(jc->coll, all, s, sizeof(s), 0, err, errlen))
		return -EHOSTDOWN;
	*start = s[0];
	int rc = trainer_seek_data(t, s[0], s[1], s[2], err, errlen);
	return rc ? rc : trainer_ckpt_scatter(t, err, errlen);
}

/* Gathers every device's spans to device 0, which writes the file. */
static int write_trace(struct device_ctx *dev, struct job_ctx *rc, const struct coll_group *all,
		       const char *path, char *err, size_t errlen)
{
	int n = all->n, ret = 0;
	bool leader = dev->device_id == 0;
	int *counts = calloc((size_t)n, sizeof(int)), *host_of = calloc((size_t)n, sizeof(int));
	struct trace_event *ev = malloc(sizeof(*ev) * TRACE_MAX_EVENTS * (size_t)n);
	if (!counts || !host_of || !ev) {
		snprintf(err, errlen, "train: out of memory for the trace");
		ret = -ENOMEM;
		goto out;
	}
	if (coll_all_gather(rc->coll, all, counts, &rc->tr->n, sizeof(int), err, errlen) ||
	    coll_all_gather(rc->coll, all, ev, rc->tr->ev, sizeof(*ev) * TRACE_MAX_EVENTS, err, errlen)) {
		ret = -EHOSTDOWN;
		goto out;
	}
	for (int i = 0; i < n; i++)
		host_of[i] = mesh_host_of(dev->mesh, all->devs[i]);
	/* a trace file that cannot be written fails the job with its errno */
	if (leader)
		ret = trace_write(path, ev, counts, host_of, n, err, errlen);
out:
	free(counts);
	free(host_of);
	free(ev);
	return ret;
}

/* A kill or stop fault for this host at this step: the whole agent
 * process gets SIGKILL or SIGSTOP, as a crash or a hang would. */
static void host_fault(const struct job_ctx *c, int64_t step)
{
	int a = c->faults ? fault_host_action(c->faults, c->host, step) : -1;
	if (a < 0)
		return;
	fprintf(stderr, "meshrun: host %d: fault: injected %s on host %d at step %" PRId64 "\n",
		c->host, fault_kind_name((enum fault_kind)a), c->host, step);
	fflush(stderr);
	raise(a == FAULT_KILL ? SIGKILL : SIGSTOP);
}

static void job_step_begin(void *vctx, int64_t step)
{
	struct job_ctx *c = vctx;
	host_fault(c, step);
	coll_set_step(c->coll, (uint64_t)step);
	if (c->xcoll)
		coll_set_step(c->xcoll, (uint64_t)step);
	c->step = step;
	if (c->tr)
		c->tr->step = step;
}

static void job_step_end(void *vctx, const struct step_stats *st, double t0, double t1)
{
	struct job_ctx *c = vctx;
	trace_span_cpu(c->tr, "forward+backward", "compute", st->t_fb0, st->t_fb1, st->cpu_fb);
	/* the executor's compute actions, each its span (F, B, I, W of a
	 * microbatch and chunk; the owners' embed, head, embed_back; without
	 * a pipeline chunk c is layer c, so each layer's forward and backward
	 * is a span) */
	struct pipe_exec *px = c->t ? trainer_pipe(c->t) : NULL;
	int n = 0;
	const struct pipe_act_time *pt = px && c->tr ? pipe_exec_times(px, &n) : NULL;
	for (int i = 0; i < n; i++) {
		char name[32];
		if (pt[i].op == PA_EMBED || pt[i].op == PA_HEAD || pt[i].op == PA_EMBED_BACK)
			snprintf(name, sizeof(name), "%s mb%d", pipe_act_name(pt[i].op), pt[i].mb);
		else
			snprintf(name, sizeof(name), "%s mb%d c%d", pipe_act_name(pt[i].op), pt[i].mb, pt[i].chunk);
		trace_span_cpu(c->tr, name, "pipeline", pt[i].t0, pt[i].t1, pt[i].cpu);
	}
	trace_span(c->tr, "optimizer", "compute", st->t_opt0, st->t_opt1);
	trace_span(c->tr, "step", "step", t0, t1);
}

static void job_bytes(void *vctx, uint64_t *dcn, uint64_t *ici, uint64_t *msgs)
{
	struct job_ctx *c = vctx;
	*dcn = agent_dcn_bytes_sent(c->agent);
	*ici = xport_local_bytes(c->xport);
	*msgs = xport_messages(c->xport);
}

static void job_recovery(void *vctx, uint64_t *reconnects, uint64_t *resent)
{
	struct job_ctx *c = vctx;
	*reconnects = agent_reconnects(c->agent);
	*resent = agent_frames_resent(c->agent);
}

static double job_waited(void *vctx)
{
	return ((struct job_ctx *)vctx)->waited_s;
}

static double job_background(void *vctx)
{
	return ((struct job_ctx *)vctx)->bg_s;
}

/* The one line device 0 prints at the end. */
static void print_finished(const struct device_ctx *dev, const struct train_loop *l, int64_t start,
			   double seconds)
{
	const struct cfg *c = dev->cfg;
	const char *dir = l->opts->ckpt_dir;
	char mesh[256] = "";
	size_t used = 0;
	for (int a = 0; a < AX_COUNT; a++)
		if (dev->mesh->size[a] > 1)
			used += snprintf(mesh + used, sizeof(mesh) - used, "%s%s=%d", used ? " " : "",
					 mesh_axis_names[a], dev->mesh->size[a]);
	printf("finished: %" PRId64 " steps on %d hosts x %d devices (%s), loss %.4f -> %.4f, %.1f s%s%s\n",
	       (int64_t)(c->steps - start), dev->mesh->num_hosts, dev->mesh->devices_per_host,
	       used ? mesh : "one device", l->first_loss, l->last_loss, seconds,
	       dir ? ", checkpoint in " : "", dir ? dir : "");
	fflush(stdout);
}

/* load_parameters_path: this device's shards of the weights (the host's
 * devices one at a time, each block read once per host); host's first
 * device says what the host read. Every device of the host gets here
 * (train_job's exit calls hf_src_done for one that failed before). */
static int load_weights(struct device_ctx *dev, struct hf_src *src, struct trainer *t, char *err,
			size_t errlen)
{
	struct model *m = trainer_model(t);
	int rc = hf_src_done(src, hf_src_load(src, m, model_params(m), err, errlen), err, errlen);
	if (!rc && dev->local_index == 0) {
		char line[1024];
		hf_src_summary(src, line, sizeof(line));
		printf("meshrun: host %d: %s\n", dev->host_id, line);
		fflush(stdout);
	}
	return rc;
}

/* Resume, on any mesh. When every host opened the same save as host 0
 * (a shared file system), each device reads its own shards of it;
 * otherwise (the checkpoint is on host 0's disk alone) device 0 reads it
 * whole and broadcasts it, and every device takes its shards. */
static int resume(struct device_ctx *dev, struct trainer *t, struct job_ctx *jc,
		  const struct coll_group *all, const struct train_opts *o, int64_t *start, char *err,
		  size_t errlen)
{
	struct ckpt_resume *src = o->resume_from;
	bool leader = dev->device_id == 0;
	uint64_t id = leader && src ? ckpt_resume_id(src) : 0;
	double missing;
	int rc;
	if (coll_broadcast(jc->coll, all, &id, sizeof(id), 0, err, errlen))
		return -EHOSTDOWN;
	missing = src && id && ckpt_resume_id(src) == id ? 0 : 1;
	if ((rc = job_sum(jc, (1u << AX_COUNT) - 1, &missing, 1)))
		return rc;
	if (missing == 0) {
		int64_t sample, epoch_rows;
		if ((rc = trainer_resume_read(t, src, err, errlen)))
			return rc;
		*start = ckpt_resume_step(src);
		ckpt_resume_data_pos(src, &sample, &epoch_rows);
		if ((rc = trainer_seek_data(t, *start, sample, epoch_rows, err, errlen)))
			return rc;
		if (dev->local_index == 0) {
			char line[1024];
			ckpt_resume_summary(src, line, sizeof(line));
			printf("meshrun: host %d: %s\n", dev->host_id, line);
			fflush(stdout);
		}
		return 0;
	}
	if (leader)
		fprintf(stderr, "meshrun: host 0: resume: %.0f device%s cannot read this checkpoint where "
			"host 0 does: host 0 reads it whole and sends it\n", missing, missing == 1 ? "" : "s");
	rc = trainer_ckpt_prepare(t, err, errlen);
	if (!rc && leader)
		rc = trainer_load(t, o->ckpt_dir, start, err, errlen);
	if (!rc)
		rc = broadcast_state(t, jc, all, start, err, errlen);
	return rc;
}

/* The device computes at device_nice (or under device_batch); the threads
 * that move bytes must not inherit it, so an MoE model's exchange thread
 * starts first. A setting the system refuses is said, not fatal. */
static int device_priority(struct device_ctx *dev, struct job_ctx *jc)
{
	const struct cfg *c = dev->cfg;
	int rc;
	if ((c->device_nice > 0 || c->device_batch) && c->num_experts > 1 && (rc = start_xcoll(jc)))
		return rc;
	if ((rc = util_device_nice(c)))
		fprintf(stderr, "meshrun: device %d: device_nice=%lld%s not applied (%s); computing at "
			"nice %d\n", dev->device_id, c->device_nice, c->device_batch ? " device_batch=true" : "",
			strerror(-rc), util_thread_nice());
	return 0;
}

int train_job(struct device_ctx *dev)
{
	const struct train_opts *o = dev->job_arg;
	const struct cfg *c = dev->cfg;
	char *err = dev->err;
	size_t errlen = sizeof(dev->err);
	struct job_ctx jc = { .mesh = dev->mesh, .device = dev->device_id, .err = err, .errlen = errlen,
			      .timeout_s = c->collective_timeout_s, .agent = dev->agent,
			      .segment_bytes = (size_t)c->segment_bytes,
			      .xport = dev->xport };
	struct shard_rules *rules = NULL;
	struct trainer *t = NULL;
	struct steplog log = { 0 };
	int ret = 0;
	int64_t start = 0;
	bool leader = dev->device_id == 0, loaded = false;
	uint32_t rows = 0;

	/* everything the trainer would refuse, before anything is made */
	struct fault_plan faults;
	if ((ret = train_check(c, dev->mesh, err, errlen)) ||
	    (ret = agent_faults(c, dev->mesh->num_hosts, &faults, err, errlen)))
		goto out;
	if (dev->local_index == 0)
		jc.faults = &faults;
	jc.host = dev->host_id;
	rules = malloc(sizeof(*rules));
	if (!rules) {
		snprintf(err, errlen, "train: out of memory");
		ret = -ENOMEM;
		goto out;
	}
	struct model_mesh mm = { .mesh = dev->mesh, .rules = rules, .device = dev->device_id };
	if (shard_rules_from_cfg(rules, c, err, errlen) ||
	    model_plan_rows(&mm, (int)c->base_emb_dim, &rows, err, errlen)) {
		ret = -EINVAL;
		goto out;
	}
	jc.coll = coll_dev_new(dev->xport, dev->device_id, (size_t)c->segment_bytes, c->collective_timeout_s);
	if (!jc.coll) {
		snprintf(err, errlen, "train: unable to start the communication thread");
		ret = -EAGAIN;
		goto out;
	}
	if ((ret = device_priority(dev, &jc)))
		goto out;
	const struct coll_group *rg = group_of(&jc, rows), *allg = group_of(&jc, (1u << AX_COUNT) - 1);
	if (!rg || !allg) {
		ret = -ENOMEM;
		goto out;
	}
	struct coll_group all = *allg;
	/* global batch = per_device_batch_size x every device (as in MaxText),
	 * split over the devices that split the rows; the others (tensor,
	 * tensor_transpose) share theirs */
	int global_rows = (int)c->per_device_batch_size * dev->mesh->num_devices;
	int B = global_rows / rg->n, row0 = rg->rank * B;
	if ((ret = trainer_open(&t, c, B, &mm, err, errlen)))
		goto out;
	if (o->weights) {
		ret = load_weights(dev, o->weights, t, err, errlen);
		loaded = true;
		if (ret)
			goto out;
	}
	jc.t = t;
	/* test hook: an idle pipeline slot that read its buffers would see NaN */
	if (trainer_pipe(t) && getenv("MESHRUN_TEST_PIPE_POISON"))
		pipe_exec_poison(trainer_pipe(t), 1);
	/* every device starts from the same weights (init is a function of each
	 * element's global index); on resume, from device 0's checkpoint */
	if (o->resume && (ret = resume(dev, t, &jc, &all, o, &start, err, errlen)))
		goto out;
	if (leader && (ret = train_log_open(&log, o, t, dev->mesh->num_devices, err, errlen)))
		goto out;

	struct train_comm comm = {
		.mc = { .all_reduce = job_all_reduce, .all_gather = job_all_gather,
			.reduce_scatter = job_reduce_scatter, .all_to_all = job_all_to_all,
			.start_all_gather = job_start_all_gather,
			.start_reduce_scatter = job_start_reduce_scatter,
			.start_all_gather_v = job_start_all_gather_v,
			.start_reduce_scatter_v = job_start_reduce_scatter_v,
			.start_all_to_all = job_start_all_to_all, .wait = job_wait,
			.span = o->trace ? job_span : NULL, .ctx = &jc, .err = err, .errlen = errlen },
		.sum = job_sum, .err = err, .errlen = errlen,
		.bg = { .all_reduce_v = job_bg_all_reduce_v, .reduce_scatter_v = job_bg_reduce_scatter_v,
			.all_gather_v = job_bg_all_gather_v, .wait = job_wait, .ctx = &jc },
		.p2p = { .send = job_p2p_send, .recv = job_p2p_recv, .flush = job_p2p_flush,
			 .wait_send = job_p2p_wait_send, .probe = job_p2p_probe, .ctx = &jc },
	};
	if (o->trace) {
		xport_set_stamps(jc.xport, true);   /* the p2p row's times */
		jc.tr = malloc(sizeof(*jc.tr));
		if (!jc.tr) {
			snprintf(err, errlen, "train: out of memory for the trace");
			ret = -ENOMEM;
			goto out;
		}
		/* line the devices' clocks up on a barrier */
		if (coll_barrier(jc.coll, &all, err, errlen)) {
			ret = -EHOSTDOWN;
			goto out;
		}
		trace_start(jc.tr, true);
	}
	struct train_loop loop = {
		.t = t, .opts = o, .global_rows = global_rows, .row0 = row0, .comm = &comm,
		.leader = leader, .log = &log, .step_begin = job_step_begin, .step_end = job_step_end,
		.bytes = job_bytes, .recovery = job_recovery, .comm_wait_s = job_waited, .comm_bg_s = job_background,
		.ctx = &jc,
	};
	double run_t0 = util_now_s();
	if ((ret = train_loop_run(&loop, start, err, errlen)))
		goto out;
	if (leader && c->steps > start)
		print_finished(dev, &loop, start, util_now_s() - run_t0);
	/* the metrics file is synced and closed while every host is still in
	 * the job, so a failure there fails it everywhere */
	if (leader && (ret = steplog_close(&log, err, errlen)))
		goto out;
	if (jc.tr && (ret = write_trace(dev, &jc, &all, o->trace, err, errlen)))
		goto out;
	/* nobody leaves before the checkpoint is written */
	if (coll_barrier(jc.coll, &all, err, errlen))
		ret = -EHOSTDOWN;
out:
	if (o->weights && !loaded)  /* the host's other devices wait for this one */
		hf_src_done(o->weights, ret ? ret : -ECANCELED, err, errlen);
	/* before the collectives go: the siblings would fail on them first */
	if (ret)
		agent_job_failed(dev, ret);
	if (leader)
		steplog_close(&log, NULL, 0);
	/* the communication threads first: a failed step may leave
	 * background collectives (window, gradient buckets, exchanges)
	 * writing into the trainer's buffers until they stop */
	coll_dev_free(jc.xcoll);
	if (jc.coll)
		coll_dev_free(jc.coll);
	trainer_free(t);
	for (int i = 0; i < jc.ngrp; i++)
		free(jc.grp[i].mg);
	free(jc.tr);
	free(jc.sends);
	free(rules);
	return ret;
}
