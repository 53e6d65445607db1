/* The ssh backend of the launcher (host/launch/launch.h): one agent per
 * machine of a hostfile, started over ssh.
 *
 * Before anything starts it stages, for each machine, a directory holding
 * this binary, the resolved config, ca.pem and that machine's own
 * host<I>.pem/.key (nothing else's key), and copies it with one scp per
 * machine, all at once, to /tmp/meshrun-<run id> there (mode 0700). A
 * machine that cannot be reached stops the launch there: nothing runs, the
 * copies made are removed. Then each agent starts as
 *     ssh -n [-F CONFIG] [-p PORT] [user@]host \
 *         'cd RUN && echo $$ >pid && export MESHRUN_STATUS_FD=2 &&
 *          exec RUN/meshrun agent --config RUN/config.yaml
 *          --host-id I --hosts N --devices-per-host D --listen HOST:0 ...'
 * (BatchMode, absolute paths, nothing from a profile) and records its pid
 * in RUN/pid. Its status lines (host/launch/status.h) come back on ssh's
 * stderr; the supervisor below passes them to the launcher core's status
 * channel, so a host reported lost is killed at once: its supervisor by
 * the core, its agent by the recorded pid through ssh (stop_one). Each ssh runs under a small supervisor in its own session
 * (`meshrun launch --ssh-child`, ssh_child_main): the terminal's Ctrl-C
 * reaches only the launcher, which forwards it; the supervisor then stops
 * its remote agent by the recorded pid (SIGTERM, SIGKILL after 5 s or a
 * second signal). Every output line is printed as "[hostI] line" and kept
 * in LOGDIR/hostI.log; on a terminal host 0's step lines show as one
 * updating progress line instead (quiet: nothing is printed). At the end every remote agent still running is
 * stopped by its pid, the metrics and trace files (written by host 0) are
 * copied back, and the remote directory is removed unless keep.
 *
 * With restarts.max > 0 the core's restart loop (launch_restarting) runs
 * the agents again after a failure, in the same RUN: every agent still
 * running is stopped first (one ssh round), and the relaunch passes
 * --resume when host 0's checkpoint directory (--checkpoint-dir, else
 * RUN/ckpt: device 0, on host 0, writes and reads checkpoints) holds a
 * complete step directory written by this launch (asked with stat over
 * ssh), and `--restart N` on the Nth restart, so that host faults (kill,
 * stop) do not fire again. */
#ifndef MESHRUN_SSH_H
#define MESHRUN_SSH_H

#include <stdbool.h>
#include <stddef.h>

#include "host/launch/hostfile.h"
#include "host/launch/launch.h"

struct cfg;

struct ssh_launch_args {
	const struct hostfile_entry *hosts;
	int n;
	const char *ssh_config;   /* ssh -F; NULL: ssh's own */
	const char *certs;        /* ca.pem, host<I>.pem/.key (deploy/gen-certs.sh); NULL: throwaway */
	const char *log_dir;      /* local, exists: hostI.log, config.yaml */
	int devices_per_host;
	const char *metrics;      /* local paths, NULL: none */
	const char *trace;
	const char *ckpt_dir;     /* a path on the machines, NULL: none */
	bool resume;              /* the agents start with --resume */
	/* restarts (host/launch/launch.h); ssh_launch fills in launch,
	 * checkpoint and ctx. max 0: none */
	struct launch_restarts restarts;
	const char *who;          /* "meshrun: launch", for restart lines */
	bool keep, quiet;
	long long total_steps;    /* for the progress line on a terminal; 0: none */
	/* set (by the caller's signal handler) when the user interrupted:
	 * checked after the copy, so that nothing starts; NULL: never */
	const volatile int *interrupted;
};

/* What the launch took, for bench/README.md (seconds from the call). */
struct ssh_timing {
	double staged, copied;    /* certificates + staging; every scp done */
	double first_output;      /* the first line from any agent (ssh + exec) */
	double first_step;        /* the first "completed step" line; 0: none */
};

/* Launches and supervises the run for the finished config c (its
 * coordinator_address host becomes the first machine's, certs_dir and
 * hosts are set for the machines). Returns launch_run's result, or
 * -EHOSTUNREACH when a machine could not be prepared (nothing started),
 * -EINTR when interrupted before the agents started, or another -errno;
 * err says what. */
int ssh_launch(const struct ssh_launch_args *a, struct cfg *c, const struct launch_opts *o,
	       struct launch_result *r, struct ssh_timing *t, char *err, size_t errlen);

/* The remote command (a shell line, as above) that starts agent i of the
 * launch whose run id is id (RUN is /tmp/meshrun-<id>): with --resume
 * when resume, and `--restart N` on the Nth restart (restart > 0; the
 * first launch has none). Used by ssh_launch; exposed for tests. */
void ssh_agent_cmd(char *out, size_t len, const struct ssh_launch_args *a, const char *id, int i,
		   int restart, bool resume);

/* The per-agent supervisor: argv is {"--ssh-child", OUTFD, RUNDIR, "--",
 * ssh argv ..., remote command}. Returns its exit code (ssh's, or 128 +
 * the signal that ended ssh). */
int ssh_child_main(int argc, char **argv);

#endif
