/* Restart and stop through `meshrun local` with real agents on loopback:
 * a host's agent SIGKILLed mid-run under --max-restarts finishes the run
 * with every step's loss equal to an uninterrupted run's bit for bit (the
 * last metrics line per step counts); so does one killed while a
 * checkpoint is being written, and a plain --resume after such a kill; a
 * SIGSTOPped host is reported lost by its peer and killed by the
 * launcher, which returns within heartbeat_timeout_s + 2 s with no agent
 * left; a SIGKILLed host 0 of 3 is found lost by its peers' probe of its
 * listener, long before the heartbeat timeout. A kill drill (--fault
 * kill) under --max-restarts fires once: the restart's agents carry
 * --restart 1 and skip host faults, while a link fault fires in both
 * launches, and the run finishes with the uninterrupted losses. The core's restart loop tells each launch which
 * restart it is. Checkpoint directories: the newest complete step is
 * found, *.tmp is ignored. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>

#include "host/ckpt/ckpt.h"
#include "host/cli/cli.h"
#include "host/launch/launch.h"
#include "host/launch/slurm.h"
#include "host/launch/ssh.h"
#include "tests/proc.h"

extern char **environ;

#define MAX_STEPS 64

static void setup(void)
{
	proc_setup("check_restart", 0);
}

/* Starts `meshrun local --hosts HOSTS` on llama-tiny with the arguments
 * given (a NULL-terminated list). */
static void local_vstart(struct proc *p, int hosts, const char *name, va_list ap)
{
	struct proc_args pa;
	proc_args_meshrun(&pa);
	proc_arg(&pa, "local");
	proc_arg(&pa, "--hosts");
	proc_arg(&pa, "%d", hosts);
	proc_arg(&pa, "--config");
	proc_arg(&pa, "configs/llama-tiny.yml");
	proc_arg(&pa, "openblas_threads=1");
	proc_arg(&pa, "learning_rate_schedule_steps=24");
	proc_args_va(&pa, ap);
	proc_start_args(p, name, &pa);
}

/* `meshrun local --hosts 2` */
static void local_start(struct proc *p, const char *name, ...)
{
	va_list ap;
	va_start(ap, name);
	local_vstart(p, 2, name, ap);
	va_end(ap);
}

static void local_start3(struct proc *p, const char *name, ...)
{
	va_list ap;
	va_start(ap, name);
	local_vstart(p, 3, name, ap);
	va_end(ap);
}

/* Losses by step from a metrics file, the last line of a step winning;
 * returns 1 + the highest step seen. */
static int losses(const char *file, double out[MAX_STEPS])
{
	char path[400], line[4096];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, file);
	FILE *f = fopen(path, "r");
	int n = 0;
	for (int i = 0; i < MAX_STEPS; i++)
		out[i] = -1;
	while (f && fgets(line, sizeof(line), f)) {
		char *s = strstr(line, "\"step\":"), *p = strstr(line, "\"loss_hex\":\"");
		if (!s || !p)
			continue;   /* a line cut by a kill */
		int step = atoi(s + 7);
		ck_assert(step >= 0 && step < MAX_STEPS);
		out[step] = strtod(p + 12, NULL);
		if (step + 1 > n)
			n = step + 1;
	}
	if (f)
		fclose(f);
	return n;
}

static int lines(const char *file)
{
	char path[400];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, file);
	char *s = slurp(path);
	int n = 0;
	for (char *c = s; *c; c++)
		n += *c == '\n';
	return n;
}

/* The agent pid of `host` among the children of the launcher `parent`,
 * found by parent pid in /proc and the child's --host-id; -1 if none
 * (yet). */
static pid_t agent_pid(pid_t parent, int host)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = -1;
	char path[300], buf[4096], want[16];
	snprintf(want, sizeof(want), "%d", host);
	while (d && (e = readdir(d)) && found < 0) {
		pid_t pid = (pid_t)atoi(e->d_name);
		if (pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		int ppid = -1;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid != parent)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
		f = fopen(path, "r");
		if (!f)
			continue;
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
			size_t j = i + strlen(buf + i) + 1;
			if (!strcmp(buf + i, "--host-id") && j < n && !strcmp(buf + j, want))
				found = pid;
		}
	}
	if (d)
		closedir(d);
	return found;
}

