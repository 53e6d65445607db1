/* Two-level collectives for a group of H >= 2 hosts x D >= 2 devices
 * each, uniform and host-major (rank h*D + d is device d of the group's
 * h-th host). A flat ring over the n = H*D devices carries (n-1)/n of the
 * buffer over each host's one cross-host edge; here each of a host's D
 * devices carries 1/D of the data to its peers of the same local index,
 * (H-1)/H of the buffer a host in all, in H-1 latency hops instead of n-1.
 *
 * reduce_scatter: an intra-host reduce-scatter whose block d' is the
 * blocks {h*D + d' : h} (strided, as a list of runs), then an inter-host
 * reduce-scatter among {h*D + d : h} over those blocks; all_gather the
 * reverse; all_reduce both (its two inter-host phases one all_reduce
 * ring). Every phase is the ring of coll_ring.c on a list of runs in
 * place (its direct exchange for small buffers; the contiguous
 * reduce_scatter, which may not write its input, has rings of its own
 * with the same sums), so the sum order is fixed: the host's partial in
 * its intra-host ring order, then across hosts in theirs (not the flat
 * ring's bits). The phases
 * share the collective's group id and sequence number and use disjoint
 * chunk numbers, so they never take each other's messages. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_int.h"
#include "proto/meshrun.pb-c.h"

#define OP(x) MESHRUN__COLL_OP__COLL_##x
/* chunk numbers per phase: four phases in the 16-bit chunk space */
#define PHASE_SPAN 16384

bool coll_two_level_shape(const struct xport *x, const struct coll_group *g, int *hosts,
			  int *devices)
{
	int n = g->n, d = 1, h0 = xport_host_of(x, g->devs[0]);
	while (d < n && xport_host_of(x, g->devs[d]) == h0)
		d++;
	if (d < 2 || n % d || n / d < 2)
		return false;
	for (int i = 0; i < n; i++) {
		int hi = xport_host_of(x, g->devs[i]);
		if (i % d && hi != xport_host_of(x, g->devs[i - i % d]))
			return false;
		/* host-major: a host's devices are one run of the group */
		for (int j = 0; !(i % d) && j < i; j += d)
			if (xport_host_of(x, g->devs[j]) == hi)
				return false;
	}
	*hosts = n / d;
	*devices = d;
	return true;
}

static bool shape(const struct coll_run *R, int *H, int *D)
{
	struct coll_group g = { .id = R->a->group, .n = R->a->n, .rank = R->a->rank,
				.devs = R->a->devs };
	return coll_two_level_shape(R->x, &g, H, D);
}

bool coll_hier_applies(const struct coll_run *R)
{
	const struct coll_args *a = R->a;
	int H, D;
	if (!a->two_level)
		return false;
	if (a->op != OP(ALL_GATHER) && a->op != OP(REDUCE_SCATTER) && a->op != OP(ALL_REDUCE))
		return false;
	/* a byte-sized all_gather that is not whole floats keeps the ring */
	if (a->op == OP(ALL_GATHER) && !a->runs && a->bytes % sizeof(float))
		return false;
	/* every phase's items fit its chunk numbers (thousands of devices a
	 * host or hosts: the flat ring) */
	return shape(R, &H, &D) && (D - 1) * H < PHASE_SPAN && 2 * (H - 1) < PHASE_SPAN;
}

struct hier {
	int H, D, h, d;
	int *intra, *inter;        /* the two sub-rings' devices */
	const struct coll_iov *iov;
	int niov;
	size_t *v0;                /* block b starts at float v0[b] of the runs */
	const size_t *counts;      /* n blocks */
	struct coll_iov *pc;       /* a phase's runs, reordered */
	size_t *sub;               /* a phase's block counts */
	struct coll_scratch scr;   /* the phases' (a small one's direct
				    * exchange): R's may hold the caller's copy */
};

/* A phase's arguments: the collective's, on the sub-ring devs (n
 * members, this one rank; across hosts or inside one), with chunk
 * numbers [base, base + span). */
static void sub_args(struct coll_args *a2, const struct coll_args *a, uint32_t op, bool inter, int n,
		     int rank, const int *devs, uint32_t base, uint32_t span)
{
	*a2 = *a;
	a2->op = op;
	a2->n = n;
	a2->rank = rank;
	a2->devs = devs;
	a2->two_level = false;
	a2->parent_op = a->op;
	a2->inter_phase = inter;
	a2->chunk_base = base;
	a2->chunk_span = span;
	a2->own = NULL;           /* the collective's own block was filled before */
	a2->nown = 0;
}

