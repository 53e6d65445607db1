/* Collectives in one process: every op on groups of 1..8 in-process devices
 * (one xport, no network) for element counts {0, 1, 7, 262147} with every
 * element checked, in ring and direct modes; uneven all-to-all; async
 * overlap (all-to-all too, with the times it ran); bit-exact reduction
 * order; concurrent groups on a 2x2x2 mesh; the bytes of sends a pairwise
 * exchange keeps outstanding; errors name the collective.
 * Lists of runs are in check_coll_runs.c, the transport under the
 * collectives (xport, links across a reset, idle waits) in check_xport.c,
 * the same checks across real agents in check_coll_agents.c. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/mesh/mesh.h"
#include "net/coll.h"
#include "net/xport.h"
#include "tests/coll_util.h"

static const size_t counts[] = { 0, 1, 7, 262147 };
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* Inputs: small integers so every sum is exact. */
static float val(int dev, size_t i, int salt)
{
	return (float)((dev * 37 + (int)(i % 1009) * 3 + salt * 11) % 61) - 20.0f;
}

/* ---- every op, one group over all devices ---- */

static void a2a_count(int r, int q, size_t count, size_t *out)
{
	*out = ((r + 2 * q) % 3 == 0) ? 0 : count + (size_t)((r * 5 + q * 3) % 7);
}

static void all_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	int rc;
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank;

	for (size_t ci = 0; ci < NCOUNTS; ci++) {
		size_t c = counts[ci];
		float *in = xmalloc(sizeof(float) * c * (size_t)n);
		float *out = xmalloc(sizeof(float) * c * (size_t)n);

		/* all_gather */
		for (size_t i = 0; i < c; i++)
			in[i] = val(dev, i, 1);
		rc = coll_all_gather(cd, &g, out, in, c * sizeof(float), err, sizeof(err));
		CHECK_RC(w, rc, "all_gather", err);
		for (size_t k = 0; k < c * (size_t)n; k++)
			if (out[k] != val(g.devs[k / c], k % c, 1)) {
				failf(w, "all_gather n=%d count=%zu: rank %d block %zu elem %zu = %g", n, c, r, k / c, k % c, out[k]);
				break;
			}

		/* reduce_scatter */
		for (size_t i = 0; i < c * (size_t)n; i++)
			in[i] = val(dev, i, 2);
		rc = coll_reduce_scatter(cd, &g, out, in, c, err, sizeof(err));
		CHECK_RC(w, rc, "reduce_scatter", err);
		for (size_t i = 0; i < c; i++) {
			float want = 0;
			for (int p = 0; p < n; p++)
				want += val(g.devs[p], (size_t)r * c + i, 2);
			if (out[i] != want) {
				failf(w, "reduce_scatter n=%d count=%zu: rank %d elem %zu = %g want %g", n, c, r, i, out[i], want);
				break;
			}
		}

		/* all_reduce */
		for (size_t i = 0; i < c; i++)
			out[i] = val(dev, i, 3);
		rc = coll_all_reduce(cd, &g, out, c, err, sizeof(err));
		CHECK_RC(w, rc, "all_reduce", err);
		for (size_t i = 0; i < c; i++) {
			float want = 0;
			for (int p = 0; p < n; p++)
				want += val(g.devs[p], i, 3);
			if (out[i] != want) {
				failf(w, "all_reduce n=%d count=%zu: rank %d elem %zu = %g want %g", n, c, r, i, out[i], want);
				break;
			}
		}

		/* permute by +1, -1, +2 */
		static const int shifts[] = { 1, -1, 2 };
		for (int si = 0; si < 3; si++) {
			int sh = shifts[si];
			for (size_t i = 0; i < c; i++)
				in[i] = val(dev, i, 4 + si);
			rc = coll_permute(cd, &g, out, in, c * sizeof(float), sh, err, sizeof(err));
			CHECK_RC(w, rc, "permute", err);
			int from = g.devs[((r - sh) % n + n) % n];
			for (size_t i = 0; i < c; i++)
				if (out[i] != val(from, i, 4 + si)) {
					failf(w, "permute shift %d n=%d count=%zu: rank %d elem %zu = %g", sh, n, c, r, i, out[i]);
					break;
				}
		}

		/* broadcast from the first and the last rank */
		for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1)) {
			for (size_t i = 0; i < c; i++)
				out[i] = val(dev, i, 8 + root);
			rc = coll_broadcast(cd, &g, out, c * sizeof(float), root, err, sizeof(err));
			CHECK_RC(w, rc, "broadcast", err);
			for (size_t i = 0; i < c; i++)
				if (out[i] != val(g.devs[root], i, 8 + root)) {
					failf(w, "broadcast root %d n=%d count=%zu: rank %d elem %zu = %g", root, n, c, r, i, out[i]);
					break;
				}
		}

		/* all_to_all with uneven per-peer counts, zeros included */
		{
			size_t sb[8], rb[8], st = 0, rt = 0;
			for (int q = 0; q < n; q++) {
				a2a_count(r, q, c, &sb[q]);
				a2a_count(q, r, c, &rb[q]);
				st += sb[q];
				rt += rb[q];
			}
			float *ain = xmalloc(sizeof(float) * st), *aout = xmalloc(sizeof(float) * rt);
			size_t o = 0;
			for (int q = 0; q < n; q++)
				for (size_t i = 0; i < sb[q]; i++)
					ain[o++] = (float)(r * 64 + q * 8 + (int)(i % 8));
			for (int q = 0; q < n; q++) {
				sb[q] *= sizeof(float);
				rb[q] *= sizeof(float);
			}
			rc = coll_all_to_all(cd, &g, aout, rb, ain, sb, err, sizeof(err));
			if (rc) {
				free(ain);
				free(aout);
			}
			CHECK_RC(w, rc, "all_to_all", err);
			o = 0;
			for (int q = 0; q < n; q++) {
				for (size_t i = 0; i < rb[q] / sizeof(float); i++, o++) {
					if (aout[o] != (float)(q * 64 + r * 8 + (int)(i % 8))) {
						failf(w, "all_to_all n=%d count=%zu: rank %d from %d elem %zu = %g", n, c, r, q, i, aout[o]);
						q = n;
						break;
					}
				}
			}
			free(ain);
			free(aout);
		}

		/* barrier: nobody leaves before everyone has arrived */
		__atomic_add_fetch(&w->counter, 1, __ATOMIC_SEQ_CST);
		rc = coll_barrier(cd, &g, err, sizeof(err));
		CHECK_RC(w, rc, "barrier", err);
		if (__atomic_load_n(&w->counter, __ATOMIC_SEQ_CST) < (int)(ci + 1) * n)
			failf(w, "barrier n=%d: rank %d left before everyone arrived", n, r);
		free(in);
		free(out);
	}
}

