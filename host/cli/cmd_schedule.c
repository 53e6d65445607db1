/* `meshrun schedule`: prints the step a config describes without running
 * it: the schedule's per-stage action lists (compact), a stage x time
 * grid in unit slots (F, I, W costs from --costs), the bubble against
 * its formula, the circular schedule's lockstep iterations, each weight
 * mode's gathers and window, and each stage's peak of saved microbatch
 * activations and buffers in bytes. Everything is read off the table
 * pipe_table_build builds, which is what the executor runs. */
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
#include "host/perf/perf.h"
#include "host/pipeline/pipe_config.h"
#include "host/pipeline/schedule.h"

/* Widest line a wrapped row takes. */
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

/* Rows of cells (row r, column c: cell[r * cols + c], width w), wrapped
 * into blocks of columns under a header of column numbers. */
static void print_rows(char (*cell)[16], int rows, int cols, int w, const char *head, const char *label)
{
	char lab[32];
	int lw = snprintf(lab, sizeof(lab), "%s %d", label, rows - 1);
	lw = lw < (int)strlen(head) ? (int)strlen(head) : lw;
	if (snprintf(lab, sizeof(lab), "%d", cols - 1) > w)
		w = (int)strlen(lab);
	int per = (TABLE_WIDTH - lw) / (w + 1);
	per = per < 1 ? 1 : per;
	for (int c0 = 0; c0 < cols; c0 += per) {
		int c1 = c0 + per < cols ? c0 + per : cols;
		printf("%-*s", lw, head);
		for (int c = c0; c < c1; c++)
			printf(" %*d", w, c);
		printf("\n");
		for (int r = 0; r < rows; r++) {
			snprintf(lab, sizeof(lab), "%s %d", label, r);
			printf("%-*s", lw, lab);
			for (int c = c0; c < c1; c++)
				printf(" %*s", w, cell[(size_t)r * cols + c]);
			printf("\n");
		}
		if (c1 < cols)
			printf("\n");
	}
}

/* The circular schedule's lockstep iterations (MaxText's picture): each
 * stage's forward of microbatch.repeat at each iteration. */
static int print_lockstep(const struct pipe_table *t)
{
	int S = t->shape.stages, T = t->iterations, w = 1;
	char (*cell)[16] = calloc((size_t)S * (size_t)T, sizeof(*cell));
	if (!cell)
		return -ENOMEM;
	for (int i = 0; i < S * T; i++)
		strcpy(cell[i], ".");
	for (int s = 0; s < S; s++)
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			if (a->op != PA_F)
				continue;
			int len = snprintf(cell[(size_t)s * T + a->iter], sizeof(cell[0]), "%d.%d", a->mb, a->chunk / S);
			w = len > w ? len : w;
		}
	const struct pipe_shape *p = &t->shape;
	printf("\nlockstep iterations (MaxText's): T = R*M + d*(S-1) = %d*%d + %d*%d = %d; d*(S-1)/T = %d/%d = %.3f\n",
	       p->repeats, p->microbatches, p->delay, S - 1, T, p->delay * (S - 1), T,
	       (double)(p->delay * (S - 1)) / T);
	printf("forward: microbatch.repeat of each stage and iteration (. idle); the backward runs the same "
	       "slots from iteration %d down to 0\n", T - 1);
	print_rows(cell, S, T, w, "iteration", "stage");
	free(cell);
	return 0;
}

/* One action as a short token, or NULL for those the timeline leaves
 * out (transfers, weights). */
static const char *token(const struct pipe_table *t, const struct pipe_action *a, char *buf, size_t len)
{
	int v = t->nchunks / t->shape.stages, k = t->shape.sched == PIPE_ZBV ? a->chunk >= t->shape.stages
									       : a->chunk / t->shape.stages;
	switch (a->op) {
	case PA_F:
	case PA_B:
	case PA_I:
	case PA_W:
	case PA_FC:
		if (v > 1)
			snprintf(buf, len, "%s%d.%d", a->op == PA_FC ? "f" : pipe_act_name(a->op), a->mb, k);
		else
			snprintf(buf, len, "%s%d", a->op == PA_FC ? "f" : pipe_act_name(a->op), a->mb);
		return buf;
	case PA_EMBED:
		snprintf(buf, len, "E%d", a->mb);
		return a->val.pass ? NULL : buf;
	case PA_HEAD:
		snprintf(buf, len, "H%d", a->mb);
		return buf;
	case PA_EMBED_BACK:
		snprintf(buf, len, "e%d", a->mb);
		return buf;
	case PA_COUNT_SUM:
		return "sum";
	default:
		return NULL;
	}
}

