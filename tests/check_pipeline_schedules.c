/* The schedules besides the circular one (pipeline_schedule: gpipe,
 * 1f1b, interleaved_1f1b, and the zero-bubble zb_h1 and zbv, whose
 * backward runs split into I and W), each from its own table through the same
 * executor as check_pipeline's, across real agents on loopback: 10 steps
 * within 1e-4 of one device on the same global batch, reruns
 * bit-identical. Every combination the issue names is covered by at
 * least one case of each schedule (S in {2, 4}, M in {S, 2S, 4S},
 * recompute on and off, FSDP, tensor, layers outside the pipeline, dense
 * and DeepSeek-style MoE, whose load-balance loss needs a counting pass
 * in the schedules that back-propagate before the last forward); and the
 * circular schedule without recompute. A suite of its own so neither it
 * nor check_pipeline comes near run-all's limit on a loaded machine. */
#include <cJSON.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/equiv.h"

static void setup(void)
{
	proc_setup("meshrun-schedules", 0);
}

#define LLAMA "configs/llama-tiny.yml"
#define PP2 "ici_data_parallelism=1 ici_pipeline_parallelism=2"
#define DEEPSEEK "configs/deepseek-tiny.yml"
#define DS_SHORT "max_target_length=32"

static void schedule_cases(const char *sched)
{
	char kv[512];
	/* two chunks a stage: interleaved (v = 2 here) and zbv's V */
	bool inter = !strcmp(sched, "interleaved_1f1b") || !strcmp(sched, "zbv");
	/* S=4, M=8, recompute off: each chunk in flight keeps its layers' activations */
	snprintf(kv, sizeof(kv), "ici_data_parallelism=1 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
		 "pipeline_schedule=%s pipeline_recompute=false%s", sched, inter ? "" : " num_layers_per_pipeline_stage=2");
	equivalence_opt(LLAMA, 1, 4, kv, "base_num_decoder_layers=8");
	/* S=2, M=8 (4S), FSDP=2 with the weights gathered once, poisoned */
	snprintf(kv, sizeof(kv), PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=%s "
		 "pipeline_fsdp_ag_once=true", sched);
	setenv("MESHRUN_TEST_PIPE_POISON", "1", 1);
	equivalence_batch(LLAMA, 1, 4, kv, inter ? "base_num_decoder_layers=4" : "", 16);
	unsetenv("MESHRUN_TEST_PIPE_POISON");
	/* S=2, M=2 (S), TP=2, the last 2 of a dense model's layers after the pipeline */
	snprintf(kv, sizeof(kv), PP2 " ici_tensor_parallelism=2 pipeline_schedule=%s pipeline_parallel_layers=%d "
		 "pipeline_recompute=false", sched, inter ? 4 : 2);
	equivalence_opt(LLAMA, 1, 4, kv, inter ? "base_num_decoder_layers=6" : "base_num_decoder_layers=4");
	/* DeepSeek-style MoE: the dense layer before the pipeline, S=2, M=4 (2S) */
	snprintf(kv, sizeof(kv), PP2 " num_pipeline_microbatches=4 pipeline_schedule=%s", sched);
	equivalence_opt(DEEPSEEK, 1, 2, kv, inter ? "base_num_decoder_layers=5 " DS_SHORT
						  : "base_num_decoder_layers=3 " DS_SHORT);
}

START_TEST(test_schedule_gpipe) { schedule_cases("gpipe"); }
END_TEST
START_TEST(test_schedule_1f1b) { schedule_cases("1f1b"); }
END_TEST
START_TEST(test_schedule_interleaved) { schedule_cases("interleaved_1f1b"); }
END_TEST
START_TEST(test_schedule_zb_h1) { schedule_cases("zb_h1"); }
END_TEST
START_TEST(test_schedule_zbv)
{
	schedule_cases("zbv");
	/* FSDP=2 with each chunk's weights gathered one chunk ahead
	 * (bench/overlap_sleep.sh's fsdppp_zbv): the non-layer group's
	 * reduce-scatter goes out after the last owner action, under a W */
	equivalence_batch(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=zbv "
			  "pipeline_recompute=false pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=4", 16);
}
END_TEST
/* eval_loss_hex of checkpoint tmpdir/dir's last step, on one device */
static void eval_hex(const char *dir, char *hex, size_t n)
{
	char args[512];
	snprintf(args, sizeof(args), "eval --checkpoint %s/%s --text /usr/share/common-licenses/GPL-3", tmpdir, dir);
	show_log_on_failure(run(args), 0);
	char *log = read_tmp("log.out"), *p = strstr(log, "eval_loss_hex: ");
	ck_assert_msg(p, "%s", log);
	ck_assert_int_eq(sscanf(p + 15, "%63s", hex), 1);
	ck_assert_uint_lt(strlen(hex), n);
	free(log);
}