/* Waits until the run has logged `n` steps (the launcher still running). */
static void wait_lines(struct proc *p, const char *file, int n)
{
	double end = now_s() + 90;
	while (lines(file) < n) {
		ck_assert_msg(proc_wait(p, 0) == -1, "local ended early (%d):\n%s", p->status,
			      slurp(p->err));
		ck_assert_msg(now_s() < end, "no step %d logged:\n%s", n, slurp(p->err));
		usleep(10000);
	}
}

/* The uninterrupted run's losses (24 steps). */
static void straight(double out[MAX_STEPS])
{
	struct proc p;
	char m[300];
	snprintf(m, sizeof(m), "%s/straight.jsonl", tmpdir);
	local_start(&p, "straight", "steps=24", "--metrics", m, NULL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "%s", slurp(p.err));
	ck_assert_int_eq(losses("straight.jsonl", out), 24);
}

static void assert_same_losses(const char *file, const double *want)
{
	double got[MAX_STEPS];
	ck_assert_int_eq(losses(file, got), 24);
	for (int s = 0; s < 24; s++)
		ck_assert_msg(got[s] == want[s], "step %d: %a, uninterrupted %a", s, got[s], want[s]);
}

/* How many times needle occurs in the file at path. */
static int count_in(const char *path, const char *needle)
{
	int n = 0;
	char *s = slurp(path);
	for (char *c = s; (c = strstr(c, needle)); c += strlen(needle))
		n++;
	return n;
}

/* A kill drill (--fault kill:host=1:step=6) under --max-restarts with a
 * checkpoint at step 4: the restart's agents are told they are restart
 * 1 and the kill does not fire again, so the run finishes after one
 * restart with the uninterrupted run's losses (want). A link fault
 * beside it (a reset of link 0-1 at its 3rd data frame, survived by
 * replay) fires again in the restart, as link faults do. */
static void kill_drill_recovers(const double *want)
{
	char m[300], ck[300];
	snprintf(m, sizeof(m), "%s/drill.jsonl", tmpdir);
	snprintf(ck, sizeof(ck), "%s/ck-drill", tmpdir);
	struct proc p;
	local_start(&p, "drill", "steps=24", "checkpoint_period=4", "--checkpoint-dir", ck,
		    "--metrics", m, "--fault", "kill:host=1:step=6", "--fault", "close:link=0-1:frame=3",
		    "--max-restarts", "2", NULL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "%s", slurp(p.err));
	ck_assert_int_eq(count_in(p.err, "fault: injected kill on host 1 at step 6"), 1);
	ck_assert_int_eq(count_in(p.err, "fault: injected close on link 0-1 at frame 3"), 2);
	ck_assert_int_eq(count_in(p.err, "fault: injected"), 3);
	ck_assert_int_eq(count_in(p.err, "; restart "), 1);
	ck_assert_file_has(p.err, "host 1 was killed by signal 9");
	ck_assert_file_has(p.err, "; restart 1 of 2 from checkpoint step 4");
	assert_same_losses("drill.jsonl", want);
	/* step 4 ran twice (5 too, when host 0 logged it before it saw the
	 * loss): the restart resumed from step 4 */
	int n = lines("drill.jsonl");
	ck_assert_msg(n == 25 || n == 26, "%d metrics lines", n);
}


/* Waits until host 0 writes a checkpoint after a complete one: a
 * step-N.tmp beside a complete step-M, M < N. */
static void wait_writing(struct proc *p, const char *ck)
{
	double end = now_s() + 90;
	for (;;) {
		long done = -1, tmp = -1;
		DIR *d = opendir(ck);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			long n;
			char rest[16] = "";
			if (sscanf(e->d_name, "step-%ld%15s", &n, rest) < 1)
				continue;
			if (!strcmp(rest, ".tmp"))
				tmp = n;
			else if (!rest[0] && n > done)
				done = n;
		}
		if (d)
			closedir(d);
		if (done >= 0 && tmp > done)
			return;
		ck_assert_msg(proc_wait(p, 0) == -1, "local ended early (%d):\n%s", p->status,
			      slurp(p->err));
		ck_assert_msg(now_s() < end, "no checkpoint being written:\n%s", slurp(p->err));
		usleep(5000);
	}
}

