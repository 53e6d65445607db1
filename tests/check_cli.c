/* The honest surface (issue 22, item 10), through the binary: --help on
 * every command (exit 0, usage on stdout); one error prefix
 * ("meshrun: <command>: ") and the usage after a bad command line; config
 * and fault-spec errors said once by the launcher, not once per host; a
 * non-finite eval loss and out of memory exit 1; Ctrl-C to a launcher
 * exits 130; a wrong CA or a foreign listener at the coordinator's
 * address is its own class (7) naming the address and the verify error;
 * a flood of refused connections is a few lines with a count; the local
 * launcher's keys leave the disk once the agents have read them; meshrun
 * runs on the CPU's own OpenBLAS kernels where the library falls back;
 * device threads compute at device_nice and the threads that move bytes
 * do not; `local`'s agents each run on their own share of the CPUs
 * (cpu_bind) unless it is off or they outnumber the CPUs, and with
 * cpu_bind spread round-robin on one CPU each when they do; synthetic compute (pipeline_compute=sleep) prints no loss and
 * writes no checkpoint. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/launch/local.h"
#include "host/util/threads.h"
#include "tests/proc.h"

#define TINY "configs/llama-tiny.yml"

static void setup(void)
{
	proc_setup("check_cli", 2);
}

/* Lines of text (each ending in '\n') that hold needle. */
static int lines_with(const char *text, const char *needle)
{
	int n = 0;
	for (const char *l = text; *l;) {
		const char *nl = strchr(l, '\n');
		size_t len = nl ? (size_t)(nl - l) : strlen(l);
		char *hit = strstr(l, needle);
		if (hit && (size_t)(hit - l) < len)
			n++;
		l += len + (nl ? 1 : 0);
	}
	return n;
}

/* ---- --help, one prefix ---- */

START_TEST(test_help_everywhere)
{
	static const char *const cmds[] = {
		"train", "eval", "local", "agent", "launch", "shardings", "report", "schedule", "bench", "data",
		"bench link", "bench collectives", "bench matmul",
	};
	char line[256], want[64];
	struct proc p;
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		for (int form = 0; form < 2; form++) {
			/* anywhere among the arguments, both spellings */
			snprintf(line, sizeof(line), form ? "%s --config x.yml -h" : "%s --help", cmds[i]);
			int rc = proc_run_words(&p, "help", line, 20, false);
			ck_assert_msg(rc == 0, "%s: exit %d:\n%s", line, rc, slurp(p.err));
			snprintf(want, sizeof(want), "usage: meshrun %.*s", (int)strcspn(cmds[i], " "),
				 cmds[i]);
			ck_assert_msg(!strncmp(slurp(p.out), want, strlen(want)), "%s:\n%s", line,
				      slurp(p.out));
			ck_assert_msg(!*slurp(p.err), "%s wrote on stderr:\n%s", line, slurp(p.err));
		}
	}
}
END_TEST

START_TEST(test_one_prefix)
{
	/* a bad command line: "meshrun: <command>: <what>", then the usage */
	static const struct { const char *line, *prefix; } bad[] = {
		{ "train --nope", "meshrun: train: unknown option '--nope'" },
		{ "train --config " TINY " --trace t.json", "meshrun: train: --trace is for local and agent" },
		{ "eval --text x", "meshrun: eval: --checkpoint DIR is needed" },
		{ "local --config " TINY, "meshrun: local: --hosts N is needed" },
		{ "local --hosts 2 --config " TINY " --restart 1", "meshrun: local: --restart is set by the launcher" },
		{ "agent --nope", "meshrun: agent: unknown option '--nope'" },
		{ "launch --config " TINY, "meshrun: launch: --hostfile FILE (or --slurm) is needed" },
		{ "shardings --hosts", "meshrun: shardings: --hosts needs a value" },
		{ "report m.jsonl", "meshrun: report: -o FILE.svg is needed" },
		{ "schedule", "meshrun: schedule: --config FILE is needed" },
		{ "bench", "meshrun: bench: give matmul, cipher, link, collectives, load or backward" },
		{ "bench cipher --bytes 0", "meshrun: bench cipher: --bytes wants an integer" },
		{ "bench link --hosts 2", "meshrun: bench link: --sizes is needed" },
		{ "bench collectives --hosts 2 --sizes 1K --op nope", "meshrun: bench collectives: unknown op 'nope'" },
		{ "bench matmul --size 0", "meshrun: bench matmul: --size wants an integer" },
	};
	struct proc p;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = proc_run_words(&p, "bad", bad[i].line, 20, false);
		ck_assert_msg(rc == EXIT_USAGE, "%s: exit %d:\n%s", bad[i].line, rc, slurp(p.err));
		char *err = slurp(p.err);
		ck_assert_msg(!strncmp(err, bad[i].prefix, strlen(bad[i].prefix)), "%s:\n%s", bad[i].line, err);
		ck_assert_msg(strstr(err, "\nusage: meshrun "), "%s: no usage:\n%s", bad[i].line, err);
	}
	/* and a run-time error of a command */
	int rc = proc_run_words(&p, "shardings", "shardings --config " TINY " learning_rate=-1", 20, false);
	ck_assert_int_eq(rc, EXIT_CONFIG);
	ck_assert_str_eq(slurp(p.err), "meshrun: shardings: config: key 'learning_rate' must be > 0, "
				       "got -1 (learning_rate: command line)\n");
	/* train's range error names the file and line of the value; the
	 * loader's own error (a wrong type) names it once, beside the key */
	rc = proc_run_words(&p, "train", "train --config " TINY " base_num_query_heads=3", 20, false);
	ck_assert_int_eq(rc, EXIT_CONFIG);
	ck_assert_str_eq(slurp(p.err), "meshrun: train: config: key 'base_num_kv_heads' (2) must divide "
		"'base_num_query_heads' (3) (base_num_kv_heads: '" TINY "' line 6; base_num_query_heads: "
		"command line)\n");
	rc = proc_run_words(&p, "train", "train --config " TINY " steps=ten", 20, false);
	ck_assert_int_eq(rc, EXIT_CONFIG);
	ck_assert_str_eq(slurp(p.err), "meshrun: train: config: key 'steps' (command line) wants an "
				       "integer, got 'ten'\n");
}
END_TEST

