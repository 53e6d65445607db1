/* Pipeline keys resolved and checked (see pipe_config.h). The rules and
 * defaults are MaxText's (pyconfig: num_pipeline_repeats,
 * num_pipeline_microbatches, pipeline_parallel_layers). */
#include "host/pipeline/pipe_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGES_KEYS "ici_pipeline_parallelism x dcn_pipeline_parallelism"

/* Which decoder layers are pipelined: all of them, or for an MoE model the
 * MoE layers (dense and MoE layers have different tensors). */
static int resolve_layers(struct pipe_config *p, const struct cfg *c, const struct model_dims *d,
			  char *err, size_t errlen)
{
	bool moe = d->E > 1;
	int can = moe ? d->L_moe : d->L;
	long long want = c->pipeline_parallel_layers;
	if (want == -1)
		want = can;
	if (want < 1 || want > can) {
		snprintf(err, errlen, "config: key 'pipeline_parallel_layers' must be -1 or in [1, %d] "
			 "(the model's %s layers), got %lld", can, moe ? "MoE" : "decoder",
			 c->pipeline_parallel_layers);
		return -EINVAL;
	}
	p->layers = (int)want;
	if (moe) {
		/* MaxText: dense layers, MoE layers outside the pipeline, pipeline */
		p->first_layer = d->L - p->layers;
		p->layers_before = p->first_layer;
		p->layers_after = 0;
	} else {
		p->first_layer = 0;
		p->layers_before = 0;
		p->layers_after = d->L - p->layers;
	}
	return 0;
}

static int resolve_repeats(struct pipe_config *p, const struct cfg *c, char *err, size_t errlen)
{
	int S = p->shape.stages;
	long long lps = c->num_layers_per_pipeline_stage, R = c->num_pipeline_repeats;
	if (lps < 1 || lps > p->layers) {
		snprintf(err, errlen, "config: key 'num_layers_per_pipeline_stage' must be in [1, %d] "
			 "(the pipelined layers), got %lld", p->layers, lps);
		return -EINVAL;
	}
	if (R != -1 && (R < 1 || R > p->layers)) {
		snprintf(err, errlen, "config: key 'num_pipeline_repeats' must be -1 or in [1, %d], got %lld",
			 p->layers, R);
		return -EINVAL;
	}
	if (R == -1) {
		if (p->layers % (S * lps)) {
			snprintf(err, errlen, "config: %d stages (" STAGES_KEYS ") x %lld "
				 "'num_layers_per_pipeline_stage' must divide the %d pipelined layers "
				 "('pipeline_parallel_layers')", S, lps, p->layers);
			return -EINVAL;
		}
		R = p->layers / (S * lps);
	}
	if (S * R * lps != p->layers) {
		snprintf(err, errlen, "config: %d stages (" STAGES_KEYS ") x %lld 'num_pipeline_repeats' "
			 "x %lld 'num_layers_per_pipeline_stage' = %lld, but %d layers are pipelined "
			 "('pipeline_parallel_layers')", S, R, lps, S * R * lps, p->layers);
		return -EINVAL;
	}
	p->shape.repeats = (int)R;
	p->shape.layers_per_stage = (int)lps;
	return 0;
}

/* The schedule's chunks per stage: gpipe, 1f1b and zb_h1 run one, zbv
 * two, circular and interleaved_1f1b any. */
static int check_chunks(const struct pipe_config *p, char *err, size_t errlen)
{
	const struct pipe_shape *sh = &p->shape;
	int want = sh->sched == PIPE_ZBV ? 2 : 1;
	if (sh->sched == PIPE_CIRCULAR || sh->sched == PIPE_INTERLEAVED || sh->repeats == want)
		return 0;
	snprintf(err, errlen, "config: pipeline_schedule=%s runs %s chunk%s per stage: 'num_pipeline_repeats' "
		 "must be %d, got %d (%d pipelined layers / %d stages / %d 'num_layers_per_pipeline_stage'); "
		 "set 'num_layers_per_pipeline_stage' to %d%s", pipe_sched_name(sh->sched), want == 1 ? "one" : "two",
		 want == 1 ? "" : "s", want, sh->repeats, p->layers, sh->stages, sh->layers_per_stage,
		 p->layers / (sh->stages * want), want == 1 ? " or use interleaved_1f1b or circular" : "");
	return -EINVAL;
}

