/* See host/ckpt/hf_config.h. Reading builds a list of (our key, value,
 * the file's key) from config.json, then applies it to the config key by
 * key, refusing a contradiction with a key the user fixed. The defaults
 * for keys a file leaves out are those of transformers' LlamaConfig and
 * DeepseekV3Config, so the model built is the one Hugging Face builds. */
#include "host/ckpt/hf_config.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/ckpt/ckpt.h"
#include "host/ckpt/safetensors.h"
#include "host/config/config.h"

#define HF_MAX_KEYS 48

/* One model key the file fixes: our key, its value, and the file's key
 * it came from (for messages). */
struct hf_kv {
	const char *key, *from;
	char val[64];
};

/* A config.json being read: the keys found so far, the first error. */
struct rd {
	const cJSON *j;
	const char *path;
	const char *type;        /* model_type */
	struct hf_kv kv[HF_MAX_KEYS];
	int n, rc;
	char *err;
	size_t errlen;
};

static void fail(struct rd *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct rd *r, int rc, const char *fmt, ...)
{
	va_list ap;
	if (r->rc)
		return;
	r->rc = rc;
	int used = snprintf(r->err, r->errlen, "checkpoint: '%s': ", r->path);
	va_start(ap, fmt);
	if (used >= 0 && (size_t)used < r->errlen)
		vsnprintf(r->err + used, r->errlen - (size_t)used, fmt, ap);
	va_end(ap);
}

static void put(struct rd *r, const char *key, const char *from, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void put(struct rd *r, const char *key, const char *from, const char *fmt, ...)
{
	va_list ap;
	if (r->n == HF_MAX_KEYS)
		return;
	struct hf_kv *kv = &r->kv[r->n++];
	kv->key = key;
	kv->from = from;
	va_start(ap, fmt);
	vsnprintf(kv->val, sizeof(kv->val), fmt, ap);
	va_end(ap);
}

/* The item at k, or NULL when absent or null. */
static const cJSON *item(const struct rd *r, const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o ? o : r->j, k);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number (def when absent; required: absent is an error). */
static double num(struct rd *r, const cJSON *o, const char *k, double def, bool required)
{
	const cJSON *v = item(r, o, k);
	if (!v) {
		if (required)
			fail(r, -EBADMSG, "config.json has no '%s'", k);
		return def;
	}
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
		fail(r, -EBADMSG, "'%s' in config.json is not a number", k);
		return def;
	}
	return v->valuedouble;
}

/* A non-negative integer below 2^31. */
static int integer(struct rd *r, const cJSON *o, const char *k, int def, bool required)
{
	double d = num(r, o, k, def, required);
	if (!(d >= 0 && d < 2147483648.0) || d != floor(d)) {
		fail(r, -EBADMSG, "'%s' in config.json is not a non-negative integer", k);
		return def;
	}
	return (int)d;
}

static bool boolean(struct rd *r, const char *k, bool def)
{
	const cJSON *v = item(r, NULL, k);
	if (!v)
		return def;
	if (!cJSON_IsBool(v))
		fail(r, -EBADMSG, "'%s' in config.json is not true or false", k);
	return cJSON_IsTrue(v);
}

static const char *str(struct rd *r, const char *k, const char *def)
{
	const cJSON *v = item(r, NULL, k);
	if (!v)
		return def;
	if (!cJSON_IsString(v)) {
		fail(r, -EBADMSG, "'%s' in config.json is not a string", k);
		return def;
	}
	return v->valuestring;
}

/* What every supported model shares: width, depth, vocabulary, norms,
 * the feed-forward's activation, no biases. */
