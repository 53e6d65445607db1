/* What every part of the schedule shares (see schedule.h): the shape's
 * checks, where chunks and microbatches live, the formulas, what a table
 * costs a stage, and names. Calls nothing of the other schedule files. */
#include "host/pipeline/schedule.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tables past this many compute actions (per stage) are a typo, not a
 * pipeline; message indices must fit 16 bits. */
#define PIPE_MAX_ACTIONS (1 << 20)
#define PIPE_MAX_MSG (1 << 16)

static const char *const sched_names[PIPE_SCHED_COUNT] = {
	"circular", "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv",
};

const char *pipe_sched_name(enum pipe_sched s)
{
	return s >= 0 && s < PIPE_SCHED_COUNT ? sched_names[s] : "?";
}

int pipe_sched_parse(const char *name)
{
	for (int s = 0; s < PIPE_SCHED_COUNT; s++)
		if (!strcmp(name, sched_names[s]))
			return s;
	return -1;
}

int pipe_group(const struct pipe_shape *p)
{
	return p->group > 0 ? p->group : p->stages;
}

bool pipe_split_backward(enum pipe_sched s)
{
	return s == PIPE_ZB_H1 || s == PIPE_ZBV;
}

int pipe_nchunks(const struct pipe_shape *p)
{
	return p->sched == PIPE_ZBV ? 2 * p->stages : p->stages * p->repeats;
}

int pipe_chunk_stage(const struct pipe_shape *p, int c)
{
	int S = p->stages;
	if (p->sched == PIPE_ZBV)
		return c < S ? c : 2 * S - 1 - c;
	return c % S;
}

bool pipe_phased(const struct pipe_shape *p)
{
	return p->sched == PIPE_CIRCULAR || p->sched == PIPE_GPIPE;
}

int pipe_embed_stage(const struct pipe_shape *p, int mb)
{
	return pipe_phased(p) ? mb % p->stages : pipe_chunk_stage(p, 0);
}

int pipe_head_stage(const struct pipe_shape *p, int mb)
{
	return pipe_phased(p) ? mb % p->stages : pipe_chunk_stage(p, pipe_nchunks(p) - 1);
}

int pipe_layer(const struct pipe_shape *p, int repeat, int stage, int j)
{
	return (repeat * p->stages + stage) * p->layers_per_stage + j;
}

int pipe_iterations(const struct pipe_shape *p)
{
	return p->repeats * p->microbatches + p->delay * (p->stages - 1);
}

bool pipe_active(const struct pipe_shape *p, int i, int s, int *mb, int *repeat)
{
	int k = i - p->delay * s;
	if (k < 0 || k >= p->repeats * p->microbatches)
		return false;
	*mb = k % p->microbatches;
	*repeat = k / p->microbatches;
	return true;
}

int pipe_weight_slots(const struct pipe_shape *p)
{
	int v = pipe_nchunks(p) / p->stages;
	switch (p->wmode) {
	case PIPE_W_ONCE:
		return v;
	case PIPE_W_REPEAT:
	case PIPE_W_AHEAD:
		return v < 2 ? v : 2;
	default:
		return 1;
	}
}

int pipe_weight_windows(const struct pipe_shape *p)
{
	return p->wmode == PIPE_W_AHEAD ? 1 : pipe_weight_slots(p);
}

bool pipe_needs_count_pass(const struct pipe_shape *p)
{
	return p->moe && p->sched != PIPE_CIRCULAR && p->sched != PIPE_GPIPE;
}

/* One line naming the shape and why it cannot run. */
static int refuse(const struct pipe_shape *p, char *err, size_t errlen, const char *why)
{
	char g[24] = "";
	if (p->group)
		snprintf(g, sizeof(g), " g=%d", p->group);
	snprintf(err, errlen, "pipeline: %s S=%d M=%d v=%d%s Lps=%d d=%d: %s", pipe_sched_name(p->sched),
		 p->stages, p->microbatches, p->repeats, g, p->layers_per_stage, p->delay, why);
	return -EINVAL;
}