/* A host killed while a checkpoint is being written, under
 * --max-restarts and then with a plain --resume: both finish with the
 * uninterrupted losses (want). */
static void kill_during_checkpoint(const double *want)
{
	char m[300], ck[300], path[400], err[256];
	/* 4 files x 150 ms: each checkpoint takes 0.6 s to write */
	setenv("MESHRUN_TEST_CKPT_DELAY_MS", "150", 1);
	snprintf(ck, sizeof(ck), "%s/ck-writing", tmpdir);

	/* under --max-restarts */
	snprintf(m, sizeof(m), "%s/w.jsonl", tmpdir);
	struct proc p;
	local_start(&p, "restart", "steps=24", "checkpoint_period=4", "--checkpoint-dir", ck,
		    "--metrics", m, "--max-restarts", "2", NULL);
	wait_writing(&p, ck);
	kill(agent_pid(p.pid, 0), SIGKILL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "%s", slurp(p.err));
	ck_assert_file_has(p.err, "; restart 1 of 2 from checkpoint step ");
	assert_same_losses("w.jsonl", want);

	/* a plain --resume after the same kill */
	rm_rf(ck);
	snprintf(m, sizeof(m), "%s/x.jsonl", tmpdir);
	local_start(&p, "plain", "steps=24", "checkpoint_period=4", "--checkpoint-dir", ck,
		    "--metrics", m, NULL);
	wait_writing(&p, ck);
	kill(agent_pid(p.pid, 0), SIGKILL);
	ck_assert_int_ne(proc_wait(&p, 60), 0);
	int64_t step;
	ck_assert_msg(ckpt_find(ck, path, sizeof(path), &step, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_gt(step, 0);
	local_start(&p, "resume", "steps=24", "checkpoint_period=4", "--checkpoint-dir", ck,
		    "--metrics", m, "--resume", NULL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "%s", slurp(p.err));
	assert_same_losses("x.jsonl", want);
	unsetenv("MESHRUN_TEST_CKPT_DELAY_MS");
}

/* A host killed from outside, one killed while a checkpoint is being
 * written and one killed by a fault: each recovers with the
 * uninterrupted losses (one straight run for the three). */
START_TEST(test_kill_restarts)
{
	double want[MAX_STEPS];
	char m[300], ck[300];
	straight(want);
	snprintf(m, sizeof(m), "%s/r.jsonl", tmpdir);
	snprintf(ck, sizeof(ck), "%s/ck", tmpdir);
	struct proc p;
	local_start(&p, "restart", "steps=24", "checkpoint_period=4", "--checkpoint-dir", ck,
		    "--metrics", m, "--max-restarts", "2", NULL);
	wait_lines(&p, "r.jsonl", 7);
	pid_t h1 = agent_pid(p.pid, 1);
	ck_assert_int_gt(h1, 0);
	kill(h1, SIGKILL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "%s", slurp(p.err));
	ck_assert_file_has(p.err, "host 1 was killed by signal 9");
	ck_assert_file_has(p.err, "; restart 1 of 2 from checkpoint step ");
	assert_same_losses("r.jsonl", want);
	ck_assert_int_gt(lines("r.jsonl"), 24);   /* some steps ran twice */
	kill_during_checkpoint(want);
	kill_drill_recovers(want);
}
END_TEST

START_TEST(test_stop_is_killed)
{
	char m[300];
	snprintf(m, sizeof(m), "%s/s.jsonl", tmpdir);
	struct proc p;
	local_start(&p, "stop", "steps=1000000", "heartbeat_timeout_s=4", "--metrics", m, NULL);
	wait_lines(&p, "s.jsonl", 3);
	pid_t h0 = agent_pid(p.pid, 0), h1 = agent_pid(p.pid, 1);
	ck_assert_int_gt(h0, 0);
	ck_assert_int_gt(h1, 0);
	kill(h1, SIGSTOP);
	double t0 = now_s();
	int rc = proc_wait(&p, 30);
	double dt = now_s() - t0;
	fprintf(stderr, "local returned %.2f s after SIGSTOP (heartbeat_timeout_s=4)\n", dt);
	ck_assert_int_eq(rc, EXIT_PEER_LOST);
	ck_assert_double_le(dt, 4 + 2);
	ck_assert_file_has(p.err, "host 1 was lost (host 0 reported it");
	ck_assert_file_has(p.err, "lost host 1 (127.0.0.1:");
	/* local reaped both agents before returning: neither pid exists */
	ck_assert(kill(h0, 0) != 0 && errno == ESRCH);
	ck_assert(kill(h1, 0) != 0 && errno == ESRCH);
}
END_TEST

/* A dead peer is found fast: host 0 of 3 is SIGKILLed; hosts 1 and 2
 * each wait for host 0's redial of their link (the lower id redials), and
 * host 0's listener refusing a connect tells them it is gone. They fail
 * naming host 0 long before heartbeat_timeout_s (20 s), and before the
 * launcher's grace (1.5 s) would stop them: exit 5, not a signal. */
START_TEST(test_dead_peer_refuses)
{
	char m[300];
	snprintf(m, sizeof(m), "%s/d.jsonl", tmpdir);
	struct proc p;
	local_start3(&p, "dead", "steps=1000000", "heartbeat_timeout_s=20", "--metrics", m, NULL);
	wait_lines(&p, "d.jsonl", 3);
	pid_t h0 = agent_pid(p.pid, 0);
	ck_assert_int_gt(h0, 0);
	kill(h0, SIGKILL);
	double t0 = now_s();
	int rc = proc_wait(&p, 30);
	double dt = now_s() - t0;
	fprintf(stderr, "local returned %.2f s after SIGKILL of host 0 (heartbeat_timeout_s=20)\n", dt);
	ck_assert_int_ne(rc, 0);
	ck_assert_double_lt(dt, 20);
	ck_assert_file_has(p.err, "lost host 0 (127.0.0.1:");
	ck_assert_file_has(p.err, "refuses connections: the process is gone");
	ck_assert_file_has(p.err, "host 0 was killed by signal 9");
	ck_assert_file_has(p.err, "exited with code 5 (peer lost)");
}
END_TEST

/* The newest complete step is found; *.tmp and other names are not. */
START_TEST(test_find_newest_complete)
{
	char d[400], path[500], out[600], err[256];
	int64_t step;
	snprintf(d, sizeof(d), "%s/find", tmpdir);
	ck_assert_int_eq(ckpt_find(d, out, sizeof(out), &step, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "no complete checkpoint"), "%s", err);
	mkdir(d, 0755);
	const char *names[] = { "step-000004", "step-000012", "step-000020.tmp", "step-x", "latest" };
	for (int i = 0; i < 5; i++) {
		snprintf(path, sizeof(path), "%s/%s", d, names[i]);
		ck_assert_int_eq(mkdir(path, 0755), 0);
	}
	ck_assert_int_eq(ckpt_find(d, out, sizeof(out), &step, err, sizeof(err)), 0);
	ck_assert_int_eq(step, 12);
	snprintf(path, sizeof(path), "%s/step-000012", d);
	ck_assert_str_eq(out, path);
	/* a step directory named directly (it holds model.safetensors) */
	snprintf(path, sizeof(path), "%s/step-000012/model.safetensors", d);
	fclose(fopen(path, "w"));
	snprintf(path, sizeof(path), "%s/step-000012", d);
	ck_assert_int_eq(ckpt_find(path, out, sizeof(out), &step, err, sizeof(err)), 0);
	ck_assert_str_eq(out, path);
	ck_assert_int_eq(step, -1);
}
END_TEST

/* --max-restarts without checkpoints to restart from is refused before
 * anything starts: no --checkpoint-dir is a usage error, no
 * checkpoint_period a config error. */
START_TEST(test_restarts_need_checkpoints)
{
	struct proc p;
	char ck[300];
	snprintf(ck, sizeof(ck), "%s/ck", tmpdir);
	local_start(&p, "nodir", "steps=4", "--max-restarts", "1", NULL);
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_USAGE);
	ck_assert_file_has(p.err, "--max-restarts needs --checkpoint-dir DIR");
	local_start(&p, "noperiod", "steps=4", "--checkpoint-dir", ck, "--max-restarts", "1", NULL);
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_CONFIG);
	ck_assert_file_has(p.err, "--max-restarts needs checkpoint_period > 0");
	ck_assert(access(ck, F_OK) != 0);
}
END_TEST

