/* The split backward (host/model/wgrad.c, model_layers_backward_input
 * and _weight): a layer's backward run as I (input gradients) and W
 * (weight gradients from the stash) gives the full backward's
 * gradients bit for bit, both right after each other and with two
 * microbatches' I before their W, for dense and MoE layers, grouped-query
 * and latent attention; on one device and on in-process meshes (each
 * device a thread, collectives through a barrier) under tensor, expert,
 * FSDP and tensor-transpose splits, where I runs every collective. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/model/window.h"

static char err[1024];

#define MAXD 4
#define NMB 2

/* ---- in-process devices, SPMD collectives through a barrier ---- */

struct world {
	int n;
	const struct mesh *mesh;
	pthread_barrier_t bar;
	const void *in[MAXD];
	const size_t *sb[MAXD];
};

struct dev {
	struct world *w;
	int me;
	struct model *m;
	struct model_comm comm;
	struct mesh_group g;
};

static struct mesh_group *group(struct dev *d, uint32_t axes)
{
	mesh_group(d->w->mesh, d->me, axes, &d->g);
	return &d->g;
}

static void post(struct dev *d, const void *in, const size_t *sb)
{
	d->w->in[d->me] = in;
	d->w->sb[d->me] = sb;
	pthread_barrier_wait(&d->w->bar);
}

/* sums in rank order, the same on every member */
static int h_all_reduce(void *ctx, uint32_t axes, float *buf, size_t n)
{
	struct dev *d = ctx;
	struct mesh_group *g = group(d, axes);
	float *s = calloc(n ? n : 1, sizeof(float));
	post(d, buf, NULL);
	for (int r = 0; r < g->n; r++) {
		const float *x = d->w->in[g->devs[r]];
		for (size_t i = 0; i < n; i++)
			s[i] += x[i];
	}
	pthread_barrier_wait(&d->w->bar);
	memcpy(buf, s, n * sizeof(float));
	free(s);
	return 0;
}

static int h_all_gather(void *ctx, uint32_t axes, void *out, const void *in, size_t bytes)
{
	struct dev *d = ctx;
	struct mesh_group *g = group(d, axes);
	post(d, in, NULL);
	for (int r = 0; r < g->n; r++)
		memcpy((char *)out + (size_t)r * bytes, d->w->in[g->devs[r]], bytes);
	pthread_barrier_wait(&d->w->bar);
	return 0;
}

static int h_reduce_scatter(void *ctx, uint32_t axes, float *out, const float *in, size_t n)
{
	struct dev *d = ctx;
	struct mesh_group *g = group(d, axes);
	post(d, in, NULL);
	for (size_t i = 0; i < n; i++) {
		float s = 0;
		for (int r = 0; r < g->n; r++)
			s += ((const float *)d->w->in[g->devs[r]])[(size_t)g->rank * n + i];
		out[i] = s;
	}
	pthread_barrier_wait(&d->w->bar);
	return 0;
}

static int h_all_to_all(void *ctx, uint32_t axes, void *out, const size_t *recv_bytes, const void *in,
			const size_t *send_bytes)
{
	struct dev *d = ctx;
	struct mesh_group *g = group(d, axes);
	size_t at = 0;
	post(d, in, send_bytes);
	for (int r = 0; r < g->n; r++) {
		int src = g->devs[r];
		size_t off = 0;
		for (int k = 0; k < g->rank; k++)
			off += d->w->sb[src][k];
		ck_assert_uint_eq(d->w->sb[src][g->rank], recv_bytes[r]);
		memcpy((char *)out + at, (const char *)d->w->in[src] + off, recv_bytes[r]);
		at += recv_bytes[r];
	}
	pthread_barrier_wait(&d->w->bar);
	return 0;
}

/* ---- configs ---- */

#define TINY "vocab_size=16", "base_emb_dim=16", "base_num_query_heads=4", "base_num_kv_heads=2", \
	"base_mlp_dim=12", "base_num_decoder_layers=3", "max_target_length=5", "init_std=0.3"
#define MOE "num_experts=4", "num_experts_per_tok=2", "first_num_dense_layers=1", "shared_experts=1", \
	"base_moe_mlp_dim=6", "load_balance_loss_weight=0.1", "routed_score_func=sigmoid", "routed_bias=true"
