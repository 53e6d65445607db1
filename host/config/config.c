/* Config loading: a key table built from CFG_KEYS, a small libyaml reader for
 * flat mappings (scalars and sequences of scalars), and `key=value`
 * overrides. Every error names the key and where it came from. */
#include "host/config/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <openssl/evp.h>
#include <yaml.h>

#include "host/util/out.h"

#define AXIS_NAME(X, e, name, stem, def) [e] = #name,
const char *const mesh_axis_names[AX_COUNT] = { MESH_AXES(AXIS_NAME, ) };
#undef AXIS_NAME

/* Each axis's two size keys: names for messages, fields by offset. */
static const struct axis_keys {
	const char *ici_key, *dcn_key;
	size_t ici_off, dcn_off;
} axis_keys[AX_COUNT] = {
#define AXIS_KEYS(X, e, name, stem, def) \
	[e] = { "ici_" #stem "_parallelism", "dcn_" #stem "_parallelism", \
		offsetof(struct cfg, ici_##stem##_parallelism), \
		offsetof(struct cfg, dcn_##stem##_parallelism) },
	MESH_AXES(AXIS_KEYS, )
#undef AXIS_KEYS
};

struct cfg_key {
	const char *name;
	enum cfg_type type;
	size_t off;
	const char *def;
	bool hashed;
};

static const struct cfg_key keys[] = {
#define CFG_DESC(t, n, d, h, help) { #n, CFG_T_##t, offsetof(struct cfg, n), d, h },
	CFG_KEYS(CFG_DESC)
#undef CFG_DESC
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(NKEYS == CFG_NKEYS, "CFG_NKEYS counts the key table");

static const struct cfg_key *find_key(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (!strcmp(keys[i].name, name))
			return &keys[i];
	return NULL;
}

static const char *type_name(enum cfg_type t)
{
	switch (t) {
	case CFG_T_INT: return "an integer";
	case CFG_T_FLOAT: return "a number";
	case CFG_T_BOOL: return "true or false";
	case CFG_T_STR: return "a string";
	case CFG_T_LIST: return "a list";
	}
	return "?";
}

/* Parses text into the key's slot. A LIST from text is comma-separated. */
static int set_value(struct cfg *c, const struct cfg_key *k, const char *v,
		     const char *origin, char *err, size_t errlen)
{
	char *p = (char *)c + k->off;
	char *end;

	errno = 0;
	switch (k->type) {
	case CFG_T_INT: {
		long long x = strtoll(v, &end, 10);
		if (!*v || *end || errno)
			goto bad;
		*(long long *)p = x;
		return 0;
	}
	case CFG_T_FLOAT: {
		double x = strtod(v, &end);
		if (!*v || *end || errno || !isfinite(x))
			goto bad;
		*(double *)p = x;
		return 0;
	}
	case CFG_T_BOOL:
		if (!strcasecmp(v, "true") || !strcmp(v, "1"))
			*(bool *)p = true;
		else if (!strcasecmp(v, "false") || !strcmp(v, "0"))
			*(bool *)p = false;
		else
			goto bad;
		return 0;
	case CFG_T_STR:
		if (strlen(v) >= CFG_STR) {
			snprintf(err, errlen, "config: key '%s' (%s): value longer than %d bytes",
				 k->name, origin, CFG_STR - 1);
			return -EINVAL;
		}
		strcpy(p, v);
		return 0;
	case CFG_T_LIST: {
		struct cfg_list *l = (struct cfg_list *)p;
		l->n = 0;
		const char *s = v;
		while (*s) {
			const char *e = strchr(s, ',');
			size_t n = e ? (size_t)(e - s) : strlen(s);
			if (l->n >= CFG_MAX_LIST || n >= CFG_STR) {
				snprintf(err, errlen, "config: key '%s' (%s): list too long",
					 k->name, origin);
				return -EINVAL;
			}
			if (n == 0) {
				/* as cfg_list_add: an empty item could not be
				 * written back (a list item is an index) */
				snprintf(err, errlen, "config: key '%s' (%s): empty list item in '%s'",
					 k->name, origin, v);
				return -EINVAL;
			}
			memcpy(l->item[l->n], s, n);
			l->item[l->n][n] = 0;
			l->n++;
			s += n;
			if (*s == ',')
				s++;
		}
		return 0;
	}
	}
bad:
	snprintf(err, errlen, "config: key '%s' (%s) wants %s, got '%s'",
		 k->name, origin, type_name(k->type), v);
	return -EINVAL;
}

void cfg_defaults(struct cfg *c)
{
	char err[256];
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < NKEYS; i++)
		if (set_value(c, &keys[i], keys[i].def, "default", err, sizeof(err)))
			abort(); /* a bad default in the table is a programmer error */
}

/* ---- origins ---- */

/* Records that key k was last set by file (NULL: the command line) at
 * line (0: the file as a whole). */
static void note_origin(struct cfg *c, const struct cfg_key *k, const char *file, size_t line)
{
	struct cfg_origins *o = &c->origin;
	size_t i = (size_t)(k - keys);
	o->line_of[i] = (uint32_t)line;
	if (!file) {
		o->file_of[i] = CFG_FROM_CMDLINE;
		return;
	}
	int f = 0;
	while (f < o->nfiles && strcmp(o->file[f], file))
		f++;
	if (f == o->nfiles && (f == CFG_MAX_FILES || strlen(file) >= CFG_STR)) {
		o->file_of[i] = CFG_FROM_FILE_UNNAMED;
		return;
	}
	if (f == o->nfiles)
		strcpy(o->file[o->nfiles++], file);
	o->file_of[i] = (int16_t)(1 + f);
}

/* Where a value was given: file (NULL: the command line) at line (0: the
 * file as a whole). */
static void where_text(const char *file, size_t line, char *out, size_t n)
{
	if (!file)
		snprintf(out, n, "command line");
	else if (line)
		snprintf(out, n, "'%s' line %zu", file, line);
	else
		snprintf(out, n, "'%s'", file);
}

static void origin_text(const struct cfg *c, const struct cfg_key *k, char *out, size_t n)
{
	const struct cfg_origins *o = &c->origin;
	size_t i = (size_t)(k - keys);
	int f = o->file_of[i];
	if (f == 0)
		snprintf(out, n, "default");
	else if (f == CFG_FROM_CMDLINE)
		where_text(NULL, 0, out, n);
	else if (f < 0 || f > o->nfiles)
		snprintf(out, n, "a config file");
	else
		where_text(o->file[f - 1], o->line_of[i], out, n);
}

int cfg_key_origin(const struct cfg *c, const char *key, char *out, size_t n)
{
	const struct cfg_key *k = find_key(key);
	if (!k)
		return -EINVAL;
	origin_text(c, k, out, n);
	return 0;
}

void cfg_error_origins(const struct cfg *c, char *err, size_t errlen)
{
	char tail[1024], where[CFG_STR + 64];
	const struct cfg_key *named[8];
	int n = 0;
	size_t used = 0;
	/* "config: ...", or a device's "device 0: config: ..." */
	const char *p = strstr(err, "config: ");
	while (p && n < 8) {
		const char *q = strchr(p, '\'');
		const char *e = q ? strchr(q + 1, '\'') : NULL;
		if (!e)
			break;
		char name[CFG_STR];
		size_t len = (size_t)(e - q - 1);
		const struct cfg_key *k = NULL;
		if (len < sizeof(name)) {
			memcpy(name, q + 1, len);
			name[len] = 0;
			k = find_key(name);
		}
		if (!k) {
			/* not a key (a value, a file name): its closing quote
			 * may be the opening one of a name after it */
			p = e;
			continue;
		}
		bool seen = false;
		for (int i = 0; i < n; i++)
			seen |= named[i] == k;
		if (!seen)
			named[n++] = k;
		p = e + 1;
	}
	if (!n)
		return;
	for (int i = 0; i < n && used < sizeof(tail); i++) {
		origin_text(c, named[i], where, sizeof(where));
		used += (size_t)snprintf(tail + used, sizeof(tail) - used, "%s%s: %s", i ? "; " : " (",
					 named[i]->name, where);
	}
	if (used + 2 > sizeof(tail))
		return;   /* too long to say where: the message stands */
	strcpy(tail + used, ")");
	size_t el = strlen(err), tl = strlen(tail);
	if ((el >= tl && !strcmp(err + el - tl, tail)) || el + tl >= errlen)
		return;   /* said already, or no room */
	memcpy(err + el, tail, tl + 1);
}

static int cfg_set(struct cfg *c, const char *key, const char *value, const char *file,
		   size_t line, char *err, size_t errlen)
{
	char origin[CFG_STR + 64];
	const struct cfg_key *k = find_key(key);
	where_text(file, line, origin, sizeof(origin));
	if (!k) {
		snprintf(err, errlen, "config: unknown key '%s' (%s)", key, origin);
		return -EINVAL;
	}
	int rc = set_value(c, k, value, origin, err, errlen);
	if (!rc)
		note_origin(c, k, file, line);
	return rc;
}

int cfg_override_at(struct cfg *c, const char *kv, const char *file, char *err, size_t errlen)
{
	const char *eq = strchr(kv, '=');
	char key[CFG_STR];
	if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof(key)) {
		snprintf(err, errlen, "config: override '%s' is not key=value", kv);
		return -EINVAL;
	}
	memcpy(key, kv, eq - kv);
	key[eq - kv] = 0;
	return cfg_set(c, key, eq + 1, file, 0, err, errlen);
}

int cfg_override(struct cfg *c, const char *kv, char *err, size_t errlen)
{
	return cfg_override_at(c, kv, NULL, err, errlen);
}

int cfg_list_append(struct cfg *c, const char *key, const char *item, char *err, size_t errlen)
{
	const struct cfg_key *k = find_key(key);
	if (!k || k->type != CFG_T_LIST) {
		snprintf(err, errlen, "config: key '%s' is not a list", key);
		return -EINVAL;
	}
	struct cfg_list *l = (struct cfg_list *)((char *)c + k->off);
	if (l->n >= CFG_MAX_LIST || strlen(item) >= CFG_STR || strchr(item, ',') || !*item) {
		snprintf(err, errlen, "config: key '%s': bad list item '%s'", key, item);
		return -EINVAL;
	}
	snprintf(l->item[l->n++], CFG_STR, "%s", item);
	note_origin(c, k, NULL, 0);
	return 0;
}

/* ---- YAML ---- */

static int load_depth(struct cfg *c, const char *path, int depth, char *err, size_t errlen);

static int yaml_fail(yaml_parser_t *p, const char *path, char *err, size_t errlen)
{
	snprintf(err, errlen, "config: '%s' line %zu: %s", path,
		 p->problem_mark.line + 1, p->problem ? p->problem : "malformed yaml");
	return -EINVAL;
}

/* A key given twice in one YAML file would silently take the last value:
 * refused, naming both lines. seen[] holds each key's first line (by its
 * index in keys[]; base_config at NKEYS). Unknown keys are cfg_set's. */
static int first_time(size_t *seen, const char *key, const char *path, size_t line, char *err,
		      size_t errlen)
{
	const struct cfg_key *k = find_key(key);
	size_t i = k ? (size_t)(k - keys) : !strcmp(key, "base_config") ? NKEYS : (size_t)-1;
	if (i == (size_t)-1)
		return 0;
	if (seen[i]) {
		snprintf(err, errlen, "config: '%s' line %zu: key '%s' is given twice (first at line %zu)",
			 path, line, key, seen[i]);
		return -EINVAL;
	}
	seen[i] = line;
	return 0;
}

static int load_depth(struct cfg *c, const char *path, int depth, char *err, size_t errlen)
{
	FILE *f;
	yaml_parser_t p;
	yaml_event_t ev;
	int rc = 0, level = 0;
	char key[CFG_STR] = "";
	bool have_key = false, in_seq = false;
	char seqbuf[CFG_MAX_LIST * CFG_STR];
	size_t seqlen = 0, key_line = 0;
	char origin[CFG_STR + 64];
	/* the line each key of this file was first given on, by key index:
	 * a key given twice is refused naming both lines */
	size_t seen[NKEYS + 1];
	memset(seen, 0, sizeof(seen));

	if (depth > 8) {
		snprintf(err, errlen, "config: '%s': base_config nests too deep", path);
		return -ELOOP;
	}
	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "config: unable to open '%s': %s", path, strerror(errno));
		return rc;
	}
	if (!yaml_parser_initialize(&p)) {
		fclose(f);
		snprintf(err, errlen, "config: out of memory");
		return -ENOMEM;
	}
	yaml_parser_set_input_file(&p, f);
	for (;;) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = yaml_fail(&p, path, err, errlen);
			break;
		}
		yaml_event_type_t t = ev.type;
		size_t line = ev.start_mark.line + 1;
		if (t == YAML_STREAM_END_EVENT) {
			yaml_event_delete(&ev);
			break;
		}
		if (t == YAML_MAPPING_START_EVENT) {
			if (++level > 1) {
				snprintf(err, errlen, "config: '%s' line %zu: key '%s': nested mappings are not supported",
					 path, line, key);
				rc = -EINVAL;
			}
		} else if (t == YAML_MAPPING_END_EVENT) {
			level--;
		} else if (t == YAML_SEQUENCE_START_EVENT) {
			if (!have_key || in_seq) {
				snprintf(err, errlen, "config: '%s' line %zu: unexpected list", path, line);
				rc = -EINVAL;
			}
			in_seq = true;
			seqlen = 0;
			seqbuf[0] = 0;
		} else if (t == YAML_SEQUENCE_END_EVENT) {
			where_text(path, key_line, origin, sizeof(origin));
			const struct cfg_key *k = find_key(key);
			if (!k) {
				snprintf(err, errlen, "config: unknown key '%s' (%s)", key, origin);
				rc = -EINVAL;
			} else if (k->type != CFG_T_LIST) {
				snprintf(err, errlen, "config: key '%s' (%s) wants %s, got a list",
					 key, origin, type_name(k->type));
				rc = -EINVAL;
			} else if (!(rc = set_value(c, k, seqbuf, origin, err, errlen))) {
				note_origin(c, k, path, key_line);
			}
			in_seq = false;
			have_key = false;
		} else if (t == YAML_SCALAR_EVENT) {
			const char *v = (const char *)ev.data.scalar.value;
			if (level != 1) {
				snprintf(err, errlen, "config: '%s' line %zu: expected a mapping of keys", path, line);
				rc = -EINVAL;
			} else if (in_seq) {
				size_t n = strlen(v);
				if (strchr(v, ',') || seqlen + n + 2 > sizeof(seqbuf)) {
					snprintf(err, errlen, "config: '%s' line %zu: key '%s': bad list item '%s'",
						 path, line, key, v);
					rc = -EINVAL;
				} else {
					if (seqlen)
						seqbuf[seqlen++] = ',';
					memcpy(seqbuf + seqlen, v, n + 1);
					seqlen += n;
				}
			} else if (!have_key) {
				if (strlen(v) >= sizeof(key)) {
					snprintf(err, errlen, "config: '%s' line %zu: key too long", path, line);
					rc = -EINVAL;
				} else {
					strcpy(key, v);
					have_key = true;
					key_line = line;
					rc = first_time(seen, key, path, line, err, errlen);
				}
			} else {
				have_key = false;
				if (!strcmp(key, "base_config")) {
					char base[4096];
					const char *slash = strrchr(path, '/');
					if (v[0] == '/' || !slash)
						snprintf(base, sizeof(base), "%s", v);
					else
						snprintf(base, sizeof(base), "%.*s/%s",
							 (int)(slash - path), path, v);
					rc = load_depth(c, base, depth + 1, err, errlen);
				} else {
					/* an empty scalar means "empty" for strings and lists */
					rc = cfg_set(c, key, v, path, key_line, err, errlen);
				}
			}
		}
		yaml_event_delete(&ev);
		if (rc)
			break;
	}
	yaml_parser_delete(&p);
	fclose(f);
	return rc;
}

