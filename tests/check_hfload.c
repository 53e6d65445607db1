/* Weights in from Hugging Face checkpoints (host/ckpt/hf_load.h,
 * hf_config.h): checkpoints made by tests/hf_ref.py (its own safetensors
 * writer, 3 shards with shuffled tensor order and an index) load and
 * evaluate equal to its independent numpy implementation (Llama in BF16,
 * F16 and F32, tied or not; GQA with DeepSeek-V3's router, groups active,
 * a nonzero correction bias, and a multi-token-prediction layer skipped);
 * a fine-tuned checkpoint saved back (BF16) reads the same; each broken
 * checkpoint is refused with one line and a non-zero exit, and nothing is
 * read before everything is checked; each host reads its share of the
 * tensor bytes and no more (FSDP, tensor and expert splits over 2 hosts,
 * devices of a host sharing blocks), the same bits and bytes whether it
 * reads on 1 thread or 3, through mappings or pread; parameters on huge pages or not load the same
 * bits, and memory that cannot be had is an error naming its bytes. */
#include <cJSON.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/ckpt/ckpt.h"
#include "host/ckpt/hf_config.h"
#include "host/ckpt/hf_load.h"
#include "host/ckpt/safetensors.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/util/mem.h"
#include "tests/equiv.h"

#define PY "/usr/bin/python3"
#define T_EVAL 32

static char text[300];   /* a 4 KB piece of the GPL: quick for the numpy model */

static void setup(void)
{
	proc_setup("meshrun-hfload", 0);
	snprintf(text, sizeof(text), "%s/text.txt", tmpdir);
	FILE *in = fopen("/usr/share/common-licenses/GPL-3", "rb"), *out = fopen(text, "wb");
	ck_assert(in && out);
	char buf[4000];
	size_t n = fread(buf, 1, sizeof(buf), in);
	ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
	fclose(in);
	fclose(out);
}

/* Runs tests/hf_ref.py with the space-separated words of args; its
 * stdout into tmpdir/py.out (returned, malloc'd), stderr to py.err. */
