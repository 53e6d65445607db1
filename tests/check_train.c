/* Training across real agents on loopback (TLS, separate processes):
 * every parallelism and combination gives the single-device losses of the
 * same global batch,
 * runs are bit-identical, checkpoints resume bit-identically and load into
 * the single-device eval; unsupported mesh axes are refused clearly. */
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
	proc_setup("meshrun-train", 0);
}

static void equivalence(const char *preset, int hosts, int dph, const char *extra)
{
	equivalence_opt(preset, hosts, dph, extra, "");
}

START_TEST(test_ep_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_expert_parallelism=2");
}
END_TEST
START_TEST(test_dcn_ep_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 2, 2, "dcn_data_parallelism=1 dcn_expert_parallelism=2");
}
END_TEST
/* DeepSeek-V3's group-limited routing (4 groups of 2 experts, the best 2
 * compete) with the experts on two hosts: the same experts as one device */
START_TEST(test_ep_groups_equals_single)
{
	equivalence_opt("configs/deepseek-tiny.yml", 2, 1, "dcn_data_parallelism=1 dcn_expert_parallelism=2",
			"n_routing_groups=4 topk_routing_group=2");
}
END_TEST
/* Muon on whole local expert matrices (each device holds whole experts) */
START_TEST(test_ep_muon_equals_single)
{
	equivalence_opt("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_expert_parallelism=2",
			"opt_type=muon learning_rate=0.01");
}
END_TEST

START_TEST(test_dcn_ep_fsdp_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 2, 2, "dcn_data_parallelism=1 dcn_expert_parallelism=2 "
		    "ici_data_parallelism=1 ici_fsdp_parallelism=2");
}
END_TEST
/* shard-exp-on-fsdp: experts split over fsdp, whole matrices local, Muon */
START_TEST(test_shard_exp_on_fsdp_muon_equals_single)
{
	equivalence_opt("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_fsdp_parallelism=2 "
			"custom_mesh_and_rule=shard-exp-on-fsdp", "opt_type=muon learning_rate=0.01");
}
END_TEST

START_TEST(test_tt_equals_single)
{
	equivalence("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_transpose_parallelism=2");
	equivalence("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_transpose_parallelism=2");
}
END_TEST
START_TEST(test_tt_fsdp_data_equals_single)
{
	equivalence("configs/llama-tiny.yml", 2, 2, "ici_data_parallelism=1 ici_tensor_transpose_parallelism=2");
	equivalence("configs/deepseek-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_tensor_transpose_parallelism=2");
}
END_TEST

START_TEST(test_dp_equals_single_dense) { equivalence("configs/llama-tiny.yml", 2, 2, ""); }
END_TEST
START_TEST(test_dp_equals_single_moe) { equivalence("configs/deepseek-tiny.yml", 2, 2, ""); }
END_TEST
/* ZeRO-1 in buckets of one layer each (grad_bucket_mb tiny) over data
 * rings of 4: each float lands in the same block as when the whole seg
 * is reduce-scattered at once (an MoE model under ZeRO-1: beside experts
 * below, and check_deepseek3's test_zero1_fsdp_transpose) */
START_TEST(test_zero1_equals_single)
{
	equivalence("configs/llama-tiny.yml", 2, 2, "shard_optimizer_over_data=true grad_bucket_mb=0.01");
}
END_TEST
START_TEST(test_fsdp_equals_single)
{
	equivalence("configs/llama-tiny.yml", 1, 2, "ici_fsdp_parallelism=2");
	equivalence("configs/deepseek-tiny.yml", 1, 2, "ici_fsdp_parallelism=2");
}
END_TEST
/* fsdp over 2 hosts x 2 devices: llama-tiny with the two-level
 * collectives (its gathers, reduce-scatters and the norm's all_reduce
 * over all four: net/coll_hier.c), deepseek-tiny with the flat ring */
START_TEST(test_dcn_fsdp_equals_single)
{
	equivalence("configs/llama-tiny.yml", 2, 2,
		    "dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2 coll_two_level=true");
	equivalence("configs/deepseek-tiny.yml", 2, 2, "dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2");
}
END_TEST
START_TEST(test_tp_equals_single)
{
	equivalence("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2");
}
END_TEST
START_TEST(test_tp_moe_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2");
}
END_TEST
START_TEST(test_fsdp_tp_equals_single)
{
	equivalence("configs/llama-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2");
	equivalence("configs/deepseek-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2");
}
END_TEST
START_TEST(test_dcn_data_tp_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 2, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2");
}
END_TEST
START_TEST(test_fsdp_with_data_equals_single)
{
	equivalence("configs/llama-tiny.yml", 2, 2, "ici_fsdp_parallelism=2");
}
END_TEST

/* Combinations no hand-placed code path covers: the planner composes them.
 * Muon on split matrices (tensor, fsdp) gathers each matrix for
 * Newton-Schulz; tied embeddings use one vocab-split table both ways. */
START_TEST(test_tp_muon_tied_equals_single)
{
	equivalence_opt("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2",
			"opt_type=muon learning_rate=0.01");
	equivalence_opt("configs/llama-tiny.yml", 1, 2, "ici_fsdp_parallelism=2",
			"opt_type=muon learning_rate=0.01");
	equivalence_opt("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2",
			"logits_via_embedding=true");
}
END_TEST
START_TEST(test_tp_ep_tt_combinations_equal_single)
{
	equivalence("configs/deepseek-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_tensor_parallelism=2 ici_expert_parallelism=2");
	equivalence("configs/llama-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_tensor_parallelism=2 ici_tensor_transpose_parallelism=2");
	equivalence("configs/deepseek-tiny.yml", 1, 4,
		    "ici_data_parallelism=1 ici_expert_parallelism=2 ici_tensor_transpose_parallelism=2");
}
END_TEST
/* ZeRO-1 beside experts: each bucket's part all-reduced over `exp`
 * after its reduce-scatter over data (one-layer buckets) */
START_TEST(test_ep_zero1_fsdp_t_equals_single)
{
	equivalence("configs/deepseek-tiny.yml", 2, 2,
		    "ici_data_parallelism=1 ici_expert_parallelism=2 shard_optimizer_over_data=true grad_bucket_mb=0.01");
	equivalence("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_fsdp_transpose_parallelism=2");
}
END_TEST

static double eval_loss(const char *ckpt)
{
	char args[512];
	snprintf(args, sizeof(args), "eval --checkpoint %s/%s --text /usr/share/common-licenses/GPL-3",
		 tmpdir, ckpt);
	show_log_on_failure(run(args), 0);
	char *log = read_tmp("log.out");
	char *p = strstr(log, "eval_loss: ");
	ck_assert_msg(p, "%s", log);
	double ev = strtod(p + 11, NULL);
	free(log);
	return ev;
}

