/* Explicit sharding (docs/sharding.md#resolution): turns a tensor's logical axis names into a
 * partition spec over the mesh through `logical_axis_rules`, and from the
 * spec its local shard shape and a device's shard offsets. Pure arithmetic:
 * no collectives, no allocation; the training code and `meshrun shardings`
 * both build on it.
 *
 * Resolution, exactly: mesh axes of size 1 are taken out of every rule
 * first (so a rule's size-1 axes never block another dimension); then the
 * rules are walked in order, and a rule `logical=a|b|..` gives its axes to
 * every dimension named `logical` that is still unassigned, provided none
 * of those axes is already used by another dimension of the same tensor.
 * A rule whose axes are all gone (`kv=`, or every axis of size 1) still
 * claims the dimension, as replicated, so later rules for the same name do
 * not apply (Flax/MaxText semantics: the first rule that fits wins; list a
 * name twice to give a fallback). Dimensions no rule claims are replicated.
 */
#ifndef MESHRUN_SHARD_H
#define MESHRUN_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"

#define SHARD_MAX_DIMS 5
#define SHARD_MAX_RULES CFG_MAX_LIST
#define SHARD_NAME 48

struct shard_rule {
	char logical[SHARD_NAME];
	int naxes;
	int axis[AX_COUNT];         /* enum mesh_axis, in the rule's order */
};

struct shard_rules {
	int n;
	struct shard_rule rule[SHARD_MAX_RULES];
};

/* One tensor's partition spec and what follows from it. */
struct shard_spec {
	char name[SHARD_NAME];
	int ndim;
	int shape[SHARD_MAX_DIMS];      /* global */
	int local[SHARD_MAX_DIMS];      /* this device's shard: shape / nshard */
	int nshard[SHARD_MAX_DIMS];     /* product of the dimension's axis sizes */
	int naxes[SHARD_MAX_DIMS];
	int axis[SHARD_MAX_DIMS][AX_COUNT]; /* mesh axes per dimension, rule order */
	uint32_t axes[SHARD_MAX_DIMS];  /* the same as a bit mask of 1 << AX_* */
	uint32_t used;                  /* union of axes[] */
	size_t local_numel;
	size_t local_bytes;             /* float32: 4 * local_numel */
};

/* Parses c->logical_axis_rules ("logical=axis1|axis2|...", "logical=" is
 * replicated) and applies c->custom_mesh_and_rule: "shard-exp-on-fsdp"
 * makes every `exp` rule exp=expert|fsdp (appending one if there is none)
 * and takes fsdp off every `embed_moe` rule, so each device holds whole
 * expert matrices. 0 or -EINVAL with err naming the rule (its index and
 * text) and the unknown logical name or mesh axis. */
int shard_rules_from_cfg(struct shard_rules *r, const struct cfg *c, char *err, size_t errlen);

/* Resolves one tensor of ndim (<= SHARD_MAX_DIMS) dimensions with global
 * shape and logical names (NULL or "" for a dimension with no name: it is
 * replicated). unit, if not NULL, gives per dimension the block that must
 * stay whole on one device (a head of head_dim elements; see
 * shard_head_units); NULL means 1 everywhere. Fills out; 0, or -EINVAL
 * with err when a dimension does not split evenly, in one line naming the
 * tensor, the dimension (index, logical name, size) and the axes:
 *   sharding: tensor 'wq' dimension 1 ('q_heads', 512) is not divisible by 3 (axes tensor)
 *   sharding: tensor 'wq' dimension 1 ('q_heads', 96 = 3 heads of 32) is not divisible by 2 (axes tensor) */
int shard_resolve(const struct shard_rules *r, const struct mesh *m, const char *tensor,
		  int ndim, const int *shape, const int *unit, const char *const *logical,
		  struct shard_spec *out, char *err, size_t errlen);

/* unit[d] = head_dim for dimensions named heads, q_heads, kv_heads or
 * activation_heads (they hold heads x head_dim), else 1. */
void shard_head_units(int ndim, const char *const *logical, int head_dim, int *unit);

/* For a device's mesh coordinates, the element offset of its shard along
 * each dimension: the shard index is row-major over the dimension's axes in
 * the order listed (the first axis is the major one), times local[d]. */
void shard_offsets(const struct shard_spec *s, const struct mesh *m, const int coord[AX_COUNT],
		   int *offset);
/* The same counting only the axes in `axes` (a mask of 1 << AX_*): the
 * offsets of a device's block inside the tensor gathered over them, when
 * they are the minor axes of each dimension they split. */
void shard_block_offsets(const struct shard_spec *s, const struct mesh *m, uint32_t axes,
			 const int coord[AX_COUNT], int *offset);

/* The spec in MaxText style: (None, 'fsdp', 'tensor') or, for a dimension
 * on several axes, ('data', 'fsdp'). Writes at most outlen bytes. */
void shard_spec_text(const struct shard_spec *s, char *out, size_t outlen);

#endif