static void run_all_ops(int D, size_t seg, size_t direct_max)
{
	struct world w = { .seg = seg, .direct_max = direct_max, .timeout_s = 30 };
	world_mesh(&w, D, 1, 1);
	world_run(&w, all_ops, NULL);
	ck_assert_msg(w.failures == 0, "D=%d seg=%zu direct_max=%zu: %d failures, first: %s",
		      D, seg, direct_max, w.failures, w.first);
}

START_TEST(test_ops_default)
{
	/* _i = D - 1; default segment and direct threshold */
	run_all_ops(_i + 1, 1 << 20, 65536);
}
END_TEST

START_TEST(test_ops_ring_small_segments)
{
	/* ring only, many segments per block (and chunk-index growth) */
	run_all_ops(_i + 1, 4096 + 4 * (size_t)_i, 0);
}
END_TEST

/* ---- async: overlap, FIFO, and a sync collective in between ---- */

static void async_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	int rc;
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank;
	size_t c = 100003;
	float *ag_in = xmalloc(sizeof(float) * c), *ag_out = xmalloc(sizeof(float) * c * (size_t)n);
	float *rs_in = xmalloc(sizeof(float) * c * (size_t)n), *rs_out = xmalloc(sizeof(float) * c);
	float *ar = xmalloc(sizeof(float) * c), *ar2 = xmalloc(sizeof(float) * c);
	float *pin = xmalloc(sizeof(float) * c), *pout = xmalloc(sizeof(float) * c);
	for (size_t i = 0; i < c; i++) {
		ag_in[i] = val(dev, i, 20);
		ar[i] = val(dev, i, 21);
		ar2[i] = val(dev, i, 22);
		pin[i] = val(dev, i, 23);
	}
	for (size_t i = 0; i < c * (size_t)n; i++)
		rs_in[i] = val(dev, i, 24);

	struct coll_handle *h1 = coll_all_gather_async(cd, &g, ag_out, ag_in, c * sizeof(float), err, sizeof(err));
	struct coll_handle *h2 = coll_all_reduce_async(cd, &g, ar, c, err, sizeof(err));
	struct coll_handle *h3 = coll_reduce_scatter_async(cd, &g, rs_out, rs_in, c, err, sizeof(err));
	struct coll_handle *h4 = coll_permute_async(cd, &g, pout, pin, c * sizeof(float), 1, err, sizeof(err));
	if (!h1 || !h2 || !h3 || !h4) {
		failf(w, "async issue: %s", err);
		return;
	}
	/* a synchronous collective on the same group while those run */
	rc = coll_all_reduce(cd, &g, ar2, c, err, sizeof(err));
	CHECK_RC(w, rc, "sync all_reduce during async", err);
	/* test-only wait, then real waits (out of issue order) */
	rc = coll_wait(h4, 0, err, sizeof(err));
	if (rc == 0)
		h4 = NULL;
	else if (rc != -EAGAIN)
		CHECK_RC(w, rc, "permute test", err);
	uint64_t dl = xport_now_ns() + 30000000000ull;
	rc = coll_wait(h3, dl, err, sizeof(err));
	CHECK_RC(w, rc, "reduce_scatter wait", err);
	rc = coll_wait(h1, dl, err, sizeof(err));
	CHECK_RC(w, rc, "all_gather wait", err);
	rc = coll_wait(h2, dl, err, sizeof(err));
	CHECK_RC(w, rc, "all_reduce wait", err);
	if (h4) {
		rc = coll_wait(h4, dl, err, sizeof(err));
		CHECK_RC(w, rc, "permute wait", err);
	}
	for (size_t i = 0; i < c; i++) {
		float want = 0, want2 = 0, want3 = 0;
		for (int p = 0; p < n; p++) {
			want += val(g.devs[p], i, 21);
			want2 += val(g.devs[p], i, 22);
			want3 += val(g.devs[p], (size_t)r * c + i, 24);
		}
		if (ar[i] != want || ar2[i] != want2 || rs_out[i] != want3 ||
		    pout[i] != val(g.devs[(r - 1 + n) % n], i, 23)) {
			failf(w, "async n=%d rank %d elem %zu wrong", n, r, i);
			break;
		}
		for (int p = 0; p < n; p++)
			if (ag_out[(size_t)p * c + i] != val(g.devs[p], i, 20)) {
				failf(w, "async all_gather n=%d rank %d elem %zu wrong", n, r, i);
				i = c;
				break;
			}
	}
	free(ag_in); free(ag_out); free(rs_in); free(rs_out);
	free(ar); free(ar2); free(pin); free(pout);
}