/* The split backward changes no bit: I then W adds each weight gradient
 * as B does, in the same microbatch order, so zb_h1 trains exactly as
 * 1f1b and zbv as interleaved_1f1b (their tables differ only in when the
 * W's run, and zbv's chunk placement; zb_h1 also runs W's in receive
 * waits); the trace shows each stage's I
 * and W, no B; and the checkpoints are in layer order (zbv's stages
 * store their V's layers, one device evaluates both alike). */
static void same_losses(const char *cmd, const char *a, const char *b, const char *trace)
{
	char args[1024], ha[64], hb[64];
	double la[10], lb[10];
	snprintf(args, sizeof(args), "%s pipeline_schedule=%s --metrics %s/a.jsonl --checkpoint-dir %s/ck-a", cmd, a,
		 tmpdir, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "%s pipeline_schedule=%s --metrics %s/b.jsonl --trace %s/%s --checkpoint-dir %s/ck-b",
		 cmd, b, tmpdir, tmpdir, trace, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("a.jsonl", la, 10), 10);
	ck_assert_int_eq(losses("b.jsonl", lb, 10), 10);
	for (int k = 0; k < 10; k++)
		ck_assert_msg(la[k] == lb[k], "%s against %s, step %d: %a vs %a", b, a, k, la[k], lb[k]);
	eval_hex("ck-a", ha, sizeof(ha));
	eval_hex("ck-b", hb, sizeof(hb));
	ck_assert_msg(!strcmp(ha, hb), "%s's checkpoint evaluates to %s, %s's to %s", b, hb, a, ha);
	snprintf(args, sizeof(args), "%s/ck-a", tmpdir);
	rm_rf(args);
	snprintf(args, sizeof(args), "%s/ck-b", tmpdir);
	rm_rf(args);
}

/* Compute spans of a trace named "<op> mb..." on device tid (< 0: any).
 * Each carries the thread's CPU time in it, args.cpu_us: more than
 * nothing and no more than its wall time (one thread; the executor reads
 * the CPU inside the wall's reads), give or take 1% and 50 us for two
 * clocks (the scheduler's and CLOCK_MONOTONIC); a process's CPU (two
 * threads computing) would be twice the wall. */
static int spans(const char *trace, int tid, const char *op)
{
	char *text = read_tmp(trace), pre[8];
	cJSON *root = cJSON_Parse(text), *e;
	int n = 0;
	ck_assert_msg(root, "%s is not JSON", trace);
	snprintf(pre, sizeof(pre), "%s mb", op);
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
		cJSON *ph = cJSON_GetObjectItem(e, "ph"), *name = cJSON_GetObjectItem(e, "name");
		if (strcmp(ph->valuestring, "X") || (tid >= 0 && cJSON_GetObjectItem(e, "tid")->valueint != tid) ||
		    strncmp(name->valuestring, pre, strlen(pre)))
			continue;
		cJSON *cpu = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "cpu_us");
		double dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
		ck_assert_msg(cpu && cpu->valuedouble > 0 && cpu->valuedouble <= dur * 1.01 + 50,
			      "%s: %s cpu_us %g, dur %g", trace, name->valuestring, cpu ? cpu->valuedouble : -1, dur);
		n++;
	}
	cJSON_Delete(root);
	free(text);
	return n;
}