/* ---- OpenBLAS kernels ---- */

/* Does /proc/cpuinfo's first "flags" line hold every one of words? */
static bool cpu_has(const char *const *words)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[8192];
	bool found = false, all = false;
	while (f && !found && fgets(line, sizeof line, f)) {
		if (strncmp(line, "flags", 5))
			continue;
		found = all = true;
		for (const char *const *w = words; *w; w++) {
			char pat[64];
			snprintf(pat, sizeof pat, " %s ", *w);
			line[strcspn(line, "\n")] = ' ';
			if (!strstr(line, pat))
				all = false;
		}
	}
	if (f)
		fclose(f);
	return all;
}

/* The core name in `bench matmul`'s line ("core NAME:"). */
static void matmul_core(char *name, size_t n)
{
	struct proc p;
	int rc = proc_run_words(&p, "matmul", "bench matmul --size 64 --reps 1", 30, false);
	ck_assert_msg(rc == 0, "bench matmul: exit %d:\n%s", rc, slurp(p.err));
	const char *c = strstr(slurp(p.out), "core ");
	ck_assert_msg(c, "no core in:\n%s", slurp(p.out));
	c += 5;
	size_t len = strcspn(c, ":");
	ck_assert(len < n);
	memcpy(name, c, len);
	name[len] = 0;
}

START_TEST(test_blas_kernels)
{
	/* the choice itself, against the CPU's flags read independently */
	static const char *const avx512[] = { "avx512f", "avx512bw", "avx512vl", "avx512dq", NULL };
	static const char *const avx2[] = { "avx2", "fma", NULL };
	const char *want = cpu_has(avx512) ? "SkylakeX" : cpu_has(avx2) ? "Haswell" : NULL;
	const char *got = util_blas_kernels_choice("Prescott");
	ck_assert_msg(want ? got && !strcmp(got, want) : !got, "Prescott -> %s, flags say %s",
		      got ? got : "(keep)", want ? want : "(keep)");
	ck_assert_ptr_null(util_blas_kernels_choice("Haswell"));
	ck_assert_ptr_null(util_blas_kernels_choice("SkylakeX"));
	ck_assert_ptr_null(util_blas_kernels_choice(NULL));

	/* through the binary: a user's OPENBLAS_CORETYPE is kept, even the
	 * fallback's; unset, a CPU with AVX2 never runs on Prescott (OpenBLAS
	 * knew the CPU, or meshrun re-executed itself with a better one) */
	char core[64];
	setenv("OPENBLAS_CORETYPE", "Prescott", 1);
	matmul_core(core, sizeof core);
	ck_assert_str_eq(core, "Prescott");
	unsetenv("OPENBLAS_CORETYPE");
	matmul_core(core, sizeof core);
	if (want)
		ck_assert_msg(strcmp(core, "Prescott"), "meshrun ran on Prescott on a CPU with %s", want);
}
END_TEST

/* ---- device_nice ---- */

/* A thread's nice value as the kernel reports it (field 19 of
 * /proc/PID/task/TID/stat; the name in field 2 may hold spaces), its name
 * into comm; -100 if it is gone. */
static int task_nice(int pid, int tid, char *comm, size_t n)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, tid);
	char *st = slurp(path);   /* proc.h's buffer: not ours to free */
	char *open = strchr(st, '('), *close = strrchr(st, ')');
	int nice = -100;
	if (open && close && close > open) {
		snprintf(comm, n, "%.*s", (int)(close - open - 1), open + 1);
		long f[17];
		if (sscanf(close + 2, "%*c %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld",
			   &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10],
			   &f[11], &f[12], &f[13], &f[14], &f[15]) == 16)
			nice = (int)f[15];   /* field 19: the 16th after the state */
	}
	return nice;
}

struct nice_probe {
	struct cfg *c;
	int rc[2], self[2], proc[2];
};

static void *nice_thread(void *arg)
{
	struct nice_probe *p = arg;
	char comm[32];
	for (int i = 0; i < 2; i++) {
		p->rc[i] = util_device_nice(p->c);
		p->self[i] = util_thread_nice();
		p->proc[i] = task_nice(getpid(), gettid(), comm, sizeof comm);
		p->c->device_nice = 3;   /* the second call must not lower it */
	}
	return NULL;
}

static void *batch_thread(void *arg)
{
	struct nice_probe *p = arg;
	p->rc[0] = util_device_nice(p->c);
	p->self[0] = util_thread_nice();
	p->proc[0] = sched_getscheduler(0);
	return NULL;
}

