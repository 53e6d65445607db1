/* Token shards through real runs (build/meshrun; docs/data.md): a 3-shard
 * llm.c corpus of uneven shards (written by `meshrun data pack`) trains
 * on 1 device, 2 hosts x 1 device and 1 host x 2 devices with the same
 * global batch, and every step reads the same rows in all three
 * (MESHRUN_TEST_DATA_TRACE); --resume in the middle of an epoch and at
 * a step whose batch crosses into the next epoch, and --max-restarts
 * with a host killed twice (restarting from both kinds of checkpoint),
 * give every step's loss bit for bit; each bad input of docs/data.md's
 * checks ends `train` with exit 4 and one line naming the file; a corpus
 * 4x larger than the address space the run may use (RLIMIT_AS, which a
 * mapped or loaded corpus could not fit) trains, with flat resident
 * memory; eval_loss appears every eval_interval steps and equals
 * `meshrun eval` of the checkpoint on the same data (one device: the
 * same bits; 2 hosts and a 2-stage pipeline: within 1e-5); documents
 * masked over 2 hosts give one device's losses; a vocabulary of 129,280
 * trains from uint32 shards. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "tests/proc.h"

#define MAX_STEPS 64
#define GPL3 "/usr/share/common-licenses/GPL-3"
#define GPL2 "/usr/share/common-licenses/GPL-2"
/* llama-tiny with rows of 17 tokens, a global batch of 8 */
#define TINY "--config configs/llama-tiny.yml max_target_length=16 openblas_threads=1"

static char corpus[300];   /* tmpdir/s3/ *.bin: 37 + 93 + 56 = 186 rows of 17 */

static void setup(void)
{
	proc_setup("check_data_train", 0);
}

/* proc_run of a printf-formatted command line; the exit code. */
__attribute__((format(printf, 3, 4)))
static int run(struct proc *p, const char *name, const char *fmt, ...)
{
	char line[3000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	return proc_run_words(p, name, line, 180, false);
}

#define run_ok(p, name, ...) do { \
	int rc_ = run(p, name, __VA_ARGS__); \
	ck_assert_msg(rc_ == 0, "%s: exit %d\n%s\n%s", name, rc_, slurp((p)->out), slurp((p)->err)); \
} while (0)

static const char *path(const char *name)
{
	static char p[4][400];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof(p[k]), "%s/%s", tmpdir, name);
	return p[k];
}

/* bytes [off, off + len) of src into dst */
static void cut(const char *src, long off, long len, const char *dst)
{
	FILE *f = fopen(src, "rb"), *g = fopen(dst, "wb");
	ck_assert(f && g);
	char *b = malloc((size_t)len);
	fseek(f, off, SEEK_SET);
	ck_assert_int_eq(fread(b, 1, (size_t)len, f), (size_t)len);
	ck_assert_int_eq(fwrite(b, 1, (size_t)len, g), (size_t)len);
	fclose(f);
	ck_assert_int_eq(fclose(g), 0);
	free(b);
}

/* Three shards of 600, 1500 and 900 byte tokens: a_, b_, c_000000.bin. */
static void make_corpus(void)
{
	struct proc p;
	const char *names[3] = { "a", "b", "c" };
	const long off[3] = { 0, 5000, 9000 }, len[3] = { 600, 1500, 900 };
	for (int i = 0; i < 3; i++) {
		char txt[32];
		snprintf(txt, sizeof(txt), "%s.txt", names[i]);
		cut(GPL3, off[i], len[i], path(txt));
		run_ok(&p, "pack", "data pack --format llmc --name %s %s -o %s", names[i], path(txt),
		       path("s3"));
	}
	snprintf(corpus, sizeof(corpus), "%s/s3/*.bin", tmpdir);
}

/* ---- metrics ---- */

struct step_line {
	bool seen;
	double loss, eval_loss, rss_mb;
	bool has_eval;
	int epoch;
};

static double hex_field(const char *line, const char *key)
{
	char k[64];
	snprintf(k, sizeof(k), "\"%s\":\"", key);
	const char *p = strstr(line, k);
	return p ? strtod(p + strlen(k), NULL) : NAN;
}

