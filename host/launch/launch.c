/* See host/launch/launch.h. */
#include "host/launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/launch/status.h"
#include "host/util/clock.h"

#define LAUNCH_MAX_CHILDREN 4096

/* for the signal handler: the children to forward to */
static pid_t *volatile kids_pid;
static volatile int kids_n;
static volatile sig_atomic_t interrupted;

static void forward_signal(int sig)
{
	interrupted = 1;
	for (int i = 0; i < kids_n; i++)
		if (kids_pid[i] > 0)
			kill(kids_pid[i], sig);
}

struct kid {
	pid_t pid;
	bool done;
	int status;        /* waitpid status */
	int order;         /* 1 + the order in which failures were seen; 0: ok/running */
	bool killed_by_us;
	int lost_by;       /* -1, or the child that reported this one lost */
	bool reported;     /* it reported a peer lost itself: it is alive */
	uint64_t lost_kill_at; /* reported lost: SIGKILL then unless it reports or ends */
	int reported_by;   /* the child whose report set lost_kill_at */
	/* the status channel: the parent's read end, the child's write end
	 * (until started), a partial line */
	int rd, wr;
	char line[512];
	size_t used;
	bool loaded;       /* it reported "loaded" */
	char **envp;       /* the child's environment with LAUNCH_STATUS_ENV, or NULL */
};

static void close_fds(struct launch_child *c, int n)
{
	for (int i = 0; i < n; i++)
		for (int k = 0; k < c[i].nfds; k++)
			if (c[i].fds[k] >= 0) {
				close(c[i].fds[k]);
				c[i].fds[k] = -1;
			}
}

/* In the child: die with the launcher, default signals, keep its fds and
 * its end of the status channel. */
static void exec_child(const struct launch_child *c, const struct kid *k, pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	for (int i = 0; i < c->nfds; i++)
		fcntl(c->fds[i], F_SETFD, 0);
	if (c->status == LAUNCH_STATUS_FD)
		fcntl(k->wr, F_SETFD, 0);
	else if (c->status == LAUNCH_STATUS_STDERR && dup2(k->wr, 2) < 0)
		_exit(127);
	if (c->cpus && sched_setaffinity(0, sizeof(*c->cpus), c->cpus))
		_exit(127);
	execve(c->argv[0], c->argv, k->envp ? k->envp : c->envp);
	_exit(127);
}

/* The status pipe of child k, and for LAUNCH_STATUS_FD its environment
 * naming the child's end. */
static int open_status(const struct launch_child *c, struct kid *k)
{
	int p[2];
	if (c->status == LAUNCH_STATUS_NONE)
		return 0;
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	k->rd = p[0];
	k->wr = p[1];
	fcntl(k->rd, F_SETFL, fcntl(k->rd, F_GETFL) | O_NONBLOCK);
	if (c->status != LAUNCH_STATUS_FD)
		return 0;
	int n = 0;
	while (c->envp[n])
		n++;
	k->envp = calloc((size_t)n + 2, sizeof(char *));
	char *var = malloc(64);
	if (!k->envp || !var) {
		free(var);
		return -ENOMEM;
	}
	snprintf(var, 64, "%s=%d", LAUNCH_STATUS_ENV, k->wr);
	int j = 0;
	for (int i = 0; i < n; i++)
		if (strncmp(c->envp[i], LAUNCH_STATUS_ENV "=", sizeof(LAUNCH_STATUS_ENV)))
			k->envp[j++] = c->envp[i];
	k->envp[j] = var;     /* the last entry is ours to free */
	return 0;
}

static void close_status(struct kid *k, int n)
{
	for (int i = 0; i < n; i++) {
		if (k[i].rd >= 0)
			close(k[i].rd);
		if (k[i].wr >= 0)
			close(k[i].wr);
		k[i].rd = k[i].wr = -1;
		if (k[i].envp) {
			int j = 0;
			while (k[i].envp[j + 1])
				j++;
			free(k[i].envp[j]);
			free(k[i].envp);
			k[i].envp = NULL;
		}
	}
}

/* Forks every child; returns how many started (err and *why set when
 * not all). */
static int start_all(struct launch_child *c, int n, struct kid *k, pid_t *pids, int *why,
		     char *err, size_t errlen)
{
	pid_t parent = getpid();
	fflush(stdout);
	fflush(stderr);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			*why = errno;
			snprintf(err, errlen, "unable to start %s: %s", c[i].name, strerror(*why));
			return i;
		}
		if (pid == 0)
			exec_child(&c[i], &k[i], parent);
		k[i].pid = pid;
		pids[i] = pid;
	}
	return n;
}

