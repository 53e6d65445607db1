/* The trainer's refusals as one function: everything `meshrun agent`'s
 * training job and trainer_open refuse for a config on a mesh (axes not
 * implemented, fault specs, the sharding rules and every tensor's plan,
 * the model's shape, the pipeline's microbatches, the optimizer beside
 * ZeRO-1), found without allocating a model. The training job, `train`,
 * the launchers and `meshrun shardings` all run it first, so each refuses
 * what the trainer refuses, with the same line. */
#ifndef MESHRUN_TRAIN_CHECK_H
#define MESHRUN_TRAIN_CHECK_H

#include <stddef.h>

struct cfg;
struct mesh;
struct model_dims;
struct pipe_config;

/* c finished (cfg_finish) for mesh m. 0, or -EINVAL with one line in err
 * (-ENOMEM on allocation failure). */
int train_check(const struct cfg *c, const struct mesh *m, char *err, size_t errlen);

/* Parts the trainer also runs on its own: the model's shape (into d),
 * the optimizer and the step count; a pipeline's device group of
 * rows splits into its microbatches (and no sequence or context axis
 * beside it); ZeRO-1 and Muon cannot share tensor (returns -EINVAL). */
int train_check_keys(const struct cfg *c, struct model_dims *d, char *err, size_t errlen);
int train_check_pipe(const struct cfg *c, const struct pipe_config *pc, int rows, char *err,
		     size_t errlen);
int trainer_muon_zero_refusal(const char *tensor, char *err, size_t errlen);

/* The job of c (finished for its mesh) on `hosts` hosts instead, the mesh
 * changed along data only (dcn_data_parallelism: the other axes across
 * hosts stay) and the global batch kept by per_device_batch_size: *dcn_data
 * and *pdbs, after train_check passed on that mesh. For a launcher that
 * lost machines (host/launch/launch.h: regroup). 0; -EINVAL with one line
 * saying why it cannot (the other axes need more hosts, the batch does not
 * split, or the trainer's refusal on the new mesh); -ENOMEM. */
int train_shrink(const struct cfg *c, int hosts, long long *dcn_data, long long *pdbs, char *err,
		 size_t errlen);

#endif
