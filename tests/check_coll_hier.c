/* Two-level collectives (coll_two_level, net/coll_hier.c): which groups
 * take them; every element right for all_gather, reduce_scatter,
 * all_reduce and their _v forms across real agents on 2x2, 3x2 and 2x3
 * (hosts x devices), all_reduce's bits the same on every rank, on a rerun
 * inside the job, in another job and in the async forms; the bytes that
 * leave a host, counted exactly; links closed in the middle of a
 * two-level all_reduce_v. (FSDP 2x2 training with the key on against
 * one device: check_train's test_dcn_fsdp_equals_single.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll.h"
#include "net/xport.h"
#include "tests/proc.h"

static void setup(void)
{
	proc_setup("check_coll_hier", 0);
}

static int count_of(const char *s, const char *needle)
{
	int k = 0;
	for (; (s = strstr(s, needle)); s += strlen(needle))
		k++;
	return k;
}

/* ---- which groups ---- */

START_TEST(test_shape)
{
	static const struct {
		int n, host[8], H, D;   /* H = 0: the flat ring */
	} cases[] = {
		{ 4, { 0, 0, 1, 1 }, 2, 2 },
		{ 6, { 0, 0, 1, 1, 2, 2 }, 3, 2 },
		{ 6, { 0, 0, 0, 1, 1, 1 }, 2, 3 },
		{ 8, { 1, 1, 0, 0, 3, 3, 2, 2 }, 4, 2 },   /* any host order */
		{ 5, { 0, 0, 1, 1, 1 }, 0, 0 },            /* not uniform */
		{ 6, { 0, 0, 0, 0, 1, 1 }, 0, 0 },         /* not uniform, n % D == 0 */
		{ 4, { 0, 1, 0, 1 }, 0, 0 },               /* not host-major */
		{ 6, { 0, 0, 1, 1, 0, 0 }, 0, 0 },         /* a host twice */
		{ 3, { 0, 1, 2 }, 0, 0 },                  /* one device a host */
		{ 3, { 0, 0, 0 }, 0, 0 },                  /* one host */
		{ 1, { 0 }, 0, 0 },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int devs[8];
		for (int i = 0; i < cases[c].n; i++)
			devs[i] = i;
		struct xport *x = xport_new(0, cases[c].n, cases[c].host, NULL, NULL);
		ck_assert_ptr_nonnull(x);
		struct coll_group g = { .id = 1, .n = cases[c].n, .rank = 0, .devs = devs };
		int H = -1, D = -1;
		bool yes = coll_two_level_shape(x, &g, &H, &D);
		ck_assert_msg(yes == (cases[c].H > 0), "case %zu: shape %s", c, yes ? "taken" : "refused");
		if (yes)
			ck_assert_msg(H == cases[c].H && D == cases[c].D, "case %zu: %dx%d, want %dx%d", c,
				      H, D, cases[c].H, cases[c].D);
		xport_free(x);
	}
}
END_TEST

/* ---- every element, every bit ---- */

static char out1[1 << 16], out2[1 << 16];

/* The "bits ..." lines of a check run, in order. */
static void bits_lines(const char *out, char *dst, size_t len)
{
	size_t n = 0;
	dst[0] = 0;
	for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, "bits ", 5) && n < len)
			n += (size_t)snprintf(dst + n, len - n, "%.*s\n", (int)strcspn(l, "\n"), l);
}

/* Every op (the _v forms too: all_gather_v, reduce_scatter_v,
 * all_reduce_v over runs of 128 floats with gaps) at 0, 1, 7 floats,
 * 64 KiB and 1 MiB per rank, every element checked; then all_reduce of
 * values that round, contiguous and over runs, twice: the same bits on
 * every rank and on the rerun; and reduce_scatter of them, contiguous
 * (its own intra-host rings, net/coll_hier.c) and over runs: the same
 * bits. 2x2 also runs the async forms in a second job: the same bits
 * again. */
START_TEST(test_check)
{
	static const struct { int hosts, devs; } shapes[] = { { 2, 2 }, { 3, 2 }, { 2, 3 } };
	int H = shapes[_i].hosts, D = shapes[_i].devs;
	char hs[16], ds[16], want[96];
	snprintf(hs, sizeof(hs), "%d", H);
	snprintf(ds, sizeof(ds), "%d", D);
	for (int async = 0; async < (_i == 0 ? 2 : 1); async++) {
		char *out = async ? out2 : out1;
		char *argv[] = { (char *)meshrun(), "bench", "collectives", "--hosts", hs,
				 "--devices-per-host", ds, "--check-counts", "0,1,7,16384,262144",
				 "--check-bits", "coll_two_level=true", "segment_bytes=65536",
				 "collective_timeout_s=60", async ? "--async" : NULL, NULL };
		int rc = proc_capture(argv, out, sizeof(out1), 110);
		ck_assert_msg(rc == 0, "%dx%d%s: exit %d\n%s", H, D, async ? " async" : "", rc, out);
		snprintf(want, sizeof(want), "check ok: 12 ops x 5 counts on %d devices%s", H * D,
			 async ? " (async forms)" : "");
		ck_assert_msg(strstr(out, want), "no '%s' line:\n%s", want, out);
		ck_assert_msg(!strstr(out, "mismatch"), "%s", out);
		ck_assert_msg(count_of(out, "on every rank, rerun the same") == 10,
			      "not 10 all_reduce bit checks passed:\n%s", out);
		ck_assert_msg(count_of(out, "contiguous and list the same on every rank") == 5,
			      "not 5 reduce_scatter bit checks passed:\n%s", out);
	}
	if (_i == 0) {
		static char b1[4096], b2[4096];
		bits_lines(out1, b1, sizeof(b1));
		bits_lines(out2, b2, sizeof(b2));
		ck_assert_msg(!strcmp(b1, b2), "sync and async jobs differ:\n%s\n%s", b1, b2);
	}
}
END_TEST