START_TEST(test_device_nice)
{
	static struct cfg c;
	cfg_defaults(&c);
	ck_assert_int_eq(c.device_nice, 0);
	ck_assert(!c.device_batch);
	char err[256], comm[32];
	static struct cfg bad;
	cfg_defaults(&bad);
	ck_assert_int_eq(cfg_override(&bad, "device_nice=20", err, sizeof err), 0);
	ck_assert_int_ne(cfg_finish(&bad, 1, 1, err, sizeof err), 0);
	ck_assert_msg(strstr(err, "device_nice"), "%s", err);
	ck_assert_int_eq(cfg_override(&c, "device_nice=7", err, sizeof err), 0);
	int before = task_nice(getpid(), gettid(), comm, sizeof comm);
	struct nice_probe p = { .c = &c };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, nice_thread, &p), 0);
	pthread_join(th, NULL);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(p.rc[i], 0);
		ck_assert_int_eq(p.self[i], 7);
		ck_assert_int_eq(p.proc[i], 7);
	}
	ck_assert_int_eq(task_nice(getpid(), gettid(), comm, sizeof comm), before);
	/* device_batch: SCHED_BATCH, the nice value left as it was */
	ck_assert_int_eq(cfg_override(&c, "device_batch=true", err, sizeof err), 0);
	ck_assert_int_eq(cfg_override(&c, "device_nice=0", err, sizeof err), 0);
	struct nice_probe q = { .c = &c };
	ck_assert_int_eq(pthread_create(&th, NULL, batch_thread, &q), 0);
	pthread_join(th, NULL);
	ck_assert_int_eq(q.rc[0], 0);
	ck_assert_int_eq(q.self[0], before);
	ck_assert_int_eq(q.proc[0], SCHED_BATCH);

	/* through the agents: every device thread at 7, every thread that
	 * moves bytes (stream, net, communication) at the process's 0 */
	struct proc r;
	proc_meshrun(&r, "local", "local", "--hosts", "2", "--config", TINY, "steps=1000000",
		     "openblas_threads=1", "device_nice=7", (char *)NULL);
	ck_assert_msg(proc_wait_output(&r, "completed step: 2,", 60), "no step:\n%s", slurp(r.err));
	int dev = 0, mover = 0;
	DIR *d = opendir("/proc");
	ck_assert_ptr_nonnull(d);
	for (struct dirent *e; (e = readdir(d));) {
		int pid = atoi(e->d_name);
		if (pid <= 0 || pid == r.pid || getpgid(pid) != r.pid)
			continue;
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/task", pid);
		DIR *t = opendir(path);
		if (!t)
			continue;
		for (struct dirent *te; (te = readdir(t));) {
			int tid = atoi(te->d_name);
			int nice = tid > 0 ? task_nice(pid, tid, comm, sizeof comm) : -100;
			if (nice == -100)
				continue;
			if (!strncmp(comm, "mr-dev", 6)) {
				ck_assert_msg(nice == 7, "%s of pid %d at nice %d", comm, pid, nice);
				dev++;
			} else if (!strncmp(comm, "mr-stream", 9) || !strcmp(comm, "mr-net") ||
				   !strncmp(comm, "mr-comm", 7)) {
				ck_assert_msg(nice == 0, "%s of pid %d at nice %d", comm, pid, nice);
				mover++;
			}
		}
		closedir(t);
	}
	closedir(d);
	ck_assert_int_eq(dev, 2);
	ck_assert_int_ge(mover, 6);   /* per agent a stream, the net and a comm thread */
	kill(-r.pid, SIGINT);
	ck_assert_int_eq(proc_wait(&r, 10), EXIT_INTERRUPTED);
}
END_TEST

/* ---- once, not per host ---- */

START_TEST(test_config_errors_once)
{
	static const struct { const char *extra, *want; } bad[] = {
		{ "learning_rate=-1", "key 'learning_rate' must be > 0, got -1 (learning_rate: command line)" },
		{ "no_such_key=3", "unknown key 'no_such_key'" },
		{ "--fault close:link=0-9:frame=3", "names a host beyond the job's 4 hosts" },
		{ "--fault bogus:host=1", "key 'faults'" },
		{ "ici_sequence_parallelism=2 ici_data_parallelism=1 --devices-per-host 2",
		  "the 'sequence' mesh axis has size 2" },
	};
	char line[512];
	struct proc p;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(line, sizeof(line), "local --hosts 4 --config " TINY " steps=2 %s", bad[i].extra);
		int rc = proc_run_words(&p, "local", line, 30, false);
		ck_assert_msg(rc == EXIT_CONFIG, "%s: exit %d:\n%s", line, rc, slurp(p.err));
		char *err = slurp(p.err);
		int nl = 0;
		for (const char *c = err; *c; c++)
			nl += *c == '\n';
		ck_assert_msg(lines_with(err, bad[i].want) == 1 && nl == 1 &&
			      !strncmp(err, "meshrun: local: config: ", 24), "%s:\n%s", line, err);
	}
	/* the benchmarks start agents through the same launcher */
	static const char *const benches[] = {
		"bench collectives --hosts 3 --op all_gather --sizes 64K no_such_key=3",
		"bench link --hosts 2 --sizes 64K no_such_key=3",
	};
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++) {
		int rc = proc_run_words(&p, "bench", benches[i], 30, false);
		char *err = slurp(p.err);
		ck_assert_msg(rc == EXIT_CONFIG && lines_with(err, "no_such_key") == 1,
			      "%s: exit %d:\n%s", benches[i], rc, err);
	}
}
END_TEST

