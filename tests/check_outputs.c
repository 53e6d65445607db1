/* Nothing lost: every output a run writes (metrics, trace, checkpoints)
 * on a full disk ends the run with one line naming the file and "no space
 * left on device", leaves the last complete checkpoint intact and no
 * partial file; a checkpoint directory or a --trace / --metrics directory
 * that cannot be written is found before rendezvous, not after the run;
 * one job per checkpoint directory (a second is refused naming the
 * holder, a stale lock is taken over and logged); --resume with nothing
 * left to run or another optimizer is refused. The full and read-only
 * disks are small tmpfs mounts the test makes and removes itself. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <sys/mount.h>

#include "host/cli/cli.h"
#include "tests/proc.h"

#define TINY "configs/llama-tiny.yml"
/* a model small enough that one checkpoint fits in a few hundred KiB */
#define SMALL "base_emb_dim=32 base_mlp_dim=64 base_num_decoder_layers=1 base_num_query_heads=2 " \
	      "base_num_kv_heads=2 max_target_length=16 per_device_batch_size=2 openblas_threads=1"

static char mnt[8][200];
static int nmnt;

static void unmount_all(void)
{
	for (int i = 0; i < nmnt; i++)
		umount2(mnt[i], MNT_DETACH);
	nmnt = 0;
}

/* The mount goes, then the test's directory (proc.h's own watcher may
 * have run first and found the mount point busy). */
static int unmount_lazy(const char *dir)
{
	int rc = umount2(dir, MNT_DETACH);
	rm_rf(tmpdir);
	return rc;
}

/* A tmpfs of size bytes at tmpdir/name (read-only: ro), removed when the
 * test ends. Fills path with its path. */
static void mount_tmpfs(const char *name, long size, bool ro, char *path, size_t len)
{
	char opts[64];
	snprintf(path, len, "%s/%s", tmpdir, name);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(opts, sizeof(opts), "size=%ld", size);
	ck_assert_msg(mount("tmpfs", path, "tmpfs", ro ? MS_RDONLY : 0, opts) == 0,
		      "mount tmpfs on %s: %s", path, strerror(errno));
	ck_assert_int_lt(nmnt, 8);
	snprintf(mnt[nmnt++], sizeof(mnt[0]), "%s", path);
	/* when the test process ends however it ends, the mount goes (a lazy
	 * unmount: proc.h's watcher may remove the directory first) */
	proc_at_death(unmount_lazy, path);
}

static void setup(void)
{
	proc_setup("check_outputs", 0);
}

static void teardown_outputs(void)
{
	kill_all();
	unmount_all();
	cleanup_all();
}

/* Every line of path ends in a newline and is a JSON object with a step;
 * returns how many there are. */
static int complete_lines(const char *path)
{
	char *text = slurp(path);
	size_t len = strlen(text);
	ck_assert_msg(len == 0 || text[len - 1] == '\n', "%s ends in a cut line:\n%s", path, text);
	int n = 0;
	for (char *l = text; *l; n++) {
		char *nl = strchr(l, '\n');
		ck_assert_msg(!strncmp(l, "{\"step\":", 8) && nl[-1] == '}', "line %d of %s: %.80s",
			      n + 1, path, l);
		l = nl + 1;
	}
	return n;
}

/* Whether dir (or anything one level down) holds a name ending in .tmp. */
static bool has_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool found = false;
	while (d && (e = readdir(d)) && !found) {
		size_t n = strlen(e->d_name);
		if (e->d_name[0] == '.')
			continue;
		found = n > 4 && !strcmp(e->d_name + n - 4, ".tmp");
		if (!found && e->d_type == DT_DIR) {
			char sub[600];
			snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
			found = has_tmp(sub);
		}
	}
	if (d)
		closedir(d);
	return found;
}

/* ---- a full disk ---- */

START_TEST(test_metrics_full_disk)
{
	/* the case: an 8 KiB tmpfs holds about 18 metrics lines */
	char full[200], line[1024];
	struct proc p;
	mount_tmpfs("full", 8192, false, full, sizeof(full));
	snprintf(line, sizeof(line), "train --config " TINY " steps=60 openblas_threads=1 --quiet "
		 "--metrics %s/m.jsonl", full);
	int rc = proc_run_words(&p, "train", line, 120, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(p.err));
	char want[300];
	snprintf(want, sizeof(want), "metrics: unable to write '%s/m.jsonl': no space left on device", full);
	ck_assert_file_has(p.err, want);
	/* one line, and the file keeps only complete lines */
	char *err = slurp(p.err);
	ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "more than one line:\n%s", err);
	char m[300];
	snprintf(m, sizeof(m), "%s/m.jsonl", full);
	int n = complete_lines(m);
	ck_assert_int_gt(n, 5);
	ck_assert_int_lt(n, 60);
}
END_TEST