#define MLA "attention_type=mla", "base_num_kv_heads=4", "kv_lora_rank=6", "qk_nope_head_dim=4", \
	"qk_rope_head_dim=4", "v_head_dim=3"

static void make_cfg(struct cfg *c, const char *const *kv, int devices)
{
	cfg_defaults(c);
	for (; *kv; kv++)
		ck_assert_msg(cfg_override(c, *kv, err, sizeof(err)) == 0, "%s: %s", *kv, err);
	ck_assert_msg(cfg_finish(c, 1, devices, err, sizeof(err)) == 0, "%s", err);
}

/* ---- one step, driven here ---- */

enum mode {
	M_B,       /* full backward */
	M_IW,      /* I then W, right after each other */
	M_IIWW,    /* every microbatch's I, then their W (stash mb) */
	M_IIWW_LOSE_W /* the same with microbatch 1's W left out: must differ */
};

struct run {
	enum mode mode;
	double loss, aux;
	bool layer_grads_zero_after_i; /* no layer gradient before any W */
};

/* Microbatch mb's tokens of this device's rows. */
static void tokens(const struct model *m, const struct mesh *ms, int dev, int mb, int B, int T, int V,
		   int32_t *in, int32_t *tg)
{
	int r0 = 0;
	if (ms) {
		static __thread struct mesh_group g;
		mesh_group(ms, dev, model_rows_axes(m), &g);
		r0 = g.rank * B;
	}
	for (int i = 0; i < B * T; i++) {
		unsigned h = (unsigned)(mb * 7919 + (r0 * T + i) * 104729 + 17);
		h ^= h >> 13;
		h *= 0x5bd1e995u;
		h ^= h >> 15;
		in[i] = (int32_t)(h % (unsigned)V);
		tg[i] = (int32_t)((h >> 8) % (unsigned)V);
	}
}

/* Layer slot 1 holds layer l during a call (nothing is gathered on one
 * device: the window then does nothing). */
static void use_layer(struct model *m, int l)
{
	win_gather_start(model_window(m), 1, l, l + 1);
	win_wait(model_window(m), 1);
}

static void done_layer(struct model *m, bool grads)
{
	if (grads)
		win_scatter_start(model_window(m), 1);
	win_release(model_window(m), 1);
}

static void backward_call(struct model *m, enum mode mode, int mb, int l0, int l1, float *g, const float *x,
			  bool weights)
{
	if (mode == M_B) {
		ck_assert_int_eq(model_layers_backward(m, l0, l1, g, x), 0);
		return;
	}
	model_w_stash(m, mode == M_IW ? 0 : mb);
	model_act_set(m, mb);
	if (!weights)
		ck_assert_int_eq(model_layers_backward_input(m, l0, l1, g, g, x), 0);
	else
		ck_assert_int_eq(model_layers_backward_weight(m, l0, l1, g, x), 0);
}

/* Every layer's backward of microbatch mb: B, I, or W (weights). */
static void backward(struct model *m, struct run *r, int mb, float **xs, float *g, bool weights)
{
	int L = model_dims(m)->L;
	bool grads = r->mode == M_B || weights;
	for (int l = L - 1; l >= 0; l--) {
		use_layer(m, l);
		if (grads)
			win_zero_grads(model_window(m), 1);
		backward_call(m, r->mode, mb, l, l + 1, g, xs[l], weights);
		done_layer(m, grads);
	}
}

static bool layer_grads_zero(struct model *m)
{
	const float *G = model_grads(m);
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		for (size_t k = 0; p->stacked && k < p->numel; k++)
			if (G[p->offset + k] != 0.0f)
				return false;
	}
	return true;
}