/* ---- supervision ---- */

struct sup {
	struct kid *k;
	int started, alive, failures;
	pid_t *pids;
	const struct launch_opts *o;
	uint64_t stop_at;      /* when the survivors get SIGTERM (0: no failure yet) */
	uint64_t kill_at;      /* when they get SIGKILL (0: not yet planned) */
	int loaded;            /* children that reported "loaded" */
};

static bool reap_one(struct sup *s, int i);

static void start_stopping(struct sup *s)
{
	if (!s->stop_at)
		s->stop_at = util_now_ns() + (uint64_t)(s->o->grace_s * 1e9);
}

/* A report gives the lost child LOST_GRACE_NS to show it is alive (it
 * reports a loss itself, as both ends of a broken link do) or to end;
 * then it is killed. A stopped or hung host is gone well inside the
 * heartbeat timeout + 2 s; a live one keeps its own last words. */
#define LOST_GRACE_NS (300ull * 1000 * 1000)

/* Child j reported child h lost. */
static void lost(struct sup *s, int j, int h)
{
	struct kid *k = s->k;
	if (h < 0 || h >= s->started || h == j || k[h].done || k[h].lost_by >= 0)
		return;
	/* a report from one we killed as lost is stale; one that reported a
	 * loss itself is alive and failing on its own */
	if (k[j].lost_by >= 0 || k[h].reported || k[h].lost_kill_at)
		return;
	k[h].lost_kill_at = util_now_ns() + LOST_GRACE_NS;
	k[h].reported_by = j;
	/* its failure dates from the report, not from the kill */
	if (!k[h].order)
		k[h].order = ++s->failures;
	start_stopping(s);
}

/* Child j reported a loss itself, so it is alive: a report that named it
 * lost (both ends of a broken link report each other) no longer dates its
 * failure; it fails, if it does, when it ends. */
static void alive(struct sup *s, int j)
{
	struct kid *k = s->k;
	k[j].reported = true;
	if (!k[j].lost_kill_at || k[j].lost_kill_at == UINT64_MAX || k[j].done || !k[j].order)
		return;
	for (int i = 0; i < s->started; i++)
		if (k[i].order > k[j].order)
			k[i].order--;
	k[j].order = 0;
	s->failures--;
}

/* Kills the children reported lost whose grace is over. */
static void kill_lost(struct sup *s)
{
	struct kid *k = s->k;
	uint64_t now = util_now_ns();
	for (int h = 0; h < s->started; h++) {
		if (!k[h].lost_kill_at || k[h].lost_kill_at == UINT64_MAX || now < k[h].lost_kill_at)
			continue;
		k[h].lost_kill_at = UINT64_MAX;
		/* one that ended meanwhile (it died, and that is how it was
		 * lost), or showed it is alive, is reported as it ends */
		if (k[h].done || k[h].reported || reap_one(s, h))
			continue;
		k[h].lost_by = k[h].reported_by;
		kill(k[h].pid, SIGKILL);
		if (s->o->stop_one)
			s->o->stop_one(s->o->stop_ctx, h);
		start_stopping(s);
	}
}

static void status_line(struct sup *s, int j, const char *line)
{
	const size_t pl = sizeof(LAUNCH_STATUS_LOST) - 1;
	if (!strncmp(line, LAUNCH_STATUS_LOST, pl)) {
		char *end;
		long h = strtol(line + pl, &end, 10);
		if (end != line + pl && !*end) {
			alive(s, j);
			lost(s, j, (int)h);
		}
	} else if (!strcmp(line, LAUNCH_STATUS_LOADED)) {
		if (!s->k[j].loaded && ++s->loaded == s->started && s->o->all_loaded)
			s->o->all_loaded(s->o->loaded_ctx);
		s->k[j].loaded = true;
	} else if (strncmp(line, LAUNCH_STATUS_PREFIX, sizeof(LAUNCH_STATUS_PREFIX) - 1)) {
		/* a child's stderr carried over the channel */
		fprintf(stderr, "%s\n", line);
	}
}

/* Reads what child j's channel holds; at EOF (or with flush) a partial
 * line counts as a line and the channel closes. */
