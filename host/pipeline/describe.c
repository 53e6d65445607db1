/* `meshrun schedule`: prints the pipeline a config describes without
 * running it: the forward table (microbatch.repeat per stage and
 * iteration), T and the bubble, and for each weight mode the gathers and
 * bytes per step and the memory they hold. Every count is read off the
 * table pipe_schedule_circular builds, so what is printed is what an
 * executor would run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/plan.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/pipeline/pipe_config.h"
#include "host/pipeline/schedule.h"

/* Widest line the stage x iteration table takes before it wraps. */
#define TABLE_WIDTH 100

/* One pipelined layer's weights on one device, in bytes. */
struct layer_bytes {
	size_t stored;   /* this device's shard */
	size_t gathered; /* after the FSDP all-gather (still split over tensor axes) */
	uint32_t gather; /* the axes gathered over */
};

/* Plans the tensors of one pipelined layer (MoE layer for an MoE model)
 * as the model would, their `layers` dimension one per stage. */
static int layer_bytes(struct layer_bytes *lb, const struct model_dims *d, const struct shard_rules *r,
		       const struct mesh *m, char *err, size_t errlen)
{
	struct model_dims one = *d;
	struct param_info tab[MODEL_MAX_PARAMS];
	bool moe = d->E > 1;
	one.L = 1;
	one.L_dense = moe ? 0 : 1;
	one.L_moe = moe ? 1 : 0;
	int n = model_param_table(&one, tab, MODEL_MAX_PARAMS);
	if (n < 0 || n > MODEL_MAX_PARAMS) {
		snprintf(err, errlen, "schedule: unable to list the layer's tensors");
		return n < 0 ? n : -EINVAL;
	}
	struct model_mesh mm = { .mesh = m, .rules = r, .device = 0 };
	uint32_t rows;
	int rc = model_plan_rows(&mm, d->C, &rows, err, errlen);
	if (rc)
		return rc;
	memset(lb, 0, sizeof(*lb));
	for (int i = 0; i < n; i++) {
		const struct param_info *p = &tab[i];
		if (!p->stacked)
			continue;
		int shape[MODEL_MAX_DIMS];
		struct plan_param pp;
		memcpy(shape, p->global_shape, sizeof(shape));
		shape[0] = m->size[AX_STAGE];
		rc = plan_param(&pp, r, m, p->name, p->ndim, shape, p->axes, p->head_dim, rows, err, errlen);
		if (rc)
			return rc;
		size_t st = sizeof(float), ga = sizeof(float);
		for (int k = 1; k < p->ndim; k++) {
			st *= (size_t)pp.spec.local[k];
			ga *= (size_t)pp.cshape[k];
		}
		lb->stored += st;
		lb->gathered += ga;
		lb->gather |= pp.gather;
	}
	return 0;
}

static void print_bytes(const char *label, size_t bytes)
{
	printf("  %-34s %12zu bytes (%.2f MiB)\n", label, bytes, bytes / 1048576.0);
}

/* The forward table from the schedule's PIPE_FORWARD entries, wrapped
 * into blocks of columns. */
static int print_table(const struct pipe_schedule *sc)
{
	int S = sc->shape.stages, T = sc->iterations;
	char (*cell)[16] = calloc((size_t)S * (size_t)T, sizeof(*cell));
	if (!cell)
		return -ENOMEM;
	int w = 1;
	for (int i = 0; i < S * T; i++)
		strcpy(cell[i], ".");
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->op != PIPE_FORWARD)
			continue;
		char *c = cell[(size_t)e->stage * T + e->iter];
		int len = snprintf(c, sizeof(cell[0]), "%d.%d", e->mb, e->repeat);
		if (len > w)
			w = len;
	}
	char label[32];
	int lw = snprintf(label, sizeof(label), "stage %d", S - 1);
	if (lw < 9)
		lw = 9; /* "iteration" */
	if (snprintf(label, sizeof(label), "%d", T - 1) > w)
		w = (int)strlen(label);
	int per = (TABLE_WIDTH - lw) / (w + 1);
	if (per < 1)
		per = 1;
	for (int i0 = 0; i0 < T; i0 += per) {
		int i1 = i0 + per < T ? i0 + per : T;
		printf("%-*s", lw, "iteration");
		for (int i = i0; i < i1; i++)
			printf(" %*d", w, i);
		printf("\n");
		for (int s = 0; s < S; s++) {
			snprintf(label, sizeof(label), "stage %d", s);
			printf("%-*s", lw, label);
			for (int i = i0; i < i1; i++)
				printf(" %*s", w, cell[(size_t)s * T + i]);
			printf("\n");
		}
		if (i1 < T)
			printf("\n");
	}
	free(cell);
	return 0;
}