/* mesh: the local flags; ndev devices in all (global batch 8 x ndev) */
static void resume_and_eval_preset(const char *preset, const char *mesh, int ndev)
{
	char args[1024];
	double straight[8], part[8], rest[8];
	snprintf(args, sizeof(args), "local %s --config %s steps=8 "
		 "learning_rate_schedule_steps=8 --metrics %s/straight.jsonl", mesh, preset, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config %s steps=8 "
		 "learning_rate_schedule_steps=8 checkpoint_period=4 --checkpoint-dir %s/ckpt "
		 "--metrics %s/part.jsonl", mesh, preset, tmpdir, tmpdir);
	show_log_on_failure(run(args), 0);
	/* a checkpoint at step 4 of the same schedule, then resume from it */
	snprintf(args, sizeof(args), "local %s --config %s steps=4 "
		 "learning_rate_schedule_steps=8 --checkpoint-dir %s/ckpt4", mesh, preset, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config %s steps=8 "
		 "learning_rate_schedule_steps=8 --checkpoint-dir %s/ckpt4 --resume "
		 "--metrics %s/rest.jsonl", mesh, preset, tmpdir, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("straight.jsonl", straight, 8), 8);
	ck_assert_int_eq(losses("part.jsonl", part, 8), 8);
	ck_assert_int_eq(losses("rest.jsonl", rest, 8), 4);
	for (int s = 0; s < 8; s++)
		ck_assert_msg(part[s] == straight[s], "step %d differs with checkpointing on", s);
	for (int s = 0; s < 4; s++)
		ck_assert_msg(rest[s] == straight[4 + s], "resumed step %d: %a vs %a", 4 + s, rest[s],
			      straight[4 + s]);

	/* the multi-host checkpoint is a plain single-device checkpoint: it
	 * evaluates like the checkpoint of the same training on one device */
	snprintf(args, sizeof(args), "train --config %s steps=8 "
		 "learning_rate_schedule_steps=8 per_device_batch_size=%d --checkpoint-dir %s/one",
		 preset, 8 * ndev, tmpdir);
	show_log_on_failure(run(args), 0);
	double ev = eval_loss("ckpt"), ev1 = eval_loss("one");
	fprintf(stderr, "%s: eval of the multi-host checkpoint %.6f, one device %.6f\n", mesh, ev, ev1);
	ck_assert_msg(ev < 4.5 && ev > 1.0, "eval_loss %g", ev);
	ck_assert_msg(fabs(ev - ev1) < 1e-4 * ev1, "eval %.8f vs one device %.8f", ev, ev1);
	/* a step directory named directly is the same checkpoint */
	ck_assert(eval_loss("ckpt/step-000008") == ev);
	char path[256];
	snprintf(path, sizeof(path), "%s/ckpt/step-000008/config.json", tmpdir);
	ck_assert(access(path, R_OK) == 0);
	/* only the newest step is kept, and no *.tmp is left behind */
	snprintf(path, sizeof(path), "%s/ckpt/step-000004", tmpdir);
	ck_assert(access(path, F_OK) != 0);
	snprintf(path, sizeof(path), "%s/ckpt/step-000008.tmp", tmpdir);
	ck_assert(access(path, F_OK) != 0);
}

static void resume_and_eval(const char *mesh, int ndev)
{
	resume_and_eval_preset("configs/llama-tiny.yml", mesh, ndev);
}

START_TEST(test_dp_resume_and_eval) { resume_and_eval("--hosts 2", 2); }
END_TEST
/* optimizer state sharded over fsdp: gathered for the checkpoint, scattered on resume */
START_TEST(test_fsdp_resume_and_eval)
{
	resume_and_eval("--hosts 2 --devices-per-host 2 ici_fsdp_parallelism=2 shard_optimizer_over_data=true", 4);
}
END_TEST
/* whole tensors gathered from the tensor group for the checkpoint, split again on resume */
START_TEST(test_tp_resume_and_eval)
{
	resume_and_eval("--hosts 2 --devices-per-host 2 ici_data_parallelism=1 ici_tensor_parallelism=2 "
			"shard_optimizer_over_data=true", 4);
}
END_TEST

/* experts split over expert, their hidden and the vocabulary over tensor:
 * gathered whole into a checkpoint one device evaluates, split again on
 * resume */
START_TEST(test_ep_tp_resume_and_eval)
{
	resume_and_eval_preset("configs/deepseek-tiny.yml", "--hosts 1 --devices-per-host 4 "
			       "ici_data_parallelism=1 ici_expert_parallelism=2 ici_tensor_parallelism=2", 4);
}
END_TEST

/* --trace: one Chrome trace with, per device, a span per step holding its
 * forward+backward and communication spans */
START_TEST(test_tt_resume_and_eval)
{
	resume_and_eval("--hosts 2 --devices-per-host 2 ici_data_parallelism=1 "
			"ici_tensor_transpose_parallelism=2", 4);
}
END_TEST

/* One complete span ("ph": "X") of a --trace file. */
struct span {
	int tid, dev, pid, step; /* dev: tid without the flight track's offset; step -1: none */
	bool flight;             /* on the background collectives' track */
	const char *name, *cat;  /* "" when absent; they point into the parsed trace */
	double ts, dur;
};

struct spans {
	cJSON *root;
	struct span *v;
	int n;
};

/* The complete spans of tmpdir/file in file order; fails the test when
 * the file is not a trace. Free with spans_free. */
static struct spans spans_read(const char *file)
{
	char *text = read_tmp(file);
	struct spans t = { .root = cJSON_Parse(text) };
	free(text);
	ck_assert_msg(t.root, "%s: trace is not JSON", file);
	cJSON *evs = cJSON_GetObjectItem(t.root, "traceEvents"), *e;
	t.v = calloc((size_t)cJSON_GetArraySize(evs) + 1, sizeof(*t.v));
	ck_assert_ptr_nonnull(t.v);
	cJSON_ArrayForEach(e, evs) {
		cJSON *ph = cJSON_GetObjectItem(e, "ph"), *args = cJSON_GetObjectItem(e, "args");
		cJSON *name = cJSON_GetObjectItem(e, "name"), *cat = cJSON_GetObjectItem(e, "cat");
		cJSON *step = args ? cJSON_GetObjectItem(args, "step") : NULL;
		if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X"))
			continue;
		struct span *sp = &t.v[t.n++];
		sp->tid = cJSON_GetObjectItem(e, "tid")->valueint;
		sp->pid = cJSON_GetObjectItem(e, "pid")->valueint;
		sp->flight = sp->tid >= TRACE_FLIGHT_TID;
		sp->dev = sp->tid % TRACE_FLIGHT_TID;
		sp->step = cJSON_IsNumber(step) ? step->valueint : -1;
		sp->name = cJSON_IsString(name) ? name->valuestring : "";
		sp->cat = cJSON_IsString(cat) ? cat->valuestring : "";
		sp->ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
		sp->dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
	}
	return t;
}

static void spans_free(struct spans *t)
{
	cJSON_Delete(t->root);
	free(t->v);
}

