/* The launcher core: starts a set of child processes, supervises them,
 * and stops them all when one fails or the user interrupts. Backends say
 * what to start; the core knows nothing of agents, certificates or hosts.
 *
 * A backend (local.c, ssh.c, slurm.c) fills one struct
 * launch_child per process it wants: the argv and environment to exec
 * (argv[0] a path, e.g. this binary, `ssh` or `srun`), a name for reports
 * ("host 1"), and the file descriptors the child must inherit. It may set
 * a stop action, run once when the core gives up on the children (the ssh
 * and Slurm backends stop their remote agents there). The
 * core then:
 *   - forks and execs every child (each dies with the launcher:
 *     PR_SET_PDEATHSIG), closing the inherited descriptors in the parent;
 *   - forwards SIGINT and SIGTERM to every child while it runs;
 *   - waits; after the first failure the others get grace_s to fail on
 *     their own, then are stopped: SIGTERM (and SIGCONT, so a stopped
 *     child takes it) and SIGKILL term_grace_s later (term_grace_s 0:
 *     SIGKILL at once), and the stop action runs;
 *   - reads each child's status channel (host/launch/status.h) when the
 *     backend asks for one: when child j reports "lost H", child H is
 *     killed (SIGKILL, which also ends a stopped process) at once, counts
 *     as a failure from that moment and stop_one(ctx, H) runs; children
 *     are numbered as hosts (child H is host H);
 *   - reports every failure in the order seen, the first first:
 *     "host 1 exited with code 5 (peer lost); host 0 was stopped by
 *     signal 9 (it outlived the others' failure)". */
#ifndef MESHRUN_LAUNCH_H
#define MESHRUN_LAUNCH_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LAUNCH_MAX_FDS 4

/* The agent flag a launcher sets on a restart's agents (`--restart N`,
 * N >= 1): the Nth restart of the job, whose host faults (kill, stop)
 * do not fire again. Never set on the first launch. */
#define LAUNCH_RESTART_FLAG "--restart"

/* Where a child's status lines (host/launch/status.h) come from. */
enum launch_status {
	LAUNCH_STATUS_NONE = 0,        /* no channel */
	/* a pipe the child inherits, its number in the child's environment
	 * as LAUNCH_STATUS_ENV (local) */
	LAUNCH_STATUS_FD,
	/* the pipe is the child's stderr: status lines are taken, every other
	 * line is copied to the launcher's stderr (ssh: the remote agent runs
	 * with LAUNCH_STATUS_ENV=2 and ssh carries its stderr back) */
	LAUNCH_STATUS_STDERR,
};

struct launch_child {
	char name[32];                 /* "host 1" */
	char **argv;                   /* NULL-terminated; argv[0] is the path */
	char **envp;                   /* NULL-terminated */
	int fds[LAUNCH_MAX_FDS];       /* inherited by this child only */
	int nfds;
	enum launch_status status;     /* zero: none */
	/* the CPUs the child may run on, set in it before exec (local.c's
	 * cpu_bind); NULL: the launcher's own */
	const cpu_set_t *cpus;
};

struct launch_opts {
	double grace_s;                /* after a failure, before stopping the rest */
	double term_grace_s;           /* SIGTERM to SIGKILL; 0: SIGKILL at once */
	/* words for a child's exit code in reports ("peer lost"); NULL: none */
	const char *(*exit_name)(int code);
	/* optional: run once when the core kills the survivors */
	void (*stop)(void *ctx);
	void *stop_ctx;
	/* optional: run when child i is killed because another reported it
	 * lost (ssh: stop the remote agent too), with stop_ctx */
	void (*stop_one)(void *ctx, int i);
	/* optional: run once, with loaded_ctx, when every child has reported
	 * "loaded" (its certificate files are read: local removes them) */
	void (*all_loaded)(void *ctx);
	void *loaded_ctx;
};

/* What happened. */
struct launch_result {
	int failures;                  /* children that did not exit 0 */
	int first;                     /* index of the first failure, or -1 */
	int first_code;                /* its exit code, or -1 if a signal ended it */
	bool first_lost;               /* the first failure: a child reported lost */
	bool interrupted;              /* SIGINT or SIGTERM arrived */
};

/* Starts n children, supervises them until all have ended and fills *r.
 * Returns 0 when every child exited 0 (and no signal arrived); -ECHILD
 * when some failed, with every failure reported in err as above; -EINTR
 * when interrupted and every child still exited 0; another -errno when a
 * child could not be started (err says which; the ones started are killed
 * and their ends reported after it). The parent's descriptors in the
 * children's fds are closed whatever happens. */
int launch_run(struct launch_child *kids, int n, const struct launch_opts *o,
	       struct launch_result *r, char *err, size_t errlen);

/* Restarts (--max-restarts K, every backend): what the loop needs from
 * the backend that launches. */
struct launch_restarts {
	int max;                       /* restarts allowed; 0: launch once */
	bool resume;                   /* the first launch resumes already */
	/* one launch of every child; restart: 0 for the first launch, N for
	 * the Nth restart, passed to every agent (`meshrun agent --restart N`:
	 * host faults fire only when it is 0); resume: the children resume
	 * from the newest complete checkpoint. Returns as launch_run. */
	int (*launch)(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
		      size_t errlen);
	/* the step of the checkpoint a relaunch would resume from: the newest
	 * complete one this job wrote (or any, when it resumed from the
	 * start); -1: none, the relaunch starts from step 0 */
	int64_t (*checkpoint)(void *ctx);
	/* whether a child's exit code is a run-time failure worth a restart
	 * (a peer lost, a crash), not one that would repeat (usage, config,
	 * input, refused) */
	bool (*retry_code)(int code);
	/* optional, before each restart: whether the failure took machines
	 * with it for good (a node gone, not an agent), and if so make the
	 * next launch run without them (a mesh shrunk along data). 0, with
	 * *what "" when nothing changed, else the words the restart line
	 * ends with (" on 2 of 3 nodes: ..."); -errno when no restart can
	 * work (the mesh cannot shrink), with *why naming the machine */
	int (*regroup)(void *ctx, char *what, size_t whatlen, char *why, size_t whylen);
	void *ctx;
};

/* Launches, and after each failure worth it (a child died, was lost or
 * failed with a retry_code; never after an interrupt) launches again, at
 * most rs->max times, with resume when a checkpoint is there and the
 * restart's number (1, 2, ...: the first launch is 0); prints
 * "WHO: FAILURE; restart N of K from checkpoint step S" (or "from the
 * start (no checkpoint yet)"; once resuming, it stays so; and regroup's
 * words) on stderr before each. When regroup says no restart can work,
 * its reason is appended to err ("FAILURE; node1 is gone and ...") and
 * the failure stands. Every launch is complete (its children all ended)
 * before the next. Returns the last launch's result. */
int launch_restarting(const char *who, const struct launch_restarts *rs, struct launch_result *r,
		      char *err, size_t errlen);

#endif
