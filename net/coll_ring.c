/* Ring algorithms (gloo/NCCL style) for all-gather, reduce-scatter and
 * all-reduce, a pipelined chain for broadcast, direct exchanges for small
 * buffers, and the dissemination barrier.
 *
 * Ring: rank r sends to r+1 and receives from r-1. A block is cut into S
 * segments; item j = k*S + s is segment s of ring step k. Every receive is
 * posted as soon as its destination is free (up to COLL_RECV_AHEAD items): the
 * receiver-driven transport sends only into a posted buffer, so the sooner
 * the RecvReady leaves, the sooner the data may follow, and a RecvReady
 * posted mid-stream would wait behind a data fragment on the busy link. At
 * most COLL_SEND_WINDOW sends are outstanding; send j (k >= 1) waits for
 * receive j-S, the segment it forwards. A device retires whatever has
 * finished and, when nothing has, blocks on its oldest outstanding item,
 * whose counterpart depends only on older items, so the ring cannot
 * deadlock.
 *
 * Reduce steps receive with a sum (xport_irecv_add): the partial sum is
 * got + own, computed as the bytes arrive and written once, straight into
 * the buffer it goes to; the in-place all-reduce adds into its buffer,
 * which holds the own input there. Nothing lands raw and is summed later:
 * that cost a pass over cold memory per reduce step.
 *
 * Reduction order is fixed: block b is summed along the ring starting at
 * rank b+1 ((x[b+1] + x[b+2]) + ...) + x[b], whatever the timing, and
 * all-reduce then copies the finished block to everyone, so every rank holds
 * the same bits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_int.h"
#include "net/fsum.h"
#include "proto/meshrun.pb-c.h"

#define W 8                   /* broadcast chain: segments in flight */
#define SW COLL_SEND_WINDOW
#define RA COLL_RECV_AHEAD

struct ring {
	int n, r, left, right;
	int K, S;               /* steps, segments per block */
	int nrs;                /* steps [0, nrs) reduce, [nrs, K) gather */
	size_t seg;
	const size_t *boff, *blen;
	const uint8_t *in;      /* reduce: input blocks at boff; gather only: own block */
	uint8_t *out;           /* gather: output blocks at boff */
	uint8_t *fin;           /* reduce: where the finished own block goes */
	uint8_t *alt;           /* reduce_scatter: scratch block alternating with fin */
	uint8_t *inplace;       /* all_reduce: partial sums overwrite the buffer */
	uint32_t chunk0;
	/* all_gather: own block copied into the output a segment per pass
	 * of the schedule while the ring moves (sends read it from the
	 * input), the rest after the last item */
	struct coll_copy own;
	/* a list of runs (the coll_*_v forms, in place): the buffer is the
	 * runs' concatenation (blocks at boff in it), run i from its byte
	 * runs[i].off on; an item is one message over the runs it spans;
	 * NULL: the buffers above */
	struct xrun *runs;
	int nruns;
	/* all_gather_v: its own block filled by the moves (coll_move, in
	 * the block's order) a segment ahead of that segment's send: moves
	 * [fi, fn) left, fo floats of move fi done, fdone of the block */
	const struct coll_move *fmv;
	int fi, fn;
	size_t fo, fdone;
};

static inline int mod(int a, int n)
{
	a %= n;
	return a < 0 ? a + n : a;
}

static int send_block(const struct ring *g, int k)
{
	return k < g->nrs ? mod(g->r - k - 1, g->n) : mod(g->r - (k - g->nrs), g->n);
}

static int recv_block(const struct ring *g, int k)
{
	return k < g->nrs ? mod(g->r - k - 2, g->n) : mod(g->r - (k - g->nrs) - 1, g->n);
}

static size_t seg_len(const struct ring *g, int b, int s)
{
	size_t off = (size_t)s * g->seg;
	if (off >= g->blen[b])
		return 0;
	size_t left = g->blen[b] - off;
	return left < g->seg ? left : g->seg;
}

/* Buffer that holds the partial sum produced by reduce step k (and is sent
 * at step k+1). */
