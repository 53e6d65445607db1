/* A host lost in the middle of sharded training: its peers fail the step
 * and exit with EXIT_PEER_LOST within heartbeat_timeout_s + 2 s, naming it,
 * even while collectives are queued in the background (FSDP's prefetched
 * gathers and reduce-scatters) or tokens are on their way to experts. Real
 * agents over TLS on loopback; every process is killed when a test ends. */
#include <check.h>
#include <stdarg.h>

#include "host/cli/cli.h"
#include "tests/proc.h"

static void setup(void)
{
	proc_setup("check_train_fault", 2);
}

/* Training agent `host` of 2, with a 2 s heartbeat timeout; extra: a
 * NULL-terminated list of more key=value arguments. */
static void train_agent(struct proc *p, int host, int port, const char *preset, int devs,
			const char *const *extra)
{
	char a[24][200];
	char *argv[26];
	int n = 0;
#define ARG(...) (snprintf(a[n], sizeof(a[n]), __VA_ARGS__), argv[n] = a[n], n++)
	ARG("%s", meshrun());
	ARG("agent");
	ARG("--config=%s", preset);
	ARG("--host-id=%d", host);
	ARG("--hosts=2");
	ARG("--devices-per-host=%d", devs);
	ARG("--listen=127.0.0.1:0");
	ARG("certs_dir=%s/certs", tmpdir);
	ARG("coordinator_address=127.0.0.1:%d", port);
	ARG("heartbeat_interval_s=0.25");
	ARG("heartbeat_timeout_s=2");
	ARG("connect_timeout_s=20");
	ARG("steps=1000000");
	ARG("openblas_threads=1");
	for (; *extra && n < 24; extra++)
		ARG("%s", *extra);
#undef ARG
	argv[n] = NULL;
	char name[16];
	snprintf(name, sizeof(name), "h%d", host);
	proc_start(p, name, argv, -1);
}

/* Starts the two hosts and waits until host 0 has logged step 3. */
static void start_training(struct proc h[2], const char *preset, int devs, const char *const *extra)
{
	int port = free_port();
	train_agent(&h[0], 0, port, preset, devs, extra);
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");
	train_agent(&h[1], 1, port, preset, devs, extra);
	double end = now_s() + 60;
	while (!file_has(h[0].out, "completed step: 3,")) {
		for (int i = 0; i < 2; i++)
			ck_assert_msg(proc_wait(&h[i], 0) == -1, "host %d ended early:\n%s", i, slurp(h[i].err));
		ck_assert_msg(now_s() < end, "no training step logged:\n%s", slurp(h[0].err));
		usleep(50000);
	}
}

START_TEST(test_kill_during_fsdp)
{
	/* weights gathered per layer over DCN, the next layer's prefetch and
	 * the last layer's reduce-scatter queued on the comm thread */
	struct proc h[2];
	start_training(h, "configs/llama-tiny.yml", 1,
		       (const char *[]){ "dcn_data_parallelism=1", "dcn_fsdp_parallelism=2", NULL });
	kill(h[1].pid, SIGKILL);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	ck_assert_double_le(now_s() - t0, 4.0);
	ck_assert_file_has(h[0].err, "lost host 1 (127.0.0.1:");
}
END_TEST

START_TEST(test_stop_during_expert_tensor)
{
	/* tokens all_to_all'd over DCN to their experts, tensor all-reduces
	 * inside each host; host 1 falls silent (SIGSTOP) */
	struct proc h[2];
	start_training(h, "configs/deepseek-tiny.yml", 2,
		       (const char *[]){ "dcn_data_parallelism=1", "dcn_expert_parallelism=2",
					 "ici_data_parallelism=1", "ici_tensor_parallelism=2", NULL });
	kill(h[1].pid, SIGSTOP);
	double t0 = now_s();
	ck_assert_int_eq(proc_wait(&h[0], 4.0), EXIT_PEER_LOST);
	double dt = now_s() - t0;
	ck_assert_double_le(dt, 4.0);
	ck_assert_double_ge(dt, 1.5);   /* silence, not a closed socket, was detected */
	ck_assert_file_has(h[0].err, "host 1 (127.0.0.1:");
	kill(h[1].pid, SIGKILL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("train_fault");
	TCase *tc = tcase_create("lost host");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_kill_during_fsdp);
	tcase_add_test(tc, test_stop_during_expert_tensor);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
