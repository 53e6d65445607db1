/* Collectives: every op on groups of 1..8 in-process devices (one xport, no
 * network) for element counts {0, 1, 7, 262147} with every element checked,
 * in ring and direct modes; uneven all-to-all; async overlap (all-to-all
 * too, with the times it ran); bit-exact reduction order; concurrent
 * groups on a 2x2x2 mesh; lists of runs (coll_*_v) bit for bit against the
 * contiguous op, and their own block's moves (a gather's filled, a
 * reduce-scatter's sums added out by the collective); errors name the
 * collective. Then the same checks across real agents over TLS on loopback
 * via `$MESHRUN bench collectives --check-counts`, and a host killed in the
 * middle of an all_reduce. */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "net/coll.h"
#include "net/fault.h"
#include "net/net.h"
#include "net/xport.h"
#include "tests/proc.h"

static const size_t counts[] = { 0, 1, 7, 262147 };
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* ---- an in-process world: one host, D device threads ---- */

struct world;
typedef void (*dev_fn)(struct world *w, int dev, struct coll_dev *cd);

struct world {
	int D;
	struct mesh m;
	struct xport *x;
	size_t seg, direct_max;
	double timeout_s;
	dev_fn fn;
	void *arg;
	pthread_mutex_t mu;
	int failures;
	char first[1024];
	/* per-device result pointers for cross-rank comparisons */
	float *res[8];
	pthread_barrier_t bar;
	int counter;
};

static void failf(struct world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(struct world *w, const char *fmt, ...)
{
	pthread_mutex_lock(&w->mu);
	if (!w->failures++) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(w->first, sizeof(w->first), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&w->mu);
}

struct dev_arg {
	struct world *w;
	int dev;
};

static void *dev_main(void *p)
{
	struct dev_arg *da = p;
	struct world *w = da->w;
	struct coll_dev *cd = coll_dev_new(w->x, da->dev, w->seg, w->timeout_s);
	if (!cd) {
		failf(w, "coll_dev_new failed");
		return NULL;
	}
	coll_set_direct_max(cd, w->direct_max);
	w->fn(w, da->dev, cd);
	coll_dev_free(cd);
	return NULL;
}

/* mesh of one host with the given ici sizes (data, fsdp, tensor) */
static void world_mesh(struct world *w, int data, int fsdp, int tensor)
{
	struct cfg c;
	char err[256];
	cfg_defaults(&c);
	c.ici_data_parallelism = data;
	c.ici_fsdp_parallelism = fsdp;
	c.ici_tensor_parallelism = tensor;
	c.dcn_data_parallelism = 1;
	ck_assert_msg(cfg_finish(&c, 1, data * fsdp * tensor, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&w->m, &c);
	w->D = w->m.num_devices;
}

static void world_run(struct world *w, dev_fn fn, void *arg)
{
	int hosts[8] = { 0 };
	pthread_t t[8];
	struct dev_arg da[8];
	w->x = xport_new(0, w->D, hosts, NULL, NULL);
	ck_assert_ptr_nonnull(w->x);
	w->fn = fn;
	w->arg = arg;
	w->failures = 0;
	w->first[0] = 0;
	w->counter = 0;
	pthread_mutex_init(&w->mu, NULL);
	pthread_barrier_init(&w->bar, NULL, (unsigned)w->D);
	for (int i = 0; i < w->D; i++) {
		da[i] = (struct dev_arg){ w, i };
		ck_assert_int_eq(pthread_create(&t[i], NULL, dev_main, &da[i]), 0);
	}
	for (int i = 0; i < w->D; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&w->bar);
	pthread_mutex_destroy(&w->mu);
	xport_free(w->x);
	w->x = NULL;
}

static void group_of(struct world *w, int dev, uint32_t axes, struct mesh_group *mg,
		     struct coll_group *g)
{
	mesh_group(&w->m, dev, axes, mg);
	g->id = mg->id;
	g->n = mg->n;
	g->rank = mg->rank;
	g->devs = mg->devs;
}

/* Inputs: small integers so every sum is exact. */
static float val(int dev, size_t i, int salt)
{
	return (float)((dev * 37 + (int)(i % 1009) * 3 + salt * 11) % 61) - 20.0f;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		abort();
	return p;
}

#define CHECK_RC(w, rc, what, err) \
	do { \
		if (rc) { \
			failf(w, "%s: rc %d: %s", what, rc, err); \
			return; \
		} \
	} while (0)

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

static float fval(int dev, size_t i)
{
	/* not integers: the summation order shows in the bits */
	return (float)sin((double)(dev * 1000003 + (long)i) * 0.37) * (float)(1 + dev);
}

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

/* ---- lists of runs against the contiguous op on the concatenation ---- */

struct runs {
	struct coll_iov *v;
	int n;
};

/* Cuts total floats into separately allocated runs filled from flat:
 * run 0, of odd and empty lengths; RUN_ONE, one run; else runs of that
 * many floats (an FSDP block's rows). */
#define RUN_ONE ((size_t)-1)
static void runs_make(struct runs *rs, const float *flat, size_t total, size_t run)
{
	static const size_t len[] = { 3, 0, 1, 1021, 0, 7, 4099, 1, 2048, 0, 513 };
	size_t at = 0;
	rs->n = 0;
	rs->v = xmalloc(sizeof(*rs->v) * (total + 3));
	for (int k = 0; at < total || (total == 0 && rs->n < 3); k++) {
		size_t c = run == RUN_ONE ? total : run ? run : len[k % 11];
		if (c > total - at)
			c = total - at;
		rs->v[rs->n] = (struct coll_iov){ xmalloc(sizeof(float) * (c ? c : 1)), c };
		memcpy(rs->v[rs->n].buf, flat + at, sizeof(float) * c);
		rs->n++;
		at += c;
	}
}

static void runs_flat(const struct runs *rs, float *flat)
{
	for (int i = 0; i < rs->n; i++) {
		memcpy(flat, rs->v[i].buf, sizeof(float) * rs->v[i].count);
		flat += rs->v[i].count;
	}
}

static void runs_free(struct runs *rs)
{
	for (int i = 0; i < rs->n; i++)
		free(rs->v[i].buf);
	free(rs->v);
}

/* The first float of [0, c) where a and b differ in their bits, or c. */
static size_t first_diff(const float *a, const float *b, size_t c)
{
	for (size_t i = 0; i < c; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)))
			return i;
	return c;
}

struct runs_case {
	size_t c;         /* floats per rank (all_reduce: in all) */
	size_t run;       /* runs_make's */
	bool async;
};

/* op 'a' all_reduce_v, 'r' reduce_scatter_v, 'g' all_gather_v; async:
 * the _async form, waited for at once */
static int list_op(struct coll_dev *cd, const struct coll_group *g, char op, struct runs *rs,
		   const size_t *counts, bool async, char *err, size_t errlen)
{
	if (!async)
		return op == 'a' ? coll_all_reduce_v(cd, g, rs->v, rs->n, err, errlen)
		     : op == 'r' ? coll_reduce_scatter_v(cd, g, rs->v, rs->n, counts, err, errlen)
				 : coll_all_gather_v(cd, g, rs->v, rs->n, counts, err, errlen);
	struct coll_handle *h = op == 'a' ? coll_all_reduce_v_async(cd, g, rs->v, rs->n, err, errlen)
			      : op == 'r' ? coll_reduce_scatter_v_async(cd, g, rs->v, rs->n, counts, err, errlen)
					  : coll_all_gather_v_async(cd, g, rs->v, rs->n, counts, err, errlen);
	return h ? coll_wait(h, xport_now_ns() + 30000000000ull, err, errlen) : -EINVAL;
}

static void runs_ops(struct world *w, int dev, struct coll_dev *cd)
{
	const struct runs_case *rc_ = w->arg;
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank, rc;
	size_t c = rc_->c, counts[8], total = 0, most = 0, own0 = 0;
	for (int b = 0; b < n; b++) {
		/* uneven blocks: rank b's part of a bucket */
		counts[b] = c > 3 ? c - (size_t)((b * 5) % 4) : c;
		if (b < r)
			own0 += counts[b];
		total += counts[b];
		most = counts[b] > most ? counts[b] : most;
	}
	float *flat = xmalloc(sizeof(float) * (total + most * (size_t)n + most));
	float *pad = flat + total, *want = pad + most * (size_t)n, *got = xmalloc(sizeof(float) * (total + 1));
	struct runs rs;
	size_t at;

	/* all_reduce: the runs summed as the contiguous buffer is */
	for (size_t i = 0; i < c; i++)
		flat[i] = fval(dev, i);
	runs_make(&rs, flat, c, rc_->run);
	rc = coll_all_reduce(cd, &g, flat, c, err, sizeof(err));
	CHECK_RC(w, rc, "all_reduce", err);
	rc = list_op(cd, &g, 'a', &rs, NULL, rc_->async, err, sizeof(err));
	CHECK_RC(w, rc, "all_reduce_v", err);
	runs_flat(&rs, got);
	runs_free(&rs);
	if ((at = first_diff(got, flat, c)) < c)
		failf(w, "all_reduce_v n=%d c=%zu runs=%d rank %d elem %zu: %.9g, contiguous %.9g", n, c,
		      rs.n, r, at, got[at], flat[at]);

	/* reduce_scatter: the own block as the contiguous op on the blocks
	 * padded to the largest */
	for (size_t i = 0; i < total; i++)
		flat[i] = fval(dev, i);
	memset(pad, 0, sizeof(float) * most * (size_t)n);
	for (int b = 0, v = 0; b < n; v += (int)counts[b], b++)
		memcpy(pad + most * (size_t)b, flat + v, sizeof(float) * counts[b]);
	runs_make(&rs, flat, total, rc_->run);
	rc = coll_reduce_scatter(cd, &g, want, pad, most, err, sizeof(err));
	CHECK_RC(w, rc, "reduce_scatter", err);
	rc = list_op(cd, &g, 'r', &rs, counts, rc_->async, err, sizeof(err));
	CHECK_RC(w, rc, "reduce_scatter_v", err);
	runs_flat(&rs, got);
	if ((at = first_diff(got + own0, want, counts[r])) < counts[r])
		failf(w, "reduce_scatter_v n=%d c=%zu runs=%d rank %d elem %zu: %.9g, contiguous %.9g", n,
		      c, rs.n, r, at, got[own0 + at], want[at]);

	/* all_gather: every block from its rank, the own block untouched */
	for (size_t i = 0; i < total; i++)
		got[i] = -1.0f;
	for (size_t i = 0; i < counts[r]; i++)
		got[own0 + i] = fval(dev, i);
	runs_free(&rs);
	runs_make(&rs, got, total, rc_->run);
	rc = list_op(cd, &g, 'g', &rs, counts, rc_->async, err, sizeof(err));
	CHECK_RC(w, rc, "all_gather_v", err);
	runs_flat(&rs, got);
	runs_free(&rs);
	at = 0;
	for (int b = 0; b < n; b++) {
		for (size_t i = 0; i < counts[b]; i++) {
			float x = fval(g.devs[b], i);
			if (memcmp(&x, &got[at + i], sizeof(float))) {
				failf(w, "all_gather_v n=%d c=%zu rank %d block %d elem %zu: %.9g, want %.9g", n,
				      c, r, b, i, got[at + i], x);
				b = n;
				break;
			}
		}
		at += b < n ? counts[b] : 0;
	}
	free(flat);
	free(got);
}

