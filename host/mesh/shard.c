/* Partition-spec resolution; see host/mesh/shard.h. */
#include "host/mesh/shard.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The logical axis names rules may use, NULL-terminated. */
static const char *const shard_logical_names[] = {
	"vocab", "embed", "embed_moe", "mlp", "mlp_moe", "heads", "q_heads", "kv_heads",
	"kv", "norm", "exp", "layers", "q_lora", "kv_lora", "q_lora_up_proj", "kv_lora_up_proj",
	"activation_batch", "activation_length", "activation_embed", "activation_mlp",
	"activation_heads", "activation_vocab", "activation_exp", "activation_stage",
	NULL,
};

static bool known_logical(const char *s)
{
	for (int i = 0; shard_logical_names[i]; i++)
		if (!strcmp(shard_logical_names[i], s))
			return true;
	return false;
}

static int axis_by_name(const char *s, size_t n)
{
	for (int a = 0; a < AX_COUNT; a++)
		if (strlen(mesh_axis_names[a]) == n && !strncmp(mesh_axis_names[a], s, n))
			return a;
	return -1;
}

/* [s, s+n) without surrounding blanks */
static void trim(const char **s, size_t *n)
{
	while (*n && (**s == ' ' || **s == '\t')) {
		(*s)++;
		(*n)--;
	}
	while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
		(*n)--;
}

static int parse_rule(struct shard_rule *r, const char *text, int idx, char *err, size_t errlen)
{
	const char *eq = strchr(text, '=');
	const char *s = text;
	size_t n;

	memset(r, 0, sizeof(*r));
	if (!eq) {
		snprintf(err, errlen, "config: key 'logical_axis_rules' rule %d '%s' is not logical=axis|axis|...",
			 idx, text);
		return -EINVAL;
	}
	n = (size_t)(eq - text);
	trim(&s, &n);
	if (!n || n >= sizeof(r->logical)) {
		snprintf(err, errlen, "config: key 'logical_axis_rules' rule %d '%s' has no logical axis name",
			 idx, text);
		return -EINVAL;
	}
	memcpy(r->logical, s, n);
	r->logical[n] = 0;
	if (!known_logical(r->logical)) {
		snprintf(err, errlen, "config: key 'logical_axis_rules' rule %d '%s': unknown logical axis '%s'",
			 idx, text, r->logical);
		return -EINVAL;
	}
	s = eq + 1;
	for (;;) {
		const char *bar = strchr(s, '|');
		const char *p = s;
		n = bar ? (size_t)(bar - s) : strlen(s);
		trim(&p, &n);
		if (!n && !bar && r->naxes == 0)
			break;          /* "logical=": replicated */
		int a = axis_by_name(p, n);
		if (a < 0) {
			snprintf(err, errlen, "config: key 'logical_axis_rules' rule %d '%s': unknown mesh axis '%.*s'",
				 idx, text, (int)n, p);
			return -EINVAL;
		}
		for (int i = 0; i < r->naxes; i++)
			if (r->axis[i] == a) {
				snprintf(err, errlen, "config: key 'logical_axis_rules' rule %d '%s': mesh axis '%s' twice",
					 idx, text, mesh_axis_names[a]);
				return -EINVAL;
			}
		r->axis[r->naxes++] = a;
		if (!bar)
			break;
		s = bar + 1;
	}
	return 0;
}

static void rule_drop_axis(struct shard_rule *r, int axis)
{
	int k = 0;
	for (int i = 0; i < r->naxes; i++)
		if (r->axis[i] != axis)
			r->axis[k++] = r->axis[i];
	r->naxes = k;
}

int shard_rules_from_cfg(struct shard_rules *r, const struct cfg *c, char *err, size_t errlen)
{
	const struct cfg_list *l = &c->logical_axis_rules;
	bool exp_on_fsdp = false;

	memset(r, 0, sizeof(*r));
	if (!strcmp(c->custom_mesh_and_rule, "shard-exp-on-fsdp")) {
		exp_on_fsdp = true;
	} else if (c->custom_mesh_and_rule[0]) {
		snprintf(err, errlen, "config: key 'custom_mesh_and_rule' must be \"\" or shard-exp-on-fsdp, got '%s'",
			 c->custom_mesh_and_rule);
		return -EINVAL;
	}
	for (int i = 0; i < l->n; i++) {
		int rc = parse_rule(&r->rule[r->n], l->item[i], i, err, errlen);
		if (rc)
			return rc;
		r->n++;
	}
	if (exp_on_fsdp) {
		bool have_exp = false;
		for (int i = 0; i < r->n; i++) {
			struct shard_rule *x = &r->rule[i];
			if (!strcmp(x->logical, "exp")) {
				x->naxes = 2;
				x->axis[0] = AX_EXPERT;
				x->axis[1] = AX_FSDP;
				have_exp = true;
			} else if (!strcmp(x->logical, "embed_moe")) {
				rule_drop_axis(x, AX_FSDP);
			}
		}
		if (!have_exp) {
			if (r->n >= SHARD_MAX_RULES) {
				snprintf(err, errlen, "config: key 'logical_axis_rules': no room for the exp rule of shard-exp-on-fsdp");
				return -EINVAL;
			}
			struct shard_rule *x = &r->rule[r->n++];
			memset(x, 0, sizeof(*x));
			snprintf(x->logical, sizeof(x->logical), "exp");
			x->naxes = 2;
			x->axis[0] = AX_EXPERT;
			x->axis[1] = AX_FSDP;
		}
	}
	return 0;
}

