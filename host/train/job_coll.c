/* The training job's collectives by axis set (job_comm.h): a group per
 * axis set, made on first use; each call a span on the trace and its
 * time counted as waited; background collectives queued on the device's
 * communication threads (the FSDP window's, the gradient buckets', the
 * batch split's expert exchanges on a thread of their own). */
#include "host/train/job_comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/mesh/plan.h"
#include "host/obs/trace.h"
#include "host/util/clock.h"
#include "proto/meshrun.pb-c.h"

/* Runs a collective call, recording its span and the time spent in it. */
#define SPAN(c, name, call) ({ double t0_ = util_now_s(); int r_ = (call); double t1_ = util_now_s(); \
	(c)->waited_s += t1_ - t0_; trace_span((c)->tr, name, "comm", t0_, t1_); r_; })

const struct coll_group *job_group(struct job_ctx *c, uint32_t axes)
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
	const struct coll_group *g = job_group(c, axes);
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
	const struct coll_group *g = job_group(c, axes);
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
	const struct coll_group *g = job_group(c, axes);
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
	const struct coll_group *g = job_group(c, axes);
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
	const struct coll_group *g = job_group(c, axes);
	if (!g)
		return -ENOMEM;
	double t = util_now_s();
	return job_start(c, t, coll_all_gather_async(c->coll, g, out, in, bytes, c->err, c->errlen),
			 "all_gather (prefetch)", axes, NULL, h);
}

static int job_start_reduce_scatter(void *vctx, uint32_t axes, float *out, const float *in, size_t n, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = job_group(c, axes);
	if (!g)
		return -ENOMEM;
	double t = util_now_s();
	return job_start(c, t, coll_reduce_scatter_async(c->coll, g, out, in, n, c->err, c->errlen),
			 "reduce_scatter (background)", axes, NULL, h);
}

/* The FSDP window's collectives over a list of every member's runs, in
 * place: a layer group's gather straight into its window (op all_gather)
 * and its gradients' reduce-scatter out of it, the own block's copies
 * (own) on the communication thread. */
static int job_start_win_v(struct job_ctx *c, uint32_t op, uint32_t axes, const struct model_run *run,
			   int nrun, const size_t *counts, const struct model_move *own, int nown, void **h)
{
	const struct coll_group *g = job_group(c, axes);
	if (!g)
		return -ENOMEM;
	struct coll_iov *iov = malloc(sizeof(*iov) * (size_t)(nrun + 1) + sizeof(struct coll_move) * (size_t)nown);
	if (!iov) {
		snprintf(c->err, c->errlen, "train: out of memory for a list of %d runs", nrun);
		return -ENOMEM;
	}
	struct coll_move *mv = (struct coll_move *)(iov + nrun + 1);
	for (int i = 0; i < nrun; i++)
		iov[i] = (struct coll_iov){ run[i].buf, run[i].n };
	for (int i = 0; i < nown; i++)
		mv[i] = (struct coll_move){ own[i].dst, own[i].src, own[i].n };
	double t = util_now_s();
	bool ag = op == MESHRUN__COLL_OP__COLL_ALL_GATHER;
	struct coll_handle *ch =
		ag ? coll_all_gather_v_fill_async(c->coll, g, iov, nrun, counts, mv, nown, c->err, c->errlen)
		   : coll_reduce_scatter_v_add_async(c->coll, g, iov, nrun, counts, mv, nown, c->err, c->errlen);
	free(iov);  /* copied by the call */
	return job_start(c, t, ch, ag ? "all_gather (prefetch)" : "reduce_scatter (background)", axes,
			 NULL, h);
}

static int job_start_all_gather_v(void *vctx, uint32_t axes, const struct model_run *run, int nrun,
				  const size_t *counts, const struct model_move *own, int nown, void **h)
{
	return job_start_win_v(vctx, MESHRUN__COLL_OP__COLL_ALL_GATHER, axes, run, nrun, counts, own, nown, h);
}

static int job_start_reduce_scatter_v(void *vctx, uint32_t axes, const struct model_run *run, int nrun,
				      const size_t *counts, const struct model_move *own, int nown, void **h)
{
	return job_start_win_v(vctx, MESHRUN__COLL_OP__COLL_REDUCE_SCATTER, axes, run, nrun, counts, own, nown,
			       h);
}

#define XCHG_GROUP 0x4000u  /* above every mesh group id (axis masks), below P2P_GROUP */

/* The expert exchanges' communication thread, started on first use (or
 * before the device thread raises its nice value: it inherits it). */
int job_start_xcoll(struct job_ctx *c)
{
	if (c->xcoll)
		return 0;
	c->xcoll = coll_dev_new(c->xport, c->device, c->segment_bytes, c->timeout_s);
	if (!c->xcoll) {
		snprintf(c->err, c->errlen, "train: unable to start the expert exchanges' communication thread");
		return -EAGAIN;
	}
	coll_set_step(c->xcoll, (uint64_t)c->step);
	coll_set_two_level(c->xcoll, c->two_level);
	return 0;
}

