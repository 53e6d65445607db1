/* Resume on another mesh (docs/checkpoints.md#resume-on-another-mesh):
 * llama-tiny and deepseek3-tiny checkpoints written at step 4 by 2 hosts
 * x 2 devices under FSDP are resumed on 1 x 4 tensor parallelism, on 4 x
 * 1 data parallelism, on a pipeline of 2 stages, under ZeRO-1 and (llama)
 * on one device and with Muon's momentum; every step's loss is within
 * 1e-4 relative of continuing on the old mesh (resuming the same
 * checkpoint there). Each host says what it read: everything on 4 x 1,
 * a part under ZeRO-1 (its data ranks' part of the optimizer state, the
 * hosts' parts adding up to the whole) and in the pipeline (its stage's
 * layers). What cannot continue (another model, optimizer or sequence
 * length; another global batch from a checkpoint without the data
 * position) is refused by `local` before any agent starts and by
 * `train`, one line naming what differs, exit 3; the data position
 * carries over when each host reads its part, at any rows per step. */
#include <check.h>
#include <errno.h>
#include <math.h>

#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/train/check.h"
#include "tests/equiv.h"

#define LLAMA "--config configs/llama-tiny.yml base_num_kv_heads=4"
#define DS3 "--config configs/deepseek3-tiny.yml"
/* 8 rows a step on 4 devices; the schedule's length fixed, so a 4-step
 * run and an 8-step run see the same learning rates */
#define COMMON "per_device_batch_size=2 learning_rate_schedule_steps=8 openblas_threads=1"
#define OLD_MESH "--hosts 2 --devices-per-host 2 ici_fsdp_parallelism=2 ici_data_parallelism=1"

static void setup(void)
{
	proc_setup("check_remesh", 0);
}

/* tmpdir/name: a checkpoint directory, copied fresh from tmpdir/from. */
static const char *copy_ckpt(const char *from, const char *name)
{
	static char d[300];
	char cmd[800];
	snprintf(d, sizeof(d), "%s/%s", tmpdir, name);
	rm_rf(d);
	snprintf(cmd, sizeof(cmd), "cp -r %s/%s %s", tmpdir, from, d);
	ck_assert_int_eq(system(cmd), 0);
	return d;
}

/* model's checkpoint at step 4, written by OLD_MESH into tmpdir/base. */
static void base_checkpoint(const char *model, const char *opt)
{
	char args[1024];
	snprintf(args, sizeof(args), "%s/base", tmpdir);
	rm_rf(args);
	snprintf(args, sizeof(args), "local %s %s " COMMON " %s steps=4 --checkpoint-dir %s/base --quiet",
		 OLD_MESH, model, opt, tmpdir);
	show_log_on_failure(run(args), 0);
}

/* Resumes a copy of the base checkpoint with `how` ("local --hosts ..."
 * or "train") and the keys `mesh` to step 8; its losses (steps 4..7)
 * into out. */
static void resume_on(const char *model, const char *opt, const char *how, const char *mesh,
		      const char *name, double out[4])
{
	char args[1200], metrics[64];
	const char *d = copy_ckpt("base", name);
	snprintf(metrics, sizeof(metrics), "%s.jsonl", name);
	snprintf(args, sizeof(args), "%s %s " COMMON " %s %s steps=8 --checkpoint-dir %s --resume --metrics %s/%s",
		 how, model, opt, mesh, d, tmpdir, metrics);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses(metrics, out, 4), 4);
}

/* What host h said it read: weights' and optimizer state's tensor bytes,
 * and the checkpoint's totals of each. */
struct reads {
	unsigned long long w, wall, o, oall;
};

static bool host_read(const char *log, int h, struct reads *r)
{
	char key[64];
	snprintf(key, sizeof(key), "meshrun: host %d: resume: read ", h);
	const char *p = strstr(log, key);
	if (!p || !(p = strstr(p, "(weights: headers ")))
		return false;
	unsigned long long hw, ho;
	return sscanf(p, "(weights: headers %llu, tensors %llu of the checkpoint's %llu; optimizer state: "
		      "headers %llu, tensors %llu of the checkpoint's %llu)", &hw, &r->w, &r->wall, &ho, &r->o,
		      &r->oall) == 6;
}