/* Combinations a schedule cannot take, each named by its keys. */
static int check_combination(const struct pipe_config *p, char *err, size_t errlen)
{
	const struct pipe_shape *sh = &p->shape;
	const char *name = pipe_sched_name(sh->sched);
	if (sh->delay == 2 && sh->sched != PIPE_CIRCULAR) {
		snprintf(err, errlen, "config: 'pipeline_delay_activation_forwarding' applies to "
			 "pipeline_schedule=circular only (its lockstep iterations); pipeline_schedule=%s runs "
			 "each action as soon as its input has arrived", name);
		return -EINVAL;
	}
	if (sh->wmode == PIPE_W_REPEAT && sh->sched != PIPE_CIRCULAR && sh->repeats > 2) {
		snprintf(err, errlen, "config: 'pipeline_fsdp_ag_per_repeat' keeps two chunks of a stage gathered, "
			 "but pipeline_schedule=%s alternates between its %d chunks ('num_pipeline_repeats'); "
			 "use 'pipeline_fsdp_ag_once'", name, sh->repeats);
		return -EINVAL;
	}
	return 0;
}

static int resolve_microbatches(struct pipe_config *p, const struct cfg *c, char *err, size_t errlen)
{
	int S = p->shape.stages, d = p->shape.delay;
	long long M = c->num_pipeline_microbatches;
	if (M == -1)
		M = (long long)d * S;
	/* interleaved_1f1b with a group: its own rule (resolve_group) */
	bool multiple = p->shape.sched == PIPE_CIRCULAR ||
			(p->shape.sched == PIPE_INTERLEAVED && c->pipeline_interleave_group == -1);
	if (M < 1 || (multiple && M % S)) {
		if (multiple)
			snprintf(err, errlen, "config: key 'num_pipeline_microbatches' (%lld) must be -1 or a "
				 "positive multiple of the %d stages (" STAGES_KEYS ")", c->num_pipeline_microbatches, S);
		else
			snprintf(err, errlen, "config: key 'num_pipeline_microbatches' (%lld) must be -1 or positive",
				 c->num_pipeline_microbatches);
		return -EINVAL;
	}
	if (d == 2 && M < 2 * S) {
		snprintf(err, errlen, "config: 'pipeline_delay_activation_forwarding' needs "
			 "'num_pipeline_microbatches' >= 2 x %d stages = %d, got %lld", S, 2 * S, M);
		return -EINVAL;
	}
	if (p->global_batch % M) {
		snprintf(err, errlen, "config: the global batch ('per_device_batch_size' %lld x %d devices "
			 "= %d rows) is not divisible by 'num_pipeline_microbatches' (%lld)",
			 c->per_device_batch_size, c->num_hosts * c->devices_per_host, p->global_batch, M);
		return -EINVAL;
	}
	p->shape.microbatches = (int)M;
	p->microbatch_rows = (int)(p->global_batch / M);
	return 0;
}

/* interleaved_1f1b's group of microbatches a chunk (orders.c): -1 the
 * stages; else in [S, M] with a last group of 0 or >= S microbatches. */
static int resolve_group(struct pipe_config *p, const struct cfg *c, char *err, size_t errlen)
{
	int S = p->shape.stages, M = p->shape.microbatches;
	long long g = c->pipeline_interleave_group;
	if (g == -1)
		return 0;
	if (p->shape.sched != PIPE_INTERLEAVED) {
		snprintf(err, errlen, "config: key 'pipeline_interleave_group' (%lld) applies to "
			 "pipeline_schedule=interleaved_1f1b only, got pipeline_schedule=%s; use -1", g,
			 pipe_sched_name(p->shape.sched));
		return -EINVAL;
	}
	if (g < S || g > M) {
		snprintf(err, errlen, "config: key 'pipeline_interleave_group' (%lld) must be -1 or in [%d, %d]: "
			 "at least the %d stages (" STAGES_KEYS "), at most the %d 'num_pipeline_microbatches'",
			 g, S, M, S, M);
		return -EINVAL;
	}
	if (M % g && M % g < S) {
		snprintf(err, errlen, "config: 'num_pipeline_microbatches' (%d) mod 'pipeline_interleave_group' "
			 "(%lld) leaves a last group of %lld microbatches, fewer than the %d stages ("
			 STAGES_KEYS "): choose a group that divides it or leaves at least %d", M, g, M % g, S, S);
		return -EINVAL;
	}
	p->shape.group = (int)g;
	return 0;
}

