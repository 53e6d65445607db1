/* The executor of a pipeline schedule (host/pipeline/schedule.h): one
 * device of stage s runs the table's entries for s on the model's stage
 * calls, moving activations and gradients point to point.
 *
 * A step covers the B = M x mb rows of the device's stage group (the
 * devices that differ only in `stage`); the model was made for mb rows
 * (one microbatch). The embedding, the head and the decoder layers
 * outside the pipeline run data-parallel over `stage`: stage s embeds,
 * and computes the loss of, the microbatches m with m mod S = s, and runs
 * on them the layers [0, first_layer) after the embedding (an MoE
 * model's dense layers and MoE layers left out of the pipeline; their
 * forward is recomputed before their backward, after the pipeline's) and
 * the layers after the pipelined ones before the head (a dense model's;
 * forward and backward back to back per microbatch). Their inputs go to
 * stage 0, their outputs come back from stage S-1, point to point. The
 * pipelined layers run as the table says: forward, then backward
 * recomputing each slot's forward from its saved stage input. Weight
 * gradients accumulate into model_grads: the stage's own layers, and the
 * embedding, head and layers outside the pipeline of its microbatches
 * (the model stores those whole on every stage; the caller sums their
 * gradients over `stage`).
 *
 * MoE layers: every forward of the step adds its expert counts; between
 * the passes they are summed over the rows' axes and `stage`, so each
 * layer's load-balance loss (and the router bias update after the step)
 * sees the counts of the whole batch, as on one device; the recomputed
 * forwards leave them alone.
 *
 * Weights: the `layers` dimension is split over `stage`, so a stage stores
 * its layers (in stage order with repeats: model_mesh); weights also split
 * over FSDP axes are gathered through the model's window
 * (host/model/window.h) as the table's GATHER, RELEASE and REDUCE_SCATTER
 * entries say, in any weight mode: a GATHER starts the all-gather, the
 * first FORWARD or BACKWARD using the slot waits for it; a BACKWARD adds
 * dW into its gradient buffer (zeroed first after a REDUCE_SCATTER), a
 * REDUCE_SCATTER sends it. The model must have been made with the
 * table's weight slots (model_mesh.pipe_weight_slots = pipe_weight_slots).
 * The non-layer tensors are gathered once for the whole step. */
#ifndef MESHRUN_PIPELINE_EXEC_H
#define MESHRUN_PIPELINE_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "host/model/model.h"
#include "host/pipeline/schedule.h"

/* Point-to-point messages to another device. A message is named by
 * (kind, idx), unique within a step for a (sender, receiver) pair. send
 * starts the transfer and returns (buf stays untouched until the send is
 * waited: wait_send or flush); recv waits for the message; wait_send
 * waits for the one send named (dev, kind, idx) of this step (0 at once
 * if it was waited already); flush waits for every send started. Each
 * returns 0 or -errno (the caller keeps the message). */
struct pipe_p2p {
	int (*send)(void *ctx, int dev, uint32_t kind, uint32_t idx, const void *buf, size_t bytes);
	int (*recv)(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes);
	int (*wait_send)(void *ctx, int dev, uint32_t kind, uint32_t idx);
	int (*flush)(void *ctx);
	void *ctx;
};

/* What one step did, for traces: util_now_s() times of each forward and
 * backward slot of this stage. */
struct pipe_slot_time {
	int iter, mb, repeat;
	enum pipe_pass pass;
	double t0, t1;
};

struct pipe_exec;

/* sh: the shape (any weight mode); stage: this device's stage;
 * first_layer: the model layer of pipelined layer 0; stage_dev[S]: the
 * global device id of each stage of this device's group; m: the model,
 * made for mb_rows rows (one microbatch), holding the layers of `stage`. 0, or
 * -EINVAL with err when the model does not hold them or the shape is
 * refused, -ENOMEM. */
int pipe_exec_new(struct pipe_exec **out, const struct pipe_shape *sh, int stage, int first_layer,
		  const int *stage_dev, struct model *m, int mb_rows, char *err, size_t errlen);
void pipe_exec_free(struct pipe_exec *x);

/* One step's forward and backward over the group's M x mb rows (inputs
 * and targets: all of them, microbatch m at rows [m mb, (m+1) mb)).
 * Calls model_step_begin(st) and model_step_end; st->loss_sum = the sum
 * of the token losses of this stage's microbatches. 0 or the first
 * failing hook's -errno. */
int pipe_exec_step(struct pipe_exec *x, const int32_t *inputs, const int32_t *targets,
		   struct model_step *st, const struct pipe_p2p *io);

/* The slots timed by the last step: *n of them. */
const struct pipe_slot_time *pipe_exec_times(const struct pipe_exec *x, int *n);

/* Layer-group all-gathers the last step started (the table's gathers per
 * stage and step when the weights are split over FSDP axes). */
int pipe_exec_gathers(const struct pipe_exec *x);

/* Test hook: fills every buffer an idle slot could read (saved inputs,
 * received activations and gradients, the weight window's layer groups)
 * with NaN before each step. */
void pipe_exec_poison(struct pipe_exec *x, int on);

#endif