/* The launcher core with shell children: a "lost" line on either kind
 * of status channel kills the named child at once, even stopped, and the
 * rest (one stopped, one sleeping) are stopped after the grace. */
static void core_case(enum launch_status how, const char *report)
{
	char *sh[3][4] = {
		{ "/bin/sh", "-c", (char *)report, NULL },
		{ "/bin/sh", "-c", "kill -STOP $$", NULL },
		{ "/bin/sh", "-c", "exec sleep 100", NULL },
	};
	struct launch_child c[4] = { 0 };
	for (int i = 0; i < 3; i++) {
		snprintf(c[i].name, sizeof(c[i].name), "host %d", i);
		c[i].argv = sh[i];
		c[i].envp = environ;
		c[i].status = how;
	}
	/* a fourth: stopped, not reported: SIGTERM alone would not end it */
	char *stop[] = { "/bin/sh", "-c", "kill -STOP $$", NULL };
	snprintf(c[3].name, sizeof(c[3].name), "host 3");
	c[3].argv = stop;
	c[3].envp = environ;
	struct launch_opts o = { .grace_s = 0.5, .term_grace_s = 0.5 };
	struct launch_result r;
	char err[1024];
	double t0 = now_s();
	ck_assert_int_eq(launch_run(c, 4, &o, &r, err, sizeof(err)), -ECHILD);
	double dt = now_s() - t0;
	ck_assert_msg(dt < 20, "took %.1f s", dt);
	ck_assert_int_eq(r.failures, 4);
	ck_assert_int_eq(r.first, 1);
	ck_assert(r.first_lost);
	ck_assert_msg(strstr(err, "host 1 was lost (host 0 reported it; killed by the launcher)"), "%s", err);
	ck_assert_msg(strstr(err, "host 0 exited with code 5"), "%s", err);
	ck_assert_msg(strstr(err, "host 2 was stopped by signal 15"), "%s", err);
	ck_assert_msg(strstr(err, "host 3 was stopped by signal 15"), "%s", err);
}