static uint8_t *partial(const struct ring *g, int k)
{
	if (g->inplace)
		return g->inplace + g->boff[recv_block(g, k)];
	if (k == g->nrs - 1 || !g->alt || (g->nrs - 1 - k) % 2 == 0)
		return g->fin;
	return g->alt;
}

static const uint8_t *send_src(const struct ring *g, int k, int s)
{
	size_t off = (size_t)s * g->seg;
	if (k == 0)
		return g->nrs ? g->in + g->boff[send_block(g, 0)] + off : g->in + off;
	if (k - 1 < g->nrs)
		return partial(g, k - 1) + off;
	return g->out + g->boff[send_block(g, k)] + off;
}

/* Item s of block b over runs (len > 0 bytes): where it lies if inside
 * one run (*nr = 1), else NULL with the runs it spans, *i0 and *nr. */
static uint8_t *item_at(const struct ring *g, int b, int s, size_t len, int *i0, int *nr)
{
	size_t p = g->boff[b] + (size_t)s * g->seg;
	int a = xruns_find(g->runs, g->nruns, -1, p), z = xruns_find(g->runs, g->nruns, a, p + len - 1);
	*i0 = a;
	*nr = z - a + 1;
	return a == z ? g->runs[a].at + (p - g->runs[a].off) : NULL;
}

/* Send index that must have completed before receive j may be posted (its
 * destination is still being read by that send), or -1. */
static long recv_needs_send(const struct ring *g, long j)
{
	int k = (int)(j / g->S);
	if (k < g->nrs) {
		/* reduce_scatter: partial(k) is partial(k-2), sent at step k-1 */
		if (g->alt && k >= 2)
			return j - g->S;
		return -1;
	}
	/* all_reduce gather phase overwrites the block sent at reduce step
	 * k - nrs */
	if ((g->inplace || g->runs) && g->nrs)
		return j - (long)g->nrs * g->S;
	return -1;
}

/* Fills the own block's first upto floats (the moves' order is the
 * block's), or all the moves with SIZE_MAX. */
static void fill_to(struct ring *g, size_t upto)
{
	while (g->fi < g->fn && g->fdone < upto) {
		const struct coll_move *m = &g->fmv[g->fi];
		size_t k = m->count - g->fo < upto - g->fdone ? m->count - g->fo : upto - g->fdone;
		memcpy(m->dst + g->fo, m->src + g->fo, k * sizeof(float));
		g->fo += k;
		g->fdone += k;
		if (g->fo == m->count) {
			g->fi++;
			g->fo = 0;
		}
	}
}