/* n = 2, 3, 4; ring (small segments, run ends inside them) and direct;
 * sizes 0, 1, odd, large; one run; async; many short runs, a segment
 * one message over them: 4354 runs of 128 floats a member (llama-bench's
 * FSDP layer at fsdp=4), runs of 1 float */
START_TEST(test_runs_match_contiguous)
{
	static const struct runs_case cases[] = {
		{ 0, 0, false }, { 1, 0, false }, { 7, 0, false }, { 30011, 0, false },
		{ 30011, RUN_ONE, false }, { 30011, 0, true }, { 5, RUN_ONE, true },
		{ 4354 * 128, 128, true }, { 4099, 1, false },
	};
	static const size_t direct[] = { 0, 65536 };
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		/* a list of more than 64 KiB runs on the ring either way */
		for (int d = 0; d < (cases[k].c * sizeof(float) > direct[1] ? 1 : 2); d++) {
			struct world w = { .seg = 4096, .direct_max = direct[d], .timeout_s = 30 };
			world_mesh(&w, _i + 2, 1, 1);
			world_run(&w, runs_ops, (void *)&cases[k]);
			ck_assert_msg(w.failures == 0, "D=%d case %zu direct_max %zu: %s", w.D, k, direct[d],
				      w.first);
		}
	}
}
END_TEST