START_TEST(test_async_overlap)
{
	struct world w = { .seg = 65536, .direct_max = 65536, .timeout_s = 30 };
	world_mesh(&w, _i + 2, 1, 1);
	world_run(&w, async_ops, NULL);
	ck_assert_msg(w.failures == 0, "D=%d: %s", w.D, w.first);
}
END_TEST

/* ---- async all_to_all: two in flight (the batch split's halves), a
 * sync collective between them on the same group, the size arrays
 * reused at once, and when the communication thread ran each ---- */

/* One async all_to_all's buffers and sizes (counts: a2a_count(r, q, c)
 * shifted by salt so the two exchanges differ). */
struct a2a_io {
	size_t sb[8], rb[8];
	float *in, *out;
};

static void a2a_fill(struct a2a_io *io, int n, int r, size_t c, int salt)
{
	size_t st = 0, rt = 0;
	for (int q = 0; q < n; q++) {
		a2a_count(r, q, c + (size_t)salt, &io->sb[q]);
		a2a_count(q, r, c + (size_t)salt, &io->rb[q]);
		st += io->sb[q];
		rt += io->rb[q];
	}
	io->in = xmalloc(sizeof(float) * st);
	io->out = xmalloc(sizeof(float) * rt);
	size_t o = 0;
	for (int q = 0; q < n; q++)
		for (size_t i = 0; i < io->sb[q]; i++)
			io->in[o++] = (float)(salt * 4096 + r * 64 + q * 8 + (int)(i % 8));
	for (int q = 0; q < n; q++) {
		io->sb[q] *= sizeof(float);
		io->rb[q] *= sizeof(float);
	}
}