static void assert_close(const char *what, const double *got, const double *want)
{
	double worst = 0;
	for (int s = 0; s < 4; s++) {
		double rel = fabs(got[s] - want[s]) / fabs(want[s]);
		worst = rel > worst ? rel : worst;
		ck_assert_msg(rel < REL_TOL, "%s: step %d: loss %.9g, continuing on the old mesh %.9g", what, s + 4,
			      got[s], want[s]);
	}
	fprintf(stderr, "%s: worst relative loss difference to continuing on 2x2 fsdp %.2e\n", what, worst);
}

/* The checkpoint of `model` (with opt) resumed on each new mesh. */
static void remesh_all(const char *name, const char *model, const char *opt, bool zero1)
{
	char what[96];
	double want[4], got[4];
	char *log;
	struct reads r[4];
	base_checkpoint(model, opt);
	resume_on(model, opt, "local " OLD_MESH, "", "same", want);

	resume_on(model, opt, "local --hosts 1 --devices-per-host 4", "ici_tensor_parallelism=4 ici_data_parallelism=1",
		  "tp4", got);
	snprintf(what, sizeof(what), "%s 1x4 tensor", name);
	assert_close(what, got, want);

	resume_on(model, opt, "local --hosts 4 --devices-per-host 1", "", "dp4", got);
	snprintf(what, sizeof(what), "%s 4x1 data", name);
	assert_close(what, got, want);
	/* no split: every host reads the whole of both files */
	log = read_tmp("log.out");
	for (int h = 0; h < 4; h++) {
		ck_assert_msg(host_read(log, h, &r[h]), "no resume line of host %d:\n%s", h, log);
		ck_assert(r[h].w == r[h].wall && r[h].o == r[h].oall && r[h].oall >= 2 * r[h].wall);
	}
	free(log);

	resume_on(model, opt, "local --hosts 2 --devices-per-host 2",
		  "dcn_pipeline_parallelism=2 dcn_data_parallelism=1", "pp2", got);
	snprintf(what, sizeof(what), "%s 2 pipeline stages over 2 hosts", name);
	assert_close(what, got, want);
	/* a host holds its stage's layers only, of the weights and the state */
	log = read_tmp("log.out");
	for (int h = 0; h < 2; h++) {
		ck_assert_msg(host_read(log, h, &r[h]), "no resume line of host %d:\n%s", h, log);
		ck_assert_msg(r[h].w < r[h].wall && r[h].o < r[h].oall, "host %d read %llu of %llu, %llu of %llu",
			      h, r[h].w, r[h].wall, r[h].o, r[h].oall);
	}
	ck_assert(r[0].w + r[1].w > r[0].wall);   /* embedding, head: on both */
	free(log);

	if (!zero1)
		return;
	resume_on(model, opt, "local --hosts 2 --devices-per-host 2", "shard_optimizer_over_data=true", "zero1",
		  got);
	snprintf(what, sizeof(what), "%s ZeRO-1 over 2x2 data", name);
	assert_close(what, got, want);
	/* the state split over data: each host reads its two ranks' parts,
	 * the two hosts' together are the whole; the weights whole on both */
	log = read_tmp("log.out");
	for (int h = 0; h < 2; h++) {
		ck_assert_msg(host_read(log, h, &r[h]), "no resume line of host %d:\n%s", h, log);
		ck_assert(r[h].w == r[h].wall);
		ck_assert_msg(r[h].o < r[h].oall * 0.55, "host %d read %llu of %llu optimizer bytes", h, r[h].o,
			      r[h].oall);
	}
	ck_assert_uint_eq(r[0].o + r[1].o, r[0].oall);
	free(log);
}

START_TEST(test_llama)
{
	double want[4], got[4];
	remesh_all("llama", LLAMA, "", true);
	/* on one device, 8 rows a step */
	resume_on(LLAMA, "", "local " OLD_MESH, "", "same", want);
	resume_on(LLAMA, "", "train", "per_device_batch_size=8", "one", got);
	assert_close("llama one device", got, want);
}
END_TEST

START_TEST(test_deepseek3)
{
	remesh_all("deepseek3", DS3, "", true);
}
END_TEST

/* Muon's momentum: whole matrices on 4 x 1, blocks of them under tensor
 * parallelism (orthogonalised after a gather). */
