/* See host/cli/args.h. */
#include "host/cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/ckpt/hf_config.h"
#include "host/config/config.h"

static const struct arg_flag *find_flag(const struct arg_flag *const *tables, const char *name,
					size_t len)
{
	for (const struct arg_flag *const *t = tables; *t; t++)
		for (const struct arg_flag *f = *t; f->name; f++)
			if (strlen(f->name) == len && !strncmp(f->name, name, len))
				return f;
	return NULL;
}

static bool takes_value(const struct arg_flag *f)
{
	return f->type != ARG_BOOL && f->type != ARG_REFUSE;
}

/* Stores v into f's destination; -EINVAL with err when it does not fit. */
static int store(struct args *a, const struct arg_flag *f, const char *v, char *err, size_t errlen)
{
	char *end;
	switch (f->type) {
	case ARG_BOOL:
		*(bool *)f->dst = true;
		return 0;
	case ARG_STR:
		*(const char **)f->dst = v;
		return 0;
	case ARG_CONFIG:
		a->configs[a->nconfigs++] = v;
		return 0;
	case ARG_APPEND:
		a->append_flag[a->nappends] = f;
		a->appends[a->nappends++] = v;
		return 0;
	case ARG_INT:
	case ARG_LONG: {
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (!*v || *end || errno || x < f->min || x > f->max) {
			snprintf(err, errlen, "%s wants an integer in [%.0f, %.0f], got '%s'", f->name,
				 f->min, f->max, v);
			return -EINVAL;
		}
		if (f->type == ARG_INT)
			*(int *)f->dst = (int)x;
		else
			*(long *)f->dst = (long)x;
		return 0;
	}
	case ARG_DOUBLE: {
		errno = 0;
		double x = strtod(v, &end);
		if (!*v || *end || errno || !isfinite(x) || x < f->min || x > f->max) {
			snprintf(err, errlen, "%s wants a number in [%g, %g], got '%s'", f->name, f->min,
				 f->max, v);
			return -EINVAL;
		}
		*(double *)f->dst = x;
		return 0;
	}
	case ARG_BYTES: {
		size_t x;
		if (cfg_parse_bytes(v, &x) || (double)x > f->max) {
			snprintf(err, errlen, "%s wants a byte count like 64K or 16M, got '%s'", f->name, v);
			return -EINVAL;
		}
		*(size_t *)f->dst = x;
		return 0;
	}
	case ARG_REFUSE:
		break;
	}
	snprintf(err, errlen, "%s", f->why ? f->why : "option not allowed here");
	return -EINVAL;
}

int args_parse(struct args *a, const struct arg_flag *const *tables, int argc, char **argv,
	       char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	size_t n = argc > 0 ? (size_t)argc : 1;
	a->configs = calloc(n, sizeof(*a->configs));
	a->overrides = calloc(n, sizeof(*a->overrides));
	a->owner = calloc(n, sizeof(*a->owner));
	a->appends = calloc(n, sizeof(*a->appends));
	a->append_flag = calloc(n, sizeof(*a->append_flag));
	a->argc = argc;
	if (!a->configs || !a->overrides || !a->owner || !a->appends || !a->append_flag) {
		args_release(a);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		if (arg[0] != '-') {
			if (!strchr(arg, '=') || arg[0] == '=') {
				snprintf(err, errlen, "unexpected argument '%s' (want --flag or key=value)", arg);
				return -EINVAL;
			}
			a->overrides[a->noverrides++] = arg;
			continue;
		}
		const char *eq = strchr(arg, '=');
		size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
		const struct arg_flag *f = find_flag(tables, arg, len);
		if (!f) {
			snprintf(err, errlen, "unknown option '%.*s'", (int)len, arg);
			return -EINVAL;
		}
		a->owner[i] = f;
		const char *v = eq ? eq + 1 : NULL;
		if (!takes_value(f) && v) {
			snprintf(err, errlen, "%s takes no value, got '%s'", f->name, arg);
			return -EINVAL;
		}
		if (takes_value(f) && !v) {
			if (i + 1 >= argc) {
				snprintf(err, errlen, "%s needs a value", f->name);
				return -EINVAL;
			}
			v = argv[++i];
			a->owner[i] = f;
		}
		int rc = store(a, f, v, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

void args_release(struct args *a)
{
	free(a->configs);
	free(a->overrides);
	free(a->owner);
	free(a->appends);
	free(a->append_flag);
	memset(a, 0, sizeof(*a));
}

int args_load_cfg(const struct args *a, struct cfg *c, char *err, size_t errlen)
{
	cfg_defaults(c);
	for (int i = 0; i < a->nconfigs; i++)
		if (cfg_load_file(c, a->configs[i], err, errlen))
			return -EINVAL;
	for (int i = 0; i < a->noverrides; i++)
		if (cfg_override(c, a->overrides[i], err, errlen))
			return -EINVAL;
	for (int i = 0; i < a->nappends; i++)
		if (cfg_list_append(c, a->append_flag[i]->why, a->appends[i], err, errlen))
			return -EINVAL;
	/* a checkpoint to start from fixes the model keys its config.json gives */
	return hf_config_apply(c, a->overrides, a->noverrides, err, errlen);
}
