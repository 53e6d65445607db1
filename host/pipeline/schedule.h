/* Pipeline schedules as data. A builder turns a pipeline's shape (stages,
 * microbatches, repeats, delay, weight mode) into one ordered table of
 * actions per (iteration, stage); one executor runs any table, so another
 * order (interleaved 1F1B, zero bubble) is another builder, not another
 * executor. Pure: no I/O, no threads, no mesh, no model.
 *
 * Names: S stages, M microbatches, R repeats, Lps layers per stage, d the
 * forwarding delay (2 with pipeline_delay_activation_forwarding, else 1).
 * Stage s of repeat r runs decoder layers (r*S + s)*Lps .. +Lps-1 of the
 * pipelined ones (pipe_layer). W[r,s] is the weights of those layers. */
#ifndef MESHRUN_PIPELINE_SCHEDULE_H
#define MESHRUN_PIPELINE_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

/* How a stage's FSDP-sharded weights are gathered. */
enum pipe_wmode {
	PIPE_W_ITER,   /* neither flag (MaxText's default): gather W[r,s] for every
			* iteration that uses it, reduce-scatter every contribution */
	PIPE_W_ONCE,   /* pipeline_fsdp_ag_once: gather every repeat's W[.,s] once
			* per step, reduce-scatter every dW[.,s] once at the end */
	PIPE_W_REPEAT, /* pipeline_fsdp_ag_per_repeat: two slots, W[r+1,s] gathered
			* while repeat r runs (the window rule below) */
	PIPE_W_COUNT
};

struct pipe_shape {
	int stages;           /* S >= 1 */
	int microbatches;     /* M: a multiple of S, >= 2S when delay is 2 */
	int repeats;          /* R >= 1 */
	int layers_per_stage; /* Lps >= 1 */
	int delay;            /* d: 1 or 2 */
	enum pipe_wmode wmode;
};

enum pipe_pass { PIPE_PASS_FWD, PIPE_PASS_BWD };

/* What one entry asks the device(s) of `stage` to do. Activations and
 * gradients are [microbatch rows, T, C] blocks. */
enum pipe_op {
	/* forward pass */
	PIPE_TAKE_INPUT,  /* stage 0, repeat 0: microbatch mb from the layers
			   * before the pipeline becomes this iteration's input */
	PIPE_RECV,        /* this iteration's input arrives from stage peer, which
			   * sent it at iteration peer_iter */
	PIPE_FORWARD,     /* run the stage's layers of repeat on microbatch mb with
			   * the weights in weight slot `slot`; save the input */
	PIPE_SEND,        /* send the output to stage peer, which takes it at
			   * iteration peer_iter (> iter: never wait for it here) */
	PIPE_GIVE_OUTPUT, /* stage S-1, repeat R-1: the output of microbatch mb
			   * leaves for the layers after the pipeline */
	/* backward pass */
	PIPE_TAKE_DOUT,   /* stage S-1, repeat R-1: the gradient of mb's output */
	PIPE_RECV_GRAD,   /* the gradient of this slot's output arrives from
			   * stage peer, sent at (forward-numbered) peer_iter */
	PIPE_BACKWARD,    /* recompute the forward of (mb, repeat) from its saved
			   * input with the weights in `slot`, back-propagate;
			   * dW accumulates (+=) into gradient buffer gslot */
	PIPE_SEND_GRAD,   /* the input gradient to stage peer for peer_iter */
	PIPE_GIVE_DIN,    /* stage 0, repeat 0: the gradient of mb's input leaves
			   * for the layers before the pipeline */
	/* weights, both passes */
	PIPE_GATHER,      /* start the all-gather of W[repeat, stage] into weight
			   * slot `slot`; the first entry using the slot waits */
	PIPE_RELEASE,     /* W[repeat, stage] in `slot` is no longer needed */
	PIPE_REDUCE_SCATTER, /* dW[repeat, stage] in gradient buffer `slot` is
			   * complete: start its reduce-scatter; the next
			   * PIPE_BACKWARD into that buffer waits for it */
	PIPE_OP_COUNT
};

struct pipe_entry {
	enum pipe_op op;
	enum pipe_pass pass;
	int iter;       /* iteration, numbered as in the forward pass: 0..T-1 */
	int stage;
	int mb;         /* microbatch, -1 for weight entries */
	int repeat;
	int slot;       /* FORWARD, BACKWARD, GATHER, RELEASE: weight slot;
			 * REDUCE_SCATTER: gradient buffer; else -1 */
	int gslot;      /* BACKWARD: gradient buffer; else -1 */
	int peer;       /* SEND*, RECV*: the other stage; else -1 */
	int peer_iter;  /* SEND*: the iteration the RECV* sits at; RECV*: the
			 * iteration of the SEND*; else -1 */
};

/* The table. Entries are in execution order for every stage: the forward
 * pass, iterations 0..T-1, then the backward pass, iterations T-1..0; in
 * one iteration a stage's entries come in the order it runs them. A device
 * of stage s runs the entries whose stage is s, in table order, and
 * nothing else; entries of different stages in one iteration are
 * independent (every transfer is taken at least one iteration after it is
 * sent, in its pass's direction of time). */
struct pipe_schedule {
	struct pipe_shape shape;
	int iterations;    /* T = R*M + d*(S-1) */
	int weight_slots;  /* gathered weight copies a stage allocates */
	int grad_slots;    /* gradient buffers a stage allocates */
	int n;
	struct pipe_entry *e;
};