static double num_field(const char *line, const char *key)
{
	char k[64];
	snprintf(k, sizeof(k), "\"%s\":", key);
	const char *p = strstr(line, k);
	return p ? strtod(p + strlen(k), NULL) : NAN;
}

/* The metrics file's steps (the last line of a step wins); 1 + the
 * highest step. */
static int read_metrics(const char *file, struct step_line out[MAX_STEPS])
{
	char line[4096];
	FILE *f = fopen(path(file), "r");
	int n = 0;
	memset(out, 0, sizeof(struct step_line) * MAX_STEPS);
	while (f && fgets(line, sizeof(line), f)) {
		if (!strstr(line, "\"loss_hex\""))
			continue;   /* a line cut by a kill */
		int s = (int)num_field(line, "step");
		ck_assert(s >= 0 && s < MAX_STEPS);
		out[s] = (struct step_line){ .seen = true, .loss = hex_field(line, "loss_hex"),
					     .eval_loss = hex_field(line, "eval_loss_hex"),
					     .rss_mb = num_field(line, "rss_mb"),
					     .epoch = (int)num_field(line, "data_epoch") };
		out[s].has_eval = !isnan(out[s].eval_loss);
		n = s + 1 > n ? s + 1 : n;
	}
	if (f)
		fclose(f);
	return n;
}

static void assert_same_losses(const char *file, const char *want_file, int steps)
{
	struct step_line a[MAX_STEPS], b[MAX_STEPS];
	ck_assert_int_eq(read_metrics(file, a), steps);
	ck_assert_int_eq(read_metrics(want_file, b), steps);
	for (int s = 0; s < steps; s++)
		ck_assert_msg(a[s].seen && a[s].loss == b[s].loss, "%s step %d: %a, uninterrupted %a",
			      file, s, a[s].loss, b[s].loss);
}

static void assert_close_losses(const char *file, const char *want_file, int steps, double tol)
{
	struct step_line a[MAX_STEPS], b[MAX_STEPS];
	ck_assert_int_eq(read_metrics(file, a), steps);
	ck_assert_int_eq(read_metrics(want_file, b), steps);
	for (int s = 0; s < steps; s++)
		ck_assert_msg(fabs(a[s].loss - b[s].loss) <= tol * b[s].loss, "%s step %d: %.9g vs %.9g",
			      file, s, a[s].loss, b[s].loss);
}

/* ---- the rows of each step ---- */

static int line_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The trace's lines ("step S sample G row R"), sorted, as one string. */
static char *sorted_trace(const char *file)
{
	char *text = strdup(slurp(path(file))), *lines[4096], *out;
	int n = 0;
	for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
		ck_assert_int_lt(n, 4096);
		lines[n++] = l;
	}
	qsort(lines, (size_t)n, sizeof(char *), line_cmp);
	out = calloc((size_t)n + 1, 48);
	for (int i = 0; i < n; i++) {
		strcat(out, lines[i]);
		strcat(out, "\n");
	}
	free(text);
	return out;
}

START_TEST(test_mesh_shapes_read_the_same_rows)
{
	struct proc p;
	make_corpus();
	/* 30 steps of 8 rows: the first epoch (186 rows) and most of a second */
	setenv("MESHRUN_TEST_DATA_TRACE", path("one.trace"), 1);
	run_ok(&p, "one", "train " TINY " per_device_batch_size=8 steps=30 dataset_type=llmc "
	       "dataset_path=%s --metrics %s", corpus, path("one.jsonl"));
	setenv("MESHRUN_TEST_DATA_TRACE", path("hosts.trace"), 1);
	run_ok(&p, "hosts", "local --hosts 2 " TINY " per_device_batch_size=4 steps=30 dataset_type=llmc "
	       "dataset_path=%s --metrics %s", corpus, path("hosts.jsonl"));
	setenv("MESHRUN_TEST_DATA_TRACE", path("devs.trace"), 1);
	run_ok(&p, "devs", "local --hosts 1 --devices-per-host 2 " TINY " per_device_batch_size=4 "
	       "steps=30 dataset_type=llmc dataset_path=%s --metrics %s", corpus, path("devs.jsonl"));
	unsetenv("MESHRUN_TEST_DATA_TRACE");
	char *one = sorted_trace("one.trace"), *hosts = sorted_trace("hosts.trace"),
	     *devs = sorted_trace("devs.trace");
	int lines = 0;
	for (char *c = one; *c; c++)
		lines += *c == '\n';
	ck_assert_int_eq(lines, 30 * 8);
	ck_assert_msg(!strcmp(one, hosts), "2 hosts x 1 device read other rows");
	ck_assert_msg(!strcmp(one, devs), "1 host x 2 devices read other rows");
	/* the epoch boundary was crossed and logged */
	ck_assert_file_has(path("one.out"), "data: epoch 1 begins at step 23, row 2 of its global batch "
			   "(shuffle seed 1)");
	ck_assert_file_has(path("hosts.out"), "data: epoch 1 begins at step 23");
	struct step_line m[MAX_STEPS];
	ck_assert_int_eq(read_metrics("one.jsonl", m), 30);
	ck_assert_int_eq(m[22].epoch, 0);
	ck_assert_int_eq(m[24].epoch, 1);
	assert_close_losses("hosts.jsonl", "one.jsonl", 30, 1e-5);
	assert_close_losses("devs.jsonl", "one.jsonl", 30, 1e-5);
	free(one);
	free(hosts);
	free(devs);
}
END_TEST