START_TEST(test_muon)
{
	double want[4], got[4];
	base_checkpoint(LLAMA, "opt_type=muon");
	resume_on(LLAMA, "opt_type=muon", "local " OLD_MESH, "", "same", want);
	resume_on(LLAMA, "opt_type=muon", "local --hosts 1 --devices-per-host 4",
		  "ici_tensor_parallelism=4 ici_data_parallelism=1", "tp4", got);
	assert_close("llama muon 1x4 tensor", got, want);
	resume_on(LLAMA, "opt_type=muon", "local --hosts 4 --devices-per-host 1", "", "dp4", got);
	assert_close("llama muon 4x1 data", got, want);
}
END_TEST

/* One refusal: `how` with `keys` resuming the base checkpoint exits 3
 * with exactly one line, which has `want`. */
static void refused(const char *how, const char *keys, const char *want)
{
	char args[1200];
	const char *d = copy_ckpt("base", "refused");
	snprintf(args, sizeof(args), "%s " LLAMA " " COMMON " steps=8 %s --checkpoint-dir %s --resume", how, keys, d);
	bool local = !strncmp(how, "local", 5);
	struct proc p;
	int rc = proc_run(&p, "refused", args, 60);
	char *out = slurp(p.out);
	int lines = 0;
	for (char *c = out; *c; c++)
		lines += *c == '\n';
	ck_assert_msg(rc == EXIT_CONFIG && lines == 1 && strstr(out, want),
		      "%s %s: exit %d, want 3 and one line with '%s':\n%s", how, keys, rc, want, out);
	/* local refuses before anything starts: its own line, no agent's */
	ck_assert_msg(!local || strstr(out, "meshrun: local: config: --resume: "), "%s", out);
	fprintf(stderr, "refused: %s", out);
}

/* The base checkpoint as one written before checkpoints held the data
 * position: meshrun_data_sample renamed (same length) in both files'
 * headers, so the rows per step are all that says where the data is. */
static void forget_data_position(void)
{
	static const char *const files[] = { "model.safetensors", "optimizer.safetensors" };
	char path[400], *hdr;
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/base/step-000004/%s", tmpdir, files[i]);
		FILE *f = fopen(path, "r+b");
		uint64_t n;
		ck_assert_msg(f && fread(&n, 8, 1, f) == 1 && n < (1u << 20), "%s", path);
		hdr = calloc(1, n + 1);
		ck_assert(hdr && fread(hdr, 1, n, f) == n);
		char *k = strstr(hdr, "\"meshrun_data_sample\"");
		ck_assert_msg(k, "%s: no meshrun_data_sample in %s", path, hdr);
		memcpy(k + 9, "xata", 4);
		ck_assert(fseek(f, 8, SEEK_SET) == 0 && fwrite(hdr, 1, n, f) == n && fclose(f) == 0);
		free(hdr);
	}
}

START_TEST(test_refusals)
{
	base_checkpoint(LLAMA, "");
	static const char *const how[] = { "local --hosts 1 --devices-per-host 4", "train" };
	static const char *const batch[] = { "", "per_device_batch_size=8" };
	char k[200];
	for (int i = 0; i < 2; i++) {
		snprintf(k, sizeof(k), "%s base_emb_dim=64", batch[i]);
		refused(how[i], k, "holds another model: its config.json has hidden_size 128, this run's model "
			"has 64");
		snprintf(k, sizeof(k), "%s base_num_decoder_layers=3", batch[i]);
		refused(how[i], k, "config.json has num_hidden_layers 2, this run's model has 3");
		snprintf(k, sizeof(k), "%s opt_type=muon", batch[i]);
		refused(how[i], k, "was trained with opt_type=adamw, this run has opt_type=muon");
		snprintf(k, sizeof(k), "%s max_target_length=32", batch[i]);
		refused(how[i], k, "rows of max_target_length=64 tokens, this run's are 32");
	}
	/* another global batch: the data position says where the data goes
	 * on (test_data_position); without one it would not continue */
	forget_data_position();
	refused(how[0], "per_device_batch_size=4",
		"global batch of 8 rows, this run's is 16 (per_device_batch_size=4 x 4 devices)");
	refused(how[1], "", "global batch of 8 rows, this run's is 2 (per_device_batch_size=2 x 1 device)");
}
END_TEST

/* The data position carries over on the in-place path too, at any rows
 * per step: an llm.c corpus, 3 steps of 8 rows on one device, resumed on
 * 2 hosts with 4 rows a step, each host reading its part: step 3 begins
 * at row 24 (rows read), not at 3 x 4. */
