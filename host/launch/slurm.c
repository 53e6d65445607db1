/* See host/launch/slurm.h. Slurm is driven through its own commands
 * (srun, scontrol, squeue, scancel), each run with a deadline; nothing
 * here talks to a Slurm daemon directly. */
#include "host/launch/slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host/ckpt/ckpt.h"
#include "host/launch/status.h"
#include "host/util/clock.h"

/* a node that cannot start `true` in a job step this long is gone */
#define PROBE_S 30.0
/* scontrol, squeue, scancel */
#define CMD_S 15.0
#define ARGS_MAX SLURM_ARGS_MAX

extern char **environ;

struct node {
	char name[64], addr[64];
};

struct run {
	const struct slurm_launch_args *a;
	const struct launch_opts *o;
	struct node node[SLURM_MAX_NODES];
	int n, all;                /* nodes of the next launch; of the allocation */
	char keys[SLURM_MAX_KEYS][64];
	int nkeys;                 /* shrink's words for the agents */
	const char *job;           /* SLURM_JOB_ID */
	char self[PATH_MAX];       /* this binary, on the shared file system */
	char srun[PATH_MAX];
};

/* ---- running Slurm's commands ---- */

/* name found in PATH (execve wants a path); 0 or -ENOENT */
static int find_in_path(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");
	char dir[PATH_MAX];
	for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t k = strcspn(p, ":");
		snprintf(dir, sizeof(dir), "%.*s", (int)k, p);
		if (snprintf(out, len, "%s/%s", dir[0] ? dir : ".", name) < (int)len && !access(out, X_OK))
			return 0;
		p += k + (p[k] == ':');
	}
	return -ENOENT;
}

/* Runs argv (PATH searched) with stdin and stderr /dev/null and its
 * stdout into out (NUL-terminated, cut at outlen), killed after
 * timeout_s. Its exit code, or -1 when it could not run, was killed or
 * timed out. */
