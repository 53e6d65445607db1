/* Single-machine launcher (host/local.h) and the agent-side argument
 * parser shared by every subcommand that runs as an agent. The launcher
 * binds the coordinator and every link listener itself on 127.0.0.1:0 and
 * hands each child its sockets (MESHRUN_COORD_FD, MESHRUN_DATA_FD), so no
 * port is ever chosen and then raced for. */
#include "host/launch/local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/util/clock.h"
#include "net/conn.h"
#include "net/tls.h"

extern char **environ;

#define MAX_LOCAL_HOSTS 256

/* for the signal handler */
static pid_t *volatile kids;
static volatile int nkids;
static volatile sig_atomic_t interrupted;

static void forward_signal(int sig)
{
	interrupted = 1;
	for (int i = 0; i < nkids; i++)
		if (kids[i] > 0)
			kill(kids[i], sig);
}

static const char *exit_name(int code)
{
	switch (code) {
	case EXIT_FAIL: return "failed";
	case EXIT_USAGE: return "usage error";
	case EXIT_CONFIG: return "config error";
	case EXIT_INPUT: return "bad input";
	case EXIT_PEER_LOST: return "peer lost";
	case EXIT_REFUSED: return "refused";
	default: return "failed";
	}
}

static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[PATH_MAX + 256];
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

/* heartbeat_timeout_s the children will use, read from their arguments
 * (best effort: a bad config is for the children to report). */
static double child_heartbeat_timeout(int argc, char **argv)
{
	static struct cfg c;
	char err[256];
	cfg_defaults(&c);
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			cfg_load_file(&c, argv[++i], err, sizeof(err));
		else if (!strncmp(argv[i], "--config=", 9))
			cfg_load_file(&c, argv[i] + 9, err, sizeof(err));
		else if (argv[i][0] != '-' && strchr(argv[i], '='))
			cfg_override(&c, argv[i], err, sizeof(err));
	}
	return c.heartbeat_timeout_s > 0 ? c.heartbeat_timeout_s : 10;
}

/* A listening socket on 127.0.0.1:0 (blocking, close-on-exec). */
static int loopback_listener(int *port, char *err, size_t errlen)
{
	int fd;
	char addr[64], h[64];
	if (conn_listen("127.0.0.1:0", &fd, err, errlen))
		return -1;
	conn_sockname(fd, true, addr, sizeof(addr));
	if (conn_split_addr(addr, h, sizeof(h), port)) {
		close(fd);
		snprintf(err, errlen, "unable to read a listener's port");
		return -1;
	}
	return fd;
}

struct kid {
	pid_t pid;
	bool done;
	int status;        /* waitpid status */
	int order;         /* 1 + the order in which failures were seen; 0: ok/running */
	bool killed_by_us;
	char **argv, **envp;
};

static void free_strv(char **v, int from)
{
	if (!v)
		return;
	for (int i = from; v[i]; i++)
		free(v[i]);
	free(v);
}

static char **child_env(int coord_fd, int data_fd)
{
	int n = 0;
	while (environ[n])
		n++;
	char **e = calloc((size_t)n + 4, sizeof(char *));
	if (!e)
		return NULL;
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!strncmp(environ[i], "MESHRUN_COORD_FD=", 17) ||
		    !strncmp(environ[i], "MESHRUN_DATA_FD=", 16))
			continue;
		e[k++] = strdup(environ[i]);
	}
	char buf[64];
	/* OpenBLAS starts its worker pool when it is loaded and spins those
	 * threads for ~0.1 s; the agent then sets the number its rule chooses
	 * (run_blas_threads), and the pool grows to it. Starting from one keeps
	 * agents that never multiply (benches) from spinning cores at start. */
	if (!getenv("OPENBLAS_NUM_THREADS"))
		e[k++] = strdup("OPENBLAS_NUM_THREADS=1");
	if (coord_fd >= 0) {
		snprintf(buf, sizeof(buf), "MESHRUN_COORD_FD=%d", coord_fd);
		e[k++] = strdup(buf);
	}
	snprintf(buf, sizeof(buf), "MESHRUN_DATA_FD=%d", data_fd);
	e[k++] = strdup(buf);
	for (int i = 0; i < k; i++)
		if (!e[i]) {
			free_strv(e, 0);
			return NULL;
		}
	return e;
}