static void read_common(struct rd *r)
{
	put(r, "base_emb_dim", "hidden_size", "%d", integer(r, NULL, "hidden_size", 0, true));
	put(r, "base_mlp_dim", "intermediate_size", "%d", integer(r, NULL, "intermediate_size", 0, true));
	put(r, "base_num_decoder_layers", "num_hidden_layers", "%d",
	    integer(r, NULL, "num_hidden_layers", 0, true));
	put(r, "vocab_size", "vocab_size", "%d", integer(r, NULL, "vocab_size", 0, true));
	put(r, "normalization_layer_epsilon", "rms_norm_eps", "%.17g",
	    num(r, NULL, "rms_norm_eps", 1e-6, false));
	put(r, "rope_max_timescale", "rope_theta", "%.17g", num(r, NULL, "rope_theta", 10000, false));
	put(r, "logits_via_embedding", "tie_word_embeddings", "%s",
	    boolean(r, "tie_word_embeddings", false) ? "true" : "false");
	const char *act = str(r, "hidden_act", "silu");
	if (strcmp(act, "silu"))
		fail(r, -EINVAL, "hidden_act '%.40s' is not supported (SwiGLU: silu)", act);
	if (boolean(r, "attention_bias", false) || boolean(r, "mlp_bias", false))
		fail(r, -EINVAL, "attention_bias / mlp_bias: meshrun's layers have no biases");
}

/* Grouped-query attention with Llama's rotary embedding (no scaling). */
static void read_gqa(struct rd *r)
{
	int H = integer(r, NULL, "num_attention_heads", 0, true);
	int C = integer(r, NULL, "hidden_size", 0, true);
	put(r, "attention_type", "model_type", "global");
	put(r, "base_num_query_heads", "num_attention_heads", "%d", H);
	put(r, "base_num_kv_heads", "num_key_value_heads", "%d",
	    integer(r, NULL, "num_key_value_heads", H, false));
	put(r, "head_dim", "head_dim", "%d", integer(r, NULL, "head_dim", H ? C / H : 0, false));
	const cJSON *rs = item(r, NULL, "rope_scaling");
	const cJSON *t = rs ? cJSON_GetObjectItemCaseSensitive(rs, "rope_type") : NULL;
	if (rs && !t)
		t = cJSON_GetObjectItemCaseSensitive(rs, "type");
	if (rs && (!cJSON_IsString(t) || strcmp(t->valuestring, "default")))
		fail(r, -EINVAL, "rope_scaling '%.40s' is not supported with grouped-query attention",
		     cJSON_IsString(t) ? t->valuestring : "?");
	put(r, "rope_type", "rope_scaling", "default");
}

/* Multi-head latent attention and its rotary scaling (DeepSeek-V3). */
static void read_mla(struct rd *r)
{
	int H = integer(r, NULL, "num_attention_heads", 0, true);
	put(r, "attention_type", "model_type", "mla");
	put(r, "base_num_query_heads", "num_attention_heads", "%d", H);
	put(r, "base_num_kv_heads", "num_attention_heads", "%d", H);
	put(r, "q_lora_rank", "q_lora_rank", "%d", integer(r, NULL, "q_lora_rank", 0, false));
	if (!cJSON_GetObjectItemCaseSensitive(r->j, "q_lora_rank"))  /* absent: HF's 1536; null: 0 */
		snprintf(r->kv[r->n - 1].val, sizeof(r->kv[0].val), "1536");
	put(r, "kv_lora_rank", "kv_lora_rank", "%d", integer(r, NULL, "kv_lora_rank", 512, false));
	put(r, "qk_nope_head_dim", "qk_nope_head_dim", "%d", integer(r, NULL, "qk_nope_head_dim", 128, false));
	put(r, "qk_rope_head_dim", "qk_rope_head_dim", "%d", integer(r, NULL, "qk_rope_head_dim", 64, false));
	put(r, "v_head_dim", "v_head_dim", "%d", integer(r, NULL, "v_head_dim", 128, false));
	if (!boolean(r, "rope_interleave", true))
		fail(r, -EINVAL, "rope_interleave false is not supported (rotary pairs adjacent dimensions)");
	const cJSON *rs = item(r, NULL, "rope_scaling");
	if (!rs) {
		put(r, "rope_type", "rope_scaling", "default");
		return;
	}
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
	if (!t)
		t = cJSON_GetObjectItemCaseSensitive(rs, "type");
	if (!cJSON_IsString(t) || (strcmp(t->valuestring, "yarn") && strcmp(t->valuestring, "default"))) {
		fail(r, -EINVAL, "rope_scaling '%.40s' is not supported (default or yarn)",
		     cJSON_IsString(t) ? t->valuestring : "?");
		return;
	}
	put(r, "rope_type", "rope_scaling.type", "%s", t->valuestring);
	if (strcmp(t->valuestring, "yarn"))
		return;
	put(r, "rope_factor", "rope_scaling.factor", "%.17g", num(r, rs, "factor", 0, true));
	int omax = integer(r, rs, "original_max_position_embeddings", 0, false);
	if (!omax)  /* Hugging Face falls back on max_position_embeddings */
		omax = integer(r, NULL, "max_position_embeddings", 0, true);
	put(r, "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings", "%d", omax);
	put(r, "beta_fast", "rope_scaling.beta_fast", "%.17g", num(r, rs, "beta_fast", 32, false));
	put(r, "beta_slow", "rope_scaling.beta_slow", "%.17g", num(r, rs, "beta_slow", 1, false));
	put(r, "mscale", "rope_scaling.mscale", "%.17g", num(r, rs, "mscale", 1, false));
	put(r, "mscale_all_dim", "rope_scaling.mscale_all_dim", "%.17g", num(r, rs, "mscale_all_dim", 0, false));
}