/* Bad lists are refused before anything is sent. */
START_TEST(test_runs_bad_args)
{
	int hosts[2] = { 0, 0 }, devs[2] = { 0, 1 };
	struct xport *x = xport_new(0, 2, hosts, NULL, NULL);
	struct coll_dev *cd = coll_dev_new(x, 0, 4096, 5);
	struct coll_group g = { .id = 1, .n = 2, .rank = 0, .devs = devs };
	float a[4];
	struct coll_iov v[2] = { { a, 2 }, { a + 2, 2 } }, bad[1] = { { NULL, 3 } };
	size_t counts[2] = { 2, 1 };
	char err[256];
	ck_assert_int_eq(coll_reduce_scatter_v(cd, &g, v, 2, counts, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "reduce_scatter (group 1)") && strstr(err, "4 floats"), "%s", err);
	ck_assert_int_eq(coll_all_gather_v(cd, &g, v, 2, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(coll_all_reduce_v(cd, &g, bad, 1, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(coll_all_reduce_v(cd, &g, v, -1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "all_reduce (group 1): invalid run"), "%s", err);
	coll_dev_free(cd);
	xport_free(x);
}
END_TEST

/* ---- the own block's moves (coll_*_v_fill_async, _add_async) ---- */

/* Moves between floats [v0, v0 + c) of the runs' concatenation and the
 * flat array mem (to_runs: into the runs), cut at run ends and every
 * `cut` floats; their number. */
static int own_moves(const struct runs *rs, size_t v0, size_t c, float *mem, bool to_runs, size_t cut,
		     struct coll_move *mv)
{
	int n = 0;
	for (int i = 0; i < rs->n && c; i++) {
		if (v0 >= rs->v[i].count) {
			v0 -= rs->v[i].count;
			continue;
		}
		size_t k = rs->v[i].count - v0 < c ? rs->v[i].count - v0 : c;
		for (size_t o = 0; o < k; o += cut) {
			size_t m = k - o < cut ? k - o : cut;
			float *r = rs->v[i].buf + v0 + o;
			mv[n++] = (struct coll_move){ to_runs ? r : mem, to_runs ? mem : r, m };
			mem += m;
		}
		c -= k;
		v0 = 0;
	}
	return n;
}

/* A list all-gather whose own block only the collective fills (the runs
 * hold -1 there), from an array apart; a list reduce-scatter whose own
 * sums the collective adds into an array apart: that array's first
 * values plus the contiguous op's sums, bit for bit. */
static void runs_own(struct world *w, int dev, struct coll_dev *cd)
{
	const struct runs_case *rc_ = w->arg;
	struct mesh_group mg;
	struct coll_group g;
	char err[1024];
	group_of(w, dev, 1u << AX_DATA, &mg, &g);
	int n = g.n, r = g.rank, rc, nmv;
	size_t c = rc_->c, counts[8], total = 0, most = 0, own0 = 0, at;
	for (int b = 0; b < n; b++) {
		counts[b] = c > 3 ? c - (size_t)((b * 5) % 4) : c;
		own0 += b < r ? counts[b] : 0;
		total += counts[b];
		most = counts[b] > most ? counts[b] : most;
	}
	float *flat = xmalloc(sizeof(float) * (total + most * (size_t)n + 3 * most + 1));
	float *pad = flat + total, *want = pad + most * (size_t)n, *src = want + most, *dst = src + most;
	struct coll_move *mv = xmalloc(sizeof(*mv) * (total + 8));
	struct runs rs;
	struct coll_handle *h;

	/* all_gather: the own block from src, by the collective */
	for (size_t i = 0; i < total; i++)
		flat[i] = -1.0f;
	for (size_t i = 0; i < counts[r]; i++)
		src[i] = fval(dev, i);
	runs_make(&rs, flat, total, rc_->run);
	nmv = own_moves(&rs, own0, counts[r], src, true, 1000, mv);
	h = coll_all_gather_v_fill_async(cd, &g, rs.v, rs.n, counts, mv, nmv, err, sizeof(err));
	rc = h ? coll_wait(h, xport_now_ns() + 30000000000ull, err, sizeof(err)) : -EINVAL;
	CHECK_RC(w, rc, "all_gather_v_fill", err);
	runs_flat(&rs, flat);
	runs_free(&rs);
	at = 0;
	for (int b = 0; b < n; b++) {
		for (size_t i = 0; i < counts[b]; i++) {
			float x = fval(g.devs[b], i);
			if (memcmp(&x, &flat[at + i], sizeof(float))) {
				failf(w, "all_gather_v_fill n=%d c=%zu rank %d block %d elem %zu: %.9g, want %.9g",
				      n, c, r, b, i, flat[at + i], x);
				b = n;
				break;
			}
		}
		at += b < n ? counts[b] : 0;
	}

	/* reduce_scatter: the own sums added into dst, by the collective */
	for (size_t i = 0; i < total; i++)
		flat[i] = fval(dev, i);
	memset(pad, 0, sizeof(float) * most * (size_t)n);
	for (int b = 0, v = 0; b < n; v += (int)counts[b], b++)
		memcpy(pad + most * (size_t)b, flat + v, sizeof(float) * counts[b]);
	rc = coll_reduce_scatter(cd, &g, want, pad, most, err, sizeof(err));
	CHECK_RC(w, rc, "reduce_scatter", err);
	for (size_t i = 0; i < counts[r]; i++)
		dst[i] = 0.25f * (float)i + 0.1f;
	runs_make(&rs, flat, total, rc_->run);
	nmv = own_moves(&rs, own0, counts[r], dst, false, 777, mv);
	h = coll_reduce_scatter_v_add_async(cd, &g, rs.v, rs.n, counts, mv, nmv, err, sizeof(err));
	rc = h ? coll_wait(h, xport_now_ns() + 30000000000ull, err, sizeof(err)) : -EINVAL;
	runs_free(&rs);
	CHECK_RC(w, rc, "reduce_scatter_v_add", err);
	for (size_t i = 0; i < counts[r]; i++) {
		float x = (0.25f * (float)i + 0.1f) + want[i];
		if (memcmp(&x, &dst[i], sizeof(float))) {
			failf(w, "reduce_scatter_v_add n=%d c=%zu rank %d elem %zu: %.9g, want %.9g", n, c, r,
			      i, dst[i], x);
			break;
		}
	}
	free(mv);
	free(flat);
}

/* n = 2, 3, 4; ring and direct; sizes 0, 1, odd, large; short runs */
START_TEST(test_runs_own_moves)
{
	static const struct runs_case cases[] = {
		{ 0, 0, true }, { 1, 0, true }, { 7, RUN_ONE, true }, { 30011, 0, true }, { 4099, 1, true },
	};
	static const size_t direct[] = { 0, 65536 };
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		for (int d = 0; d < (cases[k].c * sizeof(float) > direct[1] ? 1 : 2); d++) {
			struct world w = { .seg = 4096, .direct_max = direct[d], .timeout_s = 30 };
			world_mesh(&w, _i + 2, 1, 1);
			world_run(&w, runs_own, (void *)&cases[k]);
			ck_assert_msg(w.failures == 0, "D=%d case %zu direct_max %zu: %s", w.D, k, direct[d],
				      w.first);
		}
	}
}
END_TEST

/* Bad moves are refused before anything is sent. */
START_TEST(test_runs_own_bad_args)
{
	int hosts[2] = { 0, 0 }, devs[2] = { 0, 1 };
	struct xport *x = xport_new(0, 2, hosts, NULL, NULL);
	struct coll_dev *cd = coll_dev_new(x, 0, 4096, 5);
	struct coll_group g = { .id = 1, .n = 2, .rank = 0, .devs = devs };
	float a[4], b[2];
	struct coll_iov v[1] = { { a, 4 } };
	struct coll_move ok[1] = { { a, b, 2 } }, bad[1] = { { a, NULL, 2 } };
	size_t counts[2] = { 2, 2 };
	char err[256];
	ck_assert_ptr_null(coll_all_gather_v_fill_async(cd, &g, v, 1, counts, bad, 1, err, sizeof(err)));
	ck_assert_msg(strstr(err, "all_gather (group 1): invalid run"), "%s", err);
	/* a gather's moves fill its own block (2 floats) whole */
	ok[0].count = 1;
	ck_assert_ptr_null(coll_all_gather_v_fill_async(cd, &g, v, 1, counts, ok, 1, err, sizeof(err)));
	ck_assert_msg(strstr(err, "the moves fill 1 floats of the own block's 2"), "%s", err);
	ck_assert_ptr_null(coll_reduce_scatter_v_add_async(cd, &g, v, 1, counts, ok, -1, err, sizeof(err)));
	ck_assert_ptr_null(coll_reduce_scatter_v_add_async(cd, &g, v, 1, counts, NULL, 1, err, sizeof(err)));
	coll_dev_free(cd);
	xport_free(x);
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

/* ---- multi-host: real agents over TLS on loopback ---- */

static const char *meshrun_path(void)
{
	const char *p = getenv("MESHRUN");
	ck_assert_msg(p && *p, "MESHRUN is not set (make test sets it to build/meshrun)");
	ck_assert_msg(access(p, X_OK) == 0, "%s is not an executable", p);
	return p;
}

static void setup(void)
{
	proc_setup("check_coll", 0);
}

/* The shapes test_multihost_paths does not run (it runs 2x1, 3x2 and
 * 4x1, each four ways) */
START_TEST(test_multihost_check)
{
	static const struct { int hosts, devs; } shapes[] = { { 1, 1 }, { 1, 2 }, { 2, 2 }, { 4, 2 } };
	int H = shapes[_i].hosts, D = shapes[_i].devs;
	char hs[16], ds[16];
	static char out[1 << 16];
	snprintf(hs, sizeof(hs), "%d", H);
	snprintf(ds, sizeof(ds), "%d", D);
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", hs,
			 "--devices-per-host", ds, "--check-counts", "0,1,7,262147",
			 "segment_bytes=65536", "collective_timeout_s=60", NULL };
	int rc = proc_capture(argv, out, sizeof(out), 100);
	ck_assert_msg(rc == 0, "hosts %d devices %d: exit %d\n%s", H, D, rc, out);
	ck_assert_msg(strstr(out, "check ok"), "no 'check ok' line:\n%s", out);
	ck_assert_msg(!strstr(out, "mismatch"), "%s", out);
}
END_TEST

/* The message paths across real agents: every op right, every element, at
 * 0 B, 1 element, an odd count, 64 KiB and 1 MiB per rank (and 16 MiB on
 * one configuration of each shape), on 2x1, 3x2 and 4x1, each shape with
 * waiters that poll their link (poll_spin_us default) and that sleep at
 * once (0), one TLS connection per host pair and two (link_streams), and
 * the sync and the async forms. */
START_TEST(test_multihost_paths)
{
	static const struct { int hosts, devs; } shapes[] = { { 2, 1 }, { 3, 2 }, { 4, 1 } };
	int H = shapes[_i / 4].hosts, D = shapes[_i / 4].devs;
	bool spin = (_i / 2) % 2, two = _i % 2, async = spin != two, big = spin && two;
	char hs[16], ds[16], counts[64];
	static char out[1 << 16];
	snprintf(hs, sizeof(hs), "%d", H);
	snprintf(ds, sizeof(ds), "%d", D);
	snprintf(counts, sizeof(counts), "0,1,7,16384,262144%s", big ? ",4194304" : "");
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", hs,
			 "--devices-per-host", ds, "--check-counts", counts,
			 spin ? "poll_spin_us=200" : "poll_spin_us=0",
			 two ? "link_streams=2" : "link_streams=1", "collective_timeout_s=60",
			 async ? "--async" : NULL, NULL };
	int rc = proc_capture(argv, out, sizeof(out), 110);
	ck_assert_msg(rc == 0, "hosts %d devices %d %s %s %s: exit %d\n%s", H, D, argv[9], argv[10],
		      async ? "async" : "sync", rc, out);
	char want[80];
	snprintf(want, sizeof(want), "check ok: 12 ops x %d counts on %d devices%s", big ? 6 : 5,
		 H * D, async ? " (async forms)" : "");
	ck_assert_msg(strstr(out, want), "no '%s' line:\n%s", want, out);
	ck_assert_msg(!strstr(out, "mismatch"), "%s", out);
}
END_TEST

/* Both agents' threads on one core: a stream thread whose watch, armed
 * by a device thread holding the link's lock while bytes wait, wakes and
 * preempts that holder must not trade the core with it (an epoll_ctl and
 * two context switches a round, no byte read: ~300 context switches per
 * iteration before the stream thread yielded once before its kick). 200
 * iterations of a 64 KiB all_gather, every element right, with under 20
 * context switches an iteration (all threads of both agents, start-up
 * included; ~5 now, by getrusage of the reaped children: a count). */
START_TEST(test_one_core_no_livelock)
{
	static char out[1 << 16];
	cpu_set_t was, one;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &was)) {
			CPU_SET(c, &one);
			break;
		}
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	struct rusage r0, r1;
	getrusage(RUSAGE_CHILDREN, &r0);
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", "2",
			 "--op", "all_gather", "--sizes", "64K", "--iters", "200", "--warmup", "5",
			 "poll_spin_us=200", NULL };
	int rc = proc_capture(argv, out, sizeof(out), 100);
	getrusage(RUSAGE_CHILDREN, &r1);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
	ck_assert_msg(rc == 0, "exit %d\n%s", rc, out);
	unsigned long long size = 0, count = 0, wrong = 1;
	double t, alg, bus;
	bool row = false;
	for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (sscanf(l, "%llu %llu %lf %lf %lf %llu", &size, &count, &t, &alg, &bus, &wrong) == 6)
			row = true;
	ck_assert_msg(row && size == 65536 && wrong == 0, "no 65536-byte row with 0 wrong:\n%s", out);
	long cs = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
	ck_assert_msg(cs < 20 * 200, "%ld context switches for 200 iterations on one core\n%s", cs,
		      out);
}
END_TEST

START_TEST(test_multihost_detects_wrong)
{
	static char out[1 << 16];
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", "2",
			 "--devices-per-host", "1", "--check-counts", "7",
			 "--corrupt-for-test", NULL };
	int rc = proc_capture(argv, out, sizeof(out), 60);
	ck_assert_msg(rc != 0, "a corrupted element went unnoticed:\n%s", out);
	ck_assert_msg(strstr(out, "mismatch"), "no mismatch reported:\n%s", out);
}
END_TEST

/* A printed rate in GB/s is size / time_us / 1e3 to the printed digits:
 * time_us is printed to 0.05, the rate to 0.0005. */
static bool rate_matches(unsigned long long size, double t, double gbps)
{
	double slack = (double)size / 1e3 * 0.05 / (t * (t - 0.05)) + 6e-4;
	return t > 0.05 && gbps >= 0 && fabs(gbps - (double)size / t / 1e3) < slack;
}

/* The benches' CPU lines ("# cpu SIZE: X us WHAT (user+sys); Y cores busy"):
 * want of them, each with CPU spent and a busy-core count the machine can
 * hold. */
static void check_cpu_lines(const char *out, int want, const char *what)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int n = 0;
	for (const char *p = out; (p = strstr(p, "# cpu ")); p++) {
		unsigned long long size;
		double us, busy;
		char w[128];
		ck_assert_msg(sscanf(p, "# cpu %llu: %lf us %127[^(](user+sys); %lf cores busy", &size,
				     &us, w, &busy) == 4, "bad cpu line in:\n%s", out);
		ck_assert_msg(strstr(w, what), "cpu line does not say '%s':\n%s", what, out);
		/* it names the size of a table row */
		bool row = false;
		for (const char *l = out; l && *l && !row; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
			unsigned long long first;
			row = l[strspn(l, " ")] != '#' && sscanf(l, "%llu", &first) == 1 && first == size;
		}
		ck_assert_msg(row, "cpu line for %llu bytes names no row:\n%s", size, out);
		/* CPU time is accounted in scheduler ticks: over the short span
		 * of a small row it can read up to a core high; a count taken
		 * twice (the bug this guards against) reads about 2x cores */
		ck_assert_msg(us > 0 && busy > 0 && busy <= (double)cores + 1.0,
			      "implausible cpu figures (%.1f us, %.2f cores of %ld):\n%s", us, busy,
			      cores, out);
		n++;
	}
	ck_assert_msg(n == want, "%d cpu lines, want %d:\n%s", n, want, out);
}

