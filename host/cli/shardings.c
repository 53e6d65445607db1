/* What `meshrun shardings` prints (host/cli/shardings.h): how every
 * parameter, the main activations and the optimizer state are sharded over
 * the mesh a config describes, with local shapes and bytes per device.
 * Touches no devices. */
#include "host/cli/shardings.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/model/model.h"
#include "host/optim/optim.h"
#include "host/mesh/plan.h"
#include "host/mesh/shard.h"
#include "host/pipeline/pipe_config.h"
#include "host/train/check.h"

#define NCOL 6
#define MAX_ROWS (2 * MODEL_MAX_PARAMS + 8)

struct table {
	int n;
	char cell[MAX_ROWS][NCOL][192];
};

static const char *const header[NCOL] = {
	"name", "logical axes", "partition spec", "global shape", "local shape", "bytes/device",
};

static void dims_text(char *out, size_t outlen, int n, const int *v)
{
	size_t used = (size_t)snprintf(out, outlen, "[");
	for (int i = 0; i < n && used < outlen; i++)
		used += (size_t)snprintf(out + used, outlen - used, "%s%d", i ? ", " : "", v[i]);
	if (used < outlen)
		snprintf(out + used, outlen - used, "]");
}

static void logical_text(char *out, size_t outlen, int n, const char *const *logical)
{
	size_t used = (size_t)snprintf(out, outlen, "(");
	for (int i = 0; i < n && used < outlen; i++)
		used += (size_t)snprintf(out + used, outlen - used, "%s%s", i ? ", " : "",
					 logical[i] ? logical[i] : "None");
	if (used < outlen)
		snprintf(out + used, outlen - used, ")");
}

static void add_row(struct table *t, const char *name, const char *const *logical,
		    const struct shard_spec *s, size_t bytes)
{
	char (*r)[192] = t->cell[t->n++];
	snprintf(r[0], sizeof(r[0]), "%s", name);
	logical_text(r[1], sizeof(r[1]), s->ndim, logical);
	shard_spec_text(s, r[2], sizeof(r[2]));
	dims_text(r[3], sizeof(r[3]), s->ndim, s->shape);
	dims_text(r[4], sizeof(r[4]), s->ndim, s->local);
	snprintf(r[5], sizeof(r[5]), "%zu", bytes);
}

static void print_table(const struct table *t)
{
	int w[NCOL];
	for (int k = 0; k < NCOL; k++) {
		w[k] = (int)strlen(header[k]);
		for (int i = 0; i < t->n; i++)
			if ((int)strlen(t->cell[i][k]) > w[k])
				w[k] = (int)strlen(t->cell[i][k]);
	}
	for (int k = 0; k < NCOL; k++)
		printf(k < NCOL - 1 ? "%-*s  " : "%*s\n", w[k], header[k]);
	for (int i = 0; i < t->n; i++)
		for (int k = 0; k < NCOL; k++)
			printf(k < NCOL - 1 ? "%-*s  " : "%*s\n", w[k], t->cell[i][k]);
}

static void print_linears(const struct model_linear_info *li, int n)
{
	static const char *const head[7] = {
		"linear", "weight", "gather (fsdp)", "fwd all-reduce", "bwd dx all-reduce",
		"dW reduce-scatter", "dW sum at step end",
	};
	char cell[MODEL_MAX_PARAMS][7][96];
	int w[7];
	for (int k = 0; k < 7; k++)
		w[k] = (int)strlen(head[k]);
	for (int i = 0; i < n; i++) {
		uint32_t v[5] = { li[i].gather, li[i].reduce, li[i].dx_reduce, li[i].dw_scatter, li[i].gsum };
		snprintf(cell[i][0], sizeof(cell[i][0]), "%s", li[i].name);
		snprintf(cell[i][1], sizeof(cell[i][1]), "%s", li[i].weight);
		for (int k = 0; k < 5; k++)
			plan_mask_text(v[k], cell[i][2 + k], sizeof(cell[i][2 + k]));
		for (int k = 0; k < 7; k++)
			if ((int)strlen(cell[i][k]) > w[k])
				w[k] = (int)strlen(cell[i][k]);
	}
	for (int k = 0; k < 7; k++)
		printf("%-*s%s", k < 6 ? w[k] : 0, head[k], k < 6 ? "  " : "\n");
	for (int i = 0; i < n; i++)
		for (int k = 0; k < 7; k++)
			printf("%-*s%s", k < 6 ? w[k] : 0, cell[i][k], k < 6 ? "  " : "\n");
}

static void print_total(const char *what, size_t bytes)
{
	printf("total %s: %zu bytes per device (%.2f MiB)\n", what, bytes, bytes / 1048576.0);
}

