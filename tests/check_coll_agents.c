/* Collectives across real agents over TLS on loopback, each a separate
 * process (`$MESHRUN bench collectives`, `bench link`): every op right at
 * every element on 1..4 hosts (`--check-counts`), the message paths
 * (polling or sleeping waiters, one or two TLS connections a host pair,
 * sync and async), a corrupted element noticed, the benches' tables and
 * CPU lines, two agents on one core without a livelock, and a host killed
 * in the middle of an all_reduce. The same ops in one process are in
 * check_coll.c. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/net.h"
#include "tests/coll_util.h"
#include "tests/proc.h"

/* ---- multi-host: real agents over TLS on loopback ---- */

static void setup(void)
{
	proc_setup("check_coll_agents", 0);
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

static Suite *coll_agents_suite(void)
{
	Suite *s = suite_create("coll_agents");
	TCase *tc = tcase_create("multihost");
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
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(coll_agents_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