START_TEST(test_trace_full_disk)
{
	char full[200], line[1024], want[300], path[300];
	struct proc p;
	mount_tmpfs("full", 8192, false, full, sizeof(full));
	snprintf(line, sizeof(line), "local --hosts 2 --devices-per-host 2 --config " TINY
		 " per_device_batch_size=2 steps=12 openblas_threads=1 --quiet --trace %s/t.json", full);
	int rc = proc_run_words(&p, "local", line, 120, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(p.err));
	snprintf(want, sizeof(want), "trace: unable to write '%s/t.json': no space left on device", full);
	ck_assert_file_has(p.err, want);
	snprintf(path, sizeof(path), "%s/t.json", full);
	ck_assert_msg(access(path, F_OK) != 0, "a partial trace was left");
	ck_assert_msg(!has_tmp(full), "a temporary file was left");
}
END_TEST

START_TEST(test_checkpoint_full_disk)
{
	/* one checkpoint of the small model fits, two do not: the second
	 * (written before the first is removed) fails */
	char full[200], line[1024], want[300], path[400];
	struct proc p;
	mount_tmpfs("full", 480 * 1024, false, full, sizeof(full));
	snprintf(line, sizeof(line), "train --config " TINY " " SMALL " steps=8 checkpoint_period=2 "
		 "--quiet --checkpoint-dir %s/ck", full);
	int rc = proc_run_words(&p, "train", line, 120, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(p.err));
	snprintf(want, sizeof(want), "unable to write '%s/ck/step-000004.tmp/", full);
	ck_assert_file_has(p.err, want);
	ck_assert_file_has(p.err, "no space left on device");
	ck_assert_msg(!file_has(p.err, "65536 tensors"), "%s", slurp(p.err));
	/* the last complete checkpoint is intact, nothing partial is left */
	snprintf(path, sizeof(path), "%s/ck", full);
	ck_assert_msg(!has_tmp(path), "a partial checkpoint was left");
	const char *files[] = { "model.safetensors", "optimizer.safetensors", "config.json",
				"meshrun.yml" };
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s/ck/step-000002/%s", full, files[i]);
		ck_assert_msg(access(path, F_OK) == 0, "%s is missing", path);
	}
	/* and it loads: eval reads the newest complete checkpoint */
	snprintf(line, sizeof(line), "eval --checkpoint %s/ck --text /usr/share/common-licenses/GPL-3 "
		 "max_target_length=16", full);
	rc = proc_run_words(&p, "eval", line, 60, false);
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_file_has(p.out, "eval_loss: ");
}
END_TEST

/* ---- preflight: found before rendezvous, not after the run ---- */

/* Runs line, which must fail fast with code and a line holding want, and
 * no training step. */
static void fails_at_start(const char *name, const char *line, int code, const char *want)
{
	struct proc p;
	double t0 = now_s();
	int rc = proc_run_words(&p, name, line, 60, false);
	ck_assert_msg(rc == code, "%s: exit %d, want %d:\n%s", name, rc, code, slurp(p.err));
	ck_assert_file_has(p.err, want);
	ck_assert_msg(!file_has(p.out, "completed step") && !file_has(p.out, "finished"),
		      "%s trained before failing:\n%s", name, slurp(p.out));
	ck_assert_double_lt(now_s() - t0, 20);
}

START_TEST(test_preflight_checkpoint_dir)
{
	char ro[200], line[1024], want[300];
	mount_tmpfs("ro", 65536, true, ro, sizeof(ro));
	snprintf(want, sizeof(want), "checkpoint: unable to create directory '%s/ck': read-only file system", ro);
	snprintf(line, sizeof(line), "train --config " TINY " steps=100 --quiet --checkpoint-dir %s/ck", ro);
	fails_at_start("train", line, EXIT_FAIL, want);
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " steps=100 per_device_batch_size=4 "
		 "--quiet --checkpoint-dir %s/ck", ro);
	fails_at_start("local", line, EXIT_FAIL, want);
}
END_TEST

START_TEST(test_preflight_trace_and_metrics_dirs)
{
	char ro[200], line[1024], want[300];
	mount_tmpfs("ro", 65536, true, ro, sizeof(ro));
	/* a --trace or --metrics in a missing directory, on one host and on several */
	snprintf(want, sizeof(want), "metrics: directory '%s/nodir' cannot take a new file: no such file or directory",
		 tmpdir);
	snprintf(line, sizeof(line), "train --config " TINY " steps=100 --quiet --metrics %s/nodir/m.jsonl", tmpdir);
	fails_at_start("train", line, EXIT_FAIL, want);
	snprintf(want, sizeof(want), "trace: directory '%s/nodir' cannot take a new file: no such file or directory",
		 tmpdir);
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " steps=100 per_device_batch_size=4 "
		 "--quiet --trace %s/nodir/t.json", tmpdir);
	fails_at_start("local", line, EXIT_FAIL, want);
	/* --metrics on a read-only file system */
	snprintf(want, sizeof(want), "metrics: directory '%s' cannot take a new file: read-only file system", ro);
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " steps=100 per_device_batch_size=4 "
		 "--quiet --metrics %s/m.jsonl", ro);
	fails_at_start("local", line, EXIT_FAIL, want);
}
END_TEST

/* ---- one job per checkpoint directory ---- */

