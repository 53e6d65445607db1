/* Collectives over lists of runs (coll_*_v), in one process: each list
 * form bit for bit against the contiguous op on the runs' concatenation
 * on groups of 2..4 in-process devices, ring and direct, sync and async,
 * from 0 floats to 4354 runs of 128 floats a member; their own block's
 * moves (a gather's filled, a reduce-scatter's sums added out by the
 * collective); bad lists and moves refused before anything is sent. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/mesh/mesh.h"
#include "net/coll.h"
#include "net/xport.h"
#include "tests/coll_util.h"

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

static Suite *coll_runs_suite(void)
{
	Suite *s = suite_create("coll_runs");
	TCase *tc = tcase_create("runs");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_runs_match_contiguous, 0, 3);
	tcase_add_test(tc, test_runs_bad_args);
	tcase_add_loop_test(tc, test_runs_own_moves, 0, 3);
	tcase_add_test(tc, test_runs_own_bad_args);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(coll_runs_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
