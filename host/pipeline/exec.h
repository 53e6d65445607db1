/* The executor: one device runs its stage's list of a schedule's table
 * (host/pipeline/schedule.h) on the model's stage calls, in table order,
 * for every training step, with or without a pipeline (a table of one
 * stage). It does what each action says and nothing else: the owners'
 * embedding, head and loss; the forward and backward of a chunk of
 * layers (recomputing the forward when the table says so); the
 * expert-count sum; sends and receives of activations and gradients
 * through the point-to-point seam below; the FSDP window's gathers,
 * releases and reduce-scatters (host/model/window.h).
 *
 * A step covers the B = M x mb rows of the device's stage group (the
 * devices that differ only in `stage`); the model was made for mb rows
 * (one microbatch), with the table's sets of saved activations
 * (model_mesh.pipe_act_sets = act_sets of the stage), stashes of the
 * split backward (pipe_w_stashes = w_stashes of the stage, and
 * pipe_w_reads_acts unless the table recomputes) and weight windows
 * (model_mesh.pipe_weight_slots = weight_windows). Weight gradients
 * accumulate into model_grads: the stage's own layers, and the
 * embedding, head and layers outside the pipeline of the microbatches
 * it owns (the model stores those whole on every stage; the caller sums
 * their gradients over `stage`). The layers outside the pipeline run in
 * the owners' actions: those before it after the embedding (their
 * forward recomputed before their backward), those after it before the
 * head (forward and backward back to back).
 *
 * MoE layers: every forward that counts (the step's, or the counting
 * pass's when the table has one) adds its expert counts; the count sum
 * adds them over the rows' axes and `stage`, so each layer's load-balance
 * loss (and the router bias update after the step) sees the counts of
 * the whole batch, as on one device; recomputed forwards leave them
 * alone. */
#ifndef MESHRUN_PIPELINE_EXEC_H
#define MESHRUN_PIPELINE_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/model/model.h"
#include "host/pipeline/schedule.h"

/* When a receive posted ahead tells its sender it is posted (its
 * RecvReady): pipe_p2p.probe's hold. */
enum { PIPE_RR_NOW, PIPE_RR_RIDE, PIPE_RR_LATER };

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
	/* Optional (NULL: a receive is only ever waited for). Posts the
	 * receive of (dev, kind, idx) into buf, as recv would, unless it is
	 * posted already, and tells without waiting whether it has arrived:
	 * 1 yes, 0 not yet, or -errno. The recv of the same message that
	 * follows takes the posted one (buf the same). hold: when the
	 * post's word to dev (its RecvReady) goes: PIPE_RR_NOW from this
	 * call, PIPE_RR_RIDE with the send to dev that follows before the
	 * next compute (its data frame carries it), PIPE_RR_LATER from the
	 * transport's own thread. */
	int (*probe)(void *ctx, int dev, uint32_t kind, uint32_t idx, void *buf, size_t bytes, int hold);
	void *ctx;
};

/* What the step's owner learns while a table runs, so it can sum
 * gradients during the backward (the optimizer, host/optim/optim.h). A
 * group of weights is named by the decoder layers [l0, l1) of the
 * model, or by l0 = PIPE_HOOK_HEAD (the final norm and the output
 * projection) or PIPE_HOOK_EMBED (the embedding), l1 unused.
 *
 * grads_done(landed false): the last action of the step that adds to the
 * group's gradients has run; the gradients of the tensors the FSDP
 * window does not gather are final in model_grads. grads_done(landed
 * true): the window's reduce-scatter of the group has landed in
 * model_grads; the gathered tensors' gradients are final. Every stage
 * gets the first for each group it computes gradients of, and the
 * second for each group its table reduce-scatters, once a step, in table
 * order (so the same order on every device of a stage). It returns 0 or
 * -errno, which ends the step. */
#define PIPE_HOOK_HEAD (-1)
#define PIPE_HOOK_EMBED (-2)
struct pipe_hooks {
	int (*grads_done)(void *ctx, int l0, int l1, bool landed);
	/* Before each action that reads a group's weights (its compute, or
	 * the window's gather of it: gathered, only the tensors the window
	 * gathers), for each group it reads: the owner makes them current
	 * (ZeRO-1's gathers, started by the update before). NULL: none. 0
	 * or -errno, which ends the step. */
	int (*weights_needed)(void *ctx, int l0, int l1, bool gathered);
	/* Once a step at most, on a stage of a pipeline that never writes
	 * the tensors every stage stores (no owner action: they are zero
	 * on it) and moves nothing between stages from its last compute
	 * action on: before that action (pipe_exec_sums_at). The owner may
	 * start their sums over `stage` then: every other stage's share of
	 * the step's point-to-point traffic went before, so what it queues
	 * behind them waits for nothing of this stage's. NULL: none. 0 or
	 * -errno, which ends the step. */
	int (*stage_sums)(void *ctx);
	void *ctx;
};

