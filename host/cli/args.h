/* The one command-line parser every subcommand uses. A command describes
 * its flags in a table (name, what the value is, where to store it); the
 * parser accepts `--flag VALUE` and `--flag=VALUE` for every flag that
 * takes a value, collects `--config FILE` (repeatable, loaded in order) and
 * `key=value` config overrides (applied after every file, in order), and
 * stops at the first problem with one line naming the flag. */
#ifndef MESHRUN_ARGS_H
#define MESHRUN_ARGS_H

#include <stdbool.h>
#include <stddef.h>

struct cfg;

enum arg_type {
	ARG_BOOL,      /* no value; *(bool *)dst = true */
	ARG_STR,       /* *(const char **)dst = the value (points into argv) */
	ARG_INT,       /* *(int *)dst, an integer in [min, max] */
	ARG_LONG,      /* *(long *)dst, an integer in [min, max] */
	ARG_DOUBLE,    /* *(double *)dst, a number in [min, max] */
	ARG_BYTES,     /* *(size_t *)dst, a byte count like 64K or 16M, <= max */
	ARG_CONFIG,    /* a config file: appended to args.configs (dst unused) */
	ARG_REFUSE,    /* refused with `why` (a flag another part sets) */
	ARG_APPEND,    /* repeatable: each value is appended to the config
			* LIST key named by `why`, after the overrides */
};

struct arg_flag {
	const char *name;        /* "--hosts"; NULL ends a table */
	enum arg_type type;
	void *dst;
	double min, max;         /* ARG_INT, ARG_LONG, ARG_DOUBLE, ARG_BYTES (max) */
	const char *why;         /* ARG_REFUSE: the message */
};

/* What a parse found besides the flags' values. */
struct args {
	const char **configs;    /* --config files, in order */
	int nconfigs;
	const char **overrides;  /* key=value, in order */
	int noverrides;
	const char **appends;    /* ARG_APPEND values, in order ... */
	const struct arg_flag **append_flag;  /* ... and their flags */
	int nappends;
	/* for each argv index, the flag that took it (its name or value),
	 * NULL for overrides and argv[0]: lets a launcher forward what it
	 * does not use itself */
	const struct arg_flag **owner;
	int argc;
};

/* Parses argv[1..argc-1] against the tables (a NULL-terminated list of
 * flag tables, searched in order). Anything else that starts with '-' is
 * an unknown option; anything without '=' an unexpected argument.
 * 0, -ENOMEM, or -EINVAL (a usage error) with a one-line message in err.
 * Free with args_release, after a failure too. */
int args_parse(struct args *a, const struct arg_flag *const *tables, int argc, char **argv,
	       char *err, size_t errlen);
void args_release(struct args *a);

/* cfg_defaults, then every --config file in order, then every override
 * in order, then every ARG_APPEND value, then, with load_parameters_path,
 * the model keys of that checkpoint's config.json (hf_config_apply). 0,
 * or with err: -EINVAL (a config error: a file that cannot be read or
 * parsed, an unknown key, a bad value, a key the checkpoint contradicts),
 * -EBADMSG (the checkpoint's config.json is missing or unreadable). */
int args_load_cfg(const struct args *a, struct cfg *c, char *err, size_t errlen);

#endif