int local_launch(int hosts, int argc, char **argv, char *err, size_t errlen)
{
	/* agents on this machine share its cores (README: threads and cores) */
	char nagents[16];
	snprintf(nagents, sizeof(nagents), "%d", hosts);
	setenv("MESHRUN_LOCAL_AGENTS", nagents, 1);
	char exe[PATH_MAX], dir[PATH_MAX], why[256];
	const char *tmp = getenv("TMPDIR");
	int coord_fd = -1, port = 0, rc = EXIT_FAIL;
	int *data_fds = NULL;
	struct kid *k = NULL;
	struct sigaction sa, old_int, old_term;
	bool handlers = false;

	if (hosts < 1 || hosts > MAX_LOCAL_HOSTS) {
		snprintf(err, errlen, "local: --hosts must be in [1, %d], got %d", MAX_LOCAL_HOSTS, hosts);
		return EXIT_USAGE;
	}
	ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (el <= 0) {
		snprintf(err, errlen, "local: unable to find this binary: %s", strerror(errno));
		return EXIT_FAIL;
	}
	exe[el] = 0;
	snprintf(dir, sizeof(dir), "%s/meshrun-local-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		snprintf(err, errlen, "local: unable to make a temporary directory: %s", strerror(errno));
		return EXIT_FAIL;
	}
	if (tls_gen_certs(dir, hosts, why, sizeof(why))) {
		snprintf(err, errlen, "local: %s", why);
		goto out;
	}
	data_fds = malloc(sizeof(int) * (size_t)hosts);
	k = calloc((size_t)hosts, sizeof(*k));
	if (!data_fds || !k) {
		snprintf(err, errlen, "local: out of memory");
		goto out;
	}
	for (int i = 0; i < hosts; i++)
		data_fds[i] = -1;
	coord_fd = loopback_listener(&port, why, sizeof(why));
	if (coord_fd < 0) {
		snprintf(err, errlen, "local: coordinator listener: %s", why);
		goto out;
	}
	for (int i = 0; i < hosts; i++) {
		int p;
		data_fds[i] = loopback_listener(&p, why, sizeof(why));
		if (data_fds[i] < 0) {
			snprintf(err, errlen, "local: link listener: %s", why);
			goto out;
		}
	}

	/* argv and environment of every child, built before any fork */
	for (int i = 0; i < hosts; i++) {
		char **v = calloc((size_t)argc + 8, sizeof(char *));
		char buf[PATH_MAX + 64];
		if (!v) {
			snprintf(err, errlen, "local: out of memory");
			goto out;
		}
		k[i].argv = v;
		int n = 0;
		v[n++] = exe;
		for (int j = 0; j < argc; j++)
			v[n++] = argv[j];
		/* the rest are owned copies, freed from index argc + 1 */
		v[n++] = strdup("--host-id");
		snprintf(buf, sizeof(buf), "%d", i);
		v[n++] = strdup(buf);
		v[n++] = strdup("--hosts");
		snprintf(buf, sizeof(buf), "%d", hosts);
		v[n++] = strdup(buf);
		snprintf(buf, sizeof(buf), "certs_dir=%s", dir);
		v[n++] = strdup(buf);
		snprintf(buf, sizeof(buf), "coordinator_address=127.0.0.1:%d", port);
		v[n++] = strdup(buf);
		for (int j = argc + 1; j < n; j++)
			if (!v[j]) {
				snprintf(err, errlen, "local: out of memory");
				goto out;
			}
		k[i].envp = child_env(i == 0 ? coord_fd : -1, data_fds[i]);
		if (!k[i].envp) {
			snprintf(err, errlen, "local: out of memory");
			goto out;
		}
	}

	double hb = child_heartbeat_timeout(argc, argv);
	pid_t parent = getpid();
	static pid_t pids[MAX_LOCAL_HOSTS];
	memset(pids, 0, sizeof(pids));
	kids = pids;
	nkids = hosts;
	interrupted = 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	handlers = true;
	fflush(stdout);
	fflush(stderr);

	int started = 0;
	for (int i = 0; i < hosts; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			snprintf(err, errlen, "local: unable to start host %d: %s", i, strerror(errno));
			break;
		}
		if (pid == 0) {
			/* the child dies with the launcher */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(EXIT_FAIL);
			signal(SIGINT, SIG_DFL);
			signal(SIGTERM, SIG_DFL);
			if (i == 0)
				fcntl(coord_fd, F_SETFD, 0);
			fcntl(data_fds[i], F_SETFD, 0);
			execve(exe, k[i].argv, k[i].envp);
			_exit(127);
		}
		k[i].pid = pid;
		pids[i] = pid;
		started++;
	}
	close(coord_fd);
	coord_fd = -1;
	for (int i = 0; i < hosts; i++) {
		close(data_fds[i]);
		data_fds[i] = -1;
	}
	if (started < hosts)
		for (int i = 0; i < started; i++)
			kill(k[i].pid, SIGKILL);

	/* wait; once one fails the others get the heartbeat timeout and a
	 * little more to fail on their own, then they are killed */
	int alive = started, failures = 0;
	uint64_t kill_at = 0;
	while (alive > 0) {
		for (int i = 0; i < started; i++) {
			int st;
			if (k[i].done)
				continue;
			pid_t w = waitpid(k[i].pid, &st, WNOHANG);
			if (w == 0)
				continue;
			if (w < 0 && errno == EINTR)
				continue;
			k[i].done = true;
			pids[i] = 0;
			alive--;
			k[i].status = w < 0 ? (EXIT_FAIL << 8) : st;
			bool ok = w > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
			if (!ok) {
				k[i].order = ++failures;
				if (!kill_at)
					kill_at = util_now_ns() + (uint64_t)((hb + 3.0) * 1e9);
			}
		}
		if (!alive)
			break;
		if (kill_at && util_now_ns() > kill_at) {
			for (int i = 0; i < started; i++)
				if (!k[i].done) {
					k[i].killed_by_us = true;
					kill(k[i].pid, SIGKILL);
				}
			kill_at = UINT64_MAX;
		}
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}

	/* report every failure, first one first */
	rc = started < hosts ? EXIT_FAIL : EXIT_OK;
	size_t used = 0;
	if (started == hosts)
		err[0] = 0;
	else
		used = strlen(err);
	for (int f = 1; f <= failures; f++)
		for (int i = 0; i < started; i++) {
			if (k[i].order != f)
				continue;
			int st = k[i].status, code;
			char one[160];
			if (WIFEXITED(st)) {
				code = WEXITSTATUS(st);
				snprintf(one, sizeof(one), "host %d exited with code %d (%s)", i, code,
					 exit_name(code));
			} else {
				code = EXIT_FAIL;
				snprintf(one, sizeof(one), "host %d %s by signal %d (%s)", i,
					 k[i].killed_by_us ? "was stopped" : "was killed",
					 WIFSIGNALED(st) ? WTERMSIG(st) : 0,
					 k[i].killed_by_us ? "it outlived the others' failure"
							   : strsignal(WIFSIGNALED(st) ? WTERMSIG(st) : 0));
			}
			if (rc == EXIT_OK)
				rc = code ? code : EXIT_FAIL;
			if (used < errlen)
				used += snprintf(err + used, errlen - used, "%s%s", used ? "; " : "", one);
		}
	if (interrupted && rc == EXIT_OK)
		rc = EXIT_FAIL;