int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen)
{
	return load_depth(c, path, 0, err, errlen);
}

/* ---- mesh derivation ---- */

static long long *axis_slot(struct cfg *c, int dcn, int a)
{
	return (long long *)((char *)c + (dcn ? axis_keys[a].dcn_off : axis_keys[a].ici_off));
}

long long cfg_axis_key(const struct cfg *c, bool dcn, enum mesh_axis a)
{
	const struct axis_keys *k = &axis_keys[a];
	return *(const long long *)((const char *)c + (dcn ? k->dcn_off : k->ici_off));
}

static const char *family_key(int dcn, int a)
{
	return dcn ? axis_keys[a].dcn_key : axis_keys[a].ici_key;
}

/* "'dcn_data_parallelism'=2 x 'dcn_fsdp_parallelism'=2": the sizes
 * of one family that make its product (those not 1 or -1), for an error
 * that says the product is wrong. */
static void family_terms(const struct cfg *c, int dcn, char *out, size_t n)
{
	size_t used = 0;
	out[0] = 0;
	for (int a = 0; a < AX_COUNT && used < n; a++) {
		long long v = cfg_axis_key(c, dcn, a);
		if (v == 1 || v == -1)
			continue;
		used += (size_t)snprintf(out + used, n - used, "%s'%s'=%lld", used ? " x " : "",
					 family_key(dcn, a), v);
	}
	if (!out[0])
		snprintf(out, n, "every %s key is 1", dcn ? "dcn" : "ici");
}