/* ---- exit codes ---- */

START_TEST(test_eval_nan)
{
	/* a checkpoint whose weights are all NaN: eval fails, prints no loss */
	char line[512], path[300];
	struct proc p;
	snprintf(line, sizeof(line), "train --config " TINY " steps=1 max_target_length=16 --quiet "
		 "--checkpoint-dir %s/ck", tmpdir);
	ck_assert_int_eq(proc_run_words(&p, "train", line, 60, false), 0);
	snprintf(path, sizeof(path), "%s/ck/step-000001/model.safetensors", tmpdir);
	FILE *f = fopen(path, "r+b");
	ck_assert_ptr_nonnull(f);
	unsigned char len8[8];
	ck_assert_int_eq(fread(len8, 1, 8, f), 8);
	long hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen * 256 + len8[i];
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	long end = ftell(f);
	ck_assert_int_eq(fseek(f, 8 + hlen, SEEK_SET), 0);
	for (long i = 8 + hlen; i < end; i++)
		fputc(0xff, f);   /* 0xffffffff: a NaN */
	ck_assert_int_eq(fclose(f), 0);
	snprintf(line, sizeof(line), "eval --checkpoint %s/ck --text /usr/share/common-licenses/GPL-3 "
		 "max_target_length=16", tmpdir);
	int rc = proc_run_words(&p, "eval", line, 60, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s\n%s", rc, slurp(p.out), slurp(p.err));
	ck_assert_file_has(p.err, "meshrun: eval: the loss over ");
	ck_assert_file_has(p.err, " tokens is nan: the checkpoint's weights");
	ck_assert_msg(!file_has(p.out, "eval_loss"), "%s", slurp(p.out));
}
END_TEST

/* Synthetic compute computes no loss and does no FLOPs: the step lines and
 * the metrics say so and carry no number for either; a checkpoint is
 * refused naming the key. */
START_TEST(test_synthetic_no_loss)
{
	char line[512], path[300];
	struct proc p;
	snprintf(path, sizeof(path), "%s/m.jsonl", tmpdir);
	snprintf(line, sizeof(line), "train --config " TINY " steps=2 max_target_length=16 "
		 "pipeline_compute=sleep pipeline_sleep_ms=1,1,1 --metrics %s", path);
	int rc = proc_run_words(&p, "train", line, 60, false);
	char *out = slurp(p.out);
	ck_assert_msg(rc == 0, "exit %d:\n%s\n%s", rc, out, slurp(p.err));
	ck_assert_msg(lines_with(out, "completed step: ") == 2 && lines_with(out, ", loss: -, synthetic: sleep, ") == 2 &&
		      lines_with(out, "TFLOP/s/device: -, ") == 2 && lines_with(out, ", MFU: -, ") == 2 &&
		      lines_with(out, "grad_norm") == 0, "%s", out);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	char buf[4096];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	ck_assert_msg(lines_with(buf, "\"synthetic\":\"sleep\"") == 2 && !strstr(buf, "loss") &&
		      !strstr(buf, "grad_norm") && !strstr(buf, "mfu") && !strstr(buf, "tflops"), "%s", buf);
	snprintf(line, sizeof(line), "train --config " TINY " steps=1 max_target_length=16 "
		 "pipeline_compute=sleep --checkpoint-dir %s/ck", tmpdir);
	rc = proc_run_words(&p, "train", line, 60, false);
	ck_assert_msg(rc == EXIT_CONFIG, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_msg(lines_with(slurp(p.err), "meshrun: train: config: --checkpoint-dir is refused with "
				 "pipeline_compute=sleep") == 1, "%s", slurp(p.err));
	snprintf(path, sizeof(path), "%s/ck", tmpdir);
	ck_assert_msg(access(path, F_OK) != 0, "'%s' was made", path);
}
END_TEST

START_TEST(test_out_of_memory)
{
	/* a model of 550 GB: out of memory is exit 1, not a config error (an
	 * address-space limit makes it so however the kernel overcommits) */
	struct proc p;
	char *argv[] = { "prlimit", "--as=17179869184", (char *)meshrun(), "train", "--config", TINY,
			 "steps=1", "base_emb_dim=32768", "base_mlp_dim=131072",
			 "base_num_decoder_layers=8", "--quiet", NULL };
	proc_start(&p, "oom", argv, -1);
	int rc = proc_wait(&p, 60);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_file_has(p.err, "meshrun: train: model: out of memory");
	/* a dataset_type nobody knows is a config error (was: bad input) */
	rc = proc_run_words(&p, "ds", "train --config " TINY " steps=1 dataset_type=foo", 20, false);
	ck_assert_int_eq(rc, EXIT_CONFIG);
	ck_assert_file_has(p.err, "key 'dataset_type' has unknown value 'foo'");
}
END_TEST

START_TEST(test_ctrl_c_is_130)
{
	/* Ctrl-C reaches the launcher and its agents (one process group) */
	struct proc p;
	proc_meshrun(&p, "local", "local", "--hosts", "2", "--config", TINY, "steps=1000000",
		     "openblas_threads=1", (char *)NULL);
	ck_assert_msg(proc_wait_output(&p, "completed step: 2,", 60), "no step:\n%s", slurp(p.err));
	kill(-p.pid, SIGINT);
	int rc = proc_wait(&p, 10);
	ck_assert_msg(rc == EXIT_INTERRUPTED, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_file_has(p.err, "meshrun: local: interrupted");
}
END_TEST

/* ---- TLS: its own class, naming the address and the verify error ---- */

/* An agent of 2 with its own certs_dir and a start-up deadline of
 * deadline seconds. */
static void tls_agent_for(struct proc *p, const char *name, int host, int port, const char *certs,
			  int deadline)
{
	char hid[32], certs_kv[300], coord_kv[64], t_kv[64];
	snprintf(t_kv, sizeof(t_kv), "connect_timeout_s=%d", deadline);
	snprintf(hid, sizeof(hid), "--host-id=%d", host);
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s", certs);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	proc_meshrun(p, name, "agent", hid, "--hosts=2", "--listen=127.0.0.1:0", "--job=pingpong",
		     "--rounds=3", certs_kv, coord_kv, t_kv, (char *)NULL);
}

static void tls_agent(struct proc *p, const char *name, int host, int port, const char *certs)
{
	tls_agent_for(p, name, host, port, certs, 3);
}

START_TEST(test_tls_wrong_ca)
{
	/* host 1's certificates are another cluster's: it cannot verify the
	 * coordinator (exit 7, naming the address and the verify error), and
	 * the coordinator names host 1 missing and why */
	char other[300], mine[300], want[256];
	struct proc h0, h1;
	snprintf(mine, sizeof(mine), "%s/certs", tmpdir);
	snprintf(other, sizeof(other), "%s/other", tmpdir);
	ck_assert_int_eq(mkdir(other, 0700), 0);
	char e[256];
	ck_assert_msg(tls_gen_certs(other, 2, e, sizeof(e)) == 0, "%s", e);
	int port = free_port();
	tls_agent(&h0, "h0", 0, port, mine);
	ck_assert(wait_listening(port, 10));
	tls_agent(&h1, "h1", 1, port, other);
	int rc = proc_wait(&h1, 15);
	ck_assert_msg(rc == EXIT_TLS, "host 1: exit %d:\n%s", rc, slurp(h1.err));
	snprintf(want, sizeof(want), "meshrun: host 1: the coordinator at 127.0.0.1:%d: tls handshake "
		 "failed: certificate verify failed: ", port);
	ck_assert_file_has(h1.err, want);
	ck_assert_file_has(h1.err, "(are certs_dir's ca.pem and host certificate this cluster's?)");
	rc = proc_wait(&h0, 15);
	ck_assert_msg(rc == EXIT_FAIL, "host 0: exit %d:\n%s", rc, slurp(h0.err));
	ck_assert_file_has(h0.err, "host 1 never said hello");
	ck_assert_file_has(h0.err, "the last refused: ");
	ck_assert_file_has(h0.err, "unknown ca");

	/* this cluster's ca.pem but another's host certificate: the
	 * coordinator refuses it only after host 1's handshake is done (TLS
	 * 1.3), and host 1 hears it on its first read: the same class */
	char mixed[300], from[400], to[400];
	snprintf(mixed, sizeof(mixed), "%s/mixed", tmpdir);
	ck_assert_int_eq(mkdir(mixed, 0700), 0);
	static const char *const files[][2] = { { "certs", "ca.pem" }, { "other", "host1.pem" },
						 { "other", "host1.key" } };
	for (int i = 0; i < 3; i++) {
		snprintf(from, sizeof(from), "%s/%s/%s", tmpdir, files[i][0], files[i][1]);
		snprintf(to, sizeof(to), "%s/%s", mixed, files[i][1]);
		ck_assert_int_eq(link(from, to), 0);
	}
	port = free_port();
	tls_agent(&h0, "h0b", 0, port, mine);
	ck_assert(wait_listening(port, 10));
	tls_agent(&h1, "h1b", 1, port, mixed);
	rc = proc_wait(&h1, 15);
	ck_assert_msg(rc == EXIT_TLS, "host 1: exit %d:\n%s", rc, slurp(h1.err));
	snprintf(want, sizeof(want), "meshrun: host 1: the coordinator at 127.0.0.1:%d: tls ", port);
	ck_assert_file_has(h1.err, want);
	ck_assert_msg(!file_has(h1.err, "lost"), "%s", slurp(h1.err));
	proc_wait(&h0, 15);
}
END_TEST

/* A foreign listener: answers every connection with an HTTP error. */
static void *http_listener(void *arg)
{
	int lfd = *(int *)arg;
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			return NULL;
		static const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
		ssize_t w = write(fd, reply, sizeof(reply) - 1);
		(void)w;
		usleep(100000);
		close(fd);
	}
}

START_TEST(test_tls_foreign_listener)
{
	char want[256], e[128];
	struct proc h1;
	int lfd, port;
	ck_assert_int_eq(conn_listen("127.0.0.1:0", &lfd, e, sizeof(e)), 0);
	char addr[64], h[64];
	conn_sockname(lfd, true, addr, sizeof(addr));
	ck_assert_int_eq(conn_split_addr(addr, h, sizeof(h), &port), 0);
	int flags = fcntl(lfd, F_GETFL);
	fcntl(lfd, F_SETFL, flags & ~O_NONBLOCK);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, http_listener, &lfd), 0);
	snprintf(e, sizeof(e), "%s/certs", tmpdir);
	tls_agent(&h1, "h1", 1, port, e);
	int rc = proc_wait(&h1, 15);
	ck_assert_msg(rc == EXIT_TLS, "exit %d:\n%s", rc, slurp(h1.err));
	snprintf(want, sizeof(want), "meshrun: host 1: the coordinator at 127.0.0.1:%d: tls handshake "
		 "failed: ", port);
	ck_assert_file_has(h1.err, want);
	ck_assert_file_has(h1.err, "(is a meshrun coordinator listening there?)");
	ck_assert_msg(!file_has(h1.err, "lost"), "%s", slurp(h1.err));
}
END_TEST