static int ring_run(struct coll_run *R, struct ring *g)
{
	long T = (long)g->K * g->S;
	long rp = 0, rd = 0, sp = 0, sd = 0;
	struct xreq *rq[RA] = { 0 }, *sq[SW] = { 0 };
	int rc = 0;

	while (rd < T || sd < T) {
		while (rp < T && rp < rd + RA) {
			long need = recv_needs_send(g, rp);
			if (need >= 0 && sd <= need)
				break;
			int k = (int)(rp / g->S), s = (int)(rp % g->S), b = recv_block(g, k);
			size_t len = seg_len(g, b, s), off = (size_t)s * g->seg;
			int i0 = 0, nr = 1;
			uint8_t *at = len && g->runs ? item_at(g, b, s, len, &i0, &nr) : NULL;
			uint32_t chunk = g->chunk0 + (uint32_t)rp;
			rq[rp % RA] = NULL;
			if (len && nr > 1)   /* one message over several runs */
				rc = coll_post_recvv(R, g->left, chunk, g->boff[b] + off, g->runs + i0,
						     nr, g->boff[b] + off, len, k < g->nrs, &rq[rp % RA]);
			else if (len && k >= g->nrs)
				rc = coll_post_recv(R, g->left, chunk, g->boff[b] + off,
						    at ? at : g->out + g->boff[b] + off, len, &rq[rp % RA]);
			else if (len)   /* partial sum = got + own */
				rc = coll_post_recv_add(R, g->left, chunk, g->boff[b] + off,
							(float *)(at ? at : partial(g, k) + off),
							(const float *)(at ? at : g->in + g->boff[b] + off),
							len, &rq[rp % RA]);
			if (rc)
				goto out_abandon;
			rp++;
		}
		while (sp < T && sp < sd + SW && (sp < g->S || rd > sp - g->S)) {
			int k = (int)(sp / g->S), s = (int)(sp % g->S), b = send_block(g, k);
			size_t len = seg_len(g, b, s), off = (size_t)s * g->seg;
			uint32_t chunk = g->chunk0 + (uint32_t)sp;
			int i0 = 0, nr = 1;
			uint8_t *at = len && g->runs ? item_at(g, b, s, len, &i0, &nr) : NULL;
			sq[sp % SW] = NULL;
			if (k == 0 && g->fmv)
				fill_to(g, (off + len) / sizeof(float));
			if (len && nr > 1)
				rc = coll_post_sendv(R, g->right, chunk, g->boff[b] + off, g->runs + i0,
						     nr, g->boff[b] + off, len, &sq[sp % SW]);
			else if (len)
				rc = coll_post_send(R, g->right, chunk, g->boff[b] + off,
						    at ? at : send_src(g, k, s), len, &sq[sp % SW]);
			if (rc)
				goto out_abandon;
			sp++;
		}
		coll_copy_step(&g->own, g->seg);
		/* retire whatever finished meanwhile, oldest first */
		bool moved = false;
		while (rd < rp && !(rc = coll_test_req(R, &rq[rd % RA]))) {
			rd++;
			moved = true;
		}
		if (rc && rc != -EAGAIN)
			goto out_abandon;
		while (sd < sp && !(rc = coll_test_req(R, &sq[sd % SW]))) {
			sd++;
			moved = true;
		}
		if (rc && rc != -EAGAIN)
			goto out_abandon;
		rc = 0;
		if (moved)
			continue;
		/* nothing finished: block on the oldest outstanding item */
		bool r_out = rp > rd, s_out = sp > sd;
		if (r_out && (!s_out || rd <= sd)) {
			if ((rc = coll_wait_req(R, &rq[rd % RA])))
				goto out_abandon;
			rd++;
		} else if (s_out) {
			if ((rc = coll_wait_req(R, &sq[sd % SW])))
				goto out_abandon;
			sd++;
		} else {
			rc = coll_fail(R, -EDEADLK, "ring schedule stalled (bug)");
			goto out_abandon;
		}
	}
	coll_copy_step(&g->own, 0);
	if (g->fmv)
		fill_to(g, SIZE_MAX);
	return 0;

out_abandon:
	coll_abandon(R, rq, RA);
	coll_abandon(R, sq, SW);
	return rc;
}

/* Segment size: at least the configured one, and large enough that chunk
 * indices of all items fit in span (0: 16 bits). */
static size_t pick_seg(size_t seg, size_t maxblock, int steps, uint32_t span)
{
	long max_s = (long)(span ? span : 65535) / (steps > 0 ? steps : 1);
	size_t need = (maxblock + (size_t)max_s - 1) / (size_t)max_s;
	need = (need + 3) & ~(size_t)3;
	return need > seg ? need : seg;
}

/* A list of runs: each run's byte offset in the concatenation (the items
 * are the contiguous op's segments, cut by size wherever runs end). */
static int runs_make(struct ring *g, const struct coll_iov *iov, int niov)
{
	g->runs = malloc(sizeof(*g->runs) * (size_t)(niov ? niov : 1));
	if (!g->runs)
		return -ENOMEM;
	size_t o = 0;
	for (int i = 0; i < niov; i++) {
		g->runs[i] = (struct xrun){ (uint8_t *)iov[i].buf, o };
		o += iov[i].count * sizeof(float);
	}
	g->nruns = niov;
	return 0;
}

/* Fills the ring geometry; scratch holds alt_bytes for the alternate
 * partial-sum block (reduce_scatter); a list of runs gets its items
 * (ring_release frees them). */