START_TEST(test_multihost_table)
{
	static char out[1 << 16];
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", "2",
			 "--devices-per-host", "2", "--op", "all", "--sizes", "4K,1M",
			 "--iters", "2", "--warmup", "1", NULL };
	int rc = proc_capture(argv, out, sizeof(out), 100);
	ck_assert_msg(rc == 0, "exit %d\n%s", rc, out);
	/* one row per size per op, wrong = 0 in each */
	static const char *ops[] = { "all_gather", "reduce_scatter", "all_reduce",
				     "all_to_all", "permute", "broadcast" };
	for (int k = 0; k < 6; k++)
		ck_assert_msg(strstr(out, ops[k]), "no %s section:\n%s", ops[k], out);
	int rows = 0;
	for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		unsigned long long size, count;
		double t, alg, bus;
		long wrong;
		if (sscanf(line, "%llu %llu %lf %lf %lf %ld", &size, &count, &t, &alg, &bus, &wrong) == 6) {
			rows++;
			ck_assert_msg(wrong == 0, "wrong elements in:\n%s", out);
			/* busbw is algbw times a factor in (0, 2] */
			ck_assert_msg(rate_matches(size, t, alg) && bus >= 0 && bus <= 2 * alg + 1e-3,
				      "bad figures in:\n%s", out);
		}
	}
	ck_assert_msg(rows == 12, "%d table rows, want 12:\n%s", rows, out);
	check_cpu_lines(out, 12, "per iteration, all agents");
}
END_TEST

/* The per-record logs (net/rec_log.h) a run left in dir: the bytes of
 * all send()s that carried a record or more, and the largest. */
static void rec_log_sends(const char *dir, unsigned long long *total, unsigned long long *largest)
{
	*total = *largest = 0;
	DIR *d = opendir(dir);
	ck_assert_msg(d, "no %s", dir);
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, "rec.", 4))
			continue;
		char path[512], kind[8];
		unsigned long long bytes;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "r");
		ck_assert_msg(f, "%s", path);
		files++;
		while (fscanf(f, "%7s %*u %*d %*u %*u %*u %llu %*u %*u", kind, &bytes) == 2) {
			if (strcmp(kind, "send") || bytes < 16384)
				continue;
			*total += bytes;
			if (bytes > *largest)
				*largest = bytes;
		}
		fclose(f);
	}
	closedir(d);
	ck_assert_int_eq(files, 2);        /* one per agent */
}

START_TEST(test_link_table)
{
	static char out[1 << 16];
	/* 0: both ways, 1: --oneway, 2: --pingpong (one message at a time,
	 * each checked at the end like the others' last). --oneway with
	 * every message written by the sending thread (p2p_handoff_bytes=0),
	 * --pingpong with the 1 MiB ones handed to the stream threads to
	 * seal and the 64 KiB ones written by the sending thread. */
	static const char *const mode[] = { NULL, "--oneway", "--pingpong" };
	for (int oneway = 0; oneway < 3; oneway++) {
		char *argv[] = { (char *)meshrun_path(), "bench", "link", "--hosts", "2",
				 "--sizes", "64K,1M", "--iters", "20", (char *)mode[oneway],
				 oneway == 2 ? "p2p_handoff_bytes=262144" : oneway ? "p2p_handoff_bytes=0" : NULL,
				 NULL };
		/* the pingpong's records logged: its messages are
		 * point-to-point, so no send() carries more than
		 * NET_P2P_PUSH_BYTES and the record that crossed it (with
		 * a frame header's), where max_send_bytes is 1 MiB */
		char logdir[128];
		snprintf(logdir, sizeof(logdir), "%s/reclog", tmpdir);
		if (oneway == 2) {
			ck_assert_int_eq(mkdir(logdir, 0700), 0);
			setenv("MESHRUN_REC_LOG", logdir, 1);
		}
		int rc = proc_capture(argv, out, sizeof(out), 100);
		unsetenv("MESHRUN_REC_LOG");
		ck_assert_msg(rc == 0, "exit %d\n%s", rc, out);
		if (oneway == 2) {
			unsigned long long total, largest;
			rec_log_sends(logdir, &total, &largest);
			/* 20 timed messages of 1 MiB each way, and more */
			ck_assert_uint_ge(total, 40ull << 20);
			ck_assert_uint_gt(largest, NET_P2P_PUSH_BYTES - 16384);
			ck_assert_uint_le(largest, NET_P2P_PUSH_BYTES + 2 * (16384 + 200));
		}
		ck_assert_msg(strstr(out, oneway == 2 ? "size oneway_us GBps\n" : "size time_us GBps\n"),
			      "no header:\n%s", out);
		static const unsigned long long want_sizes[] = { 65536, 1048576 };
		const unsigned long long *want = want_sizes;
		int rows = 0;
		for (char *line = out; line && *line;
		     line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
			unsigned long long size;
			double t, gbps;
			char end;
			if (sscanf(line, "%llu %lf %lf%c", &size, &t, &gbps, &end) == 4 && end == '\n') {
				ck_assert_msg(rows < 2 && size == want[rows], "unexpected row:\n%s", out);
				ck_assert_msg(rate_matches(size, t, gbps), "bad figures in:\n%s", out);
				rows++;
			}
		}
		ck_assert_msg(rows == 2, "%d rows, want 2:\n%s", rows, out);
		check_cpu_lines(out, 2, oneway == 2 ? "per message, host 0's agent" :
					oneway ? "per message, both agents" :
						 "per message each way, both agents");
		/* the pingpong's send call time, a line a size in order */
		int sends = 0;
		for (const char *p = out; oneway == 2 && (p = strstr(p, "# send ")); p++) {
			unsigned long long size;
			double us;
			ck_assert_msg(sscanf(p, "# send %llu: %lf us in the send call", &size, &us) == 2,
				      "bad send line in:\n%s", out);
			ck_assert_msg(sends < 2 && size == want_sizes[sends] && us >= 0,
				      "unexpected send line in:\n%s", out);
			sends++;
		}
		ck_assert_msg(sends == (oneway == 2 ? 2 : 0), "%d send lines:\n%s", sends, out);
	}
}
END_TEST

/* ---- a host dies while collectives run ---- */

/* The pid of the agent of host `host` among launcher's children, or -1:
 * local_launch starts each as `<exe> bench ... --host-id <h> ...`. */
static pid_t agent_of(pid_t launcher, int host)
{
	char want[16], path[300], buf[4096];
	pid_t found = -1;
	snprintf(want, sizeof(want), "%d", host);
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	struct dirent *e;
	while (found < 0 && (e = readdir(d))) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		char state;
		int ppid;
		if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != launcher)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
			if (!strcmp(buf + i, "--host-id") && i + 10 < n && !strcmp(buf + i + 10, want))
				found = (pid_t)atoi(e->d_name);
	}
	closedir(d);
	return found;
}

/* Some line of text contains both a and b. */
static bool line_with(const char *text, const char *a, const char *b)
{
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *end = strchr(l, '\n');
		size_t len = end ? (size_t)(end - l) : strlen(l);
		const char *pa = strstr(l, a), *pb = strstr(l, b);
		if (pa && pb && (size_t)(pa - l) < len && (size_t)(pb - l) < len)
			return true;
	}
	return false;
}

/* Three agents run all_reduce for good; host 1's agent is SIGKILLed in the
 * middle. The whole run must fail within heartbeat_timeout_s + 4 s, and
 * stderr must blame host 1 during all_reduce (and nobody else). */
START_TEST(test_multihost_host_lost)
{
	const double hb = 2.0;
	static char errs[1 << 16];
	char *argv[] = { (char *)meshrun_path(), "bench", "collectives", "--hosts", "3",
			 "--op", "all_reduce", "--sizes", "16M", "--iters", "100000",
			 "--warmup", "0", "heartbeat_timeout_s=2", NULL };
	struct proc p;
	proc_start(&p, "lost", argv, -1);

	/* running collectives: host 0 prints the table header just before the
	 * loop's one barrier, then all_reduce runs back to back. Without
	 * warm-up the barrier is over well inside the 0.5 s: with 5 warm-up
	 * all_reduces it came ~0.3 s after the header, and a kill that lands
	 * in it is, truly, "lost host 1 ... during barrier" (a CI flake). */
	ck_assert_msg(proc_wait_output(&p, "# all_reduce", 60) && proc_wait(&p, 0) == -1,
		      "collectives never started:\n%s", slurp(p.err));
	usleep(500000);
	pid_t victim = agent_of(p.pid, 1);
	ck_assert_msg(victim > 0, "no agent of host 1 among the children of %d", (int)p.pid);

	double t_kill = now_s();
	ck_assert_int_eq(kill(victim, SIGKILL), 0);
	int rc = proc_wait(&p, hb + 4.0);
	double took = now_s() - t_kill;
	proc_kill(&p);
	snprintf(errs, sizeof(errs), "%s", slurp(p.err));

	ck_assert_msg(rc != -1, "still running %.1f s after host 1 was killed:\n%s", took, errs);
	ck_assert_msg(rc > 0 && rc < 128, "run ended with status %d after host 1 was killed:\n%s",
		      rc, errs);
	ck_assert_msg(line_with(errs, "lost host 1", "all_reduce"),
		      "stderr does not say host 1 was lost during all_reduce:\n%s", errs);
	ck_assert_msg(!strstr(errs, "lost host 0") && !strstr(errs, "lost host 2"),
		      "a surviving host is blamed:\n%s", errs);
}
END_TEST

/* ---- receives that sum on arrival (xport_irecv_add) ---- */

/* buf[i] is a[i] + b[i], bit for bit */
static void expect_sums(const float *buf, const float *a, const float *b, int n)
{
	for (int i = 0; i < n; i++) {
		float want = a[i] + b[i];
		ck_assert_msg(!memcmp(&buf[i], &want, sizeof(float)), "elem %d: %.9g want %.9g", i,
			      buf[i], want);
	}
}