int pipe_config_resolve(struct pipe_config *out, const struct cfg *c, const struct model_dims *d,
			char *err, size_t errlen)
{
	struct pipe_config p;
	memset(&p, 0, sizeof(p));
	if (c->pipeline_fsdp_ag_once && c->pipeline_fsdp_ag_per_repeat) {
		snprintf(err, errlen, "config: keys 'pipeline_fsdp_ag_once' and 'pipeline_fsdp_ag_per_repeat' "
			 "are both true; choose one way to gather a stage's weights");
		return -EINVAL;
	}
	p.shape.wmode = c->pipeline_fsdp_ag_once ? PIPE_W_ONCE
		      : c->pipeline_fsdp_ag_per_repeat ? PIPE_W_REPEAT : PIPE_W_ITER;
	int sched = pipe_sched_parse(c->pipeline_schedule);
	if (sched < 0) {
		snprintf(err, errlen, "config: key 'pipeline_schedule' must be circular, gpipe, 1f1b, "
			 "interleaved_1f1b, zb_h1 or zbv, got '%s'", c->pipeline_schedule);
		return -EINVAL;
	}
	p.shape.sched = (enum pipe_sched)sched;
	p.shape.recompute = c->pipeline_recompute;
	p.shape.moe = d->L_moe > 0;
	p.shape.stages = c->ici[AX_STAGE] * c->dcn[AX_STAGE];
	p.shape.delay = c->pipeline_delay_activation_forwarding ? 2 : 1;
	long long batch = c->per_device_batch_size * c->num_hosts * c->devices_per_host;
	if (c->per_device_batch_size < 1 || batch > (1 << 30)) {
		snprintf(err, errlen, "config: key 'per_device_batch_size' must be in [1, 2^30 / devices], got %lld",
			 c->per_device_batch_size);
		return -EINVAL;
	}
	p.global_batch = (int)batch;
	int rc = resolve_layers(&p, c, d, err, errlen);
	if (!rc)
		rc = resolve_repeats(&p, c, err, errlen);
	if (!rc)
		rc = check_chunks(&p, err, errlen);
	if (!rc)
		rc = check_combination(&p, err, errlen);
	if (!rc)
		rc = resolve_microbatches(&p, c, err, errlen);
	if (!rc)
		rc = resolve_group(&p, c, err, errlen);
	p.shape.outside = p.layers_before ? PIPE_OUT_BEFORE : p.layers_after ? PIPE_OUT_AFTER : PIPE_OUT_NONE;
	if (!rc)
		rc = pipe_shape_check(&p.shape, err, errlen);
	if (rc)
		return rc;
	*out = p;
	return 0;
}

void pipe_config_model_mesh(const struct pipe_config *pc, struct model_mesh *mm)
{
	mm->pipe_stages = pc->shape.stages;
	mm->pipe_repeats = pc->shape.repeats;
	mm->pipe_v = pc->shape.sched == PIPE_ZBV;
	mm->pipe_first = pc->first_layer;
	mm->pipe_layers = pc->layers;
	mm->pipe_weight_slots = pipe_weight_windows(&pc->shape);
}

void pipe_config_one_device(struct pipe_config *out, const struct model_dims *d, int rows)
{
	memset(out, 0, sizeof(*out));
	out->shape = (struct pipe_shape){
		.sched = PIPE_CIRCULAR, .stages = 1, .microbatches = 1, .repeats = d->L,
		.layers_per_stage = 1, .delay = 1, .wmode = PIPE_W_AHEAD, .recompute = false,
		.moe = d->L_moe > 0, .outside = PIPE_OUT_NONE, .one_device = true,
	};
	out->layers = d->L;
	out->global_batch = rows;
	out->microbatch_rows = rows;
}

bool pipe_config_synthetic(const struct cfg *c)
{
	return !strcmp(c->pipeline_compute, "sleep");
}

int pipe_config_sleep(const struct cfg *c, struct pipe_costs *out, char *err, size_t errlen)
{
	double v[4] = { 0, 0, 0, 0 };
	int n = 0;
	const char *s = c->pipeline_sleep_ms;
	memset(out, 0, sizeof(*out));
	if (!strcmp(c->pipeline_compute, "model"))
		return 0;
	if (!pipe_config_synthetic(c)) {
		snprintf(err, errlen, "config: key 'pipeline_compute' must be model or sleep, got '%s'",
			 c->pipeline_compute);
		return -EINVAL;
	}
	while (n < 4) {
		char *end;
		v[n] = strtod(s, &end);
		if (end == s || !(v[n] >= 0 && v[n] <= 60000) || (*end && *end != ','))
			break;
		n++;
		s = end;
		if (!*s)
			break;
		s++;
	}
	if (n < 3 || *s) {
		snprintf(err, errlen, "config: key 'pipeline_sleep_ms' must be F,I,W or F,I,W,O "
			 "milliseconds in [0, 60000], got '%s'", c->pipeline_sleep_ms);
		return -EINVAL;
	}
	*out = (struct pipe_costs){ .f = v[0] * 1e-3, .i = v[1] * 1e-3, .w = v[2] * 1e-3,
				    .b = (v[1] + v[2]) * 1e-3, .embed = v[3] * 1e-3,
				    .head = v[3] * 1e-3, .embed_back = v[3] * 1e-3 };
	return 1;
}