static int ring_setup(struct ring *g, struct coll_run *R, const size_t *blen, int K, int nrs,
		      size_t alt_bytes)
{
	const struct coll_args *a = R->a;
	size_t maxb = 0;
	g->n = a->n;
	g->r = a->rank;
	g->left = a->devs[mod(a->rank - 1, a->n)];
	g->right = a->devs[mod(a->rank + 1, a->n)];
	g->K = K;
	g->nrs = nrs;
	for (int b = 0; b < a->n; b++)
		if (blen[b] > maxb)
			maxb = blen[b];
	g->seg = pick_seg(a->seg, maxb, K, a->chunk_span);
	g->chunk0 = a->chunk_base;
	g->S = (int)((maxb + g->seg - 1) / g->seg);
	if (alt_bytes) {
		g->alt = coll_scratch_get(R->scr, alt_bytes);
		if (!g->alt)
			return coll_fail(R, -ENOMEM, "out of memory for ring segments");
	}
	if (a->iov && runs_make(g, a->iov, a->niov))
		return coll_fail(R, -ENOMEM, "out of memory for the runs' segments");
	return 0;
}

static void ring_release(struct ring *g)
{
	free(g->runs);
}

/* ---- block tables ---- */

struct blocks {
	size_t *off, *len;
	size_t small_off[COLL_DIRECT_MAX_N], small_len[COLL_DIRECT_MAX_N];
};

/* n blocks of total elements of elem bytes, as equal as possible (the first
 * total % n blocks one element longer). */
static int blocks_init(struct blocks *bl, int n, size_t total, size_t elem)
{
	if (n <= COLL_DIRECT_MAX_N) {
		bl->off = bl->small_off;
		bl->len = bl->small_len;
	} else {
		bl->off = malloc(sizeof(size_t) * 2 * (size_t)n);
		if (!bl->off)
			return -ENOMEM;
		bl->len = bl->off + n;
	}
	size_t q = total / (size_t)n, rem = total % (size_t)n, o = 0;
	for (int b = 0; b < n; b++) {
		size_t c = q + ((size_t)b < rem ? 1 : 0);
		bl->off[b] = o * elem;
		bl->len[b] = c * elem;
		o += c;
	}
	return 0;
}

static void blocks_release(struct blocks *bl)
{
	if (bl->off != bl->small_off)
		free(bl->off);
}

/* ---- direct exchanges for small buffers ---- */

static bool use_direct(const struct coll_args *a, size_t total)
{
	return a->n <= COLL_DIRECT_MAX_N && total <= a->direct_max;
}

/* Every rank sends src (len bytes) to every other rank; rank p's copy lands
 * at dst + p * stride (own slot untouched unless own_copy). With addend
 * (two ranks only) the peer's copy is not landed but summed on arrival:
 * dst = received + addend (xport_irecv_add), no scratch and no pass after. */
static int direct_exchange(struct coll_run *R, uint8_t *dst, size_t stride,
			   const uint8_t *(*src_for)(struct coll_run *, int peer, const void *),
			   const void *ctx, size_t len, const float *addend)
{
	const struct coll_args *a = R->a;
	struct xreq *reqs[2 * COLL_DIRECT_MAX_N] = { 0 };
	int nr = 0, rc = 0;
	for (int i = 1; i < a->n; i++) {
		int p = mod(a->rank - i, a->n);
		rc = addend ? coll_post_recv_add(R, a->devs[p], a->chunk_base, (size_t)p * stride,
						 (float *)dst, addend, len, &reqs[nr++])
			    : coll_post_recv(R, a->devs[p], a->chunk_base, (size_t)p * stride,
					     dst + (size_t)p * stride, len, &reqs[nr++]);
		if (rc)
			goto out_abandon;
	}
	for (int i = 1; i < a->n; i++) {
		int p = mod(a->rank + i, a->n);
		if ((rc = coll_post_send(R, a->devs[p], a->chunk_base, (size_t)a->rank * stride,
					 src_for(R, p, ctx), len, &reqs[nr++])))
			goto out_abandon;
	}
	for (int i = 0; i < nr; i++)
		if ((rc = coll_wait_req(R, &reqs[i])))
			goto out_abandon;
	return 0;

out_abandon:
	coll_abandon(R, reqs, (size_t)nr);
	return rc;
}