/* One step of NMB microbatches on device dev (ms NULL: one device). */
static void step(struct model *m, const struct model_comm *comm, const struct mesh *ms, int dev, struct run *r)
{
	const struct model_dims *d = model_dims(m);
	int N = 2 * d->T, C = d->C, L = d->L; /* C: at least this device's part */
	float *xs[NMB][8], *g[NMB];
	int32_t in[NMB][64], tg[NMB][64];
	struct win *w = model_window(m);
	struct model_step st = { .loss_scale = 1.0f / 64, .lb_weight = 0.1f, .global_tokens = 64, .comm = comm };

	memset(model_grads(m), 0, model_numel(m) * sizeof(float));
	model_step_begin(m, &st);
	win_gather_start(w, 0, WIN_NONLAYER, 0);
	win_wait(w, 0);
	win_zero_grads(w, 0);
	for (int mb = 0; mb < NMB; mb++) {
		g[mb] = calloc((size_t)N * C, sizeof(float));
		for (int l = 0; l <= L; l++)
			xs[mb][l] = calloc((size_t)N * C, sizeof(float));
		tokens(m, ms, dev, mb, 2, d->T, d->V, in[mb], tg[mb]);
		model_act_set(m, mb);  /* each microbatch's activations kept to its W */
		double loss = 0;
		ck_assert_int_eq(model_embed_forward(m, xs[mb][0], in[mb]), 0);
		for (int l = 0; l < L; l++) {
			use_layer(m, l);
			ck_assert_int_eq(model_layers_forward(m, l, l + 1, xs[mb][l + 1], xs[mb][l]), 0);
			done_layer(m, false);
		}
		if (d->L_moe)
			ck_assert_int_eq(model_sum_counts(m, model_rows_axes(m)), 0);
		ck_assert_int_eq(model_head_forward(m, &loss, xs[mb][L], tg[mb]), 0);
		ck_assert_int_eq(model_head_backward(m, g[mb], xs[mb][L], tg[mb]), 0);
		r->loss += loss;
		backward(m, r, mb, xs[mb], g[mb], false);
		if (r->mode == M_IW)
			backward(m, r, mb, xs[mb], g[mb], true);
		ck_assert_int_eq(model_embed_backward(m, g[mb], in[mb]), 0);
	}
	if (r->mode == M_IIWW || r->mode == M_IIWW_LOSE_W) {
		/* no layer gradient has reached the storage before the W (the
		 * window's only leave by the reduce-scatters after them) */
		r->layer_grads_zero_after_i = layer_grads_zero(m);
		for (int mb = 0; mb < NMB; mb++)
			if (mb == 0 || r->mode == M_IIWW)
				backward(m, r, mb, xs[mb], g[mb], true);
	}
	win_scatter_start(w, 0);
	win_scatter_finish(w);
	win_release(w, 0);
	ck_assert_int_eq(model_step_end(m), 0);
	r->aux = st.aux;
	for (int mb = 0; mb < NMB; mb++) {
		free(g[mb]);
		for (int l = 0; l <= L; l++)
			free(xs[mb][l]);
	}
}

/* Runs mode on m and returns a copy of its gradients. */
static float *grads_of(struct model *m, const struct model_comm *comm, const struct mesh *ms, int dev,
		       struct run *r)
{
	step(m, comm, ms, dev, r);
	float *c = malloc(model_numel(m) * sizeof(float));
	memcpy(c, model_grads(m), model_numel(m) * sizeof(float));
	return c;
}

/* Every mode against B on model m; results into the device's report. */
struct report {
	bool iw_same, iiww_same, lose_differs, zero_after_i, grads_nonzero;
	double worst_iiww;   /* largest |difference| relative to B's largest gradient */
};

static void compare(struct model *m, const struct model_comm *comm, const struct mesh *ms, int dev,
		    struct report *rep)
{
	size_t n = model_numel(m);
	struct run rb = { .mode = M_B }, riw = { .mode = M_IW }, rii = { .mode = M_IIWW }, rlose = { .mode = M_IIWW_LOSE_W };
	float *gb = grads_of(m, comm, ms, dev, &rb), *giw = grads_of(m, comm, ms, dev, &riw);
	float *gii = grads_of(m, comm, ms, dev, &rii), *glose = grads_of(m, comm, ms, dev, &rlose);
	double big = 0, worst = 0;
	for (size_t i = 0; i < n; i++) {
		big = fmax(big, fabs(gb[i]));
		worst = fmax(worst, fabs((double)gii[i] - gb[i]));
	}
	rep->grads_nonzero = big > 0;
	rep->iw_same = !memcmp(gb, giw, n * sizeof(float)) && rb.loss == riw.loss && rb.aux == riw.aux;
	rep->iiww_same = !memcmp(gb, gii, n * sizeof(float)) && rb.loss == rii.loss && rb.aux == rii.aux;
	rep->lose_differs = memcmp(gb, glose, n * sizeof(float)) != 0;
	rep->zero_after_i = rii.layer_grads_zero_after_i;
	rep->worst_iiww = big > 0 ? worst / big : 1;
	free(gii);
	free(gb);
	free(giw);
	free(glose);
}

