/* Pipeline schedules as per-device action lists (docs/pipeline.md). A
 * builder orders each stage's compute (forward F, full backward B, or the
 * split backward I then W, of a microbatch through a chunk of layers);
 * lowering passes add everything else the step does (the owners'
 * embedding, head and loss, the MoE expert-count sum, the sends and
 * receives, the weight gathers and reduce-scatters); a simulation gives
 * every action a time and sizes the buffers from their lifetimes; a
 * validator re-runs the lists and refuses a broken table naming the
 * action. One executor (exec.h) runs any table; a run without a pipeline
 * is a table of one stage. Pure: no I/O, no threads, no mesh, no model.
 *
 * Names: S stages (devices of a stage group, one per stage), M
 * microbatches, v chunks per stage (`num_pipeline_repeats`; R for the
 * circular schedule), Lps layers per chunk, d the forwarding delay of the
 * circular schedule. Chunk c (0 .. S*v-1, in layer order) runs pipelined
 * layers c*Lps .. c*Lps + Lps - 1 on stage pipe_chunk_stage(c): c mod S
 * (so chunk r*S + s is repeat r of stage s), or for zbv the V: c for
 * c < S, 2S-1-c after. */
#ifndef MESHRUN_PIPELINE_SCHEDULE_H
#define MESHRUN_PIPELINE_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pipe_sched {
	PIPE_CIRCULAR,    /* MaxText's: every forward, then every backward, chunks in
			   * turn (GPipe with repeats); delayed forwarding */
	PIPE_GPIPE,       /* every forward, then every backward; one chunk a stage */
	PIPE_1F1B,        /* one forward, one backward (PipeDream-flush); one chunk */
	PIPE_INTERLEAVED, /* Megatron's interleaved 1F1B, v chunks a stage, M a
			   * multiple of S */
	PIPE_ZB_H1,       /* zero bubble H1 (Qi et al. 2023): 1F1B with B split
			   * into I and W, stage s delaying its W by s */
	PIPE_ZBV,         /* zero bubble V: two chunks a stage in a V, I and W */
	PIPE_SCHED_COUNT
};

/* How a stage's FSDP-sharded weights are gathered. */
enum pipe_wmode {
	PIPE_W_ITER,   /* neither flag (MaxText's default): gathered for every
			* action that uses them, reduce-scattered after each
			* that adds to their gradients */
	PIPE_W_ONCE,   /* pipeline_fsdp_ag_once: every chunk of the stage gathered
			* at the start, each reduce-scattered after its last
			* gradient */
	PIPE_W_REPEAT, /* pipeline_fsdp_ag_per_repeat: two gathered chunks; when
			* a stage moves to a new chunk it drops the one used
			* again last and gathers the next one it will need */
	PIPE_W_AHEAD,  /* the step without a pipeline: one gathered chunk, the
			* next one gathered while it computes */
	PIPE_W_COUNT
};

/* Layers outside the pipeline (run by each microbatch's owner). */
enum pipe_outside { PIPE_OUT_NONE, PIPE_OUT_BEFORE, PIPE_OUT_AFTER };

struct pipe_shape {
	enum pipe_sched sched;
	int stages;           /* S >= 1 */
	int microbatches;     /* M >= 1 */
	int repeats;          /* v: chunks per stage */
	int group;            /* interleaved_1f1b: microbatches a chunk runs
			       * before the next (g; 0: S, the paper's);
			       * S <= g <= M, the last group M mod g when not
			       * 0, which must then be >= S */
	int layers_per_stage; /* Lps: layers of a chunk */
	int delay;            /* d: 1, or 2 (circular only) */
	enum pipe_wmode wmode;
	bool recompute;       /* B recomputes its forward from the chunk's saved
			       * input; else F keeps the layers' activations */
	bool moe;             /* the model counts experts: COUNT_SUM, and a
			       * counting forward pass first when the schedule
			       * runs a backward before the last forward */
	enum pipe_outside outside;
	bool one_device;      /* the step without a pipeline: a chunk per layer,
			       * each with its own activation storage */
};

/* What one action asks a device of `stage` to do. */
enum pipe_act {
	PA_EMBED,       /* owner: embed microbatch mb (and the layers before the
			 * pipeline) into buf[0]; val.pass 1: for the counting
			 * pass */
	PA_F,           /* forward of (mb, chunk): buf[0] in, buf[1] out */
	PA_B,           /* backward: buf[0] the chunk's input, buf[1] the output's
			 * gradient, turned into the input's in place */
	PA_I,           /* input-gradient backward: buf[0] input, buf[1] the
			 * output's gradient (kept for W), buf[2] the input's */
	PA_W,           /* weight-gradient backward: buf[0] input, buf[1] the
			 * output's gradient */
	PA_HEAD,        /* owner: the layers after the pipeline, head, loss and
			 * their backward: buf[0] the pipeline's output, buf[1]
			 * its gradient */
	PA_EMBED_BACK,  /* owner: the layers before (recomputed) and the
			 * embedding, backward: buf[0] the gradient */
	PA_FC,          /* counting forward (pass 1): only the expert counts of
			 * (mb, chunk) are kept; buf[0] in, buf[1] out (-1: none) */
	PA_COUNT_SUM,   /* the expert counts summed over the rows' axes and stage */
	PA_SEND,        /* value `val` (buf[0]) to stage peer; waited only when
			 * its buffer is written again and at the end */
	PA_RECV,        /* value `val` from stage peer into buf[0] */
	PA_GATHER,      /* weights of group `chunk` into window slot `slot` */
	PA_RELEASE,     /* done with the weights in slot */
	PA_REDUCE_SCATTER, /* the gradients in slot leave for their shards */
	PA_COUNT
};

