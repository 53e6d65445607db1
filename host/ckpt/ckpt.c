/* Checkpoints as Hugging Face style directories (host/ckpt/ckpt.h), one
 * per step (DIR/step-000004), each complete or absent:
 *   model.safetensors      Llama / DeepSeek-V3 tensor names (hf_suffix, the
 *                          one name table the loader uses too), [out, in],
 *                          F32 or BF16 (checkpoint_dtype)
 *   config.json            Hugging Face config keys (ckpt_config_json)
 *   meshrun.yml            the full meshrun config (eval and resume read it)
 *   optimizer.safetensors  optimizer state in our names, plus the step
 * Each file is synced, then the step directory is synced and renamed
 * from its *.tmp name; the step is recorded in both safetensors files and must agree on load. Parameter
 * slices are written straight from the one parameter allocation. */
#include "host/ckpt/ckpt.h"

#include <cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/ckpt/safetensors.h"
#include "host/config/config.h"
#include "host/model/model.h"
#include "host/util/fs.h"
#include "host/util/out.h"
#include "kernels/kernels.h"

#define MAX_TENSORS 65536

struct hf_list {
	struct st_tensor *t;
	char (*names)[128];
	int n, cap;
};

/* -E2BIG when the list is full (MAX_TENSORS) */
static int hf_add(struct hf_list *h, const char *name, const float *data, int ndim, const int *shape,
		  enum st_dtype dtype)
{
	if (h->n == h->cap)
		return -E2BIG;
	struct st_tensor *t = &h->t[h->n];
	snprintf(h->names[h->n], sizeof(h->names[0]), "%s", name);
	t->name = h->names[h->n];
	t->data = data;
	t->ndim = ndim;
	t->dtype = dtype;
	for (int i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	h->n++;
	return 0;
}

/* Hugging Face name of one per-layer slice of our stacked tensor. */
static const char *hf_suffix(const char *ours)
{
	static const char *const map[][2] = {
		{ "attn_norm", "input_layernorm.weight" },
		{ "wq", "self_attn.q_proj.weight" },
		{ "wk", "self_attn.k_proj.weight" },
		{ "wv", "self_attn.v_proj.weight" },
		{ "wo", "self_attn.o_proj.weight" },
		{ "wq_a", "self_attn.q_a_proj.weight" },
		{ "q_a_norm", "self_attn.q_a_layernorm.weight" },
		{ "wq_b", "self_attn.q_b_proj.weight" },
		{ "wkv_a", "self_attn.kv_a_proj_with_mqa.weight" },
		{ "kv_a_norm", "self_attn.kv_a_layernorm.weight" },
		{ "wkv_b", "self_attn.kv_b_proj.weight" },
		{ "mlp_norm", "post_attention_layernorm.weight" },
		{ "w_gate", "mlp.gate_proj.weight" },
		{ "w_up", "mlp.up_proj.weight" },
		{ "w_down", "mlp.down_proj.weight" },
		{ "router", "mlp.gate.weight" },
		{ "router_bias", "mlp.gate.e_score_correction_bias" },
		{ "s_gate", "mlp.shared_experts.gate_proj.weight" },
		{ "s_up", "mlp.shared_experts.up_proj.weight" },
		{ "s_down", "mlp.shared_experts.down_proj.weight" },
		{ "e_gate", "gate_proj.weight" },
		{ "e_up", "up_proj.weight" },
		{ "e_down", "down_proj.weight" },
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i][0], ours))
			return map[i][1];
	return NULL;
}

int ckpt_hf_layer0(const struct model *m, const struct param_info *p)
{
	/* stacked: dense tensors start at layer 0, MoE tensors at L_dense */
	bool moe = !strncmp(p->name, "router", 6) || !strncmp(p->name, "e_", 2) ||
		   !strncmp(p->name, "s_", 2);
	return moe ? model_dims(m)->L_dense : 0;
}