START_TEST(test_core_status_fd)
{
	core_case(LAUNCH_STATUS_FD, "sleep 0.3; echo 'meshrun-status: lost 1' >&$MESHRUN_STATUS_FD; "
		  "sleep 0.2; exit 5");
}
END_TEST

START_TEST(test_core_status_stderr)
{
	/* ssh's way: the status line comes on stderr among other lines */
	core_case(LAUNCH_STATUS_STDERR, "sleep 0.3; echo 'a message' >&2; "
		  "echo 'meshrun-status: lost 1' >&2; sleep 0.2; exit 5");
}
END_TEST

/* The core's restart loop with a scripted backend: each launch's result
 * and the checkpoint it leaves come from a table; the loop must relaunch
 * only after failures worth it, at most max times, resuming once a
 * checkpoint is there (and from then on). */
struct script {
	int n;                 /* launches so far */
	int rc[4];             /* launch i's return */
	int code[4];           /* its first failure's exit code (-1: a signal) */
	bool lost[4], intr[4];
	int64_t ckpt[4];       /* the checkpoint after launch i (-1: none) */
	bool resumed[4];       /* what launch i was asked */
	int restart[4];        /* which restart launch i was told it is */
};

static int script_launch(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
			 size_t errlen)
{
	struct script *sc = ctx;
	int i = sc->n++;
	ck_assert_int_lt(i, 4);
	sc->resumed[i] = resume;
	sc->restart[i] = restart;
	memset(r, 0, sizeof(*r));
	r->first = sc->rc[i] ? 0 : -1;
	r->first_code = sc->code[i];
	r->first_lost = sc->lost[i];
	r->interrupted = sc->intr[i];
	r->failures = sc->rc[i] ? 1 : 0;
	snprintf(err, errlen, "%s", sc->rc[i] ? "host 0 failed" : "");
	return sc->rc[i];
}

static int64_t script_ckpt(void *ctx)
{
	struct script *sc = ctx;
	return sc->ckpt[sc->n - 1];
}

static bool script_retry(int code)
{
	return code == 1 || code == 5;
}