static int job_start_all_to_all(void *vctx, uint32_t axes, void *out, const size_t *recv_bytes,
				const void *in, const size_t *send_bytes, const char *name, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = job_group(c, axes);
	if (!g)
		return -ENOMEM;
	int rc = job_start_xcoll(c);
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

/* A background collective's group over axes: 0 and *g, 1 when this
 * device is alone in it (nothing to move, *h stays NULL), or -ENOMEM. */
static int bg_group(struct job_ctx *c, uint32_t axes, const struct coll_group **g, void **h)
{
	*h = NULL;
	*g = job_group(c, axes);
	return !*g ? -ENOMEM : (*g)->n == 1;
}

/* The gradient buckets' collectives (optim_bg), named by their layers:
 * one over each bucket's list of runs, in place (coll_*_v); a group of
 * one has nothing to move. */
static int job_bg_v(struct job_ctx *c, uint32_t op, uint32_t axes, float *base, const struct optim_run *run,
		    int nrun, const size_t *counts, const char *name, void **h)
{
	const struct coll_group *g;
	int rc = bg_group(c, axes, &g, h);
	if (rc)
		return rc < 0 ? rc : 0;
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

/* A pipeline's stage sums (optim_bg.all_reduce): buf summed in place
 * by coll_all_reduce's algorithm, on the communication thread. */
static int job_bg_all_reduce(void *vctx, uint32_t axes, float *buf, size_t n, const char *name, void **h)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g;
	int rc = bg_group(c, axes, &g, h);
	if (rc)
		return rc < 0 ? rc : 0;
	double t = util_now_s();
	return job_bg_start(c, t, coll_all_reduce_async(c->coll, g, buf, n, c->err, c->errlen), "all_reduce",
			    axes, name, h);
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

/* Gathered, then added in rank order. */
int job_sum(void *vctx, uint32_t axes, double *x, int n)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g = job_group(c, axes);
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

/* job_sum in the background, on the exchanges' communication thread (so
 * it never holds up the FSDP window's and the buckets' collectives
 * queued behind it on the other): the same gather, the same rank-order
 * adds, at job_sum_wait. */
struct job_sum_bg {
	struct coll_handle *h;
	int n, members;
	double *all;            /* [members][n] */
	double in[];            /* [n]: this member's, untouched until the wait */
};

int job_sum_start(void *vctx, uint32_t axes, const double *x, int n, void **out)
{
	struct job_ctx *c = vctx;
	const struct coll_group *g;
	int rc = bg_group(c, axes, &g, out);
	if (rc)
		return rc < 0 ? rc : 0;
	if ((rc = job_start_xcoll(c)))
		return rc;
	struct job_sum_bg *b = malloc(sizeof(*b) + sizeof(double) * (size_t)n * (size_t)(g->n + 1));
	if (!b) {
		snprintf(c->err, c->errlen, "train: out of memory");
		return -ENOMEM;
	}
	b->n = n;
	b->members = g->n;
	b->all = b->in + n;
	memcpy(b->in, x, sizeof(double) * (size_t)n);
	struct coll_group xg = *g;
	xg.id += XCHG_GROUP;
	b->h = coll_all_gather_async(c->xcoll, &xg, b->all, b->in, sizeof(double) * (size_t)n, c->err, c->errlen);
	if (!b->h) {
		free(b);
		return -EIO;  /* c->err says why */
	}
	*out = b;
	return 0;
}

int job_sum_wait(void *vctx, void *vh, double *x)
{
	struct job_ctx *c = vctx;
	struct job_sum_bg *b = vh;
	if (!b)
		return 0;
	double t0 = util_now_s();
	int rc = coll_wait(b->h, xport_now_ns() + (uint64_t)(c->timeout_s * 1e9), c->err, c->errlen);
	c->waited_s += util_now_s() - t0;
	for (int i = 0; !rc && i < b->n; i++) {
		double s = 0;
		for (int r = 0; r < b->members; r++)
			s += b->all[(size_t)r * b->n + i];
		x[i] = s;
	}
	free(b);
	return rc ? -EHOSTDOWN : 0;
}

void job_coll_hooks(struct job_ctx *c, bool trace, struct train_comm *comm)
{
	comm->mc = (struct model_comm){
		.all_reduce = job_all_reduce, .all_gather = job_all_gather,
		.reduce_scatter = job_reduce_scatter, .all_to_all = job_all_to_all,
		.start_all_gather = job_start_all_gather, .start_reduce_scatter = job_start_reduce_scatter,
		.start_all_gather_v = job_start_all_gather_v, .start_reduce_scatter_v = job_start_reduce_scatter_v,
		.start_all_to_all = job_start_all_to_all, .wait = job_wait,
		.span = trace ? job_span : NULL, .ctx = c, .err = c->err, .errlen = c->errlen };
	comm->sum = job_sum;
	comm->sum_start = job_sum_start;
	comm->sum_wait = job_sum_wait;
	comm->bg = (struct optim_bg){ .all_reduce_v = job_bg_all_reduce_v,
				      .reduce_scatter_v = job_bg_reduce_scatter_v,
				      .all_gather_v = job_bg_all_gather_v, .wait = job_wait,
				      .all_reduce = job_bg_all_reduce, .ctx = c };
}
