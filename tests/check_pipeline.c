/* Pipeline parallelism over `stage` across real agents on loopback: every
 * supported shape (stages, microbatches, repeats, delay, layers per
 * stage, stages across hosts, beside data, tensor and FSDP parallelism
 * in its three weight modes, and ZeRO-1) gives the single-device losses
 * of the same global batch, bit-identically run to run (the other
 * schedules: check_pipeline_schedules); idle slots read nothing (their buffers poisoned with NaN change
 * nothing); checkpoints of a pipeline with repeats hold layer order; the
 * trace shows each stage's slots; what is not supported is refused. */
#include <cJSON.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/obs/trace.h"
#include "tests/equiv.h"

static void setup(void)
{
	proc_setup("meshrun-pipeline", 0);
}

#define LLAMA "configs/llama-tiny.yml"
#define PP2 "ici_data_parallelism=1 ici_pipeline_parallelism=2"

/* S=2 R=1 M=2, 2 layers */
START_TEST(test_s2_r1_m2) { equivalence_opt(LLAMA, 1, 2, PP2, ""); }
END_TEST
/* S=2 R=2 M=4, 4 layers (stage s stores layers s and s+2) */
START_TEST(test_s2_r2_m4)
{
	equivalence_opt(LLAMA, 1, 2, PP2 " num_pipeline_microbatches=4", "base_num_decoder_layers=4");
}
END_TEST
/* S=4 R=1 M=4, 4 layers, 1 host x 4 devices */
START_TEST(test_s4_r1_m4)
{
	equivalence_opt(LLAMA, 1, 4, "ici_data_parallelism=1 ici_pipeline_parallelism=4",
			"base_num_decoder_layers=4");
}
END_TEST
/* MaxText's circular cases at S=4 with 8 layers (R=2): extra
 * microbatches (M=8), and delayed forwarding (M=8, d=2); M=S is in
 * test_idle_slots_poisoned */
START_TEST(test_s4_r2_m8)
{
	equivalence_opt(LLAMA, 1, 4, "ici_data_parallelism=1 ici_pipeline_parallelism=4 "
			"num_pipeline_microbatches=8", "base_num_decoder_layers=8");
	equivalence_opt(LLAMA, 1, 4, "ici_data_parallelism=1 ici_pipeline_parallelism=4 "
			"num_pipeline_microbatches=8 pipeline_delay_activation_forwarding=true",
			"base_num_decoder_layers=8");
}
END_TEST
/* the delay d=2: S=2 M=4, R=1 and R=2 */
START_TEST(test_delay)
{
	equivalence_opt(LLAMA, 1, 2, PP2 " num_pipeline_microbatches=4 pipeline_delay_activation_forwarding=true", "");
	equivalence_opt(LLAMA, 1, 2, PP2 " num_pipeline_microbatches=4 pipeline_delay_activation_forwarding=true",
			"base_num_decoder_layers=4");
}
END_TEST
/* two layers per stage: Lps=2 with R=1, and with R=2 (8 layers) */
START_TEST(test_lps2)
{
	equivalence_opt(LLAMA, 1, 2, PP2 " num_layers_per_pipeline_stage=2", "base_num_decoder_layers=4");
	equivalence_opt(LLAMA, 1, 2, PP2 " num_layers_per_pipeline_stage=2 num_pipeline_microbatches=4",
			"base_num_decoder_layers=8");
}
END_TEST
/* stages on two hosts (activations over DCN) */
START_TEST(test_dcn_stages)
{
	equivalence_opt(LLAMA, 2, 1, "dcn_data_parallelism=1 dcn_pipeline_parallelism=2 "
			"num_pipeline_microbatches=4", "base_num_decoder_layers=4");
}
END_TEST
/* 2 stages x 2 data replicas (data over DCN, stages inside a host) */
START_TEST(test_pp_data)
{
	equivalence_opt(LLAMA, 2, 2, "dcn_data_parallelism=2 ici_data_parallelism=1 ici_pipeline_parallelism=2",
			"base_num_decoder_layers=4");
}
END_TEST
/* 2 stages x 2 tensor ranks (heads, MLP and vocabulary split inside a stage) */
START_TEST(test_pp_tensor)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_tensor_parallelism=2", "base_num_decoder_layers=4");
}
END_TEST
/* 2 stages x 2 data replicas with the optimizer state split over data */
START_TEST(test_pp_zero1)
{
	equivalence_opt(LLAMA, 2, 2, "dcn_data_parallelism=2 ici_data_parallelism=1 ici_pipeline_parallelism=2 "
			"shard_optimizer_over_data=true", "base_num_decoder_layers=4");
}
END_TEST
/* FSDP beside the pipeline: a stage's weights gathered per iteration
 * through the model's window (its 2 layers at once), the non-layer ones
 * once a step: fsdp within a host, over DCN, fsdp_transpose with the delay */
