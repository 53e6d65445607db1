/* Agents end to end over loopback (build/meshrun, or $MESHRUN): 2- and
 * 3-host pingpong jobs (several devices per host, messages split into many
 * frames) complete and check every byte; a SIGKILLed or SIGSTOPped agent
 * makes every other agent exit with EXIT_PEER_LOST within
 * heartbeat_timeout_s + 2 s, naming the lost host; config errors (unknown
 * key, wrong type, a mesh that does not multiply to hosts x devices) exit
 * with EXIT_CONFIG and a message naming the key. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/cli.h"
#include "net/conn.h"
#include "net/tls.h"

#include "tests/proc.h"

static void setup(void)
{
	proc_setup("check_agent", 4);
}

/* Runs `meshrun ARGS...` (NULL-terminated) as proc p. */
static void run_meshrun(struct proc *p, const char *name, ...)
{
	static char store[MAXPROC][24][200];
	static int slot;
	char (*args)[200] = store[slot++ % MAXPROC];
	char *argv[26];
	va_list ap;
	int n = 0;
	snprintf(args[n], 200, "%s", meshrun());
	argv[n] = args[n];
	n++;
	va_start(ap, name);
	for (const char *a; n < 24 && (a = va_arg(ap, const char *));) {
		snprintf(args[n], 200, "%s", a);
		argv[n] = args[n];
		n++;
	}
	va_end(ap);
	argv[n] = NULL;
	proc_start(p, name, argv, -1);
}

static char certs_kv[128], coord_kv[64];

/* A long pingpong agent of a cluster of `hosts` with a 2 s heartbeat
 * timeout. */
static void long_agent(struct proc *p, const char *name, int host, int hosts, int port)
{
	char hid[32], nh[32];
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	snprintf(hid, sizeof(hid), "--host-id=%d", host);
	snprintf(nh, sizeof(nh), "--hosts=%d", hosts);
	/* messages of 16 frames, so failures often land mid-message */
	run_meshrun(p, name, "agent", hid, nh, "--listen=127.0.0.1:0", "--job=pingpong",
		    "--rounds=100000000", "--size=1M", certs_kv, coord_kv,
		    "max_frame_bytes=65536", "segment_bytes=4096",
		    "heartbeat_interval_s=0.25", "heartbeat_timeout_s=2", "connect_timeout_s=10",
		    (char *)NULL);
}

START_TEST(test_pingpong_2_hosts)
{
	struct proc p;
	run_meshrun(&p, "local", "local", "--hosts", "2", "--job", "pingpong", "--rounds", "20",
		    "--size", "1M", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, "pingpong: 2 hosts x 1 devices, 20 rounds of 1048576 bytes: ok");
}
END_TEST

