/* Whole-model checks on one device: gradients against finite differences
 * (dense and MoE, latent attention, the batch split), training on real text, checkpoint round trip and
 * bit-identical resume, refused bad checkpoints and impossible shapes. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "host/pipeline/exec.h"
#include "host/pipeline/pipe_config.h"
#include "host/train/train.h"
#include "kernels/kernels.h"
#include "tests/proc.h"

static char err[1024];

static void tiny_cfg(struct cfg *c, bool moe)
{
	cfg_defaults(c);
	ck_assert(cfg_override(c, "vocab_size=13", err, sizeof(err)) == 0);
	cfg_override(c, "base_emb_dim=16", err, sizeof(err));
	cfg_override(c, "base_num_query_heads=4", err, sizeof(err));
	cfg_override(c, "base_num_kv_heads=2", err, sizeof(err));
	cfg_override(c, "base_mlp_dim=12", err, sizeof(err));
	cfg_override(c, "base_num_decoder_layers=2", err, sizeof(err));
	cfg_override(c, "max_target_length=5", err, sizeof(err));
	cfg_override(c, "per_device_batch_size=2", err, sizeof(err));
	cfg_override(c, "init_std=0.3", err, sizeof(err));
	if (moe) {
		cfg_override(c, "num_experts=4", err, sizeof(err));
		cfg_override(c, "num_experts_per_tok=2", err, sizeof(err));
		cfg_override(c, "first_num_dense_layers=1", err, sizeof(err));
		cfg_override(c, "shared_experts=1", err, sizeof(err));
		cfg_override(c, "base_moe_mlp_dim=6", err, sizeof(err));
		cfg_override(c, "load_balance_loss_weight=0.1", err, sizeof(err));
	}
	ck_assert_msg(cfg_finish(c, 1, 1, err, sizeof(err)) == 0, "%s", err);
}

/* One step's forward and backward of model m on one device: the step
 * without a pipeline, a table of one stage run by the executor (as the
 * trainer runs it), made for m once. */
static struct pipe_exec *exec_of;
static struct model *exec_model;