static void print_timeline(const struct pipe_table *t)
{
	printf("\nactions of each stage in order (F forward, B backward, I and W its input and weight halves, "
	       "f counting forward, E embed, H head and loss, e embedding backward, sum expert-count sum; "
	       "mb%s)\n", t->nchunks > t->shape.stages ? ".chunk of the stage" : "");
	for (int s = 0; s < t->shape.stages; s++) {
		int col = printf("  stage %d:", s);
		for (int k = 0; k < t->n[s]; k++) {
			char buf[24];
			const char *tok = token(t, &t->a[s][k], buf, sizeof(buf));
			if (!tok)
				continue;
			if (col + (int)strlen(tok) + 1 > TABLE_WIDTH)
				col = printf("\n           ") - 1;
			col += printf(" %s", tok);
		}
		printf("\n");
	}
}

/* The stage x time grid in unit slots: each compute action fills its
 * cost's slots with its letter. */
static int print_grid(const struct pipe_table *t)
{
	int S = t->shape.stages, T = (int)(t->makespan + 0.5);
	if (T <= 0)
		return 0;
	char (*cell)[16] = calloc((size_t)S * (size_t)T, sizeof(*cell));
	if (!cell)
		return -ENOMEM;
	for (int i = 0; i < S * T; i++)
		strcpy(cell[i], ".");
	for (int s = 0; s < S; s++)
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			const char *l = a->op == PA_FC ? "f" : pipe_act_name(a->op);
			if (a->t1 <= a->t0 || strlen(l) > 1)
				continue;
			for (int u = (int)(a->t0 + 0.5); u < (int)(a->t1 + 0.5) && u < T; u++)
				strcpy(cell[(size_t)s * T + u], l);
		}
	printf("\ntime in unit slots (F %g, B %g, I %g, W %g; . idle)\n", t->costs.f, t->costs.b, t->costs.i,
	       t->costs.w);
	print_rows(cell, S, T, 1, "slot", "stage");
	free(cell);
	return 0;
}

static void print_bubble(const struct pipe_table *t)
{
	const struct pipe_shape *p = &t->shape;
	double f = pipe_bubble_formula(p), b = pipe_table_bubble(t);
	printf("\nbubble: %.3f of the longest stage span (%g slots; the step with a barrier at both ends: %g)",
	       b, t->period, t->makespan);
	switch (p->sched) {
	case PIPE_CIRCULAR:
	case PIPE_INTERLEAVED:
		printf("; formula (S-1)/(v*M+S-1) = %d/%d = %.3f", p->stages - 1,
		       p->repeats * p->microbatches + p->stages - 1, f);
		break;
	case PIPE_GPIPE:
	case PIPE_1F1B:
		printf("; formula (S-1)/(M+S-1) = %d/%d = %.3f", p->stages - 1, p->microbatches + p->stages - 1, f);
		break;
	case PIPE_ZB_H1:
		printf("; formula: (S-1)(F+I-W) = %g idle slots a stage, %.3f at F=I=W",
		       (p->stages - 1) * (t->costs.f + t->costs.i - t->costs.w), f);
		break;
	case PIPE_ZBV:
		printf("; formula: 0 when M >= 2S and F = I = W");
		break;
	default:
		break;
	}
	if (t->count_pass)
		printf("; the counting pass (MoE) comes first and is counted");
	printf("\n");
}