static void status_read(struct sup *s, int j, bool flush)
{
	struct kid *k = &s->k[j];
	while (k->rd >= 0) {
		ssize_t r = read(k->rd, k->line + k->used, sizeof(k->line) - 1 - k->used);
		if (r < 0 && errno == EINTR)
			continue;
		bool eof = r == 0 || (r < 0 && errno != EAGAIN) || (r < 0 && flush);
		if (r > 0)
			k->used += (size_t)r;
		char *nl;
		k->line[k->used] = 0;
		while ((nl = strchr(k->line, '\n'))) {
			*nl = 0;
			status_line(s, j, k->line);
			k->used -= (size_t)(nl + 1 - k->line);
			memmove(k->line, nl + 1, k->used + 1);
		}
		if (k->used == sizeof(k->line) - 1 || (eof && k->used)) {
			status_line(s, j, k->line);
			k->used = 0;
		}
		if (eof) {
			close(k->rd);
			k->rd = -1;
		}
		if (r <= 0)
			return;
	}
}

/* Waits up to 20 ms for status lines and handles them. */
static void status_poll(struct sup *s)
{
	struct pollfd pf[64];
	int who[64], n = 0;
	for (int i = 0; i < s->started && n < 64; i++)
		if (s->k[i].rd >= 0) {
			pf[n] = (struct pollfd){ .fd = s->k[i].rd, .events = POLLIN };
			who[n++] = i;
		}
	if (n == 0 || s->started > 64) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		if (n == 0)
			return;
	}
	if (poll(pf, (nfds_t)n, s->started > 64 ? 0 : 20) <= 0)
		return;
	for (int i = 0; i < n; i++)
		if (pf[i].revents)
			status_read(s, who[i], false);
	for (int i = 64; i < s->started; i++)
		if (s->k[i].rd >= 0)
			status_read(s, i, false);
}

/* Reaps child i if it ended; true then. */
static bool reap_one(struct sup *s, int i)
{
	struct kid *k = &s->k[i];
	int st;
	if (k->done)
		return false;
	pid_t w = waitpid(k->pid, &st, WNOHANG);
	if (w == 0 || (w < 0 && errno == EINTR))
		return false;
	status_read(s, i, true);
	k->done = true;
	s->pids[i] = 0;
	s->alive--;
	k->status = w < 0 ? (1 << 8) : st;
	bool ok = w > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!ok && !k->order)
		k->order = ++s->failures;
	if (!ok)
		start_stopping(s);
	return true;
}

static void reap(struct sup *s)
{
	for (int i = 0; i < s->started; i++)
		reap_one(s, i);
}

/* SIGTERM (and SIGCONT, for a stopped child) or SIGKILL to every child
 * still running. */
static void signal_rest(struct sup *s, int sig)
{
	for (int i = 0; i < s->started; i++)
		if (!s->k[i].done) {
			s->k[i].killed_by_us = true;
			kill(s->k[i].pid, sig);
			if (sig != SIGKILL)
				kill(s->k[i].pid, SIGCONT);
		}
}

/* Waits for every started child, reading their status channels; once
 * one fails (or is reported lost, or a signal arrives) the others get
 * grace_s to fail on their own, then are stopped. Returns the failure
 * count. */
static int supervise(struct kid *k, int started, pid_t *pids, const struct launch_opts *o)
{
	struct sup s = { .k = k, .started = started, .alive = started, .pids = pids, .o = o };
	bool stopped = false;
	while (s.alive > 0) {
		reap(&s);
		if (!s.alive)
			break;
		if (interrupted)
			start_stopping(&s);
		kill_lost(&s);
		uint64_t now = util_now_ns();
		if (s.stop_at && now > s.stop_at && !s.kill_at) {
			bool term = o->term_grace_s > 0;
			signal_rest(&s, term ? SIGTERM : SIGKILL);
			s.kill_at = term ? now + (uint64_t)(o->term_grace_s * 1e9) : UINT64_MAX;
			if (o->stop && !stopped)
				o->stop(o->stop_ctx);
			stopped = true;
		}
		if (s.kill_at && s.kill_at != UINT64_MAX && now > s.kill_at) {
			signal_rest(&s, SIGKILL);
			s.kill_at = UINT64_MAX;
		}
		status_poll(&s);
	}
	return s.failures;
}