START_TEST(test_trace)
{
	char args[512];
	snprintf(args, sizeof(args), "local --hosts 2 --devices-per-host 2 --config configs/llama-tiny.yml "
		 "steps=3 ici_data_parallelism=1 ici_tensor_parallelism=2 --trace %s/t.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("t.json");
	int steps[4] = { 0 }, fb[4] = { 0 }, comm[4] = { 0 }, grads[4] = { 0 }, flight[4] = { 0 };
	int inside = 0, spans = 0;
	double st0[4][3] = { { 0 } }, st1[4][3] = { { 0 } };
	for (int i = 0; i < t.n; i++) {
		const struct span *sp = &t.v[i];
		/* the background collectives' track: the bucket that ran */
		if (sp->flight) {
			ck_assert_str_eq(sp->cat, "flight");
			ck_assert(sp->dev >= 0 && sp->dev < 4);
			flight[sp->dev] += !strncmp(sp->name, "grads ", 6);
			continue;
		}
		int tid = sp->tid, step = sp->step;
		ck_assert(tid >= 0 && tid < 4);
		ck_assert_int_eq(sp->pid, tid / 2); /* host of the device */
		ck_assert(step >= 0 && step < 3 && sp->dur >= 0);
		if (!strcmp(sp->name, "step")) {
			steps[tid]++;
			st0[tid][step] = sp->ts;
			st1[tid][step] = sp->ts + sp->dur;
		}
		fb[tid] += !strcmp(sp->name, "forward+backward");
		comm[tid] += !strcmp(sp->cat, "comm") && strncmp(sp->name, "grads ", 6);
		grads[tid] += !strcmp(sp->cat, "comm") && !strncmp(sp->name, "grads ", 6);
	}
	for (int i = 0; i < t.n; i++) {
		const struct span *sp = &t.v[i];
		if (!strcmp(sp->name, "step"))
			continue;
		ck_assert(sp->step >= 0 && sp->step < 3);
		spans++;
		inside += sp->ts >= st0[sp->dev][sp->step] - 1 && sp->ts + sp->dur <= st1[sp->dev][sp->step] + 1;
	}
	for (int d = 0; d < 4; d++) {
		ck_assert_int_eq(steps[d], 3);
		ck_assert_int_eq(fb[d], 3);
		/* per step: 2 layers x 4 tensor all-reduces (attention and
		 * MLP outputs forward, their input gradients backward); the
		 * vocab split over tensor: the embedding's partial rows, the
		 * softmax maxima and sums, the output projection's input
		 * gradient */
		ck_assert_int_eq(comm[d], 3 * (8 + 4));
		/* and the gradient buckets over data, each waited for once
		 * and shown running on the flight track */
		ck_assert_int_gt(grads[d], 0);
		ck_assert_int_eq(grads[d] % 3, 0);
		ck_assert_int_eq(flight[d], grads[d]);
	}
	ck_assert_int_eq(inside, spans);
	spans_free(&t);
}
END_TEST

/* Gradient buckets of one layer each (grad_bucket_mb tiny): data over 4
 * devices, and beside FSDP with ZeRO-1 (a layer's bucket starts when the
 * window's reduce-scatter of it has landed; the window's gathers wait
 * for the ZeRO-1 gathers of their group), equal one device */
START_TEST(test_small_buckets_equal_single)
{
	equivalence("configs/llama-tiny.yml", 2, 2, "grad_bucket_mb=0.01");
	equivalence("configs/llama-tiny.yml", 2, 2, "dcn_data_parallelism=2 ici_data_parallelism=1 "
		    "ici_fsdp_parallelism=2 shard_optimizer_over_data=true grad_bucket_mb=0.01");
}
END_TEST

/* The last layers' buckets are started during the backward: from the
 * trace's events (not from timing), on every device and step, the
 * bucket of layer 1 is queued ("q grads L1-1" on the flight track)
 * before the backward of layer 0 ("B mb0 c0") begins, and its
 * all-reduce (one collective over all its runs of adjacent floats) then
 * runs once. Three layers at the default bucket size
 * (25 MiB, the first 1 MiB: [head, layer 2], then layers 1 and 0 and
 * the embedding would fit one bucket): layer 0, the last layer the
 * backward completes, starts a bucket of its own, so layer 1 does not
 * wait for it. */
START_TEST(test_bucket_starts_during_backward)
{
	char args[512];
	snprintf(args, sizeof(args), "local --hosts 2 --config configs/llama-tiny.yml steps=3 "
		 "base_num_decoder_layers=3 --trace %s/b.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("b.json");
	double queued[2][3], b0[2][3];
	int ran[2][3] = { { 0 } }, nq[2][3] = { { 0 } };
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 3; s++)
			queued[d][s] = b0[d][s] = -1;
	for (int i = 0; i < t.n; i++) {
		const struct span *sp = &t.v[i];
		int d = sp->dev, step = sp->step;
		ck_assert(d >= 0 && d < 2 && step >= 0 && step < 3);
		if (sp->flight && !strcmp(sp->name, "q grads L1-1")) {
			/* the bucket's all-reduce */
			if (queued[d][step] < 0 || sp->ts < queued[d][step])
				queued[d][step] = sp->ts;
			nq[d][step]++;
		} else if (sp->flight && !strcmp(sp->name, "grads L1-1"))
			ran[d][step]++;
		else if (!sp->flight && !strcmp(sp->name, "B mb0 c0"))
			b0[d][step] = sp->ts;
	}
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 3; s++) {
			/* one all-reduce for the whole bucket, queued and run once */
			ck_assert_msg(queued[d][s] >= 0 && b0[d][s] >= 0 && ran[d][s] == 1 && nq[d][s] == 1,
				      "device %d step %d: no bucket of layer 1 or no backward of layer 0 "
				      "(%d queued, %d ran)", d, s, nq[d][s], ran[d][s]);
			ck_assert_msg(queued[d][s] < b0[d][s], "device %d step %d: layer 1's bucket queued at "
				      "%.0f us, layer 0's backward began at %.0f us", d, s, queued[d][s], b0[d][s]);
		}
	spans_free(&t);
}
END_TEST

/* ZeRO-1's collectives under compute, from the trace's order of events
 * (not from timing), on every device: in every step the reduce-scatter
 * of layer 1's bucket is queued ("q zero L1-1" on the flight track)
 * before layer 0's backward ("B mb0 c0") begins; the update queues the
 * parameters' gathers bucket by bucket, embedding and layer 0 first
 * ("q params embed" < "q params L0-0" < "q params L1-1" < "q params
 * head", 4 each update); and the next step's forward waits for them layer by layer:
 * layer 0's forward ("F mb0 c0") begins before the device waits for
 * layer 1's parameters ("params L1-1" on its own track). */