out:
	if (handlers) {
		sigaction(SIGINT, &old_int, NULL);
		sigaction(SIGTERM, &old_term, NULL);
		nkids = 0;
	}
	if (coord_fd >= 0)
		close(coord_fd);
	for (int i = 0; data_fds && i < hosts; i++)
		if (data_fds[i] >= 0)
			close(data_fds[i]);
	for (int i = 0; k && i < hosts; i++) {
		if (k[i].argv)
			free_strv(k[i].argv, argc + 1);
		free_strv(k[i].envp, 0);
	}
	free(k);
	free(data_fds);
	remove_dir(dir);
	return rc;
}

/* ---- agent_args ---- */

static int parse_int_flag(const char *flag, const char *v, int min, int *out, char *err, size_t errlen)
{
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (!*v || *end || errno || x < min || x > 1000000) {
		snprintf(err, errlen, "%s wants an integer >= %d, got '%s'", flag, min, v);
		return -1;
	}
	*out = (int)x;
	return 0;
}

static bool any_fill(const long long *v[], int n)
{
	for (int i = 0; i < n; i++)
		if (*v[i] == -1)
			return true;
	return false;
}

int agent_args(int *argc, char **argv, struct cfg *c, int *host_id, char *err, size_t errlen)
{
	const char *config = NULL;
	int hosts = 0, devs = 0, hid = -1, out = 1;
	int n = *argc;
	char **ov = calloc((size_t)n + 1, sizeof(char *));
	int nov = 0;
	if (!ov) {
		snprintf(err, errlen, "out of memory");
		return EXIT_FAIL;
	}
	static const char *const flags[] = { "--config", "--host-id", "--hosts", "--devices-per-host" };
	for (int i = 1; i < n; i++) {
		const char *a = argv[i], *v = NULL;
		int which = -1;
		for (int f = 0; f < 4 && which < 0; f++) {
			size_t fl = strlen(flags[f]);
			if (!strncmp(a, flags[f], fl) && (a[fl] == '=' || !a[fl])) {
				which = f;
				if (a[fl] == '=') {
					v = a + fl + 1;
				} else if (i + 1 < n) {
					v = argv[++i];
				} else {
					snprintf(err, errlen, "%s needs a value", flags[f]);
					free(ov);
					return EXIT_USAGE;
				}
			}
		}
		int bad = 0;
		switch (which) {
		case 0: config = v; break;
		case 1: bad = parse_int_flag("--host-id", v, 0, &hid, err, errlen); break;
		case 2: bad = parse_int_flag("--hosts", v, 1, &hosts, err, errlen); break;
		case 3: bad = parse_int_flag("--devices-per-host", v, 1, &devs, err, errlen); break;
		default:
			if (a[0] != '-' && strchr(a, '='))
				ov[nov++] = (char *)a;
			else
				argv[out++] = (char *)a;
		}
		if (bad) {
			free(ov);
			return EXIT_USAGE;
		}
	}
	if (out < n)
		argv[out] = NULL;
	*argc = out;

	cfg_defaults(c);
	if (config && cfg_load_file(c, config, err, errlen)) {
		free(ov);
		return EXIT_CONFIG;
	}
	for (int i = 0; i < nov; i++)
		if (cfg_override(c, ov[i], err, errlen)) {
			free(ov);
			return EXIT_CONFIG;
		}
	free(ov);

	/* without --hosts / --devices-per-host a -1 size means one */
	const long long *dcn[] = {
		&c->dcn_data_parallelism, &c->dcn_pipeline_parallelism, &c->dcn_fsdp_parallelism,
		&c->dcn_fsdp_transpose_parallelism, &c->dcn_sequence_parallelism,
		&c->dcn_context_parallelism, &c->dcn_tensor_parallelism,
		&c->dcn_tensor_transpose_parallelism, &c->dcn_expert_parallelism,
	};
	const long long *ici[] = {
		&c->ici_data_parallelism, &c->ici_pipeline_parallelism, &c->ici_fsdp_parallelism,
		&c->ici_fsdp_transpose_parallelism, &c->ici_sequence_parallelism,
		&c->ici_context_parallelism, &c->ici_tensor_parallelism,
		&c->ici_tensor_transpose_parallelism, &c->ici_expert_parallelism,
	};
	if (!hosts && any_fill(dcn, AX_COUNT))
		hosts = c->hosts.n ? c->hosts.n : 1;
	if (!devs && any_fill(ici, AX_COUNT))
		devs = 1;
	if (cfg_finish(c, hosts, devs, err, errlen))
		return EXIT_CONFIG;
	if (hid < 0)
		hid = 0;
	if (hid >= c->num_hosts) {
		snprintf(err, errlen, "--host-id %d is out of range: the mesh has %d hosts (0..%d)",
			 hid, c->num_hosts, c->num_hosts - 1);
		return EXIT_USAGE;
	}
	*host_id = hid;
	return 0;
}