/* What one step did, for traces: util_now_s() times of each compute
 * action of this stage (F, B, I, W, the counting F, the owners') and the
 * CPU seconds the device's thread spent in it (with one OpenBLAS thread,
 * all of its compute; on shared cores the wall span is not its cost). */
struct pipe_act_time {
	int op;          /* enum pipe_act */
	int mb, chunk;
	double t0, t1;
	double cpu;      /* the calling thread's CPU seconds in it (util_thread_cpu_s) */
};

struct pipe_exec;

/* t: the table (taken, even on failure); stage: this device's stage;
 * first_layer: the model layer of pipelined layer 0; stage_dev[S]: the
 * global device id of each stage of this device's group; m: the model,
 * made for mb_rows rows (one microbatch), holding the layers of `stage`.
 * 0, or -EINVAL with err when the model does not hold them or lacks the
 * table's activation sets or stashes, -ENOMEM. */
int pipe_exec_new(struct pipe_exec **out, struct pipe_table *t, int stage, int first_layer,
		  const int *stage_dev, struct model *m, int mb_rows, char *err, size_t errlen);
void pipe_exec_free(struct pipe_exec *x);

/* One step's forward and backward over the group's M x mb rows (inputs
 * and targets: all of them, microbatch m at rows [m mb, (m+1) mb)).
 * Calls model_step_begin(st) and model_step_end; st->loss_sum = the sum
 * of the token losses this stage computed. io may be NULL when the table
 * moves nothing between stages (one stage). 0 or the first failing
 * hook's -errno. */
int pipe_exec_step(struct pipe_exec *x, const int32_t *inputs, const int32_t *targets,
		   struct model_step *st, const struct pipe_p2p *io);

/* The table's leading gathers (the FSDP window's gathers before the
 * step's first compute: the non-layer group, the first layers; in a
 * pipeline of two stages or more not those of chunks the first chunk
 * action does not read, which the step starts when that action starts),
 * started ahead of the step: by the optimizer as soon as it has updated the
 * shards they read (pipe_exec_first_reads names those groups, as
 * weights_needed does: up to max into l0[], l1[], and into by[] (when
 * not NULL) the leading gather, 0, 1, ..., that reads each; returns how
 * many). pipe_exec_prefetch starts those before `upto` not started yet,
 * in table order (an update that finishes one gather's shards after the
 * other's sends each as soon as its shards are done). The next
 * pipe_exec_step finds them in flight and skips them. comm: the
 * collectives the next step uses. pipe_exec_prefetch_drop waits for
 * them and drops them (before anything else uses the model: an eval,
 * the end of the run); the next step gathers them again. 0 or -errno. */
int pipe_exec_first_reads(const struct pipe_exec *x, int *l0, int *l1, int *by, int max);
int pipe_exec_prefetch(struct pipe_exec *x, const struct model_comm *comm, int upto);
int pipe_exec_prefetch_drop(struct pipe_exec *x);

/* Filling receive waits (`pipeline_fill_waits`): at a receive that has
 * not arrived (pipe_p2p.probe), the device runs the next weight
 * gradient W it owes (its I has run) before waiting, and probes again,
 * while W's are owed. Only where it moves no collective: the window
 * moves no layer weights (a layer group's gather, release and
 * reduce-scatter are bookkeeping, left in place; the moved W computes
 * on the model's own weights and gradients), and the W completes no
 * group (it would move a grads_done hook). W's keep their order among
 * themselves; W's math does not depend on when it runs, so the bits do
 * not move. on false, or a table without W's, or an io without probe:
 * table order. Default off. */
void pipe_exec_set_fill(struct pipe_exec *x, bool on);
/* fsdp_layer_parts: each F, B and W of one layer runs in two parts
 * (model_set_parts): an F waits for the gather of its layer's attention
 * block only, and for the feed-forward block's between the two; a B
 * sends the feed-forward block's reduce-scatter between them, the
 * attention block's at its RS as before; a W the same when it is its
 * slot's last write before the slot's RS. Where it applies: a table
 * without a pipeline or I and W, or a split-backward table (I and W,
 * no B) of one layer a chunk (zbv). PIPE_PARTS_ON elsewhere: -EINVAL
 * with a one-line err naming the keys; PIPE_PARTS_AUTO (the default):
 * on where it applies and the window gathers layers (FSDP), else off. */