/* Weight groups besides the chunks (PA_GATHER's chunk). */
#define PIPE_G_NONLAYER (-1) /* embedding, final norm, head */
#define PIPE_G_OUTSIDE  (-2) /* the layers outside the pipeline */

/* A value moving between actions: the activation entering chunk e
 * (e = S*v: the pipeline's output) of pass 0 (the step) or 1 (the
 * counting pass), or the gradient of that activation. */
enum pipe_vkind { PV_ACT, PV_GRAD };
struct pipe_val {
	uint8_t kind, pass;
	int16_t edge;
	int32_t mb;
};

struct pipe_action {
	uint8_t op;       /* enum pipe_act */
	int16_t chunk;    /* compute: its chunk; weights: the group */
	int32_t mb;       /* -1 for weights and COUNT_SUM */
	int16_t peer;     /* SEND, RECV: the other stage */
	int16_t slot;     /* weights: window slot; F, FC, B, I, W: the chunk's */
	int16_t aset;     /* F, B, I, W: activation set (0 when recomputed) */
	int16_t wset;     /* I, W: the stash of the split backward holding the
			   * chunk's weight-gradient operands from I to W */
	int32_t buf[3];   /* buffers, -1 none (see enum pipe_act) */
	struct pipe_val val; /* SEND, RECV */
	int32_t iter;     /* circular: the lockstep iteration; else -1 */
	double t0, t1;    /* simulated start and end (the table's costs) */
};

/* Relative costs of the actions of one microbatch through one chunk (B =
 * I + W when the backward is split), the owners' actions, and the time of
 * one transfer: hop from the send's start to its data at the receiver,
 * send of it on the sending stage (its thread's time in the send call,
 * part of hop; 0: a send costs its stage nothing). */
struct pipe_costs {
	double f, b, i, w, embed, head, embed_back, hop, send;
};

/* The table: one ordered list per stage. A device of stage s runs list s
 * in order and nothing else. */
struct pipe_table {
	struct pipe_shape shape;
	int nchunks;          /* S*v, 2S for zbv */
	int *n;               /* [S] actions of each stage */
	struct pipe_action **a; /* [S] */
	int *bufs;            /* [S] microbatch buffers a device allocates */
	int *scratch;         /* [S] scratch buffers besides them (0-2) */
	int *act_sets;        /* [S] sets of layer activations */
	int *w_stashes;       /* [S] stashes of the split backward: the most
			       * I's waiting for their W at once (0 without I) */
	int weight_slots;     /* window slot numbers a stage uses for chunks */
	int weight_windows;   /* chunks gathered (READY) at once at most */
	int iterations;       /* circular: T = R*M + d*(S-1); else 0 */
	bool count_pass;      /* a counting forward pass precedes the step */
	struct pipe_costs costs; /* the times' costs */
	double makespan;      /* last end, from the first start */
	double period;        /* the longest span of one stage (first start to
			       * last end): the step's time when steps overlap */
};

/* Builds the table of shape p: the schedule's order, the owners' actions,
 * the transfers and weights, times from pipe_costs_unit, buffers from
 * their lifetimes; validated. Fills *t (allocates). 0, -EINVAL with err
 * for a shape the schedule cannot run (naming what), -ENOMEM. */
int pipe_table_build(struct pipe_table *t, const struct pipe_shape *p, char *err, size_t errlen);
void pipe_table_free(struct pipe_table *t);

/* F 1, B 2 (I 1, W 1), owners' actions and transfers 0: the unit slots
 * the bubble formulas count. */
struct pipe_costs pipe_costs_unit(void);

/* Simulates t's lists with costs c (times into t->a[*][*].t0/t1,
 * t->makespan, t->period, t->costs). With check, also the buffers: every
 * read finds its value, no write lands on a value still needed, and
 * every value is gone once its last reader ran and its sends were taken.
 * Every send must have its receive, every W its I, every B or I its F;
 * the lists must not deadlock when a send completes only once its
 * receive runs and a device waits for it before writing its buffer
 * again. 0, or -EINVAL with err naming the stage and action. */
