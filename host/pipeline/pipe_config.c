/* Pipeline keys resolved and checked (see pipe_config.h). The rules and
 * defaults are MaxText's (pyconfig: num_pipeline_repeats,
 * num_pipeline_microbatches, pipeline_parallel_layers). */
#include "host/pipeline/pipe_config.h"

#include <errno.h>
#include <stdio.h>
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

static int resolve_microbatches(struct pipe_config *p, const struct cfg *c, char *err, size_t errlen)
{
	int S = p->shape.stages, d = p->shape.delay;
	long long M = c->num_pipeline_microbatches;
	if (M == -1)
		M = (long long)d * S;
	if (M < 1 || M % S) {
		snprintf(err, errlen, "config: key 'num_pipeline_microbatches' (%lld) must be -1 or a positive "
			 "multiple of the %d stages (" STAGES_KEYS ")", c->num_pipeline_microbatches, S);
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
		rc = resolve_microbatches(&p, c, err, errlen);
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
	mm->pipe_first = pc->first_layer;
	mm->pipe_layers = pc->layers;
	mm->pipe_weight_slots = pipe_weight_slots(&pc->shape);
}
