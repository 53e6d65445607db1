/* The Slurm backend of the launcher (host/launch/launch.h): one agent per
 * node of the allocation it runs in (deploy/slurm.sbatch runs it in the
 * batch script), each started by its own job step
 *     srun --nodes=1 --ntasks=1 --nodelist=NODE --job-name=meshrun-hostI
 *          --kill-on-bad-exit=1 BIN agent --host-id I --hosts N
 *          --devices-per-host D --listen ADDR:0 ARGS...
 * with MESHRUN_COORDINATOR (host 0's NodeAddr) and MESHRUN_STATUS_FD=2 in
 * its environment: the agent's status lines come back on srun's stderr,
 * so a host reported lost is killed at once, its step cancelled
 * (scancel --signal=KILL of the step named meshrun-hostI, found with
 * squeue); when the core stops the survivors, every step of the launch is
 * cancelled the same way. Nodes are named by `scontrol show hostnames`
 * and addressed by their NodeAddr (`scontrol show node`), so node names
 * need not resolve. BIN, the config and --checkpoint-dir are on a shared
 * file system.
 *
 * With restarts the core's loop (launch_restarting) relaunches after a
 * failure, with --resume from the newest complete checkpoint this launch
 * wrote and `--restart N` on the Nth restart (host faults do not fire
 * again). Before each relaunch it asks every node of the last launch to
 * run a trivial step (srun --overlap ... true, 30 s at most): a node that
 * cannot is gone for good (its slurmd or machine died; the allocation,
 * submitted with --no-kill, keeps the others). Then shrink (the
 * caller's: the mesh along data for fewer hosts, the global batch kept)
 * says which keys the agents get on the nodes left, or why the mesh
 * cannot shrink, which ends the job naming the node. */
#ifndef MESHRUN_SLURM_H
#define MESHRUN_SLURM_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "host/launch/launch.h"

#define SLURM_MAX_NODES 256
#define SLURM_MAX_KEYS 8
#define SLURM_ARGS_MAX 160

/* The job on `hosts` hosts: key=value words for the agents into
 * keys[0..*n) (each at most 64 bytes), or -errno with why (one line). */
typedef int (*slurm_shrink_fn)(void *ctx, int hosts, char keys[][64], int *n, char *why, size_t whylen);

struct slurm_launch_args {
	int argc;                 /* the agents' own arguments: --config FILE, key=value, ... */
	char **argv;
	int devices_per_host;
	const char *ckpt_dir;     /* on the shared file system, NULL: none */
	bool resume;              /* the agents start with --resume */
	time_t t0;                /* when the launch started (checkpoints newer count) */
	/* restarts (host/launch/launch.h); slurm_launch fills in launch,
	 * checkpoint, regroup and ctx. max 0: none */
	struct launch_restarts restarts;
	const char *who;          /* "meshrun: launch", for restart lines */
	slurm_shrink_fn shrink;   /* NULL: a lost node ends the job */
	void *shrink_ctx;
};

/* Host i's job step as slurm_launch starts it. */
struct slurm_step {
	const char *srun, *self;       /* srun's path; this binary's */
	const char *node, *addr;       /* the node's name; its NodeAddr */
	int host, hosts;               /* I, N */
	const char (*keys)[64];        /* shrink's words for the agents */
	int nkeys;
	int restart;                   /* 0: the first launch; N: the Nth restart */
	bool resume;                   /* this launch resumes from a checkpoint */
};

/* The srun argv of step s (above; --resume when s->resume and the
 * agents' own arguments lack it; `--restart N` when s->restart > 0):
 * the strings it formats go into store (SLURM_ARGS_MAX x 512), the
 * others are pointed to. 0, or -E2BIG when it holds more than
 * SLURM_ARGS_MAX - 1. Used by slurm_launch; exposed for tests. */
int slurm_step_argv(const struct slurm_launch_args *a, const struct slurm_step *s, char **v,
		    char (*store)[512]);

/* Launches and supervises the agents on the allocation's nodes
 * (SLURM_JOB_NODELIST, host 0 first), restarting as above. Returns
 * launch_restarting's result, or -errno when not in an allocation or
 * the nodes cannot be named (err says what). */
int slurm_launch(const struct slurm_launch_args *a, const struct launch_opts *o, struct launch_result *r,
		 char *err, size_t errlen);

#endif