START_TEST(test_pp_fsdp)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 num_layers_per_pipeline_stage=2",
			"base_num_decoder_layers=4");
	equivalence_opt(LLAMA, 2, 2, PP2 " dcn_data_parallelism=1 dcn_fsdp_parallelism=2 "
			"num_layers_per_pipeline_stage=2 num_pipeline_microbatches=4", "base_num_decoder_layers=4");
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_transpose_parallelism=2 num_layers_per_pipeline_stage=2 "
			"num_pipeline_microbatches=4 pipeline_delay_activation_forwarding=true",
			"base_num_decoder_layers=4");
}
END_TEST
/* 2 stages x 2 tensor_transpose ranks (the embedding dimension split
 * inside a stage) */
START_TEST(test_pp_tensor_transpose)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_tensor_transpose_parallelism=2", "base_num_decoder_layers=4");
}
END_TEST

/* DeepSeek-style MoE (MaxText's cases): one dense layer, then MoE layers;
 * the dense one runs before the pipeline, data-parallel over stage. The
 * load-balance loss and the router bias update see the expert counts of
 * the whole batch (summed over microbatches and stages between the
 * passes), as one device does. Shrunk: 32 tokens per row. */
#define DEEPSEEK "configs/deepseek-tiny.yml"
#define DS_SHORT "max_target_length=32"
#define DS9 "base_num_decoder_layers=9 " DS_SHORT /* 1 dense + 8 MoE layers */

/* circular: S=4 R=2 M=8 over the 8 MoE layers */
START_TEST(test_moe_circular)
{
	equivalence_opt(DEEPSEEK, 1, 4, "ici_data_parallelism=1 ici_pipeline_parallelism=4 "
			"num_pipeline_repeats=2 num_pipeline_microbatches=8", DS9);
}
END_TEST
/* expert parallelism beside stage: S=2 EP=2 M=4 (2 MoE layers, R=1) */
START_TEST(test_moe_expert)
{
	equivalence_opt(DEEPSEEK, 1, 4, PP2 " ici_expert_parallelism=2 num_pipeline_microbatches=4", DS_SHORT);
	/* with repeats: 4 MoE layers, R=2 (the dense weights gathered per
	 * slot from stage-order storage) */
	equivalence_opt(DEEPSEEK, 1, 4, PP2 " ici_expert_parallelism=2 num_pipeline_microbatches=4",
			"base_num_decoder_layers=5 " DS_SHORT);
}
END_TEST
/* pipeline_parallel_layers below the layer count: a dense model's last 2
 * of 6 layers run after the pipeline; an MoE model's dense layer and 4 of
 * its 8 MoE layers before it (poisoned: the layers outside read only
 * what they wrote) */
START_TEST(test_layers_outside)
{
	equivalence_opt(LLAMA, 1, 2, PP2 " pipeline_parallel_layers=4", "base_num_decoder_layers=6");
	/* beside FSDP: the layers after gathered in a window of their own
	 * while the table's first gather may already be READY */
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 pipeline_parallel_layers=2",
			"base_num_decoder_layers=4");
	setenv("MESHRUN_TEST_PIPE_POISON", "1", 1);
	equivalence_opt(DEEPSEEK, 1, 2, PP2 " pipeline_parallel_layers=4 num_pipeline_microbatches=4", DS9);
	unsetenv("MESHRUN_TEST_PIPE_POISON");
}
END_TEST
/* FSDP with repeats, in the three weight modes (the window keeps the
 * table's weight slots; a stage stores its layers in stage order).
 * MaxText's cases: S=2, 8 layers, R=4, M=8 (global batch 16: a stage
 * group's 8 rows split over fsdp), pipeline_fsdp_ag_once and
 * pipeline_fsdp_ag_per_repeat */