int pipe_shape_check(const struct pipe_shape *p, char *err, size_t errlen)
{
	int S = p->stages, M = p->microbatches, v = p->repeats;
	if (p->sched < 0 || p->sched >= PIPE_SCHED_COUNT)
		return refuse(p, err, errlen, "unknown schedule");
	if (p->group && p->sched != PIPE_INTERLEAVED)
		return refuse(p, err, errlen, "a group of microbatches a chunk is for interleaved_1f1b");
	if (S < 1 || S > 4096)
		return refuse(p, err, errlen, "stages must be in [1, 4096]");
	if (M < 1 || v < 1 || p->layers_per_stage < 1)
		return refuse(p, err, errlen, "microbatches, chunks and layers per chunk must be >= 1");
	if (p->wmode < 0 || p->wmode >= PIPE_W_COUNT)
		return refuse(p, err, errlen, "unknown weight mode");
	if (p->delay != 1 && (p->delay != 2 || p->sched != PIPE_CIRCULAR))
		return refuse(p, err, errlen, "the delay is 1, or 2 for the circular schedule");
	if ((long long)M * pipe_nchunks(p) * 4 > PIPE_MAX_ACTIONS ||
	    (long long)(pipe_nchunks(p) + 1) * M * 2 > PIPE_MAX_MSG)
		return refuse(p, err, errlen, "the table would be too large");
	switch (p->sched) {
	case PIPE_CIRCULAR:
		if (M % S)
			return refuse(p, err, errlen, "microbatches must be a multiple of the stages");
		if (p->delay == 2 && M < 2 * S)
			return refuse(p, err, errlen, "a delay of 2 needs at least 2 x stages microbatches");
		break;
	case PIPE_INTERLEAVED: {
		int g = pipe_group(p);
		if (p->group && (g < S || g > M))
			return refuse(p, err, errlen, "the group of microbatches a chunk runs at a time must be "
				      "in [stages, microbatches]");
		if (M % g && M % g < S)
			return refuse(p, err, errlen, g == S ? "microbatches must be a multiple of the stages"
				      : "the last group (microbatches mod the group) must be 0 or >= the stages");
		break;
	}
	case PIPE_ZBV:
		if (v != 2)
			return refuse(p, err, errlen, "zbv runs two chunks per stage");
		break;
	default:
		if (v != 1)
			return refuse(p, err, errlen, "the schedule runs one chunk per stage");
	}
	if (p->wmode == PIPE_W_REPEAT && p->sched != PIPE_CIRCULAR && v > 2)
		return refuse(p, err, errlen, "two gathered chunks cannot follow an interleaved order of more");
	if (p->one_device && (S != 1 || M != 1 || p->recompute))
		return refuse(p, err, errlen, "the step without a pipeline is one stage, one microbatch, no recompute");
	return 0;
}

struct pipe_costs pipe_costs_unit(void)
{
	return (struct pipe_costs){ .f = 1, .b = 2, .i = 1, .w = 1 };
}

double pipe_bubble_formula(const struct pipe_shape *p)
{
	double S = p->stages, M = p->microbatches, v = p->repeats;
	switch (p->sched) {
	case PIPE_CIRCULAR:
	case PIPE_INTERLEAVED:
		return (S - 1) / (v * M + S - 1);
	case PIPE_GPIPE:
	case PIPE_1F1B:
		return (S - 1) / (M + S - 1);
	case PIPE_ZB_H1:
		/* (S-1)(F+I-W) idle of a span of 3M + that, F = I = W = 1 */
		return (S - 1) / (3 * M + S - 1);
	case PIPE_ZBV:
		return M >= 2 * S ? 0 : -1;
	default:
		return -1;
	}
}

int pipe_peak_formula(const struct pipe_shape *p, int s)
{
	int S = p->stages, M = p->microbatches, v = p->repeats;
	switch (p->sched) {
	case PIPE_CIRCULAR:
		return v * M;
	case PIPE_GPIPE:
		return M;
	case PIPE_1F1B:
		return S - s < M ? S - s : M;
	case PIPE_INTERLEAVED: {
		if (v == 1)
			return S - s < M ? S - s : M;
		int w = 2 * (S - s - 1) + (v - 1) * pipe_group(p) + 1;
		return w < v * M ? w : v * M;
	}
	case PIPE_ZB_H1:
		return S < M ? S : M;
	case PIPE_ZBV:
		/* 1F1B's S microbatches of a whole stage: 2S half-stage chunks */
		return M >= 2 * S ? 2 * S : -1;
	default:
		return -1;
	}
}

static bool is_compute(int op)
{
	return op == PA_F || op == PA_B || op == PA_I || op == PA_W;
}

int pipe_landing_bufs(const struct pipe_table *t, int s, size_t buf_bytes)
{
	bool recv = false;
	for (int k = 0; k < t->n[s] && !recv; k++)
		recv = t->a[s][k].op == PA_RECV;
	if (!recv)
		return 0;
	size_t n = PIPE_LANDING_BYTES / (buf_bytes ? buf_bytes : 1);
	return n < 1 ? 1 : n > PIPE_LANDING ? PIPE_LANDING : (int)n;
}