/* Resolves one family (ici or dcn): at most one -1, product must be want
 * (if want > 0). Returns the product. */
static int resolve_family(struct cfg *c, int dcn, int want, int *out, char *err, size_t errlen)
{
	int fill = -1;
	long long prod = 1;
	for (int a = 0; a < AX_COUNT; a++) {
		long long v = *axis_slot(c, dcn, a);
		if (v == -1) {
			if (fill >= 0) {
				snprintf(err, errlen, "config: keys '%s' and '%s' are both -1; at most one %s key may be -1",
					 family_key(dcn, fill), family_key(dcn, a), dcn ? "dcn" : "ici");
				return -EINVAL;
			}
			fill = a;
		} else if (v < 1 || v > 4096) {
			snprintf(err, errlen, "config: key '%s' must be a positive size or -1, got %lld",
				 family_key(dcn, a), v);
			return -EINVAL;
		} else {
			prod *= v;
		}
	}
	for (int a = 0; a < AX_COUNT; a++)
		out[a] = (int)*axis_slot(c, dcn, a);
	if (fill >= 0) {
		char terms[1024];
		if (want <= 0) {
			snprintf(err, errlen, "config: key '%s' is -1 but the number of hosts/devices is "
				 "not known here", family_key(dcn, fill));
			return -EINVAL;
		}
		if (want % prod) {
			family_terms(c, dcn, terms, sizeof(terms));
			snprintf(err, errlen, "config: key '%s' is -1 but the other %s sizes (%s) do not "
				 "divide the %d %s", family_key(dcn, fill), dcn ? "dcn" : "ici", terms,
				 want, dcn ? "hosts" : "devices per host");
			return -EINVAL;
		}
		out[fill] = (int)(want / prod);
		prod = want;
	}
	if (prod > 4096) {
		snprintf(err, errlen, "config: %s mesh of %lld is too large", dcn ? "dcn" : "ici", prod);
		return -EINVAL;
	}
	return (int)prod;
}