int ckpt_hf_name(const struct model *m, const struct param_info *p, int layer, int expert, char *out,
		 size_t outlen)
{
	(void)m;
	const char *suffix = hf_suffix(p->name);
	int n;
	if (!strcmp(p->name, "embed"))
		n = snprintf(out, outlen, "model.embed_tokens.weight");
	else if (!strcmp(p->name, "final_norm"))
		n = snprintf(out, outlen, "model.norm.weight");
	else if (!strcmp(p->name, "lm_head"))
		n = snprintf(out, outlen, "lm_head.weight");
	else if (!suffix || !p->stacked)
		return -ENOENT;
	else if (expert >= 0)
		n = snprintf(out, outlen, "model.layers.%d.mlp.experts.%d.%s", layer, expert, suffix);
	else
		n = snprintf(out, outlen, "model.layers.%d.%s", layer, suffix);
	return n > 0 && (size_t)n < outlen ? 0 : -ENAMETOOLONG;
}

bool ckpt_hf_per_expert(const struct param_info *p)
{
	return !strncmp(p->name, "e_", 2);
}

/* Lists every Hugging Face tensor of the model as a view into buf (params
 * or an optimizer buffer in the same layout). prefix is prepended;
 * bf16: model weights stored as BF16 (the router's correction bias, not
 * trained by the optimizer, stays F32 as in DeepSeek-V3's files). */
static int hf_tensors(struct model *m, const float *buf, const char *prefix, struct hf_list *h, bool bf16)
{
	char name[128], full[160];
	int rc = 0;

	for (int i = 0; i < model_num_params(m) && !rc; i++) {
		const struct param_info *p = model_param(m, i);
		const float *base = buf + p->offset;
		enum st_dtype dt = bf16 && p->opt != OPT_NONE ? ST_BF16 : ST_F32;
		if (!p->stacked) {
			if ((rc = ckpt_hf_name(m, p, -1, -1, name, sizeof(name))))
				break;
			snprintf(full, sizeof(full), "%s%s", prefix, name);
			rc = hf_add(h, full, base, p->ndim, p->shape, dt);
			continue;
		}
		int l0 = ckpt_hf_layer0(m, p);
		size_t per = p->numel / (size_t)p->shape[0];
		for (int l = 0; l < p->shape[0] && !rc; l++) {
			const float *slice = base + per * (size_t)l;
			if (ckpt_hf_per_expert(p)) {
				/* experts: [E, rows, cols] -> one tensor per expert */
				size_t pe = per / (size_t)p->shape[1];
				for (int e = 0; e < p->shape[1] && !rc; e++) {
					if ((rc = ckpt_hf_name(m, p, l0 + l, e, name, sizeof(name))))
						break;
					snprintf(full, sizeof(full), "%s%s", prefix, name);
					rc = hf_add(h, full, slice + pe * (size_t)e, p->ndim - 2, p->shape + 2, dt);
				}
			} else if (!(rc = ckpt_hf_name(m, p, l0 + l, -1, name, sizeof(name)))) {
				snprintf(full, sizeof(full), "%s%s", prefix, name);
				rc = hf_add(h, full, slice, p->ndim - 1, p->shape + 1, dt);
			}
		}
	}
	return rc;
}

static int hf_list_init(struct hf_list *h, int cap)
{
	h->t = calloc((size_t)cap, sizeof(*h->t));
	h->names = calloc((size_t)cap, sizeof(*h->names));
	h->n = 0;
	h->cap = cap;
	return h->t && h->names ? 0 : -ENOMEM;
}

static void hf_list_free(struct hf_list *h)
{
	free(h->t);
	free(h->names);
}

static void add_num(cJSON *j, const char *k, double v)
{
	cJSON_AddNumberToObject(j, k, v);
}

/* DeepSeek-V3's MoE keys (a dense model: every layer before
 * first_k_dense_replace). */