START_TEST(test_zero1_collectives_under_compute)
{
	static const char *const gname[4] = { "q params embed", "q params L0-0", "q params L1-1", "q params head" };
	char args[512];
	snprintf(args, sizeof(args), "local --hosts 2 --config configs/llama-tiny.yml steps=3 "
		 "shard_optimizer_over_data=true grad_bucket_mb=0.01 --trace %s/z.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("z.json");
	/* per device and step: the events' times, -1 when absent */
	double rs1[2][3], b0[2][3], f0[2][3], w1[2][3], q[2][3][4];
	int nq[2] = { 0 };
	double *all[] = { &rs1[0][0], &b0[0][0], &f0[0][0], &w1[0][0], &q[0][0][0] };
	size_t cnt[] = { 6, 6, 6, 6, 24 };
	for (int a = 0; a < 5; a++)
		for (size_t i = 0; i < cnt[a]; i++)
			all[a][i] = -1;
	for (int i = 0; i < t.n; i++) {
		const struct span *sp = &t.v[i];
		int d = sp->dev, step = sp->step;
		const char *name = sp->name;
		double ts = sp->ts;
		bool flight = sp->flight;
		ck_assert(d >= 0 && d < 2 && step >= 0 && step < 3);
		if (flight && !strcmp(name, "q zero L1-1"))
			rs1[d][step] = ts;
		else if (!flight && !strcmp(name, "B mb0 c0"))
			b0[d][step] = ts;
		else if (!flight && !strcmp(name, "F mb0 c0"))
			f0[d][step] = ts;
		else if (!flight && !strcmp(name, "params L1-1"))
			w1[d][step] = ts;
		for (int g = 0; flight && g < 4; g++)
			if (!strcmp(name, gname[g])) {
				/* a gather is traced when it is waited for: by the
				 * step after its update (1, 2), the last update's
				 * by the end of the run (still step 2) */
				ck_assert_msg(step >= 1, "device %d: %s in step %d", d, name, step);
				if (q[d][step][g] < 0 || ts < q[d][step][g])
					q[d][step][g] = ts;
				nq[d]++;
			}
	}
	for (int d = 0; d < 2; d++) {
		ck_assert_int_eq(nq[d], 3 * 4);
		for (int s = 0; s < 3; s++) {
			ck_assert_msg(rs1[d][s] >= 0 && b0[d][s] >= 0, "device %d step %d: no reduce-scatter of "
				      "layer 1 or no backward of layer 0", d, s);
			ck_assert_msg(rs1[d][s] < b0[d][s], "device %d step %d: layer 1's reduce-scatter queued at "
				      "%.0f us, layer 0's backward began at %.0f us", d, s, rs1[d][s], b0[d][s]);
			if (s == 0)
				continue;
			for (int g = 1; g < 4; g++)
				ck_assert_msg(q[d][s][g - 1] <= q[d][s][g], "device %d step %d: %s queued after %s", d,
					      s, gname[g - 1], gname[g]);
			ck_assert_msg(f0[d][s] >= 0 && w1[d][s] >= 0 && f0[d][s] < w1[d][s], "device %d step %d: "
				      "layer 0's forward at %.0f us, the wait for layer 1's parameters at %.0f us", d,
				      s, f0[d][s], w1[d][s]);
		}
	}
	spans_free(&t);
}
END_TEST

static int by_ts(const void *a, const void *b)
{
	const struct span *x = *(const struct span *const *)a, *y = *(const struct span *const *)b;
	return (x->ts > y->ts) - (x->ts < y->ts);
}

/* Muon's exchanges in the background (host/optim/muon.c): on each
 * device's exchange thread, which runs them one at a time in the order
 * issued (so the order of their flights is the order of issue, not a
 * timing), every step sends at least 7 tensors' blocks to their owners
 * (llama's 7 matrices a layer, in pieces) and returns as many results;
 * the first results leave only after the blocks of the two tensors
 * after it (MUON_AHEAD): those moved while its owner orthogonalised. */
static void muon_exchange_order(const struct spans *t, int ndev)
{
	const struct span **f = calloc((size_t)t->n + 1, sizeof(*f));
	ck_assert_ptr_nonnull(f);
	for (int d = 0; d < ndev; d++)
		for (int s = 0; s < 2; s++) {
			int n = 0, to = 0, back = 0, first_back = -1;
			for (int i = 0; i < t->n; i++)
				if (t->v[i].flight && t->v[i].dev == d && t->v[i].step == s &&
				    !strncmp(t->v[i].name, "muon ", 5))
					f[n++] = &t->v[i];
			qsort(f, (size_t)n, sizeof(*f), by_ts);
			for (int i = 0; i < n; i++) {
				size_t len = strlen(f[i]->name);
				bool is_back = len > 5 && !strcmp(f[i]->name + len - 5, " back");
				if (is_back && first_back < 0)
					first_back = to;
				back += is_back;
				to += !is_back;
			}
			ck_assert_msg(to >= 7 && to == back, "device %d step %d: %d exchanges to owners, %d back", d, s,
				      to, back);
			ck_assert_msg(first_back >= 3, "device %d step %d: the first results left after %d tensors' "
				      "blocks, not 3", d, s, first_back);
		}
	free(f);
}

/* FSDP: the next step's first gathers are started by the update, once
 * it has updated their shards: from the trace's order of events (not
 * from timing), on each of the ndev devices, inside every step's
 * "optimizer" span the table's three leading gathers (the non-layer
 * group, layers 0 and 1) are handed to the communication thread ("q
 * all_gather (prefetch)" on the flight track): the first layer's too, so
 * it is on its way before the next step's first compute action (before,
 * only the non-layer group's went, and layer 0's waited in the window
 * until the embedding had waited for it); and with off_too, with grad_bucket_mb=0 (the
 * order before, whatever the optimizer: prefetching()) none is. With after (a span name's start), the update also has such
 * a span begin after the first gather is queued: under Muon the wait
 * for an exchange ("wait muon", the update of the later layers'
 * matrices; their order: muon_exchange_order), beside
 * ZeRO-1 the queueing of a later layer's parameter gather ("q params
 * L3"): the first gathers left before the rest of the update. Every
 * queue span ("q ...") has a duration of 0 or more. */
static void first_gather_in_update(const char *mesh, int ndev, const char *extra, const char *after, bool off_too)
{
	for (int off = 0; off < 1 + off_too; off++) {
		char args[512];
		snprintf(args, sizeof(args), "local %s --config configs/llama-tiny.yml steps=2 %s %s --trace %s/f.json",
			 mesh, extra, off ? "grad_bucket_mb=0" : "", tmpdir);
		show_log_on_failure(run(args), 0);
		struct spans t = spans_read("f.json");
		if (strstr(extra, "opt_type=muon"))
			muon_exchange_order(&t, ndev);
		double o0[4][2], o1[4][2], q0[4][2];
		int inside[4][2] = { { 0 } }, later[4][2] = { { 0 } };
		for (int d = 0; d < 4; d++)
			for (int s = 0; s < 2; s++)
				o0[d][s] = o1[d][s] = q0[d][s] = -1;
		for (int i = 0; i < t.n; i++) {
			const struct span *sp = &t.v[i];
			if (sp->flight || strcmp(sp->name, "optimizer"))
				continue;
			ck_assert(sp->tid >= 0 && sp->tid < ndev && sp->step >= 0 && sp->step < 2);
			o0[sp->tid][sp->step] = sp->ts;
			o1[sp->tid][sp->step] = sp->ts + sp->dur;
		}
		/* the queued gathers first, then the spans after them */
		for (int pass = 0; pass < 2; pass++)
			for (int i = 0; i < t.n; i++) {
				const struct span *sp = &t.v[i];
				int d = sp->dev;
				const char *name = sp->name;
				double ts = sp->ts;
				ck_assert(d >= 0 && d < ndev);
				/* a queue span starts before its collective can run */
				ck_assert_msg(!sp->flight || strncmp(name, "q ", 2) || sp->dur >= 0,
					      "device %d: %s has a negative duration", d, name);
				for (int s = 0; s < 2; s++) {
					if (ts < o0[d][s] || ts > o1[d][s])
						continue;
					if (!pass && sp->flight && !strcmp(name, "q all_gather (prefetch)")) {
						inside[d][s]++;
						q0[d][s] = q0[d][s] < 0 || ts < q0[d][s] ? ts : q0[d][s];
					}
					if (pass && after && !strncmp(name, after, strlen(after)))
						later[d][s] += q0[d][s] >= 0 && ts > q0[d][s];
				}
			}
		for (int d = 0; d < ndev; d++)
			for (int s = 0; s < 2; s++) {
				ck_assert_msg(o0[d][s] >= 0, "device %d step %d: no optimizer span", d, s);
				if (off) {
					ck_assert_msg(!inside[d][s], "device %d step %d: grad_bucket_mb=0 queued %d "
						      "gathers in the update", d, s, inside[d][s]);
					continue;
				}
				/* fsdp_layer_parts (auto, the default): a layer's gather in two */
				int want = strstr(extra, "fsdp_layer_parts=false") ? 3 : 5;
				ck_assert_msg(inside[d][s] == want, "device %d step %d: %d gathers queued in the update, "
					      "not %d (the non-layer group, layers 0 and 1%s)", d, s, inside[d][s], want,
					      want == 5 ? ", two parts each" : "");
				ck_assert_msg(!after || later[d][s] >= 1, "device %d step %d: no %s after the first "
					      "gather was queued", d, s, after);
			}
		spans_free(&t);
	}
}

#define FSDP2 "--hosts 1 --devices-per-host 2 ici_data_parallelism=1 ici_fsdp_parallelism=2"

START_TEST(test_fsdp_first_gather_started_by_update)
{
	/* one at a time: layer 0's shards are updated after the non-layer
	 * group's gather left */
	first_gather_in_update(FSDP2, 2, "", "update first 1", false);
	/* whole layers: one gather a layer */
	first_gather_in_update(FSDP2, 2, "fsdp_layer_parts=false", NULL, false);
}
END_TEST

/* The step's last two reduce-scatters, layer 0's and the non-layer
 * group's: the second is queued on the communication track before the
 * device waits for the first (the second-to-last of its reduce-scatter
 * waits in the step), so the communication thread never idles while
 * the device wakes to queue it. On main the device waited for layer 0's
 * first (the order, not a time, from the trace). */
START_TEST(test_fsdp_nonlayer_scatter_beside_layer0)
{
	char args[512];
	snprintf(args, sizeof(args), "local %s --config configs/llama-tiny.yml steps=2 --trace %s/b.json", FSDP2,
		 tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("b.json");
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 2; s++) {
			double w[2] = { -1, -1 }, q = -1;  /* the last two waits' starts, the last queueing */
			int nw = 0, nq = 0;
			for (int i = 0; i < t.n; i++) {
				const struct span *sp = &t.v[i];
				if (sp->dev != d || sp->step != s)
					continue;
				if (!sp->flight && !strncmp(sp->name, "reduce_scatter", 14)) {
					nw++;
					if (sp->ts > w[1]) {
						w[0] = w[1];
						w[1] = sp->ts;
					} else if (sp->ts > w[0]) {
						w[0] = sp->ts;
					}
				}
				if (sp->flight && !strncmp(sp->name, "q reduce_scatter", 16)) {
					nq++;
					q = sp->ts > q ? sp->ts : q;
				}
			}
			ck_assert_msg(nw >= 2 && nq >= 2, "device %d step %d: %d waits, %d queued reduce-scatters", d, s,
				      nw, nq);
			ck_assert_msg(q <= w[0], "device %d step %d: the non-layer reduce-scatter was queued after the "
				      "device waited for layer 0's", d, s);
		}
	spans_free(&t);
}
END_TEST

/* Each metrics line's loss_hex into out (at most max). */
static int loss_hexes(const char *name, char (*out)[40], int max)
{
	char *text = read_tmp(name), *line = text;
	int n = 0;
	while (n < max && line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		cJSON *j = cJSON_Parse(line), *h = j ? cJSON_GetObjectItem(j, "loss_hex") : NULL;
		ck_assert_msg(cJSON_IsString(h), "metrics line without loss_hex: %s", line);
		snprintf(out[n++], sizeof(*out), "%s", h->valuestring);
		cJSON_Delete(j);
		line = nl ? nl + 1 : NULL;
	}
	free(text);
	return n;
}

/* The span of device d, step s, on its own track, named name (NULL: none). */
static const struct span *dev_span(const struct spans *t, int d, int s, const char *name)
{
	for (int i = 0; i < t->n; i++)
		if (t->v[i].dev == d && t->v[i].step == s && !t->v[i].flight && !strcmp(t->v[i].name, name))
			return &t->v[i];
	return NULL;
}

/* The spans of device d, step s inside span `in` (starting in it): with
 * rs, the reduce-scatters queued on the flight track after it began
 * (one queued by the action before starts before it); else the gathers
 * it waited for on its own track, from its start. An order, not a time. */
static int inside(const struct spans *t, int d, int s, const struct span *in, bool rs)
{
	int n = 0;
	for (int i = 0; i < t->n; i++) {
		const struct span *sp = &t->v[i];
		if (sp->dev != d || sp->step != s || sp->flight != rs || sp->ts >= in->ts + in->dur)
			continue;
		n += rs ? !strncmp(sp->name, "q reduce_scatter", 16) && sp->ts > in->ts
			: !strncmp(sp->name, "all_gather", 10) && sp->ts >= in->ts;
	}
	return n;
}

/* fsdp_layer_parts (issue 20), auto (the default) against false: layer
 * 0's feed-forward block's reduce-scatter is queued inside layer 0's
 * backward (the previous layer's goes at the RS action before it, the
 * rest of layer 0's at the one after it), and layer 0's forward waits
 * inside it for each of its two parts (a wait a part, landed or not;
 * whole, one); the losses are the switch off's, bit for bit. Only the
 * order, from the trace: no share of an action's time decides (until
 * the tenth session the counts began after the action's first tenth,
 * which load could move). */
/* llama-tiny on FSDP2 for 3 steps with `extra`, in parts (traced to
 * NAME.json) and in whole layers (fsdp_layer_parts=false): the same
 * loss_hex each step. */
static void parts_same_losses(const char *mesh, const char *extra, const char *name)
{
	char args[512], on[10][40], off[10][40], f[64];
	snprintf(args, sizeof(args), "local %s --config configs/llama-tiny.yml steps=3 %s "
		 "--trace %s/%s.json --metrics %s/%s.jsonl", mesh, extra, tmpdir, name, tmpdir, name);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config configs/llama-tiny.yml steps=3 %s fsdp_layer_parts=false "
		 "--metrics %s/%s-whole.jsonl", mesh, extra, tmpdir, name);
	show_log_on_failure(run(args), 0);
	snprintf(f, sizeof(f), "%s.jsonl", name);
	ck_assert_int_eq(loss_hexes(f, on, 10), 3);
	snprintf(f, sizeof(f), "%s-whole.jsonl", name);
	ck_assert_int_eq(loss_hexes(f, off, 10), 3);
	for (int s = 0; s < 3; s++)
		ck_assert_msg(!strcmp(on[s], off[s]), "step %d: loss %s in parts, %s in whole layers", s, on[s],
			      off[s]);
}