/* ---- refused connections: a few lines, with a count ---- */

START_TEST(test_refused_rate_limited)
{
	/* 200 garbage connections to a coordinator waiting for its peer (and
	 * wait_listening's, the first) */
	struct proc h0;
	int port = free_port();
	char certs[300];
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	/* time enough for all 200 to be turned away before the deadline */
	tls_agent_for(&h0, "h0", 0, port, certs, 6);
	ck_assert(wait_listening(port, 10));
	for (int i = 0; i < 200; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(0x7f000001) };
		ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		ssize_t w = write(fd, "GET / HTTP/1.0\r\n\r\n", 18);
		(void)w;
		close(fd);
	}
	int rc = proc_wait(&h0, 20);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(h0.err));
	char *err = slurp(h0.err);
	/* one line for the first, one with the count of the rest */
	ck_assert_msg(lines_with(err, "refused") <= 3, "%s", err);
	ck_assert_msg(lines_with(err, "refused connection from 127.0.0.1:") == 1, "%s", err);
	ck_assert_msg(strstr(err, "more connections from 127.0.0.1 in the last"), "%s", err);
	int more = 0;
	const char *m = strstr(err, "refused ");
	while (m && sscanf(m, "refused %d more connections", &more) != 1)
		m = strstr(m + 1, "refused ");
	ck_assert_int_eq(more, 200);
}
END_TEST

