/* Fault injection (net/fault.h): the spec grammar, the per-link decision,
 * and each kind for real, through `meshrun local --fault SPEC` (real
 * agents over TLS on loopback): it fires where the spec says, is logged,
 * and ends the run as it should. */
#include <check.h>
#include <errno.h>
#include <stdarg.h>

#include "host/cli/cli.h"
#include "net/fault.h"
#include "tests/proc.h"

/* ---- parsing ---- */

START_TEST(test_parse_good)
{
	struct fault_plan p = { 0 };
	char err[256];
	ck_assert_int_eq(fault_parse(&p, "close:link=0-1:frame=40", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "close:link=2-0:bytes=1000", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "delay:link=0-2:ms=5", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "delay:link=0-2:ms=0.5:from=7", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "corrupt:link=1-2:frame=3", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "blackhole:link=0-1:frame=10:s=1.5", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "kill:host=1:step=3", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "stop:step=0:host=2", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "drop:link=2-1:frame=9", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "halfopen:link=1-0:frame=4", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "halfopen:link=0-2:frame=5:dir=both", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "halfopen:dir=out:link=0-2:frame=6", 3, err, sizeof(err)), 0);
	ck_assert_int_eq(p.n, 12);
	ck_assert_int_eq(p.spec[8].kind, FAULT_DROP);
	ck_assert_int_eq(p.spec[8].from_host, 2);
	ck_assert_int_eq(p.spec[8].frame, 9);
	ck_assert_int_eq(p.spec[9].kind, FAULT_HALFOPEN);
	ck_assert(!p.spec[9].both);
	ck_assert(p.spec[10].both);
	ck_assert(!p.spec[11].both);
	ck_assert_str_eq(fault_kind_name(FAULT_HALFOPEN), "halfopen");
	ck_assert_int_eq(p.spec[0].kind, FAULT_CLOSE);
	ck_assert_int_eq(p.spec[0].from_host, 0);
	ck_assert_int_eq(p.spec[0].to_host, 1);
	ck_assert_int_eq(p.spec[0].frame, 40);
	ck_assert_int_eq(p.spec[1].bytes, 1000);
	ck_assert_int_eq(p.spec[1].from_host, 2);
	ck_assert_int_eq(p.spec[2].frame, 1);             /* delay from the first */
	ck_assert_int_eq(p.spec[2].hold_ns, 5000000);
	ck_assert_int_eq(p.spec[3].frame, 7);
	ck_assert_int_eq(p.spec[3].hold_ns, 500000);
	ck_assert_int_eq(p.spec[5].hold_ns, 1500000000);
	ck_assert_int_eq(p.spec[6].kind, FAULT_KILL);
	ck_assert_int_eq(p.spec[6].step, 3);
	ck_assert_int_eq(p.spec[7].kind, FAULT_STOP);
	ck_assert_int_eq(p.spec[7].from_host, 2);
}
END_TEST

static const struct {
	const char *spec, *why;
} bad_specs[] = {
	{ "", "unknown kind ''" },
	{ "lose:link=0-1:frame=1", "unknown kind 'lose' (close, delay, corrupt, blackhole, drop, halfopen" },
	{ "drop:link=0-1", "wants drop:link=A-B:frame=K" },
	{ "drop:link=0-1:frame=2:s=1", "wants drop:link=A-B:frame=K" },
	{ "halfopen:link=0-1", "wants halfopen:link=A-B:frame=K[:dir=out|both]" },
	{ "halfopen:link=0-1:frame=2:dir=in", "dir wants out or both, got 'in'" },
	{ "close:link=0-1:frame=2:dir=out", "wants close:link=A-B:frame=K" },
	{ "close:link=0-1,frame=4", "fields are separated by ':'" },
	{ "close:link=0-1", "wants close:link=A-B:frame=K or close:link=A-B:bytes=N" },
	{ "close:link=0-1:frame=2:bytes=9", "wants close:link=A-B:frame=K" },
	{ "close:link=0-0:frame=2", "link wants two different host ids" },
	{ "close:link=0-x:frame=2", "link wants two different host ids" },
	{ "close:link=0-5:frame=2", "names a host beyond the job's 3 hosts" },
	{ "close:link=0-1:frame=0", "count data frames from 1" },
	{ "close:link=0-1:frame=-3", "count data frames from 1" },
	{ "close:link=0-1:frame=2:frame=3", "field 'frame' given twice" },
	{ "close:link=0-1:frame", "field 'frame' wants key=value" },
	{ "delay:link=0-1", "wants delay:link=A-B:ms=T[:from=K]" },
	{ "delay:link=0-1:ms=0", "want a positive time" },
	{ "delay:link=0-1:ms=5:frame=2", "wants delay:link=A-B:ms=T" },
	{ "corrupt:link=0-1:ms=3:frame=1", "wants corrupt:link=A-B:frame=K" },
	{ "blackhole:link=0-1:frame=2", "wants blackhole:link=A-B:frame=K:s=T" },
	{ "kill:host=1", "wants kill:host=H:step=S" },
	{ "stop:link=0-1:step=2", "wants stop:host=H:step=S" },
	{ "kill:host=1:step=2:color=red", "unknown field 'color'" },
};