/* DeepSeek-V3's mixture of experts (any_score: meshrun_moe's softmax or
 * sigmoid and optional bias; deepseek_v3: sigmoid with the bias). */
static void read_moe(struct rd *r, bool any_score)
{
	int L = integer(r, NULL, "num_hidden_layers", 0, true);
	int dense = integer(r, NULL, "first_k_dense_replace", 3, false);
	int E = integer(r, NULL, "n_routed_experts", 256, false);
	put(r, "first_num_dense_layers", "first_k_dense_replace", "%d", dense < L ? dense : 0);
	if (dense >= L) {  /* every layer dense: no router anywhere */
		put(r, "num_experts", "first_k_dense_replace", "1");
		return;
	}
	if (E < 2)
		fail(r, -EINVAL, "n_routed_experts %d: a mixture of experts needs at least 2", E);
	put(r, "num_experts", "n_routed_experts", "%d", E);
	put(r, "num_experts_per_tok", "num_experts_per_tok", "%d", integer(r, NULL, "num_experts_per_tok", 8, false));
	put(r, "base_moe_mlp_dim", "moe_intermediate_size", "%d", integer(r, NULL, "moe_intermediate_size", 2048, false));
	put(r, "shared_experts", "n_shared_experts", "%d", integer(r, NULL, "n_shared_experts", 1, false));
	put(r, "routed_scaling_factor", "routed_scaling_factor", "%.17g",
	    num(r, NULL, "routed_scaling_factor", 2.5, false));
	put(r, "norm_topk_prob", "norm_topk_prob", "%s", boolean(r, "norm_topk_prob", true) ? "true" : "false");
	int G = integer(r, NULL, "n_group", 8, false), T = integer(r, NULL, "topk_group", 4, false);
	put(r, "n_routing_groups", "n_group", "%d", G);
	put(r, "topk_routing_group", "topk_group", "%d", T);
	const char *score = str(r, "scoring_func", "sigmoid");
	const char *method = str(r, "topk_method", "noaux_tc");
	if (!any_score && (strcmp(score, "sigmoid") || strcmp(method, "noaux_tc")))
		fail(r, -EINVAL, "scoring_func '%.20s' / topk_method '%.20s': deepseek_v3 routes by sigmoid "
		     "scores with the correction bias (sigmoid, noaux_tc)", score, method);
	if (strcmp(score, "sigmoid") && strcmp(score, "softmax"))
		fail(r, -EINVAL, "scoring_func '%.20s' is not supported (sigmoid, softmax)", score);
	put(r, "routed_score_func", "scoring_func", "%s", score);
	put(r, "routed_bias", "topk_method", "%s", strcmp(method, "noaux_tc") ? "false" : "true");
}