#define FSDP_R4 PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=8"
START_TEST(test_fsdp_ag_once)
{
	equivalence_batch(LLAMA, 1, 4, FSDP_R4 " pipeline_fsdp_ag_once=true", "base_num_decoder_layers=8", 16);
}
END_TEST
START_TEST(test_fsdp_ag_per_repeat)
{
	equivalence_batch(LLAMA, 1, 4, FSDP_R4 " pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=8", 16);
}
END_TEST
/* MaxText's blind spots for its window: ag_per_repeat with S=3 (6 layers,
 * R=2, M=6 on 1 x 6 devices) and S=4 (8 layers, R=2, M=4, stages inside
 * a host and fsdp across two), with the delay d=2 (S=2, 4 layers, R=2,
 * M=4); and the default mode (a gather per slot) with R=2 */
START_TEST(test_fsdp_ag_per_repeat_s3)
{
	equivalence_batch(LLAMA, 1, 6, "ici_data_parallelism=1 ici_pipeline_parallelism=3 ici_fsdp_parallelism=2 "
			  "num_pipeline_microbatches=6 pipeline_fsdp_ag_per_repeat=true",
			  "base_num_decoder_layers=6", 12);
}
END_TEST
START_TEST(test_fsdp_ag_per_repeat_s4)
{
	equivalence_opt(LLAMA, 2, 4, "dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=1 "
			"ici_pipeline_parallelism=4 pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=8");
}
END_TEST
START_TEST(test_fsdp_ag_per_repeat_delay)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=4 "
			"pipeline_delay_activation_forwarding=true pipeline_fsdp_ag_per_repeat=true",
			"base_num_decoder_layers=4");
}
END_TEST
/* the weight modes with layers outside the pipeline (their window is one
 * more beside the table's slots): a dense model's layers after it with
 * ag_per_repeat (R=2), an MoE model's dense layer before it with ag_once
 * (R=2), poisoned */
START_TEST(test_fsdp_modes_outside)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 pipeline_parallel_layers=4 "
			"num_pipeline_microbatches=4 pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=6");
	setenv("MESHRUN_TEST_PIPE_POISON", "1", 1);
	equivalence_opt(DEEPSEEK, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=4 "
			"pipeline_fsdp_ag_once=true", "base_num_decoder_layers=5 " DS_SHORT);
	unsetenv("MESHRUN_TEST_PIPE_POISON");
}
END_TEST
START_TEST(test_fsdp_iter_repeats)
{
	equivalence_opt(LLAMA, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=4",
			"base_num_decoder_layers=4");
}
END_TEST

/* The gathers the run counts (metrics weight_gathers, from the window)
 * are `meshrun schedule`'s figure for the run's weight mode */
static int schedule_gathers(void)
{
	char *log = read_tmp("log.out"), *line = strstr(log, "\n  * ");
	int n = -1;
	ck_assert_msg(line, "%s", log);
	for (char *tok = strtok(line + 5, " \n"); tok && n < 0; tok = strtok(NULL, " \n"))
		if (strspn(tok, "0123456789") == strlen(tok))
			n = atoi(tok);
	free(log);
	return n;
}

START_TEST(test_fsdp_gathers_counted)
{
	static const char *const modes[] = { "", "pipeline_fsdp_ag_once=true", "pipeline_fsdp_ag_per_repeat=true" };
	const char *shape = FSDP_R4 " base_num_decoder_layers=8 per_device_batch_size=4";
	char args[1024];
	for (int k = 0; k < 3; k++) {
		snprintf(args, sizeof(args), "schedule --config %s %s %s", LLAMA, shape, modes[k]);
		show_log_on_failure(run(args), 0);
		int want = schedule_gathers();
		snprintf(args, sizeof(args), "local --hosts 1 --devices-per-host 4 --config %s steps=1 %s %s "
			 "--metrics %s/g%d.jsonl", LLAMA, shape, modes[k], tmpdir, k);
		show_log_on_failure(run(args), 0);
		char name[32];
		snprintf(name, sizeof(name), "g%d.jsonl", k);
		char *m = read_tmp(name), *p = strstr(m, "\"weight_gathers\":");
		ck_assert_msg(p, "%s", m);
		int got = atoi(p + 17);
		free(m);
		ck_assert_msg(got == want && want > 0, "mode '%s': %d gathers run, %d scheduled", modes[k], got, want);
	}
}
END_TEST