/* One activation: [batch, length, width] with its logical names. */
static int add_activation(struct table *t, const struct shard_rules *r, const struct mesh *m,
			  const char *name, int batch, int length, int width, const char *wname,
			  int head_dim, char *err, size_t errlen)
{
	const char *logical[3] = { "activation_batch", "activation_length", wname };
	int shape[3] = { batch, length, width }, unit[3];
	struct shard_spec s;
	shard_head_units(3, logical, head_dim, unit);
	int rc = shard_resolve(r, m, name, 3, shape, unit, logical, &s, err, errlen);
	if (rc)
		return rc;
	add_row(t, name, logical, &s, s.local_bytes);
	return 0;
}

/* Latent attention's (docs/deepseek.md): the latents, whole on every
 * device but the batch's split, and the per-head [no-rope key | value]
 * and attention output. */
static int mla_activations(struct table *t, const struct shard_rules *r, const struct mesh *m,
			   const struct model_dims *d, int batch, char *err, size_t errlen)
{
	int kd = d->Dn + d->Dv;
	return (d->Rq && add_activation(t, r, m, "q_latent", batch, d->T, d->Rq, NULL, 1, err, errlen)) ||
	       add_activation(t, r, m, "kv_latent", batch, d->T, d->Rkv + d->Dr, NULL, 1, err, errlen) ||
	       add_activation(t, r, m, "k_nope_v", batch, d->T, d->Hq * kd, "activation_heads", kd, err, errlen) ||
	       add_activation(t, r, m, "attention", batch, d->T, d->Hq * d->Dv, "activation_heads", d->Dv, err,
			      errlen);
}

/* With a pipeline over `stage`: which layers each stage stores. Stacked
 * tensors keep their layers in stage order (host/model/model.h), so the
 * block of `layers` split over `stage` is what the stage runs. */
static void print_stage_order(const struct cfg *c, const struct model_dims *d)
{
	struct pipe_config pc;
	char why[512];
	if (c->ici[AX_STAGE] * c->dcn[AX_STAGE] <= 1)
		return;
	if (pipe_config_resolve(&pc, c, d, why, sizeof(why))) {
		printf("pipeline: %s\n", why);
		return;
	}
	int S = pc.shape.stages, R = pc.shape.repeats, lps = pc.shape.layers_per_stage;
	if (R > 1)
		printf("pipeline: %d stages x %d repeats x %d layers per stage; stacked layers are stored "
		       "in stage order: stage s holds layers (r*%d + s)*%d .. +%d for r = 0..%d",
		       S, R, lps, S, lps, lps - 1, R - 1);
	else
		printf("pipeline: %d stages x %d layers per stage; stage s holds layers s*%d .. +%d", S,
		       lps, lps, lps - 1);
	printf(" (of the pipelined ones, from decoder layer %d), e.g. stage 0:", pc.first_layer);
	for (int r = 0; r < R && r < 4; r++)
		printf(" %d..%d", pc.first_layer + r * S * lps, pc.first_layer + r * S * lps + lps - 1);
	printf("%s\n", R > 4 ? " ..." : "");
}