enum pipe_parts { PIPE_PARTS_OFF, PIPE_PARTS_ON, PIPE_PARTS_AUTO };
int pipe_exec_set_parts(struct pipe_exec *x, enum pipe_parts mode, char *err, size_t errlen);
/* W's the last step ran ahead of their place, in receive waits. */
int pipe_exec_fills(const struct pipe_exec *x);
/* Receives the last step posted ahead of their place (with a transport
 * that probes and without the fill: before each action, every later
 * RECV is posted, up to 8 outstanding, into its own buffer when no
 * action before it names that buffer and no send from it is in flight,
 * else into one of up to 4 landing buffers (each one microbatch's
 * activations, 64 MiB of them at most, at least one), which takes the buffer's place at the RECV;
 * MESHRUN_PIPE_PREPOST=n sets the bound, 0 turns this off;
 * MESHRUN_PIPE_LANDING=n fewer landing buffers), the most it had
 * outstanding at once, and how many went into a landing buffer. */
int pipe_exec_preposts(const struct pipe_exec *x);
int pipe_exec_prepost_depth(const struct pipe_exec *x);
int pipe_exec_landed(const struct pipe_exec *x);
/* The landing buffers it allocated (pipe_landing_bufs of its stage at
 * one microbatch's activations). */
int pipe_exec_landing_bufs(const struct pipe_exec *x);

/* Synthetic compute (`pipeline_compute: sleep`): with c, every compute
 * action of the table (F, FC, B, I, W, and the owners' embed, head and
 * embed_back) sleeps its time in c (seconds: f, f for FC, b, i, w,
 * embed, head, embed_back) instead of running the model, from the moment
 * its compute would start (after the waits the action does first: its
 * window slots, the send from the buffer it writes), to an absolute
 * deadline (the calling thread's timer slack set to 1 ns by each step). Everything else is as with the model: the sends and
 * receives (of the buffers' sizes, their bytes whatever the buffers
 * hold), the window's gathers, releases and reduce-scatters, the
 * expert-count sum, the hooks, posting ahead, the fill. The step's
 * loss_sum stays 0 and the gradients are not the model's: for
 * measuring the executor and the transport, not for training. NULL: the
 * model (the default). */
void pipe_exec_set_sleep(struct pipe_exec *x, const struct pipe_costs *c);
/* Compute actions the last step slept (0 without synthetic compute). */
int pipe_exec_slept(const struct pipe_exec *x);

/* Where this stage's table fires the stage_sums hook (struct
 * pipe_hooks): the index of the action it goes before, or -1 (never). */
int pipe_exec_sums_at(const struct pipe_exec *x);

/* Sets the hooks every later step calls (NULL: none; copied). */
void pipe_exec_set_hooks(struct pipe_exec *x, const struct pipe_hooks *h);

/* The gate: the next pipe_exec_step (only that one) calls gate(ctx)
 * once, before its first action that moves anything between stages or
 * writes a gradient (a send, a receive, a backward, the head, the
 * embedding's backward, the expert-count sum, a reduce-scatter), and
 * posts no receive ahead before it; the actions before it only gather
 * and compute forwards. gate returns 0 to go on, or -errno, which ends
 * the step there: its gathers in flight are waited for and dropped and
 * every slot freed (win_end), as after a failure, and the step returns
 * that -errno; the caller may run the step again (the trainer's
 * update ahead: a stage that updated before the step's global norm
 * arrived learns at its gate whether that update stands, and runs the
 * step again after redoing it; docs/training-step.md). NULL: none. */
void pipe_exec_set_gate(struct pipe_exec *x, int (*gate)(void *ctx), void *ctx);
/* Whether this stage's list ends before another stage's in the table's
 * simulated times (the table's costs), so that it waits at the step's
 * end for the others (at the global norm), and it runs a chunk's forward
 * before its gate (its list does not begin with a receive): what the
 * trainer's update ahead can win on (zbv's stage 0). false without a
 * pipeline. */
bool pipe_exec_ends_early(const struct pipe_exec *x);

/* The groups whose gradients the table completes, in the order their
 * grads_done(landed false) comes: up to max of them into l0[], l1[]
 * (PIPE_HOOK_* as above); returns how many there are. */
int pipe_exec_grad_order(const struct pipe_exec *x, int *l0, int *l1, int max);

/* The compute actions timed by the last step: *n of them. */
const struct pipe_act_time *pipe_exec_times(const struct pipe_exec *x, int *n);

/* Layer-group all-gathers the last step started (the table's gathers per
 * stage and step when the weights are split over FSDP axes). */
int pipe_exec_gathers(const struct pipe_exec *x);

/* The table it runs. */
const struct pipe_table *pipe_exec_table(const struct pipe_exec *x);

/* Test hook: fills every buffer an action could read before it is
 * written (the microbatch buffers, the weight window's layer groups)
 * with NaN before each step. */
void pipe_exec_poison(struct pipe_exec *x, int on);

#endif