void shard_head_units(int ndim, const char *const *logical, int head_dim, int *unit)
{
	static const char *const heads[] = { "heads", "q_heads", "kv_heads", "activation_heads" };
	for (int d = 0; d < ndim; d++) {
		unit[d] = 1;
		for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++)
			if (logical && logical[d] && !strcmp(logical[d], heads[i]))
				unit[d] = head_dim;
	}
}

int shard_resolve(const struct shard_rules *r, const struct mesh *m, const char *tensor,
		  int ndim, const int *shape, const int *unit, const char *const *logical,
		  struct shard_spec *out, char *err, size_t errlen)
{
	bool assigned[SHARD_MAX_DIMS] = { false };

	memset(out, 0, sizeof(*out));
	if (ndim < 0 || ndim > SHARD_MAX_DIMS) {
		snprintf(err, errlen, "sharding: tensor '%s' has %d dimensions (at most %d)",
			 tensor, ndim, SHARD_MAX_DIMS);
		return -EINVAL;
	}
	snprintf(out->name, sizeof(out->name), "%s", tensor);
	out->ndim = ndim;
	for (int d = 0; d < ndim; d++) {
		out->shape[d] = shape[d];
		out->nshard[d] = 1;
	}
	for (int i = 0; i < r->n; i++) {
		const struct shard_rule *x = &r->rule[i];
		int ax[AX_COUNT], n = 0;
		uint32_t mask = 0;
		for (int k = 0; k < x->naxes; k++)
			if (m->size[x->axis[k]] > 1) {
				ax[n++] = x->axis[k];
				mask |= 1u << x->axis[k];
			}
		for (int d = 0; d < ndim; d++) {
			if (assigned[d] || !logical || !logical[d] || strcmp(logical[d], x->logical))
				continue;
			if (mask & out->used)
				continue;
			assigned[d] = true;
			out->naxes[d] = n;
			memcpy(out->axis[d], ax, sizeof(int) * (size_t)n);
			out->axes[d] = mask;
			out->used |= mask;
		}
	}
	out->local_numel = 1;
	for (int d = 0; d < ndim; d++) {
		int u = unit && unit[d] > 0 ? unit[d] : 1;
		for (int k = 0; k < out->naxes[d]; k++)
			out->nshard[d] *= m->size[out->axis[d][k]];
		if (shape[d] % u || (shape[d] / u) % out->nshard[d]) {
			char axes[128], size[64];
			mesh_axes_text(out->axis[d], out->naxes[d], ", ", axes, sizeof(axes));
			if (u > 1 && shape[d] % u == 0)
				snprintf(size, sizeof(size), "%d = %d heads of %d", shape[d], shape[d] / u, u);
			else
				snprintf(size, sizeof(size), "%d", shape[d]);
			snprintf(err, errlen, "sharding: tensor '%s' dimension %d ('%s', %s) is not divisible by %d (axes %s)",
				 tensor, d, logical && logical[d] ? logical[d] : "", size, out->nshard[d], axes);
			return -EINVAL;
		}
		out->local[d] = shape[d] / out->nshard[d];
		out->local_numel *= (size_t)out->local[d];
	}
	out->local_bytes = out->local_numel * sizeof(float);
	return 0;
}

void shard_block_offsets(const struct shard_spec *s, const struct mesh *m, uint32_t axes,
			 const int coord[AX_COUNT], int *offset)
{
	for (int d = 0; d < s->ndim; d++) {
		int idx = 0;
		for (int k = 0; k < s->naxes[d]; k++) {
			int a = s->axis[d][k];
			if (axes & (1u << a))
				idx = idx * m->size[a] + coord[a];
		}
		offset[d] = idx * s->local[d];
	}
}

void shard_offsets(const struct shard_spec *s, const struct mesh *m, const int coord[AX_COUNT],
		   int *offset)
{
	shard_block_offsets(s, m, s->used, coord, offset);
}

void shard_spec_text(const struct shard_spec *s, char *out, size_t outlen)
{
	size_t used = 0;
#define PUT(...) do { if (used < outlen) used += (size_t)snprintf(out + used, outlen - used, __VA_ARGS__); } while (0)
	if (!outlen)
		return;
	out[0] = 0;
	PUT("(");
	for (int d = 0; d < s->ndim; d++) {
		if (d)
			PUT(", ");
		if (s->naxes[d] == 0) {
			PUT("None");
		} else if (s->naxes[d] == 1) {
			PUT("'%s'", mesh_axis_names[s->axis[d][0]]);
		} else {
			PUT("(");
			for (int k = 0; k < s->naxes[d]; k++)
				PUT("%s'%s'", k ? ", " : "", mesh_axis_names[s->axis[d][k]]);
			PUT(")");
		}
	}
	if (s->ndim == 1)
		PUT(",");
	PUT(")");
#undef PUT
}
