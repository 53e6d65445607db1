/* The pipeline keys of a config, resolved against the model and the batch:
 * defaults filled in (MaxText's), every constraint checked with the keys
 * named. Reads a finished config; decides nothing about devices. */
#ifndef MESHRUN_PIPELINE_PIPE_CONFIG_H
#define MESHRUN_PIPELINE_PIPE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "host/pipeline/schedule.h"

struct pipe_config {
	struct pipe_shape shape; /* S, M, R, Lps, d and the weight mode */
	int layers;              /* pipelined decoder layers: S * R * Lps */
	int first_layer;         /* decoder layer index of pipelined layer 0 */
	int layers_before;       /* decoder layers run before the pipeline
				  * (MoE models: the dense ones, then MoE
				  * layers left out of it) */
	int layers_after;        /* decoder layers run after it (dense models) */
	int global_batch;        /* per_device_batch_size x every device */
	int microbatch_rows;     /* global_batch / M */
};

/* Resolves c's pipeline keys for the model d on c's mesh (c has been
 * through cfg_finish): stages S = ici_pipeline_parallelism x
 * dcn_pipeline_parallelism; pipeline_parallel_layers -1 = every decoder
 * layer (MoE models: every MoE layer); num_pipeline_repeats -1 = pipelined
 * layers / (S x Lps); num_pipeline_microbatches -1 = S (2S with the delay).
 * pipeline_schedule names the builder (circular by default),
 * pipeline_recompute whether a backward recomputes its forward.
 * Checks, each refused with one line naming the keys: S x R x Lps equals
 * the pipelined layers, the schedule's chunks per stage (gpipe, 1f1b,
 * zb_h1 one, zbv two), M a multiple of S (circular, interleaved_1f1b
 * without pipeline_interleave_group), pipeline_interleave_group -1 or
 * in [S, M] leaving a last group of 0 or >= S (interleaved_1f1b only),
 * M >= 2S with the delay, the delay with circular only, the global batch
 * divisible by M, not both pipeline_fsdp_ag_once and
 * pipeline_fsdp_ag_per_repeat, the latter not beside an interleaved
 * order of more than two chunks. Applies with one stage too (the keys
 * then describe a pipeline of one stage). 0 or -EINVAL with err. */
int pipe_config_resolve(struct pipe_config *out, const struct cfg *c, const struct model_dims *d,
			char *err, size_t errlen);

/* What the model needs of the pipeline (model.h, struct model_mesh): its
 * layer order, the pipelined layers and the window's weight slots (the
 * sets of saved activations come from the table: its act_sets). */
void pipe_config_model_mesh(const struct pipe_config *pc, struct model_mesh *mm);

/* The step without a pipeline (no `stage` axis) as a table's shape: one
 * stage, one microbatch of all `rows` rows, every layer a chunk with its
 * own saved activations (no recompute), the next layer's weights
 * gathered while one computes. */
void pipe_config_one_device(struct pipe_config *out, const struct model_dims *d, int rows);

/* Synthetic compute (`pipeline_compute: sleep`, docs/pipeline.md): 1 with
 * the seconds each compute action sleeps in *out (pipeline_sleep_ms
 * "F,I,W[,O]" in milliseconds: b = i + w, the owners' embed, head and
 * embed_back O, 0 when not given); 0 for `model` (*out zeroed); -EINVAL
 * with err naming the key. */
int pipe_config_sleep(const struct cfg *c, struct pipe_costs *out, char *err, size_t errlen);

/* Whether the step's compute is synthetic (`pipeline_compute: sleep`):
 * no loss, no FLOPs, no checkpoints. */
bool pipe_config_synthetic(const struct cfg *c);

#endif
