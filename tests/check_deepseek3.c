/* DeepSeek-V3's architecture (docs/deepseek.md) end to end, with real
 * agents on loopback:
 *
 * - equal to an independent implementation: `meshrun eval` of trained
 *   deepseek3-tiny checkpoints (q-LoRA and a plain q projection, YaRN on
 *   and off, a nonzero selection bias, group-limited routing that changes
 *   tokens' experts; two of them from their Hugging Face files alone, one
 *   in BF16) against tests/ref_deepseek3.py, a
 *   float64 numpy model written from Hugging Face's definitions that
 *   computes latent attention in its absorbed form and routes with a
 *   loop; and the reference must notice a wrong rotary pairing;
 * - equivalence: deepseek3-tiny on MaxText's three sharding setups (FSDP4,
 *   FSDP2+TP2, FSDP2+TPT2 on 2 hosts x 2 devices), expert parallelism 2
 *   and 4, shard-exp-on-fsdp, ZeRO-1, fsdp_transpose, a pipeline of 2
 *   stages with 2 repeats in its three weight modes, and Muon: 10 steps
 *   each, every loss within 1e-4 of one device's, two runs
 *   bit-identical;
 * - a checkpoint of FSDP2+TP2 resumes bit-identically and evaluates as
 *   one device's. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/equiv.h"

#define DS3 "configs/deepseek3-tiny.yml"
/* init_std 0.1: attention that matters (at 0.02 the scores are nearly
 * flat after a few steps and a wrong rotary pairing moves the loss by
 * 1e-6 only); a faster bias update: a selection bias far from zero */
#define REF_TRAIN "steps=8 learning_rate=0.001 init_std=0.1 routed_bias_update_rate=0.01"
#define REF_TEXT_BYTES 8000

static void setup(void)
{
	proc_setup("meshrun-deepseek3", 0);
}

/* tmpdir/text.txt: the first REF_TEXT_BYTES of the GPL (every Debian has it) */
static void write_text(void)
{
	char path[256];
	static char buf[REF_TEXT_BYTES];
	FILE *in = fopen("/usr/share/common-licenses/GPL-3", "rb");
	ck_assert_ptr_nonnull(in);
	size_t n = fread(buf, 1, sizeof(buf), in);
	fclose(in);
	ck_assert_int_eq(n, sizeof(buf));
	snprintf(path, sizeof(path), "%s/text.txt", tmpdir);
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(fwrite(buf, 1, n, out), n);
	fclose(out);
}

/* The number after `key` in tmpdir/name.out. */
static double value_after(const char *name, const char *key)
{
	char file[64];
	snprintf(file, sizeof(file), "%s.out", name);
	char *log = read_tmp(file);
	char *p = strstr(log, key);
	ck_assert_msg(p, "no '%s' in %s: %s", key, file, log);
	double v = strtod(p + strlen(key), NULL);
	free(log);
	return v;
}

/* The reference's loss of the checkpoint in tmpdir/<sub> on the text
 * (extra: an option of the script or NULL); *max_bias and *rerouted (the
 * tokens whose experts the group limit changed) when not NULL. */
static double ref_loss(const char *sub, const char *extra, double *max_bias, double *rerouted)
{
	char dir[256], text[256];
	struct proc p;
	snprintf(dir, sizeof(dir), "%s/%s", tmpdir, sub);
	snprintf(text, sizeof(text), "%s/text.txt", tmpdir);
	char *argv[] = { "/usr/bin/python3", "tests/ref_deepseek3.py", dir, text,
			 extra ? "--pairing" : NULL, (char *)extra, NULL };
	setenv("OPENBLAS_NUM_THREADS", "1", 1);
	proc_spawn(&p, "ref", argv, -1, true);
	int rc = proc_wait(&p, 120);
	if (rc != 0) {
		char *log = read_tmp("ref.out");
		fprintf(stderr, "%s\n", log);
		free(log);
	}
	ck_assert_int_eq(rc, 0);
	if (max_bias)
		*max_bias = value_after("ref", "max_abs_bias: ");
	if (rerouted)
		*rerouted = value_after("ref", "group_rerouted: ");
	return value_after("ref", "ref_eval_loss: ");
}