/* Numbers a run cannot use, refused naming the key (the model's shape
 * keys are model_dims_from_cfg's, the mesh sizes resolve_family's). A
 * bound is open (lo < v, v < hi) when its flag says so. */
static const struct cfg_range {
	const char *key;
	double lo, hi;
	bool lo_open, hi_open;
} ranges[] = {
	{ "learning_rate", 0, INFINITY, true, false },
	{ "warmup_steps_fraction", 0, 1, false, false },
	{ "cosine_learning_rate_final_fraction", 0, 1, false, false },
	{ "adam_b1", 0, 1, false, true },
	{ "adam_b2", 0, 1, false, true },
	{ "adam_eps", 0, INFINITY, true, false },
	{ "adam_weight_decay", 0, INFINITY, false, false },
	{ "muon_momentum", 0, 1, false, true },
	{ "gradient_clipping_threshold", 0, INFINITY, false, false },
	{ "grad_bucket_mb", 0, INFINITY, false, false },
	{ "init_std", 0, INFINITY, false, false },
	{ "normalization_layer_epsilon", 0, INFINITY, true, false },
	{ "rope_max_timescale", 0, INFINITY, true, false },
	{ "load_balance_loss_weight", 0, INFINITY, false, false },
	{ "routed_bias_update_rate", 0, INFINITY, false, false },
	{ "routed_scaling_factor", 0, INFINITY, true, false },
	{ "steps", 0, INFINITY, false, false },
	{ "log_period", 0, INFINITY, false, false },
	{ "checkpoint_period", 0, INFINITY, false, false },
	{ "connect_timeout_s", 0, INFINITY, true, false },
	{ "collective_timeout_s", 0, INFINITY, true, false },
	{ "openblas_threads", 0, 4096, false, false },
	{ "device_nice", 0, 19, false, false },
};

