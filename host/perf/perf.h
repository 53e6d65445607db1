/* The step-time model (`meshrun plan`, docs/plan.md): predicts one
 * training step's seconds and each device's memory for a config, from a
 * few figures measured on this machine or given (a layer's compute at the
 * model's shapes, or a FLOP rate; each link's bandwidth and latency) and
 * what the config makes the step do: the schedule's table (the same one
 * the executor runs, here timed by a simulation in which devices that
 * share a machine's cores share them), the sharding plan's collectives
 * (inside the actions, or after the table) and the optimizer. It runs no
 * step and allocates no model, so it plans meshes far larger than this
 * machine. Its limits are listed in docs/plan.md. */
#ifndef MESHRUN_PERF_H
#define MESHRUN_PERF_H

#include <stdbool.h>
#include <stddef.h>

#include "host/config/config.h"
#include "host/model/model.h"

/* A link: bytes per second each way, seconds per message. */
struct perf_link {
	double bw, lat;
};

/* The machine: links between hosts (DCN) and inside one (ICI); compute
 * per device given as a FLOP rate (flops > 0: analytic) or measured;
 * cores > 0: all devices share that many cores (every host on one
 * machine, as `meshrun local` runs them: a device computes at min(1,
 * cores / (devices computing x threads)) of its measured speed); device
 * memory for --search. */
struct perf_trace;

/* How a run's costs are taken (`--costs-by`): each action its kind's
 * mean CPU on its stage; each its own mean CPU over the steps (the run's
 * spread from one microbatch to the next); each its own mean wall time,
 * the cores not shared (the shared cores' stretch is in the walls: the
 * model's timeline alone, its dependencies and transfers, is tested),
 * and each send the device's untraced time shared over its sends. */
enum perf_run_by { PERF_RUN_KIND, PERF_RUN_ACTION, PERF_RUN_WALL };

struct perf_machine {
	struct perf_link dcn, ici;
	double flops;
	double cores;
	double mem_bytes;
	/* the split backward's I and W as fractions of a layer's backward B
	 * (both > 0: given, e.g. from `meshrun bench backward`'s I/B and
	 * W/B; else the compute figures' own i_layer and w_layer) */
	double i_frac, w_frac;
	/* a run's own costs (`--costs-from TRACE`): each action's time is the
	 * mean CPU of its kind on its stage in the run, the optimizer the
	 * run's, the cores (unless cores > 0) those the run's devices got;
	 * the table must be the run's (perf_predict refuses another) */
	const struct perf_trace *run;
	enum perf_run_by run_by;
};

/* Seconds of one microbatch's compute on one device, at its shard of
 * the model. */
struct perf_compute {
	double f_layer[2], b_layer[2];  /* [dense, MoE]: forward; backward without recompute */
	double i_layer[2], w_layer[2];  /* the split backward: input gradients (I, without the
					 * recomputed forward) and weight gradients (W) */
	double head;                    /* final norm, projection, loss: forward + backward */
	double embed_f, embed_b;
	double opt_per_float;           /* the optimizer's seconds per trained local float */
	double ns_per_flop;             /* Muon's Newton-Schulz: seconds per flop */
	/* CPU seconds a byte of an encrypted transfer costs the sending and
	 * the receiving device (0: not charged, e.g. from --flops) */
	double xfer_send, xfer_recv;
	/* the dense layer's forward as the threads beside the measuring one
	 * ran it meanwhile (mean CPU seconds a call; 0: none ran beside) */
	double f_beside;
	/* the cores the measuring thread and those beside it got between
	 * them (CPU seconds over the wall seconds of the cores_window seconds
	 * they ran; 0: none beside) */
	double cores_seen, cores_window;
	int rows;                       /* the microbatch rows they are for */
	int threads;                    /* OpenBLAS threads they were measured with (0: analytic) */
	bool w_in_place;                /* I and W measured with W reading the weights' inputs in
					 * place (pipeline_recompute false, as the run's), not a
					 * copy in the stash */
};

/* Action kinds of the table's work (perf_parts.work_kind): F (and the
 * counting F), B, I, W (with recompute, B and I include the forward
 * they recompute), the owners' embed, head and embed_back, and the
 * transfers' CPU (sends and receives: encrypting, copying, decrypting). */
#define PERF_STAGES 16

enum { PERF_F, PERF_B, PERF_I, PERF_W, PERF_OWN, PERF_XFER, PERF_KINDS };

/* A run's --trace, as `plan --costs-from` reads it: each device's
 * compute actions (F, B, I, W, Fc of a microbatch and chunk; the owners'
 * embed, head, embed_back) in the steps after the first (all of them if
 * there is one), in time order. */
struct perf_tspan {
	char name[32];  /* as traced: "F mb3 c1", "head mb0" */
	int op;         /* its enum pipe_act */
	int step;
	double ts, dur, cpu;  /* seconds: start, wall, the device thread's CPU */
};