/* The circular schedule (MaxText's SPMD pipeline with repeats):
 *  - iteration i, stage s is active only when 0 <= i - d*s < R*M and then
 *    runs microbatch (i - d*s) mod M of repeat (i - d*s) / M;
 *  - stage s > 0 takes what stage s-1 made d iterations earlier; stage 0
 *    takes a fresh microbatch while i < M, else stage S-1's output of the
 *    previous repeat, made at i - M + d*(S-1) (the circular hop);
 *  - backward: the same slots from T-1 down to 0, gradients going the
 *    other way (stage s to s-1, stage 0 to S-1 for repeats > 0);
 *  - weights by s->shape.wmode. PIPE_W_REPEAT: W[0,s] is gathered first and
 *    W[1,s] next, both at iteration 0, into slots 0 and 1; at iteration
 *    r*M + d*s (r >= 1) stage s switches to W[r,s] in slot r%2, releases
 *    W[r-1,s] and gathers W[r+1,s] into its slot, used first M iterations
 *    later (at r = R-1 it keeps W[R-2,s]: the backward pass needs it
 *    next). Backward: after reverse iteration r*M + d*s, dW[r,s] (buffer
 *    r%2) is complete: it is reduce-scattered, W[r,s] released and
 *    W[r-2,s] gathered into its slot, used first M iterations later.
 * Fills *out (allocates out->e). 0, -EINVAL with err for an impossible
 * shape, -ENOMEM. */
int pipe_schedule_circular(struct pipe_schedule *out, const struct pipe_shape *p,
			   char *err, size_t errlen);
/* Frees the entries; *s may be zeroed or released again after. */
void pipe_schedule_release(struct pipe_schedule *s);

/* 0, or -EINVAL with err when the shape cannot be scheduled. */
int pipe_shape_check(const struct pipe_shape *p, char *err, size_t errlen);
/* T = R*M + d*(S-1). */
int pipe_iterations(const struct pipe_shape *p);
/* Whether stage s is active at iteration i; if so *mb and *repeat. */
bool pipe_active(const struct pipe_shape *p, int i, int s, int *mb, int *repeat);
/* The weight slots (and gradient buffers) a stage's table uses: 1, R
 * (PIPE_W_ONCE), min(R, 2) (PIPE_W_REPEAT); slot k holds one W[r,s]. */
int pipe_weight_slots(const struct pipe_shape *p);
/* Index among the pipelined layers of layer j of stage s in repeat r. */
int pipe_layer(const struct pipe_shape *p, int repeat, int stage, int j);

/* What a table costs one device of a stage, read off the table. */
struct pipe_stats {
	int active;          /* forward slots per stage (R*M) */
	int saved_inputs;    /* stage inputs held for the backward pass at most */
	int gathers;         /* all-gathers of one W[r,s] per stage per step */
	int reduce_scatters; /* reduce-scatters of one dW[r,s] per stage per step */
	int max_weights;     /* most gathered weight copies live at once */
	int max_grads;       /* gradient buffers used (highest gslot + 1) */
	int max_circ;        /* most microbatches stage 0 holds for the circular
			      * hop: sent by stage S-1, not yet used (counting the
			      * one used in the current iteration) */
	int max_circ_grad;   /* the same for gradients held by stage S-1 */
};
void pipe_schedule_stats(const struct pipe_schedule *s, struct pipe_stats *st);

/* The stage that embeds microbatch mb and computes its loss (the layers
 * outside the pipeline run data-parallel over `stage`): mb mod S. */
int pipe_owner(const struct pipe_shape *p, int mb);

/* The activation buffers one device of stage s allocates to run the
 * table, each one microbatch's stage input ([microbatch rows, T, C]),
 * read off the table: the executor allocates exactly these and
 * `meshrun schedule` prints them. */
struct pipe_bufs {
	int saved;   /* stage inputs of its active slots, from the forward to
		      * the backward that recomputes from them: R*M */
	int out;     /* forward outputs, each from its FORWARD until its
		      * receiver took it */
	int grad;    /* gradients, each from its arrival (TAKE_DOUT,
		      * RECV_GRAD) until the receiver of the input gradient
		      * took it */
	int owned;   /* microbatches the stage owns (pipe_owner): M/S, each
		      * with four buffers: its input, the pipeline's output,
		      * that output's gradient, the input's gradient */
	int scratch; /* the recompute's output in the backward: 1 */
};

/* The buffers of stage s. A buffer taken at pass time t (forward:
 * iteration i; backward: T-1-i) is free for another slot from the
 * iteration after its receiver took it (a RECV at iteration j frees it
 * at j + 1; a copy to this stage at once); an output leaving the
 * pipeline for another stage (GIVE_OUTPUT, GIVE_DIN) is taken after the
 * pass and never reused in it. The lowest free buffer is taken. out_of
 * and grad_of (each R*M ints, slot repeat*M + mb; either may be NULL)
 * receive each slot's output and gradient buffer. 0 or -ENOMEM. */
int pipe_stage_bufs(const struct pipe_schedule *sc, int s, struct pipe_bufs *b, int *out_of,
		    int *grad_of);
/* Every buffer of b. */
int pipe_bufs_total(const struct pipe_bufs *b);

const char *pipe_op_name(enum pipe_op op);
const char *pipe_wmode_name(enum pipe_wmode m);

#endif
