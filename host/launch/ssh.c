/* See host/launch/ssh.h. */
#include "host/launch/ssh.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "host/config/config.h"
#include "host/launch/status.h"
#include "host/util/clock.h"
#include "net/conn.h"
#include "net/tls.h"

#define ARGV_MAX 48
#define CMD_MAX 4096
/* the agent's exit code for "a peer host was lost" (host/cli/cli.h) */
#define SSH_PEER_LOST_CODE 5

/* ---- small helpers ---- */

/* snprintf that may truncate (paths are checked where they matter) */
static void fmt(char *out, size_t len, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *out, size_t len, const char *f, ...)
{
	va_list ap;
	va_start(ap, f);
	vsnprintf(out, len, f, ap);
	va_end(ap);
}

static double since(uint64_t t0)
{
	return (double)(util_now_ns() - t0) * 1e-9;
}

/* s in single quotes for a POSIX shell */
static void sq(char *out, size_t len, const char *s)
{
	size_t k = 0;
	if (k < len)
		out[k++] = '\'';
	for (; *s && k + 5 < len; s++) {
		if (*s == '\'') {
			memcpy(out + k, "'\\''", 4);
			k += 4;
		} else {
			out[k++] = *s;
		}
	}
	if (k + 1 < len)
		out[k++] = '\'';
	out[k < len ? k : len - 1] = 0;
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
	if (!link(from, to))
		return chmod(to, mode) ? -errno : 0;
	int in = open(from, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
	char buf[1 << 16];
	ssize_t r;
	if (in < 0)
		return -errno;
	out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (out < 0) {
		rc = -errno;
		close(in);
		return rc;
	}
	while ((r = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)r) != r) {
			rc = -EIO;
			break;
		}
	if (r < 0)
		rc = -errno;
	close(in);
	if (close(out) && !rc)
		rc = -errno;
	return rc;
}

/* rm -r of a directory tree made here (files and directories only) */
static void remove_tree(const char *path)
{
	pid_t p = fork();
	if (p == 0) {
		execlp("rm", "rm", "-rf", "--", path, (char *)NULL);
		_exit(127);
	}
	if (p > 0)
		waitpid(p, NULL, 0);
}

/* ---- ssh and scp command lines ---- */

struct argv_buf {
	char *v[ARGV_MAX];
	int n;
	char store[ARGV_MAX][PATH_MAX];
};

static void av_add(struct argv_buf *b, const char *s)
{
	if (b->n + 1 >= ARGV_MAX)
		return;
	fmt(b->store[b->n], sizeof(b->store[b->n]), "%s", s);
	b->v[b->n] = b->store[b->n];
	b->v[++b->n] = NULL;
}

static void ssh_common(struct argv_buf *b, const struct ssh_launch_args *a, bool scp,
		       const struct hostfile_entry *h)
{
	char port[16];
	if (a->ssh_config) {
		av_add(b, "-F");
		av_add(b, a->ssh_config);
	}
	av_add(b, "-o");
	av_add(b, "BatchMode=yes");
	av_add(b, "-o");
	av_add(b, "ConnectTimeout=10");
	if (h->port) {
		fmt(port, sizeof(port), "%d", h->port);
		av_add(b, scp ? "-P" : "-p");
		av_add(b, port);
	}
}

/* ssh ... [user@]host CMD */
static void ssh_argv(struct argv_buf *b, const struct ssh_launch_args *a,
		     const struct hostfile_entry *h, const char *cmd)
{
	char dest[320];
	b->n = 0;
	av_add(b, "ssh");
	av_add(b, "-n");
	ssh_common(b, a, false, h);
	fmt(dest, sizeof(dest), "%s%s%s", h->user, h->user[0] ? "@" : "", h->host);
	av_add(b, dest);
	if (cmd)
		av_add(b, cmd);
}

/* ---- running commands on every machine at once ---- */

/* Starts argv with stdin /dev/null and stdout+stderr to log (appended),
 * in its own process group; -1 on failure. */
static pid_t spawn(char *const *argv, const char *log)
{
	pid_t p = fork();
	if (p)
		return p;
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	int in = open("/dev/null", O_RDONLY);
	int out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (in < 0 || out < 0)
		_exit(127);
	dup2(in, 0);
	dup2(out, 1);
	dup2(out, 2);
	execvp(argv[0], argv);
	_exit(127);
}

/* The first non-empty line of a log (ssh's own reason comes first), for
 * one-line errors. */
static void first_line(const char *log, char *out, size_t len)
{
	FILE *f = fopen(log, "r");
	char line[512];
	out[0] = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (line[0]) {
			fmt(out, len, "%s", line);
			break;
		}
	}
	fclose(f);
}

/* Runs argv[i] for every machine i with want[i] at once, waits for all.
 * 0, or the index + 1 of the first machine whose command failed, with
 * "hostI (name): what" in err; failed[i] (when given) says which failed. */