/* The schedule's weight traffic and memory in each mode it takes. */
static int print_weights(const struct pipe_config *pc, const struct layer_bytes *lb)
{
	char axes[64], err[256];
	int lps = pc->shape.layers_per_stage;
	size_t copy = (size_t)lps * lb->gathered, own = (size_t)lps * lb->stored;
	size_t moved = copy - own;
	plan_mask_text(lb->gather, axes, sizeof(axes));
	printf("\nweights of one chunk, per device: %zu bytes stored, %zu gathered ", own, copy);
	if (lb->gather)
		printf("(over %s; %zu received per gather)\n", axes, moved);
	else
		printf("(no FSDP axes: a gather moves nothing)\n");
	printf("  %-30s %8s %16s %8s %16s %16s\n", "mode", "gathers", "received bytes", "r-scat", "sent bytes",
	       "weight window");
	for (int w = PIPE_W_ITER; w <= PIPE_W_REPEAT; w++) {
		struct pipe_shape p = pc->shape;
		struct pipe_table t;
		struct pipe_stats st = { 0 }, one;
		p.wmode = (enum pipe_wmode)w;
		if (pipe_shape_check(&p, err, sizeof(err)))
			continue;  /* a mode this schedule does not take */
		int rc = pipe_table_build(&t, &p, err, sizeof(err));
		if (rc) {
			cli_error("schedule", "%s", err);
			return rc;
		}
		for (int s = 0; s < p.stages; s++) {
			pipe_stage_stats(&t, s, &one);
			st.gathers = one.gathers > st.gathers ? one.gathers : st.gathers;
			st.reduce_scatters = one.reduce_scatters > st.reduce_scatters ? one.reduce_scatters
										       : st.reduce_scatters;
		}
		int windows = t.weight_windows;
		pipe_table_free(&t);
		char name[48];
		snprintf(name, sizeof(name), "%s%s", w == (int)pc->shape.wmode ? "* " : "  ",
			 pipe_wmode_name((enum pipe_wmode)w));
		printf("  %-30s %8d %16zu %8d %16zu %16zu\n", name, st.gathers, moved * (size_t)st.gathers,
		       st.reduce_scatters, moved * (size_t)st.reduce_scatters, copy * 2 * (size_t)windows);
	}
	printf("  (per step and device of a stage; * = this config; the window is the gathered weight "
	       "copies and their gradient buffers, as the executor allocates them; besides, one gather's "
	       "and one reduce-scatter's packed buffers)\n");
	return 0;
}

static int print_memory(const struct pipe_table *t, const struct shard_spec *in, size_t layer_act,
			size_t layer_stash)
{
	size_t act = in->local_bytes;
	int S = t->shape.stages, lps = t->shape.layers_per_stage;
	bool split = pipe_split_backward(t->shape.sched);
	size_t most = 0;
	printf("\nmemory per device of each stage (a microbatch's chunk input: %d rows x %d x %d floats = %zu "
	       "bytes; one layer's saved activations for it: about %zu bytes", in->local[0], in->local[1],
	       in->local[2], act, layer_act);
	if (split)
		printf("; one layer's stash of the split backward: %zu bytes", layer_stash);
	printf(")\n  %-6s %10s %8s %8s %8s %8s %8s %8s %16s\n", "stage", "peak saved", "formula", "buffers", "scratch",
	       "landing", "act sets", "stashes", "bytes");
	for (int s = 0; s < S; s++) {
		struct pipe_stats st;
		pipe_stage_stats(t, s, &st);
		int f = pipe_peak_formula(&t->shape, s);
		int land = pipe_landing_bufs(t, s, act);
		size_t bytes = act * (size_t)(t->bufs[s] + t->scratch[s] + land) +
			       layer_act * (size_t)lps * (size_t)t->act_sets[s] +
			       layer_stash * (size_t)lps * (size_t)t->w_stashes[s];
		most = bytes > most ? bytes : most;
		if (s >= 3 && s < S - 1) {
			if (s == 3)
				printf("  ...\n");
			continue;
		}
		char fs[16];
		snprintf(fs, sizeof(fs), f < 0 ? "-" : "%d", f);
		printf("  %-6d %10d %8s %8d %8d %8d %8d %8d %16zu\n", s, st.peak_saved, fs, t->bufs[s], t->scratch[s],
		       land, t->act_sets[s], t->w_stashes[s], bytes);
	}
	print_bytes("most on one device", most);
	printf("  (peak saved: chunk inputs held from their forward to their backward, in chunks; buffers: "
	       "every microbatch-sized value the stage holds, from the action that makes or receives it to "
	       "its last reader and the send's receipt; landing: buffers a receive posted ahead lands in while its own is "
	       "in use, up to %d of them, %u MiB at most, none on a stage that receives nothing; act sets: saved layer activations of %d layer%s each, %s)\n",
	       PIPE_LANDING, PIPE_LANDING_BYTES >> 20, lps, lps == 1 ? "" : "s", t->shape.recompute ? "one: each backward recomputes its forward"
							 : "one per chunk in flight");
	if (split)
		printf("  (stashes: the split backward's, one per chunk between its I and its W, holding its layers' "
		       "weight-gradient operands: their output gradients, %s)\n",
		       t->shape.recompute ? "and their inputs, since the activations are recomputed"
					  : "the inputs read in place from the activation set kept to the W");
	return 0;
}