/* ---- `meshrun local` ---- */

int cmd_local(int argc, char **argv)
{
	char err[1024];
	int hosts = 0;
	char **cargv = calloc((size_t)argc + 2, sizeof(char *));
	int cargc = 0;
	if (!cargv) {
		fprintf(stderr, "meshrun: local: out of memory\n");
		return EXIT_FAIL;
	}
	cargv[cargc++] = "agent";
	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		if (!strcmp(argv[i], "--hosts")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "meshrun: local: --hosts needs a value\n");
				free(cargv);
				return EXIT_USAGE;
			}
			v = argv[++i];
		} else if (!strncmp(argv[i], "--hosts=", 8)) {
			v = argv[i] + 8;
		}
		if (v) {
			if (parse_int_flag("--hosts", v, 1, &hosts, err, sizeof(err))) {
				fprintf(stderr, "meshrun: local: %s\n", err);
				free(cargv);
				return EXIT_USAGE;
			}
			continue;
		}
		if (!strcmp(argv[i], "--host-id") || !strncmp(argv[i], "--host-id=", 10)) {
			fprintf(stderr, "meshrun: local: --host-id is chosen by the launcher\n");
			free(cargv);
			return EXIT_USAGE;
		}
		cargv[cargc++] = argv[i];
	}
	if (!hosts) {
		fprintf(stderr, "usage: meshrun local --hosts N [--devices-per-host D] --config FILE [key=value ...]\n");
		free(cargv);
		return EXIT_USAGE;
	}
	int rc = local_launch(hosts, cargc, cargv, err, sizeof(err));
	if (rc)
		fprintf(stderr, "meshrun: local: %s\n", err);
	free(cargv);
	return rc;
}

int local_launch_agents(int hosts, const char *cmd, int argc, char **argv, char *err, size_t errlen)
{
	char **cargv = calloc((size_t)argc + 3, sizeof(char *));
	if (!cargv) {
		snprintf(err, errlen, "out of memory");
		return EXIT_FAIL;
	}
	int cargc = 0;
	cargv[cargc++] = (char *)cmd;
	cargv[cargc++] = argv[0];
	cargv[cargc++] = "--agent";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--hosts")) {
			i++;
			continue;
		}
		if (!strncmp(argv[i], "--hosts=", 8))
			continue;
		cargv[cargc++] = argv[i];
	}
	int rc = local_launch(hosts, cargc, cargv, err, errlen);
	free(cargv);
	return rc;
}