static const uint8_t *src_same(struct coll_run *R, int peer, const void *ctx)
{
	(void)R;
	(void)peer;
	return ctx;
}

static const uint8_t *src_block(struct coll_run *R, int peer, const void *ctx)
{
	return (const uint8_t *)ctx + (size_t)peer * R->a->count * sizeof(float);
}

/* ---- all-gather ---- */

int coll_ring_all_gather(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	size_t bpr = a->bytes;
	uint8_t *out = a->out;
	const uint8_t *in = a->in;
	uint8_t *own = out + (size_t)a->rank * bpr;

	if (bpr == 0)
		return 0;
	if (a->n == 1 || use_direct(a, bpr * (size_t)a->n)) {
		if (own != in)
			memcpy(own, in, bpr);
		if (a->n == 1)
			return 0;
		return direct_exchange(R, out, bpr, src_same, own, bpr, NULL);
	}

	struct blocks bl;
	if (blocks_init(&bl, a->n, (size_t)a->n * bpr, 1))
		return coll_fail(R, -ENOMEM, "out of memory");
	/* the own block is sent from in and copied while the ring moves */
	struct ring g = { .boff = bl.off, .blen = bl.len, .in = in, .out = out,
			  .own = { own, in, own != in ? bpr : 0 } };
	int rc = ring_setup(&g, R, bl.len, a->n - 1, 0, 0);
	if (!rc)
		rc = ring_run(R, &g);
	blocks_release(&bl);
	return rc;
}

/* ---- reduce-scatter ---- */

/* out = sum over ranks p = 0..n-1 of parts[p], in rank order
 * ((parts[0] + parts[1]) + ...), n >= 2, out apart from every part. The
 * first sum writes out, so no copy of parts[0] goes before it. */
static void sum_in_order(float *out, const float *const *parts, int n, size_t count)
{
	fsum_add(out, parts[0], parts[1], count);
	for (int p = 2; p < n; p++)
		fsum_acc(out, parts[p], count);
}

/* The direct all-reduce's sum, in place: buf (rank r's own part) = sum over
 * ranks p of part p in rank order, the other parts in scr at p * count
 * (scr's own slot unused). Parts 0..r-1 are summed into scr's slot 0 first;
 * buf += that is the same bits as that + buf (IEEE addition is commutative),
 * then the parts after r follow. No copy of buf or of a part. */
static void sum_in_place(float *buf, float *scr, int r, int n, size_t count)
{
	for (int p = 1; p < r; p++)
		fsum_acc(scr, scr + (size_t)p * count, count);
	if (r)
		fsum_acc(buf, scr, count);
	for (int p = r + 1; p < n; p++)
		fsum_acc(buf, scr + (size_t)p * count, count);
}

int coll_ring_reduce_scatter(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	size_t cnt = a->count, bytes = cnt * sizeof(float);
	const float *in = a->in;
	float *out = a->out;

	if (cnt == 0)
		return 0;
	if (a->n == 1) {
		memcpy(out, in, bytes);
		return 0;
	}
	if (use_direct(a, bytes * (size_t)a->n)) {
		const float *own = in + (size_t)a->rank * cnt;
		/* two ranks: out = the peer's block + own, summed as it arrives
		 * (the same bits as own + peer's: IEEE addition is commutative) */
		if (a->n == 2)
			return direct_exchange(R, (uint8_t *)out, bytes, src_block, in, bytes, own);
		float *scr = coll_scratch_get(R->scr, bytes * (size_t)a->n);
		if (!scr)
			return coll_fail(R, -ENOMEM, "out of memory");
		int rc = direct_exchange(R, (uint8_t *)scr, bytes, src_block, in, bytes, NULL);
		if (rc)
			return rc;
		const float *parts[COLL_DIRECT_MAX_N] = { 0 };
		for (int p = 0; p < a->n; p++)
			parts[p] = p == a->rank ? own : scr + (size_t)p * cnt;
		sum_in_order(out, parts, a->n, cnt);
		return 0;
	}

	struct blocks bl;
	if (blocks_init(&bl, a->n, (size_t)a->n * cnt, sizeof(float)))
		return coll_fail(R, -ENOMEM, "out of memory");
	struct ring g = { .boff = bl.off, .blen = bl.len, .in = (const uint8_t *)in,
			  .fin = (uint8_t *)out };
	/* n > 2: partial sums alternate between out and one scratch block */
	int rc = ring_setup(&g, R, bl.len, a->n - 1, a->n - 1, a->n > 2 ? bytes : 0);
	if (!rc)
		rc = ring_run(R, &g);
	blocks_release(&bl);
	return rc;
}