static double key_number(const struct cfg *c, const struct cfg_key *k)
{
	const char *p = (const char *)c + k->off;
	return k->type == CFG_T_INT ? (double)*(const long long *)p : *(const double *)p;
}

static void bound_text(char *out, size_t len, const struct cfg_range *r)
{
	if (isinf(r->hi))
		snprintf(out, len, "%s %g", r->lo_open ? ">" : ">=", r->lo);
	else
		snprintf(out, len, "in %c%g, %g%c", r->lo_open ? '(' : '[', r->lo, r->hi,
			 r->hi_open ? ')' : ']');
}

static int check_ranges(const struct cfg *c, char *err, size_t errlen)
{
	char want[64];
	for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
		const struct cfg_range *r = &ranges[i];
		const struct cfg_key *k = find_key(r->key);
		double v = key_number(c, k);
		if ((r->lo_open ? v > r->lo : v >= r->lo) && (r->hi_open ? v < r->hi : v <= r->hi))
			continue;
		bound_text(want, sizeof(want), r);
		snprintf(err, errlen, "config: key '%s' must be %s, got %g", r->key, want, v);
		return -EINVAL;
	}
	if (c->learning_rate_schedule_steps != -1 && c->learning_rate_schedule_steps < 1) {
		snprintf(err, errlen, "config: key 'learning_rate_schedule_steps' must be -1 (steps) or "
			 ">= 1, got %lld", c->learning_rate_schedule_steps);
		return -EINVAL;
	}
	/* the dataset's keys (its file is the data's to read) */
	static const char *const types[] = { "synthetic", "text", "llmc", "raw", "megatron" };
	bool known = false;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		known |= !strcmp(c->dataset_type, types[i]);
	if (!known) {
		snprintf(err, errlen, "config: key 'dataset_type' has unknown value '%s' (synthetic | text | "
			 "llmc | raw | megatron)", c->dataset_type);
		return -EINVAL;
	}
	if (!strcmp(c->dataset_type, "text") && (!c->dataset_path[0] || c->vocab_size < 256)) {
		snprintf(err, errlen, "config: dataset_type 'text' needs key 'dataset_path' and "
			 "'vocab_size' >= 256 (byte tokens), got '%s' and %lld", c->dataset_path,
			 c->vocab_size);
		return -EINVAL;
	}
	return 0;
}