struct perf_trace {
	char path[256];          /* the file, for messages */
	int ndev;                /* devices 0 .. ndev-1 (trace rows tid < TRACE_COMM_TID) */
	struct perf_tspan **sp;  /* [ndev] */
	int *n;                  /* [ndev] */
	int step0, step1;        /* the steps read */
	double step_s, fb_s, opt_s; /* mean spans over devices and steps: the step,
				     * its forward+backward, its optimizer */
	/* [ndev] seconds a step of the device's forward+backward not in any
	 * span of its row (neither compute nor a wait): its sends' encryption
	 * and writing (net/direct.c runs them on the device thread) and the
	 * executor's own time; mean over the steps read */
	double *untraced;
	/* [ndev] the transfers' CPU (the device thread's, args.cpu_us of
	 * the "stage send" spans, encrypting and writing, and of the "stage
	 * recv" spans, polling the link: reading, decrypting, apart from
	 * their walls, the waits) and their counts, over the steps read;
	 * xfer_traced false for a trace without them (older ones) */
	double *send_cpu, *recv_cpu;
	int *nsend, *nrecv;
	bool xfer_traced;
	/* [ndev] the executor's own transport work on the device thread,
	 * over the steps read: the CPU of its "stage post" spans (posting
	 * receives ahead, testing them) and of its "stage send wait" spans
	 * (waiting for a send before its buffer is reused, polling the
	 * link); exec_traced false for a trace without them (older ones) */
	double *post_cpu, *wait_cpu;
	bool exec_traced;
	/* [ndev] the device thread's CPU in its forward+backward, mean a step
	 * (-1: not traced) */
	double *fb_cpu;
	/* the cores the devices got: C such that the compute spans' CPU is
	 * the integral of min(devices computing, C) over their time (the
	 * fluid model's share, fitted); at most the most at once */
	double cores;
};

/* Reads a --trace file. 0, or -EINVAL with err naming the file (not
 * JSON, no compute action spans, a span without its CPU), -ENOMEM.
 * The caller releases tr. */
int perf_trace_read(const char *path, struct perf_trace *tr, char *err, size_t errlen);
void perf_trace_release(struct perf_trace *tr);

/* The prediction. */
struct perf_parts {
	double step;          /* predicted seconds of one step */
	double table;         /* the schedule's table, first action to last */
	double compute;       /* the busiest device's compute in it, at full speed */
	double running;       /* the time it computes (longer when cores are shared) */
	double bubble;        /* the worst device's idle share between its
			       * first and last compute action (the
			       * schedule's bubble, waits for transfers and
			       * gathers) */
	double tail;          /* gradient sums after the table (exposed) */
	double optimizer;     /* with Muon, its Newton-Schulz (muon_ns) and exchanges */
	double muon_ns;       /* of it, Muon's Newton-Schulz: each matrix once
			       * over its group, a group member's share */
	double work;          /* every device's compute and optimizer at full
			       * speed, summed: the CPU seconds a step needs */
	double work_kind[PERF_KINDS];  /* the table's part of it by action kind */
	/* with a run's costs, what the transfers were charged: */
	enum { PERF_XFER_NONE, PERF_XFER_TRACED, PERF_XFER_UNTRACED } xfer_by;
	/* bytes per device */
	double mem_params, mem_grads, mem_opt, mem_window, mem_act, mem_total;
	int stages, microbatches, chunks, mb_rows;
	/* per stage (the first PERF_STAGES): compute at full speed, and the
	 * span from the table's first compute to the stage's last end */
	double stage_busy[PERF_STAGES], stage_end[PERF_STAGES];
	/* with a run's costs, the same of the run (means over the steps read,
	 * the stage's first device): its compute's CPU and wall seconds, and
	 * its last end from the step's first compute start on any device */
	double run_cpu[PERF_STAGES], run_wall[PERF_STAGES], run_end[PERF_STAGES];
};

/* The microbatch rows of c's step on one device. */
int perf_mb_rows(const struct cfg *c, const struct model_dims *d, char *err, size_t errlen);

/* Measures pc at rows microbatch rows of c's model with `threads`
 * OpenBLAS threads (one layer of each kind, the head, the embedding,
 * AdamW), each the mean CPU seconds of a few runs after a warm-up,
 * while `beside` threads run the layer's forward meanwhile (a run's
 * other devices on the machine: 0 for the compute alone; their forwards
 * set the figures' level, f_beside), and the transfers' CPU a byte.
 * 0, -EINVAL with err, -ENOMEM. */
int perf_measure(const struct cfg *c, int rows, int threads, int beside, struct perf_compute *pc,
		 char *err, size_t errlen);

/* The cores the devices of one machine share, as the model needs them:
 * `devices` threads run one layer's forward at once for about `seconds`;
 * returns their CPU seconds over the wall seconds: the machine's cores
 * (at most `devices`) when nothing else runs, fewer under load; or 0. */
double perf_measure_cores(const struct cfg *c, int rows, int threads, int devices, double seconds);

/* The same from FLOPs at `flops` per second (matmuls and attention only). */
void perf_analytic(const struct model_dims *d, int rows, double flops, struct perf_compute *pc);

/* Predicts c's step (c finished for its mesh). pc: measured at the
 * config's microbatch rows (scaled by rows if not), or NULL with
 * mc->flops > 0. 0, or -EINVAL with err for a config that cannot run, or
 * (mc->run) a trace whose devices or compute actions are not those of
 * c's table (naming the device, step and action). */
int perf_predict(const struct cfg *c, const struct perf_machine *mc, const struct perf_compute *pc,
		 struct perf_parts *out, char *err, size_t errlen);

/* --search: the best configurations of c's model for hosts x dph
 * devices: stages, tensor, fsdp and data degrees, schedule, microbatches;
 * prints the best `top`, fastest first. 0 or -EINVAL with err. */
int perf_search(const struct cfg *c, int hosts, int dph, const struct perf_machine *mc, int top,
		char *err, size_t errlen);

#endif