/* 0, or the first wrong element described in err */
static int a2a_check(const struct a2a_io *io, int n, int r, int salt, char *err, size_t errlen)
{
	size_t o = 0;
	for (int q = 0; q < n; q++)
		for (size_t i = 0; i < io->rb[q] / sizeof(float); i++, o++)
			if (io->out[o] != (float)(salt * 4096 + q * 64 + r * 8 + (int)(i % 8))) {
				snprintf(err, errlen, "rank %d from %d elem %zu = %g", r, q, i, io->out[o]);
				return -1;
			}
	return 0;
}

static void async_a2a_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank;
	struct a2a_io io[2];
	uint64_t issued = xport_now_ns(), run[2], done[2];
	a2a_fill(&io[0], n, r, 20000, 1);
	a2a_fill(&io[1], n, r, 3, 2);
	struct coll_handle *h0 = coll_all_to_all_async(cd, &g, io[0].out, io[0].rb, io[0].in, io[0].sb,
						       err, sizeof(err));
	/* the sizes were copied: clobbering them changes nothing */
	memset(io[0].sb, 0xff, sizeof(io[0].sb));
	/* the next half's counts, exchanged on the same group meanwhile */
	int32_t mine = 100 + dev, all[8];
	int rc = coll_all_gather(cd, &g, all, &mine, sizeof(mine), err, sizeof(err));
	CHECK_RC(w, rc, "sync all_gather between two all_to_all", err);
	for (int q = 0; q < n; q++)
		if (all[q] != 100 + g.devs[q])
			failf(w, "all_gather during all_to_all: rank %d got %d from %d", r, all[q], q);
	struct coll_handle *h1 = coll_all_to_all_async(cd, &g, io[1].out, io[1].rb, io[1].in, io[1].sb,
						       err, sizeof(err));
	if (!h0 || !h1) {
		failf(w, "async all_to_all issue: %s", err);
		return;
	}
	uint64_t dl = xport_now_ns() + 30000000000ull;
	rc = coll_wait_times(h0, dl, &run[0], &done[0], err, sizeof(err));
	CHECK_RC(w, rc, "all_to_all wait 0", err);
	rc = coll_wait_times(h1, dl, &run[1], &done[1], err, sizeof(err));
	CHECK_RC(w, rc, "all_to_all wait 1", err);
	uint64_t back = xport_now_ns();
	for (int k = 0; k < 2; k++)
		if (a2a_check(&io[k], n, r, k + 1, err, sizeof(err)))
			failf(w, "async all_to_all %d n=%d: %s", k, n, err);
	/* ran after issue, before the wait returned; one at a time, in order */
	if (!(issued <= run[0] && run[0] <= done[0] && done[0] <= run[1] && run[1] <= done[1] &&
	      done[1] <= back))
		failf(w, "all_to_all times out of order: issued %llu run %llu..%llu then %llu..%llu, back %llu",
		      (unsigned long long)issued, (unsigned long long)run[0], (unsigned long long)done[0],
		      (unsigned long long)run[1], (unsigned long long)done[1], (unsigned long long)back);
	for (int k = 0; k < 2; k++) {
		free(io[k].in);
		free(io[k].out);
	}
}

START_TEST(test_async_all_to_all)
{
	static const int sizes[] = { 2, 3, 5, 8 };
	struct world w = { .seg = 65536, .direct_max = 65536, .timeout_s = 30 };
	world_mesh(&w, sizes[_i], 1, 1);
	world_run(&w, async_a2a_ops, NULL);
	ck_assert_msg(w.failures == 0, "D=%d: %s", w.D, w.first);
}
END_TEST

