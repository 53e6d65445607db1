/* Config loading: defaults agree with configs/base.yml, presets load, and
 * every kind of bad input is refused naming the key and where it was. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"

static char err[1024];

static const char *write_tmp(const char *text)
{
	static char path[64];
	strcpy(path, "/tmp/meshrun-cfg-XXXXXX");
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

/* Every key of the table, by name (CFG_KEYS). */
#define KEY_NAME(t, name, def, hash, help) #name,
static const char *const key_names[] = { CFG_KEYS(KEY_NAME) };
#undef KEY_NAME

/* base.yml gives every key the table's default, and lists every key of
 * the table: once (the loader refuses a key given twice in one file),
 * and none missing (a key it lacks would keep its origin "default"). */
START_TEST(test_base_yml_matches_defaults)
{
	static struct cfg a, b;
	uint8_t ha[32], hb[32];
	char where[400];
	cfg_defaults(&a);
	cfg_defaults(&b);
	b.steps = 12345; /* make sure loading really overwrites */
	ck_assert_msg(cfg_load_file(&b, "configs/base.yml", err, sizeof(err)) == 0, "%s", err);
	cfg_hash(&a, ha);
	cfg_hash(&b, hb);
	ck_assert_int_eq(b.steps, a.steps);
	ck_assert_msg(memcmp(ha, hb, 32) == 0, "configs/base.yml disagrees with the key table");
	ck_assert_int_eq(sizeof(key_names) / sizeof(key_names[0]), CFG_NKEYS);
	for (size_t i = 0; i < CFG_NKEYS; i++) {
		ck_assert_int_eq(cfg_key_origin(&b, key_names[i], where, sizeof(where)), 0);
		ck_assert_msg(!strncmp(where, "'configs/base.yml' line ", 24),
			      "configs/base.yml lacks key '%s' (its origin: %s)", key_names[i], where);
	}
	/* and the check can fail: a file without learning_rate leaves it
	 * at its default */
	const char *p = write_tmp("steps: 3\n");
	cfg_defaults(&b);
	ck_assert_int_eq(cfg_load_file(&b, p, err, sizeof(err)), 0);
	cfg_key_origin(&b, "learning_rate", where, sizeof(where));
	ck_assert_str_eq(where, "default");
	unlink(p);
}
END_TEST