static int finish(struct cfg *c, int want_hosts, int want_devices, char *err, size_t errlen)
{
	char terms[1024];
	int h = resolve_family(c, 1, want_hosts, c->dcn, err, errlen);
	if (h < 0)
		return h;
	int d = resolve_family(c, 0, want_devices, c->ici, err, errlen);
	if (d < 0)
		return d;
	if (want_hosts > 0 && h != want_hosts) {
		family_terms(c, 1, terms, sizeof(terms));
		snprintf(err, errlen, "config: dcn_* parallelism multiplies to %d hosts (%s), but the run "
			 "has %d hosts", h, terms, want_hosts);
		return -EINVAL;
	}
	if (want_devices > 0 && d != want_devices) {
		family_terms(c, 0, terms, sizeof(terms));
		snprintf(err, errlen, "config: ici_* parallelism multiplies to %d devices per host (%s), "
			 "but the run has %d", d, terms, want_devices);
		return -EINVAL;
	}
	c->num_hosts = h;
	c->devices_per_host = d;
	if (c->heartbeat_interval_s <= 0 || c->heartbeat_timeout_s <= c->heartbeat_interval_s) {
		snprintf(err, errlen, "config: key 'heartbeat_timeout_s' (%g) must exceed 'heartbeat_interval_s' (%g) > 0",
			 c->heartbeat_timeout_s, c->heartbeat_interval_s);
		return -EINVAL;
	}
	if (c->link_silence_s != 0 && !(c->link_silence_s > c->heartbeat_interval_s &&
					 c->link_silence_s < c->heartbeat_timeout_s)) {
		snprintf(err, errlen, "config: key 'link_silence_s' (%g) must be 0 or lie between 'heartbeat_interval_s' (%g) and 'heartbeat_timeout_s' (%g)",
			 c->link_silence_s, c->heartbeat_interval_s, c->heartbeat_timeout_s);
		return -EINVAL;
	}
	if (c->replay_buffer_bytes < 0 || c->link_reconnect_timeout_s <= 0) {
		snprintf(err, errlen, "config: key 'replay_buffer_bytes' (%lld) must be >= 0 and 'link_reconnect_timeout_s' (%g) > 0",
			 (long long)c->replay_buffer_bytes, c->link_reconnect_timeout_s);
		return -EINVAL;
	}
	if (c->tls_key_update_bytes < 65536 || c->tls_key_update_bytes > (1ll << 38)) {
		snprintf(err, errlen, "config: key 'tls_key_update_bytes' must be in [65536, 2^38] "
			 "(AES-GCM must not encrypt much more than 2^38 bytes under one key), got %lld",
			 c->tls_key_update_bytes);
		return -EINVAL;
	}
	if (c->eager_max_bytes < 0 || c->eager_max_bytes > (1 << 20)) {
		snprintf(err, errlen, "config: key 'eager_max_bytes' must be in [0, 1048576], got %lld",
			 c->eager_max_bytes);
		return -EINVAL;
	}
	if (c->poll_spin_us < 0 || c->poll_spin_us > 1000000) {
		snprintf(err, errlen, "config: key 'poll_spin_us' must be in [0, 1000000], got %lld",
			 c->poll_spin_us);
		return -EINVAL;
	}
	if (c->p2p_handoff_bytes < 0) {
		snprintf(err, errlen, "config: key 'p2p_handoff_bytes' must be >= 0, got %lld",
			 c->p2p_handoff_bytes);
		return -EINVAL;
	}
	if (c->max_send_bytes < 16384 || c->max_send_bytes > (64 << 20)) {
		snprintf(err, errlen, "config: key 'max_send_bytes' must be in [16384, 67108864], got %lld",
			 c->max_send_bytes);
		return -EINVAL;
	}
	if (strcmp(c->fsdp_layer_parts, "auto") && strcmp(c->fsdp_layer_parts, "true") &&
	    strcmp(c->fsdp_layer_parts, "false")) {
		snprintf(err, errlen, "config: key 'fsdp_layer_parts' must be auto, true or false, got '%s'",
			 c->fsdp_layer_parts);
		return -EINVAL;
	}
	if (strcmp(c->cpu_bind, "auto") && strcmp(c->cpu_bind, "none") &&
	    strcmp(c->cpu_bind, "spread")) {
		snprintf(err, errlen, "config: key 'cpu_bind' must be auto, none or spread, got '%s'",
			 c->cpu_bind);
		return -EINVAL;
	}
	if (strcmp(c->tls_records, "own") && strcmp(c->tls_records, "openssl")) {
		snprintf(err, errlen, "config: key 'tls_records' must be own or openssl, got '%s'",
			 c->tls_records);
		return -EINVAL;
	}
	if (strcmp(c->tls_cipher_impl, "auto") && strcmp(c->tls_cipher_impl, "ipsec-mb") &&
	    strcmp(c->tls_cipher_impl, "openssl")) {
		snprintf(err, errlen,
			 "config: key 'tls_cipher_impl' must be auto, ipsec-mb or openssl, got '%s'",
			 c->tls_cipher_impl);
		return -EINVAL;
	}
	if (!strcmp(c->tls_cipher_impl, "ipsec-mb") && !strcmp(c->tls_records, "openssl")) {
		snprintf(err, errlen, "config: key 'tls_cipher_impl' is ipsec-mb, which seals our own "
			 "records, but key 'tls_records' is openssl (OpenSSL's records use its cipher)");
		return -EINVAL;
	}
	if (c->tcp_notsent_lowat_bytes < 0 || c->tcp_notsent_lowat_bytes > (64 << 20)) {
		snprintf(err, errlen,
			 "config: key 'tcp_notsent_lowat_bytes' must be in [0, 67108864], got %lld",
			 c->tcp_notsent_lowat_bytes);
		return -EINVAL;
	}
	if (c->link_streams < 1 || c->link_streams > 16) {
		snprintf(err, errlen, "config: key 'link_streams' must be in [1, 16], got %lld",
			 c->link_streams);
		return -EINVAL;
	}
	if (c->segment_bytes < 4096 || c->segment_bytes > c->max_frame_bytes) {
		snprintf(err, errlen, "config: key 'segment_bytes' must be in [4096, max_frame_bytes], got %lld",
			 c->segment_bytes);
		return -EINVAL;
	}
	if (c->hosts.n && c->hosts.n != h) {
		snprintf(err, errlen, "config: key 'hosts' lists %d addresses but the mesh has %d hosts",
			 c->hosts.n, h);
		return -EINVAL;
	}
	return check_ranges(c, err, errlen);
}