/* Loads the config and resolves everything the printout needs. */
static int load(struct cfg *c, const char *path, char **kv, int nkv, struct model_dims *d,
		struct shard_rules *rules, struct mesh *m, struct pipe_config *pc, char *err, size_t errlen)
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

/* One microbatch's chunk input [rows, T, C] as the rules shard it. */
static int stage_input(const struct pipe_config *pc, const struct model_dims *d,
		       const struct shard_rules *rules, const struct mesh *m, struct shard_spec *out,
		       char *err, size_t errlen)
{
	const char *logical[3] = { "activation_batch", "activation_length", "activation_embed" };
	int shape[3] = { pc->microbatch_rows, d->T, d->C };
	return shard_resolve(rules, m, "stage_input", 3, shape, NULL, logical, out, err, errlen);
}

static void print_head(const struct pipe_config *pc, const struct model_dims *d, const struct mesh *m)
{
	const struct pipe_shape *p = &pc->shape;
	printf("pipeline: schedule %s, S=%d stages (ici %d x dcn %d), M=%d microbatches, v=%d chunk%s per stage, "
	       "Lps=%d layer%s per chunk, delay d=%d, recompute %s\n", pipe_sched_name(p->sched), p->stages,
	       m->ici[AX_STAGE], m->dcn[AX_STAGE], p->microbatches, p->repeats, p->repeats == 1 ? "" : "s",
	       p->layers_per_stage, p->layers_per_stage == 1 ? "" : "s", p->delay, p->recompute ? "on" : "off");
	if (p->sched == PIPE_INTERLEAVED && p->repeats > 1)
		printf("group: g=%d microbatches through a chunk before the next (pipeline_interleave_group%s); "
		       "stage s first runs 2(S-1-s) + (v-1)g forwards\n", pipe_group(p),
		       p->group && p->group != p->stages ? "" : ": the stages, the paper's order");
	printf("layers: %d pipelined (decoder layers %d..%d; chunk c runs layers c*Lps .. c*Lps+Lps-1 on stage %s)",
	       pc->layers, pc->first_layer, pc->first_layer + pc->layers - 1,
	       p->sched == PIPE_ZBV ? "c, or 2S-1-c for c >= S" : "c mod S");
	if (pc->layers_before)
		printf("; %d before the pipeline", pc->layers_before);
	if (pc->layers_after)
		printf("; %d after it", pc->layers_after);
	printf("; of %d\n", d->L);
	printf("owners: %s\n", pipe_phased(p) ? "microbatch m is embedded and its loss computed by stage m mod S "
					       "(with the layers outside the pipeline)" :
					       "the first chunk's stage embeds, the last chunk's computes the loss "
					       "(with the layers outside the pipeline)");
	printf("batch: %d rows (per_device_batch_size x %d devices); microbatch %d rows\n", pc->global_batch,
	       m->num_devices, pc->microbatch_rows);
}

/* --costs F:I:W: slots of a forward, input and weight backward. */
static int parse_costs(const char *s, struct pipe_costs *c)
{
	int f, i, w;
	char end;
	if (sscanf(s, "%d:%d:%d%c", &f, &i, &w, &end) != 3 || f < 1 || i < 1 || w < 1 || f > 100 || i > 100 ||
	    w > 100)
		return -EINVAL;
	*c = (struct pipe_costs){ .f = f, .i = i, .w = w, .b = i + w };
	return 0;
}

struct sched_args {
	const char *path;
	int nkv;
	struct pipe_costs costs;
	bool measured;  /* --costs measured */
};

