/* Process helpers shared by the suites that start real processes
 * (check_agent, check_tls, check_train, check_train_fault, check_xport,
 * check_coll_agents, check_shard, check_report, ...): start with output to
 * files, wait with a timeout or for a line of output, run a meshrun
 * command line to its end (proc_run), kill everything at exit, read
 * outputs, remove directories, free loopback ports. Header-only: each
 * suite is one translation unit; `static inline` keeps a suite that does
 * not use every helper free of unused-function warnings. */
#ifndef MESHRUN_TESTS_PROC_H
#define MESHRUN_TESTS_PROC_H

#include <check.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/tls.h"

/* ---- processes (every one is killed when the test ends, however it
 * ends: atexit here, PR_SET_PDEATHSIG if the test process is killed).
 * Each leads its own process group, so what it starts and keeps in its
 * group (a launcher's agents) is killed with it. ---- */

#define MAXPROC 16

struct proc {
	pid_t pid;
	int status;             /* exit code, or 128 + signal */
	bool done;
	char out[320], err[320];
};

static pid_t live[MAXPROC];
static char tmpdir[64];

static inline void kill_all(void)
{
	for (int i = 0; i < MAXPROC; i++)
		if (live[i] > 0) {
			kill(-live[i], SIGKILL);
			kill(live[i], SIGKILL);
			waitpid(live[i], NULL, 0);
			live[i] = 0;
		}
}

static inline const char *meshrun(void)
{
	const char *m = getenv("MESHRUN");
	return m && *m ? m : "./build/meshrun";
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Starts argv (argv[0] is the program) with stdout to tmpdir/name.out,
 * stderr to tmpdir/name.err (merged: into name.out too, and p->err names
 * that file) and stdin from in_fd (-1: /dev/null). */
static inline void proc_spawn(struct proc *p, const char *name, char *const argv[], int in_fd,
			      bool merged)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->out, sizeof(p->out), "%s/%s.out", tmpdir, name);
	snprintf(p->err, sizeof(p->err), "%s/%s.%s", tmpdir, name, merged ? "out" : "err");
	pid_t parent = getpid();
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int o = open(p->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int e = merged ? o : open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int i = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
		dup2(i, 0);
		dup2(o, 1);
		dup2(e, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	setpgid(pid, pid); /* here too: the child may not have run yet */
	p->pid = pid;
	for (int i = 0; i < MAXPROC; i++)
		if (!live[i]) {
			live[i] = pid;
			break;
		}
}

static inline void proc_start(struct proc *p, const char *name, char *const argv[], int in_fd)
{
	proc_spawn(p, name, argv, in_fd, false);
}

/* A meshrun command line built argument by argument: argv[0] is
 * meshrun(); the strings live in the struct (proc_start forks, so a
 * struct on the caller's stack is enough). */
#define PROC_MAX_ARGS 40
struct proc_args {
	char a[PROC_MAX_ARGS][300];
	char *argv[PROC_MAX_ARGS + 1];
	int n;
};

/* Appends one printf-formatted argument. */
__attribute__((format(printf, 2, 3)))
static inline void proc_arg(struct proc_args *pa, const char *fmt, ...)
{
	va_list ap;
	ck_assert_int_lt(pa->n, PROC_MAX_ARGS);
	va_start(ap, fmt);
	vsnprintf(pa->a[pa->n], sizeof(pa->a[0]), fmt, ap);
	va_end(ap);
	pa->argv[pa->n] = pa->a[pa->n];
	pa->n++;
}

static inline void proc_args_meshrun(struct proc_args *pa)
{
	pa->n = 0;
	proc_arg(pa, "%s", meshrun());
}

/* Appends the strings of a NULL-terminated list. */
static inline void proc_args_va(struct proc_args *pa, va_list ap)
{
	for (const char *s; (s = va_arg(ap, const char *));)
		proc_arg(pa, "%s", s);
}

static inline void proc_start_args(struct proc *p, const char *name, struct proc_args *pa)
{
	pa->argv[pa->n] = NULL;
	proc_start(p, name, pa->argv, -1);
}

/* Starts `meshrun ARGS...` (a NULL-terminated list) as proc p. */
static inline void proc_meshrun(struct proc *p, const char *name, ...)
{
	struct proc_args pa;
	va_list ap;
	proc_args_meshrun(&pa);
	va_start(ap, name);
	proc_args_va(&pa, ap);
	va_end(ap);
	proc_start_args(p, name, &pa);
}

static inline void proc_reaped(struct proc *p, int st)
{
	p->done = true;
	p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	for (int i = 0; i < MAXPROC; i++)
		if (live[i] == p->pid)
			live[i] = 0;
}

/* Exit code (128 + signal if killed), or -1 if still running at timeout. */
static inline int proc_wait(struct proc *p, double timeout_s)
{
	double end = now_s() + timeout_s;
	while (!p->done) {
		int st;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			proc_reaped(p, st);
			break;
		}
		if (now_s() > end)
			return -1;
		usleep(20000);
	}
	return p->status;
}