START_TEST(test_pingpong_3_hosts_fragments)
{
	struct proc p;
	/* 1000003-byte messages in frames of at most 64 KiB, two devices a host */
	run_meshrun(&p, "local", "local", "--hosts", "3", "--devices-per-host", "2", "--job",
		    "pingpong", "--rounds", "10", "--size", "1000003", "max_frame_bytes=65536",
		    "segment_bytes=4096", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	ck_assert_file_has(p.out, "pingpong: 3 hosts x 2 devices, 10 rounds of 1000003 bytes: ok");
}
END_TEST

START_TEST(test_pingpong_small_and_empty)
{
	struct proc a, b;
	run_meshrun(&a, "empty", "local", "--hosts", "3", "--job", "pingpong", "--rounds", "30",
		    "--size", "0", (char *)NULL);
	run_meshrun(&b, "small", "local", "--hosts", "2", "--devices-per-host", "3", "--job",
		    "pingpong", "--rounds", "100", "--size", "13", (char *)NULL);
	ck_assert_int_eq(proc_wait(&a, 60), 0);
	ck_assert_int_eq(proc_wait(&b, 60), 0);
	ck_assert_file_has(a.out, "30 rounds of 0 bytes: ok");
	ck_assert_file_has(b.out, "2 hosts x 3 devices, 100 rounds of 13 bytes: ok");
}
END_TEST

/* Starts three long agents and waits until their job runs. */
static void start_three(struct proc h[3], int port)
{
	long_agent(&h[0], "h0", 0, 3, port);
	long_agent(&h[1], "h1", 1, 3, port);
	long_agent(&h[2], "h2", 2, 3, port);
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");
	usleep(1000000);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(proc_wait(&h[i], 0) == -1, "host %d ended early:\n%s", i, slurp(h[i].err));
}

START_TEST(test_sigkill_peer)
{
	struct proc h[3];
	int port = free_port();
	start_three(h, port);
	kill(h[2].pid, SIGKILL);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	ck_assert_int_eq(proc_wait(&h[1], 4.0 - (now_s() - t0)), EXIT_PEER_LOST);
	ck_assert_double_le(now_s() - t0, 4.0);
	ck_assert_file_has(h[0].err, "lost host 2 (127.0.0.1:");
	ck_assert_file_has(h[1].err, "lost host 2 (127.0.0.1:");
	ck_assert_file_has(h[1].err, "meshrun: host 1: ");
	/* the failure is the last line (earlier ones log our port probe) */
	char *e = slurp(h[0].err), *last = e;
	for (char *q = e; *q; q++)
		if (*q == '\n' && q[1])
			last = q + 1;
	ck_assert_msg(!strncmp(last, "meshrun: host 0: ", 17) && strstr(last, "lost host 2"),
		      "last line: %s", last);
}
END_TEST

START_TEST(test_sigstop_peer)
{
	struct proc h[3];
	int port = free_port();
	start_three(h, port);
	kill(h[1].pid, SIGSTOP);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	ck_assert_int_eq(proc_wait(&h[2], 4.0 - (now_s() - t0)), EXIT_PEER_LOST);
	double dt = now_s() - t0;
	ck_assert_double_le(dt, 4.0);
	ck_assert_double_ge(dt, 1.5);   /* it was silence that was detected */
	ck_assert_file_has(h[0].err, "host 1 (127.0.0.1:");
	ck_assert_file_has(h[2].err, "host 1 (127.0.0.1:");
	ck_assert(file_has(h[0].err, "no heartbeat for") || file_has(h[2].err, "no heartbeat for"));
	kill(h[1].pid, SIGKILL);
}
END_TEST

/* A host whose job ends late is neither lost nor leaves the others with an
 * error: they wait for its Done while heartbeats go on. */
START_TEST(test_slow_finisher)
{
	struct proc h[3];
	int port = free_port();
	char hid[3][32];
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	double t0 = now_s();
	for (int i = 0; i < 3; i++) {
		snprintf(hid[i], sizeof(hid[i]), "--host-id=%d", i);
		run_meshrun(&h[i], i == 0 ? "h0" : i == 1 ? "h1" : "h2", "agent", hid[i], "--hosts=3",
			    "--listen=127.0.0.1:0", "--job=pingpong", "--rounds=20", "--size=64K",
			    i == 2 ? "--hold-s=3" : "--hold-s=0", certs_kv, coord_kv,
			    "heartbeat_interval_s=0.2", "heartbeat_timeout_s=1", (char *)NULL);
	}
	for (int i = 0; i < 3; i++)
		ck_assert_msg(proc_wait(&h[i], 20) == 0, "host %d: %s", i, slurp(h[i].err));
	ck_assert_double_ge(now_s() - t0, 2.9);
	ck_assert_file_has(h[0].out, "pingpong: 3 hosts x 1 devices, 20 rounds of 65536 bytes: ok");
}
END_TEST

START_TEST(test_local_reports_failure)
{
	struct proc p;
	/* every agent refuses the config: local says so and exits with it */
	run_meshrun(&p, "local", "local", "--hosts", "2", "--job", "pingpong",
		    "dcn_data_parallelism=3", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_CONFIG);
	ck_assert_file_has(p.err, "dcn_* parallelism multiplies to 3 hosts, but the run has 2 hosts");
	ck_assert_file_has(p.err, "meshrun: local: host 0 exited with code 3 (config error)");
}
END_TEST

START_TEST(test_config_errors)
{
	struct proc a, b, c, d, e, f;
	char yml[128], cfgarg[160];
	snprintf(yml, sizeof(yml), "%s/bad.yml", tmpdir);
	FILE *y = fopen(yml, "w");
	ck_assert_ptr_nonnull(y);
	fprintf(y, "steps: 3\nno_such_key: 4\n");
	fclose(y);
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", yml);

	run_meshrun(&a, "unknown", "agent", "--hosts=1", "--job=pingpong", "bogus_key=1", (char *)NULL);
	run_meshrun(&b, "type", "agent", "--hosts=1", "--job=pingpong", "heartbeat_timeout_s=soon",
		    (char *)NULL);
	run_meshrun(&c, "yaml", "agent", "--hosts=1", "--job=pingpong", cfgarg, (char *)NULL);
	run_meshrun(&d, "mesh", "agent", "--hosts=2", "--host-id=0", "--job=pingpong",
		    "dcn_data_parallelism=3", (char *)NULL);
	run_meshrun(&e, "devices", "agent", "--hosts=1", "--devices-per-host=2", "--job=pingpong",
		    "ici_data_parallelism=3", (char *)NULL);
	run_meshrun(&f, "job", "agent", "--hosts=1", "--job=nope", (char *)NULL);

	ck_assert_int_eq(proc_wait(&a, 20), EXIT_CONFIG);
	ck_assert_file_has(a.err, "unknown key 'bogus_key'");
	ck_assert_int_eq(proc_wait(&b, 20), EXIT_CONFIG);
	ck_assert_file_has(b.err, "key 'heartbeat_timeout_s' (command line) wants a number, got 'soon'");
	ck_assert_int_eq(proc_wait(&c, 20), EXIT_CONFIG);
	ck_assert_file_has(c.err, "unknown key 'no_such_key'");
	ck_assert_file_has(c.err, "bad.yml");
	ck_assert_int_eq(proc_wait(&d, 20), EXIT_CONFIG);
	ck_assert_file_has(d.err, "multiplies to 3 hosts, but the run has 2 hosts");
	ck_assert_int_eq(proc_wait(&e, 20), EXIT_CONFIG);
	ck_assert_file_has(e.err, "multiplies to 3 devices per host, but the run has 2");
	ck_assert_int_eq(proc_wait(&f, 20), EXIT_USAGE);
	ck_assert_file_has(f.err, "unknown job 'nope'");
}
END_TEST

START_TEST(test_single_host)
{
	struct proc p;
	/* one host needs no certificates and no sockets */
	run_meshrun(&p, "one", "agent", "--hosts=1", "--devices-per-host=4", "--job=pingpong",
		    "--rounds=5", "--size=4K", "certs_dir=/nonexistent", (char *)NULL);
	ck_assert_int_eq(proc_wait(&p, 20), 0);
	ck_assert_file_has(p.out, "1 hosts x 4 devices, 5 rounds of 4096 bytes: ok");
}
END_TEST

static Suite *agent_suite(void)
{
	Suite *s = suite_create("agent");
	TCase *tc = tcase_create("pingpong");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pingpong_2_hosts);
	tcase_add_test(tc, test_pingpong_3_hosts_fragments);
	tcase_add_test(tc, test_pingpong_small_and_empty);
	tcase_add_test(tc, test_single_host);
	suite_add_tcase(s, tc);

	tc = tcase_create("peer_lost");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_test(tc, test_sigkill_peer);
	tcase_add_test(tc, test_sigstop_peer);
	tcase_add_test(tc, test_slow_finisher);
	suite_add_tcase(s, tc);

	tc = tcase_create("config");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 40);
	tcase_add_test(tc, test_config_errors);
	tcase_add_test(tc, test_local_reports_failure);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	SRunner *sr = srunner_create(agent_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