/* ---- determinism: exact reduction order, equal bits on every rank ---- */

static void det_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank;
	size_t c = *(size_t *)w->arg;
	float *buf = xmalloc(sizeof(float) * c);
	for (size_t i = 0; i < c; i++)
		buf[i] = fval(dev, i);
	int rc = coll_all_reduce(cd, &g, buf, c, err, sizeof(err));
	CHECK_RC(w, rc, "all_reduce", err);
	w->res[r] = buf;
	pthread_barrier_wait(&w->bar);
	/* ring order: block b summed from rank b+1 around to b */
	size_t q = c / (size_t)n, rem = c % (size_t)n, lo = 0;
	for (int b = 0; b < n; b++) {
		size_t len = q + ((size_t)b < rem), i;
		for (i = lo; i < lo + len; i++) {
			float want = fval(g.devs[(b + 1) % n], i);
			for (int k = 2; k <= n; k++)
				want = want + fval(g.devs[(b + k) % n], i);
			if (memcmp(&want, &buf[i], sizeof(float)) ||
			    memcmp(&buf[i], &w->res[0][i], sizeof(float))) {
				failf(w, "n=%d rank %d elem %zu: %.9g, ring order gives %.9g, rank 0 has %.9g",
				      n, r, i, buf[i], want, w->res[0][i]);
				break;
			}
		}
		lo += len;
	}
	pthread_barrier_wait(&w->bar);
	free(buf);
}

START_TEST(test_all_reduce_bit_exact)
{
	size_t c = 262147;
	for (int rep = 0; rep < 2; rep++) {
		struct world w = { .seg = 16384, .direct_max = 0, .timeout_s = 30 };
		world_mesh(&w, _i + 2, 1, 1);
		world_run(&w, det_ops, &c);
		ck_assert_msg(w.failures == 0, "D=%d rep %d: %s", w.D, rep, w.first);
	}
}
END_TEST

/* The direct exchange (buffers of at most direct_max) sums in rank order,
 * ((x0 + x1) + x2) + ..., on every rank alike: all_reduce in place (the
 * parts before the rank's own first) and reduce_scatter (two ranks: the
 * sum on arrival). */
/* got[i] against fval's rank-order sum at element at + i; one failure. */
static void direct_check(struct world *w, const struct coll_group *g, const char *op,
			 const float *got, size_t count, size_t at)
{
	for (size_t i = 0; i < count; i++) {
		float want = fval(g->devs[0], at + i);
		for (int p = 1; p < g->n; p++)
			want = want + fval(g->devs[p], at + i);
		if (memcmp(&want, &got[i], sizeof(float))) {
			failf(w, "direct %s n=%d rank %d elem %zu: %.9g, rank order gives %.9g", op,
			      g->n, g->rank, i, got[i], want);
			return;
		}
	}
}

static void det_direct_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank;
	size_t c = 1001, rc_cnt = 777;
	float *buf = xmalloc(sizeof(float) * c), *in = xmalloc(sizeof(float) * rc_cnt * (size_t)n);
	float *out = xmalloc(sizeof(float) * rc_cnt);
	for (size_t i = 0; i < c; i++)
		buf[i] = fval(dev, i);
	for (size_t i = 0; i < rc_cnt * (size_t)n; i++)
		in[i] = fval(dev, i + 5000);
	int rc = coll_all_reduce(cd, &g, buf, c, err, sizeof(err));
	CHECK_RC(w, rc, "all_reduce", err);
	rc = coll_reduce_scatter(cd, &g, out, in, rc_cnt, err, sizeof(err));
	CHECK_RC(w, rc, "reduce_scatter", err);
	direct_check(w, &g, "all_reduce", buf, c, 0);
	direct_check(w, &g, "reduce_scatter", out, rc_cnt, (size_t)r * rc_cnt + 5000);
	free(buf);
	free(in);
	free(out);
}

