/* `meshrun data pack` (token files or text into llm.c or Megatron shards,
 * host/data/pack.h) and `meshrun data check` (opens a config's data as a
 * run would, then reads every row once: the full scan the trainer leaves
 * to read time). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/data/data.h"
#include "host/data/pack.h"

static int usage(const char *why)
{
	return cli_usage_error("data", "%s", why);
}

/* A token count: digits with an optional K, M or G (10^3, 10^6, 10^9). */
static int parse_count(const char *s, long long *out)
{
	char *end;
	long long v = strtoll(s, &end, 10), mul = 1;
	if (end == s || v < 0)
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		mul = 1000, end++;
	else if (*end == 'M')
		mul = 1000000, end++;
	else if (*end == 'G')
		mul = 1000000000, end++;
	if (*end || v > INT64_MAX / mul)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int pick(const char *v, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(v, names[i]))
			return i;
	return -1;
}

/* The value of flag argv[*i] (--flag VALUE or --flag=VALUE), or NULL. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag)
{
	size_t n = strlen(flag);
	if (strncmp(argv[*i], flag, n))
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n] || *i + 1 >= argc)
		return NULL;
	return argv[++*i];
}

static int cmd_pack(int argc, char **argv)
{
	static const char *const outs[] = { "llmc", "megatron" };
	static const char *const ins[] = { "text", "raw", "llmc", "megatron" };
	struct pack_opts o = { .out = -1, .in = PACK_TEXT, .in_token_bytes = 2,
			       .shard_tokens = 100000000, .eot = -1, .name = "train" };
	char **inputs = calloc((size_t)argc, sizeof(char *)), why[160], err[1024];
	int n = 0, rc = EXIT_USAGE;
	if (!inputs)
		return EXIT_FAIL;
	for (int i = 1; i < argc; i++) {
		const char *v, *flag = argv[i];
		long long x = 0;
		int k;
		if ((v = flag_value(argc, argv, &i, "--format"))) {
			if ((k = pick(v, outs, 2)) < 0)
				goto bad_value;
			o.out = k ? SHARD_MEGATRON : SHARD_LLMC;
		} else if ((v = flag_value(argc, argv, &i, "--input-token-bytes"))) {
			if (parse_count(v, &x) || (x != 2 && x != 4))
				goto bad_value;
			o.in_token_bytes = (int)x;
		} else if ((v = flag_value(argc, argv, &i, "--input"))) {
			if ((k = pick(v, ins, 4)) < 0)
				goto bad_value;
			o.in = (enum pack_input)k;
		} else if ((v = flag_value(argc, argv, &i, "--token-bytes"))) {
			if (parse_count(v, &x) || (x != 2 && x != 4))
				goto bad_value;
			o.token_bytes = (int)x;
		} else if ((v = flag_value(argc, argv, &i, "--shard-tokens"))) {
			if (parse_count(v, &x) || x < 1)
				goto bad_value;
			o.shard_tokens = x;
		} else if ((v = flag_value(argc, argv, &i, "--eot"))) {
			if (parse_count(v, &x) || x > UINT32_MAX)
				goto bad_value;
			o.eot = x;
		} else if ((v = flag_value(argc, argv, &i, "--name"))) {
			if (!*v || strchr(v, '/'))
				goto bad_value;
			o.name = v;
		} else if ((v = flag_value(argc, argv, &i, "-o"))) {
			o.dir = v;
		} else if (argv[i][0] == '-') {
			snprintf(why, sizeof(why), "pack: unknown option or missing value '%.60s'", argv[i]);
			goto out_usage;
		} else {
			inputs[n++] = argv[i];
		}
		continue;
bad_value:
		snprintf(why, sizeof(why), "pack: bad value '%.60s' for %.*s", v, (int)strcspn(flag, "="),
			 flag);
		goto out_usage;
	}
	if ((int)o.out < 0 || !o.dir || !n) {
		snprintf(why, sizeof(why), "pack: %s", (int)o.out < 0 ? "--format is needed" :
			 !o.dir ? "-o DIR is needed" : "no INPUT given");
		goto out_usage;
	}
	struct pack_stats st;
	if ((rc = data_pack(&o, inputs, n, &st, err, sizeof(err)))) {
		cli_error("data pack", "%s", err);
		rc = cli_exit_code(rc);
	} else {
		printf("pack: %d %s shard%s, %" PRId64 " tokens, %" PRId64 " documents in '%s'\n", st.shards,
		       outs[o.out == SHARD_MEGATRON], st.shards == 1 ? "" : "s", st.tokens, st.documents,
		       o.dir);
	}
	free(inputs);
	return rc;
out_usage:
	free(inputs);
	return usage(why);
}

/* Reads every row of one source in order; prints what it found. */
static int check_source(const struct cfg *c, enum data_role role, const char *what, char *err,
			size_t errlen)
{
	struct data_source *d;
	int B = (int)c->per_device_batch_size, T = (int)c->max_target_length;
	int rc = data_open(&d, c, role, B, err, errlen);
	if (rc)
		return rc;
	int64_t rows = data_rows(d);
	if (rows < 0) {
		printf("%s: %s, unbounded (nothing to scan)\n", what, data_type_name(d));
		data_close(d);
		return 0;
	}
	int32_t *in = malloc(sizeof(int32_t) * (size_t)T), *tg = malloc(sizeof(int32_t) * (size_t)T);
	struct data_source *e = NULL;
	/* the whole training split in order: an evaluation source over it */
	if (!in || !tg)
		rc = -ENOMEM;
	else if (role == DATA_TRAIN) {
		struct cfg w = *c;
		w.eval_dataset_path[0] = '\0';
		w.eval_split_fraction = 0;
		rc = data_open(&e, &w, DATA_EVAL, 1, err, errlen);
	}
	int64_t masked = 0;
	for (int64_t r = 0; !rc && r < rows; r++) {
		rc = data_batch(e ? e : d, r, 1, 0, 1, in, tg, err, errlen);
		for (int t = 0; !rc && t < T; t++)
			masked += tg[t] < 0;
	}
	if (!rc)
		printf("%s: %s, %" PRId64 " rows of %d tokens, every token below vocab_size %lld, %" PRId64
		       " targets masked at document starts\n", what, data_type_name(d), rows, T + 1,
		       c->vocab_size, masked);
	free(in);
	free(tg);
	data_close(e);
	data_close(d);
	return rc == -ENOMEM ? (snprintf(err, errlen, "data: out of memory"), rc) : rc;
}

static int cmd_check(int argc, char **argv)
{
	static struct cfg c;
	struct args a;
	char err[1024];
	const struct arg_flag flags[] = {
		{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		args_release(&a);
		return usage(err);
	}
	rc = args_load_cfg(&a, &c, err, sizeof(err));
	args_release(&a);
	if (!rc)
		rc = check_source(&c, DATA_TRAIN, "train", err, sizeof(err));
	if (!rc && (c.eval_dataset_path[0] || c.eval_split_fraction > 0))
		rc = check_source(&c, DATA_EVAL, "eval", err, sizeof(err));
	if (rc)
		cli_error("data check", "%s", err);
	return cli_exit_code(rc);
}

int cmd_data(int argc, char **argv)
{
	if (argc < 2)
		return usage("pack or check?");
	if (!strcmp(argv[1], "pack"))
		return cmd_pack(argc - 1, argv + 1);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 1, argv + 1);
	char why[96];
	snprintf(why, sizeof(why), "unknown data command '%.40s'", argv[1]);
	return usage(why);
}