/* Kills p's process group (p, and what it started that is still in the
 * group) and reaps p. Returns p's status as proc_wait does. */
static inline int proc_kill(struct proc *p)
{
	kill(-p->pid, SIGKILL);
	if (!p->done) {
		int st;
		kill(p->pid, SIGKILL);
		if (waitpid(p->pid, &st, 0) == p->pid)
			proc_reaped(p, st);
	}
	return p->status;
}

/* The whole of path as a string (zeros made spaces), in a buffer reused
 * by the next call; "" when it cannot be read. */
static inline char *slurp(const char *path)
{
	static char *buf;
	static size_t cap;
	FILE *f = fopen(path, "r");
	size_t n = 0;
	if (f) {
		for (;;) {
			if (cap - n < 2) {
				size_t ncap = cap ? 2 * cap : 65536;
				char *nb = realloc(buf, ncap);
				if (!nb)
					break;
				buf = nb;
				cap = ncap;
			}
			size_t got = fread(buf + n, 1, cap - n - 1, f);
			if (!got)
				break;
			n += got;
		}
		fclose(f);
	}
	if (!buf) {
		static char empty[1];
		return empty;
	}
	/* binary output (frames) may hold zeros: make it searchable */
	for (size_t i = 0; i < n; i++)
		if (!buf[i])
			buf[i] = ' ';
	buf[n] = 0;
	return buf;
}

/* Runs argv (a launcher: its agents share its process group) to its end or
 * timeout_s, then kills the group; out gets its stdout, then its stderr.
 * Returns the exit status (or 128+signal), -1 at the timeout. */
static inline int proc_capture(char *const argv[], char *out, size_t outlen, int timeout_s)
{
	struct proc p;
	proc_start(&p, "run", argv, -1);
	int rc = proc_wait(&p, timeout_s);
	proc_kill(&p);
	size_t n = (size_t)snprintf(out, outlen, "%s", slurp(p.out));
	if (n < outlen)
		snprintf(out + n, outlen - n, "%s", slurp(p.err));
	return rc;
}

static inline bool file_has(const char *path, const char *needle)
{
	return strstr(slurp(path), needle) != NULL;
}

#define ck_assert_file_has(path, needle) \
	ck_assert_msg(file_has(path, needle), "'%s' not in %s:\n%s", needle, path, slurp(path))

/* true once p's stdout holds needle; false if p ends or timeout_s passes
 * first. */
static inline bool proc_wait_output(struct proc *p, const char *needle, double timeout_s)
{
	double end = now_s() + timeout_s;
	while (!file_has(p->out, needle)) {
		if (proc_wait(p, 0) >= 0 || now_s() > end)
			return file_has(p->out, needle);
		usleep(20000);
	}
	return true;
}

/* Runs meshrun with the words of line as its arguments (split at spaces;
 * '...' makes one word of what it quotes, spaces included), stdout into
 * tmpdir/name.out and stderr into tmpdir/name.err (merged: into name.out
 * too). Waits up to timeout_s, then kills it (and its process group).
 * Returns the exit code (128 + signal if killed), or -1 if it had to be
 * killed at timeout_s. */