/* ---- the local launcher's keys ---- */

static int entries(const char *dir, bool *ca_key)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		n++;
		char sub[600];
		snprintf(sub, sizeof(sub), "%s/%s/ca.key", dir, e->d_name);
		*ca_key |= access(sub, F_OK) == 0;
	}
	if (d)
		closedir(d);
	return n;
}

START_TEST(test_local_keys_leave_the_disk)
{
	char tmp[300];
	bool ca_key = false;
	struct proc p;
	snprintf(tmp, sizeof(tmp), "%s/t", tmpdir);
	ck_assert_int_eq(mkdir(tmp, 0700), 0);
	setenv("TMPDIR", tmp, 1);
	proc_meshrun(&p, "local", "local", "--hosts", "2", "--config", TINY, "steps=1000000",
		     "openblas_threads=1", (char *)NULL);
	ck_assert_msg(proc_wait_output(&p, "completed step: 1,", 60), "no step:\n%s", slurp(p.err));
	/* running, and nothing on disk: every agent has read its files */
	ck_assert_int_eq(entries(tmp, &ca_key), 0);
	/* a SIGKILLed launcher leaves nothing either (its agents die with it) */
	kill(p.pid, SIGKILL);
	proc_wait(&p, 10);
	ck_assert_int_eq(entries(tmp, &ca_key), 0);
	/* killed at once, before the agents read them: the certificates may
	 * stay, never the CA's key */
	for (int i = 0; i < 5; i++) {
		proc_meshrun(&p, "early", "local", "--hosts", "2", "--config", TINY, "steps=10",
			     (char *)NULL);
		usleep(20000 * (unsigned)i);
		kill(p.pid, SIGKILL);
		proc_wait(&p, 10);
	}
	entries(tmp, &ca_key);
	ck_assert_msg(!ca_key, "a CA key was written");
	unsetenv("TMPDIR");
}
END_TEST

/* The step log's header says what protects the links: the suite, whose
 * records, and who seals them, as the keys chose; a job of one host has
 * no links and no such line. */
START_TEST(test_links_line)
{
	static const struct {
		const char *keys, *want;
	} runs[] = {
#ifdef MESHRUN_IPSEC_MB
		{ "", "links: TLSv1.3 TLS_AES_128_GCM_SHA256, meshrun's records, AES-GCM by ipsec-mb (" },
#else
		{ "", "links: TLSv1.3 TLS_AES_128_GCM_SHA256, meshrun's records, AES-GCM by openssl\n" },
#endif
		{ "tls_cipher_impl=openssl", "links: TLSv1.3 TLS_AES_128_GCM_SHA256, meshrun's records, "
					     "AES-GCM by openssl\n" },
		{ "tls_records=openssl", "links: TLSv1.3 TLS_AES_128_GCM_SHA256, OpenSSL's records\n" },
		{ "-", NULL },
	};
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		char line[512];
		struct proc p;
		bool one = !strcmp(runs[i].keys, "-");
		snprintf(line, sizeof(line), "local --hosts %d --devices-per-host %d --config " TINY
			 " steps=1 max_target_length=16 %s", one ? 1 : 2, one ? 2 : 1,
			 one ? "" : runs[i].keys);
		int rc = proc_run_words(&p, "local", line, 60, false);
		char *out = slurp(p.out);
		ck_assert_msg(rc == 0, "%s: exit %d:\n%s\n%s", line, rc, out, slurp(p.err));
		if (one)
			ck_assert_msg(lines_with(out, "links: ") == 0, "%s:\n%s", line, out);
		else
			ck_assert_msg(strstr(out, runs[i].want) && lines_with(out, "links: ") == 1,
				      "%s: no '%s' in:\n%s", line, runs[i].want, out);
	}
}
END_TEST