/* Reads the model keys of config.json at path into r. */
static void read_config(struct rd *r)
{
	const char *type = r->type = str(r, "model_type", "");
	if (strcmp(type, "llama") && strcmp(type, "deepseek_v3") && strcmp(type, "meshrun_moe"))
		fail(r, -EBADMSG, "model_type '%.40s' is not supported (llama, deepseek_v3, meshrun_moe)", type);
	if (r->rc)
		return;
	read_common(r);
	if (!strcmp(type, "llama")) {
		put(r, "num_experts", "model_type", "1");
		read_gqa(r);
	} else if (!strcmp(type, "deepseek_v3")) {
		read_mla(r);
		read_moe(r, false);
	} else if (!strcmp(type, "meshrun_moe")) {
		const char *att = str(r, "meshrun_attention_type", "global");
		if (!strcmp(att, "mla"))
			read_mla(r);
		else
			read_gqa(r);
		read_moe(r, true);
	}
}

static bool on_cmdline(const char *key, const char *const *cmdline, int n)
{
	size_t kl = strlen(key);
	for (int i = 0; i < n; i++)
		if (!strncmp(cmdline[i], key, kl) && cmdline[i][kl] == '=')
			return true;
	return false;
}

/* Sets the keys of r in c, refusing a contradiction with a fixed key. */
static int apply_keys(struct cfg *c, const struct rd *r, const char *const *cmdline, int n,
		      char *err, size_t errlen)
{
	static struct cfg def, scratch;
	char mine[CFG_STR], theirs[CFG_STR], dflt[CFG_STR], kv[CFG_STR + 64];
	cfg_defaults(&def);
	scratch = def;
	for (int i = 0; i < r->n; i++) {
		const struct hf_kv *k = &r->kv[i];
		snprintf(kv, sizeof(kv), "%s=%s", k->key, k->val);
		/* the file's value as the config holds it */
		if (cfg_override(&scratch, kv, err, errlen))
			return -EINVAL;
		cfg_value_text(&scratch, k->key, theirs, sizeof(theirs));
		cfg_value_text(c, k->key, mine, sizeof(mine));
		cfg_value_text(&def, k->key, dflt, sizeof(dflt));
		bool fixed = on_cmdline(k->key, cmdline, n) || strcmp(mine, dflt);
		if (fixed && strcmp(mine, theirs)) {
			bool type = !strcmp(k->from, "model_type");
			snprintf(err, errlen, "config: key '%s' is %s but '%s' gives %s (%s%s%s%s) (load_parameters_path)",
				 k->key, mine, r->path, theirs, k->from, type ? " '" : "", type ? r->type : "",
				 type ? "'" : "");
			return -EINVAL;
		}
		cfg_override_at(c, kv, r->path, err, errlen);
	}
	return 0;
}

int hf_config_apply(struct cfg *c, const char *const *cmdline, int n, char *err, size_t errlen)
{
	char dir[4096], abs[PATH_MAX], path[PATH_MAX + 16];
	struct rd *r;
	if (!c->load_parameters_path[0])
		return 0;
	if (ckpt_find(c->load_parameters_path, dir, sizeof(dir), NULL, err, errlen))
		return -EBADMSG;
	if (!realpath(dir, abs)) {
		snprintf(err, errlen, "checkpoint: unable to resolve '%s'", dir);
		return -EBADMSG;
	}
	if (strlen(abs) >= sizeof(c->load_parameters_path)) {
		snprintf(err, errlen, "config: key 'load_parameters_path': '%s' is longer than %d bytes",
			 abs, CFG_STR - 1);
		return -EINVAL;
	}
	snprintf(c->load_parameters_path, sizeof(c->load_parameters_path), "%s", abs);
	snprintf(path, sizeof(path), "%s/config.json", abs);
	cJSON *j = json_read_file(path, err, errlen);
	if (!j)
		return -EBADMSG;
	if (!(r = calloc(1, sizeof(*r)))) {
		cJSON_Delete(j);
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	*r = (struct rd){ .j = j, .path = path, .err = err, .errlen = errlen };
	if (!cJSON_IsObject(j))
		fail(r, -EBADMSG, "config.json is not a JSON object");
	else
		read_config(r);
	int rc = r->rc ? r->rc : apply_keys(c, r, cmdline, n, err, errlen);
	free(r);
	cJSON_Delete(j);
	return rc;
}