START_TEST(test_xport_recv_add)
{
	int hosts[2] = { 0, 0 };
	struct xport *x = xport_new(0, 2, hosts, NULL, NULL);
	ck_assert_ptr_nonnull(x);
	enum { N = 1003 };
	float *snd = xmalloc(sizeof(float) * N), *buf = xmalloc(sizeof(float) * N);
	float *add = xmalloc(sizeof(float) * N), *old = xmalloc(sizeof(float) * N);
	for (int i = 0; i < N; i++) {
		snd[i] = 1.0f / (float)(i + 3);
		add[i] = (float)i * 1.1f + 1e-3f;
		buf[i] = old[i] = -0.7f * (float)i;
	}
	struct xmeta m = { .group = 1, .seq = 1 };
	struct xreq *rr, *sr;
	char err[256];
	/* only whole floats */
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, add, 6, &rr), -EINVAL);

	/* receive posted first, separate addend: buf = sent + addend */
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, add, sizeof(float) * N, &rr), 0);
	ck_assert_int_eq(xport_isend(x, 0, 1, &m, snd, sizeof(float) * N, &sr), 0);
	ck_assert_int_eq(xport_wait(rr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_wait(sr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	expect_sums(buf, snd, add, N);
	/* send first, in place: buf += sent */
	memcpy(buf, old, sizeof(float) * N);
	m.seq = 2;
	ck_assert_int_eq(xport_isend(x, 0, 1, &m, snd, sizeof(float) * N, &sr), 0);
	ck_assert_int_eq(xport_irecv_add(x, 0, 1, &m, buf, buf, sizeof(float) * N, &rr), 0);
	ck_assert_int_eq(xport_wait(rr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_wait(sr, xport_now_ns() + 1000000000ull, err, sizeof(err)), 0);
	expect_sums(buf, old, snd, N);
	/* bytes off a stream need no alignment: N - 2 floats land at offset 8 from
	 * an odd address, the rest of buf untouched */
	uint8_t *raw = xmalloc(sizeof(float) * N + 1);
	memcpy(raw + 1, snd, sizeof(float) * N);
	memcpy(buf, old, sizeof(float) * N);
	struct xreq fake = { .kind = XREQ_RECV, .buf = buf, .len = sizeof(float) * N,
			     .addend = add };
	xport_land(&fake, 8, raw + 1, sizeof(float) * (N - 2));
	for (int i = 0; i < N; i++) {
		float want = i < 2 ? old[i] : snd[i - 2] + add[i];
		ck_assert_msg(!memcmp(&buf[i], &want, sizeof(float)), "elem %d: %.9g want %.9g", i,
			      buf[i], want);
	}
	/* a stream cut at odd places (as TLS records may cut a payload): the
	 * bytes of a split float wait for the next piece */
	memcpy(buf, old, sizeof(float) * N);
	fake.addend = buf;
	struct xland st = { 0 };
	static const size_t cuts[] = { 1, 2, 3, 5, 4, 7, 1, 1, 1, 9, 4000 };
	size_t at = 0;
	for (size_t k = 0; at < sizeof(float) * N; k++) {
		size_t len = k < sizeof(cuts) / sizeof(cuts[0]) ? cuts[k] : 13;
		if (len > sizeof(float) * N - at)
			len = sizeof(float) * N - at;
		xport_land_stream(&fake, &st, raw + 1 + at, len);
		at += len;
	}
	ck_assert_uint_eq(st.ncarry, 0);
	ck_assert_uint_eq(st.off, sizeof(float) * N);
	expect_sums(buf, old, snd, N);
	free(raw);
	free(snd);
	free(buf);
	free(add);
	free(old);
	xport_free(x);
}
END_TEST

/* What a host's transport asks of its net layer, recorded instead of sent. */
struct mock_net {
	struct xreq *sent[16];      /* send_ready: data frames to write */
	int nsent;
	uint64_t ready_tag[16];     /* recv_posted: RecvReady frames */
	size_t ready_len[16];
	int nready;
};

static void mock_recv_posted(void *ctx, struct xreq *r)
{
	struct mock_net *m = ctx;
	ck_assert_int_lt(m->nready, 16);
	m->ready_tag[m->nready] = r->tag;
	m->ready_len[m->nready++] = r->len;
}

static void mock_send_ready(void *ctx, struct xreq *r)
{
	struct mock_net *m = ctx;
	ck_assert_int_lt(m->nsent, 16);
	m->sent[m->nsent++] = r;
}

static const struct xport_remote_ops mock_ops = { .recv_posted = mock_recv_posted,
						  .send_ready = mock_send_ready };

/* Eager data from device 0 (host 0) arrives at host 1's transport: the
 * staging request it is read into, or NULL with the reason. */
static struct xreq *eager_arrives(struct xport *x, const struct xmeta *m, const void *data,
				  size_t len, bool complete, const char **why)
{
	struct xreq *r = xport_remote_data(x, 0, 1, xmeta_tag(m), len, true, why);
	if (r && len)
		memcpy(r->buf, data, len);
	if (r && complete)
		xport_complete(r, 0);
	return r;
}

/* Small messages go out without waiting for the RecvReady, within a credit
 * per host; the receiver stages what comes before its receive, within the
 * same credit, and still sends every RecvReady, which returns the credit. */
/* A waiter's poll hook that plays the peer: the message "arrives" when the
 * waiter polls after more than 30 us away from its link (YIELD_BUSY_NS,
 * net/xport.c: the thread that ran meanwhile was the peer, sending it);
 * with deliver_on_end, when the waiter stops polling to sleep instead. */
struct yield_peer {
	struct xport *x;
	uint64_t last_ns;
	int polls, by_poll, ends;
	bool deliver_on_end;
	uint8_t data[256];
};

static void yield_peer_land(struct yield_peer *p, const struct xreq *req)
{
	const char *why;
	struct xreq *r = xport_remote_data(p->x, req->src, req->dst, req->tag, req->len, false, &why);
	ck_assert_msg(r != NULL, "%s", why);
	memcpy(r->buf, p->data, r->len);
	xport_complete(r, 0);
}

static bool yield_peer_poll(void *ctx, struct xreq *req, bool first)
{
	struct yield_peer *p = ctx;
	uint64_t now = xport_now_ns();
	bool gap = !first && now - p->last_ns > 30 * 1000;
	p->last_ns = now;
	p->polls++;
	if (!gap || p->deliver_on_end || p->by_poll)
		return false;
	yield_peer_land(p, req);
	p->by_poll++;
	return true;
}

static void yield_peer_end(void *ctx, struct xreq *req, bool done)
{
	struct yield_peer *p = ctx;
	if (done)
		return;
	/* about to sleep: the stream thread would read it now */
	if (p->deliver_on_end && !p->ends)
		yield_peer_land(p, req);
	p->ends++;
}

static void yield_peer_posted(void *ctx, struct xreq *r)
{
	(void)ctx;
	(void)r;
}

static atomic_bool hog_stop;

static void *hog_main(void *arg)
{
	(void)arg;
	while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
		;
	return NULL;
}

/* One remote receive waited on with a busy thread on the waiter's one
 * CPU, so its yields give the core away. cores: xport_set_cores. */
static void wait_beside_hog(struct yield_peer *p, int cores, int *rc, char *err, size_t errlen)
{
	static const struct xport_remote_ops ops = { .recv_posted = yield_peer_posted,
						     .send_ready = yield_peer_posted,
						     .poll = yield_peer_poll,
						     .poll_end = yield_peer_end };
	int hosts[2] = { 0, 1 };
	for (size_t i = 0; i < sizeof(p->data); i++)
		p->data[i] = (uint8_t)(i * 7 + 1);
	p->x = xport_new(0, 2, hosts, &ops, p);
	ck_assert_ptr_nonnull(p->x);
	xport_set_poll_spin(p->x, 5ull * 1000 * 1000 * 1000);    /* never the limit here */
	xport_set_cores(p->x, cores);
	cpu_set_t was, one;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setaffinity_np(&at, sizeof(one), &one);
	pthread_t hog;
	atomic_store(&hog_stop, false);
	ck_assert_int_eq(pthread_create(&hog, &at, hog_main, NULL), 0);
	pthread_attr_destroy(&at);
	uint8_t got[256] = { 0 };
	struct xmeta m = { .group = 3, .seq = 1 };
	struct xreq *r;
	ck_assert_int_eq(xport_irecv(p->x, 1, 0, &m, got, sizeof(got), &r), 0);
	*rc = xport_wait(r, xport_now_ns() + 3ull * 1000 * 1000 * 1000, err, errlen);
	atomic_store(&hog_stop, true);
	pthread_join(hog, NULL);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
	if (!*rc)
		ck_assert_mem_eq(got, p->data, sizeof(got));
	xport_free(p->x);
}

/* A yield that gave the core away (another thread on the waiter's core ran
 * for over 30 us) ends the spin only when the machine has more runnable
 * threads than cores. With cores to spare (here: a count no machine
 * reaches) the waiter polls on and reads what came meanwhile, from a peer
 * that was the thread that ran: a waiter that slept instead would time
 * out, as nothing else delivers. With the cores taken (0), it stops
 * polling to sleep, and the data comes the sleeper's way. */
START_TEST(test_xport_spin_on_free_cores)
{
	char err[256] = "";
	int rc;
	struct yield_peer p = { 0 };
	wait_beside_hog(&p, 1 << 20, &rc, err, sizeof(err));
	ck_assert_msg(rc == 0, "the waiter stopped polling with cores to spare: %s (%d polls)", err,
		      p.polls);
	ck_assert_int_eq(p.by_poll, 1);
	ck_assert_int_eq(p.ends, 0);

	struct yield_peer q = { .deliver_on_end = true };
	wait_beside_hog(&q, 0, &rc, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_int_eq(q.ends, 1);
	ck_assert_int_eq(q.by_poll, 0);
}
END_TEST

/* A stream thread's held wake-up (xport_hold_wakes, small15): a request
 * completed while wake-ups are held leaves its sleeping waiter asleep
 * until xport_release_wakes, so the woken device thread does not preempt
 * the completer while it still holds the link's lock. The waiter cannot
 * return before the release (it waits for PK_DONE), so no clock decides. */
struct held_waiter {
	struct xreq *r;
	_Atomic int done;
	int rc;
};

static void *held_wait(void *arg)
{
	struct held_waiter *w = arg;
	char err[256];
	w->rc = xport_wait(w->r, xport_now_ns() + 20000000000ull, err, sizeof(err));
	atomic_store(&w->done, 1);
	return NULL;
}

START_TEST(test_xport_wake_held)
{
	int hosts[2] = { 0, 1 };
	struct mock_net nb = { 0 };
	struct xport *b = xport_new(1, 2, hosts, &mock_ops, &nb);
	ck_assert_ptr_nonnull(b);
	float got[4];
	struct xmeta m = { .group = 3, .seq = 1 };
	struct held_waiter w = { 0 };
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m, got, sizeof(got), &w.r), 0);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &w), 0);
	/* asleep: its parker is in the request's completion word */
	while (atomic_load(&w.r->wait) <= 2)
		sched_yield();
	xport_hold_wakes();
	xport_complete(w.r, 0);
	ck_assert_int_eq(xport_wakes_held(), 1);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	for (int i = 0; i < 100; i++)
		sched_yield();
	ck_assert_int_eq(atomic_load(&w.done), 0);
	xport_release_wakes();
	ck_assert_int_eq(xport_wakes_held(), 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(w.rc, 0);
	/* outside a hold a completion wakes at once, as before */
	struct held_waiter v = { 0 };
	m.seq = 2;
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m, got, sizeof(got), &v.r), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &v), 0);
	while (atomic_load(&v.r->wait) <= 2)
		sched_yield();
	xport_complete(v.r, 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(v.rc, 0);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	/* a send's wake-up is not held (an ack may end it mid-turn, and
	 * the turn goes on) */
	struct held_waiter u = { 0 };
	m.seq = 3;
	ck_assert_int_eq(xport_isend(b, 1, 0, &m, got, sizeof(got), &u.r), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, held_wait, &u), 0);
	while (atomic_load(&u.r->wait) <= 2)
		sched_yield();
	xport_hold_wakes();
	xport_complete(u.r, 0);
	ck_assert_int_eq(xport_wakes_held(), 0);
	pthread_join(t, NULL);
	xport_release_wakes();
	ck_assert_int_eq(u.rc, 0);
	ck_assert_uint_eq(xport_wakes_deferred(b), 1);
	xport_free(b);
}
END_TEST