void pipe_stage_stats(const struct pipe_table *t, int s, struct pipe_stats *st)
{
	int saved = 0, live = 0;
	bool split = pipe_split_backward(t->shape.sched);
	memset(st, 0, sizeof(*st));
	for (int k = 0; k < t->n[s]; k++) {
		const struct pipe_action *a = &t->a[s][k];
		if (is_compute(a->op) || a->op == PA_FC)
			st->busy += a->t1 - a->t0;
		switch (a->op) {
		case PA_F:
			st->forwards++;
			if (++saved > st->peak_saved)
				st->peak_saved = saved;
			break;
		case PA_B:
			saved--;
			break;
		case PA_W:
			saved -= split;
			break;
		case PA_GATHER:
			if (a->chunk < 0)
				break;
			st->gathers++;
			if (++live > st->max_weights)
				st->max_weights = live;
			break;
		case PA_RELEASE:
			live -= a->chunk >= 0;
			break;
		case PA_REDUCE_SCATTER:
			st->reduce_scatters += a->chunk >= 0;
			break;
		default:
			break;
		}
	}
	double first = -1, last = 0;
	for (int k = 0; k < t->n[s]; k++) {
		const struct pipe_action *a = &t->a[s][k];
		if (!is_compute(a->op) && a->op != PA_FC && a->op != PA_EMBED && a->op != PA_HEAD &&
		    a->op != PA_EMBED_BACK)
			continue;
		if (first < 0)
			first = a->t0;
		last = a->t1;
	}
	st->span = first < 0 ? 0 : last - first;
}

double pipe_table_bubble(const struct pipe_table *t)
{
	double worst = 0;
	for (int s = 0; s < t->shape.stages; s++) {
		struct pipe_stats st;
		pipe_stage_stats(t, s, &st);
		double idle = st.span > 0 ? 1 - st.busy / t->period : 0;
		if (idle > worst)
			worst = idle;
	}
	return worst;
}

const char *pipe_act_name(enum pipe_act a)
{
	static const char *const names[PA_COUNT] = {
		"embed", "F", "B", "I", "W", "head", "embed_back", "Fc", "count_sum",
		"send", "recv", "gather", "release", "reduce_scatter",
	};
	return a >= 0 && a < PA_COUNT ? names[a] : "?";
}

const char *pipe_wmode_name(enum pipe_wmode m)
{
	static const char *const names[PIPE_W_COUNT] = {
		"per use", "pipeline_fsdp_ag_once", "pipeline_fsdp_ag_per_repeat", "one ahead",
	};
	return m >= 0 && m < PIPE_W_COUNT ? names[m] : "?";
}

static const char *group_name(int g, char *buf, size_t len)
{
	if (g == PIPE_G_NONLAYER)
		return "non-layer";
	if (g == PIPE_G_OUTSIDE)
		return "outside";
	snprintf(buf, len, "c%d", g);
	return buf;
}

void pipe_action_text(const struct pipe_action *a, char *out, size_t len)
{
	char g[16];
	switch (a->op) {
	case PA_SEND:
	case PA_RECV:
		snprintf(out, len, "%s %s%s mb%d e%d %s stage %d", pipe_act_name(a->op),
			 a->val.kind == PV_ACT ? "act" : "grad", a->val.pass ? " (count pass)" : "", a->val.mb,
			 a->val.edge, a->op == PA_SEND ? "to" : "from", a->peer);
		break;
	case PA_GATHER:
	case PA_RELEASE:
	case PA_REDUCE_SCATTER:
		snprintf(out, len, "%s %s in slot %d", pipe_act_name(a->op), group_name(a->chunk, g, sizeof(g)),
			 a->slot);
		break;
	case PA_COUNT_SUM:
		snprintf(out, len, "count_sum");
		break;
	case PA_EMBED:
	case PA_HEAD:
	case PA_EMBED_BACK:
		snprintf(out, len, "%s mb%d%s", pipe_act_name(a->op), a->mb, a->val.pass ? " (count pass)" : "");
		break;
	default:
		snprintf(out, len, "%s mb%d c%d", pipe_act_name(a->op), a->mb, a->chunk);
	}
}

void pipe_val_msg(const struct pipe_table *t, const struct pipe_val *v, uint32_t *kind, uint32_t *idx)
{
	int E = t->nchunks;
	if (v->kind == PV_ACT)
		*kind = v->edge == 0 ? PIPE_MSG_IN : v->edge == E ? PIPE_MSG_OUT : PIPE_MSG_ACT;
	else
		*kind = v->edge == 0 ? PIPE_MSG_DIN : v->edge == E ? PIPE_MSG_DOUT : PIPE_MSG_GRAD;
	*idx = (uint32_t)(((size_t)v->pass * (size_t)(E + 1) + (size_t)v->edge) * (size_t)t->shape.microbatches +
			  (size_t)v->mb);
}
