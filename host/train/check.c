/* See host/train/check.h. */
#include "host/train/check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/agent/agent.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/optim/optim.h"
#include "host/pipeline/pipe_config.h"

/* Axes the step has no code for yet. */
static int check_axes(const struct cfg *c, char *err, size_t errlen)
{
	static const int later[] = { AX_SEQUENCE, AX_CONTEXT };
	for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++) {
		int a = later[i];
		if (c->ici[a] * c->dcn[a] == 1)
			continue;
		snprintf(err, errlen, "config: the '%s' mesh axis has size %d, but sharded training "
			 "along it is not implemented yet; today data, stage, fsdp, fsdp_transpose, "
			 "tensor, tensor_transpose and expert parallelism train",
			 mesh_axis_names[a], c->ici[a] * c->dcn[a]);
		return -EINVAL;
	}
	return 0;
}

/* pipeline_update_ahead takes back an AdamW update that reads the
 * gradients and writes the parameters, m and v, nothing else. */
static int check_ahead(const struct cfg *c, bool staged, char *err, size_t errlen)
{
	const char *why = !staged ? "a pipeline (a stage axis of 2 or more)" :
			  strcmp(c->opt_type, "adamw") ? "opt_type=adamw" :
			  c->shard_optimizer_over_data && c->ici[AX_DATA] * c->dcn[AX_DATA] > 1 ?
								      "shard_optimizer_over_data=false" :
			  c->routed_bias_update_rate != 0 ? "routed_bias_update_rate=0" : NULL;
	if (!c->pipeline_update_ahead || !why)
		return 0;
	snprintf(err, errlen, "config: key 'pipeline_update_ahead' needs %s", why);
	return -EINVAL;
}

int train_check_pipe(const struct cfg *c, const struct pipe_config *pc, int rows, char *err,
		     size_t errlen)
{
	static const int other[] = { AX_SEQUENCE, AX_CONTEXT };
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
		int a = other[i];
		if (c->ici[a] * c->dcn[a] == 1)
			continue;
		snprintf(err, errlen, "config: pipeline parallelism (stage) trains beside data, fsdp, "
			 "fsdp_transpose, tensor, tensor_transpose and expert parallelism only; "
			 "ici_/dcn_%s_parallelism=%d is not supported with it yet",
			 mesh_axis_names[a], c->ici[a] * c->dcn[a]);
		return -EINVAL;
	}
	if (rows % pc->shape.microbatches) {
		snprintf(err, errlen, "config: a stage group's %d rows do not split into "
			 "num_pipeline_microbatches=%d microbatches", rows, pc->shape.microbatches);
		return -EINVAL;
	}
	return check_ahead(c, true, err, errlen);
}

/* Synthetic compute trains nothing: no checkpoint, no evaluation (its
 * loss would be no loss). */
static int check_sleep(const struct cfg *c, char *err, size_t errlen)
{
	struct pipe_costs sl;
	int rc = pipe_config_sleep(c, &sl, err, errlen);
	if (rc <= 0)
		return rc;
	if (c->checkpoint_period > 0 || c->eval_interval > 0 || c->load_parameters_path[0]) {
		const char *k = c->checkpoint_period > 0 ? "checkpoint_period" : c->eval_interval > 0 ?
				"eval_interval" : "load_parameters_path";
		snprintf(err, errlen, "config: key '%s' is refused with pipeline_compute=sleep "
			 "(synthetic compute trains nothing)", k);
		return -EINVAL;
	}
	return 0;
}

/* The model's shape and plans for device 0 (every device's shards have
 * the same shapes), as trainer_open makes them. */
int train_check_keys(const struct cfg *c, struct model_dims *d, char *err, size_t errlen)
{
	int rc;
	if ((rc = model_dims_from_cfg(d, c, err, errlen)))
		return rc;
	if (strcmp(c->opt_type, "adamw") && strcmp(c->opt_type, "muon")) {
		snprintf(err, errlen, "config: key 'opt_type' must be adamw or muon, got '%s'", c->opt_type);
		return -EINVAL;
	}
	if (strcmp(c->muon_assign, "size") && strcmp(c->muon_assign, "round_robin")) {
		snprintf(err, errlen, "config: key 'muon_assign' must be size or round_robin, got '%s'",
			 c->muon_assign);
		return -EINVAL;
	}
	if (c->steps < 0) {
		snprintf(err, errlen, "config: key 'steps' must be >= 0, got %lld", c->steps);
		return -EINVAL;
	}
	return check_sleep(c, err, errlen);
}