static int run_each(struct argv_buf *cmds, const bool *want, int n, const char *log_dir,
		    const char *what, const struct hostfile_entry *hosts, bool *failed, char *err,
		    size_t errlen)
{
	pid_t *pid = calloc((size_t)n, sizeof(pid_t));
	char log[PATH_MAX];
	int bad = 0;
	if (!pid) {
		fmt(err, errlen, "out of memory");
		return 1;
	}
	for (int i = 0; i < n; i++) {
		if (!want || want[i]) {
			fmt(log, sizeof(log), "%s/host%d.setup.log", log_dir, i);
			pid[i] = spawn(cmds[i].v, log);
		}
	}
	for (int i = 0; i < n; i++) {
		int st = 0;
		if (pid[i] <= 0) {
			if ((!want || want[i]) && !bad)
				bad = i + 1;
			continue;
		}
		while (waitpid(pid[i], &st, 0) < 0 && errno == EINTR)
			;
		if ((!WIFEXITED(st) || WEXITSTATUS(st)) && failed)
			failed[i] = true;
		if ((!WIFEXITED(st) || WEXITSTATUS(st)) && !bad) {
			char line[400];
			fmt(log, sizeof(log), "%s/host%d.setup.log", log_dir, i);
			first_line(log, line, sizeof(line));
			fmt(err, errlen, "host%d (%s, %s line %d): %s failed: %s", i, hosts[i].host,
				 "hostfile", hosts[i].line, what, line[0] ? line : "no message");
			bad = i + 1;
		}
	}
	free(pid);
	return bad;
}

/* ---- staging and copying ---- */

struct run {
	const struct ssh_launch_args *a;
	char id[32];
	char remote[64];            /* /tmp/meshrun-<id> */
	char stage[PATH_MAX];       /* log_dir/stage */
	char certs[PATH_MAX];       /* where host certificates are read */
	bool own_certs;
	uint64_t t0;
	struct ssh_timing *t;
	/* the output pump */
	int *rd;
	FILE **log;
	int hosts;
	pthread_t pump;
	bool tty, line_open;        /* the progress line (stdout a terminal) */
	int attempt;                /* 1 + restarts so far */
	bool *copied;               /* the machines RUN reached */
	pid_t *stopper;             /* per machine: an `ssh ... kill` in flight, or 0 */
	time_t started;             /* for the checkpoints this launch wrote */
	double step_s_sum;
	long long steps_seen;
};

