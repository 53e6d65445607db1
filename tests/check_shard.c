/* Sharding specs: rule order, axes already taken, size-1 axes, replicated
 * dimensions, rule parsing and shard-exp-on-fsdp, divisibility errors,
 * shard offsets tiling the tensor, offsets over a subset of the axes; and
 * `meshrun shardings` against local shapes worked out by hand. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "tests/proc.h"

static char err[1024];

/* A mesh of one host from `key=value` overrides (ici_data_parallelism is
 * set to 1 unless given). */
static void make_mesh(struct mesh *m, struct cfg *c, const char *const *kv)
{
	int devs;
	cfg_defaults(c);
	c->ici_data_parallelism = 1;
	for (; *kv; kv++)
		ck_assert_msg(cfg_override(c, *kv, err, sizeof(err)) == 0, "%s", err);
	devs = (int)(c->ici_data_parallelism * c->ici_pipeline_parallelism * c->ici_fsdp_parallelism *
		     c->ici_fsdp_transpose_parallelism * c->ici_tensor_parallelism *
		     c->ici_tensor_transpose_parallelism * c->ici_expert_parallelism);
	ck_assert_msg(cfg_finish(c, 1, devs, err, sizeof(err)) == 0, "%s", err);
	mesh_init(m, c);
}

static void rules_of(struct shard_rules *r, struct cfg *c, const char *text)
{
	char kv[CFG_STR + 32];
	snprintf(kv, sizeof(kv), "logical_axis_rules=%s", text);
	ck_assert_msg(cfg_override(c, kv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(shard_rules_from_cfg(r, c, err, sizeof(err)) == 0, "%s", err);
}

static void resolve(const struct shard_rules *r, const struct mesh *m, int ndim, const int *shape,
		    const char *const *logical, struct shard_spec *s)
{
	ck_assert_msg(shard_resolve(r, m, "t", ndim, shape, NULL, logical, s, err, sizeof(err)) == 0,
		      "%s", err);
}

static void spec_is(const struct shard_spec *s, const char *want)
{
	char got[256];
	shard_spec_text(s, got, sizeof(got));
	ck_assert_str_eq(got, want);
}

START_TEST(test_rule_order)
{
	static struct shard_rules r;
	struct shard_spec s;
	struct cfg c;
	struct mesh m;
	const char *kv[] = { "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL };
	const char *lg[] = { "mlp", "embed" };
	int shape[] = { 8, 8 };
	make_mesh(&m, &c, kv);

	/* embed's rule comes first and takes fsdp; mlp's rule wants fsdp too,
	 * so the whole rule is skipped and mlp stays replicated */
	rules_of(&r, &c, "embed=fsdp,mlp=fsdp|tensor");
	resolve(&r, &m, 2, shape, lg, &s);
	spec_is(&s, "(None, 'fsdp')");
	ck_assert_int_eq(s.local[0], 8);
	ck_assert_int_eq(s.local[1], 4);
	/* the other order: mlp takes both axes, embed is left with nothing */
	rules_of(&r, &c, "mlp=fsdp|tensor,embed=fsdp");
	resolve(&r, &m, 2, shape, lg, &s);
	spec_is(&s, "(('fsdp', 'tensor'), None)");
	ck_assert_int_eq(s.nshard[0], 4);
	ck_assert_int_eq(s.local[0], 2);
	ck_assert_uint_eq(s.axes[0], (1u << AX_FSDP) | (1u << AX_TENSOR));
	/* a name listed twice is a fallback: the first rule is blocked by an
	 * axis another dimension uses, the second applies */
	rules_of(&r, &c, "embed=tensor,mlp=tensor,mlp=fsdp");
	resolve(&r, &m, 2, shape, lg, &s);
	spec_is(&s, "('fsdp', 'tensor')");
	/* the first rule that fits wins: the fallback is not applied on top */
	rules_of(&r, &c, "mlp=tensor,mlp=fsdp");
	resolve(&r, &m, 2, shape, lg, &s);
	spec_is(&s, "('tensor', None)");
	ck_assert_int_eq(s.local[1], 8);
	ck_assert_uint_eq(s.used, 1u << AX_TENSOR);
	ck_assert_uint_eq(s.local_numel, 32);
	ck_assert_uint_eq(s.local_bytes, 128);
}
END_TEST

START_TEST(test_size_one_and_replicated)
{
	static struct shard_rules r;
	struct shard_spec s;
	struct cfg c;
	struct mesh m;
	const char *kv[] = { "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL };
	make_mesh(&m, &c, kv);
	/* the default rules: fsdp_transpose (size 1) is in both embed's and
	 * mlp's rules; dropped first, it blocks nothing */
	ck_assert_msg(shard_rules_from_cfg(&r, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(r.n, 24);
	const char *lg[] = { "layers", "mlp", "embed" };
	int shape[] = { 2, 352, 128 };
	resolve(&r, &m, 3, shape, lg, &s);
	spec_is(&s, "(None, 'tensor', 'fsdp')");
	ck_assert_int_eq(s.naxes[0], 0); /* layers=stage, stage has size 1 */
	ck_assert_int_eq(s.naxes[1], 1);
	ck_assert_int_eq(s.naxes[2], 1);
	ck_assert_int_eq(s.axis[2][0], AX_FSDP);
	ck_assert_int_eq(s.local[0], 2);
	ck_assert_int_eq(s.local[1], 176);
	ck_assert_int_eq(s.local[2], 64);

	/* no rule for a name, a NULL name, "kv=": all replicated; a later kv
	 * rule does not apply because "kv=" claimed the dimension */
	rules_of(&r, &c, "kv=,kv=tensor,embed=fsdp");
	const char *lg2[] = { "vocab", NULL, "kv", "embed" };
	int shape2[] = { 6, 5, 4, 4 };
	resolve(&r, &m, 4, shape2, lg2, &s);
	spec_is(&s, "(None, None, None, 'fsdp')");
	ck_assert_int_eq(s.local[0], 6);
	ck_assert_int_eq(s.local[1], 5);
	ck_assert_int_eq(s.local[2], 4);
	ck_assert_int_eq(s.local[3], 2);
	ck_assert_uint_eq(s.used, 1u << AX_FSDP);
	/* no rules at all */
	rules_of(&r, &c, "");
	ck_assert_int_eq(r.n, 0);
	resolve(&r, &m, 4, shape2, lg2, &s);
	spec_is(&s, "(None, None, None, None)");
	ck_assert_uint_eq(s.local_numel, 6 * 5 * 4 * 4);
	/* a one-dimensional spec prints as a Python tuple */
	const char *lg3[] = { "embed" };
	rules_of(&r, &c, "embed=fsdp");
	resolve(&r, &m, 1, shape2 + 2, lg3, &s);
	spec_is(&s, "('fsdp',)");
}
END_TEST

START_TEST(test_rule_errors)
{
	static struct shard_rules r;
	struct cfg c;
	const struct {
		const char *rules, *want1, *want2;
	} bad[] = {
		{ "vocab=tensor,embd=fsdp", "rule 1 'embd=fsdp'", "unknown logical axis 'embd'" },
		{ "embed=fsdp|fdsp", "rule 0 'embed=fsdp|fdsp'", "unknown mesh axis 'fdsp'" },
		{ "embed", "rule 0 'embed'", "logical=axis" },
		{ "=fsdp", "rule 0 '=fsdp'", "no logical axis name" },
		{ "embed=fsdp|fsdp", "rule 0", "'fsdp' twice" },
		{ "embed=fsdp|", "rule 0", "unknown mesh axis ''" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char kv[256];
		cfg_defaults(&c);
		snprintf(kv, sizeof(kv), "logical_axis_rules=%s", bad[i].rules);
		ck_assert_int_eq(cfg_override(&c, kv, err, sizeof(err)), 0);
		ck_assert_int_ne(shard_rules_from_cfg(&r, &c, err, sizeof(err)), 0);
		ck_assert_msg(strstr(err, "'logical_axis_rules'") && strstr(err, bad[i].want1) &&
			      strstr(err, bad[i].want2), "%s: %s", bad[i].rules, err);
	}
	/* blanks around names are fine */
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_override(&c, "logical_axis_rules= embed = fsdp | tensor ", err, sizeof(err)), 0);
	ck_assert_msg(shard_rules_from_cfg(&r, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(r.rule[0].logical, "embed");
	ck_assert_int_eq(r.rule[0].naxes, 2);
	ck_assert_int_eq(r.rule[0].axis[1], AX_TENSOR);
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_override(&c, "custom_mesh_and_rule=exp-on-fsdp", err, sizeof(err)), 0);
	ck_assert_int_ne(shard_rules_from_cfg(&r, &c, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'custom_mesh_and_rule'") && strstr(err, "exp-on-fsdp"), "%s", err);
}
END_TEST

START_TEST(test_exp_on_fsdp_rules)
{
	static struct shard_rules r;
	struct shard_spec s;
	struct cfg c;
	struct mesh m;
	const char *kv[] = { "ici_fsdp_parallelism=2", "ici_expert_parallelism=2",
			     "custom_mesh_and_rule=shard-exp-on-fsdp", NULL };
	make_mesh(&m, &c, kv);
	ck_assert_msg(shard_rules_from_cfg(&r, &c, err, sizeof(err)) == 0, "%s", err);
	int found = 0;
	for (int i = 0; i < r.n; i++) {
		if (!strcmp(r.rule[i].logical, "exp")) {
			ck_assert_int_eq(r.rule[i].naxes, 2);
			ck_assert_int_eq(r.rule[i].axis[0], AX_EXPERT);
			ck_assert_int_eq(r.rule[i].axis[1], AX_FSDP);
			found++;
		} else if (!strcmp(r.rule[i].logical, "embed_moe")) {
			for (int k = 0; k < r.rule[i].naxes; k++)
				ck_assert_int_ne(r.rule[i].axis[k], AX_FSDP);
			ck_assert_int_eq(r.rule[i].naxes, 3); /* fsdp_transpose, tensor_transpose, context */
			found++;
		}
	}
	ck_assert_int_eq(found, 2);
	/* an expert matrix stack [layers, exp, mlp_moe, embed_moe] */
	const char *lg[] = { "layers", "exp", "mlp_moe", "embed_moe" };
	int shape[] = { 2, 8, 96, 128 };
	resolve(&r, &m, 4, shape, lg, &s);
	spec_is(&s, "(None, ('expert', 'fsdp'), None, None)");
	ck_assert_int_eq(s.local[1], 2);
	ck_assert_int_eq(s.local[2], 96);
	ck_assert_int_eq(s.local[3], 128);
	/* with no exp rule at all, one is appended */
	rules_of(&r, &c, "embed_moe=fsdp|context");
	ck_assert_int_eq(r.n, 2);
	ck_assert_int_eq(r.rule[0].naxes, 1);
	ck_assert_int_eq(r.rule[0].axis[0], AX_CONTEXT);
	ck_assert_str_eq(r.rule[1].logical, "exp");
}
END_TEST

START_TEST(test_indivisible)
{
	static struct shard_rules r;
	struct shard_spec s;
	struct cfg c;
	struct mesh m;
	const char *kv[] = { "ici_fsdp_parallelism=2", "ici_tensor_parallelism=3", NULL };
	make_mesh(&m, &c, kv);
	ck_assert_msg(shard_rules_from_cfg(&r, &c, err, sizeof(err)) == 0, "%s", err);
	const char *lg[] = { "layers", "q_heads", "embed" };
	int shape[] = { 2, 512, 128 };
	ck_assert_int_eq(shard_resolve(&r, &m, "wq", 3, shape, NULL, lg, &s, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "sharding: tensor 'wq' dimension 1 ('q_heads', 512) is not divisible by 3 (axes tensor)");
	/* heads stay whole: 96 = 3 heads of 32 splits in 3 but not in 2 */
	int unit[3];
	shard_head_units(3, lg, 32, unit);
	ck_assert_int_eq(unit[0], 1);
	ck_assert_int_eq(unit[1], 32);
	ck_assert_int_eq(unit[2], 1);
	int shape2[] = { 2, 96, 128 };
	ck_assert_int_eq(shard_resolve(&r, &m, "wq", 3, shape2, unit, lg, &s, err, sizeof(err)), 0);
	ck_assert_int_eq(s.local[1], 32);
	const char *kv2[] = { "ici_tensor_parallelism=2", NULL };
	make_mesh(&m, &c, kv2);
	ck_assert_int_ne(shard_resolve(&r, &m, "wq", 3, shape2, unit, lg, &s, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "sharding: tensor 'wq' dimension 1 ('q_heads', 96 = 3 heads of 32) is not divisible by 2 (axes tensor)");
	/* several axes on one dimension: their product must divide */
	const char *kv3[] = { "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL };
	make_mesh(&m, &c, kv3);
	rules_of(&r, &c, "embed=fsdp|tensor");
	const char *lg3[] = { "embed" };
	int shape3[] = { 6 };
	ck_assert_int_ne(shard_resolve(&r, &m, "x", 1, shape3, NULL, lg3, &s, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "sharding: tensor 'x' dimension 0 ('embed', 6) is not divisible by 4 (axes fsdp, tensor)");
}
END_TEST

/* Every element of the tensor is held by exactly num_devices / shards
 * devices, and each device's block lies inside the tensor. */
static void check_tiling(const struct shard_spec *s, const struct mesh *m)
{
	int total = s->shape[0] * s->shape[1], shards = s->nshard[0] * s->nshard[1];
	int *count = calloc((size_t)total, sizeof(int));
	ck_assert_ptr_nonnull(count);
	for (int d = 0; d < m->num_devices; d++) {
		int coord[AX_COUNT], off[2];
		mesh_coords(m, d, coord);
		shard_offsets(s, m, coord, off);
		for (int k = 0; k < 2; k++)
			ck_assert(off[k] >= 0 && off[k] + s->local[k] <= s->shape[k]);
		for (int i = 0; i < s->local[0]; i++)
			for (int j = 0; j < s->local[1]; j++)
				count[(off[0] + i) * s->shape[1] + off[1] + j]++;
	}
	for (int e = 0; e < total; e++)
		ck_assert_int_eq(count[e], m->num_devices / shards);
	free(count);
}

START_TEST(test_offsets)
{
	static struct shard_rules r;
	struct shard_spec s;
	struct cfg c;
	struct mesh m;
	const char *kv[] = { "ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", NULL };
	const char *lg[] = { "vocab", "embed" };
	int shape[] = { 8, 16 }, off[2];
	int coord[AX_COUNT] = { 0 };
	make_mesh(&m, &c, kv);

	/* embed on (fsdp, tensor): fsdp is the major part of the shard index */
	rules_of(&r, &c, "embed=fsdp|tensor");
	resolve(&r, &m, 2, shape, lg, &s);
	ck_assert_int_eq(s.local[1], 4);
	coord[AX_FSDP] = 1;
	coord[AX_TENSOR] = 0;
	shard_offsets(&s, &m, coord, off);
	ck_assert_int_eq(off[0], 0);
	ck_assert_int_eq(off[1], 8);  /* index 1*2 + 0 = 2 */
	coord[AX_FSDP] = 0;
	coord[AX_TENSOR] = 1;
	shard_offsets(&s, &m, coord, off);
	ck_assert_int_eq(off[1], 4);  /* index 0*2 + 1 = 1 */
	coord[AX_FSDP] = 1;
	coord[AX_DATA] = 1;           /* data does not shard this tensor */
	shard_offsets(&s, &m, coord, off);
	ck_assert_int_eq(off[1], 12);
	check_tiling(&s, &m);

	/* listed the other way round, tensor is the major part */
	rules_of(&r, &c, "embed=tensor|fsdp");
	resolve(&r, &m, 2, shape, lg, &s);
	coord[AX_FSDP] = 1;
	coord[AX_TENSOR] = 0;
	shard_offsets(&s, &m, coord, off);
	ck_assert_int_eq(off[1], 4);
	check_tiling(&s, &m);

	/* two sharded dimensions */
	rules_of(&r, &c, "vocab=tensor,embed=fsdp");
	resolve(&r, &m, 2, shape, lg, &s);
	ck_assert_int_eq(s.local[0], 4);
	ck_assert_int_eq(s.local[1], 8);
	coord[AX_FSDP] = 1;
	coord[AX_TENSOR] = 1;
	shard_offsets(&s, &m, coord, off);
	ck_assert_int_eq(off[0], 4);
	ck_assert_int_eq(off[1], 8);
	check_tiling(&s, &m);

	/* counting only fsdp: the offset inside the block tensor keeps */
	int part[2];
	shard_block_offsets(&s, &m, 1u << AX_FSDP, coord, part);
	ck_assert_int_eq(part[0], 0);
	ck_assert_int_eq(part[1], 8);
}
END_TEST

/* ---- meshrun shardings ---- */

/* Runs meshrun with args (proc_run's words); stdout and stderr into out.
 * Exit code (-1 if it had to be killed after 20 s). */
static int run_meshrun(const char *args, char *out, size_t outlen)
{
	struct proc p;
	int rc = proc_run(&p, "shardings", args, 20);
	snprintf(out, outlen, "%s", slurp(p.out));
	return rc;
}

static void cli_setup(void)
{
	proc_setup("meshrun-shard", 0);
}

/* The columns of the row named name (columns are separated by two or more
 * spaces): 0 name .. 5 bytes. */
static void row(const char *out, const char *name, char col[6][128])
{
	size_t nl = strlen(name);
	const char *p = out;
	while (p && *p) {
		if (!strncmp(p, name, nl) && p[nl] == ' ')
			break;
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	ck_assert_msg(p && *p, "no row '%s' in:\n%s", name, out);
	const char *end = strchr(p, '\n');
	for (int k = 0; k < 6; k++) {
		while (*p == ' ')
			p++;
		const char *e = p;
		while (e < end && !(e[0] == ' ' && e[1] == ' '))
			e++;
		ck_assert_msg(e > p, "row '%s' has fewer than 6 columns", name);
		snprintf(col[k], 128, "%.*s", (int)(e - p), p);
		p = e;
	}
}

static void row_is(const char *out, const char *name, const char *spec, const char *global,
		   const char *local, long bytes)
{
	char col[6][128], b[32];
	row(out, name, col);
	ck_assert_str_eq(col[2], spec);
	ck_assert_str_eq(col[3], global);
	ck_assert_str_eq(col[4], local);
	snprintf(b, sizeof(b), "%ld", bytes);
	ck_assert_str_eq(col[5], b);
}

static char out[1 << 16];

START_TEST(test_cli_llama)
{
	/* llama-tiny: C=128, 4 query heads and 2 kv heads of 32, F=352, V=256,
	 * 2 layers, T=64, 8 sequences per device; fsdp=2 x tensor=2 */
	int rc = run_meshrun("shardings --config configs/llama-tiny.yml ici_data_parallelism=1 "
			     "ici_fsdp_parallelism=2 ici_tensor_parallelism=2 --hosts 1 --devices-per-host 4",
			     out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "mesh: 1 host x 4 devices = 4; fsdp=2 tensor=2\n"), "%s", out);
	char col[6][128];
	row(out, "wq", col);
	ck_assert_str_eq(col[1], "(layers, q_heads, embed)");
	/* wq [2, 4*32, 128]: q_heads on tensor, embed on fsdp */
	row_is(out, "wq", "(None, 'tensor', 'fsdp')", "[2, 128, 128]", "[2, 64, 64]", 2 * 64 * 64 * 4);
	row_is(out, "wk", "(None, 'tensor', 'fsdp')", "[2, 64, 128]", "[2, 32, 64]", 2 * 32 * 64 * 4);
	row_is(out, "wo", "(None, 'fsdp', 'tensor')", "[2, 128, 128]", "[2, 64, 64]", 2 * 64 * 64 * 4);
	row_is(out, "w_down", "(None, 'fsdp', 'tensor')", "[2, 128, 352]", "[2, 64, 176]", 2 * 64 * 176 * 4);
	row_is(out, "embed", "('tensor', 'fsdp')", "[256, 128]", "[128, 64]", 128 * 64 * 4);
	row_is(out, "attn_norm", "(None, None)", "[2, 128]", "[2, 128]", 2 * 128 * 4);
	row_is(out, "final_norm", "(None,)", "[128]", "[128]", 128 * 4);
	/* activations: batch 8 x 4 = 32 on fsdp (data has size 1) */
	row_is(out, "embed_out", "('fsdp', None, None)", "[32, 64, 128]", "[16, 64, 128]", 16 * 64 * 128 * 4);
	row_is(out, "q", "('fsdp', None, 'tensor')", "[32, 64, 128]", "[16, 64, 64]", 16 * 64 * 64 * 4);
	row_is(out, "mlp_hidden", "('fsdp', None, 'tensor')", "[32, 64, 352]", "[16, 64, 176]", 16 * 64 * 176 * 4);
	row_is(out, "logits", "('fsdp', None, 'tensor')", "[32, 64, 256]", "[16, 64, 128]", 16 * 64 * 128 * 4);
	/* AdamW: m and v, sharded like the parameters */
	row_is(out, "wq.m+v", "(None, 'tensor', 'fsdp')", "[2, 128, 128]", "[2, 64, 64]", 2 * 2 * 64 * 64 * 4);
	long params = 2 * 128 * 64          /* embed, lm_head */
		      + 2 * (2 * 64 * 64)   /* wq, wo */
		      + 2 * (2 * 32 * 64)   /* wk, wv */
		      + 3 * (2 * 176 * 64)  /* w_gate, w_up, w_down */
		      + 2 * (2 * 128)       /* attn_norm, mlp_norm */
		      + 128;                /* final_norm */
	/* the planner: weights gathered over fsdp (the rows' axis) and their
	 * gradients reduce-scattered back; Megatron's all-reduces over tensor
	 * (row-parallel outputs forward, column-parallel inputs backward); the
	 * embedding's rows partial over the vocab split */
	char lc[6][128];
	const char *const plans[][6] = {
		{ "q projection", "wq", "fsdp", "none", "tensor", "fsdp" },
		{ "attention output", "wo", "fsdp", "tensor", "none", "fsdp" },
		{ "mlp down", "w_down", "fsdp", "tensor", "none", "fsdp" },
		{ "embedding", "embed", "fsdp", "tensor", "none", "fsdp" },
		{ "output projection", "lm_head", "fsdp", "none", "tensor", "fsdp" },
	};
	for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
		row(out, plans[i][0], lc);
		for (int k = 1; k < 6; k++)
			ck_assert_msg(!strcmp(lc[k], plans[i][k]), "%s column %d: '%s', want '%s'",
				      plans[i][0], k, lc[k], plans[i][k]);
	}
	char want[128];
	snprintf(want, sizeof(want), "total parameters: %ld bytes per device", params * 4);
	ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
	snprintf(want, sizeof(want), "total optimizer state: %ld bytes per device", params * 8);
	ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
}
END_TEST

START_TEST(test_cli_zero1)
{
	/* 2 hosts x 2 devices: data=2 over DCN, tensor=2; ZeRO-1 splits the
	 * state of every bucket summed over data flat over the 2 data ranks:
	 * half of each tensor's m+v per device */
	int rc = run_meshrun("shardings --config configs/llama-tiny.yml --hosts 2 --devices-per-host 2 "
			     "ici_data_parallelism=1 ici_tensor_parallelism=2 shard_optimizer_over_data=true",
			     out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	row_is(out, "wq", "(None, 'tensor', None)", "[2, 128, 128]", "[2, 64, 128]", 2 * 64 * 128 * 4);
	row_is(out, "wq.m+v", "(None, 'tensor', None)", "[2, 128, 128]", "[2, 64, 128]", 2 * 64 * 128 * 4);
	row_is(out, "embed.m+v", "('tensor', None)", "[256, 128]", "[128, 128]", 128 * 128 * 4);
	row_is(out, "final_norm.m+v", "(None,)", "[128]", "[128]", 128 * 4);
	/* batch 8 x 4 = 32 on data */
	row_is(out, "logits", "('data', None, 'tensor')", "[32, 64, 256]", "[16, 64, 128]", 16 * 64 * 128 * 4);
	/* Muon cannot take flat shards: refused, naming a matrix */
	rc = run_meshrun("shardings --config configs/llama-tiny.yml --hosts 2 shard_optimizer_over_data=true "
			 "opt_type=muon", out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "opt_type=muon cannot split its state over data"), "%s", out);
}
END_TEST

/* a pipeline with repeats: the stage order of stacked layers is said */
START_TEST(test_cli_stage_order)
{
	int rc = run_meshrun("shardings --config configs/llama-tiny.yml ici_data_parallelism=1 "
			     "ici_pipeline_parallelism=2 base_num_decoder_layers=8 "
			     "num_pipeline_microbatches=4", out, sizeof(out));
	ck_assert_int_eq(rc, 0);
	ck_assert_msg(strstr(out, "pipeline: 2 stages x 4 repeats x 1 layers per stage; stacked layers "
				  "are stored in stage order: stage s holds layers (r*2 + s)*1 .. +0 for "
				  "r = 0..3") && strstr(out, "stage 0: 0..0 2..2 4..4 6..6\n"), "%s", out);
}
END_TEST

START_TEST(test_cli_indivisible)
{
	/* 3 query heads of 32 cannot be split over tensor=2 */
	int rc = run_meshrun("shardings --config configs/llama-tiny.yml ici_data_parallelism=1 "
			     "base_num_query_heads=3 base_num_kv_heads=1 head_dim=32 ici_tensor_parallelism=2 "
			     "--hosts 1 --devices-per-host 2", out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "sharding: tensor 'wq' dimension 1 ('q_heads', 96 = 3 heads of 32) "
				  "is not divisible by 2 (axes tensor)"), "%s", out);
	/* and a dimension that is not a multiple of anything: the mlp */
	rc = run_meshrun("shardings --config configs/llama-tiny.yml ici_data_parallelism=1 "
			 "base_mlp_dim=351 ici_tensor_parallelism=2", out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "tensor 'w_gate' dimension 1 ('mlp', 351) is not divisible by 2 (axes tensor)"),
		      "%s", out);
	/* a bad rule is a config error too */
	rc = run_meshrun("shardings --config configs/llama-tiny.yml 'logical_axis_rules=embed=fsdp|fdsp'",
			 out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "unknown mesh axis 'fdsp'"), "%s", out);
	rc = run_meshrun("shardings --config configs/llama-tiny.yml --hosts", out, sizeof(out));
	ck_assert_int_eq(rc, 2);
}
END_TEST

START_TEST(test_cli_exp_on_fsdp)
{
	/* deepseek-tiny: 8 experts of [96, 128] per MoE layer, 2 MoE layers;
	 * fsdp=2 x expert=2 */
	const char *base = "shardings --config configs/deepseek-tiny.yml ici_data_parallelism=1 "
			   "ici_fsdp_parallelism=2 ici_expert_parallelism=2";
	char args[512];
	int rc = run_meshrun(base, out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	/* default rules: embed_moe takes fsdp, so expert matrices are split */
	row_is(out, "e_gate", "(None, 'expert', None, 'fsdp')", "[2, 8, 96, 128]", "[2, 4, 96, 64]",
	       2 * 4 * 96 * 64 * 4);
	snprintf(args, sizeof(args), "%s custom_mesh_and_rule=shard-exp-on-fsdp", base);
	rc = run_meshrun(args, out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	/* whole [96, 128] expert matrices, 8 / (2 x 2) = 2 of them per layer */
	row_is(out, "e_gate", "(None, ('expert', 'fsdp'), None, None)", "[2, 8, 96, 128]", "[2, 2, 96, 128]",
	       2 * 2 * 96 * 128 * 4);
	row_is(out, "e_down", "(None, ('expert', 'fsdp'), None, None)", "[2, 8, 128, 96]", "[2, 2, 128, 96]",
	       2 * 2 * 128 * 96 * 4);
	row_is(out, "router", "(None, ('expert', 'fsdp'), None)", "[2, 8, 128]", "[2, 2, 128]", 2 * 2 * 128 * 4);
}
END_TEST

/* `meshrun shardings` refuses what the trainer refuses, with the same
 * line: each config below is refused by a one-host `local` run (the
 * trainer, in an agent) and by shardings, and shardings' line is in the
 * trainer's output. Before train_check, shardings printed a plan (exit 0)
 * for the sequence and context axes and the bad fault spec. */
START_TEST(test_cli_same_refusals_as_trainer)
{
	static const char *const cases[] = {
		"ici_sequence_parallelism=2 ici_data_parallelism=1",
		"ici_context_parallelism=2 ici_data_parallelism=1",
		"ici_pipeline_parallelism=2 ici_sequence_parallelism=2 ici_data_parallelism=1 "
		"base_num_decoder_layers=4 --devices-per-host 4",
		"ici_pipeline_parallelism=2 ici_data_parallelism=1 num_pipeline_microbatches=4 "
		"per_device_batch_size=1",
		"faults=close:link=0-3:frame=1",
		"shard_optimizer_over_data=true opt_type=muon",
		"base_num_query_heads=3 base_num_kv_heads=1 head_dim=32 ici_data_parallelism=1 "
		"ici_tensor_parallelism=2",
	};
	char args[512], line[400], tr[8192];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *devs = strstr(cases[i], "--devices-per-host") ? "" : "--devices-per-host 2";
		snprintf(args, sizeof(args), "shardings --config configs/llama-tiny.yml %s %s", devs,
			 cases[i]);
		int rc = run_meshrun(args, out, sizeof(out));
		ck_assert_msg(rc == 3, "shardings %s: exit %d:\n%.2000s", cases[i], rc, out);
		const char *l = strstr(out, "config: ");
		l = l ? l : strstr(out, "sharding: ");
		ck_assert_msg(l, "%s: no config line:\n%s", cases[i], out);
		snprintf(line, sizeof(line), "%.*s", (int)strcspn(l, "\n"), l);
		snprintf(args, sizeof(args), "local --hosts 1 --config configs/llama-tiny.yml steps=1 --quiet "
			 "%s %s", devs, cases[i]);
		rc = run_meshrun(args, tr, sizeof(tr));
		ck_assert_msg(rc == 3, "local %s: exit %d:\n%s", cases[i], rc, tr);
		ck_assert_msg(strstr(tr, line), "%s:\nshardings: %s\ntrainer: %s", cases[i], line, tr);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("shard");
	TCase *tc = tcase_create("resolve");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_rule_order);
	tcase_add_test(tc, test_size_one_and_replicated);
	tcase_add_test(tc, test_indivisible);
	suite_add_tcase(s, tc);
	tc = tcase_create("rules");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_rule_errors);
	tcase_add_test(tc, test_exp_on_fsdp_rules);
	suite_add_tcase(s, tc);
	tc = tcase_create("offsets");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_offsets);
	suite_add_tcase(s, tc);
	tc = tcase_create("cli");
	tcase_add_checked_fixture(tc, cli_setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_cli_llama);
	tcase_add_test(tc, test_cli_zero1);
	tcase_add_test(tc, test_cli_indivisible);
	tcase_add_test(tc, test_cli_stage_order);
	tcase_add_test(tc, test_cli_exp_on_fsdp);
	suite_add_tcase(s, tc);
	tc = tcase_create("cli_trainer");
	tcase_add_checked_fixture(tc, cli_setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_cli_same_refusals_as_trainer);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