int pipe_table_simulate(struct pipe_table *t, const struct pipe_costs *c, bool check,
			char *err, size_t errlen);

/* The shape check of each schedule; 0 or -EINVAL with err. */
int pipe_shape_check(const struct pipe_shape *p, char *err, size_t errlen);
/* Chunks of the shape's schedule: S*v (2S for zbv). */
int pipe_nchunks(const struct pipe_shape *p);
/* The stage that runs chunk c. */
int pipe_chunk_stage(const struct pipe_shape *p, int c);
/* Whether the schedule runs MaxText's passes (circular, GPipe): every
 * forward, the owners' heads, every backward, the owners' embedding
 * backwards; a microbatch's owner is stage mb mod S. */
bool pipe_phased(const struct pipe_shape *p);
/* The stage that embeds microbatch mb (and back-propagates the
 * embedding), and the one that computes its loss: its owner in a phased
 * schedule, else the stage of the first chunk and of the last. */
int pipe_embed_stage(const struct pipe_shape *p, int mb);
int pipe_head_stage(const struct pipe_shape *p, int mb);
/* Index among the pipelined layers of layer j of stage s in repeat r (of
 * chunk r*S + s). */
int pipe_layer(const struct pipe_shape *p, int repeat, int stage, int j);
/* T = R*M + d*(S-1): the circular schedule's lockstep iterations. */
int pipe_iterations(const struct pipe_shape *p);
/* Whether the circular stage s is active at iteration i; if so *mb and
 * *repeat. */
bool pipe_active(const struct pipe_shape *p, int i, int s, int *mb, int *repeat);
/* The window slots a stage numbers, and the chunks READY at once. */
int pipe_weight_slots(const struct pipe_shape *p);
int pipe_weight_windows(const struct pipe_shape *p);
/* Whether a counting pass runs first (MoE, a backward before the last
 * forward). */
bool pipe_needs_count_pass(const struct pipe_shape *p);
/* Whether the schedule splits the backward into I and W. */
bool pipe_split_backward(enum pipe_sched s);
/* interleaved_1f1b's group: the microbatches a chunk runs before the
 * next (the shape's group, or S when it has none). */
int pipe_group(const struct pipe_shape *p);

/* The formulas of docs/pipeline.md at F=1, B=2 (or I = W = 1): the bubble
 * (idle fraction of the longest stage span; -1 when the schedule has no
 * closed form for the shape) and the peak of microbatch activations
 * stage s holds for its backward (chunk inputs from their F to their B or
 * W), in chunk units (interleaved: min(v M, 2(S-1-s) + (v-1) g + 1), g
 * the group). */
double pipe_bubble_formula(const struct pipe_shape *p);
int pipe_peak_formula(const struct pipe_shape *p, int s);

/* Landing buffers (host/pipeline/exec.c): a receive posted ahead while
 * its own table buffer is still in use lands in one of them. A stage
 * whose list receives allocates up to PIPE_LANDING, each of the largest
 * message it receives (one microbatch's activations, buf_bytes: every
 * transfer fills a microbatch buffer), at most PIPE_LANDING_BYTES of
 * them but at least one; a stage that receives nothing, none. The
 * executor allocates this many; `meshrun schedule` and `meshrun plan`
 * count them in their memory. */
#define PIPE_LANDING 4
#define PIPE_LANDING_BYTES (64u << 20)
int pipe_landing_bufs(const struct pipe_table *t, int s, size_t buf_bytes);

/* What a table costs one stage, read off it. */
struct pipe_stats {
	int forwards;        /* F actions */
	int peak_saved;      /* most chunk inputs held for a backward at once */
	int gathers;         /* chunk-group gathers */
	int reduce_scatters; /* chunk-group reduce-scatters */
	int max_weights;     /* most chunk groups gathered at once */
	double busy;         /* simulated compute time */
	double span;         /* first start to last end */
};
void pipe_stage_stats(const struct pipe_table *t, int s, struct pipe_stats *st);
/* The idle fraction of the longest stage span. */
double pipe_table_bubble(const struct pipe_table *t);

const char *pipe_act_name(enum pipe_act a);
const char *pipe_sched_name(enum pipe_sched s);
/* The schedule named, or -1. */
int pipe_sched_parse(const char *name);
const char *pipe_wmode_name(enum pipe_wmode m);
/* One action as text ("F mb3 c1", "recv act mb2 e1 from 0"). */
void pipe_action_text(const struct pipe_action *a, char *out, size_t len);

/* Message naming of a value for the transport: a kind (1..6) and an index
 * unique within the step for a pair of devices. */
enum pipe_msg { PIPE_MSG_IN = 1, PIPE_MSG_ACT, PIPE_MSG_OUT, PIPE_MSG_DOUT, PIPE_MSG_GRAD, PIPE_MSG_DIN };
void pipe_val_msg(const struct pipe_table *t, const struct pipe_val *v, uint32_t *kind, uint32_t *idx);

#endif