static int run_capture(char *const *argv, char *out, size_t outlen, double timeout_s)
{
	int p[2];
	if (out && outlen)
		out[0] = 0;
	if (pipe2(p, O_CLOEXEC))
		return -1;
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int nul = open("/dev/null", O_RDWR);
		dup2(nul, 0);
		dup2(p[1], 1);
		dup2(nul, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	size_t used = 0;
	uint64_t end = util_now_ns() + (uint64_t)(timeout_s * 1e9);
	bool timed_out = false;
	for (;;) {
		uint64_t now = util_now_ns();
		if (now >= end) {
			timed_out = true;
			break;
		}
		struct pollfd pf = { .fd = p[0], .events = POLLIN };
		int r = poll(&pf, 1, (int)((end - now) / 1000000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		char buf[4096];
		ssize_t k = read(p[0], buf, sizeof(buf));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		size_t take = out && used + 1 < outlen ? outlen - 1 - used : 0;
		take = take < (size_t)k ? take : (size_t)k;
		if (take) {
			memcpy(out + used, buf, take);
			used += take;
			out[used] = 0;
		}
	}
	close(p[0]);
	if (timed_out)
		kill(pid, SIGKILL);
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return !timed_out && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The allocation's nodes in order (scontrol show hostnames), each with
 * its NodeAddr (scontrol show node). */
static int find_nodes(struct run *rn, char *err, size_t errlen)
{
	const char *list = getenv("SLURM_JOB_NODELIST");
	static char out[1 << 16];
	if (!list || !*list || !rn->job) {
		snprintf(err, errlen, "slurm: not inside a Slurm allocation (no SLURM_JOB_ID or SLURM_JOB_NODELIST): "
			 "run it from a batch script (deploy/slurm.sbatch)");
		return -ENOENT;
	}
	char *hn[] = { "scontrol", "show", "hostnames", (char *)list, NULL };
	if (run_capture(hn, out, sizeof(out), CMD_S)) {
		snprintf(err, errlen, "slurm: 'scontrol show hostnames %s' failed", list);
		return -EIO;
	}
	rn->n = 0;
	for (char *save, *t = strtok_r(out, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
		if (rn->n == SLURM_MAX_NODES) {
			snprintf(err, errlen, "slurm: more than %d nodes", SLURM_MAX_NODES);
			return -E2BIG;
		}
		snprintf(rn->node[rn->n++].name, sizeof(rn->node[0].name), "%s", t);
	}
	for (int i = 0; i < rn->n; i++) {
		char info[8192];
		char *sn[] = { "scontrol", "show", "node", rn->node[i].name, NULL };
		const char *at = run_capture(sn, info, sizeof(info), CMD_S) ? NULL : strstr(info, "NodeAddr=");
		size_t k = at ? strcspn(at + 9, " \n") : 0;
		if (!k || k >= sizeof(rn->node[i].addr)) {
			snprintf(err, errlen, "slurm: no NodeAddr for node %s (scontrol show node)", rn->node[i].name);
			return -EIO;
		}
		snprintf(rn->node[i].addr, sizeof(rn->node[i].addr), "%.*s", (int)k, at + 9);
	}
	rn->all = rn->n;
	if (!rn->n) {
		snprintf(err, errlen, "slurm: the allocation '%s' names no node", list);
		return -EINVAL;
	}
	return 0;
}

/* Cancels this job's steps named `name` (a prefix when it ends in '*'):
 * SIGKILL to their tasks (a stopped agent too), then the step itself. */
static void cancel_steps(const struct run *rn, const char *name)
{
	static char out[1 << 16];
	char *sq[] = { "squeue", "-h", "-s", "-j", (char *)rn->job, "-o", "%i %j", NULL };
	size_t nl = strlen(name), pre = nl && name[nl - 1] == '*' ? nl - 1 : nl;
	if (run_capture(sq, out, sizeof(out), CMD_S))
		return;
	for (char *save, *t = strtok_r(out, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
		char id[64], step[128];
		if (sscanf(t, "%63s %127s", id, step) != 2 || strncmp(step, name, pre) ||
		    (pre == nl && strcmp(step, name)))
			continue;
		char *kill9[] = { "scancel", "--signal=KILL", id, NULL }, *cancel[] = { "scancel", id, NULL };
		run_capture(kill9, NULL, 0, CMD_S);
		run_capture(cancel, NULL, 0, CMD_S);
	}
}

/* The core killed host i's srun because a peer reported it lost. */
static void stop_host(void *ctx, int i)
{
	char name[32];
	snprintf(name, sizeof(name), "meshrun-host%d", i);
	cancel_steps(ctx, name);
}

/* The core stops the survivors. */
static void stop_all(void *ctx)
{
	cancel_steps(ctx, "meshrun-host*");
}

/* ---- one launch ---- */

/* The environment of every srun: ours, with the coordinator's address
 * and the status channel on stderr. */
static char **step_env(const struct run *rn, char *coord, size_t coordlen)
{
	int n = 0;
	while (environ[n])
		n++;
	char **env = calloc((size_t)n + 3, sizeof(char *));
	if (!env)
		return NULL;
	int j = 0;
	for (int i = 0; i < n; i++)
		if (strncmp(environ[i], "MESHRUN_COORDINATOR=", 20) && strncmp(environ[i], LAUNCH_STATUS_ENV "=",
									       sizeof(LAUNCH_STATUS_ENV)))
			env[j++] = environ[i];
	snprintf(coord, coordlen, "MESHRUN_COORDINATOR=%s", rn->node[0].addr);
	env[j++] = coord;
	env[j++] = LAUNCH_STATUS_ENV "=2";
	return env;
}

int slurm_step_argv(const struct slurm_launch_args *a, const struct slurm_step *s, char **v,
		    char (*store)[512])
{
	int n = 0;
#define PUT(s) do { if (n + 1 >= ARGS_MAX) return -E2BIG; v[n++] = (char *)(s); } while (0)
#define ADD(...) do { if (n + 1 >= ARGS_MAX) return -E2BIG; snprintf(store[n], 512, __VA_ARGS__); \
	v[n] = store[n]; n++; } while (0)
	PUT(s->srun);
	PUT("--nodes=1");
	PUT("--ntasks=1");
	ADD("--nodelist=%s", s->node);
	ADD("--job-name=meshrun-host%d", s->host);
	PUT("--quit-on-interrupt");
	PUT(s->self);
	PUT("agent");
	PUT("--host-id");
	ADD("%d", s->host);
	PUT("--hosts");
	ADD("%d", s->hosts);
	PUT("--devices-per-host");
	ADD("%d", a->devices_per_host);
	PUT("--listen");
	ADD("%s:0", s->addr);
	for (int k = 0; k < a->argc; k++)
		PUT(a->argv[k]);
	for (int k = 0; k < s->nkeys; k++)
		PUT(s->keys[k]);
	if (s->resume && !a->resume)
		PUT("--resume");
	if (s->restart > 0) {
		PUT(LAUNCH_RESTART_FLAG);
		ADD("%d", s->restart);
	}
#undef ADD
#undef PUT
	v[n] = NULL;
	return 0;
}

/* argv of host i's srun on the launch's restart-th run */
static int step_argv(const struct run *rn, int i, int restart, bool resume, char **v,
		     char (*store)[512])
{
	const struct slurm_step s = {
		.srun = rn->srun, .self = rn->self, .node = rn->node[i].name, .addr = rn->node[i].addr,
		.host = i, .hosts = rn->n, .keys = rn->keys, .nkeys = rn->nkeys, .restart = restart,
		.resume = resume,
	};
	return slurm_step_argv(rn->a, &s, v, store);
}

static int slurm_once(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
		      size_t errlen)
{
	struct run *rn = ctx;
	struct launch_opts o = *rn->o;
	struct launch_child *k = calloc((size_t)rn->n, sizeof(*k));
	char (*store)[ARGS_MAX][512] = calloc((size_t)rn->n, sizeof(*store));
	char **v = calloc((size_t)rn->n * (ARGS_MAX + 1), sizeof(char *));
	char coord[128];
	char **env = step_env(rn, coord, sizeof(coord));
	int rc = 0;
	memset(r, 0, sizeof(*r));
	r->first = -1;
	if (!k || !store || !v || !env) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < rn->n && !rc; i++) {
		char **av = v + (size_t)i * (ARGS_MAX + 1);
		if ((rc = step_argv(rn, i, restart, resume, av, store[i]))) {
			snprintf(err, errlen, "slurm: too many agent arguments");
			goto out;
		}
		snprintf(k[i].name, sizeof(k[i].name), "host%d (%s)", i, rn->node[i].name);
		k[i].argv = av;
		k[i].envp = env;
		k[i].status = LAUNCH_STATUS_STDERR;
	}
	o.stop = stop_all;
	o.stop_one = stop_host;
	o.stop_ctx = rn;
	rc = launch_run(k, rn->n, &o, r, err, errlen);
	if (rc)   /* an srun killed leaves its step: none may outlive the launch */
		stop_all(rn);
out:
	free(k);
	free(store);
	free(v);
	free(env);
	return rc;
}

/* ---- restarts ---- */

/* The newest complete checkpoint in --checkpoint-dir this launch wrote
 * (any, when it resumed from the start): shared, so read here. */
static int64_t slurm_checkpoint(void *ctx)
{
	const struct slurm_launch_args *a = ((struct run *)ctx)->a;
	char path[4096], err[256];
	int64_t step = -1;
	struct stat st;
	if (a->ckpt_dir && !ckpt_find(a->ckpt_dir, path, sizeof(path), &step, err, sizeof(err)) &&
	    step >= 0 && !stat(path, &st) && (a->resume || st.st_mtime >= a->t0 - 1))
		return step;
	return -1;
}

/* Every node of the last launch runs `true` in a job step at once (one
 * that shares the node with anything left there); gone[i]: node i could
 * not within PROBE_S. */
static void probe(const struct run *rn, bool *gone)
{
	pid_t pid[SLURM_MAX_NODES];
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	for (int i = 0; i < rn->n; i++) {
		char nl[96];
		snprintf(nl, sizeof(nl), "--nodelist=%s", rn->node[i].name);
		char *v[] = { (char *)rn->srun, "--overlap", "--nodes=1", "--ntasks=1", nl,
			      "--job-name=meshrun-probe", "true", NULL };
		gone[i] = true;
		pid[i] = fork();
		if (pid[i] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			dup2(nul, 0);
			dup2(nul, 1);
			dup2(nul, 2);
			execv(v[0], v);
			_exit(127);
		}
	}
	if (nul >= 0)
		close(nul);
	uint64_t end = util_now_ns() + (uint64_t)(PROBE_S * 1e9);
	for (int left = rn->n; left > 0 && util_now_ns() < end;) {
		for (int i = 0; i < rn->n; i++) {
			int st;
			if (pid[i] > 0 && waitpid(pid[i], &st, WNOHANG) == pid[i]) {
				gone[i] = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
				pid[i] = 0;
				left--;
			} else if (pid[i] < 0) {
				pid[i] = 0;
				left--;
			}
		}
		struct timespec ts = { 0, 50 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	for (int i = 0; i < rn->n; i++)
		if (pid[i] > 0) {
			kill(pid[i], SIGKILL);
			waitpid(pid[i], NULL, 0);
		}
}

/* Before a restart: nodes gone for good are dropped and the mesh shrunk
 * to the rest (shrink), or the job ends naming them. */
static int slurm_regroup(void *ctx, char *what, size_t whatlen, char *why, size_t whylen)
{
	struct run *rn = ctx;
	bool gone[SLURM_MAX_NODES];
	char names[512] = "", reason[512] = "", keys[512] = "";
	size_t used = 0, kused = 0;
	int left = 0, ngone = 0;
	if (!rn->a->shrink)
		return 0;
	probe(rn, gone);
	for (int i = 0; i < rn->n; i++) {
		if (!gone[i]) {
			rn->node[left++] = rn->node[i];
			continue;
		}
		ngone++;
		if (used < sizeof(names))
			used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s", used ? ", " : "",
						 rn->node[i].name);
	}
	if (!ngone)
		return 0;
	const char *verb = ngone == 1 ? "is" : "are";
	int was = rn->n;
	rn->n = left;
	int rc = left ? rn->a->shrink(rn->a->shrink_ctx, left, rn->keys, &rn->nkeys, reason, sizeof(reason))
		      : -EHOSTDOWN;
	if (rc) {
		snprintf(why, whylen, "node %s %s gone (no job step starts there) and the job cannot go on "
			 "without %s: %s", names, verb, ngone == 1 ? "it" : "them",
			 left ? reason : "no node is left");
		return rc;
	}
	for (int k = 0; k < rn->nkeys && kused < sizeof(keys); k++)
		kused += (size_t)snprintf(keys + kused, sizeof(keys) - kused, " %s", rn->keys[k]);
	snprintf(what, whatlen, " on %d of %d nodes (%s %s gone; the mesh shrunk along data:%s)", left, was,
		 names, verb, keys);
	return 0;
}

int slurm_launch(const struct slurm_launch_args *a, const struct launch_opts *o, struct launch_result *r,
		 char *err, size_t errlen)
{
	struct run *rn = calloc(1, sizeof(*rn));
	int rc;
	memset(r, 0, sizeof(*r));
	r->first = -1;
	if (!rn) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rn->a = a;
	rn->o = o;
	rn->job = getenv("SLURM_JOB_ID");
	ssize_t k = readlink("/proc/self/exe", rn->self, sizeof(rn->self) - 1);
	if (k <= 0 || find_in_path("srun", rn->srun, sizeof(rn->srun))) {
		snprintf(err, errlen, "slurm: %s", k <= 0 ? "cannot find this binary" : "no 'srun' in PATH");
		free(rn);
		return -ENOENT;
	}
	rn->self[k] = 0;
	if ((rc = find_nodes(rn, err, errlen))) {
		free(rn);
		return rc;
	}
	struct launch_restarts rs = a->restarts;
	rs.launch = slurm_once;
	rs.checkpoint = slurm_checkpoint;
	rs.regroup = slurm_regroup;
	rs.resume = a->resume;
	rs.ctx = rn;
	err[0] = 0;
	rc = launch_restarting(a->who, &rs, r, err, errlen);
	free(rn);
	return rc;
}