static int script_run(struct script *sc, int max)
{
	struct launch_restarts rs = { .max = max, .launch = script_launch, .checkpoint = script_ckpt,
				      .retry_code = script_retry, .ctx = sc };
	struct launch_result r;
	char err[256];
	return launch_restarting("check_restart", &rs, &r, err, sizeof(err));
}

START_TEST(test_core_restarting)
{
	/* killed (a signal), then lost with a checkpoint, then done */
	struct script a = { .rc = { -ECHILD, -ECHILD, 0 }, .code = { -1, 5, 0 },
			    .lost = { false, true }, .ckpt = { -1, 4, 8 } };
	ck_assert_int_eq(script_run(&a, 2), 0);
	ck_assert_int_eq(a.n, 3);
	ck_assert(!a.resumed[0] && !a.resumed[1] && a.resumed[2]);
	/* each launch is told which restart it is: the first is 0 */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(a.restart[i], i);
	/* the limit: two restarts, then the failure stands; resume stays on */
	struct script b = { .rc = { -ECHILD, -ECHILD, -ECHILD, 0 }, .code = { 1, 1, 1 },
			    .ckpt = { 4, -1, -1 } };
	ck_assert_int_eq(script_run(&b, 2), -ECHILD);
	ck_assert_int_eq(b.n, 3);
	ck_assert(!b.resumed[0] && b.resumed[1] && b.resumed[2]);
	/* a config error (3) would repeat; an interrupt is the user's */
	struct script c = { .rc = { -ECHILD, 0 }, .code = { 3 }, .ckpt = { 4 } };
	ck_assert_int_eq(script_run(&c, 2), -ECHILD);
	ck_assert_int_eq(c.n, 1);
	struct script d = { .rc = { -ECHILD, 0 }, .code = { -1 }, .intr = { true }, .ckpt = { 4 } };
	ck_assert_int_eq(script_run(&d, 2), -ECHILD);
	ck_assert_int_eq(d.n, 1);
	/* no restarts allowed: one launch */
	struct script e = { .rc = { -ECHILD, 0 }, .code = { 5 }, .lost = { true }, .ckpt = { 4 } };
	ck_assert_int_eq(script_run(&e, 0), -ECHILD);
	ck_assert_int_eq(e.n, 1);
}
END_TEST

/* The ssh backend's remote command: the first launch carries no
 * --restart (its host faults fire), the Nth restart carries --restart N
 * after --resume; nothing else changes. */
START_TEST(test_ssh_agent_restart_arg)
{
	struct hostfile_entry h[2] = { { .host = "10.0.0.1" }, { .host = "10.0.0.2" } };
	struct ssh_launch_args a = { .hosts = h, .n = 2, .devices_per_host = 1,
				     .restarts = { .max = 2 } };
	char first[4096], again[4096], want[4200];
	ssh_agent_cmd(first, sizeof(first), &a, "abc", 1, 0, false);
	ck_assert_msg(!strstr(first, "--restart"), "%s", first);
	ck_assert_msg(strstr(first, " --host-id 1 --hosts 2 "), "%s", first);
	ck_assert_msg(strstr(first, " --checkpoint-dir '/tmp/meshrun-abc/ckpt'"), "%s", first);
	ssh_agent_cmd(again, sizeof(again), &a, "abc", 1, 2, true);
	snprintf(want, sizeof(want), "%s --resume --restart 2", first);
	ck_assert_str_eq(again, want);
}
END_TEST

/* The Slurm backend's srun argv: --restart N only on a restart, as two
 * words at the end (after --resume). */
