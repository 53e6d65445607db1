/* The helpers every collective algorithm (coll_ring.c, coll_a2a.c) posts,
 * waits and fails with, and the names of the operations; see
 * net/coll_int.h. Calls only xport in net/, so the algorithms and the
 * dispatch in coll.c both sit above it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_int.h"
#include "net/fsum.h"
#include "proto/meshrun.pb-c.h"

#define OP(x) MESHRUN__COLL_OP__COLL_##x

const char *coll_op_name(uint32_t op)
{
	switch (op) {
	case OP(ALL_GATHER): return "all_gather";
	case OP(REDUCE_SCATTER): return "reduce_scatter";
	case OP(ALL_REDUCE): return "all_reduce";
	case OP(ALL_TO_ALL): return "all_to_all";
	case OP(PERMUTE): return "permute";
	case OP(BROADCAST): return "broadcast";
	case OP(BARRIER): return "barrier";
	default: return "collective";
	}
}

/* ---- helpers for the algorithms ---- */

void *coll_scratch_get(struct coll_scratch *s, size_t bytes)
{
	if (bytes <= s->cap)
		return s->p;
	void *p = NULL;
	size_t cap = (bytes + 4095) & ~(size_t)4095;
	if (posix_memalign(&p, 64, cap))
		return NULL;
	free(s->p);
	s->p = p;
	s->cap = cap;
	return p;
}

int coll_fail(struct coll_run *R, int rc, const char *detail)
{
	const struct coll_args *a = R->a;
	char name[64];
	if (a->parent_op)
		snprintf(name, sizeof(name), "%s (two-level, %s %s phase)", coll_op_name(a->parent_op),
			 a->inter_phase ? "inter-host" : "intra-host", coll_op_name(a->op));
	else
		snprintf(name, sizeof(name), "%s", coll_op_name(a->op));
	snprintf(R->err, R->errlen, "%s (group %u, seq %llu, step %llu) on device %d: %s",
		 name, a->group, (unsigned long long)a->seq,
		 (unsigned long long)a->step, R->me, detail);
	xport_fail(R->x, rc, R->err);
	return rc;
}

static void fill_meta(const struct coll_run *R, uint32_t chunk, uint64_t off, struct xmeta *m)
{
	/* a two-level phase's messages carry the collective's op: a
	 * transport error names what the caller issued */
	m->op = R->a->parent_op ? R->a->parent_op : R->a->op;
	m->group = R->a->group;
	m->seq = R->a->seq;
	m->step = R->a->step;
	m->chunk = chunk;
	m->offset = off;
}

static int post_failed(struct coll_run *R, int rc, const char *what, int peer)
{
	char detail[600];
	char terr[512] = "";
	if (!xport_failed(R->x, terr, sizeof(terr)))
		snprintf(terr, sizeof(terr), "%s", strerror(-rc));
	snprintf(detail, sizeof(detail), "posting %s device %d: %s", what, peer, terr);
	return coll_fail(R, rc, detail);
}

int coll_post_send(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		   const void *buf, size_t len, struct xreq **out)
{
	struct xmeta m;
	fill_meta(R, chunk, off, &m);
	int rc = xport_isend(R->x, R->me, peer, &m, buf, len, out);
	if (rc) {
		*out = NULL;
		return post_failed(R, rc, "send to", peer);
	}
	return 0;
}

int coll_post_recv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		   void *buf, size_t len, struct xreq **out)
{
	struct xmeta m;
	fill_meta(R, chunk, off, &m);
	int rc = xport_irecv(R->x, peer, R->me, &m, buf, len, out);
	if (rc) {
		*out = NULL;
		return post_failed(R, rc, "receive from", peer);
	}
	return 0;
}

int coll_post_recv_add(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		       float *buf, const float *addend, size_t len, struct xreq **out)
{
	struct xmeta m;
	fill_meta(R, chunk, off, &m);
	int rc = xport_irecv_add(R->x, peer, R->me, &m, buf, addend, len, out);
	if (rc) {
		*out = NULL;
		return post_failed(R, rc, "receive from", peer);
	}
	return 0;
}

int coll_post_sendv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		    const struct xrun *runs, int nruns, size_t base, size_t len, struct xreq **out)
{
	struct xmeta m;
	fill_meta(R, chunk, off, &m);
	int rc = xport_isendv(R->x, R->me, peer, &m, runs, nruns, base, len, out);
	if (rc) {
		*out = NULL;
		return post_failed(R, rc, "send to", peer);
	}
	return 0;
}

int coll_post_recvv(struct coll_run *R, int peer, uint32_t chunk, uint64_t off,
		    const struct xrun *runs, int nruns, size_t base, size_t len, bool sum,
		    struct xreq **out)
{
	struct xmeta m;
	fill_meta(R, chunk, off, &m);
	int rc = xport_irecvv(R->x, peer, R->me, &m, runs, nruns, base, len, sum, out);
	if (rc) {
		*out = NULL;
		return post_failed(R, rc, "receive from", peer);
	}
	return 0;
}

int coll_wait_req(struct coll_run *R, struct xreq **req)
{
	if (!*req)
		return 0;
	char terr[512];
	int rc = xport_wait(*req, R->deadline, terr, sizeof(terr));
	*req = NULL;
	if (rc)
		return coll_fail(R, rc, terr);
	return 0;
}

int coll_test_req(struct coll_run *R, struct xreq **req)
{
	if (!*req)
		return 0;
	char terr[512];
	int rc = xport_wait(*req, 0, terr, sizeof(terr));
	if (rc == -EAGAIN)
		return rc;
	*req = NULL;
	if (rc)
		return coll_fail(R, rc, terr);
	return 0;
}

void coll_abandon(struct coll_run *R, struct xreq **reqs, size_t n)
{
	char terr[64];
	/* the transport is failed already (coll_fail), so this returns at once */
	xport_fail(R->x, -ECANCELED, "collective aborted");
	for (size_t i = 0; i < n; i++) {
		if (reqs[i]) {
			xport_wait(reqs[i], 1, terr, sizeof(terr));
			reqs[i] = NULL;
		}
	}
}

void coll_copy_step(struct coll_copy *c, size_t chunk)
{
	size_t k = chunk && chunk < c->len ? chunk : c->len;
	if (!k)
		return;
	memcpy(c->dst, c->src, k);
	c->dst += k;
	c->src += k;
	c->len -= k;
}

void coll_moves_run(const struct coll_move *mv, int n, bool add)
{
	for (int i = 0; i < n; i++) {
		if (add)
			fsum_acc(mv[i].dst, mv[i].src, mv[i].count);
		else
			memcpy(mv[i].dst, mv[i].src, mv[i].count * sizeof(float));
	}
}