/* idle slots are idle: every buffer a slot could read is NaN before each
 * step; only what an active slot wrote first is read */
START_TEST(test_idle_slots_poisoned)
{
	setenv("MESHRUN_TEST_PIPE_POISON", "1", 1); /* read by pipelined agents only */
	equivalence_opt(LLAMA, 1, 2, PP2 " num_pipeline_microbatches=4 pipeline_delay_activation_forwarding=true",
			"base_num_decoder_layers=4");
	equivalence_opt(LLAMA, 1, 4, "ici_data_parallelism=1 ici_pipeline_parallelism=4", "base_num_decoder_layers=8");
	/* and the weight window: a slot read before its gather landed is NaN */
	equivalence_batch(LLAMA, 1, 6, "ici_data_parallelism=1 ici_pipeline_parallelism=3 ici_fsdp_parallelism=2 "
			  "num_pipeline_microbatches=6 pipeline_fsdp_ag_per_repeat=true",
			  "base_num_decoder_layers=6", 12);
	unsetenv("MESHRUN_TEST_PIPE_POISON");
}
END_TEST

/* eval_loss of checkpoint tmpdir/dir */
static double eval_loss(const char *dir)
{
	char args[512];
	snprintf(args, sizeof(args), "eval --checkpoint %s/%s --text /usr/share/common-licenses/GPL-3", tmpdir, dir);
	show_log_on_failure(run(args), 0);
	char *log = read_tmp("log.out"), *p = strstr(log, "eval_loss: ");
	ck_assert_msg(p, "%s", log);
	double v = strtod(p + 11, NULL);
	free(log);
	return v;
}

/* a checkpoint of a pipeline with repeats is in layer order: resumed it
 * continues bit-identically; one device evaluates it like its own */