static void print_head(const struct pipe_config *pc, const struct model_dims *d, const struct mesh *m)
{
	const struct pipe_shape *p = &pc->shape;
	int S = p->stages, M = p->microbatches, R = p->repeats, dl = p->delay;
	int T = pipe_iterations(p);
	printf("pipeline: S=%d stages (ici %d x dcn %d), M=%d microbatches, R=%d repeats, "
	       "Lps=%d layer%s per stage, delay d=%d\n", S, m->ici[AX_STAGE], m->dcn[AX_STAGE], M, R,
	       p->layers_per_stage, p->layers_per_stage == 1 ? "" : "s", dl);
	printf("layers: %d pipelined (decoder layers %d..%d; repeat r of stage s runs (r*S + s)*Lps + j)",
	       pc->layers, pc->first_layer, pc->first_layer + pc->layers - 1);
	if (pc->layers_before)
		printf("; %d before the pipeline", pc->layers_before);
	if (pc->layers_after)
		printf("; %d after it", pc->layers_after);
	printf("; of %d\n", d->L);
	if (pc->layers_before || pc->layers_after)
		printf("outside the pipeline: layers run data-parallel over stage (each microbatch's "
		       "owner, with its embedding and head); stored whole on every stage\n");
	printf("batch: %d rows (per_device_batch_size x %d devices); microbatch %d rows\n",
	       pc->global_batch, m->num_devices, pc->microbatch_rows);
	printf("iterations: T = R*M + d*(S-1) = %d*%d + %d*%d = %d\n", R, M, dl, S - 1, T);
	printf("bubble: d*(S-1)/T = %d/%d = %.3f\n", dl * (S - 1), T, (double)(dl * (S - 1)) / T);
}

/* The schedule's weight traffic and memory in each mode. */
static int print_weights(const struct pipe_config *pc, const struct layer_bytes *lb)
{
	char axes[64], err[256];
	int lps = pc->shape.layers_per_stage;
	size_t copy = (size_t)lps * lb->gathered, own = (size_t)lps * lb->stored;
	size_t moved = copy - own;
	plan_mask_text(lb->gather, axes, sizeof(axes));
	printf("\nweights of one stage and repeat, per device: %zu bytes stored, %zu gathered ", own, copy);
	if (lb->gather)
		printf("(over %s; %zu received per gather)\n", axes, moved);
	else
		printf("(no FSDP axes: a gather moves nothing)\n");
	printf("  %-30s %8s %16s %8s %16s %16s\n", "mode", "gathers", "received bytes",
	       "r-scat", "sent bytes", "weight window");
	for (int w = 0; w < PIPE_W_COUNT; w++) {
		struct pipe_shape p = pc->shape;
		struct pipe_schedule sc;
		struct pipe_stats st;
		p.wmode = (enum pipe_wmode)w;
		int rc = pipe_schedule_circular(&sc, &p, err, sizeof(err));
		if (rc) {
			cli_error("schedule", "%s", err);
			return rc;
		}
		pipe_schedule_stats(&sc, &st);
		pipe_schedule_release(&sc);
		char name[48];
		snprintf(name, sizeof(name), "%s%s", w == (int)pc->shape.wmode ? "* " : "  ",
			 pipe_wmode_name((enum pipe_wmode)w));
		printf("  %-30s %8d %16zu %8d %16zu %16zu\n", name, st.gathers, moved * (size_t)st.gathers,
		       st.reduce_scatters, moved * (size_t)st.reduce_scatters,
		       copy * (size_t)(st.max_weights + st.max_grads));
	}
	printf("  (per step and device of a stage; * = this config; the window is the gathered "
	       "weight copies plus gradient buffers live at most,\n   as the executor allocates "
	       "them; besides, one gather's and one reduce-scatter's packed buffers)\n");
	return 0;
}