/* ---- resume and restarts ---- */

#define RUN2 "local --hosts 2 " TINY " per_device_batch_size=4 dataset_type=llmc " \
	"learning_rate_schedule_steps=44 eval_split_fraction=0.03 eval_interval=8"

START_TEST(test_resume)
{
	struct proc p;
	make_corpus();
	run_ok(&p, "straight", RUN2 " steps=44 dataset_path=%s --metrics %s", corpus,
	       path("straight.jsonl"));
	/* 180 rows per epoch (6 held out): step 11 is mid-epoch; step 22's
	 * batch (rows 176..183) crosses into epoch 1 */
	const int stops[2] = { 11, 22 };
	for (int k = 0; k < 2; k++) {
		char m[32], ck[32];
		snprintf(m, sizeof(m), "r%d.jsonl", k);
		snprintf(ck, sizeof(ck), "ck%d", k);
		run_ok(&p, "first", RUN2 " steps=%d dataset_path=%s --metrics %s --checkpoint-dir %s",
		       stops[k], corpus, path(m), path(ck));
		run_ok(&p, "resumed", RUN2 " steps=44 dataset_path=%s --metrics %s --checkpoint-dir %s "
		       "--resume", corpus, path(m), path(ck));
		assert_same_losses(m, "straight.jsonl", 44);
		struct step_line a[MAX_STEPS], b[MAX_STEPS];
		read_metrics(m, a);
		read_metrics("straight.jsonl", b);
		for (int s = 7; s < 44; s += 8)
			ck_assert_msg(a[s].has_eval && a[s].eval_loss == b[s].eval_loss, "eval at %d", s);
	}
	ck_assert_file_has(p.out, "step 22 begins at epoch 0, row 176 of it (shuffle seed 0");

	/* resumed with another global batch: the checkpoint's data position
	 * (88 rows read), not step x batch, says where to go on */
	run_ok(&p, "b8", "train " TINY " per_device_batch_size=8 steps=11 dataset_type=llmc "
	       "dataset_path=%s --checkpoint-dir %s", corpus, path("ckb"));
	setenv("MESHRUN_TEST_DATA_TRACE", path("b4.trace"), 1);
	run_ok(&p, "b4", "train " TINY " per_device_batch_size=4 steps=12 dataset_type=llmc "
	       "dataset_path=%s --checkpoint-dir %s --resume", corpus, path("ckb"));
	unsetenv("MESHRUN_TEST_DATA_TRACE");
	ck_assert_file_has(p.out, "step 11 begins at epoch 0, row 88 of it");
	char *t = sorted_trace("b4.trace");
	ck_assert_msg(strstr(t, "step 11 sample 88 ") && strstr(t, "step 11 sample 91 ") &&
		      !strstr(t, "sample 44 "), "%s", t);
	free(t);
}
END_TEST