static int check_model(const struct cfg *c, const struct mesh *m, const struct shard_rules *rules,
		       char *err, size_t errlen)
{
	struct model_dims d;
	int rc;
	uint32_t rows_axes = 0;
	if ((rc = train_check_keys(c, &d, err, errlen)) || (rc = check_ahead(c, m->size[AX_STAGE] > 1, err, errlen)))
		return rc;
	if (m->num_devices == 1) {
		struct model *one = model_plan_new(&d, NULL, err, errlen);
		model_free(one);
		return one ? 0 : -EINVAL;
	}
	struct model_mesh mm = { .mesh = m, .rules = rules, .device = 0 };
	if (model_plan_rows(&mm, (int)c->base_emb_dim, &rows_axes, err, errlen))
		return -EINVAL;
	int ndata = c->shard_optimizer_over_data ? m->size[AX_DATA] : 1;
	if (ndata > 1)
		mm.bucket_align = ndata;
	if (m->size[AX_STAGE] > 1) {
		/* the rows of device 0's group, as the training job splits them */
		int n = 1;
		for (int a = 0; a < AX_COUNT; a++)
			if (rows_axes & (1u << a))
				n *= m->size[a];
		int rows = (int)c->per_device_batch_size * m->num_devices / n;
		struct pipe_config pc;
		if ((rc = pipe_config_resolve(&pc, c, &d, err, errlen)) ||
		    (rc = train_check_pipe(c, &pc, rows, err, errlen)))
			return rc;
		pipe_config_model_mesh(&pc, &mm);
	}
	struct model *plan = model_plan_new(&d, &mm, err, errlen);
	if (!plan)
		return -EINVAL;
	rc = optim_check_zero(plan, !strcmp(c->opt_type, "muon"), ndata, err, errlen);
	model_free(plan);
	return rc;
}

int train_check(const struct cfg *c, const struct mesh *m, char *err, size_t errlen)
{
	struct fault_plan faults;
	int rc;
	if ((rc = check_axes(c, err, errlen)) ||
	    (rc = agent_faults(c, m->num_hosts, &faults, err, errlen)))
		return rc;
	struct shard_rules *rules = malloc(sizeof(*rules));
	if (!rules) {
		snprintf(err, errlen, "train: out of memory");
		return -ENOMEM;
	}
	rc = shard_rules_from_cfg(rules, c, err, errlen) ? -EINVAL : 0;
	if (!rc)
		rc = check_model(c, m, rules, err, errlen);
	free(rules);
	return rc;
}

int train_shrink(const struct cfg *c, int hosts, long long *dcn_data, long long *pdbs, char *err,
		 size_t errlen)
{
	int other = c->num_hosts / c->dcn[AX_DATA];
	long long global = c->per_device_batch_size * c->num_hosts * c->devices_per_host;
	long long devices = (long long)hosts * c->devices_per_host;
	char axes[256] = "";
	size_t used = 0;
	for (int a = 0; a < AX_COUNT; a++)
		if (a != AX_DATA && c->dcn[a] > 1 && used < sizeof(axes))
			used += (size_t)snprintf(axes + used, sizeof(axes) - used, "%s%s=%d", used ? " x " : "",
						 mesh_axis_names[a], c->dcn[a]);
	if (hosts < 1 || hosts % other) {
		snprintf(err, errlen, "the mesh cannot shrink to %d host%s along data: its other axes across "
			 "hosts (%s) need a multiple of %d", hosts, hosts == 1 ? "" : "s", axes, other);
		return -EINVAL;
	}
	if (global % devices) {
		snprintf(err, errlen, "the global batch of %lld rows does not split over %d hosts x %d devices",
			 global, hosts, c->devices_per_host);
		return -EINVAL;
	}
	*dcn_data = hosts / other;
	*pdbs = global / devices;
	struct cfg *n = malloc(sizeof(*n));
	struct mesh m;
	char why[512];
	int rc;
	if (!n) {
		snprintf(err, errlen, "train: out of memory");
		return -ENOMEM;
	}
	*n = *c;
	n->dcn_data_parallelism = *dcn_data;
	n->per_device_batch_size = *pdbs;
	rc = cfg_finish(n, hosts, c->devices_per_host, why, sizeof(why));
	if (!rc) {
		mesh_init(&m, n);
		rc = train_check(n, &m, why, sizeof(why));
	}
	if (rc)
		snprintf(err, errlen, "on %d hosts (dcn_data_parallelism=%lld, per_device_batch_size=%lld) %s", hosts,
			 *dcn_data, *pdbs, why);
	free(n);
	return rc;
}