/* tmpdir/hf: the Hugging Face files of the step-8 checkpoint alone
 * (config.json, model.safetensors), as another trainer would ship them */
static void make_hf_dir(void)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/hf && cp %s/ckpt/step-000008/config.json "
		 "%s/ckpt/step-000008/model.safetensors %s/hf/", tmpdir, tmpdir, tmpdir, tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Trains deepseek3-tiny with `keys` for 8 steps into a checkpoint, and
 * compares meshrun eval's loss of it with the reference's; with hf, of
 * its Hugging Face files alone (config.json gives every model key; the
 * sequence length is the windows'). Returns the loss. */
static double against_reference(const char *keys, bool hf)
{
	char args[1024];
	struct proc p;
	double bias, rerouted;
	write_text();
	snprintf(args, sizeof(args), "train --config " DS3 " " REF_TRAIN " %s --quiet --checkpoint-dir %s/ckpt",
		 keys, tmpdir);
	show_log_on_failure(run(args), 0);
	if (hf) {
		make_hf_dir();
		snprintf(args, sizeof(args), "eval --checkpoint %s/hf --text %s/text.txt max_target_length=64",
			 tmpdir, tmpdir);
	} else {
		snprintf(args, sizeof(args), "eval --checkpoint %s/ckpt --text %s/text.txt", tmpdir, tmpdir);
	}
	ck_assert_int_eq(proc_run(&p, "eval", args, 120), 0);
	double ev = value_after("eval", "eval_loss: ");
	double ref = ref_loss(hf ? "hf" : "ckpt/step-000008", NULL, &bias, &rerouted);
	double rel = fabs(ev - ref) / ref;
	fprintf(stderr, "deepseek3-tiny %s%s: eval %.6f, reference %.9f (relative %.2e), |bias| <= %g, "
		"%.0f tokens rerouted by the group limit\n", keys, hf ? " (Hugging Face files)" : "", ev, ref,
		rel, bias, rerouted);
	ck_assert_msg(ev > 1.0 && ev < 8.0, "eval_loss %g", ev);
	ck_assert_msg(bias > 1e-3, "the selection bias stayed at %g", bias);
	ck_assert_msg(rerouted > 0, "group-limited routing changed no token's experts");
	/* meshrun prints 6 decimals: 2e-7 relative at these losses */
	ck_assert_msg(rel < 1e-5, "%s: meshrun eval %.6f, reference %.9f", keys, ev, ref);
	return ev;
}

/* q-LoRA with DeepSeek-V3's YaRN (cos/sin factor 1, scores x mscale^2) */
START_TEST(test_ref_qlora_yarn)
{
	double ev = against_reference("", true);
	/* Llama's pairing is another model: the reference must see it */
	double wrong = ref_loss("hf", "half", NULL, NULL);
	ck_assert_msg(fabs(wrong - ev) / ev > 1e-3, "the reference does not notice the rotary pairing "
		      "(%.6f vs %.6f)", wrong, ev);
}
END_TEST
/* a plain q projection, no YaRN, saved in BF16 and loaded from its
 * Hugging Face files */
START_TEST(test_ref_plain_default)
{
	against_reference("q_lora_rank=0 rope_type=default checkpoint_dtype=bf16", true);
}
END_TEST
/* a plain q projection with YaRN's other branch: mscale_all_dim unset,
 * so cos and sin carry mscale(f, 1) and the scores keep 1/sqrt(Dk);
 * another factor and original length move the ramp */
START_TEST(test_ref_plain_yarn)
{
	against_reference("q_lora_rank=0 rope_factor=8 original_max_position_embeddings=256 "
			  "beta_fast=16 mscale=0.707 mscale_all_dim=0", false);
}
END_TEST
/* q-LoRA without YaRN */
START_TEST(test_ref_qlora_default) { against_reference("rope_type=default", false); }
END_TEST
/* grouped-query attention (Llama's pairing) with YaRN on the same MoE
 * layers: the tables are shared, the score scale stays 1/sqrt(D) */
START_TEST(test_ref_gqa_yarn)
{
	against_reference("attention_type=global base_num_kv_heads=2 mscale=2 mscale_all_dim=1", false);
}
END_TEST

/* `meshrun shardings` and `meshrun schedule` size latent attention's
 * tensors by their own heads: wkv_b's 128 rows are 4 heads of 32 (no-rope
 * key and value), wo's 64 columns 4 heads of 16, split whole over tensor */
START_TEST(test_describe)
{
	struct proc p;
	const char *tp = "ici_data_parallelism=1 ici_tensor_parallelism=2";
	char args[512];
	snprintf(args, sizeof(args), "shardings --config " DS3 " --hosts 1 --devices-per-host 2 %s", tp);
	ck_assert_int_eq(proc_run(&p, "shardings", args, 60), 0);
	char *out = read_tmp("shardings.out");
	ck_assert_msg(strstr(out, "[6, 128, 16]     [6, 64, 16]") && strstr(out, "[6, 64, 64]      [6, 64, 32]") &&
		      strstr(out, "kv up projection    wkv_b    none           none            tensor") &&
		      strstr(out, "q_latent") && strstr(out, "model activations and backward scratch: "), "%s", out);
	free(out);
	snprintf(args, sizeof(args), "schedule --config " DS3 " %s ici_pipeline_parallelism=2 "
		 "num_pipeline_microbatches=4", tp);
	ck_assert_int_eq(proc_run(&p, "schedule", args, 60), 0);
	ck_assert(file_has(p.out, "v=2 chunks per stage"));
	/* 3 value heads do not split over 2 */
	snprintf(args, sizeof(args), "shardings --config " DS3 " --hosts 1 --devices-per-host 2 %s "
		 "base_num_query_heads=3 base_num_kv_heads=3", tp);
	ck_assert_int_eq(proc_run(&p, "shardings", args, 60), 3);
	ck_assert_msg(file_has(p.out, "3 heads of 24") && file_has(p.out, "'base_num_query_heads'"), "%s",
		      read_tmp("shardings.out"));
}
END_TEST

/* ---- equivalence with one device ---- */

static void equivalence(int hosts, int dph, const char *mesh)
{
	equivalence_opt(DS3, hosts, dph, mesh, "");
}

#define H2D2 "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_fsdp_parallelism=2 "

/* MaxText's table: FSDP4, FSDP2+TP2, FSDP2+TPT2 on 2 hosts x 2 devices */
START_TEST(test_fsdp4) { equivalence(2, 2, H2D2 "ici_fsdp_parallelism=2"); }
END_TEST
START_TEST(test_fsdp2_tp2) { equivalence(2, 2, H2D2 "ici_tensor_parallelism=2"); }
END_TEST
START_TEST(test_fsdp2_tpt2) { equivalence(2, 2, H2D2 "ici_tensor_transpose_parallelism=2"); }
END_TEST
/* experts over 2 devices of a host, and over 2 hosts x 2 devices */
START_TEST(test_ep)
{
	equivalence(1, 2, "ici_data_parallelism=1 ici_expert_parallelism=2");
	equivalence(2, 2, "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_expert_parallelism=2 "
		    "ici_expert_parallelism=2");
}
END_TEST
/* whole experts per device, their `exp` split over expert and fsdp */
START_TEST(test_shard_exp_on_fsdp)
{
	equivalence(1, 4, "ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_expert_parallelism=2 "
		    "custom_mesh_and_rule=shard-exp-on-fsdp");
}
END_TEST
/* data parallelism with the optimizer state split over data; and
 * fsdp_transpose (the latents' up-projections split on it too) */
START_TEST(test_zero1_fsdp_transpose)
{
	equivalence(2, 2, "shard_optimizer_over_data=true");
	equivalence(1, 2, "ici_data_parallelism=1 ici_fsdp_transpose_parallelism=2");
}
END_TEST
/* 2 stages, the 4 MoE layers pipelined with 2 repeats (the 2 dense ones
 * before, data-parallel over stage), beside fsdp: per iteration,
 * once a step, once a repeat */
#define PP2R2 "ici_data_parallelism=1 ici_pipeline_parallelism=2 ici_fsdp_parallelism=2 " \
	"num_pipeline_microbatches=4"
START_TEST(test_pp_weight_modes)
{
	equivalence(1, 4, PP2R2);
	equivalence(1, 4, PP2R2 " pipeline_fsdp_ag_once=true");
	equivalence(1, 4, PP2R2 " pipeline_fsdp_ag_per_repeat=true");
}
END_TEST
/* Muon on latent attention's matrices, split by fsdp and tensor */
START_TEST(test_muon)
{
	equivalence_opt(DS3, 2, 2, H2D2 "ici_tensor_parallelism=2", "opt_type=muon");
}
END_TEST

/* A checkpoint of FSDP2+TP2 (latent attention's tensors gathered whole
 * from fsdp and tensor) resumes bit-identically on the same mesh and
 * evaluates as the checkpoint of the same training on one device */
START_TEST(test_resume_and_eval)
{
	char args[1024];
	double straight[8], rest[8];
	struct proc p;
	const char *mesh = "--hosts 2 --devices-per-host 2 " H2D2 "ici_tensor_parallelism=2 per_device_batch_size=2";
	write_text();
	snprintf(args, sizeof(args), "local %s --config " DS3 " steps=8 learning_rate_schedule_steps=8 "
		 "--metrics %s/straight.jsonl", mesh, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config " DS3 " steps=4 learning_rate_schedule_steps=8 "
		 "--checkpoint-dir %s/ckpt", mesh, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local %s --config " DS3 " steps=8 learning_rate_schedule_steps=8 "
		 "--checkpoint-dir %s/ckpt --resume --metrics %s/rest.jsonl", mesh, tmpdir, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("straight.jsonl", straight, 8), 8);
	ck_assert_int_eq(losses("rest.jsonl", rest, 8), 4);
	for (int s = 0; s < 4; s++)
		ck_assert_msg(rest[s] == straight[4 + s], "resumed step %d: %a vs %a", 4 + s, rest[s],
			      straight[4 + s]);
	snprintf(args, sizeof(args), "train --config " DS3 " steps=8 learning_rate_schedule_steps=8 "
		 "per_device_batch_size=8 --checkpoint-dir %s/one", tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "eval --checkpoint %s/ckpt --text %s/text.txt", tmpdir, tmpdir);
	ck_assert_int_eq(proc_run(&p, "eval", args, 120), 0);
	double ev = value_after("eval", "eval_loss: ");
	snprintf(args, sizeof(args), "eval --checkpoint %s/one --text %s/text.txt", tmpdir, tmpdir);
	ck_assert_int_eq(proc_run(&p, "eval", args, 120), 0);
	double ev1 = value_after("eval", "eval_loss: ");
	ck_assert_msg(fabs(ev - ev1) < 1e-4 * ev1, "eval %.6f vs one device %.6f", ev, ev1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("deepseek3");
	TCase *tr = tcase_create("reference");
	tcase_add_checked_fixture(tr, setup, teardown);
	tcase_set_timeout(tr, 300);
	tcase_add_test(tr, test_ref_qlora_yarn);
	tcase_add_test(tr, test_ref_plain_default);
	tcase_add_test(tr, test_ref_plain_yarn);
	tcase_add_test(tr, test_ref_qlora_default);
	tcase_add_test(tr, test_ref_gqa_yarn);
	tcase_add_test(tr, test_describe);
	suite_add_tcase(s, tr);
	TCase *te = tcase_create("equivalence");
	tcase_add_checked_fixture(te, setup, teardown);
	tcase_set_timeout(te, 400);
	tcase_add_test(te, test_fsdp4);
	tcase_add_test(te, test_fsdp2_tp2);
	tcase_add_test(te, test_fsdp2_tpt2);
	tcase_add_test(te, test_ep);
	tcase_add_test(te, test_shard_exp_on_fsdp);
	tcase_add_test(te, test_zero1_fsdp_transpose);
	tcase_add_test(te, test_pp_weight_modes);
	tcase_add_test(te, test_muon);
	tcase_add_test(te, test_resume_and_eval);
	suite_add_tcase(s, te);
	SRunner *sr = srunner_create(s);
	/* no fork: the single-device baselines are cached across tests; the
	 * suite's own children are killed at their deadlines and at exit */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