START_TEST(test_fsdp_layer_parts)
{
	parts_same_losses(FSDP2, "", "p");
	struct spans t = spans_read("p.json");
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 3; s++) {
			const struct span *b = dev_span(&t, d, s, "B mb0 c0"), *f = dev_span(&t, d, s, "F mb0 c0");
			ck_assert_msg(b && f, "device %d step %d: no F or B of layer 0", d, s);
			int rs = inside(&t, d, s, b, true), ag = inside(&t, d, s, f, false);
			ck_assert_msg(rs == 1, "device %d step %d: %d reduce-scatters queued inside layer 0's backward",
				      d, s, rs);
			ck_assert_msg(ag >= 2, "device %d step %d: %d gathers waited for inside layer 0's forward, not 2 "
				      "or more", d, s, ag);
		}
	spans_free(&t);
}
END_TEST

/* Grouped-query attention's projections each a part of their own
 * (d_model 512: each projection's block on a member, 64K floats, is
 * above the comm's direct-exchange size, so the parts take the ring as
 * the whole attention block does): the losses of whole layers, bit for
 * bit; and from the trace (the order, not a time), on each device and
 * step, layer 0's forward waits for four gathers or more inside it (wk,
 * wv, wo, the feed-forward block, and its first, wq's, if it waits for
 * it inside: two parts wait for one or two), and the
 * step's last backward (layer 0's) queues two reduce-scatters after its
 * start (the feed-forward block's, then wo, wq and wk's: two parts queue
 * one), while layer 1's, not the last, queues one. */
START_TEST(test_fsdp_projection_parts)
{
	parts_same_losses(FSDP2, "base_emb_dim=512 base_num_query_heads=8 base_num_kv_heads=8", "q");
	struct spans t = spans_read("q.json");
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < 3; s++) {
			const struct span *b0 = dev_span(&t, d, s, "B mb0 c0"), *b1 = dev_span(&t, d, s, "B mb0 c1");
			const struct span *f = dev_span(&t, d, s, "F mb0 c0");
			ck_assert_msg(b0 && b1 && f, "device %d step %d: no F of layer 0 or B of layers 0 and 1", d, s);
			int rs0 = inside(&t, d, s, b0, true), rs1 = inside(&t, d, s, b1, true),
			    ag = inside(&t, d, s, f, false);
			ck_assert_msg(rs0 == 2, "device %d step %d: %d reduce-scatters queued inside layer 0's "
				      "backward, not 2", d, s, rs0);
			ck_assert_msg(rs1 == 1, "device %d step %d: %d reduce-scatters queued inside layer 1's "
				      "backward, not 1", d, s, rs1);
			ck_assert_msg(ag >= 4, "device %d step %d: %d gathers waited for inside layer 0's forward, "
				      "not 4 or more", d, s, ag);
		}
	spans_free(&t);
}
END_TEST

/* fsdp_layer_parts under zbv (fsdp 2 x stage 2, one layer a chunk:
 * pipe_losses' zbv_fsdp), auto against false: the same losses; on every
 * device and step the last W of each of its two chunks (mb 7's) queues
 * a reduce-scatter inside it (its feed-forward block's part: the rest
 * goes at the RS action after it), and the first F of each chunk waits
 * inside it for each of its layer's parts (a wait a part, whether the
 * part has landed or not: whole, one). */
START_TEST(test_zbv_fsdp_parts)
{
	const char *zbv = "--hosts 1 --devices-per-host 4 ici_data_parallelism=1 ici_pipeline_parallelism=2 "
			  "ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=zbv "
			  "base_num_decoder_layers=4 num_pipeline_repeats=2";
	parts_same_losses(zbv, "", "z");
	struct spans t = spans_read("z.json");
	for (int d = 0; d < 4; d++)
		for (int s = 0; s < 3; s++) {
			int c[2] = { d / 2, 3 - d / 2 }, wrs = 0, fag = 0;  /* stage d / 2's chunks in the V */
			for (int j = 0; j < 2; j++) {
				char wn[32], fn[32];
				snprintf(wn, sizeof(wn), "W mb7 c%d", c[j]);
				snprintf(fn, sizeof(fn), "F mb0 c%d", c[j]);
				const struct span *w = dev_span(&t, d, s, wn), *f = dev_span(&t, d, s, fn);
				ck_assert_msg(w && f, "device %d step %d: no %s or %s", d, s, wn, fn);
				wrs += inside(&t, d, s, w, true);
				fag += inside(&t, d, s, f, false);
			}
			ck_assert_msg(wrs == 2, "device %d step %d: %d reduce-scatters queued inside its chunks' "
				      "last W's, not 2", d, s, wrs);
			ck_assert_msg(fag >= 4, "device %d step %d: %d gathers waited for inside its chunks' first "
				      "F's, not 4 or more", d, s, fag);
		}
	spans_free(&t);
}
END_TEST

