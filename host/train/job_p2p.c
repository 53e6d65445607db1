/* A pipeline's point-to-point messages for the training job
 * (job_comm.h): activations and gradients between stages, sent and
 * received on the host's transport (net/xport.h) from the device
 * thread; sends kept until the executor waits them, receives a probe
 * posted kept until their recv. With a trace, each call is a span with
 * its CPU and each message a flight on the device's p2p row. */
#include "host/train/job_comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/obs/trace.h"
#include "host/util/clock.h"
#include "host/util/threads.h"
#include "proto/meshrun.pb-c.h"

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
	/* the RecvReadys held for dev have ridden on this send (or are
	 * queued to); once none is held for a send still to come, what
	 * could not ride (no data frame queued on its link) goes alone */
	int kept = 0;
	for (int i = 0; i < c->nheld; i++)
		if (c->held[i] != dev)
			c->held[kept++] = c->held[i];
	if (c->nheld && !(c->nheld = kept))
		xport_flush(c->xport);
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
static int job_p2p_probe(void *vctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes, int hold)
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
	bool fresh = !r;
	if (!r && (rc = xport_irecv(c->xport, dev, c->device, &m, buf, bytes, &r))) {
		xport_failed(c->xport, c->err, c->errlen);
		return rc == -ENOMEM ? rc : -EHOSTDOWN;
	}
	/* held: its RecvReady waits for the send to dev that follows (it
	 * rides on that data frame; job_p2p_send flushes what did not) */
	if (!fresh || (hold == PIPE_RR_RIDE && c->nheld == (int)(sizeof(c->held) / sizeof(c->held[0]))))
		hold = PIPE_RR_NOW;
	if (hold == PIPE_RR_RIDE)
		c->held[c->nheld++] = dev;
	else if (hold == PIPE_RR_LATER)
		xport_flush_later(c->xport);
	rc = hold != PIPE_RR_NOW ? xport_peek(r, c->err, c->errlen) : xport_test(r, c->err, c->errlen);
	if (rc && rc != -EAGAIN)
		return -EHOSTDOWN;  /* abandoned: the transport failed */
	if (!rc)
		p2p_flight(c, false, kind, idx);
	if (c->tr) {  /* posting (and testing: it may read the link) */
		char name[32];
		snprintf(name, sizeof(name), "stage post%s %s %u",
			 hold == PIPE_RR_RIDE ? " held" : hold == PIPE_RR_LATER ? " later" : "", p2p_kind(kind), idx);
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
	c->nheld = 0;
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

struct pipe_p2p job_p2p_hooks(struct job_ctx *c)
{
	return (struct pipe_p2p){ .send = job_p2p_send, .recv = job_p2p_recv, .flush = job_p2p_flush,
				  .wait_send = job_p2p_wait_send, .probe = job_p2p_probe, .ctx = c };
}