int cfg_finish(struct cfg *c, int want_hosts, int want_devices, char *err, size_t errlen)
{
	int rc = finish(c, want_hosts, want_devices, err, errlen);
	if (rc)
		cfg_error_origins(c, err, errlen);
	return rc;
}

int cfg_parse_bytes(const char *s, size_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	unsigned long long mul = 1;
	if (*end == 'K' || *end == 'k')
		mul = 1ull << 10;
	else if (*end == 'M' || *end == 'm')
		mul = 1ull << 20;
	else if (*end == 'G' || *end == 'g')
		mul = 1ull << 30;
	if (mul != 1)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > SIZE_MAX / mul)
		return -EINVAL;
	*out = (size_t)(v * mul);
	return 0;
}

int cfg_family_product(const struct cfg *c, bool dcn)
{
	long long p = 1;
	for (int a = 0; a < AX_COUNT; a++) {
		long long v = cfg_axis_key(c, dcn, a);
		if (v > 1)
			p *= v;
		if (p > 4096)
			return 0;
	}
	return (int)p;
}

void cfg_single_device(struct cfg *c)
{
	for (int a = 0; a < AX_COUNT; a++)
		*axis_slot(c, 0, a) = *axis_slot(c, 1, a) = 1;
}

/* ---- canonical text ---- */