static inline int proc_run_words(struct proc *p, const char *name, const char *line,
				 double timeout_s, bool merged)
{
	static char words[4096];
	char *argv[128];
	int argc = 0;
	size_t n = 0;
	argv[argc++] = (char *)meshrun();
	for (const char *c = line; *c;) {
		while (*c == ' ')
			c++;
		if (!*c)
			break;
		ck_assert_int_lt(argc, 127);
		argv[argc++] = &words[n];
		while (*c && *c != ' ') {
			if (*c == '\'') {
				const char *q = strchr(c + 1, '\'');
				ck_assert_msg(q, "unbalanced quote in: %s", line);
				for (c++; c < q; c++) {
					ck_assert_uint_lt(n, sizeof(words) - 2);
					words[n++] = *c;
				}
				c++;
				continue;
			}
			ck_assert_uint_lt(n, sizeof(words) - 2);
			words[n++] = *c++;
		}
		words[n++] = 0;
	}
	argv[argc] = NULL;
	proc_spawn(p, name, argv, -1, merged);
	int rc = proc_wait(p, timeout_s);
	if (rc < 0)
		proc_kill(p);
	return rc;
}

/* proc_run_words with stdout and stderr both in p->out. */
static inline int proc_run(struct proc *p, const char *name, const char *line, double timeout_s)
{
	return proc_run_words(p, name, line, timeout_s, true);
}

static inline int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes dir and everything under it (symbolic links are not followed).
 * 0, or -1 if something could not be removed; a missing dir is 0. */
static inline int rm_rf(const char *dir)
{
	struct stat st;
	if (lstat(dir, &st) != 0)
		return 0;
	return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

static inline void cleanup_all(void)
{
	kill_all();
	if (tmpdir[0])
		rm_rf(tmpdir);
	tmpdir[0] = 0;
}

/* A failed assertion ends a forked test with _exit: neither the teardown
 * nor atexit runs. So a helper process waits for the test process to end,
 * however it ends, and then runs fn(arg) (the processes it started die of
 * PR_SET_PDEATHSIG). */
static inline void proc_at_death(int (*fn)(const char *), const char *arg)
{
	pid_t parent = getpid();
	sigset_t term, old;
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigprocmask(SIG_BLOCK, &term, &old);
	pid_t pid = fork();
	if (pid == 0) {
		int sig;
		setpgid(0, 0); /* check kills the test's process group */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() == parent)
			sigwait(&term, &sig);
		fn(arg);
		_exit(0);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
}

/* When the test process ends, however it ends, dir goes. */
static inline void rm_rf_at_death(const char *dir)
{
	proc_at_death(rm_rf, dir);
}

/* A fresh temporary directory named after the suite, with a cluster CA and
 * ncerts host certificates in tmpdir/certs (none when ncerts is 0). */
static inline void proc_setup(const char *suite, int ncerts)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/%s-XXXXXX", suite);
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	rm_rf_at_death(tmpdir);
	atexit(cleanup_all);
	if (ncerts > 0) {
		char dir[300], err[256];
		snprintf(dir, sizeof(dir), "%s/certs", tmpdir);
		mkdir(dir, 0700);
		ck_assert_msg(tls_gen_certs(dir, ncerts, err, sizeof(err)) == 0, "%s", err);
	}
}

static inline void teardown(void)
{
	cleanup_all();
}

/* A loopback port nobody listens on right now. */
static inline int free_port(void)
{
	int fd, port;
	char addr[64], h[64];
	char err[128];
	ck_assert_int_eq(conn_listen("127.0.0.1:0", &fd, err, sizeof(err)), 0);
	conn_sockname(fd, true, addr, sizeof(addr));
	ck_assert_int_eq(conn_split_addr(addr, h, sizeof(h), &port), 0);
	close(fd);
	return port;
}

/* true once something accepts TCP connections on 127.0.0.1:port */
static inline bool wait_listening(int port, double timeout_s)
{
	double end = now_s() + timeout_s;
	while (now_s() < end) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(0x7f000001) };
		int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
		close(fd);
		if (ok)
			return true;
		usleep(20000);
	}
	return false;
}

#endif