/* ---- all-reduce ---- */

int coll_ring_all_reduce(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	size_t cnt = a->count, bytes = cnt * sizeof(float);
	float *buf = a->out;

	if (cnt == 0 || a->n == 1)
		return 0;
	if (use_direct(a, bytes)) {
		float *scr = coll_scratch_get(R->scr, bytes * (size_t)a->n);
		if (!scr)
			return coll_fail(R, -ENOMEM, "out of memory");
		int rc = direct_exchange(R, (uint8_t *)scr, bytes, src_same, buf, bytes, NULL);
		if (rc)
			return rc;
		sum_in_place(buf, scr, a->rank, a->n, cnt);
		return 0;
	}

	struct blocks bl;
	if (blocks_init(&bl, a->n, cnt, sizeof(float)))
		return coll_fail(R, -ENOMEM, "out of memory");
	struct ring g = { .boff = bl.off, .blen = bl.len, .in = (const uint8_t *)buf,
			  .out = (uint8_t *)buf, .inplace = (uint8_t *)buf,
			  .fin = (uint8_t *)buf + bl.off[a->rank] };
	int rc = ring_setup(&g, R, bl.len, 2 * (a->n - 1), a->n - 1, 0);
	if (!rc)
		rc = ring_run(R, &g);
	blocks_release(&bl);
	return rc;
}

/* ---- lists of runs, in place (coll_*_v) ---- */

/* Copies floats [v0, v0 + cnt) of the runs' concatenation to flat, or
 * (to_runs) back. */
static void runs_copy(const struct coll_iov *iov, int niov, size_t v0, float *flat, size_t cnt,
		      bool to_runs)
{
	for (int i = 0; i < niov && cnt; i++) {
		if (v0 >= iov[i].count) {
			v0 -= iov[i].count;
			continue;
		}
		size_t k = iov[i].count - v0 < cnt ? iov[i].count - v0 : cnt;
		float *r = iov[i].buf + v0;
		memcpy(to_runs ? r : flat, to_runs ? flat : r, k * sizeof(float));
		flat += k;
		cnt -= k;
		v0 = 0;
	}
}

/* Block b of a reduce_scatter or all_gather over runs: counts[b] floats. */
static int blocks_counts(struct blocks *bl, const size_t *counts, int n)
{
	size_t o = 0;
	if (blocks_init(bl, n, 0, 1))
		return -ENOMEM;
	for (int b = 0; b < n; b++) {
		bl->off[b] = o * sizeof(float);
		bl->len[b] = counts[b] * sizeof(float);
		o += counts[b];
	}
	return 0;
}

/* A small list of runs: the contiguous op (its direct exchange) on a
 * packed copy, block b at b * stride floats (zeros after its counts[b]),
 * so the sums are those of the contiguous op on the padded blocks;
 * counts NULL: all_reduce of stride floats. */