START_TEST(test_data_position)
{
	char args[1200], corpus[300];
	struct proc p;
	snprintf(args, sizeof(args), "data pack --format llmc --name g /usr/share/common-licenses/GPL-3 -o %s/s",
		 tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(corpus, sizeof(corpus), "dataset_type=llmc dataset_path=%s/s/*.bin", tmpdir);
	snprintf(args, sizeof(args), "train " LLAMA " max_target_length=16 openblas_threads=1 "
		 "per_device_batch_size=8 steps=3 %s --checkpoint-dir %s/ck", corpus, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "local --hosts 2 " LLAMA " max_target_length=16 openblas_threads=1 "
		 "per_device_batch_size=2 steps=5 %s --checkpoint-dir %s/ck --resume", corpus, tmpdir);
	ck_assert_int_eq(proc_run(&p, "log", args, 120), 0);
	char *log = read_tmp("log.out");
	ck_assert_msg(strstr(log, "meshrun: host 1: resume: read ") &&
		      strstr(log, "4 per step; step 3 begins at epoch 0, row 24 of it"), "%s", log);
	free(log);
}
END_TEST

/* ---- the mesh a launcher shrinks to when machines are gone ---- */

/* llama-tiny with the overrides kv (space-separated) finished for hosts x 1. */
static void tiny(struct cfg *c, int hosts, const char *kv)
{
	char err[512], buf[256], *save;
	cfg_defaults(c);
	ck_assert_msg(cfg_load_file(c, "configs/llama-tiny.yml", err, sizeof(err)) == 0, "%s", err);
	snprintf(buf, sizeof(buf), "%s", kv);
	for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
		ck_assert_msg(cfg_override(c, t, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(cfg_finish(c, hosts, 1, err, sizeof(err)) == 0, "%s", err);
}

static void shrinks(int hosts, const char *kv, int to, long long want_data, long long want_pdbs)
{
	static struct cfg c;
	long long d = -1, p = -1;
	char err[512] = "";
	tiny(&c, hosts, kv);
	ck_assert_msg(train_shrink(&c, to, &d, &p, err, sizeof(err)) == 0, "%d hosts %s to %d: %s", hosts, kv,
		      to, err);
	ck_assert_int_eq(d, want_data);
	ck_assert_int_eq(p, want_pdbs);
}

static void cannot_shrink(int hosts, const char *kv, int to, const char *want)
{
	static struct cfg c;
	long long d, p;
	char err[512] = "";
	tiny(&c, hosts, kv);
	ck_assert_int_eq(train_shrink(&c, to, &d, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, want), "%d hosts %s to %d: '%s' not in '%s'", hosts, kv, to, want, err);
}

START_TEST(test_shrink)
{
	/* data over the hosts: 3 x 8 rows become 2 x 12 */
	shrinks(3, "", 2, 2, 12);
	shrinks(4, "per_device_batch_size=3", 2, 2, 6);
	/* fsdp across 2 hosts stays; data goes from 2 to 1 */
	shrinks(4, "dcn_fsdp_parallelism=2 dcn_data_parallelism=-1", 2, 1, 16);
	cannot_shrink(4, "dcn_fsdp_parallelism=2 dcn_data_parallelism=-1", 3,
		      "cannot shrink to 3 hosts along data: its other axes across hosts (fsdp=2) need a multiple of 2");
	cannot_shrink(3, "dcn_fsdp_parallelism=3 dcn_data_parallelism=1", 2, "(fsdp=3) need a multiple of 3");
	cannot_shrink(3, "per_device_batch_size=1", 2, "the global batch of 3 rows does not split over 2 hosts");
	/* the trainer's own checks on the new mesh: a fault drill for host 2
	 * has no host 2 to run on */
	cannot_shrink(3, "faults=kill:host=2:step=100", 2, "on 2 hosts (dcn_data_parallelism=2, "
		      "per_device_batch_size=12) config: key 'faults'");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("remesh");
	TCase *tc = tcase_create("refusals");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_data_position);
	suite_add_tcase(s, tc);
	tc = tcase_create("shrink");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_shrink);
	suite_add_tcase(s, tc);
	tc = tcase_create("remesh");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_llama);
	tcase_add_test(tc, test_deepseek3);
	tcase_add_test(tc, test_muon);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