/* ---- what it is for: bytes ---- */

/* The payload host 0 sends per 2x2 reduce_scatter of 1 MiB (bench
 * collectives' "# dcn" line, counted when posted: no timing in it). Flat
 * ring: host 0's one cross edge carries 3 of the 4 blocks, 3/4 MiB.
 * Two levels: each device sends 1 of its 2 quarter-blocks' partials
 * across, (H-1)/H = 1/2 MiB for the host. all_reduce: twice that. */
START_TEST(test_dcn_bytes)
{
	static const struct {
		const char *op, *two;
		const char *want;
	} cases[] = {
		{ "reduce_scatter", "coll_two_level=false", "# dcn 1048576: 786432 bytes per iteration from host 0, 1572864 from all hosts" },
		{ "reduce_scatter", "coll_two_level=true", "# dcn 1048576: 524288 bytes per iteration from host 0, 1048576 from all hosts" },
		{ "all_reduce", "coll_two_level=false", "# dcn 1048576: 1572864 bytes per iteration from host 0, 3145728 from all hosts" },
		{ "all_reduce", "coll_two_level=true", "# dcn 1048576: 1048576 bytes per iteration from host 0, 2097152 from all hosts" },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		char *argv[] = { (char *)meshrun(), "bench", "collectives", "--hosts", "2",
				 "--devices-per-host", "2", "--op", (char *)cases[c].op, "--sizes", "1M",
				 "--iters", "3", "--warmup", "1", (char *)cases[c].two, NULL };
		int rc = proc_capture(argv, out1, sizeof(out1), 60);
		ck_assert_msg(rc == 0, "%s %s: exit %d\n%s", cases[c].op, cases[c].two, rc, out1);
		ck_assert_msg(strstr(out1, cases[c].want), "%s %s: no '%s' line:\n%s", cases[c].op,
			      cases[c].two, cases[c].want, out1);
	}
}
END_TEST

/* ---- a link closed in the middle ---- */

/* 2x2, the list forms at 1M floats per rank: all_gather_v and
 * reduce_scatter_v (16 MiB buffers) each send 8 MiB of payload from a
 * host, then all_reduce_v (4 MiB) 4 MiB, its payload from 16 to 20 MiB
 * (past a few small gathers of the checks' counts); the link closed four
 * times inside all_reduce_v, both directions: every element right. */
START_TEST(test_close_in_all_reduce)
{
	char *argv[] = { (char *)meshrun(), "bench", "collectives", "--hosts", "2",
			 "--devices-per-host", "2", "--check-counts", "1048576", "--check-lists",
			 "coll_two_level=true", "collective_timeout_s=60",
			 "faults=close:link=0-1:bytes=17301504,close:link=1-0:bytes=18350080,"
			 "close:link=0-1:bytes=19398656,close:link=1-0:bytes=20447232",
			 NULL };
	int rc = proc_capture(argv, out1, sizeof(out1), 100);
	ck_assert_msg(rc == 0, "exit %d\n%s", rc, out1);
	ck_assert_msg(strstr(out1, "check ok: 3 ops x 1 counts on 4 devices"), "%s", out1);
	ck_assert_msg(count_of(out1, "fault: injected close") == 4, "not 4 closes fired:\n%s", out1);
	/* both ends resume; a close that lands while the link is being
	 * redialed shares that resumption (6 or 8 lines seen) */
	ck_assert_msg(count_of(out1, "resumed after") >= 4, "links not resumed:\n%s", out1);
}
END_TEST

static Suite *hier_suite(void)
{
	Suite *s = suite_create("coll_hier");
	TCase *tc = tcase_create("shape");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_shape);
	suite_add_tcase(s, tc);

	tc = tcase_create("check");
	tcase_set_timeout(tc, 240);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_check, 0, 3);
	suite_add_tcase(s, tc);

	tc = tcase_create("bytes");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_dcn_bytes);
	suite_add_tcase(s, tc);

	tc = tcase_create("recover");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_close_in_all_reduce);
	suite_add_tcase(s, tc);

	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(hier_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