START_TEST(test_checkpoint_layer_order)
{
	char args[1024];
	double straight[6], rest[6];
	const char *mesh = "--hosts 1 --devices-per-host 2 " PP2 " num_pipeline_microbatches=4 "
			   "base_num_decoder_layers=4 learning_rate_schedule_steps=6";
	snprintf(args, sizeof(args), "local %s --config %s steps=6 --metrics %s/straight.jsonl", mesh, LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config %s steps=3 --checkpoint-dir %s/ck", mesh, LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config %s steps=6 --checkpoint-dir %s/ck --resume "
		 "--metrics %s/rest.jsonl", mesh, LLAMA, tmpdir, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("straight.jsonl", straight, 6), 6);
	ck_assert_int_eq(losses("rest.jsonl", rest, 6), 3);
	for (int s = 0; s < 3; s++)
		ck_assert_msg(rest[s] == straight[3 + s], "resumed step %d: %a vs %a", 3 + s, rest[s], straight[3 + s]);
	/* one device, same training, its own checkpoint */
	snprintf(args, sizeof(args), "train --config %s steps=6 learning_rate_schedule_steps=6 "
		 "base_num_decoder_layers=4 per_device_batch_size=16 --checkpoint-dir %s/one", LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config %s steps=6 --checkpoint-dir %s/pp", mesh, LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	double ev[2] = { eval_loss("pp"), eval_loss("one") };
	fprintf(stderr, "pipeline checkpoint eval %.6f, one device %.6f\n", ev[0], ev[1]);
	ck_assert_msg(fabs(ev[0] - ev[1]) < 1e-4 * ev[1], "eval %.8f vs one device %.8f", ev[0], ev[1]);
}
END_TEST

/* the same with layers outside the pipeline: 4 of 8 pipelined with R=2,
 * the attention tensors (stored whole on every stage) in the storage
 * order of 2 layers per block */
START_TEST(test_checkpoint_outside)
{
	char args[1024];
	snprintf(args, sizeof(args), "local --hosts 1 --devices-per-host 2 " PP2 " num_pipeline_microbatches=4 "
		 "pipeline_parallel_layers=4 --config %s steps=3 base_num_decoder_layers=8 --checkpoint-dir %s/pp",
		 LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "train --config %s steps=3 base_num_decoder_layers=8 per_device_batch_size=16 "
		 "--checkpoint-dir %s/one", LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	double ev[2] = { eval_loss("pp"), eval_loss("one") };
	ck_assert_msg(fabs(ev[0] - ev[1]) < 1e-4 * ev[1], "eval %.8f vs one device %.8f", ev[0], ev[1]);
}
END_TEST

/* --trace: every device has R*M forward and R*M backward spans per step
 * (one per action of the table), and stage 1 its activation receives,
 * each also on its p2p row (post to landing, and its send on stage 0's) */
START_TEST(test_trace_slots)
{
	char args[512];
	snprintf(args, sizeof(args), "local --hosts 1 --devices-per-host 2 --config %s steps=2 " PP2
		 " num_pipeline_microbatches=4 base_num_decoder_layers=4 --trace %s/t.json", LLAMA, tmpdir);
	show_log_on_failure(run(args), 0);
	char *text = read_tmp("t.json");
	cJSON *root = cJSON_Parse(text);
	ck_assert_msg(root, "trace is not JSON");
	cJSON *evs = cJSON_GetObjectItem(root, "traceEvents"), *e;
	int fwd[2] = { 0 }, bwd[2] = { 0 }, recv_act[2] = { 0 }, p2p_r[2] = { 0 }, p2p_s[2] = { 0 };
	int send_act[2] = { 0 }, sc_act[2] = { 0 };
	/* a device thread's CPU in each step's forward+backward, and in the
	 * spans of its row inside it (compute, sends, receives: disjoint) */
	double fb_cpu[2][2] = { { 0 } }, in_cpu[2][2] = { { 0 } };
	cJSON_ArrayForEach(e, evs) {
		if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X"))
			continue;
		int tid = cJSON_GetObjectItem(e, "tid")->valueint;
		const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
		if (tid >= TRACE_FLIGHT_TID) {
			/* a background row: the p2p one (3) has each message */
			ck_assert_str_eq(cJSON_GetObjectItem(e, "cat")->valuestring, "flight");
			ck_assert(tid % TRACE_FLIGHT_TID < 2);
			ck_assert(cJSON_GetObjectItem(e, "dur")->valuedouble >= 0);
			if (tid / TRACE_FLIGHT_TID == 3) {
				p2p_r[tid % TRACE_FLIGHT_TID] += !strncmp(name, "r act ", 6);
				p2p_s[tid % TRACE_FLIGHT_TID] += !strncmp(name, "s act ", 6);
				sc_act[tid % TRACE_FLIGHT_TID] += !strncmp(name, "sc act ", 7);
			}
			continue;
		}
		ck_assert(tid >= 0 && tid < 2);
		cJSON *args = cJSON_GetObjectItem(e, "args"), *cpu = cJSON_GetObjectItem(args, "cpu_us");
		int step = cJSON_GetObjectItem(args, "step")->valueint;
		bool sends = !strncmp(name, "stage send act ", 15), recvs = !strncmp(name, "stage recv ", 11);
		if (sends || recvs || !strcmp(name, "forward+backward"))
			ck_assert_msg(cJSON_IsNumber(cpu) && cpu->valuedouble >= 0, "'%s' without args.cpu_us", name);
		send_act[tid] += sends;
		if (step >= 0 && step < 2 && cJSON_IsNumber(cpu))
			*(!strcmp(name, "forward+backward") ? &fb_cpu[tid][step] : &in_cpu[tid][step]) += cpu->valuedouble;
		fwd[tid] += !strncmp(name, "F mb", 4);
		bwd[tid] += !strncmp(name, "B mb", 4);
		recv_act[tid] += !strncmp(name, "stage recv act", 14);
	}
	for (int d = 0; d < 2; d++) {
		ck_assert_int_eq(fwd[d], 2 * 2 * 4);
		ck_assert_int_eq(bwd[d], 2 * 2 * 4);
	}
	/* stage 1 takes every slot's input from stage 0; stage 0 the
	 * circular hop of repeat 1 */
	ck_assert_int_eq(recv_act[1], 2 * 2 * 4);
	ck_assert_int_eq(recv_act[0], 2 * 4);
	ck_assert_int_eq(p2p_r[1], recv_act[1]);
	ck_assert_int_eq(p2p_r[0], recv_act[0]);
	ck_assert_int_eq(p2p_s[0], recv_act[1]);
	/* each send call is on its device's row with its CPU, and what the
	 * spans inside a forward+backward took is in its CPU (2 ms slack:
	 * the clocks are read a few instructions apart) */
	ck_assert_int_eq(send_act[0], sc_act[0]);
	ck_assert_int_eq(send_act[1], sc_act[1]);
	ck_assert_int_eq(send_act[0], recv_act[1]);
	for (int d = 0; d < 2; d++)
		for (int st = 0; st < 2; st++)
			ck_assert_msg(in_cpu[d][st] <= fb_cpu[d][st] + 2000 && in_cpu[d][st] > 0,
				      "device %d step %d: spans' CPU %.0f us, forward+backward's %.0f us", d, st,
				      in_cpu[d][st], fb_cpu[d][st]);
	cJSON_Delete(root);
	free(text);
}
END_TEST

static void refused(const char *args, const char *a, const char *b)
{
	int rc = run(args);
	char *log = read_tmp("log.out");
	ck_assert_msg(rc == 3 && strstr(log, a) && strstr(log, b), "exit %d: %s", rc, log);
	free(log);
}

START_TEST(test_unsupported_refused)
{
	refused("local --hosts 1 --devices-per-host 2 --config " DEEPSEEK " " PP2
		" pipeline_parallel_layers=3 steps=1", "pipeline_parallel_layers", "[1, 2]");
	refused("local --hosts 1 --devices-per-host 2 --config " LLAMA " " PP2 " pipeline_fsdp_ag_once=true "
		"pipeline_fsdp_ag_per_repeat=true steps=1", "pipeline_fsdp_ag_once", "pipeline_fsdp_ag_per_repeat");
	/* one chunk a stage: zb_h1 over 4 layers and 2 stages needs 2 layers a chunk */
	refused("local --hosts 1 --devices-per-host 2 --config " LLAMA " " PP2 " pipeline_schedule=zb_h1 "
		"base_num_decoder_layers=4 steps=1", "pipeline_schedule=zb_h1 runs one chunk per stage",
		"'num_layers_per_pipeline_stage' to 2");
	refused("local --hosts 1 --devices-per-host 2 --config " LLAMA " " PP2 " num_pipeline_microbatches=4 "
		"pipeline_schedule=1f1b pipeline_delay_activation_forwarding=true steps=1",
		"pipeline_delay_activation_forwarding", "circular only");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pipeline");
	TCase *tc = tcase_create("pipeline");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_s2_r1_m2);
	tcase_add_test(tc, test_s2_r2_m4);
	tcase_add_test(tc, test_s4_r1_m4);
	tcase_add_test(tc, test_s4_r2_m8);
	tcase_add_test(tc, test_delay);
	tcase_add_test(tc, test_lps2);
	tcase_add_test(tc, test_dcn_stages);
	tcase_add_test(tc, test_pp_data);
	tcase_add_test(tc, test_pp_tensor);
	tcase_add_test(tc, test_pp_zero1);
	tcase_add_test(tc, test_pp_fsdp);
	tcase_add_test(tc, test_pp_tensor_transpose);
	tcase_add_test(tc, test_moe_circular);
	tcase_add_test(tc, test_moe_expert);
	tcase_add_test(tc, test_layers_outside);
	tcase_add_test(tc, test_idle_slots_poisoned);
	tcase_add_test(tc, test_checkpoint_layer_order);
	tcase_add_test(tc, test_checkpoint_outside);
	tcase_add_test(tc, test_trace_slots);
	tcase_add_test(tc, test_unsupported_refused);
	suite_add_tcase(s, tc);
	/* FSDP weight modes with repeats (CK_RUN_CASE=fsdp_window) */
	TCase *tw = tcase_create("fsdp_window");
	tcase_add_checked_fixture(tw, setup, teardown);
	tcase_set_timeout(tw, 400);
	tcase_add_test(tw, test_fsdp_ag_once);
	tcase_add_test(tw, test_fsdp_ag_per_repeat);
	tcase_add_test(tw, test_fsdp_ag_per_repeat_s3);
	tcase_add_test(tw, test_fsdp_ag_per_repeat_s4);
	tcase_add_test(tw, test_fsdp_ag_per_repeat_delay);
	tcase_add_test(tw, test_fsdp_iter_repeats);
	tcase_add_test(tw, test_fsdp_modes_outside);
	tcase_add_test(tw, test_fsdp_gathers_counted);
	suite_add_tcase(s, tw);

	SRunner *sr = srunner_create(s);
	/* no fork: the single-device baselines are cached across tests */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