static int forward_backward(struct model *m, const int32_t *in, const int32_t *tg, struct model_step *st)
{
	if (exec_model != m) {
		struct pipe_config pc;
		struct pipe_table t;
		int dev = 0;
		pipe_exec_free(exec_of);
		pipe_config_one_device(&pc, model_dims(m), 2);
		ck_assert_msg(pipe_table_build(&t, &pc.shape, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(pipe_exec_new(&exec_of, &t, 0, 0, &dev, m, 2, err, sizeof(err)) == 0, "%s", err);
		exec_model = m;
	}
	return pipe_exec_step(exec_of, in, tg, st, NULL);
}

static void forget_model(struct model *m)
{
	if (exec_model == m) {
		pipe_exec_free(exec_of);
		exec_of = NULL;
		exec_model = NULL;
	}
	model_free(m);
}

/* total loss = mean xent + lb_weight * aux, as trained */
/* Expert counts of the last forward, to notice a perturbation that changed
 * routing (top-k is not differentiable there; such points are skipped). */
static int32_t last_counts[64];

static double total_loss(struct model *m, const int32_t *in, const int32_t *tg, int ntok,
			 float lbw)
{
	size_t n = model_numel(m);
	float *gsave = malloc(n * sizeof(float));
	memcpy(gsave, model_grads(m), n * sizeof(float));
	struct model_step st = { .loss_scale = 1.0f / ntok, .lb_weight = lbw, .global_tokens = ntok };
	ck_assert_int_eq(forward_backward(m, in, tg, &st), 0);
	double s = st.loss_sum, aux = st.aux;
	memcpy(model_grads(m), gsave, n * sizeof(float));
	free(gsave);
	const struct model_dims *d = model_dims(m);
	if (d->L_moe)
		memcpy(last_counts, model_expert_counts(m), sizeof(int32_t) * d->L_moe * d->E);
	return s / ntok + lbw * aux;
}

static void grad_check_with(bool moe, const char *score, const char *const *extra)
{
	struct cfg c;
	struct model_dims d;
	tiny_cfg(&c, moe);
	for (; extra && *extra; extra++)
		ck_assert_msg(cfg_override(&c, *extra, err, sizeof(err)) == 0, "%s", err);
	if (score) {
		snprintf(c.routed_score_func, sizeof(c.routed_score_func), "%s", score);
		c.routed_bias = !strcmp(score, "sigmoid");
	}
	ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
	struct model *m = model_new(&d, 2, NULL, err, sizeof(err));
	ck_assert_msg(m != NULL, "%s", err);
	model_init(m, 7, 0.3f);
	int ntok = 2 * d.T;
	int32_t in[10], tg[10];
	unsigned r = 12345;
	for (int i = 0; i < ntok; i++) {
		r = r * 1103515245u + 12345u;
		in[i] = (int32_t)((r >> 16) % d.V);
		r = r * 1103515245u + 12345u;
		tg[i] = (int32_t)((r >> 16) % d.V);
	}
	float lbw = moe ? 0.1f : 0.0f;
	memset(model_grads(m), 0, model_numel(m) * sizeof(float));
	struct model_step st = { .loss_scale = 1.0f / ntok, .lb_weight = lbw, .global_tokens = ntok };
	ck_assert_int_eq(forward_backward(m, in, tg, &st), 0);
	float *P = model_params(m), *G = model_grads(m);
	int checked = 0, bad = 0, flips = 0;
	int32_t base_counts[64], cp[64];
	memcpy(base_counts, last_counts, sizeof(base_counts));
	if (moe)
		memcpy(base_counts, model_expert_counts(m), sizeof(int32_t) * d.L_moe * d.E);
	for (int t = 0; t < model_num_params(m); t++) {
		const struct param_info *p = model_param(m, t);
		if (p->opt == OPT_NONE)
			continue;
		/* a spread of elements of every tensor */
		for (size_t k = 0; k < 12 && k < p->numel; k++) {
			size_t i = p->offset + (k * 7919u) % p->numel;
			float save = P[i];
			const float h = 1e-2f;
			P[i] = save + h;
			double lp = total_loss(m, in, tg, ntok, lbw);
			memcpy(cp, last_counts, sizeof(cp));
			P[i] = save - h;
			double lm = total_loss(m, in, tg, ntok, lbw);
			P[i] = save;
			if (moe && (memcmp(cp, base_counts, sizeof(int32_t) * d.L_moe * d.E) ||
				    memcmp(last_counts, base_counts, sizeof(int32_t) * d.L_moe * d.E))) {
				flips++;
				continue;
			}
			double fd = (lp - lm) / (2 * h);
			double an = G[i];
			/* float forward: FD noise ~1e-6/h; curvature error O(h^2) */
			double tol = 2e-3 + 3e-2 * fabs(fd);
			if (fabs(fd - an) > tol) {
				bad++;
				fprintf(stderr, "grad %s[%zu]: analytic %.6g fd %.6g\n", p->name,
					i - p->offset, an, fd);
			}
			checked++;
		}
	}
	forget_model(m);
	ck_assert_msg(flips < checked / 10, "%d perturbations of %d changed routing", flips, checked);
	ck_assert_int_gt(checked, 100);
	ck_assert_msg(bad == 0, "%d of %d gradient elements differ from finite differences", bad, checked);
}

static void grad_check(bool moe, const char *score)
{
	grad_check_with(moe, score, NULL);
}

/* Latent attention: with q-LoRA and YaRN whose cos/sin factor and score
 * factor are both not 1 on the dense model; a plain q projection with the
 * default rotary on the MoE model */
#define MLA_DIMS "attention_type=mla", "base_num_kv_heads=4", "kv_lora_rank=5", \
	"qk_nope_head_dim=4", "qk_rope_head_dim=4", "v_head_dim=3"
START_TEST(test_grad_mla)
{
	const char *lora_yarn[] = { MLA_DIMS, "q_lora_rank=6", "rope_type=yarn", "rope_factor=4",
				    "original_max_position_embeddings=16", "beta_fast=2", "mscale=0.8",
				    "mscale_all_dim=0.5", NULL };
	const char *plain[] = { MLA_DIMS, "q_lora_rank=0", NULL };
	grad_check_with(false, NULL, lora_yarn);
	grad_check_with(true, "sigmoid", plain);
}
END_TEST

START_TEST(test_grad_dense) { grad_check(false, NULL); }
END_TEST
START_TEST(test_grad_moe_softmax) { grad_check(true, "softmax"); }
END_TEST
START_TEST(test_grad_moe_sigmoid) { grad_check(true, "sigmoid"); }
END_TEST
/* DeepSeek-V3's router: 2 groups of 2 experts, one group competes */
START_TEST(test_grad_moe_groups)
{
	const char *groups[] = { "n_routing_groups=2", "topk_routing_group=1", "routed_scaling_factor=2.5", NULL };
	grad_check_with(true, "sigmoid", groups);
}
END_TEST

/* The batch split (host/model/bsplit.c): two halves of one row each,
 * staggered through two MoE layers (the second half's combine of the
 * first finishes in the second), one dense layer before them */
START_TEST(test_grad_batch_split)
{
	const char *split[] = { "use_batch_split_schedule=true", "batch_split_factor=2",
				"base_num_decoder_layers=3", NULL };
	grad_check_with(true, "sigmoid", split);
}
END_TEST

/* A model that does not fit in memory is an out-of-memory error naming
 * the bytes asked for, not a config error. */
START_TEST(test_model_out_of_memory)
{
	struct cfg c;
	struct model_dims d;
	struct model *m = (struct model *)&c;
	tiny_cfg(&c, false);
	cfg_override(&c, "vocab_size=16777216", err, sizeof(err));
	cfg_override(&c, "base_emb_dim=65536", err, sizeof(err));
	ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(model_open(&m, &d, 2, NULL, err, sizeof(err)), -ENOMEM);
	ck_assert_ptr_null(m);
	/* two 2^24 x 2^16 tables (embedding, output) in floats, twice */
	ck_assert_msg(strstr(err, "model: out of memory: ") && strstr(err, "bytes asked for (parameters and gradients 8"),
		      "%s", err);
}
END_TEST

/* A wrong gradient must be caught: corrupt one parameter's gradient path by
 * checking against a shifted copy (guards the checker itself). */
START_TEST(test_grad_checker_detects)
{
	struct cfg c;
	struct model_dims d;
	tiny_cfg(&c, false);
	model_dims_from_cfg(&d, &c, err, sizeof(err));
	struct model *m = model_new(&d, 2, NULL, err, sizeof(err));
	model_init(m, 7, 0.3f);
	int32_t in[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, tg[10] = { 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 };
	memset(model_grads(m), 0, model_numel(m) * sizeof(float));
	struct model_step st = { .loss_scale = 0.1f, .global_tokens = 10 };
	ck_assert_int_eq(forward_backward(m, in, tg, &st), 0);
	const struct param_info *p = model_param_by_name(m, "wo");
	size_t i = p->offset + 3;
	float *P = model_params(m);
	float save = P[i];
	P[i] = save + 1e-2f;
	double lp = total_loss(m, in, tg, 10, 0);
	P[i] = save - 1e-2f;
	double lm = total_loss(m, in, tg, 10, 0);
	P[i] = save;
	double fd = (lp - lm) / 2e-2;
	ck_assert(fabs(fd) > 1e-4);
	ck_assert(fabs(fd - model_grads(m)[i]) < 2e-3 + 3e-2 * fabs(fd));
	ck_assert(fabs(fd - 1.5 * model_grads(m)[i]) > 2e-3 + 3e-2 * fabs(fd));
	forget_model(m);
}
END_TEST

static struct trainer *make_trainer(const char *preset, const char *const *over)
{
	struct cfg c;
	cfg_defaults(&c);
	ck_assert_msg(cfg_load_file(&c, preset, err, sizeof(err)) == 0, "%s", err);
	for (; over && *over; over++)
		ck_assert_msg(cfg_override(&c, *over, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(cfg_finish(&c, 1, 1, err, sizeof(err)) == 0, "%s", err);
	struct trainer *t = trainer_new(&c, (int)c.per_device_batch_size, NULL, err, sizeof(err));
	ck_assert_msg(t != NULL, "%s", err);
	return t;
}

static double train_steps(struct trainer *t, int from, int to, double *losses)
{
	struct step_stats st = { 0 };
	const struct cfg *c = trainer_cfg(t);
	for (int s = from; s < to; s++) {
		ck_assert(trainer_step(t, s, (int)c->per_device_batch_size, 0, NULL, &st,
				       err, sizeof(err)) == 0);
		if (losses)
			losses[s] = st.loss;
	}
	return st.loss;
}

START_TEST(test_llama_tiny_learns_text)
{
	const char *over[] = { "steps=60", NULL };
	struct trainer *t = make_trainer("configs/llama-tiny.yml", over);
	double losses[60];
	train_steps(t, 0, 60, losses);
	fprintf(stderr, "llama-tiny on GPL-3: loss %.4f -> %.4f\n", losses[0], losses[59]);
	ck_assert(fabs(losses[0] - log(256.0)) < 0.3);  /* starts near uniform */
	ck_assert_msg(losses[59] < 3.0, "loss %.4f not well below ln(256)", losses[59]);
	trainer_free(t);
}
END_TEST

START_TEST(test_deepseek_tiny_learns_text)
{
	const char *over[] = { "steps=60", NULL };
	struct trainer *t = make_trainer("configs/deepseek-tiny.yml", over);
	double losses[60];
	train_steps(t, 0, 60, losses);
	fprintf(stderr, "deepseek-tiny on GPL-3: loss %.4f -> %.4f\n", losses[0], losses[59]);
	ck_assert_msg(losses[59] < 3.2, "loss %.4f", losses[59]);
	trainer_free(t);
}
END_TEST

START_TEST(test_muon_trains)
{
	const char *over[] = { "steps=40", "opt_type=muon", "learning_rate=0.02", NULL };
	struct trainer *t = make_trainer("configs/llama-tiny.yml", over);
	double losses[40];
	train_steps(t, 0, 40, losses);
	fprintf(stderr, "llama-tiny muon: loss %.4f -> %.4f\n", losses[0], losses[39]);
	ck_assert_msg(losses[39] < losses[0] - 1.5, "muon did not learn: %.4f -> %.4f", losses[0], losses[39]);
	trainer_free(t);
}
END_TEST

static void resume_case(const char *preset, const char *opt)
{
	char dir[] = "/tmp/meshrun-ckpt-XXXXXX";
	ck_assert(mkdtemp(dir));
	const char *over[] = { "steps=8", opt, NULL };
	double straight[8], resumed[8];
	struct trainer *a = make_trainer(preset, over);
	train_steps(a, 0, 8, straight);
	trainer_free(a);

	struct trainer *b = make_trainer(preset, over);
	train_steps(b, 0, 4, resumed);
	ck_assert_msg(trainer_save(b, dir, 4, err, sizeof(err)) == 0, "%s", err);
	struct trainer *c = make_trainer(preset, over);
	int64_t next = -1;
	ck_assert_msg(trainer_load(c, dir, &next, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(next, 4);
	/* save -> load gives identical tensors and optimizer state */
	struct model *mb = trainer_model(b), *mc = trainer_model(c);
	size_t n = model_numel(mb);
	ck_assert(memcmp(model_params(mb), model_params(mc), n * sizeof(float)) == 0);
	ck_assert(memcmp(trainer_ckpt_m(b), trainer_ckpt_m(c), n * sizeof(float)) == 0);
	ck_assert(memcmp(trainer_ckpt_v(b), trainer_ckpt_v(c), n * sizeof(float)) == 0);
	train_steps(c, 4, 8, resumed);
	for (int s = 0; s < 8; s++)
		ck_assert_msg(straight[s] == resumed[s], "step %d: %.17g vs %.17g", s, straight[s], resumed[s]);
	trainer_free(b);

	/* a truncated model file is refused, naming the file */
	char path[256];
	snprintf(path, sizeof(path), "%s/step-000004/model.safetensors", dir);
	ck_assert(truncate(path, 1000) == 0);
	ck_assert_int_ne(trainer_load(c, dir, &next, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "model.safetensors"), "%s", err);
	trainer_free(c);
	ck_assert_int_eq(rm_rf(dir), 0);
}

START_TEST(test_resume_bit_identical_dense) { resume_case("configs/llama-tiny.yml", "opt_type=adamw"); }
END_TEST
START_TEST(test_resume_bit_identical_moe_muon) { resume_case("configs/deepseek-tiny.yml", "opt_type=muon"); }
END_TEST

START_TEST(test_impossible_shapes)
{
	struct cfg c;
	struct model_dims d;
	cfg_defaults(&c);
	cfg_override(&c, "base_emb_dim=100", err, sizeof(err));
	cfg_override(&c, "base_num_query_heads=3", err, sizeof(err));
	cfg_override(&c, "base_num_kv_heads=1", err, sizeof(err));
	ck_assert_int_ne(model_dims_from_cfg(&d, &c, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'base_num_query_heads'") && strstr(err, "'base_emb_dim'"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "base_num_kv_heads=3", err, sizeof(err));
	ck_assert_int_ne(model_dims_from_cfg(&d, &c, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'base_num_kv_heads'"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "num_experts=4", err, sizeof(err));
	cfg_override(&c, "num_experts_per_tok=5", err, sizeof(err));
	ck_assert_int_ne(model_dims_from_cfg(&d, &c, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'num_experts_per_tok'"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "routed_score_func=relu", err, sizeof(err));
	cfg_override(&c, "num_experts=4", err, sizeof(err));
	ck_assert_int_ne(model_dims_from_cfg(&d, &c, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "relu"), "%s", err);
}
END_TEST

int main(void)
{
	blas_set_threads(1);
	Suite *s = suite_create("model");
	TCase *tc = tcase_create("gradients");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_grad_dense);
	tcase_add_test(tc, test_grad_moe_softmax);
	tcase_add_test(tc, test_grad_moe_sigmoid);
	tcase_add_test(tc, test_grad_mla);
	tcase_add_test(tc, test_grad_moe_groups);
	tcase_add_test(tc, test_grad_batch_split);
	tcase_add_test(tc, test_model_out_of_memory);
	tcase_add_test(tc, test_grad_checker_detects);
	tcase_add_test(tc, test_impossible_shapes);
	suite_add_tcase(s, tc);
	tc = tcase_create("training");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_llama_tiny_learns_text);
	tcase_add_test(tc, test_deepseek_tiny_learns_text);
	tcase_add_test(tc, test_muon_trains);
	suite_add_tcase(s, tc);
	tc = tcase_create("checkpoint");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_resume_bit_identical_dense);
	tcase_add_test(tc, test_resume_bit_identical_moe_muon);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