static int packed(struct coll_run *R, size_t stride, const size_t *counts)
{
	const struct coll_args *a = R->a;
	int n = counts ? a->n : 1, rc;
	bool rs = a->op == MESHRUN__COLL_OP__COLL_REDUCE_SCATTER;
	size_t total = stride * (size_t)n, v0[COLL_DIRECT_MAX_N + 1] = { 0 };
	float *tmp = calloc(total + (rs ? stride : 0), sizeof(float));
	if (!tmp)
		return coll_fail(R, -ENOMEM, "out of memory");
	struct coll_args a2 = *a;
	struct coll_run R2 = *R;
	a2.runs = false;
	a2.iov = NULL;
	a2.counts = NULL;
	R2.a = &a2;
	for (int b = 0; b < n; b++) {
		size_t c = counts ? counts[b] : stride;
		v0[b + 1] = v0[b] + c;
		if (rs || !counts || b == a->rank)
			runs_copy(a->iov, a->niov, v0[b], tmp + (size_t)b * stride, c, false);
	}
	if (!counts) {
		a2.out = tmp;
		a2.count = stride;
		if (!(rc = coll_ring_all_reduce(&R2)))
			runs_copy(a->iov, a->niov, 0, tmp, stride, true);
	} else if (rs) {
		a2.in = tmp;
		a2.out = tmp + total;
		a2.count = stride;
		if (!(rc = coll_ring_reduce_scatter(&R2)))
			runs_copy(a->iov, a->niov, v0[a->rank], tmp + total, counts[a->rank], true);
	} else {
		a2.out = tmp;
		a2.in = tmp + (size_t)a->rank * stride;
		a2.bytes = stride * sizeof(float);
		rc = coll_ring_all_gather(&R2);
		for (int b = 0; b < n && !rc; b++)
			if (b != a->rank)
				runs_copy(a->iov, a->niov, v0[b], tmp + (size_t)b * stride, counts[b], true);
	}
	free(tmp);
	return rc;
}

/* The largest of a list's blocks (counts[0 .. n)). */
static size_t most(const size_t *counts, int n)
{
	size_t m = 0;
	for (int b = 0; b < n; b++)
		m = counts[b] > m ? counts[b] : m;
	return m;
}

/* A list of runs on the ring: K steps, the first nrs of them reducing;
 * blocks of counts[b] floats, or (counts NULL) the count split as
 * evenly as the contiguous op splits it. */
static int ring_v(struct coll_run *R, int K, int nrs, const size_t *counts)
{
	const struct coll_args *a = R->a;
	size_t c = counts ? most(counts, a->n) : a->count;
	/* a gather's own block: filled first, or on the ring a segment
	 * ahead of its sends */
	bool fill = a->nown && a->op == MESHRUN__COLL_OP__COLL_ALL_GATHER;
	bool ring = c && a->n > 1 && !use_direct(a, c * sizeof(float) * (counts ? (size_t)a->n : 1));

	if (fill && !ring)
		coll_moves_run(a->own, a->nown, false);
	if (c == 0 || a->n == 1)
		return 0;
	if (!ring)
		return packed(R, c, counts);
	struct blocks bl;
	if (counts ? blocks_counts(&bl, counts, a->n) : blocks_init(&bl, a->n, c, sizeof(float)))
		return coll_fail(R, -ENOMEM, "out of memory");
	struct ring g = { .boff = bl.off, .blen = bl.len, .fmv = fill ? a->own : NULL, .fn = fill ? a->nown : 0 };
	int rc = ring_setup(&g, R, bl.len, K, nrs, 0);
	if (!rc)
		rc = ring_run(R, &g);
	ring_release(&g);
	blocks_release(&bl);
	return rc;
}

int coll_ring_all_reduce_v(struct coll_run *R)
{
	return ring_v(R, 2 * (R->a->n - 1), R->a->n - 1, NULL);
}

/* Reduce steps only, in place: block b's partial sums are written over
 * the block as they pass (as all_reduce's are), the last into the own
 * block. */
int coll_ring_reduce_scatter_v(struct coll_run *R)
{
	return ring_v(R, R->a->n - 1, R->a->n - 1, R->a->counts);
}

/* Gather steps only, in place: the own block is the input. */
int coll_ring_all_gather_v(struct coll_run *R)
{
	return ring_v(R, R->a->n - 1, 0, R->a->counts);
}

/* all_reduce of a list of runs cut in blocks of counts[b] floats (the
 * two-level collectives' inter-host phase): the reduce steps, then the
 * gather steps, in one schedule, the sums of reduce_scatter_v then
 * all_gather_v on those blocks. A small list runs those two (their
 * direct exchanges) on the two halves of its chunk numbers. */
