/* `meshrun launch`: one agent per machine of a hostfile, over ssh
 * (host/launch/ssh.h). Also the hidden `meshrun launch --ssh-child ...`,
 * the supervisor the ssh backend runs around each ssh. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/hostfile.h"
#include "host/launch/slurm.h"
#include "host/launch/ssh.h"
#include "host/train/check.h"
#include "host/train/preflight.h"

struct launch_cli {
	const char *hostfile, *ssh_config, *certs, *log_dir;
	const char *metrics, *trace, *ckpt_dir;
	bool keep, quiet, resume, slurm;
	int max_restarts;
};

/* mkdir -p with mode for the last part */
static int make_dirs(const char *path, char *err, size_t errlen)
{
	char p[4096];
	snprintf(p, sizeof(p), "%s", path);
	for (char *s = p + 1; *s; s++)
		if (*s == '/') {
			*s = 0;
			mkdir(p, 0755);
			*s = '/';
		}
	if (mkdir(p, 0700) && errno != EEXIST) {
		snprintf(err, errlen, "unable to make the log directory '%.900s': %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* a path made absolute against the working directory (the agents' files
 * are copied back after the launcher may have been told a relative one) */
static const char *absolute(const char *p, char *buf, size_t len)
{
	char cwd[2048];
	if (!p || p[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		return p;
	if (snprintf(buf, len, "%s/%s", cwd, p) >= (int)len)
		return p;
	return buf;
}

/* ssh's own failures and an agent killed by a signal both end ssh with
 * 255 */
static const char *ssh_exit_name(int code)
{
	return code == 255 ? "ssh lost the agent: it was killed, or the connection failed"
			   : cli_exit_name(code);
}

/* an agent killed (ssh's 255) is worth a restart too */
static bool ssh_restart_code(int code)
{
	return code == 255 || cli_restart_code(code);
}

static volatile int launch_signals;

static void count_signal(int sig)
{
	(void)sig;
	launch_signals++;
}

static int run(struct launch_cli *l, const struct args *a, const struct mesh_args *m)
{
	static struct cfg cfg;
	struct hostfile_entry *hosts = NULL;
	struct mesh_args mm = *m;
	char err[1024] = "", log_dir[2048], mbuf[2048], tbuf[2048];
	int n = 0, rc;

	if (hostfile_read(l->hostfile, &hosts, &n, err, sizeof(err))) {
		cli_error("launch", "%s", err);
		return EXIT_INPUT;
	}
	mm.hosts = n;
	/* a bad config is said once, here, not by every agent */
	rc = cli_agent_check(a, &mm, "train", &cfg, err, sizeof(err));
	if (rc) {
		cli_error("launch", "%s", err);
		free(hosts);
		return rc;
	}
	if (l->max_restarts && cfg.checkpoint_period <= 0) {
		cli_error("launch", "config: --max-restarts needs checkpoint_period > 0 (got %lld)",
			  (long long)cfg.checkpoint_period);
		free(hosts);
		return EXIT_CONFIG;
	}
	if (l->log_dir) {
		snprintf(log_dir, sizeof(log_dir), "%s", l->log_dir);
	} else {
		char stamp[32];
		time_t now = time(NULL);
		strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", localtime(&now));
		snprintf(log_dir, sizeof(log_dir), "meshrun-runs/launch-%s-%d", stamp, (int)getpid());
	}
	if (make_dirs(log_dir, err, sizeof(err))) {
		cli_error("launch", "%s", err);
		free(hosts);
		return EXIT_FAIL;
	}
	struct ssh_launch_args sa = {
		.hosts = hosts,
		.n = n,
		.ssh_config = l->ssh_config,
		.certs = l->certs,
		.log_dir = log_dir,
		.devices_per_host = cfg.devices_per_host,
		.metrics = absolute(l->metrics, mbuf, sizeof(mbuf)),
		.trace = absolute(l->trace, tbuf, sizeof(tbuf)),
		.ckpt_dir = l->ckpt_dir,
		.resume = l->resume,
		.restarts = { .max = l->max_restarts, .retry_code = ssh_restart_code },
		.who = "meshrun: launch",
		.keep = l->keep,
		.quiet = l->quiet,
		.total_steps = cfg.steps,
		.interrupted = &launch_signals,
	};
	/* the first failure names its host; the others are stopped at once */
	struct launch_opts o = { .grace_s = 1.0, .exit_name = ssh_exit_name };
	struct launch_result r;
	struct ssh_timing t;
	struct sigaction s = { .sa_handler = count_signal }, old_int, old_term;
	sigemptyset(&s.sa_mask);
	sigaction(SIGINT, &s, &old_int);
	sigaction(SIGTERM, &s, &old_term);
	rc = ssh_launch(&sa, &cfg, &o, &r, &t, err, sizeof(err));
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	free(hosts);
	if (!l->quiet && t.first_output > 0)
		fprintf(stderr,
			"meshrun: launch: %d machines, logs in %s/; staged in %.2f s, copied by %.2f s, "
			"first output at %.2f s, first step at %.2f s\n", n, log_dir, t.staged, t.copied,
			t.first_output, t.first_step);
	if (r.interrupted || launch_signals) {
		cli_error("launch", "interrupted; every agent stopped");
		return EXIT_INTERRUPTED;
	}
	if (rc) {
		cli_error("launch", "%s", err[0] ? err : "failed");
		return cli_launch_exit_code(rc, &r);
	}
	if (!l->quiet && l->metrics)
		fprintf(stderr, "meshrun: launch: metrics in %s\n", l->metrics);
	return EXIT_OK;
}

/* ---- --slurm ---- */

/* srun ends with the agent's code, or 128 + the signal that killed it */
static const char *slurm_exit_name(int code)
{
	return code > 128 ? "the agent was killed by a signal" : cli_exit_name(code);
}

static bool slurm_restart_code(int code)
{
	return code > 128 || cli_restart_code(code);
}

/* The job on fewer nodes: the configured mesh shrunk along data, the
 * global batch kept by per_device_batch_size (host/train/check.h). */
static int shrink_job(void *ctx, int hosts, char keys[][64], int *n, char *why, size_t whylen)
{
	long long dcn_data, pdbs;
	int rc = train_shrink(ctx, hosts, &dcn_data, &pdbs, why, whylen);
	if (rc)
		return rc;
	snprintf(keys[0], 64, "dcn_data_parallelism=%lld", dcn_data);
	snprintf(keys[1], 64, "per_device_batch_size=%lld", pdbs);
	*n = 2;
	return 0;
}

/* Launcher flags that stay here; the rest go to every agent as given. */
static bool launcher_only(const struct arg_flag *f)
{
	static const char *const own[] = { "--slurm", "--max-restarts", "--certs", "--devices-per-host", NULL };
	for (int i = 0; f && own[i]; i++)
		if (!strcmp(f->name, own[i]))
			return true;
	return false;
}

static int run_slurm(struct launch_cli *l, const struct args *a, char **argv, const struct mesh_args *m)
{
	static struct cfg cfg;
	struct mesh_args mm = *m;
	const char *nn = getenv("SLURM_JOB_NUM_NODES") ? getenv("SLURM_JOB_NUM_NODES") : getenv("SLURM_NNODES");
	char err[1024] = "", certs[4200];
	mm.hosts = nn ? atoi(nn) : 0;
	if (mm.hosts < 1) {
		cli_error("launch", "--slurm: not inside a Slurm allocation (no SLURM_JOB_NUM_NODES): run it "
			  "from a batch script (deploy/slurm.sbatch)");
		return EXIT_USAGE;
	}
	int rc = cli_agent_check(a, &mm, "train", &cfg, err, sizeof(err));
	if (!rc && l->max_restarts && cfg.checkpoint_period <= 0) {
		snprintf(err, sizeof(err), "config: --max-restarts needs checkpoint_period > 0 (got %lld)",
			 (long long)cfg.checkpoint_period);
		rc = EXIT_CONFIG;
	}
	/* the checkpoint is on the shared file system: checked once, here */
	if (!rc && l->resume)
		rc = cli_exit_code(train_resume_fits(&cfg, l->ckpt_dir, err, sizeof(err)));
	if (rc) {
		cli_error("launch", "%s", err);
		return rc;
	}
	char **av = calloc((size_t)a->argc + 2, sizeof(char *));
	int n = 0;
	if (!av) {
		cli_error("launch", "out of memory");
		return EXIT_FAIL;
	}
	for (int i = 1; i < a->argc; i++)
		if (!launcher_only(a->owner[i]))
			av[n++] = argv[i];
	if (l->certs) {
		char abs[4096];
		snprintf(certs, sizeof(certs), "certs_dir=%s", absolute(l->certs, abs, sizeof(abs)));
		av[n++] = certs;
	}
	struct slurm_launch_args sa = {
		.argc = n,
		.argv = av,
		.devices_per_host = cfg.devices_per_host,
		.ckpt_dir = l->ckpt_dir,
		.resume = l->resume,
		.t0 = time(NULL),
		.restarts = { .max = l->max_restarts, .retry_code = slurm_restart_code },
		.who = "meshrun: launch",
		.shrink = shrink_job,
		.shrink_ctx = &cfg,
	};
	struct launch_opts o = { .grace_s = 1.5, .term_grace_s = 0.5, .exit_name = slurm_exit_name };
	struct launch_result r;
	rc = slurm_launch(&sa, &o, &r, err, sizeof(err));
	free(av);
	if (r.interrupted) {
		cli_error("launch", "interrupted; every agent stopped");
		return EXIT_INTERRUPTED;
	}
	if (rc)
		cli_error("launch", "%s", err[0] ? err : "failed");
	return rc ? cli_launch_exit_code(rc, &r) : EXIT_OK;
}

int cmd_launch(int argc, char **argv)
{
	struct launch_cli l = { 0 };
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];

	if (argc > 1 && !strcmp(argv[1], "--ssh-child"))
		return ssh_child_main(argc - 1, argv + 1);
	const struct arg_flag own[] = {
		{ "--hostfile", ARG_STR, &l.hostfile, 0, 0, NULL },
		{ "--ssh-config", ARG_STR, &l.ssh_config, 0, 0, NULL },
		{ "--certs", ARG_STR, &l.certs, 0, 0, NULL },
		{ "--log-dir", ARG_STR, &l.log_dir, 0, 0, NULL },
		{ "--metrics", ARG_STR, &l.metrics, 0, 0, NULL },
		{ "--trace", ARG_STR, &l.trace, 0, 0, NULL },
		{ "--checkpoint-dir", ARG_STR, &l.ckpt_dir, 0, 0, NULL },
		{ "--resume", ARG_BOOL, &l.resume, 0, 0, NULL },
		{ "--max-restarts", ARG_INT, &l.max_restarts, 0, 1000000, NULL },
		{ "--keep", ARG_BOOL, &l.keep, 0, 0, NULL },
		{ "--quiet", ARG_BOOL, &l.quiet, 0, 0, NULL },
		{ "--slurm", ARG_BOOL, &l.slurm, 0, 0, NULL },
		{ "--fault", ARG_APPEND, NULL, 0, 0, "faults" },
		{ "--hosts", ARG_REFUSE, NULL, 0, 0, "--hosts is the hostfile's line count" },
		{ "--host-id", ARG_REFUSE, NULL, 0, 0, "--host-id is the hostfile's line order" },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { own, mesh, NULL };
	const char *bad = NULL;
	if (args_parse(&a, tables, argc, argv, err, sizeof(err)))
		bad = err;
	else if (l.ckpt_dir && l.ckpt_dir[0] != '/')
		bad = "--checkpoint-dir wants an absolute path on the machines (a relative one "
		      "would land in the run directory, which is removed)";
	else if (l.resume && !l.ckpt_dir)
		bad = "--resume needs --checkpoint-dir DIR";
	else if (l.slurm && (l.hostfile || l.ssh_config || l.log_dir || l.keep))
		bad = "--slurm takes the allocation's nodes: --hostfile, --ssh-config, --log-dir and --keep "
		      "are for ssh";
	else if (l.slurm && l.max_restarts && !l.ckpt_dir)
		bad = "--max-restarts needs --checkpoint-dir DIR (on the shared file system)";
	else if ((!l.hostfile && !l.slurm) || !a.nconfigs)
		bad = !a.nconfigs ? "--config FILE is needed" : "--hostfile FILE (or --slurm) is needed";
	if (bad) {
		args_release(&a);
		return cli_usage_error("launch", "%s", bad);
	}
	int rc = l.slurm ? run_slurm(&l, &a, argv, &m) : run(&l, &a, &m);
	args_release(&a);
	return rc;
}