START_TEST(test_xport_eager)
{
	int hosts[2] = { 0, 1 };
	struct mock_net na = { 0 }, nb = { 0 };
	struct xport *a = xport_new(0, 2, hosts, &mock_ops, &na);
	struct xport *b = xport_new(1, 2, hosts, &mock_ops, &nb);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	xport_set_eager(a, 64, 256);
	xport_set_eager(b, 64, 256);
	float data[16], got[16], add[16];
	for (int i = 0; i < 16; i++) {
		data[i] = 0.25f * (float)i - 1.0f;
		add[i] = 3.0f + (float)i;
	}
	struct xmeta m[8];
	for (int k = 0; k < 8; k++)
		m[k] = (struct xmeta){ .group = 2, .seq = (uint64_t)k + 1 };
	struct xreq *s[8], *r;
	char err[256];
	const char *why;
	uint64_t soon = xport_now_ns() + 1000000000ull;

	/* sender: four 64-byte sends use the 256-byte credit and go at once */
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(xport_isend(a, 0, 1, &m[k], data, 64, &s[k]), 0);
		ck_assert_int_eq(na.nsent, k + 1);
		ck_assert(na.sent[k] == s[k] && s[k]->eager);
		xport_complete(s[k], 0);   /* the net layer wrote it */
		ck_assert_int_eq(xport_wait(s[k], soon, err, sizeof(err)), 0);
	}
	/* the fifth waits for its RecvReady; a larger one never goes eagerly */
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[4], data, 64, &s[4]), 0);
	uint8_t big[128] = { 0 };
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[5], big, sizeof(big), &s[5]), 0);
	ck_assert_int_eq(na.nsent, 4);
	ck_assert_int_eq(xport_wait(s[4], 0, err, sizeof(err)), -EAGAIN);

	/* receiver: message 1 arrives before its receive and is staged; the
	 * receive completes at once and still sends its RecvReady */
	ck_assert_ptr_nonnull(eager_arrives(b, &m[0], data, 64, true, &why));
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[0], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert(!memcmp(got, data, 64));
	ck_assert_int_eq(nb.nready, 1);
	ck_assert_uint_eq(nb.ready_tag[0], xmeta_tag(&m[0]));
	ck_assert_uint_eq(nb.ready_len[0], 64);
	/* that RecvReady returns 64 bytes of credit: a new send goes eagerly,
	 * the one already waiting keeps waiting for its own */
	ck_assert_ptr_null(xport_remote_ready(a, 0, 1, xmeta_tag(&m[0]), 64));
	ck_assert_int_eq(na.nsent, 4);
	ck_assert_int_eq(xport_isend(a, 0, 1, &m[6], data, 64, &s[6]), 0);
	ck_assert_int_eq(na.nsent, 5);
	ck_assert(s[6]->eager);
	xport_complete(s[6], 0);
	ck_assert_int_eq(xport_wait(s[6], soon, err, sizeof(err)), 0);
	/* ...and the waiting one goes when its RecvReady comes, not eagerly */
	struct xreq *w = xport_remote_ready(a, 0, 1, xmeta_tag(&m[4]), 64);
	ck_assert(w == s[4] && !w->eager);
	xport_complete(w, 0);
	ck_assert_int_eq(xport_wait(s[4], soon, err, sizeof(err)), 0);

	/* receiver: a receive posted while its eager data is still arriving
	 * gets it when the last byte is in, summed with its addend */
	struct xreq *st = eager_arrives(b, &m[1], data, 64, false, &why);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(xport_irecv_add(b, 0, 1, &m[1], got, add, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), -EAGAIN);
	xport_complete(st, 0);
	ck_assert_int_eq(xport_wait(r, soon, err, sizeof(err)), 0);
	for (int i = 0; i < 16; i++)
		ck_assert_float_eq(got[i], data[i] + add[i]);

	/* the staged bytes are bounded by the credit: 3 x 64 staged + 64 fit,
	 * the next is refused with the reason */
	ck_assert_ptr_nonnull(eager_arrives(b, &m[2], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[3], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[6], data, 64, true, &why));
	ck_assert_ptr_nonnull(eager_arrives(b, &m[7], data, 64, true, &why));
	ck_assert_ptr_null(eager_arrives(b, &(struct xmeta){ .group = 2, .seq = 99 }, data, 64, true,
					 &why));
	ck_assert_str_eq(why, "is eager data beyond the credit (eager_max_bytes)");
	/* receives free their staged bytes; more than eager_max in one
	 * message is refused however much is free */
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[2], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[3], got, 64, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(nb.nready, 4);
	ck_assert_ptr_null(xport_remote_data(b, 0, 1, 77, sizeof(big), true, &why));
	ck_assert_str_eq(why, "is eager data beyond the credit (eager_max_bytes)");
	/* a staged message and a receive of another size: the receive fails */
	ck_assert_int_eq(xport_irecv(b, 0, 1, &m[6], got, 32, &r), 0);
	ck_assert_int_eq(xport_wait(r, 0, err, sizeof(err)), -EMSGSIZE);
	ck_assert_msg(strstr(err, "size mismatch"), "%s", err);
	/* data that is not eager still needs its receive posted */
	ck_assert_ptr_null(xport_remote_data(b, 0, 1, 78, 64, false, &why));
	ck_assert_str_eq(why, "matches no posted receive");
	w = xport_remote_ready(a, 0, 1, xmeta_tag(&m[5]), sizeof(big));
	ck_assert(w == s[5] && !w->eager);
	xport_complete(w, 0);
	ck_assert_int_eq(xport_wait(s[5], soon, err, sizeof(err)), 0);
	/* m[7] stays staged and the RecvReady-less eager sends stay recorded:
	 * freeing the transports frees them (ASan/valgrind see no leak) */
	xport_free(a);
	xport_free(b);
}
END_TEST

/* ---- a send's buffer is the caller's again only when it is safe ---- */

/* Two hosts of one job as struct nets in this process (one device each),
 * over TLS on loopback, with link recovery and the given faults. */
struct duo {
	struct net *n[2];
	struct xport *x[2];
	struct fault_plan faults[2];
	int rc[2];
	char err[2][512];
	uint64_t handoff;      /* net_params.p2p_handoff_bytes of both hosts */
};

struct duo_start {
	struct duo *d;
	int h;
};

static void *duo_start_main(void *arg)
{
	struct duo_start *a = arg;
	a->d->rc[a->h] = net_start(a->d->n[a->h], a->d->err[a->h], sizeof(a->d->err[a->h]));
	return NULL;
}