START_TEST(test_two_jobs_one_checkpoint_dir)
{
	char line[1024], want[300];
	struct proc a, b;
	/* job A trains on and on */
	struct proc_args pa;
	proc_args_meshrun(&pa);
	proc_arg(&pa, "train");
	proc_arg(&pa, "--config=" TINY);
	proc_arg(&pa, "steps=1000000");
	proc_arg(&pa, "checkpoint_period=100000");
	proc_arg(&pa, "openblas_threads=1");
	proc_arg(&pa, "--checkpoint-dir=%s/ck", tmpdir);
	proc_start_args(&a, "a", &pa);
	ck_assert_msg(proc_wait_output(&a, "completed step: 2,", 60), "job A did not train:\n%s",
		      slurp(a.err));
	/* job B is refused, naming A */
	snprintf(want, sizeof(want), "pid %d)", (int)a.pid);
	snprintf(line, sizeof(line), "train --config " TINY " steps=4 --checkpoint-dir %s/ck", tmpdir);
	int rc = proc_run_words(&b, "b", line, 30, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(b.err));
	ck_assert_file_has(b.err, "checkpoint: directory '");
	ck_assert_file_has(b.err, "is in use by job train-");
	ck_assert_file_has(b.err, want);
	/* so is a job of several hosts */
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " steps=4 per_device_batch_size=4 "
		 "--checkpoint-dir %s/ck", tmpdir);
	rc = proc_run_words(&b, "b2", line, 30, false);
	ck_assert_msg(rc == EXIT_FAIL, "exit %d:\n%s", rc, slurp(b.err));
	ck_assert_file_has(b.err, want);
	ck_assert_msg(proc_wait(&a, 0) == -1, "job A stopped:\n%s", slurp(a.err));
	/* A is killed: its lock is stale, the next job takes it over and says so */
	proc_kill(&a);
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " steps=2 per_device_batch_size=4 "
		 "--quiet --checkpoint-dir %s/ck", tmpdir);
	rc = proc_run_words(&b, "c", line, 60, false);
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, slurp(b.err));
	ck_assert_file_has(b.err, "took over the lock of job train-");
	ck_assert_file_has(b.err, want);
	/* a clean end leaves no holder: the next job says nothing */
	rc = proc_run_words(&b, "d", line, 60, false);
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, slurp(b.err));
	ck_assert_msg(!file_has(b.err, "took over"), "%s", slurp(b.err));
}
END_TEST

/* ---- --resume that cannot continue ---- */

START_TEST(test_resume_refusals)
{
	char line[1024];
	struct proc p;
	snprintf(line, sizeof(line), "train --config " TINY " " SMALL " steps=4 --quiet --checkpoint-dir %s/ck",
		 tmpdir);
	ck_assert_int_eq(proc_run_words(&p, "first", line, 60, false), 0);
	/* steps at or below the checkpoint's step: nothing to run */
	const char *steps[] = { "4", "3" };
	for (int i = 0; i < 2; i++) {
		snprintf(line, sizeof(line), "train --config " TINY " " SMALL " steps=%s --resume "
			 "--checkpoint-dir %s/ck", steps[i], tmpdir);
		int rc = proc_run_words(&p, "again", line, 60, false);
		ck_assert_msg(rc == EXIT_CONFIG, "steps=%s: exit %d:\n%s", steps[i], rc, slurp(p.err));
		ck_assert_file_has(p.err, "--resume: the checkpoint '");
		ck_assert_file_has(p.err, "step-000004' is at step 4, and steps=");
		ck_assert_msg(!file_has(p.out, "completed step"), "%s", slurp(p.out));
	}
	/* another optimizer */
	snprintf(line, sizeof(line), "local --hosts 2 --config " TINY " " SMALL " steps=6 opt_type=muon "
		 "--resume --checkpoint-dir %s/ck", tmpdir);
	int rc = proc_run_words(&p, "muon", line, 60, false);
	ck_assert_msg(rc == EXIT_CONFIG, "exit %d:\n%s", rc, slurp(p.err));
	ck_assert_file_has(p.err, "was trained with opt_type=adamw, this run has opt_type=muon");
	/* more steps go on */
	snprintf(line, sizeof(line), "train --config " TINY " " SMALL " steps=6 --resume --quiet "
		 "--checkpoint-dir %s/ck", tmpdir);
	rc = proc_run_words(&p, "more", line, 60, false);
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, slurp(p.err));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("outputs");
	struct {
		const char *name;
		const TTest *fn;
	} cases[] = {
		{ "full disk: metrics", test_metrics_full_disk },
		{ "full disk: trace", test_trace_full_disk },
		{ "full disk: checkpoint", test_checkpoint_full_disk },
		{ "preflight: checkpoint dir", test_preflight_checkpoint_dir },
		{ "preflight: trace, metrics", test_preflight_trace_and_metrics_dirs },
		{ "lock: two jobs, stale", test_two_jobs_one_checkpoint_dir },
		{ "resume refusals", test_resume_refusals },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown_outputs);
		tcase_set_timeout(tc, 180);
		tcase_add_test(tc, cases[i].fn);
		suite_add_tcase(s, tc);
	}
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