/* The agent of host 1 among the launcher's children; -1 if none (yet). */
static pid_t host1_agent(pid_t launcher)
{
	char f[64], buf[4096];
	snprintf(f, sizeof(f), "/proc/%d/task/%d/children", launcher, launcher);
	char *kids = strdup(slurp(f));
	pid_t found = -1;
	for (char *t = strtok(kids, " \n"); t && found < 0; t = strtok(NULL, " \n")) {
		snprintf(f, sizeof(f), "/proc/%s/cmdline", t);
		FILE *c = fopen(f, "r");
		size_t n = c ? fread(buf, 1, sizeof(buf) - 1, c) : 0;
		if (c)
			fclose(c);
		for (size_t i = 0; i + 1 < n; i += strlen(buf + i) + 1)
			if (!strcmp(buf + i, "--host-id") && !strcmp(buf + i + strlen(buf + i) + 1, "1"))
				found = atoi(t);
	}
	free(kids);
	return found;
}

/* Waits until the metrics file has a line for `step`, then kills host 1. */
static void kill_host1_after(struct proc *p, const char *file, int step)
{
	char want[32];
	snprintf(want, sizeof(want), "\"step\":%d,", step);
	double end = now_s() + 120;
	while (!file_has(path(file), want)) {
		ck_assert_msg(proc_wait(p, 0) == -1, "local ended early (%d):\n%s", p->status,
			      slurp(p->err));
		ck_assert_msg(now_s() < end, "no step %d:\n%s", step, slurp(p->err));
		usleep(5000);
	}
	pid_t h1 = host1_agent(p->pid);
	ck_assert_int_gt(h1, 0);
	kill(h1, SIGKILL);
}

START_TEST(test_max_restarts)
{
	struct proc p;
	struct proc_args pa;
	make_corpus();
	run_ok(&p, "straight", RUN2 " steps=44 dataset_path=%s --metrics %s", corpus,
	       path("straight.jsonl"));
	/* checkpoints at 11, 22, 33; killed after 13 (restart from 11, mid
	 * epoch) and after 24 (restart from 22, whose batch crosses into
	 * epoch 1); steps slowed by a delay so the kills land before the next
	 * checkpoint */
	proc_args_meshrun(&pa);
	const char *words[] = { "local", "--hosts", "2", "--config", "configs/llama-tiny.yml",
				"max_target_length=16", "openblas_threads=1", "per_device_batch_size=4",
				"dataset_type=llmc", "learning_rate_schedule_steps=44",
				"eval_split_fraction=0.03", "eval_interval=8", "steps=44",
				"checkpoint_period=11", "--max-restarts", "2", "--fault",
				"delay:link=0-1:ms=15", NULL };
	for (int i = 0; words[i]; i++)
		proc_arg(&pa, "%s", words[i]);
	proc_arg(&pa, "dataset_path=%s", corpus);
	proc_arg(&pa, "--metrics");
	proc_arg(&pa, "%s", path("r.jsonl"));
	proc_arg(&pa, "--checkpoint-dir");
	proc_arg(&pa, "%s", path("ck"));
	proc_start_args(&p, "restarts", &pa);
	kill_host1_after(&p, "r.jsonl", 13);
	kill_host1_after(&p, "r.jsonl", 24);
	ck_assert_msg(proc_wait(&p, 180) == 0, "%s", slurp(p.err));
	ck_assert_file_has(p.err, "restart 1 of 2 from checkpoint step 11");
	ck_assert_file_has(p.err, "restart 2 of 2 from checkpoint step 22");
	assert_same_losses("r.jsonl", "straight.jsonl", 44);
}
END_TEST

/* ---- bad inputs ---- */