static void write_moe(cJSON *j, const struct cfg *c, const struct model_dims *d)
{
	bool moe = d->L_moe > 0;
	add_num(j, "n_routed_experts", moe ? d->E : 1);
	add_num(j, "num_experts_per_tok", moe ? d->K : 1);
	add_num(j, "moe_intermediate_size", moe ? d->Fe : d->F);
	add_num(j, "n_shared_experts", moe ? d->S : 0);
	add_num(j, "first_k_dense_replace", moe ? d->L_dense : d->L);
	add_num(j, "n_group", d->groups > 1 ? d->groups : 1);
	add_num(j, "topk_group", d->groups > 1 ? d->topk_groups : 1);
	cJSON_AddStringToObject(j, "scoring_func", d->moe_score == MOE_SOFTMAX ? "softmax" : "sigmoid");
	cJSON_AddStringToObject(j, "topk_method", d->router_bias ? "noaux_tc" : "greedy");
	cJSON_AddBoolToObject(j, "norm_topk_prob", d->norm_topk);
	add_num(j, "routed_scaling_factor", c->routed_scaling_factor);
}

/* Multi-head latent attention's keys, from the config (MaxText's names). */
static void write_mla(cJSON *j, const struct cfg *c)
{
	add_num(j, "kv_lora_rank", (double)c->kv_lora_rank);
	if (c->q_lora_rank)
		add_num(j, "q_lora_rank", (double)c->q_lora_rank);
	else
		cJSON_AddNullToObject(j, "q_lora_rank");
	add_num(j, "qk_nope_head_dim", (double)c->qk_nope_head_dim);
	add_num(j, "qk_rope_head_dim", (double)c->qk_rope_head_dim);
	add_num(j, "v_head_dim", (double)c->v_head_dim);
	add_num(j, "head_dim", (double)c->qk_rope_head_dim);
	cJSON_AddBoolToObject(j, "rope_interleave", true);
	if (strcmp(c->rope_type, "yarn")) {
		cJSON_AddNullToObject(j, "rope_scaling");
		return;
	}
	cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
	cJSON_AddStringToObject(rs, "type", "yarn");
	cJSON_AddStringToObject(rs, "rope_type", "yarn");
	add_num(rs, "factor", c->rope_factor);
	add_num(rs, "original_max_position_embeddings", (double)c->original_max_position_embeddings);
	add_num(rs, "beta_fast", c->beta_fast);
	add_num(rs, "beta_slow", c->beta_slow);
	add_num(rs, "mscale", c->mscale);
	add_num(rs, "mscale_all_dim", c->mscale_all_dim);
}

struct cJSON *ckpt_config_json(const struct cfg *c, const struct model_dims *d)
{
	bool mla = !strcmp(c->attention_type, "mla"), moe = d->L_moe > 0;
	bool v3_router = !moe || (d->moe_score == MOE_SIGMOID && d->router_bias);
	const char *type = !mla && !moe ? "llama" : mla && v3_router ? "deepseek_v3" : "meshrun_moe";
	const char *arch = !strcmp(type, "llama") ? "LlamaForCausalLM"
			   : !strcmp(type, "deepseek_v3") ? "DeepseekV3ForCausalLM" : "MeshrunMoeForCausalLM";
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return NULL;
	cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "architectures"), cJSON_CreateString(arch));
	cJSON_AddStringToObject(j, "model_type", type);
	add_num(j, "hidden_size", d->C);
	add_num(j, "intermediate_size", d->F);
	add_num(j, "num_attention_heads", d->Hq);
	add_num(j, "num_key_value_heads", mla ? d->Hq : d->Hkv);
	if (!mla)
		add_num(j, "head_dim", d->D);
	add_num(j, "num_hidden_layers", d->L);
	add_num(j, "vocab_size", d->V);
	add_num(j, "rms_norm_eps", c->normalization_layer_epsilon);
	add_num(j, "rope_theta", c->rope_max_timescale);
	add_num(j, "max_position_embeddings", d->T);
	cJSON_AddBoolToObject(j, "tie_word_embeddings", d->tied);
	cJSON_AddStringToObject(j, "hidden_act", "silu");
	cJSON_AddBoolToObject(j, "attention_bias", false);
	if (!mla)
		cJSON_AddBoolToObject(j, "mlp_bias", false);
	cJSON_AddStringToObject(j, "torch_dtype", strcmp(c->checkpoint_dtype, "bf16") ? "float32" : "bfloat16");
	if (mla)
		write_mla(j, c);
	if (strcmp(type, "llama"))
		write_moe(j, c, d);
	if (!strcmp(type, "meshrun_moe"))
		cJSON_AddStringToObject(j, "meshrun_attention_type", mla ? "mla" : "global");
	cJSON_AddStringToObject(j, "meshrun_opt_type", c->opt_type);
	return j;
}