/* The same with grouped-query attention's projections each a part of
 * their own (d_model 512, as test_fsdp_projection_parts): the losses of
 * whole layers, bit for bit; and on every device and step the stage's
 * last W (mb 7's of its first chunk: layer 0 on stage 0, layer 1 on
 * stage 1) queues three reduce-scatters inside it (the down
 * projection's, written first; the rest of the feed-forward block's;
 * then wo, wq and wk's once wk's weight gradient is written; wv's goes
 * at the RS after it), its other chunk's last W one. Before, a W sent
 * only the feed-forward block's: one each. */
START_TEST(test_zbv_fsdp_last_w_projection_parts)
{
	const char *zbv = "--hosts 1 --devices-per-host 4 ici_data_parallelism=1 ici_pipeline_parallelism=2 "
			  "ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=zbv "
			  "base_num_decoder_layers=4 num_pipeline_repeats=2 base_emb_dim=512 "
			  "base_num_query_heads=8 base_num_kv_heads=8";
	parts_same_losses(zbv, "", "zq");
	struct spans t = spans_read("zq.json");
	for (int d = 0; d < 4; d++)
		for (int s = 0; s < 3; s++) {
			int c[2] = { d / 2, 3 - d / 2 };  /* stage d / 2's chunks in the V */
			for (int j = 0; j < 2; j++) {
				char wn[32];
				snprintf(wn, sizeof(wn), "W mb7 c%d", c[j]);
				const struct span *w = dev_span(&t, d, s, wn);
				ck_assert_msg(w, "device %d step %d: no %s", d, s, wn);
				int rs = inside(&t, d, s, w, true);
				ck_assert_msg(rs == (j ? 1 : 3), "device %d step %d: %d reduce-scatters queued inside %s, "
					      "not %d", d, s, rs, wn, j ? 1 : 3);
			}
		}
	spans_free(&t);
}
END_TEST

/* zbv on fsdp 2 x stage 2, one host of four devices, llama-tiny with
 * four layers (one a chunk), M = 4: the tests below add their keys. */
#define ZBV_TINY                                                                                               \
	"local --hosts 1 --devices-per-host 4 --config configs/llama-tiny.yml ici_data_parallelism=1 "       \
	"ici_pipeline_parallelism=2 ici_fsdp_parallelism=2 num_pipeline_microbatches=4 pipeline_schedule=zbv " \
	"base_num_decoder_layers=4 num_pipeline_repeats=2 "

/* zbv on fsdp 2 x stage 2 (llama-tiny, M = 4, two steps): stage 1 owns
 * no embedding or head, so its sums of them over `stage` (and their
 * bucket behind) are queued on the flight track before its last action
 * (W mb3 c1) starts, not after its table; stage 0's after its own last
 * W (after its table's landings). Before, the sums ran synchronously
 * after the table on both: no "stage sum" on the flight track. The
 * order, not a time. */