static void check_report(const struct report *r, const char *what)
{
	ck_assert_msg(r->grads_nonzero, "%s: no gradients", what);
	ck_assert_msg(r->iw_same, "%s: I then W differs from B", what);
	ck_assert_msg(r->iiww_same, "%s: I(mb0) I(mb1) W(mb0) W(mb1) differs from B(mb0) B(mb1) (worst %.3g)",
		      what, r->worst_iiww);
	ck_assert_msg(r->lose_differs, "%s: leaving a W out changes nothing", what);
	ck_assert_msg(r->zero_after_i, "%s: an input backward wrote a layer's weight gradient", what);
}

/* ---- one device ---- */

/* Weights' inputs copied into the stash, and read in place (each
 * microbatch's activations in a set of their own until its W). A model
 * without a pipeline runs one layer a call. */
static void one_device(const char *const *kv, const char *what)
{
	struct cfg c;
	struct model_dims d;
	make_cfg(&c, kv, 1);
	ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
	for (int in_place = 0; in_place < 2; in_place++) {
		struct model_mesh mm = { .pipe_act_sets = NMB, .pipe_w_stashes = NMB, .pipe_w_reads_acts = in_place };
		struct model *m = model_new(&d, 2, &mm, err, sizeof(err));
		ck_assert_msg(m, "%s", err);
		ck_assert_int_eq(model_w_stashes(m), NMB);
		model_init(m, 11, 0.3f);
		struct report rep;
		char name[160];
		compare(m, NULL, NULL, 0, &rep);
		snprintf(name, sizeof(name), "%s%s", what, in_place ? ", W reading the activations" : "");
		check_report(&rep, name);
		model_free(m);
	}
}

START_TEST(test_dense_gqa)
{
	const char *kv[] = { TINY, NULL };
	one_device(kv, "dense, grouped-query");
}
END_TEST

START_TEST(test_moe_gqa)
{
	const char *kv[] = { TINY, MOE, NULL };
	one_device(kv, "moe, grouped-query");
}
END_TEST

START_TEST(test_dense_mla)
{
	const char *kv[] = { TINY, MLA, "q_lora_rank=5", "rope_type=yarn", "rope_factor=4",
			     "original_max_position_embeddings=16", NULL };
	one_device(kv, "dense, latent with q-lora and yarn");
}
END_TEST

START_TEST(test_moe_mla)
{
	const char *kv[] = { TINY, MOE, MLA, "q_lora_rank=0", "n_routing_groups=2", "topk_routing_group=1", NULL };
	one_device(kv, "moe with groups, latent without q-lora");
}
END_TEST

/* The stashes' bytes: each the same, and smaller when W reads the
 * activations in place (no copies of the weights' inputs). */
START_TEST(test_stash_bytes)
{
	struct cfg c;
	struct model_dims d;
	const char *kv[] = { TINY, MOE, NULL };
	make_cfg(&c, kv, 1);
	ck_assert(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0);
	size_t bytes[4];
	for (int k = 0; k < 4; k++) {
		struct model_mesh mm = { .pipe_w_stashes = k < 3 ? k : 1, .pipe_w_reads_acts = k == 3 };
		struct model *p = model_plan_new(&d, &mm, err, sizeof(err));
		ck_assert_msg(p, "%s", err);
		bytes[k] = model_activation_bytes(p, 2);
		model_free(p);
	}
	ck_assert_uint_gt(bytes[1], bytes[0]);
	ck_assert_uint_eq(bytes[2] - bytes[1], bytes[1] - bytes[0]);
	ck_assert_uint_gt(bytes[3], bytes[0]);
	ck_assert_uint_lt(bytes[3] - bytes[0], (bytes[1] - bytes[0]) * 3 / 4);
}
END_TEST