START_TEST(test_split_bit_identical)
{
	char cmd[512];
	/* two hosts: zb_h1's receives go over TLS, so the W's that fill
	 * their waits (pipeline_fill_waits) probe remote receives */
	snprintf(cmd, sizeof(cmd), "local --hosts 2 --devices-per-host 1 --config " LLAMA " steps=10 "
		 "per_device_batch_size=4 ici_data_parallelism=1 dcn_data_parallelism=1 dcn_pipeline_parallelism=2 "
		 "num_pipeline_microbatches=4 base_num_decoder_layers=4 num_layers_per_pipeline_stage=2 "
		 "pipeline_recompute=false pipeline_fill_waits=true");
	same_losses(cmd, "1f1b", "zb_h1", "zb.json");
	for (int d = 0; d < 2; d++) {  /* 10 steps x 4 microbatches, one chunk a stage */
		ck_assert_int_eq(spans("zb.json", d, "I"), 40);
		ck_assert_int_eq(spans("zb.json", d, "W"), 40);
		ck_assert_int_eq(spans("zb.json", d, "B"), 0);
	}
	ck_assert_int_eq(spans("zb.json", -1, "F"), 80);
	snprintf(cmd, sizeof(cmd), "local --hosts 1 --devices-per-host 2 --config " DEEPSEEK " steps=10 "
		 "per_device_batch_size=4 " PP2 " num_pipeline_microbatches=4 base_num_decoder_layers=5 " DS_SHORT);
	same_losses(cmd, "interleaved_1f1b", "zbv", "zbv.json");
	for (int d = 0; d < 2; d++) {  /* two chunks a stage */
		ck_assert_int_eq(spans("zbv.json", d, "I"), 80);
		ck_assert_int_eq(spans("zbv.json", d, "W"), 80);
	}
}
END_TEST

/* A group of g > S microbatches a chunk (pipeline_interleave_group)
 * changes when a stage runs a chunk's microbatches, not the order its
 * gradients add up in (each chunk still runs its microbatches in order):
 * the losses are g = S's bit for bit. S = 2 with a last group shorter
 * than the others (M = 8, g = 3: groups of 3, 3, 2), S = 4 with recompute
 * off and one group (g = M = 8). */
static void group_same_losses(const char *cmd, int g)
{
	char args[1024];
	double la[10], lb[10];
	snprintf(args, sizeof(args), "%s --metrics %s/ga.jsonl", cmd, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "%s pipeline_interleave_group=%d --metrics %s/gb.jsonl", cmd, g, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("ga.jsonl", la, 10), 10);
	ck_assert_int_eq(losses("gb.jsonl", lb, 10), 10);
	for (int k = 0; k < 10; k++)
		ck_assert_msg(la[k] == lb[k], "group %d against the stages', step %d: %a vs %a", g, k, lb[k], la[k]);
}

START_TEST(test_group_bit_identical)
{
	group_same_losses("local --hosts 1 --devices-per-host 2 --config " LLAMA " steps=10 per_device_batch_size=4 "
			  PP2 " num_pipeline_microbatches=8 base_num_decoder_layers=4 "
			  "pipeline_schedule=interleaved_1f1b", 3);
	group_same_losses("local --hosts 1 --devices-per-host 4 --config " LLAMA " steps=10 per_device_batch_size=2 "
			  "ici_data_parallelism=1 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
			  "base_num_decoder_layers=8 pipeline_schedule=interleaved_1f1b pipeline_recompute=false", 8);
}
END_TEST

/* the circular schedule without recompute: MoE with repeats and FSDP */
START_TEST(test_circular_no_recompute)
{
	equivalence_opt(DEEPSEEK, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=4 "
			"pipeline_recompute=false pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=5 " DS_SHORT);
}
END_TEST

/* Stages on two hosts, interleaved: a receive posted ahead holds its
 * RecvReady for the gap's send to that stage (host/pipeline/exec.c,
 * prepost), with two TLS connections per host pair (the held word and
 * its send may go on different ones) and a replay buffer of two
 * microbatches' activations (sends wait for the peer's acks): same
 * losses as one device, nothing stuck */
START_TEST(test_held_recv_ready_streams)
{
	equivalence_opt(LLAMA, 2, 1,
			"ici_data_parallelism=1 dcn_data_parallelism=1 dcn_pipeline_parallelism=2 "
			"num_pipeline_microbatches=4 pipeline_schedule=interleaved_1f1b link_streams=2 "
			"replay_buffer_bytes=131072",
			"base_num_decoder_layers=4");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pipeline_schedules");
	TCase *tc = tcase_create("schedules");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_schedule_gpipe);
	tcase_add_test(tc, test_schedule_1f1b);
	tcase_add_test(tc, test_schedule_interleaved);
	tcase_add_test(tc, test_schedule_zb_h1);
	tcase_add_test(tc, test_schedule_zbv);
	tcase_add_test(tc, test_split_bit_identical);
	tcase_add_test(tc, test_circular_no_recompute);
	tcase_add_test(tc, test_held_recv_ready_streams);
	suite_add_tcase(s, tc);
	tc = tcase_create("group");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_group_bit_identical);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	/* no fork: the single-device baselines are cached across tests */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