/* Appends the pieces of floats [v, v + c) of the runs to out at *k. */
static void pieces(const struct coll_iov *iov, int niov, size_t v, size_t c, struct coll_iov *out,
		   int *k)
{
	for (int i = 0; i < niov && c; i++) {
		if (v >= iov[i].count) {
			v -= iov[i].count;
			continue;
		}
		size_t t = iov[i].count - v < c ? iov[i].count - v : c;
		out[(*k)++] = (struct coll_iov){ iov[i].buf + v, t };
		c -= t;
		v = 0;
	}
}

/* One phase: intra (the D devices of this host; block d' = blocks {h*D +
 * d'}) or inter (the H devices of local index d; block h = block h*D + d). */
static int phase(struct coll_run *R, struct hier *s, uint32_t op, bool intra, uint32_t num)
{
	int k = 0, nb = intra ? s->D : s->H, nin = intra ? s->H : 1;
	size_t all = 0;
	for (int b = 0; b < nb; b++) {
		s->sub[b] = 0;
		for (int j = 0; j < nin; j++) {
			int blk = intra ? j * s->D + b : b * s->D + s->d;
			pieces(s->iov, s->niov, s->v0[blk], s->counts[blk], s->pc, &k);
			s->sub[b] += s->counts[blk];
		}
		all += s->sub[b];
	}
	struct coll_args a2;
	sub_args(&a2, R->a, op, !intra, nb, intra ? s->d : s->h, intra ? s->intra : s->inter,
		 num * PHASE_SPAN, PHASE_SPAN);
	a2.runs = true;
	a2.iov = s->pc;
	a2.niov = k;
	a2.counts = s->sub;
	a2.count = all;
	struct coll_run R2 = *R;
	R2.a = &a2;
	R2.scr = &s->scr;
	if (op == OP(ALL_REDUCE))
		return coll_ring_all_reduce_blocks_v(&R2);
	return op == OP(REDUCE_SCATTER) ? coll_ring_reduce_scatter_v(&R2) : coll_ring_all_gather_v(&R2);
}

/* The two-level op on the runs iov, n blocks of counts[b] floats. */
static int hier_run(struct coll_run *R, const struct coll_iov *iov, int niov, const size_t *counts,
		    int H, int D)
{
	const struct coll_args *a = R->a;
	int n = a->n, rc;
	struct hier s = { .H = H, .D = D, .h = a->rank / D, .d = a->rank % D, .iov = iov,
			  .niov = niov, .counts = counts };
	s.intra = malloc(sizeof(int) * (size_t)(H + D));
	s.v0 = malloc(sizeof(size_t) * (size_t)(2 * n + 1));
	s.pc = malloc(sizeof(struct coll_iov) * (size_t)(niov + n + 1));
	if (!s.intra || !s.v0 || !s.pc) {
		rc = coll_fail(R, -ENOMEM, "out of memory for the two-level runs");
		goto out_free;
	}
	s.inter = s.intra + D;
	s.sub = s.v0 + n + 1;
	for (int i = 0; i < D; i++)
		s.intra[i] = a->devs[s.h * D + i];
	for (int i = 0; i < H; i++)
		s.inter[i] = a->devs[i * D + s.d];
	s.v0[0] = 0;
	for (int b = 0; b < n; b++)
		s.v0[b + 1] = s.v0[b] + counts[b];
	/* all_reduce's inter-host phases are one all_reduce ring (its
	 * gather steps follow its reduce steps without a pause) */
	switch (a->op) {
	case OP(REDUCE_SCATTER):
		if (!(rc = phase(R, &s, OP(REDUCE_SCATTER), true, 0)))
			rc = phase(R, &s, OP(REDUCE_SCATTER), false, 1);
		break;
	case OP(ALL_GATHER):
		if (!(rc = phase(R, &s, OP(ALL_GATHER), false, 2)))
			rc = phase(R, &s, OP(ALL_GATHER), true, 3);
		break;
	default:
		if (!(rc = phase(R, &s, OP(REDUCE_SCATTER), true, 0)) &&
		    !(rc = phase(R, &s, OP(ALL_REDUCE), false, 1)))
			rc = phase(R, &s, OP(ALL_GATHER), true, 3);
	}
out_free:
	free(s.scr.p);
	free(s.intra);
	free(s.v0);
	free(s.pc);
	return rc;
}

/* One contiguous sub-collective: reduce_scatter of count floats a rank
 * from in to out on the devs ring (n members, this one rank), chunk
 * numbers [base, base + span) (the inter-host phase's from PHASE_SPAN
 * on); the direct exchange exactly when direct. */