/* ---- meshes in one process ---- */

struct mesh_case {
	const char *what;
	const char *kv[40];
	int devices;
	bool in_place;   /* W reads the activations in place */
};

static struct world world;
static struct dev devs[MAXD];
static struct report reps[MAXD];
static struct mesh mesh;

static void *dev_main(void *arg)
{
	struct dev *d = arg;
	compare(d->m, &d->comm, d->w->mesh, d->me, &reps[d->me]);
	return NULL;
}

static void on_mesh(const struct mesh_case *mc)
{
	struct cfg c;
	struct model_dims d;
	struct shard_rules rules;
	make_cfg(&c, mc->kv, mc->devices);
	ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(shard_rules_from_cfg(&rules, &c, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&mesh, &c);
	ck_assert_int_eq(mesh.num_devices, mc->devices);
	world = (struct world){ .n = mc->devices, .mesh = &mesh };
	pthread_barrier_init(&world.bar, NULL, (unsigned)mc->devices);
	for (int i = 0; i < mc->devices; i++) {
		struct model_mesh mm = { .mesh = &mesh, .rules = &rules, .device = i, .pipe_act_sets = NMB,
					 .pipe_w_stashes = NMB, .pipe_w_reads_acts = mc->in_place };
		devs[i] = (struct dev){ .w = &world, .me = i };
		devs[i].m = model_new(&d, 2, &mm, err, sizeof(err));
		ck_assert_msg(devs[i].m, "%s: %s", mc->what, err);
		model_init(devs[i].m, 11, 0.3f);
		devs[i].comm = (struct model_comm){ .all_reduce = h_all_reduce, .all_gather = h_all_gather,
						    .reduce_scatter = h_reduce_scatter, .all_to_all = h_all_to_all,
						    .ctx = &devs[i] };
	}
	pthread_t th[MAXD];
	for (int i = 0; i < mc->devices; i++)
		pthread_create(&th[i], NULL, dev_main, &devs[i]);
	for (int i = 0; i < mc->devices; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < mc->devices; i++) {
		char name[160];
		snprintf(name, sizeof(name), "%s, device %d", mc->what, i);
		check_report(&reps[i], name);
		model_free(devs[i].m);
	}
	pthread_barrier_destroy(&world.bar);
}

#define ON(...) "ici_data_parallelism=1", __VA_ARGS__

static const struct mesh_case cases[] = {
	{ "tensor=2, dense grouped-query", { TINY, ON("ici_tensor_parallelism=2"), NULL }, 2, false },
	{ "fsdp=2, dense grouped-query", { TINY, ON("ici_fsdp_parallelism=2"), NULL }, 2, false },
	{ "expert=2, moe latent", { TINY, MOE, MLA, "q_lora_rank=6", ON("ici_expert_parallelism=2"), NULL }, 2, false },
	{ "tensor_transpose=2, moe grouped-query",
	  { TINY, MOE, ON("ici_tensor_transpose_parallelism=2"), NULL }, 2, false },
	{ "fsdp=2 x tensor=2, moe latent",
	  { TINY, MOE, MLA, "q_lora_rank=6", ON("ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"), NULL }, 4, false },
	{ "expert=2 x tensor=2, moe grouped-query",
	  { TINY, MOE, ON("ici_expert_parallelism=2", "ici_tensor_parallelism=2"), NULL }, 4, false },
	{ "expert=2 x fsdp=2, moe latent, W reading the activations",
	  { TINY, MOE, MLA, "q_lora_rank=8", "kv_lora_rank=8", ON("ici_expert_parallelism=2", "ici_fsdp_parallelism=2"), NULL }, 4,
	  true },
};

START_TEST(test_mesh)
{
	on_mesh(&cases[_i]);
}
END_TEST

static Suite *wgrad_suite(void)
{
	Suite *s = suite_create("wgrad");
	TCase *tc = tcase_create("one_device");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_dense_gqa);
	tcase_add_test(tc, test_moe_gqa);
	tcase_add_test(tc, test_dense_mla);
	tcase_add_test(tc, test_moe_mla);
	tcase_add_test(tc, test_stash_bytes);
	suite_add_tcase(s, tc);
	tc = tcase_create("mesh");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_mesh, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(wgrad_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