/* ---- cpu_bind: each local agent on its own share of the CPUs ---- */

/* A Cpus_allowed_list ("0-3,6") as a set; false if it does not parse. */
static bool cpu_list(const char *s, cpu_set_t *set)
{
	CPU_ZERO(set);
	while (*s && *s != '\n') {
		char *end;
		long a = strtol(s, &end, 10), b = a;
		if (end == s)
			return false;
		if (*end == '-') {
			s = end + 1;
			b = strtol(s, &end, 10);
			if (end == s)
				return false;
		}
		for (long c = a; c <= b && c < CPU_SETSIZE; c++)
			CPU_SET((int)c, set);
		s = *end == ',' ? end + 1 : end;
	}
	return true;
}

/* The agents of local launcher `launcher` (its process group but not it):
 * each one's host id (its --host-id), CPUs (/proc/PID/status) and whether
 * its environment says MESHRUN_CPUS_SHARED=shared. Returns how many. */
static int agent_cpus(pid_t launcher, int max, cpu_set_t *cpus, bool *env_ok, int shared)
{
	int n = 0;
	DIR *d = opendir("/proc");
	ck_assert_ptr_nonnull(d);
	for (struct dirent *e; (e = readdir(d));) {
		int pid = atoi(e->d_name);
		if (pid <= 0 || pid == launcher || getpgid(pid) != launcher)
			continue;
		char path[64], buf[4096], want[48];
		snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
		int fd = open(path, O_RDONLY);
		ssize_t k = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (k <= 0)
			continue;
		buf[k] = 0;
		int id = -1;
		for (char *a = buf; a < buf + k; a += strlen(a) + 1)
			if (!strcmp(a, "--host-id") && a + strlen(a) + 1 < buf + k)
				id = atoi(a + strlen(a) + 1);
		if (id < 0 || id >= max)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/environ", pid);
		fd = open(path, O_RDONLY);
		k = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0)
			close(fd);
		snprintf(want, sizeof(want), "MESHRUN_CPUS_SHARED=%d", shared);
		env_ok[id] = false;
		for (char *a = buf; k > 0 && a < buf + k; a += strlen(a) + 1)
			env_ok[id] |= !strcmp(a, want);
		snprintf(path, sizeof(path), "/proc/%d/status", pid);
		FILE *f = fopen(path, "r");
		ck_assert_ptr_nonnull(f);
		bool got = false;
		while (fgets(buf, sizeof(buf), f))
			if (!strncmp(buf, "Cpus_allowed_list:", 18))
				got = cpu_list(buf + 18 + strspn(buf + 18, " \t"), &cpus[id]);
		fclose(f);
		ck_assert_msg(got, "no Cpus_allowed_list for pid %d", pid);
		n++;
	}
	closedir(d);
	return n;
}

/* `local --hosts hosts` with cpu_bind=bind and `devs` devices a host
 * from a launcher that may use `all`: with slots > 0, agent i on run
 * (i mod slots) of the CPUs of `all` in order cut in `slots` runs of
 * CPU_COUNT / slots (auto: slots = hosts; spread: min(hosts, CPUs));
 * with slots 0, every agent on all of them. Each agent is told the
 * launcher's count either way, so its thread rules count as floating. */
static void bind_case(int hosts, int devs, const char *bind, const cpu_set_t *all, int slots)
{
	char nh[16], key[32], name[48], dev[48];
	snprintf(nh, sizeof(nh), "%d", hosts);
	snprintf(key, sizeof(key), "cpu_bind=%s", bind);
	snprintf(dev, sizeof(dev), "ici_data_parallelism=%d", devs);
	/* a name of its own: the next run's output file is new, not this one's */
	snprintf(name, sizeof(name), "bind-%d-%d-%s", hosts, devs, bind);
	struct proc r;
	proc_meshrun(&r, name, "local", "--hosts", nh, "--config", TINY, "steps=1000000",
		     "openblas_threads=1", key, dev, (char *)NULL);
	ck_assert_msg(proc_wait_output(&r, "completed step: 1,", 60), "no step:\n%s", slurp(r.err));
	cpu_set_t cpus[4];
	bool env_ok[4] = { false };
	int found = agent_cpus(r.pid, 4, cpus, env_ok, CPU_COUNT(all));
	ck_assert_msg(found == hosts, "%d agents of %d found:\n%s", found, hosts, slurp(r.err));
	int per = slots ? CPU_COUNT(all) / slots : CPU_COUNT(all);
	for (int i = 0; i < hosts; i++) {
		ck_assert_msg(env_ok[i], "host %d: no MESHRUN_CPUS_SHARED=%d", i, CPU_COUNT(all));
		cpu_set_t want;
		CPU_ZERO(&want);
		for (int c = 0, seen = 0; slots && c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, all) && seen++ / per == i % slots)
				CPU_SET(c, &want);
		ck_assert_msg(CPU_EQUAL(&cpus[i], slots ? &want : all),
			      "%s, %d agents on %d CPUs: host %d runs on %d CPUs, not the %d %s", key, hosts,
			      CPU_COUNT(all), i, CPU_COUNT(&cpus[i]), per,
			      slots ? "of its share" : "of the launcher");
	}
	/* agents in different slots share no CPU, agents in one slot all of theirs */
	for (int i = 0; slots && i < hosts; i++)
		for (int j = i + 1; j < hosts; j++) {
			cpu_set_t both;
			CPU_AND(&both, &cpus[i], &cpus[j]);
			if (i % slots == j % slots)
				ck_assert_msg(CPU_EQUAL(&cpus[i], &cpus[j]), "%s: hosts %d and %d", key, i, j);
			else
				ck_assert_msg(CPU_COUNT(&both) == 0, "%s: hosts %d and %d share a CPU", key, i, j);
		}
	kill(-r.pid, SIGINT);
	ck_assert_int_eq(proc_wait(&r, 10), EXIT_INTERRUPTED);
}