static void duo_start(struct duo *d)
{
	static const int dev_host[2] = { 0, 1 };
	char certs[300], coord[64];
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", free_port());
	for (int h = 0; h < 2; h++) {
		struct net_params p = {
			.host_id = h, .num_hosts = 2, .devices_per_host = 1,
			.coordinator = coord, .listen = "127.0.0.1:0", .coord_fd = -1,
			.data_fd = -1, .certs_dir = certs, .heartbeat_interval_s = 0.2,
			.heartbeat_timeout_s = 20, .connect_timeout_s = 10, .done_timeout_s = 10,
			.max_frame_bytes = 64u << 20, .replay_buffer_bytes = 64u << 20,
			.reconnect_timeout_s = 20, .faults = &d->faults[h],
			.p2p_handoff_bytes = d->handoff,
		};
		int status;
		d->n[h] = net_new(&p, &status, d->err[h], sizeof(d->err[h]));
		ck_assert_msg(d->n[h], "host %d: %s", h, d->err[h]);
		d->x[h] = xport_new(h, 2, dev_host, net_xport_ops(), d->n[h]);
		ck_assert_ptr_nonnull(d->x[h]);
		xport_set_eager(d->x[h], 65536, 8 * 65536);
		xport_set_poll_spin(d->x[h], 200 * 1000);
		net_set_xport(d->n[h], d->x[h]);
	}
	pthread_t t[2];
	struct duo_start a[2] = { { d, 0 }, { d, 1 } };
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&t[h], NULL, duo_start_main, &a[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	for (int h = 0; h < 2; h++)
		ck_assert_msg(d->rc[h] == NET_OK, "host %d: start: %s", h, d->err[h]);
}

static void *duo_finish_main(void *arg)
{
	struct duo_start *a = arg;
	a->d->rc[a->h] = net_finish(a->d->n[a->h], a->d->err[a->h], sizeof(a->d->err[a->h]));
	return NULL;
}

/* Both hosts finish (the Done exchange) at once, then go. */
static void duo_free(struct duo *d)
{
	pthread_t t[2];
	struct duo_start a[2] = { { d, 0 }, { d, 1 } };
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&t[h], NULL, duo_finish_main, &a[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	for (int h = 0; h < 2; h++) {
		ck_assert_msg(d->rc[h] == NET_OK, "host %d: finish: %s", h, d->err[h]);
		net_free(d->n[h]);
		xport_free(d->x[h]);
	}
}

/* Resets (ss -K: an RST, unread bytes lost) every established TCP
 * connection this process has: the duo's one data link. The count. */
static int reset_own_connections(void)
{
	char cmd[160], line[1024];
	int n = 0;
	snprintf(cmd, sizeof(cmd), "ss -tnpH state established 2>/dev/null");
	FILE *f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	char pidpat[32];
	snprintf(pidpat, sizeof(pidpat), "pid=%d,", (int)getpid());
	int ports[16][2], np = 0;
	while (fgets(line, sizeof(line), f) && np < 16) {
		char a[128], b[128];
		if (!strstr(line, pidpat) || sscanf(line, "%*s %*s %127s %127s", a, b) != 2)
			continue;
		char *pa = strrchr(a, ':'), *pb = strrchr(b, ':');
		if (pa && pb) {
			ports[np][0] = atoi(pa + 1);
			ports[np][1] = atoi(pb + 1);
			np++;
		}
	}
	pclose(f);
	for (int i = 0; i < np; i++) {
		snprintf(cmd, sizeof(cmd), "ss -K -tnH state established '( sport = :%d and dport = :%d )'",
			 ports[i][0], ports[i][1]);
		f = popen(cmd, "r");
		ck_assert_ptr_nonnull(f);
		while (fgets(line, sizeof(line), f))
			n++;
		pclose(f);
	}
	return n;
}

/* Host 0 sends 256 KiB (four data frames) that host 1 does not read for
 * 3 s (a black hole on its side of the link); meanwhile the connection is
 * reset, so what was written but not read is lost and must be resent from
 * host 0's replay list, which keeps the caller's buffer by reference. The
 * send must not complete before host 1 acknowledged it: a send that
 * completed when its bytes were written would let the caller overwrite
 * the buffer (which this test does the moment the send completes) and the
 * resend would carry the new bytes. Host 1 must get the original ones.
 * Twice: the sending thread writes the big message itself (_i = 0), and
 * it hands it to the link's stream thread (_i = 1, p2p_handoff_bytes). */
START_TEST(test_send_buffer_across_reset)
{
	enum { BIG = 256 << 10, SMALL = 1024 };
	struct duo d = { .handoff = _i ? 64u << 10 : 0 };
	char err[512];
	/* host 1 holds reads and writes for 3 s from its second data frame */
	ck_assert_int_eq(fault_parse(&d.faults[1], "blackhole:link=1-0:frame=2:s=3", 2, err,
				     sizeof(err)), 0);
	duo_start(&d);
	uint8_t *big = malloc(BIG), *got = calloc(1, BIG), small[2][SMALL], in[2][SMALL];
	ck_assert(big && got);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	memset(small, 0x5a, sizeof(small));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 3 };
	struct xreq *r_big, *s_big, *s_small[2], *r_small[2];
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;

	/* host 1: the receive (its RecvReady rides on the first small send),
	 * then the second small send, at which its link goes silent */
	m.chunk = 0;
	ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, got, BIG, &r_big), 0);
	for (int k = 0; k < 2; k++) {
		m.chunk = 1 + (uint32_t)k;
		ck_assert_int_eq(xport_irecv(d.x[0], 1, 0, &m, in[k], SMALL, &r_small[k]), 0);
		ck_assert_int_eq(xport_isend(d.x[1], 1, 0, &m, small[k], SMALL, &s_small[k]), 0);
	}
	/* host 0: the first small message brings the RecvReady; the big send
	 * then goes out into the socket, which host 1 does not read */
	ck_assert_msg(xport_wait(r_small[0], long_, err, sizeof(err)) == 0, "%s", err);
	m.chunk = 0;
	ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, big, BIG, &s_big), 0);
	bool done = false;
	for (double end = now_s() + 1.0; now_s() < end && !done;) {
		int rc = xport_wait(s_big, 0, err, sizeof(err));
		if (rc != -EAGAIN) {
			ck_assert_msg(rc == 0, "%s", err);
			done = true;
			memset(big, 0xee, BIG);       /* the caller's buffer again */
		}
		usleep(1000);
	}
	ck_assert_msg(reset_own_connections() >= 1, "no connection to reset");
	/* the hole ends, host 0 redials, the link resumes and resends */
	ck_assert_msg(xport_wait(r_big, long_, err, sizeof(err)) == 0, "%s", err);
	if (!done) {
		ck_assert_msg(xport_wait(s_big, long_, err, sizeof(err)) == 0, "%s", err);
		memset(big, 0xee, BIG);
	}
	for (size_t i = 0; i < BIG; i++)
		ck_assert_msg(got[i] == (uint8_t)(i * 131 + 7), "byte %zu is 0x%02x", i, got[i]);
	/* kept by reference: not complete before host 1 had it (a copy
	 * would have been allowed to complete, and is not how it is kept) */
	ck_assert_msg(!done, "the send completed before host 1 read a byte of it");
	ck_assert_msg(net_reconnects(d.n[0]) + net_reconnects(d.n[1]) >= 1, "the link never broke");
	/* the big send went the way this pass meant (the small ones never
	 * reach the hand-off's size) */
	ck_assert_uint_eq(net_handoffs(d.n[0]), _i ? 1 : 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(xport_wait(s_small[k], long_, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(xport_wait(r_small[1], long_, err, sizeof(err)) == 0, "%s", err);
	ck_assert_mem_eq(in[0], small[0], SMALL);
	ck_assert_mem_eq(in[1], small[1], SMALL);
	duo_free(&d);
	free(big);
	free(got);
}
END_TEST

/* ---- a lingering link is read again without the net thread's tick ---- */

/* A device thread that polled a link for a request that completed leaves
 * it lingering: its socket unarmed, its stream thread to come back for it
 * after LINGER_NS (1 ms) if nobody polls again. The stream thread may
 * have been asleep with no timeout when the linger began (nothing else
 * lingered): then only stream_linger's timer brings it back, and without
 * it the net thread's tick (every 50 ms) ended the linger, and whatever
 * came on the link in between waited unread (fsdp 2x2's 15-50 ms gathers
 * at a step's start, 2026-11-30). Five polled receives on host 1, each
 * followed by 120 ms with nothing on the link (two ticks): no linger may
 * be left for the tick. A count, no clock: the stream thread would have
 * to go unscheduled for 49 ms to miss its timer. */
START_TEST(test_linger_ends_without_tick)
{
	enum { N = 4096 };
	struct duo d = { .handoff = 0 };
	char err[512];
	duo_start(&d);
	uint8_t out[N], in[N];
	memset(out, 0x3c, sizeof(out));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 3 };
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;
	for (int k = 0; k < 5; k++) {
		struct xreq *s, *r;
		m.chunk = (uint32_t)k;
		memset(in, 0, sizeof(in));
		ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, in, N, &r), 0);
		ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, out, N, &s), 0);
		/* host 1's wait polls the link (poll_spin_us 200 ms) */
		ck_assert_msg(xport_wait(r, long_, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(xport_wait(s, long_, err, sizeof(err)) == 0, "%s", err);
		ck_assert_mem_eq(in, out, N);
		usleep(120 * 1000);
	}
	ck_assert_uint_eq(net_linger_lapses(d.n[1]), 0);
	duo_free(&d);
}
END_TEST

/* ---- a large exchange reads before it seals ---- */

struct fdx {
	struct duo *d;
	int h, rc;
	char err[512];
	uint8_t *out, *in;
};

enum { FDX_SEG = 1 << 20, FDX_SEGS = 8, FDX_ROUNDS = 3 };

/* One host's side of a permute-like exchange: every receive posted, then
 * every send at once, then the waits, FDX_ROUNDS times. */