/* Appends every failure, first one first, to err (after used bytes). */
static void report(const struct launch_child *c, const struct kid *k, int started, int failures,
		   const struct launch_opts *o, struct launch_result *r, char *err, size_t errlen,
		   size_t used)
{
	for (int f = 1; f <= failures; f++)
		for (int i = 0; i < started; i++) {
			if (k[i].order != f)
				continue;
			int st = k[i].status;
			char one[192];
			if (WIFEXITED(st)) {
				int code = WEXITSTATUS(st);
				const char *name = o->exit_name ? o->exit_name(code) : NULL;
				snprintf(one, sizeof(one), "%s exited with code %d%s%s%s", c[i].name, code,
					 name ? " (" : "", name ? name : "", name ? ")" : "");
			} else if (k[i].lost_by >= 0) {
				snprintf(one, sizeof(one), "%s was lost (%s reported it; killed by the launcher)",
					 c[i].name, c[k[i].lost_by].name);
			} else {
				int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
				snprintf(one, sizeof(one), "%s %s by signal %d (%s)", c[i].name,
					 k[i].killed_by_us ? "was stopped" : "was killed", sig,
					 k[i].killed_by_us ? "it outlived the others' failure" : strsignal(sig));
			}
			if (f == 1) {
				r->first = i;
				r->first_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
				r->first_lost = k[i].lost_by >= 0;
			}
			if (used < errlen)
				used += snprintf(err + used, errlen - used, "%s%s", used ? "; " : "", one);
		}
}

int launch_run(struct launch_child *c, int n, const struct launch_opts *o,
	       struct launch_result *r, char *err, size_t errlen)
{
	static pid_t pids[LAUNCH_MAX_CHILDREN];
	struct sigaction sa, old_int, old_term;

	memset(r, 0, sizeof(*r));
	r->first = -1;
	if (n < 1 || n > LAUNCH_MAX_CHILDREN) {
		close_fds(c, n > 0 ? n : 0);
		snprintf(err, errlen, "cannot launch %d processes (at most %d)", n, LAUNCH_MAX_CHILDREN);
		return -EINVAL;
	}
	struct kid *k = calloc((size_t)n, sizeof(*k));
	if (!k) {
		close_fds(c, n);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memset(pids, 0, sizeof(pids));
	kids_pid = pids;
	kids_n = n;
	interrupted = 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);

	err[0] = 0;
	int start_errno = 0, started = 0;
	for (int i = 0; i < n; i++)
		k[i] = (struct kid){ .rd = -1, .wr = -1, .lost_by = -1 };
	for (int i = 0; i < n && !start_errno; i++)
		if ((start_errno = -open_status(&c[i], &k[i])))
			snprintf(err, errlen, "unable to open %s's status channel: %s", c[i].name,
				 strerror(start_errno));
	if (!start_errno)
		started = start_all(c, n, k, pids, &start_errno, err, errlen);
	close_fds(c, n);
	for (int i = 0; i < n; i++)
		if (k[i].wr >= 0) {
			close(k[i].wr);
			k[i].wr = -1;
		}
	if (started < n)
		for (int i = 0; i < started; i++)
			kill(k[i].pid, SIGKILL);
	r->failures = supervise(k, started, pids, o);
	report(c, k, started, r->failures, o, r, err, errlen, strlen(err));
	r->interrupted = interrupted;

	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	kids_n = 0;
	close_status(k, n);
	free(k);
	if (started < n)
		return start_errno ? -start_errno : -EAGAIN;
	if (r->failures)
		return -ECHILD;
	return r->interrupted ? -EINTR : 0;
}

/* ---- restarts ---- */

static bool restartable(const struct launch_restarts *rs, int rc, const struct launch_result *r)
{
	if (rc != -ECHILD || r->interrupted)
		return false;
	if (r->first_lost || r->first_code < 0)
		return true;
	return rs->retry_code && rs->retry_code(r->first_code);
}

int launch_restarting(const char *who, const struct launch_restarts *rs, struct launch_result *r,
		      char *err, size_t errlen)
{
	bool resuming = rs->resume;
	int rc;
	for (int n = 1;; n++) {
		err[0] = 0;
		rc = rs->launch(rs->ctx, n - 1, resuming, r, err, errlen);
		if (n > rs->max || !restartable(rs, rc, r))
			return rc;
		char what[512] = "", why[512] = "";
		if (rs->regroup && rs->regroup(rs->ctx, what, sizeof(what), why, sizeof(why))) {
			size_t used = strlen(err);
			snprintf(err + used, errlen - used, "%s%s", used ? "; " : "", why);
			return rc;
		}
		int64_t step = rs->checkpoint ? rs->checkpoint(rs->ctx) : -1;
		if (step >= 0) {
			fprintf(stderr, "%s: %s; restart %d of %d from checkpoint step %" PRId64 "%s\n", who,
				err, n, rs->max, step, what);
			resuming = true;
		} else {
			fprintf(stderr, "%s: %s; restart %d of %d %s%s\n", who, err, n, rs->max,
				resuming ? "resuming as before (no newer checkpoint found)"
					 : "from the start (no checkpoint yet)", what);
		}
	}
}