int shardings_describe(struct cfg *c, int hosts, int devs, char *err, size_t errlen)
{
	int rc = -EINVAL;

	struct shard_rules *rules = malloc(sizeof(*rules));
	struct table *pt = malloc(sizeof(*pt)), *at = malloc(sizeof(*at)), *ot = malloc(sizeof(*ot));
	struct mesh m;
	struct model_dims d;
	struct model *model = NULL;
	if (!rules || !pt || !at || !ot) {
		snprintf(err, errlen, "shardings: out of memory");
		rc = -ENOMEM;
		goto out;
	}
	pt->n = at->n = ot->n = 0;
	if (!hosts)
		hosts = cfg_family_product(c, true);
	if (!devs)
		devs = cfg_family_product(c, false);
	if (cfg_finish(c, hosts, devs, err, errlen))
		goto out;
	mesh_init(&m, c);
	/* what the trainer refuses, refused here with the same line */
	if ((rc = train_check(c, &m, err, errlen))) {
		cfg_error_origins(c, err, errlen);
		if (rc != -ENOMEM)
			rc = -EINVAL;
		goto out;
	}
	rc = -EINVAL;
	if (model_dims_from_cfg(&d, c, err, errlen) || shard_rules_from_cfg(rules, c, err, errlen)) {
		cfg_error_origins(c, err, errlen);
		goto out;
	}
	/* device 0's plans: every device's shards have the same shapes */
	struct model_mesh mm = { .mesh = &m, .rules = rules, .device = 0 };
	int micro = 1;
	if (m.size[AX_STAGE] > 1) {
		/* a pipeline: its layer order, and the layers outside it (stored
		 * whole on every stage) */
		struct pipe_config pc;
		if (pipe_config_resolve(&pc, c, &d, err, errlen))
			goto out;
		pipe_config_model_mesh(&pc, &mm);
		micro = pc.shape.microbatches;
	}
	model = model_plan_new(&d, &mm, err, errlen);
	if (!model)
		goto out;
	bool muon = !strcmp(c->opt_type, "muon");
	int ndata = c->shard_optimizer_over_data ? m.size[AX_DATA] : 1;
	size_t ptotal = 0, ototal = 0;
	for (int i = 0; i < model_num_params(model); i++) {
		const struct param_info *p = model_param(model, i);
		const struct plan_param *pp = model_param_plan(model, i);
		struct shard_spec whole;
		const struct shard_spec *s = pp ? &pp->spec : &whole;
		if (!pp) {
			memset(&whole, 0, sizeof(whole));
			whole.ndim = p->ndim;
			for (int k = 0; k < p->ndim; k++)
				whole.shape[k] = whole.local[k] = p->global_shape[k];
		}
		size_t bytes = p->numel * sizeof(float);
		add_row(pt, p->name, p->axes, s, bytes);
		ptotal += bytes;

		/* the optimizer's own count (train_check refused Muon beside ZeRO-1) */
		int slots;
		bool zero;
		size_t ob = optim_tensor_state(p, muon, ndata, &slots, &zero) * sizeof(float);
		if (!slots)
			continue;
		char name[64];
		snprintf(name, sizeof(name), "%.47s.%s%s", p->name, slots == 2 ? "m+v" : "m", zero ? " /data" : "");
		add_row(ot, name, p->axes, s, ob);
		ototal += ob;
	}
	struct model_linear_info li[MODEL_MAX_PARAMS];
	int nl = model_linears(model, li, MODEL_MAX_PARAMS);
	/* MaxText's global batch: per_device_batch_size on every device */
	int batch = (int)c->per_device_batch_size * m.num_devices;
	if (add_activation(at, rules, &m, "embed_out", batch, d.T, d.C, "activation_embed", d.D, err, errlen) ||
	    add_activation(at, rules, &m, "q", batch, d.T, d.Hq * d.D, "activation_heads", d.D, err, errlen) ||
	    (d.mla && mla_activations(at, rules, &m, &d, batch, err, errlen)) ||
	    add_activation(at, rules, &m, "mlp_hidden", batch, d.T, d.F, "activation_mlp", d.D, err, errlen) ||
	    add_activation(at, rules, &m, "logits", batch, d.T, d.V, "activation_vocab", d.D, err, errlen))
		goto out;
	/* a device computes on the global batch's share of the axes that
	 * split the rows, one microbatch of it at a time in a pipeline */
	int rows = batch / mesh_axes_size(&m, model_rows_axes(model)) / micro;
	size_t act = model_activation_bytes(model, rows);

	printf("mesh: %d host%s x %d device%s = %d;", m.num_hosts, m.num_hosts == 1 ? "" : "s",
	       m.devices_per_host, m.devices_per_host == 1 ? "" : "s", m.num_devices);
	int shown = 0;
	for (int a = 0; a < AX_COUNT; a++)
		if (m.size[a] > 1)
			printf(" %s=%d", mesh_axis_names[a], m.size[a]), shown++;
	printf("%s\n", shown ? "" : " every axis 1");
	print_stage_order(c, &d);
	printf("rules: %d from logical_axis_rules%s%s\n", c->logical_axis_rules.n,
	       c->custom_mesh_and_rule[0] ? ", custom_mesh_and_rule=" : "", c->custom_mesh_and_rule);
	printf("\nparameters\n");
	print_table(pt);
	print_total("parameters", ptotal);
	printf("\nactivations (batch = per_device_batch_size %lld x %d devices = %d)\n",
	       c->per_device_batch_size, m.num_devices, batch);
	print_table(at);
	printf("model activations and backward scratch: %zu bytes per device (%.2f MiB; %d rows of %d "
	       "tokens, every layer's saved activations%s)\n", act, act / 1048576.0, rows, d.T,
	       d.bsplit > 1 ? ", in the batch split's two halves" : "");
	printf("\nlinear layers (the planner's decisions, host/mesh/plan.c; axes, or none)\n");
	print_linears(li, nl);
	printf("\noptimizer state (%s; %s)\n",
	       muon ? "muon: momentum m for matrices, adamw m+v for the rest"
		    : "adamw: m+v per parameter",
	       ndata > 1 ? "shard_optimizer_over_data: state of gradients summed over data split flat "
			   "over data (/data), average bytes shown"
			 : "sharded like the parameters");
	print_table(ot);
	print_total("optimizer state", ototal);
	rc = 0;
out:
	model_free(model);
	free(rules);
	free(pt);
	free(at);
	free(ot);
	return rc;
}