START_TEST(test_direct_bit_exact)
{
	struct world w = { .seg = 65536, .direct_max = 65536, .timeout_s = 30 };
	world_mesh(&w, _i + 2, 1, 1);
	world_run(&w, det_direct_ops, NULL);
	ck_assert_msg(w.failures == 0, "D=%d: %s", w.D, w.first);
}
END_TEST

/* ---- concurrent groups over axis subsets on a 2x2x2 mesh ---- */

static void mesh_groups(struct world *w, int dev, struct coll_dev *cd)
{
	static const uint32_t axes[3] = { 1u << AX_DATA, 1u << AX_FSDP, 1u << AX_TENSOR };
	struct mesh_group mg[4];
	struct coll_group g[4];
	struct coll_handle *h[3];
	char err[1024];
	size_t c = 70001;
	float *buf[4];
	for (int k = 0; k < 3; k++)
		group_of(w, dev, axes[k], &mg[k], &g[k]);
	group_of(w, dev, (1u << AX_FSDP) | (1u << AX_TENSOR), &mg[3], &g[3]);
	for (int k = 0; k < 4; k++) {
		buf[k] = xmalloc(sizeof(float) * c);
		for (size_t i = 0; i < c; i++)
			buf[k][i] = val(dev, i, 30 + k);
	}
	/* three groups at once on the comm thread, a fourth (two axes) on the
	 * caller's thread */
	for (int k = 0; k < 3; k++) {
		h[k] = coll_all_reduce_async(cd, &g[k], buf[k], c, err, sizeof(err));
		if (!h[k]) {
			failf(w, "issue: %s", err);
			return;
		}
	}
	int rc = coll_all_reduce(cd, &g[3], buf[3], c, err, sizeof(err));
	CHECK_RC(w, rc, "two-axis all_reduce", err);
	for (int k = 0; k < 3; k++) {
		rc = coll_wait(h[k], xport_now_ns() + 30000000000ull, err, sizeof(err));
		CHECK_RC(w, rc, "wait", err);
	}
	for (int k = 0; k < 4; k++) {
		if (g[k].n != (k < 3 ? 2 : 4))
			failf(w, "group %d has %d members", k, g[k].n);
		for (size_t i = 0; i < c; i++) {
			float want = 0;
			for (int p = 0; p < g[k].n; p++)
				want += val(g[k].devs[p], i, 30 + k);
			if (buf[k][i] != want) {
				failf(w, "axes group %d dev %d elem %zu = %g want %g", k, dev, i, buf[k][i], want);
				break;
			}
		}
		free(buf[k]);
	}
}

START_TEST(test_concurrent_groups)
{
	struct world w = { .seg = 32768, .direct_max = 0, .timeout_s = 30 };
	world_mesh(&w, 2, 2, 2);
	ck_assert_int_eq(w.D, 8);
	world_run(&w, mesh_groups, NULL);
	ck_assert_msg(w.failures == 0, "%s", w.first);
}
END_TEST

/* ---- errors: a missing peer times out with a message naming the op ---- */

static void lonely(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024] = "";
	float buf[4] = { 1, 2, 3, 4 };
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	coll_set_step(cd, 42);
	if (dev != 0)
		return;
	int rc = coll_all_reduce(cd, &g, buf, 4, err, sizeof(err));
	if (rc != -ETIMEDOUT)
		failf(w, "rc %d, want -ETIMEDOUT", rc);
	else if (!strstr(err, "all_reduce") || !strstr(err, "group") || !strstr(err, "seq 0") ||
		 !strstr(err, "step 42") || !strstr(err, "timed out"))
		failf(w, "error does not name the collective: '%s'", err);
	/* the transport is failed now: the next collective fails at once */
	rc = coll_barrier(cd, &g, err, sizeof(err));
	if (rc == 0)
		failf(w, "barrier after failure succeeded");
	/* bad arguments are refused before anything is sent */
	struct coll_group bad = g;
	bad.rank = 1;
	if (coll_all_reduce(cd, &bad, buf, 4, err, sizeof(err)) != -EINVAL)
		failf(w, "wrong rank accepted");
}