START_TEST(test_slurm_step_restart_arg)
{
	char *own[] = { "--config", "x.yml", "steps=8" };
	struct slurm_launch_args a = { .argc = 3, .argv = own, .devices_per_host = 2 };
	char keys[1][64] = { "dcn_data_parallelism=1" };
	struct slurm_step st = { .srun = "/usr/bin/srun", .self = "/shared/meshrun", .node = "node1",
				 .addr = "10.0.0.2", .host = 1, .hosts = 2, .keys = (const char (*)[64])keys,
				 .nkeys = 1 };
	static char store[SLURM_ARGS_MAX][512];
	char *v[SLURM_ARGS_MAX + 1];
	int n = 0;
	ck_assert_int_eq(slurm_step_argv(&a, &st, v, store), 0);
	while (v[n])
		n++;
	ck_assert_str_eq(v[n - 1], "dcn_data_parallelism=1");
	for (int i = 0; i < n; i++)
		ck_assert_msg(strcmp(v[i], "--restart"), "argv %d is --restart on the first launch", i);
	st.restart = 3;
	st.resume = true;
	ck_assert_int_eq(slurm_step_argv(&a, &st, v, store), 0);
	int m = 0;
	while (v[m])
		m++;
	ck_assert_int_eq(m, n + 3);
	ck_assert_str_eq(v[n], "--resume");
	ck_assert_str_eq(v[n + 1], "--restart");
	ck_assert_str_eq(v[n + 2], "3");
	ck_assert_str_eq(v[7], "agent");
}
END_TEST

/* The loop asks regroup before a restart: machines gone and the job
 * moved to the rest (the restart goes on), or no restart can work (the
 * failure stands, the reason appended to it, no relaunch). */
struct regroup_script {
	struct script sc;
	int calls, rc;
};

static int script_regroup(void *ctx, char *what, size_t whatlen, char *why, size_t whylen)
{
	struct regroup_script *g = ctx;
	g->calls++;
	if (g->rc) {
		snprintf(why, whylen, "node node1 is gone and the mesh cannot shrink");
		return g->rc;
	}
	snprintf(what, whatlen, " on 2 of 3 nodes");
	return 0;
}

static int regroup_launch(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
			  size_t errlen)
{
	return script_launch(&((struct regroup_script *)ctx)->sc, restart, resume, r, err, errlen);
}

static int64_t regroup_ckpt(void *ctx)
{
	return script_ckpt(&((struct regroup_script *)ctx)->sc);
}

START_TEST(test_core_regroup)
{
	char err[256];
	struct launch_result r;
	struct regroup_script g = { .sc = { .rc = { -ECHILD, 0 }, .code = { -1 }, .ckpt = { 4, 8 } } };
	struct launch_restarts rs = { .max = 2, .launch = regroup_launch, .checkpoint = regroup_ckpt,
				      .retry_code = script_retry, .regroup = script_regroup, .ctx = &g };
	ck_assert_int_eq(launch_restarting("check_restart", &rs, &r, err, sizeof(err)), 0);
	ck_assert_int_eq(g.sc.n, 2);
	ck_assert_int_eq(g.calls, 1);
	ck_assert(g.sc.resumed[1]);
	/* the mesh cannot shrink: one launch, the failure names why */
	struct regroup_script h = { .sc = { .rc = { -ECHILD, 0 }, .code = { 5 }, .lost = { true },
					    .ckpt = { 4 } }, .rc = -EINVAL };
	rs.ctx = &h;
	ck_assert_int_eq(launch_restarting("check_restart", &rs, &r, err, sizeof(err)), -ECHILD);
	ck_assert_int_eq(h.sc.n, 1);
	ck_assert_str_eq(err, "host 0 failed; node node1 is gone and the mesh cannot shrink");
	/* no restart left: regroup is not asked */
	struct regroup_script k = { .sc = { .rc = { -ECHILD }, .code = { 5 }, .ckpt = { 4 } } };
	rs.ctx = &k;
	rs.max = 0;
	ck_assert_int_eq(launch_restarting("check_restart", &rs, &r, err, sizeof(err)), -ECHILD);
	ck_assert_int_eq(k.calls, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("restart");
	TCase *tc = tcase_create("ckpt_dir");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_find_newest_complete);
	tcase_add_test(tc, test_restarts_need_checkpoints);
	suite_add_tcase(s, tc);
	tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_core_status_fd);
	tcase_add_test(tc, test_core_status_stderr);
	tcase_add_test(tc, test_core_restarting);
	tcase_add_test(tc, test_core_regroup);
	tcase_add_test(tc, test_ssh_agent_restart_arg);
	tcase_add_test(tc, test_slurm_step_restart_arg);
	suite_add_tcase(s, tc);
	tc = tcase_create("restart");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_kill_restarts);
	suite_add_tcase(s, tc);
	tc = tcase_create("stop");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_stop_is_killed);
	tcase_add_test(tc, test_dead_peer_refuses);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