static int write_config_json(const struct cfg *c, const struct model_dims *d, const char *path,
			     char *err, size_t errlen)
{
	cJSON *j = ckpt_config_json(c, d);
	if (!j) {
		snprintf(err, errlen, "checkpoint: out of memory for config.json");
		return -ENOMEM;
	}
	int rc = json_write_atomic(path, j, err, errlen);
	cJSON_Delete(j);
	return rc;
}

/* Test-only (ckpt.h): a pause after each file of a checkpoint. */
static void test_delay(void)
{
	const char *v = getenv("MESHRUN_TEST_CKPT_DELAY_MS");
	long ms = v ? strtol(v, NULL, 10) : 0;
	if (ms > 0) {
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* fsync of a file or directory by path. */
static int sync_path(const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return util_file_err(err, errlen, "checkpoint", "sync", path, e);
	}
	close(fd);
	return 0;
}

/* "step-<digits>" (complete) or "step-<digits>.tmp" (being written). */
static bool step_name(const char *name, int64_t *step, bool *tmp)
{
	if (strncmp(name, "step-", 5) || !isdigit((unsigned char)name[5]))
		return false;
	char *end;
	errno = 0;
	long long v = strtoll(name + 5, &end, 10);
	if (errno || v < 0)
		return false;
	*step = v;
	*tmp = !strcmp(end, ".tmp");
	return !*end || *tmp;
}

/* After step `keep` is complete: every older step directory and every
 * stale *.tmp goes. */
static void prune(const char *dir, int64_t keep)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4400];
	if (!d)
		return;
	while ((e = readdir(d))) {
		int64_t step;
		bool tmp;
		if (!step_name(e->d_name, &step, &tmp) || (!tmp && step >= keep))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		util_remove_flat_dir(path);
	}
	closedir(d);
}

/* The four files of one checkpoint into dir. */
static int write_files(const struct ckpt_state *s, const char *dir, char *err, size_t errlen)
{
	struct model *m = s->model;
	struct hf_list h;
	char path[4400], stepbuf[32];
	int rc;

	if (hf_list_init(&h, MAX_TENSORS)) {
		hf_list_free(&h);
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	char batchbuf[32], idbuf[32], sample[32], epoch_rows[32];
	uint64_t id;
	snprintf(stepbuf, sizeof(stepbuf), "%" PRId64, s->next_step);
	snprintf(batchbuf, sizeof(batchbuf), "%" PRId64, s->global_batch);
	snprintf(sample, sizeof(sample), "%" PRId64, s->data_sample);
	snprintf(epoch_rows, sizeof(epoch_rows), "%" PRId64, s->data_epoch_rows);
	if (getrandom(&id, sizeof(id), 0) != sizeof(id))
		id = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	snprintf(idbuf, sizeof(idbuf), "%016" PRIx64, id);
	const char *meta[] = { "format", "pt", "meshrun_step", stepbuf, "meshrun_id", idbuf,
			       "meshrun_data_sample", sample, "meshrun_data_epoch_rows", epoch_rows,
			       s->global_batch > 0 ? "meshrun_global_batch" : NULL, batchbuf, NULL };

	if ((rc = hf_tensors(m, s->params, "", &h, !strcmp(s->cfg->checkpoint_dtype, "bf16"))))
		goto out_free;
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if ((rc = st_write(path, h.t, h.n, meta, err, errlen)))
		goto out_free;
	test_delay();

	h.n = 0;
	if ((rc = hf_tensors(m, s->m, "m.", &h, false)) ||
	    (rc = hf_tensors(m, s->v, "v.", &h, false)))
		goto out_free;
	snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
	if ((rc = st_write(path, h.t, h.n, meta, err, errlen)))
		goto out_free;
	test_delay();

	snprintf(path, sizeof(path), "%s/config.json", dir);
	/* a mesh's whole-model table is built for one token (trainer_ckpt_prepare):
	 * max_position_embeddings is the run's sequence length */
	struct model_dims d = *model_dims(m);
	d.T = (int)s->cfg->max_target_length;
	if ((rc = write_config_json(s->cfg, &d, path, err, errlen)))
		goto out_free;
	test_delay();
	snprintf(path, sizeof(path), "%s/meshrun.yml", dir);
	if ((rc = cfg_write_yaml(s->cfg, path, err, errlen)) ||
	    (rc = sync_path(path, err, errlen)))
		goto out_free;
	test_delay();
out_free:
	if (rc == -E2BIG)
		snprintf(err, errlen, "checkpoint: more than %d tensors", MAX_TENSORS);
	hf_list_free(&h);
	return rc;
}

/* Renames the complete tmp to final; a final already there (the same
 * step saved again) is swapped out atomically and removed. */
static int publish(const char *tmp, const char *final, char *err, size_t errlen)
{
	if (!rename(tmp, final))
		return 0;
	if ((errno == ENOTEMPTY || errno == EEXIST) &&
	    !renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE)) {
		util_remove_flat_dir(tmp);
		return 0;
	}
	char es[128];
	int e = errno;
	snprintf(err, errlen, "checkpoint: unable to rename '%s' to '%s': %s", tmp, final,
		 util_errstr(e, es, sizeof(es)));
	return -e;
}