START_TEST(test_timeout_names_collective)
{
	struct world w = { .seg = 65536, .direct_max = 65536, .timeout_s = 0.3 };
	world_mesh(&w, 2, 1, 1);
	world_run(&w, lonely, NULL);
	ck_assert_msg(w.failures == 0, "%s", w.first);
}
END_TEST

/* ---- a pairwise exchange bounds the bytes of its sends in flight ---- */

enum { PB_SEG = 1 << 20, PB_BLOCK = 8 << 20 };

/* 2 devices: an all-to-all of 8 MiB blocks and a permute of 8 MiB, in
 * 1 MiB segments, every byte checked */
static void pair_bound_ops(struct world *w, int dev, struct coll_dev *cd)
{
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int r = g.rank, n = g.n;
	uint8_t *in = xmalloc((size_t)n * PB_BLOCK), *out = xmalloc((size_t)n * PB_BLOCK);
	size_t sb[2] = { PB_BLOCK, PB_BLOCK };
	for (size_t i = 0; i < (size_t)n * PB_BLOCK; i++)
		in[i] = (uint8_t)(i * 13 + (size_t)r * 71);
	int rc = coll_all_to_all(cd, &g, out, sb, in, sb, err, sizeof(err));
	if (!rc) {
		for (int q = 0; q < n; q++)
			for (size_t i = 0; i < PB_BLOCK; i++) {
				size_t at = (size_t)r * PB_BLOCK + i;
				if (out[(size_t)q * PB_BLOCK + i] != (uint8_t)(at * 13 + (size_t)q * 71)) {
					failf(w, "all_to_all: rank %d from %d byte %zu", r, q, i);
					q = n;
					break;
				}
			}
		rc = coll_permute(cd, &g, out, in, PB_BLOCK, 1, err, sizeof(err));
		int from = (r + n - 1) % n;
		for (size_t i = 0; !rc && i < PB_BLOCK; i++)
			if (out[i] != (uint8_t)(i * 13 + (size_t)from * 71)) {
				failf(w, "permute: rank %d byte %zu", r, i);
				break;
			}
	}
	free(in);
	free(out);
	CHECK_RC(w, rc, "pairwise exchange", err);
}

/* A pairwise exchange keeps at most COLL_PAIR_SEND_BYTES (2 MiB) of its
 * sends outstanding past the first: with the window alone (8 sends) both
 * hosts of a 16 MiB all-to-all sealed their whole 8 MiB block at once
 * and it waited, cold, in the peer's socket (a2a18). A count, no clock:
 * the window's first posts come before any send can complete, so without
 * the bound (MESHRUN_PAIR_SEND_BYTES=0) the peak is 8 MiB in every run. */
START_TEST(test_pair_send_bound)
{
	struct world w = { .seg = PB_SEG, .direct_max = 65536, .timeout_s = 30 };
	world_mesh(&w, 2, 1, 1);
	world_run(&w, pair_bound_ops, NULL);
	ck_assert_msg(w.failures == 0, "%s", w.first);
	size_t peak = coll_pair_send_peak();
	ck_assert_msg(peak >= PB_SEG && peak <= 2u * PB_SEG,
		      "a pairwise exchange had %zu bytes of sends outstanding (bound 2 MiB)", peak);
}
END_TEST

static Suite *coll_suite(void)
{
	Suite *s = suite_create("coll");
	TCase *tc = tcase_create("ops");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_ops_default, 0, 8);
	tcase_add_loop_test(tc, test_ops_ring_small_segments, 0, 8);
	suite_add_tcase(s, tc);

	tc = tcase_create("async");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_async_overlap, 0, 3);
	tcase_add_loop_test(tc, test_async_all_to_all, 0, 4);
	suite_add_tcase(s, tc);

	tc = tcase_create("determinism");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_all_reduce_bit_exact, 0, 4);
	tcase_add_loop_test(tc, test_direct_bit_exact, 0, 3);
	suite_add_tcase(s, tc);

	tc = tcase_create("groups");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_concurrent_groups);
	suite_add_tcase(s, tc);

	tc = tcase_create("pairwise");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pair_send_bound);
	suite_add_tcase(s, tc);

	tc = tcase_create("errors");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_timeout_names_collective);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(coll_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