static char *py(const char *fmt, ...)
{
	char line[1024], *argv[64];
	va_list ap;
	int n = 0;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	argv[n++] = PY;
	argv[n++] = "tests/hf_ref.py";
	for (char *save = NULL, *w = strtok_r(line, " ", &save); w && n < 63; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	argv[n] = NULL;
	struct proc p;
	proc_start(&p, "py", argv, -1);
	int rc = proc_wait(&p, 300);
	if (rc < 0)
		proc_kill(&p);
	ck_assert_msg(rc == 0, "hf_ref.py %s: exit %d\n%s", fmt, rc, slurp(p.err));
	return read_tmp("py.out");
}

/* A checkpoint made by hf_ref.py in tmpdir/name. */
static const char *make(const char *name, const char *opts)
{
	static char dir[4][300];
	static int k;
	char *d = dir[k++ % 4];
	snprintf(d, 300, "%s/%s", tmpdir, name);
	rm_rf(d);
	free(py("make %s %s", d, opts));
	return d;
}

/* The numpy model's mean loss over the text. */
static double ref_loss(const char *dir)
{
	char *out = py("eval %s %s %d", dir, text, T_EVAL);
	double v = strtod(out, NULL);
	free(out);
	return v;
}

/* meshrun eval's loss (exact, from eval_loss_hex); the log in log.out. */
static double meshrun_loss(const char *dir, const char *extra)
{
	char args[1024];
	snprintf(args, sizeof(args), "eval --checkpoint %s --text %s max_target_length=%d %s", dir, text,
		 T_EVAL, extra);
	show_log_on_failure(run(args), 0);
	char *log = read_tmp("log.out"), *p = strstr(log, "eval_loss_hex: ");
	ck_assert_msg(p, "%s", log);
	double v = strtod(p + 15, NULL);
	free(log);
	return v;
}

static void equal_to_reference(const char *dir, const char *what)
{
	double want = ref_loss(dir), got = meshrun_loss(dir, "");
	double rel = fabs(got - want) / fabs(want);
	fprintf(stderr, "%s: meshrun %.9f, numpy %.9f, relative %.1e\n", what, got, want, rel);
	ck_assert_msg(rel < 1e-5, "%s: meshrun %.9g, reference %.9g", what, got, want);
	ck_assert(want > 1.0 && want < 20.0);
}

/* ---- equal to the independent implementation ---- */

static const char *const llama_variants[] = {
	"--dtype BF16 --shards 3",
	"--dtype F16 --shards 2 --tied 1 --kv_heads 4 --seed 2",
	"--dtype F32 --shards 1 --layers 3 --kv_heads 1 --seed 3",
};

START_TEST(test_llama_equals_reference)
{
	const char *d = make("llama", llama_variants[_i]);
	equal_to_reference(d, llama_variants[_i]);
	char *log = read_tmp("log.out");
	ck_assert_msg(strstr(log, "load: read ") && !strstr(log, "skipped"), "%s", log);
	free(log);
}
END_TEST

/* Grouped-query attention with DeepSeek-V3's router (meshrun_moe), one
 * dense layer first, a shared expert, groups that change choices, a
 * correction bias, and a multi-token-prediction layer to skip. */
START_TEST(test_moe_equals_reference)
{
	const char *d = make("moe", "--type meshrun_moe --layers 3 --mtp 1 --seed 5");
	equal_to_reference(d, "meshrun_moe, 8 experts in 4 groups, 2 compete");
	char *err = read_tmp("py.err"), *log = read_tmp("log.out");
	int routed = 0, changed = 0;
	ck_assert_msg(sscanf(err, "routed %d tokens, groups changed the experts of %d", &routed, &changed) == 2,
		      "%s", err);
	ck_assert_msg(changed > routed / 50, "groups changed %d of %d tokens' experts", changed, routed);
	ck_assert_msg(strstr(log, "skipped 35 tensors of the multi-token-prediction layer 3"), "%s", log);
	free(err);
	free(log);
}
END_TEST

/* Fine-tuning from a loaded checkpoint and saving it back (BF16): the
 * files are Hugging Face's (config.json llama, BF16 weights) and read the
 * same in the numpy model as in meshrun, both as a meshrun checkpoint and
 * as a Hugging Face directory. */
START_TEST(test_save_back)
{
	const char *d = make("start", "--dtype BF16 --shards 3");
	char args[1024], step[400], hf[400], cmd[2048];
	snprintf(args, sizeof(args), "train --config configs/base.yml load_parameters_path=%s steps=2 "
		 "max_target_length=32 per_device_batch_size=2 dataset_type=text dataset_path=%s "
		 "checkpoint_dtype=bf16 --checkpoint-dir %s/ck --quiet", d, text, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(step, sizeof(step), "%s/ck/step-000002", tmpdir);
	char err[512], path[500];
	snprintf(path, sizeof(path), "%s/model.safetensors", step);
	struct st_file *f = st_open_header(path, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert_str_eq(st_find(f, "model.layers.1.self_attn.q_proj.weight")->dtype, "BF16");
	ck_assert_int_eq(st_find(f, "model.embed_tokens.weight")->nbytes, 256 * 32 * 2);
	st_close(f);
	snprintf(path, sizeof(path), "%s/config.json", step);
	ck_assert_file_has(path, "\"model_type\":\t\"llama\"");
	ck_assert_file_has(path, "\"torch_dtype\":\t\"bfloat16\"");
	equal_to_reference(step, "saved back, meshrun checkpoint");
	/* the same files without meshrun's own: a Hugging Face directory */
	snprintf(hf, sizeof(hf), "%s/hf", tmpdir);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s && cp %s/model.safetensors %s/config.json %s/", hf, step, step, hf);
	ck_assert_int_eq(system(cmd), 0);
	equal_to_reference(hf, "saved back, Hugging Face directory");
	/* and it did train: the weights moved */
	ck_assert(fabs(ref_loss(hf) - ref_loss(d)) > 1e-4);
}
END_TEST

/* A MoE model meshrun writes as meshrun_moe loads back from its
 * config.json alone (the router's keys, groups, bias and all). */
START_TEST(test_moe_save_back)
{
	const char *d = make("moe2", "--type meshrun_moe --layers 2 --seed 6");
	char args[1024], step[400], hf[400], cmd[2048];
	snprintf(args, sizeof(args), "train --config configs/base.yml load_parameters_path=%s steps=1 "
		 "max_target_length=32 per_device_batch_size=2 dataset_type=text dataset_path=%s "
		 "--checkpoint-dir %s/ck2 --quiet", d, text, tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(step, sizeof(step), "%s/ck2/step-000001", tmpdir);
	snprintf(hf, sizeof(hf), "%s/hf2", tmpdir);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s && cp %s/model.safetensors %s/config.json %s/", hf, step, step, hf);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/config.json", hf);
	ck_assert_file_has(cmd, "\"model_type\":\t\"meshrun_moe\"");
	ck_assert_file_has(cmd, "\"n_group\":\t4");
	equal_to_reference(hf, "meshrun_moe saved back");
}
END_TEST

/* ---- refusals: one line, exit non-zero, nothing trained ---- */

static const struct refusal {
	const char *make, *extra;
	int code;
	const char *needle;
} refusals[] = {
	{ "--drop model.layers.1.mlp.up_proj.weight", "", 4,
	  "has no tensor 'model.layers.1.mlp.up_proj.weight' (the model needs shape [48, 32])" },
	{ "--bad-shape model.layers.0.self_attn.k_proj.weight", "", 4,
	  "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [17, 32], the model (config.json) needs [16, 32]" },
	{ "--offset-past", "", 4, "outside the" },
	{ "--hlen-past", "", 4, "exceeds the rest of the file" },
	{ "--dup model.norm.weight", "", 4, "tensor 'model.norm.weight' is in both" },
	{ "--dup-in-file", "", 4, "appears twice" },
	{ "--config-hidden 64", "", 4,
	  "tensor 'model.embed_tokens.weight' has shape [256, 32], the model (config.json) needs [256, 64]" },
	{ "--fp8", "", 4, "is an FP8 checkpoint (tensor 'model.layers.0.mlp.down_proj.weight_scale_inv')" },
	{ "--index-wrong", "", 4, "but the index puts it in 'model-00002-of-00003.safetensors'" },
	{ "", "base_emb_dim=64", 3, "key 'base_emb_dim' is 64 but '" },
	{ "", "--config configs/llama-tiny.yml", 3, "key 'base_emb_dim' is 128 but '" },
	{ "", "num_experts=4", 3, "key 'num_experts' is 4 but '" },
	{ "", "base_mlp_dim=64", 3, "gives 48 (intermediate_size)" },
	{ "", "num_experts=4", 3, "gives 1 (model_type 'llama')" },
};

START_TEST(test_refused)
{
	const struct refusal *r = &refusals[_i];
	const char *d = make("bad", r->make);
	char args[1024];
	snprintf(args, sizeof(args), "train load_parameters_path=%s steps=1 %s", d, r->extra);
	int rc = run(args);
	char *log = read_tmp("log.out");
	ck_assert_msg(rc == r->code, "%s: exit %d, want %d:\n%s", r->make, rc, r->code, log);
	ck_assert_msg(strstr(log, r->needle), "%s: '%s' not in:\n%s", r->make, r->needle, log);
	ck_assert_msg(strchr(log, '\n') == log + strlen(log) - 1, "%s: not one line:\n%s", r->make, log);
	ck_assert_msg(!strstr(log, "completed step"), "%s: trained anyway", r->make);
	if (r->code == 3)
		ck_assert_msg(strstr(log, "config.json' gives "), "%s: names only one side: %s", r->make, log);
	free(log);
}
END_TEST

/* The agents refuse it the same way: every host's exit is bad input. */
START_TEST(test_refused_by_agents)
{
	const char *d = make("bad2", "--bad-shape lm_head.weight");
	char args[1024];
	snprintf(args, sizeof(args), "local --hosts 2 --devices-per-host 2 load_parameters_path=%s steps=1", d);
	int rc = run(args);
	char *log = read_tmp("log.out");
	ck_assert_msg(rc == 4 && strstr(log, "tensor 'lm_head.weight' has shape [257, 32]"), "exit %d:\n%s",
		      rc, log);
	ck_assert_msg(!strstr(log, "completed step"), "%s", log);
	free(log);
}
END_TEST

/* A model that does not fit in memory is exit 1 with the bytes asked
 * for, never a config error (exit 3), on one device and on agents. */
START_TEST(test_out_of_memory_exit)
{
	static const char *const cmds[] = {
		"train vocab_size=16777216 base_emb_dim=65536 steps=1",
		"local --hosts 2 vocab_size=16777216 base_emb_dim=65536 steps=1",
	};
	for (int i = 0; i < 2; i++) {
		int rc = run(cmds[i]);
		char *log = read_tmp("log.out");
		ck_assert_msg(rc == 1, "%s: exit %d:\n%s", cmds[i], rc, log);
		ck_assert_msg(strstr(log, "model: out of memory: ") && strstr(log, " bytes asked for (parameters"),
			      "%s:\n%s", cmds[i], log);
		ck_assert_msg(!strstr(log, "config error"), "%s:\n%s", cmds[i], log);
		free(log);
	}
}
END_TEST

/* The check runs to its end before a byte of tensor data is read: a
 * model filled with a marker keeps every element when the last tensor
 * checked (lm_head.weight) is misshapen, and the host read headers only. */
START_TEST(test_nothing_half_loaded)
{
	const char *d = make("half", "--bad-shape lm_head.weight");
	static struct cfg c;
	struct model_dims dims;
	char err[1024];
	cfg_defaults(&c);
	snprintf(c.load_parameters_path, sizeof(c.load_parameters_path), "%s", d);
	ck_assert_msg(hf_config_apply(&c, NULL, 0, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.base_emb_dim, 32);
	ck_assert_msg(model_dims_from_cfg(&dims, &c, err, sizeof(err)) == 0, "%s", err);
	struct model *m = model_new(&dims, 1, NULL, err, sizeof(err));
	ck_assert_msg(m, "%s", err);
	float *P = model_params(m);
	size_t n = model_numel(m);
	for (size_t i = 0; i < n; i++)
		P[i] = 7.25f;
	struct hf_src *src;
	ck_assert_msg(hf_src_open(&src, d, 1, err, sizeof(err)) == 0, "%s", err);
	uint64_t headers = hf_src_bytes_read(src);
	ck_assert_int_eq(hf_src_load(src, m, P, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "'lm_head.weight' has shape [257, 32]"), "%s", err);
	ck_assert_int_eq(hf_src_done(src, -EBADMSG, err, sizeof(err)), -EBADMSG);
	ck_assert_uint_eq(hf_src_bytes_read(src), headers);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(P[i] == 7.25f, "element %zu changed to %g", i, P[i]);
	hf_src_close(src);
	model_free(m);
}
END_TEST

/* ---- the parameters' memory (host/util/mem.h) ---- */

/* Loaded with util_big_alloc on 4 KiB pages (the default) and on huge
 * pages (MESHRUN_HUGEPAGES=1): a model of 6.6 MB, so its parameters and
 * gradients are mappings of their own, zeroed and 2 MiB aligned when
 * made, and the same bits when loaded as in a malloc'd buffer. A model
 * that cannot be had is the out-of-memory error naming its bytes, either
 * way. */
START_TEST(test_huge_pages_identical)
{
	const char *d = make("huge", "--dtype BF16 --shards 2 --layers 2 --hidden 256 --heads 4 --kv_heads 2 "
			     "--inter 512 --vocab 1024");
	static struct cfg c;
	struct model_dims dims;
	char err[1024], want[160];
	float *got[3];
	size_t n = 0;
	cfg_defaults(&c);
	snprintf(c.load_parameters_path, sizeof(c.load_parameters_path), "%s", d);
	ck_assert_msg(hf_config_apply(&c, NULL, 0, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(model_dims_from_cfg(&dims, &c, err, sizeof(err)) == 0, "%s", err);
	for (int h = 0; h < 3; h++) {  /* 4 KiB pages, huge pages, then a malloc'd buffer */
		ck_assert_int_eq(setenv("MESHRUN_HUGEPAGES", h == 1 ? "1" : "0", 1), 0);
		ck_assert_int_eq(util_hugepages(), h == 1);
		struct model *m = model_new(&dims, 1, NULL, err, sizeof(err));
		ck_assert_msg(m, "%s", err);
		n = model_numel(m);
		ck_assert_uint_ge(n * sizeof(float), (size_t)4 << 20);
		float *P = model_params(m), *G = model_grads(m);
		ck_assert_uint_eq((uintptr_t)P % ((uintptr_t)2 << 20), 0);
		ck_assert_uint_eq((uintptr_t)G % ((uintptr_t)2 << 20), 0);
		size_t nonzero = 0;
		for (size_t i = 0; i < n; i++)
			nonzero += P[i] != 0.0f || G[i] != 0.0f;
		ck_assert_uint_eq(nonzero, 0);
		got[h] = malloc(sizeof(float) * n);
		ck_assert(got[h]);
		for (size_t i = 0; i < n; i++)
			got[h][i] = 7.25f;
		struct hf_src *src;
		ck_assert_msg(hf_src_open(&src, d, 1, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(hf_src_load(src, m, h == 2 ? got[h] : P, err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(hf_src_done(src, 0, err, sizeof(err)), 0);
		hf_src_close(src);
		if (h < 2)
			memcpy(got[h], P, sizeof(float) * n);
		model_free(m);
	}
	size_t marked = 0;
	for (size_t i = 0; i < n; i++)
		marked += got[2][i] == 7.25f;
	ck_assert_msg(marked == 0, "%zu floats not loaded", marked);
	ck_assert_msg(!memcmp(got[0], got[1], sizeof(float) * n), "4 KiB and huge pages differ");
	ck_assert_msg(!memcmp(got[0], got[2], sizeof(float) * n), "util_big_alloc and malloc differ");
	for (int h = 0; h < 3; h++)
		free(got[h]);
	/* 4 TB of parameters: no mapping that large is granted */
	dims.V = 16777216;
	dims.C = 65536;
	struct model *plan = model_plan_new(&dims, NULL, err, sizeof(err));
	ck_assert_msg(plan, "%s", err);
	size_t pb = (model_numel(plan) * sizeof(float) + 63) & ~(size_t)63, asked = 0;
	snprintf(want, sizeof(want), "(parameters and gradients %zu each", pb);
	model_free(plan);
	for (int h = 0; h < 2; h++) {
		ck_assert_int_eq(setenv("MESHRUN_HUGEPAGES", h ? "1" : "0", 1), 0);
		ck_assert(!model_new(&dims, 1, NULL, err, sizeof(err)));
		const char *at = strstr(err, "model: out of memory: ");
		ck_assert_msg(at && strstr(err, want), "%s\nwants %s", err, want);
		ck_assert_int_eq(sscanf(at + strlen("model: out of memory: "), "%zu", &asked), 1);
		ck_assert_uint_ge(asked, 2 * pb);
	}
	ck_assert(!util_big_alloc(SIZE_MAX - 4096));
	unsetenv("MESHRUN_HUGEPAGES");
}
END_TEST

/* ---- the readers' threads ---- */

/* One device's load, as train's devices do it. */
struct dev_load {
	struct hf_src *src;
	const struct model *m;
	float *p;
	int rc;
	char err[1024];
};

static void *dev_load(void *arg)
{
	struct dev_load *x = arg;
	x->rc = hf_src_load_done(x->src, x->m, x->p, x->err, sizeof(x->err));
	return NULL;
}

/* Host 0's dph devices of the mesh `keys` (4 devices: 4 / dph hosts)
 * loaded from d on `threads` threads (MESHRUN_LOAD_THREADS), through
 * mappings of the files or with pread (MESHRUN_LOAD_MMAP); together (a
 * thread each, one batch of reads writing a block two hold into both, a
 * third and fourth copying it) or, with `together` false, one after the
 * other as a source of one device (the others copy the first one's
 * blocks): every device's parameters, one after another (malloc'd, *n
 * floats in all), and the tensor bytes read. With `replicas` (data
 * parallel inside the host) all devices hold the same. */
static float *load_on_threads(const char *d, const char *keys, int dph, bool replicas, int threads,
			      bool mapped, bool together, size_t *n, uint64_t *bytes)
{
	static struct cfg c;
	static struct mesh mesh;
	static struct shard_rules rules;
	struct model_dims dims;
	char err[1024], buf[1024], num[16];
	cfg_defaults(&c);
	snprintf(c.load_parameters_path, sizeof(c.load_parameters_path), "%s", d);
	ck_assert_msg(hf_config_apply(&c, NULL, 0, err, sizeof(err)) == 0, "%s", err);
	snprintf(buf, sizeof(buf), "%s", keys);
	for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
		ck_assert_msg(cfg_override(&c, w, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(cfg_finish(&c, 4 / dph, dph, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&mesh, &c);
	ck_assert_msg(shard_rules_from_cfg(&rules, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(model_dims_from_cfg(&dims, &c, err, sizeof(err)) == 0, "%s", err);
	struct model *m[4];
	float *P[4];
	snprintf(num, sizeof(num), "%d", threads);
	ck_assert_int_eq(setenv("MESHRUN_LOAD_THREADS", num, 1), 0);
	ck_assert_int_eq(setenv("MESHRUN_LOAD_MMAP", mapped ? "1" : "0", 1), 0);
	ck_assert(hf_load_mmap() == mapped);
	struct hf_src *src;
	ck_assert_msg(hf_src_open(&src, d, together ? dph : 1, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < dph; i++) {
		struct model_mesh mm = { .mesh = &mesh, .rules = &rules, .device = mesh_device_of(&mesh, 0, i) };
		m[i] = model_plan_new(&dims, &mm, err, sizeof(err));
		ck_assert_msg(m[i], "%s", err);
		ck_assert(!i || model_numel(m[i]) == *n);  /* the layout below: devices of one size */
		*n = model_numel(m[i]);
		P[i] = malloc(sizeof(float) * *n);
		ck_assert(P[i]);
		for (size_t k = 0; k < *n; k++)
			P[i][k] = 7.25f;
		if (!together)
			ck_assert_msg(hf_src_load(src, m[i], P[i], err, sizeof(err)) == 0, "%s", err);
	}
	if (together) {
		static struct dev_load x[4];
		pthread_t th[4];
		for (int i = 0; i < dph; i++)
			x[i] = (struct dev_load){ .src = src, .m = m[i], .p = P[i] };
		for (int i = 1; i < dph; i++)
			ck_assert_int_eq(pthread_create(&th[i], NULL, dev_load, &x[i]), 0);
		dev_load(&x[0]);
		for (int i = 1; i < dph; i++)
			pthread_join(th[i], NULL);
		for (int i = 0; i < dph; i++)
			ck_assert_msg(x[i].rc == 0, "device %d: %s", i, x[i].err);
	} else {
		ck_assert_int_eq(hf_src_done(src, 0, err, sizeof(err)), 0);
	}
	struct hf_src_count cnt;
	hf_src_counts(src, &cnt);
	*bytes = cnt.tensors;
	unsetenv("MESHRUN_LOAD_THREADS");
	unsetenv("MESHRUN_LOAD_MMAP");
	hf_src_close(src);
	size_t each = *n;
	float *all = malloc(sizeof(float) * each * (size_t)dph);
	ck_assert(all);
	for (int i = 0; i < dph; i++) {
		ck_assert_msg(!replicas || !memcmp(P[0], P[i], sizeof(float) * each), "%s: devices 0 and %d differ",
			      keys, i);
		memcpy(all + each * (size_t)i, P[i], sizeof(float) * each);
	}
	for (int i = 0; i < dph; i++) {
		model_free(m[i]);
		free(P[i]);
	}
	*n = each * (size_t)dph;
	return all;
}

/* Reading on 1 or 3 threads, through mappings of the files or with
 * pread, the devices together or one by one, fills the same bits and
 * reads the same bytes (whole tensors, FSDP's and tensor parallelism's
 * column splits, whose rows one job gathers, and the blocks both devices
 * hold: written to both from one read, or copied from the first), and
 * every float is loaded. */
static void threads_bit_identical(const char *d)
{
	static const char *const meshes[] = {
		"dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=2",
		"dcn_data_parallelism=1 dcn_tensor_parallelism=2 ici_data_parallelism=2",
		"dcn_data_parallelism=2 ici_data_parallelism=2",
		"ici_data_parallelism=2 ici_fsdp_parallelism=2",  /* one host of 4: two blocks, each held by two */
		"ici_data_parallelism=4",  /* one host of 4 replicas: the third and fourth copy */
	};
	for (int k = 0; k < 5; k++) {
		size_t n1, n3, np;
		uint64_t b1, b3, bp;
		int dph = k < 3 ? 2 : 4;
		bool rep = k != 3;
		float *a = load_on_threads(d, meshes[k], dph, rep, 1, true, true, &n1, &b1);
		float *b = load_on_threads(d, meshes[k], dph, rep, 3, true, false, &n3, &b3);
		float *c = load_on_threads(d, meshes[k], dph, rep, 2, false, true, &np, &bp);
		ck_assert_uint_eq(n1, n3);
		ck_assert_uint_eq(b1, b3);
		ck_assert_msg(!memcmp(a, b, sizeof(float) * n1), "%s: 1 and 3 threads (together, one by one) differ",
			      meshes[k]);
		ck_assert_uint_eq(n1, np);
		ck_assert_uint_eq(b1, bp);
		ck_assert_msg(!memcmp(a, c, sizeof(float) * n1), "%s: mmap and pread differ", meshes[k]);
		free(c);
		size_t marked = 0;
		for (size_t i = 0; i < n1; i++)
			marked += a[i] == 7.25f;
		ck_assert_msg(marked == 0, "%s: %zu floats not loaded", meshes[k], marked);
		free(a);
		free(b);
	}
}

/* ---- each host reads its part ---- */

/* Tensor bytes of the checkpoint in d: all, and those whose name has one
 * of the needles (each needle a replicated or split class). */
static uint64_t tensor_bytes(const char *d, const char *const *needles, int nn)
{
	uint64_t n = 0;
	char path[600], err[512];
	for (int k = 1; k <= 3; k++) {
		snprintf(path, sizeof(path), "%s/model-%05d-of-00003.safetensors", d, k);
		struct st_file *f = st_open_header(path, err, sizeof(err));
		ck_assert_msg(f, "%s", err);
		for (int i = 0; i < st_count(f); i++) {
			const struct st_entry *e = st_entry_at(f, i);
			bool hit = !nn;
			for (int j = 0; j < nn; j++)
				hit |= strstr(e->name, needles[j]) != NULL;
			n += hit ? e->nbytes : 0;
		}
		st_close(f);
	}
	return n;
}

/* Both hosts' "load: read N bytes ... (index and headers H, tensors T of
 * the checkpoint's A)" lines; checks N = H + T. */
static void host_reads(const char *log, uint64_t *tensors, uint64_t *headers, uint64_t *all)
{
	for (int h = 0; h < 2; h++) {
		char key[64];
		unsigned long long n, hd, t, a;
		snprintf(key, sizeof(key), "meshrun: host %d: load: read ", h);
		const char *p = strstr(log, key);
		ck_assert_msg(p, "no load line of host %d:\n%s", h, log);
		p = strstr(p, "read ");
		ck_assert(sscanf(p, "read %llu bytes", &n) == 1);
		p = strstr(p, "(index and headers ");
		ck_assert(p && sscanf(p, "(index and headers %llu, tensors %llu of the checkpoint's %llu)", &hd, &t, &a) == 3);
		ck_assert_uint_eq(n, hd + t);
		tensors[h] = t;
		headers[h] = hd;
		*all = a;
	}
}

/* 2 hosts x 2 devices with `mesh`, loading d: each host's tensor bytes
 * are its share (want) exactly, plus headers; step 0's loss is the one
 * device's. */
static void per_host(const char *d, const char *mesh, uint64_t want, double one_loss)
{
	char args[1024];
	snprintf(args, sizeof(args), "local --hosts 2 --devices-per-host 2 --config configs/base.yml "
		 "load_parameters_path=%s %s steps=1 max_target_length=32 per_device_batch_size=2 "
		 "dataset_type=text dataset_path=%s --metrics %s/per_host.jsonl", d, mesh, text, tmpdir);
	show_log_on_failure(run(args), 0);
	char *log = read_tmp("log.out");
	uint64_t t[2], hd[2], all;
	host_reads(log, t, hd, &all);
	ck_assert_uint_eq(all, tensor_bytes(d, NULL, 0));
	for (int h = 0; h < 2; h++) {
		fprintf(stderr, "%s: host %d read %llu tensor bytes of %llu (share %llu) + %llu of headers\n",
			mesh, h, (unsigned long long)t[h], (unsigned long long)all, (unsigned long long)want,
			(unsigned long long)hd[h]);
		ck_assert_msg(t[h] == want, "%s: host %d read %llu tensor bytes, its share is %llu", mesh, h,
			      (unsigned long long)t[h], (unsigned long long)want);
		ck_assert(hd[h] < all / 4);
	}
	double l[1];
	ck_assert_int_eq(losses("per_host.jsonl", l, 1), 1);
	ck_assert_msg(fabs(l[0] - one_loss) <= 1e-5 * one_loss, "%s: step 0 loss %.9g, one device %.9g", mesh,
		      l[0], one_loss);
	free(log);
}

/* step 0's loss on one device with the checkpoint loaded */
static double one_device_loss(const char *d)
{
	char args[1024];
	double l[1];
	snprintf(args, sizeof(args), "train --config configs/base.yml load_parameters_path=%s steps=1 "
		 "max_target_length=32 per_device_batch_size=8 dataset_type=text dataset_path=%s "
		 "--metrics %s/one_load.jsonl --quiet", d, text, tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("one_load.jsonl", l, 1), 1);
	return l[0];
}

START_TEST(test_each_host_reads_its_part)
{
	const char *d = make("share", "--dtype BF16 --shards 3 --layers 2");
	threads_bit_identical(d);
	static const char *const norms[] = { "layernorm.weight", "model.norm.weight" };
	uint64_t all = tensor_bytes(d, NULL, 0), rep = tensor_bytes(d, norms, 2);
	double one = one_device_loss(d);
	/* FSDP over the hosts splits every matrix along embed (rows of some,
	 * columns of others); the norms are whole on both; the two devices
	 * of a host are data-parallel and share their blocks */
	per_host(d, "dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=2", (all - rep) / 2 + rep,
		 one);
	/* tensor parallelism over the hosts: heads, MLP and vocabulary split
	 * (o_proj and down_proj by columns: strided reads) */
	per_host(d, "dcn_data_parallelism=1 dcn_tensor_parallelism=2 ici_data_parallelism=2", (all - rep) / 2 + rep,
		 one);
	/* a circular pipeline over the hosts (2 stages, 2 repeats): a host
	 * holds its stage's layers (1 and 3, or 0 and 2: stored in stage
	 * order), and the embedding, final norm and head whole */
	d = make("pshare", "--dtype BF16 --shards 3 --layers 4 --seed 9");
	static const char *const layers[] = { "model.layers." };
	all = tensor_bytes(d, NULL, 0);
	per_host(d, "dcn_data_parallelism=1 dcn_pipeline_parallelism=2 num_pipeline_repeats=2 "
		 "ici_data_parallelism=2", all - tensor_bytes(d, layers, 1) / 2, one_device_loss(d));
}
END_TEST

/* Experts split over the hosts: each host reads its experts (and its
 * rows of the router and bias, split over `exp` too); the default rules
 * split `embed` over expert as well (MaxText's: expert parallelism shards
 * the other weights like FSDP), so attention, dense and shared-expert
 * matrices are halves too; only the norms are whole. */
START_TEST(test_each_host_reads_its_experts)
{
	const char *d = make("eshare", "--type meshrun_moe --layers 2 --dense 0 --shards 3 --seed 8");
	static const char *const norms[] = { "layernorm.weight", "model.norm.weight" };
	static const char *const experts[] = { ".mlp.experts." };
	uint64_t all = tensor_bytes(d, NULL, 0), rep = tensor_bytes(d, norms, 2);
	ck_assert(tensor_bytes(d, experts, 1) > all / 4);
	per_host(d, "dcn_data_parallelism=1 dcn_expert_parallelism=2 ici_data_parallelism=2", (all - rep) / 2 + rep,
		 one_device_loss(d));
}
END_TEST

/* ---- config.json, both ways ---- */

/* A directory with config.json = json and an empty model.safetensors
 * (what ckpt_find wants); its path. */
static const char *config_dir(const char *json)
{
	static char d[300];
	char path[400];
	snprintf(d, sizeof(d), "%s/cfg", tmpdir);
	rm_rf(d);
	ck_assert_int_eq(mkdir(d, 0755), 0);
	snprintf(path, sizeof(path), "%s/config.json", d);
	FILE *f = fopen(path, "w");
	ck_assert(f && fputs(json, f) >= 0);
	fclose(f);
	snprintf(path, sizeof(path), "%s/model.safetensors", d);
	fclose(fopen(path, "w"));
	return d;
}

/* hf_config_apply of json onto the defaults plus cmdline: its return. */
static int apply(struct cfg *c, const char *json, const char *const *cmdline, int n, char *err, size_t len)
{
	cfg_defaults(c);
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(cfg_override(c, cmdline[i], err, len), 0);
	snprintf(c->load_parameters_path, sizeof(c->load_parameters_path), "%s", config_dir(json));
	err[0] = 0;
	return hf_config_apply(c, cmdline, n, err, len);
}

#define KEY_IS(c, key, want) do { char v_[CFG_STR]; cfg_value_text(c, key, v_, sizeof(v_)); \
	ck_assert_msg(!strcmp(v_, want), "%s: %s, want %s", key, v_, want); } while (0)

/* DeepSeek-V3's own config.json (the published one's model keys) */
static const char v3_json[] =
	"{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
	" \"hidden_size\": 7168, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048,"
	" \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 1, \"num_attention_heads\": 128,"
	" \"num_key_value_heads\": 128, \"n_shared_experts\": 1, \"n_routed_experts\": 256,"
	" \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536,"
	" \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"qk_nope_head_dim\": 128,"
	" \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
	" \"first_k_dense_replace\": 3, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
	" \"hidden_act\": \"silu\", \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-06,"
	" \"tie_word_embeddings\": false, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32,"
	" \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
	" \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"attention_bias\": false,"
	" \"vocab_size\": 129280, \"torch_dtype\": \"bfloat16\"}";

START_TEST(test_config_deepseek_v3)
{
	static struct cfg c;
	char err[1024];
	ck_assert_msg(apply(&c, v3_json, NULL, 0, err, sizeof(err)) == 0, "%s", err);
	static const char *const want[][2] = {
		{ "attention_type", "mla" }, { "base_emb_dim", "7168" }, { "base_mlp_dim", "18432" },
		{ "base_moe_mlp_dim", "2048" }, { "base_num_decoder_layers", "61" },
		{ "base_num_query_heads", "128" }, { "num_experts", "256" }, { "num_experts_per_tok", "8" },
		{ "shared_experts", "1" }, { "first_num_dense_layers", "3" }, { "n_routing_groups", "8" },
		{ "topk_routing_group", "4" }, { "routed_scaling_factor", "2.5" }, { "norm_topk_prob", "true" },
		{ "routed_score_func", "sigmoid" }, { "routed_bias", "true" }, { "kv_lora_rank", "512" },
		{ "q_lora_rank", "1536" }, { "qk_nope_head_dim", "128" }, { "qk_rope_head_dim", "64" },
		{ "v_head_dim", "128" }, { "rope_type", "yarn" }, { "rope_factor", "40" },
		{ "original_max_position_embeddings", "4096" }, { "beta_fast", "32" }, { "beta_slow", "1" },
		{ "mscale", "1" }, { "mscale_all_dim", "1" }, { "normalization_layer_epsilon", "9.9999999999999995e-07" },
		{ "rope_max_timescale", "10000" }, { "vocab_size", "129280" }, { "logits_via_embedding", "false" },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		KEY_IS(&c, want[i][0], want[i][1]);

	/* q_lora_rank null: a plain q_proj (Moonlight, DeepSeek-V2-Lite) */
	char json[4096];
	snprintf(json, sizeof(json), "%s", v3_json);
	char *q = strstr(json, "\"q_lora_rank\": 1536");
	memcpy(q, "\"q_lora_rank\": null", 19);
	ck_assert_msg(apply(&c, json, NULL, 0, err, sizeof(err)) == 0, "%s", err);
	KEY_IS(&c, "q_lora_rank", "0");

	/* a command-line key: refused when it contradicts, taken when it agrees */
	const char *const clash[] = { "n_routing_groups=4" }, *const same[] = { "n_routing_groups=8" };
	ck_assert_int_eq(apply(&c, v3_json, clash, 1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "key 'n_routing_groups' is 4 but '") && strstr(err, "config.json' gives 8 (n_group)"),
		      "%s", err);
	ck_assert_msg(apply(&c, v3_json, same, 1, err, sizeof(err)) == 0, "%s", err);
	/* keys the file does not fix stay the user's */
	const char *const free_keys[] = { "max_target_length=512", "learning_rate=0.0001" };
	ck_assert_msg(apply(&c, v3_json, free_keys, 2, err, sizeof(err)) == 0, "%s", err);
	KEY_IS(&c, "max_target_length", "512");
}
END_TEST

/* What meshrun cannot compute is refused naming the file's key. */
START_TEST(test_config_refused)
{
	static struct cfg c;
	char err[1024];
	static const struct { const char *json, *needle; int rc; } bad[] = {
		{ "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
		  " \"num_attention_heads\": 4, \"vocab_size\": 256, \"rope_scaling\": {\"rope_type\": \"llama3\","
		  " \"factor\": 8}}", "rope_scaling 'llama3' is not supported", -EINVAL },
		{ "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
		  " \"num_attention_heads\": 4, \"vocab_size\": 256, \"hidden_act\": \"gelu\"}",
		  "hidden_act 'gelu' is not supported", -EINVAL },
		{ "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
		  " \"num_attention_heads\": 4, \"vocab_size\": 256, \"attention_bias\": true}",
		  "meshrun's layers have no biases", -EINVAL },
		{ "{\"model_type\": \"llama\", \"hidden_size\": \"64\", \"intermediate_size\": 96,"
		  " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 256}",
		  "'hidden_size' in config.json is not a number", -EBADMSG },
		{ "{\"model_type\": \"llama\", \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
		  " \"num_attention_heads\": 4, \"vocab_size\": 256}", "config.json has no 'hidden_size'", -EBADMSG },
		{ "{\"model_type\": \"mistral\"}", "model_type 'mistral' is not supported", -EBADMSG },
		{ "[1, 2]", "config.json is not a JSON object", -EBADMSG },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(apply(&c, bad[i].json, NULL, 0, err, sizeof(err)), bad[i].rc);
		ck_assert_msg(strstr(err, bad[i].needle) && strstr(err, "config.json"), "%zu: %s", i, err);
	}
	char json[4096];
	snprintf(json, sizeof(json), "%s", v3_json);
	memcpy(strstr(json, "\"scoring_func\": \"sigmoid\""), "\"scoring_func\": \"softmax\"", 25);
	ck_assert_int_eq(apply(&c, json, NULL, 0, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "deepseek_v3 routes by sigmoid scores"), "%s", err);
	snprintf(json, sizeof(json), "%s", v3_json);
	json[strlen(json) - 1] = 0;
	strcat(json, ", \"rope_interleave\": false}");
	ck_assert_int_eq(apply(&c, json, NULL, 0, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "rope_interleave false"), "%s", err);
}
END_TEST

/* The config.json meshrun writes reads back to the same keys; its label
 * is deepseek_v3 only for multi-head latent attention with V3's router. */
START_TEST(test_config_round_trip)
{
	static struct cfg c, back;
	static const struct { const char *kv, *type; } cases[] = {
		{ "base_num_kv_heads=2", "llama" },
		{ "num_experts=8 num_experts_per_tok=2 first_num_dense_layers=1 shared_experts=1 base_moe_mlp_dim=48 "
		  "routed_score_func=sigmoid routed_bias=true n_routing_groups=4 topk_routing_group=2 "
		  "routed_scaling_factor=2.5 base_num_kv_heads=2", "meshrun_moe" },
		{ "num_experts=8 num_experts_per_tok=2 base_moe_mlp_dim=24 routed_score_func=softmax norm_topk_prob=false",
		  "meshrun_moe" },
		{ "attention_type=mla num_experts=8 num_experts_per_tok=2 first_num_dense_layers=1 shared_experts=2 "
		  "base_moe_mlp_dim=48 routed_score_func=sigmoid routed_bias=true n_routing_groups=4 topk_routing_group=2 "
		  "q_lora_rank=24 kv_lora_rank=16 qk_nope_head_dim=8 qk_rope_head_dim=4 v_head_dim=8 rope_type=yarn "
		  "rope_factor=4 original_max_position_embeddings=64 beta_fast=32 beta_slow=1 mscale=0.707 "
		  "mscale_all_dim=0.707 base_num_kv_heads=4", "deepseek_v3" },
		{ "attention_type=mla q_lora_rank=0 kv_lora_rank=16 qk_nope_head_dim=8 qk_rope_head_dim=4 v_head_dim=8 "
		  "base_num_kv_heads=4", "deepseek_v3" },
		{ "attention_type=mla num_experts=8 num_experts_per_tok=2 routed_score_func=softmax base_moe_mlp_dim=24 kv_lora_rank=16 "
		  "qk_nope_head_dim=8 qk_rope_head_dim=4 v_head_dim=8 base_num_kv_heads=4", "meshrun_moe" },
	};
	static const char *const keys[] = {
		"base_emb_dim", "base_mlp_dim", "base_num_decoder_layers", "base_num_query_heads", "base_num_kv_heads",
		"vocab_size", "normalization_layer_epsilon", "rope_max_timescale", "logits_via_embedding",
		"num_experts", "num_experts_per_tok", "first_num_dense_layers", "shared_experts", "base_moe_mlp_dim",
		"routed_score_func", "routed_bias", "routed_scaling_factor", "norm_topk_prob", "attention_type",
		"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_type",
		"rope_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
		"mscale_all_dim",
	};
	char err[1024];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct model_dims d;
		char buf[1024], *save = NULL;
		cfg_defaults(&c);
		cfg_override(&c, "base_emb_dim=64", err, sizeof(err));
		cfg_override(&c, "base_mlp_dim=96", err, sizeof(err));
		cfg_override(&c, "normalization_layer_epsilon=1e-6", err, sizeof(err));
		snprintf(buf, sizeof(buf), "%s", cases[i].kv);
		for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
			ck_assert_msg(cfg_override(&c, w, err, sizeof(err)) == 0, "%s", err);
		/* the model's dims (attention itself aside: MLA builds elsewhere) */
		char att[CFG_STR];
		snprintf(att, sizeof(att), "%s", c.attention_type);
		snprintf(c.attention_type, sizeof(c.attention_type), "global");
		snprintf(c.rope_type, sizeof(c.rope_type), "default");
		ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
		snprintf(c.attention_type, sizeof(c.attention_type), "%s", att);
		if (strstr(cases[i].kv, "rope_type=yarn"))
			snprintf(c.rope_type, sizeof(c.rope_type), "yarn");
		cJSON *j = ckpt_config_json(&c, &d);
		char *text = cJSON_Print(j);
		cJSON_Delete(j);
		ck_assert_msg(strstr(text, cases[i].type), "case %zu: not %s:\n%s", i, cases[i].type, text);
		ck_assert_msg(apply(&back, text, NULL, 0, err, sizeof(err)) == 0, "case %zu: %s\n%s", i, err, text);
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			char a[CFG_STR], b[CFG_STR];
			cfg_value_text(&c, keys[k], a, sizeof(a));
			cfg_value_text(&back, keys[k], b, sizeof(b));
			/* no groups reads back as one group of all experts: the same routing */
			if (!strcmp(keys[k] + 1, "_routing_groups") || !strcmp(keys[k], "topk_routing_group"))
				continue;
			/* a dense model has no router keys to carry */
			if (!d.L_moe && strcmp(keys[k], "num_experts") &&
			    (strstr(keys[k], "expert") || strstr(keys[k], "routed") || strstr(keys[k], "topk") ||
			     !strcmp(keys[k], "first_num_dense_layers") || !strcmp(keys[k], "base_moe_mlp_dim")))
				continue;
			/* the MLA keys mean nothing to grouped-query attention */
			if (strcmp(c.attention_type, "mla") &&
			    (strstr(keys[k], "lora") || strstr(keys[k], "head_dim") || strstr(keys[k], "scale") ||
			     strstr(keys[k], "beta") || strstr(keys[k], "rope_") || strstr(keys[k], "original_")))
				continue;
			ck_assert_msg(!strcmp(a, b), "case %zu key %s: wrote %s, read back %s\n%s", i, keys[k], a, b, text);
		}
		if (d.groups) {
			KEY_IS(&back, "n_routing_groups", "4");
			KEY_IS(&back, "topk_routing_group", "2");
		}
		free(text);
	}
}
END_TEST

int main(void)
{
	(void)equivalence_opt;  /* equiv.h's helpers, of which this suite uses run and losses */
	Suite *s = suite_create("hfload");
	TCase *tc = tcase_create("reference");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_llama_equals_reference, 0,
			    (int)(sizeof(llama_variants) / sizeof(llama_variants[0])));
	tcase_add_test(tc, test_moe_equals_reference);
	tcase_add_test(tc, test_save_back);
	tcase_add_test(tc, test_moe_save_back);
	suite_add_tcase(s, tc);
	tc = tcase_create("config_json");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_config_deepseek_v3);
	tcase_add_test(tc, test_config_refused);
	tcase_add_test(tc, test_config_round_trip);
	suite_add_tcase(s, tc);
	tc = tcase_create("refusals");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_refused, 0, (int)(sizeof(refusals) / sizeof(refusals[0])));
	tcase_add_test(tc, test_refused_by_agents);
	tcase_add_test(tc, test_nothing_half_loaded);
	tcase_add_test(tc, test_out_of_memory_exit);
	suite_add_tcase(s, tc);
	tc = tcase_create("per_host");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_each_host_reads_its_part);
	tcase_add_test(tc, test_each_host_reads_its_experts);
	suite_add_tcase(s, tc);
	tc = tcase_create("memory");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_huge_pages_identical);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
