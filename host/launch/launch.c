/* See host/launch/launch.h. */
#include "host/launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* In the child: die with the launcher, default signals, keep its fds. */
static void exec_child(const struct launch_child *c, pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	for (int k = 0; k < c->nfds; k++)
		fcntl(c->fds[k], F_SETFD, 0);
	execve(c->argv[0], c->argv, c->envp);
	_exit(127);
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
			exec_child(&c[i], parent);
		k[i].pid = pid;
		pids[i] = pid;
	}
	return n;
}

/* Waits for every started child; once one fails the others get grace_s
 * to fail on their own, then they are killed. Returns the failure count. */
static int supervise(struct kid *k, int started, pid_t *pids, const struct launch_opts *o)
{
	int alive = started, failures = 0;
	uint64_t kill_at = 0;
	while (alive > 0) {
		for (int i = 0; i < started; i++) {
			int st;
			if (k[i].done)
				continue;
			pid_t w = waitpid(k[i].pid, &st, WNOHANG);
			if (w == 0 || (w < 0 && errno == EINTR))
				continue;
			k[i].done = true;
			pids[i] = 0;
			alive--;
			k[i].status = w < 0 ? (1 << 8) : st;
			bool ok = w > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
			if (!ok) {
				k[i].order = ++failures;
				if (!kill_at)
					kill_at = util_now_ns() + (uint64_t)(o->grace_s * 1e9);
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
			if (o->stop)
				o->stop(o->stop_ctx);
			kill_at = UINT64_MAX;
		}
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	return failures;
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
			} else {
				int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
				snprintf(one, sizeof(one), "%s %s by signal %d (%s)", c[i].name,
					 k[i].killed_by_us ? "was stopped" : "was killed", sig,
					 k[i].killed_by_us ? "it outlived the others' failure" : strsignal(sig));
			}
			if (f == 1) {
				r->first = i;
				r->first_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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
	int start_errno = 0;
	int started = start_all(c, n, k, pids, &start_errno, err, errlen);
	close_fds(c, n);
	if (started < n)
		for (int i = 0; i < started; i++)
			kill(k[i].pid, SIGKILL);
	r->failures = supervise(k, started, pids, o);
	report(c, k, started, r->failures, o, r, err, errlen, strlen(err));
	r->interrupted = interrupted;

	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	kids_n = 0;
	free(k);
	if (started < n)
		return start_errno ? -start_errno : -EAGAIN;
	if (r->failures)
		return -ECHILD;
	return r->interrupted ? -EINTR : 0;
}