START_TEST(test_cpu_bind)
{
	char err[256];
	static struct cfg c;
	cfg_defaults(&c);
	ck_assert_str_eq(c.cpu_bind, "auto");
	ck_assert_int_eq(cfg_override(&c, "cpu_bind=all", err, sizeof err), 0);
	ck_assert_int_ne(cfg_finish(&c, 1, 1, err, sizeof err), 0);
	ck_assert_msg(strstr(err, "'cpu_bind'") && strstr(err, "auto, none or spread"), "%s", err);
	ck_assert_int_eq(cfg_override(&c, "cpu_bind=spread", err, sizeof err), 0);
	ck_assert_int_eq(cfg_finish(&c, 1, 1, err, sizeof err), 0);

	/* the shares of a set with holes */
	cpu_set_t set, share;
	CPU_ZERO(&set);
	static const int holes[] = { 0, 2, 4, 5, 7 };
	for (int k = 0; k < 5; k++)
		CPU_SET(holes[k], &set);
	ck_assert_int_eq(local_cpu_share(&set, 2, 1, &share), 0);
	ck_assert(CPU_ISSET(4, &share) && CPU_ISSET(5, &share) && CPU_COUNT(&share) == 2);
	ck_assert_int_eq(local_cpu_share(&set, 6, 0, &share), -1);
	/* spread: 7 agents on 5 CPUs, one each, round-robin */
	ck_assert_int_eq(local_cpu_spread(&set, 7, 6, &share), 0);
	ck_assert(CPU_ISSET(2, &share) && CPU_COUNT(&share) == 1);
	ck_assert_int_eq(local_cpu_spread(&set, 2, 1, &share), 0);
	ck_assert(CPU_ISSET(4, &share) && CPU_ISSET(5, &share) && CPU_COUNT(&share) == 2);

	/* through the launcher, from the CPUs this process may use */
	cpu_set_t was, two;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(was), &was), 0);
	int n = CPU_COUNT(&was);
	bind_case(2, 1, "auto", &was, n >= 2 ? 2 : 0);
	bind_case(2, 1, "none", &was, 0);
	/* more agents than CPUs: none bound (as mpirun); at most 3 agents,
	 * from a launcher that may use at most 2 CPUs */
	CPU_ZERO(&two);
	for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < 2; cpu++)
		if (CPU_ISSET(cpu, &was)) {
			CPU_SET(cpu, &two);
			k++;
		}
	ck_assert_int_eq(sched_setaffinity(0, sizeof(two), &two), 0);
	int m = CPU_COUNT(&two);
	bind_case(m + 1, 1, "auto", &two, 0);
	/* more devices than CPUs (a device computes as a rank): none bound */
	bind_case(2, 2, "auto", &two, 0);
	/* spread: 4 agents round-robin on the (up to) 2 CPUs, one CPU each:
	 * agents 0 and 2 on one, 0 and 1 on different ones when there are 2 */
	bind_case(4, 1, "spread", &two, m);
	/* spread binds whatever the devices: 2 x 2 as 2 x 1 */
	bind_case(2, 2, "spread", &two, m < 2 ? m : 2);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(was), &was), 0);
}
END_TEST

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	Suite *s = suite_create("cli");
	struct {
		const char *name;
		const TTest *fn;
		int timeout;
	} cases[] = {
		{ "help", test_help_everywhere, 60 },
		{ "prefix", test_one_prefix, 60 },
		{ "config once", test_config_errors_once, 90 },
		{ "eval nan", test_eval_nan, 90 },
		{ "synthetic no loss", test_synthetic_no_loss, 60 },
		{ "out of memory", test_out_of_memory, 90 },
		{ "ctrl-c", test_ctrl_c_is_130, 90 },
		{ "tls wrong ca", test_tls_wrong_ca, 60 },
		{ "tls foreign listener", test_tls_foreign_listener, 60 },
		{ "refused flood", test_refused_rate_limited, 60 },
		{ "local keys", test_local_keys_leave_the_disk, 90 },
		{ "links line", test_links_line, 120 },
		{ "blas kernels", test_blas_kernels, 60 },
		{ "device nice", test_device_nice, 90 },
		{ "cpu bind", test_cpu_bind, 90 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		tcase_set_timeout(tc, cases[i].timeout);
		tcase_add_test(tc, cases[i].fn);
		suite_add_tcase(s, tc);
	}
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