static void *fdx_main(void *arg)
{
	struct fdx *f = arg;
	int me = f->h, peer = 1 - f->h;
	struct xport *x = f->d->x[me];
	uint64_t long_ = xport_now_ns() + 30ull * 1000 * 1000 * 1000;
	for (int r = 0; r < FDX_ROUNDS && !f->rc; r++) {
		struct xreq *rr[FDX_SEGS], *ss[FDX_SEGS];
		struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_PERMUTE, .group = 7,
				   .seq = (uint64_t)r + 1 };
		for (int k = 0; k < FDX_SEGS; k++) {
			m.chunk = (uint32_t)k;
			ck_assert_int_eq(xport_irecv(x, peer, me, &m, f->in + (size_t)k * FDX_SEG,
						     FDX_SEG, &rr[k]), 0);
		}
		for (int k = 0; k < FDX_SEGS; k++) {
			m.chunk = (uint32_t)k;
			ck_assert_int_eq(xport_isend(x, me, peer, &m, f->out + (size_t)k * FDX_SEG,
						     FDX_SEG, &ss[k]), 0);
		}
		for (int k = 0; k < FDX_SEGS && !f->rc; k++) {
			f->rc = xport_wait(rr[k], long_, f->err, sizeof(f->err));
			if (!f->rc)
				f->rc = xport_wait(ss[k], long_, f->err, sizeof(f->err));
		}
	}
	return NULL;
}

/* Both hosts post 8 MiB of sends at once while 8 MiB comes the other
 * way, as a 16 MiB permute does. A device thread about to seal a large
 * send reads what the peer sent first (recv_before_send), and its poll
 * while it waits reads before it writes a turn (recv_poll); before,
 * each host sealed its whole window while the other's bytes waited in
 * its socket, and the socket copies found them cold. Counts, no clock:
 * 3 rounds of 8 posts a host, each with the peer's bytes on their way;
 * MESHRUN_POLL_ORDER=write (the old order) gives 0 and 0. */
START_TEST(test_exchange_reads_first)
{
	struct duo d = { .handoff = 0 };
	duo_start(&d);
	struct fdx f[2];
	pthread_t t[2];
	for (int h = 0; h < 2; h++) {
		f[h] = (struct fdx){ .d = &d, .h = h };
		f[h].out = malloc((size_t)FDX_SEGS * FDX_SEG);
		f[h].in = calloc(FDX_SEGS, FDX_SEG);
		ck_assert(f[h].out && f[h].in);
		for (size_t i = 0; i < (size_t)FDX_SEGS * FDX_SEG; i++)
			f[h].out[i] = (uint8_t)(i * 7 + (size_t)h * 101);
	}
	for (int h = 0; h < 2; h++)
		ck_assert_int_eq(pthread_create(&t[h], NULL, fdx_main, &f[h]), 0);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	for (int h = 0; h < 2; h++) {
		ck_assert_msg(f[h].rc == 0, "host %d: %s", h, f[h].err);
		ck_assert_mem_eq(f[h].in, f[1 - h].out, (size_t)FDX_SEGS * FDX_SEG);
	}
	uint64_t rb = net_reads_before_send(d.n[0]) + net_reads_before_send(d.n[1]);
	uint64_t pr = net_polls_read_first(d.n[0]) + net_polls_read_first(d.n[1]);
	/* which of the two reads first varies run to run (rb 0 and pr 31-76,
	 * or rb 2-12 MB and pr 1-5), so their sum is what must not be 0 */
	ck_assert_msg(rb > 0 || pr > 0, "no send or poll read the peer's bytes before it wrote: "
		      "%llu bytes, %llu polls", (unsigned long long)rb, (unsigned long long)pr);
	duo_free(&d);
	for (int h = 0; h < 2; h++) {
		free(f[h].out);
		free(f[h].in);
	}
}
END_TEST

/* ---- idle: no busy loop outlives a bounded spin ---- */

/* CPU time (ns) every thread of process pid has used so far, from
 * /proc/PID/task/ * /schedstat. */
static uint64_t proc_cpu_ns(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	uint64_t sum = 0;
	ck_assert_msg(d, "no %s", path);
	for (struct dirent *e; (e = readdir(d));) {
		char p2[400];
		unsigned long long ns;
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, e->d_name);
		FILE *f = fopen(p2, "r");
		if (f && fscanf(f, "%llu", &ns) == 1)
			sum += ns;
		if (f)
			fclose(f);
	}
	closedir(d);
	return sum;
}

struct waiter {
	struct xreq *r;
	int rc;
	char err[512];
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	w->rc = xport_wait(w->r, xport_now_ns() + 30ull * 1000 * 1000 * 1000, w->err, sizeof(w->err));
	return NULL;
}

/* A device thread waits 2 s for a message that has not been sent (its
 * poll_spin_us is 200): after its spin it sleeps, and the whole process
 * (both hosts' net, stream and device threads) uses under 1% of a CPU
 * meanwhile; the message then arrives whole. */
START_TEST(test_idle_waiter)
{
	struct duo d = { 0 };
	char err[512];
	duo_start(&d);
	uint8_t out[4096], in[4096];
	memset(out, 0x3c, sizeof(out));
	struct xmeta m = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = 5 };
	struct waiter w = { 0 };
	struct xreq *s;
	ck_assert_int_eq(xport_irecv(d.x[1], 0, 1, &m, in, sizeof(in), &w.r), 0);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, waiter_main, &w), 0);
	usleep(300 * 1000);                   /* past the spin and the linger */
	uint64_t c0 = proc_cpu_ns(getpid()), t0 = xport_now_ns();
	usleep(2000 * 1000);
	uint64_t c1 = proc_cpu_ns(getpid()), t1 = xport_now_ns();
	double share = (double)(c1 - c0) / (double)(t1 - t0);
	ck_assert_int_eq(xport_isend(d.x[0], 0, 1, &m, out, sizeof(out), &s), 0);
	pthread_join(t, NULL);
	ck_assert_msg(w.rc == 0, "%s", w.err);
	ck_assert_msg(xport_wait(s, xport_now_ns() + 10ull * 1000 * 1000 * 1000, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_mem_eq(in, out, sizeof(in));
	ck_assert_msg(share < 0.01, "waiting used %.2f%% of a CPU", share * 100);
	duo_free(&d);
}
END_TEST

/* Two agents that ran a pingpong and now hold (as between steps): each
 * uses under 1% of a CPU over 2 s, by /proc. */
START_TEST(test_idle_agents)
{
	struct proc p;
	char *argv[] = { (char *)meshrun_path(), "local", "--hosts", "2", "--job=pingpong",
			 "--rounds=4", "--size=1M", "--hold-s=4", NULL };
	proc_start(&p, "idle", argv, -1);
	ck_assert_msg(proc_wait_output(&p, "pingpong: 2 hosts", 60), "no pingpong:\n%s",
		      slurp(p.err));
	usleep(300 * 1000);
	pid_t a[2] = { agent_of(p.pid, 0), agent_of(p.pid, 1) };
	ck_assert_msg(a[0] > 0 && a[1] > 0, "agents not found");
	uint64_t c0[2], t0 = xport_now_ns();
	for (int h = 0; h < 2; h++)
		c0[h] = proc_cpu_ns(a[h]);
	usleep(2000 * 1000);
	uint64_t t1 = xport_now_ns();
	for (int h = 0; h < 2; h++) {
		double share = (double)(proc_cpu_ns(a[h]) - c0[h]) / (double)(t1 - t0);
		ck_assert_msg(share < 0.01, "idle agent of host %d used %.2f%% of a CPU", h,
			      share * 100);
	}
	ck_assert_int_eq(proc_wait(&p, 30), 0);
}
END_TEST

static void setup_certs(void)
{
	proc_setup("check_coll", 2);
}

static Suite *coll_suite(void)
{
	Suite *s = suite_create("coll");
	TCase *tc = tcase_create("ops");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_ops_default, 0, 8);
	tcase_add_loop_test(tc, test_ops_ring_small_segments, 0, 8);
	suite_add_tcase(s, tc);

	tc = tcase_create("xport");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_xport_recv_add);
	tcase_add_test(tc, test_xport_eager);
	tcase_add_test(tc, test_xport_spin_on_free_cores);
	tcase_add_test(tc, test_xport_wake_held);
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

	tc = tcase_create("runs");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_runs_match_contiguous, 0, 3);
	tcase_add_test(tc, test_runs_bad_args);
	tcase_add_loop_test(tc, test_runs_own_moves, 0, 3);
	tcase_add_test(tc, test_runs_own_bad_args);
	suite_add_tcase(s, tc);

	tc = tcase_create("groups");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_concurrent_groups);
	suite_add_tcase(s, tc);

	tc = tcase_create("errors");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_timeout_names_collective);
	suite_add_tcase(s, tc);

	tc = tcase_create("multihost");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_multihost_check, 0, 4);
	tcase_add_test(tc, test_multihost_detects_wrong);
	tcase_add_test(tc, test_multihost_table);
	tcase_add_test(tc, test_link_table);
	suite_add_tcase(s, tc);

	tc = tcase_create("paths");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_multihost_paths, 0, 12);
	suite_add_tcase(s, tc);

	tc = tcase_create("failure");
	tcase_set_timeout(tc, 90);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_multihost_host_lost);
	suite_add_tcase(s, tc);

	tc = tcase_create("one core");
	tcase_set_timeout(tc, 110);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_one_core_no_livelock);
	suite_add_tcase(s, tc);

	tc = tcase_create("replay");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup_certs, teardown);
	tcase_add_loop_test(tc, test_send_buffer_across_reset, 0, 2);
	tcase_add_test(tc, test_linger_ends_without_tick);
	tcase_add_test(tc, test_exchange_reads_first);
	suite_add_tcase(s, tc);

	tc = tcase_create("idle");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup_certs, teardown);
	tcase_add_test(tc, test_idle_waiter);
	tcase_add_test(tc, test_idle_agents);
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