static int print_memory(const struct pipe_schedule *sc, const struct shard_spec *in)
{
	struct pipe_stats st;
	struct pipe_bufs b;
	size_t act = in->local_bytes;
	int S = sc->shape.stages, most = 0;
	pipe_schedule_stats(sc, &st);
	if (st.max_circ < 0)
		return -ENOMEM;
	printf("\nactivations per device (one microbatch's stage input: %d rows x %d x %d floats = "
	       "%zu bytes), the executor's buffers\n", in->local[0], in->local[1], in->local[2], act);
	printf("  %-6s %6s %6s %6s %16s %8s %8s %16s\n", "stage", "saved", "out", "grad",
	       "owned (x4 bufs)", "scratch", "buffers", "bytes");
	for (int s = 0; s < S; s++) {
		if (pipe_stage_bufs(sc, s, &b, NULL, NULL))
			return -ENOMEM;
		if (pipe_bufs_total(&b) > most)
			most = pipe_bufs_total(&b);
		if (s >= 3 && s < S - 1) {
			if (s == 3)
				printf("  ...\n");
			continue;
		}
		printf("  %-6d %6d %6d %6d %16d %8d %8d %16zu\n", s, b.saved, b.out, b.grad, b.owned,
		       b.scratch, pipe_bufs_total(&b), act * (size_t)pipe_bufs_total(&b));
	}
	print_bytes("most on one device", act * (size_t)most);
	printf("  (saved: each active slot's stage input, R x M; out and grad: held until the "
	       "receiver took them, then reused; owned: the microbatches m with m mod S = s)\n");
	printf("  circular storage: stage %d's outputs waiting for stage 0, at most %d (in its out "
	       "buffers), and stage 0's gradients waiting for stage %d, at most %d (in its grad "
	       "buffers): sends wait for the receiver\n", S - 1, st.max_circ, S - 1, st.max_circ_grad);
	printf("  besides these, the model keeps the per-layer activations of one microbatch through "
	       "the %d layer%s a stage runs at once (each slot's forward is recomputed in its backward)\n",
	       sc->shape.layers_per_stage, sc->shape.layers_per_stage == 1 ? "" : "s");
	return 0;
}

/* Loads the config and resolves everything the printout needs. */
static int load(struct cfg *c, const char *path, char **kv, int nkv, struct model_dims *d,
		struct shard_rules *rules, struct mesh *m, struct pipe_config *pc,
		char *err, size_t errlen)
{
	cfg_defaults(c);
	int rc = cfg_load_file(c, path, err, errlen);
	for (int i = 0; !rc && i < nkv; i++)
		rc = cfg_override(c, kv[i], err, errlen);
	if (!rc)
		rc = cfg_finish(c, cfg_family_product(c, true), cfg_family_product(c, false), err, errlen);
	if (!rc)
		rc = model_dims_from_cfg(d, c, err, errlen);
	if (!rc)
		rc = shard_rules_from_cfg(rules, c, err, errlen);
	if (rc)
		return rc;
	mesh_init(m, c);
	return pipe_config_resolve(pc, c, d, err, errlen);
}

/* One microbatch's stage input [rows, T, C] as the rules shard it. */
static int stage_input(const struct pipe_config *pc, const struct model_dims *d,
		       const struct shard_rules *rules, const struct mesh *m, struct shard_spec *out,
		       char *err, size_t errlen)
{
	const char *logical[3] = { "activation_batch", "activation_length", "activation_embed" };
	int shape[3] = { pc->microbatch_rows, d->T, d->C };
	return shard_resolve(rules, m, "stage_input", 3, shape, NULL, logical, out, err, errlen);
}

int cmd_schedule(int argc, char **argv)
{
	const char *path = NULL;
	int nkv = 0, rc = EXIT_CONFIG;
	char err[1024];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			path = argv[++i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9;
		} else if (argv[i][0] != '-' && strchr(argv[i], '=')) {
			argv[1 + nkv++] = argv[i]; /* overrides, applied after the file */
		} else {
			return cli_usage_error("schedule", "unknown argument '%s'", argv[i]);
		}
	}
	if (!path)
		return cli_usage_error("schedule", "--config FILE is needed");
	struct cfg *c = malloc(sizeof(*c));
	struct shard_rules *rules = malloc(sizeof(*rules));
	struct pipe_schedule sc = { 0 };
	struct model_dims d;
	struct mesh m;
	struct pipe_config pc;
	struct layer_bytes lb;
	struct shard_spec in;
	if (!c || !rules) {
		cli_error("schedule", "out of memory");
		rc = EXIT_FAIL;
		goto out;
	}
	if (load(c, path, argv + 1, nkv, &d, rules, &m, &pc, err, sizeof(err)) ||
	    stage_input(&pc, &d, rules, &m, &in, err, sizeof(err)) ||
	    layer_bytes(&lb, &d, rules, &m, err, sizeof(err)) ||
	    pipe_schedule_circular(&sc, &pc.shape, err, sizeof(err))) {
		cli_error("schedule", "%s", err);
		goto out;
	}
	rc = EXIT_FAIL;
	print_head(&pc, &d, &m);
	printf("\nforward: microbatch.repeat of each stage and iteration (. idle)\n");
	if (print_table(&sc))
		goto out;
	printf("backward: the same slots from iteration %d down to 0; each recomputes its stage's "
	       "forward from the saved input, then back-propagates; input gradients go to stage s-1 "
	       "(from stage 0 to stage %d for repeats > 0)\n", sc.iterations - 1, pc.shape.stages - 1);
	if (print_weights(&pc, &lb) || print_memory(&sc, &in))
		goto out;
	rc = EXIT_OK;
out:
	pipe_schedule_release(&sc);
	free(c);
	free(rules);
	return rc;
}