int ckpt_save(const struct ckpt_state *s, const char *dir, char *err, size_t errlen)
{
	char tmp[4110], final[4096];
	int rc;

	if ((rc = util_mkdir_p("checkpoint", dir, err, errlen)))
		return rc;
	snprintf(final, sizeof(final), "%s/step-%06" PRId64, dir, s->next_step);
	snprintf(tmp, sizeof(tmp), "%s.tmp", final);
	util_remove_flat_dir(tmp);   /* a crashed writer's */
	if (mkdir(tmp, 0755))
		return util_file_err(err, errlen, "checkpoint", "create directory", tmp, errno);
	if ((rc = write_files(s, tmp, err, errlen)) ||
	    (rc = sync_path(tmp, err, errlen)) ||
	    (rc = publish(tmp, final, err, errlen))) {
		/* nothing partial stays; the previous checkpoint is untouched */
		util_remove_flat_dir(tmp);
		return rc;
	}
	if ((rc = sync_path(dir, err, errlen)))
		return rc;
	prune(dir, s->next_step);
	return 0;
}

int ckpt_find(const char *dir, char *out, size_t outlen, int64_t *step, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int64_t best = -1;
	char path[4200];
	if (step)
		*step = -1;
	while (d && (e = readdir(d))) {
		int64_t n;
		bool tmp;
		if (step_name(e->d_name, &n, &tmp) && !tmp && n > best)
			best = n;
	}
	if (d)
		closedir(d);
	if (best >= 0) {
		snprintf(out, outlen, "%s/step-%06" PRId64, dir, best);
		if (step)
			*step = best;
		return 0;
	}
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	bool one = !access(path, F_OK);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	if (one || !access(path, F_OK)) {
		snprintf(out, outlen, "%s", dir);
		return 0;
	}
	snprintf(err, errlen, "checkpoint: no complete checkpoint in '%s'", dir);
	return -EBADMSG;
}

/* Copies every listed tensor from f into its slot (the list's data pointers
 * are views into our buffers). */