static int parse_args(int argc, char **argv, struct sched_args *a)
{
	a->costs = pipe_costs_unit();
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			a->path = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			a->path = argv[i] + 9;
		else if ((!strcmp(argv[i], "--costs") && i + 1 < argc && (v = argv[++i])) ||
			 (!strncmp(argv[i], "--costs=", 8) && (v = argv[i] + 8))) {
			a->measured = !strcmp(v, "measured");
			if (!a->measured && parse_costs(v, &a->costs)) {
				return cli_usage_error("schedule", "--costs takes F:I:W (whole slots in [1, 100]) "
						       "or measured, got '%s'", v);
			}
		} else if (argv[i][0] != '-' && strchr(argv[i], '=')) {
			argv[1 + a->nkv++] = argv[i]; /* overrides, applied after the file */
		} else {
			return cli_usage_error("schedule", "unknown argument '%s'", argv[i]);
		}
	}
	if (!a->path)
		return cli_usage_error("schedule", "--config FILE is needed");
	return EXIT_OK;
}

static int describe(const struct pipe_config *pc, const struct model_dims *d, const struct mesh *m,
		    struct pipe_table *t, const struct shard_spec *in, const struct layer_bytes *lb,
		    const struct pipe_costs *costs, char *err, size_t errlen)
{
	struct pipe_costs c = *costs;
	if (pc->shape.recompute)
		c.b += c.f;  /* the backward runs the forward again first */
	c.i += pc->shape.recompute ? c.f : 0;
	int rc = pipe_table_simulate(t, &c, false, err, errlen);
	if (rc)
		return rc;
	print_head(pc, d, m);
	print_bubble(t);
	if (t->iterations && print_lockstep(t))
		return -ENOMEM;
	print_timeline(t);
	if (print_grid(t))
		return -ENOMEM;
	size_t layer_act = model_layer_act_bytes(d, pc->microbatch_rows, d->L_moe > 0);
	size_t layer_stash = model_layer_w_stash_bytes(d, pc->microbatch_rows, d->L_moe > 0, !pc->shape.recompute);
	if (print_weights(pc, lb) || print_memory(t, in, layer_act, layer_stash))
		return -ENOMEM;
	return 0;
}

/* --costs measured: a chunk's forward and backward timed here (one
 * layer at the microbatch, one OpenBLAS thread: meshrun plan's figures),
 * in slots of half a forward; I and W each half the backward. */
static int measured_costs(const struct cfg *c, const struct pipe_config *pc, const struct model_dims *d,
			  struct pipe_costs *out, char *err, size_t errlen)
{
	struct perf_compute m;
	int rc = perf_measure(c, pc->microbatch_rows, 1, 0, &m, err, errlen), k = d->L_moe > 0;
	if (rc)
		return rc;
	double unit = m.f_layer[k] / 2;
	int f = 2, b = (int)(m.b_layer[k] / unit + 0.5);
	b = b < 2 ? 2 : b > 200 ? 200 : b;
	*out = (struct pipe_costs){ .f = f, .b = b, .i = b / 2, .w = b - b / 2 };
	return 0;
}

int cmd_schedule(int argc, char **argv)
{
	struct sched_args a = { 0 };
	int rc = parse_args(argc, argv, &a);
	char err[1024];
	if (rc != EXIT_OK)
		return rc;
	struct cfg *c = malloc(sizeof(*c));
	struct shard_rules *rules = malloc(sizeof(*rules));
	struct pipe_table t = { 0 };
	struct model_dims d;
	struct mesh m;
	struct pipe_config pc;
	struct layer_bytes lb;
	struct shard_spec in;
	rc = EXIT_CONFIG;
	if (!c || !rules) {
		cli_error("schedule", "out of memory");
		rc = EXIT_FAIL;
		goto out;
	}
	if (load(c, a.path, argv + 1, a.nkv, &d, rules, &m, &pc, err, sizeof(err)) ||
	    stage_input(&pc, &d, rules, &m, &in, err, sizeof(err)) ||
	    layer_bytes(&lb, &d, rules, &m, err, sizeof(err)) ||
	    pipe_table_build(&t, &pc.shape, err, sizeof(err))) {
		cli_error("schedule", "%s", err);
		goto out;
	}
	if (a.measured && measured_costs(c, &pc, &d, &a.costs, err, sizeof(err))) {
		cli_error("schedule", "%s", err);
		rc = EXIT_FAIL;
		goto out;
	}
	rc = describe(&pc, &d, &m, &t, &in, &lb, &a.costs, err, sizeof(err)) ? EXIT_FAIL : EXIT_OK;
	if (rc != EXIT_OK)
		cli_error("schedule", "%s", err);
out:
	pipe_table_free(&t);
	free(c);
	free(rules);
	return rc;
}