static void value_text(const struct cfg *c, const struct cfg_key *k, char *out, size_t n)
{
	const char *p = (const char *)c + k->off;
	switch (k->type) {
	case CFG_T_INT: snprintf(out, n, "%lld", *(const long long *)p); break;
	case CFG_T_FLOAT: snprintf(out, n, "%.17g", *(const double *)p); break;
	case CFG_T_BOOL: snprintf(out, n, "%s", *(const bool *)p ? "true" : "false"); break;
	case CFG_T_STR: snprintf(out, n, "%s", p); break;
	case CFG_T_LIST: {
		const struct cfg_list *l = (const struct cfg_list *)p;
		size_t used = 0;
		out[0] = 0;
		for (int i = 0; i < l->n && used < n; i++)
			used += snprintf(out + used, n - used, "%s%s", i ? "," : "", l->item[i]);
		break;
	}
	}
}

int cfg_value_text(const struct cfg *c, const char *key, char *out, size_t n)
{
	const struct cfg_key *k = find_key(key);
	if (!k)
		return -EINVAL;
	value_text(c, k, out, n);
	return 0;
}

void cfg_hash(const struct cfg *c, uint8_t out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	char buf[CFG_MAX_LIST * CFG_STR + 64];
	unsigned int len = 32;
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	for (size_t i = 0; i < NKEYS; i++) {
		if (!keys[i].hashed)
			continue;
		value_text(c, &keys[i], buf, sizeof(buf));
		EVP_DigestUpdate(md, keys[i].name, strlen(keys[i].name));
		EVP_DigestUpdate(md, "=", 1);
		EVP_DigestUpdate(md, buf, strlen(buf));
		EVP_DigestUpdate(md, "\n", 1);
	}
	EVP_DigestFinal_ex(md, out, &len);
	EVP_MD_CTX_free(md);
}

/* s as a YAML double-quoted scalar that reads back as the same bytes:
 * quotes, backslashes and control characters escaped, and the code points
 * libyaml takes as line breaks or refuses raw (C1 controls, NEL, U+2028,
 * U+2029, U+FEFF, U+FFFE, U+FFFF) as \u escapes. Other UTF-8 passes as is;
 * bytes that are not UTF-8 (only a command-line override can hold them)
 * pass too, and the file then fails to load with libyaml's error. */
static void write_quoted(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	fputc('"', f);
	while (*p) {
		unsigned cp = 0;
		int n = 0;
		if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
			cp = p[1], n = 2;
		else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
			cp = 0x2000 | (p[2] & 0x3f), n = 3;
		else if (p[0] == 0xef && ((p[1] == 0xbb && p[2] == 0xbf) ||
					  (p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf))))
			cp = 0xf000 | ((p[1] & 0x3fu) << 6) | (p[2] & 0x3f), n = 3;
		if (n) {
			fprintf(f, "\\u%04x", cp);
			p += n;
			continue;
		}
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\x%02x", *p);
		else
			fputc(*p, f);
		p++;
	}
	fputc('"', f);
}

int cfg_write_yaml(const struct cfg *c, const char *path, char *err, size_t errlen)
{
	char buf[CFG_MAX_LIST * CFG_STR + 64];
	struct util_out o;
	int rc = util_out_open(&o, "config", path, err, errlen);
	if (rc)
		return rc;
	FILE *f = o.f;
	for (size_t i = 0; i < NKEYS; i++) {
		const struct cfg_key *k = &keys[i];
		value_text(c, k, buf, sizeof(buf));
		if (k->type == CFG_T_LIST) {
			const struct cfg_list *l = (const void *)((const char *)c + k->off);
			fprintf(f, "%s: [", k->name);
			for (int j = 0; j < l->n; j++) {
				fputs(j ? ", " : "", f);
				write_quoted(f, l->item[j]);
			}
			fprintf(f, "]\n");
		} else if (k->type == CFG_T_STR) {
			fprintf(f, "%s: ", k->name);
			write_quoted(f, buf);
			fputc('\n', f);
		} else {
			fprintf(f, "%s: %s\n", k->name, buf);
		}
	}
	/* every fprintf above is checked here (the stream's error flag),
	 * with the flush, fsync and close */
	return util_out_commit(&o, err, errlen);
}