START_TEST(test_zbv_stage_sums_before_last_w)
{
	char args[512];
	snprintf(args, sizeof(args), ZBV_TINY "steps=2 --trace %s/ss.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("ss.json");
	for (int d = 0; d < 4; d++)
		for (int s = 0; s < 2; s++) {
			char fn[32], wn[2][32];
			int st = d / 2;
			snprintf(fn, sizeof(fn), "F mb0 c%d", st);
			snprintf(wn[0], sizeof(wn[0]), "W mb3 c%d", st);
			snprintf(wn[1], sizeof(wn[1]), "W mb3 c%d", 3 - st);
			const struct span *f = dev_span(&t, d, s, fn), *w0 = dev_span(&t, d, s, wn[0]),
					  *w1 = dev_span(&t, d, s, wn[1]);
			ck_assert_msg(f && w0 && w1, "device %d step %d: no %s, %s or %s", d, s, fn, wn[0], wn[1]);
			double wend = fmax(w0->ts + w0->dur, w1->ts + w1->dur);
			int before = 0, after = 0;
			for (int i = 0; i < t.n; i++) {
				const struct span *sp = &t.v[i];
				if (sp->dev != d || !sp->flight || strncmp(sp->name, "q stage sum", 11) || sp->ts < f->ts)
					continue;
				before += sp->ts < fmax(w0->ts, w1->ts);
				after += sp->ts >= wend && sp->ts < wend + 1e6;  /* within the second after */
			}
			if (st)
				ck_assert_msg(before >= 1, "device %d step %d: no stage sum queued before its last W", d, s);
			else
				ck_assert_msg(after >= 1 && !before, "device %d step %d: stage sums %d before, %d after "
					      "its last W", d, s, before, after);
		}
	spans_free(&t);
}
END_TEST

/* zbv on fsdp 2 x stage 2 with each repeat's weights gathered one
 * repeat ahead (bench/overlap_sleep.sh's fsdppp_zbv on llama-tiny, two
 * steps): a stage's leading gathers are its non-layer group (stage 0)
 * and both its chunks; the second chunk's, held until the first chunk's
 * first F starts, is queued on the flight track inside that F, on every
 * device and step (before, all were queued before the step: none inside
 * it). The order, not a time. */
START_TEST(test_zbv_fsdp_second_chunk_held)
{
	char args[512];
	snprintf(args, sizeof(args), ZBV_TINY "steps=2 pipeline_fsdp_ag_per_repeat=true --trace %s/h.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("h.json");
	for (int d = 0; d < 4; d++)
		for (int s = 0; s < 2; s++) {
			char fn[32];
			snprintf(fn, sizeof(fn), "F mb0 c%d", d / 2);  /* stage d / 2's first chunk */
			const struct span *f = dev_span(&t, d, s, fn);
			ck_assert_msg(f, "device %d step %d: no %s", d, s, fn);
			int held = 0;
			for (int i = 0; i < t.n; i++) {
				const struct span *sp = &t.v[i];
				held += sp->dev == d && sp->flight && !strncmp(sp->name, "q all_gather", 12) &&
					sp->ts >= f->ts && sp->ts < f->ts + f->dur;
			}
			ck_assert_msg(held >= 1, "device %d step %d: chunk %d's gather not queued inside %s", d, s,
				      3 - d / 2, fn);
		}
	spans_free(&t);
}
END_TEST

/* The same run: a stage whose first chunk action comes after a receive
 * (stage 1: it waits for stage 0's first output) holds its first
 * chunk's gather too, so on every step both its chunks' gathers (two
 * parts each: four) are queued inside its first F, F mb0 c1; stage 0,
 * whose first F waits for its first chunk's gather, still queues only
 * its second chunk's (two) inside F mb0 c0. Before fsdp18 stage 1
 * queued two there (its first chunk's left in the update). */
START_TEST(test_zbv_fsdp_after_recv_first_chunk_held)
{
	char args[512];
	snprintf(args, sizeof(args), ZBV_TINY "steps=2 pipeline_fsdp_ag_per_repeat=true --trace %s/h1.json", tmpdir);
	show_log_on_failure(run(args), 0);
	struct spans t = spans_read("h1.json");
	for (int d = 0; d < 4; d++)
		for (int s = 0; s < 2; s++) {
			char fn[32];
			snprintf(fn, sizeof(fn), "F mb0 c%d", d / 2);
			const struct span *f = dev_span(&t, d, s, fn);
			ck_assert_msg(f, "device %d step %d: no %s", d, s, fn);
			int queued = 0;
			for (int i = 0; i < t.n; i++) {
				const struct span *sp = &t.v[i];
				queued += sp->dev == d && sp->flight && !strncmp(sp->name, "q all_gather", 12) &&
					  sp->ts >= f->ts && sp->ts < f->ts + f->dur;
			}
			ck_assert_msg(queued == (d / 2 ? 4 : 2), "device %d step %d: %d gathers queued inside %s, not %d",
				      d, s, queued, fn, d / 2 ? 4 : 2);
		}
	spans_free(&t);
}
END_TEST

/* The same with Muon, on 4 layers (the first gathers read the head,
 * the embedding and layers 0 and 1; layers 2 and 3 are updated after
 * they left), and beside ZeRO-1 (data 2 x fsdp 2, one-layer buckets:
 * the window waits for the ZeRO-1 gathers of layers 0 and 1, which go
 * first, and layer 3's leaves after it). */
START_TEST(test_fsdp_first_gather_started_by_muon_update)
{
	first_gather_in_update(FSDP2, 2, "opt_type=muon base_num_decoder_layers=4", "wait muon", true);
}
END_TEST

START_TEST(test_fsdp_first_gather_beside_zero1)
{
	first_gather_in_update("--hosts 1 --devices-per-host 4 ici_data_parallelism=2 ici_fsdp_parallelism=2", 4,
			       "shard_optimizer_over_data=true grad_bucket_mb=0.01 base_num_decoder_layers=4",
			       "q params L3", false);
}
END_TEST

/* Each metrics line of file name parsed into out (at most max; the
 * caller deletes them). */
static int metrics_lines(const char *name, cJSON **out, int max)
{
	char *text = read_tmp(name), *line = text;
	int n = 0;
	while (n < max && line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		out[n] = cJSON_Parse(line);
		ck_assert_msg(out[n++], "metrics line is not JSON: %s", line);
		line = nl ? nl + 1 : NULL;
	}
	free(text);
	return n;
}

/* Each metrics line's number `field` (0 when absent) into out. */
static int field_values(const char *name, const char *field, double *out, int max)
{
	cJSON *j[64];
	int n = metrics_lines(name, j, max < 64 ? max : 64);
	for (int i = 0; i < n; i++) {
		cJSON *f = cJSON_GetObjectItem(j[i], field);
		out[i] = cJSON_IsNumber(f) ? f->valuedouble : 0;
		cJSON_Delete(j[i]);
	}
	return n;
}

/* Each metrics line's string field (NULL when absent), strdup'ed into
 * out (the caller frees). */
static int field_strings(const char *name, const char *field, char **out, int max)
{
	cJSON *j[64];
	int n = metrics_lines(name, j, max < 64 ? max : 64);
	for (int i = 0; i < n; i++) {
		cJSON *f = cJSON_GetObjectItem(j[i], field);
		out[i] = cJSON_IsString(f) ? strdup(f->valuestring) : NULL;
		cJSON_Delete(j[i]);
	}
	return n;
}

/* pipeline_update_ahead, one run of zbv on fsdp 2 x stage 2 (llama-tiny,
 * 5 steps) with clipping at thr and extra keys, against the same run
 * without the key: the losses bit for bit, and the leader (stage 0, whose
 * list ends early) reports for each step what the rule gives from the
 * key-off run's norms: after a step that clipped it waits for the sums;
 * else it updates ahead, and that update is redone when the step clips,
 * kept when not. With evaluations (eval: every 2 steps) each gives the
 * key-off run's held-out loss: it reads the parameters only after the
 * pending update is checked (trainer_settle). Returns the kinds seen
 * (1 waited, 2 redone, 4 kept) and in *redo_at the last step redone. */
static int update_ahead_run(double thr, bool eval, int *redo_at)
{
	char args[768], off[8][40], on[8][40], *how[8], *ev_on[8], *ev_off[8];
	double norm[8];
	snprintf(args, sizeof(args), ZBV_TINY "steps=5 gradient_clipping_threshold=%g %s --metrics %s/ua-off.jsonl", thr,
		 eval ? "eval_interval=2 eval_split_fraction=0.1 eval_steps=2" : "", tmpdir);
	show_log_on_failure(run(args), 0);
	char *m = strstr(args, " --metrics");
	snprintf(m, sizeof(args) - (size_t)(m - args), " pipeline_update_ahead=true --metrics %s/ua-on.jsonl", tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(loss_hexes("ua-off.jsonl", off, 8), 5);
	ck_assert_int_eq(loss_hexes("ua-on.jsonl", on, 8), 5);
	ck_assert_int_eq(field_values("ua-off.jsonl", "grad_norm", norm, 8), 5);
	ck_assert_int_eq(field_strings("ua-on.jsonl", "update_ahead", how, 8), 5);
	ck_assert_int_eq(field_strings("ua-on.jsonl", "eval_loss_hex", ev_on, 8), 5);
	ck_assert_int_eq(field_strings("ua-off.jsonl", "eval_loss_hex", ev_off, 8), 5);
	bool clipped = false;
	int seen = 0;
	*redo_at = -1;
	for (int s = 0; s < 5; s++) {
		const char *want = clipped ? "waited" : norm[s] > thr ? "redone" : "kept";
		ck_assert_msg(!strcmp(on[s], off[s]), "thr %g step %d: loss %s with the key, %s without", thr, s, on[s],
			      off[s]);
		ck_assert_msg(how[s] && !strcmp(how[s], want), "thr %g step %d (norm %g): update_ahead %s, want %s",
			      thr, s, norm[s], how[s] ? how[s] : "(none)", want);
		bool want_ev = eval && s % 2 == 1;
		ck_assert_msg(want_ev == (ev_on[s] != NULL) && (!ev_on[s] || (ev_off[s] && !strcmp(ev_on[s], ev_off[s]))),
			      "thr %g step %d: eval_loss_hex %s with the key, %s without", thr, s,
			      ev_on[s] ? ev_on[s] : "(none)", ev_off[s] ? ev_off[s] : "(none)");
		seen |= want[0] == 'w' ? 1 : want[0] == 'r' ? 2 : 4;
		*redo_at = want[0] == 'r' ? s : *redo_at;
		clipped = norm[s] > thr;
		free(how[s]);
		free(ev_on[s]);
		free(ev_off[s]);
	}
	return seen;
}

/* Two runs of update_ahead_run. Clipping at 3: step 0 clips, so its
 * update ahead is redone at step 1's gate (the table stopped, run again);
 * the run sees all three kinds. Clipping at 6 with evaluations after
 * steps 1 and 3: step 0's update is kept, step 1's is redone before the
 * evaluation that follows it reads the parameters. */
START_TEST(test_zbv_update_ahead)
{
	int redo_at;
	ck_assert_int_eq(update_ahead_run(3, false, &redo_at), 7);
	ck_assert_int_eq(redo_at, 0);
	int seen = update_ahead_run(6, true, &redo_at);
	ck_assert_msg(redo_at == 1 && (seen & 4), "clipping at 6: redone last at step %d, kinds %d", redo_at, seen);
}
END_TEST

/* Muon once per matrix: on hosts x dph devices its losses equal one
 * device's within 1e-6 relative at every step, and the Newton-Schulz
 * runs counted over every device (muon_ns_matrices) equal one device's:
 * the number of Muon matrices, not that times the devices sharing them. */
static void muon_once(const char *preset, int hosts, int dph, const char *extra)
{
	char args[1024];
	double one[4], mesh[4], ns1[4], ns[4], gf1[4], gf[4], gmax[4], gmin[4];
	const char *opt = "opt_type=muon learning_rate=0.01 steps=4";
	snprintf(args, sizeof(args), "train --config %s per_device_batch_size=8 %s --metrics %s/mu1.jsonl",
		 preset, opt, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local --hosts %d --devices-per-host %d --config %s per_device_batch_size=%d "
		 "%s %s --metrics %s/mu.jsonl", hosts, dph, preset, 8 / (hosts * dph), extra, opt, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("mu1.jsonl", one, 4), 4);
	ck_assert_int_eq(losses("mu.jsonl", mesh, 4), 4);
	ck_assert_int_eq(field_values("mu1.jsonl", "muon_ns_matrices", ns1, 4), 4);
	ck_assert_int_eq(field_values("mu.jsonl", "muon_ns_matrices", ns, 4), 4);
	ck_assert_int_eq(field_values("mu1.jsonl", "muon_ns_gflop", gf1, 4), 4);
	ck_assert_int_eq(field_values("mu.jsonl", "muon_ns_gflop", gf, 4), 4);
	ck_assert_int_eq(field_values("mu.jsonl", "muon_ns_gflop_max_device", gmax, 4), 4);
	ck_assert_int_eq(field_values("mu.jsonl", "muon_ns_gflop_min_device", gmin, 4), 4);
	double worst = 0;
	for (int s = 0; s < 4; s++) {
		double rel = fabs(mesh[s] - one[s]) / fabs(one[s]);
		worst = rel > worst ? rel : worst;
		ck_assert_msg(rel < 1e-6, "%s %s step %d: loss %.12g, one device %.12g", preset, extra, s, mesh[s],
			      one[s]);
		ck_assert_msg(ns1[s] > 0 && ns[s] == ns1[s], "%s %s step %d: %g Newton-Schulz runs over the mesh, "
			      "one device %g", preset, extra, s, ns[s], ns1[s]);
		/* the same flops (matrices x iterations), the busiest device a
		 * share of them: between the mean and the whole */
		ck_assert_msg(fabs(gf[s] - gf1[s]) <= 1e-9 * gf1[s] && gmax[s] >= gmin[s] &&
			      gmax[s] * hosts * dph >= gf[s] * (1 - 1e-9) && gmax[s] < gf[s],
			      "%s %s step %d: %g GFLOP of Newton-Schulz over the mesh (one device %g), a device "
			      "%g..%g", preset, extra, s, gf[s], gf1[s], gmin[s], gmax[s]);
	}
	fprintf(stderr, "muon %s %dx%d %s: %g matrices a step (%.3f GFLOP; a device %.3f..%.3f), worst relative "
		"loss difference %.2e\n", preset, hosts, dph, extra, ns1[0], gf1[0], gmin[0], gmax[0], worst);
}

START_TEST(test_muon_once_per_matrix)
{
	muon_once("configs/llama-tiny.yml", 1, 4, "ici_data_parallelism=1 ici_fsdp_parallelism=4");
	muon_once("configs/llama-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_tensor_parallelism=2");
	muon_once("configs/deepseek-tiny.yml", 1, 2, "ici_data_parallelism=1 ici_expert_parallelism=2");
	muon_once("configs/llama-tiny.yml", 1, 4, "ici_data_parallelism=2 ici_pipeline_parallelism=2");
	/* copies only: four data ranks share out the matrices */
	muon_once("configs/llama-tiny.yml", 2, 2, "");
}
END_TEST

START_TEST(test_unsupported_axis_refused)
{
	int rc = run("local --hosts 1 --devices-per-host 2 --config configs/llama-tiny.yml "
		     "ici_data_parallelism=1 ici_context_parallelism=2 steps=2");
	char *log = read_tmp("log.out");
	ck_assert_msg(rc == 3, "exit %d: %s", rc, log);
	ck_assert_msg(strstr(log, "'context' mesh axis") && strstr(log, "not implemented"), "%s", log);
	free(log);
	rc = run("local --hosts 2 --config configs/llama-tiny.yml "
		 "shard_optimizer_over_data=true opt_type=muon steps=2");
	log = read_tmp("log.out");
	ck_assert_msg(rc == 3 && strstr(log, "muon") && strstr(log, "over data"), "exit %d: %s", rc, log);
	free(log);
	rc = run("local --hosts 1 --devices-per-host 2 --config configs/llama-tiny.yml "
		 "ici_data_parallelism=1 ici_tensor_parallelism=2 base_num_kv_heads=1 steps=2");
	log = read_tmp("log.out");
	ck_assert_msg(rc == 3 && strstr(log, "tensor 'wk'") && strstr(log, "'base_num_kv_heads'") &&
		      strstr(log, "1 heads of 32") && strstr(log, "axes tensor"),
		      "exit %d: %s", rc, log);
	free(log);
	/* fsdp_layer_parts=true asks for two parts a layer: not with a
	 * pipeline (auto, the default, leaves a pipeline's layers whole) */
	rc = run("local --hosts 1 --devices-per-host 2 --config configs/llama-tiny.yml "
		 "ici_data_parallelism=1 ici_pipeline_parallelism=2 fsdp_layer_parts=true steps=2");
	log = read_tmp("log.out");
	ck_assert_msg(rc == 3 && strstr(log, "'fsdp_layer_parts' needs no pipeline") &&
		      strstr(log, "'ici_pipeline_parallelism'"),
		      "exit %d: %s", rc, log);
	free(log);
	rc = run("train --config configs/llama-tiny.yml dataset_path=/nonexistent/text steps=1");
	log = read_tmp("log.out");
	ck_assert_msg(rc == 4 && strstr(log, "/nonexistent/text"), "exit %d: %s", rc, log);
	free(log);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("train");
	TCase *tc = tcase_create("multihost");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_dp_equals_single_dense);
	tcase_add_test(tc, test_dp_equals_single_moe);
	tcase_add_test(tc, test_zero1_equals_single);
	tcase_add_test(tc, test_fsdp_equals_single);
	tcase_add_test(tc, test_dcn_fsdp_equals_single);
	tcase_add_test(tc, test_fsdp_with_data_equals_single);
	tcase_add_test(tc, test_tp_equals_single);
	tcase_add_test(tc, test_tp_moe_equals_single);
	tcase_add_test(tc, test_fsdp_tp_equals_single);
	tcase_add_test(tc, test_dcn_data_tp_equals_single);
	tcase_add_test(tc, test_ep_equals_single);
	tcase_add_test(tc, test_dcn_ep_equals_single);
	tcase_add_test(tc, test_ep_muon_equals_single);
	tcase_add_test(tc, test_ep_groups_equals_single);
	tcase_add_test(tc, test_dcn_ep_fsdp_equals_single);
	tcase_add_test(tc, test_shard_exp_on_fsdp_muon_equals_single);
	tcase_add_test(tc, test_tt_equals_single);
	tcase_add_test(tc, test_tt_fsdp_data_equals_single);
	tcase_add_test(tc, test_tp_muon_tied_equals_single);
	tcase_add_test(tc, test_tp_ep_tt_combinations_equal_single);
	tcase_add_test(tc, test_ep_zero1_fsdp_t_equals_single);
	tcase_add_test(tc, test_tt_resume_and_eval);
	tcase_add_test(tc, test_dp_resume_and_eval);
	tcase_add_test(tc, test_fsdp_resume_and_eval);
	tcase_add_test(tc, test_tp_resume_and_eval);
	tcase_add_test(tc, test_ep_tp_resume_and_eval);
	tcase_add_test(tc, test_unsupported_axis_refused);
	tcase_add_test(tc, test_trace);
	tcase_add_test(tc, test_small_buckets_equal_single);
	tcase_add_test(tc, test_bucket_starts_during_backward);
	tcase_add_test(tc, test_muon_once_per_matrix);
	suite_add_tcase(s, tc);
	/* ZeRO-1's reduce-scatters and gathers, FSDP's first gathers, under
	 * compute */
	TCase *zc = tcase_create("zero1_overlap");
	tcase_add_checked_fixture(zc, setup, teardown);
	tcase_set_timeout(zc, 120);
	tcase_add_test(zc, test_zero1_collectives_under_compute);
	tcase_add_test(zc, test_fsdp_first_gather_started_by_update);
	tcase_add_test(zc, test_fsdp_nonlayer_scatter_beside_layer0);
	tcase_add_test(zc, test_fsdp_layer_parts);
	tcase_add_test(zc, test_fsdp_projection_parts);
	tcase_add_test(zc, test_zbv_fsdp_parts);
	tcase_add_test(zc, test_zbv_fsdp_last_w_projection_parts);
	tcase_add_test(zc, test_zbv_fsdp_second_chunk_held);
	tcase_add_test(zc, test_zbv_stage_sums_before_last_w);
	tcase_add_test(zc, test_zbv_update_ahead);
	tcase_add_test(zc, test_zbv_fsdp_after_recv_first_chunk_held);
	tcase_add_test(zc, test_fsdp_first_gather_started_by_muon_update);
	tcase_add_test(zc, test_fsdp_first_gather_beside_zero1);
	suite_add_tcase(s, zc);
	SRunner *sr = srunner_create(s);
	/* no fork: the single-device baselines are cached across tests; the
	 * suite's own children are killed at run()'s deadline and at exit */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