int coll_ring_all_reduce_blocks_v(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	size_t c = most(a->counts, a->n);

	if (c == 0 || a->n == 1)
		return 0;
	if (!use_direct(a, c * sizeof(float) * (size_t)a->n))
		return ring_v(R, 2 * (a->n - 1), a->n - 1, a->counts);
	struct coll_args a2 = *a;
	struct coll_run R2 = *R;
	uint32_t half = (a->chunk_span ? a->chunk_span : 65536) / 2;
	R2.a = &a2;
	a2.chunk_span = half;
	a2.op = MESHRUN__COLL_OP__COLL_REDUCE_SCATTER;
	int rc = ring_v(&R2, a->n - 1, a->n - 1, a->counts);
	if (rc)
		return rc;
	a2.op = MESHRUN__COLL_OP__COLL_ALL_GATHER;
	a2.chunk_base += half;
	return ring_v(&R2, a->n - 1, 0, a->counts);
}

/* ---- broadcast: a chain root -> root+1 -> ... pipelined by segment ---- */

int coll_chain_broadcast(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	int n = a->n, pos = mod(a->rank - a->root, n);
	bool has_recv = pos > 0, has_send = pos < n - 1;
	int prev = a->devs[mod(a->rank - 1, n)], next = a->devs[mod(a->rank + 1, n)];
	uint8_t *buf = a->out;

	if (a->bytes == 0 || n == 1)
		return 0;
	size_t seg = pick_seg(a->seg, a->bytes, 1, 0);
	long T = (long)((a->bytes + seg - 1) / seg);
	long rp = 0, rd = 0, sp = 0, sd = 0;
	struct xreq *rq[W] = { 0 }, *sq[W] = { 0 };
	int rc = 0;
	if (!has_recv)
		rp = rd = T;
	if (!has_send)
		sp = sd = T;

	while (rd < T || sd < T) {
		while (rp < T && rp < rd + W) {
			size_t off = (size_t)rp * seg, len = a->bytes - off < seg ? a->bytes - off : seg;
			if ((rc = coll_post_recv(R, prev, (uint32_t)rp, off, buf + off, len, &rq[rp % W])))
				goto out_abandon;
			rp++;
		}
		while (sp < T && sp < sd + W && (!has_recv || rd > sp)) {
			size_t off = (size_t)sp * seg, len = a->bytes - off < seg ? a->bytes - off : seg;
			if ((rc = coll_post_send(R, next, (uint32_t)sp, off, buf + off, len, &sq[sp % W])))
				goto out_abandon;
			sp++;
		}
		bool r_out = rp > rd, s_out = sp > sd;
		if (r_out && (!s_out || rd <= sd)) {
			if ((rc = coll_wait_req(R, &rq[rd % W])))
				goto out_abandon;
			rd++;
		} else if (s_out) {
			if ((rc = coll_wait_req(R, &sq[sd % W])))
				goto out_abandon;
			sd++;
		} else {
			rc = coll_fail(R, -EDEADLK, "broadcast schedule stalled (bug)");
			goto out_abandon;
		}
	}
	return 0;

out_abandon:
	coll_abandon(R, rq, W);
	coll_abandon(R, sq, W);
	return rc;
}

/* ---- barrier: dissemination, ceil(log2 n) rounds of empty messages ---- */

int coll_dissemination_barrier(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	int rc = 0;
	uint32_t round = 0;
	for (int dist = 1; dist < a->n; dist *= 2, round++) {
		struct xreq *reqs[2] = { 0 };
		if ((rc = coll_post_recv(R, a->devs[mod(a->rank - dist, a->n)], round, 0, NULL, 0,
					 &reqs[0])) ||
		    (rc = coll_post_send(R, a->devs[mod(a->rank + dist, a->n)], round, 0, NULL, 0,
					 &reqs[1])) ||
		    (rc = coll_wait_req(R, &reqs[0])) || (rc = coll_wait_req(R, &reqs[1]))) {
			coll_abandon(R, reqs, 2);
			return rc;
		}
	}
	return 0;
}