static void patch(const char *file, long off, const void *bytes, size_t n)
{
	FILE *f = fopen(file, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, off, SEEK_SET);
	ck_assert_int_eq(fwrite(bytes, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* `train` on the dataset: exit 4, one line on stderr naming file and
 * saying want, no step run. */
static void expect_bad(const char *dataset, const char *file, const char *want)
{
	struct proc p;
	int rc = run(&p, "bad", "train " TINY " per_device_batch_size=8 steps=2 %s", dataset);
	char *e = slurp(p.err);
	int lines = 0;
	for (char *c = e; *c; c++)
		lines += *c == '\n';
	ck_assert_msg(rc == 4 && lines == 1 && strstr(e, file) && strstr(e, want),
		      "%s: exit %d, want 4 and one line naming '%s' with '%s':\n%s", dataset, rc, file,
		      want, e);
	ck_assert_msg(!file_has(p.out, "completed step"), "%s", slurp(p.out));
}

START_TEST(test_bad_inputs_exit_4)
{
	struct proc p;
	char ds[700], f[400];
	cut(GPL3, 0, 3000, path("t.txt"));
	run_ok(&p, "pack", "data pack --format llmc --name g %s -o %s", path("t.txt"), path("g"));
	snprintf(f, sizeof(f), "%s/g/g_000000.bin", tmpdir);
	snprintf(ds, sizeof(ds), "dataset_type=llmc dataset_path=%s", f);
	/* a good one first: the cases below differ by one thing */
	run_ok(&p, "good", "train " TINY " per_device_batch_size=8 steps=1 %s", ds);

	patch(f, 0, "\x01", 1);
	expect_bad(ds, f, "bad magic");
	patch(f, 0, "\x88\xd8\x34\x01\x02", 5);   /* 20240520 again, version 2 */
	expect_bad(ds, f, "needs version 1, the header says 2");
	patch(f, 4, "\x01", 1);
	ck_assert_int_eq(truncate(f, 1024 + 2 * 3000 - 2), 0);
	expect_bad(ds, f, "but its header says 3000 uint16 tokens");
	ck_assert_int_eq(truncate(f, 1024 + 2 * 3000), 0);
	patch(f, 1024 + 2 * 3000 - 2, "\x20\x00", 2);
	run_ok(&p, "good again", "train " TINY " per_device_batch_size=8 steps=1 %s", ds);

	/* a token >= vocab_size: found when its row is read, at the first step */
	char v[800];
	snprintf(v, sizeof(v), "%s vocab_size=100", ds);
	expect_bad(v, f, "is not below vocab_size 100");
	snprintf(v, sizeof(v), "%s vocab_size=70000", ds);
	expect_bad(v, f, "holds uint16 tokens, too narrow for vocab_size 70000");
	snprintf(v, sizeof(v), "dataset_type=llmc dataset_path=%s/g/none*.bin", tmpdir);
	expect_bad(v, "/g/none*.bin", "matches no file");
	snprintf(v, sizeof(v), "%s per_device_batch_size=200", ds);
	expect_bad(v, f, "gives 187 rows of 17 tokens for training, fewer than one global batch of 200");

	run_ok(&p, "pack", "data pack --format megatron --name m %s -o %s", path("t.txt"), path("m"));
	snprintf(f, sizeof(f), "%s/m/m_000000.bin", tmpdir);
	ck_assert_int_eq(truncate(f, 2 * 3000 - 2), 0);
	snprintf(v, sizeof(v), "dataset_type=megatron dataset_path=%s/m/m_000000", tmpdir);
	expect_bad(v, "m_000000.idx", "past the end of");
}
END_TEST

/* ---- memory ---- */

START_TEST(test_corpus_larger_than_memory)
{
	/* the run may use 512 MiB of address space; the corpus is 2 GiB (a
	 * sparse llm.c shard: holes read as token 0) */
	const rlim_t limit = 512ull << 20;
	const int64_t tokens = (int64_t)1 << 30;
	char hdr[1024] = { 0 };
	int32_t h[3] = { 20240520, 1, (int32_t)tokens };
	memcpy(hdr, h, sizeof(h));
	FILE *f = fopen(path("big.bin"), "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite(hdr, 1, sizeof(hdr), f), sizeof(hdr));
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(truncate(path("big.bin"), 1024 + 2 * tokens), 0);
	ck_assert_int_ge((int64_t)(1024 + 2 * tokens), 4 * (int64_t)limit);

	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = limit;
	/* the limit is real: mapping the corpus does not fit in it */
	pid_t pid = fork();
	if (pid == 0) {
		setrlimit(RLIMIT_AS, &lim);
		int fd = open(path("big.bin"), O_RDONLY);
		void *m = mmap(NULL, (size_t)(1024 + 2 * tokens), PROT_READ, MAP_SHARED, fd, 0);
		_exit(m == MAP_FAILED && errno == ENOMEM ? 0 : 1);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a 2 GiB mapping fit in the limit");

	struct proc p, q;
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
	int rc = run(&p, "big", "train " TINY " per_device_batch_size=8 steps=12 dataset_type=llmc "
		     "dataset_path=%s eval_split_fraction=0.001 eval_interval=6 eval_steps=2 "
		     "--metrics %s", path("big.bin"), path("big.jsonl"));
	/* ... and it binds: a model that needs more than it fails */
	int rc2 = run(&q, "too big", "train " TINY " per_device_batch_size=8 steps=1 base_emb_dim=1024 "
		      "base_mlp_dim=4096 base_num_decoder_layers=8");
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_msg(rc2 != 0 && file_has(q.err, "out of memory"), "exit %d:\n%s", rc2, slurp(q.err));
	struct step_line m[MAX_STEPS];
	ck_assert_int_eq(read_metrics("big.jsonl", m), 12);
	ck_assert(m[5].has_eval && m[11].has_eval);
	for (int s = 0; s < 12; s++)
		ck_assert_msg(m[s].rss_mb > 0 && m[s].rss_mb < 256 && m[s].rss_mb < m[0].rss_mb + 8,
			      "step %d: rss %g MiB (step 0: %g)", s, m[s].rss_mb, m[0].rss_mb);
}
END_TEST

/* ---- evaluation ---- */

/* meshrun eval's eval_loss_hex for a checkpoint (and overrides). */
static double eval_of(const char *ckpt, const char *extra)
{
	struct proc p;
	run_ok(&p, "eval", "eval --checkpoint %s openblas_threads=1 %s", ckpt, extra);
	const char *k = strstr(slurp(p.out), "eval_loss_hex: ");
	ck_assert_msg(k, "%s", slurp(p.out));
	return strtod(k + strlen("eval_loss_hex: "), NULL);
}

START_TEST(test_eval_interval)
{
	struct proc p;
	make_corpus();
	cut(GPL2, 3000, 2000, path("held.txt"));
	run_ok(&p, "pack", "data pack --format megatron --name h %s -o %s", path("held.txt"),
	       path("held"));
	char eval[600];
	snprintf(eval, sizeof(eval), "eval_dataset_type=megatron eval_dataset_path=%s/held/h_000000 "
		 "eval_interval=5", tmpdir);
	run_ok(&p, "one", "train " TINY " per_device_batch_size=8 steps=20 dataset_type=llmc "
	       "dataset_path=%s %s --metrics %s --checkpoint-dir %s", corpus, eval, path("one.jsonl"),
	       path("ck1"));
	struct step_line m[MAX_STEPS];
	ck_assert_int_eq(read_metrics("one.jsonl", m), 20);
	for (int s = 0; s < 20; s++)
		ck_assert_msg(m[s].has_eval == ((s + 1) % 5 == 0), "step %d", s);
	ck_assert(m[4].eval_loss > m[19].eval_loss);
	/* the checkpoint after the last step: meshrun eval, the same bits */
	ck_assert_msg(eval_of(path("ck1"), "") == m[19].eval_loss, "%a vs %a", eval_of(path("ck1"), ""),
		      m[19].eval_loss);
	ck_assert_file_has(p.out, "eval_loss: ");

	/* 2 hosts, and 2 pipeline stages: each against meshrun eval */
	const char *mesh[2] = { "", "dcn_data_parallelism=1 dcn_pipeline_parallelism=2" };
	for (int k = 0; k < 2; k++) {
		char m2[32], ck[32];
		snprintf(m2, sizeof(m2), "m%d.jsonl", k);
		snprintf(ck, sizeof(ck), "ck%d", k + 2);
		run_ok(&p, "mesh", "local --hosts 2 " TINY " per_device_batch_size=4 steps=10 %s "
		       "dataset_type=llmc dataset_path=%s %s --metrics %s --checkpoint-dir %s", mesh[k],
		       corpus, eval, path(m2), path(ck));
		struct step_line mm[MAX_STEPS];
		ck_assert_int_eq(read_metrics(m2, mm), 10);
		double ev = eval_of(path(ck), "");
		ck_assert_msg(mm[9].has_eval && fabs(mm[9].eval_loss - ev) < 1e-5 * ev,
			      "%s: eval_loss %.9g, meshrun eval %.9g", mesh[k], mm[9].eval_loss, ev);
		ck_assert(!mm[8].has_eval && mm[4].has_eval);
	}
}
END_TEST

/* ---- documents, 32-bit tokens ---- */

START_TEST(test_documents_on_two_hosts)
{
	struct proc p;
	char in[3][400], ds[2000];
	const long off[3] = { 0, 7000, 20000 }, len[3] = { 700, 260, 1300 };
	for (int i = 0; i < 3; i++) {
		snprintf(in[i], sizeof(in[i]), "%s/d%d.txt", tmpdir, i);
		cut(GPL3, off[i], len[i], in[i]);
	}
	/* documents of 700, 260 and 1300 tokens, and with EOT 0 between them */
	run_ok(&p, "pack", "data pack --format megatron --name d %s %s %s -o %s", in[0], in[1], in[2],
	       path("docs"));
	run_ok(&p, "pack", "data pack --format llmc --eot 0 --name e %s %s %s -o %s", in[0], in[1], in[2],
	       path("eot"));
	for (int k = 0; k < 2; k++) {
		snprintf(ds, sizeof(ds), k ? "dataset_type=llmc dataset_path=%s/eot eot_token=0" :
		       "dataset_type=megatron dataset_path=%s/docs", tmpdir);
		/* 18 steps of 8: every one of the 141 rows once */
		run_ok(&p, "one", "train " TINY " per_device_batch_size=8 steps=18 %s "
		       "dataset_respect_documents=true --metrics %s", ds, path("one.jsonl"));
		run_ok(&p, "two", "local --hosts 2 " TINY " per_device_batch_size=4 steps=18 %s "
		       "dataset_respect_documents=true --metrics %s", ds, path("two.jsonl"));
		assert_close_losses("two.jsonl", "one.jsonl", 18, 1e-5);
		run_ok(&p, "unmasked", "train " TINY " per_device_batch_size=8 steps=18 %s --metrics %s",
		       ds, path("all.jsonl"));
		struct step_line a[MAX_STEPS], b[MAX_STEPS];
		read_metrics("one.jsonl", a);
		read_metrics("all.jsonl", b);
		int differ = 0;
		for (int s = 0; s < 18; s++)
			differ += a[s].loss != b[s].loss;
		ck_assert_msg(differ > 0, "masking documents changed no loss");
		unlink(path("one.jsonl"));
		unlink(path("two.jsonl"));
		unlink(path("all.jsonl"));
	}
}
END_TEST

START_TEST(test_vocab_129280)
{
	struct proc p;
	enum { N = 5000 };
	uint32_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = (uint32_t)((i * 7919u + (i % 3 ? 128000u : 0)) % 129280u);
	FILE *f = fopen(path("w.tok"), "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite(tok, sizeof(tok[0]), N, f), N);
	ck_assert_int_eq(fclose(f), 0);
	run_ok(&p, "pack", "data pack --format llmc --input raw --input-token-bytes 4 --name w %s -o %s",
	       path("w.tok"), path("w"));
	run_ok(&p, "wide", "train --config configs/llama-tiny.yml openblas_threads=1 vocab_size=129280 "
	       "base_emb_dim=32 base_mlp_dim=64 max_target_length=16 per_device_batch_size=2 steps=3 "
	       "dataset_type=llmc dataset_path=%s/w --metrics %s", tmpdir, path("w.jsonl"));
	struct step_line m[MAX_STEPS];
	ck_assert_int_eq(read_metrics("w.jsonl", m), 3);
	/* a uniform guess over 129,280 tokens to begin with */
	ck_assert_msg(fabs(m[0].loss - log(129280.0)) < 0.1, "loss %g", m[0].loss);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("data_train");
	struct { const char *name; const TTest *fn; int timeout; } cases[] = {
		{ "mesh rows", test_mesh_shapes_read_the_same_rows, 120 },
		{ "resume", test_resume, 240 },
		{ "max restarts", test_max_restarts, 240 },
		{ "bad inputs", test_bad_inputs_exit_4, 120 },
		{ "memory", test_corpus_larger_than_memory, 120 },
		{ "eval", test_eval_interval, 180 },
		{ "documents", test_documents_on_two_hosts, 120 },
		{ "vocab", test_vocab_129280, 60 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		tcase_set_timeout(tc, cases[i].timeout);
		tcase_add_test(tc, cases[i].fn);
		suite_add_tcase(s, tc);
	}
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