START_TEST(test_parse_bad)
{
	struct fault_plan p = { 0 };
	char err[256] = "", want[128];
	ck_assert_int_eq(fault_parse(&p, bad_specs[_i].spec, 3, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(p.n, 0);
	snprintf(want, sizeof(want), "fault '%s': ", bad_specs[_i].spec);
	ck_assert_msg(strstr(err, want) == err, "'%s' does not start with '%s'", err, want);
	ck_assert_msg(strstr(err, bad_specs[_i].why), "'%s' does not say '%s'", err, bad_specs[_i].why);
}
END_TEST

/* ---- deciding ---- */

START_TEST(test_decide_once_at_its_frame)
{
	struct fault_plan p = { 0 };
	struct fault_hit h;
	char err[256];
	ck_assert_int_eq(fault_parse(&p, "corrupt:link=1-2:frame=4", 0, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "blackhole:link=1-0:frame=2:s=1", 0, err, sizeof(err)), 0);
	/* host 1's frames to host 2: the 4th, and only it */
	for (int k = 1; k <= 10; k++) {
		bool hit = fault_decide(&p, 1, 2, 100, &h);
		ck_assert_int_eq(hit, k == 4);
		if (hit) {
			ck_assert_int_eq(h.kind, FAULT_CORRUPT);
			ck_assert_int_eq(h.frame, 4);
		}
	}
	/* host 2 sending to 1, or host 1 to 0 before its 2nd frame: nothing */
	ck_assert(!fault_decide(&p, 2, 1, 100, &h));
	ck_assert(!fault_decide(&p, 1, 0, 100, &h));
	ck_assert(fault_decide(&p, 1, 0, 100, &h));
	ck_assert_int_eq(h.kind, FAULT_BLACKHOLE);
	ck_assert_int_eq(h.hold_ns, 1000000000);
	ck_assert(!fault_decide(&p, 1, 0, 100, &h));
}
END_TEST

START_TEST(test_decide_bytes_and_delay)
{
	struct fault_plan p = { 0 };
	struct fault_hit h;
	char err[256];
	ck_assert_int_eq(fault_parse(&p, "close:link=0-1:bytes=250", 0, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_parse(&p, "delay:link=1-0:ms=3:from=3", 0, err, sizeof(err)), 0);
	/* 100 bytes a frame: the 3rd takes host 0 past 250 bytes */
	ck_assert(!fault_decide(&p, 0, 1, 100, &h));
	ck_assert(!fault_decide(&p, 0, 1, 100, &h));
	ck_assert(fault_decide(&p, 0, 1, 100, &h));
	ck_assert_int_eq(h.kind, FAULT_CLOSE);
	ck_assert_int_eq(h.frame, 3);
	ck_assert(!fault_decide(&p, 0, 1, 100, &h));
	/* a delay holds every frame from its 3rd, the first of them marked */
	ck_assert(!fault_decide(&p, 1, 0, 1, &h));
	ck_assert(!fault_decide(&p, 1, 0, 1, &h));
	for (int k = 3; k <= 6; k++) {
		ck_assert(fault_decide(&p, 1, 0, 1, &h));
		ck_assert_int_eq(h.kind, FAULT_DELAY);
		ck_assert_int_eq(h.hold_ns, 3000000);
		ck_assert_int_eq(h.first, k == 3);
	}
	ck_assert_int_eq(fault_host_action(&p, 0, 3), -1);
	ck_assert_int_eq(fault_parse(&p, "stop:host=1:step=3", 0, err, sizeof(err)), 0);
	ck_assert_int_eq(fault_host_action(&p, 1, 3), FAULT_STOP);
	ck_assert_int_eq(fault_host_action(&p, 1, 2), -1);
	ck_assert_int_eq(fault_host_action(&p, 0, 3), -1);
}
END_TEST

/* ---- for real: meshrun local --fault ---- */

static void setup(void)
{
	proc_setup("check_fault", 2);
}

/* `meshrun local --hosts 2` with the given arguments (NULL-terminated)
 * after ours: a 2 s heartbeat timeout, our certificates, a free port. */
static void run_local(struct proc *p, const char *name, ...)
{
	struct proc_args pa;
	va_list ap;
	proc_args_meshrun(&pa);
	proc_arg(&pa, "local");
	proc_arg(&pa, "--hosts=2");
	proc_arg(&pa, "certs_dir=%s/certs", tmpdir);
	proc_arg(&pa, "coordinator_address=127.0.0.1:%d", free_port());
	proc_arg(&pa, "heartbeat_interval_s=0.25");
	proc_arg(&pa, "heartbeat_timeout_s=2");
	proc_arg(&pa, "connect_timeout_s=20");
	va_start(ap, name);
	proc_args_va(&pa, ap);
	va_end(ap);
	proc_start_args(p, name, &pa);
}

#define PINGPONG "--job=pingpong", "--size=1M", "--rounds=4"
#define PINGPONG_OK "pingpong: 2 hosts x 1 devices, 4 rounds of 1048576 bytes: ok"

START_TEST(test_local_close)
{
	struct proc p;
	/* 1 MiB messages are 16 data frames of 64 KiB: frame 20 is in round 1.
	 * With recovery (the default) the drill is a reset: the link redials,
	 * resends what was not acknowledged and pingpong checks every byte. */
	run_local(&p, "close", PINGPONG, "--fault", "close:link=0-1:frame=20", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, "host 0: fault: injected close on link 0-1 at frame 20");
	ck_assert_file_has(p.err, "host 0: link to host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "resumed after");
}
END_TEST

START_TEST(test_local_close_fatal)
{
	struct proc p;
	/* without recovery the closed link is a lost peer, named with its frame */
	run_local(&p, "close0", PINGPONG, "--fault", "close:link=0-1:frame=20",
		  "replay_buffer_bytes=0", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), EXIT_PEER_LOST);
	ck_assert_file_has(p.err, "host 0: fault: injected close on link 0-1 at frame 20");
	ck_assert_file_has(p.err, "host 0: lost host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "closed by an injected fault at sent frame");
	ck_assert_file_has(p.err, "(data frame 20)");
	/* the launcher names the other side too: host 1 lost host 0, or was
	 * killed by the launcher when host 0 reported it lost first */
	ck_assert_file_has(p.err, "host 1 ");
}
END_TEST

START_TEST(test_local_close_bytes)
{
	struct proc p;
	run_local(&p, "bytes", PINGPONG, "--fault", "close:link=1-0:bytes=1048576", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	/* the 17th 64 KiB frame is the first past 1 MiB */
	ck_assert_file_has(p.err, "host 1: fault: injected close on link 1-0 at frame 17");
	ck_assert_file_has(p.err, "resumed after");
}
END_TEST

START_TEST(test_local_corrupt)
{
	struct proc p;
	run_local(&p, "corrupt", PINGPONG, "--fault", "corrupt:link=1-0:frame=5", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, "host 1: fault: injected corrupt on link 1-0 at frame 5");
	/* the receiver's TLS refuses the record; the link recovers */
	ck_assert_file_has(p.err, "host 0: link to host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "bad record mac");
	ck_assert_file_has(p.err, "resumed after");
}
END_TEST

START_TEST(test_local_corrupt_fatal)
{
	struct proc p;
	run_local(&p, "corrupt0", PINGPONG, "--fault", "corrupt:link=1-0:frame=5",
		  "replay_buffer_bytes=0", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), EXIT_PEER_LOST);
	/* either side may report first (the launcher then kills the other) */
	ck_assert_file_has(p.err, ": lost host ");
	ck_assert_file_has(p.err, "bad record mac");
}
END_TEST

START_TEST(test_local_delay)
{
	struct proc p;
	/* pingpong checks every byte it receives: same results, later */
	run_local(&p, "delay", PINGPONG, "--fault", "delay:link=0-1:ms=10:from=3", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, "host 0: fault: injected delay on link 0-1 at frame 3");
}
END_TEST

START_TEST(test_local_blackhole)
{
	struct proc p;
	/* silent for 1 s, under the 2 s heartbeat timeout */
	run_local(&p, "hole", PINGPONG, "--fault", "blackhole:link=1-0:frame=10:s=1", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, "host 1: fault: injected blackhole on link 1-0 at frame 10");
}
END_TEST

START_TEST(test_local_drop)
{
	struct proc p;
	/* frame 20 is written nowhere; host 1 sees frame 21 where it waits
	 * for 20, breaks the connection, and the redial resends from 20 */
	run_local(&p, "drop", PINGPONG, "--fault", "drop:link=0-1:frame=20", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, "host 0: fault: injected drop on link 0-1 at frame 20");
	ck_assert_file_has(p.err, "host 1: link to host 0 (127.0.0.1:");
	ck_assert_file_has(p.err, "frames lost on the way; waiting for its redial");
	ck_assert_file_has(p.err, "resumed after");
}
END_TEST

START_TEST(test_local_drop_fatal)
{
	struct proc p;
	/* without recovery nothing can resend it: the gap is a bad frame */
	run_local(&p, "drop0", PINGPONG, "--fault", "drop:link=1-0:frame=7",
		  "replay_buffer_bytes=0", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), EXIT_PEER_LOST);
	ck_assert_file_has(p.err, "host 1: fault: injected drop on link 1-0 at frame 7");
	ck_assert_file_has(p.err, "host 0: lost host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "bad frame: chunk frame has sequence number");
	ck_assert(!file_has(p.err, "resumed after"));
}
END_TEST

/* A half-open connection: host A's link to B stops all traffic on its
 * connection (writes; reads too with dir=both) at frame 10 and stays so.
 * The host that hears nothing for link_silence_s (0.4 x 2 s) drops the
 * connection; the lower id redials, the link resumes with replay, and
 * pingpong checks every byte. */
static void halfopen_recovers(const char *name, const char *spec, const char *injected,
			      const char *silent)
{
	struct proc p;
	run_local(&p, name, PINGPONG, "--fault", spec, (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, PINGPONG_OK);
	ck_assert_file_has(p.err, injected);
	ck_assert_file_has(p.err, silent);
	ck_assert_file_has(p.err, "resumed after");
	ck_assert(!file_has(p.err, "lost host"));
}

START_TEST(test_local_halfopen_out)
{
	/* host 0 writes nothing: host 1 hears nothing, closes; host 0 reads
	 * the close and redials */
	halfopen_recovers("ho_out", "halfopen:link=0-1:frame=10",
			  "host 0: fault: injected halfopen on link 0-1 at frame 10",
			  "host 1: link to host 0 (127.0.0.1:");
}
END_TEST

START_TEST(test_local_halfopen_out_hi)
{
	/* host 1 writes nothing: host 0 (the dialer) hears nothing, redials */
	halfopen_recovers("ho_out1", "halfopen:link=1-0:frame=10",
			  "host 1: fault: injected halfopen on link 1-0 at frame 10",
			  "host 0: link to host 1 (127.0.0.1:");
}
END_TEST

START_TEST(test_local_halfopen_both)
{
	halfopen_recovers("ho_both", "halfopen:link=1-0:frame=10:dir=both",
			  "host 1: fault: injected halfopen on link 1-0 at frame 10",
			  "taken for half-open");
}
END_TEST

START_TEST(test_local_halfopen_fatal)
{
	struct proc p;
	/* without recovery a silent link is left to the heartbeat timeout:
	 * a lost peer within heartbeat_timeout_s (2 s) and the launcher's 2 s */
	run_local(&p, "ho0", "--job=pingpong", "--size=1M", "--rounds=400", "--fault",
		  "halfopen:link=0-1:frame=10", "replay_buffer_bytes=0", (char *)NULL);
	const char *injected = "host 0: fault: injected halfopen on link 0-1 at frame 10";
	double end = now_s() + 60;
	while (!file_has(p.err, injected) && proc_wait(&p, 0) == -1 && now_s() < end)
		usleep(20000);
	ck_assert_file_has(p.err, injected);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_PEER_LOST);
	ck_assert_double_le(now_s() - t0, 2 + 2 + 1.0);
	/* only host 1 can lose host 0, so the text alone is asserted (the two
	 * agents share this stderr; a line once arrived split from its
	 * "meshrun: host 1: " prefix, since fixed: error lines are one write) */
	ck_assert_file_has(p.err, "lost host 0 (127.0.0.1:");
	ck_assert_file_has(p.err, "no heartbeat for");
	ck_assert(!file_has(p.err, "taken for half-open"));
}
END_TEST

START_TEST(test_local_bad_spec)
{
	struct proc p;
	run_local(&p, "bad", PINGPONG, "--fault", "close:link=0-1:frame=2", "--fault",
		  "close:link=0-1", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), EXIT_CONFIG);
	ck_assert_file_has(p.err, "config: key 'faults': fault 'close:link=0-1': wants close:link=A-B:frame=K");
}
END_TEST

#define TRAIN "--config=configs/llama-tiny.yml", "steps=30", "openblas_threads=1"

START_TEST(test_local_kill)
{
	struct proc p;
	run_local(&p, "kill", TRAIN, "--fault", "kill:host=1:step=3", (char *)NULL);
	int rc = proc_wait(&p, 60);
	ck_assert_int_ne(rc, 0);
	ck_assert_int_ne(rc, -1);
	ck_assert_file_has(p.err, "host 1: fault: injected kill on host 1 at step 3");
	ck_assert_file_has(p.err, "lost host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "host 1 was killed by signal 9");
}
END_TEST

START_TEST(test_local_stop)
{
	struct proc p;
	/* host 0 finds host 1 silent after heartbeat_timeout_s (2 s); the
	 * launcher then waits its grace (timeout + 3 s) before it kills the
	 * stopped host: 15 s leaves a margin for a loaded machine */
	run_local(&p, "stop", TRAIN, "--fault", "stop:host=1:step=3", (char *)NULL);
	ck_assert(proc_wait_output(&p, "completed step: 2,", 60) || file_has(p.err, "fault: injected"));
	double end = now_s() + 60;
	while (!file_has(p.err, "fault: injected stop on host 1 at step 3") && now_s() < end)
		usleep(20000);
	ck_assert_file_has(p.err, "host 1: fault: injected stop on host 1 at step 3");
	double t0 = now_s();
	int rc = proc_wait(&p, 30);
	ck_assert_int_eq(rc, EXIT_PEER_LOST);
	ck_assert_double_le(now_s() - t0, 15.0);
	ck_assert_file_has(p.err, "lost host 1 (127.0.0.1:");
	ck_assert_file_has(p.err, "no heartbeat");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault");
	TCase *tc = tcase_create("parse");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_parse_good);
	tcase_add_loop_test(tc, test_parse_bad, 0, (int)(sizeof(bad_specs) / sizeof(bad_specs[0])));
	suite_add_tcase(s, tc);

	tc = tcase_create("decide");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_decide_once_at_its_frame);
	tcase_add_test(tc, test_decide_bytes_and_delay);
	suite_add_tcase(s, tc);

	tc = tcase_create("link");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_local_close);
	tcase_add_test(tc, test_local_close_fatal);
	tcase_add_test(tc, test_local_close_bytes);
	tcase_add_test(tc, test_local_corrupt);
	tcase_add_test(tc, test_local_corrupt_fatal);
	tcase_add_test(tc, test_local_delay);
	tcase_add_test(tc, test_local_blackhole);
	tcase_add_test(tc, test_local_drop);
	tcase_add_test(tc, test_local_drop_fatal);
	tcase_add_test(tc, test_local_halfopen_out);
	tcase_add_test(tc, test_local_halfopen_out_hi);
	tcase_add_test(tc, test_local_halfopen_both);
	tcase_add_test(tc, test_local_halfopen_fatal);
	tcase_add_test(tc, test_local_bad_spec);
	suite_add_tcase(s, tc);

	tc = tcase_create("host");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_local_kill);
	tcase_add_test(tc, test_local_stop);
	suite_add_tcase(s, tc);

	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
