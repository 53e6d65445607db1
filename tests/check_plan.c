/* The sharded-matmul planner (host/mesh/plan.c) and the model's plans: gathered
 * and reduced axes worked out by hand for FSDP, tensor, tensor-transpose
 * and expert meshes; the storage order that makes a gathered block
 * contiguous; block placement tiling a tensor; FSDP halving the weights a
 * device stores; and the combinations refused at start-up, with the
 * tensor and axes named. No collectives run here: plans are arithmetic. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/model/model.h"
#include "host/mesh/plan.h"
#include "host/mesh/shard.h"
#include "host/model/window.h"
#include "host/optim/optim.h"
#include "kernels/kernels.h"

static char err[1024];

#define AX(a) (1u << (a))

struct fixture {
	struct cfg c;
	struct mesh m;
	struct shard_rules r;
	struct model_dims d;
};

/* One host; the preset, then `key=value` overrides (data 1 unless given). */
static struct fixture *make(const char *preset, const char *const *kv)
{
	struct fixture *f = calloc(1, sizeof(*f));
	ck_assert_ptr_nonnull(f);
	cfg_defaults(&f->c);
	ck_assert_msg(cfg_load_file(&f->c, preset, err, sizeof(err)) == 0, "%s", err);
	f->c.ici_data_parallelism = 1;
	for (; *kv; kv++)
		ck_assert_msg(cfg_override(&f->c, *kv, err, sizeof(err)) == 0, "%s", err);
	struct cfg *c = &f->c;
	int devs = (int)(c->ici_data_parallelism * c->ici_fsdp_parallelism * c->ici_fsdp_transpose_parallelism *
			 c->ici_tensor_parallelism * c->ici_tensor_transpose_parallelism *
			 c->ici_expert_parallelism);
	ck_assert_msg(cfg_finish(c, 1, devs, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&f->m, c);
	ck_assert_msg(shard_rules_from_cfg(&f->r, c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(model_dims_from_cfg(&f->d, c, err, sizeof(err)) == 0, "%s", err);
	return f;
}

static struct model *plan_of(struct fixture *f, int device)
{
	struct model_mesh mm = { .mesh = &f->m, .rules = &f->r, .device = device };
	struct model *m = model_plan_new(&f->d, &mm, err, sizeof(err));
	ck_assert_msg(m, "%s", err);
	return m;
}

static const struct model_linear_info *linear(const struct model_linear_info *li, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(li[i].name, name))
			return &li[i];
	ck_abort_msg("no linear '%s'", name);
	return NULL;
}

static void plan_is(const struct model_linear_info *li, int n, const char *name, uint32_t gather,
		    uint32_t reduce, uint32_t dx_reduce, uint32_t gsum)
{
	const struct model_linear_info *l = linear(li, n, name);
	ck_assert_msg(l->gather == gather && l->reduce == reduce && l->dx_reduce == dx_reduce &&
		      l->dw_scatter == gather && l->gsum == gsum,
		      "%s: gather %#x reduce %#x dx %#x scatter %#x gsum %#x; want %#x %#x %#x %#x %#x", name,
		      l->gather, l->reduce, l->dx_reduce, l->dw_scatter, l->gsum, gather, reduce, dx_reduce,
		      gather, gsum);
}

START_TEST(test_fsdp_tensor)
{
	/* llama-tiny (C 128, 4 q heads and 2 kv heads of 32, F 352, V 256)
	 * on fsdp=2 x tensor=2: the rows are split over fsdp, so every weight
	 * sharded on fsdp is gathered; contractions over the heads and the
	 * MLP hidden (tensor) are partial; the vocab is split over tensor */
	struct fixture *f = make("configs/llama-tiny.yml",
				 (const char *[]){ "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL });
	struct model *m = plan_of(f, 0);
	struct model_linear_info li[32];
	int n = model_linears(m, li, 32);
	uint32_t F = AX(AX_FSDP), T = AX(AX_TENSOR);
	ck_assert_uint_eq(model_rows_axes(m), F);
	plan_is(li, n, "q projection", F, 0, T, 0);
	plan_is(li, n, "k projection", F, 0, T, 0);
	plan_is(li, n, "attention output", F, T, 0, 0);
	plan_is(li, n, "mlp gate", F, 0, T, 0);
	plan_is(li, n, "mlp down", F, T, 0, 0);
	plan_is(li, n, "embedding", F, T, 0, 0);
	plan_is(li, n, "output projection", F, 0, T, 0);
	/* norms: replicated, so their gradients are summed over the rows */
	const struct param_info *p = model_param_by_name(m, "attn_norm");
	ck_assert_uint_eq(p->gsum, F);
	ck_assert_uint_eq(p->split, 0);
	/* wq [2, 128, 128]: heads on tensor, embed on fsdp */
	p = model_param_by_name(m, "wq");
	ck_assert_int_eq(p->shape[1], 64);
	ck_assert_int_eq(p->shape[2], 64);
	ck_assert_uint_eq(p->split, F | T);
	model_free(m);
	free(f);
}
END_TEST

START_TEST(test_tensor_transpose_and_expert)
{
	/* tensor_transpose splits the embedding: every contraction over it is
	 * partial (forward all-reduce over tensor_transpose), the norm
	 * weights are used in slices and their gradients summed over it */
	struct fixture *f = make("configs/deepseek-tiny.yml",
				 (const char *[]){ "ici_tensor_transpose_parallelism=2", "ici_expert_parallelism=2", NULL });
	struct model *m = plan_of(f, 0);
	struct model_linear_info li[32];
	int n = model_linears(m, li, 32);
	uint32_t TT = AX(AX_TENSOR_T), E = AX(AX_EXPERT);
	ck_assert_uint_eq(model_rows_axes(m), E);
	/* embed: (fsdp, fsdp_t, tt, context, expert): tt kept, expert gathered */
	plan_is(li, n, "q projection", E, TT, 0, 0);
	plan_is(li, n, "attention output", E, 0, TT, 0);
	/* the router's experts dimension is on expert, which splits the rows */
	plan_is(li, n, "router", E, TT, 0, 0);
	/* experts: tokens travel over expert, so nothing is gathered */
	plan_is(li, n, "expert gate", 0, TT, 0, 0);
	plan_is(li, n, "expert down", 0, 0, TT, 0);
	const struct param_info *p = model_param_by_name(m, "mlp_norm");
	ck_assert_uint_eq(p->gsum, E | TT);
	p = model_param_by_name(m, "e_gate");
	ck_assert_int_eq(p->shape[1], 4);      /* 8 experts over 2 */
	ck_assert_int_eq(p->shape[3], 64);     /* embedding over tt */
	model_free(m);
	free(f);
}
END_TEST

START_TEST(test_storage_order)
{
	/* embed split over fsdp (gathered) and tensor_transpose (kept): the
	 * kept axis is stored major, so gathering fsdp fills one contiguous
	 * half of the embedding, the half the activations hold */
	struct fixture *f = make("configs/llama-tiny.yml",
				 (const char *[]){ "ici_fsdp_parallelism=2", "ici_tensor_transpose_parallelism=2", NULL });
	struct model *m = plan_of(f, 0);
	const struct param_info *p = model_param_by_name(m, "wq");
	const struct plan_param *pp = NULL;
	for (int i = 0; i < model_num_params(m); i++)
		if (model_param(m, i) == p)
			pp = model_param_plan(m, i);
	ck_assert_ptr_nonnull(pp);
	ck_assert_int_eq(pp->spec.naxes[2], 2);
	ck_assert_int_eq(pp->spec.axis[2][0], AX_TENSOR_T);
	ck_assert_int_eq(pp->spec.axis[2][1], AX_FSDP);
	ck_assert_int_eq(pp->cshape[2], 64);
	for (int dev = 0; dev < 4; dev++) {
		int c[AX_COUNT], whole[SHARD_MAX_DIMS], gath[SHARD_MAX_DIMS];
		mesh_coords(&f->m, dev, c);
		plan_block_offsets(pp, &f->m, pp->spec.used, c, whole);
		plan_block_offsets(pp, &f->m, pp->gather, c, gath);
		ck_assert_int_eq(whole[2], c[AX_TENSOR_T] * 64 + c[AX_FSDP] * 32);
		ck_assert_int_eq(gath[2], c[AX_FSDP] * 32);
	}
	model_free(m);
	free(f);
}
END_TEST

START_TEST(test_copy_block)
{
	/* four 2x3 blocks tile a 4x6 tensor and come back out unchanged */
	float t[24] = { 0 }, b[4][6], out[6];
	int ts[2] = { 4, 6 }, bs[2] = { 2, 3 };
	for (int k = 0; k < 4; k++) {
		for (int i = 0; i < 6; i++)
			b[k][i] = (float)(10 * k + i);
		int off[2] = { (k / 2) * 2, (k % 2) * 3 };
		plan_copy_block(t, ts, b[k], bs, off, 2, true);
	}
	ck_assert_float_eq(t[0], 0);
	ck_assert_float_eq(t[3], 10);      /* block 1 starts at column 3 */
	ck_assert_float_eq(t[6 + 4], 14);  /* row 1, column 4: block 1's (1, 1) */
	ck_assert_float_eq(t[12], 20);
	ck_assert_float_eq(t[23], 35);
	for (int k = 0; k < 4; k++) {
		int off[2] = { (k / 2) * 2, (k % 2) * 3 };
		plan_copy_block(t, ts, out, bs, off, 2, false);
		ck_assert(!memcmp(out, b[k], sizeof(out)));
	}
}
END_TEST

START_TEST(test_fsdp_memory)
{
	/* FSDP stores each device's shard: fsdp=4 keeps a quarter of every
	 * matrix and embedding, whole norms; the per-layer window holds one
	 * layer's gathered weights (and their gradients), not the model */
	struct fixture *one = make("configs/llama-tiny.yml", (const char *[]){ NULL });
	struct fixture *f = make("configs/llama-tiny.yml", (const char *[]){ "ici_fsdp_parallelism=4", NULL });
	struct model *m1 = model_plan_new(&one->d, NULL, err, sizeof(err));
	struct model *m = plan_of(f, 3);
	ck_assert_ptr_nonnull(m1);
	size_t norms = 2 * 2 * 128 + 128, whole = model_numel(m1);
	ck_assert_uint_eq(model_numel(m), (whole - norms) / 4 + norms);
	/* windows: embed + lm_head whole and one layer of wq wk wv wo and
	 * the MLP, for weights and for gradients, and one layer's weights
	 * and gradients more (the gather in flight lands there, the
	 * reduce-scatter in flight works there, both in place); the
	 * non-layer group's packed buffers, a gather's and a
	 * reduce-scatter's: the whole group and this device's quarter each
	 * (a layer group packs only without the list forms) */
	size_t layer = 128 * 128 * 2 + 64 * 128 * 2 + 352 * 128 * 3, nl = 2 * 256 * 128;
	ck_assert_uint_eq(model_window_numel(m), 2 * (nl + layer) + 2 * layer + 2 * (nl + nl / 4));
	ck_assert_uint_eq(win_packed_numel(model_window(m)), 2 * (layer + layer / 4));
	/* the windows are a fixed few layers: for a deep model the shards
	 * save more than they cost, even counting the weights alone (their
	 * gradients and optimizer state shrink as much again) */
	struct fixture *deep1 = make("configs/llama-tiny.yml", (const char *[]){ "base_num_decoder_layers=32", NULL });
	struct fixture *deep = make("configs/llama-tiny.yml",
				    (const char *[]){ "base_num_decoder_layers=32", "ici_fsdp_parallelism=4", NULL });
	struct model *d1 = model_plan_new(&deep1->d, NULL, err, sizeof(err)), *d4 = plan_of(deep, 0);
	ck_assert_ptr_nonnull(d1);
	ck_assert_uint_lt(model_window_numel(d4), model_numel(d1) - model_numel(d4));
	model_free(d1);
	model_free(d4);
	free(deep1);
	free(deep);
	model_free(m1);
	model_free(m);
	free(one);
	free(f);
}
END_TEST

static void refused(const char *preset, const char *const *kv, const char *want1, const char *want2)
{
	struct fixture *f = make(preset, kv);
	struct model_mesh mm = { .mesh = &f->m, .rules = &f->r, .device = 0 };
	struct model *m = model_plan_new(&f->d, &mm, err, sizeof(err));
	ck_assert_msg(!m, "planned, but should be refused");
	ck_assert_msg(strstr(err, want1) && strstr(err, want2), "'%s' lacks '%s' or '%s'", err, want1, want2);
	free(f);
}

START_TEST(test_refusals)
{
	/* the weight's embedding split over tensor_transpose, the activations' not */
	refused("configs/llama-tiny.yml",
		(const char *[]){ "ici_tensor_transpose_parallelism=2",
				  "logical_axis_rules=vocab=tensor,embed=tensor_transpose,activation_batch=data,"
				  "activation_embed=", NULL },
		"linear 'embedding' gives weight 'embed' dimension 1 split over (tensor_transpose)",
		"its output is wanted over (none)");
	/* the same mismatch on a contraction: a tied output projection whose
	 * vocabulary is split where the logits are not */
	refused("configs/llama-tiny.yml",
		(const char *[]){ "ici_tensor_parallelism=2",
				  "logical_axis_rules=vocab=tensor,activation_batch=data,activation_vocab=", NULL },
		"linear 'output projection' gives weight 'lm_head' dimension 0 split over (tensor)",
		"wanted over (none)");
	/* heads wanted over tensor, the weight splits them over nothing */
	refused("configs/llama-tiny.yml",
		(const char *[]){ "ici_tensor_parallelism=2",
				  "logical_axis_rules=activation_batch=data,activation_heads=tensor", NULL },
		"linear 'q projection' gives weight 'wq' dimension 1 split over (none)",
		"wanted over (tensor)");
	/* experts on an axis that does not split the batch: tokens cannot travel */
	refused("configs/deepseek-tiny.yml",
		(const char *[]){ "ici_tensor_parallelism=2",
				  "logical_axis_rules=exp=tensor,activation_batch=data", NULL },
		"experts ('exp') are split over tensor", "does not split the batch");
	/* a split that does not divide names the weight and the key */
	refused("configs/llama-tiny.yml", (const char *[]){ "ici_tensor_parallelism=2", "base_mlp_dim=351", NULL },
		"tensor 'w_gate' dimension 1 ('mlp', 351) is not divisible by 2", "key 'base_mlp_dim'");
}
END_TEST

/* Muon's plan on deepseek-tiny (attention, dense MLP, expert, shared
 * expert and embedding matrices of unequal Newton-Schulz cost) on a mesh
 * of n devices: every device computes the same loads; the members of a
 * group name the same owners; the loads add up to every matrix once. */
static void muon_plan_case(const char *const *kv, bool by_size, double *max, double *min, double *total,
			   double *biggest)
{
	struct fixture *f = make("configs/deepseek-tiny.yml", kv);
	int N = f->m.num_devices;
	struct muon_plan mp[16];
	struct model *m = plan_of(f, 0);
	ck_assert_int_le(N, 16);
	for (int d = 0; d < N; d++)
		ck_assert_int_eq(muon_plan_init(&mp[d], m, &f->m, d, by_size), 0);
	*total = *biggest = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		if (p->opt != OPT_MUON)
			continue;
		uint32_t axes = muon_group_axes(&f->m, p);
		int nmat = (int)(p->numel / ((size_t)p->shape[p->ndim - 2] * p->shape[p->ndim - 1]));
		int shared = mesh_axes_size(&f->m, axes) > 1;
		double cost = newton_schulz5_flops(p->mat_rows, p->mat_cols);
		/* a shared matrix is run once per group, an unshared one by each device */
		*total += nmat * cost * (shared ? N / mesh_axes_size(&f->m, axes) : N);
		*biggest = cost > *biggest ? cost : *biggest;
		for (int d = 0; d < N && shared; d++) {
			struct mesh_group g;
			mesh_group(&f->m, d, axes, &g);
			for (int r = 0; r < g.n; r++) {
				const struct muon_plan *x = &mp[d], *y = &mp[g.devs[r]];
				for (int j = 0; j < nmat; j++)
					ck_assert_msg(x->owner[x->first[i] + j] == y->owner[y->first[i] + j],
						      "'%s' matrix %d: device %d and %d disagree on its owner", p->name, j, d,
						      g.devs[r]);
			}
		}
	}
	double sum = 0;
	for (int d = 0; d < N; d++) {
		for (int e = 0; e < N; e++)
			ck_assert(mp[d].load[e] == mp[0].load[e]);
		sum += mp[0].load[d];
	}
	ck_assert_msg(fabs(sum - *total) <= 1e-9 * *total, "loads sum to %g flops, the matrices %g", sum, *total);
	muon_plan_spread(&mp[0], max, min);
	for (int d = 0; d < N; d++)
		muon_plan_free(&mp[d]);
	model_free(m);
	free(f);
}

/* Longest first against round robin: within the list-scheduling bound
 * (the busiest at most the mean plus (1 - 1/n) of the largest matrix),
 * the busiest and least busy within one matrix of each other (what
 * giving each matrix to the least loaded keeps), and never worse than
 * round robin (which here is a whole largest matrix apart). */
/* Expert stacks split over `exp` need no exchange over it: on FSDP=2 x
 * EP=2 an expert matrix's group is its FSDP pair (the blocks of it), an
 * attention matrix's all four devices (blocks over fsdp, copies over exp). */
START_TEST(test_muon_expert_groups)
{
	struct fixture *f = make("configs/deepseek-tiny.yml",
				 (const char *[]){ "ici_fsdp_parallelism=2", "ici_expert_parallelism=2", NULL });
	struct model *m = plan_of(f, 0);
	int seen = 0;
	for (int i = 0; i < model_num_params(m); i++) {
		const struct param_info *p = model_param(m, i);
		int n = mesh_axes_size(&f->m, muon_group_axes(&f->m, p));
		if (!strcmp(p->name, "e_gate") || !strcmp(p->name, "e_down"))
			ck_assert_msg(n == 2 && (seen |= 1), "'%s': a group of %d", p->name, n);
		if (!strcmp(p->name, "wq"))
			ck_assert_msg(n == 4 && (seen |= 2), "'%s': a group of %d", p->name, n);
	}
	ck_assert_int_eq(seen, 3);
	model_free(m);
	free(f);
}
END_TEST

START_TEST(test_muon_balance)
{
	const char *const meshes[][3] = {
		{ "ici_fsdp_parallelism=4", NULL },
		{ "ici_fsdp_parallelism=2", "ici_expert_parallelism=2", NULL },
		{ "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL },
	};
	for (int k = 0; k < 3; k++) {
		double mx, mn, tot, big, rmx, rmn;
		muon_plan_case(meshes[k], false, &rmx, &rmn, &tot, &big);
		muon_plan_case(meshes[k], true, &mx, &mn, &tot, &big);
		int n = 4;
		fprintf(stderr, "muon plan deepseek-tiny %s %s: Newton-Schulz MFLOP a device: size max %.2f min %.2f, "
			"round robin max %.2f min %.2f; mean %.2f, largest matrix %.2f\n", meshes[k][0],
			meshes[k][1] ? meshes[k][1] : "", mx * 1e-6, mn * 1e-6, rmx * 1e-6, rmn * 1e-6,
			tot / n * 1e-6, big * 1e-6);
		ck_assert_msg(mx <= tot / n + (1.0 - 1.0 / n) * big, "%s: busiest %g over the bound %g", meshes[k][0],
			      mx, tot / n + (1.0 - 1.0 / n) * big);
		ck_assert_msg(mx - mn < big, "%s: busiest %g, least busy %g, largest matrix %g", meshes[k][0], mx, mn,
			      big);
		ck_assert_msg(mx <= rmx && mn >= rmn, "%s: size %g..%g, round robin %g..%g", meshes[k][0], mn, mx,
			      rmn, rmx);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("plans");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_fsdp_tensor);
	tcase_add_test(tc, test_tensor_transpose_and_expert);
	tcase_add_test(tc, test_storage_order);
	tcase_add_test(tc, test_copy_block);
	tcase_add_test(tc, test_fsdp_memory);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_muon_balance);
	tcase_add_test(tc, test_muon_expert_groups);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