START_TEST(test_presets_load)
{
	const char *files[] = { "configs/llama-tiny.yml", "configs/llama-bench.yml",
				"configs/deepseek-tiny.yml" };
	for (int i = 0; i < 3; i++) {
		struct cfg c;
		cfg_defaults(&c);
		ck_assert_msg(cfg_load_file(&c, files[i], err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(cfg_finish(&c, 1, 1, err, sizeof(err)) == 0, "%s", err);
	}
	struct cfg c;
	cfg_defaults(&c);
	cfg_load_file(&c, "configs/llama-bench.yml", err, sizeof(err));
	ck_assert_int_eq(c.base_emb_dim, 512);
	ck_assert_int_eq(c.base_mlp_dim, 1408);
	ck_assert_int_eq(c.max_target_length, 256);
	ck_assert_double_eq(c.heartbeat_timeout_s, 10); /* from base.yml */
}
END_TEST

START_TEST(test_unknown_key_in_file)
{
	struct cfg c;
	cfg_defaults(&c);
	const char *p = write_tmp("steps: 3\nbase_emb_dimm: 64\n");
	ck_assert_int_ne(cfg_load_file(&c, p, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "unknown key 'base_emb_dimm'") && strstr(err, "line 2") &&
		      strstr(err, p), "%s", err);
	unlink(p);
}
END_TEST

START_TEST(test_wrong_types)
{
	struct cfg c;
	cfg_defaults(&c);
	ck_assert_int_ne(cfg_override(&c, "steps=ten", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'steps'") && strstr(err, "integer") && strstr(err, "ten"), "%s", err);
	ck_assert_int_ne(cfg_override(&c, "learning_rate=fast", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'learning_rate'"), "%s", err);
	ck_assert_int_ne(cfg_override(&c, "logits_via_embedding=maybe", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "true or false"), "%s", err);
	ck_assert_int_ne(cfg_override(&c, "nokey", err, sizeof(err)), 0);
	ck_assert_int_ne(cfg_override(&c, "bogus=1", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "unknown key 'bogus'") && strstr(err, "command line"), "%s", err);
	const char *p = write_tmp("steps: [1, 2]\n");
	ck_assert_int_ne(cfg_load_file(&c, p, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'steps'") && strstr(err, "list"), "%s", err);
	unlink(p);
	p = write_tmp("steps: 3\n  bad: [\n");
	ck_assert_int_ne(cfg_load_file(&c, p, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, p), "%s", err);
	unlink(p);
	ck_assert_int_ne(cfg_load_file(&c, "/nonexistent/x.yml", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "unable to open '/nonexistent/x.yml'"), "%s", err);
}
END_TEST

START_TEST(test_duplicate_keys)
{
	/* a key given twice in one file is refused naming both lines (was:
	 * silently last-wins); the same key in a base_config file and in the
	 * file over it is an override, as intended */
	struct cfg c;
	char want[256];
	cfg_defaults(&c);
	const char *p = write_tmp("steps: 3\nlearning_rate: 0.1\nsteps: 5\n");
	ck_assert_int_eq(cfg_load_file(&c, p, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "config: '%s' line 3: key 'steps' is given twice (first at line 1)", p);
	ck_assert_str_eq(err, want);
	unlink(p);
	p = write_tmp("faults: [\"kill:host=1:step=3\"]\nsteps: 2\nfaults:\n  - \"stop:host=1:step=3\"\n");
	ck_assert_int_eq(cfg_load_file(&c, p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "line 3: key 'faults' is given twice (first at line 1)"), "%s", err);
	unlink(p);
	char base[64];
	snprintf(base, sizeof(base), "%s", write_tmp("steps: 3\n"));
	char text[128];
	snprintf(text, sizeof(text), "base_config: %s\nsteps: 7\n", base);
	p = write_tmp(text);
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_load_file(&c, p, err, sizeof(err)), 0);
	ck_assert_int_eq(c.steps, 7);
	unlink(p);
	unlink(base);
}
END_TEST

START_TEST(test_out_of_range)
{
	/* numbers a run cannot use are refused by cfg_finish naming the key */
	static const struct { const char *kv, *want; } bad[] = {
		{ "learning_rate=-1", "config: key 'learning_rate' must be > 0, got -1 (learning_rate: "
		  "command line)" },
		{ "learning_rate=0", "config: key 'learning_rate' must be > 0, got 0 (learning_rate: "
		  "command line)" },
		{ "adam_b1=1", "config: key 'adam_b1' must be in [0, 1), got 1 (adam_b1: command line)" },
		{ "adam_b2=-0.5", "config: key 'adam_b2' must be in [0, 1), got -0.5 (adam_b2: command line)" },
		{ "adam_eps=0", "config: key 'adam_eps' must be > 0, got 0 (adam_eps: command line)" },
		{ "warmup_steps_fraction=1.5", "config: key 'warmup_steps_fraction' must be in [0, 1], got "
		  "1.5 (warmup_steps_fraction: command line)" },
		{ "gradient_clipping_threshold=-1", "config: key 'gradient_clipping_threshold' must be >= 0, "
		  "got -1 (gradient_clipping_threshold: command line)" },
		{ "steps=-3", "config: key 'steps' must be >= 0, got -3 (steps: command line)" },
		{ "checkpoint_period=-1", "config: key 'checkpoint_period' must be >= 0, got -1 "
		  "(checkpoint_period: command line)" },
		{ "collective_timeout_s=0", "config: key 'collective_timeout_s' must be > 0, got 0 "
		  "(collective_timeout_s: command line)" },
		/* keys from different places: each names its own, defaults too */
		{ "link_silence_s=10", "config: key 'link_silence_s' (10) must be 0 or lie between "
		  "'heartbeat_interval_s' (0.5) and 'heartbeat_timeout_s' (10) (link_silence_s: command "
		  "line; heartbeat_interval_s: default; heartbeat_timeout_s: default)" },
		{ "link_silence_s=0.5", "config: key 'link_silence_s' (0.5) must be 0 or lie between "
		  "'heartbeat_interval_s' (0.5) and 'heartbeat_timeout_s' (10) (link_silence_s: command "
		  "line; heartbeat_interval_s: default; heartbeat_timeout_s: default)" },
		{ "link_silence_s=-1", "config: key 'link_silence_s' (-1) must be 0 or lie between "
		  "'heartbeat_interval_s' (0.5) and 'heartbeat_timeout_s' (10) (link_silence_s: command "
		  "line; heartbeat_interval_s: default; heartbeat_timeout_s: default)" },
		/* a default that fails a check once another key moved */
		{ "heartbeat_interval_s=20", "config: key 'heartbeat_timeout_s' (10) must exceed "
		  "'heartbeat_interval_s' (20) > 0 (heartbeat_timeout_s: default; heartbeat_interval_s: "
		  "command line)" },
		{ "learning_rate_schedule_steps=0", "config: key 'learning_rate_schedule_steps' must be -1 "
		  "(steps) or >= 1, got 0 (learning_rate_schedule_steps: command line)" },
		{ "dataset_type=foo", "config: key 'dataset_type' has unknown value 'foo' (synthetic | text | "
		  "llmc | raw | megatron) (dataset_type: command line)" },
		{ "dataset_type=text", "config: dataset_type 'text' needs key 'dataset_path' and "
		  "'vocab_size' >= 256 (byte tokens), got '' and 256 (dataset_path: default; vocab_size: "
		  "default)" },
		{ "tls_cipher_impl=aesni", "config: key 'tls_cipher_impl' must be auto, ipsec-mb or "
		  "openssl, got 'aesni' (tls_cipher_impl: command line)" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct cfg c;
		cfg_defaults(&c);
		ck_assert_int_eq(cfg_override(&c, bad[i].kv, err, sizeof(err)), 0);
		ck_assert_msg(cfg_finish(&c, 1, 1, err, sizeof(err)) == -EINVAL, "%s accepted", bad[i].kv);
		ck_assert_str_eq(err, bad[i].want);
	}
	/* the edges that are fine */
	const char *good[] = { "learning_rate=1e-9", "adam_b1=0", "warmup_steps_fraction=1",
			       "learning_rate_schedule_steps=-1", "steps=0", "gradient_clipping_threshold=0",
			       "link_silence_s=0", "link_silence_s=0.6", "link_silence_s=9.9",
			       "tls_cipher_impl=openssl", "tls_cipher_impl=ipsec-mb" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct cfg c;
		cfg_defaults(&c);
		ck_assert_int_eq(cfg_override(&c, good[i], err, sizeof(err)), 0);
		ck_assert_msg(cfg_finish(&c, 1, 1, err, sizeof(err)) == 0, "%s: %s", good[i], err);
	}
	/* ipsec-mb seals our records only: not with OpenSSL's */
	struct cfg c;
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_override(&c, "tls_records=openssl", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg_override(&c, "tls_cipher_impl=ipsec-mb", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg_finish(&c, 1, 1, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "config: key 'tls_cipher_impl' is ipsec-mb, which seals our own "
			 "records, but key 'tls_records' is openssl (OpenSSL's records use its cipher) "
			 "(tls_cipher_impl: command line; tls_records: command line)");
}
END_TEST

/* A range or shape error names where the key's value came from: the
 * file and line, the command line, a whole file (a checkpoint's
 * config.json), or its default; a key set twice names the last place. */
START_TEST(test_error_origins)
{
	static struct cfg c;
	char text[256], want[512], base[64], p[64], q[64];
	/* from a file, through base_config: the file that set it last */
	snprintf(base, sizeof(base), "%s", write_tmp("steps: 3\nper_device_batch_size: 4\n"));
	snprintf(text, sizeof(text), "base_config: %s\nsteps: 2\nlearning_rate: -2\n", base);
	snprintf(p, sizeof(p), "%s", write_tmp(text));
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_load_file(&c, p, err, sizeof(err)), 0);
	ck_assert_int_eq(cfg_finish(&c, 1, 1, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "config: key 'learning_rate' must be > 0, got -2 (learning_rate: "
		 "'%s' line 3)", p);
	ck_assert_str_eq(err, want);
	cfg_key_origin(&c, "per_device_batch_size", err, sizeof(err));
	snprintf(want, sizeof(want), "'%s' line 2", base);
	ck_assert_str_eq(err, want);
	/* the command line over the file: the command line */
	ck_assert_int_eq(cfg_override(&c, "learning_rate=-3", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg_finish(&c, 1, 1, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "config: key 'learning_rate' must be > 0, got -3 (learning_rate: command "
			 "line)");
	/* a whole file (hf_config_apply's config.json) */
	ck_assert_int_eq(cfg_override_at(&c, "learning_rate=-4", "/ck/config.json", err, sizeof(err)), 0);
	ck_assert_int_eq(cfg_finish(&c, 1, 1, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "config: key 'learning_rate' must be > 0, got -4 (learning_rate: "
			 "'/ck/config.json')");
	/* the mesh's product names its sizes and theirs */
	cfg_override(&c, "learning_rate=0.1", err, sizeof(err));
	ck_assert_int_eq(cfg_finish(&c, 2, 1, err, sizeof(err)), 0);
	snprintf(text, sizeof(text), "dcn_data_parallelism: 2\ndcn_fsdp_parallelism: 2\n");
	snprintf(q, sizeof(q), "%s", write_tmp(text));
	ck_assert_int_eq(cfg_load_file(&c, q, err, sizeof(err)), 0);
	cfg_override(&c, "dcn_fsdp_parallelism=3", err, sizeof(err));
	ck_assert_int_eq(cfg_finish(&c, 4, 1, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "config: dcn_* parallelism multiplies to 6 hosts "
		 "('dcn_data_parallelism'=2 x 'dcn_fsdp_parallelism'=3), but the run has 4 hosts "
		 "(dcn_data_parallelism: '%s' line 1; dcn_fsdp_parallelism: command line)", q);
	ck_assert_str_eq(err, want);
	/* said once: a message that passes again is unchanged */
	char again[1024];
	snprintf(again, sizeof(again), "%s", err);
	cfg_error_origins(&c, again, sizeof(again));
	ck_assert_str_eq(again, err);
	/* a device's line keeps its prefix; a message not about config is
	 * left alone */
	snprintf(again, sizeof(again), "device 0: config: key 'steps' must be >= 0, got -1");
	cfg_error_origins(&c, again, sizeof(again));
	snprintf(want, sizeof(want), "device 0: config: key 'steps' must be >= 0, got -1 (steps: '%s' "
		 "line 2)", p);
	ck_assert_str_eq(again, want);
	snprintf(again, sizeof(again), "data: 'steps' is not a file");
	cfg_error_origins(&c, again, sizeof(again));
	ck_assert_str_eq(again, "data: 'steps' is not a file");
	unlink(p);
	unlink(q);
	unlink(base);
}
END_TEST

START_TEST(test_overrides_and_lists)
{
	struct cfg c;
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_override(&c, "steps=7", err, sizeof(err)), 0);
	ck_assert_int_eq(c.steps, 7);
	ck_assert_int_eq(cfg_override(&c, "hosts=10.0.0.1:1,10.0.0.2:2", err, sizeof(err)), 0);
	ck_assert_int_eq(c.hosts.n, 2);
	ck_assert_str_eq(c.hosts.item[1], "10.0.0.2:2");
	const char *p = write_tmp("hosts:\n  - a:1\n  - b:2\n  - c:3\n");
	ck_assert_msg(cfg_load_file(&c, p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.hosts.n, 3);
	ck_assert_str_eq(c.hosts.item[2], "c:3");
	unlink(p);
	/* the hash sees overrides */
	struct cfg d;
	uint8_t h1[32], h2[32];
	cfg_defaults(&d);
	cfg_hash(&d, h1);
	cfg_override(&d, "learning_rate=0.5", err, sizeof(err));
	cfg_hash(&d, h2);
	ck_assert(memcmp(h1, h2, 32) != 0);
}
END_TEST

START_TEST(test_mesh_sizes)
{
	struct cfg c;
	cfg_defaults(&c);
	/* defaults fill data parallelism from the run's shape */
	ck_assert_msg(cfg_finish(&c, 2, 3, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.dcn[AX_DATA], 2);
	ck_assert_int_eq(c.ici[AX_DATA], 3);
	cfg_defaults(&c);
	cfg_override(&c, "ici_fsdp_parallelism=2", err, sizeof(err));
	ck_assert_int_eq(cfg_finish(&c, 1, 4, err, sizeof(err)), 0);
	ck_assert_int_eq(c.ici[AX_DATA], 2);
	ck_assert_int_ne(cfg_finish(&c, 1, 3, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "ici_data_parallelism"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "ici_data_parallelism=1", err, sizeof(err));
	cfg_override(&c, "ici_tensor_parallelism=2", err, sizeof(err));
	ck_assert_int_ne(cfg_finish(&c, 1, 4, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "multiplies to 2 devices per host") && strstr(err, "4"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "ici_fsdp_parallelism=-1", err, sizeof(err));
	ck_assert_int_ne(cfg_finish(&c, 1, 4, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "both -1"), "%s", err);
	cfg_defaults(&c);
	cfg_override(&c, "dcn_fsdp_parallelism=0", err, sizeof(err));
	ck_assert_int_ne(cfg_finish(&c, 1, 1, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'dcn_fsdp_parallelism'"), "%s", err);
	/* eager sends: 0 turns them off, more than 1 MiB is refused */
	cfg_defaults(&c);
	ck_assert_int_eq(c.eager_max_bytes, 65536);
	cfg_override(&c, "eager_max_bytes=0", err, sizeof(err));
	ck_assert_msg(cfg_finish(&c, 1, 1, err, sizeof(err)) == 0, "%s", err);
	cfg_override(&c, "eager_max_bytes=2097152", err, sizeof(err));
	ck_assert_int_ne(cfg_finish(&c, 1, 1, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "config: key 'eager_max_bytes' must be in [0, 1048576], got 2097152 "
			 "(eager_max_bytes: command line)");
}
END_TEST

/* Every axis's two keys, written out here as users write them (not from
 * MESH_AXES): each is accepted from the command line and from a file, lands
 * in its own axis and nowhere else, and messages name it. */
START_TEST(test_axis_keys)
{
	static const struct { enum mesh_axis a; const char *name, *ici, *dcn; } ax[] = {
		{ AX_DATA, "data", "ici_data_parallelism", "dcn_data_parallelism" },
		{ AX_STAGE, "stage", "ici_pipeline_parallelism", "dcn_pipeline_parallelism" },
		{ AX_FSDP, "fsdp", "ici_fsdp_parallelism", "dcn_fsdp_parallelism" },
		{ AX_FSDP_T, "fsdp_transpose", "ici_fsdp_transpose_parallelism",
		  "dcn_fsdp_transpose_parallelism" },
		{ AX_SEQUENCE, "sequence", "ici_sequence_parallelism", "dcn_sequence_parallelism" },
		{ AX_CONTEXT, "context", "ici_context_parallelism", "dcn_context_parallelism" },
		{ AX_TENSOR, "tensor", "ici_tensor_parallelism", "dcn_tensor_parallelism" },
		{ AX_TENSOR_T, "tensor_transpose", "ici_tensor_transpose_parallelism",
		  "dcn_tensor_transpose_parallelism" },
		{ AX_EXPERT, "expert", "ici_expert_parallelism", "dcn_expert_parallelism" },
	};
	ck_assert_int_eq(sizeof(ax) / sizeof(ax[0]), AX_COUNT);
	for (int i = 0; i < AX_COUNT; i++) {
		enum mesh_axis a = ax[i].a;
		ck_assert_str_eq(mesh_axis_names[a], ax[i].name);
		for (int dcn = 0; dcn < 2; dcn++) {
			const char *key = dcn ? ax[i].dcn : ax[i].ici;
			char kv[128], yml[128];
			struct cfg c;
			for (int from_file = 0; from_file < 2; from_file++) {
				cfg_defaults(&c);
				ck_assert_int_eq(cfg_override(&c, "ici_data_parallelism=1", err, sizeof(err)), 0);
				ck_assert_int_eq(cfg_override(&c, "dcn_data_parallelism=1", err, sizeof(err)), 0);
				if (from_file) {
					snprintf(yml, sizeof(yml), "%s: 3\n", key);
					const char *p = write_tmp(yml);
					ck_assert_msg(cfg_load_file(&c, p, err, sizeof(err)) == 0, "%s", err);
					unlink(p);
				} else {
					snprintf(kv, sizeof(kv), "%s=3", key);
					ck_assert_msg(cfg_override(&c, kv, err, sizeof(err)) == 0, "%s", err);
				}
				ck_assert_int_eq(cfg_axis_key(&c, dcn, a), 3);
				ck_assert_int_eq(cfg_axis_key(&c, !dcn, a), 1);
				ck_assert_msg(cfg_finish(&c, dcn ? 3 : 1, dcn ? 1 : 3, err, sizeof(err)) == 0,
					      "%s: %s", key, err);
				for (int b = 0; b < AX_COUNT; b++) {
					ck_assert_int_eq(c.ici[b], !dcn && b == (int)a ? 3 : 1);
					ck_assert_int_eq(c.dcn[b], dcn && b == (int)a ? 3 : 1);
				}
			}
			/* a bad size is reported under this key's name */
			snprintf(kv, sizeof(kv), "%s=0", key);
			ck_assert_int_eq(cfg_override(&c, kv, err, sizeof(err)), 0);
			ck_assert_int_ne(cfg_finish(&c, 0, 0, err, sizeof(err)), 0);
			snprintf(kv, sizeof(kv), "'%s'", key);
			ck_assert_msg(strstr(err, kv), "%s", err);
		}
	}
	/* cfg_single_device reaches every key */
	struct cfg c;
	cfg_defaults(&c);
	for (int i = 0; i < AX_COUNT; i++) {
		char kv[128];
		snprintf(kv, sizeof(kv), "%s=2", ax[i].ici);
		cfg_override(&c, kv, err, sizeof(err));
		snprintf(kv, sizeof(kv), "%s=2", ax[i].dcn);
		cfg_override(&c, kv, err, sizeof(err));
	}
	cfg_single_device(&c);
	for (int a = 0; a < AX_COUNT; a++)
		ck_assert(cfg_axis_key(&c, false, a) == 1 && cfg_axis_key(&c, true, a) == 1);
	/* what a family multiplies to before cfg_finish: -1 counts as 1 */
	cfg_defaults(&c);
	ck_assert_int_eq(cfg_family_product(&c, false), 1);
	cfg_override(&c, "ici_fsdp_parallelism=2", err, sizeof(err));
	cfg_override(&c, "ici_expert_parallelism=3", err, sizeof(err));
	cfg_override(&c, "dcn_tensor_parallelism=5", err, sizeof(err));
	ck_assert_int_eq(cfg_family_product(&c, false), 6);
	ck_assert_int_eq(cfg_family_product(&c, true), 5);
	cfg_override(&c, "dcn_pipeline_parallelism=1000", err, sizeof(err));
	ck_assert_int_eq(cfg_family_product(&c, true), 0);
}
END_TEST

START_TEST(test_mesh_groups)
{
	struct cfg c;
	struct mesh m;
	struct mesh_group g;
	cfg_defaults(&c);
	cfg_override(&c, "ici_data_parallelism=1", err, sizeof(err));
	cfg_override(&c, "ici_fsdp_parallelism=2", err, sizeof(err));
	cfg_override(&c, "ici_tensor_parallelism=2", err, sizeof(err));
	ck_assert_int_eq(cfg_finish(&c, 2, 4, err, sizeof(err)), 0);
	mesh_init(&m, &c);
	ck_assert_int_eq(m.num_devices, 8);
	/* every device: coords round-trip, host/local agree with device_of */
	int seen[8] = { 0 };
	for (int d = 0; d < 8; d++) {
		int co[AX_COUNT];
		mesh_coords(&m, d, co);
		ck_assert_int_eq(mesh_device(&m, co), d);
		int h = mesh_host_of(&m, d), l = mesh_local_index(&m, d);
		ck_assert_int_eq(mesh_device_of(&m, h, l), d);
		ck_assert_int_eq(h, co[AX_DATA]); /* data is the only dcn axis */
		seen[h * 4 + l]++;
	}
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(seen[i], 1);
	/* device 5 = (data 1, fsdp 0, tensor 1): its tensor group is {4, 5} */
	mesh_group(&m, 5, 1u << AX_TENSOR, &g);
	ck_assert_int_eq(g.n, 2);
	ck_assert_int_eq(g.devs[0], 4);
	ck_assert_int_eq(g.devs[1], 5);
	ck_assert_int_eq(g.rank, 1);
	/* its (data, fsdp) group: host-major {1, 3, 5, 7} */
	mesh_group(&m, 5, (1u << AX_DATA) | (1u << AX_FSDP), &g);
	ck_assert_int_eq(g.n, 4);
	int want[4] = { 1, 3, 5, 7 };
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(g.devs[i], want[i]);
	ck_assert_int_eq(g.rank, 2);
	struct mesh_group g2;
	mesh_group(&m, 1, (1u << AX_DATA) | (1u << AX_FSDP), &g2);
	ck_assert_int_eq(g2.id, g.id);
	mesh_group(&m, 1, 1u << AX_TENSOR, &g2);
	ck_assert_int_ne(g2.id, g.id);
}
END_TEST

/* The pipeline keys: MaxText's names and defaults, typed like the rest
 * (their resolution is tested in check_schedule). */
START_TEST(test_pipeline_keys)
{
	struct cfg c;
	cfg_defaults(&c);
	ck_assert_int_eq(c.num_pipeline_microbatches, -1);
	ck_assert_int_eq(c.num_layers_per_pipeline_stage, 1);
	ck_assert_int_eq(c.num_pipeline_repeats, -1);
	ck_assert_int_eq(c.pipeline_parallel_layers, -1);
	ck_assert(!c.pipeline_delay_activation_forwarding);
	ck_assert(!c.pipeline_fsdp_ag_once);
	ck_assert(!c.pipeline_fsdp_ag_per_repeat);
	ck_assert_int_eq(cfg_override(&c, "pipeline_fsdp_ag_per_repeat=true", err, sizeof(err)), 0);
	ck_assert(c.pipeline_fsdp_ag_per_repeat);
	ck_assert_int_eq(cfg_override(&c, "num_pipeline_microbatches=8", err, sizeof(err)), 0);
	ck_assert_int_eq(c.num_pipeline_microbatches, 8);
	ck_assert_int_ne(cfg_override(&c, "pipeline_fsdp_ag_once=maybe", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'pipeline_fsdp_ag_once'") && strstr(err, "true or false"), "%s", err);
	ck_assert_int_ne(cfg_override(&c, "num_pipeline_repeats=two", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'num_pipeline_repeats'"), "%s", err);
	/* they change the config hash: hosts with different pipelines refuse each other */
	uint8_t a[32], b[32];
	cfg_defaults(&c);
	cfg_hash(&c, a);
	cfg_override(&c, "pipeline_delay_activation_forwarding=true", err, sizeof(err));
	cfg_hash(&c, b);
	ck_assert(memcmp(a, b, 32) != 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("load");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_base_yml_matches_defaults);
	tcase_add_test(tc, test_presets_load);
	tcase_add_test(tc, test_unknown_key_in_file);
	tcase_add_test(tc, test_wrong_types);
	tcase_add_test(tc, test_overrides_and_lists);
	tcase_add_test(tc, test_duplicate_keys);
	tcase_add_test(tc, test_out_of_range);
	tcase_add_test(tc, test_error_origins);
	suite_add_tcase(s, tc);
	tc = tcase_create("mesh");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_mesh_sizes);
	tcase_add_test(tc, test_axis_keys);
	tcase_add_test(tc, test_mesh_groups);
	suite_add_tcase(s, tc);
	tc = tcase_create("pipeline");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_pipeline_keys);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