static int sub_reduce_scatter(struct coll_run *R, struct coll_scratch *scr, const int *devs, int n,
			      int rank, float *out, const float *in, size_t count, uint32_t base,
			      uint32_t span, bool direct)
{
	struct coll_args a2;
	sub_args(&a2, R->a, OP(REDUCE_SCATTER), base >= PHASE_SPAN, n, rank, devs, base, span);
	a2.runs = false;
	a2.iov = NULL;
	a2.counts = NULL;
	a2.in = in;
	a2.out = out;
	a2.count = count;
	a2.direct_max = direct ? SIZE_MAX : 0;
	struct coll_run R2 = *R;
	R2.a = &a2;
	R2.scr = scr;
	return coll_ring_reduce_scatter(&R2);
}

/* The contiguous reduce_scatter, which may not write its input: the
 * intra-host phase is H rings, one for each host's D contiguous blocks
 * {j*D .. j*D + D-1} of in, each leaving this device's partial of block
 * j*D + d in scratch; the inter-host phase reduce-scatters those H
 * partials into out. No copy of the input. Every element is summed as
 * by the list form on the same blocks: each ring takes the direct
 * exchange exactly when the list form's phase would (on its whole
 * buffer), so the bits are the list form's. */
static int hier_reduce_scatter(struct coll_run *R, int H, int D)
{
	const struct coll_args *a = R->a;
	size_t cnt = a->count, n = (size_t)a->n;
	int h = a->rank / D, d = a->rank % D, rc = 0;
	struct coll_scratch scr = { 0 };
	int *intra = malloc(sizeof(int) * (size_t)(H + D)), *inter;
	float *part = coll_scratch_get(R->scr, sizeof(float) * (cnt * (size_t)H + 1));
	if (!intra || !part) {
		rc = coll_fail(R, -ENOMEM, "out of memory");
		goto out_free;
	}
	inter = intra + D;
	for (int i = 0; i < D; i++)
		intra[i] = a->devs[h * D + i];
	for (int i = 0; i < H; i++)
		inter[i] = a->devs[i * D + d];
	bool direct_in = D <= COLL_DIRECT_MAX_N && cnt * n * sizeof(float) <= a->direct_max;
	bool direct_out = H <= COLL_DIRECT_MAX_N && cnt * (size_t)H * sizeof(float) <= a->direct_max;
	uint32_t span = (uint32_t)(PHASE_SPAN / H);
	for (int j = 0; j < H && !rc; j++)
		rc = sub_reduce_scatter(R, &scr, intra, D, d, part + (size_t)j * cnt,
					(const float *)a->in + (size_t)j * (size_t)D * cnt, cnt,
					(uint32_t)j * span, span, direct_in);
	if (!rc)
		rc = sub_reduce_scatter(R, &scr, inter, H, h, a->out, part, cnt, PHASE_SPAN, PHASE_SPAN,
					direct_out);
out_free:
	free(scr.p);
	free(intra);
	return rc;
}

int coll_hier_exec(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	int H, D, n = a->n, rc;
	if (!shape(R, &H, &D))
		return coll_fail(R, -EINVAL, "not a group of hosts x devices (bug)");
	size_t *cnt = malloc(sizeof(size_t) * (size_t)n);
	if (!cnt)
		return coll_fail(R, -ENOMEM, "out of memory");
	if (a->runs && a->op != OP(ALL_REDUCE)) {
		rc = hier_run(R, a->iov, a->niov, a->counts, H, D);
		goto out_free;
	}
	/* blocks as equal as the ring cuts them: the first count % n longer */
	size_t total = a->op == OP(ALL_REDUCE) ? a->count
		     : a->op == OP(ALL_GATHER) ? a->bytes / sizeof(float) : a->count;
	for (int b = 0; b < n; b++)
		cnt[b] = a->op == OP(ALL_REDUCE) ? total / (size_t)n + ((size_t)b < total % (size_t)n)
						 : total;
	if (a->op == OP(ALL_REDUCE)) {
		struct coll_iov one = { a->out, a->count };
		rc = a->runs ? hier_run(R, a->iov, a->niov, cnt, H, D) : hier_run(R, &one, 1, cnt, H, D);
	} else if (a->op == OP(ALL_GATHER)) {
		/* in place on out, the own block copied in first */
		float *out = a->out;
		float *own = out + (size_t)a->rank * total;
		if ((const void *)own != a->in)
			memcpy(own, a->in, a->bytes);
		struct coll_iov one = { out, total * (size_t)n };
		rc = hier_run(R, &one, 1, cnt, H, D);
	} else {
		rc = hier_reduce_scatter(R, H, D);
	}
out_free:
	free(cnt);
	return rc;
}