static int stage_host(struct run *rn, int i, const char *exe, const char *cfg_yaml, char *err,
		      size_t errlen)
{
	char dir[PATH_MAX], from[PATH_MAX], to[PATH_MAX + 32];
	int rc;
	fmt(dir, sizeof(dir), "%s/host%d", rn->stage, i);
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fmt(err, errlen, "unable to make '%s': %s", dir, strerror(errno));
		return -errno;
	}
	const char *files[4][2] = { { exe, "meshrun" }, { cfg_yaml, "config.yaml" } };
	char pem[32], key[32], cp[PATH_MAX], hp[PATH_MAX], kp[PATH_MAX];
	fmt(pem, sizeof(pem), "host%d.pem", i);
	fmt(key, sizeof(key), "host%d.key", i);
	fmt(cp, sizeof(cp), "%s/ca.pem", rn->certs);
	fmt(hp, sizeof(hp), "%s/%s", rn->certs, pem);
	fmt(kp, sizeof(kp), "%s/%s", rn->certs, key);
	files[2][0] = cp;
	files[2][1] = "ca.pem";
	files[3][0] = hp;
	files[3][1] = pem;
	for (int f = 0; f < 5; f++) {
		const char *src = f < 4 ? files[f][0] : kp, *name = f < 4 ? files[f][1] : key;
		fmt(from, sizeof(from), "%s", src);
		fmt(to, sizeof(to), "%s/%s", dir, name);
		rc = copy_file(from, to, f == 0 ? 0700 : 0600);
		if (rc) {
			fmt(err, errlen, "unable to stage '%s' for host%d: %s", from, i, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* Certificates, the config (with this run's coordinator and certs_dir)
 * and one directory per machine under stage/. */
static int stage_all(struct run *rn, struct cfg *c, char *err, size_t errlen)
{
	const struct ssh_launch_args *a = rn->a;
	char exe[PATH_MAX], cfg_yaml[PATH_MAX], why[256];
	ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (el <= 0) {
		fmt(err, errlen, "unable to find this binary: %s", strerror(errno));
		return -EIO;
	}
	exe[el] = 0;
	fmt(rn->stage, sizeof(rn->stage), "%s/stage", a->log_dir);
	if (mkdir(rn->stage, 0700)) {
		fmt(err, errlen, "unable to make '%s': %s", rn->stage, strerror(errno));
		return -EIO;
	}
	if (a->certs) {
		fmt(rn->certs, sizeof(rn->certs), "%s", a->certs);
	} else {
		fmt(rn->certs, sizeof(rn->certs), "%s/certs", rn->stage);
		rn->own_certs = true;
		if (mkdir(rn->certs, 0700) || tls_gen_certs(rn->certs, a->n, why, sizeof(why))) {
			fmt(err, errlen, "certificates: %s", why);
			return -EIO;
		}
	}
	/* the coordinator is the first machine, at the config's port */
	char h[256];
	int port;
	if (conn_split_addr(c->coordinator_address, h, sizeof(h), &port) || !port) {
		fmt(err, errlen, "config: key 'coordinator_address' wants host:port, got '%s'",
			 c->coordinator_address);
		return -EINVAL;
	}
	fmt(c->coordinator_address, sizeof(c->coordinator_address), "%s:%d", a->hosts[0].host,
		 port);
	fmt(c->certs_dir, sizeof(c->certs_dir), "%s", rn->remote);
	c->hosts.n = 0;
	fmt(cfg_yaml, sizeof(cfg_yaml), "%s/config.yaml", a->log_dir);
	if (cfg_write_yaml(c, cfg_yaml, err, errlen))
		return -EIO;
	for (int i = 0; i < a->n; i++) {
		int rc = stage_host(rn, i, exe, cfg_yaml, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

/* One scp per machine, all at once: stage/hostI becomes RUN there. */
static int copy_all(struct run *rn, bool *failed, char *err, size_t errlen)
{
	const struct ssh_launch_args *a = rn->a;
	struct argv_buf *b = calloc((size_t)a->n, sizeof(*b));
	char src[PATH_MAX + 16], dst[400];
	if (!b) {
		fmt(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int i = 0; i < a->n; i++) {
		const struct hostfile_entry *h = &a->hosts[i];
		av_add(&b[i], "scp");
		av_add(&b[i], "-r");
		av_add(&b[i], "-p");
		ssh_common(&b[i], a, true, h);
		fmt(src, sizeof(src), "%s/host%d", rn->stage, i);
		fmt(dst, sizeof(dst), "%s%s%s:%s", h->user, h->user[0] ? "@" : "", h->host,
			 rn->remote);
		av_add(&b[i], src);
		av_add(&b[i], dst);
	}
	int bad = run_each(b, NULL, a->n, a->log_dir, "copy (scp)", a->hosts, failed, err, errlen);
	free(b);
	return bad ? -EHOSTUNREACH : 0;
}

/* The remote script that stops the agent recorded in RUN/pid (only if that
 * pid still runs RUN/meshrun), waiting up to 5 s after SIGTERM (and
 * SIGCONT, for a stopped one) before SIGKILL; then, unless keep, removes
 * RUN. */
static void stop_script(char *out, size_t len, const char *remote, bool remove)
{
	fmt(out, len,
		 "d=%s; p=$(cat $d/pid 2>/dev/null); "
		 "ours() { [ -n \"$p\" ] && [ \"$(readlink /proc/$p/exe 2>/dev/null)\" = $d/meshrun ]; }; "
		 "if ours; then kill -TERM $p; kill -CONT $p; i=0; "
		 "while ours && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
		 "ours && kill -KILL $p; fi; %s true",
		 remote, remove ? "rm -rf $d;" : "");
}

/* ---- the output pump: "[hostI] line" on stdout, the line in hostI.log ---- */

/* On a terminal host 0's step lines become one updating line: "[host0]
 * step 12/100  loss 4.1306  52310 tokens/s  ETA 0:00:42". 1 when shown. */
static int progress(struct run *rn, int i, const char *line)
{
	long long step;
	double sec, tok_dev, loss;
	const char *t = strstr(line, "Tokens/s/device: "), *lo = strstr(line, ", loss: ");
	if (!rn->tty || i != 0 || rn->a->total_steps <= 0 ||
	    sscanf(line, "completed step: %lld, seconds: %lf", &step, &sec) != 2 || !t || !lo ||
	    sscanf(t + 17, "%lf", &tok_dev) != 1 || sscanf(lo + 8, "%lf", &loss) != 1)
		return 0;
	long long left = rn->a->total_steps - 1 - step;
	rn->step_s_sum += sec;
	rn->steps_seen++;
	long e = left > 0 ? (long)(rn->step_s_sum / rn->steps_seen * (double)left + 0.5) : 0;
	printf("\r\033[K[host0] step %lld/%lld  loss %.4f  %.0f tokens/s  ETA %ld:%02ld:%02ld", step + 1,
	       (long long)rn->a->total_steps, loss, tok_dev * rn->a->n * rn->a->devices_per_host,
	       e / 3600, e / 60 % 60, e % 60);
	rn->line_open = left > 0;
	if (!rn->line_open)
		putchar('\n');
	fflush(stdout);
	return 1;
}

static void pump_line(struct run *rn, int i, const char *line)
{
	if (!rn->a->quiet && !progress(rn, i, line)) {
		printf("%s[host%d] %s\n", rn->line_open ? "\r\033[K" : "", i, line);
		fflush(stdout);
	}
	if (rn->log[i]) {
		fprintf(rn->log[i], "%s\n", line);
		fflush(rn->log[i]);
	}
	if (!rn->t->first_output)
		rn->t->first_output = since(rn->t0);
	if (!rn->t->first_step && !strncmp(line, "completed step:", 15))
		rn->t->first_step = since(rn->t0);
}

static void *pump_main(void *arg)
{
	struct run *rn = arg;
	int n = rn->hosts, open_n = n;
	struct pollfd *p = calloc((size_t)n, sizeof(*p));
	char (*buf)[4096] = calloc((size_t)n, sizeof(*buf));
	size_t *used = calloc((size_t)n, sizeof(size_t));
	if (!p || !buf || !used)
		goto out;
	for (int i = 0; i < n; i++)
		p[i] = (struct pollfd){ .fd = rn->rd[i], .events = POLLIN };
	while (open_n > 0) {
		if (poll(p, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < n; i++) {
			if (p[i].fd < 0 || !p[i].revents)
				continue;
			ssize_t r = read(p[i].fd, buf[i] + used[i], sizeof(buf[i]) - 1 - used[i]);
			if (r <= 0) {
				if (used[i]) {
					buf[i][used[i]] = 0;
					pump_line(rn, i, buf[i]);
				}
				p[i].fd = -1;
				open_n--;
				continue;
			}
			used[i] += (size_t)r;
			char *s = buf[i], *nl;
			while ((nl = memchr(s, '\n', used[i] - (size_t)(s - buf[i])))) {
				*nl = 0;
				pump_line(rn, i, s);
				s = nl + 1;
			}
			used[i] -= (size_t)(s - buf[i]);
			memmove(buf[i], s, used[i]);
			if (used[i] == sizeof(buf[i]) - 1) { /* a very long line: cut it */
				buf[i][used[i]] = 0;
				pump_line(rn, i, buf[i]);
				used[i] = 0;
			}
		}
	}
out:
	free(p);
	free(buf);
	free(used);
	return NULL;
}

/* ---- the agents ---- */

/* Where the agents keep checkpoints: --checkpoint-dir, or with restarts
 * RUN/ckpt (on host 0, device 0's machine, the one that writes and reads
 * them; RUN lives as long as the launch). NULL: none. */
static const char *ckpt_dir(const struct ssh_launch_args *a, const char *remote, char *buf,
			    size_t len)
{
	if (a->ckpt_dir)
		return a->ckpt_dir;
	if (!a->restarts.max)
		return NULL;
	fmt(buf, len, "%s/ckpt", remote);
	return buf;
}

/* The agent's status lines (host/launch/status.h) go to its stderr, which
 * ssh carries back to the supervisor. RUN/started marks, on the machine's
 * own clock, when the launch's first agent started there (ssh_checkpoint). */
void ssh_agent_cmd(char *out, size_t len, const struct ssh_launch_args *a, const char *id, int i,
		   int restart, bool resume)
{
	char q[PATH_MAX + 64], ck[PATH_MAX], remote[64];
	fmt(remote, sizeof(remote), "/tmp/meshrun-%s", id);
	const char *dir = ckpt_dir(a, remote, ck, sizeof(ck));
	int k = snprintf(out, len,
			 "cd %s && { [ -e started ] || : >started; } && echo $$ >pid && "
			 "export %s=2 MESHRUN_JOB_ID=launch-%s && exec %s/meshrun agent "
			 "--config %s/config.yaml --host-id %d --hosts %d --devices-per-host %d "
			 "--listen %s:0",
			 remote, LAUNCH_STATUS_ENV, id, remote, remote, i, a->n,
			 a->devices_per_host, a->hosts[i].host);
	if (i == 0 && a->metrics)
		k += snprintf(out + k, len - (size_t)k, " --metrics %s/metrics.jsonl", remote);
	if (a->trace)
		k += snprintf(out + k, len - (size_t)k, " --trace %s/trace.json", remote);
	if (dir) {
		sq(q, sizeof(q), dir);
		k += snprintf(out + k, len - (size_t)k, " --checkpoint-dir %s", q);
	}
	if (resume)
		k += snprintf(out + k, len - (size_t)k, " --resume");
	if (restart > 0)
		fmt(out + k, len - (size_t)k, " %s %d", LAUNCH_RESTART_FLAG, restart);
}

static void free_child(struct launch_child *k)
{
	if (!k->argv)
		return;
	for (int j = 0; k->argv[j]; j++)
		free(k->argv[j]);
	free(k->argv);
}

/* child i: this binary as the supervisor of `ssh ... agent` */
static int make_child(struct run *rn, int i, int wfd, int restart, bool resume,
		      struct launch_child *k)
{
	struct argv_buf b;
	char exe[PATH_MAX], fd[16], cmd[CMD_MAX];
	ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (el <= 0)
		return -EIO;
	exe[el] = 0;
	ssh_agent_cmd(cmd, sizeof(cmd), rn->a, rn->id, i, restart, resume);
	ssh_argv(&b, rn->a, &rn->a->hosts[i], cmd);
	k->argv = calloc((size_t)b.n + 8, sizeof(char *));
	if (!k->argv)
		return -ENOMEM;
	fmt(fd, sizeof(fd), "%d", wfd);
	const char *head[] = { exe, "launch", "--ssh-child", fd, rn->remote, "--" };
	int n = 0;
	for (int j = 0; j < 6; j++)
		k->argv[n++] = strdup(head[j]);
	for (int j = 0; j < b.n; j++)
		k->argv[n++] = strdup(b.v[j]);
	for (int j = 0; j < n; j++)
		if (!k->argv[j])
			return -ENOMEM;
	fmt(k->name, sizeof(k->name), "host%d (%.20s)", i, rn->a->hosts[i].host);
	k->fds[k->nfds++] = wfd;
	/* the supervisor's stderr carries only the agent's status lines */
	k->status = LAUNCH_STATUS_STDERR;
	return 0;
}

extern char **environ;

/* The core killed host i's supervisor because a peer reported it lost:
 * its remote agent (stopped or hung, perhaps) is killed by its recorded
 * pid, through ssh, as the Ctrl-C path does, without waiting here; the
 * stop round reaps that ssh. */
static void stop_lost(void *ctx, int i)
{
	struct run *rn = ctx;
	struct argv_buf b;
	char cmd[600], log[PATH_MAX];
	if (i < 0 || i >= rn->a->n || rn->stopper[i] > 0)
		return;
	fmt(cmd, sizeof(cmd),
	    "p=$(cat %s/pid 2>/dev/null); [ -n \"$p\" ] && "
	    "[ \"$(readlink /proc/$p/exe 2>/dev/null)\" = %s/meshrun ] && kill -KILL $p",
	    rn->remote, rn->remote);
	ssh_argv(&b, rn->a, &rn->a->hosts[i], cmd);
	fmt(log, sizeof(log), "%s/host%d.stop.log", rn->a->log_dir, i);
	rn->stopper[i] = spawn(b.v, log);
}

static void reap_stoppers(struct run *rn)
{
	for (int i = 0; i < rn->a->n; i++)
		if (rn->stopper[i] > 0) {
			while (waitpid(rn->stopper[i], NULL, 0) < 0 && errno == EINTR)
				;
			rn->stopper[i] = 0;
		}
}

static int run_agents(struct run *rn, const struct launch_opts *lo, int restart, bool resume,
		      struct launch_result *r, char *err, size_t errlen)
{
	int n = rn->a->n, rc = 0;
	struct launch_opts o = *lo;
	o.stop_one = stop_lost;
	o.stop_ctx = rn;
	struct launch_child *k = calloc((size_t)n, sizeof(*k));
	rn->rd = calloc((size_t)n, sizeof(int));
	rn->log = calloc((size_t)n, sizeof(FILE *));
	rn->hosts = n;
	if (!k || !rn->rd || !rn->log) {
		fmt(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		int p[2];
		char path[PATH_MAX];
		if (pipe2(p, O_CLOEXEC)) {
			fmt(err, errlen, "pipe: %s", strerror(errno));
			rc = -errno;
			goto out;
		}
		rn->rd[i] = p[0];
		fmt(path, sizeof(path), "%s/host%d.log", rn->a->log_dir, i);
		rn->log[i] = fopen(path, rn->attempt > 1 ? "a" : "w");
		k[i].envp = environ;
		rc = make_child(rn, i, p[1], restart, resume, &k[i]);
		if (rc) {
			fmt(err, errlen, "unable to prepare host%d's command", i);
			goto out;
		}
	}
	rn->tty = isatty(STDOUT_FILENO);
	pthread_create(&rn->pump, NULL, pump_main, rn);
	rc = launch_run(k, n, &o, r, err, errlen);
	pthread_join(rn->pump, NULL);
	if (rn->line_open)
		putchar('\n');
out:
	for (int i = 0; i < n; i++) {
		if (k)
			free_child(&k[i]);
		if (rn->rd && rn->rd[i] > 0)
			close(rn->rd[i]);
		if (rn->log && rn->log[i])
			fclose(rn->log[i]);
	}
	free(k);
	free(rn->rd);
	free(rn->log);
	return rc;
}

/* One round to every machine RUN reached: stop the agent still running
 * there and, with remove, remove RUN except on host 0 when keep0. */
static void stop_round(struct run *rn, struct argv_buf *b, bool remove, bool keep0,
		       const char *what)
{
	const struct ssh_launch_args *a = rn->a;
	char script[1024], err[600];
	reap_stoppers(rn);
	for (int i = 0; i < a->n; i++) {
		stop_script(script, sizeof(script), rn->remote, remove && !(i == 0 && keep0));
		ssh_argv(&b[i], a, &a->hosts[i], script);
	}
	if (run_each(b, rn->copied, a->n, a->log_dir, what, a->hosts, NULL, err, sizeof(err)))
		fprintf(stderr, "meshrun: launch: %s\n", err);
}

/* Stops what still runs, fetches metrics and trace from host 0, removes
 * the remote directories (unless keep). Best effort; problems go to
 * stderr. */
static void finish(struct run *rn, const bool *copied, bool ran)
{
	const struct ssh_launch_args *a = rn->a;
	int n = a->n;
	struct argv_buf *b = calloc((size_t)n, sizeof(*b));
	char script[1024], err[600];
	bool want0[1] = { true };
	bool fetch = ran && copied[0] && (a->metrics || a->trace);
	if (!b)
		return;
	/* one round to every machine: stop, and remove RUN where nothing is
	 * fetched from it */
	stop_round(rn, b, !a->keep, fetch, ran ? "stopping the agent" : "cleaning up");
	const char *back[2][2] = { { a->metrics, "metrics.jsonl" }, { a->trace, "trace.json" } };
	for (int f = 0; f < 2 && fetch; f++) {
		if (!back[f][0])
			continue;
		char src[400];
		const struct hostfile_entry *h = &a->hosts[0];
		b[0].n = 0;
		av_add(&b[0], "scp");
		ssh_common(&b[0], a, true, h);
		fmt(src, sizeof(src), "%s%s%s:%s/%s", h->user, h->user[0] ? "@" : "", h->host,
		    rn->remote, back[f][1]);
		av_add(&b[0], src);
		av_add(&b[0], back[f][0]);
		if (run_each(b, want0, 1, a->log_dir, "copying back", a->hosts, NULL, err, sizeof(err)))
			fprintf(stderr, "meshrun: launch: %s (%s)\n", err, back[f][0]);
	}
	if (fetch && !a->keep) {
		fmt(script, sizeof(script), "rm -rf %s", rn->remote);
		ssh_argv(&b[0], a, &a->hosts[0], script);
		if (run_each(b, want0, 1, a->log_dir, "removing the run directory", a->hosts, NULL,
			     err, sizeof(err)))
			fprintf(stderr, "meshrun: launch: %s\n", err);
	}
	if (a->keep)
		fprintf(stderr, "meshrun: launch: kept %s on every machine\n", rn->remote);
	free(b);
}

/* ---- restarts ---- */

struct once {
	struct run *rn;
	const struct launch_opts *o;
	struct argv_buf *b;            /* for the stop round, one per machine */
};

/* One launch for launch_restarting: the agents run; after a failure every
 * agent still running is stopped (the relaunch's host 0 needs the
 * coordinator's port), RUN kept. */
static int ssh_once(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
		    size_t errlen)
{
	struct once *on = ctx;
	const volatile int *intr = on->rn->a->interrupted;
	memset(r, 0, sizeof(*r));
	r->first = -1;
	if (on->rn->attempt && intr && *intr) {
		fmt(err, errlen, "interrupted before the restart");
		return -EINTR;
	}
	on->rn->attempt++;
	int rc = run_agents(on->rn, on->o, restart, resume, r, err, errlen);
	if (rc && !r->interrupted && on->rn->attempt <= on->rn->a->restarts.max)
		stop_round(on->rn, on->b, false, false, "stopping the agent for a restart");
	return rc;
}

/* The newest complete step directory in host 0's checkpoint directory
 * (asked over ssh: `stat` of each step-* directory), written by this
 * launch (its mtime not before RUN/started, both on host 0's clock, a
 * second's slack) unless it resumed from the start; -1: none. */
static int64_t ssh_checkpoint(void *ctx)
{
	struct run *rn = ((struct once *)ctx)->rn;
	struct argv_buf b;
	char ck[PATH_MAX], q[PATH_MAX + 64], cmd[CMD_MAX], log[PATH_MAX], line[PATH_MAX + 64];
	const char *dir = ckpt_dir(rn->a, rn->remote, ck, sizeof(ck));
	int64_t best = -1;
	int st = 0;
	if (!dir || !rn->copied[0])
		return -1;
	sq(q, sizeof(q), dir);
	fmt(cmd, sizeof(cmd), "stat -c 'started %%Y' %s/started; "
	    "for d in %s/step-*; do [ -d \"$d\" ] && stat -c 'ckpt %%Y %%n' \"$d\"; done; true",
	    rn->remote, q);
	ssh_argv(&b, rn->a, &rn->a->hosts[0], cmd);
	fmt(log, sizeof(log), "%s/host0.ckpt.log", rn->a->log_dir);
	pid_t p = spawn(b.v, log);
	while (p > 0 && waitpid(p, &st, 0) < 0 && errno == EINTR)
		;
	FILE *f = p > 0 ? fopen(log, "r") : NULL;
	long long started = (long long)rn->started;   /* if RUN/started is missing */
	while (f && fgets(line, sizeof(line), f)) {
		long long mtime, step;
		char rest[8] = "";
		const char *name = strrchr(line, '/');
		line[strcspn(line, "\r\n")] = 0;
		if (sscanf(line, "started %lld", &started) == 1 ||
		    sscanf(line, "ckpt %lld ", &mtime) != 1 || !name ||
		    sscanf(name, "/step-%lld%7s", &step, rest) < 1 || rest[0])
			continue;
		if ((rn->a->resume || mtime >= started - 1) && step > best)
			best = step;
	}
	if (f)
		fclose(f);
	return best;
}

int ssh_launch(const struct ssh_launch_args *a, struct cfg *c, const struct launch_opts *o,
	       struct launch_result *r, struct ssh_timing *t, char *err, size_t errlen)
{
	struct run rn = { .a = a, .t = t, .t0 = util_now_ns(), .started = time(NULL) };
	unsigned char rnd[6];
	int rc;
	bool *copied = calloc((size_t)a->n, sizeof(bool));
	struct argv_buf *b = calloc((size_t)a->n, sizeof(*b));

	memset(r, 0, sizeof(*r));
	memset(t, 0, sizeof(*t));
	r->first = -1;
	rn.stopper = calloc((size_t)a->n, sizeof(pid_t));
	if (!copied || !b || !rn.stopper) {
		free(copied);
		free(b);
		free(rn.stopper);
		fmt(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rn.copied = copied;
	RAND_bytes(rnd, sizeof(rnd));
	fmt(rn.id, sizeof(rn.id), "%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3],
		 rnd[4], rnd[5]);
	fmt(rn.remote, sizeof(rn.remote), "/tmp/meshrun-%s", rn.id);
	rc = stage_all(&rn, c, err, errlen);
	t->staged = since(rn.t0);
	if (!rc) {
		bool *failed = calloc((size_t)a->n, sizeof(bool));
		rc = failed ? copy_all(&rn, failed, err, errlen) : -ENOMEM;
		t->copied = since(rn.t0);
		/* a failed scp may still have left part of RUN: clean every
		 * machine that could be reached */
		for (int i = 0; failed && i < a->n; i++)
			copied[i] = !failed[i];
		free(failed);
	}
	/* the staged keys are needed no longer */
	remove_tree(rn.stage);
	if (!rc && a->interrupted && *a->interrupted) {
		fmt(err, errlen, "interrupted before the agents started");
		rc = -EINTR;
	}
	bool ran = !rc;
	if (!rc) {
		struct once on = { .rn = &rn, .o = o, .b = b };
		struct launch_restarts rs = a->restarts;
		rs.resume = a->resume;
		rs.launch = ssh_once;
		rs.checkpoint = ssh_checkpoint;
		rs.ctx = &on;
		rc = launch_restarting(a->who ? a->who : "meshrun: launch", &rs, r, err, errlen);
	}
	finish(&rn, copied, ran);
	free(copied);
	free(b);
	free(rn.stopper);
	return rc;
}

/* ---- the supervisor of one ssh ---- */

static volatile sig_atomic_t child_signals;

static void count_signal(int sig)
{
	(void)sig;
	child_signals++;
}

/* ssh's stderr, split: the agent's status lines go to the launcher's
 * status channel (the supervisor's stderr as launch_run gave it), every
 * other line to the output pump with stdout. */
struct errsplit {
	int rd, status_fd;
	char buf[4096];
	size_t used;
};

static void write_all(int fd, const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, s, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

static void split_line(struct errsplit *e, const char *s, size_t n)
{
	bool status = n >= sizeof(LAUNCH_STATUS_PREFIX) - 1 &&
		      !memcmp(s, LAUNCH_STATUS_PREFIX, sizeof(LAUNCH_STATUS_PREFIX) - 1);
	write_all(status && e->status_fd >= 0 ? e->status_fd : 1, s, n);
}

/* Waits up to ms for ssh's stderr and passes on whole lines (and, at EOF,
 * the rest). false at EOF. */
static bool split_read(struct errsplit *e, int ms)
{
	struct pollfd p = { .fd = e->rd, .events = POLLIN };
	if (e->rd < 0) {
		struct timespec ts = { 0, (long)ms * 1000 * 1000 };
		nanosleep(&ts, NULL);
		return false;
	}
	if (poll(&p, 1, ms) <= 0)
		return true;
	ssize_t r = read(e->rd, e->buf + e->used, sizeof(e->buf) - e->used);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return true;
	if (r > 0)
		e->used += (size_t)r;
	char *nl, *s = e->buf;
	while ((nl = memchr(s, '\n', e->used - (size_t)(s - e->buf)))) {
		split_line(e, s, (size_t)(nl + 1 - s));
		s = nl + 1;
	}
	e->used -= (size_t)(s - e->buf);
	memmove(e->buf, s, e->used);
	if (r <= 0 || e->used == sizeof(e->buf)) {
		if (e->used)
			split_line(e, e->buf, e->used);
		e->used = 0;
	}
	if (r > 0)
		return true;
	close(e->rd);
	e->rd = -1;
	return false;
}

/* Stops the remote agent by its recorded pid: SIGTERM, or SIGKILL when
 * hurry. ssh is the agent's ssh argv (nssh entries, its command last). */
static void remote_kill(char **ssh, int nssh, const char *remote, bool hurry)
{
	char cmd[600];
	fmt(cmd, sizeof(cmd),
	    "p=$(cat %s/pid 2>/dev/null); [ -n \"$p\" ] && "
	    "[ \"$(readlink /proc/$p/exe 2>/dev/null)\" = %s/meshrun ] && kill -%s $p",
	    remote, remote, hurry ? "KILL" : "TERM");
	char **v = calloc((size_t)nssh + 1, sizeof(char *));
	if (!v)
		return;
	for (int j = 0; j < nssh - 1; j++)
		v[j] = ssh[j];
	v[nssh - 1] = cmd;
	pid_t s = fork();
	if (s == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int dn = open("/dev/null", O_RDWR);
		dup2(dn, 1);
		dup2(dn, 2);
		execvp(v[0], v);
		_exit(127);
	}
	free(v);
}

/* Starts ssh with stderr into a pipe (e->rd); its pid or -1. */
static pid_t start_ssh(char **ssh, struct errsplit *e)
{
	int p[2];
	pid_t me = getpid();
	e->rd = -1;
	if (pipe2(p, O_CLOEXEC))
		p[0] = p[1] = -1;
	pid_t agent = fork();
	if (agent == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != me)
			_exit(255);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		if (p[1] >= 0)
			dup2(p[1], 2);
		execvp(ssh[0], ssh);
		fprintf(stderr, "meshrun: unable to run %s: %s\n", ssh[0], strerror(errno));
		_exit(255);
	}
	if (p[1] >= 0)
		close(p[1]);
	e->rd = p[0];
	return agent;
}

int ssh_child_main(int argc, char **argv)
{
	if (argc < 6 || strcmp(argv[3], "--")) {
		fprintf(stderr, "meshrun: launch --ssh-child OUTFD RUNDIR -- SSH ARGS... CMD\n");
		return 2;
	}
	int fd = atoi(argv[1]);
	const char *remote = argv[2];
	char **ssh = argv + 4;
	int nssh = argc - 4;
	struct sigaction sa = { .sa_handler = count_signal };
	static struct errsplit e = { .rd = -1, .status_fd = -1 };
	sigemptyset(&sa.sa_mask);
	setsid();
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (fd > 2) {
		/* stderr is the launcher's status channel: kept for the status
		 * lines alone; everything else goes to the output pump */
		e.status_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
		dup2(fd, 1);
		dup2(fd, 2);
		close(fd);
	}
	pid_t agent = start_ssh(ssh, &e);
	if (agent < 0)
		return 255;
	int seen = 0, st = 0;
	bool killed = false;
	uint64_t kill_at = 0;
	bool done = false;
	for (;;) {
		/* finished stop commands, and ssh itself: reaped here too, its
		 * status kept (a separate waitpid for it first could miss an ssh
		 * that ends in between, and then wait for it forever) */
		int ws;
		for (pid_t w; (w = waitpid(-1, &ws, WNOHANG)) > 0;)
			if (w == agent) {
				st = ws;
				done = true;
			}
		if (done)
			break;
		int now_sig = child_signals;
		bool hurry = now_sig >= 2 || (kill_at && util_now_ns() > kill_at);
		if ((now_sig > seen && !kill_at) || (hurry && !killed)) {
			remote_kill(ssh, nssh, remote, hurry);
			if (!kill_at)
				kill_at = util_now_ns() + 5000000000ull;
			killed |= hurry;
			seen = now_sig;
		}
		split_read(&e, 20);
	}
	/* what ssh wrote last (its stderr ends with it) */
	for (uint64_t end = util_now_ns() + 1000000000ull; util_now_ns() < end;)
		if (!split_read(&e, 50))
			break;
	/* An agent that lost a peer (exit 5) reports it a moment later, so
	 * that the launcher sees the host that caused it fail first: the
	 * others notice a dead peer's connection before its own ssh does. */
	if (WIFEXITED(st) && WEXITSTATUS(st) == SSH_PEER_LOST_CODE && !child_signals) {
		struct timespec ts = { 0, 300 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}