static int load_tensors(struct st_file *f, const char *path, const struct hf_list *h,
			char *err, size_t errlen)
{
	if (st_count(f) != h->n) {
		snprintf(err, errlen, "checkpoint: '%s' has %d tensors, the model has %d",
			 path, st_count(f), h->n);
		return -EINVAL;
	}
	for (int i = 0; i < h->n; i++) {
		const struct st_tensor *t = &h->t[i];
		const struct st_entry *e = st_find(f, t->name);
		if (!e) {
			snprintf(err, errlen, "checkpoint: '%s' has no tensor '%s'", path, t->name);
			return -EINVAL;
		}
		bool same = e->ndim == t->ndim;
		size_t n = 1;
		for (int k = 0; same && k < t->ndim; k++) {
			same = e->shape[k] == t->shape[k];
			n *= (size_t)t->shape[k];
		}
		if (!same) {
			snprintf(err, errlen, "checkpoint: '%s': tensor '%s' has a different shape than the model",
				 path, t->name);
			return -EINVAL;
		}
		memcpy((float *)t->data, e->data, n * sizeof(float));
	}
	return 0;
}

/* The data position in f's metadata into s; -1 when absent (written
 * before checkpoints had one). */
static int load_data_pos(struct st_file *f, const char *path, struct ckpt_state *s, char *err,
			 size_t errlen)
{
	const char *v[2] = { st_meta(f, "meshrun_data_sample"), st_meta(f, "meshrun_data_epoch_rows") };
	int64_t *out[2] = { &s->data_sample, &s->data_epoch_rows };
	for (int i = 0; i < 2; i++) {
		char *end;
		*out[i] = v[i] ? strtoll(v[i], &end, 10) : -1;
		if (v[i] && (*end || !*v[i] || *out[i] < 0)) {
			snprintf(err, errlen, "checkpoint: '%s' has invalid %s metadata '%s'", path,
				 i ? "meshrun_data_epoch_rows" : "meshrun_data_sample", v[i]);
			return -EINVAL;
		}
	}
	return 0;
}

static int load_one(const char *path, const struct hf_list *h, int64_t *step, struct ckpt_state *pos,
		    char *err, size_t errlen)
{
	struct st_file *f = st_open(path, err, errlen);
	if (!f)
		return errno == ENOMEM ? -ENOMEM : -EINVAL;
	int rc = load_tensors(f, path, h, err, errlen);
	if (!rc && pos)
		rc = load_data_pos(f, path, pos, err, errlen);
	const char *s = st_meta(f, "meshrun_step");
	if (!rc && step) {
		char *end;
		*step = s ? strtoll(s, &end, 10) : -1;
		if (!s || *end || *step < 0) {
			snprintf(err, errlen, "checkpoint: '%s' has no valid meshrun_step metadata", path);
			rc = -EINVAL;
		}
	}
	st_close(f);
	return rc;
}

int ckpt_load(struct ckpt_state *s, const char *run_dir, bool optimizer, char *err, size_t errlen)
{
	struct model *m = s->model;
	struct hf_list h;
	char path[4200], dir[4096];
	int64_t s1 = -1, s2 = -1;
	int rc;

	if ((rc = ckpt_find(run_dir, dir, sizeof(dir), NULL, err, errlen)))
		return rc;
	if (hf_list_init(&h, MAX_TENSORS)) {
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	if ((rc = hf_tensors(m, s->params, "", &h, false)))
		goto out;
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if ((rc = load_one(path, &h, &s1, optimizer ? s : NULL, err, errlen)))
		goto out;
	if (optimizer) {
		h.n = 0;
		if ((rc = hf_tensors(m, s->m, "m.", &h, false)) ||
		    (rc = hf_tensors(m, s->v, "v.", &h, false)))
			goto out;
		snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
		if ((rc = load_one(path, &h, &s2, NULL, err, errlen)))
			goto out;
		if (s1 != s2) {
			snprintf(err, errlen, "checkpoint: '%s': model is at step %" PRId64 " but optimizer at %" PRId64,
				 dir, s1, s2);
			rc = -EINVAL;
			goto out;
		}
		s->next_step = s1;
	}
out:
	if (rc == -E2BIG)
		snprintf(err, errlen, "checkpoint: more than %d tensors", MAX_TENSORS);
	hf_list_free(&h);
	/* whatever went wrong reading it, the checkpoint is bad input */
	return rc && rc != -ENOMEM ? -EBADMSG : rc;
}
